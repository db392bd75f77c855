//! The one executor of row writes. It runs 1..N planned rows whose locks
//! the caller holds, in five steps, each over all the rows at once: read
//! (one batch), compute, log (one journal commit per kind), write (one
//! batch), settle (members that failed a write are failed, then the
//! journal learns the rows are on the members, then parity stays hot).
//! The single write of a row and the stripe worker's round are its
//! callers; the outcome of each row is a value, so a caller decides what
//! a failed read means for it (the single write corrects it from
//! redundancy and tries again; the round hands the row to the single
//! write).

use super::failure::PathError;
use super::io::{run_reads, run_writes, View, WriteTarget};
use super::plan::Method;
use super::row::RowWrite;
use crate::engine::journal::Ticket;
use crate::engine::Engine;
use std::io;
use std::ops::Range;

/// One row for the executor: the view of the members it was planned on,
/// and its write.
pub(in crate::engine) struct Row<'v, 'e, 'p, 'a> {
    pub(in crate::engine) view: &'v View<'e>,
    pub(in crate::engine) write: RowWrite<'p, 'a>,
}

/// What became of one row.
#[derive(Debug)]
pub(in crate::engine) enum RowOutcome {
    /// Its writes went out; the result says whether the array still
    /// serves (a member that failed a write was failed and left out).
    Written(io::Result<()>),
    /// A read it needed failed, or its parity could not be computed:
    /// nothing of it was written. The failure names the member where one
    /// failed a read.
    Unread(PathError),
    /// Its journal rows did not fit the commit of the rows before it:
    /// nothing of it was logged or written.
    Unlogged,
}

impl Engine {
    /// Runs the writes of `rows` (each under its row's lock, held by the
    /// caller, and marked in the bitmap), and says what became of each.
    pub(in crate::engine) fn run_rows(&self, rows: Vec<Row>) -> Vec<RowOutcome> {
        let mut outcomes: Vec<Option<RowOutcome>> = rows.iter().map(|_| None).collect();
        let mut slots: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
        for row in slots.iter().flatten() {
            row.write.check_buffers();
        }
        self.read_rows(&mut slots, &mut outcomes);
        compute_rows(&mut slots, &mut outcomes);
        let tickets = self.log_rows(&mut slots, &mut outcomes);
        self.write_rows_out(&slots, &mut outcomes, tickets);
        outcomes
            .into_iter()
            .map(|o| o.expect("every row has an outcome"))
            .collect()
    }

    /// Every read of every row in one batch. A failed read is tried once
    /// more alone (see `View::read_place`); a row whose read still fails
    /// leaves the executor as `Unread`.
    fn read_rows(&self, slots: &mut [Option<Row>], outcomes: &mut [Option<RowOutcome>]) {
        let max = self.max_member_io();
        let mut failed: Vec<(usize, usize)> = Vec::new();
        {
            let mut reads = Vec::new();
            let mut owner = Vec::new();
            for (k, slot) in slots.iter_mut().enumerate() {
                let Some(row) = slot else { continue };
                let view = row.view;
                for (n, (place, at, buf)) in row.write.reads().into_iter().enumerate() {
                    let (member, offset) = view.offset_of(place, at);
                    reads.push((member, offset, buf));
                    owner.push((k, n));
                }
            }
            for (owner, error) in owner.into_iter().zip(run_reads(max, &mut reads)) {
                if error.is_some() {
                    failed.push(owner);
                }
            }
        }
        for (k, n) in failed {
            let Some(row) = &mut slots[k] else { continue };
            let view = row.view;
            let mut reads = row.write.reads();
            let (place, at, buf) = &mut reads[n];
            if let Err(e) = view.read_place(place, *at, buf) {
                drop(reads);
                slots[k] = None;
                outcomes[k] = Some(RowOutcome::Unread(e));
            }
        }
    }

    /// With a journal, every row is logged before any of its writes: the
    /// rows whose data is logged already (write-back) log their parity in
    /// a commit of their own, which may use the room kept back for it, and
    /// the others in one commit. A row past what one caller may log is
    /// `Unlogged`, unless it is the first of its commit (a row alone logs
    /// whatever it needs). A failed commit fails its rows.
    fn log_rows(
        &self,
        slots: &mut [Option<Row>],
        outcomes: &mut [Option<RowOutcome>],
    ) -> Vec<Ticket> {
        let mut tickets = Vec::new();
        let Some(journal) = &self.journal else {
            return tickets;
        };
        for logged in [true, false] {
            let budget = journal.max_caller_pages();
            let mut rows = Vec::new();
            let mut pages = 0;
            let mut first = None;
            for (k, slot) in slots.iter_mut().enumerate() {
                let Some(row) = slot else { continue };
                if row.write.piece.logged != logged || row.write.plan.method == Method::Copies {
                    continue;
                }
                let mine = row.view.journal_rows(row.write.piece, Some(&row.write));
                let more: usize = mine.iter().map(|r| r.data.len() + r.parity).sum();
                if first.is_some() && pages + more > budget {
                    *slot = None;
                    outcomes[k] = Some(RowOutcome::Unlogged);
                    continue;
                }
                pages += more;
                rows.extend(mine);
                first.get_or_insert(k);
            }
            let Some(k) = first else { continue };
            let row = slots[k].as_ref().expect("taken above");
            match row.view.log_rows(row.write.piece, rows) {
                Ok(ticket) => tickets.extend(ticket),
                Err(e) => {
                    for (k, slot) in slots.iter_mut().enumerate() {
                        if slot
                            .as_ref()
                            .is_some_and(|r| r.write.piece.logged == logged)
                        {
                            *slot = None;
                            let e = io::Error::new(e.kind(), e.to_string());
                            outcomes[k] = Some(RowOutcome::Written(Err(e)));
                        }
                    }
                }
            }
        }
        tickets
    }

    /// Every write of every row in one batch; then each row's failed
    /// members are failed, the journal is told the rows are on the
    /// members, and the parity written stays hot.
    fn write_rows_out(
        &self,
        slots: &[Option<Row>],
        outcomes: &mut [Option<RowOutcome>],
        tickets: Vec<Ticket>,
    ) {
        let mut targets: Vec<WriteTarget> = Vec::new();
        let mut spans: Vec<Range<usize>> = vec![0..0; slots.len()];
        for (k, row) in slots.iter().enumerate() {
            let Some(row) = row else { continue };
            let start = targets.len();
            let fua = row.write.piece.fua;
            row.view
                .write_targets(&row.write.writes(), fua, &mut targets);
            spans[k] = start..targets.len();
        }
        let mut errors = run_writes(self.max_member_io(), &targets).into_iter();
        let mut results: Vec<Option<io::Result<()>>> = slots.iter().map(|_| None).collect();
        for (k, row) in slots.iter().enumerate() {
            let Some(row) = row else { continue };
            let mine: Vec<_> = errors.by_ref().take(spans[k].len()).collect();
            results[k] = Some(row.view.settle_writes(&targets[spans[k].clone()], mine));
        }
        // Members that failed a write are out of the array (their
        // superblocks say so) before the journal may let go of the rows.
        for ticket in tickets {
            self.journal_done(Some(ticket));
        }
        for (k, row) in slots.iter().enumerate() {
            let Some(row) = row else { continue };
            let result = results[k].take().expect("settled above");
            row.view.keep_parity(&row.write, result.is_ok());
            outcomes[k] = Some(RowOutcome::Written(result));
        }
    }
}

/// Each read row's new parity. A row whose parity cannot be computed (a
/// lost strip's rebuild failed) leaves as `Unread`.
fn compute_rows(slots: &mut [Option<Row>], outcomes: &mut [Option<RowOutcome>]) {
    for (k, slot) in slots.iter_mut().enumerate() {
        let Some(row) = slot else { continue };
        if let Err(e) = row.view.compute_parity(&mut row.write) {
            *slot = None;
            outcomes[k] = Some(RowOutcome::Unread(e));
        }
    }
}
