//! Starts the real `fencegate` binary on port 0 with a temporary config and
//! data directory, and stops it (SIGTERM or kill -9).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const DEMO_KEY: &str = "fencegate-demo";
pub const DEMO_SECRET: &str = "fencegate-demo-secret-key";
pub const LIMITED_KEY: &str = "limited-user";
pub const LIMITED_SECRET: &str = "limited-user-secret-0123456789";

/// Which store fencegate forwards to.
#[derive(Clone)]
pub enum Backend {
    Embedded,
    S3 {
        endpoint: String,
        access_key: String,
        secret_key: String,
    },
    /// An `https://` endpoint trusted through `ca_file`.
    S3Tls {
        endpoint: String,
        ca_file: String,
    },
    /// A plain endpoint addressed virtual-host style.
    S3Vhost {
        endpoint: String,
    },
    /// A real Garage (region "garage").
    Garage {
        endpoint: String,
        access_key: String,
        secret_key: String,
    },
}

pub struct Fencegate {
    pub s3: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    child: Child,
    config_path: PathBuf,
    log_path: PathBuf,
    env: Vec<(String, String)>,
}

impl Fencegate {
    /// Starts fencegate; `extra` is appended to the generated TOML (rules,
    /// [fence] settings...).
    pub fn start(backend: Backend, extra: &str) -> Fencegate {
        Self::start_with(backend, "", extra)
    }

    /// Like `start`, with `server_lines` added to the `[server]` table.
    pub fn start_with(backend: Backend, server_lines: &str, extra: &str) -> Fencegate {
        Self::start_env(backend, server_lines, extra, &[])
    }

    /// Like `start_with`, with extra environment variables for the process
    /// (kept across `kill9_and_restart`).
    pub fn start_env(
        backend: Backend,
        server_lines: &str,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Fencegate {
        Self::start_full(backend, server_lines, "", extra, env)
    }

    /// Like `start_env`, with `backend_lines` added to the `[backend]` table.
    pub fn start_full(
        backend: Backend,
        server_lines: &str,
        backend_lines: &str,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Fencegate {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let backend_toml = match &backend {
            Backend::Embedded => "[backend]\nkind = \"embedded\"\n".to_string(),
            Backend::S3 {
                endpoint,
                access_key,
                secret_key,
            } => format!(
                "[backend]\nkind = \"s3\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\naccess_key_id = \"{access_key}\"\nsecret_access_key = \"{secret_key}\"\n"
            ),
            Backend::S3Tls { endpoint, ca_file } => format!(
                "[backend]\nkind = \"s3\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\naccess_key_id = \"k\"\nsecret_access_key = \"backend-secret-never-logged\"\nca_file = \"{ca_file}\"\n"
            ),
            Backend::S3Vhost { endpoint } => format!(
                "[backend]\nkind = \"s3\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\naccess_key_id = \"k\"\nsecret_access_key = \"backend-secret-never-logged\"\naddressing = \"virtual-host\"\n"
            ),
            Backend::Garage {
                endpoint,
                access_key,
                secret_key,
            } => format!(
                "[backend]\nkind = \"s3\"\nendpoint = \"{endpoint}\"\nregion = \"garage\"\naccess_key_id = \"{access_key}\"\nsecret_access_key = \"{secret_key}\"\n"
            ),
        };
        // The probe of whether the backend honours conditional writes
        // writes an object of its own into the first bucket; the tests
        // that count what a listing shows share their Garage, so it is on
        // only where a test asks for it.
        let probe = match backend_lines.contains("probe_conditions") {
            true => "",
            false => "probe_conditions = false\n",
        };
        let backend_toml = format!("{backend_toml}{probe}{backend_lines}\n");
        let has_fence_table = extra.contains("[fence]");
        // A test may put the data directory elsewhere (a small disk).
        let data = match server_lines.contains("data_dir") {
            true => String::new(),
            false => format!("data_dir = \"{}\"\n", dir.path().join("data").display()),
        };
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{data}{server_lines}\n\n{fence}{backend_toml}\n\
             [[credentials]]\naccess_key_id = \"{DEMO_KEY}\"\nsecret_access_key = \"{DEMO_SECRET}\"\nbuckets = [\"*\"]\nbucket_admin = true\n\n\
             [[credentials]]\naccess_key_id = \"{LIMITED_KEY}\"\nsecret_access_key = \"{LIMITED_SECRET}\"\nbuckets = [\"shared\"]\n\n{extra}\n",
            fence = if has_fence_table {
                ""
            } else {
                "[fence]\nadmission_wait_ms = 5000\n"
            },
        );
        let config_path = dir.path().join("fencegate.toml");
        std::fs::write(&config_path, config).unwrap();
        let log_path = dir.path().join("fencegate.log");
        let (child, s3, admin) = spawn(&config_path, &log_path, &env);
        Fencegate {
            s3,
            admin,
            dir,
            child,
            config_path,
            log_path,
            env,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.s3)
    }

    /// The config file it runs with.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config_path
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log as it is now, without waiting for it to settle.
    pub fn log_now(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Everything fencegate logged so far (all its runs). Its log lines
    /// are written by a thread of their own, just after the request they
    /// describe was answered: this waits until the file has stopped
    /// growing (for 100 ms) before reading it.
    pub fn logs(&self) -> String {
        let len = || std::fs::metadata(&self.log_path).map_or(0, |m| m.len());
        let mut last = len();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = len();
            if now == last {
                break;
            }
            last = now;
        }
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Peak resident memory of the process so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }

    /// kill -9, then start again on the same config and data directory.
    pub fn kill9_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let (child, s3, admin) = spawn(&self.config_path, &self.log_path, &self.env);
        self.child = child;
        self.s3 = s3;
        self.admin = admin;
    }

    /// SIGTERM, wait for the process to end, then start again on the same
    /// config and data directory.
    pub fn terminate_and_restart(&mut self) {
        unsafe_kill(self.child.id(), "TERM");
        self.child.wait().unwrap();
        let (child, s3, admin) = spawn(&self.config_path, &self.log_path, &self.env);
        self.child = child;
        self.s3 = s3;
        self.admin = admin;
    }

    /// Sends `sig` (`STOP`, `CONT`...) to the process.
    pub fn signal(&self, sig: &str) {
        unsafe_kill(self.child.id(), sig);
    }

    /// kill -9, not started again.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        unsafe_kill(self.child.id(), "TERM");
        self.child.wait().unwrap().code()
    }
}

fn unsafe_kill(pid: u32, sig: &str) {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
}

fn spawn(
    config: &PathBuf,
    log: &PathBuf,
    env: &[(String, String)],
) -> (Child, SocketAddr, SocketAddr) {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .expect("spawn fencegate");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("fencegate listening ") {
                let mut s3 = None;
                let mut admin = None;
                for part in rest.split_whitespace() {
                    if let Some(a) = part.strip_prefix("s3=") {
                        s3 = a.parse::<SocketAddr>().ok();
                    } else if let Some(a) = part.strip_prefix("admin=") {
                        admin = a.parse::<SocketAddr>().ok();
                    }
                }
                let _ = tx.send((s3.unwrap(), admin.unwrap()));
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok((s3, admin)) => (child, s3, admin),
        Err(_) => {
            let _ = child.kill();
            panic!(
                "fencegate did not start; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

impl Drop for Fencegate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `--config config` and `args`.
pub fn run_bin(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

/// Runs the binary with `args` and a config text; returns (exit code, stderr).
pub fn run_with_config(config: &str, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("--config")
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
