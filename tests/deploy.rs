//! What ships beside the binary, checked without Docker or systemd: the
//! container image's build stage builds from exactly the files the
//! Dockerfile copies, and the systemd unit does not restart on a config
//! error (exit 2).

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap()
}

/// One `COPY` line of a stage: its sources in the build context, where
/// they go, and whether it copies from another stage (`--from`).
struct Copy {
    sources: Vec<String>,
    dest: String,
    from_stage: bool,
}

/// A Dockerfile stage: its `WORKDIR`, `COPY` and `RUN` lines, in order.
#[derive(Default)]
struct Stage {
    workdir: Option<String>,
    copies: Vec<Copy>,
    runs: Vec<String>,
}

/// The Dockerfile's stages (backslash-continued lines joined).
fn stages(dockerfile: &str) -> Vec<Stage> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut stages = Vec::new();
    for line in joined.lines().map(str::trim) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word.to_ascii_uppercase().as_str() {
            "FROM" => stages.push(Stage::default()),
            "WORKDIR" => stages.last_mut().unwrap().workdir = Some(rest.trim().into()),
            "RUN" => stages.last_mut().unwrap().runs.push(rest.into()),
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let from_stage = words.iter().any(|w| w.starts_with("--from"));
                let mut paths: Vec<String> = (words.iter())
                    .filter(|w| !w.starts_with("--"))
                    .map(|w| w.to_string())
                    .collect();
                let dest = paths.pop().expect("COPY names a destination");
                let copy = Copy {
                    sources: paths,
                    dest,
                    from_stage,
                };
                stages.last_mut().unwrap().copies.push(copy);
            }
            _ => {}
        }
    }
    stages
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}

/// The platform cargo builds for here, as `rustc -vV` names it.
fn host() -> String {
    let out = Command::new("rustc").arg("-vV").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let host = text.lines().find_map(|l| l.strip_prefix("host: "));
    host.expect("rustc -vV names the host").to_string()
}

/// The build stage copies the package into its `WORKDIR` and runs `cargo
/// build --release --locked`. The same files, copied alone into an empty
/// directory, must be a package cargo can load with all its targets and
/// an up-to-date lock file: `cargo fetch --locked --offline` reads what the
/// build reads before it compiles anything (a `[[bench]]` whose file was
/// not copied stopped it: "can't find `gate` bench"), in a second, with no
/// network. And the binary it builds (`--bin`) must be one of its targets.
#[test]
fn the_image_builds_from_what_the_dockerfile_copies() {
    let stages = stages(&read("Dockerfile"));
    let build = stages
        .iter()
        .find(|s| s.runs.iter().any(|r| r.contains("cargo build")))
        .expect("a stage that runs cargo build");
    let workdir = build.workdir.clone().expect("the build stage's WORKDIR");
    let dir = tempfile::tempdir().unwrap();
    for copy in build.copies.iter().filter(|c| !c.from_stage) {
        let dest = match copy.dest.strip_prefix('/') {
            Some(_) => PathBuf::from(&copy.dest),
            None => Path::new(&workdir).join(&copy.dest),
        };
        let dest = dest.strip_prefix(&workdir).unwrap_or_else(|_| {
            panic!("COPY to {} outside WORKDIR {workdir}", copy.dest);
        });
        let into_dir = copy.dest.ends_with('/') || copy.sources.len() > 1;
        for source in &copy.sources {
            let from = Path::new(ROOT).join(source);
            assert!(from.exists(), "COPY {source}: not in the repository");
            let to = match into_dir {
                true => dir.path().join(dest).join(from.file_name().unwrap()),
                false => dir.path().join(dest),
            };
            copy_tree(&from, &to);
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let fetch = Command::new(&cargo)
        .args(["fetch", "--locked", "--offline", "--target", &host()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        fetch.status.success(),
        "cargo fetch --locked --offline on the files the Dockerfile copies:\n{}",
        String::from_utf8_lossy(&fetch.stderr)
    );
    let run = (build.runs.iter())
        .find(|r| r.contains("cargo build"))
        .unwrap();
    assert!(run.contains("--locked"), "{run}");
    let bin = run
        .split_whitespace()
        .skip_while(|w| *w != "--bin")
        .nth(1)
        .expect("the build names its binary (--bin)");
    let metadata = Command::new(&cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(metadata.status.success());
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let targets = metadata["packages"][0]["targets"].as_array().unwrap();
    assert!(
        targets
            .iter()
            .any(|t| t["name"] == bin && t["kind"][0] == "bin"),
        "no bin target {bin} in the copied package"
    );
    // What the later stages copy from the build context is there too.
    for copy in stages.iter().flat_map(|s| &s.copies) {
        for source in copy.sources.iter().filter(|_| !copy.from_stage) {
            let path = Path::new(ROOT).join(source);
            assert!(path.exists(), "COPY {source}: not in the repository");
        }
    }
}

/// A config error exits 2 (`tests/cli.rs`); restarting cannot fix it, so
/// the unit must not restart on it.
#[test]
fn the_systemd_unit_does_not_restart_on_a_config_error() {
    let unit = read("deploy/fencegate.service");
    let values = |key: &str| -> Vec<String> {
        (unit.lines())
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .flat_map(|v| v.split_whitespace().map(str::to_string))
            .collect()
    };
    assert_eq!(values("Restart"), ["on-failure"]);
    assert!(
        values("RestartPreventExitStatus").contains(&"2".to_string()),
        "RestartPreventExitStatus must list 2"
    );
}
