//! A member device's block queue, from /sys/dev/block/MAJ:MIN (its disk's
//! queue for a partition), with the seeds' advice; an image file has no
//! queue of its own, and says so.

use super::{Check, Status};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The queue attributes checked, in order.
const ATTRIBUTES: [&str; 6] = [
    "scheduler",
    "read_ahead_kb",
    "max_sectors_kb",
    "nr_requests",
    "rotational",
    "write_cache",
];

pub(super) fn checks(device: &Path) -> Vec<Check> {
    let name = |attr: &str| format!("queue {attr} {}", device.display());
    let meta = match std::fs::metadata(device) {
        Ok(m) => m,
        Err(e) => {
            return vec![Check::unavailable(
                name("device"),
                format!("{}: {e}", device.display()),
            )]
        }
    };
    if !meta.file_type().is_block_device() {
        let reason = "an image file has no block queue: the device under its file system governs";
        return ATTRIBUTES
            .iter()
            .map(|a| {
                Check::unavailable(name(a), reason)
                    .fix("give the block device that holds the file to see its queue")
            })
            .collect();
    }
    let Some(queue) = queue_dir(meta.rdev()) else {
        return ATTRIBUTES
            .iter()
            .map(|a| Check::unavailable(name(a), "no queue folder under /sys/dev/block"))
            .collect();
    };
    let read = |attr: &str| {
        std::fs::read_to_string(queue.join(attr))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let rotational = read("rotational").as_deref() == Some("1");
    ATTRIBUTES
        .iter()
        .map(|attr| match read(attr) {
            None => Check::unavailable(
                name(attr),
                format!("{}/{attr} cannot be read", queue.display()),
            ),
            Some(value) => advise(name(attr), attr, &value, rotational),
        })
        .collect()
}

/// The queue folder of a device number: its own, or its disk's for a
/// partition (whose folder has no queue).
fn queue_dir(rdev: u64) -> Option<PathBuf> {
    let dev = PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ));
    let dev = std::fs::canonicalize(dev).ok()?;
    [dev.join("queue"), dev.join("../queue")]
        .into_iter()
        .find(|q| q.is_dir())
}

/// The advice for one attribute's value.
pub(super) fn advise(check: String, attr: &str, value: &str, rotational: bool) -> Check {
    let number = value.parse::<u64>().ok();
    let ok = |reason: &str| Check::new(check.clone(), Status::Ok, value).because(reason);
    let warn = |reason: &str, fix: &str| {
        Check::new(check.clone(), Status::Warn, value)
            .because(reason)
            .fix(fix)
    };
    match attr {
        "scheduler" => {
            let active = value
                .split_whitespace()
                .find(|w| w.starts_with('['))
                .map_or(value, |w| w.trim_matches(['[', ']']));
            match (active, rotational) {
                ("none", true) => warn(
                    "a rotational disk without a scheduler: seeks are not sorted",
                    "echo mq-deadline > /sys/block/DEV/queue/scheduler",
                ),
                ("bfq", _) => warn(
                    "bfq spends CPU per request that an array's members do not need",
                    "echo mq-deadline (or none for NVMe) > /sys/block/DEV/queue/scheduler",
                ),
                _ => ok("fine for an array member"),
            }
        }
        "read_ahead_kb" => match number {
            Some(kb) if kb < 128 => warn(
                "below the kernel's default of 128 KiB: sequential reads and rebuild scans go out in small requests",
                "blockdev --setra 2048 DEV (1 MiB), or uraid's read_ahead knob for the array",
            ),
            _ => ok("md-style sequential work reads ahead at least 128 KiB"),
        },
        "max_sectors_kb" => match number {
            Some(kb) if kb < 512 => warn(
                "requests are split below 512 KiB: full-stripe writes and rebuild reads cost more requests",
                "echo max_hw_sectors_kb's value > /sys/block/DEV/queue/max_sectors_kb",
            ),
            _ => ok("large requests pass whole"),
        },
        "nr_requests" => match number {
            Some(n) if n < 64 => warn(
                "a short queue caps the member's requests in flight",
                "echo 256 > /sys/block/DEV/queue/nr_requests",
            ),
            _ => ok("deep enough for the array's parallel member I/O"),
        },
        "rotational" => ok(if rotational {
            "a spinning disk: sequential rebuilds, seeks cost"
        } else {
            "solid state"
        }),
        "write_cache" => {
            if value == "write back" {
                ok("the drive caches writes; uraid flushes before superblocks and on FLUSH/FUA, so that is safe while the drive honours flushes")
            } else {
                ok("write through: every write reaches the medium before it completes")
            }
        }
        _ => ok(""),
    }
}
