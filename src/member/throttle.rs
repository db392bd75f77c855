//! A member wrapper that limits bandwidth and IOPS, to emulate slow disks in
//! demos and to test that rebuild speed limits and progress hold on members
//! slower than memory.
//!
//! Each limit is a token bucket that may go into debt: an I/O takes its
//! tokens at once and then waits until the debt is paid. That admits an I/O
//! larger than the bucket (a 1 MiB write under a 100 KiB/s limit waits ten
//! seconds rather than forever) and serves concurrent callers in the order
//! they asked. The limits can change at any time; a change wakes the waiting
//! I/Os, so lifting a limit takes effect at once.

use super::model::{DeviceModel, ModelName};
use super::{check_io, Member, MemberRef};
use crate::units::{format_bytes, format_us, parse_bytes, parse_duration_us};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Burst allowed by default: 50 ms of the rate, short enough that a limit
/// shows within a demo's first second, long enough to absorb sleep jitter.
pub const DEFAULT_BURST_MS: u64 = 50;
/// Upper bound of the burst; a longer one would hide the limit entirely.
pub const BURST_MS_MAX: u64 = 10_000;
/// Longest single sleep while waiting for tokens, so that a change of limits
/// is noticed within this long.
const WAIT_SLICE: Duration = Duration::from_millis(10);

fn default_burst_ms() -> u64 {
    DEFAULT_BURST_MS
}

fn is_default_burst(burst_ms: &u64) -> bool {
    *burst_ms == DEFAULT_BURST_MS
}

/// Limits for reads and writes together (a disk's bandwidth is shared by
/// both); flush and discard are not limited. `None` means no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    /// How much of each rate may be used at once after an idle spell.
    #[serde(default = "default_burst_ms", skip_serializing_if = "is_default_burst")]
    pub burst_ms: u64,
    /// A device model (`member::DeviceModel`) whose shape the byte rate
    /// follows, so that a member is as much slower at its end as a disk is
    /// at its inner tracks: the rate holds at offset 0 (the model's own
    /// outer bandwidth when no rate is given) and falls with the model's
    /// bandwidth at the I/O's fraction of the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelName>,
}

impl Default for ThrottleLimits {
    fn default() -> ThrottleLimits {
        ThrottleLimits::UNLIMITED
    }
}

impl ThrottleLimits {
    pub const UNLIMITED: ThrottleLimits = ThrottleLimits {
        bytes_per_s: None,
        iops: None,
        burst_ms: DEFAULT_BURST_MS,
        model: None,
    };

    pub fn is_unlimited(&self) -> bool {
        self.bytes_per_s.is_none() && self.iops.is_none() && self.model.is_none()
    }

    /// The device model the rate follows, if any.
    pub fn device_model(&self) -> Option<DeviceModel> {
        self.model
            .and_then(|name| DeviceModel::by_name(name.0).ok())
    }

    /// The byte rate at offset 0: the one given, else the model's outer
    /// bandwidth.
    pub fn outer_bytes_per_s(&self) -> Option<u64> {
        self.bytes_per_s
            .or_else(|| self.device_model().map(|m| m.outer_bytes_per_s as u64))
    }

    /// What an I/O of `len_bytes` at `fraction` of the member costs in
    /// bytes at the outer rate: more towards the end under a disk model.
    fn byte_cost(&self, len_bytes: u64, fraction: f64) -> f64 {
        let len = len_bytes as f64;
        match self.device_model() {
            Some(m) => len * m.outer_bytes_per_s / m.bandwidth_at(fraction),
            None => len,
        }
    }

    /// Refuses limits that would stall I/O for good or hide the limit.
    pub fn check(&self) -> Result<(), String> {
        if self.bytes_per_s == Some(0) || self.iops == Some(0) {
            return Err("a limit of 0 would stop all I/O (use 'unlimited' to lift it)".into());
        }
        if !(1..=BURST_MS_MAX).contains(&self.burst_ms) {
            return Err(format!(
                "burst {} is not between 1ms and {}",
                format_us(self.burst_ms.saturating_mul(1000)),
                format_us(BURST_MS_MAX * 1000)
            ));
        }
        Ok(())
    }
}

impl fmt::Display for ThrottleLimits {
    /// `bw=10M,iops=200` (bandwidth per second), or `unlimited`; `parse`
    /// reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(bw) = self.bytes_per_s {
            parts.push(format!("bw={}", format_bytes(bw)));
        }
        if let Some(iops) = self.iops {
            parts.push(format!("iops={iops}"));
        }
        if self.burst_ms != DEFAULT_BURST_MS {
            parts.push(format!("burst={}", format_us(self.burst_ms * 1000)));
        }
        if let Some(model) = self.model {
            parts.push(format!("model={}", model.0));
        }
        if self.is_unlimited() && parts.is_empty() {
            return write!(f, "unlimited");
        }
        write!(f, "{}", parts.join(","))
    }
}

impl FromStr for ThrottleLimits {
    type Err = String;

    /// Parses `bw=SIZE[/s]`, `iops=N` and `burst=DURATION`, comma-separated,
    /// or `unlimited`; the error is one line naming the input.
    fn from_str(text: &str) -> Result<ThrottleLimits, String> {
        let why = |why: String| format!("invalid throttle '{text}': {why}");
        let mut limits = ThrottleLimits::UNLIMITED;
        for item in text.split(',').map(str::trim) {
            match item.split_once('=') {
                None if matches!(item, "unlimited" | "none" | "off") => {}
                Some(("bw" | "bandwidth", value)) => {
                    let value = value.trim();
                    let value = value.strip_suffix("/s").unwrap_or(value);
                    limits.bytes_per_s = Some(parse_bytes(value).map_err(why)?);
                }
                Some(("iops", value)) => {
                    let iops = value
                        .trim()
                        .parse()
                        .map_err(|_| why(format!("iops '{value}' is not a whole number")))?;
                    limits.iops = Some(iops);
                }
                Some(("model", value)) => {
                    limits.model = Some(ModelName::parse(value).map_err(why)?);
                }
                Some(("burst", value)) => {
                    let us = parse_duration_us(value).map_err(why)?;
                    limits.burst_ms = us.div_ceil(1000);
                }
                _ => {
                    return Err(why(format!(
                    "unexpected '{item}' (expected bw=SIZE, iops=N, burst=DURATION or unlimited)"
                )))
                }
            }
        }
        limits.check().map_err(why)?;
        Ok(limits)
    }
}

/// What a `ThrottledMember` has let through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThrottleStats {
    pub ios: u64,
    pub bytes: u64,
    /// I/Os that had to wait, and the time they waited in total.
    pub throttled_ios: u64,
    pub waited_us: u64,
}

/// One token bucket, in tokens (bytes or I/Os) and seconds.
struct Bucket {
    rate_per_s: f64,
    capacity: f64,
    tokens: f64,
}

impl Bucket {
    fn new(rate_per_s: u64, burst_ms: u64) -> Bucket {
        let rate_per_s = rate_per_s as f64;
        // At least one token, so that an IOPS limit below 1000/burst_ms still
        // admits one I/O without waiting after an idle spell.
        let capacity = (rate_per_s * burst_ms as f64 / 1000.0).max(1.0);
        Bucket {
            rate_per_s,
            capacity,
            tokens: capacity,
        }
    }

    fn refill(&mut self, elapsed_s: f64) {
        self.tokens = (self.tokens + elapsed_s * self.rate_per_s).min(self.capacity);
    }

    /// Takes `cost` tokens, into debt if need be; returns the seconds until
    /// the debt is paid.
    fn take(&mut self, cost: f64) -> f64 {
        self.tokens -= cost;
        if self.tokens >= 0.0 {
            0.0
        } else {
            -self.tokens / self.rate_per_s
        }
    }
}

struct Buckets {
    limits: ThrottleLimits,
    bytes: Option<Bucket>,
    ios: Option<Bucket>,
    refilled_at: Instant,
}

impl Buckets {
    fn new(limits: ThrottleLimits) -> Buckets {
        Buckets {
            limits,
            bytes: limits
                .outer_bytes_per_s()
                .map(|r| Bucket::new(r, limits.burst_ms)),
            ios: limits.iops.map(|r| Bucket::new(r, limits.burst_ms)),
            refilled_at: Instant::now(),
        }
    }

    /// Charges one I/O of `len_bytes` at `fraction` of the member; returns
    /// how long it must wait.
    fn charge(&mut self, len_bytes: u64, fraction: f64, now: Instant) -> Duration {
        let elapsed_s = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = now;
        let mut wait_s: f64 = 0.0;
        if let Some(bucket) = &mut self.bytes {
            bucket.refill(elapsed_s);
            wait_s = wait_s.max(bucket.take(self.limits.byte_cost(len_bytes, fraction)));
        }
        if let Some(bucket) = &mut self.ios {
            bucket.refill(elapsed_s);
            wait_s = wait_s.max(bucket.take(1.0));
        }
        Duration::try_from_secs_f64(wait_s).unwrap_or(Duration::MAX)
    }
}

/// The pacing of a throttle, apart from any member: token buckets whose
/// limits can change while I/Os wait. `ThrottledMember` wraps a member in
/// one; the fault injector keeps one so that a served array's member can be
/// slowed down and sped up again live.
pub struct Pacer {
    buckets: Mutex<Buckets>,
    /// Bumped on every change of limits, to wake the I/Os waiting under the
    /// old ones.
    generation: AtomicU64,
    /// Lets unlimited I/O skip the bucket lock.
    limited: AtomicBool,
    ios: AtomicU64,
    bytes: AtomicU64,
    throttled_ios: AtomicU64,
    waited_us: AtomicU64,
}

fn lock(buckets: &Mutex<Buckets>) -> MutexGuard<'_, Buckets> {
    // The buckets are whole after every critical section, so a panic in
    // another thread leaves nothing to repair.
    buckets.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for Pacer {
    fn default() -> Pacer {
        Pacer::new()
    }
}

impl Pacer {
    /// A pacer that lets everything through until limits are set.
    pub fn new() -> Pacer {
        Pacer {
            buckets: Mutex::new(Buckets::new(ThrottleLimits::UNLIMITED)),
            generation: AtomicU64::new(0),
            limited: AtomicBool::new(false),
            ios: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            throttled_ios: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> ThrottleLimits {
        lock(&self.buckets).limits
    }

    /// Changes the limits at once: the buckets start full at the new rates,
    /// and I/Os waiting under the old limits go ahead. Limits that fail
    /// `ThrottleLimits::check` are refused with the reason.
    pub fn set_limits(&self, limits: ThrottleLimits) -> Result<(), String> {
        limits.check()?;
        let mut buckets = lock(&self.buckets);
        *buckets = Buckets::new(limits);
        self.limited
            .store(!limits.is_unlimited(), Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    pub fn stats(&self) -> ThrottleStats {
        ThrottleStats {
            ios: self.ios.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            throttled_ios: self.throttled_ios.load(Ordering::Relaxed),
            waited_us: self.waited_us.load(Ordering::Relaxed),
        }
    }

    /// Waits until an I/O of `len_bytes` at byte `offset` of a member of
    /// `size_bytes` may go (the place matters only under a device model).
    pub fn admit(&self, len_bytes: u64, offset: u64, size_bytes: u64) {
        self.ios.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len_bytes, Ordering::Relaxed);
        if !self.limited.load(Ordering::Acquire) {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        let start = Instant::now();
        let fraction = offset as f64 / size_bytes.max(1) as f64;
        let wait = lock(&self.buckets).charge(len_bytes, fraction, start);
        if wait.is_zero() {
            return;
        }
        let deadline = start.checked_add(wait);
        loop {
            let now = Instant::now();
            let left = deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(now));
            if left.is_zero() || self.generation.load(Ordering::Acquire) != generation {
                break;
            }
            std::thread::sleep(left.min(WAIT_SLICE));
        }
        let waited_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.throttled_ios.fetch_add(1, Ordering::Relaxed);
        self.waited_us.fetch_add(waited_us, Ordering::Relaxed);
    }
}

/// A member limited in bandwidth and IOPS. See the module documentation.
pub struct ThrottledMember {
    inner: MemberRef,
    pacer: Pacer,
}

impl ThrottledMember {
    /// Wraps `inner`; limits that fail `ThrottleLimits::check` are refused.
    pub fn new(inner: MemberRef, limits: ThrottleLimits) -> io::Result<ThrottledMember> {
        let member = ThrottledMember {
            inner,
            pacer: Pacer::new(),
        };
        member.set_limits(limits)?;
        Ok(member)
    }

    pub fn inner(&self) -> &MemberRef {
        &self.inner
    }

    pub fn limits(&self) -> ThrottleLimits {
        self.pacer.limits()
    }

    /// Changes the limits at once: see `Pacer::set_limits`.
    pub fn set_limits(&self, limits: ThrottleLimits) -> io::Result<()> {
        self.pacer.set_limits(limits).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {why}", self.inner.name()),
            )
        })
    }

    pub fn stats(&self) -> ThrottleStats {
        self.pacer.stats()
    }

    /// One line for status output, e.g. `bw=10M,iops=200; 1200 I/Os, 300
    /// throttled, waited 2.5s`.
    pub fn describe(&self) -> String {
        let s = self.stats();
        format!(
            "{}; {} I/Os, {} bytes, {} throttled, waited {}",
            self.limits(),
            s.ios,
            s.bytes,
            s.throttled_ios,
            format_us(s.waited_us / 1000 * 1000)
        )
    }

    fn admit(&self, len_bytes: u64, offset: u64) {
        self.pacer.admit(len_bytes, offset, self.size_bytes());
    }
}

impl Member for ThrottledMember {
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The inner member's: an injected error or delay is counted as the
    /// member's own, where the engine sees it.
    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        self.inner.io_stats()
    }

    fn reconnect(&self) -> io::Result<()> {
        self.inner.reconnect()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn refresh_size(&self) -> io::Result<u64> {
        self.inner.refresh_size()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.inner.logical_block_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        // Refuse a malformed I/O before it spends tokens.
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.admit(buf.len() as u64, offset_bytes);
        self.inner.read_at(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.admit(buf.len() as u64, offset_bytes);
        self.inner.write_at(buf, offset_bytes)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemoryMember;
    use std::sync::Arc;

    fn limits(text: &str) -> ThrottleLimits {
        text.parse().unwrap()
    }

    #[test]
    fn limits_parse_and_print() {
        assert_eq!(limits("unlimited"), ThrottleLimits::UNLIMITED);
        let l = limits("bw=10M/s, iops=200");
        assert_eq!(l.bytes_per_s, Some(10 << 20));
        assert_eq!(l.iops, Some(200));
        assert_eq!(l.to_string(), "bw=10M,iops=200");
        assert_eq!(limits("iops=5,burst=1s").to_string(), "iops=5,burst=1s");
        for text in [
            "unlimited",
            "bw=1536",
            "iops=1",
            "bw=1G,iops=100000,burst=2ms",
        ] {
            assert_eq!(limits(text).to_string(), text);
        }
        for text in [
            "bw=0",
            "iops=x",
            "burst=0ms",
            "burst=11s",
            "speed=1M",
            "fast",
        ] {
            let err = text.parse::<ThrottleLimits>().unwrap_err();
            assert!(
                err.starts_with(&format!("invalid throttle '{text}': ")),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1);
        }
    }

    #[test]
    fn limits_round_trip_through_json() {
        let l = limits("bw=4M,burst=200ms");
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"{"bytes_per_s":4194304,"burst_ms":200}"#);
        assert_eq!(serde_json::from_str::<ThrottleLimits>(&json).unwrap(), l);
        assert_eq!(
            serde_json::from_str::<ThrottleLimits>(r#"{"iops":10}"#).unwrap(),
            limits("iops=10")
        );
        assert!(serde_json::from_str::<ThrottleLimits>(r#"{"bps":10}"#).is_err());
    }

    #[test]
    fn a_model_makes_the_end_of_a_member_dearer() {
        let l = limits("model=hdd-14t");
        assert_eq!(l.outer_bytes_per_s(), Some(265_000_000));
        assert_eq!(l.to_string(), "model=hdd-14t");
        assert_eq!(l.byte_cost(1000, 0.0), 1000.0);
        assert!((l.byte_cost(1000, 1.0) - 1000.0 * 265.0 / 145.0).abs() < 1e-6);
        let json = serde_json::to_string(&limits("bw=1M,model=nvme")).unwrap();
        assert_eq!(json, r#"{"bytes_per_s":1048576,"model":"nvme"}"#);
        assert_eq!(
            serde_json::from_str::<ThrottleLimits>(&json).unwrap(),
            limits("bw=1M,model=nvme")
        );
        assert!(serde_json::from_str::<ThrottleLimits>(r#"{"model":"floppy"}"#).is_err());
        assert!("model=floppy".parse::<ThrottleLimits>().is_err());
        // Flat models cost the same everywhere.
        assert_eq!(limits("model=nvme").byte_cost(1000, 0.9), 1000.0);
    }

    #[test]
    fn a_bucket_goes_into_debt_and_pays_it_back() {
        let mut bucket = Bucket::new(1000, 100);
        assert_eq!(bucket.capacity, 100.0);
        assert_eq!(bucket.take(100.0), 0.0);
        assert!((bucket.take(50.0) - 0.05).abs() < 1e-9);
        bucket.refill(0.05);
        assert!(bucket.tokens.abs() < 1e-9);
        bucket.refill(10.0);
        assert_eq!(bucket.tokens, 100.0);
    }

    #[test]
    fn an_iops_limit_paces_io() {
        let inner = Arc::new(MemoryMember::new("m0", 64 << 10, 512));
        let m = ThrottledMember::new(inner, limits("iops=200,burst=5ms")).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 512];
        for _ in 0..21 {
            m.read_at(&mut buf, 0).unwrap();
        }
        // One I/O from the burst, twenty at 5 ms each: never faster. No
        // upper bound and no exact count of throttled I/Os: on a loaded
        // machine a thread descheduled for 5 ms finds its token waiting.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(95), "{elapsed:?}");
        assert_eq!(m.stats().ios, 21);
        assert!(m.stats().throttled_ios >= 1);
    }

    #[test]
    fn unlimited_costs_nothing_and_malformed_io_is_free() {
        let inner = Arc::new(MemoryMember::new("m0", 64 << 10, 512));
        let m = ThrottledMember::new(inner, ThrottleLimits::UNLIMITED).unwrap();
        m.write_at(&[1u8; 4096], 0).unwrap();
        assert!(m.write_at(&[1u8; 100], 0).is_err());
        assert_eq!(m.stats().ios, 1);
        assert_eq!(m.stats().throttled_ios, 0);
        assert!(m.describe().starts_with("unlimited; 1 I/Os, 4096 bytes"));
    }
}
