//! A real PostgreSQL (Debian `postgresql`), a cluster made by `initdb` in a
//! temporary directory and served on a free loopback port, as the
//! `postgres` user the package creates (PostgreSQL refuses to run as root).
//! Not the system cluster, not systemd. Restartable (after SIGKILL, a crash)
//! on the same data; stopped on drop.

use super::{free_port, wait_until};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

pub struct Postgres {
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub url: String,
    port: u16,
    bin: PathBuf,
    /// Extra `postgres` arguments (`-c name=value`).
    args: Vec<String>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

/// The newest `/usr/lib/postgresql/<ver>/bin`.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL (Debian package postgresql)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    let v = versions.last().expect("a PostgreSQL version");
    PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))
}

/// `cmd` as the `postgres` user when we are root.
fn as_postgres(program: PathBuf) -> Command {
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with(|_| {}, &[])
    }

    /// After initdb, `setup` gets the data directory (to place files in);
    /// the server then runs with `args` added.
    pub fn start_with(setup: impl FnOnce(&std::path::Path), args: &[&str]) -> Postgres {
        let dir = super::scratch_dir();
        if unsafe { libc::geteuid() } == 0 {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the temporary directory to postgres");
        }
        let bin = bin_dir();
        let out = as_postgres(bin.join("initdb"))
            .args(["--no-sync", "-A", "trust", "-U", "postgres", "-D"])
            .arg(dir.path().join("data"))
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb: {out:?}");
        setup(&dir.path().join("data"));
        let port = free_port();
        let mut p = Postgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            port,
            bin,
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
            dir,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .unwrap();
        let child = as_postgres(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // Shared memory segments in the data directory, not /dev/shm:
            // a server killed like a crash leaves them behind otherwise.
            .args(["-c", "dynamic_shared_memory_type=mmap"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.psql("SELECT 1").trim() != "1" {
            assert!(
                std::time::Instant::now() < deadline,
                "PostgreSQL never answered; its log:\n{}",
                std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// `psql -Atc SQL`; its stdout (empty on failure).
    pub fn psql(&self, sql: &str) -> String {
        Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-Atc", sql])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `psql` itself, for a client the test sets up.
    pub fn psql_bin(&self) -> PathBuf {
        self.bin.join("psql")
    }

    /// Kills the server like a crash: the postmaster and every backend.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The postmaster (runuser's child, if any) and its children.
            let pid = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
                .ok()
                .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok());
            let mut pids: Vec<i32> = pid.into_iter().collect();
            if let Some(pid) = pid
                && let Ok(o) = Command::new("pgrep")
                    .args(["-P", &pid.to_string()])
                    .output()
            {
                pids.extend(
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter_map(|l| l.trim().parse::<i32>().ok()),
                );
            }
            for p in &pids {
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            // runuser reaps the postmaster and exits with it.
            let _ = c.wait();
            wait_until(30, "PostgreSQL processes to exit", || {
                pids.iter().all(|p| !alive(*p))
            });
        }
    }

    /// Starts it again on the same port and data (crash recovery).
    pub fn restart(&mut self) {
        self.stop();
        // Left by the killed server (its pid may live on as a zombie).
        let _ = std::fs::remove_file(self.dir.path().join("data/postmaster.pid"));
        let _ = std::fs::remove_file(self.dir.path().join(format!(".s.PGSQL.{}.lock", self.port)));
        self.spawn();
    }
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()?
                .split_whitespace()
                .next()
                .map(|st| st != "Z")
        })
        .unwrap_or(false)
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
