//! Request bodies on their way upstream, as streams of frames:
//! the payload checks (hex SHA-256) and the aws-chunked encoder that carries
//! checksum trailers to the backend. The body gate that holds back the
//! last frame until everything verified and the fence still admits the write
//! is the fence's (`fence::body_gate`).

use super::chunked::{ByteStream, FrameStream};
use super::error::S3Error;
use crate::body::IdleTimer;
use crate::metric_names as m;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::HeaderMap;
use http_body::Body;
use http_body::Frame;
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

/// A body already read whole, as a stream of one piece.
pub fn whole(body: Bytes) -> ByteStream {
    Box::pin(futures_util::stream::iter(
        (!body.is_empty()).then_some(Ok(body)),
    ))
}

/// The client's body as bytes. A connection that ends early is an
/// incomplete body; a pause longer than `idle` is a request timeout. HTTP
/// trailers are not used by S3 and are dropped.
///
/// The idle timer is armed only when the body has nothing ready: a small
/// body that came with its head never touches the timer wheel.
pub fn incoming(body: hyper::body::Incoming, idle: Duration) -> ByteStream {
    Box::pin(Incoming {
        body,
        idle: IdleTimer::new(idle),
        failed: false,
    })
}

struct Incoming {
    body: hyper::body::Incoming,
    idle: IdleTimer,
    failed: bool,
}

impl Stream for Incoming {
    type Item = Result<Bytes, S3Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(_))) => {
                    this.failed = true;
                    return Poll::Ready(Some(Err(S3Error::IncompleteBody)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    this.idle.progress();
                    if let Ok(data) = frame.into_data() {
                        m::handles::add_bytes_in(data.len() as u64);
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Pending => {
                    ready!(this.idle.poll_expired(cx));
                    this.failed = true;
                    return Poll::Ready(Some(Err(S3Error::RequestTimeout)));
                }
            }
        }
    }
}

/// Plain data frames, unchecked (`UNSIGNED-PAYLOAD`).
pub fn plain(input: ByteStream) -> FrameStream {
    Box::pin(input.map(|r| r.map(Frame::data)))
}

/// Data frames whose SHA-256 must equal `expected`; the stream ends with an
/// error instead of its end if it does not.
pub fn sha256_checked(input: ByteStream, expected: [u8; 32]) -> FrameStream {
    struct St {
        input: ByteStream,
        hasher: Option<Sha256>,
        expected: [u8; 32],
    }
    let st = St {
        input,
        hasher: Some(Sha256::new()),
        expected,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        let hasher = st.hasher.as_mut()?;
        match st.input.next().await {
            Some(Ok(b)) => {
                hasher.update(&b);
                Some((Ok(Frame::data(b)), st))
            }
            Some(Err(e)) => {
                st.hasher = None;
                Some((Err(e), st))
            }
            None => {
                let got = st.hasher.take()?.finalize();
                if got.as_slice() == st.expected {
                    None
                } else {
                    Some((Err(S3Error::ContentSha256Mismatch), st))
                }
            }
        }
    }))
}

/// Data only: drops a trailers frame (for upstream bodies without trailers).
pub fn data_only(input: FrameStream) -> impl Stream<Item = Result<Frame<Bytes>, S3Error>> + Send {
    input.filter(|f| std::future::ready(!matches!(f, Ok(f) if f.is_trailers())))
}

/// Encoded size of an unsigned aws-chunked body of `decoded_len` bytes in
/// chunks of `chunk` bytes, with the given trailer lines (`name:value`).
pub fn chunked_encoded_len(decoded_len: u64, chunk: u64, trailer_lines: &[(String, usize)]) -> u64 {
    let hex_len = |n: u64| format!("{n:x}").len() as u64;
    let full = decoded_len / chunk;
    let rest = decoded_len % chunk;
    let mut len = full * (hex_len(chunk) + 2 + chunk + 2);
    if rest > 0 {
        len += hex_len(rest) + 2 + rest + 2;
    }
    len += 3; // "0\r\n"
    for (name, value_len) in trailer_lines {
        len += name.len() as u64 + 1 + *value_len as u64 + 2;
    }
    len + 2
}

/// Base64 length of a checksum trailer's value, by trailer name.
pub fn checksum_value_len(name: &str) -> Option<usize> {
    Some(match name {
        "x-amz-checksum-crc32" | "x-amz-checksum-crc32c" => 8,
        "x-amz-checksum-crc64nvme" => 12,
        "x-amz-checksum-sha1" => 28,
        "x-amz-checksum-sha256" => 44,
        _ => return None,
    })
}

/// Re-encodes frames as an unsigned aws-chunked body with fixed-size chunks
/// (so its length is known up front) and the trailers at the end.
pub fn chunked_encode(input: FrameStream, chunk: usize) -> ByteStream {
    struct St {
        input: FrameStream,
        buf: BytesMut,
        trailers: Option<HeaderMap>,
        done: bool,
        chunk: usize,
    }
    fn frame_chunk(data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len() + 16);
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        out.freeze()
    }
    let st = St {
        input,
        buf: BytesMut::new(),
        trailers: None,
        done: false,
        chunk,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            if st.buf.len() >= st.chunk {
                let data = st.buf.split_to(st.chunk);
                return Some((Ok(frame_chunk(&data)), st));
            }
            match st.input.next().await {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => st.buf.extend_from_slice(&d),
                    Err(f) => st.trailers = f.into_trailers().ok(),
                },
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.done = true;
                    let mut out = BytesMut::new();
                    if !st.buf.is_empty() {
                        out.extend_from_slice(&frame_chunk(&st.buf));
                    }
                    out.extend_from_slice(b"0\r\n");
                    for (name, value) in st.trailers.iter().flatten() {
                        out.extend_from_slice(name.as_str().as_bytes());
                        out.extend_from_slice(b":");
                        out.extend_from_slice(value.as_bytes());
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"\r\n");
                    return Some((Ok(out.freeze()), st));
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: Vec<Frame<Bytes>>) -> FrameStream {
        Box::pin(futures_util::stream::iter(parts.into_iter().map(Ok)))
    }

    #[tokio::test]
    async fn encoder_length_matches_prediction() {
        for len in [0usize, 1, 99, 100, 101, 1000] {
            let mut t = HeaderMap::new();
            t.insert("x-amz-checksum-crc32", "AAAAAA==".parse().unwrap());
            let data = vec![b'x'; len];
            let parts = vec![
                Frame::data(Bytes::from(data[..len / 2].to_vec())),
                Frame::data(Bytes::from(data[len / 2..].to_vec())),
                Frame::trailers(t),
            ];
            let out: Vec<Bytes> = chunked_encode(frames(parts), 100)
                .map(|r| r.unwrap())
                .collect()
                .await;
            let total: usize = out.iter().map(|b| b.len()).sum();
            let predicted =
                chunked_encoded_len(len as u64, 100, &[("x-amz-checksum-crc32".into(), 8)]);
            assert_eq!(total as u64, predicted, "len {len}");
        }
    }

    #[tokio::test]
    async fn sha_mismatch_is_an_error_at_the_end() {
        let input: ByteStream = Box::pin(futures_util::stream::iter(vec![Ok(Bytes::from_static(
            b"abc",
        ))]));
        let out: Vec<_> = sha256_checked(input, [0; 32]).collect().await;
        assert!(matches!(
            out.last(),
            Some(Err(S3Error::ContentSha256Mismatch))
        ));
        let input: ByteStream = Box::pin(futures_util::stream::iter(vec![Ok(Bytes::from_static(
            b"abc",
        ))]));
        let good: [u8; 32] = Sha256::digest(b"abc").into();
        let out: Vec<_> = sha256_checked(input, good).collect().await;
        assert!(out.iter().all(|r| r.is_ok()));
    }
}
