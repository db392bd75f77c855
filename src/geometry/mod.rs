//! md's address mapping, as pure code.
//!
//! A [`Geometry`] says where every array sector lives on the members, for each md
//! level and layout, exactly as the Linux kernel lays it out (raid0.c, raid1.c,
//! raid10.c, raid5.c). It does no I/O. The unit it hands out is the *stripe*: the
//! smallest group of member chunks that is read, written and kept consistent
//! together (one row across the members for raid0/4/5/6, one chunk and its copies
//! for raid10, one extent and its mirrors for raid1 and linear). Everything above
//! (offline copy, the live engine, rebuild) works stripe by stripe, so it never
//! needs to know which level it is serving.
//!
//! dRAID, uraid's declustered level (see [`draid`]), is served through the
//! same [`Geometry`] and the same stripe maps, so the layers above need not
//! know it is not md's.
//!
//! Member sectors are relative to each member's data offset.

mod draid;
pub mod draid_spec;
mod layout_names;
mod linear;
mod raid0;
mod raid1;
mod raid10;
mod raid456;
mod reshape;

pub use draid::{Draid, DraidParams, Holding, ROW_SECTORS as DRAID_ROW_SECTORS};
pub use draid_spec::DraidSpec;
pub use layout_names::{layout_from_name, layout_name, level_from_name, level_name};
pub use raid0::Raid0Layout;
pub use raid10::Raid10;
pub use raid456::{LEFT_SYMMETRIC, PARITY_N};
pub use reshape::{ReshapePoint, Reshaping, Side};

use std::fmt;

/// md's RAID levels, with the numbers md stores in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Level {
    Linear,
    Raid0,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
    /// uraid's declustered RAID with one, two or three parity columns per
    /// group. md has no such level.
    Draid1,
    Draid2,
    Draid3,
}

impl Level {
    /// The level number md writes into the superblock. The dRAID levels get
    /// numbers md never uses; they appear only in uraid's own dRAID
    /// superblock, never in an md one.
    pub fn md_number(self) -> i32 {
        match self {
            Level::Linear => -1,
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
            Level::Draid1 => -101,
            Level::Draid2 => -102,
            Level::Draid3 => -103,
        }
    }

    /// The level of an md superblock's level number. uraid's dRAID numbers
    /// are refused here: an md superblock that carries one is damaged or
    /// not md's, and must not be read as a dRAID array.
    pub fn from_md_number(number: i32) -> Option<Level> {
        Level::from_number(number).filter(|level| !level.is_draid())
    }

    /// The level of a number in uraid's own dRAID superblock, which knows
    /// md's levels and uraid's dRAID levels.
    pub fn from_number(number: i32) -> Option<Level> {
        Some(match number {
            -1 => Level::Linear,
            0 => Level::Raid0,
            1 => Level::Raid1,
            4 => Level::Raid4,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            -101 => Level::Draid1,
            -102 => Level::Draid2,
            -103 => Level::Draid3,
            _ => return None,
        })
    }

    /// Parity blocks per stripe (0 for levels without parity).
    pub fn parity_members(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 | Level::Draid1 => 1,
            Level::Raid6 | Level::Draid2 => 2,
            Level::Draid3 => 3,
            _ => 0,
        }
    }

    /// Levels whose stripes carry parity that must be kept consistent.
    pub fn has_parity(self) -> bool {
        self.parity_members() > 0
    }

    /// The fewest members md accepts for the level at create time.
    pub fn min_raid_disks(self) -> u32 {
        match self {
            Level::Linear | Level::Raid0 | Level::Raid1 => 1,
            Level::Raid4 | Level::Raid5 => 2,
            Level::Raid6 => 4,
            Level::Raid10 => 2,
            // One data column and P parity columns make the smallest group.
            Level::Draid1 | Level::Draid2 | Level::Draid3 => self.parity_members() as u32 + 1,
        }
    }

    /// uraid's declustered levels, which only uraid's own superblock describes.
    pub fn is_draid(self) -> bool {
        matches!(self, Level::Draid1 | Level::Draid2 | Level::Draid3)
    }

    /// The level keeps every byte twice, as a mirror's copy or as parity,
    /// so that a member can be checked, rebuilt or lost: every level but
    /// linear and raid0. Whether an array of the level survives a given
    /// loss is its geometry's answer (`Geometry::survives`); this is the
    /// one answer to whether it can have redundancy at all.
    pub fn redundant(self) -> bool {
        !matches!(self, Level::Linear | Level::Raid0)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(level_name(*self))
    }
}

/// One place where a chunk of the array is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The member's raid role (0..raid_disks).
    pub member: usize,
    /// Sector on the member, relative to its data offset.
    pub member_sector: u64,
}

/// One data strip of a stripe: a run of array sectors and the places that hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataStrip {
    /// Every copy: one for striped and parity levels, several for mirrors.
    pub copies: Vec<Place>,
    /// The coefficient exponent of this strip in the stripe's Q syndrome
    /// (Q = sum of g^q_exponent * D); 0 and meaningless without Q.
    pub q_exponent: u8,
}

/// The shape of one stripe: its data strips in array order and its parity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    /// The stripe's number, 0..stripe_count.
    pub stripe: u64,
    /// The first array sector of the stripe.
    pub array_sector: u64,
    /// Length of every strip of this stripe (data and parity), in sectors.
    pub strip_sectors: u64,
    /// Data strips in array order: strip i covers array sectors
    /// `array_sector + i*strip_sectors ..`.
    pub data: Vec<DataStrip>,
    /// The P (XOR) strip, for raid4/5/6.
    pub p: Option<Place>,
    /// The Q (Reed-Solomon) strip, for raid6 and dRAID with two or three
    /// parity columns.
    pub q: Option<Place>,
    /// The R strip (R = sum of 4^q_exponent * D), for dRAID with three
    /// parity columns; md has no level with it.
    pub r: Option<Place>,
}

impl StripeMap {
    /// The parity strips, P first.
    pub fn parity_places(&self) -> impl Iterator<Item = Place> + '_ {
        self.p
            .iter()
            .chain(self.q.iter())
            .chain(self.r.iter())
            .copied()
    }

    /// The coefficient exponent of data strip `i` for recovery: its Q
    /// exponent, or on a stripe without Q (where those are all 0 and
    /// meaningless) its index, so that exponents are always distinct.
    pub fn recovery_exponent(&self, i: usize) -> u8 {
        if self.q.is_some() {
            self.data[i].q_exponent
        } else {
            u8::try_from(i).expect("a stripe without Q has at most 255 data strips")
        }
    }

    /// Array sectors covered by the stripe.
    pub fn data_sectors(&self) -> u64 {
        self.strip_sectors * self.data.len() as u64
    }
}

/// Where one array sector is stored, for the levels that keep one copy of
/// data: what [`Geometry::stripe`] would say about it, found without
/// building the stripe's map (which allocates), for the read fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    pub stripe: u64,
    /// Index of the sector's data strip in the stripe (array order).
    pub data_index: usize,
    /// The strip's place: as in the stripe map, the member sector where
    /// the strip starts.
    pub place: Place,
    pub strip_sectors: u64,
    /// Where the sector lies in its strip.
    pub in_strip_sectors: u64,
}

/// The errors a geometry can be refused with at construction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("unknown layout {layout} for {level}")]
    UnknownLayout { level: Level, layout: u32 },
    #[error("{level} needs at least {min} raid devices, got {got}")]
    TooFewDisks { level: Level, min: u32, got: u32 },
    #[error("chunk size must be a power of two of at least 4 KiB for {level}, got {chunk_sectors} sectors")]
    BadChunk { level: Level, chunk_sectors: u64 },
    #[error("{0}")]
    Invalid(String),
}

/// md's mapping for one array, built from what its superblocks say.
#[derive(Clone, Debug)]
pub enum Geometry {
    Linear(linear::Linear),
    Raid0(raid0::Raid0),
    Raid1(raid1::Raid1),
    Raid456(raid456::Raid456),
    Raid10(raid10::Raid10),
    Draid(draid::Draid),
    /// Part way through a reshape: the old and the new geometry, and the
    /// point between them.
    Reshaping(Box<Reshaping>),
}

/// What a geometry is built from: the superblock's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeometryParams {
    pub level: Level,
    pub layout: u32,
    pub chunk_sectors: u64,
    pub raid_disks: u32,
    /// md's per-device "size": sectors of each member the array uses
    /// (raid1/4/5/6/10). Ignored by raid0 and linear.
    pub dev_sectors: u64,
    /// Each member's usable data size (the superblock's data_size), by role.
    /// raid0 and linear use these, since their members may differ in size.
    pub member_data_sectors: Vec<u64>,
    /// raid0 only: whether the superblock carries MD_FEATURE_RAID0_LAYOUT.
    /// Without it md treats the layout as unset (-1).
    pub raid0_layout_feature: bool,
}

impl Geometry {
    pub fn new(params: &GeometryParams) -> Result<Geometry, GeometryError> {
        let level = params.level;
        if params.raid_disks < level.min_raid_disks() {
            return Err(GeometryError::TooFewDisks {
                level,
                min: level.min_raid_disks(),
                got: params.raid_disks,
            });
        }
        Ok(match level {
            Level::Linear => Geometry::Linear(linear::Linear::new(params)?),
            Level::Raid0 => Geometry::Raid0(raid0::Raid0::new(params)?),
            Level::Raid1 => Geometry::Raid1(raid1::Raid1::new(params)?),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                Geometry::Raid456(raid456::Raid456::new(params)?)
            }
            Level::Raid10 => Geometry::Raid10(raid10::Raid10::new(params)?),
            Level::Draid1 | Level::Draid2 | Level::Draid3 => {
                Geometry::Draid(draid::Draid::new(&draid_params(params)?)?)
            }
        })
    }

    pub fn level(&self) -> Level {
        match self {
            Geometry::Linear(_) => Level::Linear,
            Geometry::Raid0(_) => Level::Raid0,
            Geometry::Raid1(_) => Level::Raid1,
            Geometry::Raid456(g) => g.level(),
            Geometry::Raid10(_) => Level::Raid10,
            Geometry::Draid(g) => match g.parity() {
                1 => Level::Draid1,
                2 => Level::Draid2,
                _ => Level::Draid3,
            },
            // md reports the old level until the reshape ends.
            Geometry::Reshaping(g) => g.old().level(),
        }
    }

    pub fn raid_disks(&self) -> usize {
        match self {
            Geometry::Linear(g) => g.raid_disks(),
            Geometry::Raid0(g) => g.raid_disks(),
            Geometry::Raid1(g) => g.raid_disks(),
            Geometry::Raid456(g) => g.raid_disks(),
            Geometry::Raid10(g) => g.raid_disks(),
            Geometry::Draid(g) => g.raid_disks(),
            Geometry::Reshaping(g) => g.raid_disks(),
        }
    }

    /// The array's size in sectors, as md computes it.
    pub fn array_sectors(&self) -> u64 {
        match self {
            Geometry::Linear(g) => g.array_sectors(),
            Geometry::Raid0(g) => g.array_sectors(),
            Geometry::Raid1(g) => g.array_sectors(),
            Geometry::Raid456(g) => g.array_sectors(),
            Geometry::Raid10(g) => g.array_sectors(),
            Geometry::Draid(g) => g.array_sectors(),
            Geometry::Reshaping(g) => g.array_sectors(),
        }
    }

    pub fn stripe_count(&self) -> u64 {
        match self {
            Geometry::Linear(g) => g.stripe_count(),
            Geometry::Raid0(g) => g.stripe_count(),
            Geometry::Raid1(g) => g.stripe_count(),
            Geometry::Raid456(g) => g.stripe_count(),
            Geometry::Raid10(g) => g.stripe_count(),
            Geometry::Draid(g) => g.stripe_count(),
            Geometry::Reshaping(g) => g.stripe_count(),
        }
    }

    /// The stripe holding `array_sector` (which must be below array_sectors()).
    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        assert!(
            array_sector < self.io_sectors(),
            "sector {array_sector} beyond the array"
        );
        match self {
            Geometry::Linear(g) => g.stripe_of(array_sector),
            Geometry::Raid0(g) => g.stripe_of(array_sector),
            Geometry::Raid1(g) => g.stripe_of(array_sector),
            Geometry::Raid456(g) => g.stripe_of(array_sector),
            Geometry::Raid10(g) => g.stripe_of(array_sector),
            Geometry::Draid(g) => g.stripe_of(array_sector),
            Geometry::Reshaping(g) => g.stripe_of(array_sector),
        }
    }

    /// The shape of stripe `stripe` (which must be below stripe_count()).
    pub fn stripe(&self, stripe: u64) -> StripeMap {
        assert!(
            stripe < self.stripe_count(),
            "stripe {stripe} beyond the array"
        );
        let map = match self {
            Geometry::Linear(g) => g.stripe(stripe),
            Geometry::Raid0(g) => g.stripe(stripe),
            Geometry::Raid1(g) => g.stripe(stripe),
            Geometry::Raid456(g) => g.stripe(stripe),
            Geometry::Raid10(g) => g.stripe(stripe),
            Geometry::Draid(g) => g.stripe(stripe),
            Geometry::Reshaping(g) => g.stripe(stripe),
        };
        debug_assert!(map.array_sector + map.data_sectors() <= self.io_sectors());
        debug_assert!(map
            .data
            .iter()
            .all(|d| d.copies.iter().all(|c| c.member < self.raid_disks())));
        map
    }

    /// The data strip holding `array_sector` (which must be below
    /// array_sectors()), for levels with a single copy of data; `None` for
    /// mirrors, whose reads choose among copies.
    pub fn locate(&self, array_sector: u64) -> Option<Located> {
        assert!(
            array_sector < self.io_sectors(),
            "sector {array_sector} beyond the array"
        );
        let located = match self {
            Geometry::Linear(g) => g.locate(array_sector),
            Geometry::Raid0(g) => g.locate(array_sector),
            Geometry::Raid456(g) => g.locate(array_sector),
            Geometry::Draid(g) => g.locate(array_sector),
            Geometry::Raid1(_) | Geometry::Raid10(_) => return None,
            Geometry::Reshaping(g) => g.locate(array_sector)?,
        };
        debug_assert!(located.in_strip_sectors < located.strip_sectors);
        debug_assert!(located.place.member < self.raid_disks());
        Some(located)
    }

    /// How many members may be lost in the worst case without losing data.
    /// Mirrored levels may survive more when the right members fail: use
    /// [`Geometry::survives`] for the exact answer.
    pub fn max_failed_members(&self) -> usize {
        match self {
            Geometry::Linear(_) | Geometry::Raid0(_) => 0,
            Geometry::Raid1(g) => g.raid_disks() - 1,
            Geometry::Raid456(g) => g.level().parity_members(),
            Geometry::Raid10(g) => g.copies() - 1,
            Geometry::Draid(g) => g.max_failed_members(),
            Geometry::Reshaping(g) => g.max_failed_members(),
        }
    }

    /// md counts resync progress (the superblock's resync_offset, the bitmap's
    /// sync range) in per-member sectors for raid1/4/5/6 and in array sectors
    /// for raid10. This is where stripe `stripe` starts in that unit.
    pub fn resync_position_sectors(&self, stripe: u64) -> u64 {
        match self {
            // md resyncs no array while it reshapes (raid5_start_reshape
            // needs a clean array, and a reshape restarted after a crash
            // rewrites every stripe it moves), so a reshaping geometry has
            // no resync unit; the engine never starts a job on one.
            Geometry::Reshaping(_) => {
                panic!("a reshaping array has no resync position")
            }
            Geometry::Draid(g) => g.resync_position_sectors(stripe),
            Geometry::Raid456(_) | Geometry::Raid1(_) => {
                let map = self.stripe(stripe.min(self.stripe_count().saturating_sub(1)));
                if stripe >= self.stripe_count() {
                    return map.data[0].copies[0].member_sector + map.strip_sectors;
                }
                map.data[0].copies[0].member_sector
            }
            Geometry::Raid10(_) | Geometry::Linear(_) | Geometry::Raid0(_) => {
                if stripe >= self.stripe_count() {
                    return self.array_sectors();
                }
                self.stripe(stripe).array_sector
            }
        }
    }

    /// The sectors of md's resync unit the write-intent bitmap marks for a
    /// write to `stripe` (see [`Reshaping::bitmap_sectors`] mid-reshape).
    pub fn bitmap_sectors(&self, stripe: u64) -> std::ops::Range<u64> {
        match self {
            Geometry::Reshaping(r) => r.bitmap_sectors(stripe),
            // Stripes of groups that start in the same row share a resync
            // position, so the range between two positions may be empty.
            Geometry::Draid(g) => g.bitmap_sectors(stripe),
            _ => self.resync_position_sectors(stripe)..self.resync_position_sectors(stripe + 1),
        }
    }

    /// The first stripe a resync that stopped at `position_sectors` (in md's
    /// unit, see [`Geometry::resync_position_sectors`]) must still visit.
    pub fn stripe_at_resync_position(&self, position_sectors: u64) -> u64 {
        let count = self.stripe_count();
        // Stripes are in increasing position order, so search for the first
        // stripe whose start is not below the position.
        let (mut low, mut high) = (0u64, count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.resync_position_sectors(mid) < position_sectors {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        // A position inside a stripe means that stripe was not finished.
        if low > 0 && self.resync_position_sectors(low) > position_sectors {
            low - 1
        } else {
            low
        }
    }

    /// Where the run of array sectors that starts at `array_sector` and is
    /// mapped by one stripe ends (exclusive): the stripe's end, or for a
    /// reshaping array the reshape point where a stripe straddles it. I/O
    /// is split at these ends.
    pub fn run_end(&self, array_sector: u64) -> u64 {
        match self {
            Geometry::Reshaping(g) => g.run_end(array_sector),
            _ => {
                let map = self.stripe(self.stripe_of(array_sector));
                map.array_sector + map.data_sectors()
            }
        }
    }

    /// The sectors I/O may reach: the array, and during a grow also the
    /// rows moved past its old end (the reshape job writes them; clients
    /// see them when it ends).
    pub fn io_sectors(&self) -> u64 {
        match self {
            Geometry::Reshaping(g) => g.extent_sectors(),
            _ => self.array_sectors(),
        }
    }

    /// The raid10 mapping, for what only raid10 has (its copies' layout).
    pub fn raid10(&self) -> Option<&Raid10> {
        match self {
            Geometry::Raid10(g) => Some(g),
            _ => None,
        }
    }

    /// The dRAID mapping, for what only dRAID has (spares, slices, groups).
    pub fn draid(&self) -> Option<&Draid> {
        match self {
            Geometry::Draid(g) => Some(g),
            _ => None,
        }
    }

    /// The reshape in progress, if any.
    pub fn reshaping(&self) -> Option<&Reshaping> {
        match self {
            Geometry::Reshaping(g) => Some(g),
            _ => None,
        }
    }

    /// Whether every array sector is still readable with the members marked
    /// missing in `missing` (indexed by role). This is the degradation rule.
    pub fn survives(&self, missing: &[bool]) -> bool {
        assert_eq!(missing.len(), self.raid_disks());
        let lost = missing.iter().filter(|m| **m).count();
        match self {
            Geometry::Linear(_) | Geometry::Raid0(_) => lost == 0,
            Geometry::Raid1(_) => lost < missing.len(),
            Geometry::Raid456(g) => lost <= g.level().parity_members(),
            Geometry::Raid10(g) => g.survives(missing),
            Geometry::Draid(g) => g.survives(missing),
            Geometry::Reshaping(g) => g.survives(missing),
        }
    }
}

/// dRAID's layout word: bits 0-7 are the data columns per group, bits 8-15
/// the distributed spares, and bits 16-31 are zero, which makes this version
/// 1 of the layout. A later layout version (another permutation table, say)
/// would set those bits.
pub fn draid_layout(data: usize, spares: usize) -> u32 {
    assert!(data <= 0xff && spares <= 0xff);
    data as u32 | (spares as u32) << 8
}

/// The dRAID parameters of a dRAID geometry's superblock fields.
fn draid_params(params: &GeometryParams) -> Result<DraidParams, GeometryError> {
    if params.layout >> 16 != 0 {
        return Err(GeometryError::UnknownLayout {
            level: params.level,
            layout: params.layout,
        });
    }
    Ok(DraidParams {
        parity: params.level.parity_members(),
        data: (params.layout & 0xff) as usize,
        children: params.raid_disks as usize,
        spares: (params.layout >> 8 & 0xff) as usize,
        chunk_sectors: params.chunk_sectors,
        dev_sectors: params.dev_sectors,
    })
}

#[cfg(test)]
mod kernel_tables;
