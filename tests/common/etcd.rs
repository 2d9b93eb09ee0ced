//! A real etcd (Debian `etcd-server`), started per test on free loopback
//! ports with its own data directory, restartable on the same data, and
//! stopped on drop. `etcdctl` runs against it for the shell-level checks.

use super::{free_port, wait_until};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

pub struct Etcd {
    /// `http://127.0.0.1:PORT`, the client URL.
    pub endpoint: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        let mut e = Etcd {
            endpoint: String::new(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        e.endpoint = format!("http://127.0.0.1:{}", e.client_port);
        e.spawn();
        e
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.data_dir())
            .args(["--listen-client-urls", &self.endpoint])
            .args(["--advertise-client-urls", &self.endpoint])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (Debian package etcd-server)");
        self.child = Some(child);
        wait_until(30, "etcd to answer", || {
            self.etcdctl(&["endpoint", "health"]).status.success()
        });
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `etcdctl` (API v3) against this server.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.endpoint, args)
    }

    /// Stops the server (SIGKILL) without removing its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// etcd's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

/// Runs `etcdctl` (API v3) against `endpoint`.
pub fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .expect("run etcdctl (Debian package etcd-client)")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
