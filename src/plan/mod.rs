//! The rebuild planner: for N members of a given size and speed, how long a
//! rebuild after one failure takes under each layout, how long the array
//! runs with less redundancy, what it costs in capacity, and how likely it
//! is to lose data before the rebuild ends. Pure arithmetic over a small
//! model, so that its assumptions can be printed and checked by hand.
//!
//! **Rebuild onto a hot spare** (raid1/5/6/10, and dRAID without
//! distributed spares): each survivor that the rebuild reads streams the
//! whole member once and the spare writes it once, in step, so the time is
//! one pass over the member at the slower of the two bandwidths. With a
//! throttle that counts reads and writes together, a survivor reads X bytes
//! and the spare writes X bytes: neither does both.
//!
//! **Rebuild onto a distributed spare** (dRAID with S ≥ 1): every degraded
//! stripe has one column to write and D columns to read (uraid's engine
//! reads the fewest a recovery needs, where ZFS reads all W − 1), and
//! both are spread over the C − 1 survivors. Each survivor therefore reads
//! D·X/(C − 1) and writes X/(C − 1): (D + 1)·X/(C − 1) in all, times the
//! imbalance of the permutation maps (the busiest child over the average;
//! for members of few slices, what the maps themselves give, which a full
//! rotation has not yet evened out).
//! Reads and writes share the disk, so they add. The failed member's
//! replacement is filled afterwards ("rebalance"), one disk's write of X,
//! with redundancy already whole.
//!
//! **Data loss** during the window T of reduced redundancy: each survivor
//! at risk fails within T with probability 1 − exp(−λT), λ from the annual
//! failure rate. Data is lost when more further members fail than the
//! layout still tolerates, or when exactly that many fail and an
//! unrecoverable read error hits the reads made with no redundancy left.
//! The second term takes the whole window's reads, which overstates it
//! when redundancy runs out late in the window.

use crate::geometry::DraidSpec;
use crate::member::DeviceModel;
use serde::Serialize;

/// Seconds in a mean year (365.25 days), to turn an annual failure rate
/// into a rate per second.
const YEAR_SECONDS: f64 = 365.25 * 86_400.0;

/// The imbalance of dRAID's permutation maps with the per-slice rotation:
/// the busiest survivor's rebuild I/O over the average, measured over a full
/// rotation cycle at 1.03 to 1.06 for 11 to 90 children. The upper value.
pub const DEFAULT_IMBALANCE: f64 = 1.06;
/// A common annual failure rate for disks in service.
pub const DEFAULT_AFR: f64 = 0.015;
/// The unrecoverable read error rate on a nearline disk's data sheet.
pub const DEFAULT_URE_PER_BIT: f64 = 1e-15;
/// md's default chunk, which rounds each member down for striped levels.
pub const DEFAULT_CHUNK_BYTES: u64 = 512 << 10;

/// A layout the planner knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// An N-way mirror.
    Raid1,
    Raid5,
    Raid6,
    /// md's near layout with two copies.
    Raid10,
    Draid(DraidSpec),
}

impl Scheme {
    /// Reads a level name or a dRAID spec for `devices` members; one line
    /// saying what is wrong.
    pub fn parse(text: &str, devices: u32) -> Result<Scheme, String> {
        let lower = text.trim().to_ascii_lowercase();
        let scheme = match lower.as_str() {
            "raid1" | "1" | "mirror" => Scheme::Raid1,
            "raid5" | "5" => Scheme::Raid5,
            "raid6" | "6" => Scheme::Raid6,
            "raid10" | "10" => Scheme::Raid10,
            spec if spec.starts_with("draid") => {
                Scheme::Draid(DraidSpec::parse(text, Some(devices))?)
            }
            _ => {
                return Err(format!(
                    "unknown level '{text}' (expected raid1, raid5, raid6, raid10 or a dRAID spec \
                     like draid2:8d:1s)"
                ))
            }
        };
        scheme.check(devices)?;
        Ok(scheme)
    }

    /// Refuses a member count the layout cannot have.
    pub fn check(&self, devices: u32) -> Result<(), String> {
        let least = match self {
            Scheme::Raid1 | Scheme::Raid10 => 2,
            Scheme::Raid5 => 3,
            Scheme::Raid6 => 4,
            Scheme::Draid(spec) if spec.children != devices => {
                return Err(format!(
                    "{spec} has {} children but --raid-devices is {devices}",
                    spec.children
                ))
            }
            Scheme::Draid(_) => return Ok(()),
        };
        if devices < least {
            return Err(format!(
                "{} needs at least {least} members, not {devices}",
                self.name()
            ));
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        match self {
            Scheme::Raid1 => "raid1".into(),
            Scheme::Raid5 => "raid5".into(),
            Scheme::Raid6 => "raid6".into(),
            Scheme::Raid10 => "raid10".into(),
            Scheme::Draid(spec) => spec.to_string(),
        }
    }

    /// Members that may fail at once without losing data.
    pub fn failures_tolerated(&self, devices: u32) -> u32 {
        match self {
            Scheme::Raid1 => devices - 1,
            Scheme::Raid5 | Scheme::Raid10 => 1,
            Scheme::Raid6 => 2,
            Scheme::Draid(spec) => spec.parity,
        }
    }

    /// Usable bytes. md rounds each member of a striped level down to whole
    /// chunks; dRAID follows ZFS's rule (`DraidSpec::capacity_bytes`).
    pub fn capacity_bytes(&self, devices: u32, member_bytes: u64, chunk_bytes: u64) -> u64 {
        let striped = member_bytes / chunk_bytes.max(1) * chunk_bytes.max(1);
        let n = u64::from(devices);
        match self {
            Scheme::Raid1 => member_bytes,
            Scheme::Raid5 => (n - 1) * striped,
            Scheme::Raid6 => (n - 2) * striped,
            Scheme::Raid10 => n * striped / 2,
            Scheme::Draid(spec) => spec.capacity_bytes(member_bytes),
        }
    }
}

/// The members: how large, and how long one pass over the used span takes.
#[derive(Clone, Debug, Serialize)]
pub struct Members {
    pub raid_devices: u32,
    pub member_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_model: Option<String>,
    /// Bytes over time of one pass over the member: the mean bandwidth
    /// over the span the array uses.
    pub mean_bytes_per_s: f64,
    pub pass_seconds: f64,
}

impl Members {
    /// Members of a flat speed.
    pub fn flat(raid_devices: u32, member_bytes: u64, bytes_per_s: f64) -> Members {
        Members {
            raid_devices,
            member_bytes,
            device_model: None,
            mean_bytes_per_s: bytes_per_s,
            pass_seconds: member_bytes as f64 / bytes_per_s,
        }
    }

    /// Members of a model, using its first `member_bytes` (all of it when
    /// `None`): md puts an array at the start of each member, where a disk
    /// is fastest.
    pub fn of_model(
        raid_devices: u32,
        model: &DeviceModel,
        member_bytes: Option<u64>,
    ) -> Result<Members, String> {
        let bytes = member_bytes.unwrap_or(model.capacity_bytes);
        if bytes > model.capacity_bytes {
            return Err(format!(
                "member size {bytes} bytes is larger than {}'s {} bytes",
                model.name, model.capacity_bytes
            ));
        }
        let span = bytes as f64 / model.capacity_bytes as f64;
        Ok(Members {
            raid_devices,
            member_bytes: bytes,
            device_model: Some(model.name.to_string()),
            mean_bytes_per_s: model.mean_bandwidth(0.0, span),
            pass_seconds: model.stream_seconds(0.0, span),
        })
    }
}

/// What the figures rest on; printed with every plan.
#[derive(Clone, Debug, Serialize)]
pub struct Assumptions {
    /// The engine's rebuild throughput over the members' streaming
    /// bandwidth (1.0: the rebuild streams as fast as the disks).
    pub efficiency: f64,
    /// dRAID's busiest survivor over the average.
    pub imbalance: f64,
    /// Annual failure rate of one member.
    pub afr: f64,
    /// Unrecoverable read errors per bit read.
    pub ure_per_bit: f64,
    pub chunk_bytes: u64,
    /// The statements behind the model, one sentence each.
    pub notes: Vec<String>,
}

impl Assumptions {
    pub fn new(efficiency: f64, imbalance: f64, afr: f64, ure_per_bit: f64, chunk: u64) -> Self {
        Assumptions {
            efficiency,
            imbalance,
            afr,
            ure_per_bit,
            chunk_bytes: chunk,
            notes: NOTES.iter().map(|n| n.to_string()).collect(),
        }
    }

    /// Refuses values that make the model meaningless; one line.
    pub fn check(&self) -> Result<(), String> {
        if !(self.efficiency > 0.0 && self.efficiency <= 1.0) {
            return Err(format!(
                "efficiency {} is not above 0 and at most 1",
                self.efficiency
            ));
        }
        if !(1.0..=10.0).contains(&self.imbalance) {
            return Err(format!(
                "imbalance {} is not between 1 and 10",
                self.imbalance
            ));
        }
        if !(self.afr > 0.0 && self.afr < 1.0) {
            return Err(format!(
                "annual failure rate {} is not between 0 and 1",
                self.afr
            ));
        }
        if !(0.0..1e-6).contains(&self.ure_per_bit) {
            return Err(format!(
                "unrecoverable read error rate {} per bit is not between 0 and 1e-6",
                self.ure_per_bit
            ));
        }
        if self.chunk_bytes < 4096 || !self.chunk_bytes.is_power_of_two() {
            return Err(format!(
                "chunk {} bytes is not a power of two of at least 4K",
                self.chunk_bytes
            ));
        }
        Ok(())
    }
}

const NOTES: &[&str] = &[
    "One member has failed; the rebuild covers the whole member, as md's recovery does, not only written data.",
    "Hot spare (raid levels, dRAID without distributed spares): survivors read the member once and the spare writes it once, in step; time is one pass at the members' mean bandwidth.",
    "Distributed spare: each of the C-1 survivors reads DX/(C-1) and writes X/(C-1) (uraid reads the D columns a recovery needs, ZFS all W-1); reads and writes share the disk; times the imbalance.",
    "Rebalance: the replacement disk is written whole at one disk's bandwidth, with redundancy already restored; hot-spare layouts have none.",
    "Reduced redundancy lasts the rebuild; the time to notice the failure and to fetch a replacement is not counted. Zero redundancy (one more failure loses data) lasts it too where the layout tolerates one failure; uraid reports the time it really spent so in detail and the NoRedundancy/RedundancyRestored events.",
    "A further failure beyond the layout's tolerance during the window loses data: dRAID spreads every group over all children, so any two children share groups.",
    "Unrecoverable read errors count on the reads made with no redundancy left, taking the whole window's reads when the last redundancy is lost mid-window.",
    "Times are divided by the efficiency, the engine's rebuild rate over the disks' streaming rate, to be calibrated against what uraid measures.",
];

/// One layout's figures.
#[derive(Clone, Debug, Serialize)]
pub struct LayoutPlan {
    pub level: String,
    /// The layout asked for (the others are for comparison).
    pub requested: bool,
    pub capacity_bytes: u64,
    pub failures_tolerated: u32,
    /// "hot spare" or "distributed spare".
    pub rebuild_target: &'static str,
    pub rebuild_seconds: f64,
    /// How long the array runs with one failure's redundancy missing.
    pub reduced_redundancy_seconds: f64,
    /// How long of that one more failure would lose data (no redundancy
    /// left): the whole rebuild where the layout tolerates one failure,
    /// none where it tolerates more.
    pub zero_redundancy_seconds: f64,
    /// The same when as many members fail as the layout tolerates (a
    /// second failure during a raid6's or draid2's rebuild): until no row
    /// is left without redundancy. Where every row holds every member
    /// (md's levels) that is the first rebuild; a dRAID rebuilds the rows
    /// that hold every failed child first, and they are that share of its
    /// rows.
    pub zero_redundancy_at_tolerance_seconds: f64,
    pub rebalance_seconds: f64,
    /// Bytes the busiest survivor reads and writes in the rebuild.
    pub busiest_survivor_bytes: f64,
    /// Bytes read from survivors in all, which an unreadable sector may hit.
    pub read_bytes: f64,
    /// Probability of more further failures than tolerated in the window.
    pub p_further_failures: f64,
    /// Probability of an unrecoverable read error on the reads made with
    /// no redundancy left.
    pub p_unrecoverable_read: f64,
    /// Probability of losing data before the rebuild ends.
    pub p_data_loss: f64,
}

/// P(at least `k` of `m` independent events of probability `p`).
fn at_least(k: u32, m: u32, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > m {
        return 0.0;
    }
    1.0 - (0..k).map(|i| exactly(i, m, p)).sum::<f64>()
}

/// P(exactly `k` of `m` independent events of probability `p`), in logs so
/// that 255 members do not overflow.
fn exactly(k: u32, m: u32, p: f64) -> f64 {
    if k > m {
        return 0.0;
    }
    if p <= 0.0 {
        return if k == 0 { 1.0 } else { 0.0 };
    }
    let ln_choose: f64 = (0..k)
        .map(|i| f64::from(m - i).ln() - f64::from(i + 1).ln())
        .sum();
    (ln_choose + f64::from(k) * p.ln() + f64::from(m - k) * (-p).ln_1p()).exp()
}

/// Plans one layout.
pub fn plan(scheme: Scheme, members: &Members, a: &Assumptions) -> LayoutPlan {
    let n = members.raid_devices;
    let x = members.member_bytes as f64;
    let pass = members.pass_seconds;
    // Survivors whose loss would cost data, and how many of them may still
    // fail after the first; what an unreadable sector would hit.
    let (at_risk, tolerance, read_bytes) = match scheme {
        Scheme::Raid1 => (n - 1, n - 2, x),
        Scheme::Raid5 => (n - 1, 0, f64::from(n - 1) * x),
        Scheme::Raid6 => (n - 1, 1, f64::from(n - 1) * x),
        Scheme::Raid10 => (1, 0, x),
        Scheme::Draid(s) => (n - 1, s.parity - 1, f64::from(s.data) * x),
    };
    let (target, busiest, rebuild, rebalance) = match scheme {
        Scheme::Draid(s) if s.spares > 0 => {
            let imbalance = layout_imbalance(s, members.member_bytes, a.chunk_bytes)
                .map_or(a.imbalance, |layout| layout.max(a.imbalance));
            let share = f64::from(s.data + 1) / f64::from(n - 1) * imbalance;
            let rebuild = share * pass / a.efficiency;
            ("distributed spare", share * x, rebuild, pass / a.efficiency)
        }
        _ => ("hot spare", x, pass / a.efficiency, 0.0),
    };
    let lambda = -(1.0 - a.afr).ln() / YEAR_SECONDS;
    let p_member = -(-lambda * rebuild).exp_m1();
    let p_further = at_least(tolerance + 1, at_risk, p_member);
    let p_ure = -(-read_bytes * 8.0 * a.ure_per_bit).exp_m1();
    let p_loss = (p_further + exactly(tolerance, at_risk, p_member) * p_ure).min(1.0);
    LayoutPlan {
        level: scheme.name(),
        requested: false,
        capacity_bytes: scheme.capacity_bytes(n, members.member_bytes, a.chunk_bytes),
        failures_tolerated: scheme.failures_tolerated(n),
        rebuild_target: target,
        rebuild_seconds: rebuild,
        reduced_redundancy_seconds: rebuild,
        zero_redundancy_seconds: if scheme.failures_tolerated(n) <= 1 {
            rebuild
        } else {
            0.0
        },
        zero_redundancy_at_tolerance_seconds: rebuild * endangered_share(scheme),
        rebalance_seconds: rebalance,
        busiest_survivor_bytes: busiest,
        read_bytes,
        p_further_failures: p_further,
        p_unrecoverable_read: p_ure,
        p_data_loss: p_loss,
    }
}

/// The share of the first failed member's rows that also hold every other
/// failed one, when as many fail as the layout tolerates: the rows a
/// rebuild that takes the most endangered first must do before none is
/// left at zero redundancy. A dRAID group of W columns among the N
/// children outside the spares holds another given child with
/// probability (W-1)/(N-1), a third (W-2)/(N-2), and so on; md's levels
/// put every member in every row.
fn endangered_share(scheme: Scheme) -> f64 {
    let Scheme::Draid(s) = scheme else {
        return 1.0;
    };
    let width = f64::from(s.data + s.parity);
    let disks = f64::from(s.children - s.spares);
    (1..s.parity)
        .map(|k| (width - f64::from(k)) / (disks - f64::from(k)))
        .product()
}

/// The most slices [`layout_imbalance`] walks (a few tens of
/// milliseconds at 90 children); members of more take DEFAULT_IMBALANCE,
/// what a full rotation of the maps gives.
const IMBALANCE_SLICES_MAX: u64 = 4096;

/// The busiest survivor's rebuild I/O over the average, from the dRAID's
/// own permutation maps over the slices members of `member_bytes` hold,
/// for the worst placed failed child; None when no such layout fits or
/// the members hold more slices than are worth walking.
/// Members of few slices rotate the maps too little to spread the load:
/// 1.37 at 48 children over 48 slices (7.5 GiB members of 8d+2p), 1.11
/// over 480; a full rotation gives the 1.03 to 1.06 of DEFAULT_IMBALANCE.
fn layout_imbalance(s: DraidSpec, member_bytes: u64, chunk_bytes: u64) -> Option<f64> {
    let params = |dev_sectors| crate::geometry::DraidParams {
        parity: s.parity as usize,
        data: s.data as usize,
        children: s.children as usize,
        spares: s.spares as usize,
        chunk_sectors: (chunk_bytes / 512).max(8),
        dev_sectors,
    };
    let member_sectors = member_bytes / 512;
    let slice = crate::geometry::Draid::new(&params(member_sectors))
        .ok()?
        .devslice_sectors();
    let slices = member_sectors / slice;
    if slices > IMBALANCE_SLICES_MAX {
        return None;
    }
    let g = crate::geometry::Draid::new(&params(slices * slice)).ok()?;
    let worst = (0..s.children as usize)
        .map(|failed| {
            let load: Vec<u64> = g
                .rebuild_load(failed, 0..g.slices())
                .iter()
                .enumerate()
                .filter(|(child, _)| *child != failed)
                .map(|(_, (read, written))| read + written)
                .collect();
            let mean = load.iter().sum::<u64>() as f64 / load.len().max(1) as f64;
            load.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0)
        })
        .fold(1.0, f64::max);
    Some(worst)
}

/// The layouts worth comparing for `devices` members: raid5, raid6 and
/// raid10 where they fit, and dRAID with one distributed spare at each
/// parity with 4 and 8 data columns.
pub fn comparisons(devices: u32) -> Vec<Scheme> {
    let mut schemes = Vec::new();
    for scheme in [Scheme::Raid5, Scheme::Raid6] {
        if scheme.check(devices).is_ok() {
            schemes.push(scheme);
        }
    }
    if devices >= 4 && devices.is_multiple_of(2) {
        schemes.push(Scheme::Raid10);
    }
    for parity in 1..=3 {
        for data in [4, 8] {
            let spec = DraidSpec {
                parity,
                data,
                children: devices,
                spares: 1,
            };
            if spec.validate().is_ok() {
                schemes.push(Scheme::Draid(spec));
            }
        }
    }
    schemes
}

/// The whole answer: the requested layout first (if any), then the
/// comparisons that differ from it.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub members: Members,
    pub assumptions: Assumptions,
    pub layouts: Vec<LayoutPlan>,
}

pub fn plan_all(requested: Option<Scheme>, members: Members, assumptions: Assumptions) -> Plan {
    let mut layouts = Vec::new();
    if let Some(scheme) = requested {
        let mut first = plan(scheme, &members, &assumptions);
        first.requested = true;
        layouts.push(first);
    }
    for scheme in comparisons(members.raid_devices) {
        if Some(scheme) != requested {
            layouts.push(plan(scheme, &members, &assumptions));
        }
    }
    Plan {
        members,
        assumptions,
        layouts,
    }
}

#[cfg(test)]
mod tests;
