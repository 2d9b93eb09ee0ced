//! A write's slot in the landing record: taken when the write is
//! admitted and filled with what it is, marked whole just before its last
//! body bytes go, freed when its exchange is over. Taking one is a search
//! of a bitmap for a free bit, then a few stores into the mapped page.

use super::*;

impl Landing {
    /// Takes a slot for `write`, not yet whole. `None` when every slot is
    /// taken: the file then says so, and the next start is a blanket one,
    /// after a clean stop too (an unrecorded write may still be in flight).
    pub fn record(self: &Arc<Self>, write: &Write) -> Option<Record> {
        let slot = self.take_slot()?;
        let off = self.slot_off(slot);
        let (etag, mut what) = match &write.sent {
            Sent::Plain => (&b""[..], 0),
            Sent::IfMatch(e) if e.len() <= ETAG_MAX => (e.as_bytes(), W_IF_MATCH),
            Sent::IfMatch(_) => (&b""[..], W_IF_MATCH),
            Sent::IfNoneMatch => (&b""[..], W_IF_NONE_MATCH),
        };
        if write.orderable {
            what |= W_ORDERABLE;
        }
        if write.alone {
            what |= W_ALONE;
        }
        if write.token.is_some() {
            what |= W_TOKEN;
        }
        self.slot_u64(slot, S_TOKEN)
            .store(write.token.unwrap_or(0), Ordering::Relaxed);
        self.slot_u64(slot, S_RESOURCE)
            .store(write.resource, Ordering::Relaxed);
        self.slot_u64(slot, S_OBJECT)
            .store(write.object, Ordering::Relaxed);
        self.put_bytes(off + S_ETAG_LEN, &[etag.len() as u8]);
        self.put_bytes(off + S_ETAG, etag);
        let name = write.name.as_deref().filter(|n| n.len() <= NAME_MAX);
        let name = name.unwrap_or_default().as_bytes();
        self.put_bytes(off + S_NAME_LEN, &(name.len() as u16).to_le_bytes());
        self.put_bytes(off + S_NAME, name);
        self.slot_u32(slot, S_WHAT).store(what, Ordering::Relaxed);
        self.slot_u32(slot, S_STATE)
            .store(SENDING, Ordering::Release);
        Some(Record {
            landing: self.clone(),
            slot,
        })
    }

    fn take_slot(&self) -> Option<u32> {
        thread_local! {
            static START: std::cell::Cell<usize> = std::cell::Cell::new(rand::random::<u32>() as usize);
        }
        let words = self.taken.len();
        let start = START.with(|s| s.get()) % words;
        for i in 0..words {
            let w = (start + i) % words;
            let word = &self.taken[w];
            let mut bits = word.load(Ordering::Relaxed);
            while bits != u64::MAX {
                let bit = (!bits).trailing_zeros();
                match word.compare_exchange_weak(
                    bits,
                    bits | 1 << bit,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        START.with(|s| s.set(w));
                        return Some(w as u32 * 64 + bit);
                    }
                    Err(now) => bits = now,
                }
            }
        }
        self.u32_at(H_FLAGS).fetch_or(OVERFLOWED, Ordering::AcqRel);
        if !self.overflow_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "more than {SLOTS} writes in flight at once: the ones past that are not \
                 recorded, so the next start, even after a clean stop, holds every newer \
                 token back for the quarantine"
            );
        }
        None
    }
}

/// One write's slot: taken until dropped, when the slot is freed.
pub struct Record {
    pub(super) landing: Arc<Landing>,
    pub(super) slot: u32,
}

impl Record {
    /// The condition the write goes to the backend with, which may be
    /// settled after the slot was taken (`fence.conditional_writes`).
    pub fn sent(&self, sent: &Sent, orderable: bool) {
        let l = &self.landing;
        let what = l.slot_u32(self.slot, S_WHAT);
        let mut w = what.load(Ordering::Relaxed) & !(W_IF_MATCH | W_IF_NONE_MATCH | W_ORDERABLE);
        let etag = match sent {
            Sent::Plain => &b""[..],
            Sent::IfMatch(e) => {
                w |= W_IF_MATCH;
                if e.len() <= ETAG_MAX {
                    e.as_bytes()
                } else {
                    b""
                }
            }
            Sent::IfNoneMatch => {
                w |= W_IF_NONE_MATCH;
                b""
            }
        };
        if orderable {
            w |= W_ORDERABLE;
        }
        let off = l.slot_off(self.slot);
        l.put_bytes(off + S_ETAG_LEN, &[etag.len() as u8]);
        l.put_bytes(off + S_ETAG, etag);
        what.store(w, Ordering::Release);
    }

    /// The write's last body bytes are about to go: from here the backend
    /// may have all of it.
    pub fn whole(&self) {
        self.landing
            .slot_u32(self.slot, S_STATE)
            .store(WHOLE, Ordering::Release);
    }

    /// What the slot says now.
    pub fn write(&self) -> Write {
        self.landing.read_slot(self.slot)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let l = &self.landing;
        l.slot_u32(self.slot, S_STATE)
            .store(FREE, Ordering::Release);
        let slot = self.slot as usize;
        l.taken[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record").field("slot", &self.slot).finish()
    }
}
