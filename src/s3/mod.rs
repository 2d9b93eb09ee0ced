//! The S3 front: request classification, SigV4 verification, bodies
//! (payload hashes, aws-chunked) and S3 XML errors.

pub mod auth;
pub mod body;
pub mod bucket_config;
pub mod chunked;
pub mod conditions;
pub mod error;
pub mod headers;
pub mod multi_delete;
pub mod names;
pub mod op;
pub mod query;
pub mod range;
pub mod session;
pub mod sign;
pub mod signing_key;
pub mod sigv4;
pub mod xml;
