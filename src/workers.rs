//! The serving threads (`server.threads`; by default one a core the
//! process may run on). Each runs a single-threaded tokio runtime and
//! serves the S3 connections the acceptor (`server::serve`) hands it, the
//! least busy thread first. A connection, its requests, and the backend
//! connections they use (the upstream pool keeps a list a thread,
//! `upstream::pool`) then stay on one thread: no work stealing, and no
//! other thread woken per request. With one runtime for all cores, the
//! cost per request grew with the cores (BENCHMARKS.md, "Cores").
//!
//! What the requests share (the gate, the store, the metrics) is shared as
//! before; a log line goes to the thread's own buffer (`log_buffer`). The
//! main runtime keeps the acceptor, the admin API and the background work.
//!
//! [`Workers::shutdown`] stops them: each thread waits for its connections
//! to end ([`DRAIN`] at most), then its runtime ends, after the blocking
//! work it started (a fence table write, a blob fsync) and before the
//! process exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The longest a serving thread waits for its connections once the
/// acceptor is gone: `server::serve` has waited for them already (30 s at
/// most), so this is only for their last steps, or to cut those that
/// outlived that wait.
pub const DRAIN: Duration = Duration::from_secs(1);

/// Work for a serving thread: run inside its runtime (where it spawns the
/// connection's task), with the connection's [`Place`].
type Job = Box<dyn FnOnce(Place) + Send>;

/// The serving threads.
pub struct Workers {
    threads: Vec<Thread>,
}

struct Thread {
    jobs: mpsc::UnboundedSender<(Job, Place)>,
    /// Connections it serves now ([`GONE`] once it is found gone).
    load: Arc<AtomicUsize>,
    handle: JoinHandle<()>,
}

/// The load of a thread that is gone: never the least.
const GONE: usize = usize::MAX / 2;

/// A connection's place on its serving thread: it counts in the thread's
/// load until dropped, with the connection.
pub struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How many serving threads `server.threads` asks for: 0 is one a core the
/// process may run on (its CPU affinity and cgroup quota counted).
pub fn count(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl Workers {
    /// Starts `n` serving threads (at least one).
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let threads = (0..n.max(1)).map(Thread::start).collect::<Result<_, _>>()?;
        Ok(Workers { threads })
    }

    /// Runs `job` on the thread serving the fewest connections now. A
    /// thread found gone (it cannot be, short of a bug) is passed over from
    /// then on; with none left, the job is dropped, and with it the
    /// connection.
    pub fn run(&self, job: impl FnOnce(Place) + Send + 'static) {
        let mut job: Job = Box::new(job);
        loop {
            let thread = self
                .threads
                .iter()
                .min_by_key(|t| t.load.load(Ordering::Relaxed))
                .expect("at least one serving thread");
            if thread.load.fetch_add(1, Ordering::Relaxed) >= GONE {
                return;
            }
            let place = Place(thread.load.clone());
            match thread.jobs.send((job, place)) {
                Ok(()) => return,
                Err(mpsc::error::SendError((back, place))) => {
                    thread.load.store(GONE, Ordering::Relaxed);
                    drop(place);
                    job = back;
                }
            }
        }
    }

    /// Stops taking connections, and returns once every thread has ended:
    /// its connections closed (or [`DRAIN`] passed) and its blocking work
    /// done. Blocks the calling thread.
    pub fn shutdown(self) {
        let handles: Vec<_> = self.threads.into_iter().map(|t| t.handle).collect();
        for handle in handles {
            let _ = handle.join();
        }
    }

    /// How many serving threads there are.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Connections each thread serves now.
    pub fn loads(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.load.load(Ordering::Relaxed))
            .collect()
    }
}

impl Thread {
    fn start(i: usize) -> std::io::Result<Thread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (jobs, mut rx) = mpsc::unbounded_channel::<(Job, Place)>();
        let load = Arc::new(AtomicUsize::new(0));
        let connections = load.clone();
        let handle = std::thread::Builder::new()
            .name(format!("fencegate-serve-{i}"))
            .spawn(move || {
                crate::per_thread::set(i + 1);
                runtime.block_on(async {
                    while let Some((job, place)) = rx.recv().await {
                        job(place);
                    }
                    drain(&connections).await;
                });
                // Dropping the runtime ends its tasks (kept backend
                // connections among them) and waits for its blocking work.
                drop(runtime);
            })?;
        Ok(Thread { jobs, load, handle })
    }
}

/// Until the thread serves no connection, or [`DRAIN`] has passed.
async fn drain(connections: &AtomicUsize) {
    let deadline = Instant::now() + DRAIN;
    while connections.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc as std_mpsc;

    #[test]
    fn a_connection_goes_to_the_least_busy_thread() {
        let workers = Workers::start(3).unwrap();
        let (tx, rx) = std_mpsc::channel();
        let mut places = Vec::new();
        for _ in 0..6 {
            let tx = tx.clone();
            workers.run(move |place| {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((name, place)).unwrap();
            });
            places.push(rx.recv().unwrap());
        }
        assert_eq!(workers.loads(), vec![2, 2, 2]);
        let mut names: Vec<_> = places.iter().map(|(n, _)| n.clone().unwrap()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 3, "{names:?}");
        // A connection that ends leaves its thread's load.
        places.truncate(3);
        assert_eq!(workers.loads().iter().sum::<usize>(), 3);
    }

    /// Shutdown returns once the connections have ended and the blocking
    /// work they started is done.
    #[test]
    fn shutdown_waits_for_connections_and_blocking_work() {
        let workers = Workers::start(2).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let seen = done.clone();
        workers.run(move |place| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tokio::task::spawn_blocking(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    seen.store(1, Ordering::SeqCst);
                });
                drop(place);
            });
        });
        workers.shutdown();
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_job_spawns_on_its_own_thread() {
        let workers = Workers::start(1).unwrap();
        let (tx, rx) = std_mpsc::channel();
        workers.run(move |place| {
            let here = std::thread::current().id();
            tokio::spawn(async move {
                tx.send(here == std::thread::current().id()).unwrap();
                drop(place);
            });
        });
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
    }
}
