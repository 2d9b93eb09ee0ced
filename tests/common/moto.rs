//! moto's S3 server (`moto_server`), a second reference backend written
//! independently of Garage, started per test on a free loopback port and
//! killed on drop. The binary comes from `$MOTO_SERVER`, else
//! `target/smoke-venv/bin/moto_server` (scripts/test installs it with pip
//! before `cargo test`), else `moto_server` on the PATH. moto accepts any
//! credential; fencegate signs as "moto"/"moto" in us-east-1.

use super::free_port;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "moto";
pub const SECRET: &str = "moto";

pub struct Moto {
    pub endpoint: String,
    child: Child,
}

fn moto_bin() -> PathBuf {
    if let Ok(p) = std::env::var("MOTO_SERVER") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/smoke-venv/bin/moto_server");
    if venv.exists() {
        venv
    } else {
        "moto_server".into()
    }
}

impl Moto {
    /// Starts moto and waits until it answers HTTP.
    pub fn start() -> Moto {
        let port = free_port();
        let child = Command::new(moto_bin())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start {} ({e}); scripts/test installs it into target/smoke-venv, or set MOTO_SERVER",
                    moto_bin().display()
                )
            });
        let mut m = Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!("moto_server exited at start: {status}");
            }
            if answers(port) {
                break;
            }
            assert!(Instant::now() < deadline, "moto_server did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    /// The fencegate backend config for this moto.
    pub fn backend(&self) -> super::fencegate::Backend {
        super::fencegate::Backend::S3 {
            endpoint: self.endpoint.clone(),
            access_key: KEY.into(),
            secret_key: SECRET.into(),
        }
    }
}

/// Whether something on `port` answers `GET /moto-api/` with an HTTP status.
fn answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
