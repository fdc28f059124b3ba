//! Sending lines to a syslog server: RFC 5424 / RFC 3164 messages over UDP,
//! a Unix datagram socket or TCP (RFC 6587 framing), reconnecting after a
//! failure without ever blocking the writer thread for long.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::format::{civil, num, pad, time, MONTHS};
use super::SyslogSpec;

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
pub(super) struct SyslogSender {
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
    pub(super) fn new(spec: SyslogSpec) -> SyslogSender {
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

    pub(super) fn reconnect(&mut self) {
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
    pub(super) fn send_lines(&mut self, lines: &[u8]) -> (u64, u64) {
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
