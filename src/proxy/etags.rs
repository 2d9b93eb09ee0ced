//! The ETag each object was last left with by a write fencegate sent with
//! a condition of its own (`fence.conditional_writes`), so that the next
//! such write to it needs no HEAD to know what to send.
//!
//! A cache, and allowed to be wrong: a condition built from a stale entry
//! fails at the backend, which then changes nothing, and the write is
//! answered `503 SlowDown` (retried, it looks at the object afresh). So it
//! is a fixed table, an entry a slot by hash, the last one in winning; an
//! entry names the owner's epoch it was seen under (cluster mode), and a
//! write that leaves the object in a state fencegate did not read from its
//! answer forgets it.

use http::HeaderValue;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

/// Slots in the table (1 MiB of slots, and each ETag kept its own few
/// bytes: see [`Etags::put`]).
const SLOTS: usize = 1 << 14;

/// What fencegate knows of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// It has no object at the key (a write goes with `If-None-Match: *`).
    Absent,
    /// Its ETag, as the backend wrote it (a write goes with `If-Match`).
    Etag(HeaderValue),
}

struct Entry {
    object: u64,
    epoch: i64,
    known: Known,
}

pub struct Etags {
    slots: Box<[Mutex<Option<Entry>>]>,
    hasher: RandomState,
}

impl Default for Etags {
    fn default() -> Self {
        Etags {
            slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Etags {
    fn slot(&self, object: &str) -> (u64, std::sync::MutexGuard<'_, Option<Entry>>) {
        let h = self.hasher.hash_one(object);
        let slot = &self.slots[h as usize % SLOTS];
        (h, slot.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What a write of `object` under `epoch` (0 on a single node) left.
    pub fn get(&self, object: &str, epoch: i64) -> Option<Known> {
        let (h, slot) = self.slot(object);
        slot.as_ref()
            .filter(|e| e.object == h && e.epoch == epoch)
            .map(|e| e.known.clone())
    }

    /// Remembers `known` for `object`. An ETag is copied: one read from an
    /// answer's headers is a slice of hyper's read buffer, and kept as it
    /// came it would keep that whole buffer (kilobytes) alive per slot.
    pub fn put(&self, object: &str, epoch: i64, known: Known) {
        let known = match known {
            Known::Etag(v) => {
                Known::Etag(HeaderValue::from_bytes(v.as_bytes()).expect("a header value's bytes"))
            }
            absent => absent,
        };
        let (h, mut slot) = self.slot(object);
        *slot = Some(Entry {
            object: h,
            epoch,
            known,
        });
    }

    pub fn forget(&self, object: &str) {
        let (h, mut slot) = self.slot(object);
        if slot.as_ref().is_some_and(|e| e.object == h) {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_its_objects_under_its_epoch_until_forgotten() {
        let e = Etags::default();
        let etag = Known::Etag(HeaderValue::from_static("\"e1\""));
        e.put("b/k", 3, etag.clone());
        assert_eq!(e.get("b/k", 3), Some(etag));
        assert_eq!(e.get("b/k", 4), None, "another tenure");
        assert_eq!(e.get("b/j", 3), None);
        e.forget("b/j");
        assert!(e.get("b/k", 3).is_some(), "forgetting another object");
        e.forget("b/k");
        assert_eq!(e.get("b/k", 3), None);
        e.put("b/k", 0, Known::Absent);
        assert_eq!(e.get("b/k", 0), Some(Known::Absent));
    }

    /// An ETag read from an answer is a slice of the buffer the answer
    /// was read into: the table keeps a copy, not the buffer.
    #[test]
    fn a_remembered_etag_keeps_no_read_buffer_alive() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Buffer(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Buffer {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Buffer {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let mut read = b"\"e1\"".to_vec();
        read.resize(64 << 10, b'x');
        let buffer = bytes::Bytes::from_owner(Buffer(read, freed.clone()));
        let etag = HeaderValue::from_maybe_shared(buffer.slice(0..4)).unwrap();
        drop(buffer);
        assert!(
            !freed.load(Ordering::SeqCst),
            "the etag shares the read buffer"
        );
        let e = Etags::default();
        e.put("b/k", 0, Known::Etag(etag));
        assert!(
            freed.load(Ordering::SeqCst),
            "the table keeps the read buffer"
        );
        let kept = Known::Etag(HeaderValue::from_static("\"e1\""));
        assert_eq!(e.get("b/k", 0), Some(kept));
    }
}
