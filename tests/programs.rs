//! Programs nobody here wrote, unmodified, fenced through the credentials
//! `fencegate lock --credentials` gives them (docs/credentials.md): none
//! of them adds a header or metadata. Each test plays the zombie:
//!
//! 1. holder A takes the lock (etcd) and starts the program with session
//!    credentials bound to its token;
//! 2. A (the lock helper and the program) is paused with SIGSTOP past its
//!    lock's lease;
//! 3. B takes the lock and runs the program;
//! 4. A's program resumes: every write it then makes is refused, and B's
//!    data is intact and readable by the program itself.
//!
//! - restic: A's `restic backup` has uploaded packs but no index when it
//!   is paused; B's `restic prune` deletes them as unreferenced (restic
//!   #3126); A's resumed writes are refused, and `restic check` passes.
//!   With the repository's prefix unfenced
//!   (`FENCEGATE_TEST_PROGRAMS_UNFENCED=1`), A's index and snapshot land
//!   and `restic check` finds the packs B deleted missing: the test fails.
//!   With `FENCEGATE_UNSAFE_SESSION_NO_TOKEN=1` it fails too (no write
//!   carries a token).
//! - rclone `sync` with `env_auth = true`, and the aws CLI, boto3 and
//!   object_store (obstore) with credentials from the environment only.
//! - pgBackRest: a stale primary's `archive-push` after a failover is
//!   refused, and the repository holds the new primary's history only.
//!
//! Each on fencegate's embedded store and in front of Garage
//! (`name::embedded`, `name::garage`).

mod common;

use common::Store;
use common::jobs::{Job, Rig, access_key_of, random_files, rclone_env, results, venv_bin};
use std::path::{Path, PathBuf};
use std::process::Command;

fn restic_backup_paused_past_its_lock_cannot_undo_a_prune(store: Store) {
    let rig = Rig::start(store, "repo/");
    let repo = format!("s3:{}/demo/repo", rig.fg.endpoint());
    let env = [
        ("RESTIC_REPOSITORY", repo),
        ("RESTIC_PASSWORD", "fencegate-test".to_string()),
    ];
    let scope = "demo/repo/";
    random_files(&rig.path("first"), 1, 200_000);
    let (code, out) = rig.run("init", scope, "restic init && restic backup first", &env);
    assert_eq!(code, 0, "{out}");

    // A backs up new data slowly; it is paused once two packs are up,
    // with no index or snapshot written yet.
    random_files(&rig.path("data"), 6, 4_000_000);
    let from = rig.log_len();
    let a = rig.spawn(
        "a",
        scope,
        "exec restic backup --pack-size 4 --limit-upload 4000 data",
        &env,
    );
    let data_put = ["method=PUT", "key=\"repo/data/", "status=200"];
    rig.wait_log(from, &data_put, 2, "A to upload two packs");
    rig.pause_past_its_lock(&a);
    let a_key = access_key_of(&rig.log_lines(from, &data_put)[0]);

    // B: the lock is B's now. restic's own lock is A's (its process is
    // still there, paused): B removes it, as the external lock allows,
    // and prunes, deleting A's packs as unreferenced.
    let b_from = rig.log_len();
    let (code, out) = rig.run(
        "b",
        scope,
        "restic unlock --remove-all && restic prune",
        &env,
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("deleting unreferenced packs"), "{out}");

    // A's program wakes while its supervisor sleeps: it goes on writing.
    let (code, out) = rig.zombie_is_refused(a, &a_key, b_from, 3);
    assert_eq!(code, Some(75), "A's helper stops it, the lock lost: {out}");

    // The repository is whole, as restic itself says.
    let (code, out) = rig.run(
        "check",
        scope,
        "restic check --read-data && restic snapshots",
        &env,
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no errors were found"), "{out}");
}

fn boto3_the_aws_cli_and_obstore_with_credentials_from_the_environment_only(store: Store) {
    let rig = Rig::start(store, "jobs/");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/env_clients.py");
    let run = |name: &str| {
        format!(
            "exec {} {} {name} {name}.go {name}.results",
            venv_bin("python"),
            script.display()
        )
    };
    // Only what `fencegate lock --credentials` gives, and where to go.
    let env = [
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
        ("PATH", format!("{}:/usr/bin:/bin", venv_bin(""))),
    ];
    let from = rig.log_len();
    let a = rig.spawn("a", "demo/jobs/", &run("a"), &env);
    let a_results = rig.path("a.results");
    let first = results(&a_results, 3);
    assert!(first.iter().all(|l| l.ends_with(" ok")), "{first:?}");
    rig.pause_past_its_lock(&a);
    let a_key = access_key_of(&rig.log_lines(from, &["method=PUT", "status=200"])[0]);

    std::fs::write(rig.path("b.go"), "").unwrap();
    let (code, out) = rig.run("b", "demo/jobs/", &run("b"), &env);
    assert_eq!(code, 0, "{out}");
    let b = results(&rig.path("b.results"), 6);
    assert!(b.iter().all(|l| l.ends_with(" ok")), "B: {b:?}");

    // A wakes and writes again with each client: refused, each one.
    let b_from = rig.log_len();
    std::fs::write(rig.path("a.go"), "").unwrap();
    rig.zombie_is_refused(a, &a_key, b_from, 3);
    let all = results(&a_results, 6);
    for client in ["boto3", "cli", "obstore"] {
        let step2 = format!("{client} 2");
        let line = all.iter().find(|l| l.starts_with(&step2)).unwrap();
        let refused = line.contains("refused") && line.contains("StaleFencingToken");
        assert!(refused, "{line}");
    }
}

fn rclone_sync_paused_past_its_lock_leaves_the_next_holders_copy(store: Store) {
    let rig = Rig::start(store, "mirror/");
    // rclone's remote from the environment: env_auth reads the
    // credentials fencegate lock gives the program.
    let env = rclone_env(rig.fg.endpoint());
    let (a, a_put) = rig.rclone_sync_overtaken("a", &env);
    let a_key = access_key_of(&a_put);

    let b_from = rig.log_len();
    rig.zombie_is_refused(a, &a_key, b_from, 1);
    // The mirror is B's copy, as rclone itself checks it.
    let (code, out) = rig.run(
        "check",
        "demo/mirror/",
        "exec rclone check src-b fg:demo/mirror",
        &env,
    );
    assert_eq!(code, 0, "{out}");
}

/// A PostgreSQL cluster driven by `pg_ctl`, as the `postgres` user.
struct Pg {
    data: PathBuf,
    port: u16,
    bin: PathBuf,
}

impl Pg {
    fn as_postgres(&self, program: &str) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(self.bin.join(program));
        c
    }

    /// Makes a new cluster in `data` with `initdb`, trusting local users.
    fn initdb(&self) {
        let out = self
            .as_postgres("initdb")
            .args(["--no-sync", "-A", "trust", "-U", "postgres", "-D"])
            .arg(&self.data)
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {out:?}");
    }

    /// A second cluster in `data`: a copy of this one's (stopped) data
    /// directory, on a port of its own.
    fn copy_to(&self, data: PathBuf) -> Pg {
        let copy = Pg {
            data,
            port: common::free_port(),
            bin: self.bin.clone(),
        };
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&self.data)
            .arg(&copy.data)
            .status();
        assert!(copied.unwrap().success());
        copy
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c wal_level=replica \
             -c archive_mode=on -c archive_command=/bin/true",
            self.port,
            self.data.parent().unwrap().display()
        );
        let log = self.data.with_extension("log");
        let out = (self.as_postgres("pg_ctl").arg("-D").arg(&self.data))
            .args(["-o", &opts, "-w", "-l"])
            .arg(log)
            .arg("start")
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {out:?}");
    }

    fn stop(&self) {
        let c = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "stop"])
            .output();
        let _ = c;
    }

    fn sql(&self, sql: &str) {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", &self.data.parent().unwrap().display().to_string()])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atc",
                sql,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {out:?}");
    }

    fn wal(&self, segment: u32) -> PathBuf {
        self.data
            .join(format!("pg_wal/0000000100000000000000{segment:02X}"))
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Hands `p` and everything under it to the `postgres` user.
fn chown_to_postgres(p: &Path) {
    let ok = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(p)
        .status();
    assert!(ok.unwrap().success());
}

/// The `bin` directory of the newest PostgreSQL installed from Debian.
fn postgres_bin() -> PathBuf {
    std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL (Debian package postgresql)")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .max()
        .unwrap()
}

/// Writes `pgbackrest.conf` in `home`: repository 1 on fencegate's HTTPS
/// port (trusting `pki`'s CA), stanza `main` on cluster `pg`.
fn write_pgbackrest_conf(home: &Path, rig: &Rig, pki: &common::secure::Pki, pg: &Pg) {
    std::fs::write(
        home.join("pgbackrest.conf"),
        format!(
            "[global]\nrepo1-type=s3\nrepo1-s3-bucket=demo\nrepo1-s3-endpoint=localhost\n\
             repo1-storage-port={}\nrepo1-s3-region=us-east-1\nrepo1-s3-uri-style=path\n\
             repo1-path=/pgbr\nrepo1-storage-ca-file={}\nlog-path={h}\nlock-path={h}\n\
             spool-path={h}\n[main]\npg1-path={}\npg1-port={}\npg1-socket-path={h}\n\
             pg1-user=postgres\n",
            rig.fg.s3.port(),
            pki.path("ca.pem").display(),
            pg.data.display(),
            pg.port,
            h = home.display(),
        ),
    )
    .unwrap();
}

/// A shell script that runs `then` with `$P` set to pgBackRest on cluster
/// `pg`, its credentials taken from the ones `fencegate lock` gives.
fn pgbackrest(home: &Path, pg: &Pg, then: &str) -> String {
    // pgBackRest reads its credentials from its own variables.
    format!(
        "export PGBACKREST_REPO1_S3_KEY=$AWS_ACCESS_KEY_ID \
         PGBACKREST_REPO1_S3_KEY_SECRET=$AWS_SECRET_ACCESS_KEY \
         PGBACKREST_REPO1_S3_TOKEN=$AWS_SESSION_TOKEN; \
         P='pgbackrest --config={}/pgbackrest.conf --stanza=main --pg1-path={}'; {then}",
        home.display(),
        pg.data.display(),
    )
}

/// A pgBackRest script that archives `pg`'s WAL segments `segs` in turn,
/// stopping at the first that fails.
fn push(home: &Path, pg: &Pg, segs: &[u32]) -> String {
    let files: Vec<String> = segs
        .iter()
        .map(|s| pg.wal(*s).display().to_string())
        .collect();
    pgbackrest(
        home,
        pg,
        &format!(
            "for f in {}; do $P archive-push $f || exit 1; done",
            files.join(" ")
        ),
    )
}

/// Lets paused job `a` (waiting on file `go`) push its late segment, and
/// checks that push fails, refused 409 stale at its read of archive.info.
fn a_late_push_is_refused(rig: &Rig, a_job: Job, go: &Path) {
    std::fs::write(go, "").unwrap();
    a_job.resume_program();
    let late = common::poll_until(60, || rig.path("a.late").exists());
    assert!(late, "A's late push did not end: {}", rig.output("a"));
    let late = std::fs::read_to_string(rig.path("a.late")).unwrap();
    assert!(
        !late.contains("exit 0"),
        "A's stale push went through: {late}"
    );
    // Refused at its read of archive.info (its token is stale there too).
    let a_out = rig.output("a");
    assert!(
        a_out.contains("failed with 409")
            && a_out.contains("<Code>StaleFencingToken</Code>")
            && a_out.contains("GET /demo/pgbr/archive/main/archive.info"),
        "A was not refused 409 on archive.info: {a_out}"
    );
    drop(a_job.finish());
}

/// Checks the repository holds B's history: segments 4 and 5 are `b`'s,
/// and 6 is not there.
fn the_repository_holds_bs_history(rig: &Rig, home: &Path, b: &Pg) {
    let get = |seg: u32, to: &str| {
        format!(
            "$P archive-get 0000000100000000000000{seg:02X} {}/{to}",
            home.display()
        )
    };
    let check = format!(
        "{} && {} && ! {}",
        get(4, "got4"),
        get(5, "got5"),
        get(6, "got6")
    );
    let env: [(&str, String); 0] = [];
    let (code, out) = rig.run("check", "demo/pgbr/", &pgbackrest(home, b, &check), &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read(home.join("got4")).unwrap(),
        std::fs::read(b.wal(4)).unwrap()
    );
    assert_eq!(
        std::fs::read(home.join("got5")).unwrap(),
        std::fs::read(b.wal(5)).unwrap()
    );
}

/// pgBackRest after a failover gone wrong: two servers with one history
/// up to a point (a copy of one data directory), then their own, archive
/// WAL to one repository. A, the old primary, archived while it held the
/// lock; B, promoted, holds it now and archives its own segments. A's
/// later `archive-push` is refused, of a segment B has not archived yet
/// too, and the repository holds B's history only. pgBackRest speaks S3
/// over HTTPS only: fencegate serves HTTPS here.
fn pgbackrest_a_stale_primarys_archive_push_is_refused(store: Store) {
    let pki = common::secure::Pki::new();
    let rig = Rig::start_with(store, "pgbr/", Some(&pki));
    let home = rig.dir.path();
    chown_to_postgres(home);
    let a = Pg {
        data: home.join("a"),
        port: common::free_port(),
        bin: postgres_bin(),
    };
    a.initdb();
    write_pgbackrest_conf(home, &rig, &pki, &a);
    let env: [(&str, String); 0] = [];
    let scope = "demo/pgbr/";
    a.start();
    let create = pgbackrest(home, &a, "$P stanza-create");
    let (code, out) = rig.run("create", scope, &create, &env);
    assert_eq!(code, 0, "{out}");
    a.sql("create table t(x int); insert into t values (1); select pg_switch_wal()");
    a.stop();
    // B: a copy of A (one system id, one history so far), then each its own.
    let b = a.copy_to(home.join("b"));
    a.start();
    b.start();
    for pg in [&a, &b] {
        for _ in 0..3 {
            pg.sql("insert into t select generate_series(1, 1000); select pg_switch_wal()");
        }
    }
    let (first, theirs) = (3, [4, 5]);
    assert_ne!(
        std::fs::read(a.wal(4)).unwrap(),
        std::fs::read(b.wal(4)).unwrap()
    );

    // A archives while it holds the lock, then is paused past it.
    let go = rig.path("a.go");
    let a_job = rig.spawn(
        "a",
        scope,
        &format!(
            "{} && touch a.ready && while [ ! -e {} ]; do sleep 0.05; done; ({}); \
             echo \"late push exit $?\" >> a.late",
            push(home, &a, &[first]),
            go.display(),
            push(home, &a, &[6])
        ),
        &env,
    );
    let ready = common::poll_until(60, || rig.path("a.ready").exists());
    assert!(ready, "A did not archive: {}", rig.output("a"));
    rig.pause_past_its_lock(&a_job);

    // B, the new primary, archives its own segments.
    let (code, out) = rig.run("b", scope, &push(home, &b, &theirs), &env);
    assert_eq!(code, 0, "{out}");

    // A wakes and archives a segment of its own history: refused.
    a_late_push_is_refused(&rig, a_job, &go);

    // The repository holds B's history: 4 and 5 are B's, 6 is not there.
    the_repository_holds_bs_history(&rig, home, &b);
}

on_both_stores_sync!(
    restic_backup_paused_past_its_lock_cannot_undo_a_prune,
    boto3_the_aws_cli_and_obstore_with_credentials_from_the_environment_only,
    rclone_sync_paused_past_its_lock_leaves_the_next_holders_copy,
    pgbackrest_a_stale_primarys_archive_push_is_refused,
);
