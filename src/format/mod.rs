//! md superblocks: pure encoding, decoding and validation, with no I/O.
//!
//! This layer turns the bytes Linux md keeps on each member device into a
//! [`MemberSuper`] and back. Three families are covered:
//!
//! - [`sb1`]: the version-1 superblock (`struct mdp_superblock_1`), used by
//!   metadata 1.0, 1.1 and 1.2, which differ only in where the superblock
//!   lives on the device.
//! - [`sb090`]: the legacy 0.90 superblock at the end of the device.
//! - [`create`]: the values mdadm 4.2 chooses when it creates an array, so
//!   that an array created by uraid looks like one created by mdadm.
//!
//! Every numeric field name carries its unit (`_sectors`, `_bytes`, `_secs`).
//! A sector is always 512 bytes, as in md. All on-disk integers are read and
//! written with explicit little-endian conversions, so the code behaves the
//! same on every host.
//!
//! The validity rules are those of the kernel's `super_1_load`,
//! `super_1_validate` and `super_90_load` (drivers/md/md.c); each rejected
//! condition has its own [`FormatError`] variant so that callers and tests
//! can tell them apart.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub mod bitmap;
pub mod create;
pub mod journal;
pub mod sb090;
pub mod sb1;

#[cfg(test)]
mod mdadm_oracle;

pub use create::{
    bitmap_sync_sectors, choose_bm_space, compose_set_name, default_bad_block_log,
    default_data_offset_sectors, default_internal_bitmap, default_max_dev, default_size_sectors,
    mdadm_adds_bitmap, mdadm_freesize_sectors, plan_create, raid0_needs_layout,
    v1_0_data_size_sectors, ConsistencyPolicy, CreateDevice, CreateMember, CreatePlan, CreateSpec,
    InternalBitmap,
};
pub use sb090::{Sb090Disk, Sb090Extra};

/// The md superblock magic number, shared by 0.90 and 1.x.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;

/// The magic of uraid's dRAID superblock (the bytes "uDRD" on disk).
///
/// A dRAID member's superblock is laid out as a version-1 md superblock at
/// the 1.2 location, so that uraid's superblock machinery (roles, events,
/// recovery offsets, the bitmap) serves it unchanged; only the magic and
/// the level differ. With another magic, mdadm and the kernel find no md
/// superblock on the device, and never assemble or overwrite it as md's.
/// docs/DRAID-FORMAT.md describes the format.
pub const DRAID_SB_MAGIC: u32 = u32::from_le_bytes(*b"uDRD");

/// dRAID's level numbers in its superblock: -100 - parity (-101, -102,
/// -103). md has no such level, and uses only -1, -4 and -5 below zero.
pub const DRAID_LEVEL_BASE: i32 = -100;

/// Whether `level` is one of dRAID's level numbers.
pub fn is_draid_level(level: i32) -> bool {
    (DRAID_LEVEL_BASE - 3..DRAID_LEVEL_BASE).contains(&level)
}

/// The magic a superblock of `level` is written with.
pub fn magic_for_level(level: i32) -> u32 {
    if is_draid_level(level) {
        DRAID_SB_MAGIC
    } else {
        MD_SB_MAGIC
    }
}

/// md's "MaxSector": a resync offset with this value means the array is clean.
pub const SECTOR_MAX: u64 = u64::MAX;

/// feature_map bit: `bitmap_offset` is valid (internal write-intent bitmap).
pub const MD_FEATURE_BITMAP_OFFSET: u32 = 1;
/// feature_map bit: `recovery_offset` is valid (this device is partly rebuilt).
pub const MD_FEATURE_RECOVERY_OFFSET: u32 = 2;
/// feature_map bit: a reshape is in progress; the `new_*` fields are valid.
pub const MD_FEATURE_RESHAPE_ACTIVE: u32 = 4;
/// feature_map bit: the bad-block list on this device is not empty.
pub const MD_FEATURE_BAD_BLOCKS: u32 = 8;
/// feature_map bit: this device replaces the active device with the same role.
pub const MD_FEATURE_REPLACEMENT: u32 = 16;
/// feature_map bit: a reshape that keeps the device count runs backwards.
pub const MD_FEATURE_RESHAPE_BACKWARDS: u32 = 32;
/// feature_map bit: `new_offset` must be honoured.
pub const MD_FEATURE_NEW_OFFSET: u32 = 64;
/// feature_map bit: the running recovery is guided by the bitmap.
pub const MD_FEATURE_RECOVERY_BITMAP: u32 = 128;
/// feature_map bit: md-cluster array (mdadm calls it BITMAP_VERSIONED).
pub const MD_FEATURE_CLUSTERED: u32 = 256;
/// mdadm's name for [`MD_FEATURE_CLUSTERED`].
pub const MD_FEATURE_BITMAP_VERSIONED: u32 = MD_FEATURE_CLUSTERED;
/// feature_map bit: the array has a raid5 write journal.
pub const MD_FEATURE_JOURNAL: u32 = 512;
/// feature_map bit: partial parity log (raid5).
pub const MD_FEATURE_PPL: u32 = 1024;
/// feature_map bit: multiple partial parity logs (raid5).
pub const MD_FEATURE_MULTIPLE_PPLS: u32 = 2048;
/// feature_map bit: `layout` is meaningful for RAID0 (multi-zone layouts).
pub const MD_FEATURE_RAID0_LAYOUT: u32 = 4096;
/// Every feature bit the kernel knows; any other bit makes it refuse the device.
pub const MD_FEATURE_ALL: u32 = MD_FEATURE_BITMAP_OFFSET
    | MD_FEATURE_RECOVERY_OFFSET
    | MD_FEATURE_RESHAPE_ACTIVE
    | MD_FEATURE_BAD_BLOCKS
    | MD_FEATURE_REPLACEMENT
    | MD_FEATURE_RESHAPE_BACKWARDS
    | MD_FEATURE_NEW_OFFSET
    | MD_FEATURE_RECOVERY_BITMAP
    | MD_FEATURE_CLUSTERED
    | MD_FEATURE_JOURNAL
    | MD_FEATURE_PPL
    | MD_FEATURE_MULTIPLE_PPLS
    | MD_FEATURE_RAID0_LAYOUT;

/// dev_roles value of a spare (also the value of every unused slot).
pub const MD_DISK_ROLE_SPARE: u16 = 0xffff;
/// dev_roles value of a failed device.
pub const MD_DISK_ROLE_FAULTY: u16 = 0xfffe;
/// dev_roles value of a write-journal device.
pub const MD_DISK_ROLE_JOURNAL: u16 = 0xfffd;
/// dev_roles values below this are active raid slots.
pub const MD_DISK_ROLE_MAX: u16 = 0xff00;

/// `devflags` bit: reads avoid this device (raid1 write-mostly).
pub const WRITE_MOSTLY_1: u8 = 1;
/// `devflags` bit: the device gets fail-fast requests.
pub const FAIL_FAST_1: u8 = 2;

/// md level numbers that are not plain RAID levels.
pub const LEVEL_LINEAR: i32 = -1;
/// md level number of the multipath personality.
pub const LEVEL_MULTIPATH: i32 = -4;
/// md level number of the faulty (error injection) personality.
pub const LEVEL_FAULTY: i32 = -5;

/// Which superblock format and location a member uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Metadata {
    /// 0.90: 4 KiB superblock in the last 64 KiB-aligned block of the device.
    V0_90,
    /// 1.0: version-1 superblock 8 to 12 KiB before the end of the device.
    V1_0,
    /// 1.1: version-1 superblock at the start of the device.
    V1_1,
    /// 1.2: version-1 superblock 4 KiB from the start of the device.
    V1_2,
}

impl Metadata {
    /// The version-1 minor number (0, 1 or 2), or `None` for 0.90.
    pub fn sb1_minor(self) -> Option<u32> {
        match self {
            Metadata::V0_90 => None,
            Metadata::V1_0 => Some(0),
            Metadata::V1_1 => Some(1),
            Metadata::V1_2 => Some(2),
        }
    }

    /// The name mdadm uses for this version ("0.90", "1.0", "1.1", "1.2").
    pub fn as_str(self) -> &'static str {
        match self {
            Metadata::V0_90 => "0.90",
            Metadata::V1_0 => "1.0",
            Metadata::V1_1 => "1.1",
            Metadata::V1_2 => "1.2",
        }
    }

    /// Guesses the 1.x minor version from a superblock's own `super_offset`,
    /// exactly as `mdadm --examine` does: up to 4 sectors is 1.1, up to 8 is
    /// 1.2, anything further is 1.0. The guess is wrong only for 1.0 on a
    /// device smaller than 32 sectors, where the superblock itself sits at
    /// sector 8.
    pub fn from_super_offset(super_offset_sectors: u64) -> Metadata {
        if super_offset_sectors <= 4 {
            Metadata::V1_1
        } else if super_offset_sectors <= 8 {
            Metadata::V1_2
        } else {
            Metadata::V1_0
        }
    }
}

impl fmt::Display for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metadata {
    type Err = String;

    /// Accepts the spellings mdadm's `--metadata` accepts for these
    /// formats; "default" and "1" mean 1.2, the version mdadm creates.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "0.90" | "0.9" | "0" | "0.90.0" => Ok(Metadata::V0_90),
            "1.0" | "1.00" | "01.0" => Ok(Metadata::V1_0),
            "1.1" | "1.01" | "01.1" => Ok(Metadata::V1_1),
            "1.2" | "1.02" | "01.2" | "1" | "default" => Ok(Metadata::V1_2),
            other => Err(format!(
                "unknown metadata version '{other}': expected 0.90, 1.0, 1.1 or 1.2"
            )),
        }
    }
}

/// Smallest device (in sectors) mdadm accepts for version-1 metadata.
pub const SB1_MIN_DEVICE_SECTORS: u64 = 24;
/// Smallest device (in sectors) md accepts for 0.90 metadata (64 KiB).
pub const SB090_MIN_DEVICE_SECTORS: u64 = 128;

/// The sector where the superblock of `metadata` lives on a device of
/// `device_sectors` sectors, or `None` when the device is too small to hold
/// one (mdadm refuses version-1 members under 24 sectors, and 0.90 members
/// under 64 KiB).
///
/// - 1.0: `(device - 16) & !7`, 4 KiB aligned, 8 to 12 KiB before the end.
/// - 1.1: sector 0.
/// - 1.2: sector 8 (4 KiB from the start).
/// - 0.90: `(device & !127) - 128`, the last whole 64 KiB block.
pub fn superblock_offset_sectors(metadata: Metadata, device_sectors: u64) -> Option<u64> {
    match metadata {
        Metadata::V0_90 => sb090::superblock_offset_sectors(device_sectors),
        _ if device_sectors < SB1_MIN_DEVICE_SECTORS => None,
        Metadata::V1_0 => Some((device_sectors - 16) & !7),
        Metadata::V1_1 => Some(0),
        Metadata::V1_2 => Some(8),
    }
}

/// What a member device is in the array, decoded from a dev_roles entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// An active (possibly still recovering) raid slot, 0..raid_disks.
    Active(u32),
    /// A spare, or a slot with no device.
    Spare,
    /// A failed device.
    Faulty,
    /// A raid5 write-journal device.
    Journal,
}

impl Role {
    /// Interprets a dev_roles entry. The reserved values 0xff00..=0xfffc are
    /// not roles the kernel ever writes; like the kernel's load-time check,
    /// which counts only values below 0xff00 and the journal value as
    /// non-spares, they read as [`Role::Spare`].
    pub fn from_raw(raw: u16) -> Role {
        match raw {
            r if r < MD_DISK_ROLE_MAX => Role::Active(u32::from(r)),
            MD_DISK_ROLE_FAULTY => Role::Faulty,
            MD_DISK_ROLE_JOURNAL => Role::Journal,
            _ => Role::Spare,
        }
    }

    /// The dev_roles entry for this role, or `None` for an active slot
    /// number too large for the 16-bit table.
    pub fn to_raw(self) -> Option<u16> {
        match self {
            Role::Active(slot) if slot < u32::from(MD_DISK_ROLE_MAX) => Some(slot as u16),
            Role::Active(_) => None,
            Role::Spare => Some(MD_DISK_ROLE_SPARE),
            Role::Faulty => Some(MD_DISK_ROLE_FAULTY),
            Role::Journal => Some(MD_DISK_ROLE_JOURNAL),
        }
    }
}

/// Everything that can go wrong while decoding, validating or encoding a
/// superblock. Each kernel validity rule has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("superblock buffer too short: need {need} bytes, got {got}")]
    BufferTooShort { need: usize, got: usize },
    #[error("no md superblock: magic is {found:#010x}, expected 0xa92b4efc")]
    BadMagic { found: u32 },
    #[error("a superblock with {magic} magic claims level {level}")]
    MagicLevelMismatch { magic: &'static str, level: i32 },
    #[error("unsupported superblock major version {found}, expected 1")]
    BadMajorVersion { found: u32 },
    #[error("unsupported 0.90 superblock version {major}.{minor}, expected 0.90 or 0.91")]
    Bad090Version { major: u32, minor: u32 },
    #[error("max_dev is {found}, above the limit of {limit} device roles")]
    TooManyDevices { found: u32, limit: u32 },
    #[error("super_offset is sector {found} but {metadata} metadata on this device lives at sector {expected}")]
    SuperOffsetMismatch {
        found: u64,
        expected: u64,
        metadata: Metadata,
    },
    #[error("super_offset {found} is not a possible location for {metadata} metadata")]
    SuperOffsetInvalid { found: u64, metadata: Metadata },
    #[error("unknown feature bits {bits:#x} in feature_map")]
    UnknownFeatures { bits: u32 },
    #[error("superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("data_size is {found} sectors, below the minimum of 10")]
    DataSizeTooSmall { found: u64 },
    #[error("pad0 is {found:#x}, not zero (an unknown extension)")]
    NonZeroPad0 { found: u32 },
    #[error("pad3 is not all zero (an unknown extension)")]
    NonZeroPad3,
    #[error("data offset {data_offset} overlaps the superblock, which ends at sector {sb_end}")]
    DataOverlapsSuperblock { data_offset: u64, sb_end: u64 },
    #[error(
        "new data offset {new_data_offset} overlaps the superblock, which ends at sector {sb_end}"
    )]
    NewDataOverlapsSuperblock { new_data_offset: i128, sb_end: u64 },
    #[error("bad-block log of {found} sectors is larger than the {limit} sectors md loads")]
    BadBlockLogTooLarge { found: u16, limit: u16 },
    #[error("the bad-blocks feature is set but bblog_offset is 0")]
    BadBlockLogMissing,
    #[error("the PPL feature is combined with an internal bitmap or a write journal")]
    PplWithBitmapOrJournal,
    #[error("both the PPL and MULTIPLE_PPLS feature bits are set")]
    PplAndMultiplePpls,
    #[error("the RAID0_LAYOUT feature is set on a level {level} array")]
    Raid0LayoutOnNonRaid0 { level: i32 },
    #[error("device {dev_number} has the journal role but the JOURNAL feature is not set")]
    JournalWithoutFeature { dev_number: u32 },
    #[error(
        "data_size of {data_size} sectors exceeds the {available} sectors available on the device"
    )]
    DataSizeExceedsDevice { data_size: u64, available: u64 },
    #[error("data offset {data_offset} is beyond the end of the {device_sectors}-sector device")]
    DataOffsetBeyondDevice {
        data_offset: u64,
        device_sectors: u64,
    },
    #[error("a {device_sectors}-sector device is too small for {metadata} metadata (minimum {minimum} sectors)")]
    DeviceTooSmall {
        device_sectors: u64,
        metadata: Metadata,
        minimum: u64,
    },
    #[error("the 0.90 superblock has raid_disks 0")]
    NoRaidDisks,
    #[error("0.90 this_disk.number {found} is outside the 27-entry disk table")]
    DescriptorOutOfRange { found: u32 },
    #[error("component size of {size_sectors} sectors exceeds the {available} sectors before the 0.90 superblock")]
    ComponentSizeExceedsDevice { size_sectors: u64, available: u64 },
    #[error("{metadata} metadata is not handled by this function")]
    WrongMetadata { metadata: Metadata },
    #[error("set name is {len} bytes; md stores at most 32")]
    NameTooLong { len: usize },
    #[error("set name contains a NUL byte")]
    NameContainsNul,
    #[error("dev_roles has {len} entries but max_dev is {max_dev}")]
    RolesLengthMismatch { len: usize, max_dev: u32 },
    #[error("{field} value {value} does not fit in its on-disk field")]
    ValueOutOfRange { field: &'static str, value: u64 },
    #[error("role {role:?} cannot be stored in {metadata} metadata")]
    RoleNotRepresentable { role: Role, metadata: Metadata },
    #[error("feature bits {bits:#x} cannot be stored in 0.90 metadata")]
    FeatureNotRepresentable { bits: u32 },
    #[error("0.90 metadata keeps data at sector 0, not {found}")]
    DataOffsetNotZero { found: u64 },
    #[error("0.90 metadata keeps an internal bitmap 8 sectors after the superblock, not {found}")]
    BitmapOffsetNotRepresentable { found: i32 },
    #[error("no room next to the superblock for an internal bitmap")]
    NoRoomForBitmap,
    #[error(
        "bitmap chunk of {chunk_bytes} bytes is below the {min_bytes}-byte minimum for this size"
    )]
    BitmapChunkTooSmall { chunk_bytes: u64, min_bytes: u64 },
    #[error("component size of {size_sectors} sectors does not fit before the 1.0 superblock at sector {sb_offset}")]
    SizeExceedsSuperblockStart { size_sectors: u64, sb_offset: u64 },
    #[error("{listed} devices listed for {raid_disks} raid slots")]
    NotEnoughDevices { listed: usize, raid_disks: u32 },
    #[error("level {level} arrays cannot be created with missing devices")]
    MissingNotSupported { level: i32 },
    #[error("dev_number {dev_number} is outside the {len}-entry role table")]
    DevNumberOutOfRange { dev_number: u32, len: usize },
}

/// One member's superblock, in a form shared by all metadata versions.
///
/// The fields mirror `struct mdp_superblock_1` with units in their names.
/// A 0.90 superblock is mapped onto the same fields (see [`sb090`]); the
/// 0.90-only fields are kept in [`MemberSuper::v090`] so that re-encoding
/// does not lose them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSuper {
    /// Format and location of this superblock.
    pub metadata: Metadata,
    /// `MD_FEATURE_*` bits. md writes them per device.
    pub feature_map: u32,
    /// Array UUID as raw bytes in on-disk order.
    pub set_uuid: [u8; 16],
    /// Array name, usually "homehost:name"; at most 32 bytes, no NUL.
    pub set_name: String,
    /// Creation time, seconds since the epoch (40 bits on disk).
    pub ctime_secs: u64,
    /// Creation time, microsecond part (24 bits on disk; mdadm writes 0).
    pub ctime_micros: u32,
    /// md level: -1 linear, 0, 1, 4, 5, 6, 10, -4 multipath, -5 faulty.
    pub level: i32,
    /// Level-specific layout number.
    pub layout: u32,
    /// md's "size": sectors of each device used by the array.
    pub size_sectors: u64,
    /// Chunk size in sectors.
    pub chunk_sectors: u32,
    /// Number of raid slots (the new count during a reshape).
    pub raid_disks: u32,
    /// Signed sectors from the superblock to the bitmap superblock. The same
    /// 32 bits hold the PPL offset and size; see [`MemberSuper::ppl_offset_sectors`].
    pub bitmap_offset_sectors: i32,
    /// Reshape target level (valid with `MD_FEATURE_RESHAPE_ACTIVE`).
    pub new_level: i32,
    /// Next array sector the reshape will process.
    pub reshape_position_sectors: u64,
    /// New minus old device count during a reshape.
    pub delta_disks: i32,
    /// Reshape target layout.
    pub new_layout: u32,
    /// Reshape target chunk size in sectors.
    pub new_chunk_sectors: u32,
    /// Signed change to the data offset during a reshape (with `MD_FEATURE_NEW_OFFSET`).
    pub new_offset_sectors: i32,
    /// First data sector on this device.
    pub data_offset_sectors: u64,
    /// Sectors of this device usable for data.
    pub data_size_sectors: u64,
    /// Sector of this superblock on the device.
    pub super_offset_sectors: u64,
    /// Sectors already rebuilt (with `MD_FEATURE_RECOVERY_OFFSET`), or the
    /// journal tail on a journal device (the two share the field).
    pub recovery_offset_sectors: u64,
    /// Permanent slot of this device in `dev_roles` (not its raid role).
    pub dev_number: u32,
    /// Read errors corrected by rewriting.
    pub cnt_corrected_read: u32,
    /// Per-device UUID (random, ignored by the kernel).
    pub device_uuid: [u8; 16],
    /// `WRITE_MOSTLY_1` / `FAIL_FAST_1` bits.
    pub devflags: u8,
    /// Bad-block log entries count units of `1 << bblog_shift` sectors.
    pub bblog_shift: u8,
    /// Sectors reserved for the bad-block log.
    pub bblog_size_sectors: u16,
    /// Signed sectors from the superblock to the bad-block log.
    pub bblog_offset_sectors: i32,
    /// Last update time, seconds (40 bits on disk).
    pub utime_secs: u64,
    /// Last update time, microsecond part (24 bits on disk).
    pub utime_micros: u32,
    /// Update counter.
    pub events: u64,
    /// Data before this offset is known in sync; [`SECTOR_MAX`] means clean.
    pub resync_offset_sectors: u64,
    /// Number of entries in `dev_roles` (at most 1920 for 1.x, 27 for 0.90).
    pub max_dev: u32,
    /// Role of every device slot, indexed by `dev_number`; see [`Role::from_raw`].
    pub dev_roles: Vec<u16>,
    /// Fields that exist only in 0.90 superblocks; `None` for 1.x.
    pub v090: Option<Sb090Extra>,
}

impl MemberSuper {
    /// The role of the device with this `dev_number`. Slots beyond the
    /// table are spares, as in mdadm's `role_from_sb`.
    pub fn role_of(&self, dev_number: u32) -> Role {
        usize::try_from(dev_number)
            .ok()
            .and_then(|index| self.dev_roles.get(index))
            .map_or(Role::Spare, |&raw| Role::from_raw(raw))
    }

    /// The role of the device this superblock belongs to.
    pub fn this_role(&self) -> Role {
        self.role_of(self.dev_number)
    }

    /// Sets the role of slot `dev_number`, growing the table (and max_dev)
    /// with spare entries when needed, as the kernel does on a superblock
    /// update.
    pub fn set_role(&mut self, dev_number: u32, role: Role) -> Result<(), FormatError> {
        let raw = role.to_raw().ok_or(FormatError::RoleNotRepresentable {
            role,
            metadata: self.metadata,
        })?;
        let limit = match self.metadata {
            Metadata::V0_90 => sb090::MD_SB_DISKS as u32,
            _ => sb1::DEV_ROLES_MAX,
        };
        if dev_number >= limit {
            return Err(FormatError::DevNumberOutOfRange {
                dev_number,
                len: limit as usize,
            });
        }
        let index = dev_number as usize;
        if index >= self.dev_roles.len() {
            self.dev_roles.resize(index + 1, MD_DISK_ROLE_SPARE);
            self.max_dev = self.dev_roles.len() as u32;
        }
        self.dev_roles[index] = raw;
        Ok(())
    }

    /// True when the array was cleanly shut down (resync_offset is MaxSector),
    /// which is what mdadm prints as "State : clean".
    pub fn is_clean(&self) -> bool {
        self.resync_offset_sectors == SECTOR_MAX
    }

    /// True when every bit of `bits` is set in the feature map.
    pub fn has_feature(&self, bits: u32) -> bool {
        self.feature_map & bits == bits
    }

    /// The array UUID the way mdadm prints it: four groups of eight hex
    /// digits separated by ':'. For 1.x mdadm prints the bytes in order;
    /// for 0.90 it prints each of the four native-endian words with %08x,
    /// which on little-endian disks reverses the bytes within each group.
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.set_uuid, self.metadata == Metadata::V0_90)
    }

    /// The device UUID in mdadm's form (bytes in order).
    pub fn device_uuid_string(&self) -> String {
        format_uuid(&self.device_uuid, false)
    }

    /// The PPL offset in sectors from the superblock (low 16 bits of the
    /// bitmap_offset union, signed). Meaningful only with a PPL feature bit.
    pub fn ppl_offset_sectors(&self) -> i16 {
        (self.bitmap_offset_sectors as u32 & 0xffff) as u16 as i16
    }

    /// The PPL size in sectors (high 16 bits of the bitmap_offset union).
    pub fn ppl_size_sectors(&self) -> u16 {
        (self.bitmap_offset_sectors as u32 >> 16) as u16
    }

    /// Stores a PPL location in the bitmap_offset union.
    pub fn set_ppl(&mut self, offset_sectors: i16, size_sectors: u16) {
        let packed = u32::from(offset_sectors as u16) | (u32::from(size_sectors) << 16);
        self.bitmap_offset_sectors = packed as i32;
    }

    /// The journal tail of a journal device (shares storage with the
    /// recovery offset).
    pub fn journal_tail_sectors(&self) -> u64 {
        self.recovery_offset_sectors
    }

    /// The data offset a reshape moves to: `data_offset + new_offset` when
    /// both RESHAPE_ACTIVE and NEW_OFFSET are set, else `data_offset`, as in
    /// the kernel's `super_1_load`. It is signed because a corrupt
    /// new_offset can point before the start of the device.
    pub fn new_data_offset_sectors(&self) -> i128 {
        let base = i128::from(self.data_offset_sectors);
        if self.has_feature(MD_FEATURE_RESHAPE_ACTIVE | MD_FEATURE_NEW_OFFSET) {
            base + i128::from(self.new_offset_sectors)
        } else {
            base
        }
    }

    /// Bytes the kernel writes for a 1.x superblock with this max_dev:
    /// 256 + 2 * max_dev, rounded up to a 512-byte sector.
    pub fn sb1_size_bytes(&self) -> usize {
        sb1::sb_size_bytes(self.max_dev, 512)
    }
}

/// Formats 16 UUID bytes as xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx. With
/// `words_le` each group is read as a little-endian word first (0.90).
fn format_uuid(bytes: &[u8; 16], words_le: bool) -> String {
    let mut out = String::with_capacity(35);
    for (group, chunk) in bytes.chunks_exact(4).enumerate() {
        if group > 0 {
            out.push(':');
        }
        let word: [u8; 4] = [chunk[0], chunk[1], chunk[2], chunk[3]];
        let value = if words_le {
            u32::from_le_bytes(word)
        } else {
            u32::from_be_bytes(word)
        };
        out.push_str(&format!("{value:08x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_names_round_trip() {
        for m in [
            Metadata::V0_90,
            Metadata::V1_0,
            Metadata::V1_1,
            Metadata::V1_2,
        ] {
            assert_eq!(m.as_str().parse::<Metadata>().unwrap(), m);
            assert_eq!(m.to_string(), m.as_str());
        }
        assert_eq!("default".parse::<Metadata>().unwrap(), Metadata::V1_2);
        assert!("2.0".parse::<Metadata>().is_err());
    }

    #[test]
    fn version_from_super_offset_follows_mdadm() {
        assert_eq!(Metadata::from_super_offset(0), Metadata::V1_1);
        assert_eq!(Metadata::from_super_offset(4), Metadata::V1_1);
        assert_eq!(Metadata::from_super_offset(8), Metadata::V1_2);
        assert_eq!(Metadata::from_super_offset(9), Metadata::V1_0);
        assert_eq!(Metadata::from_super_offset(131_056), Metadata::V1_0);
    }

    #[test]
    fn superblock_locations() {
        // A 64 MiB device: 131072 sectors.
        let dev = 131_072;
        assert_eq!(
            superblock_offset_sectors(Metadata::V1_0, dev),
            Some(131_056)
        );
        assert_eq!(superblock_offset_sectors(Metadata::V1_1, dev), Some(0));
        assert_eq!(superblock_offset_sectors(Metadata::V1_2, dev), Some(8));
        assert_eq!(
            superblock_offset_sectors(Metadata::V0_90, dev),
            Some(130_944)
        );
        // An odd size: 1.0 rounds down to 4 KiB, 0.90 to 64 KiB.
        assert_eq!(
            superblock_offset_sectors(Metadata::V1_0, 100_005),
            Some(99_984)
        );
        assert_eq!(
            superblock_offset_sectors(Metadata::V0_90, 100_005),
            Some(99_840)
        );
        assert_eq!(superblock_offset_sectors(Metadata::V1_2, 23), None);
        assert_eq!(superblock_offset_sectors(Metadata::V0_90, 127), None);
    }

    #[test]
    fn roles_decode_and_encode() {
        assert_eq!(Role::from_raw(0), Role::Active(0));
        assert_eq!(Role::from_raw(0xfeff), Role::Active(0xfeff));
        assert_eq!(Role::from_raw(0xff00), Role::Spare);
        assert_eq!(Role::from_raw(0xfffd), Role::Journal);
        assert_eq!(Role::from_raw(0xfffe), Role::Faulty);
        assert_eq!(Role::from_raw(0xffff), Role::Spare);
        assert_eq!(Role::Active(3).to_raw(), Some(3));
        assert_eq!(Role::Active(0xff00).to_raw(), None);
        assert_eq!(Role::Journal.to_raw(), Some(0xfffd));
    }

    #[test]
    fn uuid_strings_follow_mdadm() {
        let bytes = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
            0x66, 0x77,
        ];
        assert_eq!(
            format_uuid(&bytes, false),
            "01234567:89abcdef:00112233:44556677"
        );
        assert_eq!(
            format_uuid(&bytes, true),
            "67452301:efcdab89:33221100:77665544"
        );
    }

    #[test]
    fn feature_all_is_the_thirteen_known_bits() {
        assert_eq!(MD_FEATURE_ALL, 0x1fff);
    }
}
