//! Plain reads of the embedded store (`upstream/plain_read.rs`) answer
//! what s3s answers: for objects with every attribute the store keeps
//! (content headers, `Expires`, a redirect, metadata, none of them, no
//! bytes, bytes streamed from their file, a multipart object), each GET
//! and HEAD is sent both ways to the same store and the two answers
//! compared: status, every header but the request id and date, and the
//! body byte for byte. The reads that are not plain are checked to go
//! through s3s, and one fencegate did not mark as its own is refused.

use bytes::Bytes;
use fencegate::upstream::embedded::{self, InProcess, Trusted};
use fencegate::upstream::plain_read;
use http_body_util::BodyExt;

type Headers<'a> = &'a [(&'a str, &'a str)];

fn request(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> http::Request<s3s::Body> {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let mut req = b
        .header("content-length", body.len())
        .body(s3s::Body::from(body))
        .unwrap();
    req.extensions_mut().insert(Trusted);
    req
}

/// Status, headers (sorted, without the ones that differ per answer) and
/// body.
async fn seen(resp: s3s::HttpResponse) -> (u16, Vec<(String, String)>, Bytes) {
    let status = resp.status().as_u16();
    let mut headers: Vec<_> = resp
        .headers()
        .iter()
        .filter(|(n, _)| !matches!(n.as_str(), "x-amz-request-id" | "date"))
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    headers.sort();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, without_request_id(body))
}

/// An error's body without its `<RequestId>`, which differs per answer.
fn without_request_id(body: Bytes) -> Bytes {
    let text = String::from_utf8_lossy(&body);
    match (text.find("<RequestId>"), text.find("</RequestId>")) {
        (Some(a), Some(b)) => Bytes::from(format!("{}{}", &text[..a], &text[b..])),
        _ => body,
    }
}

async fn ok(s: &InProcess, req: http::Request<s3s::Body>) -> (u16, Vec<(String, String)>, Bytes) {
    let got = seen(s.call_through_s3s(req).await).await;
    assert!(got.0 < 300, "{got:?}");
    got
}

/// A multipart object of two parts (the first the smallest S3 allows).
async fn multipart(s: &InProcess, key: &str) {
    let uri = format!("/demo/{key}");
    let (_, _, created) = ok(
        s,
        request("POST", &format!("{uri}?uploads"), &[], Bytes::new()),
    )
    .await;
    let text = String::from_utf8_lossy(&created);
    let id = text
        .split("<UploadId>")
        .nth(1)
        .unwrap()
        .split('<')
        .next()
        .unwrap();
    let mut parts = String::new();
    for (n, len) in [(1, 5 << 20), (2, 1000)] {
        let body = Bytes::from(vec![b'a' + n as u8; len]);
        let part = format!("{uri}?partNumber={n}&uploadId={id}");
        let (_, headers, _) = ok(s, request("PUT", &part, &[], body)).await;
        let etag = &headers.iter().find(|(h, _)| h == "etag").unwrap().1;
        parts += &format!("<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>");
    }
    let done = format!("<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>");
    ok(
        s,
        request(
            "POST",
            &format!("{uri}?uploadId={id}"),
            &[],
            Bytes::from(done),
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_read_answers_what_s3s_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _, store) = embedded::open(dir.path()).unwrap();
    ok(&s, request("PUT", "/demo", &[], Bytes::new())).await;
    let all_headers: &[(&str, &str)] = &[
        ("content-type", "text/plain; charset=utf-8"),
        ("cache-control", "max-age=60"),
        ("content-disposition", "attachment; filename=\"a.txt\""),
        ("content-encoding", "identity"),
        ("content-language", "de-CH"),
        ("expires", "Wed, 21 Oct 2037 07:28:00 GMT"),
        ("x-amz-website-redirect-location", "/elsewhere"),
        ("x-amz-meta-plain", "one two"),
        ("x-amz-meta-Mixed-Case", "Value"),
    ];
    let objects: &[(&str, Headers, usize)] = &[
        ("bare", &[], 10),
        ("dir/sub/all-headers", all_headers, 4096),
        ("utf8-metadata", &[("x-amz-meta-name", "h\u{e9}llo")], 5),
        ("empty", &[], 0),
        ("streamed", &[], 300 << 10),
        ("a.b_c~d-e", &[], 20_000),
    ];
    for (key, headers, len) in objects {
        let body = Bytes::from((0..*len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        ok(&s, request("PUT", &format!("/demo/{key}"), headers, body)).await;
    }
    multipart(&s, "multi").await;

    // Answered without s3s, and as s3s answers.
    for key in [
        "bare",
        "dir/sub/all-headers",
        "empty",
        "streamed",
        "a.b_c~d-e",
        "multi",
    ] {
        for method in ["GET", "HEAD"] {
            let uri = format!("/demo/{key}");
            let req = request(method, &uri, &[("user-agent", "test")], Bytes::new());
            let read = plain_read::plain(&req).expect("a plain read");
            let plain = plain_read::answer(&store, &read).await;
            let plain = seen(plain.expect("answered without s3s")).await;
            let req = request(method, &uri, &[("user-agent", "test")], Bytes::new());
            let through_s3s = seen(s.call_through_s3s(req).await).await;
            assert_eq!(plain, through_s3s, "{method} {key}");
            let req = request(method, &uri, &[("user-agent", "test")], Bytes::new());
            assert_eq!(seen(s.call(req).await).await, through_s3s, "{method} {key}");
        }
    }

    // A read fencegate did not mark as its own is judged by s3s, as
    // anonymous: refused, though plain.
    for method in ["GET", "HEAD"] {
        let mut req = request(method, "/demo/bare", &[], Bytes::new());
        req.extensions_mut().remove::<Trusted>();
        assert_eq!(s.call(req).await.status().as_u16(), 403, "{method}");
    }

    // Left to s3s, with the same answer through `call`: metadata s3s
    // encodes, and every refusal.
    for uri in ["/demo/utf8-metadata", "/demo/missing", "/nobucket/key"] {
        for method in ["GET", "HEAD"] {
            let req = request(method, uri, &[], Bytes::new());
            let read = plain_read::plain(&req).expect("plain as asked");
            assert!(plain_read::answer(&store, &read).await.is_none(), "{uri}");
            let through_s3s = seen(
                s.call_through_s3s(request(method, uri, &[], Bytes::new()))
                    .await,
            )
            .await;
            let called = seen(s.call(request(method, uri, &[], Bytes::new())).await).await;
            assert_eq!(called, through_s3s, "{method} {uri}");
        }
    }
}

#[test]
fn a_read_that_asks_more_is_left_to_s3s() {
    let not_plain: &[(&str, &str, Headers)] = &[
        ("PUT", "/demo/k", &[]),
        ("GET", "/demo/k?partNumber=1", &[]),
        ("GET", "/demo/k?versionId=null", &[]),
        ("GET", "/demo/k?response-content-type=x", &[]),
        ("GET", "/demo/k", &[("range", "bytes=0-1")]),
        ("HEAD", "/demo/k", &[("if-none-match", "\"x\"")]),
        (
            "GET",
            "/demo/k",
            &[("if-modified-since", "Wed, 21 Oct 2037 07:28:00 GMT")],
        ),
        ("GET", "/demo/k", &[("x-amz-checksum-mode", "ENABLED")]),
        (
            "GET",
            "/demo/k",
            &[("x-amz-server-side-encryption-customer-algorithm", "AES256")],
        ),
        (
            "GET",
            "/demo/k",
            &[("authorization", "AWS4-HMAC-SHA256 ...")],
        ),
        ("GET", "/demo/a%20b", &[]),
        ("GET", "/demo/a+b", &[]),
        ("GET", "/demo//k", &[]),
        ("GET", "/demo/a/../k", &[]),
        ("GET", "/demo/", &[]),
        ("GET", "/demo", &[]),
    ];
    for (method, uri, headers) in not_plain {
        let req = request(method, uri, headers, Bytes::new());
        assert!(
            plain_read::plain(&req).is_none(),
            "{method} {uri} {headers:?}"
        );
    }
    assert!(plain_read::plain(&request("GET", "/demo/k", &[], Bytes::new())).is_some());
}
