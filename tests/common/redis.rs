//! A real Redis (Debian `redis-server`), started per test on a free loopback
//! port in a temporary directory, with the persistence that keeps its token
//! counter across restarts (`appendonly yes`, `appendfsync always`) and the
//! keyspace notifications eager fencing needs, unless told otherwise.
//! Restartable on the same data; stopped on drop.

use super::{free_port, wait_until};
use std::process::{Child, Command, Stdio};

pub struct Redis {
    /// `redis://127.0.0.1:PORT/0`.
    pub url: String,
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Redis {
    /// With AOF (fsync always) and `notify-keyspace-events Kgxe`.
    pub fn start() -> Redis {
        Redis::start_with("appendonly yes\nappendfsync always\nnotify-keyspace-events Kgxe\n")
    }

    /// With extra `redis.conf` lines.
    pub fn start_with(conf: &str) -> Redis {
        let dir = super::scratch_dir();
        let port = free_port();
        std::fs::write(
            dir.path().join("redis.conf"),
            format!(
                "bind 127.0.0.1\nport {port}\ndir {}\nsave \"\"\ndaemonize no\n\
                 logfile {}/redis.log\n{conf}",
                dir.path().display(),
                dir.path().display()
            ),
        )
        .unwrap();
        let mut r = Redis {
            url: format!("redis://127.0.0.1:{port}/0"),
            port,
            child: None,
            dir,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .arg(self.dir.path().join("redis.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (Debian package redis-server)");
        self.child = Some(child);
        wait_until(30, "Redis to answer", || {
            self.cli(&["PING"]).trim() == "PONG"
        });
    }

    /// `redis-cli` against this server; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Stops the server (SIGKILL) without removing its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

/// `redis-cli -p PORT ARGS`; its stdout (empty on failure).
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
