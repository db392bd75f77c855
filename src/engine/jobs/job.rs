//! What a background job is and how fast it may go, apart from the worker
//! that runs it (resync.rs) and the batched rebuild it hands rows to
//! (rebuild.rs), so that both build on these without importing each other:
//! the action a job does to each stripe, its progress for status, how it
//! ended, and the throttle between speed_limit_min and speed_limit_max:
//! md's rule, or the pace the clients' latency allows (pace.rs).

use super::pace::{Pace, PaceReport, Why};
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

/// The job threads alive. A job's end runs after it clears its action
/// (so that the next job may start): the member it rebuilt is marked in
/// sync, the job that waited for it starts. Whoever waits for the array to
/// be idle (`manage --wait`, as mdadm --wait) asks this too, or it would
/// see a moment with no job and a member not yet in sync.
#[derive(Clone, Debug, Default)]
pub struct JobThreads(std::sync::Arc<std::sync::atomic::AtomicUsize>);

/// One job thread, counted from before its spawn to its end.
#[derive(Debug)]
pub struct JobThread(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl JobThreads {
    /// Counts a thread about to be spawned; the guard goes into it.
    pub fn enter(&self) -> JobThread {
        self.0.fetch_add(1, Ordering::SeqCst);
        JobThread(self.0.clone())
    }

    pub fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

impl Drop for JobThread {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "a job thread leaves that was never counted");
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
    /// The rate the job is held to now and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<PaceReport>,
    /// A rebuild that takes the rows at zero redundancy first: whether it
    /// walks them now, and how many it did ahead of its position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endangered_first: Option<FirstRows>,
}

/// A rebuild's walk of the rows at zero redundancy (jobs/rebuild.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FirstRows {
    /// The walk runs now; the position (done_kib) waits for it.
    pub walking: bool,
    /// Rows rebuilt ahead of the position.
    pub rows_done: u64,
}

/// How a finished job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Finished { mismatch_sectors: u64 },
    Stopped,
    Failed,
}

/// A job's throttle. Without a latency target, md's: the per-member rate
/// since the job started (or since the last mark) above the maximum
/// sleeps; above the minimum it yields while foreground I/O is active.
/// With `rebuild_latency_target`, the rate the clients' latency allows
/// (`Pace`), within the same limits. The target may be set or cleared
/// while the job runs: the next step follows it.
pub(in crate::engine) struct Throttle {
    mark: Instant,
    done_kib: u64,
    foreground_seen: u64,
    /// The pacer, while a latency target is set.
    pace: Option<Pace>,
}

impl Throttle {
    pub(in crate::engine) fn new() -> Throttle {
        Throttle {
            mark: Instant::now(),
            done_kib: 0,
            foreground_seen: 0,
            pace: None,
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
        if let Some(pace) = &mut self.pace {
            pace.count(kib);
        }
        self.done_kib += kib;
        // A 30-second window, as md measures its speed over SYNC_MARKS.
        if self.mark.elapsed() > Duration::from_secs(30) {
            self.mark = Instant::now();
            self.done_kib = kib;
        }
    }

    /// Whether `wait` would wait now: the job is above the maximum, or
    /// above the minimum while foreground I/O has come since the last look.
    pub(in crate::engine) fn would_wait(&mut self, engine: &Engine) -> bool {
        if let Some(pace) = self.paced(engine) {
            return !pace.owed().is_zero();
        }
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

    /// The pacer when a latency target is set (made or dropped as the
    /// target comes and goes), its window brought up to date.
    fn paced(&mut self, engine: &Engine) -> Option<&mut Pace> {
        let target_us = engine.tunables.rebuild_latency_target_us() as u64;
        if target_us == 0 {
            self.pace = None;
            return None;
        }
        let (min, max) = limits(engine);
        let (min, max) = (min.max(1) as f64, max as f64);
        let pace = self.pace.get_or_insert_with(|| Pace::new(min));
        if let Some(report) = pace.tick(engine.client_latency(), target_us, min, max.max(min)) {
            engine.sync.pace.show(report);
        }
        Some(pace)
    }

    /// Waits while the job runs too fast; `stop` ends a wait early.
    pub(in crate::engine) fn wait(&mut self, engine: &Engine, stop: &AtomicBool) {
        if self.paced(engine).is_some() {
            self.wait_paced(engine, stop);
            return;
        }
        self.wait_md(engine, stop);
    }

    /// Waits out what the job owes at the rate the clients' latency
    /// allows, in slices, so that a window that ends meanwhile (the
    /// clients went idle, the target changed) takes effect at once.
    fn wait_paced(&mut self, engine: &Engine, stop: &AtomicBool) {
        while let Some(pace) = self.paced(engine) {
            let owed = pace.owed();
            if owed.is_zero() || stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(owed.min(Duration::from_millis(20)));
        }
    }

    /// md's rule; says in status why the job goes as it does.
    fn wait_md(&mut self, engine: &Engine, stop: &AtomicBool) {
        // What held this step back, if anything: shown until the next step.
        let held = self.wait_md_steps(engine, stop);
        engine.sync.pace.show(PaceReport {
            rate_kib_per_s: held.1,
            why: held.0,
            client_p99_us: None,
            target_us: None,
        });
    }

    /// md's rule's waits; returns what held the step back and the limit
    /// it was held to (0: nothing held it).
    fn wait_md_steps(&mut self, engine: &Engine, stop: &AtomicBool) -> (Why, u64) {
        let mut held = (Why::Unthrottled, 0);
        loop {
            // Read again each time: a limit raised while the job sleeps
            // (or a latency target set) takes effect at once, as md reads
            // its limits at every step.
            if engine.tunables.rebuild_latency_target_us() > 0 {
                return held;
            }
            let (min, max) = limits(engine);
            let elapsed = self.mark.elapsed().as_secs_f64().max(1e-3);
            let speed = self.speed();
            if speed > max as f64 {
                held = (Why::SpeedLimitMax, max);
                // Sleep just long enough to fall back to the maximum.
                let wanted = self.done_kib as f64 / max as f64;
                std::thread::sleep(Duration::from_secs_f64(
                    (wanted - elapsed).clamp(0.001, 0.5),
                ));
                if stop.load(Ordering::SeqCst) {
                    return held;
                }
                continue;
            }
            let foreground = engine.datapath.foreground_ios.load(Ordering::Relaxed);
            let busy = foreground != self.foreground_seen;
            self.foreground_seen = foreground;
            if speed > min as f64 && busy && !stop.load(Ordering::SeqCst) {
                held = (Why::YieldingToClients, min);
                // Foreground I/O goes first while the minimum is met.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            return held;
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
