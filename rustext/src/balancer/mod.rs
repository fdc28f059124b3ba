//! The HTTP load balancer's data plane: a tokio reverse proxy on threads of
//! its own, with a hand-written HTTP/1 fast path for the common exchange and
//! hyper for everything else. Python configures it, reads its stats and marks
//! backends up or down; it never runs per request.
//!
//! - [`config`]   typed configuration: settings, routes, policies and limits as configured (read
//!   from `balancer.config`, which holds the defaults and the checks), below the modules that
//!   compile and run it (no cycle)
//! - [`upstream`] backends, their state, and the balancing algorithms
//! - [`accesslog`] access logs: destinations, per-worker buffers, the writer thread (`accesslog/`: formats, syslog)
//! - [`decide`]   the one decision on a request for both paths (sans-I/O): route, pool, header edits,
//!   rate-limit verdict, the balancer's own answers and termination codes
//! - [`encode`]   response compression, the decision (sans-I/O): the coding a client accepts, whether a
//!   response is compressed, its header edits
//! - [`compress`] the streaming encoder of a compressed response (gzip, brotli, zstd)
//! - [`attempts`] the attempt policy of a request (retries, replays, timeouts), both paths
//! - [`h1`]       sans-I/O HTTP/1 heads for the fast path (httparse; `h1/`: request, response, chunks,
//!   edits); below everything else: it knows no route, pool or configuration
//! - [`worker`]   what workers share, what each owns, what is known of a client connection (both paths)
//! - [`connctl`]  what the housekeeping knows of a client connection, and the open-connection count
//! - [`fast`]     the fast path: common exchanges on raw sockets (`fast/answers`: its own answers)
//! - [`fastio`]   the fast path's sockets, backend links and their pool (no HTTP)
//! - [`route`]    routes, named backend pools, header rules, redirects, request ids, compiled at load
//! - [`proxy`]    hyper's path: choose, forward, stream back, retry
//! - [`reqbody`]  hyper's path's request body to a backend (read ahead, counted)
//! - [`respbody`] hyper's path's response body to the client (streamed, holding its backend until it ends)
//! - [`outcome`]  one backend attempt's outcome on hyper's path, and what its response holds of the backend
//! - [`hyperlog`] hyper's path's access-log line, and lines of connections without a request
//! - [`ratelimit`] request rate limits per client address or header (GCRA, one table for all workers)
//! - [`policy`]   (`upstream/policy`) backup servers, slow start, retry-on, layer-7 health, cookie persistence
//! - [`pool`]     hyper's keep-alive backend connections, one pool per worker
//! - [`net`]      TCP streams writing with send/sendmsg
//! - [`server`]   listeners, worker threads, lifecycle (start/update/drain)
//! - `serve`      one worker thread: accept loops, housekeeping, a connection from accept to close
//! - `svc`        hyper's service for a client connection (serve, h2c and https serve with it)
//! - [`https`]    TLS termination (HTTP/1.1 and HTTP/2), the HTTPS redirect
//! - [`acme`]     ACME HTTP-01 challenges answered before routing (the tokens the control plane sets)
//! - [`http3`]    HTTP/3 on the TLS listeners: the QUIC endpoint, each request to hyper's path's handler
//! - [`backend_tls`] TLS to backends (both pools)
//! - [`stats`]    per-worker counters and the latency histogram
//! - [`unix`]     Unix stream sockets (backends)
//! - [`tunnel`]   upgraded connections: the byte relay and its tunnel timeout
//! - [`proxyproto`] the PROXY protocol (v1/v2) in and out, sans-I/O
//! - [`l4`]       PROXY headers on accepted connections, before HTTP or TLS
//! - [`sticky`]   cookie persistence on a request and its response (hyper's path)
//! - [`tried`]    the set of backends a request has tried (any pool size)
//! - [`watched`]  the client side of a connection hyper serves (activity, head timeout, replayed bytes)
//! - [`h2c`]      cleartext HTTP/2 from clients, found by its preface
//! - [`h2pool`]   HTTP/2 to backends (`proto = "h2"`): multiplexed connections per worker
//! - [`h2settings`] sans-I/O reader of a backend's stream limit (its first SETTINGS frame)
//! - [`grpc`]     gRPC specifics: the balancer's own errors as gRPC statuses
//! - [`listeners`] listener slots, added and removed by reloads
//! - `python`     the `rustext.Balancer` class (`python/schema`: reads `balancer.config`'s dataclasses
//!   into [`config`]'s types)
//!
//! The modules form no import cycle (`tests/test_layout.py`); their layers,
//! bottom up, are listed in the contributing guide.

pub mod accesslog;
pub mod acme;
pub mod attempts;
pub mod backend_tls;
pub mod clientcert;
pub mod config;
pub mod compress;
pub mod connctl;
pub mod decide;
pub mod encode;
pub mod fast;
pub mod fastio;
pub mod h1;
pub mod https;
pub mod http3;
pub mod l4;
pub mod listeners;
pub mod net;
mod pool;
pub mod proxy;
pub mod worker;
pub mod outcome;
pub mod reqbody;
pub mod respbody;
pub mod hyperlog;
pub mod proxyproto;
pub mod ratelimit;
pub mod route;
pub mod server;
mod serve;
mod svc;
pub mod stats;
pub mod sticky;
pub mod tried;
pub mod tunnel;
pub mod unix;
pub mod upstream;
pub use upstream::policy;
pub mod watched;
pub mod h2c;
pub mod h2pool;
pub mod h2settings;
pub mod grpc;

#[cfg(feature = "python")]
pub mod python;

/// The extension's allocator (its Rust allocations only; Python keeps its
/// own). tokio (and hyper, on its path) allocate and free a few small
/// objects per connection or request (task cells, buffers, header maps);
/// mimalloc's per-thread free lists serve those faster than glibc malloc
/// (measured when it was chosen).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
