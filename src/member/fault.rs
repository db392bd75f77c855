//! Fault injection: a member wrapper that fails the way real drives do, and
//! whose faults can be changed while I/O runs.
//!
//! Failures, rebuild and the degradation rules can only be trusted if they are
//! exercised against members that really fail, at any moment, under load. So a
//! `FaultyMember` wraps any member and applies a [`FaultPlan`]: a pulled drive
//! (ENODEV, like a SCSI device deleted from sysfs), an offline drive that comes
//! back (EIO, like `echo offline > .../device/state` and later `running`), bad
//! sectors that stay bad until rewritten, random errors at a seeded rate, added
//! latency, a bandwidth and IOPS limit (a slow or worn drive), torn writes,
//! a hang (I/O that never returns until the fault is lifted, as a device
//! behind a dead network path or a wedged controller), silent corruption
//! (wrong bytes with no error: a garbled read or write path, or bit rot on
//! the medium), and a volatile write cache that a `crash()` empties.
//!
//! Every change is described by a [`Fault`], which is plain serde data (so the
//! control socket can carry it as JSON) and also has a compact command-line
//! syntax (`pull`, `offline:2s`, `eio:read:1M+64K`, `latency:5ms`, ...):
//!
//! ```text
//! pull | restore
//! offline[:DURATION]                             no duration: until restored
//! hang[:read|write|both] | hang:off              I/O blocks until lifted (off, restore)
//! eio[:read|write|both]:OFFSET+LEN[:noremap]     bad sectors
//! eio-rate:P[:read|write|both][:seed=N]          0 <= P <= 1; eio-rate:0 clears
//! latency:DURATION[:jitter=DURATION][:read|write|both]
//! throttle:RATE[:iops=N][:burst=DURATION]        bytes/s, reads and writes together
//! throttle:iops=N | throttle:off                 off lifts it
//! throttle:[RATE:]model=NAME                     the rate falls over the member as NAME's does
//! torn[:WRITES][:keep=BLOCKS]                    the next WRITES writes (default 1)
//! write-cache[:on|off][:capacity=SIZE]
//! crash[:KEEP]                                   keep each unflushed block with P=KEEP
//! corrupt[:read]:OFFSET+LEN[:seed=N]             reads return wrong bytes, no error; medium untouched
//! corrupt:write:OFFSET+LEN[:seed=N]              writes store wrong bytes and succeed
//! corrupt:stored:OFFSET+LEN[:seed=N]             one shot: the bytes held now go wrong (bit rot)
//! heal[:OFFSET+LEN]                              clear bad and corrupt ranges (there, or all)
//! ```
//!
//! Options after the kind go in any order. Sizes are bytes with an optional
//! K, M, G, T or s (512-byte sectors) suffix; durations take us, ms, s or m.
//! `Display` writes the canonical form, which parses back to the same fault.
//!
//! The hot path takes one read lock on the plan; the write lock is only taken
//! when a fault consumes itself (a torn write) or heals (a rewritten bad
//! sector), and the cache mutex only while the cache holds data.

use super::model::ModelName;
use super::throttle::{Pacer, ThrottleLimits};
use super::{check_io, Member, MemberRef};
use crate::units::{format_bytes, format_us, parse_bytes, parse_duration_us};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, Instant};

/// The volatile write cache holds this much unless a fault says otherwise;
/// past it, the wrapper writes the cache back, as a drive destages when full.
pub const DEFAULT_WRITE_CACHE_BYTES: u64 = 64 << 20;
/// Upper bound of a cache, so a typo cannot make the wrapper hold gigabytes.
pub const WRITE_CACHE_BYTES_MAX: u64 = 1 << 30;
/// Upper bound of injected latency (fixed plus jitter): longer than this is a
/// hang, which is a different fault, and a bound keeps a typo from stalling a
/// test for hours.
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Upper bound of the number of bad ranges, so that the per-I/O scan stays cheap.
pub const BAD_RANGES_MAX: usize = 4096;
/// Upper bound of the number of corrupt ranges (read and write ones together),
/// for the same reason.
pub const CORRUPT_RANGES_MAX: usize = 4096;
/// Bytes a `corrupt:stored` fault reads and rewrites at a time; bounds its
/// buffer whatever the range.
const CORRUPT_STORED_RUN_BYTES: u64 = 1 << 20;
/// Blocks written back in one inner write when the cache is destaged; bounds
/// the staging buffer.
const DESTAGE_RUN_BYTES_MAX: usize = 1 << 20;

/// Which I/Os a fault applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ops {
    Read,
    Write,
    #[default]
    Both,
}

impl Ops {
    fn covers(self, dir: Dir) -> bool {
        matches!(
            (self, dir),
            (Ops::Both, _) | (Ops::Read, Dir::Read) | (Ops::Write, Dir::Write)
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Ops::Read => "read",
            Ops::Write => "write",
            Ops::Both => "both",
        }
    }

    fn parse(word: &str) -> Option<Ops> {
        match word {
            "read" | "reads" | "r" => Some(Ops::Read),
            "write" | "writes" | "w" => Some(Ops::Write),
            "both" | "rw" => Some(Ops::Both),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_both(ops: &Ops) -> bool {
    *ops == Ops::Both
}

/// A drive that stops answering for a while, then comes back on its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offline {
    /// How long, in milliseconds; `None` keeps it offline until restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

/// A member whose I/O never comes back: every I/O the fault covers (flushes
/// and discards count as writes) blocks until the fault is lifted, then goes
/// on as if nothing happened. `lift` lifts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hang {
    #[serde(default, skip_serializing_if = "is_both")]
    pub ops: Ops,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lift: bool,
}

/// Bad sectors: I/O touching the range fails with EIO.
///
/// A range that fails reads only is a pending sector: a write over it
/// succeeds and, with `remap`, heals the blocks written, as a drive remaps a
/// sector on write. A range that fails writes is a drive out of spare sectors
/// and never heals by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadRange {
    #[serde(rename = "offset")]
    pub offset_bytes: u64,
    #[serde(rename = "len")]
    pub len_bytes: u64,
    #[serde(default, skip_serializing_if = "is_both")]
    pub ops: Ops,
    #[serde(default = "yes")]
    pub remap: bool,
}

impl BadRange {
    fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.len_bytes
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.offset_bytes < end && start < self.end_bytes()
    }
}

/// Which path a `corrupt` fault garbles. Not `Ops`: a fault on reads and
/// writes both would XOR the same mask twice and hand back the right bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorruptMode {
    /// Reads of the range return wrong bytes; the medium keeps the right ones.
    #[default]
    Read,
    /// Writes to the range store wrong bytes and report success.
    Write,
    /// The bytes the member holds in the range go wrong once, when the
    /// fault is applied (bit rot); nothing stays in force.
    Stored,
}

impl CorruptMode {
    pub fn name(self) -> &'static str {
        match self {
            CorruptMode::Read => "read",
            CorruptMode::Write => "write",
            CorruptMode::Stored => "stored",
        }
    }

    fn parse(word: &str) -> Option<CorruptMode> {
        match word {
            "read" | "reads" | "r" => Some(CorruptMode::Read),
            "write" | "writes" | "w" => Some(CorruptMode::Write),
            "stored" | "store" => Some(CorruptMode::Stored),
            _ => None,
        }
    }

    /// Mixed into the masks, so that bytes garbled on two paths with one
    /// seed (written through a `write` range and read through a `read` one,
    /// or rotten and then read through one) stay wrong instead of cancelling.
    fn salt(self) -> u64 {
        match self {
            CorruptMode::Read => 0x243F_6A88_85A3_08D3,
            CorruptMode::Write => 0x1319_8A2E_0370_7344,
            CorruptMode::Stored => 0xA409_3822_299F_31D0,
        }
    }
}

/// Silent corruption: the bytes of the range come back, or go down, wrong,
/// and no error says so.
///
/// The wrong byte at member offset `o` is the right one XOR a nonzero mask
/// byte drawn from the seed, the mode and `o`. It depends on the offset, not
/// on when or how often the range is read: every read of a `read` range
/// returns the same wrong bytes, every byte of the range is wrong, and a
/// seed replays a run exactly. Two members garbled with one seed at the
/// same offsets get the same masks, which parity cannot tell apart from
/// other errors: give each its own seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorruptRange {
    #[serde(rename = "offset")]
    pub offset_bytes: u64,
    #[serde(rename = "len")]
    pub len_bytes: u64,
    #[serde(default)]
    pub mode: CorruptMode,
    /// `None`: the member's injector seed, or a fixed one if it has none.
    /// A range in a member's plan holds the seed it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// A byte range in a plan that heals and rewrites can cut pieces out of.
trait Extent: Copy {
    fn start_bytes(&self) -> u64;
    fn stop_bytes(&self) -> u64;
    /// The same range, narrowed to `[start, end)`.
    fn narrowed(&self, start: u64, end: u64) -> Self;
}

impl Extent for BadRange {
    fn start_bytes(&self) -> u64 {
        self.offset_bytes
    }

    fn stop_bytes(&self) -> u64 {
        self.end_bytes()
    }

    fn narrowed(&self, start: u64, end: u64) -> BadRange {
        BadRange {
            offset_bytes: start,
            len_bytes: end - start,
            ..*self
        }
    }
}

impl Extent for CorruptRange {
    fn start_bytes(&self) -> u64 {
        self.offset_bytes
    }

    fn stop_bytes(&self) -> u64 {
        self.offset_bytes + self.len_bytes
    }

    fn narrowed(&self, start: u64, end: u64) -> CorruptRange {
        CorruptRange {
            offset_bytes: start,
            len_bytes: end - start,
            ..*self
        }
    }
}

/// Random EIO: each I/O the fault covers fails with probability `rate`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EioRate {
    pub rate: f64,
    #[serde(default, skip_serializing_if = "is_both")]
    pub ops: Ops,
    /// Reseeds the draws, so that a run can be replayed from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Added service time per I/O: `delay_us` plus a uniform draw in
/// `0..=jitter_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    #[serde(rename = "us")]
    pub delay_us: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub jitter_us: u64,
    #[serde(default, skip_serializing_if = "is_both")]
    pub ops: Ops,
}

/// Torn writes: each of the next `writes` writes persists only a prefix of
/// whole logical blocks, then fails with EIO. The prefix is `keep_blocks`
/// long (the whole write if shorter, which models a lost acknowledgement), or
/// a seeded draw in `0..blocks` when `keep_blocks` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Torn {
    #[serde(default = "one")]
    pub writes: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_blocks: Option<u64>,
}

/// A volatile write cache: writes land in the wrapper and reach the inner
/// member only on flush (or when the cache is full), so `crash()` can lose
/// them. Turning it off writes the cache back and flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteCache {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(rename = "capacity", default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
}

/// Loses the write cache as a power cut would, keeping each unflushed block
/// with probability `keep` (seeded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Crash {
    #[serde(default)]
    pub keep: f64,
}

/// Clears bad and corrupt ranges: those overlapping the range (the overlap
/// only), or all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heal {
    #[serde(rename = "offset", default, skip_serializing_if = "Option::is_none")]
    pub offset_bytes: Option<u64>,
    #[serde(rename = "len", default, skip_serializing_if = "Option::is_none")]
    pub len_bytes: Option<u64>,
}

/// One change to a member's faults. Serialized as JSON with one key naming
/// the fault (`{"pull":{}}`, `{"offline":{"ms":2000}}`, `{"eio":{"offset":0,
/// "len":4096,"ops":"read"}}`, `{"corrupt":{"offset":0,"len":4096,"mode":"read",
/// "seed":7}}`, `{"latency":{"us":5000}}`, `{"restore":{}}`);
/// written and parsed in the command-line syntax by `Display` and `FromStr`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// Every I/O fails with ENODEV until restored; the write cache is lost,
    /// as a pulled drive loses power.
    Pull {},
    Offline(Offline),
    /// I/O blocks until lifted (`hang:off` or `restore`): no error, no answer.
    Hang(Hang),
    Eio(BadRange),
    EioRate(EioRate),
    Latency(Latency),
    /// A bandwidth and IOPS limit for reads and writes together, as a slow
    /// drive has; unlimited lifts it.
    Throttle(ThrottleLimits),
    Torn(Torn),
    WriteCache(WriteCache),
    Crash(Crash),
    /// Wrong bytes without an error (see `CorruptRange`). A `stored` one
    /// changes the member's bytes when applied and keeps no entry, as
    /// `crash` does.
    Corrupt(CorruptRange),
    Heal(Heal),
    /// Clears every fault (pull, offline, hang, bad and corrupt ranges,
    /// rate, latency, throttle, torn). Bytes a `corrupt:stored` or
    /// `corrupt:write` fault changed stay changed: they are data now.
    /// The write cache setting stays: it is how the drive is built, not a
    /// fault.
    Restore {},
}

const FAULT_KINDS: &str = "pull, offline, hang, eio, eio-rate, latency, throttle, torn, \
     write-cache, crash, corrupt, heal or restore";

impl Fault {
    /// Checks values that are wrong whatever the member (a rate above 1, an
    /// empty range); `FaultyMember::apply` also checks them against the member.
    pub fn check(&self) -> Result<(), String> {
        let fraction = |name: &str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(format!("{name} {value} is not between 0 and 1"))
            }
        };
        let range = |offset: u64, len: u64| {
            if len == 0 {
                Err("the range is empty".to_string())
            } else if offset.checked_add(len).is_none() {
                Err("the range overflows".to_string())
            } else {
                Ok(())
            }
        };
        match self {
            Fault::Eio(r) => range(r.offset_bytes, r.len_bytes),
            Fault::Corrupt(r) => range(r.offset_bytes, r.len_bytes),
            Fault::EioRate(r) => fraction("rate", r.rate),
            Fault::Crash(c) => fraction("keep", c.keep),
            Fault::Latency(l) => match l.delay_us.checked_add(l.jitter_us) {
                Some(total) if total <= LATENCY_US_MAX => Ok(()),
                _ => Err(format!(
                    "latency above {} is a hang, not a latency",
                    format_us(LATENCY_US_MAX)
                )),
            },
            Fault::Throttle(limits) => limits.check(),
            Fault::WriteCache(w) => match w.capacity_bytes {
                Some(0) => Err("the cache capacity is zero".to_string()),
                Some(c) if c > WRITE_CACHE_BYTES_MAX => Err(format!(
                    "the cache capacity is above {}",
                    format_bytes(WRITE_CACHE_BYTES_MAX)
                )),
                _ => Ok(()),
            },
            Fault::Heal(h) => match (h.offset_bytes, h.len_bytes) {
                (None, None) => Ok(()),
                (Some(offset), Some(len)) => range(offset, len),
                _ => Err("heal needs both offset and len, or neither".to_string()),
            },
            Fault::Pull {}
            | Fault::Offline(_)
            | Fault::Hang(_)
            | Fault::Torn(_)
            | Fault::Restore {} => Ok(()),
        }
    }

    /// Parses a comma-separated list (`pull,latency:5ms`), for options that
    /// take several faults at once.
    pub fn parse_list(text: &str) -> Result<Vec<Fault>, String> {
        text.split(',')
            .filter(|item| !item.trim().is_empty())
            .map(str::parse)
            .collect()
    }
}

impl fmt::Display for Fault {
    /// The canonical command-line form; `parse` reads it back to the same fault.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = |ops: Ops| match ops {
            Ops::Both => String::new(),
            other => format!(":{}", other.name()),
        };
        match self {
            Fault::Pull {} => write!(f, "pull"),
            Fault::Restore {} => write!(f, "restore"),
            Fault::Offline(Offline { ms: None }) => write!(f, "offline"),
            Fault::Offline(Offline { ms: Some(ms) }) => {
                write!(f, "offline:{}", format_us(ms.saturating_mul(1000)))
            }
            Fault::Hang(Hang { lift: true, .. }) => write!(f, "hang:off"),
            Fault::Hang(h) => write!(f, "hang{}", ops(h.ops)),
            Fault::Eio(r) => write!(
                f,
                "eio{}:{}+{}{}",
                ops(r.ops),
                format_bytes(r.offset_bytes),
                format_bytes(r.len_bytes),
                if r.remap { "" } else { ":noremap" }
            ),
            Fault::EioRate(r) => {
                write!(f, "eio-rate:{}{}", r.rate, ops(r.ops))?;
                match r.seed {
                    Some(seed) => write!(f, ":seed={seed}"),
                    None => Ok(()),
                }
            }
            Fault::Latency(l) => {
                write!(f, "latency:{}", format_us(l.delay_us))?;
                if l.jitter_us > 0 {
                    write!(f, ":jitter={}", format_us(l.jitter_us))?;
                }
                write!(f, "{}", ops(l.ops))
            }
            Fault::Throttle(limits) if limits.is_unlimited() => write!(f, "throttle:off"),
            Fault::Throttle(limits) => {
                write!(f, "throttle")?;
                if let Some(bw) = limits.bytes_per_s {
                    write!(f, ":{}", format_bytes(bw))?;
                }
                if let Some(iops) = limits.iops {
                    write!(f, ":iops={iops}")?;
                }
                if limits.burst_ms != ThrottleLimits::UNLIMITED.burst_ms {
                    write!(f, ":burst={}", format_us(limits.burst_ms * 1000))?;
                }
                match limits.model {
                    Some(model) => write!(f, ":model={}", model.0),
                    None => Ok(()),
                }
            }
            Fault::Torn(t) => {
                write!(f, "torn")?;
                if t.writes != 1 {
                    write!(f, ":{}", t.writes)?;
                }
                match t.keep_blocks {
                    Some(keep) => write!(f, ":keep={keep}"),
                    None => Ok(()),
                }
            }
            Fault::WriteCache(w) => {
                write!(f, "write-cache:{}", if w.enabled { "on" } else { "off" })?;
                match w.capacity_bytes {
                    Some(c) => write!(f, ":capacity={}", format_bytes(c)),
                    None => Ok(()),
                }
            }
            Fault::Crash(c) if c.keep == 0.0 => write!(f, "crash"),
            Fault::Crash(c) => write!(f, "crash:{}", c.keep),
            Fault::Corrupt(r) => {
                // The mode is always written: `corrupt:1M+4K` in a status
                // line would leave the reader guessing which path lies.
                write!(
                    f,
                    "corrupt:{}:{}+{}",
                    r.mode.name(),
                    format_bytes(r.offset_bytes),
                    format_bytes(r.len_bytes)
                )?;
                match r.seed {
                    Some(seed) => write!(f, ":seed={seed}"),
                    None => Ok(()),
                }
            }
            Fault::Heal(Heal {
                offset_bytes: Some(offset),
                len_bytes: Some(len),
            }) => write!(f, "heal:{}+{}", format_bytes(*offset), format_bytes(*len)),
            Fault::Heal(_) => write!(f, "heal"),
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    /// Parses `KIND[:ARG]...`; the error is one line naming the input.
    fn from_str(text: &str) -> Result<Fault, String> {
        let fault =
            parse_fault(text.trim()).map_err(|why| format!("invalid fault '{text}': {why}"))?;
        fault
            .check()
            .map_err(|why| format!("invalid fault '{text}': {why}"))?;
        Ok(fault)
    }
}

/// One argument of the compact syntax: `key=value` or a bare word.
enum Arg<'a> {
    Word(&'a str),
    Key(&'a str, &'a str),
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    let mut parts = text.split(':');
    let kind = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let args: Vec<Arg> = parts
        .map(str::trim)
        .map(|part| match part.split_once('=') {
            Some((key, value)) => Arg::Key(key.trim(), value.trim()),
            None => Arg::Word(part),
        })
        .collect();
    match kind.replace('_', "-").as_str() {
        "pull" => no_args(&args).map(|()| Fault::Pull {}),
        "restore" => no_args(&args).map(|()| Fault::Restore {}),
        "offline" => parse_offline(&args),
        "hang" => parse_hang(&args),
        "eio" => parse_eio(&args),
        "eio-rate" => parse_eio_rate(&args),
        "latency" => parse_latency(&args),
        "throttle" => parse_throttle(&args),
        "torn" => parse_torn(&args),
        "write-cache" | "cache" => parse_write_cache(&args),
        "crash" => parse_crash(&args),
        "corrupt" => parse_corrupt(&args),
        "heal" => parse_heal(&args),
        "" => Err(format!("no fault given (expected {FAULT_KINDS})")),
        other => Err(format!("unknown fault '{other}' (expected {FAULT_KINDS})")),
    }
}

fn unexpected(arg: &Arg) -> String {
    match arg {
        Arg::Word(word) => format!("unexpected argument '{word}'"),
        Arg::Key(key, _) => format!("unknown option '{key}'"),
    }
}

fn no_args(args: &[Arg]) -> Result<(), String> {
    match args.first() {
        Some(arg) => Err(unexpected(arg)),
        None => Ok(()),
    }
}

/// Stores the one positional value of a fault, refusing a second.
fn positional<'a>(slot: &mut Option<&'a str>, word: &'a str) -> Result<(), String> {
    if slot.replace(word).is_some() {
        return Err(format!("unexpected argument '{word}'"));
    }
    Ok(())
}

fn parse_offline(args: &[Arg]) -> Result<Fault, String> {
    let mut duration = None;
    for arg in args {
        match arg {
            Arg::Word(word) => positional(&mut duration, word)?,
            other => return Err(unexpected(other)),
        }
    }
    let ms = duration
        .map(|text| parse_duration_us(text).map(|us| us.div_ceil(1000)))
        .transpose()?;
    Ok(Fault::Offline(Offline { ms }))
}

fn parse_hang(args: &[Arg]) -> Result<Fault, String> {
    let mut hang = Hang::default();
    for arg in args {
        match arg {
            Arg::Word("off" | "lift") => hang.lift = true,
            Arg::Word(word) => match Ops::parse(word) {
                Some(o) => hang.ops = o,
                None => return Err(unexpected(arg)),
            },
            other => return Err(unexpected(other)),
        }
    }
    Ok(Fault::Hang(hang))
}

fn parse_eio(args: &[Arg]) -> Result<Fault, String> {
    let (mut ops, mut remap, mut range) = (Ops::Both, true, None);
    for arg in args {
        match arg {
            Arg::Word("noremap") => remap = false,
            Arg::Word("remap") => remap = true,
            Arg::Word(word) => match Ops::parse(word) {
                Some(o) => ops = o,
                None => positional(&mut range, word)?,
            },
            other => return Err(unexpected(other)),
        }
    }
    let range = range.ok_or("eio needs a range OFFSET+LEN, e.g. eio:read:1M+64K")?;
    let (offset_bytes, len_bytes) = parse_range(range)?;
    Ok(Fault::Eio(BadRange {
        offset_bytes,
        len_bytes,
        ops,
        remap,
    }))
}

fn parse_eio_rate(args: &[Arg]) -> Result<Fault, String> {
    let (mut ops, mut seed, mut rate) = (Ops::Both, None, None);
    for arg in args {
        match arg {
            Arg::Key("seed", value) => seed = Some(parse_u64("seed", value)?),
            Arg::Word(word) => match Ops::parse(word) {
                Some(o) => ops = o,
                None => positional(&mut rate, word)?,
            },
            other => return Err(unexpected(other)),
        }
    }
    let rate = rate.ok_or("eio-rate needs a probability, e.g. eio-rate:0.01")?;
    Ok(Fault::EioRate(EioRate {
        rate: parse_fraction("rate", rate)?,
        ops,
        seed,
    }))
}

fn parse_latency(args: &[Arg]) -> Result<Fault, String> {
    let (mut ops, mut jitter_us, mut delay) = (Ops::Both, 0, None);
    for arg in args {
        match arg {
            Arg::Key("jitter", value) => jitter_us = parse_duration_us(value)?,
            Arg::Word(word) => match Ops::parse(word) {
                Some(o) => ops = o,
                None => positional(&mut delay, word)?,
            },
            other => return Err(unexpected(other)),
        }
    }
    let delay = delay.ok_or("latency needs a duration, e.g. latency:5ms")?;
    Ok(Fault::Latency(Latency {
        delay_us: parse_duration_us(delay)?,
        jitter_us,
        ops,
    }))
}

fn parse_throttle(args: &[Arg]) -> Result<Fault, String> {
    let (mut limits, mut rate, mut off) = (ThrottleLimits::UNLIMITED, None, false);
    for arg in args {
        match arg {
            Arg::Word("off" | "none" | "unlimited") => off = true,
            Arg::Key("iops", value) => limits.iops = Some(parse_u64("iops", value)?),
            Arg::Key("burst", value) => limits.burst_ms = parse_duration_us(value)?.div_ceil(1000),
            Arg::Key("model", value) => limits.model = Some(ModelName::parse(value)?),
            Arg::Key("bw" | "rate", value) | Arg::Word(value) => positional(&mut rate, value)?,
            other => return Err(unexpected(other)),
        }
    }
    if let Some(rate) = rate {
        let bytes = rate.strip_suffix("/s").unwrap_or(rate);
        limits.bytes_per_s = Some(parse_bytes(bytes)?);
    }
    if off {
        return match limits.is_unlimited() {
            true => Ok(Fault::Throttle(ThrottleLimits::UNLIMITED)),
            false => Err("throttle:off takes no rate".to_string()),
        };
    }
    if limits.bytes_per_s == Some(0) || limits.iops == Some(0) {
        return Err("a limit of 0 would stop all I/O (throttle:off lifts a throttle)".into());
    }
    if limits.is_unlimited() {
        return Err(
            "throttle needs a rate in bytes per second (throttle:50M), a device model \
             (throttle:model=hdd-14t), or off"
                .into(),
        );
    }
    Ok(Fault::Throttle(limits))
}

fn parse_torn(args: &[Arg]) -> Result<Fault, String> {
    let (mut writes, mut keep_blocks) = (None, None);
    for arg in args {
        match arg {
            Arg::Key("keep", value) => keep_blocks = Some(parse_u64("keep", value)?),
            Arg::Word(word) => positional(&mut writes, word)?,
            other => return Err(unexpected(other)),
        }
    }
    let writes = match writes {
        None => 1,
        Some(text) => {
            let count = parse_u64("write count", text)?;
            u32::try_from(count).map_err(|_| format!("write count {count} is too large"))?
        }
    };
    Ok(Fault::Torn(Torn {
        writes,
        keep_blocks,
    }))
}

fn parse_write_cache(args: &[Arg]) -> Result<Fault, String> {
    let (mut enabled, mut capacity_bytes) = (true, None);
    for arg in args {
        match arg {
            Arg::Key("capacity", value) => capacity_bytes = Some(parse_bytes(value)?),
            Arg::Word("on") => enabled = true,
            Arg::Word("off") => enabled = false,
            other => return Err(unexpected(other)),
        }
    }
    Ok(Fault::WriteCache(WriteCache {
        enabled,
        capacity_bytes,
    }))
}

fn parse_crash(args: &[Arg]) -> Result<Fault, String> {
    let mut keep = None;
    for arg in args {
        match arg {
            Arg::Key("keep", value) | Arg::Word(value) => positional(&mut keep, value)?,
            other => return Err(unexpected(other)),
        }
    }
    let keep = keep.map(|k| parse_fraction("keep", k)).transpose()?;
    Ok(Fault::Crash(Crash {
        keep: keep.unwrap_or(0.0),
    }))
}

fn parse_corrupt(args: &[Arg]) -> Result<Fault, String> {
    let (mut mode, mut seed, mut range) = (CorruptMode::Read, None, None);
    for arg in args {
        match arg {
            Arg::Key("seed", value) => seed = Some(parse_u64("seed", value)?),
            Arg::Word(word) => match CorruptMode::parse(word) {
                Some(m) => mode = m,
                None => positional(&mut range, word)?,
            },
            other => return Err(unexpected(other)),
        }
    }
    let range = range.ok_or("corrupt needs a range OFFSET+LEN, e.g. corrupt:read:1M+4K")?;
    let (offset_bytes, len_bytes) = parse_range(range)?;
    Ok(Fault::Corrupt(CorruptRange {
        offset_bytes,
        len_bytes,
        mode,
        seed,
    }))
}

fn parse_heal(args: &[Arg]) -> Result<Fault, String> {
    let mut range = None;
    for arg in args {
        match arg {
            Arg::Word(word) => positional(&mut range, word)?,
            other => return Err(unexpected(other)),
        }
    }
    let (offset_bytes, len_bytes) = match range {
        Some(text) => parse_range(text).map(|(o, l)| (Some(o), Some(l)))?,
        None => (None, None),
    };
    Ok(Fault::Heal(Heal {
        offset_bytes,
        len_bytes,
    }))
}

fn parse_u64(name: &str, text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{name} '{text}' is not a whole number"))
}

fn parse_fraction(name: &str, text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!("{name} '{text}' is not a number between 0 and 1")),
    }
}

/// `OFFSET+LEN`, both sizes in bytes.
fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let (offset, len) = text
        .split_once('+')
        .ok_or_else(|| format!("range '{text}' is not OFFSET+LEN, e.g. 1M+64K"))?;
    Ok((parse_bytes(offset)?, parse_bytes(len)?))
}

/// When an offline member comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfflineUntil {
    Restored,
    Deadline(Instant),
}

impl OfflineUntil {
    fn active(self, now: Instant) -> bool {
        match self {
            OfflineUntil::Restored => true,
            OfflineUntil::Deadline(deadline) => now < deadline,
        }
    }
}

/// The faults in force on a member. `Fault`s change it; it can also be built
/// directly and installed with `FaultyMember::set_plan`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    pub pulled: bool,
    pub offline: Option<OfflineUntil>,
    /// Which I/Os block until the hang is lifted.
    pub hang: Option<Ops>,
    /// Block-aligned (rounded outwards when added).
    pub bad_ranges: Vec<BadRange>,
    /// `read` and `write` corrupt ranges, block-aligned like bad ranges;
    /// ranges of one mode never overlap (a newer one replaces the older where
    /// they meet), so no byte is masked twice on one path. `stored` entries
    /// do nothing here.
    pub corrupt_ranges: Vec<CorruptRange>,
    pub eio_rate: Option<EioRate>,
    pub latency: Option<Latency>,
    /// `Some` while a bandwidth or IOPS limit is in force (never unlimited).
    pub throttle: Option<ThrottleLimits>,
    pub torn: Option<Torn>,
    /// `Some` while the volatile write cache is on.
    pub write_cache: Option<WriteCache>,
}

impl FaultPlan {
    /// Clears every fault, keeping the write cache setting.
    pub fn restore(&mut self) {
        *self = FaultPlan {
            write_cache: self.write_cache,
            ..FaultPlan::default()
        };
    }

    /// The plan as the faults that would rebuild it (an offline member with
    /// the time it has left), for status output and the control socket.
    pub fn faults(&self, now: Instant) -> Vec<Fault> {
        let mut faults = Vec::new();
        if self.pulled {
            faults.push(Fault::Pull {});
        }
        match self.offline {
            Some(OfflineUntil::Restored) => faults.push(Fault::Offline(Offline { ms: None })),
            Some(OfflineUntil::Deadline(deadline)) if now < deadline => {
                let left_ms = (deadline - now).as_micros().div_ceil(1000);
                faults.push(Fault::Offline(Offline {
                    ms: Some(u64::try_from(left_ms).unwrap_or(u64::MAX)),
                }));
            }
            _ => {}
        }
        faults.extend(self.hang.map(|ops| Fault::Hang(Hang { ops, lift: false })));
        faults.extend(self.bad_ranges.iter().copied().map(Fault::Eio));
        faults.extend(
            self.corrupt_ranges
                .iter()
                .filter(|r| r.mode != CorruptMode::Stored)
                .copied()
                .map(Fault::Corrupt),
        );
        faults.extend(self.eio_rate.map(Fault::EioRate));
        faults.extend(self.latency.map(Fault::Latency));
        faults.extend(self.throttle.map(Fault::Throttle));
        faults.extend(self.torn.map(Fault::Torn));
        faults.extend(self.write_cache.map(Fault::WriteCache));
        faults
    }
}

/// What `crash` did to the write cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CrashReport {
    /// Unflushed blocks that reached the inner member anyway.
    pub kept_blocks: u64,
    /// Unflushed blocks lost.
    pub lost_blocks: u64,
}

/// Counts of I/Os seen and faults injected since the wrapper was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounters {
    pub reads: u64,
    pub writes: u64,
    /// Writes with FUA (also counted in `writes`).
    pub fua_writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// I/Os refused because the member was pulled.
    pub pulled_errors: u64,
    /// I/Os refused because the member was offline.
    pub offline_errors: u64,
    /// I/Os that touched a bad range.
    pub bad_range_errors: u64,
    /// I/Os failed by the random rate.
    pub random_errors: u64,
    /// Writes torn (each also failed).
    pub torn_writes: u64,
    /// I/Os given added latency, and the latency added.
    pub delayed_ios: u64,
    pub delay_us: u64,
    /// I/Os that met a hang and waited for it to be lifted.
    pub hung_ios: u64,
    /// Bad-range bytes healed by writes.
    pub healed_bytes: u64,
    /// Reads and writes that a corrupt range garbled (they succeeded: not
    /// in `errors_injected`), and the bytes garbled by them and by
    /// `corrupt:stored`.
    pub corrupted_reads: u64,
    pub corrupted_writes: u64,
    pub corrupted_bytes: u64,
    pub crashes: u64,
    pub crash_lost_blocks: u64,
    pub crash_kept_blocks: u64,
}

impl FaultCounters {
    /// Every I/O that failed because of an injected fault.
    pub fn errors_injected(&self) -> u64 {
        self.pulled_errors
            + self.offline_errors
            + self.bad_range_errors
            + self.random_errors
            + self.torn_writes
    }
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    pulled_errors: AtomicU64,
    offline_errors: AtomicU64,
    bad_range_errors: AtomicU64,
    random_errors: AtomicU64,
    torn_writes: AtomicU64,
    delayed_ios: AtomicU64,
    delay_us: AtomicU64,
    hung_ios: AtomicU64,
    healed_bytes: AtomicU64,
    corrupted_reads: AtomicU64,
    corrupted_writes: AtomicU64,
    corrupted_bytes: AtomicU64,
    crashes: AtomicU64,
    crash_lost_blocks: AtomicU64,
    crash_kept_blocks: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> FaultCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FaultCounters {
            reads: get(&self.reads),
            writes: get(&self.writes),
            fua_writes: get(&self.fua_writes),
            flushes: get(&self.flushes),
            discards: get(&self.discards),
            read_bytes: get(&self.read_bytes),
            written_bytes: get(&self.written_bytes),
            pulled_errors: get(&self.pulled_errors),
            offline_errors: get(&self.offline_errors),
            bad_range_errors: get(&self.bad_range_errors),
            random_errors: get(&self.random_errors),
            torn_writes: get(&self.torn_writes),
            delayed_ios: get(&self.delayed_ios),
            delay_us: get(&self.delay_us),
            hung_ios: get(&self.hung_ios),
            healed_bytes: get(&self.healed_bytes),
            corrupted_reads: get(&self.corrupted_reads),
            corrupted_writes: get(&self.corrupted_writes),
            corrupted_bytes: get(&self.corrupted_bytes),
            crashes: get(&self.crashes),
            crash_lost_blocks: get(&self.crash_lost_blocks),
            crash_kept_blocks: get(&self.crash_kept_blocks),
        }
    }
}

/// The payload of every injected error: the errno a real drive would give,
/// kept so that callers (and tests) can tell which fault hit without parsing
/// messages. The `io::Error` around it carries the kind that errno maps to.
#[derive(Debug)]
pub struct InjectedError {
    pub errno: i32,
    pub message: String,
}

impl fmt::Display for InjectedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InjectedError {}

/// The errno of an error injected by a `FaultyMember`, or `None` for any
/// other error.
pub fn injected_errno(err: &io::Error) -> Option<i32> {
    err.get_ref()?
        .downcast_ref::<InjectedError>()
        .map(|injected| injected.errno)
}

/// Unflushed writes, one entry per logical block holding its latest
/// contents: a drive's cache coalesces rewrites, and keeping whole blocks is
/// what makes "never a partially written block" hold across a crash.
#[derive(Default)]
struct BlockCache {
    dirty: BTreeMap<u64, Box<[u8]>>,
}

impl BlockCache {
    fn insert(&mut self, data: &[u8], offset_bytes: u64, block_bytes: usize) {
        let first = offset_bytes / block_bytes as u64;
        for (i, block) in data.chunks_exact(block_bytes).enumerate() {
            self.dirty.insert(first + i as u64, block.into());
        }
    }

    /// Drops cached blocks in a byte range; returns how many.
    fn remove(&mut self, offset_bytes: u64, len_bytes: u64, block_bytes: usize) -> u64 {
        let first = offset_bytes / block_bytes as u64;
        let end = (offset_bytes + len_bytes) / block_bytes as u64;
        let doomed: Vec<u64> = self.dirty.range(first..end).map(|(&b, _)| b).collect();
        for block in &doomed {
            self.dirty.remove(block);
        }
        doomed.len() as u64
    }

    /// Copies the cached blocks of a byte range over `buf`.
    fn overlay(&self, buf: &mut [u8], offset_bytes: u64, block_bytes: usize) {
        let first = offset_bytes / block_bytes as u64;
        let end = first + (buf.len() / block_bytes) as u64;
        for (&block, data) in self.dirty.range(first..end) {
            let at = (block - first) as usize * block_bytes;
            buf[at..at + block_bytes].copy_from_slice(data);
        }
    }

    /// Writes every cached block to `inner` in runs of adjacent blocks, then
    /// forgets them. On an error the cache is kept whole: rewriting a block
    /// twice is harmless, losing one is not.
    fn destage(&mut self, inner: &dyn Member, block_bytes: usize) -> io::Result<u64> {
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        let mut next = None;
        for (&block, data) in &self.dirty {
            if next != Some(block) || run.len() >= DESTAGE_RUN_BYTES_MAX {
                if !run.is_empty() {
                    inner.write_at(&run, run_start * block_bytes as u64)?;
                }
                run.clear();
                run_start = block;
            }
            run.extend_from_slice(data);
            next = Some(block + 1);
        }
        if !run.is_empty() {
            inner.write_at(&run, run_start * block_bytes as u64)?;
        }
        let destaged = self.dirty.len() as u64;
        self.dirty.clear();
        Ok(destaged)
    }
}

/// Independent random streams, so that turning on jitter does not change
/// which I/Os a seeded error rate fails.
struct Rngs {
    eio: Mutex<StdRng>,
    jitter: Mutex<StdRng>,
    torn: Mutex<StdRng>,
    crash: Mutex<StdRng>,
}

/// The random stream `n` of a seed: distinct streams of one seed are
/// unrelated, and each is the same on every run.
fn stream_rng(seed: u64, n: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

const EIO_STREAM: u64 = 1;

impl Rngs {
    fn new(seed: u64) -> Rngs {
        Rngs {
            eio: Mutex::new(stream_rng(seed, EIO_STREAM)),
            jitter: Mutex::new(stream_rng(seed, 2)),
            torn: Mutex::new(stream_rng(seed, 3)),
            crash: Mutex::new(stream_rng(seed, 4)),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere (a failed assertion in a test thread) must not turn
    // every later I/O into a second panic; the data stays consistent because
    // each critical section leaves it whole.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the plan says about one read or write.
struct Decision {
    delay: Duration,
    error: Option<io::Error>,
    /// A write overlaps a read-bad range that heals when written.
    heals: bool,
    torn: bool,
    /// The write cache's capacity when the write goes to the cache.
    cache_bytes: Option<u64>,
    /// The parts of the I/O that corrupt ranges of its direction garble.
    garbles: Vec<Garble>,
}

/// One corrupt range clipped to one I/O: member bytes `[start, end)` are
/// XORed with the masks of `key`.
#[derive(Clone, Copy, Debug)]
struct Garble {
    start: u64,
    end: u64,
    key: u64,
}

impl Garble {
    /// Garbles the part of `buf` (member bytes from `offset_bytes` on) that
    /// the spans cover; returns how many bytes that was.
    fn apply_all(spans: &[Garble], buf: &mut [u8], offset_bytes: u64) -> u64 {
        let end_bytes = offset_bytes + buf.len() as u64;
        let mut garbled = 0;
        for span in spans {
            let (start, end) = (span.start.max(offset_bytes), span.end.min(end_bytes));
            if start >= end {
                continue;
            }
            let at = (start - offset_bytes) as usize;
            xor_masks(&mut buf[at..at + (end - start) as usize], start, span.key);
            garbled += end - start;
        }
        garbled
    }
}

/// The seed of corrupt ranges on a member made without one, so that runs
/// still replay.
const UNSEEDED_CORRUPT_SEED: u64 = 0x6A09_E667_F3BC_C908;

/// A member whose faults are set at run time. See the module documentation.
pub struct FaultyMember {
    inner: MemberRef,
    plan: RwLock<FaultPlan>,
    rngs: Rngs,
    /// The seed given to `with_seed`; corrupt ranges without one use it.
    seed: Option<u64>,
    cache: Mutex<BlockCache>,
    /// Blocks in the cache, readable without its lock: reads skip the cache
    /// entirely while it is empty.
    cache_dirty_blocks: AtomicU64,
    counters: Counters,
    /// Paces reads and writes while the plan holds a throttle; its limits
    /// change only under the plan's write lock, so the two always agree.
    pacer: Pacer,
    /// Hung I/Os wait here for the plan to lift the hang (see `wait_while_hung`).
    hang_gate: Mutex<()>,
    hang_lifted: Condvar,
}

impl FaultyMember {
    /// Wraps `inner` with no faults and seed 0, so that runs are reproducible
    /// unless a seed is chosen.
    pub fn new(inner: MemberRef) -> FaultyMember {
        FaultyMember::build(inner, None)
    }

    pub fn with_seed(inner: MemberRef, seed: u64) -> FaultyMember {
        FaultyMember::build(inner, Some(seed))
    }

    fn build(inner: MemberRef, seed: Option<u64>) -> FaultyMember {
        FaultyMember {
            inner,
            plan: RwLock::new(FaultPlan::default()),
            rngs: Rngs::new(seed.unwrap_or(0)),
            seed,
            cache: Mutex::new(BlockCache::default()),
            cache_dirty_blocks: AtomicU64::new(0),
            counters: Counters::default(),
            pacer: Pacer::new(),
            hang_gate: Mutex::new(()),
            hang_lifted: Condvar::new(),
        }
    }

    pub fn inner(&self) -> &MemberRef {
        &self.inner
    }

    fn read_plan(&self) -> RwLockReadGuard<'_, FaultPlan> {
        self.plan.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_plan(&self) -> RwLockWriteGuard<'_, FaultPlan> {
        self.plan.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the faults in force.
    pub fn plan(&self) -> FaultPlan {
        self.read_plan().clone()
    }

    /// Replaces the faults in force. The cache contents are not touched: a
    /// plan without a write cache still writes back what the cache holds on
    /// the next flush.
    pub fn set_plan(&self, mut plan: FaultPlan) {
        let mut current = self.write_plan();
        let limits = plan.throttle.unwrap_or(ThrottleLimits::UNLIMITED);
        if self.pacer.set_limits(limits).is_err() {
            // A hand-built plan with a limit that would stall I/O for good:
            // run unthrottled rather than hang, and say so in the plan.
            plan.throttle = None;
            let _ = self.pacer.set_limits(ThrottleLimits::UNLIMITED);
        }
        *current = plan;
        drop(current);
        self.wake_hung();
    }

    /// The faults in force, as faults.
    pub fn faults(&self) -> Vec<Fault> {
        self.read_plan().faults(Instant::now())
    }

    pub fn counters(&self) -> FaultCounters {
        self.counters.snapshot()
    }

    /// Blocks written but not yet flushed.
    pub fn unflushed_blocks(&self) -> u64 {
        self.cache_dirty_blocks.load(Ordering::Acquire)
    }

    /// One line for status output: the faults in the command-line syntax, then
    /// the counters, e.g. `pull, latency:5ms; 120 reads, 30 writes, 7 errors
    /// injected`.
    pub fn describe(&self) -> String {
        let faults = self.faults();
        let head = if faults.is_empty() {
            "healthy".to_string()
        } else {
            faults
                .iter()
                .map(Fault::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let c = self.counters();
        let mut line = format!(
            "{head}; {} reads, {} writes, {} errors injected",
            c.reads,
            c.writes,
            c.errors_injected()
        );
        if c.torn_writes > 0 {
            line += &format!(" ({} torn writes)", c.torn_writes);
        }
        if c.hung_ios > 0 {
            line += &format!(", {} hung I/Os", c.hung_ios);
        }
        if c.corrupted_reads + c.corrupted_writes > 0 {
            line += &format!(
                ", {} corrupted reads, {} corrupted writes",
                c.corrupted_reads, c.corrupted_writes
            );
        }
        if c.delayed_ios > 0 {
            line += &format!(", {} delayed I/Os", c.delayed_ios);
        }
        let paced = self.pacer.stats();
        if paced.throttled_ios > 0 {
            line += &format!(
                ", {} throttled I/Os waited {}",
                paced.throttled_ios,
                format_us(paced.waited_us / 1000 * 1000)
            );
        }
        let dirty = self.unflushed_blocks();
        if dirty > 0 {
            line += &format!(", {dirty} unflushed blocks");
        }
        line
    }

    /// Pulls the member: see `Fault::Pull`.
    pub fn pull(&self) {
        self.apply(&Fault::Pull {}).expect("pulling cannot fail");
    }

    /// Clears every fault: see `Fault::Restore`.
    pub fn restore(&self) {
        let mut plan = self.write_plan();
        plan.restore();
        let _ = self.pacer.set_limits(ThrottleLimits::UNLIMITED);
        drop(plan);
        self.wake_hung();
    }

    /// Lets hung I/Os look at the plan again. The gate is taken after the
    /// plan changed, so a waiter that read the old plan is already waiting
    /// and gets the notification.
    fn wake_hung(&self) {
        drop(lock(&self.hang_gate));
        self.hang_lifted.notify_all();
    }

    /// Blocks while a hang covers `dir`. The unhung path costs one read of
    /// the plan.
    fn wait_while_hung(&self, dir: Dir) {
        let hung = |me: &FaultyMember| me.read_plan().hang.is_some_and(|ops| ops.covers(dir));
        if !hung(self) {
            return;
        }
        bump(&self.counters.hung_ios, 1);
        let mut gate = lock(&self.hang_gate);
        while hung(self) {
            gate = self
                .hang_lifted
                .wait(gate)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Drops every write since the last flush, as a power cut would.
    pub fn crash(&self) -> io::Result<CrashReport> {
        self.crash_keeping(0.0)
    }

    /// Like `crash`, but each unflushed block reaches the inner member with
    /// probability `keep` (a seeded draw per block, in block order, so a seed
    /// replays the same crash): a drive may have destaged any part of its
    /// cache before power went. Kept blocks are whole, never partial.
    pub fn crash_keeping(&self, keep: f64) -> io::Result<CrashReport> {
        Fault::Crash(Crash { keep })
            .check()
            .map_err(|why| invalid(self, &why))?;
        let block_bytes = self.block_usize();
        let mut cache = lock(&self.cache);
        let mut rng = lock(&self.rngs.crash);
        let mut report = CrashReport::default();
        cache.dirty.retain(|_, _| {
            let kept = keep > 0.0 && rng.gen_bool(keep);
            if kept {
                report.kept_blocks += 1;
            } else {
                report.lost_blocks += 1;
            }
            kept
        });
        drop(rng);
        let destaged = cache.destage(self.inner.as_ref(), block_bytes);
        self.cache_dirty_blocks
            .store(cache.dirty.len() as u64, Ordering::Release);
        drop(cache);
        bump(&self.counters.crashes, 1);
        bump(&self.counters.crash_lost_blocks, report.lost_blocks);
        bump(&self.counters.crash_kept_blocks, report.kept_blocks);
        destaged.map(|_| report)
    }

    /// Applies one fault. Values that make no sense (a rate above 1, a range
    /// past the end) are refused with one line and change nothing.
    pub fn apply(&self, fault: &Fault) -> io::Result<()> {
        fault.check().map_err(|why| invalid(self, &why))?;
        match fault {
            Fault::Pull {} => {
                // Refuse new I/O first, then lose the cache: a pulled drive
                // has no power, so what it had not written is gone.
                self.write_plan().pulled = true;
                self.crash_keeping(0.0).map(drop)
            }
            Fault::Restore {} => {
                self.restore();
                Ok(())
            }
            Fault::Offline(offline) => {
                let until = offline
                    .ms
                    .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)))
                    .map_or(OfflineUntil::Restored, OfflineUntil::Deadline);
                self.write_plan().offline = Some(until);
                Ok(())
            }
            Fault::Hang(hang) => {
                self.write_plan().hang = (!hang.lift).then_some(hang.ops);
                self.wake_hung();
                Ok(())
            }
            Fault::Eio(range) => self.add_bad_range(*range),
            Fault::EioRate(rate) => {
                if let Some(seed) = rate.seed {
                    *lock(&self.rngs.eio) = stream_rng(seed, EIO_STREAM);
                }
                self.write_plan().eio_rate = (rate.rate > 0.0).then_some(*rate);
                Ok(())
            }
            Fault::Latency(latency) => {
                let any = latency.delay_us > 0 || latency.jitter_us > 0;
                self.write_plan().latency = any.then_some(*latency);
                Ok(())
            }
            Fault::Throttle(limits) => {
                let mut plan = self.write_plan();
                self.pacer
                    .set_limits(*limits)
                    .map_err(|why| invalid(self, &why))?;
                plan.throttle = (!limits.is_unlimited()).then_some(*limits);
                Ok(())
            }
            Fault::Torn(torn) => {
                self.write_plan().torn = (torn.writes > 0).then_some(*torn);
                Ok(())
            }
            Fault::WriteCache(cache) if cache.enabled => {
                self.write_plan().write_cache = Some(*cache);
                Ok(())
            }
            Fault::WriteCache(_) => {
                // Like `hdparm -W0`: the drive writes its cache back first.
                self.write_plan().write_cache = None;
                self.flush_cache()
            }
            Fault::Crash(crash) => self.crash_keeping(crash.keep).map(drop),
            Fault::Corrupt(range) if range.mode == CorruptMode::Stored => {
                self.corrupt_stored(*range)
            }
            Fault::Corrupt(range) => self.add_corrupt_range(*range),
            Fault::Heal(heal) => {
                let mut plan = self.write_plan();
                match (heal.offset_bytes, heal.len_bytes) {
                    (Some(offset), Some(len)) => {
                        subtract(&mut plan.bad_ranges, offset, offset + len, |_| true);
                        subtract(&mut plan.corrupt_ranges, offset, offset + len, |_| true);
                    }
                    _ => {
                        plan.bad_ranges.clear();
                        plan.corrupt_ranges.clear();
                    }
                }
                Ok(())
            }
        }
    }

    /// Parses and applies a fault in the command-line syntax.
    pub fn apply_str(&self, text: &str) -> io::Result<()> {
        let fault: Fault = text
            .parse()
            .map_err(|why: String| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        self.apply(&fault)
    }

    /// `offset+len` rounded out to whole logical blocks, or an error naming
    /// `what` if it goes past the end.
    fn block_span(&self, what: &str, offset_bytes: u64, len_bytes: u64) -> io::Result<(u64, u64)> {
        let block = self.inner.logical_block_bytes() as u64;
        let end = offset_bytes + len_bytes;
        if end > self.size_bytes() {
            return Err(invalid(
                self,
                &format!(
                    "{what} {offset_bytes}+{len_bytes} is beyond the end ({} bytes)",
                    self.size_bytes()
                ),
            ));
        }
        Ok((offset_bytes / block * block, end.div_ceil(block) * block))
    }

    fn add_bad_range(&self, range: BadRange) -> io::Result<()> {
        // A bad sector is a whole block: round the range out to blocks.
        let (start, end) = self.block_span("bad range", range.offset_bytes, range.len_bytes)?;
        let mut plan = self.write_plan();
        if plan.bad_ranges.len() >= BAD_RANGES_MAX {
            return Err(invalid(
                self,
                &format!("already {BAD_RANGES_MAX} bad ranges; heal some first"),
            ));
        }
        plan.bad_ranges.push(BadRange {
            offset_bytes: start,
            len_bytes: end - start,
            ..range
        });
        Ok(())
    }

    /// The seed of a corrupt range that names none: the member's, else one
    /// from its name. Two members given one seed would get one mask, and
    /// the same range rotted on two raid6 members alike leaves P agreeing
    /// (dP = e + e = 0): it would read as "Q is wrong", a trap a user
    /// rehearsing bit rot did not set.
    fn corrupt_seed(&self, range: &CorruptRange) -> u64 {
        range.seed.or(self.seed).unwrap_or_else(|| {
            // FNV-1a: stable across runs, unlike the std hasher's keys.
            self.inner
                .name()
                .bytes()
                .fold(UNSEEDED_CORRUPT_SEED ^ 0xcbf2_9ce4_8422_2325, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
                })
        })
    }

    /// Puts a `read` or `write` corrupt range in force, rounded out to
    /// blocks (a drive garbles whole sectors), with its seed fixed so that
    /// the plan says how to replay it.
    fn add_corrupt_range(&self, range: CorruptRange) -> io::Result<()> {
        let (start, end) = self.block_span("corrupt range", range.offset_bytes, range.len_bytes)?;
        let entry = CorruptRange {
            offset_bytes: start,
            len_bytes: end - start,
            seed: Some(self.corrupt_seed(&range)),
            ..range
        };
        let mut plan = self.write_plan();
        // Two masks on one byte could cancel: the new range replaces the
        // older ones of its mode where they meet. Done on a copy, so that a
        // refusal changes nothing.
        let mut ranges = plan.corrupt_ranges.clone();
        subtract(&mut ranges, start, end, |r| r.mode == range.mode);
        if ranges.len() >= CORRUPT_RANGES_MAX {
            return Err(invalid(
                self,
                &format!("already {CORRUPT_RANGES_MAX} corrupt ranges; heal some first"),
            ));
        }
        ranges.push(entry);
        plan.corrupt_ranges = ranges;
        Ok(())
    }

    /// Bit rot: garbles the bytes the member holds in the range, once,
    /// around the faults in force (a pulled member rots too). The write
    /// cache's copies of the range's blocks are garbled with the same masks,
    /// so that the member returns wrong bytes whichever copy a read meets,
    /// and a destage later leaves them wrong on the medium. Applying the same
    /// range and seed twice puts the bytes back.
    fn corrupt_stored(&self, range: CorruptRange) -> io::Result<()> {
        let (start, end) = self.block_span("corrupt range", range.offset_bytes, range.len_bytes)?;
        let key = corrupt_key(self.corrupt_seed(&range), CorruptMode::Stored);
        // Under the cache lock, so that no destage lands between reading a
        // run and writing it back.
        let mut cache = lock(&self.cache);
        let mut run = vec![0u8; (end - start).min(CORRUPT_STORED_RUN_BYTES) as usize];
        let mut at = start;
        while at < end {
            let chunk = &mut run[..(end - at).min(CORRUPT_STORED_RUN_BYTES) as usize];
            self.inner.read_at(chunk, at)?;
            xor_masks(chunk, at, key);
            self.inner.write_at(chunk, at)?;
            at += chunk.len() as u64;
        }
        let block_bytes = self.block_usize() as u64;
        for (&block, data) in cache
            .dirty
            .range_mut(start / block_bytes..end / block_bytes)
        {
            xor_masks(data, block * block_bytes, key);
        }
        drop(cache);
        bump(&self.counters.corrupted_bytes, end - start);
        Ok(())
    }

    fn block_usize(&self) -> usize {
        self.inner.logical_block_bytes() as usize
    }

    fn injected(&self, errno: i32, what: String) -> io::Error {
        let os = io::Error::from_raw_os_error(errno);
        io::Error::new(
            os.kind(),
            InjectedError {
                errno,
                message: format!("{}: {os} (injected: {what})", self.name()),
            },
        )
    }

    /// Refuses any I/O while the member is pulled or offline.
    fn gate(&self, plan: &FaultPlan, now: Instant) -> io::Result<()> {
        if plan.pulled {
            bump(&self.counters.pulled_errors, 1);
            return Err(self.injected(libc::ENODEV, "member pulled".to_string()));
        }
        if plan.offline.is_some_and(|until| until.active(now)) {
            bump(&self.counters.offline_errors, 1);
            return Err(self.injected(libc::EIO, "member offline".to_string()));
        }
        Ok(())
    }

    fn decide(&self, dir: Dir, offset_bytes: u64, len_bytes: u64) -> io::Result<Decision> {
        let plan = self.read_plan();
        self.gate(&plan, Instant::now())?;
        let delay_us = match plan.latency {
            Some(l) if l.ops.covers(dir) => {
                let jitter = match l.jitter_us {
                    0 => 0,
                    j => lock(&self.rngs.jitter).gen_range(0..=j),
                };
                l.delay_us + jitter
            }
            _ => 0,
        };
        if delay_us > 0 {
            bump(&self.counters.delayed_ios, 1);
            bump(&self.counters.delay_us, delay_us);
        }
        let end = offset_bytes + len_bytes;
        let bad = plan
            .bad_ranges
            .iter()
            .find(|r| r.ops.covers(dir) && r.overlaps(offset_bytes, end));
        let error = if let Some(range) = bad {
            bump(&self.counters.bad_range_errors, 1);
            let first_bad = range.offset_bytes.max(offset_bytes);
            Some(self.injected(libc::EIO, format!("medium error at byte {first_bad}")))
        } else if plan
            .eio_rate
            .is_some_and(|r| r.ops.covers(dir) && lock(&self.rngs.eio).gen_bool(r.rate))
        {
            bump(&self.counters.random_errors, 1);
            Some(self.injected(libc::EIO, "random error".to_string()))
        } else {
            None
        };
        let heals = dir == Dir::Write
            && plan
                .bad_ranges
                .iter()
                .any(|r| r.ops == Ops::Read && r.remap && r.overlaps(offset_bytes, end));
        let mode = match dir {
            Dir::Read => CorruptMode::Read,
            Dir::Write => CorruptMode::Write,
        };
        let garbles = plan
            .corrupt_ranges
            .iter()
            .filter(|r| r.mode == mode && r.offset_bytes < end && offset_bytes < r.stop_bytes())
            .map(|r| Garble {
                start: r.offset_bytes.max(offset_bytes),
                end: r.stop_bytes().min(end),
                key: corrupt_key(self.corrupt_seed(r), mode),
            })
            .collect();
        Ok(Decision {
            delay: Duration::from_micros(delay_us),
            error,
            heals,
            torn: dir == Dir::Write && plan.torn.is_some(),
            cache_bytes: plan
                .write_cache
                .map(|c| c.capacity_bytes.unwrap_or(DEFAULT_WRITE_CACHE_BYTES)),
            garbles,
        })
    }

    /// Consumes one torn write, if still armed; returns how many blocks of a
    /// `blocks`-block write persist.
    fn take_torn(&self, blocks: u64) -> Option<u64> {
        let mut plan = self.write_plan();
        let torn = plan.torn.as_mut()?;
        if torn.writes == 0 {
            // Only a hand-built plan can hold this; it means "disarmed".
            plan.torn = None;
            return None;
        }
        let keep = match torn.keep_blocks {
            Some(keep) => keep.min(blocks),
            None if blocks == 0 => 0,
            None => lock(&self.rngs.torn).gen_range(0..blocks),
        };
        if torn.writes <= 1 {
            plan.torn = None;
        } else {
            torn.writes -= 1;
        }
        Some(keep)
    }

    /// A write through the faults in force; `fua` as `write_at_fua`.
    fn write_faulty(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        bump(&self.counters.writes, 1);
        if fua {
            bump(&self.counters.fua_writes, 1);
        }
        self.wait_while_hung(Dir::Write);
        let decision = self.decide(Dir::Write, offset_bytes, buf.len() as u64)?;
        std::thread::sleep(decision.delay);
        self.pacer
            .admit(buf.len() as u64, offset_bytes, self.size_bytes());
        if let Some(err) = decision.error {
            return Err(err);
        }
        let block_bytes = self.block_usize();
        let blocks = (buf.len() / block_bytes) as u64;
        let torn_keep = if decision.torn {
            self.take_torn(blocks)
        } else {
            None
        };
        let persisted_bytes = torn_keep.map_or(buf.len(), |keep| keep as usize * block_bytes);
        if persisted_bytes > 0 {
            let cache_bytes = if fua { None } else { decision.cache_bytes };
            let persisted = &buf[..persisted_bytes];
            if decision.garbles.is_empty() {
                self.store(persisted, offset_bytes, cache_bytes, fua)?;
            } else {
                // The caller's buffer is theirs: garble a copy.
                let mut garbled = persisted.to_vec();
                let bytes = Garble::apply_all(&decision.garbles, &mut garbled, offset_bytes);
                self.store(&garbled, offset_bytes, cache_bytes, fua)?;
                bump(&self.counters.corrupted_writes, 1);
                bump(&self.counters.corrupted_bytes, bytes);
            }
        }
        // Pulled while it ran: the write is as lost as the cache, and the
        // caller must not count it done.
        self.gate(&self.read_plan(), Instant::now())?;
        bump(&self.counters.written_bytes, persisted_bytes as u64);
        if decision.heals && persisted_bytes > 0 {
            self.heal_written(offset_bytes, persisted_bytes as u64);
        }
        match torn_keep {
            Some(keep) => {
                bump(&self.counters.torn_writes, 1);
                Err(self.injected(
                    libc::EIO,
                    format!("torn write: {keep} of {blocks} blocks written"),
                ))
            }
            None => Ok(()),
        }
    }

    /// Stores a (possibly torn) write in the cache or the inner member.
    fn store(
        &self,
        data: &[u8],
        offset_bytes: u64,
        cache_bytes: Option<u64>,
        fua: bool,
    ) -> io::Result<()> {
        let block_bytes = self.block_usize();
        if let Some(capacity) = cache_bytes {
            let mut cache = lock(&self.cache);
            cache.insert(data, offset_bytes, block_bytes);
            let result = if (cache.dirty.len() * block_bytes) as u64 > capacity {
                cache.destage(self.inner.as_ref(), block_bytes).map(drop)
            } else {
                Ok(())
            };
            self.cache_dirty_blocks
                .store(cache.dirty.len() as u64, Ordering::Release);
            return result;
        }
        let write = |inner: &dyn Member| match fua {
            true => inner.write_at_fua(data, offset_bytes),
            false => inner.write_at(data, offset_bytes),
        };
        if self.unflushed_blocks() == 0 {
            return write(self.inner.as_ref());
        }
        // The cache holds blocks (it was turned off since, or this write
        // goes past it with FUA): drop the ones this write replaces, under
        // the cache lock so that a concurrent flush cannot write the stale
        // copies over it afterwards.
        let mut cache = lock(&self.cache);
        cache.remove(offset_bytes, data.len() as u64, block_bytes);
        self.cache_dirty_blocks
            .store(cache.dirty.len() as u64, Ordering::Release);
        write(self.inner.as_ref())
    }

    /// Writes the cache back and flushes the inner member, pulled or not:
    /// the callers are `flush` (which checks first) and turning the cache off.
    fn flush_cache(&self) -> io::Result<()> {
        if self.unflushed_blocks() > 0 {
            let mut cache = lock(&self.cache);
            let destaged = cache.destage(self.inner.as_ref(), self.block_usize());
            self.cache_dirty_blocks
                .store(cache.dirty.len() as u64, Ordering::Release);
            destaged?;
        }
        self.inner.flush()
    }

    fn heal_written(&self, offset_bytes: u64, len_bytes: u64) {
        let mut plan = self.write_plan();
        let healed = subtract(
            &mut plan.bad_ranges,
            offset_bytes,
            offset_bytes + len_bytes,
            |r| r.ops == Ops::Read && r.remap,
        );
        bump(&self.counters.healed_bytes, healed);
    }
}

fn invalid(member: &dyn Member, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {why}", member.name()),
    )
}

/// Removes `[start, end)` from the ranges `pick` selects, splitting those
/// that straddle it; returns the bytes removed.
fn subtract<R: Extent>(
    ranges: &mut Vec<R>,
    start: u64,
    end: u64,
    pick: impl Fn(&R) -> bool,
) -> u64 {
    let mut removed = 0;
    let mut kept = Vec::with_capacity(ranges.len() + 1);
    for range in ranges.drain(..) {
        let (r_start, r_end) = (range.start_bytes(), range.stop_bytes());
        if !pick(&range) || r_end <= start || end <= r_start {
            kept.push(range);
            continue;
        }
        removed += r_end.min(end) - r_start.max(start);
        if r_start < start {
            kept.push(range.narrowed(r_start, start));
        }
        if end < r_end {
            kept.push(range.narrowed(end, r_end));
        }
    }
    *ranges = kept;
    removed
}

/// The finalizer of splitmix64: a cheap, well-mixed 64-bit hash.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one corrupt range's masks, computed once per I/O.
fn corrupt_key(seed: u64, mode: CorruptMode) -> u64 {
    splitmix64(splitmix64(seed) ^ mode.salt())
}

/// XORs `buf`, which holds the member's bytes from `offset_bytes` on, with
/// the masks of `key`: one hash per 8 bytes of member offset, each of its
/// bytes forced nonzero so that every byte changes. The mask of a byte
/// depends only on its offset, wherever the buffer starts.
fn xor_masks(buf: &mut [u8], offset_bytes: u64, key: u64) {
    let (mut done, mut offset) = (0, offset_bytes);
    while done < buf.len() {
        let word = splitmix64(key ^ (offset / 8)).to_le_bytes();
        let lane = (offset % 8) as usize;
        let n = (8 - lane).min(buf.len() - done);
        for (byte, mask) in buf[done..done + n].iter_mut().zip(&word[lane..lane + n]) {
            *byte ^= (*mask).max(1);
        }
        done += n;
        offset += n as u64;
    }
}

// `start_read`, `start_write`, `raw_io`, `splice_fd` and `mapped` keep the
// trait's defaults (none) on purpose: batched and spliced I/O then comes
// through `read_at` and `write_at`, where every fault (corruption included)
// is applied, instead of around them.
impl Member for FaultyMember {
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
        check_io(self, offset_bytes, buf.len() as u64)?;
        bump(&self.counters.reads, 1);
        self.wait_while_hung(Dir::Read);
        let decision = self.decide(Dir::Read, offset_bytes, buf.len() as u64)?;
        std::thread::sleep(decision.delay);
        // A failing read still costs the drive its time, as a medium error
        // does after the retries.
        self.pacer
            .admit(buf.len() as u64, offset_bytes, self.size_bytes());
        if let Some(err) = decision.error {
            return Err(err);
        }
        if self.unflushed_blocks() == 0 {
            self.inner.read_at(buf, offset_bytes)?;
        } else {
            // Hold the cache while reading the inner member, so that a
            // destage cannot move a block from the cache to the inner member
            // between the two and leave this read with the old copy.
            let cache = lock(&self.cache);
            self.inner.read_at(buf, offset_bytes)?;
            cache.overlay(buf, offset_bytes, self.block_usize());
        }
        // A pull that lands while the read runs cuts its power too. Let
        // through, the read could return the inner member's copy without
        // the cache the pull just dropped: old data, as no drive returns.
        self.gate(&self.read_plan(), Instant::now())?;
        bump(&self.counters.read_bytes, buf.len() as u64);
        if !decision.garbles.is_empty() {
            // After the cache overlay: the path lies about whichever copy
            // the bytes came from.
            let bytes = Garble::apply_all(&decision.garbles, buf, offset_bytes);
            bump(&self.counters.corrupted_reads, 1);
            bump(&self.counters.corrupted_bytes, bytes);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_faulty(buf, offset_bytes, false)
    }

    /// As a drive takes a FUA write: its blocks go past the volatile cache
    /// to the inner member and are durable when it returns; whatever else
    /// the cache holds stays there, as lost in a crash as before.
    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_faulty(buf, offset_bytes, true)
    }

    fn flush(&self) -> io::Result<()> {
        bump(&self.counters.flushes, 1);
        self.wait_while_hung(Dir::Write);
        self.gate(&self.read_plan(), Instant::now())?;
        self.flush_cache()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        bump(&self.counters.discards, 1);
        self.wait_while_hung(Dir::Write);
        self.gate(&self.read_plan(), Instant::now())?;
        if self.unflushed_blocks() == 0 {
            return self.inner.discard(offset_bytes, len_bytes);
        }
        let mut cache = lock(&self.cache);
        cache.remove(offset_bytes, len_bytes, self.block_usize());
        self.cache_dirty_blocks
            .store(cache.dirty.len() as u64, Ordering::Release);
        self.inner.discard(offset_bytes, len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::{AlignedBuf, MemoryMember};
    use std::sync::Arc;

    fn member(size_bytes: u64) -> FaultyMember {
        FaultyMember::new(Arc::new(MemoryMember::new("m0", size_bytes, 512)))
    }

    #[test]
    fn the_briefs_examples_parse() {
        let cases: &[(&str, Fault)] = &[
            ("pull", Fault::Pull {}),
            ("restore", Fault::Restore {}),
            ("offline", Fault::Offline(Offline { ms: None })),
            ("offline:2s", Fault::Offline(Offline { ms: Some(2000) })),
            ("hang", Fault::Hang(Hang::default())),
            (
                "hang:write",
                Fault::Hang(Hang {
                    ops: Ops::Write,
                    lift: false,
                }),
            ),
            (
                "hang:off",
                Fault::Hang(Hang {
                    ops: Ops::Both,
                    lift: true,
                }),
            ),
            (
                "eio:read:1M+64K",
                Fault::Eio(BadRange {
                    offset_bytes: 1 << 20,
                    len_bytes: 64 << 10,
                    ops: Ops::Read,
                    remap: true,
                }),
            ),
            (
                "eio-rate:0.01",
                Fault::EioRate(EioRate {
                    rate: 0.01,
                    ops: Ops::Both,
                    seed: None,
                }),
            ),
            (
                "latency:5ms",
                Fault::Latency(Latency {
                    delay_us: 5000,
                    jitter_us: 0,
                    ops: Ops::Both,
                }),
            ),
            (
                "torn",
                Fault::Torn(Torn {
                    writes: 1,
                    keep_blocks: None,
                }),
            ),
        ];
        for (text, fault) in cases {
            assert_eq!(&text.parse::<Fault>().unwrap(), fault, "{text}");
            assert_eq!(&fault.to_string(), text);
        }
    }

    #[test]
    fn options_in_any_order() {
        let a: Fault = "latency:write:2ms:jitter=500us".parse().unwrap();
        let b: Fault = "latency:jitter=0.5ms:2ms:w".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "latency:2ms:jitter=500us:write");
        let e: Fault = "eio:2048s+8s:noremap:write".parse().unwrap();
        assert_eq!(e.to_string(), "eio:write:1M+4K:noremap");
        assert_eq!(
            "EIO_RATE:0.5:read:seed=9"
                .parse::<Fault>()
                .unwrap()
                .to_string(),
            "eio-rate:0.5:read:seed=9"
        );
        assert_eq!(
            "crash:keep=0.25".parse::<Fault>().unwrap().to_string(),
            "crash:0.25"
        );
        assert_eq!(
            "cache".parse::<Fault>().unwrap().to_string(),
            "write-cache:on"
        );
    }

    #[test]
    fn throttles_parse_print_and_serialize() {
        let fifty: Fault = "throttle:50M".parse().unwrap();
        assert_eq!(
            fifty,
            Fault::Throttle(ThrottleLimits {
                bytes_per_s: Some(50 << 20),
                ..ThrottleLimits::UNLIMITED
            })
        );
        for (text, canonical) in [
            ("throttle:50M", "throttle:50M"),
            ("throttle:50M/s:iops=200", "throttle:50M:iops=200"),
            ("throttle:iops=200:8M", "throttle:8M:iops=200"),
            ("throttle:iops=20", "throttle:iops=20"),
            ("throttle:1M:burst=200ms", "throttle:1M:burst=200ms"),
            ("throttle:off", "throttle:off"),
            ("throttle:model=HDD-14T", "throttle:model=hdd-14t"),
            ("throttle:model=hdd-4t:8M", "throttle:8M:model=hdd-4t"),
        ] {
            let fault: Fault = text.parse().unwrap();
            assert_eq!(fault.to_string(), canonical);
            assert_eq!(canonical.parse::<Fault>().unwrap(), fault);
        }
        assert_eq!(
            serde_json::to_string(&fifty).unwrap(),
            format!(r#"{{"throttle":{{"bytes_per_s":{}}}}}"#, 50u64 << 20)
        );
        assert_eq!(
            serde_json::from_str::<Fault>(r#"{"throttle":{}}"#).unwrap(),
            "throttle:off".parse().unwrap()
        );
        let err = "throttle:0".parse::<Fault>().unwrap_err();
        assert!(err.contains("would stop all I/O"), "{err}");
        let err = "throttle:abc".parse::<Fault>().unwrap_err();
        assert!(err.contains("'abc' is not a number"), "{err}");
    }

    #[test]
    fn a_throttled_member_is_paced_and_restore_lifts_it() {
        let m = member(8 << 20);
        m.apply_str("throttle:8M").unwrap();
        assert_eq!(m.faults(), vec!["throttle:8M".parse::<Fault>().unwrap()]);
        assert!(m.describe().starts_with("throttle:8M;"), "{}", m.describe());
        // 4 MiB at 8 MiB/s is half a second, less the 50 ms burst; the
        // bound is loose on purpose, only the lower one says anything.
        let start = Instant::now();
        let chunk = vec![7u8; 256 << 10];
        for i in 0..8u64 {
            m.write_at(&chunk, i * chunk.len() as u64).unwrap();
        }
        let mut back = vec![0u8; 256 << 10];
        for i in 0..8u64 {
            m.read_at(&mut back, i * (256 << 10)).unwrap();
        }
        // Reads and writes share the one budget: 4 MiB in all.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
        assert!(m.describe().contains("throttled I/Os"), "{}", m.describe());

        // A refused throttle changes nothing.
        assert!(m
            .apply(&Fault::Throttle(ThrottleLimits {
                bytes_per_s: Some(0),
                ..ThrottleLimits::UNLIMITED
            }))
            .is_err());
        assert_eq!(m.plan().throttle.unwrap().bytes_per_s, Some(8 << 20));

        // Heal is about bad sectors: the throttle stays. Restore lifts it.
        m.apply_str("heal").unwrap();
        assert!(m.plan().throttle.is_some());
        m.apply_str("restore").unwrap();
        assert!(m.faults().is_empty());
        let start = Instant::now();
        for i in 0..8u64 {
            m.write_at(&chunk, i * chunk.len() as u64).unwrap();
        }
        assert!(start.elapsed() < Duration::from_millis(400));

        // throttle:off lifts it the same way.
        m.apply_str("throttle:1M").unwrap();
        m.apply_str("throttle:off").unwrap();
        assert_eq!(m.plan().throttle, None);
        let start = Instant::now();
        m.write_at(&vec![1u8; 1 << 20], 0).unwrap();
        assert!(start.elapsed() < Duration::from_millis(400));
    }

    #[test]
    fn a_throttle_with_a_disk_model_is_slower_at_the_end() {
        let m = member(8 << 20);
        m.apply_str("throttle:8M:model=hdd-14t").unwrap();
        assert_eq!(m.faults()[0].to_string(), "throttle:8M:model=hdd-14t");
        // The second half of the member streams at 265 MB/s's shape down to
        // 145: on average about 1.5 times the cost of the start, so 4 MiB
        // there at 8 MiB/s takes well over the 0.5 s it would at the start.
        let chunk = vec![3u8; 256 << 10];
        let start = Instant::now();
        for i in 16..32u64 {
            m.write_at(&chunk, i * chunk.len() as u64).unwrap();
        }
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(650), "{elapsed:?}");
    }

    #[test]
    fn bad_input_is_refused_in_one_line() {
        for text in [
            "",
            "yank",
            "pull:now",
            "offline:2",
            "offline:2 weeks",
            "eio",
            "eio:read",
            "eio:1M",
            "eio:1M+0",
            "eio:1Q+4K",
            "eio:read:1M+4K:2M+4K",
            "eio-rate:1.5",
            "eio-rate:-0.1",
            "eio-rate:x",
            "eio-rate:0.1:seed=x",
            "latency",
            "latency:5",
            "latency:61s",
            "throttle",
            "throttle:0",
            "throttle:abc",
            "throttle:50M:iops=0",
            "throttle:50M:iops=x",
            "throttle:50M:60M",
            "throttle:off:50M",
            "throttle:50M:burst=0ms",
            "throttle:50M:speed=1",
            "throttle:model=floppy",
            "torn:x",
            "torn:1:keep=-1",
            "write-cache:maybe",
            "write-cache:capacity=0",
            "crash:2",
            "heal:1M",
            "corrupt",
            "corrupt:read",
            "corrupt:1M+0",
            "corrupt:both:1M+4K",
            "corrupt:1M+4K:2M+4K",
            "corrupt:stored:1M+4K:seed=x",
            "corrupt:1M+4K:noremap=1",
            "restore:all",
        ] {
            let err = text.parse::<Fault>().unwrap_err();
            assert!(
                err.starts_with(&format!("invalid fault '{text}': ")),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    #[test]
    fn sizes_and_durations_round_trip() {
        for bytes in [0, 1, 512, 1536, 4096, 1 << 20, 3 << 30, (5 << 40) + 1024] {
            assert_eq!(parse_bytes(&format_bytes(bytes)).unwrap(), bytes);
        }
        for us in [0, 1, 999, 1000, 1500, 2_000_000, 2_500_000] {
            assert_eq!(parse_duration_us(&format_us(us)).unwrap(), us);
        }
        assert_eq!(parse_duration_us("1.5s").unwrap(), 1_500_000);
        assert_eq!(parse_duration_us("1m").unwrap(), 60_000_000);
        assert!(parse_bytes("99999999999999999999").is_err());
        assert!(parse_bytes("16777216T").is_err());
    }

    #[test]
    fn json_has_the_documented_shape() {
        let json = |f: &Fault| serde_json::to_string(f).unwrap();
        assert_eq!(json(&Fault::Pull {}), r#"{"pull":{}}"#);
        assert_eq!(
            json(&"offline:2s".parse().unwrap()),
            r#"{"offline":{"ms":2000}}"#
        );
        assert_eq!(
            json(&"latency:5ms".parse().unwrap()),
            r#"{"latency":{"us":5000}}"#
        );
        assert_eq!(
            json(&"eio:read:4K+4K".parse().unwrap()),
            r#"{"eio":{"offset":4096,"len":4096,"ops":"read","remap":true}}"#
        );
        let parsed: Fault =
            serde_json::from_str(r#"{"eio":{"offset":0,"len":512,"ops":"write"}}"#).unwrap();
        assert_eq!(parsed.to_string(), "eio:write:0+512");
        assert!(serde_json::from_str::<Fault>(r#"{"latency":{"usec":5}}"#).is_err());
        assert!(serde_json::from_str::<Fault>(r#"{"yank":{}}"#).is_err());
    }

    #[test]
    fn subtract_splits_ranges() {
        let range = |offset_bytes, len_bytes, ops| BadRange {
            offset_bytes,
            len_bytes,
            ops,
            remap: true,
        };
        let mut ranges = vec![range(0, 4096, Ops::Read), range(8192, 512, Ops::Write)];
        let removed = subtract(&mut ranges, 1024, 2048, |r| r.ops == Ops::Read);
        assert_eq!(removed, 1024);
        assert_eq!(
            ranges,
            vec![
                range(0, 1024, Ops::Read),
                range(2048, 2048, Ops::Read),
                range(8192, 512, Ops::Write)
            ]
        );
        assert_eq!(
            subtract(&mut ranges, 0, 1 << 20, |r| r.ops == Ops::Read),
            3072
        );
        assert_eq!(ranges, vec![range(8192, 512, Ops::Write)]);
    }

    #[test]
    fn bad_ranges_round_out_to_blocks_and_stay_inside() {
        let m = member(64 << 10);
        m.apply(&"eio:read:1000+100".parse().unwrap()).unwrap();
        assert_eq!(
            m.plan().bad_ranges,
            vec![BadRange {
                offset_bytes: 512,
                len_bytes: 1024,
                ops: Ops::Read,
                remap: true
            }]
        );
        let err = m.apply(&"eio:60K+8K".parse().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(m.plan().bad_ranges.len(), 1);
    }

    #[test]
    fn a_read_bad_sector_heals_when_written() {
        let m = member(64 << 10);
        m.apply(&"eio:read:4K+4K".parse().unwrap()).unwrap();
        let mut buf = vec![0u8; 4096];
        let err = m.read_at(&mut buf, 4096).unwrap_err();
        assert_eq!(injected_errno(&err), Some(libc::EIO));
        assert!(
            err.to_string().contains("medium error at byte 4096"),
            "{err}"
        );
        // Rewriting half the range heals that half only.
        m.write_at(&[7u8; 2048], 4096).unwrap();
        m.read_at(&mut buf[..2048], 4096).unwrap();
        assert_eq!(buf[..2048], [7u8; 2048]);
        assert!(m.read_at(&mut buf[..512], 6144).is_err());
        assert_eq!(m.counters().healed_bytes, 2048);
    }

    #[test]
    fn the_cache_overlays_reads_and_flushes() {
        let inner = Arc::new(MemoryMember::new("m0", 16 << 10, 512));
        let m = FaultyMember::new(inner.clone());
        m.apply(&"write-cache".parse().unwrap()).unwrap();
        m.write_at(&[1u8; 1024], 512).unwrap();
        assert_eq!(m.unflushed_blocks(), 2);
        assert_eq!(inner.snapshot()[512], 0);
        let mut buf = [9u8; 2048];
        m.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf[..512], [0u8; 512]);
        assert_eq!(buf[512..1536], [1u8; 1024]);
        assert_eq!(buf[1536..], [0u8; 512]);
        m.flush().unwrap();
        assert_eq!(m.unflushed_blocks(), 0);
        assert_eq!(inner.snapshot()[512..1536], [1u8; 1024]);
    }

    #[test]
    fn a_read_under_way_when_the_drive_is_pulled_fails_rather_than_return_old_data() {
        // The read passes the gate, then waits out its latency while the
        // pull drops the cache that holds the block's new copy: it must not
        // come back with the inner member's old one.
        let inner = Arc::new(MemoryMember::new("m0", 16 << 10, 512));
        let m = Arc::new(FaultyMember::new(inner));
        m.apply(&"write-cache".parse().unwrap()).unwrap();
        m.write_at(&[1u8; 512], 0).unwrap();
        m.apply(&"latency:read:300ms".parse().unwrap()).unwrap();
        let reader = {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut buf = [9u8; 512];
                m.read_at(&mut buf, 0).map(|()| buf)
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        m.pull();
        match reader.join().unwrap() {
            Ok(buf) => panic!(
                "a read across the pull returned data (first byte {})",
                buf[0]
            ),
            Err(e) => assert!(e.to_string().contains("pulled"), "{e}"),
        }
    }

    #[test]
    fn a_full_cache_destages() {
        let inner = Arc::new(MemoryMember::new("m0", 16 << 10, 512));
        let m = FaultyMember::new(inner.clone());
        m.apply(&"write-cache:capacity=2K".parse().unwrap())
            .unwrap();
        m.write_at(&[3u8; 2048], 0).unwrap();
        assert_eq!(m.unflushed_blocks(), 4);
        m.write_at(&[4u8; 512], 4096).unwrap();
        assert_eq!(m.unflushed_blocks(), 0);
        assert_eq!(inner.snapshot()[..2048], [3u8; 2048]);
    }

    #[test]
    fn turning_the_cache_off_writes_it_back() {
        let inner = Arc::new(MemoryMember::new("m0", 16 << 10, 512));
        let m = FaultyMember::new(inner.clone());
        m.apply(&"write-cache:on".parse().unwrap()).unwrap();
        m.write_at(&[5u8; 512], 0).unwrap();
        m.apply(&"write-cache:off".parse().unwrap()).unwrap();
        assert_eq!(m.unflushed_blocks(), 0);
        assert_eq!(inner.snapshot()[..512], [5u8; 512]);
        m.crash().unwrap();
        assert_eq!(inner.snapshot()[..512], [5u8; 512]);
    }

    #[test]
    fn restore_keeps_the_cache_setting() {
        let m = member(16 << 10);
        for text in [
            "write-cache",
            "pull",
            "latency:1ms",
            "eio:0+512",
            "torn:3",
            "corrupt:read:0+512",
            "corrupt:write:4K+4K",
        ] {
            m.apply_str(text).unwrap();
        }
        m.restore();
        assert_eq!(
            m.faults(),
            vec![Fault::WriteCache(WriteCache {
                enabled: true,
                capacity_bytes: None
            })]
        );
    }

    #[test]
    fn describe_uses_the_fault_syntax() {
        let m = member(16 << 10);
        assert_eq!(
            m.describe(),
            "healthy; 0 reads, 0 writes, 0 errors injected"
        );
        m.apply_str("eio-rate:1:write").unwrap();
        m.apply_str("offline").unwrap();
        let _ = m.write_at(&[0u8; 512], 0);
        assert_eq!(
            m.describe(),
            "offline, eio-rate:1:write; 0 reads, 1 writes, 1 errors injected"
        );
    }

    #[test]
    fn invalid_io_is_refused_before_faults() {
        let m = member(16 << 10);
        m.pull();
        let err = m.write_at(&[0u8; 100], 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(m.counters().pulled_errors, 0);
    }

    /// A member of `size` bytes (512-byte blocks) behind an injector with
    /// `seed`, filled with a pattern that has no two equal neighbours.
    fn patterned(size_bytes: u64, seed: u64) -> (Arc<MemoryMember>, FaultyMember, Vec<u8>) {
        let inner = Arc::new(MemoryMember::new("m0", size_bytes, 512));
        let m = FaultyMember::with_seed(inner.clone(), seed);
        let pattern: Vec<u8> = (0..size_bytes).map(|i| (i * 7 + i / 251) as u8).collect();
        m.write_at(&pattern, 0).unwrap();
        (inner, m, pattern)
    }

    fn read(m: &FaultyMember, offset_bytes: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        m.read_at(&mut buf, offset_bytes).unwrap();
        buf
    }

    /// Asserts that every byte of `a` differs from `b`.
    fn all_differ(a: &[u8], b: &[u8]) {
        assert_eq!(a.len(), b.len());
        let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
        assert_eq!(same, 0, "{same} of {} bytes unchanged", a.len());
    }

    #[test]
    fn corrupt_faults_parse_print_and_serialize() {
        let corrupt = |offset_bytes, len_bytes, mode, seed| {
            Fault::Corrupt(CorruptRange {
                offset_bytes,
                len_bytes,
                mode,
                seed,
            })
        };
        for (text, canonical, fault) in [
            (
                "corrupt:1M+4K",
                "corrupt:read:1M+4K",
                corrupt(1 << 20, 4096, CorruptMode::Read, None),
            ),
            (
                "corrupt:r:2048s+8s:seed=7",
                "corrupt:read:1M+4K:seed=7",
                corrupt(1 << 20, 4096, CorruptMode::Read, Some(7)),
            ),
            (
                "corrupt:seed=9:64K+512:write",
                "corrupt:write:64K+512:seed=9",
                corrupt(64 << 10, 512, CorruptMode::Write, Some(9)),
            ),
            (
                "CORRUPT:stored:1M+4K",
                "corrupt:stored:1M+4K",
                corrupt(1 << 20, 4096, CorruptMode::Stored, None),
            ),
        ] {
            let parsed: Fault = text.parse().unwrap();
            assert_eq!(parsed, fault, "{text}");
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(canonical.parse::<Fault>().unwrap(), fault);
            let json = serde_json::to_string(&fault).unwrap();
            assert_eq!(
                serde_json::from_str::<Fault>(&json).unwrap(),
                fault,
                "{json}"
            );
        }
        let json = |text: &str| serde_json::to_string(&text.parse::<Fault>().unwrap()).unwrap();
        assert_eq!(
            json("corrupt:read:4K+4K:seed=7"),
            r#"{"corrupt":{"offset":4096,"len":4096,"mode":"read","seed":7}}"#
        );
        assert_eq!(
            json("corrupt:stored:0+512"),
            r#"{"corrupt":{"offset":0,"len":512,"mode":"stored"}}"#
        );
        let parsed: Fault =
            serde_json::from_str(r#"{"corrupt":{"offset":512,"len":512}}"#).unwrap();
        assert_eq!(parsed.to_string(), "corrupt:read:512+512");
        assert!(serde_json::from_str::<Fault>(
            r#"{"corrupt":{"offset":0,"len":512,"mode":"both"}}"#
        )
        .is_err());
    }

    #[test]
    fn masks_depend_on_the_offset_only_and_change_every_byte() {
        let key = corrupt_key(7, CorruptMode::Read);
        let mut whole = vec![0u8; 4096];
        xor_masks(&mut whole, 1003, key);
        assert!(whole.iter().all(|&b| b != 0));
        // The same bytes garbled in odd pieces get the same masks.
        let mut pieces = vec![0u8; 4096];
        let (a, rest) = pieces.split_at_mut(3);
        let (b, c) = rest.split_at_mut(1000);
        xor_masks(a, 1003, key);
        xor_masks(b, 1006, key);
        xor_masks(c, 2006, key);
        assert_eq!(whole, pieces);
        // Another seed or mode draws other masks.
        for other in [
            corrupt_key(8, CorruptMode::Read),
            corrupt_key(7, CorruptMode::Write),
        ] {
            let mut again = vec![0u8; 4096];
            xor_masks(&mut again, 1003, other);
            let same = whole.iter().zip(&again).filter(|(x, y)| x == y).count();
            assert!(same < 64, "{same} equal mask bytes");
        }
    }

    #[test]
    fn a_read_corrupt_range_lies_the_same_way_every_time() {
        let (inner, m, pattern) = patterned(64 << 10, 5);
        m.apply_str("corrupt:read:4K+4K").unwrap();
        // The injector's seed is the default, and the plan says so.
        assert_eq!(
            m.faults(),
            vec!["corrupt:read:4K+4K:seed=5".parse::<Fault>().unwrap()]
        );
        assert!(
            m.describe().starts_with("corrupt:read:4K+4K:seed=5;"),
            "{}",
            m.describe()
        );
        let first = read(&m, 0, 16 << 10);
        all_differ(&first[4096..8192], &pattern[4096..8192]);
        assert_eq!(first[..4096], pattern[..4096]);
        assert_eq!(first[8192..], pattern[8192..16 << 10]);
        assert_eq!(read(&m, 0, 16 << 10), first);
        // A read of part of the range, starting elsewhere, meets the same
        // wrong bytes: they depend on the offset only.
        assert_eq!(read(&m, 3584, 1536), first[3584..5120]);
        // The medium keeps the right bytes, and nothing failed.
        assert_eq!(inner.snapshot(), pattern);
        let c = m.counters();
        assert_eq!(
            (c.corrupted_reads, c.corrupted_bytes),
            (3, 4096 + 4096 + 1024)
        );
        assert_eq!(c.corrupted_writes, 0);
        assert_eq!(c.errors_injected(), 0);
        assert!(
            m.describe().contains("3 corrupted reads"),
            "{}",
            m.describe()
        );

        // A write over the range does not heal it: the path lies, not the
        // medium.
        m.write_at(&pattern[4096..8192], 4096).unwrap();
        assert_eq!(read(&m, 4096, 4096), first[4096..8192]);

        // Healing half the range makes that half right.
        m.apply_str("heal:4K+2K").unwrap();
        let healed = read(&m, 4096, 4096);
        assert_eq!(healed[..2048], pattern[4096..6144]);
        assert_eq!(healed[2048..], first[6144..8192]);
        m.apply_str("heal").unwrap();
        assert!(m.faults().is_empty());
        assert_eq!(read(&m, 0, 64 << 10), pattern);
    }

    #[test]
    fn a_read_corrupt_range_also_lies_to_batched_reads() {
        let (_, m, pattern) = patterned(64 << 10, 5);
        m.apply_str("corrupt:read:8K+4K").unwrap();
        // No entry point around `read_at` and `write_at`.
        assert!(m.start_read(&mut [0u8; 512], 0).is_none());
        assert!(m.start_write(&[0u8; 512], 0, false).is_none());
        assert!(!m.starts_io() && m.raw_io().is_none() && m.mapped().is_none());
        let direct = read(&m, 8192, 4096);
        let mut batched = AlignedBuf::copy_from(&[0u8; 4096]);
        let results =
            crate::member::batch::run(&mut [crate::member::IoOp::read(&m, 8192, &mut batched)]);
        assert!(results[0].is_ok(), "{results:?}");
        assert_eq!(batched[..], direct[..]);
        all_differ(&batched, &pattern[8192..12288]);
    }

    #[test]
    fn corrupt_ranges_round_out_replace_each_other_and_are_capped() {
        let (_, m, pattern) = patterned(4 << 20, 1);
        m.apply_str("corrupt:read:1000+100:seed=3").unwrap();
        assert_eq!(
            m.plan().corrupt_ranges,
            vec![CorruptRange {
                offset_bytes: 512,
                len_bytes: 1024,
                mode: CorruptMode::Read,
                seed: Some(3),
            }]
        );
        m.apply_str("heal").unwrap();
        // Where two ranges of one mode meet, the newer one wins, so that no
        // byte is masked twice (which could undo the first mask).
        m.apply_str("corrupt:read:0+8K:seed=1").unwrap();
        m.apply_str("corrupt:read:4K+8K:seed=2").unwrap();
        m.apply_str("corrupt:write:0+8K:seed=1").unwrap();
        let listed: Vec<String> = m.faults().iter().map(Fault::to_string).collect();
        assert_eq!(
            listed,
            [
                "corrupt:read:0+4K:seed=1",
                "corrupt:read:4K+8K:seed=2",
                "corrupt:write:0+8K:seed=1"
            ]
        );
        all_differ(&read(&m, 0, 12 << 10), &pattern[..12 << 10]);
        let err = m.apply_str("corrupt:read:4092K+8K").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("beyond the end"), "{err}");

        m.apply_str("restore").unwrap();
        for i in 0..CORRUPT_RANGES_MAX as u64 {
            m.apply(&Fault::Corrupt(CorruptRange {
                offset_bytes: i * 1024,
                len_bytes: 512,
                mode: CorruptMode::Read,
                seed: None,
            }))
            .unwrap();
        }
        let err = m.apply_str("corrupt:write:0+512").unwrap_err();
        assert!(err.to_string().contains("heal some first"), "{err}");
        assert_eq!(m.plan().corrupt_ranges.len(), CORRUPT_RANGES_MAX);
        // A range that replaces others where they meet still fits.
        m.apply_str("corrupt:read:0+512:seed=4").unwrap();
        m.apply_str("restore").unwrap();
        assert!(m.plan().corrupt_ranges.is_empty());
        assert_eq!(read(&m, 0, 4 << 20), pattern);
    }

    #[test]
    fn a_write_corrupt_range_stores_wrong_bytes_and_succeeds() {
        let (inner, m, pattern) = patterned(64 << 10, 2);
        m.apply_str("corrupt:write:8K+4K:seed=9").unwrap();
        let before = m.counters().errors_injected();
        m.write_at(&pattern[4096..20480], 4096).unwrap();
        let stored = inner.snapshot();
        all_differ(&stored[8192..12288], &pattern[8192..12288]);
        assert_eq!(stored[..8192], pattern[..8192]);
        assert_eq!(stored[12288..], pattern[12288..]);
        // Reads are not garbled: they return what was stored, wrong.
        assert_eq!(read(&m, 0, 64 << 10), stored);
        let c = m.counters();
        assert_eq!((c.corrupted_writes, c.corrupted_bytes), (1, 4096));
        assert_eq!(c.corrupted_reads, 0);
        assert_eq!(c.errors_injected(), before);
        // A FUA write is garbled the same way.
        m.write_at_fua(&pattern[8192..8704], 8192).unwrap();
        assert_eq!(inner.snapshot()[8192..8704], stored[8192..8704]);

        // Written through the garbled path and read through a garbled one
        // with the same seed, the bytes stay wrong: the masks do not cancel.
        m.apply_str("corrupt:read:8K+4K:seed=9").unwrap();
        let twice = read(&m, 8192, 4096);
        let right = twice
            .iter()
            .zip(&pattern[8192..12288])
            .filter(|(a, b)| a == b)
            .count();
        assert!(right < 64, "{right} bytes came back right");

        // Without the fault the stored bytes stay wrong (they are data
        // now) until rewritten.
        m.apply_str("heal").unwrap();
        assert_eq!(read(&m, 0, 64 << 10), stored);
        m.write_at(&pattern[8192..12288], 8192).unwrap();
        assert_eq!(inner.snapshot(), pattern);
    }

    #[test]
    fn a_write_corrupt_range_garbles_only_what_a_torn_write_keeps() {
        let (inner, m, pattern) = patterned(64 << 10, 2);
        m.apply_str("corrupt:write:0+8K").unwrap();
        m.apply_str("torn:keep=2").unwrap();
        assert!(m.write_at(&[0u8; 4096], 0).is_err());
        let stored = inner.snapshot();
        assert!(stored[..1024].iter().all(|&b| b != 0));
        assert_eq!(stored[1024..], pattern[1024..]);
        assert_eq!(m.counters().corrupted_bytes, 1024);
    }

    #[test]
    fn stored_corruption_rots_the_medium_once() {
        let (inner, m, pattern) = patterned(64 << 10, 4);
        m.apply_str("corrupt:stored:4K+4K:seed=3").unwrap();
        let rotten = inner.snapshot();
        all_differ(&rotten[4096..8192], &pattern[4096..8192]);
        assert_eq!(rotten[..4096], pattern[..4096]);
        assert_eq!(rotten[8192..], pattern[8192..]);
        // Nothing stays in force: later reads show the medium as it is now.
        assert!(m.faults().is_empty());
        assert!(m.plan().corrupt_ranges.is_empty());
        assert_eq!(read(&m, 0, 64 << 10), rotten);
        assert_eq!(read(&m, 0, 64 << 10), rotten);
        let c = m.counters();
        assert_eq!(c.corrupted_bytes, 4096);
        assert_eq!((c.corrupted_reads, c.corrupted_writes), (0, 0));
        assert_eq!(c.errors_injected(), 0);
        // The same rot again puts the bytes back: the masks are the same.
        m.apply_str("corrupt:stored:4K+4K:seed=3").unwrap();
        assert_eq!(inner.snapshot(), pattern);
        // A range past the end changes nothing.
        let err = m.apply_str("corrupt:stored:60K+8K").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(inner.snapshot(), pattern);
        // A pulled member rots as well: the medium does not need power.
        m.pull();
        m.apply_str("corrupt:stored:0+512").unwrap();
        assert_ne!(inner.snapshot()[..512], pattern[..512]);
    }

    #[test]
    fn stored_corruption_reaches_the_cached_copy_too() {
        let inner = Arc::new(MemoryMember::new("m0", 16 << 10, 512));
        let m = FaultyMember::new(inner.clone());
        m.write_at(&[1u8; 4096], 0).unwrap();
        m.apply_str("write-cache").unwrap();
        m.write_at(&[2u8; 1024], 1024).unwrap();
        m.apply_str("corrupt:stored:0+4K").unwrap();
        // Whichever copy a read meets, the bytes are wrong, and the same
        // masks garbled both.
        let back = read(&m, 0, 4096);
        assert!(back[..1024].iter().all(|&b| b != 1));
        assert!(back[1024..2048].iter().all(|&b| b != 2));
        assert!(back[2048..].iter().all(|&b| b != 1));
        let medium = inner.snapshot();
        assert_eq!(back[..1024], medium[..1024]);
        for (i, (&cached, &old)) in back[1024..2048].iter().zip(&medium[1024..2048]).enumerate() {
            assert_eq!(cached ^ 2, old ^ 1, "byte {}", 1024 + i);
        }
        m.flush().unwrap();
        assert_eq!(inner.snapshot()[..4096], back[..]);
        // A member made without a seed takes one from its name: a run
        // replays, and two members are not garbled alike.
        let rot = |name: &str| {
            let member = Arc::new(MemoryMember::new(name, 16 << 10, 512));
            FaultyMember::new(member.clone())
                .apply_str("corrupt:stored:0+512")
                .unwrap();
            member.snapshot()
        };
        assert_eq!(rot("m1"), rot("m1"));
        assert_ne!(rot("m1")[..512], rot("m2")[..512]);
        assert!(rot("m1")[..512].iter().all(|&b| b != 0));
    }
}
