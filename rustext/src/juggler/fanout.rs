//! Native pub-sub fan-out: one event frame written to every local subscriber
//! of a channel without a Python call per subscriber.
//!
//! The hub knows, per subscription key (a channel or pattern, numbered by
//! the Python side), which connections subscribe to it, and per connection
//! its socket's file descriptor. [`Hub::publish`] takes the
//! frames of one event-loop turn and, per connection, writes all of its
//! frames with ONE `sendmsg` (coalescing), straight from the frames' memory.
//! A fan-out to many connections is shared by a few threads (one per core,
//! at most 4), which take batches of connections from a shared cursor: the
//! writes are the cost, and the last subscriber of a large channel would
//! otherwise wait for all the others, or for a thread the scheduler paused.
//!
//! A connection is written here only while Python has nothing queued for it:
//! the Python driver marks it *held* while its own output (ACK, RES, close
//! frames, bytes the kernel did not take) is pending, and the hub then hands
//! that connection's frames back to Python, which queues them behind its own
//! output. So frames reach each connection in the order they were produced.
//! A short write (the socket buffer is full) hands the rest back too; the
//! Python side then holds the connection until its transport has drained.
//!
//! A connection that negotiated permessage-deflate gets the compressed frame
//! of an event, the others its plain frame: the caller builds each at most
//! once per event (the server compresses without context takeover, so one
//! compressed frame is valid on every such connection),
//! [`Hub::publish_deflated`].
//!
//! The descriptor stays the event loop's: the hub never closes it, and the
//! Python side removes a connection from the hub BEFORE its transport can
//! close the descriptor (every close path of the connection goes through
//! that removal, and asyncio and uvloop both call `connection_lost` before
//! they close the socket). So a descriptor number reused by the kernel for
//! another connection is never written by mistake. No `dup`: a subscriber
//! costs one descriptor, not two (10,000 subscribers fit a 20,000 limit).

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What [`Hub::publish`] could not write itself.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// (connection, frame index): held connections, Python writes these frames
    pub held: Vec<(u64, usize)>,
    /// (connection, bytes not taken by the kernel): Python queues them and holds the connection
    pub partial: Vec<(u64, Vec<u8>)>,
    /// connections whose socket failed (reset, closed): Python drops them
    pub failed: Vec<u64>,
    /// frames written whole by the hub
    pub written: u64,
}

struct Conn {
    fd: RawFd, // the event loop's socket (never closed here); -1: always written by Python
    held: bool,
    keys: Vec<u64>,
    /// negotiated permessage-deflate: written the compressed frames
    deflate: bool,
}

/// Subscribers per key and the connections' sockets (see module doc).
#[derive(Default)]
pub struct Hub {
    conns: HashMap<u64, Conn>,
    keys: HashMap<u64, Vec<u64>>,
}

/// Fan-outs of at least this many connections are written by several threads.
const PARALLEL_MIN: usize = 512;

/// Connections a fan-out thread takes from the shared cursor at a time: a
/// few hundred µs of writes, small enough to balance, large enough that the
/// cursor is not contended.
const BATCH: usize = 64;

/// Threads for a large fan-out: the machine's cores, at most 4.
fn parallelism() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(4))
}

/// Outcome of one gathered write to one connection.
enum Sent {
    All,
    Part(usize),
    Failed,
}

fn send_all(fd: RawFd, parts: &[&[u8]]) -> Sent {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0usize;
    // at most IOV_MAX (1024) slices per call; frames of one turn rarely need more than one call
    while done < total {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(parts.len().min(1024));
        let mut skip = done;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let s = &p[skip..];
            skip = 0;
            iov.push(libc::iovec { iov_base: s.as_ptr() as *mut libc::c_void, iov_len: s.len() });
            if iov.len() == 1024 {
                break;
            }
        }
        // SAFETY: msghdr is plain data; every iovec points into a live slice borrowed for this call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            match err.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return Sent::Part(done),
                _ => return Sent::Failed,
            }
        }
        done += n as usize;
        if done < total && (n as usize) < iov.iter().map(|v| v.iov_len).sum::<usize>() {
            return Sent::Part(done); // the kernel took less than offered: its buffer is full
        }
    }
    Sent::All
}

fn rest_of(parts: &[&[u8]], mut done: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        if done >= p.len() {
            done -= p.len();
            continue;
        }
        out.extend_from_slice(&p[done..]);
        done = 0;
    }
    out
}

impl Hub {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a connection writing to `fd` (-1: Python writes everything for it).
    /// The caller removes it before `fd` can be closed. Re-adding an id replaces the entry.
    pub fn add_conn(&mut self, conn: u64, fd: RawFd) -> std::io::Result<()> {
        self.add_conn_deflate(conn, fd, false)
    }

    /// [`Hub::add_conn`] for a connection that negotiated permessage-deflate (`deflate`) or not.
    pub fn add_conn_deflate(&mut self, conn: u64, fd: RawFd, deflate: bool) -> std::io::Result<()> {
        if fd >= 0 {
            // SAFETY: F_GETFD only reads the descriptor's flags: is it open at all?
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        self.remove_conn(conn);
        self.conns.insert(conn, Conn { fd, held: false, keys: Vec::new(), deflate });
        Ok(())
    }

    /// Forget a connection and its subscriptions (its descriptor is left alone).
    pub fn remove_conn(&mut self, conn: u64) -> bool {
        let Some(c) = self.conns.remove(&conn) else { return false };
        for k in &c.keys {
            if let Some(subs) = self.keys.get_mut(k) {
                if let Some(i) = subs.iter().position(|&x| x == conn) {
                    subs.swap_remove(i);
                }
                if subs.is_empty() {
                    self.keys.remove(k);
                }
            }
        }
        true
    }

    /// Mark a connection held (Python has output queued for it) or not.
    pub fn hold(&mut self, conn: u64, held: bool) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.held = held;
        }
    }

    /// Subscribe a registered connection to `key`; false when already subscribed or unknown.
    pub fn subscribe(&mut self, conn: u64, key: u64) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else { return false };
        if c.keys.contains(&key) {
            return false;
        }
        c.keys.push(key);
        self.keys.entry(key).or_default().push(conn);
        true
    }

    /// Unsubscribe; false when it was not subscribed.
    pub fn unsubscribe(&mut self, conn: u64, key: u64) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else { return false };
        let Some(i) = c.keys.iter().position(|&k| k == key) else { return false };
        c.keys.swap_remove(i);
        if let Some(subs) = self.keys.get_mut(&key) {
            if let Some(j) = subs.iter().position(|&x| x == conn) {
                subs.swap_remove(j);
            }
            if subs.is_empty() {
                self.keys.remove(&key);
            }
        }
        true
    }

    /// Subscribers of `key`.
    pub fn subscribers(&self, key: u64) -> usize {
        self.keys.get(&key).map_or(0, Vec::len)
    }

    /// Write `frames` (key, bytes), in order, to the subscribers of each key;
    /// one gathered write per connection (see module doc).
    pub fn publish(&mut self, frames: &[(u64, &[u8])]) -> Leftovers {
        let both: Vec<(u64, &[u8], &[u8])> = frames.iter().map(|&(k, f)| (k, f, f)).collect();
        self.publish_deflated(&both)
    }

    /// [`Hub::publish`] with two frames per event (key, plain frame, compressed
    /// frame): connections that negotiated deflate are written the compressed one.
    pub fn publish_deflated(&mut self, frames: &[(u64, &[u8], &[u8])]) -> Leftovers {
        let out = if frames.len() == 1 {
            let (key, plain, deflated) = frames[0];
            let Some(subs) = self.keys.get(&key) else { return Leftovers::default() };
            let one: &[&[u8]] = &[plain];
            let onez: &[&[u8]] = &[deflated];
            self.write_all(subs, |_, deflate| (if deflate { onez } else { one }, &[0usize][..]))
        } else {
            // several frames in this turn: gather each connection's frames, in order
            let mut per_conn: HashMap<u64, (Vec<&[u8]>, Vec<usize>)> = HashMap::new();
            let mut order: Vec<u64> = Vec::new();
            for (i, (key, plain, deflated)) in frames.iter().enumerate() {
                if let Some(subs) = self.keys.get(key) {
                    for &id in subs {
                        let deflate = self.conns.get(&id).is_some_and(|c| c.deflate);
                        let e = per_conn.entry(id).or_insert_with(|| {
                            order.push(id);
                            (Vec::new(), Vec::new())
                        });
                        e.0.push(if deflate { deflated } else { plain });
                        e.1.push(i);
                    }
                }
            }
            self.write_all(&order, |id, _| {
                let (parts, idx) = &per_conn[&id];
                (&parts[..], &idx[..])
            })
        };
        self.apply(&out);
        out
    }

    /// Write each connection of `ids` its frames (`frames_of(id)`: the frames and
    /// their indexes). A large fan-out is shared by a few threads, the calling
    /// one among them, which take the next [`BATCH`] connections from a common
    /// cursor: the socket writes are the cost, and a thread the scheduler
    /// pauses (a busy machine) delays only the batch it holds, not a fixed
    /// share of the list, so the last subscriber waits about the fan-out's CPU
    /// time divided by the cores it gets.
    fn write_all<'f, F>(&self, ids: &[u64], frames_of: F) -> Leftovers
    where
        F: Fn(u64, bool) -> (&'f [&'f [u8]], &'f [usize]) + Sync,
    {
        let threads = if ids.len() >= PARALLEL_MIN { parallelism() } else { 1 };
        let cursor = AtomicUsize::new(0);
        let work = || {
            let mut out = Leftovers::default();
            loop {
                let start = cursor.fetch_add(BATCH, Ordering::Relaxed);
                if start >= ids.len() {
                    return out;
                }
                for &id in &ids[start..(start + BATCH).min(ids.len())] {
                    if let Some(c) = self.conns.get(&id) {
                        let (parts, idx) = frames_of(id, c.deflate);
                        self.write_one(id, c, parts, idx, &mut out);
                    }
                }
            }
        };
        if threads <= 1 {
            return work();
        }
        std::thread::scope(|scope| {
            let work = &work;
            let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
            let mut out = work();
            for r in helpers.into_iter().map(|h| h.join().unwrap_or_default()) {
                out.held.extend(r.held);
                out.partial.extend(r.partial);
                out.failed.extend(r.failed);
                out.written += r.written;
            }
            out
        })
    }

    fn write_one(&self, id: u64, c: &Conn, parts: &[&[u8]], idx: &[usize], out: &mut Leftovers) {
        if c.held || c.fd < 0 {
            out.held.extend(idx.iter().map(|&i| (id, i)));
            return;
        }
        match send_all(c.fd, parts) {
            Sent::All => out.written += parts.len() as u64,
            Sent::Part(done) => {
                // frames fully written count as written; the rest goes to Python
                let mut left = done;
                for p in parts {
                    if left >= p.len() {
                        left -= p.len();
                        out.written += 1;
                    } else {
                        break;
                    }
                }
                out.partial.push((id, rest_of(parts, done)));
            }
            Sent::Failed => out.failed.push(id),
        }
    }

    /// A connection with a short write is held until Python says its transport drained;
    /// a failed one is written no more.
    fn apply(&mut self, out: &Leftovers) {
        for (id, _) in &out.partial {
            self.hold(*id, true);
        }
        for id in &out.failed {
            self.hold(*id, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        (a, b)
    }

    fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).unwrap();
        buf
    }

    #[test]
    fn fans_out_in_order_and_coalesces() {
        let mut hub = Hub::new();
        let (a, mut ra) = pair();
        let (b, mut rb) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.add_conn(2, b.as_raw_fd()).unwrap();
        assert!(hub.subscribe(1, 7));
        assert!(hub.subscribe(2, 7));
        assert!(!hub.subscribe(2, 7));
        assert!(hub.subscribe(2, 8));
        let out = hub.publish(&[(7, b"one"), (8, b"two"), (7, b"three")]);
        assert_eq!(out.written, 5);
        assert_eq!(read_n(&mut ra, 8), b"onethree");
        assert_eq!(read_n(&mut rb, 11), b"onetwothree");
    }

    #[test]
    fn deflate_connections_get_the_compressed_frames() {
        let mut hub = Hub::new();
        let (a, mut ra) = pair();
        let (b, mut rb) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.add_conn_deflate(2, b.as_raw_fd(), true).unwrap();
        hub.subscribe(1, 7);
        hub.subscribe(2, 7);
        let out = hub.publish_deflated(&[(7, b"plain", b"zz")]);
        assert_eq!(out.written, 2);
        assert_eq!(read_n(&mut ra, 5), b"plain");
        assert_eq!(read_n(&mut rb, 2), b"zz");
        // several frames in one turn: each connection its kind, in order
        hub.subscribe(2, 8);
        let out = hub.publish_deflated(&[(7, b"p1", b"z1"), (8, b"p2", b"z2"), (7, b"p3", b"z3")]);
        assert_eq!(out.written, 5);
        assert_eq!(read_n(&mut ra, 4), b"p1p3");
        assert_eq!(read_n(&mut rb, 6), b"z1z2z3");
    }

    #[test]
    fn held_and_python_only_connections_are_handed_back() {
        let mut hub = Hub::new();
        let (a, _ra) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.add_conn(2, -1).unwrap();
        hub.subscribe(1, 1);
        hub.subscribe(2, 1);
        hub.hold(1, true);
        let out = hub.publish(&[(1, b"x")]);
        assert_eq!(out.written, 0);
        let mut held = out.held.clone();
        held.sort();
        assert_eq!(held, vec![(1, 0), (2, 0)]);
    }

    #[test]
    fn a_full_socket_hands_the_rest_back_and_holds() {
        let mut hub = Hub::new();
        let (a, _ra) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.subscribe(1, 1);
        let big = vec![b'z'; 1 << 20];
        let out = hub.publish(&[(1, &big)]);
        assert_eq!(out.partial.len(), 1);
        let (id, rest) = &out.partial[0];
        assert_eq!(*id, 1);
        assert!(!rest.is_empty() && rest.len() < big.len());
        // held now: the next frame goes to Python
        let out = hub.publish(&[(1, b"after")]);
        assert_eq!(out.held, vec![(1, 0)]);
    }

    #[test]
    fn a_large_fan_out_is_written_by_several_threads_in_order() {
        let mut hub = Hub::new();
        let mut readers = Vec::new();
        let mut writers = Vec::new();
        for id in 0..(PARALLEL_MIN as u64 + 10) {
            let (a, r) = pair();
            hub.add_conn(id, a.as_raw_fd()).unwrap();
            hub.subscribe(id, 9);
            writers.push(a);
            readers.push(r);
        }
        // held and failed connections in batches far apart: every thread's leftovers are merged
        let late = PARALLEL_MIN as u64 + 5;
        hub.hold(3, true);
        hub.hold(late, true);
        let (dead, _) = pair();
        drop(std::mem::replace(&mut readers[200], dead));
        let out = hub.publish(&[(9, b"ab"), (9, b"cd")]);
        assert_eq!(out.written, 2 * (readers.len() as u64 - 3));
        let mut held = out.held.clone();
        held.sort_unstable();
        assert_eq!(held, vec![(3, 0), (3, 1), (late, 0), (late, 1)]);
        assert_eq!(out.failed, vec![200]);
        for (id, r) in readers.iter_mut().enumerate() {
            if ![3, 200, late as usize].contains(&id) {
                assert_eq!(read_n(r, 4), b"abcd");
            }
        }
        drop(writers);
    }

    #[test]
    fn a_closed_peer_fails_and_removal_cleans_up() {
        let mut hub = Hub::new();
        let (a, ra) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.subscribe(1, 3);
        drop(ra);
        let out = hub.publish(&[(3, b"x")]);
        assert_eq!(out.failed, vec![1]);
        assert!(hub.remove_conn(1));
        assert_eq!(hub.subscribers(3), 0);
        assert!(!hub.remove_conn(1));
    }

    #[test]
    fn removal_leaves_the_descriptor_to_its_owner() {
        let mut hub = Hub::new();
        let (a, mut ra) = pair();
        hub.add_conn(1, a.as_raw_fd()).unwrap();
        hub.subscribe(1, 1);
        assert!(hub.remove_conn(1));
        assert_eq!(hub.publish(&[(1, b"gone")]).written, 0);
        // still open: its owner writes and closes it
        (&a).write_all(b"owner").unwrap();
        assert_eq!(read_n(&mut ra, 5), b"owner");
        assert!(hub.add_conn(2, -1).is_ok());
        assert!(hub.add_conn(3, 1_000_000).is_err()); // not an open descriptor
    }
}

#[cfg(feature = "python")]
pub mod python {
    //! `rustext.FanoutHub`: the [`Hub`](super::Hub) for the juggler server.

    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList, PyTuple};

    /// Native fan-out of event frames to websocket connections (see the Rust module doc).
    #[pyclass(module = "rustext", name = "FanoutHub")]
    pub struct FanoutHub {
        hub: super::Hub,
    }

    #[pymethods]
    impl FanoutHub {
        #[new]
        fn new() -> Self {
            Self { hub: super::Hub::new() }
        }

        /// Register connection `conn`; `fd` is its socket (remove the connection
        /// before it can close), or -1 when Python writes everything for it.
        /// `deflate`: it negotiated permessage-deflate, and is written the compressed frames.
        #[pyo3(signature = (conn, fd, deflate = false))]
        fn add_conn(&mut self, conn: u64, fd: i32, deflate: bool) -> PyResult<()> {
            self.hub.add_conn_deflate(conn, fd, deflate).map_err(PyErr::from)
        }

        /// Forget `conn` and its subscriptions. False when unknown.
        fn remove_conn(&mut self, conn: u64) -> bool {
            self.hub.remove_conn(conn)
        }

        /// Held: Python has output queued for `conn`, frames go through Python.
        fn hold(&mut self, conn: u64, held: bool) {
            self.hub.hold(conn, held);
        }

        fn subscribe(&mut self, conn: u64, key: u64) -> bool {
            self.hub.subscribe(conn, key)
        }

        fn unsubscribe(&mut self, conn: u64, key: u64) -> bool {
            self.hub.unsubscribe(conn, key)
        }

        fn subscribers(&self, key: u64) -> usize {
            self.hub.subscribers(key)
        }

        /// Write `frames` (a list of (key, bytes), or (key, bytes, compressed
        /// bytes or None) for connections that negotiated deflate) to the keys' subscribers.
        /// Returns (frames written, held, partial, failed): held is a list of
        /// (conn, frame index) for Python to write, partial a list of (conn,
        /// bytes the kernel did not take), failed a list of conns whose socket
        /// failed; each of the three is None when empty.
        fn publish<'py>(&mut self, py: Python<'py>, frames: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyTuple>> {
            let mut owned: Vec<(u64, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)> = Vec::with_capacity(frames.len());
            for item in frames.iter() {
                let t = item.cast_into::<PyTuple>()?;
                if t.len() == 3 {
                    let (key, frame, deflated): (u64, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>) = t.extract()?;
                    owned.push((key, frame, deflated));
                } else {
                    let (key, frame): (u64, Bound<'py, PyBytes>) = t.extract()?;
                    owned.push((key, frame, None));
                }
            }
            let views: Vec<(u64, &[u8], &[u8])> = owned
                .iter()
                .map(|(k, b, z)| (*k, b.as_bytes(), z.as_ref().map_or(b.as_bytes(), |z| z.as_bytes())))
                .collect();
            let out = self.hub.publish_deflated(&views);
            let none = || py.None().into_bound(py);
            let held = if out.held.is_empty() { none() } else { out.held.into_pyobject(py)?.into_any() };
            let partial = if out.partial.is_empty() {
                none()
            } else {
                let items: Vec<(u64, Bound<'py, PyBytes>)> =
                    out.partial.iter().map(|(id, rest)| (*id, PyBytes::new(py, rest))).collect();
                items.into_pyobject(py)?.into_any()
            };
            let failed = if out.failed.is_empty() { none() } else { out.failed.into_pyobject(py)?.into_any() };
            PyTuple::new(py, [out.written.into_pyobject(py)?.into_any(), held, partial, failed])
        }
    }
}
