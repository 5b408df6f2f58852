// The dashboard of `runner serve`: draws the page its path names from the server's JSON, shows the charts the
// server draws (the reports' SVG) with hover values and drag-to-zoom, and polls for changes once a second.
"use strict";

// ---- small helpers -------------------------------------------------------------------------------

// el("a", { href: "/x", class: "y" }, "text", child): a new element; strings become text nodes.
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function query(parameters) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(parameters)) {
    for (const one of [].concat(value)) if (one !== undefined && one !== null && one !== "") search.append(name, one);
  }
  return search.toString();
}

async function fetchText(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  const body = await response.text();
  if (!response.ok) throw new Error(`${response.status}: ${body.trim()}`);
  return body;
}

function formatValue(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(6).replace(/\.?0+(e|$)/, "$1");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function formatDuration(seconds) {
  if (seconds < 60) return `${Math.round(seconds)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${String(Math.round(seconds % 60)).padStart(2, "0")}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${String(Math.floor(seconds / 60) % 60).padStart(2, "0")}m`;
  return `${Math.floor(seconds / 86400)}d ${Math.floor(seconds / 3600) % 24}h`;
}

function tagList(tags) {
  return el("span", { class: "tags" }, tags.map((tag) => el("span", { class: "tag" }, tag)));
}

function statusBadge(status) {
  const known = ["running", "finished", "failed", "interrupted", "paused", "pruned"];
  return el("span", { class: `status status-${known.includes(status) ? status : "other"}` }, status);
}

function runLink(id, name) {
  return el("a", { href: `/run/${encodeURIComponent(id)}` }, name || id);
}

// ---- live updates: one request at a time, once a second; the server answers "unchanged" to a known version ----

const live = document.getElementById("live");

// url: the page's JSON, or a function that gives it (asked again at each tick). A request that fails is shown by
// failed(error) when that returns true, else by the live indicator.
function poll(url, render, failed) {
  let version = "";
  async function tick() {
    const address = typeof url === "function" ? url() : url;
    try {
      const answer = JSON.parse(await fetchText(`${address}${address.includes("?") ? "&" : "?"}${query({ since: version })}`));
      if (!answer.unchanged) {
        version = answer.version;
        render(answer);
      }
      live.textContent = `live \u00b7 ${new Date().toLocaleTimeString()}`;
      live.classList.remove("stale");
    } catch (error) {
      if (!(failed && failed(error))) {
        live.textContent = `not updating: ${error.message}`;
        live.classList.add("stale");
      }
    }
    setTimeout(tick, 1000);
  }
  tick();
}

// ---- tables: sortable by any column -----------------------------------------------------------------

// columns: [{ title, value(row) -> sortable value, cell(row) -> node or text }]
function sortableTable(columns, rows, state) {
  const sorted = rows.slice();
  if (state.column !== undefined) {
    const value = columns[state.column].value;
    sorted.sort((a, b) => {
      const x = value(a), y = value(b);
      const missing = (x === null || x === undefined) - (y === null || y === undefined);
      if (missing) return missing;  // rows without a value last, either way
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return state.descending ? -order : order;
    });
  }
  const head = el("tr", {}, columns.map((column, i) => el("th", {
    class: i === state.column ? (state.descending ? "sorted-desc" : "sorted-asc") : null,
    onclick: () => {
      state.descending = state.column === i ? !state.descending : false;
      state.column = i;
      state.redraw();
    },
  }, column.title)));
  const body = sorted.map((row) => el("tr", {}, columns.map((column) => {
    const content = column.cell ? column.cell(row) : formatValue(column.value(row));
    return el("td", { class: typeof column.value(row) === "number" ? "num" : null }, content);
  })));
  return el("div", { class: "table-wrap" }, el("table", { class: "sortable" }, el("thead", {}, head), el("tbody", {}, body)));
}

function keyValueTable(object) {
  const keys = Object.keys(object || {}).sort();
  if (!keys.length) return el("p", { class: "note" }, "none");
  return el("div", { class: "table-wrap" }, el("table", {}, el("tbody", {}, keys.map((key) =>
    el("tr", {}, el("th", { class: "mono" }, key), el("td", { class: "config-value" }, formatValue(object[key])))))));
}

// ---- charts: the server's SVG, with hover values and drag-to-zoom --------------------------------------

const hover = document.getElementById("hover");

// The x axes of line charts (the server's `x`): the step, the wall-clock time, the time since the run started.
const X_AXES = { step: "step", time: "wall time", relative: "relative time" };

// An x value as the hover writes it.
function formatX(x, axis) {
  if (axis === "time") return new Date(x * 1000).toLocaleString();
  if (axis === "relative") return `${formatDuration(x)} since the start`;
  return `step ${x}`;
}

// The initial view of a page's line charts: the URL's (chartControls keeps it there), else steps on x, smoothing on
// (W&B's default weight).
function defaultView() {
  const x = urlState.read("x"), scale = urlState.read("scale"), smoothing = Number(urlState.read("smoothing") ?? NaN);
  return { x: Object.hasOwn(X_AXES, x ?? "") ? x : "step", scale: ["auto", "linear", "log"].includes(scale) ? scale : "auto",
    smoothing: smoothing >= 0 && smoothing < 1 ? smoothing : 0.6 };
}

// A figure showing the SVG at url(view), where view = { x, scale, smoothing } is shared by a page's charts.
// Dragging across the plot zooms (from/to), a double click zooms out; load() fetches the chart again. marks(), if
// given, lists what to mark on the plot with a dashed line and a tooltip: [{ step, x: { step, time, relative }, title }].
// With ownSmoothing, a control under the chart sets this chart's smoothing apart from the page's.
function chartFigure(url, view, marks, ownSmoothing) {
  const holder = el("div", { class: "chart-svg" });
  const figure = el("figure", { class: "chart" }, holder);
  let zoom = {};  // this chart's own zoom
  let own = {};   // this chart's own smoothing
  let drag = null;
  if (ownSmoothing) {
    const choice = el("select", { class: "chart-smoothing", onchange: () => {
      own = choice.value === "" ? {} : { smoothing: Number(choice.value) };
      load();
    } }, el("option", { value: "" }, "as the page"), [0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99].map((weight) =>
      el("option", { value: weight }, weight === 0 ? "none" : String(weight))));
    figure.append(el("label", { class: "chart-smoothing" }, "smoothing ", choice));
  }
  const onControl = (event) => event.target instanceof Element && !!event.target.closest("label.chart-smoothing");

  async function load() {
    try {
      holder.innerHTML = await fetchText(url({ ...view, ...zoom, ...own }));
      drawMarks();
    } catch (error) {
      holder.replaceChildren(el("p", { class: "error" }, error.message));
    }
  }

  function drawMarks() {
    const f = frame();
    if (!f || !marks) return;
    for (const mark of marks()) {
      const at = mark.x[view.x || "step"];
      if (at < f.x0 || at > f.x1) continue;
      const x = f.left + (at - f.x0) / (f.x1 - f.x0) * f.width;
      const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
      line.setAttribute("class", "intervention-mark");
      line.setAttribute("data-step", mark.step);
      line.setAttribute("x1", x); line.setAttribute("x2", x);
      line.setAttribute("y1", f.top); line.setAttribute("y2", f.top + f.height);
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = mark.title;
      line.append(title);
      f.svg.append(line);
    }
  }

  // The plot's frame: its pixel box and what its ends stand for.
  function frame() {
    const svg = figure.querySelector("svg");
    const rect = svg && svg.querySelector("rect.plot-frame");
    if (!rect) return null;
    const [x0, x1] = rect.dataset.x.split(" ").map(Number);
    const [y0, y1] = rect.dataset.y.split(" ").map(Number);
    return { svg, left: +rect.getAttribute("x"), top: +rect.getAttribute("y"), width: +rect.getAttribute("width"),
             height: +rect.getAttribute("height"), x0, x1, y0, y1, log: rect.dataset.log === "1" };
  }

  function svgPoint(f, event) {
    const point = new DOMPoint(event.clientX, event.clientY).matrixTransform(f.svg.getScreenCTM().inverse());
    return { x: point.x, y: point.y, step: f.x0 + (point.x - f.left) / f.width * (f.x1 - f.x0) };
  }

  function seriesData(group) {
    if (!group._steps) {
      group._steps = group.dataset.steps ? group.dataset.steps.split(" ").map(Number) : [];
      group._values = group.dataset.values ? group.dataset.values.split(" ").map(Number) : [];
    }
    return group;
  }

  // The index of the step nearest to `step` in the sorted `steps`.
  function nearest(steps, step) {
    let low = 0, high = steps.length - 1;
    while (high - low > 1) {
      const middle = (low + high) >> 1;
      if (steps[middle] < step) low = middle; else high = middle;
    }
    return Math.abs(steps[high] - step) < Math.abs(steps[low] - step) ? high : low;
  }

  function showHover(event) {
    const f = frame();
    if (!f) return;
    const at = svgPoint(f, event);
    let line = f.svg.querySelector(".hover-line");
    if (at.x < f.left || at.x > f.left + f.width || at.y < f.top || at.y > f.top + f.height) {
      hover.hidden = true;
      if (line) line.remove();
      return;
    }
    const rows = [];
    let shownStep = null;
    for (const group of f.svg.querySelectorAll("g.series")) {
      const data = seriesData(group);
      if (!data._steps.length) continue;
      const i = nearest(data._steps, at.step);
      if (shownStep === null) shownStep = data._steps[i];
      rows.push(el("div", {}, el("span", { class: "swatch", style: `background:${group.dataset.colour}` }),
        `${group.dataset.label}: ${Number.isNaN(data._values[i]) ? "nan" : formatValue(data._values[i])}`,
        data._steps[i] !== shownStep ? el("span", { class: "step" }, ` (${formatX(data._steps[i], view.x)})`) : null));
    }
    if (!rows.length) return;
    if (!line) {
      line = document.createElementNS("http://www.w3.org/2000/svg", "line");
      line.setAttribute("class", "hover-line");
      f.svg.append(line);
    }
    const x = f.left + (shownStep - f.x0) / (f.x1 - f.x0) * f.width;
    line.setAttribute("x1", x); line.setAttribute("x2", x);
    line.setAttribute("y1", f.top); line.setAttribute("y2", f.top + f.height);
    hover.replaceChildren(el("div", { class: "step" }, formatX(shownStep, view.x)), ...rows);
    hover.hidden = false;
    hover.style.left = `${Math.min(event.clientX + 14, window.innerWidth - hover.offsetWidth - 8)}px`;
    hover.style.top = `${event.clientY + 14}px`;
  }

  figure.addEventListener("mousemove", (event) => {
    showHover(event);
    if (!drag) return;
    const f = frame();
    const at = svgPoint(f, event);
    const x = Math.max(f.left, Math.min(f.left + f.width, at.x));
    drag.box.setAttribute("x", Math.min(drag.x, x));
    drag.box.setAttribute("width", Math.abs(x - drag.x));
    drag.step1 = f.x0 + (x - f.left) / f.width * (f.x1 - f.x0);
  });
  figure.addEventListener("mouseleave", () => {
    hover.hidden = true;
    const line = figure.querySelector(".hover-line");
    if (line) line.remove();
  });
  figure.addEventListener("mousedown", (event) => {
    const f = frame();
    if (!f || onControl(event)) return;
    const at = svgPoint(f, event);
    if (at.x < f.left || at.x > f.left + f.width) return;
    event.preventDefault();
    const box = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    box.setAttribute("class", "selection");
    box.setAttribute("x", at.x); box.setAttribute("y", f.top);
    box.setAttribute("width", 0); box.setAttribute("height", f.height);
    f.svg.append(box);
    drag = { x: at.x, box, step0: at.step, step1: at.step };
  });
  window.addEventListener("mouseup", () => {
    if (!drag) return;
    const f = frame();
    let [from, to] = [Math.min(drag.step0, drag.step1), Math.max(drag.step0, drag.step1)];
    if (!view.x || view.x === "step") [from, to] = [Math.floor(from), Math.ceil(to)];
    drag.box.remove();
    drag = null;
    if (view.x && view.x !== "step" ? f && to - from > (f.x1 - f.x0) / 100 : to - from >= 2) {
      zoom = { from, to };
      load();
    }
  });
  figure.addEventListener("dblclick", (event) => {
    if (onControl(event)) return;
    zoom = {};
    load();
  });
  figure.load = (resetZoom) => {
    if (resetZoom) zoom = {};
    return load();
  };
  load();
  return figure;
}

// The x axis, scale and smoothing of a page's line charts, kept in the URL; onchange() redraws them (a new x axis
// drops their zoom).
function chartControls(view, onchange) {
  const changed = (resetZoom) => {
    urlState.write({ x: view.x, scale: view.scale, smoothing: String(view.smoothing) });
    onchange(resetZoom);
  };
  const x = el("select", { class: "x-axis", onchange: () => { view.x = x.value; changed(true); } },
    Object.entries(X_AXES).map(([name, title]) => el("option", { value: name, selected: view.x === name }, title)));
  const scale = el("select", { class: "y-scale", onchange: () => { view.scale = scale.value; changed(); } },
    ["auto", "linear", "log"].map((name) => el("option", { value: name, selected: view.scale === name }, name)));
  const shown = el("span", {}, String(view.smoothing));
  const smoothing = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: view.smoothing,
    oninput: () => { shown.textContent = smoothing.value; },
    onchange: () => { view.smoothing = Number(smoothing.value); changed(); } });
  return el("div", { class: "controls" }, el("label", {}, "x axis ", x), el("label", {}, "y scale ", scale),
    el("label", {}, "smoothing ", smoothing, " ", shown),
    el("span", { class: "note" }, "drag across a chart to zoom, double-click to zoom out"));
}

function metricChartUrl(runs, key) {
  return (view) => `/chart/metric.svg?${query({ run: runs, key, ...view })}`;
}

// runner's own metrics: the trainer's timings (time/*) and the run's system metrics (sys/*). The server lists them
// after the script's metrics; the run page shows each prefix in a group of its own, collapsed.
const METRIC_GROUPS = [
  { prefix: "time/", title: "runner's timings" },
  { prefix: "sys/", title: "system metrics" },
];
const groupOf = (key) => METRIC_GROUPS.find((group) => key.startsWith(group.prefix));

// ---- pages ----------------------------------------------------------------------------------------

const page = document.getElementById("page");

// The config keys whose values are not the same in every one of `runs` (a key some lack included), sorted.
function differingConfigKeys(runs) {
  const keys = new Set(runs.flatMap((run) => Object.keys(run.config || {})));
  const valueOf = (run, key) => (run.config && key in run.config ? JSON.stringify(run.config[key]) : undefined);
  return [...keys].filter((key) => runs.some((run) => valueOf(run, key) !== valueOf(runs[0], key))).sort();
}

// The page's state kept in its URL's query (next to the token, if any), so that a reload or a shared link restores
// it: read(name) and readAll(name) give what the URL holds; write({ name: value or [values] }) replaces those
// names (empty ones removed) without a reload.
const urlState = {
  read: (name) => new URLSearchParams(location.search).get(name),
  readAll: (name) => new URLSearchParams(location.search).getAll(name),
  write(values) {
    const search = new URLSearchParams(location.search);
    for (const [name, value] of Object.entries(values)) {
      search.delete(name);
      for (const one of [].concat(value)) if (one !== undefined && one !== null && one !== "" && one !== false) search.append(name, one === true ? "1" : one);
    }
    const text = search.toString();
    history.replaceState(null, "", `${location.pathname}${text ? `?${text}` : ""}${location.hash}`);
  },
};

// "0.0421 ± 0.0012": a group's mean and standard deviation of a metric ("0.0421" for one run).
function spreadText(spread) {
  if (!spread) return "-";
  return spread.std === null ? formatValue(spread.mean) : `${formatValue(spread.mean)} \u00b1 ${formatValue(spread.std)}`;
}

function runsPage() {
  const filters = { text: urlState.read("q") || "", status: urlState.read("status") || "", sweep: urlState.read("sweep") || "",
    world: urlState.read("world") || "", where: urlState.read("where") || "" };
  const sort = { column: undefined, title: urlState.read("sort") || undefined, descending: urlState.read("desc") === "1" };
  const selected = new Set(urlState.readAll("select"));
  let grouped = urlState.read("group") === "1";
  let data = null;
  let groups = null;         // /api/groups of the runs shown, when grouped
  let groupsAsked = "";      // the request those answer
  const controls = el("div", { class: "controls" });
  // `runner runs --where`'s expression, evaluated by the server: config keys, metrics, tag, status, name.
  const whereError = el("p", { class: "error where-error", hidden: true });
  const where = el("input", { type: "text", class: "where", size: 48, value: filters.where,
    placeholder: "where: lr < 1e-3 and (tag = 'baseline' or status = 'failed')",
    onchange: () => { filters.where = where.value.trim(); whereError.hidden = true; keepInUrl(); } });
  const tableHolder = el("div", { class: "runs-table" });
  page.replaceChildren(el("h1", {}, "Runs"), controls, el("div", { class: "controls" }, where), whereError, tableHolder);

  function keepInUrl() {
    urlState.write({ q: filters.text, status: filters.status, sweep: filters.sweep, world: filters.world, where: filters.where,
      sort: sort.title, desc: sort.title !== undefined && sort.descending, select: [...selected], group: grouped });
  }

  function select(name, values, label) {
    return el("label", {}, `${label} `, el("select", { onchange: (event) => { filters[name] = event.target.value; keepInUrl(); draw(); } },
      el("option", { value: "" }, "all"), [...values].sort().map((v) => el("option", { value: v, selected: filters[name] === String(v) }, v))));
  }

  // The table sorted by the column titled sort.title (kept by title: the config columns come and go with the runs).
  function sortedTable(columns, rows) {
    const sorted = columns.findIndex((column) => column.title === sort.title);
    sort.column = sorted >= 0 ? sorted : undefined;
    sort.redraw = () => { sort.title = columns[sort.column].title; keepInUrl(); draw(); };
    return sortableTable(columns, rows, sort);
  }

  function draw() {
    if (!data) return;
    const runs = data.runs.filter((run) =>
      (!filters.text || `${run.name} ${run.id} ${run.script} ${run.tags.join(" ")} ${run.note || ""}`.toLowerCase()
        .includes(filters.text.toLowerCase())) &&
      (!filters.status || run.status === filters.status) &&
      (!filters.sweep || (run.sweep || "(none)") === filters.sweep) &&
      (!filters.world || String(run.world_size) === filters.world));
    if (!runs.length) { tableHolder.replaceChildren(el("p", { class: "note" }, "no runs match")); return; }
    if (grouped) { drawGroups(runs); return; }
    const columns = [
      { title: "", value: () => null, cell: (run) => el("input", { type: "checkbox", checked: selected.has(run.id),
        onchange: (event) => { if (event.target.checked) selected.add(run.id); else selected.delete(run.id); keepInUrl(); drawControls(); } }) },
      { title: "name", value: (run) => run.name, cell: (run) => [el("span", { class: "swatch", style: `background:${run.colour}` }), runLink(run.id, run.name)] },
      { title: "id", value: (run) => run.id, cell: (run) => el("span", { class: "mono" }, run.id) },
      { title: "status", value: (run) => run.status, cell: (run) => statusBadge(run.status) },
      { title: "tags", value: (run) => run.tags.join(" ") || null, cell: (run) => tagList(run.tags) },
      { title: "note", value: (run) => run.note, cell: (run) => run.note ? el("span", { class: "run-note", title: run.note }, run.note) : "-" },
      { title: "sweep", value: (run) => run.sweep, cell: (run) => run.sweep ? el("a", { href: `/sweep/${encodeURIComponent(run.sweep)}` }, `${run.sweep} #${run.trial}`) : "-" },
      { title: "world size", value: (run) => run.world_size },
      { title: "step", value: (run) => run.step },
      { title: "started", value: (run) => run.started_at, cell: (run) => run.started },
      { title: "duration", value: (run) => data.durations[run.id], cell: (run) => formatDuration(data.durations[run.id]) },
      // The config keys that differ between the runs shown (as W&B's table), then the metrics.
      ...differingConfigKeys(runs).map((key) => ({ title: `config.${key}`, config: true,
        value: (run) => (run.config && key in run.config ? run.config[key] : null) })),
      ...data.metric_keys.map((key) => ({ title: key, value: (run) => run.metrics[key] })),
    ];
    tableHolder.replaceChildren(sortedTable(columns, runs));
  }

  // The runs shown grouped by the server as `runner runs --group` groups them: a row per group with the keys that
  // tell the groups apart, the count, and each metric's mean ± standard deviation.
  function drawGroups(runs) {
    const asked = `${data.version} ${runs.map((run) => run.id).join(",")}`;
    if (asked !== groupsAsked) {
      groupsAsked = asked;
      fetchText(`/api/groups?${query({ runs: runs.map((run) => run.id).join(",") })}`).then((text) => {
        if (groupsAsked !== asked) return;
        groups = JSON.parse(text);
        draw();
      }, (error) => { tableHolder.replaceChildren(el("p", { class: "error" }, error.message)); });
    }
    if (!groups) return;  // until the first answer
    const columns = [
      { title: "group", value: (g) => g.label, cell: (g) => [el("span", { class: "swatch", style: `background:${g.colour}` }), g.label] },
      ...groups.keys.map((key) => ({ title: `config.${key}`, config: true, value: (g) => g.key[key] })),
      { title: "runs", value: (g) => g.runs.length, cell: (g) => el("span", { title: g.runs.join(" ") }, String(g.runs.length)) },
      ...groups.metric_keys.map((key) => ({ title: key, value: (g) => (g.metrics[key] ? g.metrics[key].mean : null),
        cell: (g) => spreadText(g.metrics[key]) })),
    ];
    tableHolder.replaceChildren(sortedTable(columns, groups.groups));
  }

  function drawControls() {
    const text = el("input", { type: "search", placeholder: "filter by name, id, script, tag or note", value: filters.text,
      oninput: (event) => { filters.text = event.target.value; keepInUrl(); draw(); } });
    const compare = el("button", { disabled: selected.size < 1,
      onclick: () => { location.href = `/compare?${query({ run: [...selected] })}`; } }, `compare selected (${selected.size})`);
    const group = el("label", {}, el("input", { type: "checkbox", class: "group-runs", checked: grouped,
      onchange: (event) => { grouped = event.target.checked; keepInUrl(); draw(); } }), " group by config (all but seed)");
    controls.replaceChildren(text, select("status", new Set(data.runs.map((r) => r.status)), "status"),
      select("sweep", new Set(data.runs.map((r) => r.sweep || "(none)")), "sweep"),
      select("world", new Set(data.runs.map((r) => String(r.world_size))), "world size"), group, compare);
  }

  poll(() => `/api/runs?${query({ where: filters.where })}`, (answer) => {
    const first = !data;
    data = answer;
    whereError.hidden = true;
    if (first || !controls.contains(document.activeElement)) drawControls();
    draw();
  }, (error) => {
    if (!error.message.startsWith("400: ")) return false;  // a bad expression; other failures are the indicator's
    whereError.textContent = error.message.slice(5);
    whereError.hidden = false;
    return true;
  });
}

function runPage(reference) {
  const view = defaultView();
  const hidden = new Set(urlState.readAll("hide"));  // metric keys whose chart was turned off (kept in the URL)
  const charts = new Map();      // key -> figure
  const sliders = new Map();     // image name -> { input, follow }
  let run = null;
  let metricKeys = [];           // in the order they are shown
  let metricSections = [];       // the server's sections of them by prefix (eval/, late/, ...)
  const header = el("div");
  const error = el("div");
  const picks = el("div", { class: "metric-picks" });
  const chartHolder = el("div", { class: "metric-sections" });
  let sectionLayout = null;      // the prefixes of the sections laid out
  let sectionCharts = [];        // per section: its charts' holder
  // runner's metric groups, collapsed until opened (their charts are drawn only while one is open)
  const groups = new Map(METRIC_GROUPS.map((group) => {
    const picks = el("div", { class: "metric-picks" });
    const charts = el("div", { class: "charts" });
    const title = el("summary");
    const details = el("details", { class: "metric-group", "data-prefix": group.prefix, hidden: true,
      ontoggle: () => run && drawCharts() }, title, picks, charts);
    return [group, { picks, charts, title, details }];
  }));
  const samples = el("div");
  const histograms = el("div", { class: "histograms" });
  const histogramSliders = new Map();  // key -> { index, follow }
  const interventions = el("div", { class: "interventions" });
  const details = el("div");
  page.replaceChildren(header, error, el("h2", {}, "Metrics"), picks,
    chartControls(view, (resetZoom) => charts.forEach((figure) => figure.load(resetZoom))), chartHolder,
    ...[...groups.values()].map((parts) => parts.details),
    el("h2", {}, "Samples"), samples, el("h2", {}, "Histograms"), histograms,
    el("h2", {}, "Interventions (runner attach)"), interventions, details);

  // A chart for every metric, new ones as they arrive, but those turned off and those of collapsed groups.
  function drawCharts() {
    const keys = metricKeys;
    const pick = (key) => el("label", {}, el("input", { type: "checkbox", checked: !hidden.has(key),
      onchange: (event) => {
        if (event.target.checked) hidden.delete(key); else hidden.add(key);
        urlState.write({ hide: [...hidden] });
        drawCharts();
      } }), ` ${key}`);
    picks.replaceChildren(...keys.filter((key) => !groupOf(key)).map(pick));
    for (const [group, parts] of groups) {
      const groupKeys = keys.filter((key) => groupOf(key) === group);
      parts.picks.replaceChildren(...groupKeys.map(pick));
      parts.title.textContent = `${group.title} (${groupKeys.length}: ${group.prefix}*)`;
      parts.details.hidden = !groupKeys.length;
    }
    // A heading per prefix (eval/, late/), as the report has; metrics without one after a prefix's are "other metrics".
    const sections = metricSections.filter((section) => !METRIC_GROUPS.some((group) => group.prefix === section.prefix));
    const layout = JSON.stringify(sections.map((section) => section.prefix));
    if (layout !== sectionLayout) {
      sectionLayout = layout;
      sectionCharts = sections.map(() => el("div", { class: "charts" }));
      chartHolder.replaceChildren(...sections.map((section, i) => {
        const holder = sectionCharts[i];
        return el("div", { class: "metric-section", "data-prefix": section.prefix },
          section.prefix || i > 0 ? el("h3", { class: "metric-prefix" }, section.prefix || "other metrics") : "", holder);
      }));
    }
    const sectionOf = (key) => sections.findIndex((section) => section.keys.includes(key));
    const charted = (key) => !hidden.has(key) && (!groupOf(key) || groups.get(groupOf(key)).details.open);
    for (const [key, figure] of charts) if (!charted(key)) { figure.remove(); charts.delete(key); }
    for (const key of keys) {
      if (!charted(key)) continue;
      if (charts.has(key)) charts.get(key).load();
      else charts.set(key, chartFigure(metricChartUrl([run.id], key), view, interventionMarks, true));
      (groupOf(key) ? groups.get(groupOf(key)).charts : sectionCharts[sectionOf(key)]).append(charts.get(key));
    }
  }

  function drawSamples() {
    const byName = new Map();
    for (const artifact of run.artifacts) {
      if (artifact.kind !== "image") continue;
      if (!byName.has(artifact.name)) byName.set(artifact.name, []);
      byName.get(artifact.name).push(artifact);
    }
    if (!byName.size) { samples.replaceChildren(el("p", { class: "note" }, "no sample grids yet")); return; }
    const blocks = [];
    for (const [name, images] of byName) {
      images.sort((a, b) => a.step - b.step);
      const previous = sliders.get(name);
      const follow = !previous || previous.follow;  // at the newest grid: stay there as grids arrive
      const index = follow ? images.length - 1 : Math.min(previous.index, images.length - 1);
      // Enlarged by a whole factor towards 384 pixels wide, as the report does; pixelated rendering keeps it sharp.
      const image = el("img", { alt: `${name} grid`, onload: () => {
        image.width = image.naturalWidth * Math.max(1, Math.floor(384 / image.naturalWidth));
      } });
      const caption = el("span");
      const input = el("input", { type: "range", min: 0, max: images.length - 1, value: index });
      const show = () => {
        const chosen = images[Number(input.value)];
        image.src = `/image?${query({ run: run.id, path: chosen.path })}`;
        caption.textContent = ` step ${chosen.step} (${Number(input.value) + 1} of ${images.length})`;
        sliders.set(name, { index: Number(input.value), follow: Number(input.value) === images.length - 1 });
      };
      input.addEventListener("input", show);
      show();
      blocks.push(el("div", { class: "grid-slider", "data-name": name }, el("h3", {}, name), input, caption, image));
    }
    samples.replaceChildren(...blocks);
  }

  // A histogram per tensor logged (run:log { weights = t }), one step at a time: the newest, or the slider's.
  function drawHistograms() {
    const keys = Object.keys(run.histograms || {}).sort();
    if (!keys.length) { histograms.replaceChildren(el("p", { class: "note" }, "none: run:log { name = tensor } logs one")); return; }
    histograms.replaceChildren(...keys.map((key) => {
      const steps = run.histograms[key];
      const previous = histogramSliders.get(key);
      const follow = !previous || previous.follow;
      const index = follow ? steps.length - 1 : Math.min(previous.index, steps.length - 1);
      const figure = el("figure", { class: "chart" });
      const caption = el("span");
      const input = el("input", { type: "range", min: 0, max: steps.length - 1, value: index });
      let shown = null;
      const show = async () => {
        const chosen = Number(input.value);
        caption.textContent = ` step ${steps[chosen]} (${chosen + 1} of ${steps.length})`;
        histogramSliders.set(key, { index: chosen, follow: chosen === steps.length - 1 });
        if (shown === steps[chosen]) return;
        shown = steps[chosen];
        try {
          figure.innerHTML = await fetchText(`/chart/histogram.svg?${query({ run: run.id, key, step: shown })}`);
        } catch (error) {
          figure.replaceChildren(el("p", { class: "error" }, error.message));
        }
      };
      input.addEventListener("input", show);
      show();
      return el("div", { class: "histogram-slider", "data-key": key }, el("h3", {}, key), input, caption, figure);
    }));
  }

  // What runner attach changed, marked on every chart at the step after which it ran.
  function interventionMarks() {
    return (run ? run.interventions : []).map((i) => ({ step: i.step, x: { step: i.step, time: i.time, relative: i.time - run.started_at },
      title: `step ${i.step}: ${i.changes.join(", ")}\n${i.chunk}` }));
  }

  function drawInterventions() {
    interventions.replaceChildren(run.interventions.length ? sortableTable([
      { title: "step", value: (i) => i.step },
      { title: "time", value: (i) => i.time, cell: (i) => new Date(i.time * 1000).toLocaleString() },
      { title: "changed", value: (i) => i.changes.join(", ") },
      { title: "chunk", value: (i) => i.chunk, cell: (i) => el("pre", { class: "chunk" }, i.chunk) },
    ], run.interventions, { redraw: drawInterventions }) : el("p", { class: "note" }, "none: nothing was changed through runner attach"));
  }

  function drawDetails() {
    const attempts = run.attempt_history || [];
    const sort = { column: undefined, redraw: drawDetails };
    details.replaceChildren(
      el("h2", {}, "Summary"), keyValueTable(run.summary),
      el("h2", {}, "Config"), keyValueTable(run.config),
      el("h2", {}, "Attempts"), sortableTable([
        { title: "attempt", value: (a) => a.attempt },
        { title: "status", value: (a) => a.status, cell: (a) => statusBadge(a.status) },
        { title: "steps", value: (a) => a.start_step, cell: (a) => `${formatValue(a.start_step)}-${formatValue(a.end_step)}` },
        { title: "world size", value: (a) => a.world_size },
        { title: "device", value: (a) => a.device },
        { title: "error", value: (a) => a.error },
      ], attempts, sort),
      el("h2", {}, "Checkpoints"), run.checkpoints.length ? sortableTable([
        { title: "step", value: (c) => c.step },
        { title: "path", value: (c) => c.path, cell: (c) => el("span", { class: "mono" }, c.path) },
        { title: "bytes", value: (c) => c.bytes },
        { title: "kept", value: (c) => (c.kept ? "yes" : "no") },
        { title: "metric", value: (c) => (c.metric ? `${c.metric} ${formatValue(c.metric_value)}` : null) },
      ], run.checkpoints, { redraw: drawDetails }) : el("p", { class: "note" }, "none"));
  }

  poll(`/api/run?${query({ run: reference })}`, (answer) => {
    run = answer.run;
    metricKeys = answer.metric_keys;
    metricSections = answer.metric_sections;
    header.replaceChildren(el("h1", {}, el("span", { class: "swatch", style: `background:${run.colour}` }), run.name, " ", statusBadge(run.status)),
      el("p", { class: "meta" }, el("span", { class: "mono" }, run.id), ` \u00b7 ${run.script} \u00b7 step ${run.step}`,
        ` \u00b7 ${formatDuration(run.duration)} \u00b7 ${run.device} \u00b7 world size ${run.world_size}`,
        run.sweep_name ? [" \u00b7 ", el("a", { href: `/sweep/${encodeURIComponent(run.sweep_name)}` }, `sweep ${run.sweep_name} trial ${run.trial}`)] : "",
        run.tags.length ? [" \u00b7 ", tagList(run.tags)] : ""),
      run.note ? el("p", { class: "run-note" }, run.note) : "");
    error.replaceChildren(run.error ? el("div", { class: "run-error" }, el("h3", {}, "Error"), el("pre", {}, run.error)) : "");
    drawCharts();
    drawSamples();
    drawHistograms();
    drawInterventions();
    drawDetails();
  });
}

function comparePage() {
  const runs = new URLSearchParams(location.search).getAll("run");
  const view = defaultView();
  // Grouped: each group of runs (by config, all but seed, as `runner runs --group`) drawn as a mean line and band.
  if (urlState.read("group") === "1") view.group = 1;
  const charts = new Map();
  const legend = el("div", { class: "controls" });
  const chartHolder = el("div", { class: "charts" });
  const config = el("div");
  const samples = el("div");
  const sampleSteps = new Map();  // grid name -> the step chosen, or null to follow the newest
  let showAll = false;
  let data = null;
  const redraw = (resetZoom) => charts.forEach((f) => f.load(resetZoom));
  const group = el("label", {}, el("input", { type: "checkbox", class: "group-runs", checked: view.group === 1, onchange: (event) => {
    view.group = event.target.checked ? 1 : undefined;
    urlState.write({ group: event.target.checked });
    redraw();
  } }), " group by config (all but seed): a mean line and band per group");
  page.replaceChildren(el("h1", {}, "Compare"), legend, chartControls(view, redraw), el("div", { class: "controls" }, group),
    chartHolder, el("h2", {}, "Samples"), samples, el("h2", {}, "Config"), config);

  // Each grid name's images side by side, one per run, at one step that the slider chooses among the steps any run
  // has a grid of; a run without a grid at that step says so. The slider opens at (and follows) the last step that
  // every run with such grids has one of, else the last step.
  function drawSamples() {
    const names = [...new Set(data.runs.flatMap((run) => run.images.map((image) => image.name)))].sort();
    if (!names.length) { samples.replaceChildren(el("p", { class: "note" }, "no sample grids")); return; }
    samples.replaceChildren(...names.map((name) => {
      const stepsOf = (run) => run.images.filter((i) => i.name === name).map((i) => i.step);
      const steps = [...new Set(data.runs.flatMap(stepsOf))].sort((a, b) => a - b);
      const having = data.runs.map(stepsOf).filter((own) => own.length);
      const shared = steps.filter((step) => having.every((own) => own.includes(step)));
      const opening = shared.length ? steps.indexOf(shared[shared.length - 1]) : steps.length - 1;
      const chosen = sampleSteps.get(name);
      const index = chosen === null || chosen === undefined || !steps.includes(chosen) ? opening : steps.indexOf(chosen);
      const input = el("input", { type: "range", min: 0, max: steps.length - 1, value: index });
      const caption = el("span");
      const row = el("div", { class: "grid-row" });
      const show = () => {
        const step = steps[Number(input.value)];
        sampleSteps.set(name, Number(input.value) === opening ? null : step);
        caption.textContent = ` step ${step} (${Number(input.value) + 1} of ${steps.length})`;
        row.replaceChildren(...data.runs.map((run) => {
          const image = run.images.find((i) => i.name === name && i.step === step);
          const title = el("div", { class: "grid-run" }, el("span", { class: "swatch", style: `background:${run.colour}` }), run.name);
          if (!image) return el("figure", { class: "grid-cell", "data-run": run.id }, title, el("p", { class: "note" }, `no grid at step ${step}`));
          const img = el("img", { alt: `${run.name} ${name} step ${step}`, src: `/image?${query({ run: run.id, path: image.path })}`,
            onload: () => { img.width = img.naturalWidth * Math.max(1, Math.floor(256 / img.naturalWidth)); } });
          return el("figure", { class: "grid-cell", "data-run": run.id }, title, img);
        }));
      };
      input.addEventListener("input", show);
      show();
      return el("div", { class: "grid-compare", "data-name": name }, el("h3", {}, name), input, caption, row);
    }));
  }

  function drawConfig() {
    const rows = data.config.filter((row) => showAll || row.differs);
    config.replaceChildren(el("label", {}, el("input", { type: "checkbox", checked: showAll,
      onchange: (event) => { showAll = event.target.checked; drawConfig(); } }), " show the keys that are the same too"),
      el("p", { class: "note" }, `${data.config.filter((r) => r.differs).length} of ${data.config.length} keys differ`),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "key"), data.runs.map((run) => el("th", {}, run.name)))),
        el("tbody", {}, rows.map((row) => el("tr", { class: row.differs ? "differs" : null }, el("th", { class: "mono" }, row.key),
          row.values.map((value) => el("td", { class: "config-value" }, formatValue(value)))))))));
  }

  poll(`/api/compare?${query({ run: runs })}`, (answer) => {
    data = answer;
    legend.replaceChildren(...data.runs.map((run) => el("span", {},
      el("span", { class: "swatch", style: `background:${run.colour}` }), runLink(run.id, run.name), " ", statusBadge(run.status))));
    for (const key of data.metric_keys) {
      if (charts.has(key)) charts.get(key).load();
      else chartHolder.append(charts.set(key, chartFigure(metricChartUrl(runs, key), view, null, true)).get(key));
    }
    drawSamples();
    drawConfig();
  });
}

function sweepsPage() {
  const holder = el("div");
  const sort = { column: undefined };
  page.replaceChildren(el("h1", {}, "Sweeps"), holder);
  poll("/api/sweeps", (data) => {
    sort.redraw = () => draw();
    const draw = () => holder.replaceChildren(data.sweeps.length ? sortableTable([
      { title: "name", value: (s) => s.name, cell: (s) => el("a", { href: `/sweep/${encodeURIComponent(s.name)}` }, s.name) },
      { title: "status", value: (s) => s.status, cell: (s) => statusBadge(s.status) },
      { title: "trials", value: (s) => s.trials },
      { title: "finished", value: (s) => s.statuses.finished || 0 },
      { title: "metric", value: (s) => `${s.metric} (${s.minimize ? "min" : "max"})` },
      { title: "best", value: (s) => (s.best ? s.best.value : null) },
      { title: "best trial", value: (s) => (s.best ? s.best.trial : null), cell: (s) => (s.best ? runLink(s.best.run, `trial ${s.best.trial}`) : "-") },
      { title: "created", value: (s) => s.created },
    ], data.sweeps, sort) : el("p", { class: "note" }, "no sweeps yet (runner sweep SWEEP.lua starts one)"));
    draw();
  });
}

function sweepPage(name) {
  const view = defaultView();
  const figures = [];
  const sort = { column: undefined };
  const header = el("div");
  const charts = el("div");
  const trials = el("div");
  page.replaceChildren(header, charts, el("h2", {}, "Trials"), trials);
  const sweepChart = (chart, extra) => (v) => `/chart/sweep.svg?${query({ sweep: name, chart, ...extra, ...v })}`;
  let layout = "";

  poll(`/api/sweep?${query({ sweep: name })}`, (data) => {
    header.replaceChildren(el("h1", {}, `Sweep ${data.name} `, statusBadge(data.status)), el("p", { class: "meta" }, data.summary),
      data.best_trial !== null ? el("p", {}, `best: trial ${data.best_trial} \u00b7 `, el("span", { class: "mono" }, data.best_command)) : "");
    // The charts are laid out again when the parameters change or the first rung result arrives; else reloaded.
    const rungs = !data.asha ? "none" : data.rungs.length ? "chart" : "waiting";
    const shape = `${data.parameters.map((p) => p.name).join(",")} ${rungs}`;
    if (shape !== layout) {
      layout = shape;
      figures.length = 0;
      const make = (url) => { const figure = chartFigure(url, view); figures.push(figure); return figure; };
      charts.replaceChildren(
        el("h2", {}, "The objective against each parameter"),
        el("div", { class: "charts" }, data.parameters.map((p) => make(sweepChart("objective", { param: p.name })))),
        el("h2", {}, "Parameter importance"), el("p", { class: "note" }, `${data.importance_method}.`),
        el("div", { class: "charts" }, make(sweepChart("importance"))),
        el("h2", {}, "Parallel coordinates"), el("div", { class: "charts" }, make(sweepChart("parallel"))),
        rungs === "none" ? "" : el("h2", {}, "ASHA rungs"),
        rungs === "chart" ? el("div", { class: "charts rungs" }, make(sweepChart("rungs"))) : "",
        rungs === "waiting" ? el("p", { class: "note" }, "no trial has reached a rung yet") : "",
        el("h2", {}, "Learning curves"), chartControls(view, (resetZoom) => figures.forEach((f) => f.load(resetZoom))),
        el("div", { class: "charts" }, make(sweepChart("curves"))));
    } else {
      figures.forEach((figure) => figure.load());
    }
    sort.redraw = () => drawTrials();
    const drawTrials = () => trials.replaceChildren(sortableTable([
      { title: "trial", value: (t) => t.trial, cell: (t) => `${t.trial}${t.trial === data.best_trial ? " \u2605" : ""}` },
      { title: "status", value: (t) => t.status, cell: (t) => statusBadge(t.status) },
      { title: data.metric, value: (t) => t.value },
      { title: "step", value: (t) => t.step },
      { title: "rung", value: (t) => t.rung },
      { title: "run", value: (t) => t.run, cell: (t) => (t.run ? runLink(t.run, t.run) : "-") },
      ...data.parameters.map((p) => ({ title: p.name, value: (t) => t.params[p.name] })),
      { title: "error", value: (t) => t.error || null },
    ], data.trials, sort));
    drawTrials();
  });
}

// ---- the page the path names ------------------------------------------------------------------------

const path = decodeURIComponent(location.pathname);
if (path.startsWith("/run/")) runPage(path.slice(5));
else if (path === "/compare") comparePage();
else if (path === "/sweeps") sweepsPage();
else if (path.startsWith("/sweep/")) sweepPage(path.slice(7));
else runsPage();
