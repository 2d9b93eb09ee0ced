//! The embedded default backend: an S3 server on a local directory (s3s-fs),
//! started in-process on a loopback port with a random credential, so that
//! fencegate forwards to it exactly as it forwards to a real store.

use super::client::BackendTarget;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use rand::RngExt;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use std::path::Path;
use tokio::net::TcpListener;

fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Starts the embedded store on `root` and returns how to reach it.
pub async fn start(root: &Path, region: &str) -> Result<BackendTarget, String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let fs = s3s_fs::FileSystem::new(root)
        .map_err(|e| format!("embedded store at {}: {e:?}", root.display()))?;
    let access_key_id = format!("EMB{}", random_token(17));
    let secret_access_key = random_token(40);
    let service = {
        let mut b = S3ServiceBuilder::new(fs);
        b.set_auth(SimpleAuth::from_single(
            access_key_id.clone(),
            secret_access_key.clone(),
        ));
        b.build()
    };
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("embedded store: cannot listen: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("embedded store: {e}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
            });
        }
    });
    Ok(BackendTarget {
        endpoint: format!("http://{addr}")
            .parse()
            .map_err(|e| format!("{e}"))?,
        region: region.to_string(),
        access_key_id,
        secret_access_key,
        virtual_host: false,
    })
}
