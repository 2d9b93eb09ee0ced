//! Ranged GET and HEAD as S3 answers them (CONTRACT §9), one table on
//! every path a read can take: the embedded store alone (as `fencegate
//! bench store` serves it), fencegate on its embedded default,
//! fencegate on moto's server, the reference that answers as AWS does,
//! and fencegate on Garage, whose own answers differ in two places that
//! fencegate passes on as they are (docs/embedded-store.md): a ranged HEAD
//! is `200` without `Content-Range`, and a suffix range of an empty object
//! is `206` with `bytes 0-18446744073709551615/0`.
//!
//! - a satisfiable range is `206` with `Content-Range`, also when it
//!   covers the whole object or runs past its end (object_store, and with
//!   it delta-rs and SlateDB, refuse a `200` to a ranged read);
//! - a range that starts at or after the end is `416`, and the embedded
//!   store says `Content-Range: bytes */SIZE`;
//! - a suffix range of an empty object is `200` and no bytes;
//! - a malformed `Range`, or several ranges, is ignored: `200` and the
//!   whole object. The store alone refuses one with `400` (s3s reads the
//!   header before the store does); fencegate forwards only a range it
//!   read, so through it every backend ignores one, as AWS does;
//! - `partNumber` reads are ranges too: part 1 of an object uploaded whole
//!   is `206` with all of it.

mod common;

use common::fencegate::{Backend, DEMO_KEY, DEMO_SECRET, Fencegate};
use common::raw::{RawClient, RawRequest};
use http::Method;

const UNFENCED: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n";
const SIZE: u64 = 3893;

/// What a read should get: the status, and for a `206` the bytes
/// `first..end` with their `Content-Range`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Whole,
    Part(u64, u64),
    Unsatisfiable,
    /// Ignored through fencegate; `400` from the store alone.
    Malformed,
}

/// (key, Range header, what S3 answers).
const TABLE: &[(&str, &str, Want)] = &[
    ("o", "bytes=0-9", Want::Part(0, 10)),
    ("o", "bytes=-8", Want::Part(SIZE - 8, SIZE)),
    ("o", "bytes=0-3892", Want::Part(0, SIZE)),
    ("o", "bytes=0-999999", Want::Part(0, SIZE)),
    ("o", "bytes=0-", Want::Part(0, SIZE)),
    ("o", "bytes=-99999", Want::Part(0, SIZE)),
    ("o", "bytes=3892-", Want::Part(SIZE - 1, SIZE)),
    ("o", "bytes=3892-3892", Want::Part(SIZE - 1, SIZE)),
    ("o", "bytes=0-0", Want::Part(0, 1)),
    ("o", "bytes=3893-", Want::Unsatisfiable),
    ("o", "bytes=3893-4000", Want::Unsatisfiable),
    ("o", "bytes=-0", Want::Unsatisfiable),
    ("o", "bytes=5-3", Want::Malformed),
    ("o", "bytes=0-1,3-4", Want::Malformed),
    ("o", "invalid", Want::Malformed),
    ("o", "bytes=invalid-range", Want::Malformed),
    ("o", "bytes=-", Want::Whole),
    ("empty", "bytes=0-", Want::Unsatisfiable),
    ("empty", "bytes=0-0", Want::Unsatisfiable),
    ("empty", "bytes=-1", Want::Whole),
];

fn body() -> Vec<u8> {
    // Printable, so that the raw client's text body compares byte for byte.
    (0..SIZE).map(|i| b'!' + (i * 7 % 89) as u8).collect()
}

/// Where the reads go, and with which credential.
struct Path {
    name: &'static str,
    client: RawClient,
    key: String,
    secret: String,
    /// The store alone: s3s refuses a malformed `Range` and reads
    /// `bytes=-` as an empty suffix.
    alone: bool,
    /// Whether a `416` must carry `Content-Range: bytes */SIZE` (the
    /// embedded store's; moto sends none).
    range_on_416: bool,
    /// Garage: its HEAD and its empty-object suffix are its own (above).
    garage: bool,
}

impl Path {
    async fn send(&self, mut req: RawRequest) -> common::raw::RawResponse {
        req.key = self.key.clone();
        req.secret = self.secret.clone();
        self.client.send(req).await.unwrap()
    }

    async fn fill(&self) {
        let put = |k: &str, b: Vec<u8>| RawRequest::put(&format!("/demo/{k}"), b);
        let made = self.send(RawRequest::new(Method::PUT, "/demo")).await;
        let owned = made.code() == Some("BucketAlreadyOwnedByYou");
        assert!(made.status / 100 == 2 || owned, "{made:?}");
        assert_eq!(self.send(put("o", body())).await.status, 200);
        assert_eq!(self.send(put("empty", vec![])).await.status, 200);
    }

    async fn check(&self, method: Method, key: &str, range: Option<&str>, want: Want) {
        let mut req = RawRequest::new(method.clone(), &format!("/demo/{key}"));
        if let Some(r) = range {
            req = req.header("range", r);
        }
        let r = self.send(req).await;
        let what = format!("{}: {method} {key} {range:?}", self.name);
        if self.garage && (method == Method::HEAD || (key == "empty" && range == Some("bytes=-1")))
        {
            return;
        }
        let size = if key == "o" { SIZE } else { 0 };
        let want = match want {
            Want::Malformed if self.alone => {
                assert_eq!(r.status, 400, "{what}");
                return;
            }
            Want::Whole if self.alone && range == Some("bytes=-") => Want::Unsatisfiable,
            Want::Malformed => Want::Whole,
            w => w,
        };
        let content_range = r.headers.get("content-range").map(|v| v.to_str().unwrap());
        let length: u64 = r.headers["content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let head = method == Method::HEAD;
        match want {
            Want::Whole => {
                assert_eq!((r.status, content_range), (200, None), "{what}");
                assert_eq!(length, size, "{what}");
                if !head {
                    assert_eq!(r.body.len() as u64, size, "{what}");
                }
            }
            Want::Part(first, end) => {
                let cr = format!("bytes {first}-{}/{size}", end - 1);
                assert_eq!(
                    (r.status, content_range),
                    (206, Some(cr.as_str())),
                    "{what}"
                );
                assert_eq!(length, end - first, "{what}");
                if !head {
                    let want = &body()[first as usize..end as usize];
                    assert_eq!(r.body.as_bytes(), want, "{what}");
                }
            }
            Want::Unsatisfiable => {
                assert_eq!(r.status, 416, "{what}");
                if self.range_on_416 {
                    let cr = format!("bytes */{size}");
                    assert_eq!(content_range, Some(cr.as_str()), "{what}");
                }
                if !head {
                    assert_eq!(r.code(), Some("InvalidRange"), "{what}");
                }
            }
            Want::Malformed => unreachable!(),
        }
    }

    /// The whole table, GET and HEAD, and the part reads.
    async fn table(&self) {
        self.fill().await;
        for (key, range, want) in TABLE {
            for m in [Method::GET, Method::HEAD] {
                self.check(m, key, Some(range), *want).await;
            }
        }
        for m in [Method::GET, Method::HEAD] {
            self.check(m.clone(), "o", None, Want::Whole).await;
            self.check(m, "empty", None, Want::Whole).await;
        }
        let part = |n: u32| {
            let mut r = RawRequest::new(Method::GET, "/demo/o");
            r.query = format!("partNumber={n}");
            r
        };
        let one = self.send(part(1)).await;
        let cr = one
            .headers
            .get("content-range")
            .map(|v| v.to_str().unwrap());
        let whole = format!("bytes 0-{}/{SIZE}", SIZE - 1);
        assert_eq!(
            (one.status, cr),
            (206, Some(whole.as_str())),
            "{}: part 1",
            self.name
        );
    }
}

fn through(fg: &Fencegate, name: &'static str, range_on_416: bool) -> Path {
    Path {
        name,
        client: RawClient::new(&fg.endpoint()),
        key: DEMO_KEY.into(),
        secret: DEMO_SECRET.into(),
        alone: false,
        range_on_416,
        garage: false,
    }
}

#[tokio::test]
async fn the_embedded_store_alone_answers_ranges_as_s3_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = fencegate::store::Store::open(dir.path(), None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (key, secret) = ("STOREKEY".to_string(), "store-secret".to_string());
    tokio::spawn(fencegate::upstream::embedded::serve(
        listener,
        store,
        key.clone(),
        secret.clone(),
    ));
    let path = Path {
        name: "the store alone",
        client: RawClient::new(&format!("http://{addr}")),
        key,
        secret,
        alone: true,
        range_on_416: true,
        garage: false,
    };
    path.table().await;
}

#[tokio::test]
async fn fencegate_on_its_embedded_store_answers_ranges_as_s3_does() {
    let fg = Fencegate::start(Backend::Embedded, UNFENCED);
    through(&fg, "fencegate on the embedded store", true)
        .table()
        .await;
}

/// moto answers as AWS does: the same table through fencegate shows that
/// the table is S3's, and that fencegate's reading of `Range` makes moto
/// (which answers `invalid` with a 500 on its own) ignore a malformed one.
#[tokio::test]
async fn fencegate_on_moto_answers_ranges_as_s3_does() {
    let moto = common::moto::Moto::start();
    let fg = Fencegate::start(moto.backend(), UNFENCED);
    through(&fg, "fencegate on moto", false).table().await;
}

/// Garage answers a malformed `Range` with `416` on its own; through
/// fencegate it is ignored, as AWS does.
#[tokio::test]
async fn fencegate_on_garage_answers_ranged_gets_as_s3_does() {
    let garage = common::garage::Garage::start();
    let fg = Fencegate::start(garage.backend(), UNFENCED);
    let path = Path {
        garage: true,
        ..through(&fg, "fencegate on Garage", true)
    };
    path.table().await;
}
