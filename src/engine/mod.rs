//! The engine: a live, assembled array serving reads and writes.
//!
//! It owns the members (by role), the stripe locks, the array's superblock
//! state (dirty while serving, clean after an orderly stop) and the
//! background resync. Everything above it — the NBD export, the control
//! socket — calls its small API and never looks at the level.

mod bitmap;
mod datapath;
mod events;
pub mod exposure;
mod integrity;
mod jobs;
mod journal;
pub mod latency;
mod manage;
mod members;
mod position;
mod readd;
mod start;
mod table;
pub mod tuning;

pub use datapath::cache::CacheReport;
pub use events::Event;
pub use jobs::job::{SyncAction, SyncProgress};
pub use jobs::pace::{PaceReport, Why as PaceWhy};
pub use journal::{JournalError, JournalStats};

use crate::array::{Assembled, Cleanliness, DeviceState};
use crate::engine::position::Position;
use crate::export::{BlockBackend, BlockSizes, ZeroFlags};
use crate::geometry::{Geometry, Level};
use crate::member::MemberRef;
use crate::units::SECTOR_BYTES;
use datapath::{cache, Datapath};
use events::EventLog;
use jobs::resync::SyncWorker;
use jobs::{reshape, schedule};
use members::{MemberEntry, MemberTable};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Assemble(#[from] crate::array::AssembleError),
    #[error("{0}")]
    Superblock(#[from] crate::array::SuperblockError),
    #[error("the array has a write journal that was not given (or is out of date): its log may hold writes the members lack; give the journal device, or serve --read-only")]
    JournalMissing,
    #[error("a write journal is for raid4/5/6 arrays, not {level}")]
    JournalLevel { level: Level },
    #[error("the array has both a write journal and a bitmap, which md refuses to run")]
    JournalWithBitmap,
    #[error("{0}")]
    Journal(#[from] JournalError),
    #[error("replaying the write journal: {0}")]
    JournalReplay(std::io::Error),
    #[error("{0}")]
    Reshaping(String),
    #[error("the {level} array is degraded and was not shut down cleanly (a crash, or a stop after it failed): stripes being written then may reconstruct wrongly, and md refuses to start it too; `uraid serve --force` starts it from the members it has (as mdadm --assemble --force), at the risk that those stripes read back wrong: check the data on it (fsck) before trusting it")]
    DirtyDegraded { level: Level },
}

#[derive(Clone, Copy, Debug, Default)]
pub struct EngineOptions {
    /// Serve without writing anything, superblocks included.
    pub read_only: bool,
    /// Start a dirty degraded parity array anyway.
    pub force: bool,
    /// The knobs to start with; None: the defaults for this geometry.
    pub tuning: Option<tuning::TuningValues>,
    /// Write-back may be chosen without a journal (--i-accept-data-loss).
    pub accept_data_loss: bool,
}

pub struct Engine {
    /// The array's mapping. It changes only while no request is in
    /// flight (a reshape moves its point under the write side of
    /// `reshape_gate`), so a request reads it once per use and never
    /// sees two mappings.
    geometry: RwLock<Arc<Geometry>>,
    /// Held shared by every request from start to end, and exclusively by
    /// whatever changes the geometry: the reshape job while it moves rows
    /// and the point, a size change while it swaps the bounds (resize.rs).
    reshape_gate: RwLock<()>,
    /// A reshape is running: requests take only the plain paths (no
    /// stripe-cache batches, staged writes, extents for the server to
    /// read itself, or hot parity), whose mapping the gate protects.
    reshaping: std::sync::atomic::AtomicBool,
    /// The reshape job, when one runs (engine/jobs/reshape.rs).
    reshape_job: reshape::ReshapeJob,
    /// The members by role; swapped whole when membership changes.
    members: RwLock<Arc<MemberTable>>,
    /// The row-level request path's locks, caches, workers and counters
    /// (engine/datapath/).
    datapath: Datapath,
    read_only: bool,
    /// The superblocks and devices, for state updates and status.
    array: Mutex<Assembled>,
    sync: Arc<SyncWorker>,
    events: EventLog,
    /// Read errors repaired by rewriting from redundancy (md's cnt_corrected_read).
    corrected_reads: AtomicU64,
    /// Recent checksum errors per member, for the failure policy.
    checksum_policy: integrity::ChecksumPolicy,
    /// A mirror's copies hold the same bytes: false from an unclean start
    /// until a resync has finished (md's read_balance reads the first copy
    /// above the resync point, so that a block cannot change between two
    /// reads that chose different copies).
    mirrors_in_sync: std::sync::atomic::AtomicBool,
    /// md's mismatch_cnt: what the last check, repair or resync found.
    last_mismatch_sectors: AtomicU64,
    /// The engine itself, for work started from a request (a hot spare
    /// taking over after a failure needs a thread that owns the engine).
    me: OnceLock<Weak<Engine>>,
    /// Fault injectors wrapped around the members, by device path, when the
    /// array is served with fault injection enabled.
    injectors: Mutex<Vec<(String, Arc<crate::member::FaultyMember>)>>,
    /// What serve put around its members, put around members added later.
    member_wrapping: Mutex<crate::member::Wrapping>,
    /// What a health source outside the engine (SMART) last said of each
    /// member, by device path: shown, never acted on here.
    member_health: Mutex<Vec<(String, MemberHealth)>>,
    /// The live write-intent bitmap, when the array has one.
    bitmap: RwLock<Option<Arc<bitmap::LiveBitmap>>>,
    /// The consistency-check period.
    schedule: schedule::CheckSchedule,
    /// The seeds' knobs, live.
    tunables: tuning::Tunables,
    /// The write journal (md's raid5-cache, write-through), if the array
    /// has one.
    journal: Option<Arc<journal::Journal>>,
    /// The array was clean when it started with its journal: md's
    /// MD_JOURNAL_CLEAN, under which it is never marked as owing a resync.
    journal_clean: bool,
    /// Every member's bytes are in memory (`MemberTable::in_memory`).
    in_memory: std::sync::atomic::AtomicBool,
    /// A dRAID's distributed spares route their I/O to the members in
    /// sync in the table: kept current wherever the table changes.
    spare_router: Option<Arc<crate::array::SpareRouter>>,
    /// Why failed members failed, and their automatic re-add (readd.rs).
    returns: readd::Returns,
    /// Members removed, by path, until the last work that took them
    /// before the removal lets go (see `Engine::wait_let_go`).
    let_go: Mutex<Vec<(String, std::sync::Weak<dyn crate::member::Member>)>>,
    /// The clients' request latency, by window, for jobs that pace
    /// themselves by it (`rebuild_latency_target`).
    client_latency: latency::ClientLatency,
    /// The time at zero redundancy (exposure.rs), kept where the member
    /// table changes.
    exposure: exposure::Exposure,
}

impl Engine {
    /// Starts serving an assembled array: marks it active (dirty) and, if it
    /// was not shut down cleanly, starts resyncing it in the background.
    /// Each step is in engine/start.rs.
    pub fn start(mut array: Assembled, options: EngineOptions) -> Result<Arc<Engine>, EngineError> {
        start::refuse_unstartable(&array, &options)?;
        let reshaping = array.geometry.reshaping().is_some();
        let level = array.level();
        let journal = start::open_journal(&array)?;
        let (data_only, replayed) = match (&journal, options.read_only) {
            (Some(journal), false) => start::replay_journal(&mut array, journal)?,
            _ => (Vec::new(), false),
        };
        if !array.is_clean() || replayed {
            start::distrust_replacements(&mut array);
        }
        let journal_clean = journal.is_some() && array.is_clean();
        let geometry = array.geometry.clone();
        // A resync is owed from where the last one stopped; md records that
        // point in resync_offset when it shuts down mid-resync.
        let resync_owed = !array.is_clean() && level.redundant();
        // A reshape goes first and rewrites the rows it moves; the resync
        // owed runs over the new geometry once it ends.
        let resync_from = (resync_owed && !reshaping)
            .then(|| geometry.stripe_at_resync_position(array.sb.resync_offset_sectors));
        // The bitmap is read before the array is marked active: its bits say
        // which regions a crash may have left out of sync.
        let live_bitmap = bitmap::LiveBitmap::load(&array);
        if !options.read_only {
            start::mark_active(&mut array, live_bitmap.is_some(), journal_clean)?;
        }
        let mut table = start::member_table(&mut array, &geometry);
        table.refresh_routes(&geometry);
        let sync = SyncWorker::new(geometry.stripe_count());
        let first = geometry.stripe(0);
        let full_stripe = first.data_sectors();
        let in_memory = table.in_memory();
        // Counters for every role the array may come to have: a reshape
        // adds roles (up to the superblock's table of devices).
        let geometry_roles = geometry
            .raid_disks()
            .max(array.sb.max_dev as usize)
            .max(array.devices.len());
        let datapath = Datapath::new(
            &first,
            table.block_bytes(),
            journal.is_some(),
            geometry_roles,
        );
        let spare_router = array.spare_router.clone();
        let engine = Arc::new(Engine {
            geometry: RwLock::new(Arc::new(geometry)),
            reshape_gate: RwLock::new(()),
            reshaping: std::sync::atomic::AtomicBool::new(reshaping),
            reshape_job: reshape::ReshapeJob::default(),
            members: RwLock::new(Arc::new(table)),
            datapath,
            read_only: options.read_only,
            array: Mutex::new(array),
            sync,
            events: EventLog::default(),
            corrected_reads: AtomicU64::new(0),
            checksum_policy: integrity::ChecksumPolicy::default(),
            mirrors_in_sync: std::sync::atomic::AtomicBool::new(resync_from.is_none()),
            last_mismatch_sectors: AtomicU64::new(0),
            me: OnceLock::new(),
            injectors: Mutex::new(Vec::new()),
            member_wrapping: Mutex::new(crate::member::Wrapping::default()),
            member_health: Mutex::new(Vec::new()),
            returns: readd::Returns::default(),
            let_go: Mutex::new(Vec::new()),
            client_latency: latency::ClientLatency::default(),
            exposure: exposure::Exposure::default(),
            bitmap: RwLock::new(live_bitmap.map(Arc::new)),
            schedule: schedule::CheckSchedule::default(),
            tunables: tuning::Tunables::new(
                &options
                    .tuning
                    .unwrap_or_else(|| tuning::TuningValues::defaults(full_stripe)),
                // A journal protects write-back: what the cache acknowledges
                // is in it first.
                options.accept_data_loss || journal.is_some(),
            ),
            in_memory: std::sync::atomic::AtomicBool::new(in_memory),
            journal,
            journal_clean,
            spare_router,
        });
        engine.route_spares(&engine.table());
        engine.note_exposure(&engine.table());
        if !options.read_only {
            engine.start_bitmap_daemon();
        }
        let _ = engine.me.set(Arc::downgrade(&engine));
        let derive_by_check = start::open_integrity(&engine, resync_from.is_some() || reshaping)?;
        if !options.read_only {
            engine.ensure_workers();
            start::resume_work(&engine, data_only, reshaping, resync_owed, resync_from)?;
            start::derive_by_check(&engine, derive_by_check);
        }
        Ok(engine)
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry().array_sectors() * SECTOR_BYTES
    }

    /// Held by a request from start to end: a reshape moves rows and its
    /// point only while no request is in flight.
    fn request_gate(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.reshape_gate.read().unwrap()
    }

    /// The mapping now; see the field for when it changes.
    pub fn geometry(&self) -> Arc<Geometry> {
        self.geometry.read().unwrap().clone()
    }

    /// The largest logical block of any member: requests must be aligned to it.
    fn member_block_bytes(&self) -> u32 {
        self.datapath.block_bytes.load(Ordering::SeqCst)
    }

    /// Refuses a request that is not aligned to the members' blocks. Such a
    /// request would fail at the members (O_DIRECT refuses it) and look
    /// like a member's error: the member would be failed for the caller's
    /// mistake. The NBD export enforces the same alignment for clients.
    fn check_aligned(&self, offset: u64, len: usize) -> std::io::Result<()> {
        let block = self.member_block_bytes() as u64;
        if !offset.is_multiple_of(block) || !(len as u64).is_multiple_of(block) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a request of {len} bytes at {offset} is not aligned to the members' {block}-byte blocks"
                ),
            ));
        }
        // A connection opened before a shrink still knows the old size.
        if offset.saturating_add(len as u64) > self.size_bytes() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a request of {len} bytes at {offset} ends past the array's {} bytes",
                    self.size_bytes()
                ),
            ));
        }
        Ok(())
    }

    /// Flushes every present member, and every replacement being built:
    /// all completed writes become durable (the journal moves its tail on
    /// this, and a replacement's recorded copy position relies on it).
    pub fn flush_members(&self) -> std::io::Result<()> {
        let table = self.table();
        let replacing: Vec<(usize, &MemberRef)> = (table.replacing.iter().enumerate())
            .filter_map(|(role, e)| e.as_ref().map(|e| (role, &e.slot.member)))
            .collect();
        let present: Vec<(usize, &MemberRef)> = (table.by_role.iter().enumerate())
            .filter_map(|(role, e)| e.as_ref().map(|e| (role, &e.slot.member)))
            .collect();
        let members: Vec<&MemberRef> = (replacing.iter().chain(&present))
            .map(|(_, m)| *m)
            .collect();
        let mut results = flush_all(&members).into_iter();
        for (role, member) in &replacing {
            if let Err(e) = results.next().expect("a result per member") {
                self.abandon_replacement(*role, Some(member), &format!("flush error: {e}"));
            }
        }
        for (role, member) in &present {
            let Err(e) = results.next().expect("a result per member") else {
                continue;
            };
            // A member that cannot make its writes durable is failed, as
            // md fails a member whose flush errors.
            let reason = readd::failure_reason(format!("flush error: {e}"), &[&e]);
            self.fail_member_if(*role, Some(member), &reason);
            if !self.runnable() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The sequence number of the last event logged (0: none yet).
    pub fn last_event_seq(&self) -> u64 {
        self.events.last_seq()
    }

    /// Waits until an event after `after` is logged, `timeout` passes or
    /// `give_up` says so; true if one was.
    pub fn wait_for_event(
        &self,
        after: u64,
        timeout: std::time::Duration,
        give_up: impl Fn() -> bool,
    ) -> bool {
        self.events.wait_after(
            after,
            timeout,
            std::time::Duration::from_millis(200),
            give_up,
        )
    }

    /// A snapshot of the array for status and detail.
    pub fn snapshot(&self) -> Snapshot {
        let array = self.array.lock().unwrap();
        let mut snapshot = Snapshot::from_assembled(&array);
        // Read under the array lock, which a job's end holds while it logs
        // its events: the states and the events that explain them agree.
        snapshot.events = self.events.recent();
        drop(array);
        snapshot.sync = self
            .sync
            .progress(&self.geometry())
            .or_else(|| self.reshape_progress());
        snapshot.read_only = self.read_only;
        snapshot.serving = true;
        snapshot.bitmap_line = self.live_bitmap().map(|b| b.mdstat_line());
        snapshot.tuning = self.tunables();
        snapshot.injected_faults = self
            .injectors
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(path, injector)| {
                let faults: Vec<String> = injector.faults().iter().map(|f| f.to_string()).collect();
                (!faults.is_empty()).then(|| (path.clone(), faults))
            })
            .collect();
        snapshot.member_health = self.member_health.lock().unwrap().clone();
        snapshot.member_failures = self.returns.reasons();
        snapshot.zero_redundancy = self.exposure.report();
        snapshot
    }

    /// A member that was being rebuilt when the array last stopped resumes
    /// its recovery where its superblock says it stood.
    pub(super) fn resume_recovery(self: &Arc<Engine>) {
        let array = self.array.lock().unwrap();
        let table = self.table();
        let Some((index, role, offset)) =
            array
                .devices
                .iter()
                .enumerate()
                .find_map(|(i, d)| match d.state {
                    // Not yet in the table, or there since the start (in
                    // sync below its offset) with no job rebuilding it.
                    DeviceState::Recovering {
                        role,
                        recovery_offset_sectors,
                    } if table.entry(role).is_none_or(|e| {
                        e.rebuilt_below.is_some()
                            && self.sync.action() != Some(SyncAction::Recovery { role })
                            && self.sync.action() != Some(SyncAction::Replace { role })
                    }) =>
                    {
                        Some((i, role, recovery_offset_sectors))
                    }
                    _ => None,
                })
        else {
            return;
        };
        if !self.runnable() {
            return;
        }
        // One view of the geometry: a reshape may start as this runs, and
        // a reshaping geometry has no resync position (its own job
        // restarts recovery when it ends).
        let geometry = self.geometry();
        if matches!(*geometry, crate::geometry::Geometry::Reshaping(_)) {
            return;
        }
        let device = &array.devices[index];
        // An entry that has a position keeps it: whoever starts the job
        // (a spare's add racing the end of a check, say) then moves the
        // position that writes to the member look at (see job_owns_target).
        let live = table.entry(role).and_then(|e| e.rebuilt_below.clone());
        // And the job resumes there, not at the superblock's offset: writes
        // reach the member below the position, so it is in sync there, while
        // the offset is a checkpoint that lags behind it (raid10 records 0).
        // Moved back, the position would let writes skip the member, which
        // the end of the job that built it that far would then declare in
        // sync: that job may have cleared its action, which is all this
        // looks at, and not yet run its end (see resync::run).
        let from = match &live {
            Some(next) => next.load(Ordering::SeqCst),
            None => geometry.stripe_at_resync_position(offset),
        };
        let next = live.unwrap_or_else(|| Arc::new(Position::new(from)));
        let entry = members::MemberEntry {
            slot: members::slot_of(device),
            rebuilt_below: Some(next.clone()),
        };
        let path = device.path.clone();
        self.update_table(|t| t.by_role[role] = Some(entry));
        drop(array);
        self.events.push(
            "RebuildStarted",
            &path,
            &format!("resuming role {role} at stripe {from}"),
        );
        let _ = SyncWorker::start(self, SyncAction::Recovery { role }, from, next);
    }

    /// Starts a check (count mismatches) or repair (fix them), md's
    /// sync_action "check" and "repair". Refused while another job runs.
    pub fn start_scrub(self: &Arc<Engine>, repair: bool) -> Result<(), String> {
        if self.read_only && repair {
            return Err("the array is served read-only".into());
        }
        if !self.geometry().level().redundant() {
            return Err(format!(
                "{} has no redundancy to check",
                self.geometry().level()
            ));
        }
        let action = if repair {
            SyncAction::Repair
        } else {
            SyncAction::Check
        };
        SyncWorker::start(self, action, 0, Arc::new(Position::new(0)))?;
        if repair {
            self.restart_waiting_replacements();
        }
        self.events.push("RebuildStarted", "", action.word());
        Ok(())
    }

    /// A repair rewrites the members the table holds, not a replacement
    /// whose copy waits (stopped by "idle"): what it copied may differ from
    /// the repaired rows, so its copy starts over when it resumes.
    fn restart_waiting_replacements(&self) {
        let mut array = self.array.lock().unwrap();
        let table = self.table();
        let mut restarted = false;
        for (role, entry) in table.replacing.iter().enumerate() {
            if let Some(next) = entry.as_ref().and_then(|e| e.rebuilt_below.as_ref()) {
                next.store(0, Ordering::SeqCst);
                manage::set_recovery_offset(&mut array, SyncAction::Replace { role }, role, 0);
                restarted = true;
            }
        }
        if restarted {
            self.write_state(&mut array);
        }
    }

    /// md's sync_action "idle": stops the running job. A stopped resync or
    /// recovery stays owed and resumes at the next start.
    pub fn stop_sync(&self) -> Result<(), String> {
        match self.sync.action() {
            None => Err("no background job is running".into()),
            Some(action) => {
                self.sync.stop();
                self.events.push("SyncStopped", "", action.word());
                Ok(())
            }
        }
    }

    /// Changes one knob on the live array (`manage --set KEY=VALUE`).
    pub fn set_tunable(&self, key: &str, value: &str) -> Result<(), String> {
        if self.read_only && key == "write_policy" {
            return Err("the array is served read-only".into());
        }
        let (before, after) = self.tunables.set(key, value)?;
        if before.group_thread_cnt != after.group_thread_cnt && !self.read_only {
            self.ensure_workers();
        }
        if before.write_policy != after.write_policy {
            self.datapath.cache.wake_workers();
        }
        // A smaller pool lets go of its hot parity at once rather than as
        // later writes evict it (what is dropped is only read again).
        if after.stripe_cache_size < before.stripe_cache_size {
            self.datapath.parity_cache.clear();
        }
        if before != after {
            self.events
                .push("SettingChanged", "", &format!("{key}={value}"));
        }
        Ok(())
    }

    /// Changes several knobs at once, all or none, and saves them with the
    /// array's settings. Returns what is now in force.
    pub fn set_tunables(
        &self,
        settings: &[(String, String)],
        accept_data_loss: bool,
    ) -> Result<String, String> {
        // Everything is checked before anything changes: a refused command
        // leaves the knobs, and the permission to write back, as they were.
        let allowed = accept_data_loss || self.tunables.write_back_allowed();
        let mut check = self.tunables.values();
        for (k, v) in settings {
            if self.read_only && k == "write_policy" {
                return Err("the array is served read-only".into());
            }
            check.set(k, v, allowed)?;
        }
        let write_back = settings.iter().any(|(k, _)| k == "write_policy")
            && check.write_policy == tuning::WritePolicy::WriteBack;
        // Consent counts only for what it was given for: a command that
        // sets no write-back grants nothing, for this run or the next.
        if accept_data_loss && write_back {
            self.tunables.allow_write_back();
        }
        for (k, v) in settings {
            self.set_tunable(k, v)?;
        }
        let uuid = self.array.lock().unwrap().sb.uuid_string();
        // Saved write-back is saved with the consent that allowed it (this
        // command's, or the server's --i-accept-data-loss), so that the
        // next `serve` may start with it; a journal needs none, and one
        // saved for a journaled array would outlive the journal.
        let consent = write_back
            && self.journal.is_none()
            && (accept_data_loss || self.tunables.write_back_allowed());
        // In force already; a settings folder that cannot be written only
        // means they will not outlive this run, which the reply says.
        let saved = tuning::saved::save_changes(&uuid, settings, consent);
        let now = self.tunables.values().pairs();
        let shown: Vec<String> = settings
            .iter()
            .filter_map(|(k, _)| now.iter().find(|(n, _)| n == k))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Ok(match saved {
            Ok(()) => format!("set {}", shown.join(" ")),
            Err(e) => format!("set {} for this run only ({e})", shown.join(" ")),
        })
    }

    /// Sets the knobs `uraid tune` picked, as [`Engine::set_tunables`]
    /// does, and records with them that the tuner chose them and for what.
    pub fn apply_tuned(
        &self,
        settings: &[(String, String)],
        tuned: tuning::saved::Tuned,
    ) -> Result<String, String> {
        let message = self.set_tunables(settings, false)?;
        let uuid = self.array.lock().unwrap().sb.uuid_string();
        Ok(match tuning::saved::record_tuned(&uuid, tuned) {
            Ok(()) => format!("{message}; recorded as tuned"),
            Err(e) => format!("{message}; not recorded as tuned ({e})"),
        })
    }

    /// Writes every batch of the stripe cache to the members.
    fn write_out_cache(&self) -> std::io::Result<()> {
        self.datapath
            .cache
            .write_all(self.cache_entries_per_row(), &|batch, runs, buf| {
                self.destage(batch, runs, buf)
            })
    }

    /// Starts stripe workers up to group_thread_cnt and stripe-cache
    /// workers up to group_thread_cnt or one per core for 0 (they never
    /// stop before the engine: a lowered count leaves the extra ones idle).
    fn ensure_workers(&self) {
        let Some(me) = self.me.get().cloned() else {
            return;
        };
        let group = self.tunables.values().group_thread_cnt as usize;
        self.datapath.stripes.ensure(&me, group);
        let mut started = self.datapath.cache_workers.lock().unwrap();
        while *started < self.tunables.worker_threads() {
            let index = *started;
            let me = me.clone();
            let cache = self.datapath.cache.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("uraid-cache-{index}"))
                .spawn(move || cache_worker(&me, &cache, index));
            if spawned.is_err() {
                break;
            }
            *started += 1;
        }
    }

    /// Rows of hot parity the parity cache may hold. stripe_cache_size
    /// counts md's stripe heads, a page per member each (md's memory is
    /// PAGE × members × stripe_cache_size); a row of hot parity is only
    /// its parity pages, so the same memory holds more of them.
    fn parity_cache_rows(&self) -> usize {
        let members = self.geometry().raid_disks();
        let per_row = self.geometry().level().parity_members().max(1);
        self.tunables.stripe_cache_size() as usize * members / per_row
    }

    /// The stripe cache's occupancy and counters.
    pub fn cache_report(&self) -> CacheReport {
        self.datapath
            .cache_report(self.tunables.stripe_cache_size() as usize)
    }

    /// Writes out what the stripe cache holds and forgets what was read
    /// (the benchmarks' "drop caches": the next read goes to the members).
    pub fn drop_caches(&self) -> std::io::Result<()> {
        self.write_out_cache()?;
        self.datapath.forget_reads();
        Ok(())
    }

    /// The knobs as `detail` shows them: each value in force (see
    /// [`tuning::TuningValues::shown`]).
    pub fn tunables(&self) -> Vec<(String, String)> {
        self.tunables.values().shown(self.datapath.row.data_strips)
    }

    pub fn tuning(&self) -> tuning::TuningValues {
        self.tunables.values()
    }

    /// md's speed_limit_min / speed_limit_max for this array, KiB/s per member.
    pub fn set_speed_limits(&self, min_kib_per_s: Option<u64>, max_kib_per_s: Option<u64>) {
        if let Some(min) = min_kib_per_s {
            self.sync
                .speed_limit_min_kib_per_s
                .store(min, Ordering::SeqCst);
        }
        if let Some(max) = max_kib_per_s {
            self.sync
                .speed_limit_max_kib_per_s
                .store(max.max(1), Ordering::SeqCst);
        }
    }

    pub fn speed_limits(&self) -> (u64, u64) {
        (
            self.sync.speed_limit_min_kib_per_s.load(Ordering::SeqCst),
            self.sync.speed_limit_max_kib_per_s.load(Ordering::SeqCst),
        )
    }

    /// Records what a health source says of the member at `path` (None
    /// forgets it), for detail and status.
    pub fn set_member_health(&self, path: &str, health: Option<MemberHealth>) {
        let mut all = self.member_health.lock().unwrap();
        all.retain(|(p, _)| p != path);
        if let Some(health) = health {
            all.push((path.to_string(), health));
        }
    }

    /// Adds an event from outside the engine (a health source's
    /// prediction) to the array's log, which status and monitors read.
    pub fn raise_event(&self, event: &str, device: &str, detail: &str) {
        self.events.push(event, device, detail);
    }

    /// Registers the fault injectors of the members (serve --fault-injection).
    pub fn set_injectors(&self, injectors: Vec<(String, Arc<crate::member::FaultyMember>)>) {
        *self.injectors.lock().unwrap() = injectors;
    }

    /// The wrappers (fault injector, member timeout) that members added
    /// while serving get, as the members serve opened got them.
    pub fn set_member_wrapping(&self, wrapping: crate::member::Wrapping) {
        *self.member_wrapping.lock().unwrap() = wrapping;
    }

    /// A newly opened member in its wrappers; its injector, if any, is
    /// registered under `path` once the member is taken (`adopt_injector`).
    pub(super) fn wrap_new_member(&self, member: MemberRef) -> crate::member::Wrapped {
        let wrapping = *self.member_wrapping.lock().unwrap();
        wrapping.wrap(member)
    }

    /// Makes `injector` the one `manage --inject PATH` drives, in place of
    /// one a device at that path had before.
    pub(super) fn adopt_injector(
        &self,
        path: &str,
        injector: Option<Arc<crate::member::FaultyMember>>,
    ) {
        if let Some(injector) = injector {
            let mut injectors = self.injectors.lock().unwrap();
            injectors.retain(|(name, _)| !Self::same_device(name, std::path::Path::new(path)));
            injectors.push((path.to_string(), injector));
        }
    }

    /// Applies a fault (in the command-line syntax, e.g. "pull", "eio:read:1M+64K",
    /// "latency:5ms", "restore") to the member at `path`. Returns its new state.
    pub fn inject(&self, path: &std::path::Path, fault: &str) -> Result<String, String> {
        let injectors = self.injectors.lock().unwrap();
        if injectors.is_empty() {
            return Err("fault injection is off: serve the array with --fault-injection".into());
        }
        let canonical = |p: &std::path::Path| std::fs::canonicalize(p).ok();
        let (_, injector) = injectors
            .iter()
            .find(|(name, _)| {
                std::path::Path::new(name) == path
                    || canonical(std::path::Path::new(name)) == canonical(path)
            })
            .ok_or_else(|| format!("{} is not a member of this array", path.display()))?;
        let parsed: crate::member::Fault = fault.parse()?;
        // The event goes first: a pull fails the member at once, on another
        // thread, and the log must show the cause before its effect.
        let device = path.display().to_string();
        self.events.push("FaultInjected", &device, fault);
        if let Err(e) = injector.apply(&parsed) {
            self.events.push("FaultRejected", &device, &e.to_string());
            return Err(e.to_string());
        }
        Ok(injector.describe())
    }

    /// How the array is marked while it serves: with a live bitmap the bits
    /// on disk already cover what is being written.
    pub(super) fn active_state(&self) -> Cleanliness {
        if self.live_bitmap().is_some() {
            Cleanliness::DirtyTracked
        } else if self.journal_clean {
            Cleanliness::DirtyJournaled
        } else {
            Cleanliness::Dirty
        }
    }

    /// The journal's stats, for status.
    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.journal.as_ref().map(|j| j.stats())
    }

    /// A caller's member writes of logged rows are done.
    fn journal_done(&self, ticket: Option<journal::Ticket>) {
        if let (Some(journal), Some(ticket)) = (&self.journal, ticket) {
            journal.finished(ticket);
        }
    }

    fn set_journal_tail(&self, array: &mut Assembled, tail: u64) {
        for d in array.devices.iter_mut() {
            if d.state == DeviceState::Journal {
                d.sb.recovery_offset_sectors = tail;
            }
        }
    }

    /// Records a new journal tail on the journal device's superblock (md's
    /// r5l_write_super: only the journal's own superblock holds it).
    pub(super) fn record_journal_tail(&self, tail: u64) -> std::io::Result<()> {
        let mut array = self.array.lock().unwrap();
        self.set_journal_tail(&mut array, tail);
        let Some(device) = array.journal() else {
            return Ok(());
        };
        crate::array::write_superblock(&*device.member, &device.sb)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        device.member.flush()
    }

    /// The journal device failed a write: it is marked faulty and writes
    /// are refused from now on (md forces the array read-only).
    pub(super) fn journal_failed(&self, why: &str) {
        let mut array = self.array.lock().unwrap();
        let path = array.mark_faulty(|d| d.state == DeviceState::Journal);
        self.events.push("Fail", &path, why);
        let state = self.active_state();
        if let Err(e) = self.write_state_locked(&mut array, state) {
            eprintln!("uraid: recording the journal's failure: {e}");
        }
    }

    /// The check period and seconds until the next check, if scheduled.
    pub fn check_schedule(&self) -> Option<(Duration, u64)> {
        Some((self.schedule.period()?, self.schedule.due_in_secs()?))
    }

    /// The live write-intent bitmap, if the array has one now.
    pub(super) fn live_bitmap(&self) -> Option<Arc<bitmap::LiveBitmap>> {
        self.bitmap.read().unwrap().clone()
    }

    /// (dirty chunks, all chunks) of the live bitmap, if any.
    pub fn bitmap_dirty(&self) -> Option<(u64, u64)> {
        self.live_bitmap().map(|b| b.dirty_count())
    }

    /// md's mismatch_cnt.
    pub fn mismatch_sectors(&self) -> u64 {
        self.last_mismatch_sectors.load(Ordering::SeqCst)
    }

    /// What a stop leaves behind when the array has failed, for the log:
    /// None while it can serve all its data. A failed array keeps the
    /// superblocks it had (see `write_array_state_failing`), active as md
    /// keeps them, so that an assembly with the members back can try again;
    /// the next start then finds it dirty and degraded and asks for --force.
    pub fn failed_stop_note(&self) -> Option<String> {
        if self.runnable() {
            return None;
        }
        let in_sync = self.table().in_sync();
        let lost = in_sync.iter().filter(|s| !**s).count();
        Some(format!(
            "the array is failed ({lost} of {} members lost): its superblocks are left active (dirty), as md leaves them, so that an assembly can try again; with the members back, `uraid serve --force` starts it (as mdadm --assemble --force), at the risk that stripes written as it failed read back wrong",
            in_sync.len()
        ))
    }

    /// No background job runs and none is ending (its member marked in
    /// sync, the next job started): what mdadm --wait waits for.
    pub fn jobs_idle(&self) -> bool {
        self.sync.action().is_none() && !self.sync.threads.any()
    }

    /// Orderly stop: ends the background job, flushes, and marks the array
    /// clean — or records where an unfinished resync or recovery resumes.
    /// A failed array is not marked clean: its superblocks stay as they were
    /// (`failed_stop_note` says so).
    pub fn shutdown(&self) -> Result<Stopped, EngineError> {
        // What the cache holds reaches the members before anything stops.
        self.datapath.cache.stop.store(true, Ordering::SeqCst);
        self.datapath.cache.wake_workers();
        // A reshape stops between two windows: its point is on disk.
        self.pause_reshape();
        let written = self.write_out_cache();
        // No job may start from here on: a member failing the last flush
        // must not set off a rebuild that would outlive the stop.
        let resume = self.sync.close();
        if let Some(bitmap) = self.live_bitmap() {
            bitmap.stop();
        }
        if self.read_only {
            return Ok(Stopped::ReadOnly);
        }
        written
            .and_then(|()| self.flush_members())
            .map_err(|source| crate::array::SuperblockError::Io {
                device: "members".into(),
                source,
            })?;
        // Everything is on the members: the journal's chain ends here, and
        // the next start replays nothing.
        if let Some(journal) = &self.journal {
            if journal.failed().is_none() {
                let tail = journal
                    .close()
                    .map_err(|source| crate::array::SuperblockError::Io {
                        device: journal.path().to_string(),
                        source,
                    })?;
                self.set_journal_tail(&mut self.array.lock().unwrap(), tail);
            }
        }
        let percent = |stripe: u64| stripe * 100 / self.sync.stripe_count().max(1);
        let (state, stopped) = match resume {
            Some((SyncAction::Resync, stripe)) => {
                let sectors = self.geometry().resync_position_sectors(stripe);
                let stopped = Stopped::ResyncAt {
                    sectors,
                    percent: percent(stripe),
                };
                (Cleanliness::ResyncFrom(sectors), stopped)
            }
            Some((
                action @ (SyncAction::Recovery { role } | SyncAction::Replace { role }),
                stripe,
            )) => {
                let offset = manage::recovery_offset_of(&self.geometry(), stripe);
                let mut array = self.array.lock().unwrap();
                manage::set_recovery_offset(&mut array, action, role, offset);
                let stopped = Stopped::RecoveryAt {
                    role,
                    percent: percent(stripe),
                };
                (Cleanliness::Clean, stopped)
            }
            // A check or repair is not resumed (md starts none at assembly).
            _ => (Cleanliness::Clean, Stopped::Clean),
        };
        self.write_state_locked(&mut self.array.lock().unwrap(), state)?;
        // The checksums are closed at the event count the superblocks now
        // hold: a start that finds more knows the array ran elsewhere.
        self.close_integrity();
        Ok(stopped)
    }
}

/// What an orderly stop left on the members, to be said as it is: a
/// resync or recovery cut short is resumed at the next start, by uraid or
/// md, from the point written here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Marked clean, nothing left to do.
    Clean,
    /// Served read-only: nothing was written.
    ReadOnly,
    /// Clean below md's resync_offset, `sectors`; a resync resumes there.
    ResyncAt { sectors: u64, percent: u64 },
    /// The member in `role` is rebuilt up to its recovery_offset; the
    /// recovery resumes there.
    RecoveryAt { role: usize, percent: u64 },
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stopped::Clean => write!(f, "the array is marked clean"),
            Stopped::ReadOnly => write!(f, "served read-only, nothing written"),
            Stopped::ResyncAt { sectors, percent } => write!(
                f,
                "the resync stopped at {percent}% (resync_offset {sectors}): the array is clean \
                 below that point only, and the next start (uraid or md) resumes the resync there"
            ),
            Stopped::RecoveryAt { role, percent } => write!(
                f,
                "the recovery of role {role} stopped at {percent}%: the next start (uraid or md) \
                 resumes it there, and the array stays degraded until it ends"
            ),
        }
    }
}

/// One device as the engine sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotDevice {
    pub path: String,
    pub dev_number: u32,
    pub state: DeviceState,
    /// The member's I/O counters since it was opened (members that keep
    /// none: a distributed spare).
    pub io: Option<crate::member::IoCounts>,
    /// Blocks that failed their checksum since the member was opened
    /// (zpool status's CKSUM); None without `--integrity`.
    pub checksum_errors: Option<u64>,
    /// Blocks whose checksum is not known yet (not derived since the array
    /// ran elsewhere or crashed, or never written on a new member).
    pub untrusted_blocks: Option<u64>,
}

/// The live state of an array, for status, detail and monitoring.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub sb: crate::format::MemberSuper,
    pub devices: Vec<SnapshotDevice>,
    pub level: Level,
    pub array_sectors: u64,
    pub missing_roles: Vec<usize>,
    pub sync: Option<SyncProgress>,
    pub read_only: bool,
    /// Whether a running engine serves it (else it was read from the members).
    pub serving: bool,
    /// The time at zero redundancy, if there was any (served arrays).
    pub zero_redundancy: Option<exposure::ExposureReport>,
    /// Whether every array sector can be read.
    pub runnable: bool,
    /// Recent events (Fail, RebuildStarted, ...), oldest first.
    pub events: Vec<Event>,
    /// /proc/mdstat's "bitmap:" line, when the array has a live bitmap.
    pub bitmap_line: Option<String>,
    /// The knobs in force, as (name, value); empty when not served.
    pub tuning: Vec<(String, String)>,
    /// Injected faults in force, by member path, in the command-line
    /// syntax; only members with some, and only when served with fault
    /// injection, so that a slowed or failing member is never a mystery.
    pub injected_faults: Vec<(String, Vec<String>)>,
    /// A health source's word on members (SMART), by member path.
    pub member_health: Vec<(String, MemberHealth)>,
    /// Why each failed member failed (a reason beginning with "timeout"
    /// when it stopped answering), by path, while it stays failed.
    pub member_failures: Vec<(String, String)>,
}

/// A member's health as a source outside the engine sees it: a status
/// ("passed", "warning", "failing", "unavailable"), a line for people,
/// and the source's figures as data.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemberHealth {
    pub status: String,
    pub summary: String,
    pub detail: serde_json::Value,
}

impl Snapshot {
    /// The state of an array that is not running, from its superblocks.
    pub fn from_assembled(array: &Assembled) -> Snapshot {
        Snapshot {
            sb: array.sb.clone(),
            devices: array
                .devices
                .iter()
                .map(|d| SnapshotDevice {
                    path: d.path.clone(),
                    dev_number: d.sb.dev_number,
                    state: d.state.clone(),
                    io: d.member.io_stats().map(|s| s.counts()),
                    checksum_errors: d.member.integrity().map(|i| i.checksum_errors()),
                    untrusted_blocks: d.member.integrity().map(|i| i.untrusted_blocks()),
                })
                .collect(),
            level: array.level(),
            array_sectors: array.geometry.array_sectors(),
            missing_roles: array.missing_roles(),
            sync: None,
            read_only: false,
            serving: false,
            zero_redundancy: None,
            runnable: array.runnable(),
            events: Vec::new(),
            bitmap_line: None,
            tuning: Vec::new(),
            injected_faults: Vec::new(),
            member_health: Vec::new(),
            member_failures: Vec::new(),
        }
    }
}

/// A stripe-cache worker: writes out write-back batches that are due, on
/// the shards that are its own, until the engine stops.
///
/// It holds the engine only while it works, never while it sleeps: an
/// engine dropped without shutdown (a crash, in tests) must close its
/// members at once.
fn cache_worker(engine: &Weak<Engine>, cache: &cache::StripeCache, index: usize) {
    while !cache.stop.load(Ordering::SeqCst) {
        let busy = {
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let workers = engine.tunables.worker_threads();
            index < workers
                && cache.work(
                    index,
                    workers,
                    engine.cache_entries_per_row(),
                    engine.tunables.stripe_cache_size() as usize,
                    &|batch, runs, buf| engine.destage(batch, runs, buf),
                )
        };
        cache.idle_wait(busy);
    }
}

/// Records a client request's time in the engine when dropped
/// (`Engine::timed_request`).
struct TimedRequest<'a> {
    latency: &'a latency::ClientLatency,
    start: std::time::Instant,
}

impl Drop for TimedRequest<'_> {
    fn drop(&mut self) {
        self.latency.record(self.start.elapsed());
    }
}

impl Engine {
    /// Times a client request from here to the end of the caller's scope,
    /// for `rebuild_latency_target`; the clock is read only while the
    /// target is set.
    fn timed_request(&self) -> Option<TimedRequest<'_>> {
        (self.tunables.rebuild_latency_target_us() > 0).then(|| TimedRequest {
            latency: &self.client_latency,
            start: std::time::Instant::now(),
        })
    }

    /// The clients' latency windows, for a job's pacer.
    pub(in crate::engine) fn client_latency(&self) -> &latency::ClientLatency {
        &self.client_latency
    }
}

impl BlockBackend for Engine {
    fn size_bytes(&self) -> u64 {
        Engine::size_bytes(self)
    }

    fn block_sizes(&self) -> BlockSizes {
        let min = self.member_block_bytes();
        // The chunk is the largest power of two that maps to one member, so
        // it is the size that avoids splitting (raid1/linear have none).
        let chunk_bytes = match &*self.geometry() {
            Geometry::Raid456(_)
            | Geometry::Raid10(_)
            | Geometry::Raid0(_)
            | Geometry::Draid(_) => (self.geometry().stripe(0).strip_sectors * SECTOR_BYTES) as u32,
            _ => 64 * 1024,
        };
        BlockSizes {
            min,
            preferred: chunk_bytes.clamp(min.max(4096), 2 << 20),
            max_payload: 32 << 20,
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn reads_from_memory(&self) -> bool {
        self.in_memory.load(Ordering::Relaxed)
    }

    fn multi_conn_safe(&self) -> bool {
        // One engine serves every connection, and flush flushes every member.
        true
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let _timed = self.timed_request();
        let _gate = self.request_gate();
        self.check_aligned(offset, buf.len())?;
        self.datapath.foreground_ios.fetch_add(1, Ordering::Relaxed);
        self.read_cached(offset, buf, false)
    }

    fn read_among(&self, offset: u64, buf: &mut [u8], company: bool) -> std::io::Result<()> {
        let _timed = self.timed_request();
        let _gate = self.request_gate();
        self.check_aligned(offset, buf.len())?;
        self.datapath.foreground_ios.fetch_add(1, Ordering::Relaxed);
        self.read_cached(offset, buf, company)
    }

    fn times_requests(&self) -> bool {
        self.tunables.rebuild_latency_target_us() > 0
    }

    fn request_done(&self, elapsed: std::time::Duration) {
        self.client_latency.record(elapsed);
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        assert!(
            !self.read_only,
            "the export refuses writes on a read-only array"
        );
        let _timed = self.timed_request();
        let _gate = self.request_gate();
        self.check_aligned(offset, data.len())?;
        self.datapath.foreground_ios.fetch_add(1, Ordering::Relaxed);
        // A FUA write's member writes carry FUA themselves, data and parity
        // alike, so nothing else needs flushing, as md passes REQ_FUA to
        // the stripe's writes. While a reshape runs, the rows it moves are
        // written by its job too: everything is flushed instead.
        let reshaping = self.reshaping.load(Ordering::SeqCst);
        self.write_bytes(offset, data, fua)?;
        if fua && (reshaping || self.reshaping.load(Ordering::SeqCst)) {
            self.flush_members()?;
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        let _gate = self.request_gate();
        self.write_out_cache()?;
        self.flush_members()
    }

    fn read_extents(
        &self,
        offset: u64,
        len: usize,
        how: crate::export::ExtentUse,
    ) -> Option<Vec<crate::export::FileExtent>> {
        // The server reads these extents after the call, outside the
        // gate: while a reshape may move them, it is refused.
        let _gate = self.request_gate();
        if self.reshaping.load(Ordering::SeqCst) {
            return None;
        }
        self.check_aligned(offset, len).ok()?;
        let extents = self.file_extents(offset, len, how)?;
        self.datapath.foreground_ios.fetch_add(1, Ordering::Relaxed);
        Some(extents)
    }

    fn takes_staged_writes(&self, offset: u64, len: usize) -> bool {
        let _gate = self.request_gate();
        self.check_aligned(offset, len).is_ok() && self.takes_staged(offset, len)
    }

    fn write_staged(
        &self,
        offset: u64,
        len: usize,
        fua: bool,
        data: &mut dyn crate::export::StagedWrite,
    ) -> Option<std::io::Result<()>> {
        let _timed = self.timed_request();
        let _gate = self.request_gate();
        if self.check_aligned(offset, len).is_err() || !self.takes_staged(offset, len) {
            return None;
        }
        self.datapath.foreground_ios.fetch_add(1, Ordering::Relaxed);
        let result = self.write_staged_bytes(offset, len, data).and_then(|()| {
            if fua {
                self.flush_members()?;
            }
            Ok(())
        });
        Some(result)
    }

    fn optimal_io_bytes(&self) -> Option<u64> {
        let geometry = self.geometry();
        let row = match &*geometry {
            Geometry::Raid456(_) | Geometry::Raid0(_) | Geometry::Draid(_) => {
                geometry.stripe(0).data_sectors() * SECTOR_BYTES
            }
            // md's raid10: the chunk times the members one copy spans.
            Geometry::Raid10(r) if geometry.raid_disks().is_multiple_of(r.copies()) => {
                geometry.stripe(0).strip_sectors
                    * SECTOR_BYTES
                    * (geometry.raid_disks() / r.copies()) as u64
            }
            _ => return None,
        };
        Some(row)
    }

    fn max_io_bytes(&self) -> Option<u32> {
        Some(self.tuning().max_sectors_kb.saturating_mul(1024))
    }

    fn trim(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
        // Trim is a hint. Passing it to members would leave copies and
        // parity disagreeing on devices that do not read back zeroes, so
        // uraid keeps the data and reports success, as the protocol allows.
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> std::io::Result<()> {
        crate::export::write_zeroes_by_writing(
            self,
            offset,
            len,
            ZeroFlags {
                fua: flags.fua,
                may_trim: false,
            },
        )
    }
}

/// Flushes every member at once, as md sends a flush to every member
/// together: one after another, six hosts or disks would cost six round
/// trips or cache write-backs in a row. Members in memory flush at once,
/// and a thread each would cost more than the flush.
fn flush_all(members: &[&MemberRef]) -> Vec<std::io::Result<()>> {
    if members.len() < 2 || members.iter().all(|m| m.in_memory()) {
        return members.iter().map(|m| m.flush()).collect();
    }
    std::thread::scope(|scope| {
        let flushing: Vec<_> = (members.iter())
            .map(|m| scope.spawn(move || m.flush()))
            .collect();
        flushing
            .into_iter()
            .map(|f| f.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_checksums;
#[cfg(test)]
mod tests_draid;
#[cfg(test)]
mod tests_integrity;
#[cfg(test)]
mod tests_pace;
#[cfg(test)]
mod tests_reshape;
#[cfg(test)]
mod tests_reshape_raid10;
#[cfg(test)]
mod tests_shrink;
