//! Where and as whom fencegate talks to the backend: the one description
//! that the client (`client.rs`), the embedded store served on a socket
//! (`embedded.rs`) and the server's start-up share. A leaf: it depends on
//! no other file of `upstream`.

use http::Uri;

/// Where and as whom fencegate talks to the backend.
#[derive(Clone)]
pub struct BackendTarget {
    pub endpoint: Uri,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Name the bucket in the Host header (`bucket.<endpoint host>`) instead
    /// of the path. fencegate still connects to the endpoint's address.
    pub virtual_host: bool,
}
