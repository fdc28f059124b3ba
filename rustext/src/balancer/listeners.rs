//! Listeners that change while the balancer runs (a reload that adds or
//! removes `[[listeners]]`).
//!
//! Each listener ever opened has a slot, its index for life: routes,
//! connections and access log lines refer to it by that index, so a
//! listener that goes keeps its routes for the connections still draining
//! on it, and one that stays keeps its sockets (nothing refused, nothing
//! cut). [`plan`] says which slots stay, which listeners are new and which
//! slots go; the workers are told through [`Cmd`].

use std::net::SocketAddr;
use std::sync::OnceLock;

use super::config::ListenAddr;

/// The most listener slots a balancer opens in its life (each listener
/// added by a reload takes a new one).
pub const MAX_SLOTS: usize = 1024;

/// An append-only table indexed by slot: entries never move or change once
/// set, so readers need no lock.
pub struct Slots<T>(Box<[OnceLock<T>]>);

impl<T> Slots<T> {
    pub fn new(first: Vec<T>) -> Self {
        let s = Slots((0..MAX_SLOTS).map(|_| OnceLock::new()).collect());
        for (i, v) in first.into_iter().enumerate() {
            let _ = s.0[i].set(v);
        }
        s
    }
    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        self.0.get(i).and_then(OnceLock::get)
    }
    /// Set slot `i` (once; a second set is ignored).
    pub fn set(&self, i: usize, v: T) {
        if let Some(cell) = self.0.get(i) {
            let _ = cell.set(v);
        }
    }
}

/// What a worker is told to do with its listeners.
pub enum Cmd {
    /// Accept on this socket (the worker's own) for slot `idx`.
    Add {
        sock: std::net::TcpListener,
        idx: usize,
        tls: bool,
        accept_proxy: bool,
    },
    /// Serve HTTP/3 on this UDP socket for slot `idx` (a TLS listener's).
    Quic { sock: std::net::UdpSocket, idx: usize },
    /// Stop accepting for slot `idx` (its socket closes); its connections
    /// finish the request in flight, then close. `done` is told once the
    /// socket is closed.
    Remove { idx: usize, done: std::sync::mpsc::Sender<()> },
}

/// How a reload's listeners map onto the running ones.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per new listener (in its order): the slot it keeps, or None (new).
    pub slots: Vec<Option<usize>>,
    /// Live slots no longer listed.
    pub remove: Vec<usize>,
}

/// Whether two listeners are the same socket: the same configured address
/// (port 0 included: the listener keeps the port it got) or Unix path.
fn same(a: &ListenAddr, b: &ListenAddr) -> bool {
    match (&a.unix, &b.unix) {
        (Some(x), Some(y)) => x.path == y.path,
        (None, None) => a.addr == b.addr,
        _ => false,
    }
}

/// Match `new` listeners to `live` slots (None: a removed slot).
pub fn plan(live: &[Option<ListenAddr>], new: &[ListenAddr]) -> Plan {
    let mut taken = vec![false; live.len()];
    let slots = new
        .iter()
        .map(|n| {
            let hit = live
                .iter()
                .enumerate()
                .position(|(i, l)| !taken[i] && l.as_ref().is_some_and(|l| same(l, n)));
            if let Some(i) = hit {
                taken[i] = true;
            }
            hit
        })
        .collect();
    let remove = live
        .iter()
        .enumerate()
        .filter(|(i, l)| l.is_some() && !taken[*i])
        .map(|(i, _)| i)
        .collect();
    Plan { slots, remove }
}

/// A listener's identity across a binary upgrade: its configured address
/// (`127.0.0.1:8000`, `[::]:443`) or `unix:/path`.
pub fn key(la: &ListenAddr) -> String {
    match &la.unix {
        Some(u) => format!("unix:{}", u.path.display()),
        None => la.addr.to_string(),
    }
}

/// A port-0 listener is reported as the port it got.
pub fn display(la: &ListenAddr, bound: SocketAddr) -> String {
    match &la.unix {
        Some(u) => format!("unix:{}", u.path.display()),
        None => bound.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn la(s: &str) -> ListenAddr {
        ListenAddr { addr: s.parse().unwrap(), tls: false, http3: false, accept_proxy: false, unix: None }
    }

    #[test]
    fn keeps_adds_and_removes() {
        let live = vec![Some(la("127.0.0.1:8000")), None, Some(la("127.0.0.1:8001"))];
        let p = plan(&live, &[la("127.0.0.1:8001"), la("127.0.0.1:8002")]);
        assert_eq!(p, Plan { slots: vec![Some(2), None], remove: vec![0] });
        // port 0: the listener that got a port keeps it, a second one is new
        let p = plan(&[Some(la("127.0.0.1:0"))], &[la("127.0.0.1:0"), la("127.0.0.1:0")]);
        assert_eq!(p, Plan { slots: vec![Some(0), None], remove: vec![] });
    }

    #[test]
    fn slots_are_append_only() {
        let s = Slots::new(vec!["a".to_string()]);
        assert_eq!(s.get(0).map(String::as_str), Some("a"));
        assert!(s.get(1).is_none());
        s.set(1, "b".into());
        s.set(1, "c".into());
        assert_eq!(s.get(1).map(String::as_str), Some("b"));
        assert!(s.get(MAX_SLOTS).is_none());
    }
}
