//! dRAID: declustered parity with distributed spares, as pure address
//! mapping.
//!
//! The array has C children. Each child's space is cut into *slices*, all
//! children's slices at the same height forming one slice of the array. A
//! slice is a grid of `rows_per_slice` rows of 16 MiB ([`ROW_SECTORS`]) by C
//! positions; a permutation row, rotated by the slice number, says which
//! child sits at each position. The first N = C - S positions hold
//! redundancy groups of W = D + P columns, packed row after row (a group may
//! wrap from the end of one row to the start of the next); the last S
//! positions are the distributed spares. Because each slice shuffles the
//! children differently, rebuilding one child reads a little from every
//! survivor and writes a little to every spare column, instead of reading
//! whole disks and writing one.
//!
//! The slice, group, permutation and spare rules follow the published
//! description of OpenZFS's dRAID; the permutation maps are uraid's own
//! (see [`table`]). How a group is cut into stripes is uraid's: a group is
//! 16 MiB tall per column and is cut into `ROW_SECTORS / chunk_sectors`
//! stripes of one chunk per column, so that the rest of uraid sees dRAID as
//! an array of fixed-width stripes like raid5/6.
//!
//! In a stripe, columns 0..P hold the parity P, Q and R, and the data columns
//! follow in array order. Data column j carries coefficient exponent j:
//! Q = sum of 2^j * D_j and R = sum of 4^j * D_j over GF(2^8).

mod perms;
mod table;

#[cfg(test)]
mod tests;

#[cfg(test)]
use perms::nperms;
pub use perms::PermMap;

use std::ops::Range;

use super::{DataStrip, GeometryError, Located, Place, StripeMap};

/// The height of a row: every group column is this tall on its child, so a
/// group can hold a 16 MiB block even with one data column.
pub const ROW_SECTORS: u64 = 32768;

/// The most distributed spares an array may have.
pub const SPARES_MAX: usize = 100;

/// What a dRAID array is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraidParams {
    /// Parity columns per group, 1 to 3.
    pub parity: usize,
    /// Data columns per group (D).
    pub data: usize,
    /// Children of the array (C), 2 to 255.
    pub children: usize,
    /// Distributed spares (S), 0 to 100.
    pub spares: usize,
    /// Height of one stripe's strip: a power of two of at least 4 KiB and
    /// at most a row.
    pub chunk_sectors: u64,
    /// Usable data sectors on each child.
    pub dev_sectors: u64,
}

/// What one child holds at one member sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holding {
    /// Column `column` (0..P parity, then data) of group `group` of slice
    /// `slice`, in stripe `stripe`.
    Column {
        slice: u64,
        group: usize,
        column: usize,
        stripe: u64,
    },
    /// Distributed spare `s`.
    Spare(usize),
}

/// The place of one stripe inside its slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StripeAt {
    slice: u64,
    /// The row of the slice where the stripe's group starts.
    row: usize,
    /// The stripe's index within its group, 0..stripes_per_group.
    k: u64,
    group: usize,
}

#[derive(Clone, Debug)]
pub struct Draid {
    parity: usize,
    data: usize,
    children: usize,
    spares: usize,
    chunk_sectors: u64,
    ngroups: usize,
    rows_per_slice: usize,
    slices: u64,
    /// `first_group[r]` is the first group that starts in row r, and
    /// `first_group[rows_per_slice]` is ngroups. Every row has a group start
    /// because no group is wider than a row.
    first_group: Vec<usize>,
    perms: &'static PermMap,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn validate(p: &DraidParams) -> Result<(), GeometryError> {
    let invalid = |text: String| Err(GeometryError::Invalid(text));
    if !(1..=3).contains(&p.parity) {
        return invalid(format!("dRAID parity must be 1 to 3, got {}", p.parity));
    }
    if p.data == 0 {
        return invalid("dRAID needs at least one data column per group".into());
    }
    if !(2..=255).contains(&p.children) {
        return invalid(format!("dRAID needs 2 to 255 children, got {}", p.children));
    }
    if p.spares > SPARES_MAX {
        return invalid(format!(
            "dRAID allows at most {SPARES_MAX} distributed spares, got {}",
            p.spares
        ));
    }
    if p.data + p.parity + p.spares > p.children {
        return invalid(format!(
            "dRAID groups of {} data and {} parity with {} spares need at least {} children, got {}",
            p.data,
            p.parity,
            p.spares,
            p.data + p.parity + p.spares,
            p.children
        ));
    }
    if !p.chunk_sectors.is_power_of_two() || p.chunk_sectors < 8 || p.chunk_sectors > ROW_SECTORS {
        return invalid(format!(
            "dRAID chunk must be a power of two from 8 to {ROW_SECTORS} sectors, got {}",
            p.chunk_sectors
        ));
    }
    Ok(())
}

impl Draid {
    pub fn new(p: &DraidParams) -> Result<Draid, GeometryError> {
        validate(p)?;
        let width = p.data + p.parity;
        let ndisks = p.children - p.spares;
        let lcm = width / gcd(width, ndisks) * ndisks;
        let ngroups = lcm / width;
        let rows_per_slice = lcm / ndisks;
        let devslice_sectors = rows_per_slice as u64 * ROW_SECTORS;
        let slices = p.dev_sectors / devslice_sectors;
        if slices == 0 {
            return Err(GeometryError::Invalid(format!(
                "dRAID children of {} sectors are smaller than one slice of {devslice_sectors} sectors",
                p.dev_sectors
            )));
        }
        let first_group = (0..=rows_per_slice)
            .map(|r| (r * ndisks).div_ceil(width))
            .collect::<Vec<_>>();
        debug_assert_eq!(first_group[rows_per_slice], ngroups);
        debug_assert!(first_group.windows(2).all(|w| w[0] < w[1]));
        Ok(Draid {
            parity: p.parity,
            data: p.data,
            children: p.children,
            spares: p.spares,
            chunk_sectors: p.chunk_sectors,
            ngroups,
            rows_per_slice,
            slices,
            first_group,
            perms: perms::map_for(p.children)?,
        })
    }

    pub fn raid_disks(&self) -> usize {
        self.children
    }

    pub fn parity(&self) -> usize {
        self.parity
    }

    pub fn data(&self) -> usize {
        self.data
    }

    pub fn spares(&self) -> usize {
        self.spares
    }

    pub fn chunk_sectors(&self) -> u64 {
        self.chunk_sectors
    }

    pub fn groups_per_slice(&self) -> usize {
        self.ngroups
    }

    pub fn rows_per_slice(&self) -> usize {
        self.rows_per_slice
    }

    pub fn slices(&self) -> u64 {
        self.slices
    }

    /// The height of one slice on each child.
    pub fn devslice_sectors(&self) -> u64 {
        self.rows_per_slice as u64 * ROW_SECTORS
    }

    fn width(&self) -> usize {
        self.data + self.parity
    }

    /// Positions of a row that hold group columns (C - S).
    fn ndisks(&self) -> usize {
        self.children - self.spares
    }

    fn stripes_per_group(&self) -> u64 {
        ROW_SECTORS / self.chunk_sectors
    }

    fn stripes_per_slice(&self) -> u64 {
        self.ngroups as u64 * self.stripes_per_group()
    }

    pub fn array_sectors(&self) -> u64 {
        self.stripe_count() * self.data as u64 * self.chunk_sectors
    }

    pub fn stripe_count(&self) -> u64 {
        self.slices * self.stripes_per_slice()
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        array_sector / (self.data as u64 * self.chunk_sectors)
    }

    pub fn max_failed_members(&self) -> usize {
        self.parity
    }

    /// Every group has P parity columns on P different children, so any P
    /// lost children leave each group readable, and P + 1 may not.
    pub fn survives(&self, missing: &[bool]) -> bool {
        assert_eq!(missing.len(), self.children);
        missing.iter().filter(|m| **m).count() <= self.parity
    }

    /// The child at position `pos` of slice `slice`: the slice's base row,
    /// relabelled by the slice's rotation.
    fn child_at(&self, slice: u64, pos: usize) -> usize {
        let (row, rotation) = self.permutation_of(slice);
        (self.perms.row(row)[pos] as usize + rotation) % self.children
    }

    /// The base row and rotation of slice `slice`. Slices run through every
    /// rotation of a row before moving to the next row.
    fn permutation_of(&self, slice: u64) -> (usize, usize) {
        let cycle = (self.perms.nperms() * self.children) as u64;
        let offset = (slice % cycle) as usize;
        (offset / self.children, offset % self.children)
    }

    /// The position of `child` in slice `slice`.
    fn position_of(&self, slice: u64, child: usize) -> usize {
        let (row, rotation) = self.permutation_of(slice);
        let unrotated = (child + self.children - rotation) % self.children;
        self.perms.position(row, unrotated)
    }

    /// Slices per band: as many as there are children, or fewer in the
    /// last band. The stripes of a band take its slices in turn, so that
    /// work in stripe order (a rebuild's batches) meets every slice of the
    /// band at once, and with them the C different children that hold
    /// their spare columns: a rebuild onto a distributed spare writes to
    /// every survivor, not to one slice's spare child after another.
    fn band_of(&self, slice: u64) -> (u64, u64) {
        let full = self.children as u64;
        let first = slice / full * full;
        (first, full.min(self.slices - first))
    }

    fn stripe_at(&self, stripe: u64) -> StripeAt {
        let full = self.children as u64 * self.stripes_per_slice();
        let (band_first, band_slices) = self.band_of(stripe / full * self.children as u64);
        let in_band = stripe % full;
        let slice = band_first + in_band % band_slices;
        let within = in_band / band_slices;
        let per_group = self.stripes_per_group();
        // Stripes of a slice are ordered by the row their group starts in,
        // then by height in the group, then by group.
        let row = self.first_group[1..].partition_point(|&g| g as u64 * per_group <= within);
        let local = within - self.first_group[row] as u64 * per_group;
        let in_row = (self.first_group[row + 1] - self.first_group[row]) as u64;
        let at = StripeAt {
            slice,
            row,
            k: local / in_row,
            group: self.first_group[row] + (local % in_row) as usize,
        };
        debug_assert_eq!(self.stripe_number(at.slice, at.group, at.k), stripe);
        at
    }

    fn stripe_number(&self, slice: u64, group: usize, k: u64) -> u64 {
        let row = group * self.width() / self.ndisks();
        let in_row = (self.first_group[row + 1] - self.first_group[row]) as u64;
        let within = self.first_group[row] as u64 * self.stripes_per_group()
            + k * in_row
            + (group - self.first_group[row]) as u64;
        let (band_first, band_slices) = self.band_of(slice);
        band_first * self.stripes_per_slice() + within * band_slices + (slice - band_first)
    }

    /// Where column `column` of stripe `at` starts.
    fn column_place(&self, at: StripeAt, column: usize) -> Place {
        let cell = at.group * self.width() + column;
        let row = cell / self.ndisks();
        debug_assert!(row == at.row || row == at.row + 1);
        Place {
            member: self.child_at(at.slice, cell % self.ndisks()),
            member_sector: at.slice * self.devslice_sectors()
                + row as u64 * ROW_SECTORS
                + at.k * self.chunk_sectors,
        }
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        assert!(
            stripe < self.stripe_count(),
            "stripe {stripe} beyond the array"
        );
        let at = self.stripe_at(stripe);
        let parity = |i: usize| (i < self.parity).then(|| self.column_place(at, i));
        let data = (0..self.data)
            .map(|j| DataStrip {
                copies: vec![self.column_place(at, self.parity + j)],
                q_exponent: j as u8,
            })
            .collect();
        StripeMap {
            stripe,
            array_sector: stripe * self.data as u64 * self.chunk_sectors,
            strip_sectors: self.chunk_sectors,
            data,
            p: parity(0),
            q: parity(1),
            r: parity(2),
        }
    }

    /// The data strip holding `array_sector`, without building the stripe.
    pub fn locate(&self, array_sector: u64) -> Located {
        assert!(array_sector < self.array_sectors());
        let stripe = self.stripe_of(array_sector);
        let in_stripe = array_sector - stripe * self.data as u64 * self.chunk_sectors;
        let data_index = (in_stripe / self.chunk_sectors) as usize;
        Located {
            stripe,
            data_index,
            place: self.column_place(self.stripe_at(stripe), self.parity + data_index),
            strip_sectors: self.chunk_sectors,
            in_strip_sectors: in_stripe % self.chunk_sectors,
        }
    }

    /// Where resync and recovery stand after `stripe` stripes, in member
    /// sectors as md counts them (recovery_offset, resync_offset): the
    /// stripe's share of the used space, stripe_count() being its end. The
    /// stripes of a band take its slices in turn, so a stripe's own sectors
    /// do not grow with its number; this share does, strictly, which is
    /// all a resumed job needs to find its stripe again.
    pub fn resync_position_sectors(&self, stripe: u64) -> u64 {
        let total = self.slices * self.devslice_sectors();
        let stripe = stripe.min(self.stripe_count());
        (u128::from(stripe) * u128::from(total) / u128::from(self.stripe_count())) as u64
    }

    /// The stripe a job resumes at from `position` (the inverse of
    /// `resync_position_sectors`), as `Geometry::stripe_at_resync_position`
    /// finds it, for the tests of this module.
    #[cfg(test)]
    pub(super) fn stripe_at_resync_position_for_test(&self, position: u64) -> u64 {
        let (mut low, mut high) = (0u64, self.stripe_count());
        while low < high {
            let mid = low + (high - low) / 2;
            if self.resync_position_sectors(mid) < position {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The first member sector of stripe `stripe`'s P column, which always
    /// lies in the row its group starts in (a data column may wrap into the
    /// next row).
    fn first_sector(&self, at: StripeAt) -> u64 {
        at.slice * self.devslice_sectors() + at.row as u64 * ROW_SECTORS + at.k * self.chunk_sectors
    }

    /// The member sectors a write to `stripe` touches, as one range that
    /// starts at its resync position: one chunk, or for a group that wraps
    /// into the next row everything up to the end of its chunk there.
    pub fn bitmap_sectors(&self, stripe: u64) -> Range<u64> {
        let at = self.stripe_at(stripe);
        let start = self.first_sector(at);
        let start_pos = at.group * self.width() % self.ndisks();
        let wraps = start_pos + self.width() > self.ndisks();
        let end = start + self.chunk_sectors + if wraps { ROW_SECTORS } else { 0 };
        start..end
    }

    /// The slice holding `member_sector`.
    pub fn slice_of(&self, member_sector: u64) -> u64 {
        assert!(
            member_sector < self.slices * self.devslice_sectors(),
            "member sector {member_sector} beyond the used space"
        );
        member_sector / self.devslice_sectors()
    }

    /// The child that holds distributed spare `s` at `member_sector`. A
    /// spare keeps the member sectors of what it replaces, so no table of
    /// where rebuilt data went is needed.
    pub fn spare_child(&self, s: usize, member_sector: u64) -> usize {
        assert!(s < self.spares, "spare {s} of {}", self.spares);
        self.child_at(self.slice_of(member_sector), self.children - 1 - s)
    }

    /// What `child` holds at `member_sector`.
    pub fn columns_at(&self, child: usize, member_sector: u64) -> Holding {
        assert!(child < self.children);
        let slice = self.slice_of(member_sector);
        let pos = self.position_of(slice, child);
        if pos >= self.ndisks() {
            return Holding::Spare(self.children - 1 - pos);
        }
        let in_slice = member_sector - slice * self.devslice_sectors();
        let row = (in_slice / ROW_SECTORS) as usize;
        let k = in_slice % ROW_SECTORS / self.chunk_sectors;
        let cell = row * self.ndisks() + pos;
        let group = cell / self.width();
        Holding::Column {
            slice,
            group,
            column: cell % self.width(),
            stripe: self.stripe_number(slice, group, k),
        }
    }

    /// The sectors each child reads and writes to rebuild child `failed`
    /// over the slices `slices`: every group with a column on `failed` is
    /// read from its other columns and written to distributed spare 0, or,
    /// without distributed spares, back to `failed` (a replacement disk).
    /// Indexed by child: (read sectors, written sectors).
    pub fn rebuild_load(&self, failed: usize, slices: Range<u64>) -> Vec<(u64, u64)> {
        assert!(failed < self.children && slices.end <= self.slices);
        let mut load = vec![(0u64, 0u64); self.children];
        let (width, ndisks) = (self.width(), self.ndisks());
        for slice in slices {
            let pos = self.position_of(slice, failed);
            if pos >= ndisks {
                continue;
            }
            let target = if self.spares > 0 {
                self.child_at(slice, self.children - 1)
            } else {
                failed
            };
            for row in 0..self.rows_per_slice {
                let group = (row * ndisks + pos) / width;
                for cell in group * width..(group + 1) * width {
                    let child = self.child_at(slice, cell % ndisks);
                    if child != failed {
                        load[child].0 += ROW_SECTORS;
                    }
                }
                load[target].1 += ROW_SECTORS;
            }
        }
        load
    }
}
