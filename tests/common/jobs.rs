//! Programs run the way an operator runs them to be fenced through their
//! credentials (docs/credentials.md): fencegate on its embedded store or
//! in front of Garage, with a job's prefix as one fence, an etcd for the
//! locks, and jobs started
//! under `fencegate lock --credentials`, in the foreground or in the
//! background to be paused like a zombie (`tests/programs.rs`).

use super::Store;
use super::etcd::Etcd;
use super::fencegate::{Backend, Fencegate};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "programs-admin-token-0123";
pub const TTL_SECS: u64 = 2;

/// fencegate on `store` with bucket `demo`, whose prefix `prefix` is one
/// fence (`shared`), and an etcd for the locks.
pub struct Rig {
    pub etcd: Etcd,
    pub fg: Fencegate,
    /// The store behind fencegate, when it is Garage.
    _garage: Option<super::garage::Garage>,
    pub dir: tempfile::TempDir,
    /// How `fencegate lock` gives the job its credentials: `--credentials`
    /// (the environment), or `--credentials-endpoint` and its lifetime.
    pub credentials: Vec<String>,
}

impl Rig {
    pub fn start(store: Store, prefix: &str) -> Rig {
        Rig::start_with(store, prefix, None)
    }

    /// With `pki`, fencegate serves HTTPS with its server certificate
    /// (`localhost`), and the bucket is made over HTTPS.
    pub fn start_with(store: Store, prefix: &str, pki: Option<&super::secure::Pki>) -> Rig {
        let mode = match std::env::var("FENCEGATE_TEST_PROGRAMS_UNFENCED").as_deref() {
            Ok("1") => "mode = \"unfenced\"\n".to_string(),
            _ => format!(
                "mode = \"shared\"\nresource = \"job-{}\"\n",
                prefix.trim_end_matches('/')
            ),
        };
        let rules = format!("[[rules]]\nbucket = \"demo\"\nprefix = \"{prefix}\"\n{mode}");
        let mut server = format!("admin_token = \"{ADMIN}\"\n");
        if let Some(pki) = pki {
            server.push_str(&format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                pki.path("server.pem").display(),
                pki.path("server-key.pem").display()
            ));
        }
        let garage = matches!(store, Store::Garage).then(super::garage::Garage::start);
        let backend = garage.as_ref().map_or(Backend::Embedded, |g| g.backend());
        let fg = Fencegate::start_with(backend, &server, &rules);
        match pki {
            None => {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(super::ensure_bucket(&super::sdk(&fg.endpoint()), "demo"));
            }
            Some(pki) => {
                let out = Command::new(venv_bin("aws"))
                    .args([
                        "--endpoint-url",
                        &format!("https://localhost:{}", fg.s3.port()),
                    ])
                    .args(["s3", "mb", "s3://demo"])
                    .env("AWS_ACCESS_KEY_ID", super::fencegate::DEMO_KEY)
                    .env("AWS_SECRET_ACCESS_KEY", super::fencegate::DEMO_SECRET)
                    .env("AWS_DEFAULT_REGION", "us-east-1")
                    .env("AWS_CA_BUNDLE", pki.path("ca.pem"))
                    .output()
                    .unwrap();
                // Garage's test setup has made it already.
                let had = String::from_utf8_lossy(&out.stderr).contains("BucketAlreadyOwnedByYou");
                assert!(out.status.success() || had, "{out:?}");
            }
        }
        Rig {
            etcd: Etcd::start(),
            fg,
            _garage: garage,
            dir: tempfile::tempdir().unwrap(),
            credentials: vec!["--credentials".into()],
        }
    }

    /// Jobs fetch their credentials from `fencegate lock
    /// --credentials-endpoint`, each lasting `ttl_secs`.
    pub fn with_endpoint(mut self, ttl_secs: u64) -> Rig {
        self.credentials = vec![
            "--credentials-endpoint".into(),
            "--credentials-ttl".into(),
            ttl_secs.to_string(),
        ];
        self
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `fencegate lock --credentials... -- sh -c SCRIPT`, its environment
    /// `env` and a HOME of its own; the script's pid goes to `<name>.pid`.
    pub fn lock(&self, name: &str, scope: &str, script: &str, env: &[(&str, String)]) -> Command {
        let pid_file = self.path(&format!("{name}.pid"));
        let mut c = Command::new(env!("CARGO_BIN_EXE_fencegate"));
        c.args(["lock", "--etcd", &self.etcd.endpoint])
            .args(["--ttl", &TTL_SECS.to_string(), "--kill-grace", "1"])
            .args(&self.credentials)
            .args(["--scope", scope, "job", "--", "sh", "-c"])
            .arg(format!("echo $$ > {}; {script}", pid_file.display()))
            .env("FENCEGATE_ADMIN_URL", format!("http://{}", self.fg.admin))
            .env("FENCEGATE_ADMIN_TOKEN", ADMIN)
            .env("FENCEGATE_S3_URL", self.fg.endpoint())
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("HOME", self.dir.path())
            // A CA bundle from the machine's environment makes rclone's
            // old AWS SDK refuse to start; the endpoint is plain HTTP.
            .env_remove("AWS_CA_BUNDLE")
            .current_dir(self.dir.path());
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// Runs a job under the lock to its end: its exit code and output.
    pub fn run(
        &self,
        name: &str,
        scope: &str,
        script: &str,
        env: &[(&str, String)],
    ) -> (i32, String) {
        let out = self.lock(name, scope, script, env).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// Starts a job under the lock in the background.
    pub fn spawn(&self, name: &str, scope: &str, script: &str, env: &[(&str, String)]) -> Job {
        let out = std::fs::File::create(self.path(&format!("{name}.out"))).unwrap();
        let child = self
            .lock(name, scope, script, env)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let pid_file = self.path(&format!("{name}.pid"));
        super::wait_until(30, "the job to start under the lock", || pid_file.exists());
        let text = std::fs::read_to_string(&pid_file).unwrap();
        Job {
            helper: child,
            program: text.trim().parse().unwrap(),
            out: self.path(&format!("{name}.out")),
        }
    }

    /// Access log lines from line `from` on that contain every one of
    /// `parts`.
    pub fn log_lines(&self, from: usize, parts: &[&str]) -> Vec<String> {
        (self.fg.log_now().lines().skip(from))
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .map(str::to_string)
            .collect()
    }

    /// What a background job printed so far.
    pub fn output(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.out"))).unwrap_or_default()
    }

    pub fn log_len(&self) -> usize {
        self.fg.log_now().lines().count()
    }

    /// A job paused (SIGSTOP) until its lock's lease has run out.
    pub fn pause_past_its_lock(&self, job: &Job) {
        job.pause();
        std::thread::sleep(Duration::from_secs(TTL_SECS + 2));
    }

    /// The zombie: `job`'s program wakes while its supervisor sleeps and
    /// goes on writing. At least `refusals` of its requests (signed with
    /// `access_key`) after log line `from` are refused stale, and none of
    /// its writes lands; then its supervisor wakes, finds the lock lost
    /// and stops it. The supervisor's exit code and the job's output.
    pub fn zombie_is_refused(
        &self,
        job: Job,
        access_key: &str,
        from: usize,
        refusals: usize,
    ) -> (Option<i32>, String) {
        job.resume_program();
        let stale = [access_key, "decision=\"stale\""];
        self.wait_log(from, &stale, refusals, "the zombie's writes to be refused");
        std::thread::sleep(Duration::from_secs(2));
        let (code, out) = job.finish();
        let landed = writes_landed(&self.log_lines(from, &[access_key]));
        assert!(
            landed.is_empty(),
            "the zombie's writes landed: {landed:?}\n{out}"
        );
        (code, out)
    }

    /// The rclone zombie's start: job `name` syncs `src-a` (six files of
    /// 300 KB, slowly) to `demo/mirror/` and is paused past its lock once
    /// two landed; then the next holder syncs `src-b` (three small files)
    /// over it. The paused job, and the log line of its first PUT.
    pub fn rclone_sync_overtaken(&self, name: &str, env: &[(&str, String)]) -> (Job, String) {
        random_files(&self.path("src-a"), 6, 300_000);
        random_files(&self.path("src-b"), 3, 1000);
        let from = self.log_len();
        let slow = rclone_sync("src-a", "--transfers 1 --bwlimit 300k");
        let a = self.spawn(name, "demo/mirror/", &slow, env);
        let put = ["method=PUT", "key=\"mirror/", "status=200"];
        self.wait_log(from, &put, 2, "A to copy two files");
        self.pause_past_its_lock(&a);
        let first_put = self.log_lines(from, &put).swap_remove(0);
        let (code, out) = self.run("b", "demo/mirror/", &rclone_sync("src-b", ""), env);
        assert_eq!(code, 0, "{out}");
        (a, first_put)
    }

    /// Waits until `n` log lines from `from` on contain `parts`.
    pub fn wait_log(&self, from: usize, parts: &[&str], n: usize, what: &str) {
        super::wait_until(60, what, || self.log_lines(from, parts).len() >= n);
    }
}

/// A job under the lock running in the background: the lock helper, and
/// the program in its own process group.
pub struct Job {
    helper: Child,
    program: i32,
    out: PathBuf,
}

impl Job {
    /// SIGSTOP to both: the zombie, paused past its lock.
    pub fn pause(&self) {
        unsafe {
            libc::kill(self.helper.id() as i32, libc::SIGSTOP);
            libc::kill(-self.program, libc::SIGSTOP);
        }
    }

    /// The program wakes; its supervisor does not yet.
    pub fn resume_program(&self) {
        unsafe { libc::kill(-self.program, libc::SIGCONT) };
    }

    /// The helper wakes, finds the lock lost and stops the program; its
    /// exit code and the job's output.
    pub fn finish(mut self) -> (Option<i32>, String) {
        unsafe { libc::kill(self.helper.id() as i32, libc::SIGCONT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            if let Some(s) = self.helper.try_wait().unwrap() {
                break s.code();
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (code, std::fs::read_to_string(&self.out).unwrap_or_default())
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.helper.id() as i32, libc::SIGCONT);
            libc::kill(-self.program, libc::SIGKILL);
        }
        let _ = self.helper.kill();
        let _ = self.helper.wait();
    }
}

/// rclone's remote `fg:` from the environment, on fencegate at `endpoint`:
/// `env_auth` reads whatever credentials `fencegate lock` gives the program
/// (the variables, or the endpoint).
pub fn rclone_env(endpoint: String) -> [(&'static str, String); 5] {
    [
        ("RCLONE_CONFIG_FG_TYPE", "s3".to_string()),
        ("RCLONE_CONFIG_FG_PROVIDER", "Other".to_string()),
        ("RCLONE_CONFIG_FG_ENV_AUTH", "true".to_string()),
        ("RCLONE_CONFIG_FG_REGION", "us-east-1".to_string()),
        ("RCLONE_CONFIG_FG_ENDPOINT", endpoint),
    ]
}

/// `rclone sync SRC fg:demo/mirror`, one try per file, with `extra` flags.
pub fn rclone_sync(src: &str, extra: &str) -> String {
    format!("exec rclone sync {src} fg:demo/mirror --retries 1 --low-level-retries 1 {extra}")
}

pub fn random_files(dir: &Path, n: usize, size: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        let bytes: Vec<u8> = (0..size).map(|_| rand::random::<u8>()).collect();
        std::fs::write(dir.join(format!("f{i}")), bytes).unwrap();
    }
}

/// The lines of `lines` that are writes (PUT, POST, DELETE) answered 2xx.
pub fn writes_landed(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !l.contains("method=GET") && !l.contains("method=HEAD"))
        .filter(|l| l.contains(" status=2"))
        .cloned()
        .collect()
}

/// The access key id a request was signed with, from its access log
/// `line` (the caller picks the line).
pub fn access_key_of(line: &str) -> String {
    let at = line.find("access_key=\"").expect("an access key") + 12;
    line[at..].split('"').next().unwrap().to_string()
}

pub fn venv_bin(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/smoke-venv/bin");
    assert!(
        p.exists(),
        "{} is missing: scripts/test installs it",
        p.display()
    );
    p.join(name).display().to_string()
}

/// The results file of `env_clients.py`, once it has `n` lines.
pub fn results(path: &Path, n: usize) -> Vec<String> {
    super::wait_until(60, "the clients' results", || {
        std::fs::read_to_string(path).is_ok_and(|t| t.lines().count() >= n)
    });
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
