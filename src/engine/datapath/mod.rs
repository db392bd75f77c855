//! The write of a row, in three rooms: `plan` decides it from the row's
//! shape alone (a pure function, tested on every small shape), `row` gives
//! the plan its buffers and holds its steps, and `execute` runs 1..N rows
//! (the single write and the stripe worker's batched round alike). The
//! request path above (`engine/datapath/io.rs`) splits a request into rows; the
//! members below are reached through the view of the member table each
//! row was planned on.

pub(super) mod cache;
pub(super) mod execute;
pub(super) mod failure;
pub(super) mod io;
pub(super) mod locks;
pub(super) mod paritycache;
pub(super) mod plan;
pub(super) mod readcache;
pub(super) mod row;
pub(super) mod staged;
pub(super) mod stripes;

use crate::geometry::StripeMap;
use crate::parity::{self, Syndrome};
use crate::units::SECTOR_BYTES;
use execute::{Row, RowOutcome};
use failure::PathError;
use io::{Piece, View};
use locks::StripeLocks;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Stripe lock slots; a power of two, sized for many concurrent requests.
const STRIPE_LOCK_SLOTS: usize = 4096;

/// What the row-level request path keeps between requests: its locks,
/// caches, workers and counters. Requests (reads, writes, staged writes,
/// the stripe cache's write-out) are its users; the control plane (jobs,
/// membership, tuning, shutdown) reaches in only to lock a row, drop or
/// report what is cached, or start and stop the workers. None of it is
/// on disk: it starts empty, and a stop leaves nothing of it behind.
pub(crate) struct Datapath {
    /// The stripe locks a row's write (or reconstructing read) holds, so
    /// that its data and parity updates never interleave with another's;
    /// the jobs take the same locks for the rows they rewrite.
    pub(in crate::engine) locks: StripeLocks,
    /// The parity arithmetic of every row's write and reconstruction, the
    /// one implementation chosen for the process (`parity::default_impl`).
    pub(in crate::engine) syndrome: &'static dyn Syndrome,
    /// Where partial-stripe writes gather (and wait, with write-back).
    pub(in crate::engine) cache: Arc<cache::StripeCache>,
    /// Stripe-cache worker threads started so far.
    pub(in crate::engine) cache_workers: Mutex<usize>,
    /// The threads that do the parity work of writes (group_thread_cnt).
    pub(in crate::engine) stripes: Arc<stripes::StripeWorkers>,
    /// Read-ahead and cached reads.
    pub(in crate::engine) reads: readcache::ReadCache,
    /// The shape of a row, the same for every stripe of the geometry: kept
    /// so that the request path need not build a stripe map to learn it.
    pub(in crate::engine) row: RowShape,
    /// Parity pages a write just computed, for the next read-modify-write.
    pub(in crate::engine) parity_cache: paritycache::ParityCache,
    /// How the rows of staged writes were written.
    pub(in crate::engine) staged_rows: staged::StagedRows,
    /// The members' largest logical block (see `check_aligned`); 4 KiB at
    /// least with a journal, which logs whole pages.
    pub(in crate::engine) block_bytes: AtomicU32,
    /// Reads in flight on each role, for choosing among a mirror's copies
    /// (`MemberTable::pick_copy`).
    pub(in crate::engine) pending_reads: Arc<[AtomicU32]>,
    /// Foreground requests served: the background job yields while it moves.
    pub(in crate::engine) foreground_ios: AtomicU64,
}

/// What every row of the geometry has in common.
#[derive(Clone, Copy, Debug)]
pub(in crate::engine) struct RowShape {
    pub(in crate::engine) strip_bytes: usize,
    pub(in crate::engine) data_strips: usize,
}

impl Datapath {
    /// The request path of an array starting to serve: rows shaped as
    /// `first`, requests aligned to `member_block_bytes` (a page at least
    /// with a journal), a read counter for each of `roles`, and nothing
    /// cached, locked or started yet.
    pub(in crate::engine) fn new(
        first: &StripeMap,
        member_block_bytes: u32,
        journaled: bool,
        roles: usize,
    ) -> Datapath {
        let row = RowShape {
            strip_bytes: (first.strip_sectors * SECTOR_BYTES) as usize,
            data_strips: first.data.len(),
        };
        let block_bytes = if journaled {
            member_block_bytes.max(crate::format::journal::BLOCK_BYTES as u32)
        } else {
            member_block_bytes
        };
        Datapath {
            locks: StripeLocks::new(STRIPE_LOCK_SLOTS),
            syndrome: parity::default_impl(),
            foreground_ios: AtomicU64::new(0),
            pending_reads: (0..roles).map(|_| AtomicU32::new(0)).collect(),
            cache: Arc::new(cache::StripeCache::new()),
            cache_workers: Mutex::new(0),
            stripes: Arc::new(stripes::StripeWorkers::new()),
            reads: readcache::ReadCache::new(),
            row,
            block_bytes: AtomicU32::new(block_bytes),
            parity_cache: paritycache::ParityCache::new(),
            staged_rows: staged::StagedRows::default(),
        }
    }

    /// The caches' occupancy and counters: the stripe cache's (held to
    /// `stripe_cache_size`), read-ahead's, hot parity's and the stripe
    /// workers'.
    pub(in crate::engine) fn cache_report(&self, stripe_cache_size: usize) -> cache::CacheReport {
        let mut report = self.cache.report(stripe_cache_size);
        report.read_hits = self.reads.hits.load(Ordering::Relaxed);
        report.read_misses = self.reads.misses.load(Ordering::Relaxed);
        report.read_cached_bytes = self.reads.held_bytes() as u64;
        report.parity_hits = self.parity_cache.hits.load(Ordering::Relaxed);
        report.parity_misses = self.parity_cache.misses.load(Ordering::Relaxed);
        report.stripe_workers = self.stripes.active();
        report.stripe_rounds = self.stripes.rounds.load(Ordering::Relaxed);
        report.stripe_rows = self.stripes.rows.load(Ordering::Relaxed);
        report.stripe_rows_alone = self.stripes.rows_alone.load(Ordering::Relaxed);
        report
    }

    /// Forgets what was read and the hot parity (what is dropped is only
    /// read again): for a drop of caches, and for bounds that changed.
    pub(in crate::engine) fn forget_reads(&self) {
        self.reads.clear();
        self.parity_cache.clear();
    }
}

impl View<'_> {
    /// Writes one piece of a row, the caller holding the row's lock.
    /// `prefetch`: see [`View::plan_write`]. A failed read comes back as
    /// the member's failure, for the caller to correct.
    pub(in crate::engine) fn write_piece(
        &self,
        piece: &Piece,
        prefetch: bool,
    ) -> Result<(), PathError> {
        let write = self.plan_write(piece, prefetch)?;
        let rows = vec![Row { view: self, write }];
        match self.engine.run_rows(rows).pop() {
            Some(RowOutcome::Written(result)) => result.map_err(PathError::Array),
            Some(RowOutcome::Unread(e)) => Err(e),
            Some(RowOutcome::Unlogged) | None => {
                unreachable!("a row alone is the first of its commit")
            }
        }
    }
}
