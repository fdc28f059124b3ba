//! The fast path against hyper: a request the fast path accepts is accepted
//! by hyper too (the path the rest of a connection may take), with the same
//! method, target and body length. Two parsers that framed one message
//! differently would be a request-smuggling hole.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use rustext::balancer::h1::{parse_request, ReqParse};
use tokio::io::AsyncWriteExt;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

type Seen = Arc<Mutex<Vec<(String, String, usize)>>>;

/// What hyper's HTTP/1 server makes of `msg`: each request's method, target and body length.
async fn hyper_view(msg: Vec<u8>) -> Vec<(String, String, usize)> {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let record = record.clone();
        async move {
            let (parts, body) = req.into_parts();
            let n = body.collect().await.map(|b| b.to_bytes().len()).unwrap_or(usize::MAX);
            record.lock().unwrap().push((parts.method.to_string(), parts.uri.to_string(), n));
            Ok::<_, Infallible>(hyper::Response::new(Empty::<Bytes>::new()))
        }
    });
    let conn = http1::Builder::new().half_close(true).serve_connection(TokioIo::new(server), svc);
    let serve = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
    });
    let _ = client.write_all(&msg).await;
    let _ = client.shutdown().await;
    // hyper answers, then sees the end of input; drain its output so that it is never blocked
    let drain = tokio::spawn(async move {
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut client, &mut sink).await;
    });
    let _ = serve.await;
    drain.abort();
    let v = seen.lock().unwrap().clone();
    v
}

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let ReqParse::Ready(head) = parse_request(data, None, &mut out) else { return };
    let total = head.head_len + head.body_len as usize;
    if data.len() < total {
        return; // the body is not all there: nothing to compare
    }
    let msg = data[..total].to_vec();
    let seen = runtime().block_on(hyper_view(msg));
    assert_eq!(seen.len(), 1, "hyper saw {seen:?} where the fast path saw one request");
    let mut hs = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut hs);
    let _ = req.parse(data);
    let (method, target, body) = &seen[0];
    assert_eq!(Some(method.as_str()), req.method);
    assert_eq!(Some(target.as_str()), req.path);
    assert_eq!(*body as u64, head.body_len);
});
