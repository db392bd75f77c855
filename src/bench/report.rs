//! The report: one row per (target, state, setting, workload, phase), the
//! ratios uraid/raw and uraid/nbdkit, the performance targets checked against
//! them, and the table and JSON forms.
//!
//! MB/s are 10^6 bytes per second of data moved by the client (parity and
//! copies written by the array are not counted), as fio and the seeds count.

use super::generator::Outcome;
use super::workload::Phase;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The client that measured it: fio, nbdcopy or uraid (the
    /// benchmark's own; always for the raw member files).
    pub client: String,
    pub target: String,
    /// healthy/degraded/rebuilding for uraid; "-" for raw and nbdkit.
    pub state: String,
    /// The tunable in force for a sweep ("stripe_cache_size=4096").
    pub setting: Option<String>,
    pub workload: String,
    pub phase: String,
    pub op: super::workload::Op,
    pub pattern: super::workload::Pattern,
    pub block_bytes: u64,
    pub jobs: u32,
    pub queue_depth: u32,
    pub seconds: f64,
    pub ops: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub latency_us_p50: f64,
    pub latency_us_p90: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    /// CPU seconds of the load generator (client threads).
    pub cpu_client_s: f64,
    /// CPU seconds of the target: uraid's server and engine (this process
    /// less the client threads), nbdkit's process; none for raw files,
    /// whose I/O runs in the client threads.
    pub cpu_target_s: Option<f64>,
    /// What the background job was doing at the end (rebuilding state).
    pub background: Option<String>,
    /// uraid's stripe cache during the phase: rows written whole (no
    /// reads) and rows written in part (read-modify-write or
    /// reconstruct-write).
    pub full_rows: Option<u64>,
    pub partial_rows: Option<u64>,
    /// The share of the phase the members' disk had a request in flight
    /// (uraid and raw on a disk; see `diskbusy`).
    pub disk_busy: Option<f64>,
    pub ratio_uraid_raw: Option<f64>,
    pub ratio_uraid_nbdkit: Option<f64>,
}

/// Where a row came from, besides its phase.
pub struct RowContext<'a> {
    pub client: &'a str,
    pub target: &'a str,
    pub state: &'a str,
    pub setting: Option<&'a str>,
    pub cpu_target_s: Option<f64>,
    pub background: Option<String>,
    /// (full, partial) rows written during the phase.
    pub rows_written: Option<(u64, u64)>,
    pub disk_busy: Option<f64>,
}

impl Row {
    pub fn new(context: RowContext, phase: &Phase, outcome: &Outcome) -> Row {
        let us = |q: f64| outcome.latency_ns.value_at_quantile(q) as f64 / 1000.0;
        Row {
            client: context.client.to_string(),
            target: context.target.to_string(),
            state: context.state.to_string(),
            setting: context.setting.map(str::to_string),
            workload: phase.workload.name().to_string(),
            phase: phase.name.clone(),
            op: phase.op,
            pattern: phase.pattern,
            block_bytes: phase.block_bytes,
            jobs: phase.jobs,
            queue_depth: phase.queue_depth(),
            seconds: outcome.seconds,
            ops: outcome.ops,
            bytes: outcome.bytes,
            iops: outcome.ops as f64 / outcome.seconds,
            mb_per_s: outcome.bytes as f64 / outcome.seconds / 1e6,
            latency_us_p50: us(0.50),
            latency_us_p90: us(0.90),
            latency_us_p99: us(0.99),
            latency_us_p999: us(0.999),
            cpu_client_s: outcome.cpu_client_seconds,
            cpu_target_s: context.cpu_target_s,
            background: context.background,
            full_rows: context.rows_written.map(|r| r.0),
            partial_rows: context.rows_written.map(|r| r.1),
            disk_busy: context.disk_busy,
            ratio_uraid_raw: None,
            ratio_uraid_nbdkit: None,
        }
    }

    fn same_job(&self, other: &Row) -> bool {
        self.workload == other.workload && self.phase == other.phase
    }
}

/// Fills the ratios of every uraid row from the raw and nbdkit rows of the
/// same workload and phase.
pub fn fill_ratios(rows: &mut [Row]) {
    let baseline = |rows: &[Row], target: &str, row: &Row| {
        rows.iter()
            .find(|b| b.target == target && b.same_job(row))
            .map(|b| b.iops)
    };
    for i in 0..rows.len() {
        if rows[i].target != "uraid" {
            continue;
        }
        let raw = baseline(rows, "raw", &rows[i]);
        let nbdkit = baseline(rows, "nbdkit", &rows[i]);
        let row = &mut rows[i];
        row.ratio_uraid_raw = raw.filter(|&b| b > 0.0).map(|b| row.iops / b);
        row.ratio_uraid_nbdkit = nbdkit.filter(|&b| b > 0.0).map(|b| row.iops / b);
    }
}

/// One of the performance targets (docs/BENCHMARKS.md, "The targets"), checked on this run's rows.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub name: String,
    /// uraid's result as a fraction of the baseline the target names.
    pub measured: f64,
    pub required: f64,
    pub met: bool,
    pub detail: String,
    /// raid6 random writes only: uraid against a sixth of what the raw
    /// members do under a 50/50 read/write mix, the read-modify-write
    /// bound of this device (context, not the target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix_bound_ratio: Option<f64>,
    /// raid6 random writes only: uraid with md's largest stripe cache
    /// against the same bound as the target (how far above it the cache
    /// gets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_max_ratio: Option<f64>,
}

/// The array the run measured, as the goals need it.
pub struct ArrayFacts<'a> {
    pub level: &'a str,
    pub devices: u32,
    /// Members in memory (tmpfs): the targets against `nbdkit memory`
    /// apply; on a disk, those against the raw members do.
    pub in_memory: bool,
}

/// Checks every performance target that this run has the rows for: those
/// set for members in memory on a run in memory, those set for members on
/// disk on a run on disk (a disk target read off a memory run says
/// nothing, and the reverse).
pub fn goals(rows: &[Row], array: &ArrayFacts) -> Vec<Goal> {
    evaluate(rows, array).0
}

/// The performance targets that apply to this run's array and medium but
/// that it has no rows for, each with what it needs: a run says what it
/// did not check rather than stay silent about it.
pub fn unevaluated(rows: &[Row], array: &ArrayFacts) -> Vec<String> {
    evaluate(rows, array).1
}

/// The targets checked ([`goals`]) and those left unjudged
/// ([`unevaluated`]), in one pass.
pub fn evaluate(rows: &[Row], array: &ArrayFacts) -> (Vec<Goal>, Vec<String>) {
    let find = |target: &str, state: &str, workload: &str, phase: &str| {
        rows.iter().find(|r| {
            r.target == target
                && r.setting.is_none()
                && r.workload == workload
                && r.phase == phase
                && (r.target != "uraid" || r.state == state)
        })
    };
    let mut goals = Vec::new();
    let mut missing = Vec::new();
    let mut vs = |name: String,
                  state: &str,
                  workload: &str,
                  phase: &str,
                  base: &str,
                  required: f64,
                  scale: f64| {
        let (Some(u), Some(b)) = (
            find("uraid", state, workload, phase),
            find(base, "-", workload, phase),
        ) else {
            missing.push(format!(
                "{name} (needs --workload {workload} with uraid in state {state}, and {base} in --targets)"
            ));
            return;
        };
        if b.iops <= 0.0 {
            return;
        }
        let measured = u.iops / (b.iops * scale);
        goals.push(Goal {
            name,
            measured,
            required,
            met: measured >= required,
            mix_bound_ratio: None,
            cache_max_ratio: None,
            detail: format!(
                "uraid {:.0} IOPS / {:.1} MB/s; {base} {:.0} IOPS / {:.1} MB/s{}{}",
                u.iops,
                u.mb_per_s,
                b.iops,
                b.mb_per_s,
                if scale != 1.0 {
                    format!(", bound = {base} x {scale:.3}")
                } else {
                    String::new()
                },
                match (u.full_rows, u.partial_rows) {
                    (Some(full), Some(partial)) => {
                        format!("; uraid rows written whole {full}, in part {partial}")
                    }
                    _ => String::new(),
                }
            ),
        });
    };
    let n = array.devices as f64;
    let raid6 = array.level == "raid6";
    if array.in_memory {
        memory_goals(&mut vs, array.level, array.devices);
    } else {
        disk_goals(&mut vs, raid6, n, &find);
        if let (Some(uraid), Some(raw)) = (
            find("uraid", "healthy", "randread", "randread"),
            find("raw", "-", "randread", "randread"),
        ) {
            add_disk_busy(&mut goals, uraid, raw);
        }
        if let (Some(uraid), Some(mix)) = (
            find("uraid", "healthy", "fio-randwrite", "randwrite"),
            find("raw", "-", "fio-randwrite", "rmw-mix"),
        ) {
            add_mix_bound(&mut goals, uraid, mix);
        }
        // The same writes with the largest stripe cache: the randwrite
        // row with that setting alone (a swept knob's would be named too).
        let (key, value) = super::workload::CACHE_MAX;
        let cache_max = format!("{key}={value}");
        let cached = rows.iter().find(|r| {
            r.target == "uraid"
                && r.state == "healthy"
                && r.workload == "fio-randwrite"
                && r.phase == "randwrite"
                && r.setting.as_deref() == Some(cache_max.as_str())
        });
        if let (Some(cached), Some(raw)) = (cached, find("raw", "-", "fio-randwrite", "randwrite"))
        {
            add_cache_max(&mut goals, &cache_max, cached, raw);
        }
    }
    (goals, missing)
}

/// Says, beside the disk random-read target, how busy the members' disk
/// was in uraid's phase and in raw's: at the same queue depth a target
/// whose requests reach the disk in bursts leaves it idle in between
/// (docs/BENCHMARKS.md, "Disk random read"), and this is where that shows.
fn add_disk_busy(goals: &mut [Goal], uraid: &Row, raw: &Row) {
    let (Some(goal), Some(u), Some(r)) = (
        goals
            .iter_mut()
            .find(|g| g.name.starts_with("4K randread QD32 vs min")),
        uraid.disk_busy,
        raw.disk_busy,
    ) else {
        return;
    };
    goal.detail.push_str(&format!(
        "; the members' disk was busy {:.0} % of uraid's phase, {:.0} % of raw's",
        u * 100.0,
        r * 100.0
    ));
}

/// The raid6 random-write target, if this run has it.
fn randwrite_goal(goals: &mut [Goal]) -> Option<&mut Goal> {
    goals
        .iter_mut()
        .find(|g| g.name.starts_with("raid6 4K randwrite"))
}

/// Says, beside the random-write target, how far the same writes get with
/// md's largest stripe cache (the issue asks how far above the bound the
/// cache gets). The target itself is judged at the array's own setting.
fn add_cache_max(goals: &mut [Goal], setting: &str, cached: &Row, raw: &Row) {
    let Some(goal) = randwrite_goal(goals).filter(|_| raw.iops > 0.0) else {
        return;
    };
    let ratio = cached.iops / (raw.iops / 6.0);
    goal.detail.push_str(&format!(
        "; with {setting}: uraid {:.0} IOPS, {ratio:.2} of raw / 6",
        cached.iops,
    ));
    goal.cache_max_ratio = Some(ratio);
}

/// Says, beside the random-write target, what the raw members did under
/// the read-modify-write mix (as many reads as writes): a sixth of it is
/// what raid6's small writes can reach on this device when reads and
/// writes cost it differently. The target itself is left as the issue sets
/// it (raw random writes / 6).
fn add_mix_bound(goals: &mut [Goal], uraid: &Row, mix: &Row) {
    let Some(goal) = randwrite_goal(goals).filter(|_| mix.iops > 0.0) else {
        return;
    };
    let bound = mix.iops / 6.0;
    let uraid = uraid.iops;
    goal.detail.push_str(&format!(
        "; the members' read-modify-write mix (raw 50/50 {:.0} IOPS / 6) bounds it at {:.0}: uraid {:.2} of that",
        mix.iops,
        bound,
        uraid / bound
    ));
    goal.mix_bound_ratio = Some(uraid / bound);
}

/// The performance targets for members in memory, against `nbdkit memory`.
fn memory_goals(
    vs: &mut impl FnMut(String, &str, &str, &str, &str, f64, f64),
    level: &str,
    devices: u32,
) {
    if level == "raid0" {
        for phase in ["read", "write"] {
            vs(
                format!("raid0 seq 1M {phase} vs nbdkit memory"),
                "healthy",
                "seq-1m",
                phase,
                "nbdkit",
                0.90,
                1.0,
            );
        }
    }
    if level == "raid6" {
        vs(
            format!("raid6 ({devices} members) full-stripe seq write vs nbdkit memory"),
            "healthy",
            "seq-stripe",
            "write",
            "nbdkit",
            0.80,
            1.0,
        );
    }
    vs(
        "4K randread QD32 healthy vs nbdkit memory".into(),
        "healthy",
        "randread",
        "randread",
        "nbdkit",
        0.90,
        1.0,
    );
    // An array without redundancy has no state with a member missing.
    if level == "raid0" || level == "linear" {
        return;
    }
    vs(
        "4K randread QD32 one member missing vs nbdkit memory".into(),
        "degraded",
        "randread",
        "randread",
        "nbdkit",
        0.60,
        1.0,
    );
}

/// The performance targets for members on disk, against the raw members.
fn disk_goals<'r>(
    vs: &mut impl FnMut(String, &str, &str, &str, &str, f64, f64),
    raid6: bool,
    n: f64,
    find: &impl Fn(&str, &str, &str, &str) -> Option<&'r Row>,
) {
    if raid6 {
        vs(
            "raid6 seq write vs (N-2)/N of raw aggregate".into(),
            "healthy",
            "seq-stripe",
            "write",
            "raw",
            0.90,
            (n - 2.0) / n,
        );
    }
    // 4K random read against the raw aggregate, or the transport ceiling when lower.
    let raw = find("raw", "-", "randread", "randread").map(|r| r.iops);
    let ceiling = find("nbdkit", "-", "randread", "randread").map(|r| r.iops);
    let base = match (raw, ceiling) {
        (Some(r), Some(c)) if c < r => "nbdkit",
        _ => "raw",
    };
    vs(
        format!("4K randread QD32 vs min(raw, nbdkit) ({base})"),
        "healthy",
        "randread",
        "randread",
        base,
        0.90,
        1.0,
    );
    if raid6 {
        vs(
            "raid6 4K randwrite vs read-modify-write bound (raw / 6)".into(),
            "healthy",
            "fio-randwrite",
            "randwrite",
            "raw",
            1.0,
            1.0 / 6.0,
        );
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The human-readable table.
pub fn table(rows: &[Row], goals: &[Goal], notes: &[String]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<7} {:<7} {:<10} {:<23} {:<13} {:<9} {:>7} {:>4} {:>10} {:>9} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>5} {:>6} {:>6}\n",
        "target", "client", "state", "setting", "workload", "phase", "bs", "qd", "IOPS", "MB/s", "p50us", "p90us", "p99us", "p99.9us", "cpu_c", "cpu_t", "busy", "/raw", "/nbdk"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<7} {:<7} {:<10} {:<23} {:<13} {:<9} {:>7} {:>4} {:>10.0} {:>9.1} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>6.2} {:>6} {:>5} {:>6} {:>6}\n",
            r.target,
            r.client,
            r.state,
            r.setting.as_deref().unwrap_or("-"),
            r.workload,
            r.phase,
            human_bytes(r.block_bytes),
            r.queue_depth,
            r.iops,
            r.mb_per_s,
            r.latency_us_p50,
            r.latency_us_p90,
            r.latency_us_p99,
            r.latency_us_p999,
            r.cpu_client_s,
            opt(r.cpu_target_s, 2),
            r.disk_busy
                .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
            opt(r.ratio_uraid_raw, 2),
            opt(r.ratio_uraid_nbdkit, 2),
        ));
    }
    out.push_str("client = who measured the row (fio, nbdcopy, or uraid: the benchmark's own, always for raw); MB/s = 10^6 bytes/s of client data; latency submit to completion (fio: its clat; nbdcopy reports none); cpu_c/cpu_t = CPU seconds of the load generator / of the target; busy = share of the phase the members' disk had a request in flight.\n");
    if !goals.is_empty() {
        out.push_str("\nperformance targets:\n");
        for g in goals {
            out.push_str(&format!(
                "  {:<4} {:<62} {:>6.2} (needs >= {:.2})  {}\n",
                if g.met { "MET" } else { "MISS" },
                g.name,
                g.measured,
                g.required,
                g.detail
            ));
        }
    }
    for note in notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

pub fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, state: &str, workload: &str, phase: &str, iops: f64) -> Row {
        Row {
            client: "uraid".into(),
            target: target.into(),
            state: state.into(),
            setting: None,
            workload: workload.into(),
            phase: phase.into(),
            op: super::super::workload::Op::Read,
            pattern: super::super::workload::Pattern::Random,
            block_bytes: 4096,
            jobs: 4,
            queue_depth: 32,
            seconds: 1.0,
            ops: iops as u64,
            bytes: iops as u64 * 4096,
            iops,
            mb_per_s: iops * 4096.0 / 1e6,
            latency_us_p50: 1.0,
            latency_us_p90: 1.0,
            latency_us_p99: 1.0,
            latency_us_p999: 1.0,
            cpu_client_s: 0.0,
            cpu_target_s: None,
            background: None,
            full_rows: None,
            partial_rows: None,
            disk_busy: None,
            ratio_uraid_raw: None,
            ratio_uraid_nbdkit: None,
        }
    }

    #[test]
    fn ratios_and_goals() {
        let mut rows = vec![
            row("raw", "-", "randread", "randread", 1000.0),
            row("nbdkit", "-", "randread", "randread", 800.0),
            row("uraid", "healthy", "randread", "randread", 760.0),
            row("uraid", "degraded", "randread", "randread", 400.0),
            row("raw", "-", "fio-randwrite", "randwrite", 600.0),
            row("uraid", "healthy", "fio-randwrite", "randwrite", 150.0),
        ];
        fill_ratios(&mut rows);
        assert_eq!(rows[2].ratio_uraid_raw, Some(0.76));
        assert_eq!(rows[2].ratio_uraid_nbdkit, Some(0.95));
        assert_eq!(rows[0].ratio_uraid_raw, None);
        let facts = |in_memory| ArrayFacts {
            level: "raid6",
            devices: 6,
            in_memory,
        };
        let memory = goals(&rows, &facts(true));
        let disk = goals(&rows, &facts(false));
        let by_name = |goals: &[Goal], prefix: &str| {
            goals
                .iter()
                .find(|g| g.name.starts_with(prefix))
                .map(|g| (g.name.clone(), g.measured, g.met))
        };
        assert!(by_name(&memory, "4K randread QD32 healthy").unwrap().2);
        let missing = by_name(&memory, "4K randread QD32 one member missing").unwrap();
        assert!(!missing.2, "0.5 < 0.6");
        // The transport ceiling is lower than raw, so it is the baseline.
        let (name, _, _) = by_name(&disk, "4K randread QD32 vs min").unwrap();
        assert!(name.contains("nbdkit"), "{name}");
        let (_, measured, met) = by_name(&disk, "raid6 4K randwrite").unwrap();
        assert!((measured - 1.5).abs() < 1e-9 && met);
        // What these rows cannot judge is named, with what it needs; what
        // they judge is not.
        let memory_left = unevaluated(&rows, &facts(true));
        assert_eq!(memory_left.len(), 1, "{memory_left:?}");
        assert!(
            memory_left[0].starts_with("raid6 (6 members) full-stripe seq write")
                && memory_left[0].contains("--workload seq-stripe"),
            "{memory_left:?}"
        );
        // An array without redundancy has no degraded target to miss.
        let raid0 = ArrayFacts {
            level: "raid0",
            devices: 6,
            in_memory: true,
        };
        let raid0_left = unevaluated(&rows, &raid0);
        assert!(
            raid0_left.iter().all(|t| !t.contains("missing")),
            "{raid0_left:?}"
        );
        let disk_left = unevaluated(&rows, &facts(false));
        assert_eq!(disk_left.len(), 1, "{disk_left:?}");
        assert!(disk_left[0].starts_with("raid6 seq write"), "{disk_left:?}");
        // With the raw members' read-modify-write mix measured, the target
        // is unchanged and the mix's bound is given beside it.
        let mut mixed = rows.clone();
        mixed.push(row("raw", "-", "fio-randwrite", "rmw-mix", 300.0));
        let disk_mixed = goals(&mixed, &facts(false));
        let goal = disk_mixed
            .iter()
            .find(|g| g.name.starts_with("raid6 4K randwrite"))
            .unwrap();
        assert!((goal.measured - 1.5).abs() < 1e-9 && goal.met);
        assert_eq!(goal.mix_bound_ratio, Some(3.0));
        assert!(goal.detail.contains("bounds it at 50"), "{}", goal.detail);
        assert!(
            goal.detail.contains("uraid 3.00 of that"),
            "{}",
            goal.detail
        );
        assert_eq!(goal.cache_max_ratio, None, "no phase with the big cache");
        // The same writes with the largest stripe cache are given beside
        // the target, against the same bound; the target is unchanged.
        let mut cached = row("uraid", "healthy", "fio-randwrite", "randwrite", 240.0);
        cached.setting = Some("stripe_cache_size=32768".into());
        mixed.push(cached);
        let disk_cached = goals(&mixed, &facts(false));
        let goal = disk_cached
            .iter()
            .find(|g| g.name.starts_with("raid6 4K randwrite"))
            .unwrap();
        assert!((goal.measured - 1.5).abs() < 1e-9 && goal.met);
        assert!((goal.cache_max_ratio.unwrap() - 2.4).abs() < 1e-9);
        assert!(
            goal.detail
                .contains("with stripe_cache_size=32768: uraid 240 IOPS, 2.40 of raw / 6"),
            "{}",
            goal.detail
        );
        // How busy the disk was goes beside the random-read target when
        // both phases measured it.
        let mut busy = rows.clone();
        busy[0].disk_busy = Some(1.0);
        busy[2].disk_busy = Some(0.81);
        let disk_busy = goals(&busy, &facts(false));
        let goal = disk_busy
            .iter()
            .find(|g| g.name.starts_with("4K randread QD32 vs min"))
            .unwrap();
        assert!(
            goal.detail
                .contains("disk was busy 81 % of uraid's phase, 100 % of raw's"),
            "{}",
            goal.detail
        );
        // Each medium's targets only: a disk target read off a memory run
        // says nothing, and the reverse.
        assert!(by_name(&memory, "raid6 4K randwrite").is_none());
        assert!(by_name(&memory, "4K randread QD32 vs min").is_none());
        assert!(by_name(&disk, "4K randread QD32 healthy").is_none());
        assert!(by_name(&disk, "4K randread QD32 one member missing").is_none());
        assert_eq!(human_bytes(393216), "384K");
    }
}
