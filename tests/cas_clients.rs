//! Real clients that fence themselves with conditional writes, through
//! fencegate on its embedded default store (what `scripts/run` gives a new
//! user) and on Garage (which ignores every condition), each run by
//! `tests/cas/cas_clients.py` with the client from PyPI, unmodified:
//!
//! - delta-rs: processes appending to one table at once lose no
//!   acknowledged commit, and the table reads back (ranged reads of whole
//!   objects, which must be `206`);
//! - SlateDB: of two writers opening one database at once, never both are
//!   left standing, a fenced one cannot write again, and no write either
//!   was told is durable is lost. Both may be fenced: each SlateDB 0.17
//!   database runs a compactor whose epoch is claimed apart from the
//!   writer's, and the later writer can lose that claim to the other
//!   (seen under load on every store, no request answered wrongly; before
//!   #39 a writer on the embedded store could instead hang, replaying the
//!   other's WAL with whole-object ranged reads answered `200`);
//! - Terraform's S3 state lock (`use_lockfile`): a second apply is refused
//!   the lock while the first holds it.
//!
//! A short slice of each; `scripts/cas-clients` runs them at full size.
//! The clients are pinned in scripts/need.sh (`need_smoke_venv`,
//! target/smoke-venv). With
//! `FENCEGATE_UNSAFE_NO_HOLD=1` the delta-rs and SlateDB tests fail on
//! Garage (the embedded store holds its conditions on its own).

mod common;

use common::Store;
use std::path::PathBuf;
use std::process::Command;

/// The whole bucket is for CAS writers: no fencing token needed.
const UNFENCED: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n";

fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/smoke-venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: scripts/test installs the pinned clients there",
        venv.display()
    );
    venv
}

/// Runs one scenario of the script against fencegate on a fresh `store`.
fn run(store: Store, args: &[&str]) {
    let running = store.start(UNFENCED);
    let fg = &running.fg;
    if running.garage.is_none() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo"));
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cas/cas_clients.py");
    let scratch = common::scratch_dir();
    let out = Command::new(python())
        .arg(&script)
        .arg(fg.endpoint())
        .arg("demo")
        .args(args)
        .current_dir(scratch.path())
        .env("HOME", scratch.path())
        .output()
        .expect("run the CAS clients");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{store:?} {args:?}:\n{}",
        common::tail(&text, 60)
    );
    println!("{store:?}: {text}");
}

/// A size: the short slice's, or under `scripts/cas-clients`
/// (`FENCEGATE_CAS_FULL=1`) the setting `name`'s or `full`.
fn size(short: u32, name: &str, full: u32) -> String {
    if std::env::var("FENCEGATE_CAS_FULL").as_deref() != Ok("1") {
        return short.to_string();
    }
    std::env::var(name).unwrap_or_else(|_| full.to_string())
}

on_both_stores_sync!(
    delta_rs_appenders_lose_no_acknowledged_commit,
    slatedb_writers_opening_at_once_never_both_stand,
    terraform_state_lock_refuses_a_second_apply,
);

fn delta_rs_appenders_lose_no_acknowledged_commit(store: Store) {
    let processes = size(4, "CAS_DELTA_PROCESSES", 8);
    let appends = size(5, "CAS_DELTA_APPENDS", 20);
    run(store, &["delta", &processes, &appends]);
}

fn slatedb_writers_opening_at_once_never_both_stand(store: Store) {
    run(store, &["slatedb", &size(2, "CAS_SLATEDB_ROUNDS", 10)]);
}

fn terraform_state_lock_refuses_a_second_apply(store: Store) {
    run(store, &["terraform"]);
}
