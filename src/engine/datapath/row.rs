//! A row's write, ready to run: its plan (`plan.rs`) with the buffers it
//! reads into and computes in, the parity kept hot from the last write
//! filled in. The executor (`execute.rs`) runs it; this file holds its
//! steps: what it reads, how its parity is computed, what it logs, what it
//! writes, and what parity it leaves hot.

use super::failure::PathError;
use super::io::{lost_error, Piece, View};
use super::paritycache::Which;
use super::plan::{self, Method, RowPlan, RowShape, StripShape, PARITY_MAX};
use crate::engine::journal::{LogKind, PageRow, Ticket};
use crate::geometry::{Place, StripeMap};
use crate::member::AlignedBuf;
use crate::parity;
use crate::units::SECTOR_BYTES;
use std::io;
use std::ops::Range;

/// The parity a read-modify-write reads around its window while the parity
/// cache has room (see [`View::parity_span`]).
const PARITY_PREFETCH_BYTES: usize = 64 * 1024;

/// One row's write: the plan and its buffers. See [`View::plan_write`].
pub(in crate::engine) struct RowWrite<'p, 'a> {
    pub(in crate::engine) piece: &'p Piece<'a>,
    pub(in crate::engine) plan: RowPlan,
    /// Read-modify-write: the old bytes of each strip of `plan.read_data`.
    old: Vec<AlignedBuf>,
    /// Reconstruct-write: every strip's window.
    strips: Vec<AlignedBuf>,
    /// The parity members present (by column: P, Q, R), and the parity
    /// over `span`: old then new for read-modify-write (new only over the
    /// window), new for reconstruct-write.
    places: [Option<Place>; PARITY_MAX],
    parity: [AlignedBuf; PARITY_MAX],
    /// Old parity to read: the plan's, and hot parity the cache had lost
    /// by the time it was asked for.
    read_parity: [bool; PARITY_MAX],
    /// The bytes of the parity strips that the parity buffers cover: the
    /// window, or more around it when the plan reads neighbouring parity
    /// for the cache (read-modify-write only).
    span: Range<usize>,
}

impl View<'_> {
    /// The shape of `piece`'s row, as the planner sees it.
    fn row_shape(&self, piece: &Piece) -> RowShape {
        let map = &piece.map;
        let strips = (0..map.data.len())
            .map(|i| StripShape {
                touched: piece.touched(i),
                covers_window: piece.touched(i) && piece.covers_window(i),
                copies_present: map.data[i].copies.iter().map(|c| self.present(c)).collect(),
            })
            .collect();
        let columns = [map.p, map.q, map.r];
        let parity_present = columns.map(|c| c.is_some_and(|place| self.present(&place)));
        // The parity cache keeps P and Q pages; a row with R (dRAID's
        // triple parity) reads its old parity from the members.
        let cacheable = map.r.is_none();
        let hot = &self.engine.datapath.parity_cache;
        let parity_hot = [Which::P, Which::Q].map(|which| {
            let column = which as usize;
            cacheable && parity_present[column] && hot.has(map.stripe, &piece.window, which)
        });
        RowShape {
            strips,
            parity_count: map.parity_places().count(),
            parity_present,
            parity_hot,
            rmw_level: self.engine.tunables.rmw_level(),
            journal: self.engine.journal.is_some(),
        }
    }

    /// Plans the write of `piece` and sets up its buffers, hot parity
    /// filled in. Nothing is read or written yet, so that the executor can
    /// send the reads and writes of many rows as one batch each.
    /// `prefetch` lets a read-modify-write that finds no parity hot read
    /// the parity of its neighbouring rows too (see [`View::parity_span`]).
    pub(in crate::engine) fn plan_write<'p, 'a>(
        &self,
        piece: &'p Piece<'a>,
        prefetch: bool,
    ) -> io::Result<RowWrite<'p, 'a>> {
        let map = &piece.map;
        let shape = self.row_shape(piece);
        let plan = plan::plan_row(&shape).map_err(|why| lost_error(map, why.what()))?;
        let window = piece.window.clone();
        let rmw = plan.method == Method::ReadModifyWrite;
        let cacheable = map.r.is_none();
        let span = if rmw && prefetch && !plan.hot_parity.contains(&true) && cacheable {
            self.parity_span(map, &window)
        } else {
            window.clone()
        };
        let columns = [map.p, map.q, map.r];
        let places = [0, 1, 2].map(|c| columns[c].filter(|_| shape.parity_present[c]));
        let parity_bytes = match plan.method {
            Method::Copies | Method::DataOnly => 0,
            _ => span.len(),
        };
        let parity = [0, 1, 2].map(|c| {
            AlignedBuf::zeroed(if columns[c].is_some() {
                parity_bytes
            } else {
                0
            })
        });
        let mut write = RowWrite {
            piece,
            old: Vec::new(),
            strips: Vec::new(),
            places,
            parity,
            read_parity: plan.read_parity,
            span,
            plan,
        };
        match write.plan.method {
            Method::ReadModifyWrite => self.take_hot_parity(&mut write),
            Method::ReconstructWrite => {
                write.strips = (0..map.data.len())
                    .map(|_| AlignedBuf::zeroed(window.len()))
                    .collect();
            }
            Method::Copies | Method::DataOnly | Method::FullStripe => {}
        }
        write.check_buffers();
        Ok(write)
    }

    /// A read-modify-write's old parity still hot from the last write of
    /// its window, copied from the cache, and buffers for the old data.
    /// Parity the cache has dropped since the plan was made is read.
    fn take_hot_parity(&self, write: &mut RowWrite) {
        let piece = write.piece;
        let (map, window) = (&piece.map, &piece.window);
        let at = write.in_span();
        // A span wider than the window means none was hot.
        debug_assert!(write.span == *window || !write.plan.hot_parity.contains(&true));
        let hot = &self.engine.datapath.parity_cache;
        for which in [Which::P, Which::Q] {
            let column = which as usize;
            if write.plan.hot_parity[column] {
                let got = hot.get(
                    map.stripe,
                    window,
                    which,
                    &mut write.parity[column][at.clone()],
                );
                write.read_parity[column] = !got;
            }
        }
        write.old = write
            .plan
            .read_data
            .iter()
            .map(|&i| AlignedBuf::zeroed(piece.ranges[i].len()))
            .collect();
    }

    /// Computes the new parity of a row whose reads are done: from the old
    /// data and parity (read-modify-write), or from every strip,
    /// rebuilding lost ones first (reconstruct-write; those reads are the
    /// only ones done here, and only on a degraded row).
    pub(in crate::engine) fn compute_parity(&self, write: &mut RowWrite) -> Result<(), PathError> {
        let piece = write.piece;
        let map = &piece.map;
        let window = piece.window.clone();
        let syndrome = self.engine.datapath.syndrome;
        let present = write.places.map(|p| p.is_some());
        match write.plan.method {
            Method::Copies | Method::DataOnly => return Ok(()),
            Method::ReadModifyWrite => {
                for (&i, delta) in write.plan.read_data.iter().zip(write.old.iter_mut()) {
                    let r = piece.ranges[i].clone();
                    // The change of the strip: old bytes + new bytes.
                    syndrome.xor_into(delta, piece.new_bytes(i));
                    // The parity buffers cover the span read: the window
                    // and maybe its neighbours.
                    let at = r.start - write.span.start..r.end - write.span.start;
                    let [p, q, r] = &mut write.parity;
                    parity::apply_delta(
                        syndrome,
                        delta,
                        map.data[i].q_exponent,
                        [
                            present[0].then(|| &mut p[at.clone()]),
                            present[1].then(|| &mut q[at.clone()]),
                            present[2].then(|| &mut r[at.clone()]),
                        ],
                    );
                }
                return Ok(());
            }
            Method::ReconstructWrite => {
                self.reconstruct(map, window.clone(), &mut write.strips, &write.plan.rebuild)?;
                // Every touched strip takes the request's bytes, a lost
                // one too: it is in the parity only.
                for i in (0..map.data.len()).filter(|&i| piece.touched(i)) {
                    let r = &piece.ranges[i];
                    write.strips[i][r.start - window.start..r.end - window.start]
                        .copy_from_slice(piece.new_bytes(i));
                }
            }
            Method::FullStripe => {}
        }
        let views: Vec<&[u8]> = match write.plan.method {
            Method::FullStripe => (0..map.data.len()).map(|i| piece.new_bytes(i)).collect(),
            _ => write.strips.iter().map(|s| &s[..]).collect(),
        };
        let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
        let [p, q, r] = &mut write.parity;
        match (map.q, map.r) {
            (None, _) => syndrome.gen_p(&views, p),
            (Some(_), None) => syndrome.gen_pq(&views, &exps, p, q),
            (Some(_), Some(_)) => syndrome.gen_pqr(&views, &exps, p, q, r),
        }
        Ok(())
    }

    /// With a write journal, the rows of a piece as md logs them: for each
    /// 4 KiB column of its window, the new pages of the data strips it
    /// writes, then the new parity (P, and Q on raid6) from `write`; data
    /// alone when no parity member is left (or `write` is None: the data
    /// a write-back cache logs before it acknowledges). Empty without a
    /// journal.
    pub(in crate::engine) fn journal_rows(
        &self,
        piece: &Piece,
        write: Option<&RowWrite>,
    ) -> Vec<PageRow> {
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
        let parity: Vec<&[u8]> = match write {
            Some(write) if write.plan.method != Method::DataOnly => {
                let mut v = vec![write.parity_window(0)];
                if map.q.is_some() {
                    v.push(write.parity_window(1));
                }
                v
            }
            _ => Vec::new(),
        };
        let mut rows = Vec::new();
        for at in (window.start..window.end).step_by(PAGE) {
            let mut row = PageRow {
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
    pub(in crate::engine) fn log_rows(
        &self,
        piece: &Piece,
        rows: Vec<PageRow>,
    ) -> io::Result<Option<Ticket>> {
        let kind = if piece.logged {
            LogKind::ParityOnly
        } else {
            LogKind::Rows
        };
        match &self.engine.journal {
            Some(journal) if !rows.is_empty() => journal.log(self.engine, rows, kind).map(Some),
            _ => Ok(None),
        }
    }

    /// After a row's writes: the parity it wrote stays hot, and the
    /// neighbours' parity it read with it (see `parity_span`); parity
    /// whose member is absent, a failed write, or a write of the data
    /// alone leaves nothing behind.
    pub(in crate::engine) fn keep_parity(&self, write: &RowWrite, ok: bool) {
        let (map, window) = (&write.piece.map, &write.piece.window);
        let hot = &self.engine.datapath.parity_cache;
        match write.plan.method {
            Method::Copies => return,
            // A whole-window write needed no old parity and its row's next
            // write most likely needs none either (a sequential writer of
            // whole rows): copying its parity into the cache would cost a
            // page allocation and copy per 4 KiB for nothing, so what was
            // kept of the window is only forgotten.
            Method::DataOnly | Method::FullStripe => {
                hot.drop_window(map.stripe, window);
                return;
            }
            Method::ReadModifyWrite | Method::ReconstructWrite => {}
        }
        if !ok || map.r.is_some() {
            hot.drop_window(map.stripe, window);
            return;
        }
        let capacity = self.engine.parity_cache_rows();
        // The neighbours' parity read with the window's is the members'
        // (this writer holds the stripe's lock): kept as read, and the
        // window's as written.
        let span = &write.span;
        let parts = [
            span.start..window.start,
            window.clone(),
            window.end..span.end,
        ];
        for part in parts.into_iter().filter(|part| !part.is_empty()) {
            let at = part.start - span.start..part.end - span.start;
            for which in [Which::P, Which::Q] {
                let column = which as usize;
                if [map.p, map.q][column].is_some() {
                    let bytes = write.places[column].map(|_| &write.parity[column][at.clone()]);
                    hot.put(map.stripe, &part, which, bytes, capacity);
                }
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
        const PAGE: usize = crate::engine::tuning::STRIPE_CACHE_PAGE;
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        let aligned = window.start.is_multiple_of(PAGE) && window.end.is_multiple_of(PAGE);
        let span = window.start / PARITY_PREFETCH_BYTES * PARITY_PREFETCH_BYTES
            ..(window.end.div_ceil(PARITY_PREFETCH_BYTES) * PARITY_PREFETCH_BYTES).min(strip_bytes);
        let room = self
            .engine
            .datapath
            .parity_cache
            .has_room(span.len() / PAGE, self.engine.parity_cache_rows());
        if aligned && room && span.len() <= self.engine.max_member_io() {
            span
        } else {
            window.clone()
        }
    }
}

impl RowWrite<'_, '_> {
    /// The buffers fit the plan: asserted where they are set up, and
    /// again by the executor before it reads into them.
    pub(in crate::engine) fn check_buffers(&self) {
        let piece = self.piece;
        let window = &piece.window;
        assert!(self.span.start <= window.start && window.end <= self.span.end);
        match self.plan.method {
            Method::ReadModifyWrite => {
                assert_eq!(self.old.len(), self.plan.read_data.len());
                for (&i, buf) in self.plan.read_data.iter().zip(&self.old) {
                    assert_eq!(buf.len(), piece.ranges[i].len(), "strip {i}'s old bytes");
                }
            }
            Method::ReconstructWrite => {
                assert_eq!(self.strips.len(), piece.map.data.len());
                assert!(self.strips.iter().all(|s| s.len() == window.len()));
            }
            Method::Copies | Method::DataOnly | Method::FullStripe => {
                assert!(self.old.is_empty() && self.strips.is_empty());
            }
        }
        for column in 0..PARITY_MAX {
            assert!(self.places[column].is_some() == self.plan.write_parity[column]);
            assert!(!self.read_parity[column] || self.places[column].is_some());
        }
    }

    /// What the row must read before its parity can be computed.
    pub(in crate::engine) fn reads(&mut self) -> Vec<(&Place, usize, &mut [u8])> {
        let piece = self.piece;
        let map = &piece.map;
        let window = piece.window.clone();
        let mut reads: Vec<(&Place, usize, &mut [u8])> = Vec::new();
        match self.plan.method {
            Method::ReadModifyWrite => {
                for (&i, buf) in self.plan.read_data.iter().zip(self.old.iter_mut()) {
                    reads.push((&map.data[i].copies[0], piece.ranges[i].start, &mut buf[..]));
                }
            }
            Method::ReconstructWrite => {
                for (i, buf) in self.strips.iter_mut().enumerate() {
                    if self.plan.read_data.contains(&i) {
                        reads.push((&map.data[i].copies[0], window.start, &mut buf[..]));
                    }
                }
            }
            Method::Copies | Method::DataOnly | Method::FullStripe => {}
        }
        for ((place, buf), read) in self
            .places
            .iter()
            .zip(&mut self.parity)
            .zip(self.read_parity)
        {
            if let (Some(place), true) = (place, read) {
                reads.push((place, self.span.start, &mut buf[..]));
            }
        }
        reads
    }

    /// What the row writes once its parity is computed: the copies of the
    /// touched strips the plan names, and the parity.
    pub(in crate::engine) fn writes(&self) -> Vec<(&Place, usize, &[u8])> {
        let piece = self.piece;
        let map = &piece.map;
        let mut writes: Vec<(&Place, usize, &[u8])> = Vec::new();
        for (i, copies) in &self.plan.write_data {
            for &c in copies {
                let bytes = piece.new_bytes(*i);
                writes.push((&map.data[*i].copies[c], piece.ranges[*i].start, bytes));
            }
        }
        if !matches!(self.plan.method, Method::Copies | Method::DataOnly) {
            for column in 0..PARITY_MAX {
                if let Some(place) = &self.places[column] {
                    writes.push((place, piece.window.start, self.parity_window(column)));
                }
            }
        }
        writes
    }

    /// The new parity of column `column` over the window (the buffer may
    /// cover more, see `span`).
    fn parity_window(&self, column: usize) -> &[u8] {
        &self.parity[column][self.in_span()]
    }

    /// Where the window lies in the parity buffers.
    fn in_span(&self) -> Range<usize> {
        let window = &self.piece.window;
        debug_assert!(self.span.start <= window.start && window.end <= self.span.end);
        window.start - self.span.start..window.end - self.span.start
    }
}
