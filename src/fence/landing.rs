//! What may still land at the backend after this process is gone: a
//! record, in the data directory, of every write to a remote backend whose
//! whole body has left (CONTRACT §4, "It holds across fencegate's own
//! death"; docs/how-it-works.md, "When fencegate itself dies").
//!
//! A remote store may apply a request whose body it has after the process
//! that sent it was killed. The living process keeps such a write's place
//! in the ordering barrier until its answer is read; a restarted one must
//! know of it too, or it would forward a newer token at once, and the
//! older write could land after it. So every write is given a slot in
//! `<data_dir>/landing`, a file mapped into memory (`MAP_SHARED`): filled
//! when the write is admitted, marked whole just before its last body
//! bytes go, freed when its exchange is over. Writing it is a few stores
//! into memory, no system call. The pages belong to the kernel's page
//! cache, so they outlive the process (`kill -9`, the OOM killer); they
//! do not outlive the machine.
//!
//! At start the file says what the process before left:
//!
//! - it stopped cleanly (the file synced, then marked stopped), or it died
//!   on this same boot of the machine (`/proc/sys/kernel/random/boot_id`
//!   unchanged, so the page cache was never lost): its whole slots are
//!   exactly the writes that may still land, [`Opened::inherited`];
//! - anything else (the machine restarted since, the file missing from a
//!   data directory used before, more writes in flight than there were slots, or a
//!   start-up quarantine that had not ended): nobody knows what may land,
//!   and [`Opened::blanket`] says why. The caller then holds every newer
//!   token back for the quarantine.
//!
//! Slots name their resource and object by a 64-bit hash of the name
//! (seeded per file, kept across starts): two names that collide only make
//! one wait for the other's doubt.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The file's name in the data directory.
pub const FILE: &str = "landing";

/// Writes recorded at once at most; past that a write goes unrecorded
/// and the file says so (the next start, after a clean stop too, is then a
/// blanket one).
pub const SLOTS: usize = 32_768;

const MAGIC: &[u8; 8] = b"FGLAND01";
const HEADER: usize = 4096;
const SLOT: usize = 512;
const LEN: usize = HEADER + SLOTS * SLOT;

// Header fields (offsets).
const H_STATE: usize = 8;
const H_FLAGS: usize = 12;
const H_SEED: usize = 16;
const H_BOOT: usize = 24;
const BOOT_LEN: usize = 40;

const RUNNING: u32 = 1;
const STOPPED: u32 = 2;
const OVERFLOWED: u32 = 1;
const BLANKET: u32 = 2;

// Slot fields (offsets within a slot).
const S_STATE: usize = 0;
const S_WHAT: usize = 4;
const S_TOKEN: usize = 8;
const S_RESOURCE: usize = 16;
const S_OBJECT: usize = 24;
const S_ETAG_LEN: usize = 32;
const S_ETAG: usize = 33;
/// The longest ETag a slot keeps (a multipart one is 32 hex digits, a
/// dash and a count); a longer one is kept as unknown.
pub const ETAG_MAX: usize = 64;
const S_NAME_LEN: usize = 98;
const S_NAME: usize = 100;
/// The longest object name (`bucket/key`) a slot keeps; a write to a
/// longer one is kept without it (its doubt is then never probed).
pub const NAME_MAX: usize = SLOT - S_NAME;

const FREE: u32 = 0;
const SENDING: u32 = 1;
const WHOLE: u32 = 2;

// `what` bits.
const W_IF_MATCH: u32 = 1;
const W_IF_NONE_MATCH: u32 = 2;
const W_ORDERABLE: u32 = 4;
const W_TOKEN: u32 = 8;
const W_ALONE: u32 = 16;

/// The condition a write went to the backend with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// None: the backend applies it whatever the object is then.
    Plain,
    /// `If-Match: <etag>` (the bare ETag).
    IfMatch(Box<str>),
    /// `If-None-Match: *`.
    IfNoneMatch,
}

/// One write, as a slot records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Its fencing token, for a fenced write.
    pub token: Option<u64>,
    /// Its resource's hash ([`Landing::hash`]), 0 for none.
    pub resource: u64,
    /// Its object's hash, 0 for none (or several: DeleteObjects records
    /// one slot per key).
    pub object: u64,
    /// Its object's name (`bucket/key`), when a slot keeps it.
    pub name: Option<Box<str>>,
    pub sent: Sent,
    /// Whether the backend judges `sent` when it applies the write: a
    /// PutObject to a backend the probe found honouring both conditions.
    pub orderable: bool,
    /// Whether it held its object alone (a write with conditions of its
    /// own: `fence::hold`).
    pub alone: bool,
}

/// What the process before left, as [`Landing::open`] read it.
pub struct Opened {
    pub landing: Arc<Landing>,
    /// Writes whose whole body the backend may have and may still apply,
    /// each with the slot that keeps it recorded until it is let go.
    pub inherited: Vec<(Write, Record)>,
    /// Set when the file cannot say what may land: why.
    pub blanket: Option<String>,
}

/// The record file, mapped.
pub struct Landing {
    map: *mut u8,
    /// Which slots are taken (a bit each), in this process's memory.
    taken: Box<[AtomicU64]>,
    seed: u64,
    overflow_logged: std::sync::atomic::AtomicBool,
    _file: std::fs::File,
}

// SAFETY: the mapping lives as long as `Landing`; every slot is written
// only by the holder of its `taken` bit (or by `open`, before sharing),
// and the header only through atomics or before sharing.
unsafe impl Send for Landing {}
unsafe impl Sync for Landing {}

impl Drop for Landing {
    fn drop(&mut self) {
        // SAFETY: mapped in `open` with this length, unmapped once.
        unsafe { libc::munmap(self.map.cast(), LEN) };
    }
}

/// The machine's boot id: the same until it restarts (Linux). None where
/// there is none, which makes every unclean start a blanket one.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && id.len() <= BOOT_LEN).then(|| id.to_string())
}

/// A keyed FNV-1a: stable across processes and compiler versions (the
/// standard library's hasher is neither promised).
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Spread the last bytes into the high bits; never 0 ("none").
    h ^= h >> 29;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 32;
    h.max(1)
}

/// Opens (or makes) `path`, a file of the data directory `dir`, to read
/// and write, under an exclusive lock that lasts while it is open: a
/// second process on the same data directory is refused, and told why.
pub fn open_locked(dir: &Path, path: &Path) -> Result<std::fs::File, String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "another fencegate process uses the data directory {} (it holds {}): \
             each process needs a data directory of its own",
            dir.display(),
            path.display()
        ));
    }
    Ok(file)
}

impl Landing {
    /// Opens (or makes) `<dir>/landing`, reads what the process before
    /// left, and marks the file as this process's. `fences_exist`: whether
    /// the data directory was used before (its fence table, or a cluster
    /// replica's incarnation file, is there): a missing file is then a
    /// blanket start, as it may be a first start of a version without the
    /// record.
    pub fn open(dir: &Path, fences_exist: bool) -> Result<Opened, String> {
        let path = dir.join(FILE);
        let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
        let (mut landing, existed, old_len) = Landing::map_file(dir, &path)?;
        let boot = boot_id();
        let readable = existed && old_len == LEN as u64 && landing.bytes(0, 8) == MAGIC;
        let blanket = match (existed, readable) {
            (false, _) if fences_exist => Some(
                "no record of the writes in flight before this start (the first start of a \
                 version that keeps one, or the file was removed)"
                    .to_string(),
            ),
            (false, _) => None,
            (true, false) => Some(format!(
                "{} is not a record fencegate wrote",
                path.display()
            )),
            (true, true) => landing.why_unknown(boot.as_deref()),
        };
        let inherited = match (readable, &blanket) {
            (true, None) => landing.inherit(),
            _ => Vec::new(),
        };
        if readable {
            landing.seed = landing.u64_at(H_SEED).load(Ordering::Relaxed);
            // Slots not inherited are free from now on.
            landing.clear_other_slots(&inherited);
        } else {
            // A new record: no slot taken, a new seed. (A new file is all
            // zeros already.)
            // SAFETY: the mapping is LEN bytes and not shared yet.
            unsafe { std::ptr::write_bytes(landing.map, 0, HEADER) };
            if existed {
                landing.clear_other_slots(&[]);
            }
            landing.seed = rand::random::<u64>();
            landing.put_bytes(0, MAGIC);
            landing
                .u64_at(H_SEED)
                .store(landing.seed, Ordering::Relaxed);
        }
        let mut boot_field = [0u8; BOOT_LEN];
        if let Some(b) = &boot {
            boot_field[..b.len()].copy_from_slice(b.as_bytes());
        }
        landing.put_bytes(H_BOOT, &boot_field);
        let flags = if blanket.is_some() { BLANKET } else { 0 };
        landing.u32_at(H_FLAGS).store(flags, Ordering::Relaxed);
        landing.u32_at(H_STATE).store(RUNNING, Ordering::Release);
        landing.sync(0, LEN).map_err(|e| fail("cannot sync", e))?;
        let landing = Arc::new(landing);
        let inherited = inherited
            .into_iter()
            .map(|(slot, write)| {
                let record = Record {
                    landing: landing.clone(),
                    slot,
                };
                (write, record)
            })
            .collect();
        Ok(Opened {
            landing,
            inherited,
            blanket,
        })
    }

    /// Opens (or makes) the file at `path`, takes its lock (one process a
    /// record), sizes it and maps it. Also says whether it existed, and
    /// its length before.
    fn map_file(dir: &Path, path: &Path) -> Result<(Landing, bool, u64), String> {
        let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
        let existed = path.exists();
        // One process a record: a second on the same data directory must
        // not take the first one's slots for its predecessor's.
        let file = open_locked(dir, path)?;
        let old_len = file.metadata().map_err(|e| fail("cannot read", e))?.len();
        file.set_len(LEN as u64)
            .map_err(|e| fail("cannot size", e))?;
        // SAFETY: a shared read-write mapping of the whole (just sized)
        // file; checked for failure below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(fail("cannot map", std::io::Error::last_os_error()));
        }
        let landing = Landing {
            map: map.cast(),
            taken: (0..SLOTS / 64).map(|_| AtomicU64::new(0)).collect(),
            seed: 0,
            overflow_logged: Default::default(),
            _file: file,
        };
        Ok((landing, existed, old_len))
    }

    /// Why the slots of a readable file cannot be trusted, if they cannot.
    fn why_unknown(&self, boot: Option<&str>) -> Option<String> {
        let flags = self.u32_at(H_FLAGS).load(Ordering::Relaxed);
        let state = self.u32_at(H_STATE).load(Ordering::Acquire);
        let was = self.bytes(H_BOOT, BOOT_LEN);
        let was = std::str::from_utf8(was)
            .unwrap_or("")
            .trim_end_matches('\0');
        if flags & BLANKET != 0 {
            return Some("the start-up quarantine before this start had not ended".into());
        }
        if flags & OVERFLOWED != 0 {
            return Some(format!(
                "more than {SLOTS} writes were in flight at once before this start, \
                 and not all were recorded"
            ));
        }
        match state {
            STOPPED => None,
            RUNNING if boot.is_some_and(|b| b == was) => None,
            RUNNING => Some(
                "the machine restarted since the process before, which did not stop \
                 cleanly: what it had in flight may not have reached the disk"
                    .into(),
            ),
            _ => Some("the record's state is unknown".into()),
        }
    }

    /// The whole slots, which this process keeps taken.
    fn inherit(&self) -> Vec<(u32, Write)> {
        let mut out = Vec::new();
        for slot in 0..SLOTS as u32 {
            if self.slot_u32(slot, S_STATE).load(Ordering::Acquire) != WHOLE {
                continue;
            }
            self.taken[slot as usize / 64].fetch_or(1 << (slot % 64), Ordering::Relaxed);
            out.push((slot, self.read_slot(slot)));
        }
        out
    }

    fn read_slot(&self, slot: u32) -> Write {
        let what = self.slot_u32(slot, S_WHAT).load(Ordering::Relaxed);
        let etag_len = (self.bytes(self.slot_off(slot) + S_ETAG_LEN, 1)[0] as usize).min(ETAG_MAX);
        let etag = self.bytes(self.slot_off(slot) + S_ETAG, etag_len);
        let off = self.slot_off(slot);
        let name_len = u16::from_le_bytes([
            self.bytes(off + S_NAME_LEN, 1)[0],
            self.bytes(off + S_NAME_LEN + 1, 1)[0],
        ]) as usize;
        let name = std::str::from_utf8(self.bytes(off + S_NAME, name_len.min(NAME_MAX)))
            .ok()
            .filter(|n| !n.is_empty() && name_len <= NAME_MAX)
            .map(Box::from);
        let sent = if what & W_IF_MATCH != 0 {
            match std::str::from_utf8(etag) {
                Ok(e) if !e.is_empty() => Sent::IfMatch(e.into()),
                _ => Sent::Plain,
            }
        } else if what & W_IF_NONE_MATCH != 0 {
            Sent::IfNoneMatch
        } else {
            Sent::Plain
        };
        // An If-Match whose ETag was not kept cannot be ordered.
        let orderable = what & W_ORDERABLE != 0 && sent != Sent::Plain;
        Write {
            token: (what & W_TOKEN != 0)
                .then(|| self.slot_u64(slot, S_TOKEN).load(Ordering::Relaxed)),
            resource: self.slot_u64(slot, S_RESOURCE).load(Ordering::Relaxed),
            object: self.slot_u64(slot, S_OBJECT).load(Ordering::Relaxed),
            name,
            sent,
            orderable,
            alone: what & W_ALONE != 0,
        }
    }

    fn clear_other_slots(&self, kept: &[(u32, Write)]) {
        let mut keep = vec![false; SLOTS];
        for (slot, _) in kept {
            keep[*slot as usize] = true;
        }
        for slot in 0..SLOTS as u32 {
            let state = self.slot_u32(slot, S_STATE);
            if !keep[slot as usize] && state.load(Ordering::Relaxed) != FREE {
                state.store(FREE, Ordering::Relaxed);
            }
        }
    }

    /// The hash a slot names `name` (a resource or an object) by.
    pub fn hash(&self, name: &str) -> u64 {
        fnv(self.seed, name.as_bytes())
    }

    /// Marks the file as left by a clean stop: what is still in flight is
    /// synced, then the state. A start after it trusts the slots, unless
    /// this process ran out of them (then it is a blanket start).
    pub fn close(&self) -> std::io::Result<()> {
        self.sync(HEADER, LEN - HEADER)?;
        self.u32_at(H_STATE).store(STOPPED, Ordering::Release);
        self.sync(0, HEADER)
    }

    /// The start-up quarantine of a blanket start is over: the file no
    /// longer says so (synced, as its start was).
    pub fn blanket_over(&self) {
        self.u32_at(H_FLAGS).fetch_and(!BLANKET, Ordering::AcqRel);
        if let Err(e) = self.sync(0, HEADER) {
            tracing::warn!("landing record: syncing the end of the start-up quarantine: {e}");
        }
    }

    /// Lets go of the file's lock as a dead process does, for a test that
    /// leaves its records behind and starts again in the same process.
    #[cfg(test)]
    fn die(&self) {
        // SAFETY: flock on the descriptor this Landing owns.
        unsafe { libc::flock(self._file.as_raw_fd(), libc::LOCK_UN) };
    }

    /// Slots taken now (tests, metrics).
    pub fn taken(&self) -> usize {
        self.taken
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    fn sync(&self, off: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: a page-aligned range inside the mapping.
        let r = unsafe { libc::msync(self.map.add(off).cast(), len, libc::MS_SYNC) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn slot_off(&self, slot: u32) -> usize {
        HEADER + slot as usize * SLOT
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= LEN);
        // SAFETY: aligned (the mapping is page-aligned), inside the
        // mapping, and only ever accessed as this atomic.
        unsafe { &*self.map.add(off).cast::<AtomicU32>() }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= LEN);
        // SAFETY: as for `u32_at`.
        unsafe { &*self.map.add(off).cast::<AtomicU64>() }
    }

    fn slot_u32(&self, slot: u32, field: usize) -> &AtomicU32 {
        self.u32_at(self.slot_off(slot) + field)
    }

    fn slot_u64(&self, slot: u32, field: usize) -> &AtomicU64 {
        self.u64_at(self.slot_off(slot) + field)
    }

    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= LEN);
        // SAFETY: inside the mapping; bytes written only by the slot's
        // holder, who is not writing while it (or `open`) reads.
        unsafe { std::slice::from_raw_parts(self.map.add(off), len) }
    }

    fn put_bytes(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= LEN);
        // SAFETY: inside the mapping, in a slot (or header field) only
        // this caller writes now.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.add(off), data.len()) };
    }
}

mod record;
pub use record::Record;

#[cfg(test)]
mod tests;
