//! The coordination services as production runs them, for the tests of
//! TLS and authentication (tests/secure_services.rs): a test CA and the
//! certificates it signs (made with rcgen), a 3-member etcd with client
//! and peer TLS, client-certificate auth and RBAC users; Redis with only a
//! TLS port and an ACL user; PostgreSQL with `ssl=on` and SCRAM passwords;
//! ZooKeeper that demands SASL DIGEST-MD5 and serves TLS. All on loopback, stopped on drop.

use super::{free_port, poll_until, scratch_dir, tail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// fencegate's password at every service.
pub const PASSWORD: &str = "fg-pass-6b1d0e9a";
/// The services' administrator password (etcd's root).
pub const ROOT_PASSWORD: &str = "root-pass-4c2f8b17";
/// fencegate's user name at every service.
pub const USER: &str = "fencegate";

/// A CA with a server and a client certificate (and one that expired in
/// 2021), and a second CA nobody trusts with a client certificate of its
/// own. PEM files in `dir`.
pub struct Pki {
    pub dir: tempfile::TempDir,
}

fn leaf(
    cn: &str,
    sans: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    issuer: &Issuer<'_, KeyPair>,
) -> (String, String) {
    leaf_with(cn, sans, usages, issuer, |_| {})
}

fn leaf_with(
    cn: &str,
    sans: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    issuer: &Issuer<'_, KeyPair>,
    adjust: impl FnOnce(&mut CertificateParams),
) -> (String, String) {
    let mut p =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = usages;
    adjust(&mut p);
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(p, key))
}

impl Pki {
    pub fn new() -> Pki {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = scratch_dir();
        let (ca_pem, issuer) = ca("fencegate test CA");
        let (rogue_pem, rogue) = ca("a CA nobody trusts");
        let (server, server_key) = leaf(
            "server",
            &["127.0.0.1", "localhost"],
            vec![ServerAuth, ClientAuth],
            &issuer,
        );
        let (client, client_key) = leaf(USER, &[], vec![ClientAuth], &issuer);
        let (rogue_client, rogue_key) = leaf(USER, &[], vec![ClientAuth], &rogue);
        let (expired, expired_key) = leaf_with(USER, &[], vec![ClientAuth], &issuer, |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        });
        for (name, text) in [
            ("ca.pem", &ca_pem),
            ("server.pem", &server),
            ("server-key.pem", &server_key),
            ("client.pem", &client),
            ("client-key.pem", &client_key),
            ("rogue-ca.pem", &rogue_pem),
            ("expired-client.pem", &expired),
            ("expired-client-key.pem", &expired_key),
            ("rogue-client.pem", &rogue_client),
            ("rogue-client-key.pem", &rogue_key),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        // ZooKeeper's PEM key store: the certificate and its key in one file.
        std::fs::write(
            dir.path().join("server-bundle.pem"),
            format!("{server}{server_key}"),
        )
        .unwrap();
        std::fs::write(dir.path().join("password"), format!("{PASSWORD}\n")).unwrap();
        std::fs::write(dir.path().join("wrong-password"), "not-the-password\n").unwrap();
        // Readable by the postgres user, which copies nothing itself.
        let _ = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(dir.path())
            .status();
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `fencegate lock` flags for the good CA, client certificate, user
    /// and password file.
    pub fn lock_flags(&self) -> Vec<String> {
        let p = |n: &str| self.path(n).display().to_string();
        vec![
            "--ca-file".into(),
            p("ca.pem"),
            "--cert-file".into(),
            p("client.pem"),
            "--key-file".into(),
            p("client-key.pem"),
            "--user".into(),
            USER.into(),
            "--password-file".into(),
            p("password"),
        ]
    }

    /// An access table (`[<table>]`) with the same.
    pub fn access_toml(&self, table: &str) -> String {
        format!(
            "[{table}]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\nuser = \"{USER}\"\npassword_file = \"{}\"\n",
            self.path("ca.pem").display(),
            self.path("client.pem").display(),
            self.path("client-key.pem").display(),
            self.path("password").display(),
        )
    }
}

/// A 3-member etcd: https for clients and peers, client certificates
/// required, auth on with users `root` and `fencegate` (the latter may
/// read and write `t/` and `orders`).
pub struct SecureEtcd {
    pub endpoints: Vec<String>,
    children: Vec<Child>,
    dir: tempfile::TempDir,
}

impl SecureEtcd {
    pub fn start(pki: &Pki) -> SecureEtcd {
        let dir = scratch_dir();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=https://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let children = ports
            .iter()
            .enumerate()
            .map(|(i, &cp)| spawn_member(pki, dir.path(), i, cp, &initial))
            .collect();
        let e = SecureEtcd {
            endpoints: ports
                .iter()
                .map(|(c, _)| format!("https://127.0.0.1:{c}"))
                .collect(),
            children,
            dir,
        };
        let healthy = poll_until(60, || {
            e.ctl(pki, &[], &["endpoint", "health"]).status.success()
        });
        assert!(healthy, "secure etcd never healthy:\n{}", e.logs());
        e.set_up_auth(pki);
        e
    }

    /// Adds the root user and the fencegate user (role `fg`, read-write on
    /// `t/` and `orders`), then turns authentication on.
    fn set_up_auth(&self, pki: &Pki) {
        for args in [
            vec!["role", "add", "root"],
            vec![
                "user",
                "add",
                "root",
                &format!("--new-user-password={ROOT_PASSWORD}"),
            ],
            vec!["user", "grant-role", "root", "root"],
            vec!["role", "add", "fg"],
            vec![
                "role",
                "grant-permission",
                "fg",
                "readwrite",
                "--prefix=true",
                "t/",
            ],
            vec![
                "role",
                "grant-permission",
                "fg",
                "readwrite",
                "--prefix=true",
                "orders",
            ],
            vec![
                "user",
                "add",
                USER,
                &format!("--new-user-password={PASSWORD}"),
            ],
            vec!["user", "grant-role", USER, "fg"],
            vec!["auth", "enable"],
        ] {
            let out = self.ctl(pki, &[], &args);
            assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
        }
    }

    /// `etcdctl` over TLS with the good client certificate, `extra` flags
    /// (`--user root:...`), then `args`.
    pub fn ctl(&self, pki: &Pki, extra: &[&str], args: &[&str]) -> Output {
        let f = |n: &str| pki.path(n).display().to_string();
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints.join(",")])
            .args(["--cacert", &f("ca.pem"), "--cert", &f("client.pem")])
            .args(["--key", &f("client-key.pem"), "--dial-timeout", "3s"])
            .args(extra)
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    /// `["https://...", ...]` for a TOML file.
    pub fn endpoints_toml(&self) -> String {
        let quoted: Vec<String> = self.endpoints.iter().map(|e| format!("\"{e}\"")).collect();
        format!("[{}]", quoted.join(", "))
    }

    fn logs(&self) -> String {
        (0..3)
            .map(|i| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log")))
                    .unwrap_or_default();
                format!("m{i}:\n{}", tail(&text, 15))
            })
            .collect()
    }
}

/// Starts member `m{i}` of the three-member TLS cluster `initial`, with
/// client port `c` and peer port `p`, logging to `dir/m{i}.log`.
fn spawn_member(pki: &Pki, dir: &Path, i: usize, (c, p): (u16, u16), initial: &str) -> Child {
    let f = |n: &str| pki.path(n).display().to_string();
    let client = format!("https://127.0.0.1:{c}");
    let peer = format!("https://127.0.0.1:{p}");
    let log = std::fs::File::create(dir.join(format!("m{i}.log"))).unwrap();
    Command::new("etcd")
        .args(["--name", &format!("m{i}"), "--data-dir"])
        .arg(dir.join(format!("m{i}")))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", initial])
        .args([
            "--cert-file",
            &f("server.pem"),
            "--key-file",
            &f("server-key.pem"),
        ])
        .args(["--trusted-ca-file", &f("ca.pem"), "--client-cert-auth"])
        .args(["--peer-cert-file", &f("server.pem")])
        .args(["--peer-key-file", &f("server-key.pem")])
        .args([
            "--peer-trusted-ca-file",
            &f("ca.pem"),
            "--peer-client-cert-auth",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start etcd (Debian package etcd-server)")
}

impl Drop for SecureEtcd {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Redis with no plain port: TLS only, the default user off, and the ACL
/// user `fencegate` (keys, the keyspace-notification channels, commands).
pub struct SecureRedis {
    /// `rediss://127.0.0.1:PORT/0`.
    pub url: String,
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl SecureRedis {
    pub fn start(pki: &Pki) -> SecureRedis {
        let dir = scratch_dir();
        let port = free_port();
        let f = |n: &str| pki.path(n).display().to_string();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("redis.conf"),
            format!(
                "bind 127.0.0.1\nport 0\ntls-port {port}\ndir {d}\nlogfile {d}/redis.log\n\
                 save \"\"\ndaemonize no\nappendonly yes\nappendfsync always\n\
                 notify-keyspace-events Kgxe\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients optional\nuser default off\n\
                 user {USER} on >{PASSWORD} ~* &* +@all\n",
                f("server.pem"),
                f("server-key.pem"),
                f("ca.pem"),
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(dir.path().join("redis.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = SecureRedis {
            url: format!("rediss://127.0.0.1:{port}/0"),
            port,
            child,
            _dir: dir,
        };
        super::wait_until(30, "TLS Redis to answer", || {
            r.cli(pki, &["--user", USER, "--pass", PASSWORD], &["PING"])
                .lines()
                .any(|l| l.trim() == "PONG")
        });
        r
    }

    /// `redis-cli --tls` (trusting the test CA) with `auth` flags; stdout
    /// and stderr together.
    pub fn cli(&self, pki: &Pki, auth: &[&str], args: &[&str]) -> String {
        redis_cli(
            self.port,
            &[
                "--tls",
                "--cacert",
                &pki.path("ca.pem").display().to_string(),
            ],
            auth,
            args,
        )
    }
}

/// `redis-cli -h 127.0.0.1 -p PORT TLS AUTH ARGS`: stdout and stderr.
pub fn redis_cli(port: u16, tls: &[&str], auth: &[&str], args: &[&str]) -> String {
    let o = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(tls)
        .args(auth)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl Drop for SecureRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PostgreSQL's pg_hba.conf for the secure server: the harness's own psql
/// (user postgres) is trusted over TLS; every other role needs TLS and a
/// SCRAM password; nothing is accepted without TLS.
pub const PG_HBA: &str = "local all all trust\n\
hostssl all postgres 127.0.0.1/32 trust\n\
hostssl all all 127.0.0.1/32 scram-sha-256\n\
host all all 127.0.0.1/32 reject\n";

/// Copies the server certificate and key into PostgreSQL's data directory
/// `data`, owned by the server's user with the mode it demands.
pub fn postgres_tls_files(pki: &Pki, data: &Path) {
    for name in ["server.pem", "server-key.pem"] {
        let to = data.join(name);
        std::fs::copy(pki.path(name), &to).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&to)
            .status();
        let _ = Command::new("chmod").arg("600").arg(&to).status();
    }
    std::fs::write(data.join("pg_hba.conf"), PG_HBA).unwrap();
    let _ = Command::new("chown")
        .args(["postgres:postgres"])
        .arg(data.join("pg_hba.conf"))
        .status();
}

/// The `postgres -c` settings of the secure server.
pub const PG_SSL_ARGS: &[&str] = &[
    "-c",
    "ssl=on",
    "-c",
    "ssl_cert_file=server.pem",
    "-c",
    "ssl_key_file=server-key.pem",
    "-c",
    "password_encryption=scram-sha-256",
];

/// ZooKeeper's settings that demand SASL (DIGEST-MD5, user `fencegate`):
/// zoo.cfg lines, and the JVM flags with the JAAS file written into `dir`.
pub fn zookeeper_sasl(dir: &Path) -> (String, Vec<String>) {
    let jaas = dir.join("jaas.conf");
    std::fs::write(
        &jaas,
        format!(
            "Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_{USER}=\"{PASSWORD}\";\n}};\n"
        ),
    )
    .unwrap();
    let cfg = "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
               sessionRequireClientSASLAuth=true\n"
        .to_string();
    let jvm = vec![
        format!("-Djava.security.auth.login.config={}", jaas.display()),
        "-Dzookeeper.sessionRequireClientSASLAuth=true".to_string(),
        "-Dzookeeper.authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
            .to_string(),
    ];
    (cfg, jvm)
}

/// ZooKeeper demanding SASL (as [`zookeeper_sasl`]) and serving TLS on
/// `secure_port` (Netty, PEM key and trust stores, client certificates
/// required: ZooKeeper's default). The plain port stays for the harness's
/// readiness probe; without SASL it serves no session either.
pub fn zookeeper_secure(
    pki: &Pki,
    secure_port: u16,
) -> impl FnOnce(&Path) -> (String, Vec<String>) + '_ {
    move |dir| {
        let (mut cfg, mut jvm) = zookeeper_sasl(dir);
        cfg.push_str(&format!(
            "secureClientPort={secure_port}\nsecureClientPortAddress=127.0.0.1\n"
        ));
        let f = |n: &str| pki.path(n).display().to_string();
        for (k, v) in [
            (
                "serverCnxnFactory",
                "org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
            ),
            ("ssl.keyStore.location", f("server-bundle.pem")),
            ("ssl.keyStore.type", "PEM".to_string()),
            ("ssl.trustStore.location", f("ca.pem")),
            ("ssl.trustStore.type", "PEM".to_string()),
            ("ssl.clientAuth", "need".to_string()),
        ] {
            jvm.push(format!("-Dzookeeper.{k}={v}"));
        }
        (cfg, jvm)
    }
}
