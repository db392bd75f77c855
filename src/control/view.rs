//! What status commands show: the array as mdadm --detail describes it and
//! as /proc/mdstat lists it, computed from a [`Snapshot`] — of a running
//! engine, or of a set of members read offline (degraded or failed too).

use crate::array::DeviceState;
use crate::engine::{Snapshot, SnapshotDevice, SyncAction};
use crate::format::{Metadata, MD_FEATURE_BITMAP_OFFSET, MD_FEATURE_RAID0_LAYOUT};
use crate::geometry::{layout_name, Level};
use crate::text::{chunk_text, ctime, human_size_paren};
use std::fmt::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// One row of the device table.
#[derive(serde::Serialize, Debug, Clone)]
pub struct DeviceRow {
    /// The device's slot number (dev_number); None for an empty slot.
    pub number: Option<u32>,
    pub major: u32,
    pub minor: u32,
    /// Its raid role, if it has one.
    pub raid_device: Option<usize>,
    pub state: String,
    pub path: Option<String>,
    /// The member's health as `uraid serve` last polled it (SMART), for
    /// block devices.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub health: Option<crate::engine::MemberHealth>,
    /// Blocks that failed their checksum since the member was opened
    /// (zpool status's CKSUM); absent without `--integrity`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checksum_errors: Option<u64>,
    /// Blocks whose checksum is not known yet, read unverified; absent
    /// without `--integrity`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub untrusted_blocks: Option<u64>,
}

/// Everything mdadm --detail shows, as data.
#[derive(serde::Serialize, Debug, Clone)]
pub struct DetailView {
    pub version: String,
    pub creation_time: u64,
    pub raid_level: String,
    pub array_size_kib: u64,
    pub used_dev_size_kib: Option<u64>,
    pub raid_devices: u32,
    pub total_devices: usize,
    pub update_time: u64,
    pub state: String,
    pub active_devices: usize,
    pub working_devices: usize,
    pub failed_devices: usize,
    pub spare_devices: usize,
    pub layout: Option<String>,
    pub chunk_kib: u32,
    pub consistency_policy: String,
    pub name: String,
    pub uuid: String,
    pub events: u64,
    pub bitmap: bool,
    /// "Resync Status : N% complete" and friends, while one runs.
    pub sync_status: Option<String>,
    /// The running job's rate and why it is what it is (speed limits,
    /// the clients' latency against rebuild_latency_target, idle).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sync_pace: Option<String>,
    /// A rebuild taking the rows at zero redundancy first: what it has
    /// done of them.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rebuild_order: Option<String>,
    /// The same as data: the rate allowed (KiB/s per member), why, and
    /// the clients' p99 against the latency target.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pace: Option<crate::engine::PaceReport>,
    /// The time at zero redundancy (one more failure would lose data),
    /// now and in all since the server started; absent if none.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub zero_redundancy: Option<crate::engine::exposure::ExposureReport>,
    pub devices: Vec<DeviceRow>,
    /// A reshape in progress, as mdadm --detail shows it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reshape: Option<ReshapeDetail>,
    /// The knobs in force on a served array (stripe_cache_size, ...).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty", default)]
    pub tuning: std::collections::BTreeMap<String, String>,
    /// The knobs are those a server would start with (md's defaults and
    /// the settings saved with the array), not values in force: detail of
    /// an array that is not served.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub tuning_saved: bool,
    /// The knobs `uraid tune --apply` chose, for which workload and when
    /// (from the settings saved with the array).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tuned: Option<crate::engine::tuning::saved::Tuned>,
    /// The parity implementation a served raid4/5/6 computes with, and
    /// how it was chosen (md prints its choice in the kernel log).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parity: Option<String>,
    /// Faults injected into members and in force (serve --fault-injection),
    /// by member path, in `uraid manage --inject`'s syntax.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty", default)]
    pub injected_faults: std::collections::BTreeMap<String, Vec<String>>,
    /// Why each failed member failed, by path (a reason beginning with
    /// "timeout" when it stopped answering), while it stays failed.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty", default)]
    pub member_failures: std::collections::BTreeMap<String, String>,
    /// The checksum scheme the members keep (`create --integrity`), when
    /// they keep one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub integrity: Option<String>,
}

impl DetailView {
    /// " (tuned)" after a knob whose value in force is the one the tuner set.
    fn tuned_mark(&self, key: &str, value: &str) -> &'static str {
        let tuned = self
            .tuned
            .as_ref()
            .is_some_and(|t| t.knobs.iter().any(|(k, v)| k == key && v == value));
        if tuned {
            " (tuned)"
        } else {
            ""
        }
    }
}

/// mdadm --detail's lines for a reshape in progress.
#[derive(serde::Serialize, Debug, Clone)]
pub struct ReshapeDetail {
    /// Per-member progress, as /proc/mdstat's reshape line counts it.
    pub percent_complete: u64,
    pub position_sectors: u64,
    pub delta_devices: i32,
    pub old_raid_devices: u32,
    pub new_level: Option<String>,
    pub new_layout: Option<String>,
    pub new_chunk_kib: Option<u32>,
}

impl ReshapeDetail {
    fn new(sb: &crate::format::MemberSuper, level: Level) -> Option<ReshapeDetail> {
        if !sb.has_feature(crate::format::MD_FEATURE_RESHAPE_ACTIVE) {
            return None;
        }
        let new_level = Level::from_md_number(sb.new_level);
        let new_disks = sb.raid_disks;
        let new_data_disks = new_level
            .map(|l| new_disks as u64 - l.parity_members() as u64)
            .unwrap_or(1)
            .max(1);
        // md counts progress in member sectors: forward from the start,
        // backward from the end.
        let per_member = sb.reshape_position_sectors / new_data_disks;
        let size = sb.size_sectors.max(1);
        let done = if crate::array::reshape_backwards(sb) {
            size.saturating_sub(per_member)
        } else {
            per_member.min(size)
        };
        let level_changes = new_level != Some(level);
        Some(ReshapeDetail {
            percent_complete: done * 100 / size,
            position_sectors: sb.reshape_position_sectors,
            delta_devices: sb.delta_disks,
            old_raid_devices: (i64::from(sb.raid_disks) - i64::from(sb.delta_disks)) as u32,
            new_level: level_changes
                .then(|| new_level.map_or_else(|| "-unknown-".into(), |l| l.to_string())),
            new_layout: (level_changes || sb.new_layout != sb.layout)
                .then(|| new_level.and_then(|l| layout_name(l, sb.new_layout)))
                .flatten(),
            new_chunk_kib: (sb.new_chunk_sectors != sb.chunk_sectors)
                .then_some(sb.new_chunk_sectors / 2),
        })
    }

    fn text(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "    Reshape Status : {}% complete",
            self.percent_complete
        );
        if self.delta_devices != 0 {
            let _ = writeln!(
                o,
                "     Delta Devices : {}, ({}->{})",
                self.delta_devices,
                self.old_raid_devices,
                i64::from(self.old_raid_devices) + i64::from(self.delta_devices)
            );
        }
        if let Some(level) = &self.new_level {
            let _ = writeln!(o, "         New Level : {level}");
        }
        if let Some(layout) = &self.new_layout {
            let _ = writeln!(o, "        New Layout : {layout}");
        }
        if let Some(chunk) = self.new_chunk_kib {
            let _ = writeln!(o, "     New Chunksize : {chunk}K");
        }
        let _ = writeln!(o);
    }
}

fn device_numbers(path: &str) -> (u32, u32) {
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => (libc::major(m.rdev()), libc::minor(m.rdev())),
        _ => (0, 0),
    }
}

impl DetailView {
    pub fn from_snapshot(array: &Snapshot) -> DetailView {
        let sb = &array.sb;
        let level = array.level;
        let counts = DeviceCounts::of(array);
        let reshape = ReshapeDetail::new(sb, level);
        let bitmap = sb.feature_map & MD_FEATURE_BITMAP_OFFSET != 0;
        DetailView {
            version: if sb.metadata == Metadata::V0_90 {
                "0.90".into()
            } else {
                sb.metadata.as_str().into()
            },
            creation_time: sb.ctime_secs,
            raid_level: level.to_string(),
            array_size_kib: array.array_sectors / 2,
            used_dev_size_kib: (sb.level >= 1).then_some(sb.size_sectors / 2),
            raid_devices: sb.raid_disks,
            total_devices: array.devices.len(),
            update_time: sb.utime_secs,
            state: state_text(array, counts.active, reshape.is_some()),
            active_devices: counts.active,
            working_devices: counts.active + counts.spares,
            failed_devices: counts.failed,
            spare_devices: counts.spares,
            layout: detail_layout(array),
            chunk_kib: sb.chunk_sectors / 2,
            consistency_policy: consistency_policy(array, bitmap).into(),
            name: sb.set_name.clone(),
            uuid: sb.uuid_string(),
            events: sb.events,
            bitmap,
            sync_status: sync_status(array),
            sync_pace: array.sync.as_ref().and_then(pace_line),
            rebuild_order: array.sync.as_ref().and_then(order_line),
            pace: array.sync.as_ref().and_then(|p| p.pace),
            zero_redundancy: array.zero_redundancy,
            devices: device_rows(array),
            reshape,
            tuning: array.tuning.iter().cloned().collect(),
            tuning_saved: false,
            tuned: None,
            injected_faults: array.injected_faults.iter().cloned().collect(),
            member_failures: array.member_failures.iter().cloned().collect(),
            parity: parity_choice(array),
            integrity: integrity_scheme(array),
        }
    }

    /// The text of mdadm --detail (without the leading "/dev/mdX:" line),
    /// then what uraid adds after it.
    pub fn text(&self, homehost: &str) -> String {
        let mut o = String::new();
        self.mdadm_header(&mut o);
        self.mdadm_identity(&mut o, homehost);
        self.mdadm_devices(&mut o);
        self.uraid_tuning(&mut o);
        self.uraid_members(&mut o);
        o
    }

    /// mdadm's lines from Version to the job's progress.
    fn mdadm_header(&self, o: &mut String) {
        let _ = writeln!(o, "           Version : {}", self.version);
        let _ = writeln!(o, "     Creation Time : {}", ctime(self.creation_time));
        let _ = writeln!(o, "        Raid Level : {}", self.raid_level);
        let _ = writeln!(
            o,
            "        Array Size : {}{}",
            self.array_size_kib,
            human_size_paren(self.array_size_kib << 10)
        );
        if let Some(used) = self.used_dev_size_kib {
            let _ = writeln!(
                o,
                "     Used Dev Size : {}{}",
                used,
                human_size_paren(used << 10)
            );
        }
        let _ = writeln!(o, "      Raid Devices : {}", self.raid_devices);
        let _ = writeln!(o, "     Total Devices : {}", self.total_devices);
        let _ = writeln!(o, "       Persistence : Superblock is persistent");
        let _ = writeln!(o);
        if self.bitmap {
            let _ = writeln!(o, "     Intent Bitmap : Internal");
            let _ = writeln!(o);
        }
        let _ = writeln!(o, "       Update Time : {}", ctime(self.update_time));
        let _ = writeln!(o, "             State : {} ", self.state);
        let _ = writeln!(o, "    Active Devices : {}", self.active_devices);
        let _ = writeln!(o, "   Working Devices : {}", self.working_devices);
        let _ = writeln!(o, "    Failed Devices : {}", self.failed_devices);
        let _ = writeln!(o, "     Spare Devices : {}", self.spare_devices);
        let _ = writeln!(o);
        if let Some(layout) = &self.layout {
            let _ = writeln!(o, "            Layout : {layout}");
        }
        match self.raid_level.as_str() {
            "raid0" | "raid4" | "raid5" | "raid6" | "raid10" => {
                let _ = writeln!(
                    o,
                    "        Chunk Size : {}\n",
                    chunk_text(self.chunk_kib * 2)
                );
            }
            "linear" => {
                let _ = writeln!(
                    o,
                    "          Rounding : {}\n",
                    chunk_text(self.chunk_kib * 2)
                );
            }
            _ => {}
        }
        let _ = writeln!(o, "Consistency Policy : {}", self.consistency_policy);
        if let Some(scheme) = &self.integrity {
            let _ = writeln!(o, "         Integrity : {scheme}");
        }
        let _ = writeln!(o);
        if let Some(status) = &self.sync_status {
            let _ = writeln!(o, "     {status}");
        }
        if let Some(reshape) = &self.reshape {
            reshape.text(o);
        }
        if let Some(pace) = &self.sync_pace {
            let _ = writeln!(o, "              Pace : {pace}");
        }
        if let Some(order) = &self.rebuild_order {
            let _ = writeln!(o, "     Rebuild Order : {order}");
        }
        if let Some(z) = &self.zero_redundancy {
            let _ = writeln!(o, "   Zero Redundancy : {}", zero_redundancy_words(z));
        }
        if self.sync_status.is_some()
            || self.reshape.is_some()
            || self.sync_pace.is_some()
            || self.zero_redundancy.is_some()
        {
            let _ = writeln!(o);
        }
    }

    /// Name (local to this host or not), UUID and events.
    fn mdadm_identity(&self, o: &mut String, homehost: &str) {
        let local = self
            .name
            .strip_prefix(homehost)
            .is_some_and(|rest| rest.starts_with(':'))
            && !homehost.is_empty();
        let _ = writeln!(
            o,
            "              Name : {}{}",
            self.name,
            if local {
                format!("  (local to host {homehost})")
            } else {
                String::new()
            }
        );
        let _ = writeln!(o, "              UUID : {}", self.uuid);
        let _ = writeln!(o, "            Events : {}\n", self.events);
    }

    /// The device table, spares and faulty members after the roles.
    fn mdadm_devices(&self, o: &mut String) {
        let _ = writeln!(o, "    Number   Major   Minor   RaidDevice State");
        for (i, row) in self.devices.iter().enumerate() {
            if i == self.raid_devices as usize {
                let _ = writeln!(o);
            }
            let number = row
                .number
                .map(|n| format!("{n:5}"))
                .unwrap_or_else(|| "    -".into());
            let raid_device = row
                .raid_device
                .map(|r| format!("{r:5}"))
                .unwrap_or_else(|| "    -".into());
            let _ = writeln!(
                o,
                "   {number}   {:5}    {:5}    {raid_device}      {}{}",
                row.major,
                row.minor,
                row.state,
                row.path
                    .as_deref()
                    .map(|p| format!("   {p}"))
                    .unwrap_or_default()
            );
        }
    }

    /// The knobs, as md keeps them in sysfs and a controller per virtual disk.
    fn uraid_tuning(&self, o: &mut String) {
        // After mdadm's part, which stays as mdadm prints it: the knobs that
        // md keeps in sysfs and a controller shows per virtual disk.
        if !self.tuning.is_empty() {
            let heading = if self.tuning_saved {
                "Tuning (uraid, saved; applied when served)"
            } else {
                "Tuning (uraid)"
            };
            let _ = writeln!(o, "\n    {heading}:");
            for (key, _) in crate::engine::tuning::KNOBS {
                if let Some(value) = self.tuning.get(*key) {
                    let _ = writeln!(o, "{key:>22} : {value}{}", self.tuned_mark(key, value));
                }
            }
            if let Some(t) = &self.tuned {
                let verdict = if t.confirmed {
                    format!(
                        "{:.0} {} against {:.0} with the defaults",
                        t.value, t.metric, t.default_value
                    )
                } else {
                    "the defaults kept: nothing beat them beyond the noise".to_string()
                };
                let _ = writeln!(
                    o,
                    "{:>22} : uraid tune for {}, {} ({verdict})",
                    "tuned", t.workload, t.when_utc
                );
            }
            if let Some(parity) = &self.parity {
                let _ = writeln!(o, "{:>22} : {parity}", "parity");
            }
        }
    }

    /// Members' checksum errors, SMART health, why members failed, and
    /// injected faults.
    fn uraid_members(&self, o: &mut String) {
        self.uraid_checksums(o);
        let health: Vec<(&str, &crate::engine::MemberHealth)> = self
            .devices
            .iter()
            .filter_map(|r| Some((r.path.as_deref()?, r.health.as_ref()?)))
            .collect();
        if !health.is_empty() {
            let _ = writeln!(o, "\n    Member health (uraid, SMART):");
            for (path, h) in health {
                let _ = writeln!(o, "{path:>22} : {}", h.summary);
            }
        }
        if !self.member_failures.is_empty() {
            let _ = writeln!(o, "\n    Member failures (uraid):");
            for (path, reason) in &self.member_failures {
                let _ = writeln!(o, "{path:>22} : {reason}");
            }
        }
        if !self.injected_faults.is_empty() {
            let _ = writeln!(o, "\n    Injected faults (uraid):");
            for (path, faults) in &self.injected_faults {
                let _ = writeln!(o, "{path:>22} : {}", faults.join(", "));
            }
        }
    }

    /// Each member's checksum errors (zpool status's CKSUM), zero
    /// included, so that a member is seen to be checked; and its blocks
    /// read unverified while their checksums are not known.
    fn uraid_checksums(&self, o: &mut String) {
        let Some(scheme) = &self.integrity else {
            return;
        };
        let counts: Vec<(&str, u64, u64)> = self
            .devices
            .iter()
            .filter_map(|r| {
                let errors = r.checksum_errors?;
                Some((r.path.as_deref()?, errors, r.untrusted_blocks.unwrap_or(0)))
            })
            .collect();
        if counts.is_empty() {
            return;
        }
        let _ = writeln!(o, "\n    Checksum errors (uraid, {scheme}):");
        for (path, errors, untrusted) in counts {
            let untrusted = if untrusted > 0 {
                format!(", {untrusted} blocks untrusted")
            } else {
                String::new()
            };
            let _ = writeln!(o, "{path:>22} : {errors}{untrusted}");
        }
    }
}

/// The checksum scheme of an array whose members keep checksums; the
/// engine counts checksum errors only for those.
fn integrity_scheme(array: &Snapshot) -> Option<String> {
    array
        .devices
        .iter()
        .any(|d| d.checksum_errors.is_some())
        .then(|| crate::array::integrity::INTEGRITY_SCHEME.to_string())
}

/// The device counts mdadm --detail prints (Active, Failed, Spare).
struct DeviceCounts {
    active: usize,
    failed: usize,
    /// Spares and the devices being rebuilt into a role: md counts both
    /// as spares until the rebuild ends.
    spares: usize,
}

impl DeviceCounts {
    fn of(array: &Snapshot) -> DeviceCounts {
        let active = array.sb.raid_disks as usize - array.missing_roles.len();
        let failed = array
            .devices
            .iter()
            .filter(|d| matches!(d.state, DeviceState::Faulty))
            .count();
        let spares = array
            .devices
            .iter()
            .filter(|d| {
                matches!(
                    d.state,
                    DeviceState::Spare
                        | DeviceState::Recovering { .. }
                        | DeviceState::Replacement { .. }
                )
            })
            .count();
        DeviceCounts {
            active,
            failed,
            spares,
        }
    }
}

/// mdadm's "State :" words: clean or active, then degraded or FAILED,
/// then the job running ("clean, degraded, recovering").
fn state_text(array: &Snapshot, active: usize, reshaping: bool) -> String {
    let condition = if active == array.sb.raid_disks as usize {
        ""
    } else if !array.runnable {
        ", FAILED"
    } else {
        ", degraded"
    };
    // A served array is active (dirty) on disk; md shows "clean" for an
    // idle array and "active" while it writes. uraid shows the on-disk truth.
    let clean = if array.sb.is_clean() {
        "clean"
    } else {
        "active"
    };
    let sync_suffix = match array.sync.as_ref().map(|p| p.action) {
        Some(SyncAction::Recovery { .. } | SyncAction::Replace { .. }) => ", recovering",
        Some(SyncAction::Resync) => ", resyncing",
        Some(SyncAction::Check | SyncAction::Repair) => ", checking",
        Some(SyncAction::Reshape) => ", reshaping",
        // A reshape the superblock records shows even when no job
        // reports one.
        None if reshaping => ", reshaping",
        None => "",
    };
    format!("{clean}{condition}{sync_suffix}")
}

/// The layout line, for the levels where mdadm prints one (raid0 only
/// when its superblock records a multi-zone layout).
fn detail_layout(array: &Snapshot) -> Option<String> {
    let (level, sb) = (array.level, &array.sb);
    match level {
        Level::Raid0 if sb.feature_map & MD_FEATURE_RAID0_LAYOUT != 0 => {
            layout_name(level, sb.layout)
        }
        Level::Raid5 | Level::Raid6 | Level::Raid10 => layout_name(level, sb.layout),
        Level::Draid1 | Level::Draid2 | Level::Draid3 => layout_name(level, sb.layout),
        _ => None,
    }
}

/// md's consistency_policy: what keeps the redundancy right after a
/// crash (nothing for levels without any).
fn consistency_policy(array: &Snapshot, bitmap: bool) -> &'static str {
    let level = array.level;
    if !level.has_parity() && matches!(level, Level::Raid0 | Level::Linear) {
        "none"
    } else if bitmap {
        "bitmap"
    } else if crate::array::has_journal_feature(&array.sb) {
        "journal"
    } else {
        "resync"
    }
}

/// "Rebuild Status : N% complete" and friends while a job runs; a
/// reshape's status is in its own block (ReshapeDetail).
fn sync_status(array: &Snapshot) -> Option<String> {
    let p = array
        .sync
        .as_ref()
        .filter(|p| p.action != SyncAction::Reshape)?;
    let word = match p.action {
        SyncAction::Recovery { .. } | SyncAction::Replace { .. } => "Rebuild",
        SyncAction::Resync => "Resync",
        SyncAction::Check | SyncAction::Repair => "Check",
        SyncAction::Reshape => "Reshape",
    };
    Some(format!(
        "{word:>7} Status : {}% complete",
        p.done_kib * 100 / p.total_kib.max(1)
    ))
}

/// "for 12.0 s now (one more failure loses data); 40.5 s in all".
fn zero_redundancy_words(z: &crate::engine::exposure::ExposureReport) -> String {
    match z.now_secs {
        Some(now) => format!(
            "for {now:.1} s now (one more failure loses data); {:.1} s in all",
            z.total_secs
        ),
        None => format!("none now; {:.1} s in all", z.total_secs),
    }
}

/// "45000K/sec per member: clients within the latency target (p99 1.8 ms,
/// target 2 ms)": the rate a running job is held to and why, for a
/// served array.
pub fn pace_line(p: &crate::engine::SyncProgress) -> Option<String> {
    let pace = p.pace?;
    let ms = |us: u64| crate::engine::tuning::latency_target_words(us.min(u32::MAX as u64) as u32);
    let rate = match pace.rate_kib_per_s {
        0 => format!("{}K/sec per member", p.speed_kib_per_s),
        r => format!("{r}K/sec per member allowed"),
    };
    let latency = match (pace.client_p99_us, pace.target_us) {
        (Some(p99), Some(target)) => format!(" (p99 {} ms, target {} ms)", ms(p99), ms(target)),
        (None, Some(target)) => format!(" (target {} ms)", ms(target)),
        _ => String::new(),
    };
    Some(format!("{rate}: {}{latency}", pace.why.words()))
}

/// "rows at zero redundancy first: 412 rebuilt, under way": a rebuild
/// that takes its most endangered rows before the rest.
pub fn order_line(p: &crate::engine::SyncProgress) -> Option<String> {
    let first = p.endangered_first?;
    let state = if first.walking {
        "under way; the position waits for them"
    } else {
        "done; the rest in order"
    };
    Some(format!(
        "rows at zero redundancy first: {} rebuilt ahead, {state}",
        first.rows_done
    ))
}

/// The parity implementation and how it was chosen; only the serving
/// process knows what it runs.
fn parity_choice(array: &Snapshot) -> Option<String> {
    (array.serving && array.level.has_parity()).then(|| {
        let how = if std::env::var_os(crate::parity::ENV_VAR).is_some() {
            "forced by URAID_PARITY"
        } else {
            "the fastest in a start-up benchmark; URAID_PARITY overrides"
        };
        format!("{} ({how})", crate::parity::default_impl().name())
    })
}

/// The device table: one row per role in role order (its holder, or
/// "removed"), then the devices that hold no role, each with its health.
fn device_rows(array: &Snapshot) -> Vec<DeviceRow> {
    let raid_disks = array.sb.raid_disks as usize;
    let mut rows: Vec<DeviceRow> = (0..raid_disks).map(|role| role_row(array, role)).collect();
    rows.extend(array.devices.iter().filter_map(|d| roleless_row(array, d)));
    // text() ends the role rows at raid_devices: they must come first.
    assert!(
        rows.iter()
            .take(raid_disks)
            .enumerate()
            .all(|(role, row)| row.raid_device == Some(role)),
        "the device table does not start with its {raid_disks} roles in order"
    );
    for row in rows.iter_mut() {
        row.health = array
            .member_health
            .iter()
            .find(|(p, _)| Some(p) == row.path.as_ref())
            .map(|(_, h)| h.clone());
    }
    rows
}

/// The row of one role: the active device holding it, or "removed".
fn role_row(array: &Snapshot, role: usize) -> DeviceRow {
    let holder = array.devices.iter().find(|d| match d.state {
        DeviceState::Active { role: r } => r == role,
        _ => false,
    });
    let Some(d) = holder else {
        return DeviceRow {
            number: None,
            major: 0,
            minor: 0,
            raid_device: Some(role),
            state: "removed".into(),
            path: None,
            health: None,
            checksum_errors: None,
            untrusted_blocks: None,
        };
    };
    let (major, minor) = device_numbers(&d.path);
    let mut state = "active sync".to_string();
    let sb = &array.sb;
    if let Some(set) = raid10_set(array.level, sb.layout, sb.raid_disks as usize, role) {
        state.push_str(&format!(" set-{set}"));
    }
    DeviceRow {
        number: Some(d.dev_number),
        major,
        minor,
        raid_device: Some(role),
        state,
        path: Some(d.path.clone()),
        health: None,
        checksum_errors: d.checksum_errors,
        untrusted_blocks: d.untrusted_blocks,
    }
}

/// The row of a device that is not active in a role (spare, journal,
/// rebuilding, faulty); None for an active one, which has its role's row.
fn roleless_row(array: &Snapshot, d: &SnapshotDevice) -> Option<DeviceRow> {
    let (raid_device, state) = match &d.state {
        DeviceState::Active { .. } => return None,
        DeviceState::Spare => (None, "spare".to_string()),
        // mdadm --detail: "-  journal  /dev/sdX".
        DeviceState::Journal => (None, "journal".to_string()),
        // mdadm --detail shows a replacement as a spare being
        // rebuilt into the role its original still holds.
        DeviceState::Recovering { role, .. } | DeviceState::Replacement { role, .. } => {
            (Some(*role), "spare rebuilding".to_string())
        }
        DeviceState::Faulty => (None, "faulty".to_string()),
        DeviceState::Stale { events } => (
            None,
            format!("faulty (stale: events {events} < {})", array.sb.events),
        ),
        DeviceState::Duplicate { role } => (None, format!("faulty (duplicate of role {role})")),
    };
    let (major, minor) = device_numbers(&d.path);
    Some(DeviceRow {
        number: Some(d.dev_number),
        major,
        minor,
        raid_device,
        state,
        path: Some(d.path.clone()),
        health: None,
        checksum_errors: d.checksum_errors,
        untrusted_blocks: d.untrusted_blocks,
    })
}

/// mdadm shows near-only raid10 members in sets (A, B, ...) when the
/// members divide evenly into copies.
fn raid10_set(level: Level, layout: u32, raid_disks: usize, role: usize) -> Option<char> {
    if level != Level::Raid10 || layout & !0x1ffff != 0 {
        return None;
    }
    let near = (layout & 0xff) as usize;
    let far = ((layout >> 8) & 0xff) as usize;
    let copies = near * far;
    (far == 1 && copies > 0 && raid_disks.is_multiple_of(copies) && copies <= 26)
        .then(|| (b'A' + (role % copies) as u8) as char)
}

/// The short name /proc/mdstat shows for an array: the name part of
/// "homehost:name", as mdadm names /dev/md/<name>.
pub fn array_label(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

/// One array's block of /proc/mdstat.
pub fn mdstat_block(array: &Snapshot) -> String {
    let sb = &array.sb;
    let level = array.level;
    let raid_disks = sb.raid_disks as usize;
    let mut o = String::new();
    let mut members: Vec<String> = Vec::new();
    for d in &array.devices {
        let base = crate::member::short_name(&d.path);
        let suffix = match d.state {
            DeviceState::Active { .. } => "",
            DeviceState::Faulty | DeviceState::Stale { .. } | DeviceState::Duplicate { .. } => {
                "(F)"
            }
            // md flags a spare; a member being rebuilt has its slot already.
            DeviceState::Recovering { .. } => "",
            DeviceState::Spare => "(S)",
            // /proc/mdstat marks a replacement "(R)".
            DeviceState::Replacement { .. } => "(R)",
            // /proc/mdstat marks the journal device "(J)".
            DeviceState::Journal => "(J)",
        };
        members.push(format!("{base}[{}]{suffix}", d.dev_number));
    }
    let read_only = if array.read_only { " (read-only)" } else { "" };
    let _ = writeln!(
        o,
        "{} : active{read_only} {} {}",
        array_label(&sb.set_name),
        level,
        members.join(" ")
    );
    let up: String = (0..raid_disks)
        .map(|r| {
            if array.missing_roles.contains(&r) {
                '_'
            } else {
                'U'
            }
        })
        .collect();
    let working = raid_disks - array.missing_roles.len();
    let chunk_k = sb.chunk_sectors / 2;
    let version = if sb.metadata == Metadata::V0_90 {
        String::new()
    } else {
        format!(" super {}", sb.metadata.as_str())
    };
    let personality = match level {
        Level::Linear => format!(" {chunk_k}k rounding"),
        Level::Raid0 => format!(" {chunk_k}k chunks"),
        Level::Raid1 => format!(" [{raid_disks}/{working}] [{up}]"),
        Level::Raid4 | Level::Raid5 | Level::Raid6 => format!(
            " level {}, {chunk_k}k chunk, algorithm {} [{raid_disks}/{working}] [{up}]",
            level.md_number(),
            sb.layout
        ),
        Level::Draid1 | Level::Draid2 | Level::Draid3 => format!(
            " {level} {}d:{}s, {chunk_k}k chunk [{raid_disks}/{working}] [{up}]",
            sb.layout & 0xff,
            (sb.layout >> 8) & 0xff
        ),
        Level::Raid10 => {
            let near = sb.layout & 0xff;
            let far = (sb.layout >> 8) & 0xff;
            let mut t = format!(" {chunk_k}K chunks");
            if near > 1 {
                t.push_str(&format!(" {near} near-copies"));
            }
            if far > 1 {
                let kind = if sb.layout & 0x10000 != 0 {
                    "offset"
                } else {
                    "far"
                };
                t.push_str(&format!(" {far} {kind}-copies"));
            }
            format!("{t} [{raid_disks}/{working}] [{up}]")
        }
    };
    let _ = writeln!(
        o,
        "      {} blocks{version}{personality}",
        array.array_sectors / 2
    );
    if let Some(p) = &array.sync {
        let per_mille = p.done_kib * 1000 / p.total_kib.max(1);
        let filled = (per_mille / 50) as usize;
        let bar: String = "=".repeat(filled) + ">" + &".".repeat(20 - filled.min(20));
        let remaining_kib = p.total_kib.saturating_sub(p.done_kib);
        let finish_s = remaining_kib.checked_div(p.speed_kib_per_s).unwrap_or(0);
        let _ = writeln!(
            o,
            "      [{bar}]  {} ={:3}.{}% ({}/{}) finish={}.{}min speed={}K/sec",
            p.action.word(),
            per_mille / 10,
            per_mille % 10,
            p.done_kib,
            p.total_kib,
            finish_s / 60,
            (finish_s % 60) / 6,
            p.speed_kib_per_s
        );
    }
    if let Some(line) = &array.bitmap_line {
        let _ = writeln!(o, "      {line}");
    }
    let _ = writeln!(o, "      ");
    o
}

#[cfg(test)]
mod tests {
    use super::DetailView;

    /// The pace line says the rate, why, and the latency against the target.
    #[test]
    fn the_pace_line_says_the_rate_why_and_the_latency() {
        use crate::engine::{PaceReport, PaceWhy, SyncAction, SyncProgress};
        let progress = |pace| SyncProgress {
            action: SyncAction::Recovery { role: 1 },
            done_kib: 10,
            total_kib: 100,
            speed_kib_per_s: 900,
            mismatch_sectors: 0,
            pace,
            endangered_first: None,
        };
        let line = super::pace_line(&progress(Some(PaceReport {
            rate_kib_per_s: 40_000,
            why: PaceWhy::OverTarget,
            client_p99_us: Some(2_500),
            target_us: Some(2_000),
        })))
        .unwrap();
        assert_eq!(
            line,
            "40000K/sec per member allowed: backing off: clients over the latency target \
             (p99 2.5 ms, target 2 ms)"
        );
        let line = super::pace_line(&progress(Some(PaceReport {
            rate_kib_per_s: 1_000,
            why: PaceWhy::YieldingToClients,
            client_p99_us: None,
            target_us: None,
        })))
        .unwrap();
        assert!(line.contains("md's rule"), "{line}");
        assert_eq!(super::pace_line(&progress(None)), None);
    }
    use crate::array::{assemble, create, CreateOptions, MemberSpec};
    use crate::engine::Snapshot;
    use crate::format::Metadata;
    use crate::geometry::Level;
    use std::path::{Path, PathBuf};

    /// A raid5 of three 6 MiB member files, with checksums or without,
    /// as `detail` reads it from the members.
    fn raid5(dir: &Path, integrity: bool) -> Snapshot {
        let paths: Vec<PathBuf> = (0..3)
            .map(|i| {
                let p = dir.join(format!("m{i}"));
                std::fs::File::create(&p).unwrap().set_len(6 << 20).unwrap();
                p
            })
            .collect();
        let options = CreateOptions {
            level: Level::Raid5,
            raid_disks: 3,
            chunk_bytes: Some(64 << 10),
            layout: None,
            metadata: Metadata::V1_2,
            assume_clean: true,
            name: "data".into(),
            size_sectors: None,
            force: false,
            homehost: None,
            integrity,
        };
        let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
        create(&specs, &options, |_, _| {}).unwrap();
        Snapshot::from_assembled(&assemble(&paths, false).unwrap())
    }

    #[test]
    fn checksum_errors_show_in_the_array_and_per_member() {
        let dir = tempfile::tempdir().unwrap();
        let mut snapshot = raid5(dir.path(), true);
        assert!(snapshot
            .devices
            .iter()
            .all(|d| d.checksum_errors == Some(0)));
        snapshot.devices[1].checksum_errors = Some(2);
        snapshot.devices[2].untrusted_blocks = Some(1536);
        let view = DetailView::from_snapshot(&snapshot);
        let text = view.text("");
        assert!(
            text.contains("Consistency Policy : resync\n         Integrity : crc32c\n\n"),
            "{text}"
        );
        let path = |i: usize| &snapshot.devices[i].path;
        let block = format!(
            "\n    Checksum errors (uraid, crc32c):\n{:>22} : 0\n{:>22} : 2\n{:>22} : 0, 1536 blocks untrusted\n",
            path(0),
            path(1),
            path(2)
        );
        assert!(text.ends_with(&block), "{text}");
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["integrity"], "crc32c");
        let row = json["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["path"] == path(1).as_str())
            .unwrap();
        assert_eq!(row["checksum_errors"], 2);
        assert_eq!(row["untrusted_blocks"], 0);
    }

    #[test]
    fn without_integrity_detail_is_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let mut snapshot = raid5(dir.path(), false);
        assert!(snapshot.devices.iter().all(|d| d.checksum_errors.is_none()));
        let view = DetailView::from_snapshot(&snapshot);
        let text = view.text("");
        assert!(text.contains("Consistency Policy : resync\n\n"), "{text}");
        assert!(!text.contains("Integrity") && !text.contains("Checksum"));
        assert!(text.ends_with("/m2\n"), "the table ends the text:\n{text}");
        let json = serde_json::to_string(&view).unwrap();
        for key in ["integrity", "checksum_errors", "untrusted_blocks"] {
            assert!(!json.contains(key), "{key} in {json}");
        }
        // The same array with checksums differs by exactly the two parts.
        for d in &mut snapshot.devices {
            d.checksum_errors = Some(0);
            d.untrusted_blocks = Some(0);
        }
        let with = DetailView::from_snapshot(&snapshot).text("");
        let stripped = with
            .replace("         Integrity : crc32c\n", "")
            .split("\n    Checksum errors (uraid, crc32c):\n")
            .next()
            .unwrap()
            .to_string();
        assert_eq!(stripped, text);
    }
}
