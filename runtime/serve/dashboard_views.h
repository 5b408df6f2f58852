// What the dashboard's requests answer, read from the index: the JSON of its pages (runs, a run, compare, sweeps,
// a sweep) and its charts as SVG, drawn by the reports' chart code. Pure functions of an open index and the
// request's parameters; nothing here writes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"

namespace runner::serve {

// A request's query parameters: each name with its values in order (`run=a&run=b`).
using QueryParameters = std::multimap<std::string, std::string>;

// A request the parameters do not allow ("no run matches 'x'", "smoothing must be in [0, 1)"): answered 400
// (404 for what does not exist) with the message.
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct NotFound : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The JSON of each page; the runs, run and compare pages list their metrics as "metric_keys" in the order they
// are shown (report::ordered_metric_keys). Each holds "version", a digest of what the page shows except the running
// clock (durations); a request whose `since` equals it is answered {"version": V, "unchanged": true}, which the pages
// poll for.
nlohmann::json runs_page(index::Database& db, const QueryParameters& parameters);
nlohmann::json run_page(index::Database& db, const QueryParameters& parameters);      // run=REF
nlohmann::json compare_page(index::Database& db, const QueryParameters& parameters);  // run=A&run=B...
// runs=ID,ID,...: those runs grouped as `runner runs --group` groups them (every config key but seed; the keys that
// differ between the groups shown), each group with its label, runs, colour (its first run's) and each metric's
// latest values' mean, standard deviation (null for one run) and count.
nlohmann::json groups_page(index::Database& db, const QueryParameters& parameters);
nlohmann::json sweeps_page(index::Database& db, const QueryParameters& parameters);
nlohmann::json sweep_page(index::Database& db, const QueryParameters& parameters);  // sweep=NAME

// The SVG of a metric over runs: run=REF (several), key=K, x=step|time|relative, scale=auto|linear|log,
// smoothing=0..0.99, from=X&to=X (zoom), width=PX, group=1 (the runs grouped as `runner runs --group`: a mean line
// and band per group). The report's chart (report::render_metric_chart) with hover data.
std::string metric_chart(index::Database& db, const std::string& home, const QueryParameters& parameters);
// The SVG of one step's histogram of a tensor a run logged: run=REF, key=K, step=N (report::render_histogram_chart).
std::string histogram_chart(index::Database& db, const QueryParameters& parameters);
// The SVG of a sweep's chart: sweep=NAME, chart=objective (param=NAME) | importance | parallel | rungs | curves
// (with curves: scale, smoothing, from, to). The sweep report's charts.
std::string sweep_chart(index::Database& db, const QueryParameters& parameters);

// An image of a run that the index lists: run=REF&path=PATH (relative to the run's folder, as in the artifacts
// table). Returns the file's path under `home`; NotFound for any path the index does not list.
std::string image_file(index::Database& db, const std::string& home, const QueryParameters& parameters);

// FNV-1a of the text, as 16 hex digits.
std::string digest(const std::string& text);

}  // namespace runner::serve
