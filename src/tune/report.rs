//! What `uraid tune` reports: the JSON (per workload its metric, every
//! point measured, the defaults and the choice) and the table.

use super::confirm::Verdict;
use super::Knobs;
use crate::bench::Machine;
use serde::Serialize;
use std::fmt::Write;

#[derive(Clone, Debug, Serialize)]
pub struct Pick {
    pub knobs: Knobs,
    pub value: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PointOut {
    pub knobs: Knobs,
    /// The mean of its runs, in the workload's metric.
    pub value: f64,
    pub runs: usize,
    pub latency_us_p99: f64,
    /// Its p99 latency is within the guard against the defaults': only
    /// such a point may be chosen.
    pub within_latency_guard: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadTune {
    pub workload: String,
    /// "IOPS" or "MB/s"; higher is better.
    pub metric: String,
    /// The knobs searched and their candidate values.
    pub knobs: Vec<(String, Vec<String>)>,
    pub points: Vec<PointOut>,
    pub default: Pick,
    /// What the search found best, before it was measured again.
    pub search_pick: Knobs,
    /// The search's pick if it beat the defaults again, else the defaults.
    pub chosen: Pick,
    pub confirmation: Verdict,
    /// The relative noise measured on the defaults' repeats.
    pub noise: f64,
    /// The search's measurements (the confirmation's are not counted).
    pub evaluations: usize,
    /// The points of the full grid of the same candidates.
    pub grid_points: u64,
    /// The budget ran out before the search finished.
    pub cut_short: bool,
}

impl WorkloadTune {
    pub fn chose_defaults(&self) -> bool {
        !self.confirmation.confirmed
    }
}

#[derive(Debug, Serialize)]
pub struct TuneReport {
    pub date_utc: String,
    pub command: String,
    pub machine: Machine,
    pub level: String,
    pub devices: u32,
    pub chunk_bytes: Option<u64>,
    pub journal: bool,
    /// "tmpfs" or "disk".
    pub members_on: String,
    pub seconds_per_run: f64,
    pub warmup_seconds: f64,
    pub budget_seconds: f64,
    pub elapsed_seconds: f64,
    pub workloads: Vec<WorkloadTune>,
}

fn knobs_text(knobs: &Knobs) -> String {
    knobs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The knobs of `chosen` that differ from `default`, or "defaults".
pub fn changes_text(default: &Knobs, chosen: &Knobs) -> String {
    let changed: Knobs = chosen
        .iter()
        .filter(|(k, v)| default.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if changed.is_empty() {
        "defaults".into()
    } else {
        knobs_text(&changed)
    }
}

pub fn table(report: &TuneReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<14} {:>6} {:>12} {:>12} {:>7} {:>7} {:>11}  chosen",
        "workload", "metric", "default", "chosen", "gain", "noise", "runs/grid"
    );
    for w in &report.workloads {
        let gain = if w.default.value > 0.0 {
            w.chosen.value / w.default.value - 1.0
        } else {
            0.0
        };
        let runs = w.evaluations + 2 * w.confirmation.pick_values.len();
        let _ = writeln!(
            o,
            "{:<14} {:>6} {:>12.1} {:>12.1} {:>+6.1}% {:>6.1}% {:>5}/{:<5}  {}",
            w.workload,
            w.metric,
            w.default.value,
            w.chosen.value,
            gain * 100.0,
            w.confirmation.noise * 100.0,
            runs,
            w.grid_points,
            changes_text(&w.default.knobs, &w.chosen.knobs),
        );
    }
    for w in &report.workloads {
        let _ = writeln!(o, "{}: {}", w.workload, w.confirmation.reason);
        if w.chose_defaults() && w.search_pick != w.default.knobs {
            let _ = writeln!(
                o,
                "{}: the search's pick ({}) was not offered; the defaults are kept",
                w.workload,
                changes_text(&w.default.knobs, &w.search_pick)
            );
        }
        if w.cut_short {
            let _ = writeln!(
                o,
                "{}: the budget ran out before the search finished (raise --budget)",
                w.workload
            );
        }
    }
    o
}
