//! A real ZooKeeper (Debian `zookeeper`), a standalone server started per
//! test on a free loopback port, with short ticks so that sessions expire
//! in about a second and empty container nodes are reaped within 100 ms.
//! Stopped on drop.

use super::{free_port, wait_until};
use std::io::{Read, Write};
use std::process::{Child, Command};

/// The Debian package's jar; its manifest names the jars it depends on,
/// all but netty-codec, which the Netty connection factory (TLS) needs.
const CLASSPATH: &str =
    "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar";

pub struct ZooKeeper {
    /// `127.0.0.1:PORT`, the client address.
    pub connect: String,
    port: u16,
    /// Extra JVM flags (`-D...`).
    jvm: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    pub fn start() -> ZooKeeper {
        ZooKeeper::start_with(|_| (String::new(), Vec::new()))
    }

    /// With the zoo.cfg lines and JVM flags that `extra` makes, given the
    /// server's directory.
    pub fn start_with(extra: impl FnOnce(&std::path::Path) -> (String, Vec<String>)) -> ZooKeeper {
        let dir = super::scratch_dir();
        let (cfg_extra, jvm) = extra(dir.path());
        let port = free_port();
        std::fs::write(
            dir.path().join("zoo.cfg"),
            format!(
                "tickTime=200\ndataDir={}/data\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\nminSessionTimeout=400\nmaxSessionTimeout=60000\n\
                 4lw.commands.whitelist=ruok,srvr\n{cfg_extra}",
                dir.path().display()
            ),
        )
        .unwrap();
        let mut z = ZooKeeper {
            connect: format!("127.0.0.1:{port}"),
            port,
            jvm,
            child: None,
            dir,
        };
        z.spawn();
        z
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("zookeeper.log"))
            .unwrap();
        let child = Command::new("java")
            .arg("-Dznode.container.checkIntervalMs=100")
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.path().display()))
            .args(&self.jvm)
            .args([
                "-cp",
                CLASSPATH,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(self.dir.path().join("zoo.cfg"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start ZooKeeper (Debian package zookeeper)");
        self.child = Some(child);
        let port = self.port;
        wait_until(60, "ZooKeeper to serve", || {
            four_letter(port, "srvr").contains("Mode: standalone")
        });
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

/// One of ZooKeeper's four-letter admin commands; empty on any error.
fn four_letter(port: u16, cmd: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    // A server still starting can accept and then say nothing.
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    let mut out = String::new();
    if s.write_all(cmd.as_bytes()).is_ok() {
        let _ = s.read_to_string(&mut out);
    }
    out
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.stop();
    }
}
