//! A real browser (Debian's headless Chromium) as the user: a page served
//! by the test from its own origin gets presigned URLs with the token in
//! them (what a web application holding the lock hands its browser), and
//! through fencegate in front of Garage it preflights and PUTs, reads the
//! object back, and sees a stale token refused with the error code and
//! `x-fencing-highest-token` readable from script. A page from an origin the
//! bucket's CORS rules do not name gets nothing.

mod common;

use common::garage::Garage;
use common::raw::presigned_url;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const CHROMIUM: &str = "/usr/bin/chromium";

/// The page: three fetches, their outcome posted back to `/result`.
fn page(put_fresh: &str, get: &str, put_stale: &str) -> String {
    format!(
        r#"<!doctype html><html><body><script>
async function run() {{
  const out = {{}};
  try {{
    let r = await fetch("{put_fresh}", {{method: "PUT", body: "from the browser"}});
    out.put = r.status;
    r = await fetch("{get}");
    out.get = r.status;
    out.body = await r.text();
    r = await fetch("{put_stale}", {{method: "PUT", body: "stale"}});
    out.stale = r.status;
    const xml = new DOMParser().parseFromString(await r.text(), "application/xml");
    const code = xml.querySelector("Code");
    out.code = code ? code.textContent : null;
    out.highest = r.headers.get("x-fencing-highest-token");
  }} catch (e) {{
    out.error = String(e);
  }}
  await fetch("/result", {{method: "POST", body: JSON.stringify(out)}});
}}
run();
</script></body></html>"#
    )
}

/// Serves `html` at `/` and hands what the page posts to `/result` to the
/// returned channel. Returns the origin.
fn serve_page(html: String) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let answer = if line.starts_with("POST /result") {
                let _ = tx.send(String::from_utf8_lossy(&body).into_owned());
                String::new()
            } else if line.starts_with("GET / ") {
                html.clone()
            } else {
                String::new()
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (origin, rx)
}

/// Headless Chromium on `url`, as the machine's notes start it (no
/// background networking: the machine has no way out).
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn open(url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            // Its own temporary files (org.chromium.Chromium.*) go with
            // the profile, not into /tmp for good.
            .env("TMPDIR", profile.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start {CHROMIUM} ({e}): scripts/test installs Debian's chromium")
            });
        Browser {
            child,
            _profile: profile,
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Loads a page with presigned URLs for `key` (fresh token 9, stale 3) from
/// a new origin; returns the origin and, later, the page's report.
fn visit(fg: &str, key: &str, allow: impl FnOnce(&str)) -> serde_json::Value {
    let path = format!("/demo/{key}");
    let html = page(
        &presigned_url(fg, "PUT", &path, "x-fencing-token=9"),
        &presigned_url(fg, "GET", &path, ""),
        &presigned_url(fg, "PUT", &path, "x-fencing-token=3"),
    );
    let (origin, results) = serve_page(html);
    allow(&origin);
    let _browser = Browser::open(&format!("{origin}/"));
    let report = results
        .recv_timeout(Duration::from_secs(60))
        .expect("the page reports within a minute");
    serde_json::from_str(&report).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_browser_uploads_through_a_presigned_url_and_reads_a_stale_refusal() {
    let garage = Garage::start();
    let fg = common::fencegate::Fencegate::start(garage.backend(), "");
    let endpoint = fg.endpoint();
    let c = common::sdk(&endpoint);
    let handle = tokio::runtime::Handle::current();

    let report = tokio::task::block_in_place(|| {
        visit(&endpoint, "page.txt", |origin| {
            handle.block_on(common::allow_cors(&c, origin, &["GET", "PUT", "HEAD"]))
        })
    });
    assert_eq!(report["error"], serde_json::Value::Null, "{report}");
    assert_eq!(report["put"], 200, "{report}");
    assert_eq!(
        (&report["get"], &report["body"]),
        (&200.into(), &"from the browser".into())
    );
    assert_eq!(report["stale"], 409, "{report}");
    assert_eq!(report["code"], "StaleFencingToken", "{report}");
    assert_eq!(report["highest"], "9", "{report}");
    let got = c
        .get_object()
        .bucket("demo")
        .key("page.txt")
        .send()
        .await
        .unwrap();
    let body = got.body.collect().await.unwrap().into_bytes();
    assert_eq!(
        &body[..],
        b"from the browser",
        "the stale PUT changed nothing"
    );

    // An origin the bucket's rules do not name: the preflight fails, and
    // nothing is written.
    let report = tokio::task::block_in_place(|| visit(&endpoint, "other.txt", |_| {}));
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("Failed to fetch"), "{report}");
    let other = c.head_object().bucket("demo").key("other.txt").send().await;
    assert!(other.is_err(), "nothing written from the other origin");
}
