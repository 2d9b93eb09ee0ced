//! The request bodies of the hand-driven S3 client (`raw`): where their
//! bytes come from, how each payload form encodes them on the wire
//! (aws-chunked, signed or with an unsigned trailer), and the damage a test
//! can do to those bytes. Kept apart from `raw`, which builds, signs and
//! sends the request around them.

use super::raw::v4_params;
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::time::SystemTime;

pub type ByteStream = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

pub const CHUNK: usize = 64 * 1024;

/// How the payload is signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Unsigned,
    Sha256,
    /// STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER] with 64 KiB chunks.
    Chunked {
        trailer: bool,
    },
    /// STREAMING-UNSIGNED-PAYLOAD-TRAILER with a SHA-256 trailer, sent with
    /// `Transfer-Encoding: chunked` and no Content-Length, as botocore does.
    UnsignedTrailer,
}

/// A body: its decoded length, its bytes as a stream, and (for the SHA-256
/// form) its hash.
pub struct Source {
    pub len: u64,
    pub sha256: Option<String>,
    pub stream: ByteStream,
}

impl Source {
    pub fn bytes(b: impl Into<Bytes>) -> Source {
        let b: Bytes = b.into();
        Source {
            len: b.len() as u64,
            sha256: Some(hex::encode(Sha256::digest(&b))),
            stream: Box::pin(futures_util::stream::iter(if b.is_empty() {
                vec![]
            } else {
                vec![b]
            })),
        }
    }

    /// `len` bytes of a repeating pattern, generated as they are sent.
    pub fn pattern(len: u64, with_hash: bool) -> Source {
        let block = Bytes::from((0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let pieces = |block: Bytes| {
            let full = len / CHUNK as u64;
            let rest = (len % CHUNK as u64) as usize;
            futures_util::stream::iter(0..full)
                .map(move |_| block.clone())
                .chain(futures_util::stream::iter(if rest > 0 {
                    vec![Bytes::from(
                        (0..rest).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
                    )]
                } else {
                    vec![]
                }))
        };
        let sha256 = with_hash.then(|| {
            let mut h = Sha256::new();
            let full = len / CHUNK as u64;
            for _ in 0..full {
                h.update(&block[..]);
            }
            let rest = (len % CHUNK as u64) as usize;
            h.update((0..rest).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
            hex::encode(h.finalize())
        });
        Source {
            len,
            sha256,
            stream: Box::pin(pieces(block.clone())),
        }
    }

    /// A body the test feeds through the returned sender.
    pub fn channel(len: u64) -> (tokio::sync::mpsc::Sender<Bytes>, Source) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            );
        (
            tx,
            Source {
                len,
                sha256: None,
                stream: Box::pin(stream),
            },
        )
    }
}

/// Damage applied to the bytes on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub struct Damage {
    /// Flip the byte at this offset of the encoded body.
    pub flip_at: Option<u64>,
    /// Send only this many bytes of the encoded body, then break off.
    pub cut_at: Option<u64>,
}

/// Adds the headers that `form` needs for `body` (content encoding,
/// decoded length, trailer, and the Content-Length when the form has one)
/// to `headers`, and returns the payload hash to sign
/// (`x-amz-content-sha256`).
pub(super) fn payload_headers(
    body: Option<&Source>,
    form: Form,
    headers: &mut Vec<(String, String)>,
) -> String {
    let trailer_line = "x-amz-checksum-sha256:".to_string();
    let (content_sha, wire_len) = match (body, form) {
        (None, _) => ("UNSIGNED-PAYLOAD".to_string(), Some(0)),
        (Some(s), Form::Unsigned) => ("UNSIGNED-PAYLOAD".to_string(), Some(s.len)),
        (Some(s), Form::Sha256) => (s.sha256.clone().expect("hash"), Some(s.len)),
        (Some(s), Form::Chunked { trailer: false }) => {
            headers.push(("content-encoding".into(), "aws-chunked".into()));
            headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
            (
                "STREAMING-AWS4-HMAC-SHA256-PAYLOAD".to_string(),
                Some(signed_chunked_len(s.len, None)),
            )
        }
        (Some(s), Form::UnsignedTrailer) => {
            headers.push(("content-encoding".into(), "aws-chunked".into()));
            headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
            headers.push(("x-amz-trailer".into(), "x-amz-checksum-sha256".into()));
            ("STREAMING-UNSIGNED-PAYLOAD-TRAILER".to_string(), None)
        }
        (Some(s), Form::Chunked { trailer: true }) => {
            headers.push(("content-encoding".into(), "aws-chunked".into()));
            headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
            headers.push(("x-amz-trailer".into(), "x-amz-checksum-sha256".into()));
            let line = format!("{trailer_line}{}", "A".repeat(44));
            (
                "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER".to_string(),
                Some(signed_chunked_len(s.len, Some(&line))),
            )
        }
    };
    if let Some(n) = wire_len {
        headers.push(("content-length".into(), n.to_string()));
    }
    content_sha
}

/// The bytes `src` puts on the wire in `form`, with `damage` applied:
/// signed aws-chunked chunks follow from `seed`, the request's signature.
pub(super) fn wire_stream(
    src: Source,
    form: Form,
    seed: String,
    identity: Identity,
    time: SystemTime,
    d: Damage,
) -> impl Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>> + Send {
    let wire: ByteStream = match form {
        Form::Chunked { trailer } => signed_chunks(src, seed, identity, time, trailer),
        Form::UnsignedTrailer => unsigned_trailer_chunks(src),
        _ => src.stream,
    };
    damage(wire, d)
}

fn chunk_sig_len() -> u64 {
    ";chunk-signature=".len() as u64 + 64
}

/// Encoded length of a signed aws-chunked body in CHUNK-sized chunks.
fn signed_chunked_len(len: u64, trailer: Option<&str>) -> u64 {
    let piece = |n: u64| format!("{n:x}").len() as u64 + chunk_sig_len() + 2 + n + 2;
    let full = len / CHUNK as u64;
    let rest = len % CHUNK as u64;
    let mut total = full * piece(CHUNK as u64) + if rest > 0 { piece(rest) } else { 0 };
    total += 1 + chunk_sig_len() + 2; // final chunk header
    match trailer {
        None => total + 2,
        Some(line) => {
            total + line.len() as u64 + 2 + "x-amz-trailer-signature:".len() as u64 + 64 + 2 + 2
        }
    }
}

/// The state of a signed aws-chunked stream being produced.
struct ChunkSigner {
    input: ByteStream,
    buf: BytesMut,
    prev: String,
    identity: Identity,
    time: SystemTime,
    hasher: Sha256,
    done: bool,
    trailer: bool,
}

/// Signs `data` as the next chunk (chained on the previous signature) and
/// frames it.
fn signed_chunk(st: &mut ChunkSigner, data: Bytes) -> Bytes {
    let sig = v4::sign_chunk(&data, &st.prev, &v4_params(&st.identity, st.time))
        .unwrap()
        .signature()
        .to_string();
    st.prev = sig.clone();
    let mut out = BytesMut::with_capacity(data.len() + 100);
    out.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", data.len()).as_bytes());
    out.extend_from_slice(&data);
    if !data.is_empty() || !st.trailer {
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// What follows the input's end: the rest of the buffer as a chunk,
/// the empty final chunk, and the signed trailer when there is one.
fn signed_end(st: &mut ChunkSigner) -> Bytes {
    let mut out = BytesMut::new();
    if !st.buf.is_empty() {
        let data = st.buf.split().freeze();
        out.extend_from_slice(&signed_chunk(st, data));
    }
    out.extend_from_slice(&signed_chunk(st, Bytes::new()));
    if st.trailer {
        use base64::Engine;
        let sum = base64::engine::general_purpose::STANDARD
            .encode(std::mem::take(&mut st.hasher).finalize());
        let mut h = aws_smithy_runtime_api::http::Headers::new();
        h.insert("x-amz-checksum-sha256", sum.clone());
        let sig = v4::sign_trailer(&h, &st.prev, &v4_params(&st.identity, st.time))
            .unwrap()
            .signature()
            .to_string();
        out.extend_from_slice(
            format!("x-amz-checksum-sha256:{sum}\r\nx-amz-trailer-signature:{sig}\r\n\r\n")
                .as_bytes(),
        );
    }
    out.freeze()
}

/// Re-chunks `src` into CHUNK-sized signed chunks, signing as it goes.
fn signed_chunks(
    src: Source,
    seed: String,
    identity: Identity,
    time: SystemTime,
    trailer: bool,
) -> ByteStream {
    let st = ChunkSigner {
        input: src.stream,
        buf: BytesMut::new(),
        prev: seed,
        identity,
        time,
        hasher: Sha256::new(),
        done: false,
        trailer,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            if st.buf.len() >= CHUNK {
                let data = st.buf.split_to(CHUNK).freeze();
                let c = signed_chunk(&mut st, data);
                return Some((c, st));
            }
            match st.input.next().await {
                Some(b) => {
                    st.hasher.update(&b);
                    st.buf.extend_from_slice(&b);
                }
                None => {
                    st.done = true;
                    let out = signed_end(&mut st);
                    return Some((out, st));
                }
            }
        }
    }))
}

/// Unsigned aws-chunked: each piece of `src` one chunk, then a SHA-256 trailer.
fn unsigned_trailer_chunks(src: Source) -> ByteStream {
    use base64::Engine;
    let hasher = std::sync::Arc::new(std::sync::Mutex::new(Sha256::new()));
    let h2 = hasher.clone();
    let chunks = src.stream.map(move |b| {
        h2.lock().unwrap().update(&b);
        let mut out = BytesMut::new();
        out.extend_from_slice(format!("{:x}\r\n", b.len()).as_bytes());
        out.extend_from_slice(&b);
        out.extend_from_slice(b"\r\n");
        out.freeze()
    });
    let tail = futures_util::stream::once(async move {
        let sum = base64::engine::general_purpose::STANDARD
            .encode(std::mem::take(&mut *hasher.lock().unwrap()).finalize());
        Bytes::from(format!("0\r\nx-amz-checksum-sha256:{sum}\r\n\r\n"))
    });
    Box::pin(chunks.chain(tail))
}

/// Applies `d` to a wire stream; a cut ends the stream with an I/O error.
fn damage(
    wire: ByteStream,
    d: Damage,
) -> impl Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>> + Send {
    let mut offset = 0u64;
    let mut cut = false;
    wire.map(move |b| {
        let start = offset;
        offset += b.len() as u64;
        let mut b = b;
        if let Some(at) = d.flip_at
            && at >= start
            && at < offset
        {
            let mut m = BytesMut::from(&b[..]);
            m[(at - start) as usize] ^= 0x01;
            b = m.freeze();
        }
        (start, b)
    })
    .take_while(move |(start, _)| {
        let go = !cut;
        if let Some(at) = d.cut_at
            && *start >= at
        {
            cut = true;
        }
        std::future::ready(go || d.cut_at.is_none())
    })
    .map(move |(start, b)| {
        if let Some(at) = d.cut_at {
            if start >= at {
                return Err(std::io::Error::other("cut"));
            }
            if start + b.len() as u64 > at {
                return Ok(http_body::Frame::data(b.slice(..(at - start) as usize)));
            }
        }
        Ok(http_body::Frame::data(b))
    })
}
