"use strict";
// Charts drawn by hand on <canvas> (no chart library): time series, stacked series, histograms.
window.GB = window.GB || {};
(function (GB) {
  GB.fitCanvas = function (canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(10, canvas.clientWidth), h = Math.max(10, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return { ctx, w, h };
  };

  // 1234 -> "1.23k", 0.0123 -> "12.3m" (SI), with an optional unit
  GB.si = function (v, unit) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    const a = Math.abs(v);
    const steps = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""], [1e-3, "m"], [1e-6, "µ"]];
    for (const [s, p] of steps) {
      if (a >= s) return (v / s).toPrecision(3).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "") + (unit ? " " + p + unit : p);
    }
    return a === 0 ? "0" + (unit || "") : v.toExponential(2) + (unit || "");
  };

  // seconds -> "12.3 ms" / "1.23 s"
  GB.secs = function (s) {
    if (s === null || s === undefined || !isFinite(s)) return "-";
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1e3).toPrecision(3) + " ms";
    return s.toPrecision(3) + " s";
  };

  GB.span = (s) => (s < 10 ? s.toFixed(1) : String(Math.round(s))) + " s";

  GB.percentile = function (sorted, q) {
    if (!sorted.length) return NaN;
    const k = (sorted.length - 1) * q, lo = Math.floor(k), hi = Math.min(lo + 1, sorted.length - 1);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo);
  };

  function axes(ctx, w, h, pad, ymax, x0, x1, unit) {
    ctx.strokeStyle = "#e2e5ea";
    ctx.fillStyle = "#6b7480";
    ctx.font = "10px sans-serif";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 2; i++) {
      const y = pad.t + (h - pad.t - pad.b) * (1 - i / 2);
      ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
      ctx.fillText(GB.si(ymax * i / 2, unit), 2, y + 3);
    }
    ctx.fillText("-" + GB.span(x1 - x0), pad.l, h - 2);
    ctx.fillText("now", w - pad.r - 20, h - 2);
  }

  // series: [{points: [[t, y]], color, kind: "line" | "bars", dash}] over [x0, x1]; refs: [{y, color}]
  // stack: series drawn as a stack (each point's y added to the ones below), as bars or areas
  GB.timeChart = function (canvas, series, opts) {
    const { ctx, w, h } = GB.fitCanvas(canvas);
    const pad = { l: 38, r: 4, t: 4, b: 12 };
    const x0 = opts.x0, x1 = opts.x1;
    const px = (t) => pad.l + (w - pad.l - pad.r) * (t - x0) / Math.max(1e-9, x1 - x0);
    let ymax = opts.ymin || 0;
    if (opts.stack) {
      const n = series.length ? series[0].points.length : 0;
      for (let i = 0; i < n; i++) {
        let s = 0;
        for (const se of series) s += se.points[i][1] || 0;
        ymax = Math.max(ymax, s);
      }
    } else {
      for (const se of series) for (const p of se.points) if (isFinite(p[1])) ymax = Math.max(ymax, p[1]);
    }
    for (const r of opts.refs || []) if (isFinite(r.y)) ymax = Math.max(ymax, r.y);
    if (opts.ymax) ymax = opts.ymax;
    if (!(ymax > 0)) ymax = 1;
    ymax *= 1.08;
    const py = (v) => pad.t + (h - pad.t - pad.b) * (1 - v / ymax);
    axes(ctx, w, h, pad, ymax, x0, x1, opts.unit);
    const base = opts.stack && series.length ? series[0].points.map(() => 0) : null;
    for (const se of series) {
      ctx.strokeStyle = ctx.fillStyle = se.color;
      ctx.lineWidth = 1.5;
      ctx.setLineDash(se.dash || []);
      const pts = se.points;
      if (se.kind === "bars" || opts.stack) {
        const bw = Math.max(1, (w - pad.l - pad.r) / Math.max(60, pts.length) * 0.8);
        for (let i = 0; i < pts.length; i++) {
          const [t, v] = pts[i];
          if (t < x0 || !(v > 0)) continue;
          const b = base ? base[i] : 0;
          const yTop = py(b + v), yBot = py(b);
          ctx.fillRect(px(t) - bw / 2, yTop, bw, Math.max(1, yBot - yTop));
        }
        if (base) for (let i = 0; i < pts.length; i++) base[i] += pts[i][1] || 0;
      } else {
        ctx.beginPath();
        // a line breaks where the engine was idle (no step for longer than ``gap`` seconds)
        const gap = opts.gap || Math.max(0.5, (x1 - x0) / 50);
        let started = false, last = -Infinity;
        for (const [t, v] of pts) {
          if (t < x0 || !isFinite(v)) { started = false; continue; }
          if (!started || t - last > gap) { ctx.moveTo(px(t), py(v)); started = true; } else ctx.lineTo(px(t), py(v));
          last = t;
        }
        ctx.stroke();
      }
    }
    ctx.setLineDash([5, 4]);
    for (const r of opts.refs || []) {
      if (!isFinite(r.y)) continue;
      ctx.strokeStyle = r.color;
      ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(pad.l, py(r.y)); ctx.lineTo(w - pad.r, py(r.y)); ctx.stroke();
      if (r.label) { ctx.fillStyle = r.color; ctx.fillText(r.label, pad.l + 4, py(r.y) - 3); }
    }
    ctx.setLineDash([]);
  };

  // a histogram of positive values on log-spaced bins
  GB.histogram = function (canvas, values, color) {
    const { ctx, w, h } = GB.fitCanvas(canvas);
    const v = values.filter((x) => x > 0 && isFinite(x));
    ctx.fillStyle = "#6b7480";
    ctx.font = "10px sans-serif";
    if (!v.length) { ctx.fillText("no data yet", 4, h / 2); return; }
    let lo = Math.log10(Math.min(...v)), hi = Math.log10(Math.max(...v));
    if (hi - lo < 0.5) { lo -= 0.25; hi += 0.25; }
    const nb = 24, counts = new Array(nb).fill(0);
    for (const x of v) counts[Math.min(nb - 1, Math.floor((Math.log10(x) - lo) / (hi - lo) * nb))]++;
    const cmax = Math.max(...counts), pb = 12, bw = w / nb;
    ctx.fillStyle = color;
    counts.forEach((c, i) => {
      const bh = (h - pb - 2) * c / cmax;
      ctx.fillRect(i * bw + 1, h - pb - bh, bw - 2, bh);
    });
    ctx.fillStyle = "#6b7480";
    ctx.fillText(GB.secs(10 ** lo), 0, h - 1);
    const right = GB.secs(10 ** hi);
    ctx.fillText(right, w - ctx.measureText(right).width, h - 1);
  };
})(window.GB);
