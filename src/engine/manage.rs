//! Membership changes of a running array, with md's semantics: fail,
//! remove, add (a spare, or a recovery at once if the array is degraded),
//! hot spares taking over a failed member, and the hooks the background job
//! calls as it progresses and ends.

use super::jobs::job::{Outcome, SyncAction};
use super::jobs::resync::SyncWorker;
use super::members::MemberEntry;
use super::Engine;
use crate::array::dspare::is_spare_name;
use crate::array::{DeviceState, FoundDevice, Slot};
use crate::engine::position::Position;
use crate::format::MD_FEATURE_RECOVERY_OFFSET;
use crate::geometry::Geometry;
use crate::member::{MemberRef, OpenOptions};
use crate::units::SECTOR_BYTES;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How long `--add` waits for work still holding a member removed under the
/// same path: the work in flight when it was removed, milliseconds.
const LET_GO_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Records how far the job `action` has rebuilt `role`, on the device it
/// rebuilds: the member being recovered (Recovery), or the replacement
/// (Replace), which is a member being recovered once promoted (its
/// original failed). A replacement waiting beside a recovery of its role
/// is not that job's device.
pub(super) fn set_recovery_offset(
    array: &mut crate::array::Assembled,
    action: SyncAction,
    role: usize,
    offset: u64,
) {
    // A point within the member's data: array::update asserts it again as
    // it writes it, and assembly takes one at or past the end as in sync.
    assert!(
        offset <= array.sb.size_sectors,
        "recovery offset {offset} past the component size {}",
        array.sb.size_sectors
    );
    for d in array.devices.iter_mut() {
        match (&mut d.state, action) {
            (
                DeviceState::Recovering {
                    role: r,
                    recovery_offset_sectors,
                },
                SyncAction::Recovery { .. } | SyncAction::Replace { .. },
            )
            | (
                DeviceState::Replacement {
                    role: r,
                    recovery_offset_sectors,
                },
                SyncAction::Replace { .. },
            ) if *r == role => *recovery_offset_sectors = offset,
            _ => {}
        }
    }
}

/// Where a per-device recovery position stands, in md's recovery_offset
/// (sectors of the member from its data offset). raid10's stripes are array
/// chunks whose copies are not in member order, so a partial raid10
/// recovery is recorded as not started, which is always safe.
/// The sectors of a new member md may use: all of it, or with checksums
/// what their region leaves (it keeps one after md's data area, as its
/// peers do); refused when that is less than the array needs.
fn room_for_new_member(
    name: &str,
    member: &MemberRef,
    needed: u64,
    integrity: bool,
) -> Result<u64, String> {
    let room = match integrity {
        true => crate::array::integrity::usable_sectors(member.size_sectors()).unwrap_or(0),
        false => member.size_sectors(),
    };
    if room < needed {
        let checksums = if integrity {
            " and room for its checksums"
        } else {
            ""
        };
        return Err(format!(
            "{name}: too small ({} sectors, needs {needed}{checksums})",
            member.size_sectors()
        ));
    }
    Ok(room)
}

pub(super) fn recovery_offset_of(geometry: &Geometry, next_stripe: u64) -> u64 {
    match geometry {
        Geometry::Raid10(_) => 0,
        _ => geometry.resync_position_sectors(next_stripe),
    }
}

impl Engine {
    pub(super) fn same_device(a: &str, b: &Path) -> bool {
        let canon = |p: &Path| std::fs::canonicalize(p).ok();
        Path::new(a) == b || (canon(Path::new(a)).is_some() && canon(Path::new(a)) == canon(b))
    }

    /// Members in sync for `stripe`, by role, as offline slots (for resync
    /// and check): a member rebuilt past the stripe counts.
    pub(super) fn in_sync_slots(&self, stripe: u64) -> crate::array::Slots {
        let table = self.table();
        (0..table.by_role.len())
            .map(|role| {
                table
                    .entry(role)
                    .filter(|_| table.usable(role, stripe))
                    .map(|e| e.slot.clone())
            })
            .collect()
    }

    /// `uraid manage --fail DEV`, refused when the array could no longer
    /// serve its data after it (see [`manage_fail_with`](Self::manage_fail_with)).
    pub fn manage_fail(&self, path: &Path) -> Result<(), String> {
        self.manage_fail_with(path, false)
    }

    /// `uraid manage --fail DEV [--force]`. md refuses to fail the last
    /// in-sync copy of a mirror (EBUSY) and zpool any offline that leaves
    /// no valid replica; uraid refuses, for every level, a failure by
    /// request that the geometry says the array would not survive, unless
    /// `force`. A member that fails by itself (I/O errors, a timeout) is
    /// failed whatever is left: that is `fail_member`, not this.
    pub fn manage_fail_with(&self, path: &Path, force: bool) -> Result<(), String> {
        let (role, spare) = {
            let array = self.array.lock().unwrap();
            let device = array
                .devices
                .iter()
                .find(|d| Self::same_device(&d.path, path))
                .ok_or_else(|| format!("{} is not a member of this array", path.display()))?;
            match device.state {
                DeviceState::Active { role } | DeviceState::Recovering { role, .. } => {
                    (Some(role), false)
                }
                DeviceState::Spare => (None, true),
                DeviceState::Replacement { role, .. } => {
                    drop(array);
                    self.sync.stop_if(|a| a == SyncAction::Replace { role });
                    self.abandon_replacement(role, None, "failed by request");
                    return Ok(());
                }
                _ => return Err(format!("{} is already faulty", path.display())),
            }
        };
        match role {
            Some(role) => {
                if !force {
                    self.refuse_fail_beyond_redundancy(path, role)?;
                }
                // A recovery onto this member cannot go on (nor a copy onto
                // a replacement that took the role as a member being rebuilt).
                let rebuilding = !spare
                    && self
                        .table()
                        .entry(role)
                        .is_some_and(|e| e.rebuilt_below.is_some());
                self.sync.stop_if(|a| {
                    a == SyncAction::Recovery { role }
                        || (rebuilding && a == SyncAction::Replace { role })
                });
                self.fail_member(role, "failed by request");
            }
            None if spare => {
                let mut array = self.array.lock().unwrap();
                if let Some(d) = array
                    .devices
                    .iter_mut()
                    .find(|d| Self::same_device(&d.path, path))
                {
                    d.state = DeviceState::Faulty;
                }
                self.events.push(
                    "FailSpare",
                    &path.display().to_string(),
                    "failed by request",
                );
                self.write_state(&mut array);
            }
            None => {}
        }
        Ok(())
    }

    /// Refuses to fail `role` by request when the array serves its data now
    /// and would not without that member: the geometry answers, from the
    /// members in sync, for every level alike. Requests come one at a time
    /// over the control socket, so nothing fails by request in between;
    /// a member that fails by itself meanwhile only makes the array worse
    /// off than this check saw, which the request path handles as ever.
    fn refuse_fail_beyond_redundancy(&self, path: &Path, role: usize) -> Result<(), String> {
        let geometry = self.geometry();
        let mut missing: Vec<bool> = self.table().in_sync().iter().map(|s| !s).collect();
        assert_eq!(missing.len(), geometry.raid_disks());
        if !geometry.survives(&missing) {
            // It serves nothing already: failing another member loses nothing more.
            return Ok(());
        }
        missing[role] = true;
        if geometry.survives(&missing) {
            return Ok(());
        }
        let lost = missing.iter().filter(|m| **m).count();
        Err(format!(
            "failing {} would leave the {} array with {lost} of {} members missing: it could no longer serve its data; --force to fail it anyway",
            path.display(),
            geometry.level(),
            missing.len()
        ))
    }

    /// `uraid manage --remove DEV`: only a failed member or a spare can go.
    pub fn manage_remove(&self, path: &Path) -> Result<(), String> {
        let mut array = self.array.lock().unwrap();
        let index = array
            .devices
            .iter()
            .position(|d| Self::same_device(&d.path, path))
            .ok_or_else(|| format!("{} is not a member of this array", path.display()))?;
        match array.devices[index].state {
            DeviceState::Active { .. } | DeviceState::Recovering { .. } => {
                return Err(format!(
                    "{} is active: fail it first (md refuses too)",
                    path.display()
                ))
            }
            DeviceState::Replacement { .. } => {
                return Err(format!(
                    "{} is a replacement being built: fail it first (md refuses too)",
                    path.display()
                ))
            }
            _ => {}
        }
        let removed = array.devices.remove(index);
        {
            // Members nobody holds any more are forgotten here too, so the
            // list stays as short as the work in flight.
            let mut let_go = self.let_go.lock().unwrap();
            let_go.retain(|(_, member)| member.strong_count() > 0);
            let_go.push((removed.path.clone(), Arc::downgrade(&removed.member)));
        }
        self.returns.back(&removed.path);
        self.events.push("Remove", &removed.path, "");
        self.write_state(&mut array);
        Ok(())
    }

    /// Waits, `LET_GO_WAIT` at most, until no work holds a member removed
    /// under `path`. Work that took the member table just before a removal
    /// (a destage, a read being answered) keeps the removed member open a
    /// moment longer, and with it a file's claim: an `--add` of the same
    /// file right after the `--remove` would be refused as in use.
    fn wait_let_go(&self, path: &Path) {
        let deadline = std::time::Instant::now() + LET_GO_WAIT;
        loop {
            let held = {
                let mut let_go = self.let_go.lock().unwrap();
                let_go.retain(|(_, member)| member.strong_count() > 0);
                let_go.iter().any(|(p, _)| Self::same_device(p, path))
            };
            if !held || std::time::Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// `uraid manage --add DEV`, refused over a device that holds something
    /// of value (see [`manage_add_with`](Self::manage_add_with)).
    pub fn manage_add(self: &Arc<Engine>, path: &Path) -> Result<(), String> {
        self.manage_add_with(path, false)
    }

    /// `uraid manage --add DEV [--force]`: a member that left comes back
    /// through the bitmap when it can (a re-add), any other device becomes
    /// a spare, and a recovery onto it starts at once if the array is
    /// degraded (or when the running one ends). Another array's member, a
    /// filesystem or a partition table is not overwritten unless `force`,
    /// as create refuses them.
    pub fn manage_add_with(self: &Arc<Engine>, path: &Path, force: bool) -> Result<(), String> {
        let name = path.display().to_string();
        self.refuse_present(path)?;
        let (member, injector) = self.open_returning(path, force)?;
        if self.readd(path, &member).is_ok() {
            self.adopt_injector(&name, injector);
            return Ok(());
        }
        {
            let mut array = self.array.lock().unwrap();
            if array
                .devices
                .iter()
                .any(|d| Self::same_device(&d.path, path) && d.state != DeviceState::Faulty)
            {
                return Err(format!("{name} is already a member of this array"));
            }
            if !self.geometry().level().redundant() {
                return Err(format!(
                    "a {} array has no redundancy to rebuild a member from",
                    self.geometry().level()
                ));
            }
            // The new device takes its offsets from a member in a role:
            // mid-reshape that member records the move of the data
            // (NEW_OFFSET), and so must the new device, whose superblock
            // may be the one assembly reads the array from (equal events);
            // without it the reshape would look like one that keeps its
            // data offset, which cannot be resumed.
            let template = array
                .devices
                .iter()
                .find(|d| matches!(d.state, DeviceState::Active { .. }))
                .unwrap_or(&array.devices[0])
                .sb
                .clone();
            let mut sb = array.sb.clone();
            let integrity = !array.integrity.is_empty();
            let needed = template.data_offset_sectors + sb.size_sectors;
            let room = room_for_new_member(&name, &member, needed, integrity)?;
            let mut taken: Vec<u32> = array.devices.iter().map(|d| d.sb.dev_number).collect();
            if let Some(draid) = self.geometry().draid() {
                taken.extend(crate::array::dspare::spare_dev_numbers(
                    sb.raid_disks,
                    draid.spares(),
                ));
            }
            let dev_number = (0..sb.max_dev)
                .find(|n| !taken.contains(n))
                .ok_or("no free device slot in the superblock")?;
            sb.dev_number = dev_number;
            sb.device_uuid = rand::random();
            sb.data_offset_sectors = template.data_offset_sectors;
            sb.super_offset_sectors = template.super_offset_sectors;
            sb.bblog_offset_sectors = template.bblog_offset_sectors;
            sb.bblog_size_sectors = template.bblog_size_sectors;
            sb.data_size_sectors = match sb.metadata {
                crate::format::Metadata::V1_1 | crate::format::Metadata::V1_2 => {
                    room - sb.data_offset_sectors
                }
                _ => template.data_size_sectors,
            };
            if sb.metadata == crate::format::Metadata::V1_0
                || sb.metadata == crate::format::Metadata::V0_90
            {
                // The superblock sits at the end: its place depends on this device's size.
                sb.super_offset_sectors =
                    crate::format::superblock_offset_sectors(sb.metadata, member.size_sectors())
                        .ok_or_else(|| format!("{name}: too small for the superblock"))?;
            }
            sb.feature_map &= !MD_FEATURE_RECOVERY_OFFSET;
            sb.feature_map = (sb.feature_map & !crate::format::MD_FEATURE_NEW_OFFSET)
                | (template.feature_map & crate::format::MD_FEATURE_NEW_OFFSET);
            sb.new_offset_sectors = template.new_offset_sectors;
            let member = match integrity {
                true => self.with_integrity(&mut array, &name, member, &sb, true)?,
                false => member,
            };
            array.devices.push(FoundDevice {
                path: name.clone(),
                sb,
                state: DeviceState::Spare,
                member,
            });
            self.events.push("SpareAdded", &name, "");
            self.adopt_injector(&name, injector);
            self.write_state(&mut array);
        }
        if self.table().by_role.iter().any(Option::is_none) {
            self.give_way_to_recovery(&name);
        }
        self.start_recovery_if_possible();
        self.rebalance_onto(path);
        Ok(())
    }

    /// Refuses a device that is in the array already (in a role, being
    /// rebuilt or built as a replacement, a spare or the journal).
    pub(super) fn refuse_present(&self, path: &Path) -> Result<(), String> {
        let present = self.array.lock().unwrap().devices.iter().any(|d| {
            Self::same_device(&d.path, path)
                && matches!(
                    d.state,
                    DeviceState::Active { .. }
                        | DeviceState::Recovering { .. }
                        | DeviceState::Replacement { .. }
                        | DeviceState::Spare
                        | DeviceState::Journal
                )
        });
        match present {
            true => Err(format!(
                "{} is already a member of this array",
                path.display()
            )),
            false => Ok(()),
        }
    }

    /// The member a device given to --add or --re-add is reached through.
    /// A member that failed is opened again as what it was (the same
    /// backend and wrappers, and for a file the claim this process already
    /// holds on it); any other device is opened as a file, and refused
    /// unless `force` when it holds something of value (see
    /// `scan::refuse_valuable`). A device opened anew gets the wrappers
    /// serve gave its members: a new member that hangs must fail by the
    /// member timeout too.
    pub(super) fn open_returning(
        &self,
        path: &Path,
        force: bool,
    ) -> Result<(MemberRef, Option<Arc<crate::member::FaultyMember>>), String> {
        match self.reopen_failed(path) {
            Some(Ok(member)) => return Ok((member, None)),
            Some(Err(e)) if e.kind() != std::io::ErrorKind::Unsupported => {
                return Err(e.to_string())
            }
            _ => {}
        }
        self.wait_let_go(path);
        let opened =
            crate::member::open(path, OpenOptions { write: true }).map_err(|e| e.to_string())?;
        if !force {
            let uuid = self.array.lock().unwrap().sb.set_uuid;
            crate::array::scan::refuse_valuable(&path.display().to_string(), &opened, uuid)?;
        }
        let wrapped = self.wrap_new_member(opened);
        Ok((wrapped.member, wrapped.injector))
    }

    /// dRAID's rebalance: a real disk added while a distributed spare
    /// stands in for a role takes that role over, copied from the spare
    /// while it goes on serving (mdadm's --replace), and the spare is
    /// freed at the end. Nothing happens if the disk became a rebuild
    /// target or another job runs; `manage --replace` starts it by hand.
    fn rebalance_onto(self: &Arc<Engine>, path: &Path) {
        let in_spare = {
            let array = self.array.lock().unwrap();
            let added_is_spare = array
                .devices
                .iter()
                .any(|d| Self::same_device(&d.path, path) && d.state == DeviceState::Spare);
            let served = array
                .devices
                .iter()
                .find(|d| is_spare_name(&d.path) && matches!(d.state, DeviceState::Active { .. }));
            match (added_is_spare, served) {
                (true, Some(d)) => Some(d.path.clone()),
                _ => None,
            }
        };
        if let Some(spare) = in_spare {
            if self.sync.action().is_none() {
                if let Err(e) = self.manage_replace(Path::new(&spare), path) {
                    self.events.push("RebalanceFailed", &spare, &e);
                }
            }
        }
    }

    /// `uraid manage --replace DEV --with NEW` (mdadm --replace): NEW (added as
    /// a spare if it is not one yet) receives a copy of DEV's role while DEV
    /// stays in service; at the end NEW takes the role and DEV is marked
    /// faulty. Until then a crash simply leaves NEW a spare.
    pub fn manage_replace(self: &Arc<Engine>, old: &Path, new: &Path) -> Result<(), String> {
        self.manage_replace_with(old, new, false)
    }

    /// [`manage_replace`](Self::manage_replace); NEW, when it is not a spare
    /// yet, is added as `manage_add_with` adds it (`force` as there).
    pub fn manage_replace_with(
        self: &Arc<Engine>,
        old: &Path,
        new: &Path,
        force: bool,
    ) -> Result<(), String> {
        let role = {
            let array = self.array.lock().unwrap();
            let device = array
                .devices
                .iter()
                .find(|d| Self::same_device(&d.path, old))
                .ok_or_else(|| format!("{} is not a member of this array", old.display()))?;
            match device.state {
                DeviceState::Active { role } => role,
                _ => return Err(format!("{} is not an active member", old.display())),
            }
        };
        if self.sync.action().is_some() {
            return Err("another background job is running; replace when it is done".into());
        }
        if self.table().replacing[role].is_some() {
            return Err(format!(
                "a replacement of {} is already under way (md allows one per member)",
                old.display()
            ));
        }
        let is_spare = {
            let array = self.array.lock().unwrap();
            array
                .devices
                .iter()
                .any(|d| Self::same_device(&d.path, new) && d.state == DeviceState::Spare)
        };
        if !is_spare {
            self.manage_add_with(new, force)?;
        }
        let array = self.array.lock().unwrap();
        let device = array
            .devices
            .iter()
            .find(|d| Self::same_device(&d.path, new) && d.state == DeviceState::Spare)
            .ok_or_else(|| {
                format!(
                    "{} did not become a spare (a recovery took it?)",
                    new.display()
                )
            })?;
        let next = Arc::new(Position::new(0));
        let entry = MemberEntry {
            slot: Slot {
                member: device.member.clone(),
                data_offset_bytes: device.sb.data_offset_sectors * SECTOR_BYTES,
            },
            rebuilt_below: Some(next.clone()),
        };
        let path = device.path.clone();
        let mut array = array;
        // On disk as md records it: the role of the member it copies, with
        // md's replacement flag and recovery offset on its own superblock,
        // so that a restart (here or under the kernel) resumes the copy.
        if let Some(d) = array
            .devices
            .iter_mut()
            .find(|d| Self::same_device(&d.path, new) && d.state == DeviceState::Spare)
        {
            d.state = DeviceState::Replacement {
                role,
                recovery_offset_sectors: 0,
            };
        }
        self.update_table(|t| t.replacing[role] = Some(entry));
        self.write_state(&mut array);
        drop(array);
        self.events.push(
            "RebuildStarted",
            &path,
            &format!("replacing {} in role {role}", old.display()),
        );
        SyncWorker::start(self, SyncAction::Replace { role }, 0, next)
    }

    /// Drops a replacement under construction that failed (a write, a
    /// flush, its copy, or by request): it leaves the copy as faulty, as
    /// md fails it, so that no automatic retry picks it again.
    pub(super) fn abandon_replacement(
        &self,
        role: usize,
        member: Option<&MemberRef>,
        reason: &str,
    ) {
        let mut array = self.array.lock().unwrap();
        // An error seen on an older view of the table may be about a
        // replacement that is gone (or swapped in) since: only the one
        // that failed is dropped.
        let taken = self.update_table(|t| {
            let current = t.replacing[role].as_ref()?;
            if member.is_some_and(|m| !Arc::ptr_eq(m, &current.slot.member)) {
                return None;
            }
            t.replacing[role].take()
        });
        let Some(entry) = taken else {
            // Promoted since (its original failed): it holds the role now,
            // and fails as the member it is.
            drop(array);
            if let Some(member) = member {
                self.fail_member_if(role, Some(member), reason);
            }
            return;
        };
        let path = array.mark_faulty(|d| Arc::ptr_eq(&d.member, &entry.slot.member));
        self.write_state(&mut array);
        drop(array);
        self.events
            .push("ReplaceFailed", &path, &format!("role {role}: {reason}"));
    }

    /// A replacement whose copy stopped (the array was stopped, or the job
    /// interrupted) goes on from where it stood.
    pub(super) fn resume_replacement(self: &Arc<Engine>) {
        if self.read_only || self.sync.action().is_some() || !self.runnable() {
            return;
        }
        let array = self.array.lock().unwrap();
        let table = self.table();
        let found = array.devices.iter().find_map(|d| match d.state {
            DeviceState::Replacement { role, .. } => {
                let next = table.replacing[role].as_ref()?.rebuilt_below.clone()?;
                Some((role, d.path.clone(), next))
            }
            _ => None,
        });
        drop(array);
        let Some((role, path, next)) = found else {
            return;
        };
        let from = next.load(std::sync::atomic::Ordering::SeqCst);
        self.events.push(
            "RebuildStarted",
            &path,
            &format!("resuming the replacement of role {role} at stripe {from}"),
        );
        if let Err(e) = SyncWorker::start(self, SyncAction::Replace { role }, from, next) {
            self.events.push("RebuildFailed", &path, &e);
        }
    }

    /// Writes the array's state to every member, logging (not returning) a
    /// failure: the in-memory state stays authoritative while serving.
    pub(super) fn write_state(&self, array: &mut crate::array::Assembled) {
        if self.read_only {
            return;
        }
        if let Err(e) = self.write_state_locked(array, self.active_state()) {
            self.events.push("SuperblockWriteError", "", &e.to_string());
        }
    }

    /// md's hot spare: with a role missing and a spare present (and no other
    /// job running), rebuild the role onto the spare.
    pub(super) fn start_recovery_if_possible(self: &Arc<Engine>) {
        // md recovers nothing while it reshapes; the reshape's end calls
        // this again.
        if self.read_only
            || self.sync.action().is_some()
            || self.sync.is_closed()
            || self.reshaping.load(Ordering::SeqCst)
        {
            return;
        }
        // A re-add waiting for its turn goes first: it copies only what
        // the bitmap marks. Then a member left half-rebuilt: it is part
        // way there.
        if self.start_queued_readd() {
            return;
        }
        self.resume_recovery();
        if self.sync.action().is_some() {
            return;
        }
        // A missing role is rebuilt before a replacement's copy goes on: the
        // array has no redundancy to spare there.
        let missing = self.table().by_role.iter().any(|e| e.is_none());
        let spare = self
            .array
            .lock()
            .unwrap()
            .devices
            .iter()
            .any(|d| d.state == DeviceState::Spare);
        if !(missing && spare) {
            self.resume_replacement();
            if self.sync.action().is_some() {
                return;
            }
        }
        let mut array = self.array.lock().unwrap();
        let table = self.table();
        let Some(role) = (0..table.by_role.len()).find(|r| table.by_role[*r].is_none()) else {
            return;
        };
        // A dRAID's distributed spare goes first, as ZFS prefers them: it
        // rebuilds at the speed of every child, not of one disk. Other
        // roles may be missing meanwhile: the columns whose spare space
        // lies on a missing child stay missing, homed at that child, and
        // its own rebuild fills them (`MemberTable::reaches_disk`).
        let Some(index) = array
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| d.state == DeviceState::Spare)
            .min_by_key(|(_, d)| !is_spare_name(&d.path))
            .map(|(i, _)| i)
        else {
            return;
        };
        // Without enough in-sync members there is nothing to rebuild from.
        if !self.runnable() {
            return;
        }
        let device = &mut array.devices[index];
        device.state = DeviceState::Recovering {
            role,
            recovery_offset_sectors: 0,
        };
        let path = device.path.clone();
        let next = Arc::new(Position::new(0));
        let entry = MemberEntry {
            slot: Slot {
                member: device.member.clone(),
                data_offset_bytes: device.sb.data_offset_sectors * SECTOR_BYTES,
            },
            rebuilt_below: Some(next.clone()),
        };
        self.update_table(|t| t.by_role[role] = Some(entry));
        self.write_state(&mut array);
        drop(array);
        self.events
            .push("RebuildStarted", &path, &format!("recovering role {role}"));
        if let Err(e) = SyncWorker::start(self, SyncAction::Recovery { role }, 0, next) {
            self.events.push("RebuildFailed", &path, &e);
        }
    }

    /// Called by the job when the stripes from `from_stripe` up to
    /// `next_stripe` are done.
    pub(super) fn sync_progressed(&self, action: SyncAction, from_stripe: u64, next_stripe: u64) {
        let total = self.geometry().stripe_count().max(1);
        let before = from_stripe * 100 / total;
        let now = next_stripe * 100 / total;
        // mdadm --monitor's RebuildNN events at 20, 40, 60 and 80 percent,
        // with the position checkpointed so a restart resumes there.
        if let Some(step) = [20, 40, 60, 80]
            .into_iter()
            .find(|p| before < *p && now >= *p)
        {
            self.events
                .push(&format!("Rebuild{step}"), "", action.word());
            if let SyncAction::Recovery { role } | SyncAction::Replace { role } = action {
                let mut array = self.array.lock().unwrap();
                let offset = recovery_offset_of(&self.geometry(), next_stripe);
                set_recovery_offset(&mut array, action, role, offset);
                self.write_state(&mut array);
            }
        }
    }

    /// Whether the job whose position is `next` still builds what the table
    /// holds for its role. A job and the member it builds are tied by that
    /// position, which the member's entry shares (writes below it reach the
    /// member): once the member failed and another took the role, or an
    /// entry with a new position replaced it, the job is a stale one. Its
    /// writes would land on a member whose position it does not move, and
    /// its end would declare in sync a member it never wholly built.
    pub(super) fn job_owns_target(&self, action: SyncAction, next: &Arc<Position>) -> bool {
        let table = self.table();
        let shares = |e: Option<&MemberEntry>| {
            e.and_then(|e| e.rebuilt_below.as_ref())
                .is_some_and(|below| Arc::ptr_eq(below, next))
        };
        match action {
            SyncAction::Recovery { role } => shares(table.by_role[role].as_ref()),
            SyncAction::Replace { role } => match &table.replacing[role] {
                Some(replacement) => shares(Some(replacement)),
                None => shares(table.by_role[role].as_ref()),
            },
            _ => true,
        }
    }

    /// A member rebuilt to the end holds its role: it is in sync, on disk
    /// too, and another missing role may take the next spare.
    fn recovery_finished(self: &Arc<Engine>, role: usize, next: &Arc<Position>) {
        let mut array = self.array.lock().unwrap();
        if !self.job_owns_target(SyncAction::Recovery { role }, next) {
            // A stale job (see job_owns_target): the member now in the
            // role still needs its own rebuild.
            drop(array);
            self.start_recovery_if_possible();
            return;
        }
        // Nothing else to redo: the rebuild wrote, besides the role's own
        // columns, those of the distributed spares whose space lies on it
        // (`MemberTable::places_homed`).
        self.update_table(|t| {
            if let Some(entry) = t.by_role[role].as_mut() {
                entry.rebuilt_below = None;
            }
        });
        let mut path = String::new();
        for d in array.devices.iter_mut() {
            if matches!(d.state, DeviceState::Recovering { role: r, .. } if r == role) {
                d.state = DeviceState::Active { role };
                path = d.path.clone();
            }
        }
        let slot = self.table().by_role[role].as_ref().map(|e| e.slot.clone());
        array.slots[role] = slot;
        self.write_state(&mut array);
        let member = self.table().by_role[role]
            .as_ref()
            .map(|e| e.slot.member.clone());
        let copied = self.returns.copy_finished(&path, member.as_ref());
        // Logged under the array lock, as `snapshot` reads them: a status
        // that shows the member in sync also shows why.
        self.events.push("RebuildFinished", &path, &copied);
        self.events
            .push("SpareActive", &path, &format!("role {role}"));
        drop(array);
        // Another role may still be missing, with another spare waiting.
        self.start_recovery_if_possible();
        self.derive_once_whole();
    }

    /// Called by the job's thread as it ends.
    pub(super) fn sync_ended(
        self: &Arc<Engine>,
        action: SyncAction,
        outcome: Outcome,
        next: &Arc<Position>,
    ) {
        match (action, outcome) {
            // A stale job (see job_owns_target), however it ended: the
            // member that holds the role now gets its own rebuild, and the
            // role is left as it is.
            (SyncAction::Recovery { .. } | SyncAction::Replace { .. }, _)
                if !self.job_owns_target(action, next) =>
            {
                self.start_recovery_if_possible()
            }
            (SyncAction::Recovery { role }, Outcome::Finished { .. }) => {
                self.recovery_finished(role, next)
            }
            // The original failed during the copy and the replacement took
            // its role as a member being rebuilt (see fail_member): the job
            // ends as a recovery does.
            (SyncAction::Replace { role }, Outcome::Finished { .. })
                if self.table().replacing[role].is_none()
                    && self.table().by_role[role]
                        .as_ref()
                        .is_some_and(|e| e.rebuilt_below.is_some()) =>
            {
                self.recovery_finished(role, next)
            }
            (SyncAction::Check | SyncAction::Repair, Outcome::Stopped | Outcome::Failed) => {
                // A spare added or a member failed while the check ran:
                // recovery goes first now (md's md_check_recovery after
                // the interrupted sync is reaped).
                self.start_recovery_if_possible();
            }
            (
                SyncAction::Check | SyncAction::Repair | SyncAction::Resync,
                Outcome::Finished { .. },
            ) => {
                // mismatch_cnt and the RebuildFinished event were set by the
                // job before it left status (see resync::run): set here, a
                // late thread could overwrite the count of the next check.
                //
                // A member that was mid-rebuild when the array crashed
                // resumes now that the array is consistent again, and a
                // spare added during a check takes its role.
                self.start_recovery_if_possible();
            }
            (SyncAction::Replace { role }, Outcome::Finished { .. }) => {
                let mut array = self.array.lock().unwrap();
                if self.table().replacing[role].is_none() {
                    return;
                }
                // The copy took, besides the role's own columns, those of
                // the distributed spares whose space lies on the role
                // (`MemberTable::places_homed`): they stay in sync.
                let replacement = self.update_table(|t| {
                    let mut entry = t.replacing[role].take()?;
                    entry.rebuilt_below = None;
                    t.by_role[role] = Some(entry.clone());
                    Some(entry)
                });
                let Some(replacement) = replacement else {
                    return;
                };
                let (mut old_path, mut new_path) = (String::new(), String::new());
                for d in array.devices.iter_mut() {
                    if matches!(d.state, DeviceState::Active { role: r } if r == role) {
                        // A distributed spare whose data moved to a real
                        // disk is free again (ZFS's rebalance detaches it).
                        d.state = if is_spare_name(&d.path) {
                            DeviceState::Spare
                        } else {
                            DeviceState::Faulty
                        };
                        old_path = d.path.clone();
                    } else if Arc::ptr_eq(&d.member, &replacement.slot.member) {
                        d.state = DeviceState::Active { role };
                        new_path = d.path.clone();
                    }
                }
                array.slots[role] = Some(replacement.slot.clone());
                self.write_state(&mut array);
                // Under the array lock, as in recovery_finished.
                self.events.push(
                    "RebuildFinished",
                    &new_path,
                    &format!("replaced {old_path}"),
                );
                if is_spare_name(&old_path) {
                    self.events.push("SpareFreed", &old_path, "rebalanced");
                } else {
                    self.events.push("Fail", &old_path, "replaced");
                }
                drop(array);
                // A spare may be waiting for a role that went missing
                // during the copy.
                self.start_recovery_if_possible();
            }
            // Stopped: the copy stays as far as it got, on disk and in the
            // table (writes below it still reach it), and resumes later.
            (SyncAction::Replace { .. }, Outcome::Stopped) => {}
            // Promoted (its original failed): its copy was its rebuild.
            (SyncAction::Replace { role }, Outcome::Failed)
                if self.table().replacing[role].is_none() =>
            {
                self.recovery_failed(action, next)
            }
            // md fails a replacement whose copy cannot go on.
            (SyncAction::Replace { role }, Outcome::Failed) => {
                self.abandon_replacement(role, None, "copy failed")
            }
            (_, Outcome::Stopped) => {}
            (SyncAction::Recovery { .. }, Outcome::Failed) => self.recovery_failed(action, next),
            (_, Outcome::Failed) => self.events.push("SyncFailed", "", action.word()),
            (SyncAction::Reshape, Outcome::Finished { .. }) => {
                unreachable!("the reshape job ends on its own (engine/jobs/reshape.rs)")
            }
        }
    }

    /// The new member could not be written, or nothing is left to rebuild
    /// it from: it leaves the array as faulty, so that no automatic retry
    /// loops on it; a fresh --add starts over. A spare may take the role.
    fn recovery_failed(self: &Arc<Engine>, action: SyncAction, next: &Arc<Position>) {
        let (SyncAction::Recovery { role } | SyncAction::Replace { role }) = action else {
            unreachable!("only a rebuild has a member being built");
        };
        {
            let mut array = self.array.lock().unwrap();
            if !self.job_owns_target(action, next) {
                // A stale job failed (its member left the role): the
                // member that holds the role now is not to blame.
                drop(array);
                self.start_recovery_if_possible();
                return;
            }
            self.update_table(|t| t.by_role[role] = None);
            let path = array.mark_faulty(
                |d| matches!(d.state, DeviceState::Recovering { role: r, .. } if r == role),
            );
            self.write_state(&mut array);
            drop(array);
            self.events
                .push("RebuildFailed", &path, &format!("role {role}"));
        }
        self.start_recovery_if_possible();
    }
}
