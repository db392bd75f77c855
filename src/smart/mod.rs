//! SMART: what `smartctl -j -H -A -i` says of a member, read into a
//! [`Health`] (pure: `parse`, `compare`), and the poller that `uraid serve`
//! runs over its block-device members (`poller.rs`).
//!
//! md reads no SMART; a hardware controller polls its drives (MegaRAID's
//! PredFailPollInterval, 300 s) and copies a drive predicted to fail onto
//! a spare while it still serves (SMART copyback). uraid does the same
//! with md's replace. What counts as a predicted failure:
//!
//! - smartctl's verdict `smart_status.passed` false, or its exit bits 3
//!   ("DISK FAILING") or 4 (a pre-failure attribute at or below its
//!   threshold now), or an ATA pre-failure attribute failing "now";
//! - NVMe: `critical_warning` not 0, `percentage_used` at 100 or more,
//!   `available_spare` below `available_spare_threshold`;
//! - between two polls, a growing count of reallocated (5), pending (197)
//!   or offline-uncorrectable (198) sectors, reported uncorrectable errors
//!   (187), NVMe media errors, or a SAS grown defect list (smartd's `-C`,
//!   `-U` and Backblaze's attributes). A count above 0 that does not grow
//!   is a warning: the drive's history, not news.
//!
//! Warnings (no replace): exit bits 5-7 (an attribute failed in the past,
//! error-log entries, self-test errors). Exit bits 0-2 (the command line,
//! the device open or a SMART command failed) make the health
//! "unavailable", as does output that is not smartctl's JSON.

mod poller;

pub use poller::{run_smartctl, SmartPoller, SMARTCTL_ENV, SMARTCTL_TIMEOUT};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The verdict on a member, from best to worst (unavailable apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Warning,
    Failing,
    Unavailable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Warning => "warning",
            Status::Failing => "failing",
            Status::Unavailable => "unavailable",
        }
    }
}

/// smartctl's exit status bits (smartctl.8, EXIT STATUS).
const EXIT_BITS: [&str; 8] = [
    "command line did not parse",
    "device open or IDENTIFY failed",
    "a SMART or ATA command failed, or a checksum error",
    "SMART status: DISK FAILING",
    "a pre-failure attribute is at or below its threshold",
    "an attribute was at or below its threshold in the past",
    "the device error log has entries",
    "the self-test log has errors",
];

/// NVMe critical_warning bits (NVMe base specification, SMART / Health log).
const NVME_WARNING_BITS: [&str; 6] = [
    "available spare below threshold",
    "temperature above or below threshold",
    "reliability degraded",
    "media read-only",
    "volatile memory backup failed",
    "persistent memory region unreliable",
];

/// One member's SMART health.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub status: Status,
    /// smartctl's overall verdict, when it gave one.
    pub passed: Option<bool>,
    /// Why the status is what it is, worst first.
    pub reasons: Vec<String>,
    /// ATA 5 Reallocated_Sector_Ct (raw), or SAS's grown defect list.
    pub reallocated: Option<u64>,
    /// ATA 197 Current_Pending_Sector (raw).
    pub pending: Option<u64>,
    /// ATA 198 Offline_Uncorrectable (raw).
    pub offline_uncorrectable: Option<u64>,
    /// ATA 187 Reported_Uncorrect (raw).
    pub reported_uncorrect: Option<u64>,
    /// NVMe critical_warning, and its set bits by name.
    pub critical_warning: Option<u64>,
    pub critical_warnings: Vec<String>,
    pub media_errors: Option<u64>,
    pub percentage_used: Option<u64>,
    pub available_spare: Option<u64>,
    pub available_spare_threshold: Option<u64>,
    /// Degrees Celsius.
    pub temperature: Option<i64>,
    /// smartctl's exit status, and its set bits by name.
    pub exit_status: Option<u8>,
    pub exit_bits: Vec<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
}

impl Health {
    /// A health that could not be read, with the reason.
    pub fn unavailable(reason: impl Into<String>) -> Health {
        Health {
            status: Status::Unavailable,
            passed: None,
            reasons: vec![reason.into()],
            reallocated: None,
            pending: None,
            offline_uncorrectable: None,
            reported_uncorrect: None,
            critical_warning: None,
            critical_warnings: Vec::new(),
            media_errors: None,
            percentage_used: None,
            available_spare: None,
            available_spare_threshold: None,
            temperature: None,
            exit_status: None,
            exit_bits: Vec::new(),
            model: None,
            serial: None,
        }
    }

    /// One short line: the status, then the reasons or the main figures.
    pub fn summary(&self) -> String {
        if !self.reasons.is_empty() {
            return format!("{}: {}", self.status.as_str(), self.reasons.join("; "));
        }
        let mut parts = vec![self.status.as_str().to_string()];
        if let Some(t) = self.temperature {
            parts.push(format!("{t} C"));
        }
        for (name, value) in [
            ("reallocated", self.reallocated),
            ("pending", self.pending),
            ("offline uncorrectable", self.offline_uncorrectable),
            ("media errors", self.media_errors),
        ] {
            if let Some(v) = value {
                parts.push(format!("{name} {v}"));
            }
        }
        if let Some(used) = self.percentage_used {
            parts.push(format!("{used}% used"));
        }
        parts.join(", ")
    }

    /// The counts whose growth predicts a failure, by name.
    fn counters(&self) -> [(&'static str, Option<u64>); 5] {
        [
            ("reallocated sectors", self.reallocated),
            ("pending sectors", self.pending),
            ("offline uncorrectable sectors", self.offline_uncorrectable),
            ("reported uncorrectable errors", self.reported_uncorrect),
            ("media errors", self.media_errors),
        ]
    }

    fn add(&mut self, status: Status, reason: String) {
        if rank(status) > rank(self.status) {
            self.status = status;
        }
        self.reasons.push(reason);
    }
}

fn rank(status: Status) -> u8 {
    match status {
        Status::Passed => 0,
        Status::Unavailable => 1,
        Status::Warning => 2,
        Status::Failing => 3,
    }
}

fn u64_at(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

fn str_at(v: &Value, path: &[&str]) -> Option<String> {
    Some(
        path.iter()
            .try_fold(v, |v, k| v.get(k))?
            .as_str()?
            .to_string(),
    )
}

/// smartctl's own messages, for the reason of an unreadable device.
fn messages(v: &Value) -> String {
    v.pointer("/smartctl/messages")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|m| m.get("string").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

/// Reads smartctl's `-j` output. `process_exit` is its exit code, used
/// when the JSON lacks `smartctl.exit_status`.
pub fn parse(stdout: &[u8], process_exit: Option<i32>) -> Health {
    let v: Value = match serde_json::from_slice(stdout) {
        Ok(v) => v,
        Err(e) => {
            let code = process_exit.map_or(String::new(), |c| format!(" (exit status {c})"));
            return Health::unavailable(format!("smartctl printed no JSON{code}: {e}"));
        }
    };
    if v.get("json_format_version").is_none() && v.get("smartctl").is_none() {
        return Health::unavailable("not smartctl's JSON: no json_format_version or smartctl");
    }
    let mut h = Health::unavailable(String::new());
    h.reasons.clear();
    h.status = Status::Passed;
    let exit = u64_at(&v, &["smartctl", "exit_status"])
        .or(process_exit.and_then(|c| u64::try_from(c).ok()))
        .map(|c| c as u8);
    h.exit_status = exit;
    let exit = exit.unwrap_or(0);
    h.exit_bits = (0..8)
        .filter(|b| exit & (1 << b) != 0)
        .map(|b| format!("{b}: {}", EXIT_BITS[b]))
        .collect();
    h.passed = v.pointer("/smart_status/passed").and_then(Value::as_bool);
    h.model = str_at(&v, &["model_name"]);
    h.serial = str_at(&v, &["serial_number"]);
    h.temperature = v.pointer("/temperature/current").and_then(Value::as_i64);

    if let Some(table) = v
        .pointer("/ata_smart_attributes/table")
        .and_then(Value::as_array)
    {
        for attr in table {
            let raw = u64_at(attr, &["raw", "value"]);
            match u64_at(attr, &["id"]) {
                Some(5) => h.reallocated = raw,
                Some(187) => h.reported_uncorrect = raw,
                Some(197) => h.pending = raw,
                Some(198) => h.offline_uncorrectable = raw,
                _ => {}
            }
            let prefail = attr
                .pointer("/flags/prefailure")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if prefail && attr.get("when_failed").and_then(Value::as_str) == Some("now") {
                let name = str_at(attr, &["name"]).unwrap_or_default();
                h.add(
                    Status::Failing,
                    format!(
                        "pre-failure attribute {} {name} at or below its threshold",
                        u64_at(attr, &["id"]).unwrap_or(0)
                    ),
                );
            }
        }
    }
    if let Some(log) = v.get("nvme_smart_health_information_log") {
        h.critical_warning = u64_at(log, &["critical_warning"]);
        h.media_errors = u64_at(log, &["media_errors"]);
        h.percentage_used = u64_at(log, &["percentage_used"]);
        h.available_spare = u64_at(log, &["available_spare"]);
        h.available_spare_threshold = u64_at(log, &["available_spare_threshold"]);
        if h.temperature.is_none() {
            h.temperature = log.get("temperature").and_then(Value::as_i64);
        }
    }
    if let Some(grown) = u64_at(&v, &["scsi_grown_defect_list"]) {
        h.reallocated.get_or_insert(grown);
    }

    if h.passed == Some(false) {
        h.add(Status::Failing, "smartctl's verdict: FAILED".into());
    }
    for bit in [3, 4] {
        if exit & (1 << bit) != 0 {
            h.add(Status::Failing, format!("smartctl: {}", EXIT_BITS[bit]));
        }
    }
    if let Some(cw) = h.critical_warning.filter(|&cw| cw != 0) {
        h.critical_warnings = (0..NVME_WARNING_BITS.len())
            .filter(|b| cw & (1 << b) != 0)
            .map(|b| NVME_WARNING_BITS[b].to_string())
            .collect();
        h.add(
            Status::Failing,
            format!(
                "NVMe critical warning 0x{cw:02x} ({})",
                h.critical_warnings.join(", ")
            ),
        );
    }
    if let Some(used) = h.percentage_used.filter(|&u| u >= 100) {
        h.add(Status::Failing, format!("NVMe endurance used: {used}%"));
    }
    if let (Some(spare), Some(threshold)) = (h.available_spare, h.available_spare_threshold) {
        if spare < threshold {
            h.add(
                Status::Failing,
                format!("NVMe available spare {spare}% below its threshold {threshold}%"),
            );
        }
    }
    if h.status != Status::Failing && exit & 0b111 != 0 {
        let why = messages(&v);
        let bits: Vec<&str> = (0..3)
            .filter(|b| exit & (1 << b) != 0)
            .map(|b| EXIT_BITS[b])
            .collect();
        let mut reason = format!("smartctl exit status {exit}: {}", bits.join(", "));
        if !why.is_empty() {
            reason.push_str(&format!(" ({why})"));
        }
        return Health {
            status: Status::Unavailable,
            reasons: vec![reason],
            ..h
        };
    }
    for (bit, meaning) in EXIT_BITS.iter().enumerate().skip(5) {
        if exit & (1 << bit) != 0 {
            h.add(Status::Warning, format!("smartctl: {meaning}"));
        }
    }
    if h.passed.is_none() && h.status == Status::Passed {
        return Health {
            status: Status::Unavailable,
            reasons: vec!["smartctl gave no health verdict (smart_status)".into()],
            ..h
        };
    }
    h
}

/// Adds what changed since the last readable poll: a count that grew is a
/// predicted failure; a count above 0 that did not grow is a warning
/// (Backblaze's "investigate").
pub fn compare(previous: Option<&Health>, mut current: Health) -> Health {
    if current.status == Status::Unavailable {
        return current;
    }
    let before = previous.filter(|p| p.status != Status::Unavailable);
    for (i, (name, now)) in current.counters().into_iter().enumerate() {
        let Some(now) = now else { continue };
        match before.and_then(|p| p.counters()[i].1) {
            Some(was) if now > was => {
                current.add(Status::Failing, format!("{name} grew from {was} to {now}"))
            }
            _ if now > 0 => current.add(Status::Warning, format!("{name}: {now}")),
            _ => {}
        }
    }
    current
}

#[cfg(test)]
mod tests;
