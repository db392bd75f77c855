//! Requests that are not aligned to the backend's blocks.
//!
//! A client that agreed to no block sizes (OPT_EXPORT_NAME, or OPT_GO
//! without an NBD_INFO_BLOCK_SIZE request) may address single bytes: the
//! spec asks a server to accept a minimum block size of 1 from it, and
//! nbd-tester-client checks that it does. The backend only takes whole
//! blocks, so the server cuts such a request at the block boundaries: the
//! whole blocks in the middle (the body) go to the backend as they are, and
//! each partial block at an end (an edge) is a read-modify-write of that
//! one block.
//!
//! A read-modify-write must not lose a write that lands on its block
//! between its read and its write, from this connection or another. So
//! every command that changes blocks holds [`WriteLocks`] while the backend
//! runs it: a shared lock on the regions it touches, and an edge's
//! read-modify-write an exclusive one on its block's region. Aligned
//! requests from clients that did agree to block sizes take the shared lock
//! too, so that they cannot slip in between either.

use std::io;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::export::{BlockBackend, ZeroFlags};
use crate::member::AlignedBuf;

/// A partial block at one end of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Edge {
    /// Where the block starts on the export.
    pub(super) block_offset: u64,
    /// Where the request's bytes start in the block.
    pub(super) in_block: usize,
    pub(super) len: usize,
    /// Where these bytes start in the request.
    pub(super) in_request: usize,
}

/// The whole blocks of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Body {
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) in_request: usize,
}

/// A request's bytes cut at the block boundaries, in address order:
/// `head`, `body`, `tail`, each present only when it holds bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Split {
    pub(super) head: Option<Edge>,
    pub(super) body: Option<Body>,
    pub(super) tail: Option<Edge>,
}

impl Split {
    /// Cuts `offset..offset + len` at multiples of `block_bytes`.
    pub(super) fn new(offset: u64, len: u64, block_bytes: u32) -> Split {
        let block = block_bytes as u64;
        assert!(block.is_power_of_two());
        let end = offset
            .checked_add(len)
            .expect("a checked request ends in range");
        let body_start = offset.next_multiple_of(block).min(end);
        let body_end = (end - end % block).max(body_start);
        let head = (offset < body_start).then(|| Edge {
            block_offset: offset - offset % block,
            in_block: (offset % block) as usize,
            len: (body_start - offset) as usize,
            in_request: 0,
        });
        let body = (body_start < body_end).then(|| Body {
            offset: body_start,
            len: body_end - body_start,
            in_request: (body_start - offset) as usize,
        });
        // A range inside one block is all head: its end is then body_end.
        let tail = (body_end < end).then(|| Edge {
            block_offset: body_end,
            in_block: 0,
            len: (end - body_end) as usize,
            in_request: (body_end - offset) as usize,
        });
        let split = Split { head, body, tail };
        split.assert_covers(offset, len, block);
        split
    }

    /// The pieces tile the request exactly, edges stay inside one block
    /// without filling it, and the body is whole blocks.
    fn assert_covers(&self, offset: u64, len: u64, block: u64) {
        let mut at = 0u64;
        if let Some(h) = self.head {
            assert!(h.in_block > 0 && h.in_block + h.len <= block as usize);
            at += h.len as u64;
        }
        if let Some(b) = self.body {
            assert!(b.offset == offset + at && b.in_request as u64 == at);
            assert!(b.offset % block == 0 && b.len % block == 0 && b.len > 0);
            at += b.len;
        }
        if let Some(t) = self.tail {
            assert!(t.in_block == 0 && t.len > 0 && (t.len as u64) < block);
            assert!(t.block_offset == offset + at && t.in_request as u64 == at);
            at += t.len as u64;
        }
        assert_eq!(at, len, "the pieces of {offset}+{len} do not cover it");
    }

    fn edges(&self) -> impl Iterator<Item = Edge> {
        self.head.into_iter().chain(self.tail)
    }
}

/// The whole blocks that hold `offset..offset + len`: where they start and
/// how many bytes they are.
pub(super) fn covering(offset: u64, len: u64, block_bytes: u32) -> (u64, u64) {
    let block = block_bytes as u64;
    let start = offset - offset % block;
    let end = (offset + len).next_multiple_of(block);
    (start, end - start)
}

/// Whether `offset..offset + len` starts and ends on block boundaries.
pub(super) fn is_aligned(offset: u64, len: u64, block_bytes: u32) -> bool {
    let block = block_bytes as u64;
    offset.is_multiple_of(block) && len.is_multiple_of(block)
}

// ---------------------------------------------------------------------------
// The locks.

/// Bytes of the export behind one slot of [`WriteLocks`]. A power of two at
/// least as large as any minimum block (64 KiB), so that an edge's block
/// lies in one region; large enough that a 32 MiB write takes 33 slots.
const REGION_BYTES: u64 = 1 << 20;
/// Slots of [`WriteLocks`]: bounded memory whatever the export's size.
const SLOTS: usize = 64;

/// One lock per cache line, so that writes to different regions do not
/// bounce a line between CPUs.
#[repr(align(128))]
struct Slot(RwLock<()>);

/// The locks that order read-modify-writes against every other change of
/// the same blocks (see the module documentation). Region `r` is guarded by
/// slot `r % SLOTS`: two regions that share a slot merely wait for each
/// other. A thread takes several slots only shared and in ascending order,
/// and an exclusive slot alone, so no cycle can form.
pub(crate) struct WriteLocks {
    slots: Vec<Slot>,
}

/// The shared locks a change holds while the backend runs it, released
/// when it is dropped.
pub(super) struct SharedGuard<'a> {
    /// A range in one region, as nearly every request is: no allocation.
    _one: Option<RwLockReadGuard<'a, ()>>,
    _many: Vec<RwLockReadGuard<'a, ()>>,
}

impl WriteLocks {
    pub(crate) fn new() -> WriteLocks {
        WriteLocks {
            slots: (0..SLOTS).map(|_| Slot(RwLock::new(()))).collect(),
        }
    }

    fn slot(offset: u64) -> usize {
        ((offset / REGION_BYTES) % SLOTS as u64) as usize
    }

    /// Shared locks on the regions of `offset..offset + len` (`len` > 0).
    pub(super) fn shared(&self, offset: u64, len: u64) -> SharedGuard<'_> {
        assert!(len > 0);
        let first = offset / REGION_BYTES;
        let last = (offset + len - 1) / REGION_BYTES;
        let read = |slot: usize| self.slots[slot].0.read().unwrap_or_else(|e| e.into_inner());
        if first == last {
            return SharedGuard {
                _one: Some(read(Self::slot(offset))),
                _many: Vec::new(),
            };
        }
        let mut mask = 0u64;
        if last - first + 1 >= SLOTS as u64 {
            mask = u64::MAX;
        } else {
            for region in first..=last {
                mask |= 1 << Self::slot(region * REGION_BYTES);
            }
        }
        // Bits from the lowest up: the ascending order every taker keeps.
        let guards = (0..SLOTS).filter(|s| mask & (1 << s) != 0).map(read);
        SharedGuard {
            _one: None,
            _many: guards.collect(),
        }
    }

    /// The exclusive lock on the region of the block at `block_offset`.
    fn exclusive(&self, block_offset: u64) -> RwLockWriteGuard<'_, ()> {
        self.slots[Self::slot(block_offset)]
            .0
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }
}

// ---------------------------------------------------------------------------
// The commands, cut at the blocks.

/// Reads `len` bytes at `offset` for a client that may address bytes: the
/// blocks that hold them are read into `scratch`, in pieces of at most
/// `max_piece` bytes (whole blocks, the backend's maximum payload). Gives
/// where the requested bytes lie in `scratch`.
pub(super) fn read(
    backend: &dyn BlockBackend,
    block_bytes: u32,
    max_piece: u32,
    offset: u64,
    len: usize,
    scratch: &mut AlignedBuf,
) -> io::Result<std::ops::Range<usize>> {
    assert!(max_piece >= block_bytes && max_piece.is_multiple_of(block_bytes));
    let (start, span) = covering(offset, len as u64, block_bytes);
    let span = span as usize;
    if scratch.len() < span {
        *scratch = AlignedBuf::zeroed(span);
    }
    let mut done = 0;
    while done < span {
        let n = (span - done).min(max_piece as usize);
        backend.read(start + done as u64, &mut scratch[done..done + n])?;
        done += n;
    }
    let skip = (offset - start) as usize;
    Ok(skip..skip + len)
}

/// What a read-modify-write puts into its block.
#[derive(Clone, Copy)]
enum Patch<'a> {
    Data(&'a [u8]),
    Zeroes,
}

/// Writes `data` at `offset`: each edge a read-modify-write of its block,
/// the body as it is. With `fua`, every piece is durable before it returns.
pub(super) fn write(
    backend: &dyn BlockBackend,
    locks: &WriteLocks,
    block_bytes: u32,
    offset: u64,
    data: &[u8],
    fua: bool,
) -> io::Result<()> {
    let split = Split::new(offset, data.len() as u64, block_bytes);
    for edge in split.edges() {
        let bytes = &data[edge.in_request..edge.in_request + edge.len];
        patch_block(backend, locks, block_bytes, edge, Patch::Data(bytes), fua)?;
    }
    if let Some(body) = split.body {
        let bytes = &data[body.in_request..body.in_request + body.len as usize];
        let _shared = locks.shared(body.offset, body.len);
        backend.write(body.offset, bytes, fua)?;
    }
    Ok(())
}

/// Zeroes exactly `len` bytes at `offset`: the edges by read-modify-write,
/// the body with the backend's own write-zeroes.
pub(super) fn write_zeroes(
    backend: &dyn BlockBackend,
    locks: &WriteLocks,
    block_bytes: u32,
    offset: u64,
    len: u64,
    flags: ZeroFlags,
) -> io::Result<()> {
    let split = Split::new(offset, len, block_bytes);
    for edge in split.edges() {
        patch_block(backend, locks, block_bytes, edge, Patch::Zeroes, flags.fua)?;
    }
    if let Some(body) = split.body {
        let _shared = locks.shared(body.offset, body.len);
        backend.write_zeroes(body.offset, body.len, flags)?;
    }
    Ok(())
}

/// Trims the whole blocks of `offset..offset + len`. The edges are left
/// alone: a trim is a hint, and forgetting a partial block would forget
/// bytes outside the request.
pub(super) fn trim(
    backend: &dyn BlockBackend,
    locks: &WriteLocks,
    block_bytes: u32,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    if let Some(body) = Split::new(offset, len, block_bytes).body {
        let _shared = locks.shared(body.offset, body.len);
        backend.trim(body.offset, body.len)?;
    }
    Ok(())
}

/// Puts `patch` into the edge's bytes of its block: reads the block, patches
/// it and writes it back, holding its region exclusively throughout so
/// that no other change of the block lands in between.
fn patch_block(
    backend: &dyn BlockBackend,
    locks: &WriteLocks,
    block_bytes: u32,
    edge: Edge,
    patch: Patch,
    fua: bool,
) -> io::Result<()> {
    let mut block = AlignedBuf::zeroed(block_bytes as usize);
    let _exclusive = locks.exclusive(edge.block_offset);
    backend.read(edge.block_offset, &mut block)?;
    let bytes = &mut block[edge.in_block..edge.in_block + edge.len];
    match patch {
        Patch::Data(data) => bytes.copy_from_slice(data),
        Patch::Zeroes => bytes.fill(0),
    }
    backend.write(edge.block_offset, &block, fua)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::MemoryBackend;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn every_range_is_cut_into_edges_and_whole_blocks() {
        // `Split::new` asserts that its pieces tile the range; this walks
        // every small range and also checks which pieces there are.
        for block in [1u32, 2, 8, 512] {
            let b = block as u64;
            for offset in 0..3 * b + 2 {
                for len in 1..4 * b + 2 {
                    let split = Split::new(offset, len, block);
                    let end = offset + len;
                    assert_eq!(split.head.is_some(), offset % b != 0, "{offset}+{len}/{b}");
                    let same_block = offset / b == (end - 1) / b;
                    let tail_alone = end % b != 0 && !(same_block && offset % b != 0);
                    assert_eq!(split.tail.is_some(), tail_alone, "{offset}+{len}/{b}");
                    assert_eq!(
                        is_aligned(offset, len, block),
                        split.head.is_none() && split.tail.is_none()
                    );
                    let (start, span) = covering(offset, len, block);
                    assert!(start <= offset && end <= start + span && span % b == 0);
                    assert!(span < len + 2 * b);
                }
            }
        }
    }

    /// A device of 512-byte blocks (which refuses anything else) filled
    /// with a pattern, and the same bytes in a plain vector as the model.
    fn patterned(size: u64) -> (MemoryBackend, Vec<u8>) {
        let m = MemoryBackend::new(size);
        let model: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        m.write(0, &model, false).unwrap();
        (m, model)
    }

    #[test]
    fn byte_ranges_read_write_and_zero_exactly() {
        let (m, mut model) = patterned(64 << 10);
        let locks = WriteLocks::new();
        let mut scratch = AlignedBuf::zeroed(0);
        let cases: [(u64, usize); 7] = [
            (3, 1000),
            (1, 1),
            (511, 2),
            (512, 100),
            (700, 512 * 5),
            (4096 - 9, 9),
            (10_000, 20_000),
        ];
        for (i, &(offset, len)) in cases.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|j| (j as u8) ^ (i as u8 + 1)).collect();
            write(&m, &locks, 512, offset, &data, i % 2 == 0).unwrap();
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
            let got = read(&m, 512, 4096, offset, len, &mut scratch).unwrap();
            assert_eq!(&scratch[got], &data[..], "case {i}");
            assert!(
                m.contents() == model,
                "neighbouring bytes changed in case {i}"
            );
        }
        let zero = ZeroFlags {
            fua: true,
            may_trim: true,
        };
        write_zeroes(&m, &locks, 512, 5, 3000, zero).unwrap();
        model[5..3005].fill(0);
        assert!(m.contents() == model, "write-zeroes zeroed other bytes");
        // Trim keeps the edges and forgets (here: zeroes) the whole blocks.
        trim(&m, &locks, 512, 100, 2000).unwrap();
        model[512..2048].fill(0);
        assert!(m.contents() == model, "trim touched the partial blocks");
        let trims = m.stats().trims;
        trim(&m, &locks, 512, 600, 300).unwrap();
        assert_eq!(
            m.stats().trims,
            trims,
            "a trim without whole blocks reached the backend"
        );
    }

    #[test]
    fn a_read_longer_than_the_maximum_payload_goes_in_pieces() {
        let (m, model) = patterned(64 << 10);
        let mut scratch = AlignedBuf::zeroed(0);
        let reads = m.stats().reads;
        let got = read(&m, 512, 4096, 100, 8192, &mut scratch).unwrap();
        assert_eq!(&scratch[got], &model[100..100 + 8192]);
        // 8192 bytes at 100 lie in 17 blocks: 4096 + 4096 + 512.
        assert_eq!(m.stats().reads - reads, 3);
    }

    #[test]
    fn failed_reads_and_writes_are_reported() {
        let (m, _) = patterned(64 << 10);
        let locks = WriteLocks::new();
        m.set_fail_range(Some(4096..4608));
        let mut scratch = AlignedBuf::zeroed(0);
        assert!(read(&m, 512, 4096, 4000, 200, &mut scratch).is_err());
        assert!(write(&m, &locks, 512, 4100, &[1; 10], false).is_err());
        assert!(write_zeroes(&m, &locks, 512, 4000, 1000, ZeroFlags::default()).is_err());
    }

    #[test]
    fn shared_locks_are_taken_in_ascending_slot_order() {
        let locks = WriteLocks::new();
        let count = |g: &SharedGuard| g._one.iter().count() + g._many.len();
        assert_eq!(count(&locks.shared(0, 4096)), 1);
        assert_eq!(count(&locks.shared(REGION_BYTES - 1, 2)), 2);
        assert_eq!(count(&locks.shared(3, 32 << 20)), 33);
        // A range that wraps around the table takes each slot once.
        assert_eq!(count(&locks.shared(60 * REGION_BYTES, 8 * REGION_BYTES)), 8);
        assert_eq!(count(&locks.shared(0, 100 * REGION_BYTES)), SLOTS);
        // Held shared locks do not keep others from sharing them.
        let _a = locks.shared(0, 3 * REGION_BYTES);
        let _b = locks.shared(REGION_BYTES, 70 * REGION_BYTES);
    }

    /// Writers of disjoint bytes of the same blocks, each checking after
    /// every write that its bytes read back as it left them: a
    /// read-modify-write that read before another's write and wrote after
    /// it would hand back stale bytes. The slow range widens that window
    /// to a millisecond.
    #[test]
    fn concurrent_changes_of_one_block_are_not_lost() {
        let m = MemoryBackend::new(64 << 10);
        m.set_slow_range(Some((0..1024, Duration::from_millis(1))));
        let locks = WriteLocks::new();
        let done = AtomicUsize::new(0);
        // Three byte-granular writers inside block 0, each owning its
        // bytes, and one inside block 1 whose bytes the aligned writer
        // below overwrites (so it cannot check them).
        let owners: [(u64, usize); 4] = [(3, 10), (100, 50), (500, 12), (512, 18)];
        std::thread::scope(|scope| {
            for (n, &(offset, len)) in owners.iter().enumerate() {
                let (m, locks, done) = (&m, &locks, &done);
                scope.spawn(move || {
                    let mut scratch = AlignedBuf::zeroed(0);
                    for round in 0..40u8 {
                        let data = vec![round ^ (n as u8 * 64 + 1); len];
                        write(m, locks, 512, offset, &data, false).unwrap();
                        let got = read(m, 512, 4096, offset, len, &mut scratch).unwrap();
                        if offset < 512 {
                            assert_eq!(&scratch[got], &data[..], "writer {n}, round {round}");
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }
            // An aligned writer of block 1, as a client that agreed to
            // block sizes is: the bytes only it writes must read back as
            // it wrote them.
            scope.spawn(|| {
                let mut round = 0u8;
                let mut block = [0u8; 512];
                while done.load(Ordering::Relaxed) < owners.len() {
                    round = round.wrapping_add(1);
                    {
                        let _shared = locks.shared(512, 512);
                        m.write(512, &[round; 512], false).unwrap();
                    }
                    m.read(512, &mut block).unwrap();
                    assert!(block[18..].iter().all(|&b| b == round), "round {round}");
                }
            });
        });
    }
}
