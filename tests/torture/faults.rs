//! Faults for the torture harness: a TCP hop that can delay, stall and
//! reset the connections that pass through it, and the fencegate `kill -9`
//! schedule. Writer stalls and lock-session loss live with the writers
//! (workload.rs), since they happen inside a lock holder.
//!
//! The hop is a plain TCP forwarder (it knows nothing of HTTP). Per
//! connection, each switch on its own:
//! - **delay**: every chunk, either way, waits up to `delay_max_ms`;
//! - **stall**: a chunk of the answer (backend to client) is held for
//!   `stall_ms` with probability `stall_p`. The request has reached the
//!   backend whole and was acted on; only the client does not know yet;
//! - **late**: a chunk of a request (client to backend) is held for
//!   `late_ms` with probability `late_p` before the backend sees it: a write
//!   sent earlier can reach the backend after one sent later, which is the
//!   race fencegate's ordering barrier closes (CONTRACT §4);
//! - **reset**: each chunk of a request is, with probability `reset_p`, cut
//!   at a random byte and the connection reset (RST) both ways: often in the
//!   middle of a body, sometimes between requests. Each chunk of an answer
//!   is cut the same way with a quarter of that probability, after the
//!   backend acted on the request.
//!
//! When the client side goes away (fencegate killed, a client giving up),
//! bytes the hop still holds for the backend are dropped and the backend's
//! side is reset: a write cannot reach the backend later than its sender's
//! death plus the delay already under way. (A real network can deliver a
//! packet already in flight after its sender died; docs/torture.md says
//! what that means for kill -9.)
//!
//! The hop also gives the writers a stable address in front of a fencegate
//! that comes back on a new port after each restart (`set_target`).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

#[derive(Clone, Debug, Default)]
pub struct FaultConfig {
    /// Upper bound of the per-chunk delay; 0: off.
    pub delay_max_ms: u64,
    /// Probability that an answer chunk is held; 0: off.
    pub stall_p: f64,
    pub stall_ms: (u64, u64),
    /// Probability that a request chunk is held; 0: off.
    pub late_p: f64,
    pub late_ms: (u64, u64),
    /// Probability, per request chunk, of a reset (a quarter of it per
    /// answer chunk); 0: off.
    pub reset_p: f64,
}

impl FaultConfig {
    pub fn none() -> FaultConfig {
        FaultConfig::default()
    }
}

#[derive(Default, Debug)]
pub struct HopStats {
    pub connections: AtomicU64,
    pub delayed_chunks: AtomicU64,
    pub stalls: AtomicU64,
    pub late_requests: AtomicU64,
    pub resets: AtomicU64,
    /// Connections whose client went away while the hop still held
    /// request bytes (dropped, backend side reset).
    pub dropped_on_client_loss: AtomicU64,
}

impl HopStats {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "connections={} delayed_chunks={} stalls={} late_requests={} resets={} dropped_on_client_loss={}",
            g(&self.connections),
            g(&self.delayed_chunks),
            g(&self.stalls),
            g(&self.late_requests),
            g(&self.resets),
            g(&self.dropped_on_client_loss)
        )
    }
}

pub struct Hop {
    pub addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    pub stats: Arc<HopStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Hop {
    pub async fn start(target: SocketAddr, faults: FaultConfig, seed: u64) -> Hop {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let stats = Arc::new(HopStats::default());
        let (t, s) = (target.clone(), stats.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                n += 1;
                s.connections.fetch_add(1, Ordering::Relaxed);
                let to = *t.lock().unwrap();
                let rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n);
                tokio::spawn(serve(conn, to, faults.clone(), rng, s.clone()));
            }
        });
        Hop {
            addr,
            target,
            stats,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// New connections go to `t` (connections already open stay where they are).
    pub fn set_target(&self, t: SocketAddr) {
        *self.target.lock().unwrap() = t;
    }
}

impl Drop for Hop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum End {
    /// The client closed or died: drop what is held, reset the backend side.
    ClientGone,
    /// The backend closed: the client gets what was read, then a FIN.
    UpstreamGone,
    /// The reset fault.
    Reset,
}

async fn serve(
    client: TcpStream,
    target: SocketAddr,
    f: FaultConfig,
    mut rng: StdRng,
    s: Arc<HopStats>,
) {
    let Some(up) = connect_upstream(&client, target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let mut down_rng = StdRng::seed_from_u64(rng.random());
    let (cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = up.into_split();

    // The client side is read by its own task so that its going away is
    // noticed even while a chunk waits out a delay.
    let (reader, mut rx, gone_rx) = read_client(cr);
    let end = tokio::select! {
        e = forward_up(&mut rx, gone_rx, &mut uw, &f, &mut rng, &s) => e,
        e = forward_down(&mut ur, &mut cw, &f, &mut down_rng, &s) => e,
    };
    reader.abort();
    close(end, &uw, &mut cw, &s).await;
}

/// Connects to the backend within 2 s, or resets the client and gives up.
async fn connect_upstream(client: &TcpStream, target: SocketAddr) -> Option<TcpStream> {
    match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target)).await {
        Ok(Ok(up)) => Some(up),
        _ => {
            let _ = client.set_zero_linger();
            None
        }
    }
}

/// Reads the client side on its own task: its chunks come out of the
/// channel, and the watch turns true once the client has gone.
fn read_client(
    mut cr: OwnedReadHalf,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<Vec<u8>>,
    watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let (gone_tx, gone_rx) = watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = gone_tx.send(true);
    });
    (reader, rx, gone_rx)
}

/// Forwards request chunks to the backend, holding (late or delay), dropping
/// them once the client has gone, or cutting them (reset).
async fn forward_up(
    rx: &mut mpsc::UnboundedReceiver<Vec<u8>>,
    gone_rx: watch::Receiver<bool>,
    uw: &mut OwnedWriteHalf,
    f: &FaultConfig,
    rng: &mut StdRng,
    stats: &HopStats,
) -> End {
    let gone = || *gone_rx.borrow();
    let mut gone_wait = gone_rx.clone();
    while let Some(chunk) = rx.recv().await {
        let wait = if f.late_p > 0.0 && rng.random_bool(f.late_p) {
            stats.late_requests.fetch_add(1, Ordering::Relaxed);
            Some(rng.random_range(f.late_ms.0..=f.late_ms.1))
        } else if f.delay_max_ms > 0 {
            stats.delayed_chunks.fetch_add(1, Ordering::Relaxed);
            Some(rng.random_range(0..=f.delay_max_ms))
        } else {
            None
        };
        if let Some(d) = wait {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(d)) => {}
                _ = gone_wait.wait_for(|g| *g) => {}
            }
        }
        if gone() {
            stats.dropped_on_client_loss.fetch_add(1, Ordering::Relaxed);
            return End::ClientGone;
        }
        if f.reset_p > 0.0 && rng.random_bool(f.reset_p) {
            let cut = rng.random_range(0..chunk.len());
            let _ = uw.write_all(&chunk[..cut]).await;
            return End::Reset;
        }
        if uw.write_all(&chunk).await.is_err() {
            return End::UpstreamGone;
        }
    }
    End::ClientGone
}

/// Forwards answer chunks to the client, holding (stall or delay) or
/// cutting them (reset, at a quarter of the request probability).
async fn forward_down(
    ur: &mut OwnedReadHalf,
    cw: &mut OwnedWriteHalf,
    f: &FaultConfig,
    down_rng: &mut StdRng,
    s: &HopStats,
) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match ur.read(&mut buf).await {
            Ok(0) | Err(_) => return End::UpstreamGone,
            Ok(n) => n,
        };
        if f.stall_p > 0.0 && down_rng.random_bool(f.stall_p) {
            s.stalls.fetch_add(1, Ordering::Relaxed);
            let d = down_rng.random_range(f.stall_ms.0..=f.stall_ms.1);
            tokio::time::sleep(Duration::from_millis(d)).await;
        } else if f.delay_max_ms > 0 {
            s.delayed_chunks.fetch_add(1, Ordering::Relaxed);
            let d = down_rng.random_range(0..=f.delay_max_ms);
            tokio::time::sleep(Duration::from_millis(d)).await;
        }
        if f.reset_p > 0.0 && down_rng.random_bool(f.reset_p / 4.0) {
            let cut = down_rng.random_range(0..n);
            let _ = cw.write_all(&buf[..cut]).await;
            return End::Reset;
        }
        if cw.write_all(&buf[..n]).await.is_err() {
            return End::ClientGone;
        }
    }
}

/// Closes both sides as `end` says: RST both on a reset, RST the backend
/// when the client went, FIN the client when the backend closed.
async fn close(end: End, uw: &OwnedWriteHalf, cw: &mut OwnedWriteHalf, s: &HopStats) {
    match end {
        End::Reset => {
            s.resets.fetch_add(1, Ordering::Relaxed);
            let _ = uw.as_ref().set_zero_linger();
            let _ = cw.as_ref().set_zero_linger();
        }
        End::ClientGone => {
            let _ = uw.as_ref().set_zero_linger();
        }
        End::UpstreamGone => {
            let _ = cw.shutdown().await;
        }
    }
}

/// `kill -9` of `fg` and a start again on its config and data, off the
/// runtime's threads; `hop` then points at the new port, which it returns.
pub async fn kill9_behind(
    fg: &Arc<Mutex<crate::common::fencegate::Fencegate>>,
    hop: &Hop,
) -> SocketAddr {
    let fg = fg.clone();
    let addr = tokio::task::spawn_blocking(move || {
        let mut g = fg.lock().unwrap();
        g.kill9_and_restart();
        g.s3
    })
    .await
    .unwrap();
    hop.set_target(addr);
    addr
}

/// `kill -9` of fencegate at random intervals in `every_ms`, each followed
/// by a restart on the same config and data directory; `hop` is pointed at
/// the new port. Runs until `stop`; returns how many kills it made.
pub async fn kill9_loop(
    fg: Arc<Mutex<crate::common::fencegate::Fencegate>>,
    hop: Arc<Hop>,
    every_ms: (u64, u64),
    seed: u64,
    hists: Vec<Arc<super::history::History>>,
    mut stop: watch::Receiver<bool>,
) -> u32 {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6b69_6c6c);
    let mut kills = 0;
    loop {
        let wait = Duration::from_millis(rng.random_range(every_ms.0..=every_ms.1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return kills,
        }
        for h in &hists {
            h.event("kill9 fencegate".into());
        }
        let addr = kill9_behind(&fg, &hop).await;
        kills += 1;
        for h in &hists {
            h.event(format!("fencegate restarted on {addr}"));
        }
    }
}
