//! A body's digests: its MD5 (a PUT's or a part's ETag) and the
//! `x-amz-checksum-*` checksums, computed as the body streams into its
//! blob, and the check of them against what the request declared, in its
//! headers or in its aws-chunked trailers. PutObject and UploadPart use
//! them through `save.rs` (UploadPartCopy hashes with its upload's
//! algorithm, and declares nothing); a body that does not match is `400
//! BadDigest`, and its blob is never committed.

use super::index::{Checksums, checksums_in};
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3Result, s3_error};

/// The body's digests, computed as it streams.
pub(super) struct Hashes {
    md5: s3s::crypto::Md5,
    sums: s3s::checksum::ChecksumHasher,
}

/// The checksum algorithms a request declares: its `x-amz-checksum-*`
/// headers, its `x-amz-sdk-checksum-algorithm`, and the trailers it names.
pub(super) fn declared_algorithms(
    algorithm: Option<&ChecksumAlgorithm>,
    given: &Checksums,
    headers: &http::HeaderMap,
) -> Vec<String> {
    let mut names: Vec<String> = algorithm
        .map(|a| a.as_str().to_string())
        .into_iter()
        .collect();
    for (name, v) in [
        ("CRC32", &given.crc32),
        ("CRC32C", &given.crc32c),
        ("CRC64NVME", &given.crc64nvme),
        ("SHA1", &given.sha1),
        ("SHA256", &given.sha256),
    ] {
        if v.is_some() {
            names.push(name.to_string());
        }
    }
    for t in headers
        .get_all(crate::s3::headers::X_AMZ_TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        for t in t.split(',') {
            if let Some(a) = t
                .trim()
                .to_ascii_lowercase()
                .strip_prefix("x-amz-checksum-")
            {
                names.push(a.to_ascii_uppercase());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

impl Hashes {
    pub(super) fn new(algorithms: &[String]) -> S3Result<Hashes> {
        let mut sums = s3s::checksum::ChecksumHasher::default();
        for a in algorithms {
            match a.as_str() {
                ChecksumAlgorithm::CRC32 => sums.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => sums.crc32c = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => sums.crc64nvme = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => sums.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => sums.sha256 = Some(Default::default()),
                other => {
                    return Err(s3_error!(
                        InvalidRequest,
                        "unknown checksum algorithm {other}"
                    ));
                }
            }
        }
        Ok(Hashes {
            md5: s3s::crypto::Md5::new(),
            sums,
        })
    }

    pub(super) fn update(&mut self, piece: &[u8]) {
        self.md5.update(piece);
        self.sums.update(piece);
    }

    /// The MD5 (raw) and the checksums.
    pub(super) fn finish(self) -> ([u8; 16], Checksums) {
        let md5: [u8; 16] = self.md5.finalize();
        let mut s = self.sums.finalize();
        let sums = checksums_in!(s);
        (md5, sums)
    }
}

/// Checks a body's digests against what its request declared; the
/// trailers (`aws-chunked`) add theirs to the headers'.
pub(super) fn verify(
    content_md5: Option<&str>,
    md5: &[u8; 16],
    declared: &Checksums,
    trailers: Option<&http::HeaderMap>,
    computed: &Checksums,
) -> S3Result<()> {
    if let Some(want) = content_md5 {
        let want = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, want.trim())
            .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
        if want != md5 {
            return Err(s3_error!(
                BadDigest,
                "the body does not match its Content-MD5"
            ));
        }
    }
    let trailer = |name: &str| {
        trailers
            .and_then(|t| t.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    for (name, given, got) in [
        ("crc32", &declared.crc32, &computed.crc32),
        ("crc32c", &declared.crc32c, &computed.crc32c),
        ("crc64nvme", &declared.crc64nvme, &computed.crc64nvme),
        ("sha1", &declared.sha1, &computed.sha1),
        ("sha256", &declared.sha256, &computed.sha256),
    ] {
        let want = given
            .clone()
            .or_else(|| trailer(&format!("x-amz-checksum-{name}")));
        if let Some(want) = want
            && Some(&want) != got.as_ref()
        {
            return Err(s3_error!(
                BadDigest,
                "the body does not match its x-amz-checksum-{name}"
            ));
        }
    }
    Ok(())
}
