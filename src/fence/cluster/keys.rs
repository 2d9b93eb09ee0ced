//! Where cluster mode keeps things in etcd, and the one transaction that
//! admits a write.
//!
//! etcd compares values as bytes, so a token is written as 20 decimal
//! digits (`u64::MAX` has 20): byte order is then number order. A fence's
//! value is `<20 digits> <unix ms of the raise>`; the suffix sorts after
//! the digits, so "the fence is at most t" is `value < pad(t + 1)` and
//! "the fence is below t" is `value < pad(t)`, both plain byte compares.
//!
//! Layout under the prefix (`fencegate/` by default):
//!
//! - `fences/<resource>`: the fence;
//! - `inflight/<len>:<resource>/<token>/<replica>-<seq>`: a write in flight
//!   at some replica, under that replica's lease. The resource's length
//!   makes the key unambiguous whatever the resource contains; the token's
//!   fixed width makes "every write below t" one key range;
//! - `holds/<len>:<bucket>/<key>/<replica>-<seq>`: a write holding an
//!   object (`holds.rs`), under the replica's lease; its value says how
//!   (`alone` or `shared`);
//! - `uploads/<bucket/key\nuploadId>`: the token that created a multipart
//!   upload;
//! - `owners/<len>:<resource>`: the replica that admits the resource's
//!   requests (`owners.rs`), under its lease; the key's create revision is
//!   the owner's epoch;
//! - `owned/<len>:<resource>`: there while an owner has the resource and
//!   deleted with `owners/` when it lets go: found alone, the owner died;
//! - `replicas/<replica>`: where a replica's S3 listener is, under its
//!   lease (requests for a resource it owns are forwarded there);
//! - `seen/<replica>`: the revision up to which a replica has applied the
//!   raises made elsewhere, under its lease.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

/// A token as 20 digits (`u128` so that `pad(u64::MAX + 1)` still works).
pub fn pad(token: u128) -> String {
    format!("{token:020}")
}

/// The token at the start of a fence's value.
pub fn parse_fence(value: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(value).ok()?;
    let (t, ms) = s.split_once(' ').unwrap_or((s, "0"));
    Some((t.parse().ok()?, ms.parse().unwrap_or(0)))
}

/// The keys of one deployment (one prefix).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn fences(&self) -> String {
        format!("{}fences/", self.prefix)
    }

    pub fn fence(&self, resource: &str) -> String {
        format!("{}fences/{resource}", self.prefix)
    }

    /// The resource a fence key names.
    pub fn resource_of<'a>(&self, key: &'a [u8]) -> Option<&'a str> {
        let rest = key.strip_prefix(self.fences().as_bytes())?;
        std::str::from_utf8(rest).ok()
    }

    /// Every in-flight registration of `resource` starts with this.
    pub fn inflight_base(&self, resource: &str) -> String {
        format!("{}inflight/{}:{resource}/", self.prefix, resource.len())
    }

    /// The key range of `resource`'s in-flight writes with a token below
    /// `token`.
    pub fn inflight_below(&self, resource: &str, token: u64) -> (String, String) {
        let base = self.inflight_base(resource);
        let end = format!("{base}{}", pad(token.into()));
        (base, end)
    }

    pub fn registration(&self, resource: &str, token: u64, replica: &str, seq: u64) -> String {
        format!(
            "{}{}/{replica}-{seq}",
            self.inflight_base(resource),
            pad(token.into())
        )
    }

    /// Every hold on `object` (`bucket/key`) starts with this.
    pub fn hold_base(&self, object: &str) -> String {
        format!("{}holds/{}:{object}/", self.prefix, object.len())
    }

    /// The key range of every hold on `object`.
    pub fn holds_of(&self, object: &str) -> (String, String) {
        let base = self.hold_base(object);
        let end =
            String::from_utf8(prefix_end(&base)).expect("the base ends in '/', so its end is '0'");
        (base, end)
    }

    /// One write's hold on `object` (CONTRACT §8; `holds.rs`).
    pub fn hold(&self, object: &str, replica: &str, seq: u64) -> String {
        format!("{}{replica}-{seq}", self.hold_base(object))
    }

    pub fn uploads(&self) -> String {
        format!("{}uploads/", self.prefix)
    }

    pub fn upload(&self, upload: &str) -> String {
        format!("{}uploads/{upload}", self.prefix)
    }

    pub fn owner(&self, resource: &str) -> String {
        format!("{}owners/{}:{resource}", self.prefix, resource.len())
    }

    pub fn owned(&self, resource: &str) -> String {
        format!("{}owned/{}:{resource}", self.prefix, resource.len())
    }

    pub fn replica(&self, replica: &str) -> String {
        format!("{}replicas/{replica}", self.prefix)
    }

    pub fn seen(&self, replica: &str) -> String {
        format!("{}seen/{replica}", self.prefix)
    }
}

/// The first key after every key that starts with `prefix` (etcd's
/// "prefix end").
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A hold on an object as the admission (or the hold's own transaction)
/// read it.
#[derive(Debug, PartialEq, Eq)]
pub struct HoldSeen {
    pub key: Vec<u8>,
    pub lease: i64,
    pub created: i64,
    pub alone: bool,
}

/// How a hold's key says it holds.
pub const ALONE: &str = "alone";
pub const SHARED: &str = "shared";

impl HoldSeen {
    pub fn of(kv: &etcd_client::KeyValue) -> HoldSeen {
        HoldSeen {
            key: kv.key().to_vec(),
            lease: kv.lease(),
            created: kv.create_revision(),
            alone: kv.value() == ALONE.as_bytes(),
        }
    }
}

/// Of the holds read on an object, those made before `mine` that a hold of
/// its kind must wait for: every one when it holds alone, only those
/// holding alone when it shares.
pub fn holds_before(seen: &[HoldSeen], mine: &str, alone: bool) -> Result<super::Lower, String> {
    let me = seen
        .iter()
        .find(|h| h.key == mine.as_bytes())
        .ok_or("the hold just put is not there")?;
    Ok(seen
        .iter()
        .filter(|h| h.created < me.created && (alone || h.alone))
        .map(|h| (h.key.clone(), h.lease))
        .collect())
}

/// What the admission transaction found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The fence is above the token.
    Stale(u64),
    /// The fence is now at `token` (`raised` when this transaction put it
    /// there); `lower` are the in-flight writes below the token, and
    /// `holds` every hold on the object when the admission also shared it,
    /// as of `revision`.
    Admitted {
        raised: bool,
        lower: super::Lower,
        holds: Vec<HoldSeen>,
        revision: i64,
    },
}

/// What an admission puts under the replica's lease: the write's
/// registration, and the shared hold of the object it writes, if any, in
/// the same transaction (one round trip for both).
pub struct Puts<'a> {
    /// (key, lease)
    pub registration: Option<(&'a str, i64)>,
    /// (key, lease, object)
    pub hold: Option<(&'a str, i64, &'a str)>,
}

/// One transaction, one round trip, whatever the fence's state:
///
/// ```text
/// if fence missing:        put fence=t; [put registration; put hold]; get lower; [get holds]
/// elif fence < t:          put fence=t; [put registration; put hold]; get lower; [get holds]
/// elif fence <= t (== t):  [put registration; put hold]; get lower; [get holds]
/// else:                    get fence   (stale)
/// ```
///
/// An equal token writes no fence (no new revision, no watch event). The
/// transaction is idempotent for one registration and hold key, so a retry
/// after an unknown result is safe.
pub fn admission(keys: &Keys, resource: &str, token: u64, puts: Puts<'_>, now_ms: u64) -> Txn {
    let fence = keys.fence(resource);
    let (low, high) = keys.inflight_below(resource, token);
    let mut tail = Vec::new();
    if let Some((key, lease)) = puts.registration {
        let opts = PutOptions::new().with_lease(lease);
        tail.push(TxnOp::put(key, "", Some(opts)));
    }
    if let Some((key, lease, _)) = puts.hold {
        let opts = PutOptions::new().with_lease(lease);
        tail.push(TxnOp::put(key, SHARED, Some(opts)));
    }
    tail.push(TxnOp::get(
        low,
        Some(GetOptions::new().with_range(high).with_keys_only()),
    ));
    if let Some((_, _, object)) = puts.hold {
        let (base, end) = keys.holds_of(object);
        tail.push(TxnOp::get(base, Some(GetOptions::new().with_range(end))));
    }
    let mut raise = vec![TxnOp::put(
        fence.clone(),
        format!("{} {now_ms}", pad(token.into())),
        None,
    )];
    raise.extend(tail.iter().cloned());
    let equal = Txn::new()
        .when([Compare::value(
            fence.clone(),
            CompareOp::Less,
            pad(u128::from(token) + 1),
        )])
        .and_then(tail)
        .or_else([TxnOp::get(fence.clone(), None)]);
    let below = Txn::new()
        .when([Compare::value(
            fence.clone(),
            CompareOp::Less,
            pad(token.into()),
        )])
        .and_then(raise.clone())
        .or_else([TxnOp::txn(equal)]);
    Txn::new()
        .when([Compare::create_revision(fence, CompareOp::Equal, 0)])
        .and_then(raise)
        .or_else([TxnOp::txn(below)])
}

/// Reads the answer of [`admission`], applied at `revision` (nested in a
/// batch, the answer has no header of its own).
pub fn outcome(resp: &etcd_client::TxnResponse, revision: i64) -> Result<Outcome, String> {
    let mut raised = true;
    let mut level = resp.clone();
    for depth in 0..3 {
        let ops = level.op_responses();
        if level.succeeded() {
            // The ranges come last: the lower writes, then the holds.
            let mut ranges = ops.iter().filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g.kvs()),
                _ => None,
            });
            let lower = ranges
                .next()
                .ok_or("admission answer without its range")?
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.lease()))
                .collect();
            let holds = ranges
                .next()
                .map(|kvs| kvs.iter().map(HoldSeen::of).collect())
                .unwrap_or_default();
            return Ok(Outcome::Admitted {
                raised,
                lower,
                holds,
                revision,
            });
        }
        match ops.into_iter().next() {
            Some(TxnOpResponse::Txn(inner)) => level = inner,
            Some(TxnOpResponse::Get(g)) if depth == 2 => {
                let kv = g.kvs().first().ok_or("fence vanished during admission")?;
                let (h, _) = parse_fence(kv.value()).ok_or("fence value does not parse")?;
                return Ok(Outcome::Stale(h));
            }
            _ => return Err("admission answer has an unexpected shape".into()),
        }
        if depth == 1 {
            raised = false;
        }
    }
    Err("admission answer nests too deep".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_tokens_sort_as_numbers_and_the_suffix_keeps_the_compares() {
        let v = |t: u64| format!("{} 1700000000000", pad(t.into()));
        for (a, b) in [(9u64, 10u64), (0, 1), (99, 100), (u64::MAX - 1, u64::MAX)] {
            assert!(pad(a.into()) < pad(b.into()));
            // fence a is at most b, and below b
            assert!(v(a) < pad(u128::from(b) + 1) && v(a) < pad(b.into()));
            // fence b is not below b, but is at most b
            assert!(v(b) >= pad(b.into()) && v(b) < pad(u128::from(b) + 1));
        }
        assert_eq!(parse_fence(v(34).as_bytes()), Some((34, 1700000000000)));
    }

    #[test]
    fn registrations_of_lower_tokens_fall_in_the_range_and_no_other() {
        let k = Keys::new("fg/");
        let (lo, hi) = k.inflight_below("b/x", 34);
        let inside = k.registration("b/x", 33, "r1", 7);
        let equal = k.registration("b/x", 34, "r1", 8);
        // a resource whose name extends this one is another range
        let other = k.registration("b/x/34", 1, "r1", 9);
        assert!(lo <= inside && inside < hi);
        assert!(equal >= hi);
        assert!(!(lo <= other && other < hi));
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        // Owner keys of a resource and of one whose name extends it differ,
        // and no key of one kind is another kind's.
        assert_ne!(k.owner("b/x"), k.owner("b/x/y"));
        assert_ne!(k.owner("b/x"), k.owned("b/x"));
        assert!(!k.owner("b/x").starts_with(&k.fences()));
        assert!(k.replica("r1").starts_with(&k.replica("")));
        // The holds of an object are one range, and a longer name's are not in it.
        let (lo, hi) = k.holds_of("b/x");
        let mine = k.hold("b/x", "r1", 3);
        let longer = k.hold("b/x/y", "r1", 4);
        assert!(lo <= mine && mine < hi);
        assert!(!(lo <= longer && longer < hi));
    }

    #[test]
    fn a_hold_follows_the_earlier_holds_its_kind_must() {
        let h = |key: &str, created, alone| HoldSeen {
            key: key.as_bytes().to_vec(),
            lease: 1,
            created,
            alone,
        };
        let seen = [
            h("a", 5, true),
            h("s", 6, false),
            h("me", 7, false),
            h("later", 8, true),
        ];
        let keys = |l: super::super::Lower| {
            let mut k: Vec<_> = l
                .into_keys()
                .map(|k| String::from_utf8(k).unwrap())
                .collect();
            k.sort();
            k
        };
        // Shared: only the earlier alone hold; alone: every earlier hold.
        assert_eq!(keys(holds_before(&seen, "me", false).unwrap()), ["a"]);
        assert_eq!(keys(holds_before(&seen, "me", true).unwrap()), ["a", "s"]);
        assert!(holds_before(&seen, "gone", false).is_err());
    }
}
