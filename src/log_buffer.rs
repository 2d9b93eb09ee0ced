//! Where log lines go on their way to stderr: a buffer in memory that a
//! thread of its own writes out every `LINGER`, or at once when it holds
//! `HIGH` bytes. A request appends its line under a mutex (a copy of a few
//! hundred bytes) and goes on: no system call, and no thread woken per
//! line. A channel with a writer thread woken per line (tracing-appender)
//! cost about 3.5 µs of CPU per request at 20,000 requests a second, in
//! futex wake-ups and that thread's sleeps and wakes (BENCHMARKS.md, "CPU
//! per request").
//!
//! Never lossy: when stderr cannot keep up and `MAX` bytes wait, an append
//! waits for the writer instead of dropping the line. Lines appear at most
//! `LINGER` late; dropping the [`Guard`] (at the end of `main`) writes out
//! what is left. A `kill -9` loses at most the last `LINGER` of lines.
//! A leaf module.

use std::io::Write;
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
    state: Mutex<State>,
    /// The writer waits here for `LINGER`, or for `HIGH` bytes, or close.
    to_writer: Condvar,
    /// Appenders wait here while `MAX` bytes wait.
    drained: Condvar,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    closed: bool,
    /// The writer waits for a first line (and is the only wake-up an
    /// append makes, with crossing `HIGH`).
    writer_idle: bool,
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
            state: Mutex::new(State::default()),
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
        let mut st = self.shared.lock();
        while st.buf.len() >= MAX && !st.closed {
            st = (self.shared.drained)
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        let before = st.buf.len();
        st.buf.extend_from_slice(bytes);
        let crossed_high = before < HIGH && st.buf.len() >= HIGH;
        if std::mem::take(&mut st.writer_idle) || crossed_high {
            self.shared.to_writer.notify_one();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The writer thread: wait for a first line, then `LINGER` for more (or
/// `HIGH` bytes), take them all, write them outside the lock, repeat; after
/// close, write what is left and stop.
fn write_out(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let closed = {
            let mut st = shared.lock();
            while st.buf.is_empty() && !st.closed {
                st.writer_idle = true;
                st = (shared.to_writer)
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner());
            }
            st.writer_idle = false;
            if st.buf.len() < HIGH && !st.closed {
                st = (shared.to_writer)
                    .wait_timeout(st, LINGER)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            std::mem::swap(&mut st.buf, &mut spare);
            st.closed
        };
        shared.drained.notify_all();
        if !spare.is_empty() {
            // Nowhere to report a failed write to but stderr itself.
            let _ = out.write_all(&spare).and_then(|()| out.flush());
            spare.clear();
        }
        if closed && shared.lock().buf.is_empty() {
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
        self.shared.lock().closed = true;
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

    /// Four threads append 10 MB (twice `MAX`) into a slow output:
    /// every line arrives, whole and in each thread's order.
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

    /// A line is written without any further line or the guard's drop.
    #[test]
    fn a_lone_line_is_written_out() {
        let sink = Sink::default();
        let (log, _guard) = LogBuffer::start(sink.clone()).unwrap();
        log.append(b"one line\n");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.got.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.got.lock().unwrap(), b"one line\n");
    }
}
