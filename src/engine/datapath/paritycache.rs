//! Hot parity: the P and Q pages a write just computed, kept so that the
//! next read-modify-write of the same part of the stripe does not read
//! them back from the members (md keeps a stripe_head's parity pages up
//! to date in its cache for the same reason).
//!
//! A sequential writer smaller than a row walks the strips of a row one
//! after another over the same window: the first strip's write leaves the
//! window's parity here, and every later strip reads only its own old
//! data. The pool is sized by stripe_cache_size in md's memory: md's entry
//! is a page per member, this one holds one 4 KiB page of P and of Q of
//! one stripe, so the same memory holds members / 2 as many (raid6;
//! members on raid5).
//!
//! A read-modify-write that finds nothing hot may also keep the parity of
//! the rows around its window, read from the members with its own (see
//! `View::parity_span`): the pool fills a row per page read, not per miss.
//!
//! Eviction is CLOCK (second chance): a page read or written again since
//! eviction last passed it goes to the back of the queue instead, so
//! parity in use stays while pages used once flow through.
//!
//! Coherence rests on one rule: every write of a stripe piece, under the
//! stripe lock, replaces the pages of its window with what it wrote (or
//! drops them where a parity member is absent), pages kept that it did not
//! write are what the members held under that same lock, and the background
//! job (and a read error's correction) drops a stripe's pages before it
//! touches the stripe. Pages are whole
//! 4 KiB pages; a window that is not page aligned is neither read from
//! nor stored here.

use crate::engine::tuning::STRIPE_CACHE_PAGE;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

const PAGE: usize = STRIPE_CACHE_PAGE;
/// Shards, hashed by (stripe, page): the pages of one window spread out.
const SHARDS: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::engine) enum Which {
    P,
    Q,
}

#[derive(Default)]
struct Pages {
    p: Option<Box<[u8]>>,
    q: Option<Box<[u8]>>,
    /// Used (read, or written again) since eviction last passed it: it
    /// gets a second chance (CLOCK, an approximation of least recently
    /// used that costs a flag, not a reordering per use).
    referenced: bool,
    /// Its place in the eviction queue: an entry there with another tag
    /// is left from an earlier life of the key (dropped, then put again)
    /// and is discarded when it comes up.
    tag: u64,
}

impl Pages {
    /// The pages it holds, P then Q.
    fn held(self) -> impl Iterator<Item = Box<[u8]>> {
        [self.p, self.q].into_iter().flatten()
    }

    fn slot(&mut self, which: Which) -> &mut Option<Box<[u8]>> {
        match which {
            Which::P => &mut self.p,
            Which::Q => &mut self.q,
        }
    }
}

#[derive(Default)]
struct Shard {
    pages: HashMap<(u64, u64), Pages>,
    /// The eviction queue: (key, tag) in insertion order, a used page
    /// moved to the back when eviction reaches it. Entries whose key is
    /// gone or holds another tag are stale and discarded.
    order: VecDeque<((u64, u64), u64)>,
    /// The next tag (see `Pages::tag`).
    next_tag: u64,
    /// Pages evicted or dropped, reused for the next ones: a random
    /// writer puts two pages and evicts two per write, and an allocation
    /// and a free each (malloc's bookkeeping) cost more than the copy.
    spare: Vec<Box<[u8]>>,
}

/// The most pages a shard keeps for reuse (16 × 4 KiB, 4 MiB over the
/// 64 shards).
const SPARE_PER_SHARD: usize = 16;

impl Shard {
    /// A page holding `bytes`, reused if one is spare.
    fn page_of(spare: &mut Vec<Box<[u8]>>, bytes: &[u8]) -> Box<[u8]> {
        match spare.pop() {
            Some(mut page) => {
                page.copy_from_slice(bytes);
                page
            }
            None => Box::from(bytes),
        }
    }

    /// Keeps pages no longer held for reuse, as room allows.
    fn recycle(spare: &mut Vec<Box<[u8]>>, pages: impl IntoIterator<Item = Box<[u8]>>) {
        for page in pages {
            if spare.len() < SPARE_PER_SHARD {
                spare.push(page);
            }
        }
    }
}

pub(in crate::engine) struct ParityCache {
    shards: Box<[Mutex<Shard>]>,
    pub(in crate::engine) hits: AtomicU64,
    pub(in crate::engine) misses: AtomicU64,
    /// Pages held, over every shard: a drop on an empty cache (the common
    /// case under whole-row writes) locks nothing. Changed under the shard
    /// lock that changes the pages; a writer holds its stripe's lock, so a
    /// zero it reads covers every page of its stripe.
    held: AtomicUsize,
}

/// The pages of `window` (bytes within a strip), if it is page aligned.
fn pages_of(window: &Range<usize>) -> Option<Range<u64>> {
    (window.start.is_multiple_of(PAGE) && window.end.is_multiple_of(PAGE) && !window.is_empty())
        .then_some((window.start / PAGE) as u64..(window.end / PAGE) as u64)
}

impl ParityCache {
    pub(in crate::engine) fn new() -> ParityCache {
        ParityCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            held: AtomicUsize::new(0),
        }
    }

    fn shard(&self, stripe: u64, page: u64) -> &Mutex<Shard> {
        let hash = (stripe.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ page.wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
            >> 40;
        &self.shards[hash as usize % SHARDS]
    }

    /// Whether every page of `which` parity of `window` is here.
    pub(in crate::engine) fn has(&self, stripe: u64, window: &Range<usize>, which: Which) -> bool {
        pages_of(window).is_some_and(|mut pages| {
            pages.all(|page| {
                let mut shard = self.shard(stripe, page).lock().unwrap();
                shard
                    .pages
                    .get_mut(&(stripe, page))
                    .is_some_and(|p| p.slot(which).is_some())
            })
        })
    }

    /// Fills `out` with `which` parity of `window` if every page is here.
    pub(in crate::engine) fn get(
        &self,
        stripe: u64,
        window: &Range<usize>,
        which: Which,
        out: &mut [u8],
    ) -> bool {
        debug_assert_eq!(out.len(), window.len());
        let Some(pages) = pages_of(window) else {
            return false;
        };
        for (k, page) in pages.enumerate() {
            let mut shard = self.shard(stripe, page).lock().unwrap();
            let found = shard.pages.get_mut(&(stripe, page)).and_then(|p| {
                p.referenced = true;
                p.slot(which).as_ref()
            });
            match found {
                Some(bytes) => out[k * PAGE..(k + 1) * PAGE].copy_from_slice(bytes),
                None => {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// After a write of `window`: keeps what it wrote of `which` parity, or
    /// (None: that parity's member is absent) drops it.
    pub(in crate::engine) fn put(
        &self,
        stripe: u64,
        window: &Range<usize>,
        which: Which,
        bytes: Option<&[u8]>,
        capacity: usize,
    ) {
        let Some(pages) = pages_of(window) else {
            // Not page aligned: what is kept of the pages it touches is
            // stale now.
            self.drop_window(stripe, window);
            return;
        };
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        for (k, page) in pages.enumerate() {
            let mut guard = self.shard(stripe, page).lock().unwrap();
            let Shard {
                pages,
                order,
                spare,
                next_tag,
            } = &mut *guard;
            let key = (stripe, page);
            let existed = pages.contains_key(&key);
            let entry = pages.entry(key).or_default();
            if !existed {
                entry.tag = *next_tag;
                *next_tag += 1;
            }
            let tag = entry.tag;
            // Written again while kept: in use (the same parity, not P
            // then Q of one write). A new page joins the back of the queue
            // unused, and the pass below never takes the page it has just
            // put (the next write of its window, a sequential writer's
            // next strip, must find it).
            entry.referenced |= entry.slot(which).is_some();
            let slot = entry.slot(which);
            match (bytes.map(|b| &b[k * PAGE..(k + 1) * PAGE]), slot.as_mut()) {
                (Some(new), Some(kept)) => kept.copy_from_slice(new),
                (Some(new), None) => *slot = Some(Shard::page_of(spare, new)),
                (None, _) => {
                    if let Some(old) = slot.take() {
                        Shard::recycle(spare, Some(old));
                    }
                }
            }
            if !existed {
                order.push_back((key, tag));
                self.held.fetch_add(1, Ordering::Relaxed);
            }
            // Each pass over a used page clears its flag, and every page
            // held has a place in the queue, so this ends within two
            // rounds of it.
            while pages.len() > per_shard {
                let Some((old, old_tag)) = order.pop_front() else {
                    break;
                };
                match pages.get_mut(&old) {
                    Some(kept) if kept.tag != old_tag => {}
                    None => {}
                    Some(_) if old == key => order.push_back((old, old_tag)),
                    Some(kept) if kept.referenced => {
                        kept.referenced = false;
                        order.push_back((old, old_tag));
                    }
                    Some(_) => {
                        let evicted = pages.remove(&old).expect("found above");
                        self.held.fetch_sub(1, Ordering::Relaxed);
                        Shard::recycle(spare, evicted.held());
                    }
                }
            }
            // Stale entries (dropped pages) are discarded as they come up;
            // when they outnumber the live ones three to one, at once. Live
            // entries are one per page, so this keeps the queue within
            // 4 x pages + 16.
            if order.len() > 4 * pages.len() + 16 {
                order.retain(|(k, t)| pages.get(k).is_some_and(|p| p.tag == *t));
            }
        }
    }

    /// Whether `pages` more entries (a page of P and of Q each) fit among
    /// `capacity` in all; the shards evict on their own, so one that is
    /// fuller than the rest may still evict a little.
    pub(in crate::engine) fn has_room(&self, pages: usize, capacity: usize) -> bool {
        self.held.load(Ordering::Relaxed) + pages <= capacity
    }

    /// Forgets the pages `window` touches.
    pub(in crate::engine) fn drop_window(&self, stripe: u64, window: &Range<usize>) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let first = (window.start / PAGE) as u64;
        let end = window.end.div_ceil(PAGE) as u64;
        for page in first..end {
            let mut shard = self.shard(stripe, page).lock().unwrap();
            if let Some(removed) = shard.pages.remove(&(stripe, page)) {
                self.held.fetch_sub(1, Ordering::Relaxed);
                Shard::recycle(&mut shard.spare, removed.held());
            }
        }
    }

    /// Forgets every page of `stripe` (the background job is about to
    /// rewrite or rebuild it).
    pub(in crate::engine) fn drop_stripe(&self, stripe: u64, strip_bytes: usize) {
        self.drop_window(stripe, &(0..strip_bytes));
    }

    /// Forgets everything (a live change of the cache size).
    pub(in crate::engine) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap();
            self.held.fetch_sub(shard.pages.len(), Ordering::Relaxed);
            shard.pages.clear();
            shard.order.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_kept_replaced_dropped_and_evicted() {
        let c = ParityCache::new();
        let w = 4096..12288;
        let p = vec![7u8; 8192];
        c.put(3, &w, Which::P, Some(&p), 1024);
        let mut out = vec![0u8; 8192];
        assert!(c.get(3, &w, Which::P, &mut out));
        assert_eq!(out, p);
        assert!(!c.get(3, &w, Which::Q, &mut out), "Q was never stored");
        assert!(
            !c.get(3, &(0..8192), Which::P, &mut out),
            "page 0 is not here"
        );
        assert!(
            !c.get(3, &(4096..6144), Which::P, &mut out[..2048]),
            "not page aligned"
        );
        // An absent parity member: its pages go.
        c.put(3, &(4096..8192), Which::P, None, 1024);
        assert!(!c.get(3, &w, Which::P, &mut out));
        // An unaligned write drops the pages it touches.
        c.put(4, &w, Which::Q, Some(&p), 1024);
        c.put(4, &(5000..5512), Which::Q, Some(&[0; 512]), 1024);
        assert!(!c.get(4, &w, Which::Q, &mut out));
        // The background job drops a whole stripe.
        c.put(5, &w, Which::P, Some(&p), 1024);
        c.drop_stripe(5, 65536);
        assert!(!c.get(5, &w, Which::P, &mut out));
        // A small pool evicts the oldest.
        for s in 0..10_000 {
            c.put(s, &(0..4096), Which::P, Some(&[1; 4096]), 64);
        }
        let held: usize = c.shards.iter().map(|s| s.lock().unwrap().pages.len()).sum();
        assert!(held <= 64 + SHARDS, "{held} pages held");
        assert_eq!(c.held.load(Ordering::Relaxed), held, "count of pages held");
        // Evicted pages are reused, and a reused page holds the new bytes.
        let spare: usize = c.shards.iter().map(|s| s.lock().unwrap().spare.len()).sum();
        assert!(
            spare > 0 && spare <= SHARDS * SPARE_PER_SHARD,
            "{spare} spare"
        );
        for s in 20_000..20_100 {
            c.put(s, &(0..4096), Which::Q, Some(&[s as u8; 4096]), 64);
            let mut page = vec![0u8; 4096];
            assert!(c.get(s, &(0..4096), Which::Q, &mut page));
            assert!(page.iter().all(|&b| b == s as u8), "stripe {s}");
        }
        c.clear();
        assert_eq!(c.held.load(Ordering::Relaxed), 0);
    }

    /// Parity in use stays while a stream of new pages passes through:
    /// eviction takes pages nobody used since it last passed them.
    #[test]
    fn a_page_in_use_outlives_a_stream_of_new_ones() {
        let c = ParityCache::new();
        let capacity = 4 * SHARDS;
        let hot = [5u8; PAGE];
        c.put(1, &(0..PAGE), Which::P, Some(&hot), capacity);
        let mut out = [0u8; PAGE];
        for s in 100..5_100u64 {
            c.put(s, &(0..PAGE), Which::P, Some(&[1; PAGE]), capacity);
            if s % 4 == 0 {
                assert!(c.get(1, &(0..PAGE), Which::P, &mut out), "evicted at {s}");
                assert_eq!(out, hot);
            }
        }
        // The pool kept its size meanwhile.
        let held: usize = c.shards.iter().map(|s| s.lock().unwrap().pages.len()).sum();
        assert!(held <= capacity, "{held} pages held");
    }

    /// On raid6 a write puts P and then Q of one page: that is one use,
    /// not two; writing the page again is the second.
    #[test]
    fn p_then_q_of_one_write_is_one_use() {
        let c = ParityCache::new();
        let page = [3u8; PAGE];
        let referenced = |c: &ParityCache| {
            let shard = c.shard(9, 0).lock().unwrap();
            shard.pages[&(9, 0)].referenced
        };
        c.put(9, &(0..PAGE), Which::P, Some(&page), 1024);
        c.put(9, &(0..PAGE), Which::Q, Some(&page), 1024);
        assert!(!referenced(&c));
        c.put(9, &(0..PAGE), Which::P, Some(&page), 1024);
        assert!(referenced(&c));
    }

    /// A page dropped and put again, over and over (whole-row writes and
    /// the background job drop pages), leaves stale entries in the queue;
    /// they are discarded, so the queue stays within its bound.
    #[test]
    fn the_eviction_queue_stays_bounded_under_drops() {
        let c = ParityCache::new();
        let page = [4u8; PAGE];
        let mut out = [0u8; PAGE];
        for round in 0..20_000u64 {
            c.put(7, &(0..PAGE), Which::P, Some(&page), 4 * SHARDS);
            assert!(c.get(7, &(0..PAGE), Which::P, &mut out));
            c.drop_window(7, &(0..PAGE));
            c.put(1_000 + round, &(0..PAGE), Which::P, Some(&page), 4 * SHARDS);
        }
        for shard in c.shards.iter() {
            let shard = shard.lock().unwrap();
            assert!(
                shard.order.len() <= 4 * shard.pages.len() + 16 + 1,
                "{} entries for {} pages",
                shard.order.len(),
                shard.pages.len()
            );
        }
    }

    /// The count that lets a drop on an empty cache skip the locks stays
    /// exact through puts, replacements, evictions and drops: a drop must
    /// never be skipped while a page of its window is held.
    #[test]
    fn the_count_of_pages_held_is_exact() {
        let c = ParityCache::new();
        let exact = |c: &ParityCache| {
            let held: usize = c.shards.iter().map(|s| s.lock().unwrap().pages.len()).sum();
            assert_eq!(c.held.load(Ordering::Relaxed), held);
            held
        };
        let page = [9u8; PAGE];
        for s in 0..500u64 {
            let w = (s as usize % 4) * PAGE..(s as usize % 4 + 1) * PAGE;
            c.put(s % 37, &w, Which::P, Some(&page), 128);
            c.put(s % 37, &w, Which::Q, Some(&page), 128);
            if s % 5 == 0 {
                c.drop_window(s % 37, &(0..4 * PAGE));
            }
            if s % 7 == 0 {
                c.put(s % 37, &w, Which::P, None, 128);
            }
            exact(&c);
        }
        assert!(exact(&c) > 0);
        for s in 0..37 {
            c.drop_stripe(s, 4 * PAGE);
        }
        assert_eq!(exact(&c), 0);
    }
}
