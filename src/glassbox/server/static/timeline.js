"use strict";
// The request timeline (SVG: one <g class="req"> per request, its phases as <rect>s) and the anatomy panel.
window.GB = window.GB || {};
(function (GB) {
  const NS = "http://www.w3.org/2000/svg";
  const ROW = 14, LABEL = 190, AXIS = 16, MAX_ROWS = 60;

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function shortId(id) {
    return id.length > 14 ? id.slice(0, 8) + "…" + id.slice(-5) : id;
  }

  // the phases of a request as [name, start, end] in server seconds (running ones end at ``now``)
  GB.phases = function (r, now) {
    const out = [];
    const queued = r.arrival + r.tokenize_s;
    out.push(["tokenize", r.arrival, queued]);
    const qEnd = r.scheduled !== null ? r.scheduled : (r.end !== null ? r.end : now);
    out.push(["queue", queued, qEnd]);
    if (r.scheduled !== null) {
      const pEnd = r.first_token !== null ? r.first_token : (r.end !== null ? r.end : now);
      out.push(["prefill", r.scheduled, pEnd]);
      if (r.first_token !== null) out.push(["decode", r.first_token, r.end !== null ? r.end : now]);
    }
    return out;
  };

  GB.drawTimeline = function (svg, requests, now, windowS, selected, onSelect) {
    const width = Math.max(300, svg.clientWidth);
    const t0 = now - windowS;
    const shown = requests.filter((r) => (r.end === null || r.end >= t0)).slice(-MAX_ROWS);
    const height = AXIS + Math.max(4, shown.length) * ROW + 4;
    svg.setAttribute("height", height);
    svg.style.height = height + "px";
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.replaceChildren();
    const defs = el("defs", {}, svg);
    const pat = el("pattern", { id: "hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 4, height: 4, fill: "#fff" }, pat);
    el("rect", { width: 2, height: 4, fill: "#3b82f6" }, pat);
    const x = (t) => LABEL + (width - LABEL - 6) * (Math.max(t, t0) - t0) / windowS;
    for (let i = 0; i <= 4; i++) {
      const t = t0 + windowS * i / 4;
      el("line", { class: "grid", x1: x(t), x2: x(t), y1: AXIS - 4, y2: height }, svg);
      const label = el("text", { class: "axis", x: x(t) - (i === 4 ? 20 : 0), y: 10 }, svg);
      label.textContent = i === 4 ? "now" : "-" + GB.span(windowS * (1 - i / 4));
    }
    shown.forEach((r, row) => {
      const y = AXIS + row * ROW;
      const g = el("g", {
        class: "req" + (r.finish_reason === "abort" ? " aborted" : "") + (r.id === selected ? " selected" : ""),
        "data-id": r.id, "data-state": r.state, "data-prompt": r.prompt, "data-cached": r.cached,
        "data-output": r.output, "data-chunks": r.chunks.filter((c) => !c[4]).length,
        "data-recomputes": r.chunks.filter((c) => c[4]).length,
        "data-preemptions": r.preemptions.length, "data-finish": r.finish_reason || "",
      }, svg);
      el("rect", { class: "rowbg", x: 0, y: y, width: width, height: ROW }, g);
      const label = el("text", { class: "label", x: 2, y: y + ROW - 3 }, g);
      const cached = r.cached ? ` (${r.cached}⚡)` : "";
      label.textContent = `${shortId(r.id)} ${r.prompt}${cached}→${r.output}`;
      const title = el("title", {}, g);
      title.textContent = `${r.id}: ${r.state}${r.finish_reason ? " (" + r.finish_reason + ")" : ""}, ` +
        `${r.prompt} prompt tokens (${r.cached} from the prefix cache), ${r.output} output tokens, ` +
        `${r.chunks.length} prompt chunks, ${r.preemptions.length} preemptions`;
      for (const [name, a, b] of GB.phases(r, now)) {
        if (b < t0) continue;
        el("rect", { class: name, x: x(a), y: y + 2, width: Math.max(1, x(b) - x(a)), height: ROW - 4,
          "data-start": a, "data-end": b }, g);
      }
      for (const [a, b, n, start, recompute] of r.chunks) {
        if (b < t0) continue;
        el("rect", { class: "chunk" + (recompute ? " recompute" : ""), x: x(a), y: y + 2,
          width: Math.max(1, x(b) - x(a)), height: ROW - 4, "data-tokens": n, "data-start": start }, g);
      }
      if (r.cached > 0 && r.scheduled !== null && r.scheduled >= t0) {
        el("rect", { class: "hit", x: x(r.scheduled) - 3, y: y + 1, width: 4, height: ROW - 2 }, g);
      }
      for (const t of r.preemptions) {
        if (t < t0) continue;
        const px = x(t);
        el("path", { class: "preempt", d: `M${px - 4},${y} L${px + 4},${y} L${px},${y + 7} Z` }, g);
      }
      if (r.finish_reason === "abort" && r.end !== null) {
        const px = x(r.end);
        el("line", { class: "abort-mark", x1: px, x2: px, y1: y + 1, y2: y + ROW - 1 }, g);
      }
      g.addEventListener("click", () => onSelect(r.id));
    });
  };

  function row(table, key, value, raw) {
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    const a = document.createElement("td"), b = document.createElement("td");
    a.textContent = key;
    b.textContent = value;
    if (raw !== undefined) b.dataset.value = String(raw);
    tr.append(a, b);
    table.appendChild(tr);
  }

  // the anatomy of one request: its response's ``metrics`` (once finished), its phases and chunks
  GB.drawAnatomy = function (aside, r, keys, now) {
    aside.replaceChildren();
    const h = document.createElement("h3");
    h.textContent = r.id;
    aside.appendChild(h);
    aside.dataset.id = r.id;
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = r.state === "finished" ? `finished (${r.finish_reason})` : `${r.state}: live, figures so far`;
    aside.appendChild(p);
    const bar = document.createElement("div");
    bar.className = "bar";
    const ph = GB.phases(r, now), total = Math.max(1e-9, ph[ph.length - 1][2] - ph[0][1]);
    const colors = { tokenize: "--tokenize", queue: "--queue", prefill: "--prefill", decode: "--decode" };
    for (const [name, a, b] of ph) {
      const d = document.createElement("div");
      d.style.width = (100 * (b - a) / total) + "%";
      d.style.background = `var(${colors[name]})`;
      d.title = `${name}: ${GB.secs(b - a)}`;
      bar.appendChild(d);
    }
    aside.appendChild(bar);
    const table = document.createElement("table");
    table.id = "anatomy-metrics";
    if (r.metrics) {
      for (const k of keys) {
        const v = r.metrics[k];
        const shown = k.endsWith("_s") && !k.endsWith("tok_s") ? GB.secs(v) : (Number.isInteger(v) ? String(v) : Number(v).toFixed(2));
        row(table, k, shown, v);
      }
    } else {
      for (const [name, a, b] of ph) row(table, name + " (so far)", GB.secs(b - a));
      row(table, "prompt_tokens", String(r.prompt), r.prompt);
      row(table, "cached_prompt_tokens", String(r.cached), r.cached);
      row(table, "output_tokens", String(r.output), r.output);
      row(table, "preemptions", String(r.preemptions.length), r.preemptions.length);
    }
    aside.appendChild(table);
    if (r.chunks.length) {
      const c = document.createElement("p");
      c.className = "muted small";
      c.textContent = "prompt chunks (tokens from position): " +
        r.chunks.map(([a, b, n, s, re]) => `${n}@${s}${re ? " (recompute)" : ""}`).join(", ");
      aside.appendChild(c);
    }
  };
})(window.GB);
