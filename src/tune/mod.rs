//! `uraid tune`: the auto-tuner. For each of bench's workloads it searches
//! the knobs that matter (`space`) with few measurements (`search`),
//! measures its pick against the defaults again, alternately, and keeps
//! the defaults unless the pick wins beyond the noise (`confirm`). It
//! measures through bench's targets, workloads and generator (`run`), and
//! reports as a table, JSON and an SVG chart (`report`, `chart`).
//! Applying a pick to a served array goes through the control socket's
//! `ApplyTuned`, which saves it with the array's settings and a record of
//! where it came from (`engine::tuning::saved::Tuned`).

pub mod chart;
pub mod confirm;
pub mod report;
pub mod run;
pub mod search;
pub mod space;

use std::collections::BTreeMap;

/// Values of the knobs a point sets, by name (the others stay at their
/// defaults).
pub type Knobs = BTreeMap<String, String>;

/// One measurement of a workload: its metric (higher is better) and its
/// p99 latency, the guard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub value: f64,
    pub latency_us_p99: f64,
}

#[cfg(test)]
mod tests;
