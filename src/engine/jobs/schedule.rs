//! The consistency-check schedule, as a RAID controller's "consistency check
//! period": every N days the engine starts a check (md's sync_action check)
//! when no other job runs. A check can also be started at once with
//! `uraid manage --action check`.

use crate::engine::Engine;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct CheckSchedule {
    /// (period, next due) while a schedule is set.
    plan: Mutex<Option<(Duration, Instant)>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl CheckSchedule {
    pub fn period(&self) -> Option<Duration> {
        self.plan.lock().unwrap().map(|(p, _)| p)
    }

    /// Seconds until the next scheduled check, if one is scheduled.
    pub fn due_in_secs(&self) -> Option<u64> {
        self.plan
            .lock()
            .unwrap()
            .map(|(_, due)| due.saturating_duration_since(Instant::now()).as_secs())
    }
}

impl Engine {
    /// Sets (or with None, removes) the check period. The first check is one
    /// period from now.
    pub fn set_check_period(self: &Arc<Engine>, period: Option<Duration>) {
        *self.schedule.plan.lock().unwrap() = period.map(|p| (p, Instant::now() + p));
        let mut thread = self.schedule.thread.lock().unwrap();
        if period.is_some() && thread.is_none() {
            let weak = Arc::downgrade(self);
            *thread = Some(
                std::thread::Builder::new()
                    .name("uraid-check-schedule".into())
                    .spawn(move || scheduler(weak))
                    .expect("spawn the check scheduler"),
            );
        }
    }
}

fn scheduler(weak: Weak<Engine>) {
    loop {
        // Hold the engine only while looking, never while sleeping.
        {
            let Some(engine) = weak.upgrade() else { return };
            let due = {
                let mut plan = engine.schedule.plan.lock().unwrap();
                match *plan {
                    Some((period, due))
                        if Instant::now() >= due && engine.sync.action().is_none() =>
                    {
                        *plan = Some((period, Instant::now() + period));
                        true
                    }
                    _ => false,
                }
            };
            if due {
                if let Err(e) = engine.start_scrub(false) {
                    engine.events.push("ScheduledCheckSkipped", "", &e);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
