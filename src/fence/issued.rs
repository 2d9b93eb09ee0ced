//! Verified raises (CONTRACT §7; docs/lock-services.md, "Verified raises"):
//! a token that would raise the fence of a resource tied to its lock
//! (`[[eager]] verify = true`) is checked with the lock service first, as
//! Chubby's servers check a sequencer. The gate asks [`Issuers`] (the
//! lock watches, `locks::issued`) before such a raise, and only then:
//! a write at the fence's own token costs nothing.

use futures_util::future::BoxFuture;

/// Whose a token that would raise its resource's fence is, as the lock
/// says: its holder's, an earlier holder's, or one it never gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// It is the lock's current holder's: the raise goes on.
    Holder,
    /// The lock's holder has this higher token: the request's token was
    /// an earlier holder's. The fence goes to the holder's token, and the
    /// request is refused as stale.
    Earlier { holder: u64 },
    /// The lock never gave this token to its holder (a made-up token,
    /// another lock's, one above the holder's), or has no holder now.
    NotIssued { holder: Option<u64> },
}

/// A lock's holder, as the watches of verified resources know it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Behind {
    pub resource: String,
    pub lock: String,
    /// The token the lock's holder has.
    pub holder: u64,
    /// The resource's fence, above it.
    pub fence: u64,
}

/// The locks of verified resources (set on the gate once, at start).
pub trait Issuers: Send + Sync {
    /// The lock `resource` is tied to, if its raises are verified.
    fn lock_of(&self, resource: &str) -> Option<&str>;

    /// Whether `token` is the holder's of `resource`'s lock: from what the
    /// lock's watch knows, else asking the service. An error: the service
    /// could not be asked.
    fn check<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<Whose, String>>;

    /// The resource whose verified lock `lock` names: the lock as
    /// `[[eager]]` names it (`etcd:NAME` or `NAME`), or its holder's key as
    /// `fencegate lock` gives it (`NAME/<lease>`, a ZooKeeper node's path).
    fn resource_of_lock(&self, lock: &str) -> Option<&str>;

    /// Locks whose holder's token is below its resource's fence: the lock
    /// service's tokens went back (docs/lock-services.md, "When the
    /// tokens go back").
    fn behind(&self) -> Vec<Behind>;
}
