//! The tuner on a real array: bench's scratch array (or the devices given
//! with --destroy-data), served in process, measured with bench's
//! workloads and generator; the measurement behind the search's
//! [`Measure`], with the time budget.

use super::confirm::{self, Verdict};
use super::report::{Pick, PointOut, TuneReport, WorkloadTune};
use super::search::{self, Measure, SearchSettings, Space};
use super::space::{self, ArrayFacts};
use super::{Knobs, Sample};
use crate::bench::array::{ArraySpec, LiveArray, EXPORT_NAME};
use crate::bench::generator::{self, DataMode, Limits};
use crate::bench::targets::{self, Access};
use crate::bench::tunables;
use crate::bench::workload::{Phase, Workload};
use crate::bench::{self, MemberSource};
use crate::engine::tuning::TuningValues;
use crate::engine::Engine;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct TuneOptions {
    pub members: MemberSource,
    pub spec: ArraySpec,
    pub workloads: Vec<Workload>,
    /// Each measurement's warm-up and measured time, per phase.
    pub limits: Limits,
    /// For the whole run, shared evenly by the workloads.
    pub budget: Duration,
    /// Rounds of the confirmation (A B per round).
    pub confirm_rounds: usize,
    pub seed: u64,
    pub command: String,
}

/// The phases a workload is judged on: the array's own (not the raw
/// members' reference, nor a phase that sets a knob of its own).
pub fn measured_phases(workload: Workload, stripe_bytes: u64) -> Vec<Phase> {
    workload
        .phases(stripe_bytes)
        .into_iter()
        .filter(|p| !p.raw_only && p.setting.is_none())
        .collect()
}

/// IOPS for small random requests, MB/s for the rest.
pub fn metric(workload: Workload) -> &'static str {
    let random = measured_phases(workload, 1 << 20)
        .iter()
        .all(|p| p.pattern == crate::bench::workload::Pattern::Random);
    if random {
        "IOPS"
    } else {
        "MB/s"
    }
}

/// Measures a workload on the served array with a point's knobs, within a
/// time budget.
struct ArrayMeasure<'a> {
    engine: &'a Engine,
    access: &'a Access,
    paths: &'a [PathBuf],
    phases: Vec<Phase>,
    metric: &'static str,
    limits: Limits,
    seed: u64,
    started: Instant,
    budget: Duration,
    /// Measurements kept for the confirmation, so the search stops early
    /// enough to leave time for it.
    reserve_runs: usize,
    runs: usize,
    progress: &'a indicatif::ProgressBar,
    label: String,
}

impl ArrayMeasure<'_> {
    fn per_run(&self) -> Duration {
        if self.runs == 0 {
            (self.limits.warmup + self.limits.measure) * self.phases.len() as u32
        } else {
            self.started.elapsed() / self.runs as u32
        }
    }

    fn set_knobs(&self, knobs: &Knobs) -> Result<(), String> {
        for (k, v) in knobs {
            tunables::set(self.engine, k, v)?;
        }
        Ok(())
    }

    fn run_phase(&self, phase: &Phase) -> Result<(f64, f64), String> {
        if phase.drop_caches_before {
            self.access.flush()?;
            tunables::drop_engine_caches(self.engine)?;
            targets::drop_file_caches(self.paths)?;
        }
        let data = DataMode {
            verify_salt: None,
            seed: self.seed,
        };
        let outcome = generator::run_phase(self.access, phase, self.limits, data, &|| {})?;
        if phase.op != crate::bench::workload::Op::Read {
            self.access.flush()?;
        }
        let seconds = outcome.seconds.max(1e-9);
        let value = match self.metric {
            "IOPS" => outcome.ops as f64 / seconds,
            _ => outcome.bytes as f64 / seconds / 1e6,
        };
        let p99_us = outcome.latency_ns.value_at_quantile(0.99) as f64 / 1000.0;
        Ok((value, p99_us))
    }
}

impl Measure for ArrayMeasure<'_> {
    fn measure(&mut self, knobs: &Knobs) -> Result<Sample, String> {
        self.set_knobs(knobs)?;
        // A workload of several phases is judged on their geometric mean,
        // so that no phase's units outweigh another's; latency on its worst.
        let mut log_sum = 0.0;
        let mut p99_worst: f64 = 0.0;
        for phase in &self.phases {
            let (value, p99) = self.run_phase(phase)?;
            log_sum += value.max(1e-9).ln();
            p99_worst = p99_worst.max(p99);
        }
        let value = (log_sum / self.phases.len() as f64).exp();
        self.runs += 1;
        let shown: Vec<String> = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.progress.set_position(
            (self.progress.position() + 1).min(self.progress.length().unwrap_or(u64::MAX)),
        );
        say(
            self.progress,
            format!(
                "{}: run {}: {} -> {value:.1} {}",
                self.label,
                self.runs,
                shown.join(" "),
                self.metric
            ),
        );
        Ok(Sample {
            value,
            latency_us_p99: p99_worst,
        })
    }

    fn exhausted(&self) -> bool {
        self.started.elapsed() + self.per_run() * self.reserve_runs as u32 >= self.budget
    }
}

/// Progress: on the bar's line on a terminal; elsewhere (a log, a pipe),
/// where the bar is not drawn, one line per run on stderr.
fn say(progress: &indicatif::ProgressBar, message: String) {
    if progress.is_hidden() {
        eprintln!("tune: {message}");
    } else {
        progress.set_message(message);
    }
}

/// A line that stays, above the bar or on stderr.
fn say_line(progress: &indicatif::ProgressBar, message: String) {
    if progress.is_hidden() {
        eprintln!("tune: {message}");
    } else {
        progress.println(format!("tune: {message}"));
    }
}

fn validate(options: &TuneOptions) -> Result<(), String> {
    if options.workloads.is_empty() {
        return Err("nothing to tune: give at least one workload".into());
    }
    if options.limits.measure.is_zero() {
        return Err("--seconds must be above 0".into());
    }
    if options.budget.is_zero() {
        return Err("--budget must be above 0".into());
    }
    if options.confirm_rounds == 0 {
        return Err("--confirm-rounds must be at least 1".into());
    }
    Ok(())
}

pub fn run(options: &TuneOptions) -> Result<TuneReport, String> {
    validate(options)?;
    let started = Instant::now();
    let (workdir, paths, assume_clean) = bench::prepare_members(&options.members)?;
    let socket = workdir.0.join("uraid.nbd");
    let live =
        LiveArray::create_and_serve(&paths, &options.spec, assume_clean, !assume_clean, &socket)?;
    let result = tune_array(options, &live, &paths, started);
    let stopped = live.stop();
    let mut report = result?;
    stopped?;
    report.members_on = if bench::on_tmpfs(&paths[0]) {
        "tmpfs"
    } else {
        "disk"
    }
    .into();
    report.elapsed_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn tune_array(
    options: &TuneOptions,
    live: &LiveArray,
    paths: &[PathBuf],
    started: Instant,
) -> Result<TuneReport, String> {
    let engine = &*live.engine;
    let access = Access::Nbd {
        socket: live.socket.clone(),
        export: EXPORT_NAME.to_string(),
        size_bytes: engine.size_bytes(),
    };
    let progress = indicatif::ProgressBar::new(0);
    progress.set_style(
        indicatif::ProgressStyle::with_template("tune [{elapsed_precise}] {pos} runs {msg}")
            .expect("valid template"),
    );
    say(&progress, "filling the array before measuring".into());
    // Reads of holes never reach a member: the array is written whole.
    access.prefill(None, options.seed)?;
    access.flush()?;
    let in_force: TuningValues = engine.tuning();
    let facts = ArrayFacts {
        parity: engine.geometry().level().has_parity(),
        journaled: options.spec.journal_bytes.is_some(),
    };
    let mut workloads = Vec::new();
    for (i, &workload) in options.workloads.iter().enumerate() {
        let left = options.workloads.len() - i;
        let budget = options.budget.saturating_sub(started.elapsed()) / left as u32;
        let space = space::space(workload, facts, &in_force);
        let mut measure = ArrayMeasure {
            engine,
            access: &access,
            paths,
            phases: measured_phases(workload, live.stripe_data_bytes()),
            metric: metric(workload),
            limits: options.limits,
            seed: options.seed,
            started: Instant::now(),
            budget,
            reserve_runs: 2 * options.confirm_rounds,
            runs: 0,
            progress: &progress,
            label: workload.name().to_string(),
        };
        let tuned = tune_workload(workload, &space, options.confirm_rounds, &mut measure);
        // The next workload starts from the defaults, whatever this one did.
        let defaults: Knobs = space.default.clone();
        let reset = measure.set_knobs(&defaults);
        let tuned = tuned?;
        reset?;
        say_line(
            &progress,
            format!(
                "{}: {} ({} runs)",
                workload.name(),
                tuned.confirmation.reason,
                tuned.evaluations + 2 * tuned.confirmation.pick_values.len()
            ),
        );
        workloads.push(tuned);
    }
    progress.finish_and_clear();
    let spec = &options.spec;
    Ok(TuneReport {
        date_utc: bench::date_utc(),
        command: options.command.clone(),
        machine: bench::machine(),
        level: spec.level.to_string(),
        devices: paths.len() as u32,
        chunk_bytes: spec.chunk_bytes,
        journal: spec.journal_bytes.is_some(),
        members_on: String::new(),
        seconds_per_run: options.limits.measure.as_secs_f64(),
        warmup_seconds: options.limits.warmup.as_secs_f64(),
        budget_seconds: options.budget.as_secs_f64(),
        elapsed_seconds: 0.0,
        workloads,
    })
}

/// Searches, confirms, and says what was chosen.
fn tune_workload(
    workload: Workload,
    space: &Space,
    confirm_rounds: usize,
    measure: &mut ArrayMeasure,
) -> Result<WorkloadTune, String> {
    let settings = SearchSettings::default();
    let outcome = search::search(space, settings, measure)?;
    let verdict: Verdict = confirm::confirm(
        measure,
        &space.default,
        &outcome.best,
        confirm_rounds,
        outcome.noise,
        settings.latency_guard,
    )?;
    let verdict = if space.knobs.is_empty() {
        Verdict {
            reason: "no knob the tuner knows changes this workload on this array: \
                     the defaults stay"
                .into(),
            ..verdict
        }
    } else {
        verdict
    };
    let default_point = outcome
        .point(&space.default)
        .expect("the defaults are measured");
    let guard = default_point.latency_us_p99() * settings.latency_guard;
    let points: Vec<PointOut> = outcome
        .points
        .iter()
        .map(|p| PointOut {
            knobs: p.knobs.clone(),
            value: p.value(),
            runs: p.samples.len(),
            latency_us_p99: p.latency_us_p99(),
            within_latency_guard: guard <= 0.0 || p.latency_us_p99() <= guard,
        })
        .collect();
    let default = Pick {
        knobs: space.default.clone(),
        value: default_point.value(),
    };
    let chosen = if verdict.confirmed {
        let p = outcome.point(&outcome.best).expect("the pick is measured");
        Pick {
            knobs: p.knobs.clone(),
            value: p.value(),
        }
    } else {
        default.clone()
    };
    Ok(WorkloadTune {
        workload: workload.name().to_string(),
        metric: measure.metric.to_string(),
        knobs: space
            .knobs
            .iter()
            .map(|k| (k.name.to_string(), k.values.clone()))
            .collect(),
        points,
        default,
        search_pick: outcome.best.clone(),
        chosen,
        confirmation: verdict,
        noise: outcome.noise,
        evaluations: outcome.evaluations,
        grid_points: space.grid_points(),
        cut_short: outcome.cut_short,
    })
}
