//! The clients that measure the NBD targets: the clients of record, fio's
//! nbd engine (libnbd, one connection per job) and nbdcopy, run as the
//! user would run them, their own figures read back; and the benchmark's
//! own pipelined client (`generator`), kept as an extra and for what the
//! others cannot do (`--verify`, the raw member files).

use super::generator::{self, DataMode, Limits, Outcome};
use super::targets::Access;
use super::workload::{Op, Pattern, Phase};
use hdrhistogram::Histogram;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Who sends the requests of a phase on an NBD target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// fio --ioengine=nbd.
    Fio,
    /// nbdcopy to null: for sequential reads; every other phase with fio
    /// when it is installed, else with the benchmark's own client.
    Nbdcopy,
    /// The benchmark's own pipelined client (`nbd_client::Pipeline`).
    Uraid,
}

impl Client {
    pub fn parse(name: &str) -> Result<Client, String> {
        let client = match name {
            "fio" => Client::Fio,
            "nbdcopy" => Client::Nbdcopy,
            "uraid" => Client::Uraid,
            other => {
                return Err(format!(
                    "unknown client '{other}' (known: fio, nbdcopy, uraid)"
                ))
            }
        };
        client.check()?;
        Ok(client)
    }

    /// fio when it is installed, else the benchmark's own client.
    pub fn default_choice() -> Client {
        if installed("fio") {
            Client::Fio
        } else {
            Client::Uraid
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Client::Fio => "fio",
            Client::Nbdcopy => "nbdcopy",
            Client::Uraid => "uraid",
        }
    }

    /// Refuses a client whose program is missing, in one line.
    fn check(self) -> Result<(), String> {
        let program = match self {
            Client::Uraid => return Ok(()),
            Client::Fio => "fio",
            Client::Nbdcopy => "nbdcopy",
        };
        if installed(program) {
            Ok(())
        } else {
            Err(format!(
                "--client {program}: {program} is not installed (Debian: apt-get install {}); --client uraid needs nothing",
                if program == "fio" { "fio" } else { "libnbd-bin" }
            ))
        }
    }
}

/// Whether `program` runs (it is on PATH and starts).
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Measures one phase with `client` where it applies (an NBD target; for
/// nbdcopy a sequential read), else with the benchmark's own client.
/// Returns the outcome and the client that measured it.
pub fn run_phase(
    client: Client,
    access: &Access,
    phase: &Phase,
    limits: Limits,
    data: DataMode,
    at_window: &(dyn Fn() + Sync),
) -> Result<(Outcome, Client), String> {
    if phase.op == Op::Mixed {
        let outcome = generator::run_phase(access, phase, limits, data, at_window)?;
        return Ok((outcome, Client::Uraid));
    }
    let (socket, export, size_bytes) = match access {
        Access::Nbd {
            socket,
            export,
            size_bytes,
        } => (socket, export, size_bytes),
        // A block device: fio's io_uring engine on it, as a user measures
        // one, unless the own client is asked for.
        Access::Files(files) if client != Client::Uraid && files.device.is_some() => {
            let device = files.device.as_ref().expect("checked");
            let target = FioTarget::Device(device.display().to_string());
            return run_fio(&target, phase, files.size_bytes(), limits, at_window)
                .map(|o| (o, Client::Fio));
        }
        Access::Files(_) => {
            let outcome = generator::run_phase(access, phase, limits, data, at_window)?;
            return Ok((outcome, Client::Uraid));
        }
    };
    let uri = FioTarget::Nbd(nbd_uri(socket, export));
    let fio_installed = || client == Client::Fio || installed("fio");
    match client {
        Client::Nbdcopy if phase.op == Op::Read && phase.pattern == Pattern::Sequential => {
            at_window();
            let FioTarget::Nbd(uri) = &uri else {
                unreachable!("an NBD target")
            };
            run_nbdcopy(uri, phase, *size_bytes).map(|o| (o, Client::Nbdcopy))
        }
        Client::Fio | Client::Nbdcopy if fio_installed() => {
            run_fio(&uri, phase, *size_bytes, limits, at_window).map(|o| (o, Client::Fio))
        }
        _ => {
            generator::run_phase(access, phase, limits, data, at_window).map(|o| (o, Client::Uraid))
        }
    }
}

fn nbd_uri(socket: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", socket.display())
}

/// fio's time values in milliseconds (it takes an `ms` suffix).
fn fio_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// What fio opens: an NBD URI (its nbd engine) or a block device (its
/// io_uring engine, O_DIRECT).
enum FioTarget {
    Nbd(String),
    Device(String),
}

fn run_fio(
    target: &FioTarget,
    phase: &Phase,
    size_bytes: u64,
    limits: Limits,
    at_window: &(dyn Fn() + Sync),
) -> Result<Outcome, String> {
    let rw = match (phase.op, phase.pattern) {
        (Op::Read, Pattern::Sequential) => "read",
        (Op::Read, Pattern::Random) => "randread",
        (Op::Write, Pattern::Sequential) => "write",
        (Op::Write, Pattern::Random) => "randwrite",
        (Op::Mixed, _) => {
            return Err("fio runs no mixed phase here: it is the raw files' own".into())
        }
    };
    let block = phase.block_bytes;
    // As the own client deals them: a sequential job has a region of its
    // own, a random one ranges over the whole target.
    let (region, increment) = match phase.pattern {
        Pattern::Sequential => {
            let per_job = size_bytes / phase.jobs as u64 / block * block;
            (per_job, per_job)
        }
        Pattern::Random => (size_bytes / block * block, 0),
    };
    if region == 0 {
        return Err(format!(
            "{} {}: the target ({size_bytes} bytes) is too small for {} jobs of {block}-byte requests",
            phase.workload.name(),
            phase.name,
            phase.jobs
        ));
    }
    let mut command = Command::new("fio");
    match target {
        FioTarget::Nbd(uri) => command.args(["--ioengine=nbd".to_string(), format!("--uri={uri}")]),
        FioTarget::Device(path) => command.args([
            "--ioengine=io_uring".to_string(),
            "--direct=1".to_string(),
            format!("--filename={path}"),
        ]),
    };
    command.args([
        "--name=bench",
        &format!("--rw={rw}"),
        &format!("--bs={block}"),
        &format!("--iodepth={}", phase.depth_per_job),
        &format!("--numjobs={}", phase.jobs),
        &format!("--size={region}"),
        &format!("--offset_increment={increment}"),
        "--group_reporting",
        "--time_based",
        &format!("--ramp_time={}", fio_ms(limits.warmup)),
        &format!("--runtime={}", fio_ms(limits.measure)),
        "--percentile_list=50:90:99:99.9",
        "--output-format=json",
    ]);
    let started = Instant::now();
    let output = std::thread::scope(|scope| {
        // The target's CPU is sampled when fio's ramp ends, as the own
        // client's window opens.
        scope.spawn(|| {
            std::thread::sleep(limits.warmup.saturating_sub(started.elapsed()));
            at_window();
        });
        command.stdin(Stdio::null()).output()
    })
    .map_err(|e| format!("cannot run fio: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .chain(stdout.lines())
            .rfind(|l| !l.trim().is_empty());
        return Err(format!(
            "fio failed ({}): {}",
            output.status,
            last.unwrap_or("no message")
        ));
    }
    let result = parse_fio(&stdout, phase.op)?;
    Ok(result.outcome())
}

/// What fio reports for one direction of a group of jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct FioResult {
    pub io_bytes: u64,
    pub bw_bytes: f64,
    pub iops: f64,
    pub runtime_ms: u64,
    pub total_ios: u64,
    /// Completion latency (clat) in ns at 50, 90, 99 and 99.9 %.
    pub clat_ns: [u64; 4],
    /// fio's usr_cpu + sys_cpu, in percent of the run.
    pub cpu_percent: f64,
}

/// Reads fio's `--output-format=json` (anything before the JSON, such as
/// the nbd engine's "fio: connected to NBD server", is skipped): the
/// first job's (with --group_reporting, the group's) figures for `op`.
pub fn parse_fio(text: &str, op: Op) -> Result<FioResult, String> {
    let start = text
        .find("\n{")
        .map(|at| at + 1)
        .or_else(|| text.starts_with('{').then_some(0))
        .ok_or("fio printed no JSON report")?;
    let json: Value = serde_json::from_str(&text[start..])
        .map_err(|e| format!("fio's JSON report does not parse: {e}"))?;
    let job = json
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or("fio's JSON report has no job")?;
    let side = match op {
        Op::Read => "read",
        Op::Write => "write",
        Op::Mixed => return Err("a mixed phase has two sides in fio's report".into()),
    };
    let d = job
        .get(side)
        .ok_or_else(|| format!("fio's JSON report has no '{side}' figures"))?;
    let num = |v: &Value, key: &str| -> Result<f64, String> {
        v.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("fio's JSON report lacks {side}.{key}"))
    };
    let percentiles = d
        .get("clat_ns")
        .and_then(|c| c.get("percentile"))
        .ok_or_else(|| format!("fio's JSON report lacks {side}.clat_ns.percentile"))?;
    let mut clat_ns = [0u64; 4];
    for (slot, key) in clat_ns
        .iter_mut()
        .zip(["50.000000", "90.000000", "99.000000", "99.900000"])
    {
        *slot = num(percentiles, key)? as u64;
    }
    let cpu = |key: &str| job.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    Ok(FioResult {
        io_bytes: num(d, "io_bytes")? as u64,
        bw_bytes: num(d, "bw_bytes")?,
        iops: num(d, "iops")?,
        runtime_ms: num(d, "runtime")? as u64,
        total_ios: num(d, "total_ios")? as u64,
        clat_ns,
        cpu_percent: cpu("usr_cpu") + cpu("sys_cpu"),
    })
}

impl FioResult {
    /// As the own client's outcome: fio's counts and time, and a latency
    /// histogram that gives back fio's four percentiles.
    pub fn outcome(&self) -> Outcome {
        let seconds = self.runtime_ms as f64 / 1000.0;
        // Weights per thousand requests: 500 at p50, 400 at p90, 90 at
        // p99, 10 at p99.9, so that each quantile reads back fio's value.
        let mut latency_ns = Histogram::<u64>::new(3).expect("3 significant digits");
        for (value, weight) in self.clat_ns.iter().zip([500, 400, 90, 10]) {
            latency_ns
                .record_n((*value).max(1), weight)
                .expect("the histogram grows");
        }
        Outcome {
            ops: self.total_ios,
            bytes: self.io_bytes,
            seconds: seconds.max(f64::MIN_POSITIVE),
            latency_ns,
            cpu_client_seconds: self.cpu_percent / 100.0 * seconds,
        }
    }
}

/// nbdcopy from the target to null: with the phase's connections,
/// requests in flight and request size: the whole target once, timed from
/// outside; it reports no latencies, so the row's are left at zero.
fn run_nbdcopy(uri: &str, phase: &Phase, size_bytes: u64) -> Result<Outcome, String> {
    let started = Instant::now();
    let before = children_cpu();
    let output = Command::new("nbdcopy")
        .args([
            &format!("--connections={}", phase.jobs),
            &format!("--requests={}", phase.depth_per_job),
            &format!("--request-size={}", phase.block_bytes),
            "--",
            uri,
            "null:",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run nbdcopy: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "nbdcopy failed ({}): {}",
            output.status,
            stderr.lines().last().unwrap_or("no message")
        ));
    }
    let block = phase.block_bytes.max(1);
    let mut latency_ns = Histogram::<u64>::new(3).expect("3 significant digits");
    latency_ns.record(1).expect("the histogram grows");
    latency_ns.reset();
    Ok(Outcome {
        ops: size_bytes.div_ceil(block),
        bytes: size_bytes,
        seconds,
        latency_ns,
        cpu_client_seconds: children_cpu() - before,
    })
}

/// CPU seconds of this process's waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../tests/fixtures/fio-nbd-read.json");

    #[test]
    fn fio_json_gives_its_figures() {
        let r = parse_fio(SAMPLE, Op::Read).unwrap();
        assert_eq!(r.io_bytes, 2_938_109_952);
        assert_eq!(r.total_ios, 2787);
        assert_eq!(r.runtime_ms, 2010);
        assert_eq!(r.clat_ns, [9_895_936, 19_529_728, 42_205_184, 79_167_488]);
        assert!((r.bw_bytes - 1_461_746_244.0).abs() < 1.0);
        assert!((r.cpu_percent - 25.286212).abs() < 1e-6);
        let o = r.outcome();
        assert_eq!(o.ops, 2787);
        assert!((o.ops as f64 / o.seconds - 1386.567164).abs() < 0.01);
        let p = |q: f64| o.latency_ns.value_at_quantile(q);
        for (q, want) in [(0.5, 9_895_936u64), (0.9, 19_529_728), (0.99, 42_205_184)] {
            let got = p(q) as f64;
            assert!(
                (got / want as f64 - 1.0).abs() < 0.01,
                "q{q}: {got} vs {want}"
            );
        }
        assert!((o.cpu_client_seconds - 0.25286212 * 2.010).abs() < 1e-6);
    }

    #[test]
    fn fio_json_refusals_say_what_is_missing() {
        let err = parse_fio("fio: connected to NBD server\n", Op::Read).unwrap_err();
        assert!(err.contains("no JSON"), "{err}");
        let err = parse_fio("{\"jobs\": []}", Op::Read).unwrap_err();
        assert!(err.contains("no job"), "{err}");
        let no_write = SAMPLE.replace("\"write\"", "\"other\"");
        let err = parse_fio(&no_write, Op::Write).unwrap_err();
        assert!(err.contains("'write'"), "{err}");
    }

    #[test]
    fn unknown_client_is_refused() {
        assert!(Client::parse("dd").unwrap_err().contains("known: fio"));
        assert_eq!(Client::parse("uraid").unwrap(), Client::Uraid);
    }
}
