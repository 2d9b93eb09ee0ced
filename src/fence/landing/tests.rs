//! The unit tests of `fence::landing`: the record across a death, a clean stop and a start it cannot trust.

use super::*;

fn write(token: u64) -> Write {
    Write {
        token: Some(token),
        resource: 7,
        object: 9,
        name: Some("b/k".into()),
        sent: Sent::IfMatch("0123456789abcdef0123456789abcdef".into()),
        orderable: true,
        alone: false,
    }
}

/// A process that dies (its `Landing` dropped without `close`, as a
/// `kill -9` leaves the mapping's pages) leaves exactly its whole
/// writes to the next start, on the same boot.
#[test]
fn a_death_leaves_the_whole_writes_to_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = Landing::open(dir.path(), false).unwrap();
    assert!(first.blanket.is_none() && first.inherited.is_empty());
    let l = first.landing;
    let whole = l.record(&write(33)).unwrap();
    whole.whole();
    let sending = l.record(&write(34)).unwrap();
    let done = l.record(&write(35)).unwrap();
    done.whole();
    drop(done);
    std::mem::forget((whole, sending));
    l.die();
    drop(l);
    let second = Landing::open(dir.path(), true).unwrap();
    assert!(second.blanket.is_none(), "{:?}", second.blanket);
    let got: Vec<Write> = second.inherited.iter().map(|(w, _)| w.clone()).collect();
    assert_eq!(got, vec![write(33)]);
    // Still recorded (a death now inherits it again), until let go.
    assert_eq!(second.landing.taken(), 1);
    // A second process on the same directory is refused meanwhile.
    let err = Landing::open(dir.path(), true).err().unwrap();
    assert!(err.contains("another fencegate process"), "{err}");
    drop(second.inherited);
    assert_eq!(second.landing.taken(), 0);
    drop(second.landing);
    let third = Landing::open(dir.path(), true).unwrap();
    assert!(third.inherited.is_empty() && third.blanket.is_none());
}

/// A clean stop with a write still in flight leaves it too; with
/// nothing in flight, nothing.
#[test]
fn a_clean_stop_leaves_only_what_is_still_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let l = Landing::open(dir.path(), false).unwrap().landing;
    let r = l.record(&write(40)).unwrap();
    r.whole();
    drop(r);
    l.close().unwrap();
    drop(l);
    let next = Landing::open(dir.path(), true).unwrap();
    assert!(next.inherited.is_empty() && next.blanket.is_none());
    let r = next.landing.record(&write(41)).unwrap();
    r.whole();
    next.landing.close().unwrap();
    std::mem::forget(r);
    next.landing.die();
    drop(next.landing);
    let after = Landing::open(dir.path(), true).unwrap();
    assert_eq!(after.inherited.len(), 1);
    assert!(after.blanket.is_none());
}

/// What cannot be trusted makes a blanket start: a death on another
/// boot, a missing file beside existing fences, an overflow, and a
/// blanket start that died before its quarantine ended.
#[test]
fn what_cannot_be_trusted_is_a_blanket_start() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Landing::open(dir.path(), true).unwrap().blanket.is_some());
    // That start died during its quarantine: the next is blanket too.
    let again = Landing::open(dir.path(), true).unwrap();
    assert!(again.blanket.is_some());
    again.landing.blanket_over();
    drop(again);
    assert!(Landing::open(dir.path(), true).unwrap().blanket.is_none());
    // Another boot: rewrite the boot id the file holds.
    let l = Landing::open(dir.path(), true).unwrap().landing;
    l.put_bytes(H_BOOT, &[b'x'; BOOT_LEN]);
    drop(l);
    let other = Landing::open(dir.path(), true).unwrap();
    assert!(other.blanket.unwrap().contains("machine restarted"));
    other.landing.blanket_over();
    // Every slot taken: the next is recorded as lost.
    let l = other.landing;
    let all: Vec<Record> = (0..SLOTS).map(|_| l.record(&write(1)).unwrap()).collect();
    assert!(l.record(&write(2)).is_none());
    drop(all);
    drop(l);
    let over = Landing::open(dir.path(), true).unwrap();
    assert!(over.blanket.unwrap().contains("not all were recorded"));
    // A file that is not a record.
    drop(over.landing);
    std::fs::write(dir.path().join(FILE), b"something else").unwrap();
    assert!(Landing::open(dir.path(), true).unwrap().blanket.is_some());
}

/// The condition can be settled after the slot is taken, and a long
/// ETag is kept as unknown, which cannot be ordered.
#[test]
fn a_condition_settled_later_is_what_the_slot_says() {
    let dir = tempfile::tempdir().unwrap();
    let l = Landing::open(dir.path(), false).unwrap().landing;
    let mut w = write(5);
    w.sent = Sent::Plain;
    w.orderable = false;
    let r = l.record(&w).unwrap();
    r.sent(&Sent::IfNoneMatch, true);
    assert_eq!(r.write().sent, Sent::IfNoneMatch);
    assert!(r.write().orderable);
    r.sent(&Sent::IfMatch("x".repeat(ETAG_MAX + 1).into()), true);
    assert_eq!(r.write().sent, Sent::Plain);
    assert!(!r.write().orderable);
}

#[test]
fn hashes_are_stable_and_never_zero() {
    assert_eq!(fnv(1, b"b/k"), fnv(1, b"b/k"));
    assert_ne!(fnv(1, b"b/k"), fnv(2, b"b/k"));
    assert_ne!(fnv(1, b"b/k"), fnv(1, b"b/j"));
    assert_ne!(fnv(0, b""), 0);
}
