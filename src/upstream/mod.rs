//! The backend side: forwarding with re-signing, and the embedded store.

pub mod client;
pub mod embedded;
pub mod layout;
pub mod pool;
pub mod put_checks;
pub mod read_conditions;
