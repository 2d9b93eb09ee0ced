//! Session credentials that carry a fencing token (CONTRACT §10): how a
//! program that cannot add a token to its requests (a compactor, a backup,
//! an archiver) is fenced through the S3 credentials it already reads.
//!
//! fencegate issues an access key id, a secret and a session token, in the
//! form of AWS STS credentials. The session token is the credential's whole
//! description, signed: `FGS1.<key id>.<body>.<mac>`, where the body
//! (base64url JSON) names the access key id, the fencing token, the lock it
//! came from, the scope (buckets and key prefixes) and the expiry, and the
//! MAC is HMAC-SHA256 over it with the issuing key. The secret is
//! HMAC-SHA256 of that MAC with the issuing key, so that
//!
//! - verifying needs no lookup: any replica holding the issuing key
//!   recomputes the secret from the session token the request carries
//!   (signed, as `X-Amz-Security-Token`), then checks the SigV4 signature
//!   with it as with any credential;
//! - the secret cannot be computed from anything on the wire: the access
//!   key id, the session token and the signature are all public to a
//!   listener, the issuing key never leaves fencegate;
//! - nothing in the token can be altered: the MAC covers it.
//!
//! Keys rotate: the first key issues, every key listed verifies (its id in
//! the token picks it), so an old key stays accepted until the operator
//! removes it, at the latest `max_ttl_secs` after rotating.

use super::error::S3Error;
use super::op::{Effect, Op, Operation};
use super::query::{Param, has_query_param, query_param};
use super::signing_key::hmac;
use super::sigv4::same_signature;
use crate::config::Credential;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Every session access key id begins so (AWS's own begin with `ASIA`).
pub const KEY_PREFIX: &str = "FGS";
const TOKEN_PREFIX: &str = "FGS1";
const MAC_CONTEXT: &[u8] = b"fencegate session v1\n";
const SECRET_CONTEXT: &[u8] = b"fencegate session secret v1\n";

/// Whether `access_key_id` names a session credential.
pub fn is_session_key(access_key_id: &str) -> bool {
    access_key_id.starts_with(KEY_PREFIX)
}

/// A bucket and a key prefix a credential reaches; bucket `*` is every
/// bucket. Written `bucket/prefix`, `bucket` (all of it) or `*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    pub bucket: String,
    pub prefix: String,
}

impl Scope {
    pub fn parse(s: &str) -> Result<Scope, String> {
        let (bucket, prefix) = s.split_once('/').unwrap_or((s, ""));
        if bucket.is_empty() {
            return Err(format!("scope {s:?}: name a bucket (or *), then /prefix"));
        }
        if bucket == "*" && !prefix.is_empty() {
            return Err(format!("scope {s:?}: a prefix needs a bucket, not *"));
        }
        Ok(Scope {
            bucket: bucket.into(),
            prefix: prefix.into(),
        })
    }

    fn has_bucket(&self, bucket: &str) -> bool {
        self.bucket == "*" || self.bucket == bucket
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.prefix.is_empty() {
            true => write!(f, "{}", self.bucket),
            false => write!(f, "{}/{}", self.bucket, self.prefix),
        }
    }
}

/// What a verified session credential carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The access key id the token was issued with.
    #[serde(rename = "k")]
    pub access_key_id: String,
    /// The fencing token every request signed with it carries.
    #[serde(rename = "t")]
    pub token: u64,
    /// The lock the token came from (for messages and logs).
    #[serde(rename = "l")]
    pub lock: String,
    #[serde(rename = "s")]
    pub scope: Vec<Scope>,
    /// Unix seconds.
    #[serde(rename = "e")]
    pub expires: u64,
}

impl Session {
    /// Whether the scope reaches `bucket` at all (bucket-level reads).
    pub fn allows_bucket(&self, bucket: &str) -> bool {
        self.scope.iter().any(|s| s.has_bucket(bucket))
    }

    /// Whether the scope reaches `key` in `bucket` (an object), or, for a
    /// listing, every key under the prefix `key`.
    pub fn allows_key(&self, bucket: &str, key: &str) -> bool {
        (self.scope.iter()).any(|s| s.has_bucket(bucket) && key.starts_with(&s.prefix))
    }

    /// Whether the scope reaches what `op` touches: its object (and a
    /// copy's source), or every key a listing may show (its `prefix`).
    /// DeleteObjects' keys are checked when its body is read.
    pub fn reaches(&self, op: &Operation, query: &[Param<'_>]) -> Result<(), S3Error> {
        let Some(bucket) = &op.bucket else {
            return Ok(());
        };
        if !self.allows_bucket(bucket) {
            return Err(self.outside(&format!("bucket {bucket}")));
        }
        if op.effect() == Effect::BucketWrite {
            return Err(self.outside(&format!("administering bucket {bucket}")));
        }
        // Of a bucket's configuration, only its location: a store that does
        // not know a subresource answers the bucket's listing instead (s3s
        // and Garage do, for `?metadataConfiguration`), which no prefix
        // would then hold.
        if op.op == Op::GetBucketConfig && !has_query_param(query, "location") {
            return Err(self.outside(&format!("the configuration of bucket {bucket}")));
        }
        if let Some(key) = &op.key
            && !self.allows_key(bucket, key)
        {
            return Err(self.outside(&format!("{bucket}/{key}")));
        }
        if let Some(src) = &op.copy_source
            && !self.allows_key(&src.bucket, &src.key)
        {
            let what = format!("the copy source {}/{}", src.bucket, src.key);
            return Err(self.outside(&what));
        }
        let lists = matches!(
            op.op,
            Op::ListObjects | Op::ListObjectsV2 | Op::ListObjectVersions | Op::ListMultipartUploads
        );
        let prefix = query_param(query, "prefix").unwrap_or_default();
        if lists && !self.allows_key(bucket, prefix) {
            return Err(self.outside(&format!("listing {bucket}/{prefix}")));
        }
        Ok(())
    }

    /// `403 AccessDenied` for `what`, naming the scope and the lock.
    pub fn outside(&self, what: &str) -> S3Error {
        let scope: Vec<String> = self.scope.iter().map(|x| x.to_string()).collect();
        S3Error::AccessDenied(format!(
            "{what} is outside the scope of session credential {} ({}; lock {:?})",
            self.access_key_id,
            scope.join(", "),
            self.lock
        ))
    }

    /// The credential the rest of the request path sees: the scope's
    /// buckets, never a bucket administrator.
    pub fn credential(&self) -> Credential {
        Credential {
            access_key_id: self.access_key_id.clone(),
            secret_access_key: String::new(),
            buckets: self.scope.iter().map(|s| s.bucket.clone()).collect(),
            bucket_admin: false,
        }
    }
}

/// A session credential as issued, in the names AWS STS uses.
pub struct SessionCredential {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub session: Session,
}

/// One issuing key: its id (the first 8 hex digits of its SHA-256) and
/// bytes.
struct IssuingKey {
    id: String,
    key: Vec<u8>,
}

/// The keys sessions are issued and verified with; the first issues.
pub struct SessionKeys {
    keys: Vec<IssuingKey>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("SessionKeys").field("ids", &ids).finish()
    }
}

fn read_key(path: &Path) -> Result<IssuingKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("session key {}: {e}", path.display()))?;
    let key = text.trim().as_bytes().to_vec();
    let least = crate::config::MIN_SESSION_KEY_CHARS;
    if key.len() < least {
        return Err(format!(
            "session key {} has {} characters: at least {least} are needed \
             (make one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)",
            path.display(),
            key.len()
        ));
    }
    Ok(IssuingKey {
        id: super::sigv4::sha256_hex(&key)[..8].to_string(),
        key,
    })
}

impl SessionKeys {
    /// The keys in `files`; the first issues.
    pub fn load(files: &[&Path]) -> Result<SessionKeys, String> {
        let keys = files
            .iter()
            .map(|p| read_key(p))
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err("no session key".into());
        }
        Ok(SessionKeys { keys })
    }

    /// The key in `path`, made there (64 random hex digits, mode 0600) on
    /// first use.
    pub fn load_or_create(path: &Path) -> Result<SessionKeys, String> {
        if !path.exists() {
            let key: [u8; 32] = rand::random();
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let written = opts.open(path).and_then(|mut f| {
                std::io::Write::write_all(&mut f, format!("{}\n", hex::encode(key)).as_bytes())?;
                f.sync_all()
            });
            written.map_err(|e| format!("cannot create session key {}: {e}", path.display()))?;
        }
        Self::load(&[path])
    }

    /// A credential for `session`'s token, lock, scope and expiry (its
    /// access key id is made here).
    pub fn issue(
        &self,
        token: u64,
        lock: &str,
        scope: Vec<Scope>,
        expires: u64,
    ) -> SessionCredential {
        let key = &self.keys[0];
        let suffix: String = (0..17)
            .map(|_| {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[rand::random::<u8>() as usize % 32] as char
            })
            .collect();
        let session = Session {
            access_key_id: format!("{KEY_PREFIX}{suffix}"),
            token,
            lock: lock.into(),
            scope,
            expires,
        };
        let body = serde_json::to_vec(&session).expect("a session serialises");
        let signed = format!("{TOKEN_PREFIX}.{}.{}", key.id, B64.encode(body));
        let mac = mac(&key.key, &signed);
        SessionCredential {
            access_key_id: session.access_key_id.clone(),
            secret_access_key: secret(&key.key, &mac),
            session_token: format!("{signed}.{}", B64.encode(mac)),
            session,
        }
    }

    /// The session `session_token` describes and the secret it was issued
    /// with, if fencegate issued it for `access_key_id` and it has not
    /// expired at `now`.
    pub fn verify(
        &self,
        access_key_id: &str,
        session_token: &str,
        now: SystemTime,
    ) -> Result<(Session, String), S3Error> {
        let invalid = |why: &str| S3Error::InvalidToken(format!("the session token {why}"));
        let (signed, mac_b64) = session_token
            .rsplit_once('.')
            .ok_or_else(|| invalid("is malformed"))?;
        let mut parts = signed.splitn(3, '.');
        let (Some(TOKEN_PREFIX), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("is not one fencegate issues"));
        };
        let key = (self.keys.iter().find(|k| k.id == id))
            .ok_or_else(|| invalid("was issued with a key this fencegate no longer accepts"))?;
        let mac = mac(&key.key, signed);
        if !same_signature(&B64.encode(mac), mac_b64) {
            return Err(invalid(
                "does not verify: it was altered, or is not fencegate's",
            ));
        }
        let body = B64.decode(body).map_err(|_| invalid("is malformed"))?;
        let session: Session =
            serde_json::from_slice(&body).map_err(|_| invalid("is malformed"))?;
        if session.access_key_id != access_key_id {
            return Err(invalid("belongs to another access key id"));
        }
        if unix_secs(now) >= session.expires {
            return Err(S3Error::ExpiredToken);
        }
        let secret = secret(&key.key, &mac);
        Ok((session, secret))
    }
}

/// The session keys the configuration names: `[sessions] key_file` (and
/// the previous ones); else, on one node, `<data_dir>/session.key`, made on
/// first start; in cluster mode without a key file, none (sessions off:
/// every replica must verify what any replica issued).
pub fn keys_from_config(cfg: &crate::config::Config) -> Result<Option<SessionKeys>, String> {
    let s = &cfg.sessions;
    match (&s.session_key_file, &cfg.cluster) {
        (Some(current), _) => {
            let files: Vec<&Path> = std::iter::once(current.as_path())
                .chain(s.previous_key_files.iter().map(|p| p.as_path()))
                .collect();
            SessionKeys::load(&files).map(Some)
        }
        (None, Some(_)) => Ok(None),
        (None, None) => {
            let path = cfg.server.data_dir.join("session.key");
            SessionKeys::load_or_create(&path).map(Some)
        }
    }
}

/// Issues credentials at the admin API: the keys and the lifetimes allowed.
pub struct SessionIssuer {
    pub keys: std::sync::Arc<SessionKeys>,
    pub max_ttl_secs: u64,
    pub default_ttl_secs: u64,
}

impl SessionIssuer {
    /// A credential for `token` from `lock`, over `scope` (every bucket
    /// when empty), for `ttl_secs` (the default when none) from `now`.
    pub fn issue(
        &self,
        token: u64,
        lock: &str,
        scope: &[String],
        ttl_secs: Option<u64>,
        now: SystemTime,
    ) -> Result<SessionCredential, String> {
        let ttl = ttl_secs.unwrap_or(self.default_ttl_secs);
        if ttl == 0 || ttl > self.max_ttl_secs {
            return Err(format!(
                "ttl_secs must be between 1 and {} (sessions.max_ttl_secs)",
                self.max_ttl_secs
            ));
        }
        let scope = match scope.is_empty() {
            true => vec![Scope::parse("*")?],
            false => scope
                .iter()
                .map(|s| Scope::parse(s))
                .collect::<Result<_, _>>()?,
        };
        Ok(self.keys.issue(token, lock, scope, unix_secs(now) + ttl))
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`, as STS writes `Expiration`.
pub fn rfc3339(unix: u64) -> String {
    let c = crate::utc::civil(unix);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Seconds since 1970, as expiries are kept.
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn mac(key: &[u8], signed: &str) -> [u8; 32] {
    let mut data = MAC_CONTEXT.to_vec();
    data.extend_from_slice(signed.as_bytes());
    hmac(key, &data)
}

fn secret(key: &[u8], mac: &[u8; 32]) -> String {
    let mut data = SECRET_CONTEXT.to_vec();
    data.extend_from_slice(mac);
    B64.encode(hmac(key, &data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(name: &str) -> SessionKeys {
        SessionKeys {
            keys: vec![IssuingKey {
                id: super::super::sigv4::sha256_hex(name.as_bytes())[..8].to_string(),
                key: name.as_bytes().to_vec(),
            }],
        }
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    fn scope(s: &str) -> Vec<Scope> {
        vec![Scope::parse(s).unwrap()]
    }

    #[test]
    fn an_issued_credential_verifies_with_its_secret() {
        let k = keys("issuing-key-0123456789abcdefghijkl");
        let i = k.issue(42, "backup", scope("b/jobs/"), 1000);
        assert!(is_session_key(&i.access_key_id));
        let (s, secret) = k
            .verify(&i.access_key_id, &i.session_token, at(999))
            .unwrap();
        assert_eq!(secret, i.secret_access_key);
        assert_eq!((s.token, s.lock.as_str()), (42, "backup"));
        // Nothing of the secret is in what travels.
        assert!(!i.session_token.contains(&i.secret_access_key));
    }

    #[test]
    fn expired_altered_foreign_and_misapplied_tokens_are_refused() {
        let k = keys("issuing-key-0123456789abcdefghijkl");
        let i = k.issue(42, "backup", scope("b/jobs/"), 1000);
        let code = |r: Result<(Session, String), S3Error>| r.unwrap_err().code();
        assert_eq!(
            code(k.verify(&i.access_key_id, &i.session_token, at(1000))),
            "ExpiredToken"
        );
        // The body altered to a higher token: the MAC no longer holds.
        let (head, mac) = i.session_token.rsplit_once('.').unwrap();
        let (prefix, body) = head.rsplit_once('.').unwrap();
        let mut s: Session = serde_json::from_slice(&B64.decode(body).unwrap()).unwrap();
        s.token = 99;
        let forged = format!(
            "{prefix}.{}.{mac}",
            B64.encode(serde_json::to_vec(&s).unwrap())
        );
        assert_eq!(
            code(k.verify(&i.access_key_id, &forged, at(1))),
            "InvalidToken"
        );
        let other = keys("another-key-0123456789abcdefghijklm");
        assert_eq!(
            code(other.verify(&i.access_key_id, &i.session_token, at(1))),
            "InvalidToken"
        );
        assert_eq!(
            code(k.verify("FGSOTHER", &i.session_token, at(1))),
            "InvalidToken"
        );
        assert_eq!(
            code(k.verify(&i.access_key_id, "garbage", at(1))),
            "InvalidToken"
        );
    }

    #[test]
    fn an_old_key_still_verifies_after_rotation() {
        let old = keys("old-issuing-key-0123456789abcdefghij");
        let i = old.issue(7, "l", scope("*"), 1000);
        let mut rotated = keys("new-issuing-key-0123456789abcdefghij");
        rotated.keys.extend(old.keys);
        assert!(
            rotated
                .verify(&i.access_key_id, &i.session_token, at(1))
                .is_ok()
        );
        let fresh = rotated.issue(8, "l", scope("*"), 1000);
        assert!(fresh.session_token.contains(&rotated.keys[0].id));
    }

    /// Of a bucket's configuration a session reaches only its location: a
    /// store that does not know a subresource answers the listing instead
    /// (s3s for `?metadataConfiguration`), which no prefix would hold.
    #[test]
    fn a_session_reads_no_bucket_configuration_but_its_location() {
        let s = Session {
            access_key_id: "FGSX".into(),
            token: 1,
            lock: "l".into(),
            scope: vec![Scope::parse("b/jobs/").unwrap()],
            expires: 9,
        };
        let reach = |q: &[(&str, &str)]| {
            let q: Vec<Param> = q.iter().map(|&(a, b)| (a.into(), b.into())).collect();
            let op = super::super::op::classify(
                &http::Method::GET,
                Some("b".into()),
                None,
                &q,
                &http::HeaderMap::new(),
            )
            .unwrap();
            s.reaches(&op, &q).map_err(|e| e.code())
        };
        assert_eq!(reach(&[("location", "")]), Ok(()));
        assert_eq!(reach(&[("prefix", "jobs/")]), Ok(()));
        for q in [
            &[("metadataConfiguration", ""), ("prefix", "other/")][..],
            &[("metadataTable", "")][..],
            &[("acl", "")][..],
            &[("prefix", "other/"), ("delimiter", "/")][..],
        ] {
            assert_eq!(reach(q), Err("AccessDenied"), "{q:?}");
        }
    }

    #[test]
    fn scopes_reach_their_buckets_and_prefixes_only() {
        let s = Session {
            access_key_id: "FGSX".into(),
            token: 1,
            lock: "l".into(),
            scope: vec![Scope::parse("b/jobs/").unwrap(), Scope::parse("c").unwrap()],
            expires: 9,
        };
        assert!(s.allows_key("b", "jobs/1") && s.allows_key("c", "any"));
        assert!(!s.allows_key("b", "other/1") && !s.allows_key("d", "jobs/1"));
        assert!(s.allows_bucket("b") && !s.allows_bucket("d"));
        assert!(Scope::parse("*/x").is_err() && Scope::parse("/x").is_err());
        assert_eq!(Scope::parse("b/p/q").unwrap().to_string(), "b/p/q");
    }
}
