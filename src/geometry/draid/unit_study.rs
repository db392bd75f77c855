//! The measurements behind "Why the slice is the unit" in
//! docs/DRAID-FORMAT.md: dRAID layouts written out cell by cell, so that
//! today's unit (one permutation per slice of lcm(W, N)/N rows) and finer
//! ones (a permutation per 16 MiB row) can be compared on the same terms:
//! the share of a child they use, how evenly one child's rebuild spreads
//! over the survivors, and whether every group still loses at most P
//! columns when P children fail after a rebuild onto a distributed spare.
//!
//! Only format version 1 (`CellLayout::slices`, built from the real
//! geometry) is a layout any array uses; the others are candidates.

use crate::geometry::draid::{perms, table, Draid, DraidParams, ROW_SECTORS};

/// How groups are laid into the first N positions of the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packing {
    /// Group g takes cells g·W .. g·W + W of the row-major sequence of group
    /// positions, wrapping from the end of one row to the next, as format
    /// version 1 does inside a slice.
    Wrapping,
    /// Each row holds N / W whole groups and leaves N mod W positions idle,
    /// so that no group crosses a row.
    WholeRows,
}

/// One layout over the rows of a child: the child at each of the C
/// positions of every row, and the whole groups laid into them.
pub(super) struct CellLayout {
    pub(super) name: &'static str,
    parity: usize,
    width: usize,
    ndisks: usize,
    children: usize,
    rows: usize,
    groups: usize,
    packing: Packing,
    /// `cells[row * children + pos]` is the child at position `pos`.
    cells: Vec<u8>,
}

/// What the guarantees of the format look like in a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Guarantees {
    /// Groups with two columns on one child.
    pub(super) repeated: usize,
    /// (column, spare) pairs whose row's spare child holds another column
    /// of the same group: a rebuild onto that spare would put two columns
    /// of the group on one child.
    pub(super) spare_clashes: usize,
    /// The most columns any group loses when one child fails, is rebuilt
    /// onto any one distributed spare, and then any P further children
    /// fail.
    pub(super) worst_loss: usize,
}

/// How evenly one failure's rebuild spreads, worst over every failed child.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Balance {
    /// The busiest survivor's reads over the survivors' mean reads.
    pub(super) reads: f64,
    /// The same for reads and writes together.
    pub(super) total: f64,
}

/// The rows a child of `dev_sectors` holds, and the whole groups that fit
/// in them, for a layout with one permutation per slice and the last slice
/// allowed to be partial (OpenZFS's rounding: whole rows, then whole
/// groups).
pub(super) fn rows_and_groups(p: &DraidParams, dev_sectors: u64) -> (usize, usize) {
    let (width, ndisks) = (p.data + p.parity, p.children - p.spares);
    let rows_available = (dev_sectors / ROW_SECTORS) as usize;
    let groups = rows_available * ndisks / width;
    let rows = (groups * width).div_ceil(ndisks);
    assert!(rows <= rows_available);
    (rows, groups)
}

/// The share of a child of `dev_sectors` that `groups` whole groups use,
/// against the N/C of every child that groups could hold (the rest being
/// spare columns).
pub(super) fn usable_fraction(p: &DraidParams, groups: usize, dev_sectors: u64) -> f64 {
    let used = groups as u128 * (p.data + p.parity) as u128 * ROW_SECTORS as u128;
    let room = (p.children - p.spares) as u128 * dev_sectors as u128;
    assert!(used <= room);
    used as f64 / room as f64
}

/// A geometry of the same parameters with room for any number of slices,
/// whose `child_at` gives the permutation of any index.
pub(super) fn probe(p: &DraidParams) -> Draid {
    Draid::new(&DraidParams {
        dev_sectors: u64::MAX / 2,
        ..p.clone()
    })
    .unwrap()
}

/// `g` laid out with the map another seed generates, to see how much of
/// the rebuild balance of a few slices is the seed's.
pub(super) fn with_seed(g: &Draid, seed: u64) -> Draid {
    let rows = perms::generate(g.children, g.perms.nperms(), seed);
    let entry = table::MapEntry {
        children: g.children as u8,
        seed,
        checksum: perms::checksum(&rows),
    };
    // Maps live for the process, as the frozen ones do; a test makes few.
    let map = Box::leak(Box::new(perms::PermMap::build(&entry).unwrap()));
    Draid {
        perms: map,
        ..g.clone()
    }
}

/// The permutation of index `index` as format version 1 takes it for a
/// slice: base row index / C of the map, rotated by index mod C.
fn table_row(probe: &Draid, index: u64) -> Vec<u8> {
    (0..probe.children)
        .map(|pos| probe.child_at(index, pos) as u8)
        .collect()
}

/// The permutation of index `index` taking every base row of the map
/// before the next rotation, instead of every rotation before the next
/// base row.
fn table_row_rows_first(probe: &Draid, index: u64) -> Vec<u8> {
    let nperms = probe.perms.nperms() as u64;
    let children = probe.children;
    let row = (index % nperms) as usize;
    let rotation = (index / nperms % children as u64) as usize;
    probe
        .perms
        .row(row)
        .iter()
        .map(|&c| ((c as usize + rotation) % children) as u8)
        .collect()
}

impl CellLayout {
    fn empty(name: &'static str, p: &DraidParams, rows: usize, groups: usize) -> CellLayout {
        CellLayout {
            name,
            parity: p.parity,
            width: p.data + p.parity,
            ndisks: p.children - p.spares,
            children: p.children,
            rows,
            groups,
            packing: Packing::Wrapping,
            cells: Vec::with_capacity(rows * p.children),
        }
    }

    /// Checks what every builder must have made: a permutation of the
    /// children in each row, and groups that fit in the rows.
    fn finished(self) -> CellLayout {
        assert_eq!(self.cells.len(), self.rows * self.children);
        for row in self.cells.chunks_exact(self.children) {
            let mut seen = vec![false; self.children];
            for &child in row {
                assert!(!std::mem::replace(&mut seen[child as usize], true));
            }
        }
        if self.groups > 0 {
            assert!(self.places(self.groups - 1).all(|(row, _)| row < self.rows));
        }
        self
    }

    /// A layout whose row `row` is `permutation(row)`.
    fn from_rows(
        name: &'static str,
        p: &DraidParams,
        (rows, groups): (usize, usize),
        permutation: impl Fn(usize) -> Vec<u8>,
    ) -> CellLayout {
        let mut layout = CellLayout::empty(name, p, rows, groups);
        for row in 0..rows {
            layout.cells.extend(permutation(row));
        }
        layout
    }

    /// Format version 1, from the geometry itself: whole slices, one
    /// permutation per slice.
    pub(super) fn slices(g: &Draid, p: &DraidParams) -> CellLayout {
        let size = (
            g.slices as usize * g.rows_per_slice,
            g.slices as usize * g.ngroups,
        );
        let slice_of = |row: usize| (row / g.rows_per_slice) as u64;
        CellLayout::from_rows("slice (v1)", p, size, |row| table_row(g, slice_of(row))).finished()
    }

    /// One permutation per slice as in version 1, with a partial last
    /// slice holding as many whole groups as the remaining rows take.
    pub(super) fn partial_slices(p: &DraidParams, dev_sectors: u64) -> CellLayout {
        CellLayout::per_slice("slice, partial last", p, dev_sectors, table_row)
    }

    /// One permutation per slice, the slices taking the map's base rows
    /// before its rotations.
    pub(super) fn slices_rows_first(p: &DraidParams, dev_sectors: u64) -> CellLayout {
        CellLayout::per_slice("slice, rows first", p, dev_sectors, table_row_rows_first)
    }

    /// Whole groups in the rows of `dev_sectors`, slice s laid out with
    /// permutation `order(s)`.
    fn per_slice(
        name: &'static str,
        p: &DraidParams,
        dev_sectors: u64,
        order: fn(&Draid, u64) -> Vec<u8>,
    ) -> CellLayout {
        let probe = probe(p);
        let slice_of = |row: usize| (row / probe.rows_per_slice) as u64;
        let size = rows_and_groups(p, dev_sectors);
        CellLayout::from_rows(name, p, size, |row| order(&probe, slice_of(row))).finished()
    }

    /// A permutation per row, the groups wrapping as in version 1, with no
    /// care for the wrap: the layout a finer unit must not be.
    pub(super) fn rows_naive(p: &DraidParams, dev_sectors: u64) -> CellLayout {
        let probe = probe(p);
        let size = rows_and_groups(p, dev_sectors);
        CellLayout::from_rows("row, naive", p, size, |row| table_row(&probe, row as u64)).finished()
    }

    /// A permutation per run of `unit_rows` rows (one 16 MiB row, or a
    /// row group shorter than a slice), the groups wrapping as in version 1,
    /// each permutation fitted to the row before wherever a group crosses
    /// into it (see `fit_after_wrap`). Fitting makes a row depend on the
    /// rows before it back to the last row no group crosses into, which is
    /// a slice boundary: finding a row's children takes that chain of fits.
    pub(super) fn rows_fitted(p: &DraidParams, dev_sectors: u64, unit_rows: usize) -> CellLayout {
        assert!(unit_rows >= 1);
        let (rows, groups) = rows_and_groups(p, dev_sectors);
        let probe = probe(p);
        let name = if unit_rows == 1 {
            "row, fitted"
        } else {
            "row group, fitted"
        };
        let mut layout = CellLayout::empty(name, p, rows, groups);
        let (children, ndisks, width) = (layout.children, layout.ndisks, layout.width);
        for row in 0..rows {
            if row % unit_rows != 0 {
                let same = layout.cells[(row - 1) * children..row * children].to_vec();
                layout.cells.extend(same);
                continue;
            }
            let mut next = table_row(&probe, (row / unit_rows) as u64);
            let tail = row * ndisks % width;
            if tail > 0 {
                let previous = &layout.cells[(row - 1) * children..row * children];
                fit_after_wrap(previous, &mut next, ndisks, ndisks - tail, width);
            }
            layout.cells.extend(next);
        }
        layout.finished()
    }

    /// A permutation per row with no group crossing a row: N mod W
    /// positions of every row stay idle.
    pub(super) fn rows_whole(p: &DraidParams, dev_sectors: u64) -> CellLayout {
        let probe = probe(p);
        let rows = (dev_sectors / ROW_SECTORS) as usize;
        let per_row = (p.children - p.spares) / (p.data + p.parity);
        let size = (rows, rows * per_row);
        let mut layout =
            CellLayout::from_rows("row, no wrap", p, size, |row| table_row(&probe, row as u64));
        layout.packing = Packing::WholeRows;
        layout.finished()
    }

    pub(super) fn groups(&self) -> usize {
        self.groups
    }

    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// The child at every position of every row, row after row.
    pub(super) fn cells(&self) -> &[u8] {
        &self.cells
    }

    pub(super) fn child(&self, row: usize, pos: usize) -> usize {
        self.cells[row * self.children + pos] as usize
    }

    fn spare_child(&self, row: usize, spare: usize) -> usize {
        self.child(row, self.children - 1 - spare)
    }

    /// The (row, position) of each column of group `group`, P first.
    pub(super) fn places(&self, group: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        assert!(group < self.groups);
        let per_row = self.ndisks / self.width;
        (0..self.width).map(move |column| match self.packing {
            Packing::Wrapping => {
                let cell = group * self.width + column;
                (cell / self.ndisks, cell % self.ndisks)
            }
            Packing::WholeRows => (group / per_row, group % per_row * self.width + column),
        })
    }

    fn holders(&self, group: usize) -> Vec<usize> {
        self.places(group).map(|(r, p)| self.child(r, p)).collect()
    }

    /// The holders of `group` once `failed` is rebuilt onto distributed
    /// spare `spare`: each of its columns moves to that row's spare child.
    fn holders_after_rebuild(&self, group: usize, failed: usize, spare: usize) -> Vec<usize> {
        self.places(group)
            .map(|(r, p)| match self.child(r, p) {
                c if c == failed => self.spare_child(r, spare),
                c => c,
            })
            .collect()
    }

    /// Rows read and written by each child to rebuild each child, indexed
    /// [failed][child]: every group with a column on `failed` is read from
    /// its other columns and written to spare 0 of the row of the lost
    /// column (to the replacement, without spares).
    pub(super) fn rebuild_loads(&self) -> Vec<Vec<(u64, u64)>> {
        let spares = self.children - self.ndisks;
        let mut load = vec![vec![(0u64, 0u64); self.children]; self.children];
        for group in 0..self.groups {
            let places: Vec<(usize, usize)> = self.places(group).collect();
            for &(row, pos) in &places {
                let failed = self.child(row, pos);
                let target = if spares > 0 {
                    self.spare_child(row, 0)
                } else {
                    failed
                };
                load[failed][target].1 += 1;
                for &(r, p) in &places {
                    if (r, p) != (row, pos) {
                        load[failed][self.child(r, p)].0 += 1;
                    }
                }
            }
        }
        load
    }

    /// The busiest survivor's share over the mean, worst over the failed
    /// child.
    pub(super) fn balance(&self) -> Balance {
        let ratio = |loads: &[u64]| {
            let max = *loads.iter().max().unwrap() as f64;
            let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
            assert!(mean > 0.0, "a rebuild with nothing to read");
            max / mean
        };
        let mut worst = Balance {
            reads: 0.0,
            total: 0.0,
        };
        for (failed, load) in self.rebuild_loads().iter().enumerate() {
            let survivors = load.iter().enumerate().filter(|(c, _)| *c != failed);
            let (reads, totals): (Vec<u64>, Vec<u64>) =
                survivors.map(|(_, (r, w))| (*r, r + w)).unzip();
            worst.reads = worst.reads.max(ratio(&reads));
            worst.total = worst.total.max(ratio(&totals));
        }
        worst
    }

    /// Checks every group and, for every failed child rebuilt onto each
    /// distributed spare, the most columns P further failures take from
    /// one group.
    pub(super) fn guarantees(&self) -> Guarantees {
        let spares = self.children - self.ndisks;
        let mut found = Guarantees {
            repeated: 0,
            spare_clashes: 0,
            worst_loss: 0,
        };
        for group in 0..self.groups {
            let holders = self.holders(group);
            found.repeated += usize::from(most_on_one_child(&holders) > 1);
            found.worst_loss = found.worst_loss.max(top_losses(&holders, self.parity));
            for (row, _) in self.places(group) {
                found.spare_clashes += (0..spares)
                    .filter(|&s| holders.contains(&self.spare_child(row, s)))
                    .count();
            }
            for (&failed, spare) in holders
                .iter()
                .flat_map(|f| (0..spares).map(move |s| (f, s)))
            {
                let after = self.holders_after_rebuild(group, failed, spare);
                assert!(!after.contains(&failed));
                found.worst_loss = found.worst_loss.max(top_losses(&after, self.parity));
            }
        }
        found
    }

    /// The most columns one group loses when `failed` is rebuilt onto spare
    /// 0 and then every choice of `further` other children fails, counted
    /// by trying each choice.
    pub(super) fn worst_loss_by_trial(&self, failed: usize, further: usize) -> usize {
        let survivors: Vec<usize> = (0..self.children).filter(|&c| c != failed).collect();
        let after: Vec<Vec<usize>> = (0..self.groups)
            .map(|g| self.holders_after_rebuild(g, failed, 0))
            .collect();
        let mut worst = 0;
        for_each_choice(&survivors, further, &mut |lost: &[usize]| {
            for holders in &after {
                let count = holders.iter().filter(|c| lost.contains(c)).count();
                worst = worst.max(count);
            }
        });
        worst
    }
}

/// Fits the permutation `next` of a row that a group wraps into from the
/// row before, laid out as `previous`: the group's first columns sit at
/// positions `tail_start..N` of `previous` and continue at positions
/// `0..k` of `next`, k = W - (N - tail_start). Two things must hold, and a
/// permutation drawn independently of the row before breaks them:
/// - `next[0..k]` holds none of the group's children in `previous` (two
///   columns of a group on one child) and none of `previous`'s spare
///   children (a rebuild of the group's column there would land on a child
///   that holds another of its columns);
/// - `next`'s spare positions hold none of the group's children in
///   `previous`, for the same reason seen from the other row.
///
/// Each offending child is swapped with the first child of the later
/// positions that may take its place and leave it somewhere allowed, or,
/// when every child free to go to the start sits on a spare position and
/// the offender belongs to the group, rotated through a middle position
/// and that spare position. The counts always allow one of the two: of
/// the C children, N - tail_start + S are barred from `0..k` and the
/// tail_start others are at least k because W <= N.
pub(super) fn fit_after_wrap(
    previous: &[u8],
    next: &mut [u8],
    ndisks: usize,
    tail_start: usize,
    width: usize,
) {
    let children = next.len();
    assert!(previous.len() == children && tail_start < ndisks && width <= ndisks);
    let k = width - (ndisks - tail_start);
    let head = &previous[tail_start..ndisks];
    let spares_before = &previous[ndisks..children];
    let allowed = |pos: usize, child: u8| {
        if pos < k {
            !head.contains(&child) && !spares_before.contains(&child)
        } else {
            pos < ndisks || !head.contains(&child)
        }
    };
    // The spare positions first: their partners come from the middle only,
    // which leaves the continuation's partners where the count says.
    for pos in (ndisks..children).chain(0..k) {
        if allowed(pos, next[pos]) {
            continue;
        }
        if let Some(q) = (k..children).find(|&q| allowed(pos, next[q]) && allowed(q, next[pos])) {
            next.swap(pos, q);
            continue;
        }
        // The head child goes to a middle position whose child may sit on
        // a spare position, whose free child comes to the start.
        let (q1, q2) = (k..ndisks)
            .flat_map(|q1| (ndisks..children).map(move |q2| (q1, q2)))
            .find(|&(q1, q2)| allowed(pos, next[q2]) && allowed(q2, next[q1]))
            .expect("a wrapped row can always be fitted: W <= N");
        let (at_pos, at_q1, at_q2) = (next[pos], next[q1], next[q2]);
        (next[pos], next[q1], next[q2]) = (at_q2, at_pos, at_q1);
    }
    assert!((0..children).all(|pos| allowed(pos, next[pos])));
}

/// How many columns of a group share its most loaded child.
fn most_on_one_child(holders: &[usize]) -> usize {
    let mut sorted = holders.to_vec();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .map(<[usize]>::len)
        .max()
        .unwrap_or(0)
}

/// The most columns `failures` failed children can take from a group held
/// by `holders`: the sum of the `failures` largest counts per child.
fn top_losses(holders: &[usize], failures: usize) -> usize {
    let mut sorted = holders.to_vec();
    sorted.sort_unstable();
    let mut counts: Vec<usize> = sorted.chunk_by(|a, b| a == b).map(<[usize]>::len).collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts.iter().take(failures).sum()
}

/// Calls `visit` with every choice of `k` of `items`, in order.
fn for_each_choice(items: &[usize], k: usize, visit: &mut dyn FnMut(&[usize])) {
    fn walk(items: &[usize], k: usize, chosen: &mut Vec<usize>, visit: &mut dyn FnMut(&[usize])) {
        if chosen.len() == k {
            return visit(chosen);
        }
        for (i, &item) in items.iter().enumerate() {
            chosen.push(item);
            walk(&items[i + 1..], k, chosen, visit);
            chosen.pop();
        }
    }
    walk(items, k, &mut Vec::with_capacity(k), visit);
}
