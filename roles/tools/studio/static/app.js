// trinity studio: one page, three views (build, runs, a run and its trajectories).
// Everything from the server is written with textContent (el() below), never as HTML.
"use strict";

// -- small helpers ---------------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const node = tag === "svg" || SVG_TAGS.has(tag)
    ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else if (k === "style") node.style.cssText = v;  // CSSOM: the CSP forbids style attributes
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}
const SVG_TAGS = new Set(["polyline", "line", "text", "rect", "circle", "g", "title"]);

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", body: JSON.stringify(body),
    headers: {"Content-Type": "application/json", "X-Studio": "1"},
  };
  const resp = await fetch(path, opts);
  const data = await resp.json();
  if (!resp.ok && !("problems" in data)) throw new Error(data.error || resp.statusText);
  return data;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Math.abs(v) >= 1000 || Number.isInteger(v) ? String(Math.round(v * 1000) / 1000) : v.toPrecision(3);
  return String(v);
}

function getPath(obj, path) {
  return path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj);
}

function setPath(obj, path, value) {
  const keys = path.split(".");
  let o = obj;
  for (const k of keys.slice(0, -1)) {
    if (typeof o[k] !== "object" || o[k] === null || Array.isArray(o[k])) o[k] = {};
    o = o[k];
  }
  if (value === undefined) delete o[keys.at(-1)]; else o[keys.at(-1)] = value;
}

function status(text) { document.getElementById("status").textContent = text; }

const view = () => document.getElementById("view");
let cleanup = [];  // what the current view must stop when another opens (event streams)

// -- charts (SVG, no library) ----------------------------------------------------------------

const COLORS = ["#1f6feb", "#d1242f", "#2ea043", "#8250df", "#bf8700", "#0a7f8a"];

function chart(title, series, ylabel) {
  const W = 400, H = 180, L = 44, R = 8, T = 8, B = 22;
  const pts = series.flatMap(s => s.points).filter(p => p[1] !== null && Number.isFinite(p[1]));
  const box = el("div", {class: "chart card", "data-title": title}, el("div", {}, el("strong", {text: title}),
    ylabel ? el("span", {class: "muted", text: "  " + ylabel}) : null));
  if (!pts.length) { box.append(el("div", {class: "muted", text: "no data yet"})); return box; }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1])), Math.max(...pts.map(p => p[1]))];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none"},
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#99a"}),
    el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#99a"}),
    el("text", {x: L - 4, y: T + 8, "text-anchor": "end", "font-size": 10, text: fmt(y1)}),
    el("text", {x: L - 4, y: H - B, "text-anchor": "end", "font-size": 10, text: fmt(y0)}),
    el("text", {x: L, y: H - 6, "font-size": 10, text: fmt(x0)}),
    el("text", {x: W - R, y: H - 6, "text-anchor": "end", "font-size": 10, text: fmt(x1)}));
  const legend = el("div", {class: "legend"});
  series.forEach((s, i) => {
    const good = s.points.filter(p => p[1] !== null && Number.isFinite(p[1]));
    if (!good.length) return;
    const c = COLORS[i % COLORS.length];
    svg.append(el("polyline", {fill: "none", stroke: c, "stroke-width": 1.5,
      points: good.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ")}));
    if (good.length < 40) good.forEach(p => svg.append(el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2, fill: c},
      el("title", {text: `${s.name} step ${p[0]}: ${fmt(p[1])}`}))));
    legend.append(el("span", {style: `color:${c}`, text: `■ ${s.name} ${fmt(good.at(-1)[1])}`}));
  });
  box.append(svg, legend);
  return box;
}

function seriesOf(records, kind, key, name, taskset) {
  return {name: name || key, points: records.filter(r => r.kind === kind && (taskset === undefined || r.taskset === taskset)
    && r.values && key in r.values).map(r => [r.step, r.values[key]])};
}

// -- router ----------------------------------------------------------------------------------

const ROUTES = [
  [/^#\/build$/, () => buildView()],
  [/^#\/runs$/, () => runsView()],
  [/^#\/run\/([\w.-]+)\/([\w.-]+)$/, m => runView(m[1], m[2])],
  [/^#\/traj\/([\w.-]+)\/([\w.-]+)$/, m => trajView(m[1], m[2])],
];

function route() {
  cleanup.forEach(f => f());
  cleanup = [];
  const hash = (location.hash || "#/runs").split("?")[0];
  document.querySelectorAll("header nav a").forEach(a => a.classList.toggle("active", hash.startsWith(a.getAttribute("href"))));
  for (const [re, fn] of ROUTES) {
    const m = hash.match(re);
    if (m) { view().replaceChildren(el("div", {class: "muted", text: "loading…"})); fn(m).catch(showError); return; }
  }
  location.hash = "#/runs";
}

function query() { return new URLSearchParams((location.hash.split("?")[1]) || ""); }
function showError(e) { view().replaceChildren(el("div", {class: "card error", id: "view-error", text: String(e.message || e)})); }

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

// -- build -----------------------------------------------------------------------------------

const builder = {form: null, examples: [], doc: {}, expert: false, timer: null, result: null};

async function buildView() {
  if (!builder.form) Object.assign(builder, await api("/api/schema"));
  const picker = el("select", {id: "example", onchange: async e => {
    if (!e.target.value) return;
    builder.doc = await api("/api/example?path=" + encodeURIComponent(e.target.value));
    renderForm(); validateSoon(0);
  }}, el("option", {value: "", text: "start from an example…"}), builder.examples.map(x => el("option", {value: x, text: x})));
  const mode = el("label", {}, el("input", {type: "checkbox", id: "expert", checked: builder.expert, onchange: e => {
    builder.expert = e.target.checked; renderForm();
  }}), " expert view (every field)");
  const path = el("input", {id: "save-path", size: 40, value: "studio_configs/" + (builder.doc.name || "run") + ".yaml"});
  const out = el("div", {class: "col"},
    el("div", {class: "card"}, el("h3", {text: "Check"}), el("div", {id: "problems"}), el("div", {id: "warnings"})),
    el("div", {class: "card"}, el("div", {}, "Save to ", path, " ",
      el("button", {id: "save", onclick: save, disabled: builder.read_only}, "Save"), " ",
      el("button", {id: "run", class: "primary", onclick: run, disabled: builder.read_only}, "Run")),
      el("div", {id: "run-status", class: "muted", text: builder.read_only
        ? "this studio is read-only: it cannot save or run (start it without --read-only)"
        : "Run starts trinity run, which runs this config's code (plugins, Data-Juicer recipes) as the studio's owner"})),
    el("div", {class: "card"}, el("div", {class: "tabs"},
      el("button", {id: "tab-yaml", class: "on", onclick: () => showYaml("yaml")}, "your YAML"),
      el("button", {id: "tab-resolved", onclick: () => showYaml("resolved")}, "resolved (trinity config)")),
      el("pre", {id: "yaml", class: "yaml"})));
  view().replaceChildren(el("h2", {text: "Build a config"}),
    el("div", {class: "row"}, el("div", {class: "col card"}, el("div", {}, picker, "  ", mode),
      el("div", {id: "form", class: "form"})), out));
  renderForm();
  if (Object.keys(builder.doc).length) validateSoon(0);
}

function visible(f) {
  return f.kind === "section" ? f.fields.some(visible) : builder.expert || f.beginner;
}

function renderForm() {
  const box = document.getElementById("form");
  if (!box) return;
  const render = fields => fields.filter(visible).map(f => f.kind === "section"
    ? el("details", {open: !builder.expert || f.path.split(".").length < 2}, el("summary", {text: f.path, title: f.help}), render(f.fields))
    : fieldRow(f));
  box.replaceChildren(...render(builder.form));
}

function fieldRow(f) {
  const id = "f-" + f.path;
  const cur = getPath(builder.doc, f.path);
  let input;
  if (f.kind === "bool") {
    input = el("select", {id}, el("option", {value: "", text: `(default: ${f.default})`}),
      el("option", {value: "true", text: "true", selected: cur === true}), el("option", {value: "false", text: "false", selected: cur === false}));
  } else if (f.kind === "enum") {
    input = el("select", {id}, el("option", {value: "", text: `(default: ${f.default})`}),
      f.choices.map(c => el("option", {value: c, text: c, selected: cur === c})));
  } else if (f.kind === "yaml") {
    input = el("textarea", {id, rows: cur === undefined ? 1 : Math.min(12, JSON.stringify(cur, null, 1).split("\n").length),
      placeholder: "JSON, default " + JSON.stringify(f.default)});
    input.value = cur === undefined ? "" : JSON.stringify(cur, null, 1);
  } else {
    input = el("input", {id, placeholder: f.default === null ? "" : String(f.default), size: 30});
    input.value = cur === undefined || cur === null ? "" : String(cur);
  }
  input.addEventListener("change", () => onField(f, input));
  return el("div", {class: "field"}, el("label", {for: id, text: f.path, title: f.path}), input,
    el("div", {class: "help muted", text: f.help}), el("div", {class: "error", id: "err-" + f.path}));
}

function onField(f, input) {
  const raw = input.value.trim();
  let value;
  const err = document.getElementById("err-" + f.path);
  err.textContent = "";
  if (raw === "") value = undefined;
  else if (f.kind === "bool") value = raw === "true";
  else if (f.kind === "int" && /^-?\d+$/.test(raw)) value = parseInt(raw, 10);
  else if (f.kind === "float" && raw !== "" && !isNaN(Number(raw))) value = Number(raw);
  else if (f.kind === "yaml") {
    try { value = JSON.parse(raw); } catch (e) { err.textContent = "not JSON: " + e.message; input.classList.add("bad"); return; }
  } else value = raw;  // a number field with text in it: the loader refuses it, naming the field
  setPath(builder.doc, f.path, value);
  validateSoon();
}

function validateSoon(ms = 300) {
  clearTimeout(builder.timer);
  builder.timer = setTimeout(async () => {
    status("checking…");
    builder.result = await api("/api/validate", {doc: builder.doc});
    status(builder.result.ok ? "config is valid" : `${builder.result.problems.length} problem(s)`);
    showResult();
  }, ms);
}

function showResult() {
  const r = builder.result;
  document.querySelectorAll(".field .error").forEach(e => { e.textContent = ""; });
  document.querySelectorAll(".bad").forEach(e => e.classList.remove("bad"));
  const list = document.getElementById("problems");
  list.replaceChildren(r.ok ? el("div", {class: "ok", id: "valid", text: "✓ valid: trinity config accepts it"}) : "");
  for (const p of r.problems) {
    const at = p.field && document.getElementById("err-" + fieldFor(p.field));
    if (at) {
      at.textContent = p.message;
      document.getElementById("f-" + fieldFor(p.field)).classList.add("bad");
    }
    list.append(el("div", {class: "error problem", text: p.message}));
  }
  document.getElementById("warnings").replaceChildren(...r.warnings.map(w => el("div", {class: "warn", text: w})));
  showYaml(document.getElementById("tab-resolved").classList.contains("on") ? "resolved" : "yaml");
}

function fieldFor(path) {  // "a.b[0].c" is shown in the form as "a.b"
  let p = path.replace(/\[.*$/, "");
  while (p && !document.getElementById("f-" + p)) p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "";
  return p;
}

function showYaml(which) {
  document.getElementById("tab-yaml").classList.toggle("on", which === "yaml");
  document.getElementById("tab-resolved").classList.toggle("on", which === "resolved");
  const r = builder.result || {yaml: "", resolved: ""};
  document.getElementById("yaml").textContent = which === "yaml" ? r.yaml : (r.resolved || "(fix the problems first)");
}

async function save() {
  const r = await api("/api/save", {doc: builder.doc, path: document.getElementById("save-path").value});
  document.getElementById("run-status").textContent = r.error || "saved to " + r.path;
}

async function run() {
  const st = document.getElementById("run-status");
  st.textContent = "starting…";
  const r = await api("/api/run", {doc: builder.doc, path: document.getElementById("save-path").value});
  if (!r.started) { builder.result = r; showResult(); st.textContent = r.error || "not started: fix the problems"; return; }
  st.textContent = `trinity run started (pid ${r.pid}); waiting for its job folder…`;
  for (let i = 0; i < 240; i++) {
    const l = await api("/api/launch/" + r.pid);
    if (l.job) { location.hash = "#/run/" + l.job; return; }
    if (l.exit_code !== null) { st.textContent = `trinity run exited with ${l.exit_code} before its job started (its output: ${l.log})`; return; }
    await new Promise(res => setTimeout(res, 500));
  }
}

// -- runs ------------------------------------------------------------------------------------

async function runsView() {
  const data = await api("/api/jobs");
  const picked = new Set();
  const cmp = el("div", {id: "compare"});
  const rows = data.jobs.map(j => el("tr", {"data-job": j.key},
    el("td", {}, el("input", {type: "checkbox", class: "pick", onchange: e => {
      e.target.checked ? picked.add(j.key) : picked.delete(j.key);
      compare([...picked], cmp);
    }})),
    el("td", {}, el("a", {href: "#/run/" + j.key, text: j.key}), j.record && j.record.renamed_from
      ? el("div", {class: "muted", text: "renamed from " + j.record.renamed_from.split("/").slice(-1)[0]}) : null,
      j.record && j.record.sweep ? el("div", {class: "muted"}, `one of a sweep of ${j.record.sweep.length}: `,
        el("button", {class: "sweep-compare", onclick: () => pickSweep(j)}, "compare them")) : null),
    el("td", {}, el("span", {class: "badge " + j.state, text: j.state})),
    el("td", {}, j.figures.stages.map(s => el("div", {},
      el("strong", {text: s.label + " "}),
      s.train_step !== undefined ? `train step ${s.train_step} ` : "",
      s.reward !== undefined && s.reward !== null ? `reward ${fmt(s.reward)} ` : "",
      Object.entries(s.eval || {}).map(([t, v]) => `eval ${t} ${fmt(v[0])}→${fmt(v[1])} `)))),
    el("td", {class: "muted", text: new Date(j.figures.updated * 1000).toLocaleString()}),
    el("td", {}, el("a", {href: "#/traj/" + j.key, text: "trajectories"}))));
  function pickSweep(j) {  // a sweep's runs side by side: tick each one of them, untick the rest
    const project = j.key.split("/")[0];
    const keys = new Set(j.record.sweep.map(n => `${project}/${n}`));
    picked.clear();
    for (const row of rows) {
      const on = keys.has(row.dataset.job);
      row.querySelector("input.pick").checked = on;
      if (on) picked.add(row.dataset.job);
    }
    compare([...picked], cmp);
  }
  view().replaceChildren(el("h2", {text: `Runs under ${data.root}`}),
    el("div", {class: "card"}, el("table", {id: "runs"}, el("tr", {}, ["", "job", "state", "stages", "updated", ""].map(h => el("th", {text: h}))), rows),
      data.jobs.length ? el("div", {class: "muted", text: "tick two runs to compare their curves"}) : el("div", {text: "no jobs yet: build and run one"})),
    cmp);
}

async function compare(keys, box) {
  if (keys.length < 2) { box.replaceChildren(); return; }
  const jobs = await Promise.all(keys.slice(0, 8).map(k => api("/api/jobs/" + k)));
  const last = j => j.metrics[j.stages.at(-1).label] || [];
  box.replaceChildren(el("div", {class: "charts"},
    chart("eval accuracy (last stage)", jobs.map(j => ({...seriesOf(last(j), "eval", "accuracy"), name: j.key}))),
    chart("rollout reward (last stage)", jobs.map(j => ({...seriesOf(last(j), "rollout", "reward_mean"), name: j.key})))));
}

// -- a run -----------------------------------------------------------------------------------

async function runView(project, name) {
  const key = `${project}/${name}`;
  const job = await api("/api/jobs/" + key);
  let stage = query().get("stage") || [...job.stages].reverse().find(s => (job.metrics[s.label] || []).length)?.label || job.stages.at(-1).label;
  const head = el("div", {id: "run-head"});
  const charts = el("div", {class: "charts", id: "charts"});
  const bus = el("div", {id: "bus"}, el("div", {class: "muted", text: "bus: asking…"}));
  const sync = el("div", {id: "sync"});
  const tabs = el("div", {class: "tabs"}, job.stages.map(s => el("button", {class: s.label === stage ? "on" : "",
    onclick: e => { stage = s.label; tabs.querySelectorAll("button").forEach(b => b.classList.toggle("on", b === e.target)); draw(); }}, s.label)));
  view().replaceChildren(el("h2", {}, key, " ", el("a", {href: "#/traj/" + key, class: "muted", text: "trajectories →"})),
    head, el("div", {class: "card"}, tabs, charts), el("div", {class: "row"}, el("div", {class: "col card"}, el("h3", {text: "Sync timeline"}), sync),
      el("div", {class: "col card"}, el("h3", {text: "Bus"}), bus)));
  let pending = false;
  function draw() {
    pending = false;
    renderHead(job, head);
    renderCharts(job.metrics[stage] || [], job.sync[stage] || [], charts);
    renderSync(job.sync[stage] || [], sync);
  }
  draw();
  const q = new URLSearchParams();
  for (const [label, [m, s]] of Object.entries(job.offsets)) { q.set("m_" + label, m); q.set("s_" + label, s); }
  const es = new EventSource(`/api/jobs/${key}/events?${q}`);
  es.addEventListener("records", ev => {
    const d = JSON.parse(ev.data);
    (job.metrics[d.stage] ||= []).push(...d.metrics);
    (job.sync[d.stage] ||= []).push(...d.sync);
    if (!pending) { pending = true; setTimeout(draw, 250); }
  });
  es.addEventListener("run", ev => { Object.assign(job, JSON.parse(ev.data)); renderHead(job, head); });
  es.addEventListener("bus", ev => { job.bus = JSON.parse(ev.data); renderBus(job.bus, bus); renderHead(job, head); });
  cleanup.push(() => es.close());
}

function renderHead(job, box) {
  const roles = {...((job.record || {}).roles || {})};
  const busRoles = (job.bus && job.bus.roles) || {};
  const names = [...new Set([...Object.keys(roles), ...Object.keys(busRoles)])].sort();
  box.replaceChildren(el("div", {class: "card"},
    el("div", {}, "state ", el("span", {class: "badge " + job.state, id: "run-state", text: job.state})),
    el("table", {id: "progress"}, job.stages.map(s => {
      const recs = job.metrics[s.label] || [];
      const train = recs.filter(r => r.kind === "train").at(-1), ro = recs.filter(r => r.kind === "rollout").at(-1);
      const step = train ? train.step : ro ? ro.step : 0;
      const pct = s.total_steps ? Math.min(100, 100 * step / s.total_steps) : (recs.length ? 100 : 0);
      return el("tr", {"data-stage": s.label}, el("td", {text: `${s.label} (${s.mode || "?"})`}),
        el("td", {}, el("span", {class: "progress"}, el("div", {style: `width:${pct}%`})),
          ` step ${step}${s.total_steps ? "/" + s.total_steps : ""}`),
        el("td", {class: "muted", text: ro ? `explorer step ${ro.step}, weights v${fmt(ro.values.model_version)}` : ""}));
    })),
    names.length ? el("table", {id: "roles"}, el("tr", {}, ["role", "state", "restarts", "heartbeat", "version"].map(h => el("th", {text: h}))),
      names.map(n => el("tr", {}, el("td", {text: n}), el("td", {text: (roles[n] || {}).state || busRoles[n].state || "–"}),
        el("td", {text: fmt((roles[n] || {}).restarts)}),
        el("td", {text: busRoles[n] && busRoles[n].heartbeat_age_s !== undefined ? `${busRoles[n].heartbeat_age_s}s ago` : "–"}),
        el("td", {text: fmt((busRoles[n] || {}).model_version)})))) : null));
}

function renderCharts(recs, sync, box) {
  const evalSets = [...new Set(recs.filter(r => r.kind === "eval").map(r => r.taskset))];
  const syncSecs = sync.filter(e => e.kind === "weights_sent" && e.info && e.info.seconds !== undefined).map(e => [e.step, e.info.seconds]);
  box.replaceChildren(
    chart("reward", [seriesOf(recs, "rollout", "reward_mean", "rollout"), seriesOf(recs, "train", "reward_mean", "trained on")]),
    chart("eval accuracy", evalSets.map(t => seriesOf(recs, "eval", "accuracy", t || "eval", t))),
    chart("loss", [seriesOf(recs, "train", "loss"), seriesOf(recs, "train", "pg_loss")]),
    chart("KL", [seriesOf(recs, "train", "ppo_kl"), seriesOf(recs, "train", "kl_loss")]),
    chart("entropy", [seriesOf(recs, "train", "entropy")]),
    chart("grad norm", [seriesOf(recs, "train", "grad_norm")]),
    chart("step time", [seriesOf(recs, "train", "step_time_s", "trainer step"), seriesOf(recs, "rollout", "step_seconds", "explorer step"),
      {name: "weight sync", points: syncSecs}], "seconds"),
    chart("weights version", [seriesOf(recs, "rollout", "model_version", "explorer holds"),
      {name: "trainer made", points: recs.filter(r => r.kind === "train").map(r => [r.step, r.step])},
      seriesOf(recs, "train", "staleness_mean", "staleness (trained on)")]),
  );
}

function renderSync(events, box) {
  if (!events.length) { box.replaceChildren(el("div", {class: "muted", text: "no weight syncs (yet)"})); return; }
  const kinds = [...new Set(events.map(e => e.kind))];
  const t0 = Math.min(...events.map(e => e.created_at)), t1 = Math.max(...events.map(e => e.created_at)) || t0 + 1;
  const W = 600, row = 18;
  const svg = el("svg", {viewBox: `0 0 ${W} ${kinds.length * row + 4}`, preserveAspectRatio: "none", style: `height:${kinds.length * row + 4}px`});
  kinds.forEach((k, i) => svg.append(el("text", {x: 0, y: i * row + 13, "font-size": 10, text: k})));
  for (const e of events) {
    const i = kinds.indexOf(e.kind), x = 90 + (e.created_at - t0) / Math.max(t1 - t0, 1e-9) * (W - 100);
    svg.append(el("rect", {x, y: i * row + 3, width: 2, height: row - 6, fill: COLORS[i % COLORS.length]},
      el("title", {text: `${e.kind} v${e.model_version} step ${e.step} (${e.method})`})));
  }
  box.replaceChildren(el("div", {class: "timeline"}, svg), el("table", {}, el("tr", {}, ["kind", "version", "step", "method", "from"].map(h => el("th", {text: h}))),
    events.slice(-8).reverse().map(e => el("tr", {}, [e.kind, e.model_version, e.step, e.method, e.source].map(v => el("td", {text: fmt(v)}))))));
}

function renderBus(b, box) {
  if (!b.reachable) { box.replaceChildren(el("div", {class: "muted", text: `bus not reachable (${b.error || ""}): a finished run's embedded server stops with it`})); return; }
  const streams = Object.entries(b.streams).filter(([, s]) => s.exists);
  box.replaceChildren(
    el("table", {id: "streams"}, el("tr", {}, ["stream", "messages", "consumer", "pending", "ack pending", "redelivered"].map(h => el("th", {text: h}))),
      streams.flatMap(([kind, s]) => (s.consumers.length ? s.consumers : [{}]).map((c, i) => el("tr", {},
        el("td", {text: i ? "" : kind}), el("td", {text: i ? "" : fmt(s.messages)}), el("td", {text: c.name || "–"}),
        el("td", {text: fmt(c.pending)}), el("td", {text: fmt(c.ack_pending)}), el("td", {text: fmt(c.redelivered)}))))),
    el("h3", {}, "Dead letters ", el("span", {class: "badge", id: "dlq-count", text: String(b.dead_letters)})),
    b.letters.length ? el("table", {id: "dead-letters"}, el("tr", {}, ["seq", "from", "reason"].map(h => el("th", {text: h}))),
      b.letters.map(l => el("tr", {}, el("td", {text: l.seq}), el("td", {text: l.headers["Trinity-Original-Stream"] || l.subject}),
        el("td", {class: "reason", text: l.reason})))) : el("div", {class: "muted", text: "none"}));
}

// -- trajectories ----------------------------------------------------------------------------

async function trajView(project, name) {
  const key = `${project}/${name}`;
  const job = await api("/api/jobs/" + key);
  const q = query();
  const stage = q.get("stage") || [...job.stages].reverse().find(s => s.mode !== "bench")?.label || job.stages.at(-1).label;
  const kept = (await api(`/api/jobs/${key}/steps?stage=${encodeURIComponent(stage)}`)).steps;
  const step = Number(q.get("step") || kept.at(-1) || 0), other = q.get("cmp") ? Number(q.get("cmp")) : null;
  const go = (k, v) => { const p = query(); p.set("stage", stage); v === null ? p.delete(k) : p.set(k, v); location.hash = `#/traj/${key}?${p}`; };
  const filters = {taskset: "", min: "", max: "", truncated: false, color: "logprob"};
  const stepSel = (id, cur, k, none) => el("select", {id, onchange: e => go(k, e.target.value || null)},
    none ? el("option", {value: "", text: none}) : null, kept.map(s => el("option", {value: s, text: "step " + s, selected: s === cur})));
  const body = el("div", {class: "row", id: "traj"});
  const controls = el("div", {class: "card"},
    el("select", {id: "stage", onchange: e => { location.hash = `#/traj/${key}?stage=${e.target.value}`; }},
      job.stages.map(s => el("option", {value: s.label, text: s.label, selected: s.label === stage}))), " ",
    stepSel("step", step, "step"), " compare with ", stepSel("cmp", other, "cmp", "(none)"), " ",
    el("input", {id: "f-taskset", placeholder: "taskset", size: 10, onchange: e => { filters.taskset = e.target.value; draw(); }}), " reward ",
    el("input", {id: "f-min", placeholder: "min", size: 4, onchange: e => { filters.min = e.target.value; draw(); }}), "–",
    el("input", {id: "f-max", placeholder: "max", size: 4, onchange: e => { filters.max = e.target.value; draw(); }}), " ",
    el("label", {}, el("input", {type: "checkbox", id: "f-trunc", onchange: e => { filters.truncated = e.target.checked; draw(); }}), " truncated only"), " colour by ",
    el("select", {id: "f-color", onchange: e => { filters.color = e.target.value; draw(); }},
      el("option", {value: "logprob", text: "log-prob"}), el("option", {value: "advantage", text: "advantage"})));
  view().replaceChildren(el("h2", {}, el("a", {href: "#/run/" + key, text: key}), ` · ${stage} · trajectories`), controls, body);
  if (!kept.length) { body.replaceChildren(el("div", {class: "card muted", text: "no kept steps yet (the trainer keeps monitor.trajectory_steps)"})); return; }
  const steps = [await api(`/api/jobs/${key}/steps/${step}?stage=${encodeURIComponent(stage)}`)];
  if (other !== null) steps.push(await api(`/api/jobs/${key}/steps/${other}?stage=${encodeURIComponent(stage)}`));
  function draw() { body.replaceChildren(...steps.map(s => el("div", {class: "col"}, stepColumn(s, filters)))); }
  draw();
}

function keep(e, f) {
  if (f.taskset && e.taskset !== f.taskset) return false;
  if (f.min !== "" && !(e.reward >= Number(f.min))) return false;
  if (f.max !== "" && !(e.reward <= Number(f.max))) return false;
  return !f.truncated || e.prompt_truncated || e.response_truncated;
}

function stepColumn(s, f) {
  const exps = s.experiences.filter(e => keep(e, f));
  const rewards = exps.map(e => e.reward).filter(r => r !== null);
  return [el("h3", {text: `step ${s.step}: ${exps.length} of ${s.experiences.length} experiences, mean reward ${fmt(rewards.reduce((a, b) => a + b, 0) / (rewards.length || 1))}`}),
    s.decoded ? null : el("div", {class: "warn", text: "the run's tokenizer did not load: token ids shown"}),
    exps.slice(0, 200).map(e => expCard(e, f.color))];
}

function tokColor(v, by) {
  if (v === null || v === undefined) return "transparent";
  if (by === "advantage") {
    const a = Math.max(-1, Math.min(1, v));
    return a >= 0 ? `rgba(46,160,67,${0.15 + 0.6 * a})` : `rgba(207,34,46,${0.15 - 0.6 * a})`;
  }
  const p = Math.exp(Math.max(v, -20));  // the token's probability under the sampler
  return `rgba(31,111,235,${(0.1 + 0.7 * (1 - p)).toFixed(2)})`;
}

function expCard(e, by) {
  const cls = e.reward === null ? "" : e.reward > 0 ? "good" : "bad";
  return el("div", {class: "exp " + cls, "data-id": e.id},
    el("div", {class: "muted"}, `${e.id} · group ${e.group_id} · reward ${fmt(e.reward)} · v${e.model_version} · staleness ${e.staleness}`,
      e.prompt_truncated ? " · prompt truncated" : "", e.response_truncated ? " · response truncated" : ""),
    e.messages.length > 1 ? el("div", {class: "episode"}, e.messages.map(turn)) : el("pre", {class: "prompt", text: e.prompt}),
    el("div", {class: "response"}, e.tokens.map(t => el("span", {class: "tok" + (t.trained ? "" : " untrained"),
      style: `background:${tokColor(by === "advantage" ? t.advantage : t.logprob, by)}`,
      title: `log-prob ${fmt(t.logprob)} · advantage ${fmt(t.advantage)}`, text: t.t}))));
}

function turn(m) {
  const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
  return el("div", {class: "turn"}, el("div", {class: "role", text: m.role + (m.name ? ` (${m.name})` : "")}),
    content ? el("pre", {text: content}) : null,
    (m.tool_calls || []).map(c => el("pre", {class: "tool-call", text: `→ ${c.function ? c.function.name : c.name}(${c.function ? c.function.arguments : JSON.stringify(c.arguments)})`})));
}
