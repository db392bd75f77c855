//! The members of a running array and how they change: which member holds
//! which role, which are in sync (and up to where, for one being rebuilt),
//! and what happens when one fails.
//!
//! The request path reads an immutable `MemberTable` snapshot (an `Arc`
//! cloned under a short read lock); a change builds a new table and swaps
//! it in. So a failing member never waits for in-flight I/O to drain, and
//! I/O never holds a lock across a member call.

use super::datapath::failure::PathError;
use super::datapath::io::{recover_lost, View};
use super::jobs::job::SyncAction;
use super::Engine;
use crate::array::dspare::is_spare_name;
use crate::array::{
    write_array_state_failing, Assembled, Cleanliness, DeviceState, Slot, SuperblockError,
};
use crate::geometry::{Place, StripeMap};
use crate::member::stats as counted;
use crate::member::AlignedBuf;
use crate::parity::Syndrome;
use crate::units::SECTOR_BYTES;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use super::table::{MemberEntry, MemberTable};

impl Engine {
    /// A view of the members for work on `stripe`.
    pub(super) fn view(&self, stripe: u64) -> View<'_> {
        View {
            engine: self,
            table: self.members.read().unwrap().clone(),
            stripe,
        }
    }

    pub(super) fn table(&self) -> Arc<MemberTable> {
        self.members.read().unwrap().clone()
    }

    /// The one place the member table changes: a modified copy is swapped
    /// in, so readers holding the old snapshot are never disturbed.
    pub(super) fn update_table<T>(&self, change: impl FnOnce(&mut MemberTable) -> T) -> T {
        let mut members = self.members.write().unwrap();
        let mut table: MemberTable = (**members).clone();
        let result = change(&mut table);
        table.refresh_routes(&self.geometry());
        // Only ever grows: a request aligned to the old block but not the
        // new one may still be in flight, and a smaller one later is fine.
        self.datapath
            .block_bytes
            .fetch_max(table.block_bytes(), Ordering::SeqCst);
        self.in_memory.store(table.in_memory(), Ordering::SeqCst);
        self.route_spares(&table);
        // Under the table's lock: the exposure follows the tables in the
        // order they were made.
        self.note_exposure(&table);
        *members = Arc::new(table);
        result
    }

    /// Notes the exposure where it changes with the table unchanged: a
    /// rebuild has done the rows that were at zero redundancy without its
    /// member (`MemberTable::redundant`).
    #[allow(clippy::readonly_write_lock)]
    pub(super) fn note_exposure_again(&self) {
        // The write lock, though nothing is written: notes of the exposure
        // keep the order of the tables (update_table notes under it too).
        let members = self.members.write().unwrap();
        self.note_exposure(&members);
    }

    /// Notes whether the array is at zero redundancy with `table`, and
    /// says so when that starts or ends (exposure.rs).
    pub(super) fn note_exposure(&self, table: &MemberTable) {
        use super::exposure::{at_zero_redundancy, Change};
        let exposed = at_zero_redundancy(&self.geometry(), &table.redundant());
        match self.exposure.note(exposed) {
            Change::None => {}
            Change::Started => self.events.push(
                "NoRedundancy",
                "",
                "one more member failure loses data until the rows at zero redundancy are rebuilt",
            ),
            Change::Ended(spell) => self.events.push(
                "RedundancyRestored",
                "",
                &format!("after {:.1} s at zero redundancy", spell.as_secs_f64()),
            ),
        }
    }

    /// Points a dRAID's distributed spares at the members now in sync in
    /// each role (the members I/O goes to, fault injectors included).
    pub(super) fn route_spares(&self, table: &MemberTable) {
        if let Some(router) = &self.spare_router {
            router.set(
                table
                    .by_role
                    .iter()
                    .map(|e| {
                        e.as_ref()
                            .filter(|e| e.rebuilt_below.is_none())
                            .map(|e| e.slot.member.clone())
                    })
                    .collect(),
            );
        }
    }

    /// Whether every array sector can still be served by in-sync members.
    pub fn runnable(&self) -> bool {
        let missing: Vec<bool> = self.table().in_sync().iter().map(|s| !s).collect();
        self.geometry().survives(&missing)
    }

    /// The copy to read from, among those `usable`.
    pub(super) fn pick_copy<'p>(
        &self,
        copies: &'p [Place],
        usable: impl Fn(&Place) -> bool,
    ) -> Option<&'p Place> {
        // The copy whose member has the fewest reads in flight, the first
        // of equals (md's read_balance for disks that do not seek): random
        // reads spread over every mirror, while a lone reader stays on the
        // first copy, where its stream is sequential. Until a resync has
        // made the copies agree, always the first.
        if !self.mirrors_in_sync.load(Ordering::Relaxed) {
            return copies.iter().find(|c| usable(c));
        }
        copies
            .iter()
            .filter(|c| usable(c))
            .min_by_key(|c| self.datapath.pending_reads[c.member].load(Ordering::Relaxed))
    }

    /// Marks the member in `role` faulty: it leaves the table, its
    /// superblock role becomes faulty on the others, and a rebuild onto a
    /// spare starts if one is available. Idempotent.
    pub fn fail_member(&self, role: usize, reason: &str) {
        self.fail_member_if(role, None, reason)
    }

    /// [`fail_member`](Self::fail_member), only while `member` (when given)
    /// still holds the role: an error seen on an older view of the table
    /// (a write in flight when the role changed hands) must not fail the
    /// device that holds the role now.
    pub(super) fn fail_member_if(
        &self,
        role: usize,
        member: Option<&crate::member::MemberRef>,
        reason: &str,
    ) {
        let mut array = self.array.lock().unwrap();
        {
            let table = self.table();
            let Some(entry) = table.entry(role) else {
                return;
            };
            if member.is_some_and(|m| !Arc::ptr_eq(m, &entry.slot.member)) {
                return;
            }
        }
        self.update_table(|t| t.by_role[role] = None);
        let path = array
            .devices
            .iter_mut()
            .find(|d| matches!(d.state, DeviceState::Active { role: r } | DeviceState::Recovering { role: r, .. } if r == role))
            .map(|d| {
                d.state = DeviceState::Faulty;
                d.path.clone()
            })
            .unwrap_or_default();
        array.slots[role] = None;
        self.promote_replacement(&mut array, role);
        self.returns.failed(&path, reason);
        self.events.push("Fail", &path, reason);
        if !self.runnable() {
            self.events.push(
                "Failed",
                &path,
                "too many members lost: the array can no longer serve all its data",
            );
        } else {
            self.events.push("DegradedArray", &path, "");
        }
        self.give_up_rebalances(&mut array, role, &path);
        // A check or repair gives way, as md interrupts any sync on a
        // failure: a spare should take over now, not when the check ends.
        self.interrupt_scrub(&path);
        // The superblocks of the remaining members record the failure, so
        // that a restart does not trust the failed member. Not when the
        // array can no longer serve: as md keeps the last device it cannot
        // lose, the members stay as they were, for an assembly to try again.
        if !self.read_only && self.runnable() {
            if let Err(e) = self.write_state_locked(&mut array, self.active_state()) {
                eprintln!("uraid: recording the failure of {path}: {e}");
            }
        }
        drop(array);
        // A hot spare takes over at once.
        if let Some(engine) = self.me.get().and_then(std::sync::Weak::upgrade) {
            engine.start_recovery_if_possible();
        }
    }

    /// Fails the member an I/O error is to be blamed on: the one in `role`
    /// (if it is still `member`), or, for an error a distributed spare met
    /// on the child holding its space there, that child. The spare's space
    /// on every other child is sound: failing it would lose its column in
    /// every row, failing the child loses one column in the rows that use
    /// it. A child already gone costs nothing more: nothing is failed for
    /// it, since what holds its role now (a disk being rebuilt into it)
    /// did not meet the error.
    pub(super) fn fail_blamed(
        &self,
        role: usize,
        member: Option<&crate::member::MemberRef>,
        error: &io::Error,
        reason: &str,
    ) {
        match crate::array::dspare::child_of(error) {
            Some(child) if child != role && crate::array::dspare::child_absent(error) => {}
            Some(child) if child != role => {
                let holder = self.table().entry(child).map(|e| e.slot.member.clone());
                if let Some(holder) = holder {
                    self.fail_member_if(child, Some(&holder), reason);
                }
            }
            _ => self.fail_member_if(role, member, reason),
        }
    }

    /// A member failed while a role held by a distributed spare was being
    /// handed to a disk (the rebalance). The spare's space on the failed
    /// member went with it, so the copy can neither read those rows from
    /// the spare nor rebuild them: I/O to a role being replaced stops at
    /// its member, so that the replacement sees every write. The rebalance
    /// is given up, as ZFS restarts a resilver when another disk fails:
    /// the disk is a spare again (the failed member's rebuild may take
    /// it), the role stays on the distributed spare, missing only in the
    /// rows that used the failed member's space, and the copy job stops.
    /// Returns whether it gave one up (the caller writes the superblocks).
    fn give_up_rebalances(&self, array: &mut Assembled, failed: usize, failed_path: &str) -> bool {
        let taken = self.update_table(|t| {
            let mut taken = Vec::new();
            for role in 0..t.replacing.len() {
                let on_spare = t.by_role[role]
                    .as_ref()
                    .is_some_and(|e| is_spare_name(e.slot.member.name()));
                if role != failed && on_spare {
                    if let Some(entry) = t.replacing[role].take() {
                        taken.push((role, entry));
                    }
                }
            }
            taken
        });
        for (role, entry) in &taken {
            let Some(disk) = array
                .devices
                .iter_mut()
                .find(|d| Arc::ptr_eq(&d.member, &entry.slot.member))
            else {
                continue;
            };
            debug_assert!(
                matches!(disk.state, DeviceState::Replacement { role: r, .. } if r == *role)
            );
            disk.state = DeviceState::Spare;
            let job = SyncAction::Replace { role: *role };
            self.sync.interrupt(|a| a == job);
            self.events.push(
                "SyncStopped",
                &disk.path,
                &format!(
                    "the rebalance of role {role} is given up: {failed_path} failed, taking \
                     the distributed spare's space on it; the disk is a spare again"
                ),
            );
        }
        !taken.is_empty()
    }

    /// The member in `role` has left: a replacement being built takes the
    /// role at once, as a member rebuilt up to where its copy stands (md's
    /// raid5_remove_disk). Writes keep reaching it below that point and the
    /// copy job goes on as its rebuild; left aside, it would miss every
    /// write from now on while still trusted below its copy position.
    fn promote_replacement(&self, array: &mut Assembled, role: usize) {
        let promoted = self.update_table(|t| {
            if t.by_role[role].is_some() {
                return None;
            }
            t.by_role[role] = t.replacing[role].take();
            t.by_role[role].clone()
        });
        let Some(promoted) = promoted else {
            return;
        };
        for d in array.devices.iter_mut() {
            if let DeviceState::Replacement {
                role: r,
                recovery_offset_sectors,
            } = d.state
            {
                if r == role && Arc::ptr_eq(&d.member, &promoted.slot.member) {
                    d.state = DeviceState::Recovering {
                        role,
                        recovery_offset_sectors,
                    };
                }
            }
        }
    }

    /// A check or repair stops for a member failure (see fail_member).
    fn interrupt_scrub(&self, path: &str) {
        if let Some(action) = self.sync.interrupt_scrub() {
            self.events.push(
                "SyncStopped",
                path,
                &format!("{} interrupted by the member's failure", action.word()),
            );
        }
    }

    /// Writes the array state to every member (the caller holds the array
    /// lock). A member whose superblock cannot be written is failed, as md
    /// fails it, and the others are still written; it is an error only when
    /// the array can no longer serve all its data.
    pub(super) fn write_state_locked(
        &self,
        array: &mut Assembled,
        state: Cleanliness,
    ) -> Result<(), SuperblockError> {
        let lost = write_array_state_failing(array, state)?;
        let mut first_error = None;
        let mut gave_up = false;
        for device in lost {
            let io_error = match &device.error {
                SuperblockError::Io { source, .. } => Some(source),
                SuperblockError::Corrupt { .. } => None,
            };
            let reason = super::readd::failure_reason(
                format!("superblock write error: {}", device.error),
                &io_error.into_iter().collect::<Vec<_>>(),
            );
            let Some(role) = device.role else {
                // A replacement being built leaves the copy too.
                let replacing = self.update_table(|t| {
                    let slot = t.replacing.iter_mut().find(|e| {
                        e.as_ref()
                            .is_some_and(|e| Arc::ptr_eq(&e.slot.member, &device.member))
                    })?;
                    slot.take()
                });
                let event = if replacing.is_some() {
                    "ReplaceFailed"
                } else {
                    "FailSpare"
                };
                self.events.push(event, &device.path, &reason);
                continue;
            };
            let in_table = self.update_table(|t| {
                let held = t.by_role[role]
                    .as_ref()
                    .is_some_and(|e| Arc::ptr_eq(&e.slot.member, &device.member));
                if held {
                    t.by_role[role] = None;
                }
                held
            });
            if in_table {
                self.returns.failed(&device.path, &reason);
                self.events.push("Fail", &device.path, &reason);
                self.events.push("DegradedArray", &device.path, "");
                self.interrupt_scrub(&device.path);
                self.promote_replacement(array, role);
                gave_up |= self.give_up_rebalances(array, role, &device.path);
            }
            first_error.get_or_insert(device.error);
        }
        // A disk handed back to the spares says so on its superblock at
        // once: a restart must not resume a copy that misses every write
        // from now on. Each round takes a rebalance away, so this ends.
        if gave_up && self.runnable() {
            if let Err(e) = self.write_state_locked(array, state) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(error) if !self.runnable() => Err(error),
            _ => Ok(()),
        }
    }

    /// md's answer to a read error: rebuild what the member holds for this
    /// stripe from the other members and write it back (a drive remaps a bad
    /// sector on write). If that write fails too, the member is failed.
    pub(super) fn correct_read_error(
        &self,
        stripe: u64,
        role: usize,
        error: &io::Error,
        locked: bool,
    ) -> Correction {
        let view = self.view(stripe);
        let Some(erring) = view.table.entry(role) else {
            return Correction::Done;
        };
        if crate::member::checksum_mismatch(error).is_some()
            && self.checksum_error_fails(erring.slot.member.name())
            && self.survives_without(role)
        {
            let member = erring.slot.member.clone();
            let reason = format!(
                "more than {} checksum errors in {} minutes ({error}): a disk that keeps \
                 returning wrong data is failed, as ZFS's zed faults one",
                super::integrity::CHECKSUM_ERRORS_TOLERATED,
                super::integrity::CHECKSUM_ERRORS_WINDOW.as_secs() / 60
            );
            self.fail_member_if(role, Some(&member), &reason);
            return Correction::Done;
        }
        // Exclude the erring member: rebuild its share from the others.
        let mut table = (*view.table).clone();
        let entry = table.by_role[role].take().expect("checked above");
        let others = View {
            engine: self,
            table: Arc::new(table),
            stripe,
        };
        let map = self.geometry().stripe(stripe);
        let _guard = (!locked).then(|| self.datapath.locks.lock(stripe));
        // The strip is rewritten from redundancy: parity kept hot for the
        // stripe may no longer be what its member holds (a stripe whose
        // parity disagreed with its data, not yet resynced).
        self.datapath
            .parity_cache
            .drop_stripe(stripe, map.strip_sectors as usize * SECTOR_BYTES as usize);
        // md's fix_read_error reads the rewritten sectors back: a sector
        // the drive could not remap still fails, and then so does the member.
        let homed = others.table.places_homed(&map, role);
        let result = others
            .rebuild_onto(&map, role, &entry)
            .and_then(|()| read_back(&map, role, &homed, &entry));
        // Said as the request path said it before the correction.
        let said = format!("member {role}: {error}");
        match result {
            Ok(()) => {
                self.corrected_reads.fetch_add(1, Ordering::SeqCst);
                self.events.push(
                    "CorrectedRead",
                    entry.slot.member.name(),
                    &format!("stripe {stripe}: {said}"),
                );
                Correction::Done
            }
            // Another block of the row failed its checksum too: more wrong
            // blocks than redundancy. The bytes are lost in this row only;
            // no disk is to blame for the whole of it, so none is failed
            // (ZFS keeps a pool up with a list of permanent errors), and
            // the request gets an I/O error, never the wrong bytes.
            Err(PathError::MemberRead {
                role: other,
                error: ref other_error,
            }) if other != role && crate::member::checksum_mismatch(other_error).is_some() => {
                let lost = format!(
                    "stripe {stripe}: {said}, and {other_error}: more wrong blocks in the row \
                     than redundancy; its bytes there are lost and read as I/O errors"
                );
                self.events
                    .push("ChecksumUncorrectable", entry.slot.member.name(), &lost);
                Correction::Lost(io::Error::new(io::ErrorKind::InvalidData, lost))
            }
            Err(failure) => {
                // The rewrite's error says who failed it; a spare's original
                // read error may name the child when the rewrite's does not.
                let blame = match crate::array::dspare::child_of(failure.error()) {
                    Some(_) => failure.error(),
                    None => error,
                };
                let reason = super::readd::failure_reason(
                    format!("read error ({said}) not correctable: {failure}"),
                    &[error, failure.error()],
                );
                self.fail_blamed(role, Some(&entry.slot.member), blame, &reason);
                Correction::Done
            }
        }
    }
}

/// What came of correcting a read error.
#[derive(Debug)]
pub(super) enum Correction {
    /// Rewritten from redundancy, or the member failed: try again.
    Done,
    /// The row has more wrong blocks than redundancy: nothing to try again
    /// with; the request fails with this.
    Lost(io::Error),
}

impl View<'_> {
    /// Computes what `role` must hold in stripe `map` from the usable members
    /// of this view and writes it to `target`. Used by rebuild and by
    /// read-error correction.
    pub(super) fn rebuild_onto(
        &self,
        map: &StripeMap,
        role: usize,
        target: &MemberEntry,
    ) -> Result<(), PathError> {
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        // A failed write to the target is the array's failure, not a member
        // read's: during a replace the member in `role` is the original,
        // read here, whose read failure is corrected from redundancy; the
        // target's own failure ends the job.
        let write = |place: &Place, buf: &[u8]| -> io::Result<()> {
            let at = target.slot.data_offset_bytes + place.member_sector * SECTOR_BYTES;
            counted::write_at(target.slot.member.as_ref(), buf, at).map_err(|e| {
                // A distributed spare's error names itself and keeps the
                // tag of the child that failed it (see `fail_blamed`).
                if crate::array::dspare::child_of(&e).is_some() {
                    return e;
                }
                io::Error::new(
                    e.kind(),
                    format!("writing {}: {e}", target.slot.member.name()),
                )
            })
        };
        // What the role holds here that the target can take: its columns,
        // and those of spares whose space lies on it (see `places_homed`).
        let homed: Vec<&Place> = self
            .table
            .places_homed(map, role)
            .into_iter()
            .filter(|p| self.table.reaches_disk(target, p))
            .collect();
        if homed.is_empty() {
            return Ok(());
        }
        if map.p.is_none() {
            // Mirrors: copy from a usable copy of the same strip.
            for strip in &map.data {
                for place in strip.copies.iter().filter(|c| c.member == role) {
                    let source = strip
                        .copies
                        .iter()
                        .find(|c| c.member != role && self.present(c))
                        .ok_or_else(|| {
                            io::Error::other(format!(
                                "stripe {}: no copy left to rebuild from",
                                map.stripe
                            ))
                        })?;
                    let mut buf = AlignedBuf::zeroed(strip_bytes);
                    self.read_place(source, 0, &mut buf)?;
                    write(place, &buf)?;
                }
            }
            return Ok(());
        }
        let lost: Vec<usize> = (0..map.data.len())
            .filter(|&i| !map.data[i].copies.iter().any(|c| self.present(c)))
            .collect();
        let strips = self.read_window(map, 0..strip_bytes, &lost)?;
        for (i, strip) in map.data.iter().enumerate() {
            if homed.contains(&&strip.copies[0]) {
                write(&strip.copies[0], &strips[i])?;
            }
        }
        for place in map.parity_places().filter(|p| homed.contains(&p)) {
            // Aligned, as the strips read above: O_DIRECT members take
            // it without a bounce copy.
            let mut out = AlignedBuf::zeroed(strip_bytes);
            let data: Vec<Option<&[u8]>> = strips.iter().map(|s| Some(&s[..])).collect();
            rebuild_strip(
                self.engine.datapath.syndrome,
                map,
                &place,
                &data,
                [None; 3],
                &mut out,
            )?;
            write(&place, &out)?;
        }
        Ok(())
    }
}

/// Computes the strip at `target` (a place of stripe `map`, of a parity
/// level) into `out`, from the other strips as read: `data[i]` is data
/// strip i, None where it was not read (its member is lost, or holds
/// `target` itself); `p` and
/// `q` are the parity strips, None where not read. Lost data strips are
/// reconstructed first when the role's strip needs them. Every rebuild of a
/// strip goes through here, the one-stripe path and the batched one alike,
/// so that a new parity column is taught to rebuild in one place.
pub(super) fn rebuild_strip(
    syndrome: &dyn Syndrome,
    map: &StripeMap,
    target: &Place,
    data: &[Option<&[u8]>],
    parity: [Option<&[u8]>; 3],
    out: &mut [u8],
) -> io::Result<()> {
    let own = map.data.iter().position(|d| d.copies[0] == *target);
    if let Some(i) = own {
        if let Some(strip) = data[i] {
            out.copy_from_slice(strip);
            return Ok(());
        }
    }
    let lost: Vec<usize> = (0..data.len()).filter(|&i| data[i].is_none()).collect();
    let present: Vec<&[u8]> = data.iter().flatten().copied().collect();
    // The role's own data strip is recovered straight into `out`; any other
    // lost strip into a scratch buffer, needed to compute the role's parity.
    let mut scratch: Vec<AlignedBuf> = lost
        .iter()
        .filter(|&&i| Some(i) != own)
        .map(|_| AlignedBuf::zeroed(out.len()))
        .collect();
    {
        let mut scratch_iter = scratch.iter_mut();
        let mut own_out = own.is_some().then_some(&mut *out);
        let mut outputs: Vec<&mut [u8]> = lost
            .iter()
            .map(|&i| match own_out.take_if(|_| Some(i) == own) {
                Some(o) => o,
                None => &mut scratch_iter.next().expect("one per other lost strip")[..],
            })
            .collect();
        recover_lost(syndrome, map, &present, &lost, parity, &mut outputs)?;
    }
    if own.is_some() {
        return Ok(());
    }
    let mut recovered = scratch.iter();
    let full: Vec<&[u8]> = data
        .iter()
        .map(|d| d.unwrap_or_else(|| &recovered.next().expect("recovered above")[..]))
        .collect();
    if map.p == Some(*target) {
        syndrome.gen_p(&full, out);
    } else if map.q == Some(*target) {
        let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
        syndrome.gen_q(&full, &exps, out);
    } else if map.r == Some(*target) {
        // R is the Q of the doubled exponents (4^e = 2^(2e)).
        let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
        let mut doubled = [0u8; crate::parity::gf::ORDER];
        syndrome.gen_q(&full, crate::parity::r_exps(&exps, &mut doubled), out);
    } else {
        return Err(io::Error::other(format!(
            "stripe {}: member {} sector {} holds no strip of it",
            map.stripe, target.member, target.member_sector
        )));
    }
    Ok(())
}

/// Reads back what `target` holds for `role` in stripe `map` (its places
/// `homed` there).
fn read_back(
    map: &StripeMap,
    role: usize,
    homed: &[&Place],
    target: &MemberEntry,
) -> Result<(), PathError> {
    let mut buf = AlignedBuf::zeroed((map.strip_sectors * SECTOR_BYTES) as usize);
    for place in homed {
        let at = target.slot.data_offset_bytes + place.member_sector * SECTOR_BYTES;
        counted::read_at(target.slot.member.as_ref(), &mut buf, at)
            .map_err(|error| PathError::MemberRead { role, error })?;
    }
    Ok(())
}

/// The slot (member and data offset) of an assembled device.
pub fn slot_of(device: &crate::array::FoundDevice) -> Slot {
    Slot {
        member: device.member.clone(),
        data_offset_bytes: device.sb.data_offset_sectors * SECTOR_BYTES,
    }
}
