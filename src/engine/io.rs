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
use crate::export::{ExtentUse, FileExtent};
use crate::geometry::{Located, Place, StripeMap};
use crate::member::stats as counted;
use crate::member::{batch, AlignedBuf, IoOp, MemberRef};
use crate::parity;
use crate::units::SECTOR_BYTES;
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The parity a read-modify-write reads around its window while the parity
/// cache has room (see [`View::parity_span`]).
const PARITY_PREFETCH_BYTES: usize = 64 * 1024;

fn lost(what: String) -> io::Error {
    io::Error::other(what)
}

/// The part of one stripe that a request covers.
pub(super) struct Piece<'a> {
    pub(super) map: StripeMap,
    /// For each data strip, the byte range (strip-relative) the request covers; empty if none.
    ranges: Vec<Range<usize>>,
    /// Union of the ranges: where parity changes.
    window: Range<usize>,
    /// The request's bytes for this stripe, starting at the first covered byte.
    data: &'a [u8],
    /// Offset of the first covered byte within the stripe's data.
    start_in_stripe: usize,
    /// Its data is in the journal already (logged alone for write-back):
    /// only its parity is logged before its member writes.
    pub(super) logged: bool,
    /// A client's FUA write: every member write it makes carries FUA.
    pub(super) fua: bool,
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

    pub(super) fn touched(&self, i: usize) -> bool {
        !self.ranges[i].is_empty()
    }

    /// The byte range (strip-relative) the request covers in strip `i`.
    pub(super) fn range(&self, i: usize) -> &Range<usize> {
        &self.ranges[i]
    }

    /// Whether strip `i`'s new bytes cover the whole window.
    fn covers_window(&self, i: usize) -> bool {
        self.ranges[i].start <= self.window.start && self.ranges[i].end >= self.window.end
    }
}

impl Engine {
    /// Calls `f` for each stripe piece of the byte range [offset, offset+len).
    pub(super) fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&Engine, StripeMap, usize, Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let geometry = self.geometry();
        // The reshape job writes rows past the old end of a growing array.
        let end = offset
            .checked_add(len as u64)
            .filter(|e| *e <= geometry.io_sectors() * SECTOR_BYTES);
        if end.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "request beyond the end of the array",
            ));
        }
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let map = geometry.stripe(geometry.stripe_of(at / SECTOR_BYTES));
            let stripe_start = map.array_sector * SECTOR_BYTES;
            let in_stripe = (at - stripe_start) as usize;
            let mut end = (map.array_sector + map.data_sectors()) * SECTOR_BYTES;
            if geometry.reshaping().is_some() {
                // A stripe that straddles a reshape point maps only its side.
                end = geometry.run_end(at / SECTOR_BYTES) * SECTOR_BYTES;
            }
            let n = ((end - at) as usize).min(len - done);
            f(self, map, in_stripe, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    /// The piece of stripe `map` covering `len` bytes from `in_stripe`;
    /// `data` holds the bytes of a write (empty for a read).
    pub(super) fn piece<'a>(
        map: StripeMap,
        in_stripe: usize,
        len: usize,
        data: &'a [u8],
    ) -> Piece<'a> {
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
            logged: false,
            fua: false,
        }
    }

    /// Reads array bytes at `offset` into `buf`.
    pub(super) fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.read_direct(offset, buf) {
            return Ok(());
        }
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

    /// The direct read: a read inside one data strip whose member is in
    /// sync is that member's read and nothing more; no stripe map is built
    /// (it allocates a vector per strip, which at 4 KiB cost more than the
    /// copy). Says whether it served the read. Anything else (a read across
    /// strips, a mirror, a missing or rebuilding member, a read error, a
    /// range beyond the end) is left to the full path, which reconstructs
    /// and corrects; its bytes are the same by construction, since
    /// `Geometry::locate` names the strip the stripe map would.
    fn read_direct(&self, offset: u64, buf: &mut [u8]) -> bool {
        let len = buf.len();
        let end = offset.checked_add(len as u64);
        if len == 0 || end.is_none_or(|end| end > self.size_bytes()) {
            return false;
        }
        let Some(at) = self.geometry().locate(offset / SECTOR_BYTES) else {
            return false;
        };
        let strip_bytes = (at.strip_sectors * SECTOR_BYTES) as usize;
        let in_strip = (at.in_strip_sectors * SECTOR_BYTES + offset % SECTOR_BYTES) as usize;
        if in_strip + len > strip_bytes {
            return false;
        }
        // Bytes still in the stripe cache are newer than the member's; as
        // in the full path, they are looked up before the member is read.
        let pending = if self.cache.has_batches() {
            let in_stripe = at.data_index * strip_bytes + in_strip;
            self.cache.pending_in(at.stripe, in_stripe..in_stripe + len)
        } else {
            Vec::new()
        };
        let view = self.view(at.stripe);
        if !view.present(&at.place) || view.read_place(&at.place, in_strip, buf).is_err() {
            return false;
        }
        for (at, bytes) in pending {
            buf[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        true
    }

    /// Reads through read-ahead and the read cache (see [`super::readcache`]);
    /// `company`: the client has other requests in flight (`read_among`).
    pub(super) fn read_cached(&self, offset: u64, buf: &mut [u8], company: bool) -> io::Result<()> {
        let len = buf.len();
        let t = &self.tunables;
        let strip = self.row.strip_bytes as u64;
        let read_ahead = t.read_ahead_sectors() as u64 * SECTOR_BYTES;
        if !t.read_cache() && read_ahead == 0 {
            return self.read_bytes(offset, buf);
        }
        let (_in_flight, sequential, alone) = self.reads.read_arrives(offset, len);
        let lone_stream = self
            .reads
            .lone_stream(sequential && alone && !company && self.reads_held_by_server() == 0);
        // The fast path: a small random read goes to its member, no lookup.
        if t.fast_path() && !sequential && offset % strip + len as u64 <= strip {
            return self.read_bytes(offset, buf);
        }
        if self.reads.lookup(offset, buf) {
            return Ok(());
        }
        let capacity = self.read_cache_bytes();
        let generation = self.reads.generation();
        // Read-ahead serves a client that reads a stream one request at a
        // time (dd, a single-threaded reader); one that keeps reads in
        // flight is its own read-ahead, and fetching more would read twice.
        // Half the cache at most, so that what is fetched stays.
        let extra = if lone_stream {
            read_ahead.min(self.read_ahead_cap_bytes())
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

    /// What the read cache may hold: the stripe cache's pages over the
    /// data strips of a row, md's memory for stripe_cache_size.
    fn read_cache_bytes(&self) -> usize {
        self.tunables.stripe_cache_size() as usize
            * super::tuning::STRIPE_CACHE_PAGE
            * self.row.data_strips
    }

    /// The most one read-ahead fetches: half the read cache, so that what
    /// is fetched stays until it is read.
    pub(super) fn read_ahead_cap_bytes(&self) -> u64 {
        let entries = self.tunables.stripe_cache_size();
        super::tuning::read_ahead_cap_sectors(entries, self.row.data_strips) * SECTOR_BYTES
    }

    /// Where the bytes of a read lie on the members, for a server that
    /// fetches them itself (see `BlockBackend::read_extents`): splices them
    /// from buffered members' page caches to its socket, or reads them
    /// asynchronously (the fast path, when `fast_path` is on). Only for a
    /// plain read, served by usable members, with nothing newer in the
    /// stripe cache and nothing for the read cache or read-ahead to do.
    /// Else `None`, and the read goes through
    /// [`read_cached`](Self::read_cached).
    pub(super) fn file_extents(
        &self,
        offset: u64,
        len: usize,
        how: ExtentUse,
    ) -> Option<Vec<FileExtent>> {
        let t = &self.tunables;
        let end = offset.checked_add(len as u64)?;
        if len == 0 || end > self.size_bytes() || t.read_cache() || self.cache.has_batches() {
            return None;
        }
        if how == ExtentUse::Read && !t.fast_path() {
            return None;
        }
        // An asynchronous read is one member I/O per extent, so it is
        // split at max_sectors_kb as every member I/O is.
        let longest = match how {
            ExtentUse::Splice => usize::MAX,
            ExtentUse::Read => self.max_member_io(),
        };
        let table = self.table();
        let mut extents: Vec<FileExtent> = Vec::new();
        let mut at = offset;
        while at < end {
            let located = self.locate_for_read(&table, at / SECTOR_BYTES)?;
            let strip_bytes = located.strip_sectors * SECTOR_BYTES;
            let in_strip = located.in_strip_sectors * SECTOR_BYTES + at % SECTOR_BYTES;
            let n = (strip_bytes - in_strip).min(end - at);
            let place = table.home(&located.place, located.stripe);
            if !table.usable(place.member, located.stripe) {
                return None;
            }
            let slot = &table.entry(place.member)?.slot;
            let fd = match how {
                ExtentUse::Splice => slot.member.splice_fd()?,
                ExtentUse::Read => {
                    let raw = slot.member.raw_io()?;
                    assert!(raw.memory_align_bytes <= crate::member::aligned::ALIGN_BYTES);
                    raw.fd
                }
            };
            let member_at = slot.data_offset_bytes + place.member_sector * SECTOR_BYTES + in_strip;
            match extents.last_mut() {
                // Strips that follow each other on one member (a linear
                // array, a raid0 zone of one member) are one run.
                Some(last)
                    if last.fd == fd
                        && last.offset + last.len as u64 == member_at
                        && last.len + n as usize <= longest =>
                {
                    last.len += n as usize;
                }
                _ => {
                    // A strip is at most max_sectors_kb unless it is
                    // longer; then it goes in pieces.
                    let mut piece_at = 0;
                    while piece_at < n {
                        let piece = (n - piece_at).min(longest as u64);
                        extents.push(FileExtent {
                            fd,
                            offset: member_at + piece_at,
                            len: piece as usize,
                            owner: Box::new(PendingRead::new(
                                &self.pending_reads,
                                place.member,
                                slot.member.clone(),
                            )),
                            member: Some(slot.member.clone()),
                        });
                        piece_at += piece;
                    }
                }
            }
            at += n;
        }
        // Read-ahead serves a lone sequential reader from what it fetched;
        // asked last, so that a read declined for another reason is not
        // noted twice (read_cached notes it).
        if t.read_ahead_sectors() > 0 {
            let (_in_flight, sequential, alone) = self.reads.read_arrives(offset, len);
            // This read's own extents are counted among those held.
            let alone = alone && self.reads_held_by_server() as usize == extents.len();
            if self.reads.lone_stream(sequential && alone) {
                return None;
            }
        }
        debug_assert_eq!(extents.iter().map(|e| e.len).sum::<usize>(), len);
        Some(extents)
    }

    /// Member reads in flight on every path: the server's fast-path reads
    /// until they complete, spliced extents until staged, and the engine's
    /// own. They count when read-ahead asks
    /// whether a read is alone: without them a client keeping 32 fast-path
    /// reads in flight looked like a lone reader, and a random read that
    /// happened to land near a recent one (one in about 1,500 at 4 KiB
    /// over 1.5 GB) fetched two full stripes it did not need, a third of
    /// a disk's bandwidth at 56,000 reads a second.
    fn reads_held_by_server(&self) -> u32 {
        self.pending_reads
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .sum()
    }

    /// The strip that holds `array_sector` and the member to read it from:
    /// for a mirror, the usable copy with the fewest reads in flight
    /// (`pick_copy`). `None` when no copy is usable.
    fn locate_for_read(&self, table: &MemberTable, array_sector: u64) -> Option<Located> {
        if let Some(located) = self.geometry().locate(array_sector) {
            return Some(located);
        }
        // Mirrors: raid1's extent or raid10's chunk is one data strip
        // with its copies, so the stripe map is small.
        let stripe = self.geometry().stripe_of(array_sector);
        let map = self.geometry().stripe(stripe);
        let within = array_sector - map.array_sector;
        let data_index = (within / map.strip_sectors) as usize;
        let copies = &map.data.get(data_index)?.copies;
        let place = self.pick_copy(copies, |c| table.present(c, stripe))?;
        Some(Located {
            stripe,
            data_index,
            place: *place,
            strip_sectors: map.strip_sectors,
            in_strip_sectors: within % map.strip_sectors,
        })
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
        let map = self.geometry().stripe(batch.stripe);
        let parts: Vec<(usize, &[u8])> = runs.iter().map(|r| (r.start, &buf[r.clone()])).collect();
        self.write_in_row(&map, &parts, batch.logged(), batch.urgent())
    }

    /// Writes parts of one row (offset in the row's data, bytes) under the
    /// row's lock, keeping parity right. On a parity level the row's
    /// stripe worker does it (see [`super::stripes`]); mirrors and plain
    /// stripes have no parity work to hand over.
    /// `logged`: the parts' data is in the journal already (write-back).
    /// `fua`: every member write carries FUA (see [`Piece::fua`]).
    fn write_in_row(
        &self,
        map: &StripeMap,
        parts: &[(usize, &[u8])],
        logged: bool,
        fua: bool,
    ) -> io::Result<()> {
        if map.p.is_some() {
            let slot = self.locks.slot(map.stripe);
            if let Some(result) = self.stripes.submit(map.stripe, slot, parts, logged, fua) {
                return result;
            }
        }
        let _guard = self.locks.lock(map.stripe);
        let _in_flight = self.bitmap_start_write(map.stripe)?;
        self.write_parts_locked(map, parts, logged, fua, true)
    }

    /// Writes parts of one row, one piece at a time with retries; the
    /// caller holds the row's lock and has marked it in the bitmap.
    /// `prefetch`: its first try may read neighbouring parity for the cache
    /// (see [`View::plan_parity_write`]); a retry, which follows a read
    /// error, reads no more than it needs.
    pub(super) fn write_parts_locked(
        &self,
        map: &StripeMap,
        parts: &[(usize, &[u8])],
        logged: bool,
        fua: bool,
        prefetch: bool,
    ) -> io::Result<()> {
        for &(at, bytes) in parts {
            let mut first = prefetch;
            self.with_retries(map.stripe, true, |view| {
                let mut piece = Engine::piece(map.clone(), at, bytes.len(), bytes);
                piece.logged = logged;
                piece.fua = fua;
                let prefetch = std::mem::replace(&mut first, false);
                view.write_piece(&piece, prefetch)
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
        let mut corrected = vec![false; self.geometry().raid_disks()];
        // Each member is corrected once, then failed: at most two rounds each.
        for _ in 0..=2 * self.geometry().raid_disks() {
            let view = self.view(stripe);
            match f(&view) {
                Ok(()) => return Ok(()),
                Err(e) => match member_of(&e) {
                    // It fails again after its sectors were rewritten and read
                    // back: the data must come from redundancy, without it.
                    Some(role) if corrected[role] => {
                        let member = view.table.entry(role).map(|e| e.slot.member.clone());
                        let reason = super::readd::failure_reason(
                            format!("read error after a rewrite: {e}"),
                            &[&e],
                        );
                        self.fail_blamed(role, member.as_ref(), &e, &reason);
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
        // While a reshape runs no row waits in the stripe cache: its batches
        // are keyed by a stripe number that the moving point renumbers.
        let reshaping = self.reshaping.load(Ordering::SeqCst);
        let gather = sequential && self.geometry().level().has_parity() && !reshaping;
        let write_back = self.tunables.write_back() && !reshaping;
        let capacity = self.tunables.stripe_cache_size() as usize;
        let entries = self.cache_entries_per_row();
        self.for_each_piece(offset, data.len(), |engine, map, in_stripe, range| {
            let bytes = &data[range.clone()];
            let row_bytes = (map.data_sectors() * SECTOR_BYTES) as usize;
            // Write-back with a journal: what the cache acknowledges is in
            // the journal first (md's r5c caching phase). A whole row goes
            // straight to the members and logs itself there.
            // Write-back with a journal: what the cache acknowledges is in
            // the journal first (md's r5c caching phase), logged by the
            // cache while it holds the row's batch. A whole row goes
            // straight to the members and logs itself there.
            let log_data = || -> io::Result<Option<super::cache::Hold>> {
                let journal = engine.journal.as_ref().expect("logging needs a journal");
                let piece = Engine::piece(map.clone(), in_stripe, bytes.len(), bytes);
                let rows = engine.view(map.stripe).journal_rows(&piece, None);
                match journal.log(engine, rows, super::journal::LogKind::DataOnly) {
                    Ok(ticket) => Ok(Some(super::journal::JournalHold::hold(journal, ticket))),
                    // The journal's share for the cache is full: this write
                    // goes through, as md's r5c does when its log runs short.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                    Err(e) => Err(e),
                }
            };
            let log: Option<&super::cache::LogData> =
                (engine.journal.is_some() && write_back && bytes.len() < row_bytes)
                    .then_some(&log_data);
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
                log,
                &|batch, runs, buf| engine.destage(batch, runs, buf),
            );
            match offer {
                Offer::Done(result) => result,
                Offer::Direct => {
                    if bytes.len() < row_bytes {
                        let stats = &engine.cache.stats;
                        stats.direct_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    engine.write_in_row(&map, &[(in_stripe, bytes)], false, fua)
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
    /// Whether the member holding `place` is in sync for this stripe
    /// (for a role held by a distributed spare, the child holding its
    /// space there: see [`MemberTable::home`]).
    pub(super) fn present(&self, place: &Place) -> bool {
        self.table.present(place, self.stripe)
    }

    /// The place that holds the bytes of `place` (see [`MemberTable::home`]).
    pub(super) fn home(&self, place: &Place) -> Place {
        self.table.home(place, self.stripe)
    }

    pub(super) fn offset_of(&self, place: &Place, offset_in_strip: usize) -> (MemberRef, u64) {
        let home = self.home(place);
        let entry = self
            .table
            .entry(home.member)
            .expect("I/O to a member in the table");
        let at = entry.slot.data_offset_bytes
            + home.member_sector * SECTOR_BYTES
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
        let failed: Vec<usize> = {
            let mut member_reads: Vec<(MemberRef, u64, &mut [u8])> = reads
                .iter_mut()
                .map(|(place, at, buf)| {
                    let (member, offset) = self.offset_of(place, *at);
                    (member, offset, &mut **buf)
                })
                .collect();
            run_reads(self.engine.max_member_io(), &mut member_reads)
                .iter()
                .enumerate()
                .filter_map(|(k, error)| error.is_some().then_some(k))
                .collect()
        };
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
    /// Every write carries FUA when `fua` says so (a client's FUA write).
    pub(super) fn write_places(
        &self,
        writes: &[(&Place, usize, &[u8])],
        fua: bool,
    ) -> io::Result<()> {
        let mut targets = Vec::new();
        self.write_targets(writes, fua, &mut targets);
        let errors = run_writes(self.engine.max_member_io(), &targets);
        self.settle_writes(&targets, errors)
    }

    /// The member writes that `writes` make: each place, and its
    /// replacement where it has one; all with FUA when `fua` says so.
    pub(super) fn write_targets<'b>(
        &self,
        writes: &[(&Place, usize, &'b [u8])],
        fua: bool,
        out: &mut Vec<WriteTarget<'b>>,
    ) {
        for &(place, at, buf) in writes {
            let (member, offset) = self.offset_of(place, at);
            // The role that fails if the write does: the one whose member
            // holds the bytes.
            let home = self.home(place);
            if let Some((replacement, r_offset)) = self.replacement_target(&home, offset) {
                out.push(WriteTarget {
                    role: home.member,
                    replacement: true,
                    member: replacement,
                    offset: r_offset,
                    buf,
                    fua,
                });
            }
            out.push(WriteTarget {
                role: home.member,
                replacement: false,
                member,
                offset,
                buf,
                fua,
            });
        }
    }

    /// Acts on the outcome of member writes (the first error of each
    /// target): a failed member is failed, a failed replacement dropped.
    /// An error only when the array can no longer serve.
    pub(super) fn settle_writes(
        &self,
        targets: &[WriteTarget],
        errors: Vec<Option<io::Error>>,
    ) -> io::Result<()> {
        assert_eq!(targets.len(), errors.len());
        for (target, error) in targets.iter().zip(errors) {
            let Some(source) = error else { continue };
            let role = target.role;
            if target.replacement {
                self.engine.abandon_replacement(
                    role,
                    Some(&target.member),
                    "write error on the replacement",
                );
            } else {
                self.fail_on_write(role, &target.member, &source)?;
            }
        }
        Ok(())
    }

    /// Fails `member` in `role` for a write error; an error when the array
    /// cannot run without it.
    pub(super) fn fail_on_write(
        &self,
        role: usize,
        member: &MemberRef,
        source: &io::Error,
    ) -> io::Result<()> {
        let reason = super::readd::failure_reason(format!("write error: {source}"), &[source]);
        self.engine.fail_blamed(role, Some(member), source, &reason);
        if !self.engine.runnable() {
            return Err(io::Error::other(format!(
                "array failed: member {role} lost on write ({source})"
            )));
        }
        Ok(())
    }

    /// Where a write to `place` (a home) at member byte `offset` also
    /// goes: the replacement under construction, where its copy is done.
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
        let role = self.home(place).member;
        let max = self.engine.max_member_io();
        for (i, part) in buf.chunks_mut(max).enumerate() {
            let at = at + (i * max) as u64;
            // One retry: a transient error should not cost a member.
            counted::read_at(member.as_ref(), part, at)
                .or_else(|_| counted::read_at(member.as_ref(), part, at))
                .map_err(|source| member_error(role, source))?;
        }
        Ok(())
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
        // Counted in flight while they run, so that reads choosing among a
        // mirror's copies meanwhile go elsewhere.
        let pending = &self.engine.pending_reads;
        for (copy, _, _) in &reads {
            pending[copy.member].fetch_add(1, Ordering::Relaxed);
        }
        let result = self.read_places(&mut reads);
        for (copy, _, _) in &reads {
            pending[copy.member].fetch_sub(1, Ordering::Relaxed);
        }
        result?;
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
    ) -> io::Result<Vec<AlignedBuf>> {
        let len = window.len();
        let mut strips: Vec<AlignedBuf> = (0..map.data.len())
            .map(|_| AlignedBuf::zeroed(len))
            .collect();
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
        strips: &mut [AlignedBuf],
        lost: &[usize],
    ) -> io::Result<()> {
        if lost.is_empty() {
            return Ok(());
        }
        // Only the parity the cheapest path solves with is read.
        let present_parity = [map.p, map.q, map.r].map(|place| place.filter(|p| self.present(p)));
        let path = parity::plan_rebuild(lost.len(), present_parity.map(|p| p.is_some()))
            .map_err(|_| lost_error(map, "too many members lost to reconstruct"))?;
        let mut parity_bufs: Vec<Option<(Place, AlignedBuf)>> = present_parity
            .iter()
            .zip(path.reads())
            .map(|(place, read)| {
                place
                    .filter(|_| read)
                    .map(|p| (p, AlignedBuf::zeroed(window.len())))
            })
            .collect();
        {
            let mut reads: Vec<(&Place, usize, &mut [u8])> = parity_bufs
                .iter_mut()
                .flatten()
                .map(|(place, buf)| (&*place, window.start, &mut buf[..]))
                .collect();
            self.read_places(&mut reads)?;
        }
        let present: Vec<usize> = (0..map.data.len()).filter(|i| !lost.contains(i)).collect();
        let mut outputs: Vec<AlignedBuf> = lost
            .iter()
            .map(|_| AlignedBuf::zeroed(window.len()))
            .collect();
        {
            let present_data: Vec<&[u8]> = present.iter().map(|&i| &strips[i][..]).collect();
            let block = |k: usize| parity_bufs[k].as_ref().map(|(_, b)| &b[..]);
            let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(|o| &mut o[..]).collect();
            recover_lost(
                self.engine.syndrome,
                map,
                &present_data,
                lost,
                [block(0), block(1), block(2)],
                &mut outs,
            )?;
        }
        for (&i, out) in lost.iter().zip(outputs) {
            strips[i] = out;
        }
        Ok(())
    }

    /// Writes one piece of a row. `prefetch`: see [`View::plan_parity_write`].
    fn write_piece(&self, piece: &Piece, prefetch: bool) -> io::Result<()> {
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
            return self.write_places(&writes, piece.fua);
        }
        let parity_present = map.parity_places().filter(|p| self.present(p)).count();
        if parity_present == 0 {
            // No parity left to maintain: the data is all there is, and
            // what was kept of the parity is stale from now on.
            self.engine
                .parity_cache
                .drop_window(map.stripe, &piece.window);
            let ticket = self.log_rows(piece, self.journal_rows(piece, None))?;
            let written = (|| {
                for i in (0..map.data.len()).filter(|&i| piece.touched(i)) {
                    let Some(copy) = map.data[i].copies.iter().find(|c| self.present(c)) else {
                        return Err(lost_error(map, "data and parity lost"));
                    };
                    let write = (copy, piece.ranges[i].start, piece.new_bytes(i));
                    self.write_places(&[write], piece.fua)?;
                }
                Ok(())
            })();
            self.engine.journal_done(ticket);
            return written;
        }
        let mut plan = self.plan_parity_write(piece, prefetch);
        self.read_places(&mut plan.reads())?;
        self.compute_parity(&mut plan)?;
        let ticket = self.log_rows(piece, self.journal_rows(piece, Some(&plan)))?;
        let written = self.write_places(&plan.writes(), piece.fua);
        self.engine.journal_done(ticket);
        self.keep_parity(&plan, written.is_ok());
        written
    }

    /// With a write journal, the rows of a piece as md logs them: for each
    /// 4 KiB column of its window, the new pages of the data strips it
    /// writes, then the new parity (P, and Q on raid6) from `plan`; data
    /// alone when no parity member is left. Empty without a journal.
    pub(super) fn journal_rows(
        &self,
        piece: &Piece,
        plan: Option<&ParityWrite>,
    ) -> Vec<super::journal::PageRow> {
        const PAGE: usize = crate::format::journal::BLOCK_BYTES;
        if self.engine.journal.is_none() {
            return Vec::new();
        }
        let map = &piece.map;
        let window = piece.window.clone();
        // The engine refuses requests that are not whole 4 KiB blocks when
        // a journal is on, and strips are whole chunks: every range is
        // whole pages.
        assert!(
            window.start.is_multiple_of(PAGE) && window.end.is_multiple_of(PAGE),
            "a journaled write of {window:?} is not whole pages"
        );
        let strip_sectors = map.strip_sectors;
        let base = map.p.expect("a parity level").member_sector;
        let parity: Vec<&[u8]> = match plan {
            Some(plan) => {
                let mut v = vec![plan.p_window()];
                if map.q.is_some() {
                    v.push(plan.q_window());
                }
                v
            }
            None => Vec::new(),
        };
        let mut rows = Vec::new();
        for at in (window.start..window.end).step_by(PAGE) {
            let mut row = super::journal::PageRow {
                stripe_sector: base + (at as u64) / SECTOR_BYTES,
                data: Vec::new(),
                parity: parity.len(),
                pages: Vec::with_capacity((map.data.len() + 2) * PAGE),
            };
            for i in (0..map.data.len()).filter(|&i| piece.touched(i)) {
                let r = &piece.ranges[i];
                if r.start <= at && at + PAGE <= r.end {
                    row.data.push(
                        map.array_sector + i as u64 * strip_sectors + (at as u64) / SECTOR_BYTES,
                    );
                    row.pages
                        .extend_from_slice(&piece.new_bytes(i)[at - r.start..at - r.start + PAGE]);
                }
            }
            if row.data.is_empty() {
                // Parity alone changes nothing here, and md replays no
                // column without data.
                continue;
            }
            if piece.logged {
                // The data is in the journal already: parity alone, which
                // replay joins to it (md's write-out of cached data).
                row.data.clear();
                row.pages.clear();
                if parity.is_empty() {
                    continue;
                }
            }
            for p in &parity {
                let k = at - window.start;
                row.pages.extend_from_slice(&p[k..k + PAGE]);
            }
            rows.push(row);
        }
        rows
    }

    /// Logs rows in the journal, if the array has one, before their member
    /// writes start.
    pub(super) fn log_rows(
        &self,
        piece: &Piece,
        rows: Vec<super::journal::PageRow>,
    ) -> io::Result<Option<super::journal::Ticket>> {
        let kind = if piece.logged {
            super::journal::LogKind::ParityOnly
        } else {
            super::journal::LogKind::Rows
        };
        match &self.engine.journal {
            Some(journal) if !rows.is_empty() => journal.log(self.engine, rows, kind).map(Some),
            _ => Ok(None),
        }
    }

    /// Decides how a write of `piece` keeps parity right, and sets up its
    /// buffers: read-modify-write or reconstruct-write, whichever reads
    /// less (md's rmw_level), parity still hot from the last write filled
    /// in. Nothing is read or written yet, so that the stripe workers can
    /// send the reads and writes of many plans as one batch each.
    /// At least one parity member must be present. `prefetch` lets a
    /// read-modify-write that finds no parity hot read the parity of its
    /// neighbouring rows too (see [`View::parity_span`]).
    pub(super) fn plan_parity_write<'p, 'a>(
        &self,
        piece: &'p Piece<'a>,
        prefetch: bool,
    ) -> ParityWrite<'p, 'a> {
        let map = &piece.map;
        assert!(map.p.is_some(), "a parity write on a level without parity");
        let p_place = map.p.filter(|p| self.present(p));
        let q_place = map.q.filter(|q| self.present(q));
        let r_place = map.r.filter(|r| self.present(r));
        let parity_present = usize::from(p_place.is_some())
            + usize::from(q_place.is_some())
            + usize::from(r_place.is_some());
        assert!(parity_present > 0, "a parity write with no parity member");
        let lost: Vec<usize> = (0..map.data.len())
            .filter(|&i| !map.data[i].copies.iter().any(|c| self.present(c)))
            .collect();
        let touched: Vec<usize> = (0..map.data.len()).filter(|&i| piece.touched(i)).collect();
        let window = piece.window.clone();
        let hot = &self.engine.parity_cache;
        // The parity cache keeps P and Q pages; a row with R (dRAID's
        // triple parity) reads its old parity from the members.
        let cacheable = map.r.is_none();
        let hot_parity = [(p_place, Which::P), (q_place, Which::Q)]
            .iter()
            .filter(|(place, which)| {
                cacheable && place.is_some() && hot.has(map.stripe, &window, *which)
            })
            .count();
        // Reads each method needs over the window.
        let rmw_possible = touched.iter().all(|i| !lost.contains(i));
        let rmw_reads = touched.len() + parity_present - hot_parity;
        let rebuild = lost.iter().any(|&i| !piece.covers_window(i));
        let rcw_reads = if rebuild {
            map.data.len() - lost.len() + parity_present
        } else {
            (0..map.data.len())
                .filter(|&i| !piece.covers_window(i) && !lost.contains(&i))
                .count()
        };
        // md's rmw_level: 0 never reads-modifies-writes, 1 does when it
        // needs fewer reads, 2 also when the counts tie. A journal logs P
        // and Q whole, so with a parity member missing (whose old parity
        // cannot be read) the parity is computed from the data.
        let every_parity = parity_present == map.parity_places().count();
        let rmw = rmw_possible
            && (every_parity || self.engine.journal.is_none())
            && match self.engine.tunables.rmw_level() {
                0 => false,
                1 => rmw_reads < rcw_reads,
                _ => rmw_reads <= rcw_reads,
            };
        let span = if rmw && prefetch && hot_parity == 0 && cacheable {
            self.parity_span(map, &window)
        } else {
            window.clone()
        };
        let sized =
            |place: Option<Place>| AlignedBuf::zeroed(if place.is_some() { span.len() } else { 0 });
        let mut plan = ParityWrite {
            piece,
            lost,
            rmw,
            old: Vec::new(),
            strips: Vec::new(),
            need_rebuild: Vec::new(),
            // Every strip's window is in the request (a full-stripe write):
            // parity comes straight from the request's bytes.
            whole: (0..map.data.len()).all(|i| piece.covers_window(i)),
            p_place,
            q_place,
            r_place,
            p: sized(map.p),
            q: sized(map.q),
            r: sized(map.r),
            p_hot: false,
            q_hot: false,
            touched,
            span,
        };
        if rmw {
            // Parity still hot from the last write of this window is not
            // read. (A span wider than the window means none was hot.)
            let at = plan.in_span();
            debug_assert!(plan.span == window || hot_parity == 0);
            plan.p_hot = cacheable
                && p_place.is_some()
                && hot.get(map.stripe, &window, Which::P, &mut plan.p[at.clone()]);
            plan.q_hot = cacheable
                && q_place.is_some()
                && hot.get(map.stripe, &window, Which::Q, &mut plan.q[at]);
            plan.old = plan
                .touched
                .iter()
                .map(|&i| AlignedBuf::zeroed(piece.ranges[i].len()))
                .collect();
        } else {
            // If any lost strip holds old bytes the request does not
            // replace, all lost strips are rebuilt: the others' old bytes
            // are just as unknown, and the algebra needs every strip but
            // the rebuilt ones.
            if rebuild {
                plan.need_rebuild = plan.lost.clone();
            }
            if !plan.whole {
                plan.strips = (0..map.data.len())
                    .map(|_| AlignedBuf::zeroed(window.len()))
                    .collect();
            }
        }
        plan
    }

    /// Computes the new parity of a plan whose reads are done: from the
    /// old data and parity (read-modify-write), or from every strip,
    /// rebuilding lost ones first (reconstruct-write; those reads are the
    /// only ones done here, and only on a degraded row).
    pub(super) fn compute_parity(&self, plan: &mut ParityWrite) -> io::Result<()> {
        let piece = plan.piece;
        let map = &piece.map;
        let window = piece.window.clone();
        let syndrome = self.engine.syndrome;
        if plan.rmw {
            // New parity = old parity + (old data - new data) for each
            // touched strip, over the window.
            for (&i, delta) in plan.touched.iter().zip(plan.old.iter_mut()) {
                let r = piece.ranges[i].clone();
                syndrome.xor_into(delta, piece.new_bytes(i));
                // The parity buffers cover the span read, the window and
                // maybe its neighbours.
                let at = r.start - plan.span.start..r.end - plan.span.start;
                if plan.p_place.is_some() {
                    syndrome.xor_into(&mut plan.p[at.clone()], delta);
                }
                if plan.q_place.is_some() {
                    let coef = parity::gf::pow2(map.data[i].q_exponent);
                    syndrome.mul_acc(&mut plan.q[at.clone()], delta, coef);
                }
                if plan.r_place.is_some() {
                    // R's coefficient is the square of Q's: 4^e = 2^(2e).
                    let e = u16::from(map.data[i].q_exponent) * 2 % parity::gf::ORDER as u16;
                    syndrome.mul_acc(&mut plan.r[at], delta, parity::gf::pow2(e as u8));
                }
            }
            return Ok(());
        }
        let views: Vec<&[u8]> = if plan.whole {
            (0..map.data.len()).map(|i| piece.new_bytes(i)).collect()
        } else {
            self.reconstruct(map, window.clone(), &mut plan.strips, &plan.need_rebuild)?;
            for &i in &plan.touched {
                let r = &piece.ranges[i];
                plan.strips[i][r.start - window.start..r.end - window.start]
                    .copy_from_slice(piece.new_bytes(i));
            }
            plan.strips.iter().map(|s| &s[..]).collect()
        };
        let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
        match (map.q, map.r) {
            (None, _) => syndrome.gen_p(&views, &mut plan.p),
            (Some(_), None) => syndrome.gen_pq(&views, &exps, &mut plan.p, &mut plan.q),
            (Some(_), Some(_)) => {
                syndrome.gen_pqr(&views, &exps, &mut plan.p, &mut plan.q, &mut plan.r)
            }
        }
        Ok(())
    }

    /// After a plan's writes: the parity it wrote stays hot, and the
    /// neighbours' parity it read with it (see `parity_span`); parity
    /// whose member is absent, or a failed write, leaves nothing behind.
    pub(super) fn keep_parity(&self, plan: &ParityWrite, ok: bool) {
        let (map, window) = (&plan.piece.map, &plan.piece.window);
        let hot = &self.engine.parity_cache;
        if !ok || map.r.is_some() {
            hot.drop_window(map.stripe, window);
            return;
        }
        // A whole-window write needed no old parity and its row's next
        // write most likely needs none either (a sequential writer of whole
        // rows): copying its parity into the cache would cost a page
        // allocation and copy per 4 KiB for nothing, so what was kept of
        // the window is only forgotten.
        if plan.whole {
            hot.drop_window(map.stripe, window);
            return;
        }
        let capacity = self.engine.parity_cache_rows();
        // The neighbours' parity read with the window's is the members'
        // (this writer holds the stripe's lock): kept as read, and the
        // window's as written.
        let span = &plan.span;
        let parts = [
            span.start..window.start,
            window.clone(),
            window.end..span.end,
        ];
        for part in parts.into_iter().filter(|part| !part.is_empty()) {
            let at = part.start - span.start..part.end - span.start;
            let p = plan.p_place.map(|_| &plan.p[at.clone()]);
            let q = plan.q_place.map(|_| &plan.q[at]);
            if map.p.is_some() {
                hot.put(map.stripe, &part, Which::P, p, capacity);
            }
            if map.q.is_some() {
                hot.put(map.stripe, &part, Which::Q, q, capacity);
            }
        }
    }

    /// The bytes of the parity strips a read-modify-write of `window`
    /// reads when no parity of it is hot: the `PARITY_PREFETCH_BYTES`
    /// aligned block(s) that hold it, within its strip and no larger than
    /// max_sectors_kb, while the parity cache has room for them; else the
    /// window alone (and always for a window not in whole pages).
    ///
    /// A random writer over an array whose parity fits in the cache
    /// (stripe_cache_size at md's 32768 holds 131,072 rows for 8 members:
    /// 512 MiB of each parity strip's bytes, 1 GiB of memory as md would
    /// use) would otherwise need one miss per 4 KiB row to fill it: a
    /// 64 KiB read costs the disk about what a 4 KiB one does and fills
    /// sixteen rows. Once the cache is full it fills no faster than it
    /// evicts, so a writer whose parity does not fit reads what md reads.
    fn parity_span(&self, map: &StripeMap, window: &Range<usize>) -> Range<usize> {
        const PAGE: usize = super::tuning::STRIPE_CACHE_PAGE;
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        let aligned = window.start.is_multiple_of(PAGE) && window.end.is_multiple_of(PAGE);
        let span = window.start / PARITY_PREFETCH_BYTES * PARITY_PREFETCH_BYTES
            ..(window.end.div_ceil(PARITY_PREFETCH_BYTES) * PARITY_PREFETCH_BYTES).min(strip_bytes);
        let room = self
            .engine
            .parity_cache
            .has_room(span.len() / PAGE, self.engine.parity_cache_rows());
        if aligned && room && span.len() <= self.engine.max_member_io() {
            span
        } else {
            window.clone()
        }
    }
}

/// One parity write, planned: what it reads, what it computes, what it
/// writes. See [`View::plan_parity_write`].
pub(super) struct ParityWrite<'p, 'a> {
    pub(super) piece: &'p Piece<'a>,
    touched: Vec<usize>,
    lost: Vec<usize>,
    /// Read-modify-write (else reconstruct-write).
    rmw: bool,
    /// Read-modify-write: the old bytes of each touched strip's range.
    old: Vec<AlignedBuf>,
    /// Reconstruct-write: every strip's window (none when `whole`).
    strips: Vec<AlignedBuf>,
    /// Reconstruct-write: lost strips to rebuild first.
    need_rebuild: Vec<usize>,
    whole: bool,
    /// The parity members present, and the parity over `span`: old then
    /// new for read-modify-write (new only over the window), new for
    /// reconstruct-write.
    p_place: Option<Place>,
    q_place: Option<Place>,
    r_place: Option<Place>,
    p: AlignedBuf,
    q: AlignedBuf,
    r: AlignedBuf,
    /// Old parity that came from the parity cache, not to be read.
    p_hot: bool,
    q_hot: bool,
    /// The bytes of the parity strips that `p` and `q` cover: the window,
    /// or more around it when the plan reads neighbouring parity for the
    /// cache (read-modify-write only).
    span: Range<usize>,
}

impl ParityWrite<'_, '_> {
    /// What the plan must read before its parity can be computed.
    pub(super) fn reads(&mut self) -> Vec<(&Place, usize, &mut [u8])> {
        let piece = self.piece;
        let map = &piece.map;
        let window = piece.window.clone();
        let mut reads: Vec<(&Place, usize, &mut [u8])> = Vec::new();
        if self.rmw {
            // Old data of every touched strip and old parity.
            for (&i, buf) in self.touched.iter().zip(self.old.iter_mut()) {
                reads.push((&map.data[i].copies[0], piece.ranges[i].start, &mut buf[..]));
            }
            if let (Some(place), false) = (&self.p_place, self.p_hot) {
                reads.push((place, self.span.start, &mut self.p[..]));
            }
            if let (Some(place), false) = (&self.q_place, self.q_hot) {
                reads.push((place, self.span.start, &mut self.q[..]));
            }
            if let Some(place) = &self.r_place {
                reads.push((place, self.span.start, &mut self.r[..]));
            }
            return reads;
        }
        // Rebuilding a lost strip needs the old data of every other strip;
        // otherwise the strips the request covers need not be read.
        for (i, buf) in self.strips.iter_mut().enumerate() {
            let needed = !self.need_rebuild.is_empty() || !piece.covers_window(i);
            if needed && !self.lost.contains(&i) {
                reads.push((&map.data[i].copies[0], window.start, &mut buf[..]));
            }
        }
        reads
    }

    /// What the plan writes once its parity is computed: the touched
    /// strips that are present, and the parity.
    pub(super) fn writes(&self) -> Vec<(&Place, usize, &[u8])> {
        let piece = self.piece;
        let mut writes: Vec<(&Place, usize, &[u8])> = self
            .touched
            .iter()
            .filter(|i| !self.lost.contains(i))
            .map(|&i| {
                (
                    &piece.map.data[i].copies[0],
                    piece.ranges[i].start,
                    piece.new_bytes(i),
                )
            })
            .collect();
        let start = piece.window.start;
        if let Some(place) = &self.p_place {
            writes.push((place, start, self.p_window()));
        }
        if let Some(place) = &self.q_place {
            writes.push((place, start, self.q_window()));
        }
        if let Some(place) = &self.r_place {
            writes.push((place, start, &self.r[self.in_span()]));
        }
        writes
    }

    /// The new P of the window (the buffer may cover more, see `span`).
    fn p_window(&self) -> &[u8] {
        &self.p[self.in_span()]
    }

    /// The new Q of the window.
    fn q_window(&self) -> &[u8] {
        &self.q[self.in_span()]
    }

    /// Where the window lies in the parity buffers.
    fn in_span(&self) -> Range<usize> {
        let window = &self.piece.window;
        debug_assert!(self.span.start <= window.start && window.end <= self.span.end);
        window.start - self.span.start..window.end - self.span.start
    }
}

/// One member write of a request: a place's member, or its replacement.
pub(super) struct WriteTarget<'b> {
    role: usize,
    replacement: bool,
    member: MemberRef,
    offset: u64,
    buf: &'b [u8],
    fua: bool,
}

impl WriteTarget<'_> {
    pub(super) fn member(&self) -> &MemberRef {
        &self.member
    }

    /// The member byte offset written.
    pub(super) fn offset(&self) -> u64 {
        self.offset
    }
}

/// Runs member writes as one batch, each split at `max` bytes
/// (max_sectors_kb); returns the first error of each.
pub(super) fn run_writes(max: usize, targets: &[WriteTarget]) -> Vec<Option<io::Error>> {
    let mut ops = Vec::new();
    let mut owner = Vec::new();
    for (k, t) in targets.iter().enumerate() {
        for (i, part) in t.buf.chunks(max).enumerate() {
            let at = t.offset + (i * max) as u64;
            ops.push(match t.fua {
                true => IoOp::write_fua(t.member.as_ref(), at, part),
                false => IoOp::write(t.member.as_ref(), at, part),
            });
            owner.push(k);
        }
    }
    first_errors(targets.len(), owner, batch::run(&mut ops))
}

/// [`crate::array::recover_lost`], failing as a request does when too many
/// members are lost.
pub(super) fn recover_lost(
    syndrome: &dyn parity::Syndrome,
    map: &StripeMap,
    present: &[&[u8]],
    lost: &[usize],
    parity: [Option<&[u8]>; 3],
    outputs: &mut [&mut [u8]],
) -> io::Result<()> {
    crate::array::recover_lost(syndrome, map, present, lost, parity, outputs)
        .map_err(|_| lost_error(map, "too many members lost to reconstruct"))
}

/// Runs member reads (member, byte offset, buffer) as one batch, each split
/// at `max` bytes; returns the first error of each.
pub(super) fn run_reads(
    max: usize,
    reads: &mut [(MemberRef, u64, &mut [u8])],
) -> Vec<Option<io::Error>> {
    let count = reads.len();
    let mut ops = Vec::new();
    let mut owner = Vec::new();
    for (k, &mut (ref member, at, ref mut buf)) in reads.iter_mut().enumerate() {
        for (i, part) in buf.chunks_mut(max).enumerate() {
            ops.push(IoOp::read(member.as_ref(), at + (i * max) as u64, part));
            owner.push(k);
        }
    }
    let results = batch::run(&mut ops);
    first_errors(count, owner, results)
}

/// The first error of each of `count` requests, from the results of their
/// ops (`owner[i]` is op i's request).
fn first_errors(
    count: usize,
    owner: Vec<usize>,
    results: Vec<io::Result<()>>,
) -> Vec<Option<io::Error>> {
    let mut first: Vec<Option<io::Error>> = (0..count).map(|_| None).collect();
    for (k, result) in owner.into_iter().zip(results) {
        if let Err(e) = result {
            first[k].get_or_insert(e);
        }
    }
    first
}

pub(super) fn lost_error(map: &StripeMap, what: &str) -> io::Error {
    lost(format!("stripe {}: {what}", map.stripe))
}

/// A read handed to a server (an extent of `read_extents`), counted in
/// flight on its member until the server is done with it, so that mirror
/// reads chosen meanwhile go to other copies. It keeps the member, and so
/// its descriptor, open.
struct PendingRead {
    pending: Arc<[std::sync::atomic::AtomicU32]>,
    role: usize,
    _member: MemberRef,
}

impl PendingRead {
    fn new(pending: &Arc<[std::sync::atomic::AtomicU32]>, role: usize, member: MemberRef) -> Self {
        pending[role].fetch_add(1, Ordering::Relaxed);
        PendingRead {
            pending: pending.clone(),
            role,
            _member: member,
        }
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        self.pending[self.role].fetch_sub(1, Ordering::Relaxed);
    }
}
