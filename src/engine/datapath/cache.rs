//! The stripe cache: where partial-stripe writes wait to become full ones.
//!
//! A write that covers part of a stripe row costs reads (read-modify-write
//! or reconstruct-write); the same bytes written as part of a whole row cost
//! none. md gathers writes in its stripe cache for that reason, and seed 001
//! shows what its size is worth. Here a *batch* holds the new bytes of one
//! row until the row is whole, or until waiting stops paying:
//!
//! - write-through: a partial write to a row joins the row's batch when the
//!   writes look sequential (or a batch is already open); its writer waits
//!   until the row is whole, the deadline passes, or every write in flight
//!   is already waiting in a batch (nothing more is coming, as md unplugs).
//!   Only then is the batch written, once, and every writer answered.
//! - write-back: every write joins a batch and is acknowledged at once; the
//!   cache's worker threads (group_thread_cnt) write batches out when the
//!   row is whole, when they have waited long enough, when the array goes
//!   idle, and at every FLUSH or FUA. Reads see bytes still in batches.
//!
//! Memory is bounded by stripe_cache_size in md's units: a batch for a row
//! of strips `S` bytes deep takes S/4 KiB entries (md's stripe_head holds
//! one 4 KiB page of every member). When the cache is full a write goes
//! straight to the members, as before. Batches live in hashed shards, so no
//! lock is global.
//!
//! Ordering: while a row has a batch, every write to the row goes through
//! it (copied in arrival order), and a batch being written out stays
//! visible until it is on the members; a write that finds it so waits for
//! it first. So a later write never lands under an earlier one.

use crate::engine::tuning::STRIPE_CACHE_PAGE;
use crate::member::AlignedBuf;
use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shards of the batch table: a power of two, well above the thread count.
const SHARDS: usize = 64;
/// How long a write-through batch waits for its row to fill after the last
/// write joined it: a stream's next writes come once its earlier ones are
/// answered, which takes as long as writing a row.
pub(in crate::engine) const GATHER_DEADLINE: Duration = Duration::from_millis(10);
/// How long a write-through batch may wait in all.
const GATHER_CAP: Duration = Duration::from_millis(100);
/// How long write-back leaves a partial row in memory before writing it.
const WRITE_BACK_DELAY: Duration = Duration::from_millis(50);
/// How often waiting writers and the workers look again.
const POLL: Duration = Duration::from_micros(200);
/// How long no new write must have arrived before waiting writers decide
/// that nothing more is coming, when the client has fewer writes in flight
/// than it had lately (its next ones may be on their way).
const ARRIVAL_GRACE: Duration = Duration::from_millis(5);
/// How long the most writes seen in flight at once is remembered: the
/// client's queue depth, as far as the engine can tell.
const PEAK_WINDOW_US: u64 = 200_000;
/// Recent write ends remembered to tell sequential writes.
const RECENT: usize = 32;
/// The top bit of a recent end: its write continued an earlier one.
const CONTINUED: u64 = 1 << 63;

pub(in crate::engine) struct Batch {
    pub(in crate::engine) stripe: u64,
    state: Mutex<BatchState>,
    changed: Condvar,
}

struct BatchState {
    /// The row's data bytes, written where `covered` says. Page aligned,
    /// as O_DIRECT members take them: a row written out goes to the
    /// members from here without a bounce copy.
    buf: Arc<AlignedBuf>,
    /// Disjoint, sorted byte ranges of `buf` holding new data.
    covered: Vec<Range<usize>>,
    created: Instant,
    last_join: Instant,
    /// Taken for writing out: no more joins.
    closed: bool,
    /// Set when written out; then the batch leaves the table.
    result: Option<Result<(), String>>,
    /// Someone wants it written now (FUA, FLUSH).
    urgent: bool,
    /// What keeps the journal's copy of the batch's data (write-back with a
    /// journal): held until the batch is on the members.
    holds: Vec<Hold>,
    /// Every write in it came with a hold: its data is in the journal.
    logged: bool,
}

/// Keeps something alive while a batch holds bytes (the journal units
/// that logged them); dropped once the batch is on the members.
pub(in crate::engine) type Hold = Arc<dyn Send + Sync>;

/// Logs a write's data before the cache acknowledges it (write-back with a
/// journal): a hold on what was logged, or None when the journal has no
/// room for it (the write then goes through).
pub(in crate::engine) type LogData<'a> = dyn Fn() -> io::Result<Option<Hold>> + 'a;

/// Writes a closed batch's covered ranges (of its row's data, `buf`) to
/// the members: the engine's side of a destage.
pub(in crate::engine) type Destage<'a> =
    dyn Fn(&Batch, &[Range<usize>], &[u8]) -> io::Result<()> + 'a;

/// One of the cache's shards: the open batches of the rows that hash to it.
type Shard = Mutex<HashMap<u64, Arc<Batch>>>;

impl BatchState {
    fn full(&self) -> bool {
        self.covered.len() == 1 && self.covered[0] == (0..self.buf.len())
    }

    fn add(&mut self, at: usize, bytes: &[u8]) {
        let buf = Arc::get_mut(&mut self.buf).expect("an open batch's buffer is not shared");
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        let mut new = at..at + bytes.len();
        let mut merged = Vec::with_capacity(self.covered.len() + 1);
        for r in self.covered.drain(..) {
            if r.end < new.start || r.start > new.end {
                merged.push(r);
            } else {
                new = r.start.min(new.start)..r.end.max(new.end);
            }
        }
        merged.push(new);
        merged.sort_by_key(|r| r.start);
        self.covered = merged;
    }
}

/// The stripe cache's state and counters since start.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CacheReport {
    /// Entries (md's units) held by batches, and stripe_cache_size.
    pub entries_in_use: usize,
    pub capacity: usize,
    /// Rows waiting in the cache now.
    pub batches: usize,
    /// Rows written whole (no reads) and in part.
    pub full_rows: u64,
    pub partial_rows: u64,
    /// Writes that went through the cache, and partial-row writes that
    /// went straight to the members.
    pub gathered_writes: u64,
    pub direct_writes: u64,
    /// Reads served from memory (read-ahead, read cache) and from members.
    #[serde(default)]
    pub read_hits: u64,
    #[serde(default)]
    pub read_misses: u64,
    /// Bytes held for reads.
    #[serde(default)]
    pub read_cached_bytes: u64,
    /// Read-modify-writes that found their old parity hot, and those that
    /// read it.
    #[serde(default)]
    pub parity_hits: u64,
    #[serde(default)]
    pub parity_misses: u64,
    /// Stripe workers serving (group_thread_cnt), the rounds they ran, the
    /// rows written in them, and the rows of those that needed the one-row
    /// path (a member missing, a read error, several parts).
    #[serde(default)]
    pub stripe_workers: usize,
    #[serde(default)]
    pub stripe_rounds: u64,
    #[serde(default)]
    pub stripe_rows: u64,
    #[serde(default)]
    pub stripe_rows_alone: u64,
}

impl Batch {
    /// Whether every byte in the batch is in the journal already.
    pub(in crate::engine) fn logged(&self) -> bool {
        lock(&self.state).logged
    }

    /// Whether a FUA write is in it: its write-out carries FUA. Read once
    /// the batch is closed, when no write joins it any more.
    pub(in crate::engine) fn urgent(&self) -> bool {
        lock(&self.state).urgent
    }

    /// Waits, holding `state` of this batch, until it is written out.
    fn written<'a>(&self, mut state: MutexGuard<'a, BatchState>) -> MutexGuard<'a, BatchState> {
        while state.result.is_none() {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state
    }
}

/// What happened to a write offered to the cache.
pub(in crate::engine) enum Offer {
    /// Not taken: write it to the members now.
    Direct,
    /// Taken; the result is final (acknowledged from cache, or written).
    Done(io::Result<()>),
}

#[derive(Default)]
pub struct CacheStats {
    /// Batches written as whole rows: no reads.
    pub full_rows: AtomicU64,
    /// Batches written as partial rows.
    pub partial_rows: AtomicU64,
    /// Writes that went into a batch.
    pub gathered_writes: AtomicU64,
    /// Partial-row writes that went straight to the members.
    pub direct_writes: AtomicU64,
}

pub(in crate::engine) struct StripeCache {
    shards: Box<[Shard]>,
    /// Entries (md's units) held by batches.
    entries_in_use: AtomicUsize,
    batches: AtomicUsize,
    /// Writes inside the engine now, and how many of them wait in batches.
    writes_in_flight: AtomicUsize,
    writes_waiting: AtomicUsize,
    recent_ends: [AtomicU64; RECENT],
    recent_next: AtomicUsize,
    /// When the last write arrived, in µs since `epoch`.
    last_arrival_us: AtomicU64,
    /// The most writes in flight at once lately, and since when.
    peak_in_flight: AtomicUsize,
    peak_since_us: AtomicU64,
    epoch: Instant,
    /// Wakes the workers when write-back batches appear.
    wake: (Mutex<()>, Condvar),
    pub(in crate::engine) stop: AtomicBool,
    pub(in crate::engine) stats: CacheStats,
}

/// Counts a write in flight for as long as it lives.
pub(in crate::engine) struct InFlight<'a>(&'a StripeCache);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StripeCache {
    pub(in crate::engine) fn new() -> StripeCache {
        StripeCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            entries_in_use: AtomicUsize::new(0),
            batches: AtomicUsize::new(0),
            writes_in_flight: AtomicUsize::new(0),
            writes_waiting: AtomicUsize::new(0),
            recent_ends: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            recent_next: AtomicUsize::new(0),
            last_arrival_us: AtomicU64::new(0),
            peak_in_flight: AtomicUsize::new(0),
            peak_since_us: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: (Mutex::new(()), Condvar::new()),
            stop: AtomicBool::new(false),
            stats: CacheStats::default(),
        }
    }

    fn shard(&self, stripe: u64) -> &Shard {
        let hash = stripe.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        &self.shards[hash as usize & (SHARDS - 1)]
    }

    /// Notes a write of `len` bytes at `offset` arriving; says whether it
    /// is worth gathering: it continues a write seen recently (a sequential
    /// stream) and others are in flight (a lone writer at queue depth 1
    /// would only wait for itself).
    pub(in crate::engine) fn write_arrives(&self, offset: u64, len: usize) -> (InFlight<'_>, bool) {
        let before = self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        let others = before > 0;
        let now_us = self.epoch.elapsed().as_micros() as u64;
        self.last_arrival_us.store(now_us, Ordering::SeqCst);
        if now_us.saturating_sub(self.peak_since_us.load(Ordering::SeqCst)) > PEAK_WINDOW_US {
            self.peak_since_us.store(now_us, Ordering::SeqCst);
            self.peak_in_flight.store(before + 1, Ordering::SeqCst);
        } else {
            self.peak_in_flight.fetch_max(before + 1, Ordering::SeqCst);
        }
        // Requests of one stream reach the engine slightly out of order
        // (several threads take them), so "continues" means "starts within
        // a few of its own lengths of where a recent write ended". A write
        // is sequential when it continues one that itself continued
        // another: on a small array one random write in a few hundred
        // lands near a recent one by chance, and a batch it opened would
        // hold it (and its thread) for the whole gather deadline, as no
        // other write comes to join it; three in a row by chance are
        // rarer than that by as much again.
        let reach = 8 * len as u64;
        let (mut continues, mut sequential) = (false, false);
        for e in &self.recent_ends {
            let recent = e.load(Ordering::Relaxed);
            let end = recent & !CONTINUED;
            if recent != u64::MAX && end.abs_diff(offset) <= reach {
                continues = true;
                sequential |= others && recent & CONTINUED != 0;
            }
        }
        let end = offset + len as u64;
        assert!(end & CONTINUED == 0, "array offsets stay below 2^63");
        let slot = self.recent_next.fetch_add(1, Ordering::Relaxed) % RECENT;
        self.recent_ends[slot].store(
            if continues { end | CONTINUED } else { end },
            Ordering::Relaxed,
        );
        (InFlight(self), sequential)
    }

    /// Whether any batch exists (reads need not look otherwise).
    pub(in crate::engine) fn has_batches(&self) -> bool {
        self.batches.load(Ordering::SeqCst) > 0
    }

    /// The cache's counters, for status and benchmarks.
    pub(in crate::engine) fn report(&self, capacity: usize) -> CacheReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheReport {
            entries_in_use: self.entries_in_use.load(Ordering::SeqCst),
            capacity,
            full_rows: get(&self.stats.full_rows),
            partial_rows: get(&self.stats.partial_rows),
            gathered_writes: get(&self.stats.gathered_writes),
            direct_writes: get(&self.stats.direct_writes),
            batches: self.batches.load(Ordering::SeqCst),
            // The engine fills in the counters of the other caches.
            ..CacheReport::default()
        }
    }

    /// Offers the part of a write that falls in one row.
    ///
    /// `row_bytes` is the row's data size, `entries` what a batch for it
    /// costs in md's units, `capacity` stripe_cache_size. `destage` writes
    /// a closed batch's covered ranges to the members.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) fn offer(
        &self,
        stripe: u64,
        row_bytes: usize,
        at: usize,
        bytes: &[u8],
        gather: bool,
        write_back: bool,
        fua: bool,
        entries: usize,
        capacity: usize,
        log: Option<&LogData>,
        destage: &Destage,
    ) -> Offer {
        loop {
            let mut shard = lock(self.shard(stripe));
            let batch = match shard.get(&stripe) {
                Some(batch) => batch.clone(),
                None => {
                    let whole = at == 0 && bytes.len() == row_bytes;
                    if whole || !(gather || write_back) {
                        return Offer::Direct;
                    }
                    // Checked and taken in one step: writers to rows of
                    // other shards reserve at the same time, and a check
                    // apart from the add let them overshoot the pool.
                    let reserved = self.entries_in_use.fetch_update(
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                        |used| (used + entries <= capacity).then_some(used + entries),
                    );
                    if reserved.is_err() {
                        return Offer::Direct;
                    }
                    self.batches.fetch_add(1, Ordering::SeqCst);
                    let batch = Arc::new(Batch {
                        stripe,
                        state: Mutex::new(BatchState {
                            buf: Arc::new(AlignedBuf::zeroed(row_bytes)),
                            covered: Vec::new(),
                            created: Instant::now(),
                            last_join: Instant::now(),
                            closed: false,
                            result: None,
                            urgent: fua,
                            holds: Vec::new(),
                            logged: log.is_some(),
                        }),
                        changed: Condvar::new(),
                    });
                    shard.insert(stripe, batch.clone());
                    if write_back {
                        self.wake.1.notify_all();
                    }
                    batch
                }
            };
            drop(shard);
            let mut state = lock(&batch.state);
            if state.closed {
                // Being written out: wait for it, then look again, so that
                // this write lands after it.
                drop(batch.written(state));
                continue;
            }
            if state.logged != log.is_some() {
                // A batch holds either data the journal has (write-back) or
                // data it has not. Mixed, its write-out would log data while
                // its logged part holds the journal's tail and the room kept
                // back for it: written out first, then a new batch.
                drop(state);
                self.write_out(&batch, entries, destage);
                continue;
            }
            // With a journal, the data is logged while the batch is held:
            // the batch cannot be closed meanwhile, so what is logged
            // before its write-out's parity is in that write-out, and what
            // comes after its close is logged after that parity (md holds
            // new writes to a stripe being written out the same way).
            if let Some(log) = log {
                match log() {
                    Ok(Some(hold)) => state.holds.push(hold),
                    // No room in the journal's share for the cache: the
                    // batch goes out as it is, and this write goes through.
                    Ok(None) => {
                        drop(state);
                        self.write_out(&batch, entries, destage);
                        return Offer::Direct;
                    }
                    Err(e) => {
                        drop(state);
                        self.write_out(&batch, entries, destage);
                        return Offer::Done(Err(e));
                    }
                }
            }
            state.add(at, bytes);
            state.last_join = Instant::now();
            if fua {
                state.urgent = true;
            }
            let full = state.full();
            drop(state);
            self.stats.gathered_writes.fetch_add(1, Ordering::Relaxed);
            if write_back && !fua {
                // Acknowledged from memory; a whole row goes out at once.
                if full {
                    self.write_out(&batch, entries, destage);
                }
                return Offer::Done(Ok(()));
            }
            return Offer::Done(self.wait(&batch, entries, destage));
        }
    }

    /// A writer waits for its batch to be written, writing it itself when
    /// waiting stops paying.
    fn wait(&self, batch: &Arc<Batch>, entries: usize, destage: &Destage) -> io::Result<()> {
        self.writes_waiting.fetch_add(1, Ordering::SeqCst);
        let mut state = lock(&batch.state);
        let result = loop {
            if let Some(result) = &state.result {
                break result.clone();
            }
            let now_pays = !state.closed
                && (state.full()
                    || state.urgent
                    || state.last_join.elapsed() >= GATHER_DEADLINE
                    || state.created.elapsed() >= GATHER_CAP
                    || self.nothing_more_coming());
            if now_pays {
                drop(state);
                self.write_out(batch, entries, destage);
                state = lock(&batch.state);
                continue;
            }
            state = batch
                .changed
                .wait_timeout(state, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        drop(state);
        self.writes_waiting.fetch_sub(1, Ordering::SeqCst);
        result.map_err(io::Error::other)
    }

    /// Every write in flight waits in a batch, and either the client has
    /// as many in flight as it ever has lately (it is waiting for us) or
    /// none has arrived for a while: waiting longer gathers nothing (md
    /// unplugs here).
    fn nothing_more_coming(&self) -> bool {
        let in_flight = self.writes_in_flight.load(Ordering::SeqCst);
        if self.writes_waiting.load(Ordering::SeqCst) < in_flight {
            return false;
        }
        let quiet_us = (self.epoch.elapsed().as_micros() as u64)
            .saturating_sub(self.last_arrival_us.load(Ordering::SeqCst));
        in_flight >= self.peak_in_flight.load(Ordering::SeqCst)
            || quiet_us >= ARRIVAL_GRACE.as_micros() as u64
    }

    /// Closes a batch (if nobody has) and writes it to the members; it stays
    /// in the table, readable, until it is there.
    fn write_out(&self, batch: &Arc<Batch>, entries: usize, destage: &Destage) {
        let (buf, covered, full) = {
            let mut state = lock(&batch.state);
            if state.closed {
                return;
            }
            state.closed = true;
            (state.buf.clone(), state.covered.clone(), state.full())
        };
        let result = destage(batch, &covered, &buf).map_err(|e| e.to_string());
        if full {
            self.stats.full_rows.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.partial_rows.fetch_add(1, Ordering::Relaxed);
        }
        {
            let mut shard = lock(self.shard(batch.stripe));
            if shard
                .get(&batch.stripe)
                .is_some_and(|b| Arc::ptr_eq(b, batch))
            {
                shard.remove(&batch.stripe);
            }
        }
        self.entries_in_use.fetch_sub(entries, Ordering::SeqCst);
        self.batches.fetch_sub(1, Ordering::SeqCst);
        let holds = {
            let mut state = lock(&batch.state);
            state.result = Some(result);
            std::mem::take(&mut state.holds)
        };
        batch.changed.notify_all();
        // The batch is on the members: the journal may let its data go.
        drop(holds);
    }

    /// The bytes of row `stripe` within `range` still in a batch, as
    /// (offset in `range`, bytes). Taken before the members are read, so
    /// that a batch written out in between is then on the members.
    pub(in crate::engine) fn pending_in(
        &self,
        stripe: u64,
        range: Range<usize>,
    ) -> Vec<(usize, Vec<u8>)> {
        let Some(batch) = lock(self.shard(stripe)).get(&stripe).cloned() else {
            return Vec::new();
        };
        let state = lock(&batch.state);
        if state.result.is_some() {
            return Vec::new();
        }
        state
            .covered
            .iter()
            .filter_map(|r| {
                let (a, b) = (r.start.max(range.start), r.end.min(range.end));
                (a < b).then(|| (a - range.start, state.buf[a..b].to_vec()))
            })
            .collect()
    }

    /// Forgets every batch not yet being written, as a power cut loses
    /// memory: for tests of what the journal must then bring back.
    #[cfg(test)]
    pub(in crate::engine) fn forget_unwritten(&self) -> usize {
        let mut forgotten = 0;
        for shard in self.shards.iter() {
            lock(shard).retain(|_, batch| {
                let keep = lock(&batch.state).closed;
                forgotten += usize::from(!keep);
                keep
            });
        }
        forgotten
    }

    /// Every batch now in the table, for FLUSH and shutdown.
    fn all_batches(&self) -> Vec<Arc<Batch>> {
        self.shards
            .iter()
            .flat_map(|s| lock(s).values().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Writes out every batch in the table and waits for each: after this,
    /// every write acknowledged before it is on the members.
    pub(in crate::engine) fn write_all(&self, entries: usize, destage: &Destage) -> io::Result<()> {
        let mut first_error = None;
        for batch in self.all_batches() {
            self.write_out(&batch, entries, destage);
            let state = batch.written(lock(&batch.state));
            if let Some(Err(e)) = &state.result {
                first_error.get_or_insert_with(|| io::Error::other(e.clone()));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One pass of a write-back worker: writes out the batches of its
    /// shards that are whole, old, urgent, or that the idle array no
    /// longer needs to hold. Returns whether any batch remains.
    pub(in crate::engine) fn work(
        &self,
        worker: usize,
        workers: usize,
        entries: usize,
        capacity: usize,
        destage: &Destage,
    ) -> bool {
        let idle = self.writes_in_flight.load(Ordering::SeqCst) == 0;
        let pressed = self.entries_in_use.load(Ordering::SeqCst) * 4 >= capacity * 3;
        let mut remain = false;
        for (i, shard) in self.shards.iter().enumerate() {
            if i % workers != worker {
                continue;
            }
            let batches: Vec<Arc<Batch>> = lock(shard).values().cloned().collect();
            for batch in batches {
                let due = {
                    let state = lock(&batch.state);
                    !state.closed
                        && (state.full()
                            || state.urgent
                            || idle
                            || pressed
                            || state.created.elapsed() >= WRITE_BACK_DELAY)
                };
                if due {
                    self.write_out(&batch, entries, destage);
                } else {
                    remain = true;
                }
            }
        }
        remain
    }

    /// Sleeps a worker until there may be work.
    pub(in crate::engine) fn idle_wait(&self, busy: bool) {
        let guard = lock(&self.wake.0);
        let timeout = if busy {
            POLL * 5
        } else {
            Duration::from_millis(100)
        };
        let _ = self.wake.1.wait_timeout(guard, timeout);
    }

    pub(in crate::engine) fn wake_workers(&self) {
        self.wake.1.notify_all();
    }

    /// Entries (md's units) a batch for a row of strips `strip_bytes` deep costs.
    pub(in crate::engine) fn entries_for(strip_bytes: usize) -> usize {
        strip_bytes.div_ceil(STRIPE_CACHE_PAGE).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covered_ranges_merge() {
        let mut s = BatchState {
            buf: Arc::new(AlignedBuf::zeroed(100)),
            covered: Vec::new(),
            created: Instant::now(),
            last_join: Instant::now(),
            closed: false,
            result: None,
            urgent: false,
            holds: Vec::new(),
            logged: false,
        };
        s.add(10, &[1; 10]);
        s.add(40, &[2; 10]);
        assert_eq!(s.covered, vec![10..20, 40..50]);
        s.add(20, &[3; 20]);
        assert_eq!(s.covered, vec![10..50]);
        s.add(0, &[4; 15]);
        s.add(50, &[5; 50]);
        assert!(s.full());
        assert_eq!(s.buf[12], 4);
        assert_eq!(s.buf[15], 1);
        assert_eq!(s.buf[45], 2);
    }

    #[test]
    fn a_write_is_sequential_only_after_two_that_follow_each_other() {
        let cache = StripeCache::new();
        let page = 4096;
        // Another write in flight throughout, as with any client queue.
        let (_other, _) = cache.write_arrives(1 << 30, page);
        let (_a, a) = cache.write_arrives(0, page);
        // Next to the last write by chance, as random writes on a small
        // array sometimes are: not yet a stream.
        let (_b, b) = cache.write_arrives(page as u64, page);
        let (_c, c) = cache.write_arrives(2 * page as u64, page);
        let (_d, d) = cache.write_arrives(3 * page as u64, page);
        assert_eq!((a, b, c, d), (false, false, true, true));
        // A lone write far from every other is never sequential.
        let (_e, e) = cache.write_arrives(1 << 28, page);
        assert!(!e);
    }

    #[test]
    fn a_write_alone_in_the_engine_is_not_gathered() {
        let cache = StripeCache::new();
        for i in 0..4u64 {
            let (in_flight, sequential) = cache.write_arrives(i * 4096, 4096);
            assert!(
                !sequential,
                "nothing else in flight: nothing to gather with"
            );
            drop(in_flight);
        }
    }
}
