//! The workloads: the seeds' jobs, described as phases that the generator
//! runs. Names are stable (they appear in JSON and in docs/BENCHMARKS.md).

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Workload {
    /// Seed 000's fio job: 4K random write, iodepth 32, numjobs 4.
    FioRandwrite,
    /// Seed 001's iozone run: 128K records, write, rewrite, read, reread.
    IozoneSeq,
    /// Seed 003's dd runs: 16K blocks, write then read, caches dropped
    /// before each. The requests reach the array one at a time, as
    /// `dd iflag=direct oflag=direct` sends them: the bench has no page
    /// cache, so the seed's buffered dd's write-behind is not there, and
    /// its read-ahead is uraid's own (read_ahead, which the seed tunes as
    /// the md device's `blockdev --setra`); the raw members get none.
    DdSeq,
    /// Seed 002's figure 5: 4K random read as the queue depth goes 1..128.
    RandreadQd,
    /// 1M sequential write then read (the raid0 transport target).
    Seq1m,
    /// Sequential write then read of whole stripes (the uraid array's data
    /// bytes per stripe; 1M for levels without stripes): full-stripe writes.
    SeqStripe,
    /// 4K random read at queue depth 32 (4 jobs of 8).
    Randread,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    /// Reads and writes in equal shares, each request's kind drawn at
    /// random (fio's `--rw=randrw --rwmixread=50`).
    Mixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    Random,
    Sequential,
}

/// One measured step of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub workload: Workload,
    /// "write", "rewrite", "read", "qd32", ...
    pub name: String,
    pub op: Op,
    pub pattern: Pattern,
    pub block_bytes: u64,
    /// Independent jobs (one NBD connection each).
    pub jobs: u32,
    /// Requests each job keeps in flight.
    pub depth_per_job: u32,
    /// Drop the target's caches before the phase (dd's runs do).
    pub drop_caches_before: bool,
    /// A reference measured on the raw members only, not a job for the
    /// array (the read-modify-write mix that bounds random writes).
    pub raw_only: bool,
    /// A knob uraid runs this phase with, set back afterwards: the phase
    /// measures what that setting adds, so it is uraid's only (the raw
    /// members and nbdkit have no such knob) and a parity array's (the
    /// only knob so used is the stripe cache's).
    pub setting: Option<(&'static str, &'static str)>,
}

impl Phase {
    pub fn queue_depth(&self) -> u32 {
        self.jobs * self.depth_per_job
    }
}

/// md's largest stripe cache, the setting fio-randwrite measures again
/// with (its row is the randwrite row with this setting).
pub const CACHE_MAX: (&str, &str) = ("stripe_cache_size", "32768");

/// The most requests a job keeps in flight: uraid's NBD server admits 64
/// per connection, and more per job would only queue in the socket.
pub const JOB_DEPTH_MAX: u32 = 32;

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::FioRandwrite,
        Workload::IozoneSeq,
        Workload::DdSeq,
        Workload::RandreadQd,
        Workload::Seq1m,
        Workload::SeqStripe,
        Workload::Randread,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::FioRandwrite => "fio-randwrite",
            Workload::IozoneSeq => "iozone-seq",
            Workload::DdSeq => "dd-seq",
            Workload::RandreadQd => "randread-qd",
            Workload::Seq1m => "seq-1m",
            Workload::SeqStripe => "seq-stripe",
            Workload::Randread => "randread",
        }
    }

    pub fn parse(name: &str) -> Result<Workload, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload '{name}' (known: {})", names.join(", "))
            })
    }

    /// The phases, in order. `stripe_bytes` is the array's data bytes per
    /// stripe, used by `seq-stripe` for every target so that all move the
    /// same requests.
    pub fn phases(self, stripe_bytes: u64) -> Vec<Phase> {
        let phase = |name: &str, op, pattern, block_bytes, jobs, depth_per_job| Phase {
            workload: self,
            name: name.to_string(),
            op,
            pattern,
            block_bytes,
            jobs,
            depth_per_job,
            drop_caches_before: false,
            raw_only: false,
            setting: None,
        };
        use Op::*;
        use Pattern::*;
        match self {
            // A parity array's small random write is, on its members, a
            // read-modify-write: as many reads as writes (raid6: three of
            // each). What the raw members do under that mix, a sixth of it,
            // is what bounds raid6 where reads and writes cost the device
            // differently; the raw write rate alone assumes they cost the
            // same. The same writes again with md's largest stripe cache
            // say how far above that bound the cache gets (hot parity
            // spares two of the three reads).
            Workload::FioRandwrite => vec![
                phase("randwrite", Write, Random, 4096, 4, 32),
                Phase {
                    setting: Some(CACHE_MAX),
                    ..phase("randwrite", Write, Random, 4096, 4, 32)
                },
                Phase {
                    raw_only: true,
                    ..phase("rmw-mix", Mixed, Random, 4096, 4, 32)
                },
            ],
            // iozone -t 1 is one synchronous thread, but it writes through
            // the page cache, whose write-behind and read-ahead keep the
            // device busy: a depth of 8 stands in for that.
            Workload::IozoneSeq => ["write", "rewrite", "read", "reread"]
                .into_iter()
                .map(|name| {
                    let op = if name.contains("write") { Write } else { Read };
                    phase(name, op, Sequential, 128 << 10, 1, 8)
                })
                .collect(),
            Workload::DdSeq => ["write", "read"]
                .into_iter()
                .map(|name| Phase {
                    drop_caches_before: true,
                    ..phase(
                        name,
                        if name == "write" { Write } else { Read },
                        Sequential,
                        16 << 10,
                        1,
                        1,
                    )
                })
                .collect(),
            Workload::RandreadQd => (0..8)
                .map(|i| {
                    let depth = 1u32 << i;
                    let jobs = depth.min(4);
                    phase(
                        &format!("qd{depth}"),
                        Read,
                        Random,
                        4096,
                        jobs,
                        depth / jobs,
                    )
                })
                .collect(),
            Workload::Seq1m => vec![
                phase("write", Write, Sequential, 1 << 20, 4, 4),
                phase("read", Read, Sequential, 1 << 20, 4, 4),
            ],
            Workload::SeqStripe => vec![
                phase("write", Write, Sequential, stripe_bytes, 4, 4),
                phase("read", Read, Sequential, stripe_bytes, 4, 4),
            ],
            Workload::Randread => vec![phase("randread", Read, Random, 4096, 4, 8)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_phases_are_sane() {
        for w in Workload::ALL {
            assert_eq!(Workload::parse(w.name()), Ok(w));
            for p in w.phases(384 << 10) {
                assert!(p.jobs >= 1 && p.depth_per_job >= 1);
                assert!(p.depth_per_job <= JOB_DEPTH_MAX);
                assert!(p.block_bytes % 4096 == 0);
            }
        }
        assert!(Workload::parse("fio").is_err());
        let qd: Vec<u32> = Workload::RandreadQd
            .phases(0)
            .iter()
            .map(Phase::queue_depth)
            .collect();
        assert_eq!(qd, [1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(Workload::FioRandwrite.phases(0)[0].queue_depth(), 128);
        // Only a raw reference mixes reads and writes: the NBD pipeline
        // carries one kind of request.
        for w in Workload::ALL {
            for p in w.phases(384 << 10) {
                assert_eq!(p.op == Op::Mixed, p.raw_only, "{}", p.name);
                assert!(!(p.raw_only && p.setting.is_some()), "{}", p.name);
            }
        }
    }
}
