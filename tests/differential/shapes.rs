//! The seeded generator of request shapes for the differential test. It
//! exists to produce, from one seed, the same list of awkward requests every
//! run: writes whose path, XML body or copy source a backend may read
//! differently from fencegate (`..`, `.`, `//`, `%2F`/`%2E`/`%5C`, virtual
//! hosts, stray query parameters, CDATA and comments in DeleteObjects keys,
//! copy sources in every encoding), sent by both credentials. It knows
//! nothing of what fencegate or a backend will do with them; the check in
//! `check.rs` judges by what actually changed.

use http::Method;

/// xorshift64*: small, seedable, and stable across crate versions.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next_u64() % 100 < pct
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Who sends the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cred {
    /// The demo credential: every bucket, bucket admin.
    Demo,
    /// The limited credential: bucket `shared` only, no bucket admin.
    Limited,
}

impl Cred {
    pub fn allows(self, bucket: &str) -> bool {
        self == Cred::Demo || bucket == "shared"
    }
}

/// Where the fencing token travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    Header,
    Meta,
    Query,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Put,
    Delete,
    /// PUT with `x-amz-copy-source`.
    Copy,
    /// CreateMultipartUpload, UploadPartCopy (the generated request), then
    /// CompleteMultipartUpload, all on the same path.
    PartCopy,
    /// POST `?delete`.
    MultiDelete,
    /// PUT `?lifecycle` on a path that may or may not name a key.
    Lifecycle,
}

/// One generated request (the token is added when it is sent).
#[derive(Clone, Debug)]
pub struct Case {
    pub index: usize,
    pub shape: Shape,
    pub cred: Cred,
    pub method: Method,
    /// Raw path, sent byte for byte.
    pub path: String,
    /// Raw query pieces (joined with `&`), without the token.
    pub query: Vec<String>,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// `Host` for virtual-host style requests.
    pub host: Option<String>,
    pub presign: bool,
    pub carrier: Carrier,
    /// Features of the shape, for the summary of what was caught.
    pub tags: Vec<String>,
}

/// Seeded objects: (bucket, key). Bodies say whose they are; everything in
/// `oth` carries [`SECRET`].
pub const SEEDS: &[(&str, &str)] = &[
    ("shared", "k"),
    ("shared", "a/b"),
    ("shared", "d/x"),
    ("shared", "k."),
    ("shared", "a b"),
    ("shared", " k"),
    ("shared", "k "),
    ("oth", "k"),
    ("oth", "payroll"),
    ("oth", "a/b"),
    ("oth", "d/x"),
];

/// Marker in every body seeded in `oth`: finding it in an object of
/// `shared` after a limited credential's copy means the copy read `oth`.
pub const SECRET: &str = "oth-secret";

pub fn seed_body(bucket: &str, key: &str) -> Vec<u8> {
    if bucket == "oth" {
        format!("{SECRET} of {key}\n").into_bytes()
    } else {
        format!("shared seed {key}\n").into_bytes()
    }
}

/// Seed keys as they appear in a path (encoded).
const PATH_SEEDS: &[&str] = &["k", "a/b", "d/x", "k.", "a%20b"];
const OTH_KEYS: &[&str] = &["payroll", "k", "loot", "a/b"];

/// Path templates: `{s}` a seed key of the request's bucket, `{o}` a key of
/// `oth`. (tag, template)
const TEMPLATES: &[(&str, &str)] = &[
    ("dotdot", "x/../{s}"),
    ("dotdot", "d/x/../../{s}"),
    ("dot", "./{s}"),
    ("dot", "a/./b"),
    ("trailing-dot", "{s}/."),
    ("trailing-dotdot", "{s}/x/.."),
    ("leading-slash", "/{s}"),
    ("double-slash", "a//b"),
    ("double-slash", "d//x"),
    ("other-bucket", "../oth/{o}"),
    ("other-bucket", "x/../../oth/{o}"),
    ("other-bucket-pct", "%2E%2E/oth/{o}"),
    ("other-bucket-pct", ".%2e/oth/{o}"),
    ("other-bucket-pct", "..%2Foth%2F{o}"),
    ("pct-dot", "x/%2E%2E/{s}"),
    ("pct-dot", "%2e/{s}"),
    ("pct-dot", "x/%2e%2E/{s}"),
    ("pct-slash", "x%2F..%2F{s}"),
    ("pct-slash", "a%2Fb"),
    ("pct-slash", "{s}%2F."),
    ("pct-backslash", "x%5C..%5C{s}"),
    ("pct-backslash", "a%5Cb"),
    ("backslash", "x\\..\\{s}"),
    ("space", "a%20b"),
    ("plus", "a+b"),
    ("unicode", "%C3%A9t%C3%A9/{s}"),
    ("unicode", "caf%C3%A9"),
    ("trailing-slash", "{s}/"),
];

/// Segments and separators for random paths.
const SEGMENTS: &[&str] = &[
    "k", "a", "b", "d", "x", "k.", "a%20b", "a+b", "%C3%A9", ".", "..", ".", "..", "%2E", "%2e",
    "%2E%2E", ".%2E", "", "oth", "shared", "payroll",
];
const SEPARATORS: &[&str] = &["/", "/", "/", "/", "%2F", "%5C", "\\"];

/// Stray query parameters on object writes.
const STRAY: &[&str] = &[
    "x-id=PutObject",
    "x-id=PutObject&x-id=PutObject",
    "acl",
    "lifecycle",
    "uploadId=x",
    "versionId=null",
    "x-id=DeleteObject",
    "a=1&a=2",
];

fn key_path(rng: &mut Rng, bucket: &str, tags: &mut Vec<String>) -> String {
    let s = if bucket == "oth" {
        rng.pick(&["k", "payroll", "a/b", "d/x"]).to_string()
    } else {
        rng.pick(PATH_SEEDS).to_string()
    };
    let o = rng.pick(OTH_KEYS).to_string();
    match rng.below(10) {
        0..=2 => {
            tags.push("plain".into());
            s
        }
        3..=6 => {
            let (tag, t) = rng.pick(TEMPLATES);
            tags.push(tag.into());
            t.replace("{s}", &s).replace("{o}", &o)
        }
        _ => {
            tags.push("random-segments".into());
            let n = 1 + rng.below(4);
            let mut p = String::new();
            for i in 0..n {
                if i > 0 {
                    p.push_str(rng.pick(SEPARATORS));
                }
                p.push_str(rng.pick(SEGMENTS));
            }
            p.push('/');
            p.push_str(&s);
            p
        }
    }
}

fn copy_source(rng: &mut Rng, tags: &mut Vec<String>) -> String {
    let bucket = if rng.chance(60) { "oth" } else { "shared" };
    let key = if bucket == "oth" {
        rng.pick(&["payroll", "k", "a/b"])
    } else {
        rng.pick(&["k", "a/b", "a b", "k."])
    };
    let enc_key = |k: &str, all: bool| -> String {
        k.bytes()
            .map(|b| match b {
                b'/' if !all => "/".to_string(),
                b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    let (tag, src) = match rng.below(11) {
        0 => ("src-raw", format!("{bucket}/{key}")),
        1 => (
            "src-leading-slash",
            format!("/{bucket}/{}", enc_key(key, false)),
        ),
        2 => (
            "src-encoded-key",
            format!("{bucket}/{}", enc_key(key, false)),
        ),
        3 => ("src-pct2F", format!("{bucket}%2F{}", enc_key(key, true))),
        4 => ("src-pct2F", format!("%2F{bucket}%2F{}", enc_key(key, true))),
        5 => (
            "src-fully-encoded",
            enc_key(&format!("/{bucket}/{key}"), true),
        ),
        6 => (
            "src-versionId",
            format!("{bucket}/{}?versionId=null", enc_key(key, false)),
        ),
        7 => ("src-dotdot", format!("shared/../{bucket}/{key}")),
        8 => (
            "src-dotdot-pct",
            format!("shared%2F..%2F{bucket}%2F{}", enc_key(key, true)),
        ),
        9 => ("src-plus", format!("{bucket}/{}", key.replace(' ', "+"))),
        _ => ("src-double-slash", format!("{bucket}//{key}")),
    };
    tags.push(format!("{tag}:{bucket}"));
    src
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;")
}

/// One `<Key>` content in some spelling. Returns (xml text, tag).
fn xml_key(rng: &mut Rng, bucket: &str) -> (String, &'static str) {
    let s = if bucket == "oth" {
        rng.pick(&["k", "payroll", "a/b"])
    } else {
        rng.pick(&["k", "a/b", "d/x", "k.", "a b", " k", "k "])
    };
    let first = s.chars().next().unwrap();
    let rest = xml_escape(&s[first.len_utf8()..]);
    match rng.below(12) {
        0 => (xml_escape(s), "xml-plain"),
        1 => (
            format!("{}<![CDATA[zz]]>", xml_escape(s)),
            "xml-cdata-suffix",
        ),
        2 => (format!("<![CDATA[{s}]]>"), "xml-cdata-whole"),
        3 => (format!("{}<!---->zz", xml_escape(s)), "xml-comment-suffix"),
        4 => (format!("{}<!-- c -->", xml_escape(s)), "xml-comment-tail"),
        5 => (format!("&#{};{rest}", first as u32), "xml-charref"),
        6 => (format!("&#x{:x};{rest}", first as u32), "xml-charref-hex"),
        7 => (format!("\n  {}  \n", xml_escape(s)), "xml-whitespace"),
        8 => (format!("{}<?pi x?>zz", xml_escape(s)), "xml-pi"),
        9 => (format!("x/../{}", xml_escape(s)), "xml-dotdot"),
        10 => (format!("/{}", xml_escape(s)), "xml-leading-slash"),
        _ => ("a&amp;b".to_string(), "xml-entity"),
    }
}

fn delete_body(rng: &mut Rng, bucket: &str, tags: &mut Vec<String>) -> Vec<u8> {
    let prefixed = rng.chance(15);
    let (open, close, p) = if prefixed {
        tags.push("xml-ns-prefix".into());
        (
            "<s3:Delete xmlns:s3=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
            "</s3:Delete>",
            "s3:",
        )
    } else if rng.chance(50) {
        (
            "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
            "</Delete>",
            "",
        )
    } else {
        ("<Delete>", "</Delete>", "")
    };
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(open);
    if rng.chance(50) {
        tags.push("xml-quiet".into());
        x.push_str(&format!("<{p}Quiet>true</{p}Quiet>"));
    }
    for _ in 0..1 + rng.below(3) {
        let (k, tag) = xml_key(rng, bucket);
        tags.push(tag.into());
        x.push_str(&format!("\n <{p}Object><{p}Key>{k}</{p}Key></{p}Object>"));
    }
    x.push_str(close);
    x.into_bytes()
}

fn lifecycle_body(index: usize) -> Vec<u8> {
    format!(
        "<LifecycleConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Rule><ID>diff-{index}</ID>\
         <Filter><Prefix>tmp/</Prefix></Filter><Status>Enabled</Status><Expiration><Days>{}</Days></Expiration></Rule></LifecycleConfiguration>",
        1 + index % 300
    )
    .into_bytes()
}

/// Content-MD5 (base64), which S3 demands on DeleteObjects and lifecycle.
pub fn content_md5(body: &[u8]) -> String {
    use base64::Engine;
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
}

/// The `index`th case of the run seeded with `seed`.
pub fn case(seed: u64, index: usize) -> Case {
    let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    rng.next_u64();
    let (cred, shape) = cred_and_shape(&mut rng);
    let oth_pct = if cred == Cred::Demo { 40 } else { 15 };
    let bucket = if rng.chance(oth_pct) { "oth" } else { "shared" };
    let vhost = rng.chance(20);
    let mut tags = vec![format!("{shape:?}"), format!("{cred:?}")];
    if vhost {
        tags.push("vhost".into());
    }
    let host = vhost.then(|| format!("{bucket}.s3.test"));
    let prefix = if vhost {
        String::new()
    } else {
        format!("/{bucket}")
    };
    let mut p = Parts {
        headers: Vec::new(),
        query: Vec::new(),
        body: None,
        tags,
    };
    let unique = unique_content(&mut rng, seed, index);
    let (method, path) = match shape {
        Shape::Put | Shape::Delete => {
            put_or_delete_request(&mut rng, shape, bucket, &prefix, unique, &mut p)
        }
        Shape::Copy | Shape::PartCopy => {
            copy_request(&mut rng, shape, bucket, &prefix, index, &mut p)
        }
        Shape::MultiDelete => multi_delete_request(&mut rng, bucket, &prefix, &mut p),
        Shape::Lifecycle => lifecycle_request(&mut rng, &prefix, index, &mut p),
    };
    let presign = rng.chance(15);
    if presign {
        p.tags.push("presigned".into());
    }
    let carrier = match rng.below(4) {
        0 | 1 => Carrier::Header,
        2 => Carrier::Meta,
        _ => Carrier::Query,
    };
    Case {
        index,
        shape,
        cred,
        method,
        path,
        query: p.query,
        headers: p.headers,
        body: p.body,
        host,
        presign,
        carrier,
        tags: p.tags,
    }
}

/// The parts of a case that its shape fills in.
struct Parts {
    headers: Vec<(String, String)>,
    query: Vec<String>,
    body: Option<Vec<u8>>,
    tags: Vec<String>,
}

/// Draws who sends the case and its shape.
fn cred_and_shape(rng: &mut Rng) -> (Cred, Shape) {
    let cred = if rng.chance(50) {
        Cred::Demo
    } else {
        Cred::Limited
    };
    let shape = match rng.below(20) {
        0..=5 => Shape::Put,
        6..=8 => Shape::Delete,
        9..=12 => Shape::Copy,
        13..=14 => Shape::PartCopy,
        15..=18 => Shape::MultiDelete,
        _ => Shape::Lifecycle,
    };
    (cred, shape)
}

/// Unique content and a size of its own: an overwrite shows in the
/// listing even where a store lists no ETag (the embedded one).
fn unique_content(rng: &mut Rng, seed: u64, index: usize) -> String {
    let mut unique = format!("case {seed}:{index} {:016x} ", rng.next_u64());
    while unique.len() < 64 + index {
        unique.push('.');
    }
    unique.push('\n');
    unique
}

/// A PUT of `unique` or a DELETE on a drawn key, sometimes with a stray query.
fn put_or_delete_request(
    rng: &mut Rng,
    shape: Shape,
    bucket: &str,
    prefix: &str,
    unique: String,
    p: &mut Parts,
) -> (Method, String) {
    let key = key_path(rng, bucket, &mut p.tags);
    if rng.chance(25) {
        let q = rng.pick(STRAY);
        p.tags.push(format!("query:{q}"));
        p.query.push(q.to_string());
    }
    if shape == Shape::Put {
        p.body = Some(unique.into_bytes());
        (Method::PUT, format!("{prefix}/{key}"))
    } else {
        (Method::DELETE, format!("{prefix}/{key}"))
    }
}

/// A copy (or part copy) onto a fresh or drawn key from a drawn source.
fn copy_request(
    rng: &mut Rng,
    shape: Shape,
    bucket: &str,
    prefix: &str,
    index: usize,
    p: &mut Parts,
) -> (Method, String) {
    let key = if rng.chance(50) {
        p.tags.push("dest-fresh".into());
        format!("cp/{index}")
    } else {
        key_path(rng, bucket, &mut p.tags)
    };
    p.headers
        .push(("x-amz-copy-source".into(), copy_source(rng, &mut p.tags)));
    if shape == Shape::Copy && rng.chance(50) {
        p.tags.push("REPLACE".into());
        p.headers
            .push(("x-amz-metadata-directive".into(), "REPLACE".into()));
        p.headers
            .push(("x-amz-meta-case".into(), index.to_string()));
    }
    (Method::PUT, format!("{prefix}/{key}"))
}

/// A POST `?delete` with a drawn body, on the bucket with a drawn tail.
fn multi_delete_request(
    rng: &mut Rng,
    bucket: &str,
    prefix: &str,
    p: &mut Parts,
) -> (Method, String) {
    let b = delete_body(rng, bucket, &mut p.tags);
    p.headers.push(("content-md5".into(), content_md5(&b)));
    p.headers
        .push(("content-type".into(), "application/xml".into()));
    p.body = Some(b);
    p.query.push("delete".into());
    let tail = rng.pick(&["", "/", "", "//"]);
    if tail == "//" {
        p.tags.push("delete-double-slash".into());
    }
    let path = format!("{prefix}{tail}");
    (
        Method::POST,
        if path.is_empty() { "/".into() } else { path },
    )
}

/// A PUT `?lifecycle` on a drawn path that may or may not name a key.
fn lifecycle_request(rng: &mut Rng, prefix: &str, index: usize, p: &mut Parts) -> (Method, String) {
    let tail = rng.pick(&["/", "//", "/./", "/x/..", "/%2F", "/.", "/k"]);
    p.tags.push(format!("lifecycle-path:{tail}"));
    let b = lifecycle_body(index);
    p.headers.push(("content-md5".into(), content_md5(&b)));
    p.body = Some(b);
    p.query.push("lifecycle".into());
    (Method::PUT, format!("{prefix}{tail}"))
}
