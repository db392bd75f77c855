//! The write journal of a live array: md's raid5-cache in write-through
//! mode, on its own device, in md's format (`format::journal`).
//!
//! Why: a parity row is written to several members, and a crash between
//! those writes leaves the row's parity disagreeing with its data (md's
//! write hole). Without a journal the next start must resync, and a
//! degraded array cannot even do that: a member rebuilt from a torn row is
//! rebuilt wrong. With a journal every row's new data and parity pages are
//! durable on the journal device before any member write starts; after a
//! crash they are written again (replayed), and the rows are whole.
//!
//! How, in md's terms:
//! - A request's rows (4 KiB columns across the members, md's stripe_head)
//!   are handed to [`Journal::log`], which returns once they are durable.
//!   Threads that log at the same time share one write and one flush
//!   (group commit): one of them, the leader, writes everything queued.
//! - Rows go into *units*: a meta block listing the pages, then the pages.
//!   Units follow each other around the ring with sequence numbers one
//!   apart; the superblock's journal_tail names the unit the chain starts
//!   at.
//! - When the ring fills, the tail moves up to the oldest unit whose member
//!   writes have not finished (or the newest unit, if all have), after the
//!   members are flushed so that nothing the tail leaves behind is still
//!   volatile. The unit at the tail is replayed again at the next start,
//!   which is harmless: replay runs in log order to the end of the chain.
//! - A journal device that fails a write fails the journal: from then on
//!   writes are refused (md forces the array read-only), reads go on.

use super::Engine;
use crate::array::Slots;
use crate::format::journal::{self as fmt, MetaBlock, Payload, BLOCK_BYTES, BLOCK_SECTORS};
use crate::geometry::Geometry;
use crate::member::aligned::AlignedBuf;
use crate::member::MemberRef;
use crate::units::SECTOR_BYTES;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One 4 KiB column of a row, as md logs a stripe_head: the new data pages
/// of the data members written (each at its array sector), then the parity
/// pages (P, and Q on raid6), none when no parity member is left.
pub(super) struct PageRow {
    /// The column's member sector (md's sh->sector), from data_offset.
    pub stripe_sector: u64,
    /// Array sector of each data page, in the order of `pages`.
    pub data: Vec<u64>,
    /// Parity pages after the data pages: 0, 1 (raid4/5) or 2 (raid6).
    pub parity: usize,
    /// The pages, 4 KiB each: data, then parity.
    pub pages: Vec<u8>,
}

impl PageRow {
    fn page_count(&self) -> usize {
        self.data.len() + self.parity
    }

    /// Bytes its payloads take in a meta block (md's r5l_log_stripe).
    fn meta_bytes(&self) -> usize {
        let data = self.data.len() * (fmt::PAYLOAD_HEAD_BYTES + 4);
        let parity = if self.parity > 0 {
            fmt::PAYLOAD_HEAD_BYTES + 4 * self.parity
        } else {
            0
        };
        data + parity
    }
}

/// Which units a caller's rows went into, and the ring space it keeps
/// back for its parity (data logged for write-back): handed back to
/// [`Journal::finished`] once the caller's member writes are done.
#[must_use]
pub(super) struct Ticket {
    units: Vec<u64>,
    reserved: u64,
}

/// A ticket kept alive by whatever holds logged data (the stripe cache's
/// batch and the writer): the units are finished when the last holder
/// lets go, that is once the data is on the members.
pub(super) struct JournalHold {
    journal: Arc<Journal>,
    ticket: Mutex<Option<Ticket>>,
}

impl JournalHold {
    pub(super) fn hold(journal: &Arc<Journal>, ticket: Ticket) -> super::datapath::cache::Hold {
        Arc::new(JournalHold {
            journal: journal.clone(),
            ticket: Mutex::new(Some(ticket)),
        })
    }
}

impl Drop for JournalHold {
    fn drop(&mut self) {
        let ticket = self
            .ticket
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(ticket) = ticket {
            self.journal.finished(ticket);
        }
    }
}

/// What a caller logs, which decides what ring space it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LogKind {
    /// Whole rows: data and parity (write-through).
    Rows,
    /// Data alone, acknowledged from the stripe cache before its parity
    /// exists (write-back, md's r5c caching phase). It keeps back the room
    /// its parity will need, so that writing it out can never wait on
    /// ring space that only writing it out would free.
    DataOnly,
    /// Parity alone, for data already logged `DataOnly` (md's write-out
    /// phase): it may use the room kept back.
    ParityOnly,
}

/// A unit on the ring whose rows may not all be on the members yet.
struct Unit {
    seq: u64,
    position: u64,
    /// Callers whose rows are in it and whose member writes are not done.
    open: usize,
}

struct Queued {
    id: u64,
    kind: LogKind,
    /// Ring sectors its units take at most, and (DataOnly) keep back.
    sectors: u64,
    reserve: u64,
    rows: Vec<PageRow>,
    /// Each page's checksum, computed by its caller before it queues, so
    /// that the callers of one commit share that work.
    checksums: Vec<u32>,
}

struct LogState {
    /// Where the next unit's meta block goes, and its sequence number.
    head: u64,
    next_seq: u64,
    /// The unit the chain starts at, as the superblock records it.
    tail: u64,
    /// Units from the tail on, oldest first.
    units: VecDeque<Unit>,
    queue: Vec<Queued>,
    next_id: u64,
    /// A thread is writing the log.
    writing: bool,
    /// Ring sectors kept back for the parity of data logged alone.
    reserved: u64,
    /// What the leader made of each caller's rows.
    results: HashMap<u64, Result<Vec<u64>, String>>,
    /// Set when the journal device failed: nothing is logged any more.
    failed: Option<String>,
    stats: JournalStats,
}

/// What `uraid status --json` shows of the journal.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct JournalStats {
    pub path: String,
    pub ring_sectors: u64,
    pub head: u64,
    pub tail: u64,
    pub units_written: u64,
    pub pages_written: u64,
    /// Writes to the journal device that made several callers' rows
    /// durable at once (group commits), and the callers they carried.
    pub commits: u64,
    pub callers: u64,
    pub reclaims: u64,
    pub replayed_rows: u64,
    /// Pages logged without parity (write-back) that the last start found
    /// and wrote through the engine.
    #[serde(default)]
    pub replayed_data_pages: u64,
    pub failed: Option<String>,
}

pub(super) struct Journal {
    member: MemberRef,
    path: String,
    data_offset_bytes: u64,
    ring_sectors: u64,
    /// Checksum seed from the array UUID.
    seed: u32,
    /// The most pages one caller may log at once (see `max_caller_pages`).
    caller_pages: usize,
    /// Parity pages of a column: 1 (raid4/5) or 2 (raid6).
    parity_pages: usize,
    state: Mutex<LogState>,
    changed: Condvar,
}

/// What a start found in the journal and did with it.
#[derive(Debug, Default)]
pub(super) struct Recovered {
    pub units: u64,
    pub rows_replayed: u64,
    /// Data written in write-back mode with no parity logged (md's
    /// data-only stripes, which a kernel may leave): to be written through
    /// the engine, which computes parity, once it runs.
    pub data_only: Vec<(u64, Vec<u8>)>,
}

fn lock(m: &Mutex<LogState>) -> MutexGuard<'_, LogState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the journal {path} has a ring of {ring_kib} KiB; with {chunk_kib} KiB chunks on {disks} members it needs at least {needed_kib} KiB")]
    TooSmall {
        path: String,
        ring_kib: u64,
        chunk_kib: u64,
        disks: usize,
        needed_kib: u64,
    },
}

impl Journal {
    /// The journal on `member`, whose superblock says where its data area
    /// starts, how long it is and where the chain starts (journal_tail).
    /// Nothing is read yet.
    pub(super) fn new(
        member: MemberRef,
        path: &str,
        data_offset_sectors: u64,
        data_size_sectors: u64,
        tail: u64,
        set_uuid: &[u8; 16],
        geometry: &Geometry,
    ) -> Result<Journal, JournalError> {
        let ring_sectors = data_size_sectors / BLOCK_SECTORS * BLOCK_SECTORS;
        // The largest caller is one piece of a row: a chunk's columns with
        // a page per member (see fmt::min_ring_sectors).
        let strip_sectors = geometry.stripe(0).strip_sectors;
        let caller_pages =
            (strip_sectors.max(BLOCK_SECTORS) / BLOCK_SECTORS) as usize * geometry.raid_disks();
        let needed = fmt::min_ring_sectors(strip_sectors, geometry.raid_disks());
        if ring_sectors < needed {
            return Err(JournalError::TooSmall {
                path: path.to_string(),
                ring_kib: ring_sectors / 2,
                chunk_kib: strip_sectors / 2,
                disks: geometry.raid_disks(),
                needed_kib: needed / 2,
            });
        }
        // md re-creates a log whose tail is out of range.
        let tail = if tail < ring_sectors && tail.is_multiple_of(BLOCK_SECTORS) {
            tail
        } else {
            0
        };
        Ok(Journal {
            member,
            path: path.to_string(),
            data_offset_bytes: data_offset_sectors * SECTOR_BYTES,
            ring_sectors,
            seed: fmt::uuid_seed(set_uuid),
            caller_pages,
            parity_pages: if geometry.stripe(0).q.is_some() { 2 } else { 1 },
            state: Mutex::new(LogState {
                head: tail,
                next_seq: 0,
                tail,
                units: VecDeque::new(),
                queue: Vec::new(),
                next_id: 0,
                writing: false,
                reserved: 0,
                results: HashMap::new(),
                failed: None,
                stats: JournalStats {
                    path: path.to_string(),
                    ring_sectors,
                    ..JournalStats::default()
                },
            }),
            changed: Condvar::new(),
        })
    }

    pub(super) fn path(&self) -> &str {
        &self.path
    }

    /// The most pages one call of [`Journal::log`] may carry.
    pub(super) fn max_caller_pages(&self) -> usize {
        self.caller_pages
    }

    /// Where the chain starts: the superblock's journal_tail.
    pub(super) fn tail(&self) -> u64 {
        lock(&self.state).tail
    }

    pub(super) fn stats(&self) -> JournalStats {
        let state = lock(&self.state);
        let mut stats = state.stats.clone();
        stats.head = state.head;
        stats.tail = state.tail;
        stats.failed = state.failed.clone();
        stats
    }

    pub(super) fn failed(&self) -> Option<String> {
        lock(&self.state).failed.clone()
    }

    fn read_block(&self, position: u64, buf: &mut [u8]) -> io::Result<()> {
        self.member
            .read_at(buf, self.data_offset_bytes + position * SECTOR_BYTES)
    }

    /// Writes `bytes` (whole blocks) at ring `position`, wrapping at the end.
    fn write_ring(&self, position: u64, bytes: &[u8]) -> io::Result<()> {
        let room = ((self.ring_sectors - position) * SECTOR_BYTES) as usize;
        let at = self.data_offset_bytes + position * SECTOR_BYTES;
        if bytes.len() <= room {
            return self.member.write_at(bytes, at);
        }
        self.member.write_at(&bytes[..room], at)?;
        self.member.write_at(&bytes[room..], self.data_offset_bytes)
    }

    /// Reads the chain from the tail and writes every logged row whose data
    /// and parity are both in the log to the members in `slots` (md's
    /// r5l_recovery_log), then starts a new chain where the old one ends,
    /// with sequence numbers 10000 past it as md does, so that no stale unit
    /// further on can ever be taken for part of it. The caller records the
    /// new tail in the superblock.
    pub(super) fn recover(&self, geometry: &Geometry, slots: &Slots) -> io::Result<Recovered> {
        let mut recovered = Recovered::default();
        let mut state = lock(&self.state);
        let mut block = AlignedBuf::zeroed(BLOCK_BYTES);
        let mut pos = state.tail;
        self.read_block(pos, &mut block)?;
        let first = match fmt::decode(&block, pos, self.seed) {
            Ok(meta) => meta,
            Err(_) => {
                // md: a tail that is not a meta block means a new log, from 0.
                let seq = u64::from(rand::random::<u32>());
                drop(state);
                self.restart(0, seq)?;
                return Ok(recovered);
            }
        };
        let mut seq = first.seq;
        let mut units = 0;
        // Rows gathered per column, in log order: (data pages by array
        // sector, parity pages).
        let mut rows: BTreeMap<u64, Gathered> = BTreeMap::new();
        // A column's version is written as soon as a later one begins, so
        // memory holds at most the newest version of each column.
        let mut replay = |stripe_sector: u64, g: &Gathered| -> io::Result<()> {
            if g.data.is_empty() {
                // md: parity alone was flushed before the crash.
                return Ok(());
            }
            recovered.rows_replayed += 1;
            replay_row(geometry, slots, stripe_sector, g)
        };
        let mut meta = Some(first);
        loop {
            let m = match meta.take() {
                Some(m) => m,
                None => {
                    self.read_block(pos, &mut block)?;
                    match fmt::decode(&block, pos, self.seed) {
                        Ok(m) if m.seq == seq => m,
                        _ => break,
                    }
                }
            };
            let pages = m.pages();
            if pages as u64 * BLOCK_SECTORS + BLOCK_SECTORS > self.ring_sectors {
                break;
            }
            let mut data = AlignedBuf::zeroed(pages * BLOCK_BYTES);
            let mut at = fmt::ring_add(pos, BLOCK_SECTORS, self.ring_sectors);
            for page in data.chunks_mut(BLOCK_BYTES) {
                self.read_block(at, page)?;
                at = fmt::ring_add(at, BLOCK_SECTORS, self.ring_sectors);
            }
            if !self.unit_checksums_match(&m, &data) {
                // A torn unit ends the chain: nothing in it was acknowledged.
                break;
            }
            self.gather(geometry, &m, &data, &mut rows, &mut replay)?;
            units += 1;
            pos = at;
            seq += 1;
        }
        // The newest version of every column, after the older ones above.
        let mut data_only = Vec::new();
        for (stripe_sector, g) in std::mem::take(&mut rows) {
            if g.parity.is_empty() {
                // Data only: write-back leftovers, for the engine to write.
                data_only.extend(g.data);
            } else {
                replay(stripe_sector, &g)?;
            }
        }
        recovered.units = units;
        state.stats.replayed_data_pages = data_only.len() as u64;
        recovered.data_only = data_only;
        for slot in slots.iter().flatten() {
            slot.member.flush()?;
        }
        state.stats.replayed_rows = recovered.rows_replayed;
        drop(state);
        self.restart(pos, seq + 10_000)?;
        Ok(recovered)
    }

    fn unit_checksums_match(&self, meta: &MetaBlock, data: &[u8]) -> bool {
        let mut pages = data.chunks(BLOCK_BYTES);
        for payload in &meta.payloads {
            if let Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } = payload {
                for &sum in checksums {
                    match pages.next() {
                        Some(page) if fmt::checksum(self.seed, page) == sum => {}
                        _ => return false,
                    }
                }
            }
        }
        true
    }

    /// Files a unit's payloads under their columns, as md's
    /// r5c_recovery_analyze_meta_block: data arriving for a column that
    /// already has parity starts a new version, and the old one is queued
    /// for replay first; a flush drops what a column had.
    fn gather(
        &self,
        geometry: &Geometry,
        meta: &MetaBlock,
        data: &[u8],
        rows: &mut BTreeMap<u64, Gathered>,
        replay: &mut dyn FnMut(u64, &Gathered) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut pages = data.chunks(BLOCK_BYTES);
        for payload in &meta.payloads {
            match payload {
                Payload::Data {
                    location,
                    checksums,
                    ..
                } => {
                    for (i, _) in checksums.iter().enumerate() {
                        let page = pages.next().expect("counted").to_vec();
                        let array_sector = location + i as u64 * BLOCK_SECTORS;
                        let Some(stripe_sector) = column_of(geometry, array_sector) else {
                            continue;
                        };
                        let row = rows.entry(stripe_sector).or_default();
                        if !row.parity.is_empty() {
                            let done = std::mem::take(row);
                            replay(stripe_sector, &done)?;
                        }
                        rows.entry(stripe_sector)
                            .or_default()
                            .data
                            .push((array_sector, page));
                    }
                }
                Payload::Parity {
                    location,
                    checksums,
                } => {
                    let parity: Vec<Vec<u8>> = checksums
                        .iter()
                        .map(|_| pages.next().expect("counted").to_vec())
                        .collect();
                    rows.entry(*location).or_default().parity = parity;
                }
                Payload::Flush { stripes } => {
                    for s in stripes {
                        rows.remove(s);
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts a new chain at `position`: an empty meta block with `seq`,
    /// made durable, which becomes the tail.
    fn restart(&self, position: u64, seq: u64) -> io::Result<()> {
        let block = fmt::encode(
            &MetaBlock {
                seq,
                position,
                payloads: Vec::new(),
            },
            self.seed,
        )
        .expect("an empty block fits");
        let buf = AlignedBuf::copy_from(&block);
        self.write_ring(position, &buf)?;
        self.member.flush()?;
        let mut state = lock(&self.state);
        state.tail = position;
        state.head = fmt::ring_add(position, BLOCK_SECTORS, self.ring_sectors);
        state.next_seq = seq + 1;
        state.units.clear();
        state.units.push_back(Unit {
            seq,
            position,
            open: 0,
        });
        Ok(())
    }

    /// Logs `rows` and returns once they are durable on the journal device:
    /// only then may their member writes start. The ticket goes back to
    /// [`Journal::finished`] when those writes are done (or failed).
    pub(super) fn log(
        &self,
        engine: &Engine,
        rows: Vec<PageRow>,
        kind: LogKind,
    ) -> io::Result<Ticket> {
        let pages: usize = rows.iter().map(PageRow::page_count).sum();
        assert!(
            pages <= self.caller_pages,
            "a caller logs {pages} pages, more than the {} a journal allows",
            self.caller_pages
        );
        let per_meta = BLOCK_BYTES - fmt::HEADER_BYTES;
        let meta: usize = rows.iter().map(PageRow::meta_bytes).sum();
        // At most: its pages, the meta blocks its payloads fill, and one
        // more where its first row does not fit the unit before it.
        let sectors = (pages + meta.div_ceil(per_meta) + 1) as u64 * BLOCK_SECTORS;
        let reserve = match kind {
            LogKind::DataOnly => {
                let parity = self.parity_pages * rows.len();
                let meta = rows.len() * (fmt::PAYLOAD_HEAD_BYTES + 4 * self.parity_pages);
                (parity + meta.div_ceil(per_meta) + 1) as u64 * BLOCK_SECTORS
            }
            _ => 0,
        };
        let checksums = rows
            .iter()
            .flat_map(|r| r.pages.chunks(BLOCK_BYTES))
            .map(|page| fmt::checksum(self.seed, page))
            .collect();
        let mut state = lock(&self.state);
        if let Some(why) = &state.failed {
            return Err(journal_failed(why));
        }
        let id = state.next_id;
        state.next_id += 1;
        state.queue.push(Queued {
            id,
            kind,
            sectors,
            reserve,
            rows,
            checksums,
        });
        loop {
            if let Some(result) = state.results.remove(&id) {
                return match result {
                    Ok(units) => Ok(Ticket {
                        units,
                        reserved: reserve,
                    }),
                    Err(why) if why == NO_ROOM => Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "no room in the journal for data held in the cache",
                    )),
                    Err(why) => {
                        state.reserved -= reserve;
                        Err(journal_failed(&why))
                    }
                };
            }
            if state.writing {
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.writing = true;
            let batch = self.take_fitting(&mut state);
            if !batch.is_empty() {
                state = self.commit(engine, state, batch);
                state.writing = false;
                self.changed.notify_all();
                continue;
            }
            if state.results.contains_key(&id) {
                // Answered without a commit (no room for data to cache).
                state.writing = false;
                self.changed.notify_all();
                continue;
            }
            // Nothing queued fits: move the tail if member writes have
            // finished since it last moved, else wait for some to finish
            // (the commit slot is free meanwhile, for parity that may use
            // the room kept back).
            let (s, freed) = self.reclaim(engine, state);
            state = s;
            state.writing = false;
            self.changed.notify_all();
            match freed {
                Ok(true) => {}
                Ok(false) => {
                    state = self
                        .changed
                        .wait_timeout(state, std::time::Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                Err(e) => {
                    let why = format!("{}: moving the journal's tail: {e}", self.path);
                    for q in std::mem::take(&mut state.queue) {
                        // Answered as failed, each gives back what it keeps
                        // back: counted here, as a commit would have.
                        state.reserved += q.reserve;
                        state.results.insert(q.id, Err(why.clone()));
                    }
                }
            }
        }
    }

    /// Takes from the queue the callers whose units fit on the ring now:
    /// parity for logged data first (it may use the room kept back), then
    /// the others in order while they fit beside what is kept back.
    fn take_fitting(&self, state: &mut LogState) -> Vec<Queued> {
        let used = fmt::ring_distance(state.tail, state.head, self.ring_sectors);
        let mut taken = Vec::new();
        let mut total = 0;
        let mut rest = Vec::new();
        let (parity, others): (Vec<Queued>, Vec<Queued>) = std::mem::take(&mut state.queue)
            .into_iter()
            .partition(|q| q.kind == LogKind::ParityOnly);
        for q in parity.into_iter().chain(others) {
            let fits = match q.kind {
                LogKind::ParityOnly => used + total + q.sectors < self.ring_sectors,
                LogKind::Rows => used + total + q.sectors + state.reserved < self.ring_sectors,
                // Data waiting in the cache may hold at most half the ring
                // (with its parity's room), so that writes going through
                // never starve behind it.
                LogKind::DataOnly => {
                    used + total + q.sectors + state.reserved + q.reserve < self.ring_sectors / 2
                }
            };
            if fits && rest.is_empty() {
                total += q.sectors;
                state.reserved += q.reserve;
                taken.push(q);
            } else if q.kind == LogKind::DataOnly {
                // Not worth waiting for: the writer writes through instead.
                state.results.insert(q.id, Err(NO_ROOM.to_string()));
            } else {
                rest.push(q);
            }
        }
        state.queue = rest;
        taken
    }

    /// The leader's work: writes every queued caller's rows as units, one
    /// write and one flush, and files each caller's result.
    fn commit<'s>(
        &'s self,
        engine: &Engine,
        state: MutexGuard<'s, LogState>,
        batch: Vec<Queued>,
    ) -> MutexGuard<'s, LogState> {
        let callers = batch.len() as u64;
        // Only the committing thread moves the head and the sequence
        // numbers, so the units are laid out without the lock: callers
        // queue and finish meanwhile.
        let mut seq = state.next_seq;
        drop(state);
        // Lay the rows out in units: a caller's rows may share units with
        // others' and spill into the next.
        let mut units: Vec<(MetaBlock, Vec<&[u8]>)> = Vec::new();
        let mut owners: Vec<Vec<u64>> = Vec::new();
        let mut sectors = 0u64;
        for q in &batch {
            let mut mine = Vec::new();
            let mut sums = q.checksums.iter().copied();
            for row in &q.rows {
                let need = row.meta_bytes();
                if units.last().is_none_or(|(m, _)| !m.fits(need)) {
                    units.push((
                        MetaBlock {
                            seq,
                            position: 0,
                            payloads: Vec::new(),
                        },
                        Vec::new(),
                    ));
                    seq += 1;
                }
                let (meta, pages) = units.last_mut().expect("pushed above");
                for (i, &location) in row.data.iter().enumerate() {
                    let page = &row.pages[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES];
                    meta.payloads.push(Payload::Data {
                        location,
                        flags: 0,
                        checksums: vec![sums.next().expect("a checksum per page")],
                    });
                    pages.push(page);
                }
                if row.parity > 0 {
                    let start = row.data.len() * BLOCK_BYTES;
                    let parity: Vec<&[u8]> = row.pages[start..].chunks(BLOCK_BYTES).collect();
                    meta.payloads.push(Payload::Parity {
                        location: row.stripe_sector,
                        checksums: sums.by_ref().take(parity.len()).collect(),
                    });
                    pages.extend(parity);
                }
                if mine.last() != Some(&meta.seq) {
                    mine.push(meta.seq);
                }
            }
            owners.push(mine);
        }
        for (_, pages) in &units {
            sectors += (1 + pages.len() as u64) * BLOCK_SECTORS;
        }
        let mut state = lock(&self.state);
        // Room on the ring, keeping a block between the head and the tail.
        let used = fmt::ring_distance(state.tail, state.head, self.ring_sectors);
        assert!(
            used + sectors < self.ring_sectors,
            "a commit of {sectors} sectors was taken with {used} of {} in use",
            self.ring_sectors
        );
        let result: io::Result<u64> = {
            {
                let mut position = state.head;
                let mut bytes = AlignedBuf::zeroed(sectors as usize * SECTOR_BYTES as usize);
                let mut at = 0;
                for (meta, pages) in &mut units {
                    meta.position = position;
                    let block = fmt::encode(meta, self.seed).expect("filled to fit");
                    bytes[at..at + BLOCK_BYTES].copy_from_slice(&block);
                    at += BLOCK_BYTES;
                    for page in pages.iter() {
                        bytes[at..at + BLOCK_BYTES].copy_from_slice(page);
                        at += BLOCK_BYTES;
                    }
                    position = fmt::ring_add(
                        position,
                        (1 + pages.len() as u64) * BLOCK_SECTORS,
                        self.ring_sectors,
                    );
                }
                let head = state.head;
                // The write and flush run without the lock: callers queue up
                // behind this commit meanwhile, and finish their member
                // writes.
                drop(state);
                let written = self
                    .write_ring(head, &bytes)
                    .and_then(|()| self.member.flush());
                state = lock(&self.state);
                written.map(|()| position)
            }
        };
        match result {
            Ok(head) => {
                for (meta, pages) in &units {
                    let open = owners.iter().filter(|o| o.contains(&meta.seq)).count();
                    state.units.push_back(Unit {
                        seq: meta.seq,
                        position: meta.position,
                        open,
                    });
                    state.stats.pages_written += pages.len() as u64;
                }
                state.head = head;
                state.next_seq = seq;
                state.stats.units_written += units.len() as u64;
                state.stats.commits += 1;
                state.stats.callers += callers;
                for (q, mine) in batch.iter().zip(owners) {
                    state.results.insert(q.id, Ok(mine));
                }
            }
            Err(e) => {
                let why = format!("{}: journal write failed: {e}", self.path);
                for q in &batch {
                    state.results.insert(q.id, Err(why.clone()));
                }
                if state.failed.is_none() {
                    state.failed = Some(why.clone());
                    drop(state);
                    engine.journal_failed(&why);
                    state = lock(&self.state);
                }
            }
        }
        state
    }

    /// Frees ring space: moves the tail up to the oldest unit whose member
    /// writes are not done (the newest unit when all are), once the members
    /// are flushed, and has the engine record it. Says whether it moved.
    fn reclaim<'s>(
        &'s self,
        engine: &Engine,
        state: MutexGuard<'s, LogState>,
    ) -> (MutexGuard<'s, LogState>, io::Result<bool>) {
        let target = state
            .units
            .iter()
            .find(|u| u.open > 0)
            .or(state.units.back())
            .map(|u| (u.seq, u.position));
        let Some((seq, position)) = target else {
            return (state, Ok(false));
        };
        if position == state.tail {
            // The oldest unit is still being written to the members.
            return (state, Ok(false));
        }
        drop(state);
        let moved = engine
            .flush_members()
            .and_then(|()| engine.record_journal_tail(position));
        let mut state = lock(&self.state);
        if let Err(e) = moved {
            return (state, Err(e));
        }
        state.tail = position;
        while state.units.front().is_some_and(|u| u.seq < seq) {
            state.units.pop_front();
        }
        state.stats.reclaims += 1;
        (state, Ok(true))
    }

    /// The member writes of a ticket's rows are done.
    pub(super) fn finished(&self, ticket: Ticket) {
        let mut state = lock(&self.state);
        // Units hold consecutive sequence numbers from the front on.
        state.reserved -= ticket.reserved;
        let first = state.units.front().map_or(0, |u| u.seq);
        for seq in ticket.units {
            let unit = seq
                .checked_sub(first)
                .and_then(|i| state.units.get_mut(i as usize))
                .expect("a ticket's units stay until they are finished");
            assert_eq!(unit.seq, seq, "units are consecutive");
            assert!(unit.open > 0, "unit {seq} finished more often than logged");
            unit.open -= 1;
        }
        self.changed.notify_all();
    }

    /// At an orderly stop, once every write is done: ends the chain with an
    /// empty unit at the head and makes it the tail, so that the next start
    /// replays nothing (and an offline writer in between cannot be undone
    /// by a stale replay). The caller records the tail and flushes the
    /// members first.
    pub(super) fn close(&self) -> io::Result<u64> {
        let (head, seq) = {
            let state = lock(&self.state);
            if let Some(why) = &state.failed {
                return Err(journal_failed(why));
            }
            assert!(
                state.units.iter().all(|u| u.open == 0),
                "the journal is closed with member writes in flight"
            );
            (state.head, state.next_seq)
        };
        self.restart(head, seq)?;
        Ok(head)
    }
}

/// The answer to a `DataOnly` caller that does not fit now.
const NO_ROOM: &str = "no room for data held in the cache";

fn journal_failed(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ReadOnlyFilesystem,
        format!("the write journal failed, writes are refused: {why}"),
    )
}

/// One column's pages gathered from the log.
#[derive(Default)]
struct Gathered {
    data: Vec<(u64, Vec<u8>)>,
    parity: Vec<Vec<u8>>,
}

/// The column (member sector, md's sh->sector) of an array sector, or None
/// if it is beyond the array.
fn column_of(geometry: &Geometry, array_sector: u64) -> Option<u64> {
    if array_sector >= geometry.array_sectors() {
        return None;
    }
    let located = geometry.locate(array_sector)?;
    Some(located.place.member_sector + located.in_strip_sectors / BLOCK_SECTORS * BLOCK_SECTORS)
}

/// Writes a replayed column: each data page to its member, the parity to
/// P (and Q), on the members that are present.
fn replay_row(
    geometry: &Geometry,
    slots: &Slots,
    stripe_sector: u64,
    row: &Gathered,
) -> io::Result<()> {
    let write = |role: usize, member_sector: u64, page: &[u8]| -> io::Result<()> {
        let Some(slot) = &slots[role] else {
            return Ok(());
        };
        let buf = AlignedBuf::copy_from(page);
        slot.member
            .write_at(&buf, slot.data_offset_bytes + member_sector * SECTOR_BYTES)
    };
    for (array_sector, page) in &row.data {
        let Some(located) = geometry.locate(*array_sector) else {
            continue;
        };
        let member_sector = located.place.member_sector + located.in_strip_sectors;
        write(located.place.member, member_sector, page)?;
    }
    // A raid4/5/6 stripe is one row of strips, at the same member sector
    // on every member.
    let strip_sectors = geometry.stripe(0).strip_sectors;
    let map = geometry.stripe(stripe_sector / strip_sectors);
    for (place, page) in [map.p, map.q].iter().zip(&row.parity) {
        if let Some(place) = place {
            write(place.member, stripe_sector, page)?;
        }
    }
    Ok(())
}
