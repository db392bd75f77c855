//! The background sync job: resync, recovery (rebuild onto a member),
//! check and repair, one at a time, as md's sync thread runs them. It walks
//! the stripes in order, in batches (rebuild.rs for recovery and replace,
//! scrub.rs for the rest) or one at a time where a batch met something
//! out of the ordinary, holding the stripes' locks while it works on them
//! so that it never races a write, and honours md's speed limits: above
//! speed_limit_max it sleeps; above speed_limit_min it yields to foreground
//! I/O. Its position is what a shutdown records (resync_offset, or the
//! rebuilt member's recovery_offset) so that a restart resumes.

use super::job::{Outcome, SyncAction, SyncProgress, Throttle};
use super::{rebuild, scrub};
use crate::array::{resync_with, Finding, Pass, StripeError};
use crate::engine::datapath::failure::PathError;
use crate::engine::members::Correction;
use crate::engine::position::Position;
use crate::engine::Engine;
use crate::geometry::Geometry;
use crate::units::SECTOR_BYTES;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// md's defaults (/proc/sys/dev/raid/speed_limit_min and _max), KiB/s per member.
pub const SPEED_LIMIT_MIN_KIB_PER_S: u64 = 1000;
pub const SPEED_LIMIT_MAX_KIB_PER_S: u64 = 200_000;

pub struct SyncWorker {
    /// The stripes a job walks: changes with the array's size or at the
    /// end of a reshape, never while a job runs.
    stripe_count: AtomicU64,
    action: Mutex<Option<SyncAction>>,
    /// The next stripe to process; shared with a rebuilding member's entry.
    next_stripe: Mutex<Arc<Position>>,
    first_stripe: AtomicU64,
    pub(in crate::engine) stop: AtomicBool,
    mismatch_sectors: AtomicU64,
    /// Pages a check or repair located (or could not) and logged as
    /// events: at most `FINDINGS_LOGGED_MAX` per job.
    findings_logged: AtomicU64,
    started: Mutex<Option<Instant>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The running recovery copies only regions the bitmap marks (a re-add).
    bitmap_guided: AtomicBool,
    /// A job that stopped or failed before the end, and where it stood.
    interrupted: Mutex<Option<(SyncAction, u64)>>,
    /// Set by an orderly shutdown: no job starts any more.
    closed: AtomicBool,
    pub speed_limit_min_kib_per_s: AtomicU64,
    pub speed_limit_max_kib_per_s: AtomicU64,
    /// The running job's pace, for status (written by its throttle).
    pub(in crate::engine) pace: super::pace::PaceShown,
    /// The running rebuild is taking the rows at zero redundancy first.
    endangered_walk: AtomicBool,
    /// The roles missing when the running rebuild chose its order.
    order_missing: std::sync::atomic::AtomicUsize,
    /// This worker's job threads and the reshape's, alive.
    pub(in crate::engine) threads: super::job::JobThreads,
}

impl SyncWorker {
    pub fn new(stripe_count: u64) -> Arc<SyncWorker> {
        Arc::new(SyncWorker {
            stripe_count: AtomicU64::new(stripe_count),
            action: Mutex::new(None),
            next_stripe: Mutex::new(Arc::new(Position::new(stripe_count))),
            first_stripe: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            mismatch_sectors: AtomicU64::new(0),
            findings_logged: AtomicU64::new(0),
            started: Mutex::new(None),
            thread: Mutex::new(None),
            bitmap_guided: AtomicBool::new(false),
            interrupted: Mutex::new(None),
            closed: AtomicBool::new(false),
            speed_limit_min_kib_per_s: AtomicU64::new(SPEED_LIMIT_MIN_KIB_PER_S),
            speed_limit_max_kib_per_s: AtomicU64::new(SPEED_LIMIT_MAX_KIB_PER_S),
            pace: super::pace::PaceShown::default(),
            endangered_walk: AtomicBool::new(false),
            order_missing: std::sync::atomic::AtomicUsize::new(0),
            threads: super::job::JobThreads::default(),
        })
    }

    /// The running rebuild chose its order with `missing` roles missing.
    pub(in crate::engine) fn order_chosen(&self, missing: usize) {
        self.order_missing.store(missing, Ordering::SeqCst);
    }

    pub(in crate::engine) fn order_chosen_for(&self) -> usize {
        self.order_missing.load(Ordering::SeqCst)
    }

    /// Adds to the running job's count of mismatched sectors.
    pub(in crate::engine) fn add_mismatches(&self, sectors: u64) {
        self.mismatch_sectors.fetch_add(sectors, Ordering::SeqCst);
    }

    /// Says whether the running rebuild walks its endangered rows now.
    pub(in crate::engine) fn walking_endangered(&self, walking: bool) {
        self.endangered_walk.store(walking, Ordering::SeqCst);
    }

    /// The array's size or shape changed: jobs walk `stripe_count` stripes
    /// from now.
    pub fn set_stripe_count(&self, stripe_count: u64) {
        self.stripe_count.store(stripe_count, Ordering::SeqCst);
    }

    pub(in crate::engine) fn stripe_count(&self) -> u64 {
        self.stripe_count.load(Ordering::SeqCst)
    }

    pub fn action(&self) -> Option<SyncAction> {
        *self.action.lock().unwrap()
    }

    /// Starts `action` at `from_stripe`, with `next` as the shared position
    /// (a rebuilding member's entry holds the same counter). Refused while
    /// another job runs.
    pub fn start(
        engine: &Arc<Engine>,
        action: SyncAction,
        from_stripe: u64,
        next: Arc<Position>,
    ) -> Result<(), String> {
        Self::start_guided(engine, action, from_stripe, next, false)
    }

    /// [`start`](Self::start), for a recovery that copies only what the
    /// bitmap marks (a re-add) when `guided`. The flag is set with the job,
    /// under the action lock: set before a start that is then refused, it
    /// would make the job already running skip the stripes the bitmap
    /// calls clean, leaving them unbuilt on its member.
    pub fn start_guided(
        engine: &Arc<Engine>,
        action: SyncAction,
        from_stripe: u64,
        next: Arc<Position>,
        guided: bool,
    ) -> Result<(), String> {
        let worker = engine.sync.clone();
        let mut current = worker.action.lock().unwrap();
        if let Some(running) = *current {
            return Err(format!("a {} is already running", running.word()));
        }
        // md runs no resync, recovery or check while a reshape is under
        // way; they start when it ends.
        if engine.reshaping.load(Ordering::SeqCst) {
            return Err("a reshape is in progress".into());
        }
        if worker.closed.load(Ordering::SeqCst) {
            return Err("the array is shutting down".into());
        }
        // A previous job has ended (it cleared the action) but its thread may
        // still be finishing its hooks, which can wait for this very lock:
        // let it go (detach) rather than join it while holding the lock.
        drop(worker.thread.lock().unwrap().take());
        next.store(from_stripe, Ordering::SeqCst);
        *worker.next_stripe.lock().unwrap() = next;
        worker.first_stripe.store(from_stripe, Ordering::SeqCst);
        worker.stop.store(false, Ordering::SeqCst);
        worker.bitmap_guided.store(guided, Ordering::SeqCst);
        worker.mismatch_sectors.store(0, Ordering::SeqCst);
        worker.findings_logged.store(0, Ordering::SeqCst);
        *worker.interrupted.lock().unwrap() = None;
        *worker.started.lock().unwrap() = Some(Instant::now());
        // A new job has shown no pace yet.
        worker.pace.show(super::pace::PaceReport {
            rate_kib_per_s: 0,
            why: super::pace::Why::Unthrottled,
            client_p99_us: None,
            target_us: None,
        });
        *current = Some(action);
        // The thread holds the engine weakly: dropping the engine ends it.
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let alive = worker.threads.enter();
        let handle = std::thread::Builder::new()
            .name(format!("uraid-{}", action.word()))
            .spawn(move || {
                run(weak, action);
                drop(alive);
            })
            .map_err(|e| e.to_string())?;
        *worker.thread.lock().unwrap() = Some(handle);
        Ok(())
    }

    /// Stops the running job and waits for it. Returns the action that was
    /// interrupted and the stripe it must resume at.
    pub fn stop(&self) -> Option<(SyncAction, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        let handle = self.thread.lock().unwrap().take();
        join_unless_self(handle);
        self.interrupted.lock().unwrap().take()
    }

    /// Stops the running job only if it is one that `wanted` picks, and
    /// waits for it; returns whether it stopped one. The look and the flag
    /// go under the action lock: a caller that looked first and stopped
    /// after could stop the job that started in between (the end of the
    /// job it meant starts the next one), which then would not run.
    pub fn stop_if(&self, wanted: impl Fn(SyncAction) -> bool) -> bool {
        let handle = {
            let current = self.action.lock().unwrap();
            if !current.is_some_and(&wanted) {
                return false;
            }
            self.stop.store(true, Ordering::SeqCst);
            // `start` stores the handle before it lets the action lock go,
            // so this is the job just looked at.
            self.thread.lock().unwrap().take()
        };
        join_unless_self(handle);
        true
    }

    /// Stops the running job for good: no job starts after this (an
    /// orderly shutdown). Returns what `stop` returns.
    pub fn close(&self) -> Option<(SyncAction, u64)> {
        {
            // Under the action lock, so that a start racing this either
            // sees the flag or started a job that `stop` then stops.
            let _current = self.action.lock().unwrap();
            self.closed.store(true, Ordering::SeqCst);
        }
        self.stop()
    }

    /// Asks a running check or repair to stop, without waiting for it (the
    /// caller may hold a stripe lock the job needs). md interrupts a sync
    /// when a member fails, so that recovery can start.
    pub fn interrupt_scrub(&self) -> Option<SyncAction> {
        self.interrupt(|a| matches!(a, SyncAction::Check | SyncAction::Repair))
    }

    /// Asks the running job to stop if `pick` picks it, without waiting
    /// for it; returns the job asked.
    pub fn interrupt(&self, pick: impl Fn(SyncAction) -> bool) -> Option<SyncAction> {
        let current = self.action.lock().unwrap();
        let job = current.filter(|&a| pick(a))?;
        self.stop.store(true, Ordering::SeqCst);
        Some(job)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Called by the job's thread as it ends.
    fn ended(&self, action: SyncAction, outcome: Outcome) {
        self.bitmap_guided.store(false, Ordering::SeqCst);
        let next = self.next_stripe.lock().unwrap().load(Ordering::SeqCst);
        if outcome
            != (Outcome::Finished {
                mismatch_sectors: self.mismatch_sectors.load(Ordering::SeqCst),
            })
        {
            *self.interrupted.lock().unwrap() = Some((action, next));
        }
        *self.action.lock().unwrap() = None;
    }

    pub fn progress(&self, geometry: &Geometry) -> Option<SyncProgress> {
        let action = self.action()?;
        let next = self.next_stripe.lock().unwrap().load(Ordering::SeqCst);
        let first = self.first_stripe.load(Ordering::SeqCst);
        let done_kib = geometry.resync_position_sectors(next) / 2;
        let total_kib = geometry.resync_position_sectors(self.stripe_count()) / 2;
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
        let walking = self.endangered_walk.load(Ordering::SeqCst);
        let ahead_rows = self.next_stripe.lock().unwrap().ahead_count();
        let first = (walking || ahead_rows > 0).then_some(super::job::FirstRows {
            walking,
            rows_done: ahead_rows,
        });
        Some(SyncProgress {
            action,
            done_kib,
            total_kib,
            speed_kib_per_s: speed,
            mismatch_sectors: self.mismatch_sectors.load(Ordering::SeqCst),
            pace: Some(self.pace.report()),
            endangered_first: first,
        })
    }
}

/// Waits for a job's thread, unless it is the caller (a job's own end may
/// stop it), which would wait for itself.
fn join_unless_self(handle: Option<std::thread::JoinHandle<()>>) {
    if let Some(handle) = handle {
        if handle.thread().id() != std::thread::current().id() {
            let _ = handle.join();
        }
    }
}

/// Whether the job copies only what the bitmap marks: a resync, and a
/// recovery started guided (a re-add).
fn guided(worker: &SyncWorker, action: SyncAction) -> bool {
    action == SyncAction::Resync
        || (matches!(action, SyncAction::Recovery { .. })
            && worker.bitmap_guided.load(Ordering::SeqCst))
}

fn run(weak: Weak<Engine>, action: SyncAction) {
    let mut throttle = Throttle::new();
    let mut retries = 0usize;
    // Up to here the job goes one stripe at a time (after a batch that met
    // an error, or a stripe batches do not handle); past it, in batches.
    let mut one_by_one_until = 0u64;
    if let Some(engine) = weak.upgrade() {
        // The rows one more failure would lose go first (rebuild.rs).
        let next = engine.sync.next_stripe.lock().unwrap().clone();
        let guided = guided(&engine.sync, action);
        rebuild::rebuild_endangered_first(&engine, action, &next, guided, &mut throttle);
    }
    let outcome = loop {
        let Some(engine) = weak.upgrade() else { return };
        let worker = &engine.sync;
        let next = worker.next_stripe.lock().unwrap().clone();
        let stripe = next.load(Ordering::SeqCst);
        if worker.stop.load(Ordering::SeqCst) {
            break Outcome::Stopped;
        }
        if !engine.job_owns_target(action, &next) {
            // Its member left the role (failed, or replaced by one with a
            // rebuild of its own): what this job does is no longer wanted,
            // and its end must not touch the role (see sync_ended).
            break Outcome::Stopped;
        }
        if stripe >= worker.stripe_count() {
            break Outcome::Finished {
                mismatch_sectors: worker.mismatch_sectors.load(Ordering::SeqCst),
            };
        }
        let guided = guided(worker, action);
        if scrub::batched(action) && stripe >= one_by_one_until {
            let mut report = |f: &crate::array::Finding| report_finding(&engine, action, f);
            match scrub::run_batches(&engine, action, &next, guided, &mut throttle, &mut report) {
                rebuild::Ended::OneByOne { until } => one_by_one_until = until.max(stripe + 1),
                rebuild::Ended::Yielded | rebuild::Ended::Reorder => {}
            }
            continue;
        }
        if rebuild::batched(action) && stripe >= one_by_one_until {
            match rebuild::run_batches(&engine, action, &next, guided, &mut throttle) {
                rebuild::Ended::Yielded => {}
                rebuild::Ended::Reorder => {
                    rebuild::rebuild_endangered_first(
                        &engine,
                        action,
                        &next,
                        guided,
                        &mut throttle,
                    );
                }
                rebuild::Ended::OneByOne { until } => one_by_one_until = until.max(stripe + 1),
            }
            continue;
        }
        if (guided && !engine.stripe_needs_resync(stripe)) || next.is_ahead(stripe) {
            // The bitmap says this region was quiet at the crash, or the
            // row was rebuilt ahead with the endangered ones.
            next.store(stripe + 1, Ordering::SeqCst);
            continue;
        }
        let map = engine.geometry().stripe(stripe);
        let result = one_stripe(&engine, action, stripe, &map, &next);
        match result {
            Ok(mismatches) => {
                retries = 0;
                worker
                    .mismatch_sectors
                    .fetch_add(mismatches, Ordering::SeqCst);
                engine.sync_progressed(action, stripe, stripe + 1);
                throttle.account(
                    &engine,
                    map.strip_sectors * SECTOR_BYTES / 1024,
                    &engine.sync.stop,
                );
            }
            Err(failure) => {
                // A member's error is handled as on the request path (correct
                // from redundancy, or fail the member), and the stripe is
                // tried again, a bounded number of times.
                retries += 1;
                let again = retries <= engine.geometry().raid_disks();
                match (&failure, action) {
                    // A distributed spare being rebuilt met the error on the
                    // child holding its space: the child fails, and the
                    // stripe goes on without it (the spare's column there is
                    // homed at the child, rebuilt with it).
                    (PathError::Array(e), SyncAction::Recovery { role })
                        if again && crate::array::dspare::child_of(e).is_some() =>
                    {
                        let reason =
                            crate::engine::readd::failure_reason(format!("write error: {e}"), &[e]);
                        engine.fail_blamed(role, None, e, &reason);
                        continue;
                    }
                    // A replace reads the member it copies: its read errors
                    // are corrected like any other member's; a rebuild's
                    // target is not read.
                    (PathError::MemberRead { role, error }, _)
                        if again && action != (SyncAction::Recovery { role: *role }) =>
                    {
                        match engine.correct_read_error(stripe, *role, error, false) {
                            Correction::Done => continue,
                            // A scrub goes on past a row whose bytes are
                            // lost (the event names it); a rebuild or a
                            // copy has nothing to write there and stops.
                            Correction::Lost(_) if scrubs(action) => {
                                next.store(stripe + 1, Ordering::SeqCst);
                                engine.sync_progressed(action, stripe, stripe + 1);
                                continue;
                            }
                            Correction::Lost(_) => {}
                        }
                    }
                    _ => {}
                }
                let e = failure.into_io();
                engine.events.push(
                    "SyncFailed",
                    "",
                    &format!("{} stopped at stripe {stripe}: {e}", action.word()),
                );
                break Outcome::Failed;
            }
        }
    };
    if let Some(engine) = weak.upgrade() {
        // mismatch_cnt and the end of a scrub or resync are in place before
        // the job disappears from status: once it has, the next job may
        // start and finish before this thread runs on.
        if let Outcome::Finished { mismatch_sectors } = outcome {
            if action == SyncAction::Resync {
                engine.mirrors_in_sync.store(true, Ordering::SeqCst);
            }
            if matches!(
                action,
                SyncAction::Check | SyncAction::Repair | SyncAction::Resync
            ) {
                engine
                    .last_mismatch_sectors
                    .store(mismatch_sectors, Ordering::SeqCst);
                engine.events.push(
                    "RebuildFinished",
                    "",
                    &format!("{}: mismatches found: {mismatch_sectors}", action.word()),
                );
            }
        }
        let next = engine.sync.next_stripe.lock().unwrap().clone();
        engine.sync.ended(action, outcome);
        engine.sync_ended(action, outcome, &next);
    }
}

/// How many located (or unlocatable) pages one check or repair logs as
/// events; the count of mismatches goes on past it.
const FINDINGS_LOGGED_MAX: u64 = 64;

/// A check, repair or resync of one stripe, under its lock: md's count of
/// mismatched sectors, and each page the syndromes could decode reported
/// (and on a repair, healed) as an event.
/// One stripe of the job, under its lock: rebuilt onto the target, copied
/// onto the replacement, or scrubbed; the position moves past it when it
/// is done. Returns the mismatched sectors found.
fn one_stripe(
    engine: &Arc<Engine>,
    action: SyncAction,
    stripe: u64,
    map: &crate::geometry::StripeMap,
    next: &Arc<Position>,
) -> Result<u64, PathError> {
    let _guard = engine.datapath.locks.lock(stripe);
    // The job may rewrite this stripe's parity: none stays hot.
    engine
        .datapath
        .parity_cache
        .drop_stripe(stripe, (map.strip_sectors * SECTOR_BYTES) as usize);
    let step = match action {
        SyncAction::Recovery { role } => {
            let view = engine.view(stripe);
            let target = view.table.entry(role).cloned().filter(|e| {
                e.rebuilt_below
                    .as_ref()
                    .is_some_and(|below| Arc::ptr_eq(below, next))
            });
            match target {
                Some(target) => view.rebuild_onto(map, role, &target).map(|_| 0),
                None => Err(PathError::Array(std::io::Error::other(
                    "the member being rebuilt is gone",
                ))),
            }
        }
        SyncAction::Replace { role } => {
            // The member itself still serves, so its content is read
            // (or rebuilt, if it fails to read) and written to the copy.
            // Its original failed and it holds the role now, still
            // rebuilt only up to here: the copy goes on as a rebuild.
            let view = engine.view(stripe);
            let promoted = || {
                view.table.by_role[role]
                    .clone()
                    .filter(|e| e.rebuilt_below.is_some())
            };
            match view.table.replacing[role].clone().or_else(promoted) {
                Some(target) => view.rebuild_onto(map, role, &target).map(|_| 0),
                None => Err(PathError::Array(std::io::Error::other(
                    "the replacement is gone",
                ))),
            }
        }
        SyncAction::Reshape => unreachable!("a reshape is not the sync worker's job"),
        SyncAction::Resync | SyncAction::Check | SyncAction::Repair => {
            scrub_stripe(engine, action, stripe)
        }
    };
    if step.is_ok() {
        // Advanced under the stripe lock: a writer waiting for this
        // stripe then sees a rebuilt member as in sync here.
        next.store(stripe + 1, Ordering::SeqCst);
    }
    step
}

fn scrubs(action: SyncAction) -> bool {
    matches!(
        action,
        SyncAction::Check | SyncAction::Repair | SyncAction::Resync
    )
}

fn scrub_stripe(engine: &Arc<Engine>, action: SyncAction, stripe: u64) -> Result<u64, PathError> {
    let pass = match action {
        SyncAction::Check => Pass::Check,
        SyncAction::Repair => Pass::Repair,
        _ => Pass::Resync,
    };
    let slots = engine.in_sync_slots(stripe);
    let geometry = engine.geometry();
    let reads = &engine.datapath.reads;
    if pass == Pass::Repair {
        // A repair may rewrite data: what is being read now is not kept.
        reads.write_begins();
    }
    let mut findings = Vec::new();
    let report = resync_with(
        &geometry,
        &slots,
        stripe..stripe + 1,
        pass,
        |_| {},
        |f| findings.push(*f),
    )
    .map_err(|e| match e {
        // Corrected from redundancy by the job, as a read on the request
        // path is, and the row tried again.
        StripeError::MemberRead { role, error } => PathError::MemberRead { role, error },
        e => PathError::Array(std::io::Error::other(e.to_string())),
    });
    if pass == Pass::Repair {
        let map = geometry.stripe(stripe);
        let start = map.array_sector * SECTOR_BYTES;
        reads.write_done(start..start + map.data_sectors() * SECTOR_BYTES);
    }
    for finding in &findings {
        report_finding(engine, action, finding);
    }
    report.map(|r| r.mismatch_sectors)
}

/// A page a check or repair decoded, as an event: the member and sectors
/// of the block the row's syndromes blame, or that no one block explains
/// the page.
fn report_finding(engine: &Engine, action: SyncAction, f: &Finding) {
    use crate::parity::Culprit;
    if engine.sync.findings_logged.fetch_add(1, Ordering::SeqCst) >= FINDINGS_LOGGED_MAX {
        return;
    }
    let what = match f.culprit {
        Culprit::Data(i) => format!("data strip {i}"),
        Culprit::P => "P".to_string(),
        Culprit::Q => "Q".to_string(),
        Culprit::R => "R".to_string(),
        Culprit::Consistent | Culprit::Unknown => String::new(),
    };
    match f.place {
        Some(place) => {
            let member = engine
                .table()
                .entry(place.member)
                .map(|e| e.slot.member.name().to_string())
                .unwrap_or_else(|| format!("role {}", place.member));
            let done = match (f.repaired, f.culprit) {
                (false, _) => format!("left as found ({})", action.word()),
                (true, Culprit::Data(_)) => "rewritten from the row's parity".to_string(),
                (true, _) => "recomputed from the data".to_string(),
            };
            engine.events.push(
                "MismatchLocated",
                &member,
                &format!(
                    "stripe {}, {what}, member sectors {}..{}: {done}",
                    f.stripe,
                    place.member_sector,
                    place.member_sector + f.sectors
                ),
            );
        }
        None => {
            let done = if f.repaired {
                "parity recomputed from the data (md's repair)".to_string()
            } else {
                format!("left as found ({})", action.word())
            };
            engine.events.push(
                "MismatchUnlocated",
                "",
                &format!(
                    "stripe {}, strip sectors {}..{}: more than one block disagrees; {done}",
                    f.stripe,
                    f.strip_sector,
                    f.strip_sector + f.sectors
                ),
            );
        }
    }
}
