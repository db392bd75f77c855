//! What a background job is and how fast it may go, apart from the worker
//! that runs it (resync.rs) and the batched rebuild it hands rows to
//! (rebuild.rs), so that both build on these without importing each other:
//! the action a job does to each stripe, its progress for status, how it
//! ended, and md's throttle between speed_limit_min and speed_limit_max.

use crate::engine::Engine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What the job does to each stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncAction {
    /// Make redundancy agree with data after an unclean stop.
    Resync,
    /// Rebuild the member in this role from the others.
    Recovery { role: usize },
    /// Copy the member in this role onto its replacement (mdadm --replace).
    Replace { role: usize },
    /// Count mismatches, change nothing.
    Check,
    /// Count mismatches and rewrite redundancy where it disagrees.
    Repair,
    /// Move the array to a new geometry (the reshape job, engine/jobs/reshape.rs;
    /// shown here for status only, it never runs as this worker's job).
    Reshape,
}

impl SyncAction {
    /// md's word, as /proc/mdstat and sync_action show it.
    pub fn word(self) -> &'static str {
        match self {
            SyncAction::Resync => "resync",
            SyncAction::Recovery { .. } | SyncAction::Replace { .. } => "recovery",
            SyncAction::Check => "check",
            SyncAction::Repair => "repair",
            SyncAction::Reshape => "reshape",
        }
    }
}

/// Progress of the running background operation, for status output.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SyncProgress {
    pub action: SyncAction,
    /// Done and total, in 1 KiB blocks as /proc/mdstat prints them.
    pub done_kib: u64,
    pub total_kib: u64,
    /// Average speed since the start, KiB/s per member.
    pub speed_kib_per_s: u64,
    pub mismatch_sectors: u64,
}

/// How a finished job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Finished { mismatch_sectors: u64 },
    Stopped,
    Failed,
}

/// md's throttle: the per-member rate since the job started (or since the
/// last mark) above the maximum sleeps; above the minimum it yields while
/// foreground I/O is active.
pub(in crate::engine) struct Throttle {
    mark: Instant,
    done_kib: u64,
    foreground_seen: u64,
}

impl Throttle {
    pub(in crate::engine) fn new() -> Throttle {
        Throttle {
            mark: Instant::now(),
            done_kib: 0,
            foreground_seen: 0,
        }
    }

    /// Accounts `kib` per member done, and waits while the job runs too
    /// fast; `stop` ends a wait early.
    pub(in crate::engine) fn account(&mut self, engine: &Engine, kib: u64, stop: &AtomicBool) {
        self.count(kib);
        self.wait(engine, stop);
    }

    /// Accounts `kib` per member done, without waiting.
    pub(in crate::engine) fn count(&mut self, kib: u64) {
        self.done_kib += kib;
        // A 30-second window, as md measures its speed over SYNC_MARKS.
        if self.mark.elapsed() > Duration::from_secs(30) {
            self.mark = Instant::now();
            self.done_kib = kib;
        }
    }

    /// Whether `wait` would wait now: the job is above the maximum, or
    /// above the minimum while foreground I/O has come since the last look.
    pub(in crate::engine) fn would_wait(&self, engine: &Engine) -> bool {
        let (min, max) = limits(engine);
        let speed = self.speed();
        let foreground = engine.datapath.foreground_ios.load(Ordering::Relaxed);
        speed > max as f64 || (speed > min as f64 && foreground != self.foreground_seen)
    }

    /// The rate since the mark, KiB/s.
    fn speed(&self) -> f64 {
        let elapsed = self.mark.elapsed().as_secs_f64().max(1e-3);
        self.done_kib as f64 / elapsed
    }

    /// Waits while the job runs too fast; `stop` ends a wait early.
    pub(in crate::engine) fn wait(&mut self, engine: &Engine, stop: &AtomicBool) {
        let (min, max) = limits(engine);
        loop {
            let elapsed = self.mark.elapsed().as_secs_f64().max(1e-3);
            let speed = self.speed();
            if speed > max as f64 {
                // Sleep just long enough to fall back to the maximum.
                let wanted = self.done_kib as f64 / max as f64;
                std::thread::sleep(Duration::from_secs_f64(
                    (wanted - elapsed).clamp(0.001, 0.5),
                ));
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            let foreground = engine.datapath.foreground_ios.load(Ordering::Relaxed);
            let busy = foreground != self.foreground_seen;
            self.foreground_seen = foreground;
            if speed > min as f64 && busy && !stop.load(Ordering::SeqCst) {
                // Foreground I/O goes first while the minimum is met.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            return;
        }
    }
}

/// md's speed_limit_min and speed_limit_max, KiB/s per member.
fn limits(engine: &Engine) -> (u64, u64) {
    let sync = &engine.sync;
    let min = sync.speed_limit_min_kib_per_s.load(Ordering::Relaxed);
    let max = sync.speed_limit_max_kib_per_s.load(Ordering::Relaxed);
    (min, max.max(1))
}
