//! SigV4 at the front door: bad signatures, keys, clocks and damaged
//! aws-chunked bodies are refused and nothing lands; every payload form and
//! the SDK's default (checksum trailer) upload work.

mod common;

on_both_stores!(sdk_uploads_with_checksums_work);

use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use common::backend::{Event, TestBackend, saw_key};
use common::fencegate::{Fencegate, LIMITED_KEY, LIMITED_SECRET};
use common::raw::{Damage, Form, RawClient, RawRequest, Source};
use std::time::{Duration, SystemTime};

fn landed(be: &TestBackend, key: &str) -> bool {
    be.events()
        .iter()
        .any(|e| matches!(e, Event::BodyComplete { key: k, .. } if k == key))
}

#[tokio::test]
async fn bad_signatures_get_403_and_reach_nothing() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());

    let mut wrong_secret = RawRequest::put("/demo/a", "x").token(1);
    wrong_secret.secret = "not-the-secret".into();
    let r = raw.send(wrong_secret).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("SignatureDoesNotMatch")));

    // One digit off, in either form: the whole signature is compared.
    for presigned in [false, true] {
        let mut one_digit = RawRequest::put("/demo/a", "x").token(1);
        one_digit.last_signature_digit_changed = true;
        if presigned {
            one_digit.presign = Some(Duration::from_secs(300));
        }
        let r = raw.send(one_digit).await.unwrap();
        let what = if presigned { "presigned" } else { "header" };
        assert_eq!(
            (r.status, r.code()),
            (403, Some("SignatureDoesNotMatch")),
            "{what}"
        );
    }

    let mut unknown = RawRequest::put("/demo/a", "x").token(1);
    unknown.key = "nobody".into();
    let r = raw.send(unknown).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("InvalidAccessKeyId")));

    let mut tampered = RawRequest::put("/demo/a", "x")
        .token(1)
        .header("x-amz-meta-owner", "alice");
    tampered.after_signing = vec![("x-amz-meta-owner".into(), "mallory".into())];
    let r = raw.send(tampered).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("SignatureDoesNotMatch")));

    let mut skewed = RawRequest::put("/demo/a", "x").token(1);
    skewed.time = SystemTime::now() - Duration::from_secs(20 * 60);
    let r = raw.send(skewed).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("RequestTimeTooSkewed")));

    let mut unsigned_amz = RawRequest::put("/demo/a", "x").token(1);
    unsigned_amz.after_signing = vec![("x-amz-meta-sneaky".into(), "1".into())];
    assert_eq!(raw.send(unsigned_amz).await.unwrap().status, 403);

    limited_credential_is_denied(&raw).await;

    let mut garbled = RawRequest::new(http::Method::GET, "/demo/a");
    garbled.after_signing = vec![("authorization".into(), "Basic eDp5".into())];
    let r = raw.send(garbled).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("AuthorizationHeaderMalformed"))
    );

    assert!(!saw_key(&be.events(), "demo/a"), "{:?}", be.events());
    assert!(be.events().is_empty(), "{:?}", be.events());
    // And no fence was raised by any of them.
    assert_eq!(
        raw.send(RawRequest::put("/demo/a", "x").token(0))
            .await
            .unwrap()
            .status,
        200
    );
}

/// A credential limited to bucket "shared" cannot touch "demo", nor create
/// a bucket (it is no bucket admin).
async fn limited_credential_is_denied(raw: &RawClient) {
    let mut limited = RawRequest::put("/demo/a", "x").token(1);
    limited.key = LIMITED_KEY.into();
    limited.secret = LIMITED_SECRET.into();
    let r = raw.send(limited).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("AccessDenied")));
    let mut limited_admin = RawRequest::new(http::Method::PUT, "/shared");
    limited_admin.key = LIMITED_KEY.into();
    limited_admin.secret = LIMITED_SECRET.into();
    let r = raw.send(limited_admin).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (403, Some("AccessDenied")),
        "not a bucket admin"
    );
}

#[tokio::test]
async fn every_payload_form_works_and_lands_intact() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    for (i, form) in [
        Form::Unsigned,
        Form::Sha256,
        Form::Chunked { trailer: false },
        Form::Chunked { trailer: true },
        Form::UnsignedTrailer,
    ]
    .into_iter()
    .enumerate()
    {
        let mut req = RawRequest::new(http::Method::PUT, &format!("/demo/form{i}")).token(1);
        req.form = form;
        req.body = Some(Source::bytes(data.clone()));
        let r = raw.send(req).await.unwrap();
        assert_eq!(r.status, 200, "{form:?}: {}", r.body);
        let stored = be.object("demo", &format!("form{i}")).unwrap();
        if matches!(
            form,
            Form::Chunked { trailer: true } | Form::UnsignedTrailer
        ) {
            // Forwarded as unsigned aws-chunked with the checksum trailer.
            let text = String::from_utf8_lossy(&stored);
            assert!(
                text.contains("x-amz-checksum-sha256:"),
                "trailer not forwarded"
            );
        } else {
            assert_eq!(stored, Bytes::from(data.clone()), "{form:?}");
        }
    }
}

#[tokio::test]
async fn damaged_bodies_are_refused_and_nothing_lands() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let data = vec![b'z'; 300_000];
    for (name, form, damage) in damaged_uploads() {
        let key = format!("demo/{name}");
        let mut req = RawRequest::new(http::Method::PUT, &format!("/{key}")).token(1);
        req.form = form;
        req.body = Some(Source::bytes(data.clone()));
        req.damage = damage;
        match raw.send(req).await {
            Ok(r) => assert!(
                (400..500).contains(&r.status),
                "{name}: {} {}",
                r.status,
                r.body
            ),
            Err(e) => assert!(damage.cut_at.is_some(), "{name}: {e}"),
        }
        // The proxy may still be tearing the upstream request down.
        be.wait_for(&format!("{name} ended upstream"), |ev| {
            !saw_key(ev, &key)
                || ev
                    .iter()
                    .any(|e| matches!(e, Event::BodyAborted { key: k, .. } if *k == key))
        })
        .await;
        assert!(!landed(&be, &key), "{name} landed: {:?}", be.events());
        assert!(be.object("demo", name).is_none());
    }
}

/// The damaged uploads: a name, the payload form, and where the body is
/// flipped or cut.
fn damaged_uploads() -> [(&'static str, Form, Damage); 7] {
    [
        (
            "flip-chunked",
            Form::Chunked { trailer: false },
            Damage {
                flip_at: Some(150_000),
                cut_at: None,
            },
        ),
        (
            "flip-last-chunk",
            Form::Chunked { trailer: false },
            Damage {
                flip_at: Some(299_990),
                cut_at: None,
            },
        ),
        // 300 000 bytes in 64 KiB signed chunks end at byte 300 533; the
        // checksum trailer line follows.
        (
            "flip-trailer",
            Form::Chunked { trailer: true },
            Damage {
                flip_at: Some(300_560),
                cut_at: None,
            },
        ),
        (
            "cut-chunked",
            Form::Chunked { trailer: false },
            Damage {
                flip_at: None,
                cut_at: Some(200_000),
            },
        ),
        (
            "flip-sha",
            Form::Sha256,
            Damage {
                flip_at: Some(299_999),
                cut_at: None,
            },
        ),
        (
            "cut-sha",
            Form::Sha256,
            Damage {
                flip_at: None,
                cut_at: Some(100_000),
            },
        ),
        (
            "cut-unsigned",
            Form::Unsigned,
            Damage {
                flip_at: None,
                cut_at: Some(100_000),
            },
        ),
    ]
}

async fn sdk_uploads_with_checksums_work(store: common::Store) {
    let run = store.start("");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    in_memory_upload_round_trips(&c, &body).await;
    // Over plain HTTP the SDK signs an in-memory payload and sends its CRC32
    // as a header; for a streamed file with payload signing off (its HTTPS
    // default) it sends aws-chunked with a CRC32 trailer, which fencegate
    // re-encodes and s3s-fs verifies.
    let file = run.fg.dir.path().join("upload.bin");
    std::fs::write(&file, &body).unwrap();
    unsigned_file_upload_keeps_its_trailer_checksum(&c, &file, &body).await;
    // The plain default for a file body, too.
    c.put_object()
        .bucket("demo")
        .key("sdk-file")
        .metadata("fencing-token", "3")
        .body(ByteStream::from_path(&file).await.unwrap())
        .send()
        .await
        .unwrap();
    the_logs_name_each_payload_form(&run.fg.logs());
    let stale = c
        .put_object()
        .bucket("demo")
        .key("sdk")
        .metadata("fencing-token", "2")
        .body(ByteStream::from(b"x".to_vec()))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&stale),
        Some("StaleFencingToken")
    );
}

/// Uploads `body` from memory as "sdk" (token 3) and reads it back whole.
async fn in_memory_upload_round_trips(c: &aws_sdk_s3::Client, body: &[u8]) {
    let out = c
        .put_object()
        .bucket("demo")
        .key("sdk")
        .metadata("fencing-token", "3")
        .body(ByteStream::from(body.to_vec()))
        .send()
        .await
        .unwrap();
    assert!(out.checksum_crc32().is_some() || out.e_tag().is_some());
    let got = c
        .get_object()
        .bucket("demo")
        .key("sdk")
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().to_vec(),
        body
    );
}

/// Uploads `file` as "sdk-trailer" with payload signing off, then reads it
/// back with its stored CRC32 checksum.
async fn unsigned_file_upload_keeps_its_trailer_checksum(
    c: &aws_sdk_s3::Client,
    file: &std::path::Path,
    body: &[u8],
) {
    c.put_object()
        .bucket("demo")
        .key("sdk-trailer")
        .metadata("fencing-token", "3")
        .body(ByteStream::from_path(file).await.unwrap())
        .customize()
        .disable_payload_signing()
        .send()
        .await
        .unwrap();
    let got = c
        .get_object()
        .bucket("demo")
        .key("sdk-trailer")
        .checksum_mode(aws_sdk_s3::types::ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert!(
        got.checksum_crc32().is_some(),
        "the trailer checksum was not stored"
    );
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().to_vec(),
        body
    );
}

/// The request log names each upload's payload form: sha256 in memory,
/// chunked with a trailer for the unsigned file.
fn the_logs_name_each_payload_form(logs: &str) {
    let form_of = |key: &str| {
        logs.lines()
            .find(|l| l.contains("op=\"PutObject\"") && l.contains(&format!("key=\"{key}\"")))
            .and_then(|l| l.split("payload=\"").nth(1))
            .and_then(|r| r.split('"').next())
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert_eq!(form_of("sdk"), "sha256", "{logs}");
    let streamed = form_of("sdk-trailer");
    assert!(
        streamed.starts_with("chunked-") && streamed.ends_with("-trailer"),
        "{streamed}"
    );
    eprintln!(
        "SDK forms: in-memory {}, file {}, file unsigned {streamed}",
        form_of("sdk"),
        form_of("sdk-file")
    );
}

#[tokio::test]
async fn a_limited_credential_lists_only_its_buckets() {
    let fg = Fencegate::start(common::fencegate::Backend::Embedded, "");
    let admin = common::sdk(&fg.endpoint());
    for b in ["demo", "shared"] {
        admin.create_bucket().bucket(b).send().await.unwrap();
    }
    let limited = common::sdk_as(&fg.endpoint(), LIMITED_KEY, LIMITED_SECRET);
    let names: Vec<String> = limited
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_string))
        .collect();
    assert_eq!(names, vec!["shared".to_string()]);
    let all = admin.list_buckets().send().await.unwrap();
    assert_eq!(all.buckets().len(), 2);
    let e = limited
        .list_objects_v2()
        .bucket("demo")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("AccessDenied")
    );
}
