//! raid0: striping over zones of equal-sized members, following raid0.c
//! (create_strip_zones, find_zone, map_sector). Members of unequal size make
//! several zones; which member a chunk of a later zone goes to depends on the
//! layout (md's "original" or "alternate" multi-zone layout).

use super::{DataStrip, GeometryError, GeometryParams, Level, Located, Place, StripeMap};

/// md's RAID0 layouts (raid0.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raid0Layout {
    /// RAID0_ORIG_LAYOUT (1): chunks rotate by their array chunk number.
    Original,
    /// RAID0_ALT_MULTIZONE_LAYOUT (2): chunks rotate by their chunk number in the zone.
    Alternate,
}

#[derive(Clone, Debug)]
struct Zone {
    /// Roles of the members in the zone, in role order.
    members: Vec<usize>,
    /// Member sector (relative to the data offset) where the zone starts.
    dev_start_sectors: u64,
    /// First array sector and first stripe of the zone.
    array_start_sectors: u64,
    stripe_start: u64,
    rows: u64,
}

#[derive(Clone, Debug)]
pub struct Raid0 {
    chunk_sectors: u64,
    raid_disks: usize,
    layout: Raid0Layout,
    zones: Vec<Zone>,
}

impl Raid0 {
    pub fn new(p: &GeometryParams) -> Result<Raid0, GeometryError> {
        let n = p.raid_disks as usize;
        if p.member_data_sectors.len() != n {
            return Err(GeometryError::Invalid(
                "raid0 needs the size of every member".into(),
            ));
        }
        if p.chunk_sectors == 0 {
            return Err(GeometryError::BadChunk {
                level: Level::Raid0,
                chunk_sectors: 0,
            });
        }
        let chunk = p.chunk_sectors;
        let sizes: Vec<u64> = p
            .member_data_sectors
            .iter()
            .map(|&s| s / chunk * chunk)
            .collect();
        let zones = build_zones(&sizes, chunk);
        // With a single zone (or a second zone of one member) both layouts agree and
        // md forces the original one. Otherwise the superblock must say which.
        let multi_zone = zones.len() > 1 && zones[1].members.len() > 1;
        let layout = if !multi_zone {
            Raid0Layout::Original
        } else if !p.raid0_layout_feature {
            return Err(GeometryError::Invalid(
                "multi-zone raid0 without a layout (md refuses it too: its layout feature bit is not set)".into(),
            ));
        } else {
            match p.layout {
                1 => Raid0Layout::Original,
                2 => Raid0Layout::Alternate,
                other => {
                    return Err(GeometryError::UnknownLayout {
                        level: Level::Raid0,
                        layout: other,
                    })
                }
            }
        };
        Ok(Raid0 {
            chunk_sectors: chunk,
            raid_disks: n,
            layout,
            zones,
        })
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    pub fn array_sectors(&self) -> u64 {
        let last = self.zones.last().expect("raid0 has a zone");
        last.array_start_sectors + last.rows * last.members.len() as u64 * self.chunk_sectors
    }

    pub fn stripe_count(&self) -> u64 {
        let last = self.zones.last().expect("raid0 has a zone");
        last.stripe_start + last.rows
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        let zone = &self.zones[self
            .zones
            .partition_point(|z| z.array_start_sectors <= array_sector)
            - 1];
        let row_sectors = zone.members.len() as u64 * self.chunk_sectors;
        zone.stripe_start + (array_sector - zone.array_start_sectors) / row_sectors
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let (zone, row) = self.zone_row(stripe);
        let nb = zone.members.len() as u64;
        let member_sector = zone.dev_start_sectors + row * self.chunk_sectors;
        let array_sector = zone.array_start_sectors + row * nb * self.chunk_sectors;
        let data = (0..nb as usize)
            .map(|i| DataStrip {
                copies: vec![Place {
                    member: self.member_of(zone, row, i),
                    member_sector,
                }],
                q_exponent: 0,
            })
            .collect();
        StripeMap {
            stripe,
            array_sector,
            strip_sectors: self.chunk_sectors,
            data,
            p: None,
            q: None,
            r: None,
        }
    }

    /// The data strip holding `array_sector`, without building the stripe.
    pub fn locate(&self, array_sector: u64) -> Located {
        let stripe = self.stripe_of(array_sector);
        let (zone, row) = self.zone_row(stripe);
        let nb = zone.members.len() as u64;
        let in_row = array_sector - (zone.array_start_sectors + row * nb * self.chunk_sectors);
        let i = (in_row / self.chunk_sectors) as usize;
        Located {
            stripe,
            data_index: i,
            place: Place {
                member: self.member_of(zone, row, i),
                member_sector: zone.dev_start_sectors + row * self.chunk_sectors,
            },
            strip_sectors: self.chunk_sectors,
            in_strip_sectors: in_row % self.chunk_sectors,
        }
    }

    /// The zone of `stripe` and the stripe's row in it.
    fn zone_row(&self, stripe: u64) -> (&Zone, u64) {
        let zone = &self.zones[self.zones.partition_point(|z| z.stripe_start <= stripe) - 1];
        (zone, stripe - zone.stripe_start)
    }

    /// The member of strip `i` of row `row` of `zone`: map_sector picks it
    /// from the chunk number, of the array (original layout) or of the zone
    /// (alternate layout).
    fn member_of(&self, zone: &Zone, row: u64, i: usize) -> usize {
        let nb = zone.members.len() as u64;
        let chunk_number = match self.layout {
            Raid0Layout::Original => {
                (zone.array_start_sectors + row * nb * self.chunk_sectors) / self.chunk_sectors
                    + i as u64
            }
            Raid0Layout::Alternate => row * nb + i as u64,
        };
        zone.members[(chunk_number % nb) as usize]
    }
}

/// create_strip_zones: zone 0 spans every member up to the smallest size; each
/// further zone spans the members larger than the previous zone's end.
fn build_zones(sizes: &[u64], chunk: u64) -> Vec<Zone> {
    let mut zones: Vec<Zone> = Vec::new();
    let mut dev_start = 0u64;
    let mut array_start = 0u64;
    let mut stripe_start = 0u64;
    loop {
        let members: Vec<usize> = (0..sizes.len()).filter(|&m| sizes[m] > dev_start).collect();
        let Some(end) = members.iter().map(|&m| sizes[m]).min() else {
            break;
        };
        let rows = (end - dev_start) / chunk;
        zones.push(Zone {
            members: members.clone(),
            dev_start_sectors: dev_start,
            array_start_sectors: array_start,
            stripe_start,
            rows,
        });
        array_start += rows * members.len() as u64 * chunk;
        stripe_start += rows;
        dev_start = end;
    }
    if zones.is_empty() {
        // Every member is smaller than a chunk: an empty array, one empty zone.
        zones.push(Zone {
            members: (0..sizes.len()).collect(),
            dev_start_sectors: 0,
            array_start_sectors: 0,
            stripe_start: 0,
            rows: 0,
        });
    }
    zones
}
