//! The write of a row, in three rooms: `plan` decides it from the row's
//! shape alone (a pure function, tested on every small shape), `row` gives
//! the plan its buffers and holds its steps, and `execute` runs 1..N rows
//! (the single write and the stripe worker's batched round alike). The
//! request path above (`engine/datapath/io.rs`) splits a request into rows; the
//! members below are reached through the view of the member table each
//! row was planned on.

pub(super) mod cache;
pub(super) mod execute;
pub(super) mod failure;
pub(super) mod io;
pub(super) mod locks;
pub(super) mod paritycache;
pub(super) mod plan;
pub(super) mod readcache;
pub(super) mod row;
pub(super) mod staged;
pub(super) mod stripes;

use execute::{Row, RowOutcome};
use failure::PathError;
use io::{Piece, View};

impl View<'_> {
    /// Writes one piece of a row, the caller holding the row's lock.
    /// `prefetch`: see [`View::plan_write`]. A failed read comes back as
    /// the member's failure, for the caller to correct.
    pub(in crate::engine) fn write_piece(
        &self,
        piece: &Piece,
        prefetch: bool,
    ) -> Result<(), PathError> {
        let write = self.plan_write(piece, prefetch)?;
        let rows = vec![Row { view: self, write }];
        match self.engine.run_rows(rows).pop() {
            Some(RowOutcome::Written(result)) => result.map_err(PathError::Array),
            Some(RowOutcome::Unread(e)) => Err(e),
            Some(RowOutcome::Unlogged) | None => {
                unreachable!("a row alone is the first of its commit")
            }
        }
    }
}
