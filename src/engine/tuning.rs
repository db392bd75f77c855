//! The knobs of the seeds, live: the values md keeps in sysfs
//! (stripe_cache_size, rmw_level, group_thread_cnt), those of the block
//! layer (read-ahead, max_sectors_kb) and those of a RAID controller's
//! virtual disk (write policy, read cache, fast path).
//!
//! Every knob is one atomic, so the data path reads them without a lock and
//! a change takes effect at the next request. Values are parsed and checked
//! here, once, for every way in: `create`/`serve` options, the saved
//! settings of an array, and `manage --set` on a live array.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

/// The longest latency target a background job may be given, in ms: a
/// minute is far beyond any client's timeout already.
pub const REBUILD_LATENCY_TARGET_MAX_MS: f64 = 60_000.0;

/// md's limits for stripe_cache_size (raid5.c: 17..=32768 entries).
pub const STRIPE_CACHE_MIN: u32 = 17;
pub const STRIPE_CACHE_MAX: u32 = 32768;
pub const STRIPE_CACHE_DEFAULT: u32 = 256;
/// One stripe-cache entry caches this much of every member, as md's
/// stripe_head holds one page per device.
pub const STRIPE_CACHE_PAGE: usize = 4096;
/// The block layer's limits for max_sectors_kb: one page up to 32 MiB.
pub const MAX_SECTORS_KB_MIN: u32 = 4;
pub const MAX_SECTORS_KB_MAX: u32 = 32768;
/// The kernel's default for max_sectors_kb (BLK_DEF_MAX_SECTORS_CAP).
pub const MAX_SECTORS_KB_DEFAULT: u32 = 1280;
/// Read-ahead beyond 32 MiB only pushes useful entries out of the cache.
pub const READ_AHEAD_MAX_SECTORS: u32 = 65536;
pub const GROUP_THREAD_CNT_MAX: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicy {
    /// Acknowledge a write once it is on the members (a controller's WT,
    /// and md's behaviour).
    WriteThrough,
    /// Acknowledge a write once it is in the stripe cache; it reaches the
    /// members in the background, and at every FLUSH or FUA.
    WriteBack,
}

impl WritePolicy {
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::WriteThrough => "write-through",
            WritePolicy::WriteBack => "write-back",
        }
    }
}

/// Every knob by name, with what it means; `--set help` prints this.
pub const KNOBS: &[(&str, &str)] = &[
    (
        "stripe_cache_size",
        "stripe cache entries (17..32768, md's units: one 4 KiB page per member each)",
    ),
    (
        "read_ahead",
        "read-ahead in 512-byte sectors on sequential reads, as `blockdev --setra` (0 = off); \
         what is read ahead is kept in the stripe cache's memory, so at most half of it is read",
    ),
    (
        "max_sectors_kb",
        "largest I/O sent to a member, in KiB (4..32768), as the block layer's max_sectors_kb",
    ),
    (
        "write_policy",
        "write-through (ack when on the members) or write-back (ack from the cache)",
    ),
    (
        "read_cache",
        "on: keep what is read in the stripe cache for later reads (not small random reads while fast_path is on: those bypass the cache); off: do not",
    ),
    (
        "fast_path",
        "on: small random reads go straight to their member, bypassing the cache, and over NBD run on the connection's io_uring without a thread each",
    ),
    (
        "rmw_level",
        "0: never read-modify-write; 1: when it needs fewer reads; 2: also on ties (md's rmw_level)",
    ),
    (
        "group_thread_cnt",
        "stripe worker threads doing the parity work of writes, as md's group_thread_cnt (0 = each write's own thread does it; the stripe cache then writes out with one thread per core)",
    ),
    (
        "rebuild_latency_target",
        "ms (fractions allowed): rebuild, resync, check, repair and reshape run as fast as the clients' p99 request latency stays at or under it, between speed_limit_min and speed_limit_max; off (0) keeps md's rule (above speed_limit_min a job yields to any client I/O)",
    ),
];

/// The values in force, in a form to save, print and compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TuningValues {
    pub stripe_cache_size: u32,
    pub read_ahead: u32,
    pub max_sectors_kb: u32,
    pub write_policy: WritePolicy,
    pub read_cache: bool,
    pub fast_path: bool,
    pub rmw_level: u8,
    pub group_thread_cnt: u32,
    /// The clients' p99 latency background jobs keep to, in µs; 0 is off
    /// (md's speed limits alone).
    #[serde(default)]
    pub rebuild_latency_target_us: u32,
}

impl TuningValues {
    /// md's and the block layer's defaults; read-ahead as md sets it for a
    /// striped array: two full stripes of data (raid5.c raid5_set_limits).
    pub fn defaults(full_stripe_data_sectors: u64) -> TuningValues {
        TuningValues {
            stripe_cache_size: STRIPE_CACHE_DEFAULT,
            read_ahead: (2 * full_stripe_data_sectors).min(READ_AHEAD_MAX_SECTORS as u64) as u32,
            max_sectors_kb: MAX_SECTORS_KB_DEFAULT,
            write_policy: WritePolicy::WriteThrough,
            read_cache: false,
            fast_path: true,
            rmw_level: 1,
            group_thread_cnt: 0,
            rebuild_latency_target_us: 0,
        }
    }

    /// Applies one `key=value`, checking it; nothing changes on error.
    /// `protected` says whether write-back may be chosen: a journal guards
    /// it, or the user said --i-accept-data-loss.
    pub fn set(&mut self, key: &str, value: &str, protected: bool) -> Result<(), String> {
        let mut next = *self;
        match key {
            "stripe_cache_size" => {
                next.stripe_cache_size =
                    number(key, value, STRIPE_CACHE_MIN as u64, STRIPE_CACHE_MAX as u64)? as u32
            }
            "read_ahead" => {
                next.read_ahead = number(key, value, 0, READ_AHEAD_MAX_SECTORS as u64)? as u32
            }
            "max_sectors_kb" => {
                let kb = number(
                    key,
                    value,
                    MAX_SECTORS_KB_MIN as u64,
                    MAX_SECTORS_KB_MAX as u64,
                )?;
                if !kb.is_multiple_of(4) {
                    return Err(format!(
                        "max_sectors_kb {kb} is not a multiple of 4 KiB (one page)"
                    ));
                }
                next.max_sectors_kb = kb as u32
            }
            "write_policy" => {
                next.write_policy = match value {
                    "write-through" | "wt" => WritePolicy::WriteThrough,
                    "write-back" | "wb" => WritePolicy::WriteBack,
                    _ => {
                        return Err(format!(
                            "write_policy {value:?}: expected write-through or write-back"
                        ))
                    }
                };
                if next.write_policy == WritePolicy::WriteBack && !protected {
                    return Err(
                        "write-back acknowledges writes that are only in memory: a crash \
                                loses them; give the array a write journal (create \
                                --write-journal), or --i-accept-data-loss to accept that"
                            .into(),
                    );
                }
            }
            "read_cache" => next.read_cache = on_off(key, value)?,
            "fast_path" => next.fast_path = on_off(key, value)?,
            "rmw_level" => next.rmw_level = number(key, value, 0, 2)? as u8,
            "group_thread_cnt" => {
                next.group_thread_cnt = number(key, value, 0, GROUP_THREAD_CNT_MAX as u64)? as u32
            }
            "rebuild_latency_target" => next.rebuild_latency_target_us = latency_target_us(value)?,
            _ => {
                let names: Vec<&str> = KNOBS.iter().map(|(k, _)| *k).collect();
                return Err(format!(
                    "unknown setting {key:?}; known: {}",
                    names.join(", ")
                ));
            }
        }
        *self = next;
        Ok(())
    }

    /// Every knob as (name, value), in the order of [`KNOBS`].
    pub fn pairs(&self) -> Vec<(String, String)> {
        let on = |b: bool| if b { "on" } else { "off" }.to_string();
        vec![
            (
                "stripe_cache_size".into(),
                self.stripe_cache_size.to_string(),
            ),
            ("read_ahead".into(), self.read_ahead.to_string()),
            ("max_sectors_kb".into(), self.max_sectors_kb.to_string()),
            ("write_policy".into(), self.write_policy.name().into()),
            ("read_cache".into(), on(self.read_cache)),
            ("fast_path".into(), on(self.fast_path)),
            ("rmw_level".into(), self.rmw_level.to_string()),
            ("group_thread_cnt".into(), self.group_thread_cnt.to_string()),
            (
                "rebuild_latency_target".into(),
                latency_target_words(self.rebuild_latency_target_us),
            ),
        ]
    }

    /// The most one read-ahead fetches, in sectors, for an array whose
    /// rows have `data_strips` data strips: half the read cache (the
    /// stripe cache's pages over the data strips, md's memory for
    /// stripe_cache_size), so that what is fetched stays until it is read.
    pub fn read_ahead_cap_sectors(&self, data_strips: usize) -> u64 {
        read_ahead_cap_sectors(self.stripe_cache_size, data_strips)
    }

    /// The knobs as `detail` shows them: each value in force. Where the
    /// cap on read-ahead bites, the value in force comes first and the
    /// value set after it.
    pub fn shown(&self, data_strips: usize) -> Vec<(String, String)> {
        let mut pairs = self.pairs();
        let set = self.read_ahead as u64;
        let cap = self.read_ahead_cap_sectors(data_strips);
        if set > cap {
            for (key, value) in pairs.iter_mut() {
                if key == "read_ahead" {
                    *value = format!("{cap} (set {set}; at most half the stripe cache)");
                }
            }
        }
        pairs
    }
}

/// See [`TuningValues::read_ahead_cap_sectors`].
pub fn read_ahead_cap_sectors(stripe_cache_size: u32, data_strips: usize) -> u64 {
    let cache = stripe_cache_size as u64 * STRIPE_CACHE_PAGE as u64 * data_strips as u64;
    cache / 2 / crate::units::SECTOR_BYTES
}

/// Parses `key=value`.
pub fn split_setting(text: &str) -> Result<(&str, &str), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| format!("setting {text:?} is not KEY=VALUE"))
}

fn number(key: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    let n: u64 = value
        .parse()
        .map_err(|_| format!("{key} {value:?} is not a number"))?;
    if !(min..=max).contains(&n) {
        return Err(format!("{key} {n} is outside {min}..{max}"));
    }
    Ok(n)
}

/// A latency target in ms (`off` or 0 for none) as µs: at least 50 µs,
/// below which no member's own latency lets a job run at all.
fn latency_target_us(value: &str) -> Result<u32, String> {
    let key = "rebuild_latency_target";
    if value == "off" {
        return Ok(0);
    }
    let ms: f64 = value
        .strip_suffix("ms")
        .unwrap_or(value)
        .parse()
        .ok()
        .filter(|ms: &f64| ms.is_finite())
        .ok_or_else(|| format!("{key} {value:?}: expected milliseconds (2, 0.5) or off"))?;
    if ms == 0.0 {
        return Ok(0);
    }
    if !(0.05..=REBUILD_LATENCY_TARGET_MAX_MS).contains(&ms) {
        return Err(format!(
            "{key} {value}: outside 0.05..{REBUILD_LATENCY_TARGET_MAX_MS} ms (or off)"
        ));
    }
    Ok((ms * 1000.0).round() as u32)
}

/// A latency target as `pairs` prints it: ms, or off.
pub fn latency_target_words(us: u32) -> String {
    match us {
        0 => "off".into(),
        us if us.is_multiple_of(1000) => format!("{}", us / 1000),
        us => format!("{}", us as f64 / 1000.0),
    }
}

fn on_off(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "yes" | "1" | "true" => Ok(true),
        "off" | "no" | "0" | "false" => Ok(false),
        _ => Err(format!("{key} {value:?}: expected on or off")),
    }
}

/// The live knobs: one atomic each, read by the data path without locks.
pub struct Tunables {
    stripe_cache_size: AtomicU32,
    read_ahead: AtomicU32,
    max_sectors_kb: AtomicU32,
    write_back: AtomicBool,
    read_cache: AtomicBool,
    fast_path: AtomicBool,
    rmw_level: AtomicU8,
    group_thread_cnt: AtomicU32,
    rebuild_latency_target_us: AtomicU32,
    /// Whether write-back may be chosen on this array.
    write_back_allowed: AtomicBool,
    /// Serialises changes so that `values()` never sees half of one.
    change: std::sync::Mutex<()>,
}

impl Tunables {
    pub fn new(values: &TuningValues, write_back_allowed: bool) -> Tunables {
        let t = Tunables {
            stripe_cache_size: AtomicU32::new(0),
            read_ahead: AtomicU32::new(0),
            max_sectors_kb: AtomicU32::new(0),
            write_back: AtomicBool::new(false),
            read_cache: AtomicBool::new(false),
            fast_path: AtomicBool::new(false),
            rmw_level: AtomicU8::new(0),
            group_thread_cnt: AtomicU32::new(0),
            rebuild_latency_target_us: AtomicU32::new(0),
            write_back_allowed: AtomicBool::new(write_back_allowed),
            change: std::sync::Mutex::new(()),
        };
        t.store(values);
        t
    }

    fn store(&self, v: &TuningValues) {
        let r = Ordering::Relaxed;
        self.stripe_cache_size.store(v.stripe_cache_size, r);
        self.read_ahead.store(v.read_ahead, r);
        self.max_sectors_kb.store(v.max_sectors_kb, r);
        self.write_back
            .store(v.write_policy == WritePolicy::WriteBack, r);
        self.read_cache.store(v.read_cache, r);
        self.fast_path.store(v.fast_path, r);
        self.rmw_level.store(v.rmw_level, r);
        self.group_thread_cnt.store(v.group_thread_cnt, r);
        self.rebuild_latency_target_us
            .store(v.rebuild_latency_target_us, r);
    }

    pub fn values(&self) -> TuningValues {
        let _change = self.change.lock().unwrap();
        let r = Ordering::Relaxed;
        TuningValues {
            stripe_cache_size: self.stripe_cache_size.load(r),
            read_ahead: self.read_ahead.load(r),
            max_sectors_kb: self.max_sectors_kb.load(r),
            write_policy: if self.write_back.load(r) {
                WritePolicy::WriteBack
            } else {
                WritePolicy::WriteThrough
            },
            read_cache: self.read_cache.load(r),
            fast_path: self.fast_path.load(r),
            rmw_level: self.rmw_level.load(r),
            group_thread_cnt: self.group_thread_cnt.load(r),
            rebuild_latency_target_us: self.rebuild_latency_target_us.load(r),
        }
    }

    /// Changes one knob; returns the values before and after.
    pub fn set(&self, key: &str, value: &str) -> Result<(TuningValues, TuningValues), String> {
        let before = self.values();
        let mut after = before;
        after.set(key, value, self.write_back_allowed.load(Ordering::Relaxed))?;
        let _change = self.change.lock().unwrap();
        self.store(&after);
        Ok((before, after))
    }

    pub fn allow_write_back(&self) {
        self.write_back_allowed.store(true, Ordering::Relaxed);
    }
    pub fn write_back_allowed(&self) -> bool {
        self.write_back_allowed.load(Ordering::Relaxed)
    }

    pub fn stripe_cache_size(&self) -> u32 {
        self.stripe_cache_size.load(Ordering::Relaxed)
    }
    pub fn read_ahead_sectors(&self) -> u32 {
        self.read_ahead.load(Ordering::Relaxed)
    }
    pub fn max_io_bytes(&self) -> usize {
        self.max_sectors_kb.load(Ordering::Relaxed) as usize * 1024
    }
    pub fn write_back(&self) -> bool {
        self.write_back.load(Ordering::Relaxed)
    }
    pub fn read_cache(&self) -> bool {
        self.read_cache.load(Ordering::Relaxed)
    }
    pub fn fast_path(&self) -> bool {
        self.fast_path.load(Ordering::Relaxed)
    }
    pub fn rmw_level(&self) -> u8 {
        self.rmw_level.load(Ordering::Relaxed)
    }
    /// The clients' p99 latency background jobs keep to, µs (0: off).
    pub fn rebuild_latency_target_us(&self) -> u32 {
        self.rebuild_latency_target_us.load(Ordering::Relaxed)
    }
    /// Threads writing the stripe cache out: group_thread_cnt, or one per
    /// core for 0.
    pub fn worker_threads(&self) -> usize {
        match self.group_thread_cnt.load(Ordering::Relaxed) {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        }
    }
}

/// Where the settings of an array are kept between runs: md keeps none of
/// them (they are sysfs values, lost at reboot, and administrators re-apply
/// them from scripts), a controller keeps them in its NVRAM. uraid keeps
/// them next to its configuration, one file per array UUID, like
/// mdadm.conf lines: `$URAID_CONFIG_DIR` or /etc/uraid.
pub mod saved {
    use super::TuningValues;
    use serde::{Deserialize, Serialize};
    use std::path::PathBuf;

    #[derive(Clone, Debug, Default, Serialize, Deserialize)]
    pub struct Saved {
        /// The knobs the user set, as given; the rest keep their defaults.
        pub settings: Vec<(String, String)>,
        /// --i-accept-data-loss was given (write-back without a journal).
        #[serde(default)]
        pub accept_data_loss: bool,
        /// The knobs `uraid tune --apply` set, and for what; a knob the
        /// user sets later leaves it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tuned: Option<Tuned>,
    }

    /// Where tuned knobs came from: shown by `uraid detail` beside them.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Tuned {
        /// The workload tuned for (bench's name: fio-randwrite, seq-1m, ...).
        pub workload: String,
        /// When the tuner applied them, "YYYY-MM-DD HH:MM UTC".
        pub when_utc: String,
        /// The knobs it set, as set.
        pub knobs: Vec<(String, String)>,
        /// "IOPS" or "MB/s", and what the tuner measured with the knobs and
        /// with the defaults on its scratch array.
        pub metric: String,
        pub value: f64,
        pub default_value: f64,
        /// The pick beat the defaults when measured again; false: the
        /// tuner kept the defaults.
        pub confirmed: bool,
    }

    pub fn dir() -> PathBuf {
        std::env::var_os("URAID_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/uraid"))
    }

    pub fn path(uuid: &str) -> PathBuf {
        dir().join(format!("{uuid}.json"))
    }

    /// The saved settings of an array; none saved is not an error.
    pub fn load(uuid: &str) -> Result<Saved, String> {
        let path = path(uuid);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| format!("{}: not uraid settings: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Saved::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Saves settings atomically (write, then rename).
    pub fn store(uuid: &str, saved: &Saved) -> Result<(), String> {
        let path = path(uuid);
        let fail = |e: std::io::Error| format!("cannot save settings to {}: {e}", path.display());
        std::fs::create_dir_all(dir()).map_err(fail)?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(saved).expect("settings serialise");
        std::fs::write(&tmp, text + "\n").map_err(fail)?;
        std::fs::rename(&tmp, &path).map_err(fail)
    }

    /// Saves settings given at create or on a live array with the array's
    /// others; the file holds only what the user chose.
    pub fn save_changes(
        uuid: &str,
        settings: &[(String, String)],
        accept_data_loss: bool,
    ) -> Result<(), String> {
        if settings.is_empty() && !accept_data_loss {
            return Ok(());
        }
        let mut stored = load(uuid)?;
        merge(&mut stored, settings);
        stored.accept_data_loss |= accept_data_loss;
        store(uuid, &stored)
    }

    /// Merges `key=value` changes into the saved list, the latest winning.
    /// A knob changed by hand is no longer the tuner's.
    pub fn merge(saved: &mut Saved, changes: &[(String, String)]) {
        for (k, v) in changes {
            saved.settings.retain(|(old, _)| old != k);
            saved.settings.push((k.clone(), v.clone()));
            if let Some(tuned) = &mut saved.tuned {
                tuned.knobs.retain(|(old, _)| old != k);
            }
        }
        if saved.tuned.as_ref().is_some_and(|t| t.knobs.is_empty()) {
            saved.tuned = None;
        }
    }

    /// Records the tuner's knobs, saved already by [`save_changes`].
    pub fn record_tuned(uuid: &str, mut tuned: Tuned) -> Result<(), String> {
        let mut stored = load(uuid)?;
        // Another change may have come between the two writes: the record
        // claims only what is saved.
        tuned.knobs.retain(|kv| stored.settings.contains(kv));
        stored.tuned = Some(tuned);
        store(uuid, &stored)
    }

    /// The values in force from defaults and saved settings, and what was
    /// not applied. `protected`: write-back is allowed (a journal, or
    /// --i-accept-data-loss saved or given now). Saved write-back that
    /// nothing protects any more (the journal is gone, the file was
    /// edited) falls back to write-through with a warning, as a
    /// controller's cache does when its battery fails: the array still
    /// starts. Any other bad value is an error naming the file.
    pub fn apply(
        defaults: TuningValues,
        saved: &Saved,
        protected: bool,
    ) -> Result<(TuningValues, Vec<String>), String> {
        let mut values = defaults;
        let mut warnings = Vec::new();
        let protected = protected || saved.accept_data_loss;
        for (k, v) in &saved.settings {
            if let Err(e) = values.set(k, v, protected) {
                let mut unprotected = values;
                if k == "write_policy" && unprotected.set(k, v, true).is_ok() {
                    warnings.push(format!(
                        "saved write_policy={v} not applied (no journal, and \
                         --i-accept-data-loss not given): writing through"
                    ));
                    continue;
                }
                return Err(format!("{}: saved {k}: {e}", path_hint()));
            }
        }
        Ok((values, warnings))
    }

    /// The settings folder, for messages (the file is named by UUID).
    fn path_hint() -> String {
        format!("settings in {}", dir().display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_parses_checks_and_prints_back() {
        let defaults = TuningValues::defaults(1024);
        assert_eq!(defaults.read_ahead, 2048);
        for (key, value) in defaults.pairs() {
            let mut v = defaults;
            v.set(&key, &value, false).unwrap();
            assert_eq!(v, defaults, "{key}");
        }
        assert_eq!(defaults.pairs().len(), KNOBS.len());
        let mut v = defaults;
        for (key, bad) in [
            ("stripe_cache_size", "16"),
            ("stripe_cache_size", "32769"),
            ("stripe_cache_size", "x"),
            ("max_sectors_kb", "6"),
            ("max_sectors_kb", "0"),
            ("read_ahead", "65537"),
            ("rmw_level", "3"),
            ("read_cache", "maybe"),
            ("write_policy", "write-around"),
            ("write_policy", "write-back"),
            ("group_thread_cnt", "65"),
            ("colour", "blue"),
        ] {
            let err = v.set(key, bad, false).unwrap_err();
            assert!(!err.contains('\n'), "{err}");
            assert_eq!(v, defaults, "{key}={bad} changed something");
        }
        v.set("write_policy", "write-back", true).unwrap();
        assert_eq!(v.write_policy, WritePolicy::WriteBack);
        v.set("stripe_cache_size", "32768", false).unwrap();
        assert_eq!(v.stripe_cache_size, 32768);
    }

    #[test]
    fn live_tunables_change_one_at_a_time() {
        let t = Tunables::new(&TuningValues::defaults(128), false);
        assert_eq!(t.stripe_cache_size(), 256);
        let (before, after) = t.set("stripe_cache_size", "4096").unwrap();
        assert_eq!(
            (before.stripe_cache_size, after.stripe_cache_size),
            (256, 4096)
        );
        assert_eq!(t.stripe_cache_size(), 4096);
        assert!(t.set("write_policy", "write-back").is_err());
        assert!(!t.write_back());
        assert_eq!(t.max_io_bytes(), 1280 * 1024);
    }

    #[test]
    fn a_knob_set_by_hand_leaves_the_tuners_record() {
        let mut s = saved::Saved::default();
        let knobs = vec![
            ("stripe_cache_size".to_string(), "4096".to_string()),
            ("rmw_level".to_string(), "2".to_string()),
        ];
        saved::merge(&mut s, &knobs);
        s.tuned = Some(saved::Tuned {
            workload: "fio-randwrite".into(),
            when_utc: "2000-01-01 00:00 UTC".into(),
            knobs,
            metric: "IOPS".into(),
            value: 2.0,
            default_value: 1.0,
            confirmed: true,
        });
        saved::merge(&mut s, &[("read_ahead".into(), "64".into())]);
        assert_eq!(s.tuned.as_ref().unwrap().knobs.len(), 2, "not a tuned knob");
        saved::merge(&mut s, &[("rmw_level".into(), "1".into())]);
        assert_eq!(
            s.tuned.as_ref().unwrap().knobs,
            [("stripe_cache_size".to_string(), "4096".to_string())]
        );
        saved::merge(&mut s, &[("stripe_cache_size".into(), "512".into())]);
        assert!(s.tuned.is_none(), "no knob of the tuner's is left");
        // A settings file from before the record reads as none.
        let old: saved::Saved = serde_json::from_str(r#"{"settings": []}"#).unwrap();
        assert!(old.tuned.is_none());
    }

    #[test]
    fn saved_settings_merge_and_apply() {
        let mut s = saved::Saved::default();
        saved::merge(&mut s, &[("read_ahead".into(), "64".into())]);
        saved::merge(&mut s, &[("read_ahead".into(), "128".into())]);
        assert_eq!(s.settings.len(), 1);
        let (v, warnings) = saved::apply(TuningValues::defaults(8), &s, false).unwrap();
        assert_eq!(v.read_ahead, 128);
        assert!(warnings.is_empty());
        // Saved write-back that nothing protects: write-through, a warning.
        s.settings
            .push(("write_policy".into(), "write-back".into()));
        let (v, warnings) = saved::apply(TuningValues::defaults(8), &s, false).unwrap();
        assert_eq!(v.write_policy, WritePolicy::WriteThrough);
        assert_eq!(v.read_ahead, 128);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("writing through"), "{warnings:?}");
        // Protected by what is given now, or by what was saved.
        let (v, warnings) = saved::apply(TuningValues::defaults(8), &s, true).unwrap();
        assert_eq!(v.write_policy, WritePolicy::WriteBack);
        assert!(warnings.is_empty());
        s.accept_data_loss = true;
        let (v, _) = saved::apply(TuningValues::defaults(8), &s, false).unwrap();
        assert_eq!(v.write_policy, WritePolicy::WriteBack);
        // Any other bad value stops the start, with a message.
        s.settings.push(("stripe_cache_size".into(), "5".into()));
        let e = saved::apply(TuningValues::defaults(8), &s, true).unwrap_err();
        assert!(e.contains("stripe_cache_size"), "{e}");
    }
}
