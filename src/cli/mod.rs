//! The `uraid` command line. Offline commands (create, examine, detail on
//! devices, copy-in, copy-out) work on member devices directly.
//!
//! Every failure is reported as one line, `uraid: <reason>`, with exit status 1
//! (2 for usage errors, as clap does), and a refused command writes nothing.

mod bench;
mod copy;
mod create;
mod detail;
mod doctor;
mod integrity;
mod man;
mod manage;
mod monitor;
mod plan;
mod scan;
mod serve;
mod status;
mod stop;
mod tune;
mod tuning;
mod zero;

mod examine;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "uraid",
    version,
    about = "A user-space RAID engine, on-disk compatible with Linux md"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create an array on member devices (block devices or image files).
    Create(create::CreateArgs),
    /// Print the md superblock of each device, as mdadm --examine does.
    Examine {
        #[arg(long)]
        json: bool,
        /// Print each member's internal write-intent bitmap, as mdadm --examine-bitmap (-X).
        #[arg(long, short = 'X')]
        bitmap: bool,
        /// One ARRAY line per array found, as mdadm --examine --scan (for uraid.conf).
        #[arg(long, conflicts_with = "bitmap")]
        scan: bool,
        /// With --scan: add level=, num-devices= and devices=.
        #[arg(long, short = 'v', requires = "scan")]
        verbose: bool,
        /// With --scan and no devices: the config whose DEVICE lines to search.
        #[arg(long, value_name = "FILE", requires = "scan")]
        config: Option<PathBuf>,
        #[arg(required_unless_present = "scan")]
        devices: Vec<PathBuf>,
    },
    /// Describe an array from its members, as mdadm --detail does.
    Detail {
        #[arg(long)]
        json: bool,
        /// The control socket of a running `uraid serve`.
        #[arg(long)]
        control: Option<PathBuf>,
        /// One `ARRAY` line per served array, as mdadm --detail --scan.
        #[arg(long, short = 's')]
        scan: bool,
        /// With --scan: level, member count and members too (mdadm -Dsv).
        #[arg(long, short = 'v', requires = "scan")]
        verbose: bool,
        devices: Vec<PathBuf>,
    },
    /// Write an image into the array (offline), keeping parity consistent.
    CopyIn {
        #[arg(long)]
        input: PathBuf,
        #[arg(required = true)]
        devices: Vec<PathBuf>,
    },
    /// Change a running array: fail, remove, add members; check or repair; speed limits.
    Manage(manage::ManageArgs),
    /// Watch served arrays and report events, as mdadm --monitor does.
    Monitor(monitor::MonitorArgs),
    /// Serve an array over NBD until SIGINT or SIGTERM.
    Serve(serve::ServeArgs),
    /// /proc/mdstat-style status of the arrays uraid serves.
    Status {
        #[arg(long)]
        json: bool,
        /// The control socket of a running `uraid serve` (default: all in the socket folder).
        #[arg(long)]
        control: Option<PathBuf>,
    },
    /// Measure: the seeds' workloads over NBD against the raw members and nbdkit;
    /// `bench parity` compares the parity implementations with ISA-L.
    Bench(bench::BenchArgs),
    /// Find the knobs that suit a workload: search them on a scratch array,
    /// check the pick against the defaults, and with --apply set and save it.
    Tune(tune::TuneArgs),
    /// Predict rebuild time, time at reduced redundancy, capacity and the chance
    /// of losing data, for a layout against raid5/6/10 and dRAID layouts.
    Plan(plan::PlanArgs),
    /// Check the host for an array: CPU, SIMD, memory, kernel interfaces,
    /// governor, and the members' block queues; ok/warn/fail/unavailable.
    Doctor(doctor::DoctorArgs),
    /// Stop a served array, as mdadm --stop: the server finishes in-flight
    /// I/O, writes the superblocks and exits; returns once it has.
    Stop(stop::StopArgs),
    /// Erase the md superblocks (0.90, 1.x) and dRAID labels of devices
    /// that no array uses, as mdadm --zero-superblock.
    ZeroSuperblock(zero::ZeroArgs),
    /// Give a stopped array a checksum of every 4 KiB of its members
    /// (`crc32c`), or drop them (`none`); see `create --integrity`.
    Integrity(integrity::IntegrityArgs),
    /// Write the manual pages, uraid(8) and one per command, into a folder.
    Man {
        /// The folder to write them into (made if missing), e.g.
        /// /usr/local/share/man/man8.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print a shell's completion script for uraid on stdout.
    Completions {
        #[arg(value_enum)]
        shell: man::Shell,
    },
    /// Read the array's contents (offline, degraded if members are missing) into a file.
    CopyOut {
        #[arg(long)]
        output: PathBuf,
        /// Write over an output file that is not empty, or a block device
        /// that holds a filesystem, a partition table or an array.
        #[arg(long, short = 'f')]
        force: bool,
        #[arg(required = true)]
        devices: Vec<PathBuf>,
    },
}

/// A command's failure: one line for the user.
pub type CliResult = Result<(), String>;

/// Keeps memory that threads free for their next buffers.
///
/// glibc gives the top of a thread's heap back to the kernel once more
/// than 128 KiB is free there, and serves allocations above a threshold
/// with mmap; every request and parity buffer then faults in fresh pages
/// that the kernel zeroes first. Profiled on raid6 random writes in
/// memory, that zeroing (`clear_page_erms`) was 9 % of the CPU. With both
/// thresholds raised, freed memory is kept and reused: the heap stays at
/// its peak, which the stripe cache and the request limits bound.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// glibc's largest mmap threshold on 64-bit (4 MiB x sizeof(long)):
        /// every request below the server's 32 MiB payload limit comes
        /// from the heap.
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 256 << 20;
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before this process starts any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

pub fn main() -> i32 {
    keep_freed_memory();
    // `--set help` lists the knobs, before clap would ask for the devices
    // and options a real create, serve or manage needs. (Arguments as the
    // system gives them: a path need not be UTF-8.)
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if asks_for_knob_list(&args) {
        // SAFETY: as below; a list piped into `head` ends quietly.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let _ = tuning::print_help();
        return 0;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    // A report piped into `head` should end quietly, as other tools do.
    // Not for serve: a client that goes away must not kill the server.
    if !matches!(cli.command, Command::Serve(_)) {
        // SAFETY: restoring the default action of a signal has no
        // preconditions; no other thread runs yet.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // URAID_PARITY forces a parity implementation; a bad name is refused
    // here, in one line, before any command runs.
    if let Err(message) = crate::parity::select_from_env() {
        eprintln!("uraid: {message}");
        return 1;
    }
    let result = match cli.command {
        Command::Create(args) => create::run(&args),
        Command::Examine {
            scan: true,
            json,
            verbose,
            config,
            devices,
            ..
        } => scan::run_examine(&devices, verbose, json, config.as_deref()),
        Command::Examine {
            json,
            bitmap: true,
            devices,
            ..
        } => examine::run_bitmap(&devices, json),
        Command::Examine { json, devices, .. } => examine::run(&devices, json),
        Command::Detail {
            scan: true,
            json,
            control,
            verbose,
            devices,
            ..
        } => detail::run_scan(control.as_deref(), &devices, verbose, json),
        Command::Detail {
            json,
            control,
            devices,
            ..
        } => detail::run(control.as_deref(), &devices, json),
        Command::Serve(args) => serve::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Manage(args) => manage::run(&args),
        Command::Monitor(args) => monitor::run(&args),
        Command::Status { json, control } => status::run(control.as_deref(), json),
        Command::Plan(args) => plan::run(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::CopyIn { input, devices } => copy::copy_in(&input, &devices),
        Command::CopyOut {
            output,
            force,
            devices,
        } => copy::copy_out(&output, force, &devices),
        Command::Stop(args) => stop::run(&args),
        Command::ZeroSuperblock(args) => zero::run(&args),
        Command::Integrity(args) => integrity::run(&args),
        Command::Man { dir } => man::write_pages(&dir),
        Command::Completions { shell } => man::print_completions(shell),
    };
    match result {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("uraid: {message}");
            1
        }
    }
}

/// Whether the command line is `create`, `serve` or `manage` with
/// `--set help` (or `--set=help`) among its arguments.
fn asks_for_knob_list(args: &[std::ffi::OsString]) -> bool {
    let takes_knobs = matches!(
        args.first().and_then(|a| a.to_str()),
        Some("create" | "serve" | "manage")
    );
    takes_knobs
        && (args.windows(2).any(|w| w[0] == "--set" && w[1] == "help")
            || args.iter().any(|a| a == "--set=help"))
}

#[cfg(test)]
mod tests {
    use super::asks_for_knob_list;

    #[test]
    fn set_help_is_found_whatever_else_is_missing() {
        let yes =
            |line: &str| asks_for_knob_list(&line.split(' ').map(Into::into).collect::<Vec<_>>());
        assert!(yes("create --set help"));
        assert!(yes("serve d0 --set=help"));
        assert!(yes("manage --set help --control x"));
        assert!(!yes("create --set read_ahead=help"));
        assert!(
            !yes("bench --set help"),
            "bench's --set is not a stored knob"
        );
        assert!(!yes("create --name help --set stripe_cache_size=512"));
    }
}
