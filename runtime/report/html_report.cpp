// The self-contained HTML report of one or more runs: run table, metric charts, config diff, latest samples.
#include "runtime/report/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>

#include "runtime/core/atomic_file.h"
#include "runtime/core/json_text.h"
#include "runtime/core/duration_text.h"
#include "runtime/core/number_text.h"

namespace runner::report {

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string encoded;
  encoded.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    encoded += kAlphabet[group >> 18 & 63];
    encoded += kAlphabet[group >> 12 & 63];
    encoded += kAlphabet[group >> 6 & 63];
    encoded += kAlphabet[group & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) group |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    encoded += kAlphabet[group >> 18 & 63];
    encoded += kAlphabet[group >> 12 & 63];
    encoded += rest == 2 ? kAlphabet[group >> 6 & 63] : '=';
    encoded += '=';
  }
  return encoded;
}

const std::string& run_colour(std::size_t run_index) {
  static const std::array<std::string, 10> kTab10 = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                     "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kTab10[run_index % kTab10.size()];
}

std::size_t run_colour_slot(std::int64_t run_number) {
  return run_number > 0 ? static_cast<std::size_t>(run_number - 1) : 0;
}

std::vector<MetricSection> metric_sections(const std::vector<std::string>& ordered_keys) {
  std::vector<MetricSection> sections;
  for (const std::string& key : ordered_keys) {
    const std::size_t slash = key.find('/');
    const std::string prefix = slash == std::string::npos ? "" : key.substr(0, slash + 1);
    if (sections.empty() || sections.back().prefix != prefix) sections.push_back({prefix, {}});
    sections.back().keys.push_back(key);
  }
  return sections;
}

std::vector<std::string> ordered_metric_keys(std::set<std::string> keys) {
  std::vector<std::string> ordered, unprefixed, timings, system;
  if (keys.erase("loss")) ordered.push_back("loss");
  for (const std::string& key : keys)
    (key.starts_with("time/")             ? timings
     : key.starts_with("sys/")            ? system
     : key.find('/') == std::string::npos ? unprefixed
                                          : ordered)
        .push_back(key);
  ordered.insert(ordered.end(), unprefixed.begin(), unprefixed.end());
  ordered.insert(ordered.end(), timings.begin(), timings.end());
  ordered.insert(ordered.end(), system.begin(), system.end());
  return ordered;
}

std::vector<std::string> metric_keys(const std::vector<ReportRun>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs) {
    for (const auto& [key, points] : run.metrics) keys.insert(key);
  }
  return ordered_metric_keys(std::move(keys));
}

namespace {

constexpr const char* kStyle = R"css(
* { box-sizing: border-box; }
body { margin: 0; padding: 14px 24px 40px; color: #222; background: #fff;
       font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 20px; margin: 0 0 2px; }
h2 { font-size: 15px; margin: 18px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #e3e3e3; }
h3 { font-size: 13px; margin: 12px 0 6px; }
.meta, .note { color: #666; margin: 0 0 8px; }
.table-wrap { overflow: auto; border: 1px solid #e3e3e3; border-radius: 4px; }
.runs .table-wrap { max-height: 260px; }
table { border-collapse: collapse; min-width: 100%; }
th, td { padding: 4px 10px; text-align: left; border-bottom: 1px solid #eee; white-space: nowrap; }
thead th { position: sticky; top: 0; background: #f5f5f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.id, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
td.config-value { white-space: pre-wrap; max-width: 420px; overflow-wrap: anywhere; }
td.missing { color: #aaa; }
tr.differs > * { background: #fff4cc; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; vertical-align: -1px; }
.status { padding: 1px 7px; border-radius: 9px; font-size: 11px; font-weight: 600; }
.status-finished { background: #e2f3df; color: #1e6b1a; }
.status-running { background: #e0ecf8; color: #1b4f8a; }
.status-failed { background: #fbe2e2; color: #9b1c1c; }
.status-interrupted { background: #fcefd9; color: #8a5300; }
.status-paused { background: #ece4f7; color: #5b2c8f; }
.status-pruned { background: #eee; color: #666; }
.status-other { background: #eee; color: #444; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; }
figure.chart { padding: 6px; border: 1px solid #e3e3e3; border-radius: 4px; }
svg.chart { display: block; max-width: 100%; height: auto; }
.samples { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
.samples img { display: block; max-width: 100%; height: auto; image-rendering: pixelated; border: 1px solid #ddd; }
.samples .earlier { display: flex; flex-wrap: wrap; gap: 10px; margin-top: 6px; }
details summary { cursor: pointer; color: #555; font-size: 12px; margin-top: 6px; }
.tag { display: inline-block; margin-right: 4px; padding: 0 6px; border-radius: 8px; background: #e8eef7; color: #1b4f8a; font-size: 12px; }
.note { white-space: pre-wrap; }
.run-error { margin-top: 10px; }
.run-error pre { white-space: pre-wrap; background: #fdf3f3; border: 1px solid #f0caca; padding: 8px; font-size: 12px; }
figcaption { color: #555; font-size: 12px; margin-top: 3px; }
)css";

// Line styles for runs beyond the palette's ten colours.
const std::string& run_dash_pattern(std::size_t run_index) {
  static const std::array<std::string, 3> kPatterns = {"", "7 4", "2 3"};
  return kPatterns[run_index / 10 % kPatterns.size()];
}

// The name a run goes by in legends and headings: its name (its id when unnamed), with the id added when
// several runs share a name.
std::vector<std::string> run_labels(const std::vector<ReportRun>& runs) {
  std::map<std::string, int> name_counts;
  for (const auto& run : runs) ++name_counts[run.name];
  std::vector<std::string> labels;
  for (const auto& run : runs) {
    if (run.name.empty()) {
      labels.push_back(run.id);
    } else if (name_counts[run.name] > 1) {
      labels.push_back(fmt::format("{} ({})", run.name, run.id));
    } else {
      labels.push_back(run.name);
    }
  }
  return labels;
}

std::size_t colour_slot(const std::vector<ReportRun>& runs, std::size_t position) {
  return runs[position].colour_slot.value_or(position);
}

std::string swatch(std::size_t slot) {
  return fmt::format("<span class=\"swatch\" style=\"background:{}\"></span>", run_colour(slot));
}

std::string status_badge(const std::string& status) {
  static const std::set<std::string> kColoured = {"running", "finished", "failed", "interrupted", "paused", "pruned"};
  const std::string css_class = kColoured.contains(status) ? status : "other";
  return fmt::format("<span class=\"status status-{}\">{}</span>", css_class, escape_html(status));
}

// Summary values: floats to six significant digits; everything else as written.
std::string format_summary_value(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return fmt::format("{:.6g}", value.get<double>());
  return core::json_text(value);
}

// Config values: strings bare, everything else as JSON (exact numbers, arrays).
std::string format_config_value(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  return core::json_text(value);
}

const nlohmann::json* find_key(const nlohmann::json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(key);
  return found == object.end() ? nullptr : &*found;
}

std::set<std::string> object_keys(const std::vector<ReportRun>& runs, nlohmann::json ReportRun::*member) {
  std::set<std::string> keys;
  for (const auto& run : runs) {
    const nlohmann::json& object = run.*member;
    if (!object.is_object()) continue;
    for (const auto& [key, value] : object.items()) keys.insert(key);
  }
  return keys;
}

std::string read_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw std::runtime_error(fmt::format("{}: cannot read image: {}", path, std::strerror(errno)));
  std::string bytes{std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
  if (stream.bad()) throw std::runtime_error(fmt::format("{}: cannot read image: {}", path, std::strerror(errno)));
  return bytes;
}

struct PngSize {
  uint32_t width = 0, height = 0;
};

// The size from the IHDR chunk, which must come first.
PngSize png_size(const std::string& bytes, const std::string& path) {
  static constexpr std::string_view kSignature = "\x89PNG\r\n\x1a\n";
  if (bytes.size() < 24 || std::string_view(bytes).substr(0, 8) != kSignature ||
      std::string_view(bytes).substr(12, 4) != "IHDR") {
    throw std::runtime_error(fmt::format("{}: not a PNG file", path));
  }
  auto big_endian = [&](std::size_t offset) {
    uint32_t value = 0;
    for (std::size_t i = 0; i < 4; ++i) value = value << 8 | static_cast<unsigned char>(bytes[offset + i]);
    return value;
  };
  return {big_endian(16), big_endian(20)};
}

void append_run_table(std::string& html, const std::vector<ReportRun>& runs, const std::vector<std::string>& labels) {
  const std::set<std::string> summary_keys = object_keys(runs, &ReportRun::summary);
  const bool tags = std::any_of(runs.begin(), runs.end(), [](const ReportRun& run) { return !run.tags.empty(); });
  const bool notes = std::any_of(runs.begin(), runs.end(), [](const ReportRun& run) { return run.note.has_value(); });
  auto out = std::back_inserter(html);
  html +=
      "<section class=\"runs\">\n<div class=\"table-wrap\"><table>\n<thead><tr><th>id</th><th>name</th>"
      "<th>status</th><th>started</th><th>duration</th><th>steps</th>";
  if (tags) html += "<th>tags</th>";
  for (const auto& key : summary_keys) fmt::format_to(out, "<th>{}</th>", escape_html(key));
  if (notes) html += "<th>note</th>";
  html += "</tr></thead>\n<tbody>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const ReportRun& run = runs[r];
    fmt::format_to(out,
                   "<tr><td class=\"id\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td>"
                   "<td class=\"num\">{}</td>",
                   swatch(colour_slot(runs, r)), escape_html(run.id), escape_html(labels[r]), status_badge(run.status),
                   escape_html(run.started), core::duration_text(run.duration_seconds), run.step);
    if (tags) {
      html += "<td>";
      for (const std::string& tag : run.tags) fmt::format_to(out, "<span class=\"tag\">{}</span>", escape_html(tag));
      html += "</td>";
    }
    for (const auto& key : summary_keys) {
      const nlohmann::json* value = find_key(run.summary, key);
      if (value == nullptr || value->is_null()) {
        html += "<td class=\"missing\">-</td>";
      } else {
        fmt::format_to(out, "<td{}>{}</td>", value->is_number() ? " class=\"num\"" : "",
                       escape_html(format_summary_value(*value)));
      }
    }
    if (notes) fmt::format_to(out, "<td class=\"note\">{}</td>", run.note ? escape_html(*run.note) : "-");
    html += "</tr>\n";
  }
  html += "</tbody></table></div>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (!runs[r].error) continue;
    fmt::format_to(out,
                   "<div class=\"run-error\"><h3>{}{} <span class=\"meta mono\">{}</span> {}</h3><pre>{}</pre></div>\n",
                   swatch(colour_slot(runs, r)), escape_html(labels[r]), escape_html(runs[r].id),
                   status_badge(runs[r].status), escape_html(*runs[r].error));
  }
  html += "</section>\n";
}

void append_charts(std::string& html, const std::vector<ReportRun>& runs, const ReportOptions& options) {
  html += "<section class=\"metrics\">\n<h2>Metrics</h2>\n";
  const std::vector<std::string> keys = metric_keys(runs);
  if (keys.empty()) html += "<p class=\"note\">No metrics were logged.</p>\n";
  const std::vector<MetricSection> sections = metric_sections(keys);
  for (std::size_t s = 0; s < sections.size(); ++s) {
    // A heading per prefix; keys without one that follow a prefix's charts are headed too, so none looks like its.
    if (!sections[s].prefix.empty() || s > 0)
      fmt::format_to(std::back_inserter(html), "<h3 class=\"metric-prefix\">{}</h3>\n",
                     sections[s].prefix.empty() ? "other metrics" : escape_html(sections[s].prefix));
    html += "<div class=\"charts\">\n";
    for (const auto& key : sections[s].keys) {
      ChartOptions chart;
      chart.max_points_per_series = options.max_points_per_series;
      chart.x_axis = options.x_axis;
      html += "<figure class=\"chart\">\n";
      html += render_metric_chart(runs, key, chart, options.groups);
      html += "</figure>\n";
    }
    html += "</div>\n";
  }
  html += "</section>\n";
}

void append_config_table(std::string& html, const std::vector<ReportRun>& runs,
                         const std::vector<std::string>& labels) {
  const std::set<std::string> keys = object_keys(runs, &ReportRun::config);
  auto out = std::back_inserter(html);
  html += "<section class=\"config\">\n<h2>Config</h2>\n";
  if (keys.empty()) {
    html += "<p class=\"note\">No config values were recorded.</p>\n</section>\n";
    return;
  }
  std::string rows;
  int differing = 0;
  for (const auto& key : keys) {
    std::vector<const nlohmann::json*> values;
    for (const auto& run : runs) values.push_back(find_key(run.config, key));
    bool differs = false;
    for (const nlohmann::json* value : values) {
      const bool same = (value == nullptr && values[0] == nullptr) ||
                        (value != nullptr && values[0] != nullptr && *value == *values[0]);
      differs = differs || !same;
    }
    differing += differs;
    fmt::format_to(std::back_inserter(rows), "<tr{}><th class=\"mono\">{}</th>", differs ? " class=\"differs\"" : "",
                   escape_html(key));
    for (const nlohmann::json* value : values) {
      if (value == nullptr) {
        rows += "<td class=\"missing\">-</td>";
      } else {
        fmt::format_to(std::back_inserter(rows), "<td class=\"config-value\">{}</td>",
                       escape_html(format_config_value(*value)));
      }
    }
    rows += "</tr>\n";
  }
  if (runs.size() > 1) {
    fmt::format_to(out, "<p class=\"note\">{} of {} keys differ between runs (highlighted).</p>\n", differing,
                   keys.size());
  }
  html += "<div class=\"table-wrap\"><table>\n<thead><tr><th>key</th>";
  for (std::size_t r = 0; r < runs.size(); ++r)
    fmt::format_to(out, "<th>{}{}</th>", swatch(colour_slot(runs, r)), escape_html(labels[r]));
  html += "</tr></thead>\n<tbody>\n";
  html += rows;
  html += "</tbody></table></div>\n</section>\n";
}

// One grid as an <img> enlarged by a whole factor towards `target` pixels wide; pixelated rendering keeps it sharp.
void append_grid(std::string& html, const ReportImage& image, uint32_t target) {
  const std::string bytes = read_file(image.png_path);
  const PngSize size = png_size(bytes, image.png_path);
  const uint32_t factor = size.width > 0 && size.width < target ? target / size.width : 1;
  const std::string caption = fmt::format("{} \u00b7 step {}", image.name, image.step);
  fmt::format_to(std::back_inserter(html),
                 "<figure><img src=\"data:image/png;base64,{}\" width=\"{}\" height=\"{}\" alt=\"{}\">"
                 "<figcaption>{}</figcaption></figure>\n",
                 base64_encode(bytes), uint64_t{size.width} * factor, uint64_t{size.height} * factor,
                 escape_html(caption), escape_html(caption));
}

// Per run and image name: the latest grid large, then the earlier ones (at most kEarlierGrids, latest first)
// in a collapsed list.
void append_samples(std::string& html, const std::vector<ReportRun>& runs, const std::vector<std::string>& labels) {
  constexpr std::size_t kEarlierGrids = 24;
  bool any = false;
  for (const auto& run : runs) any = any || !run.images.empty();
  if (!any) return;
  auto out = std::back_inserter(html);
  html += "<section class=\"images\">\n<h2>Samples</h2>\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].images.empty()) continue;
    std::map<std::string, std::vector<const ReportImage*>> by_name;
    for (const ReportImage& image : runs[r].images) by_name[image.name].push_back(&image);
    fmt::format_to(out, "<h3>{}{} <span class=\"meta mono\">{}</span></h3>\n<div class=\"samples\">\n",
                   swatch(colour_slot(runs, r)), escape_html(labels[r]), escape_html(runs[r].id));
    for (auto& [name, images] : by_name) {
      std::stable_sort(images.begin(), images.end(),
                       [](const ReportImage* a, const ReportImage* b) { return a->step > b->step; });
      html += "<div class=\"grid-history\">\n";
      append_grid(html, *images.front(), 512);
      if (images.size() > 1) {
        const std::size_t shown = std::min(images.size() - 1, kEarlierGrids);
        fmt::format_to(out, "<details><summary>{} earlier {} grid{}{}</summary><div class=\"earlier\">\n",
                       images.size() - 1, escape_html(name), images.size() == 2 ? "" : "s",
                       shown < images.size() - 1 ? fmt::format(" (the latest {} shown)", shown) : "");
        for (std::size_t i = 1; i <= shown; ++i) append_grid(html, *images[i], 256);
        html += "</div></details>\n";
      }
      html += "</div>\n";
    }
    html += "</div>\n";
  }
  html += "</section>\n";
}

}  // namespace

std::string render_html_report(const std::vector<ReportRun>& runs, const ReportOptions& options) {
  const std::vector<std::string> labels = run_labels(runs);
  std::string html;
  auto out = std::back_inserter(html);
  fmt::format_to(out,
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                 "<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n",
                 escape_html(options.title), kStyle);
  fmt::format_to(out, "<header>\n<h1>{}</h1>\n<p class=\"meta\">{} run{}{}</p>\n</header>\n",
                 escape_html(options.title), runs.size(), runs.size() == 1 ? "" : "s",
                 options.generated_at.empty() ? "" : " \u00b7 generated " + escape_html(options.generated_at));
  append_run_table(html, runs, labels);
  append_charts(html, runs, options);
  append_config_table(html, runs, labels);
  append_samples(html, runs, labels);
  html += "</body>\n</html>\n";
  return html;
}

const char* report_style() { return kStyle; }

namespace {

// A run's floor of metric `key`: its summary's `KEY_floor`, else the latest finite value it logged under that name.
std::optional<double> metric_floor(const ReportRun& run, const std::string& key) {
  const std::string name = key + "_floor";
  if (const nlohmann::json* value = find_key(run.summary, name); value != nullptr && value->is_number())
    return value->get<double>();
  const auto found = run.metrics.find(name);
  if (found == run.metrics.end()) return std::nullopt;
  for (auto it = found->second.rbegin(); it != found->second.rend(); ++it)
    if (std::isfinite(it->second)) return it->second;
  return std::nullopt;
}

// A group's series: at each x any of its runs has, the mean of their finite values, the band their lowest and highest.
ChartSeries group_series(const std::vector<ReportRun>& runs, const CurveGroup& group, const std::string& key,
                         std::string colour, std::string dash_pattern) {
  struct Spread {
    double sum = 0, low = 0, high = 0;
    std::size_t count = 0;
  };
  std::map<double, Spread> at;
  for (std::size_t r : group.runs) {
    const auto found = runs[r].metrics.find(key);
    if (found == runs[r].metrics.end()) continue;
    for (const auto& [x, value] : found->second) {
      if (!std::isfinite(value)) continue;
      Spread& spread = at[x];
      spread.low = spread.count ? std::min(spread.low, value) : value;
      spread.high = spread.count ? std::max(spread.high, value) : value;
      spread.sum += value;
      ++spread.count;
    }
  }
  ChartSeries series{fmt::format("{} ({} run{})", group.label, group.runs.size(), group.runs.size() == 1 ? "" : "s"),
                     std::move(colour),
                     std::move(dash_pattern),
                     {},
                     {},
                     {}};
  for (const auto& [x, spread] : at) {
    series.points.emplace_back(x, spread.sum / static_cast<double>(spread.count));
    series.band_low.emplace_back(x, spread.low);
    series.band_high.emplace_back(x, spread.high);
  }
  return series;
}

}  // namespace

std::string render_metric_chart(const std::vector<ReportRun>& runs, const std::string& key, ChartOptions options,
                                const std::vector<CurveGroup>& groups) {
  const std::vector<std::string> labels = run_labels(runs);
  std::vector<ChartSeries> series;
  if (groups.empty()) {
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const auto found = runs[r].metrics.find(key);
      if (found == runs[r].metrics.end() || found->second.empty()) continue;
      const std::size_t slot = colour_slot(runs, r);
      series.push_back({labels[r], run_colour(slot), run_dash_pattern(slot), found->second, {}, {}});
    }
  } else {
    for (const CurveGroup& group : groups) {
      if (group.runs.empty()) continue;
      const std::size_t slot = colour_slot(runs, group.runs.front());
      ChartSeries one = group_series(runs, group, key, run_colour(slot), run_dash_pattern(slot));
      if (!one.points.empty()) series.push_back(std::move(one));
    }
    options.legend_note = "each group: the mean of its runs, over a band from their lowest to their highest value";
  }
  std::set<double> floors;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const std::optional<double> floor = metric_floor(runs[r], key);
    if (!floor || !floors.insert(*floor).second || runs[r].metrics.find(key) == runs[r].metrics.end()) continue;
    options.reference_lines.push_back(
        {*floor, fmt::format("{}_floor {}", key, core::number_text(*floor)), run_colour(colour_slot(runs, r))});
  }
  options.title = key;
  return render_line_chart(series, options);
}

void write_html_report(const std::string& path, const std::vector<ReportRun>& runs, const ReportOptions& options) {
  const std::string html = render_html_report(runs, options);
  core::AtomicFileWriter file(path);
  file.write(html.data(), html.size(), "the HTML report");
  file.commit();
}

}  // namespace runner::report
