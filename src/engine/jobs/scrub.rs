//! Resync, check and repair in batches, as the rebuild runs (rebuild.rs):
//! a run of consecutive rows whose share of any one member stays within
//! the batch budget is locked, read with one large read per member
//! wherever its strips lie contiguous, and then passed row by row over
//! what was read (`array::resync_ahead`), which writes only what it finds
//! wrong. One stripe at a time, a job's member I/O is one strip per
//! request, and a member that could stream its whole width waits on each;
//! in batches a job can take the idle capacity the pacer or md's limits
//! give it.
//!
//! A batch holds its rows' locks from before the reads until its last row
//! is passed and the position has moved past it, so no write lands
//! between a row's read and its pass. Locks are taken in slot order, one
//! batch at a time (the rule every thread taking several keeps).
//!
//! Anything out of the ordinary ends the batch where it stands: a read
//! error in the batch's reads, or a row whose pass fails (a member's read
//! error, which the one-stripe path corrects from redundancy). The
//! position stays at the first row not passed and that row takes the
//! one-stripe path (resync.rs), which handles it as it always has.

use super::job::{SyncAction, Throttle};
use super::rebuild::{Ended, Shares, BATCH_STRIPES_MAX};
use crate::array::{places_read, resync_ahead, Finding, Pass, ReadAhead, Slots};
use crate::engine::datapath::io::run_reads;
use crate::engine::position::Position;
use crate::engine::Engine;
use crate::geometry::Place;
use crate::member::{AlignedBuf, MemberRef};
use crate::units::SECTOR_BYTES;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Whether `action` runs in these batches.
pub(in crate::engine) fn batched(action: SyncAction) -> bool {
    matches!(
        action,
        SyncAction::Resync | SyncAction::Check | SyncAction::Repair
    )
}

/// A batch's row: the members the pass reads it from, and its strip.
struct Row {
    stripe: u64,
    slots: Slots,
    strip_bytes: usize,
}

/// Runs batches of `action` from the position `next` until the job is
/// stopped or done, or a row needs the one-stripe path. `guided`: only
/// the rows the bitmap marks (a resync after a crash).
pub(in crate::engine) fn run_batches(
    engine: &Arc<Engine>,
    action: SyncAction,
    next: &Arc<Position>,
    guided: bool,
    throttle: &mut Throttle,
    report: &mut dyn FnMut(&Finding),
) -> Ended {
    let pass = match action {
        SyncAction::Check => Pass::Check,
        SyncAction::Repair => Pass::Repair,
        SyncAction::Resync => Pass::Resync,
        _ => unreachable!("only a scrub runs in these batches"),
    };
    loop {
        if engine.sync.stop.load(Ordering::SeqCst) || Arc::strong_count(engine) <= 1 {
            return Ended::Yielded;
        }
        let start = next.load(Ordering::SeqCst);
        let (rows, end) = plan(engine, start, guided);
        if start >= end {
            return Ended::Yielded;
        }
        let kib = match run_batch(engine, pass, next, rows, end, report) {
            Ok(kib) => kib,
            Err(at) => return Ended::OneByOne { until: at + 1 },
        };
        throttle.account(engine, kib, &engine.sync.stop);
    }
}

/// The rows of the batch that starts at `start`, and the position after
/// it: consecutive rows whose reads of any one member stay within the
/// budget; rows the bitmap calls clean (guided) are passed without I/O.
fn plan(engine: &Engine, start: u64, guided: bool) -> (Vec<Row>, u64) {
    let count = engine.sync.stripe_count();
    let geometry = engine.geometry();
    let mut shares = Shares::new(engine, geometry.raid_disks());
    let mut rows = Vec::new();
    let mut end = start;
    while end < count && end - start < BATCH_STRIPES_MAX {
        if guided && !engine.stripe_needs_resync(end) {
            end += 1;
            continue;
        }
        let slots = engine.in_sync_slots(end);
        let strip_bytes = (geometry.stripe(end).strip_sectors * SECTOR_BYTES) as usize;
        let members = places_read(&geometry, &slots, end)
            .into_iter()
            .map(|p| p.member);
        if !shares.take(members, strip_bytes as u64, rows.is_empty()) {
            break;
        }
        rows.push(Row {
            stripe: end,
            slots,
            strip_bytes,
        });
        end += 1;
    }
    (rows, end)
}

/// Locks, reads and passes one batch; moves the position to `end`.
/// Returns the KiB per member it moved, or the row that must take the
/// one-stripe path (the position left there).
fn run_batch(
    engine: &Arc<Engine>,
    pass: Pass,
    next: &Position,
    mut rows: Vec<Row>,
    end: u64,
    report: &mut dyn FnMut(&Finding),
) -> Result<u64, u64> {
    let locks = &engine.datapath.locks;
    let mut slots: Vec<usize> = rows.iter().map(|r| locks.slot(r.stripe)).collect();
    slots.sort_unstable();
    slots.dedup();
    let _guards: Vec<_> = slots.into_iter().map(|s| locks.lock_slot(s)).collect();
    let geometry = engine.geometry();
    for row in rows.iter_mut() {
        // The members as they are now that no write can change the row
        // (one may have failed since the plan).
        row.slots = engine.in_sync_slots(row.stripe);
        // The pass may rewrite this row's parity: none stays hot.
        engine
            .datapath
            .parity_cache
            .drop_stripe(row.stripe, row.strip_bytes);
    }
    let Some(ahead) = read_ahead(engine, &rows) else {
        // A read failed: the first row goes alone and names the member.
        let first = rows.first().map_or(end, |r| r.stripe);
        next.store(first, Ordering::SeqCst);
        return Err(first);
    };
    let reads = &engine.datapath.reads;
    let mut kib = 0;
    for row in &rows {
        if pass == Pass::Repair {
            // A repair may rewrite data: what is being read now is not kept.
            reads.write_begins();
        }
        let mut findings = Vec::new();
        let result = resync_ahead(
            &geometry,
            &row.slots,
            row.stripe..row.stripe + 1,
            pass,
            &ahead,
            |_| {},
            |f| findings.push(*f),
        );
        if pass == Pass::Repair {
            let map = geometry.stripe(row.stripe);
            let at = map.array_sector * SECTOR_BYTES;
            reads.write_done(at..at + map.data_sectors() * SECTOR_BYTES);
        }
        findings.iter().for_each(&mut *report);
        match result {
            Ok(found) => {
                engine.sync.add_mismatches(found.mismatch_sectors);
                kib += row.strip_bytes as u64 / 1024;
            }
            Err(_) => {
                // Passed up to here; this row goes alone.
                next.store(row.stripe, Ordering::SeqCst);
                let from = rows.first().map_or(row.stripe, |r| r.stripe);
                engine.sync_progressed(pass_action(pass), from, row.stripe);
                return Err(row.stripe);
            }
        }
    }
    let from = next.load(Ordering::SeqCst);
    // Moved under the locks: a write waiting for one of these rows then
    // finds it passed.
    next.store(end, Ordering::SeqCst);
    engine.sync_progressed(pass_action(pass), from, end);
    Ok(kib)
}

fn pass_action(pass: Pass) -> SyncAction {
    match pass {
        Pass::Check => SyncAction::Check,
        Pass::Repair => SyncAction::Repair,
        Pass::Resync => SyncAction::Resync,
    }
}

/// Reads every strip the batch's rows will read, one request per run of
/// strips contiguous on a member; None when a read fails.
fn read_ahead(engine: &Engine, rows: &[Row]) -> Option<ReadAhead> {
    let geometry = engine.geometry();
    // Per member: (first sector, sectors, the places in the run).
    let mut runs: Vec<(usize, MemberRef, u64, u64, Vec<Place>)> = Vec::new();
    let mut last: Vec<Option<usize>> = vec![None; geometry.raid_disks()];
    for row in rows {
        let sectors = row.strip_bytes as u64 / SECTOR_BYTES;
        for place in places_read(&geometry, &row.slots, row.stripe) {
            let slot = row.slots[place.member].as_ref()?;
            let at = slot.data_offset_bytes / SECTOR_BYTES + place.member_sector;
            if let Some(k) = last[place.member] {
                let run = &mut runs[k];
                if Arc::ptr_eq(&run.1, &slot.member) && run.2 + run.3 == at {
                    run.3 += sectors;
                    run.4.push(place);
                    continue;
                }
            }
            runs.push((place.member, slot.member.clone(), at, sectors, vec![place]));
            last[place.member] = Some(runs.len() - 1);
        }
    }
    let mut bufs: Vec<AlignedBuf> = runs
        .iter()
        .map(|r| AlignedBuf::zeroed((r.3 * SECTOR_BYTES) as usize))
        .collect();
    {
        let mut requests: Vec<(MemberRef, u64, &mut [u8])> = runs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(r, b)| (r.1.clone(), r.2 * SECTOR_BYTES, &mut b[..]))
            .collect();
        let errors = run_reads(engine.max_member_io(), &mut requests);
        if errors.iter().any(Option::is_some) {
            return None;
        }
    }
    let mut ahead = ReadAhead::default();
    for (run, buf) in runs.into_iter().zip(bufs) {
        let base = run.4[0].member_sector;
        let at: Vec<(Place, usize)> = run
            .4
            .iter()
            .map(|p| (*p, ((p.member_sector - base) * SECTOR_BYTES) as usize))
            .collect();
        ahead.add(buf, &at);
    }
    Some(ahead)
}
