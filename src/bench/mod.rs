//! Benchmarks behind `uraid bench`: measurements a user runs on their own
//! machine, never asserted in tests. `uraid bench parity` is `parity`; the
//! rest is the end-to-end benchmark (`uraid bench` with no subcommand):
//! the seeds' workloads against a uraid array served over
//! NBD, against the raw member files, and against `nbdkit memory`, side by
//! side in one run, so that the ratios between them hold on a noisy
//! machine.
//!
//! One module per concern: `workload` (the jobs), `generator` (the
//! closed-loop load, on `export::nbd::client`), `targets` (raw files, nbdkit, CPU
//! time), `array` (the array under test and its states), `tunables` (the
//! engine's knobs, behind an adapter), `diskbusy` (how busy the members'
//! disk was), `report` (rows, ratios, the performance targets, table), `chart`
//! (SVG).

pub mod array;
pub mod buffers;
pub mod chart;
pub mod clients;
pub mod diskbusy;
pub mod generator;
pub mod parity;
pub mod report;
pub mod targets;
pub mod tunables;
pub mod workload;

use array::{ArraySpec, LiveArray, State};
use generator::{DataMode, Limits};
use report::{Row, RowContext};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use targets::{Access, Nbdkit, RawStripes};
use workload::{Op, Phase, Workload};

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    Uraid,
    Raw,
    Nbdkit,
    /// The array as /dev/ublkbN, where the host has ublk (asked for
    /// by name; not in the default set).
    Ublk,
}

impl TargetKind {
    pub fn parse(name: &str) -> Result<TargetKind, String> {
        match name {
            "uraid" => Ok(TargetKind::Uraid),
            "raw" => Ok(TargetKind::Raw),
            "nbdkit" => Ok(TargetKind::Nbdkit),
            "ublk" => Ok(TargetKind::Ublk),
            other => Err(format!(
                "unknown target '{other}' (known: uraid, raw, nbdkit, ublk)"
            )),
        }
    }
}

/// Where the members are.
#[derive(Clone, Debug)]
pub enum MemberSource {
    /// `count` new sparse files of `bytes` in a fresh folder under `parent`.
    Files {
        parent: PathBuf,
        count: u32,
        bytes: u64,
    },
    /// Existing devices or files, overwritten (`--destroy-data`).
    Existing(Vec<PathBuf>),
}

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub members: MemberSource,
    pub spec: ArraySpec,
    pub states: Vec<State>,
    pub workloads: Vec<Workload>,
    pub targets: Vec<TargetKind>,
    pub limits: Limits,
    pub verify: bool,
    pub seed: u64,
    /// `--set KEY=VALUE`, applied once the engine runs.
    pub settings: Vec<(String, String)>,
    /// `--sweep KEY=V1,V2,...`.
    pub sweep: Option<(String, Vec<String>)>,
    /// nbdkit memory's allocator (malloc, sparse, zstd).
    pub nbdkit_allocator: String,
    /// Who sends the NBD targets' requests (`clients`).
    pub client: clients::Client,
    /// The command line, for the report.
    pub command: String,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_gib: f64,
}

#[derive(Debug, Serialize)]
pub struct ArrayReport {
    pub level: String,
    pub devices: u32,
    pub chunk_bytes: Option<u64>,
    pub member_bytes: u64,
    pub stripe_data_bytes: u64,
    /// "tmpfs" or "disk".
    pub members_on: String,
    /// Whether the raw target used O_DIRECT.
    pub raw_direct: Option<bool>,
    /// The engine's tunables in force (empty until the engine has them).
    pub tunables: Vec<(String, String)>,
    /// The parity implementation the engine computed with (chosen at
    /// start by a short benchmark, or URAID_PARITY): runs may differ.
    pub parity_impl: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub date_utc: String,
    pub command: String,
    pub machine: Machine,
    pub array: ArrayReport,
    pub seconds_per_phase: f64,
    pub warmup_seconds: f64,
    pub verify: bool,
    pub nbdkit_allocator: String,
    pub rows: Vec<Row>,
    pub goals: Vec<report::Goal>,
    pub notes: Vec<String>,
    /// The disk's speed at moments of the run (members on a disk, uraid
    /// and raw both measured); empty otherwise.
    pub disk_probes: Vec<DiskProbe>,
}

/// One reading of the disk's speed on the raw members: 4K random reads or
/// writes, 4 jobs × 8 deep, for [`PROBE_SECONDS`].
#[derive(Debug, Serialize)]
pub struct DiskProbe {
    /// "before uraid", "after uraid", "after raw".
    pub when: &'static str,
    /// "read" or "write".
    pub op: &'static str,
    pub iops: f64,
}

/// How much the disk's probes of one kind may differ (the fastest over the
/// slowest) before the report says that ratios against raw do not hold.
pub const PROBE_DRIFT_MAX: f64 = 1.2;
/// How long a probe is measured, after a short warm-up.
const PROBE_SECONDS: f64 = 1.0;
const PROBE_WARMUP_SECONDS: f64 = 0.25;

/// A fresh folder that is removed with everything in it at the end.
pub(crate) struct WorkDir(pub(crate) PathBuf);

impl WorkDir {
    pub(crate) fn create(parent: &Path) -> Result<WorkDir, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = parent.join(format!("uraid-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Salts of the verify pattern, one per target, so that one target's data
/// can never pass for another's.
const SALT_URAID: u64 = 0x7572_6169_6400_0001;
const SALT_RAW: u64 = 0x7572_6169_6400_0002;
const SALT_NBDKIT: u64 = 0x7572_6169_6400_0003;

/// Everything one target's measurements share.
struct Measure<'a> {
    options: &'a BenchOptions,
    progress: &'a indicatif::ProgressBar,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// The raw members to probe the disk's speed on, when it is probed.
    probe_on: Option<Arc<RawStripes>>,
    probes: Vec<DiskProbe>,
    /// The disks that hold the members (none in memory): how busy they
    /// were goes beside uraid's and raw's rows.
    disks: Vec<diskbusy::Device>,
}

impl Measure<'_> {
    fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Reads the disk's speed now, if it is probed, and with `writes` its
    /// write speed too. Why: on a disk that other tenants share (a cloud
    /// VM's), speed drifts by half or more within minutes, and uraid's
    /// phases run minutes before raw's; probes before and after each say
    /// whether comparing them holds. Writes only where the members' bytes
    /// are no longer wanted: after uraid's array is stopped (raw's prefill
    /// overwrites them next) and after raw's phases. Reads and writes
    /// drift apart: one run's raw random writes fell to a third while its
    /// reads held.
    fn probe_disk(&mut self, when: &'static str, writes: bool) {
        let Some(raw) = self.probe_on.clone() else {
            return;
        };
        self.progress.set_message(format!("disk probe {when}"));
        let read = Workload::Randread
            .phases(1 << 20)
            .into_iter()
            .next()
            .expect("randread has a phase");
        let write = Phase {
            name: "probe-write".into(),
            op: Op::Write,
            ..read.clone()
        };
        let limits = generator::Limits {
            warmup: std::time::Duration::from_secs_f64(PROBE_WARMUP_SECONDS),
            measure: std::time::Duration::from_secs_f64(PROBE_SECONDS),
        };
        let data = DataMode {
            verify_salt: None,
            seed: self.options.seed,
        };
        let phases = [("read", read), ("write", write)];
        for (op, phase) in phases.iter().take(if writes { 2 } else { 1 }) {
            // A failed probe costs the run its verdict on drift, not its rows.
            match generator::run_phase(&Access::Files(raw.clone()), phase, limits, data, &|| {}) {
                Ok(outcome) => {
                    let iops = outcome.ops as f64 / outcome.seconds.max(f64::EPSILON);
                    self.probes.push(DiskProbe { when, op, iops });
                }
                Err(e) => self.note(format!("disk probe {op} {when} failed: {e}")),
            }
        }
    }
}

/// The note on the disk's probes: their figures, and whether the disk
/// held its read and its write speed (each within [`PROBE_DRIFT_MAX`])
/// through the run.
fn probe_note(probes: &[DiskProbe]) -> Option<String> {
    let mut parts = Vec::new();
    let mut drifted = Vec::new();
    for op in ["read", "write"] {
        let of_op: Vec<&DiskProbe> = probes.iter().filter(|p| p.op == op).collect();
        if of_op.len() < 2 {
            continue;
        }
        let figures: Vec<String> = of_op
            .iter()
            .map(|p| format!("{:.0} {}", p.iops, p.when))
            .collect();
        parts.push(format!("{op} {}", figures.join(", ")));
        let fastest = of_op.iter().map(|p| p.iops).fold(0.0, f64::max);
        let slowest = of_op.iter().map(|p| p.iops).fold(f64::INFINITY, f64::min);
        let drift = fastest / slowest.max(f64::EPSILON);
        if drift > PROBE_DRIFT_MAX {
            drifted.push(format!("{op} speed changed {drift:.2}x"));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let verdict = if drifted.is_empty() {
        format!("steady (within {:.0} %)", (PROBE_DRIFT_MAX - 1.0) * 100.0)
    } else {
        format!(
            "the disk's {} during the run: ratios against raw do not hold, run again",
            drifted.join(" and its ")
        )
    };
    Some(format!(
        "disk probe (4K random, 4 x QD8, raw members, IOPS): {}; {verdict}",
        parts.join("; ")
    ))
}

/// What a target needs besides its access.
struct TargetRun<'a> {
    name: &'a str,
    state: &'a str,
    setting: Option<&'a str>,
    salt: u64,
    /// CPU seconds so far of the process that serves the target (None:
    /// raw files, whose I/O runs in the client's threads).
    cpu: &'a (dyn Fn() -> Option<f64> + Sync),
    /// Whether that process is this one, whose client threads' CPU is then
    /// not the target's.
    in_process: bool,
    /// Drops the target's caches (dd-seq).
    drop_caches: &'a dyn Fn() -> Result<(), String>,
    /// The background job, for the rebuilding state.
    background: &'a dyn Fn() -> Option<String>,
    /// Run before each phase: in the rebuilding state, starts a rebuild
    /// again if the last one has finished, so that every phase runs
    /// during one.
    prepare: &'a dyn Fn() -> Result<(), String>,
    /// The stripe cache's (full, partial) rows written so far.
    rows_written: &'a dyn Fn() -> Option<(u64, u64)>,
    /// Sets a knob of the target and returns the value it had (None: the
    /// target has no knobs; its phases with a setting are skipped).
    knob: Option<&'a SetKnob<'a>>,
    /// Whether the target's I/O goes to the member files (uraid's and
    /// raw's, not nbdkit's memory): their disk's busy share is recorded.
    on_members: bool,
}

/// Sets a knob (key, value) and returns the value it had.
type SetKnob<'a> = dyn Fn(&str, &str) -> Result<String, String> + 'a;

fn run_phases(
    m: &mut Measure,
    access: &Access,
    run: &TargetRun,
    phases: &[Phase],
) -> Result<(), String> {
    let verify_salt = m.options.verify.then_some(run.salt);
    for phase in phases {
        // A phase with a setting measures what the setting adds to a
        // parity array; a sweep of that knob measures it already.
        let swept = |key: &str| m.options.sweep.as_ref().is_some_and(|(k, _)| k == key);
        let knob = match phase.setting {
            Some((key, _)) if swept(key) || !m.options.spec.level.has_parity() => None,
            Some(setting) => run.knob.map(|set| (set, setting)),
            None => None,
        };
        let raw_files = matches!(access, Access::Files(f) if f.device.is_none());
        if (phase.raw_only && !raw_files) || (phase.setting.is_some() && knob.is_none()) {
            m.progress.inc(1);
            continue;
        }
        m.progress.set_message(format!(
            "{} {} {} {}",
            run.name,
            run.state,
            phase.workload.name(),
            phase.name
        ));
        if phase.drop_caches_before {
            access.flush()?;
            (run.drop_caches)()?;
        }
        // Before the knob is set: a failed restart must not leave it set.
        (run.prepare)()?;
        let restore = match knob {
            Some((set, (key, value))) => Some((set, key, set(key, value)?)),
            None => None,
        };
        let background_before = (run.background)();
        let rows_before = (run.rows_written)();
        // The target's CPU is counted from the measured window's start, as
        // its requests are; from here if that sample is missing.
        let target_before = (run.cpu)();
        let target_at_window = std::sync::Mutex::new(None);
        let at_window = || *target_at_window.lock().unwrap() = (run.cpu)();
        let busy = if run.on_members {
            diskbusy::Busy::start(&m.disks)
        } else {
            None
        };
        let data = DataMode {
            verify_salt,
            seed: m.options.seed,
        };
        let outcome = clients::run_phase(
            m.options.client,
            access,
            phase,
            m.options.limits,
            data,
            &at_window,
        )
        .map_err(|e| {
            format!(
                "{} {} {} {}: {e}",
                run.name,
                run.state,
                phase.workload.name(),
                phase.name
            )
        });
        let disk_busy = busy.and_then(|b| b.share(&m.disks));
        let restored = match restore {
            Some((set, key, before)) => set(key, &before),
            None => Ok(String::new()),
        };
        // The phase's own failure first: a knob that cannot be set back is
        // the lesser news.
        let (outcome, client) = outcome?;
        restored?;
        // Only the own client runs in this process.
        let client_in_target = if run.in_process && client == clients::Client::Uraid {
            outcome.cpu_client_seconds
        } else {
            0.0
        };
        let target_before = target_at_window.into_inner().unwrap().or(target_before);
        let target_cpu = target_before
            .zip((run.cpu)())
            .map(|(before, after)| (after - before - client_in_target).max(0.0));
        if outcome.ops == 0 {
            m.note(format!(
                "{} {} {} {}: no request completed in the measured time; raise --seconds",
                run.name,
                run.state,
                phase.workload.name(),
                phase.name
            ));
        }
        // A rebuilding row must have run during a rebuild from start to
        // end; one that did not says so rather than pass for one.
        let background_after = (run.background)();
        let background = match (&background_before, &background_after) {
            (None, None) => None,
            (Some(b), Some(a)) => Some(format!("{b} .. {a}")),
            (Some(b), None) => Some(format!("{b} .. finished")),
            (None, Some(a)) => Some(format!("started .. {a}")),
        };
        if run.state == array::State::Rebuilding.name()
            && (background_before.is_none() || background_after.is_none())
        {
            m.note(format!(
                "{} rebuilding {} {}: the rebuild did not run for the whole phase ({}); \
                 its figures are partly those of an array not rebuilding",
                run.name,
                phase.workload.name(),
                phase.name,
                background.as_deref().unwrap_or("none")
            ));
        }
        let setting = match (run.setting, phase.setting) {
            (swept, None) => swept.map(String::from),
            (None, Some((key, value))) => Some(format!("{key}={value}")),
            (Some(swept), Some((key, value))) => Some(format!("{swept}, {key}={value}")),
        };
        let context = RowContext {
            client: client.name(),
            target: run.name,
            state: run.state,
            setting: setting.as_deref(),
            cpu_target_s: target_cpu,
            background,
            rows_written: rows_before
                .zip((run.rows_written)())
                .map(|(b, a)| (a.0 - b.0, a.1 - b.1)),
            disk_busy,
        };
        m.rows.push(Row::new(context, phase, &outcome));
        if phase.op != Op::Read {
            access.flush()?;
        }
        m.progress.inc(1);
    }
    Ok(())
}

fn all_phases(workloads: &[Workload], stripe_bytes: u64) -> Vec<(Workload, Vec<Phase>)> {
    workloads
        .iter()
        .map(|&w| (w, w.phases(stripe_bytes)))
        .collect()
}

fn member_bytes_of(paths: &[PathBuf], cap: Option<u64>) -> Result<u64, String> {
    use std::io::Seek;
    let mut smallest = u64::MAX;
    for p in paths {
        let mut f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let len = f
            .seek(std::io::SeekFrom::End(0))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        smallest = smallest.min(len);
    }
    Ok(cap.map_or(smallest, |c| c.min(smallest)))
}

pub(crate) fn on_tmpfs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // A block device's node lives on devtmpfs, which statfs calls tmpfs;
    // its bytes are on the device.
    if std::fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    }) {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid NUL-terminated path; statfs fills the zeroed struct.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == TMPFS_MAGIC
    }
}

/// Checks what can be checked before anything is created.
fn validate(options: &BenchOptions) -> Result<(), String> {
    if options.workloads.is_empty() || options.states.is_empty() || options.targets.is_empty() {
        return Err("nothing to measure: give at least one workload, state and target".into());
    }
    if let Some((key, values)) = &options.sweep {
        if values.is_empty() {
            return Err(format!("--sweep {key}: give at least one value"));
        }
    }
    if options.limits.measure.is_zero() {
        return Err("--seconds must be above 0".into());
    }
    Ok(())
}

/// The benchmark's folder and the members: new files in it, known to be
/// zero (so the array needs no resync), or the devices given.
pub(crate) fn prepare_members(
    members: &MemberSource,
) -> Result<(WorkDir, Vec<PathBuf>, bool), String> {
    Ok(match members {
        MemberSource::Files {
            parent,
            count,
            bytes,
        } => {
            let workdir = WorkDir::create(parent)?;
            let paths = array::create_member_files(&workdir.0, *count, *bytes)?;
            (workdir, paths, true)
        }
        MemberSource::Existing(paths) => (
            WorkDir::create(&std::env::temp_dir())?,
            paths.clone(),
            false,
        ),
    })
}

pub fn run(options: &BenchOptions) -> Result<Report, String> {
    validate(options)?;
    let (workdir, paths, assume_clean) = prepare_members(&options.members)?;
    let member_bytes = member_bytes_of(&paths, options.spec.member_bytes)?;
    let members_on = if on_tmpfs(&paths[0]) { "tmpfs" } else { "disk" };
    let wants = |t| options.targets.contains(&t);
    let phase_count = |stripe: u64| -> u64 {
        all_phases(&options.workloads, stripe)
            .iter()
            .map(|(_, p)| p.len() as u64)
            .sum()
    };
    let uraid_rounds =
        options.states.len() as u64 * options.sweep.as_ref().map_or(1, |(_, v)| v.len() as u64);
    let total = phase_count(1 << 20)
        * (u64::from(wants(TargetKind::Uraid)) * uraid_rounds
            + u64::from(wants(TargetKind::Raw))
            + u64::from(wants(TargetKind::Nbdkit))
            + u64::from(wants(TargetKind::Ublk)));
    let progress = indicatif::ProgressBar::new(total);
    progress.set_style(
        indicatif::ProgressStyle::with_template("bench [{bar:30}] {pos}/{len} {msg} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    // The disk is probed when uraid is compared with the raw members on it,
    // with O_DIRECT (buffered, the probe would measure the page cache).
    let probe_on = if members_on == "disk" && wants(TargetKind::Uraid) && wants(TargetKind::Raw) {
        Some(Arc::new(RawStripes::open(&paths, member_bytes)?)).filter(|raw| raw.direct)
    } else {
        None
    };
    let mut m = Measure {
        options,
        progress: &progress,
        rows: Vec::new(),
        notes: Vec::new(),
        probe_on,
        probes: Vec::new(),
        disks: diskbusy::devices_of(&paths),
    };
    // uraid first: it creates the array; raw then reuses the same files
    // (overwriting the array, which is the benchmark's own).
    let mut stripe_bytes = 1 << 20;
    let mut array_bytes = None;
    let mut tunables_in_force = Vec::new();
    if wants(TargetKind::Uraid) {
        let socket = workdir.0.join("uraid.nbd");
        let mut live = LiveArray::create_and_serve(
            &paths,
            &options.spec,
            assume_clean,
            !assume_clean,
            &socket,
        )?;
        let result = measure_uraid(&mut m, &mut live, &paths, &mut tunables_in_force);
        stripe_bytes = live.stripe_data_bytes();
        array_bytes = Some(live.engine.size_bytes());
        let stopped = live.stop();
        result?;
        stopped?;
        // Once stopped: a rebuild still running would slow the probe.
        m.probe_disk("after uraid", true);
    }
    if wants(TargetKind::Ublk) {
        measure_ublk(&mut m, &workdir.0, &paths, assume_clean)?;
        m.probe_disk("after ublk", true);
    }
    let mut raw_direct = None;
    if wants(TargetKind::Raw) {
        let raw = Arc::new(RawStripes::open(&paths, member_bytes)?);
        raw_direct = Some(raw.direct);
        if !raw.direct {
            m.note("the raw member files do not take O_DIRECT here: raw I/O is buffered".into());
        }
        let access = Access::Files(raw);
        m.progress
            .set_message("raw: filling the target before its phases");
        access.prefill(options.verify.then_some(SALT_RAW), options.seed)?;
        let drop = || targets::drop_file_caches(&paths);
        let run = TargetRun {
            name: "raw",
            state: "-",
            setting: None,
            salt: SALT_RAW,
            cpu: &|| None,
            in_process: false,
            drop_caches: &drop,
            background: &|| None,
            prepare: &|| Ok(()),
            rows_written: &|| None,
            knob: None,
            on_members: true,
        };
        for (_, phases) in all_phases(&options.workloads, stripe_bytes) {
            run_phases(&mut m, &access, &run, &phases)?;
        }
        m.probe_disk("after raw", true);
    }
    if wants(TargetKind::Nbdkit) {
        if Nbdkit::installed() {
            let size = array_bytes.unwrap_or(member_bytes * paths.len() as u64);
            let nbdkit = Nbdkit::start(
                &workdir.0.join("nbdkit.nbd"),
                size,
                &options.nbdkit_allocator,
            )?;
            let access = Access::Nbd {
                socket: nbdkit.socket.clone(),
                export: String::new(),
                size_bytes: size,
            };
            m.progress
                .set_message("nbdkit: filling the target before its phases");
            access.prefill(options.verify.then_some(SALT_NBDKIT), options.seed)?;
            let cpu = || nbdkit.cpu_seconds().ok();
            let run = TargetRun {
                name: "nbdkit",
                state: "-",
                setting: None,
                salt: SALT_NBDKIT,
                cpu: &cpu,
                in_process: false,
                drop_caches: &|| Ok(()),
                background: &|| None,
                prepare: &|| Ok(()),
                rows_written: &|| None,
                knob: None,
                on_members: false,
            };
            for (_, phases) in all_phases(&options.workloads, stripe_bytes) {
                run_phases(&mut m, &access, &run, &phases)?;
            }
        } else {
            m.note("nbdkit is not installed: no transport ceiling (tests/kernel/install-deps installs it)".into());
        }
    }
    progress.finish_and_clear();
    let mut rows = m.rows;
    report::fill_ratios(&mut rows);
    let level = options.spec.level.to_string();
    let facts = report::ArrayFacts {
        level: &level,
        devices: paths.len() as u32,
        in_memory: on_tmpfs(&paths[0]),
    };
    let (goals, unevaluated) = report::evaluate(&rows, &facts);
    let mut notes = m.notes;
    notes.extend(probe_note(&m.probes));
    if !unevaluated.is_empty() {
        notes.push(format!(
            "targets not evaluated by this run: {}",
            unevaluated.join("; ")
        ));
    }
    for g in goals.iter().filter(|g| !g.met) {
        notes.push(format!(
            "target missed: {} ({:.2}, needs {:.2})",
            g.name, g.measured, g.required
        ));
    }
    Ok(Report {
        date_utc: date_utc(),
        command: options.command.clone(),
        machine: machine(),
        array: ArrayReport {
            level,
            devices: paths.len() as u32,
            chunk_bytes: options.spec.chunk_bytes,
            member_bytes,
            stripe_data_bytes: stripe_bytes,
            members_on: members_on.to_string(),
            raw_direct,
            tunables: tunables_in_force,
            parity_impl: crate::parity::default_impl().name().to_string(),
        },
        seconds_per_phase: options.limits.measure.as_secs_f64(),
        warmup_seconds: options.limits.warmup.as_secs_f64(),
        verify: options.verify,
        nbdkit_allocator: options.nbdkit_allocator.clone(),
        rows,
        goals,
        notes,
        disk_probes: m.probes,
    })
}

fn measure_uraid(
    m: &mut Measure,
    live: &mut LiveArray,
    paths: &[PathBuf],
    tunables_in_force: &mut Vec<(String, String)>,
) -> Result<(), String> {
    let options = m.options;
    for (key, value) in &options.settings {
        tunables::set(&live.engine, key, value).map_err(|e| format!("--set {e}"))?;
    }
    let access = Access::Nbd {
        socket: live.socket.clone(),
        export: array::EXPORT_NAME.to_string(),
        size_bytes: live.engine.size_bytes(),
    };
    m.progress
        .set_message("uraid: filling the target before its phases");
    access.prefill(options.verify.then_some(SALT_URAID), options.seed)?;
    access.flush()?;
    m.probe_disk("before uraid", false);
    let phases = all_phases(&options.workloads, live.stripe_data_bytes());
    let sweep: Vec<Option<String>> = match &options.sweep {
        None => vec![None],
        Some((_, values)) => values.iter().cloned().map(Some).collect(),
    };
    for value in &sweep {
        let setting = match (value, &options.sweep) {
            (Some(v), Some((key, _))) => {
                tunables::set(&live.engine, key, v).map_err(|e| format!("--sweep {e}"))?;
                Some(format!("{key}={v}"))
            }
            _ => None,
        };
        for &state in &options.states {
            m.progress.set_message(format!(
                "uraid: entering the {} state (a rebuild to healthy runs unthrottled)",
                state.name()
            ));
            if let Err(e) = live.enter(state) {
                m.note(format!("state {} skipped: {e}", state.name()));
                m.progress
                    .inc(phases.iter().map(|(_, p)| p.len() as u64).sum());
                continue;
            }
            for (_, workload_phases) in &phases {
                let engine = live.engine.clone();
                let drop = || {
                    tunables::drop_engine_caches(&engine)?;
                    targets::drop_file_caches(paths)
                };
                let cpu = || Some(targets::process_cpu_seconds());
                let live_ref = &*live;
                let background = || live_ref.background();
                let run = TargetRun {
                    name: "uraid",
                    state: state.name(),
                    setting: setting.as_deref(),
                    salt: SALT_URAID,
                    cpu: &cpu,
                    in_process: true,
                    drop_caches: &drop,
                    background: &background,
                    prepare: &|| live_ref.keep_rebuilding(),
                    rows_written: &|| Some(tunables::row_counters(&live_ref.engine)),
                    knob: Some(&|key, value| tunables::swap(&live_ref.engine, key, value)),
                    on_members: true,
                };
                run_phases(m, &access, &run, workload_phases)?;
            }
        }
    }
    *tunables_in_force = tunables::list(&live.engine);
    Ok(())
}

/// The array served in process as /dev/ublkbN, measured by fio's io_uring
/// engine on the device (healthy, the knobs as given): the block-device
/// path next to the NBD one. A host without ublk gets a note instead.
fn measure_ublk(
    m: &mut Measure,
    workdir: &Path,
    paths: &[PathBuf],
    assume_clean: bool,
) -> Result<(), String> {
    if let Err(e) = crate::export::ublk::probe() {
        m.note(format!("ublk target skipped: {e}"));
        let skipped = all_phases(&m.options.workloads, 1 << 20);
        m.progress
            .inc(skipped.iter().map(|(_, p)| p.len() as u64).sum());
        return Ok(());
    }
    let options = m.options;
    let socket = workdir.join("ublk.nbd");
    let live =
        LiveArray::create_and_serve(paths, &options.spec, assume_clean, !assume_clean, &socket)?;
    for (key, value) in &options.settings {
        tunables::set(&live.engine, key, value).map_err(|e| format!("--set {e}"))?;
    }
    let measured = (|| {
        let backend = live.engine.clone() as Arc<dyn crate::export::BlockBackend>;
        let device = crate::export::ublk::serve(backend, Default::default())?;
        let size = live.engine.size_bytes();
        let files = Arc::new(targets::RawStripes::open_device(
            Path::new(&device.path()),
            size,
        )?);
        let access = Access::Files(files);
        m.progress
            .set_message("ublk: filling the target before its phases");
        access.prefill(options.verify.then_some(SALT_URAID), options.seed)?;
        let engine = live.engine.clone();
        let drop = || {
            tunables::drop_engine_caches(&engine)?;
            targets::drop_file_caches(paths)
        };
        let cpu = || Some(targets::process_cpu_seconds());
        let run = TargetRun {
            name: "ublk",
            state: "healthy",
            setting: None,
            salt: SALT_URAID,
            cpu: &cpu,
            in_process: true,
            drop_caches: &drop,
            background: &|| None,
            prepare: &|| Ok(()),
            rows_written: &|| Some(tunables::row_counters(&live.engine)),
            knob: None,
            on_members: true,
        };
        for (_, phases) in all_phases(&options.workloads, live.stripe_data_bytes()) {
            run_phases(m, &access, &run, &phases)?;
        }
        device.stop()
    })();
    let stopped = live.stop();
    measured?;
    stopped
}

pub(crate) fn date_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        memory_gib: (memory_kib / 1048576.0 * 10.0).round() / 10.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes(op: &'static str, iops: &[f64]) -> Vec<DiskProbe> {
        let when = ["before uraid", "after uraid", "after raw"];
        iops.iter()
            .zip(when)
            .map(|(&iops, when)| DiskProbe { when, op, iops })
            .collect()
    }

    #[test]
    fn the_probe_note_says_whether_the_disk_held_its_speed() {
        assert_eq!(
            probe_note(&probes("read", &[70_000.0])),
            None,
            "one probe compares nothing"
        );
        let steady = probe_note(&probes("read", &[70_000.0, 80_000.0, 75_000.0])).unwrap();
        assert!(steady.contains("read 70000 before uraid, 80000 after uraid, 75000 after raw"));
        assert!(steady.contains("steady"), "{steady}");
        // 1.2 exactly still holds; past it does not.
        let edge = probe_note(&probes("read", &[50_000.0, 60_000.0])).unwrap();
        assert!(edge.contains("steady"), "{edge}");
        let drifted = probe_note(&probes("read", &[30_000.0, 75_000.0, 70_000.0])).unwrap();
        assert!(drifted.contains("read speed changed 2.50x") && drifted.contains("do not hold"));
        // Reads steady, writes not: the writes decide.
        let mut both = probes("read", &[70_000.0, 72_000.0, 71_000.0]);
        both.extend(probes("write", &[50_000.0, 150_000.0]));
        let note = probe_note(&both).unwrap();
        assert!(
            note.contains("write 50000 before uraid, 150000 after uraid"),
            "{note}"
        );
        assert!(
            note.contains("write speed changed 3.00x") && !note.contains("read speed"),
            "{note}"
        );
    }
}
