//! The serving threads (`server.threads`; by default one a core the
//! process may run on). Each runs a single-threaded tokio runtime and
//! serves the S3 connections the acceptor (`server::serve`) hands it, the
//! least busy thread first. A connection, its requests, and the backend
//! connections they use (the upstream pool keeps a list a thread,
//! `upstream::pool`) then stay on one thread: no work stealing, and no
//! other serving thread woken per request. With one runtime for all cores,
//! the cost per request grew with the cores (BENCHMARKS.md, "Cores").
//!
//! What blocks is handed to the blocking threads of the same runtime (each
//! serving thread's runtime has a pool of its own): a raise's fsync of
//! `fences.redb`, and on the embedded store a blob's writes and fsync and
//! a read of more than 16 KiB; a change to the store's index wakes its
//! commit thread (`store::commit`). So on the embedded store every PUT
//! wakes other threads; in front of a remote store a request that raises
//! no fence wakes none.
//!
//! What the requests share (the gate, the store, the metrics) is shared as
//! before; a log line goes to the thread's own buffer (`log_buffer`). The
//! main runtime keeps the acceptor, the admin API and the background work.
//!
//! When the acceptor is gone (dropping [`Workers`]), a thread takes no new
//! connection, and the tasks its connections left behind (a write's
//! exchange whose client left) run on until the process exits, as they did
//! on the main runtime: ending them sooner would end a write that may still
//! land at the backend, and in cluster mode delete the in-flight marker
//! that makes the next owner wait for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::mpsc;

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
    /// Set once the thread is found gone: it is never chosen again. (A
    /// mark in `load` would not stay: the places of its connections drop
    /// it.)
    gone: AtomicBool,
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

    /// Runs `job` on the thread serving the fewest connections now. A
    /// thread found gone (it cannot be, short of a bug) is passed over from
    /// then on; with none left, the job is dropped, and with it the
    /// connection.
    pub fn run(&self, job: impl FnOnce(Place) + Send + 'static) {
        let mut job: Job = Box::new(job);
        loop {
            let Some(thread) = (self.threads.iter())
                .filter(|t| !t.gone.load(Ordering::Relaxed))
                .min_by_key(|t| t.load.load(Ordering::Relaxed))
            else {
                return;
            };
            thread.load.fetch_add(1, Ordering::Relaxed);
            let place = Place(thread.load.clone());
            match thread.jobs.send((job, place)) {
                Ok(()) => return,
                Err(mpsc::error::SendError((back, _place))) => {
                    thread.gone.store(true, Ordering::Relaxed);
                    job = back;
                }
            }
        }
    }

    /// How many serving threads there are.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Connections each thread serves now.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
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
                    // The acceptor is gone: what is left runs until exit.
                    std::future::pending::<()>().await;
                });
            })?;
        Ok(Thread {
            jobs,
            load: Arc::new(AtomicUsize::new(0)),
            gone: AtomicBool::new(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

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

    /// A task a connection left behind runs on after the acceptor is
    /// gone.
    #[test]
    fn tasks_outlive_the_acceptor() {
        let workers = Workers::start(1).unwrap();
        let (tx, rx) = std_mpsc::channel();
        workers.run(move |place| {
            drop(place);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                tx.send(()).unwrap();
            });
        });
        drop(workers);
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
    }

    /// A serving thread found gone is passed over, and with none left the
    /// connection is dropped: `run` returns (it went round and round when
    /// a gone thread was marked in its load, which the dropped place took
    /// below the mark again).
    #[test]
    fn with_every_thread_gone_a_connection_is_dropped() {
        let workers = Workers::start(2).unwrap();
        // A panic ends a thread's runtime, and with it its receiver.
        for t in &workers.threads {
            let dies: Job = Box::new(|_place| panic!("a serving thread dies (this test)"));
            t.load.fetch_add(1, Ordering::Relaxed);
            t.jobs.send((dies, Place(t.load.clone()))).ok().unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !workers.threads.iter().all(|t| t.jobs.is_closed()) {
            assert!(std::time::Instant::now() < deadline, "the threads live on");
            std::thread::sleep(Duration::from_millis(10));
        }
        let workers = Arc::new(workers);
        let (done, returned) = std_mpsc::channel();
        let w = workers.clone();
        std::thread::spawn(move || {
            for _ in 0..3 {
                let (tx, rx) = std_mpsc::channel();
                w.run(move |_place| tx.send(()).unwrap());
                // The job was dropped, not run: its sender is gone unused.
                assert_eq!(rx.recv(), Err(std_mpsc::RecvError));
            }
            done.send(()).unwrap();
        });
        let ok = returned.recv_timeout(Duration::from_secs(5));
        assert!(
            ok.is_ok(),
            "Workers::run did not return with every thread gone"
        );
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
