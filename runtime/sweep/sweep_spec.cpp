// Reading and checking a sweep definition, its grid, and the trials' command-line overrides.
#include "runtime/sweep/sweep_spec.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "runtime/core/json_text.h"
#include "runtime/core/did_you_mean.h"
#include "runtime/core/terminal_text.h"
#include "runtime/index/run_store.h"

namespace runner::sweep {
namespace {

using nlohmann::json;

const std::vector<std::string> kFields = {"name",   "script",         "parameters",   "fixed",   "method",
                                          "trials", "metric",         "mode",         "seed",    "prune",
                                          "slots",  "gpus_per_trial", "max_failures", "retries", "takeover_after"};

// The ranges of whole numbers: counts (trials, slots, ...) fit an int; steps, seeds and int ranges are exact in
// the doubles Lua numbers are.
constexpr std::int64_t kMaxCount = INT_MAX;
constexpr std::int64_t kMaxExact = (std::int64_t{1} << 53) - 1;

// A value as JSON text for a message; bytes that are not UTF-8 become U+FFFD instead of an exception.
std::string shown(const json& value) { return core::json_text(value); }

bool is_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// The first key or string in `value` that is not UTF-8, quoted with its bytes escaped; empty when there is none.
std::string non_utf8_text(const json& value) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    return is_utf8(text) ? "" : "\"" + core::terminal_text(text) + "\"";
  }
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      if (!is_utf8(key)) return "\"" + core::terminal_text(key) + "\"";
      if (std::string bad = non_utf8_text(item); !bad.empty()) return bad;
    }
  }
  if (value.is_array())
    for (const json& item : value)
      if (std::string bad = non_utf8_text(item); !bad.empty()) return bad;
  return "";
}

struct Reader {
  const json& definition;
  const json& fields;

  std::string where(const std::string& field) const {
    const json& lines = definition.value("lines", json::object());
    if (lines.contains(field) && lines[field].is_string()) return lines[field].get<std::string>();
    return definition.value("where", std::string("sweep"));
  }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw SweepError(fmt::format("{}: {}", where(field), message));
  }
  bool has(const std::string& field) const { return fields.contains(field) && !fields[field].is_null(); }
  std::string text(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    if (!fields[field].is_string() || fields[field].get<std::string>().empty())
      fail(field, fmt::format("'{}' must be a non-empty string, got {}", field, shown(fields[field])));
    return fields[field].get<std::string>();
  }
  // A whole number from minimum to maximum, read as a 64-bit value before it is narrowed to its field's type;
  // `label` names it in the message ("'trials'", "parameter 'n': low"), `field` gives the line.
  std::int64_t whole(const json& value, const std::string& field, const std::string& label, std::int64_t minimum,
                     std::int64_t maximum) const {
    std::optional<std::int64_t> number;
    if (value.is_number_unsigned()) {
      if (value.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxExact)) number = value.get<std::int64_t>();
    } else if (value.is_number_integer()) {
      if (std::abs(value.get<std::int64_t>()) <= kMaxExact) number = value.get<std::int64_t>();
    } else if (value.is_number_float()) {
      const double x = value.get<double>();
      if (std::isfinite(x) && std::floor(x) == x && std::abs(x) <= static_cast<double>(kMaxExact))
        number = static_cast<std::int64_t>(x);
    }
    if (!number || *number < minimum || *number > maximum)
      fail(field,
           maximum >= kMaxExact
               ? fmt::format("{} must be a whole number >= {}, got {}", label, minimum, shown(value))
               : fmt::format("{} must be a whole number from {} to {}, got {}", label, minimum, maximum, shown(value)));
    return *number;
  }
  std::int64_t whole(const std::string& field, std::int64_t minimum, std::int64_t maximum,
                     std::int64_t fallback) const {
    return has(field) ? whole(fields[field], field, "'" + field + "'", minimum, maximum) : fallback;
  }
};

bool is_scalar(const json& value) { return value.is_number() || value.is_string() || value.is_boolean(); }

double number(const Reader& reader, const json& object, const char* key, const std::string& name,
              const std::string& what) {
  if (!object.contains(key) || !object[key].is_number() || !std::isfinite(object[key].get<double>()))
    reader.fail(name, fmt::format("parameter '{}': {} needs a finite number for {}, got {}", name, what, key,
                                  object.contains(key) ? shown(object[key]) : "nothing"));
  return object[key].get<double>();
}

Parameter parse_parameter(const Reader& reader, const std::string& name, const json& value) {
  Parameter parameter;
  parameter.name = name;
  parameter.where = reader.where(name);
  if (value.is_array()) {
    parameter.kind = ParameterKind::choice;
    parameter.values = value;
  } else if (value.is_object() && value.contains("kind")) {
    const std::string kind = value["kind"].is_string() ? value["kind"].get<std::string>() : "";
    if (kind == "choice") {
      parameter.kind = ParameterKind::choice;
      parameter.values = value.value("values", json::array());
    } else if (kind == "uniform" || kind == "log_uniform") {
      parameter.kind = kind == "uniform" ? ParameterKind::uniform : ParameterKind::log_uniform;
      parameter.low = number(reader, value, "low", name, kind);
      parameter.high = number(reader, value, "high", name, kind);
      if (!(parameter.low < parameter.high))
        reader.fail(name, fmt::format("parameter '{}': {} needs low < high, got {} and {}", name, kind,
                                      shown(value["low"]), shown(value["high"])));
      if (kind == "log_uniform" && parameter.low <= 0)
        reader.fail(name, fmt::format("parameter '{}': log_uniform needs 0 < low < high, got {} and {}", name,
                                      shown(value["low"]), shown(value["high"])));
    } else if (kind == "int") {
      parameter.kind = ParameterKind::integer;
      auto bound = [&](const char* key, const json& fallback, std::int64_t minimum) {
        return static_cast<double>(reader.whole(value.value(key, fallback), name,
                                                fmt::format("parameter '{}': {}", name, key), minimum, kMaxExact));
      };
      parameter.low = bound("low", json(), -kMaxExact);
      parameter.high = bound("high", json(), -kMaxExact);
      parameter.step = bound("step", json(1), 1);
      parameter.log = value.value("log", false);
      if (!(parameter.low < parameter.high))
        reader.fail(name, fmt::format("parameter '{}': int needs low < high, got {} and {}", name, shown(value["low"]),
                                      shown(value["high"])));
      if (parameter.log && (parameter.low <= 0 || parameter.step != 1))
        reader.fail(name, fmt::format("parameter '{}': int with log = true needs low > 0 and step 1", name));
    } else {
      reader.fail(name, fmt::format("parameter '{}': unknown kind '{}' (known: choice, uniform, log_uniform, int)",
                                    name, kind));
    }
  } else {
    reader.fail(name, fmt::format("parameter '{}' must be a list of values or runner.sweep.uniform / log_uniform / "
                                  "int / choice, got {} (a single value belongs in fixed = {{ ... }})",
                                  name, shown(value)));
  }
  if (parameter.kind == ParameterKind::choice) {
    if (!parameter.values.is_array() || parameter.values.empty())
      reader.fail(name, fmt::format("parameter '{}' has no values: give at least one", name));
    for (size_t i = 0; i < parameter.values.size(); ++i) {
      const json& item = parameter.values[i];
      const bool list = item.is_array() && !item.empty() && std::all_of(item.begin(), item.end(), is_scalar);
      if (!is_scalar(item) && !list)
        reader.fail(name, fmt::format("parameter '{}': value {} is {}; values are numbers, strings, booleans or "
                                      "lists of them",
                                      name, i + 1, shown(item)));
      for (size_t j = 0; j < i; ++j)
        if (parameter.values[j] == item)
          reader.fail(name, fmt::format("parameter '{}' lists the value {} twice", name, shown(item)));
    }
  }
  return parameter;
}

json parameter_json(const Parameter& parameter) {
  switch (parameter.kind) {
    case ParameterKind::choice:
      return {{"kind", "choice"}, {"values", parameter.values}};
    case ParameterKind::uniform:
    case ParameterKind::log_uniform:
      return {{"kind", kind_name(parameter.kind)}, {"low", parameter.low}, {"high", parameter.high}};
    case ParameterKind::integer:
      return {{"kind", "int"},
              {"low", static_cast<std::int64_t>(parameter.low)},
              {"high", static_cast<std::int64_t>(parameter.high)},
              {"step", static_cast<std::int64_t>(parameter.step)},
              {"log", parameter.log}};
  }
  return json();
}

std::string absolute_script(const Reader& reader, const std::string& script, const std::string& sweep_file) {
  std::vector<std::string> candidates{script};
  const auto slash = sweep_file.rfind('/');
  if (script[0] != '/' && slash != std::string::npos) candidates.push_back(sweep_file.substr(0, slash + 1) + script);
  for (const std::string& candidate : candidates) {
    if (::access(candidate.c_str(), R_OK) != 0) continue;
    char* resolved = ::realpath(candidate.c_str(), nullptr);
    if (!resolved) continue;
    std::string path = resolved;
    std::free(resolved);
    return path;
  }
  reader.fail("script", fmt::format("script '{}' not found (looked for {})", script, fmt::join(candidates, " and ")));
}

std::string shortest(double value) {
  if (std::floor(value) == value && std::abs(value) < 1e15) return fmt::format("{}", static_cast<std::int64_t>(value));
  return fmt::format("{}", value);
}

const char* json_type(const json& value) {
  if (value.is_boolean()) return "true or false";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "a list";
  return "a value";
}

bool same_type(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return true;
  if (a.is_array() && b.is_array()) {
    const json element = a.empty() ? json(0) : a[0];
    return std::all_of(b.begin(), b.end(), [&](const json& item) { return same_type(element, item); });
  }
  return a.type() == b.type();
}

bool whole(const json& value) { return value.is_number() && std::floor(value.get<double>()) == value.get<double>(); }

}  // namespace

std::string where_of(const SweepSpec& spec, const std::string& field) {
  const auto found = spec.lines.find(field);
  return found != spec.lines.end() ? found->second : spec.where;
}

const char* method_name(Method method) {
  switch (method) {
    case Method::grid:
      return "grid";
    case Method::random:
      return "random";
    case Method::tpe:
      return "tpe";
  }
  return "?";
}

const char* kind_name(ParameterKind kind) {
  switch (kind) {
    case ParameterKind::choice:
      return "choice";
    case ParameterKind::uniform:
      return "uniform";
    case ParameterKind::log_uniform:
      return "log_uniform";
    case ParameterKind::integer:
      return "int";
  }
  return "?";
}

SweepSpec parse_sweep(const json& definition) {
  const json& fields = definition.contains("fields") ? definition["fields"] : definition;
  const Reader reader{definition, fields};
  if (!fields.is_object()) throw SweepError(fmt::format("{}: runner.sweep expects a table", reader.where("")));
  for (const auto& [key, value] : fields.items()) {
    if (std::find(kFields.begin(), kFields.end(), key) == kFields.end())
      reader.fail(key, fmt::format("unknown sweep field '{}' (known: {}){}", key, fmt::join(kFields, ", "),
                                   core::did_you_mean(key, kFields)));
  }
  SweepSpec spec;
  spec.sweep_file = definition.value("sweep_file", std::string());
  spec.where = definition.value("where", spec.sweep_file);
  for (const std::string& field : kFields)
    if (reader.has(field)) spec.lines[field] = reader.where(field);
  // The index keeps the definition as JSON text, which holds UTF-8 only.
  if (!is_utf8(spec.sweep_file))
    reader.fail("", "the sweep file's path is not UTF-8 text: rename the file (the index keeps text as UTF-8)");
  for (const auto& [key, value] : fields.items()) {
    if (key == "parameters" && value.is_object()) {
      for (const auto& [name, space] : value.items())
        if (std::string bad = non_utf8_text(space); !bad.empty() || !is_utf8(name))
          reader.fail(name, fmt::format("parameter {} holds text that is not UTF-8: {} (the index keeps text as UTF-8)",
                                        "\"" + core::terminal_text(name) + "\"", bad.empty() ? "its name" : bad));
    } else if (std::string bad = non_utf8_text(value); !bad.empty()) {
      reader.fail(key, fmt::format("'{}' holds text that is not UTF-8: {} (the index keeps text as UTF-8)", key, bad));
    }
  }
  if (!reader.has("script")) reader.fail("", "the sweep names no script (script = \"experiments/foo.lua\")");
  const std::string script = reader.text("script", "");
  spec.script = definition.value("resolved", false) ? script : absolute_script(reader, script, spec.sweep_file);
  if (!is_utf8(spec.script))
    reader.fail("script",
                fmt::format("the script's path {} is not UTF-8 text: rename it (the index keeps text as UTF-8)",
                            core::terminal_text(spec.script)));
  std::string stem = spec.sweep_file.substr(spec.sweep_file.rfind('/') + 1);
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".lua") == 0) stem.resize(stem.size() - 4);
  spec.name = reader.text("name", stem.empty() ? "sweep" : stem);
  // The name is the folder of the trials' logs under RUNNER_HOME; sweeps stored before names were checked
  // still read back.
  if (!definition.value("resolved", false)) {
    try {
      index::check_name(spec.name, "sweep");
    } catch (const index::IndexError& error) {
      reader.fail("name",
                  reader.has("name")
                      ? error.what()
                      : fmt::format("{} (the sweep file's name): give the sweep a name = \"...\"", error.what()));
    }
  }

  if (!reader.has("parameters") || !fields["parameters"].is_object() || fields["parameters"].empty())
    reader.fail("parameters",
                "the sweep has an empty search space: parameters = { lr = runner.sweep.log_uniform(1e-4, "
                "1e-2), ... } names at least one config key");
  for (const auto& [name, value] : fields["parameters"].items())
    spec.parameters.push_back(parse_parameter(reader, name, value));
  std::sort(spec.parameters.begin(), spec.parameters.end(),
            [](const Parameter& a, const Parameter& b) { return a.name < b.name; });

  if (reader.has("fixed") && !(fields["fixed"].is_array() && fields["fixed"].empty())) {
    if (!fields["fixed"].is_object()) reader.fail("fixed", "'fixed' must be a table of key = value");
    for (const auto& [key, value] : fields["fixed"].items()) {
      if (!is_scalar(value) && !(value.is_array() && std::all_of(value.begin(), value.end(), is_scalar)))
        reader.fail("fixed", fmt::format("fixed value of '{}' must be a number, string, boolean or list, got {}", key,
                                         shown(value)));
      for (const Parameter& parameter : spec.parameters)
        if (parameter.name == key) reader.fail(key, fmt::format("'{}' is both a parameter and fixed", key));
      spec.fixed[key] = value;
      spec.lines["fixed." + key] = reader.where("fixed." + key);
    }
  }

  const std::string method = reader.text("method", "random");
  if (method == "grid")
    spec.method = Method::grid;
  else if (method == "random")
    spec.method = Method::random;
  else if (method == "tpe")
    spec.method = Method::tpe;
  else
    reader.fail("method", fmt::format("unknown method '{}' (known: grid, random, tpe)", method));

  if (spec.method == Method::grid) {
    std::int64_t size = 0;
    try {
      size = grid_size(spec);
    } catch (const SweepError& error) {
      reader.fail("method", error.what());
    }
    spec.trials = reader.whole("trials", 1, kMaxCount, size);
    if (spec.trials > size)
      reader.fail("trials", fmt::format("trials = {} is more than the grid's {} points", spec.trials, size));
  } else {
    if (!reader.has("trials"))
      reader.fail("trials", fmt::format("method '{}' needs trials = N (how many to run)", method));
    spec.trials = reader.whole("trials", 1, kMaxCount, 0);
  }

  if (!reader.has("metric"))
    reader.fail("metric", "the sweep names no metric (metric = \"loss\": a key the script logs)");
  spec.metric = reader.text("metric", "");
  const std::string mode = reader.text("mode", "min");
  if (mode != "min" && mode != "max")
    reader.fail("mode", fmt::format("mode must be \"min\" or \"max\", got '{}'", mode));
  spec.minimize = mode == "min";
  spec.seed = reader.whole("seed", 0, kMaxExact, 0);

  if (reader.has("prune") && !(fields["prune"].is_boolean() && !fields["prune"].get<bool>())) {
    const json& prune = fields["prune"];
    if (!prune.is_object() || prune.value("method", std::string()) != "asha")
      reader.fail("prune",
                  fmt::format("prune must be {{ \"asha\", min_steps = N, reduction = 3 }}, got {}", shown(prune)));
    for (const auto& [key, value] : prune.items())
      if (key != "method" && key != "min_steps" && key != "reduction" && key != "max_steps")
        reader.fail("prune", fmt::format("unknown prune option '{}' (known: min_steps, reduction, max_steps){}", key,
                                         core::did_you_mean(key, {"min_steps", "reduction", "max_steps"})));
    AshaOptions asha;
    if (!prune.contains("min_steps"))
      reader.fail("prune", "prune = { \"asha\" } needs min_steps (the first rung's step)");
    auto option = [&](const char* key, const json& value, std::int64_t minimum, std::int64_t maximum) {
      return reader.whole(value, "prune", fmt::format("prune's '{}'", key), minimum, maximum);
    };
    asha.min_steps = option("min_steps", prune["min_steps"], 1, kMaxExact);
    asha.reduction = static_cast<int>(option("reduction", prune.value("reduction", json(3)), 2, kMaxCount));
    if (prune.contains("max_steps")) asha.max_steps = option("max_steps", prune["max_steps"], 1, kMaxExact);
    spec.asha = asha;
  }

  if (reader.has("slots")) {
    const json& slots = fields["slots"];
    if (!(slots.is_string() && slots.get<std::string>() == "auto"))
      spec.slots = static_cast<int>(reader.whole(slots, "slots", "'slots' (a number or \"auto\")", 1, kMaxCount));
  }
  spec.gpus_per_trial = static_cast<int>(reader.whole("gpus_per_trial", 1, kMaxCount, 1));
  spec.max_failures = reader.whole("max_failures", 0, kMaxCount, 0);
  if (spec.max_failures == 0) spec.max_failures = spec.trials / 2 + 1;
  spec.retries = static_cast<int>(reader.whole("retries", 0, kMaxCount, 1));
  spec.takeover_after = static_cast<int>(reader.whole("takeover_after", kMinTakeoverAfter, kMaxTakeoverAfter, 60));
  return spec;
}

json sweep_json(const SweepSpec& spec) {
  json parameters = json::object();
  json lines = json::object();
  for (const auto& [field, where] : spec.lines) lines[field] = where;
  for (const Parameter& parameter : spec.parameters) {
    parameters[parameter.name] = parameter_json(parameter);
    lines[parameter.name] = parameter.where;
  }
  json fields = {{"name", spec.name},
                 {"script", spec.script},
                 {"parameters", parameters},
                 {"fixed", spec.fixed},
                 {"method", method_name(spec.method)},
                 {"trials", spec.trials},
                 {"metric", spec.metric},
                 {"mode", spec.minimize ? "min" : "max"},
                 {"seed", spec.seed},
                 {"slots", spec.slots == 0 ? json("auto") : json(spec.slots)},
                 {"gpus_per_trial", spec.gpus_per_trial},
                 {"max_failures", spec.max_failures},
                 {"retries", spec.retries},
                 {"takeover_after", spec.takeover_after}};
  if (spec.asha)
    fields["prune"] = {{"method", "asha"},
                       {"min_steps", spec.asha->min_steps},
                       {"reduction", spec.asha->reduction},
                       {"max_steps", spec.asha->max_steps}};
  return {
      {"fields", fields}, {"sweep_file", spec.sweep_file}, {"where", spec.where}, {"lines", lines}, {"resolved", true}};
}

std::int64_t grid_size(const SweepSpec& spec) {
  std::int64_t size = 1;
  for (const Parameter& parameter : spec.parameters) {
    std::int64_t count = 0;
    if (parameter.kind == ParameterKind::choice)
      count = static_cast<std::int64_t>(parameter.values.size());
    else if (parameter.kind == ParameterKind::integer && !parameter.log)
      count = static_cast<std::int64_t>((parameter.high - parameter.low) / parameter.step) + 1;
    else
      throw SweepError(
          fmt::format("method 'grid' needs lists of values (or runner.sweep.int ranges); parameter '{}' "
                      "is {}",
                      parameter.name, kind_name(parameter.kind)));
    if (size > (std::int64_t{1} << 40) / count) throw SweepError("the grid has more than 2^40 points");
    size *= count;
  }
  return size;
}

std::string override_text(const json& value) {
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number_integer()) return std::to_string(value.get<std::int64_t>());
  if (value.is_number()) return shortest(value.get<double>());
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::vector<std::string> items;
    for (const json& item : value) items.push_back(override_text(item));
    return fmt::format("{}", fmt::join(items, ","));
  }
  return value.dump();
}

std::vector<std::string> trial_overrides(const SweepSpec& spec, const json& params) {
  std::map<std::string, std::string> values;
  for (const auto& [key, value] : spec.fixed.items()) values[key] = override_text(value);
  for (const auto& [key, value] : params.items()) values[key] = override_text(value);
  std::vector<std::string> overrides;
  for (const auto& [key, text] : values) overrides.push_back(key + "=" + text);
  return overrides;
}

ScriptConfig parse_script_config(const json& printed) {
  ScriptConfig config;
  for (const auto& [key, entry] : printed.at("keys").items())
    config[key] = ConfigKey{entry.at("default"), entry.value("integer", false)};
  return config;
}

void check_against_config(SweepSpec& spec, const ScriptConfig& config) {
  std::vector<std::string> known;
  for (const auto& [key, entry] : config) known.push_back(key);
  const std::string script = spec.script.substr(spec.script.rfind('/') + 1);
  auto unknown = [&](const std::string& where, const std::string& what, const std::string& key) {
    return SweepError(fmt::format("{}: {} '{}' is not a config key of {} (its keys: {}){}", where, what, key, script,
                                  fmt::join(known, ", "), core::did_you_mean(key, known)));
  };
  auto check_value = [&](const std::string& where, const std::string& key, const ConfigKey& entry, const json& value) {
    if (!same_type(entry.default_value, value))
      throw SweepError(fmt::format("{}: '{}' takes {} (its default is {}), got {}", where, key,
                                   json_type(entry.default_value), shown(entry.default_value), shown(value)));
    if (entry.integer && !whole(value))
      throw SweepError(fmt::format("{}: '{}' takes whole numbers, got {}", where, key, shown(value)));
  };
  for (const auto& [key, value] : spec.fixed.items()) {
    const auto found = config.find(key);
    if (found == config.end()) throw unknown(where_of(spec, "fixed." + key), "fixed key", key);
    check_value(where_of(spec, "fixed." + key), key, found->second, value);
  }
  for (const Parameter& parameter : spec.parameters) {
    const auto found = config.find(parameter.name);
    if (found == config.end()) throw unknown(parameter.where, "parameter", parameter.name);
    const ConfigKey& entry = found->second;
    if (parameter.kind == ParameterKind::choice) {
      for (const json& value : parameter.values) check_value(parameter.where, parameter.name, entry, value);
    } else if (!entry.default_value.is_number()) {
      throw SweepError(
          fmt::format("{}: '{}' takes {} (its default is {}): a numeric range does not fit it; give a list "
                      "of values",
                      parameter.where, parameter.name, json_type(entry.default_value), shown(entry.default_value)));
    } else if (entry.integer && parameter.kind != ParameterKind::integer) {
      throw SweepError(fmt::format("{}: '{}' takes whole numbers: use runner.sweep.int({}, {}) instead of {}",
                                   parameter.where, parameter.name, shortest(std::ceil(parameter.low)),
                                   shortest(std::floor(parameter.high)), kind_name(parameter.kind)));
    }
  }
  if (spec.asha) {
    AshaOptions& asha = *spec.asha;
    if (asha.max_steps == 0) {
      if (std::any_of(spec.parameters.begin(), spec.parameters.end(),
                      [](const Parameter& p) { return p.name == "steps"; }))
        throw SweepError(fmt::format("{}: prune needs max_steps when 'steps' is a parameter", spec.where));
      if (spec.fixed.contains("steps") && whole(spec.fixed["steps"]))
        asha.max_steps = spec.fixed["steps"].get<std::int64_t>();
      else if (config.count("steps") && whole(config.at("steps").default_value))
        asha.max_steps = config.at("steps").default_value.get<std::int64_t>();
      else
        throw SweepError(
            fmt::format("{}: prune needs max_steps (the trials' length in steps): {} has no 'steps' config "
                        "key",
                        spec.where, script));
    }
    if (asha.min_steps >= asha.max_steps)
      throw SweepError(fmt::format("{}: prune's min_steps ({}) must be below the trials' length ({} steps)", spec.where,
                                   asha.min_steps, asha.max_steps));
  }
}

}  // namespace runner::sweep
