//! What ships beside the binary, checked without Docker, systemd or a
//! running nginx: the container image's build stage builds from exactly
//! the files the Dockerfile copies, the systemd unit does not restart on a
//! config error (exit 2), and `scripts/balancer` sends no request to a
//! second replica unless its retry recipe is asked for.

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

/// The config the unit starts with is readable by the user it runs as:
/// the install recipe in the unit's header makes it that user's group's
/// (a `DynamicUser`, whose uid is made at start, could not read a file
/// kept from others, and fencegate would exit 2, not to be restarted).
#[test]
fn the_systemd_unit_can_read_its_config() {
    let unit = read("deploy/fencegate.service");
    let value = |key: &str| {
        (unit.lines())
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    assert_eq!(
        value("DynamicUser"),
        None,
        "a DynamicUser cannot read the config"
    );
    let group = value("Group").expect("the unit names its Group");
    let exec = value("ExecStart").unwrap();
    let config = (exec.split_whitespace())
        .skip_while(|w| *w != "--config")
        .nth(1)
        .expect("ExecStart names its --config");
    let install = (unit.lines())
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| {
            l.split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
        })
        .find(|w| w.first() == Some(&"install") && w.last() == Some(&config))
        .unwrap_or_else(|| panic!("the header installs {config}"));
    let flag = |f: &str| install.iter().skip_while(|w| **w != f).nth(1).copied();
    assert_eq!(flag("-g"), Some(group), "{config}'s group: {install:?}");
    let mode = u32::from_str_radix(flag("-m").expect("a mode"), 8).unwrap();
    assert_eq!(mode & 0o040, 0o040, "the group reads {config}");
    assert_eq!(
        mode & 0o007,
        0,
        "others do not read {config} (it holds secrets)"
    );
}

/// `scripts/balancer`'s nginx.conf as it writes it, `BALANCER_RETRY` set to
/// `retry` (or unset), with `/bin/true` standing in for nginx on the PATH;
/// the real nginx, where there is one, tests it (`nginx -t`).
fn balancer_conf(retry: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/true", bin.join("nginx")).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let lb = dir.path().join("lb");
    let mut balancer = Command::new(Path::new(ROOT).join("scripts/balancer"));
    balancer
        .env("PATH", format!("{}:{path}", bin.display()))
        .env_remove("BALANCE")
        .env_remove("BALANCER_RETRY");
    if let Some(r) = retry {
        balancer.env("BALANCER_RETRY", r);
    }
    let out = (balancer.arg("127.0.0.1:1").arg(&lb))
        .args(["127.0.0.1:2", "127.0.0.1:3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scripts/balancer: {stderr}");
    let conf_path = lb.join("nginx.conf");
    let conf = std::fs::read_to_string(&conf_path).unwrap();
    let nginx = (std::env::split_paths(&path).map(|d| d.join("nginx")))
        .chain([PathBuf::from("/usr/sbin/nginx")])
        .find(|p| p.is_file());
    if let Some(nginx) = nginx {
        let t = Command::new(nginx)
            .arg("-t")
            .arg("-p")
            .arg(&lb)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(lb.join("error.log"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&t.stderr);
        assert!(t.status.success(), "nginx -t: {stderr}\n{conf}");
    }
    conf
}

/// The `proxy_next_upstream*` and body buffering directives of an nginx
/// config, comments left out, whitespace collapsed, in order.
fn retry_directives(conf: &str) -> Vec<String> {
    let code: Vec<&str> = conf.lines().map(|l| l.split('#').next().unwrap()).collect();
    (code.join("\n").split([';', '{', '}']))
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| {
            [
                "proxy_next_upstream",
                "proxy_request_buffering",
                "client_body_buffer_size",
            ]
            .iter()
            .any(|name| d.starts_with(name))
        })
        .collect()
}

/// By default the balancer never sends a request to a second replica:
/// nginx's `proxy_next_upstream error timeout` (what it had) resends a PUT
/// after an error or a timeout, when the first replica may have acted on
/// it (docs/cluster.md, "The balancer's retry recipe"). With
/// `BALANCER_RETRY=1` it has the recipe's directives, as docs/cluster.md
/// shows them.
#[test]
fn the_balancer_sends_no_request_to_a_second_replica_unless_asked() {
    let plain = retry_directives(&balancer_conf(None));
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    assert_eq!(
        plain,
        ["proxy_request_buffering off", "proxy_next_upstream off"]
    );
    let doc = read("docs/cluster.md");
    let recipe = doc
        .split("```nginx")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/cluster.md shows the nginx recipe");
    let mut shown = retry_directives(recipe);
    let mut written = retry_directives(&balancer_conf(Some("1")));
    shown.sort();
    written.sort();
    assert_eq!(written, shown);
}
