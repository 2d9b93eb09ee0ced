//! Where log lines go on their way to stderr: buffers in memory that a
//! thread of its own writes out every `LINGER`, or at once when they hold
//! `HIGH` bytes. A request appends its line to its serving thread's own
//! buffer (`per_thread`: a copy of a few hundred bytes under a lock no
//! other serving thread takes, only the writer) and goes on, with no
//! system call. The writer is woken by the first line after it went idle,
//! and when `HIGH` bytes wait; under load it is awake, and no line wakes
//! it. What every append still shares with the other serving threads: the
//! count of bytes waiting (`waiting`, one `fetch_add` a line, on memory
//! every core writes), and the buffers' locks, which lie side by side,
//! unpadded, so that neighbouring threads' appends may write the same
//! cache line. A channel with a writer thread woken per line
//! (tracing-appender) cost about 3.5 µs of CPU per request at 20,000
//! requests a second, in futex wake-ups and that thread's sleeps and wakes
//! (docs/benchmarks-log.md, "CPU per request"); one buffer for all threads had every
//! core write the same buffer.
//!
//! Never lossy: when stderr cannot keep up and `MAX` bytes wait, an append
//! waits for the writer instead of dropping the line. Lines appear about
//! `LINGER` late (plus the time the writer takes to write out the batch
//! before theirs), each thread's in the order it appended them (lines of two
//! threads within one `LINGER` may swap); dropping the [`Guard`] (at the
//! end of `main`) writes out what is left. A `kill -9` loses the lines
//! not yet written out: about the last `LINGER` of them.

use crate::per_thread::PerThread;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a line waits in memory.
const LINGER: Duration = Duration::from_millis(20);
/// The writer is woken at once past this many bytes.
const HIGH: usize = 64 << 10;
/// Appends wait past this many bytes.
const MAX: usize = 4 << 20;

/// A handle that appends lines; cheap to clone, `Write` for `tracing`.
#[derive(Clone)]
pub struct LogBuffer {
    shared: Arc<Shared>,
}

struct Shared {
    /// A buffer a serving thread.
    bufs: PerThread<Mutex<Vec<u8>>>,
    /// Bytes in all of `bufs`.
    waiting: AtomicUsize,
    /// The writer waits for a first line (and is the only wake-up an
    /// append makes, with crossing `HIGH`). Read without `state`'s lock.
    writer_idle: AtomicBool,
    /// Whether the guard closed the buffer; the lock the two condvars
    /// wait under.
    state: Mutex<bool>,
    /// The writer waits here for `LINGER`, or for `HIGH` bytes, or close.
    to_writer: Condvar,
    /// Appenders wait here while `MAX` bytes wait.
    drained: Condvar,
}

/// Stops the writer thread, after it has written out every line.
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LogBuffer {
    /// Starts the writer thread, writing to `out`.
    pub fn start(out: impl Write + Send + 'static) -> std::io::Result<(LogBuffer, Guard)> {
        let shared = Arc::new(Shared {
            bufs: PerThread::default(),
            waiting: AtomicUsize::new(0),
            writer_idle: AtomicBool::new(false),
            state: Mutex::new(false),
            to_writer: Condvar::new(),
            drained: Condvar::new(),
        });
        let writer = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fencegate-log".into())
            .spawn(move || write_out(&writer, out))?;
        let guard = Guard {
            shared: shared.clone(),
            thread: Some(thread),
        };
        Ok((LogBuffer { shared }, guard))
    }

    /// Appends `bytes` (whole lines) for the writer.
    pub fn append(&self, bytes: &[u8]) {
        let sh = &*self.shared;
        if sh.waiting.load(Ordering::SeqCst) >= MAX {
            let mut closed = sh.lock_state();
            while sh.waiting.load(Ordering::SeqCst) >= MAX && !*closed {
                closed = sh.drained.wait(closed).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Counted under the buffer's lock: the writer, which takes the
        // buffer under it too, never subtracts bytes not yet counted.
        let before = {
            let mut buf = lock(sh.bufs.mine());
            buf.extend_from_slice(bytes);
            sh.waiting.fetch_add(bytes.len(), Ordering::SeqCst)
        };
        let crossed_high = before < HIGH && before + bytes.len() >= HIGH;
        // SeqCst with the writer's store of `writer_idle` before it looks
        // at `waiting`: either it sees these bytes, or this sees it idle.
        if crossed_high || sh.writer_idle.load(Ordering::SeqCst) {
            let _state = sh.lock_state();
            sh.writer_idle.store(false, Ordering::SeqCst);
            sh.to_writer.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn lock_state(&self) -> MutexGuard<'_, bool> {
        lock(&self.state)
    }

    /// Moves every buffer's lines to the end of `out`.
    fn take_all(&self, out: &mut Vec<u8>) {
        for buf in self.bufs.all() {
            let mut buf = lock(buf);
            out.extend_from_slice(&buf);
            // Under the lock, as the appenders count what they add.
            self.waiting.fetch_sub(buf.len(), Ordering::SeqCst);
            buf.clear();
        }
    }
}

/// The writer thread: wait for a first line, then `LINGER` for more (or
/// `HIGH` bytes), take them all, write them, repeat; after close, write
/// what is left and stop.
fn write_out(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let closed = {
            let mut closed = shared.lock_state();
            // Idle until a first line: `writer_idle` is set before
            // `waiting` is looked at (see `append`).
            loop {
                shared.writer_idle.store(true, Ordering::SeqCst);
                if *closed || shared.waiting.load(Ordering::SeqCst) != 0 {
                    break;
                }
                closed = (shared.to_writer)
                    .wait(closed)
                    .unwrap_or_else(|p| p.into_inner());
            }
            shared.writer_idle.store(false, Ordering::SeqCst);
            if shared.waiting.load(Ordering::SeqCst) < HIGH && !*closed {
                closed = (shared.to_writer)
                    .wait_timeout(closed, LINGER)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *closed
        };
        shared.take_all(&mut spare);
        // Under the lock, so an appender that saw `MAX` is already waiting.
        drop(shared.lock_state());
        shared.drained.notify_all();
        if !spare.is_empty() {
            // Nowhere to report a failed write to but stderr itself.
            let _ = out.write_all(&spare).and_then(|()| out.flush());
            spare.clear();
        }
        if closed && shared.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
    }
}

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.append(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        *self.shared.lock_state() = true;
        self.shared.to_writer.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that keeps what it is given, slowly when asked to.
    #[derive(Clone, Default)]
    struct Sink {
        got: Arc<Mutex<Vec<u8>>>,
        slow: bool,
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.slow {
                std::thread::sleep(Duration::from_millis(1));
            }
            // A short write, as a pipe may make: the caller must go on.
            // At 10 kB a millisecond the output falls behind.
            let n = b.len().min(10_000);
            self.got.lock().unwrap().extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Four threads, each with a buffer of its own as serving threads
    /// have, append 9 MB (about twice `MAX`) into a slow output: every line
    /// arrives, whole and in each thread's order.
    #[test]
    fn nothing_is_lost_or_torn_when_the_output_is_slow() {
        let sink = Sink {
            slow: true,
            ..Sink::default()
        };
        let (log, guard) = LogBuffer::start(sink.clone()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    crate::per_thread::set(t + 1);
                    for i in 0..25_000 {
                        let line = format!("{t} {i:06} {}\n", "x".repeat(80));
                        log.append(line.as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let got = String::from_utf8(sink.got.lock().unwrap().clone()).unwrap();
        let mut next = [0usize; 4];
        for line in got.lines() {
            let mut f = line.split(' ');
            let t: usize = f.next().unwrap().parse().unwrap();
            let i: usize = f.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}");
            assert_eq!(f.next().unwrap().len(), 80);
            next[t] += 1;
        }
        assert_eq!(next, [25_000; 4]);
    }

    /// A line is written without any further line or the guard's drop,
    /// from a serving thread's buffer as from another thread's.
    #[test]
    fn a_lone_line_is_written_out() {
        let sink = Sink::default();
        let (log, _guard) = LogBuffer::start(sink.clone()).unwrap();
        // The writer is waiting for a first line by now: the append must
        // wake it.
        std::thread::sleep(Duration::from_millis(100));
        log.append(b"one line\n");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.got.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.got.lock().unwrap(), b"one line\n");
        let log = log.clone();
        std::thread::spawn(move || {
            crate::per_thread::set(3);
            log.append(b"another\n");
        });
        while sink.got.lock().unwrap().len() < 17 {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.got.lock().unwrap(), b"one line\nanother\n");
    }
}
