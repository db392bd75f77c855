//! raid1: every member holds the whole array at the same member sector.

use super::{DataStrip, GeometryError, GeometryParams, Place, StripeMap};

/// raid1 has no chunk; uraid still works in bounded units so that a stripe is
/// a buffer-sized piece of work. 64 KiB matches md's resync window granularity.
pub const RAID1_UNIT_SECTORS: u64 = 128;

#[derive(Clone, Debug)]
pub struct Raid1 {
    raid_disks: usize,
    dev_sectors: u64,
}

impl Raid1 {
    pub fn new(p: &GeometryParams) -> Result<Raid1, GeometryError> {
        Ok(Raid1 {
            raid_disks: p.raid_disks as usize,
            dev_sectors: p.dev_sectors,
        })
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    pub fn array_sectors(&self) -> u64 {
        self.dev_sectors
    }

    pub fn stripe_count(&self) -> u64 {
        self.dev_sectors.div_ceil(RAID1_UNIT_SECTORS)
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        array_sector / RAID1_UNIT_SECTORS
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let start = stripe * RAID1_UNIT_SECTORS;
        let copies = (0..self.raid_disks)
            .map(|member| Place {
                member,
                member_sector: start,
            })
            .collect();
        StripeMap {
            stripe,
            array_sector: start,
            strip_sectors: RAID1_UNIT_SECTORS.min(self.dev_sectors - start),
            data: vec![DataStrip {
                copies,
                q_exponent: 0,
            }],
            p: None,
            q: None,
            r: None,
        }
    }
}
