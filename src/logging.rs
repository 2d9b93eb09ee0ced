//! Where log lines go: stderr, written in batches by a thread of its own.
//!
//! fencegate writes one line per request. Writing each with its own
//! `write(2)` costs a system call per request; a channel per line (as
//! `tracing-appender` does) costs a wake-up and, measured, a spinning
//! receiver. Here a request appends its line to a shared buffer under a
//! short lock; the first line into an empty buffer wakes the writer thread,
//! which waits [`BATCH_DELAY`] for more, swaps the buffer out and writes it
//! with one call. Idle, the thread sleeps; loaded, it writes about
//! `1 / BATCH_DELAY` times a second.
//!
//! Never lossy: past [`MAX_PENDING`] bytes (stderr not keeping up), a
//! request waits until the writer has taken the buffer. What is lost on
//! `kill -9` is at most the last [`BATCH_DELAY`] of lines; [`LogGuard`]
//! writes out what is pending when it is dropped (a normal exit).

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long the writer waits after the first line of a batch.
pub const BATCH_DELAY: Duration = Duration::from_millis(20);
/// Pending bytes beyond which requests wait for the writer.
pub const MAX_PENDING: usize = 8 << 20;

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Signalled when the buffer gets its first bytes, or is closed.
    filled: Condvar,
    /// Signalled when the writer has taken the buffer.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The writer side handed to `tracing_subscriber` (one per event).
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Stops the writer thread and writes out what is pending, when dropped.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A batching writer to `out`, and the guard that flushes it.
pub fn batched(out: impl Write + Send + 'static) -> (BatchWriter, LogGuard) {
    let shared = Arc::new(Shared::default());
    let theirs = shared.clone();
    let thread = std::thread::Builder::new()
        .name("fencegate-log".into())
        .spawn(move || write_batches(&theirs, out))
        .expect("spawn the log writer thread");
    let writer = BatchWriter {
        shared: shared.clone(),
    };
    let guard = LogGuard {
        shared,
        thread: Some(thread),
    };
    (writer, guard)
}

fn write_batches(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let mut p = shared.lock();
        while p.buf.is_empty() && !p.closed {
            p = shared.filled.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if !p.closed {
            // Let the batch grow.
            drop(p);
            std::thread::sleep(BATCH_DELAY);
            p = shared.lock();
        }
        std::mem::swap(&mut p.buf, &mut spare);
        let closed = p.closed;
        drop(p);
        shared.drained.notify_all();
        // A failed write has nowhere to be reported: the line is dropped.
        let _ = out.write_all(&spare).and_then(|()| out.flush());
        spare.clear();
        if closed {
            return;
        }
    }
}

impl Write for BatchWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut p = self.shared.lock();
        while p.buf.len() >= MAX_PENDING && !p.closed {
            p = self
                .shared
                .drained
                .wait(p)
                .unwrap_or_else(|e| e.into_inner());
        }
        let was_empty = p.buf.is_empty();
        p.buf.extend_from_slice(line);
        drop(p);
        if was_empty {
            self.shared.filled.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = BatchWriter;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.filled.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` whose bytes and write calls the test can read.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(b);
            s.1 += 1;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_whole_in_order_in_few_writes_and_all_by_the_guard() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        w.write_all(format!("t{t} line {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let (bytes, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("t{t} ")))
                .collect();
            let want: Vec<String> = (0..2000).map(|i| format!("t{t} line {i}")).collect();
            assert_eq!(mine, want, "every line of thread {t}, in order, none torn");
        }
        assert!(writes < 8000, "{writes} writes for 8000 lines");
    }

    #[test]
    fn a_line_is_written_soon_without_more_lines_or_a_flush() {
        let sink = Sink::default();
        let (mut writer, _guard) = batched(sink.clone());
        writer.write_all(b"alone\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink.0.lock().unwrap().0.is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sink.0.lock().unwrap().0, b"alone\n");
    }
}
