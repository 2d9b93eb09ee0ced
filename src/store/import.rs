//! Bringing in a data directory the earlier default store (s3s-fs) wrote:
//! `objects/<bucket>/<key>` files, with their metadata beside them in
//! `objects/.bucket-<b64 bucket>.object-<b64 key>.metadata.json` (content
//! headers, user metadata) and `....internal.json` (the ETag).
//!
//! Each file becomes a blob by a hard link (no copy; a copy where links do
//! not work), keeping its ETag, headers, metadata and modification time;
//! checksums are not carried over (s3s-fs could keep a replaced object's).
//! Objects already in the index are left alone, so an import cut short is
//! simply run again. Open multipart uploads are not imported. When every
//! object is in, the old directory is renamed `objects.s3s-fs-imported`:
//! kept, so that nothing is lost, for the operator to remove.

use super::blobs::{Blobs, new_id};
use super::index::{BLOBS, BUCKETS, Headers, OBJECTS, ObjectRecord, Segment, encode};
use crate::redb_file::DbFile;
use redb::ReadableTable;
use s3s::crypto::Checksum as _;
use std::path::{Path, PathBuf};

/// Records committed together.
const BATCH: usize = 1000;

/// What an import did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub buckets: u64,
    pub objects: u64,
    /// Objects the index already had (an earlier, interrupted import).
    pub skipped: u64,
}

fn b64(s: &str) -> String {
    base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        s.as_bytes(),
    )
}

/// The sidecar JSON of `(bucket, key)` of kind `metadata` or `internal`.
fn sidecar(old: &Path, bucket: &str, key: &str, kind: &str) -> Option<serde_json::Value> {
    let name = format!(".bucket-{}.object-{}.{kind}.json", b64(bucket), b64(key));
    let text = std::fs::read(old.join(name)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The headers s3s-fs kept for an object (its own format, or the older
/// one: the user metadata alone).
fn headers(meta: Option<serde_json::Value>) -> Headers {
    let Some(serde_json::Value::Object(m)) = meta else {
        return Headers::default();
    };
    let text = |k: &str| m.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let user = match m.get("user_metadata") {
        Some(serde_json::Value::Object(u)) => u.clone(),
        Some(_) => serde_json::Map::new(),
        // The older format: the map is the user metadata.
        None => m.clone(),
    };
    let expires = text("expires").and_then(|e| {
        let t = s3s::dto::Timestamp::parse(s3s::dto::TimestampFormat::DateTime, &e).ok()?;
        let mut buf = Vec::new();
        t.format(s3s::dto::TimestampFormat::HttpDate, &mut buf)
            .ok()?;
        String::from_utf8(buf).ok()
    });
    Headers {
        content_type: text("content_type"),
        content_encoding: text("content_encoding"),
        content_disposition: text("content_disposition"),
        content_language: text("content_language"),
        cache_control: text("cache_control"),
        expires,
        website_redirect_location: text("website_redirect_location"),
        metadata: user
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
            .collect(),
    }
}

/// The MD5 of a file, in hex.
fn md5_of(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut md5 = s3s::crypto::Md5::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        md5.update(&buf[..n]);
    }
    Ok(hex::encode(md5.finalize()))
}

/// Every file under `dir`, with its path relative to `base` as a key.
fn files(base: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            files(base, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(base)
            && let Some(key) = rel.to_str()
        {
            out.push((key.replace(std::path::MAIN_SEPARATOR, "/"), path));
        }
    }
    Ok(())
}

/// Imports the s3s-fs directory `old` into the store's `index` and
/// `blobs`, then renames it (see the module doc).
pub fn import_s3s_fs(index: &DbFile, blobs: &Blobs, old: &Path) -> Result<Imported, String> {
    let err = |e: &dyn std::fmt::Display| format!("importing {}: {e}", old.display());
    let mut done = Imported::default();
    let mut buckets: Vec<String> = std::fs::read_dir(old)
        .map_err(|e| err(&e))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.starts_with('.'))
        .collect();
    buckets.sort();
    for bucket in buckets {
        let mut objects = Vec::new();
        files(&old.join(&bucket), &old.join(&bucket), &mut objects).map_err(|e| err(&e))?;
        let db = index.write()?;
        let txn = db.begin_write().map_err(|e| err(&e))?;
        txn.open_table(BUCKETS)
            .map_err(|e| err(&e))?
            .insert(bucket.as_str(), super::now_ms() as u64)
            .map_err(|e| err(&e))?;
        txn.commit().map_err(|e| err(&e))?;
        done.buckets += 1;
        for chunk in objects.chunks(BATCH) {
            import_batch(&db, blobs, old, &bucket, chunk, &mut done).map_err(|e| err(&e))?;
        }
    }
    let to = old.with_file_name("objects.s3s-fs-imported");
    std::fs::rename(old, &to).map_err(|e| err(&e))?;
    tracing::warn!(
        buckets = done.buckets,
        objects = done.objects,
        kept = %to.display(),
        "imported the s3s-fs data directory into the embedded store; the old directory is kept for you to remove"
    );
    Ok(done)
}

fn import_batch(
    db: &redb::Database,
    blobs: &Blobs,
    old: &Path,
    bucket: &str,
    chunk: &[(String, PathBuf)],
    done: &mut Imported,
) -> Result<(), String> {
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    {
        let mut objects = txn.open_table(OBJECTS).map_err(|e| e.to_string())?;
        let mut refs = txn.open_table(BLOBS).map_err(|e| e.to_string())?;
        for (key, path) in chunk {
            if objects
                .get((bucket, key.as_str()))
                .map_err(|e| e.to_string())?
                .is_some()
            {
                done.skipped += 1;
                continue;
            }
            let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
            let id = new_id();
            if std::fs::hard_link(path, blobs.path_of(id)).is_err() {
                std::fs::copy(path, blobs.path_of(id)).map_err(|e| e.to_string())?;
                std::fs::File::open(blobs.path_of(id))
                    .and_then(|f| f.sync_all())
                    .map_err(|e| e.to_string())?;
            }
            let etag = match sidecar(old, bucket, key, "internal")
                .and_then(|v| v.get("e_tag")?.as_str().map(str::to_string))
            {
                Some(e) => e,
                None => md5_of(path).map_err(|e| e.to_string())?,
            };
            let modified = meta
                .modified()
                .ok()
                .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or_else(super::now_ms, |d| d.as_millis() as i64);
            let record = ObjectRecord {
                segments: vec![Segment {
                    blob: id,
                    offset: 0,
                    len: meta.len(),
                }],
                size: meta.len(),
                etag,
                last_modified_ms: modified,
                headers: headers(sidecar(old, bucket, key, "metadata")),
                checksums: Default::default(),
                parts: Vec::new(),
                upload_id: None,
            };
            objects
                .insert((bucket, key.as_str()), encode(&record).as_slice())
                .map_err(|e| e.to_string())?;
            refs.insert(id, 1).map_err(|e| e.to_string())?;
            ids.push(id);
            done.objects += 1;
        }
    }
    blobs.sync_dirs(ids).map_err(|e| e.to_string())?;
    txn.commit().map_err(|e| e.to_string())
}
