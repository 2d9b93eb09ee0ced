//! aws-chunked bodies: decodes `STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`
//! and `STREAMING-UNSIGNED-PAYLOAD-TRAILER` while they stream, verifying each
//! chunk signature and the trailer signature, the framing and the decoded
//! length. Output is the decoded data, then the checksum trailers as a
//! trailers frame, so the upstream side can forward them.
//!
//! Chunk data is passed on before its chunk's signature is checked (nothing
//! is buffered); that is safe because the last bytes of a body are released
//! upstream only after the whole body verified (see `fence::body_gate`).

use super::auth::Signing;
use super::error::S3Error;
use super::sigv4::{EMPTY_SHA256, same_signature, sha256_hex};
use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use sha2::{Digest, Sha256};
use std::pin::Pin;

const MAX_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16;

pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, S3Error>> + Send>>;
pub type FrameStream = Pin<Box<dyn Stream<Item = Result<Frame<Bytes>, S3Error>> + Send>>;

/// What the decoder checks.
pub struct ChunkedSpec {
    /// `Some` for signed chunks.
    pub signing: Option<Signing>,
    /// The trailer names announced in `x-amz-trailer` (lower-case).
    pub trailers: Vec<String>,
    /// Whether trailers follow the final chunk.
    pub has_trailer: bool,
    /// `x-amz-decoded-content-length`.
    pub decoded_len: u64,
}

enum State {
    Header,
    Data { remaining: u64 },
    Done,
}

struct Decoder {
    input: ByteStream,
    buf: BytesMut,
    spec: ChunkedSpec,
    prev_signature: String,
    chunk_signature: Option<String>,
    hasher: Sha256,
    decoded: u64,
    state: State,
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::InvalidChunk(msg.into())
}

impl Decoder {
    /// Pulls more input into `buf`; false at the end of the input.
    async fn fill(&mut self) -> Result<bool, S3Error> {
        match self.input.next().await {
            Some(Ok(b)) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }

    /// Reads one CRLF-terminated line (without the CRLF).
    async fn line(&mut self) -> Result<Bytes, S3Error> {
        let mut searched = 0;
        loop {
            if let Some(pos) = self.buf[searched..].windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.split_to(searched + pos).freeze();
                self.buf.advance(2);
                return Ok(line);
            }
            searched = self.buf.len().saturating_sub(1);
            if self.buf.len() > MAX_LINE {
                return Err(invalid("chunk header or trailer line too long"));
            }
            if !self.fill().await? {
                return Err(S3Error::IncompleteBody);
            }
        }
    }

    fn verify_chunk(&mut self, data_hash: &str) -> Result<(), S3Error> {
        let Some(signing) = &self.spec.signing else {
            return Ok(());
        };
        let got = self
            .chunk_signature
            .take()
            .ok_or_else(|| invalid("chunk signature missing"))?;
        let sts = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{EMPTY_SHA256}\n{data_hash}",
            signing.amz_date, signing.scope, self.prev_signature
        );
        if !same_signature(&signing.sign(&sts), &got) {
            return Err(S3Error::SignatureDoesNotMatch);
        }
        self.prev_signature = got;
        Ok(())
    }

    fn parse_header(&mut self, line: &[u8]) -> Result<u64, S3Error> {
        let line = std::str::from_utf8(line).map_err(|_| invalid("chunk header is not ASCII"))?;
        let (size, ext) = match line.split_once(';') {
            Some((s, e)) => (s, Some(e)),
            None => (line, None),
        };
        if size.is_empty() || size.len() > 16 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(format!("bad chunk size {size:?}")));
        }
        let size = u64::from_str_radix(size, 16).map_err(|_| invalid("bad chunk size"))?;
        let sig = ext.and_then(|e| e.trim().strip_prefix("chunk-signature="));
        match (&self.spec.signing, sig) {
            (Some(_), Some(s)) if s.len() == 64 => self.chunk_signature = Some(s.to_string()),
            (Some(_), _) => return Err(invalid("chunk signature missing or malformed")),
            (None, Some(_)) => return Err(invalid("unexpected chunk signature")),
            (None, None) => {}
        }
        Ok(size)
    }

    /// Reads the trailer section after the final chunk.
    async fn trailers(&mut self) -> Result<HeaderMap, S3Error> {
        let mut map = HeaderMap::new();
        let mut lines: Vec<(String, String)> = Vec::new();
        let mut signature = None;
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                break;
            }
            if lines.len() >= MAX_TRAILERS {
                return Err(invalid("too many trailers"));
            }
            let line = std::str::from_utf8(&line).map_err(|_| invalid("trailer is not ASCII"))?;
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| invalid("trailer line without ':'"))?;
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim().to_string();
            if name == "x-amz-trailer-signature" {
                signature = Some(value);
            } else {
                lines.push((name, value));
            }
        }
        if let Some(signing) = &self.spec.signing {
            let got = signature.ok_or_else(|| invalid("trailer signature missing"))?;
            let mut sorted = lines.clone();
            sorted.sort();
            let canonical: String = sorted.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
            let sts = format!(
                "AWS4-HMAC-SHA256-TRAILER\n{}\n{}\n{}\n{}",
                signing.amz_date,
                signing.scope,
                self.prev_signature,
                sha256_hex(canonical.as_bytes())
            );
            if !same_signature(&signing.sign(&sts), &got) {
                return Err(S3Error::SignatureDoesNotMatch);
            }
        }
        let mut names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        let mut declared: Vec<&str> = self.spec.trailers.iter().map(String::as_str).collect();
        declared.sort();
        if names != declared {
            return Err(invalid("trailers do not match x-amz-trailer"));
        }
        for (n, v) in lines {
            let name =
                HeaderName::from_bytes(n.as_bytes()).map_err(|_| invalid("bad trailer name"))?;
            let value = HeaderValue::from_str(&v).map_err(|_| invalid("bad trailer value"))?;
            map.append(name, value);
        }
        Ok(map)
    }

    async fn next_frame(&mut self) -> Result<Option<Frame<Bytes>>, S3Error> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Header => {
                    let line = self.line().await?;
                    let size = self.parse_header(&line)?;
                    if size > 0 {
                        self.state = State::Data { remaining: size };
                        continue;
                    }
                    self.verify_chunk(EMPTY_SHA256)?;
                    let trailers = if self.spec.has_trailer {
                        self.trailers().await?
                    } else {
                        if !self.line().await?.is_empty() {
                            return Err(invalid("expected CRLF after the final chunk"));
                        }
                        HeaderMap::new()
                    };
                    if self.decoded != self.spec.decoded_len {
                        return Err(S3Error::DecodedLengthMismatch);
                    }
                    if !self.buf.is_empty() || self.fill().await? {
                        return Err(invalid("data after the final chunk"));
                    }
                    self.state = State::Done;
                    if trailers.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(Frame::trailers(trailers)));
                }
                State::Data { remaining } => {
                    if self.buf.is_empty() && !self.fill().await? {
                        return Err(S3Error::IncompleteBody);
                    }
                    let n = (remaining as usize).min(self.buf.len());
                    let data = self.buf.split_to(n).freeze();
                    self.hasher.update(&data);
                    self.decoded += n as u64;
                    if self.decoded > self.spec.decoded_len {
                        return Err(S3Error::DecodedLengthMismatch);
                    }
                    let remaining = remaining - n as u64;
                    if remaining == 0 {
                        if !self.line().await?.is_empty() {
                            return Err(invalid("chunk data longer than its size"));
                        }
                        let hash = hex::encode(std::mem::take(&mut self.hasher).finalize());
                        self.verify_chunk(&hash)?;
                        self.state = State::Header;
                    } else {
                        self.state = State::Data { remaining };
                    }
                    return Ok(Some(Frame::data(data)));
                }
            }
        }
    }
}

/// Decodes an aws-chunked body. The stream ends with an error at the first
/// problem and yields nothing after it.
pub fn decode(input: ByteStream, spec: ChunkedSpec) -> FrameStream {
    let prev_signature = spec
        .signing
        .as_ref()
        .map(|s| s.seed_signature.clone())
        .unwrap_or_default();
    let decoder = Decoder {
        input,
        buf: BytesMut::new(),
        spec,
        prev_signature,
        chunk_signature: None,
        hasher: Sha256::new(),
        decoded: 0,
        state: State::Header,
    };
    Box::pin(futures_util::stream::unfold(decoder, |mut d| async move {
        match d.next_frame().await {
            Ok(Some(f)) => Some((Ok(f), d)),
            Ok(None) => None,
            Err(e) => {
                d.state = State::Done;
                Some((Err(e), d))
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::signing_key::{SigningKey, signing_key};

    fn example_signing(seed: &str) -> Signing {
        Signing {
            key: SigningKey::new(&signing_key(
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "20130524",
                "us-east-1",
                "s3",
            )),
            amz_date: "20130524T000000Z".into(),
            scope: "20130524/us-east-1/s3/aws4_request".into(),
            seed_signature: seed.into(),
        }
    }

    fn example_body(sigs: [&str; 3], tail: &str) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(format!("10000;chunk-signature={}\r\n", sigs[0]).as_bytes());
        body.extend_from_slice(&[b'a'; 65536]);
        body.extend_from_slice(format!("\r\n400;chunk-signature={}\r\n", sigs[1]).as_bytes());
        body.extend_from_slice(&[b'a'; 1024]);
        body.extend_from_slice(format!("\r\n0;chunk-signature={}\r\n", sigs[2]).as_bytes());
        body.extend_from_slice(tail.as_bytes());
        body
    }

    /// Feeds `body` in pieces of `step` bytes.
    async fn run(
        body: Vec<u8>,
        step: usize,
        spec: ChunkedSpec,
    ) -> Result<(Vec<u8>, HeaderMap), S3Error> {
        let pieces: Vec<Result<Bytes, S3Error>> = body
            .chunks(step)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut out = decode(Box::pin(futures_util::stream::iter(pieces)), spec);
        let (mut data, mut trailers) = (Vec::new(), HeaderMap::new());
        while let Some(f) = out.next().await {
            let f = f?;
            if let Some(d) = f.data_ref() {
                data.extend_from_slice(d);
            } else if let Ok(t) = f.into_trailers() {
                trailers = t;
            }
        }
        Ok((data, trailers))
    }

    const SIGS: [&str; 3] = [
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ];
    const SEED: &str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";

    fn signed_spec() -> ChunkedSpec {
        ChunkedSpec {
            signing: Some(example_signing(SEED)),
            trailers: vec![],
            has_trailer: false,
            decoded_len: 66560,
        }
    }

    // The STREAMING-AWS4-HMAC-SHA256-PAYLOAD example of the AWS docs.
    #[tokio::test]
    async fn aws_signed_chunk_example() {
        for step in [1, 7, 4096, 100_000] {
            let (data, _) = run(example_body(SIGS, "\r\n"), step, signed_spec())
                .await
                .unwrap();
            assert_eq!(data, vec![b'a'; 66560]);
        }
    }

    #[tokio::test]
    async fn flipped_byte_or_truncation_fails() {
        let mut body = example_body(SIGS, "\r\n");
        body[100] = b'b';
        assert!(matches!(
            run(body, 4096, signed_spec()).await,
            Err(S3Error::SignatureDoesNotMatch)
        ));
        let mut body = example_body(SIGS, "\r\n");
        body.truncate(66000);
        assert!(matches!(
            run(body, 4096, signed_spec()).await,
            Err(S3Error::IncompleteBody)
        ));
        // Cut right after a complete data chunk: still incomplete.
        let body = example_body(SIGS, "\r\n");
        let cut = body.len() - 86;
        assert!(
            run(body[..cut].to_vec(), 4096, signed_spec())
                .await
                .is_err()
        );
    }

    // The STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER example.
    #[tokio::test]
    async fn aws_signed_trailer_example() {
        let sigs = [
            "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
            "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
            "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
        ];
        let tail = "x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n\r\n";
        let spec = || ChunkedSpec {
            signing: Some(example_signing(
                "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e",
            )),
            trailers: vec!["x-amz-checksum-crc32c".into()],
            has_trailer: true,
            decoded_len: 66560,
        };
        let (data, trailers) = run(example_body(sigs, tail), 1000, spec()).await.unwrap();
        assert_eq!(data.len(), 66560);
        assert_eq!(trailers["x-amz-checksum-crc32c"], "sOO8/Q==");
        let bad = tail.replace("sOO8/Q==", "sOO8/Q=A");
        assert!(matches!(
            run(example_body(sigs, &bad), 1000, spec()).await,
            Err(S3Error::SignatureDoesNotMatch)
        ));
    }

    #[tokio::test]
    async fn unsigned_trailer() {
        let body = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:NhCmhg==\r\n\r\n".to_vec();
        let spec = || ChunkedSpec {
            signing: None,
            trailers: vec!["x-amz-checksum-crc32".into()],
            has_trailer: true,
            decoded_len: 5,
        };
        let (data, t) = run(body.clone(), 3, spec()).await.unwrap();
        assert_eq!(data, b"hello");
        assert_eq!(t["x-amz-checksum-crc32"], "NhCmhg==");
        let mut long = body.clone();
        long.extend_from_slice(b"junk");
        assert!(run(long, 3, spec()).await.is_err());
        let wrong_len = ChunkedSpec {
            decoded_len: 6,
            ..spec()
        };
        assert!(run(body, 3, wrong_len).await.is_err());
    }
}
