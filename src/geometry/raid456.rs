//! raid4, raid5 and raid6: striping with one (P) or two (P and Q) parity chunks
//! per stripe, following raid5.c's raid5_compute_sector and, for the order of
//! the Q syndrome's coefficients, raid6_d0 / raid6_idx_to_slot.

use super::{DataStrip, GeometryError, GeometryParams, Level, Located, Place, StripeMap};

/// md's algorithm numbers (raid5.h).
pub const LEFT_ASYMMETRIC: u32 = 0;
pub const RIGHT_ASYMMETRIC: u32 = 1;
pub const LEFT_SYMMETRIC: u32 = 2;
pub const RIGHT_SYMMETRIC: u32 = 3;
pub const PARITY_0: u32 = 4;
pub const PARITY_N: u32 = 5;
pub const ROTATING_ZERO_RESTART: u32 = 8;
pub const ROTATING_N_RESTART: u32 = 9;
pub const ROTATING_N_CONTINUE: u32 = 10;
pub const LEFT_ASYMMETRIC_6: u32 = 16;
pub const RIGHT_ASYMMETRIC_6: u32 = 17;
pub const LEFT_SYMMETRIC_6: u32 = 18;
pub const RIGHT_SYMMETRIC_6: u32 = 19;
pub const PARITY_0_6: u32 = 20;

pub fn algorithm_valid(level: Level, layout: u32) -> bool {
    match level {
        // raid4 ignores its layout in the kernel; mdadm writes PARITY_N or 0.
        Level::Raid4 => layout <= PARITY_N,
        Level::Raid5 => layout <= PARITY_N,
        Level::Raid6 => {
            layout <= PARITY_N || (8..=10).contains(&layout) || (16..=20).contains(&layout)
        }
        _ => false,
    }
}

#[derive(Clone, Debug)]
pub struct Raid456 {
    level: Level,
    algorithm: u32,
    raid_disks: usize,
    chunk_sectors: u64,
    /// Per-member sectors in use: md's dev_sectors rounded down to the chunk.
    dev_sectors: u64,
}

/// Where the blocks of one stripe sit, in raid-disk numbers.
struct StripeShape {
    pd: usize,
    qd: Option<usize>,
    /// How a logical data index turns into a physical disk.
    data: DataRule,
    ddf: bool,
}

/// The rule of a layout that turns logical data index k into a physical
/// disk, given the stripe's P disk. A value rather than a closure, so
/// that finding one strip's disk allocates nothing.
#[derive(Clone, Copy, Debug)]
enum DataRule {
    /// k + by.
    Shift { by: usize },
    /// k below P stays; from P on, k + by (P, or P and Q, are skipped).
    Skip { by: usize },
    /// The disks after P (and Q) in rotation: (pd + after + k) % modulus.
    Rotate { after: usize, modulus: usize },
}

impl DataRule {
    fn disk(self, k: usize, pd: usize) -> usize {
        match self {
            DataRule::Shift { by } => k + by,
            DataRule::Skip { by } => {
                if k >= pd {
                    k + by
                } else {
                    k
                }
            }
            DataRule::Rotate { after, modulus } => (pd + after + k) % modulus,
        }
    }
}

impl Raid456 {
    pub fn new(p: &GeometryParams) -> Result<Raid456, GeometryError> {
        if !algorithm_valid(p.level, p.layout) {
            return Err(GeometryError::UnknownLayout {
                level: p.level,
                layout: p.layout,
            });
        }
        // raid5.c setup_conf: the chunk must be a power of two and at least a page.
        if !p.chunk_sectors.is_power_of_two() || p.chunk_sectors < 8 {
            return Err(GeometryError::BadChunk {
                level: p.level,
                chunk_sectors: p.chunk_sectors,
            });
        }
        let raid_disks = p.raid_disks as usize;
        let dev_sectors = p.dev_sectors & !(p.chunk_sectors - 1);
        Ok(Raid456 {
            level: p.level,
            algorithm: p.layout,
            raid_disks,
            chunk_sectors: p.chunk_sectors,
            dev_sectors,
        })
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// md's layout number.
    pub fn algorithm(&self) -> u32 {
        self.algorithm
    }

    pub fn raid_disks(&self) -> usize {
        self.raid_disks
    }

    fn data_disks(&self) -> usize {
        self.raid_disks - self.level.parity_members()
    }

    pub fn array_sectors(&self) -> u64 {
        self.dev_sectors * self.data_disks() as u64
    }

    pub fn stripe_count(&self) -> u64 {
        self.dev_sectors / self.chunk_sectors
    }

    pub fn stripe_of(&self, array_sector: u64) -> u64 {
        array_sector / self.chunk_sectors / self.data_disks() as u64
    }

    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let shape = self.shape(stripe);
        let member_sector = stripe * self.chunk_sectors;
        let exponents = self.q_exponents(&shape);
        let data = (0..self.data_disks())
            .zip(exponents)
            .map(|(k, q_exponent)| DataStrip {
                copies: vec![Place {
                    member: shape.data.disk(k, shape.pd),
                    member_sector,
                }],
                q_exponent,
            })
            .collect();
        StripeMap {
            stripe,
            array_sector: stripe * self.chunk_sectors * self.data_disks() as u64,
            strip_sectors: self.chunk_sectors,
            data,
            p: Some(Place {
                member: shape.pd,
                member_sector,
            }),
            q: shape.qd.map(|qd| Place {
                member: qd,
                member_sector,
            }),
            r: None,
        }
    }

    /// The data strip holding `array_sector`, without building the stripe.
    pub fn locate(&self, array_sector: u64) -> Located {
        let stripe = self.stripe_of(array_sector);
        let in_stripe = array_sector - stripe * self.chunk_sectors * self.data_disks() as u64;
        let k = (in_stripe / self.chunk_sectors) as usize;
        let shape = self.shape(stripe);
        Located {
            stripe,
            data_index: k,
            place: Place {
                member: shape.data.disk(k, shape.pd),
                member_sector: stripe * self.chunk_sectors,
            },
            strip_sectors: self.chunk_sectors,
            in_strip_sectors: in_stripe % self.chunk_sectors,
        }
    }

    /// raid5_compute_sector, for every logical data index of one stripe.
    fn shape(&self, stripe: u64) -> StripeShape {
        let n = self.raid_disks;
        let data_disks = self.data_disks();
        let rot = |modulus: usize| (stripe % modulus as u64) as usize;
        let mut ddf = false;
        let (pd, qd): (usize, Option<usize>);
        // How each layout turns a logical data index k into a physical disk.
        let place: DataRule;
        match (self.level, self.algorithm) {
            (Level::Raid4, _) => {
                pd = data_disks;
                qd = None;
                place = DataRule::Shift { by: 0 };
            }
            (Level::Raid5, alg) => {
                qd = None;
                match alg {
                    LEFT_ASYMMETRIC | RIGHT_ASYMMETRIC => {
                        pd = if alg == LEFT_ASYMMETRIC {
                            data_disks - rot(n)
                        } else {
                            rot(n)
                        };
                        place = DataRule::Skip { by: 1 };
                    }
                    LEFT_SYMMETRIC | RIGHT_SYMMETRIC => {
                        pd = if alg == LEFT_SYMMETRIC {
                            data_disks - rot(n)
                        } else {
                            rot(n)
                        };
                        place = DataRule::Rotate {
                            after: 1,
                            modulus: n,
                        };
                    }
                    PARITY_0 => {
                        pd = 0;
                        place = DataRule::Shift { by: 1 };
                    }
                    _ => {
                        pd = data_disks;
                        place = DataRule::Shift { by: 0 };
                    }
                }
            }
            (_, alg) => match alg {
                // Q follows P; when P is on the last disk, Q wraps to disk 0.
                LEFT_ASYMMETRIC | RIGHT_ASYMMETRIC | ROTATING_ZERO_RESTART | ROTATING_N_RESTART => {
                    let p = match alg {
                        LEFT_ASYMMETRIC => n - 1 - rot(n),
                        ROTATING_N_RESTART => n - 1 - ((stripe + 1) % n as u64) as usize,
                        _ => rot(n),
                    };
                    ddf = alg == ROTATING_ZERO_RESTART || alg == ROTATING_N_RESTART;
                    pd = p;
                    if p == n - 1 {
                        qd = Some(0);
                        place = DataRule::Shift { by: 1 };
                    } else {
                        qd = Some(p + 1);
                        place = DataRule::Skip { by: 2 };
                    }
                }
                LEFT_SYMMETRIC | RIGHT_SYMMETRIC => {
                    pd = if alg == LEFT_SYMMETRIC {
                        n - 1 - rot(n)
                    } else {
                        rot(n)
                    };
                    qd = Some((pd + 1) % n);
                    place = DataRule::Rotate {
                        after: 2,
                        modulus: n,
                    };
                }
                PARITY_0 => {
                    pd = 0;
                    qd = Some(1);
                    place = DataRule::Shift { by: 2 };
                }
                PARITY_N => {
                    pd = data_disks;
                    qd = Some(data_disks + 1);
                    place = DataRule::Shift { by: 0 };
                }
                ROTATING_N_CONTINUE => {
                    // Left-symmetric with Q just before P.
                    ddf = true;
                    pd = n - 1 - rot(n);
                    qd = Some((pd + n - 1) % n);
                    place = DataRule::Rotate {
                        after: 1,
                        modulus: n,
                    };
                }
                // The *_6 layouts: a raid5 layout over the first n-1 disks, Q on the last.
                LEFT_ASYMMETRIC_6 | RIGHT_ASYMMETRIC_6 => {
                    pd = if alg == LEFT_ASYMMETRIC_6 {
                        data_disks - rot(n - 1)
                    } else {
                        rot(n - 1)
                    };
                    qd = Some(n - 1);
                    place = DataRule::Skip { by: 1 };
                }
                LEFT_SYMMETRIC_6 | RIGHT_SYMMETRIC_6 => {
                    pd = if alg == LEFT_SYMMETRIC_6 {
                        data_disks - rot(n - 1)
                    } else {
                        rot(n - 1)
                    };
                    qd = Some(n - 1);
                    place = DataRule::Rotate {
                        after: 1,
                        modulus: n - 1,
                    };
                }
                _ => {
                    debug_assert_eq!(alg, PARITY_0_6);
                    pd = 0;
                    qd = Some(n - 1);
                    place = DataRule::Shift { by: 1 };
                }
            },
        }
        debug_assert!((0..data_disks)
            .map(|k| place.disk(k, pd))
            .all(|d| d < n && d != pd && Some(d) != qd));
        StripeShape {
            pd,
            qd,
            data: place,
            ddf,
        }
    }

    /// The Q coefficient exponent of each logical data index. md walks the disks
    /// starting just after Q (raid6_d0) and gives each data disk the next slot;
    /// DDF layouts instead count every disk from disk 0, so P and Q take slots too.
    fn q_exponents(&self, shape: &StripeShape) -> Vec<u8> {
        let Some(qd) = shape.qd else {
            return vec![0; self.data_disks()];
        };
        let n = self.raid_disks;
        let mut slot_of_disk = vec![0u8; n];
        if shape.ddf {
            for (disk, slot) in slot_of_disk.iter_mut().enumerate() {
                *slot = disk as u8;
            }
        } else {
            let d0 = if qd == n - 1 { 0 } else { qd + 1 };
            let mut count = 0u8;
            for i in 0..n {
                let disk = (d0 + i) % n;
                if disk != shape.pd && disk != qd {
                    slot_of_disk[disk] = count;
                    count += 1;
                }
            }
        }
        (0..self.data_disks())
            .map(|k| slot_of_disk[shape.data.disk(k, shape.pd)])
            .collect()
    }
}
