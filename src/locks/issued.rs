//! The locks of verified resources (`[[eager]] verify = true`; CONTRACT
//! §7): whether a token that would raise a resource's fence is its lock
//! holder's (`fence::issued`). The lock's watch (eager fencing) says who
//! holds it; when it knows no holder, or the token is above the holder it
//! knows (a new holder may write before its watch event arrives), the
//! service is asked: one round trip per lock handoff, none per write.
//!
//! The watch also notices a holder whose token is below its resource's
//! fence: the service's tokens went back (a Redis restarted without
//! persistence, a sequence set back, a restored etcd or ZooKeeper). That is
//! logged once as an error, shown on `/readyz` and as
//! `fencegate_lock_tokens_behind`, until the holder's token is at the fence
//! again (docs/lock-services.md, "When the tokens go back").

use crate::config::access::AccessConfig;
use crate::config::locks::{EagerConfig, LockRef, LocksConfig};
use crate::fence::issued::{Behind, Issuers, Whose};
use crate::metric_names as m;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What is known of a lock holder's token. ZooKeeper, Redis and
/// PostgreSQL keep it (`exact`); etcd keeps a holder's key, whose token
/// (`ETCD_LOCK_REV`, the revision at which its Lock call returned) is at
/// least the revision at which the key became the lowest, and at most
/// etcd's revision now: exact only where `fencegate lock` wrote its token
/// into its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The token, or (not `exact`) the least it can be.
    pub token: u64,
    pub exact: bool,
    /// Not `exact`: the most it can be, where the reading says.
    pub ceiling: Option<u64>,
}

impl Holding {
    pub fn exact(token: u64) -> Holding {
        Holding {
            token,
            exact: true,
            ceiling: None,
        }
    }
}

/// What a lock's watch last said of its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// The watch is down, or has said nothing yet.
    Unknown,
    /// Nobody holds it (or its token is not known yet).
    Free,
    /// Its holder has this token.
    Taken(Holding),
}

/// How a lock's service is asked who holds it, with the connection kept
/// between asks (dropped on an error).
enum Asker {
    Etcd {
        endpoints: Vec<String>,
        access: AccessConfig,
        name: String,
        client: tokio::sync::Mutex<Option<Box<etcd_client::Client>>>,
    },
    Redis {
        url: String,
        access: AccessConfig,
        name: String,
        conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    },
    Postgres {
        url: String,
        access: AccessConfig,
        name: String,
        sequence: String,
        client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    },
    ZooKeeper {
        servers: String,
        access: AccessConfig,
        session: Duration,
        path: String,
        client: tokio::sync::Mutex<Option<zookeeper_client::Client>>,
    },
}

/// How long one ask may take before the raise is refused `503`.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

impl Asker {
    fn of(locks: &LocksConfig, lock: &LockRef) -> Asker {
        match lock.clone() {
            LockRef::Etcd(name) => Asker::Etcd {
                endpoints: locks.etcd_endpoints.clone(),
                access: locks.etcd_access.clone(),
                name,
                client: Default::default(),
            },
            LockRef::Redis(name) => Asker::Redis {
                url: locks.redis.clone().unwrap_or_default(),
                access: locks.redis_access.clone(),
                name,
                conn: Default::default(),
            },
            LockRef::Postgres(name) => Asker::Postgres {
                url: locks.postgres.clone().unwrap_or_default(),
                access: locks.postgres_access.clone(),
                name,
                sequence: locks.postgres_sequence.clone(),
                client: Default::default(),
            },
            LockRef::ZooKeeper(path) => Asker::ZooKeeper {
                servers: locks.zookeeper.clone().unwrap_or_default(),
                access: locks.zookeeper_access.clone(),
                session: locks.zookeeper_session_timeout(),
                path,
                client: Default::default(),
            },
        }
    }

    /// The holder's token now, asked of the service.
    async fn holder(&self) -> Result<Option<Holding>, String> {
        match tokio::time::timeout(ASK_TIMEOUT, self.ask()).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} ms", ASK_TIMEOUT.as_millis())),
        }
    }

    async fn ask(&self) -> Result<Option<Holding>, String> {
        // One shape for the four: take the kept connection (or make one),
        // ask, keep it only if the ask worked.
        macro_rules! asked {
            ($slot:expr, $connect:expr, |$c:ident| $ask:expr) => {{
                let mut slot = $slot.lock().await;
                #[allow(unused_mut)]
                let mut $c = match slot.take() {
                    Some(c) => c,
                    None => $connect.await?,
                };
                let r = $ask;
                if r.is_ok() {
                    *slot = Some($c);
                }
                r
            }};
        }
        match self {
            Asker::Etcd {
                endpoints,
                access,
                name,
                client,
            } => {
                let connect = async {
                    super::etcd::client_for(endpoints, access)
                        .await
                        .map(Box::new)
                };
                asked!(client, connect, |c| super::etcd::holder_now(&mut c, name)
                    .await)
            }
            Asker::Redis {
                url,
                access,
                name,
                conn,
            } => asked!(conn, super::redis::connection_for(url, access), |c| {
                super::redis::holder_now(&mut c, name).await
            }),
            Asker::Postgres {
                url,
                access,
                name,
                sequence,
                client,
            } => {
                let connect = async {
                    super::postgres::client_for(url, access)
                        .await
                        .map(|(c, _)| c)
                };
                asked!(client, connect, |c| {
                    super::postgres::holder_now(&c, name, sequence).await
                })
            }
            Asker::ZooKeeper {
                servers,
                access,
                session,
                path,
                client,
            } => asked!(
                client,
                super::zookeeper::client_for(servers, access, *session),
                |c| { super::zookeeper::holder_now(&c, path).await }
            ),
        }
    }
}

/// One verified resource's lock.
pub struct Followed {
    resource: String,
    lock: String,
    lock_ref: LockRef,
    view: Mutex<View>,
    asker: Asker,
    behind: Mutex<Option<Behind>>,
}

impl Followed {
    /// What the watch says (`Seen::Up`, `Down`, `Holder`).
    pub(super) fn watch_down(&self) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = View::Unknown;
    }

    pub(super) fn holder_seen(&self, holding: Option<Holding>) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = match holding {
            Some(h) => View::Taken(h),
            None => View::Free,
        };
    }

    /// The holder's token `holder` against the resource's `fence`: below
    /// it, the service's tokens went back (said once, and kept for
    /// `/readyz` and the metric until the holder is at the fence again).
    pub(super) fn compare(&self, holder: Option<Holding>, fence: Option<u64>) {
        // The holder's token is at least `token`; exact or not, a ceiling
        // below the fence is below it too.
        let most = holder.map(|h| match h.exact {
            true => h.token,
            false => h.ceiling.unwrap_or(u64::MAX),
        });
        let now = match (holder, most, fence) {
            (Some(h), Some(m), Some(f)) if m < f => Some(Behind {
                resource: self.resource.clone(),
                lock: self.lock.clone(),
                holder: h.token,
                fence: f,
            }),
            _ => None,
        };
        let mut behind = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        if *behind == now {
            return;
        }
        if let Some(old) = behind.take() {
            gauge(&old, 0.0);
        }
        if let Some(b) = &now {
            gauge(b, 1.0);
            tracing::error!(
                resource = %b.resource,
                lock = %b.lock,
                holder = b.holder,
                fence = b.fence,
                "the lock's holder has a token below the resource's fence: the lock service's \
                 tokens went back (restarted without persistence, restored from a backup, \
                 rebuilt). Its holders are refused until its tokens are above the fence again: \
                 bump the service past {} (docs/lock-services.md, \"When the tokens go back\")",
                b.fence
            );
        }
        *behind = now;
    }
}

fn gauge(b: &Behind, v: f64) {
    metrics::gauge!(
        m::LOCK_TOKENS_BEHIND,
        "resource" => b.resource.clone(),
        "lock" => b.lock.clone(),
        "holder" => b.holder.to_string(),
        "fence" => b.fence.to_string()
    )
    .set(v);
}

/// The verified resources of the `[[eager]]` entries, by resource.
pub struct Holders {
    by_resource: HashMap<String, Arc<Followed>>,
}

impl Holders {
    /// The entries with `verify = true`; `None` when there are none.
    pub fn of(locks: &LocksConfig, eager: &[EagerConfig]) -> Option<Holders> {
        let by_resource: HashMap<String, Arc<Followed>> = eager
            .iter()
            .filter(|e| e.verify)
            .map(|e| {
                let lock = e.lock();
                let followed = Followed {
                    resource: e.resource.clone(),
                    lock: lock.to_string(),
                    lock_ref: lock.clone(),
                    view: Mutex::new(View::Unknown),
                    asker: Asker::of(locks, &lock),
                    behind: Mutex::new(None),
                };
                (e.resource.clone(), Arc::new(followed))
            })
            .collect();
        (!by_resource.is_empty()).then_some(Holders { by_resource })
    }

    /// The lock `resource` follows, for its watch to report to.
    pub fn followed(&self, resource: &str) -> Option<Arc<Followed>> {
        self.by_resource.get(resource).cloned()
    }
}

/// Whether `lock` (as a credential names it) is `l`: its name, or a
/// holder's key in it (an etcd key or ZooKeeper node under the name).
fn names(l: &LockRef, lock: &str) -> bool {
    match l {
        LockRef::Etcd(n) | LockRef::ZooKeeper(n) => {
            lock == n
                || lock
                    .strip_prefix(n.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        }
        LockRef::Redis(n) | LockRef::Postgres(n) => lock == n,
    }
}

/// `token` against what is known of the holder's; `None`: it is above
/// the least the holder's can be, with no reading of the most.
fn against(token: u64, holder: Option<Holding>) -> Option<Whose> {
    let Some(h) = holder else {
        return Some(Whose::NotIssued { holder: None });
    };
    let most = match h.exact {
        true => Some(h.token),
        false => h.ceiling,
    };
    Some(match (token.cmp(&h.token), most) {
        (std::cmp::Ordering::Less, _) => Whose::Earlier { holder: h.token },
        (_, Some(m)) if token > m => Whose::NotIssued {
            holder: Some(h.token),
        },
        (_, Some(_)) => Whose::Holder,
        (_, None) => return None,
    })
}

impl Issuers for Holders {
    fn lock_of(&self, resource: &str) -> Option<&str> {
        self.by_resource.get(resource).map(|f| f.lock.as_str())
    }

    fn check<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<Whose, String>> {
        Box::pin(async move {
            let Some(f) = self.by_resource.get(resource) else {
                return Ok(Whose::Holder);
            };
            let view = *f.view.lock().unwrap_or_else(|p| p.into_inner());
            // What the watch knows settles the holder's token and an
            // earlier one; anything above may be a holder newer than the
            // watch has heard of, or needs a reading of the most it can be.
            if let View::Taken(h) = view
                && (token < h.token || (h.exact && token == h.token))
                && let Some(verdict) = against(token, Some(h))
            {
                return Ok(verdict);
            }
            let asked = f.asker.holder().await?;
            Ok(against(token, asked).unwrap_or(Whose::NotIssued {
                holder: asked.map(|h| h.token),
            }))
        })
    }

    fn resource_of_lock(&self, lock: &str) -> Option<&str> {
        self.by_resource
            .values()
            .find(|f| f.lock == lock || names(&f.lock_ref, lock))
            .map(|f| f.resource.as_str())
    }

    fn behind(&self) -> Vec<Behind> {
        self.by_resource
            .values()
            .filter_map(|f| f.behind.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_named_by_its_name_or_a_holders_key_in_it() {
        let etcd = LockRef::Etcd("jobs/a".into());
        assert!(names(&etcd, "jobs/a"));
        assert!(names(&etcd, "jobs/a/694d8a2b"));
        assert!(!names(&etcd, "jobs/ab"));
        assert!(!names(&etcd, "jobs"));
        let redis = LockRef::Redis("orders".into());
        assert!(names(&redis, "orders") && !names(&redis, "orders/x"));
    }

    #[test]
    fn a_token_is_the_holders_an_earlier_one_or_none_the_lock_gave() {
        let exact = Some(Holding::exact(7));
        assert_eq!(against(7, exact), Some(Whose::Holder));
        assert_eq!(against(5, exact), Some(Whose::Earlier { holder: 7 }));
        assert_eq!(
            against(9, exact),
            Some(Whose::NotIssued { holder: Some(7) })
        );
        assert_eq!(against(9, None), Some(Whose::NotIssued { holder: None }));
        // etcd without the token in the key: between the key's floor and
        // etcd's revision; above the floor with no reading, undecided.
        let range = |ceiling| {
            Some(Holding {
                token: 7,
                exact: false,
                ceiling,
            })
        };
        assert_eq!(against(5, range(None)), Some(Whose::Earlier { holder: 7 }));
        assert_eq!(against(8, range(None)), None);
        assert_eq!(against(8, range(Some(9))), Some(Whose::Holder));
        assert_eq!(
            against(10, range(Some(9))),
            Some(Whose::NotIssued { holder: Some(7) })
        );
    }
}
