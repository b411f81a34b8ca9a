/* trainguard dashboard and HTML report: draws a page from its JSON data block with plotly.js.
   Tables are built with DOM calls and textContent only, so nothing from a run's events is ever parsed as HTML.
   Plotly does parse its strings (a subset of HTML: <a href>, <b>, <br>, <span style>), so every text from run
   data that reaches a plot (trace names, hover text, labels) goes through plain() first. */
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("tg-config").textContent);
  var COLORS = { step: "#2458c6", failures: "#c0392b", detections: "#e67e22", restarts: "#2c7be5",
                 planned: "#7f8c8d", checkpoints: "#2f855a", failed_checkpoints: "#c0392b",
                 restores: "#8e44ad", stragglers: "#d35400" };
  var MARKERS = [
    ["failures", "failure (onset)", "x", 9],
    ["detections", "detection", "triangle-down", 9],
    ["restarts", "restart (resumed step)", "triangle-up", 9],
    ["planned", "planned stop", "diamond", 9],
    ["checkpoints", "checkpoint saved", "line-ns-open", 7],
    ["failed_checkpoints", "checkpoint failed", "x-thin-open", 8],
    ["restores", "checkpoint restored", "circle-open", 8],
    ["stragglers", "straggler named", "star", 11]
  ];
  var PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"] };

  // --- formatting (same rules as the terminal report) ---------------------------------------------
  function fmtSeconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return "-";
    var neg = s < 0; s = Math.abs(s);
    var out;
    if (s < 60) out = s.toFixed(1) + " s";
    else if (s < 3600) out = Math.floor(s / 60) + " min " + pad(Math.floor(s % 60)) + " s";
    else if (s < 86400) out = Math.floor(s / 3600) + " h " + pad(Math.floor(s % 3600 / 60)) + " min";
    else out = Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
    return (neg ? "-" : "") + out;
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function pct(x, digits) { return (x * 100).toFixed(digits === undefined ? 1 : digits) + "%"; }
  function list(xs, max) {
    if (!xs || !xs.length) return "";
    var shown = xs.slice(0, max || 6).join(",");
    return xs.length > (max || 6) ? shown + ",… (+" + (xs.length - (max || 6)) + ")" : shown;
  }

  // --- DOM helpers ------------------------------------------------------------------------------
  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (attrs[k] === null || attrs[k] === undefined) return;
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function cell(text, value, cls) { return el("td", { text: text, "data-value": value, cls: cls }); }
  function fillBody(table, rows) {
    var body = table.tBodies[0];
    var fresh = el("tbody");
    rows.forEach(function (r) { fresh.appendChild(r); });
    table.replaceChild(fresh, body);
  }
  // Plotly splits a string into tags and text, then decodes entities in the text only: with <, > and & as
  // entities, host names, failure kinds and errors are drawn as the characters they are, never as markup.
  function plain(s) {
    if (s === null || s === undefined) return s;
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function safeHref(url) {
    // Only our own relative links or http(s); never javascript: URLs from data.
    return /^(https?:\/\/|\/|\.{0,2}[A-Za-z0-9_.@%-])/.test(url) && !/^javascript:/i.test(url) ? url : "#";
  }
  function plot(id, data, layout) {
    var base = { margin: { l: 60, r: 20, t: 10, b: 40 }, font: { size: 12 }, hovermode: "closest",
                 paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", legend: { orientation: "h", y: -0.18 } };
    return Plotly.react(id, data, Object.assign(base, layout || {}), PLOT_CONFIG);
  }
  function toDate(start) {
    return function (t) { return t === null ? null : new Date((start + t) * 1000); };
  }

  // --- the run page -----------------------------------------------------------------------------
  function renderSummary(view) {
    var r = view.report;
    $("ettr").textContent = pct(r.ettr, 1);
    $("ettr").setAttribute("data-value", r.ettr);
    $("wall").textContent = fmtSeconds(r.wall_seconds);
    $("wall").setAttribute("data-value", r.wall_seconds);
    $("productive").textContent = fmtSeconds(r.productive_seconds);
    $("productive").setAttribute("data-value", r.productive_seconds);
    $("steps").textContent = r.completed_steps + (r.target_steps ? " / " + r.target_steps : "");
    $("steps").setAttribute("data-value", r.completed_steps);
    $("attempts").textContent = r.attempts;
    $("attempts").setAttribute("data-value", r.attempts);
    $("interruption-count").textContent = r.interruptions.length;
    $("interruption-count").setAttribute("data-value", r.interruptions.length);
    var badges = $("badges");
    badges.textContent = "";
    badges.appendChild(el("span", { cls: "badge " + r.status, text: r.status, id: "status" }));
    if (r.synthetic) badges.appendChild(el("span", { cls: "badge synthetic", text: "synthetic" }));
    var warnings = $("warnings");
    warnings.textContent = "";
    r.warnings.forEach(function (w) { warnings.appendChild(el("li", { text: w })); });
    if (view.run.simulated && config.sim_url) {
      $("sim-link").hidden = false;
      $("sim-href").setAttribute("href", config.sim_url);
    }
  }

  function renderTimeline(view) {
    var d = toDate(view.run.start_epoch);
    var p = view.timeline.progress;
    var traces = [{
      name: "step", type: "scatter", mode: "lines", x: p.t.map(d), y: p.step, customdata: p.attempt,
      line: { color: COLORS.step, width: 1.5 }, connectgaps: false,
      hovertemplate: "%{x}<br>step %{y}<br>attempt %{customdata}<extra></extra>"
    }];
    MARKERS.forEach(function (m) {
      var c = view.timeline.markers[m[0]];
      if (!c || !c.t.length) return;
      // Thousands of checkpoint marks hide the line: past a few hundred they start switched off (click the legend).
      var crowded = c.count > 300 && ["checkpoints", "failed_checkpoints", "restores"].indexOf(m[0]) >= 0;
      traces.push({
        visible: crowded ? "legendonly" : true,
        name: m[1], type: "scatter", mode: "markers", x: c.t.map(d), y: c.step, hovertext: c.label.map(plain),
        hovertemplate: "%{x}<br>%{hovertext}<extra></extra>", meta: { kind: m[0], count: c.count },
        marker: { symbol: m[2], size: m[3], color: COLORS[m[0]], line: { width: 1.5, color: COLORS[m[0]] } }
      });
    });
    return plot("timeline", traces, { xaxis: { type: "date", title: { text: "time (UTC)" } },
                                      yaxis: { title: { text: "step" }, rangemode: "tozero" } });
  }

  function renderThroughput(view) {
    var d = toDate(view.run.start_epoch);
    var s = view.report.steps_per_second;
    return plot("throughput", [{
      name: "steps/s", type: "bar", x: s.map(function (b) { return d(b.t_seconds); }),
      y: s.map(function (b) { return b.steps_per_second; }), marker: { color: "#9db4e8" },
      hovertemplate: "%{x}<br>%{y:.3g} steps/s<extra></extra>"
    }], { xaxis: { type: "date" }, yaxis: { title: { text: "steps/s" }, rangemode: "tozero" }, showlegend: false,
          margin: { l: 60, r: 20, t: 5, b: 30 } });
  }

  function renderWaterfall(view) {
    var r = view.report, wall = r.wall_seconds || 1;
    var order = view.bucket_order;
    var x = ["wall time"].concat(order.map(function (b) { return plain(view.bucket_labels[b]); })).concat(["productive"]);
    var y = [r.wall_seconds].concat(order.map(function (b) { return -r.badput_seconds[b]; })).concat([0]);
    var text = [fmtSeconds(r.wall_seconds)].concat(order.map(function (b) {
      var s = r.badput_seconds[b];
      return s > 0 ? "−" + fmtSeconds(s) + " (" + pct(s / wall, 2) + ")" : "0";
    })).concat([fmtSeconds(r.productive_seconds) + " (ETTR " + pct(r.ettr, 1) + ")"]);
    var measure = ["absolute"].concat(order.map(function () { return "relative"; })).concat(["total"]);
    var rows = [el("tr", { "data-bucket": "productive" }, [cell("productive training"),
      cell(fmtSeconds(r.productive_seconds), r.productive_seconds, "num"), cell(pct(r.productive_seconds / wall, 2), null, "num")])];
    order.forEach(function (b) {
      var s = r.badput_seconds[b];
      rows.push(el("tr", { "data-bucket": b }, [cell(view.bucket_labels[b]), cell(fmtSeconds(s), s, "num"),
        cell(pct(s / wall, 2), null, "num")]));
    });
    fillBody($("buckets"), rows);
    return plot("waterfall", [{
      type: "waterfall", name: "time", orientation: "v", x: x, y: y, measure: measure, text: text,
      textposition: "outside", cliponaxis: false, customdata: [r.wall_seconds].concat(order.map(function (b) {
        return r.badput_seconds[b]; })).concat([r.productive_seconds]),
      hovertemplate: "%{x}: %{text}<extra></extra>",
      connector: { line: { color: "#aab4c3" } }, increasing: { marker: { color: "#2f855a" } },
      decreasing: { marker: { color: "#c0392b" } }, totals: { marker: { color: "#2458c6" } }
    }], { yaxis: { title: { text: "seconds" }, rangemode: "tozero" }, showlegend: false, margin: { l: 70, r: 20, t: 30, b: 90 } });
  }

  function evidenceCell(items) {
    var td = el("td", { cls: "evidence" });
    (items || []).forEach(function (e) {
      if (e.path && config.files_base !== null && config.files_base !== undefined) {
        td.appendChild(el("a", { href: safeHref(config.files_base + e.path.split("/").map(encodeURIComponent).join("/")),
                                 text: e.text }));
      } else {
        td.appendChild(el("span", { text: e.text }));
      }
    });
    return td;
  }

  function renderInterruptions(view) {
    var r = view.report, details = view.interruption_details || [];
    var rows = r.interruptions.map(function (i, n) {
      var d = details[n] || {};
      var culprit = i.planned ? "-" : [list(i.culprit_ranks.length ? i.culprit_ranks : i.ranks) ? "rank " +
        list(i.culprit_ranks.length ? i.culprit_ranks : i.ranks) : "", list(i.culprit_hosts.length ? i.culprit_hosts : i.hosts, 3)]
        .filter(Boolean).join(" @ ") || "-";
      return el("tr", { "data-attempt": i.attempt, cls: i.planned ? "planned" : null }, [
        cell(String(n + 1), null, "num"),
        cell(fmtSeconds(i.time_seconds), i.time_seconds, "num"),
        cell(String(i.attempt), i.attempt, "num"),
        cell(i.kind, i.kind),
        cell(i.step === null ? "-" : String(i.step), i.step === null ? "" : i.step, "num"),
        cell(i.planned ? "-" : i.detection_latency_seconds.toFixed(1) + " s", i.detection_latency_seconds, "num"),
        cell(i.category, i.category), cell(i.group, i.group), cell(i.verdict || "-", i.verdict),
        cell(culprit),
        cell(fmtSeconds(i.time_lost_seconds), i.time_lost_seconds, "num"),
        el("td", { cls: "explanation", text: [d.explanation, d.detail === d.explanation ? "" : d.detail].filter(Boolean).join(" — ") }),
        evidenceCell(d.evidence)
      ]);
    });
    fillBody($("interruptions"), rows);
    $("interruptions").hidden = rows.length === 0;
    $("no-interruptions").hidden = rows.length !== 0;
    fillBody($("root-causes"), r.root_causes.map(function (c) {
      return el("tr", {}, [cell(c.category), cell(c.group), cell(String(c.count), c.count, "num"),
        cell(pct(c.share, 1), c.share, "num"), cell(fmtSeconds(c.time_lost_seconds), c.time_lost_seconds, "num")]);
    }));
  }

  function renderStragglers(view) {
    var s = view.stragglers;
    $("stragglers-section").hidden = !s;
    if (!s) return null;
    var d = toDate(view.run.start_epoch);
    fillBody($("stragglers"), s.detections.map(function (x) {
      return el("tr", {}, [cell(fmtSeconds(x.t), x.t, "num"), cell(String(x.rank), x.rank, "num"), cell(x.node || "-"),
        cell(String(x.onset_step), x.onset_step, "num"), cell(String(x.step), x.step, "num"),
        cell(x.slowdown === null ? "-" : "x" + x.slowdown.toFixed(2), x.slowdown, "num"),
        cell(fmtSeconds(x.cost_seconds), x.cost_seconds, "num"), cell(x.signal || "-"), cell(x.action || "-")]);
    }));
    var traces = [];
    if (s.heatmap) {
      traces.push({ type: "heatmap", name: "own step time / median", x: s.heatmap.t.map(d),
                    y: s.heatmap.ranks.map(function (r) { return plain("rank " + r); }), z: s.heatmap.z, zmid: 1,
                    colorscale: "RdBu", colorbar: { title: { text: "x median" } },
                    hovertemplate: "%{y}<br>%{x}<br>x%{z:.2f}<extra></extra>" });
    }
    traces.push({ type: "scatter", mode: "markers", name: "straggler named", x: s.detections.map(function (x) { return d(x.t); }),
                  y: s.detections.map(function (x) { return plain("rank " + x.rank); }),
                  hovertext: s.detections.map(function (x) { return plain("rank " + x.rank + " x" + (x.slowdown || 1).toFixed(2)); }),
                  hovertemplate: "%{hovertext}<extra></extra>",
                  marker: { symbol: "x", size: 12, color: "#111", line: { width: 2 } } });
    return plot("straggler-heatmap", traces, { xaxis: { type: "date" }, yaxis: { type: "category", title: { text: "rank" } } });
  }

  function renderTelemetry(view) {
    var tm = view.telemetry;
    $("telemetry-section").hidden = !tm;
    if (!tm) return null;
    var d = toDate(view.run.start_epoch);
    var panels = [["temperature_c", "temperature °C", "y"], ["clock_mhz", "clock MHz", "y2"], ["power_watts", "power W", "y3"]];
    var traces = [];
    tm.series.forEach(function (s, i) {
      panels.forEach(function (p) {
        if (!s[p[0]].some(function (v) { return v !== null; })) return;
        // The name (host/device) is substituted by plotly, not spliced into the template, so a "%{...}" in it stays text.
        traces.push({ type: "scatter", mode: "lines", name: plain(s.name), legendgroup: s.name, showlegend: p[0] === "temperature_c" ||
                      !s.temperature_c.some(function (v) { return v !== null; }), x: s.t.map(d), y: s[p[0]], yaxis: p[2],
                      line: { width: 1.2 }, hovertemplate: "%{fullData.name}<br>%{x}<br>%{y} " + p[1].split(" ")[1] + "<extra></extra>" });
      });
    });
    return plot("telemetry", traces, {
      xaxis: { type: "date", anchor: "y3" },
      yaxis: { domain: [0.70, 1], title: { text: "°C" } }, yaxis2: { domain: [0.36, 0.66], title: { text: "MHz" } },
      yaxis3: { domain: [0, 0.32], title: { text: "W" } }, legend: { orientation: "h", y: -0.12 }
    });
  }

  function renderRun(view) {
    renderSummary(view);
    renderInterruptions(view);
    var jobs = [renderTimeline(view), renderThroughput(view), renderWaterfall(view), renderStragglers(view), renderTelemetry(view)];
    return Promise.all(jobs.filter(Boolean));
  }

  // --- the runs list ------------------------------------------------------------------------------
  function renderRuns(data) {
    $("runs-empty").hidden = data.runs.length !== 0;
    fillBody($("runs"), data.runs.map(function (r) {
      var link = el("a", { href: safeHref(config.run_url_base + encodeURIComponent(r.id)), text: r.id });
      var status = r.error ? "error" : r.status;
      return el("tr", { "data-run": r.id }, [
        el("td", {}, [link]),
        el("td", {}, [el("span", { cls: "badge " + status, text: status, title: r.error || null })].concat(
          r.synthetic ? [el("span", { cls: "badge synthetic", text: "synthetic" })] : [])),
        cell(r.ettr === null ? "-" : pct(r.ettr, 1), r.ettr, "num"),
        cell(r.interruptions === null ? "-" : String(r.interruptions), r.interruptions, "num"),
        cell(r.completed_steps === null ? "-" : r.completed_steps + (r.target_steps ? " / " + r.target_steps : ""), r.completed_steps, "num"),
        cell(r.attempts === null ? "-" : String(r.attempts), r.attempts, "num"),
        cell(fmtSeconds(r.wall_seconds), r.wall_seconds, "num"),
        cell(r.source), cell(r.error ? r.path + ": " + r.error : r.path)
      ]);
    }));
    return Promise.resolve();
  }

  // --- the simulation page ---------------------------------------------------------------------------
  function vline(x, text, color, where) {
    return { type: "line", x0: x, x1: x, yref: "paper", y0: 0, y1: 1, line: { color: color, width: 1.5, dash: "dot" },
             label: { text: text, textposition: where || "end", font: { size: 11, color: color } } };
  }
  function renderSimulation(sim) {
    if (!sim.available) {
      $("sim-unavailable").hidden = false;
      $("sim-unavailable").textContent = "Not available for this run: " + sim.reason;
      return Promise.resolve();
    }
    $("sim-body").hidden = false;
    var inp = sim.inputs;
    $("sim-inputs").textContent = inp.model + ", " + inp.gpus.toLocaleString() + " GPUs, " + inp.days + " days, seed " + inp.seed +
      "; checkpoint every " + sim.interval_minutes.toFixed(1) + " min, stall " + inp.checkpoint_stall_seconds.toFixed(0) +
      " s, restart overhead " + inp.restart_overhead_seconds.toFixed(0) + " s (recovered from the run's events); " +
      sim.trials + " trials, plan " + sim.plan.trials + " trials per interval.";
    var e = sim.ettr;
    var stats = [["trials", String(sim.trials), sim.trials], ["mean ETTR", pct(e.mean, 2), e.mean], ["p5", pct(e.p5, 2), e.p5],
                 ["p50", pct(e.p50, 2), e.p50], ["p95", pct(e.p95, 2), e.p95]];
    if (sim.this_run_ettr !== null) stats.push(["this run (one trial)", pct(sim.this_run_ettr, 2), sim.this_run_ettr]);
    stats.push(["best interval", sim.plan.best_minutes.toFixed(1) + " min (ETTR " + pct(sim.plan.best_ettr, 2) + ")", sim.plan.best_minutes]);
    stats.push(["Young / Daly", sim.plan.young_minutes.toFixed(1) + " / " + sim.plan.daly_minutes.toFixed(1) + " min", sim.plan.young_minutes]);
    fillBody($("sim-stats"), stats.map(function (s) { return el("tr", {}, [el("th", { text: s[0] }), cell(s[1], s[2], "num")]); }));
    var shapes = [vline(e.p5, "p5", "#7f8c8d"), vline(e.p95, "p95", "#7f8c8d"), vline(e.mean, "mean", "#2458c6")];
    if (sim.this_run_ettr !== null) shapes.push(vline(sim.this_run_ettr, "this run", "#c0392b"));
    var c = sim.plan.candidates;
    var a = plot("ettr-distribution", [{ type: "histogram", name: "trials", x: e.values, nbinsx: 40,
      marker: { color: "#9db4e8" }, hovertemplate: "ETTR %{x}<br>%{y} trials<extra></extra>" }],
      { xaxis: { title: { text: "ETTR" }, tickformat: ".1%" }, yaxis: { title: { text: "trials" } }, shapes: shapes, showlegend: false,
        margin: { l: 60, r: 20, t: 30, b: 50 } });
    var b = plot("plan-curve", [
      { type: "scatter", mode: "lines+markers", name: "simulated ETTR", x: c.map(function (r) { return r.minutes; }),
        y: c.map(function (r) { return r.ettr_mean; }), error_y: { type: "data", array: c.map(function (r) { return r.ettr_stderr; }) },
        line: { color: "#2458c6" } },
      { type: "scatter", mode: "lines", name: "Meta's approximation", x: c.map(function (r) { return r.minutes; }),
        y: c.map(function (r) { return r.meta_ettr; }), line: { color: "#7f8c8d", dash: "dash" } }
    ], { xaxis: { title: { text: "checkpoint interval (minutes)" } }, yaxis: { title: { text: "ETTR" }, tickformat: ".1%" },
         shapes: [vline(sim.plan.young_minutes, "Young", "#2f855a", "end"), vline(sim.plan.daly_minutes, "Daly", "#8e44ad", "middle"),
                  vline(sim.interval_minutes, "this run", "#c0392b", "start")], margin: { l: 60, r: 20, t: 30, b: 50 } });
    return Promise.all([a, b]);
  }

  // --- boot and live updates ------------------------------------------------------------------------
  var renders = { run: renderRun, runs: renderRuns, simulation: renderSimulation };
  var render = renders[config.page];
  var etag = config.etag || null;

  function done() {
    window.tgRenders = (window.tgRenders || 0) + 1;
    if (!window.tgReady) window.tgReadyMs = performance.now();  // page load time, from navigation start
    window.tgReady = true;
    document.documentElement.setAttribute("data-ready", String(window.tgRenders));
  }
  function live(data) {
    if (!config.api || !config.poll_seconds) return false;
    if (config.page === "run") return data.report && data.report.status === "incomplete";
    return config.page === "runs";
  }
  function schedule(data) {
    if (!live(data)) { $("live").hidden = true; return; }
    $("live").hidden = false;
    if (!$("live").textContent) $("live").textContent = "live: updates every " + config.poll_seconds + " s";
    setTimeout(function () {
      var headers = etag ? { "If-None-Match": etag } : {};
      fetch(config.api, { headers: headers, credentials: "same-origin", cache: "no-cache" }).then(function (resp) {
        if (resp.status === 304) return schedule(data);
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        etag = resp.headers.get("ETag");
        return resp.json().then(function (fresh) {
          return render(fresh).then(function () {
            done();
            $("live").textContent = "live: updated " + new Date().toLocaleTimeString();
            schedule(fresh);
          });
        });
      }).catch(function (err) {
        $("live").textContent = "live: " + err.message + "; retrying";
        schedule(data);
      });
    }, config.poll_seconds * 1000);
  }

  var data = JSON.parse(document.getElementById("tg-data").textContent);
  if (data && data.error) {
    var p = el("p", { cls: "badge error", text: data.error, id: "run-error" });
    document.querySelector("main").insertBefore(p, document.querySelector("main").firstChild);
    done();
  } else if (render) {
    render(data).then(function () { done(); schedule(data); });
  }
  window.trainguard = { fmtSeconds: fmtSeconds };
})();
