//! The array's event log, with the event names mdadm --monitor uses (Fail,
//! FailSpare, DegradedArray, SpareActive, RebuildStarted, Rebuild20..80,
//! RebuildFinished, ...). A bounded ring kept for `uraid status`, and each
//! event is also printed on stderr as it happens, like a monitor's log.
//!
//! Every event has a sequence number that only grows while the process
//! lives, so that a monitor polling now and then forwards each event once:
//! it asks for what came after the last number it saw, and can wait for it.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Events kept for status; older ones are dropped.
const EVENTS_KEPT: usize = 256;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Event {
    /// 1 for the first event of this process, then one more per event.
    #[serde(default)]
    pub seq: u64,
    pub time_secs: u64,
    pub event: String,
    pub device: String,
    pub detail: String,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<Event>,
    last_seq: u64,
}

#[derive(Default)]
pub struct EventLog {
    ring: Mutex<Ring>,
    logged: Condvar,
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
        let mut ring = self.ring.lock().unwrap();
        if ring.events.len() == EVENTS_KEPT {
            ring.events.pop_front();
        }
        ring.last_seq += 1;
        let seq = ring.last_seq;
        ring.events.push_back(Event {
            seq,
            time_secs,
            event: event.into(),
            device: device.into(),
            detail: detail.into(),
        });
        drop(ring);
        self.logged.notify_all();
    }

    pub fn recent(&self) -> Vec<Event> {
        self.ring.lock().unwrap().events.iter().cloned().collect()
    }

    /// The sequence number of the last event logged (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.ring.lock().unwrap().last_seq
    }

    /// Waits until an event after `after` is logged, `timeout` passes or
    /// `give_up` says so (it is asked every `poll`); true if one was.
    pub fn wait_after(
        &self,
        after: u64,
        timeout: Duration,
        poll: Duration,
        give_up: impl Fn() -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let mut ring = self.ring.lock().unwrap();
        loop {
            if ring.last_seq > after {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || give_up() {
                return false;
            }
            let slice = (deadline - now).min(poll);
            ring = self.logged.wait_timeout(ring, slice).unwrap().0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_grow_past_the_ring() {
        let log = EventLog::default();
        for _ in 0..EVENTS_KEPT + 3 {
            log.push("Test", "", "");
        }
        let events = log.recent();
        assert_eq!(events.len(), EVENTS_KEPT);
        assert_eq!(events[0].seq, 4);
        assert_eq!(events.last().unwrap().seq, (EVENTS_KEPT + 3) as u64);
        assert_eq!(log.last_seq(), (EVENTS_KEPT + 3) as u64);
    }

    #[test]
    fn a_waiter_wakes_on_the_next_event() {
        let log = std::sync::Arc::new(EventLog::default());
        log.push("A", "", "");
        assert!(log.wait_after(0, Duration::ZERO, Duration::from_millis(10), || false));
        assert!(!log.wait_after(
            1,
            Duration::from_millis(30),
            Duration::from_millis(10),
            || false
        ));
        let pusher = log.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            pusher.push("B", "", "");
        });
        assert!(log.wait_after(
            1,
            Duration::from_secs(30),
            Duration::from_millis(10),
            || false
        ));
        t.join().unwrap();
        assert!(!log.wait_after(
            2,
            Duration::from_secs(30),
            Duration::from_millis(10),
            || true
        ));
    }
}
