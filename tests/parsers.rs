//! Property tests of every parser that takes client bytes: the token and
//! its carriers, request paths and keys, copy sources, DeleteObjects XML,
//! the query string, the SigV4 `Authorization` header, and aws-chunked
//! bodies. On arbitrary input none may panic or grow without bound; where a
//! parser has an inverse (what fencegate forwards), reading it back must
//! give exactly what was read.

use bytes::Bytes;
use fencegate::config::Credential;
use fencegate::fence::token::{self, Carriers};
use fencegate::s3::auth::{self, Credentials, PATH, STRICT};
use fencegate::s3::chunked::{self, ChunkedSpec};
use fencegate::s3::multi_delete::{Delete, ToDelete};
use fencegate::s3::names::{self, CopySource};
use futures_util::StreamExt;
use percent_encoding::utf8_percent_encode;
use proptest::prelude::*;
use std::time::SystemTime;

/// Keys fencegate accepts: segments of printable characters (including
/// `%`, `+`, `?`, `\`, `&`, unicode), optionally a trailing `/`.
fn good_key() -> impl Strategy<Value = String> {
    let seg = "[a-zA-Z0-9 %+?&#\\\\=~!é世._-]{1,12}"
        .prop_filter("a name", |s| s != "." && s != ".." && s.trim() == s);
    (prop::collection::vec(seg, 1..4), any::<bool>()).prop_map(|(segs, folder)| {
        let mut k = segs.join("/");
        if folder {
            k.push('/');
        }
        k
    })
}

fn good_bucket() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9.-]{1,20}".prop_filter("a name", |b| b != "." && b != "..")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn tokens_round_trip(n in any::<u64>(), zeros in 0usize..5) {
        prop_assert_eq!(token::parse(&n.to_string()), Ok(n));
        prop_assert_eq!(token::parse(&format!("{}{n}", "0".repeat(zeros))), Ok(n));
    }

    #[test]
    fn token_parse_takes_digits_only(s in "\\PC{0,30}") {
        if token::parse(&s).is_ok() {
            prop_assert!(!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
        }
    }

    #[test]
    fn carriers_never_panic(h in "[ -~]{0,30}", m in "[ -~]{0,30}", q in "\\PC{0,30}") {
        let c = Carriers {
            header: http::HeaderName::from_static("x-fencing-token"),
            meta_header: http::HeaderName::from_static("x-amz-meta-fencing-token"),
            query: "x-fencing-token".into(),
        };
        let mut headers = http::HeaderMap::new();
        if let Ok(v) = h.parse() { headers.insert("x-fencing-token", v); }
        if let Ok(v) = m.parse() { headers.insert("x-amz-meta-fencing-token", v); }
        let query = vec![("x-fencing-token".into(), q.into())];
        let _ = c.extract(&headers, &query);
    }

    /// What fencegate forwards for a path it accepted reads back the same.
    #[test]
    fn accepted_paths_round_trip(path in "/[a-z0-9./%2EeFf5Cc -]{0,40}") {
        if let Ok((Some(b), key)) = names::split_path(&path) {
            let mut forwarded = format!("/{}", utf8_percent_encode(&b, STRICT));
            if let Some(k) = &key {
                prop_assert!(names::check_key(k).is_ok());
                forwarded.push('/');
                forwarded.push_str(&utf8_percent_encode(k, PATH).to_string());
            }
            prop_assert_eq!(names::split_path(&forwarded).unwrap(), (Some(b), key));
        }
    }

    #[test]
    fn good_keys_are_accepted_and_round_trip(b in good_bucket(), k in good_key()) {
        prop_assert!(names::check_key(&k).is_ok(), "{:?}", k);
        let path = format!("/{b}/{}", utf8_percent_encode(&k, PATH));
        prop_assert_eq!(names::split_path(&path).unwrap(), (Some(b), Some(k)));
    }

    #[test]
    fn copy_sources_round_trip(b in good_bucket(), k in good_key(), v in proptest::option::of("[ -~]{1,10}")) {
        let src = CopySource { bucket: b, key: k, version_id: v };
        prop_assert_eq!(CopySource::parse(src.to_header().as_bytes()).unwrap(), src);
    }

    #[test]
    fn copy_source_parse_never_panics(raw in prop::collection::vec(any::<u8>(), 0..60)) {
        if let Ok(src) = CopySource::parse(&raw) {
            prop_assert!(names::check_key(&src.key).is_ok());
        }
    }

    #[test]
    fn delete_bodies_round_trip(
        keys in prop::collection::vec((good_key(), proptest::option::of("[ -~]{1,8}")), 1..20),
        quiet in any::<bool>(),
    ) {
        let d = Delete {
            quiet,
            objects: keys.into_iter().map(|(key, version_id)| ToDelete {
                key,
                version_id: version_id.filter(|v| v.trim() == v),
                conditions: None,
            }).collect(),
        };
        prop_assert_eq!(Delete::parse(d.to_xml().as_bytes()).unwrap(), d);
    }

    #[test]
    fn delete_parse_never_panics(raw in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Delete::parse(&raw);
    }

    #[test]
    fn delete_parse_takes_any_markup_without_panic(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<Delete>", "</Delete>", "<Object>", "</Object>", "<Key>", "</Key>",
            "<![CDATA[x]]>", "<!-- c -->", "&amp;", "&#65;", "&x;", "k", " ",
            "<VersionId>", "</VersionId>", "<Quiet>true</Quiet>", "<?pi?>",
        ]), 0..30),
    ) {
        let xml: String = parts.concat();
        if let Ok(d) = Delete::parse(xml.as_bytes()) {
            // Whatever was read is what is forwarded, and reads back alike.
            prop_assert_eq!(Delete::parse(d.to_xml().as_bytes()).unwrap(), d);
        }
    }

    #[test]
    fn query_decoding_never_panics(q in "\\PC{0,60}") {
        let pairs = auth::decode_query(Some(&q));
        let _ = auth::canonical_query(&pairs, None);
    }

    // The one percent-decoder (paths, keys, query parts) reads exactly
    // what the percent-encoding crate does, bad and partial escapes too.
    #[test]
    fn the_percent_decoder_matches_the_percent_encoding_crate(
        s in "([a-zA-Z0-9%/+ ~._-]|\\PC|%[0-9a-fA-F]{2}|%[0-9a-fA-F]|%[gG%]){0,40}",
    ) {
        let expected: Vec<u8> = percent_encoding::percent_decode_str(&s).collect();
        let decoded = fencegate::s3::query::percent_decode(&s);
        prop_assert_eq!(decoded.as_ref(), expected.as_slice());
    }

    // The hand-written query decoder and canonical encoders (written for
    // speed: docs/benchmarks-log.md, "CPU per request") read and write exactly what
    // the percent-encoding crate does, so that a signature means the same
    // before and after them.
    #[test]
    fn query_and_canonical_forms_match_the_percent_encoding_crate(
        q in "([a-zA-Z0-9%=&/+ ~._-]|\\PC|%[0-9a-fA-F]{2}|%[gG%]){0,40}",
        path in "(/|[a-zA-Z0-9%+ ~._-]|\\PC|%[0-9a-fA-F]{2}){0,30}",
    ) {
        use percent_encoding::{percent_decode_str, utf8_percent_encode};
        let dec = |s: &str| String::from_utf8_lossy(&percent_decode_str(s).collect::<Vec<u8>>()).into_owned();
        let expected: Vec<(String, String)> = q
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (dec(k), dec(v))
            })
            .collect();
        let pairs = auth::decode_query(Some(&q));
        let decoded: Vec<(String, String)> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        prop_assert_eq!(&decoded, &expected);
        let mut enc: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (utf8_percent_encode(k, auth::STRICT).to_string(), utf8_percent_encode(v, auth::STRICT).to_string()))
            .collect();
        enc.sort();
        let joined: Vec<String> = enc.iter().map(|(k, v)| format!("{k}={v}")).collect();
        prop_assert_eq!(auth::canonical_query(&pairs, None), joined.join("&"));
        let uri = utf8_percent_encode(&dec(&path), auth::PATH).to_string();
        let uri = if uri.is_empty() { "/".to_string() } else { uri };
        prop_assert_eq!(fencegate::s3::sigv4::canonical_uri(&path), uri);
    }

    #[test]
    fn sigv4_header_parsing_never_panics(value in "[ -~]{0,200}", date in "[0-9TZ]{0,20}") {
        let creds = Credentials::new(&[Credential {
            access_key_id: "AKID".into(),
            secret_access_key: "secret".into(),
            buckets: vec!["*".into()],
            bucket_admin: false,
        }]);
        let mut h = http::HeaderMap::new();
        if let Ok(v) = value.parse() { h.insert("authorization", v); }
        if let Ok(v) = date.parse() { h.insert("x-amz-date", v); }
        h.insert("host", "h".parse().unwrap());
        let head = auth::Head { method: "GET", raw_path: "/b/k", query: &[], headers: &h };
        prop_assert!(auth::verify(&head, &creds, "us-east-1", SystemTime::now()).is_err());
    }

    #[test]
    fn chunked_decoding_never_panics_or_outgrows_its_input(
        raw in prop::collection::vec(any::<u8>(), 0..300),
        step in 1usize..50,
        declared in 0u64..1000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let out = rt.block_on(async {
            let pieces: Vec<Result<Bytes, _>> =
                raw.chunks(step).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            let spec = ChunkedSpec {
                signing: None,
                trailers: vec!["x-amz-checksum-crc32".into()],
                has_trailer: true,
                decoded_len: declared,
            };
            let frames: Vec<_> = chunked::decode(Box::pin(futures_util::stream::iter(pieces)), spec)
                .collect()
                .await;
            frames
                .into_iter()
                .filter_map(|f| f.ok()?.into_data().ok())
                .map(|d| d.len())
                .sum::<usize>()
        });
        prop_assert!(out <= raw.len());
    }
}
