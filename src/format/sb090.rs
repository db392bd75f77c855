//! The legacy md 0.90 superblock (`mdp_super_t`).
//!
//! It is 4096 bytes (1024 32-bit words) in the last 64 KiB-aligned block of
//! the device: at sector `(device_sectors & !127) - 128`. Data starts at
//! sector 0. The words are in host byte order; this module reads and writes
//! little-endian, the order of every x86 and arm64 system, so superblocks
//! written on big-endian hosts are not supported.
//!
//! Layout (word offsets):
//! - 0..32: constant generic information (magic, version, uuid word 0,
//!   ctime, level, size in KiB, disk counts, md minor, uuid words 1..3);
//! - 32..64: generic state (utime, state bits, counts, checksum, events,
//!   checkpoint, and the reshape fields of 0.91);
//! - 64..128: personality (layout, chunk size in bytes);
//! - 128..992: 27 disk descriptors of 32 words;
//! - 992..1024: this_disk, a copy of this device's descriptor.
//!
//! A 0.90 superblock is mapped onto [`MemberSuper`] as follows: dev_number is
//! `this_disk.number`; dev_roles has 27 entries derived from the disk table
//! (faulty bit: Faulty; sync bit: Active(raid_disk); active without sync on a
//! 0.91 reshape: Active(raid_disk), recovering; anything else: Spare);
//! feature_map gets RESHAPE_ACTIVE for minor 91, BITMAP_OFFSET (offset +8
//! sectors, the kernel's fixed place) when the bitmap-present state bit is
//! set, and RECOVERY_OFFSET when this device is recovering. The 0.90-only
//! fields are kept in [`Sb090Extra`] so that a decoded superblock re-encodes
//! without losing them.

use super::{
    FormatError, MemberSuper, Metadata, Role, FAIL_FAST_1, LEVEL_MULTIPATH, MD_DISK_ROLE_SPARE,
    MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_RECOVERY_OFFSET, MD_FEATURE_RESHAPE_ACTIVE, MD_SB_MAGIC,
    SB090_MIN_DEVICE_SECTORS, SECTOR_MAX, WRITE_MOSTLY_1,
};
use serde::{Deserialize, Serialize};

/// Size of the 0.90 superblock.
pub const MD_SB_BYTES: usize = 4096;
/// Entries in the 0.90 disk table.
pub const MD_SB_DISKS: usize = 27;
/// The 0.90 superblock sits in the last block of this many sectors (64 KiB).
pub const MD_RESERVED_SECTORS: u64 = 128;
/// Where the kernel places a 0.90 internal bitmap: right after the superblock.
pub const BITMAP_OFFSET_SECTORS: i32 = 8;
/// The kernel caps a 0.90 component at this many sectors for levels >= 1,
/// because the size field holds KiB in 32 bits.
pub const COMPONENT_SECTORS_MAX: u64 = (2 << 32) - 2;

/// Disk state bit: the device has failed.
pub const MD_DISK_FAULTY: u32 = 0;
/// Disk state bit: the device holds a raid slot (maybe not in sync).
pub const MD_DISK_ACTIVE: u32 = 1;
/// Disk state bit: the device is in sync.
pub const MD_DISK_SYNC: u32 = 2;
/// Disk state bit: the slot has no device.
pub const MD_DISK_REMOVED: u32 = 3;
/// Disk state bit: raid1 write-mostly.
pub const MD_DISK_WRITEMOSTLY: u32 = 9;
/// Disk state bit: fail-fast.
pub const MD_DISK_FAILFAST: u32 = 10;

/// Superblock state bit: the array was shut down cleanly.
pub const MD_SB_CLEAN: u32 = 0;
/// Superblock state bit: errors were seen.
pub const MD_SB_ERRORS: u32 = 1;
/// Superblock state bit: an internal bitmap follows the superblock.
pub const MD_SB_BITMAP_PRESENT: u32 = 8;

/// Word offsets of the fields (md_p.h, little-endian field order).
mod word {
    pub const MAGIC: usize = 0;
    pub const MAJOR: usize = 1;
    pub const MINOR: usize = 2;
    pub const PATCH: usize = 3;
    pub const GVALID: usize = 4;
    pub const UUID0: usize = 5;
    pub const CTIME: usize = 6;
    pub const LEVEL: usize = 7;
    pub const SIZE: usize = 8;
    pub const NR_DISKS: usize = 9;
    pub const RAID_DISKS: usize = 10;
    pub const MD_MINOR: usize = 11;
    pub const NOT_PERSISTENT: usize = 12;
    pub const UUID1: usize = 13;
    pub const UTIME: usize = 32;
    pub const STATE: usize = 33;
    pub const ACTIVE: usize = 34;
    pub const WORKING: usize = 35;
    pub const FAILED: usize = 36;
    pub const SPARE: usize = 37;
    pub const CSUM: usize = 38;
    pub const EVENTS_LO: usize = 39;
    pub const EVENTS_HI: usize = 40;
    pub const CP_EVENTS_LO: usize = 41;
    pub const CP_EVENTS_HI: usize = 42;
    pub const RECOVERY_CP: usize = 43;
    pub const RESHAPE_POSITION: usize = 44;
    pub const NEW_LEVEL: usize = 46;
    pub const DELTA_DISKS: usize = 47;
    pub const NEW_LAYOUT: usize = 48;
    pub const NEW_CHUNK: usize = 49;
    pub const LAYOUT: usize = 64;
    pub const CHUNK_SIZE: usize = 65;
    pub const ROOT_PV: usize = 66;
    pub const ROOT_BLOCK: usize = 67;
    pub const DISKS: usize = 128;
    pub const DESCRIPTOR_WORDS: usize = 32;
    pub const THIS_DISK: usize = 992;
}

// The sections must tile the 1024-word superblock exactly as md_p.h says.
const _: () = {
    assert!(word::UUID1 + 3 < 32);
    assert!(word::NEW_CHUNK < 64);
    assert!(word::RESHAPE_POSITION.is_multiple_of(2));
    assert!(word::DISKS + MD_SB_DISKS * word::DESCRIPTOR_WORDS <= word::THIS_DISK);
    assert!(word::THIS_DISK + word::DESCRIPTOR_WORDS == MD_SB_BYTES / 4);
};

/// One 0.90 disk descriptor (the first five of its 32 words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sb090Disk {
    /// Index of the descriptor in the table.
    pub number: u32,
    /// Device major number when the superblock was written.
    pub major: u32,
    /// Device minor number when the superblock was written.
    pub minor: u32,
    /// Raid slot.
    pub raid_disk: u32,
    /// `MD_DISK_*` bits.
    pub state: u32,
}

/// The fields of a 0.90 superblock that have no place in a 1.x superblock.
///
/// Encoding uses them as they are, except where the common fields of
/// [`MemberSuper`] say otherwise: a disk descriptor whose role no longer
/// matches `dev_roles` is rewritten, and the clean and bitmap-present state
/// bits come from `resync_offset_sectors` and `feature_map`. The device
/// counts are written as stored, so a caller that changes roles should
/// update them too.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sb090Extra {
    /// Third part of the version (0.90.x); md writes 0.
    pub patch_version: u32,
    /// Historical "used words" count; ignored by md.
    pub gvalid_words: u32,
    /// Preferred md minor number.
    pub md_minor: u32,
    /// Non-zero for arrays without persistent superblocks.
    pub not_persistent: u32,
    /// Devices in the array (working and failed).
    pub nr_disks: u32,
    /// Devices holding an active slot.
    pub active_disks: u32,
    /// Devices that work (active and spare).
    pub working_disks: u32,
    /// Failed or missing devices.
    pub failed_disks: u32,
    /// Spare devices.
    pub spare_disks: u32,
    /// Superblock state bits other than MD_SB_CLEAN and MD_SB_BITMAP_PRESENT.
    pub state_flags: u32,
    /// Unused LVM-era personality word, kept as found.
    pub root_pv: u32,
    /// Unused LVM-era personality word, kept as found.
    pub root_block: u32,
    /// The disk table as found on disk.
    pub disks: [Sb090Disk; MD_SB_DISKS],
    /// This device's own descriptor as found on disk.
    pub this_disk: Sb090Disk,
}

/// The sector of the 0.90 superblock on a device of `device_sectors`
/// sectors, or `None` below 64 KiB.
pub fn superblock_offset_sectors(device_sectors: u64) -> Option<u64> {
    if device_sectors < SB090_MIN_DEVICE_SECTORS {
        return None;
    }
    Some((device_sectors & !(MD_RESERVED_SECTORS - 1)) - MD_RESERVED_SECTORS)
}

fn get(buf: &[u8], w: usize) -> u32 {
    let at = w * 4;
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn set(buf: &mut [u8], w: usize, value: u32) {
    buf[w * 4..w * 4 + 4].copy_from_slice(&value.to_le_bytes());
}

/// The 0.90 checksum as md and mdadm compute it on little-endian hosts: the
/// 64-bit sum of all 1024 words with the checksum word taken as zero,
/// folded once to 32 bits. `buf` must hold at least 4096 bytes.
pub fn checksum(buf: &[u8]) -> Result<u32, FormatError> {
    if buf.len() < MD_SB_BYTES {
        return Err(FormatError::BufferTooShort {
            need: MD_SB_BYTES,
            got: buf.len(),
        });
    }
    let sum: u64 = (0..MD_SB_BYTES / 4)
        .filter(|&w| w != word::CSUM)
        .map(|w| u64::from(get(buf, w)))
        .sum();
    Ok(((sum & 0xffff_ffff) + (sum >> 32)) as u32)
}

/// Recomputes and stores the checksum of the 0.90 superblock in `buf`.
pub fn write_checksum(buf: &mut [u8]) -> Result<u32, FormatError> {
    let csum = checksum(buf)?;
    set(buf, word::CSUM, csum);
    Ok(csum)
}

/// md's `md_csum_fold`: the kernel compares 0.90 checksums folded to 16
/// bits, a leftover from architectures whose checksum helper returned 16
/// bits. Two values that fold alike are both accepted.
fn csum_fold(csum: u32) -> u32 {
    let c = (csum & 0xffff) + (csum >> 16);
    (c & 0xffff) + (c >> 16)
}

fn read_disk(buf: &[u8], first_word: usize) -> Sb090Disk {
    Sb090Disk {
        number: get(buf, first_word),
        major: get(buf, first_word + 1),
        minor: get(buf, first_word + 2),
        raid_disk: get(buf, first_word + 3),
        state: get(buf, first_word + 4),
    }
}

fn write_disk(buf: &mut [u8], first_word: usize, d: &Sb090Disk) {
    set(buf, first_word, d.number);
    set(buf, first_word + 1, d.major);
    set(buf, first_word + 2, d.minor);
    set(buf, first_word + 3, d.raid_disk);
    set(buf, first_word + 4, d.state);
}

fn bit(state: u32, b: u32) -> bool {
    state & (1 << b) != 0
}

/// What a descriptor means, following the kernel's super_90_validate: the
/// role, and whether the device is still being rebuilt (only 0.91 records
/// that, as "active but not in sync").
fn describe(d: &Sb090Disk, reshaping: bool) -> (Role, bool) {
    let slot_ok = d.raid_disk < u32::from(super::MD_DISK_ROLE_MAX);
    if bit(d.state, MD_DISK_FAULTY) {
        (Role::Faulty, false)
    } else if bit(d.state, MD_DISK_SYNC) && slot_ok {
        (Role::Active(d.raid_disk), false)
    } else if bit(d.state, MD_DISK_ACTIVE) && !bit(d.state, MD_DISK_SYNC) && reshaping && slot_ok {
        (Role::Active(d.raid_disk), true)
    } else {
        (Role::Spare, false)
    }
}

const DEVFLAG_BITS: u32 = (1 << MD_DISK_WRITEMOSTLY) | (1 << MD_DISK_FAILFAST);

fn devflags_from_state(state: u32) -> u8 {
    let mut flags = 0;
    if bit(state, MD_DISK_WRITEMOSTLY) {
        flags |= WRITE_MOSTLY_1;
    }
    if bit(state, MD_DISK_FAILFAST) {
        flags |= FAIL_FAST_1;
    }
    flags
}

fn state_from_devflags(devflags: u8) -> u32 {
    let mut state = 0;
    if devflags & WRITE_MOSTLY_1 != 0 {
        state |= 1 << MD_DISK_WRITEMOSTLY;
    }
    if devflags & FAIL_FAST_1 != 0 {
        state |= 1 << MD_DISK_FAILFAST;
    }
    state
}

/// Decodes and validates the 4 KiB read at the 0.90 location of a device of
/// `device_sectors` sectors, with the checks of the kernel's super_90_load.
pub fn decode(buf: &[u8], device_sectors: u64) -> Result<MemberSuper, FormatError> {
    let sb_start =
        superblock_offset_sectors(device_sectors).ok_or(FormatError::DeviceTooSmall {
            device_sectors,
            metadata: Metadata::V0_90,
            minimum: SB090_MIN_DEVICE_SECTORS,
        })?;
    if buf.len() < MD_SB_BYTES {
        return Err(FormatError::BufferTooShort {
            need: MD_SB_BYTES,
            got: buf.len(),
        });
    }
    let magic = get(buf, word::MAGIC);
    if magic != MD_SB_MAGIC {
        return Err(FormatError::BadMagic { found: magic });
    }
    let (major, minor) = (get(buf, word::MAJOR), get(buf, word::MINOR));
    if major != 0 || !(90..=91).contains(&minor) {
        return Err(FormatError::Bad090Version { major, minor });
    }
    let raid_disks = get(buf, word::RAID_DISKS);
    if raid_disks == 0 {
        return Err(FormatError::NoRaidDisks);
    }
    let stored = get(buf, word::CSUM);
    let computed = checksum(buf)?;
    if csum_fold(stored) != csum_fold(computed) {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    let level = get(buf, word::LEVEL) as i32;
    let this_disk = read_disk(buf, word::THIS_DISK);
    let dev_number = this_disk.number;
    // The kernel indexes the 27-entry table with this number without a
    // bound check (except for multipath, which ignores it); a larger value
    // would make it read unrelated words, so such a superblock is refused.
    if level != LEVEL_MULTIPATH && dev_number as usize >= MD_SB_DISKS {
        return Err(FormatError::DescriptorOutOfRange { found: dev_number });
    }
    // The component size is recorded in KiB; the kernel caps the usable
    // sectors of levels >= 1 at what that field can describe.
    let size_sectors = u64::from(get(buf, word::SIZE)) * 2;
    let data_size = if level >= 1 {
        sb_start.min(COMPONENT_SECTORS_MAX)
    } else {
        sb_start
    };
    if level >= 1 && size_sectors > data_size {
        return Err(FormatError::ComponentSizeExceedsDevice {
            size_sectors,
            available: data_size,
        });
    }

    let reshaping = minor == 91;
    let mut disks = [Sb090Disk::default(); MD_SB_DISKS];
    for (i, d) in disks.iter_mut().enumerate() {
        *d = read_disk(buf, word::DISKS + i * word::DESCRIPTOR_WORDS);
    }
    let dev_roles: Vec<u16> = disks
        .iter()
        .map(|d| {
            describe(d, reshaping)
                .0
                .to_raw()
                .unwrap_or(MD_DISK_ROLE_SPARE)
        })
        .collect();
    let own = disks.get(dev_number as usize);
    let state = get(buf, word::STATE);
    let mut feature_map = 0;
    if reshaping {
        feature_map |= MD_FEATURE_RESHAPE_ACTIVE;
    }
    if bit(state, MD_SB_BITMAP_PRESENT) {
        feature_map |= MD_FEATURE_BITMAP_OFFSET;
    }
    if own.is_some_and(|d| describe(d, reshaping).1) {
        feature_map |= MD_FEATURE_RECOVERY_OFFSET;
    }

    let events = u64::from(get(buf, word::EVENTS_HI)) << 32 | u64::from(get(buf, word::EVENTS_LO));
    let cp_events =
        u64::from(get(buf, word::CP_EVENTS_HI)) << 32 | u64::from(get(buf, word::CP_EVENTS_LO));
    // super_90_validate: clean means fully in sync; otherwise the checkpoint
    // counts only if it was written together with the current events.
    let resync_offset = if bit(state, MD_SB_CLEAN) {
        SECTOR_MAX
    } else if events == cp_events {
        u64::from(get(buf, word::RECOVERY_CP))
    } else {
        0
    };

    let mut set_uuid = [0u8; 16];
    set_uuid[0..4].copy_from_slice(&buf[word::UUID0 * 4..word::UUID0 * 4 + 4]);
    set_uuid[4..16].copy_from_slice(&buf[word::UUID1 * 4..word::UUID1 * 4 + 12]);

    let extra = Sb090Extra {
        patch_version: get(buf, word::PATCH),
        gvalid_words: get(buf, word::GVALID),
        md_minor: get(buf, word::MD_MINOR),
        not_persistent: get(buf, word::NOT_PERSISTENT),
        nr_disks: get(buf, word::NR_DISKS),
        active_disks: get(buf, word::ACTIVE),
        working_disks: get(buf, word::WORKING),
        failed_disks: get(buf, word::FAILED),
        spare_disks: get(buf, word::SPARE),
        state_flags: state & !((1 << MD_SB_CLEAN) | (1 << MD_SB_BITMAP_PRESENT)),
        root_pv: get(buf, word::ROOT_PV),
        root_block: get(buf, word::ROOT_BLOCK),
        disks,
        this_disk,
    };

    Ok(MemberSuper {
        metadata: Metadata::V0_90,
        feature_map,
        set_uuid,
        set_name: String::new(),
        ctime_secs: u64::from(get(buf, word::CTIME)),
        ctime_micros: 0,
        level,
        layout: get(buf, word::LAYOUT),
        size_sectors,
        chunk_sectors: get(buf, word::CHUNK_SIZE) >> 9,
        raid_disks,
        bitmap_offset_sectors: if bit(state, MD_SB_BITMAP_PRESENT) {
            BITMAP_OFFSET_SECTORS
        } else {
            0
        },
        new_level: get(buf, word::NEW_LEVEL) as i32,
        reshape_position_sectors: u64::from(get(buf, word::RESHAPE_POSITION + 1)) << 32
            | u64::from(get(buf, word::RESHAPE_POSITION)),
        delta_disks: get(buf, word::DELTA_DISKS) as i32,
        new_layout: get(buf, word::NEW_LAYOUT),
        new_chunk_sectors: get(buf, word::NEW_CHUNK) >> 9,
        new_offset_sectors: 0,
        data_offset_sectors: 0,
        data_size_sectors: data_size,
        super_offset_sectors: sb_start,
        recovery_offset_sectors: 0,
        dev_number,
        cnt_corrected_read: 0,
        device_uuid: [0; 16],
        devflags: own.map_or(0, |d| devflags_from_state(d.state)),
        bblog_shift: 0,
        bblog_size_sectors: 0,
        bblog_offset_sectors: 0,
        utime_secs: u64::from(get(buf, word::UTIME)),
        utime_micros: 0,
        events,
        resync_offset_sectors: resync_offset,
        max_dev: MD_SB_DISKS as u32,
        dev_roles,
        v090: Some(extra),
    })
}

/// Encodes a 0.90 superblock (4096 bytes, checksum included).
///
/// Fields that 0.90 cannot hold are refused rather than dropped when they
/// change the meaning of the array: a non-zero data offset, 1.x-only feature
/// bits, a journal role, sizes that do not fit. Purely descriptive 1.x
/// fields (name, device UUID, bad-block log, data_size, super_offset) are
/// ignored. Times beyond 32 bits are clamped and a resync checkpoint beyond
/// 32 bits is truncated, as the kernel does; truncation only moves the
/// checkpoint backwards, which is safe.
pub fn encode(sb: &MemberSuper) -> Result<Vec<u8>, FormatError> {
    if sb.metadata != Metadata::V0_90 {
        return Err(FormatError::WrongMetadata {
            metadata: sb.metadata,
        });
    }
    if sb.data_offset_sectors != 0 {
        return Err(FormatError::DataOffsetNotZero {
            found: sb.data_offset_sectors,
        });
    }
    let representable =
        MD_FEATURE_RESHAPE_ACTIVE | MD_FEATURE_BITMAP_OFFSET | MD_FEATURE_RECOVERY_OFFSET;
    if sb.feature_map & !representable != 0 {
        return Err(FormatError::FeatureNotRepresentable {
            bits: sb.feature_map & !representable,
        });
    }
    let has_bitmap = sb.feature_map & MD_FEATURE_BITMAP_OFFSET != 0;
    if has_bitmap && sb.bitmap_offset_sectors != BITMAP_OFFSET_SECTORS {
        return Err(FormatError::BitmapOffsetNotRepresentable {
            found: sb.bitmap_offset_sectors,
        });
    }
    if sb.raid_disks == 0 {
        return Err(FormatError::NoRaidDisks);
    }
    if sb.dev_roles.len() > MD_SB_DISKS {
        return Err(FormatError::TooManyDevices {
            found: sb.dev_roles.len() as u32,
            limit: MD_SB_DISKS as u32,
        });
    }
    if sb.level != LEVEL_MULTIPATH && sb.dev_number as usize >= MD_SB_DISKS {
        return Err(FormatError::DescriptorOutOfRange {
            found: sb.dev_number,
        });
    }
    if !sb.size_sectors.is_multiple_of(2) || sb.size_sectors / 2 > u64::from(u32::MAX) {
        return Err(FormatError::ValueOutOfRange {
            field: "size_sectors (0.90 stores whole KiB in 32 bits)",
            value: sb.size_sectors,
        });
    }
    let chunk_bytes = sb
        .chunk_sectors
        .checked_mul(512)
        .ok_or(FormatError::ValueOutOfRange {
            field: "chunk_sectors (0.90 stores bytes in 32 bits)",
            value: u64::from(sb.chunk_sectors),
        })?;
    let new_chunk_bytes =
        sb.new_chunk_sectors
            .checked_mul(512)
            .ok_or(FormatError::ValueOutOfRange {
                field: "new_chunk_sectors (0.90 stores bytes in 32 bits)",
                value: u64::from(sb.new_chunk_sectors),
            })?;

    let reshaping = sb.feature_map & MD_FEATURE_RESHAPE_ACTIVE != 0;
    let recovering = sb.feature_map & MD_FEATURE_RECOVERY_OFFSET != 0;
    let extra = sb.v090.clone().unwrap_or_default();
    let own = sb.dev_number as usize;

    // Keep each stored descriptor whose meaning still matches dev_roles, so
    // that major/minor numbers and other history survive; rewrite the rest.
    let mut disks = extra.disks;
    for (i, d) in disks.iter_mut().enumerate() {
        let wanted = sb
            .dev_roles
            .get(i)
            .map_or(Role::Spare, |&r| Role::from_raw(r));
        let wanted_recovering = i == own && recovering;
        let (role, was_recovering) = describe(d, reshaping);
        if role == wanted && (i != own || was_recovering == wanted_recovering) {
            continue;
        }
        let kept_bits = d.state & DEVFLAG_BITS;
        let (raid_disk, state) = match wanted {
            // A device still being rebuilt is "active, not in sync". Plain
            // 0.90 cannot say where the rebuild stands, and the kernel then
            // treats the device as a spare, which is the safe reading.
            Role::Active(slot) if wanted_recovering => (slot, 1 << MD_DISK_ACTIVE),
            Role::Active(slot) => (slot, (1 << MD_DISK_ACTIVE) | (1 << MD_DISK_SYNC)),
            Role::Faulty => (i as u32, 1 << MD_DISK_FAULTY),
            Role::Spare => (i as u32, 0),
            Role::Journal => {
                return Err(FormatError::RoleNotRepresentable {
                    role: Role::Journal,
                    metadata: Metadata::V0_90,
                })
            }
        };
        *d = Sb090Disk {
            number: i as u32,
            major: d.major,
            minor: d.minor,
            raid_disk,
            state: state | kept_bits,
        };
    }
    if let Some(d) = disks.get_mut(own) {
        d.state = (d.state & !DEVFLAG_BITS) | state_from_devflags(sb.devflags);
    }
    // this_disk is a copy of the device's own descriptor. A stored copy is
    // kept while the descriptor it mirrors is unchanged.
    let this_disk = match disks.get(own) {
        Some(d) if extra.this_disk.number == sb.dev_number && *d == extra.disks[own] => {
            extra.this_disk
        }
        Some(d) => *d,
        None if extra.this_disk.number == sb.dev_number => extra.this_disk,
        None => Sb090Disk {
            number: sb.dev_number,
            ..Sb090Disk::default()
        },
    };

    let mut state = extra.state_flags & !((1 << MD_SB_CLEAN) | (1 << MD_SB_BITMAP_PRESENT));
    let recovery_cp = if sb.resync_offset_sectors == SECTOR_MAX {
        state |= 1 << MD_SB_CLEAN;
        u32::MAX
    } else {
        sb.resync_offset_sectors as u32
    };
    if has_bitmap {
        state |= 1 << MD_SB_BITMAP_PRESENT;
    }
    let clamp = |secs: u64| secs.min(u64::from(u32::MAX)) as u32;

    let mut buf = vec![0u8; MD_SB_BYTES];
    set(&mut buf, word::MAGIC, MD_SB_MAGIC);
    set(&mut buf, word::MAJOR, 0);
    set(&mut buf, word::MINOR, if reshaping { 91 } else { 90 });
    set(&mut buf, word::PATCH, extra.patch_version);
    set(&mut buf, word::GVALID, extra.gvalid_words);
    buf[word::UUID0 * 4..word::UUID0 * 4 + 4].copy_from_slice(&sb.set_uuid[0..4]);
    set(&mut buf, word::CTIME, clamp(sb.ctime_secs));
    set(&mut buf, word::LEVEL, sb.level as u32);
    set(&mut buf, word::SIZE, (sb.size_sectors / 2) as u32);
    set(&mut buf, word::NR_DISKS, extra.nr_disks);
    set(&mut buf, word::RAID_DISKS, sb.raid_disks);
    set(&mut buf, word::MD_MINOR, extra.md_minor);
    set(&mut buf, word::NOT_PERSISTENT, extra.not_persistent);
    buf[word::UUID1 * 4..word::UUID1 * 4 + 12].copy_from_slice(&sb.set_uuid[4..16]);
    set(&mut buf, word::UTIME, clamp(sb.utime_secs));
    set(&mut buf, word::STATE, state);
    set(&mut buf, word::ACTIVE, extra.active_disks);
    set(&mut buf, word::WORKING, extra.working_disks);
    set(&mut buf, word::FAILED, extra.failed_disks);
    set(&mut buf, word::SPARE, extra.spare_disks);
    set(&mut buf, word::EVENTS_LO, sb.events as u32);
    set(&mut buf, word::EVENTS_HI, (sb.events >> 32) as u32);
    // The checkpoint is always written with the current events, so that it
    // is honoured when the array is not clean.
    set(&mut buf, word::CP_EVENTS_LO, sb.events as u32);
    set(&mut buf, word::CP_EVENTS_HI, (sb.events >> 32) as u32);
    set(&mut buf, word::RECOVERY_CP, recovery_cp);
    set(
        &mut buf,
        word::RESHAPE_POSITION,
        sb.reshape_position_sectors as u32,
    );
    set(
        &mut buf,
        word::RESHAPE_POSITION + 1,
        (sb.reshape_position_sectors >> 32) as u32,
    );
    set(&mut buf, word::NEW_LEVEL, sb.new_level as u32);
    set(&mut buf, word::DELTA_DISKS, sb.delta_disks as u32);
    set(&mut buf, word::NEW_LAYOUT, sb.new_layout);
    set(&mut buf, word::NEW_CHUNK, new_chunk_bytes);
    set(&mut buf, word::LAYOUT, sb.layout);
    set(&mut buf, word::CHUNK_SIZE, chunk_bytes);
    set(&mut buf, word::ROOT_PV, extra.root_pv);
    set(&mut buf, word::ROOT_BLOCK, extra.root_block);
    for (i, d) in disks.iter().enumerate() {
        write_disk(&mut buf, word::DISKS + i * word::DESCRIPTOR_WORDS, d);
    }
    write_disk(&mut buf, word::THIS_DISK, &this_disk);
    write_checksum(&mut buf)?;
    Ok(buf)
}

/// Builds the 0.90-only fields for a new superblock from its roles, with
/// the device counts the kernel would write when every listed device is
/// present. Callers creating 0.90 metadata store the result in
/// [`MemberSuper::v090`] before encoding.
pub fn extra_for_roles(dev_roles: &[u16], md_minor: u32) -> Sb090Extra {
    let mut extra = Sb090Extra {
        md_minor,
        ..Sb090Extra::default()
    };
    for (i, &raw) in dev_roles.iter().take(MD_SB_DISKS).enumerate() {
        let (raid_disk, state) = match Role::from_raw(raw) {
            Role::Active(slot) => {
                extra.active_disks += 1;
                extra.working_disks += 1;
                (slot, (1 << MD_DISK_ACTIVE) | (1 << MD_DISK_SYNC))
            }
            Role::Faulty => {
                extra.failed_disks += 1;
                (i as u32, (1 << MD_DISK_FAULTY) | (1 << MD_DISK_REMOVED))
            }
            Role::Spare | Role::Journal => continue,
        };
        extra.disks[i] = Sb090Disk {
            number: i as u32,
            major: 0,
            minor: 0,
            raid_disk,
            state,
        };
    }
    extra.nr_disks = extra.working_disks;
    extra
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const DEV: u64 = 131_072 + 77;

    /// A member of a 2-disk raid1 plus one missing slot, as the kernel
    /// would write it.
    pub(crate) fn sample() -> MemberSuper {
        let mut roles = vec![MD_DISK_ROLE_SPARE; MD_SB_DISKS];
        roles[0] = 0;
        roles[1] = 1;
        roles[2] = super::super::MD_DISK_ROLE_FAULTY;
        let mut extra = extra_for_roles(&roles, 3);
        extra.disks[0].major = 7;
        extra.disks[0].minor = 0;
        extra.disks[1].major = 7;
        extra.disks[1].minor = 1;
        extra.this_disk = extra.disks[1];
        MemberSuper {
            metadata: Metadata::V0_90,
            feature_map: 0,
            set_uuid: [
                0x67, 0x45, 0x23, 0x01, 0xef, 0xcd, 0xab, 0x89, 0x33, 0x22, 0x11, 0x00, 0x77, 0x66,
                0x55, 0x44,
            ],
            set_name: String::new(),
            ctime_secs: 1_700_000_000,
            ctime_micros: 0,
            level: 1,
            layout: 0,
            size_sectors: 130_944,
            chunk_sectors: 0,
            raid_disks: 2,
            bitmap_offset_sectors: 0,
            new_level: 0,
            reshape_position_sectors: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk_sectors: 0,
            new_offset_sectors: 0,
            data_offset_sectors: 0,
            data_size_sectors: 130_944,
            super_offset_sectors: 130_944,
            recovery_offset_sectors: 0,
            dev_number: 1,
            cnt_corrected_read: 0,
            device_uuid: [0; 16],
            devflags: 0,
            bblog_shift: 0,
            bblog_size_sectors: 0,
            bblog_offset_sectors: 0,
            utime_secs: 1_700_000_500,
            utime_micros: 0,
            events: 0x1_0000_0005,
            resync_offset_sectors: SECTOR_MAX,
            max_dev: MD_SB_DISKS as u32,
            dev_roles: roles,
            v090: Some(extra),
        }
    }

    fn patched(sb: &MemberSuper, patch: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut buf = encode(sb).unwrap();
        patch(&mut buf);
        write_checksum(&mut buf).unwrap();
        buf
    }

    #[test]
    fn location_is_the_last_64k_block() {
        assert_eq!(superblock_offset_sectors(131_072), Some(130_944));
        assert_eq!(superblock_offset_sectors(131_072 + 127), Some(130_944));
        assert_eq!(superblock_offset_sectors(128), Some(0));
        assert_eq!(superblock_offset_sectors(127), None);
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let buf = encode(&sb).unwrap();
        assert_eq!(buf.len(), 4096);
        assert_eq!(decode(&buf, DEV).unwrap(), sb);
        assert_eq!(sb.uuid_string(), "01234567:89abcdef:00112233:44556677");
    }

    #[test]
    fn layout_of_key_words() {
        let buf = encode(&sample()).unwrap();
        assert_eq!(get(&buf, 0), MD_SB_MAGIC);
        assert_eq!(get(&buf, 2), 90);
        assert_eq!(get(&buf, 5), 0x0123_4567);
        assert_eq!(get(&buf, 13), 0x89ab_cdef);
        assert_eq!(get(&buf, 8), 65_472);
        assert_eq!(get(&buf, 33), 1); // clean
        assert_eq!(get(&buf, 39), 5); // events low word
        assert_eq!(get(&buf, 40), 1); // events high word
        assert_eq!(get(&buf, 128 + 32 + 3), 1); // disks[1].raid_disk
        assert_eq!(get(&buf, 128 + 32 + 4), 6); // active | sync
        assert_eq!(get(&buf, 992), 1); // this_disk.number
        assert_eq!(get(&buf, 992 + 1), 7); // this_disk.major
    }

    #[test]
    fn round_trip_of_dirty_reshaping_and_bitmap_states() {
        let mut sb = sample();
        sb.resync_offset_sectors = 4242;
        sb.feature_map = MD_FEATURE_RESHAPE_ACTIVE | MD_FEATURE_BITMAP_OFFSET;
        sb.bitmap_offset_sectors = 8;
        sb.reshape_position_sectors = 0x1_2345_6789;
        sb.delta_disks = -1;
        sb.new_level = 5;
        sb.new_chunk_sectors = 128;
        sb.devflags = WRITE_MOSTLY_1;
        let buf = encode(&sb).unwrap();
        assert_eq!(get(&buf, word::MINOR), 91);
        let back = decode(&buf, DEV).unwrap();
        // The write-mostly bit lands in the device's descriptor, and
        // this_disk follows it.
        let extra = back.v090.clone().unwrap();
        assert_eq!(extra.this_disk, extra.disks[1]);
        assert_eq!(back.devflags, WRITE_MOSTLY_1);
        let mut expect = sb.clone();
        expect.v090 = Some(extra);
        assert_eq!(back, expect);
        // A stale checkpoint (written with other events) means "from 0".
        let buf = patched(&sb, |b| set(b, word::CP_EVENTS_LO, 1));
        assert_eq!(decode(&buf, DEV).unwrap().resync_offset_sectors, 0);
    }

    #[test]
    fn role_changes_rewrite_descriptors() {
        let mut sb = sample();
        sb.dev_roles[0] = super::super::MD_DISK_ROLE_FAULTY;
        sb.dev_roles[3] = 0;
        let back = decode(&encode(&sb).unwrap(), DEV).unwrap();
        assert_eq!(back.role_of(0), Role::Faulty);
        assert_eq!(back.role_of(3), Role::Active(0));
        assert_eq!(back.role_of(1), Role::Active(1));
        let extra = back.v090.unwrap();
        assert_eq!(extra.disks[0].major, 7, "device numbers are kept");
        // A recovering device on plain 0.90 is written as "active, not in
        // sync", which the kernel reads as a spare.
        let mut sb = sample();
        sb.feature_map = MD_FEATURE_RECOVERY_OFFSET;
        let back = decode(&encode(&sb).unwrap(), DEV).unwrap();
        assert_eq!(back.this_role(), Role::Spare);
        // On 0.91 the rebuild is recorded and read back.
        sb.feature_map |= MD_FEATURE_RESHAPE_ACTIVE;
        let back = decode(&encode(&sb).unwrap(), DEV).unwrap();
        assert_eq!(back.this_role(), Role::Active(1));
        assert!(back.has_feature(MD_FEATURE_RECOVERY_OFFSET));
    }

    #[test]
    fn validity_errors() {
        let sb = sample();
        let buf = patched(&sb, |b| set(b, word::MAGIC, 0));
        assert_eq!(decode(&buf, DEV), Err(FormatError::BadMagic { found: 0 }));
        let buf = patched(&sb, |b| set(b, word::MINOR, 92));
        assert_eq!(
            decode(&buf, DEV),
            Err(FormatError::Bad090Version {
                major: 0,
                minor: 92
            })
        );
        let buf = patched(&sb, |b| set(b, word::MAJOR, 1));
        assert_eq!(
            decode(&buf, DEV),
            Err(FormatError::Bad090Version {
                major: 1,
                minor: 90
            })
        );
        let buf = patched(&sb, |b| set(b, word::RAID_DISKS, 0));
        assert_eq!(decode(&buf, DEV), Err(FormatError::NoRaidDisks));
        let mut buf = encode(&sb).unwrap();
        buf[4000] ^= 0x10;
        assert!(matches!(
            decode(&buf, DEV),
            Err(FormatError::BadChecksum { .. })
        ));
        let buf = patched(&sb, |b| set(b, word::THIS_DISK, 27));
        assert_eq!(
            decode(&buf, DEV),
            Err(FormatError::DescriptorOutOfRange { found: 27 })
        );
        let buf = patched(&sb, |b| set(b, word::SIZE, 65_473));
        assert_eq!(
            decode(&buf, DEV),
            Err(FormatError::ComponentSizeExceedsDevice {
                size_sectors: 130_946,
                available: 130_944
            })
        );
        assert!(matches!(
            decode(&buf[..4095], DEV),
            Err(FormatError::BufferTooShort { .. })
        ));
        assert!(matches!(
            decode(&buf, 100),
            Err(FormatError::DeviceTooSmall { .. })
        ));
    }

    #[test]
    fn checksum_uses_the_16_bit_fold_for_comparison() {
        assert_eq!(csum_fold(0x0001_0000), csum_fold(0x0000_0001));
        let sb = sample();
        let mut buf = encode(&sb).unwrap();
        let good = get(&buf, word::CSUM);
        // The full 32-bit sum is what mdadm prints and what we store.
        let sum: u64 = (0..1024)
            .filter(|&w| w != word::CSUM)
            .map(|w| u64::from(get(&buf, w)))
            .sum();
        assert_eq!(good, ((sum & 0xffff_ffff) + (sum >> 32)) as u32);
        // Adding 0xffff moves one unit from the low half to the high half,
        // which folds to the same 16-bit value, so md accepts it too.
        assert!(good & 0xffff != 0 && good >> 16 != 0xffff);
        set(&mut buf, word::CSUM, good + 0xffff);
        assert!(decode(&buf, DEV).is_ok());
        set(&mut buf, word::CSUM, good + 1);
        assert!(matches!(
            decode(&buf, DEV),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn encoder_refuses_what_0_90_cannot_hold() {
        let mut sb = sample();
        sb.data_offset_sectors = 2048;
        assert_eq!(
            encode(&sb),
            Err(FormatError::DataOffsetNotZero { found: 2048 })
        );
        let mut sb = sample();
        sb.feature_map = super::super::MD_FEATURE_RAID0_LAYOUT;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::FeatureNotRepresentable { .. })
        ));
        let mut sb = sample();
        sb.size_sectors = 3;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::ValueOutOfRange { .. })
        ));
        let mut sb = sample();
        sb.dev_roles[4] = super::super::MD_DISK_ROLE_JOURNAL;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::RoleNotRepresentable { .. })
        ));
        let mut sb = sample();
        sb.feature_map = MD_FEATURE_BITMAP_OFFSET;
        sb.bitmap_offset_sectors = 2;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::BitmapOffsetNotRepresentable { found: 2 })
        ));
        let mut sb = sample();
        sb.metadata = Metadata::V1_2;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::WrongMetadata { .. })
        ));
    }

    #[test]
    fn encoding_without_stored_extras_synthesises_the_table() {
        let mut sb = sample();
        sb.v090 = None;
        let back = decode(&encode(&sb).unwrap(), DEV).unwrap();
        assert_eq!(back.dev_roles, sb.dev_roles);
        assert_eq!(back.v090.unwrap().this_disk.number, 1);
    }
}
