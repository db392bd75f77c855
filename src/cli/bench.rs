//! `uraid bench`: the end-to-end benchmark (src/bench) when no subcommand
//! is given, and `uraid bench parity` (the parity implementations side by
//! side, src/bench/parity.rs).

use super::CliResult;
use crate::bench::array::{ArraySpec, State};
use crate::bench::clients::Client;
use crate::bench::generator::Limits;
use crate::bench::workload::Workload;
use crate::bench::{self, BenchOptions, MemberSource, TargetKind};
use crate::geometry::level_from_name;
use crate::units::parse_size_bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    end_to_end: EndToEndArgs,
}

#[derive(clap::Subcommand, Debug)]
enum BenchCommand {
    /// P+Q generation and two-data recovery speed of each parity
    /// implementation, next to Intel ISA-L's and memcpy's.
    Parity(bench::parity::ParityArgs),
}

/// Where the members of the array measured are, and what else it has:
/// shared by `bench` and `tune`.
#[derive(clap::Args, Debug)]
pub(super) struct MemberArgs {
    /// Folder in which a fresh folder of member files is made and removed
    /// afterwards: /dev/shm (the default) for members in memory, a folder
    /// on a disk for members on disk.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Size of each member file (K/M/G suffixes; a bare number is KiB).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Layout by mdadm's name.
    #[arg(long)]
    layout: Option<String>,
    /// Use these existing devices or files as members instead: everything
    /// on them is overwritten, so --destroy-data must be given too.
    #[arg(long, num_args = 1..)]
    members: Vec<PathBuf>,
    /// Confirms that --members may be overwritten.
    #[arg(long)]
    destroy_data: bool,
    /// Give the array a write journal of this size (K/M/G suffixes), a
    /// file beside the members: run with and without it for the journal's
    /// cost side by side.
    #[arg(long, value_name = "SIZE")]
    journal: Option<String>,
    /// Put the journal's file in this folder instead (a faster medium in
    /// front of the members, as a journal is meant to be used).
    #[arg(long, value_name = "DIR", requires = "journal")]
    journal_dir: Option<PathBuf>,
    /// Seed of the random offsets and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(clap::Args, Debug)]
struct EndToEndArgs {
    /// RAID level of the array to build.
    #[arg(long, default_value = "raid6")]
    level: String,
    /// Number of members.
    #[arg(long, default_value_t = 6)]
    devices: u32,
    /// Chunk size (K/M suffixes; a bare number is KiB), default mdadm's 512K.
    #[arg(long)]
    chunk: Option<String>,
    /// States of the array: healthy, degraded, rebuilding (comma-separated).
    #[arg(long, default_value = "healthy", value_delimiter = ',')]
    state: Vec<String>,
    /// Workloads (comma-separated): fio-randwrite, iozone-seq, dd-seq,
    /// randread-qd, seq-1m, seq-stripe, randread; default all.
    #[arg(long, value_delimiter = ',')]
    workload: Vec<String>,
    /// Targets (comma-separated): uraid, raw, nbdkit, and ublk (the array
    /// as /dev/ublkbN, measured by fio's io_uring engine on it; a host
    /// with ublk, as root); default uraid, raw and nbdkit.
    #[arg(long, value_delimiter = ',', default_value = "uraid,raw,nbdkit")]
    targets: Vec<String>,
    /// Who sends the requests to the NBD targets (uraid, nbdkit): fio
    /// (--ioengine=nbd), nbdcopy (sequential reads to null:; other phases
    /// with fio if installed) or uraid (the benchmark's own pipelined
    /// client). Default: fio when it is installed, else uraid; uraid with
    /// --verify. The raw member files are always read by uraid's.
    #[arg(long, value_name = "fio|nbdcopy|uraid")]
    client: Option<String>,
    /// Allocator of `nbdkit memory` (malloc, sparse, zstd): malloc lets
    /// requests run concurrently, so it is the higher ceiling.
    #[arg(long, default_value = "malloc")]
    nbdkit_allocator: String,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Warm-up seconds before each phase's measurement.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    #[command(flatten)]
    target: MemberArgs,
    /// Write a known pattern and check every read against it.
    #[arg(long)]
    verify: bool,
    /// Set an engine tunable before measuring (repeatable): KEY=VALUE.
    #[arg(long = "set")]
    set: Vec<String>,
    /// Run the workloads once per value of a tunable: KEY=V1,V2,...
    #[arg(long)]
    sweep: Option<String>,
    /// Write the report as JSON to FILE, or to standard output with "-".
    #[arg(long)]
    json: Option<String>,
    /// Write an SVG chart to FILE.
    #[arg(long)]
    chart: Option<PathBuf>,
}

pub fn run(args: &BenchArgs) -> CliResult {
    match &args.command {
        Some(BenchCommand::Parity(args)) => bench::parity::run(args),
        None => run_end_to_end(&args.end_to_end),
    }
}

fn key_value(text: &str, flag: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{flag} {text}: expected KEY=VALUE")),
    }
}

/// A phase's warm-up and measured time, from --warmup and --seconds.
pub(super) fn limits(warmup: f64, measure: f64) -> Result<Limits, String> {
    Ok(Limits {
        warmup: seconds(warmup, "--warmup")?,
        measure: seconds(measure, "--seconds")?,
    })
}

fn seconds(value: f64, flag: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value).map_err(|_| format!("{flag} {value}: not a duration"))
}

/// The members and the array of a target, refusing what cannot be built
/// before anything is created.
pub(super) fn target(
    t: &MemberArgs,
    level: &str,
    devices: u32,
    chunk: Option<&str>,
) -> Result<(MemberSource, ArraySpec), String> {
    if !t.members.is_empty() && !t.destroy_data {
        return Err(format!(
            "--members would overwrite everything on {}: add --destroy-data to confirm",
            t.members
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let level = level_from_name(level).ok_or_else(|| format!("unknown level '{level}'"))?;
    let member_bytes = parse_size_bytes(&t.size)?;
    let members = if t.members.is_empty() {
        if !t.dir.is_dir() {
            return Err(format!("--dir {}: not a folder", t.dir.display()));
        }
        MemberSource::Files {
            parent: t.dir.clone(),
            count: devices,
            bytes: member_bytes,
        }
    } else {
        MemberSource::Existing(t.members.clone())
    };
    let spec = ArraySpec {
        level,
        chunk_bytes: chunk.map(parse_size_bytes).transpose()?,
        layout: t.layout.clone(),
        // New files are used whole; existing devices too unless --size
        // was given explicitly.
        member_bytes: Some(member_bytes).filter(|_| !t.members.is_empty() && t.size != "256M"),
        journal_dir: t.journal_dir.clone(),
        journal_bytes: match (&t.journal, t.members.is_empty()) {
            (None, _) => None,
            (Some(size), true) => Some(parse_size_bytes(size)?),
            (Some(_), false) => {
                return Err("--journal makes its file beside the benchmark's own members; it does not go with --members".into())
            }
        },
    };
    Ok((members, spec))
}

/// Workloads by name; none given is every one.
pub(super) fn workloads(names: &[String]) -> Result<Vec<Workload>, String> {
    if names.is_empty() {
        return Ok(Workload::ALL.to_vec());
    }
    names.iter().map(|w| Workload::parse(w)).collect()
}

fn options(args: &EndToEndArgs) -> Result<BenchOptions, String> {
    let (members, spec) = target(
        &args.target,
        &args.level,
        args.devices,
        args.chunk.as_deref(),
    )?;
    let workloads = workloads(&args.workload)?;
    let sweep = args
        .sweep
        .as_deref()
        .map(|s| {
            key_value(s, "--sweep")
                .map(|(k, v)| (k, v.split(',').map(str::to_string).collect::<Vec<_>>()))
        })
        .transpose()?;
    Ok(BenchOptions {
        members,
        spec,
        states: args
            .state
            .iter()
            .map(|s| State::parse(s))
            .collect::<Result<_, _>>()?,
        workloads,
        targets: args
            .targets
            .iter()
            .map(|t| TargetKind::parse(t))
            .collect::<Result<_, _>>()?,
        limits: limits(args.warmup, args.seconds)?,
        verify: args.verify,
        seed: args.target.seed,
        settings: args
            .set
            .iter()
            .map(|s| key_value(s, "--set"))
            .collect::<Result<_, _>>()?,
        sweep,
        nbdkit_allocator: args.nbdkit_allocator.clone(),
        client: match (args.client.as_deref(), args.verify) {
            (None, true) => Client::Uraid,
            (None, false) => Client::default_choice(),
            (Some(name), verify) => {
                let client = Client::parse(name)?;
                if verify && client != Client::Uraid {
                    return Err(format!(
                        "--verify needs --client uraid: {name} cannot check the pattern"
                    ));
                }
                client
            }
        },
        command: std::env::args().collect::<Vec<_>>().join(" "),
    })
}

fn run_end_to_end(args: &EndToEndArgs) -> CliResult {
    let options = options(args)?;
    check_outputs(args.json.as_deref(), args.chart.as_deref())?;
    let report = bench::run(&options)?;
    let table = bench::report::table(&report.rows, &report.goals, &report.notes);
    let json = serde_json::to_string_pretty(&report).expect("the report serialises");
    print_outputs(&table, json, args.json.as_deref())?;
    if let Some(chart) = &args.chart {
        let sweep_key = options.sweep.as_ref().map(|(k, _)| k.as_str());
        bench::chart::write_svg(chart, &report.rows, sweep_key)?;
    }
    Ok(())
}

/// Refuses an output in a folder that does not exist before minutes are
/// spent measuring (and before anything is created).
pub(super) fn check_outputs(json: Option<&str>, chart: Option<&Path>) -> CliResult {
    let json = json.filter(|j| *j != "-").map(Path::new);
    for path in [json, chart].into_iter().flatten() {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            return Err(format!("{}: the folder does not exist", path.display()));
        }
    }
    Ok(())
}

/// The table on standard output and the JSON in its file; with "-", the
/// JSON on standard output and the table on stderr.
pub(super) fn print_outputs(table: &str, json: String, json_to: Option<&str>) -> CliResult {
    match json_to {
        Some("-") => {
            eprint!("{table}");
            println!("{json}");
        }
        Some(path) => {
            print!("{table}");
            std::fs::write(path, json + "\n").map_err(|e| format!("{path}: {e}"))?;
        }
        None => print!("{table}"),
    }
    Ok(())
}
