//! A writer with valid S3 credentials and made-up tokens (issue #57):
//! beside the lock holders, it writes to the fenced arm's resources with
//! tokens their locks never gave their holders: 2^64-1, a million above
//! etcd's revision, and the token another lock's holder has (from the
//! history). With `[[eager]] verify = true` on those resources, none may be
//! acknowledged, and no fence may rise above what etcd ever issued.
//!
//! A token is a number: two etcd locks' holders can have the same one (a
//! lock's token is the revision at which its Lock call returned, and two
//! calls can return at the same revision). A write with the token this
//! resource's holder has is its holder's write as far as any fence can
//! tell, and would land in the log the checker judges (a CI run saw one
//! such write, `forged`, read back as corrupt 26 times), so the forger
//! skips a token equal to the one in the holder's key. Should one still be
//! acknowledged with a token some holder of the resource had, it is not
//! counted as made up ([`Forged::made_up`]).
//!
//! Until a holder's token is in its key (between its Lock call's return and
//! its put), fencegate can check a token only against a revision range
//! (docs/lock-services.md, "Verified raises"), in which a made-up token
//! passes. The forger writes only while the holder's token is in its key,
//! and a write acknowledged across a handoff (another holder after it than
//! before) is counted apart (`in_handoff`), not as made up.

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
    /// Answered 2xx: (resource, key, token).
    pub acknowledged: Vec<(String, String, u64)>,
    /// By status.
    pub answers: std::collections::BTreeMap<u16, u64>,
    /// Acknowledged, but the lock changed hands between the look before
    /// the write and the look after it: the new holder's token may not
    /// have been in its key yet.
    pub in_handoff: u64,
}

/// The create revision of the key holding `lock`, and the token its holder
/// put in it (`None` until it has); `None` when nobody holds it or etcd
/// cannot be asked.
async fn holder(c: &mut etcd_client::Client, lock: &str) -> Option<(i64, Option<u64>)> {
    let prefix = format!("{lock}/");
    let opts = etcd_client::GetOptions::new().with_prefix();
    let resp = c.get(prefix, Some(opts)).await.ok()?;
    let first = resp.kvs().iter().min_by_key(|kv| kv.create_revision())?;
    let token = first.value_str().ok().and_then(|v| v.parse().ok());
    Some((first.create_revision(), token))
}

impl Forged {
    /// The acknowledged writes whose token no holder of their resource
    /// ever had, by the end of the run: made up, and let through.
    pub fn made_up(&self, hist: &History) -> Vec<String> {
        let ops = hist.ops();
        self.acknowledged
            .iter()
            .filter(|(r, _, t)| !ops.iter().any(|o| &o.resource == r && o.token == *t))
            .map(|(r, k, t)| format!("{k} ({r}) with token {t}"))
            .collect()
    }
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
                    Ok(r) => r.header().map_or(1, |h| h.revision() as u64) + 1_000_000,
                    Err(_) => continue,
                },
                None => continue,
            },
            _ => {
                // The last token of another resource's holder.
                let ops = hist.ops();
                match ops.iter().rev().find(|o| o.resource != res.name) {
                    Some(o) => o.token,
                    None => continue,
                }
            }
        };
        // Only while the holder's token is in its key, and never that token.
        let Some(c) = client.as_mut() else { continue };
        let before = match holder(c, &res.name).await {
            Some((rev, Some(held))) if held != token => rev,
            _ => continue,
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
            let after = match client.as_mut() {
                Some(c) => holder(c, &res.name).await,
                None => None,
            };
            if after.map(|(rev, _)| rev) == Some(before) {
                done.acknowledged
                    .push((res.name.clone(), key.clone(), token));
            } else {
                done.in_handoff += 1;
            }
        }
    }
}
