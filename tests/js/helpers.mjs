// Helpers of the JavaScript tests: real `juggler` processes on free loopback ports.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const PYTHON =
  process.env.JUGGLER_PYTHON ||
  (existsSync(path.join(ROOT, ".venv/bin/python")) ? path.join(ROOT, ".venv/bin/python") : "python3");

/** A TCP port free on 127.0.0.1 right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host: "127.0.0.1" });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

/** Resolves once something accepts on 127.0.0.1:port (bounded). */
export async function waitForPort(port, { timeout = 30000, proc } = {}) {
  const deadline = Date.now() + timeout;
  while (Date.now() < deadline) {
    if (proc && proc.exitCode !== null) throw new Error(`process exited (${proc.exitCode}) before listening`);
    if (await canConnect(port)) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listening on 127.0.0.1:${port} after ${timeout} ms`);
}

/** Resolves when `predicate()` is truthy (polling), or rejects after `timeout` ms. */
export async function until(predicate, { timeout = 10000, what = "condition" } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const v = await predicate();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * `juggler up` (or `juggler server …`) as a subprocess on a fixed port; stop()
 * and start() again for restarts on the same port.
 */
export class JugglerProc {
  constructor(args, port) {
    this.args = args;
    this.port = port;
    this.proc = null;
    this.output = "";
  }

  static async up(extra = []) {
    const port = await freePort();
    const p = new JugglerProc(["up", "--listen", `127.0.0.1:${port}`, ...extra], port);
    await p.start();
    return p;
  }

  /** `juggler server --config FILE` with the given TOML text. */
  static async server(toml) {
    const port = await freePort();
    const dir = mkdtempSync(path.join(os.tmpdir(), "juggler-js-"));
    const file = path.join(dir, "juggler.toml");
    writeFileSync(file, toml);
    const p = new JugglerProc(["server", "--config", file, "--listen", `127.0.0.1:${port}`], port);
    await p.start();
    return p;
  }

  get wsUrl() {
    return `ws://127.0.0.1:${this.port}/ws`;
  }

  get httpUrl() {
    return `http://127.0.0.1:${this.port}/`;
  }

  async start() {
    this.proc = spawn(PYTHON, ["-m", "cli", ...this.args], {
      cwd: ROOT,
      env: { ...process.env, PYTHONUNBUFFERED: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const keep = (d) => {
      this.output = (this.output + d.toString()).slice(-20000);
    };
    this.proc.stdout.on("data", keep);
    this.proc.stderr.on("data", keep);
    try {
      await waitForPort(this.port, { proc: this.proc });
    } catch (err) {
      this.kill();
      throw new Error(`juggler ${this.args.join(" ")} did not start: ${err.message}\n${this.output}`);
    }
  }

  /** SIGTERM, then SIGKILL after `timeout` ms; resolves when the process is gone. */
  async stop(timeout = 15000) {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), timeout);
    await gone;
    clearTimeout(t);
  }

  kill() {
    if (this.proc && this.proc.exitCode === null) this.proc.kill("SIGKILL");
  }

  async restart() {
    await this.stop();
    await this.start();
  }
}

/**
 * `juggler client` (the REPL) as a real subprocess reading commands from a
 * pipe: run(lines) writes them, closes stdin and resolves with the output.
 */
export function repl(lines, { timeout = 30000 } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(PYTHON, ["-m", "cli", "client"], {
      cwd: ROOT,
      env: { ...process.env, PYTHONUNBUFFERED: "1" },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    proc.stdout.on("data", (d) => (out += d));
    proc.stderr.on("data", (d) => (out += d));
    const t = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`juggler client timed out:\n${out}`));
    }, timeout);
    proc.on("exit", (code) => {
      clearTimeout(t);
      if (code === 0) resolve(out);
      else reject(new Error(`juggler client exited ${code}:\n${out}`));
    });
    proc.stdin.end(lines.join("\n") + "\n");
  });
}
