//! The serving threads (`server.threads`; by default one a core the
//! process may run on). Each runs a single-threaded tokio runtime and
//! serves the S3 connections the acceptor (`server::serve`) hands it, the
//! least busy thread first. A connection, its requests, and the backend
//! connections they use (the upstream pool keeps a list a thread,
//! `upstream::pool`) then stay on one thread: no work stealing, and no
//! other thread woken per request. With one runtime for all cores, both
//! grew with the cores (BENCHMARKS.md, "Cores").
//!
//! What the requests share (the gate, the store, the metrics, the log) is
//! shared as before; only where their tasks run changes. The main runtime
//! keeps the acceptor, the admin API and the background work.
//!
//! A serving thread ends when the acceptor is gone and its tasks have
//! ended (a write's exchange that outlives its client among them), or
//! after [`DRAIN`] at most.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The longest a serving thread waits for its tasks once the acceptor is
/// gone.
pub const DRAIN: Duration = Duration::from_secs(30);

/// Work for a serving thread: run inside its runtime (where it spawns the
/// connection's task), with the connection's [`Place`].
type Job = Box<dyn FnOnce(Place) + Send>;

/// The serving threads.
pub struct Workers {
    threads: Vec<Thread>,
}

struct Thread {
    jobs: mpsc::UnboundedSender<(Job, Place)>,
    /// Connections it serves now.
    load: Arc<AtomicUsize>,
}

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

    /// Runs `job` on the thread serving the fewest connections now.
    pub fn run(&self, job: impl FnOnce(Place) + Send + 'static) {
        let thread = self
            .threads
            .iter()
            .min_by_key(|t| t.load.load(Ordering::Relaxed))
            .expect("at least one serving thread");
        thread.load.fetch_add(1, Ordering::Relaxed);
        let place = Place(thread.load.clone());
        // A thread that is gone drops the job, and with it the connection.
        let _ = thread.jobs.send((Box::new(job), place));
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
        std::thread::Builder::new()
            .name(format!("fencegate-serve-{i}"))
            .spawn(move || {
                crate::per_thread::set(i + 1);
                runtime.block_on(async {
                    while let Some((job, place)) = rx.recv().await {
                        job(place);
                    }
                    drain().await;
                });
            })?;
        Ok(Thread {
            jobs,
            load: Arc::new(AtomicUsize::new(0)),
        })
    }
}

/// Until this thread's runtime has no task left, or [`DRAIN`] has passed.
async fn drain() {
    let runtime = tokio::runtime::Handle::current();
    let deadline = Instant::now() + DRAIN;
    while runtime.metrics().num_alive_tasks() > 0 && Instant::now() < deadline {
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
