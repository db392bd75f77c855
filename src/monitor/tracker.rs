//! What one array's successive status replies mean in mdadm --monitor's
//! events. Pure: replies in, alerts out.
//!
//! The engine logs most events itself (Fail, FailSpare, SpareActive,
//! DegradedArray, RebuildStarted, RebuildFinished, and with checksums
//! ChecksumError and ChecksumUncorrectable), numbered; they are
//! forwarded once each, in order. The monitor adds what only an observer
//! knows: NewArray, DeviceDisappeared (the caller), DegradedArray when an
//! array is first seen degraded, and RebuildNN at its own increment. Its
//! progress samples are the polled percent and the engine's own
//! Rebuild20..80 marks, so a rebuild that runs between two polls still
//! reports its steps.

use crate::control::StatusReply;

/// One alert, as mdadm passes it on: `PROGRAM EVENT ARRAY [COMPONENT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    pub event: String,
    /// The array's device name as mdadm would give it (/dev/md/<name>).
    pub array: String,
    /// The member concerned, or RebuildFinished's " mismatches found: N
    /// (on raid level L)", which mdadm passes in the same place.
    pub component: Option<String>,
    /// Shown after the message (": Wrong-Level"), never passed on.
    pub description: Option<String>,
}

impl Alert {
    pub fn new(event: &str, array: &str) -> Alert {
        Alert {
            event: event.into(),
            array: array.into(),
            component: None,
            description: None,
        }
    }

    fn with_component(mut self, component: &str) -> Alert {
        self.component = Some(component.into());
        self
    }

    /// mdadm's message: "<Event> event detected on md device <md>[,
    /// component device <c>][: <description>]".
    pub fn message(&self) -> String {
        let mut m = format!("{} event detected on md device {}", self.event, self.array);
        if let Some(c) = &self.component {
            m.push_str(&format!(", component device {c}"));
        }
        if let Some(d) = &self.description {
            m.push_str(&format!(": {d}"));
        }
        m
    }

    /// The events mdadm mails (and `uraid monitor --mail` sends).
    pub fn is_mailed(&self) -> bool {
        matches!(
            self.event.as_str(),
            "Fail"
                | "FailSpare"
                | "DegradedArray"
                | "SparesMissing"
                | "TestMessage"
                // Data a client could not read: as urgent as a failure.
                | "ChecksumUncorrectable"
        )
    }

    /// syslog's priority, by mdadm's order of events.
    pub fn priority(&self) -> libc::c_int {
        match self.event.as_str() {
            "DeviceDisappeared"
            | "Fail"
            | "FailSpare"
            | "DegradedArray"
            | "ChecksumUncorrectable" => libc::LOG_CRIT,
            "SpareActive" | "NewArray" | "MoveSpare" | "TestMessage" => libc::LOG_INFO,
            _ => libc::LOG_WARNING,
        }
    }
}

/// What the monitor remembers of an array it can reach.
#[derive(Clone, Debug)]
pub struct Tracked {
    pub md: String,
    /// The server's process: another one is another instance.
    pid: u32,
    /// The last engine event forwarded (or skipped as history).
    last_seq: u64,
    /// The last percent seen of the job under way; None: no job known.
    job: Option<u32>,
}

impl Tracked {
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

fn last_seq(reply: &StatusReply) -> u64 {
    reply.events.iter().map(|e| e.seq).max().unwrap_or(0)
}

/// Whether the array misses a role (mdstat's `_`).
pub fn degraded(reply: &StatusReply) -> bool {
    let raid = reply.detail["raid_devices"].as_u64().unwrap_or(0);
    let active = reply.detail["active_devices"].as_u64().unwrap_or(raid);
    active < raid
}

/// The array's device name as mdadm would give it.
pub fn md_device(reply: &StatusReply) -> String {
    let text = |key: &str| reply.detail[key].as_str().unwrap_or_default();
    format!(
        "/dev/md/{}",
        crate::control::registry::label_for(text("name"), text("uuid"))
    )
}

/// The first reply of an array (or of a new instance of it): its past
/// events are history, not news. `announce` gives NewArray (an array found
/// by --scan, or back after an error), as mdadm does; fewer spares than
/// `spares_wanted` (the config's ARRAY spares=) is SparesMissing, checked at
/// first sight only, as mdadm checks it.
pub fn first_sight(
    reply: &StatusReply,
    announce: bool,
    spares_wanted: Option<u32>,
) -> (Tracked, Vec<Alert>) {
    let md = md_device(reply);
    let mut alerts = Vec::new();
    if announce {
        alerts.push(Alert::new("NewArray", &md));
    }
    if degraded(reply) {
        alerts.push(Alert::new("DegradedArray", &md));
    }
    if spares_wanted.is_some_and(|n| reply.spare_disks < n) {
        alerts.push(Alert::new("SparesMissing", &md));
    }
    let tracked = Tracked {
        md,
        pid: reply.pid,
        last_seq: last_seq(reply),
        job: reply.sync_percent,
    };
    (tracked, alerts)
}

/// What changed since the last reply. None when the reply is another
/// instance of the array (a new server process, or numbers that went
/// back): the caller reports it gone and sees it anew.
pub fn update(
    tracked: &mut Tracked,
    reply: &StatusReply,
    increment: u32,
    notes: &mut Vec<String>,
) -> Option<Vec<Alert>> {
    if reply.pid != tracked.pid || last_seq(reply) < tracked.last_seq {
        return None;
    }
    let md = tracked.md.clone();
    let mut alerts = Vec::new();
    let fresh: Vec<_> = reply
        .events
        .iter()
        .filter(|e| e.seq > tracked.last_seq)
        .collect();
    if let Some(first) = fresh.first() {
        if first.seq > tracked.last_seq + 1 {
            notes.push(format!(
                "{md}: {} events were dropped from the array's log before they were read",
                first.seq - tracked.last_seq - 1
            ));
        }
    }
    for e in fresh {
        tracked.last_seq = e.seq;
        match e.event.as_str() {
            // The checksum events have no name in mdadm, which has no
            // checksums: they keep the engine's, with the member, as
            // zed passes ZFS's checksum ereports on.
            "Fail" | "FailSpare" | "SpareActive" | "ChecksumError" | "ChecksumUncorrectable" => {
                alerts.push(Alert::new(&e.event, &md).with_component(&e.device))
            }
            "DegradedArray" => alerts.push(Alert::new("DegradedArray", &md)),
            "RebuildStarted" => {
                alerts.push(Alert::new("RebuildStarted", &md));
                tracked.job = Some(0);
            }
            "RebuildFinished" if tracked.job.is_some() => {
                tracked.job = None;
                let mut alert = Alert::new("RebuildFinished", &md);
                if let Some(n) = mismatches(&e.detail).filter(|n| *n > 0) {
                    let level = reply.detail["raid_level"]
                        .as_str()
                        .and_then(crate::geometry::level_from_name)
                        .map(|l| l.md_number())
                        .unwrap_or(-1);
                    alert = alert
                        .with_component(&format!(" mismatches found: {n} (on raid level {level})"));
                }
                alerts.push(alert);
            }
            // md's RebuildFinished also means "aborted".
            "SyncStopped" | "SyncFailed" | "RebuildFailed" | "ReplaceFailed"
                if tracked.job.is_some() =>
            {
                tracked.job = None;
                alerts.push(Alert::new("RebuildFinished", &md));
            }
            name => {
                if let Some(percent) = name
                    .strip_prefix("Rebuild")
                    .and_then(|p| p.parse::<u32>().ok())
                {
                    sample(tracked, percent, increment, &mut alerts);
                }
            }
        }
    }
    if let Some(percent) = reply.sync_percent {
        sample(tracked, percent, increment, &mut alerts);
    }
    Some(alerts)
}

/// mdadm's rule: RebuildNN, NN the percent observed, when the percent
/// crosses into a higher multiple of the increment.
/// A job seen at 100 % is ending: RebuildFinished says so, not Rebuild100.
fn sample(tracked: &mut Tracked, percent: u32, increment: u32, alerts: &mut Vec<Alert>) {
    let Some(before) = tracked.job.filter(|_| percent < 100) else {
        return;
    };
    if percent / increment > before / increment {
        alerts.push(Alert::new(&format!("Rebuild{percent:02}"), &tracked.md));
    }
    tracked.job = Some(percent.max(before));
}

/// The count in the engine's "<action>: mismatches found: N".
fn mismatches(detail: &str) -> Option<u64> {
    detail
        .rsplit_once("mismatches found: ")
        .and_then(|(_, n)| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Event;

    fn reply(pid: u32, events: &[(u64, &str, &str, &str)], percent: Option<u32>) -> StatusReply {
        let events: Vec<Event> = events
            .iter()
            .map(|(seq, event, device, detail)| Event {
                seq: *seq,
                time_secs: 0,
                event: event.to_string(),
                device: device.to_string(),
                detail: detail.to_string(),
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "mdstat": "", "detail_text": "", "nbd_uri": "",
            "detail": {
                "name": "host:vol", "uuid": "01234567:00000000:00000000:00000000",
                "raid_devices": 3, "active_devices": 3, "raid_level": "raid5",
            },
            "events": events, "pid": pid, "sync_percent": percent,
        }))
        .unwrap()
    }

    fn names(alerts: &[Alert]) -> Vec<String> {
        alerts
            .iter()
            .map(|a| match &a.component {
                Some(c) => format!("{} {c}", a.event),
                None => a.event.clone(),
            })
            .collect()
    }

    #[test]
    fn checksum_events_are_forwarded_with_their_member_and_uncorrectable_ones_mailed() {
        let (mut t, _) = first_sight(&reply(7, &[], None), true, None);
        let mut notes = Vec::new();
        let news = [
            (1, "ChecksumError", "/d/b", "sectors 2048..2056"),
            (2, "ChecksumUncorrectable", "/d/c", "row 12"),
            (3, "IntegrityUnclean", "/d/b", "resync"),
        ];
        let alerts = update(&mut t, &reply(7, &news, None), 20, &mut notes).unwrap();
        assert_eq!(
            names(&alerts),
            ["ChecksumError /d/b", "ChecksumUncorrectable /d/c"]
        );
        assert!(!alerts[0].is_mailed());
        assert_eq!(alerts[0].priority(), libc::LOG_WARNING);
        assert!(alerts[1].is_mailed());
        assert_eq!(alerts[1].priority(), libc::LOG_CRIT);
        assert_eq!(
            alerts[1].message(),
            "ChecksumUncorrectable event detected on md device /dev/md/vol, component device /d/c"
        );
    }

    #[test]
    fn history_is_skipped_and_news_forwarded_once() {
        let old = [(1, "Fail", "/d/a", "")];
        let (mut t, alerts) = first_sight(&reply(7, &old, None), true, None);
        assert_eq!(names(&alerts), ["NewArray"]);
        assert_eq!(t.md, "/dev/md/vol");
        let mut notes = Vec::new();
        let news = [
            (1, "Fail", "/d/a", ""),
            (2, "SpareAdded", "/d/s", ""),
            (3, "RebuildStarted", "/d/s", "recovering role 0"),
            (4, "Rebuild20", "", "recovery"),
        ];
        let alerts = update(&mut t, &reply(7, &news, Some(33)), 20, &mut notes).unwrap();
        assert_eq!(names(&alerts), ["RebuildStarted", "Rebuild20"]);
        let more = [
            (5, "Rebuild40", "", "recovery"),
            (6, "Rebuild60", "", "recovery"),
            (7, "Rebuild80", "", "recovery"),
            (8, "RebuildFinished", "/d/s", ""),
            (9, "SpareActive", "/d/s", "role 0"),
        ];
        let alerts = update(&mut t, &reply(7, &more, None), 20, &mut notes).unwrap();
        assert_eq!(
            names(&alerts),
            [
                "Rebuild40",
                "Rebuild60",
                "Rebuild80",
                "RebuildFinished",
                "SpareActive /d/s"
            ]
        );
        assert!(update(&mut t, &reply(7, &more, None), 20, &mut notes)
            .unwrap()
            .is_empty());
        assert!(notes.is_empty());
        // Another process, or numbers that went back: another instance.
        assert!(update(&mut t, &reply(8, &more, None), 20, &mut notes).is_none());
        assert!(update(&mut t, &reply(7, &old, None), 20, &mut notes).is_none());
    }

    #[test]
    fn rebuild_steps_follow_the_increment_with_the_observed_percent() {
        let (mut t, _) = first_sight(&reply(1, &[], None), false, None);
        let mut notes = Vec::new();
        let started = [(1, "RebuildStarted", "", "check")];
        let steps = |t: &mut Tracked, p| {
            names(&update(t, &reply(1, &started, Some(p)), 25, &mut Vec::new()).unwrap())
        };
        assert_eq!(
            names(&update(&mut t, &reply(1, &started, Some(12)), 25, &mut notes).unwrap()),
            ["RebuildStarted"]
        );
        assert_eq!(steps(&mut t, 23), Vec::<String>::new());
        assert_eq!(steps(&mut t, 27), ["Rebuild27"]);
        assert_eq!(steps(&mut t, 49), Vec::<String>::new());
        assert_eq!(steps(&mut t, 93), ["Rebuild93"]);
        assert_eq!(steps(&mut t, 100), Vec::<String>::new());
        let stopped = [
            (1, "RebuildStarted", "", ""),
            (2, "SyncStopped", "", "check"),
        ];
        assert_eq!(
            names(&update(&mut t, &reply(1, &stopped, None), 25, &mut notes).unwrap()),
            ["RebuildFinished"]
        );
    }

    #[test]
    fn first_sight_degraded_and_mismatches_and_gaps() {
        let mut r = reply(1, &[(5, "RebuildStarted", "", "check")], Some(50));
        r.detail["active_devices"] = 2.into();
        let (mut t, alerts) = first_sight(&r, false, None);
        assert_eq!(names(&alerts), ["DegradedArray"]);
        let mut notes = Vec::new();
        let done = [(9, "RebuildFinished", "", "check: mismatches found: 16")];
        let alerts = update(&mut t, &reply(1, &done, None), 20, &mut notes).unwrap();
        assert_eq!(
            names(&alerts),
            ["RebuildFinished  mismatches found: 16 (on raid level 5)"]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(
            Alert::new("Fail", "/dev/md/x")
                .with_component("/d/a")
                .message(),
            "Fail event detected on md device /dev/md/x, component device /d/a"
        );
    }
}
