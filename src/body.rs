//! The body type every response fencegate sends has, in a leaf module of its
//! own so that the S3 side (`proxy`), the admin listener and the server's
//! connection-limit answer share it without importing each other.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// The error a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: streamed from the backend, or whole.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A whole body from bytes.
pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}
