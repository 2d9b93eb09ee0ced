//! The names of the S3 request headers that the signature check, the
//! body's decoding and the fence share, spelt here for all of them. They
//! are `HeaderName`s: a lookup by one hashes it without parsing the name
//! again. And [`number_value`], how a number becomes a header value here
//! (one allocation, not two).

use http::{HeaderName, HeaderValue};

/// The request's timestamp (`YYYYMMDDTHHMMSSZ`), signed.
pub const X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
/// How the body is protected: its SHA-256, `UNSIGNED-PAYLOAD`, or a
/// `STREAMING-...` aws-chunked form.
pub const X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");
/// The length of an aws-chunked body once decoded.
pub const X_AMZ_DECODED_CONTENT_LENGTH: HeaderName =
    HeaderName::from_static("x-amz-decoded-content-length");
/// The checksum trailers an aws-chunked body announces.
pub const X_AMZ_TRAILER: HeaderName = HeaderName::from_static("x-amz-trailer");
/// A temporary credential's session token.
pub const X_AMZ_SECURITY_TOKEN: HeaderName = HeaderName::from_static("x-amz-security-token");
/// CopyObject's and UploadPartCopy's source, `bucket/key[?versionId=]`.
pub const X_AMZ_COPY_SOURCE: HeaderName = HeaderName::from_static("x-amz-copy-source");
/// Server-side encryption by the store's keys (`AES256`, `aws:kms`...).
pub const X_AMZ_SSE: HeaderName = HeaderName::from_static("x-amz-server-side-encryption");
/// Server-side encryption with the customer's key (SSE-C): its algorithm.
pub const X_AMZ_SSE_CUSTOMER_ALGORITHM: HeaderName =
    HeaderName::from_static("x-amz-server-side-encryption-customer-algorithm");
/// CopyObject: `COPY` the source's metadata or `REPLACE` it.
pub const X_AMZ_METADATA_DIRECTIVE: HeaderName =
    HeaderName::from_static("x-amz-metadata-directive");

/// `n` in decimal as a header value, in one allocation of its exact size
/// (`HeaderValue::from(u64)` makes two: a 20-byte buffer, then the shared
/// handle a buffer with spare room needs). Lengths and tokens, per request.
pub fn number_value(n: u64) -> HeaderValue {
    HeaderValue::from_bytes(itoa::Buffer::new().format(n).as_bytes())
        .expect("decimal digits are a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_http_writes_them() {
        for n in [0, 7, 10, 4096, 1 << 40, u64::MAX - 1, u64::MAX] {
            assert_eq!(number_value(n), HeaderValue::from(n), "{n}");
        }
    }
}
