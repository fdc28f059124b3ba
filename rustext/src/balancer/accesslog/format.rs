//! Formats: a `log-format` string compiled once into segments, and a
//! request's [`Record`] formatted into a line (text or JSON) without
//! allocating, with every value from the request or response escaped.

use std::io::Write;
use std::net::SocketAddr;
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

pub(super) fn num(out: &mut Vec<u8>, n: u64) {
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

pub(super) fn pad(out: &mut Vec<u8>, n: u64, width: usize) {
    let start = out.len();
    num(out, n);
    while out.len() - start < width {
        out.insert(start, b'0');
    }
}

/// (year, month, day) of a count of days since 1970-01-01 (H. Hinnant's algorithm).
pub(super) fn civil(days: i64) -> (i64, u32, u32) {
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

pub(super) const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

pub(super) fn time(out: &mut Vec<u8>, when: SystemTime, iso: bool) {
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
