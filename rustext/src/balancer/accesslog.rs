//! Access logs: one line per request, in a format compiled once at load.
//!
//! A format (HAProxy's `log-format` variables, see [`compile`]) becomes a
//! list of [`Seg`]ments: literal bytes and variable ids. A request's
//! [`Record`] borrows what the request path already holds; formatting
//! appends to the worker's reusable buffer ([`LogBuf`]) without allocating.
//! Full buffers (and every housekeeping tick) go to a writer thread through
//! a bounded channel: a slow disk never blocks a forwarding loop; when the
//! channel is full the lines are dropped and counted.
//!
//! Values taken from the request or the response (target, headers, ids) are
//! escaped: in text lines, `"`, `\`, control bytes and bytes >= 0x80 become
//! `\xHH`; in JSON lines, JSON string escapes. A line never carries a
//! newline it did not get from the format itself.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The default text format: HAProxy's `option httplog` line, less its
/// cookie, connection-count and queue fields, with the request id.
pub const DEFAULT_FORMAT: &str =
    "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %U %tsc %rc %ID \"%r\"";
/// nginx's `combined` format, as near as the balancer's variables go.
pub const COMBINED_FORMAT: &str =
    "%ci - - [%tr] \"%r\" %ST %B \"%[req.hdr(Referer)]\" \"%[req.hdr(User-Agent)]\"";

/// A variable of a format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Var {
    ClientIp,
    ClientPort,
    /// Time the request was received, `26/Nov/2026:22:59:49.123` (UTC).
    TimeHaproxy,
    /// The same as ISO 8601, `2026-11-26T22:59:49.123Z`.
    TimeIso,
    /// Seconds since the epoch, with milliseconds.
    TimeUnix,
    Frontend,
    Backend,
    Server,
    Method,
    Path,
    Query,
    Version,
    RequestLine,
    Status,
    BytesSent,
    BytesReceived,
    THead,
    TQueue,
    TConnect,
    TResponse,
    TTotal,
    Retries,
    RequestId,
    ReqHeader(String),
    ResHeader(String),
    Termination,
    /// HAProxy's four-letter `%tsc`: the termination state, then `--` (no persistence cookies here).
    TerminationCookie,
}

/// Variable names of the text format, HAProxy's where it has one.
const NAMES: &[(&str, Var)] = &[
    ("ci", Var::ClientIp),
    ("cp", Var::ClientPort),
    ("tr", Var::TimeHaproxy),
    ("t", Var::TimeHaproxy),
    ("Ts", Var::TimeUnix),
    ("ft", Var::Frontend),
    ("f", Var::Frontend),
    ("b", Var::Backend),
    ("s", Var::Server),
    ("HM", Var::Method),
    ("HP", Var::Path),
    ("HQ", Var::Query),
    ("HV", Var::Version),
    ("r", Var::RequestLine),
    ("ST", Var::Status),
    ("B", Var::BytesSent),
    ("U", Var::BytesReceived),
    ("TR", Var::THead),
    ("Tw", Var::TQueue),
    ("Tc", Var::TConnect),
    ("Tr", Var::TResponse),
    ("Ta", Var::TTotal),
    ("rc", Var::Retries),
    ("ID", Var::RequestId),
    ("ts", Var::Termination),
    ("tsc", Var::TerminationCookie),
];

/// The names of the JSON format's fields, in order.
const JSON_FIELDS: &[(&str, Var)] = &[
    ("time", Var::TimeIso),
    ("client_ip", Var::ClientIp),
    ("client_port", Var::ClientPort),
    ("frontend", Var::Frontend),
    ("backend", Var::Backend),
    ("server", Var::Server),
    ("method", Var::Method),
    ("path", Var::Path),
    ("query", Var::Query),
    ("version", Var::Version),
    ("status", Var::Status),
    ("bytes_sent", Var::BytesSent),
    ("bytes_received", Var::BytesReceived),
    ("time_head_ms", Var::THead),
    ("time_queue_ms", Var::TQueue),
    ("time_connect_ms", Var::TConnect),
    ("time_response_ms", Var::TResponse),
    ("time_total_ms", Var::TTotal),
    ("retries", Var::Retries),
    ("request_id", Var::RequestId),
    ("termination", Var::Termination),
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Lit(Vec<u8>),
    Var(Var),
    /// JSON: a field `"name":` then the variable's value.
    Field(&'static str, Var),
}

/// A compiled format.
#[derive(Clone, Debug)]
pub struct Format {
    pub segs: Vec<Seg>,
    pub json: bool,
    /// Request and response header names the format uses (lower case).
    pub req_headers: Vec<String>,
    pub res_headers: Vec<String>,
}

/// Compile a format: `json`, `haproxy` (the default), `combined`, or a
/// string of literal text and `%var` / `%{+Q}var` / `%[sample]` variables.
/// `%%` is a literal `%`.
pub fn compile(spec: &str) -> Result<Format, String> {
    match spec {
        "json" => {
            return Ok(Format {
                segs: JSON_FIELDS.iter().map(|(n, v)| Seg::Field(n, v.clone())).collect(),
                json: true,
                req_headers: Vec::new(),
                res_headers: Vec::new(),
            })
        }
        "" | "haproxy" | "httplog" => return compile(DEFAULT_FORMAT),
        "combined" => return compile(COMBINED_FORMAT),
        _ => {}
    }
    if let Some(c) = spec.chars().find(|c| c.is_control()) {
        return Err(format!("a control character ({:?}) in the format", c));
    }
    let b = spec.as_bytes();
    let mut segs = Vec::new();
    let mut lit = Vec::new();
    let mut f = Format { segs: Vec::new(), json: false, req_headers: Vec::new(), res_headers: Vec::new() };
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            lit.push(b[i]);
            i += 1;
            continue;
        }
        i += 1;
        if i < b.len() && b[i] == b'%' {
            lit.push(b'%');
            i += 1;
            continue;
        }
        // %{+Q}: HAProxy's flags; quoting is spelled in the format here, escaping is always on
        if i < b.len() && b[i] == b'{' {
            let end = spec[i..].find('}').ok_or_else(|| format!("unbalanced '{{' at offset {}", i))?;
            i += end + 1;
        }
        let var = if i < b.len() && b[i] == b'[' {
            let end = spec[i..].find(']').ok_or_else(|| format!("unbalanced '[' at offset {}", i))?;
            let sample = &spec[i + 1..i + end];
            i += end + 1;
            sample_var(sample, &mut f)?
        } else {
            let start = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            let name = &spec[start..i];
            let var = NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| {
                    if name.is_empty() {
                        format!("'%' at offset {} names no variable (write %% for a percent sign)", start - 1)
                    } else {
                        format!("unknown variable %{name}")
                    }
                })?;
            var
        };
        if !lit.is_empty() {
            segs.push(Seg::Lit(std::mem::take(&mut lit)));
        }
        segs.push(Seg::Var(var));
    }
    if !lit.is_empty() {
        segs.push(Seg::Lit(lit));
    }
    f.segs = segs;
    Ok(f)
}

fn sample_var(sample: &str, f: &mut Format) -> Result<Var, String> {
    let header = |prefix: &str| -> Option<String> {
        let rest = sample.strip_prefix(prefix)?.strip_suffix(')')?;
        Some(rest.trim().to_ascii_lowercase())
    };
    let ok_name = |n: &str| !n.is_empty() && n.bytes().all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
    if let Some(n) = header("req.hdr(").or_else(|| header("req.fhdr(")) {
        if !ok_name(&n) {
            return Err(format!("invalid header name in %[{sample}]"));
        }
        f.req_headers.push(n.clone());
        return Ok(Var::ReqHeader(n));
    }
    if let Some(n) = header("res.hdr(").or_else(|| header("res.fhdr(")) {
        if !ok_name(&n) {
            return Err(format!("invalid header name in %[{sample}]"));
        }
        f.res_headers.push(n.clone());
        return Ok(Var::ResHeader(n));
    }
    Ok(match sample {
        "req.id" | "unique-id" => Var::RequestId,
        "time.iso" | "date_iso" => Var::TimeIso,
        "time.unix" => Var::TimeUnix,
        "method" => Var::Method,
        "path" => Var::Path,
        "query" => Var::Query,
        "req.ver" => Var::Version,
        "status" => Var::Status,
        "src" => Var::ClientIp,
        "src_port" => Var::ClientPort,
        "be_name" => Var::Backend,
        "srv_name" => Var::Server,
        "fe_name" => Var::Frontend,
        _ => return Err(format!("unknown variable %[{sample}]")),
    })
}

/// Where a request's headers are, for `%[req.hdr()]` / `%[res.hdr()]`.
#[derive(Clone, Copy)]
pub enum Headers<'a> {
    None,
    /// A raw HTTP/1 head (request or status line first), scanned by name.
    Raw(&'a [u8]),
    Map(&'a http::HeaderMap),
}

impl<'a> Headers<'a> {
    fn get(&self, name: &str) -> Option<&'a [u8]> {
        match *self {
            Headers::None => None,
            Headers::Map(m) => m.get(name).map(|v| v.as_bytes()),
            Headers::Raw(head) => {
                let mut lines = head
                    .split(|&c| c == b'\n')
                    .skip(1)
                    .take_while(|l| !l.is_empty() && *l != b"\r");
                lines.find_map(|l| {
                    let l = l.strip_suffix(b"\r").unwrap_or(l);
                    let colon = l.iter().position(|&c| c == b':')?;
                    if l[..colon].eq_ignore_ascii_case(name.as_bytes()) {
                        let v = &l[colon + 1..];
                        let s = v.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(v.len());
                        let e = v.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(s, |e| e + 1);
                        Some(&v[s..e])
                    } else {
                        None
                    }
                })
            }
        }
    }
}

/// Timings of a request in milliseconds (None: did not happen, logged `-1`).
#[derive(Clone, Copy, Default, Debug)]
pub struct Timings {
    pub head: Option<Duration>,
    pub queue: Option<Duration>,
    pub connect: Option<Duration>,
    pub response: Option<Duration>,
    pub total: Duration,
}

/// Everything one line may show; borrowed from the request path.
pub struct Record<'a> {
    pub client: SocketAddr,
    pub when: SystemTime,
    pub frontend: &'a str,
    pub backend: &'a str,
    pub server: &'a str,
    pub method: &'a [u8],
    /// The request target (path and query).
    pub target: &'a [u8],
    pub version: &'a str,
    pub status: u16,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub timings: Timings,
    pub retries: u32,
    pub request_id: &'a [u8],
    pub req_headers: Headers<'a>,
    pub res_headers: Headers<'a>,
    /// Two letters, as HAProxy's `%tsc`: `--` normal, see the manual.
    pub termination: &'static str,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Text escaping: printable ASCII but `"` and `\` as is, the rest `\xHH`.
pub fn escape_text(out: &mut Vec<u8>, v: &[u8]) {
    for &c in v {
        if (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\' {
            out.push(c);
        } else {
            out.extend_from_slice(&[b'\\', b'x', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
        }
    }
}

/// JSON string content: valid UTF-8 as is (escaped per RFC 8259); bytes of
/// invalid UTF-8 as `\u00HH`.
pub fn escape_json(out: &mut Vec<u8>, v: &[u8]) {
    let mut rest = v;
    while !rest.is_empty() {
        let (good, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s.as_bytes(), &b""[..]),
            Err(e) => rest.split_at(e.valid_up_to()),
        };
        for &c in good {
            match c {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0..=0x1f | 0x7f => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]),
                _ => out.push(c),
            }
        }
        if let Some((&c, tail)) = bad.split_first() {
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
            rest = tail;
        } else {
            rest = b"";
        }
    }
}

fn num(out: &mut Vec<u8>, n: u64) {
    let mut b = [0u8; 20];
    let mut i = b.len();
    let mut n = n;
    loop {
        i -= 1;
        b[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&b[i..]);
}

fn pad(out: &mut Vec<u8>, n: u64, width: usize) {
    let start = out.len();
    num(out, n);
    while out.len() - start < width {
        out.insert(start, b'0');
    }
}

/// (year, month, day) of a count of days since 1970-01-01 (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn time(out: &mut Vec<u8>, when: SystemTime, iso: bool) {
    let d = when.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil((secs / 86_400) as i64);
    let s = secs % 86_400;
    let (hh, mm, ss, ms) = (s / 3600, s / 60 % 60, s % 60, u64::from(d.subsec_millis()));
    if iso {
        pad(out, y as u64, 4);
        out.push(b'-');
        pad(out, u64::from(m), 2);
        out.push(b'-');
        pad(out, u64::from(day), 2);
        out.push(b'T');
    } else {
        pad(out, u64::from(day), 2);
        out.push(b'/');
        out.extend_from_slice(MONTHS[m as usize - 1].as_bytes());
        out.push(b'/');
        pad(out, y as u64, 4);
        out.push(b':');
    }
    pad(out, hh, 2);
    out.push(b':');
    pad(out, mm, 2);
    out.push(b':');
    pad(out, ss, 2);
    out.push(b'.');
    pad(out, ms, 3);
    if iso {
        out.push(b'Z');
    }
}

fn ms(out: &mut Vec<u8>, d: Option<Duration>) {
    match d {
        Some(d) => num(out, d.as_millis() as u64),
        None => out.extend_from_slice(b"-1"),
    }
}

impl Format {
    /// Append `r`'s line (with its newline) to `out`.
    pub fn write(&self, out: &mut Vec<u8>, r: &Record<'_>) {
        if self.json {
            out.push(b'{');
        }
        for (i, s) in self.segs.iter().enumerate() {
            match s {
                Seg::Lit(l) => out.extend_from_slice(l),
                Seg::Var(v) => self.var(out, v, r),
                Seg::Field(name, v) => {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.push(b'"');
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b"\":");
                    self.var(out, v, r);
                }
            }
        }
        if self.json {
            out.push(b'}');
        }
        out.push(b'\n');
    }

    fn string(&self, out: &mut Vec<u8>, v: &[u8]) {
        if self.json {
            out.push(b'"');
            escape_json(out, v);
            out.push(b'"');
        } else if v.is_empty() {
            out.push(b'-');
        } else {
            escape_text(out, v);
        }
    }

    fn var(&self, out: &mut Vec<u8>, v: &Var, r: &Record<'_>) {
        let (path, query) = match r.target.iter().position(|&c| c == b'?') {
            Some(q) => (&r.target[..q], &r.target[q..]),
            None => (r.target, &b""[..]),
        };
        match v {
            Var::ClientIp => {
                let mut b = [0u8; 64];
                let mut c = std::io::Cursor::new(&mut b[..]);
                let _ = write!(c, "{}", r.client.ip());
                let n = c.position() as usize;
                self.string(out, &b[..n]);
            }
            Var::ClientPort => num(out, u64::from(r.client.port())),
            Var::TimeHaproxy | Var::TimeIso => {
                if self.json {
                    out.push(b'"');
                }
                time(out, r.when, *v == Var::TimeIso);
                if self.json {
                    out.push(b'"');
                }
            }
            Var::TimeUnix => {
                let d = r.when.duration_since(UNIX_EPOCH).unwrap_or_default();
                num(out, d.as_secs());
                out.push(b'.');
                pad(out, u64::from(d.subsec_millis()), 3);
            }
            Var::Frontend => self.string(out, r.frontend.as_bytes()),
            Var::Backend => self.string(out, r.backend.as_bytes()),
            Var::Server => self.string(out, r.server.as_bytes()),
            Var::Method => self.string(out, r.method),
            Var::Path => self.string(out, path),
            Var::Query => self.string(out, query),
            Var::Version => self.string(out, r.version.as_bytes()),
            Var::RequestLine => {
                if self.json {
                    out.push(b'"');
                }
                if r.method.is_empty() {
                    out.extend_from_slice(b"<BADREQ>");
                } else {
                    let esc = |out: &mut Vec<u8>, v: &[u8]| if self.json { escape_json(out, v) } else { escape_text(out, v) };
                    esc(out, r.method);
                    out.push(b' ');
                    esc(out, r.target);
                    out.push(b' ');
                    esc(out, r.version.as_bytes());
                }
                if self.json {
                    out.push(b'"');
                }
            }
            Var::Status => num(out, u64::from(r.status)),
            Var::BytesSent => num(out, r.bytes_sent),
            Var::BytesReceived => num(out, r.bytes_received),
            Var::THead => ms(out, r.timings.head),
            Var::TQueue => ms(out, r.timings.queue),
            Var::TConnect => ms(out, r.timings.connect),
            Var::TResponse => ms(out, r.timings.response),
            Var::TTotal => ms(out, Some(r.timings.total)),
            Var::Retries => num(out, u64::from(r.retries)),
            Var::RequestId => self.string(out, r.request_id),
            Var::ReqHeader(n) => self.string(out, r.req_headers.get(n).unwrap_or(b"")),
            Var::ResHeader(n) => self.string(out, r.res_headers.get(n).unwrap_or(b"")),
            Var::Termination => self.string(out, r.termination.as_bytes()),
            Var::TerminationCookie => {
                escape_text(out, r.termination.as_bytes());
                out.extend_from_slice(b"--");
            }
        }
    }
}

/// Where lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogSpec {
    /// A file (appended to; reopened on [`AccessLog::reopen`]) or `-`: standard output.
    pub path: String,
    pub format: String,
}

/// Lines handed to the writer at once per worker buffer (bytes).
const FLUSH_AT: usize = 32 * 1024;
/// Buffers queued for the writer; beyond, lines are dropped.
const QUEUE: usize = 64;

enum Msg {
    Lines(Vec<u8>),
    Wake,
    /// Answer once everything before has been written.
    Sync(SyncSender<()>),
}

/// The log of a running balancer: its format (replaced on reload), the
/// writer thread's channel and counters.
pub struct AccessLog {
    pub format: RwLock<Arc<Format>>,
    tx: SyncSender<Msg>,
    reopen: Arc<AtomicBool>,
    pub dropped: AtomicU64,
    pub written: Arc<AtomicU64>,
}

fn open(path: &str) -> std::io::Result<Box<dyn Write + Send>> {
    if path == "-" {
        return Ok(Box::new(std::io::stdout()));
    }
    Ok(Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?))
}

impl AccessLog {
    /// Open the file and start the writer thread.
    pub fn start(spec: &AccessLogSpec) -> Result<AccessLog, String> {
        let format = compile(&spec.format)?;
        let mut out = open(&spec.path).map_err(|e| format!("cannot open the access log {}: {e}", spec.path))?;
        let (tx, rx): (SyncSender<Msg>, Receiver<Msg>) = sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (path, flag, count) = (spec.path.clone(), reopen.clone(), written.clone());
        std::thread::Builder::new()
            .name("balancer-access-log".into())
            .spawn(move || {
                // ends when the balancer (every sender) is gone
                while let Ok(m) = rx.recv() {
                    if flag.swap(false, Relaxed) {
                        let _ = out.flush();
                        if let Ok(o) = open(&path) {
                            out = o;
                        }
                    }
                    match m {
                        Msg::Lines(b) => {
                            if out.write_all(&b).is_ok() {
                                count.fetch_add(b.iter().filter(|&&c| c == b'\n').count() as u64, Relaxed);
                            }
                            let _ = out.flush();
                        }
                        Msg::Sync(ack) => {
                            let _ = ack.try_send(());
                        }
                        Msg::Wake => {}
                    }
                }
            })
            .map_err(|e| format!("cannot start the access log writer: {e}"))?;
        Ok(AccessLog {
            format: RwLock::new(Arc::new(format)),
            tx,
            reopen,
            dropped: AtomicU64::new(0),
            written,
        })
    }

    /// Reopen the file (after logrotate moved it), with a new format if given.
    pub fn reopen(&self, format: Option<&str>) -> Result<(), String> {
        if let Some(f) = format {
            let f = compile(f)?;
            *self.format.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(f);
        }
        self.reopen.store(true, Relaxed);
        let _ = self.tx.try_send(Msg::Wake);
        Ok(())
    }

    /// Wait up to `timeout` for the writer to write what it was given (at
    /// the end of a drain, so that a stopping process keeps its last lines).
    pub fn sync(&self, timeout: Duration) {
        let (ack, done) = sync_channel(1);
        if self.tx.try_send(Msg::Sync(ack)).is_ok() {
            let _ = done.recv_timeout(timeout);
        }
    }

    /// Format `r` into the worker's buffer; hand the buffer over when full.
    pub fn log(&self, buf: &LogBuf, r: &Record<'_>) {
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        self.format.read().unwrap_or_else(|e| e.into_inner()).write(&mut g.0, r);
        g.1 += 1;
        if g.0.len() >= FLUSH_AT {
            self.send(&mut g);
        }
    }

    /// Hand what the worker's buffer holds to the writer (every tick).
    pub fn flush(&self, buf: &LogBuf) {
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.1 > 0 {
            self.send(&mut g);
        }
    }

    fn send(&self, g: &mut (Vec<u8>, u64)) {
        let lines = std::mem::replace(&mut g.0, Vec::with_capacity(FLUSH_AT + 4096));
        match self.tx.try_send(Msg::Lines(lines)) {
            Ok(()) => {}
            Err(TrySendError::Full(Msg::Lines(mut back))) | Err(TrySendError::Disconnected(Msg::Lines(mut back))) => {
                self.dropped.fetch_add(g.1, Relaxed);
                back.clear();
                g.0 = back;
            }
            Err(_) => {}
        }
        g.1 = 0;
    }
}

/// A worker's buffer of formatted lines and how many it holds.
#[derive(Default)]
pub struct LogBuf(Mutex<(Vec<u8>, u64)>);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record<'a>(target: &'a [u8], head: &'a [u8]) -> Record<'a> {
        Record {
            client: "10.1.2.3:4567".parse().unwrap(),
            when: UNIX_EPOCH + Duration::from_millis(1_764_197_989_123),
            frontend: "127.0.0.1:8080",
            backend: "api",
            server: "127.0.0.1:9001",
            method: b"GET",
            target,
            version: "HTTP/1.1",
            status: 200,
            bytes_sent: 5,
            bytes_received: 0,
            timings: Timings { head: Some(Duration::from_millis(1)), total: Duration::from_millis(7), ..Default::default() },
            retries: 0,
            request_id: b"abc",
            req_headers: Headers::Raw(head),
            res_headers: Headers::None,
            termination: "--",
        }
    }

    fn line(fmt: &str, r: &Record<'_>) -> String {
        let mut out = Vec::new();
        compile(fmt).unwrap().write(&mut out, r);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn compiles_segments() {
        let f = compile("%ci:%cp \"%r\" %[req.hdr(User-Agent)] 100%%").unwrap();
        assert_eq!(f.segs[0], Seg::Var(Var::ClientIp));
        assert_eq!(f.segs[1], Seg::Lit(b":".to_vec()));
        assert_eq!(f.segs[5], Seg::Lit(b"\" ".to_vec()));
        assert_eq!(f.segs[6], Seg::Var(Var::ReqHeader("user-agent".into())));
        assert_eq!(f.segs[7], Seg::Lit(b" 100%".to_vec()));
        assert_eq!(f.req_headers, vec!["user-agent".to_string()]);
        // the longest name wins: %tsc is not %t then "sc"; %ST is not %s then "T"
        assert_eq!(compile("%tsc").unwrap().segs, vec![Seg::Var(Var::TerminationCookie)]);
        assert_eq!(compile("%ts").unwrap().segs, vec![Seg::Var(Var::Termination)]);
        assert_eq!(compile("%ST").unwrap().segs, vec![Seg::Var(Var::Status)]);
        assert_eq!(compile("%{+Q}r").unwrap().segs, vec![Seg::Var(Var::RequestLine)]);
    }

    #[test]
    fn refuses_bad_formats() {
        assert!(compile("%zz").unwrap_err().contains("unknown variable %zz"));
        assert!(compile("%[req.hdr(x)").unwrap_err().contains("unbalanced '['"));
        assert!(compile("%{+Q r").unwrap_err().contains("unbalanced '{'"));
        assert!(compile("%[nope]").unwrap_err().contains("unknown variable %[nope]"));
        assert!(compile("a % b").is_err());
        assert!(compile("a\nb").is_err());
    }

    #[test]
    fn formats_a_line() {
        let r = record(b"/a/b?x=1", b"GET / HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n");
        assert_eq!(
            line(DEFAULT_FORMAT, &r),
            "10.1.2.3:4567 [26/Nov/2025:22:59:49.123] 127.0.0.1:8080 api/127.0.0.1:9001 1/-1/-1/-1/7 200 5 0 ---- 0 abc \"GET /a/b?x=1 HTTP/1.1\"\n"
        );
        assert_eq!(line("%HP|%HQ|%[req.hdr(user-agent)]|%[time.iso]", &r), "/a/b|?x=1|curl/8|2025-11-26T22:59:49.123Z\n");
        let j = line("json", &r);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["query"], "?x=1");
        assert_eq!(v["time_response_ms"], -1);
    }

    #[test]
    fn escapes_values() {
        let r = record(b"/\"q\"\\\x01\xff", b"GET / HTTP/1.1\r\nX: a\"b\r\n\r\n");
        assert_eq!(line("%HP %[req.hdr(x)]", &r), "/\\x22q\\x22\\x5c\\x01\\xff a\\x22b\n");
        let j = line("json", &r);
        let v: serde_json::Value = serde_json::from_str(j.trim_end()).unwrap();
        assert_eq!(v["path"], "/\"q\"\\\u{1}\u{ff}");
    }

    proptest! {
        #[test]
        fn no_value_brings_a_newline(v in proptest::collection::vec(any::<u8>(), 0..64)) {
            for fmt in ["%HP %[req.hdr(x)] %r", "json"] {
                let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
                head.extend(v.iter().filter(|&&c| c != b'\n' && c != b'\r'));
                head.extend_from_slice(b"\r\n\r\n");
                let r = record(&v, &head);
                let mut out = Vec::new();
                compile(fmt).unwrap().write(&mut out, &r);
                prop_assert_eq!(out.iter().filter(|&&c| c == b'\n' || c == b'\r').count(), 1);
                prop_assert_eq!(out.last(), Some(&b'\n'));
                if fmt == "json" {
                    let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
                    prop_assert!(parsed.is_object());
                }
            }
        }
    }
}
