//! `uraid tune`: the auto-tuner (src/tune) on bench's targets; with
//! `--apply --control`, the pick is set on a served array and saved with it.

use super::bench::{check_outputs, limits, print_outputs, target, workloads, MemberArgs};
use super::CliResult;
use crate::control::{self, Request};
use crate::engine::tuning::saved::Tuned;
use crate::tune::report::{self, WorkloadTune};
use crate::tune::run::{self, TuneOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// Workloads to tune for (comma-separated, bench's names): fio-randwrite,
    /// iozone-seq, dd-seq, randread-qd, seq-1m, seq-stripe, randread.
    #[arg(long, value_delimiter = ',', required = true)]
    workload: Vec<String>,
    /// The time the whole run may take (90s, 5m, 1h; a bare number is
    /// seconds), shared evenly by the workloads; the search stops early
    /// enough to leave its pick's confirmation room.
    #[arg(long, default_value = "5m")]
    budget: String,
    /// RAID level of the scratch array (default raid6, or the served
    /// array's with --apply).
    #[arg(long)]
    level: Option<String>,
    /// Number of members (default 6, or the served array's with --apply).
    #[arg(long)]
    devices: Option<u32>,
    /// Chunk size (K/M suffixes; default mdadm's 512K, or the served
    /// array's with --apply).
    #[arg(long)]
    chunk: Option<String>,
    /// Measured seconds per phase of each run.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Warm-up seconds before each phase's measurement.
    #[arg(long, default_value_t = 0.25)]
    warmup: f64,
    /// Rounds of the pick's check against the defaults (one run of each
    /// per round, alternated).
    #[arg(long, default_value_t = 3)]
    confirm_rounds: usize,
    /// The scratch array's members (a journal makes write_policy a knob
    /// to search too).
    #[command(flatten)]
    target: MemberArgs,
    /// Write the result as JSON to FILE, or to standard output with "-".
    #[arg(long)]
    json: Option<String>,
    /// Write an SVG chart to FILE: each knob's curve, the pick marked.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Set the pick on the array served at --control and save it with the
    /// array's settings, recorded as the tuner's (one workload only).
    #[arg(long, requires = "control")]
    apply: bool,
    /// The control socket of the served array --apply sets.
    #[arg(long, requires = "apply")]
    control: Option<PathBuf>,
}

/// "90s", "5m", "1h" or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("--budget {text}: expected a duration such as 90s, 5m or 1h");
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(value * scale).map_err(|_| bad())
}

/// The served array's shape, so that the scratch array is measured as it
/// would behave: (level, members, chunk).
fn served_shape(socket: &Path) -> Result<(String, u32, Option<String>), String> {
    let status = control::request(socket, &Request::Status)?;
    let d = &status.detail;
    let level = d["raid_level"].as_str().unwrap_or_default().to_string();
    let devices = d["raid_devices"].as_u64().unwrap_or(0) as u32;
    let chunk = d["chunk_kib"]
        .as_u64()
        .filter(|&c| c > 0)
        .map(|c| format!("{c}K"));
    Ok((level, devices, chunk))
}

fn options(args: &TuneArgs) -> Result<TuneOptions, String> {
    let workloads = workloads(&args.workload)?;
    if args.apply && workloads.len() != 1 {
        return Err("--apply sets one workload's pick: give one --workload".into());
    }
    let mut level = args.level.clone();
    let mut devices = args.devices;
    let mut chunk = args.chunk.clone();
    if let Some(socket) = &args.control {
        // Asked first: an unreachable array refuses before minutes of runs.
        let (l, n, c) = served_shape(socket)?;
        level.get_or_insert(l);
        devices.get_or_insert(n);
        if chunk.is_none() {
            chunk = c;
        }
    }
    let (members, spec) = target(
        &args.target,
        level.as_deref().unwrap_or("raid6"),
        devices.unwrap_or(6),
        chunk.as_deref(),
    )?;
    Ok(TuneOptions {
        members,
        spec,
        workloads,
        limits: limits(args.warmup, args.seconds)?,
        budget: parse_duration(&args.budget)?,
        confirm_rounds: args.confirm_rounds,
        seed: args.target.seed,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    })
}

pub fn run(args: &TuneArgs) -> CliResult {
    let options = options(args)?;
    check_outputs(args.json.as_deref(), args.chart.as_deref())?;
    let report = run::run(&options)?;
    let table = report::table(&report);
    let json = serde_json::to_string_pretty(&report).expect("the report serialises");
    print_outputs(&table, json, args.json.as_deref())?;
    if let Some(chart) = &args.chart {
        crate::tune::chart::write_svg(chart, &report)?;
    }
    if let (true, Some(socket)) = (args.apply, &args.control) {
        apply(socket, &report.workloads[0], &report.date_utc)?;
    }
    Ok(())
}

/// Sets the choice on the served array; the defaults too when the pick
/// was dropped, so that the array runs what was measured.
fn apply(socket: &Path, w: &WorkloadTune, when_utc: &str) -> CliResult {
    let settings: Vec<(String, String)> = w.chosen.knobs.clone().into_iter().collect();
    if settings.is_empty() {
        return Err(format!(
            "{}: no knob to apply (none changes this workload on this array)",
            w.workload
        ));
    }
    let tuned = Tuned {
        workload: w.workload.clone(),
        when_utc: when_utc.to_string(),
        knobs: settings.clone(),
        metric: w.metric.clone(),
        value: w.chosen.value,
        default_value: w.default.value,
        confirmed: w.confirmation.confirmed,
    };
    let message = control::command(socket, &Request::ApplyTuned { settings, tuned })?;
    let what = if w.confirmation.confirmed {
        "the pick"
    } else {
        "the defaults (no pick beat them)"
    };
    eprintln!("uraid: applied {what}: {message}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn budgets_read_as_people_write_them() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        for bad in ["", "m", "5x", "-1s", "five"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
