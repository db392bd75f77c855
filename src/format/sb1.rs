//! The version-1 md superblock (`struct mdp_superblock_1`, metadata 1.0,
//! 1.1 and 1.2).
//!
//! The superblock is a 256-byte header followed by `max_dev` little-endian
//! 16-bit role entries. The kernel reads 4 KiB at the superblock location and
//! writes `256 + 2 * max_dev` bytes rounded up to the logical block size.
//! [`decode`] applies every check of the kernel's `super_1_load` and
//! `super_1_validate`; [`encode`] refuses to produce a superblock that
//! [`decode`] would reject, so that uraid never writes metadata the kernel
//! would refuse.

use super::{
    FormatError, MemberSuper, Metadata, Role, MD_FEATURE_ALL, MD_FEATURE_BAD_BLOCKS,
    MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_JOURNAL, MD_FEATURE_MULTIPLE_PPLS, MD_FEATURE_PPL,
    MD_FEATURE_RAID0_LAYOUT, MD_SB_MAGIC, SB1_MIN_DEVICE_SECTORS,
};

/// Size of the fixed header before `dev_roles`.
pub const HEADER_BYTES: usize = 256;
/// How much the kernel reads at the superblock location.
pub const READ_BYTES: usize = 4096;
/// Largest max_dev the kernel accepts: (4096 - 256) / 2.
pub const DEV_ROLES_MAX: u32 = ((READ_BYTES - HEADER_BYTES) / 2) as u32;
/// Largest bad-block log the kernel loads, in sectors (one 4 KiB page).
pub const BBLOG_MAX_SECTORS: u16 = 8;
/// Smallest data_size the kernel accepts, in sectors.
pub const DATA_SIZE_SECTORS_MIN: u64 = 10;

/// Byte offsets of the header fields, from md_p.h.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const MAJOR_VERSION: usize = 4;
    pub const FEATURE_MAP: usize = 8;
    pub const PAD0: usize = 12;
    pub const SET_UUID: usize = 16;
    pub const SET_NAME: usize = 32;
    pub const CTIME: usize = 64;
    pub const LEVEL: usize = 72;
    pub const LAYOUT: usize = 76;
    pub const SIZE: usize = 80;
    pub const CHUNKSIZE: usize = 88;
    pub const RAID_DISKS: usize = 92;
    pub const BITMAP_OFFSET: usize = 96;
    pub const NEW_LEVEL: usize = 100;
    pub const RESHAPE_POSITION: usize = 104;
    pub const DELTA_DISKS: usize = 112;
    pub const NEW_LAYOUT: usize = 116;
    pub const NEW_CHUNK: usize = 120;
    pub const NEW_OFFSET: usize = 124;
    pub const DATA_OFFSET: usize = 128;
    pub const DATA_SIZE: usize = 136;
    pub const SUPER_OFFSET: usize = 144;
    pub const RECOVERY_OFFSET: usize = 152;
    pub const DEV_NUMBER: usize = 160;
    pub const CNT_CORRECTED_READ: usize = 164;
    pub const DEVICE_UUID: usize = 168;
    pub const DEVFLAGS: usize = 184;
    pub const BBLOG_SHIFT: usize = 185;
    pub const BBLOG_SIZE: usize = 186;
    pub const BBLOG_OFFSET: usize = 188;
    pub const UTIME: usize = 192;
    pub const EVENTS: usize = 200;
    pub const RESYNC_OFFSET: usize = 208;
    pub const SB_CSUM: usize = 216;
    pub const DEVICES_MAX: usize = 220;
    pub const PAD3: usize = 224;
    pub const DEV_ROLES: usize = 256;
}

/// (offset, size) of every header field in order. The compile-time check
/// below proves that the offsets are contiguous and end at 256, so a typo in
/// [`off`] cannot go unnoticed.
const FIELDS: [(usize, usize); 37] = [
    (off::MAGIC, 4),
    (off::MAJOR_VERSION, 4),
    (off::FEATURE_MAP, 4),
    (off::PAD0, 4),
    (off::SET_UUID, 16),
    (off::SET_NAME, 32),
    (off::CTIME, 8),
    (off::LEVEL, 4),
    (off::LAYOUT, 4),
    (off::SIZE, 8),
    (off::CHUNKSIZE, 4),
    (off::RAID_DISKS, 4),
    (off::BITMAP_OFFSET, 4),
    (off::NEW_LEVEL, 4),
    (off::RESHAPE_POSITION, 8),
    (off::DELTA_DISKS, 4),
    (off::NEW_LAYOUT, 4),
    (off::NEW_CHUNK, 4),
    (off::NEW_OFFSET, 4),
    (off::DATA_OFFSET, 8),
    (off::DATA_SIZE, 8),
    (off::SUPER_OFFSET, 8),
    (off::RECOVERY_OFFSET, 8),
    (off::DEV_NUMBER, 4),
    (off::CNT_CORRECTED_READ, 4),
    (off::DEVICE_UUID, 16),
    (off::DEVFLAGS, 1),
    (off::BBLOG_SHIFT, 1),
    (off::BBLOG_SIZE, 2),
    (off::BBLOG_OFFSET, 4),
    (off::UTIME, 8),
    (off::EVENTS, 8),
    (off::RESYNC_OFFSET, 8),
    (off::SB_CSUM, 4),
    (off::DEVICES_MAX, 4),
    (off::PAD3, 32),
    (off::DEV_ROLES, 0),
];

const _: () = {
    let mut next = 0;
    let mut i = 0;
    while i < FIELDS.len() {
        assert!(
            FIELDS[i].0 == next,
            "superblock field offsets are not contiguous"
        );
        next += FIELDS[i].1;
        i += 1;
    }
    assert!(next == HEADER_BYTES);
    // The same three anchors mdadm's calc_sb_1_csum checks.
    assert!(off::DATA_OFFSET == 128);
    assert!(off::UTIME == 192);
    assert!(off::DEV_ROLES == 256);
    assert!(DEV_ROLES_MAX == 1920);
};

/// Bits of the 64-bit time fields that hold seconds; the top 24 hold
/// microseconds (MD_SUPERBLOCK_1_TIME_SEC_MASK).
const TIME_SEC_BITS: u32 = 40;
const TIME_SEC_MASK: u64 = (1 << TIME_SEC_BITS) - 1;
const TIME_MICROS_LIMIT: u32 = 1 << 24;

fn le16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn le32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn le64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

fn put16(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

fn put32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Bytes the kernel writes for this max_dev: `256 + 2 * max_dev` rounded up
/// to the logical block size (a power of two; values below 512 count as 512).
pub fn sb_size_bytes(max_dev: u32, logical_block_bytes: u32) -> usize {
    let block = logical_block_bytes.max(512).next_power_of_two() as usize;
    let raw = HEADER_BYTES + 2 * max_dev as usize;
    raw.div_ceil(block) * block
}

/// md's `calc_sb_1_csum`: the sum of the little-endian 32-bit words of the
/// first `256 + 2 * max_dev` bytes (with the checksum field taken as zero),
/// plus a trailing 16-bit word when that length is not a multiple of 4, then
/// folded once from 64 to 32 bits.
///
/// Fails when the buffer does not hold the whole superblock.
pub fn checksum(buf: &[u8]) -> Result<u32, FormatError> {
    if buf.len() < HEADER_BYTES {
        return Err(FormatError::BufferTooShort {
            need: HEADER_BYTES,
            got: buf.len(),
        });
    }
    let max_dev = le32(buf, off::DEVICES_MAX) as usize;
    let size = max_dev
        .checked_mul(2)
        .and_then(|roles| roles.checked_add(HEADER_BYTES))
        .unwrap_or(usize::MAX);
    if buf.len() < size {
        return Err(FormatError::BufferTooShort {
            need: size,
            got: buf.len(),
        });
    }
    let mut sum: u64 = 0;
    let words = size / 4;
    for word in 0..words {
        let at = word * 4;
        if at != off::SB_CSUM {
            sum += u64::from(le32(buf, at));
        }
    }
    if size % 4 == 2 {
        sum += u64::from(le16(buf, words * 4));
    }
    Ok(((sum & 0xffff_ffff) + (sum >> 32)) as u32)
}

/// Recomputes the checksum of a superblock in `buf` and stores it; returns
/// the new value. Useful for tests and tools that patch raw superblocks.
pub fn write_checksum(buf: &mut [u8]) -> Result<u32, FormatError> {
    let csum = checksum(buf)?;
    put32(buf, off::SB_CSUM, csum);
    Ok(csum)
}

/// Decodes and validates the superblock read from the `metadata` location
/// of a device of `device_sectors` sectors with 512-byte logical blocks.
///
/// `buf` is normally the 4 KiB the kernel reads; any buffer holding at least
/// `256 + 2 * max_dev` bytes works.
pub fn decode(
    buf: &[u8],
    metadata: Metadata,
    device_sectors: u64,
) -> Result<MemberSuper, FormatError> {
    decode_with_block_size(buf, metadata, device_sectors, 512)
}

/// [`decode`] for a device whose logical block size is not 512 bytes. The
/// kernel rounds the superblock size up to the logical block, which moves
/// the first sector the data may start at on 1.1 and 1.2 members.
pub fn decode_with_block_size(
    buf: &[u8],
    metadata: Metadata,
    device_sectors: u64,
    logical_block_bytes: u32,
) -> Result<MemberSuper, FormatError> {
    if metadata.sb1_minor().is_none() {
        return Err(FormatError::WrongMetadata { metadata });
    }
    let expected = super::superblock_offset_sectors(metadata, device_sectors).ok_or(
        FormatError::DeviceTooSmall {
            device_sectors,
            metadata,
            minimum: SB1_MIN_DEVICE_SECTORS,
        },
    )?;
    let sb = decode_inner(buf, Some((metadata, expected)), logical_block_bytes)?;

    // The kernel's last load-time check: data_size must fit on the device
    // (after data_offset for 1.1/1.2, before the superblock for 1.0). The
    // kernel computes the 1.1/1.2 room without guarding against a data
    // offset beyond the end of the device; that case is rejected here
    // because such a superblock can never be used.
    let available = if metadata == Metadata::V1_0 {
        expected
    } else {
        device_sectors.checked_sub(sb.data_offset_sectors).ok_or(
            FormatError::DataOffsetBeyondDevice {
                data_offset: sb.data_offset_sectors,
                device_sectors,
            },
        )?
    };
    if sb.data_size_sectors > available {
        return Err(FormatError::DataSizeExceedsDevice {
            data_size: sb.data_size_sectors,
            available,
        });
    }
    Ok(sb)
}

/// Decodes and validates a superblock without knowing the device it came
/// from, as `mdadm --examine` does: the version is guessed from the
/// superblock's own super_offset ([`Metadata::from_super_offset`]), and the
/// checks that need the device size (location, data_size fit) are skipped.
pub fn decode_detached(buf: &[u8]) -> Result<MemberSuper, FormatError> {
    decode_inner(buf, None, 512)
}

/// Shared decoder. `location` carries the version and the sector the
/// superblock must claim to be at, when the device is known.
fn decode_inner(
    buf: &[u8],
    location: Option<(Metadata, u64)>,
    logical_block_bytes: u32,
) -> Result<MemberSuper, FormatError> {
    if buf.len() < HEADER_BYTES {
        return Err(FormatError::BufferTooShort {
            need: HEADER_BYTES,
            got: buf.len(),
        });
    }
    // The checks below follow the order of the kernel's super_1_load, so
    // that a superblock with several defects reports the one md reports.
    let magic = le32(buf, off::MAGIC);
    if magic != MD_SB_MAGIC && magic != super::DRAID_SB_MAGIC {
        return Err(FormatError::BadMagic { found: magic });
    }
    let major = le32(buf, off::MAJOR_VERSION);
    if major != 1 {
        return Err(FormatError::BadMajorVersion { found: major });
    }
    let max_dev = le32(buf, off::DEVICES_MAX);
    if max_dev > DEV_ROLES_MAX {
        return Err(FormatError::TooManyDevices {
            found: max_dev,
            limit: DEV_ROLES_MAX,
        });
    }
    let super_offset = le64(buf, off::SUPER_OFFSET);
    if let Some((metadata, expected)) = location {
        if super_offset != expected {
            return Err(FormatError::SuperOffsetMismatch {
                found: super_offset,
                expected,
                metadata,
            });
        }
    }
    let feature_map = le32(buf, off::FEATURE_MAP);
    if feature_map & !MD_FEATURE_ALL != 0 {
        return Err(FormatError::UnknownFeatures {
            bits: feature_map & !MD_FEATURE_ALL,
        });
    }
    let computed = checksum(buf)?;
    let stored = le32(buf, off::SB_CSUM);
    if computed != stored {
        return Err(FormatError::BadChecksum { stored, computed });
    }
    let data_size = le64(buf, off::DATA_SIZE);
    if data_size < DATA_SIZE_SECTORS_MIN {
        return Err(FormatError::DataSizeTooSmall { found: data_size });
    }
    let pad0 = le32(buf, off::PAD0);
    if pad0 != 0 {
        return Err(FormatError::NonZeroPad0 { found: pad0 });
    }
    if buf[off::PAD3..off::DEV_ROLES].iter().any(|&b| b != 0) {
        return Err(FormatError::NonZeroPad3);
    }

    let metadata = location.map_or_else(|| Metadata::from_super_offset(super_offset), |l| l.0);
    let ctime = le64(buf, off::CTIME);
    let utime = le64(buf, off::UTIME);
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&buf[off::SET_UUID..off::SET_UUID + 16]);
    let mut device_uuid = [0u8; 16];
    device_uuid.copy_from_slice(&buf[off::DEVICE_UUID..off::DEVICE_UUID + 16]);
    let dev_roles = (0..max_dev as usize)
        .map(|i| le16(buf, off::DEV_ROLES + 2 * i))
        .collect();

    let sb = MemberSuper {
        metadata,
        feature_map,
        set_uuid: uuid,
        set_name: decode_name(&buf[off::SET_NAME..off::SET_NAME + 32]),
        ctime_secs: ctime & TIME_SEC_MASK,
        ctime_micros: (ctime >> TIME_SEC_BITS) as u32,
        level: le32(buf, off::LEVEL) as i32,
        layout: le32(buf, off::LAYOUT),
        size_sectors: le64(buf, off::SIZE),
        chunk_sectors: le32(buf, off::CHUNKSIZE),
        raid_disks: le32(buf, off::RAID_DISKS),
        bitmap_offset_sectors: le32(buf, off::BITMAP_OFFSET) as i32,
        new_level: le32(buf, off::NEW_LEVEL) as i32,
        reshape_position_sectors: le64(buf, off::RESHAPE_POSITION),
        delta_disks: le32(buf, off::DELTA_DISKS) as i32,
        new_layout: le32(buf, off::NEW_LAYOUT),
        new_chunk_sectors: le32(buf, off::NEW_CHUNK),
        new_offset_sectors: le32(buf, off::NEW_OFFSET) as i32,
        data_offset_sectors: le64(buf, off::DATA_OFFSET),
        data_size_sectors: data_size,
        super_offset_sectors: super_offset,
        recovery_offset_sectors: le64(buf, off::RECOVERY_OFFSET),
        dev_number: le32(buf, off::DEV_NUMBER),
        cnt_corrected_read: le32(buf, off::CNT_CORRECTED_READ),
        device_uuid,
        devflags: buf[off::DEVFLAGS],
        bblog_shift: buf[off::BBLOG_SHIFT],
        bblog_size_sectors: le16(buf, off::BBLOG_SIZE),
        bblog_offset_sectors: le32(buf, off::BBLOG_OFFSET) as i32,
        utime_secs: utime & TIME_SEC_MASK,
        utime_micros: (utime >> TIME_SEC_BITS) as u32,
        events: le64(buf, off::EVENTS),
        resync_offset_sectors: le64(buf, off::RESYNC_OFFSET),
        max_dev,
        dev_roles,
        v090: None,
    };
    // The magic and the level must agree: an md superblock never claims a
    // dRAID level, and a dRAID one never an md level, so that neither is
    // served as the other.
    if (magic == super::DRAID_SB_MAGIC) != super::is_draid_level(sb.level) {
        return Err(FormatError::MagicLevelMismatch {
            magic: if magic == MD_SB_MAGIC { "md" } else { "dRAID" },
            level: sb.level,
        });
    }
    check_rules(&sb, logical_block_bytes)?;
    Ok(sb)
}

/// Turns the 32-byte set_name field into a String: the bytes up to the first
/// NUL, decoded as UTF-8. Names that are not valid UTF-8 (md itself does not
/// care) are converted lossily and then cut at a character boundary so that
/// they still fit in 32 bytes; re-encoding such a name therefore rewrites
/// it, which is the one place where decode-then-encode is not byte-exact.
fn decode_name(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let mut name = String::from_utf8_lossy(&raw[..end]).into_owned();
    while name.len() > 32 {
        name.pop();
    }
    name
}

/// The kernel rules that can be checked on a decoded superblock, shared by
/// the decoder and the encoder. The location rule (super_offset) and the
/// device-size rule need the device and live in [`decode_with_block_size`].
fn check_rules(sb: &MemberSuper, logical_block_bytes: u32) -> Result<(), FormatError> {
    if sb.max_dev > DEV_ROLES_MAX {
        return Err(FormatError::TooManyDevices {
            found: sb.max_dev,
            limit: DEV_ROLES_MAX,
        });
    }
    if sb.dev_roles.len() != sb.max_dev as usize {
        return Err(FormatError::RolesLengthMismatch {
            len: sb.dev_roles.len(),
            max_dev: sb.max_dev,
        });
    }
    // Only these locations can ever match what the kernel computes: 1.1 at
    // 0, 1.2 at 8, 1.0 at a 4 KiB boundary past the first 4 KiB. mdadm's
    // own loader also insists on the exact location before it trusts a
    // superblock, so a detached decode applies the same shape rule.
    let location_ok = match sb.metadata {
        Metadata::V1_1 => sb.super_offset_sectors == 0,
        Metadata::V1_2 => sb.super_offset_sectors == 8,
        _ => sb.super_offset_sectors >= 8 && sb.super_offset_sectors.is_multiple_of(8),
    };
    if !location_ok {
        return Err(FormatError::SuperOffsetInvalid {
            found: sb.super_offset_sectors,
            metadata: sb.metadata,
        });
    }
    if sb.feature_map & !MD_FEATURE_ALL != 0 {
        return Err(FormatError::UnknownFeatures {
            bits: sb.feature_map & !MD_FEATURE_ALL,
        });
    }
    if sb.data_size_sectors < DATA_SIZE_SECTORS_MIN {
        return Err(FormatError::DataSizeTooSmall {
            found: sb.data_size_sectors,
        });
    }
    // For 1.1 and 1.2 the data must start after the superblock as the kernel
    // writes it (rounded up to the logical block), and so must the data
    // offset a reshape moves to. 1.0 keeps its superblock after the data.
    if sb.metadata != Metadata::V1_0 {
        let sb_sectors = (sb_size_bytes(sb.max_dev, logical_block_bytes) / 512) as u64;
        let sb_end = sb.super_offset_sectors.saturating_add(sb_sectors);
        if sb.data_offset_sectors < sb_end {
            return Err(FormatError::DataOverlapsSuperblock {
                data_offset: sb.data_offset_sectors,
                sb_end,
            });
        }
        let new_data_offset = sb.new_data_offset_sectors();
        if new_data_offset < i128::from(sb_end) {
            return Err(FormatError::NewDataOverlapsSuperblock {
                new_data_offset,
                sb_end,
            });
        }
    }
    // With recorded bad blocks the kernel reads the log, which must exist
    // and fit in the one page it reads.
    if sb.feature_map & MD_FEATURE_BAD_BLOCKS != 0 {
        if sb.bblog_size_sectors > BBLOG_MAX_SECTORS {
            return Err(FormatError::BadBlockLogTooLarge {
                found: sb.bblog_size_sectors,
                limit: BBLOG_MAX_SECTORS,
            });
        }
        if sb.bblog_offset_sectors == 0 {
            return Err(FormatError::BadBlockLogMissing);
        }
    }
    if sb.feature_map & MD_FEATURE_RAID0_LAYOUT != 0 && sb.level != 0 {
        return Err(FormatError::Raid0LayoutOnNonRaid0 { level: sb.level });
    }
    // A dRAID superblock is only ever written at the 1.2 location.
    if super::is_draid_level(sb.level) && sb.metadata != Metadata::V1_2 {
        return Err(FormatError::WrongMetadata {
            metadata: sb.metadata,
        });
    }
    // PPL shares the bitmap_offset field with the bitmap and cannot coexist
    // with a journal; exactly one of the two PPL bits may be set.
    let ppl_bits = sb.feature_map & (MD_FEATURE_PPL | MD_FEATURE_MULTIPLE_PPLS);
    if ppl_bits != 0 {
        if sb.feature_map & (MD_FEATURE_BITMAP_OFFSET | MD_FEATURE_JOURNAL) != 0 {
            return Err(FormatError::PplWithBitmapOrJournal);
        }
        if ppl_bits == MD_FEATURE_PPL | MD_FEATURE_MULTIPLE_PPLS {
            return Err(FormatError::PplAndMultiplePpls);
        }
    }
    // Multipath arrays ignore roles; everyone else refuses a journal device
    // in an array without the journal feature.
    if sb.level != super::LEVEL_MULTIPATH
        && sb.this_role() == Role::Journal
        && sb.feature_map & MD_FEATURE_JOURNAL == 0
    {
        return Err(FormatError::JournalWithoutFeature {
            dev_number: sb.dev_number,
        });
    }
    Ok(())
}

/// Encodes a 1.x superblock: `256 + 2 * max_dev` bytes rounded up to 512,
/// with the checksum computed. Refuses values that do not fit their fields
/// and superblocks the kernel would reject (see [`decode`]).
pub fn encode(sb: &MemberSuper) -> Result<Vec<u8>, FormatError> {
    if sb.metadata.sb1_minor().is_none() {
        return Err(FormatError::WrongMetadata {
            metadata: sb.metadata,
        });
    }
    let name = sb.set_name.as_bytes();
    if name.len() > 32 {
        return Err(FormatError::NameTooLong { len: name.len() });
    }
    if name.contains(&0) {
        return Err(FormatError::NameContainsNul);
    }
    check_rules(sb, 512)?;
    let ctime = pack_time("ctime", sb.ctime_secs, sb.ctime_micros)?;
    let utime = pack_time("utime", sb.utime_secs, sb.utime_micros)?;

    let mut buf = vec![0u8; sb_size_bytes(sb.max_dev, 512)];
    put32(&mut buf, off::MAGIC, super::magic_for_level(sb.level));
    put32(&mut buf, off::MAJOR_VERSION, 1);
    put32(&mut buf, off::FEATURE_MAP, sb.feature_map);
    put32(&mut buf, off::PAD0, 0);
    buf[off::SET_UUID..off::SET_UUID + 16].copy_from_slice(&sb.set_uuid);
    buf[off::SET_NAME..off::SET_NAME + name.len()].copy_from_slice(name);
    put64(&mut buf, off::CTIME, ctime);
    put32(&mut buf, off::LEVEL, sb.level as u32);
    put32(&mut buf, off::LAYOUT, sb.layout);
    put64(&mut buf, off::SIZE, sb.size_sectors);
    put32(&mut buf, off::CHUNKSIZE, sb.chunk_sectors);
    put32(&mut buf, off::RAID_DISKS, sb.raid_disks);
    put32(
        &mut buf,
        off::BITMAP_OFFSET,
        sb.bitmap_offset_sectors as u32,
    );
    put32(&mut buf, off::NEW_LEVEL, sb.new_level as u32);
    put64(&mut buf, off::RESHAPE_POSITION, sb.reshape_position_sectors);
    put32(&mut buf, off::DELTA_DISKS, sb.delta_disks as u32);
    put32(&mut buf, off::NEW_LAYOUT, sb.new_layout);
    put32(&mut buf, off::NEW_CHUNK, sb.new_chunk_sectors);
    put32(&mut buf, off::NEW_OFFSET, sb.new_offset_sectors as u32);
    put64(&mut buf, off::DATA_OFFSET, sb.data_offset_sectors);
    put64(&mut buf, off::DATA_SIZE, sb.data_size_sectors);
    put64(&mut buf, off::SUPER_OFFSET, sb.super_offset_sectors);
    put64(&mut buf, off::RECOVERY_OFFSET, sb.recovery_offset_sectors);
    put32(&mut buf, off::DEV_NUMBER, sb.dev_number);
    put32(&mut buf, off::CNT_CORRECTED_READ, sb.cnt_corrected_read);
    buf[off::DEVICE_UUID..off::DEVICE_UUID + 16].copy_from_slice(&sb.device_uuid);
    buf[off::DEVFLAGS] = sb.devflags;
    buf[off::BBLOG_SHIFT] = sb.bblog_shift;
    put16(&mut buf, off::BBLOG_SIZE, sb.bblog_size_sectors);
    put32(&mut buf, off::BBLOG_OFFSET, sb.bblog_offset_sectors as u32);
    put64(&mut buf, off::UTIME, utime);
    put64(&mut buf, off::EVENTS, sb.events);
    put64(&mut buf, off::RESYNC_OFFSET, sb.resync_offset_sectors);
    put32(&mut buf, off::DEVICES_MAX, sb.max_dev);
    for (i, &role) in sb.dev_roles.iter().enumerate() {
        put16(&mut buf, off::DEV_ROLES + 2 * i, role);
    }
    write_checksum(&mut buf)?;
    Ok(buf)
}

/// [`encode`] padded with zeros to the 4 KiB the kernel reads, which is also
/// the unit to write on a device with 4 KiB logical blocks.
pub fn encode_padded(sb: &MemberSuper) -> Result<[u8; READ_BYTES], FormatError> {
    let bytes = encode(sb)?;
    let mut out = [0u8; READ_BYTES];
    out[..bytes.len()].copy_from_slice(&bytes);
    Ok(out)
}

/// Packs seconds and microseconds into md's 40/24-bit time field.
fn pack_time(field: &'static str, secs: u64, micros: u32) -> Result<u64, FormatError> {
    if secs > TIME_SEC_MASK {
        return Err(FormatError::ValueOutOfRange { field, value: secs });
    }
    if micros >= TIME_MICROS_LIMIT {
        return Err(FormatError::ValueOutOfRange {
            field,
            value: u64::from(micros),
        });
    }
    Ok(secs | (u64::from(micros) << TIME_SEC_BITS))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::{
        MD_DISK_ROLE_JOURNAL, MD_DISK_ROLE_SPARE, MD_FEATURE_NEW_OFFSET, MD_FEATURE_RESHAPE_ACTIVE,
        SECTOR_MAX,
    };

    /// A 1.2 member of a 3-disk raid5 on 64 MiB devices, with the values
    /// mdadm 4.2 writes (data offset 4096, bad-block log at +16).
    pub(crate) fn sample(metadata: Metadata) -> MemberSuper {
        let device_sectors = 131_072;
        let super_offset = crate::format::superblock_offset_sectors(metadata, device_sectors)
            .expect("device is large enough");
        let (data_offset, data_size, bblog_offset) = match metadata {
            Metadata::V1_0 => (0, super_offset - 16, -8),
            _ => (4096, device_sectors - 4096, 16),
        };
        let mut roles = vec![MD_DISK_ROLE_SPARE; 128];
        roles[0] = 0;
        roles[1] = 1;
        roles[2] = 2;
        MemberSuper {
            metadata,
            feature_map: 0,
            set_uuid: [
                0x3b, 0x9d, 0x1c, 0x4e, 0x55, 0xa0, 0x7f, 0x12, 0x90, 0x01, 0xfe, 0xdc, 0x42, 0x37,
                0x8a, 0x6b,
            ],
            set_name: "uraidhost:test".to_string(),
            ctime_secs: 1_700_000_000,
            ctime_micros: 0,
            level: 5,
            layout: 2,
            size_sectors: 126_976,
            chunk_sectors: 1024,
            raid_disks: 3,
            bitmap_offset_sectors: 0,
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
            dev_number: 1,
            cnt_corrected_read: 0,
            device_uuid: [0x11; 16],
            devflags: 0,
            bblog_shift: 0,
            bblog_size_sectors: 8,
            bblog_offset_sectors: bblog_offset,
            utime_secs: 1_700_000_100,
            utime_micros: 0,
            events: 18,
            resync_offset_sectors: SECTOR_MAX,
            max_dev: 128,
            dev_roles: roles,
            v090: None,
        }
    }

    const DEV: u64 = 131_072;

    /// Encodes `sb` into a 4 KiB buffer, lets `patch` edit the raw bytes,
    /// and re-seals the checksum so that only the patched rule can fail.
    fn patched(sb: &MemberSuper, patch: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut buf = encode_padded(sb).unwrap().to_vec();
        patch(&mut buf);
        write_checksum(&mut buf).unwrap();
        buf
    }

    #[test]
    fn round_trip_all_v1_versions() {
        for metadata in [Metadata::V1_0, Metadata::V1_1, Metadata::V1_2] {
            let sb = sample(metadata);
            let bytes = encode(&sb).unwrap();
            assert_eq!(bytes.len(), 512);
            assert_eq!(decode(&bytes, metadata, DEV).unwrap(), sb);
            let padded = encode_padded(&sb).unwrap();
            assert_eq!(decode(&padded, metadata, DEV).unwrap(), sb);
            assert_eq!(decode_detached(&padded).unwrap(), sb);
        }
    }

    #[test]
    fn field_offsets_match_md_p_h() {
        let sb = sample(Metadata::V1_2);
        let buf = encode(&sb).unwrap();
        assert_eq!(&buf[0..4], &[0xfc, 0x4e, 0x2b, 0xa9]);
        assert_eq!(le32(&buf, 4), 1);
        assert_eq!(&buf[16..32], &sb.set_uuid);
        assert_eq!(&buf[32..46], b"uraidhost:test");
        assert_eq!(le32(&buf, 72), 5);
        assert_eq!(le64(&buf, 80), 126_976);
        assert_eq!(le32(&buf, 88), 1024);
        assert_eq!(le64(&buf, 128), 4096);
        assert_eq!(le64(&buf, 144), 8);
        assert_eq!(le32(&buf, 160), 1);
        assert_eq!(le16(&buf, 186), 8);
        assert_eq!(le32(&buf, 188), 16);
        assert_eq!(le64(&buf, 200), 18);
        assert_eq!(le64(&buf, 208), u64::MAX);
        assert_eq!(le32(&buf, 220), 128);
        assert_eq!(le16(&buf, 256), 0);
        assert_eq!(le16(&buf, 260), 2);
        assert_eq!(le16(&buf, 262), 0xffff);
    }

    #[test]
    fn checksum_matches_a_hand_computed_value() {
        // A zero buffer with max_dev 1 (258 bytes: an odd number of 16-bit
        // words, so the trailing-halfword rule is exercised).
        let mut buf = vec![0u8; 512];
        put32(&mut buf, off::DEVICES_MAX, 1);
        put16(&mut buf, 256, 0xfffe);
        put32(&mut buf, off::MAGIC, MD_SB_MAGIC);
        // The sum is magic + max_dev + 0xfffe; the checksum field is skipped.
        put32(&mut buf, off::SB_CSUM, 0xdead_beef);
        assert_eq!(checksum(&buf).unwrap(), MD_SB_MAGIC + 1 + 0xfffe);
        // A carry out of 32 bits is folded back in once. With every byte
        // 0xff and max_dev 0, 62 of the 64 header words are 0xffffffff (the
        // checksum word is skipped and the max_dev word is zero).
        let mut big = vec![0xffu8; 512];
        put32(&mut big, off::DEVICES_MAX, 0);
        let sum: u64 = 62 * 0xffff_ffff;
        let expect = ((sum & 0xffff_ffff) + (sum >> 32)) as u32;
        assert_eq!(checksum(&big).unwrap(), expect);
    }

    #[test]
    fn output_length_follows_max_dev() {
        let mut sb = sample(Metadata::V1_2);
        for (max_dev, len) in [(0u32, 512usize), (128, 512), (129, 1024), (1920, 4096)] {
            sb.max_dev = max_dev;
            sb.dev_roles = vec![MD_DISK_ROLE_SPARE; max_dev as usize];
            sb.dev_roles.resize(max_dev as usize, MD_DISK_ROLE_SPARE);
            if max_dev > 1 {
                sb.dev_roles[1] = 1;
            }
            let bytes = encode(&sb).unwrap();
            assert_eq!(bytes.len(), len, "max_dev {max_dev}");
            assert_eq!(decode(&bytes, Metadata::V1_2, DEV).unwrap(), sb);
        }
    }

    #[test]
    fn rejects_bad_magic() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::MAGIC, 0x1234_5678)
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::BadMagic { found: 0x1234_5678 })
        );
    }

    #[test]
    fn rejects_bad_major_version() {
        let buf = patched(&sample(Metadata::V1_2), |b| put32(b, off::MAJOR_VERSION, 2));
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::BadMajorVersion { found: 2 })
        );
    }

    #[test]
    fn rejects_too_many_devices() {
        // The limit is checked before the checksum, which cannot even be
        // computed over a 4 KiB read with this max_dev.
        let mut buf = encode_padded(&sample(Metadata::V1_2)).unwrap();
        put32(&mut buf, off::DEVICES_MAX, 1921);
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::TooManyDevices {
                found: 1921,
                limit: 1920
            })
        );
    }

    #[test]
    fn rejects_wrong_location() {
        let sb = sample(Metadata::V1_2);
        let buf = encode_padded(&sb).unwrap();
        assert_eq!(
            decode(&buf, Metadata::V1_1, DEV),
            Err(FormatError::SuperOffsetMismatch {
                found: 8,
                expected: 0,
                metadata: Metadata::V1_1
            })
        );
        // A 1.0 superblock read from a device of a different size.
        let sb = sample(Metadata::V1_0);
        let buf = encode_padded(&sb).unwrap();
        assert!(matches!(
            decode(&buf, Metadata::V1_0, DEV + 8),
            Err(FormatError::SuperOffsetMismatch { .. })
        ));
        assert!(matches!(
            decode(&buf, Metadata::V1_0, 16),
            Err(FormatError::DeviceTooSmall { .. })
        ));
        assert!(matches!(
            decode(&buf, Metadata::V0_90, DEV),
            Err(FormatError::WrongMetadata { .. })
        ));
    }

    #[test]
    fn rejects_unknown_features() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::FEATURE_MAP, 0x2000)
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::UnknownFeatures { bits: 0x2000 })
        );
    }

    #[test]
    fn rejects_bad_checksum() {
        let mut buf = encode_padded(&sample(Metadata::V1_2)).unwrap();
        let good = le32(&buf, off::SB_CSUM);
        buf[off::EVENTS] ^= 1;
        match decode(&buf, Metadata::V1_2, DEV) {
            Err(FormatError::BadChecksum { stored, computed }) => {
                assert_eq!(stored, good);
                assert_ne!(computed, good);
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
        // A change in the roles covered by max_dev is also detected.
        let mut buf = encode_padded(&sample(Metadata::V1_2)).unwrap();
        buf[off::DEV_ROLES + 2 * 127] = 0;
        assert!(matches!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::BadChecksum { .. })
        ));
        // Bytes beyond max_dev are not covered, as in md.
        let mut buf = encode_padded(&sample(Metadata::V1_2)).unwrap();
        buf[off::DEV_ROLES + 2 * 128] = 7;
        assert!(decode(&buf, Metadata::V1_2, DEV).is_ok());
    }

    #[test]
    fn rejects_small_data_size() {
        let buf = patched(&sample(Metadata::V1_2), |b| put64(b, off::DATA_SIZE, 9));
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::DataSizeTooSmall { found: 9 })
        );
    }

    #[test]
    fn rejects_non_zero_padding() {
        let buf = patched(&sample(Metadata::V1_2), |b| put32(b, off::PAD0, 1));
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::NonZeroPad0 { found: 1 })
        );
        for at in [off::PAD3, off::PAD3 + 31] {
            let buf = patched(&sample(Metadata::V1_2), |b| b[at] = 0x80);
            assert_eq!(
                decode(&buf, Metadata::V1_2, DEV),
                Err(FormatError::NonZeroPad3)
            );
        }
    }

    #[test]
    fn rejects_data_overlapping_the_superblock() {
        // 1.2: the superblock occupies sectors 8..9, so data may start at 9.
        let buf = patched(&sample(Metadata::V1_2), |b| put64(b, off::DATA_OFFSET, 8));
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::DataOverlapsSuperblock {
                data_offset: 8,
                sb_end: 9
            })
        );
        let buf = patched(&sample(Metadata::V1_2), |b| put64(b, off::DATA_OFFSET, 9));
        assert!(decode(&buf, Metadata::V1_2, DEV).is_ok());
        // With 4 KiB logical blocks the superblock takes a whole block.
        assert_eq!(
            decode_with_block_size(&buf, Metadata::V1_2, DEV, 4096),
            Err(FormatError::DataOverlapsSuperblock {
                data_offset: 9,
                sb_end: 16
            })
        );
        // 1.1 with data at 0.
        let buf = patched(&sample(Metadata::V1_1), |b| put64(b, off::DATA_OFFSET, 0));
        assert!(matches!(
            decode(&buf, Metadata::V1_1, DEV),
            Err(FormatError::DataOverlapsSuperblock { .. })
        ));
        // 1.0 keeps data before the superblock, so offset 0 is fine.
        assert!(decode(
            &encode(&sample(Metadata::V1_0)).unwrap(),
            Metadata::V1_0,
            DEV
        )
        .is_ok());
    }

    #[test]
    fn rejects_new_offset_overlapping_the_superblock() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(
                b,
                off::FEATURE_MAP,
                MD_FEATURE_RESHAPE_ACTIVE | MD_FEATURE_NEW_OFFSET,
            );
            put32(b, off::NEW_OFFSET, -4090i32 as u32);
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::NewDataOverlapsSuperblock {
                new_data_offset: 6,
                sb_end: 9
            })
        );
        // Without NEW_OFFSET the field is ignored.
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::NEW_OFFSET, -4090i32 as u32)
        });
        assert!(decode(&buf, Metadata::V1_2, DEV).is_ok());
        // A legal backwards move is accepted and reported.
        let mut sb = sample(Metadata::V1_2);
        sb.feature_map = MD_FEATURE_RESHAPE_ACTIVE | MD_FEATURE_NEW_OFFSET;
        sb.new_offset_sectors = -2048;
        let decoded = decode(&encode(&sb).unwrap(), Metadata::V1_2, DEV).unwrap();
        assert_eq!(decoded.new_data_offset_sectors(), 2048);
    }

    #[test]
    fn rejects_bad_block_log_problems() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::FEATURE_MAP, MD_FEATURE_BAD_BLOCKS);
            put16(b, off::BBLOG_SIZE, 16);
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::BadBlockLogTooLarge {
                found: 16,
                limit: 8
            })
        );
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::FEATURE_MAP, MD_FEATURE_BAD_BLOCKS);
            put32(b, off::BBLOG_OFFSET, 0);
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::BadBlockLogMissing)
        );
        // Without recorded bad blocks the same fields are not checked.
        let buf = patched(&sample(Metadata::V1_2), |b| put16(b, off::BBLOG_SIZE, 16));
        assert!(decode(&buf, Metadata::V1_2, DEV).is_ok());
    }

    #[test]
    fn rejects_raid0_layout_on_other_levels() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::FEATURE_MAP, MD_FEATURE_RAID0_LAYOUT)
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::Raid0LayoutOnNonRaid0 { level: 5 })
        );
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(b, off::FEATURE_MAP, MD_FEATURE_RAID0_LAYOUT);
            put32(b, off::LEVEL, 0);
        });
        assert!(decode(&buf, Metadata::V1_2, DEV).is_ok());
    }

    #[test]
    fn rejects_ppl_combinations() {
        for other in [MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_JOURNAL] {
            for ppl in [MD_FEATURE_PPL, MD_FEATURE_MULTIPLE_PPLS] {
                let buf = patched(&sample(Metadata::V1_2), |b| {
                    put32(b, off::FEATURE_MAP, ppl | other)
                });
                assert_eq!(
                    decode(&buf, Metadata::V1_2, DEV),
                    Err(FormatError::PplWithBitmapOrJournal)
                );
            }
        }
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put32(
                b,
                off::FEATURE_MAP,
                MD_FEATURE_PPL | MD_FEATURE_MULTIPLE_PPLS,
            )
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::PplAndMultiplePpls)
        );
        let mut sb = sample(Metadata::V1_2);
        sb.feature_map = MD_FEATURE_PPL;
        sb.set_ppl(8, 2048);
        let decoded = decode(&encode(&sb).unwrap(), Metadata::V1_2, DEV).unwrap();
        assert_eq!(decoded.ppl_offset_sectors(), 8);
        assert_eq!(decoded.ppl_size_sectors(), 2048);
        sb.set_ppl(-2056, 2048);
        assert_eq!(sb.ppl_offset_sectors(), -2056);
    }

    #[test]
    fn rejects_journal_role_without_feature() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put16(b, off::DEV_ROLES + 2, MD_DISK_ROLE_JOURNAL)
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::JournalWithoutFeature { dev_number: 1 })
        );
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put16(b, off::DEV_ROLES + 2, MD_DISK_ROLE_JOURNAL);
            put32(b, off::FEATURE_MAP, MD_FEATURE_JOURNAL);
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV).unwrap().this_role(),
            Role::Journal
        );
    }

    #[test]
    fn rejects_data_beyond_the_device() {
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put64(b, off::DATA_SIZE, DEV - 4095)
        });
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::DataSizeExceedsDevice {
                data_size: DEV - 4095,
                available: DEV - 4096
            })
        );
        let buf = patched(&sample(Metadata::V1_2), |b| {
            put64(b, off::DATA_OFFSET, DEV + 1)
        });
        assert!(matches!(
            decode(&buf, Metadata::V1_2, DEV),
            Err(FormatError::DataOffsetBeyondDevice { .. })
        ));
        // 1.0: data_size may reach the superblock but not pass it.
        let sb = sample(Metadata::V1_0);
        let at = sb.super_offset_sectors;
        let buf = patched(&sb, |b| put64(b, off::DATA_SIZE, at));
        assert!(decode(&buf, Metadata::V1_0, DEV).is_ok());
        let buf = patched(&sb, |b| put64(b, off::DATA_SIZE, at + 1));
        assert_eq!(
            decode(&buf, Metadata::V1_0, DEV),
            Err(FormatError::DataSizeExceedsDevice {
                data_size: at + 1,
                available: at
            })
        );
    }

    #[test]
    fn rejects_short_buffers() {
        let buf = encode_padded(&sample(Metadata::V1_2)).unwrap();
        assert_eq!(
            decode(&buf[..255], Metadata::V1_2, DEV),
            Err(FormatError::BufferTooShort {
                need: 256,
                got: 255
            })
        );
        assert_eq!(
            decode(&buf[..300], Metadata::V1_2, DEV),
            Err(FormatError::BufferTooShort {
                need: 512,
                got: 300
            })
        );
    }

    #[test]
    fn encoder_refuses_what_it_cannot_store() {
        let mut sb = sample(Metadata::V1_2);
        sb.set_name = "x".repeat(33);
        assert_eq!(encode(&sb), Err(FormatError::NameTooLong { len: 33 }));
        sb.set_name = "a\0b".into();
        assert_eq!(encode(&sb), Err(FormatError::NameContainsNul));
        let mut sb = sample(Metadata::V1_2);
        sb.dev_roles.pop();
        assert!(matches!(
            encode(&sb),
            Err(FormatError::RolesLengthMismatch { .. })
        ));
        let mut sb = sample(Metadata::V1_2);
        sb.ctime_secs = 1 << 40;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::ValueOutOfRange { field: "ctime", .. })
        ));
        let mut sb = sample(Metadata::V1_2);
        sb.utime_micros = 1 << 24;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::ValueOutOfRange { field: "utime", .. })
        ));
        let mut sb = sample(Metadata::V1_2);
        sb.data_size_sectors = 3;
        assert_eq!(encode(&sb), Err(FormatError::DataSizeTooSmall { found: 3 }));
        let mut sb = sample(Metadata::V1_2);
        sb.metadata = Metadata::V0_90;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::WrongMetadata { .. })
        ));
    }

    #[test]
    fn names_and_times_round_trip() {
        let mut sb = sample(Metadata::V1_2);
        sb.set_name = "é".repeat(16); // exactly 32 bytes, no terminating NUL
        sb.ctime_micros = 999_999;
        sb.utime_secs = (1 << 40) - 1;
        let back = decode(&encode(&sb).unwrap(), Metadata::V1_2, DEV).unwrap();
        assert_eq!(back, sb);
        // Bytes after the first NUL are ignored, as mdadm's %.32s does.
        let buf = patched(&sample(Metadata::V1_2), |b| b[off::SET_NAME + 20] = b'z');
        assert_eq!(
            decode(&buf, Metadata::V1_2, DEV).unwrap().set_name,
            "uraidhost:test"
        );
        // Invalid UTF-8 is decoded lossily but still fits when re-encoded.
        let buf = patched(&sample(Metadata::V1_2), |b| {
            b[off::SET_NAME..off::SET_NAME + 32].fill(0xff)
        });
        let odd = decode(&buf, Metadata::V1_2, DEV).unwrap();
        assert!(odd.set_name.len() <= 32);
        let again = decode(&encode(&odd).unwrap(), Metadata::V1_2, DEV).unwrap();
        assert_eq!(again, odd);
    }

    #[test]
    fn rejects_impossible_locations() {
        for (offset, metadata) in [
            (3, Metadata::V1_1),
            (6, Metadata::V1_2),
            (131_050, Metadata::V1_0),
        ] {
            let buf = patched(&sample(Metadata::V1_0), |b| {
                put64(b, off::SUPER_OFFSET, offset)
            });
            assert_eq!(
                decode_detached(&buf),
                Err(FormatError::SuperOffsetInvalid {
                    found: offset,
                    metadata
                })
            );
        }
        let mut sb = sample(Metadata::V1_2);
        sb.super_offset_sectors = 0;
        assert!(matches!(
            encode(&sb),
            Err(FormatError::SuperOffsetInvalid { .. })
        ));
    }

    #[test]
    fn detached_decode_guesses_the_version() {
        for metadata in [Metadata::V1_0, Metadata::V1_1, Metadata::V1_2] {
            let sb = sample(metadata);
            assert_eq!(
                decode_detached(&encode(&sb).unwrap()).unwrap().metadata,
                metadata
            );
        }
    }
}
