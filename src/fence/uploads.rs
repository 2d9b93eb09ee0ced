//! Multipart uploads inherit the token that created them.
//!
//! Tools that carry the token as user metadata (`aws s3 cp --metadata
//! fencing-token=N`) send it only with CreateMultipartUpload; the parts and
//! the Complete that follow carry none. fencegate remembers which token
//! created each upload and checks the later requests with it, so a holder
//! that lost the fence meanwhile is refused at UploadPart and at Complete.
//! A request that carries its own token uses that one.
//!
//! The table is in memory: after a restart, parts of an upload begun before
//! it must carry a token themselves (they get 428 otherwise, never a pass).

use dashmap::DashMap;

/// At most this many open uploads are remembered; beyond it, parts need an
/// explicit token.
const MAX_OPEN_UPLOADS: usize = 100_000;

#[derive(Default)]
pub struct Uploads {
    by_id: DashMap<String, u64>,
}

fn id(bucket: &str, key: &str, upload_id: &str) -> String {
    format!("{bucket}/{key}\n{upload_id}")
}

impl Uploads {
    pub fn record(&self, bucket: &str, key: &str, upload_id: &str, token: u64) {
        if self.by_id.len() < MAX_OPEN_UPLOADS {
            self.by_id.insert(id(bucket, key, upload_id), token);
        }
    }

    pub fn token(&self, bucket: &str, key: &str, upload_id: &str) -> Option<u64> {
        self.by_id.get(&id(bucket, key, upload_id)).map(|t| *t)
    }

    pub fn forget(&self, bucket: &str, key: &str, upload_id: &str) {
        self.by_id.remove(&id(bucket, key, upload_id));
    }
}

/// The `<UploadId>` of a CreateMultipartUpload result.
pub fn upload_id_from_xml(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<UploadId>")? + "<UploadId>".len();
    let end = text[start..].find("</UploadId>")? + start;
    let raw = text[start..end].trim();
    (!raw.is_empty()).then(|| {
        raw.replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upload_id() {
        let xml = b"<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>abc&amp;1</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(upload_id_from_xml(xml).as_deref(), Some("abc&1"));
        assert_eq!(upload_id_from_xml(b"<x/>"), None);
    }

    #[test]
    fn remembers_per_object() {
        let u = Uploads::default();
        u.record("b", "k", "u1", 7);
        assert_eq!(u.token("b", "k", "u1"), Some(7));
        assert_eq!(u.token("b", "other", "u1"), None);
        u.forget("b", "k", "u1");
        assert_eq!(u.token("b", "k", "u1"), None);
    }
}
