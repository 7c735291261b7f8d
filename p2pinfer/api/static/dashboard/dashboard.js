// p2pinfer dashboard: one server-sent-event stream from this node (/dashboard/events),
// drawn with plain DOM, SVG and canvas. No library, nothing fetched from elsewhere.
"use strict";

(function () {
  const MAX_DECISIONS = 500;
  const FEED_ROWS = 80;
  const MAX_POINTS = 600;
  const CSRF = { "X-P2PInfer-Dashboard": "1" };

  const state = {
    node: null, peers: [], groups: [], decisions: [], series: [],
    renderMs: 0, renders: 0, events: 0, source: null, intervalS: 1, windowS: 30,
  };
  const $ = (id) => document.getElementById(id);

  function esc(s) {
    return String(s === null || s === undefined ? "" : s)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function shortId(id) { return id ? id.slice(-6) : "-"; }
  function num(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits || 0); }
  function peerState(p) {
    if (p.distrusted) return "distrusted";
    if (p.busy) return "busy";
    if (p.eligible) return "eligible";
    return "nodigest";
  }
  const STATE_LABEL = { eligible: "eligible", busy: "busy", distrusted: "distrusted", nodigest: "no digest" };

  // -- authentication ---------------------------------------------------------------------
  async function checkSession() {
    const r = await fetch("/dashboard/session", { credentials: "same-origin" });
    const s = await r.json();
    $("logout").hidden = !s.auth_required || !s.authenticated;
    if (s.authenticated) { showDashboard(); } else { showLogin(""); }
  }
  function showLogin(message) {
    if (state.source) { state.source.close(); state.source = null; }
    $("dashboard").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message;
    $("conn").textContent = "logged out";
    $("conn").classList.remove("live");
  }
  function showDashboard() {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    connect();
  }
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await fetch("/dashboard/login", {
      method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ api_key: $("login-key").value }),
    });
    if (r.ok) { $("login-key").value = ""; $("logout").hidden = false; showDashboard(); return; }
    let msg = "login failed (HTTP " + r.status + ")";
    try { msg = (await r.json()).error.message; } catch (e) { /* keep the status */ }
    $("login-error").textContent = msg;
  });
  $("logout").addEventListener("click", async () => {
    await fetch("/dashboard/logout", { method: "POST", credentials: "same-origin", headers: CSRF });
    $("logout").hidden = true;
    showLogin("logged out");
  });

  // -- the stream -------------------------------------------------------------------------
  function connect() {
    if (state.source) return;
    const source = new EventSource("/dashboard/events");
    state.source = source;
    source.addEventListener("open", () => { $("conn").textContent = "live"; $("conn").classList.add("live"); });
    source.addEventListener("error", () => {
      $("conn").textContent = "reconnecting"; $("conn").classList.remove("live");
      if (source.readyState === EventSource.CLOSED) {  // refused (401, 503): ask why before retrying
        state.source = null;
        setTimeout(checkSession, 2000);
      }
    });
    for (const name of ["hello", "snapshot", "decisions"]) {
      source.addEventListener(name, (ev) => apply(name, JSON.parse(ev.data)));
    }
  }

  function apply(name, data) {
    state.events += 1;
    if (name === "hello") {
      state.node = data.node;
      state.decisions = [];
      state.series = data.series.slice(-MAX_POINTS);
      state.intervalS = data.interval_s; state.windowS = data.chart_window_s;
      addDecisions(data.decisions);
    } else if (name === "snapshot") {
      state.node = data.node; state.peers = data.peers; state.groups = data.groups;
      const last = state.series[state.series.length - 1];
      if (!last || last.time !== data.point.time) state.series.push(data.point);
      if (state.series.length > MAX_POINTS) state.series.splice(0, state.series.length - MAX_POINTS);
    } else if (name === "decisions") {
      addDecisions(data);
    }
    render(name);
  }
  function addDecisions(list) {
    const now = Date.now();
    for (const d of list) { d.shownAt = now; state.decisions.push(d); }
    if (state.decisions.length > MAX_DECISIONS) state.decisions.splice(0, state.decisions.length - MAX_DECISIONS);
  }

  // -- drawing ----------------------------------------------------------------------------
  function render(what) {
    const t0 = performance.now();
    if (what !== "decisions") {
      renderHeader(); renderGraph(); renderPeers(); renderCaches(); renderCharts();
    }
    renderFeed();
    state.renderMs = performance.now() - t0;
    state.renders += 1;
  }

  function renderHeader() {
    const n = state.node;
    if (!n) return;
    const load = n.load || {};
    $("node-line").textContent = "node " + n.peer_id + " · " + n.model + " (" + (n.engine.engine || "?") + " engine) · policy " +
      n.policy + " · queued prefill " + load.queued_prefill_tokens + " tok · active " + load.active_requests +
      (load.busy ? " · BUSY" : "");
    $("chart-hint").textContent = "each point: requests entering here in the last " + state.windowS + " s";
  }

  function renderGraph() {
    const n = state.node;
    if (!n) return;
    const peers = state.peers.slice().sort((a, b) => (a.peer_id < b.peer_id ? -1 : 1));
    $("swarm-count").textContent = (peers.length + 1) + " nodes in this node's view";
    const W = 560, H = 440, cx = W / 2, cy = H / 2, R = Math.min(W, H) / 2 - 40;
    const big = peers.length <= 16;
    const r = big ? 15 : Math.max(5, 11 - peers.length / 12);
    const parts = [];
    const pos = peers.map((p, i) => {
      const a = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, peers.length);
      return [cx + R * Math.cos(a), cy + R * Math.sin(a)];
    });
    peers.forEach((p, i) => {
      const [x, y] = pos[i];
      const rtt = p.rtt_ms;
      const colour = rtt === null ? "#3a4653" : rtt < 5 ? "#47c27a" : rtt < 50 ? "#c2b447" : "#e5534b";
      const dash = p.connected ? "" : ' stroke-dasharray="4 3"';
      parts.push('<line x1="' + cx + '" y1="' + cy + '" x2="' + x.toFixed(1) + '" y2="' + y.toFixed(1) +
        '" stroke="' + colour + '"' + dash + "><title>" + esc(p.peer_id) + " RTT " + esc(num(rtt, 1)) + " ms</title></line>");
      if (big) {
        const mx = cx + (x - cx) * 0.55, my = cy + (y - cy) * 0.55;
        parts.push('<text class="rtt" x="' + mx.toFixed(1) + '" y="' + my.toFixed(1) + '">' +
          (rtt === null ? "?" : esc(num(rtt, 1)) + " ms") + (p.path ? " " + esc(p.path) : "") + "</text>");
      }
    });
    peers.forEach((p, i) => {
      const [x, y] = pos[i];
      const s = peerState(p);
      parts.push('<g class="peer" data-peer-id="' + esc(p.peer_id) + '" data-state="' + s + '">' +
        '<circle class="' + s + '-fill" cx="' + x.toFixed(1) + '" cy="' + y.toFixed(1) + '" r="' + r.toFixed(1) + '">' +
        "<title>" + esc(p.peer_id) + "\n" + STATE_LABEL[s] + ", trust " + esc(p.trust) + ", queued " +
        esc(p.queued_prefill_tokens) + " tok</title></circle>" +
        (big || peers.length <= 32 ? '<text x="' + x.toFixed(1) + '" y="' + (y + r + 11).toFixed(1) + '">' +
          esc(shortId(p.peer_id)) + "</text>" : "") + "</g>");
    });
    parts.push('<g class="peer self" data-peer-id="' + esc(n.peer_id) + '" data-state="self">' +
      '<circle class="self-fill" cx="' + cx + '" cy="' + cy + '" r="' + (r + 5) + '" stroke="#fff" stroke-width="2">' +
      "<title>this node " + esc(n.peer_id) + "</title></circle>" +
      '<text x="' + cx + '" y="' + (cy + r + 18) + '">this node ' + esc(shortId(n.peer_id)) + "</text></g>");
    $("graph").innerHTML = parts.join("");
  }

  function renderPeers() {
    const n = state.node;
    if (!n) return;
    const rows = [];
    const maxQ = Math.max(1, n.load.queued_prefill_tokens, ...state.peers.map((p) => p.queued_prefill_tokens || 0));
    const bar = (q) => '<span class="bar" data-w="' + Math.round((60 * (q || 0)) / maxQ) + '"></span>' + esc(q);
    rows.push('<tr data-peer-id="' + esc(n.peer_id) + '"><td class="mono">' + esc(shortId(n.peer_id)) +
      '</td><td><span class="badge self">this node</span>' + (n.load.busy ? ' <span class="badge busy">busy</span>' : "") +
      "</td><td>-</td><td>-</td><td>-</td><td>" + bar(n.load.queued_prefill_tokens) + "</td><td>" +
      esc(n.load.active_requests) + "</td><td>" + esc(n.digest_blocks) + "</td><td>-</td></tr>");
    for (const p of state.peers) {
      const s = peerState(p);
      rows.push('<tr data-peer-id="' + esc(p.peer_id) + '"><td class="mono" title="' + esc(p.peer_id) + '">' +
        esc(shortId(p.peer_id)) + '</td><td><span class="badge ' + s + '">' + STATE_LABEL[s] + "</span>" +
        (p.connected ? "" : " (not connected)") + "</td><td>" + esc(p.trust) + "</td><td>" + esc(num(p.rtt_ms, 1)) +
        "</td><td>" + esc(p.path || "-") + "</td><td>" + bar(p.queued_prefill_tokens) + "</td><td>" +
        esc(p.active_requests === undefined ? "-" : p.active_requests) + "</td><td>" + esc(p.cached_blocks) +
        "</td><td>" + esc(num(p.digest_age_s, 1)) + "</td></tr>");
    }
    // Widths are set through the DOM: the page's CSP forbids style attributes in markup.
    const body = document.querySelector("#peers tbody");
    body.innerHTML = rows.join("");
    for (const el of body.querySelectorAll(".bar")) el.style.width = el.dataset.w + "px";
  }

  // Labels that share a long opening (MMLU: "The following are multiple choice questions ... about")
  // are shown by what differs: "… world religions."
  function shortLabels(groups) {
    const out = {};
    for (const g of groups) {
      let best = 0;
      for (const o of groups) {
        if (o === g) continue;
        let i = 0;
        while (i < g.label.length && g.label[i] === o.label[i]) i += 1;
        best = Math.max(best, i);
      }
      const cut = g.label.lastIndexOf(" ", best) + 1;
      out[g.key] = cut >= 20 && cut < g.label.length ? "… " + g.label.slice(cut) : g.label;
    }
    return out;
  }

  function renderCaches() {
    const n = state.node;
    if (!n) return;
    const short = shortLabels(state.groups);
    const ids = [n.peer_id, ...state.peers.map((p) => p.peer_id)];
    const cards = [];
    for (const id of ids) {
      const held = state.groups
        .map((g) => ({ g: g, tokens: g.held_tokens[id] || 0, hits: (g.hits && g.hits[id]) || 0 }))
        .filter((x) => x.tokens > 0 || x.hits > 0)
        .sort((a, b) => b.hits - a.hits || b.tokens - a.tokens)
        .slice(0, 4);
      const items = held.map((x) => {
        const frac = x.g.prefix_tokens ? Math.min(1, x.tokens / x.g.prefix_tokens) : 0;
        return '<li title="' + esc(x.g.label) + '">' + esc(short[x.g.key]) + '<br><span class="hint">' + esc(x.tokens) +
          " of " + esc(x.g.prefix_tokens) + " tok held · " + esc(x.hits) + " hits</span>" +
          '<span class="held" data-w="' + Math.round(100 * frac) + '"></span></li>';
      });
      cards.push('<div class="card" data-peer-id="' + esc(id) + '"><h3><span class="mono">' +
        (id === n.peer_id ? "this node " : "") + esc(shortId(id)) + "</span><span class=\"hint\">" +
        held.length + " groups</span></h3>" +
        (items.length ? "<ol>" + items.join("") + "</ol>" : '<div class="none">nothing seen yet</div>') + "</div>");
    }
    const box = $("caches");
    box.innerHTML = cards.join("");
    for (const el of box.querySelectorAll(".held")) el.style.width = el.dataset.w + "%";
  }

  function renderFeed() {
    const rows = [];
    const list = state.decisions.slice(-FEED_ROWS).reverse();
    for (const d of list) {
      const when = new Date(d.time * 1000).toLocaleTimeString();
      const where = d.outcome !== "ok" ? '<span class="badge failed">' + esc(d.outcome) + "</span>"
        : d.local ? '<span class="badge self">local</span>'
          : '<span class="mono" title="' + esc(d.target) + '">' + esc(shortId(d.target)) + "</span>";
      rows.push('<tr data-request-id="' + esc(d.request_id) + '" data-seq="' + d.seq + '" data-shown-at="' + d.shownAt +
        '"><td>' + esc(when) + '</td><td class="prompt" title="' + esc(d.group_label) + '">' + esc(d.group_label || "-") +
        "</td><td>" + where + '</td><td class="reason">' + esc(d.reason) + "</td><td>" + esc(d.predicted_reused_tokens) +
        " / " + esc(d.reused_tokens) + "</td><td>" + esc(d.prompt_tokens) + "</td><td>" + esc(num(d.ttft_ms, 1)) +
        "</td></tr>");
    }
    document.querySelector("#feed tbody").innerHTML = rows.join("");
  }

  function renderCharts() {
    const s = state.series;
    const pick = (k) => s.map((p) => [p.time, p[k]]);
    drawChart($("chart-ttft"), [{ colour: "#4fb3ff", pts: pick("ttft_p50_ms"), name: "p50" },
      { colour: "#f0a23a", pts: pick("ttft_p99_ms"), name: "p99" }], null);
    drawChart($("chart-hit"), [{ colour: "#47c27a", pts: pick("hit_rate"), name: "hit rate" }], 1);
    drawChart($("chart-acc"), [{ colour: "#c28ff0", pts: pick("prediction_accuracy"), name: "accuracy" }], 1);
    drawChart($("chart-fwd"), [{ colour: "#4fb3ff", pts: pick("forwarded_share"), name: "forwarded" }], 1);
    drawChart($("chart-gossip"), [{ colour: "#c2b447", pts: pick("gossip_bytes_per_s"), name: "B/s" }], null);
    const peers = state.peers.length + 1;
    drawChart($("chart-copies"), [{ colour: "#47c27a", pts: pick("group_copies"), name: "copies" }], peers);
  }

  function drawChart(canvas, lines, fixedMax) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 300, h = canvas.clientHeight || 140;
    if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const all = lines.flatMap((l) => l.pts.filter((p) => p[1] !== null && p[1] !== undefined));
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = "#8593a3";
    if (!all.length) { ctx.fillText("no requests yet", 8, h / 2); return; }
    const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
    const vmax = fixedMax || Math.max(...all.map((p) => p[1])) * 1.1 || 1;
    const L = 38, B = 14, T = 6, Rr = 6;
    const X = (t) => L + ((t - t0) / (t1 - t0)) * (w - L - Rr);
    const Y = (v) => h - B - (v / vmax) * (h - B - T);
    ctx.strokeStyle = "#2a3440";
    ctx.beginPath();
    for (const f of [0, 0.5, 1]) { ctx.moveTo(L, Y(vmax * f)); ctx.lineTo(w - Rr, Y(vmax * f)); }
    ctx.stroke();
    for (const f of [0, 0.5, 1]) {
      const v = vmax * f;
      ctx.fillText(fixedMax ? (fixedMax > 1 ? v.toFixed(0) : v.toFixed(1)) : v >= 1000 ? (v / 1000).toFixed(1) + "k" : v.toFixed(0), 2, Y(v) + 3);
    }
    ctx.fillText(Math.round(t1 - t0) + " s", w - 40, h - 2);
    lines.forEach((l, i) => {
      ctx.strokeStyle = l.colour; ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (const [t, v] of l.pts) {
        if (v === null || v === undefined) { pen = false; continue; }
        if (pen) ctx.lineTo(X(t), Y(v)); else { ctx.moveTo(X(t), Y(v)); pen = true; }
      }
      ctx.stroke();
      ctx.fillStyle = l.colour;
      ctx.fillText(l.name, L + 6 + i * 40, T + 8);
    });
  }

  // -- try it -----------------------------------------------------------------------------
  $("try-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = $("try-output"), facts = $("try-facts"), button = $("try-send");
    out.textContent = ""; out.dataset.chunks = "0"; out.dataset.done = "0"; facts.textContent = "sending…";
    button.disabled = true;
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", credentials: "same-origin",
        headers: Object.assign({ "Content-Type": "application/json" }, CSRF),
        body: JSON.stringify({
          model: "default", stream: true, max_tokens: Number($("try-max-tokens").value) || 48,
          messages: [{ role: "user", content: $("try-prompt").value }],
        }),
      });
      if (!r.ok) {
        let msg = "HTTP " + r.status;
        try { msg += ": " + (await r.json()).error.message; } catch (e) { /* keep the status */ }
        facts.textContent = msg;
        if (r.status === 401) showLogin("the session ended: log in again");
        return;
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          for (const line of block.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const payload = line.slice(6);
            if (payload === "[DONE]") { out.dataset.done = "1"; continue; }
            const msg = JSON.parse(payload);
            if (msg.error) { facts.textContent = "error: " + msg.error.message; continue; }
            const delta = msg.choices && msg.choices[0] && msg.choices[0].delta;
            if (delta && delta.content) {
              out.textContent += delta.content;
              out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
            }
            if (msg.p2pinfer) showFacts(msg.p2pinfer, msg.usage);
          }
        }
      }
    } catch (e) {
      facts.textContent = "failed: " + e;
    } finally {
      button.disabled = false;
    }
  });
  function showFacts(f, usage) {
    const facts = $("try-facts");
    facts.dataset.servedBy = f.served_by;
    facts.textContent = "served by " + (f.served_locally ? "this node" : "peer " + f.served_by) + " · " + f.reason +
      " · predicted " + f.predicted_reused_tokens + " / realised " + f.reused_tokens + " reused of " + f.prompt_tokens +
      " prompt tokens · TTFT " + f.ttft_ms + " ms" + (usage ? " · " + usage.completion_tokens + " tokens" : "");
  }

  window.p2pinferDashboard = { state: state, apply: apply };
  checkSession();
})();
