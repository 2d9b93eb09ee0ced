//! `fencegate bench store`: the embedded store on its own, serving S3 on a
//! port with a credential the caller names, so that BENCHMARKS.md can set
//! it beside other stores (s3s-fs, Garage) with nothing of the proxy in
//! front. It is the store the embedded default runs, served as on a socket
//! (`upstream::embedded::serve`): every request through s3s, where the
//! default in process answers a plain GET or HEAD without it
//! (`upstream::plain_read`).

use crate::store::Store;
use crate::upstream::embedded;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio::net::TcpListener;

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Address to listen on (port 0: any free port; the line
    /// `store listening ADDR` on stdout says which).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Directory of the store's index and blobs (made if missing).
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value = "fencegate-demo")]
    pub access_key: String,
    #[arg(long, default_value = "fencegate-demo-secret-key")]
    pub secret_key: String,
    /// Runtime worker threads (scripts/bench-cores gives one a core).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Opens the store, binds, prints `store listening ADDR`, and serves until
/// the process ends.
pub async fn run(args: StoreArgs) -> Result<(), String> {
    let store = tokio::task::block_in_place(|| Store::open(&args.dir, None))?;
    store.spawn_recovery();
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("store listening {addr}");
    embedded::serve(listener, store, args.access_key, args.secret_key).await;
    Ok(())
}
