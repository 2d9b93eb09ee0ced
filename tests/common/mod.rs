//! Shared helpers for the integration tests: the fencegate process, a
//! controllable test backend, a hand-driven SigV4 client, and an SDK client.
#![allow(dead_code)]

pub mod backend;
pub mod fencegate;
pub mod raw;

use aws_sdk_s3::config::{Credentials, Region};

/// An aws-sdk-s3 client for `endpoint` with the demo credential.
pub fn sdk(endpoint: &str) -> aws_sdk_s3::Client {
    sdk_as(endpoint, fencegate::DEMO_KEY, fencegate::DEMO_SECRET)
}

pub fn sdk_as(endpoint: &str, key: &str, secret: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "test"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}
