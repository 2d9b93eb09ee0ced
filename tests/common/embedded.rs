//! fencegate on a fresh embedded store with bucket `demo` unfenced, and the
//! SDK calls the store's tests make of it: what is tested there is the
//! store's answer, not the fence.

use super::fencegate::{Backend, Fencegate};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;

pub const UNFENCED: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n";

/// fencegate on a fresh embedded store, and a client with bucket `demo`.
pub async fn store() -> (Fencegate, aws_sdk_s3::Client) {
    let fg = Fencegate::start(Backend::Embedded, UNFENCED);
    let c = super::sdk(&fg.endpoint());
    super::ensure_bucket(&c, "demo").await;
    (fg, c)
}

pub async fn put(
    c: &aws_sdk_s3::Client,
    key: &str,
    body: &'static [u8],
) -> Result<(), (u16, String)> {
    let r = c
        .put_object()
        .bucket("demo")
        .key(key)
        .body(ByteStream::from_static(body))
        .send()
        .await;
    outcome(r)
}

/// Ok, or the status and the error code of a refused request.
pub fn outcome<T, E: ProvideErrorMetadata>(
    r: Result<T, aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>>,
) -> Result<(), (u16, String)> {
    r.map(|_| ()).map_err(|e| refusal(&e))
}

/// The status and the error code of a refused request.
pub fn refusal<E: ProvideErrorMetadata>(
    e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> (u16, String) {
    let status = e.raw_response().map_or(0, |r| r.status().as_u16());
    (status, e.code().unwrap_or_default().to_string())
}

pub async fn get(c: &aws_sdk_s3::Client, key: &str) -> Result<Vec<u8>, (u16, String)> {
    match c.get_object().bucket("demo").key(key).send().await {
        Ok(o) => Ok(o.body.collect().await.unwrap().into_bytes().to_vec()),
        Err(e) => Err(refusal(&e)),
    }
}
