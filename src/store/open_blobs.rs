//! Blob files kept open for small reads, so that a GET of a small object
//! opens no file: an `open` and a `close` were a tenth of a 4 KiB GET's
//! CPU on the default setup (docs/benchmarks-log.md, "Below the signature
//! floor").
//!
//! A blob never changes once written and its id is never reused
//! (`blobs.rs`), so an open file of a blob always reads that blob's bytes.
//! What must not happen is a removed blob's space held by a file kept
//! here: `Blobs::remove` lets go of the file before it removes the name,
//! and a read only keeps a file while it holds the blob for reading
//! (`Blobs::hold_for_read`), which removal waits for.
//!
//! The number kept is bounded: at most [`MOST_KEPT`], and an eighth of the
//! process's limit on open files. A file that does not fit is used once
//! and closed, as before; when full, one kept file is let go for each new
//! one (whichever comes first in its shard: no order is kept).

use dashmap::DashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most blob files kept open.
pub const MOST_KEPT: usize = 1024;

pub struct OpenBlobs {
    files: DashMap<u128, Arc<File>>,
    kept: AtomicUsize,
    most: usize,
}

impl Default for OpenBlobs {
    fn default() -> OpenBlobs {
        OpenBlobs::with_room(MOST_KEPT.min(open_files_limit() / 8))
    }
}

impl OpenBlobs {
    pub fn with_room(most: usize) -> OpenBlobs {
        OpenBlobs {
            files: DashMap::new(),
            kept: AtomicUsize::new(0),
            most,
        }
    }

    /// Blob `id`'s file, kept or opened with `open` (and then kept when
    /// there is room, or room is made).
    pub fn get(
        &self,
        id: u128,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.files.get(&id) {
            return Ok(f.clone());
        }
        let file = Arc::new(open()?);
        if self.most == 0 {
            return Ok(file);
        }
        if self.kept.load(Ordering::Relaxed) >= self.most {
            self.let_go_of_one();
        }
        if self.files.insert(id, file.clone()).is_none() {
            self.kept.fetch_add(1, Ordering::Relaxed);
        }
        Ok(file)
    }

    /// Lets go of blob `id`'s file, if it is kept (before the blob is
    /// removed).
    pub fn forget(&self, id: u128) {
        if self.files.remove(&id).is_some() {
            self.kept.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// How many files are kept open.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    fn let_go_of_one(&self) {
        let victim = self.files.iter().next().map(|e| *e.key());
        if let Some(id) = victim {
            self.forget(id);
        }
    }
}

/// The process's soft limit on open files (1024 where it cannot be read).
fn open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, nothing else.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    match read {
        true => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        false => 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        path
    }

    /// A kept file is opened once; the number kept stays bounded; a
    /// forgotten one is opened again (and a removed file is not held).
    #[test]
    fn files_are_kept_bounded_and_let_go() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let open = OpenBlobs::with_room(2);
        let mut opened = 0;
        let paths: Vec<_> = (0..4)
            .map(|i| file_with(dir.path(), &format!("{i}"), &format!("blob {i}")))
            .collect();
        for round in 0..2 {
            for (i, path) in paths.iter().enumerate().take(2) {
                let f = (open.get(i as u128, || {
                    opened += 1;
                    File::open(path)
                }))
                .unwrap();
                let mut buf = [0u8; 6];
                f.read_exact_at(&mut buf, 0).unwrap();
                assert_eq!(&buf, format!("blob {i}").as_bytes(), "round {round}");
            }
        }
        assert_eq!(opened, 2, "kept files are not opened again");
        for (i, path) in paths.iter().enumerate().skip(2) {
            open.get(i as u128, || File::open(path)).unwrap();
            assert!(open.kept() <= 2);
        }
        open.forget(3);
        std::fs::remove_file(&paths[3]).unwrap();
        let again = open.get(3, || File::open(&paths[3]));
        assert!(again.is_err(), "a forgotten blob's file is opened again");
        assert!(open.kept() <= 2);
    }
}
