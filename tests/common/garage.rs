//! A real Garage (the reference S3 store of the test suite), started per
//! test on free loopback ports with a single-node layout, a key and a
//! bucket; stopped on drop. The `garage` binary comes from
//! `cargo install --locked garage` (scripts/test installs it when missing).

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Garage {
    pub endpoint: String,
    pub key_id: String,
    pub secret: String,
    child: Child,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

fn garage_bin() -> PathBuf {
    if let Ok(p) = std::env::var("GARAGE_BIN") {
        return p.into();
    }
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cargo"));
    let p = home.join("bin/garage");
    if p.exists() { p } else { "garage".into() }
}

/// Writes a single-node Garage config into `dir`: RPC on `rpc`, S3 on `s3`.
fn write_config(dir: &Path, rpc: u16, s3: u16, secret: &str) -> PathBuf {
    let config = dir.join("garage.toml");
    std::fs::write(
        &config,
        format!(
            "metadata_dir = \"{d}/meta\"\ndata_dir = \"{d}/data\"\ndb_engine = \"sqlite\"\n\
             replication_factor = 1\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\n\
             rpc_public_addr = \"127.0.0.1:{rpc}\"\nrpc_secret = \"{secret}\"\n\n\
             [s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
             root_domain = \".s3.garage.localhost\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    config
}

impl Garage {
    /// Starts Garage with the bucket `demo` (and lets the key create more).
    pub fn start() -> Garage {
        let dir = tempfile::tempdir().unwrap();
        let (rpc, s3) = (free_port(), free_port());
        let secret: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + 11) % 256))
            .collect();
        let config = write_config(dir.path(), rpc, s3, &secret);
        let log = std::fs::File::create(dir.path().join("garage.log")).unwrap();
        let child = Command::new(garage_bin())
            .arg("-c")
            .arg(&config)
            .arg("server")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start garage (cargo install --locked garage)");
        let mut g = Garage {
            endpoint: format!("http://127.0.0.1:{s3}"),
            key_id: String::new(),
            secret: String::new(),
            child,
            config,
            _dir: dir,
        };
        // Wait for the node to answer over RPC (`node id` alone reads the
        // key file and can succeed before the server listens), then lay it
        // out.
        let node_id = g.node_id_once_up();
        g.cli_ok(&["layout", "assign", "-z", "dc1", "-c", "1G", &node_id]);
        g.cli_ok(&["layout", "apply", "--version", "1"]);
        g.create_backend_key();
        g.cli_ok(&["key", "allow", "--create-bucket", "fencegate-backend"]);
        g.cli_ok(&["bucket", "create", "demo"]);
        g.cli_ok(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            "demo",
            "--key",
            "fencegate-backend",
        ]);
        g
    }

    /// Waits (30 s at most) until the node answers over RPC; its node id.
    fn node_id_once_up(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = self.cli(&["status"]).is_ok();
            let out = if up {
                self.cli(&["node", "id", "-q"])
            } else {
                Err(String::new())
            };
            if let Some(id) = out.ok().and_then(|o| o.lines().next().map(str::to_string))
                && !id.is_empty()
            {
                return id.split('@').next().unwrap().to_string();
            }
            assert!(
                Instant::now() < deadline,
                "garage did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Creates the key `fencegate-backend` and keeps its id and secret.
    fn create_backend_key(&mut self) {
        let key = self.cli_ok(&["key", "create", "fencegate-backend"]);
        for line in key.lines() {
            let line = line.trim();
            if let Some(v) = line.strip_prefix("Key ID:") {
                self.key_id = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("Secret key:") {
                self.secret = v.trim().to_string();
            }
        }
        assert!(
            !self.key_id.is_empty() && !self.secret.is_empty(),
            "key create said: {key}"
        );
    }

    fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(garage_bin())
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn cli_ok(&self, args: &[&str]) -> String {
        self.cli(args)
            .unwrap_or_else(|e| panic!("garage {args:?}: {e}\n{}", self.log()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("garage.log")).unwrap_or_default()
    }

    /// The fencegate backend config for this Garage.
    pub fn backend(&self) -> super::fencegate::Backend {
        super::fencegate::Backend::Garage {
            endpoint: self.endpoint.clone(),
            access_key: self.key_id.clone(),
            secret_key: self.secret.clone(),
        }
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
