//! How much of a phase the members' disk was busy: the share of the time
//! it had at least one request in flight (`/proc/diskstats`' io_ticks,
//! what iostat calls %util).
//!
//! Why: a target that keeps the same requests in flight as raw's but
//! reaches the disk in bursts leaves it idle between them, and its
//! requests then wait no less for it. uraid's disk random reads reach
//! about 0.8 of raw's because the disk sits idle 19 % of the time for the
//! NBD round trip (docs/BENCHMARKS.md, "Disk random read"); this figure
//! says so in every run. io_ticks is kept per jiffy by the block layer, so it is an
//! approximation (it matched a block trace's idle share within 2 % there).

use std::path::Path;
use std::time::Instant;

/// A block device, by major and minor number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    major: u32,
    minor: u32,
}

/// The devices that hold `paths` (a block device member is its own), each
/// once, among those /proc/diskstats counts: none for members in memory.
pub fn devices_of(paths: &[impl AsRef<Path>]) -> Vec<Device> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let stats = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let mut devices = Vec::new();
    for path in paths {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let dev = if meta.file_type().is_block_device() {
            meta.rdev()
        } else {
            meta.dev()
        };
        let device = Device {
            major: libc::major(dev),
            minor: libc::minor(dev),
        };
        if !devices.contains(&device) && io_ticks_in(&stats, device).is_some() {
            devices.push(device);
        }
    }
    devices
}

/// The io_ticks (milliseconds busy) of `device` in a /proc/diskstats text:
/// the tenth number after the name.
fn io_ticks_in(stats: &str, device: Device) -> Option<u64> {
    stats.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let major: u32 = fields.next()?.parse().ok()?;
        let minor: u32 = fields.next()?.parse().ok()?;
        if (major, minor) != (device.major, device.minor) {
            return None;
        }
        fields.nth(10)?.parse().ok()
    })
}

/// A reading of the devices' io_ticks, to compare with a later one.
pub struct Busy {
    at: Instant,
    ticks: Vec<u64>,
}

impl Busy {
    /// Reads `devices` now; None when there are none or one is gone.
    pub fn start(devices: &[Device]) -> Option<Busy> {
        Some(Busy {
            at: Instant::now(),
            ticks: read(devices)?,
        })
    }

    /// The share of the time since `start` that the devices were busy,
    /// averaged over them, 0..=1.
    pub fn share(&self, devices: &[Device]) -> Option<f64> {
        let ticks = read(devices)?;
        let elapsed_ms = self.at.elapsed().as_secs_f64() * 1000.0;
        if elapsed_ms <= 0.0 || ticks.len() != self.ticks.len() {
            return None;
        }
        let shares = ticks
            .iter()
            .zip(&self.ticks)
            .map(|(&now, &then)| (now.saturating_sub(then) as f64 / elapsed_ms).min(1.0));
        Some(shares.sum::<f64>() / ticks.len() as f64)
    }
}

fn read(devices: &[Device]) -> Option<Vec<u64>> {
    if devices.is_empty() {
        return None;
    }
    let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
    devices.iter().map(|&d| io_ticks_in(&stats, d)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_ticks_are_the_thirteenth_field_of_the_devices_line() {
        let stats = "\
 254       0 vda 100 0 800 50 200 0 1600 70 3 4321 120 0 0 0 0 9 8
 254       1 vda1 10 0 80 5 20 0 160 7 0 432 12 0 0 0 0 0 0
   7       0 loop0 1 0 2 0 0 0 0 0 0 5 0
";
        let vda = Device {
            major: 254,
            minor: 0,
        };
        assert_eq!(io_ticks_in(stats, vda), Some(4321));
        let vda1 = Device {
            major: 254,
            minor: 1,
        };
        assert_eq!(io_ticks_in(stats, vda1), Some(432));
        let absent = Device { major: 8, minor: 0 };
        assert_eq!(io_ticks_in(stats, absent), None);
        // A line cut short is no reading.
        assert_eq!(io_ticks_in("254 0 vda 1 2 3", vda), None);
    }

    #[test]
    fn memory_has_no_disk_and_a_file_on_one_is_read() {
        assert!(devices_of(&["/dev/shm"]).is_empty());
        assert!(Busy::start(&[]).is_none());
        // Wherever the build's own files are, if /proc/diskstats counts
        // their device, a reading is a share of time.
        let here = devices_of(&[env!("CARGO_MANIFEST_DIR")]);
        if let Some(busy) = Busy::start(&here) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let share = busy.share(&here).unwrap();
            assert!((0.0..=1.0).contains(&share), "{share}");
        }
    }
}
