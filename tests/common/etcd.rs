//! A real etcd (Debian `etcd-server`), started per test on free loopback
//! ports with its own data directory, restartable on the same data, and
//! stopped on drop. `etcdctl` runs against it for the shell-level checks.

use super::{free_port, poll_until, scratch_dir, tail};
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
            dir: scratch_dir(),
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
        let mut running = [(
            self.endpoint.as_str(),
            self.child.as_mut().expect("just started"),
        )];
        if let Err(why) = wait_answering(30, &mut running) {
            panic!(
                "etcd did not answer: {why}\netcd's log:\n{}",
                tail(&self.log(), 30)
            );
        }
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

/// Polls `etcdctl endpoint health` on every running (client URL, process)
/// until all answer. `Err` says why not: a process that exited (at once),
/// or after `secs` the last unhealthy answer.
fn wait_answering(secs: u64, running: &mut [(&str, &mut Child)]) -> Result<(), String> {
    let mut why = String::new();
    let mut exited = false;
    let answered = poll_until(secs, || {
        for (url, child) in running.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                why = format!("{url} exited ({status})");
                exited = true;
                return true;
            }
        }
        running.iter().all(|(url, _)| {
            let out = etcdctl(url, &["endpoint", "health"]);
            if !out.status.success() {
                why = format!("{url}: {}", String::from_utf8_lossy(&out.stderr));
            }
            out.status.success()
        })
    });
    match (answered, exited) {
        (true, false) => Ok(()),
        (true, true) => Err(why),
        (false, _) => Err(format!("not in {secs} s; last etcdctl answer: {why}")),
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

/// A 3-member etcd cluster on loopback: members can be killed and started
/// again one by one, or all at once.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial: String,
    dir: tempfile::TempDir,
}

struct Member {
    name: String,
    client: String,
    peer: String,
    child: Option<Child>,
}

impl EtcdCluster {
    pub fn start() -> EtcdCluster {
        let members: Vec<Member> = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: format!("http://127.0.0.1:{}", free_port()),
                peer: format!("http://127.0.0.1:{}", free_port()),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = EtcdCluster {
            members,
            initial,
            dir: scratch_dir(),
        };
        for i in 0..3 {
            c.spawn(i);
        }
        c.wait_healthy();
        c
    }

    fn spawn(&mut self, i: usize) {
        let dir = self.dir.path().join(&self.members[i].name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(
                self.dir
                    .path()
                    .join(format!("{}.log", self.members[i].name)),
            )
            .unwrap();
        let m = &self.members[i];
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", &m.client])
            .args(["--advertise-client-urls", &m.client])
            .args(["--listen-peer-urls", &m.peer])
            .args(["--initial-advertise-peer-urls", &m.peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (Debian package etcd-server)");
        self.members[i].child = Some(child);
    }

    /// Waits until every running member answers health checks; panics with
    /// what etcdctl said and the tail of every member's log if they do not,
    /// at once if a member exits (a bad flag, a full disk).
    pub fn wait_healthy(&mut self) {
        let mut running: Vec<(&str, &mut Child)> = self
            .members
            .iter_mut()
            .filter_map(|m| Some((m.client.as_str(), m.child.as_mut()?)))
            .collect();
        if let Err(why) = wait_answering(60, &mut running) {
            let logs: Vec<String> = self
                .members
                .iter()
                .map(|m| {
                    let log = self.dir.path().join(format!("{}.log", m.name));
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    format!(
                        "--- {} ({}, peer {}):\n{}",
                        m.name,
                        m.client,
                        m.peer,
                        tail(&text, 15)
                    )
                })
                .collect();
            panic!(
                "the etcd cluster did not get healthy: {why}\n{}",
                logs.join("\n")
            );
        }
    }

    /// The client URLs, as a TOML array.
    pub fn endpoints_toml(&self) -> String {
        let list: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("\"{}\"", m.client))
            .collect();
        format!("[{}]", list.join(", "))
    }

    pub fn endpoint(&self, i: usize) -> &str {
        &self.members[i].client
    }

    /// The index of the current leader.
    pub fn leader(&self) -> usize {
        for (i, m) in self.members.iter().enumerate() {
            let out = etcdctl(&m.client, &["endpoint", "status", "-w", "json"]);
            let text = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(_) => continue,
            };
            let st = &v[0]["Status"];
            if st["header"]["member_id"] == st["leader"] {
                return i;
            }
        }
        panic!("no etcd member says it leads");
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process id of member `i`, while it runs: a test can stop it
    /// (`SIGSTOP`) and let it go on (`SIGCONT`), as a stalled host would.
    pub fn pid(&self, i: usize) -> i32 {
        self.members[i]
            .child
            .as_ref()
            .expect("a running member")
            .id() as i32
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// `etcdctl` against the first running member.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let m = self
            .members
            .iter()
            .find(|m| m.child.is_some())
            .expect("a running member");
        etcdctl(&m.client, args)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
