// The demo page of `juggler up`: calls with latency, pub-sub, a live chart of
// the server's counters (/stats.json). Uses only juggler.js and the DOM.
import { Juggler } from "/juggler.js";

const $ = (id) => document.getElementById(id);
const HISTORY = 8;
const EVENTS = 100;
const POINTS = 60; // chart: one point per second

function show(v) {
  return v === undefined ? "" : JSON.stringify(v);
}

function parseArgs(text) {
  // JSON when it parses, else the text as a string (as the REPL does with quotes)
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function now() {
  return new Date().toLocaleTimeString();
}

async function wsUrl() {
  let path = "/ws";
  try {
    const r = await fetch("/stats.json", { cache: "no-store" });
    path = (await r.json()).ws_path || path;
  } catch {
    /* default path */
  }
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}

// connection ----------------------------------------------------------------------

const url = await wsUrl();
$("url").textContent = url;
for (const el of document.querySelectorAll(".wsurl")) el.textContent = url;

let client;
for (;;) {
  try {
    client = await Juggler.connect(url);
    break;
  } catch (err) {
    $("state").textContent = "unreachable, retrying";
    await new Promise((r) => setTimeout(r, 1000));
  }
}
window.juggler = client; // for the console (and the page's tests)
const setState = (s) => {
  // over the HTTP fallback (a proxy refused the websocket), the pill says so
  $("state").textContent = s === "open" && client.transport !== "websocket" ? `open (${client.transport})` : s;
  $("state").className = "pill " + s;
};
setState(client.state);
client.addEventListener("statechange", (ev) => setState(ev.detail.state));
client.addEventListener("open", () => setState(client.state)); // also after switching transports

// calls -------------------------------------------------------------------------------

function addHistory(uri, args, result, ms, failed) {
  const tr = document.createElement("tr");
  for (const text of [uri, show(args), result, ms]) {
    const td = document.createElement("td");
    td.textContent = text;
    td.title = text;
    tr.append(td);
  }
  if (failed) tr.classList.add("error");
  const body = $("call-history");
  body.prepend(tr);
  while (body.children.length > HISTORY) body.lastChild.remove();
}

$("call-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const uri = $("call-uri").value;
  const raw = $("call-args").value;
  const args = uri === "test.delay" ? String(raw) : parseArgs(raw);
  const timeout = Number($("call-timeout").value) || 5000;
  const out = $("call-result");
  out.classList.remove("error");
  out.textContent = "…";
  const t0 = performance.now();
  try {
    const result = await client.call(uri, args, { timeout });
    const ms = (performance.now() - t0).toFixed(1);
    out.textContent = show(result);
    $("call-latency").textContent = `${ms} ms`;
    addHistory(uri, args, show(result), ms, false);
  } catch (err) {
    const ms = (performance.now() - t0).toFixed(1);
    out.textContent = `${err.name}: ${err.message}`;
    out.classList.add("error");
    $("call-latency").textContent = `${ms} ms`;
    addHistory(uri, args, err.name, ms, true);
  }
});

$("burst-btn").addEventListener("click", async () => {
  const btn = $("burst-btn");
  btn.disabled = true;
  const n = 500, inflight = 20;
  const lat = [];
  let next = 0, failed = 0;
  const t0 = performance.now();
  async function worker() {
    while (next < n) {
      next += 1;
      const t = performance.now();
      try {
        await client.call("test.echo", "burst", { timeout: 5000 });
        lat.push(performance.now() - t);
      } catch {
        failed += 1;
      }
    }
  }
  await Promise.all(Array.from({ length: inflight }, worker));
  const secs = (performance.now() - t0) / 1000;
  lat.sort((a, b) => a - b);
  const pct = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(1) : "-");
  $("burst-result").textContent =
    `${lat.length} ok, ${failed} failed in ${secs.toFixed(2)} s (${Math.round(lat.length / secs)} calls/s), ` +
    `median ${pct(0.5)} ms, p99 ${pct(0.99)} ms`;
  btn.disabled = false;
});

// pub-sub ---------------------------------------------------------------------------------

const subs = new Map(); // label -> unsubscribe

function addEvent(args, ev) {
  const li = document.createElement("li");
  const t = document.createElement("span");
  t.className = "t";
  t.textContent = now();
  const ch = document.createElement("span");
  ch.className = "ch";
  ch.textContent = ev.pattern ? `${ev.channel} (${ev.pattern})` : ev.channel;
  const body = document.createElement("code");
  body.textContent = show(args);
  li.append(t, ch, body);
  const list = $("events");
  list.prepend(li);
  while (list.children.length > EVENTS) list.lastChild.remove();
}

function subscribe(channel, pattern) {
  const label = (pattern ? "pattern " : "") + channel;
  if (!channel || subs.has(label)) return;
  const unsub = client.subscribe(channel, addEvent, { pattern });
  subs.set(label, unsub);
  const li = document.createElement("li");
  li.dataset.channel = channel;
  li.textContent = label;
  const x = document.createElement("button");
  x.type = "button";
  x.textContent = "×";
  x.title = "unsubscribe";
  x.addEventListener("click", async () => {
    subs.delete(label);
    li.remove();
    await unsub();
  });
  li.append(x);
  $("subs").append(li);
  unsub.ready.then(
    () => li.classList.add("acked"),
    (err) => {
      li.textContent = `${label}: ${err.message}`;
      subs.delete(label);
    },
  );
}

$("sub-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  subscribe($("sub-channel").value.trim(), $("sub-pattern").checked);
});

$("pub-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    await client.publish($("pub-channel").value.trim(), parseArgs($("pub-args").value));
  } catch (err) {
    addEvent(`${err.name}: ${err.message}`, { channel: "(publish failed)" });
  }
});

subscribe("demo", false);

// live chart --------------------------------------------------------------------------------

const points = []; // {rate, clients}
let last = null;

function draw() {
  const canvas = $("chart");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const left = 44, right = 44, top = 10, bottom = 22;
  const pw = w - left - right, ph = h - top - bottom;
  const maxRate = niceMax(Math.max(20, ...points.map((p) => p.rate)));
  // clients: a multiple of 4, so that every grid line is a whole number
  const maxClients = 4 * Math.ceil(Math.max(4, ...points.map((p) => p.clients)) / 4);
  const css = getComputedStyle(document.documentElement);
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#e2e5ea";
  g.fillStyle = "#6b7385";
  g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + ph - (ph * i) / 4;
    g.beginPath();
    g.moveTo(left, Math.round(y) + 0.5);
    g.lineTo(left + pw, Math.round(y) + 0.5);
    g.stroke();
    g.textAlign = "right";
    g.fillText(String(Math.round((maxRate * i) / 4)), left - 6, y + 4);
    g.textAlign = "left";
    g.fillText(String(Math.round((maxClients * i) / 4)), left + pw + 6, y + 4);
  }
  g.textAlign = "center";
  g.fillText(`last ${POINTS} s`, left + pw / 2, h - 6);
  const line = (key, max, color) => {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    points.forEach((p, i) => {
      const x = left + pw - ((points.length - 1 - i) * pw) / (POINTS - 1);
      const y = top + ph - (ph * p[key]) / max;
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
  };
  line("rate", maxRate, css.getPropertyValue("--calls").trim() || "#2f6fed");
  line("clients", maxClients, css.getPropertyValue("--clients").trim() || "#e8833a");
}

// a round axis maximum >= v (v >= 20) whose quarters are whole numbers
function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 4, 6, 8, 10]) if (v <= m * p && (m * p) % 4 === 0) return m * p;
  return 10 * p;
}

async function poll() {
  try {
    const r = await fetch("/stats.json", { cache: "no-store" });
    const s = await r.json();
    const rate = last ? Math.max(0, (s.calls - last.calls) / Math.max(0.001, s.time - last.time)) : 0;
    last = s;
    points.push({ rate, clients: s.connections_active });
    while (points.length > POINTS) points.shift();
    $("stat-rate").textContent = Math.round(rate);
    $("stat-clients").textContent = s.connections_active;
    $("stat-calls").textContent = s.calls;
    $("stat-events").textContent = s.events;
  } catch {
    // server restarting: keep the chart, try again
  }
  draw();
}

poll();
setInterval(poll, 1000);
window.addEventListener("resize", draw);
document.body.dataset.ready = "1";
