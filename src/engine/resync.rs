//! The background resync: walks the stripes in order and makes each one's
//! redundancy agree with its data, holding that stripe's lock so it never
//! races a write. Its position is what a shutdown records as the superblock's
//! resync_offset, so that the next start resumes instead of restarting.

use super::Engine;
use crate::array::resync;
use crate::geometry::Geometry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// Progress of the running background operation, for status output.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SyncProgress {
    /// md's word for it: "resync".
    pub action: &'static str,
    /// Done and total, in md's unit (1 KiB blocks as /proc/mdstat prints).
    pub done_kib: u64,
    pub total_kib: u64,
    /// Average speed since the start, in KiB/s.
    pub speed_kib_per_s: u64,
    pub mismatch_sectors: u64,
}

pub struct SyncWorker {
    stripe_count: u64,
    /// The next stripe to resync; stripe_count once finished.
    next_stripe: AtomicU64,
    first_stripe: AtomicU64,
    running: AtomicBool,
    stop: AtomicBool,
    mismatch_sectors: AtomicU64,
    started: Mutex<Option<Instant>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl SyncWorker {
    pub fn new(stripe_count: u64) -> Arc<SyncWorker> {
        Arc::new(SyncWorker {
            stripe_count,
            next_stripe: AtomicU64::new(stripe_count),
            first_stripe: AtomicU64::new(0),
            running: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            mismatch_sectors: AtomicU64::new(0),
            started: Mutex::new(None),
            thread: Mutex::new(None),
        })
    }

    pub fn start_resync(engine: &Arc<Engine>, from_stripe: u64) {
        let worker = engine.sync.clone();
        worker.next_stripe.store(from_stripe, Ordering::SeqCst);
        worker.first_stripe.store(from_stripe, Ordering::SeqCst);
        worker.running.store(true, Ordering::SeqCst);
        *worker.started.lock().unwrap() = Some(Instant::now());
        // The thread holds the engine weakly: dropping the engine ends it.
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let handle = std::thread::Builder::new()
            .name("uraid-resync".into())
            .spawn(move || run(weak))
            .expect("spawn the resync thread");
        *worker.thread.lock().unwrap() = Some(handle);
    }

    /// Stops the worker; returns the stripe a later resync must resume at,
    /// or None when nothing is owed.
    pub fn stop(&self) -> Option<u64> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.thread.lock().unwrap().take() {
            let _ = handle.join();
        }
        let next = self.next_stripe.load(Ordering::SeqCst);
        (next < self.stripe_count).then_some(next)
    }

    pub fn progress(&self, geometry: &Geometry) -> Option<SyncProgress> {
        if !self.running.load(Ordering::SeqCst) {
            return None;
        }
        let next = self.next_stripe.load(Ordering::SeqCst);
        let first = self.first_stripe.load(Ordering::SeqCst);
        let done_kib = geometry.resync_position_sectors(next) / 2;
        let total_kib = geometry.resync_position_sectors(self.stripe_count) / 2;
        let first_kib = geometry.resync_position_sectors(first) / 2;
        let elapsed = self
            .started
            .lock()
            .unwrap()
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let speed = if elapsed > 0.0 {
            ((done_kib - first_kib) as f64 / elapsed) as u64
        } else {
            0
        };
        Some(SyncProgress {
            action: "resync",
            done_kib,
            total_kib,
            speed_kib_per_s: speed,
            mismatch_sectors: self.mismatch_sectors.load(Ordering::SeqCst),
        })
    }
}

fn run(weak: Weak<Engine>) {
    loop {
        let Some(engine) = weak.upgrade() else { return };
        let worker = &engine.sync;
        let stripe = worker.next_stripe.load(Ordering::SeqCst);
        if worker.stop.load(Ordering::SeqCst) || stripe >= worker.stripe_count {
            worker.running.store(false, Ordering::SeqCst);
            return;
        }
        let result = {
            let _guard = engine.locks.lock(stripe);
            resync(
                &engine.geometry,
                &engine.slots,
                stripe..stripe + 1,
                true,
                |_| {},
            )
        };
        match result {
            Ok(report) => {
                worker
                    .mismatch_sectors
                    .fetch_add(report.mismatch_sectors, Ordering::SeqCst);
                worker.next_stripe.store(stripe + 1, Ordering::SeqCst);
            }
            Err(e) => {
                // Member failures are handled with the failure work; until
                // then the resync stops here and stays owed.
                eprintln!("uraid: resync stopped at stripe {stripe}: {e}");
                worker.running.store(false, Ordering::SeqCst);
                return;
            }
        }
    }
}
