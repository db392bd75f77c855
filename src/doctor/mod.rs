//! `uraid doctor`: the host checks the seeds ran by hand before trusting
//! a box with an array (seed 004: CPU, SIMD, DIMMs in pairs, queue
//! settings, governor), each answered ok / warn / fail / unavailable with
//! the value seen, the reason and a fix. Everything is read from /proc and
//! /sys without root; dmidecode is asked only as root. A check this host
//! cannot answer (no EDAC in a VM, no cpufreq) is "unavailable", never a
//! failure.

mod host;
mod nbd;
mod queue;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Unavailable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Unavailable => "unavailable",
        }
    }
}

/// One answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    pub check: String,
    pub status: Status,
    pub value: String,
    pub reason: String,
    /// What to do about it; empty when nothing is to be done.
    pub fix: String,
}

impl Check {
    fn new(check: impl Into<String>, status: Status, value: impl Into<String>) -> Check {
        Check {
            check: check.into(),
            status,
            value: value.into(),
            reason: String::new(),
            fix: String::new(),
        }
    }

    fn because(mut self, reason: impl Into<String>) -> Check {
        self.reason = reason.into();
        self
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }

    fn unavailable(check: impl Into<String>, reason: impl Into<String>) -> Check {
        Check::new(check, Status::Unavailable, "").because(reason)
    }

    /// One line: `status  check  value  (reason)  fix: ...`.
    pub fn line(&self) -> String {
        let value = if self.value.is_empty() {
            "-"
        } else {
            &self.value
        };
        let mut line = format!("{:<11} {:<28} {value}", self.status.as_str(), self.check);
        if !self.reason.is_empty() {
            line.push_str(&format!("  ({})", self.reason));
        }
        if !self.fix.is_empty() {
            line.push_str(&format!("  fix: {}", self.fix));
        }
        line
    }
}

/// An array whose needs the memory check weighs: its members and its
/// stripe_cache_size.
#[derive(Clone, Debug)]
pub struct ArrayNeed {
    pub name: String,
    pub members: usize,
    pub stripe_cache_size: u32,
}

/// What to check beyond the host itself.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    /// Member devices (or image files) whose queues are checked, and NBD
    /// URIs whose servers are asked.
    pub devices: Vec<PathBuf>,
    /// Arrays served now, or the array the devices would make.
    pub arrays: Vec<ArrayNeed>,
    /// The members of the arrays served here and their state there: an
    /// NBD export among them is not asked again (a server that takes no
    /// more clients while it serves the array would not answer).
    pub served: Vec<(PathBuf, String)>,
}

/// Runs every check, the host's first, then each device's queue.
pub fn run(targets: &Targets) -> Vec<Check> {
    let mut checks = host::checks(&targets.arrays);
    // Every NBD server is asked at once: one that never answers delays
    // the report once, not once per member.
    let probes: Vec<Option<nbd::Probe>> = targets
        .devices
        .iter()
        .map(|d| {
            d.to_str()
                .filter(|_| crate::member::is_uri(d))
                .filter(|_| !targets.served.iter().any(|(p, _)| p == d))
                .map(nbd::Probe::start)
        })
        .collect();
    for (device, probe) in targets.devices.iter().zip(probes) {
        let served = targets.served.iter().find(|(p, _)| p == device);
        match (probe, served, device.to_str()) {
            (Some(probe), _, _) => checks.extend(probe.checks()),
            (None, Some((_, state)), Some(uri)) if crate::member::is_uri(device) => {
                checks.extend(nbd::served_checks(uri, state))
            }
            _ => checks.extend(queue::checks(device)),
        }
    }
    checks
}

/// Whether the checks call for a non-zero exit: some check failed.
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

#[cfg(test)]
mod tests;
