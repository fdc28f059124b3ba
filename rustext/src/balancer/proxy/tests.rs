use super::*;

#[test]
fn hop_by_hop_and_forwarded() {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, x-secret"),
    );
    h.insert("x-secret", HeaderValue::from_static("1"));
    h.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    h.insert(header::HOST, HeaderValue::from_static("example.com"));
    h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
    strip_hop_by_hop(&mut h);
    add_forwarded(
        &mut h,
        &Peer::new("10.0.0.2:5".parse().unwrap(), Arc::default()),
    );
    assert!(h.get("x-secret").is_none() && h.get(header::TRANSFER_ENCODING).is_none());
    assert_eq!(h[header::HOST], "example.com");
    assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.2");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["forwarded"], "for=10.0.0.2;proto=http");
    let mut h6 = HeaderMap::new();
    add_forwarded(
        &mut h6,
        &Peer::new("[::1]:5".parse().unwrap(), Arc::default()),
    );
    assert_eq!(h6["forwarded"], "for=\"[::1]\";proto=http");
    let cache = super::super::worker::PeerCache::default();
    for a in ["10.0.0.2:5", "10.0.0.2:6", "[::1]:7", "10.0.0.3:5"] {
        let addr: SocketAddr = a.parse().unwrap();
        let (c, n) = (
            Peer::cached(addr, Arc::default(), &cache),
            Peer::new(addr, Arc::default()),
        );
        assert_eq!((c.ip, &c.xff, &c.forwarded), (n.ip, &n.xff, &n.forwarded));
    }
}

#[test]
fn many_hop_by_hop_headers() {
    let mut h = HeaderMap::new();
    for n in ["te", "trailer", "upgrade", "keep-alive", "proxy-connection", "x-a"] {
        h.insert(HeaderName::from_static(n), HeaderValue::from_static("1"));
    }
    h.insert(header::CONNECTION, HeaderValue::from_static("close, x-a"));
    h.insert(header::HOST, HeaderValue::from_static("h"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.len(), 1, "{h:?}");
    let mut k = HeaderMap::new();
    k.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
    k.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
    strip_hop_by_hop(&mut k);
    assert_eq!(k.len(), 1);
    let mut n = HeaderMap::new();
    n.insert(header::CONNECTION, HeaderValue::from_static("Host, Content-Length, x-a"));
    n.insert(header::HOST, HeaderValue::from_static("h"));
    n.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
    n.insert("x-a", HeaderValue::from_static("1"));
    strip_hop_by_hop(&mut n);
    assert!(n.contains_key(header::HOST) && n.contains_key(header::CONTENT_LENGTH) && n.len() == 2, "{n:?}");
}

#[test]
fn upgrade_detection() {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, Upgrade"),
    );
    assert!(!is_upgrade(&h));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    assert!(is_upgrade(&h));
}
