//! md's raid5-cache write journal: the on-disk records, pure.
//!
//! A journal device (dev_roles 0xfffd, feature JOURNAL on every member) holds
//! a ring of 4 KiB blocks over its data area. The log is a chain of *I/O
//! units*: one meta block ([`MetaBlock`]) that lists its payloads, followed
//! by the payloads' 4 KiB pages. A unit is valid when its meta block has the
//! magic, version 1, the sequence number one past the unit before it, its
//! own position, and a matching checksum, and every page it lists matches
//! its checksum; the chain ends at the first unit that is not valid. The
//! superblock of the journal device names where the chain starts
//! (`journal_tail`, in the recovery_offset field).
//!
//! Layout facts (uapi md_p.h `r5l_meta_block`, `r5l_payload_data_parity`,
//! `r5l_payload_flush`; drivers/md/raid5-cache.c), all little-endian:
//!
//! | off | meta block field |
//! |---:|---|
//! | 0 | magic 0x6433c509 |
//! | 4 | checksum |
//! | 8 | version (u8) = 1, then 3 zero bytes |
//! | 12 | meta_size: bytes of the block in use (header and payloads) |
//! | 16 | seq (u64) |
//! | 24 | position (u64): sectors from the journal's data_offset |
//! | 32 | payloads |
//!
//! A data or parity payload is type (u16), flags (u16), size (u32, sectors),
//! location (u64), then one checksum (u32) per 4 KiB page. Data pages are
//! located by *array* sector; parity by *stripe* sector (the member sector,
//! from data_offset, of the 4 KiB row of pages: md's `sh->sector`), with P
//! and, for raid6, Q in one payload of two pages. A flush payload is type,
//! flags, size (bytes of the list), then that many bytes of u64 stripe
//! sectors: write-back mode only.
//!
//! Checksums are the kernel's `crc32c_le` seeded with the array UUID's own
//! `crc32c_le(~0, uuid)`, with no final inversion: in terms of the standard
//! CRC-32C, `!crc32c(uuid ‖ bytes)`. A meta block is checksummed whole
//! (4 KiB) with its checksum field zero.

/// `R5LOG_MAGIC`.
pub const MAGIC: u32 = 0x6433_c509;
/// `R5LOG_VERSION`.
pub const VERSION: u8 = 1;
/// The log's block: a meta block, or one page of data or parity.
pub const BLOCK_BYTES: usize = 4096;
/// `BLOCK_SECTORS`.
pub const BLOCK_SECTORS: u64 = 8;
/// Bytes of the meta block header.
pub const HEADER_BYTES: usize = 32;
/// Bytes of a data/parity payload before its checksums.
pub const PAYLOAD_HEAD_BYTES: usize = 16;
/// `R5LOG_PAYLOAD_DATA`, `_PARITY`, `_FLUSH`.
pub const PAYLOAD_DATA: u16 = 0;
pub const PAYLOAD_PARITY: u16 = 1;
pub const PAYLOAD_FLUSH: u16 = 2;
/// `R5LOG_PAYLOAD_FLAG_DISCARD`: a data payload that discards its range.
pub const FLAG_DISCARD: u16 = 1;

/// One payload of a meta block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Pages of data at array sector `location`, one checksum each.
    Data {
        location: u64,
        flags: u16,
        checksums: Vec<u32>,
    },
    /// The parity pages (P, then Q on raid6) of the row of pages at stripe
    /// sector `location`.
    Parity { location: u64, checksums: Vec<u32> },
    /// Stripes whose cached data reached the members (write-back mode).
    Flush { stripes: Vec<u64> },
}

impl Payload {
    /// Bytes the payload takes in the meta block.
    pub fn meta_bytes(&self) -> usize {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => {
                PAYLOAD_HEAD_BYTES + 4 * checksums.len()
            }
            Payload::Flush { stripes } => 8 + 8 * stripes.len(),
        }
    }

    /// Pages that follow the meta block for this payload.
    pub fn pages(&self) -> usize {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => checksums.len(),
            Payload::Flush { .. } => 0,
        }
    }
}

/// A decoded (or to-be-encoded) meta block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaBlock {
    pub seq: u64,
    /// Its own place in the ring, in sectors from the data offset.
    pub position: u64,
    pub payloads: Vec<Payload>,
}

impl MetaBlock {
    /// Bytes of the block in use (md's meta_size).
    pub fn meta_size(&self) -> usize {
        HEADER_BYTES + self.payloads.iter().map(Payload::meta_bytes).sum::<usize>()
    }

    /// Pages that follow the block.
    pub fn pages(&self) -> usize {
        self.payloads.iter().map(Payload::pages).sum()
    }

    /// Whether `more` payload bytes still fit in the block.
    pub fn fits(&self, more: usize) -> bool {
        self.meta_size() + more <= BLOCK_BYTES
    }
}

/// The seed every checksum of an array's journal starts from: the kernel's
/// `crc32c_le(~0, uuid)`, which is the standard CRC-32C inverted.
pub fn uuid_seed(set_uuid: &[u8; 16]) -> u32 {
    !crc32c::crc32c(set_uuid)
}

/// `crc32c_le(seed, bytes)` for a seed from [`uuid_seed`]: the raw CRC
/// register carried on (the crate's functions take and give the inverted
/// register).
pub fn checksum(seed: u32, bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, bytes)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalFormatError {
    #[error("the meta block's payloads take {0} bytes, more than a 4 KiB block")]
    TooLarge(usize),
    #[error("a payload of {0} pages: a data or parity payload holds 1 to 2 pages here")]
    BadPageCount(usize),
}

/// Encodes a meta block for an array whose journal checksums start from
/// `seed`.
pub fn encode(block: &MetaBlock, seed: u32) -> Result<Vec<u8>, JournalFormatError> {
    let size = block.meta_size();
    if size > BLOCK_BYTES {
        return Err(JournalFormatError::TooLarge(size));
    }
    let mut out = vec![0u8; BLOCK_BYTES];
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[8] = VERSION;
    out[12..16].copy_from_slice(&(size as u32).to_le_bytes());
    out[16..24].copy_from_slice(&block.seq.to_le_bytes());
    out[24..32].copy_from_slice(&block.position.to_le_bytes());
    let mut at = HEADER_BYTES;
    for payload in &block.payloads {
        match payload {
            Payload::Data {
                location,
                flags,
                checksums,
            } => {
                put_data_parity(
                    &mut out,
                    &mut at,
                    PAYLOAD_DATA,
                    *flags,
                    *location,
                    checksums,
                )?;
            }
            Payload::Parity {
                location,
                checksums,
            } => {
                put_data_parity(&mut out, &mut at, PAYLOAD_PARITY, 0, *location, checksums)?;
            }
            Payload::Flush { stripes } => {
                out[at..at + 2].copy_from_slice(&PAYLOAD_FLUSH.to_le_bytes());
                out[at + 4..at + 8].copy_from_slice(&((8 * stripes.len()) as u32).to_le_bytes());
                at += 8;
                for s in stripes {
                    out[at..at + 8].copy_from_slice(&s.to_le_bytes());
                    at += 8;
                }
            }
        }
    }
    debug_assert_eq!(at, size);
    let sum = checksum(seed, &out);
    out[4..8].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

fn put_data_parity(
    out: &mut [u8],
    at: &mut usize,
    kind: u16,
    flags: u16,
    location: u64,
    checksums: &[u32],
) -> Result<(), JournalFormatError> {
    if checksums.is_empty() || checksums.len() > 2 {
        return Err(JournalFormatError::BadPageCount(checksums.len()));
    }
    let a = *at;
    out[a..a + 2].copy_from_slice(&kind.to_le_bytes());
    out[a + 2..a + 4].copy_from_slice(&flags.to_le_bytes());
    let sectors = BLOCK_SECTORS as u32 * checksums.len() as u32;
    out[a + 4..a + 8].copy_from_slice(&sectors.to_le_bytes());
    out[a + 8..a + 16].copy_from_slice(&location.to_le_bytes());
    for (i, c) in checksums.iter().enumerate() {
        out[a + 16 + 4 * i..a + 20 + 4 * i].copy_from_slice(&c.to_le_bytes());
    }
    *at = a + PAYLOAD_HEAD_BYTES + 4 * checksums.len();
    Ok(())
}

/// Why a block is not the meta block the chain expects (the chain ends
/// there; none of these is an error of the array).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotMeta {
    Magic,
    Version,
    Checksum,
    /// It was written for another place (a stale block of an earlier lap).
    Position {
        found: u64,
    },
    MetaSize(u32),
    /// A payload runs past meta_size or has an unknown type.
    Payload,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Decodes the 4 KiB block read at `position`, as the kernel's
/// r5l_recovery_read_meta_block checks it (the sequence number is the
/// caller's to check: the chain's first block sets it).
pub fn decode(block: &[u8], position: u64, seed: u32) -> Result<MetaBlock, NotMeta> {
    assert_eq!(block.len(), BLOCK_BYTES);
    if le32(block, 0) != MAGIC {
        return Err(NotMeta::Magic);
    }
    if block[8] != VERSION {
        return Err(NotMeta::Version);
    }
    let stored = le32(block, 4);
    let mut zeroed = block.to_vec();
    zeroed[4..8].fill(0);
    if checksum(seed, &zeroed) != stored {
        return Err(NotMeta::Checksum);
    }
    let found = le64(block, 24);
    if found != position {
        return Err(NotMeta::Position { found });
    }
    let meta_size = le32(block, 12);
    if (meta_size as usize) < HEADER_BYTES || meta_size as usize > BLOCK_BYTES {
        return Err(NotMeta::MetaSize(meta_size));
    }
    let end = meta_size as usize;
    let mut payloads = Vec::new();
    let mut at = HEADER_BYTES;
    while at < end {
        if at + 8 > end {
            return Err(NotMeta::Payload);
        }
        let kind = le16(block, at);
        let flags = le16(block, at + 2);
        match kind {
            PAYLOAD_DATA | PAYLOAD_PARITY => {
                if at + PAYLOAD_HEAD_BYTES > end {
                    return Err(NotMeta::Payload);
                }
                let sectors = le32(block, at + 4) as u64;
                let pages = (sectors / BLOCK_SECTORS) as usize;
                if !sectors.is_multiple_of(BLOCK_SECTORS) || pages == 0 {
                    return Err(NotMeta::Payload);
                }
                let location = le64(block, at + 8);
                let sums_at = at + PAYLOAD_HEAD_BYTES;
                if sums_at + 4 * pages > end {
                    return Err(NotMeta::Payload);
                }
                let checksums = (0..pages).map(|i| le32(block, sums_at + 4 * i)).collect();
                payloads.push(if kind == PAYLOAD_DATA {
                    Payload::Data {
                        location,
                        flags,
                        checksums,
                    }
                } else {
                    Payload::Parity {
                        location,
                        checksums,
                    }
                });
                at = sums_at + 4 * pages;
            }
            PAYLOAD_FLUSH => {
                let bytes = le32(block, at + 4) as usize;
                if !bytes.is_multiple_of(8) || at + 8 + bytes > end {
                    return Err(NotMeta::Payload);
                }
                let stripes = (0..bytes / 8)
                    .map(|i| le64(block, at + 8 + 8 * i))
                    .collect();
                payloads.push(Payload::Flush { stripes });
                at += 8 + bytes;
            }
            _ => return Err(NotMeta::Payload),
        }
    }
    Ok(MetaBlock {
        seq: le64(block, 16),
        position: found,
        payloads,
    })
}

/// The smallest ring uraid runs a journal with: room for four of the
/// largest things one writer logs at once (a chunk's columns, a page per
/// member each, and the meta blocks listing them), so that freeing space
/// never waits on the writer that asks for it.
pub fn min_ring_sectors(chunk_sectors: u64, raid_disks: usize) -> u64 {
    let pages = (chunk_sectors.max(BLOCK_SECTORS) / BLOCK_SECTORS) as usize * raid_disks;
    let per_meta = (BLOCK_BYTES - HEADER_BYTES) / (PAYLOAD_HEAD_BYTES + 4);
    4 * (pages + pages / per_meta + 2) as u64 * BLOCK_SECTORS
}

/// The ring's arithmetic: `pos` advanced by `sectors`, wrapping at the
/// ring's end (md's r5l_ring_add over a ring of `ring_sectors`, the journal's
/// data size rounded down to whole blocks).
pub fn ring_add(pos: u64, sectors: u64, ring_sectors: u64) -> u64 {
    debug_assert!(pos < ring_sectors && sectors <= ring_sectors);
    let next = pos + sectors;
    if next >= ring_sectors {
        next - ring_sectors
    } else {
        next
    }
}

/// Sectors from `from` forward to `to` on the ring.
pub fn ring_distance(from: u64, to: u64, ring_sectors: u64) -> u64 {
    if to >= from {
        to - from
    } else {
        to + ring_sectors - from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [
        0x8b, 0x2d, 0x8c, 0x4e, 0x16, 0x33, 0x6e, 0xc7, 0xa2, 0x41, 0x3b, 0x0f, 0x57, 0x15, 0x0e,
        0x3a,
    ];

    /// The kernel's crc32c_le(seed, p) is the raw (uninverted) CRC register
    /// run over p from `seed`: a bitwise reference of exactly that, to pin
    /// the algebra between it and the crate's standard CRC-32C.
    fn crc32c_le_reference(mut crc: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    #[test]
    fn checksums_are_the_kernels_crc32c_le_from_the_uuid_seed() {
        // CRC-32C's check value: "123456789" -> 0xe3069283.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let seed = uuid_seed(&UUID);
        assert_eq!(seed, crc32c_le_reference(!0, &UUID));
        let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(checksum(seed, &page), crc32c_le_reference(seed, &page));
        let mut whole = UUID.to_vec();
        whole.extend_from_slice(&page);
        assert_eq!(checksum(seed, &page), !crc32c::crc32c(&whole));
    }

    /// Vectors computed independently of this code (a bitwise raw CRC in
    /// Python) for the UUID 00 01 .. 0f.
    #[test]
    fn known_vectors() {
        let uuid: [u8; 16] = core::array::from_fn(|i| i as u8);
        let seed = uuid_seed(&uuid);
        assert_eq!(seed, 0x2636_f714);
        assert_eq!(checksum(seed, &[0u8; 4096]), 0xb330_4a14);
        let empty = MetaBlock {
            seq: 0x1234_5678,
            position: 0,
            payloads: vec![],
        };
        let bytes = encode(&empty, seed).unwrap();
        assert_eq!(le32(&bytes, 4), 0x3a25_ca64);
        assert_eq!(le32(&bytes, 12), 32);
    }

    fn sample() -> MetaBlock {
        MetaBlock {
            seq: 0x1234_5678_9abc,
            position: 4096,
            payloads: vec![
                Payload::Data {
                    location: 1_000_000,
                    flags: 0,
                    checksums: vec![0xdead_beef],
                },
                Payload::Data {
                    location: 1_000_128,
                    flags: 0,
                    checksums: vec![7],
                },
                Payload::Parity {
                    location: 333_336,
                    checksums: vec![1, 2],
                },
                Payload::Flush {
                    stripes: vec![8, 16, 24],
                },
            ],
        }
    }

    #[test]
    fn encode_decode_round_trip_with_the_kernels_field_offsets() {
        let seed = uuid_seed(&UUID);
        let block = sample();
        let bytes = encode(&block, seed).unwrap();
        assert_eq!(le32(&bytes, 0), MAGIC);
        assert_eq!(bytes[8], 1);
        assert_eq!(le32(&bytes, 12) as usize, 32 + 20 + 20 + 24 + 32);
        assert_eq!(le64(&bytes, 16), block.seq);
        assert_eq!(le64(&bytes, 24), 4096);
        // First payload: type 0, flags 0, 8 sectors, location, checksum.
        assert_eq!(le16(&bytes, 32), 0);
        assert_eq!(le32(&bytes, 36), 8);
        assert_eq!(le64(&bytes, 40), 1_000_000);
        assert_eq!(le32(&bytes, 48), 0xdead_beef);
        // Parity of raid6: 16 sectors, two checksums.
        assert_eq!(le16(&bytes, 72), 1);
        assert_eq!(le32(&bytes, 76), 16);
        // The unused rest of the block is zero.
        assert!(bytes[block.meta_size()..].iter().all(|&b| b == 0));
        assert_eq!(decode(&bytes, 4096, seed).unwrap(), block);
        assert_eq!(block.pages(), 4);
    }

    #[test]
    fn a_block_is_refused_for_every_reason_the_kernel_refuses_it() {
        let seed = uuid_seed(&UUID);
        let bytes = encode(&sample(), seed).unwrap();
        assert_eq!(
            decode(&bytes, 8, seed),
            Err(NotMeta::Position { found: 4096 })
        );
        assert_eq!(decode(&bytes, 4096, seed ^ 1), Err(NotMeta::Checksum));
        for at in [0usize, 8, 12, 100, 4095] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, 4096, seed).is_err(), "byte {at} flipped");
        }
        assert_eq!(decode(&[0u8; 4096], 0, seed), Err(NotMeta::Magic));
        // A payload past meta_size, even with a good checksum.
        let mut short = bytes.clone();
        short[12..16].copy_from_slice(&40u32.to_le_bytes());
        short[4..8].fill(0);
        let sum = checksum(seed, &short);
        short[4..8].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(decode(&short, 4096, seed), Err(NotMeta::Payload));
    }

    #[test]
    fn an_overfull_block_is_refused() {
        let block = MetaBlock {
            seq: 1,
            position: 0,
            payloads: vec![
                Payload::Data {
                    location: 0,
                    flags: 0,
                    checksums: vec![0],
                };
                204
            ],
        };
        assert!(!block.fits(0));
        assert!(matches!(
            encode(&block, 0),
            Err(JournalFormatError::TooLarge(_))
        ));
    }

    #[test]
    fn the_ring_wraps() {
        assert_eq!(ring_add(0, 8, 64), 8);
        assert_eq!(ring_add(56, 8, 64), 0);
        assert_eq!(ring_add(60, 8, 64), 4);
        assert_eq!(ring_distance(56, 8, 64), 16);
        assert_eq!(ring_distance(8, 8, 64), 0);
    }
}
