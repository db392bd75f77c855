//! The md write-intent bitmap: its 256-byte superblock (`bitmap_super_t`)
//! and the bits that follow it, as pure encoding, decoding and validation,
//! with no I/O.
//!
//! An internal bitmap lives next to every member's md superblock, at
//! `super_offset + bitmap_offset` sectors (a signed offset: before the
//! superblock for 1.0, 4 KiB after it for 1.1 and 1.2, 4 KiB after it for
//! 0.90). It starts with a [`BitmapSuper`], and the bits follow directly:
//! the bit of bitmap chunk `k` is bit `k % 8` of byte `256 + k / 8`
//! (md-bitmap.c `file_page_offset` adds the superblock's size in bits, and
//! version 4 uses `set_bit_le`). A set bit means "this chunk may be out of
//! sync": after a crash md resyncs only the chunks whose bit is set, and a
//! re-added member is recovered only where bits are set.
//!
//! A chunk covers `chunk_bytes / 512` sectors in md's resync unit: sectors
//! of each member for raid1/4/5/6, but sectors of the *array* for raid10
//! (md_p.h note (3), [`super::bitmap_sync_sectors`]). `sync_size` is the
//! number of those sectors the bitmap covers.
//!
//! [`BitmapSuper::decode`] applies the checks of the kernel's
//! `md_bitmap_read_sb`, except the UUID comparison, which needs the array
//! and is the caller's; [`BitmapSuper::encode`] refuses what decode would
//! reject, so uraid never writes a bitmap the kernel would refuse.

use super::{MemberSuper, MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_MULTIPLE_PPLS, MD_FEATURE_PPL};
use serde::Serialize;
use std::ops::Range;

/// "bitm" read as a little-endian u32.
pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// Oldest bitmap version md reads (host-endian bits).
pub const BITMAP_MAJOR_LO: u32 = 3;
/// Version 3: the bits are in the writing host's order (little-endian on x86).
pub const BITMAP_MAJOR_HOSTENDIAN: u32 = 3;
/// Version 4: little-endian bits; what mdadm and the kernel write today.
pub const BITMAP_MAJOR_HI: u32 = 4;
/// Version 5: md-cluster, one bitmap per node slot.
pub const BITMAP_MAJOR_CLUSTERED: u32 = 5;
/// Size of `bitmap_super_t`; the bits start right after it.
pub const BITMAP_SUPER_BYTES: usize = 256;
/// Largest write-behind count: the 14-bit in-memory counter's maximum.
pub const COUNTER_MAX: u32 = 16383;
/// mdadm's DEFAULT_BITMAP_DELAY: seconds between bitmap daemon runs.
pub const DEFAULT_DAEMON_SLEEP_SECS: u32 = 5;
/// Smallest chunk md accepts.
pub const CHUNK_BYTES_MIN: u32 = 512;
/// Size of the cluster name field.
pub const CLUSTER_NAME_BYTES: usize = 64;
/// `state` bit value: the bitmap is out of date (md's BITMAP_STALE is bit
/// number 1; mdadm prints the value 2 as "Out of date").
pub const BITMAP_STATE_STALE: u32 = 1 << 1;
/// `state` bit value: writing the bitmap failed (BITMAP_WRITE_ERROR, bit 2).
pub const BITMAP_STATE_WRITE_ERROR: u32 = 1 << 2;
/// The kernel's jiffies per second bound daemon_sleep: it must be at least
/// one jiffy and at most MAX_SCHEDULE_TIMEOUT (LONG_MAX) jiffies. With a
/// 32-bit field and a 64-bit long only the lower bound can fail; the upper
/// one is checked for 32-bit kernels with HZ up to 1000.
const DAEMON_SLEEP_SECS_MAX: u64 = i32::MAX as u64 / 1000;

/// Byte offsets of the superblock fields (md_p.h `struct bitmap_super`).
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const UUID: usize = 8;
    pub const EVENTS: usize = 24;
    pub const EVENTS_CLEARED: usize = 32;
    pub const SYNC_SIZE: usize = 40;
    pub const STATE: usize = 48;
    pub const CHUNKSIZE: usize = 52;
    pub const DAEMON_SLEEP: usize = 56;
    pub const WRITE_BEHIND: usize = 60;
    pub const SECTORS_RESERVED: usize = 64;
    pub const NODES: usize = 68;
    pub const CLUSTER_NAME: usize = 72;
    pub const PAD: usize = 136;
}

/// (offset, size) of every field in order; the compile-time check below
/// proves they are contiguous and fill exactly 256 bytes.
const FIELDS: [(usize, usize); 14] = [
    (off::MAGIC, 4),
    (off::VERSION, 4),
    (off::UUID, 16),
    (off::EVENTS, 8),
    (off::EVENTS_CLEARED, 8),
    (off::SYNC_SIZE, 8),
    (off::STATE, 4),
    (off::CHUNKSIZE, 4),
    (off::DAEMON_SLEEP, 4),
    (off::WRITE_BEHIND, 4),
    (off::SECTORS_RESERVED, 4),
    (off::NODES, 4),
    (off::CLUSTER_NAME, CLUSTER_NAME_BYTES),
    (off::PAD, 120),
];

const _: () = {
    let mut next = 0;
    let mut i = 0;
    while i < FIELDS.len() {
        assert!(
            FIELDS[i].0 == next,
            "bitmap superblock fields are not contiguous"
        );
        next += FIELDS[i].1;
        i += 1;
    }
    assert!(next == BITMAP_SUPER_BYTES);
    assert!(off::PAD == 136);
};

/// Why a bitmap superblock or bitmap area was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitmapError {
    #[error("bitmap buffer too short: need {need} bytes, got {got}")]
    BufferTooShort { need: u64, got: u64 },
    #[error("invalid bitmap superblock: bad magic {found:#010x}, expected 0x6d746962")]
    BadMagic { found: u32 },
    #[error("invalid bitmap superblock: unrecognized version {found} (md reads 3 to 5)")]
    BadVersion { found: u32 },
    #[error("invalid bitmap superblock: chunk size {chunk_bytes} bytes is below 512")]
    ChunkTooSmall { chunk_bytes: u32 },
    #[error("invalid bitmap superblock: chunk size {chunk_bytes} bytes is not a power of 2")]
    ChunkNotPowerOfTwo { chunk_bytes: u32 },
    #[error("invalid bitmap superblock: daemon sleep period {secs} s is out of range")]
    DaemonSleepOutOfRange { secs: u32 },
    #[error("invalid bitmap superblock: write-behind limit {found} is out of range (0 - 16383)")]
    WriteBehindOutOfRange { found: u32 },
    #[error("bitmap has {found} chunks but its superblock describes {expected}")]
    ChunkCountMismatch { found: u64, expected: u64 },
    #[error("bitmap of {need} bytes does not fit in the {room} bytes md leaves for it")]
    DoesNotFit { need: u64, room: u64 },
}

fn le32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

fn put32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// The bitmap superblock, field by field. Units are in the names; `state`
/// keeps md's raw bit values (see [`BITMAP_STATE_STALE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BitmapSuper {
    /// 3 (host-endian bits), 4 (little-endian bits) or 5 (clustered).
    pub version: u32,
    /// Must equal the array's set UUID (bytes as in the md superblock).
    pub uuid: [u8; 16],
    /// md writes the bitmap before the superblocks, so a bitmap whose
    /// events is below the array's is out of date and forces a full resync.
    pub events: u64,
    /// The events value at which bits were last cleared; a re-added member
    /// at least this fresh can be recovered from the bitmap alone.
    pub events_cleared: u64,
    /// Sectors (md's resync unit, see the module notes) the bitmap covers.
    pub sync_size_sectors: u64,
    /// md's bitmap flag values (STALE, WRITE_ERROR).
    pub state: u32,
    /// Bytes of resync unit per bit; a power of two of at least 512.
    pub chunk_bytes: u32,
    /// Seconds between runs of the daemon that clears bits.
    pub daemon_sleep_secs: u32,
    /// Outstanding write-behind writes allowed (0: normal writes).
    pub write_behind: u32,
    /// Sectors reserved for the bitmap (0: not recorded, as mdadm writes it).
    pub sectors_reserved: u32,
    /// md-cluster node slots (0 unless version 5).
    pub nodes: u32,
    /// md-cluster name, NUL-padded.
    #[serde(skip)]
    pub cluster_name: [u8; CLUSTER_NAME_BYTES],
}

impl BitmapSuper {
    /// The bitmap superblock mdadm 4.2 writes for a new internal bitmap
    /// (`add_internal_bitmap1`): version 4, 5 s daemon sleep, no write
    /// behind, nothing reserved, not clustered; events and events_cleared
    /// both equal to the member superblock's events.
    pub fn new(uuid: [u8; 16], events: u64, sync_size_sectors: u64, chunk_bytes: u32) -> Self {
        BitmapSuper {
            version: BITMAP_MAJOR_HI,
            uuid,
            events,
            events_cleared: events,
            sync_size_sectors,
            state: 0,
            chunk_bytes,
            daemon_sleep_secs: DEFAULT_DAEMON_SLEEP_SECS,
            write_behind: 0,
            sectors_reserved: 0,
            nodes: 0,
            cluster_name: [0; CLUSTER_NAME_BYTES],
        }
    }

    /// Decodes the first 256 bytes of `buf` and checks them as
    /// `md_bitmap_read_sb` does (magic, version, chunk size, daemon sleep,
    /// write behind). The pad is ignored, as md ignores it.
    pub fn decode(buf: &[u8]) -> Result<BitmapSuper, BitmapError> {
        if buf.len() < BITMAP_SUPER_BYTES {
            return Err(BitmapError::BufferTooShort {
                need: BITMAP_SUPER_BYTES as u64,
                got: buf.len() as u64,
            });
        }
        let magic = le32(buf, off::MAGIC);
        if magic != BITMAP_MAGIC {
            return Err(BitmapError::BadMagic { found: magic });
        }
        let sb = BitmapSuper {
            version: le32(buf, off::VERSION),
            uuid: buf[off::UUID..off::UUID + 16].try_into().expect("16 bytes"),
            events: le64(buf, off::EVENTS),
            events_cleared: le64(buf, off::EVENTS_CLEARED),
            sync_size_sectors: le64(buf, off::SYNC_SIZE),
            state: le32(buf, off::STATE),
            chunk_bytes: le32(buf, off::CHUNKSIZE),
            daemon_sleep_secs: le32(buf, off::DAEMON_SLEEP),
            write_behind: le32(buf, off::WRITE_BEHIND),
            sectors_reserved: le32(buf, off::SECTORS_RESERVED),
            nodes: le32(buf, off::NODES),
            cluster_name: buf[off::CLUSTER_NAME..off::CLUSTER_NAME + CLUSTER_NAME_BYTES]
                .try_into()
                .expect("64 bytes"),
        };
        sb.validate()?;
        Ok(sb)
    }

    /// The kernel's checks, in its order (the magic is a constant here).
    pub fn validate(&self) -> Result<(), BitmapError> {
        if !(BITMAP_MAJOR_LO..=BITMAP_MAJOR_CLUSTERED).contains(&self.version) {
            return Err(BitmapError::BadVersion {
                found: self.version,
            });
        }
        if self.chunk_bytes < CHUNK_BYTES_MIN {
            return Err(BitmapError::ChunkTooSmall {
                chunk_bytes: self.chunk_bytes,
            });
        }
        if !self.chunk_bytes.is_power_of_two() {
            return Err(BitmapError::ChunkNotPowerOfTwo {
                chunk_bytes: self.chunk_bytes,
            });
        }
        if self.daemon_sleep_secs < 1 || u64::from(self.daemon_sleep_secs) > DAEMON_SLEEP_SECS_MAX {
            return Err(BitmapError::DaemonSleepOutOfRange {
                secs: self.daemon_sleep_secs,
            });
        }
        if self.write_behind > COUNTER_MAX {
            return Err(BitmapError::WriteBehindOutOfRange {
                found: self.write_behind,
            });
        }
        Ok(())
    }

    /// The 256 on-disk bytes, with a zero pad.
    pub fn encode(&self) -> Result<[u8; BITMAP_SUPER_BYTES], BitmapError> {
        let mut buf = [0u8; BITMAP_SUPER_BYTES];
        self.encode_into(&mut buf)?;
        Ok(buf)
    }

    /// Writes the fields over the first 256 bytes of `buf`, leaving the pad
    /// as it is: md keeps whatever it read there, and so does a rewrite.
    pub fn encode_into(&self, buf: &mut [u8]) -> Result<(), BitmapError> {
        self.validate()?;
        if buf.len() < BITMAP_SUPER_BYTES {
            return Err(BitmapError::BufferTooShort {
                need: BITMAP_SUPER_BYTES as u64,
                got: buf.len() as u64,
            });
        }
        put32(buf, off::MAGIC, BITMAP_MAGIC);
        put32(buf, off::VERSION, self.version);
        buf[off::UUID..off::UUID + 16].copy_from_slice(&self.uuid);
        put64(buf, off::EVENTS, self.events);
        put64(buf, off::EVENTS_CLEARED, self.events_cleared);
        put64(buf, off::SYNC_SIZE, self.sync_size_sectors);
        put32(buf, off::STATE, self.state);
        put32(buf, off::CHUNKSIZE, self.chunk_bytes);
        put32(buf, off::DAEMON_SLEEP, self.daemon_sleep_secs);
        put32(buf, off::WRITE_BEHIND, self.write_behind);
        put32(buf, off::SECTORS_RESERVED, self.sectors_reserved);
        put32(buf, off::NODES, self.nodes);
        buf[off::CLUSTER_NAME..off::CLUSTER_NAME + CLUSTER_NAME_BYTES]
            .copy_from_slice(&self.cluster_name);
        Ok(())
    }

    /// Whether md marked the bitmap out of date (it then resyncs everything).
    pub fn is_stale(&self) -> bool {
        self.state & BITMAP_STATE_STALE != 0
    }

    /// The cluster name up to its first NUL.
    pub fn cluster_name_text(&self) -> String {
        let end = self
            .cluster_name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(CLUSTER_NAME_BYTES);
        String::from_utf8_lossy(&self.cluster_name[..end]).into_owned()
    }

    /// Number of bits (bitmap chunks).
    pub fn chunks(&self) -> u64 {
        bit_count(self.sync_size_sectors, u64::from(self.chunk_bytes))
    }

    /// Sectors of md's resync unit per bit.
    pub fn chunk_sectors(&self) -> u64 {
        u64::from(self.chunk_bytes) / 512
    }

    /// The sectors bitmap chunk `chunk` covers; the last chunk stops at
    /// `sync_size`.
    pub fn chunk_range_sectors(&self, chunk: u64) -> Range<u64> {
        assert!(chunk < self.chunks(), "bitmap chunk {chunk} out of range");
        let size = self.chunk_sectors();
        chunk * size..((chunk + 1) * size).min(self.sync_size_sectors)
    }

    /// The bitmap chunk that holds `sector`.
    pub fn chunk_of_sector(&self, sector: u64) -> u64 {
        assert!(
            sector < self.sync_size_sectors,
            "sector {sector} beyond the bitmap's {} sectors",
            self.sync_size_sectors
        );
        sector / self.chunk_sectors()
    }

    /// The chunks a write of `sectors` touches (empty for an empty range).
    pub fn chunks_touching(&self, sectors: Range<u64>) -> Range<u64> {
        if sectors.is_empty() {
            return 0..0;
        }
        let end = sectors.end.min(self.sync_size_sectors);
        if sectors.start >= end {
            return 0..0;
        }
        self.chunk_of_sector(sectors.start)..self.chunk_of_sector(end - 1) + 1
    }

    /// Bytes of superblock and bits: what md reads and writes.
    pub fn area_bytes(&self) -> u64 {
        area_bytes(self.sync_size_sectors, u64::from(self.chunk_bytes))
    }

    /// The area rounded up to 4 KiB: the space mdadm reserves for one
    /// bitmap, and the distance between md-cluster node slots.
    pub fn reserved_bytes(&self) -> u64 {
        self.area_bytes().div_ceil(4096) * 4096
    }
}

/// The bitmap of an array whose size (md's resync unit) becomes
/// `sync_size_sectors`, as md_bitmap_resize makes it: the room is what the
/// bitmap was given (`sectors_reserved`, or, as mdadm leaves it 0, the
/// sectors the bitmap takes now), the chunk is kept if the new bits fit
/// that room and doubled until they do otherwise. A set bit stays set over
/// the sectors it covered, and every chunk of a grown region is set: md
/// marks the new space as needing a resync. The room is recorded in
/// `sectors_reserved`, as md's bitmap update writes it.
pub fn resized(bsb: &BitmapSuper, bits: &Bitmap, sync_size_sectors: u64) -> (BitmapSuper, Bitmap) {
    let room_sectors = match bsb.sectors_reserved {
        0 => bsb.area_bytes().div_ceil(512),
        reserved => u64::from(reserved),
    };
    let mut chunk_bytes = u64::from(bsb.chunk_bytes);
    while area_bytes(sync_size_sectors, chunk_bytes) > room_sectors * 512 {
        chunk_bytes *= 2;
    }
    let mut new_sb = bsb.clone();
    new_sb.sync_size_sectors = sync_size_sectors;
    new_sb.chunk_bytes = u32::try_from(chunk_bytes).expect("a bitmap chunk fits in 32 bits");
    new_sb.sectors_reserved = u32::try_from(room_sectors).expect("the bitmap room fits in 32 bits");
    let mut new_bits = Bitmap::new(new_sb.chunks(), false);
    for chunk in bits.dirty_chunks() {
        let covered = bsb.chunk_range_sectors(chunk);
        for c in new_sb.chunks_touching(covered) {
            new_bits.set(c);
        }
    }
    if sync_size_sectors > bsb.sync_size_sectors {
        for c in new_sb.chunks_touching(bsb.sync_size_sectors..sync_size_sectors) {
            new_bits.set(c);
        }
    }
    (new_sb, new_bits)
}

/// Number of bits for `sync_size_sectors` at `chunk_bytes` per bit (mdadm's
/// `bitmap_bits`, the kernel's DIV_ROUND_UP of sectors by chunk sectors).
pub fn bit_count(sync_size_sectors: u64, chunk_bytes: u64) -> u64 {
    assert!(chunk_bytes > 0, "bitmap chunk of 0 bytes");
    let bytes = u128::from(sync_size_sectors) * 512;
    u64::try_from(bytes.div_ceil(u128::from(chunk_bytes))).expect("bit count fits in u64")
}

/// Bytes the bits of `chunks` chunks take.
pub fn bits_bytes(chunks: u64) -> u64 {
    chunks.div_ceil(8)
}

/// Bytes of superblock and bits (mdadm's `calc_bitmap_size` before rounding).
pub fn area_bytes(sync_size_sectors: u64, chunk_bytes: u64) -> u64 {
    BITMAP_SUPER_BYTES as u64 + bits_bytes(bit_count(sync_size_sectors, chunk_bytes))
}

/// Where a member's internal bitmap is and how much room md leaves it, as
/// device byte offsets: `start` is the bitmap superblock, `end` the first
/// byte it must not reach (the data, the bad-block log, the superblock or
/// the end of the device). `None` when the member has no internal bitmap
/// (the feature bit is clear, or the field holds a PPL location) or the
/// offset points outside the device.
pub fn bitmap_region_bytes(sb: &MemberSuper, device_sectors: u64) -> Option<Range<u64>> {
    if !sb.has_feature(MD_FEATURE_BITMAP_OFFSET)
        || sb.feature_map & (MD_FEATURE_PPL | MD_FEATURE_MULTIPLE_PPLS) != 0
    {
        return None;
    }
    let sb_start = i128::from(sb.super_offset_sectors);
    let offset = i128::from(sb.bitmap_offset_sectors);
    let start = sb_start + offset;
    let bblog = i128::from(sb.bblog_offset_sectors);
    let has_bblog = sb.bblog_size_sectors > 0 && sb.bblog_offset_sectors != 0;
    let mut end = if offset < 0 {
        // DATA, BITMAP, [bad-block log], SUPERBLOCK (1.0).
        sb_start
    } else if sb.data_offset_sectors > sb.super_offset_sectors {
        // SUPERBLOCK, BITMAP, [bad-block log], DATA (1.1, 1.2).
        i128::from(sb.data_offset_sectors)
    } else {
        // DATA, SUPERBLOCK, BITMAP (1.0 or 0.90 with the bitmap after the
        // superblock): up to the end of the device.
        i128::from(device_sectors)
    };
    if has_bblog && bblog > offset && sb_start + bblog < end {
        end = sb_start + bblog;
    }
    end = end.min(i128::from(device_sectors));
    if start < 0 || start >= end {
        return None;
    }
    Some(start as u64 * 512..end as u64 * 512)
}

/// The bits of a bitmap, as stored on disk: little-endian bit order, bit
/// `k % 8` of byte `k / 8` for chunk `k`. Bits past the last chunk in the
/// last byte are kept as read but never counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    chunks: u64,
    bytes: Vec<u8>,
}

impl Bitmap {
    /// A bitmap of `chunks` chunks, every bit set (`dirty`) or clear.
    pub fn new(chunks: u64, dirty: bool) -> Bitmap {
        let len = usize::try_from(bits_bytes(chunks)).expect("bitmap fits in memory");
        let mut map = Bitmap {
            chunks,
            bytes: vec![0; len],
        };
        if dirty {
            map.set_all();
        }
        map
    }

    /// The bits of `chunks` chunks from the start of `bytes` (the bytes
    /// right after the bitmap superblock).
    pub fn from_bytes(bytes: &[u8], chunks: u64) -> Result<Bitmap, BitmapError> {
        let need = bits_bytes(chunks);
        if (bytes.len() as u64) < need {
            return Err(BitmapError::BufferTooShort {
                need,
                got: bytes.len() as u64,
            });
        }
        Ok(Bitmap {
            chunks,
            bytes: bytes[..need as usize].to_vec(),
        })
    }

    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// The on-disk bytes, `ceil(chunks / 8)` of them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn index(&self, chunk: u64) -> (usize, u8) {
        assert!(
            chunk < self.chunks,
            "bitmap chunk {chunk} beyond {} chunks",
            self.chunks
        );
        ((chunk / 8) as usize, 1 << (chunk % 8))
    }

    pub fn get(&self, chunk: u64) -> bool {
        let (byte, mask) = self.index(chunk);
        self.bytes[byte] & mask != 0
    }

    pub fn set(&mut self, chunk: u64) {
        let (byte, mask) = self.index(chunk);
        self.bytes[byte] |= mask;
    }

    pub fn clear(&mut self, chunk: u64) {
        let (byte, mask) = self.index(chunk);
        self.bytes[byte] &= !mask;
    }

    /// Sets every chunk's bit; bits past the last chunk stay clear.
    pub fn set_all(&mut self) {
        self.bytes.fill(0xff);
        if let Some(last) = self.bytes.last_mut() {
            *last &= Self::last_byte_mask(self.chunks);
        }
    }

    pub fn clear_all(&mut self) {
        self.bytes.fill(0);
    }

    /// The bits of the last byte that belong to chunks.
    fn last_byte_mask(chunks: u64) -> u8 {
        match chunks % 8 {
            0 => 0xff,
            n => (1u8 << n) - 1,
        }
    }

    /// Number of set (dirty) chunks; trailing bits are not chunks and are
    /// not counted, as mdadm -X does not count them.
    pub fn count_set(&self) -> u64 {
        let Some((last, full)) = self.bytes.split_last() else {
            return 0;
        };
        let full: u64 = full.iter().map(|b| u64::from(b.count_ones())).sum();
        full + u64::from((last & Self::last_byte_mask(self.chunks)).count_ones())
    }

    /// The set chunks, in increasing order.
    pub fn dirty_chunks(&self) -> impl Iterator<Item = u64> + '_ {
        self.bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != 0)
            .flat_map(|(i, b)| {
                (0..8u64)
                    .filter(move |bit| b & (1 << bit) != 0)
                    .map(move |bit| i as u64 * 8 + bit)
            })
            .filter(|chunk| *chunk < self.chunks)
    }
}

/// The bitmap area: the superblock followed by the bits, `area_bytes` long.
pub fn encode_area(sb: &BitmapSuper, bits: &Bitmap) -> Result<Vec<u8>, BitmapError> {
    if bits.chunks() != sb.chunks() {
        return Err(BitmapError::ChunkCountMismatch {
            found: bits.chunks(),
            expected: sb.chunks(),
        });
    }
    let mut buf = Vec::with_capacity(BITMAP_SUPER_BYTES + bits.as_bytes().len());
    buf.extend_from_slice(&sb.encode()?);
    buf.extend_from_slice(bits.as_bytes());
    debug_assert_eq!(buf.len() as u64, sb.area_bytes());
    Ok(buf)
}

/// Decodes a bitmap area (superblock and bits) from the start of `buf`.
pub fn decode_area(buf: &[u8]) -> Result<(BitmapSuper, Bitmap), BitmapError> {
    let sb = BitmapSuper::decode(buf)?;
    let need = sb.area_bytes();
    if (buf.len() as u64) < need {
        return Err(BitmapError::BufferTooShort {
            need,
            got: buf.len() as u64,
        });
    }
    let bits = Bitmap::from_bytes(&buf[BITMAP_SUPER_BYTES..], sb.chunks())?;
    Ok((sb, bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{
        bitmap_sync_sectors, default_internal_bitmap, ConsistencyPolicy, CreateMember, CreateSpec,
        Metadata, Role,
    };
    use proptest::prelude::*;

    fn sample() -> BitmapSuper {
        let mut sb = BitmapSuper::new(
            [
                0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
                0x66, 0x77,
            ],
            42,
            24_576,
            64 << 20,
        );
        sb.events_cleared = 40;
        sb
    }

    #[test]
    fn fields_sit_where_md_p_h_puts_them() {
        let buf = sample().encode().unwrap();
        assert_eq!(&buf[0..4], b"bitm");
        assert_eq!(le32(&buf, 4), 4);
        assert_eq!(buf[8], 0x01);
        assert_eq!(buf[23], 0x77);
        assert_eq!(le64(&buf, 24), 42);
        assert_eq!(le64(&buf, 32), 40);
        assert_eq!(le64(&buf, 40), 24_576);
        assert_eq!(le32(&buf, 48), 0);
        assert_eq!(le32(&buf, 52), 64 << 20);
        assert_eq!(le32(&buf, 56), 5);
        assert_eq!(le32(&buf, 60), 0);
        assert!(buf[64..].iter().all(|b| *b == 0));
        assert_eq!(BitmapSuper::decode(&buf).unwrap(), sample());
    }

    #[test]
    fn decode_applies_the_kernel_checks() {
        let good = sample().encode().unwrap();
        let with = |at: usize, value: u32| {
            let mut b = good;
            put32(&mut b, at, value);
            BitmapSuper::decode(&b)
        };
        assert_eq!(
            with(off::MAGIC, 0xa92b_4efc),
            Err(BitmapError::BadMagic { found: 0xa92b_4efc })
        );
        assert_eq!(
            with(off::VERSION, 2),
            Err(BitmapError::BadVersion { found: 2 })
        );
        assert_eq!(
            with(off::VERSION, 6),
            Err(BitmapError::BadVersion { found: 6 })
        );
        for version in 3..=5 {
            assert!(with(off::VERSION, version).is_ok());
        }
        assert_eq!(
            with(off::CHUNKSIZE, 256),
            Err(BitmapError::ChunkTooSmall { chunk_bytes: 256 })
        );
        assert_eq!(
            with(off::CHUNKSIZE, 3 << 10),
            Err(BitmapError::ChunkNotPowerOfTwo {
                chunk_bytes: 3 << 10
            })
        );
        assert!(with(off::CHUNKSIZE, 512).is_ok());
        assert_eq!(
            with(off::DAEMON_SLEEP, 0),
            Err(BitmapError::DaemonSleepOutOfRange { secs: 0 })
        );
        assert!(with(off::WRITE_BEHIND, COUNTER_MAX).is_ok());
        assert_eq!(
            with(off::WRITE_BEHIND, COUNTER_MAX + 1),
            Err(BitmapError::WriteBehindOutOfRange { found: 16384 })
        );
        assert_eq!(
            BitmapSuper::decode(&good[..255]),
            Err(BitmapError::BufferTooShort {
                need: 256,
                got: 255
            })
        );
        // Encoding refuses what decoding would.
        let mut bad = sample();
        bad.chunk_bytes = 1000;
        assert!(bad.encode().is_err());
    }

    #[test]
    fn encode_into_keeps_the_pad() {
        let mut buf = [0xa5u8; 300];
        sample().encode_into(&mut buf).unwrap();
        assert!(buf[off::PAD..].iter().all(|b| *b == 0xa5));
        assert_eq!(BitmapSuper::decode(&buf).unwrap(), sample());
    }

    #[test]
    fn bit_counts_follow_mdadm() {
        // mdadm bitmap_bits: ceil(sync_size * 512 / chunk).
        assert_eq!(bit_count(0, 4096), 0);
        assert_eq!(bit_count(1, 4096), 1);
        assert_eq!(bit_count(8, 4096), 1);
        assert_eq!(bit_count(9, 4096), 2);
        assert_eq!(bit_count(24_576, 64 << 20), 1);
        assert_eq!(bit_count(2 * 1024 * 1024 * 1024, 64 << 20), 16_384);
        assert_eq!(area_bytes(9, 4096), 257);
        assert_eq!(area_bytes(8 * 8 * 100 + 1, 4096), 256 + 101);
        let sb = sample();
        assert_eq!(sb.chunks(), 1);
        assert_eq!(sb.reserved_bytes(), 4096);
    }

    #[test]
    fn resizing_keeps_the_chunk_while_it_fits_and_marks_the_new_region() {
        // 64 MiB chunks over 1 GiB: 16 bits, well inside one sector.
        let bsb = BitmapSuper::new([7; 16], 5, 2 << 20, 64 << 20);
        let mut bits = Bitmap::new(bsb.chunks(), false);
        bits.set(3);
        let (grown, grown_bits) = resized(&bsb, &bits, 4 << 20);
        assert_eq!(grown.chunk_bytes, 64 << 20);
        assert_eq!(grown.sectors_reserved, 1);
        assert_eq!(grown_bits.chunks(), 32);
        let dirty: Vec<u64> = grown_bits.dirty_chunks().collect();
        assert_eq!(dirty, [3].into_iter().chain(16..32).collect::<Vec<_>>());
        // A shrink keeps what was set and marks nothing new.
        let (shrunk, shrunk_bits) = resized(&bsb, &bits, 1 << 20);
        assert_eq!(shrunk.chunk_bytes, 64 << 20);
        assert_eq!(shrunk_bits.dirty_chunks().collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn resizing_doubles_the_chunk_until_the_bits_fit_their_room() {
        // 4 KiB chunks over 8 MiB: 2048 bits, 256 + 256 bytes = 1 sector.
        let bsb = BitmapSuper::new([7; 16], 5, 16 << 10, 4096);
        let mut bits = Bitmap::new(bsb.chunks(), false);
        bits.set(2047);
        // Four times the size needs 1 KiB of bits: the chunk doubles twice.
        let (grown, grown_bits) = resized(&bsb, &bits, 64 << 10);
        assert_eq!(grown.chunk_bytes, 16384);
        assert!(grown.area_bytes() <= 512);
        assert_eq!(grown_bits.chunks(), 2048);
        // The old last chunk (sector 16376..16384) now lies in chunk 511.
        assert!(grown_bits.get(511));
        assert!(!grown_bits.get(510));
        assert!((512..2048).all(|c| grown_bits.get(c)));
    }

    #[test]
    fn chunks_map_to_sector_ranges() {
        let mut sb = sample();
        sb.chunk_bytes = 4096;
        sb.sync_size_sectors = 8 * 10 + 3;
        assert_eq!(sb.chunks(), 11);
        assert_eq!(sb.chunk_sectors(), 8);
        assert_eq!(sb.chunk_range_sectors(0), 0..8);
        assert_eq!(sb.chunk_range_sectors(10), 80..83);
        assert_eq!(sb.chunk_of_sector(7), 0);
        assert_eq!(sb.chunk_of_sector(8), 1);
        assert_eq!(sb.chunk_of_sector(82), 10);
        assert_eq!(sb.chunks_touching(7..9), 0..2);
        assert_eq!(sb.chunks_touching(8..16), 1..2);
        assert_eq!(sb.chunks_touching(80..1000), 10..11);
        assert_eq!(sb.chunks_touching(5..5), 0..0);
        assert_eq!(sb.chunks_touching(83..90), 0..0);
    }

    #[test]
    fn bits_are_little_endian_after_the_superblock() {
        let mut sb = sample();
        sb.chunk_bytes = 4096;
        sb.sync_size_sectors = 8 * 20;
        let mut bits = Bitmap::new(sb.chunks(), false);
        bits.set(0);
        bits.set(9);
        bits.set(19);
        let area = encode_area(&sb, &bits).unwrap();
        assert_eq!(area.len(), 256 + 3);
        assert_eq!(area[256], 0b0000_0001);
        assert_eq!(area[257], 0b0000_0010);
        assert_eq!(area[258], 0b0000_1000);
        let (sb2, bits2) = decode_area(&area).unwrap();
        assert_eq!(sb2, sb);
        assert_eq!(bits2, bits);
        assert_eq!(bits2.count_set(), 3);
        assert_eq!(bits2.dirty_chunks().collect::<Vec<_>>(), vec![0, 9, 19]);
        assert!(bits2.get(9) && !bits2.get(10));
    }

    #[test]
    fn set_all_and_count_ignore_trailing_bits() {
        let mut bits = Bitmap::new(11, true);
        assert_eq!(bits.as_bytes(), &[0xff, 0b0000_0111]);
        assert_eq!(bits.count_set(), 11);
        bits.clear(3);
        assert_eq!(bits.count_set(), 10);
        bits.clear_all();
        assert_eq!(bits.count_set(), 0);
        // Bits md never uses (past the last chunk) are kept but not counted.
        let read = Bitmap::from_bytes(&[0xff, 0xff, 0xee], 11).unwrap();
        assert_eq!(read.as_bytes(), &[0xff, 0xff]);
        assert_eq!(read.count_set(), 11);
        assert_eq!(read.dirty_chunks().count(), 11);
        assert_eq!(Bitmap::new(0, true).count_set(), 0);
        assert!(Bitmap::from_bytes(&[0], 9).is_err());
        let sb = sample();
        assert_eq!(
            encode_area(&sb, &Bitmap::new(2, false)),
            Err(BitmapError::ChunkCountMismatch {
                found: 2,
                expected: 1
            })
        );
    }

    /// A member superblock as uraid's create writes it with a bitmap.
    fn member_with_bitmap(metadata: Metadata, device_sectors: u64) -> MemberSuper {
        let size = crate::format::mdadm_freesize_sectors(
            metadata,
            device_sectors,
            if metadata == Metadata::V1_0 { 0 } else { 2048 },
            false,
        )
        .unwrap();
        let sync = bitmap_sync_sectors(1, 0, 2, size);
        let bm = default_internal_bitmap(metadata, size, sync, None).unwrap();
        let spec = CreateSpec {
            metadata,
            level: 1,
            layout: 0,
            chunk_sectors: 0,
            raid_disks: 2,
            size_sectors: size,
            name: "bm".into(),
            homehost: None,
            set_uuid: [7; 16],
            ctime_secs: 0,
            clean: false,
            policy: ConsistencyPolicy::Bitmap(bm),
            bad_block_log: true,
            roles: vec![Role::Active(0), Role::Active(1)],
            spare_disks: 0,
            raid0_layout_feature: false,
        };
        let member = CreateMember {
            dev_number: 0,
            device_sectors,
            data_offset_sectors: (metadata != Metadata::V1_0).then_some(2048),
            device_uuid: [1; 16],
            write_mostly: false,
            failfast: false,
        };
        MemberSuper::new_for_create(&spec, &member).unwrap()
    }

    #[test]
    fn regions_follow_mdadm_placement() {
        let dev = 64 * 2048;
        // 1.2: superblock at sector 8, bitmap 8 sectors later, up to the
        // bad-block log mdadm puts after the bitmap space.
        let sb = member_with_bitmap(Metadata::V1_2, dev);
        assert_eq!(sb.bitmap_offset_sectors, 8);
        let region = bitmap_region_bytes(&sb, dev).unwrap();
        assert_eq!(region.start, 16 * 512);
        assert_eq!(region.end, (8 + sb.bblog_offset_sectors as u64) * 512);
        assert!(region.end <= sb.data_offset_sectors * 512);
        // 1.1: superblock at 0.
        let sb = member_with_bitmap(Metadata::V1_1, dev);
        assert_eq!(bitmap_region_bytes(&sb, dev).unwrap().start, 8 * 512);
        // 1.0: before the bad-block log, which sits just before the superblock.
        let sb = member_with_bitmap(Metadata::V1_0, dev);
        assert!(sb.bitmap_offset_sectors < 0);
        let region = bitmap_region_bytes(&sb, dev).unwrap();
        let start = sb.super_offset_sectors as i64 + i64::from(sb.bitmap_offset_sectors);
        assert_eq!(region.start, start as u64 * 512);
        assert_eq!(region.end, (sb.super_offset_sectors - 8) * 512);
        assert!(region.start >= (sb.data_offset_sectors + sb.size_sectors) * 512);
        // The bitmap mdadm sized fits its region.
        let sync = bitmap_sync_sectors(1, 0, 2, sb.size_sectors);
        let bm = default_internal_bitmap(Metadata::V1_0, sb.size_sectors, sync, None).unwrap();
        assert!(area_bytes(sync, bm.chunk_bytes) <= region.end - region.start);
        // No feature bit, no region.
        let mut plain = sb.clone();
        plain.feature_map &= !MD_FEATURE_BITMAP_OFFSET;
        assert_eq!(bitmap_region_bytes(&plain, dev), None);
    }

    fn any_super() -> impl Strategy<Value = BitmapSuper> {
        (
            (3u32..=5, any::<[u8; 16]>(), any::<u64>(), any::<u64>()),
            (any::<u64>(), any::<u32>(), 9u32..32, 1u32..100_000),
            (
                0u32..=COUNTER_MAX,
                any::<u32>(),
                any::<u32>(),
                any::<[u8; 32]>(),
            ),
        )
            .prop_map(
                |(
                    (version, uuid, events, events_cleared),
                    (sync, state, shift, daemon),
                    (write_behind, reserved, nodes, name),
                )| {
                    let mut cluster_name = [0u8; CLUSTER_NAME_BYTES];
                    cluster_name[..32].copy_from_slice(&name);
                    BitmapSuper {
                        version,
                        uuid,
                        events,
                        events_cleared,
                        sync_size_sectors: sync,
                        state,
                        chunk_bytes: 1 << shift,
                        daemon_sleep_secs: daemon,
                        write_behind,
                        sectors_reserved: reserved,
                        nodes,
                        cluster_name,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn superblock_round_trips(sb in any_super()) {
            let buf = sb.encode().unwrap();
            prop_assert_eq!(BitmapSuper::decode(&buf).unwrap(), sb.clone());
            prop_assert_eq!(BitmapSuper::decode(&buf).unwrap().encode().unwrap(), buf);
        }

        #[test]
        fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            // With the magic in place, so that the field checks are reached.
            let mut buf = buf;
            if buf.len() >= 4 {
                buf[..4].copy_from_slice(b"bitm");
            }
            if let Ok(sb) = BitmapSuper::decode(&buf) {
                prop_assert_eq!(&sb.encode().unwrap()[..136], &buf[..136]);
            }
        }

        #[test]
        fn area_round_trips(
            sb in any_super(),
            sectors in 0u64..20_000,
            dirty in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            let mut sb = sb;
            sb.sync_size_sectors = sectors;
            let chunks = sb.chunks();
            let mut bits = Bitmap::new(chunks, false);
            let mut expected = std::collections::BTreeSet::new();
            if chunks > 0 {
                for i in &dirty {
                    let k = i.index(chunks as usize) as u64;
                    bits.set(k);
                    expected.insert(k);
                }
            }
            let area = encode_area(&sb, &bits).unwrap();
            prop_assert_eq!(area.len() as u64, sb.area_bytes());
            let (sb2, bits2) = decode_area(&area).unwrap();
            prop_assert_eq!(&sb2, &sb);
            prop_assert_eq!(bits2.count_set(), expected.len() as u64);
            prop_assert_eq!(bits2.dirty_chunks().collect::<Vec<_>>(), expected.into_iter().collect::<Vec<_>>());
            for k in 0..chunks {
                let range = sb.chunk_range_sectors(k);
                prop_assert!(!range.is_empty());
                prop_assert_eq!(sb.chunk_of_sector(range.start), k);
                prop_assert_eq!(sb.chunk_of_sector(range.end - 1), k);
            }
        }
    }

    /// mdadm -X reads a bitmap *file* from its first byte, so an encoded
    /// area written to a plain file is what it parses. Skipped without mdadm.
    #[test]
    fn mdadm_examine_bitmap_reads_our_area() {
        let Some(mdadm) = ["/usr/sbin/mdadm", "/sbin/mdadm"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.exists())
        else {
            return;
        };
        let mut sb = sample();
        sb.chunk_bytes = 4096;
        sb.sync_size_sectors = 8 * 1000 + 5;
        let mut bits = Bitmap::new(sb.chunks(), false);
        for k in (0..sb.chunks()).step_by(7) {
            bits.set(k);
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), encode_area(&sb, &bits).unwrap()).unwrap();
        let out = std::process::Command::new(mdadm)
            .arg("--examine-bitmap")
            .arg(file.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let field = |label: &str| {
            text.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(" : ")?;
                    (k.trim() == label).then(|| v.trim().to_string())
                })
                .unwrap_or_else(|| panic!("no {label} in {text}"))
        };
        assert_eq!(field("Magic"), "6d746962");
        assert_eq!(field("Version"), "4");
        assert_eq!(field("UUID"), "01234567:89abcdef:00112233:44556677");
        assert_eq!(field("Events"), "42");
        assert_eq!(field("Events Cleared"), "40");
        assert_eq!(field("State"), "OK");
        assert_eq!(field("Chunksize"), "4 KB");
        assert_eq!(field("Sync Size"), "4002");
        assert_eq!(
            field("Bitmap"),
            format!(
                "1001 bits (chunks), {} dirty ({:.1}%)",
                bits.count_set(),
                100.0 * bits.count_set() as f64 / 1001.0
            )
        );
    }
}
