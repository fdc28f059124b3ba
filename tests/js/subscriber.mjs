// A subscriber driven by the Python chaos tests (tests/juggler/test_recovery_chaos.py):
// the browser client (juggler/static/juggler.js, WebSocket from the `ws` package)
// subscribes to CHANNEL at URL and prints one JSON line per event
// ({"args":…,"offset":…,"epoch":…}), per "unrecovered" notice ({"unrecovered":CHANNEL})
// and per state change ({"state":…}); it stops when its stdin closes.
//
//   node subscriber.mjs ws://127.0.0.1:9000/ws chaos.1
import WebSocket from "ws";

import { Juggler } from "../../juggler/static/juggler.js";

const [url, channel] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const c = new Juggler(url, { WebSocket, initialDelay: 50, maxDelay: 500 });
c.addEventListener("statechange", (ev) => out({ state: ev.detail.state }));
c.addEventListener("unrecovered", (ev) => out({ unrecovered: ev.detail.channel }));
c.addEventListener("error", (ev) => out({ error: String(ev.detail.error) }));
const u = c.subscribe(channel, (args, ev) => out({ args, offset: ev.offset, epoch: ev.epoch }));
u.ready.then(() => out({ subscribed: channel }), (err) => out({ error: String(err) }));

process.stdin.resume();
process.stdin.on("end", () => {
  c.close();
  out({ done: true });
  process.exit(0);
});
