// `runner runs`, `runner show` and `runner compare`: the index as tables for people (and CSV/JSON).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <map>

#include "runtime/core/json_text.h"
#include "runtime/cli/command_support.h"
#include "runtime/cli/index_commands.h"
#include "runtime/cli/run_groups.h"
#include "runtime/core/byte_size_text.h"
#include "runtime/core/shell_word.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/index_database.h"
#include "runtime/core/did_you_mean.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/report/run_loading.h"
#include "runtime/report/run_where.h"
#include "runtime/sweep/trial_store.h"
#include "runtime/core/local_time_text.h"
#include "runtime/core/number_text.h"
#include "runtime/core/duration_text.h"

namespace runner::cli {
namespace {

// A metric column's value for a run: the summary value when the run set one, else the latest logged value.
std::optional<double> metric_value(index::Database& db, const index::RunRecord& run, const std::string& key) {
  if (run.summary.is_object() && run.summary.contains(key) && run.summary[key].is_number())
    return run.summary[key].get<double>();
  return index::latest_metric(db, run.run, key);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

void print(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

std::string tags_text(const index::RunRecord& run) { return fmt::format("{}", fmt::join(run.tags, " ")); }

// A note in the aligned table: its first line, cut at 40 characters.
std::string note_line(const std::string& note) {
  std::string line = note.substr(0, note.find('\n'));
  if (line.size() > 40) {
    size_t cut = 39;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
    line = line.substr(0, cut) + "\u2026";
  } else if (line.size() < note.size()) {
    line += " \u2026";
  }
  return line;
}

// `runner runs`: the options read, the runs selected, their columns and sort chosen, the lines made, sorted and
// printed (as runs, or as groups with --group), each a step of its own.
struct RunsListing {
  struct ConfigColumn {
    std::string header, key;
  };
  struct Line {
    const index::RunRecord* run;
    std::vector<std::optional<double>> values;
    std::vector<nlohmann::json> config;  // per config column; null where the run has no such key
  };

  const ParsedArguments& arguments;
  std::optional<report::RunWhere> where;
  TableFormat format = TableFormat::aligned;
  index::RunFilter filter;
  int64_t limit = 50;
  std::optional<index::Database> database;
  std::vector<std::string> swept;  // the sweep's parameters: config columns of their own
  double now = 0;
  std::vector<index::RunRecord> runs;
  // Every name a run shown has: config keys, and metrics (summary values and logged keys); read when an option
  // names keys.
  std::set<std::string> config_names, metric_names;
  bool grouped = false;
  // --columns: config keys and metrics by name; config.KEY or metric.KEY where a name is both.
  std::vector<ConfigColumn> config_columns;
  std::vector<std::string> metrics;
  std::optional<std::string> sort;
  std::optional<std::size_t> config_sort;  // sorting by a config column (--columns, a swept parameter, config.KEY)
  bool sorted_by_metric = false;
  bool descending = false;
  std::vector<Line> lines;

  explicit RunsListing(const ParsedArguments& given) : arguments(given) {
    if (!arguments.positional.empty()) throw UsageError("unexpected argument '" + arguments.positional[0] + "'");
    try {
      if (auto text = arguments.value("--where")) where.emplace(*text);
    } catch (const report::WhereError& error) {
      throw UsageError(error.what());
    }
    format = table_format(arguments);
    if (auto status = arguments.value("--status")) {
      if (!index::is_run_status(*status))
        throw UsageError(
            fmt::format("--status '{}': expected one of {}", *status, fmt::join(index::kRunStatuses, ", ")));
      filter.status = *status;
    }
    filter.name_glob = arguments.value("--name");
    if (auto since = arguments.value("--since")) filter.started_after = parse_since(*since);
    limit = arguments.value("--limit") ? parse_count("--limit", *arguments.value("--limit")) : 50;
    grouped = arguments.has("--group") || arguments.value("--group-by");
    descending = arguments.has("--desc");
  }

  int run() {
    select_runs();
    read_names();
    choose_columns();
    choose_sort();
    make_lines();
    sort_lines();
    return grouped ? print_groups() : print_runs();
  }

  // The runs of the filter, the sweep and --where.
  void select_runs() {
    database.emplace(index::open_index_for_reading(command_index()));
    index::Database& db = *database;
    if (auto sweep = arguments.value("--sweep")) {
      const sweep::SweepRecord record = sweep::load_sweep(db, *sweep);
      filter.sweep = record.sweep;
      for (const auto& parameter : record.spec.parameters) swept.push_back(parameter.name);
    }
    now = index::now_seconds();
    runs = index::list_runs(db, filter);
    try {
      if (where) runs = report::runs_where(db, std::move(runs), *where, now);
    } catch (const report::WhereError& error) {
      throw UsageError(error.what());
    }
  }

  void read_names() {
    index::Database& db = *database;
    if (arguments.value("--columns") || arguments.value("--metrics") || arguments.value("--sort") || grouped) {
      for (const auto& run : runs) {
        if (run.config.is_object())
          for (const auto& [key, value] : run.config.items()) config_names.insert(key);
        for (const auto& [key, value] : run.summary.items())
          if (value.is_number()) metric_names.insert(key);
        for (const auto& latest : index::latest_metrics(db, run.run)) metric_names.insert(latest.key);
      }
    }
  }

  [[noreturn]] void refuse_unknown(const std::string& option, const std::string& key,
                                   const std::set<std::string>& names) const {
    const std::vector<std::string> known(names.begin(), names.end());
    throw UsageError(fmt::format("{} '{}': no run shown has it (known: {}){}", option, key, fmt::join(known, ", "),
                                 core::did_you_mean(key, known)));
  }

  // The config and metric columns: the swept parameters, --columns and --metrics, else up to 4 summary values.
  void choose_columns() {
    for (const std::string& key : swept) config_columns.push_back({key, key});
    if (auto chosen = arguments.value("--columns")) {
      for (const std::string& name : split_list(*chosen)) {
        const bool config_prefix = name.rfind("config.", 0) == 0, metric_prefix = name.rfind("metric.", 0) == 0;
        const std::string key = config_prefix ? name.substr(7) : metric_prefix ? name.substr(7) : name;
        const bool is_config = config_names.count(key) > 0, is_metric = metric_names.count(key) > 0;
        if (!config_prefix && !metric_prefix && is_config && is_metric)
          throw UsageError(fmt::format(
              "--columns '{}': it is both a config key and a metric: write config.{} or metric.{}", name, key, key));
        if (config_prefix || (!metric_prefix && is_config)) {
          if (!runs.empty() && !is_config) refuse_unknown("--columns", name, config_names);
          config_columns.push_back({name, key});
        } else {
          if (!runs.empty() && !is_metric && !metric_prefix) {
            std::set<std::string> all = config_names;
            all.insert(metric_names.begin(), metric_names.end());
            refuse_unknown("--columns", name, all);
          }
          if (!runs.empty() && !is_metric) refuse_unknown("--columns", name, metric_names);
          metrics.push_back(key);
        }
      }
    }
    if (auto chosen = arguments.value("--metrics")) {
      for (const std::string& key : split_list(*chosen)) {
        if (!runs.empty() && !metric_names.count(key)) refuse_unknown("--metrics", key, metric_names);
        metrics.push_back(key);
      }
    } else if (!arguments.value("--columns")) {
      std::set<std::string> keys;
      for (const auto& run : runs)
        for (const auto& [key, value] : run.summary.items())
          if (value.is_number()) keys.insert(key);
      metrics.assign(keys.begin(), keys.end());
      if (metrics.size() > 4) metrics.resize(4);
      if (metrics.empty()) metrics.push_back("loss");
    }
  }

  // --sort: a config column, a metric (a column of its own when not shown) or a built-in column.
  void choose_sort() {
    sort = arguments.value("--sort");
    if (sort) {
      for (std::size_t c = 0; c < config_columns.size(); ++c)
        if (config_columns[c].header == *sort || "config." + config_columns[c].key == *sort) config_sort = c;
      if (!config_sort && sort->rfind("config.", 0) == 0) {
        const std::string key = sort->substr(7);
        if (!runs.empty() && !config_names.count(key)) refuse_unknown("--sort", *sort, config_names);
        config_columns.push_back({*sort, key});
        config_sort = config_columns.size() - 1;
      }
      if (!config_sort && sort->rfind("metric.", 0) == 0) sort = sort->substr(7);
    }
    sorted_by_metric = sort && !config_sort;
    if (sorted_by_metric && std::find(metrics.begin(), metrics.end(), *sort) == metrics.end()) {
      static const std::set<std::string> builtin = {"started", "name", "duration", "step", "status"};
      if (!builtin.count(*sort)) {
        // A key that none of the runs shown has is a mistake, not an empty column: say which keys there are.
        std::set<std::string> known(builtin.begin(), builtin.end());
        known.insert(metric_names.begin(), metric_names.end());
        if (!runs.empty() && !known.count(*sort)) {
          const std::vector<std::string> names(known.begin(), known.end());
          throw UsageError(fmt::format("--sort '{}': no run shown has it (known: {}){}", *sort, fmt::join(names, ", "),
                                       core::did_you_mean(*sort, names)));
        }
        metrics.insert(metrics.begin(), *sort);
      }
    }
  }

  // A line per run with its metric and config values; a metric column with no value in any run is dropped unless
  // it was asked for.
  void make_lines() {
    index::Database& db = *database;
    for (const auto& run : runs) {
      Line line{&run, {}, {}};
      for (const auto& key : metrics) line.values.push_back(metric_value(db, run, key));
      for (const auto& column : config_columns)
        line.config.push_back(run.config.is_object() && run.config.contains(column.key) ? run.config[column.key]
                                                                                        : nlohmann::json());
      lines.push_back(std::move(line));
    }
    if (!arguments.value("--metrics")) {
      for (size_t m = metrics.size(); m-- > 0;) {
        const bool any =
            std::any_of(lines.begin(), lines.end(), [&](const Line& l) { return l.values[m].has_value(); });
        if (!any && (!sort || metrics[m] != *sort)) {
          metrics.erase(metrics.begin() + static_cast<std::ptrdiff_t>(m));
          for (auto& line : lines) line.values.erase(line.values.begin() + static_cast<std::ptrdiff_t>(m));
        }
      }
    }
  }

  void sort_lines() {
    if (config_sort) {
      const std::size_t c = *config_sort;
      std::stable_sort(lines.begin(), lines.end(), [&](const Line& a, const Line& b) {
        const nlohmann::json &ka = a.config[c], &kb = b.config[c];
        if (ka.is_null() != kb.is_null()) return kb.is_null();  // runs without the key go last
        if (ka.is_null()) return false;
        if (ka.is_number() && kb.is_number())
          return descending ? ka.get<double>() > kb.get<double>() : ka.get<double>() < kb.get<double>();
        const std::string ta = ka.is_string() ? ka.get<std::string>() : ka.dump();
        const std::string tb = kb.is_string() ? kb.get<std::string>() : kb.dump();
        return descending ? ta > tb : ta < tb;
      });
    } else if (sort) {
      auto position = std::find(metrics.begin(), metrics.end(), *sort);
      auto key = [&](const Line& line) -> std::optional<double> {
        if (position != metrics.end()) return line.values[static_cast<size_t>(position - metrics.begin())];
        if (*sort == "started") return line.run->started_at;
        if (*sort == "duration") return index::duration_seconds(*line.run, now);
        if (*sort == "step") return static_cast<double>(line.run->step);
        return std::nullopt;
      };
      std::stable_sort(lines.begin(), lines.end(), [&](const Line& a, const Line& b) {
        if (*sort == "name") return descending ? a.run->name > b.run->name : a.run->name < b.run->name;
        if (*sort == "status") return descending ? a.run->status > b.run->status : a.run->status < b.run->status;
        const auto ka = key(a), kb = key(b);
        const bool va = ka && !std::isnan(*ka), vb = kb && !std::isnan(*kb);
        if (va != vb) return va;  // runs without the value go last
        if (!va) return false;
        return descending ? *ka > *kb : *ka < *kb;
      });
    }
  }

  // --group, --group-by: a line per group of runs.
  int print_groups() {
    std::vector<const index::RunRecord*> shown;
    std::vector<std::vector<std::optional<double>>> values;
    for (const Line& line : lines) {
      shown.push_back(line.run);
      values.push_back(line.values);
    }
    const std::optional<std::vector<std::string>> group_by =
        arguments.value("--group-by") ? std::optional(split_list(*arguments.value("--group-by"))) : std::nullopt;
    RunGrouping grouping = group_runs_by(shown, values, group_by);
    const std::vector<std::string>& keys = grouping.keys;
    std::vector<RunGroup>& groups = grouping.groups;
    if (sorted_by_metric) {
      const auto position = std::find(metrics.begin(), metrics.end(), *sort);
      if (position != metrics.end()) {
        const std::size_t m = static_cast<std::size_t>(position - metrics.begin());
        std::stable_sort(groups.begin(), groups.end(), [&](const RunGroup& a, const RunGroup& b) {
          const double ka = a.metrics[m].mean, kb = b.metrics[m].mean;
          if (std::isnan(ka) != std::isnan(kb)) return !std::isnan(ka);  // groups without the value go last
          return !std::isnan(ka) && (descending ? ka > kb : ka < kb);
        });
      }
    }
    if (limit > 0 && groups.size() > static_cast<size_t>(limit)) groups.resize(static_cast<size_t>(limit));
    if (format == TableFormat::aligned && groups.empty()) {
      print("no runs match\n");
      return 0;
    }
    print(format_table(group_table(groups, keys, metrics, format), format));
    return 0;
  }

  int print_runs() {
    index::Database& db = *database;
    const size_t total = lines.size();
    if (limit > 0 && lines.size() > static_cast<size_t>(limit)) lines.resize(static_cast<size_t>(limit));

    // The sweep trial a run is: a "sweep" column ("NAME #TRIAL") when a run shown is one; --csv and --json always
    // have "sweep" (the name) and "trial".
    std::map<std::int64_t, std::string> sweep_names = sweep::sweep_names(db);
    const bool aligned = format == TableFormat::aligned;
    const bool sweep_column =
        !filter.sweep &&
        (!aligned || std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.run->sweep.has_value(); }));
    // Tags and the note: columns when a run shown has them (--csv and --json always have both).
    const bool tags_column =
        !aligned || std::any_of(lines.begin(), lines.end(), [](const Line& l) { return !l.run->tags.empty(); });
    const bool note_column =
        !aligned || std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.run->note.has_value(); });
    Table table;
    table.columns = {"id", "name", "status", "started", "duration", "step", "ranks"};
    if (filter.sweep) table.columns.insert(table.columns.begin() + 2, "trial");
    if (tags_column) table.columns.push_back("tags");
    if (sweep_column) table.columns.push_back("sweep");
    if (sweep_column && !aligned) table.columns.push_back("trial");
    for (const auto& column : config_columns) table.columns.push_back(column.header);
    for (const auto& key : metrics) table.columns.push_back(key);
    if (note_column) table.columns.push_back("note");
    for (const auto& line : lines) {
      const auto& run = *line.run;
      std::vector<Cell> row = {run.id, run.name, index::effective_status(run, now)};
      if (filter.sweep) row.insert(row.begin() + 2, run.trial ? Cell(*run.trial) : Cell(std::monostate{}));
      if (aligned) {
        row.push_back(core::local_time_text(run.started_at).substr(0, 16));
        row.push_back(core::duration_text(index::duration_seconds(run, now)));
      } else {
        row.push_back(run.started_at);
        row.push_back(index::duration_seconds(run, now));
      }
      row.push_back(run.step);
      row.push_back(static_cast<int64_t>(run.world_size));
      if (tags_column) row.push_back(run.tags.empty() ? Cell(std::monostate{}) : Cell(tags_text(run)));
      if (sweep_column) {
        const std::string name = run.sweep ? sweep_names[*run.sweep] : "";
        if (aligned)
          row.push_back(run.sweep ? Cell(fmt::format("{} #{}", name, run.trial.value_or(0))) : Cell(std::monostate{}));
        else
          row.push_back(run.sweep ? Cell(name) : Cell(std::monostate{}));
        if (!aligned) row.push_back(run.trial ? Cell(*run.trial) : Cell(std::monostate{}));
      }
      for (const auto& value : line.config) row.push_back(value.is_null() ? Cell(std::monostate{}) : json_cell(value));
      for (const auto& value : line.values) row.push_back(value ? Cell(*value) : Cell(std::monostate{}));
      if (note_column)
        row.push_back(!run.note ? Cell(std::monostate{}) : aligned ? Cell(note_line(*run.note)) : Cell(*run.note));
      table.rows.push_back(std::move(row));
    }
    if (format == TableFormat::aligned && table.rows.empty()) {
      print(runs.empty() && !filter.status && !filter.name_glob && !filter.started_after && !filter.sweep && !where
                ? "no runs yet\n"
                : "no runs match\n");
      return 0;
    }
    print(format_table(table, format));
    if (format == TableFormat::aligned && total > lines.size())
      print(fmt::format("({} of {} runs shown; --limit 0 shows all)\n", lines.size(), total));
    // A name that is both: say which one the rows are sorted by.
    if (format == TableFormat::aligned && sort &&
        config_names.count(config_sort ? config_columns[*config_sort].key : *sort) &&
        metric_names.count(config_sort ? config_columns[*config_sort].key : *sort)) {
      const std::string key = config_sort ? config_columns[*config_sort].key : *sort;
      print(config_sort
                ? fmt::format("(sorted by the config value {}; --sort metric.{} sorts by the metric)\n", key, key)
                : fmt::format("(sorted by the metric {}; --sort config.{} sorts by the config value)\n", key, key));
    }
    return 0;
  }
};

}  // namespace

int runs_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv,
                                                    {"--status", "--name", "--since", "--sort", "--limit", "--metrics",
                                                     "--columns", "--sweep", "--where", "--group-by"},
                                                    {"--csv", "--json", "--desc", "--group"});
  return RunsListing(arguments).run();
}

namespace {

// The config keys an attempt changed from the attempt before, as key=value.
std::string config_changes(const nlohmann::json& before, const nlohmann::json& now) {
  if (!before.is_object() || !now.is_object()) return before == now ? "" : core::json_text(now);
  std::set<std::string> keys;
  for (const auto& [key, value] : before.items()) keys.insert(key);
  for (const auto& [key, value] : now.items()) keys.insert(key);
  std::string text;
  for (const std::string& key : keys) {
    if (before.contains(key) && now.contains(key) && before[key] == now[key]) continue;
    const std::string value = !now.contains(key)     ? "-"
                              : now[key].is_string() ? now[key].get<std::string>()
                                                     : core::json_text(now[key]);
    text += fmt::format("{}{}={}", text.empty() ? "" : " ", key, value);
  }
  return text;
}

Table attempts_table(const index::RunRecord& run, const std::vector<index::AttemptRecord>& attempts, double now) {
  Table table{{"attempt", "status", "started", "duration", "steps", "world size", "hosts", "config changes", "error"},
              {}};
  const auto step = [](const std::optional<int64_t>& value) {
    return value ? fmt::format("{}", *value) : std::string("?");
  };
  for (size_t i = 0; i < attempts.size(); ++i) {
    const index::AttemptRecord& a = attempts[i];
    const std::string status = index::effective_attempt_status(run, a, now);
    std::vector<Cell> row = {a.attempt, status};
    if (a.started_at) {
      const double end = a.ended_at ? *a.ended_at : status == "running" ? now : run.heartbeat_at;
      row.push_back(core::local_time_text(*a.started_at));
      row.push_back(core::duration_text(std::max(0.0, end - *a.started_at)));
    } else {
      row.insert(row.end(), {std::monostate{}, std::monostate{}});
    }
    row.push_back(fmt::format("{}-{}", step(a.start_step), step(a.end_step)));
    row.push_back(a.world_size);
    row.push_back(fmt::format("{}", fmt::join(a.hosts, ", ")));
    const std::string changes = i == 0 ? "" : config_changes(attempts[i - 1].config, a.config);
    row.push_back(changes.empty() ? Cell(std::monostate{}) : Cell(changes));
    row.push_back(a.error ? Cell(a.error->substr(0, a.error->find('\n'))) : Cell(std::monostate{}));
    table.rows.push_back(std::move(row));
  }
  return table;
}

}  // namespace

namespace {

void print_section(const std::string& title, const Table& table) {
  if (table.rows.empty()) return;
  print("\n" + title + "\n");
  std::string text = format_table(table, TableFormat::aligned);
  // Indent the section's table by two spaces.
  std::string indented;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    indented += "  " + text.substr(start, end - start + 1);
    start = end + 1;
  }
  print(indented);
}

Table key_values(const nlohmann::json& object, const std::string& value_column) {
  Table table{{"key", value_column}, {}};
  if (object.is_object())
    for (const auto& [key, value] : object.items()) table.rows.push_back({key, json_cell(value)});
  else if (!object.is_null())
    table.rows.push_back({"(not JSON)", json_cell(object)});  // a column edited outside runner
  return table;
}

// What the run read, attempt by attempt: "encoded from SRC with the VAE sha256 ABC..." for latents, a VAE's hash.
Table inputs_table(const std::vector<index::InputRecord>& inputs) {
  Table table{{"attempt", "kind", "path", "size", "identified by"}, {}};
  for (const index::InputRecord& input : inputs) {
    const nlohmann::json& d = input.detail;
    std::string identity;
    if (d.contains("vae") && d["vae"].is_object() && d["vae"].contains("sha256"))
      identity = fmt::format("encoded from {} with the VAE sha256 {}", d.value("source", "?"),
                             d["vae"]["sha256"].get<std::string>().substr(0, 12));
    else if (d.contains("sha256") && d["sha256"].is_string())
      identity = "sha256 " + d["sha256"].get<std::string>().substr(0, 12);
    else if (input.modified_at)
      identity = "modified " + core::local_time_text(*input.modified_at);
    table.rows.push_back(
        {input.attempt, input.kind, input.path,
         input.bytes ? Cell(core::byte_size_text(static_cast<uint64_t>(*input.bytes))) : Cell(std::monostate{}),
         identity.empty() ? Cell(std::monostate{}) : Cell(identity)});
  }
  return table;
}

// The command that runs the script again with every config value the run had at its start (`runner show`).
std::string rerun_command(const index::RunRecord& run) {
  std::string command = "runner";
  if (run.world_size > 1 && run.hosts.size() <= 1) command += fmt::format(" --nproc {}", run.world_size);
  command += " " + core::shell_word(run.script);
  if (run.config.is_object())
    for (const auto& [key, value] : run.config.items())
      command += " " + core::shell_word(key + "=" + sweep::override_text(value));
  const std::string version = run.versions.is_object() ? run.versions.value("runner", std::string()) : std::string();
  return version.empty() ? command : fmt::format("{}   (runner {})", command, version);
}

// The config as the run started, with a "now" column where runner attach changed a value ("config.lr = 0.5").
Table config_table(const nlohmann::json& config, const std::vector<index::InterventionRecord>& interventions) {
  const std::map<std::string, index::ConfigChange> now = index::config_changes(interventions);
  Table table = key_values(config, "value");
  if (now.empty()) return table;
  table.columns.push_back("now (runner attach)");
  for (auto& row : table.rows) {
    const auto found = now.find(std::get<std::string>(row[0]));
    row.push_back(found == now.end() ? Cell(std::monostate{})
                                     : Cell(fmt::format("{} (after step {})", found->second.text, found->second.step)));
  }
  return table;
}

}  // namespace

int show_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--json", "--sweep"});
  if (arguments.positional.size() != 1) throw UsageError("expected one RUN (an id, id prefix, name or 'last')");
  index::Database db = index::open_index_for_reading(command_index());
  const index::RunRecord run = index::resolve_run(db, arguments.positional[0], last_among(arguments));
  const double now = index::now_seconds();
  if (arguments.has("--json")) {
    print(core::json_text(report::run_json(db, run, now), 2) + "\n");
    return 0;
  }
  const std::string status = index::effective_status(run, now);
  const auto shown = [](std::string_view value) { return core::terminal_text(value, core::TextLines::escaped); };
  std::string text = fmt::format("run       {} ({})\n", shown(run.name), run.id);
  text += fmt::format("status    {}{}\n", shown(status),
                      status != run.status ? " (its process is gone: killed or crashed)" : "");
  if (run.error) {
    const std::string first_line = run.error->substr(0, run.error->find('\n'));
    text += fmt::format("error     {}\n", shown(first_line));
  }
  const double wall = index::wall_seconds(run, now);
  text += fmt::format("started   {}   duration {}{}   step {}\n", core::local_time_text(run.started_at),
                      core::duration_text(index::duration_seconds(run, now)),
                      run.attempts > 1 ? fmt::format(" in {} attempts ({} from the first start to the end)",
                                                     run.attempts, core::duration_text(wall))
                                       : "",
                      run.step);
  text += fmt::format("script    {}{}\n", run.script.empty() ? "-" : shown(run.script),
                      run.script_hash.empty() ? "" : fmt::format("   sha256 {}", shown(run.script_hash.substr(0, 12))));
  if (!run.script.empty()) text += fmt::format("rerun     {}\n", shown(rerun_command(run)));
  if (run.git_revision)
    text += fmt::format("git       {}{}\n", shown(run.git_revision->substr(0, 12)),
                        run.git_dirty.value_or(false) ? " (modified)" : "");
  text += fmt::format("host      {}   pid {}   device {}   world size {}{}\n", shown(run.host), run.pid,
                      run.device.empty() ? "-" : shown(run.device), run.world_size,
                      run.seed ? fmt::format("   seed {}", *run.seed) : "");
  if (run.hosts.size() > 1) text += fmt::format("hosts     {}\n", shown(fmt::format("{}", fmt::join(run.hosts, ", "))));
  text += fmt::format("directory {}\n", shown(command_index().home + "/" + run.dir));
  if (run.parent_id) text += fmt::format("parent    {}\n", shown(*run.parent_id));
  if (!run.tags.empty()) text += fmt::format("tags      {}\n", shown(fmt::format("{}", fmt::join(run.tags, ", "))));
  if (run.note) text += fmt::format("note      {}\n", shown(*run.note));
  print(text);
  const std::vector<index::InterventionRecord> changes = index::interventions(db, run.run);
  print_section("config", config_table(run.config, changes));
  if (const auto attempts = index::run_attempts(db, run.run); attempts.size() > 1)
    print_section("attempts", attempts_table(run, attempts, now));
  print_section("inputs", inputs_table(index::run_inputs(db, run.run)));
  print_section("summary", key_values(run.summary, "value"));
  Table metrics{{"metric", "step", "value"}, {}};
  for (const auto& latest : index::latest_metrics(db, run.run))
    metrics.rows.push_back({latest.key, latest.point.step, latest.point.value});
  print_section("metrics (latest)", metrics);
  Table checkpoints{{"step", "path", "size", "kept", "metric"}, {}};
  for (const auto& c : index::checkpoints(db, run.run)) {
    checkpoints.rows.push_back(
        {c.step, c.path, core::byte_size_text(static_cast<uint64_t>(c.bytes)), c.kept ? "yes" : "no",
         c.metric ? Cell(fmt::format("{} = {}", *c.metric, c.metric_value ? core::number_text(*c.metric_value) : "-"))
                  : Cell(std::monostate{})});
  }
  print_section("checkpoints", checkpoints);
  Table interventions{{"step", "time", "changed", "chunk"}, {}};
  for (const index::InterventionRecord& i : changes)
    interventions.rows.push_back(
        {i.step, core::local_time_text(i.time), fmt::format("{}", fmt::join(i.changes, ", ")), i.chunk});
  print_section("interventions (runner attach)", interventions);
  Table histograms{{"histogram", "steps", "first", "last"}, {}};
  for (const auto& [key, steps] : index::histogram_steps(db, run.run))
    histograms.rows.push_back({key, static_cast<int64_t>(steps.size()), steps.front(), steps.back()});
  print_section("histograms", histograms);
  Table artifacts{{"step", "kind", "name", "path", "size"}, {}};
  for (const auto& a : index::artifacts(db, run.run))
    artifacts.rows.push_back({a.step, a.kind, a.name, a.path, core::byte_size_text(static_cast<uint64_t>(a.bytes))});
  print_section("artifacts", artifacts);
  Table versions = key_values(run.versions, "version");
  print_section("versions", versions);
  return 0;
}

namespace {

// DDPM's loss (noise or v prediction at a schedule's timesteps) and a flow's (velocity over its path) measure
// different things: side by side they mislead.
void say_when_objectives_differ(const std::vector<index::RunRecord>& runs, TableFormat format) {
  std::set<std::string> objectives;
  for (const auto& run : runs)
    if (run.config.is_object() && run.config.contains("objective") && run.config["objective"].is_string())
      objectives.insert(run.config["objective"].get<std::string>());
  if (objectives.size() > 1) {
    const std::string note = fmt::format(
        "the runs' objectives differ ({}): their losses measure different things and cannot be compared; compare "
        "what their samples score\n",
        fmt::join(objectives, ", "));
    if (format == TableFormat::aligned)
      print("(" + note.substr(0, note.size() - 1) + ")\n");
    else
      std::fputs(("runner compare: " + note).c_str(), stderr);
  }
}

// `runner compare --group`: a column per group of the runs (runs --group's grouping), with its runs, the keys that
// tell the groups apart, and each summary value's and latest metric's mean ± standard deviation over its runs (in
// --csv and --json the mean, and the standard deviation in a row "KEY std").
Table grouped_comparison(index::Database& db, const std::vector<index::RunRecord>& runs,
                         const std::optional<std::vector<std::string>>& group_by, TableFormat format) {
  std::set<std::string> summary_keys, metric_keys;
  for (const auto& run : runs) {
    for (const auto& [key, value] : run.summary.items())
      if (value.is_number()) summary_keys.insert(key);
    for (const auto& latest : index::latest_metrics(db, run.run)) metric_keys.insert(latest.key);
  }
  std::vector<std::pair<std::string, std::string>> rows;  // (section, key) of each value
  for (const auto& key : summary_keys) rows.emplace_back("summary", key);
  for (const auto& key : metric_keys) rows.emplace_back("metric", key);
  std::vector<const index::RunRecord*> members;
  std::vector<std::vector<std::optional<double>>> values;
  for (const auto& run : runs) {
    members.push_back(&run);
    values.emplace_back();
    for (const auto& [section, key] : rows)
      values.back().push_back(section == "summary" ? std::optional(run.summary[key].get<double>())
                                                   : index::latest_metric(db, run.run, key));
  }
  const RunGrouping grouping = group_runs_by(members, values, group_by);
  Table table{{"section", "key"}, {}};
  std::vector<Cell> names = {"run", "runs"};
  for (const RunGroup& group : grouping.groups) {
    table.columns.push_back(fmt::format("{} ({} run{})", group_label(group, grouping.keys), group.runs.size(),
                                        group.runs.size() == 1 ? "" : "s"));
    std::vector<std::string> member_names;
    for (const index::RunRecord* run : group.runs) member_names.push_back(run->name);
    names.push_back(fmt::format("{}", fmt::join(member_names, " ")));
  }
  table.rows.push_back(std::move(names));
  for (std::size_t k = 0; k < grouping.keys.size(); ++k) {
    std::vector<Cell> row = {"config", grouping.keys[k]};
    for (const RunGroup& group : grouping.groups) row.push_back(json_cell(group.key[k]));
    table.rows.push_back(std::move(row));
  }
  const auto number = [](double value) { return std::isnan(value) ? Cell(std::monostate{}) : Cell(value); };
  for (std::size_t m = 0; m < rows.size(); ++m) {
    std::vector<Cell> row = {rows[m].first, rows[m].second}, spread = {rows[m].first, rows[m].second + " std"};
    for (const RunGroup& group : grouping.groups) {
      const MetricSpread& one = group.metrics[m];
      if (format != TableFormat::aligned) {
        row.push_back(number(one.mean));
        spread.push_back(number(one.std));
      } else if (one.count == 0) {
        row.push_back(std::monostate{});
      } else {
        row.push_back(one.count > 1 ? fmt::format("{} \u00b1 {} ({})", core::number_text(one.mean),
                                                  core::number_text(one.std), one.count)
                                    : fmt::format("{} (1)", core::number_text(one.mean)));
      }
    }
    table.rows.push_back(std::move(row));
    if (format != TableFormat::aligned) table.rows.push_back(std::move(spread));
  }
  return table;
}

}  // namespace

int compare_command(int argc, char** argv) {
  const ParsedArguments arguments =
      parse_arguments(argc, argv, {"--group-by"}, {"--all", "--csv", "--json", "--sweep", "--group"});
  if (arguments.positional.size() < 2) throw UsageError("expected two or more RUNs to compare");
  const TableFormat format = table_format(arguments);
  index::Database db = index::open_index_for_reading(command_index());
  std::vector<index::RunRecord> runs;
  for (const auto& reference : arguments.positional) {
    runs.push_back(index::resolve_run(db, reference, last_among(arguments)));
    for (size_t i = 0; i + 1 < runs.size(); ++i)
      if (runs[i].run == runs.back().run) throw UsageError(fmt::format("run {} is given twice", runs.back().name));
  }
  if (arguments.has("--group") || arguments.value("--group-by")) {
    print(format_table(
        grouped_comparison(
            db, runs,
            arguments.value("--group-by") ? std::optional(split_list(*arguments.value("--group-by"))) : std::nullopt,
            format),
        format));
    return 0;
  }
  std::vector<std::string> heads = {"", ""};
  heads[0] = "section";
  heads[1] = "key";
  for (const auto& run : runs) heads.push_back(fmt::format("{} ({})", run.name, run.id));
  Table table{heads, {}};

  std::set<std::string> config_keys;
  for (const auto& run : runs)
    if (run.config.is_object())
      for (const auto& [key, value] : run.config.items()) config_keys.insert(key);
  for (const auto& key : config_keys) {
    std::vector<Cell> row = {"config", key};
    std::set<std::string> distinct;
    for (const auto& run : runs) {
      const bool has = run.config.contains(key);
      row.push_back(has ? json_cell(run.config[key]) : Cell(std::monostate{}));
      distinct.insert(has ? core::json_text(run.config[key]) : "<absent>");
    }
    if (distinct.size() > 1 || arguments.has("--all")) table.rows.push_back(std::move(row));
  }
  std::set<std::string> summary_keys, metric_keys;
  for (const auto& run : runs) {
    for (const auto& [key, value] : run.summary.items()) summary_keys.insert(key);
    for (const auto& latest : index::latest_metrics(db, run.run)) metric_keys.insert(latest.key);
  }
  for (const auto& key : summary_keys) {
    std::vector<Cell> row = {"summary", key};
    for (const auto& run : runs)
      row.push_back(run.summary.contains(key) ? json_cell(run.summary[key]) : Cell(std::monostate{}));
    table.rows.push_back(std::move(row));
  }
  for (const auto& key : metric_keys) {
    std::vector<Cell> row = {"metric", key};
    for (const auto& run : runs) {
      auto value = index::latest_metric(db, run.run, key);
      row.push_back(value ? Cell(*value) : Cell(std::monostate{}));
    }
    table.rows.push_back(std::move(row));
  }
  const double now = index::now_seconds();
  std::vector<Cell> status = {"run", "status"}, steps = {"run", "step"}, duration = {"run", "duration"};
  for (const auto& run : runs) {
    status.push_back(index::effective_status(run, now));
    steps.push_back(run.step);
    duration.push_back(format == TableFormat::aligned ? Cell(core::duration_text(index::duration_seconds(run, now)))
                                                      : Cell(index::duration_seconds(run, now)));
  }
  table.rows.insert(table.rows.begin(), {status, steps, duration});
  print(format_table(table, format));
  if (format == TableFormat::aligned && config_keys.size() > 0 && !arguments.has("--all"))
    print("(config keys with equal values are hidden; --all shows them)\n");
  say_when_objectives_differ(runs, format);
  return 0;
}

}  // namespace runner::cli
