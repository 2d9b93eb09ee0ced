//! SigV4 microbenchmarks (BENCHMARKS.md, "Signatures"): every step that
//! checks a client's signature and signs again for the backend, beside the
//! same steps in aws-sigv4 (the AWS SDK's signer) and the raw SHA-256 and
//! HMAC of the crates in use, in one run.
//!
//! The client's requests are signed by aws-sigv4, as an SDK sends them: a
//! PUT with the headers boto3 and the Rust SDK send, signed in the header
//! (unsigned payload, or the body's SHA-256) or presigned. Before the
//! criterion lines it prints whether the CPU has the SHA extensions and the
//! SHA-256 throughput of `sha2` and `ring` at 1 MiB: SHA-NI runs at
//! 1.5-2 GB/s a core, software SHA-256 at a quarter of that.

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation,
    SigningSettings, UriPathNormalizationMode, sign,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencegate::config::Credential;
use fencegate::s3::auth::{self, Credentials, Head};
use fencegate::s3::query::decode_query;
use fencegate::s3::sign::HeaderSigner;
use fencegate::s3::signing_key::{self as keys, KeyCache, SigningKey};
use fencegate::s3::sigv4;
use fencegate::upstream::client::forwarded_headers;
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// The allocator the binary runs with (`main.rs`).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const REGION: &str = "us-east-1";
const PATH: &str = "/bucket/tables/events/part-00017.parquet";
/// A time inside every signature's validity.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// How the client signs.
#[derive(Clone, Copy)]
enum Form {
    /// `Authorization`, `x-amz-content-sha256: UNSIGNED-PAYLOAD`.
    Header,
    /// `Authorization`, the body's SHA-256 as `x-amz-content-sha256`.
    HeaderSignedBody,
    /// The signature in the URL.
    Presigned,
}

/// aws-sigv4's parameters for S3 in `region`, signed now.
fn aws_params<'a>(
    identity: &'a aws_smithy_runtime_api::client::identity::Identity,
    region: &'a str,
    settings: SigningSettings,
) -> aws_sigv4::http_request::SigningParams<'a> {
    aws_sigv4::sign::v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name("s3")
        .time(now())
        .settings(settings)
        .build()
        .unwrap()
        .into()
}

/// A client's PUT as an SDK sends it, signed by aws-sigv4: its headers and
/// its raw query (empty but for a presigned URL's parameters).
fn client_put(form: Form) -> (HeaderMap, String) {
    let mut h = HeaderMap::new();
    h.insert("host", "127.0.0.1:9000".parse().unwrap());
    h.insert("content-length", "4096".parse().unwrap());
    h.insert("content-type", "application/octet-stream".parse().unwrap());
    h.insert("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==".parse().unwrap());
    h.insert(
        "user-agent",
        "aws-sdk-rust/1.3.3 os/linux lang/rust/1.90.0"
            .parse()
            .unwrap(),
    );
    h.insert(
        "amz-sdk-invocation-id",
        "5b5d5c3c-d1f2-4b8a-9d0e-3c2f0a6e7b41".parse().unwrap(),
    );
    h.insert("amz-sdk-request", "attempt=1; max=3".parse().unwrap());
    h.insert("x-fencing-token", "1729".parse().unwrap());
    let body = vec![7u8; 4096];
    let (signable_body, location) = match form {
        Form::Header => (SignableBody::UnsignedPayload, SignatureLocation::Headers),
        Form::HeaderSignedBody => (SignableBody::Bytes(&body), SignatureLocation::Headers),
        Form::Presigned => (
            SignableBody::UnsignedPayload,
            SignatureLocation::QueryParams,
        ),
    };
    let url = format!("http://127.0.0.1:9000{PATH}");
    let pairs = h.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap()));
    let signable = SignableRequest::new("PUT", &url, pairs, signable_body).unwrap();
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.signature_location = location;
    if !matches!(form, Form::Presigned) {
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    } else {
        settings.expires_in = Some(Duration::from_secs(3600));
    }
    let identity = aws_credential_types::Credentials::new("AK", "SK", None, None, "b").into();
    let params = aws_params(&identity, REGION, settings);
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut req = http::Request::builder().uri(&url).body(()).unwrap();
    *req.headers_mut() = h;
    instructions.apply_to_request_http1x(&mut req);
    let query = req.uri().query().unwrap_or_default().to_string();
    (req.headers().clone(), query)
}

fn credentials() -> Credentials {
    Credentials::new(&[Credential {
        access_key_id: "AK".into(),
        secret_access_key: "SK".into(),
        buckets: vec!["*".into()],
        bucket_admin: false,
    }])
}

/// What goes to the backend, as the proxy hands it to the signer: the
/// client's headers as `forwarded_headers` copies them (without its
/// signature, host, length and token, into a map with room for what is
/// added), then the backend's host and the body's length.
fn backend_headers(client: &HeaderMap) -> HeaderMap {
    let mut h = forwarded_headers(client, &["x-fencing-token"]);
    h.insert("host", "127.0.0.1:3900".parse().unwrap());
    h.insert("content-length", "4096".parse().unwrap());
    h
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("sigv4/key");
    g.bench_function("derive (4 HMACs)", |b| {
        b.iter(|| keys::signing_key(black_box("SK"), "20270115", REGION, "s3"))
    });
    let cache = KeyCache::default();
    let scope = "20270115/us-east-1/s3/aws4_request";
    g.bench_function("cached (the day's key)", |b| {
        b.iter(|| cache.get(black_box(scope), day_key))
    });
    let _ = cache.get(scope, || keys::signing_key("SK", "20270115", REGION, "s3"));
    g.bench_function("aws-sigv4 derive", |b| {
        b.iter(|| aws_sigv4::sign::v4::generate_signing_key(black_box("SK"), now(), REGION, "s3"))
    });
    g.finish();
}

fn day_key() -> [u8; 32] {
    keys::signing_key("SK", "20270115", REGION, "s3")
}

fn steps(c: &mut Criterion) {
    let (headers, raw_query) = client_put(Form::Header);
    let query = decode_query(
        Some(&raw_query)
            .filter(|q| !q.is_empty())
            .map(|q| q.as_str()),
    );
    let head = Head {
        method: "PUT",
        raw_path: PATH,
        query: &query,
        headers: &headers,
    };
    let signed = [
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "content-length",
        "content-md5",
        "content-type",
        "host",
        "x-amz-content-sha256",
        "x-amz-date",
        "x-fencing-token",
    ];
    let amz_date = headers["x-amz-date"].to_str().unwrap();
    let scope = format!("{}/{REGION}/s3/aws4_request", &amz_date[..8]);
    let canonical =
        sigv4::canonical_request(&head, &signed, false, Some("UNSIGNED-PAYLOAD")).unwrap();
    let key = SigningKey::new(&keys::signing_key("SK", &amz_date[..8], REGION, "s3"));
    let mut g = c.benchmark_group("sigv4/steps");
    g.bench_function("canonical request", |b| {
        b.iter(|| {
            sigv4::canonical_request(black_box(&head), &signed, false, Some("UNSIGNED-PAYLOAD"))
        })
    });
    g.bench_function("string to sign", |b| {
        b.iter(|| keys::string_to_sign(amz_date, &scope, black_box(&canonical)))
    });
    g.bench_function("signature (hash + HMAC, no string)", |b| {
        b.iter(|| key.mac_request(amz_date, &scope, black_box(&canonical)))
    });
    g.finish();
}

fn verify_and_resign(c: &mut Criterion) {
    let creds = credentials();
    let signer = HeaderSigner::new("BK", "BS", "garage");
    let mut g = c.benchmark_group("sigv4/request");
    for (name, form) in [
        ("header", Form::Header),
        ("header, signed body", Form::HeaderSignedBody),
        ("presigned", Form::Presigned),
    ] {
        let (headers, raw_query) = client_put(form);
        let query = decode_query(Some(raw_query.as_str()).filter(|q| !q.is_empty()));
        let head = Head {
            method: "PUT",
            raw_path: PATH,
            query: &query,
            headers: &headers,
        };
        auth::verify(&head, &creds, REGION, now()).expect("the client's signature verifies");
        let payload = match form {
            Form::HeaderSignedBody => headers["x-amz-content-sha256"].to_str().unwrap(),
            _ => "UNSIGNED-PAYLOAD",
        };
        g.bench_function(BenchmarkId::new("verify", name), |b| {
            b.iter(|| auth::verify(black_box(&head), &creds, REGION, now()).unwrap())
        });
        // Each signing gets a map made as the proxy makes one per request
        // (with room for the signature's headers; a clone has none).
        g.bench_function(BenchmarkId::new("re-sign", name), |b| {
            b.iter_batched_ref(
                || backend_headers(&headers),
                |h| signer.sign("PUT", PATH, &[], h, payload, now()).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
        g.bench_function(BenchmarkId::new("verify + forward + re-sign", name), |b| {
            b.iter(|| {
                auth::verify(black_box(&head), &creds, REGION, now()).unwrap();
                let mut h = backend_headers(black_box(&headers));
                signer
                    .sign("PUT", PATH, &[], &mut h, payload, now())
                    .unwrap();
                h
            })
        });
        g.bench_function(BenchmarkId::new("forward", name), |b| {
            b.iter(|| backend_headers(black_box(&headers)))
        });
        g.bench_function(BenchmarkId::new("verify + re-sign", name), |b| {
            b.iter_batched_ref(
                || backend_headers(&headers),
                |h| {
                    auth::verify(black_box(&head), &creds, REGION, now()).unwrap();
                    signer.sign("PUT", PATH, &[], h, payload, now()).unwrap()
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    // aws-sigv4 signing the backend's request: the same work as re-sign
    // (canonical request, string to sign, signature), its key cached by
    // nothing (it derives it each time, as the SDK does).
    let backend = backend_headers(&client_put(Form::Header).0);
    g.bench_function(BenchmarkId::new("aws-sigv4 sign", "header"), |b| {
        let identity = aws_credential_types::Credentials::new("BK", "BS", None, None, "b").into();
        let url = format!("http://127.0.0.1:3900{PATH}");
        b.iter(|| {
            let pairs = backend
                .iter()
                .map(|(k, v)| (k.as_str(), v.to_str().unwrap()));
            let signable =
                SignableRequest::new("PUT", &url, pairs, SignableBody::UnsignedPayload).unwrap();
            let mut settings = SigningSettings::default();
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
            sign(signable, &aws_params(&identity, "garage", settings)).unwrap()
        })
    });
    g.finish();
}

fn hashes(c: &mut Criterion) {
    let mut g = c.benchmark_group("sigv4/body sha256");
    for size in [4096usize, 65_536, 1 << 20] {
        let body = vec![0x5au8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("sha2", size), &body, |b, body| {
            b.iter(|| Sha256::digest(black_box(body)))
        });
        g.bench_with_input(BenchmarkId::new("ring", size), &body, |b, body| {
            b.iter(|| ring::digest::digest(&ring::digest::SHA256, black_box(body)))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("sigv4/hmac");
    let msg = [0x41u8; 200];
    let key = [9u8; 32];
    let pre = SigningKey::new(&key);
    g.bench_function("hmac crate, 200 B", |b| {
        b.iter(|| keys::hmac(black_box(&key), black_box(&msg)))
    });
    g.bench_function("hmac crate, pads kept, 200 B", |b| {
        b.iter(|| pre.mac(black_box(&msg)))
    });
    let ring_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    g.bench_function("ring, 200 B", |b| {
        b.iter(|| ring::hmac::sign(&ring_key, black_box(&msg)))
    });
    g.finish();
}

/// Whether SHA-256 runs on the SHA extensions here: the CPU's flag, and
/// each crate's throughput at 1 MiB.
fn print_sha_extensions() {
    #[cfg(target_arch = "x86_64")]
    let flag = std::arch::is_x86_feature_detected!("sha");
    #[cfg(not(target_arch = "x86_64"))]
    let flag = false;
    let body = vec![0x5au8; 1 << 20];
    let rate = |f: &dyn Fn(&[u8])| {
        for _ in 0..16 {
            f(black_box(&body));
        }
        let start = std::time::Instant::now();
        for _ in 0..64 {
            f(black_box(&body));
        }
        64.0 * body.len() as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    let sha2 = rate(&|b| {
        black_box(Sha256::digest(b));
    });
    let ring = rate(&|b| {
        black_box(ring::digest::digest(&ring::digest::SHA256, b));
    });
    println!(
        "SHA extensions on this CPU: {flag}; SHA-256 at 1 MiB: sha2 {sha2:.2} GB/s, ring {ring:.2} GB/s"
    );
}

fn all(c: &mut Criterion) {
    print_sha_extensions();
    keys(c);
    steps(c);
    verify_and_resign(c);
    hashes(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
