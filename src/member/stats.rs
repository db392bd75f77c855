//! Per-member I/O counters: operations, bytes, errors and a latency
//! histogram for reads and for writes, kept where the engine's member I/O
//! completes (batches, the direct read path, corrections) so that a slow
//! or failing disk can be told from its neighbours.
//!
//! Everything is a relaxed atomic: the I/O path takes no lock and pays two
//! clock reads and a handful of additions per operation. A member that
//! wraps another (fault injection, throttling) hands out its inner
//! member's counters, so an operation is counted once whichever layer it
//! went through.

use super::Member;
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds of the latency buckets, in seconds (the last bucket, +Inf,
/// is implied): from a fast SSD's 100 µs to a drive retrying for seconds.
pub const LATENCY_BOUNDS_SECONDS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

const BUCKETS: usize = LATENCY_BOUNDS_SECONDS.len() + 1;

/// The same bounds in nanoseconds, for the comparison on the I/O path.
const BOUNDS_NS: [u64; 16] = {
    let mut ns = [0u64; 16];
    let mut i = 0;
    while i < 16 {
        ns[i] = (LATENCY_BOUNDS_SECONDS[i] * 1e9) as u64;
        i += 1;
    }
    ns
};

#[derive(Default)]
struct OpStats {
    ops: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpStats {
    fn record(&self, bytes: usize, ok: bool, elapsed: Duration) {
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        self.ops.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_ns.fetch_add(ns, Ordering::Relaxed);
        let bucket = BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self) -> OpCounts {
        OpCounts {
            ops: self.ops.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            latency_seconds_sum: self.latency_ns.load(Ordering::Relaxed) as f64 / 1e9,
            latency_buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// A member's counters since it was opened.
#[derive(Default)]
pub struct IoStats {
    read: OpStats,
    write: OpStats,
}

impl IoStats {
    /// Counts one finished operation; a failed one counts as an error and
    /// moves no bytes, and its time is in the histogram all the same (a
    /// timeout is a latency too).
    pub fn record(&self, write: bool, bytes: usize, ok: bool, elapsed: Duration) {
        let side = if write { &self.write } else { &self.read };
        side.record(bytes, ok, elapsed);
    }

    pub fn counts(&self) -> IoCounts {
        IoCounts {
            read: self.read.counts(),
            write: self.write.counts(),
        }
    }
}

/// Counters of one direction, as read at one moment.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct OpCounts {
    pub ops: u64,
    /// Operations that failed (the engine then retried, corrected or
    /// failed the member).
    pub errors: u64,
    /// Bytes of the operations that succeeded.
    pub bytes: u64,
    pub latency_seconds_sum: f64,
    /// Operations per latency bucket (not cumulative), one per bound of
    /// `LATENCY_BOUNDS_SECONDS` and a last one above them.
    pub latency_buckets: Vec<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct IoCounts {
    pub read: OpCounts,
    pub write: OpCounts,
}

/// `member.read_at`, counted.
pub fn read_at(member: &dyn Member, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
    let len = buf.len();
    counted(member, false, len, || member.read_at(buf, offset_bytes))
}

/// `member.write_at`, counted.
pub fn write_at(member: &dyn Member, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
    counted(member, true, buf.len(), || {
        member.write_at(buf, offset_bytes)
    })
}

/// `member.write_at_fua`, counted.
pub fn write_at_fua(member: &dyn Member, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
    counted(member, true, buf.len(), || {
        member.write_at_fua(buf, offset_bytes)
    })
}

/// Runs `io` and records it in the member's counters, if it keeps any.
fn counted(
    member: &dyn Member,
    write: bool,
    bytes: usize,
    io: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let started = Instant::now();
    let result = io();
    if let Some(stats) = member.io_stats() {
        stats.record(write, bytes, result.is_ok(), started.elapsed());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets_and_errors_move_no_bytes() {
        let stats = IoStats::default();
        stats.record(false, 4096, true, Duration::from_micros(50));
        stats.record(false, 4096, true, Duration::from_micros(100));
        stats.record(false, 4096, false, Duration::from_millis(3));
        stats.record(true, 8192, true, Duration::from_secs(20));
        let counts = stats.counts();
        assert_eq!(counts.read.ops, 3);
        assert_eq!(counts.read.errors, 1);
        assert_eq!(counts.read.bytes, 8192);
        assert_eq!(counts.read.latency_buckets[0], 2, "<= 100 µs");
        assert_eq!(counts.read.latency_buckets[5], 1, "<= 5 ms");
        assert_eq!(counts.write.latency_buckets[BUCKETS - 1], 1, "+Inf");
        assert_eq!(counts.write.bytes, 8192);
        assert!((counts.read.latency_seconds_sum - 0.00315).abs() < 1e-9);
    }
}
