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
use crate::engine::datapath::failure::PathError;
use crate::engine::table::MemberTable;
use crate::engine::Engine;
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

fn lost(what: String) -> io::Error {
    io::Error::other(what)
}

/// The part of one stripe that a request covers.
pub(in crate::engine) struct Piece<'a> {
    pub(in crate::engine) map: StripeMap,
    /// For each data strip, the byte range (strip-relative) the request covers; empty if none.
    pub(in crate::engine) ranges: Vec<Range<usize>>,
    /// Union of the ranges: where parity changes.
    pub(in crate::engine) window: Range<usize>,
    /// The request's bytes for this stripe, starting at the first covered byte.
    data: &'a [u8],
    /// Offset of the first covered byte within the stripe's data.
    start_in_stripe: usize,
    /// Its data is in the journal already (logged alone for write-back):
    /// only its parity is logged before its member writes.
    pub(in crate::engine) logged: bool,
    /// A client's FUA write: every member write it makes carries FUA.
    pub(in crate::engine) fua: bool,
}

impl Piece<'_> {
    fn strip_bytes(&self) -> usize {
        (self.map.strip_sectors * SECTOR_BYTES) as usize
    }

    /// The request's bytes for strip `i` (its covered range).
    pub(in crate::engine) fn new_bytes(&self, i: usize) -> &[u8] {
        let r = &self.ranges[i];
        let from = i * self.strip_bytes() + r.start - self.start_in_stripe;
        &self.data[from..from + r.len()]
    }

    pub(in crate::engine) fn touched(&self, i: usize) -> bool {
        !self.ranges[i].is_empty()
    }

    /// The byte range (strip-relative) the request covers in strip `i`.
    pub(in crate::engine) fn range(&self, i: usize) -> &Range<usize> {
        &self.ranges[i]
    }

    /// Whether strip `i`'s new bytes cover the whole window.
    pub(in crate::engine) fn covers_window(&self, i: usize) -> bool {
        self.ranges[i].start <= self.window.start && self.ranges[i].end >= self.window.end
    }
}

impl Engine {
    /// Calls `f` for each stripe piece of the byte range [offset, offset+len).
    pub(in crate::engine) fn for_each_piece(
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
    pub(in crate::engine) fn piece<'a>(
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
    pub(in crate::engine) fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.read_direct(offset, buf) {
            return Ok(());
        }
        let len = buf.len();
        self.for_each_piece(offset, len, |engine, map, in_stripe, range| {
            let out = &mut buf[range.clone()];
            // Bytes still in the stripe cache are newer than the members'.
            let pending = if engine.datapath.cache.has_batches() {
                engine
                    .datapath
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
        let pending = if self.datapath.cache.has_batches() {
            let in_stripe = at.data_index * strip_bytes + in_strip;
            self.datapath
                .cache
                .pending_in(at.stripe, in_stripe..in_stripe + len)
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
    pub(in crate::engine) fn read_cached(
        &self,
        offset: u64,
        buf: &mut [u8],
        company: bool,
    ) -> io::Result<()> {
        let len = buf.len();
        let t = &self.tunables;
        let strip = self.datapath.row.strip_bytes as u64;
        let read_ahead = t.read_ahead_sectors() as u64 * SECTOR_BYTES;
        if !t.read_cache() && read_ahead == 0 {
            return self.read_bytes(offset, buf);
        }
        let (_in_flight, sequential, alone) = self.datapath.reads.read_arrives(offset, len);
        let lone_stream = self
            .datapath
            .reads
            .lone_stream(sequential && alone && !company && self.reads_held_by_server() == 0);
        // The fast path: a small random read goes to its member, no lookup.
        if t.fast_path() && !sequential && offset % strip + len as u64 <= strip {
            return self.read_bytes(offset, buf);
        }
        if self.datapath.reads.lookup(offset, buf) {
            return Ok(());
        }
        let capacity = self.read_cache_bytes();
        let generation = self.datapath.reads.generation();
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
                self.datapath
                    .reads
                    .insert(offset, buf.to_vec(), generation, capacity);
            }
            return Ok(());
        }
        let mut ahead = vec![0u8; total];
        self.read_bytes(offset, &mut ahead)?;
        buf.copy_from_slice(&ahead[..len]);
        self.datapath
            .reads
            .insert(offset, ahead, generation, capacity);
        Ok(())
    }

    /// What the read cache may hold: the stripe cache's pages over the
    /// data strips of a row, md's memory for stripe_cache_size.
    fn read_cache_bytes(&self) -> usize {
        self.tunables.stripe_cache_size() as usize
            * crate::engine::tuning::STRIPE_CACHE_PAGE
            * self.datapath.row.data_strips
    }

    /// The most one read-ahead fetches: half the read cache, so that what
    /// is fetched stays until it is read.
    pub(in crate::engine) fn read_ahead_cap_bytes(&self) -> u64 {
        let entries = self.tunables.stripe_cache_size();
        crate::engine::tuning::read_ahead_cap_sectors(entries, self.datapath.row.data_strips)
            * SECTOR_BYTES
    }

    /// Where the bytes of a read lie on the members, for a server that
    /// fetches them itself (see `BlockBackend::read_extents`): splices them
    /// from buffered members' page caches to its socket, or reads them
    /// asynchronously (the fast path, when `fast_path` is on). Only for a
    /// plain read, served by usable members, with nothing newer in the
    /// stripe cache and nothing for the read cache or read-ahead to do.
    /// Else `None`, and the read goes through
    /// [`read_cached`](Self::read_cached).
    pub(in crate::engine) fn file_extents(
        &self,
        offset: u64,
        len: usize,
        how: ExtentUse,
    ) -> Option<Vec<FileExtent>> {
        let t = &self.tunables;
        let end = offset.checked_add(len as u64)?;
        if len == 0
            || end > self.size_bytes()
            || t.read_cache()
            || self.datapath.cache.has_batches()
        {
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
                                &self.datapath.pending_reads,
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
            let (_in_flight, sequential, alone) = self.datapath.reads.read_arrives(offset, len);
            // This read's own extents are counted among those held.
            let alone = alone && self.reads_held_by_server() as usize == extents.len();
            if self.datapath.reads.lone_stream(sequential && alone) {
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
        self.datapath
            .pending_reads
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
    pub(in crate::engine) fn max_member_io(&self) -> usize {
        self.tunables.max_io_bytes()
    }

    /// What a stripe-cache batch for one row costs, in entries.
    pub(in crate::engine) fn cache_entries_per_row(&self) -> usize {
        StripeCache::entries_for(self.datapath.row.strip_bytes)
    }

    /// Writes a batch of the stripe cache to the members.
    pub(in crate::engine) fn destage(
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
            let slot = self.datapath.locks.slot(map.stripe);
            if let Some(result) = self
                .datapath
                .stripes
                .submit(map.stripe, slot, parts, logged, fua)
            {
                return result;
            }
        }
        let _guard = self.datapath.locks.lock(map.stripe);
        let _in_flight = self.bitmap_start_write(map.stripe)?;
        self.write_parts_locked(map, parts, logged, fua, true)
    }

    /// Writes parts of one row, one piece at a time with retries; the
    /// caller holds the row's lock and has marked it in the bitmap.
    /// `prefetch`: its first try may read neighbouring parity for the cache
    /// (see [`View::plan_write`]); a retry, which follows a read
    /// error, reads no more than it needs.
    pub(in crate::engine) fn write_parts_locked(
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
        mut f: impl FnMut(&View) -> Result<(), PathError>,
    ) -> io::Result<()> {
        let mut last = None;
        let mut corrected = vec![false; self.geometry().raid_disks()];
        // Each member is corrected once, then failed: at most two rounds each.
        for _ in 0..=2 * self.geometry().raid_disks() {
            let view = self.view(stripe);
            let (role, error) = match f(&view) {
                Ok(()) => return Ok(()),
                Err(PathError::Array(e)) => return Err(e),
                Err(PathError::MemberRead { role, error }) => (role, error),
            };
            if corrected[role] {
                // It fails again after its sectors were rewritten and read
                // back: the data must come from redundancy, without it.
                let member = view.table.entry(role).map(|e| e.slot.member.clone());
                let reason = crate::engine::readd::failure_reason(
                    format!("read error after a rewrite: member {role}: {error}"),
                    &[&error],
                );
                self.fail_blamed(role, member.as_ref(), &error, &reason);
            } else {
                corrected[role] = true;
                if let crate::engine::members::Correction::Lost(lost) =
                    self.correct_read_error(stripe, role, &error, locked)
                {
                    return Err(lost);
                }
            }
            last = Some(PathError::MemberRead { role, error });
        }
        Err(last.map_or_else(|| io::Error::other("I/O failed"), PathError::into_io))
    }

    /// Writes `data` at array byte `offset`, keeping redundancy right.
    /// Partial rows may wait in the stripe cache to be gathered into whole
    /// ones (see [`super::cache`]); with write-back they are acknowledged
    /// from it.
    pub(in crate::engine) fn write_bytes(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        let (_in_flight, sequential) = self.datapath.cache.write_arrives(offset, data.len());
        // Bytes read ahead are dropped once the write is in; reads racing
        // with it keep nothing (see readcache).
        self.datapath.reads.write_begins();
        let result = self.write_rows(offset, data, fua, sequential);
        self.datapath
            .reads
            .write_done(offset..offset + data.len() as u64);
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
                match journal.log(engine, rows, crate::engine::journal::LogKind::DataOnly) {
                    Ok(ticket) => Ok(Some(crate::engine::journal::JournalHold::hold(
                        journal, ticket,
                    ))),
                    // The journal's share for the cache is full: this write
                    // goes through, as md's r5c does when its log runs short.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                    Err(e) => Err(e),
                }
            };
            let log: Option<&super::cache::LogData> =
                (engine.journal.is_some() && write_back && bytes.len() < row_bytes)
                    .then_some(&log_data);
            let offer = engine.datapath.cache.offer(
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
                        let stats = &engine.datapath.cache.stats;
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
pub(in crate::engine) struct View<'a> {
    pub(in crate::engine) engine: &'a Engine,
    pub(in crate::engine) table: Arc<MemberTable>,
    pub(in crate::engine) stripe: u64,
}

impl View<'_> {
    /// Whether the member holding `place` is in sync for this stripe
    /// (for a role held by a distributed spare, the child holding its
    /// space there: see [`MemberTable::home`]).
    pub(in crate::engine) fn present(&self, place: &Place) -> bool {
        self.table.present(place, self.stripe)
    }

    /// The place that holds the bytes of `place` (see [`MemberTable::home`]).
    pub(in crate::engine) fn home(&self, place: &Place) -> Place {
        self.table.home(place, self.stripe)
    }

    pub(in crate::engine) fn offset_of(
        &self,
        place: &Place,
        offset_in_strip: usize,
    ) -> (MemberRef, u64) {
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
    pub(in crate::engine) fn read_places(
        &self,
        reads: &mut [(&Place, usize, &mut [u8])],
    ) -> Result<(), PathError> {
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

    /// The member writes that `writes` make: each place, and its
    /// replacement where it has one; all with FUA when `fua` says so.
    pub(in crate::engine) fn write_targets<'b>(
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
    /// target): a failed member is failed at once (md does the same without
    /// a bad-block log) and the rest goes on without it, as parity computed
    /// before any write still covers its share; a failed replacement is
    /// dropped. An error only when the array can no longer serve.
    pub(in crate::engine) fn settle_writes(
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
    pub(in crate::engine) fn fail_on_write(
        &self,
        role: usize,
        member: &MemberRef,
        source: &io::Error,
    ) -> io::Result<()> {
        let reason =
            crate::engine::readd::failure_reason(format!("write error: {source}"), &[source]);
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
            .is_none_or(|b| b.covers(self.stripe));
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
    pub(in crate::engine) fn read_place(
        &self,
        place: &Place,
        offset_in_strip: usize,
        buf: &mut [u8],
    ) -> Result<(), PathError> {
        let (member, at) = self.offset_of(place, offset_in_strip);
        let role = self.home(place).member;
        let max = self.engine.max_member_io();
        for (i, part) in buf.chunks_mut(max).enumerate() {
            let at = at + (i * max) as u64;
            // One retry: a transient error should not cost a member.
            counted::read_at(member.as_ref(), part, at)
                .or_else(|_| counted::read_at(member.as_ref(), part, at))
                .map_err(|error| PathError::MemberRead { role, error })?;
        }
        Ok(())
    }

    /// Reads one piece, reconstructing strips whose members are gone.
    fn read_piece(&self, piece: &Piece, in_stripe: usize, out: &mut [u8]) -> Result<(), PathError> {
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
        let pending = &self.engine.datapath.pending_reads;
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
        let _guard = self.engine.datapath.locks.lock(piece.map.stripe);
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
    pub(in crate::engine) fn read_window(
        &self,
        map: &StripeMap,
        window: Range<usize>,
        lost: &[usize],
    ) -> Result<Vec<AlignedBuf>, PathError> {
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
    pub(in crate::engine) fn reconstruct(
        &self,
        map: &StripeMap,
        window: Range<usize>,
        strips: &mut [AlignedBuf],
        lost: &[usize],
    ) -> Result<(), PathError> {
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
                self.engine.datapath.syndrome,
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
}

/// One member write of a request: a place's member, or its replacement.
pub(in crate::engine) struct WriteTarget<'b> {
    role: usize,
    replacement: bool,
    member: MemberRef,
    offset: u64,
    buf: &'b [u8],
    fua: bool,
}

impl WriteTarget<'_> {
    pub(in crate::engine) fn member(&self) -> &MemberRef {
        &self.member
    }

    /// The member byte offset written.
    pub(in crate::engine) fn offset(&self) -> u64 {
        self.offset
    }
}

/// Runs member writes as one batch, each split at `max` bytes
/// (max_sectors_kb); returns the first error of each.
pub(in crate::engine) fn run_writes(max: usize, targets: &[WriteTarget]) -> Vec<Option<io::Error>> {
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
pub(in crate::engine) fn recover_lost(
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
pub(in crate::engine) fn run_reads(
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

pub(in crate::engine) fn lost_error(map: &StripeMap, what: &str) -> io::Error {
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
