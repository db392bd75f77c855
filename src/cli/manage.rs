//! `uraid manage`: change a running array through its control socket, as
//! mdadm --manage and md's sysfs knobs do: fail, remove and add members,
//! start a check or repair, set the rebuild speed limits; and, as mdadm
//! --grow, add or remove the bitmap and change the component size.

use super::CliResult;
use crate::control::{self, Request};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").multiple(false).args(["fail", "remove", "add", "re_add", "replace", "action", "speed_limit_min", "inject", "check_period", "grow", "auto_re_add"])))]
pub struct ManageArgs {
    /// The control socket of the running `uraid serve`.
    #[arg(long)]
    control: PathBuf,
    /// Mark a member faulty (its data is then served from redundancy).
    #[arg(long)]
    fail: Option<PathBuf>,
    /// Remove a faulty member or a spare.
    #[arg(long)]
    remove: Option<PathBuf>,
    /// Add a device: a spare, rebuilt into the array at once if it is degraded
    /// (or once the running recovery ends); a member that left comes back
    /// through the bitmap when it can.
    #[arg(long)]
    add: Option<PathBuf>,
    /// Take back a member that left, copying only what the write-intent
    /// bitmap marks (mdadm --re-add); refused with the reason when it
    /// cannot be a re-add.
    #[arg(long, value_name = "DEV")]
    re_add: Option<PathBuf>,
    /// With --fail: fail the member even if the array could then no longer
    /// serve its data. With --add or --replace --with: overwrite a device
    /// that holds another array's member, a filesystem or a partition table.
    #[arg(long)]
    force: bool,
    /// Inject a fault into a member (serve with --fault-injection): DEV FAULT,
    /// e.g. `--inject d3 pull`, `--inject d1 eio:read:1M+64K`, `--inject d2 latency:5ms`,
    /// `--inject d2 throttle:50M[:iops=N]` (bytes/s, reads and writes together;
    /// `throttle:off` lifts it), `--inject d2 hang` (I/O blocks until
    /// `hang:off`), `--inject d2 corrupt:read:1M+4K[:seed=N]` (reads there
    /// return wrong bytes without an error; `corrupt:write:...` stores wrong
    /// bytes), `--inject d2 corrupt:stored:1M+4K` (the bytes on the member
    /// go wrong now, once: bit rot), `--inject d2 heal` (clears bad and
    /// corrupt ranges), `--inject d3 restore` (clears every fault).
    #[arg(long, num_args = 2, value_names = ["DEV", "FAULT"])]
    inject: Option<Vec<String>>,
    /// Copy a member onto a new device while it stays in service, then swap (mdadm --replace).
    #[arg(long, requires = "with")]
    replace: Option<PathBuf>,
    /// The device that replaces the one given to --replace.
    #[arg(long)]
    with: Option<PathBuf>,
    /// Re-add members that failed by a timeout by themselves once they
    /// answer again (bitmap-guided), or stop doing so.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    auto_re_add: Option<String>,
    /// Run a consistency check every DAYS days (fractions allowed; 0 turns it off).
    #[arg(long, value_name = "DAYS")]
    check_period: Option<f64>,
    /// Change the array's shape (mdadm --grow): with --raid-devices, --chunk,
    /// --layout, --level, reshape it while it serves; with --size, change the
    /// component size; with --bitmap internal|none, add or remove the
    /// write-intent bitmap.
    #[arg(long)]
    grow: bool,
    /// With --grow: how much of each member the array uses, `max` (all that
    /// every member holds) or a size (K/M/G suffixes; a bare number is KiB).
    #[arg(long, requires = "grow", conflicts_with_all = ["bitmap", "bitmap_chunk", "raid_devices", "level", "layout", "chunk"])]
    size: Option<String>,
    /// With --grow: the new number of members, after --add of the spares it needs.
    #[arg(long, short = 'n', requires = "grow")]
    raid_devices: Option<u32>,
    /// With --grow --raid-devices fewer than now: the size the array keeps
    /// (K/M/G suffixes; a bare number is KiB, as mdadm's --array-size),
    /// stated to confirm that what lies beyond it is dropped.
    #[arg(long, requires = "raid_devices")]
    array_size: Option<String>,
    /// With --grow: the new level (raid4, raid5, raid6, ...).
    #[arg(long, short = 'l', requires = "grow")]
    level: Option<String>,
    /// With --grow: the new layout, by mdadm's name (left-symmetric, ...).
    #[arg(long, short = 'p', requires = "grow")]
    layout: Option<String>,
    /// With --grow: the new chunk size (K/M suffixes; a bare number is KiB).
    #[arg(long, short = 'c', requires = "grow")]
    chunk: Option<String>,
    /// With --grow: internal or none.
    #[arg(long)]
    bitmap: Option<String>,
    /// With --grow --bitmap internal: the bytes each bit covers (K/M/G).
    #[arg(long)]
    bitmap_chunk: Option<String>,
    /// md's sync_action: check (count mismatches), repair (fix them), idle (stop).
    #[arg(long)]
    action: Option<String>,
    /// md's sync_speed_min for this array, KiB/s per member.
    #[arg(long)]
    speed_limit_min: Option<u64>,
    /// md's sync_speed_max for this array, KiB/s per member (with
    /// --speed-limit-min or alone).
    #[arg(long, conflicts_with_all = ["fail", "remove", "add", "re_add", "replace", "action", "inject", "check_period", "grow", "auto_re_add"])]
    speed_limit_max: Option<u64>,
    /// Wait until no resync, recovery, check, repair or reshape runs
    /// (mdadm --wait), then say how what ran ended; fails if a job stopped
    /// on an error.
    #[arg(long, conflicts_with_all = ["fail", "remove", "add", "re_add", "replace", "action", "inject", "check_period", "grow", "auto_re_add", "speed_limit_min", "speed_limit_max", "force"])]
    wait: bool,
    /// The array's knobs, changed live and saved (see `--set help`).
    #[command(flatten)]
    tuning: super::tuning::TuningArgs,
}

pub fn run(args: &ManageArgs) -> CliResult {
    if args.wait {
        if !args.tuning.is_empty() {
            return Err("--wait cannot be combined with a setting".into());
        }
        return wait(&args.control);
    }
    // One change per command, as mdadm --manage takes one; the knobs
    // (several at once) are one change.
    let other = [
        args.fail.is_some(),
        args.remove.is_some(),
        args.add.is_some(),
        args.re_add.is_some(),
        args.replace.is_some(),
        args.action.is_some(),
        args.speed_limit_min.is_some() || args.speed_limit_max.is_some(),
        args.inject.is_some(),
        args.check_period.is_some(),
        args.grow,
        args.auto_re_add.is_some(),
    ]
    .iter()
    .any(|x| *x);
    match (other, args.tuning.is_empty()) {
        (false, true) => {
            return Err(
                "nothing to do: give --fail, --remove, --add, --re-add, --replace, --action, \
                        --speed-limit-min/max, --inject, --check-period, --grow, --auto-re-add \
                        or a setting"
                    .into(),
            )
        }
        (true, false) => {
            return Err("settings cannot be combined with another change in one command".into())
        }
        _ => {}
    }
    if args.force && args.fail.is_none() && args.add.is_none() && args.replace.is_none() {
        return Err("--force goes with --fail, --add or --replace".into());
    }
    let request = if let Some(device) = &args.fail {
        Request::Fail {
            device: absolute(device),
            force: args.force,
        }
    } else if let Some(device) = &args.remove {
        Request::Remove {
            device: absolute(device),
        }
    } else if let Some(device) = &args.add {
        Request::Add {
            device: absolute(device),
            force: args.force,
        }
    } else if let Some(device) = &args.re_add {
        Request::ReAdd {
            device: absolute(device),
        }
    } else if let (Some(device), Some(with)) = (&args.replace, &args.with) {
        Request::Replace {
            device: absolute(device),
            with: absolute(with),
            force: args.force,
        }
    } else if let (true, Some(size)) = (args.grow, &args.size) {
        Request::GrowSize {
            size_sectors: parse_component_size(size)?,
        }
    } else if args.grow
        && (args.raid_devices.is_some()
            || args.level.is_some()
            || args.layout.is_some()
            || args.chunk.is_some())
    {
        if args.bitmap.is_some() {
            return Err("--bitmap cannot be combined with a reshape in one command".into());
        }
        Request::Reshape {
            raid_devices: args.raid_devices,
            level: args.level.clone(),
            layout: args.layout.clone(),
            chunk_bytes: args
                .chunk
                .as_deref()
                .map(crate::units::parse_size_bytes)
                .transpose()?,
            array_size_sectors: args
                .array_size
                .as_deref()
                .map(crate::units::parse_size_bytes)
                .transpose()?
                .map(|bytes| bytes / crate::units::SECTOR_BYTES),
        }
    } else if args.grow {
        if args.bitmap.is_none() {
            return Err(
                "--grow needs what to change: --raid-devices, --chunk, --layout, --level, --size or --bitmap"
                    .into(),
            );
        }
        let chunk_bytes = args
            .bitmap_chunk
            .as_deref()
            .map(crate::units::parse_size_bytes)
            .transpose()?;
        Request::GrowBitmap {
            bitmap: args.bitmap.clone().unwrap_or_default(),
            chunk_bytes,
        }
    } else if let Some(on) = &args.auto_re_add {
        Request::AutoReAdd { on: on == "on" }
    } else if let Some(days) = args.check_period {
        Request::CheckPeriod { days }
    } else if let Some(inject) = &args.inject {
        Request::Inject {
            device: absolute(std::path::Path::new(&inject[0])),
            fault: inject[1].clone(),
        }
    } else if !args.tuning.is_empty() {
        Request::Set {
            // The server checks them: it knows whether write-back is allowed.
            settings: args.tuning.pairs()?,
            accept_data_loss: args.tuning.i_accept_data_loss,
        }
    } else if let Some(action) = &args.action {
        Request::SyncAction {
            action: action.clone(),
        }
    } else {
        Request::SpeedLimits {
            min_kib_per_s: args.speed_limit_min,
            max_kib_per_s: args.speed_limit_max,
        }
    };
    let message = control::command(&args.control, &request)?;
    eprintln!("uraid: {message}");
    Ok(())
}

/// mdadm --wait: blocks on the server's events until its jobs are idle
/// (none runs and none is ending), then says what ran and how it ended.
fn wait(socket: &std::path::Path) -> CliResult {
    let first = control::request(socket, &Request::Status)?;
    if first.jobs_idle.is_none() {
        return Err(format!(
            "{}: this server does not report when its jobs end; restart it with this uraid",
            socket.display()
        ));
    }
    let mut after = first.events.iter().map(|e| e.seq).max().unwrap_or(0);
    let mut ran: Vec<String> = first.sync_action.iter().cloned().collect();
    let mut status = first;
    let mut failures = Vec::new();
    while status.jobs_idle != Some(true) {
        let pid = status.pid;
        status = control::wait_events(socket, after, std::time::Duration::from_secs(1))?;
        if status.pid != pid {
            return Err(format!(
                "{}: the server was restarted while waiting (pid {pid}, now {})",
                socket.display(),
                status.pid
            ));
        }
        for event in status.events.iter().filter(|e| e.seq > after) {
            if event.event == "SyncFailed" {
                failures.push(event.detail.clone());
            }
        }
        after = status.events.iter().map(|e| e.seq).max().unwrap_or(after);
        if let Some(action) = &status.sync_action {
            if ran.last() != Some(action) {
                ran.push(action.clone());
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    if ran.is_empty() {
        eprintln!("uraid: idle: no resync, recovery, check, repair or reshape was running");
    } else {
        eprintln!(
            "uraid: idle: {} ended; {} of {} members in sync, mismatch_cnt {}",
            ran.join(", then "),
            status.in_sync_disks,
            status.raid_disks,
            status.mismatch_cnt
        );
    }
    Ok(())
}

/// `max` (None) or a size as create's --size takes it, in sectors.
fn parse_component_size(text: &str) -> Result<Option<u64>, String> {
    if text == "max" {
        return Ok(None);
    }
    match crate::units::parse_size_bytes(text)? {
        0 => Err("size 0: give max or a size of at least one chunk".into()),
        bytes => Ok(Some(bytes / crate::units::SECTOR_BYTES)),
    }
}

/// The server may run in another directory: send it absolute paths (an
/// NBD URI as it is).
fn absolute(path: &std::path::Path) -> PathBuf {
    PathBuf::from(crate::member::canonical_name(path))
}
