//! One backend behind fencegate, as the differential test drives it: starts
//! the store (embedded, Garage or moto) and fencegate (virtual hosts under
//! `s3.test`), seeds the buckets `shared` and `oth`, sends a generated case
//! through the raw SigV4 client, and reads back the two things the check
//! compares: what the backend holds (listed directly with the backend's own
//! credential, except the embedded store, which only fencegate can reach)
//! and what fencegate fenced (its admin API).

use super::common::fencegate::{DEMO_KEY, DEMO_SECRET, Fencegate, LIMITED_KEY, LIMITED_SECRET};
use super::common::garage::Garage;
use super::common::moto::{self, Moto};
use super::common::raw::{RawClient, RawRequest, Source};
use super::shapes::{Carrier, Case, Cred, SEEDS, Shape, seed_body};
use aws_sdk_s3::config::{Credentials, Region};
use http::Method;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Embedded,
    Garage,
    Moto,
}

/// (bucket, key) → (ETag, size, last modified).
pub type Objects = BTreeMap<(String, String), (String, i64, String)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub buckets: Vec<String>,
    pub objects: Objects,
}

/// One request sent for a case: what it was and what came back.
pub struct Exchange {
    pub what: String,
    pub status: u16,
    pub code: Option<String>,
}

pub struct World {
    pub which: Which,
    pub fg: Fencegate,
    raw: RawClient,
    lister: aws_sdk_s3::Client,
    _garage: Option<Garage>,
    _moto: Option<Moto>,
}

fn sdk_client(endpoint: &str, region: &str, key: &str, secret: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new(region.to_string()))
        .credentials_provider(Credentials::new(key, secret, None, None, "differential"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// A key as a path (unreserved bytes and `/` kept, the rest `%XX`).
pub fn enc_path(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A query value, everything but the unreserved bytes encoded.
fn enc_query(v: &str) -> String {
    enc_path(v).replace('/', "%2F")
}

fn xml_text(body: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{tag}>"))? + start;
    Some(
        body[start..end]
            .replace("&quot;", "\"")
            .replace("&amp;", "&"),
    )
}

impl World {
    pub async fn start(which: Which) -> World {
        let domains = "domains = [\"s3.test\"]";
        let (fg, lister, garage, moto) = match which {
            Which::Embedded => {
                let fg =
                    Fencegate::start_with(super::common::fencegate::Backend::Embedded, domains, "");
                let lister = sdk_client(&fg.endpoint(), "us-east-1", DEMO_KEY, DEMO_SECRET);
                (fg, lister, None, None)
            }
            Which::Garage => {
                let g = Garage::start();
                let fg = Fencegate::start_with(g.backend(), domains, "");
                let lister = sdk_client(&g.endpoint, "garage", &g.key_id, &g.secret);
                (fg, lister, Some(g), None)
            }
            Which::Moto => {
                let m = Moto::start();
                let fg = Fencegate::start_with(m.backend(), domains, "");
                let lister = sdk_client(&m.endpoint, "us-east-1", moto::KEY, moto::SECRET);
                (fg, lister, None, Some(m))
            }
        };
        let raw = RawClient::new(&fg.endpoint());
        let world = World {
            which,
            fg,
            raw,
            lister,
            _garage: garage,
            _moto: moto,
        };
        let admin = super::common::sdk(&world.fg.endpoint());
        for b in ["shared", "oth"] {
            super::common::ensure_bucket(&admin, b).await;
        }
        for (b, k) in SEEDS {
            world.put(b, k, seed_body(b, k), 1).await;
        }
        world
    }

    /// PutObject through fencegate as the demo credential.
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>, token: u64) {
        let path = format!("/{bucket}/{}", enc_path(key));
        let r = self
            .raw
            .send(RawRequest::put(&path, body).token(token))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "seeding {path}: {}", r.body);
    }

    /// Deletes an object: at the backend itself when the test can reach it
    /// (the key may be one fencegate would refuse), else through fencegate
    /// as the demo credential.
    pub async fn delete(&self, bucket: &str, key: &str, token: u64) {
        if self.which != Which::Embedded {
            self.lister
                .delete_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .unwrap_or_else(|e| panic!("cleaning {bucket}/{key}: {e:?}"));
            return;
        }
        let path = format!("/{bucket}/{}", enc_path(key));
        let r = self
            .raw
            .send(RawRequest::new(Method::DELETE, &path).token(token))
            .await
            .unwrap();
        assert!(r.status < 300, "cleaning {path}: {}", r.body);
    }

    /// The bucket names and every object of `shared` and `oth`.
    pub async fn snapshot(&self) -> Snapshot {
        let listed = self
            .lister
            .list_buckets()
            .send()
            .await
            .expect("list buckets");
        let mut buckets: Vec<String> = listed
            .buckets()
            .iter()
            .filter_map(|b| b.name().map(str::to_string))
            .collect();
        buckets.sort();
        let mut objects = Objects::new();
        for bucket in ["shared", "oth"] {
            if !buckets.iter().any(|b| b == bucket) {
                continue;
            }
            let mut token: Option<String> = None;
            loop {
                let page = self
                    .lister
                    .list_objects_v2()
                    .bucket(bucket)
                    .set_continuation_token(token.clone())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("list {bucket}: {e:?}"));
                for o in page.contents() {
                    objects.insert(
                        (bucket.to_string(), o.key().unwrap_or_default().to_string()),
                        (
                            o.e_tag().unwrap_or_default().to_string(),
                            o.size().unwrap_or(-1),
                            o.last_modified().map(|d| d.to_string()).unwrap_or_default(),
                        ),
                    );
                }
                token = page.next_continuation_token().map(str::to_string);
                if token.is_none() {
                    break;
                }
            }
        }
        Snapshot { buckets, objects }
    }

    /// Each bucket's lifecycle rules (their IDs), or the error reading them.
    pub async fn lifecycles(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for bucket in ["shared", "oth"] {
            let got = self
                .lister
                .get_bucket_lifecycle_configuration()
                .bucket(bucket)
                .send()
                .await;
            let v = match got {
                Ok(c) => c
                    .rules()
                    .iter()
                    .map(|r| r.id().unwrap_or("?").to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                Err(e) => format!(
                    "error {}",
                    aws_sdk_s3::error::ProvideErrorMetadata::code(&e).unwrap_or("?")
                ),
            };
            out.insert(bucket.to_string(), v);
        }
        out
    }

    /// An object's body, read from the backend (through fencegate, without
    /// a token, for the embedded store).
    pub async fn body(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let o = self
            .lister
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .ok()?;
        Some(o.body.collect().await.ok()?.into_bytes().to_vec())
    }

    /// Every fence fencegate records: resource → highest token.
    pub async fn fences(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = format!("http://{}/fences?limit=1000", self.fg.admin);
            if let Some(a) = &after {
                url.push_str(&format!("&after={}", enc_query(a)));
            }
            let (status, body) = super::common::http_call("GET", &url, None, None).await;
            assert_eq!(status, 200, "{url}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            for f in v["fences"].as_array().unwrap() {
                out.insert(
                    f["resource"].as_str().unwrap().to_string(),
                    f["highest"].as_u64().unwrap(),
                );
            }
            match v["next_after"].as_str() {
                Some(a) => after = Some(a.to_string()),
                None => break,
            }
        }
        out
    }

    /// A request of `case` (its credential, host and token carrier) with
    /// the given method, path, query pieces, extra headers and body.
    fn request(
        &self,
        case: &Case,
        t: u64,
        method: Method,
        query: &[String],
        headers: &[(String, String)],
        body: Option<Vec<u8>>,
    ) -> RawRequest {
        let mut r = RawRequest::new(method, &case.path);
        let mut q: Vec<String> = query.to_vec();
        match case.carrier {
            Carrier::Header => r.headers.push(("x-fencing-token".into(), t.to_string())),
            Carrier::Meta => r
                .headers
                .push(("x-amz-meta-fencing-token".into(), t.to_string())),
            Carrier::Query => q.push(format!("x-fencing-token={t}")),
        }
        r.query = q.join("&");
        r.headers.extend(headers.iter().cloned());
        r.body = body.map(Source::bytes);
        r.host = case.host.clone();
        if case.presign {
            r.presign = Some(Duration::from_secs(600));
        }
        let (key, secret) = match case.cred {
            Cred::Demo => (DEMO_KEY, DEMO_SECRET),
            Cred::Limited => (LIMITED_KEY, LIMITED_SECRET),
        };
        r.key = key.into();
        r.secret = secret.into();
        r
    }

    async fn exchange(&self, what: String, r: RawRequest) -> (Exchange, String) {
        match self.raw.send(r).await {
            Ok(resp) => (
                Exchange {
                    what,
                    status: resp.status,
                    code: resp.code().map(str::to_string),
                },
                resp.body,
            ),
            Err(e) => (
                Exchange {
                    what,
                    status: 0,
                    code: Some(e),
                },
                String::new(),
            ),
        }
    }

    /// Sends `case` with token `t`: one request, or three for UploadPartCopy.
    pub async fn send(&self, case: &Case, t: u64) -> Vec<Exchange> {
        if case.shape != Shape::PartCopy {
            let r = self.request(
                case,
                t,
                case.method.clone(),
                &case.query,
                &case.headers,
                case.body.clone(),
            );
            return vec![self.exchange(case.method.to_string(), r).await.0];
        }
        let mut out = Vec::new();
        let create = self.request(case, t, Method::POST, &["uploads".into()], &[], None);
        let (ex, body) = self.exchange("CreateMultipartUpload".into(), create).await;
        let ok = ex.status == 200;
        out.push(ex);
        let Some(upload) = xml_text(&body, "UploadId").filter(|_| ok) else {
            return out;
        };
        let id = format!("uploadId={}", enc_query(&upload));
        let copy = self.request(
            case,
            t,
            Method::PUT,
            &["partNumber=1".into(), id.clone()],
            &case.headers,
            None,
        );
        let (ex, body) = self.exchange("UploadPartCopy".into(), copy).await;
        let etag = xml_text(&body, "ETag").filter(|_| ex.status == 200);
        out.push(ex);
        let xml = match &etag {
            Some(e) => format!(
                "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{e}</ETag></Part></CompleteMultipartUpload>"
            ),
            None => String::new(),
        };
        if etag.is_some() {
            let complete = self.request(case, t, Method::POST, &[id], &[], Some(xml.into_bytes()));
            out.push(
                self.exchange("CompleteMultipartUpload".into(), complete)
                    .await
                    .0,
            );
        } else {
            let abort = self.request(case, t, Method::DELETE, &[id], &[], None);
            out.push(self.exchange("AbortMultipartUpload".into(), abort).await.0);
        }
        out
    }
}
