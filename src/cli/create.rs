//! `uraid create`: a new array on member devices, with mdadm's options.

use super::CliResult;
use crate::array::{create_full, BitmapRequest, CreateOptions, MemberSpec};
use crate::format::Metadata;
use crate::geometry::{level_from_name, DraidSpec};
use crate::text::hostname;
use crate::units::parse_size_bytes;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// RAID level: linear, raid0, raid1, raid4, raid5, raid6, raid10 (or 0, 1, 4, 5, 6, 10),
    /// or a declustered RAID by ZFS's spec: draidP[:Dd][:Cc][:Ss] (P parity 1-3, D data
    /// per group, C children, S distributed spares).
    #[arg(long, short = 'l')]
    level: String,
    /// Number of active members (a dRAID's children).
    #[arg(long, short = 'n')]
    raid_devices: u32,
    /// Number of spares: the devices listed after the raid devices (mdadm's
    /// --spare-devices). Devices beyond --raid-devices are refused without it.
    #[arg(long, short = 'x', value_name = "N")]
    spare_devices: Option<u32>,
    /// Chunk size (K/M/G suffixes; a bare number is KiB), default 512K.
    #[arg(long, short = 'c')]
    chunk: Option<String>,
    /// Layout by mdadm's name: left-symmetric, right-asymmetric, parity-first, n2, f2, o2, ...
    #[arg(long, short = 'p')]
    layout: Option<String>,
    /// Write-intent bitmap: internal (next to each superblock, 1.x metadata) or none.
    #[arg(long, short = 'b', default_value = "none")]
    bitmap: String,
    /// Bytes of data per bitmap bit (K/M/G suffixes; a bare number is KiB);
    /// default as mdadm: at least 64M, with at most 128K of bitmap.
    #[arg(long)]
    bitmap_chunk: Option<String>,
    /// Skip the initial resync: the members are known to be consistent (e.g. all zero).
    #[arg(long)]
    assume_clean: bool,
    /// Array name (stored as "homehost:name").
    #[arg(long, short = 'N', default_value = "uraid")]
    name: String,
    /// Space to use on each member (K/M/G suffixes; a bare number is KiB).
    #[arg(long, short = 'z')]
    size: Option<String>,
    /// Superblock version: 1.2 (default), 1.1 or 1.0.
    #[arg(long, short = 'e', default_value = "1.2")]
    metadata: String,
    /// Host name to record in the array name; "<none>" records none.
    #[arg(long)]
    homehost: Option<String>,
    /// Overwrite devices that hold a filesystem, a partition table or another
    /// array, and accept devices more than 1% smaller than the largest (every
    /// member then gives only what the smallest has).
    #[arg(long, short = 'f')]
    force: bool,
    /// A write journal on this device (md's raid5-cache, raid4/5/6): every
    /// row's new data and parity reach it before the members, so a crash
    /// never leaves a row torn (the write hole).
    #[arg(long, value_name = "DEV")]
    write_journal: Option<PathBuf>,
    /// `crc32c`: a checksum of every 4 KiB of every member, kept after md's
    /// data area (metadata 1.1/1.2), so that a block a disk returns wrong
    /// without an error is found on every read and check and rewritten
    /// from redundancy; `none` (the default) keeps md's behaviour.
    #[arg(long, value_name = "SCHEME", default_value = "none")]
    integrity: String,
    /// The array's knobs, saved with its other settings (see `--set help`).
    #[command(flatten)]
    tuning: super::tuning::TuningArgs,
    /// Member devices or image files; "missing" leaves a slot empty (degraded).
    #[arg(required = true)]
    devices: Vec<String>,
}

pub fn run(args: &CreateArgs) -> CliResult {
    check_spare_count(args)?;
    // A dRAID is named by ZFS's spec string, which carries its layout.
    let (level, layout) = if args.level.starts_with("draid") {
        if args.layout.is_some() {
            return Err("a dRAID's layout is in its spec (draidP:Dd:Cc:Ss), not --layout".into());
        }
        let spec = DraidSpec::parse(&args.level, Some(args.raid_devices))?;
        if spec.children != args.raid_devices {
            return Err(format!(
                "'{}' says {} children but {} raid devices are given",
                args.level, spec.children, args.raid_devices
            ));
        }
        (
            spec.level(),
            Some(format!("{}d:{}s", spec.data, spec.spares)),
        )
    } else {
        let level = level_from_name(&args.level)
            .ok_or_else(|| format!("unknown level '{}'", args.level))?;
        (level, args.layout.clone())
    };
    let bitmap_chunk = args
        .bitmap_chunk
        .as_deref()
        .map(parse_size_bytes)
        .transpose()?;
    let bitmap = match (args.bitmap.as_str(), bitmap_chunk) {
        ("internal", chunk_bytes) => BitmapRequest::Internal { chunk_bytes },
        ("none", None) => BitmapRequest::None,
        ("none", Some(_)) => return Err("--bitmap-chunk needs --bitmap internal".into()),
        (other, _) => {
            return Err(format!(
                "--bitmap {other} is not supported; use --bitmap internal or --bitmap none"
            ))
        }
    };
    let metadata: Metadata = args.metadata.parse().map_err(|e: String| e)?;
    let integrity = match args.integrity.as_str() {
        "none" => false,
        crate::array::integrity::INTEGRITY_SCHEME => true,
        other => {
            return Err(format!(
                "--integrity {other} is not a scheme uraid has; use --integrity crc32c or none"
            ))
        }
    };
    // Knobs are checked before anything is written, saved after.
    let settings = args.tuning.settings(
        &crate::engine::tuning::TuningValues::defaults(8),
        args.write_journal.is_some(),
    )?;
    let chunk_bytes = args.chunk.as_deref().map(parse_size_bytes).transpose()?;
    let size_sectors = args
        .size
        .as_deref()
        .map(parse_size_bytes)
        .transpose()?
        .map(|b| b / 512);
    let devices: Vec<MemberSpec> = args
        .devices
        .iter()
        .map(|d| {
            if d == "missing" {
                MemberSpec::Missing
            } else {
                MemberSpec::Device(PathBuf::from(d))
            }
        })
        .collect();
    let homehost = match args.homehost.as_deref() {
        Some("<none>") => None,
        Some(host) => Some(host.to_string()),
        None => Some(hostname()).filter(|h| !h.is_empty()),
    };
    let options = CreateOptions {
        level,
        raid_disks: args.raid_devices,
        chunk_bytes,
        layout,
        metadata,
        assume_clean: args.assume_clean,
        name: args.name.clone(),
        size_sectors,
        force: args.force,
        homehost,
        integrity,
    };
    let bar = ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("resync [{bar:30}] {percent}% {pos}/{len} stripes eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let array = create_full(
        &devices,
        args.write_journal.as_deref(),
        &options,
        bitmap,
        |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    )
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    crate::engine::tuning::saved::save_changes(
        &array.sb.uuid_string(),
        &settings,
        args.tuning.i_accept_data_loss,
    )?;
    let roles = DeviceRoles {
        raid: args.raid_devices,
        missing: devices[..args.raid_devices as usize]
            .iter()
            .filter(|d| **d == MemberSpec::Missing)
            .count() as u32,
        spares: args.spare_devices.unwrap_or(0),
        journal: args.write_journal.is_some(),
        distributed_spares: array.geometry.draid().map_or(0, |d| d.spares() as u32),
    };
    eprintln!(
        "uraid: created {} array {} ({} KiB) on {}",
        level,
        array.sb.uuid_string(),
        array.array_sectors() / 2,
        roles.summary(level.is_draid())
    );
    Ok(())
}

/// Refuses a device list longer or shorter than the raid devices and the
/// spares that were asked for. Extra devices taken as spares without a
/// word would have their contents overwritten by a spare's superblock,
/// and a miscounted list is more often a mistake than a wish; mdadm
/// refuses it too. A dRAID's distributed spares are in its spec, not in
/// the list, and a write journal is given by --write-journal.
fn check_spare_count(args: &CreateArgs) -> CliResult {
    let raid = args.raid_devices as usize;
    let given = args.devices.len();
    // Too few for the raid devices: the library says so with the numbers.
    if given < raid {
        return Ok(());
    }
    let extra = given - raid;
    match args.spare_devices.map(|s| s as usize) {
        None if extra > 0 => {
            let draid = if args.level.starts_with("draid") {
                " (a dRAID's distributed spares are in its spec, not devices)"
            } else {
                ""
            };
            let would = if extra == 1 {
                "the last would become a spare"
            } else {
                "the others would become spares"
            };
            Err(format!(
                "{given} devices given for {raid} raid devices: {would}{draid}; say --spare-devices {extra} if that is meant"
            ))
        }
        Some(spares) if spares != extra => Err(format!(
            "--spare-devices {spares} but {extra} {} the {raid} raid devices",
            if extra == 1 {
                "device follows"
            } else {
                "devices follow"
            }
        )),
        _ => Ok(()),
    }
}

/// What the devices of a new array became, for create's last line.
struct DeviceRoles {
    raid: u32,
    missing: u32,
    spares: u32,
    journal: bool,
    distributed_spares: u32,
}

impl DeviceRoles {
    /// "6 devices: 4 raid devices, 1 spare, 1 journal"; the devices counted
    /// are those written to ("missing" is none).
    fn summary(&self, draid: bool) -> String {
        assert!(
            self.missing < self.raid,
            "create refuses an array of missing devices"
        );
        let written = self.raid - self.missing + self.spares + u32::from(self.journal);
        let plural =
            |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = vec![if draid {
            plural(self.raid, "child", "children")
        } else {
            plural(self.raid, "raid device", "raid devices")
        }];
        if self.missing > 0 {
            parts[0].push_str(&format!(" ({} missing)", self.missing));
        }
        if self.distributed_spares > 0 {
            parts.push(plural(
                self.distributed_spares,
                "distributed spare",
                "distributed spares",
            ));
        }
        if self.spares > 0 {
            parts.push(plural(self.spares, "spare", "spares"));
        }
        if self.journal {
            parts.push("1 journal".into());
        }
        format!(
            "{}: {}",
            plural(written, "device", "devices"),
            parts.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceRoles;

    fn roles(raid: u32, missing: u32, spares: u32, journal: bool, distributed: u32) -> DeviceRoles {
        DeviceRoles {
            raid,
            missing,
            spares,
            journal,
            distributed_spares: distributed,
        }
    }

    #[test]
    fn the_summary_names_spares_journals_and_missing_devices() {
        assert_eq!(
            roles(4, 0, 1, true, 0).summary(false),
            "6 devices: 4 raid devices, 1 spare, 1 journal"
        );
        assert_eq!(
            roles(3, 1, 0, false, 0).summary(false),
            "2 devices: 3 raid devices (1 missing)"
        );
        assert_eq!(
            roles(6, 0, 2, false, 1).summary(true),
            "8 devices: 6 children, 1 distributed spare, 2 spares"
        );
        assert_eq!(
            roles(2, 0, 0, false, 0).summary(false),
            "2 devices: 2 raid devices"
        );
    }
}
