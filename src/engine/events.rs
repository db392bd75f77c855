//! The array's event log, with the event names mdadm --monitor uses (Fail,
//! FailSpare, DegradedArray, SpareActive, RebuildStarted, Rebuild20..80,
//! RebuildFinished, ...). A bounded ring kept for `uraid status`, and each
//! event is also printed on stderr as it happens, like a monitor's log.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Events kept for status; older ones are dropped.
const EVENTS_KEPT: usize = 256;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Event {
    pub time_secs: u64,
    pub event: String,
    pub device: String,
    pub detail: String,
}

#[derive(Default)]
pub struct EventLog {
    events: Mutex<VecDeque<Event>>,
}

impl EventLog {
    pub fn push(&self, event: &str, device: &str, detail: &str) {
        let time_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        eprintln!(
            "uraid: event {event}{}{}",
            if device.is_empty() {
                String::new()
            } else {
                format!(" {device}")
            },
            if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            }
        );
        let mut events = self.events.lock().unwrap();
        if events.len() == EVENTS_KEPT {
            events.pop_front();
        }
        events.push_back(Event {
            time_secs,
            event: event.into(),
            device: device.into(),
            detail: detail.into(),
        });
    }

    pub fn recent(&self) -> Vec<Event> {
        self.events.lock().unwrap().iter().cloned().collect()
    }
}
