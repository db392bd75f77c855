//! An array part way through a reshape: two geometries at once.
//!
//! md reshapes an array in place, moving data from the old geometry (the
//! superblock's level, layout, chunk and `raid_disks − delta_disks`) to the
//! new one (`new_level`, `new_layout`, `new_chunk`, `raid_disks`), and records
//! how far it got in `reshape_position`, an array sector. Every sector on the
//! done side of that point lives in the new geometry (at the members'
//! `data_offset + new_offset`), every other sector still in the old one (at
//! `data_offset`): raid5.c's `make_stripe_request` routes each sector so, and
//! this module does the same, as pure code.
//!
//! A forward reshape (growing, or same size run forwards) has the new
//! geometry below the point; a backward one (shrinking, or same size run
//! backwards) above it. With parity (raid4/5/6) the point always falls on
//! a stripe boundary of the new geometry (the kernel refuses to start
//! otherwise), but not always of the old one: the old stripe that straddles it still holds its parity
//! over all of its strips, whose old copies are intact (md never writes
//! new-geometry data over old data it has not yet moved), so it is served
//! whole, but only its part on the old side is ever read from it.
//! [`Reshaping::run_end`] is where a piece of I/O must stop so that it
//! never crosses the point. A raid10 (raid10.c's raid10_find_phys routes
//! by the same test) may stop anywhere: its chunk at the point straddles
//! it in both geometries, each side served only its part.
//!
//! Stripes are numbered in array order across both sides: the done side's
//! stripes first for a forward reshape, the old side's first for a
//! backward one. The numbering holds for one reshape position; a live
//! reshape that moves the point builds a new `Reshaping`.

use super::{Geometry, GeometryError, Located, Place, StripeMap};

/// The two geometries of a reshape and the point between them.
#[derive(Clone, Debug)]
pub struct Reshaping {
    old: Geometry,
    new: Geometry,
    /// md's reshape_position: the first array sector not yet reshaped
    /// (forward), or the lowest one reshaped (backward).
    position_sectors: u64,
    backwards: bool,
    /// Per role, what to add to an old-geometry member sector and to a
    /// new-geometry one: members' data start at the lower of their two
    /// offsets, and each side's places are shifted from there.
    old_shift_sectors: Vec<u64>,
    new_shift_sectors: Vec<u64>,
    /// Stripes of the side that comes first in array order, and the first
    /// stripe of the second side in its own geometry's numbering.
    first_side_stripes: u64,
    second_side_first_stripe: u64,
    array_sectors: u64,
    /// What the mapping covers: the array, and during a grow also the new
    /// rows already moved past its end, which only the job writes.
    extent_sectors: u64,
}

/// What a [`Reshaping`] is built from, besides the two geometries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapePoint {
    pub position_sectors: u64,
    pub backwards: bool,
    /// Per role (as many as the larger geometry has): the member's data
    /// offset in the old geometry and in the new one, in sectors.
    pub old_offset_sectors: Vec<u64>,
    pub new_offset_sectors: Vec<u64>,
}

/// Which geometry a sector or stripe is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Old,
    New,
}

impl Reshaping {
    pub fn new(
        old: Geometry,
        new: Geometry,
        point: ReshapePoint,
    ) -> Result<Reshaping, GeometryError> {
        let roles = old.raid_disks().max(new.raid_disks());
        if point.old_offset_sectors.len() != roles || point.new_offset_sectors.len() != roles {
            return Err(GeometryError::Invalid(format!(
                "reshape needs the data offsets of {roles} roles"
            )));
        }
        // md serves the smaller of the two sizes until the reshape ends
        // (raid5_size with the fewer data disks, both chunks).
        let array_sectors = old.array_sectors().min(new.array_sectors());
        let position = point.position_sectors;
        // A grow moves rows past the old end too (zeroes, with their
        // parity), until the new geometry's end.
        let limit = old.array_sectors().max(new.array_sectors());
        if position > limit {
            return Err(GeometryError::Invalid(format!(
                "reshape position {position} is beyond the array's {limit} sectors"
            )));
        }
        let extent_sectors = if point.backwards {
            array_sectors
        } else {
            array_sectors.max(position.min(new.array_sectors()))
        };
        // With parity, the done side must be whole stripes of the new
        // geometry, or a new stripe would be half written (raid5_run's
        // "reshape_position not on a stripe boundary"). A raid10 chunk has
        // only copies, so md records any point (raid10.c's reshape_request
        // may stop mid-chunk); the chunk holding it is served in pieces.
        let new_stripe_start = |sector: u64| -> u64 {
            if sector >= new.array_sectors() {
                return sector;
            }
            new.stripe(new.stripe_of(sector)).array_sector
        };
        if new.level().has_parity()
            && position < extent_sectors
            && new_stripe_start(position) != position
        {
            return Err(GeometryError::Invalid(format!(
                "reshape position {position} is not on a stripe boundary of the new geometry"
            )));
        }
        let base: Vec<u64> = (0..roles)
            .map(|r| point.old_offset_sectors[r].min(point.new_offset_sectors[r]))
            .collect();
        let old_shift_sectors = (0..roles)
            .map(|r| point.old_offset_sectors[r] - base[r])
            .collect();
        let new_shift_sectors = (0..roles)
            .map(|r| point.new_offset_sectors[r] - base[r])
            .collect();
        let stripes_below = |g: &Geometry| -> u64 {
            let below = position.min(extent_sectors);
            if below == 0 {
                0
            } else {
                g.stripe_of((below - 1).min(g.array_sectors() - 1)) + 1
            }
        };
        let (first_side_stripes, second_side_first_stripe) = if point.backwards {
            // Old below the point (its last stripe may straddle it), new above.
            let first = stripes_below(&old);
            let second = if position < extent_sectors {
                new.stripe_of(position)
            } else {
                new.stripe_count()
            };
            (first, second)
        } else {
            // New below the point, old from the stripe that holds it.
            let first = stripes_below(&new);
            let second = if position < extent_sectors {
                old.stripe_of(position)
            } else {
                old.stripe_count()
            };
            (first, second)
        };
        let reshaping = Reshaping {
            old,
            new,
            position_sectors: position,
            backwards: point.backwards,
            old_shift_sectors,
            new_shift_sectors,
            first_side_stripes,
            second_side_first_stripe,
            array_sectors,
            extent_sectors,
        };
        debug_assert!(reshaping.stripe_count() > 0 || array_sectors == 0);
        Ok(reshaping)
    }

    /// How many stripes, in this numbering, lie on the done side of a
    /// forward reshape: a member rebuilt along with the reshape holds
    /// exactly these.
    pub fn done_stripes(&self) -> u64 {
        assert!(
            !self.backwards,
            "a member is rebuilt only along a forward reshape"
        );
        self.first_side_stripes
    }

    pub fn old(&self) -> &Geometry {
        &self.old
    }

    pub fn new_geometry(&self) -> &Geometry {
        &self.new
    }

    pub fn position_sectors(&self) -> u64 {
        self.position_sectors
    }

    pub fn backwards(&self) -> bool {
        self.backwards
    }

    pub fn raid_disks(&self) -> usize {
        self.old.raid_disks().max(self.new.raid_disks())
    }

    pub fn array_sectors(&self) -> u64 {
        self.array_sectors
    }

    /// The side an array sector is on.
    pub fn side_of(&self, array_sector: u64) -> Side {
        let below = array_sector < self.position_sectors;
        if below != self.backwards {
            Side::New
        } else {
            Side::Old
        }
    }

    fn first_side(&self) -> Side {
        if self.backwards {
            Side::Old
        } else {
            Side::New
        }
    }

    fn geometry(&self, side: Side) -> &Geometry {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// The sectors md's write-intent bitmap counts stripe `stripe` by: its
    /// resync unit in the geometry of its own side (raid5.c marks a stripe
    /// by its sector in the layout it is written in, old or new).
    pub fn bitmap_sectors(&self, stripe: u64) -> std::ops::Range<u64> {
        let (side, own) = self.split(stripe);
        let g = self.geometry(side);
        g.resync_position_sectors(own)..g.resync_position_sectors(own + 1)
    }

    /// The sectors the mapping covers (see the field).
    pub fn extent_sectors(&self) -> u64 {
        self.extent_sectors
    }

    /// How many of the second side's stripes lie within the mapping.
    fn second_side_stripes(&self) -> u64 {
        let g = self.geometry(self.second_side());
        if self.position_sectors >= self.extent_sectors {
            return 0;
        }
        let last = g.stripe_of(self.extent_sectors - 1);
        last + 1 - self.second_side_first_stripe
    }

    fn second_side(&self) -> Side {
        match self.first_side() {
            Side::Old => Side::New,
            Side::New => Side::Old,
        }
    }

    pub fn stripe_count(&self) -> u64 {
        self.first_side_stripes + self.second_side_stripes()
    }

    /// The side and the side's own number of stripe `stripe`.
    fn split(&self, stripe: u64) -> (Side, u64) {
        if stripe < self.first_side_stripes {
            (self.first_side(), stripe)
        } else {
            (
                self.second_side(),
                stripe - self.first_side_stripes + self.second_side_first_stripe,
            )
        }
    }

    /// Stripe `own` of `side`, in this numbering.
    fn join(&self, side: Side, own: u64) -> u64 {
        if side == self.first_side() {
            own
        } else {
            own - self.second_side_first_stripe + self.first_side_stripes
        }
    }

    fn shift(&self, side: Side) -> &[u64] {
        match side {
            Side::Old => &self.old_shift_sectors,
            Side::New => &self.new_shift_sectors,
        }
    }

    fn shifted(&self, side: Side, place: Place) -> Place {
        Place {
            member: place.member,
            member_sector: place.member_sector + self.shift(side)[place.member],
        }
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        let side = self.side_of(array_sector);
        self.join(side, self.geometry(side).stripe_of(array_sector))
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let (side, own) = self.split(stripe);
        let mut map = self.geometry(side).stripe(own);
        map.stripe = stripe;
        for strip in &mut map.data {
            for copy in &mut strip.copies {
                *copy = self.shifted(side, *copy);
            }
        }
        map.p = map.p.map(|p| self.shifted(side, p));
        map.q = map.q.map(|q| self.shifted(side, q));
        map
    }

    pub fn locate(&self, array_sector: u64) -> Option<Located> {
        let side = self.side_of(array_sector);
        let mut located = self.geometry(side).locate(array_sector)?;
        located.stripe = self.join(side, located.stripe);
        located.place = self.shifted(side, located.place);
        Some(located)
    }

    /// The end of the run of array sectors from `array_sector` that one
    /// stripe maps: the stripe's end, or the reshape point where the stripe
    /// straddles it.
    pub fn run_end(&self, array_sector: u64) -> u64 {
        let map_end = {
            let map = self.stripe(self.stripe_of(array_sector));
            map.array_sector + map.data_sectors()
        };
        let end = if array_sector < self.position_sectors {
            map_end.min(self.position_sectors)
        } else {
            map_end
        };
        end.min(self.extent_sectors)
    }

    /// One line for messages: "raid5 reshape from 4 to 5 members, at
    /// 59.25 MiB of 189.00 MiB".
    pub fn describe(&self) -> String {
        let mut changes = Vec::new();
        if self.old.level() != self.new.level() {
            changes.push(format!("{} to {}", self.old.level(), self.new.level()));
        }
        if self.old.raid_disks() != self.new.raid_disks() {
            changes.push(format!(
                "from {} to {} members",
                self.old.raid_disks(),
                self.new.raid_disks()
            ));
        }
        let mib = |sectors: u64| sectors as f64 / 2048.0;
        format!(
            "a {} reshape{}{} is in progress, at {:.2} MiB of {:.2} MiB",
            self.old.level(),
            if changes.is_empty() { "" } else { " " },
            changes.join(", "),
            mib(self.position_sectors),
            mib(self.array_sectors),
        )
    }

    pub fn survives(&self, missing: &[bool]) -> bool {
        assert_eq!(missing.len(), self.raid_disks());
        self.old.survives(&missing[..self.old.raid_disks()])
            && self.new.survives(&missing[..self.new.raid_disks()])
    }

    pub fn max_failed_members(&self) -> usize {
        self.old
            .max_failed_members()
            .min(self.new.max_failed_members())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{GeometryParams, Level};

    fn raid(level: Level, layout: u32, chunk_sectors: u64, disks: u32) -> Geometry {
        Geometry::new(&GeometryParams {
            level,
            layout,
            chunk_sectors,
            raid_disks: disks,
            dev_sectors: 4096,
            member_data_sectors: vec![4096; disks as usize],
            raid0_layout_feature: false,
        })
        .unwrap()
    }

    /// Where one array sector lives according to a plain geometry.
    fn place_of(g: &Geometry, sector: u64) -> Place {
        let map = g.stripe(g.stripe_of(sector));
        let in_stripe = sector - map.array_sector;
        let strip = &map.data[(in_stripe / map.strip_sectors) as usize];
        Place {
            member: strip.copies[0].member,
            member_sector: strip.copies[0].member_sector + in_stripe % map.strip_sectors,
        }
    }

    fn reshaping(old: &Geometry, new: &Geometry, position: u64, backwards: bool) -> Reshaping {
        let roles = old.raid_disks().max(new.raid_disks());
        Reshaping::new(
            old.clone(),
            new.clone(),
            ReshapePoint {
                position_sectors: position,
                backwards,
                // The new data start 1024 sectors before the old (a grow).
                old_offset_sectors: vec![2048; roles],
                new_offset_sectors: vec![1024; roles],
            },
        )
        .unwrap()
    }

    /// Every sector maps, by stripe and by locate, to its side's geometry,
    /// shifted by that side's offset; runs tile the array without crossing
    /// the point.
    fn check(r: &Reshaping) {
        let (old, new) = (r.old().clone(), r.new_geometry().clone());
        let mut sector = 0;
        let mut stripes_seen = std::collections::BTreeSet::new();
        while sector < r.array_sectors() {
            let end = r.run_end(sector);
            assert!(end > sector);
            let crosses = sector < r.position_sectors() && end > r.position_sectors();
            assert!(!crosses, "run {sector}..{end} crosses the point");
            let map = r.stripe(r.stripe_of(sector));
            stripes_seen.insert(map.stripe);
            for s in sector..end {
                let (side, shift) = match r.side_of(s) {
                    Side::Old => (&old, 1024),
                    Side::New => (&new, 0),
                };
                let want = place_of(side, s);
                let got = place_of(&Geometry::Reshaping(Box::new(r.clone())), s);
                assert_eq!(got.member, want.member, "sector {s}");
                assert_eq!(got.member_sector, want.member_sector + shift, "sector {s}");
                // Mirrors have no single place to locate.
                if let Some(located) = r.locate(s) {
                    assert_eq!(located.stripe, map.stripe);
                    assert_eq!(
                        located.place.member_sector + located.in_strip_sectors,
                        want.member_sector + shift
                    );
                }
            }
            sector = end;
        }
        assert_eq!(stripes_seen.len() as u64, r.stripe_count());
        assert_eq!(*stripes_seen.last().unwrap() + 1, r.stripe_count());
    }

    #[test]
    fn a_grow_maps_each_side_by_its_geometry() {
        let old = raid(Level::Raid5, 2, 128, 4);
        let new = raid(Level::Raid5, 2, 128, 5);
        let new_stripe = 128 * 4;
        for position in [
            0,
            new_stripe,
            7 * new_stripe,
            18 * new_stripe,
            old.array_sectors(),
        ] {
            let r = reshaping(&old, &new, position, false);
            assert_eq!(r.array_sectors(), old.array_sectors());
            check(&r);
        }
    }

    #[test]
    fn chunk_layout_and_level_changes_map_each_side() {
        let cases = [
            (raid(Level::Raid5, 2, 64, 4), raid(Level::Raid5, 2, 128, 4)),
            (raid(Level::Raid5, 2, 128, 4), raid(Level::Raid5, 1, 128, 4)),
            (
                raid(Level::Raid6, 18, 128, 5),
                raid(Level::Raid6, 2, 128, 5),
            ),
            (raid(Level::Raid6, 2, 64, 6), raid(Level::Raid6, 2, 64, 5)),
        ];
        for (old, new) in cases {
            let stripe = new.stripe(0).data_sectors();
            for backwards in [false, true] {
                for k in [0, 1, 5, 11] {
                    let position = (k * stripe).min(old.array_sectors().min(new.array_sectors()));
                    check(&reshaping(&old, &new, position, backwards));
                }
            }
        }
    }

    #[test]
    fn a_point_off_the_new_stripes_is_refused() {
        let old = raid(Level::Raid5, 2, 128, 4);
        let new = raid(Level::Raid5, 2, 128, 5);
        let err = Reshaping::new(
            old,
            new,
            ReshapePoint {
                position_sectors: 384,
                backwards: false,
                old_offset_sectors: vec![2048; 5],
                new_offset_sectors: vec![1024; 5],
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("stripe boundary"), "{err}");
    }

    #[test]
    fn raid10_maps_each_side_at_any_point() {
        let near2 = 0x102;
        let offset2 = 0x10201;
        let cases = [
            (
                raid(Level::Raid10, near2, 128, 4),
                raid(Level::Raid10, near2, 128, 5),
            ),
            (
                raid(Level::Raid10, near2, 64, 4),
                raid(Level::Raid10, near2, 64, 6),
            ),
            (
                raid(Level::Raid10, offset2, 64, 4),
                raid(Level::Raid10, offset2, 64, 5),
            ),
            (
                raid(Level::Raid10, near2, 128, 4),
                raid(Level::Raid10, offset2, 128, 4),
            ),
            (
                raid(Level::Raid10, near2, 128, 4),
                raid(Level::Raid10, near2, 64, 4),
            ),
        ];
        for (old, new) in cases {
            let size = old.array_sectors().min(new.array_sectors());
            for backwards in [false, true] {
                for position in [0, 8, 100, 128, 1000, 3 * 128 + 40, size] {
                    check(&reshaping(&old, &new, position, backwards));
                }
            }
        }
    }

    #[test]
    fn a_raid10_chunk_at_the_point_is_served_in_two_pieces() {
        let r = reshaping(
            &raid(Level::Raid10, 0x102, 128, 4),
            &raid(Level::Raid10, 0x102, 128, 5),
            200,
            false,
        );
        assert_eq!(r.run_end(128), 200);
        assert_eq!(r.run_end(200), 256);
        assert_eq!(r.side_of(199), Side::New);
        assert_eq!(r.side_of(200), Side::Old);
        assert_ne!(r.stripe_of(199), r.stripe_of(200));
    }

    #[test]
    fn the_straddling_old_stripe_is_read_only_past_the_point() {
        // Old stripes hold 384 sectors, new ones 512: the point at 512
        // falls inside old stripe 1 (384..768).
        let r = reshaping(
            &raid(Level::Raid5, 2, 128, 4),
            &raid(Level::Raid5, 2, 128, 5),
            512,
            false,
        );
        assert_eq!(r.run_end(0), 512);
        assert_eq!(r.run_end(512), 768);
        let map = r.stripe(r.stripe_of(512));
        assert_eq!(map.array_sector, 384);
        assert_eq!(r.stripe_of(511), 0);
        assert_eq!(r.stripe_of(512), 1);
    }
}
