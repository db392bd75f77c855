//! Members that fail and come back: why each failed member failed (shown in
//! detail and status), and the automatic re-add of members that failed by a
//! timeout (`serve --auto-re-add`, `manage --auto-re-add on|off`).
//!
//! A member that stopped answering (a network path down, a member host
//! rebooting) is failed like any other, so that the array serves on from
//! redundancy; unlike a disk with I/O errors it is likely to come back
//! whole. With auto re-add on, a prober thread opens each such member
//! again now and then (`Member::reopen`: a new descriptor, a reconnect),
//! reads its superblock and, when it answers and belongs (this array's
//! UUID, its role still free, its events not ahead of the array's and not
//! older than the bitmap's last clear), re-adds it as `manage --add` does:
//! only the regions the write-intent bitmap marks are copied to it. A
//! member that failed with I/O errors, by request or without a bitmap to
//! guide its return is never re-added by itself.

use super::jobs::job::SyncAction;
use super::jobs::resync::SyncWorker;
use super::members::MemberEntry;
use super::Engine;
use crate::array::{Assembled, DeviceState, FoundDevice, Slot};
use crate::engine::position::Position;
use crate::format::{MemberSuper, Role, MD_FEATURE_RECOVERY_OFFSET, MD_FEATURE_REPLACEMENT};
use crate::member::MemberRef;
use crate::units::SECTOR_BYTES;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// How a reason for a failure begins when the member did not answer in
/// time, so that people and the prober can tell it from an I/O error.
pub const TIMEOUT_REASON: &str = "timeout";

/// How often failed members are probed.
const PROBE_PERIOD: Duration = Duration::from_secs(2);

fn written_bytes(member: &MemberRef) -> u64 {
    member.io_stats().map_or(0, |s| s.counts().write.bytes)
}

/// The reason for a failure caused by `errors`: `what`, or when one of
/// them is a timeout, "timeout: " and that error (the rest of the story,
/// a correction refused by the same silent member, adds nothing).
pub(super) fn failure_reason(what: String, errors: &[&io::Error]) -> String {
    match errors.iter().find(|e| e.kind() == io::ErrorKind::TimedOut) {
        Some(e) => format!("{TIMEOUT_REASON}: {e}"),
        None => what,
    }
}

#[derive(Default)]
pub(super) struct Returns {
    /// Why each failed device failed, by path, for as long as it stays failed.
    failures: Mutex<Vec<(String, String)>>,
    auto: AtomicBool,
    prober: OnceLock<()>,
    /// Members re-added through the bitmap, by path, with the bytes written
    /// to them when the copy started: its end says how much it copied.
    copies: Mutex<Vec<(String, u64)>>,
    /// Re-adds back in their roles whose copy waits for the running job
    /// (md queues a re-add behind a recovery as it does a spare), oldest
    /// first. At most one a role: a re-add needs its role free.
    queued: Mutex<Vec<QueuedReAdd>>,
}

/// A re-added member waiting for its bitmap-guided copy: its role, and the
/// position its table entry shares with the job that will build it.
struct QueuedReAdd {
    path: String,
    role: usize,
    next: Arc<Position>,
}

/// How a re-add was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReAdded {
    /// Its copy runs now.
    Started,
    /// Back in its role, its copy waits for the running job to end.
    Queued,
}

impl Returns {
    pub(super) fn failed(&self, path: &str, reason: &str) {
        if path.is_empty() {
            return;
        }
        let mut failures = self.failures.lock().unwrap();
        failures.retain(|(p, _)| p != path);
        failures.push((path.to_string(), reason.to_string()));
    }

    pub(super) fn back(&self, path: &str) {
        let path = std::path::Path::new(path);
        self.failures
            .lock()
            .unwrap()
            .retain(|(p, _)| !Engine::same_device(p, path));
    }

    pub(super) fn copy_started(&self, path: &str, member: &MemberRef) {
        let mut copies = self.copies.lock().unwrap();
        copies.retain(|(p, _)| p != path);
        copies.push((path.to_string(), written_bytes(member)));
    }

    /// What the end of a re-add's copy says: the bytes it wrote (the
    /// regions the bitmap marked, and the superblock and bitmap updates).
    pub(super) fn copy_finished(&self, path: &str, member: Option<&MemberRef>) -> String {
        let mut copies = self.copies.lock().unwrap();
        let Some(at) = copies.iter().position(|(p, _)| p == path) else {
            return String::new();
        };
        let (_, before) = copies.swap_remove(at);
        match member {
            Some(member) => format!(
                "re-add through the bitmap: {} KiB written",
                written_bytes(member).saturating_sub(before) / 1024
            ),
            None => String::new(),
        }
    }

    pub(super) fn reasons(&self) -> Vec<(String, String)> {
        self.failures.lock().unwrap().clone()
    }

    fn timed_out(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, reason)| reason.starts_with(TIMEOUT_REASON))
            .map(|(path, _)| path.clone())
            .collect()
    }
}

impl Engine {
    /// Turns the automatic re-add of members failed by a timeout on or off.
    pub fn set_auto_readd(self: &Arc<Engine>, on: bool) {
        self.returns.auto.store(on, Ordering::SeqCst);
        if on {
            self.returns.prober.get_or_init(|| {
                let weak = Arc::downgrade(self);
                let spawned = std::thread::Builder::new()
                    .name("uraid-readd".into())
                    .spawn(move || probe_loop(&weak));
                if let Err(e) = spawned {
                    eprintln!("uraid: automatic re-add not started: {e}");
                }
            });
        }
    }

    pub fn auto_readd(&self) -> bool {
        self.returns.auto.load(Ordering::SeqCst)
    }

    /// The member of the failed device at `path`, opened again; None when
    /// no failed device has that path, and `Unsupported` when its backend
    /// cannot open itself again.
    pub(super) fn reopen_failed(&self, path: &std::path::Path) -> Option<io::Result<MemberRef>> {
        let old = {
            let array = self.array.lock().unwrap();
            array
                .devices
                .iter()
                .find(|d| d.state == DeviceState::Faulty && Self::same_device(&d.path, path))
                .map(|d| d.member.clone())?
        };
        // Outside the array lock: a reconnect may take its time.
        Some(old.reopen())
    }

    /// One pass of the prober: each member failed by a timeout that opens
    /// again, answers and belongs is re-added through the bitmap.
    fn probe_failed(self: &Arc<Engine>) {
        if !self.auto_readd() || self.read_only || self.sync.action().is_some() {
            return;
        }
        for path in self.returns.timed_out() {
            let path = std::path::Path::new(&path);
            let member = match self.reopen_failed(path) {
                Some(Ok(member)) => member,
                // Removed meanwhile, or not back yet.
                None | Some(Err(_)) => continue,
            };
            if !self.belongs(&member) {
                continue;
            }
            if self.readd(path, &member).is_ok() {
                self.events.push(
                    "AutoReAdd",
                    &path.display().to_string(),
                    "answers again after a timeout",
                );
                // One job at a time: the next waits for this one.
                return;
            }
        }
    }

    /// Whether `member`'s superblock says it is this array's and not from
    /// its future: a member whose events are ahead of the array's was
    /// written by someone else meanwhile (assembled elsewhere), and its
    /// bitmap does not tell what differs.
    fn belongs(&self, member: &MemberRef) -> bool {
        let Ok(Some(sb)) = crate::array::read_superblock(&**member) else {
            return false;
        };
        let array = self.array.lock().unwrap();
        sb.set_uuid == array.sb.set_uuid && sb.events <= array.sb.events
    }
}

impl Engine {
    /// `uraid manage --re-add DEV` (mdadm --re-add): the member comes back
    /// into its role through the bitmap, or the reply says in one line why
    /// it cannot be a re-add (and that --add rebuilds it in full).
    pub fn manage_readd(self: &Arc<Engine>, path: &Path) -> Result<String, String> {
        let name = path.display().to_string();
        if self.read_only {
            return Err("the array is served read-only: nothing can be re-added".into());
        }
        self.refuse_present(path)?;
        // Its own superblock decides (see readd_refusal): another array's
        // device is refused there, so nothing of value is overwritten.
        let (member, injector) = self.open_returning(path, true)?;
        let taken = self.readd(path, &member)?;
        self.adopt_injector(&name, injector);
        Ok(match taken {
            ReAdded::Started => {
                format!("re-added {name}: copying only the regions the bitmap marks")
            }
            ReAdded::Queued => format!(
                "re-added {name}: its copy of the regions the bitmap marks starts when the running {} ends",
                self.sync.action().map_or("job", SyncAction::word)
            ),
        })
    }

    /// md's re-add: a member that left (failed, pulled, or missing at
    /// assembly) comes back with its superblock and the array has a trusted
    /// write-intent bitmap that covers everything written since it left:
    /// only the regions whose bits are set are copied to it. While another
    /// job runs it takes its role at once and its copy is queued; a check
    /// or repair gives way. The error says why it is no re-add (an `--add`
    /// then makes it a spare).
    pub(super) fn readd(
        self: &Arc<Engine>,
        path: &Path,
        member: &MemberRef,
    ) -> Result<ReAdded, String> {
        let name = path.display().to_string();
        if self.reshaping.load(Ordering::SeqCst) {
            return Err(format!(
                "{name} cannot be re-added while the array reshapes: re-add it once the reshape has finished"
            ));
        }
        let mut array = self.array.lock().unwrap();
        let (sb, role) = self.readd_refusal(&name, member, &array)?;
        // A member of an integrity array comes back with its checksums
        // (stale ones untrusted), or gets a region if it lost it.
        let member = &match array.integrity.is_empty() {
            true => member.clone(),
            false => self.with_integrity(&mut array, &name, member.clone(), &sb, false)?,
        };
        array.devices.retain(|d| !Self::same_device(&d.path, path));
        let next = Arc::new(Position::new(0));
        let entry = MemberEntry {
            slot: Slot {
                member: member.clone(),
                data_offset_bytes: sb.data_offset_sectors * SECTOR_BYTES,
            },
            rebuilt_below: Some(next.clone()),
        };
        array.devices.push(FoundDevice {
            path: name.clone(),
            sb,
            state: DeviceState::Recovering {
                role,
                recovery_offset_sectors: 0,
            },
            member: member.clone(),
        });
        self.update_table(|t| t.by_role[role] = Some(entry));
        self.write_state(&mut array);
        drop(array);
        self.returns.back(&name);
        self.returns.copy_started(&name, member);
        self.events.push(
            "ReAdd",
            &name,
            &format!("role {role}: copying only the regions the bitmap marks"),
        );
        self.queue_readd(QueuedReAdd {
            path: name.clone(),
            role,
            next,
        });
        self.give_way_to_recovery(&name);
        // The check that gave way may have started it already, as its end
        // starts recoveries.
        self.start_queued_readd();
        let waiting = self
            .returns
            .queued
            .lock()
            .unwrap()
            .iter()
            .any(|q| q.role == role);
        Ok(match waiting {
            true => ReAdded::Queued,
            false => ReAdded::Started,
        })
    }

    /// Why `member` cannot come back through the bitmap, in one line, or
    /// its superblock and the role it comes back to. Called with the array
    /// locked (`array`), so that the role found free stays free.
    fn readd_refusal(
        &self,
        name: &str,
        member: &MemberRef,
        array: &Assembled,
    ) -> Result<(MemberSuper, usize), String> {
        let in_full = "--add rebuilds it in full";
        let Some(bitmap) = self.live_bitmap() else {
            return Err(format!(
                "{name} cannot be re-added: the array has no write-intent bitmap to say what it missed; {in_full}"
            ));
        };
        if !bitmap.trusted {
            return Err(format!(
                "{name} cannot be re-added: the array's bitmap is stale (not trusted to bound a copy); {in_full}"
            ));
        }
        let sb = match crate::array::read_superblock(&**member) {
            Ok(Some(sb)) => sb,
            Ok(None) => {
                return Err(format!(
                    "{name} holds no md superblock: it was never a member; --add makes it a spare"
                ))
            }
            Err(e) => return Err(format!("{name} cannot be re-added: {e}")),
        };
        if sb.set_uuid != array.sb.set_uuid {
            return Err(format!(
                "{name} is a member of another array (UUID {}): only this array's own members can be re-added",
                sb.uuid_string()
            ));
        }
        let Role::Active(role) = sb.this_role() else {
            return Err(format!(
                "{name} held no role when it left (a spare, a journal or faulty); --add makes it a spare"
            ));
        };
        let role = role as usize;
        // Only a device that was in sync when it left holds everything the
        // bitmap does not mark: a replacement or a member part way through
        // a rebuild lacks what lay beyond its copy.
        if sb.feature_map & MD_FEATURE_REPLACEMENT != 0
            || (sb.feature_map & MD_FEATURE_RECOVERY_OFFSET != 0
                && sb.recovery_offset_sectors < array.sb.size_sectors)
        {
            return Err(format!(
                "{name} was partial when it left (a replacement or a member being rebuilt): the bitmap does not cover what it lacks; {in_full}"
            ));
        }
        if role >= self.geometry().raid_disks() {
            return Err(format!(
                "{name}'s role {role} is no longer in the array ({} members now); --add makes it a spare",
                self.geometry().raid_disks()
            ));
        }
        if self.table().entry(role).is_some() {
            let holder = array
                .devices
                .iter()
                .find(|d| {
                    matches!(d.state, DeviceState::Active { role: r } | DeviceState::Recovering { role: r, .. } if r == role)
                })
                .map_or_else(|| "another member".to_string(), |d| d.path.clone());
            return Err(format!(
                "{name}'s role {role} is taken by {holder}; --add makes it a spare"
            ));
        }
        let (_, events_cleared) = bitmap.events();
        if sb.events < events_cleared {
            return Err(format!(
                "{name} left at event {}, before the bitmap was last cleared (event {events_cleared}): the bitmap no longer covers what it missed; {in_full}",
                sb.events
            ));
        }
        if sb.events > array.sb.events {
            return Err(format!(
                "{name} is ahead of the array (events {} > {}): it was written elsewhere since it left; {in_full}",
                sb.events, array.sb.events
            ));
        }
        Ok((sb, role))
    }

    /// md interrupts a check or repair when a member can be recovered, so
    /// that the recovery runs first; the scrub's end starts it (sync_ended).
    /// Waits for the scrub to stop: the caller holds no lock it needs.
    pub(super) fn give_way_to_recovery(&self, path: &str) {
        let scrub = self.sync.action();
        if self
            .sync
            .stop_if(|a| matches!(a, SyncAction::Check | SyncAction::Repair))
        {
            let word = scrub.map_or("check", SyncAction::word);
            self.events.push(
                "SyncStopped",
                path,
                &format!("{word} interrupted for a recovery"),
            );
        }
    }

    /// Starts the copy of the oldest re-add waiting for its turn, if no
    /// job runs and the array can serve it; returns whether one started.
    /// A re-add whose member failed or left its role since is dropped.
    pub(super) fn start_queued_readd(self: &Arc<Engine>) -> bool {
        if !self.runnable() {
            return false;
        }
        let mut queued = self.returns.queued.lock().unwrap();
        queued.retain(|q| self.job_owns_target(SyncAction::Recovery { role: q.role }, &q.next));
        let Some(first) = queued.first() else {
            return false;
        };
        let action = SyncAction::Recovery { role: first.role };
        if SyncWorker::start_guided(self, action, 0, first.next.clone(), true).is_err() {
            // Another job runs (or the array stops): its end tries again.
            return false;
        }
        let started = queued.remove(0);
        drop(queued);
        self.events.push(
            "RebuildStarted",
            &started.path,
            &format!("re-add of role {} through the bitmap", started.role),
        );
        true
    }

    /// Queues `readd`'s copy, after those of re-adds still in their roles.
    fn queue_readd(&self, readd: QueuedReAdd) {
        let mut queued = self.returns.queued.lock().unwrap();
        queued.retain(|q| self.job_owns_target(SyncAction::Recovery { role: q.role }, &q.next));
        assert!(
            queued.iter().all(|q| q.role != readd.role),
            "a re-add takes a free role only"
        );
        queued.push(readd);
    }
}

fn probe_loop(weak: &Weak<Engine>) {
    loop {
        std::thread::sleep(PROBE_PERIOD);
        let Some(engine) = weak.upgrade() else {
            return;
        };
        if engine.sync.is_closed() {
            return;
        }
        engine.probe_failed();
    }
}
