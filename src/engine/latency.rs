//! The clients' request latency as the engine sees it, in short windows,
//! for the background jobs that pace themselves by it
//! (`rebuild_latency_target`, engine/jobs/pace.rs).
//!
//! A request is timed from its entry into the engine (or, for a read on
//! the NBD fast path, from its start on the connection's ring) to its
//! completion: what a client waits for beyond the network. The members'
//! own histograms (member/stats.rs) are no measure of this: they hold the
//! job's own I/O, whose large transfers take longer by nature, so a job
//! paced by them would slow down for itself with no client there at all.
//!
//! Recording is a relaxed add into one of two histograms; the pacer flips
//! them at the end of a window and reads the one it left, so the request
//! path never takes a lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Quarter-octave buckets from 1 µs: the p99 is known within 19 %, and
/// the last bucket starts at 2^23 µs (8.4 s).
const BUCKETS: usize = 1 + 4 * 24;

/// The requests of one or more windows, by latency bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts([u64; BUCKETS]);

impl Counts {
    pub fn requests(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Adds another window's requests.
    pub fn add(&mut self, other: &Counts) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }

    pub fn window(&self) -> Window {
        window_of(&self.0)
    }
}

impl Default for Counts {
    fn default() -> Counts {
        Counts([0; BUCKETS])
    }
}

/// A window's requests and their 99th percentile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub requests: u64,
    /// The upper bound of the bucket holding the 99th percentile, µs; 0
    /// when there was no request.
    pub p99_us: u64,
}

struct Histogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

pub struct ClientLatency {
    histograms: [Histogram; 2],
    /// The histogram requests are recorded into now.
    current: AtomicUsize,
}

impl Default for ClientLatency {
    fn default() -> ClientLatency {
        ClientLatency {
            histograms: [Histogram::new(), Histogram::new()],
            current: AtomicUsize::new(0),
        }
    }
}

impl ClientLatency {
    /// Records one finished client request.
    pub fn record(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        let at = self.current.load(Ordering::Relaxed) & 1;
        self.histograms[at].buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Ends the window: later requests go to the other histogram, and the
    /// one left is read and emptied. One caller at a time (the pacer of
    /// the one job that runs); a request that picked the old histogram
    /// just before the flip lands in the next window read of it, once.
    pub fn take(&self) -> Counts {
        let left = self.current.fetch_add(1, Ordering::AcqRel) & 1;
        let buckets = &self.histograms[left].buckets;
        Counts(std::array::from_fn(|i| {
            buckets[i].swap(0, Ordering::AcqRel)
        }))
    }
}

/// The bucket of a latency in µs: 0 for under 1 µs, then four a doubling.
fn bucket(us: u64) -> usize {
    if us == 0 {
        return 0;
    }
    let octave = 63 - us.leading_zeros() as usize;
    // The two bits after the leading one: which quarter of the octave.
    let quarter = if octave >= 2 {
        (us >> (octave - 2)) & 3
    } else {
        (us << (2 - octave)) & 3
    } as usize;
    (1 + 4 * octave + quarter).min(BUCKETS - 1)
}

/// The least latency, µs, that falls past bucket `i`: its upper bound.
fn bucket_upper_us(i: usize) -> u64 {
    let next = i + 1;
    if next >= BUCKETS {
        return u64::MAX;
    }
    let (octave, quarter) = ((next - 1) / 4, (next - 1) % 4);
    // Whole µs: below 4 µs a quarter octave is a fraction of one.
    ((1u64 << octave) as f64 * (1.0 + quarter as f64 / 4.0)).ceil() as u64
}

fn window_of(counts: &[u64]) -> Window {
    let requests: u64 = counts.iter().sum();
    if requests == 0 {
        return Window {
            requests,
            p99_us: 0,
        };
    }
    // The request at rank ceil(0.99 n), counted from the fastest.
    let rank = requests - requests / 100;
    let mut seen = 0;
    for (i, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Window {
                requests,
                p99_us: bucket_upper_us(i),
            };
        }
    }
    unreachable!("the counts add up to the requests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_quarter_octaves_whose_bounds_hold_their_latencies() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(2), 5);
        assert_eq!(bucket(3), 7);
        assert_eq!(bucket(4), 9);
        assert_eq!(bucket(5), 10);
        for us in [1u64, 2, 3, 7, 100, 999, 1000, 1500, 65_000, 5_000_000] {
            let b = bucket(us);
            assert!(us < bucket_upper_us(b), "{us} µs below its bucket's bound");
            assert!(
                b == 0 || us >= bucket_upper_us(b - 1),
                "{us} µs past the bucket before"
            );
            // Within a quarter octave.
            assert!(bucket_upper_us(b) as f64 <= us as f64 * 1.25 + 1.0);
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_upper_us(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn a_window_gives_its_p99_and_the_next_starts_empty() {
        let latency = ClientLatency::default();
        assert_eq!(
            latency.take().window(),
            Window {
                requests: 0,
                p99_us: 0
            }
        );
        // 990 requests at 100 µs and 10 at 8 ms: the p99 is the fast one's
        // bucket; one more slow request moves it to the slow bucket.
        for _ in 0..990 {
            latency.record(Duration::from_micros(100));
        }
        for _ in 0..10 {
            latency.record(Duration::from_millis(8));
        }
        let first = latency.take();
        let w = first.window();
        assert_eq!(w.requests, 1000);
        assert!((100..=125).contains(&w.p99_us), "{w:?}");
        for _ in 0..980 {
            latency.record(Duration::from_micros(100));
        }
        for _ in 0..20 {
            latency.record(Duration::from_millis(8));
        }
        let mut second = latency.take();
        let w = second.window();
        assert_eq!(w.requests, 1000);
        assert!((8000..=10_000).contains(&w.p99_us), "{w:?}");
        // Together, 30 slow ones in 2000: still the slow bucket.
        second.add(&first);
        assert_eq!(second.requests(), 2000);
        assert!(second.window().p99_us >= 8000);
        assert_eq!(latency.take().requests(), 0, "taken windows are emptied");
        latency.record(Duration::from_micros(3));
        assert_eq!(latency.take().requests(), 1);
    }
}
