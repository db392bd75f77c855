//! The integrity layer: a CRC32C of every 4 KiB block of a member's md data
//! area, kept where md does not look, so that a block a disk returns wrong
//! without an error is found on every read and corrected from redundancy.
//!
//! **Where the checksums live.** `IntegrityMember` wraps a member as
//! dm-integrity would sit under md, but keeps its checksums on the same
//! member, in a *region* right after md's data area
//! (`IntegrityLayout::after_data`). With metadata 1.1 and 1.2 md keeps its
//! superblock and write-intent bitmap before the data and never reads or
//! writes past `data_offset + data_size`; create keeps the region out of
//! md's reach by giving md no more than `IntegrityLayout::usable_bytes` of
//! the device, so the kernel can assemble the same members and simply never
//! sees the region. The region is a header block, an *untrusted* bitmap (one
//! bit a data block) and the table (one little-endian u32 a data block);
//! all of it is loaded into memory at open.
//!
//! **What a checksum covers.** One checksum covers one whole 4 KiB block of
//! the data area (md's page, the smallest write safe on 4Kn disks), at its
//! member offset; I/O outside the data area (superblock, bitmap, a tail of
//! less than a block) passes through unchecked. A write stores the new
//! checksums after the inner write succeeded; a write that covers a block
//! only in part reads the old block first and checksums the merged block,
//! and if those old bytes were already wrong the block becomes untrusted
//! rather than blessing them. A failed write leaves unknown bytes on the
//! media, so its blocks become untrusted too.
//!
//! **Reads racing writes.** Reads verify optimistically, without a lock: a
//! read that meets a write may see the new bytes with the old checksum, or
//! the reverse. Writers hold the locks of their blocks' groups across the
//! data write and the table update, so a read that finds a mismatch reads
//! those blocks again under the same locks and only reports what is still
//! wrong then. A mismatch is an `io::Error` of kind `InvalidData` carrying a
//! `ChecksumMismatch`, which the engine corrects from redundancy as it
//! corrects a read error; the `MismatchSink` hears of every bad block.
//!
//! **What is durable when.** Checksum and bitmap pages are written at
//! `flush` and `close`, not with each write: a write only dirties the pages
//! it changed in memory. After a crash, the blocks written since the last
//! flush may carry stale checksums on disk; `mark_open` clears the header's
//! CLEAN flag at start so that the next open sees the crash, and the engine
//! then marks the rows that were in flight untrusted through `untrust`.
//!
//! **Untrusted.** A block is untrusted when its checksum is not known: never
//! derived since format, discarded, written behind uraid's back, or made
//! unknown by a failed write. Untrusted blocks are read without
//! verification; they become trusted again when they are written whole
//! through this layer or when a job that found their row consistent
//! `derive`s their checksum.

use super::aligned::{give_bounce, take_bounce};
use super::{check_io, AlignedBuf, Member, MemberRef};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

/// The unit a checksum covers: md's page (STRIPE_SIZE), the smallest write
/// safe on 4Kn members.
pub const INTEGRITY_BLOCK_BYTES: u64 = 4096;

const BLOCK_BYTES: usize = INTEGRITY_BLOCK_BYTES as usize;
/// Every page of the region (header, bitmap, table) is one block.
const PAGE_BYTES: u64 = INTEGRITY_BLOCK_BYTES;
/// Blocks whose untrusted bits fill one bitmap page.
const BITMAP_PAGE_BLOCKS: u64 = PAGE_BYTES * 8;
/// Blocks whose checksums fill one table page.
const TABLE_PAGE_BLOCKS: u64 = PAGE_BYTES / 4;
/// Untrusted words (64 blocks each) in one bitmap page.
const BITMAP_PAGE_WORDS: usize = (BITMAP_PAGE_BLOCKS / 64) as usize;

/// Blocks that share one lock: 64 KiB, a typical stripe unit, so that a
/// strip write takes one or two locks.
const GROUP_BLOCKS: u64 = 16;
/// Locks in the fixed array that groups map to (group % LOCKS_COUNT): few
/// enough to cost nothing, enough that unrelated writes rarely share one.
const LOCKS_COUNT: usize = 1024;
/// The largest piece of I/O the layer does itself (loading the region,
/// writing dirty pages, deriving from disk).
const CHUNK_BYTES_MAX: usize = 1 << 20;

const MAGIC: [u8; 8] = *b"uraidIC1";
const VERSION: u32 = 1;
const ALGORITHM_CRC32C: u32 = 1;
const FLAG_CLEAN: u32 = 1;

// Header field offsets (little endian); the last 4 bytes are the crc32c of
// the rest.
const AT_VERSION: usize = 8;
const AT_ALGORITHM: usize = 12;
const AT_BLOCK_BYTES: usize = 16;
const AT_SET_UUID: usize = 20;
const AT_DEV_UUID: usize = 36;
const AT_DATA_START: usize = 52;
const AT_DATA_BYTES: usize = 60;
const AT_EVENTS: usize = 68;
const AT_FLAGS: usize = 76;
/// Where the region starts: not derivable from the two data fields when
/// md's data area ends in a tail of less than a block (the region then
/// starts a block further on).
const AT_REGION_START: usize = 80;
const HEADER_FIELDS_END: usize = 88;
const AT_HEADER_CRC: usize = BLOCK_BYTES - 4;
const _: () = assert!(HEADER_FIELDS_END <= AT_HEADER_CRC);

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

fn round_down(value: u64, to: u64) -> u64 {
    value / to * to
}

fn block_aligned(value: u64) -> bool {
    value.is_multiple_of(INTEGRITY_BLOCK_BYTES)
}

fn bitmap_bytes_for(blocks: u64) -> u64 {
    round_up(blocks.div_ceil(8), PAGE_BYTES)
}

fn table_bytes_for(blocks: u64) -> u64 {
    round_up(blocks * 4, PAGE_BYTES)
}

fn region_bytes_for(blocks: u64) -> u64 {
    PAGE_BYTES + bitmap_bytes_for(blocks) + table_bytes_for(blocks)
}

/// Where a member's data area and its checksum region lie (member bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntegrityLayout {
    pub data_start_bytes: u64,
    pub data_bytes: u64,
    pub region_start_bytes: u64,
}

impl IntegrityLayout {
    /// The region right after the data area: md's data area may end in a
    /// tail of less than a block, which md uses but no checksum covers, so
    /// the region starts at the data's end rounded up.
    pub fn after_data(data_start_bytes: u64, data_bytes: u64) -> Self {
        assert!(
            block_aligned(data_start_bytes),
            "data start {data_start_bytes} is not 4 KiB aligned"
        );
        let layout = IntegrityLayout {
            data_start_bytes,
            data_bytes: round_down(data_bytes, INTEGRITY_BLOCK_BYTES),
            region_start_bytes: round_up(data_start_bytes + data_bytes, INTEGRITY_BLOCK_BYTES),
        };
        layout.assert_valid();
        layout
    }

    /// What every layout must be, where it is built and where it is used.
    fn assert_valid(&self) {
        assert!(block_aligned(self.data_start_bytes), "{self:?}");
        assert!(block_aligned(self.data_bytes), "{self:?}");
        assert!(block_aligned(self.region_start_bytes), "{self:?}");
        assert!(self.region_start_bytes >= self.data_end_bytes(), "{self:?}");
        assert!(
            self.region_start_bytes - self.data_end_bytes() <= PAGE_BYTES,
            "{self:?}"
        );
    }

    fn data_end_bytes(&self) -> u64 {
        self.data_start_bytes + self.data_bytes
    }

    pub fn blocks(&self) -> u64 {
        self.data_bytes / INTEGRITY_BLOCK_BYTES
    }

    pub fn bitmap_bytes(&self) -> u64 {
        bitmap_bytes_for(self.blocks())
    }

    pub fn table_bytes(&self) -> u64 {
        table_bytes_for(self.blocks())
    }

    pub fn region_bytes(&self) -> u64 {
        region_bytes_for(self.blocks())
    }

    pub fn end_bytes(&self) -> u64 {
        self.region_start_bytes + self.region_bytes()
    }

    /// What create keeps out of md's reach on a device of `device_bytes`:
    /// the region is reserved for as many blocks as the whole device holds,
    /// so that whatever the data area's start, the region after it fits.
    pub fn usable_bytes(device_bytes: u64) -> Option<u64> {
        let whole_bytes = round_down(device_bytes, INTEGRITY_BLOCK_BYTES);
        let reserve_bytes = region_bytes_for(whole_bytes / INTEGRITY_BLOCK_BYTES);
        let usable = whole_bytes.checked_sub(reserve_bytes).filter(|&u| u > 0)?;
        assert!(block_aligned(usable));
        assert!(usable + region_bytes_for(usable / INTEGRITY_BLOCK_BYTES) <= device_bytes);
        Some(usable)
    }

    fn bitmap_pages(&self) -> u64 {
        self.bitmap_bytes() / PAGE_BYTES
    }

    /// Bitmap and table pages: every page of the region but the header.
    fn region_pages(&self) -> u64 {
        (self.bitmap_bytes() + self.table_bytes()) / PAGE_BYTES
    }

    /// The member offset of a bitmap or table page (numbered after the
    /// header, bitmap first).
    fn page_offset_bytes(&self, page: u64) -> u64 {
        assert!(page < self.region_pages());
        self.region_start_bytes + PAGE_BYTES * (1 + page)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityHeader {
    pub set_uuid: [u8; 16],
    pub dev_uuid: [u8; 16],
    pub layout: IntegrityLayout,
    pub events: u64,
    pub clean: bool,
}

fn u32_at(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"))
}

impl IntegrityHeader {
    pub fn encode(&self) -> Vec<u8> {
        self.layout.assert_valid();
        let mut block = vec![0u8; BLOCK_BYTES];
        block[..8].copy_from_slice(&MAGIC);
        block[AT_VERSION..][..4].copy_from_slice(&VERSION.to_le_bytes());
        block[AT_ALGORITHM..][..4].copy_from_slice(&ALGORITHM_CRC32C.to_le_bytes());
        block[AT_BLOCK_BYTES..][..4].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        block[AT_SET_UUID..][..16].copy_from_slice(&self.set_uuid);
        block[AT_DEV_UUID..][..16].copy_from_slice(&self.dev_uuid);
        let layout = &self.layout;
        block[AT_DATA_START..][..8].copy_from_slice(&layout.data_start_bytes.to_le_bytes());
        block[AT_DATA_BYTES..][..8].copy_from_slice(&layout.data_bytes.to_le_bytes());
        block[AT_EVENTS..][..8].copy_from_slice(&self.events.to_le_bytes());
        let flags = if self.clean { FLAG_CLEAN } else { 0 };
        block[AT_FLAGS..][..4].copy_from_slice(&flags.to_le_bytes());
        block[AT_REGION_START..][..8].copy_from_slice(&layout.region_start_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&block[..AT_HEADER_CRC]);
        block[AT_HEADER_CRC..].copy_from_slice(&crc.to_le_bytes());
        block
    }

    /// Ok(None) when the block holds no integrity header at all; a one-line
    /// Err when it does but cannot be used.
    pub fn decode(block: &[u8]) -> Result<Option<Self>, String> {
        if block.len() < MAGIC.len() || block[..MAGIC.len()] != MAGIC {
            return Ok(None);
        }
        if block.len() < BLOCK_BYTES {
            return Err(format!(
                "integrity header is {} bytes, not {BLOCK_BYTES}",
                block.len()
            ));
        }
        Self::check_fixed_fields(block)?;
        let header = IntegrityHeader {
            set_uuid: block[AT_SET_UUID..][..16].try_into().expect("16 bytes"),
            dev_uuid: block[AT_DEV_UUID..][..16].try_into().expect("16 bytes"),
            layout: Self::decode_layout(block)?,
            events: u64_at(block, AT_EVENTS),
            clean: u32_at(block, AT_FLAGS) & FLAG_CLEAN != 0,
        };
        header.layout.assert_valid();
        Ok(Some(header))
    }

    fn check_fixed_fields(block: &[u8]) -> Result<(), String> {
        let stored = u32_at(block, AT_HEADER_CRC);
        let computed = crc32c::crc32c(&block[..AT_HEADER_CRC]);
        if stored != computed {
            return Err(format!(
                "integrity header checksum is wrong (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let version = u32_at(block, AT_VERSION);
        if version != VERSION {
            return Err(format!(
                "integrity header version {version}, this uraid knows {VERSION}"
            ));
        }
        let algorithm = u32_at(block, AT_ALGORITHM);
        if algorithm != ALGORITHM_CRC32C {
            return Err(format!(
                "integrity checksum algorithm {algorithm} is unknown (crc32c is {ALGORITHM_CRC32C})"
            ));
        }
        let block_bytes = u32_at(block, AT_BLOCK_BYTES);
        if block_bytes as usize != BLOCK_BYTES {
            return Err(format!(
                "integrity block size {block_bytes}, this uraid knows {BLOCK_BYTES}"
            ));
        }
        Ok(())
    }

    /// The layout a header states, refused (rather than asserted) when its
    /// fields cannot be a layout: the crc only says it was written so.
    fn decode_layout(block: &[u8]) -> Result<IntegrityLayout, String> {
        let layout = IntegrityLayout {
            data_start_bytes: u64_at(block, AT_DATA_START),
            data_bytes: u64_at(block, AT_DATA_BYTES),
            region_start_bytes: u64_at(block, AT_REGION_START),
        };
        let aligned = block_aligned(layout.data_start_bytes)
            && block_aligned(layout.data_bytes)
            && block_aligned(layout.region_start_bytes);
        let data_end = layout.data_start_bytes.checked_add(layout.data_bytes);
        let after = data_end.is_some_and(|end| {
            layout.region_start_bytes == end || layout.region_start_bytes == end + PAGE_BYTES
        });
        if !aligned || !after {
            return Err(format!(
                "integrity header states an impossible layout (data at {}+{}, region at {})",
                layout.data_start_bytes, layout.data_bytes, layout.region_start_bytes
            ));
        }
        Ok(layout)
    }
}

#[derive(Debug)]
pub struct ChecksumMismatch {
    pub member: String,
    pub offset_bytes: u64,
    pub blocks: u64,
}

impl std::fmt::Display for ChecksumMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: checksum mismatch at sector {} ({} block(s) of 4 KiB)",
            self.member,
            self.offset_bytes / 512,
            self.blocks
        )
    }
}

impl std::error::Error for ChecksumMismatch {}

/// The mismatch an error carries: directly, inside an `io::Error` that
/// wraps the layer's error, or as the source of the error it carries.
pub fn checksum_mismatch(error: &io::Error) -> Option<&ChecksumMismatch> {
    let carried = error.get_ref()?;
    if let Some(mismatch) = carried.downcast_ref::<ChecksumMismatch>() {
        return Some(mismatch);
    }
    let wrapped = carried
        .downcast_ref::<io::Error>()
        .and_then(|e| e.get_ref())
        .and_then(|e| e.downcast_ref::<ChecksumMismatch>());
    wrapped.or_else(|| carried.source()?.downcast_ref::<ChecksumMismatch>())
}

pub type MismatchSink = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// A block a write covers only in part, read before the write so that its
/// checksum can be computed from the whole block after it.
struct Edge {
    block: u64,
    /// Where its old bytes are in the edges' scratch.
    slot: usize,
    /// Whether the old bytes are known right (trusted and verified).
    known: bool,
    /// The old bytes were trusted and failed verification.
    mismatch: bool,
}

/// The (at most two) partial blocks of a write and their old bytes.
struct Edges {
    scratch: AlignedBuf,
    list: [Option<Edge>; 2],
}

/// The group locks a write or a verification under lock holds.
type Guards<'a> = Vec<MutexGuard<'a, ()>>;

pub struct IntegrityMember {
    inner: MemberRef,
    layout: IntegrityLayout,
    set_uuid: [u8; 16],
    dev_uuid: [u8; 16],
    /// One crc32c a data block.
    table: Vec<AtomicU32>,
    /// One bit a data block, set = untrusted; bits past the last block are
    /// never set, so that the words are the bitmap's bytes as they are.
    untrusted: Vec<AtomicU64>,
    /// The set bits of `untrusted`, kept as they change: the jobs ask on
    /// every row whether there is anything to derive.
    untrusted_count: AtomicU64,
    /// One bit a data block, set = its mismatch was reported and it has not
    /// been written since: the retries of one read and the read-back of its
    /// correction count it once, as one wrong block.
    reported: Vec<AtomicU64>,
    /// One bit a region page (bitmap pages, then table pages), set = the
    /// page in memory differs from the page on disk.
    dirty: Vec<AtomicU64>,
    locks: Vec<Mutex<()>>,
    /// Serialises the writers of the region (flush, close, mark_open) and
    /// holds the md event count the header carries.
    region: Mutex<u64>,
    sink: RwLock<Option<MismatchSink>>,
    checksum_errors: AtomicU64,
    verified_blocks: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data guarded is plain; a panic elsewhere leaves nothing half done.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn invalid_data(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl IntegrityMember {
    /// The layer over `inner` with every block trusted, every checksum zero
    /// and nothing dirty: the caller fills the state (format or load).
    fn new(
        inner: MemberRef,
        layout: IntegrityLayout,
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
        events: u64,
    ) -> IntegrityMember {
        layout.assert_valid();
        let blocks = layout.blocks();
        IntegrityMember {
            inner,
            layout,
            set_uuid,
            dev_uuid,
            table: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            untrusted: (0..blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            untrusted_count: AtomicU64::new(0),
            reported: (0..blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            dirty: (0..layout.region_pages().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            locks: (0..LOCKS_COUNT).map(|_| Mutex::new(())).collect(),
            region: Mutex::new(events),
            sink: RwLock::new(None),
            checksum_errors: AtomicU64::new(0),
            verified_blocks: AtomicU64::new(0),
        }
    }

    /// Writes a new region: header (CLEAN, `events`), every block
    /// untrusted, table zero. Then the caller derives.
    pub fn format(
        inner: MemberRef,
        layout: IntegrityLayout,
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
        events: u64,
    ) -> io::Result<Arc<Self>> {
        layout.assert_valid();
        if layout.end_bytes() > inner.size_bytes() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: the integrity region ({} bytes at {}) passes the member's end ({} bytes)",
                    inner.name(),
                    layout.region_bytes(),
                    layout.region_start_bytes,
                    inner.size_bytes()
                ),
            ));
        }
        let member = IntegrityMember::new(inner, layout, set_uuid, dev_uuid, events);
        member.set_untrusted(0..layout.blocks());
        for page in 0..layout.region_pages() {
            member.mark_dirty(page);
        }
        // Pages durable before the header that makes them valid.
        member.write_dirty_pages()?;
        member.inner.flush()?;
        member.write_header(true, events)?;
        member.inner.flush()?;
        Ok(Arc::new(member))
    }

    /// Reads the region after `layout`'s data area: Ok(None) when no header
    /// is there; a one-line Err when it is unusable or names another array,
    /// device or layout; otherwise the member and its header as found.
    #[allow(clippy::type_complexity)]
    pub fn open(
        inner: MemberRef,
        layout: IntegrityLayout,
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
    ) -> io::Result<Option<(Arc<Self>, IntegrityHeader)>> {
        layout.assert_valid();
        let Some(header) = Self::read_header(&inner, layout)? else {
            return Ok(None);
        };
        Self::check_header(&inner, &header, layout, set_uuid, dev_uuid)?;
        let member = IntegrityMember::new(inner, layout, set_uuid, dev_uuid, header.events);
        member.load_bitmap()?;
        member.load_table()?;
        Ok(Some((Arc::new(member), header)))
    }

    fn read_header(
        inner: &MemberRef,
        layout: IntegrityLayout,
    ) -> io::Result<Option<IntegrityHeader>> {
        // A region that would start past the end cannot have been written.
        if layout.region_start_bytes + PAGE_BYTES > inner.size_bytes() {
            return Ok(None);
        }
        let mut block = AlignedBuf::zeroed(BLOCK_BYTES);
        inner.read_at(&mut block, layout.region_start_bytes)?;
        IntegrityHeader::decode(&block).map_err(|message| {
            invalid_data(format!(
                "{}: integrity header at sector {}: {message}",
                inner.name(),
                layout.region_start_bytes / 512
            ))
        })
    }

    fn check_header(
        inner: &MemberRef,
        header: &IntegrityHeader,
        layout: IntegrityLayout,
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
    ) -> io::Result<()> {
        let name = inner.name();
        if header.set_uuid != set_uuid {
            return Err(invalid_data(format!(
                "{name}: the integrity region belongs to another array"
            )));
        }
        if header.dev_uuid != dev_uuid {
            return Err(invalid_data(format!(
                "{name}: the integrity region belongs to another device of the array"
            )));
        }
        if header.layout != layout {
            return Err(invalid_data(format!(
                "{name}: the integrity region describes another layout ({:?}, expected {layout:?})",
                header.layout
            )));
        }
        if layout.end_bytes() > inner.size_bytes() {
            return Err(invalid_data(format!(
                "{name}: the integrity region ends at {}, past the member's end ({} bytes)",
                layout.end_bytes(),
                inner.size_bytes()
            )));
        }
        Ok(())
    }

    /// Reads `len_bytes` of the region from `at` in pieces, handing each to
    /// `take` with its offset from `at`.
    fn read_region(
        &self,
        at: u64,
        len_bytes: u64,
        mut take: impl FnMut(u64, &[u8]),
    ) -> io::Result<()> {
        let mut chunk = AlignedBuf::zeroed(CHUNK_BYTES_MAX.min(len_bytes as usize));
        let mut done = 0;
        while done < len_bytes {
            let piece = &mut chunk[..(len_bytes - done).min(CHUNK_BYTES_MAX as u64) as usize];
            self.inner.read_at(piece, at + done)?;
            take(done, piece);
            done += piece.len() as u64;
        }
        Ok(())
    }

    fn load_bitmap(&self) -> io::Result<()> {
        let blocks = self.layout.blocks();
        let at = self.layout.region_start_bytes + PAGE_BYTES;
        self.read_region(at, self.layout.bitmap_bytes(), |from, bytes| {
            for (i, word) in bytes.chunks_exact(8).enumerate() {
                let index = from as usize / 8 + i;
                let Some(slot) = self.untrusted.get(index) else {
                    return;
                };
                // Bits past the last block mean nothing; keep them clear.
                let mut bits = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                let first_block = index as u64 * 64;
                if blocks - first_block < 64 {
                    bits &= (1u64 << (blocks - first_block)) - 1;
                }
                let old = slot.swap(bits, Ordering::SeqCst);
                self.untrusted_count
                    .fetch_add(u64::from(bits.count_ones()), Ordering::SeqCst);
                self.untrusted_count
                    .fetch_sub(u64::from(old.count_ones()), Ordering::SeqCst);
            }
        })
    }

    fn load_table(&self) -> io::Result<()> {
        let at = self.layout.region_start_bytes + PAGE_BYTES + self.layout.bitmap_bytes();
        self.read_region(at, self.layout.table_bytes(), |from, bytes| {
            for (i, entry) in bytes.chunks_exact(4).enumerate() {
                let Some(slot) = self.table.get(from as usize / 4 + i) else {
                    return;
                };
                slot.store(
                    u32::from_le_bytes(entry.try_into().expect("4 bytes")),
                    Ordering::Relaxed,
                );
            }
        })
    }

    pub fn inner(&self) -> &MemberRef {
        &self.inner
    }

    pub fn layout(&self) -> IntegrityLayout {
        self.layout
    }

    pub fn set_sink(&self, sink: MismatchSink) {
        *self.sink.write().unwrap_or_else(PoisonError::into_inner) = Some(sink);
    }

    /// Sets the checksums of the whole blocks in [offset, offset + len)
    /// from `bytes` and marks them trusted; parts outside the data area and
    /// partial blocks at the edges are ignored.
    pub fn derive(&self, offset_bytes: u64, bytes: &[u8]) {
        let Some(span) = self.covered(offset_bytes, bytes.len() as u64) else {
            return;
        };
        let start = round_up(span.start, INTEGRITY_BLOCK_BYTES);
        let end = round_down(span.end, INTEGRITY_BLOCK_BYTES);
        if start >= end {
            return;
        }
        let blocks = self.block_index(start)..self.block_index(end);
        let _guards = self.lock_blocks(blocks.clone());
        let from = (start - offset_bytes) as usize;
        self.store_blocks(blocks.start, &bytes[from..from + (end - start) as usize]);
    }

    /// Reads the whole data area (1 MiB at a time) and derives every block:
    /// for a freshly made, consistent array.
    pub fn derive_all_from_disk(&self, mut progress: impl FnMut(u64, u64)) -> io::Result<()> {
        let all_bytes = self.layout.data_bytes;
        let mut chunk = AlignedBuf::zeroed(CHUNK_BYTES_MAX);
        let mut done = 0;
        while done < all_bytes {
            let piece = &mut chunk[..(all_bytes - done).min(CHUNK_BYTES_MAX as u64) as usize];
            let at = self.layout.data_start_bytes + done;
            let first = done / INTEGRITY_BLOCK_BYTES;
            // Under the locks, so that a write through the layer meanwhile
            // is either before the read or after the checksums.
            let guards =
                self.lock_blocks(first..first + piece.len() as u64 / INTEGRITY_BLOCK_BYTES);
            self.inner.read_at(piece, at)?;
            self.store_blocks(first, piece);
            drop(guards);
            done += piece.len() as u64;
            progress(done, all_bytes);
        }
        Ok(())
    }

    pub fn untrust_all(&self) {
        self.set_untrusted(0..self.layout.blocks());
    }

    /// Marks untrusted every block touching [offset, offset + len).
    pub fn untrust(&self, offset_bytes: u64, len_bytes: u64) {
        if let Some(span) = self.covered(offset_bytes, len_bytes) {
            self.set_untrusted(self.blocks_touching(&span));
        }
    }

    pub fn untrusted_blocks(&self) -> u64 {
        self.untrusted_count.load(Ordering::SeqCst)
    }

    /// Marks the header not clean (written at once, flushed): a crash from
    /// now on is seen at the next open.
    pub fn mark_open(&self) -> io::Result<()> {
        let events = lock(&self.region);
        self.write_header(false, *events)?;
        self.inner.flush()
    }

    /// Writes dirty bitmap and table pages, then the header CLEAN with
    /// `events`, and flushes.
    pub fn close(&self, events: u64) -> io::Result<()> {
        let mut events_now = lock(&self.region);
        self.write_dirty_pages()?;
        // The pages durable before the header that says they are complete.
        self.inner.flush()?;
        self.write_header(true, events)?;
        self.inner.flush()?;
        *events_now = events;
        Ok(())
    }

    pub fn checksum_errors(&self) -> u64 {
        self.checksum_errors.load(Ordering::Relaxed)
    }

    pub fn verified_blocks(&self) -> u64 {
        self.verified_blocks.load(Ordering::Relaxed)
    }

    fn header(&self, clean: bool, events: u64) -> IntegrityHeader {
        IntegrityHeader {
            set_uuid: self.set_uuid,
            dev_uuid: self.dev_uuid,
            layout: self.layout,
            events,
            clean,
        }
    }

    fn write_header(&self, clean: bool, events: u64) -> io::Result<()> {
        let block = AlignedBuf::copy_from(&self.header(clean, events).encode());
        let decoded = IntegrityHeader::decode(&block).expect("a header just encoded decodes");
        assert_eq!(decoded, Some(self.header(clean, events)));
        self.inner.write_at(&block, self.layout.region_start_bytes)
    }

    // ---- blocks, bits and pages ----

    /// The part of [offset, offset + len) in the data area.
    fn covered(&self, offset_bytes: u64, len_bytes: u64) -> Option<Range<u64>> {
        let start = offset_bytes.max(self.layout.data_start_bytes);
        let end = (offset_bytes + len_bytes).min(self.layout.data_end_bytes());
        (start < end).then_some(start..end)
    }

    /// The data block starting at (or, for an end, ending at) a member offset.
    fn block_index(&self, offset_bytes: u64) -> u64 {
        assert!(block_aligned(offset_bytes), "{offset_bytes}");
        assert!(
            offset_bytes >= self.layout.data_start_bytes,
            "{offset_bytes}"
        );
        assert!(
            offset_bytes <= self.layout.data_end_bytes(),
            "{offset_bytes}"
        );
        (offset_bytes - self.layout.data_start_bytes) / INTEGRITY_BLOCK_BYTES
    }

    fn block_offset_bytes(&self, block: u64) -> u64 {
        assert!(block < self.layout.blocks());
        self.layout.data_start_bytes + block * INTEGRITY_BLOCK_BYTES
    }

    /// Every block a span of the data area touches, whole or in part.
    fn blocks_touching(&self, span: &Range<u64>) -> Range<u64> {
        let start = round_down(span.start, INTEGRITY_BLOCK_BYTES);
        let end = round_up(span.end, INTEGRITY_BLOCK_BYTES);
        self.block_index(start)..self.block_index(end)
    }

    fn trusted(&self, block: u64) -> bool {
        assert!(block < self.layout.blocks());
        let word = self.untrusted[(block / 64) as usize].load(Ordering::Acquire);
        word & (1 << (block % 64)) == 0
    }

    /// Stores a block's checksum and trusts it. SeqCst throughout, paired
    /// with the flush's: a page marked clean before it is copied either
    /// sees this update or is dirtied again by it.
    fn store_crc(&self, block: u64, crc: u32) {
        assert!(block < self.layout.blocks());
        let entry = &self.table[block as usize];
        if entry.load(Ordering::SeqCst) != crc {
            entry.store(crc, Ordering::SeqCst);
            self.mark_dirty(self.layout.bitmap_pages() + block / TABLE_PAGE_BLOCKS);
        }
        let bit = 1u64 << (block % 64);
        let word = &self.untrusted[(block / 64) as usize];
        if word.load(Ordering::SeqCst) & bit != 0 {
            let old = word.fetch_and(!bit, Ordering::SeqCst);
            if old & bit != 0 {
                self.untrusted_count.fetch_sub(1, Ordering::SeqCst);
            }
            self.mark_dirty(block / BITMAP_PAGE_BLOCKS);
        }
        // Written or derived anew: a later mismatch is a new wrong block.
        let reported = &self.reported[(block / 64) as usize];
        if reported.load(Ordering::Relaxed) & bit != 0 {
            reported.fetch_and(!bit, Ordering::SeqCst);
        }
    }

    /// Stores the checksums of whole blocks from `first` on.
    fn store_blocks(&self, first: u64, bytes: &[u8]) {
        assert!(bytes.len().is_multiple_of(BLOCK_BYTES));
        for (i, block) in bytes.chunks_exact(BLOCK_BYTES).enumerate() {
            self.store_crc(first + i as u64, crc32c::crc32c(block));
        }
    }

    /// Sets the untrusted bits of a range of blocks, a word at a time.
    fn set_untrusted(&self, blocks: Range<u64>) {
        assert!(blocks.end <= self.layout.blocks());
        let mut block = blocks.start;
        while block < blocks.end {
            let in_word = block % 64;
            let count = (64 - in_word).min(blocks.end - block);
            let mask = if count == 64 {
                u64::MAX
            } else {
                ((1u64 << count) - 1) << in_word
            };
            let word = &self.untrusted[(block / 64) as usize];
            if word.load(Ordering::SeqCst) & mask != mask {
                let old = word.fetch_or(mask, Ordering::SeqCst);
                self.untrusted_count
                    .fetch_add(u64::from((mask & !old).count_ones()), Ordering::SeqCst);
                self.mark_dirty(block / BITMAP_PAGE_BLOCKS);
            }
            block += count;
        }
    }

    fn mark_dirty(&self, page: u64) {
        assert!(page < self.layout.region_pages());
        let bit = 1u64 << (page % 64);
        let word = &self.dirty[(page / 64) as usize];
        // A load first: writes to one page mostly find it dirty already,
        // and a load does not take the cache line from the other writers.
        if word.load(Ordering::SeqCst) & bit == 0 {
            word.fetch_or(bit, Ordering::SeqCst);
        }
    }

    fn is_dirty(&self, page: u64) -> bool {
        self.dirty[(page / 64) as usize].load(Ordering::SeqCst) & (1 << (page % 64)) != 0
    }

    /// Copies a bitmap or table page from memory into `out`.
    fn encode_page(&self, page: u64, out: &mut [u8]) {
        assert_eq!(out.len(), BLOCK_BYTES);
        let bitmap_pages = self.layout.bitmap_pages();
        if page < bitmap_pages {
            let first = page as usize * BITMAP_PAGE_WORDS;
            for (i, bytes) in out.chunks_exact_mut(8).enumerate() {
                let word = self
                    .untrusted
                    .get(first + i)
                    .map_or(0, |w| w.load(Ordering::SeqCst));
                bytes.copy_from_slice(&word.to_le_bytes());
            }
        } else {
            let first = ((page - bitmap_pages) * TABLE_PAGE_BLOCKS) as usize;
            for (i, bytes) in out.chunks_exact_mut(4).enumerate() {
                let crc = self
                    .table
                    .get(first + i)
                    .map_or(0, |c| c.load(Ordering::SeqCst));
                bytes.copy_from_slice(&crc.to_le_bytes());
            }
        }
    }

    /// Writes every dirty page, consecutive pages in one write of at most
    /// CHUNK_BYTES_MAX. A page is marked clean before it is copied, so that
    /// an update racing the copy dirties it again; a page whose write
    /// failed is dirty again. Called with `region` held.
    fn write_dirty_pages(&self) -> io::Result<()> {
        let mut run = PageRun::default();
        for (index, word) in self.dirty.iter().enumerate() {
            if word.load(Ordering::SeqCst) == 0 {
                continue;
            }
            let mut pages = word.swap(0, Ordering::SeqCst);
            while pages != 0 {
                let page = index as u64 * 64 + pages.trailing_zeros() as u64;
                pages &= pages - 1;
                if let Err(error) = run.add(self, page) {
                    // This page and the rest of its word were taken but
                    // not written.
                    word.fetch_or(pages | (1 << (page % 64)), Ordering::SeqCst);
                    return Err(error);
                }
            }
        }
        run.write(self)
    }

    // ---- group locks ----

    /// Locks the groups of a range of blocks in index order (each lock once),
    /// so that two holders of overlapping sets never wait on each other.
    fn lock_blocks(&self, blocks: Range<u64>) -> Guards<'_> {
        assert!(blocks.start < blocks.end && blocks.end <= self.layout.blocks());
        let first_group = blocks.start / GROUP_BLOCKS;
        let groups = (blocks.end - 1) / GROUP_BLOCKS - first_group + 1;
        let mut guards = Vec::with_capacity((groups as usize).min(LOCKS_COUNT));
        if groups >= LOCKS_COUNT as u64 {
            guards.extend(self.locks.iter().map(lock));
            return guards;
        }
        // The groups' locks are consecutive modulo LOCKS_COUNT: one range,
        // or two when they wrap, the low one first.
        let start = (first_group % LOCKS_COUNT as u64) as usize;
        let end = start + groups as usize;
        if end > LOCKS_COUNT {
            guards.extend(self.locks[..end - LOCKS_COUNT].iter().map(lock));
            guards.extend(self.locks[start..].iter().map(lock));
        } else {
            guards.extend(self.locks[start..end].iter().map(lock));
        }
        guards
    }

    // ---- verification ----

    /// Verifies whole blocks read at member offset `at` (in the data area).
    /// Optimistic first; what fails is read again and checked again under
    /// the group locks, which writers hold across data and checksum, so
    /// that a read racing a write never reports a false mismatch.
    fn verify(&self, bytes: &mut [u8], at: u64) -> io::Result<()> {
        assert!(block_aligned(at) && bytes.len().is_multiple_of(BLOCK_BYTES));
        let first = self.block_index(at);
        let Some(suspects) = self.suspects(bytes, first) else {
            return Ok(());
        };
        let bad = self.recheck_locked(bytes, at, suspects)?;
        if bad.is_empty() {
            return Ok(());
        }
        for &offset in &bad {
            self.note_bad(offset);
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            ChecksumMismatch {
                member: self.name().to_string(),
                offset_bytes: bad[0],
                blocks: bad.len() as u64,
            },
        ))
    }

    /// Whether a block's bytes match its checksum (untrusted blocks do).
    fn matches(&self, block: u64, bytes: &[u8]) -> bool {
        !self.trusted(block)
            || crc32c::crc32c(bytes) == self.table[block as usize].load(Ordering::Acquire)
    }

    /// The blocks (indices into `bytes`) from the first to the last that
    /// failed the optimistic check, if any did.
    fn suspects(&self, bytes: &[u8], first: u64) -> Option<Range<usize>> {
        let mut suspects: Option<Range<usize>> = None;
        let mut checked = 0;
        for (i, block_bytes) in bytes.chunks_exact(BLOCK_BYTES).enumerate() {
            let block = first + i as u64;
            checked += self.trusted(block) as u64;
            if !self.matches(block, block_bytes) {
                let start = suspects.as_ref().map_or(i, |s| s.start);
                suspects = Some(start..i + 1);
            }
        }
        self.verified_blocks.fetch_add(checked, Ordering::Relaxed);
        suspects
    }

    /// Reads the suspect blocks again under their locks and returns the
    /// member offsets of those still wrong.
    fn recheck_locked(
        &self,
        bytes: &mut [u8],
        at: u64,
        suspects: Range<usize>,
    ) -> io::Result<Vec<u64>> {
        let first = self.block_index(at);
        let blocks = first + suspects.start as u64..first + suspects.end as u64;
        let _guards = self.lock_blocks(blocks.clone());
        let again = &mut bytes[suspects.start * BLOCK_BYTES..suspects.end * BLOCK_BYTES];
        self.inner
            .read_at(again, self.block_offset_bytes(blocks.start))?;
        let bad = blocks
            .zip(again.chunks_exact(BLOCK_BYTES))
            .filter(|(block, block_bytes)| !self.matches(*block, block_bytes))
            .map(|(block, _)| self.block_offset_bytes(block))
            .collect();
        Ok(bad)
    }

    /// Counts a block found bad and tells the sink. Never called under a
    /// group lock: the sink may do I/O of its own.
    fn note_bad(&self, offset_bytes: u64) {
        let block = self.block_index(offset_bytes);
        let bit = 1u64 << (block % 64);
        if self.reported[(block / 64) as usize].fetch_or(bit, Ordering::SeqCst) & bit != 0 {
            return;
        }
        self.checksum_errors.fetch_add(1, Ordering::Relaxed);
        let sink = self
            .sink
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(sink) = sink {
            sink(self.name(), offset_bytes);
        }
    }

    // ---- reads and writes in the data area ----

    /// A read whose part in the data area does not begin and end on block
    /// boundaries: that part through a scratch of the enclosing blocks.
    fn read_unaligned(
        &self,
        buf: &mut [u8],
        offset_bytes: u64,
        span: Range<u64>,
    ) -> io::Result<()> {
        let end = offset_bytes + buf.len() as u64;
        if offset_bytes < span.start {
            let before = (span.start - offset_bytes) as usize;
            self.inner.read_at(&mut buf[..before], offset_bytes)?;
        }
        if span.end < end {
            let after = (span.end - offset_bytes) as usize;
            self.inner.read_at(&mut buf[after..], span.end)?;
        }
        let at = round_down(span.start, INTEGRITY_BLOCK_BYTES);
        let len = (round_up(span.end, INTEGRITY_BLOCK_BYTES) - at) as usize;
        let mut scratch = take_bounce(len);
        let blocks = &mut scratch[..len];
        let result = self
            .inner
            .read_at(blocks, at)
            .and_then(|()| self.verify(blocks, at));
        if result.is_ok() {
            let from = (span.start - at) as usize;
            let to = (span.start - offset_bytes) as usize;
            let count = (span.end - span.start) as usize;
            buf[to..to + count].copy_from_slice(&blocks[from..from + count]);
        }
        give_bounce(scratch);
        result
    }

    /// A write with a part in the data area: under the locks of its blocks,
    /// the old partial blocks, the write, the new checksums.
    fn write_covered(&self, buf: &[u8], offset_bytes: u64, span: Range<u64>) -> io::Result<()> {
        let blocks = self.blocks_touching(&span);
        let guards = self.lock_blocks(blocks.clone());
        let mut edges = self.read_edges(&span);
        let result = self.inner.write_at(buf, offset_bytes);
        match &result {
            Ok(()) => {
                self.store_whole_blocks(buf, offset_bytes, &span);
                if let Some(edges) = edges.as_mut() {
                    self.store_edges(buf, offset_bytes, &span, edges);
                }
            }
            // The media holds unknown bytes now.
            Err(_) => self.set_untrusted(blocks),
        }
        drop(guards);
        if let Some(edges) = edges {
            for edge in edges.list.iter().flatten().filter(|e| e.mismatch) {
                self.note_bad(self.block_offset_bytes(edge.block));
            }
            give_bounce(edges.scratch);
        }
        result
    }

    /// Reads the blocks a span covers only in part, and verifies them.
    fn read_edges(&self, span: &Range<u64>) -> Option<Edges> {
        let head =
            (!block_aligned(span.start)).then(|| round_down(span.start, INTEGRITY_BLOCK_BYTES));
        let tail = (!block_aligned(span.end)).then(|| round_down(span.end, INTEGRITY_BLOCK_BYTES));
        let tail = tail.filter(|&t| Some(t) != head);
        if head.is_none() && tail.is_none() {
            return None;
        }
        let mut scratch = take_bounce(2 * BLOCK_BYTES);
        let mut list = [None, None];
        for (slot, at) in [head, tail].into_iter().enumerate() {
            let Some(at) = at else { continue };
            let old = &mut scratch[slot * BLOCK_BYTES..(slot + 1) * BLOCK_BYTES];
            let block = self.block_index(at);
            let trusted = self.trusted(block);
            // A block that cannot be read has unknown old bytes: the write
            // goes on and the block becomes untrusted.
            let read = self.inner.read_at(old, at).is_ok();
            let matches = read && self.matches(block, old);
            list[slot] = Some(Edge {
                block,
                slot,
                known: trusted && matches,
                mismatch: trusted && read && !matches,
            });
        }
        Some(Edges { scratch, list })
    }

    fn store_whole_blocks(&self, buf: &[u8], offset_bytes: u64, span: &Range<u64>) {
        let start = round_up(span.start, INTEGRITY_BLOCK_BYTES);
        let end = round_down(span.end, INTEGRITY_BLOCK_BYTES);
        if start < end {
            let from = (start - offset_bytes) as usize;
            self.store_blocks(
                self.block_index(start),
                &buf[from..from + (end - start) as usize],
            );
        }
    }

    /// Checksums each partial block as old bytes merged with the new, or
    /// untrusts it when the old bytes were not known right.
    fn store_edges(&self, buf: &[u8], offset_bytes: u64, span: &Range<u64>, edges: &mut Edges) {
        for edge in edges.list.iter().flatten() {
            if !edge.known {
                self.set_untrusted(edge.block..edge.block + 1);
                continue;
            }
            let block_at = self.block_offset_bytes(edge.block);
            let start = span.start.max(block_at);
            let end = span.end.min(block_at + INTEGRITY_BLOCK_BYTES);
            let merged = &mut edges.scratch[edge.slot * BLOCK_BYTES..(edge.slot + 1) * BLOCK_BYTES];
            merged[(start - block_at) as usize..(end - block_at) as usize].copy_from_slice(
                &buf[(start - offset_bytes) as usize..(end - offset_bytes) as usize],
            );
            self.store_crc(edge.block, crc32c::crc32c(merged));
        }
    }

    /// Untrusts, in `other`, every block whose checksum or bit `self` had
    /// not written yet: the reopened region on disk is stale there.
    fn untrust_unwritten(&self, other: &IntegrityMember) {
        let blocks = self.layout.blocks();
        let bitmap_pages = self.layout.bitmap_pages();
        for page in (0..self.layout.region_pages()).filter(|&p| self.is_dirty(p)) {
            let (first, count) = if page < bitmap_pages {
                (page * BITMAP_PAGE_BLOCKS, BITMAP_PAGE_BLOCKS)
            } else {
                ((page - bitmap_pages) * TABLE_PAGE_BLOCKS, TABLE_PAGE_BLOCKS)
            };
            other.set_untrusted(first.min(blocks)..(first + count).min(blocks));
        }
    }
}

/// Consecutive dirty pages gathered for one write.
#[derive(Default)]
struct PageRun {
    buf: Option<AlignedBuf>,
    first: u64,
    pages: usize,
}

impl PageRun {
    const PAGES_MAX: usize = CHUNK_BYTES_MAX / BLOCK_BYTES;

    fn add(&mut self, member: &IntegrityMember, page: u64) -> io::Result<()> {
        let follows = page == self.first + self.pages as u64;
        if self.pages > 0 && (!follows || self.pages == Self::PAGES_MAX) {
            self.write(member)?;
        }
        if self.pages == 0 {
            self.first = page;
        }
        let buf = self
            .buf
            .get_or_insert_with(|| AlignedBuf::zeroed(CHUNK_BYTES_MAX));
        let at = self.pages * BLOCK_BYTES;
        member.encode_page(page, &mut buf[at..at + BLOCK_BYTES]);
        self.pages += 1;
        Ok(())
    }

    /// Writes the pages gathered; on failure they are dirty again.
    fn write(&mut self, member: &IntegrityMember) -> io::Result<()> {
        if self.pages == 0 {
            return Ok(());
        }
        let buf = self.buf.as_ref().expect("pages were gathered");
        let at = member.layout.page_offset_bytes(self.first);
        assert!(self.first + self.pages as u64 <= member.layout.region_pages());
        let result = member.inner.write_at(&buf[..self.pages * BLOCK_BYTES], at);
        if result.is_err() {
            for page in self.first..self.first + self.pages as u64 {
                member.mark_dirty(page);
            }
        }
        self.pages = 0;
        result
    }
}

impl Member for IntegrityMember {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.inner.logical_block_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        let Some(span) = self.covered(offset_bytes, buf.len() as u64) else {
            return self.inner.read_at(buf, offset_bytes);
        };
        if !block_aligned(span.start) || !block_aligned(span.end) {
            return self.read_unaligned(buf, offset_bytes, span);
        }
        self.inner.read_at(buf, offset_bytes)?;
        let from = (span.start - offset_bytes) as usize;
        let to = (span.end - offset_bytes) as usize;
        self.verify(&mut buf[from..to], span.start)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        match self.covered(offset_bytes, buf.len() as u64) {
            None => self.inner.write_at(buf, offset_bytes),
            Some(span) => self.write_covered(buf, offset_bytes, span),
        }
    }

    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_at(buf, offset_bytes)?;
        self.flush()
    }

    fn flush(&self) -> io::Result<()> {
        let _region = lock(&self.region);
        self.write_dirty_pages()?;
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        let Some(span) = self.covered(offset_bytes, len_bytes) else {
            return self.inner.discard(offset_bytes, len_bytes);
        };
        let blocks = self.blocks_touching(&span);
        let _guards = self.lock_blocks(blocks.clone());
        let result = self.inner.discard(offset_bytes, len_bytes);
        // Discarded bytes are unspecified, and so are those of a discard
        // that failed part way.
        self.set_untrusted(blocks);
        result
    }

    fn keep_deadline(&self, _timeout: std::time::Duration) -> bool {
        false
    }

    fn in_memory(&self) -> bool {
        self.inner.in_memory()
    }

    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        self.inner.io_stats()
    }

    fn reconnect(&self) -> io::Result<()> {
        self.inner.reconnect()
    }

    fn refresh_size(&self) -> io::Result<u64> {
        self.inner.refresh_size()
    }

    /// The inner member opened again with its region read again. Pages
    /// this layer had not written yet are stale on disk, so the blocks they
    /// cover start untrusted in the new layer.
    fn reopen(&self) -> io::Result<MemberRef> {
        let inner = self.inner.reopen()?;
        let opened = IntegrityMember::open(inner, self.layout, self.set_uuid, self.dev_uuid)?;
        let Some((member, _header)) = opened else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}: the integrity region at sector {} is gone",
                    self.name(),
                    self.layout.region_start_bytes / 512
                ),
            ));
        };
        self.untrust_unwritten(&member);
        if let Some(sink) = self
            .sink
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            member.set_sink(sink);
        }
        Ok(member)
    }

    fn integrity(&self) -> Option<&IntegrityMember> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemoryMember;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    const MIB: u64 = 1 << 20;
    const SET: [u8; 16] = [1; 16];
    const DEV: [u8; 16] = [2; 16];

    /// A 4 MiB memory member of 512-byte blocks, data at 1 MiB for 2 MiB.
    fn setup() -> (Arc<MemoryMember>, Arc<IntegrityMember>) {
        let inner = Arc::new(MemoryMember::new("m0", 4 * MIB, 512));
        let layout = IntegrityLayout::after_data(MIB, 2 * MIB);
        let member = IntegrityMember::format(inner.clone(), layout, SET, DEV, 5).unwrap();
        (inner, member)
    }

    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        rand::rngs::StdRng::seed_from_u64(seed).fill(&mut bytes[..]);
        bytes
    }

    /// Fills the data area on the inner member and derives every block.
    fn filled() -> (Arc<MemoryMember>, Arc<IntegrityMember>, Vec<u8>) {
        let (inner, member) = setup();
        let data = random(2 * MIB as usize, 7);
        inner.write_at(&data, MIB).unwrap();
        let mut calls = 0;
        member
            .derive_all_from_disk(|done, all| {
                calls += 1;
                assert!(done <= all);
            })
            .unwrap();
        assert_eq!(calls, 2);
        assert_eq!(member.untrusted_blocks(), 0);
        (inner, member, data)
    }

    fn recording_sink(member: &IntegrityMember) -> Arc<Mutex<Vec<(String, u64)>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        member.set_sink(Arc::new(move |name: &str, at: u64| {
            into.lock().unwrap().push((name.to_string(), at));
        }));
        seen
    }

    #[test]
    fn header_round_trips_and_refuses_corruption() {
        let header = IntegrityHeader {
            set_uuid: SET,
            dev_uuid: DEV,
            layout: IntegrityLayout::after_data(MIB, 2 * MIB + 512),
            events: 42,
            clean: true,
        };
        assert_eq!(header.layout.region_start_bytes, 3 * MIB + 4096);
        let block = header.encode();
        assert_eq!(block.len(), BLOCK_BYTES);
        assert_eq!(IntegrityHeader::decode(&block), Ok(Some(header.clone())));
        assert_eq!(IntegrityHeader::decode(&[0u8; BLOCK_BYTES]), Ok(None));

        let mut flipped = block.clone();
        flipped[AT_EVENTS] ^= 1;
        let error = IntegrityHeader::decode(&flipped).unwrap_err();
        assert!(error.contains("checksum"), "{error}");
        assert!(!error.contains('\n'));

        // A wrong version with a right crc is refused for what it is.
        let mut future = block.clone();
        future[AT_VERSION..][..4].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&future[..AT_HEADER_CRC]);
        future[AT_HEADER_CRC..].copy_from_slice(&crc.to_le_bytes());
        assert!(IntegrityHeader::decode(&future)
            .unwrap_err()
            .contains("version 2"));
        assert!(IntegrityHeader::decode(&block[..100]).is_err());
    }

    #[test]
    fn layout_sizes() {
        let layout = IntegrityLayout::after_data(MIB, 2 * MIB + 100);
        assert_eq!(layout.data_bytes, 2 * MIB);
        assert_eq!(layout.blocks(), 512);
        assert_eq!(layout.bitmap_bytes(), 4096);
        assert_eq!(layout.table_bytes(), 4096);
        assert_eq!(layout.region_bytes(), 3 * 4096);
        assert_eq!(layout.end_bytes(), 3 * MIB + 4096 + 3 * 4096);
        let big = IntegrityLayout::after_data(0, 1 << 30);
        assert_eq!(big.blocks(), 1 << 18);
        assert_eq!(big.bitmap_bytes(), 32768);
        assert_eq!(big.table_bytes(), 1 << 20);
    }

    #[test]
    fn usable_bytes_leave_room_for_the_region() {
        for device in [
            3 * MIB,
            4 * MIB + 512,
            100 * MIB + 12345,
            1 << 40,
            (1 << 44) + 4096 * 7,
        ] {
            let usable = IntegrityLayout::usable_bytes(device).unwrap();
            assert!(block_aligned(usable));
            let layout = IntegrityLayout::after_data(MIB, usable - MIB);
            assert!(layout.end_bytes() <= device, "{device}");
            // The over-reserve is slight: the table of the blocks the
            // data area does not have (data start, the region itself).
            let waste = device - layout.end_bytes();
            assert!(
                waste < 8 * PAGE_BYTES + device / (1 << 19),
                "{device}: {waste}"
            );
        }
        assert_eq!(IntegrityLayout::usable_bytes(8192), None);
        assert_eq!(IntegrityLayout::usable_bytes(0), None);
    }

    #[test]
    fn written_blocks_verify() {
        let (_inner, member) = setup();
        assert_eq!(member.untrusted_blocks(), 512);
        let data = random(64 * 1024, 1);
        member.write_at(&data, MIB + 8192).unwrap();
        assert_eq!(member.untrusted_blocks(), 512 - 16);
        let mut back = vec![0u8; data.len()];
        member.read_at(&mut back, MIB + 8192).unwrap();
        assert_eq!(back, data);
        assert_eq!(member.verified_blocks(), 16);
        assert_eq!(member.checksum_errors(), 0);
    }

    #[test]
    fn a_changed_block_fails_its_read() {
        let (inner, member, data) = filled();
        let seen = recording_sink(&member);
        let bad_at = MIB + 5 * 4096;
        inner.write_at(&[0xAA; 512], bad_at + 1024).unwrap();

        let mut back = vec![0u8; 64 * 1024];
        let error = member.read_at(&mut back, MIB).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let mismatch = checksum_mismatch(&error).expect("a mismatch");
        assert_eq!(mismatch.offset_bytes, bad_at);
        assert_eq!(mismatch.blocks, 1);
        assert_eq!(mismatch.member, "m0");
        assert!(error
            .to_string()
            .contains(&format!("sector {}", bad_at / 512)));
        assert_eq!(*seen.lock().unwrap(), vec![("m0".to_string(), bad_at)]);
        assert_eq!(member.checksum_errors(), 1);

        // Found through a wrapping io::Error as well.
        let wrapped = io::Error::other(error);
        assert_eq!(checksum_mismatch(&wrapped).unwrap().offset_bytes, bad_at);
        assert!(checksum_mismatch(&io::Error::other("plain")).is_none());

        // The blocks around it read right; a rewrite heals it.
        member.read_at(&mut back[..4096], bad_at - 4096).unwrap();
        let at = (bad_at - MIB) as usize;
        member.write_at(&data[at..at + 4096], bad_at).unwrap();
        member.read_at(&mut back, MIB).unwrap();
        assert_eq!(back[..], data[..64 * 1024]);
        assert_eq!(member.checksum_errors(), 1);
    }

    #[test]
    fn untrusted_blocks_are_not_verified() {
        let (inner, member, _data) = filled();
        member.untrust(MIB + 4096 + 512, 512);
        assert_eq!(member.untrusted_blocks(), 1);
        inner.write_at(&[0x55; 4096], MIB + 4096).unwrap();
        let mut back = vec![0u8; 8192];
        member.read_at(&mut back, MIB).unwrap();
        assert_eq!(back[4096..], [0x55; 4096]);
        // Deriving trusts it again, with the bytes given.
        member.derive(MIB + 4096, &back[4096..]);
        assert_eq!(member.untrusted_blocks(), 0);
        member.read_at(&mut back, MIB).unwrap();
        member.untrust_all();
        assert_eq!(member.untrusted_blocks(), 512);
        let checked = member.verified_blocks();
        member.read_at(&mut back, MIB).unwrap();
        assert_eq!(member.verified_blocks(), checked);
    }

    #[test]
    fn unaligned_io_keeps_checksums_right() {
        let (inner, member, mut data) = filled();
        // 512 bytes in the middle of a block: read-modify-write.
        let at = MIB + 3 * 4096 + 1024;
        let small = random(512, 3);
        member.write_at(&small, at).unwrap();
        let index = (at - MIB) as usize;
        data[index..index + 512].copy_from_slice(&small);
        let mut back = vec![0u8; 512];
        member.read_at(&mut back, at).unwrap();
        assert_eq!(back, small);
        let mut whole = vec![0u8; 3 * 4096];
        member.read_at(&mut whole, MIB + 2 * 4096).unwrap();
        assert_eq!(whole[..], data[2 * 4096..5 * 4096]);

        // Across two blocks' edges, and across the data area's start.
        let spanning = random(4096 + 1024, 4);
        let at = MIB + 7 * 4096 + 3584;
        member.write_at(&spanning, at).unwrap();
        let index = (at - MIB) as usize;
        data[index..index + spanning.len()].copy_from_slice(&spanning);
        let outside = random(1024, 5);
        member.write_at(&outside, MIB - 512).unwrap();
        data[..512].copy_from_slice(&outside[512..]);
        let mut all = vec![0u8; 2 * MIB as usize];
        member.read_at(&mut all, MIB).unwrap();
        assert_eq!(all, data);
        let mut before = vec![0u8; 1024];
        member.read_at(&mut before, MIB - 512).unwrap();
        assert_eq!(before, outside);
        assert_eq!(member.untrusted_blocks(), 0);

        // A partial write over a block already wrong: untrusted, reported.
        let seen = recording_sink(&member);
        inner.write_at(&[0x11; 512], MIB + 20 * 4096).unwrap();
        member
            .write_at(&[0x22; 512], MIB + 20 * 4096 + 2048)
            .unwrap();
        assert_eq!(member.untrusted_blocks(), 1);
        assert_eq!(seen.lock().unwrap().len(), 1);
        member.read_at(&mut whole[..4096], MIB + 20 * 4096).unwrap();
        // An unaligned read of a wrong block fails too.
        inner.write_at(&[0x33; 512], MIB + 30 * 4096).unwrap();
        let error = member
            .read_at(&mut back, MIB + 30 * 4096 + 1024)
            .unwrap_err();
        assert_eq!(
            checksum_mismatch(&error).unwrap().offset_bytes,
            MIB + 30 * 4096
        );
    }

    #[test]
    fn close_and_open_keep_table_and_bitmap() {
        let (inner, member, _data) = filled();
        member.untrust(MIB + 100 * 4096, 3 * 4096);
        member.write_at(&random(8192, 9), MIB + 200 * 4096).unwrap();
        member.close(9).unwrap();
        drop(member);

        let layout = IntegrityLayout::after_data(MIB, 2 * MIB);
        let (member, header) = IntegrityMember::open(inner.clone(), layout, SET, DEV)
            .unwrap()
            .unwrap();
        assert_eq!(header.events, 9);
        assert!(header.clean);
        assert_eq!(header.layout, layout);
        assert_eq!(member.untrusted_blocks(), 3);
        let mut back = vec![0u8; 2 * MIB as usize];
        member.read_at(&mut back, MIB).unwrap();
        inner.write_at(&[0; 512], MIB + 201 * 4096).unwrap();
        let error = member.read_at(&mut back, MIB).unwrap_err();
        assert_eq!(
            checksum_mismatch(&error).unwrap().offset_bytes,
            MIB + 201 * 4096
        );

        // A member opened and not closed is seen so.
        member.mark_open().unwrap();
        member.untrust(MIB + 201 * 4096, 4096);
        member.flush().unwrap();
        let (member, header) = IntegrityMember::open(inner.clone(), layout, SET, DEV)
            .unwrap()
            .unwrap();
        assert!(!header.clean);
        assert_eq!(header.events, 9);
        assert_eq!(member.untrusted_blocks(), 4);

        // Another array, another device, another layout, no region.
        for (set, dev) in [([9; 16], DEV), (SET, [9; 16])] {
            let error = IntegrityMember::open(inner.clone(), layout, set, dev)
                .err()
                .unwrap();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        }
        // The same region start, another data area: the header says so.
        let shifted = IntegrityLayout::after_data(0, 3 * MIB);
        let error = IntegrityMember::open(inner.clone(), shifted, SET, DEV)
            .err()
            .unwrap();
        assert!(error.to_string().contains("another layout"), "{error}");
        let elsewhere = IntegrityLayout::after_data(MIB, MIB);
        assert!(IntegrityMember::open(inner.clone(), elsewhere, SET, DEV)
            .unwrap()
            .is_none());
        let fresh = Arc::new(MemoryMember::new("m1", 4 * MIB, 512));
        assert!(IntegrityMember::open(fresh, layout, SET, DEV)
            .unwrap()
            .is_none());
    }

    #[test]
    fn format_refuses_a_region_past_the_end() {
        let inner = Arc::new(MemoryMember::new("m0", 4 * MIB, 512));
        let layout = IntegrityLayout::after_data(MIB, 3 * MIB);
        let error = IntegrityMember::format(inner, layout, SET, DEV, 0)
            .err()
            .unwrap();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    /// A member whose writes fail while `failing` is set.
    struct FailingWrites {
        inner: MemoryMember,
        failing: AtomicBool,
    }

    impl Member for FailingWrites {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn logical_block_bytes(&self) -> u32 {
            self.inner.logical_block_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset_bytes)
        }
        fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected"));
            }
            self.inner.write_at(buf, offset_bytes)
        }
        fn flush(&self) -> io::Result<()> {
            self.inner.flush()
        }
        fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            self.inner.discard(offset_bytes, len_bytes)
        }
    }

    #[test]
    fn failed_writes_untrust_and_keep_pages_dirty() {
        let inner = Arc::new(FailingWrites {
            inner: MemoryMember::new("m0", 4 * MIB, 4096),
            failing: AtomicBool::new(false),
        });
        let layout = IntegrityLayout::after_data(MIB, 2 * MIB);
        let member = IntegrityMember::format(inner.clone(), layout, SET, DEV, 0).unwrap();
        member.write_at(&random(8192, 1), MIB).unwrap();
        inner.failing.store(true, Ordering::SeqCst);
        assert!(member.write_at(&[0; 4096], MIB + 4096).is_err());
        assert_eq!(member.untrusted_blocks(), 511);
        // The flush fails and leaves its pages dirty, for the next one.
        assert!(member.flush().is_err());
        inner.failing.store(false, Ordering::SeqCst);
        member.close(1).unwrap();
        let (member, _) = IntegrityMember::open(inner, layout, SET, DEV)
            .unwrap()
            .unwrap();
        assert_eq!(member.untrusted_blocks(), 511);
        member.read_at(&mut [0u8; 4096], MIB).unwrap();
        assert_eq!(member.verified_blocks(), 1);
    }

    #[test]
    fn discard_untrusts() {
        let (_inner, member, _data) = filled();
        member.discard(MIB + 4096, 8192).unwrap();
        assert_eq!(member.untrusted_blocks(), 2);
        member.read_at(&mut [0u8; 16384], MIB).unwrap();
    }

    #[test]
    fn readers_racing_writers_see_no_false_mismatch() {
        let (_inner, member, _data) = filled();
        let stop = Arc::new(AtomicBool::new(false));
        // Eight blocks across two groups, written whole and in part.
        let area = MIB + 12 * 4096;
        let writer = {
            let member = member.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(11);
                let mut writes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let sectors = rng.gen_range(1..=16u64);
                    let at = area + rng.gen_range(0..=64 - sectors) * 512;
                    let bytes = vec![rng.gen::<u8>(); (sectors * 512) as usize];
                    member.write_at(&bytes, at).unwrap();
                    writes += 1;
                }
                writes
            })
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let mut reads = 0u64;
        while Instant::now() < deadline {
            let blocks = rng.gen_range(1..=8u64);
            let at = area + rng.gen_range(0..=8 - blocks) * 4096;
            let mut buf = vec![0u8; (blocks * 4096) as usize];
            member.read_at(&mut buf, at).unwrap();
            let mut small = [0u8; 512];
            member
                .read_at(&mut small, area + rng.gen_range(0..64) * 512)
                .unwrap();
            reads += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(
            writes > 100 && reads > 100,
            "{writes} writes, {reads} reads"
        );
        assert_eq!(member.checksum_errors(), 0);
        assert_eq!(member.untrusted_blocks(), 0);
    }
}
