//! Datagrams from anyone to the server side of the balancer's QUIC
//! endpoint (quinn-proto, sans-I/O), configured as the balancer configures
//! it (`rustext::balancer::http3::server_config`): each input is split into
//! datagrams (a 2-byte length before each), fed in order from one address;
//! connections they open are driven (events, transmits, timers) as the
//! runtime would. Nothing may panic or hang.
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quinn_proto::{ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server configuration, made for each input and dropped with it: kept in a
/// static, the key aws-lc parsed for it is reported by LeakSanitizer (it does not
/// see the key as reachable), which libFuzzer counts as a crash.
fn server() -> Arc<ServerConfig> {
    let cert = CertificateDer::from_pem_slice(include_bytes!("quic/cert.pem")).expect("a certificate");
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("quic/key.pem")).expect("a key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("a certificate and its key");
    Arc::new(rustext::balancer::http3::server_config(tls, Duration::from_secs(60)).expect("a QUIC configuration"))
}

fn datagrams(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 && out.len() < 64 {
        let n = (u16::from_be_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
        out.push(&data[2..2 + n]);
        data = &data[2 + n..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), Some(server()), true, Some([7; 32]));
    let remote: SocketAddr = "127.0.0.1:4433".parse().expect("an address");
    let mut now = Instant::now();
    let mut buf = Vec::new();
    let mut conns: Vec<(ConnectionHandle, quinn_proto::Connection)> = Vec::new();
    for d in datagrams(data) {
        now += Duration::from_millis(1);
        let event = ep.handle(now, remote, None, None, BytesMut::from(d), &mut buf);
        buf.clear();
        match event {
            Some(DatagramEvent::NewConnection(incoming)) => {
                if let Ok((h, conn)) = ep.accept(incoming, now, &mut buf, None) {
                    conns.push((h, conn));
                }
                buf.clear();
            }
            Some(DatagramEvent::ConnectionEvent(h, ev)) => {
                if let Some((_, conn)) = conns.iter_mut().find(|(c, _)| *c == h) {
                    conn.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(_)) | None => {}
        }
        for (h, conn) in conns.iter_mut() {
            if let Some(t) = conn.poll_timeout() {
                if t <= now {
                    conn.handle_timeout(now);
                }
            }
            while let Some(ev) = conn.poll_endpoint_events() {
                if let Some(back) = ep.handle_event(*h, ev) {
                    conn.handle_event(back);
                }
            }
            while conn.poll_transmit(now, 1, &mut buf).is_some() {
                buf.clear();
            }
            while conn.poll().is_some() {}
        }
    }
});
