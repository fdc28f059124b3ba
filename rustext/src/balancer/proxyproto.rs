//! The PROXY protocol (HAProxy's `accept-proxy` / `send-proxy`), sans-I/O.
//!
//! [`parse`] takes the first bytes of a connection and tells whether they
//! hold a whole header (and how long it is), need more bytes, or are not a
//! valid header; version 1 (text) and 2 (binary) are told apart by their
//! signatures, as HAProxy does. Bounds are checked before anything is
//! buffered: a v1 line ends within 107 bytes, a v2 header within
//! [`MAX_V2_LEN`]. [`encode`] writes the header a backend connection starts with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v2 signature (12 bytes).
pub const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v1 line is at most this long, CRLF included (the specification's bound).
pub const V1_MAX: usize = 107;
/// The longest v2 header accepted (fixed part, addresses and TLVs). The
/// specification allows 16 + 65535 bytes; real senders (HAProxy, cloud load
/// balancers) stay under a few hundred.
pub const MAX_V2_LEN: usize = 16 + 4096;
/// A buffer of this size holds any header [`parse`] accepts.
pub const MAX_HEADER: usize = MAX_V2_LEN;

/// Which header a backend connection starts with (`send_proxy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "v1" => Ok(Version::V1),
            "v2" => Ok(Version::V2),
            other => Err(format!("send_proxy must be \"v1\" or \"v2\", got {other:?}")),
        }
    }
}

/// What a complete header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: Version,
    /// The original client and the address it connected to; `None` for v1
    /// `UNKNOWN`, v2 `LOCAL` (the sender's own health checks) and families
    /// other than IPv4/IPv6: the connection's real addresses then apply.
    pub addrs: Option<(SocketAddr, SocketAddr)>,
}

/// Why the first bytes of a connection are not a PROXY header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Neither signature: the peer did not send a PROXY header.
    Missing,
    /// A v1 line longer than 107 bytes, or v2 longer than [`MAX_V2_LEN`].
    TooLong,
    /// Malformed (the reason, for logs and tests).
    Invalid(&'static str),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Missing => f.write_str("no PROXY protocol header"),
            Error::TooLong => f.write_str("PROXY protocol header too long"),
            Error::Invalid(why) => write!(f, "invalid PROXY protocol header: {why}"),
        }
    }
}

/// `Ok(None)`: a valid beginning, more bytes needed. `Ok(Some((h, n)))`: a
/// header of `n` bytes (what follows belongs to the application).
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    let n = buf.len().min(V2_SIG.len());
    if buf[..n] == V2_SIG[..n] {
        return if n < V2_SIG.len() { Ok(None) } else { parse_v2(buf) };
    }
    let n = buf.len().min(6);
    if buf[..n] == b"PROXY "[..n] {
        return if n < 6 { Ok(None) } else { parse_v1(buf) };
    }
    Err(Error::Missing)
}

fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if buf.len() >= V1_MAX {
            return Err(Error::TooLong);
        }
        if window.contains(&b'\n') {
            return Err(Error::Invalid("line feed without carriage return"));
        }
        return Ok(None);
    };
    if window[..cr].contains(&b'\n') {
        // as when the line had arrived only up to that line feed: one verdict whatever the reads' cuts
        return Err(Error::Invalid("line feed without carriage return"));
    }
    if cr + 1 >= window.len() {
        return if buf.len() >= V1_MAX { Err(Error::TooLong) } else { Ok(None) };
    }
    if window[cr + 1] != b'\n' {
        return Err(Error::Invalid("carriage return without line feed"));
    }
    let line = std::str::from_utf8(&buf[6..cr]).map_err(|_| Error::Invalid("not ASCII"))?;
    let len = cr + 2;
    let mut it = line.split(' ');
    let proto = it.next().unwrap_or("");
    if proto == "UNKNOWN" {
        // The rest of the line is to be ignored.
        return Ok(Some((Header { version: Version::V1, addrs: None }, len)));
    }
    let parts: Vec<&str> = it.collect();
    if parts.len() != 4 {
        return Err(Error::Invalid("v1 needs source, destination and both ports"));
    }
    let (src, dst): (IpAddr, IpAddr) = match proto {
        "TCP4" => (
            parts[0].parse::<Ipv4Addr>().map_err(|_| Error::Invalid("bad IPv4 source"))?.into(),
            parts[1].parse::<Ipv4Addr>().map_err(|_| Error::Invalid("bad IPv4 destination"))?.into(),
        ),
        "TCP6" => (
            parts[0].parse::<Ipv6Addr>().map_err(|_| Error::Invalid("bad IPv6 source"))?.into(),
            parts[1].parse::<Ipv6Addr>().map_err(|_| Error::Invalid("bad IPv6 destination"))?.into(),
        ),
        _ => return Err(Error::Invalid("v1 protocol must be TCP4, TCP6 or UNKNOWN")),
    };
    let sport = port(parts[2])?;
    let dport = port(parts[3])?;
    Ok(Some((
        Header { version: Version::V1, addrs: Some((SocketAddr::new(src, sport), SocketAddr::new(dst, dport))) },
        len,
    )))
}

fn port(s: &str) -> Result<u16, Error> {
    // decimal digits only: "+1", " 1" and "0x1" are not ports
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return Err(Error::Invalid("bad port"));
    }
    s.parse().map_err(|_| Error::Invalid("bad port"))
}

fn parse_v2(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    if buf.len() < 16 {
        if buf.len() > 12 && buf[12] >> 4 != 2 {
            return Err(Error::Invalid("v2 version must be 2"));
        }
        return Ok(None);
    }
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Err(Error::Invalid("v2 version must be 2"));
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        _ => return Err(Error::Invalid("v2 command must be LOCAL or PROXY")),
    };
    let fam = buf[13];
    let len = 16 + u16::from_be_bytes([buf[14], buf[15]]) as usize;
    if len > MAX_V2_LEN {
        return Err(Error::TooLong);
    }
    if buf.len() < len {
        return Ok(None);
    }
    let body = &buf[16..len];
    let (addrs, addr_len) = match fam >> 4 {
        // UNSPEC
        0 => (None, 0),
        1 => {
            if body.len() < 12 {
                return Err(Error::Invalid("v2 IPv4 addresses need 12 bytes"));
            }
            let ip = |o: usize| IpAddr::from([body[o], body[o + 1], body[o + 2], body[o + 3]]);
            let p = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
            (Some((SocketAddr::new(ip(0), p(8)), SocketAddr::new(ip(4), p(10)))), 12)
        }
        2 => {
            if body.len() < 36 {
                return Err(Error::Invalid("v2 IPv6 addresses need 36 bytes"));
            }
            let ip = |o: usize| {
                let mut a = [0u8; 16];
                a.copy_from_slice(&body[o..o + 16]);
                IpAddr::from(a)
            };
            let p = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
            (Some((SocketAddr::new(ip(0), p(32)), SocketAddr::new(ip(16), p(34)))), 36)
        }
        3 => {
            if body.len() < 216 {
                return Err(Error::Invalid("v2 unix addresses need 216 bytes"));
            }
            (None, 216)
        }
        _ => return Err(Error::Invalid("v2 address family unknown")),
    };
    if fam & 0x0f > 2 {
        return Err(Error::Invalid("v2 transport unknown"));
    }
    // TLVs: walked to check that they fit; their contents are not used.
    let mut tlvs = &body[addr_len..];
    while !tlvs.is_empty() {
        if tlvs.len() < 3 {
            return Err(Error::Invalid("v2 TLV truncated"));
        }
        let n = 3 + u16::from_be_bytes([tlvs[1], tlvs[2]]) as usize;
        if n > tlvs.len() {
            return Err(Error::Invalid("v2 TLV overruns the header"));
        }
        tlvs = &tlvs[n..];
    }
    let addrs = if local { None } else { addrs };
    Ok(Some((Header { version: Version::V2, addrs }, len)))
}

/// The header announcing a connection from `src` to `dst`. Mixed families
/// (an IPv4 client on an IPv6 listener) are sent as IPv6, v4-mapped.
pub fn encode(version: Version, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (src, dst) = match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => (src, dst),
        _ => (v6(src), v6(dst)),
    };
    match version {
        Version::V1 => {
            let fam = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            format!("PROXY {fam} {} {} {} {}\r\n", src.ip(), dst.ip(), src.port(), dst.port()).into_bytes()
        }
        Version::V2 => {
            let mut out = Vec::with_capacity(16 + 36);
            out.extend_from_slice(V2_SIG);
            out.push(0x21); // version 2, PROXY
            match (src.ip(), dst.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out.push(0x11); // INET, STREAM
                    out.extend_from_slice(&12u16.to_be_bytes());
                    out.extend_from_slice(&s.octets());
                    out.extend_from_slice(&d.octets());
                }
                (s, d) => {
                    out.push(0x21); // INET6, STREAM
                    out.extend_from_slice(&36u16.to_be_bytes());
                    out.extend_from_slice(&to_v6(s).octets());
                    out.extend_from_slice(&to_v6(d).octets());
                }
            }
            out.extend_from_slice(&src.port().to_be_bytes());
            out.extend_from_slice(&dst.port().to_be_bytes());
            out
        }
    }
}

/// The header HAProxy sends for a connection without IP addresses (a unix
/// socket client): v1 `UNKNOWN`, v2 `LOCAL`-less `PROXY` with family UNSPEC.
pub fn encode_unknown(version: Version) -> Vec<u8> {
    match version {
        Version::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        Version::V2 => {
            let mut out = V2_SIG.to_vec();
            out.extend_from_slice(&[0x21, 0x00, 0, 0]);
            out
        }
    }
}

fn to_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn v6(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(to_v6(a.ip())), a.port())
}

/// A v4-mapped IPv6 address as the IPv4 address it carries (so that a
/// client is known by one address whichever way it was announced).
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v) => match v.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_tcp4_and_tcp6() {
        let b = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /";
        let (h, n) = parse(b).unwrap().unwrap();
        assert_eq!(n, b.len() - 5);
        assert_eq!(h.addrs, Some((sa("192.0.2.1:56324"), sa("198.51.100.2:443"))));
        let b = b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n";
        let (h, n) = parse(b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(h.addrs, Some((sa("[2001:db8::1]:1"), sa("[::1]:65535"))));
    }

    #[test]
    fn v1_unknown_ignores_the_rest_of_the_line() {
        let (h, n) = parse(b"PROXY UNKNOWN whatever 1 2\r\nx").unwrap().unwrap();
        assert_eq!((h.addrs, n), (None, 28));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap().1, 15);
    }

    #[test]
    fn incomplete_is_not_an_error() {
        let full = encode(Version::V1, sa("10.0.0.1:1000"), sa("10.0.0.2:80"));
        for i in 0..full.len() {
            assert_eq!(parse(&full[..i]), Ok(None), "v1 prefix {i}");
        }
        let full = encode(Version::V2, sa("[2001:db8::1]:1000"), sa("[2001:db8::2]:80"));
        for i in 0..full.len() {
            assert_eq!(parse(&full[..i]), Ok(None), "v2 prefix {i}");
        }
    }

    /// A line feed before the CRLF was refused when the line had arrived up
    /// to it, but an UNKNOWN line taken whole once the CRLF came (found by
    /// fuzzing proxy_header): one verdict, whatever the reads' cuts.
    #[test]
    fn a_bare_line_feed_is_refused_however_the_line_arrives() {
        let line = b"PROXY UNKNOWN UNK\n\0\0\0\r\nGET /";
        for cut in 18..line.len() {
            assert_eq!(parse(&line[..cut]), Err(Error::Invalid("line feed without carriage return")), "{cut}");
        }
        assert!(parse(b"PROXY TCP4 1.1.1.1 2.2.2.2 1 2\n\r\n").is_err());
    }

    #[test]
    fn hostile_v1() {
        let bad: &[&[u8]] = &[
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY \xff\r\n",
            b"PROXY \r\n",
        ];
        for b in bad {
            assert!(matches!(parse(b), Err(Error::Invalid(_))), "{:?}", String::from_utf8_lossy(b));
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(Error::Missing));
        assert_eq!(parse(b"proxy TCP4"), Err(Error::Missing));
        assert_eq!(parse(b"\x16\x03\x01"), Err(Error::Missing));
        // no CRLF within 107 bytes
        let mut long = b"PROXY UNKNOWN ".to_vec();
        long.resize(V1_MAX, b'a');
        assert_eq!(parse(&long), Err(Error::TooLong));
        long.truncate(V1_MAX - 1);
        assert_eq!(parse(&long), Ok(None));
        long.push(b'\r');
        assert_eq!(parse(&long), Err(Error::TooLong)); // its LF would be byte 108
        // the specification's longest line is exactly 107 bytes
        let max = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(max.len(), V1_MAX);
        assert!(parse(max).unwrap().is_some());
        let max = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert!(parse(max).unwrap().is_some());
    }

    fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut out = V2_SIG.to_vec();
        out.push(ver_cmd);
        out.push(fam);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn v2_proxy_local_and_tlvs() {
        let addrs = [127, 0, 0, 2, 127, 0, 0, 1, 0x30, 0x39, 0, 80];
        let (h, n) = parse(&v2(0x21, 0x11, &addrs)).unwrap().unwrap();
        assert_eq!(n, 28);
        assert_eq!(h.addrs, Some((sa("127.0.0.2:12345"), sa("127.0.0.1:80"))));
        // LOCAL: the addresses (if any) are ignored
        let (h, _) = parse(&v2(0x20, 0x11, &addrs)).unwrap().unwrap();
        assert_eq!(h.addrs, None);
        let (h, _) = parse(&v2(0x20, 0x00, &[])).unwrap().unwrap();
        assert_eq!(h.addrs, None);
        // TLVs: unknown ones skipped, a zero-length one too
        let mut body = addrs.to_vec();
        body.extend_from_slice(&[0x04, 0, 0, 0xE0, 0, 3, 1, 2, 3, 0x01, 0, 2, b'h', b'2']);
        let (h, n) = parse(&v2(0x21, 0x11, &body)).unwrap().unwrap();
        assert_eq!(n, 16 + body.len());
        assert!(h.addrs.is_some());
        // unix family: the real addresses apply
        let (h, _) = parse(&v2(0x21, 0x31, &[0u8; 216])).unwrap().unwrap();
        assert_eq!(h.addrs, None);
    }

    #[test]
    fn hostile_v2() {
        let addrs = [127, 0, 0, 2, 127, 0, 0, 1, 0x30, 0x39, 0, 80];
        for (ver_cmd, fam, body) in [
            (0x11u8, 0x11u8, &addrs[..]),   // version 1 in binary
            (0x22, 0x11, &addrs[..]),       // unknown command
            (0x21, 0x11, &addrs[..11]),     // IPv4 addresses truncated by the length
            (0x21, 0x21, &[0u8; 35][..]),   // IPv6 short
            (0x21, 0x31, &[0u8; 100][..]),  // unix short
            (0x21, 0x41, &addrs[..]),       // family 4
            (0x21, 0x13, &addrs[..]),       // transport 3
        ] {
            assert!(matches!(parse(&v2(ver_cmd, fam, body)), Err(Error::Invalid(_))), "{ver_cmd:x} {fam:x}");
        }
        // TLV overrunning the declared length, and a truncated TLV head
        let mut body = addrs.to_vec();
        body.extend_from_slice(&[0xE0, 0, 9, 1]);
        assert!(matches!(parse(&v2(0x21, 0x11, &body)), Err(Error::Invalid(_))));
        let mut body = addrs.to_vec();
        body.extend_from_slice(&[0xE0, 0]);
        assert!(matches!(parse(&v2(0x21, 0x11, &body)), Err(Error::Invalid(_))));
        // over the length bound: refused from the fixed part alone
        let mut head = V2_SIG.to_vec();
        head.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(parse(&head), Err(Error::TooLong));
        // a bad version is refused as soon as its byte is there
        let mut head = V2_SIG.to_vec();
        head.push(0x31);
        assert!(matches!(parse(&head), Err(Error::Invalid(_))));
    }

    #[test]
    fn encodes_what_it_parses() {
        for v in [Version::V1, Version::V2] {
            for (s, d) in [
                (sa("127.0.0.2:40000"), sa("127.0.0.1:8080")),
                (sa("[2001:db8::5]:1"), sa("[::1]:443")),
            ] {
                let mut b = encode(v, s, d);
                let n = b.len();
                b.extend_from_slice(b"GET");
                assert_eq!(parse(&b).unwrap(), Some((Header { version: v, addrs: Some((s, d)) }, n)));
            }
            // mixed families go as IPv6, and come back as the same client
            let b = encode(v, sa("127.0.0.2:40000"), sa("[::1]:80"));
            let (h, _) = parse(&b).unwrap().unwrap();
            assert_eq!(canonical(h.addrs.unwrap().0), sa("127.0.0.2:40000"));
            let (h, n) = parse(&encode_unknown(v)).unwrap().unwrap();
            assert_eq!((h.addrs, n), (None, encode_unknown(v).len()));
        }
    }

    proptest! {
        #[test]
        fn never_panics_and_bounds_hold(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            match parse(&b) {
                Ok(Some((_, n))) => prop_assert!(n <= b.len() && n <= MAX_HEADER),
                Ok(None) => prop_assert!(b.len() < MAX_HEADER),
                Err(_) => {}
            }
        }

        #[test]
        fn signature_then_noise(tail in proptest::collection::vec(any::<u8>(), 0..300), v2sig in any::<bool>()) {
            let mut b = if v2sig { V2_SIG.to_vec() } else { b"PROXY ".to_vec() };
            b.extend_from_slice(&tail);
            if let Ok(Some((_, n))) = parse(&b) {
                prop_assert!(n <= b.len());
            }
            if !v2sig && b.len() >= V1_MAX {
                prop_assert!(parse(&b) != Ok(None));
            }
        }

        #[test]
        fn roundtrip(a in any::<[u8; 4]>(), b in any::<[u8; 16]>(), p in any::<u16>(), q in any::<u16>(), v in any::<bool>()) {
            let s = SocketAddr::new(IpAddr::from(a), p);
            let d = SocketAddr::new(IpAddr::from(b), q);
            let ver = if v { Version::V2 } else { Version::V1 };
            let enc = encode(ver, s, d);
            let (h, n) = parse(&enc).unwrap().unwrap();
            prop_assert_eq!(n, enc.len());
            let (hs, hd) = h.addrs.unwrap();
            prop_assert_eq!(canonical(hs), s);
            prop_assert_eq!(canonical(hd), canonical(d));
        }

        #[test]
        fn split_anywhere(a in any::<[u8; 4]>(), p in any::<u16>(), cut in 0usize..60, v in any::<bool>()) {
            let ver = if v { Version::V2 } else { Version::V1 };
            let enc = encode(ver, SocketAddr::new(IpAddr::from(a), p), "10.0.0.1:80".parse().unwrap());
            let cut = cut.min(enc.len());
            if cut < enc.len() {
                prop_assert_eq!(parse(&enc[..cut]), Ok(None));
            }
        }
    }
}
