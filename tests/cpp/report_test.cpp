// Tests of runtime/report: escaping, base64, embedded images, SVG charts (colours, gaps, scales, ticks).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "runtime/core/duration_text.h"
#include "runtime/image/png_writer.h"
#include "runtime/report/html_report.h"
#include "runtime/report/svg_chart.h"
#include "runtime/report/sweep_report.h"
#include "runtime/sweep/parameter_importance.h"
#include "tests/cpp/temp_directory.h"

using namespace runner::report;
namespace fs = std::filesystem;

namespace {

using runner::testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

// An independent decoder, so the encoder is checked against the RFC's definition rather than itself.
std::string base64_decode(const std::string& text) {
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  REQUIRE(text.size() % 4 == 0);
  std::string bytes;
  uint32_t bits = 0;
  int bit_count = 0;
  for (char c : text) {
    if (c == '=') break;
    const auto position = alphabet.find(c);
    REQUIRE(position != std::string::npos);
    bits = bits << 6 | static_cast<uint32_t>(position);
    bit_count += 6;
    if (bit_count >= 8) {
      bit_count -= 8;
      bytes += static_cast<char>(bits >> bit_count & 0xFF);
    }
  }
  return bytes;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t found = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++found;
  return found;
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

ReportRun make_run(const std::string& id, const std::string& name) {
  ReportRun run;
  run.id = id;
  run.name = name;
  run.status = "finished";
  run.started = "2026-11-22 14:03";
  run.duration_seconds = 192;
  run.step = 100;
  run.config = {{"lr", 0.001}, {"batch", 64}};
  run.summary = {{"final_loss", 0.0421}};
  for (int64_t step = 1; step <= 100; ++step) run.metrics["loss"].emplace_back(step, 1.0 / static_cast<double>(step));
  return run;
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("base64 matches the RFC 4648 test vectors and round-trips every byte", "[report]") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foob") == "Zm9vYg==");
  CHECK(base64_encode("fooba") == "Zm9vYmE=");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  for (std::size_t length : {254u, 255u, 256u}) {
    const std::string bytes = all_bytes.substr(0, length);
    CHECK(base64_decode(base64_encode(bytes)) == bytes);
  }
  CHECK(base64_encode("\xff\xfe\xfd") == "//79");
}

TEST_CASE("run names, config and summary entries are HTML-escaped", "[report]") {
  ReportRun run = make_run("k3f9a2b1", "<script>alert(\"x\")</script> & 'co'");
  run.config["<img src=x onerror=alert(1)>"] = "a<b & \"c\"";
  run.summary["<b>key</b>"] = "</td><script>";
  run.status = "<i>odd</i>";
  ReportOptions options;
  options.title = "report <&>";
  const std::string html = render_html_report({run}, options);
  CHECK(lowercase(html).find("<script") == std::string::npos);
  CHECK(html.find("<img src=x") == std::string::npos);
  CHECK(html.find("<b>key") == std::string::npos);
  CHECK(html.find("<i>odd") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;co&#39;") != std::string::npos);
  CHECK(html.find("&lt;img src=x onerror=alert(1)&gt;") != std::string::npos);
  CHECK(html.find("a&lt;b &amp; &quot;c&quot;") != std::string::npos);
  CHECK(html.find("<title>report &lt;&amp;&gt;</title>") != std::string::npos);
  CHECK(escape_html("a<b>&\"'") == "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST_CASE("the run table shows tags and notes, escaped, only when a run has them", "[report]") {
  ReportRun tagged = make_run("aaaa1111", "quickstart-3");
  tagged.tags = {"baseline", "cifar"};
  tagged.note = "lr <too> high";
  const ReportRun plain = make_run("bbbb2222", "quickstart-4");
  const std::string html = render_html_report({tagged, plain}, {});
  CHECK(html.find("<th>tags</th>") != std::string::npos);
  CHECK(html.find("<th>note</th>") != std::string::npos);
  CHECK(html.find("<td><span class=\"tag\">baseline</span><span class=\"tag\">cifar</span></td>") != std::string::npos);
  CHECK(html.find("<td class=\"note\">lr &lt;too&gt; high</td>") != std::string::npos);
  CHECK(html.find("<td class=\"note\">-</td>") != std::string::npos);
  const std::string untagged = render_html_report({plain}, {});
  CHECK(untagged.find("<th>tags</th>") == std::string::npos);
  CHECK(untagged.find("<th>note</th>") == std::string::npos);
}

TEST_CASE("the page is self-contained and has the run table, charts and config", "[report]") {
  ReportRun first = make_run("aaaa1111", "quickstart-3");
  ReportRun second = make_run("bbbb2222", "quickstart-4");
  second.config["lr"] = 0.002;
  second.status = "failed";
  second.duration_seconds = 7385;
  first.metrics["grad_norm"] = {{1, 0.5}, {2, 0.7}};
  second.metrics["eval/swd"] = {{50, 0.3}, {100, 0.2}};
  ReportOptions options;
  options.generated_at = "2026-11-22 15:00";
  const std::string html = render_html_report({first, second}, options);

  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("<meta charset=\"utf-8\">") != std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<link") == std::string::npos);
  // The only http:// is the SVG namespace, which is never fetched.
  CHECK(count(html, "http://") == count(html, "xmlns=\"http://www.w3.org/2000/svg\""));

  CHECK(html.find("3m 12s") != std::string::npos);
  CHECK(html.find("2h 03m") != std::string::npos);
  CHECK(html.find("final_loss") != std::string::npos);
  CHECK(html.find("0.0421") != std::string::npos);
  CHECK(html.find("status-failed") != std::string::npos);
  CHECK(html.find("generated 2026-11-22 15:00") != std::string::npos);

  // One chart per metric key, loss first, the others by name; charts come before the config table.
  CHECK(count(html, "<svg") == 3);
  const auto loss_chart = html.find("aria-label=\"loss\"");
  const auto swd_chart = html.find("aria-label=\"eval/swd\"");
  const auto grad_chart = html.find("aria-label=\"grad_norm\"");
  CHECK(html.find("<table") < loss_chart);
  CHECK(loss_chart < swd_chart);
  CHECK(swd_chart < grad_chart);
  CHECK(grad_chart < html.find("<h2>Config</h2>"));

  // Only lr differs between the two configs.
  CHECK(count(html, "<tr class=\"differs\">") == 1);
  CHECK(html.find("<tr class=\"differs\"><th class=\"mono\">lr</th>") != std::string::npos);
  CHECK(html.find("1 of 2 keys differ") != std::string::npos);
}

TEST_CASE("two runs give two polylines, the first in tab10's first colour, and a legend", "[report]") {
  const std::string html = render_html_report({make_run("aaaa1111", "alpha"), make_run("bbbb2222", "beta")}, {});
  CHECK(count(html, "<polyline") == 2);
  const auto first = html.find("<polyline");
  const auto second = html.find("<polyline", first + 1);
  const std::string first_line = html.substr(first, html.find('>', first) - first);
  const std::string second_line = html.substr(second, html.find('>', second) - second);
  CHECK(first_line.find("stroke=\"#1f77b4\"") != std::string::npos);
  CHECK(first_line.find("stroke-width=\"2\"") != std::string::npos);
  CHECK(second_line.find("stroke=\"#ff7f0e\"") != std::string::npos);
  CHECK(html.find("<g class=\"legend\">") != std::string::npos);
  CHECK(html.find(">alpha<title>alpha</title></text>") != std::string::npos);
  CHECK(html.find(">beta<title>beta</title></text>") != std::string::npos);
  CHECK(run_colour(0) == "#1f77b4");
  CHECK(run_colour(9) == "#17becf");
  CHECK(run_colour(10) == "#1f77b4");
}

TEST_CASE("non-finite values break the line and never reach the SVG", "[report]") {
  ChartSeries series{"run", "#1f77b4", "", {{0, 1.0}, {1, 2.0}, {2, kNaN}, {3, 3.0}, {4, kInf}, {5, 2.5}, {6, 1.5}}};
  const std::string svg = render_line_chart({series}, {});
  const std::string lower = lowercase(svg);
  CHECK(lower.find("nan") == std::string::npos);
  CHECK(lower.find("inf") == std::string::npos);
  // Steps 0-1 and 5-6 are lines; step 3, alone between gaps, is a dot.
  CHECK(count(svg, "<polyline") == 2);
  CHECK(count(svg, "<circle cx") == 1);
  CHECK(count(svg, "<circle class=\"marker\"") == 5);  // a sparse series: a marker at each finite value

  const std::string all_nan = render_line_chart({{"run", "#1f77b4", "", {{0, kNaN}, {1, kNaN}}}}, {});
  CHECK(lowercase(all_nan).find("nan") == std::string::npos);
  CHECK(all_nan.find("no finite values") != std::string::npos);
}

TEST_CASE("a single point is a dot and a constant series gets a usable axis", "[report]") {
  const std::string dot = render_line_chart({{"run", "#1f77b4", "", {{7, 0.5}}}}, {});
  CHECK(count(dot, "<polyline") == 0);
  CHECK(count(dot, "<circle cx") == 1);
  CHECK(dot.find("fill=\"#1f77b4\"") != std::string::npos);

  const std::string flat = render_line_chart({{"run", "#1f77b4", "", {{0, 2.0}, {10, 2.0}, {20, 2.0}}}}, {});
  CHECK(lowercase(flat).find("nan") == std::string::npos);
  CHECK(lowercase(flat).find("inf") == std::string::npos);
  CHECK(count(flat, "<polyline") == 1);
  const std::string zero = render_line_chart({{"run", "#1f77b4", "", {{0, 0.0}, {10, 0.0}}}}, {});
  CHECK(lowercase(zero).find("nan") == std::string::npos);
  CHECK(count(zero, "<polyline") == 1);
}

TEST_CASE("log scale is chosen when all values are positive and span more than a factor 100", "[report]") {
  const ChartSeries wide{"a", "#1f77b4", "", {{0, 1000.0}, {1, 10.0}, {2, 0.5}}};
  const ChartSeries narrow{"b", "#ff7f0e", "", {{0, 40.0}, {1, 0.5}}};
  const ChartSeries with_zero{"c", "#2ca02c", "", {{0, 1000.0}, {1, 0.0}}};
  const ChartSeries negative{"d", "#2ca02c", "", {{0, 1000.0}, {1, -0.001}}};
  CHECK(wants_log_scale({wide}));
  CHECK(wants_log_scale({narrow, wide}));
  CHECK_FALSE(wants_log_scale({narrow}));
  CHECK_FALSE(wants_log_scale({with_zero}));
  CHECK_FALSE(wants_log_scale({wide, negative}));
  CHECK(wants_log_scale({{"e", "#000", "", {{0, 1000.0}, {1, kNaN}, {2, 1.0}}}}));  // NaN is ignored

  const std::string log_chart = render_line_chart({wide}, {});
  CHECK(log_chart.find(">log</text>") != std::string::npos);
  for (const char* decade : {">0.1</text>", ">1</text>", ">10</text>", ">100</text>", ">1000</text>"}) {
    CHECK(log_chart.find(decade) != std::string::npos);
  }
  CHECK(render_line_chart({narrow}, {}).find(">log</text>") == std::string::npos);
}

TEST_CASE("ticks are multiples of 1, 2 or 5 times a power of ten covering the range", "[report]") {
  const AxisTicks unit = nice_ticks(0, 1);
  CHECK(unit.step == 0.2);
  CHECK(unit.values == std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0});
  CHECK(nice_ticks(0, 7.3).values == std::vector<double>{0, 2, 4, 6, 8});
  CHECK(nice_ticks(-3, 17).values == std::vector<double>{-5, 0, 5, 10, 15, 20});
  CHECK(nice_ticks(0.0013, 0.0041).values == std::vector<double>{0.001, 0.002, 0.003, 0.004, 0.005});
  CHECK(nice_ticks(0, 600, 6).values == std::vector<double>{0, 100, 200, 300, 400, 500, 600});
  CHECK_THROWS(nice_ticks(1, 1));

  // The 0..1 ticks as the y axis labels them.
  const std::string svg = render_line_chart({{"run", "#1f77b4", "", {{0, 0.0}, {100, 1.0}}}}, {});
  for (const char* label : {">0</text>", ">0.2</text>", ">0.4</text>", ">0.6</text>", ">0.8</text>", ">1.0</text>"}) {
    CHECK(svg.find(label) != std::string::npos);
  }
}

TEST_CASE("long series are downsampled keeping spikes, gaps and both ends", "[report]") {
  SeriesPoints points;
  for (int64_t step = 0; step < 10000; ++step) points.emplace_back(step, std::sin(static_cast<double>(step) * 0.01));
  points[4321].second = 50.0;
  points[7000].second = kNaN;
  const SeriesPoints kept = downsample_min_max(points, 2000);
  CHECK(kept.size() <= 2000);
  CHECK(kept.size() > 1000);
  CHECK(kept.front() == points.front());
  CHECK(kept.back() == points.back());
  CHECK(std::is_sorted(kept.begin(), kept.end(), [](auto& a, auto& b) { return a.first < b.first; }));
  CHECK(std::find(kept.begin(), kept.end(), points[4321]) != kept.end());
  CHECK(std::count_if(kept.begin(), kept.end(), [](auto& p) { return p.first == 7000 && std::isnan(p.second); }) == 1);
  CHECK(downsample_min_max(SeriesPoints(points.begin(), points.begin() + 500), 2000).size() == 500);

  const std::string svg = render_line_chart({{"run", "#1f77b4", "", points}}, {});
  CHECK(count(svg, "<polyline") == 2);  // split at the NaN
  std::size_t drawn_points = 0;
  for (auto at = svg.find(" points=\""); at != std::string::npos; at = svg.find(" points=\"", at + 1)) {
    const auto end = svg.find('"', at + 9);
    drawn_points += count(svg.substr(at, end - at), ",");
  }
  CHECK(drawn_points == kept.size() - 1);  // the NaN is a break, not a point
}

TEST_CASE("images are embedded as data URIs that decode to the file's bytes", "[report]") {
  TempDir dir("runner-report-test");
  const std::string png = dir.file("samples.png");
  runner::image::write_png(png, (at::arange(10 * 12 * 3) % 251).to(at::kByte).reshape({10, 12, 3}));
  ReportRun run = make_run("aaaa1111", "alpha");
  run.images.push_back({"samples", 1200, png});
  const std::string html = render_html_report({run}, {});

  const std::string prefix = "<img src=\"data:image/png;base64,";
  const auto start = html.find(prefix);
  REQUIRE(start != std::string::npos);
  const auto data_start = start + prefix.size();
  const auto data_end = html.find('"', data_start);
  CHECK(base64_decode(html.substr(data_start, data_end - data_start)) == read_bytes(png));
  // A 12x10 image is enlarged by a whole factor (512 / 12 = 42).
  CHECK(html.substr(data_end, 32).rfind("\" width=\"504\" height=\"420\"", 0) == 0);
  CHECK(html.find("<figcaption>samples \u00b7 step 1200</figcaption>") != std::string::npos);
  CHECK(html.find("<h2>Samples</h2>") != std::string::npos);
  CHECK(html.find("<details>") == std::string::npos);
}

TEST_CASE("grids show the latest first, large, and the earlier ones below; a failed run shows its error", "[report]") {
  TempDir dir("runner-report-test");
  ReportRun run = make_run("aaaa1111", "alpha");
  run.status = "failed";
  run.error = "train.lua:7: <boom>\nstack traceback:";
  for (int step : {100, 300, 200}) {
    const std::string png = dir.file(fmt::format("samples-{}.png", step));
    runner::image::write_png(png, at::full({146, 146, 3}, step / 100, at::kByte));
    run.images.push_back({"samples", step, png});
  }
  const std::string html = render_html_report({run}, {});
  const auto at = [&](const std::string& text) { return html.find(text); };
  REQUIRE(at("samples \u00b7 step 300</figcaption>") != std::string::npos);
  CHECK(at("samples \u00b7 step 300</figcaption>") < at("<details><summary>2 earlier samples grids</summary>"));
  CHECK(at("<details><summary>2 earlier samples grids</summary>") < at("samples \u00b7 step 200</figcaption>"));
  CHECK(at("samples \u00b7 step 200</figcaption>") < at("samples \u00b7 step 100</figcaption>"));
  // 146 px grids: the latest 3x (438 px), the earlier ones 1x.
  CHECK(at("width=\"438\" height=\"438\" alt=\"samples \u00b7 step 300\"") != std::string::npos);
  CHECK(at("width=\"146\" height=\"146\" alt=\"samples \u00b7 step 200\"") != std::string::npos);
  CHECK(at("<pre>train.lua:7: &lt;boom&gt;\nstack traceback:</pre>") != std::string::npos);
}

TEST_CASE("an unreadable or non-PNG image throws naming its path, and no report is written", "[report]") {
  TempDir dir("runner-report-test");
  const std::string missing = dir.file("missing.png");
  const std::string report = dir.file("report.html");
  ReportRun run = make_run("aaaa1111", "alpha");
  run.images.push_back({"samples", 10, missing});
  REQUIRE_THROWS_WITH(write_html_report(report, {run}, {}), Catch::StartsWith(missing + ": cannot read image"));
  CHECK_FALSE(fs::exists(report));

  const std::string text = dir.file("text.png");
  std::ofstream(text) << "not an image at all, but long enough";
  run.images[0].png_path = text;
  REQUIRE_THROWS_WITH(render_html_report({run}, {}), text + ": not a PNG file");

  run.images.clear();
  write_html_report(report, {run}, {});
  CHECK(read_bytes(report) == render_html_report({run}, {}));
}

TEST_CASE(
    "metric keys put loss first, runner's timings and then its system metrics last, durations read as hours, minutes "
    "and seconds",
    "[report]") {
  ReportRun a, b;
  a.metrics["lr"] = {{0, 1.0}};
  a.metrics["loss"] = {{0, 1.0}};
  a.metrics["time/forward_backward_ms"] = {{0, 1.0}};
  a.metrics["sys/cpu_percent"] = {{0, 1.0}};
  b.metrics["sys/rss_mib"] = {{0, 1.0}};
  b.metrics["eval/swd"] = {{0, 1.0}};
  b.metrics["grad_norm"] = {{0, 1.0}};
  b.metrics["val_loss"] = {{0, 1.0}};
  b.metrics["time/batch_wait_ms"] = {{0, 1.0}};
  CHECK(metric_keys({a, b}) == std::vector<std::string>{"loss", "eval/swd", "grad_norm", "lr", "val_loss",
                                                        "time/batch_wait_ms", "time/forward_backward_ms",
                                                        "sys/cpu_percent", "sys/rss_mib"});
  CHECK(metric_keys({b}) ==
        std::vector<std::string>{"eval/swd", "grad_norm", "val_loss", "time/batch_wait_ms", "sys/rss_mib"});
  // The report writes durations as everything else does (runner::core::duration_text).
  CHECK(runner::core::duration_text(0) == "0s");
  CHECK(runner::core::duration_text(45.4) == "45s");
  CHECK(runner::core::duration_text(192) == "3m 12s");
  CHECK(runner::core::duration_text(62) == "1m 02s");
  CHECK(runner::core::duration_text(7385) == "2h 03m");
  CHECK(runner::core::duration_text(3 * 86400 + 4 * 3600 + 59) == "3d 4h");
  CHECK(runner::core::duration_text(-2) == "0s");
  CHECK(runner::core::duration_text(kNaN) == "-");
  CHECK(runner::core::duration_text(INFINITY) == "-");
}

TEST_CASE("smoothing is the debiased moving average of TensorBoard and skips non-finite values", "[report]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const SeriesPoints smoothed_points = smoothed({{1, 1.0}, {2, 3.0}, {3, nan}, {4, 5.0}}, 0.5);
  REQUIRE(smoothed_points.size() == 4);
  CHECK(smoothed_points[0].second == 1.0);                          // debiased: the first value itself
  CHECK(smoothed_points[1].second == Approx((0.25 + 1.5) / 0.75));  // (0.5 * 0.5 * 1 + 0.5 * 3) / (1 - 0.25)
  CHECK(std::isnan(smoothed_points[2].second));
  CHECK(smoothed_points[3].second == Approx((0.125 + 0.75 + 2.5) / 0.875));
  CHECK(smoothed({{1, 2.0}}, 0) == SeriesPoints{{1, 2.0}});
}

TEST_CASE("the dashboard's chart: the report's drawing plus hover data, zoomed to a step range", "[report]") {
  const ChartSeries series{"run", "#1f77b4", "", {{0, 4.0}, {10, 3.0}, {20, 2.0}, {30, 1.0}}};
  ChartOptions plain;
  ChartOptions hover;
  hover.hover_data = true;
  const std::string report_svg = render_line_chart({series}, plain);
  const std::string dashboard_svg = render_line_chart({series}, hover);
  CHECK(report_svg.find("data-") == std::string::npos);
  CHECK(dashboard_svg.find("data-steps=\"0 10 20 30\" data-values=\"4 3 2 1\"") != std::string::npos);
  CHECK(dashboard_svg.find("class=\"plot-frame\"") != std::string::npos);
  // The same polyline in both.
  const auto polyline = [](const std::string& svg) {
    const auto start = svg.find("<polyline");
    return svg.substr(start, svg.find('>', start) - start);
  };
  CHECK(polyline(report_svg) == polyline(dashboard_svg));
  ChartOptions zoomed = hover;
  zoomed.step_range = StepRange{10, 20};
  CHECK(render_line_chart({series}, zoomed).find("data-steps=\"10 20\"") != std::string::npos);
  ChartOptions log = plain;
  log.y_scale = YScale::log;
  CHECK(render_line_chart({series}, log).find(">log</text>") != std::string::npos);
  ChartOptions smooth = plain;
  smooth.smoothing = 0.6;
  // A sparse series (4 values) is drawn as it is, with markers; a dense one (40) smoothed over its faded values.
  const std::string sparse = render_line_chart({series}, smooth);
  CHECK(sparse.find("opacity=\"0.25\"") == std::string::npos);
  CHECK(polyline(sparse) == polyline(report_svg));
  std::size_t markers = 0;
  for (auto at = sparse.find("<circle class=\"marker\""); at != std::string::npos;
       at = sparse.find("<circle class=\"marker\"", at + 1))
    ++markers;
  CHECK(markers == 4);
  ChartSeries dense{"run", "#1f77b4", "", {}};
  for (std::int64_t step = 0; step < 40; ++step) dense.points.emplace_back(step, step % 2 ? 1.0 : 2.0);
  const std::string smoothed_svg = render_line_chart({dense}, smooth);
  CHECK(smoothed_svg.find("opacity=\"0.25\"") != std::string::npos);  // the raw values, faded
  CHECK(smoothed_svg.find("class=\"marker\"") == std::string::npos);
}

TEST_CASE("parallel coordinates draw a line per trial and bars their values", "[report]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg =
      render_parallel_coordinates({{"lr", true, {}}, {"mode", false, {"a", "b"}}, {"loss", false, {}}},
                                  {{{1e-3, 0, 0.5}, "#1f77b4", false, "t1"},
                                   {{1e-2, 1, 0.2}, "#d62728", true, "t2"},
                                   {{1e-1, nan, 0.9}, "#888", false, "t3"}},
                                  {});
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  CHECK(lines == 3);  // t3 has no mode: its line goes from lr to loss
  CHECK(svg.find("nan") == std::string::npos);
  const std::string bars = render_bar_chart({{"lr", 0.8, "#1f77b4", ""}, {"mode", 0.1, "#1f77b4", ""}}, {});
  CHECK(bars.find(">0.80<") != std::string::npos);
}

TEST_CASE("parameter importance is the squared Spearman correlation, or eta squared of ranks for choices", "[report]") {
  using runner::sweep::parameter_importance;
  // A monotone relation, however curved: 1.
  CHECK(*parameter_importance({1e-4, 1e-3, 1e-2, 1e-1}, {1.0, 4.0, 9.0, 100.0}) == Approx(1.0));
  CHECK(*parameter_importance({1, 2, 3, 4}, {4.0, 3.0, 2.0, 1.0}) == Approx(1.0));
  // Ranks 1 2 3 4 5 against 2 1 4 3 5: rho = 1 - 6 * 4 / (5 * 24) = 0.8.
  CHECK(*parameter_importance({1, 2, 3, 4, 5}, {2.0, 1.0, 4.0, 3.0, 5.0}) == Approx(0.64));
  // Choices: the objective's ranks split cleanly by the choice: 1; evenly mixed: 0.
  CHECK(*parameter_importance({"a", "a", "b", "b"}, {1.0, 2.0, 3.0, 4.0}) ==
        Approx(0.8));  // 4 / 5 of the rank variance
  CHECK(*parameter_importance({"a", "b", "b", "a"}, {1.0, 2.0, 3.0, 4.0}) == Approx(0.0));
  CHECK_FALSE(parameter_importance({1, 2}, {1.0, 2.0}));          // too few trials
  CHECK_FALSE(parameter_importance({1, 1, 1}, {1.0, 2.0, 3.0}));  // one value
  CHECK_FALSE(parameter_importance({1, 2, 3}, {1.0, 1.0, 1.0}));  // one result
}

TEST_CASE("in a sweep's curves only the best trial is drawn in the best trial's red", "[report]") {
  runner::report::SweepReport report;
  report.metric = "loss";
  for (std::int64_t t = 1; t <= 12; ++t) {
    runner::report::SweepReportTrial trial;
    trial.trial = t;
    trial.status = "finished";
    trial.value = static_cast<double>(t);
    trial.curve = {{1, 1.0 / static_cast<double>(t)}, {2, 0.5 / static_cast<double>(t)}};
    report.trials.push_back(trial);
  }
  report.best_trial = 1;
  const std::string svg = runner::report::curves_chart(report);
  const auto count = [&](const std::string& colour) {
    std::size_t found = 0;
    for (std::size_t at = svg.find(colour); at != std::string::npos; at = svg.find(colour, at + 1)) ++found;
    return found;
  };
  // The 11 other trials take the runs' palette without red: tab10's third colour (green) goes to one trial only,
  // as the red does.
  CHECK(count("#d62728") > 0);
  CHECK(count("#d62728") == count("#2ca02c"));
}
