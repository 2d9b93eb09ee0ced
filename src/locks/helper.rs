//! `fencegate lock`: take a lock from etcd, ZooKeeper, Redis or PostgreSQL, run a command with
//! its token in `FENCING_TOKEN`, release the lock when the command exits,
//! and stop the command if the lock is lost first.
//!
//! Exit status: the command's own (128 + signal if a signal ended it);
//! [`EXIT_NOT_TAKEN`] when the lock could not be taken (service unreachable,
//! `--timeout`); [`EXIT_LOST`] when the lock was lost while the command ran
//! (the command was then sent SIGTERM, and SIGKILL after `--kill-grace`).

use super::{LockError, TakenLock, etcd, postgres, redis, zookeeper};
use crate::config::access::AccessConfig;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// The lock could not be taken (sysexits' EX_UNAVAILABLE).
pub const EXIT_NOT_TAKEN: i32 = 69;
/// The lock was lost while the command ran (sysexits' EX_TEMPFAIL).
pub const EXIT_LOST: i32 = 75;

/// More of the command's environment, made once the lock is held from its
/// token, its key, and a receiver that turns true the moment the lock is
/// lost (`--credentials`: session credentials bound to the token;
/// `--credentials-endpoint`: where to fetch them); an error stops the run
/// before the command starts.
pub type ExtraEnv = Box<
    dyn FnOnce(
            u64,
            String,
            watch::Receiver<bool>,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Extra, String>> + Send>>
        + Send,
>;

/// What [`ExtraEnv`] adds: variables to set, variables to take away (a
/// static key the SDKs would prefer to the endpoint), and whatever must
/// live as long as the command (the endpoint).
#[derive(Default)]
pub struct Extra {
    pub set: Vec<(String, String)>,
    pub remove: Vec<&'static str>,
    pub keep: Option<Box<dyn std::any::Any + Send>>,
}

/// Where the lock lives and how to hold it.
pub struct LockSpec {
    pub etcd: Vec<String>,
    pub zookeeper: Option<String>,
    pub redis: Option<String>,
    pub postgres: Option<String>,
    /// TLS and credentials for whichever service it is.
    pub access: AccessConfig,
    /// The PostgreSQL sequence tokens come from.
    pub postgres_sequence: String,
    pub name: String,
    pub ttl: Duration,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub extra_env: Option<ExtraEnv>,
}

async fn take(spec: &LockSpec) -> Result<TakenLock, LockError> {
    if let Some(url) = &spec.postgres {
        return postgres::acquire(
            url,
            &spec.access,
            &spec.name,
            &spec.postgres_sequence,
            spec.ttl,
            spec.timeout,
        )
        .await
        .map(|l| TakenLock::Postgres(Box::new(l)));
    }
    if let Some(url) = &spec.redis {
        return redis::acquire(url, &spec.access, &spec.name, spec.ttl, spec.timeout)
            .await
            .map(|l| TakenLock::Redis(Box::new(l)));
    }
    match &spec.zookeeper {
        Some(servers) => {
            zookeeper::acquire(servers, &spec.access, &spec.name, spec.ttl, spec.timeout)
                .await
                .map(TakenLock::ZooKeeper)
        }
        None => etcd::acquire(&spec.etcd, &spec.access, &spec.name, spec.ttl, spec.timeout)
            .await
            .map(|l| TakenLock::Etcd(Box::new(l))),
    }
}

/// Runs `command` under the lock; returns the exit status to use.
pub async fn run(mut spec: LockSpec, command: Vec<String>) -> i32 {
    let mut held = match take(&spec).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("fencegate lock: cannot take {}: {e}", spec.name);
            return EXIT_NOT_TAKEN;
        }
    };
    let token = held.token();
    eprintln!(
        "fencegate lock: holding {} as {} with token {token}",
        spec.name,
        held.key()
    );
    let (lost_tx, lost_rx) = watch::channel(false);
    let extra = match spec.extra_env.take() {
        None => Extra::default(),
        Some(make) => match make(token, held.key().to_string(), lost_rx).await {
            Ok(env) => env,
            Err(e) => {
                eprintln!("fencegate lock: {e}");
                held.release().await;
                return EXIT_NOT_TAKEN;
            }
        },
    };
    let _keep = extra.keep;
    let mut child = match spawn(&command, token, held.key(), &extra.remove, extra.set) {
        Ok(c) => c,
        Err(code) => {
            held.release().await;
            return code;
        }
    };
    let group = child.id().map(|p| p as i32);
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            eprintln!("fencegate lock: cannot install signal handlers");
            let _ = child.kill().await;
            held.release().await;
            return EXIT_NOT_TAKEN;
        }
    };
    let status = loop {
        tokio::select! {
            s = child.wait() => break s,
            why = held.lost() => {
                lost_tx.send_replace(true);
                eprintln!("fencegate lock: lock lost ({why}); stopping the command");
                stop(group, &mut child, spec.kill_grace).await;
                held.release().await;
                return EXIT_LOST;
            }
            _ = term.recv() => send(group, libc::SIGTERM),
            _ = int.recv() => send(group, libc::SIGINT),
        }
    };
    held.release().await;
    match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("fencegate lock: waiting for the command: {e}");
            1
        }
    }
}

/// Starts `command` in a process group of its own (so that stopping it
/// reaches its children too), with the token and the lock's key in its
/// environment, and `set` there, less `remove`. On failure, the exit
/// status to use: 127 when the program is not found, else 126.
fn spawn(
    command: &[String],
    token: u64,
    key: &str,
    remove: &[&str],
    set: Vec<(String, String)>,
) -> Result<tokio::process::Child, i32> {
    let mut child = tokio::process::Command::new(&command[0]);
    for name in remove {
        child.env_remove(name);
    }
    let spawned = child
        .args(&command[1..])
        .env("FENCING_TOKEN", token.to_string())
        .env("FENCING_LOCK_KEY", key)
        .envs(set)
        .process_group(0)
        .spawn();
    spawned.map_err(|e| {
        eprintln!("fencegate lock: cannot run {}: {e}", command[0]);
        match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    })
}

fn send(group: Option<i32>, sig: i32) {
    if let Some(g) = group {
        // SAFETY: kill(2) with a negative pid signals the process group we
        // created for the child; no memory is involved.
        unsafe {
            libc::kill(-g, sig);
        }
    }
}

/// SIGTERM to the command's group, then SIGKILL after `grace`.
async fn stop(group: Option<i32>, child: &mut tokio::process::Child, grace: Duration) {
    send(group, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        send(group, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::spawn;

    #[tokio::test]
    async fn a_command_gets_the_token_and_a_missing_one_exits_127() {
        let cmd = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let missing = spawn(&cmd(&["/nonexistent/program"]), 7, "k", &[], vec![]);
        assert_eq!(missing.err(), Some(127));
        let not_runnable = spawn(&cmd(&["/"]), 7, "k", &[], vec![]);
        assert_eq!(not_runnable.err(), Some(126));
        let script = "test \"$FENCING_TOKEN/$FENCING_LOCK_KEY/$A/${HOME-unset}\" = 7/k/b/unset";
        let env = vec![("A".to_string(), "b".to_string())];
        let child = spawn(&cmd(&["sh", "-c", script]), 7, "k", &["HOME"], env);
        let status = child.unwrap().wait().await.unwrap();
        assert!(status.success());
    }
}
