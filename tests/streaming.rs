//! Bodies stream: a 1 GiB PUT in each of the five payload forms keeps
//! fencegate's peak resident memory under 64 MiB, and every byte reaches
//! the backend.

mod common;

use common::backend::TestBackend;
use common::fencegate::Fencegate;
use common::raw::{Form, RawClient, RawRequest, Source};

const GIB: u64 = 1 << 30;
const RSS_LIMIT_KIB: u64 = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_puts_stream_in_bounded_memory() {
    let be = TestBackend::start_discarding().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let mut expected = 0;
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
        let mut req = RawRequest::new(http::Method::PUT, &format!("/demo/big{i}")).token(1);
        req.form = form;
        req.body = Some(Source::pattern(GIB, form == Form::Sha256));
        let r = raw.send(req).await.unwrap();
        assert_eq!(r.status, 200, "{form:?}: {}", r.body);
        // A body with checksum trailers goes on re-chunked (aws-chunked,
        // unsigned, the trailer at its end): the backend reads its framing
        // too, a few bytes per chunk.
        let framing = match form {
            Form::Chunked { trailer: true } | Form::UnsignedTrailer => GIB / 1000,
            _ => 0,
        };
        let got = be.bytes_received() - expected;
        assert!(
            (GIB..=GIB + framing).contains(&got),
            "{form:?}: {got} bytes"
        );
        expected += got;
        let peak = fg.peak_rss_kib();
        eprintln!(
            "after 1 GiB {form:?}: fencegate peak RSS {} MiB",
            peak / 1024
        );
        assert!(peak < RSS_LIMIT_KIB, "{form:?}: peak RSS {peak} KiB");
    }
}
