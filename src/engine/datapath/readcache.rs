//! Read-ahead and the read cache: clean copies of array bytes, kept so that
//! the next read of a sequential stream (or, with read_cache on, any read
//! of recently read bytes) is served from memory.
//!
//! - read_ahead (sectors, as `blockdev --setra`): a read that continues a
//!   recent one is extended by that much, in one member pass, and the
//!   extra bytes are kept here.
//! - read_cache on: every read's bytes are kept too (a controller's "cached
//!   I/O"); off: only read-ahead's.
//! - fast_path on: a read inside one strip goes straight to its member and
//!   never looks here (a controller's FastPath: small random reads gain
//!   nothing from a cache and pay for looking).
//!
//! Coherence: every write drops the extents it overlaps, after it is on the
//! members. An extent read from the members while a write was in flight
//! could hold older bytes, so a generation count, bumped by every write,
//! decides: an extent is kept only if no write began while it was read.
//! Memory is bounded by stripe_cache_size × 4 KiB × data members, the same
//! memory md's stripe cache would take.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Counts a read in flight for as long as it lives.
pub(in crate::engine) struct ReadInFlight<'a>(&'a ReadCache);

impl Drop for ReadInFlight<'_> {
    fn drop(&mut self) {
        self.0.reads_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Recent read ends remembered to tell sequential reads.
const RECENT: usize = 16;

/// Lone sequential reads in a row before read-ahead serves the stream. A
/// client with many reads in flight passes through instants when one of
/// its reads is alone (at its start, and whenever its replies drain
/// together); one such instant must not make it a lone reader, or its
/// next read is fetched with read-ahead's extra and copied instead of
/// spliced (a 16-deep 1 MiB reader had one read in nine copied).
/// A reader that really reads one request at a time (dd) pays this
/// many reads without read-ahead, once.
pub(in crate::engine) const LONE_HABIT: u32 = 4;

/// Cached bytes: extents that never overlap, found by their start, and
/// evicted oldest first. Lookups and writes cost a logarithm of the count,
/// not a scan: at stripe_cache_size 32768 the cache holds up to 196,608
/// extents of 4 KiB for 8 members, and a scan under the lock on every read
/// took random reads from 100,000 IOPS to 5,500.
#[derive(Default)]
struct Extents {
    by_start: BTreeMap<u64, Extent>,
    /// (start, age) of every extent kept, oldest first. An entry whose
    /// extent has gone (dropped by a write, replaced) is skipped when it
    /// comes up, and the queue is compacted when such entries outnumber
    /// the live ones.
    order: VecDeque<(u64, u64)>,
    next_age: u64,
    /// Bytes held.
    held: usize,
}

struct Extent {
    bytes: Vec<u8>,
    age: u64,
}

impl Extents {
    /// The extent holding `offset`, if any: the one starting last at or
    /// before it, since extents do not overlap.
    fn holding(&self, offset: u64) -> Option<(u64, &Extent)> {
        let (&start, e) = self.by_start.range(..=offset).next_back()?;
        (start + e.bytes.len() as u64 > offset).then_some((start, e))
    }

    /// Starts of the extents that overlap `range`, last first.
    fn overlapping(&self, range: &Range<u64>) -> Vec<u64> {
        self.by_start
            .range(..range.end)
            .rev()
            .take_while(|(&start, e)| start + e.bytes.len() as u64 > range.start)
            .map(|(&start, _)| start)
            .collect()
    }

    fn remove(&mut self, start: u64) {
        let e = self
            .by_start
            .remove(&start)
            .expect("removing an extent held");
        self.held -= e.bytes.len();
    }

    /// Keeps `bytes` at `start`: an extent holding all of them already
    /// wins (its bytes are the same: no write has touched them since it
    /// was kept, or it would be gone); an extent reaching into them from
    /// before is cut short; any other overlapping extent is dropped.
    fn insert(&mut self, start: u64, bytes: Vec<u8>, capacity: usize) {
        let range = start..start + bytes.len() as u64;
        if self
            .holding(start)
            .is_some_and(|(s, e)| s + e.bytes.len() as u64 >= range.end)
        {
            return;
        }
        for old in self.overlapping(&range) {
            if old < start {
                let e = self.by_start.get_mut(&old).expect("just found");
                let keep = (start - old) as usize;
                self.held -= e.bytes.len() - keep;
                // The memory too, not only the count: the bound is memory.
                e.bytes.truncate(keep);
                e.bytes.shrink_to_fit();
            } else {
                self.remove(old);
            }
        }
        let age = self.next_age;
        self.next_age += 1;
        self.held += bytes.len();
        self.by_start.insert(start, Extent { bytes, age });
        self.order.push_back((start, age));
        while self.held > capacity {
            let (oldest, age) = self.order.pop_front().expect("bytes held are in the queue");
            if self.by_start.get(&oldest).is_some_and(|e| e.age == age) {
                self.remove(oldest);
            }
        }
        self.compact();
    }

    /// Forgets the ages of extents that are gone once they outnumber the
    /// live ones, so that the queue stays within twice the map.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.by_start.len() + 64 {
            let live = &self.by_start;
            self.order
                .retain(|(start, age)| live.get(start).is_some_and(|e| e.age == *age));
        }
    }

    /// Drops every extent that overlaps `range`.
    fn drop_overlapping(&mut self, range: &Range<u64>) {
        for old in self.overlapping(range) {
            self.remove(old);
        }
        self.compact();
    }

    fn clear(&mut self) {
        *self = Extents::default();
    }
}

pub(in crate::engine) struct ReadCache {
    extents: Mutex<Extents>,
    /// Bumped when a write starts and when it ends.
    generation: AtomicU64,
    recent_ends: [AtomicU64; RECENT],
    recent_next: AtomicU64,
    /// Reads inside the engine now: read-ahead pays only for a client that
    /// does not keep several reads in flight itself.
    reads_in_flight: AtomicUsize,
    /// Lone sequential reads in a row, up to now (see [`LONE_HABIT`]).
    lone_streak: AtomicU32,
    /// Extents held (checked without the lock on every write).
    count: AtomicUsize,
    pub(in crate::engine) hits: AtomicU64,
    pub(in crate::engine) misses: AtomicU64,
}

impl ReadCache {
    pub(in crate::engine) fn new() -> ReadCache {
        ReadCache {
            extents: Mutex::new(Extents::default()),
            generation: AtomicU64::new(0),
            recent_ends: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            recent_next: AtomicU64::new(0),
            reads_in_flight: AtomicUsize::new(0),
            lone_streak: AtomicU32::new(0),
            count: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Notes a read; says whether it continues a recent one and whether it
    /// is alone (no other read in flight), for as long as the guard lives.
    pub(in crate::engine) fn read_arrives(
        &self,
        offset: u64,
        len: usize,
    ) -> (ReadInFlight<'_>, bool, bool) {
        let alone = self.reads_in_flight.fetch_add(1, Ordering::SeqCst) == 0;
        (ReadInFlight(self), self.continues(offset, len), alone)
    }

    /// Notes whether a read that arrived was sequential and alone (`lone`:
    /// [`read_arrives`](Self::read_arrives)'s answers, and nothing else
    /// in flight that the caller counts); says whether the reader has made
    /// a habit of it, [`LONE_HABIT`] such reads in a row, so that
    /// read-ahead should serve it. A read declined by the server's path
    /// for this and then read by the engine is noted twice; by then the
    /// habit is made, and a second lone note keeps it (one with company
    /// meanwhile ends it, and the read is then read without read-ahead).
    pub(in crate::engine) fn lone_stream(&self, lone: bool) -> bool {
        if !lone {
            self.lone_streak.store(0, Ordering::Relaxed);
            return false;
        }
        let streak = self.lone_streak.fetch_add(1, Ordering::Relaxed) + 1;
        if streak > LONE_HABIT {
            // Kept at the habit so that it cannot wrap.
            self.lone_streak.store(LONE_HABIT, Ordering::Relaxed);
        }
        streak >= LONE_HABIT
    }

    fn continues(&self, offset: u64, len: usize) -> bool {
        let reach = 8 * len as u64;
        let sequential = self.recent_ends.iter().any(|e| {
            let end = e.load(Ordering::Relaxed);
            end != u64::MAX && end.abs_diff(offset) <= reach
        });
        let slot = self.recent_next.fetch_add(1, Ordering::Relaxed) as usize % RECENT;
        self.recent_ends[slot].store(offset + len as u64, Ordering::Relaxed);
        sequential
    }

    /// Copies `buf.len()` bytes at `offset` from one cached extent, if one
    /// holds them all.
    pub(in crate::engine) fn lookup(&self, offset: u64, buf: &mut [u8]) -> bool {
        let extents = self.extents.lock().unwrap();
        let end = offset + buf.len() as u64;
        let found = extents
            .holding(offset)
            .filter(|(start, e)| start + e.bytes.len() as u64 >= end);
        match found {
            Some((start, e)) => {
                let at = (offset - start) as usize;
                buf.copy_from_slice(&e.bytes[at..at + buf.len()]);
                self.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The generation to hand back to [`insert`](Self::insert) for bytes
    /// about to be read from the members.
    pub(in crate::engine) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Keeps bytes read from the members at `start`, unless a write began
    /// since `generation` was taken; evicts the oldest beyond `capacity`.
    pub(in crate::engine) fn insert(
        &self,
        start: u64,
        bytes: Vec<u8>,
        generation: u64,
        capacity: usize,
    ) {
        if bytes.is_empty() || bytes.len() > capacity {
            return;
        }
        let mut extents = self.extents.lock().unwrap();
        // Announced before the generation is checked: a write that ends
        // after the check (its bytes may be missing from what was read)
        // then sees a count and drops this extent under the lock; one that
        // ended before it moved the generation, and the bytes are refused.
        self.count
            .store(extents.by_start.len() + 1, Ordering::SeqCst);
        if self.generation.load(Ordering::SeqCst) == generation {
            extents.insert(start, bytes, capacity);
        }
        self.count.store(extents.by_start.len(), Ordering::SeqCst);
    }

    /// A write to `range` begins: extents being read now must not be kept.
    pub(in crate::engine) fn write_begins(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// A write to `range` is on the members: drop what it overlaps.
    pub(in crate::engine) fn write_done(&self, range: Range<u64>) {
        // The generation moves first, then the count is read: an insert
        // that checked the generation before it moved had announced
        // itself in the count by then (see `insert`).
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            // Nothing held (the usual case): no lock on the write path.
            return;
        }
        let mut extents = self.extents.lock().unwrap();
        extents.drop_overlapping(&range);
        self.count.store(extents.by_start.len(), Ordering::SeqCst);
    }

    /// Drops everything (the benchmark's "drop caches", a reconfiguration).
    pub(in crate::engine) fn clear(&self) {
        let mut extents = self.extents.lock().unwrap();
        self.generation.fetch_add(1, Ordering::SeqCst);
        extents.clear();
        self.count.store(0, Ordering::SeqCst);
    }

    pub(in crate::engine) fn held_bytes(&self) -> usize {
        self.extents.lock().unwrap().held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_hit_evict_and_drop_on_write() {
        let c = ReadCache::new();
        let g = c.generation();
        c.insert(4096, vec![1; 8192], g, 16384);
        let mut buf = vec![0; 4096];
        assert!(c.lookup(8192, &mut buf));
        assert!(buf.iter().all(|b| *b == 1));
        assert!(!c.lookup(0, &mut buf), "not all of it is cached");
        // A write that began during a read: the read's bytes are not kept.
        let g = c.generation();
        c.write_begins();
        c.insert(65536, vec![2; 4096], g, 16384);
        assert!(!c.lookup(65536, &mut buf));
        // Capacity evicts the oldest.
        let g = c.generation();
        c.insert(100_000, vec![3; 12288], g, 16384);
        assert!(!c.lookup(8192, &mut buf), "the oldest extent was evicted");
        assert!(c.held_bytes() <= 16384);
        // A finished write drops what it overlaps.
        c.write_done(100_000..100_001);
        assert!(!c.lookup(100_000, &mut buf));
    }

    /// Random reads kept, writes and lookups against a model of the
    /// array's bytes: a hit always returns the bytes the array holds,
    /// what is held never exceeds the capacity, the count of extents the
    /// write path checks stays right, and bytes just kept are found.
    #[test]
    fn lookups_always_return_what_the_array_holds() {
        use rand::{Rng, SeedableRng};
        const SPACE: u64 = 1 << 20;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model: Vec<u8> = (0..SPACE).map(|i| (i % 251) as u8).collect();
        let c = ReadCache::new();
        let capacity = 64 << 10;
        let (mut hits, mut version) = (0, 0u8);
        for _ in 0..20_000 {
            let start = rng.gen_range(0..SPACE / 512) * 512;
            let len = (rng.gen_range(1..=32u64) * 512).min(SPACE - start);
            let range = start as usize..(start + len) as usize;
            match rng.gen_range(0..10) {
                0..=3 => {
                    let g = c.generation();
                    c.insert(start, model[range.clone()].to_vec(), g, capacity);
                    let mut buf = vec![0; len as usize];
                    assert!(c.lookup(start, &mut buf), "bytes just kept are found");
                    assert_eq!(buf, model[range]);
                }
                4 => {
                    version = version.wrapping_add(1);
                    c.write_begins();
                    model[range].fill(version);
                    c.write_done(start..start + len);
                }
                _ => {
                    let mut buf = vec![0; len as usize];
                    if c.lookup(start, &mut buf) {
                        assert_eq!(buf, model[range], "a hit returns the array's bytes");
                        hits += 1;
                    }
                }
            }
            let extents = c.extents.lock().unwrap();
            assert!(extents.held <= capacity);
            let sum: usize = extents.by_start.values().map(|e| e.bytes.len()).sum();
            assert_eq!(extents.held, sum);
            assert_eq!(c.count.load(Ordering::SeqCst), extents.by_start.len());
            let mut end = 0;
            for (&start, e) in &extents.by_start {
                assert!(start >= end, "extents do not overlap");
                end = start + e.bytes.len() as u64;
            }
            assert!(extents.order.len() <= 2 * extents.by_start.len() + 64);
        }
        assert!(hits > 100, "the cache served some reads ({hits})");
    }

    /// A read inside a kept extent does not replace it, and one reaching
    /// into it from before cuts it short.
    #[test]
    fn overlapping_extents_are_cut_not_stacked() {
        let c = ReadCache::new();
        let g = c.generation();
        c.insert(0, vec![1; 16384], g, 1 << 20);
        c.insert(4096, vec![1; 4096], g, 1 << 20);
        assert_eq!(
            c.held_bytes(),
            16384,
            "a read inside an extent adds nothing"
        );
        c.insert(8192, vec![1; 16384], g, 1 << 20);
        assert_eq!(
            c.held_bytes(),
            8192 + 16384,
            "the first extent is cut at 8192"
        );
        let mut buf = vec![0; 4096];
        assert!(c.lookup(0, &mut buf) && c.lookup(20480, &mut buf));
        // Eviction takes the oldest, the cut one first.
        c.insert(1 << 20, vec![2; 16384], g, 32768);
        assert!(!c.lookup(0, &mut buf));
        assert!(c.lookup(20480, &mut buf));
        assert!(c.held_bytes() <= 32768);
    }

    #[test]
    fn sequential_reads_are_told_from_random_ones() {
        let c = ReadCache::new();
        assert!(!c.read_arrives(0, 4096).1);
        let (_first, sequential, alone) = c.read_arrives(4096, 4096);
        assert!(sequential && alone);
        let (_, _, alone) = c.read_arrives(8192, 4096);
        assert!(!alone, "a second read in flight");
        assert!(!c.read_arrives(1 << 30, 4096).1);
    }

    #[test]
    fn a_lone_stream_is_a_habit_not_an_instant() {
        let c = ReadCache::new();
        for _ in 1..LONE_HABIT {
            assert!(!c.lone_stream(true));
        }
        assert!(c.lone_stream(true), "the habit is made");
        for _ in 0..100 {
            assert!(c.lone_stream(true), "and kept");
        }
        // One read with company breaks it; it takes the habit to remake.
        assert!(!c.lone_stream(false));
        for _ in 1..LONE_HABIT {
            assert!(!c.lone_stream(true));
        }
        assert!(c.lone_stream(true));
    }
}
