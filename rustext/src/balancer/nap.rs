//! Napping instead of waiting: how a busy worker goes idle.
//!
//! Why: when clients, balancer and backends share a machine's cores (and
//! most of all in a VM, where waking a halted vCPU takes an IPI through the
//! hypervisor), a worker blocked in `epoll_wait` is woken by the write of a
//! peer, and that peer pays for the wake-up in its own CPU time — on the
//! core that bounds requests/s when the balancer has a core to itself. A
//! worker that is faster than its peers empties its run queue often, so it
//! made them pay often (docs/balancer.md, "Napping instead of waiting").
//!
//! Instead, just before the runtime would block, a worker that was busy
//! with keep-alive traffic (a connection sent another request within the
//! last millisecond, and the last idle spell was shorter than twice the
//! limit) sleeps on a timer in steps of [`STEP`],
//! checking between steps whether the reactor has events (`poll` on the
//! reactor's epoll descriptor, which does not consume them), for up to the
//! configured limit; only then does it block as usual. Nobody waits on the
//! reactor while it naps, so a peer's write costs the peer nothing more
//! than queueing the event. An event that arrives during a nap is seen at
//! the end of that step (at most [`STEP`] later). A worker idle for longer
//! than twice the limit blocks at once, so an idle or lightly loaded
//! balancer adds no latency. Connection-per-request traffic (`ab`) does
//! not nap: there the timer costs more CPU than the wake-ups it saves.
//!
//! The reactor's descriptor is tokio's and not exposed: it is found as the
//! epoll instance (`/proc/self/fd`, `/proc/self/fdinfo`) that holds the
//! worker's own listener. If it cannot be found, napping stays off.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Timer step between two looks at the reactor.
pub const STEP: Duration = Duration::from_micros(20);
/// Naps only within this long (ns) of the last keep-alive request.
const KEEP_ALIVE_WINDOW: u64 = 1_000_000;

pub struct Nap {
    limit: Duration,
    /// The reactor's epoll descriptor, -1 until found.
    epfd: AtomicI32,
    /// When the current park began, as nanoseconds since `epoch`.
    parked_at: AtomicU64,
    /// How long the last park lasted, in nanoseconds.
    last_park: AtomicU64,
    /// Parks that napped (tests).
    naps: AtomicU64,
    /// When the last keep-alive request came in (nanoseconds since `epoch`).
    last_keep_alive: AtomicU64,
    epoch: Instant,
}

impl Nap {
    pub fn new(limit: Duration) -> Self {
        Nap {
            limit,
            epfd: AtomicI32::new(-1),
            parked_at: AtomicU64::new(0),
            last_park: AtomicU64::new(u64::MAX),
            naps: AtomicU64::new(0),
            last_keep_alive: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.limit.is_zero()
    }

    /// Find the reactor that holds `registered` (a descriptor the worker
    /// registered with tokio); napping starts once it is known.
    pub fn attach(&self, registered: RawFd) {
        if self.enabled() {
            if let Some(fd) = epoll_holding(registered) {
                self.epfd.store(fd, Relaxed);
            }
        }
    }

    /// A keep-alive connection sent another request: its peers are busy
    /// and will write again soon, so the next idle spell may be a nap.
    #[inline]
    pub fn keep_alive_seen(&self) {
        self.last_keep_alive.store(self.now(), Relaxed);
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// tokio's `on_thread_park`: the run queue is empty and the runtime is
    /// about to block in the reactor.
    pub fn before_park(&self) {
        let start = self.now();
        self.parked_at.store(start, Relaxed);
        let fd = self.epfd.load(Relaxed);
        let limit = self.limit.as_nanos() as u64;
        let recent = start.saturating_sub(self.last_keep_alive.load(Relaxed)) <= KEEP_ALIVE_WINDOW;
        if fd < 0 || !recent || self.last_park.load(Relaxed) > 2 * limit {
            return;
        }
        self.naps.fetch_add(1, Relaxed);
        let step = libc::timespec {
            tv_sec: 0,
            tv_nsec: STEP.as_nanos() as libc::c_long,
        };
        loop {
            if ready(fd) || self.now() - start >= limit {
                return;
            }
            // SAFETY: a valid timespec; an interrupted sleep just looks again.
            unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
        }
    }

    /// tokio's `on_thread_unpark`.
    pub fn after_park(&self) {
        let took = self.now().saturating_sub(self.parked_at.load(Relaxed));
        self.last_park.store(took, Relaxed);
    }
}

/// Events waiting in epoll instance `fd` (they stay there for the reactor).
fn ready(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) != 0 }
}

/// The epoll instance of this process whose interest list holds `target`.
fn epoll_holding(target: RawFd) -> Option<RawFd> {
    // fdinfo lines read "tfd: %8d events: ..." (fs/eventpoll.c).
    let needle = format!("tfd: {target:>8} ");
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if link.as_os_str() != "anon_inode:[eventpoll]" {
            continue;
        }
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else {
            continue;
        };
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
            continue;
        };
        if info.lines().any(|l| l.starts_with(&needle)) {
            return Some(fd);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn finds_the_epoll_instance_holding_a_descriptor() {
        let rt = runtime();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let fd = epoll_holding(l.as_raw_fd()).expect("the reactor holds the listener");
            assert!(!ready(fd));
            let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !ready(fd) {
                assert!(Instant::now() < deadline, "the connection never showed up");
                std::thread::yield_now();
            }
        });
        assert_eq!(epoll_holding(-5), None);
    }

    #[test]
    fn naps_only_after_a_short_park_and_for_at_most_the_limit() {
        let nap = Nap::new(Duration::from_micros(200));
        let rt = runtime();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            nap.attach(l.as_raw_fd());
            assert!(nap.epfd.load(Relaxed) >= 0);
            // Idle for long: block at once.
            nap.before_park();
            assert_eq!(nap.naps.load(Relaxed), 0);
            nap.after_park();
            // Short last park but no keep-alive request: block at once.
            std::thread::sleep(Duration::from_millis(2));
            nap.last_park.store(0, Relaxed);
            nap.before_park();
            assert_eq!(nap.naps.load(Relaxed), 0);
            // Busy with keep-alive traffic: nap up to the limit.
            nap.last_park.store(0, Relaxed);
            nap.keep_alive_seen();
            let t = Instant::now();
            nap.before_park();
            assert_eq!(nap.naps.load(Relaxed), 1);
            assert!(t.elapsed() >= Duration::from_micros(200));
        });
    }
}
