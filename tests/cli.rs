//! Start-up and shutdown as an operator sees them: bad config stops start-up
//! with exit code 2 naming the field; a damaged fence table stops it with a
//! clear message and is left as it was; SIGTERM drains in-flight requests
//! and exits 0.

mod common;

use common::backend::{Event, TestBackend};
use common::fencegate::{Backend, Fencegate, run_with_config};
use common::raw::{RawClient, RawRequest};
use std::sync::Arc;

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
