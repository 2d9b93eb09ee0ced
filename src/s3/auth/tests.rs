//! The unit tests of `s3::auth`.

use super::*;
use crate::s3::signing_key::{hmac, string_to_sign};
use crate::s3::sigv4::EMPTY_SHA256;

/// A table of one credential, allowed every bucket.
fn one_credential(key: &str, secret: &str) -> Credentials {
    Credentials::new(&[Credential {
        access_key_id: key.into(),
        secret_access_key: secret.into(),
        buckets: vec!["*".into()],
        bucket_admin: false,
    }])
}

// The GET Object example of the AWS SigV4 documentation for S3
// ("Example: GET Object" with a Range header).
#[test]
fn aws_documentation_get_object_example() {
    let creds = one_credential(
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    );
    let mut h = HeaderMap::new();
    h.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
    h.insert("range", "bytes=0-9".parse().unwrap());
    h.insert(
        "x-amz-content-sha256",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            .parse()
            .unwrap(),
    );
    h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
    h.insert("authorization", "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41".parse().unwrap());
    let head = Head {
        method: "GET",
        raw_path: "/test.txt",
        query: &[],
        headers: &h,
    };
    let now = parse_amz_date("20130524T000500Z").unwrap();
    let v = verify(&head, &creds, "us-east-1", now).unwrap();
    assert!(matches!(v.payload, Payload::Sha256(_)));

    // Too far from the server's clock.
    let later = parse_amz_date("20130524T001600Z").unwrap();
    assert!(matches!(
        verify(&head, &creds, "us-east-1", later),
        Err(S3Error::RequestTimeTooSkewed)
    ));

    // One changed signed header breaks it.
    let mut h2 = h.clone();
    h2.insert("range", "bytes=0-10".parse().unwrap());
    let head = Head {
        headers: &h2,
        ..head
    };
    assert!(matches!(
        verify(&head, &creds, "us-east-1", now),
        Err(S3Error::SignatureDoesNotMatch)
    ));
}

/// A GET of /b/k by access key `AK`, signed at `amz_date` with `secret`
/// (the verifier's own canonical request; the AWS example above checks
/// that form).
fn signed_get(secret: &str, amz_date: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("host", "127.0.0.1:9000".parse().unwrap());
    h.insert(X_AMZ_DATE, amz_date.parse().unwrap());
    h.insert(X_AMZ_CONTENT_SHA256, EMPTY_SHA256.parse().unwrap());
    let signed = ["host", "x-amz-content-sha256", "x-amz-date"];
    let head = Head {
        method: "GET",
        raw_path: "/b/k",
        query: &[],
        headers: &h,
    };
    let canonical = canonical_request(&head, &signed, false, Some(EMPTY_SHA256)).unwrap();
    let day = &amz_date[..8];
    let scope = format!("{day}/us-east-1/s3/aws4_request");
    let key = signing_key(secret, day, "us-east-1", "s3");
    let signature = hex::encode(hmac(
        &key,
        string_to_sign(amz_date, &scope, &canonical).as_bytes(),
    ));
    let authz = format!(
        "AWS4-HMAC-SHA256 Credential=AK/{scope},SignedHeaders={},Signature={signature}",
        signed.join(";")
    );
    h.insert(http::header::AUTHORIZATION, authz.parse().unwrap());
    h
}

fn verify_get(
    creds: &Credentials,
    headers: &HeaderMap,
    amz_date: &str,
) -> Result<Verified, S3Error> {
    let head = Head {
        method: "GET",
        raw_path: "/b/k",
        query: &[],
        headers,
    };
    verify(&head, creds, "us-east-1", parse_amz_date(amz_date).unwrap())
}

// The verifier remembers each credential's signing key for its scope
// (`Known`), and the signature it began for a second: a request of the
// next day must get its own key, one of the next second its own start,
// going back to the first ones too, and neither must make a wrong
// signature pass.
#[test]
fn remembered_signing_key_follows_the_scope() {
    let creds = one_credential("AK", "SK");
    let day1 = "20240101T235959Z";
    let day1_earlier = "20240101T235958Z";
    let day2 = "20240102T000001Z";
    for at in [day1, day1, day1_earlier, day2, day1] {
        verify_get(&creds, &signed_get("SK", at), at).unwrap_or_else(|e| panic!("{at}: {e:?}"));
    }
    assert!(matches!(
        verify_get(&creds, &signed_get("not-SK", day1), day1),
        Err(S3Error::SignatureDoesNotMatch)
    ));
}

/// A credential is a key and exactly four parts, the last
/// `aws4_request`; anything else is refused, whatever the parts hold.
#[test]
fn credentials_split_into_key_and_scope() {
    let ok = "AK/20240101/us-east-1/s3/aws4_request";
    assert_eq!(
        split_credential(ok),
        Some((
            "AK",
            "20240101/us-east-1/s3/aws4_request",
            ["20240101", "us-east-1", "s3"]
        ))
    );
    // Empty parts split as they are (the scope checks refuse them).
    assert_eq!(
        split_credential("//x//aws4_request"),
        Some(("", "/x//aws4_request", ["", "x", ""]))
    );
    for bad in [
        "",
        "AK",
        "AK/20240101/us-east-1/s3",
        "AK/20240101/us-east-1/s3/aws4_requesT",
        "AK/20240101/us-east-1/s3/aws4_request/",
        "AK/20240101/us-east-1/s3/aws4_request/more",
        "AK/20240101/us-east-1/aws4_request",
        "AK/20240101/us-east-1/s3/x/aws4_request",
    ] {
        assert_eq!(split_credential(bad), None, "{bad:?}");
    }
}

/// The signed headers and the `Authorization` parts split as `str::split`
/// splits them, empty parts and ends included.
#[test]
fn ascii_split_is_str_split() {
    for s in ["", ";", "a", "a;b", ";a;;b;", "host;x-amz-date", "é;ü;"] {
        let ours: Vec<&str> = super::split_ascii(s, b';').collect();
        assert_eq!(ours, s.split(';').collect::<Vec<_>>(), "{s:?}");
        assert_eq!(super::signed_names(s), ours, "{s:?}");
    }
}
