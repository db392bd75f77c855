//! raid10: near, far and offset copies, following raid10.c (setup_geo,
//! calc_sectors, __raid10_find_phys). A stripe here is one array chunk with all
//! of its copies, because raid10 keeps no parity that would tie chunks together.

use super::{DataStrip, GeometryError, GeometryParams, Level, Place, StripeMap};

#[derive(Clone, Debug)]
pub struct Raid10 {
    /// md's layout number (near, far, offset and far-set bits).
    layout: u32,
    raid_disks: usize,
    near_copies: usize,
    far_copies: usize,
    far_offset: bool,
    far_set_size: usize,
    chunk_sectors: u64,
    /// Sectors between far copies on one member (raid10.c's geo.stride).
    stride_sectors: u64,
    array_sectors: u64,
}

impl Raid10 {
    pub fn new(p: &GeometryParams) -> Result<Raid10, GeometryError> {
        let bad_layout = || GeometryError::UnknownLayout {
            level: Level::Raid10,
            layout: p.layout,
        };
        let raid_disks = p.raid_disks as usize;
        let near_copies = (p.layout & 0xff) as usize;
        let far_copies = ((p.layout >> 8) & 0xff) as usize;
        let far_offset = p.layout & (1 << 16) != 0;
        let far_set_size = match p.layout >> 17 {
            0 => raid_disks,
            1 => raid_disks / far_copies.max(1),
            2 => far_copies * near_copies,
            _ => return Err(bad_layout()),
        };
        let copies = near_copies * far_copies;
        if near_copies == 0
            || far_copies == 0
            || copies < 2
            || copies > raid_disks
            || far_set_size == 0
        {
            return Err(bad_layout());
        }
        if !p.chunk_sectors.is_power_of_two() || p.chunk_sectors < 8 {
            return Err(GeometryError::BadChunk {
                level: Level::Raid10,
                chunk_sectors: p.chunk_sectors,
            });
        }
        // calc_sectors: the array holds (dev chunks / far) * disks / near chunks;
        // each member uses ceil(chunks * copies / disks) of its chunks, and far
        // copies sit one far-section (a 1/far share of that) apart.
        let chunk = p.chunk_sectors;
        let dev_chunks = p.dev_sectors / chunk;
        let array_chunks = dev_chunks / far_copies as u64 * raid_disks as u64 / near_copies as u64;
        let used_chunks_per_dev = (array_chunks * copies as u64).div_ceil(raid_disks as u64);
        let stride_sectors = if far_offset {
            chunk
        } else {
            used_chunks_per_dev / far_copies as u64 * chunk
        };
        Ok(Raid10 {
            layout: p.layout,
            raid_disks,
            near_copies,
            far_copies,
            far_offset,
            far_set_size,
            chunk_sectors: chunk,
            stride_sectors,
            array_sectors: array_chunks * chunk,
        })
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    pub fn copies(&self) -> usize {
        self.near_copies * self.far_copies
    }

    pub fn layout(&self) -> u32 {
        self.layout
    }

    pub fn chunk_sectors(&self) -> u64 {
        self.chunk_sectors
    }

    pub fn far_copies(&self) -> usize {
        self.far_copies
    }

    /// The far layout proper (copies a far-section apart, not offset):
    /// md never reshapes it, since its copies span the whole member.
    pub fn is_far(&self) -> bool {
        self.far_copies > 1 && !self.far_offset
    }

    /// The first member sector (relative to the data offset) that may hold
    /// any of the chunk holding `array_sector`: raid10.c's
    /// first_dev_address, which bounds where a reshape may still read.
    pub fn first_member_sector(&self, array_sector: u64) -> u64 {
        let chunk = array_sector / self.chunk_sectors;
        let row = chunk * self.near_copies as u64 / self.raid_disks as u64;
        row * self.far_copies as u64 * self.chunk_sectors
    }

    /// The member sector just past anything of the chunk holding
    /// `array_sector`: raid10.c's last_dev_address, which bounds where a
    /// reshape writes.
    pub fn member_sectors_end(&self, array_sector: u64) -> u64 {
        let chunks = array_sector / self.chunk_sectors + 1;
        let rows = (chunks * self.near_copies as u64).div_ceil(self.raid_disks as u64);
        rows * self.far_copies as u64 * self.chunk_sectors
    }

    pub fn array_sectors(&self) -> u64 {
        self.array_sectors
    }

    pub fn stripe_count(&self) -> u64 {
        self.array_sectors / self.chunk_sectors
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        array_sector / self.chunk_sectors
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        StripeMap {
            stripe,
            array_sector: stripe * self.chunk_sectors,
            strip_sectors: self.chunk_sectors,
            data: vec![DataStrip {
                copies: self.copies_of_chunk(stripe),
                q_exponent: 0,
            }],
            p: None,
            q: None,
            r: None,
        }
    }

    /// __raid10_find_phys for the first sector of array chunk `chunk`.
    fn copies_of_chunk(&self, chunk: u64) -> Vec<Place> {
        let n = self.raid_disks;
        let last_far_set_start = (n / self.far_set_size - 1) * self.far_set_size;
        let last_far_set_size = self.far_set_size + n % self.far_set_size;
        let first = chunk * self.near_copies as u64;
        let mut dev = (first % n as u64) as usize;
        let mut stripe = first / n as u64;
        if self.far_offset {
            stripe *= self.far_copies as u64;
        }
        let mut sector = stripe * self.chunk_sectors;
        let mut places = Vec::with_capacity(self.copies());
        for _ in 0..self.near_copies {
            let (mut d, mut s) = (dev, sector);
            places.push(Place {
                member: d,
                member_sector: s,
            });
            for _ in 1..self.far_copies {
                let set = d / self.far_set_size;
                d += self.near_copies;
                if !n.is_multiple_of(self.far_set_size) && d > last_far_set_start {
                    d = (d - last_far_set_start) % last_far_set_size + last_far_set_start;
                } else {
                    d = d % self.far_set_size + self.far_set_size * set;
                }
                s += self.stride_sectors;
                places.push(Place {
                    member: d,
                    member_sector: s,
                });
            }
            dev += 1;
            if dev >= n {
                dev = 0;
                sector += self.chunk_sectors;
            }
        }
        places
    }

    /// A raid10 array survives as long as every chunk keeps one copy. The
    /// pattern of copies repeats, so checking enough chunks to cover every
    /// member combination (one full rotation of each placement) is exact.
    pub fn survives(&self, missing: &[bool]) -> bool {
        let period = (self.raid_disks * self.raid_disks) as u64;
        (0..period.min(self.stripe_count())).all(|chunk| {
            self.copies_of_chunk(chunk)
                .iter()
                .any(|place| !missing[place.member])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid10(layout: u32, disks: u32) -> Raid10 {
        Raid10::new(&GeometryParams {
            level: Level::Raid10,
            layout,
            chunk_sectors: 16,
            raid_disks: disks,
            dev_sectors: 4096,
            member_data_sectors: vec![4096; disks as usize],
            raid0_layout_feature: false,
        })
        .unwrap()
    }

    /// Every copy of a chunk lies between the bounds a reshape uses, and
    /// the bounds are tight: some copy starts at the first and some ends
    /// within the last row.
    #[test]
    fn member_bounds_hold_every_copy_of_a_chunk() {
        for (layout, disks) in [
            (0x102, 4),
            (0x102, 5),
            (0x103, 7),
            (0x10201, 4),
            (0x10201, 5),
        ] {
            let g = raid10(layout, disks);
            assert!(!g.is_far());
            for chunk in 0..g.stripe_count() {
                let sector = chunk * g.chunk_sectors() + 3;
                let (first, end) = (g.first_member_sector(sector), g.member_sectors_end(sector));
                let copies = g.copies_of_chunk(chunk);
                let low = copies.iter().map(|p| p.member_sector).min().unwrap();
                let high = copies.iter().map(|p| p.member_sector + 16).max().unwrap();
                assert_eq!(low, first, "{layout:#x} {disks} chunk {chunk}");
                assert!(
                    high <= end && end - high < 16 * g.far_copies() as u64,
                    "{layout:#x} {disks} chunk {chunk}"
                );
            }
        }
        assert!(raid10(0x201, 4).is_far());
    }
}
