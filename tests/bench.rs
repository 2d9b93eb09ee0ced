//! `fencegate bench`: the load generator through a fencegate to the
//! in-memory sink (`fencegate bench sink`). What a user of the tool sees:
//! the requests it counts succeed, its JSON line has the fields the
//! benchmark report reads, and a stale token shows up as errors (409s),
//! never as successes. No timing is asserted.

mod common;

use common::fencegate::{Backend, Fencegate};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The sink as a child process, on a free port.
struct Sink {
    child: Child,
    addr: String,
}

impl Sink {
    fn start() -> Sink {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["bench", "sink", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the sink");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("sink listening ")
            .unwrap_or_else(|| panic!("sink said {line:?}"))
            .to_string();
        Sink { child, addr }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the generator with `args` (split at spaces); returns (exit
/// success, the JSON line).
fn bench(endpoint: &str, args: &str) -> (bool, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args([
            "bench",
            "--endpoint",
            endpoint,
            "--bucket",
            "demo",
            "--json",
        ])
        .args(args.split_whitespace())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON line ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), json)
}

#[test]
fn load_through_fencegate_to_the_sink() {
    let sink = Sink::start();
    let fg = Fencegate::start(
        Backend::S3 {
            endpoint: format!("http://{}", sink.addr),
            access_key: "sink".into(),
            secret_key: "sink-secret".into(),
        },
        "",
    );
    let ep = fg.endpoint();

    let (ok, j) = bench(&ep, "--size 4KiB -c 4 --requests 40 --token 5");
    assert!(ok, "{j}");
    assert_eq!(j["ok"], 40, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
    for field in [
        "op",
        "size",
        "concurrency",
        "payload",
        "elapsed_s",
        "req_per_s",
        "mib_per_s",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "p999_ms",
    ] {
        assert!(!j[field].is_null(), "{field} missing in {j}");
    }
    assert_eq!(j["size"], 4096);
    assert_eq!(j["payload"], "sha256");

    // GETs of what was written, unsigned-payload PUT of a larger object.
    let (ok, j) = bench(
        &ep,
        "--op get --size 1MiB -c 2 --requests 6 --token 5 --sha256-limit 0",
    );
    assert!(ok, "{j}");
    assert_eq!(j["ok"], 6, "{j}");

    // A newer holder's write (token 9) on the first worker's key...
    let (ok, _) = bench(&ep, "--size 4KiB -c 1 --requests 1 --token 9");
    assert!(ok);
    // ...fences off token 5: every request is counted as a 409, none as done.
    let (ok, j) = bench(&ep, "--size 4KiB -c 1 --requests 12 --token 5");
    assert!(!ok, "a run with no success exits non-zero: {j}");
    assert_eq!(j["ok"], 0, "{j}");
    assert_eq!(j["errors"], 12, "{j}");
    assert_eq!(j["error_statuses"]["409"], 12, "{j}");
}
