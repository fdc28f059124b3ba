//! Native websocket subscribers for the fan-out load (`juggler load --mode fanout`).
//!
//! The measuring side shares the machine with the server it measures: at
//! 100,000 deliveries/s a Python subscriber (one callback per frame) would
//! take most of a core from the server. Here each subscriber is a tokio task
//! on a small runtime: it opens a plain `ws://` connection (RFC 6455
//! handshake, `juggler.0`), sends one SUB, and for every EVNT reads `"t"`
//! (publish time, ns since the epoch) and `"seq"` from its `args` without
//! decoding the JSON, recording latency and counting lost, duplicated and
//! reordered events. It answers the server's keepalive pings (a server
//! closes a connection that answers nothing, however long the run). With
//! `deflate` a subscriber offers permessage-deflate (RFC 7692) as browsers
//! do and inflates the compressed events (without context takeover, as the
//! server agrees), so the fan-out can be measured with compression on and
//! off. Nothing here is a general websocket client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// What one subscriber saw.
#[derive(Debug, Default, Clone)]
pub struct SubStats {
    pub lat_us: Vec<i64>,
    pub seen: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub error: Option<String>,
}

/// Shared between the subscriber tasks and their owner.
pub struct Shared {
    pub stop: AtomicBool,
    pub stopped: Notify,
    pub subscribed: std::sync::atomic::AtomicUsize,
    pub failed: std::sync::atomic::AtomicUsize,
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The integer right after `key` at or after `from` in `b`.
fn int_after(b: &[u8], from: usize, key: &[u8]) -> Option<(i64, usize)> {
    let at = b[from..].windows(key.len()).position(|w| w == key)? + from + key.len();
    let mut end = at;
    let neg = b.get(end) == Some(&b'-');
    if neg {
        end += 1;
    }
    let start = end;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    let v: i64 = std::str::from_utf8(&b[start..end]).ok()?.parse().ok()?;
    Some((if neg { -v } else { v }, end))
}

/// (t, seq) of one of our EVNT frames.
pub fn event_fields(text: &[u8]) -> Option<(i64, i64)> {
    let args = text.windows(7).position(|w| w == b"\"args\":")?;
    let (t, after) = int_after(text, args, b"\"t\":")?;
    let (seq, _) = int_after(text, after, b"\"seq\":")?;
    Some((t, seq))
}

/// One subscriber, until `shared.stop`.
pub async fn run_one(
    addr: SocketAddr,
    host: String,
    path: String,
    sub_frame: Vec<u8>,
    shared: Arc<Shared>,
    deflate: bool,
) -> SubStats {
    let mut st = SubStats::default();
    let mut counted = false;
    let target = Target { addr, host: &host, path: &path, deflate };
    if let Err(e) = subscriber(&target, &sub_frame, &shared, &mut st, &mut counted).await {
        st.error = Some(e);
        if !counted {
            shared.failed.fetch_add(1, Ordering::SeqCst);
        }
    }
    st
}

/// Where a subscriber connects, and whether it offers permessage-deflate.
struct Target<'a> {
    addr: SocketAddr,
    host: &'a str,
    path: &'a str,
    deflate: bool,
}

async fn subscriber(
    target: &Target<'_>,
    sub_frame: &[u8],
    shared: &Shared,
    st: &mut SubStats,
    counted: &mut bool,
) -> Result<(), String> {
    let Target { addr, host, path, deflate } = *target;
    let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    s.set_nodelay(true).ok();
    let offer = if deflate { "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n" } else { "" };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: juggler.0\r\n{offer}\r\n"
    );
    s.write_all(req.as_bytes()).await.map_err(|e| format!("handshake: {e}"))?;
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut tmp = vec![0u8; 65536];
    loop {
        let n = s.read(&mut tmp).await.map_err(|e| format!("handshake: {e}"))?;
        if n == 0 {
            return Err("handshake: connection closed".into());
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            if !buf.starts_with(b"HTTP/1.1 101") {
                let line = String::from_utf8_lossy(&buf[..buf.iter().position(|&c| c == b'\r').unwrap_or(end)]).into_owned();
                return Err(format!("handshake refused: {line}"));
            }
            buf.drain(..end + 4);
            break;
        }
    }
    s.write_all(sub_frame).await.map_err(|e| format!("SUB: {e}"))?;
    let mut last: i64 = -1;
    // the server compresses each message on its own (no context takeover on its side), so
    // one inflater kept for the connection reads them all: no window allocated per event
    let mut inflater = crate::wsdeflate::Inflater::new(true);
    let mut inflated: Vec<u8> = Vec::new();
    loop {
        // whole frames in buf
        loop {
            if buf.len() < 2 {
                break;
            }
            let op = buf[0] & 0x0f;
            let mut len = (buf[1] & 0x7f) as usize;
            let mut h = 2;
            if len == 126 {
                if buf.len() < 4 {
                    break;
                }
                len = u16::from_be_bytes([buf[2], buf[3]]) as usize;
                h = 4;
            } else if len == 127 {
                if buf.len() < 10 {
                    break;
                }
                len = u64::from_be_bytes(buf[2..10].try_into().unwrap_or([0; 8])) as usize;
                h = 10;
            }
            if buf.len() < h + len {
                break;
            }
            let mut payload = &buf[h..h + len];
            if buf[0] & 0x40 != 0 && op == 1 {
                inflated.clear();
                inflater.inflate(payload, true, &mut inflated, 0).map_err(|e| format!("inflate: {e:?}"))?;
                payload = &inflated;
            }
            match op {
                1 => {
                    if payload.starts_with(b"{\"meta\":{\"type\":10,") {
                        if let Some((t, seq)) = event_fields(payload) {
                            st.lat_us.push((now_ns() - t) / 1000);
                            if seq == last {
                                st.duplicates += 1;
                            } else {
                                if seq < last {
                                    st.out_of_order += 1;
                                }
                                last = last.max(seq);
                                st.seen += 1;
                            }
                        }
                    } else if payload.starts_with(b"{\"meta\":{\"type\":8,") && !*counted {
                        *counted = true;
                        shared.subscribed.fetch_add(1, Ordering::SeqCst);
                    } else if payload.starts_with(b"{\"meta\":{\"type\":7,") && !*counted {
                        return Err("SUB refused (NACK)".into());
                    }
                }
                8 => return Ok(()), // closed by the server
                9 => {
                    // a keepalive ping: answered, or the server closes a subscriber that only listens
                    let pong = pong_frame(payload);
                    buf.drain(..h + len);
                    s.write_all(&pong).await.map_err(|e| format!("pong: {e}"))?;
                    continue;
                }
                _ => {}
            }
            buf.drain(..h + len);
        }
        if shared.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let n = tokio::select! {
            r = s.read(&mut tmp) => r.map_err(|e| format!("read: {e}"))?,
            _ = shared.stopped.notified() => { continue; }
        };
        if n == 0 {
            return if shared.stop.load(Ordering::Relaxed) { Ok(()) } else { Err("connection closed".into()) };
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// The SUB frame for `channel` (masked client frame).
pub fn sub_frame(channel: &str, uuid: &str) -> Vec<u8> {
    let mut json = Vec::new();
    json.extend_from_slice(b"{\"meta\":{\"type\":3,\"uuid\":\"");
    json.extend_from_slice(uuid.as_bytes());
    json.extend_from_slice(b"\"},\"payload\":{\"channel\":");
    super::write_str(&mut json, channel);
    json.extend_from_slice(b",\"pattern\":false}}");
    // masked with a zero key: the payload goes out as is
    crate::wsframe::encode_client_frame(true, 1, &json, [0; 4])
}

/// The pong answering a ping with `payload` (masked client frame; a control frame carries at most 125 bytes).
pub fn pong_frame(payload: &[u8]) -> Vec<u8> {
    crate::wsframe::encode_client_frame(true, 10, &payload[..payload.len().min(125)], [0; 4])
}

/// Start `n` subscribers on `rt`; they run until `shared.stop` is set and the owner notifies.
#[allow(clippy::too_many_arguments)]
pub fn spawn_all(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    host: &str,
    path: &str,
    channel: &str,
    n: usize,
    shared: &Arc<Shared>,
    deflate: bool,
) -> Vec<tokio::task::JoinHandle<SubStats>> {
    (0..n)
        .map(|_| {
            let frame = sub_frame(channel, &super::new_uuid());
            let (host, path, shared) = (host.to_string(), path.to_string(), shared.clone());
            rt.spawn(run_one(addr, host, path, frame, shared, deflate))
        })
        .collect()
}

/// Wait (blocking) until every subscriber is subscribed or failed, or `timeout`.
pub fn wait_subscribed(shared: &Shared, n: usize, timeout: Duration) -> (usize, usize) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let ok = shared.subscribed.load(Ordering::SeqCst);
        let bad = shared.failed.load(Ordering::SeqCst);
        if ok + bad >= n || std::time::Instant::now() >= deadline {
            return (ok, bad);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_t_and_seq_from_args() {
        let f = br#"{"meta":{"type":10,"uuid":"u"},"payload":{"for":"x","channel":"c","args":{"t":1234,"seq":7,"pad":"xx"}}}"#;
        assert_eq!(event_fields(f), Some((1234, 7)));
        assert_eq!(event_fields(br#"{"args":{"seq":1}}"#), None);
    }

    #[test]
    fn pong_frame_echoes_the_ping_masked() {
        assert_eq!(pong_frame(b""), vec![0x8A, 0x80, 0, 0, 0, 0]);
        assert_eq!(pong_frame(b"hi"), vec![0x8A, 0x82, 0, 0, 0, 0, b'h', b'i']);
    }

    #[test]
    fn sub_frame_is_masked_text() {
        let f = sub_frame("a\"b", "u");
        assert_eq!(f[0], 0x81);
        assert_eq!(f[1] & 0x80, 0x80);
        assert!(String::from_utf8_lossy(&f).contains(r#""channel":"a\"b""#));
    }
}

#[cfg(feature = "python")]
pub mod python {
    //! `rustext.FanoutSubscribers`.

    use super::*;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    /// N native websocket subscribers of one channel (see the Rust module doc).
    #[pyclass(module = "rustext", name = "FanoutSubscribers")]
    pub struct FanoutSubscribers {
        rt: Option<tokio::runtime::Runtime>,
        shared: Arc<Shared>,
        handles: Vec<tokio::task::JoinHandle<SubStats>>,
        n: usize,
    }

    #[pymethods]
    impl FanoutSubscribers {
        /// Connect `n` subscribers to ws://`host`:`port``path` and subscribe them to `channel`
        /// on `threads` runtime threads; `deflate`: offer permessage-deflate.
        #[new]
        #[pyo3(signature = (host, port, path, channel, n, threads = 1, deflate = false))]
        fn new(host: &str, port: u16, path: &str, channel: &str, n: usize, threads: usize, deflate: bool) -> PyResult<Self> {
            let addr: SocketAddr = format!("{host}:{port}")
                .parse()
                .or_else(|_| {
                    use std::net::ToSocketAddrs;
                    (host, port).to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or_else(|| "no address".to_string())
                })
                .map_err(pyo3::exceptions::PyValueError::new_err)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads.max(1))
                .enable_all()
                .build()
                .map_err(PyErr::from)?;
            let shared = Arc::new(Shared {
                stop: AtomicBool::new(false),
                stopped: Notify::new(),
                subscribed: Default::default(),
                failed: Default::default(),
            });
            let handles = spawn_all(&rt, addr, &format!("{host}:{port}"), path, channel, n, &shared, deflate);
            Ok(Self { rt: Some(rt), shared, handles, n })
        }

        /// Block until every subscriber is subscribed or failed (or `timeout` s): (subscribed, failed).
        fn wait_subscribed(&self, py: Python<'_>, timeout: f64) -> (usize, usize) {
            let (shared, n) = (self.shared.clone(), self.n);
            py.detach(move || wait_subscribed(&shared, n, Duration::from_secs_f64(timeout.max(0.0))))
        }

        /// Stop every subscriber; returns (latencies µs as int64 bytes, seen, duplicates,
        /// out of order, subscribed, errors (at most 20)).
        #[allow(clippy::type_complexity)]
        fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyBytes>, u64, u64, u64, usize, Vec<String>)> {
            self.shared.stop.store(true, Ordering::SeqCst);
            let shared = self.shared.clone();
            let handles = std::mem::take(&mut self.handles);
            let rt = self.rt.take();
            let stats: Vec<SubStats> = py.detach(move || {
                let Some(rt) = rt else { return Vec::new() };
                let out = rt.block_on(async move {
                    // wake the readers until every one has seen `stop` (a reader not yet
                    // waiting when woken is woken again on the next round)
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while handles.iter().any(|h| !h.is_finished()) && tokio::time::Instant::now() < deadline {
                        shared.stopped.notify_waiters();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let mut out = Vec::new();
                    for h in handles {
                        if h.is_finished() {
                            if let Ok(st) = h.await {
                                out.push(st);
                            }
                        } else {
                            h.abort();
                        }
                    }
                    out
                });
                rt.shutdown_timeout(Duration::from_secs(2));
                out
            });
            let mut lat: Vec<u8> = Vec::new();
            let (mut seen, mut dups, mut ooo) = (0, 0, 0);
            let mut errors = Vec::new();
            for st in &stats {
                for v in &st.lat_us {
                    lat.extend_from_slice(&v.to_ne_bytes());
                }
                seen += st.seen;
                dups += st.duplicates;
                ooo += st.out_of_order;
                if let Some(e) = &st.error {
                    if errors.len() < 20 {
                        errors.push(e.clone());
                    }
                }
            }
            let subscribed = self.shared.subscribed.load(Ordering::SeqCst);
            Ok((PyBytes::new(py, &lat), seen, dups, ooo, subscribed, errors))
        }
    }
}
