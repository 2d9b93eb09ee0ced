//! The one loop of every lock watch eager fencing runs: connect, report the
//! watch up, follow the lock until the watch breaks, log why, report it
//! down, back off, and again.
//!
//! Each service says only how it connects and how it follows, as a
//! [`Watch`] in its own file (etcd's watch, ZooKeeper's watches, Redis'
//! keyspace notifications, PostgreSQL's polls of `pg_locks`). The pacing
//! (one [`Backoff`], reset when the watch is up) and the log line (a
//! warning naming the service, the lock and the reason, logged when the
//! watch goes down and again whenever the reason changes while it stays
//! down) are here, the same for all four.

use super::{Backoff, LockError, Seen};
use std::time::Duration;

/// Where a watch reports what it sees.
pub(crate) type Report<'a> = &'a (dyn Fn(Seen) + Sync);

/// Why a watch is down, and when to try again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Broken {
    pub why: String,
    /// A steady pause instead of the backoff's next one, for what only a
    /// person can fix (a server setting), checked again at a steady pace.
    pub again_in: Option<Duration>,
}

impl Broken {
    pub fn new(why: impl Into<String>) -> Broken {
        Broken {
            why: why.into(),
            again_in: None,
        }
    }

    pub fn again_in(self, pause: Duration) -> Broken {
        Broken {
            again_in: Some(pause),
            ..self
        }
    }
}

impl From<LockError> for Broken {
    fn from(e: LockError) -> Broken {
        match e {
            LockError::Service(why) => Broken::new(why),
            e => Broken::new(e.to_string()),
        }
    }
}

/// One lock service's way of watching who holds one lock.
pub(crate) trait Watch {
    /// The service, in logs (`etcd`, `zookeeper`, `redis`, `postgres`).
    const SERVICE: &'static str;
    /// A connection with the watch set up on it.
    type Session;

    /// The lock, in logs.
    fn lock(&self) -> &str;

    /// Connects and sets the watch up, reading the lock afresh where the
    /// service needs it. A holder that changed while the watch was down is
    /// reported as a raise: here (etcd), or by `follow`'s first reading
    /// (ZooKeeper, PostgreSQL). `Ok` means the watch is up.
    async fn connect(&mut self, seen: Report<'_>) -> Result<Self::Session, Broken>;

    /// Follows the lock, reporting each raise, until the watch breaks. A
    /// service whose client reconnects by itself (ZooKeeper, within its
    /// session) also reports the watch going blind and back meanwhile.
    async fn follow(&mut self, session: Self::Session, seen: Report<'_>) -> Broken;
}

/// Runs `watch` for good, reporting to `seen`: `Up` each time it is set up,
/// what it follows, and `Down` each time it breaks or cannot be set up.
pub(crate) async fn run<W: Watch>(mut watch: W, seen: impl Fn(Seen) + Sync) {
    let seen: Report = &seen;
    let mut backoff = Backoff::new();
    let mut outage = Outage::default();
    loop {
        let broken = match watch.connect(seen).await {
            Ok(session) => {
                seen(Seen::Up);
                backoff.reset();
                outage.over();
                watch.follow(session, seen).await
            }
            Err(broken) => broken,
        };
        if outage.is_new(&broken.why) {
            tracing::warn!(service = %W::SERVICE, lock = %watch.lock(), reason = %broken.why,
                "eager fencing: the lock watch is down");
        }
        seen(Seen::Down);
        match broken.again_in {
            Some(pause) => tokio::time::sleep(pause).await,
            None => backoff.wait().await,
        }
    }
}

/// The reasons of one outage, so that each is logged once, not at every
/// retry.
#[derive(Default)]
struct Outage {
    last: Option<String>,
}

impl Outage {
    /// True if `why` is not the reason last logged in this outage.
    fn is_new(&mut self, why: &str) -> bool {
        if self.last.as_deref() == Some(why) {
            return false;
        }
        self.last = Some(why.to_string());
        true
    }

    /// The watch is up: the next reason is logged even if it is the last.
    fn over(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn each_reason_is_logged_once_per_outage() {
        let mut o = Outage::default();
        assert!(o.is_new("refused"));
        assert!(!o.is_new("refused"), "a retry with the same reason");
        assert!(o.is_new("timed out"), "a new reason");
        assert!(o.is_new("refused"), "the reason changed back");
        o.over();
        assert!(o.is_new("refused"), "a new outage");
    }

    /// Connects as `script` says, one step a try (`Err` names the reason,
    /// "unset" asks for the steady pause), then waits on a connection for
    /// good. Following raises once and breaks.
    struct Fake {
        script: std::collections::VecDeque<Result<(), &'static str>>,
    }

    impl Watch for Fake {
        const SERVICE: &'static str = "fake";
        type Session = u64;

        fn lock(&self) -> &str {
            "orders"
        }

        async fn connect(&mut self, _: Report<'_>) -> Result<u64, Broken> {
            match self.script.pop_front() {
                None => std::future::pending().await,
                Some(Ok(())) => Ok(7),
                Some(Err("unset")) => Err(Broken::new("unset").again_in(Duration::from_secs(2))),
                Some(Err(why)) => Err(Broken::new(why)),
            }
        }

        async fn follow(&mut self, token: u64, seen: Report<'_>) -> Broken {
            seen(Seen::Raise {
                token,
                why: "gone".into(),
            });
            Broken::new("closed")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_doubles_while_down_and_starts_over_once_up() {
        let log = Mutex::new(Vec::new());
        let start = tokio::time::Instant::now();
        let seen = |s: Seen| log.lock().unwrap().push((s, start.elapsed().as_millis()));
        let script = [Err("refused"), Err("refused"), Ok(()), Err("unset")];
        let fake = Fake {
            script: script.into_iter().chain([Err("refused"); 2]).collect(),
        };
        let ran = tokio::time::timeout(Duration::from_secs(60), run(fake, seen)).await;
        assert!(ran.is_err(), "the loop runs for good");
        let raise = Seen::Raise {
            token: 7,
            why: "gone".into(),
        };
        use Seen::{Down, Up};
        assert_eq!(
            log.into_inner().unwrap(),
            vec![
                // Down at once, again after 100 ms, up after 200 more.
                (Down, 0),
                (Down, 100),
                (Up, 300),
                (raise, 300),
                (Down, 300),
                // Up reset the backoff: 100 ms. The steady pause (2 s)
                // leaves the backoff where it was: 200 ms, then 400.
                (Down, 400),
                (Down, 2400),
                (Down, 2600),
            ]
        );
    }
}
