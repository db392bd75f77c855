//! A deterministic simulation of the live engine, in the style of
//! TigerBeetle's VOPR: a seeded random generator drives an in-process engine
//! over in-memory members through thousands of steps, and a model of what
//! every array sector must hold checks each read.
//!
//! Each member is a `MemoryMember` wrapped in a `FaultyMember` with a
//! volatile write cache (`Fault::WriteCache`), so that a write reaches the
//! "platter" only when the engine flushes the member. The steps are:
//!
//! * writes of random size and alignment (whole member blocks, anywhere in
//!   the array, across chunk and stripe boundaries), some with FUA;
//! * reads, compared with the model;
//! * flushes;
//! * member faults — pull, bad ranges (read, write or both, remapped or
//!   not), a random error rate, torn writes — and restores, never beyond
//!   what the level promises: a member is hit only if the geometry
//!   (`Geometry::survives`) says the array keeps its data with it lost
//!   along with every role already compromised (missing, being rebuilt,
//!   or held by a member with faults). raid10 may so lose two members of
//!   different mirror sets, raid6 any two. A dRAID role held by a
//!   distributed spare in sync is not compromised: the spare's space on a
//!   child is one column of the rows that use it, lost with that child
//!   and with nothing else;
//! * `manage_fail` of a member and `manage_add` of a fresh one (an image
//!   file), whose rebuild runs in the background while the steps go on;
//!   some arrays also start with a hot spare;
//! * checks (md's sync_action "check") started while I/O goes on;
//! * reshapes of raid5 and raid6 (1.2 metadata, which has room to move the
//!   data into): one member more (a spare is added first if none waits),
//!   one fewer (with the smaller size stated, as `--array-size` does), a
//!   chunk twice or half the size, another layout, or raid5 to raid6 (Q
//!   on a spare taken in, then a restripe). The job runs in the
//!   background, at its own speed limit so that it spans steps, while
//!   every other step goes on: I/O on both sides of the moving point,
//!   faults, failures and adds, checks, orderly restarts and crashes, after
//!   which the engine must resume it when it starts. md's refusals (no room
//!   left, no spare, a degraded array, a change that would shrink the array
//!   unasked) end the step;
//! * dRAID arrays (one to three parity columns, one 16 MiB slice per
//!   child, with or without a distributed spare): a failure is rebuilt onto
//!   the distributed spare, and a disk added later takes the role back
//!   while the steps go on;
//! * silent corruption on the seeds that draw `--integrity crc32c`
//!   (about a third of those with 1.2 metadata, where the checksums have
//!   room; they skip reshapes, which such arrays refuse): one to four
//!   4 KiB pages of a member's data area overwritten on the platter
//!   (`Fault::Corrupt`, stored), no error returned. A rotten member counts
//!   as compromised until a check heals it, and reads must still return
//!   the model's bytes: a `ChecksumUncorrectable` event fails the seed;
//! * orderly restarts (shutdown, assemble, start);
//! * crashes: power fails. The engine is dropped without a shutdown (in
//!   half of the crashes every member is first cut off, so that power fails
//!   in the middle of whatever the background job was doing), every member
//!   loses its volatile cache except a random fraction of its blocks
//!   (`crash_keeping`), and the array is assembled again from the same
//!   members and started; it resyncs in the background.
//!
//! # The model
//!
//! For every 512-byte array sector the model keeps the value it must read
//! now (`cur`) and the value it was last *known durable* with (`durable`):
//! after a flush (`BlockBackend::flush` returned), every write acknowledged
//! before it is durable; after a FUA write returned, that write is durable.
//! Each sector also lists the writes to it since it was last known durable.
//!
//! After a crash, a sector must read either its durable value or the value
//! of one of the writes to it since: the write cache keeps or loses each
//! member block whole, and engine-internal flushes (superblock updates) may
//! have made any of those writes durable. Once read, the sector's value is
//! pinned: the model takes it as the sector's durable and current value.
//! Sectors without writes since their durable point must read exactly.
//!
//! The one exception is md's write hole. A parity row (the same member
//! sector across the members of a raid4/5/6 stripe) that had writes in
//! flight at a crash may have data and parity that disagree until a resync
//! has repaired it. If the member holding a data sector of such a row is
//! missing or faulty (or becomes so later), that sector is rebuilt from
//! disagreeing blocks, which gives garbage — in md too. Such sectors are
//! *wild*: the model accepts any value until the sector is written while
//! its member is sound (a write to it while its member is lost or faulty
//! is folded into parity that was already wrong); a wild sector written
//! but not yet flushed may come back wild after a crash. Rows stop being
//! suspect when a full check of a fully in-sync array finds no mismatch.
//! Mirrors have no write hole: every copy holds one of the allowed values,
//! and the resync copies the copy that reads return.
//!
//! A reshape gives the array two placements at once, the old geometry's
//! and the new one's (a `Layout` each, whose rows never mix). Where the
//! point stands between two steps is the engine's business, so the
//! write-hole rule applies through both: a crash makes suspect the rows of
//! every pending sector in either, and a member lost taints its data in
//! suspect rows of either. Once the reshape ends, only the new placement
//! holds rows: the job rewrote every old row with fresh parity from what
//! it read (a lost member's data in a suspect row being tainted already).
//! A shrink drops the sectors past the new end when it starts (the array
//! is made smaller first, as md has it); a grow adds zeroes past the old
//! end when it ends (md zero-fills the rows it adds).
//!
//! Further checks: every read, write and flush must succeed (the faults
//! never exceed what the level survives); a dirty degraded parity array
//! must refuse to start without `force`; an orderly shutdown must succeed
//! and leave the array clean; after the resync that follows a crash, a
//! check must find no mismatch, and its count must equal what the same
//! check finds stripe by stripe on the members (`array::resync`, offline);
//! mid-reshape the array must serve the size the model has, and a reshape
//! must end with the shape it was asked for.
//! raid6 started degraded after a crash is the one exception: rebuilding a
//! member from P can make the write hole visible to Q, so mismatches are
//! accepted in stripes with suspect rows only, and a repair must clear
//! them. Background work must always finish: a missing role with a spare
//! or a half-rebuilt member available must be rebuilt without further
//! prompting, and no engine call may hang (a watchdog reports a seed that
//! stops making progress as a deadlock).
//!
//! # Determinism and replay
//!
//! Every decision comes from the seed. The background job runs on its own
//! thread, so its interleaving with the steps (and with the random error
//! draws of a member it reads) varies from run to run; the sequence of
//! operations does not, and a failing seed usually fails again. A failure
//! names the level, seed and step, and shows the last operations:
//!
//! ```text
//! URAID_SIM_SEED=17 cargo test --release --locked --test simulation -- --exact sim_raid5 --nocapture
//! ```
//!
//! `URAID_SIM_SEEDS=N` runs N seeds per level (default 40, 5 for dRAID),
//! `URAID_SIM_FIRST_SEED` where they start, `URAID_SIM_STEPS=N` the steps
//! per seed (default 300). Seeds that once failed go into
//! `REGRESSION_SEEDS`, which run with every other seed unless
//! `URAID_SIM_REGRESSIONS=0`. Each seed that passes prints a `sim-stats`
//! line of `name=value` counters; `scripts/simulate --hours H` runs fresh
//! seeds of every level for hours and sums them.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::{BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use uraid::array::{
    assemble_members, create_on_members, Assembled, CreateOptions, DeviceState, ReshapeRequest,
    SpareRoutes,
};
use uraid::engine::tuning::{TuningValues, WritePolicy};
use uraid::engine::{Engine, EngineError, EngineOptions, Snapshot, SyncAction};
use uraid::export::BlockBackend;
use uraid::format::Metadata;
use uraid::geometry::{Geometry, Level, Place};
use uraid::member::{
    BadRange, CorruptMode, CorruptRange, EioRate, Fault, FaultPlan, FaultyMember, FileMember,
    MemberRef, MemoryMember, OpenOptions, Ops, Torn, WriteCache,
};

const SECTOR: usize = 512;

/// Seeds that failed once, by level; they run in every test run.
///
/// raid5 seed 2: a member being rebuilt when the power failed was never
/// rebuilt again (the resync after the crash did not resume the recovery).
///
/// draid3 seed 524389239420: a distributed spare was failed because one of
/// its children's flushes failed; at the next assembly its superblock was
/// read from one stale child, the spare was left out, an added disk took its
/// device number, and the stale spare came back beside it with that number.
///
/// raid6 seed 43: after a crash an array sector read no value the model
/// knew; draid2 seed 59 and draid3 seed 52: two roles missing and a
/// distributed spare waiting, but no rebuild started.
///
/// raid10 seed 977996841513 (timing-dependent, about one run in eight): a
/// recovery resumed while the finished job's end was still to run moved the
/// member's position back to the superblock's checkpoint, writes skipped the
/// member, and the late end declared it in sync.
///
/// draid3 seed 265821991143: a superblock write torn on a child left a
/// part-written copy of a distributed spare's superblock there; the read
/// back took that copy, the spare was failed with the child, and with two
/// roles already failed the array had one loss more than its parity.
const REGRESSION_SEEDS: &[(Level, u64)] = &[
    (Level::Raid5, 2),
    (Level::Draid3, 524389239420),
    (Level::Raid6, 43),
    (Level::Draid2, 59),
    (Level::Draid3, 52),
    (Level::Raid10, 977996841513),
    (Level::Draid3, 265821991143),
];

/// How long background work may take before the simulation calls it stuck.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// How long the engine may sit idle with work left (a missing role and a
/// spare, a half-rebuilt member) before the simulation calls it stuck.
const STUCK_LIMIT: Duration = Duration::from_secs(1);
/// How long one step may take before the simulation calls it a deadlock.
const STEP_LIMIT: Duration = Duration::from_secs(15);

/// The recent operations of a seed, kept for failure messages (and for the
/// watchdog, which reports a seed that stops making progress).
#[derive(Default)]
struct Trace {
    ops: Vec<String>,
    /// Operations recorded so far: the watchdog's measure of progress.
    count: u64,
}

impl Trace {
    fn push(&mut self, step: usize, text: String) {
        self.ops.push(format!("step {step}: {text}"));
        if self.ops.len() > 60 {
            self.ops.remove(0);
        }
        self.count += 1;
    }

    fn text(&self) -> String {
        self.ops.join("\n  ")
    }

    /// Progress without an operation (a wait that polls the engine).
    fn heartbeat(&mut self) {
        self.count += 1;
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

// ---------------------------------------------------------------------------
// The shape of one simulated array, drawn from the seed.

#[derive(Clone, Debug)]
struct Config {
    level: Level,
    disks: usize,
    spares: usize,
    chunk_bytes: Option<u64>,
    layout: Option<String>,
    metadata: Metadata,
    /// Logical block of the in-memory members (512 or 4096).
    block: u32,
    /// Bytes of each member the array uses.
    data_bytes: u64,
    member_bytes: u64,
    /// Write cache capacity per member (None: the 64 MiB default, which
    /// never fills here, so only flushes destage).
    cache_capacity: Option<u64>,
    /// The background job's speed limit, KiB/s per member (None: unlimited).
    speed_kib: Option<u64>,
    /// The speed limit while a reshape runs: low enough that it spans
    /// steps, high enough that a settle sees it end.
    reshape_kib: u64,
    /// `create --integrity crc32c`: a checksum of every member block, and
    /// bit rot (`corrupt:stored`) among the faults.
    integrity: bool,
}

impl Config {
    fn draw(level: Level, rng: &mut StdRng) -> Config {
        let pick = |rng: &mut StdRng, items: &[&'static str]| items[rng.gen_range(0..items.len())];
        let (disks, layout) = match level {
            Level::Raid5 => {
                let layout = pick(
                    rng,
                    &[
                        "left-symmetric",
                        "left-asymmetric",
                        "right-symmetric",
                        "right-asymmetric",
                        "parity-first",
                        "parity-last",
                    ],
                );
                (rng.gen_range(3..=6), Some(layout))
            }
            Level::Raid6 => {
                let layout = pick(
                    rng,
                    &[
                        "left-symmetric",
                        "right-asymmetric",
                        "parity-first",
                        "left-symmetric-6",
                        "ddf-N-continue",
                    ],
                );
                (rng.gen_range(4..=7), Some(layout))
            }
            Level::Raid1 => (rng.gen_range(2..=4), None),
            Level::Raid10 => {
                // Two copies or three: the geometry says which members
                // may go together (two of different mirror sets, say).
                let layout = pick(rng, &["n2", "f2", "o2", "n3", "f3", "o3"]);
                (rng.gen_range(3..=6), Some(layout))
            }
            // dRAID with one 16 MiB slice per child: a group as wide as
            // the children left by the spares (so a slice is one row),
            // and at most one distributed spare.
            Level::Draid1 | Level::Draid2 | Level::Draid3 => {
                let parity = level.parity_members();
                let spares = usize::from(rng.gen_bool(0.5));
                let width = rng.gen_range(parity + 2..=parity + 4);
                let layout = format!("{}d:{spares}s", width - parity);
                (width + spares, Some(layout.leak() as &'static str))
            }
            other => panic!("no simulation for {other}"),
        };
        let chunk_bytes = (level != Level::Raid1).then(|| 4096u64 << rng.gen_range(0..4));
        let block = if rng.gen_bool(0.2) { 4096 } else { 512 };
        let data_bytes = match chunk_bytes {
            _ if level.is_draid() => 16 << 20,
            Some(chunk) => chunk * rng.gen_range(16..=40),
            None => 4096 * rng.gen_range(64..=200),
        };
        // Room for the superblock area and mdadm's data offset (1 MiB for
        // members this small) in front, or the 1.0 superblock behind; a
        // dRAID child also keeps a metadata slot per distributed spare.
        let spare_slots = if level.is_draid() { 2 << 20 } else { 0 };
        let member_bytes = data_bytes + (1536 << 10) + spare_slots;
        Config {
            level,
            disks,
            spares: usize::from(rng.gen_bool(0.3)),
            chunk_bytes,
            layout: layout.map(String::from),
            metadata: if rng.gen_bool(0.3) && !level.is_draid() {
                Metadata::V1_0
            } else {
                Metadata::V1_2
            },
            block,
            data_bytes,
            member_bytes,
            cache_capacity: rng.gen_bool(0.3).then(|| 4096u64 << rng.gen_range(3..7)),
            speed_kib: rng.gen_bool(0.25).then_some(20_000),
            reshape_kib: [5_000, 20_000, 100_000][rng.gen_range(0..3)],
            integrity: false,
        }
    }

    /// A third of the seeds with metadata 1.2 (the checksums live after
    /// md's data area, where 1.0 keeps its superblock) get integrity. Drawn
    /// from a generator of its own, so that the seeds without it draw what
    /// they drew before integrity was simulated.
    fn draw_integrity(&mut self, seed: u64) {
        let mut rng =
            StdRng::seed_from_u64(seed ^ 0x1c_0000_0000 ^ (self.level.md_number() as u64) << 40);
        if self.metadata == Metadata::V1_2 && rng.gen_bool(0.35) {
            self.integrity = true;
            // The region: a 4 KiB header, the untrusted bitmap and 4 bytes
            // of checksum per 4 KiB block, with room to spare.
            self.member_bytes += 256 << 10;
        }
    }

    fn cache(&self) -> WriteCache {
        WriteCache {
            enabled: true,
            capacity_bytes: self.cache_capacity,
        }
    }

    /// The fault plan of a healthy member: only its write cache.
    fn healthy_plan(&self) -> FaultPlan {
        FaultPlan {
            write_cache: Some(self.cache()),
            ..FaultPlan::default()
        }
    }
}

// ---------------------------------------------------------------------------
// The model of the array's contents.

struct Model {
    cur: Vec<u8>,
    durable: Vec<u8>,
    /// Per sector: the writes (indexes into `writes`) since it was last known durable.
    pending: Vec<Vec<u32>>,
    /// The writes since the last flush: offset in bytes and data.
    writes: Vec<(u64, Vec<u8>)>,
    /// Sectors whose value is unknown (md's write hole), until written.
    wild: Vec<bool>,
    /// Sectors whose durable value is unknown: wild, then written but not
    /// yet flushed (a crash may bring the unknown value back).
    durable_wild: Vec<bool>,
    /// Parity rows whose data and parity may disagree: the layout they
    /// belong to (see `Layout`) and the member sector.
    suspect: BTreeSet<(u32, u64)>,
}

impl Model {
    fn new(size: usize) -> Model {
        Model {
            cur: vec![0; size],
            durable: vec![0; size],
            pending: vec![Vec::new(); size / SECTOR],
            writes: Vec::new(),
            wild: vec![false; size / SECTOR],
            durable_wild: vec![false; size / SECTOR],
            suspect: BTreeSet::new(),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8], fua: bool) {
        let id = self.writes.len() as u32;
        self.writes.push((offset, data.to_vec()));
        let at = offset as usize;
        self.cur[at..at + data.len()].copy_from_slice(data);
        for s in at / SECTOR..(at + data.len()) / SECTOR {
            self.wild[s] = false;
            if fua {
                self.durable_wild[s] = false;
                self.durable[s * SECTOR..(s + 1) * SECTOR]
                    .copy_from_slice(&self.cur[s * SECTOR..(s + 1) * SECTOR]);
                self.pending[s].clear();
            } else {
                self.pending[s].push(id);
            }
        }
    }

    /// The array has a new size: sectors past a smaller end are forgotten,
    /// and those past the old end of a larger one read as zeroes (md
    /// zero-fills the rows a growing reshape adds, and flushes them).
    fn resize(&mut self, size: usize) {
        let sectors = size / SECTOR;
        self.cur.resize(size, 0);
        self.durable.resize(size, 0);
        self.pending.resize(sectors, Vec::new());
        self.wild.resize(sectors, false);
        self.durable_wild.resize(sectors, false);
    }

    /// Everything acknowledged so far is durable.
    fn flush(&mut self) {
        self.durable.copy_from_slice(&self.cur);
        self.durable_wild.copy_from_slice(&self.wild);
        for p in self.pending.iter_mut() {
            p.clear();
        }
        self.writes.clear();
    }

    /// The value of write `id` at sector `s`.
    fn version(&self, id: u32, s: usize) -> &[u8] {
        let (offset, data) = &self.writes[id as usize];
        let from = s * SECTOR - *offset as usize;
        &data[from..from + SECTOR]
    }

    /// The values sector `s` may hold after a crash.
    fn allowed(&self, s: usize) -> Vec<&[u8]> {
        let mut allowed = vec![&self.durable[s * SECTOR..(s + 1) * SECTOR]];
        allowed.extend(self.pending[s].iter().map(|&id| self.version(id, s)));
        allowed
    }

    /// Names the value `got` of sector `s`, for failure messages.
    fn describe(&self, s: usize, got: &[u8]) -> String {
        let range = s * SECTOR..(s + 1) * SECTOR;
        let mut names = Vec::new();
        if got == &self.cur[range.clone()] {
            names.push("the current value".to_string());
        }
        if got == &self.durable[range] {
            names.push("the last durable value".to_string());
        }
        for &id in &self.pending[s] {
            if got == self.version(id, s) {
                names.push(format!("pending write #{id}"));
            }
        }
        if got.iter().all(|b| *b == 0) {
            names.push("zeroes".to_string());
        }
        if names.is_empty() {
            // A value that belongs elsewhere points at misplaced I/O
            // rather than a wrong computation.
            let elsewhere: Vec<String> = (0..self.cur.len() / SECTOR)
                .filter(|&t| t != s && got == &self.cur[t * SECTOR..(t + 1) * SECTOR])
                .take(4)
                .map(|t| t.to_string())
                .collect();
            if elsewhere.is_empty() {
                "no value the model knows".to_string()
            } else {
                format!(
                    "no value the model knows for it, but the current value of sector(s) {}",
                    elsewhere.join(", ")
                )
            }
        } else {
            names.join(", ")
        }
    }
}

// ---------------------------------------------------------------------------
// Where the array's sectors live, for the write-hole rule.

/// One geometry's placement of the array's sectors (parity levels). A
/// reshape has two at once: each sector is on one side of the moving point,
/// which the simulation cannot pin down between two of its steps, so the
/// write-hole rule applies through both. Rows are member sectors counted
/// from the layout's own data start and named with the layout's `id`, so
/// the rows of the two never mix.
struct Layout {
    id: u32,
    geometry: Geometry,
    /// (role, member sector of the row) -> the array sector stored there.
    data_at: HashMap<(usize, u64), usize>,
    /// Per array sector: the member sector of its row.
    row_of: Vec<u64>,
    /// Per array sector: the place that holds it (a dRAID column that
    /// wraps lies one 16 MiB row below its row's P), which says on which
    /// child a distributed spare standing in its role keeps it.
    place_of: Vec<Place>,
}

impl Layout {
    /// The placement of the first `sectors` array sectors by `geometry`.
    fn new(id: u32, geometry: Geometry, sectors: usize) -> Layout {
        let mut layout = Layout {
            id,
            geometry,
            data_at: HashMap::new(),
            row_of: vec![0; sectors],
            place_of: vec![
                Place {
                    member: 0,
                    member_sector: 0,
                };
                sectors
            ],
        };
        if !layout.geometry.level().has_parity() {
            return layout;
        }
        for stripe in 0..layout.geometry.stripe_count() {
            let map = layout.geometry.stripe(stripe);
            // A row is named by where its P lies: on md's levels every
            // strip of the row is there too; a dRAID column may wrap to
            // the next 16 MiB row, P never does.
            let row = map.p.expect("a parity level").member_sector;
            for (i, strip) in map.data.iter().enumerate() {
                let place = strip.copies[0];
                for k in 0..map.strip_sectors {
                    let s = (map.array_sector + i as u64 * map.strip_sectors + k) as usize;
                    // A grow's new geometry reaches past the array's end
                    // until the reshape is done; a shrink's old one does.
                    if s < sectors {
                        layout.row_of[s] = row + k;
                        layout.place_of[s] = Place {
                            member: place.member,
                            member_sector: place.member_sector + k,
                        };
                        layout.data_at.insert((place.member, row + k), s);
                    }
                }
            }
        }
        layout
    }

    /// The suspect row of array sector `s` in this layout.
    fn row(&self, s: usize) -> (u32, u64) {
        (self.id, self.row_of[s])
    }
}

// ---------------------------------------------------------------------------
// The simulation.

/// A device the array has ever had.
struct Dev {
    name: String,
    /// The fault injector in front of it; None for an image file added
    /// since the last start (the engine opened it itself).
    wrapper: Option<Arc<FaultyMember>>,
    /// The image file, for devices added by `manage_add`.
    file: Option<PathBuf>,
}

/// The counters of what a seed did, summed per level and printed per seed
/// (`sim-stats` lines) for long runs to add up.
macro_rules! stats {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        #[derive(Default, Debug)]
        struct Stats {
            $($(#[$doc])* $field: u64,)*
        }

        impl Stats {
            fn add(&mut self, other: &Stats) {
                $(self.$field += other.$field;)*
            }

            /// `name=value` for every counter, space-separated.
            fn line(&self) -> String {
                [$(format!("{}={}", stringify!($field), self.$field)),*].join(" ")
            }
        }
    };
}

stats! {
    steps,
    writes,
    reads,
    flushes,
    faults,
    fails,
    adds,
    checks,
    crashes,
    crashes_degraded,
    restarts,
    kept_blocks,
    lost_blocks,
    wild_sectors,
    reshapes,
    reshapes_refused,
    reshapes_finished,
    /// Steps, crashes and orderly restarts while a reshape ran.
    steps_reshaping,
    crashes_reshaping,
    restarts_reshaping,
    /// Faults and failures of a member while another role was compromised.
    losses_beyond_one,
    /// Faults and failures of a member while a distributed spare held a role.
    losses_beside_spare,
    /// Bit rot applied to a member of an integrity array, and the checks
    /// run to heal it.
    rots,
    rots_healed,
    /// ChecksumError events the engine raised (the first of each member's
    /// blocks; reads, checks and rebuilds find rot).
    checksum_errors,
}

struct Sim {
    /// The level the seed created (a level change may change the array's).
    level: Level,
    cfg: Config,
    seed: u64,
    rng: StdRng,
    step: usize,
    /// The recent operations, shared with the watchdog.
    trace: Arc<Mutex<Trace>>,
    dir: tempfile::TempDir,
    devs: Vec<Dev>,
    engine: Option<Arc<Engine>>,
    geometry: Geometry,
    size: u64,
    model: Model,
    /// Where the array's sectors live: one layout, or during a reshape the
    /// old and the new one (in that order).
    layouts: Vec<Layout>,
    next_layout: u32,
    /// The reshape the simulation started, while it runs.
    reshape: Option<String>,
    /// I/O steps left before the post-crash resync is awaited.
    resync_steps_left: Option<usize>,
    /// Whether the last start after a crash found the array degraded.
    started_degraded: bool,
    added: usize,
    stats: Stats,
    /// The last engine event recorded in the trace.
    last_event: Option<uraid::engine::Event>,
    /// Devices holding bit rot that no check has healed yet: compromised,
    /// as a faulty member is, since the rotten blocks are lost data until
    /// healed (the checksums find them, redundancy must rebuild them).
    rot: BTreeSet<usize>,
}

macro_rules! fail {
    ($sim:expr, $($arg:tt)*) => {
        $sim.fail(format!($($arg)*))
    };
}

impl Sim {
    fn new(level: Level, seed: u64, trace: Arc<Mutex<Trace>>) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0000 ^ (level.md_number() as u64) << 40);
        let mut cfg = Config::draw(level, &mut rng);
        cfg.draw_integrity(seed);
        let dir = tempfile::Builder::new()
            .prefix(&format!("uraid-sim-{level}-{seed}-"))
            .tempdir_in(std::env::temp_dir())
            .expect("scratch folder");
        let mut devs = Vec::new();
        for i in 0..cfg.disks + cfg.spares {
            let name = format!("sim{seed}-{level}-m{i}");
            let inner: MemberRef = Arc::new(MemoryMember::new(&name, cfg.member_bytes, cfg.block));
            let wrapper = Arc::new(FaultyMember::with_seed(inner, seed * 64 + i as u64));
            wrapper.set_plan(cfg.healthy_plan());
            devs.push(Dev {
                name,
                wrapper: Some(wrapper),
                file: None,
            });
        }
        let options = CreateOptions {
            level,
            raid_disks: cfg.disks as u32,
            chunk_bytes: cfg.chunk_bytes,
            layout: cfg.layout.clone(),
            metadata: cfg.metadata,
            assume_clean: rng.gen_bool(0.5),
            name: "sim".into(),
            size_sectors: Some(cfg.data_bytes / SECTOR as u64),
            force: false,
            homehost: None,
            integrity: cfg.integrity,
        };
        let members = devs
            .iter()
            .map(|d| Some((d.name.clone(), d.wrapper.clone().unwrap() as MemberRef)))
            .collect();
        let assembled = create_on_members(members, &options, |_, _| {})
            .unwrap_or_else(|e| panic!("{level} seed {seed}: create {cfg:?}: {e}"));
        let geometry = assembled.geometry.clone();
        let size = geometry.array_sectors() * SECTOR as u64;
        let mut sim = Sim {
            level,
            seed,
            rng,
            step: 0,
            trace,
            dir,
            devs,
            engine: None,
            geometry,
            size,
            model: Model::new(size as usize),
            layouts: Vec::new(),
            next_layout: 0,
            reshape: None,
            resync_steps_left: None,
            started_degraded: false,
            added: 0,
            stats: Stats::default(),
            last_event: None,
            rot: BTreeSet::new(),
            cfg,
        };
        sim.layouts = vec![sim.layout(sim.geometry.clone())];
        sim.op(format!("create {:?}", sim.cfg));
        sim.start(assembled);
        sim.verify_all("after create");
        sim
    }

    /// A new layout of the array's sectors by `geometry`.
    fn layout(&mut self, geometry: Geometry) -> Layout {
        self.next_layout += 1;
        Layout::new(self.next_layout, geometry, self.size as usize / SECTOR)
    }

    /// The roles the array has: during a reshape, those of the larger
    /// geometry.
    fn roles(&self) -> usize {
        self.layouts
            .iter()
            .map(|l| l.geometry.raid_disks())
            .max()
            .unwrap_or(self.cfg.disks)
    }

    fn engine(&self) -> &Arc<Engine> {
        self.engine.as_ref().expect("an engine is running")
    }

    /// Records the engine's events since the last look in the trace, so
    /// that a failure shows them among the operations.
    fn trace_events(&mut self) {
        let Some(engine) = &self.engine else { return };
        let events = engine.snapshot().events;
        let new: Vec<String> = match &self.last_event {
            None => events.iter(),
            Some(last) => match events.iter().rposition(|e| {
                (e.time_secs, &e.event, &e.device, &e.detail)
                    == (last.time_secs, &last.event, &last.device, &last.detail)
            }) {
                Some(i) => events[i + 1..].iter(),
                None => events.iter(),
            },
        }
        .filter(|e| !e.event.starts_with("Rebuild") || !e.event[7..].starts_with(char::is_numeric))
        .map(|e| format!("  (event {} {} {})", e.event, e.device, e.detail))
        .collect();
        self.last_event = events.last().cloned();
        for text in new {
            self.stats.checksum_errors += u64::from(text.starts_with("  (event ChecksumError "));
            let uncorrectable = text.starts_with("  (event ChecksumUncorrectable ");
            self.op(text);
            // The faults never exceed the level's redundancy: every block
            // that fails its checksum has the rest of its row to come from.
            if uncorrectable {
                fail!(
                    self,
                    "a rotten block could not be corrected within the level's redundancy"
                );
            }
        }
    }

    fn op(&mut self, text: String) {
        if std::env::var_os("URAID_SIM_VERBOSE").is_some() {
            eprintln!(
                "[{} seed {} step {}] {text}",
                self.level, self.seed, self.step
            );
        }
        self.trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.step, text);
    }

    /// The layout of an array no reshape is moving (while one runs, the
    /// new one, for failure messages).
    fn settled_layout(&self) -> &Layout {
        self.layouts.last().expect("a layout")
    }

    fn fail(&self, what: String) -> ! {
        let snapshot = self
            .engine
            .as_ref()
            .map(|e| describe_snapshot(&e.snapshot()))
            .unwrap_or_else(|| "(no engine running)".into());
        panic!(
            "SIMULATION FAILED: {level} seed {seed} step {step}: {what}\n\
             {replay}\n\
             config: {cfg:?}\n\
             engine: {snapshot}\n\
             last operations:\n  {ops}",
            level = self.level,
            seed = self.seed,
            step = self.step,
            replay = replay_line(self.level, self.seed),
            cfg = self.cfg,
            ops = self.trace.lock().unwrap_or_else(|e| e.into_inner()).text(),
        )
    }

    fn dev_index(&self, name: &str) -> Option<usize> {
        self.devs.iter().position(|d| d.name == name)
    }

    /// The member serving each role in sync, by device index.
    fn active_roles(&self, snapshot: &Snapshot) -> Vec<Option<usize>> {
        let mut roles = vec![None; self.roles()];
        for d in &snapshot.devices {
            if let DeviceState::Active { role } = d.state {
                if role < roles.len() {
                    roles[role] = self.dev_index(&d.path);
                }
            }
        }
        roles
    }

    fn has_faults(&self, dev: usize) -> bool {
        self.rot.contains(&dev)
            || self.devs[dev]
                .wrapper
                .as_ref()
                .is_some_and(|w| w.plan() != self.cfg.healthy_plan())
    }

    /// With write-back the cache writes in the background: a one-shot fault
    /// (a torn write) can have fired there with its member not yet failed,
    /// and look like no fault at all to `compromised`. A flush settles
    /// that, before a new fault or failure is chosen.
    fn settle_background_writes(&mut self) {
        if std::env::var("URAID_SIM_WRITE_POLICY").is_ok_and(|v| v == "write-back") {
            self.do_flush();
        }
    }

    /// Roles that are missing, being rebuilt, or held by a member with
    /// faults. A dRAID role held by a distributed spare in sync is not one
    /// of them: the spare's space on a child is one column of the rows that
    /// use it, lost with that child (whose role is counted) and with
    /// nothing else, so the array still survives what its parity promises.
    /// That holds while the role is being handed to a disk (the
    /// rebalance) too.
    fn compromised(&self) -> BTreeSet<usize> {
        let snapshot = self.engine().snapshot();
        let routes = self.spare_routes(&snapshot);
        self.active_roles(&snapshot)
            .iter()
            .enumerate()
            .filter(|(role, holder)| match holder {
                Some(d) => self.has_faults(*d),
                None => routes.as_ref().is_none_or(|r| r.spare_of(*role).is_none()),
            })
            .map(|(role, _)| role)
            .collect()
    }

    /// Whether the array keeps all of its data with the roles in
    /// `compromised` lost and `role` too: the geometry's rule, the one
    /// the engine's refusal of a `--fail` asks.
    fn survives_losing(&self, compromised: &BTreeSet<usize>, role: usize) -> bool {
        let geometry = self.engine().geometry();
        let mut missing = vec![false; geometry.raid_disks()];
        for r in compromised.iter().copied().chain([role]) {
            // A shrink the engine has just ended leaves the simulation a
            // role it has not yet taken in: no role of the array any more.
            if let Some(m) = missing.get_mut(r) {
                *m = true;
            }
        }
        geometry.survives(&missing)
    }

    /// Which distributed spare holds each role in sync (None without one).
    fn spare_routes(&self, snapshot: &Snapshot) -> Option<SpareRoutes> {
        let Geometry::Draid(draid) = &self.geometry else {
            return None;
        };
        let mut names: Vec<Option<&str>> = vec![None; draid.raid_disks()];
        for d in &snapshot.devices {
            if let DeviceState::Active { role } = d.state {
                names[role] = Some(&d.path);
            }
        }
        SpareRoutes::new(draid, names)
    }

    /// The write hole: a member about to be lost (or found lost) leaves its
    /// data sectors in suspect rows unknown, and with them those of roles
    /// held by a distributed spare whose space there lies on it.
    fn taint_role(&mut self, role: usize) {
        if !self.cfg.level.has_parity() {
            return;
        }
        let routes = self
            .engine
            .as_ref()
            .and_then(|e| self.spare_routes(&e.snapshot()));
        let mut lost = Vec::new();
        for &(id, row) in &self.model.suspect {
            let Some(layout) = self.layouts.iter().find(|l| l.id == id) else {
                continue;
            };
            for held in 0..layout.geometry.raid_disks() {
                let Some(&s) = layout.data_at.get(&(held, row)) else {
                    continue;
                };
                if column_chain(routes.as_ref(), layout.place_of[s]).contains(&role) {
                    lost.push(s);
                }
            }
        }
        for s in lost {
            if !self.model.wild[s] {
                self.model.wild[s] = true;
                self.model.durable_wild[s] = true;
                self.stats.wild_sectors += 1;
            }
        }
    }

    // -- starting and stopping ---------------------------------------------

    fn assemble(&self) -> Assembled {
        let members = self
            .devs
            .iter()
            .map(|d| {
                (
                    d.name.clone(),
                    d.wrapper.clone().expect("wrapped") as MemberRef,
                )
            })
            .collect();
        assemble_members(members).unwrap_or_else(|e| fail!(self, "assemble: {e}"))
    }

    /// Starts the engine on an assembled array. After a crash the array is
    /// dirty: a degraded parity array must then be refused without force.
    fn start(&mut self, assembled: Assembled) {
        let dirty = !assembled.is_clean();
        let missing = assembled.missing_roles();
        // A member rebuilt along with a reshape that holds only parity
        // where it is not yet in sync leaves nothing to reconstruct
        // wrongly: md starts such a dirty array (raid5_run's
        // dirty_parity_disks), and the kernel test proves it does.
        let degraded = missing.len() > uraid::array::dirty_parity_members(&assembled);
        let level = self.cfg.level;
        let mut assembled = assembled;
        let mut force = false;
        if level.has_parity() && degraded && dirty {
            match Engine::start(assembled, EngineOptions::default()) {
                Err(EngineError::DirtyDegraded { .. }) => {}
                Err(e) => fail!(self, "starting the dirty degraded array without force: {e}"),
                Ok(_) => fail!(self, "a dirty degraded {level} array started without force"),
            }
            assembled = self.assemble();
            force = true;
        }
        // Soak runs may put the stripe cache in write-back (acknowledged from
        // memory, on the members at the next FLUSH or FUA): the model's rules
        // hold for it too.
        let write_back = std::env::var("URAID_SIM_WRITE_POLICY").is_ok_and(|v| v == "write-back");
        let devices: Vec<String> = assembled
            .devices
            .iter()
            .map(|d| format!("{} events {} {:?}", d.path, d.sb.events, d.state))
            .collect();
        let engine = Engine::start(
            assembled,
            EngineOptions {
                read_only: false,
                force,
                // Odd seeds hand parity work to stripe workers, even ones
                // keep it on the writing thread: both paths meet every fault.
                tuning: Some(TuningValues {
                    write_policy: if write_back {
                        WritePolicy::WriteBack
                    } else {
                        WritePolicy::WriteThrough
                    },
                    group_thread_cnt: (self.seed % 2) as u32 * (1 + self.seed % 3) as u32,
                    ..TuningValues::defaults(self.geometry.stripe(0).data_sectors())
                }),
                accept_data_loss: write_back,
            },
        )
        .unwrap_or_else(|e| {
            fail!(
                self,
                "start (dirty {dirty}, degraded {degraded}): {e}; devices {devices:?}"
            )
        });
        self.engine = Some(engine);
        self.apply_speed();
        self.last_event = None;
        self.started_degraded = degraded;
        self.op(format!(
            "started (dirty {dirty}, degraded {degraded}, force {force})"
        ));
        // Members not in sync at the start may hide the write hole. (Taken
        // from the assembly: on these small arrays the engine may have
        // resynced and rebuilt a missing role before anyone looks.)
        for role in missing {
            self.taint_role(role);
        }
        self.follow_reshape();
    }

    /// The background job's speed limits: the reshape's while one runs.
    fn apply_speed(&self) {
        let speed = match self.reshape {
            Some(_) => self.cfg.reshape_kib,
            None => self.cfg.speed_kib.unwrap_or(100_000_000),
        };
        self.engine().set_speed_limits(Some(speed), Some(speed));
    }

    /// Takes in the end of the reshape the simulation started, once the
    /// engine's geometry is the new one: the array has its new size (the
    /// model reads zeroes past the old end of a grow), and only the new
    /// layout holds rows. Rows suspect in the old layout are healed: the
    /// reshape rewrote each with fresh parity from what it read, and what
    /// it read of a lost member's data in such a row was tainted when the
    /// member was lost.
    fn follow_reshape(&mut self) {
        let (Some(what), Some(engine)) = (&self.reshape, &self.engine) else {
            return;
        };
        let geometry = engine.geometry();
        if geometry.reshaping().is_some() {
            let serves = engine.size_bytes();
            if serves != self.size {
                fail!(
                    self,
                    "mid-reshape ({what}) the array serves {serves} bytes, expected {}",
                    self.size
                );
            }
            return;
        }
        let new = self.layouts.pop().expect("the new layout");
        let (disks, size) = (geometry.raid_disks(), geometry.array_sectors());
        if (disks, size) != (new.geometry.raid_disks(), new.geometry.array_sectors()) {
            fail!(
                self,
                "the reshape ({what}) ended with {disks} members and {size} sectors, planned {} and {}",
                new.geometry.raid_disks(),
                new.geometry.array_sectors()
            );
        }
        self.op(format!(
            "reshape finished ({what}): {disks} members, {size} sectors"
        ));
        self.size = size * SECTOR as u64;
        self.model.resize(self.size as usize);
        self.geometry = (*geometry).clone();
        self.layouts = vec![Layout::new(new.id, self.geometry.clone(), size as usize)];
        self.model.suspect.retain(|(id, _)| *id == new.id);
        self.cfg.disks = disks;
        let map = self.geometry.stripe(0);
        self.cfg.chunk_bytes = Some(map.strip_sectors * SECTOR as u64);
        let layout = self.engine().snapshot().sb.layout;
        self.cfg.level = self.geometry.level();
        self.cfg.layout = uraid::geometry::layout_name(self.cfg.level, layout);
        self.reshape = None;
        self.stats.reshapes_finished += 1;
        self.apply_speed();
    }

    /// Waits until the engine has nothing left to do in the background: no
    /// job, no half-rebuilt member, no spare waiting for a missing role.
    fn settle(&mut self, why: &str) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        let mut idle_since: Option<Instant> = None;
        loop {
            let snapshot = self.engine().snapshot();
            // The reshape job's thread outlives the reshape by a moment
            // (it then starts what waited for it): work still.
            let job = snapshot.sync.as_ref().map(|p| p.action).or_else(|| {
                self.engine()
                    .reshape_running()
                    .then_some(SyncAction::Reshape)
            });
            let recovering = snapshot
                .devices
                .iter()
                .find(|d| matches!(d.state, DeviceState::Recovering { .. }));
            let spare = snapshot
                .devices
                .iter()
                .find(|d| d.state == DeviceState::Spare);
            let waiting =
                !snapshot.missing_roles.is_empty() && spare.is_some() && snapshot.runnable;
            if job.is_none() && recovering.is_none() && !waiting {
                self.follow_reshape();
                return;
            }
            // Between two jobs the engine is idle for a moment; idle for a
            // whole second with work left, it has given up.
            let idle = *idle_since.get_or_insert_with(Instant::now);
            if job.is_some() {
                idle_since = None;
            }
            if Instant::now() > deadline || (job.is_none() && idle.elapsed() > STUCK_LIMIT) {
                let stuck = match (job, recovering, waiting) {
                    (Some(job), _, _) => format!("a {job:?} still runs"),
                    (None, Some(d), _) => format!(
                        "{} is {:?} but no job runs: its rebuild never resumes",
                        d.path, d.state
                    ),
                    _ => format!(
                        "roles {:?} are missing and {} is a spare, but no rebuild starts",
                        snapshot.missing_roles,
                        spare.unwrap().path
                    ),
                };
                fail!(self, "background work does not finish ({why}): {stuck}");
            }
            self.trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .heartbeat();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn events_matching(&self, event: &str, detail_prefix: &str) -> (usize, Option<String>, usize) {
        let events = self.engine().snapshot().events;
        let matching: Vec<&uraid::engine::Event> = events
            .iter()
            .filter(|e| e.event == event && e.detail.starts_with(detail_prefix))
            .collect();
        (
            matching.len(),
            matching.last().map(|e| e.detail.clone()),
            events.len(),
        )
    }

    /// Runs a check (or repair) to its end with nothing else going on and
    /// returns the mismatches it found. The end is the job's
    /// RebuildFinished event, which the engine posts after recording the
    /// count (the job disappears from the status slightly earlier).
    fn scrub(&mut self, repair: bool) -> u64 {
        match self.scrub_unless_stopped(repair) {
            Some(found) => found,
            None => fail!(self, "the scrub was stopped by a member's failure"),
        }
    }

    /// A check or repair, or `None` when a member's failure stopped it
    /// (`SyncStopped`: md does not resume a check after a failure).
    fn scrub_unless_stopped(&mut self, repair: bool) -> Option<u64> {
        let word = if repair { "repair" } else { "check" };
        self.settle(&format!("before a {word}"));
        let prefix = format!("{word}: mismatches found:");
        let (before, _, logged) = self.events_matching("RebuildFinished", &prefix);
        let (failed_before, _, _) = self.events_matching("SyncFailed", "");
        let (stopped_before, _, _) = self.events_matching("SyncStopped", "");
        assert!(
            logged < 200,
            "the event log of this engine is nearly full ({logged} events): the {word}'s end could not be told"
        );
        self.op(format!("start_scrub (repair {repair})"));
        // A job's end may start the next job (a spare waiting for a role)
        // just after status shows none: the scrub is then refused, as md
        // refuses a check during a recovery, and waits for it.
        let mut tries = 0;
        while let Err(e) = self.engine().start_scrub(repair) {
            tries += 1;
            if !e.contains("already running") || tries > 3 {
                fail!(self, "starting a {word}: {e}");
            }
            self.settle(&format!("before a {word}, again"));
        }
        let deadline = Instant::now() + SETTLE_LIMIT;
        let detail = loop {
            let (after, detail, _) = self.events_matching("RebuildFinished", &prefix);
            if after > before {
                break detail.unwrap();
            }
            let (failed, detail, _) = self.events_matching("SyncFailed", "");
            if failed > failed_before {
                fail!(self, "the {word} failed: {detail:?}");
            }
            if self.events_matching("SyncStopped", "").0 > stopped_before {
                self.op(format!("{word} stopped by a member's failure"));
                self.settle(&format!("after a stopped {word}"));
                return None;
            }
            if Instant::now() > deadline {
                fail!(self, "the {word} did not finish within {SETTLE_LIMIT:?}");
            }
            self.trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .heartbeat();
            std::thread::sleep(Duration::from_millis(1));
        };
        let found: u64 = detail[prefix.len()..].trim().parse().unwrap_or_else(|_| {
            fail!(self, "unexpected event detail {detail:?}");
        });
        let recorded = self.engine().mismatch_sectors();
        if recorded != found {
            fail!(self, "the {word} reported {found} mismatches in its event but mismatch_cnt is {recorded}");
        }
        self.op(format!("{word}: {found} mismatched sectors"));
        self.settle(&format!("after a {word}"));
        Some(found)
    }

    /// After the resync that follows a crash (or at the end): a check must
    /// find the array consistent.
    fn check_consistent(&mut self, why: &str) {
        self.stats.checks += 1;
        // A write-back stripe cache destages in the background: written out
        // first, it leaves the members still while they are compared.
        if let Err(e) = self.engine().flush() {
            fail!(self, "flush before a check: {e}");
        }
        let found = self.scrub(false);
        let snapshot = self.engine().snapshot();
        let in_sync = snapshot.missing_roles.is_empty();
        // The same check done here, stripe by stripe, on the members in sync.
        let mismatched = self.offline_check(&snapshot);
        let counted: u64 = mismatched.iter().map(|(_, n)| n).sum();
        if counted != found {
            fail!(self, "a check {why} counted {found} mismatched sectors, but the members hold {counted} (stripes {mismatched:?})");
        }
        if found != 0 {
            // One case is md's too: raid6 started degraded after a crash,
            // where a member rebuilt from P may disagree with Q in rows the
            // crash left inconsistent. Anywhere else, or if a repair does
            // not fix it, it is a bug.
            let outside: Vec<u64> = mismatched
                .iter()
                .map(|(stripe, _)| *stripe)
                .filter(|stripe| !self.stripe_suspect(*stripe))
                .collect();
            if self.cfg.level.parity_members() < 2 || !outside.is_empty() {
                fail!(
                    self,
                    "a check {why} found {found} mismatched sectors, in stripes {mismatched:?} \
                     (stripes no crash left inconsistent: {outside:?})"
                );
            }
            let _ = self.scrub(true);
            let again = self.scrub(false);
            if in_sync && again != 0 {
                fail!(
                    self,
                    "a check after a repair {why} found {again} mismatched sectors"
                );
            }
        }
        if in_sync {
            // A full check of a fully in-sync array proves every row agrees.
            self.model.suspect.clear();
        }
    }

    /// Whether a crash may have left a row of `stripe` inconsistent.
    fn stripe_suspect(&self, stripe: u64) -> bool {
        let layout = self.settled_layout();
        let map = layout.geometry.stripe(stripe);
        let first = map.p.expect("a parity level").member_sector;
        self.model
            .suspect
            .range((layout.id, first)..(layout.id, first + map.strip_sectors))
            .next()
            .is_some()
    }

    /// Where a member's data starts, from its superblock: each member
    /// records its own (a reshape moves it; the array's superblock in the
    /// snapshot is not kept in step). Mid-reshape, the new geometry's start.
    fn data_offset_bytes(&self, member: &dyn uraid::member::Member) -> u64 {
        let sb = match uraid::array::read_superblock(member) {
            Ok(Some(sb)) => sb,
            other => fail!(
                self,
                "reading the superblock of {}: {other:?}",
                member.name()
            ),
        };
        sb.new_data_offset_sectors() as u64 * SECTOR as u64
    }

    /// md's check, stripe by stripe, over the members in sync (read through
    /// their fault injectors, which hold their unflushed writes): the
    /// stripes that mismatch and how many sectors. The engine must be idle.
    fn offline_check(&self, snapshot: &Snapshot) -> Vec<(u64, u64)> {
        let mut slots: uraid::array::Slots = vec![None; self.roles()];
        for (role, dev) in self.active_roles(snapshot).iter().enumerate() {
            let Some(dev) = dev else { continue };
            let member: MemberRef = match (&self.devs[*dev].wrapper, &self.devs[*dev].file) {
                (Some(w), _) => w.clone(),
                (None, Some(path)) => Arc::new(
                    FileMember::open(path, OpenOptions { write: false })
                        .unwrap_or_else(|e| fail!(self, "opening {}: {e}", path.display())),
                ),
                (None, None) => unreachable!("a device is wrapped or a file"),
            };
            slots[role] = Some(uraid::array::Slot {
                data_offset_bytes: self.data_offset_bytes(&*member),
                member,
            });
        }
        // The spares hold their router weakly: it lives until the check ends.
        let _router = self.add_distributed_spares(snapshot, &mut slots);
        (0..self.geometry.stripe_count())
            .filter_map(|stripe| {
                let report =
                    uraid::array::resync(&self.geometry, &slots, stripe..stripe + 1, false, |_| {})
                        .unwrap_or_else(|e| fail!(self, "checking stripe {stripe} offline: {e}"));
                (report.mismatch_sectors > 0).then_some((stripe, report.mismatch_sectors))
            })
            .collect()
    }

    /// A dRAID's distributed spares in sync in a role, read as the engine
    /// reads them (each sector from the child that holds its column), so
    /// that the offline check sees every column the engine's check sees.
    fn add_distributed_spares(
        &self,
        snapshot: &Snapshot,
        slots: &mut uraid::array::Slots,
    ) -> Option<Arc<uraid::array::SpareRouter>> {
        let Geometry::Draid(draid) = &self.geometry else {
            return None;
        };
        let roles: Vec<Option<MemberRef>> = slots
            .iter()
            .map(|s| s.as_ref().map(|s| s.member.clone()))
            .collect();
        let router = uraid::array::SpareRouter::new(roles);
        let area = uraid::array::SpareArea {
            data_offset_sectors: snapshot.sb.data_offset_sectors,
            dev_sectors: snapshot.sb.size_sectors,
        };
        for d in &snapshot.devices {
            let DeviceState::Active { role } = d.state else {
                continue;
            };
            let Some(spare) = (0..draid.spares())
                .find(|&s| d.path == uraid::array::dspare::spare_name(draid.parity(), s))
            else {
                continue;
            };
            let member: MemberRef = Arc::new(uraid::array::DistributedSpare::new(
                draid,
                spare,
                area,
                router.clone(),
                self.cfg.block,
            ));
            slots[role] = Some(uraid::array::Slot {
                data_offset_bytes: area.data_offset_sectors * 512,
                member,
            });
        }
        Some(router)
    }

    /// Drops the engine and waits until no thread holds it any more.
    fn drop_engine(&mut self, engine: Arc<Engine>) {
        let weak: Weak<Engine> = Arc::downgrade(&engine);
        drop(engine);
        let deadline = Instant::now() + SETTLE_LIMIT;
        while weak.strong_count() > 0 {
            if Instant::now() > deadline {
                fail!(
                    self,
                    "the dropped engine is still alive after {SETTLE_LIMIT:?} (a thread holds it)"
                );
            }
            self.trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .heartbeat();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Devices the engine opened itself become wrapped devices again.
    fn rewrap_files(&mut self) {
        for i in 0..self.devs.len() {
            if self.devs[i].wrapper.is_some() {
                continue;
            }
            let path = self.devs[i].file.clone().unwrap();
            // The engine's last reference may still be dropping its members
            // on another thread (an Arc counts zero before its contents are
            // gone), so the file may stay locked for a moment.
            let deadline = Instant::now() + SETTLE_LIMIT;
            let file = loop {
                match FileMember::open(&path, OpenOptions { write: true }) {
                    Ok(file) => break file,
                    Err(e) if e.to_string().contains("in use") && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => fail!(self, "reopening {}: {e}", path.display()),
                }
            };
            let wrapper = Arc::new(FaultyMember::with_seed(
                Arc::new(file),
                self.seed * 64 + i as u64,
            ));
            wrapper.set_plan(self.cfg.healthy_plan());
            self.devs[i].wrapper = Some(wrapper);
        }
    }

    /// Power fails: see the module documentation.
    fn crash(&mut self) {
        // Rot in a row the crash leaves dirty meets checksums the next start
        // cannot trust (the rows in flight, or every row without a bitmap),
        // and a resync takes the row as it finds it: what integrity does not
        // promise (docs/architecture/integrity.md). Healed first.
        self.heal_rot("before a crash");
        self.stats.crashes += 1;
        self.stats.crashes_reshaping += u64::from(self.reshape.is_some());
        let engine = self.engine.take().unwrap();
        let degraded = !engine.snapshot().missing_roles.is_empty();
        self.stats.crashes_degraded += u64::from(degraded);
        let cut_first = self.rng.gen_bool(0.5);
        let keeps: Vec<f64> = self
            .devs
            .iter()
            .map(|_| match self.rng.gen_range(0..4) {
                0 => 0.0,
                1 => 1.0,
                _ => self.rng.gen_range(0.0..1.0),
            })
            .collect();
        self.op(format!(
            "crash (cut members first {cut_first}, keep fractions {keeps:.2?})"
        ));
        let wrappers: Vec<(usize, Arc<FaultyMember>)> = self
            .devs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.wrapper.clone().map(|w| (i, w)))
            .collect();
        let lose = |w: &FaultyMember, keep: f64, stats: &mut Stats| {
            let report = w.crash_keeping(keep).expect("crash of an in-memory member");
            stats.kept_blocks += report.kept_blocks;
            stats.lost_blocks += report.lost_blocks;
        };
        if cut_first {
            // Every member stops at once, with the background job mid-flight.
            for (_, w) in &wrappers {
                let mut plan = w.plan();
                plan.pulled = true;
                w.set_plan(plan);
            }
            for (i, w) in &wrappers {
                lose(w, keeps[*i], &mut self.stats);
            }
            self.drop_engine(engine);
            for (_, w) in &wrappers {
                // Anything that slipped into a cache after the cut is lost.
                lose(w, 0.0, &mut self.stats);
            }
        } else {
            self.drop_engine(engine);
            for (i, w) in &wrappers {
                lose(w, keeps[*i], &mut self.stats);
            }
        }
        // Power comes back: every member answers again, with its cache empty.
        for (_, w) in &wrappers {
            w.set_plan(self.cfg.healthy_plan());
        }
        self.rewrap_files();
        if self.cfg.level.has_parity() {
            for s in 0..self.model.pending.len() {
                if !self.model.pending[s].is_empty() {
                    for layout in &self.layouts {
                        self.model.suspect.insert(layout.row(s));
                    }
                }
            }
        }
        let assembled = self.assemble();
        self.start(assembled);
        self.verify_after_crash();
        self.resync_steps_left = Some(self.rng.gen_range(0..30));
    }

    /// An orderly stop and start: everything acknowledged is durable.
    fn restart(&mut self) {
        self.stats.restarts += 1;
        self.stats.restarts_reshaping += u64::from(self.reshape.is_some());
        self.op("orderly restart".into());
        let engine = self.engine.take().unwrap();
        let job = engine.snapshot().sync.map(|p| p.action);
        if let Err(e) = engine.shutdown() {
            self.engine = Some(engine);
            fail!(self, "shutdown (the array is runnable): {e}");
        }
        self.drop_engine(engine);
        self.model.flush();
        for d in &self.devs {
            if let Some(w) = &d.wrapper {
                w.set_plan(self.cfg.healthy_plan());
            }
        }
        self.rewrap_files();
        let assembled = self.assemble();
        let clean = assembled.is_clean();
        let resync_owed = job == Some(SyncAction::Resync);
        if !clean && !resync_owed {
            fail!(
                self,
                "the array is not clean after an orderly shutdown (job at shutdown: {job:?})"
            );
        }
        self.start(assembled);
        self.verify_all("after an orderly restart");
        if !clean {
            self.resync_steps_left = Some(self.rng.gen_range(0..30));
        }
    }

    // -- checking the contents -----------------------------------------------

    fn read(&self, offset: u64, buf: &mut [u8]) {
        if let Err(e) = self.engine().read(offset, buf) {
            fail!(self, "read of {} bytes at {offset}: {e}", buf.len());
        }
    }

    /// Reads `len` bytes at `offset` and compares them with the model.
    fn check_range(&self, offset: u64, len: usize, what: &str) {
        let mut buf = vec![0u8; len];
        self.read(offset, &mut buf);
        let first = offset as usize / SECTOR;
        for (i, got) in buf.chunks(SECTOR).enumerate() {
            let s = first + i;
            if self.model.wild[s] {
                continue;
            }
            let expected = &self.model.cur[s * SECTOR..(s + 1) * SECTOR];
            if got != expected {
                fail!(
                    self,
                    "{what}: array sector {s} (byte {}) reads {}, expected the current value{}",
                    s * SECTOR,
                    self.model.describe(s, got),
                    self.place_text(s)
                );
            }
        }
    }

    fn place_text(&self, s: usize) -> String {
        let map = self.geometry.stripe(self.geometry.stripe_of(s as u64));
        let k = s as u64 - map.array_sector;
        let strip = (k / map.strip_sectors) as usize;
        let copies: Vec<String> = map.data[strip]
            .copies
            .iter()
            .map(|p| {
                format!(
                    "role {} sector {}",
                    p.member,
                    p.member_sector + k % map.strip_sectors
                )
            })
            .collect();
        format!(
            " [stripe {}, data strip {strip} on {}; parity {:?} {:?}; writes to it since durable: {:?}]",
            map.stripe, copies.join(", "), map.p.map(|p| p.member), map.q.map(|q| q.member),
            self.model.pending[s]
        )
    }

    /// What every member holds in the row of array sector `s` (parity
    /// levels), read below the fault injectors, for failure messages.
    fn row_dump(&self, s: usize) -> String {
        if !self.cfg.level.has_parity() {
            return String::new();
        }
        let snapshot = self.engine().snapshot();
        let layout = self.settled_layout();
        let row = layout.row_of[s];
        let block = self.cfg.block as u64;
        let mut out = format!("\n  row {row}:");
        let mut xor = vec![0u8; SECTOR];
        for d in &snapshot.devices {
            let role = match d.state {
                DeviceState::Active { role } | DeviceState::Recovering { role, .. } => role,
                _ => continue,
            };
            let Some(dev) = self.dev_index(&d.path) else {
                continue;
            };
            let Some(w) = &self.devs[dev].wrapper else {
                continue;
            };
            let offset = self.data_offset_bytes(&**w) + row * SECTOR as u64;
            let aligned = offset / block * block;
            let mut buf = vec![0u8; block as usize];
            if w.inner().read_at(&mut buf, aligned).is_err() {
                continue;
            }
            let got = &buf[(offset - aligned) as usize..][..SECTOR];
            for (x, b) in xor.iter_mut().zip(got) {
                *x ^= b;
            }
            let what = match layout.data_at.get(&(role, row)) {
                Some(&t) => format!("array sector {t}: {}", self.model.describe(t, got)),
                None => "parity".to_string(),
            };
            out += &format!("\n    role {role} {} ({:?}): {what}", d.path, d.state);
        }
        out += &format!("\n    row XOR is zero: {}", xor.iter().all(|b| *b == 0));
        out
    }

    fn verify_all(&self, what: &str) {
        let step = 256 << 10;
        let mut offset = 0;
        while offset < self.size {
            let len = step.min(self.size - offset) as usize;
            self.check_range(offset, len, what);
            offset += len as u64;
        }
    }

    /// After a crash: every sector holds its durable value or one written
    /// since; the value found is pinned.
    fn verify_after_crash(&mut self) {
        let mut buf = vec![0u8; self.size as usize];
        let step = 256 << 10;
        let mut offset = 0usize;
        while offset < buf.len() {
            let len = step.min(buf.len() - offset);
            self.read(offset as u64, &mut buf[offset..offset + len]);
            offset += len;
        }
        for (s, got) in buf.chunks(SECTOR).enumerate() {
            if self.model.wild[s] {
                continue;
            }
            if self.model.durable_wild[s] {
                // Written since the write hole took its value: the write, or
                // the unknown value again.
                if !self.model.allowed(s)[1..].contains(&got) {
                    self.model.wild[s] = true;
                }
                continue;
            }
            if !self.model.allowed(s).contains(&got) {
                fail!(
                    self,
                    "after the crash, array sector {s} (byte {}) reads {}; allowed: the last durable value or a write since{}{}",
                    s * SECTOR,
                    self.model.describe(s, got),
                    self.place_text(s),
                    self.row_dump(s)
                );
            }
        }
        // Pin what was found (wild sectors stay unknown).
        for (s, got) in buf.chunks(SECTOR).enumerate() {
            if !self.model.wild[s] {
                self.model.cur[s * SECTOR..(s + 1) * SECTOR].copy_from_slice(got);
            }
        }
        self.model.flush();
        self.op("verified the array after the crash".into());
    }

    // -- the steps -------------------------------------------------------------

    fn random_extent(&mut self, max_sectors: u64) -> (u64, usize) {
        let unit = (self.cfg.block as usize / SECTOR) as u64;
        let units = self.size / SECTOR as u64 / unit;
        let stripe_units = match self.cfg.chunk_bytes {
            Some(chunk) => (chunk / SECTOR as u64 / unit).max(1) * self.cfg.disks as u64,
            None => 64,
        };
        let len_units = match self.rng.gen_range(0..10) {
            0..=5 => self.rng.gen_range(1..=4.min(units)),
            6..=8 => self.rng.gen_range(1..=(2 * stripe_units).min(units)),
            _ => self.rng.gen_range(1..=(6 * stripe_units).min(units)),
        }
        .min(max_sectors / unit)
        .max(1);
        let start = self.rng.gen_range(0..=units - len_units);
        (
            start * unit * SECTOR as u64,
            (len_units * unit) as usize * SECTOR,
        )
    }

    fn do_write(&mut self) {
        let (offset, len) = self.random_extent(u64::MAX);
        let fua = self.rng.gen_bool(0.15);
        let mut data = vec![0u8; len];
        self.rng.fill_bytes(&mut data);
        self.op(format!(
            "write {len} bytes at {offset}{}",
            if fua { " (FUA)" } else { "" }
        ));
        if let Err(e) = self.engine().write(offset, &data, fua) {
            fail!(self, "write of {len} bytes at {offset} (fua {fua}): {e}");
        }
        self.model.write(offset, &data, fua);
        self.stats.writes += 1;
        if self.cfg.level.has_parity() && !self.model.suspect.is_empty() {
            // A role that is (or may become) lost in a suspect row loses
            // what is written to it too: P and Q are updated by the
            // difference, and they disagreed already.
            let compromised = self.compromised();
            let routes = self.spare_routes(&self.engine().snapshot());
            let first = offset as usize / SECTOR;
            for s in first..first + len / SECTOR {
                let lost = self.layouts.iter().any(|l| {
                    self.model.suspect.contains(&l.row(s))
                        && column_chain(routes.as_ref(), l.place_of[s])
                            .iter()
                            .any(|r| compromised.contains(r))
                });
                if lost {
                    self.model.wild[s] = true;
                    self.model.durable_wild[s] = true;
                }
            }
        }
        if self.rng.gen_bool(0.2) {
            // Read it back at once, with a margin.
            let lo = offset.saturating_sub(4096);
            let hi = (offset + len as u64 + 4096).min(self.size);
            self.check_range(lo, (hi - lo) as usize, "reading back a write");
        }
    }

    fn do_read(&mut self) {
        let (offset, len) = self.random_extent(u64::MAX);
        self.op(format!("read {len} bytes at {offset}"));
        self.check_range(offset, len, "read");
        self.stats.reads += 1;
    }

    fn do_flush(&mut self) {
        self.op("flush".into());
        if let Err(e) = self.engine().flush() {
            fail!(self, "flush: {e}");
        }
        self.model.flush();
        self.stats.flushes += 1;
    }

    /// A (role, device) that the level can still afford to lose, drawn
    /// from the in-sync roles with no fault (with a fault injector when
    /// `wrapped`); None when the level can lose no more.
    fn pick_losable_role(&mut self, wrapped: bool) -> Option<(usize, usize)> {
        self.settle_background_writes();
        let compromised = self.compromised();
        let snapshot = self.engine().snapshot();
        let candidates: Vec<(usize, usize)> = self
            .active_roles(&snapshot)
            .iter()
            .enumerate()
            .filter_map(|(role, d)| Some((role, (*d)?)))
            .filter(|(role, d)| {
                !compromised.contains(role)
                    && (!wrapped || self.devs[*d].wrapper.is_some())
                    && self.survives_losing(&compromised, *role)
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        self.stats.losses_beyond_one += u64::from(!compromised.is_empty());
        self.stats.losses_beside_spare += u64::from(self.spare_routes(&snapshot).is_some());
        Some(candidates[self.rng.gen_range(0..candidates.len())])
    }

    /// Injects a fault into an in-sync member, if the level can lose one more.
    fn do_fault(&mut self) {
        let Some((role, dev)) = self.pick_losable_role(true) else {
            return;
        };
        let data_offset = self.engine().snapshot().sb.data_offset_sectors * SECTOR as u64;
        if self.cfg.integrity && self.rng.gen_bool(0.4) {
            // Integrity promises to find rot in blocks whose checksums it
            // trusts; until a check derives them (after a crash, or writes
            // made elsewhere) a member's blocks have none to be found by.
            let trusted = self
                .engine()
                .snapshot()
                .devices
                .iter()
                .any(|d| d.path == self.devs[dev].name && d.untrusted_blocks == Some(0));
            if trusted {
                self.rot_member(role, dev, data_offset);
            }
            return;
        }
        let ops = |rng: &mut StdRng| match rng.gen_range(0..5) {
            0..=2 => Ops::Read,
            3 => Ops::Write,
            _ => Ops::Both,
        };
        let fault = match self.rng.gen_range(0..10) {
            0..=1 => Fault::Pull {},
            2..=5 => {
                let len = self.rng.gen_range(1..=32u64) * SECTOR as u64;
                let at = data_offset
                    + self
                        .rng
                        .gen_range(0..(self.cfg.data_bytes - len) / SECTOR as u64)
                        * SECTOR as u64;
                Fault::Eio(BadRange {
                    offset_bytes: at,
                    len_bytes: len,
                    ops: ops(&mut self.rng),
                    remap: self.rng.gen_bool(0.7),
                })
            }
            6..=7 => Fault::EioRate(EioRate {
                rate: [0.01, 0.05, 0.2][self.rng.gen_range(0..3)],
                ops: ops(&mut self.rng),
                seed: Some(self.rng.gen()),
            }),
            _ => Fault::Torn(Torn {
                writes: self.rng.gen_range(1..=2),
                keep_blocks: None,
            }),
        };
        self.inject("fault", &fault, role, dev);
        self.stats.faults += 1;
    }

    /// Applies a fault to the member in `role` and taints the role, as
    /// every fault and every rot does.
    fn inject(&mut self, what: &str, fault: &Fault, role: usize, dev: usize) {
        self.op(format!(
            "{what} {fault} on {} (role {role})",
            self.devs[dev].name
        ));
        self.taint_role(role);
        let wrapper = self.devs[dev].wrapper.clone().unwrap();
        if let Err(e) = wrapper.apply(fault) {
            fail!(self, "applying {fault}: {e}");
        }
    }

    /// Bit rot on an in-sync member of an integrity array: 4 to 16 KiB of
    /// its data area go wrong in place, with no error. Every read must still
    /// return the model's bytes (the checksums catch the rot, the row
    /// rebuilds it), so the member counts as compromised until a check has
    /// verified every block and healed it (`heal_rot`).
    fn rot_member(&mut self, role: usize, dev: usize, data_offset: u64) {
        const PAGE: u64 = 4096;
        let pages = self.rng.gen_range(1..=4u64);
        let at = data_offset + self.rng.gen_range(0..self.cfg.data_bytes / PAGE - pages) * PAGE;
        let fault = Fault::Corrupt(CorruptRange {
            offset_bytes: at,
            len_bytes: pages * PAGE,
            mode: CorruptMode::Stored,
            seed: Some(self.rng.gen()),
        });
        // Rot in a row a crash left suspect is rebuilt from parity that
        // disagrees: the write hole, as a lost member's blocks there (the
        // role is tainted).
        self.inject("rot", &fault, role, dev);
        self.rot.insert(dev);
        self.stats.rots += 1;
    }

    /// A check verifies every block of every member against its checksum
    /// and rewrites the rotten ones from the rest of their rows: after it,
    /// no rot is left to count as a fault. (Had it not healed them, a later
    /// loss of another member would make the rotten blocks unreadable,
    /// which the model's reads catch.)
    fn heal_rot(&mut self, why: &str) {
        if self.rot.is_empty() {
            return;
        }
        self.op(format!("check to heal the rot on {:?} {why}", self.rot));
        if self.scrub_unless_stopped(false).is_none() {
            // The rot stays a fault, healed by a later check.
            self.trace_events();
            return;
        }
        self.trace_events();
        // The healing rewrites sit in the members' write caches: a crash
        // before they reach the medium brings the rot back, under
        // checksums the next start may not trust.
        self.do_flush();
        self.rot.clear();
        self.stats.rots_healed += 1;
    }

    /// Clears the faults of a member. A pulled member the engine has not
    /// noticed yet lost its cache, so the engine must notice before it
    /// answers again: a flush does that (a drive that silently comes back
    /// without its cache is a failure no RAID can see).
    fn do_restore(&mut self) {
        let faulty: Vec<usize> = (0..self.devs.len())
            .filter(|&d| self.has_faults(d))
            .collect();
        if faulty.is_empty() {
            return;
        }
        let dev = faulty[self.rng.gen_range(0..faulty.len())];
        if self.rot.contains(&dev) {
            self.heal_rot("(a restore)");
        }
        let Some(wrapper) = self.devs[dev].wrapper.clone() else {
            return;
        };
        let snapshot = self.engine().snapshot();
        let in_role = self.active_roles(&snapshot).contains(&Some(dev));
        if wrapper.plan().pulled && in_role {
            self.do_flush();
            if self
                .active_roles(&self.engine().snapshot())
                .contains(&Some(dev))
            {
                fail!(
                    self,
                    "a flush did not fail the pulled member {}",
                    self.devs[dev].name
                );
            }
        }
        self.op(format!("restore {}", self.devs[dev].name));
        wrapper.set_plan(self.cfg.healthy_plan());
    }

    fn do_manage_fail(&mut self) {
        let Some((role, dev)) = self.pick_losable_role(false) else {
            return;
        };
        let name = self.devs[dev].name.clone();
        self.op(format!("manage_fail {name} (role {role})"));
        self.taint_role(role);
        if let Err(e) = self.engine().manage_fail(Path::new(&name)) {
            fail!(self, "manage_fail {name}: {e}");
        }
        self.stats.fails += 1;
    }

    /// Adds a fresh member: it is rebuilt at once if a role is missing,
    /// else it waits as a spare.
    fn do_manage_add(&mut self) {
        let snapshot = self.engine().snapshot();
        let waiting = snapshot
            .devices
            .iter()
            .filter(|d| matches!(d.state, DeviceState::Spare | DeviceState::Recovering { .. }))
            .count();
        let missing = snapshot.missing_roles.len();
        if waiting >= missing.max(1) || self.devs.len() >= self.cfg.disks + self.cfg.spares + 8 {
            return;
        }
        self.added += 1;
        let path = self.dir.path().join(format!("added-{}.img", self.added));
        let file = std::fs::File::create(&path).expect("create an image file");
        file.set_len(self.cfg.member_bytes)
            .expect("size the image file");
        drop(file);
        let name = path.display().to_string();
        self.op(format!(
            "manage_add {name} (missing roles {:?})",
            snapshot.missing_roles
        ));
        if let Err(e) = self.engine().manage_add(&path) {
            fail!(self, "manage_add {name}: {e}");
        }
        self.devs.push(Dev {
            name,
            wrapper: None,
            file: Some(path),
        });
        self.stats.adds += 1;
    }

    fn do_background_check(&mut self) {
        // Counted or not, a check racing writes must not change any data.
        self.op("start a check in the background".into());
        let started = self.engine().start_scrub(false);
        self.op(format!("check started: {started:?}"));
    }

    /// Starts a reshape of a raid5/6 (see the module documentation) that
    /// runs in the background while the steps go on; `follow_reshape`
    /// takes in its end. md's refusals (no room left to move the data,
    /// no spare, a degraded array, a change that would shrink the array
    /// unasked) end the step.
    /// A spare for a reshape that needs one more member.
    fn ensure_spare(&mut self) {
        // A spare added to a degraded array would start a rebuild.
        let snapshot = self.engine().snapshot();
        let spare = snapshot
            .devices
            .iter()
            .any(|d| d.state == DeviceState::Spare);
        if !spare && snapshot.missing_roles.is_empty() {
            self.do_manage_add();
            // A torn write may fire on the superblock update that adds
            // it, failing a member: the spare's rebuild then runs first.
            self.settle("after adding a spare to reshape into");
        }
    }

    fn do_reshape(&mut self) {
        // 1.0 metadata has no room before the data to move it into.
        // Integrity arrays refuse reshapes (their checksum regions would
        // have to move with the data).
        if !matches!(self.cfg.level, Level::Raid5 | Level::Raid6)
            || self.cfg.metadata != Metadata::V1_2
            || self.cfg.integrity
            || self.reshape.is_some()
        {
            return;
        }
        self.settle("before a reshape");
        let disks = self.geometry.raid_disks() as u32;
        let data_disks = disks - self.cfg.level.parity_members() as u32;
        let chunk = self.geometry.stripe(0).strip_sectors;
        let fewest = if self.cfg.level == Level::Raid6 { 4 } else { 3 };
        let mut shrink_to = None;
        let request = match self.rng.gen_range(0..5) {
            0 if disks < 8 => {
                self.ensure_spare();
                ReshapeRequest {
                    raid_devices: Some(disks + 1),
                    ..ReshapeRequest::default()
                }
            }
            // raid5→raid6: Q on a new member (a spare), then a restripe.
            4 if self.cfg.level == Level::Raid5 && disks < 8 => {
                self.ensure_spare();
                ReshapeRequest {
                    level: Some(6),
                    ..ReshapeRequest::default()
                }
            }
            1 => {
                let larger = chunk < 128 && (chunk == 8 || self.rng.gen_bool(0.5));
                ReshapeRequest {
                    chunk_sectors: Some(if larger { chunk * 2 } else { chunk / 2 }),
                    ..ReshapeRequest::default()
                }
            }
            2 => {
                let current = self.engine().snapshot().sb.layout;
                let others: Vec<u32> = (0..4).filter(|l| *l != current).collect();
                ReshapeRequest {
                    layout: Some(others[self.rng.gen_range(0..others.len())]),
                    ..ReshapeRequest::default()
                }
            }
            3 if disks > fewest => {
                // Every member keeps the rows it has; one fewer holds data.
                let sectors = self.geometry.array_sectors() / u64::from(data_disks)
                    * u64::from(data_disks - 1);
                shrink_to = Some(sectors);
                ReshapeRequest {
                    raid_devices: Some(disks - 1),
                    array_sectors: Some(sectors),
                    ..ReshapeRequest::default()
                }
            }
            _ => return,
        };
        self.op(format!("start_reshape {request:?}"));
        let line = match self.engine().start_reshape(&request) {
            Ok(line) => line,
            Err(e) => {
                let refusals = [
                    "not enough room",
                    "spare",
                    "degraded",
                    "reduce the size",
                    "nothing to change",
                ];
                if !refusals.iter().any(|r| e.contains(r)) {
                    fail!(self, "start_reshape {request:?}: {e}");
                }
                self.op(format!("refused: {e}"));
                self.stats.reshapes_refused += 1;
                return;
            }
        };
        self.op(line.clone());
        self.stats.reshapes += 1;
        // The job may already be done: then the engine's geometry is the new one.
        // A level change's old geometry is the takeover's (raid6 with Q on
        // a new member, the data where the raid5 had it).
        let geometry = self.engine().geometry();
        let (old, new) = match geometry.reshaping() {
            Some(r) => (r.old().clone(), r.new_geometry().clone()),
            None => (self.geometry.clone(), (*geometry).clone()),
        };
        if let Some(sectors) = shrink_to {
            // What lies past the new end is dropped at once.
            self.size = sectors * SECTOR as u64;
            self.model.resize(self.size as usize);
        }
        let sectors = self.size as usize / SECTOR;
        let id = self.layouts.pop().expect("one layout").id;
        let new = self.layout(new);
        self.layouts = vec![Layout::new(id, old, sectors), new];
        self.reshape = Some(line);
        self.apply_speed();
        self.follow_reshape();
    }

    fn run(&mut self, steps: usize) {
        for step in 1..=steps {
            self.step = step;
            self.stats.steps += 1;
            self.trace_events();
            self.follow_reshape();
            self.stats.steps_reshaping += u64::from(self.reshape.is_some());
            if let Some(left) = self.resync_steps_left {
                // After a crash: only I/O while the resync runs, then the
                // resync's end and a check.
                match self.rng.gen_range(0..10) {
                    0..=4 => self.do_write(),
                    5..=8 => self.do_read(),
                    _ => self.do_flush(),
                }
                if left == 0 {
                    self.resync_steps_left = None;
                    self.settle("the resync after a crash");
                    self.check_consistent("after the resync that followed a crash");
                } else {
                    self.resync_steps_left = Some(left - 1);
                }
                continue;
            }
            match self.rng.gen_range(0..100) {
                0..=33 => self.do_write(),
                34..=55 => self.do_read(),
                56..=64 => self.do_flush(),
                65..=71 => self.do_fault(),
                72..=76 => self.do_restore(),
                77..=79 => self.do_manage_fail(),
                80..=84 => self.do_manage_add(),
                85 => self.do_background_check(),
                86..=87 => self.do_reshape(),
                88..=89 => {
                    self.op("settle".into());
                    self.settle("a settle step");
                }
                90..=96 => self.crash(),
                _ => self.restart(),
            }
        }
        self.step = steps + 1;
        // The end: the array after a last crash, then after an orderly restart.
        if self.resync_steps_left.take().is_some() {
            self.settle("the resync after a crash");
            self.check_consistent("after the resync that followed a crash");
        }
        self.crash();
        self.resync_steps_left = None;
        self.settle("the resync after the last crash");
        self.check_consistent("after the resync that followed the last crash");
        self.restart();
        self.settle("the end");
        self.verify_all("at the end");
        self.check_consistent("at the end");
        let engine = self.engine.take().unwrap();
        if let Err(e) = engine.shutdown() {
            self.engine = Some(engine);
            fail!(self, "the last shutdown: {e}");
        }
        self.drop_engine(engine);
    }
}

/// The roles whose members hold the column at `place`, in turn: its own
/// role and, while a distributed spare holds that in sync, the child that
/// holds the spare's space there (and so on, if a spare holds that child's
/// role too). Losing any of them loses the column.
fn column_chain(routes: Option<&SpareRoutes>, place: Place) -> Vec<usize> {
    let mut chain = vec![place.member];
    let Some(routes) = routes else {
        return chain;
    };
    while let Some(spare) = routes.spare_of(*chain.last().expect("a role")) {
        let child = routes.spare_child(spare, place.member_sector);
        assert!(
            !chain.contains(&child),
            "the distributed spares of roles {chain:?} loop at member sector {}",
            place.member_sector
        );
        chain.push(child);
    }
    chain
}

/// The command that runs `seed` of `level` again, with the settings of this
/// run that change what it does.
fn replay_line(level: Level, seed: u64) -> String {
    let settings: String = ["URAID_SIM_STEPS", "URAID_SIM_WRITE_POLICY"]
        .iter()
        .filter_map(|name| Some(format!("{name}={} ", std::env::var(name).ok()?)))
        .collect();
    format!(
        "replay: {settings}URAID_SIM_SEED={seed} cargo test --release --locked --test simulation -- --exact sim_{level} --nocapture"
    )
}

fn describe_snapshot(s: &Snapshot) -> String {
    let devices: Vec<String> = s
        .devices
        .iter()
        .map(|d| format!("{} #{} {:?}", d.path, d.dev_number, d.state))
        .collect();
    format!(
        "missing roles {:?}, job {:?}, runnable {}, events {}, devices [{}]",
        s.missing_roles,
        s.sync.as_ref().map(|p| p.action),
        s.runnable,
        s.sb.events,
        devices.join("; ")
    )
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(panic without a message)".into()
    }
}

/// Runs one seed on its own thread; a failure comes back as its message. A
/// seed that records no operation for STEP_LIMIT is reported as a deadlock
/// (its thread is left behind, blocked).
fn run_seed(level: Level, seed: u64, steps: usize) -> Result<Stats, String> {
    let trace = Arc::new(Mutex::new(Trace::default()));
    let (tx, rx) = mpsc::channel();
    let sim_trace = trace.clone();
    std::thread::Builder::new()
        .name(format!("sim-{level}-{seed}"))
        .spawn(move || {
            let result = catch_unwind(AssertUnwindSafe(|| {
                let mut sim = Sim::new(level, seed, sim_trace);
                sim.run(steps);
                std::mem::take(&mut sim.stats)
            }));
            let _ = tx.send(result);
        })
        .expect("spawn a simulation thread");
    let replay = replay_line(level, seed);
    let mut seen = 0;
    let mut since = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(stats)) => return Ok(stats),
            Ok(Err(payload)) => {
                let text = panic_text(payload);
                return Err(if text.starts_with("SIMULATION FAILED") {
                    text
                } else {
                    let ops = trace.lock().unwrap_or_else(|e| e.into_inner()).text();
                    format!("SIMULATION FAILED: {level} seed {seed}: panic: {text}\n{replay}\nlast operations:\n  {ops}")
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!(
                "SIMULATION FAILED: {level} seed {seed}: the simulation thread vanished\n{replay}"
            ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let trace = trace.lock().unwrap_or_else(|e| e.into_inner());
                if trace.count != seen {
                    seen = trace.count;
                    since = Instant::now();
                } else if since.elapsed() > STEP_LIMIT {
                    return Err(format!(
                        "SIMULATION FAILED: {level} seed {seed}: DEADLOCK: no progress for {STEP_LIMIT:?}; the engine call after the last operation never returned\n{replay}\nlast operations:\n  {}",
                        trace.text()
                    ));
                }
            }
        }
    }
}

fn simulate(level: Level) {
    let steps = env_u64("URAID_SIM_STEPS").unwrap_or(300) as usize;
    let seeds: Vec<u64> = match env_u64("URAID_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("URAID_SIM_FIRST_SEED").unwrap_or(1);
            // A dRAID's smallest array is a 16 MiB slice per child, whose
            // resync after each crash costs as much as a raid array many
            // times over: fewer seeds keep its run as long as the others'.
            let default_seeds = if level.is_draid() { 5 } else { 40 };
            let count = env_u64("URAID_SIM_SEEDS").unwrap_or(default_seeds);
            // Long runs of fresh seeds leave the regressions to the suite.
            let regressions = REGRESSION_SEEDS
                .iter()
                .filter(|(l, _)| *l == level && env_u64("URAID_SIM_REGRESSIONS") != Some(0))
                .map(|(_, s)| *s);
            regressions.chain(first..first + count).collect()
        }
    };
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut total = Stats::default();
    for &seed in &seeds {
        let seed_started = Instant::now();
        match run_seed(level, seed, steps) {
            Ok(s) => {
                eprintln!(
                    "sim-stats level={level} seed={seed} secs={:.3} {}",
                    seed_started.elapsed().as_secs_f64(),
                    s.line()
                );
                total.add(&s);
            }
            Err(text) => failures.push((seed, text)),
        }
    }
    eprintln!(
        "{level}: {} seeds x {steps} steps in {:.1?}, {} failed; passing seeds did {total:?}",
        seeds.len(),
        started.elapsed(),
        failures.len()
    );
    if !failures.is_empty() {
        let failed: Vec<u64> = failures.iter().map(|(s, _)| *s).collect();
        for (_, text) in &failures[1..] {
            eprintln!("{text}\n");
        }
        panic!(
            "{level}: {} of {} seeds failed: {failed:?}\n\nthe first failure:\n{}",
            failures.len(),
            seeds.len(),
            failures[0].1
        );
    }
}

#[test]
fn sim_draid1() {
    simulate(Level::Draid1);
}

#[test]
fn sim_draid2() {
    simulate(Level::Draid2);
}

#[test]
fn sim_draid3() {
    simulate(Level::Draid3);
}

#[test]
fn sim_raid5() {
    simulate(Level::Raid5);
}

#[test]
fn sim_raid6() {
    simulate(Level::Raid6);
}

#[test]
fn sim_raid1() {
    simulate(Level::Raid1);
}

#[test]
fn sim_raid10() {
    simulate(Level::Raid10);
}
