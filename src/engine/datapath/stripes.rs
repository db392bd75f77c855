//! Stripe workers: the threads that do the parity work of writes on
//! raid4/5/6, as md's raid5d and its group_thread_cnt workers do.
//!
//! With group_thread_cnt = n > 0, a write's request thread (an NBD worker,
//! or the stripe cache writing a batch out) hands each row it writes to the
//! row's worker and waits. Rows are sharded by their stripe-lock slot over
//! `QUEUES` queues, and queue q belongs to worker q mod n, so a row always
//! goes to one worker and two workers never want the same lock. A worker
//! takes what its queues hold as one *round*: it locks the rows (in slot
//! order), plans each row's write, sends every read of the round as one
//! batch, computes parity, and sends every write as one batch. So one thread keeps many stripes in flight, as md's stripe state
//! machine does, and 32 random writes cost two member round trips, not 64.
//!
//! A row that needs more than that — a member missing or rebuilding, a
//! replacement being built, a read error, several parts — is written the
//! one-row way (retries, read-error correction) by the worker under the
//! same locks. Writes to one row keep their order: a round takes at most
//! one job per lock slot, the oldest.
//!
//! With group_thread_cnt = 0, the default, there are no stripe workers:
//! each request's own thread does its rows' parity work under the rows'
//! locks, so the stripe work of concurrent requests runs on every core at
//! once and no thread is a bottleneck (md's 0 means the opposite: all of it
//! on raid5d alone). On this project's machines that is the faster of the
//! two by 2-3x for random writes (docs/BENCHMARKS.md, "Stripe workers"):
//! a round waits for its slowest I/O, one thread's io_uring gets about half
//! of what several submitting threads get from a virtual disk, and each
//! hand-off costs two context switches on a machine with fewer cores than
//! requests in flight. Workers pay off
//! where deep batches from few threads do (block devices, many cores).
//!
//! Mirrors, raid0 and linear have no parity work: their writes stay on the
//! request thread. Reads never come here (md's chunk-aligned reads bypass
//! raid5d too).

use super::io::{Piece, View};
use crate::engine::datapath::execute::{Row, RowOutcome};
use crate::engine::tuning::GROUP_THREAD_CNT_MAX;
use crate::engine::Engine;
use crate::geometry::StripeMap;
use std::collections::VecDeque;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Job queues: one per worker there can be at most.
const QUEUES: usize = GROUP_THREAD_CNT_MAX as usize;
/// The most rows a round takes: enough to keep every member busy, few
/// enough that a round's locks are not held for long.
const ROUND_MAX: usize = 64;
/// How long an idle worker sleeps before it looks again unasked: while
/// group_thread_cnt changes, a wake-up may go to a worker that no longer
/// owns the queue.
const IDLE: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One row to write, handed from a request thread to a stripe worker.
pub(in crate::engine) struct Job {
    stripe: u64,
    slot: usize,
    /// (offset in the row's data, address, length) of each part: the
    /// submitter's bytes, borrowed. See `parts`.
    parts: Vec<(usize, *const u8, usize)>,
    /// The parts' data is in the journal already (write-back).
    logged: bool,
    /// Every member write carries FUA.
    fua: bool,
    result: Mutex<Option<io::Result<()>>>,
    finished: Condvar,
}

// SAFETY: the raw parts point into memory that the submitting thread keeps
// alive and unchanged until the job is finished (`submit` does not return
// before), and a worker reads them only before it finishes the job.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// The bytes to write. Valid only until the job is finished.
    fn parts(&self) -> Vec<(usize, &[u8])> {
        assert!(lock(&self.result).is_none(), "a finished job's parts");
        self.parts
            .iter()
            // SAFETY: see the Send/Sync note: the submitter is waiting.
            .map(|&(at, ptr, len)| (at, unsafe { std::slice::from_raw_parts(ptr, len) }))
            .collect()
    }

    fn finish(&self, result: io::Result<()>) {
        *lock(&self.result) = Some(result);
        self.finished.notify_all();
    }

    fn wait(&self) -> io::Result<()> {
        let mut result = lock(&self.result);
        loop {
            if let Some(done) = result.take() {
                // Left as an Ok so that `parts` still refuses a late reader.
                *result = Some(Ok(()));
                return done;
            }
            result = self
                .finished
                .wait(result)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

struct Queue {
    jobs: Mutex<VecDeque<Arc<Job>>>,
    /// Held by the worker serving the queue, so that a change of
    /// group_thread_cnt never has two workers run one queue's jobs at once.
    claimed: AtomicBool,
}

#[derive(Default)]
struct Wake {
    /// Bumped by every submission to the worker, so that one made while
    /// the worker was busy is not slept through.
    signals: Mutex<u64>,
    changed: Condvar,
}

pub(in crate::engine) struct StripeWorkers {
    queues: Vec<Queue>,
    wakes: Vec<Wake>,
    /// Threads started; they last as long as the engine (a lowered
    /// group_thread_cnt leaves the extra ones idle).
    started: AtomicUsize,
    /// group_thread_cnt as resolved (0 is one per core).
    wanted: AtomicUsize,
    spawning: Mutex<()>,
    /// Rounds run and rows written through them, for status.
    pub(in crate::engine) rounds: AtomicU64,
    pub(in crate::engine) rows: AtomicU64,
    /// Rows that took the one-row path (degraded, read error, several parts).
    pub(in crate::engine) rows_alone: AtomicU64,
}

impl StripeWorkers {
    pub(in crate::engine) fn new() -> StripeWorkers {
        StripeWorkers {
            queues: (0..QUEUES)
                .map(|_| Queue {
                    jobs: Mutex::new(VecDeque::new()),
                    claimed: AtomicBool::new(false),
                })
                .collect(),
            wakes: (0..QUEUES).map(|_| Wake::default()).collect(),
            started: AtomicUsize::new(0),
            wanted: AtomicUsize::new(0),
            spawning: Mutex::new(()),
            rounds: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            rows_alone: AtomicU64::new(0),
        }
    }

    /// Workers taking new jobs: 0 when writes do their own stripe work.
    pub(in crate::engine) fn active(&self) -> usize {
        let started = self.started.load(Ordering::SeqCst);
        self.wanted.load(Ordering::SeqCst).min(started)
    }

    /// Workers serving queues: jobs queued before group_thread_cnt went to
    /// 0 are still served, by worker 0.
    fn serving(&self) -> usize {
        self.active().max(1)
    }

    /// Sets the worker count to `wanted` (group_thread_cnt), starting
    /// threads that are missing.
    pub(in crate::engine) fn ensure(self: &Arc<Self>, engine: &Weak<Engine>, wanted: usize) {
        let wanted = wanted.min(QUEUES);
        let _spawning = lock(&self.spawning);
        while self.started.load(Ordering::SeqCst) < wanted {
            let index = self.started.load(Ordering::SeqCst);
            let (engine, workers) = (engine.clone(), self.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("uraid-stripe-{index}"))
                .spawn(move || workers.run(&engine, index));
            if spawned.is_err() {
                break;
            }
            self.started.fetch_add(1, Ordering::SeqCst);
        }
        self.wanted.store(wanted, Ordering::SeqCst);
        // Queues may have changed hands: everyone looks again.
        for index in 0..QUEUES {
            self.wake(index);
        }
    }

    fn wake(&self, worker: usize) {
        let wake = &self.wakes[worker];
        *lock(&wake.signals) += 1;
        wake.changed.notify_one();
    }

    /// Hands the write of `parts` of row `stripe` (guarded by lock `slot`)
    /// to the row's worker and waits for it. None when no worker runs (a
    /// read-only array, or before the engine has started them).
    pub(in crate::engine) fn submit(
        &self,
        stripe: u64,
        slot: usize,
        parts: &[(usize, &[u8])],
        logged: bool,
        fua: bool,
    ) -> Option<io::Result<()>> {
        let active = self.active();
        if active == 0 {
            return None;
        }
        let job = Arc::new(Job {
            stripe,
            slot,
            parts: parts
                .iter()
                .map(|(at, bytes)| (*at, bytes.as_ptr(), bytes.len()))
                .collect(),
            logged,
            fua,
            result: Mutex::new(None),
            finished: Condvar::new(),
        });
        let queue = slot % QUEUES;
        lock(&self.queues[queue].jobs).push_back(job.clone());
        self.wake(queue % active);
        // Not before the job is finished: the worker reads `parts` until then.
        Some(job.wait())
    }

    fn run(&self, engine: &Weak<Engine>, index: usize) {
        loop {
            let seen = *lock(&self.wakes[index].signals);
            let worked = {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                let serving = self.serving();
                index < serving && self.round(&engine, index, serving)
            };
            if !worked {
                let wake = &self.wakes[index];
                let signals = lock(&wake.signals);
                if *signals == seen {
                    drop(wake.changed.wait_timeout(signals, IDLE));
                }
            }
        }
    }

    /// Takes what this worker's queues hold (at most one job per lock slot,
    /// the oldest) and writes it as one round. Returns whether it did any.
    fn round(&self, engine: &Engine, index: usize, active: usize) -> bool {
        let mut claimed = Vec::new();
        let mut jobs: Vec<Arc<Job>> = Vec::new();
        for q in (index..QUEUES).step_by(active) {
            let queue = &self.queues[q];
            if lock(&queue.jobs).is_empty() || queue.claimed.swap(true, Ordering::SeqCst) {
                continue;
            }
            claimed.push(q);
            let mut list = lock(&queue.jobs);
            let mut kept = VecDeque::new();
            let mut skipped: Vec<usize> = Vec::new();
            while let Some(job) = list.pop_front() {
                let free = !jobs.iter().any(|j| j.slot == job.slot) && !skipped.contains(&job.slot);
                if free && jobs.len() < ROUND_MAX {
                    jobs.push(job);
                } else {
                    // Later jobs of this slot wait behind this one.
                    skipped.push(job.slot);
                    kept.push_back(job);
                }
            }
            *list = kept;
        }
        if !jobs.is_empty() {
            let results = catch_unwind(AssertUnwindSafe(|| engine.write_round(&jobs)));
            let Ok(results) = results else {
                // A bug: its writers must not hang, and must not be told
                // their rows are written. The array stays dirty and resyncs.
                eprintln!("uraid: a stripe worker failed; stopping the server");
                std::process::abort();
            };
            self.rounds.fetch_add(1, Ordering::Relaxed);
            self.rows.fetch_add(jobs.len() as u64, Ordering::Relaxed);
            for (job, result) in jobs.iter().zip(results) {
                job.finish(result);
            }
        }
        for q in claimed {
            self.queues[q].claimed.store(false, Ordering::SeqCst);
        }
        !jobs.is_empty()
    }
}

impl View<'_> {
    /// Whether a write of `piece` can go in a round's batches: a parity
    /// row with every member in sync and no replacement being built.
    fn plain(&self, piece: &Piece) -> bool {
        let map = &piece.map;
        let data = map.data.iter().map(|d| &d.copies[0]);
        let parity: Vec<_> = map.parity_places().collect();
        let mut places = data.chain(parity.iter());
        map.p.is_some()
            && places
                .all(|p| self.present(p) && self.table.replacing[self.home(p).member].is_none())
    }
}

impl Engine {
    /// One round of a stripe worker: the rows of `jobs` (one per lock slot)
    /// are locked in slot order and the plain ones run together in the
    /// row executor (one batch of reads, one journal commit, one batch of
    /// writes). The other rows take the one-row path under the same locks.
    fn write_round(&self, jobs: &[Arc<Job>]) -> Vec<io::Result<()>> {
        let mut slots: Vec<usize> = jobs.iter().map(|j| j.slot).collect();
        slots.sort_unstable();
        assert!(
            slots.windows(2).all(|w| w[0] < w[1]),
            "a round takes one job per lock slot"
        );
        let _guards: Vec<_> = slots
            .iter()
            .map(|&s| self.datapath.locks.lock_slot(s))
            .collect();
        let mut results: Vec<Option<io::Result<()>>> = jobs.iter().map(|_| None).collect();
        let mut _in_flight = Vec::new();
        for (k, job) in jobs.iter().enumerate() {
            match self.bitmap_start_write(job.stripe) {
                Ok(guard) => _in_flight.push(guard),
                Err(e) => results[k] = Some(Err(e)),
            }
        }
        let parts: Vec<Vec<(usize, &[u8])>> = jobs.iter().map(|j| j.parts()).collect();
        let maps: Vec<StripeMap> = jobs
            .iter()
            .map(|j| self.geometry().stripe(j.stripe))
            .collect();
        let table = self.table();
        let views: Vec<View> = jobs
            .iter()
            .map(|j| View {
                engine: self,
                table: table.clone(),
                stripe: j.stripe,
            })
            .collect();
        let pieces: Vec<Option<Piece>> = (0..jobs.len())
            .map(|k| match (&results[k], &parts[k][..]) {
                (None, &[(at, bytes)]) => {
                    let mut piece = Engine::piece(maps[k].clone(), at, bytes.len(), bytes);
                    piece.logged = jobs[k].logged;
                    piece.fua = jobs[k].fua;
                    Some(piece).filter(|piece| views[k].plain(piece))
                }
                _ => None,
            })
            .collect();
        // Plain rows have every member present, so they always plan; their
        // outcomes come back in the order they went in.
        let mut planned = Vec::new();
        let mut rows = Vec::new();
        for (k, piece) in pieces.iter().enumerate() {
            let Some(piece) = piece else { continue };
            match views[k].plan_write(piece, true) {
                Ok(write) => {
                    rows.push(Row {
                        view: &views[k],
                        write,
                    });
                    planned.push(k);
                }
                Err(e) => results[k] = Some(Err(e)),
            }
        }
        // A row whose read failed, or that did not fit the round's journal
        // commit, takes the one-row path: it corrects a read error from
        // redundancy and logs alone.
        for (k, outcome) in planned.into_iter().zip(self.run_rows(rows)) {
            if let RowOutcome::Written(result) = outcome {
                results[k] = Some(result);
            }
        }
        for (k, result) in results.iter_mut().enumerate() {
            if result.is_none() {
                self.datapath
                    .stripes
                    .rows_alone
                    .fetch_add(1, Ordering::Relaxed);
                // Some rows come here after a failed read: none prefetches.
                let (logged, fua) = (jobs[k].logged, jobs[k].fua);
                *result = Some(self.write_parts_locked(&maps[k], &parts[k], logged, fua, false));
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every job answered"))
            .collect()
    }
}
