//! The assertion of the differential test, kept apart from the driving so
//! that it can be read on its own. Every case carries a token `t` higher
//! than any before it, so fencegate never refuses one as stale: whatever it
//! lets through, it must have read the way the backend did. Judged only by
//! effects: for every object that changed in the backend, the sender must
//! be allowed on its bucket and fencegate's fence for `bucket/key` must be
//! exactly `t` (fencegate fenced that very object with this token). The
//! bucket list must not change, lifecycle rules change only for a bucket
//! admin, and a limited credential's copy must not bring `oth`'s content
//! into `shared`.

use super::shapes::{Case, Cred, Shape};
use super::world::{Exchange, Snapshot};
use std::collections::BTreeMap;

/// One object's change: (bucket, key, before, after), `None` for absent.
pub type Change = (String, String, Option<String>, Option<String>);

/// What changed between two listings.
pub fn changes(before: &Snapshot, after: &Snapshot) -> Vec<Change> {
    let show = |v: &(String, i64, String)| format!("etag {} size {} at {}", v.0, v.1, v.2);
    let mut out = Vec::new();
    for (k, v) in &before.objects {
        match after.objects.get(k) {
            None => out.push((k.0.clone(), k.1.clone(), Some(show(v)), None)),
            Some(w) if w != v => out.push((k.0.clone(), k.1.clone(), Some(show(v)), Some(show(w)))),
            _ => {}
        }
    }
    for (k, w) in &after.objects {
        if !before.objects.contains_key(k) {
            out.push((k.0.clone(), k.1.clone(), None, Some(show(w))));
        }
    }
    out
}

/// Everything a case did, for the judgement and the report.
pub struct Observed<'a> {
    pub case: &'a Case,
    pub t: u64,
    pub exchanges: &'a [Exchange],
    pub before: &'a Snapshot,
    pub after: &'a Snapshot,
    pub fences: &'a BTreeMap<String, u64>,
    /// Lifecycle rules before and after, when the case could touch them.
    pub lifecycle: Option<(BTreeMap<String, String>, BTreeMap<String, String>)>,
    /// Objects of `shared` that hold `oth`'s secret after this case.
    pub leaked: &'a [(String, String)],
}

/// The violations of one case (empty: it passed).
pub fn judge(o: &Observed) -> Vec<String> {
    let mut v = Vec::new();
    for (bucket, key, was, now) in changes(o.before, o.after) {
        let what = match (&was, &now) {
            (None, _) => "created",
            (_, None) => "deleted",
            _ => "modified",
        };
        if !o.case.cred.allows(&bucket) {
            v.push(format!(
                "{what} {bucket}/{key} in a bucket the {:?} credential may not use",
                o.case.cred
            ));
        }
        let resource = format!("{bucket}/{key}");
        match o.fences.get(&resource) {
            Some(&h) if h == o.t => {}
            other => v.push(format!(
                "{what} {resource:?} ({} -> {}) but its fence is {:?}, not {}",
                was.as_deref().unwrap_or("absent"),
                now.as_deref().unwrap_or("absent"),
                other,
                o.t
            )),
        }
    }
    if o.before.buckets != o.after.buckets {
        v.push(format!(
            "the bucket list changed: {:?} -> {:?}",
            o.before.buckets, o.after.buckets
        ));
    }
    if let Some((before, after)) = &o.lifecycle
        && before != after
        && o.case.cred != Cred::Demo
    {
        v.push(format!(
            "lifecycle rules changed for a credential that administers no bucket: {before:?} -> {after:?}"
        ));
    }
    for (bucket, key) in o.leaked {
        if !o.case.cred.allows("oth") {
            v.push(format!(
                "{bucket}/{key} now holds the content of bucket oth, which the {:?} credential may not read",
                o.case.cred
            ));
        }
    }
    v
}

/// The resources fencegate raised to `t` (what it thought the case wrote).
pub fn fenced_with(fences: &BTreeMap<String, u64>, t: u64) -> Vec<&str> {
    fences
        .iter()
        .filter(|(_, h)| **h == t)
        .map(|(r, _)| r.as_str())
        .collect()
}

fn printable(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    let s: String = s.chars().take(600).collect();
    format!("{s:?}")
}

/// A violating case, printed in full so it can be replayed by hand.
pub fn report(seed: u64, o: &Observed, violations: &[String]) -> String {
    let c = o.case;
    let mut s = format!(
        "--- seed {seed} case {} token {}: {:?} by {:?}{}\n    {} {}{}{}\n",
        c.index,
        o.t,
        c.shape,
        c.cred,
        if c.presign { " (presigned)" } else { "" },
        c.method,
        c.path,
        if c.query.is_empty() { "" } else { "?" },
        c.query.join("&"),
    );
    if let Some(h) = &c.host {
        s.push_str(&format!("    host: {h}\n"));
    }
    s.push_str(&format!("    token carrier: {:?}\n", c.carrier));
    for (k, v) in &c.headers {
        s.push_str(&format!("    {k}: {v}\n"));
    }
    if let Some(b) = &c.body {
        s.push_str(&format!("    body: {}\n", printable(b)));
    }
    for e in o.exchanges {
        s.push_str(&format!(
            "    {} -> {} {}\n",
            e.what,
            e.status,
            e.code.as_deref().unwrap_or("")
        ));
    }
    s.push_str(&format!(
        "    fencegate fenced with {}: {:?}\n",
        o.t,
        fenced_with(o.fences, o.t)
    ));
    for v in violations {
        s.push_str(&format!("    VIOLATION: {v}\n"));
    }
    s.push_str(&format!("    contains: {}\n", cause(c)));
    s.push_str(&format!("    tags: {}\n", c.tags.join(" ")));
    s
}

/// Why a violating case is interesting, read off the request (not off
/// fencegate or the backend): which of the known ways to read a request
/// twice it contains. Used to count what a run caught.
pub fn cause(c: &Case) -> String {
    let mut causes = Vec::new();
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(&c.path).collect();
    let decoded = String::from_utf8_lossy(&decoded);
    let segs: Vec<&str> = decoded.split('/').skip(1).collect();
    // Path style: the first segment is the bucket.
    let key_segs = if c.host.is_some() {
        &segs[..]
    } else {
        &segs[segs.len().min(1)..]
    };
    if key_segs.contains(&"..") {
        causes.push("path ..");
    } else if key_segs.contains(&".") {
        causes.push("path .");
    }
    if key_segs.len() > 1 && key_segs[..key_segs.len() - 1].contains(&"") {
        causes.push("path //");
    }
    if key_segs.len() > 1 && key_segs.last() == Some(&"") && c.shape != Shape::MultiDelete {
        causes.push("key ends in /");
    }
    if let Some((_, src)) = c.headers.iter().find(|(k, _)| k == "x-amz-copy-source") {
        let raw_bucket = src.trim_start_matches('/').split('/').next().unwrap_or("");
        if raw_bucket.contains("%2F") || src.starts_with("%2F") {
            causes.push("copy source %2F");
        }
        if src.contains("..") {
            causes.push("copy source ..");
        }
    }
    if c.shape == Shape::MultiDelete {
        let body = String::from_utf8_lossy(c.body.as_deref().unwrap_or_default());
        if body.contains("<![CDATA[") && body.contains("]]></")
            || body.contains("<!--")
            || body.contains("<?pi")
        {
            causes.push("xml key in pieces (CDATA/comment/PI)");
        }
        if body.contains("x/../") {
            causes.push("xml key with ..");
        }
    }
    if c.query.iter().any(|q| q.contains("lifecycle")) {
        causes.push("?lifecycle");
    }
    if causes.is_empty() {
        causes.push("other");
    }
    causes.join(" + ")
}
