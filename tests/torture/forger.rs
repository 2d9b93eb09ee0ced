//! A writer with valid S3 credentials and made-up tokens (issue #57):
//! beside the lock holders, it writes to the fenced arm's resources with
//! tokens their locks never gave their holders: 2^64-1, one above etcd's
//! revision, and the token another lock's holder has (from the history).
//! With `[[eager]] verify = true` on those resources, none may be
//! acknowledged, and no fence may rise above what etcd ever issued.

use super::history::History;
use super::workload::Resource;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What the forger sent and what came back.
#[derive(Default, Debug)]
pub struct Forged {
    pub sent: u64,
    /// Answered 2xx: a made-up token that went through.
    pub acknowledged: Vec<String>,
    /// By status.
    pub answers: std::collections::BTreeMap<u16, u64>,
}

/// Sends a made-up-token PUT every 50-150 ms until `stop`.
pub async fn forge(
    s3: aws_sdk_s3::Client,
    bucket: String,
    etcd: String,
    resources: Vec<Resource>,
    hist: Arc<History>,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) -> Forged {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0f0f_6e76);
    let mut done = Forged::default();
    let mut client = etcd_client::Client::connect([etcd.as_str()], None)
        .await
        .ok();
    loop {
        let wait = Duration::from_millis(rng.random_range(50..150));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return done,
        }
        let res = &resources[rng.random_range(0..resources.len())];
        let key = &res.keys[rng.random_range(0..res.keys.len())];
        let token = match rng.random_range(0..3) {
            0 => u64::MAX,
            1 => match client.as_mut() {
                Some(c) => match c.get("torture-forger", None).await {
                    Ok(r) => r.header().map_or(1, |h| h.revision() as u64) + 1,
                    Err(_) => continue,
                },
                None => continue,
            },
            _ => {
                // The last token of another resource's holder (never one
                // of this resource's own, which two locks' revisions could
                // share).
                let ops = hist.ops();
                let own = |t: u64| ops.iter().any(|o| o.resource == res.name && o.token == t);
                let other = ops.iter().rev().find(|o| o.resource != res.name);
                match other {
                    Some(o) if !own(o.token) => o.token,
                    _ => continue,
                }
            }
        };
        let body = aws_sdk_s3::primitives::ByteStream::from_static(b"forged\n");
        let sent = s3
            .put_object()
            .bucket(&bucket)
            .key(key)
            .body(body)
            .customize()
            .mutate_request(move |r| {
                r.headers_mut().insert("x-fencing-token", token.to_string());
            })
            .send()
            .await;
        done.sent += 1;
        let status = match &sent {
            Ok(_) => 200,
            Err(e) => e.raw_response().map_or(0, |r| r.status().as_u16()),
        };
        *done.answers.entry(status).or_default() += 1;
        if sent.is_ok() {
            done.acknowledged.push(format!("{key} with token {token}"));
        }
    }
}
