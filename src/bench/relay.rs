//! `fencegate bench relay`: the floor of a forwarding hop between replicas
//! (BENCHMARKS.md, "Cores"). A replica that does not own
//! a resource must at least read the request's head, find the owner from
//! the path, and stream the request there and the answer back. This does
//! exactly that and nothing more (no signature check, no gate), so a run
//! through it bounds from below what forwarding inside the cluster costs.
//!
//! The owner of a path is one of the `--to` addresses, picked by a hash of
//! the path: every relay picks the same one for the same path, as replicas
//! would agree on an owner.

use crate::s3::error::S3Error;
use crate::upstream::pool::Pool;
use clap::Args;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Address to listen on (port 0: any free port; the line
    /// `relay listening ADDR` on stdout says which).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// An owner's address (host:port); repeat for each. A path goes to the
    /// one its hash picks.
    #[arg(long = "to", required = true)]
    pub to: Vec<SocketAddr>,
    /// Runtime worker threads (scripts/bench-cores gives one a core).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// The owner among `n` of `path`: FNV-1a of the path, modulo `n`.
pub fn owner_of(path: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

/// Binds, prints `relay listening ADDR`, and relays until the process ends.
pub async fn run(args: RelayArgs) -> Result<(), String> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("relay listening {addr}");
    let tls = crate::tls::client_config_without_roots()?;
    let mut pools = Vec::new();
    for to in &args.to {
        let uri: Uri = format!("http://{to}").parse().map_err(|e| format!("{e}"))?;
        pools.push(Pool::new(tls.clone(), uri, Duration::from_secs(30)));
    }
    let pools = Arc::new(pools);
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let pools = pools.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let pools = pools.clone();
                async move { Ok::<_, Infallible>(relay(&pools, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

type RelayBody = Either<Incoming, Empty<bytes::Bytes>>;

/// One request to its owner and the answer back, both streamed; the
/// request's head goes as it came (method, URI, headers, Host), so a
/// signature over it still verifies at the owner.
async fn relay(pools: &[Pool], req: Request<Incoming>) -> Response<RelayBody> {
    let pool = &pools[owner_of(req.uri().path(), pools.len())];
    let (head, body) = req.into_parts();
    let body = body
        .map_err(|e| {
            tracing::debug!("relay: request body: {e}");
            S3Error::IncompleteBody
        })
        .boxed_unsync();
    match pool.send(Request::from_parts(head, body)).await {
        Ok(resp) => resp.map(Either::Left),
        Err(e) => {
            tracing::debug!("relay: {e}");
            let mut r = Response::new(Either::Right(Empty::new()));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::owner_of;

    #[test]
    fn owners_are_spread_and_stable() {
        let mut seen = [0usize; 3];
        for i in 0..3000 {
            let p = format!("/bench/key-{i}");
            assert_eq!(owner_of(&p, 3), owner_of(&p, 3));
            seen[owner_of(&p, 3)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }
}
