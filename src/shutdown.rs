//! Graceful shutdown of the S3 and admin connections. [`Shutdown`] is what
//! `server` fires when fencegate is told to stop; each connection is served
//! inside a [`Stopping`], which then asks hyper to close it after the
//! request in flight, and `Shutdown::wait` returns when every connection
//! has closed.
//!
//! It does what hyper-util's `GracefulShutdown` does, with one difference
//! that every request pays for: that one polls its signal (a tokio `watch`
//! receiver, whose poll takes a lock) at every poll of the connection, two
//! or three a request. A `Stopping` polls the signal only after the signal
//! woke it (docs/benchmarks-log.md, "Below the signature floor").

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio::sync::watch;

/// The signal. Its watch channel counts the watchers still alive: those
/// watching a connection, and those not yet watching (a connection queued
/// for its serving thread, or in its TLS handshake).
pub struct Shutdown {
    tx: watch::Sender<()>,
}

/// A connection hyper can be asked to close after its request in flight.
pub trait Closable: Future {
    fn close_when_idle(self: Pin<&mut Self>);
}

impl<I, S, B> Closable for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn close_when_idle(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// A connection's end of the signal, to be taken to where it is served.
pub struct Watcher {
    rx: watch::Receiver<()>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            tx: watch::channel(()).0,
        }
    }
}

impl Shutdown {
    pub fn watcher(&self) -> Watcher {
        Watcher {
            rx: self.tx.subscribe(),
        }
    }

    /// Fires the signal, and returns once every watched connection has
    /// closed (and every watcher not yet watching is dropped).
    pub async fn wait(self) {
        let _ = self.tx.send(());
        self.tx.closed().await;
    }
}

type Signal = Pin<Box<dyn Future<Output = watch::Receiver<()>> + Send>>;

impl Watcher {
    /// `conn`, closed when idle once the signal fires.
    pub fn watch<C: Closable>(self, conn: C) -> Stopping<C> {
        let mut rx = self.rx;
        let woke = Arc::new(Woke {
            since_poll: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Stopping {
            conn: Box::pin(conn),
            signal: Some(Box::pin(async move {
                let _ = rx.changed().await;
                rx
            })),
            kept: None,
            signal_waker: Waker::from(woke.clone()),
            woke,
            registered: None,
        }
    }
}

/// Whether the signal woke the connection's task since it was last
/// polled, and that task's waker.
struct Woke {
    /// Starts true: the signal is polled once, to register.
    since_poll: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Woke {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.since_poll.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().expect("never poisoned").as_ref() {
            task.wake_by_ref();
        }
    }
}

/// A connection being served, and the signal that closes it.
pub struct Stopping<C> {
    conn: Pin<Box<C>>,
    signal: Option<Signal>,
    /// The receiver, once the signal came: held until the connection ends,
    /// so that `Shutdown::wait` waits for it.
    kept: Option<watch::Receiver<()>>,
    signal_waker: Waker,
    woke: Arc<Woke>,
    /// The task waker last handed to `woke`, compared without its lock.
    registered: Option<Waker>,
}

impl<C: Closable> Future for Stopping<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        if let Some(signal) = this.signal.as_mut() {
            if !this
                .registered
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                *this.woke.task.lock().expect("never poisoned") = Some(cx.waker().clone());
                this.registered = Some(cx.waker().clone());
            }
            if this.woke.since_poll.swap(false, Ordering::AcqRel) {
                let mut signal_cx = Context::from_waker(&this.signal_waker);
                if let Poll::Ready(rx) = signal.as_mut().poll(&mut signal_cx) {
                    this.kept = Some(rx);
                    this.signal = None;
                    this.conn.as_mut().close_when_idle();
                }
            }
        }
        this.conn.as_mut().poll(cx)
    }
}
