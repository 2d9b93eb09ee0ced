//! Which serving thread the caller is: `i + 1` on the i-th (`workers` sets
//! it when the thread starts), 0 on any other thread. What every request
//! would otherwise write in one shared place (the upstream pool's list of
//! kept connections, the log's buffer) is kept in [`LISTS`] pieces, one
//! for each serving thread, found by this number. A leaf module.

use std::cell::Cell;

/// Pieces of a per-thread thing: more serving threads than this share
/// pieces, modulo.
pub const LISTS: usize = 64;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Makes the calling thread use piece `i` (modulo [`LISTS`]).
pub fn set(i: usize) {
    INDEX.with(|c| c.set(i % LISTS));
}

/// The calling thread's piece: below [`LISTS`].
pub fn index() -> usize {
    INDEX.with(Cell::get)
}
