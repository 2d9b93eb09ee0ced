//! Blob files: the bytes of objects and parts, one file each, named by a
//! random 128-bit id that is never reused (`blobs/<first 2 hex>/<32 hex>`).
//!
//! The 256 `<xx>` directories are made when the store opens, and their
//! entries made durable then (an fsync of `blobs/`), so a write never
//! makes a directory. A write streams its body into a new file, hashing
//! it as it goes, and makes the file durable (fsync) before the index may
//! point at it; the file's entry in its directory is made durable by the
//! commit (`commit.rs`), before the index commit. Until a commit points at
//! it, a new blob is held by a guard ([`FreshBlob`]) that removes it if the
//! write goes no further.
//!
//! A blob is never changed once written. A replaced or deleted object's
//! blobs are removed after the commit that let go of them, once no read
//! uses them and a few seconds have passed (a read registers the blobs it
//! will read right after it read the index), so a read that began before
//! the commit sees its bytes to the end. Files the index does not know (a
//! crash between the file and the commit, a removal that did not happen)
//! are collected at start-up.

use super::open_blobs::OpenBlobs;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Bytes a read hands out at a time.
const READ_CHUNK: usize = 256 * 1024;
/// Bytes gathered before a write to the file.
const WRITE_BUFFER: usize = 256 * 1024;

/// Why a blob could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// The request's body failed (the client left, a bad chunk...).
    Body(String),
    /// The disk is full.
    Full(std::io::Error),
    /// Any other I/O error.
    Io(std::io::Error),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> WriteError {
        if e.kind() == ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC) {
            WriteError::Full(e)
        } else {
            WriteError::Io(e)
        }
    }
}

/// How long an unused blob stays before it is removed (and then for as
/// long as a read uses it).
const REMOVAL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The blob directory.
#[derive(Clone)]
pub struct Blobs {
    root: PathBuf,
    /// Blobs being read, and by how many reads.
    readers: std::sync::Arc<dashmap::DashMap<u128, usize>>,
    /// Files of blobs read lately, for small reads (`open_blobs.rs`).
    open: std::sync::Arc<OpenBlobs>,
}

/// Blobs a read uses, until it is dropped.
pub struct Reading {
    readers: std::sync::Arc<dashmap::DashMap<u128, usize>>,
    ids: Vec<u128>,
}

impl Drop for Reading {
    fn drop(&mut self) {
        for id in &self.ids {
            self.readers.remove_if_mut(id, |_, n| {
                *n -= 1;
                *n == 0
            });
        }
    }
}

/// A fresh blob id.
pub fn new_id() -> u128 {
    rand::random::<u128>().max(1)
}

/// A blob a request writes, that no committed record points at yet. The
/// guard removes the file when it is dropped, so that no way out of a
/// write leaves it behind: an error, a body that does not match its
/// digests, a refused commit, or the request's future dropped on the way
/// (a client that left). Once a step that points at the blob has gone to
/// the commit thread, the guard must leave the file be: see
/// `Store::commit_fresh`. (A file that a dropped write makes after its
/// guard is gone, as tokio finishes a file operation on a blocking thread
/// of its own, is left to the start-up collection.)
#[must_use = "dropping the guard removes the blob"]
pub struct FreshBlob {
    blobs: Blobs,
    id: u128,
    /// Whether dropping the guard removes the file.
    remove: bool,
}

impl FreshBlob {
    pub fn id(&self) -> u128 {
        self.id
    }

    /// A step that points at the blob goes to the commit thread: from now
    /// on, dropping the guard leaves the file.
    pub fn committing(&mut self) {
        self.remove = false;
    }

    /// The commit refused the step: nothing points at the blob, and the
    /// guard removes it now.
    pub fn refused(mut self) {
        self.remove = true;
    }
}

impl Drop for FreshBlob {
    fn drop(&mut self) {
        if self.remove {
            self.blobs.remove(self.id);
        }
    }
}

impl Blobs {
    /// The blob directory `root`, with its 256 `<xx>` directories made (if
    /// they are not there yet) and `root` fsynced, so that their entries
    /// are durable before any blob goes in them.
    pub fn open(root: PathBuf) -> std::io::Result<Blobs> {
        for first in 0..=u8::MAX {
            std::fs::create_dir_all(root.join(format!("{first:02x}")))?;
        }
        sync_dir(&root)?;
        Ok(Blobs {
            root,
            readers: Default::default(),
            open: Default::default(),
        })
    }

    /// A new blob, under a guard that removes its file (see [`FreshBlob`]).
    pub fn fresh(&self) -> FreshBlob {
        FreshBlob {
            blobs: self.clone(),
            id: new_id(),
            remove: true,
        }
    }

    /// Marks `ids` as being read until the guard is dropped.
    pub fn hold_for_read(&self, ids: Vec<u128>) -> Reading {
        for id in &ids {
            *self.readers.entry(*id).or_default() += 1;
        }
        Reading {
            readers: self.readers.clone(),
            ids,
        }
    }

    /// Removes `ids` (blobs no record points at any more) after the grace
    /// period, and only once no read uses them.
    pub fn remove_later(&self, ids: Vec<u128>) {
        if ids.is_empty() {
            return;
        }
        let blobs = self.clone();
        tokio::spawn(async move {
            let mut left = ids;
            while !left.is_empty() {
                tokio::time::sleep(REMOVAL_GRACE).await;
                left.retain(|id| {
                    let busy = blobs.readers.contains_key(id);
                    if !busy {
                        blobs.remove(*id);
                    }
                    busy
                });
            }
        });
    }

    fn dir_of(&self, id: u128) -> PathBuf {
        self.root.join(format!("{:02x}", (id >> 120) as u8))
    }

    pub fn path_of(&self, id: u128) -> PathBuf {
        self.dir_of(id).join(format!("{id:032x}"))
    }

    /// Writes `body` into blob `id`, passing every piece to `see` (the
    /// hashes), and makes the file durable. A failure removes the file.
    pub async fn write<S, E>(
        &self,
        id: u128,
        mut body: S,
        mut see: impl FnMut(&[u8]),
    ) -> Result<u64, WriteError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let path = self.path_of(id);
        let result = async {
            let mut file = tokio::fs::File::create(&path).await?;
            let mut buf = BytesMut::with_capacity(WRITE_BUFFER);
            let mut len = 0u64;
            while let Some(piece) = body.next().await {
                let piece = piece.map_err(|e| WriteError::Body(e.to_string()))?;
                see(&piece);
                len += piece.len() as u64;
                buf.extend_from_slice(&piece);
                if buf.len() >= WRITE_BUFFER {
                    file.write_all(&buf).await?;
                    buf.clear();
                }
            }
            file.write_all(&buf).await?;
            file.sync_all().await?;
            Ok(len)
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&path).await;
        }
        result
    }

    /// Makes the directory entries of these blobs durable.
    pub fn sync_dirs(&self, ids: impl IntoIterator<Item = u128>) -> std::io::Result<()> {
        let mut dirs: Vec<PathBuf> = ids.into_iter().map(|id| self.dir_of(id)).collect();
        dirs.sort();
        dirs.dedup();
        for d in dirs {
            sync_dir(&d)?;
        }
        Ok(())
    }

    /// Removes blob `id` (best effort: a file left behind is collected at
    /// the next start), letting go of its file first if it is kept open.
    pub fn remove(&self, id: u128) {
        self.open.forget(id);
        if let Err(e) = std::fs::remove_file(self.path_of(id))
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(blob = format!("{id:032x}"), "removing a blob: {e}");
        }
    }

    /// The bytes `[start, end)` of the blob segments `(id, offset, len)`
    /// laid end to end, as a stream of pieces.
    pub fn stream_range(
        &self,
        segments: impl IntoIterator<Item = (u128, u64, u64)>,
        start: u64,
        end: u64,
    ) -> Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send + Sync>> {
        let pieces: Vec<_> = pieces(segments, start, end)
            .map(|(id, from, len)| (self.path_of(id), from, len))
            .collect();
        let stream = futures_util::stream::iter(pieces)
            .flat_map(|(path, from, len)| read_file(path, from, len));
        Box::pin(stream)
    }

    /// Removes every blob file older than `before` that `live` does not
    /// know. Returns how many it removed.
    pub fn collect_garbage(
        &self,
        before: std::time::SystemTime,
        live: impl Fn(u128) -> Result<bool, String>,
    ) -> Result<u64, String> {
        let mut removed = 0;
        let Ok(dirs) = std::fs::read_dir(&self.root) else {
            return Ok(0);
        };
        for dir in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(dir.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                let Some(id) = name.to_str().and_then(|n| u128::from_str_radix(n, 16).ok()) else {
                    continue;
                };
                let old = f
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m < before);
                if old && !live(id)? {
                    let _ = std::fs::remove_file(f.path());
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

impl Blobs {
    /// The bytes `[start, end)` of the segments, as [`Blobs::stream_range`] streams
    /// them, read at once on this thread: for the few bytes of a small
    /// read, on a thread that may block. The files stay open for the next
    /// read (`open_blobs.rs`): the caller holds the blobs for reading.
    pub fn read_now(
        &self,
        segments: impl IntoIterator<Item = (u128, u64, u64)>,
        start: u64,
        end: u64,
    ) -> std::io::Result<Bytes> {
        use std::os::unix::fs::FileExt;
        let mut out = BytesMut::zeroed((end - start) as usize);
        let mut filled = 0usize;
        for (id, from, len) in pieces(segments, start, end) {
            let n = len as usize;
            let file = (self.open).get(id, || std::fs::File::open(self.path_of(id)))?;
            file.read_exact_at(&mut out[filled..filled + n], from)?;
            filled += n;
        }
        Ok(out.freeze())
    }
}

/// Each segment's part of `[start, end)` of the segments `(id, offset,
/// len)` laid end to end: `(id, where in its file, how much)`, the empty
/// parts left out.
fn pieces(
    segments: impl IntoIterator<Item = (u128, u64, u64)>,
    start: u64,
    end: u64,
) -> impl Iterator<Item = (u128, u64, u64)> {
    let mut at = 0u64;
    segments.into_iter().filter_map(move |(id, offset, len)| {
        let (from, to) = (start.max(at), end.min(at + len));
        let piece = (from < to).then(|| (id, offset + from - at, to - from));
        at += len;
        piece
    })
}

/// Makes the entries of directory `dir` durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// `len` bytes of `path` from `from`, in pieces.
fn read_file(path: PathBuf, from: u64, len: u64) -> impl Stream<Item = std::io::Result<Bytes>> {
    futures_util::stream::try_unfold(
        (None::<tokio::fs::File>, path, from, len),
        |(file, path, at, left)| async move {
            if left == 0 {
                return Ok(None);
            }
            let mut file = match file {
                Some(f) => f,
                None => open_at(&path, at).await?,
            };
            let n = left.min(READ_CHUNK as u64) as usize;
            let mut buf = BytesMut::zeroed(n);
            file.read_exact(&mut buf).await?;
            Ok(Some((
                buf.freeze(),
                (Some(file), path, at + n as u64, left - n as u64),
            )))
        },
    )
}

async fn open_at(path: &Path, at: u64) -> std::io::Result<tokio::fs::File> {
    let mut f = tokio::fs::File::open(path).await?;
    if at > 0 {
        f.seek(std::io::SeekFrom::Start(at)).await?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn written_blobs_read_back_by_any_range_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(dir.path().to_path_buf()).unwrap();
        let (a, b) = (new_id(), new_id());
        let pieces = |s: &'static [u8]| {
            futures_util::stream::iter(s.chunks(3).map(|c| Ok::<_, String>(Bytes::from_static(c))))
        };
        let mut seen = Vec::new();
        let n = blobs
            .write(a, pieces(b"0123456789"), |p| seen.extend_from_slice(p))
            .await
            .unwrap();
        assert_eq!((n, &seen[..]), (10, &b"0123456789"[..]));
        blobs.write(b, pieces(b"abcdef"), |_| {}).await.unwrap();
        blobs.sync_dirs([a, b]).unwrap();
        // "2345678" of a, then "bcd" of b (a segment from offset 1).
        let segments = vec![(a, 2, 7), (b, 1, 3)];
        for (start, end, want) in [
            (0, 10, "2345678bcd"),
            (5, 8, "78b"),
            (9, 10, "d"),
            (3, 3, ""),
        ] {
            let got: Vec<Bytes> = blobs
                .stream_range(segments.clone(), start, end)
                .map(|r| r.unwrap())
                .collect()
                .await;
            assert_eq!(got.concat(), want.as_bytes(), "{start}..{end}");
            let now = blobs
                .read_now(segments.iter().copied(), start, end)
                .unwrap();
            assert_eq!(&now[..], want.as_bytes(), "read_now {start}..{end}");
        }
        // A body that fails leaves no file.
        let c = new_id();
        let failing =
            futures_util::stream::iter([Ok(Bytes::from_static(b"x")), Err("cut".to_string())]);
        assert!(matches!(
            blobs.write(c, failing, |_| {}).await,
            Err(WriteError::Body(_))
        ));
        assert!(!blobs.path_of(c).exists());
        // Garbage: a file the index does not know.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
        let removed = blobs.collect_garbage(later, |id| Ok(id == a)).unwrap();
        assert_eq!(removed, 1);
        assert!(blobs.path_of(a).exists() && !blobs.path_of(b).exists());
    }
}
