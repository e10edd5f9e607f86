"use strict";
// The playground (chat with the served model through /v1/chat/completions, streamed) and the
// "plan vs measured" table (/dashboard/plan).
window.GB = window.GB || {};
(function (GB) {
  GB.key = () => sessionStorage.getItem("glassbox_api_key") || "";
  GB.authHeaders = () => (GB.key() ? { Authorization: "Bearer " + GB.key() } : {});

  GB.playground = function (model) {
    const chat = document.getElementById("chat"), form = document.getElementById("chat-form");
    const prompt = document.getElementById("prompt"), stop = document.getElementById("stop");
    const send = document.getElementById("send"), info = document.getElementById("chat-metrics");
    const history = [];
    let controller = null;

    function bubble(role, text) {
      const d = document.createElement("div");
      d.className = "msg " + role;
      d.textContent = text;
      chat.appendChild(d);
      chat.scrollTop = chat.scrollHeight;
      return d;
    }

    function num(id) {
      const v = document.getElementById(id).value;
      return v === "" ? undefined : Number(v);
    }

    async function run(text) {
      history.push({ role: "user", content: text });
      bubble("user", text);
      const out = bubble("assistant", "");
      out.dataset.state = "streaming";
      const body = { model: model(), messages: history.slice(), stream: true,
        stream_options: { include_usage: true }, temperature: num("temperature"), top_p: num("top_p"),
        max_tokens: num("max_tokens"), seed: num("seed") };
      controller = new AbortController();
      send.disabled = true; stop.disabled = false;
      let answer = "", chunks = 0;
      try {
        const resp = await fetch("/v1/chat/completions", { method: "POST", signal: controller.signal,
          headers: { "Content-Type": "application/json", ...GB.authHeaders() }, body: JSON.stringify(body) });
        if (!resp.ok) {
          const err = await resp.json().catch(() => ({}));
          throw new Error((err.error && err.error.message) || resp.statusText);
        }
        const reader = resp.body.getReader(), dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const event = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            for (const line of event.split("\n")) {
              if (!line.startsWith("data: ")) continue;
              const data = line.slice(6);
              if (data === "[DONE]") continue;
              const c = JSON.parse(data);
              if (c.error) throw new Error(c.error.message);
              const delta = c.choices && c.choices[0] && c.choices[0].delta;
              if (delta && delta.content) {
                answer += delta.content;
                chunks += 1;
                out.textContent = answer;
                out.dataset.chunks = chunks;
                chat.scrollTop = chat.scrollHeight;
              }
              if (c.metrics) {
                const m = c.metrics;
                out.dataset.requestId = c.id;
                info.textContent = `${c.id}: TTFT ${GB.secs(m.ttft_s)}, ${m.output_tokens} tokens, ` +
                  `decode ${GB.si(m.decode_tok_s)} tok/s, E2E ${GB.secs(m.e2e_s)}`;
              }
            }
          }
        }
        out.dataset.state = "done";
        history.push({ role: "assistant", content: answer });
      } catch (e) {
        out.dataset.state = "error";
        out.classList.add("error");
        out.textContent = answer + (e.name === "AbortError" ? " [stopped]" : ` [error: ${e.message}]`);
        history.pop();
      } finally {
        send.disabled = false; stop.disabled = true; controller = null;
      }
    }

    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = prompt.value.trim();
      if (!text || controller) return;
      prompt.value = "";
      run(text);
    });
    prompt.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
    });
    stop.addEventListener("click", () => controller && controller.abort());
    document.getElementById("clear").addEventListener("click", () => {
      history.length = 0; chat.replaceChildren(); info.textContent = "";
    });
  };

  // "plan vs measured": glassbox plan --hardware local for the served model, beside the server's medians
  GB.refreshPlan = async function () {
    const resp = await fetch("/dashboard/plan", { credentials: "same-origin" });
    const body = await resp.json();
    const tbody = document.querySelector("#plan-table tbody");
    const w = document.getElementById("plan-workload"), src = document.getElementById("plan-source");
    if (!resp.ok) { w.textContent = body.error ? body.error.message : resp.statusText; return; }
    const m = body.measured, p = body.predicted, wl = body.workload;
    w.dataset.requests = m.requests;
    w.textContent = `workload: ${wl.prompt_tokens} prompt + ${wl.output_tokens} output tokens ` +
      `(medians of ${m.requests} finished requests); mean running ${body.mean_running.toFixed(1)}`;
    tbody.replaceChildren();
    if (!p) { src.textContent = "the planner could not cost this model: " + body.error; return; }
    const row = p.concurrency.find((r) => r.concurrency === wl.concurrency && wl.concurrency > 1);
    document.getElementById("plan-cth").textContent = `plan, ${wl.concurrency} users`;
    const rows = [
      ["TTFT", p.ttft_s, row && row.ttft_s_p50, m.ttft_s, GB.secs],
      ["TPOT", p.tpot_s, row && row.tpot_s_p50, m.tpot_s, GB.secs],
      ["queue wait", 0, row && row.queue_s_p50, m.queue_s, GB.secs],
      ["prefill tok/s", p.prefill_tok_s, null, m.prefill_tok_s, (v) => GB.si(v)],
      ["decode tok/s", p.decode_tok_s, row && row.per_request_tok_s, m.decode_tok_s, (v) => GB.si(v)],
      ["E2E", p.e2e_s, null, m.e2e_s, GB.secs],
    ];
    for (const [name, one, many, got, fmt] of rows) {
      const tr = document.createElement("tr");
      tr.dataset.key = name;
      const ref = many !== null && many !== undefined ? many : one;
      const ratio = got !== undefined && got !== null && ref > 0 ? (got / ref).toFixed(2) + "×" : "-";
      for (const v of [name, fmt(one), many === null || many === undefined ? "-" : fmt(many),
        got === undefined ? "-" : fmt(got), ratio]) {
        const td = document.createElement("td");
        td.textContent = v;
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
    src.textContent = `plan: ${p.engine} profile, weights ${p.quant}, hardware ${p.hardware.name} ` +
      `(${GB.si(p.hardware.bandwidth_gbs)} GB/s; ${p.hardware.source})` +
      (p.warnings.length ? "; " + p.warnings.join("; ") : "");
  };
})(window.GB);
