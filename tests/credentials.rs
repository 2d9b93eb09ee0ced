//! Session credentials that carry a fencing token (CONTRACT §10,
//! docs/credentials.md): a program signs with them and changes nothing
//! else, and every request it makes carries the credential's token.
//!
//! - aws-sdk-s3 with only the credential (no header, no metadata): its
//!   writes are stamped with the credential's token, and an older
//!   credential's writes are `409 StaleFencingToken`; presigned URLs made
//!   with them carry the token too;
//! - a request whose own token differs from its credential's is `400`;
//! - expired (`400 ExpiredToken`), altered (`403 InvalidToken`), wrong
//!   secret (`403 SignatureDoesNotMatch`) and out of scope
//!   (`403 AccessDenied`, also a listing and one key of a DeleteObjects);
//! - neither the secret nor the session token is in the log, an error
//!   body, `/metrics` or `/fences`.
//!
//! With `FENCEGATE_UNSAFE_SESSION_NO_TOKEN=1` (the credential's token
//! ignored) the first test fails: the writes carry no token and are
//! refused `428`.

mod common;

use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use common::fencegate::{Backend, Fencegate};
use serde_json::Value;
use std::time::Duration;

pub const ADMIN: &str = "credentials-admin-token-0123";

/// Every key under `jobs/` shares one fence, as a job's prefix should
/// (docs/credentials.md); the rest of `demo` is per object.
const RULES: &str =
    "[[rules]]\nbucket = \"demo\"\nprefix = \"jobs/\"\nmode = \"shared\"\nresource = \"jobs\"\n";

fn start() -> Fencegate {
    let server = format!("admin_token = \"{ADMIN}\"\n");
    Fencegate::start_with(Backend::Embedded, &server, RULES)
}

/// Credentials issued by `fg`'s admin API for `token`.
async fn issue(fg: &Fencegate, token: u64, scope: &[&str], ttl: Option<u64>) -> Value {
    let url = format!("http://{}/credentials", fg.admin);
    let ask =
        serde_json::json!({"token": token, "lock": "nightly", "scope": scope, "ttl_secs": ttl});
    let (status, body) = common::http_call("POST", &url, Some(ADMIN), Some(&ask.to_string())).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn client_of(fg: &Fencegate, c: &Value) -> aws_sdk_s3::Client {
    let s = |k: &str| c[k].as_str().unwrap().to_string();
    client_with(
        fg,
        &s("AccessKeyId"),
        &s("SecretAccessKey"),
        &s("SessionToken"),
    )
}

fn client_with(fg: &Fencegate, key: &str, secret: &str, token: &str) -> aws_sdk_s3::Client {
    let creds = Credentials::new(key, secret, Some(token.to_string()), None, "session");
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version_latest()
        .endpoint_url(fg.endpoint())
        .region(Region::new("us-east-1"))
        .credentials_provider(creds)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

async fn put(c: &aws_sdk_s3::Client, key: &str, body: &str) -> Result<(), (u16, String)> {
    let r = c
        .put_object()
        .bucket("demo")
        .key(key)
        .body(ByteStream::from(body.as_bytes().to_vec()))
        .send()
        .await;
    r.map(|_| ()).map_err(|e| {
        let status = e.raw_response().map_or(0, |r| r.status().as_u16());
        (status, e.code().unwrap_or_default().to_string())
    })
}

async fn stamp(fg: &Fencegate, key: &str) -> Option<String> {
    let head = common::sdk(&fg.endpoint())
        .head_object()
        .bucket("demo")
        .key(key);
    let got = head.send().await.unwrap();
    got.metadata().and_then(|m| m.get("fencing-token").cloned())
}

#[tokio::test]
async fn a_session_credential_carries_its_token_on_every_request() {
    let fg = start();
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    let a = issue(&fg, 33, &["demo/jobs/"], None).await;
    let b = issue(&fg, 34, &["demo/jobs/"], None).await;
    assert!(a["AccessKeyId"].as_str().unwrap().starts_with("FGS"));
    let (ca, cb) = (client_of(&fg, &a), client_of(&fg, &b));

    // A writes with 33, B with 34: the job's fence is 34 now.
    put(&ca, "jobs/part-1", "by A").await.unwrap();
    assert_eq!(stamp(&fg, "jobs/part-1").await.as_deref(), Some("33"));
    put(&cb, "jobs/part-2", "by B").await.unwrap();
    assert_eq!(stamp(&fg, "jobs/part-2").await.as_deref(), Some("34"));
    // A, the zombie, is refused on every key of the job, also new ones.
    assert_eq!(
        put(&ca, "jobs/part-3", "by A").await,
        Err((409, "StaleFencingToken".into()))
    );
    let del = ca
        .delete_object()
        .bucket("demo")
        .key("jobs/part-2")
        .send()
        .await;
    assert_eq!(del.unwrap_err().code(), Some("StaleFencingToken"));

    // A presigned URL made with B's credential carries 34 too.
    let presigned = cb
        .put_object()
        .bucket("demo")
        .key("jobs/presigned")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    assert!(presigned.uri().contains("X-Amz-Security-Token="));
    let (status, body) = common::http_call("PUT", presigned.uri(), None, Some("x")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stamp(&fg, "jobs/presigned").await.as_deref(), Some("34"));
    // And A's presigned URL is as stale as A.
    let stale = ca.put_object().bucket("demo").key("jobs/p2");
    let stale = stale.presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap());
    let (status, _) = common::http_call("PUT", stale.await.unwrap().uri(), None, Some("x")).await;
    assert_eq!(status, 409);

    // A token of its own: the same one passes, another is refused.
    let same = cb
        .put_object()
        .bucket("demo")
        .key("jobs/same")
        .metadata("fencing-token", "34")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    assert!(same.is_ok(), "{same:?}");
    let other = cb
        .put_object()
        .bucket("demo")
        .key("jobs/other")
        .metadata("fencing-token", "35")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    let e = other.unwrap_err();
    assert_eq!(e.raw_response().unwrap().status().as_u16(), 400);
    assert_eq!(e.code(), Some("InvalidFencingToken"));
    assert!(e.message().unwrap_or_default().contains("nightly"), "{e:?}");
}

/// Asserts a refusal is AccessDenied and names the scope and the lock.
fn names_scope(e: &dyn ProvideErrorMetadata) {
    assert_eq!(e.code(), Some("AccessDenied"));
    let m = e.message().unwrap_or_default();
    assert!(
        m.contains("outside the scope") && m.contains("demo/jobs/"),
        "{m}"
    );
    assert!(m.contains("lock"), "{m}");
}

/// Client `ok`, scoped to `demo/jobs/`, is refused another prefix, another
/// bucket, a wider listing (v2 and v1), a DeleteObjects with one key out
/// of scope, and bucket administration; listings of its scope pass.
async fn out_of_scope_requests_are_refused(ok: &aws_sdk_s3::Client) {
    assert_eq!(
        put(ok, "elsewhere/x", "x").await,
        Err((403, "AccessDenied".into()))
    );
    // Each refusal names the scope and the lock, whatever it refuses.
    let other = ok
        .put_object()
        .bucket("other")
        .key("jobs/x")
        .body(ByteStream::from_static(b"x"));
    names_scope(&other.send().await.unwrap_err());
    let list = ok.list_objects_v2().bucket("demo").send().await;
    names_scope(&list.unwrap_err());
    let list = ok
        .list_objects_v2()
        .bucket("demo")
        .prefix("jobs/")
        .send()
        .await;
    assert!(list.is_ok(), "{list:?}");
    // A v1 listing carries its prefix and delimiter in a query of its own,
    // which is still a listing: held to the scope like one (it was once
    // taken for a bucket-configuration read, and answered).
    let list = ok
        .list_objects()
        .bucket("demo")
        .prefix("secret/")
        .delimiter("/")
        .send()
        .await;
    names_scope(&list.unwrap_err());
    let list = ok
        .list_objects()
        .bucket("demo")
        .prefix("jobs/")
        .send()
        .await;
    assert!(list.is_ok(), "{list:?}");
    use aws_sdk_s3::types::{Delete, ObjectIdentifier};
    let ids = ["jobs/a", "secret/b"].map(|k| ObjectIdentifier::builder().key(k).build().unwrap());
    let delete = Delete::builder()
        .set_objects(Some(ids.to_vec()))
        .build()
        .unwrap();
    let many = ok
        .delete_objects()
        .bucket("demo")
        .delete(delete)
        .send()
        .await;
    assert_eq!(many.unwrap_err().code(), Some("AccessDenied"));
    // Bucket administration is never a session credential's.
    let mb = ok.create_bucket().bucket("jobs-new").send().await;
    names_scope(&mb.unwrap_err());
    let rb = ok.delete_bucket().bucket("demo").send().await;
    names_scope(&rb.unwrap_err());
}

/// A wrong secret, an altered session token and another credential's
/// session token under access key `key` are each refused.
async fn wrong_secret_and_altered_or_swapped_tokens_are_refused(
    fg: &Fencegate,
    key: &str,
    secret: &str,
    token: &str,
) {
    // A wrong secret.
    let wrong = client_with(fg, key, &format!("{secret}x"), token);
    assert_eq!(
        put(&wrong, "jobs/x", "x").await,
        Err((403, "SignatureDoesNotMatch".into()))
    );
    // An altered session token: one character of its body changed.
    let mut altered = token.to_string().into_bytes();
    let i = token.find('.').unwrap() + 12;
    altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let bad = client_with(fg, key, secret, &altered);
    assert_eq!(
        put(&bad, "jobs/x", "x").await,
        Err((403, "InvalidToken".into()))
    );
    // Another credential's session token under this access key.
    let c2 = issue(fg, 8, &["demo/jobs/"], None).await;
    let swapped = client_with(fg, key, secret, c2["SessionToken"].as_str().unwrap());
    assert_eq!(
        put(&swapped, "jobs/x", "x").await,
        Err((403, "InvalidToken".into()))
    );
}

#[tokio::test]
async fn expired_altered_mismatched_and_out_of_scope_credentials_are_refused() {
    let fg = start();
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "other").await;
    let c = issue(&fg, 7, &["demo/jobs/"], None).await;
    let s = |k: &str| c[k].as_str().unwrap().to_string();
    let (key, secret, token) = (s("AccessKeyId"), s("SecretAccessKey"), s("SessionToken"));

    // Out of scope: another prefix, another bucket, a wider listing, one
    // key of a DeleteObjects.
    let ok = client_with(&fg, &key, &secret, &token);
    out_of_scope_requests_are_refused(&ok).await;

    // A wrong secret, an altered session token, a swapped one.
    wrong_secret_and_altered_or_swapped_tokens_are_refused(&fg, &key, &secret, &token).await;

    // Expired: a one-second credential, two seconds later.
    let short = issue(&fg, 9, &["demo/jobs/"], Some(1)).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        put(&client_of(&fg, &short), "jobs/x", "x").await,
        Err((400, "ExpiredToken".into()))
    );
    // The admin API refuses what it cannot issue.
    let url = format!("http://{}/credentials", fg.admin);
    let too_long = r#"{"token": 1, "ttl_secs": 999999}"#;
    let (status, _) = common::http_call("POST", &url, Some(ADMIN), Some(too_long)).await;
    assert_eq!(status, 400);
    let (status, _) = common::http_call("POST", &url, None, Some(r#"{"token": 1}"#)).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn no_secret_or_session_token_is_logged_or_shown() {
    let fg = start();
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    let c = issue(&fg, 5, &["demo/jobs/"], None).await;
    let s = |k: &str| c[k].as_str().unwrap().to_string();
    let (key, secret, token) = (s("AccessKeyId"), s("SecretAccessKey"), s("SessionToken"));
    let mut bodies = Vec::new();
    put(&client_of(&fg, &c), "jobs/a", "x").await.unwrap();
    // Refusals of every kind, their bodies kept.
    let wrong = client_with(&fg, &key, "not-the-secret", &token);
    for (client, k) in [(&wrong, "jobs/b"), (&client_of(&fg, &c), "out/b")] {
        let r = client
            .put_object()
            .bucket("demo")
            .key(k)
            .body(ByteStream::from_static(b"x"));
        let e = r.send().await.unwrap_err();
        let raw = e.raw_response().unwrap();
        bodies.push(String::from_utf8_lossy(raw.body().bytes().unwrap()).into_owned());
    }
    let admin = |path: &str| format!("http://{}/{path}", fg.admin);
    let metrics = common::http_call("GET", &admin("metrics"), None, None)
        .await
        .1;
    let fences = common::http_call("GET", &admin("fences"), None, None)
        .await
        .1;
    let seen = [fg.logs(), bodies.join("\n"), metrics, fences];
    assert!(seen[0].contains(&key), "the log names the access key id");
    // The token's body and MAC, and the secret, appear nowhere.
    let mac = token.rsplit('.').next().unwrap();
    for (i, text) in seen.iter().enumerate() {
        for needle in [secret.as_str(), token.as_str(), mac] {
            assert!(!text.contains(needle), "source {i} shows a secret: {text}");
        }
    }
}

/// Cluster mode: every replica holding the same issuing key verifies what
/// any replica issued, and the token a credential carries is fenced across
/// them. A replica without the key (sessions off) refuses them.
#[tokio::test]
async fn credentials_issued_by_one_replica_are_accepted_by_the_others() {
    use common::replicas::{TTL_MS, cluster_toml, ready_status};
    let etcd = common::etcd::Etcd::start();
    let be = common::backend::TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("session.key");
    std::fs::write(&key_file, "0123456789abcdef0123456789abcdef-shared-key\n").unwrap();
    let endpoints = format!("[\"{}\"]", etcd.endpoint);
    let server = format!("admin_token = \"{ADMIN}\"\n");
    let replica = |sessions: &str| {
        let toml = format!(
            "{}\n{sessions}{RULES}",
            cluster_toml(&endpoints, "", TTL_MS)
        );
        let fg = Fencegate::start_with(backend.clone(), &server, &toml);
        common::wait_until(20, "the replica to hold a lease", || {
            ready_status(&fg) == 200
        });
        fg
    };
    let with_key = format!("[sessions]\nkey_file = \"{}\"\n", key_file.display());
    let r: Vec<Fencegate> = (0..3).map(|_| replica(&with_key)).collect();

    let a = issue(&r[0], 40, &["demo/jobs/"], None).await;
    let b = issue(&r[2], 41, &["demo/jobs/"], None).await;
    put(&client_of(&r[1], &a), "jobs/x", "by A").await.unwrap();
    put(&client_of(&r[0], &b), "jobs/y", "by B").await.unwrap();
    for fg in &r {
        assert_eq!(
            put(&client_of(fg, &a), "jobs/z", "by A").await,
            Err((409, "StaleFencingToken".into())),
            "A's credential at {}",
            fg.endpoint()
        );
    }

    // Without the key, a replica issues nothing and verifies nothing.
    let keyless = replica("");
    let url = format!("http://{}/credentials", keyless.admin);
    let (status, body) =
        common::http_call("POST", &url, Some(ADMIN), Some(r#"{"token": 1}"#)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("key_file"), "{body}");
    let refused = put(&client_of(&keyless, &b), "jobs/w", "by B").await;
    assert_eq!(refused, Err((403, "InvalidAccessKeyId".into())));
}

/// `fencegate credentials` in the forms tools read: the aws CLI with a
/// profile whose `credential_process` is `fencegate credentials --format
/// process`, and a shell that `eval`s its `export` lines. Both write with
/// the token they were given, and nothing else.
#[tokio::test]
async fn fencegate_credentials_feeds_credential_process_and_a_shell() {
    let fg = start();
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    let venv = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/smoke-venv/bin");
    let aws = venv.join("aws");
    assert!(
        aws.exists(),
        "{} is missing: scripts/test installs it",
        aws.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_fencegate");
    let admin = format!("http://{}", fg.admin);
    std::fs::write(dir.path().join("body"), "x").unwrap();
    let config = dir.path().join("aws-config");
    std::fs::write(
        &config,
        format!(
            "[profile fenced]\nregion = us-east-1\ncredential_process = {bin} credentials \
             --format process --token 61 --lock nightly --scope demo/jobs/ --admin {admin} \
             --admin-token {ADMIN}\n"
        ),
    )
    .unwrap();
    let put = |key: &str, profile: bool| {
        let mut c = std::process::Command::new(&aws);
        c.args(["--endpoint-url", &fg.endpoint(), "s3api", "put-object"])
            .args(["--bucket", "demo", "--key", key, "--body"])
            .arg(dir.path().join("body"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"));
        if profile {
            c.args(["--profile", "fenced"]);
        }
        c
    };
    let out = put("jobs/by-process", true).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stamp(&fg, "jobs/by-process").await.as_deref(), Some("61"));

    // The export lines, eval'd by a shell that then runs the aws CLI.
    let script = format!(
        "eval \"$({bin} credentials --token 62 --scope demo/jobs/ --admin {admin} \
         --admin-token {ADMIN})\" && exec \"$@\""
    );
    let cli = put("jobs/by-env", false);
    let mut sh = std::process::Command::new("sh");
    sh.args(["-c", &script, "sh"])
        .arg(cli.get_program())
        .args(cli.get_args())
        .envs(cli.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("AWS_DEFAULT_REGION", "us-east-1");
    let out = sh.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stamp(&fg, "jobs/by-env").await.as_deref(), Some("62"));
    // The older credential_process token is now stale on the job.
    let out = put("jobs/again", true).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("StaleFencingToken"),
        "{stderr}"
    );
}

/// Every payload form of SigV4, signed with a session credential: its
/// chunk and trailer signatures are checked with the derived secret.
#[tokio::test]
async fn every_payload_form_signs_with_a_session_credential() {
    use common::raw::{Form, RawClient, RawRequest, Source};
    let fg = start();
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    let c = issue(&fg, 70, &["demo/jobs/"], None).await;
    let s = |k: &str| c[k].as_str().unwrap().to_string();
    let raw = RawClient::new(&fg.endpoint());
    let forms = [
        Form::Unsigned,
        Form::Sha256,
        Form::Chunked { trailer: false },
        Form::Chunked { trailer: true },
        Form::UnsignedTrailer,
    ];
    for (i, form) in forms.into_iter().enumerate() {
        let key = format!("jobs/form-{i}");
        let mut r = RawRequest::new(http::Method::PUT, &format!("/demo/{key}"))
            .header("x-amz-security-token", &s("SessionToken"));
        r.body = Some(Source::pattern(200_000, matches!(form, Form::Sha256)));
        r.form = form;
        r.key = s("AccessKeyId");
        r.secret = s("SecretAccessKey");
        let got = raw.send(r).await.unwrap();
        assert_eq!(got.status, 200, "form {i}: {}", got.body);
        assert_eq!(stamp(&fg, &key).await.as_deref(), Some("70"), "form {i}");
    }
    // A chunk signed with another secret is refused.
    let mut r = RawRequest::new(http::Method::PUT, "/demo/jobs/forged")
        .header("x-amz-security-token", &s("SessionToken"));
    r.body = Some(Source::pattern(200_000, false));
    r.form = Form::Chunked { trailer: false };
    r.key = s("AccessKeyId");
    r.secret = "a-secret-that-is-not-it".into();
    assert_eq!(raw.send(r).await.unwrap().status, 403);
}
