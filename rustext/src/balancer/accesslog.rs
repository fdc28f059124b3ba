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
    /// The listener's index (its access log and format); past the configured ones: the top-level log.
    pub listener: usize,
    pub client: SocketAddr,
    /// The client came over a Unix socket: `%ci` is `unix` and `%cp` the
    /// listener's number (from 1), as HAProxy logs such a client (`unix:1`).
    pub unix: bool,
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
            Var::ClientIp if r.unix => self.string(out, b"unix"),
            Var::ClientPort if r.unix => num(out, r.listener as u64 + 1),
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
/// Where the lines of one access log go, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogSpec {
    /// A file (appended to), `-` for standard output, or empty with `syslog`.
    pub path: String,
    pub format: String,
    /// Send each line as a syslog message instead of writing a file.
    pub syslog: Option<SyslogSpec>,
    /// Log connections closed before sending a byte (HAProxy without `option dontlognull`).
    pub log_empty: bool,
}

impl AccessLogSpec {
    /// What identifies the writer: two listeners logging to the same place
    /// (with the same syslog settings) share it.
    fn destination(&self) -> String {
        match &self.syslog {
            Some(s) => format!("syslog:{s:?}"),
            None => self.path.clone(),
        }
    }
}

/// A listener's access log: the top-level one, none, or its own.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ListenerLog {
    #[default]
    Inherit,
    Off,
    Own(AccessLogSpec),
    /// Whatever it had (a listener removed by a reload, its connections draining).
    Keep,
}

/// A syslog destination (RFC 3164 as HAProxy sends by default, or RFC 5424).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyslogSpec {
    /// `udp://host:port`, `tcp://host:port` or `unix:/dev/log` (a datagram socket).
    pub address: String,
    /// 0..=23 (`local0` is 16).
    pub facility: u8,
    pub rfc5424: bool,
    /// Over TCP: each message ends with a newline (HAProxy's `log-proto
    /// legacy`, for receivers that read lines) instead of RFC 6587's octet
    /// counting (`LEN SP MSG`, the default). The lines never hold a newline.
    pub newline_framing: bool,
    pub tag: String,
    /// Longer messages are cut (HAProxy's `len`, 1024 by default).
    pub max_length: usize,
}

const FLUSH_AT: usize = 32 * 1024;
const QUEUE: usize = 64;

enum Msg {
    Lines(Vec<u8>),
    Wake,
    Sync(SyncSender<()>),
}

/// One writer thread and its channel: a file, stdout or a syslog socket.
/// The thread ends (closing its file or socket) when the last `Sink` goes.
struct Sink {
    destination: String,
    tx: SyncSender<Msg>,
    reopen: Arc<AtomicBool>,
    /// No route names it any more: it only writes lines still buffered.
    retired: AtomicBool,
}

impl Sink {
    fn ask_reopen(&self) {
        if !self.retired.load(Relaxed) {
            self.reopen.store(true, Relaxed);
            let _ = self.tx.try_send(Msg::Wake);
        }
    }
}

/// How a listener's lines are written.
#[derive(Clone)]
struct LogRoute {
    sink: usize,
    format: Arc<Format>,
    log_empty: bool,
}

/// The formats and writers in force; swapped whole on reload.
#[derive(Clone, Default)]
struct Routes {
    /// For listeners not in `by_listener` (the HTTP-to-HTTPS redirect listener, listeners added by a reload).
    default: Option<LogRoute>,
    by_listener: Vec<Option<LogRoute>>,
    /// Writers by id: a worker's buffered lines name theirs. Ids are never
    /// reused; a closed writer's place stays `None`.
    sinks: Vec<Option<Arc<Sink>>>,
}

impl Routes {
    fn get(&self, listener: usize) -> Option<&LogRoute> {
        match self.by_listener.get(listener) {
            Some(r) => r.as_ref(),
            None => self.default.as_ref(),
        }
    }

    fn live_sinks(&self) -> impl Iterator<Item = &Arc<Sink>> {
        self.sinks.iter().flatten()
    }
}

/// Writers opened at most over a balancer's life (each reload that names a
/// new destination opens one).
const MAX_SINKS: usize = 1024;
/// How long a writer no longer named by any listener stays, for the lines
/// the workers still hold for it (they hand them over every tick).
const RETIRE_AFTER: Duration = Duration::from_secs(3);

/// Every access log of a balancer: a writer per destination, a format per
/// listener. Destinations and formats change on reload ([`AccessLog::prepare`],
/// [`AccessLog::commit`]).
pub struct AccessLog {
    routes: Arc<RwLock<Arc<Routes>>>,
    /// Some listener logs (read on every request: no lock).
    active: AtomicBool,
    pub dropped: Arc<AtomicU64>,
    pub written: Arc<AtomicU64>,
}

/// A reload's access logs, checked and with their new destinations open
/// (dropping it closes them): [`AccessLog::commit`] puts it in force.
pub struct Prepared {
    formats: std::collections::HashMap<String, Arc<Format>>,
    opened: Vec<Arc<Sink>>,
}

fn open(path: &str) -> std::io::Result<Box<dyn Write + Send>> {
    if path == "-" {
        return Ok(Box::new(std::io::stdout()));
    }
    Ok(Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?))
}

/// A connection to a syslog server: a datagram socket (UDP, the local
/// daemon's `/dev/log`), or a TCP stream carrying RFC 6587 frames: octet
/// counting (`LEN SP MSG`) or, for receivers that read lines, newline-ended
/// messages (HAProxy's ring servers' `log-proto octet-count` / `legacy`).
enum SyslogSocket {
    Udp(std::net::UdpSocket),
    Unix(std::os::unix::net::UnixDatagram),
    Tcp(std::net::TcpStream),
}

/// A TCP syslog server that does not accept within this is tried again later.
const SYSLOG_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A TCP syslog server that stops reading: the connection is dropped (and
/// its lines counted as dropped) rather than the writer waiting on it.
const SYSLOG_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// After a failed connection, lines are dropped without trying again for this long.
const SYSLOG_RETRY_AFTER: Duration = Duration::from_secs(1);

impl SyslogSocket {
    fn resolve(hostport: &str) -> std::io::Result<SocketAddr> {
        std::net::ToSocketAddrs::to_socket_addrs(hostport)?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))
    }

    fn connect(address: &str) -> std::io::Result<SyslogSocket> {
        if let Some(path) = address.strip_prefix("unix:") {
            let s = std::os::unix::net::UnixDatagram::unbound()?;
            s.connect(path)?;
            return Ok(SyslogSocket::Unix(s));
        }
        if let Some(hostport) = address.strip_prefix("tcp://") {
            let s = std::net::TcpStream::connect_timeout(&Self::resolve(hostport)?, SYSLOG_CONNECT_TIMEOUT)?;
            s.set_write_timeout(Some(SYSLOG_WRITE_TIMEOUT))?;
            s.set_nodelay(true)?;
            return Ok(SyslogSocket::Tcp(s));
        }
        let to = Self::resolve(address.strip_prefix("udp://").unwrap_or(address))?;
        let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
        let s = std::net::UdpSocket::bind(any)?;
        s.connect(to)?;
        Ok(SyslogSocket::Udp(s))
    }

    /// Whether the server has closed a TCP connection (a restart): writing to
    /// it would seem to succeed once and lose those lines.
    fn closed_by_peer(&self) -> bool {
        let SyslogSocket::Tcp(t) = self else { return false };
        let mut b = [0u8; 1];
        if t.set_nonblocking(true).is_err() {
            return true;
        }
        let r = t.peek(&mut b);
        let _ = t.set_nonblocking(false);
        match r {
            Ok(n) => n == 0,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Sends syslog messages, reconnecting when the server goes away and comes
/// back; a message that cannot be sent is dropped (and counted), never waited for.
struct SyslogSender {
    spec: SyslogSpec,
    host: String,
    pid: u32,
    sock: Option<SyslogSocket>,
    retry_at: std::time::Instant,
    msg: Vec<u8>,
    frames: Vec<u8>,
}

impl SyslogSender {
    /// Not connected yet: the writer thread connects at its first lines,
    /// never the reload that opens it. A server that is not there yet (or
    /// restarts) is not an error: its lines are counted as dropped until it answers.
    fn new(spec: SyslogSpec) -> SyslogSender {
        SyslogSender {
            host: hostname(),
            pid: std::process::id(),
            sock: None,
            retry_at: std::time::Instant::now(),
            msg: Vec::with_capacity(spec.max_length),
            frames: Vec::new(),
            spec,
        }
    }

    fn reconnect(&mut self) {
        self.sock = SyslogSocket::connect(&self.spec.address).ok();
        if self.sock.is_none() {
            self.retry_at = std::time::Instant::now() + SYSLOG_RETRY_AFTER;
        }
    }

    /// Reconnect if the server went away and the last attempt is old enough.
    fn connect_if_due(&mut self) {
        if self.sock.as_ref().is_some_and(SyslogSocket::closed_by_peer) {
            self.sock = None;
        }
        if self.sock.is_none() && std::time::Instant::now() >= self.retry_at {
            self.reconnect();
        }
    }

    /// Send each line of `lines` as one message: (sent, dropped).
    fn send_lines(&mut self, lines: &[u8]) -> (u64, u64) {
        let each = lines.split(|&c| c == b'\n').filter(|l| !l.is_empty());
        if self.spec.address.starts_with("tcp://") {
            let n = each.clone().count() as u64;
            self.frames.clear();
            for line in each {
                syslog_message(&mut self.msg, &self.spec, &self.host, self.pid, SystemTime::now(), line);
                if self.spec.newline_framing {
                    self.frames.extend_from_slice(&self.msg);
                    self.frames.push(b'\n');
                } else {
                    num(&mut self.frames, self.msg.len() as u64);
                    self.frames.push(b' ');
                    self.frames.extend_from_slice(&self.msg);
                }
            }
            self.connect_if_due();
            let Some(SyslogSocket::Tcp(stream)) = &self.sock else { return (0, n) };
            let mut stream: &std::net::TcpStream = stream;
            if stream.write_all(&self.frames).is_ok() {
                return (n, 0);
            }
            // cut off mid-frame, maybe: the stream cannot go on
            self.sock = None;
            return (0, n);
        }
        let (mut sent, mut dropped) = (0, 0);
        for line in each {
            syslog_message(&mut self.msg, &self.spec, &self.host, self.pid, SystemTime::now(), line);
            self.connect_if_due();
            let r = match &self.sock {
                Some(SyslogSocket::Udp(s)) => s.send(&self.msg),
                Some(SyslogSocket::Unix(s)) => s.send(&self.msg),
                Some(SyslogSocket::Tcp(_)) | None => Err(std::io::ErrorKind::NotConnected.into()),
            };
            if r.is_ok() {
                sent += 1;
            } else {
                dropped += 1;
                if self.spec.address.starts_with("unix:") {
                    self.sock = None; // the log daemon restarted: reconnect next time
                }
            }
        }
        (sent, dropped)
    }
}

/// The host name RFC 5424 messages carry.
fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or truncates.
    let r = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    if r == 0 && n > 0 {
        String::from_utf8_lossy(&b[..n]).into_owned()
    } else {
        "-".into()
    }
}

/// Prefix one syslog message header to `line` (without its newline) into `out`.
pub fn syslog_message(out: &mut Vec<u8>, s: &SyslogSpec, host: &str, pid: u32, now: SystemTime, line: &[u8]) {
    const INFO: u8 = 6;
    out.clear();
    out.push(b'<');
    num(out, u64::from(s.facility) * 8 + u64::from(INFO));
    out.push(b'>');
    if s.rfc5424 {
        out.extend_from_slice(b"1 ");
        time(out, now, true);
        out.push(b' ');
        out.extend_from_slice(host.as_bytes());
        out.push(b' ');
        out.extend_from_slice(s.tag.as_bytes());
        out.push(b' ');
        num(out, u64::from(pid));
        out.extend_from_slice(b" - - ");
    } else {
        // RFC 3164's "Mmm dd hh:mm:ss" (UTC), then TAG[PID]: as HAProxy sends it (no host name)
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let (_, m, day) = civil((secs / 86_400) as i64);
        out.extend_from_slice(MONTHS[m as usize - 1].as_bytes());
        out.push(b' ');
        if day < 10 {
            out.push(b' ');
        }
        num(out, u64::from(day));
        out.push(b' ');
        let t = secs % 86_400;
        pad(out, t / 3600, 2);
        out.push(b':');
        pad(out, t / 60 % 60, 2);
        out.push(b':');
        pad(out, t % 60, 2);
        out.push(b' ');
        out.extend_from_slice(s.tag.as_bytes());
        out.push(b'[');
        num(out, u64::from(pid));
        out.extend_from_slice(b"]: ");
    }
    let room = s.max_length.saturating_sub(out.len());
    out.extend_from_slice(&line[..line.len().min(room)]);
}

fn spawn_writer(spec: &AccessLogSpec, written: Arc<AtomicU64>, dropped: Arc<AtomicU64>) -> Result<Sink, String> {
    let (tx, rx): (SyncSender<Msg>, Receiver<Msg>) = sync_channel(QUEUE);
    let reopen = Arc::new(AtomicBool::new(false));
    let flag = reopen.clone();
    let destination = spec.destination();
    let name = "balancer-access-log".to_string();
    let spawned = if let Some(s) = spec.syslog.clone() {
        let mut sender = SyslogSender::new(s);
        std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(m) = rx.recv() {
                if flag.swap(false, Relaxed) {
                    sender.reconnect();
                }
                match m {
                    Msg::Lines(b) => {
                        let (sent, lost) = sender.send_lines(&b);
                        written.fetch_add(sent, Relaxed);
                        dropped.fetch_add(lost, Relaxed);
                    }
                    Msg::Sync(ack) => {
                        let _ = ack.try_send(());
                    }
                    Msg::Wake => {}
                }
            }
        })
    } else {
        let path = spec.path.clone();
        let mut out = open(&path).map_err(|e| format!("cannot open the access log {path}: {e}"))?;
        std::thread::Builder::new().name(name).spawn(move || {
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
                            written.fetch_add(b.iter().filter(|&&c| c == b'\n').count() as u64, Relaxed);
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
    };
    spawned.map_err(|e| format!("cannot start the access log writer: {e}"))?;
    Ok(Sink { destination, tx, reopen, retired: AtomicBool::new(false) })
}

impl AccessLog {
    /// One log for every listener (the `[access_log]` table alone).
    pub fn start(spec: &AccessLogSpec) -> Result<AccessLog, String> {
        Self::start_all(Some(spec), &[])
    }

    /// The top-level log (`top`) and each listener's (by index; listeners
    /// past the end take `top`); with neither, nothing is logged until a
    /// reload names a log.
    pub fn start_all(top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<AccessLog, String> {
        let log = AccessLog {
            routes: Arc::new(RwLock::new(Arc::new(Routes::default()))),
            active: AtomicBool::new(false),
            dropped: Arc::new(AtomicU64::new(0)),
            written: Arc::new(AtomicU64::new(0)),
        };
        let p = log.prepare(top, listeners)?;
        log.commit(p, top, listeners);
        Ok(log)
    }

    /// Whether any listener logs (else the request paths skip logging).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    fn current(&self) -> Arc<Routes> {
        self.routes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Check the formats of `top` and `listeners` and open the destinations
    /// not open yet; nothing changes until [`AccessLog::commit`].
    pub fn prepare(&self, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<Prepared, String> {
        let current = self.current();
        let mut p = Prepared { formats: Default::default(), opened: Vec::new() };
        for spec in top.into_iter().chain(listeners.iter().filter_map(|l| match l {
            ListenerLog::Own(s) => Some(s),
            _ => None,
        })) {
            if !p.formats.contains_key(&spec.format) {
                p.formats.insert(spec.format.clone(), Arc::new(compile(&spec.format)?));
            }
            let d = spec.destination();
            if current.live_sinks().any(|s| s.destination == d && !s.retired.load(Relaxed))
                || p.opened.iter().any(|s| s.destination == d)
            {
                continue;
            }
            if current.sinks.len() + p.opened.len() >= MAX_SINKS {
                return Err("too many access log destinations opened since the start: a restart is needed".into());
            }
            p.opened.push(Arc::new(spawn_writer(spec, self.written.clone(), self.dropped.clone())?));
        }
        Ok(p)
    }

    /// Put a prepared reload in force: `top` and `listeners` (by listener
    /// slot; [`ListenerLog::Keep`] for a removed listener whose connections
    /// drain) as given to [`AccessLog::prepare`]. Writers no longer named
    /// close once the lines the workers hold for them are written; the
    /// others reopen their files (logrotate).
    pub fn commit(&self, mut p: Prepared, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) {
        let mut g = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let current = g.clone();
        let mut sinks = current.sinks.clone();
        let mut sink_of = |spec: &AccessLogSpec, sinks: &mut Vec<Option<Arc<Sink>>>| -> Option<usize> {
            let d = spec.destination();
            if let Some(i) = sinks.iter().position(|s| s.as_ref().is_some_and(|s| s.destination == d && !s.retired.load(Relaxed))) {
                return Some(i);
            }
            let k = p.opened.iter().position(|s| s.destination == d)?;
            sinks.push(Some(p.opened.swap_remove(k)));
            Some(sinks.len() - 1)
        };
        let mut route = |spec: &AccessLogSpec, sinks: &mut Vec<Option<Arc<Sink>>>| -> Option<LogRoute> {
            let format = match p.formats.get(&spec.format) {
                Some(f) => f.clone(),
                None => Arc::new(compile(&spec.format).ok()?),
            };
            Some(LogRoute { sink: sink_of(spec, sinks)?, format, log_empty: spec.log_empty })
        };
        let default = top.and_then(|t| route(t, &mut sinks));
        let mut by_listener = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.iter().enumerate() {
            by_listener.push(match l {
                ListenerLog::Inherit => default.clone(),
                ListenerLog::Off => None,
                ListenerLog::Keep => current.by_listener.get(i).cloned().flatten().or_else(|| default.clone()),
                ListenerLog::Own(s) => route(s, &mut sinks),
            });
        }
        // writers no route names any more retire: still there for the lines
        // the workers buffered, closed a little later
        let used: std::collections::HashSet<usize> =
            default.iter().chain(by_listener.iter().flatten()).map(|r| r.sink).collect();
        let mut retiring = Vec::new();
        for (i, s) in sinks.iter().enumerate() {
            if let Some(s) = s {
                if !used.contains(&i) && !s.retired.swap(true, Relaxed) {
                    retiring.push(s.clone());
                }
            }
        }
        let active = default.is_some() || by_listener.iter().any(Option::is_some);
        let routes = Routes { default, by_listener, sinks };
        for s in routes.live_sinks() {
            s.ask_reopen();
        }
        *g = Arc::new(routes);
        drop(g);
        self.active.store(active, Relaxed);
        if !retiring.is_empty() {
            let routes = self.routes.clone();
            let _ = std::thread::Builder::new().name("balancer-access-log-retire".into()).spawn(move || {
                std::thread::sleep(RETIRE_AFTER);
                let mut g = routes.write().unwrap_or_else(|e| e.into_inner());
                let mut r = (**g).clone();
                for slot in r.sinks.iter_mut() {
                    if slot.as_ref().is_some_and(|s| retiring.iter().any(|x| Arc::ptr_eq(x, s))) {
                        *slot = None;
                    }
                }
                *g = Arc::new(r);
            });
        }
    }

    /// New formats and destinations from a reload, at once (see [`AccessLog::prepare`]).
    pub fn reconfigure(&self, top: Option<&AccessLogSpec>, listeners: &[ListenerLog]) -> Result<(), String> {
        let p = self.prepare(top, listeners)?;
        self.commit(p, top, listeners);
        Ok(())
    }

    /// Reopen the files (logrotate), with a new top-level format if given.
    pub fn reopen(&self, format: Option<&str>) -> Result<(), String> {
        if let Some(f) = format {
            let f = Arc::new(compile(f)?);
            let mut g = self.routes.write().unwrap_or_else(|e| e.into_inner());
            let mut r = (**g).clone();
            let old = r.default.as_ref().map(|d| Arc::as_ptr(&d.format));
            for x in r.by_listener.iter_mut().flatten().chain(r.default.iter_mut()) {
                if Some(Arc::as_ptr(&x.format)) == old {
                    x.format = f.clone();
                }
            }
            *g = Arc::new(r);
        }
        for s in self.current().live_sinks() {
            s.ask_reopen();
        }
        Ok(())
    }

    /// The format of `listener`'s lines (None: not logged).
    pub fn format_of(&self, listener: usize) -> Option<Arc<Format>> {
        if !self.active() {
            return None;
        }
        self.routes.read().unwrap_or_else(|e| e.into_inner()).get(listener).map(|r| r.format.clone())
    }

    /// Whether connections closed before sending a byte are logged on `listener`.
    pub fn logs_empty(&self, listener: usize) -> bool {
        self.active() && self.routes.read().unwrap_or_else(|e| e.into_inner()).get(listener).is_some_and(|r| r.log_empty)
    }

    /// Wait (bounded) until every writer wrote what it was given.
    pub fn sync(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        for s in self.current().live_sinks() {
            let (ack, done) = sync_channel(1);
            if s.tx.try_send(Msg::Sync(ack)).is_ok() {
                let _ = done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
            }
        }
    }

    pub fn log(&self, buf: &LogBuf, r: &Record<'_>) {
        if !self.active() {
            return;
        }
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let Some(route) = routes.get(r.listener) else { return };
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() <= route.sink {
            g.resize_with(routes.sinks.len(), || (Vec::new(), 0));
        }
        let b = &mut g[route.sink];
        route.format.write(&mut b.0, r);
        b.1 += 1;
        if b.0.len() >= FLUSH_AT {
            self.send(&routes, route.sink, b);
        }
    }

    pub fn flush(&self, buf: &LogBuf) {
        let mut g = buf.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_empty() {
            return;
        }
        let routes = self.current();
        for (i, b) in g.iter_mut().enumerate() {
            if b.1 > 0 {
                self.send(&routes, i, b);
            }
        }
    }

    fn send(&self, routes: &Routes, sink: usize, g: &mut (Vec<u8>, u64)) {
        let Some(Some(s)) = routes.sinks.get(sink) else {
            // its writer closed (a reload removed the destination long ago)
            self.dropped.fetch_add(g.1, Relaxed);
            g.0.clear();
            g.1 = 0;
            return;
        };
        let lines = std::mem::replace(&mut g.0, Vec::with_capacity(FLUSH_AT + 4096));
        match s.tx.try_send(Msg::Lines(lines)) {
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

/// A worker's pending lines, one buffer per destination.
#[derive(Default)]
pub struct LogBuf(Mutex<Vec<(Vec<u8>, u64)>>);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record<'a>(target: &'a [u8], head: &'a [u8]) -> Record<'a> {
        Record {
            listener: 0,
            client: "10.1.2.3:4567".parse().unwrap(),
            unix: false,
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
    fn syslog_headers() {
        let mut s = SyslogSpec { address: "udp://127.0.0.1:514".into(), facility: 16, rfc5424: false, newline_framing: false, tag: "lb".into(), max_length: 1024 };
        let when = UNIX_EPOCH + Duration::from_millis(1_764_205_509_123); // 2025-11-27T01:05:09.123Z
        let mut out = Vec::new();
        syslog_message(&mut out, &s, "host1", 42, when, b"GET / 200");
        assert_eq!(out, b"<134>Nov 27 01:05:09 lb[42]: GET / 200");
        let early = UNIX_EPOCH + Duration::from_secs(1_764_547_200); // 2025-12-01: the day is space-padded
        syslog_message(&mut out, &s, "host1", 42, early, b"x");
        assert_eq!(out, b"<134>Dec  1 00:00:00 lb[42]: x");
        s.rfc5424 = true;
        s.facility = 3;
        syslog_message(&mut out, &s, "host1", 42, when, b"GET / 200");
        assert_eq!(out, b"<30>1 2025-11-27T01:05:09.123Z host1 lb 42 - - GET / 200");
        s.max_length = 60;
        syslog_message(&mut out, &s, "host1", 42, when, &[b'y'; 100]);
        assert_eq!(out.len(), 60);
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
    fn names_a_unix_client_as_haproxy_does() {
        let mut r = record(b"/", b"GET / HTTP/1.1\r\n\r\n");
        r.unix = true;
        r.listener = 1;
        assert!(line(DEFAULT_FORMAT, &r).starts_with("unix:2 ["));
        let v: serde_json::Value = serde_json::from_str(&line("json", &r)).unwrap();
        assert_eq!((v["client_ip"].as_str(), v["client_port"].as_u64()), (Some("unix"), Some(2)));
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
