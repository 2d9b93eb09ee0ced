//! `fencegate lock` as a lock holder in tests: started as a process that
//! prints its token and then sleeps, so a test can pause it (`SIGSTOP`, as a
//! GC pause or a partition would), let its lease or session expire, and
//! write with its token afterwards.

use super::etcd::Etcd;
use super::zookeeper::ZooKeeper;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A lock service a test started.
pub enum Server {
    Etcd(Etcd),
    ZooKeeper(ZooKeeper),
}

impl Server {
    /// Its address, to hand to clients and threads.
    pub fn service(&self) -> Service {
        match self {
            Server::Etcd(e) => Service::Etcd(e.endpoint.clone()),
            Server::ZooKeeper(z) => Service::ZooKeeper(z.connect.clone()),
        }
    }

    /// Kills the server, keeping its data.
    pub fn stop(&mut self) {
        match self {
            Server::Etcd(e) => e.stop(),
            Server::ZooKeeper(z) => z.stop(),
        }
    }

    /// Starts it again on the same address and data.
    pub fn restart(&mut self) {
        match self {
            Server::Etcd(e) => e.restart(),
            Server::ZooKeeper(z) => z.restart(),
        }
    }
}

/// Where a lock service answers, for `fencegate lock` and fencegate.
#[derive(Clone)]
pub enum Service {
    /// etcd's client URL.
    Etcd(String),
    /// ZooKeeper's `host:port`.
    ZooKeeper(String),
}

impl Service {
    /// `--etcd URL` or `--zookeeper HOST:PORT`.
    pub fn args(&self) -> Vec<String> {
        match self {
            Service::Etcd(e) => vec!["--etcd".into(), e.clone()],
            Service::ZooKeeper(z) => vec!["--zookeeper".into(), z.clone()],
        }
    }

    /// The lock name a test uses: a name for etcd, a directory for ZooKeeper.
    pub fn lock_name(&self) -> &'static str {
        match self {
            Service::Etcd(_) => "orders",
            Service::ZooKeeper(_) => "/locks/orders",
        }
    }

    /// The `[locks]` table and an `[[eager]]` entry tying resource `orders`
    /// to this lock.
    pub fn eager_toml(&self) -> String {
        match self {
            Service::Etcd(e) => format!(
                "[locks]\netcd_endpoints = [\"{e}\"]\n\n[[eager]]\nresource = \"orders\"\netcd_lock = \"orders\"\n"
            ),
            Service::ZooKeeper(z) => format!(
                "[locks]\nzookeeper = \"{z}\"\nzookeeper_session_timeout_ms = 2000\n\n[[eager]]\nresource = \"orders\"\nzookeeper_lock = \"/locks/orders\"\n"
            ),
        }
    }
}

/// `fencegate lock ARGS -- CMD...`, run to completion.
pub fn run_lock(svc: &Service, extra: &[&str], cmd: &[&str]) -> Output {
    run_lock_at(&svc.args(), svc.lock_name(), extra, cmd)
}

/// `fencegate lock SERVICE_ARGS EXTRA NAME -- CMD...`, run to completion.
pub fn run_lock_at(service: &[String], name: &str, extra: &[&str], cmd: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("lock")
        .args(service)
        .args(extra)
        .arg(name)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run fencegate lock")
}

/// A running `fencegate lock` whose command holds the lock until killed.
pub struct Holder {
    pub token: u64,
    pub key: String,
    child: Child,
    /// The command's process group (it runs in its own).
    group: i32,
}

impl Holder {
    /// Starts `fencegate lock --ttl TTL` and waits until it holds the lock.
    pub fn take(svc: &Service, ttl_secs: u64) -> Holder {
        Holder::take_at(&svc.args(), svc.lock_name(), ttl_secs)
    }

    /// The same, with the service given as `fencegate lock` arguments.
    pub fn take_at(service: &[String], name: &str, ttl_secs: u64) -> Holder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .arg("lock")
            .args(service)
            .args(["--ttl", &ttl_secs.to_string(), "--kill-grace", "1"])
            .arg(name)
            .args([
                "--",
                "sh",
                "-c",
                "echo \"$FENCING_TOKEN $FENCING_LOCK_KEY $$\"; exec sleep 600",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fencegate lock");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut parts = line.split_whitespace();
        let token = parts
            .next()
            .expect("a token line")
            .parse()
            .expect("a token");
        let key = parts.next().expect("a key").to_string();
        let group = parts.next().expect("a pid").parse().unwrap();
        Holder {
            token,
            key,
            child,
            group,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Freezes the helper: no more keep-alives or heartbeats.
    pub fn pause(&self) {
        unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
    }

    pub fn resume(&self) {
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }

    /// The helper's exit code once it exits, or None after `secs`.
    pub fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Ends the command (SIGTERM to its group): `fencegate lock` then
    /// releases the lock and exits.
    pub fn release(mut self) {
        unsafe { libc::kill(-self.group, libc::SIGTERM) };
        self.wait_exit(20);
    }

    /// Whether the command (its process group) is still alive.
    pub fn command_alive(&self) -> bool {
        unsafe { libc::kill(-self.group, 0) == 0 }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.pid(), libc::SIGCONT);
            libc::kill(-self.group, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The recorded highest token of `orders` (the lock tests' resource), if any.
pub async fn fence(fg: &super::fencegate::Fencegate) -> Option<u64> {
    let url = format!("http://{}/fences/orders", fg.admin);
    let (status, body) = super::http_call("GET", &url, None, None).await;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["highest"].as_u64()
}

/// Waits (up to 60 s) until eager fencing of `orders` reports `up`.
pub async fn wait_for_eager(fg: &super::fencegate::Fencegate, up: bool) {
    let want = format!(
        "fencegate_eager_fencing_up{{resource=\"orders\"}} {}",
        up as u8
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let url = format!("http://{}/metrics", fg.admin);
        let (_, m) = super::http_call("GET", &url, None, None).await;
        if m.contains(&want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw {want}; fencegate's log:\n{}",
            fg.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Waits (up to 60 s) until the fence of `orders` is above `token`.
pub async fn wait_for_fence_above(fg: &super::fencegate::Fencegate, token: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(h) = fence(fg).await
            && h > token
        {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fence never rose above {token}; fencegate's log:\n{}",
            fg.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
