//! ZooKeeper: taking a lock with Curator's mutex recipe, and watching who
//! holds one.
//!
//! Contenders create ephemeral sequential nodes `_c_<uuid>-lock-<seq>` under
//! the lock directory (a container node); the lowest sequence holds the
//! lock. The token is the czxid of the holder's node: zxids only grow, while
//! the 10-digit sequence suffix restarts at 0 whenever ZooKeeper reaps the
//! empty container and wraps at 2^31. Apache Curator's `InterProcessMutex`
//! on the same path takes the same lock.

use super::issued::Holding;
use super::watch::{Broken, Report, Watch};
use super::{LockError, Seen};
use crate::config::access::AccessConfig;
use std::time::Duration;
use tokio::sync::watch;
use zookeeper_client as zk;

fn service_error(e: zk::Error) -> LockError {
    LockError::Service(e.to_string())
}

async fn connect(
    servers: &str,
    access: &AccessConfig,
    session: Duration,
) -> Result<zk::Client, LockError> {
    let failed = |e: &dyn std::fmt::Display| {
        LockError::Service(crate::access::failure("zookeeper", servers, e))
    };
    crate::access::zookeeper_connector(servers, access)
        .map_err(LockError::Service)?
        .with_session_timeout(session)
        .with_connection_timeout(Duration::from_secs(3))
        .connect(servers)
        .await
        .map_err(|e| match e {
            zk::Error::AuthFailed => failed(&"SASL authentication failed (the user or password is wrong, or the server wants SASL and none is configured)"),
            // The client retries a failed handshake until the session
            // timeout, and then says only that.
            zk::Error::Timeout if servers.contains("tcp+tls://") => failed(&"no TLS session within the session timeout (is the port ZooKeeper's secureClientPort? does ca_file hold the CA that signed its certificate? does it want a client certificate?)"),
            e => failed(&e),
        })
}

/// One session, for the start-up check: `(permanent, why)` on failure,
/// permanent when SASL was refused or TLS failed (`ca_file`, `tcp+tls`, no
/// TLS session): a config to fix, which stops start-up.
pub async fn check(servers: &str, access: &AccessConfig) -> Result<(), (bool, String)> {
    match connect(servers, access, Duration::from_secs(10)).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = e.to_string();
            let permanent = ["SASL", "ca_file", "tcp+tls", "TLS session"];
            Err((permanent.iter().any(|p| e.contains(p)), e))
        }
    }
}

/// The 10-digit sequence at the end of a lock node's name.
fn sequence(name: &str) -> Option<i64> {
    let tail = name.get(name.len().checked_sub(10)?..)?;
    tail.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| tail.parse().ok())?
}

/// A held ZooKeeper lock: the session and the holder's node.
pub struct ZkLock {
    pub token: u64,
    pub node: String,
    client: zk::Client,
    lost: watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

/// Takes the lock in directory `path`, waiting up to `wait`.
pub async fn acquire(
    servers: &str,
    access: &AccessConfig,
    path: &str,
    session: Duration,
    wait: Option<Duration>,
) -> Result<ZkLock, LockError> {
    let client = connect(servers, access, session).await?;
    let acl = zk::Acls::anyone_all();
    let options = zk::LockOptions::new(acl)
        .with_ancestor_options(zk::CreateMode::Container.with_acls(acl))
        .map_err(service_error)?;
    let prefix = zk::LockPrefix::new_curator(path, "lock-").map_err(service_error)?;
    let take = client.lock(prefix, b"", options);
    let lock = match wait {
        // Cancelling the recipe deletes our node.
        Some(d) => tokio::time::timeout(d, take)
            .await
            .map_err(|_| LockError::Timeout)?,
        None => take.await,
    }
    .map_err(service_error)?
    .into_owned();
    let node = lock.lock_path().to_string();
    let stat = client
        .check_stat(&node)
        .await
        .map_err(service_error)?
        .ok_or_else(|| LockError::Lost("lock node vanished".into()))?;
    // The node is ours now; release() deletes it.
    std::mem::forget(lock);
    let (tx, lost) = watch::channel(None);
    let task = tokio::spawn(guard(client.clone(), node.clone(), session, tx));
    Ok(ZkLock {
        token: stat.czxid as u64,
        node,
        client,
        lost,
        task,
    })
}

impl ZkLock {
    pub async fn lost(&mut self) -> String {
        super::lost_reason(&mut self.lost, "session watcher stopped").await
    }

    pub async fn release(self) {
        self.task.abort();
        let _ = self.client.delete(&self.node, None).await;
    }
}

/// Declares the lock lost when the node is deleted, the session expires or
/// closes, or the client stays disconnected for the session timeout (the
/// server may have expired the session by then without telling us).
async fn guard(
    client: zk::Client,
    node: String,
    session: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let mut states = client.state_watcher();
    let node_gone = async {
        loop {
            match client.check_and_watch_stat(&node).await {
                Ok((None, _)) => return format!("lock node {node} was deleted"),
                Ok((Some(_), w)) => {
                    let ev = w.changed().await;
                    if ev.event_type == zk::EventType::NodeDeleted {
                        return format!("lock node {node} was deleted");
                    }
                    if ev.session_state.is_terminated() {
                        return format!("session {:?}", ev.session_state);
                    }
                }
                Err(zk::Error::SessionExpired) => return "session expired".into(),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let session_gone = async {
        loop {
            match states.changed().await {
                zk::SessionState::Disconnected => {
                    let back = async {
                        loop {
                            match states.changed().await {
                                zk::SessionState::SyncConnected => return None,
                                s if s.is_terminated() => return Some(format!("session {s:?}")),
                                _ => {}
                            }
                        }
                    };
                    match tokio::time::timeout(session, back).await {
                        Ok(None) => {}
                        Ok(Some(why)) => return why,
                        Err(_) => {
                            return format!(
                                "disconnected from ZooKeeper for the session timeout ({} ms)",
                                session.as_millis()
                            );
                        }
                    }
                }
                s if s.is_terminated() => return format!("session {s:?}"),
                _ => {}
            }
        }
    };
    let why = tokio::select! {
        w = node_gone => w,
        w = session_gone => w,
    };
    let _ = lost.send(Some(why));
}

/// Watches the lock in directory `path` and reports each time its holder
/// goes away.
///
/// Only the holder (lowest sequence) counts; a waiter leaving does nothing.
/// The fence goes to the czxid of the new holder, which is that holder's own
/// token and above every earlier contender's; with no contender left, to the
/// directory's pzxid, which every later node's czxid exceeds.
pub async fn watch_holder(
    servers: String,
    access: AccessConfig,
    session: Duration,
    path: String,
    seen: impl Fn(Seen) + Sync,
) {
    let watch = HolderWatch {
        servers,
        access,
        session,
        path,
        holder: None,
    };
    super::watch::run(watch, seen).await
}

/// The watch of one lock directory, for [`watch_holder`].
struct HolderWatch {
    servers: String,
    access: AccessConfig,
    session: Duration,
    path: String,
    /// The holder's node, as last seen.
    holder: Option<String>,
}

impl Watch for HolderWatch {
    const SERVICE: &'static str = "zookeeper";
    type Session = zk::Client;

    fn lock(&self) -> &str {
        &self.path
    }

    async fn connect(&mut self, _: Report<'_>) -> Result<zk::Client, Broken> {
        Ok(connect(&self.servers, &self.access, self.session).await?)
    }

    async fn follow(&mut self, client: zk::Client, seen: Report<'_>) -> Broken {
        // The client reconnects by itself within the session; say when
        // the watch is blind meanwhile.
        let states = async {
            let mut w = client.state_watcher();
            loop {
                match w.changed().await {
                    zk::SessionState::Disconnected => seen(Seen::Down),
                    zk::SessionState::SyncConnected => seen(Seen::Up),
                    s if s.is_terminated() => return Broken::new(format!("session {s:?}")),
                    _ => {}
                }
            }
        };
        tokio::select! {
            broken = states => broken,
            broken = follow_children(&client, &self.path, &mut self.holder, seen) => broken,
        }
    }
}

/// Follows the children of directory `path`, reporting each time the holder
/// (`holder`, as last seen) goes, until the session ends or a read fails.
async fn follow_children(
    client: &zk::Client,
    path: &str,
    holder: &mut Option<String>,
    seen: Report<'_>,
) -> Broken {
    loop {
        let (children, dir, watcher) = match client.get_and_watch_children(path).await {
            Ok(r) => r,
            Err(zk::Error::NoNode) => {
                seen(Seen::Holder(None));
                match no_directory(client, path, holder, seen).await {
                    Ok(()) => continue,
                    Err(broken) => return broken,
                }
            }
            Err(e) => return Broken::new(format!("cannot watch {path}: {e}")),
        };
        let current = children
            .iter()
            .filter_map(|c| sequence(c).map(|s| (s, c)))
            .min()
            .map(|(_, c)| c.clone());
        let token = match &current {
            Some(new) => match client.check_stat(&format!("{path}/{new}")).await {
                Ok(Some(st)) => Some(st.czxid as u64),
                // Gone already: look again.
                Ok(None) => continue,
                Err(e) => return Broken::new(format!("cannot read {path}/{new}: {e}")),
            },
            None => None,
        };
        seen(Seen::Holder(token.map(Holding::exact)));
        if let Some(old) = holder.as_ref()
            && current.as_ref() != Some(old)
        {
            let (token, why) = match &current {
                Some(new) => match client.check_stat(&format!("{path}/{new}")).await {
                    Ok(Some(st)) => (st.czxid, format!("holder {old} replaced by {new}")),
                    // Gone already: look again.
                    Ok(None) => continue,
                    Err(e) => return Broken::new(format!("cannot read {path}/{new}: {e}")),
                },
                None => (dir.pzxid, format!("holder {old} released the lock")),
            };
            seen(Seen::Raise {
                token: token as u64,
                why,
            });
        }
        *holder = current;
        let ev = watcher.changed().await;
        if ev.session_state.is_terminated() {
            return Broken::new(format!("session {:?}", ev.session_state));
        }
    }
}

/// The token of the holder of the lock in directory `path` now: the czxid
/// of its lowest sequential node, asked of ZooKeeper (`None`: nobody holds
/// it).
pub async fn holder_now(client: &zk::Client, path: &str) -> Result<Option<Holding>, String> {
    let children = match client.list_children(path).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(format!("cannot read {path}: {e}")),
    };
    let lowest = children
        .iter()
        .filter_map(|c| sequence(c).map(|s| (s, c)))
        .min()
        .map(|(_, c)| c.clone());
    let Some(node) = lowest else { return Ok(None) };
    match client.check_stat(&format!("{path}/{node}")).await {
        Ok(Some(st)) => Ok(Some(Holding::exact(st.czxid as u64))),
        // Released in between: its successor, if any, asked again.
        Ok(None) => Box::pin(holder_now(client, path)).await,
        Err(e) => Err(format!("cannot read {path}/{node}: {e}")),
    }
}

/// A session for [`holder_now`].
pub async fn client_for(
    servers: &str,
    access: &AccessConfig,
    session: Duration,
) -> Result<zk::Client, String> {
    connect(servers, access, session)
        .await
        .map_err(|e| e.to_string())
}

/// No directory: nobody holds or waits. ZooKeeper reaped the empty
/// container after the holder left (or it was deleted): the nearest
/// ancestor's pzxid is at least that deletion, and below any later node's
/// czxid. Raises to it if a holder was known, then waits for the directory.
async fn no_directory(
    client: &zk::Client,
    path: &str,
    holder: &mut Option<String>,
    seen: Report<'_>,
) -> Result<(), Broken> {
    if let Some(old) = holder.as_ref() {
        let z = ancestor_pzxid(client, path)
            .await
            .map_err(|e| Broken::new(format!("cannot read the ancestors of {path}: {e}")))?;
        seen(Seen::Raise {
            token: z as u64,
            why: format!("holder {old} released the lock (directory reaped)"),
        });
        *holder = None;
    }
    match client.check_and_watch_stat(path).await {
        Ok((Some(_), _)) => Ok(()),
        Ok((None, w)) => {
            let ev = w.changed().await;
            if ev.session_state.is_terminated() {
                return Err(Broken::new(format!("session {:?}", ev.session_state)));
            }
            Ok(())
        }
        Err(e) => Err(Broken::new(format!("cannot watch {path}: {e}"))),
    }
}

/// The pzxid of the nearest existing ancestor of `path` (the root exists).
async fn ancestor_pzxid(client: &zk::Client, path: &str) -> Result<i64, zk::Error> {
    let mut p = path;
    loop {
        p = match p.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &p[..i],
        };
        if let Some(stat) = client.check_stat(p).await? {
            return Ok(stat.pzxid);
        }
        if p == "/" {
            return Err(zk::Error::NoNode);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sequence;

    #[test]
    fn sequence_suffix() {
        assert_eq!(sequence("_c_8d1f-lock-0000000042"), Some(42));
        assert_eq!(sequence("lock-0000000000"), Some(0));
        assert_eq!(sequence("lock-12"), None);
        assert_eq!(sequence("readme"), None);
    }
}
