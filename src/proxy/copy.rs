//! CopyObject stamps the copy with the token that wrote it. S3 copies the
//! source's metadata only under `x-amz-metadata-directive: COPY`, which
//! would also copy the source's token. So fencegate reads the source's
//! metadata (HEAD) and sends the copy with `REPLACE`: the source's metadata
//! and content headers, and the new token. Nothing else is lost. With
//! stamping off the copy is forwarded as the client sent it.

use super::Proxy;
use crate::s3::error::S3Error;
use crate::s3::headers::X_AMZ_METADATA_DIRECTIVE;
use crate::s3::op::Operation;
use crate::upstream::client::{Outgoing, UpstreamPayload};
use http::{HeaderMap, Method};

/// Headers that travel with an object's metadata under COPY.
const CONTENT_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-language",
    "content-disposition",
    "cache-control",
    "expires",
    "x-amz-website-redirect-location",
];

impl Proxy {
    pub(super) async fn keep_source_metadata(
        &self,
        out: &mut Outgoing,
        op: &Operation,
    ) -> Result<(), S3Error> {
        // As `op::classify` read it (and the backend gets it).
        if op.replace_metadata == Some(true) {
            // The client gives the metadata; the token is already stamped.
            return Ok(());
        }
        // Without a stamp there is no source token to replace.
        let (Some(src), Some(stamp)) = (&op.copy_source, &self.stamp_header) else {
            return Ok(());
        };
        let head = Outgoing {
            method: Method::HEAD,
            bucket: Some(src.bucket.clone()),
            key: Some(src.key.clone()),
            query: src
                .version_id
                .clone()
                .map(|v| vec![("versionId".into(), v.into())])
                .unwrap_or_default(),
            headers: HeaderMap::new(),
            body: None,
            content_length: None,
            payload: UpstreamPayload::Empty,
            anonymous: false,
        };
        let resp = self.upstream.send(head).await?;
        if !resp.status().is_success() {
            // Let the copy itself fail with the backend's own error.
            return Ok(());
        }
        let src = resp.headers();
        for name in CONTENT_HEADERS {
            out.headers.remove(*name);
            if let Some(v) = src.get(*name) {
                out.headers.insert(*name, v.clone());
            }
        }
        let stamp = stamp.as_str();
        let client_meta: Vec<_> = out
            .headers
            .keys()
            .filter(|n| n.as_str().starts_with("x-amz-meta-") && n.as_str() != stamp)
            .cloned()
            .collect();
        for n in client_meta {
            out.headers.remove(n);
        }
        for (name, value) in src {
            if name.as_str().starts_with("x-amz-meta-") && name.as_str() != stamp {
                out.headers.append(name.clone(), value.clone());
            }
        }
        out.headers.insert(
            X_AMZ_METADATA_DIRECTIVE,
            http::HeaderValue::from_static("REPLACE"),
        );
        Ok(())
    }
}
