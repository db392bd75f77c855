//! Staged writes: a write whose bytes the server holds in a pipe (spliced
//! from its socket as page references) goes from there into the members
//! without being copied into this process and out again.
//!
//! Where its bytes go, cheapest first:
//! - members mapped into memory (files on tmpfs; `member::mapped`): read
//!   from the pipe straight into the mapped pages, one copy, and on a
//!   parity level the row's parity computed straight into the parity
//!   members' pages. Parity levels take only whole rows this way;
//! - buffered member files, levels without parity: spliced from the pipe
//!   into the files, the file's own copy being the only one (`tee` gives
//!   each further copy of a mirror its own page references);
//! - otherwise (a partial row of a parity level, a member swapped in since
//!   the write was staged): copied into memory and written the plain way.
//!
//! The plain path costs two copies (the socket into a buffer, the buffer
//! into the member's pages); `nbdkit memory` makes one. Everything else
//! about a write is as on the plain path: the row's lock while its members
//! are written (a resync must not read a half-written row), the
//! write-intent bitmap, the read cache, member failures, and writes to a
//! replacement below its copy point.

use super::io::{lost_error, View, WriteTarget};
use crate::engine::Engine;
use crate::export::StagedWrite;
use crate::geometry::{Place, StripeMap};
use crate::member::mapped::Mapped;
use crate::member::AlignedBuf;
use crate::units::SECTOR_BYTES;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Rows (pieces of rows) of staged writes by where their bytes went, since
/// start: for tests, which must know a path ran, not only that the
/// bytes came out right.
#[derive(Default)]
pub(in crate::engine) struct StagedRows {
    /// Into mapped members' pages (levels without parity).
    pub(in crate::engine) mapped: AtomicU64,
    /// Whole parity rows, parity computed in the parity members' pages.
    pub(in crate::engine) parity_in_place: AtomicU64,
    /// Spliced into member files.
    pub(in crate::engine) spliced: AtomicU64,
    /// Copied into memory and written the plain way.
    pub(in crate::engine) copied: AtomicU64,
}

impl Engine {
    /// Whether a write of `len` bytes at `offset` may be staged: nothing
    /// that must see its bytes in memory (write-back, a journal, the
    /// stripe cache holding rows), and members that take them: buffered
    /// or mapped files on a level without parity; mapped files, and at
    /// least one whole row in the write, on a parity level (its partial
    /// rows are copied).
    pub(in crate::engine) fn takes_staged(&self, offset: u64, len: usize) -> bool {
        if self.read_only
            || self.journal.is_some()
            || self.reshaping.load(Ordering::SeqCst)
            || self.tunables.write_back()
            || self.datapath.cache.has_batches()
        {
            return false;
        }
        let table = self.table();
        let mut members = table.by_role.iter().chain(&table.replacing).flatten();
        if !self.geometry().level().has_parity() {
            // In memory only: a file system on a disk may lack splice into
            // files, and there the plain path's copy is not what costs.
            return members.all(|e| {
                let member = &e.slot.member;
                member.in_memory() && (member.mapped().is_some() || member.splice_fd().is_some())
            });
        }
        if !members.all(|e| e.slot.member.mapped().is_some()) {
            return false;
        }
        // Rows of raid4/5/6 are all alike and follow each other from 0.
        let row_bytes = (self.datapath.row.strip_bytes * self.datapath.row.data_strips) as u64;
        offset.div_ceil(row_bytes) * row_bytes + row_bytes <= offset + len as u64
    }

    /// Writes `len` staged bytes at array byte `offset`, row by row under
    /// each row's lock. Stops at the first error; the caller throws away
    /// what is left.
    pub(in crate::engine) fn write_staged_bytes(
        &self,
        offset: u64,
        len: usize,
        data: &mut dyn StagedWrite,
    ) -> io::Result<()> {
        let (_in_flight, _sequential) = self.datapath.cache.write_arrives(offset, len);
        self.datapath.reads.write_begins();
        let result = self.for_each_piece(offset, len, |engine, map, in_stripe, range| {
            let _guard = engine.datapath.locks.lock(map.stripe);
            let _in_flight = engine.bitmap_start_write(map.stripe)?;
            let view = engine.view(map.stripe);
            let row_bytes = (map.data_sectors() * SECTOR_BYTES) as usize;
            let counters = &engine.datapath.staged_rows;
            let taken = if map.p.is_none() {
                write_mirrored_row(&view, &map, in_stripe, range.len(), data)?
            } else if in_stripe == 0 && range.len() == row_bytes && map.r.is_none() {
                write_parity_row(&view, &map, data)?.then_some(&counters.parity_in_place)
            } else {
                None
            };
            if let Some(counter) = taken {
                counter.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            counters.copied.fetch_add(1, Ordering::Relaxed);
            let mut bytes = AlignedBuf::zeroed(range.len());
            data.into_memory(&mut bytes)?;
            engine.write_parts_locked(&map, &[(in_stripe, &bytes)], false, false, true)
        });
        self.datapath.reads.write_done(offset..offset + len as u64);
        result
    }
}

/// The mapping of `target`'s member with its range reserved, or `None`
/// (not mapped, or the file system could not give the pages: the plain
/// write will meet the same error and settle it).
fn reserved<'t>(target: &'t WriteTarget, len: usize) -> Option<&'t Mapped> {
    let mapped = target.member().mapped()?;
    // A mapping that met a bus error takes the store all the same (into
    // the file's pages that are left, or anonymous ones past its end), and
    // its check then fails the member. The splice path instead would write
    // the file and grow it back over what was cut.
    if mapped.faulted() {
        return Some(mapped);
    }
    mapped.reserve(target.offset(), len as u64).ok()?;
    Some(mapped)
}

/// A row of a level without parity: each touched strip to every present
/// copy, and a replacement's below its copy point. Gives the counter of
/// the way it took the row, or `None` when it did not (nothing was taken
/// from `data` then).
fn write_mirrored_row<'e>(
    view: &View<'e>,
    map: &StripeMap,
    in_stripe: usize,
    len: usize,
    data: &mut dyn StagedWrite,
) -> io::Result<Option<&'e AtomicU64>> {
    let counters = &view.engine.datapath.staged_rows;
    let piece = Engine::piece(map.clone(), in_stripe, len, &[]);
    // The touched strips in order hold the row's bytes in order: a row of
    // a level without parity is its strips end to end.
    let mut strips = Vec::new();
    for i in (0..map.data.len()).filter(|&i| piece.touched(i)) {
        let at = piece.range(i).start;
        let copies: Vec<_> = map.data[i]
            .copies
            .iter()
            .filter(|c| view.present(c))
            .map(|c| (c, at, &[][..]))
            .collect();
        if copies.is_empty() {
            return Err(lost_error(map, "every copy of the data is lost"));
        }
        let mut targets = Vec::new();
        view.write_targets(&copies, false, &mut targets);
        strips.push((piece.range(i).len(), targets));
    }
    debug_assert_eq!(strips.iter().map(|(n, _)| n).sum::<usize>(), len);
    let mapped: Option<Vec<Vec<&Mapped>>> = strips
        .iter()
        .map(|(n, targets)| targets.iter().map(|t| reserved(t, *n)).collect())
        .collect();
    if let Some(mapped) = mapped {
        for ((n, targets), maps) in strips.iter().zip(mapped) {
            let copied = write_mapped_copies(*n, targets, &maps, data);
            if copied.is_err() {
                // The kernel's stores into a page past a file's end fail
                // with EFAULT and mark nothing: find such pages.
                for (m, t) in maps.iter().zip(targets) {
                    m.touch(t.offset(), *n);
                }
            }
            // A copy whose mapping met a bus error is not on its member.
            let errors = maps
                .iter()
                .zip(targets)
                .map(|(m, t)| {
                    m.check().err().map(|e| {
                        crate::member::io_error(t.member().name(), "write", t.offset(), *n, e)
                    })
                })
                .collect();
            view.settle_writes(targets, errors)?;
            copied?;
        }
        return Ok(Some(&counters.mapped));
    }
    let files = strips
        .iter()
        .flat_map(|(_, targets)| targets)
        .all(|t| t.member().splice_fd().is_some());
    if !files {
        return Ok(None);
    }
    for (n, targets) in &strips {
        write_strip_to_files(view, *n, targets, data)?;
    }
    Ok(Some(&counters.spliced))
}

/// Reads the next `n` bytes into the first copy's pages and copies them
/// to the others. If the source fails part way the copies still get what
/// the first holds: they stay equal, whatever the bytes.
fn write_mapped_copies(
    n: usize,
    targets: &[WriteTarget],
    maps: &[&Mapped],
    data: &mut dyn StagedWrite,
) -> io::Result<()> {
    // Copies of a strip are on different members or, for a replacement,
    // a different file: their slices never overlap.
    debug_assert!((1..maps.len()).all(|k| maps[..k].iter().all(|m| !std::ptr::eq(*m, maps[k]))));
    // SAFETY: each range is reserved (`reserved`) and the row's lock is
    // held, so no other store or slice touches it, and they are distinct.
    let slice = |k: usize| unsafe { maps[k].slice_mut(targets[k].offset(), n) };
    let first = slice(0);
    let result = data.into_memory(first);
    for k in 1..targets.len() {
        slice(k).copy_from_slice(first);
    }
    result
}

/// A whole row of a parity level, every member present, mapped and not
/// being replaced: its data read from the pipe into the data members'
/// pages, its parity computed into the parity members'. Says whether it
/// took the row (else nothing was taken from `data`).
fn write_parity_row(view: &View, map: &StripeMap, data: &mut dyn StagedWrite) -> io::Result<bool> {
    let strip = (map.strip_sectors * SECTOR_BYTES) as usize;
    let places: Vec<&Place> = map
        .data
        .iter()
        .map(|d| &d.copies[0])
        .chain(map.p.iter())
        .chain(map.q.iter())
        .collect();
    let replacing = &view.table.replacing;
    let mut regions = Vec::with_capacity(places.len());
    for place in &places {
        if !view.present(place) || replacing[view.home(place).member].is_some() {
            return Ok(false);
        }
        let (member, at) = view.offset_of(place, 0);
        let Some(mapped) = member.mapped() else {
            return Ok(false);
        };
        if mapped.reserve(at, strip as u64).is_err() {
            return Ok(false);
        }
        regions.push((member, at));
    }
    // SAFETY: every range is reserved, on its own member, and the row's
    // lock is held: nothing else in the process uses them. The members
    // live in the view's table for as long as the slices.
    let mut slices: Vec<&mut [u8]> = regions
        .iter()
        .map(|(member, at)| unsafe { member.mapped().expect("checked").slice_mut(*at, strip) })
        .collect();
    let (data_slices, parity) = slices.split_at_mut(map.data.len());
    let mut result = Ok(());
    for slice in data_slices.iter_mut() {
        result = data.into_memory(slice);
        if result.is_err() {
            // The rest keeps its old bytes; parity below covers what the
            // strips hold, so the row stays consistent.
            break;
        }
    }
    let views: Vec<&[u8]> = data_slices.iter().map(|s| &**s).collect();
    let syndrome = view.engine.datapath.syndrome;
    match parity {
        [p] => syndrome.gen_p(&views, p),
        [p, q] => {
            let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
            syndrome.gen_pq(&views, &exps, p, q);
        }
        _ => unreachable!("a parity row has P, or P and Q"),
    }
    let window: Range<usize> = 0..strip;
    view.engine
        .datapath
        .parity_cache
        .drop_window(map.stripe, &window);
    drop(slices);
    // A strip whose mapping met a bus error is not on its member: the
    // member fails, as for any write error.
    for (place, (member, at)) in places.iter().zip(&regions) {
        let mapped = member.mapped().expect("checked");
        if result.is_err() {
            // As for mirrored rows: the kernel's EFAULT marks nothing.
            mapped.touch(*at, strip);
        }
        if let Err(e) = mapped.check() {
            let e = crate::member::io_error(member.name(), "write", *at, strip, e);
            view.fail_on_write(place.member, member, &e)?;
        }
    }
    result.map(|()| true)
}

/// Moves the next `n` staged bytes into every target file of one strip,
/// then acts on what failed as a plain write does.
fn write_strip_to_files(
    view: &View,
    n: usize,
    targets: &[WriteTarget],
    data: &mut dyn StagedWrite,
) -> io::Result<()> {
    let files: Vec<_> = targets
        .iter()
        .map(|t| {
            let fd = t.member().splice_fd().expect("checked by the caller");
            (fd, t.offset())
        })
        .collect();
    let errors = data.into_files(n, &files)?;
    let errors = errors
        .into_iter()
        .zip(targets)
        .map(|(e, t)| {
            e.map(|e| crate::member::io_error(t.member().name(), "write", t.offset(), n, e))
        })
        .collect();
    view.settle_writes(targets, errors)
}
