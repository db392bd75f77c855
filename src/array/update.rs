//! Superblock updates of an assembled array, the way md's super_1_sync writes
//! them: one array-wide state (events, update time, clean/dirty, role table)
//! copied onto every member that is part of the array.

use super::assemble::{Assembled, DeviceState};
use super::superblocks::{write_superblock, SuperblockError};
use crate::format::{
    MD_DISK_ROLE_FAULTY, MD_DISK_ROLE_JOURNAL, MD_DISK_ROLE_SPARE, MD_FEATURE_RECOVERY_OFFSET,
    MD_FEATURE_REPLACEMENT, SECTOR_MAX,
};
use std::time::{SystemTime, UNIX_EPOCH};

/// Whether the array is (about to be) written without its redundancy being
/// guaranteed: md's "active" (dirty) versus "clean".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanliness {
    Dirty,
    Clean,
    /// Active, with a write journal that closes the write hole: md keeps
    /// resync_offset at MaxSector while it serves (MD_JOURNAL_CLEAN), since
    /// after a crash replaying the journal, not a resync, makes rows whole.
    DirtyJournaled,
    /// Active, with a live write-intent bitmap kept by the engine: the bits
    /// on disk already mark every region being written, so they are kept.
    DirtyTracked,
    /// Shut down in order but with a resync unfinished: it must resume at
    /// this position (md's unit: see Geometry::resync_position_sectors).
    ResyncFrom(u64),
}

/// A device whose bitmap or superblock could not be written or flushed: it
/// is now marked faulty, and the other members' superblocks say so.
pub struct LostDevice {
    pub path: String,
    /// The role it held (None for a spare).
    pub role: Option<usize>,
    pub member: crate::member::MemberRef,
    pub error: SuperblockError,
}

/// Writes the array state (see `write_array_state_failing`) and reports the
/// first device that could not be written as an error.
pub fn write_array_state(array: &mut Assembled, state: Cleanliness) -> Result<(), SuperblockError> {
    let mut lost = write_array_state_failing(array, state)?;
    if lost.is_empty() {
        Ok(())
    } else {
        Err(lost.swap_remove(0).error)
    }
}

/// Bumps the events counter, stamps the time, sets clean or dirty, rebuilds
/// the role table from the devices present, writes every member's superblock
/// and flushes. Devices that were left out (stale or duplicate) are not
/// written: md no longer counts them as members.
///
/// A device that fails its write does not stop the others: as md's
/// super_written fails such a device and writes the superblocks again, it
/// is marked faulty (and leaves its slot) and the state is written again
/// to the rest, so that they record the failure. The lost devices are
/// returned; what they mean for the array is the caller's to decide.
pub fn write_array_state_failing(
    array: &mut Assembled,
    state: Cleanliness,
) -> Result<Vec<LostDevice>, SuperblockError> {
    let mut lost = Vec::new();
    // Each failed pass loses one more device, so this ends.
    for _ in 0..=array.devices.len() {
        if !array.runnable() {
            // An array that can no longer serve keeps the superblocks it
            // has, as md never fails the last device it cannot lose: written
            // now, they would reach only spares or members being rebuilt,
            // which would then outvote every member that holds the data.
            return Ok(lost);
        }
        let error = match write_once(array, state) {
            Ok(()) => return Ok(lost),
            Err(error @ SuperblockError::Corrupt { .. }) => return Err(error),
            Err(error) => error,
        };
        let SuperblockError::Io { device, .. } = &error else {
            unreachable!("corrupt errors returned above")
        };
        let Some(index) = array.devices.iter().position(|d| {
            d.state != DeviceState::Faulty && (d.path == *device || d.member.name() == device)
        }) else {
            return Err(error);
        };
        let found = &mut array.devices[index];
        let role = match found.state {
            DeviceState::Active { role } | DeviceState::Recovering { role, .. } => Some(role),
            _ => None,
        };
        found.state = DeviceState::Faulty;
        if let Some(role) = role {
            if array.slots[role]
                .as_ref()
                .is_some_and(|s| std::sync::Arc::ptr_eq(&s.member, &found.member))
            {
                array.slots[role] = None;
            }
        }
        lost.push(LostDevice {
            path: array.devices[index].path.clone(),
            role,
            member: array.devices[index].member.clone(),
            error,
        });
    }
    unreachable!("every device was lost and the last pass wrote nothing")
}

fn write_once(array: &mut Assembled, state: Cleanliness) -> Result<(), SuperblockError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let mut roles = vec![MD_DISK_ROLE_SPARE; array.sb.max_dev as usize];
    for device in &array.devices {
        let slot = device.sb.dev_number as usize;
        if slot >= roles.len() {
            continue;
        }
        roles[slot] = match device.state {
            DeviceState::Active { role }
            | DeviceState::Recovering { role, .. }
            | DeviceState::Replacement { role, .. } => role as u16,
            DeviceState::Faulty => MD_DISK_ROLE_FAULTY,
            DeviceState::Journal => MD_DISK_ROLE_JOURNAL,
            DeviceState::Spare | DeviceState::Stale { .. } | DeviceState::Duplicate { .. } => {
                MD_DISK_ROLE_SPARE
            }
        };
    }
    array.sb.events += 1;
    array.sb.utime_secs = now.as_secs();
    array.sb.utime_micros = now.subsec_micros();
    array.sb.resync_offset_sectors = match state {
        Cleanliness::Clean | Cleanliness::DirtyJournaled => SECTOR_MAX,
        Cleanliness::Dirty | Cleanliness::DirtyTracked => 0,
        Cleanliness::ResyncFrom(position) => position,
    };
    array.sb.dev_roles = roles.clone();
    // The bitmap first, as md writes it: see sync_bitmaps.
    super::bitmap::sync_bitmaps(array, state)?;
    // md writes superblocks with a preflush: data written before the state
    // change (a rebuilt member's contents, acknowledged writes) is durable
    // before a superblock can say the member is in sync or the array clean.
    flush_members(array)?;
    // Members in sync first, then those being rebuilt, then spares, each
    // made durable before the next is written (md writes each with FUA): a
    // member that fails stops the pass before any spare records a state its
    // in-sync members do not hold, so a spare is never the freshest voice.
    let mut order: Vec<usize> = (0..array.devices.len())
        .filter(|&i| {
            !matches!(
                array.devices[i].state,
                DeviceState::Stale { .. } | DeviceState::Duplicate { .. } | DeviceState::Faulty
            )
        })
        .collect();
    order.sort_by_key(|&i| match array.devices[i].state {
        DeviceState::Active { .. } => 0,
        DeviceState::Recovering { .. } => 1,
        DeviceState::Replacement { .. } => 2,
        _ => 3,
    });
    for i in order {
        let device = &mut array.devices[i];
        let sb = &mut device.sb;
        // A member being rebuilt says how far it is, on its own superblock only.
        // A replacement says so on its own superblock too: the role
        // table cannot tell it from the member it copies (super_1_sync).
        sb.feature_map &= !MD_FEATURE_REPLACEMENT;
        if let DeviceState::Recovering {
            recovery_offset_sectors,
            ..
        }
        | DeviceState::Replacement {
            recovery_offset_sectors,
            ..
        } = device.state
        {
            // As the engine asserted it where it set it: a point past the
            // data would read back as a member in sync.
            assert!(
                recovery_offset_sectors <= array.sb.size_sectors,
                "{}: recovery offset {recovery_offset_sectors} past the component size {}",
                device.path,
                array.sb.size_sectors
            );
        }
        match device.state {
            DeviceState::Recovering {
                recovery_offset_sectors,
                ..
            } => {
                sb.feature_map |= MD_FEATURE_RECOVERY_OFFSET;
                sb.recovery_offset_sectors = recovery_offset_sectors;
            }
            DeviceState::Replacement {
                recovery_offset_sectors,
                ..
            } => {
                sb.feature_map |= MD_FEATURE_RECOVERY_OFFSET | MD_FEATURE_REPLACEMENT;
                sb.recovery_offset_sectors = recovery_offset_sectors;
            }
            // A journal's recovery_offset is its journal_tail, which the
            // engine keeps in this superblock (super_1_sync stores it there).
            DeviceState::Journal => sb.feature_map &= !MD_FEATURE_RECOVERY_OFFSET,
            _ => {
                sb.feature_map &= !MD_FEATURE_RECOVERY_OFFSET;
                sb.recovery_offset_sectors = 0;
            }
        }
        copy_shape(&array.sb, sb);
        sb.events = array.sb.events;
        sb.utime_secs = array.sb.utime_secs;
        sb.utime_micros = array.sb.utime_micros;
        sb.resync_offset_sectors = array.sb.resync_offset_sectors;
        sb.dev_roles = roles.clone();
        write_superblock(&*device.member, sb)?;
        device
            .member
            .flush()
            .map_err(|source| SuperblockError::Io {
                device: device.path.clone(),
                source,
            })?;
    }
    Ok(())
}

/// The array's shape, component size and reshape state, which every
/// member records alike (super_1_sync); a member's own data offset and new_offset stay its own.
fn copy_shape(array: &crate::format::MemberSuper, sb: &mut crate::format::MemberSuper) {
    const SHAPE_FEATURES: u32 =
        crate::format::MD_FEATURE_RESHAPE_ACTIVE | crate::format::MD_FEATURE_RESHAPE_BACKWARDS;
    sb.level = array.level;
    sb.layout = array.layout;
    sb.chunk_sectors = array.chunk_sectors;
    sb.raid_disks = array.raid_disks;
    sb.size_sectors = array.size_sectors;
    sb.feature_map = (sb.feature_map & !SHAPE_FEATURES) | (array.feature_map & SHAPE_FEATURES);
    sb.reshape_position_sectors = array.reshape_position_sectors;
    sb.new_level = array.new_level;
    sb.delta_disks = array.delta_disks;
    sb.new_layout = array.new_layout;
    sb.new_chunk_sectors = array.new_chunk_sectors;
}

/// Flushes every device that is part of the array.
fn flush_members(array: &Assembled) -> Result<(), SuperblockError> {
    for device in array.devices.iter().filter(|d| {
        !matches!(
            d.state,
            DeviceState::Stale { .. } | DeviceState::Duplicate { .. } | DeviceState::Faulty
        )
    }) {
        device
            .member
            .flush()
            .map_err(|source| SuperblockError::Io {
                device: device.path.clone(),
                source,
            })?;
    }
    Ok(())
}
