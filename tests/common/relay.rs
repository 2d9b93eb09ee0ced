//! A TCP relay the test can freeze: bytes stop moving both ways while the
//! connections stay open, as in a network partition (no reset, no FIN).
//! Put between a fencegate replica and etcd, it cuts that replica off
//! from etcd and nothing else. It can also slow every chunk down (a far
//! or congested link), to make what a replica hears from etcd late.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    delay_ms: Arc<AtomicU64>,
    target: Arc<Mutex<String>>,
}

impl Relay {
    /// Relays a fresh loopback port to `target` (`host:port`). It runs on
    /// a thread of its own, so a test that blocks its own thread (waiting
    /// for a process) does not stop the relay.
    pub fn start(target: &str) -> Relay {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (frozen, rx) = watch::channel(false);
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let target = Arc::new(Mutex::new(target.to_string()));
        let to = target.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                while let Ok((client, _)) = listener.accept().await {
                    let target = to.lock().unwrap().clone();
                    let Ok(server) = TcpStream::connect(&target).await else {
                        continue;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, rx.clone(), delay.clone()));
                    tokio::spawn(pump(sr, cw, rx.clone(), delay.clone()));
                }
            });
        });
        Relay {
            addr,
            frozen,
            delay_ms,
            target,
        }
    }

    /// Relays new connections to `target` from now on (a process started
    /// again on another port).
    pub fn set_target(&self, target: &str) {
        *self.target.lock().unwrap() = target.to_string();
    }

    /// Holds every chunk this long before passing it on.
    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn freeze(&self, on: bool) {
        self.frozen.send_replace(on);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    delay_ms: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        // Bytes read just before a freeze wait for the thaw too.
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
