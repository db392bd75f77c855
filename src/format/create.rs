//! The values mdadm 4.2 chooses when it creates a version-1 array, as pure
//! functions, so that an array created by uraid is laid out exactly like one
//! created by `mdadm --create` (Create.c, super1.c `validate_geometry1`,
//! `init_super1`, `add_to_super1`, `write_init_super1`,
//! `add_internal_bitmap1`).
//!
//! The usual sequence is: [`plan_create`] assigns dev numbers and roles the
//! way mdadm does; [`default_data_offset_sectors`] is computed for the first
//! member and used for all of them; [`mdadm_freesize_sectors`] and
//! [`default_size_sectors`] give md's "size"; then
//! [`MemberSuper::new_for_create`] fills one superblock per member.

use super::{
    sb1, FormatError, MemberSuper, Metadata, Role, FAIL_FAST_1, LEVEL_FAULTY, LEVEL_MULTIPATH,
    MD_DISK_ROLE_SPARE, MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_JOURNAL, MD_FEATURE_PPL,
    MD_FEATURE_RAID0_LAYOUT, SB1_MIN_DEVICE_SECTORS, SECTOR_MAX, WRITE_MOSTLY_1,
};
use serde::{Deserialize, Serialize};

/// mdadm's default chunk: 512 KiB, in sectors.
pub const DEFAULT_CHUNK_SECTORS: u32 = 1024;
/// Size of the PPL area mdadm reserves (MULTIPLE_PPL_AREA_SIZE_SUPER1), sectors.
pub const PPL_AREA_SECTORS: u64 = 2048;
/// Size of the bad-block log mdadm reserves, in sectors.
pub const BBLOG_SECTORS: u16 = 8;
/// Largest reshape headroom mdadm leaves before the data: 128 MiB.
const HEADROOM_SECTORS_MAX: u64 = 128 * 1024 * 2;
/// mdadm rounds the data offset to a whole MiB.
const ONE_MEG_SECTORS: u64 = 2048;
/// Size of `bitmap_super_t`.
const BITMAP_SUPER_BYTES: u64 = 256;

/// mdadm's `choose_bm_space`: sectors to keep free for a bitmap next to the
/// superblock, whether or not a bitmap is created, so that one can be added
/// later. 4 KiB normally, 64 KiB above 8 GiB, 128 KiB from 200 GiB.
pub fn choose_bm_space(device_sectors: u64) -> u64 {
    if device_sectors < 64 * 2 {
        0
    } else if device_sectors - 64 * 2 >= 200 * 1024 * 1024 * 2 {
        128 * 2
    } else if device_sectors - 4 * 2 > 8 * 1024 * 1024 * 2 {
        64 * 2
    } else {
        4 * 2
    }
}

/// The data offset mdadm 4.2 gives a 1.1 or 1.2 member of `device_sectors`
/// sectors (super1.c `validate_geometry1`). mdadm computes it for the first
/// member and uses that value for the whole array.
///
/// The offset leaves room for the superblock and bad-block log (24
/// sectors), the bitmap space ([`choose_bm_space`], or the 1 MiB PPL area
/// with `ppl`), and reshape headroom: 128 MiB, halved while it is more than
/// about 0.1 % of the device and (for chunked levels) still at least four
/// chunks; the total is rounded up to a whole MiB.
///
/// Note that `chunk_sectors` is 0 for raid1 (mdadm passes no chunk there),
/// which lets the headroom shrink further: a 64 MiB raid1 member gets 2048
/// sectors, while a 64 MiB raid5 member with 512 KiB chunks gets 4096.
/// Whether an internal bitmap is requested does not matter: mdadm reserves
/// the bitmap space in every case.
pub fn default_data_offset_sectors(device_sectors: u64, chunk_sectors: u32, ppl: bool) -> u64 {
    let bm_space = if ppl {
        PPL_AREA_SECTORS
    } else {
        choose_bm_space(device_sectors)
    };
    let chunk = u64::from(chunk_sectors);
    let mut headroom = HEADROOM_SECTORS_MAX;
    while (headroom << 10) > device_sectors && (chunk == 0 || headroom / 2 >= chunk * 2) {
        headroom >>= 1;
    }
    (24 + bm_space + headroom).div_ceil(ONE_MEG_SECTORS) * ONE_MEG_SECTORS
}

/// The room mdadm reports for data on one member ("freesize", before
/// rounding to the chunk), in sectors, or `None` when the metadata does not
/// fit. For 1.0 it keeps the superblock, the bad-block log and the bitmap
/// or PPL space at the end; for 1.1/1.2 everything before `data_offset`.
pub fn mdadm_freesize_sectors(
    metadata: Metadata,
    device_sectors: u64,
    data_offset_sectors: u64,
    ppl: bool,
) -> Option<u64> {
    let bm_space = if ppl {
        PPL_AREA_SECTORS
    } else {
        choose_bm_space(device_sectors)
    };
    match metadata {
        Metadata::V0_90 => super::sb090::superblock_offset_sectors(device_sectors),
        Metadata::V1_0 => (device_sectors & !7).checked_sub(8 * 2 + 8 + bm_space),
        Metadata::V1_1 | Metadata::V1_2 => device_sectors.checked_sub(data_offset_sectors),
    }
}

/// md's "size" (sectors used on each member) as mdadm 4.2 sets it from the
/// smallest member's freesize: rounded down to the chunk, and for raid1 to a
/// multiple of 64 KiB "in case it is ever reshaped to RAID5". Linear and
/// raid0 record 0, because the size is meaningless for them.
pub fn default_size_sectors(level: i32, chunk_sectors: u32, min_freesize_sectors: u64) -> u64 {
    if !(level > 0 || level == LEVEL_MULTIPATH || level == LEVEL_FAULTY) {
        return 0;
    }
    // mdadm works in KiB here; the chunk is assumed to be a power of two.
    let mut kib = min_freesize_sectors / 2;
    let chunk_kib = u64::from(chunk_sectors / 2);
    if chunk_kib != 0 {
        kib &= !(chunk_kib - 1);
    }
    if level == 1 {
        kib &= !63;
    }
    kib * 2
}

/// mdadm's data_size for a 1.0 member: everything before the superblock
/// except the space kept there for the bitmap (or PPL) and the 8-sector
/// bad-block log, `bm_space_sectors + 8`; that space shrinks when the
/// component `size_sectors` would not fit otherwise. Returns the data size
/// and the space actually kept, which decides whether a bad-block log fits.
pub fn v1_0_data_size_sectors(
    super_offset_sectors: u64,
    size_sectors: u64,
    bm_space_sectors: u64,
) -> Result<(u64, u64), FormatError> {
    if size_sectors > super_offset_sectors {
        return Err(FormatError::SizeExceedsSuperblockStart {
            size_sectors,
            sb_offset: super_offset_sectors,
        });
    }
    let mut kept = bm_space_sectors.saturating_add(u64::from(BBLOG_SECTORS));
    if super_offset_sectors < size_sectors.saturating_add(kept) {
        kept = super_offset_sectors - size_sectors;
    }
    Ok((super_offset_sectors - kept, kept))
}

/// mdadm's max_dev for a new array: the role table fills the superblock up
/// to the next 512-byte boundary, so it is 128 for up to 128 devices.
pub fn default_max_dev(raid_disks: u32, spare_disks: u32) -> u32 {
    let bytes = 256 + 2 * (u64::from(raid_disks) + u64::from(spare_disks));
    let rounded = bytes.div_ceil(512) * 512;
    ((rounded - 256) / 2).min(u64::from(u32::MAX)) as u32
}

/// The set name mdadm stores: "homehost:name" when the name has no ':' and
/// the result is shorter than 32 bytes, otherwise the name alone, cut to 31
/// bytes (at a character boundary here, where mdadm cuts bytes).
pub fn compose_set_name(name: &str, homehost: Option<&str>) -> String {
    if let Some(host) = homehost {
        if !name.contains(':') && host.len() + 1 + name.len() < 32 {
            return format!("{host}:{name}");
        }
    }
    let mut cut = name.to_string();
    while cut.len() > 31 {
        cut.pop();
    }
    cut
}

/// Whether mdadm 4.2 sets MD_FEATURE_RAID0_LAYOUT: for raid0 with a layout
/// other than 0 ("dangerous"), when the members' sizes after the data
/// offset, counted in whole chunks, differ (a multi-zone array).
/// `members` holds each member's (device sectors, data offset sectors).
pub fn raid0_needs_layout(layout: u32, chunk_sectors: u32, members: &[(u64, u64)]) -> bool {
    if layout == 0 || chunk_sectors == 0 {
        return false;
    }
    let chunks =
        |&(device, offset): &(u64, u64)| device.saturating_sub(offset) / u64::from(chunk_sectors);
    match members.first() {
        Some(first) => members.iter().any(|m| chunks(m) != chunks(first)),
        None => false,
    }
}

/// The sync size of an internal bitmap, in sectors: the component size,
/// except for raid10 where mdadm uses the array capacity
/// (size * raid_disks / copies).
pub fn bitmap_sync_sectors(level: i32, layout: u32, raid_disks: u32, size_sectors: u64) -> u64 {
    if level != 10 {
        return size_sectors;
    }
    let copies = u64::from((layout >> 8) & 255) * u64::from(layout & 255);
    if copies == 0 {
        return size_sectors;
    }
    (size_sectors / 2) * u64::from(raid_disks) / copies * 2
}

/// Whether mdadm 4.2 adds an internal bitmap without being asked: for
/// redundant levels without a journal when the component size exceeds
/// 100 GiB, unless a consistency policy was given.
pub fn mdadm_adds_bitmap(level: i32, size_sectors: u64, has_journal: bool) -> bool {
    level >= 1 && !has_journal && size_sectors / 2 > 100 * 1024 * 1024
}

/// Where an internal bitmap goes, as mdadm places it at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InternalBitmap {
    /// Signed sectors from the superblock to the bitmap superblock.
    pub offset_sectors: i32,
    /// Sectors the bitmap (superblock and bits, 4 KiB-rounded) occupies.
    pub space_sectors: u64,
    /// Bytes of data per bitmap bit.
    pub chunk_bytes: u64,
    /// Array sectors the bitmap covers (its sync_size).
    pub sync_sectors: u64,
}

/// mdadm's `add_internal_bitmap1` at creation: the bitmap chunk and offset
/// for a member whose md "size" is `size_sectors`, with a bitmap covering
/// `sync_sectors` (see [`bitmap_sync_sectors`]). Without a requested chunk
/// the bitmap is limited to 128 KiB and the chunk is at least 64 MiB.
///
/// For 1.1/1.2 the bitmap starts 4 KiB after the superblock. For 1.0 it is
/// placed before the superblock and its 8-sector bad-block log, rounded to
/// 4 KiB.
pub fn default_internal_bitmap(
    metadata: Metadata,
    size_sectors: u64,
    sync_sectors: u64,
    chunk_bytes: Option<u64>,
) -> Result<InternalBitmap, FormatError> {
    let bbl_size = u64::from(BBLOG_SECTORS);
    let before_superblock = match metadata {
        Metadata::V1_0 => true,
        Metadata::V1_1 | Metadata::V1_2 => false,
        Metadata::V0_90 => return Err(FormatError::WrongMetadata { metadata }),
    };
    // The room mdadm left when it chose the data offset, minus the log.
    let mut room = choose_bm_space(size_sectors);
    if chunk_bytes.is_none() && room > 128 * 2 {
        room = 128 * 2;
    }
    if room <= 1 {
        return Err(FormatError::NoRoomForBitmap);
    }
    let max_bits = (room * 512 - BITMAP_SUPER_BYTES) * 8;
    let mut min_chunk: u64 = 4096;
    let mut bits = sync_sectors.saturating_mul(512) / min_chunk + 1;
    while bits > max_bits {
        min_chunk *= 2;
        bits = bits.div_ceil(2);
    }
    let chunk = match chunk_bytes {
        None => min_chunk.max(64 * 1024 * 1024),
        Some(c) if c < min_chunk || c == 0 => {
            return Err(FormatError::BitmapChunkTooSmall {
                chunk_bytes: c,
                min_bytes: min_chunk,
            })
        }
        Some(c) => c,
    };
    let offset = if before_superblock {
        let bits = sync_sectors.saturating_mul(512) / chunk + 1;
        let sectors = (bits.div_ceil(8) + BITMAP_SUPER_BYTES).div_ceil(4096) * 8;
        -(sectors as i64) - bbl_size as i64
    } else {
        8
    };
    // write_init_super1's calc_bitmap_size: the bits rounded up to bytes,
    // plus the bitmap superblock, rounded up to 4 KiB.
    let bits = sync_sectors.saturating_mul(512).div_ceil(chunk);
    let space_sectors = (bits.div_ceil(8) + BITMAP_SUPER_BYTES).div_ceil(4096) * 4096 / 512;
    Ok(InternalBitmap {
        offset_sectors: i32::try_from(offset).map_err(|_| FormatError::ValueOutOfRange {
            field: "bitmap_offset_sectors",
            value: offset.unsigned_abs(),
        })?,
        space_sectors,
        chunk_bytes: chunk,
        sync_sectors,
    })
}

/// The bad-block log mdadm 4.2 reserves, as `(offset from the superblock,
/// size)` in sectors, or `None` when there is no room.
///
/// For 1.1/1.2 the 8-sector log follows the bitmap space (`bm_offset +
/// bm_space`) when that fits before the data, else it sits just before the
/// data. For 1.0 it sits just before the superblock when the space kept
/// before the superblock (`bm_space`, which for 1.0 already includes the 8
/// log sectors) allows.
pub fn default_bad_block_log(
    metadata: Metadata,
    super_offset_sectors: u64,
    data_offset_sectors: u64,
    bm_offset_sectors: i64,
    bm_space_sectors: u64,
) -> Option<(i32, u16)> {
    match metadata {
        Metadata::V1_0 => (bm_space_sectors >= 8).then_some((-8, BBLOG_SECTORS)),
        Metadata::V1_1 | Metadata::V1_2 => {
            let data = i128::from(data_offset_sectors);
            let sb = i128::from(super_offset_sectors);
            let after_bitmap = i128::from(bm_offset_sectors) + i128::from(bm_space_sectors);
            let offset = if data >= sb + after_bitmap + 8 {
                after_bitmap
            } else if data >= sb + 16 {
                data - 8 - sb
            } else {
                return None;
            };
            i32::try_from(offset).ok().map(|o| (o, BBLOG_SECTORS))
        }
        Metadata::V0_90 => None,
    }
}

/// How a listed device takes part in `mdadm --create`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CreateDevice {
    /// A real device.
    Disk,
    /// The word "missing": the slot is left empty.
    Missing,
    /// A write-journal device (`--write-journal`).
    Journal,
}

/// The dev numbers and roles mdadm assigns at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePlan {
    /// For each listed device, its dev_number; `None` for "missing".
    pub dev_numbers: Vec<Option<u32>>,
    /// The role of every dev_number slot (the dev_roles content).
    pub roles: Vec<Role>,
    /// Whether the array starts clean (resync_offset MaxSector).
    pub clean: bool,
    /// Spare count used for max_dev (spares, journals, and a raid4/5/6
    /// device turned into a spare to be rebuilt).
    pub spare_disks: u32,
}

/// Assigns dev numbers and roles as mdadm 4.2's Create does, for devices
/// listed in `devices` order (raid slots first, then spares; journals
/// anywhere).
///
/// Unless `assume_clean` or `force` is given, mdadm creates raid4/5 with its
/// last slot empty and the device meant for it added as a spare, so that
/// the kernel rebuilds it (faster than computing parity over a resync); the
/// array then starts "clean" and that device gets the next free dev number,
/// which is why a fresh 3-disk raid5 shows numbers 0, 1 and 3. raid6 does
/// the same when exactly one slot is missing. Arrays with a missing raid4/5
/// slot, two missing raid6 slots, levels <= 0, or `assume_clean` start
/// clean; all others start dirty and resync.
pub fn plan_create(
    level: i32,
    raid_disks: u32,
    devices: &[CreateDevice],
    assume_clean: bool,
    force: bool,
) -> Result<CreatePlan, FormatError> {
    let raid = raid_disks as usize;
    let subdevs = devices.len();
    let slots = devices
        .iter()
        .filter(|d| **d != CreateDevice::Journal)
        .count();
    if raid_disks == 0 || slots < raid {
        return Err(FormatError::NotEnoughDevices {
            listed: slots,
            raid_disks,
        });
    }
    let missing: Vec<usize> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == CreateDevice::Missing)
        .map(|(i, _)| i)
        .collect();
    let never = subdevs * 2;
    let first_missing = missing.first().copied().unwrap_or(never);
    let second_missing = missing.get(1).copied().unwrap_or(never);
    if level <= 0 && first_missing < never {
        return Err(FormatError::MissingNotSupported { level });
    }

    let working = devices
        .iter()
        .filter(|d| **d != CreateDevice::Missing)
        .count();
    let mut active = devices
        .iter()
        .take(raid)
        .filter(|d| **d == CreateDevice::Disk)
        .count();
    let mut insert_point = never;
    if !assume_clean && !force && first_missing >= raid && (level == 4 || level == 5) {
        insert_point = raid - 1;
        active = active.saturating_sub(1);
    }
    if !assume_clean && !force && first_missing < raid && second_missing >= raid && level == 6 {
        insert_point = raid - 1;
        if insert_point == first_missing {
            insert_point = insert_point.saturating_sub(1);
        }
        active = active.saturating_sub(1);
    }
    let clean = ((level == 4 || level == 5) && (insert_point < raid || first_missing < raid))
        || (level == 6 && (insert_point < raid || second_missing < raid))
        || level <= 0
        || assume_clean;

    // The loop of Create's first pass: slot numbers advance over missing
    // devices and over the insert point, whose device is visited again
    // after the end of the list and becomes a spare.
    let mut dev_numbers = vec![None; subdevs];
    let mut roles: Vec<Role> = Vec::new();
    let mut raid_disk_num = 0usize;
    let mut moved: Option<usize> = None;
    let mut index = Some(0usize);
    let mut dnum = 0usize;
    while let Some(i) = index.filter(|&i| i < subdevs) {
        // The moved device is revisited once, after the end of the list;
        // mdadm stops there, and so does this loop whatever the device is.
        let revisit = moved == Some(i) && dnum != insert_point;
        if dnum == insert_point {
            raid_disk_num += 1;
            moved = Some(i);
        } else if devices[i] == CreateDevice::Missing {
            raid_disk_num += 1;
        } else {
            let role = if devices[i] == CreateDevice::Journal {
                Role::Journal
            } else if raid_disk_num < raid {
                Role::Active(raid_disk_num as u32)
            } else {
                Role::Spare
            };
            if devices[i] != CreateDevice::Journal {
                raid_disk_num += 1;
            }
            dev_numbers[i] = Some(dnum as u32);
            if roles.len() <= dnum {
                roles.resize(dnum + 1, Role::Spare);
            }
            roles[dnum] = role;
        }
        if revisit {
            break;
        }
        index = if i + 1 < subdevs { Some(i + 1) } else { moved };
        dnum += 1;
    }
    Ok(CreatePlan {
        dev_numbers,
        roles,
        clean,
        spare_disks: (working - active) as u32,
    })
}

/// What mdadm keeps next to the superblock for write consistency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsistencyPolicy {
    /// No bitmap and no PPL (mdadm's "resync" and "none").
    Resync,
    /// An internal write-intent bitmap, placed by [`default_internal_bitmap`].
    Bitmap(InternalBitmap),
    /// A 1 MiB partial parity log area (raid5 only).
    Ppl,
}

/// The array-wide parameters of a create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSpec {
    /// 1.0, 1.1 or 1.2.
    pub metadata: Metadata,
    /// md level number.
    pub level: i32,
    /// Level-specific layout (mdadm: raid0 1, raid5/6 2, raid10 0x102).
    pub layout: u32,
    /// Chunk in sectors; 0 for raid1 and linear without rounding.
    pub chunk_sectors: u32,
    /// Raid slots.
    pub raid_disks: u32,
    /// md's "size" (see [`default_size_sectors`]).
    pub size_sectors: u64,
    /// The array name; mdadm defaults it to the md minor number.
    pub name: String,
    /// The host name to prefix ("homehost:name"); `None` for none.
    pub homehost: Option<String>,
    /// Array UUID (random in mdadm).
    pub set_uuid: [u8; 16],
    /// Creation time; also the first update time.
    pub ctime_secs: u64,
    /// Start clean (resync_offset MaxSector) instead of resyncing.
    pub clean: bool,
    /// Bitmap, PPL or neither.
    pub policy: ConsistencyPolicy,
    /// Reserve a bad-block log (mdadm does unless configured "bbl=no").
    pub bad_block_log: bool,
    /// Role of every dev_number slot, e.g. [`CreatePlan::roles`].
    pub roles: Vec<Role>,
    /// Spares (and journals) counted into max_dev.
    pub spare_disks: u32,
    /// Set MD_FEATURE_RAID0_LAYOUT (see [`raid0_needs_layout`]); used only
    /// for raid0 with a non-zero layout.
    pub raid0_layout_feature: bool,
}

/// The per-member parameters of a create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateMember {
    /// This member's slot in dev_roles, e.g. from [`CreatePlan::dev_numbers`].
    pub dev_number: u32,
    /// Size of the member device.
    pub device_sectors: u64,
    /// `None` chooses mdadm's default for this device; pass the first
    /// member's value to all others, as mdadm does.
    pub data_offset_sectors: Option<u64>,
    /// Random per device.
    pub device_uuid: [u8; 16],
    /// mdadm --write-mostly for this device.
    pub write_mostly: bool,
    /// mdadm --failfast for this device.
    pub failfast: bool,
}

impl MemberSuper {
    /// The superblock mdadm 4.2 writes on one member of a new 1.x array.
    ///
    /// Beyond the parameters, it follows mdadm: events 0 (1 on a journal
    /// device), utime equal to ctime with no microseconds, dev_roles
    /// pre-filled with spares, max_dev from [`default_max_dev`] (grown to
    /// cover every dev number), feature bits for the bitmap, PPL, journal
    /// and raid0 layout, the bad-block log from [`default_bad_block_log`],
    /// and for 1.0 a data_size that stops before the bitmap/log space.
    pub fn new_for_create(
        spec: &CreateSpec,
        member: &CreateMember,
    ) -> Result<MemberSuper, FormatError> {
        let metadata = spec.metadata;
        if metadata.sb1_minor().is_none() {
            return Err(FormatError::WrongMetadata { metadata });
        }
        let device_sectors = member.device_sectors;
        let super_offset = super::superblock_offset_sectors(metadata, device_sectors).ok_or(
            FormatError::DeviceTooSmall {
                device_sectors,
                metadata,
                minimum: SB1_MIN_DEVICE_SECTORS,
            },
        )?;

        let mut max_dev = u64::from(default_max_dev(spec.raid_disks, spec.spare_disks));
        max_dev = max_dev.max(spec.roles.len() as u64);
        max_dev = max_dev.max(u64::from(member.dev_number) + 1);
        if max_dev > u64::from(sb1::DEV_ROLES_MAX) {
            return Err(FormatError::TooManyDevices {
                found: max_dev.min(u64::from(u32::MAX)) as u32,
                limit: sb1::DEV_ROLES_MAX,
            });
        }
        let mut dev_roles = vec![MD_DISK_ROLE_SPARE; max_dev as usize];
        for (slot, role) in spec.roles.iter().enumerate() {
            dev_roles[slot] = role.to_raw().ok_or(FormatError::RoleNotRepresentable {
                role: *role,
                metadata,
            })?;
        }

        let mut feature_map = 0;
        if spec.roles.contains(&Role::Journal) {
            feature_map |= MD_FEATURE_JOURNAL;
        }
        if spec.raid0_layout_feature && spec.level == 0 && spec.layout != 0 {
            feature_map |= MD_FEATURE_RAID0_LAYOUT;
        }
        let mut bitmap_offset = 0i32;
        let (bm_offset, bm_space): (i64, u64) = match spec.policy {
            ConsistencyPolicy::Resync => (8, choose_bm_space(spec.size_sectors)),
            ConsistencyPolicy::Bitmap(bm) => {
                feature_map |= MD_FEATURE_BITMAP_OFFSET;
                bitmap_offset = bm.offset_sectors;
                (i64::from(bm.offset_sectors), bm.space_sectors)
            }
            ConsistencyPolicy::Ppl => {
                feature_map |= MD_FEATURE_PPL;
                let offset = if metadata == Metadata::V1_0 {
                    -(PPL_AREA_SECTORS as i64) - 8
                } else {
                    8
                };
                let packed = u32::from(offset as i16 as u16) | ((PPL_AREA_SECTORS as u32) << 16);
                bitmap_offset = packed as i32;
                (offset, PPL_AREA_SECTORS)
            }
        };

        let data_offset = match (member.data_offset_sectors, metadata) {
            (Some(offset), _) => offset,
            (None, Metadata::V1_0) => 0,
            (None, _) => default_data_offset_sectors(
                device_sectors,
                spec.chunk_sectors,
                spec.policy == ConsistencyPolicy::Ppl,
            ),
        };
        let (data_size, bm_space) = if metadata == Metadata::V1_0 {
            v1_0_data_size_sectors(super_offset, spec.size_sectors, bm_space)?
        } else {
            let data_size = device_sectors.checked_sub(data_offset).ok_or(
                FormatError::DataOffsetBeyondDevice {
                    data_offset,
                    device_sectors,
                },
            )?;
            (data_size, bm_space)
        };
        let bblog = if spec.bad_block_log {
            default_bad_block_log(metadata, super_offset, data_offset, bm_offset, bm_space)
        } else {
            None
        };
        let (bblog_offset, bblog_size) = bblog.unwrap_or((0, 0));

        let this_role = usize::try_from(member.dev_number)
            .ok()
            .and_then(|i| spec.roles.get(i))
            .copied()
            .unwrap_or(Role::Spare);
        let mut devflags = 0;
        if member.write_mostly {
            devflags |= WRITE_MOSTLY_1;
        }
        if member.failfast {
            devflags |= FAIL_FAST_1;
        }

        let sb = MemberSuper {
            metadata,
            feature_map,
            set_uuid: spec.set_uuid,
            set_name: compose_set_name(&spec.name, spec.homehost.as_deref()),
            ctime_secs: spec.ctime_secs,
            ctime_micros: 0,
            level: spec.level,
            layout: spec.layout,
            size_sectors: spec.size_sectors,
            chunk_sectors: spec.chunk_sectors,
            raid_disks: spec.raid_disks,
            bitmap_offset_sectors: bitmap_offset,
            new_level: 0,
            reshape_position_sectors: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk_sectors: 0,
            new_offset_sectors: 0,
            data_offset_sectors: data_offset,
            data_size_sectors: data_size,
            super_offset_sectors: super_offset,
            recovery_offset_sectors: 0,
            dev_number: member.dev_number,
            cnt_corrected_read: 0,
            device_uuid: member.device_uuid,
            devflags,
            bblog_shift: 0,
            bblog_size_sectors: bblog_size,
            bblog_offset_sectors: bblog_offset,
            utime_secs: spec.ctime_secs,
            utime_micros: 0,
            // init_super1 writes 1; write_init_super1 resets it to 0 on
            // every device except a journal.
            events: u64::from(this_role == Role::Journal),
            resync_offset_sectors: if spec.clean { SECTOR_MAX } else { 0 },
            max_dev: max_dev as u32,
            dev_roles,
            v090: None,
        };
        // Refuse to hand out a superblock the kernel would reject.
        sb1::encode(&sb)?;
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 2048;
    const GIB: u64 = 1024 * MIB;

    #[test]
    fn data_offset_table_of_the_reference() {
        let chunk = DEFAULT_CHUNK_SECTORS;
        // 64 MiB: 4096 with a 512 KiB chunk (what mdadm 4.2 chose for the
        // raid5 members), 2048 for raid1, which has no chunk.
        assert_eq!(default_data_offset_sectors(64 * MIB, chunk, false), 4096);
        assert_eq!(default_data_offset_sectors(64 * MIB, 0, false), 2048);
        assert_eq!(default_data_offset_sectors(100 * MIB, chunk, false), 4096);
        assert_eq!(default_data_offset_sectors(100 * MIB, 0, false), 2048);
        assert_eq!(default_data_offset_sectors(GIB, chunk, false), 4096);
        assert_eq!(default_data_offset_sectors(GIB, 0, false), 4096);
        assert_eq!(default_data_offset_sectors(10 * GIB, chunk, false), 18_432);
        assert_eq!(
            default_data_offset_sectors(100 * GIB, chunk, false),
            133_120
        );
        for size in [128 * GIB, 200 * GIB, 4096 * GIB] {
            assert_eq!(default_data_offset_sectors(size, chunk, false), 264_192);
        }
        // PPL reserves 1 MiB instead of the bitmap space.
        assert_eq!(default_data_offset_sectors(GIB, chunk, true), 6144);
        assert_eq!(default_data_offset_sectors(128 * GIB, chunk, true), 266_240);
    }

    #[test]
    fn bitmap_space_steps() {
        assert_eq!(choose_bm_space(127), 0);
        assert_eq!(choose_bm_space(128), 8);
        assert_eq!(choose_bm_space(8 * GIB + 8), 8);
        assert_eq!(choose_bm_space(8 * GIB + 9), 128);
        assert_eq!(choose_bm_space(200 * GIB + 127), 128);
        assert_eq!(choose_bm_space(200 * GIB + 128), 256);
    }

    #[test]
    fn sizes_and_max_dev() {
        assert_eq!(default_max_dev(3, 0), 128);
        assert_eq!(default_max_dev(3, 1), 128);
        assert_eq!(default_max_dev(128, 0), 128);
        assert_eq!(default_max_dev(129, 0), 384);
        // raid5 on 64 MiB: 126976 sectors (exactly 124 chunks).
        let free = mdadm_freesize_sectors(Metadata::V1_2, 64 * MIB, 4096, false).unwrap();
        assert_eq!(default_size_sectors(5, 1024, free), 126_976);
        // Rounded down to the chunk.
        assert_eq!(default_size_sectors(5, 1024, 126_976 + 1023), 126_976);
        // raid1 rounds to 64 KiB; raid0 and linear record no size.
        assert_eq!(default_size_sectors(1, 0, 129_000), 128_896);
        assert_eq!(default_size_sectors(0, 1024, 129_000), 0);
        assert_eq!(default_size_sectors(-1, 0, 129_000), 0);
        // 1.0 keeps 16 + 8 + bitmap-space sectors at the 4 KiB-rounded end.
        assert_eq!(
            mdadm_freesize_sectors(Metadata::V1_0, 64 * MIB + 5, 0, false),
            Some(64 * MIB - 32)
        );
    }

    #[test]
    fn v1_0_data_size_rule() {
        // 64 MiB device: superblock at 131056, 8 + 8 sectors kept before it.
        assert_eq!(
            v1_0_data_size_sectors(131_056, 126_976, 8),
            Ok((131_040, 16))
        );
        // The kept space shrinks to let a large size fit.
        assert_eq!(
            v1_0_data_size_sectors(131_056, 131_050, 8),
            Ok((131_050, 6))
        );
        assert!(v1_0_data_size_sectors(131_056, 131_057, 8).is_err());
    }

    #[test]
    fn set_names() {
        assert_eq!(compose_set_name("data", Some("myhost")), "myhost:data");
        assert_eq!(compose_set_name("other:data", Some("myhost")), "other:data");
        assert_eq!(compose_set_name("data", None), "data");
        let long_host = "h".repeat(27);
        assert_eq!(compose_set_name("data", Some(&long_host)), "data");
        assert_eq!(compose_set_name("dat", Some(&long_host)).len(), 31);
        assert_eq!(compose_set_name(&"n".repeat(40), None).len(), 31);
    }

    #[test]
    fn raid5_plan_moves_the_last_device_to_a_spare() {
        use CreateDevice::*;
        let plan = plan_create(5, 3, &[Disk, Disk, Disk], false, false).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), Some(1), Some(3)]);
        assert_eq!(
            plan.roles,
            vec![Role::Active(0), Role::Active(1), Role::Spare, Role::Spare]
        );
        assert!(plan.clean);
        assert_eq!(plan.spare_disks, 1);
        // With a spare listed, the moved device comes after it.
        let plan = plan_create(5, 3, &[Disk, Disk, Disk, Disk], false, false).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), Some(1), Some(4), Some(3)]);
        // --assume-clean keeps every device in its slot.
        let plan = plan_create(5, 3, &[Disk, Disk, Disk], true, false).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), Some(1), Some(2)]);
        assert!(plan.clean);
        // --force makes a full resync instead.
        let plan = plan_create(5, 3, &[Disk, Disk, Disk], false, true).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), Some(1), Some(2)]);
        assert!(!plan.clean);
    }

    #[test]
    fn other_plans() {
        use CreateDevice::*;
        // raid1 resyncs; raid0 starts clean.
        let plan = plan_create(1, 2, &[Disk, Disk], false, false).unwrap();
        assert_eq!(plan.roles, vec![Role::Active(0), Role::Active(1)]);
        assert!(!plan.clean);
        assert!(
            plan_create(0, 2, &[Disk, Disk], false, false)
                .unwrap()
                .clean
        );
        // A missing raid5 slot: clean, slot numbers skip it.
        let plan = plan_create(5, 3, &[Disk, Missing, Disk], false, false).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), None, Some(2)]);
        assert_eq!(
            plan.roles,
            vec![Role::Active(0), Role::Spare, Role::Active(2)]
        );
        assert!(plan.clean);
        // raid6 with one missing slot also turns a device into a spare.
        let plan = plan_create(6, 4, &[Disk, Disk, Disk, Missing], false, false).unwrap();
        assert_eq!(plan.dev_numbers, vec![Some(0), Some(1), Some(4), None]);
        assert!(plan.clean);
        // A journal takes no slot.
        let plan = plan_create(5, 3, &[Disk, Disk, Disk, Journal], true, false).unwrap();
        assert_eq!(plan.roles[3], Role::Journal);
        assert_eq!(plan.spare_disks, 1);
        assert!(matches!(
            plan_create(0, 2, &[Disk, Missing], false, false),
            Err(FormatError::MissingNotSupported { level: 0 })
        ));
        assert!(matches!(
            plan_create(5, 3, &[Disk, Disk], false, false),
            Err(FormatError::NotEnoughDevices { .. })
        ));
    }

    fn raid5_spec(metadata: Metadata) -> CreateSpec {
        let plan = plan_create(5, 3, &[CreateDevice::Disk; 3], false, false).unwrap();
        CreateSpec {
            metadata,
            level: 5,
            layout: 2,
            chunk_sectors: DEFAULT_CHUNK_SECTORS,
            raid_disks: 3,
            size_sectors: 126_976,
            name: "test".into(),
            homehost: Some("uraidhost".into()),
            set_uuid: [7; 16],
            ctime_secs: 1_700_000_000,
            clean: plan.clean,
            policy: ConsistencyPolicy::Resync,
            bad_block_log: true,
            roles: plan.roles,
            spare_disks: plan.spare_disks,
            raid0_layout_feature: false,
        }
    }

    fn member(dev_number: u32) -> CreateMember {
        CreateMember {
            dev_number,
            device_sectors: 64 * MIB,
            data_offset_sectors: None,
            device_uuid: [dev_number as u8; 16],
            write_mostly: false,
            failfast: false,
        }
    }

    #[test]
    fn raid5_on_64_mib_matches_mdadm() {
        let sb = MemberSuper::new_for_create(&raid5_spec(Metadata::V1_2), &member(3)).unwrap();
        assert_eq!(sb.data_offset_sectors, 4096);
        assert_eq!(sb.data_size_sectors, 126_976);
        assert_eq!(sb.super_offset_sectors, 8);
        assert_eq!(sb.bblog_offset_sectors, 16);
        assert_eq!(sb.bblog_size_sectors, 8);
        assert_eq!(sb.max_dev, 128);
        assert_eq!(sb.events, 0);
        assert!(sb.is_clean());
        assert_eq!(sb.set_name, "uraidhost:test");
        assert_eq!(sb.this_role(), Role::Spare);
        assert_eq!(sb.role_of(1), Role::Active(1));
        assert_eq!(sb.feature_map, 0);
        assert_eq!(sb.utime_secs, sb.ctime_secs);
        let bytes = sb1::encode(&sb).unwrap();
        assert_eq!(sb1::decode(&bytes, Metadata::V1_2, 64 * MIB).unwrap(), sb);
    }

    #[test]
    fn v1_0_and_v1_1_layouts() {
        let sb = MemberSuper::new_for_create(&raid5_spec(Metadata::V1_0), &member(0)).unwrap();
        assert_eq!(sb.super_offset_sectors, 64 * MIB - 16);
        assert_eq!(sb.data_offset_sectors, 0);
        // 8 sectors of bitmap space and 8 of bad-block log before the
        // superblock.
        assert_eq!(sb.data_size_sectors, 64 * MIB - 32);
        assert_eq!((sb.bblog_offset_sectors, sb.bblog_size_sectors), (-8, 8));
        sb1::decode(&sb1::encode(&sb).unwrap(), Metadata::V1_0, 64 * MIB).unwrap();
        let sb = MemberSuper::new_for_create(&raid5_spec(Metadata::V1_1), &member(0)).unwrap();
        assert_eq!(sb.super_offset_sectors, 0);
        assert_eq!(sb.data_offset_sectors, 4096);
        assert_eq!(sb.bblog_offset_sectors, 16);
        sb1::decode(&sb1::encode(&sb).unwrap(), Metadata::V1_1, 64 * MIB).unwrap();
    }

    #[test]
    fn bitmap_ppl_and_journal_features() {
        let mut spec = raid5_spec(Metadata::V1_2);
        let bm =
            default_internal_bitmap(Metadata::V1_2, spec.size_sectors, spec.size_sectors, None)
                .unwrap();
        assert_eq!(bm.offset_sectors, 8);
        assert_eq!(bm.chunk_bytes, 64 * 1024 * 1024);
        assert_eq!(bm.space_sectors, 8);
        spec.policy = ConsistencyPolicy::Bitmap(bm);
        let sb = MemberSuper::new_for_create(&spec, &member(0)).unwrap();
        assert_eq!(sb.feature_map, MD_FEATURE_BITMAP_OFFSET);
        assert_eq!(sb.bitmap_offset_sectors, 8);
        assert_eq!(sb.bblog_offset_sectors, 16);

        spec.policy = ConsistencyPolicy::Ppl;
        let sb = MemberSuper::new_for_create(&spec, &member(0)).unwrap();
        assert_eq!(sb.feature_map, MD_FEATURE_PPL);
        assert_eq!((sb.ppl_offset_sectors(), sb.ppl_size_sectors()), (8, 2048));
        assert_eq!(sb.data_offset_sectors, 6144);
        assert_eq!(sb.bblog_offset_sectors, 8 + 2048);

        let mut spec = raid5_spec(Metadata::V1_0);
        spec.policy = ConsistencyPolicy::Ppl;
        let sb = MemberSuper::new_for_create(&spec, &member(0)).unwrap();
        assert_eq!(sb.ppl_offset_sectors(), -2056);
        assert_eq!(sb.data_size_sectors, sb.super_offset_sectors - 2056);

        let mut spec = raid5_spec(Metadata::V1_2);
        spec.roles.push(Role::Journal);
        let sb = MemberSuper::new_for_create(&spec, &member(4)).unwrap();
        assert_eq!(sb.feature_map, MD_FEATURE_JOURNAL);
        assert_eq!(sb.events, 1);
    }

    #[test]
    fn internal_bitmap_sizes() {
        // 1 TiB per device, 1.2: 128 KiB of room, 64 MiB chunks.
        let size = 1024 * GIB;
        let bm = default_internal_bitmap(Metadata::V1_2, size, size, None).unwrap();
        assert_eq!(bm.chunk_bytes, 64 * 1024 * 1024);
        assert_eq!(bm.offset_sectors, 8);
        // 16384 bits = 2 KiB + 256 bytes, rounded to 4 KiB.
        assert_eq!(bm.space_sectors, 8);
        // 1.0 puts it before the superblock and its log.
        let bm = default_internal_bitmap(Metadata::V1_0, size, size, None).unwrap();
        assert_eq!(bm.offset_sectors, -16);
        // A chunk below the minimum for the room is refused.
        assert!(matches!(
            default_internal_bitmap(Metadata::V1_2, size, size, Some(4096)),
            Err(FormatError::BitmapChunkTooSmall { .. })
        ));
        // A tiny device leaves no room.
        assert_eq!(
            default_internal_bitmap(Metadata::V1_2, 100, 100, None),
            Err(FormatError::NoRoomForBitmap)
        );
        assert_eq!(bitmap_sync_sectors(10, 0x102, 4, 1000), 2000);
        assert!(mdadm_adds_bitmap(1, 201 * GIB, false));
        assert!(!mdadm_adds_bitmap(1, 100 * GIB, false));
        assert!(!mdadm_adds_bitmap(0, 201 * GIB, false));
    }

    #[test]
    fn bad_block_log_placement() {
        // Falls back to just before the data when the bitmap space is full.
        assert_eq!(
            default_bad_block_log(Metadata::V1_2, 8, 24, 8, 8),
            Some((8, 8))
        );
        assert_eq!(default_bad_block_log(Metadata::V1_2, 8, 23, 8, 8), None);
        assert_eq!(
            default_bad_block_log(Metadata::V1_2, 8, 40, 8, 8),
            Some((16, 8))
        );
        assert_eq!(
            default_bad_block_log(Metadata::V1_0, 1000, 0, 8, 16),
            Some((-8, 8))
        );
        assert_eq!(default_bad_block_log(Metadata::V1_0, 1000, 0, 8, 7), None);
        // raid0 records size 0, so no bitmap space: the log follows at +8.
        let plan = plan_create(0, 2, &[CreateDevice::Disk; 2], false, false).unwrap();
        let spec = CreateSpec {
            level: 0,
            layout: 1,
            size_sectors: 0,
            clean: plan.clean,
            roles: plan.roles,
            spare_disks: plan.spare_disks,
            raid0_layout_feature: true,
            ..raid5_spec(Metadata::V1_2)
        };
        let sb = MemberSuper::new_for_create(&spec, &member(0)).unwrap();
        assert_eq!(sb.bblog_offset_sectors, 8);
        assert_eq!(sb.feature_map, MD_FEATURE_RAID0_LAYOUT);
        assert!(raid0_needs_layout(
            1,
            1024,
            &[(64 * MIB, 4096), (65 * MIB, 4096)]
        ));
        assert!(!raid0_needs_layout(
            1,
            1024,
            &[(64 * MIB, 4096), (64 * MIB + 5, 4096)]
        ));
        assert!(!raid0_needs_layout(
            0,
            1024,
            &[(64 * MIB, 4096), (65 * MIB, 4096)]
        ));
    }

    #[test]
    fn create_refusals() {
        let mut spec = raid5_spec(Metadata::V0_90);
        assert!(matches!(
            MemberSuper::new_for_create(&spec, &member(0)),
            Err(FormatError::WrongMetadata { .. })
        ));
        spec.metadata = Metadata::V1_0;
        spec.size_sectors = 64 * MIB;
        assert!(matches!(
            MemberSuper::new_for_create(&spec, &member(0)),
            Err(FormatError::SizeExceedsSuperblockStart { .. })
        ));
        let spec = raid5_spec(Metadata::V1_2);
        let mut m = member(0);
        m.device_sectors = 16;
        assert!(matches!(
            MemberSuper::new_for_create(&spec, &m),
            Err(FormatError::DeviceTooSmall { .. })
        ));
        let mut m = member(0);
        m.data_offset_sectors = Some(64 * MIB - 5);
        assert!(matches!(
            MemberSuper::new_for_create(&spec, &m),
            Err(FormatError::DataSizeTooSmall { found: 5 })
        ));
    }
}
