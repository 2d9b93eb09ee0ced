//! A PutObject's and an UploadPart's integrity checks on the embedded
//! store (`Content-MD5`, `x-amz-checksum-*` in the head or in an
//! aws-chunked trailer), made before the object or part lands. s3s-fs
//! moves a new object into place first and checks after, so a body that
//! failed its check was answered `400 BadDigest` and had replaced the
//! object all the same: the good version gone, a corrupt one in its place,
//! the client told its write failed. A part it did not check at all.
//!
//! [`checked`] puts the body through a stream that hashes it and, at its
//! end, yields an error instead of the end when a digest differs: s3s-fs
//! then drops the file it was writing, and nothing lands. [`Verdict`] says
//! why, for `Layout` to answer `BadDigest`. The digests and the way the
//! expected values are gathered are s3s-fs's own (s3s's `ChecksumHasher`),
//! so both read a body alike; s3s-fs checks again after, and agrees.

use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::{Checksum, ChecksumAlgorithm, StreamingBlob};
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3Error, S3ErrorCode, S3Result, TrailingHeaders};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;

/// Why a checked body was refused, once its end has been read.
#[derive(Clone, Default)]
pub struct Verdict(Arc<Mutex<Option<String>>>);

impl Verdict {
    /// `BadDigest` if the body failed a check, else `other`.
    pub fn explain(&self, other: S3Error) -> S3Error {
        match self.0.lock().expect("verdict lock").take() {
            Some(why) => S3Error::with_message(S3ErrorCode::BadDigest, why),
            None => other,
        }
    }
}

/// The digests a body must have: the head's, and for an algorithm named
/// without a value, the trailer's.
struct Expected {
    md5_hex: Option<String>,
    sums: Checksum,
    trailers: Option<TrailingHeaders>,
}

/// The digests a request claims for its body, from its head: a
/// PutObject's or an UploadPart's (their inputs name them alike).
pub struct Claimed {
    pub content_md5: Option<String>,
    /// `x-amz-checksum-algorithm` / `x-amz-sdk-checksum-algorithm`: the
    /// value may come in the trailer.
    pub algorithm: Option<String>,
    pub sums: Checksum,
}

/// Replaces `body` with one checked before its end against what the head
/// claims (and the trailer, for an algorithm named without a value); the
/// verdict says why it failed, if it does. A `Content-MD5` that is not a
/// base64 MD5 is refused at once (`InvalidDigest`).
pub fn checked(
    claimed: Claimed,
    body: &mut Option<StreamingBlob>,
    trailers: Option<TrailingHeaders>,
) -> S3Result<Verdict> {
    let md5_hex = match &claimed.content_md5 {
        Some(b64) => {
            let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64);
            match raw {
                Ok(raw) if raw.len() == 16 => Some(hex::encode(raw)),
                _ => {
                    return Err(S3Error::with_message(
                        S3ErrorCode::InvalidDigest,
                        "Content-MD5 is not the base64 of an MD5 digest",
                    ));
                }
            }
        }
        None => None,
    };
    let sums = &claimed.sums;
    let want = |given: bool, name: &str| given || claimed.algorithm.as_deref() == Some(name);
    let mut hasher = ChecksumHasher::default();
    if want(sums.checksum_crc32.is_some(), ChecksumAlgorithm::CRC32) {
        hasher.crc32 = Some(Default::default());
    }
    if want(sums.checksum_crc32c.is_some(), ChecksumAlgorithm::CRC32C) {
        hasher.crc32c = Some(Default::default());
    }
    if want(sums.checksum_sha1.is_some(), ChecksumAlgorithm::SHA1) {
        hasher.sha1 = Some(Default::default());
    }
    if want(sums.checksum_sha256.is_some(), ChecksumAlgorithm::SHA256) {
        hasher.sha256 = Some(Default::default());
    }
    if want(
        sums.checksum_crc64nvme.is_some(),
        ChecksumAlgorithm::CRC64NVME,
    ) {
        hasher.crc64nvme = Some(Default::default());
    }
    let expected = Expected {
        md5_hex,
        sums: claimed.sums,
        trailers,
    };
    let verdict = Verdict::default();
    if let Some(inner) = body.take() {
        *body = Some(StreamingBlob::new(Checking {
            body: inner,
            md5: expected.md5_hex.is_some().then(Md5::new),
            hasher: Some(hasher),
            expected,
            verdict: verdict.clone(),
        }));
    }
    Ok(verdict)
}

struct Checking {
    body: StreamingBlob,
    /// Only with a `Content-MD5` to check (s3s-fs hashes for the ETag
    /// on its own).
    md5: Option<Md5>,
    /// Taken at the end.
    hasher: Option<ChecksumHasher>,
    expected: Expected,
    verdict: Verdict,
}

impl Checking {
    /// At the body's end: why it fails its checks, if it does.
    fn failure(&mut self) -> Option<String> {
        if let (Some(want), Some(md5)) = (&self.expected.md5_hex, self.md5.take()) {
            let md5 = hex::encode(md5.finalize());
            if *want != md5 {
                return Some(format!("Content-MD5 is {want}, the body's MD5 {md5}"));
            }
        }
        let got = self.hasher.take()?.finalize();
        let mut want = self.expected.sums.clone();
        if let Some(t) = &self.expected.trailers {
            t.read(|h| {
                let value = |name: &str| {
                    h.get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                };
                want.checksum_crc32 = value("x-amz-checksum-crc32").or(want.checksum_crc32.take());
                want.checksum_crc32c =
                    value("x-amz-checksum-crc32c").or(want.checksum_crc32c.take());
                want.checksum_sha1 = value("x-amz-checksum-sha1").or(want.checksum_sha1.take());
                want.checksum_sha256 =
                    value("x-amz-checksum-sha256").or(want.checksum_sha256.take());
                want.checksum_crc64nvme =
                    value("x-amz-checksum-crc64nvme").or(want.checksum_crc64nvme.take());
            });
        }
        let pairs = [
            ("crc32", &got.checksum_crc32, &want.checksum_crc32),
            ("crc32c", &got.checksum_crc32c, &want.checksum_crc32c),
            ("sha1", &got.checksum_sha1, &want.checksum_sha1),
            ("sha256", &got.checksum_sha256, &want.checksum_sha256),
            (
                "crc64nvme",
                &got.checksum_crc64nvme,
                &want.checksum_crc64nvme,
            ),
        ];
        pairs
            .into_iter()
            .find(|(_, g, w)| g != w)
            .map(|(name, g, w)| {
                format!(
                    "x-amz-checksum-{name} is {}, the body's {}",
                    w.as_deref().unwrap_or("missing"),
                    g.as_deref().unwrap_or("not computed")
                )
            })
    }
}

impl ByteStream for Checking {
    fn remaining_length(&self) -> RemainingLength {
        self.body.remaining_length()
    }
}

impl Stream for Checking {
    type Item = Result<Bytes, s3s::StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.hasher.is_none() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                if let Some(md5) = &mut this.md5 {
                    md5.update(&bytes);
                }
                if let Some(h) = &mut this.hasher {
                    h.update(&bytes);
                }
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(None) => match this.failure() {
                Some(why) => {
                    *this.verdict.0.lock().expect("verdict lock") = Some(why.clone());
                    Poll::Ready(Some(Err(why.into())))
                }
                None => Poll::Ready(None),
            },
            other => other,
        }
    }
}
