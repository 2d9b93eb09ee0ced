//! fencegate: a fencing-token enforcing reverse proxy for S3-compatible
//! object storage. See README.md and CONTRACT.md for what it guarantees.

pub mod admin;
pub mod body;
pub mod bench;
pub mod cli;
pub mod config;
pub mod fence;
pub mod locks;
pub mod metric_names;
pub mod proxy;
pub mod s3;
pub mod server;
pub mod tls;
pub mod upstream;
