//! Verified raises at the gate (`fence::issued`): before a request's token
//! raises the fence of a resource tied to its lock, the lock says whether
//! the token is its holder's. Only then: a request at the fence's own
//! token (or below it, which is stale anyway) asks nothing.

use super::{Gate, Refusal};
use crate::fence::issued::{Issuers, Whose};
use crate::metric_names as m;
use std::sync::Arc;

impl Gate {
    /// Ties the resources `issuers` names to their locks (once, at start).
    pub fn set_issuers(&self, issuers: Arc<dyn Issuers>) {
        let _ = self.issuers.set(issuers);
    }

    /// The locks of verified resources, if any resource is.
    pub fn issuers(&self) -> Option<&Arc<dyn Issuers>> {
        self.issuers.get()
    }

    /// Whether `resource`'s raises are verified (one map lookup; none
    /// without a verified resource at all).
    pub(super) fn verifies(&self, resource: &str) -> bool {
        self.issuers
            .get()
            .is_some_and(|i| i.lock_of(resource).is_some())
    }

    /// A request's `token` on a verified `resource` whose fence is
    /// `fence`: nothing to do unless it would raise it; then the lock's
    /// holder must have it. A token an earlier holder had raises the fence
    /// to the holder's and is refused as stale; one the lock never gave
    /// its holder raises nothing and is refused.
    pub(super) async fn verify_raise(
        &self,
        resource: &str,
        token: u64,
        fence: Option<u64>,
    ) -> Result<(), Refusal> {
        let Some(issuers) = self.issuers.get() else {
            return Ok(());
        };
        if fence.is_some_and(|h| h >= token) {
            return Ok(());
        }
        let Some(lock) = issuers.lock_of(resource) else {
            return Ok(());
        };
        let checked = issuers.check(resource, token).await;
        let lock = lock.to_string();
        match checked {
            Ok(Whose::Holder) => Ok(()),
            Ok(Whose::Earlier { holder }) => {
                let highest = match self.raise_to(resource, holder).await {
                    Ok((h, _)) => h,
                    Err(Refusal::Stale { highest, .. }) => highest,
                    Err(e) => return Err(e),
                };
                tracing::info!(
                    resource,
                    lock,
                    token,
                    holder,
                    "a token an earlier holder of the lock had: the fence goes to the holder's"
                );
                Err(Refusal::Stale { token, highest })
            }
            Ok(Whose::NotIssued { holder }) => {
                metrics::counter!(m::TOKENS_NOT_ISSUED, "resource" => resource.to_string())
                    .increment(1);
                tracing::warn!(
                    resource,
                    lock,
                    token,
                    holder,
                    "a token the lock never gave its holder: refused, nothing raised"
                );
                Err(Refusal::NotIssued {
                    lock,
                    token,
                    holder,
                })
            }
            Err(why) => Err(Refusal::Unverified { lock, why }),
        }
    }
}
