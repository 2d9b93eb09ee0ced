//! Operating fencegate: raising a fence by hand through the admin API (and
//! `fencegate fences`), Prometheus metrics that count exactly what happened,
//! request logs, and limits answered with S3 errors.

mod common;

use common::backend::TestBackend;
use common::fencegate::{DEMO_SECRET, Fencegate, LIMITED_SECRET};
use common::http_call;
use common::raw::{RawClient, RawRequest, Source};
use std::collections::HashMap;

const ADMIN_TOKEN: &str = "admin-token-for-tests-0123456789";

fn with_admin_token() -> String {
    format!("admin_token = \"{ADMIN_TOKEN}\"\n")
}

/// The admin API's URL for one (percent-encoded) resource's fence.
fn fence_url(fg: &Fencegate, r: &str) -> String {
    format!("http://{}/fences/{r}", fg.admin)
}

#[tokio::test]
async fn raise_by_hand_revokes_lower_holders_and_is_durable() {
    let be = TestBackend::start().await;
    let mut fg = Fencegate::start_with(be.as_fencegate_backend(), &with_admin_token(), "");
    let raw = RawClient::new(&fg.endpoint());
    assert_eq!(
        raw.send(RawRequest::put("/demo/k", "a").token(10))
            .await
            .unwrap()
            .status,
        200
    );
    raise_needs_the_admin_token_and_never_lowers(&fg, &raw).await;
    lookup_and_listing_show_the_fences(&fg, &raw).await;
    the_raise_survives_kill9(&mut fg).await;
    the_cli_raises_and_reads_fences(&fg);
}

/// Raises demo/k to 50 by hand: refused without the admin token, revokes a
/// lower holder, never lowers, and refuses a negative token.
async fn raise_needs_the_admin_token_and_never_lowers(fg: &Fencegate, raw: &RawClient) {
    let (s, _) = http_call(
        "POST",
        &fence_url(fg, "demo%2Fk"),
        None,
        Some(r#"{"token":50}"#),
    )
    .await;
    assert_eq!(s, 401);
    let (s, _) = http_call(
        "POST",
        &fence_url(fg, "demo%2Fk"),
        Some("wrong-token-wrong-token"),
        Some(r#"{"token":50}"#),
    )
    .await;
    assert_eq!(s, 401);
    let (s, body) = http_call(
        "POST",
        &fence_url(fg, "demo%2Fk"),
        Some(ADMIN_TOKEN),
        Some(r#"{"token":50}"#),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let r = raw
        .send(RawRequest::put("/demo/k", "b").token(49))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    assert_eq!(r.headers["x-fencing-highest-token"], "50");
    // Never lowers.
    let (s, body) = http_call(
        "POST",
        &fence_url(fg, "demo%2Fk"),
        Some(ADMIN_TOKEN),
        Some(r#"{"token":40}"#),
    )
    .await;
    assert_eq!(s, 409);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["highest"],
        50
    );
    let (s, _) = http_call(
        "POST",
        &fence_url(fg, "demo%2Fk"),
        Some(ADMIN_TOKEN),
        Some(r#"{"token":-1}"#),
    )
    .await;
    assert_eq!(s, 400);
}

/// Looks demo/k's fence up, then lists three fences under demo/p/ in pages.
async fn lookup_and_listing_show_the_fences(fg: &Fencegate, raw: &RawClient) {
    let (s, body) = http_call("GET", &fence_url(fg, "demo%2Fk"), None, None).await;
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["resource"].as_str(), v["highest"].as_u64()),
        (Some("demo/k"), Some(50))
    );
    assert!(v["raised_at_ms"].as_u64().unwrap() > 0);
    for k in ["a", "b", "c"] {
        raw.send(RawRequest::put(&format!("/demo/p/{k}"), "x").token(1))
            .await
            .unwrap();
    }
    let (_, body) = http_call(
        "GET",
        &format!("http://{}/fences?prefix=demo/p/&limit=2", fg.admin),
        None,
        None,
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["fences"].as_array().unwrap().len(), 2);
    assert_eq!(v["next_after"], "demo/p/b");
    let (_, body) = http_call(
        "GET",
        &format!("http://{}/fences?prefix=demo/p/&after=demo/p/b", fg.admin),
        None,
        None,
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["fences"][0]["resource"], "demo/p/c");
    assert_eq!(v["fences"].as_array().unwrap().len(), 1);
}

/// Kills fencegate with -9, restarts it, and checks demo/k is still at 50.
async fn the_raise_survives_kill9(fg: &mut Fencegate) {
    fg.kill9_and_restart();
    let raw = RawClient::new(&fg.endpoint());
    let r = raw
        .send(RawRequest::put("/demo/k", "b").token(49))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    let (_, body) = http_call("GET", &fence_url(fg, "demo%2Fk"), None, None).await;
    assert!(body.contains("\"highest\":50"), "{body}");
}

/// Does the same from the shell with `fencegate fences`: raise, refuse a
/// lower raise or one without a token, get and list.
fn the_cli_raises_and_reads_fences(fg: &Fencegate) {
    let admin = format!("http://{}", fg.admin);
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["fences", "--admin", &admin])
            .args(args)
            .env_remove("FENCEGATE_ADMIN_TOKEN")
            .output()
            .unwrap()
    };
    let out = cli(&["--admin-token", ADMIN_TOKEN, "raise", "demo/k", "60"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["--admin-token", ADMIN_TOKEN, "raise", "demo/k", "55"]);
    assert!(!out.status.success());
    let out = cli(&["raise", "demo/k", "70"]);
    assert!(!out.status.success(), "no token, no raise");
    let out = cli(&["get", "demo/k"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"highest\":60"));
    let out = cli(&["list", "--prefix", "demo/p/"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("demo/p/c"));
}

/// Parses Prometheus text into `name{sorted labels}` -> value.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let key = match series.split_once('{') {
            None => series.to_string(),
            Some((name, labels)) => {
                let labels = labels
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels {line:?}"));
                let mut parts: Vec<&str> = labels.split(',').collect();
                parts.sort();
                format!("{name}{{{}}}", parts.join(","))
            }
        };
        assert!(
            out.insert(key, value).is_none(),
            "duplicate series {line:?}"
        );
    }
    out
}

#[tokio::test]
async fn metrics_count_exactly_what_happened() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let url = format!("http://{}/metrics", fg.admin);
    raw.send(RawRequest::put("/demo/k", "a").token(34))
        .await
        .unwrap();
    let (s, before) = http_call("GET", &url, None, None).await;
    assert_eq!(s, 200);
    let before = parse_metrics(&before);

    assert_eq!(
        raw.send(RawRequest::put("/demo/k", "b").token(33))
            .await
            .unwrap()
            .status,
        409
    );
    assert_eq!(
        raw.send(RawRequest::put("/demo/k", "c").token(35))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        raw.send(RawRequest::put("/demo/k", "d"))
            .await
            .unwrap()
            .status,
        428
    );

    let (_, after) = http_call("GET", &url, None, None).await;
    let after = parse_metrics(&after);
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let req = |outcome: &str| {
        format!("fencegate_requests_total{{op=\"PutObject\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(delta(&req("stale")), 1.0);
    assert_eq!(delta(&req("forwarded")), 1.0);
    assert_eq!(delta(&req("missing")), 1.0);
    assert_eq!(delta("fencegate_fence_raises_total"), 1.0);
    assert_eq!(after["fencegate_inflight_writes"], 0.0);
    // Refused requests are answered before their bodies are read.
    assert_eq!(
        delta("fencegate_bytes_in_total"),
        1.0,
        "one forwarded one-byte body"
    );
    assert!(after.contains_key("fencegate_upstream_seconds_count"));
    assert!(after.contains_key("fencegate_admission_wait_seconds_bucket{le=\"0.001\"}"));
}

/// The in-flight gauge counts a write from its admission until the
/// backend answered it (each serving thread keeps its own count; a scrape
/// adds them up).
#[tokio::test]
async fn the_inflight_gauge_counts_a_write_the_backend_holds() {
    use common::backend::Event;
    let be = TestBackend::start().await;
    be.stall_after_body(7);
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let url = format!("http://{}/metrics", fg.admin);
    let inflight = || async {
        let (s, text) = http_call("GET", &url, None, None).await;
        assert_eq!(s, 200);
        parse_metrics(&text)["fencegate_inflight_writes"]
    };
    assert_eq!(inflight().await, 0.0);
    let raw = std::sync::Arc::new(RawClient::new(&fg.endpoint()));
    let write = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "data").token(7)).await })
    };
    be.wait_for("the write at the backend", |ev| {
        ev.iter().any(|e| matches!(e, Event::BodyComplete { .. }))
    })
    .await;
    assert_eq!(inflight().await, 1.0);
    be.release(7);
    assert_eq!(write.await.unwrap().unwrap().status, 200);
    // Let go when the answer's body ends, which can be just after the
    // client read it.
    for _ in 0..100 {
        if inflight().await == 0.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the write is still counted in flight after its answer");
}

#[tokio::test]
async fn one_warn_line_per_refused_write_and_no_secret_in_logs() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start_with(be.as_fencegate_backend(), &with_admin_token(), "");
    let raw = RawClient::new(&fg.endpoint());
    raw.send(RawRequest::put("/demo/k", "a").token(34))
        .await
        .unwrap();
    raw.send(RawRequest::put("/demo/k", "b").token(33))
        .await
        .unwrap();
    let mut bad = RawRequest::put("/demo/k", "c").token(35);
    bad.secret = "a-wrong-secret-that-must-not-be-logged".into();
    raw.send(bad).await.unwrap();
    http_call(
        "POST",
        &format!("http://{}/fences/x", fg.admin),
        Some(ADMIN_TOKEN),
        Some(r#"{"token":1}"#),
    )
    .await;
    let logs = fg.logs();
    let warns: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("demo"))
        .collect();
    assert_eq!(warns.len(), 1, "{logs}");
    assert!(
        warns[0].contains("token=\"33\"") && warns[0].contains("highest=\"34\""),
        "{}",
        warns[0]
    );
    for secret in [
        DEMO_SECRET,
        LIMITED_SECRET,
        "backend-secret-never-logged",
        "a-wrong-secret-that-must-not-be-logged",
        ADMIN_TOKEN,
    ] {
        assert!(!logs.contains(secret), "secret {secret:?} in logs:\n{logs}");
    }
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "[log]\nformat = \"json\"\n");
    let raw = RawClient::new(&fg.endpoint());
    raw.send(RawRequest::put("/demo/k", "a").token(34))
        .await
        .unwrap();
    raw.send(RawRequest::put("/demo/k", "a").token(33))
        .await
        .unwrap();
    let logs = fg.logs();
    let mut stale = 0;
    for line in logs.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["decision"] == "stale" {
            assert_eq!(v["level"], "WARN");
            assert_eq!(v["fields"]["token"], "33");
            assert_eq!(v["fields"]["highest"], "34");
            stale += 1;
        }
    }
    assert_eq!(stale, 1);
}

#[tokio::test]
async fn limits_are_answered_with_s3_errors_and_others_keep_being_served() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start_with(
        be.as_fencegate_backend(),
        "max_header_bytes = 2048\nrequest_timeout_ms = 500\nmax_connections = 3\n",
        "",
    );
    let raw = RawClient::new(&fg.endpoint());

    let big = "v".repeat(4000);
    let r = raw
        .send(
            RawRequest::put("/demo/h", "x")
                .token(1)
                .header("x-amz-meta-big", &big),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("RequestHeaderSectionTooLarge"))
    );

    // A client that stops sending its body.
    let (tx, source) = Source::channel(10);
    let mut slow = RawRequest::new(http::Method::PUT, "/demo/slow").token(1);
    slow.body = Some(source);
    tx.send(bytes::Bytes::from_static(b"12345")).await.unwrap();
    let r = raw.send(slow).await;
    drop(tx);
    match r {
        Ok(r) => assert_eq!((r.status, r.code()), (400, Some("RequestTimeout"))),
        Err(e) => panic!("expected a 400 RequestTimeout, got {e}"),
    }
    assert!(be.object("demo", "slow").is_none());

    // Connections beyond the limit get 503 SlowDown; the others are served.
    // Close this test's own connections first, then hold exactly the limit.
    drop(raw);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let idle1 = tokio::net::TcpStream::connect(fg.s3).await.unwrap();
    let idle2 = tokio::net::TcpStream::connect(fg.s3).await.unwrap();
    let idle3 = tokio::net::TcpStream::connect(fg.s3).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let fresh = RawClient::new(&fg.endpoint());
    let r = fresh
        .send(RawRequest::put("/demo/over", "x").token(1))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (503, Some("SlowDown")));
    drop((idle1, idle2, idle3));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let fresh = RawClient::new(&fg.endpoint());
    let r = fresh
        .send(RawRequest::put("/demo/ok", "x").token(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let be = TestBackend::start().await;
    let fg = Fencegate::start_with(be.as_fencegate_backend(), "idle_timeout_ms = 300\n", "");
    // Sends half a header section, then nothing.
    let mut sock = tokio::net::TcpStream::connect(fg.s3).await.unwrap();
    sock.write_all(b"GET /demo/k HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    // Generous bound: the assertion is that the server hangs up at all.
    let n = tokio::time::timeout(std::time::Duration::from_secs(20), sock.read(&mut buf))
        .await
        .expect("the idle connection was not closed")
        .unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.starts_with("HTTP/1.1 408"), "{answer}");
    // The server still serves others.
    let raw = RawClient::new(&fg.endpoint());
    let r = raw
        .send(RawRequest::put("/demo/k", "x").token(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
}
