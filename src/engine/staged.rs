//! Staged writes: a write whose bytes the server holds in a pipe (spliced
//! from its socket as page references) goes from there straight into the
//! page caches of buffered member files, without being copied into this
//! process and out again.
//!
//! Only levels without parity take them (raid0, linear, raid1, raid10):
//! parity needs the bytes in memory. A write of members in memory costs
//! two copies on the plain path (the socket into a buffer, the buffer into
//! the member's pages) and one here, as many as `nbdkit memory` makes.
//! Everything else about a write is as on the plain path: the row's lock
//! while its members are written (a resync of a mirror must not copy a
//! half-written row), the write-intent bitmap, the read cache, member
//! failures, and writes to a replacement below its copy point.

use super::io::{lost_error, View, WriteTarget};
use super::Engine;
use crate::export::StagedWrite;
use crate::member::AlignedBuf;
use std::io;

impl Engine {
    /// Whether a write may be staged: a level without parity, nothing
    /// that must see its bytes in memory (write-back, a journal, the
    /// stripe cache holding rows), and every member a buffered file.
    pub(super) fn takes_staged(&self) -> bool {
        if self.read_only
            || self.geometry.level().has_parity()
            || self.journal.is_some()
            || self.tunables.write_back()
            || self.cache.has_batches()
        {
            return false;
        }
        let table = self.table();
        table
            .by_role
            .iter()
            .chain(&table.replacing)
            .flatten()
            .all(|e| e.slot.member.splice_fd().is_some())
    }

    /// Writes `len` staged bytes at array byte `offset`, row by row under
    /// each row's lock. A row whose targets are not all buffered files (a
    /// member swapped in since [`takes_staged`](Self::takes_staged) said
    /// yes) has its bytes copied into memory and written the plain way.
    /// Stops at the first error; the caller throws away what is left.
    pub(super) fn write_staged_bytes(
        &self,
        offset: u64,
        len: usize,
        data: &mut dyn StagedWrite,
    ) -> io::Result<()> {
        let (_in_flight, _sequential) = self.cache.write_arrives(offset, len);
        self.reads.write_begins();
        let result = self.for_each_piece(offset, len, |engine, map, in_stripe, range| {
            let _guard = engine.locks.lock(map.stripe);
            let _in_flight = engine.bitmap_start_write(map.stripe)?;
            let view = engine.view(map.stripe);
            let piece = Engine::piece(map.clone(), in_stripe, range.len(), &[]);
            // The touched strips in order hold the row's bytes in order:
            // a row of a level without parity is its strips end to end.
            let strips: Vec<usize> = (0..map.data.len()).filter(|&i| piece.touched(i)).collect();
            debug_assert_eq!(
                strips.iter().map(|&i| piece.range(i).len()).sum::<usize>(),
                range.len()
            );
            let mut planned = Vec::with_capacity(strips.len());
            for &i in &strips {
                let at = piece.range(i).start;
                let copies: Vec<_> = map.data[i]
                    .copies
                    .iter()
                    .filter(|c| view.present(c))
                    .map(|c| (c, at, &[][..]))
                    .collect();
                if copies.is_empty() {
                    return Err(lost_error(&map, "every copy of the data is lost"));
                }
                let mut targets = Vec::new();
                view.write_targets(&copies, &mut targets);
                planned.push((piece.range(i).len(), targets));
            }
            let all_files = planned
                .iter()
                .flat_map(|(_, targets)| targets)
                .all(|t| t.member().splice_fd().is_some());
            if !all_files {
                let mut bytes = AlignedBuf::zeroed(range.len());
                data.into_memory(&mut bytes)?;
                return engine.write_parts_locked(&map, &[(in_stripe, &bytes)], false);
            }
            for (n, targets) in &planned {
                write_strip(&view, *n, targets, data)?;
            }
            Ok(())
        });
        self.reads.write_done(offset..offset + len as u64);
        result
    }
}

/// Moves the next `n` staged bytes into every target of one strip, then
/// acts on what failed as a plain write does.
fn write_strip(
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
            e.map(|e| {
                let name = t.member().name();
                let what = format!("{name}: write at {}+{n}: {e}", t.offset());
                io::Error::new(e.kind(), what)
            })
        })
        .collect();
    view.settle_writes(targets, errors)
}
