//! The load balancer of the cluster torture: `scripts/balancer` (Debian
//! nginx, round robin) over an arm's hops, with its retry recipe
//! (`BALANCER_RETRY=1`: a 503 passed on to another replica, bodies
//! buffered so that nginx can send them again) unless
//! `TORTURE_BALANCER_RETRY=0` asks for the plain streaming balancer.

use std::process::{Child, Command, Stdio};

/// nginx from `scripts/balancer`, stopped on drop: with its retry recipe
/// (`BALANCER_RETRY=1`) unless `TORTURE_BALANCER_RETRY=0`.
pub struct Balancer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Balancer {
    pub fn start(replicas: &[std::net::SocketAddr]) -> Balancer {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::common::free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/balancer");
        let retry = match std::env::var("TORTURE_BALANCER_RETRY").as_deref() {
            Ok("0") => "0",
            _ => "1",
        };
        let child = Command::new(script)
            .env("BALANCER_RETRY", retry)
            .arg(format!("127.0.0.1:{port}"))
            .arg(dir.path())
            .args(replicas.iter().map(|a| a.to_string()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("scripts/balancer (Debian nginx)");
        crate::common::wait_until(20, "the balancer to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Balancer {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // TERM: nginx's master stops its workers; KILL would orphan them.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
