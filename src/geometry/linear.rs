//! linear: the members concatenated in role order (md's linear.c), each
//! contributing its data size rounded down to the rounding ("chunk") if one is set.

use super::{DataStrip, GeometryError, GeometryParams, Located, Place, StripeMap};

/// Linear has no stripes; uraid cuts each member into units of this size so a
/// stripe stays a bounded piece of work. The last unit of a member may be shorter.
pub const LINEAR_UNIT_SECTORS: u64 = 2048;

#[derive(Clone, Debug)]
pub struct Linear {
    /// Sectors each member contributes, by role.
    member_sectors: Vec<u64>,
    /// First array sector of each member, plus the array size at the end.
    member_start: Vec<u64>,
    /// First stripe number of each member, plus the stripe count at the end.
    stripe_start: Vec<u64>,
}

impl Linear {
    pub fn new(p: &GeometryParams) -> Result<Linear, GeometryError> {
        if p.member_data_sectors.len() != p.raid_disks as usize {
            return Err(GeometryError::Invalid(
                "linear needs the size of every member".into(),
            ));
        }
        let member_sectors: Vec<u64> = p
            .member_data_sectors
            .iter()
            .map(|&s| {
                s.checked_div(p.chunk_sectors)
                    .map_or(s, |c| c * p.chunk_sectors)
            })
            .collect();
        let mut member_start = vec![0];
        let mut stripe_start = vec![0];
        for &s in &member_sectors {
            member_start.push(member_start.last().unwrap() + s);
            stripe_start.push(stripe_start.last().unwrap() + s.div_ceil(LINEAR_UNIT_SECTORS));
        }
        Ok(Linear {
            member_sectors,
            member_start,
            stripe_start,
        })
    }

    pub fn raid_disks(&self) -> usize {
        self.member_sectors.len()
    }

    pub fn array_sectors(&self) -> u64 {
        *self.member_start.last().unwrap()
    }

    pub fn stripe_count(&self) -> u64 {
        *self.stripe_start.last().unwrap()
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        // The member whose range holds the sector: the last start at or below it.
        let member = self
            .member_start
            .partition_point(|&start| start <= array_sector)
            - 1;
        self.stripe_start[member] + (array_sector - self.member_start[member]) / LINEAR_UNIT_SECTORS
    }

    /// The data strip holding `array_sector`, without building the stripe.
    pub fn locate(&self, array_sector: u64) -> Located {
        let stripe = self.stripe_of(array_sector);
        let member = self.stripe_start.partition_point(|&start| start <= stripe) - 1;
        let member_sector = (stripe - self.stripe_start[member]) * LINEAR_UNIT_SECTORS;
        Located {
            stripe,
            data_index: 0,
            place: Place {
                member,
                member_sector,
            },
            strip_sectors: LINEAR_UNIT_SECTORS.min(self.member_sectors[member] - member_sector),
            in_strip_sectors: array_sector - (self.member_start[member] + member_sector),
        }
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let member = self.stripe_start.partition_point(|&start| start <= stripe) - 1;
        let member_sector = (stripe - self.stripe_start[member]) * LINEAR_UNIT_SECTORS;
        StripeMap {
            stripe,
            array_sector: self.member_start[member] + member_sector,
            strip_sectors: LINEAR_UNIT_SECTORS.min(self.member_sectors[member] - member_sector),
            data: vec![DataStrip {
                copies: vec![Place {
                    member,
                    member_sector,
                }],
                q_exponent: 0,
            }],
            p: None,
            q: None,
            r: None,
        }
    }
}
