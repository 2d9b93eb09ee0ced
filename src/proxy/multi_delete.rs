//! DeleteObjects: every key it names is checked against its own resource,
//! all or nothing. The body is small (at most 1000 keys), so it is read
//! whole (capped), verified like any body, parsed, and the backend gets a
//! body rebuilt from the keys fencegate read (`s3::multi_delete`), never
//! the client's XML.
//!
//! Every key is held as a DeleteObject holds its object (`fence::hold`):
//! alone when it has conditions, which are then judged on the object as it
//! is (CONTRACT §8). A key whose conditions do not hold is left out of what
//! the backend gets, and answered in the result as S3 answers it, an
//! `<Error>` with its code, beside what the backend answered for the rest.

use super::small_body::{Checksum, read_body, read_small_body, send_body};
use super::to_owner::Via;
use super::{Admitted, Proxy, RequestCtx};
use crate::body::{ProxyBody, full};
use crate::fence::gate::{Admission, Kind, Permit, Refusal};
use crate::fence::hold::{Holder, Mode, ObjectHold, object_name};
use crate::fence::landing::Record;
use crate::fence::resource::Fencing;
use crate::s3::conditions::{Conditions, Failed};
use crate::s3::error::{S3Error, xml_escape};
use crate::s3::multi_delete::{Delete, MAX_BODY};
use crate::s3::session::Session;
use crate::upstream::client::Outgoing;
use bytes::Bytes;
use futures_util::StreamExt;
use http::Response;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// HEADs of conditional keys on their way at once.
const HEADS_AT_ONCE: usize = 8;

/// What fencing a DeleteObjects established.
pub(super) struct MultiDelete {
    /// Kept until the backend answered.
    pub permits: Vec<Permit>,
    pub hold: ObjectHold,
    /// Keys left out because their conditions did not hold.
    pub refused: Vec<(String, Failed)>,
    /// Every key was refused: nothing goes to the backend.
    pub nothing_left: bool,
    /// The slots of the keys sent, in the landing record (a remote
    /// backend): whole, since the body goes whole.
    pub records: Vec<Arc<Record>>,
    /// Cluster mode with owners: the request goes to the replica that
    /// owns the keys' resources.
    pub elsewhere: Option<Elsewhere>,
}

impl MultiDelete {
    /// Nothing done here: the request goes to another replica.
    fn elsewhere(to: Elsewhere) -> Self {
        MultiDelete {
            permits: Vec::new(),
            hold: ObjectHold::none(),
            refused: Vec::new(),
            nothing_left: false,
            records: Vec::new(),
            elsewhere: Some(to),
        }
    }
}

/// A DeleteObjects that another replica admits.
pub(super) struct Elsewhere {
    pub to: To,
    /// The resources, as the log line names them.
    pub resources: String,
    /// The body read.
    pub body: Bytes,
}

/// Which replica admits a DeleteObjects, when this one does not.
pub(super) enum To {
    /// The owner of the keys' resources, and its epoch.
    Owner(String, i64),
    /// A peer whose lease is fresh, this replica being cut off from etcd
    /// (`route`'s relay), and the refusal to answer if it is not reached.
    Peer(String, S3Error),
}

/// What [`Proxy::admit_all`] got.
enum AdmittedAll {
    Here(Vec<Permit>),
    /// The first resource is owned by another replica (its name), at
    /// this epoch; or this replica is cut off from etcd, and a peer
    /// whose lease is fresh may admit it.
    Elsewhere(To),
}

impl Proxy {
    /// Reads the body of `out`, fences every resource it names, holds
    /// every key and judges their conditions, and puts a canonical body of
    /// the keys whose conditions held in its place.
    pub(super) async fn fence_multi_delete(
        &self,
        admitted: &Admitted<'_>,
        out: &mut Outgoing,
        ctx: &mut RequestCtx,
    ) -> Result<MultiDelete, S3Error> {
        let (op, token) = (&admitted.op, admitted.fenced.token);
        let session = admitted.verified.session.as_deref();
        let bucket = op.bucket.as_deref().unwrap_or_default();
        let body = read_body(out, MAX_BODY, "DeleteObjects").await?;
        let (mut delete, fencing) = self.read_keys(&body, bucket, session)?;
        let resources: BTreeSet<String> = fencing.iter().flatten().cloned().collect();
        let permits = match resources.iter().next() {
            None => Vec::new(),
            Some(first) => {
                let t = token.ok_or_else(|| S3Error::MissingFencingToken(first.clone()))?;
                let named = format!("{first} (+{} more)", resources.len() - 1);
                ctx.resource = Some(named.clone());
                let all = self.admit_all_through_etcd(&resources, t, admitted.via);
                match all.await? {
                    AdmittedAll::Here(permits) => permits,
                    AdmittedAll::Elsewhere(to) => {
                        return Ok(MultiDelete::elsewhere(Elsewhere {
                            to,
                            resources: named,
                            body,
                        }));
                    }
                }
            }
        };
        if let Some(first) = resources.iter().next() {
            self.check_forwarded(admitted.via, first)?;
        }
        let hold = self.hold_keys(bucket, &delete, &fencing).await?;
        let refused = self.judge_keys(bucket, &delete, &out.headers).await?;
        delete
            .objects
            .retain(|o| !refused.iter().any(|(k, _)| *k == o.key));
        // The body was read whole: in cluster mode, the lease is asked now.
        if !hold.body_complete() {
            return Err(S3Error::lease_lapsed("one of the keys"));
        }
        let nothing_left = delete.objects.is_empty();
        let records = match nothing_left {
            true => Vec::new(),
            false => self.send_keys(bucket, &delete, token, out)?,
        };
        Ok(MultiDelete {
            permits,
            hold,
            refused,
            nothing_left,
            records,
            elsewhere: None,
        })
    }

    /// The body's keys, each within a session credential's scope (one key
    /// outside it refuses the whole request, all or nothing as for the
    /// fence), and each key's resource, in the order of the keys.
    fn read_keys(
        &self,
        body: &[u8],
        bucket: &str,
        session: Option<&Session>,
    ) -> Result<(Delete, Vec<Option<String>>), S3Error> {
        let delete = Delete::parse(body)?;
        if let Some(s) = session
            && let Some(o) = delete
                .objects
                .iter()
                .find(|o| !s.allows_key(bucket, &o.key))
        {
            return Err(s.outside(&format!("{bucket}/{}", o.key)));
        }
        let fencing = (delete.objects.iter())
            .map(|o| match self.resolver.resolve(bucket, &o.key) {
                Fencing::Fenced(r) => Some(r),
                Fencing::Unfenced => None,
            })
            .collect();
        Ok((delete, fencing))
    }

    /// The keys left in `delete`, each given its slot in the landing
    /// record, then sent as the body of `out`.
    fn send_keys(
        &self,
        bucket: &str,
        delete: &Delete,
        token: Option<u64>,
        out: &mut Outgoing,
    ) -> Result<Vec<Arc<Record>>, S3Error> {
        let keys: Vec<(&str, Option<String>)> = delete
            .objects
            .iter()
            .map(|o| match self.resolver.resolve(bucket, &o.key) {
                Fencing::Fenced(r) => (o.key.as_str(), Some(r)),
                Fencing::Unfenced => (o.key.as_str(), None),
            })
            .collect();
        let keys = keys.iter().map(|(k, r)| (*k, r.as_deref()));
        let records = self.record_keys(bucket, keys, token);
        send_body(out, Bytes::from(delete.to_xml()), Checksum::Sha256)?;
        Ok(records)
    }

    /// Every key of `delete` held (alone when it has conditions), `fencing`
    /// saying which are fenced. With owners, the holds of fenced keys are
    /// this replica's (it owns their resources now); the others are in
    /// etcd. Always in this order.
    async fn hold_keys(
        &self,
        bucket: &str,
        delete: &Delete,
        fencing: &[Option<String>],
    ) -> Result<ObjectHold, S3Error> {
        let (mut here, mut shared) = (Vec::new(), Vec::new());
        for (o, resource) in delete.objects.iter().zip(fencing) {
            let mode = match o.conditions {
                Some(_) => Mode::Alone,
                None => Mode::Shared,
            };
            match self.holder(resource.is_some()) {
                Holder::ThisOwner => here.push((object_name(bucket, &o.key), mode)),
                Holder::AnyReplica => shared.push((object_name(bucket, &o.key), mode)),
            }
        }
        let holds = self.gate.holds();
        let mut hold = holds
            .hold(here, Holder::ThisOwner)
            .await
            .map_err(S3Error::from_hold)?;
        hold.merge(
            holds
                .hold(shared, Holder::AnyReplica)
                .await
                .map_err(S3Error::from_hold)?,
        );
        Ok(hold)
    }

    /// The keys of `delete` whose conditions do not hold, each read with a
    /// HEAD (several at once) while it is held.
    async fn judge_keys(
        &self,
        bucket: &str,
        delete: &Delete,
        headers: &HeaderMap,
    ) -> Result<Vec<(String, Failed)>, S3Error> {
        let conditional: Vec<_> = delete
            .objects
            .iter()
            .filter_map(|o| Some((o.key.clone(), o.conditions.clone()?)))
            .collect();
        let judge = |(key, c): (String, Conditions)| async move {
            let current = self.current(bucket, &key, headers).await?;
            let verdict = c.judge(current.as_ref().map(|(c, _)| c));
            Ok::<_, S3Error>(verdict.err().map(|f| (key, f)))
        };
        let judged: Vec<_> = futures_util::stream::iter(conditional)
            .map(judge)
            .buffer_unordered(HEADS_AT_ONCE)
            .collect()
            .await;
        judged.into_iter().filter_map(Result::transpose).collect()
    }

    /// [`Proxy::admit_all`], through what etcd's absence costs in cluster
    /// mode, as for a single write (`route`): refused because the lease
    /// lapsed, the request is relayed to a peer whose lease is fresh (this
    /// replica cut off), or admitted once the lease is fresh again (an etcd
    /// election that outlasted every lease); refused while the lease is
    /// fresh (etcd not answering a read during an election, or answering
    /// again), it is tried again within the admission wait, as an
    /// admission's transaction is.
    async fn admit_all_through_etcd(
        &self,
        resources: &BTreeSet<String>,
        token: u64,
        via: Via,
    ) -> Result<AdmittedAll, S3Error> {
        let admission_ends = Instant::now() + self.gate.wait_bound();
        let mut wait = Duration::from_millis(100);
        loop {
            let e = match self.admit_all(resources, token).await {
                Err(e @ S3Error::ServiceUnavailable(_)) => e,
                all => return all,
            };
            if let Some(peer) = self.relay_to(via, &e).await {
                return Ok(AdmittedAll::Elsewhere(To::Peer(peer, e)));
            }
            if self.lease_back(&e, admission_ends).await {
                continue;
            }
            let fresh = self.gate.cluster().is_some_and(|c| c.not_ready().is_none());
            if !fresh || Instant::now() + wait >= admission_ends {
                return Err(e);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// Admits `token` on every resource, all or nothing: every resource is
    /// checked before any is raised, so that a request refused for one key
    /// leaves the others' fences alone.
    async fn admit_all(
        &self,
        resources: &BTreeSet<String>,
        token: u64,
    ) -> Result<AdmittedAll, S3Error> {
        for r in resources {
            let highest = self.gate.highest(r).await;
            if let Some(h) = highest.map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?
                && token < h
            {
                let stale = Refusal::Stale { token, highest: h };
                return Err(S3Error::from_refusal(stale, r));
            }
        }
        let mut permits = Vec::new();
        for r in resources {
            match self.gate.admit(r, token, Kind::Write).await {
                Ok(Admission::Here(p)) => permits.extend(p),
                // With owners: the whole request goes to the owner of the
                // first resource, which admits the others or refuses.
                Ok(Admission::AtOwner(owner, epoch)) if permits.is_empty() => {
                    return Ok(AdmittedAll::Elsewhere(To::Owner(owner, epoch)));
                }
                Ok(Admission::AtOwner(owner, _)) => {
                    return Err(S3Error::SlowDown(format!(
                        "{r} is owned by replica {owner}, and other keys' resources by this one: \
                         send the keys of each resource in a request of its own"
                    )));
                }
                Err(e) => return Err(S3Error::from_refusal(e, r)),
            }
        }
        // The body was read whole: it is complete unless a newer token
        // arrived meanwhile.
        for p in &permits {
            if !p.body_complete() {
                return Err(S3Error::aborted(p, "one of the keys"));
            }
        }
        Ok(AdmittedAll::Here(permits))
    }
}

/// An `<Error>` of a DeleteResult for each refused key.
fn refused_xml(refused: &[(String, Failed)]) -> String {
    let mut xml = String::new();
    for (key, failed) in refused {
        let e = failed.error(key);
        xml.push_str("<Error><Key>");
        xml.push_str(&xml_escape(key));
        xml.push_str("</Key><Code>");
        xml.push_str(e.code());
        xml.push_str("</Code><Message>");
        xml.push_str(&xml_escape(&e.to_string()));
        xml.push_str("</Message></Error>");
    }
    xml
}

/// The answer when every key was refused: nothing went to the backend.
pub(super) fn refused_only(refused: &[(String, Failed)]) -> Response<ProxyBody> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{}</DeleteResult>",
        refused_xml(refused)
    );
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// The backend's DeleteResult with the refused keys' errors added.
pub(super) async fn with_refused(
    resp: Response<ProxyBody>,
    refused: &[(String, Failed)],
) -> Result<Response<ProxyBody>, S3Error> {
    if !resp.status().is_success() {
        return Ok(resp);
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = read_small_body(body, 8 << 20).await?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| S3Error::BadGateway("the backend's DeleteResult is not UTF-8".into()))?;
    let merged = merged_result(text, refused).ok_or_else(|| {
        S3Error::BadGateway("the backend's DeleteObjects answer is not a DeleteResult".into())
    })?;
    parts.headers.remove(CONTENT_LENGTH);
    Ok(Response::from_parts(parts, full(merged)))
}

/// `result` (a DeleteResult) with the refused keys' errors added at its end.
fn merged_result(result: &str, refused: &[(String, Failed)]) -> Option<String> {
    let errors = refused_xml(refused);
    if let Some(end) = result.rfind("</DeleteResult>") {
        return Some(format!("{}{errors}{}", &result[..end], &result[end..]));
    }
    // An empty result may be one element, `<DeleteResult .../>`.
    let open = result.find("<DeleteResult")?;
    let end = result[open..].find("/>")? + open;
    Some(format!(
        "{}>{errors}</DeleteResult>{}",
        &result[..end],
        &result[end + 2..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_keys_join_the_backends_result_whatever_its_form() {
        let refused = [("a<b".to_string(), Failed::Precondition)];
        let full = "<?xml version=\"1.0\"?><DeleteResult xmlns=\"x\"><Deleted><Key>k</Key></Deleted></DeleteResult>";
        let empty = "<?xml version=\"1.0\"?>\n<DeleteResult xmlns=\"x\"/>";
        for result in [full, empty] {
            let merged = merged_result(result, &refused).unwrap();
            let parsed = crate::s3::xml::is_error(merged.as_bytes());
            assert!(!parsed, "{merged}");
            assert!(
                merged.ends_with("<Error><Key>a&lt;b</Key><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold (a&lt;b)</Message></Error></DeleteResult>"),
                "{merged}"
            );
        }
        assert_eq!(merged_result("<Error/>", &refused), None);
    }
}
