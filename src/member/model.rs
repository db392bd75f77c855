//! Named device models: how fast a kind of drive streams at each point of
//! its address space, and how long it takes to seek. Pure arithmetic, no I/O.
//!
//! The rebuild planner needs the bandwidth of a whole-member pass, and that
//! is not one number for a spinning disk: the outer tracks pass under the
//! head faster than the inner ones. A 14 TB 7200 rpm drive measured with
//! `dd` streams about 265 MB/s at the outer edge and 145 MB/s at the inner
//! edge, so a model with a single speed would be off by almost a factor of
//! two at one end or the other.
//!
//! **Shape.** A spinning disk records at a roughly constant linear density
//! (zoned bit recording) and turns at a constant speed, so bandwidth is
//! proportional to the radius of the track. Capacity grows with the area
//! swept, so the LBA fraction `f` (0 at the outer edge, where LBA 0 lives)
//! reaches radius `r` when `f = (R² − r²)/(R² − r_in²)`. Solving for `r`
//! gives `bw(f) = bw_outer · sqrt(1 − f·(1 − k²))` with `k = bw_inner /
//! bw_outer`. It is chosen over a straight line in `f` because it is what
//! the geometry says, because it has closed forms for the time to stream a
//! range, and because the two differ by only a few percent in the mean: real
//! drives step through a few dozen zones that follow this curve. A
//! consequence worth knowing: a whole pass takes as long as streaming at
//! the average of the two edge speeds (each millimetre of stroke holds
//! bytes in proportion to its radius and streams them in proportion to it
//! too), 205 MB/s for the 14 TB disk. Solid state models are flat.
//!
//! Bandwidths are in bytes per second and capacities in bytes, both decimal
//! as data sheets give them (1 MB = 10^6 bytes).

use std::fmt;

/// One kind of drive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceModel {
    pub name: &'static str,
    /// What it is, for listings.
    pub about: &'static str,
    pub capacity_bytes: u64,
    /// Sequential bandwidth at LBA 0 (the outer edge of a disk).
    pub outer_bytes_per_s: f64,
    /// Sequential bandwidth at the last LBA (the inner edge); equal to the
    /// outer one for a flat device.
    pub inner_bytes_per_s: f64,
    /// Average seek (a third of the stroke), without rotational delay.
    pub seek_s: f64,
    /// Spindle speed; `None` for solid state.
    pub rpm: Option<u32>,
    /// Unrecoverable read errors per bit read, as data sheets state them:
    /// 1 in 10^15 for nearline disks, 10^17 for enterprise flash.
    pub ure_per_bit: f64,
}

const MB: f64 = 1e6;
const TB: u64 = 1_000_000_000_000;

/// The disk that was measured: 265 MB/s at the outer edge, 145 MB/s at the
/// inner (`dd` over a whole Toshiba MG07 14 TB drive).
const HDD_14T: DeviceModel = DeviceModel {
    name: "hdd-14t",
    about: "14 TB 7200 rpm disk, 265 MB/s outer to 145 MB/s inner (measured with dd)",
    capacity_bytes: 14 * TB,
    outer_bytes_per_s: 265.0 * MB,
    inner_bytes_per_s: 145.0 * MB,
    seek_s: 8.5e-3,
    rpm: Some(7200),
    ure_per_bit: 1e-15,
};

/// The models known by name. The other disks take the data sheet class of
/// their size, and say so in `about`.
pub const MODELS: &[DeviceModel] = &[
    HDD_14T,
    // Same platter generation and spindle speed, two more platters' worth:
    // the same speeds over a larger span.
    DeviceModel {
        name: "hdd-16t",
        about: "16 TB 7200 rpm disk, the 14 TB disk's 265 to 145 MB/s (same platter class)",
        capacity_bytes: 16 * TB,
        ..HDD_14T
    },
    DeviceModel {
        name: "hdd-4t",
        about: "4 TB 7200 rpm disk, 200 MB/s outer to 100 MB/s inner (data sheet class)",
        capacity_bytes: 4 * TB,
        outer_bytes_per_s: 200.0 * MB,
        inner_bytes_per_s: 100.0 * MB,
        seek_s: 8.5e-3,
        rpm: Some(7200),
        ure_per_bit: 1e-15,
    },
    DeviceModel {
        name: "ssd-sata",
        about: "3.84 TB SATA SSD, 530 MB/s flat, 0.1 ms access",
        capacity_bytes: 3_840_000_000_000,
        outer_bytes_per_s: 530.0 * MB,
        inner_bytes_per_s: 530.0 * MB,
        seek_s: 0.1e-3,
        rpm: None,
        ure_per_bit: 1e-17,
    },
    DeviceModel {
        name: "nvme",
        about: "3.84 TB NVMe SSD, 2500 MB/s flat (sustained writes), 0.02 ms access",
        capacity_bytes: 3_840_000_000_000,
        outer_bytes_per_s: 2500.0 * MB,
        inner_bytes_per_s: 2500.0 * MB,
        seek_s: 0.02e-3,
        rpm: None,
        ure_per_bit: 1e-17,
    },
];

/// A known model's name: small and `Copy`, so that settings which follow a
/// model (a throttle) can hold one, and written as the name in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelName(pub &'static str);

impl ModelName {
    /// The name of a known model; the error lists the known ones.
    pub fn parse(name: &str) -> Result<ModelName, String> {
        DeviceModel::by_name(name).map(|m| ModelName(m.name))
    }
}

impl serde::Serialize for ModelName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ModelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ModelName, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(d)?;
        ModelName::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// The names of the models, for messages.
pub fn model_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

impl DeviceModel {
    /// A model by name; the error is one line listing the known ones.
    pub fn by_name(name: &str) -> Result<DeviceModel, String> {
        MODELS
            .iter()
            .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
            .copied()
            .ok_or_else(|| format!("unknown device model '{name}' (known: {})", model_names()))
    }

    /// `1 − k²`: how much of the outer bandwidth's square is lost by the
    /// inner edge; 0 for a flat device.
    fn falloff(&self) -> f64 {
        let k = self.inner_bytes_per_s / self.outer_bytes_per_s;
        (1.0 - k * k).max(0.0)
    }

    /// Sequential bandwidth at an LBA fraction (0 = first LBA, 1 = last),
    /// clamped into 0..=1.
    pub fn bandwidth_at(&self, fraction: f64) -> f64 {
        let f = fraction.clamp(0.0, 1.0);
        self.outer_bytes_per_s * (1.0 - f * self.falloff()).sqrt()
    }

    /// Seconds to stream the LBA fractions `start..end` once, front to back.
    /// The integral of `capacity / bw(f)` in closed form.
    pub fn stream_seconds(&self, start: f64, end: f64) -> f64 {
        let (start, end) = (start.clamp(0.0, 1.0), end.clamp(0.0, 1.0));
        if end <= start {
            return 0.0;
        }
        let capacity = self.capacity_bytes as f64;
        let a = self.falloff();
        if a < 1e-12 {
            return capacity * (end - start) / self.outer_bytes_per_s;
        }
        let root = |f: f64| (1.0 - a * f).sqrt();
        capacity * 2.0 * (root(start) - root(end)) / (a * self.outer_bytes_per_s)
    }

    /// The mean bandwidth of streaming `start..end`: bytes over time, which
    /// is what a whole pass achieves (not the average of the bandwidths).
    pub fn mean_bandwidth(&self, start: f64, end: f64) -> f64 {
        let seconds = self.stream_seconds(start, end);
        if seconds <= 0.0 {
            return self.bandwidth_at(start);
        }
        self.capacity_bytes as f64 * (end.clamp(0.0, 1.0) - start.clamp(0.0, 1.0)) / seconds
    }

    /// Average seek time, without waiting for the sector to come round.
    pub fn seek_seconds(&self) -> f64 {
        self.seek_s
    }

    /// Average time to reach a random sector: the seek plus half a turn.
    pub fn access_seconds(&self) -> f64 {
        self.seek_s + self.rpm.map_or(0.0, |rpm| 30.0 / f64::from(rpm))
    }
}

impl fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.about)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-12)
    }

    #[test]
    fn the_ends_are_the_measured_speeds() {
        let m = DeviceModel::by_name("hdd-14t").unwrap();
        assert!(close(m.bandwidth_at(0.0), 265e6, 1e-9));
        assert!(close(m.bandwidth_at(1.0), 145e6, 1e-9));
        assert!(m.bandwidth_at(0.5) < 265e6 && m.bandwidth_at(0.5) > 145e6);
        // Bandwidth falls faster towards the inside: the inner half of the
        // LBAs is a narrower band of radius than the outer half.
        let mid = m.bandwidth_at(0.5);
        assert!(265e6 - mid < mid - 145e6);
    }

    #[test]
    fn streaming_time_matches_a_numeric_integral() {
        for model in MODELS {
            let (start, end) = (0.1, 0.8);
            let steps = 100_000;
            let step = (end - start) / steps as f64;
            let numeric: f64 = (0..steps)
                .map(|i| {
                    let f = start + (i as f64 + 0.5) * step;
                    model.capacity_bytes as f64 * step / model.bandwidth_at(f)
                })
                .sum();
            let closed = model.stream_seconds(start, end);
            assert!(
                close(closed, numeric, 1e-6),
                "{}: {closed} {numeric}",
                model.name
            );
        }
    }

    #[test]
    fn a_whole_pass_of_the_14t_disk() {
        let m = DeviceModel::by_name("hdd-14t").unwrap();
        let mean = m.mean_bandwidth(0.0, 1.0);
        // Exactly the average of the ends: with bandwidth proportional to
        // radius and capacity to radius times its width, each millimetre of
        // stroke takes the same time, so a whole pass is the mean over radius.
        assert!(close(mean, 205e6, 1e-9), "{mean}");
        let hours = m.stream_seconds(0.0, 1.0) / 3600.0;
        assert!(hours > 18.9 && hours < 19.1, "{hours}");
        assert!(close(m.access_seconds(), 8.5e-3 + 30.0 / 7200.0, 1e-9));
    }

    #[test]
    fn flat_models_are_flat_and_names_are_checked() {
        let ssd = DeviceModel::by_name("SSD-SATA").unwrap();
        assert_eq!(ssd.bandwidth_at(0.0), ssd.bandwidth_at(1.0));
        assert!(close(ssd.mean_bandwidth(0.2, 0.9), 530e6, 1e-9));
        assert!(close(ssd.stream_seconds(0.0, 1.0), 3.84e12 / 530e6, 1e-9));
        assert_eq!(ssd.access_seconds(), 0.1e-3);
        let err = DeviceModel::by_name("floppy").unwrap_err();
        assert!(err.contains("hdd-14t") && err.lines().count() == 1, "{err}");
        assert_eq!(ssd.stream_seconds(0.5, 0.5), 0.0);
    }
}
