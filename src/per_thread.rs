//! Which serving thread the caller is: `i + 1` on the i-th (`workers` sets
//! it when the thread starts), 0 on any other thread. What every request
//! would otherwise write in one shared place (the upstream pool's list of
//! kept connections, the log's buffer) is a [`PerThread`]: one piece for
//! each serving thread, found by this number. A leaf module.

use std::cell::Cell;

/// Pieces of a [`PerThread`]: more serving threads than this share
/// pieces, modulo.
const PIECES: usize = 64;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Makes the calling thread use piece `i` (modulo the pieces) of every
/// [`PerThread`].
pub fn set(i: usize) {
    INDEX.with(|c| c.set(i % PIECES));
}

/// One `T` for each serving thread, and one for every other thread.
pub struct PerThread<T>(Box<[T]>);

impl<T: Default> Default for PerThread<T> {
    fn default() -> Self {
        PerThread((0..PIECES).map(|_| T::default()).collect())
    }
}

impl<T> PerThread<T> {
    /// The calling thread's piece.
    pub fn mine(&self) -> &T {
        &self.0[INDEX.with(Cell::get)]
    }

    /// Every thread's piece.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}
