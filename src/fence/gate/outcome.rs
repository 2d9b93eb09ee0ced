//! What the gate answers a request: where it was admitted
//! ([`Admission`]), or why it was not ([`Refusal`]). Apart from the gate's
//! machinery so that a caller reads the two outcomes in one place.

use super::Permit;
use crate::fence::table::TableError;

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("fencing token {token} is below the highest recorded token {highest}")]
    Stale { token: u64, highest: u64 },
    #[error("older writes with a lower token are still finishing upstream")]
    Busy,
    /// Cluster mode: the object's hold, put by the admission, waited for
    /// other writes of the object past the bound.
    #[error("other writes to {0} are still in progress")]
    Held(String),
    #[error(transparent)]
    Table(#[from] TableError),
    /// Cluster mode: etcd cannot be asked now, so nothing is admitted.
    #[error("the shared fence table cannot be reached: {0}")]
    Unavailable(String),
    /// Cluster mode with owners: this replica's tenure on the resource
    /// ended while admitting (it is tried again).
    #[error("this replica's tenure on the resource ended")]
    TenureLost,
    /// Cluster mode with owners: the owner's in-flight marker must be put
    /// back before this write is admitted (`owned.rs`, "Markers"). Never
    /// leaves the gate: the admission puts it and tries again.
    #[error("the resource's in-flight marker is being put back")]
    Unmarked,
    /// Cluster mode with owners: a write of the resource's previous owner,
    /// which died, may still land at the backend for this long: nothing
    /// is admitted before (`owned.rs`).
    #[error("a write of the resource's previous owner may still land for {0:?}")]
    Landing(std::time::Duration),
    /// A write with a lower token, whose answer was lost or whose sender
    /// died, may still land at the backend for this long, past the wait
    /// (`fence::doubt`): nothing newer is admitted before.
    #[error("an older write whose outcome is unknown may still land for {0:?}")]
    InDoubt(std::time::Duration),
    /// The resource's lock never gave this token to its holder
    /// (`fence::issued`): nothing raised.
    #[error("lock {lock} never gave token {token} to its holder")]
    NotIssued {
        lock: String,
        token: u64,
        holder: Option<u64>,
    },
    /// The resource's lock service could not be asked whether a raise's
    /// token is its holder's: nothing raised.
    #[error("lock {lock} could not be asked whether the token is its holder's: {why}")]
    Unverified { lock: String, why: String },
}

/// Where a request was admitted.
pub enum Admission {
    /// Here: a permit for a write, none for a read.
    Here(Option<Permit>),
    /// Cluster mode with owners: nowhere yet, because another replica (its
    /// name) owns the resource at this epoch; the proxy forwards the
    /// request there (`proxy/to_owner.rs`).
    AtOwner(String, i64),
}

impl Admission {
    /// The permit of a request admitted here (`None` for a read). For a
    /// gate without owners (a single node, tests, benchmarks): a request
    /// answered with an owner panics, rather than pass as a read.
    pub fn permit(self) -> Option<Permit> {
        match self {
            Admission::Here(p) => p,
            Admission::AtOwner(owner, _) => panic!("admitted nowhere: replica {owner} owns it"),
        }
    }
}
