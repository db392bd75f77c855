//! Where a background job stands, shared between the job and the entry of
//! the member it builds: the first stripe not yet passed (md's
//! recovery_offset, in stripes), and the rows past it already done out of
//! order. A rebuild takes the most endangered rows first (the rows that one
//! more failure would lose, jobs/rebuild.rs): those are in sync on the
//! member before the position reaches them, and writes to them must reach
//! it. Only the position is recorded in the superblocks; after a restart
//! the rows done ahead are simply done again.
//!
//! Data only: the request path asks [`Position::covers`] for every row it
//! touches on a member being built, so the rows ahead are bits read
//! without a lock, allocated when a job first marks one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

pub struct Position {
    below: AtomicU64,
    /// One bit per stripe: done ahead of `below`.
    ahead: OnceLock<Box<[AtomicU64]>>,
    /// The job has done every row that was at zero redundancy without the
    /// member (see `endangered_done`).
    endangered_done: AtomicBool,
}

impl Position {
    pub fn new(at: u64) -> Position {
        Position {
            below: AtomicU64::new(at),
            ahead: OnceLock::new(),
            endangered_done: AtomicBool::new(false),
        }
    }

    /// The first stripe not yet passed in order.
    pub fn load(&self, order: Ordering) -> u64 {
        self.below.load(order)
    }

    /// Moves the position. Moved back (a copy that starts over), the rows
    /// done ahead are forgotten with it: the job will do them again, and
    /// until then they are not in sync.
    pub fn store(&self, at: u64, order: Ordering) {
        let before = self.below.swap(at, order);
        if at < before {
            self.forget_ahead();
        }
    }

    /// Whether `stripe` is in sync on the member: passed, or done ahead.
    pub fn covers(&self, stripe: u64) -> bool {
        stripe < self.below.load(Ordering::SeqCst) || self.is_ahead(stripe)
    }

    /// Whether `stripe` was done ahead of the position.
    pub fn is_ahead(&self, stripe: u64) -> bool {
        let Some(words) = self.ahead.get() else {
            return false;
        };
        let Some(word) = words.get((stripe / 64) as usize) else {
            return false;
        };
        word.load(Ordering::SeqCst) & (1 << (stripe % 64)) != 0
    }

    /// Marks `stripe` done ahead, of an array of `stripes` stripes. Called
    /// under the stripe's lock once its rows are written, as the position
    /// moves: a writer waiting for the lock then sees it in sync.
    pub fn mark_ahead(&self, stripe: u64, stripes: u64) {
        assert!(stripe < stripes, "stripe {stripe} of {stripes}");
        let words = self.ahead.get_or_init(|| {
            (0..stripes.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect()
        });
        if let Some(word) = words.get((stripe / 64) as usize) {
            word.fetch_or(1 << (stripe % 64), Ordering::SeqCst);
        }
    }

    /// Rows done ahead of the position and not yet passed by it.
    pub fn ahead_count(&self) -> u64 {
        let below = self.below.load(Ordering::SeqCst);
        let Some(words) = self.ahead.get() else {
            return 0;
        };
        let first = (below / 64) as usize;
        let Some(partial) = words.get(first) else {
            return 0;
        };
        // The first word's bits below the position are passed.
        let kept = partial.load(Ordering::SeqCst) & (u64::MAX << (below % 64));
        let rest: u64 = words[first + 1..]
            .iter()
            .map(|w| w.load(Ordering::SeqCst).count_ones() as u64)
            .sum();
        kept.count_ones() as u64 + rest
    }

    /// Whether the member's rows that were at zero redundancy without it
    /// (when its rebuild started) are all rebuilt: what the time at zero
    /// redundancy asks of a member still being built (exposure.rs).
    pub fn endangered_done(&self) -> bool {
        self.endangered_done.load(Ordering::SeqCst)
    }

    pub fn set_endangered_done(&self) {
        self.endangered_done.store(true, Ordering::SeqCst);
    }

    fn forget_ahead(&self) {
        self.endangered_done.store(false, Ordering::SeqCst);
        if let Some(words) = self.ahead.get() {
            for word in words.iter() {
                word.store(0, Ordering::SeqCst);
            }
        }
    }
}

impl std::fmt::Debug for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Position({})", self.below.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_done_ahead_are_covered_until_the_position_moves_back() {
        let p = Position::new(10);
        assert!(p.covers(9) && !p.covers(10) && !p.covers(500));
        p.mark_ahead(500, 1000);
        p.mark_ahead(63, 1000);
        assert!(p.covers(500) && p.covers(63) && !p.covers(501) && !p.covers(64));
        assert_eq!(p.ahead_count(), 2);
        p.store(100, Ordering::SeqCst);
        assert!(p.covers(99) && p.covers(500) && !p.covers(100));
        assert_eq!(p.ahead_count(), 1);
        p.set_endangered_done();
        // A copy that starts over forgets what it did ahead.
        p.store(0, Ordering::SeqCst);
        assert!(!p.covers(500) && !p.covers(0) && !p.endangered_done());
        assert_eq!(p.ahead_count(), 0);
    }

    #[test]
    #[should_panic]
    fn a_row_past_the_end_is_refused() {
        Position::new(0).mark_ahead(10, 10);
    }
}
