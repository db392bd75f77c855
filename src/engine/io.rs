//! The live request path: reads and writes of any size and alignment,
//! split into stripe pieces. A partial-stripe write updates parity by
//! read-modify-write or reconstruct-write, whichever needs fewer reads (md's
//! rmw_level 1: ties go to reconstruct-write); a full-stripe write reads
//! nothing. Lost members are reconstructed on read and left out on write.
//!
//! Within one stripe the work is confined to a *window*: the byte range,
//! relative to the start of each strip, that the request touches in any
//! strip. Parity is read, computed and written over that window only.

use super::cache::{Batch, Offer, StripeCache};
use super::members::{member_error, member_of, MemberTable};
use super::paritycache::Which;
use super::Engine;
use crate::geometry::{Place, StripeMap};
use crate::member::{batch, AlignedBuf, IoOp, MemberRef};
use crate::parity;
use crate::units::SECTOR_BYTES;
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn lost(what: String) -> io::Error {
    io::Error::other(what)
}

/// The part of one stripe that a request covers.
struct Piece<'a> {
    map: StripeMap,
    /// For each data strip, the byte range (strip-relative) the request covers; empty if none.
    ranges: Vec<Range<usize>>,
    /// Union of the ranges: where parity changes.
    window: Range<usize>,
    /// The request's bytes for this stripe, starting at the first covered byte.
    data: &'a [u8],
    /// Offset of the first covered byte within the stripe's data.
    start_in_stripe: usize,
}

impl Piece<'_> {
    fn strip_bytes(&self) -> usize {
        (self.map.strip_sectors * SECTOR_BYTES) as usize
    }

    /// The request's bytes for strip `i` (its covered range).
    fn new_bytes(&self, i: usize) -> &[u8] {
        let r = &self.ranges[i];
        let from = i * self.strip_bytes() + r.start - self.start_in_stripe;
        &self.data[from..from + r.len()]
    }

    fn touched(&self, i: usize) -> bool {
        !self.ranges[i].is_empty()
    }

    /// Whether strip `i`'s new bytes cover the whole window.
    fn covers_window(&self, i: usize) -> bool {
        self.ranges[i].start <= self.window.start && self.ranges[i].end >= self.window.end
    }
}

impl Engine {
    /// Calls `f` for each stripe piece of the byte range [offset, offset+len).
    fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&Engine, StripeMap, usize, Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset
            .checked_add(len as u64)
            .filter(|e| *e <= self.size_bytes());
        if end.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request beyond the end of the array",
            ));
        }
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let map = self
                .geometry
                .stripe(self.geometry.stripe_of(at / SECTOR_BYTES));
            let stripe_start = map.array_sector * SECTOR_BYTES;
            let stripe_bytes = (map.data_sectors() * SECTOR_BYTES) as usize;
            let in_stripe = (at - stripe_start) as usize;
            let n = (stripe_bytes - in_stripe).min(len - done);
            f(self, map, in_stripe, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    /// The piece of stripe `map` covering `len` bytes from `in_stripe`;
    /// `data` holds the bytes of a write (empty for a read).
    fn piece<'a>(map: StripeMap, in_stripe: usize, len: usize, data: &'a [u8]) -> Piece<'a> {
        debug_assert!(data.is_empty() || data.len() == len);
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        let end = in_stripe + len;
        let ranges: Vec<Range<usize>> = (0..map.data.len())
            .map(|i| {
                let (s, e) = (i * strip_bytes, (i + 1) * strip_bytes);
                let (a, b) = (in_stripe.max(s), end.min(e));
                if a < b {
                    a - s..b - s
                } else {
                    0..0
                }
            })
            .collect();
        let touched = ranges.iter().filter(|r| !r.is_empty());
        let window_start = touched.clone().map(|r| r.start).min().unwrap_or(0);
        let window_end = touched.map(|r| r.end).max().unwrap_or(0);
        Piece {
            map,
            ranges,
            window: window_start..window_end,
            data,
            start_in_stripe: in_stripe,
        }
    }

    /// Reads array bytes at `offset` into `buf`.
    pub(super) fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        self.for_each_piece(offset, len, |engine, map, in_stripe, range| {
            let out = &mut buf[range.clone()];
            // Bytes still in the stripe cache are newer than the members'.
            let pending = if engine.cache.has_batches() {
                engine
                    .cache
                    .pending_in(map.stripe, in_stripe..in_stripe + range.len())
            } else {
                Vec::new()
            };
            engine.with_retries(map.stripe, false, |view| {
                let piece = Engine::piece(map.clone(), in_stripe, range.len(), &[]);
                view.read_piece(&piece, in_stripe, out)
            })?;
            for (at, bytes) in pending {
                out[at..at + bytes.len()].copy_from_slice(&bytes);
            }
            Ok(())
        })
    }

    /// Reads through read-ahead and the read cache (see [`super::readcache`]).
    pub(super) fn read_cached(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        let t = &self.tunables;
        let strip = self.row.strip_bytes as u64;
        let read_ahead = t.read_ahead_sectors() as u64 * SECTOR_BYTES;
        if !t.read_cache() && read_ahead == 0 {
            return self.read_bytes(offset, buf);
        }
        let (_in_flight, sequential, alone) = self.reads.read_arrives(offset, len);
        // The fast path: a small random read goes to its member, no lookup.
        if t.fast_path() && !sequential && offset % strip + len as u64 <= strip {
            return self.read_bytes(offset, buf);
        }
        if self.reads.lookup(offset, buf) {
            return Ok(());
        }
        let capacity = t.stripe_cache_size() as usize
            * super::tuning::STRIPE_CACHE_PAGE
            * self.row.data_strips;
        let generation = self.reads.generation();
        // Read-ahead serves a client that reads a stream one request at a
        // time (dd, a single-threaded reader); one that keeps reads in
        // flight is its own read-ahead, and fetching more would read twice.
        // Half the cache at most, so that what is fetched stays.
        let extra = if sequential && alone {
            read_ahead.min(capacity as u64 / 2)
        } else {
            0
        };
        let total = (len as u64 + extra).min(self.size_bytes() - offset) as usize;
        if total == len {
            self.read_bytes(offset, buf)?;
            if t.read_cache() {
                self.reads
                    .insert(offset, buf.to_vec(), generation, capacity);
            }
            return Ok(());
        }
        let mut ahead = vec![0u8; total];
        self.read_bytes(offset, &mut ahead)?;
        buf.copy_from_slice(&ahead[..len]);
        self.reads.insert(offset, ahead, generation, capacity);
        Ok(())
    }

    /// The largest I/O sent to a member (max_sectors_kb). It is a whole
    /// number of 4 KiB (tuning checks it), so of every member's block.
    pub(super) fn max_member_io(&self) -> usize {
        self.tunables.max_io_bytes()
    }

    /// What a stripe-cache batch for one row costs, in entries.
    pub(super) fn cache_entries_per_row(&self) -> usize {
        StripeCache::entries_for(self.row.strip_bytes)
    }

    /// Writes a batch of the stripe cache to the members.
    pub(super) fn destage(
        &self,
        batch: &Batch,
        runs: &[Range<usize>],
        buf: &[u8],
    ) -> io::Result<()> {
        let map = self.geometry.stripe(batch.stripe);
        let parts: Vec<(usize, &[u8])> = runs.iter().map(|r| (r.start, &buf[r.clone()])).collect();
        self.write_in_row(&map, &parts)
    }

    /// Writes parts of one row (offset in the row's data, bytes) under the
    /// row's lock, keeping parity right.
    fn write_in_row(&self, map: &StripeMap, parts: &[(usize, &[u8])]) -> io::Result<()> {
        let _guard = self.locks.lock(map.stripe);
        let _in_flight = self.bitmap_start_write(map.stripe)?;
        for &(at, bytes) in parts {
            self.with_retries(map.stripe, true, |view| {
                let piece = Engine::piece(map.clone(), at, bytes.len(), bytes);
                view.write_piece(&piece)
            })?;
        }
        Ok(())
    }

    /// Runs `f` on a view of the members, correcting member read errors from
    /// redundancy (md's read-error handling) and retrying a bounded number of
    /// times as members fail.
    /// `locked` says whether the caller holds the stripe's lock.
    fn with_retries(
        &self,
        stripe: u64,
        locked: bool,
        mut f: impl FnMut(&View) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut last = None;
        let mut corrected = vec![false; self.geometry.raid_disks()];
        // Each member is corrected once, then failed: at most two rounds each.
        for _ in 0..=2 * self.geometry.raid_disks() {
            let view = self.view(stripe);
            match f(&view) {
                Ok(()) => return Ok(()),
                Err(e) => match member_of(&e) {
                    // It fails again after its sectors were rewritten and read
                    // back: the data must come from redundancy, without it.
                    Some(role) if corrected[role] => {
                        self.fail_member(role, &format!("read error after a rewrite: {e}"));
                        last = Some(e);
                    }
                    Some(role) => {
                        corrected[role] = true;
                        self.correct_read_error(stripe, role, &e, locked);
                        last = Some(e);
                    }
                    None => return Err(e),
                },
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("I/O failed")))
    }

    /// Writes `data` at array byte `offset`, keeping redundancy right.
    /// Partial rows may wait in the stripe cache to be gathered into whole
    /// ones (see [`super::cache`]); with write-back they are acknowledged
    /// from it.
    pub(super) fn write_bytes(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let (_in_flight, sequential) = self.cache.write_arrives(offset, data.len());
        // Bytes read ahead are dropped once the write is in; reads racing
        // with it keep nothing (see readcache).
        self.reads.write_begins();
        let result = self.write_rows(offset, data, fua, sequential);
        self.reads.write_done(offset..offset + data.len() as u64);
        result
    }

    fn write_rows(&self, offset: u64, data: &[u8], fua: bool, sequential: bool) -> io::Result<()> {
        let gather = sequential && self.geometry.level().has_parity();
        let write_back = self.tunables.write_back();
        let capacity = self.tunables.stripe_cache_size() as usize;
        let entries = self.cache_entries_per_row();
        self.for_each_piece(offset, data.len(), |engine, map, in_stripe, range| {
            let bytes = &data[range.clone()];
            let row_bytes = (map.data_sectors() * SECTOR_BYTES) as usize;
            let offer = engine.cache.offer(
                map.stripe,
                row_bytes,
                in_stripe,
                bytes,
                gather,
                write_back,
                fua,
                entries,
                capacity,
                &|batch, runs, buf| engine.destage(batch, runs, buf),
            );
            match offer {
                Offer::Done(result) => result,
                Offer::Direct => {
                    if bytes.len() < row_bytes {
                        let stats = &engine.cache.stats;
                        stats.direct_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    engine.write_in_row(&map, &[(in_stripe, bytes)])
                }
            }
        })
    }
}

/// The members as one request piece sees them: a snapshot of the member
/// table (which members are in sync, up to which stripe for a rebuilding
/// one) taken without holding any lock during I/O.
pub(super) struct View<'a> {
    pub(super) engine: &'a Engine,
    pub(super) table: Arc<MemberTable>,
    pub(super) stripe: u64,
}

impl View<'_> {
    /// Whether the member holding `place` is in sync for this stripe.
    pub(super) fn present(&self, place: &Place) -> bool {
        self.table.usable(place.member, self.stripe)
    }

    fn offset_of(&self, place: &Place, offset_in_strip: usize) -> (MemberRef, u64) {
        let entry = self
            .table
            .entry(place.member)
            .expect("I/O to a member in the table");
        let at = entry.slot.data_offset_bytes
            + place.member_sector * SECTOR_BYTES
            + offset_in_strip as u64;
        (entry.slot.member.clone(), at)
    }

    /// Reads several places at once (one io_uring batch where the members
    /// allow it: a stripe costs one member's latency, not one per member).
    /// A failed read is retried once alone; a failure is tagged with the
    /// member's role so that the piece can correct it from redundancy.
    pub(super) fn read_places(&self, reads: &mut [(&Place, usize, &mut [u8])]) -> io::Result<()> {
        if reads.len() == 1 {
            let (place, at, buf) = &mut reads[0];
            return self.read_place(place, *at, buf);
        }
        let max = self.engine.max_member_io();
        let targets: Vec<(MemberRef, u64)> = reads
            .iter()
            .map(|(place, at, _)| self.offset_of(place, *at))
            .collect();
        let mut ops = Vec::new();
        let mut owner = Vec::new();
        for (k, ((_, _, buf), (member, at))) in reads.iter_mut().zip(&targets).enumerate() {
            for (i, part) in buf.chunks_mut(max).enumerate() {
                ops.push(IoOp::read(member.as_ref(), at + (i * max) as u64, part));
                owner.push(k);
            }
        }
        let results = batch::run(&mut ops);
        drop(ops);
        let mut failed: Vec<usize> = owner
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_err())
            .map(|(k, _)| *k)
            .collect();
        failed.dedup(); // the ops of one read are adjacent
        for k in failed {
            let (place, at, buf) = &mut reads[k];
            self.read_place(place, *at, buf)?;
        }
        Ok(())
    }

    /// Writes several places at once (one batch where the members allow
    /// it). A member that fails a write is failed at once (md does the same
    /// without a bad-block log) and the rest goes on without it: parity,
    /// computed before any write, still covers its share. Only when that
    /// leaves the array unable to serve is it an error. A replacement under
    /// construction gets the write too where its copy is done, so that it
    /// does not fall behind; a failing replacement is dropped.
    pub(super) fn write_places(&self, writes: &[(&Place, usize, &[u8])]) -> io::Result<()> {
        let max = self.engine.max_member_io();
        // (role, replacement?) of each op.
        let mut targets: Vec<(usize, bool, MemberRef, u64, &[u8])> = Vec::new();
        for &(place, at, buf) in writes {
            let (member, offset) = self.offset_of(place, at);
            if let Some((replacement, r_offset)) = self.replacement_target(place, offset) {
                targets.push((place.member, true, replacement, r_offset, buf));
            }
            targets.push((place.member, false, member, offset, buf));
        }
        let mut ops = Vec::new();
        let mut owner = Vec::new();
        for (k, (_, _, member, at, buf)) in targets.iter().enumerate() {
            for (i, part) in buf.chunks(max).enumerate() {
                ops.push(IoOp::write(member.as_ref(), at + (i * max) as u64, part));
                owner.push(k);
            }
        }
        let results = batch::run(&mut ops);
        drop(ops);
        let mut first_error: Vec<Option<io::Error>> = (0..targets.len()).map(|_| None).collect();
        for (k, result) in owner.into_iter().zip(results) {
            if let Err(e) = result {
                first_error[k].get_or_insert(e);
            }
        }
        for ((role, replacement, ..), error) in targets.iter().zip(first_error) {
            let Some(source) = error else { continue };
            if *replacement {
                self.engine
                    .abandon_replacement(*role, "write error on the replacement");
            } else {
                self.engine
                    .fail_member(*role, &format!("write error: {source}"));
                if !self.engine.runnable() {
                    return Err(io::Error::other(format!(
                        "array failed: member {role} lost on write ({source})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Where a write to `place` at member byte `offset` also goes: the
    /// replacement under construction, where its copy is done.
    fn replacement_target(&self, place: &Place, offset: u64) -> Option<(MemberRef, u64)> {
        let replacement = self.table.replacing[place.member].as_ref()?;
        let copied = replacement
            .rebuilt_below
            .as_ref()
            .is_none_or(|b| self.stripe < b.load(std::sync::atomic::Ordering::SeqCst));
        let base = self
            .table
            .entry(place.member)
            .map_or(0, |e| e.slot.data_offset_bytes);
        copied.then(|| {
            (
                replacement.slot.member.clone(),
                offset - base + replacement.slot.data_offset_bytes,
            )
        })
    }

    /// Reads from a member; a failure is tagged with the member's role so
    /// that the piece can correct it from redundancy.
    pub(super) fn read_place(
        &self,
        place: &Place,
        offset_in_strip: usize,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let (member, at) = self.offset_of(place, offset_in_strip);
        let max = self.engine.max_member_io();
        for (i, part) in buf.chunks_mut(max).enumerate() {
            let at = at + (i * max) as u64;
            // One retry: a transient error should not cost a member.
            member
                .read_at(part, at)
                .or_else(|_| member.read_at(part, at))
                .map_err(|source| member_error(place.member, source))?;
        }
        Ok(())
    }

    /// Writes to one member: [`write_places`](Self::write_places) with one
    /// write.
    pub(super) fn write_place(
        &self,
        place: &Place,
        offset_in_strip: usize,
        buf: &[u8],
    ) -> io::Result<()> {
        self.write_places(&[(place, offset_in_strip, buf)])
    }

    /// Reads one piece, reconstructing strips whose members are gone.
    fn read_piece(&self, piece: &Piece, in_stripe: usize, out: &mut [u8]) -> io::Result<()> {
        let strip_bytes = piece.strip_bytes();
        let mut missing = Vec::new();
        let mut reads = Vec::new();
        let mut rest: &mut [u8] = out;
        let mut consumed = 0;
        for (i, r) in piece.ranges.iter().enumerate() {
            if r.is_empty() {
                continue;
            }
            // The strips' ranges lie in order in `out`; split it as we go.
            let start = i * strip_bytes + r.start - in_stripe;
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - consumed);
            let (dst, tail) = tail.split_at_mut(r.len());
            rest = tail;
            consumed = start + r.len();
            match self
                .engine
                .pick_copy(&piece.map.data[i].copies, |c| self.present(c))
            {
                Some(copy) => reads.push((copy, r.start, dst)),
                None => missing.push(i),
            }
        }
        self.read_places(&mut reads)?;
        drop(reads);
        if missing.is_empty() {
            return Ok(());
        }
        // Reconstruction reads the rest of the stripe: hold its lock so
        // that no write is half-way through it.
        let _guard = self.engine.locks.lock(piece.map.stripe);
        let window = piece.window.clone();
        // Every lost strip, touched or not, is rebuilt: the algebra needs
        // all the others as they are on disk.
        let all_lost: Vec<usize> = (0..piece.map.data.len())
            .filter(|&i| !piece.map.data[i].copies.iter().any(|c| self.present(c)))
            .collect();
        let strips = self.read_window(&piece.map, window.clone(), &all_lost)?;
        for i in missing {
            let r = &piece.ranges[i];
            let dst = &mut out[i * strip_bytes + r.start - in_stripe..][..r.len()];
            dst.copy_from_slice(&strips[i][r.start - window.start..r.end - window.start]);
        }
        Ok(())
    }

    /// Reads the window of every data strip, reconstructing the strips in
    /// `lost` (whose members are gone) from the others and parity.
    pub(super) fn read_window(
        &self,
        map: &StripeMap,
        window: Range<usize>,
        lost: &[usize],
    ) -> io::Result<Vec<Vec<u8>>> {
        let len = window.len();
        let mut strips = vec![vec![0u8; len]; map.data.len()];
        let mut reads = Vec::new();
        for (i, (strip, buf)) in map.data.iter().zip(strips.iter_mut()).enumerate() {
            if lost.contains(&i) {
                continue;
            }
            let copy = strip
                .copies
                .iter()
                .find(|c| self.present(c))
                .ok_or_else(|| lost_error(map, "more data strips lost than expected"))?;
            reads.push((copy, window.start, &mut buf[..]));
        }
        self.read_places(&mut reads)?;
        drop(reads);
        self.reconstruct(map, window, &mut strips, lost)?;
        Ok(strips)
    }

    /// Rebuilds the window of the strips in `lost` in place.
    fn reconstruct(
        &self,
        map: &StripeMap,
        window: Range<usize>,
        strips: &mut [Vec<u8>],
        lost: &[usize],
    ) -> io::Result<()> {
        if lost.is_empty() {
            return Ok(());
        }
        let wanted = |place: &Option<Place>| {
            place
                .filter(|p| self.present(p))
                .map(|p| (p, AlignedBuf::zeroed(window.len())))
        };
        let (mut p, mut q) = (wanted(&map.p), wanted(&map.q));
        {
            let mut reads: Vec<(&Place, usize, &mut [u8])> = [p.as_mut(), q.as_mut()]
                .into_iter()
                .flatten()
                .map(|(place, buf)| (&*place, window.start, &mut buf[..]))
                .collect();
            self.read_places(&mut reads)?;
        }
        let p = p.map(|(_, buf)| buf);
        let q = q.map(|(_, buf)| buf);
        let present: Vec<usize> = (0..map.data.len()).filter(|i| !lost.contains(i)).collect();
        let present_exps: Vec<u8> = present.iter().map(|&i| map.data[i].q_exponent).collect();
        let mut outputs: Vec<Vec<u8>> = lost.iter().map(|_| vec![0u8; window.len()]).collect();
        {
            let present_data: Vec<&[u8]> = present.iter().map(|&i| strips[i].as_slice()).collect();
            let syndrome = self.engine.syndrome;
            match (lost, &mut outputs[..], &p, &q) {
                ([_], [x], Some(p), _) => {
                    parity::recover_data_from_p(syndrome, &present_data, p, x)
                }
                ([i], [x], None, Some(q)) => parity::recover_data_from_q(
                    syndrome,
                    &present_data,
                    &present_exps,
                    q,
                    map.data[*i].q_exponent,
                    x,
                ),
                ([i, j], [x, y], Some(p), Some(q)) => parity::recover_two_data(
                    syndrome,
                    &present_data,
                    &present_exps,
                    p,
                    q,
                    map.data[*i].q_exponent,
                    map.data[*j].q_exponent,
                    x,
                    y,
                ),
                _ => return Err(lost_error(map, "too many members lost to reconstruct")),
            }
        }
        for (&i, out) in lost.iter().zip(outputs) {
            strips[i] = out;
        }
        Ok(())
    }

    fn write_piece(&self, piece: &Piece) -> io::Result<()> {
        let map = &piece.map;
        if map.p.is_none() {
            // Mirrors and stripes without parity: every present copy.
            let mut writes = Vec::new();
            for i in (0..map.data.len()).filter(|i| piece.touched(*i)) {
                let copies: Vec<&Place> = map.data[i]
                    .copies
                    .iter()
                    .filter(|c| self.present(c))
                    .collect();
                if copies.is_empty() {
                    return Err(lost_error(map, "every copy of the data is lost"));
                }
                for copy in copies {
                    writes.push((copy, piece.ranges[i].start, piece.new_bytes(i)));
                }
            }
            return self.write_places(&writes);
        }
        let parity_present: Vec<Place> = [map.p, map.q]
            .into_iter()
            .flatten()
            .filter(|p| self.present(p))
            .collect();
        let lost: Vec<usize> = (0..map.data.len())
            .filter(|&i| !map.data[i].copies.iter().any(|c| self.present(c)))
            .collect();
        let touched: Vec<usize> = (0..map.data.len()).filter(|&i| piece.touched(i)).collect();
        if parity_present.is_empty() {
            // No parity left to maintain: the data is all there is, and
            // what was kept of the parity is stale from now on.
            self.engine
                .parity_cache
                .drop_window(map.stripe, &piece.window);
            for &i in &touched {
                if lost.contains(&i) {
                    return Err(lost_error(map, "data and parity lost"));
                }
                self.write_place(
                    &map.data[i].copies[0],
                    piece.ranges[i].start,
                    piece.new_bytes(i),
                )?;
            }
            return Ok(());
        }
        // Reads each method needs over the window.
        let rmw_possible = touched.iter().all(|i| !lost.contains(i));
        let hot = &self.engine.parity_cache;
        let hot_parity = [(map.p, Which::P), (map.q, Which::Q)]
            .iter()
            .filter(|(place, which)| {
                place.is_some_and(|p| self.present(&p))
                    && hot.has(map.stripe, &piece.window, *which)
            })
            .count();
        let rmw_reads = touched.len() + parity_present.len() - hot_parity;
        let rebuild = lost.iter().any(|&i| !piece.covers_window(i));
        let rcw_reads = if rebuild {
            map.data.len() - lost.len() + parity_present.len()
        } else {
            (0..map.data.len())
                .filter(|&i| !piece.covers_window(i) && !lost.contains(&i))
                .count()
        };
        // md's rmw_level: 0 never reads-modifies-writes, 1 does when it
        // needs fewer reads, 2 also when the counts tie.
        let rmw = match self.engine.tunables.rmw_level() {
            0 => false,
            1 => rmw_reads < rcw_reads,
            _ => rmw_reads <= rcw_reads,
        };
        if rmw_possible && rmw {
            self.read_modify_write(piece, &touched)
        } else {
            self.reconstruct_write(piece, &touched, &lost)
        }
    }

    /// New parity = old parity + (old data - new data) for each touched strip,
    /// over the window: reads the touched strips and the parity only.
    fn read_modify_write(&self, piece: &Piece, touched: &[usize]) -> io::Result<()> {
        let map = &piece.map;
        let window = piece.window.clone();
        let wanted = |place: Option<Place>| {
            place
                .filter(|p| self.present(p))
                .map(|p| (p, AlignedBuf::zeroed(window.len())))
        };
        let (mut p, mut q) = (wanted(map.p), wanted(map.q));
        // Parity still hot from the last write of this window is not read.
        let hot = &self.engine.parity_cache;
        let p_hot = p
            .as_mut()
            .is_some_and(|(_, buf)| hot.get(map.stripe, &window, Which::P, buf));
        let q_hot = q
            .as_mut()
            .is_some_and(|(_, buf)| hot.get(map.stripe, &window, Which::Q, buf));
        // Old data of every touched strip and old parity, in one batch.
        let mut old: Vec<AlignedBuf> = touched
            .iter()
            .map(|&i| AlignedBuf::zeroed(piece.ranges[i].len()))
            .collect();
        {
            let mut reads: Vec<(&Place, usize, &mut [u8])> = touched
                .iter()
                .zip(old.iter_mut())
                .map(|(&i, buf)| (&map.data[i].copies[0], piece.ranges[i].start, &mut buf[..]))
                .collect();
            reads.extend(
                [p.as_mut().filter(|_| !p_hot), q.as_mut().filter(|_| !q_hot)]
                    .into_iter()
                    .flatten()
                    .map(|(place, buf)| (&*place, window.start, &mut buf[..])),
            );
            self.read_places(&mut reads)?;
        }
        for (&i, delta) in touched.iter().zip(old.iter_mut()) {
            let r = piece.ranges[i].clone();
            self.engine.syndrome.xor_into(delta, piece.new_bytes(i));
            let at = r.start - window.start..r.end - window.start;
            if let Some((_, p)) = p.as_mut() {
                self.engine.syndrome.xor_into(&mut p[at.clone()], delta);
            }
            if let Some((_, q)) = q.as_mut() {
                let coef = parity::gf::pow2(map.data[i].q_exponent);
                self.engine.syndrome.mul_acc(&mut q[at], delta, coef);
            }
        }
        let mut writes: Vec<(&Place, usize, &[u8])> = touched
            .iter()
            .map(|&i| {
                (
                    &map.data[i].copies[0],
                    piece.ranges[i].start,
                    piece.new_bytes(i),
                )
            })
            .collect();
        writes.extend(
            [p.as_ref(), q.as_ref()]
                .into_iter()
                .flatten()
                .map(|(place, buf)| (place, window.start, &buf[..])),
        );
        let written = self.write_places(&writes);
        self.keep_parity(
            map,
            &window,
            written.is_ok(),
            p.as_ref().map(|(_, b)| &b[..]),
            q.as_ref().map(|(_, b)| &b[..]),
        );
        written
    }

    /// After a write of `window`: the parity it wrote stays hot; parity
    /// whose member is absent, or a failed write, leaves nothing behind.
    fn keep_parity(
        &self,
        map: &StripeMap,
        window: &Range<usize>,
        ok: bool,
        p: Option<&[u8]>,
        q: Option<&[u8]>,
    ) {
        let hot = &self.engine.parity_cache;
        if !ok {
            hot.drop_window(map.stripe, window);
            return;
        }
        let capacity = self.engine.tunables.stripe_cache_size() as usize;
        if map.p.is_some() {
            hot.put(map.stripe, window, Which::P, p, capacity);
        }
        if map.q.is_some() {
            hot.put(map.stripe, window, Which::Q, q, capacity);
        }
    }

    /// Parity recomputed from all data in the window: reads the strips the
    /// request does not fully cover (reconstructing lost ones), then writes
    /// the touched strips that are present and the parity.
    fn reconstruct_write(
        &self,
        piece: &Piece,
        touched: &[usize],
        lost: &[usize],
    ) -> io::Result<()> {
        let map = &piece.map;
        let window = piece.window.clone();
        // If any lost strip holds old bytes the request does not replace, all
        // lost strips are rebuilt: the others' old bytes are just as unknown,
        // and the algebra needs every strip but the rebuilt ones.
        let need_rebuild: Vec<usize> = if lost.iter().any(|&i| !piece.covers_window(i)) {
            lost.to_vec()
        } else {
            Vec::new()
        };
        // Every strip's window is in the request (a full-stripe write): parity
        // comes straight from the request's bytes, nothing is read or copied.
        let whole = (0..map.data.len()).all(|i| piece.covers_window(i));
        let mut strips = if whole {
            Vec::new()
        } else {
            vec![vec![0u8; window.len()]; map.data.len()]
        };
        if !whole {
            let mut reads = Vec::new();
            for (i, buf) in strips.iter_mut().enumerate() {
                // Rebuilding a lost strip needs the old data of every other
                // strip; otherwise the strips the request covers need not be read.
                let needed = !need_rebuild.is_empty() || !piece.covers_window(i);
                if needed && !lost.contains(&i) {
                    reads.push((&map.data[i].copies[0], window.start, &mut buf[..]));
                }
            }
            self.read_places(&mut reads)?;
        }
        let views: Vec<&[u8]> = if whole {
            (0..map.data.len()).map(|i| piece.new_bytes(i)).collect()
        } else {
            self.reconstruct(map, window.clone(), &mut strips, &need_rebuild)?;
            for &i in touched {
                let r = &piece.ranges[i];
                strips[i][r.start - window.start..r.end - window.start]
                    .copy_from_slice(piece.new_bytes(i));
            }
            strips.iter().map(Vec::as_slice).collect()
        };
        let mut p = AlignedBuf::zeroed(window.len());
        let mut q = AlignedBuf::zeroed(window.len());
        match map.q {
            None => self.engine.syndrome.gen_p(&views, &mut p),
            Some(_) => {
                let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
                self.engine.syndrome.gen_pq(&views, &exps, &mut p, &mut q);
            }
        }
        let mut writes: Vec<(&Place, usize, &[u8])> = touched
            .iter()
            .filter(|i| !lost.contains(i))
            .map(|&i| {
                (
                    &map.data[i].copies[0],
                    piece.ranges[i].start,
                    piece.new_bytes(i),
                )
            })
            .collect();
        let (p_place, q_place) = (
            map.p.filter(|p| self.present(p)),
            map.q.filter(|q| self.present(q)),
        );
        if let Some(place) = p_place.as_ref() {
            writes.push((place, window.start, &p));
        }
        if let Some(place) = q_place.as_ref() {
            writes.push((place, window.start, &q));
        }
        let written = self.write_places(&writes);
        self.keep_parity(
            map,
            &window,
            written.is_ok(),
            p_place.map(|_| &p[..]),
            q_place.map(|_| &q[..]),
        );
        written
    }
}

fn lost_error(map: &StripeMap, what: &str) -> io::Error {
    lost(format!("stripe {}: {what}", map.stripe))
}
