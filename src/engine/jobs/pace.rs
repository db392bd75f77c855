//! A background job paced by the clients' latency (`rebuild_latency_target`),
//! the alternative to md's rule, under which a job above speed_limit_min
//! yields to any client I/O at all and so crawls at the minimum under any
//! load however idle the members are between requests.
//!
//! Every `WINDOW` the pacer reads the clients' p99 request latency
//! (engine/latency.rs) over the last `HORIZON` windows, and sets the
//! job's rate, per member, between speed_limit_min and speed_limit_max:
//! - no client request in the window: the limit at once (the clients
//!   paused, the job takes the members);
//! - p99 over the target: half of what the job did (or was allowed, the
//!   less), multiplicative decrease, so it is back under within a window
//!   or two;
//! - p99 within 80 % of the target: held;
//! - under that: a quarter more, multiplicative increase, so that from the
//!   minimum to md's default maximum takes about five seconds.
//!
//! The rate is enforced as a token bucket: a job's step proceeds while the
//! bucket is not in debt and pays for itself after, so a step larger than
//! the bucket still runs, followed by the wait it owes.

use crate::engine::latency::{ClientLatency, Counts, Window};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How often the pacer looks at the clients' latency: short enough that a
/// job backs off before many requests suffer, long enough to hold a few
/// hundred requests at any load worth protecting.
pub const WINDOW: Duration = Duration::from_millis(200);

/// The windows whose requests together give the p99 the rate follows: a
/// window at a light load holds too few requests for its own p99 to be
/// more than its slowest one.
const HORIZON: usize = 5;

/// The most the bucket saves up while the job is busy elsewhere.
const BURST: Duration = Duration::from_millis(50);

/// Why a job goes at the rate it does, for status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Not yet paced (the first window), or md's limits do not hold it.
    Unthrottled,
    /// md's rule: above speed_limit_min while clients do I/O, it yields.
    YieldingToClients,
    /// At speed_limit_max.
    SpeedLimitMax,
    /// The clients' p99 is within the latency target: the rate grows or holds.
    UnderTarget,
    /// The clients' p99 exceeds the target: the job backs off.
    OverTarget,
    /// Over the target, but held at speed_limit_min, which a job keeps.
    SpeedLimitMin,
    /// No client request in the last window: the job takes what it can.
    Idle,
}

impl Why {
    pub fn words(self) -> &'static str {
        match self {
            Why::Unthrottled => "unthrottled",
            Why::YieldingToClients => "yielding to client I/O above speed_limit_min (md's rule)",
            Why::SpeedLimitMax => "at speed_limit_max",
            Why::UnderTarget => "clients within the latency target",
            Why::OverTarget => "backing off: clients over the latency target",
            Why::SpeedLimitMin => "clients over the latency target, held at speed_limit_min",
            Why::Idle => "clients idle",
        }
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Why {
        [
            Why::Unthrottled,
            Why::YieldingToClients,
            Why::SpeedLimitMax,
            Why::UnderTarget,
            Why::OverTarget,
            Why::SpeedLimitMin,
            Why::Idle,
        ]
        .get(code as usize)
        .copied()
        .unwrap_or(Why::Unthrottled)
    }
}

/// What status shows of a job's pace: written by the job's throttle,
/// read by status at any time.
#[derive(Default)]
pub struct PaceShown {
    rate_kib_per_s: AtomicU64,
    why: AtomicU8,
    /// The clients' p99 in the last window, µs (0: none seen).
    client_p99_us: AtomicU64,
    target_us: AtomicU64,
}

/// A job's pace as status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaceReport {
    /// The rate the job is allowed now, KiB/s per member (0: no rate
    /// set, md's limits alone).
    pub rate_kib_per_s: u64,
    pub why: Why,
    /// The clients' p99 request latency in the last window, µs; absent
    /// without a latency target or with no request in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_p99_us: Option<u64>,
    /// The latency target, µs; absent when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_us: Option<u64>,
}

impl PaceShown {
    pub(in crate::engine) fn show(&self, report: PaceReport) {
        let r = Ordering::Relaxed;
        self.rate_kib_per_s.store(report.rate_kib_per_s, r);
        self.why.store(report.why.code(), r);
        self.client_p99_us
            .store(report.client_p99_us.unwrap_or(0), r);
        self.target_us.store(report.target_us.unwrap_or(0), r);
    }

    /// The rate a pacer allows now, KiB/s per member, when one paces
    /// the job.
    pub(in crate::engine) fn paced_rate_kib_per_s(&self) -> Option<u64> {
        let r = Ordering::Relaxed;
        (self.target_us.load(r) > 0).then(|| self.rate_kib_per_s.load(r))
    }

    pub fn report(&self) -> PaceReport {
        let r = Ordering::Relaxed;
        let some = |v: u64| (v > 0).then_some(v);
        PaceReport {
            rate_kib_per_s: self.rate_kib_per_s.load(r),
            why: Why::from_code(self.why.load(r)),
            client_p99_us: some(self.client_p99_us.load(r)),
            target_us: some(self.target_us.load(r)),
        }
    }
}

/// The rate after a window, and why: the rule of the module's comment.
/// `rate` is what the job was allowed, `done` what it did (KiB/s per
/// member each), `min` and `max` md's limits.
pub fn next_rate(
    rate: f64,
    done: f64,
    window: Window,
    target_us: u64,
    min: f64,
    max: f64,
) -> (f64, Why) {
    assert!(target_us > 0 && min > 0.0 && max >= min);
    let rate = rate.clamp(min, max);
    if window.requests == 0 {
        return (
            max,
            if max > min {
                Why::Idle
            } else {
                Why::SpeedLimitMax
            },
        );
    }
    let p99 = window.p99_us as f64;
    let target = target_us as f64;
    let (next, why) = if p99 > target {
        // From what the job really did: a rate it could not reach is no
        // measure of what hurt the clients.
        (rate.min(done.max(min)) * 0.5, Why::OverTarget)
    } else if p99 > 0.8 * target {
        (rate, Why::UnderTarget)
    } else {
        (rate * 1.25, Why::UnderTarget)
    };
    let next = next.clamp(min, max);
    let why = match why {
        Why::OverTarget if next <= min => Why::SpeedLimitMin,
        Why::UnderTarget if next >= max => Why::SpeedLimitMax,
        why => why,
    };
    assert!((min..=max).contains(&next));
    (next, why)
}

/// The pacer of one running job.
pub(in crate::engine) struct Pace {
    /// The rate allowed, KiB/s per member.
    rate: f64,
    why: Why,
    window_start: Instant,
    /// KiB per member done in this window.
    window_kib: u64,
    /// The bucket: KiB the job may do before it waits (negative: owed).
    tokens: f64,
    filled: Instant,
    /// The last windows' requests, newest last.
    recent: VecDeque<Counts>,
    /// Windows until the rate may fall again on the horizon's p99 alone:
    /// the slow requests that made it fall stay in the horizon for
    /// `HORIZON` windows and must not make it fall again and again.
    settle: usize,
}

impl Pace {
    /// A pacer that starts at the minimum: until the first window says
    /// how the clients fare, they come first.
    pub(in crate::engine) fn new(min: f64) -> Pace {
        let now = Instant::now();
        Pace {
            rate: min.max(1.0),
            why: Why::Unthrottled,
            window_start: now,
            window_kib: 0,
            tokens: 0.0,
            filled: now,
            recent: VecDeque::new(),
            settle: 0,
        }
    }

    /// Accounts `kib` per member done.
    pub(in crate::engine) fn count(&mut self, kib: u64) {
        self.tokens -= kib as f64;
        self.window_kib += kib;
    }

    /// Ends the window if it is over: reads the clients' latency and sets
    /// the rate. Returns what status should show.
    pub(in crate::engine) fn tick(
        &mut self,
        latency: &ClientLatency,
        target_us: u64,
        min: f64,
        max: f64,
    ) -> Option<PaceReport> {
        let elapsed = self.window_start.elapsed();
        if elapsed < WINDOW {
            return None;
        }
        let last = latency.take();
        let idle = last.requests() == 0;
        self.recent.push_back(last);
        if self.recent.len() > HORIZON {
            self.recent.pop_front();
        }
        let mut horizon = Counts::default();
        self.recent.iter().for_each(|c| horizon.add(c));
        // Clients that stopped are idle at once, whatever came before.
        let window = if idle {
            Window {
                requests: 0,
                p99_us: 0,
            }
        } else {
            horizon.window()
        };
        let done = self.window_kib as f64 / elapsed.as_secs_f64();
        let (mut rate, why) = next_rate(self.rate, done, window, target_us, min, max);
        let newest_over = self.recent.back().map(|c| c.window().p99_us) > Some(target_us);
        self.settle = self.settle.saturating_sub(1);
        if rate < self.rate {
            if self.settle > 0 && !newest_over {
                // Still the slow requests of the last fall: held.
                rate = self.rate;
            } else {
                self.settle = HORIZON;
            }
        }
        self.refill();
        self.rate = rate;
        self.why = why;
        self.window_start = Instant::now();
        self.window_kib = 0;
        Some(PaceReport {
            rate_kib_per_s: rate as u64,
            why,
            client_p99_us: (window.requests > 0).then_some(window.p99_us),
            target_us: Some(target_us),
        })
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.filled).as_secs_f64();
        self.filled = now;
        self.tokens = (self.tokens + self.rate * dt).min(self.rate * BURST.as_secs_f64());
    }

    /// How long the job must wait before its next step: what it owes at
    /// the rate allowed.
    pub(in crate::engine) fn owed(&mut self) -> Duration {
        self.refill();
        if self.tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-self.tokens / self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(requests: u64, p99_us: u64) -> Window {
        Window { requests, p99_us }
    }

    #[test]
    fn over_the_target_the_rate_halves_from_what_the_job_did_and_stops_at_the_minimum() {
        let (min, max) = (1_000.0, 200_000.0);
        // Allowed 100 MB/s, did 80: over the target, half of 80.
        let (rate, why) = next_rate(100_000.0, 80_000.0, window(500, 3_000), 2_000, min, max);
        assert_eq!((rate, why), (40_000.0, Why::OverTarget));
        // Allowed the maximum but did little: half of what it did.
        let (rate, _) = next_rate(max, 10_000.0, window(500, 3_000), 2_000, min, max);
        assert_eq!(rate, 5_000.0);
        // Never below speed_limit_min, and status says so.
        let (rate, why) = next_rate(1_500.0, 1_500.0, window(500, 9_000), 2_000, min, max);
        assert_eq!((rate, why), (min, Why::SpeedLimitMin));
    }

    #[test]
    fn under_the_target_the_rate_grows_holds_near_it_and_idle_clients_give_the_maximum() {
        let (min, max) = (1_000.0, 200_000.0);
        let (rate, why) = next_rate(40_000.0, 40_000.0, window(500, 1_000), 2_000, min, max);
        assert_eq!((rate, why), (50_000.0, Why::UnderTarget));
        // Within 80 % of the target: held.
        let (rate, _) = next_rate(40_000.0, 40_000.0, window(500, 1_800), 2_000, min, max);
        assert_eq!(rate, 40_000.0);
        // Capped by speed_limit_max.
        let (rate, why) = next_rate(190_000.0, 190_000.0, window(500, 100), 2_000, min, max);
        assert_eq!((rate, why), (max, Why::SpeedLimitMax));
        // Clients gone: the maximum at once.
        let (rate, why) = next_rate(min, min, window(0, 0), 2_000, min, max);
        assert_eq!((rate, why), (max, Why::Idle));
        // From the minimum to the maximum within about five seconds.
        let mut rate = min;
        let mut windows = 0;
        while rate < max {
            rate = next_rate(rate, rate, window(500, 500), 2_000, min, max).0;
            windows += 1;
        }
        assert!(
            windows as f64 * WINDOW.as_secs_f64() <= 5.0,
            "{windows} windows"
        );
    }

    #[test]
    fn the_bucket_lets_a_step_run_and_then_owes_its_time() {
        let mut pace = Pace::new(1_000.0);
        assert_eq!(pace.owed(), Duration::ZERO);
        // 500 KiB at 1,000 KiB/s: about half a second owed.
        pace.count(500);
        let owed = pace.owed();
        assert!(
            owed > Duration::from_millis(400) && owed <= Duration::from_millis(500),
            "{owed:?}"
        );
    }

    #[test]
    fn a_window_reads_the_clients_latency_and_status_shows_why() {
        let latency = ClientLatency::default();
        let mut pace = Pace::new(1_000.0);
        assert!(pace.tick(&latency, 2_000, 1_000.0, 100_000.0).is_none());
        pace.window_start -= WINDOW;
        for _ in 0..100 {
            latency.record(Duration::from_millis(5));
        }
        let report = pace.tick(&latency, 2_000, 1_000.0, 100_000.0).unwrap();
        assert_eq!(report.why, Why::SpeedLimitMin);
        assert!(report.client_p99_us.unwrap() >= 5_000);
        assert_eq!(report.target_us, Some(2_000));
        let shown = PaceShown::default();
        shown.show(report);
        assert_eq!(shown.report(), report);
        // The next window has no request: idle, the maximum.
        pace.window_start -= WINDOW;
        let report = pace.tick(&latency, 2_000, 1_000.0, 100_000.0).unwrap();
        assert_eq!((report.why, report.rate_kib_per_s), (Why::Idle, 100_000));
        assert_eq!(report.client_p99_us, None);
        assert_eq!(pace.why, Why::Idle);
    }
}
