//! TLS on both sides: clients reach fencegate over HTTPS (rustls, cert and
//! key from the config), and fencegate reaches an `https://` backend whose
//! CA it was told to trust. A client that does not trust the certificate
//! gets no answer.

mod common;

use common::backend::TestBackend;
use common::fencegate::{Backend, Fencegate};
use common::raw::{RawClient, RawRequest};

fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

#[tokio::test]
async fn https_front_and_https_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let be = TestBackend::start_tls(&cert, &key).await;
    let fg = Fencegate::start_with(
        Backend::S3Tls {
            endpoint: format!("https://127.0.0.1:{}", be.addr.port()),
            ca_file: cert.display().to_string(),
        },
        &format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
            cert.display(),
            key.display()
        ),
        "",
    );
    let url = format!("https://127.0.0.1:{}", fg.s3.port());
    let client = RawClient::with_ca(&url, Some(&cert));
    let r = client
        .send(RawRequest::put("/demo/k", "over tls").token(3))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "k").unwrap(), "over tls");
    let r = client
        .send(RawRequest::put("/demo/k", "stale").token(2))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    let r = client
        .send(RawRequest::new(http::Method::GET, "/demo/k"))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "over tls"));

    // Plain HTTP to the TLS port, or a client without the CA: no answer.
    let plain = RawClient::new(&format!("http://127.0.0.1:{}", fg.s3.port()));
    assert!(
        plain
            .send(RawRequest::new(http::Method::GET, "/demo/k"))
            .await
            .is_err()
    );
    let untrusting = RawClient::with_ca(&url, None);
    assert!(
        untrusting
            .send(RawRequest::new(http::Method::GET, "/demo/k"))
            .await
            .is_err()
    );
}

#[test]
fn unreadable_tls_files_stop_start_up_naming_the_field() {
    // The data directory goes with the test (it is made before TLS is read).
    let data = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"\n",
        data.path().display()
    );
    let (code, stderr) = common::fencegate::run_with_config(&config, &[]);
    assert_ne!(code, Some(0));
    assert!(stderr.contains("server.tls_cert"), "{stderr}");
}
