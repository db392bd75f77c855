//! Assembly: from a set of devices to an array, with md's rules. Every device
//! must carry a valid superblock of the same array; the freshest superblock
//! (highest events) speaks for the array; devices that fell behind are left
//! out; roles come from the freshest superblock's role table.

use super::dspare::{DistributedSpare, SpareArea, SpareRouter};
use super::reshape::{self, reshape_removed_disks};
use super::superblocks::{read_superblock, SuperblockError};
use super::{Slot, Slots};
use crate::format::{
    MemberSuper, Role, MD_FEATURE_RAID0_LAYOUT, MD_FEATURE_RECOVERY_OFFSET, MD_FEATURE_REPLACEMENT,
    MD_FEATURE_RESHAPE_ACTIVE,
};
use crate::geometry::{Draid, Geometry, GeometryError, GeometryParams, Level};
use crate::member::{MemberRef, OpenOptions};
use crate::units::SECTOR_BYTES;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("no devices given")]
    NoDevices,
    #[error("{0} is given twice")]
    Duplicate(String),
    #[error("{0}")]
    Open(String),
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    #[error("{0}: no md superblock found")]
    NoSuperblock(String),
    #[error("{first} and {second} belong to different arrays ({first_uuid} and {second_uuid})")]
    MixedArrays {
        first: String,
        second: String,
        first_uuid: String,
        second_uuid: String,
    },
    #[error("{first} and {second} are the same member of the array (device number {dev_number})")]
    SameMember {
        first: String,
        second: String,
        dev_number: u32,
    },
    #[error("unsupported md level {0}")]
    UnknownLevel(i32),
    #[error("{0}")]
    Geometry(#[from] GeometryError),
    #[error(
        "{device}: too small for its superblock ({device_sectors} sectors, needs {needed_sectors})"
    )]
    TooSmall {
        device: String,
        device_sectors: u64,
        needed_sectors: u64,
    },
    #[error("{0}")]
    Integrity(String),
    #[error("cannot start {level} array: {present} of {raid_disks} members present, missing roles {missing:?}")]
    TooManyMissing {
        level: Level,
        present: usize,
        raid_disks: usize,
        missing: Vec<usize>,
    },
}

/// What one device is in the assembled array.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum DeviceState {
    /// In sync, serving `role`.
    Active {
        role: usize,
    },
    /// Holds `role` but was only rebuilt up to `recovery_offset_sectors`.
    Recovering {
        role: usize,
        recovery_offset_sectors: u64,
    },
    /// Being copied from the member that holds `role` while that member
    /// still serves it (md's Replacement, mdadm --replace): it takes
    /// writes below `recovery_offset_sectors` and takes the role when the
    /// copy ends.
    Replacement {
        role: usize,
        recovery_offset_sectors: u64,
    },
    Spare,
    /// The array's write journal (md's raid5-cache device, role 0xfffd).
    Journal,
    Faulty,
    /// Its events counter fell behind the array's: its data is out of date.
    Stale {
        events: u64,
    },
    /// Claims a role another, fresher device already holds.
    Duplicate {
        role: usize,
    },
}

pub struct FoundDevice {
    pub path: String,
    pub sb: MemberSuper,
    pub state: DeviceState,
    pub member: MemberRef,
}

/// An array put together from its devices.
pub struct Assembled {
    /// The freshest superblock: it speaks for the array.
    pub sb: MemberSuper,
    pub geometry: Geometry,
    /// Members in use, by role.
    pub slots: Slots,
    /// Every device that was given, in the order given (a dRAID's
    /// distributed spares after them).
    pub devices: Vec<FoundDevice>,
    /// A dRAID's router of its distributed spares' I/O: whoever changes
    /// which member serves a role keeps it current.
    pub spare_router: Option<Arc<super::dspare::SpareRouter>>,
    /// The members that carry checksums (`create --integrity`), as opened.
    pub integrity: Vec<super::integrity::IntegrityOpened>,
}

/// md's MD_FEATURE_JOURNAL, from the freshest superblock: the array has a
/// write journal, whether or not it was given.
pub fn has_journal_feature(sb: &MemberSuper) -> bool {
    sb.feature_map & crate::format::MD_FEATURE_JOURNAL != 0
}

impl Assembled {
    pub fn level(&self) -> Level {
        self.geometry.level()
    }

    /// Marks every device that `which` picks faulty; gives the path of
    /// the last one (empty if none), for the event that reports it.
    pub fn mark_faulty(&mut self, which: impl Fn(&FoundDevice) -> bool) -> String {
        let mut path = String::new();
        for d in self.devices.iter_mut().filter(|d| which(d)) {
            d.state = DeviceState::Faulty;
            path = d.path.clone();
        }
        path
    }

    /// Roles with no member in use.
    pub fn missing_roles(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|r| self.slots[*r].is_none())
            .collect()
    }

    /// Whether every array sector can still be read.
    pub fn runnable(&self) -> bool {
        let missing: Vec<bool> = self.slots.iter().map(|s| s.is_none()).collect();
        self.geometry.survives(&missing)
    }

    /// Refuses an array that cannot serve all of its data.
    pub fn require_runnable(&self) -> Result<(), AssembleError> {
        if self.runnable() {
            return Ok(());
        }
        Err(AssembleError::TooManyMissing {
            level: self.level(),
            present: self.slots.iter().filter(|s| s.is_some()).count(),
            raid_disks: self.slots.len(),
            missing: self.missing_roles(),
        })
    }

    /// Whether the array was shut down cleanly (no resync owed).
    pub fn is_clean(&self) -> bool {
        self.sb.is_clean()
    }

    /// The array's size in sectors.
    pub fn array_sectors(&self) -> u64 {
        self.geometry.array_sectors()
    }

    /// The write-journal device, when the array has one and it was given.
    pub fn journal(&self) -> Option<&FoundDevice> {
        self.devices
            .iter()
            .find(|d| d.state == DeviceState::Journal)
    }

    /// The array has a write journal that was not given (or is stale):
    /// md starts it read-only, as its log may hold writes the members lack.
    pub fn journal_missing(&self) -> bool {
        has_journal_feature(&self.sb) && self.journal().is_none()
    }
}

/// Opens the devices at `paths` and assembles them.
pub fn assemble(paths: &[PathBuf], write: bool) -> Result<Assembled, AssembleError> {
    assemble_members(open_members(paths, write)?)
}

/// Opens the devices at `paths` (exclusively when writing), refusing one
/// given twice under any name.
pub fn open_members(
    paths: &[PathBuf],
    write: bool,
) -> Result<Vec<(String, MemberRef)>, AssembleError> {
    if paths.is_empty() {
        return Err(AssembleError::NoDevices);
    }
    let mut seen = Vec::new();
    let mut members: Vec<(String, MemberRef)> = Vec::new();
    for path in paths {
        let name = crate::member::canonical_name(path);
        // The same file or device under two names is still one member.
        let identity =
            crate::member::identity(path).map_err(|e| AssembleError::Open(e.to_string()))?;
        if seen.contains(&identity) {
            return Err(AssembleError::Duplicate(name));
        }
        seen.push(identity);
        let member = crate::member::open(path, OpenOptions { write })
            .map_err(|e| AssembleError::Open(e.to_string()))?;
        members.push((name, member));
    }
    Ok(members)
}

/// Assembles already-opened members (files, devices or test backends).
pub fn assemble_members(members: Vec<(String, MemberRef)>) -> Result<Assembled, AssembleError> {
    if members.is_empty() {
        return Err(AssembleError::NoDevices);
    }
    let mut found: Vec<(String, MemberSuper, MemberRef)> = Vec::new();
    let mut integrity = Vec::new();
    for (name, member) in members {
        let sb =
            read_superblock(&*member)?.ok_or_else(|| AssembleError::NoSuperblock(name.clone()))?;
        // The checksum layer goes over the member before anything reads
        // its data: every read above it is verified.
        let (member, opened) =
            super::integrity::open_member(&name, member, &sb).map_err(AssembleError::Integrity)?;
        integrity.extend(opened);
        if let Some((first, first_sb, _)) = found.first() {
            if first_sb.set_uuid != sb.set_uuid {
                return Err(AssembleError::MixedArrays {
                    first: first.clone(),
                    second: name,
                    first_uuid: first_sb.uuid_string(),
                    second_uuid: sb.uuid_string(),
                });
            }
        }
        if let Some((other, _, _)) = found.iter().find(|(_, s, _)| s.dev_number == sb.dev_number) {
            return Err(AssembleError::SameMember {
                first: other.clone(),
                second: name,
                dev_number: sb.dev_number,
            });
        }
        found.push((name, sb, member));
    }
    let freshest = found
        .iter()
        .max_by_key(|(_, sb, _)| sb.events)
        .map(|(_, sb, _)| sb.clone())
        .expect("non-empty");
    let level =
        Level::from_number(freshest.level).ok_or(AssembleError::UnknownLevel(freshest.level))?;
    // A shrinking reshape records the new, smaller count; the members of
    // the old geometry keep their roles until it ends (md's analyze_sbs).
    let raid_disks = freshest.raid_disks as usize + reshape_removed_disks(&freshest);

    let mut slots: Slots = vec![None; raid_disks];
    let mut devices = Vec::new();
    let mut member_data_sectors = vec![0u64; raid_disks];
    for (path, sb, member) in found {
        let needed_sectors = sb.data_offset_sectors + sb.data_size_sectors;
        if member.size_sectors() < needed_sectors {
            return Err(AssembleError::TooSmall {
                device: path,
                device_sectors: member.size_sectors(),
                needed_sectors,
            });
        }
        let state = device_state(&freshest, &sb, &slots);
        if let DeviceState::Active { role } = state {
            member_data_sectors[role] = sb.data_size_sectors;
            slots[role] = Some(Slot {
                member: member.clone(),
                data_offset_bytes: sb.data_offset_sectors * SECTOR_BYTES,
            });
        }
        devices.push(FoundDevice {
            path,
            sb,
            state,
            member,
        });
    }
    refuse_mixed_integrity(&devices, &integrity)?;
    // A dRAID's distributed spares are devices like the others, found in
    // their slots on the children: they join before replacements are
    // settled, since one may be the original a replacement copies.
    let mut spare_router = None;
    if level.is_draid() {
        let geometry = Geometry::new(&GeometryParams {
            level,
            layout: freshest.layout,
            chunk_sectors: freshest.chunk_sectors as u64,
            raid_disks: raid_disks as u32,
            dev_sectors: freshest.size_sectors,
            member_data_sectors: member_data_sectors.clone(),
            raid0_layout_feature: false,
        })?;
        let draid = geometry
            .draid()
            .expect("a dRAID level builds a dRAID geometry");
        spare_router = Some(attach_distributed_spares(
            &freshest,
            draid,
            &mut slots,
            &mut devices,
        ));
    }
    // A replacement whose original is not here (failed, or not given) is
    // all the role has: it goes on as a member being rebuilt, from where
    // its copy stopped (md's raid5_run promotes it the same way). One of
    // two replacements of a role is a duplicate.
    let mut rebuilding = vec![false; raid_disks];
    for device in &devices {
        if let DeviceState::Recovering { role, .. } = device.state {
            rebuilding[role] = true;
        }
    }
    let mut replaced = vec![false; raid_disks];
    for device in devices.iter_mut() {
        let DeviceState::Replacement {
            role,
            recovery_offset_sectors,
        } = device.state
        else {
            continue;
        };
        if replaced[role] || rebuilding[role] {
            device.state = DeviceState::Duplicate { role };
            continue;
        }
        replaced[role] = true;
        if slots[role].is_some() {
            continue;
        }
        device.state = in_role(role, recovery_offset_sectors, freshest.size_sectors);
        if let DeviceState::Active { role } = device.state {
            member_data_sectors[role] = device.sb.data_size_sectors;
            slots[role] = Some(Slot {
                member: device.member.clone(),
                data_offset_bytes: device.sb.data_offset_sectors * SECTOR_BYTES,
            });
        }
    }
    // raid0 and linear take their shape from every member's size, and cannot
    // lose any member: with one missing there is no array to read.
    if !level.redundant() && slots.iter().any(|s| s.is_none()) {
        return Err(AssembleError::TooManyMissing {
            level,
            present: slots.iter().filter(|s| s.is_some()).count(),
            raid_disks,
            missing: (0..raid_disks).filter(|r| slots[*r].is_none()).collect(),
        });
    }
    let params = GeometryParams {
        level,
        layout: freshest.layout,
        chunk_sectors: freshest.chunk_sectors as u64,
        raid_disks: raid_disks as u32,
        dev_sectors: freshest.size_sectors,
        member_data_sectors,
        raid0_layout_feature: freshest.feature_map & MD_FEATURE_RAID0_LAYOUT != 0,
    };
    let geometry = if freshest.has_feature(MD_FEATURE_RESHAPE_ACTIVE) {
        reshape::reshaping_geometry(&freshest, params, &mut slots, &devices)?
    } else {
        Geometry::new(&params)?
    };
    if let Some(router) = &spare_router {
        router.set(in_sync_members(&slots));
    }
    Ok(Assembled {
        sb: freshest,
        geometry,
        slots,
        devices,
        spare_router,
        integrity,
    })
}

/// An array whose members carry checksums carries them on every disk in
/// a role (checked before a dRAID's distributed spares join: their I/O
/// goes through the children's layers): one without would serve unverified bytes (and a read of it
/// could not be healed) where the others promise verified ones.
fn refuse_mixed_integrity(
    devices: &[FoundDevice],
    integrity: &[super::integrity::IntegrityOpened],
) -> Result<(), AssembleError> {
    if integrity.is_empty() {
        return Ok(());
    }
    let without = devices.iter().find(|d| {
        matches!(
            d.state,
            DeviceState::Active { .. } | DeviceState::Recovering { .. }
        ) && d.member.integrity().is_none()
    });
    match without {
        Some(d) => Err(AssembleError::Integrity(format!(
            "{} has no checksum region while {} has one: the array was made with --integrity; \
             add {} again (manage --add) to give it one",
            d.path, integrity[0].path, d.path
        ))),
        None => Ok(()),
    }
}

fn in_sync_members(slots: &Slots) -> Vec<Option<MemberRef>> {
    slots
        .iter()
        .map(|s| s.as_ref().map(|s| s.member.clone()))
        .collect()
}

/// Adds a dRAID's distributed spares to its devices, each with the
/// superblock kept in its metadata slot, and returns the router of their
/// I/O. A spare whose superblock cannot be read (every child holding it is
/// missing) is left out, as a missing device is.
fn attach_distributed_spares(
    freshest: &MemberSuper,
    draid: &Draid,
    slots: &mut Slots,
    devices: &mut Vec<FoundDevice>,
) -> Arc<SpareRouter> {
    let area = SpareArea {
        data_offset_sectors: freshest.data_offset_sectors,
        dev_sectors: freshest.size_sectors,
    };
    let block_bytes = slots
        .iter()
        .flatten()
        .map(|s| s.member.logical_block_bytes())
        .max()
        .unwrap_or(512);
    let router = SpareRouter::new(in_sync_members(slots));
    for spare in 0..draid.spares() {
        let member: MemberRef = Arc::new(DistributedSpare::new(
            draid,
            spare,
            area,
            router.clone(),
            block_bytes,
        ));
        let Some(sb) = freshest_spare_superblock(freshest, draid, spare, area, slots, block_bytes)
        else {
            continue;
        };
        let state = device_state(freshest, &sb, slots);
        if let DeviceState::Active { role } = state {
            slots[role] = Some(Slot {
                member: member.clone(),
                data_offset_bytes: sb.data_offset_sectors * SECTOR_BYTES,
            });
        }
        devices.push(FoundDevice {
            path: member.name().to_string(),
            sb,
            state,
            member,
        });
    }
    router
}

/// The freshest copy of distributed spare `spare`'s superblock of this
/// array among the children present. Every child keeps a copy; after a
/// crash their volatile caches may have kept different ones, and a child
/// that left the array stopped receiving them: the first copy that reads
/// may be stale, and a spare taken at a stale copy would be left out as
/// not up to date while its role's data is all there.
fn freshest_spare_superblock(
    freshest: &MemberSuper,
    draid: &Draid,
    spare: usize,
    area: SpareArea,
    slots: &Slots,
    block_bytes: u32,
) -> Option<MemberSuper> {
    let mut best: Option<MemberSuper> = None;
    for (k, slot) in slots.iter().enumerate() {
        let Some(slot) = slot else { continue };
        // A router that knows only child k reads the copy on child k.
        let mut only = vec![None; slots.len()];
        only[k] = Some(slot.member.clone());
        // The spare holds its router weakly (the array owns it): this one
        // lives to the end of the read.
        let router = SpareRouter::new(only);
        let member = DistributedSpare::new(draid, spare, area, router.clone(), block_bytes);
        let Ok(Some(sb)) = read_superblock(&member) else {
            continue;
        };
        if sb.set_uuid == freshest.set_uuid && best.as_ref().is_none_or(|b| sb.events > b.events) {
            best = Some(sb);
        }
    }
    best
}

/// md's view of one device against the freshest superblock (super_1_validate).
fn device_state(freshest: &MemberSuper, sb: &MemberSuper, slots: &Slots) -> DeviceState {
    // md accepts a member at most one event behind: it missed only the last
    // clean/dirty transition, never data. A journal is held to the same
    // rule (super_1_validate). The device's own superblock decides whether
    // the rule applies, before the freshest role table is read: once the
    // array ran without a member, the freshest table calls that slot a
    // spare, and a stale member taken at that word would be rebuilt as a
    // spare where md leaves it out as not up to date.
    let stale = sb.events + 1 < freshest.events;
    if stale && matches!(sb.this_role(), Role::Active(_) | Role::Journal) {
        return DeviceState::Stale { events: sb.events };
    }
    let role = freshest.role_of(sb.dev_number);
    match role {
        Role::Spare => return DeviceState::Spare,
        Role::Faulty => return DeviceState::Faulty,
        Role::Active(_) | Role::Journal => {}
    }
    // A device that calls itself a spare but that the freshest table has
    // in a role missed that promotion: it holds none of the role's data.
    if stale {
        return DeviceState::Stale { events: sb.events };
    }
    if role == Role::Journal {
        return DeviceState::Journal;
    }
    let Role::Active(role) = role else {
        unreachable!()
    };
    let role = role as usize;
    if role >= slots.len() {
        return DeviceState::Spare;
    }
    // A replacement shares its role with the member it copies (both are in
    // the role table under the same number); its own superblock says which
    // of the two it is.
    if sb.feature_map & MD_FEATURE_REPLACEMENT != 0 {
        return DeviceState::Replacement {
            role,
            recovery_offset_sectors: recovery_offset(sb),
        };
    }
    if slots[role].is_some() {
        return DeviceState::Duplicate { role };
    }
    in_role(role, recovery_offset(sb), freshest.size_sectors)
}

/// How far a device was rebuilt: all of it without md's recovery offset.
fn recovery_offset(sb: &MemberSuper) -> u64 {
    if sb.feature_map & MD_FEATURE_RECOVERY_OFFSET != 0 {
        sb.recovery_offset_sectors
    } else {
        u64::MAX
    }
}

/// A device holding `role`, rebuilt up to `offset` of `size` sectors.
fn in_role(role: usize, offset: u64, size: u64) -> DeviceState {
    if offset < size {
        DeviceState::Recovering {
            role,
            recovery_offset_sectors: offset,
        }
    } else {
        DeviceState::Active { role }
    }
}
