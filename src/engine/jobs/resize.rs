//! `uraid manage --grow --size`: the component size of a live array, as md's
//! update_size and the levels' resize do it.
//!
//! The size md calls "component size" (the superblock's `size`) is how much
//! of each member the array uses. Growing it adds rows (raid4/5/6), mirror
//! extents (raid1) or chunks (raid10 near/offset) past the old end without
//! moving any sector below it, so the engine swaps in a geometry with new
//! bounds while requests are held at the door for the moment
//! of the swap. The new region holds whatever the members held there, so it
//! is resynced: from the old end without a bitmap (md sets recovery_cp to
//! the old size), and as the bitmap says with one, whose new region's bits
//! are set when it is resized (md_bitmap_resize).

use super::job::SyncAction;
use super::resync::SyncWorker;
use crate::array::DeviceState;
use crate::engine::position::Position;
use crate::engine::Engine;
use crate::format::Metadata;
use crate::geometry::{Geometry, GeometryParams, Level};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A size change that passed every check.
struct SizePlan {
    level: Level,
    new_size: u64,
    old_size: u64,
    /// 1.0 or 0.90: the superblock sits past the data, and stays.
    super_at_end: bool,
}

impl Engine {
    /// Why the size cannot change now, if it cannot: md's EBUSY cases.
    fn resize_busy(&self) -> Option<String> {
        if self.reshaping.load(Ordering::SeqCst) {
            return Some(
                "a reshape is in progress: the size can change once it has finished (md: EBUSY)"
                    .into(),
            );
        }
        if let Some(action) = self.sync.action() {
            return Some(format!(
                "a {} is running: the size can change once it has finished (md: EBUSY)",
                action.word()
            ));
        }
        let table = self.table();
        if !table.in_sync().iter().all(|s| *s) || table.replacing.iter().any(Option::is_some) {
            return Some(
                "a member is missing, being rebuilt or being replaced: the size can change once the array is whole again (md: EBUSY)"
                    .into(),
            );
        }
        None
    }

    /// Reads every member's size again, as md re-reads a device's size
    /// when asked to grow: a disk or image grown while the array serves
    /// gives its new room without a restart.
    fn refresh_member_sizes(&self) -> Result<(), String> {
        let members: Vec<crate::member::MemberRef> = {
            let array = self.array.lock().unwrap();
            array
                .devices
                .iter()
                .filter(|d| matches!(d.state, DeviceState::Active { .. } | DeviceState::Spare))
                .map(|d| d.member.clone())
                .collect()
        };
        // Outside the array lock: a network member's answer may take time.
        for member in members {
            member
                .refresh_size()
                .map_err(|e| format!("cannot read the size of {}: {e}", member.name()))?;
        }
        Ok(())
    }

    /// Checks a size change and works out the new size, changing nothing.
    fn plan_size(&self, size_sectors: Option<u64>) -> Result<SizePlan, String> {
        if self.read_only {
            return Err("the array is served read-only: its size cannot change (md: EROFS)".into());
        }
        let level = self.geometry().level();
        if level.is_draid() {
            return Err(format!(
                "a {level} array's size is fixed when it is created: its distributed spares' metadata lies after the data"
            ));
        }
        if !level.redundant() {
            return Err(format!(
                "{level} arrays cannot change component size: they always use all of each member"
            ));
        }
        if self.journal.is_some() {
            return Err(
                "an array with a write journal cannot change its size (md's raid5_resize: EINVAL)"
                    .into(),
            );
        }
        if let Some(why) = self.resize_busy() {
            return Err(why);
        }
        self.refresh_member_sizes()?;
        let array = self.array.lock().unwrap();
        let sb = &array.sb;
        if sb.level == 10 && (sb.layout >> 8) & 0xff > 1 && sb.layout & 0x10000 == 0 {
            return Err(
                "raid10 far layouts cannot change size: their copies sit a fraction of the member apart (md: EINVAL)"
                    .into(),
            );
        }
        let super_at_end = !matches!(sb.metadata, Metadata::V1_1 | Metadata::V1_2);
        if self.live_bitmap().is_some() && super_at_end {
            return Err(format!(
                "a {} array with an internal bitmap cannot change size (md cannot move that bitmap): remove the bitmap (--grow --bitmap none), change the size, add it again",
                sb.metadata.as_str()
            ));
        }
        // What each member can give: md's rdev->sectors after mdadm has set
        // every member's size (rdev_size_change): for 1.1/1.2 the device
        // past its data offset, wherever the device grew; 1.0 and 0.90
        // keep the size their superblock at the end leaves (uraid does not
        // move it). A spare counts with the size its superblock records.
        let room = array
            .devices
            .iter()
            .filter_map(|d| match d.state {
                DeviceState::Active { .. } if !super_at_end => {
                    Some(member_room(d).max(d.sb.data_size_sectors))
                }
                DeviceState::Active { .. } | DeviceState::Spare => Some(d.sb.data_size_sectors),
                _ => None,
            })
            .min()
            .ok_or("the array has no members")?;
        let wanted = size_sectors.unwrap_or(room);
        if wanted > room {
            return Err(format!(
                "{} KiB does not fit every member: the smallest has room for {} KiB (md: ENOSPC)",
                wanted / 2,
                room / 2
            ));
        }
        // raid4/5/6 and raid10 use whole chunks of each member (raid5_resize
        // and raid10's calc_sectors round down); raid1 uses every sector.
        let chunk = sb.chunk_sectors as u64;
        let new_size = match level {
            Level::Raid1 => wanted,
            _ => wanted / chunk * chunk,
        };
        let floor = chunk.max(8);
        if new_size < floor {
            return Err(format!(
                "{} KiB is below the {} KiB chunk: the size must hold at least one chunk",
                wanted / 2,
                floor / 2
            ));
        }
        Ok(SizePlan {
            level,
            new_size,
            old_size: sb.size_sectors,
            super_at_end,
        })
    }

    /// Sets the component size to `size_sectors`, or to the most every
    /// member holds (`None`, mdadm's `max`). Everything is checked before
    /// anything changes: a refusal leaves the array as it was.
    pub fn grow_size(self: &Arc<Engine>, size_sectors: Option<u64>) -> Result<String, String> {
        self.refuse_with_integrity("a size change")?;
        let SizePlan {
            level,
            new_size,
            old_size,
            super_at_end,
        } = self.plan_size(size_sectors)?;
        if new_size == old_size {
            return Ok(format!(
                "the component size is already {} KiB",
                old_size / 2
            ));
        }
        // Requests wait here until the swap is done; those in flight finish
        // first, so nothing runs against a bound that is moving.
        let _gate = self.reshape_gate.write().unwrap();
        // What the stripe cache holds goes out under the old bounds (before
        // the array lock, which writing it out takes).
        self.write_out_cache().map_err(|e| e.to_string())?;
        let mut array = self.array.lock().unwrap();
        // A member may have failed since the checks.
        if let Some(why) = self.resize_busy() {
            return Err(why);
        }
        let sb = array.sb.clone();
        let chunk = sb.chunk_sectors as u64;
        let has_bitmap = self.live_bitmap().is_some();
        let old = self.geometry().clone();
        let new = Geometry::new(&GeometryParams {
            level,
            layout: sb.layout,
            chunk_sectors: chunk,
            raid_disks: sb.raid_disks,
            dev_sectors: new_size,
            member_data_sectors: vec![new_size; sb.raid_disks as usize],
            raid0_layout_feature: false,
        })
        .map_err(|e| e.to_string())?;
        let growing = new_size > old_size;

        let state = self.active_state();
        // md's order, which keeps every moment after a crash assemblable:
        // first each grown 1.1/1.2 member records what it now gives
        // (super_1_rdev_size_change: the size asked for, or all of it for
        // max), then the bitmap is resized, then the size changes. A
        // member never says the array is bigger than its own data size.
        if growing && !super_at_end {
            for d in array.devices.iter_mut() {
                if matches!(d.state, DeviceState::Active { .. }) {
                    let device_room = member_room(d);
                    d.sb.data_size_sectors = size_sectors.unwrap_or(device_room).min(device_room);
                }
            }
            self.write_state_locked(&mut array, state)
                .map_err(|e| e.to_string())?;
        }
        if has_bitmap {
            let sync_end = new.resync_position_sectors(new.stripe_count());
            self.resize_bitmap(&array, sync_end)?;
        }
        for d in array.devices.iter_mut().filter(|d| {
            !matches!(
                d.state,
                DeviceState::Faulty | DeviceState::Stale { .. } | DeviceState::Duplicate { .. }
            )
        }) {
            d.sb.size_sectors = new_size;
        }
        array.sb.size_sectors = new_size;
        array.geometry = new.clone();
        *self.geometry.write().unwrap() = Arc::new(new.clone());
        self.sync.set_stripe_count(new.stripe_count());
        // Cached bytes and parity belong to the old bounds; a resync below
        // rewrites parity and mirrors of the new region.
        self.datapath.forget_reads();
        if growing && matches!(level, Level::Raid1 | Level::Raid10) {
            self.mirrors_in_sync.store(false, Ordering::SeqCst);
        }
        self.write_state_locked(&mut array, state)
            .map_err(|e| e.to_string())?;
        drop(array);
        let (old_kib, new_kib) = (old_size / 2, new_size / 2);
        self.events.push(
            "SizeChanged",
            "",
            &format!("component size {old_kib} KiB -> {new_kib} KiB"),
        );
        if !growing {
            return Ok(format!(
                "component size {new_kib} KiB (was {old_kib} KiB), array size {} KiB",
                new.array_sectors() / 2
            ));
        }
        // md's recovery_cp = the old size: the resync starts at the old end
        // (with a bitmap it visits only the regions whose bits are set,
        // which the new region's all are).
        let from = new.stripe_at_resync_position(old.resync_position_sectors(old.stripe_count()));
        SyncWorker::start(
            self,
            SyncAction::Resync,
            from,
            Arc::new(Position::new(from)),
        )?;
        self.events
            .push("RebuildStarted", "", "resync of the grown region");
        Ok(format!(
            "component size {new_kib} KiB (was {old_kib} KiB), array size {} KiB; resyncing the new region",
            new.array_sectors() / 2
        ))
    }
}

/// A 1.1/1.2 member's device past its data offset.
fn member_room(d: &crate::array::FoundDevice) -> u64 {
    d.member
        .size_sectors()
        .saturating_sub(d.sb.data_offset_sectors)
}
