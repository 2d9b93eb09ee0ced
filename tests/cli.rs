//! Start-up and shutdown as an operator sees them: bad config stops start-up
//! with exit code 2 naming the field, before start-up begins; a damaged fence table stops it with a
//! clear message and is left as it was; SIGTERM drains in-flight requests
//! and exits 0.

mod common;

use common::backend::{Event, TestBackend};
use common::fencegate::{Backend, Fencegate, run_with_config};
use common::raw::{RawClient, RawRequest};
use std::sync::Arc;

/// The config flags are for `serve` and `fences`; the other commands read
/// no config, and refuse them rather than run without what was asked.
#[test]
fn the_config_flags_are_refused_where_nothing_reads_them() {
    for args in [
        &["lock", "--etcd", "http://127.0.0.1:1", "x", "--", "true"][..],
        &["credentials", "--token", "1"][..],
        &[
            "bench",
            "--endpoint",
            "http://127.0.0.1:1",
            "--requests",
            "1",
        ][..],
    ] {
        let (code, stderr) = run_with_config("", args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--config"), "{args:?}: {stderr}");
    }
    // `bench sink` has a --listen of its own, which it reads.
    let mut sink = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(["bench", "sink", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(sink.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = sink.kill();
    let _ = sink.wait();
    assert!(line.starts_with("sink listening "), "{line:?}");
}

#[test]
fn bad_config_exits_2_naming_the_field() {
    let cases = [
        (
            "[server]\nlisten_adress = \"127.0.0.1:1\"\n",
            "listen_adress",
        ),
        ("[server]\nlisten = \"not an address\"\n", "listen"),
        ("[fence]\nadmission_wait_ms = -5\n", "admission_wait_ms"),
        (
            "[fence]\nadmission_wait_ms = 0\n",
            "fence.admission_wait_ms",
        ),
        ("[backend]\nkind = \"s3\"\n", "backend.endpoint"),
        ("[backend]\nkind = \"ftp\"\n", "kind"),
        (
            "[[rules]]\nbucket = \"b\"\nprefix = \"p/\"\nmode = \"shared\"\n",
            "rules[0].resource",
        ),
        ("[server]\nlisten = \"0.0.0.0:9000\"\n", "server.listen"),
        ("[server]\nthreads = 5000\n", "server.threads"),
    ];
    for (config, field) in cases {
        let (code, stderr) = run_with_config(config, &[]);
        assert_eq!(code, Some(2), "{config}: {stderr}");
        assert!(
            stderr.contains(field),
            "{config}: expected {field} in {stderr}"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(["--config", "/nonexistent/fencegate.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Bad values that start-up used to find only once it had begun (after
/// the fence table, etcd or the ports), and then exit 1, which the systemd
/// unit restarts forever: a short session key, a wildcard listener in
/// cluster mode without `cluster.advertise`, no backend keys. Each exits 2
/// naming its field, before anything starts.
#[test]
fn bad_values_found_before_start_up_exit_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let short = dir.path().join("short.key");
    std::fs::write(&short, "0123456789\n").unwrap();
    let server = |listen: &str| {
        format!(
            "[server]\nlisten = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n",
            data.display()
        )
    };
    let local = server("127.0.0.1:0");
    let s3 = "[backend]\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:1\"\n";
    let keys = "access_key_id = \"k\"\nsecret_access_key = \"s\"\n";
    let cases = [
        (
            format!("{local}[sessions]\nkey_file = \"{}\"\n", short.display()),
            "`sessions.key_file`",
        ),
        (
            format!(
                "{}{s3}{keys}[[credentials]]\naccess_key_id = \"operator\"\n\
                 secret_access_key = \"operator-secret\"\n\
                 [cluster]\netcd_endpoints = [\"http://127.0.0.1:1\"]\n",
                server("0.0.0.0:0")
            ),
            "`cluster.advertise`",
        ),
        (format!("{local}{s3}"), "`backend.access_key_id`"),
    ];
    let mut wrong = Vec::new();
    for (config, field) in cases {
        let _ = std::fs::remove_dir_all(&data);
        let path = dir.path().join("c.toml");
        std::fs::write(&path, &config).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .arg("--config")
            .arg(&path)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Without the check, the cluster case waits on etcd: a limit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        let code = status.and_then(|s| s.code());
        if code != Some(2) || !stderr.contains(field) || data.exists() {
            let began = data.exists();
            wrong.push(format!("{field}: exit {code:?}, began: {began}, {stderr}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn corrupt_store_stops_start_up_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let garbage = vec![0x5Au8; 100_000];
    std::fs::write(data.join("fences.redb"), &garbage).unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n",
        data.display()
    );
    let (code, stderr) = run_with_config(&config, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("fences.redb"), "{stderr}");
    assert!(stderr.contains("damaged or unreadable"), "{stderr}");
    assert_eq!(std::fs::read(data.join("fences.redb")).unwrap(), garbage);
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_then_exits_0() {
    let be = TestBackend::start().await;
    be.stall_after_body(7);
    let mut fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = Arc::new(RawClient::new(&fg.endpoint()));
    let inflight = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "data").token(7)).await })
    };
    be.wait_for("the write at the backend", |ev| {
        ev.iter().any(|e| matches!(e, Event::BodyComplete { .. }))
    })
    .await;
    let pid = fg.pid();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    // The process is draining; let the backend answer.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    be.release(7);
    let r = inflight.await.unwrap().unwrap();
    assert_eq!(r.status, 200);
    let code = tokio::task::spawn_blocking(move || fg.terminate())
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}

/// A kept-alive connection with no request in flight is closed at
/// SIGTERM, on the S3 port and the admin port alike: fencegate exits
/// without waiting out its 30 s bound for them.
#[test]
fn sigterm_closes_idle_kept_alive_connections() {
    use std::io::{Read, Write};
    let mut fg = Fencegate::start(Backend::Embedded, "");
    let idle: Vec<std::net::TcpStream> = [fg.s3, fg.admin]
        .into_iter()
        .map(|addr| {
            let mut sock = std::net::TcpStream::connect(addr).unwrap();
            sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut head = [0u8; 12];
            sock.read_exact(&mut head).unwrap();
            assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
            sock
        })
        .collect();
    assert_eq!(fg.terminate(), Some(0));
    let logs = fg.logs();
    assert!(logs.contains("stopped"), "{logs}");
    assert!(!logs.contains("did not finish"), "{logs}");
    drop(idle);
}

#[tokio::test]
async fn health_endpoint_on_the_admin_listener() {
    let fg = Fencegate::start(Backend::Embedded, "");
    let raw = RawClient::new(&format!("http://{}", fg.admin));
    let r = raw
        .send(RawRequest::new(http::Method::GET, "/healthz"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // The S3 port does not serve it (it is an unsigned request there).
    let s3 = reqwest_free_get(&fg.endpoint(), "/healthz").await;
    assert_eq!(s3, 403);
}

/// An unsigned GET, by hand.
async fn reqwest_free_get(base: &str, path: &str) -> u16 {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("{base}{path}").parse().unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}
