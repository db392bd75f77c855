//! The batched rebuild: recovery and replace move runs of consecutive
//! stripes at a time, in two stages that overlap, so that the member being
//! built is written at the speed it can take rather than one strip at a time
//! between synchronous reads.
//!
//! The job's thread plans a batch (consecutive stripes whose share of any
//! one member stays within a byte budget), takes the batch's stripe locks,
//! reads what the batch needs with one large read per member wherever its
//! strips lie contiguous on the member, and computes the rebuilt strips. A
//! writer thread writes them to the target, merged the same way, and only
//! then moves the shared position past the batch. While it writes, the job's
//! thread reads the next batch.
//!
//! Foreground writes: a writer treats the target as in sync only below the
//! shared position, and a stripe's lock is held from before its strips are
//! read until its rebuilt strip is written and the position has moved past
//! it. A foreground write to a stripe of a batch in flight therefore waits,
//! then sees the target in sync there and writes it too: no write lands
//! between the rebuild's read of a stripe and its write.
//!
//! The locks of a batch are taken in slot order. While the job's thread
//! still holds an earlier batch's locks (its writes are under way) it only
//! tries the next batch's; when one is busy it first waits for the earlier
//! batches to be written and lets their locks go, and only then waits for
//! the busy one, holding nothing but slots below it. That is the rule every
//! thread taking several stripe locks keeps, so no cycle can form.
//!
//! Most endangered rows first: where a failure leaves some rows with less
//! redundancy than others (a dRAID's groups that hold two of its failed
//! children, a raid10 chunk whose copies lie on two failed members), the
//! rows the target's loss leaves at zero redundancy go first, in a walk of
//! their own (`Walk::Endangered`) that marks them done ahead of the
//! position (position.rs) rather than moving it; the walk in order then
//! passes them. Only the position is checkpointed, so after a restart the
//! walk is made again from it. md's levels whose every row holds every
//! member have nothing to order and take the walk in order alone.
//!
//! Anything out of the ordinary (a read or write error, a stripe with a
//! third parity column, a target gone from the table) ends the batches: the
//! stripes of the batches concerned go through the one-stripe path
//! (`View::rebuild_onto`), which corrects read errors or fails members as
//! it always has, and batches resume after them.

use super::job::{SyncAction, Throttle};
use crate::engine::datapath::io::{run_reads, View};
use crate::engine::members::{rebuild_strip, MemberEntry};
use crate::engine::position::Position;
use crate::engine::Engine;
use crate::geometry::{Geometry, Place, StripeMap};
use crate::member::{batch, AlignedBuf, IoOp, MemberRef};
use crate::units::SECTOR_BYTES;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, MutexGuard};

/// The most bytes one batch reads from, or writes to, any one member: a
/// member's share of a batch is then a handful of large requests (md's
/// max_sectors_kb is 1280 KiB), and the buffers of the batches in flight
/// stay within a few times this per member.
const BATCH_BYTES_PER_MEMBER: u64 = 4 << 20;

/// Batches handed to the writer and not yet written: one being written
/// while the next waits for it, so that the writer never waits for a read.
const BATCHES_IN_FLIGHT: usize = 2;

/// The most stripes one batch spans, clean ones that a bitmap-guided
/// recovery skips included, so that a long clean region still moves the
/// position (and the progress shown) along in steps.
pub(in crate::engine) const BATCH_STRIPES_MAX: u64 = 4096;

/// How a run of batches ended.
pub(in crate::engine) enum Ended {
    /// Stopped, at the end, or after a while: the job looks at its state
    /// again and carries on.
    Yielded,
    /// The stripes from the shared position up to `until` must take the
    /// one-stripe path.
    OneByOne { until: u64 },
    /// Another role went missing while a recovery walked in order: rows
    /// it leaves at zero redundancy may go first now.
    Reorder,
}

/// Whether `action` can run in batches.
pub(in crate::engine) fn batched(action: SyncAction) -> bool {
    matches!(
        action,
        SyncAction::Recovery { .. } | SyncAction::Replace { .. }
    )
}

/// Which rows a run of batches takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walk {
    /// Every row from the position on, moving it.
    InOrder,
    /// Only the rows the target's loss leaves at zero redundancy, marked
    /// done ahead of the position.
    Endangered,
}

/// Runs batches of `action` from the shared position `next` until the job
/// is stopped or done, a while has passed, or a stripe needs the
/// one-stripe path.
pub(in crate::engine) fn run_batches(
    engine: &Arc<Engine>,
    action: SyncAction,
    next: &Arc<Position>,
    guided: bool,
    throttle: &mut Throttle,
) -> Ended {
    walk(engine, action, next, guided, throttle, Walk::InOrder).0
}

/// Rebuilds first the rows of a recovery's target that are at zero
/// redundancy without it, where the array has such rows and others (see
/// the module doc). Anything out of the ordinary ends the walk: the rows
/// it left go in order, where the one-stripe path handles them. Returns
/// whether every such row is rebuilt (none were wanted: false).
pub(in crate::engine) fn rebuild_endangered_first(
    engine: &Arc<Engine>,
    action: SyncAction,
    next: &Arc<Position>,
    guided: bool,
    throttle: &mut Throttle,
) -> bool {
    let SyncAction::Recovery { role } = action else {
        return false;
    };
    // Looked at before the rows are: a role lost after this makes the
    // walk in order come back here (Ended::Reorder).
    engine.sync.order_chosen(missing_roles(engine));
    if !margins_differ(engine, role, next.load(Ordering::SeqCst)) {
        return false;
    }
    engine.sync.walking_endangered(true);
    engine.events.push(
        "RebuildOrder",
        "",
        &format!("role {role}: the rows at zero redundancy first, then the rest in order"),
    );
    let (ended, whole) = walk(engine, action, next, guided, throttle, Walk::Endangered);
    engine.sync.walking_endangered(false);
    let whole = whole && matches!(ended, Ended::Yielded);
    if whole {
        engine.events.push(
            "RebuildOrder",
            "",
            &format!(
                "role {role}: {} rows at zero redundancy rebuilt; the rest in order",
                next.ahead_count()
            ),
        );
        next.set_endangered_done();
        engine.note_exposure_again();
    }
    whole
}

/// Roles not in sync: missing, or being rebuilt.
fn missing_roles(engine: &Engine) -> usize {
    engine.table().in_sync().iter().filter(|s| !**s).count()
}

/// Whether the rows that hold `role` from stripe `from` on are at
/// different redundancy without it: some at zero, some above. Only where
/// another role is missing too and rows hold different sets of roles
/// (dRAID, raid10): elsewhere every row that holds the role has the same
/// margin, and the scan (which stops at the first row of each kind) would
/// read the whole geometry for nothing.
fn margins_differ(engine: &Engine, role: usize, from: u64) -> bool {
    let geometry = engine.geometry();
    let table = engine.table();
    let others_missing = table
        .in_sync()
        .iter()
        .enumerate()
        .any(|(r, in_sync)| r != role && !in_sync);
    if !others_missing || !matches!(*geometry, Geometry::Draid(_) | Geometry::Raid10(_)) {
        return false;
    }
    let (mut zero, mut above) = (false, false);
    for stripe in from..engine.sync.stripe_count() {
        if stripe % 4096 == 0 && engine.sync.stop.load(Ordering::SeqCst) {
            return false;
        }
        let map = geometry.stripe(stripe);
        if table.places_homed(&map, role).is_empty() {
            continue;
        }
        match table.margin_without(&map, role) {
            Some(0) => zero = true,
            Some(_) => above = true,
            None => {}
        }
        if zero && above {
            return true;
        }
    }
    false
}

/// Runs batches of `action` taking the rows `walk` picks; returns how the
/// run ended and whether it planned every row to the end and wrote them.
fn walk(
    engine: &Arc<Engine>,
    action: SyncAction,
    next: &Arc<Position>,
    guided: bool,
    throttle: &mut Throttle,
    walk: Walk,
) -> (Ended, bool) {
    let role = match action {
        SyncAction::Recovery { role } | SyncAction::Replace { role } => role,
        _ => {
            let until = next.load(Ordering::SeqCst) + 1;
            return (Ended::OneByOne { until }, false);
        }
    };
    let (to_writer, batches) = mpsc::sync_channel::<Written>(BATCHES_IN_FLIGHT);
    let (done_tx, done) = mpsc::channel::<Done>();
    let max_io = engine.max_member_io();
    std::thread::scope(|scope| {
        let writer = std::thread::Builder::new()
            .name("uraid-rebuild-write".into())
            .spawn_scoped(scope, move || write_batches(batches, done_tx, next, max_io));
        if writer.is_err() {
            // No thread for the writes: this stretch goes one stripe at a time.
            let until = next.load(Ordering::SeqCst) + 1;
            return (Ended::OneByOne { until }, false);
        }
        let mut pipeline = Pipeline {
            engine,
            action,
            role,
            guided,
            walk,
            done,
            next,
            in_flight: VecDeque::new(),
            handed_end: 0,
            failed: false,
            reached_end: false,
            pool: Vec::new(),
        };
        let ended = pipeline.run(next.load(Ordering::SeqCst), &to_writer, throttle);
        // The writer finishes what it has, then sees the channel close.
        drop(to_writer);
        while !pipeline.in_flight.is_empty() {
            pipeline.settle_oldest();
        }
        // After a failed write the batches from the failed one on were not
        // written: they go one stripe at a time (the position has stayed
        // at the failed batch's start).
        let after = next.load(Ordering::SeqCst) + 1;
        let whole = pipeline.reached_end && !pipeline.failed;
        let ended = match ended {
            Ended::OneByOne { until } => Ended::OneByOne {
                until: until.max(pipeline.handed_end).max(after),
            },
            Ended::Yielded | Ended::Reorder if pipeline.failed => Ended::OneByOne {
                until: pipeline.handed_end.max(after),
            },
            other => other,
        };
        (ended, whole)
    })
}

/// A batch handed to the writer: where its rebuilt bytes go on the target.
struct Written {
    /// The position after the batch, stored once it is written.
    end: u64,
    /// In the walk of endangered rows: the rows to mark done ahead once
    /// written (of `stripes` in all), the position left where it is.
    ahead: Option<(Vec<u64>, u64)>,
    target: MemberRef,
    /// Byte offset on the target, and the bytes of `buffer` that go there.
    writes: Vec<(u64, std::ops::Range<usize>)>,
    buffer: AlignedBuf,
}

/// The writer's answer for one batch, in the order they were sent.
struct Done {
    result: io::Result<()>,
    buffer: AlignedBuf,
}

/// The writer stage: writes each batch, then moves the shared position past
/// it. After a failure it writes nothing more (a later batch written would
/// move the position over the failed one) and answers every batch with an
/// error, so that the job's thread sees where the batches stopped.
fn write_batches(batches: Receiver<Written>, done: Sender<Done>, next: &Position, max_io: usize) {
    let mut failed = false;
    for batch in batches {
        let result = if failed {
            Err(io::Error::other("an earlier batch was not written"))
        } else {
            write_batch(&batch, max_io)
        };
        match (&result, &batch.ahead) {
            (Ok(()), None) => next.store(batch.end, Ordering::SeqCst),
            (Ok(()), Some((rows, stripes))) => {
                for &row in rows {
                    next.mark_ahead(row, *stripes);
                }
            }
            (Err(_), _) => failed = true,
        }
        let answer = Done {
            result,
            buffer: batch.buffer,
        };
        if done.send(answer).is_err() {
            return;
        }
    }
}

fn write_batch(batch: &Written, max_io: usize) -> io::Result<()> {
    let mut ops = Vec::new();
    for (offset, range) in &batch.writes {
        for (k, part) in batch.buffer[range.clone()].chunks(max_io).enumerate() {
            let at = offset + (k * max_io) as u64;
            ops.push(IoOp::write(batch.target.as_ref(), at, part));
        }
    }
    for result in batch::run(&mut ops) {
        result.map_err(|e| {
            io::Error::new(e.kind(), format!("writing {}: {e}", batch.target.name()))
        })?;
    }
    Ok(())
}

/// A batch whose writes are under way, holding its stripes' locks.
struct InFlight<'e> {
    start: u64,
    end: u64,
    _locks: Vec<MutexGuard<'e, ()>>,
}

/// Consecutive stripes planned as one batch.
struct Planned {
    start: u64,
    end: u64,
    /// The stripes to rebuild: those in start..end a bitmap-guided recovery
    /// does not skip.
    stripes: Vec<StripeMap>,
}

enum Plan {
    /// Nothing left to do.
    End,
    Batch(Planned),
}

/// The job's thread's side: plans, locks, reads, computes, hands over.
struct Pipeline<'e> {
    engine: &'e Arc<Engine>,
    action: SyncAction,
    role: usize,
    guided: bool,
    walk: Walk,
    /// The job's position, shared with the entry of the member it builds.
    next: &'e Arc<Position>,
    done: Receiver<Done>,
    in_flight: VecDeque<InFlight<'e>>,
    /// The end of the last batch handed to the writer.
    handed_end: u64,
    /// A batch failed to be written (or the writer is gone).
    failed: bool,
    /// The walk planned its last row.
    reached_end: bool,
    /// Buffers to reuse: a batch's worth is megabytes, and fresh ones cost
    /// a page fault per page.
    pool: Vec<AlignedBuf>,
}

impl<'e> Pipeline<'e> {
    fn run(
        &mut self,
        mut pos: u64,
        writer: &mpsc::SyncSender<Written>,
        throttle: &mut Throttle,
    ) -> Ended {
        let engine = self.engine;
        loop {
            if engine.sync.stop.load(Ordering::SeqCst) || self.failed {
                return Ended::Yielded;
            }
            if self.walk == Walk::InOrder
                && matches!(self.action, SyncAction::Recovery { .. })
                && missing_roles(engine) > engine.sync.order_chosen_for()
            {
                return Ended::Reorder;
            }
            if Arc::strong_count(engine) <= 1 {
                // Only this job holds the engine: it is being dropped, and
                // the job ends when it lets go.
                return Ended::Yielded;
            }
            while self.in_flight.len() >= BATCHES_IN_FLIGHT {
                self.settle_oldest();
            }
            let planned = match self.plan(pos) {
                Plan::End => {
                    self.reached_end = true;
                    return Ended::Yielded;
                }
                Plan::Batch(planned) => planned,
            };
            let numbers: Vec<u64> = planned.stripes.iter().map(|m| m.stripe).collect();
            let locks = self.lock(&numbers);
            let strip_bytes = |m: &StripeMap| (m.strip_sectors * SECTOR_BYTES) as usize;
            for map in &planned.stripes {
                // The batch may rewrite this stripe's parity: none stays hot.
                engine
                    .datapath
                    .parity_cache
                    .drop_stripe(map.stripe, strip_bytes(map));
            }
            let Some(written) = self.rebuild(&planned) else {
                drop(locks);
                return Ended::OneByOne { until: planned.end };
            };
            let kib: u64 = planned
                .stripes
                .iter()
                .map(|m| strip_bytes(m) as u64 / 1024)
                .sum();
            if writer.send(written).is_err() {
                self.failed = true;
                return Ended::OneByOne { until: planned.end };
            }
            self.handed_end = planned.end;
            self.in_flight.push_back(InFlight {
                start: planned.start,
                end: planned.end,
                _locks: locks,
            });
            pos = planned.end;
            throttle.count(kib);
            if throttle.would_wait(engine) {
                // The job gives way (a speed limit, foreground I/O): the
                // batches in flight let their stripes go first, so that
                // foreground writes to them do not wait out the pause.
                while !self.in_flight.is_empty() {
                    self.settle_oldest();
                }
                throttle.wait(engine, &engine.sync.stop);
            }
        }
    }

    /// Waits for the oldest batch in flight to be written, records the
    /// progress, and lets its locks go.
    fn settle_oldest(&mut self) {
        let Some(batch) = self.in_flight.pop_front() else {
            return;
        };
        match self.done.recv() {
            Ok(Done {
                result: Ok(()),
                buffer,
            }) => {
                self.give([buffer]);
                // Rows done ahead move no position: nothing to checkpoint.
                if !self.failed && self.walk == Walk::InOrder {
                    self.engine
                        .sync_progressed(self.action, batch.start, batch.end);
                }
            }
            Ok(Done { result: Err(_), .. }) | Err(_) => self.failed = true,
        }
        drop(batch);
    }

    /// Takes the locks of `stripes` in slot order (see the module doc).
    fn lock(&mut self, stripes: &[u64]) -> Vec<MutexGuard<'e, ()>> {
        let locks = &self.engine.datapath.locks;
        let mut slots: Vec<usize> = stripes.iter().map(|&s| locks.slot(s)).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut guards = Vec::with_capacity(slots.len());
        for slot in slots {
            loop {
                if self.in_flight.is_empty() {
                    guards.push(locks.lock_slot(slot));
                    break;
                }
                if let Some(guard) = locks.try_lock_slot(slot) {
                    guards.push(guard);
                    break;
                }
                self.settle_oldest();
            }
        }
        guards
    }

    /// The batch that starts at `pos`.
    fn plan(&self, pos: u64) -> Plan {
        let engine = self.engine;
        let count = engine.sync.stripe_count();
        if pos >= count {
            return Plan::End;
        }
        let geometry = engine.geometry();
        let table = engine.table();
        let mut shares = Shares::new(engine, geometry.raid_disks());
        let mut stripes = Vec::new();
        let mut end = pos;
        while end < count && end - pos < BATCH_STRIPES_MAX {
            if (self.guided && !engine.stripe_needs_resync(end)) || self.next.is_ahead(end) {
                // The bitmap says this region was quiet while the member
                // was away, or the row was rebuilt ahead (the walk of
                // endangered rows).
                end += 1;
                continue;
            }
            let map = geometry.stripe(end);
            if table.places_homed(&map, self.role).is_empty() {
                // Nothing of the role here (most of a dRAID's stripes): no
                // I/O and no lock (no write to it touches the target), so
                // it takes none of the budget; the position passes it.
                end += 1;
                continue;
            }
            if self.walk == Walk::Endangered && table.margin_without(&map, self.role) != Some(0) {
                // Not at zero redundancy: the walk in order takes it.
                end += 1;
                continue;
            }
            let bytes = map.strip_sectors * SECTOR_BYTES;
            let members = map
                .data
                .iter()
                .flat_map(|d| d.copies.iter().copied())
                .chain(map.parity_places())
                .map(|place| table.home(&place, end).member);
            if !shares.take(members, bytes, stripes.is_empty()) {
                break;
            }
            stripes.push(map);
            end += 1;
        }
        Plan::Batch(Planned {
            start: pos,
            end,
            stripes,
        })
    }

    /// The target: the member being rebuilt in the role, or the replacement
    /// being built for it.
    fn target(&self, table: &crate::engine::members::MemberTable) -> Option<MemberEntry> {
        let role = self.role;
        // Only the member whose position this job moves (see
        // Engine::job_owns_target): any other takes the one-stripe path,
        // which ends a stale job.
        if !self.engine.job_owns_target(self.action, self.next) {
            return None;
        }
        match self.action {
            SyncAction::Recovery { .. } => table.entry(role).cloned(),
            // As the one-stripe path: the replacement, or, its original gone,
            // the replacement promoted to the role and still being built.
            SyncAction::Replace { .. } => table.replacing[role].clone().or_else(|| {
                table.by_role[role]
                    .clone()
                    .filter(|e| e.rebuilt_below.is_some())
            }),
            _ => None,
        }
    }

    /// Reads what the batch needs and computes what the target gets; None
    /// when the batch must take the one-stripe path (a read error, a stripe
    /// that cannot be rebuilt, the target gone: that path reports it).
    fn rebuild(&mut self, planned: &Planned) -> Option<Written> {
        let engine = self.engine;
        let table = engine.table();
        let target = self.target(&table)?;
        let role = self.role;
        let mut reads = Runs::new(table.by_role.len());
        let mut writes = Runs::new(1);
        let mut work = Vec::new();
        for (index, map) in planned.stripes.iter().enumerate() {
            let view = View {
                engine,
                table: table.clone(),
                stripe: map.stripe,
            };
            let sectors = map.strip_sectors;
            // Each strip is read where its bytes are (a distributed
            // spare's on the child that holds its space).
            let mut read = |place: &Place| {
                let home = view.home(place);
                reads.add(home.member, home.member_sector, sectors)
            };
            // What the role holds here that the target can take (see
            // `MemberTable::places_homed` and `reaches_disk`).
            let homed: Vec<&Place> = view
                .table
                .places_homed(map, role)
                .into_iter()
                .filter(|p| view.table.reaches_disk(&target, p))
                .collect();
            if view.table.usable(role, map.stripe) {
                // A replace whose original still serves: its strips are
                // copied as they are.
                for place in homed {
                    let out = writes.add(0, place.member_sector, sectors);
                    work.push(Work::Copy(read(place), out));
                }
            } else if map.p.is_none() {
                // Mirrors: each strip from another copy of it.
                for strip in &map.data {
                    for place in strip.copies.iter().filter(|c| c.member == role) {
                        let source = strip
                            .copies
                            .iter()
                            .find(|c| c.member != role && view.present(c))?;
                        let out = writes.add(0, place.member_sector, sectors);
                        work.push(Work::Copy(read(source), out));
                    }
                }
            } else if let Some(&place) = homed.first() {
                // A dRAID row has one place per home, md's one per member.
                debug_assert_eq!(homed.len(), 1);
                let data: Vec<Option<Slice>> = map
                    .data
                    .iter()
                    .map(|d| view.present(&d.copies[0]).then(|| read(&d.copies[0])))
                    .collect();
                // As many parity strips as data strips are missing, P first.
                let missing = data.iter().filter(|d| d.is_none()).count();
                let mut parity = [map.p, map.q, map.r]
                    .map(|p| p.filter(|p| view.home(p).member != role && view.present(p)));
                let mut wanted = missing;
                for p in parity.iter_mut() {
                    if wanted == 0 {
                        *p = None;
                    } else if p.is_some() {
                        wanted -= 1;
                    }
                }
                let parity = parity.map(|p| p.map(|p| read(&p)));
                let out = writes.add(0, place.member_sector, sectors);
                work.push(Work::Rebuild {
                    map: index,
                    target: *place,
                    data,
                    parity,
                    out,
                });
            }
        }
        let mut read_bufs = self.buffers(&reads);
        {
            let mut requests: Vec<(MemberRef, u64, &mut [u8])> = Vec::new();
            // Each member's runs lie in order in its buffer: split it as
            // they come.
            let mut rest: Vec<&mut [u8]> = read_bufs.iter_mut().map(|b| &mut b[..]).collect();
            let mut taken = vec![0usize; rest.len()];
            for run in &reads.runs {
                let entry = table.entry(run.role)?;
                let at = entry.slot.data_offset_bytes + run.sector * SECTOR_BYTES;
                let buf = std::mem::take(&mut rest[run.role]);
                let (_, buf) = buf.split_at_mut(run.at - taken[run.role]);
                let (this, tail) = buf.split_at_mut(run.bytes());
                rest[run.role] = tail;
                taken[run.role] = run.at + run.bytes();
                requests.push((entry.slot.member.clone(), at, this));
            }
            let errors = run_reads(engine.max_member_io(), &mut requests);
            if errors.iter().any(Option::is_some) {
                drop(requests);
                self.give(read_bufs);
                return None;
            }
        }
        let mut write_bufs = self.buffers(&writes);
        let mut ok = true;
        for item in &work {
            match item {
                Work::Copy(from, to) => {
                    to.of_mut(&mut write_bufs)
                        .copy_from_slice(from.of(&read_bufs));
                }
                Work::Rebuild {
                    map,
                    target,
                    data,
                    parity,
                    out,
                } => {
                    let data: Vec<Option<&[u8]>> =
                        data.iter().map(|d| d.map(|d| d.of(&read_bufs))).collect();
                    let parity = parity.map(|p| p.map(|p| p.of(&read_bufs)));
                    let out = out.of_mut(&mut write_bufs);
                    let map = &planned.stripes[*map];
                    if rebuild_strip(engine.datapath.syndrome, map, target, &data, parity, out)
                        .is_err()
                    {
                        ok = false;
                        break;
                    }
                }
            }
        }
        self.give(read_bufs);
        if !ok {
            self.give(write_bufs);
            return None;
        }
        let base = target.slot.data_offset_bytes;
        let ahead = (self.walk == Walk::Endangered).then(|| {
            let rows = planned.stripes.iter().map(|m| m.stripe).collect();
            (rows, engine.sync.stripe_count())
        });
        Some(Written {
            end: planned.end,
            ahead,
            target: target.slot.member.clone(),
            writes: writes
                .runs
                .iter()
                .map(|r| (base + r.sector * SECTOR_BYTES, r.at..r.at + r.bytes()))
                .collect(),
            buffer: write_bufs.pop().expect("one buffer for the target"),
        })
    }

    /// Keeps buffers for the next batches.
    fn give(&mut self, buffers: impl IntoIterator<Item = AlignedBuf>) {
        self.pool
            .extend(buffers.into_iter().filter(|b| !b.is_empty()));
    }

    /// One buffer per member, from the pool where one is large enough
    /// (the smallest such).
    fn buffers(&mut self, runs: &Runs) -> Vec<AlignedBuf> {
        let size = batch_budget(self.engine) as usize;
        runs.filled
            .iter()
            .map(|&len| {
                let fits = self.pool.iter().enumerate().filter(|(_, b)| b.len() >= len);
                match fits.min_by_key(|(_, b)| b.len()).map(|(k, _)| k) {
                    _ if len == 0 => AlignedBuf::zeroed(0),
                    Some(k) => self.pool.swap_remove(k),
                    None => AlignedBuf::zeroed(len.max(size)),
                }
            })
            .collect()
    }
}

/// What a batch being planned takes of each member, against the budget.
pub(in crate::engine) struct Shares {
    taken: Vec<u64>,
    budget: u64,
}

impl Shares {
    pub(in crate::engine) fn new(engine: &Engine, members: usize) -> Shares {
        Shares {
            taken: vec![0; members],
            budget: batch_budget(engine),
        }
    }

    /// Takes a row that moves `bytes` on each of `members` (a member once
    /// per strip), unless it would put one over the budget; the first row
    /// of a batch is always taken.
    pub(in crate::engine) fn take(
        &mut self,
        members: impl Iterator<Item = usize>,
        bytes: u64,
        first: bool,
    ) -> bool {
        let mut this = vec![0u64; self.taken.len()];
        for member in members {
            this[member] += bytes;
        }
        let over = self
            .taken
            .iter()
            .zip(&this)
            .any(|(s, t)| s + t > self.budget);
        if over && !first {
            return false;
        }
        self.taken.iter_mut().zip(&this).for_each(|(s, t)| *s += t);
        true
    }
}

/// Bytes per member one batch moves at most. Under a speed limit a batch is
/// a tenth of a second's worth at the limit, so that the throttle, which
/// accounts a batch at a time, keeps the rate smooth. Paced by the
/// clients' latency, a twentieth of a second's worth at the rate allowed:
/// a client's request that lands behind a batch's member I/O waits for
/// all of it, so the slower the job must go, the smaller its bites (a
/// batch holds at least one stripe).
fn batch_budget(engine: &Engine) -> u64 {
    let max_kib = engine
        .sync
        .speed_limit_max_kib_per_s
        .load(Ordering::Relaxed);
    let budget = BATCH_BYTES_PER_MEMBER.min(max_kib.saturating_mul(1024) / 10);
    let paced_kib = engine.sync.pace.paced_rate_kib_per_s();
    match paced_kib {
        Some(rate) if engine.tunables.rebuild_latency_target_us() > 0 => {
            budget.min(rate.saturating_mul(1024) / 20)
        }
        _ => budget,
    }
}

/// What the job's thread does with one strip of the target.
enum Work {
    /// The bytes read are the target's as they are.
    Copy(Slice, Slice),
    /// The target's strip is computed from the stripe's others.
    Rebuild {
        /// The stripe's index in the batch.
        map: usize,
        /// The place of the stripe the target's strip is.
        target: Place,
        data: Vec<Option<Slice>>,
        /// P, Q and R, those read.
        parity: [Option<Slice>; 3],
        out: Slice,
    },
}

/// Where a strip lies in a batch's buffers: the buffer (one per member),
/// byte offset, length.
#[derive(Clone, Copy)]
struct Slice {
    buf: usize,
    offset: usize,
    len: usize,
}

impl Slice {
    fn of<'b>(&self, bufs: &'b [AlignedBuf]) -> &'b [u8] {
        &bufs[self.buf][self.offset..self.offset + self.len]
    }

    fn of_mut<'b>(&self, bufs: &'b mut [AlignedBuf]) -> &'b mut [u8] {
        &mut bufs[self.buf][self.offset..self.offset + self.len]
    }
}

/// A run of sectors contiguous on one member: one read or one write, into
/// or from its member's buffer at `at`.
struct Run {
    role: usize,
    sector: u64,
    sectors: u64,
    at: usize,
}

impl Run {
    fn bytes(&self) -> usize {
        (self.sectors * SECTOR_BYTES) as usize
    }
}

/// The member extents of a batch, gathered into runs as they are added (an
/// extent that starts where its member's last run ends extends it), and
/// laid out back to back in one buffer per member.
struct Runs {
    runs: Vec<Run>,
    last: Vec<Option<usize>>,
    /// Bytes of each member's buffer in use.
    filled: Vec<usize>,
}

impl Runs {
    fn new(roles: usize) -> Runs {
        Runs {
            runs: Vec::new(),
            last: vec![None; roles],
            filled: vec![0; roles],
        }
    }

    fn add(&mut self, role: usize, sector: u64, sectors: u64) -> Slice {
        let len = (sectors * SECTOR_BYTES) as usize;
        let offset = self.filled[role];
        self.filled[role] += len;
        let slice = Slice {
            buf: role,
            offset,
            len,
        };
        if let Some(k) = self.last[role] {
            let run = &mut self.runs[k];
            if run.sector + run.sectors == sector {
                run.sectors += sectors;
                return slice;
            }
        }
        self.runs.push(Run {
            role,
            sector,
            sectors,
            at: offset,
        });
        self.last[role] = Some(self.runs.len() - 1);
        slice
    }
}
