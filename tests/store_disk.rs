//! A full disk and a failing disk, for the embedded store and the fence
//! store together (CONTRACT §9): a write that cannot be made durable gets a
//! clear S3 error (`507` for a full disk, `500`/`503` for an I/O error),
//! lands nothing and leaves the old object readable; a raise that cannot
//! be made durable is refused and never forwarded; `/readyz` says 503 with
//! the reason, a metric counts the failures; and once the disk has room
//! (or works) again, writes and raises go through without a restart.
//!
//! The full disk is a 24 MiB tmpfs the test mounts (it needs root, as
//! `scripts/test` runs); the failing disk is a small preloaded library
//! (`tests/common/eio.c`, built with `cc`) that fails `fsync` and
//! `fdatasync` while a trigger file exists.

mod common;

use common::fencegate::{Backend, Fencegate};
use common::raw::{RawClient, RawRequest};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const RULES: &str = "[[rules]]\nbucket = \"disk\"\nprefix = \"free/\"\nmode = \"unfenced\"\n";

/// A tmpfs of `mib` MiB, unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mib: u32) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system of `dir` with `filler` until it is full.
fn fill(filler: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(filler).unwrap();
    let block = vec![0xAAu8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.flush();
}

async fn status_of(raw: &RawClient, req: RawRequest) -> (u16, String) {
    let r = raw.send(req).await.unwrap();
    (r.status, r.code().unwrap_or_default().to_string())
}

async fn ready(fg: &Fencegate) -> (u16, String) {
    common::http_call("GET", &format!("http://{}/readyz", fg.admin), None, None).await
}

async fn wait_ready(fg: &Fencegate) {
    for _ in 0..100 {
        if ready(fg).await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not ready again: {:?}", ready(fg).await);
}

/// Starts fencegate with its data directory under `dir`, bucket `disk`
/// made and `free/old` written.
async fn start(dir: &Path, env: &[(&str, &str)]) -> (Fencegate, RawClient) {
    let data = dir.join("data");
    let server = format!("data_dir = \"{}\"\n", data.display());
    let fg = Fencegate::start_full(Backend::Embedded, &server, "", RULES, env);
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "disk").await;
    let raw = RawClient::new(&fg.endpoint());
    let put = RawRequest::put("/disk/free/old", "the old version");
    assert_eq!(status_of(&raw, put).await.0, 200);
    (fg, raw)
}

async fn old_is_intact(raw: &RawClient) {
    let r = raw
        .send(RawRequest::new(http::Method::GET, "/disk/free/old"))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "the old version"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_writes_clearly_and_recovers_without_a_restart() {
    let disk = SmallDisk::mount(24);
    let (fg, raw) = start(disk.path(), &[]).await;
    let filler = disk.path().join("filler");
    fill(&filler);

    // A new version's bytes have nowhere to go: 507, the old one stays.
    let big = RawRequest::put("/disk/free/old", vec![1u8; 1 << 20]);
    assert_eq!(
        status_of(&raw, big).await,
        (507, "InsufficientStorage".into())
    );
    old_is_intact(&raw).await;
    // Raises of new resources until one cannot be made durable: refused,
    // never forwarded.
    let mut refused = None;
    for t in 0..2000u64 {
        let put = RawRequest::put(&format!("/disk/fenced/r{t}"), "").token(t + 1);
        let (s, code) = status_of(&raw, put).await;
        if s != 200 {
            refused = Some((t, s, code));
            break;
        }
    }
    let (t, s, code) = refused.expect("a raise that needs room fails on a full disk");
    assert!(
        matches!(
            (s, code.as_str()),
            (503, "ServiceUnavailable") | (507, "InsufficientStorage")
        ),
        "{s} {code}"
    );
    let head = raw
        .send(RawRequest::new(
            http::Method::HEAD,
            &format!("/disk/fenced/r{t}"),
        ))
        .await
        .unwrap();
    assert_eq!(head.status, 404, "the refused write reached the store");
    let (s, why) = ready(&fg).await;
    assert_eq!(s, 503, "{why}");
    assert!(why.contains("No space left"), "{why}");
    let metrics =
        common::http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    assert!(
        metrics.1.contains("fencegate_store_write_failures_total"),
        "{}",
        metrics.1
    );
    // Reads go on.
    old_is_intact(&raw).await;

    // Room again: no restart, writes and raises go through.
    std::fs::remove_file(&filler).unwrap();
    wait_ready(&fg).await;
    let put = RawRequest::put(&format!("/disk/fenced/r{t}"), "").token(t + 1);
    assert_eq!(status_of(&raw, put).await.0, 200);
    let big = RawRequest::put("/disk/free/old", vec![2u8; 1 << 20]);
    assert_eq!(status_of(&raw, big).await.0, 200);
}

/// The preloaded library that fails `fsync` while the trigger exists.
fn eio_library() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libfencegate-eio.so");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/common/eio.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("run cc");
    assert!(built.success(), "cc could not build {}", src.display());
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn an_io_error_refuses_writes_clearly_and_recovers_without_a_restart() {
    let dir = common::scratch_dir();
    let lib = eio_library();
    let trigger = dir.path().join("fail-now");
    let (lib, trig) = (lib.display().to_string(), trigger.display().to_string());
    let env = [("LD_PRELOAD", lib.as_str()), ("EIO_TRIGGER", trig.as_str())];
    let (fg, raw) = start(dir.path(), &env).await;

    std::fs::write(&trigger, b"").unwrap();
    let put = RawRequest::put("/disk/free/old", "a new version");
    assert_eq!(status_of(&raw, put).await.0, 500);
    old_is_intact(&raw).await;
    let raise = RawRequest::put("/disk/fenced/k", "x").token(7);
    assert_eq!(
        status_of(&raw, raise).await,
        (503, "ServiceUnavailable".into())
    );
    let head = raw
        .send(RawRequest::new(http::Method::HEAD, "/disk/fenced/k"))
        .await
        .unwrap();
    assert_eq!(head.status, 404);
    let (s, why) = ready(&fg).await;
    assert_eq!(s, 503, "{why}");

    std::fs::remove_file(&trigger).unwrap();
    wait_ready(&fg).await;
    let raise = RawRequest::put("/disk/fenced/k", "x").token(7);
    assert_eq!(status_of(&raw, raise).await.0, 200);
    let put = RawRequest::put("/disk/free/old", "a new version");
    assert_eq!(status_of(&raw, put).await.0, 200);
}
