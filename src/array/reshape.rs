//! Assembling an array that md (or uraid) left part way through a reshape:
//! the superblock's reshape fields turned into a [`Reshaping`] geometry, with
//! the checks md's raid5_run makes before it trusts them.

use super::assemble::{AssembleError, DeviceState, FoundDevice};
use super::Slots;
use crate::format::{MemberSuper, MD_FEATURE_RESHAPE_ACTIVE, MD_FEATURE_RESHAPE_BACKWARDS};
use crate::geometry::{Geometry, GeometryError, GeometryParams, Level, ReshapePoint, Reshaping};
use crate::units::SECTOR_BYTES;

/// Roles a shrinking reshape still has beyond the superblock's (new)
/// raid_disks: md keeps the old count of slots until the reshape ends.
pub fn reshape_removed_disks(sb: &MemberSuper) -> usize {
    if sb.has_feature(MD_FEATURE_RESHAPE_ACTIVE) && sb.delta_disks < 0 {
        sb.delta_disks.unsigned_abs() as usize
    } else {
        0
    }
}

/// Whether a reshape runs from the end of the array to its start: a
/// shrink, or a same-count reshape md chose to run backwards.
pub fn reshape_backwards(sb: &MemberSuper) -> bool {
    sb.delta_disks < 0 || (sb.delta_disks == 0 && sb.has_feature(MD_FEATURE_RESHAPE_BACKWARDS))
}

/// The geometry of an array whose freshest superblock records a reshape in
/// progress. `params` describe the old geometry with every role the
/// reshape has (`raid_disks` the larger count). The slots' data offsets
/// are moved to the lower of each member's two offsets, which the
/// geometry's places are relative to.
pub fn reshaping_geometry(
    sb: &MemberSuper,
    params: GeometryParams,
    slots: &mut Slots,
    devices: &[FoundDevice],
) -> Result<Geometry, AssembleError> {
    let refuse = |why: String| AssembleError::Geometry(GeometryError::Invalid(why));
    if !matches!(params.level, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        return Err(refuse(format!(
            "a {} reshape is in progress, and uraid reads only raid4/5/6 arrays mid-reshape; \
             let mdadm finish it (mdadm --assemble)",
            params.level
        )));
    }
    if sb.feature_map & crate::format::MD_FEATURE_JOURNAL != 0 {
        return Err(refuse(
            "a reshape is in progress on an array with a write journal, which md never does".into(),
        ));
    }
    let new_level =
        Level::from_md_number(sb.new_level).ok_or(AssembleError::UnknownLevel(sb.new_level))?;
    let roles = params.raid_disks as usize;
    let old_disks = (sb.raid_disks as i64 - i64::from(sb.delta_disks)) as u32;
    let old = Geometry::new(&GeometryParams {
        raid_disks: old_disks,
        ..params.clone()
    })?;
    let new = Geometry::new(&GeometryParams {
        level: new_level,
        layout: sb.new_layout,
        chunk_sectors: u64::from(sb.new_chunk_sectors),
        raid_disks: sb.raid_disks,
        ..params
    })?;
    let mut old_offsets = vec![sb.data_offset_sectors; roles];
    let mut new_offsets = vec![new_data_offset(sb)?; roles];
    for device in devices {
        if let DeviceState::Active { role } = device.state {
            old_offsets[role] = device.sb.data_offset_sectors;
            new_offsets[role] = new_data_offset(&device.sb)?;
        }
    }
    let reshaping = Reshaping::new(
        old,
        new,
        ReshapePoint {
            position_sectors: sb.reshape_position_sectors,
            backwards: reshape_backwards(sb),
            old_offset_sectors: old_offsets.clone(),
            new_offset_sectors: new_offsets.clone(),
        },
    )?;
    for (role, slot) in slots.iter_mut().enumerate() {
        if let Some(slot) = slot {
            slot.data_offset_bytes = old_offsets[role].min(new_offsets[role]) * SECTOR_BYTES;
        }
    }
    Ok(Geometry::Reshaping(Box::new(reshaping)))
}

/// A member's data offset in the new geometry, refused when a corrupt
/// new_offset puts it before the device's start.
fn new_data_offset(sb: &MemberSuper) -> Result<u64, AssembleError> {
    u64::try_from(sb.new_data_offset_sectors()).map_err(|_| {
        AssembleError::Geometry(GeometryError::Invalid(format!(
            "new_offset {} puts the data before the start of the device",
            sb.new_offset_sectors
        )))
    })
}
