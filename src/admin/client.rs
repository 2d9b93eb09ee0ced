//! The admin API from the shell: `fencegate fences ...`, and the session
//! credentials `fencegate credentials` and `fencegate lock --credentials`
//! ask for (`issue`).

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

/// What to ask the admin API.
pub enum FenceCommand {
    List {
        prefix: Option<String>,
        limit: Option<usize>,
        after: Option<String>,
    },
    Get {
        resource: String,
    },
    Raise {
        resource: String,
        token: u64,
    },
}

fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

/// Sends `cmd` to the admin API at `base` (`http://host:port`); prints the
/// JSON answer and returns whether it was a success.
pub async fn run(base: &str, token: Option<&str>, cmd: FenceCommand) -> Result<bool, String> {
    let base = base.trim_end_matches('/');
    let (method, path, body) = match cmd {
        FenceCommand::List {
            prefix,
            limit,
            after,
        } => {
            let mut q = Vec::new();
            if let Some(p) = prefix {
                q.push(format!("prefix={}", enc(&p)));
            }
            if let Some(l) = limit {
                q.push(format!("limit={l}"));
            }
            if let Some(a) = after {
                q.push(format!("after={}", enc(&a)));
            }
            (Method::GET, format!("/fences?{}", q.join("&")), None)
        }
        FenceCommand::Get { resource } => {
            (Method::GET, format!("/fences/{}", enc(&resource)), None)
        }
        FenceCommand::Raise { resource, token } => (
            Method::POST,
            format!("/fences/{}", enc(&resource)),
            Some(format!("{{\"token\":{token}}}")),
        ),
    };
    let (status, body) = request(base, token, method, &path, body).await?;
    let text = String::from_utf8_lossy(&body);
    if status.is_success() {
        println!("{text}");
    } else {
        eprintln!("{status}: {text}");
    }
    Ok(status.is_success())
}

/// The admin API's reply to `POST /credentials`: session credentials as
/// it issues them.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CredentialsReply {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub expiration: String,
    pub fencing_token: u64,
}

impl CredentialsReply {
    /// The variables a program reads them from: the AWS SDKs' (and aws
    /// CLI's, rclone's with `env_auth`, restic's, object_store's...).
    pub fn env(&self, s3_url: Option<&str>) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("AWS_ACCESS_KEY_ID", self.access_key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key.clone()),
            ("AWS_SESSION_TOKEN", self.session_token.clone()),
        ];
        if let Some(u) = s3_url {
            v.push(("AWS_ENDPOINT_URL", u.to_string()));
        }
        v
    }

    /// The JSON of the aws `credential_process` setting.
    pub fn process_json(&self) -> String {
        serde_json::json!({
            "Version": 1,
            "AccessKeyId": self.access_key_id,
            "SecretAccessKey": self.secret_access_key,
            "SessionToken": self.session_token,
            "Expiration": self.expiration,
        })
        .to_string()
    }
}

/// Asks the admin API at `base` for credentials bound to `token`.
pub async fn issue(
    base: &str,
    bearer: Option<&str>,
    token: u64,
    lock: &str,
    scope: &[String],
    ttl_secs: Option<u64>,
) -> Result<CredentialsReply, String> {
    let base = base.trim_end_matches('/');
    let body =
        serde_json::json!({"token": token, "lock": lock, "scope": scope, "ttl_secs": ttl_secs});
    let (status, body) = request(
        base,
        bearer,
        Method::POST,
        "/credentials",
        Some(body.to_string()),
    )
    .await?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the admin API's answer: {e}"))
}

/// One call to the admin API: status and body.
async fn request(
    base: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<(http::StatusCode, Bytes), String> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("cannot reach the admin API at {base}: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

/// `fencegate fences highest`: the highest fence of every resource (under
/// `prefix`), page by page: what a lock service whose tokens went back must
/// be bumped past (docs/lock-services.md, "When the tokens go back").
/// Returns the highest record, if any, and how many fences were read.
pub async fn highest(
    base: &str,
    prefix: Option<&str>,
) -> Result<(Option<super::transfer::FenceRecordOut>, u64), String> {
    let base = base.trim_end_matches('/');
    let mut after: Option<String> = None;
    let (mut top, mut n): (Option<super::transfer::FenceRecordOut>, u64) = (None, 0);
    loop {
        let mut path = "/fences?limit=1000".to_string();
        if let Some(p) = prefix {
            path.push_str(&format!("&prefix={}", enc(p)));
        }
        if let Some(a) = &after {
            path.push_str(&format!("&after={}", enc(a)));
        }
        let (status, body) = request(base, None, Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        let page: super::transfer::Page =
            serde_json::from_slice(&body).map_err(|e| format!("admin API answer: {e}"))?;
        for f in page.fences {
            n += 1;
            if top.as_ref().is_none_or(|t| f.highest > t.highest) {
                top = Some(super::transfer::FenceRecordOut {
                    resource: f.resource,
                    highest: f.highest,
                });
            }
        }
        match page.next_after {
            Some(a) => after = Some(a),
            None => return Ok((top, n)),
        }
    }
}

/// `fencegate fences export --admin URL`: every fence of a running node,
/// page by page, as JSON lines on `out`. Returns how many.
pub async fn export(base: &str, out: &mut dyn std::io::Write) -> Result<u64, String> {
    let base = base.trim_end_matches('/');
    let mut after: Option<String> = None;
    let mut n = 0;
    loop {
        let mut path = "/fences?limit=1000".to_string();
        if let Some(a) = &after {
            path.push_str(&format!("&after={}", enc(a)));
        }
        let (status, body) = request(base, None, Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
        }
        let page: super::transfer::Page =
            serde_json::from_slice(&body).map_err(|e| format!("admin API answer: {e}"))?;
        n += super::transfer::write_lines(&page.fences, out)?;
        match page.next_after {
            Some(a) => after = Some(a),
            None => return Ok(n),
        }
    }
}
