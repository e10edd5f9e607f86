"use strict";
// The dashboard's state: one EventSource on /dashboard/events, merged into bounded stores, drawn 4x a second.
(function (GB) {
  const MAX_REQUESTS = 1500, MAX_STEPS = 6000, MAX_ITL = 8192;
  const S = {
    hello: null, offset: 0, requests: new Map(), steps: [], itl: [], stepsTotal: 0, selected: null,
    roofline: null, windowS: 15, fit: true, paused: false, finishedSeen: 0, planAt: -1e9, frozenNow: null,
  };
  GB.state = S;
  const $ = (id) => document.getElementById(id);

  function serverNow() {
    if (S.paused && S.frozenNow !== null) return S.frozenNow;
    return performance.now() / 1000 + S.offset;
  }

  function onHello(h) {
    S.hello = h;
    S.offset = h.now - performance.now() / 1000;
    $("model").textContent = h.model;
    $("device").textContent = `${h.device} · ${h.dtype} · weights ${h.weights} · ${h.num_blocks} KV blocks of ${h.block_size}`;
    setConn(true);
  }

  function onUpdate(u) {
    S.offset = u.now - performance.now() / 1000;
    for (const r of u.requests) S.requests.set(r.id, r);
    if (S.requests.size > MAX_REQUESTS) {
      for (const [id, r] of S.requests) {
        if (S.requests.size <= MAX_REQUESTS) break;
        if (r.state === "finished") S.requests.delete(id);
      }
    }
    const last = S.steps.length ? S.steps[S.steps.length - 1].i : -1;
    for (const s of u.steps) if (s.i > last) { S.steps.push(s); S.stepsTotal += 1; }
    if (S.steps.length > MAX_STEPS) S.steps.splice(0, S.steps.length - MAX_STEPS);
    for (const x of u.itl) S.itl.push(x);
    if (S.itl.length > MAX_ITL) S.itl.splice(0, S.itl.length - MAX_ITL);
    if (u.roofline) S.roofline = u.roofline;
    const roof = $("roofline");
    if (S.roofline) {
      roof.textContent = `roofline: ${GB.si(S.roofline.bandwidth_gbs)} GB/s, ` +
        `${GB.si(S.roofline.tflops * 1e12, "FLOP/s")} ${S.roofline.dtype} (${S.roofline.source})`;
      roof.dataset.state = "ready";
    } else if (u.probe === "failed") {
      roof.textContent = "roofline: the probe failed: " + (u.probe_error || "");
      roof.dataset.state = "failed";
    }
    const s = S.steps[S.steps.length - 1];
    if (s) $("load").textContent = `running ${s.running} · waiting ${s.waiting} · KV ${s.used}/${S.hello ? S.hello.num_blocks : "?"} blocks`;
  }

  function setConn(on) {
    const c = $("conn");
    c.textContent = on ? "live" : "disconnected";
    c.dataset.state = on ? "live" : "off";
    c.className = "tag " + (on ? "conn-on" : "conn-off");
  }

  async function checkAuth() {
    const ctl = new AbortController();
    try {
      const r = await fetch("/dashboard/events?interval=10", { signal: ctl.signal, credentials: "same-origin" });
      ctl.abort();
      if (r.status === 401) $("keyform").hidden = false;
    } catch (e) { /* the server is down: EventSource keeps retrying */ }
  }

  function connect() {
    const es = new EventSource("/dashboard/events");
    es.addEventListener("hello", (e) => onHello(JSON.parse(e.data)));
    es.addEventListener("update", (e) => onUpdate(JSON.parse(e.data)));
    es.onerror = () => {
      setConn(false);
      if (es.readyState === EventSource.CLOSED) { checkAuth(); setTimeout(connect, 2000); }
    };
    GB.source = es;
  }

  function requestsSorted() {
    return Array.from(S.requests.values()).sort((a, b) => a.arrival - b.arrival);
  }

  // "fit": from the arrival of the oldest request the timeline shows (the newest 60 of the last 5 minutes)
  function fitWindow(reqs, now) {
    const recent = reqs.filter((r) => r.end === null || r.end >= now - 300).slice(-60);
    if (!recent.length) return 15;
    const span = (now - recent[0].arrival) * 1.04;
    return Math.min(300, Math.max(2, span));
  }

  function select(id) {
    S.selected = id;
    render();
  }

  function renderSteps(now) {
    const t0 = now - S.windowS, steps = S.steps.filter((s) => s.t >= t0);
    const pts = (f) => steps.map((s) => [s.t, f(s)]);
    const o = { x0: t0, x1: now };
    GB.timeChart($("c-batch"), [
      { points: pts((s) => s.bs), color: "#111827" },
      { points: pts((s) => s.running), color: "#3b82f6", dash: [3, 2] },
      { points: pts((s) => s.waiting), color: "#a3adb8" },
    ], o);
    GB.timeChart($("c-tokens"), [
      { points: pts((s) => s.pf), color: "#f59e0b" },
      { points: pts((s) => s.dc), color: "#3b82f6" },
    ], { ...o, stack: true });
    GB.timeChart($("c-time"), [
      { points: pts((s) => s.dur * 1e3), color: "#111827" },
      { points: pts((s) => s.exec * 1e3), color: "#10b981" },
    ], o);
    const roof = S.roofline;
    GB.timeChart($("c-gbs"), [{ points: pts((s) => (s.gbs === undefined ? NaN : s.gbs)), color: "#7c3aed" }],
      { ...o, refs: roof ? [{ y: roof.bandwidth_gbs, color: "#dc2626", label: "probe: " + GB.si(roof.bandwidth_gbs) + " GB/s" }] : [] });
    GB.timeChart($("c-flops"), [{ points: pts((s) => (s.tflops === undefined ? NaN : s.tflops * 1e12)), color: "#c2410c" }],
      { ...o, refs: roof ? [{ y: roof.tflops * 1e12, color: "#dc2626", label: "probe: " + GB.si(roof.tflops * 1e12, "FLOP/s") }] : [] });
    GB.timeChart($("c-kv"), [
      { points: pts((s) => s.used), color: "#3b82f6" },
      { points: pts((s) => s.cached), color: "#10b981" },
    ], { ...o, stack: true });
    if (steps.length) {
      const k = steps[steps.length - 1];
      $("kv-caption").textContent = `KV-cache blocks: used ${k.used} · cached ${k.cached} (free, reusable) · ` +
        `free ${k.free} of ${k.used + k.free}`;
    }
    const sum = $("steps-summary"), last = S.steps[S.steps.length - 1];
    sum.dataset.steps = S.stepsTotal;
    if (last) {
      sum.dataset.lastBatch = last.bs;
      const fr = last.gbs !== undefined && roof ? `, ${last.gbs.toPrecision(3)} GB/s (${(100 * last.gbs / roof.bandwidth_gbs).toFixed(0)}% of the probe)` : "";
      sum.textContent = `${S.stepsTotal} steps · last: batch ${last.bs}, ${last.pf} prefill + ${last.dc} decode tokens, ` +
        `${GB.secs(last.dur)}${fr}`;
    }
  }

  function pctCell(box, values) {
    const sorted = values.slice().sort((a, b) => a - b);
    const div = box.querySelector(".pct");
    const p = (q) => GB.percentile(sorted, q);
    div.dataset.n = sorted.length;
    div.dataset.p50 = p(0.5);
    div.textContent = sorted.length
      ? `p50 ${GB.secs(p(0.5))} · p90 ${GB.secs(p(0.9))} · p99 ${GB.secs(p(0.99))} (n=${sorted.length})`
      : "no data yet";
    GB.histogram(box.querySelector("canvas"), values, getComputedStyle(document.body).getPropertyValue("--decode"));
  }

  function renderLatency() {
    const done = Array.from(S.requests.values()).filter((r) => r.metrics && r.finish_reason !== "abort");
    $("latency-count").textContent = `finished requests (not aborted): ${done.length}`;
    pctCell($("lat-ttft"), done.map((r) => r.metrics.ttft_s));
    pctCell($("lat-tpot"), done.filter((r) => r.metrics.output_tokens > 1).map((r) => r.metrics.decode_s / (r.metrics.output_tokens - 1)));
    pctCell($("lat-itl"), S.itl);
    pctCell($("lat-queue"), done.map((r) => r.metrics.queue_s));
    if (done.length !== S.finishedSeen && performance.now() - S.planAt > 10000) {
      S.finishedSeen = done.length;
      S.planAt = performance.now();
      GB.refreshPlan().catch(() => {});
    }
  }

  function render() {
    if (!S.hello) return;
    const now = serverNow();
    const reqs = requestsSorted();
    if (S.fit) S.windowS = fitWindow(reqs, now);
    GB.drawTimeline($("timeline"), reqs, now, S.windowS, S.selected, select);
    const sel = S.selected && S.requests.get(S.selected);
    if (sel) GB.drawAnatomy($("anatomy"), sel, S.hello.metric_keys, now);
    renderSteps(now);
    renderLatency();
  }

  $("window").addEventListener("change", (e) => {
    S.fit = e.target.value === "fit";
    if (!S.fit) S.windowS = Number(e.target.value);
    render();
  });
  $("pause").addEventListener("change", (e) => {
    S.paused = e.target.checked;
    S.frozenNow = S.paused ? performance.now() / 1000 + S.offset : null;
    render();
  });
  $("keyform").addEventListener("submit", (e) => {
    e.preventDefault();
    const key = $("key").value;
    sessionStorage.setItem("glassbox_api_key", key);
    document.cookie = `glassbox_api_key=${encodeURIComponent(key)}; path=/dashboard; SameSite=Strict`;
    $("keyform").hidden = true;
    if (GB.source) GB.source.close();
    connect();
  });
  $("plan-refresh").addEventListener("click", () => GB.refreshPlan().catch(() => {}));
  GB.playground(() => (S.hello ? S.hello.model : undefined));
  setInterval(() => { if (!S.paused) render(); }, 250);
  connect();
})(window.GB);
