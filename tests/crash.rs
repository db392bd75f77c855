//! The real-process crash test: `uraid serve` is SIGKILLed in the middle of
//! NBD traffic, again and again, and every write the server promised to keep
//! must be there when it comes back.
//!
//! For each fixed seed an array (raid5 or raid6, small sparse member files,
//! small chunks) is created with `uraid create` and served with
//! `uraid serve --fault-injection` on a unix socket. A small NBD client
//! written here (fixed newstyle handshake with NBD_OPT_GO, then WRITE with
//! and without FUA, FLUSH and READ, pipelined, using the encoders and
//! decoders of `uraid::export::nbd::proto`) keeps several requests in flight
//! while a model records what the server acknowledged. Each round:
//!
//! 1. the server starts on the members the last round left (after a
//!    SIGKILL the array is dirty, which `uraid examine` must show);
//! 2. the whole array is read and compared with the model (below), while
//!    the server resyncs in the background; what was read is then taken as
//!    the array's contents;
//! 3. the resync must finish (`uraid status --json --control` polled until
//!    no job shows, and the engine's event log must say it finished), then
//!    `uraid manage --action check` must find mismatch_cnt 0;
//! 4. in half of the rounds every member gets a volatile write cache
//!    (`uraid manage --inject DEV write-cache`): writes then sit in the
//!    server's memory until a flush, so the SIGKILL loses what was not
//!    flushed, as a power cut loses a drive's cache;
//! 5. random writes (any sector-aligned size and offset, 20% with FUA), a
//!    FLUSH every few writes and reads of settled ranges, with up to 16
//!    requests in flight, until a seeded number of requests has been sent;
//!    then SIGKILL, with requests still in flight. Replies that had left the
//!    server before it died are read to the end of the stream.
//!
//! # What must survive
//!
//! Two writes in flight never overlap, so the writes to any one sector are
//! ordered. A write is *durable* once a FLUSH sent after its reply arrived
//! has been answered (the server flushes exactly what it has answered when
//! the flush starts), or once its FUA reply arrived. After the crash each
//! sector must hold its last durable value or the value of a write sent
//! after that one, whole (the write cache keeps or loses member blocks
//! whole). In rounds without a write cache the rule is stricter: a SIGKILL
//! loses no acknowledged write at all, since uraid writes to the members
//! (the kernel's page cache) before it replies; so each sector must hold the
//! last acknowledged value or the value of a write still in flight.
//!
//! At the end of each seed the server is stopped with SIGTERM, the array
//! must be clean, its contents read offline (`uraid copy-out`) must equal
//! the model, and reading it with any member (for raid6 any two adjacent
//! members) left out must give the same bytes.
//!
//! Odd seeds run with a write-intent bitmap (so the resync after each kill
//! is bounded by its bits), even seeds without. Six seeds of 24 rounds per
//! level make 288 kills in the suite, in about two minutes on two cores.
//!
//! # With a write journal (`crash_journaled`)
//!
//! The same rounds on arrays created with `--write-journal` (a 16 MiB
//! sparse journal file, given to every `serve` after the members; 1.2 or
//! 1.1 metadata, no bitmap), with these differences:
//!
//! - every request is whole 4 KiB blocks at 4 KiB offsets, as a journal
//!   requires (the generator draws whole blocks of the same byte sizes);
//! - no resync is ever owed: after each SIGKILL every member and the
//!   journal must say clean in `uraid examine` (resync_offset stays
//!   MaxSector), no resync may run at the next start or later, and
//!   `manage --action check` must find mismatch_cnt 0 at each start where
//!   the array is whole;
//! - at a start where the array is whole, half of the rounds fail members
//!   (raid5 one, raid6 one or two) with `manage --fail` before the writes.
//!   They stay failed for a few rounds, given to `serve` (faulty) or left
//!   out (missing), until a start replaces them with new files
//!   (`--remove`, `--add`) and waits for the rebuild, which a check then
//!   finds consistent. The write hole is what the journal closes: a SIGKILL
//!   of a degraded array must lose nothing either;
//! - the rule is the strict one in every round, with a write cache too
//!   (on the members and on the journal): a write is answered only once
//!   its rows are durable on the journal, whose replay at the next start
//!   puts back whatever the member caches lost. With the replay disabled
//!   this fails within a few rounds (also under the durable-only rule, as
//!   torn rows of a degraded array then read back wrong);
//! - every level must see rows replayed at some start.
//!
//! Three seeds of 10 rounds per level, the two levels side by side: 60
//! kills, about half of them degraded, in 35-45 s on two cores.
//!
//! `URAID_CRASH_ROUNDS=N` changes the rounds per seed and
//! `URAID_CRASH_SEED=S` runs one seed (for soak runs, loop over seeds); a
//! failure names the level, seed and round.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid::export::nbd::proto;

const SECTOR: usize = 512;
const MIB: u64 = 1 << 20;
/// The write journal's device, and the block its requests must be whole
/// multiples of.
const JOURNAL_BYTES: u64 = 16 * MIB;
const JOURNAL_BLOCK: usize = 4096;
/// How long the server may take to answer one request, or to finish a
/// resync or check of these small arrays.
const LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// A minimal NBD client.

/// A reply: the cookie, the error, and the data of a successful READ.
type Reply = (u64, u32, Option<Vec<u8>>);

/// What the reader thread passes on: a reply, or a protocol violation.
type Received = Result<Reply, String>;

struct Client {
    sock: UnixStream,
    size: u64,
    next_cookie: u64,
    /// READ cookies and their lengths, for the reader thread.
    reads: Arc<Mutex<HashMap<u64, u32>>>,
    replies: mpsc::Receiver<Received>,
}

fn read_exact(sock: &mut UnixStream, n: usize, what: &str) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    sock.read_exact(&mut buf)
        .unwrap_or_else(|e| panic!("NBD handshake: reading {what}: {e}"));
    buf
}

impl Client {
    /// Connects and negotiates with NBD_OPT_GO (simple replies only).
    fn connect(path: &Path) -> Client {
        let mut sock = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()));
        sock.set_read_timeout(Some(LIMIT)).unwrap();
        let greeting = read_exact(&mut sock, proto::GREETING_LEN, "the greeting");
        let flags = proto::decode_greeting(&greeting).expect("NBD greeting");
        assert!(
            flags & proto::FLAG_FIXED_NEWSTYLE != 0,
            "the server does not offer fixed newstyle negotiation"
        );
        let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
        if flags & proto::FLAG_NO_ZEROES != 0 {
            client_flags |= proto::FLAG_C_NO_ZEROES;
        }
        sock.write_all(&client_flags.to_be_bytes()).unwrap();
        let request = proto::encode_info_request(&proto::InfoRequest {
            name: String::new(),
            requests: vec![proto::INFO_BLOCK_SIZE],
        });
        sock.write_all(&proto::encode_option_header(proto::OptionHeader {
            option: proto::OPT_GO,
            length: request.len() as u32,
        }))
        .unwrap();
        sock.write_all(&request).unwrap();
        let mut size = None;
        let mut transmission_flags = 0;
        loop {
            let header = read_exact(&mut sock, proto::OPTION_REPLY_HEADER_LEN, "an option reply");
            let header = proto::decode_option_reply_header(&header).expect("option reply header");
            let data = read_exact(&mut sock, header.length as usize, "option reply data");
            assert_eq!(header.option, proto::OPT_GO, "reply to another option");
            match header.reply_type {
                proto::REP_ACK => break,
                proto::REP_INFO => {
                    if let proto::Info::Export {
                        size: s,
                        transmission_flags: f,
                    } = proto::decode_info(&data).expect("NBD_REP_INFO")
                    {
                        size = Some(s);
                        transmission_flags = f;
                    }
                }
                other => panic!(
                    "NBD_OPT_GO refused: reply type {other:#x}: {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
        let size = size.expect("NBD_OPT_GO answered without NBD_INFO_EXPORT");
        for (flag, name) in [
            (proto::TFLAG_SEND_FLUSH, "FLUSH"),
            (proto::TFLAG_SEND_FUA, "FUA"),
        ] {
            assert!(
                transmission_flags & flag != 0,
                "the export does not offer {name}"
            );
        }
        assert!(
            transmission_flags & proto::TFLAG_READ_ONLY == 0,
            "the export is read-only"
        );
        let reads = Arc::new(Mutex::new(HashMap::new()));
        let (tx, replies) = mpsc::channel();
        let mut reader = sock.try_clone().unwrap();
        reader.set_read_timeout(None).unwrap();
        let reader_reads = reads.clone();
        std::thread::spawn(move || loop {
            // Ends at the end of the stream (or any error): the server died.
            let mut header = [0u8; proto::SIMPLE_REPLY_LEN];
            if reader.read_exact(&mut header).is_err() {
                return;
            }
            let (error, cookie) = match proto::decode_reply_header(&header) {
                Ok(proto::ReplyHeader::Simple { error, cookie }) => (error, cookie),
                other => {
                    let _ = tx.send(Err(format!("unexpected reply header {other:?}")));
                    return;
                }
            };
            let read_len = reader_reads.lock().unwrap().remove(&cookie);
            let data = match read_len {
                Some(len) if error == 0 => {
                    let mut data = vec![0u8; len as usize];
                    if reader.read_exact(&mut data).is_err() {
                        return;
                    }
                    Some(data)
                }
                _ => None,
            };
            if tx.send(Ok((cookie, error, data))).is_err() {
                return;
            }
        });
        Client {
            sock,
            size,
            next_cookie: 1,
            reads,
            replies,
        }
    }

    /// Sends a request; returns its cookie. A send that fails (the server
    /// died) is not an error: the request is simply never answered.
    fn send(&mut self, command: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        if command == proto::CMD_READ {
            self.reads.lock().unwrap().insert(cookie, length);
        }
        let header = proto::encode_request_header(&proto::RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        let _ = self
            .sock
            .write_all(&header)
            .and_then(|()| self.sock.write_all(payload));
        cookie
    }

    /// The next reply, or None at the end of the stream.
    fn reply(&self) -> Option<Reply> {
        match self.replies.recv_timeout(LIMIT) {
            Ok(Ok(reply)) => Some(reply),
            Ok(Err(violation)) => panic!("NBD: {violation}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("no NBD reply within {LIMIT:?}"),
        }
    }

    /// A synchronous read (nothing else in flight).
    fn read_sync(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let cookie = self.send(proto::CMD_READ, 0, offset, len as u32, &[]);
        match self.reply() {
            Some((c, 0, Some(data))) if c == cookie => data,
            other => panic!(
                "READ of {len} bytes at {offset}: {:?}",
                other.map(|(c, e, _)| (c, e))
            ),
        }
    }

    fn disconnect(mut self) {
        self.send(proto::CMD_DISC, 0, 0, 0, &[]);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

// ---------------------------------------------------------------------------
// The model.

struct WriteRec {
    offset: u64,
    data: Vec<u8>,
    replied: bool,
}

#[derive(Default)]
struct Model {
    /// The last acknowledged value of every sector.
    cur: Vec<u8>,
    /// The last durable value of every sector.
    durable: Vec<u8>,
    /// Per sector: the writes sent since its durable value, in order.
    pending: Vec<Vec<u32>>,
    writes: HashMap<u32, WriteRec>,
    /// Acknowledged writes not yet known durable, in reply order.
    unflushed: Vec<u32>,
    next_id: u32,
}

impl Model {
    fn new(size: usize) -> Model {
        Model {
            cur: vec![0; size],
            durable: vec![0; size],
            pending: vec![Vec::new(); size / SECTOR],
            ..Model::default()
        }
    }

    fn sectors(offset: u64, len: usize) -> std::ops::Range<usize> {
        offset as usize / SECTOR..(offset as usize + len) / SECTOR
    }

    fn sent(&mut self, offset: u64, data: Vec<u8>) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        for s in Self::sectors(offset, data.len()) {
            self.pending[s].push(id);
        }
        self.writes.insert(
            id,
            WriteRec {
                offset,
                data,
                replied: false,
            },
        );
        id
    }

    fn replied(&mut self, id: u32, fua: bool) {
        let w = self.writes.get_mut(&id).unwrap();
        w.replied = true;
        let at = w.offset as usize;
        self.cur[at..at + w.data.len()].copy_from_slice(&w.data);
        if fua {
            self.make_durable(id);
        } else {
            self.unflushed.push(id);
        }
    }

    fn make_durable(&mut self, id: u32) {
        let w = &self.writes[&id];
        let (offset, len) = (w.offset, w.data.len());
        for s in Self::sectors(offset, len) {
            // Writes to a sector are ordered: this one supersedes those
            // before it, and those after it may still be lost.
            if let Some(i) = self.pending[s].iter().position(|p| *p == id) {
                self.pending[s].drain(..=i);
                let from = s * SECTOR - offset as usize;
                self.durable[s * SECTOR..(s + 1) * SECTOR]
                    .copy_from_slice(&self.writes[&id].data[from..from + SECTOR]);
            }
        }
        self.unflushed.retain(|u| *u != id);
    }

    fn version(&self, id: u32, s: usize) -> &[u8] {
        let w = &self.writes[&id];
        let from = s * SECTOR - w.offset as usize;
        &w.data[from..from + SECTOR]
    }

    /// The values sector `s` may hold after the crash. `strict`: no
    /// acknowledged write may be lost (no volatile cache in the server).
    fn allowed(&self, s: usize, strict: bool) -> Vec<&[u8]> {
        let ids = &self.pending[s];
        let last_acked = if strict {
            ids.iter().rposition(|id| self.writes[id].replied)
        } else {
            None
        };
        match last_acked {
            Some(i) => ids[i..].iter().map(|id| self.version(*id, s)).collect(),
            None => {
                let mut allowed = vec![&self.durable[s * SECTOR..(s + 1) * SECTOR]];
                allowed.extend(ids.iter().map(|id| self.version(*id, s)));
                allowed
            }
        }
    }

    fn describe(&self, s: usize, got: &[u8]) -> String {
        let mut names = Vec::new();
        if got == &self.durable[s * SECTOR..(s + 1) * SECTOR] {
            names.push("its last durable value".to_string());
        }
        for id in &self.pending[s] {
            if got == self.version(*id, s) {
                let w = &self.writes[id];
                names.push(format!(
                    "write #{id} ({} bytes at {}, {})",
                    w.data.len(),
                    w.offset,
                    if w.replied {
                        "acknowledged"
                    } else {
                        "in flight"
                    }
                ));
            }
        }
        if got.iter().all(|b| *b == 0) {
            names.push("zeroes".into());
        }
        if names.is_empty() {
            "a value never written there".into()
        } else {
            names.join(", ")
        }
    }

    /// Takes `image` as the array's contents: every write so far is settled.
    fn pin(&mut self, image: &[u8]) {
        self.cur.copy_from_slice(image);
        self.durable.copy_from_slice(image);
        for p in self.pending.iter_mut() {
            p.clear();
        }
        self.writes.clear();
        self.unflushed.clear();
    }
}

// ---------------------------------------------------------------------------
// One seed: an array, served and killed round after round.

struct Level {
    name: &'static str,
    /// How many members the seed may choose.
    disks: std::ops::RangeInclusive<usize>,
    /// Members that may be left out when checking redundancy offline.
    losable: usize,
}

enum InFlight {
    Write {
        id: u32,
        fua: bool,
    },
    Flush {
        covers: Vec<u32>,
    },
    Read {
        offset: u64,
        len: usize,
        dirty: Vec<u32>,
    },
}

struct Run {
    level: &'static str,
    /// The #[test] that runs this seed, for the replay hint.
    test: &'static str,
    seed: u64,
    round: usize,
    rng: StdRng,
    dir: tempfile::TempDir,
    members: Vec<PathBuf>,
    sock: PathBuf,
    control: PathBuf,
    size: u64,
    model: Model,
    /// Whether the last round ran with a volatile write cache.
    cached: bool,
    /// Whether a SIGKILL left a resync (and a check) owed.
    resync_owed: bool,
    /// Members that may be left out when checking redundancy offline.
    losable: usize,
    /// The write journal's device, given to every `serve` after the
    /// members; None for an array without one.
    journal: Option<PathBuf>,
    /// Every request is a whole multiple of this, aligned to it: a sector,
    /// or 4 KiB with a journal (which logs whole pages).
    block: usize,
    member_bytes: u64,
    /// Members failed with `manage --fail` (indexes into `members`), and
    /// whether this round's server was started without them.
    failed: Vec<usize>,
    left_out: bool,
    /// The devices this round's server was started with: only they have
    /// fault injectors (not members added since).
    served_with: Vec<String>,
    stats: RunStats,
}

#[derive(Default, Debug)]
struct RunStats {
    rounds: u64,
    writes_acked: u64,
    writes_in_flight_at_kill: u64,
    flushes: u64,
    reads: u64,
    cached_rounds: u64,
    lost_unflushed_sectors: u64,
    /// Journaled runs: rounds written with members failed, rebuilds onto
    /// new members, and rows the journal replayed at the starts.
    degraded_rounds: u64,
    rebuilds: u64,
    replayed_rows: u64,
}

impl RunStats {
    fn add(&mut self, s: &RunStats) {
        self.rounds += s.rounds;
        self.writes_acked += s.writes_acked;
        self.writes_in_flight_at_kill += s.writes_in_flight_at_kill;
        self.flushes += s.flushes;
        self.reads += s.reads;
        self.cached_rounds += s.cached_rounds;
        self.lost_unflushed_sectors += s.lost_unflushed_sectors;
        self.degraded_rounds += s.degraded_rounds;
        self.rebuilds += s.rebuilds;
        self.replayed_rows += s.replayed_rows;
    }
}

impl Run {
    fn ctx(&self) -> String {
        format!(
            "{}{} seed {} round {} (replay: URAID_CRASH_SEED={} cargo test --release --test crash {})",
            self.level,
            if self.journal.is_some() { " with a journal" } else { "" },
            self.seed,
            self.round,
            self.seed,
            self.test
        )
    }

    /// A new array for `seed`; with `journaled`, with a write journal (and
    /// then with 1.2 or 1.1 metadata and no bitmap, which a journal
    /// excludes).
    fn new(level: &Level, seed: u64, journaled: bool, test: &'static str) -> Run {
        let mut rng =
            StdRng::seed_from_u64(seed << 8 | u64::from(journaled) << 4 | level.losable as u64);
        let dir = scratch(&format!(
            "crash-{}{}-{seed}",
            if journaled { "journal-" } else { "" },
            level.name
        ));
        let member_bytes = [4 * MIB, 6 * MIB][rng.gen_range(0..2)];
        let chunk = ["4K", "8K", "16K", "32K"][rng.gen_range(0..4)];
        let metadatas = if journaled {
            ["1.2", "1.1"]
        } else {
            ["1.2", "1.0"]
        };
        let metadata = metadatas[rng.gen_range(0..2)];
        let disks = rng.gen_range(level.disks.clone());
        let disks_text = disks.to_string();
        // Odd seeds run with a write-intent bitmap, with chunks small enough
        // that the resync after a kill covers only part of the array.
        let bitmap = if seed % 2 == 1 && !journaled {
            "internal"
        } else {
            "none"
        };
        let bitmap_chunk = ["64K", "256K", "1M"][rng.gen_range(0..3)];
        let mut options = vec![
            "--level",
            level.name,
            "--raid-devices",
            &disks_text,
            "--chunk",
            chunk,
            "--metadata",
            metadata,
            "--bitmap",
            bitmap,
        ];
        if bitmap != "none" {
            options.extend(["--bitmap-chunk", bitmap_chunk]);
        }
        let journal = journaled.then(|| {
            sparse_files(dir.path(), "journal", &[JOURNAL_BYTES])
                .pop()
                .unwrap()
        });
        if let Some(j) = &journal {
            options.extend(["--write-journal", j.to_str().unwrap()]);
        }
        let members = create_array(dir.path(), "m", &options, disks, member_bytes);
        let paths: Vec<&str> = paths(&members);
        let size = array_bytes(&paths);
        let sock = dir.path().join("nbd.sock");
        let control = dir.path().join("ctl.sock");
        eprintln!(
            "{} seed {seed}: {disks} members of {} MiB, chunk {chunk}, metadata {metadata}, bitmap {bitmap}, journal {}, array {size} bytes",
            level.name,
            member_bytes / MIB,
            if journaled { "on" } else { "off" }
        );
        Run {
            level: level.name,
            test,
            seed,
            round: 0,
            rng,
            dir,
            members,
            sock,
            control,
            size,
            model: Model::new(size as usize),
            cached: false,
            resync_owed: false,
            losable: level.losable,
            block: if journaled { JOURNAL_BLOCK } else { SECTOR },
            journal,
            member_bytes,
            failed: Vec::new(),
            left_out: false,
            served_with: Vec::new(),
            stats: RunStats::default(),
        }
    }

    fn member_strs(&self) -> Vec<&str> {
        paths(&self.members)
    }

    /// The members (without the failed ones if `in_service`), then the
    /// journal. In service, they are the devices whose superblocks say
    /// whether the array is clean.
    fn devices(&self, in_service: bool) -> Vec<&str> {
        let mut devices: Vec<&str> = self
            .member_strs()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !(in_service && self.failed.contains(i)))
            .map(|(_, m)| m)
            .collect();
        devices.extend(self.journal.iter().map(|j| j.to_str().unwrap()));
        devices
    }

    /// Starts the server on the members and the journal. Failed members
    /// are given (they start faulty) until a round leaves them out (they
    /// start missing), after which they stay out until rebuilt: a start
    /// without them records their slots as spare, as md's super_1_sync
    /// does, and given again they would be taken as spares and rebuilt.
    fn serve(&mut self) -> Served {
        if !self.failed.is_empty() && !self.left_out {
            self.left_out = self.rng.gen_bool(0.5);
        }
        self.served_with = self
            .devices(self.left_out)
            .iter()
            .map(|d| d.to_string())
            .collect();
        let devices: Vec<&str> = self.served_with.iter().map(String::as_str).collect();
        try_serve_at(&self.sock, &self.control, &["--fault-injection"], &devices).unwrap_or_else(
            |(status, stderr)| panic!("{}: serve exited ({status}):\n{stderr}", self.ctx()),
        )
    }

    /// `uraid status --json --control`: the array's entry.
    fn status_json(&self) -> serde_json::Value {
        let out = run_limited_ok(
            uraid()
                .args(["status", "--json", "--control"])
                .arg(&self.control),
            LIMIT,
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{}: status --json: {e}", self.ctx()));
        v.as_array()
            .and_then(|a| a.first())
            .cloned()
            .unwrap_or_else(|| panic!("{}: status --json lists no array: {v}", self.ctx()))
    }

    /// In a status: the events named `event` whose detail starts with
    /// `prefix`, and the last one's detail.
    fn events(
        &self,
        status: &serde_json::Value,
        event: &str,
        prefix: &str,
    ) -> (usize, Option<String>) {
        let events = status["events"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: status --json without events: {status}", self.ctx()));
        let matching: Vec<String> = events
            .iter()
            .filter(|e| {
                e["event"] == event && e["detail"].as_str().is_some_and(|d| d.starts_with(prefix))
            })
            .map(|e| e["detail"].as_str().unwrap().to_string())
            .collect();
        (matching.len(), matching.last().cloned())
    }

    /// `uraid manage --control CTL ARGS...`.
    fn manage(&self, args: &[&str]) {
        let out = run_limited(
            uraid()
                .args(["manage", "--control"])
                .arg(&self.control)
                .args(args),
            LIMIT,
        );
        assert!(
            out.status.success(),
            "{}: uraid manage {args:?} failed ({}):\n{}",
            self.ctx(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Polls `uraid status --json` until no background job shows.
    fn wait_idle(&self, what: &str) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let status = self.status_json();
            let detail = &status["detail"];
            let state = detail["state"].as_str().unwrap_or("");
            if detail["sync_status"].is_null()
                && !state.contains("resync")
                && !state.contains("recover")
                && !state.contains("check")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} still running after {LIMIT:?}: {status}",
                self.ctx()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls the status until its events hold one more `event` with a
    /// detail starting with `prefix` than `before`; returns its detail. A
    /// job leaves the status a moment before its end is recorded, so the
    /// event, not the job's absence, says that it ended and what it found.
    fn wait_event(
        &self,
        event: &str,
        prefix: &str,
        before: usize,
        what: &str,
    ) -> (String, serde_json::Value) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let status = self.status_json();
            if let (n, Some(detail)) = self.events(&status, event, prefix) {
                if n > before {
                    return (detail, status);
                }
            }
            let (failed, why) = self.events(&status, "SyncFailed", "");
            assert_eq!(failed, 0, "{}: {what} failed: {why:?}", self.ctx());
            assert!(
                Instant::now() < deadline,
                "{}: {what} did not end within {LIMIT:?}: {status}",
                self.ctx()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The resync a SIGKILL leaves owed must finish, then a check must find
    /// the array consistent.
    fn resync_then_check(&self) {
        let (resync, _) = self.wait_event(
            "RebuildFinished",
            "resync:",
            0,
            "the resync after the crash",
        );
        self.wait_idle("the resync");
        self.check_consistent(&format!("the resync ({resync})"));
    }

    /// `manage --action check` must find the array consistent.
    fn check_consistent(&self, after: &str) {
        let prefix = "check: mismatches found:";
        let before = self
            .events(&self.status_json(), "RebuildFinished", prefix)
            .0;
        self.manage(&["--action", "check"]);
        let (found, status) = self.wait_event("RebuildFinished", prefix, before, "the check");
        let found: u64 = found[prefix.len()..]
            .trim()
            .parse()
            .expect("mismatch count");
        assert_eq!(
            status["mismatch_cnt"].as_u64(),
            Some(found),
            "{}: status --json mismatch_cnt, after a check whose event says {found}: {status}",
            self.ctx()
        );
        assert_eq!(
            found,
            0,
            "{}: a check after {after} found {found} mismatched sectors",
            self.ctx()
        );
    }

    /// With a journal no resync is ever owed, so none may run: not at the
    /// start after a SIGKILL, nor later.
    fn assert_no_resync(&self, when: &str) {
        let status = self.status_json();
        let detail = &status["detail"];
        let state = detail["state"].as_str().unwrap_or("");
        let resyncs = self.events(&status, "RebuildFinished", "resync").0;
        assert!(
            detail["sync_status"].is_null() && !state.contains("resync") && resyncs == 0,
            "{}: with a write journal no resync may run ({when}): {status}",
            self.ctx()
        );
    }

    /// With a journal, the start after a SIGKILL: rows were made whole by
    /// the journal's replay, so no resync runs. A degraded array may get
    /// new members (rebuilt before the writes); a whole one is checked, and
    /// in some rounds loses members before the writes.
    fn journaled_start(&mut self) {
        self.assert_no_resync("after the SIGKILL");
        let status = self.status_json();
        self.stats.replayed_rows += status["journal"]["replayed_rows"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: status without journal stats: {status}", self.ctx()));
        if !self.failed.is_empty() && self.rng.gen_bool(0.4) {
            self.rebuild();
            self.check_consistent("rebuilding the failed members");
        } else if self.failed.is_empty() {
            self.check_consistent("the SIGKILL");
            if self.rng.gen_bool(0.5) {
                let count = self.rng.gen_range(1..=self.losable);
                while self.failed.len() < count {
                    let i = self.rng.gen_range(0..self.members.len());
                    if !self.failed.contains(&i) {
                        self.manage(&["--fail", self.member_strs()[i]]);
                        self.failed.push(i);
                    }
                }
            }
        }
    }

    /// Replaces the failed members with new files (`manage --remove` of
    /// those the server was given, `--add` of the new ones) and waits until
    /// they are rebuilt.
    fn rebuild(&mut self) {
        let before = self.events(&self.status_json(), "SpareActive", "").0;
        let failed = std::mem::take(&mut self.failed);
        for &i in &failed {
            if !self.left_out {
                self.manage(&["--remove", self.member_strs()[i]]);
            }
            let name = format!("m{i}-round{}-", self.round);
            self.members[i] = sparse_files(self.dir.path(), &name, &[self.member_bytes])
                .pop()
                .unwrap();
            self.manage(&["--add", self.member_strs()[i]]);
        }
        for k in 0..failed.len() {
            self.wait_event("SpareActive", "", before + k, "the rebuild");
        }
        self.wait_idle("the rebuild");
        self.left_out = false;
        self.stats.rebuilds += 1;
    }

    /// Reads the whole array and checks it against what may have survived.
    fn verify_after_crash(&mut self, client: &mut Client) {
        assert_eq!(client.size, self.size, "{}: export size", self.ctx());
        let mut image = Vec::with_capacity(self.size as usize);
        let chunk = MIB as usize;
        let mut offset = 0u64;
        while offset < self.size {
            let len = chunk.min((self.size - offset) as usize);
            image.extend(client.read_sync(offset, len));
            offset += len as u64;
        }
        // With a journal an acknowledged write is durable on it, also under
        // volatile member caches: its replay puts back what the caches lost.
        let strict = !self.cached || self.journal.is_some();
        for (s, got) in image.chunks(SECTOR).enumerate() {
            let allowed = self.model.allowed(s, strict);
            if !allowed.contains(&got) {
                panic!(
                    "{}: after the SIGKILL (write cache {}, failed members {:?}), array sector {s} (byte {}) holds {}; \
                     it must hold {} (writes to it since its durable value: {:?})",
                    self.ctx(),
                    if self.cached { "on" } else { "off" },
                    self.failed,
                    s * SECTOR,
                    self.model.describe(s, got),
                    if strict {
                        "its last acknowledged value or a write in flight"
                    } else {
                        "its last durable value or a write sent since"
                    },
                    self.model.pending[s]
                );
            }
            let cur = &self.model.cur[s * SECTOR..(s + 1) * SECTOR];
            if got != cur && !self.model.pending[s].is_empty() {
                self.stats.lost_unflushed_sectors += 1;
            }
        }
        self.model.pin(&image);
    }

    /// A random extent of whole blocks: up to 8 KiB, 128 KiB or 512 KiB.
    fn extent(&mut self) -> (u64, usize) {
        let per_block = (self.block / SECTOR) as u64;
        let blocks = self.size / self.block as u64;
        let up_to_sectors: u64 = match self.rng.gen_range(0..10) {
            0..=5 => 16,
            6..=8 => 256,
            _ => 1024,
        };
        let len = self
            .rng
            .gen_range(1..=(up_to_sectors / per_block).max(1))
            .min(blocks);
        let start = self.rng.gen_range(0..=blocks - len);
        (start * self.block as u64, len as usize * self.block)
    }

    /// The write phase: returns when `budget` requests have been sent; the
    /// caller kills the server with them in flight.
    fn traffic(&mut self, client: &mut Client, budget: usize) -> HashMap<u64, InFlight> {
        let window = self.rng.gen_range(1..=16);
        let flush_every = self.rng.gen_range(2..=8);
        let mut inflight: HashMap<u64, InFlight> = HashMap::new();
        let mut since_flush = 0;
        for _ in 0..budget {
            while let Ok(reply) = client.replies.try_recv() {
                let reply =
                    reply.unwrap_or_else(|violation| panic!("{}: NBD: {violation}", self.ctx()));
                self.handle(reply, &mut inflight);
            }
            while inflight.len() >= window {
                let reply = client
                    .reply()
                    .unwrap_or_else(|| panic!("{}: the server closed the connection", self.ctx()));
                self.handle(reply, &mut inflight);
            }
            let pick = self.rng.gen_range(0..100);
            if since_flush >= flush_every && pick < 70 {
                since_flush = 0;
                let covers = self.model.unflushed.clone();
                let cookie = client.send(proto::CMD_FLUSH, 0, 0, 0, &[]);
                inflight.insert(cookie, InFlight::Flush { covers });
                self.stats.flushes += 1;
                continue;
            }
            if pick < 15 {
                let (offset, len) = self.extent();
                let dirty: Vec<u32> = inflight
                    .values()
                    .filter_map(|f| match f {
                        InFlight::Write { id, .. } => Some(*id),
                        _ => None,
                    })
                    .collect();
                let cookie = client.send(proto::CMD_READ, 0, offset, len as u32, &[]);
                inflight.insert(cookie, InFlight::Read { offset, len, dirty });
                self.stats.reads += 1;
                continue;
            }
            // A write that overlaps no write in flight: the writes to each
            // sector stay ordered.
            let (offset, len) = loop {
                let (offset, len) = self.extent();
                let overlaps = inflight.values().any(|f| match f {
                    InFlight::Write { id, .. } => {
                        let w = &self.model.writes[id];
                        w.offset < offset + len as u64 && offset < w.offset + w.data.len() as u64
                    }
                    _ => false,
                });
                if !overlaps {
                    break (offset, len);
                }
            };
            let fua = self.rng.gen_bool(0.2);
            let mut data = vec![0u8; len];
            self.rng.fill_bytes(&mut data);
            let cookie = client.send(
                proto::CMD_WRITE,
                if fua { proto::CMD_FLAG_FUA } else { 0 },
                offset,
                len as u32,
                &data,
            );
            let id = self.model.sent(offset, data);
            for f in inflight.values_mut() {
                if let InFlight::Read { dirty, .. } = f {
                    dirty.push(id);
                }
            }
            inflight.insert(cookie, InFlight::Write { id, fua });
            since_flush += 1;
        }
        inflight
    }

    fn handle(&mut self, (cookie, error, data): Reply, inflight: &mut HashMap<u64, InFlight>) {
        let request = inflight
            .remove(&cookie)
            .unwrap_or_else(|| panic!("{}: a reply to unknown cookie {cookie}", self.ctx()));
        assert_eq!(
            error,
            0,
            "{}: the server answered cookie {cookie} with error {error}",
            self.ctx()
        );
        match request {
            InFlight::Write { id, fua } => {
                self.model.replied(id, fua);
                self.stats.writes_acked += 1;
            }
            InFlight::Flush { covers } => {
                for id in covers {
                    self.model.make_durable(id);
                }
            }
            InFlight::Read { offset, len, dirty } => {
                let data = data.expect("READ data");
                let first = offset as usize / SECTOR;
                for (i, got) in data.chunks(SECTOR).enumerate() {
                    let s = first + i;
                    // Sectors a write in flight touched may be either.
                    let byte = (s * SECTOR) as u64;
                    if dirty.iter().any(|id| {
                        let w = &self.model.writes[id];
                        w.offset <= byte && byte < w.offset + w.data.len() as u64
                    }) {
                        continue;
                    }
                    let expected = &self.model.cur[s * SECTOR..(s + 1) * SECTOR];
                    assert!(
                        got == expected,
                        "{}: READ of {len} bytes at {offset}: sector {s} holds {}, expected its last acknowledged value",
                        self.ctx(),
                        self.model.describe(s, got)
                    );
                }
                let _ = len;
            }
        }
    }

    /// One round: start, verify, resync and check, write, SIGKILL.
    fn round(&mut self) {
        self.round += 1;
        self.stats.rounds += 1;
        let served = self.serve();
        let mut client = Client::connect(&self.sock);
        self.verify_after_crash(&mut client);
        if self.journal.is_some() {
            self.journaled_start();
        } else {
            // Mostly the resync is awaited (and checked) before the writes;
            // in some rounds the writes race it and the SIGKILL may
            // interrupt it.
            let race_resync = self.rng.gen_bool(0.25);
            if self.resync_owed && !race_resync {
                self.resync_then_check();
                self.resync_owed = false;
            }
        }
        if !self.failed.is_empty() {
            self.stats.degraded_rounds += 1;
        }
        self.cached = self.rng.gen_bool(0.5);
        if self.cached {
            self.stats.cached_rounds += 1;
            // The journal's cache too: what it logs must be flushed before
            // the write is answered.
            for m in self.devices(true) {
                if self.served_with.iter().any(|d| d == m) {
                    self.manage(&["--inject", m, "write-cache"]);
                }
            }
        }
        let budget = self.rng.gen_range(10..=120);
        let mut inflight = self.traffic(&mut client, budget);
        if self.journal.is_some() {
            self.assert_no_resync("while writing");
        }
        served.kill();
        // Replies the server sent before it died still count.
        while let Some(reply) = client.reply() {
            self.handle(reply, &mut inflight);
        }
        self.stats.writes_in_flight_at_kill += inflight
            .values()
            .filter(|f| matches!(f, InFlight::Write { .. }))
            .count() as u64;
        drop(client);
        // With a journal the array stays clean while it runs (resync_offset
        // MaxSector, md's MD_JOURNAL_CLEAN): the replay, not a resync,
        // makes its rows whole.
        self.resync_owed = self.journal.is_none();
        let expected = if self.resync_owed { "active" } else { "clean" };
        let states = examine_states(&self.devices(true));
        assert!(
            states.iter().all(|s| s == expected),
            "{}: after SIGKILL every member must say {expected}: {states:?}",
            self.ctx()
        );
    }

    /// The end: a last start, an orderly stop, and offline checks.
    fn finish(&mut self) {
        self.round += 1;
        let served = self.serve();
        let mut client = Client::connect(&self.sock);
        self.verify_after_crash(&mut client);
        if self.journal.is_some() {
            self.assert_no_resync("after the last SIGKILL");
            if !self.failed.is_empty() {
                self.rebuild();
            }
            self.check_consistent("the last SIGKILL");
        } else {
            self.resync_then_check();
        }
        client.disconnect();
        served.stop();
        let states = examine_states(&self.devices(true));
        assert!(
            states.iter().all(|s| s == "clean"),
            "{}: after SIGTERM every member must say clean: {states:?}",
            self.ctx()
        );
        let members = self.member_strs();
        assert_redundancy_consistent(
            &members,
            self.losable,
            Some(&self.model.cur),
            self.dir.path(),
        );
    }
}

fn levels() -> Vec<Level> {
    vec![
        Level {
            name: "raid5",
            disks: 3..=5,
            losable: 1,
        },
        Level {
            name: "raid6",
            disks: 4..=6,
            losable: 2,
        },
    ]
}

/// `rounds` rounds (or URAID_CRASH_ROUNDS) of each seed (or of
/// URAID_CRASH_SEED alone) of the level `name`; returns the totals.
fn crash_rounds(
    name: &str,
    seeds: &[u64],
    rounds: usize,
    journaled: bool,
    test: &'static str,
) -> RunStats {
    let level = levels().into_iter().find(|l| l.name == name).unwrap();
    let rounds = std::env::var("URAID_CRASH_ROUNDS")
        .ok()
        .map(|v| v.parse::<usize>().expect("URAID_CRASH_ROUNDS"))
        .unwrap_or(rounds);
    let seeds: Vec<u64> = match std::env::var("URAID_CRASH_SEED") {
        Ok(v) => vec![v.parse().expect("URAID_CRASH_SEED")],
        Err(_) => seeds.to_vec(),
    };
    let started = Instant::now();
    let mut total = RunStats::default();
    for seed in seeds {
        let mut run = Run::new(&level, seed, journaled, test);
        for _ in 0..rounds {
            run.round();
        }
        run.finish();
        total.add(&run.stats);
    }
    eprintln!("{name}: {total:?} in {:.1?}", started.elapsed());
    total
}

#[test]
fn crash_raid5() {
    crash_rounds("raid5", &[1, 2, 3, 4, 5, 6], 24, false, "crash_raid5");
}

#[test]
fn crash_raid6() {
    crash_rounds("raid6", &[1, 2, 3, 4, 5, 6], 24, false, "crash_raid6");
}

#[test]
fn crash_journaled() {
    // The levels side by side: the rounds mostly wait for the server.
    std::thread::scope(|scope| {
        for name in ["raid5", "raid6"] {
            scope.spawn(move || {
                let total = crash_rounds(name, &[1, 2, 3], 10, true, "crash_journaled");
                assert!(
                    total.replayed_rows > 0,
                    "{name}: the journal replayed no row at any start after a SIGKILL: {total:?}"
                );
            });
        }
    });
}
