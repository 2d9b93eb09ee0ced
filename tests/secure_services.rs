//! The coordination plane as production runs it (docs/lock-services.md,
//! "TLS and passwords"): etcd with mutual TLS and RBAC users, Redis on a
//! TLS-only port with an ACL user, PostgreSQL with `ssl=on` and SCRAM,
//! ZooKeeper demanding SASL DIGEST-MD5 and serving TLS. Each server first shows that it
//! refuses a plain or anonymous client; then `fencegate lock`, eager
//! fencing and cluster mode work over it; each wrong password or
//! certificate fails with the service, the endpoint and the reason; and no
//! password shows in any log line, error or `/metrics`.

mod common;

use common::fencegate::{Backend, Fencegate};
use common::lock_holder::{Holder, fence, run_lock_at, wait_for_eager, wait_for_fence_above};
use common::postgres::Postgres;
use common::secure::{
    PASSWORD, PG_SSL_ARGS, Pki, ROOT_PASSWORD, SecureEtcd, SecureRedis, USER, postgres_tls_files,
    redis_cli, zookeeper_secure,
};
use common::zookeeper::ZooKeeper;
use common::{ensure_bucket, put_with_token, sdk};
use std::process::{Command, Output};

/// Every key under `orders/` shares the resource `orders`.
const RULE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"orders/\"\nmode = \"shared\"\nresource = \"orders\"\n";

fn p(pki: &Pki, name: &str) -> String {
    pki.path(name).display().to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `fencegate lock SERVICE FLAGS orders -- echo $FENCING_TOKEN`.
fn lock(service: &[String], flags: &[String]) -> Output {
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(["--timeout", "20", "--ttl", "3"]);
    let name = match service[0].as_str() {
        "--zookeeper" => "/locks/orders",
        _ => "orders",
    };
    run_lock_at(service, name, &args, &["sh", "-c", "echo $FENCING_TOKEN"])
}

/// The lock was taken: a token came out.
fn took(o: &Output) -> u64 {
    assert!(o.status.success(), "fencegate lock failed: {}", stderr(o));
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("a token")
}

/// The lock was not taken (exit 69) and stderr names what and why, with
/// no password in it.
fn refused(o: &Output, wants: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(69), "expected exit 69: {e}");
    for w in wants {
        assert!(e.contains(w), "stderr lacks {w:?}: {e}");
    }
    assert_no_secret(&e);
}

fn assert_no_secret(text: &str) {
    for s in [PASSWORD, ROOT_PASSWORD, "not-the-password"] {
        assert!(!text.contains(s), "a secret leaked: {text}");
    }
}

fn with(flags: &[String], name: &str, value: &str) -> Vec<String> {
    let mut f = flags.to_vec();
    let i = f.iter().position(|x| x == name).expect("flag present");
    f[i + 1] = value.to_string();
    f
}

/// With the good flags, `fencegate lock` at `service` takes the lock
/// twice with rising tokens; with the wrong password, and with a CA that
/// did not sign the server's certificate, it exits 69 naming `endpoint`
/// and the reason.
fn takes_and_refuses(service: &[String], pki: &Pki, endpoint: &str, wrong: &str, rogue: &str) {
    let good = pki.lock_flags();
    let a = took(&lock(service, &good));
    let b = took(&lock(service, &good));
    assert!(a < b, "tokens rise: {a} then {b}");
    let password = with(&good, "--password-file", &p(pki, "wrong-password"));
    refused(&lock(service, &password), &[endpoint, wrong]);
    let ca = with(&good, "--ca-file", &p(pki, "rogue-ca.pem"));
    refused(&lock(service, &ca), &[endpoint, rogue]);
}

fn etcd_service(etcd: &SecureEtcd) -> Vec<String> {
    vec!["--etcd".into(), etcd.endpoints.join(",")]
}

#[test]
fn etcd_demands_tls_and_a_password_and_fencegate_lock_meets_both() {
    let pki = Pki::new();
    let etcd = SecureEtcd::start(&pki);
    let first = etcd.endpoints[0].clone();
    // The server is what the test says: plain and anonymous are refused.
    let plain = first.replace("https://", "http://");
    let o = Command::new("etcdctl")
        .args(["--endpoints", &plain, "--dial-timeout", "2s", "get", "x"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "plain etcdctl was served");
    let o = Command::new("etcdctl")
        .args(["--endpoints", &first, "--cacert", &p(&pki, "ca.pem")])
        .args(["--dial-timeout", "2s", "get", "x"])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "etcdctl without a client certificate was served"
    );
    let o = etcd.ctl(
        &pki,
        &["--user", "fencegate:not-the-password"],
        &["get", "x"],
    );
    assert!(!o.status.success(), "a wrong password was accepted");

    let service = etcd_service(&etcd);
    let good = pki.lock_flags();
    takes_and_refuses(
        &service,
        &pki,
        "etcd https://127.0.0.1",
        "user or password",
        "certificate",
    );
    let rogue_client = with(
        &with(&good, "--cert-file", &p(&pki, "rogue-client.pem")),
        "--key-file",
        &p(&pki, "rogue-client-key.pem"),
    );
    refused(
        &lock(&service, &rogue_client),
        &["etcd https://127.0.0.1", "client certificate"],
    );
    let expired_client = with(
        &with(&good, "--cert-file", &p(&pki, "expired-client.pem")),
        "--key-file",
        &p(&pki, "expired-client-key.pem"),
    );
    refused(
        &lock(&service, &expired_client),
        &["etcd https://127.0.0.1"],
    );
    let plain_service = vec!["--etcd".to_string(), plain];
    let no_tls: Vec<String> = good[6..].to_vec(); // --user and --password-file only
    refused(
        &lock(&plain_service, &no_tls),
        &["etcd http://127.0.0.1", "write https://"],
    );
}

#[test]
fn redis_demands_tls_and_an_acl_user_and_fencegate_lock_meets_both() {
    let pki = Pki::new();
    let redis = SecureRedis::start(&pki);
    let out = redis_cli(
        redis.port,
        &[],
        &["--user", USER, "--pass", PASSWORD],
        &["PING"],
    );
    assert!(!out.contains("PONG"), "plain redis-cli was served: {out}");
    let out = redis.cli(&pki, &[], &["PING"]);
    assert!(
        out.contains("NOAUTH"),
        "anonymous redis-cli was served: {out}"
    );

    let service = vec!["--redis".to_string(), redis.url.clone()];
    let good = pki.lock_flags();
    takes_and_refuses(
        &service,
        &pki,
        "redis rediss://127.0.0.1",
        "user or password",
        "certificate",
    );
    let plain = vec![
        "--redis".to_string(),
        redis.url.replace("rediss://", "redis://"),
    ];
    refused(
        &lock(&plain, &good[6..]),
        &["redis redis://127.0.0.1", "rediss://"],
    );
    // A password in the URL works, and never shows in a message.
    let inline = |pw: &str| {
        let url = redis
            .url
            .replace("rediss://", &format!("rediss://{USER}:{pw}@"));
        vec!["--redis".to_string(), url]
    };
    let ca = good[..2].to_vec();
    took(&lock(&inline(PASSWORD), &ca));
    refused(
        &lock(&inline("not-the-password"), &ca),
        &["redis rediss://fencegate:***@127.0.0.1", "user or password"],
    );
}

fn secure_postgres(pki: &Pki) -> Postgres {
    let pg = Postgres::start_with(|data| postgres_tls_files(pki, data), PG_SSL_ARGS);
    let made = pg.psql(&format!(
        "CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'; GRANT ALL ON SCHEMA public TO {USER}; SELECT 'made'"
    ));
    assert!(made.contains("made"), "role not made: {made}");
    pg
}

#[test]
fn postgres_demands_tls_and_scram_and_fencegate_lock_meets_both() {
    let pki = Pki::new();
    let pg = secure_postgres(&pki);
    let port = pg.port();
    let psql = |conninfo: &str| {
        Command::new(pg.psql_bin())
            .arg(conninfo)
            .args(["-Atc", "SELECT 1"])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .unwrap()
    };
    let o = psql(&format!(
        "host=127.0.0.1 port={port} user={USER} dbname=postgres sslmode=disable"
    ));
    assert!(!o.status.success(), "a plain connection was served");
    assert!(stderr(&o).contains("no encryption"), "{}", stderr(&o));
    let o = psql(&format!(
        "host=127.0.0.1 port={port} user={USER} dbname=postgres sslmode=require"
    ));
    assert!(
        o.status.success(),
        "psql over TLS with the password: {}",
        stderr(&o)
    );

    let url = format!("postgres://127.0.0.1:{port}/postgres?sslmode=verify-full");
    let service = vec!["--postgres".to_string(), url.clone()];
    let good = pki.lock_flags();
    takes_and_refuses(
        &service,
        &pki,
        "postgres postgres://127.0.0.1",
        "28P01",
        "UnknownIssuer",
    );
    let plain = vec![
        "--postgres".to_string(),
        url.replace("verify-full", "disable"),
    ];
    refused(
        &lock(&plain, &good[6..]),
        &["postgres postgres://127.0.0.1", "no encryption"],
    );
}

#[test]
fn zookeeper_demands_sasl_and_tls_and_fencegate_lock_meets_both() {
    let pki = Pki::new();
    let secure_port = common::free_port();
    let zk = ZooKeeper::start_with(zookeeper_secure(&pki, secure_port));
    let plain = vec!["--zookeeper".to_string(), zk.connect.clone()];
    let sasl: Vec<String> = pki.lock_flags()[6..].to_vec();
    // Without SASL the server closes the session.
    let o = lock(&plain, &[]);
    assert_ne!(o.status.code(), Some(0), "an anonymous session was served");
    let a = took(&lock(&plain, &sasl));
    let wrong = with(&sasl, "--password-file", &p(&pki, "wrong-password"));
    refused(&lock(&plain, &wrong), &["zookeeper 127.0.0.1", "SASL"]);

    // TLS on the secure port, with SASL on top.
    let tls = format!("tcp+tls://127.0.0.1:{secure_port}");
    let service = vec!["--zookeeper".to_string(), tls.clone()];
    let b = took(&lock(&service, &pki.lock_flags()));
    assert!(a < b, "tokens rise: {a} then {b}");
    let endpoint = format!("zookeeper {tls}");
    let rogue_ca = with(&pki.lock_flags(), "--ca-file", &p(&pki, "rogue-ca.pem"));
    refused(&lock(&service, &rogue_ca), &[&endpoint, "TLS session"]);
    let no_client_cert = [pki.lock_flags()[..2].to_vec(), sasl.clone()].concat();
    refused(
        &lock(&service, &no_client_cert),
        &[&endpoint, "TLS session"],
    );
    let no_ca = sasl.clone();
    refused(&lock(&service, &no_ca), &[&endpoint, "needs ca_file"]);
    // A plain client on the TLS port gets no session.
    let plain_on_tls = vec![
        "--zookeeper".to_string(),
        format!("127.0.0.1:{secure_port}"),
    ];
    assert_ne!(lock(&plain_on_tls, &sasl).status.code(), Some(0));
}

/// fencegate on the embedded store, fencing `orders` eagerly from `locks`
/// (a `[locks]` table, its access table and an `[[eager]]` entry).
async fn eager_fencegate(locks: &str) -> (Fencegate, aws_sdk_s3::Client) {
    let fg = Fencegate::start(Backend::Embedded, &format!("{RULE}\n{locks}"));
    let c = sdk(&fg.endpoint());
    ensure_bucket(&c, "demo").await;
    wait_for_eager(&fg, true).await;
    (fg, c)
}

/// A holder writes, pauses past its TTL; eager fencing over the secure
/// connection raises the fence; the holder is refused.
async fn holder_is_fenced_eagerly(
    fg: &Fencegate,
    c: &aws_sdk_s3::Client,
    service: &[String],
    name: &str,
) {
    let a = Holder::take_at(service, name, 2);
    put_with_token(c, "orders/log", "from A", a.token)
        .await
        .unwrap();
    a.pause();
    let raised = wait_for_fence_above(fg, a.token).await;
    assert!(raised > a.token);
    assert!(
        put_with_token(c, "orders/log", "A again", a.token)
            .await
            .is_err()
    );
    assert_eq!(fence(fg).await, Some(raised));
}

/// Everything fencegate printed and served: no password in any of it.
async fn assert_no_secret_served(fg: &Fencegate) {
    let metrics =
        common::http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    let fences = common::http_call("GET", &format!("http://{}/fences", fg.admin), None, None).await;
    let ready = common::http_call("GET", &format!("http://{}/readyz", fg.admin), None, None).await;
    for text in [fg.logs(), metrics.1, fences.1, ready.1] {
        assert_no_secret(&text);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn eager_fencing_and_cluster_mode_over_a_secure_etcd() {
    let pki = Pki::new();
    let etcd = SecureEtcd::start(&pki);
    let eps = etcd.endpoints_toml();
    let locks = format!(
        "[locks]\netcd_endpoints = {eps}\n\n{}\n[[eager]]\nresource = \"orders\"\netcd_lock = \"orders\"\n",
        pki.access_toml("locks.etcd_access")
    );
    let (fg, c) = eager_fencegate(&locks).await;
    let service = [etcd_service(&etcd), pki.lock_flags()].concat();
    holder_is_fenced_eagerly(&fg, &c, &service, "orders").await;
    assert_no_secret_served(&fg).await;

    // Cluster mode: a raise through one replica refuses a lower token at
    // the other, with the fences in the secure etcd.
    let be = common::backend::TestBackend::start().await;
    let cluster = format!(
        "{}\n{}",
        common::replicas::cluster_toml(&eps, "admission_wait_ms = 8000\n", 2000),
        pki.access_toml("cluster.etcd_access")
    );
    let replicas: Vec<Fencegate> = (0..2)
        .map(|_| {
            let server = format!("admin_token = \"{}\"\n", common::replicas::ADMIN);
            let fg = Fencegate::start_with(be.as_fencegate_backend(), &server, &cluster);
            common::wait_until(30, "the replica to be ready", || {
                common::replicas::ready_status(&fg) == 200
            });
            fg
        })
        .collect();
    let (a, b) = (sdk(&replicas[0].endpoint()), sdk(&replicas[1].endpoint()));
    ensure_bucket(&a, "demo").await;
    put_with_token(&a, "k", "new", 8).await.unwrap();
    let stale = put_with_token(&b, "k", "old", 7).await.unwrap_err();
    assert_eq!(stale.0, 409, "a lower token passed at the other replica");
    // The admin raise at one replica refuses at the other.
    let url = format!("http://{}/fences/demo%2Fk", replicas[1].admin);
    let admin = Some(common::replicas::ADMIN);
    let (s, body) = common::http_call("POST", &url, admin, Some(r#"{"token":20}"#)).await;
    assert_eq!(s, 200, "{body}");
    let stale = put_with_token(&a, "k", "fifteen", 15).await.unwrap_err();
    assert_eq!(
        stale.0, 409,
        "the admin raise did not reach the other replica"
    );
    for r in &replicas {
        assert_no_secret_served(r).await;
    }

    // A wrong password stops start-up, naming etcd and why.
    let bad = bad_config(&replicas[0], &pki);
    let (code, err) = start_fails(&bad);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("etcd https://127.0.0.1") && err.contains("user or password"),
        "{err}"
    );
    assert_no_secret(&err);
    // So does an expired client certificate, with no password to try.
    let expired: String = bad_config(&replicas[0], &pki)
        .replace(&p(&pki, "client.pem"), &p(&pki, "expired-client.pem"))
        .replace(
            &p(&pki, "client-key.pem"),
            &p(&pki, "expired-client-key.pem"),
        )
        .lines()
        .filter(|l| !l.starts_with("user =") && !l.starts_with("password_file ="))
        .map(|l| format!("{l}\n"))
        .collect();
    let (_, err) = start_fails(&expired);
    assert!(err.contains("client certificate"), "{err}");
}

/// Runs fencegate on `config`, expecting start-up to fail: its exit code
/// and stderr. Still running after 30 s, it is killed and the test fails.
fn start_fails(config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("--config")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap_or_default();
    assert!(
        code.is_some(),
        "fencegate started with a bad credential: {err}"
    );
    (code, err)
}

/// `fg`'s config with the wrong password file and a data directory of its
/// own.
fn bad_config(fg: &Fencegate, pki: &Pki) -> String {
    let text = std::fs::read_to_string(fg.config_path()).unwrap();
    let data = fg.dir.path().display().to_string();
    text.replace(&p(pki, "password"), &p(pki, "wrong-password"))
        .replace(&data, &p(pki, "bad-start"))
}

#[tokio::test(flavor = "multi_thread")]
async fn eager_fencing_over_secure_redis_postgres_and_zookeeper() {
    let pki = Pki::new();
    let good = pki.lock_flags();

    let redis = SecureRedis::start(&pki);
    let locks = format!(
        "[locks]\nredis = \"{}\"\n\n{}\n[[eager]]\nresource = \"orders\"\nredis_lock = \"orders\"\n",
        redis.url,
        pki.access_toml("locks.redis_access")
    );
    let (fg, c) = eager_fencegate(&locks).await;
    let service = [vec!["--redis".to_string(), redis.url.clone()], good.clone()].concat();
    holder_is_fenced_eagerly(&fg, &c, &service, "orders").await;
    assert_no_secret_served(&fg).await;
    let redis_bad = bad_config(&fg, &pki);
    drop(fg);

    let pg = secure_postgres(&pki);
    let url = format!(
        "postgres://127.0.0.1:{}/postgres?sslmode=verify-full",
        pg.port()
    );
    let locks = format!(
        "[locks]\npostgres = \"{url}\"\npostgres_poll_ms = 200\n\n{}\n[[eager]]\nresource = \"orders\"\npostgres_lock = \"orders\"\n",
        pki.access_toml("locks.postgres_access")
    );
    let (fg, c) = eager_fencegate(&locks).await;
    let service = [vec!["--postgres".to_string(), url], good.clone()].concat();
    holder_is_fenced_eagerly(&fg, &c, &service, "orders").await;
    assert_no_secret_served(&fg).await;
    drop(fg);

    let secure_port = common::free_port();
    let _zk = ZooKeeper::start_with(zookeeper_secure(&pki, secure_port));
    let tls = format!("tcp+tls://127.0.0.1:{secure_port}");
    let access = format!(
        "[locks.zookeeper_access]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\nuser = \"{USER}\"\npassword_env = \"FG_TEST_ZK_PASSWORD\"\n",
        p(&pki, "ca.pem"),
        p(&pki, "client.pem"),
        p(&pki, "client-key.pem"),
    );
    let locks = format!(
        "[locks]\nzookeeper = \"{tls}\"\nzookeeper_session_timeout_ms = 2000\n\n{access}\n[[eager]]\nresource = \"orders\"\nzookeeper_lock = \"/locks/orders\"\n"
    );
    let fg = Fencegate::start_env(
        Backend::Embedded,
        "",
        &format!("{RULE}\n{locks}"),
        &[("FG_TEST_ZK_PASSWORD", PASSWORD)],
    );
    let c = sdk(&fg.endpoint());
    ensure_bucket(&c, "demo").await;
    wait_for_eager(&fg, true).await;
    let service = [vec!["--zookeeper".to_string(), tls.clone()], good.clone()].concat();
    holder_is_fenced_eagerly(&fg, &c, &service, "/locks/orders").await;
    assert_no_secret_served(&fg).await;

    let zk_bad = bad_config(&fg, &pki).replace(
        "password_env = \"FG_TEST_ZK_PASSWORD\"",
        &format!("password_file = \"{}\"", p(&pki, "wrong-password")),
    );

    // A refused password stops start-up, naming the service and why.
    for (config, wants) in [
        (redis_bad, ["redis rediss://127.0.0.1", "user or password"]),
        (zk_bad, ["zookeeper tcp+tls://127.0.0.1", "SASL"]),
    ] {
        let (code, err) = start_fails(&config);
        assert_ne!(code, Some(0), "started with a bad credential");
        for w in wants {
            assert!(err.contains(w), "start-up error lacks {w:?}: {err}");
        }
        assert_no_secret(&err);
    }
}
