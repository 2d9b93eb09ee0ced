//! The backend side: forwarding with re-signing, the embedded store, and
//! the probe of whether the backend honours conditional writes.

pub mod client;
pub mod embedded;
pub mod plain_read;
pub mod pool;
pub mod probe;
pub mod target;
