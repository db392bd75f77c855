//! The control socket of a running `uraid serve`: JSON lines over a unix
//! socket (mode 0600). A client sends one request line and reads one reply
//! line. `uraid status`, `uraid detail --control` and, later, `uraid manage`
//! are its clients.

pub mod registry;
pub mod view;

use crate::array::DeviceState;
use crate::engine::{Engine, Snapshot, SyncAction};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest request line accepted; requests are tiny.
const REQUEST_BYTES_MAX: u64 = 64 * 1024;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// The /proc/mdstat block and the detail of the array.
    Status,
    /// mdadm --manage: fail, remove or add a member by path. A fail the
    /// array would not survive, and an add over another array's member or
    /// a device holding data, are refused unless `force`.
    Fail {
        device: PathBuf,
        #[serde(default)]
        force: bool,
    },
    Remove {
        device: PathBuf,
    },
    Add {
        device: PathBuf,
        #[serde(default)]
        force: bool,
    },
    /// mdadm --re-add: a member that left comes back through the bitmap,
    /// or the request says why it cannot.
    ReAdd {
        device: PathBuf,
    },
    /// The automatic re-add of members failed by a timeout, on or off.
    AutoReAdd {
        on: bool,
    },
    /// The consistency-check period in days (0 removes the schedule).
    CheckPeriod {
        days: f64,
    },
    /// mdadm --grow --bitmap internal|none.
    GrowBitmap {
        bitmap: String,
        chunk_bytes: Option<u64>,
    },
    /// mdadm --grow --raid-devices/--level/--layout/--chunk: a reshape.
    Reshape {
        raid_devices: Option<u32>,
        level: Option<String>,
        layout: Option<String>,
        chunk_bytes: Option<u64>,
        /// mdadm --array-size, stated for a reshape that makes the array
        /// smaller.
        #[serde(default)]
        array_size_sectors: Option<u64>,
    },
    /// mdadm --grow --size: the component size in sectors, or None for max.
    GrowSize {
        size_sectors: Option<u64>,
    },
    /// mdadm --replace DEV --with NEW.
    Replace {
        device: PathBuf,
        with: PathBuf,
        #[serde(default)]
        force: bool,
    },
    /// md's sync_action: "check", "repair" or "idle" (stop the running job).
    SyncAction {
        action: String,
    },
    /// Fault injection on a member: "pull", "offline:2s", "eio:read:1M+64K",
    /// "eio-rate:0.01", "latency:5ms", "throttle:50M", "torn", "restore", ...
    Inject {
        device: PathBuf,
        fault: String,
    },
    /// The seeds' knobs (stripe_cache_size, read_ahead, ...), changed live
    /// and saved with the array's settings.
    Set {
        settings: Vec<(String, String)>,
        #[serde(default)]
        accept_data_loss: bool,
    },
    /// The knobs `uraid tune --apply` picked: set as `Set` sets them, and
    /// recorded as the tuner's.
    ApplyTuned {
        settings: Vec<(String, String)>,
        tuned: crate::engine::tuning::saved::Tuned,
    },
    /// md's sync_speed_min / sync_speed_max for this array, KiB/s per member.
    SpeedLimits {
        min_kib_per_s: Option<u64>,
        max_kib_per_s: Option<u64>,
    },
    /// The status (as `Status`) once an event numbered above `after` is
    /// logged, or when `timeout_ms` has passed: a monitor's long poll.
    WaitEvents {
        after: u64,
        timeout_ms: u64,
    },
    /// mdadm --stop: the server stops as SIGTERM stops it and exits.
    Stop,
}

/// What the server reports about its array.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct StatusReply {
    pub mdstat: String,
    pub detail_text: String,
    pub detail: serde_json::Value,
    pub nbd_uri: String,
    /// Recent events, oldest first (mdadm --monitor's names).
    #[serde(default)]
    pub events: Vec<crate::engine::Event>,
    /// md's mismatch_cnt of the last check, repair or resync.
    #[serde(default)]
    pub mismatch_cnt: u64,
    #[serde(default)]
    pub speed_limit_min_kib_per_s: u64,
    #[serde(default)]
    pub speed_limit_max_kib_per_s: u64,
    #[serde(default)]
    pub check_period_days: Option<f64>,
    #[serde(default)]
    pub next_check_in_secs: Option<u64>,
    /// (dirty, all) chunks of the write-intent bitmap.
    #[serde(default)]
    pub bitmap_dirty_chunks: Option<(u64, u64)>,
    /// The stripe cache's occupancy and counters.
    #[serde(default)]
    pub stripe_cache: Option<crate::engine::CacheReport>,
    /// The write journal's ring and counters, when the array has one.
    #[serde(default)]
    pub journal: Option<crate::engine::JournalStats>,
    /// The array's UUID (mdadm's form), name ("homehost:name") and level.
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub level: String,
    /// Roles, roles in sync (/proc/mdstat's [n/m]), and the devices
    /// /proc/mdstat marks (F) and (S).
    #[serde(default)]
    pub raid_disks: u32,
    #[serde(default)]
    pub in_sync_disks: u32,
    #[serde(default)]
    pub failed_disks: u32,
    #[serde(default)]
    pub spare_disks: u32,
    /// The array's size in KiB (/proc/mdstat's blocks).
    #[serde(default)]
    pub array_kib: u64,
    /// The background job running, if any.
    #[serde(default)]
    pub sync: Option<SyncStatus>,
    /// Every device of the array, with its I/O counters.
    #[serde(default)]
    pub members: Vec<MemberStatus>,
    /// The server's process: a new one is a new instance of the array
    /// (its event numbers start again).
    #[serde(default)]
    pub pid: u32,
    /// The background job running (resync, recovery, check, ...) and its
    /// progress in whole percent, as /proc/mdstat's figure read by atoi.
    #[serde(default)]
    pub sync_action: Option<String>,
    #[serde(default)]
    pub sync_percent: Option<u32>,
    /// No background job runs and none is ending (Engine::jobs_idle);
    /// None from a server that does not say.
    #[serde(default)]
    pub jobs_idle: Option<bool>,
    /// The ublk block device serving the array (/dev/ublkbN), if any.
    #[serde(default)]
    pub ublk: Option<String>,
}

/// Where a served array is exported: its NBD URI (empty when it is
/// served over ublk alone) and its ublk device.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    pub nbd_uri: String,
    pub ublk: Option<String>,
}

/// A running background job, counted as md counts it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SyncStatus {
    /// md's sync_action word: resync, recover, check, repair or reshape.
    pub action: String,
    /// Done and total in KiB per member, as /proc/mdstat prints them.
    pub done_kib: u64,
    pub total_kib: u64,
    /// Average speed since the job started, KiB/s per member.
    pub speed_kib_per_s: u64,
    /// The rate the job is held to now and why (served arrays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<crate::engine::PaceReport>,
}

/// One device of the array.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct MemberStatus {
    pub path: String,
    /// in_sync, rebuilding, replacement, spare, faulty or journal.
    pub state: String,
    /// The role it holds or is being rebuilt into.
    pub role: Option<usize>,
    /// Its I/O counters since it was opened.
    pub io: Option<crate::member::IoCounts>,
    /// Its SMART verdict (passed, warning, failing, unavailable), when it is
    /// a block device that serve polls.
    #[serde(default)]
    pub smart: Option<String>,
    /// Why it failed, while it is faulty ("timeout: ..." when it stopped
    /// answering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Blocks that failed their checksum since it was opened, and blocks
    /// whose checksum is not known yet; absent without `--integrity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted_blocks: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reply {
    Ok { status: Box<StatusReply> },
    Done { message: String },
    Error { message: String },
}

/// Renders the status of a snapshot.
pub fn status_of(snapshot: &Snapshot, nbd_uri: &str, homehost: &str) -> StatusReply {
    let mut detail = view::DetailView::from_snapshot(snapshot);
    // A settings file that cannot be read hides only this line; serve
    // said so at start.
    detail.tuned = crate::engine::tuning::saved::load(&detail.uuid)
        .ok()
        .and_then(|s| s.tuned);
    StatusReply {
        mdstat: view::mdstat_block(snapshot),
        detail_text: detail.text(homehost),
        detail: serde_json::to_value(&detail).expect("serializable"),
        nbd_uri: nbd_uri.to_string(),
        events: snapshot.events.clone(),
        mismatch_cnt: 0,
        speed_limit_min_kib_per_s: 0,
        speed_limit_max_kib_per_s: 0,
        check_period_days: None,
        next_check_in_secs: None,
        bitmap_dirty_chunks: None,
        stripe_cache: None,
        journal: None,
        uuid: snapshot.sb.uuid_string(),
        name: snapshot.sb.set_name.clone(),
        level: snapshot.level.to_string(),
        raid_disks: snapshot.sb.raid_disks,
        in_sync_disks: (snapshot.sb.raid_disks as usize)
            .saturating_sub(snapshot.missing_roles.len()) as u32,
        failed_disks: snapshot
            .devices
            .iter()
            .filter(|d| {
                matches!(
                    d.state,
                    DeviceState::Faulty | DeviceState::Stale { .. } | DeviceState::Duplicate { .. }
                )
            })
            .count() as u32,
        spare_disks: snapshot
            .devices
            .iter()
            .filter(|d| matches!(d.state, DeviceState::Spare))
            .count() as u32,
        array_kib: snapshot.array_sectors / 2,
        sync: snapshot.sync.as_ref().map(|p| SyncStatus {
            action: match p.action {
                SyncAction::Resync => "resync",
                SyncAction::Recovery { .. } | SyncAction::Replace { .. } => "recover",
                SyncAction::Check => "check",
                SyncAction::Repair => "repair",
                SyncAction::Reshape => "reshape",
            }
            .into(),
            done_kib: p.done_kib,
            total_kib: p.total_kib,
            speed_kib_per_s: p.speed_kib_per_s,
            pace: p.pace,
        }),
        members: snapshot
            .devices
            .iter()
            .map(|d| member_status(d, snapshot))
            .collect(),
        pid: 0,
        sync_action: snapshot.sync.as_ref().map(|p| p.action.word().to_string()),
        sync_percent: snapshot
            .sync
            .as_ref()
            .map(|p| (p.done_kib * 100 / p.total_kib.max(1)).min(100) as u32),
        jobs_idle: None,
        ublk: None,
    }
}

fn member_status(d: &crate::engine::SnapshotDevice, snapshot: &Snapshot) -> MemberStatus {
    let (state, role) = match d.state {
        DeviceState::Active { role } => ("in_sync", Some(role)),
        DeviceState::Recovering { role, .. } => ("rebuilding", Some(role)),
        DeviceState::Replacement { role, .. } => ("replacement", Some(role)),
        DeviceState::Spare => ("spare", None),
        DeviceState::Journal => ("journal", None),
        DeviceState::Faulty | DeviceState::Stale { .. } | DeviceState::Duplicate { .. } => {
            ("faulty", None)
        }
    };
    MemberStatus {
        path: d.path.clone(),
        state: state.into(),
        role,
        io: d.io.clone(),
        smart: snapshot
            .member_health
            .iter()
            .find(|(path, _)| *path == d.path)
            .map(|(_, h)| h.status.clone()),
        failure: (state == "faulty")
            .then(|| {
                snapshot
                    .member_failures
                    .iter()
                    .find(|(path, _)| *path == d.path)
                    .map(|(_, reason)| reason.clone())
            })
            .flatten(),
        checksum_errors: d.checksum_errors,
        untrusted_blocks: d.untrusted_blocks,
    }
}

pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `path`. A stale socket file (nothing listening) is replaced;
    /// a live one is refused, so two servers never share a control socket.
    pub fn start(path: &Path, engine: Arc<Engine>, exports: Exports) -> io::Result<ControlServer> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another server is listening there", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let homehost = crate::text::hostname();
        let thread = std::thread::Builder::new()
            .name("uraid-control".into())
            .spawn(move || {
                let mut waiters: Vec<JoinHandle<()>> = Vec::new();
                while !thread_stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            waiters.retain(|w| !w.is_finished());
                            let context = Context {
                                engine: &engine,
                                exports: &exports,
                                homehost: &homehost,
                                stop: &thread_stop,
                                waiters: &mut waiters,
                            };
                            match handle(stream, context) {
                                Err(e) if !client_hung_up(&e) => {
                                    eprintln!("uraid: control connection: {e}")
                                }
                                _ => {}
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50))
                        }
                        Err(e) => eprintln!("uraid: control socket: {e}"),
                    }
                }
                for waiter in waiters {
                    let _ = waiter.join();
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Long polls waiting at once; more are answered at once (the client
/// polls again), so that waiting clients cannot pile up threads.
const WAITERS_MAX: usize = 32;

/// The longest wait a client may ask for.
const WAIT_MAX: Duration = Duration::from_secs(3600);

/// What a connection's handler needs from the server.
struct Context<'a> {
    engine: &'a Arc<Engine>,
    exports: &'a Exports,
    homehost: &'a str,
    stop: &'a Arc<AtomicBool>,
    waiters: &'a mut Vec<JoinHandle<()>>,
}

fn handle(stream: UnixStream, context: Context) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    // A client that connects and closes without a word is asking whether a
    // server listens here (the registry's liveness probe, a serve checking
    // for a live socket): that is no request, and nothing to answer.
    if BufReader::new((&stream).take(REQUEST_BYTES_MAX)).read_line(&mut line)? == 0 {
        return Ok(());
    }
    let (engine, exports, homehost) = (context.engine, context.exports, context.homehost);
    let reply = match serde_json::from_str::<Request>(line.trim()) {
        // A long poll waits in a thread of its own: the other clients of
        // the socket are served meanwhile, one at a time as before.
        Ok(Request::WaitEvents { after, timeout_ms })
            if timeout_ms > 0
                && context.waiters.len() < WAITERS_MAX
                && engine.last_event_seq() <= after =>
        {
            let (engine, stop) = (engine.clone(), context.stop.clone());
            let (exports, homehost) = (exports.clone(), homehost.to_string());
            let timeout = Duration::from_millis(timeout_ms).min(WAIT_MAX);
            let waiter = std::thread::Builder::new()
                .name("uraid-control-wait".into())
                .spawn(move || {
                    engine.wait_for_event(after, timeout, || stop.load(Ordering::SeqCst));
                    let reply = execute(&engine, Request::Status, &exports, &homehost);
                    let _ = send_reply(&stream, &reply);
                })?;
            context.waiters.push(waiter);
            return Ok(());
        }
        Ok(request) => execute(engine, request, exports, homehost),
        Err(e) => Reply::Error {
            message: format!("bad request: {e}"),
        },
    };
    send_reply(&stream, &reply)
}

/// Whether a connection's error is only its client going away before the
/// reply (a status it stopped waiting for): not an event for the log.
fn client_hung_up(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

fn send_reply(stream: &UnixStream, reply: &Reply) -> io::Result<()> {
    let mut out = serde_json::to_string(reply).expect("serializable");
    out.push('\n');
    let mut stream = stream;
    stream.write_all(out.as_bytes())
}

fn done(result: Result<(), String>, message: String) -> Reply {
    match result {
        Ok(()) => Reply::Done { message },
        Err(message) => Reply::Error { message },
    }
}

fn execute(engine: &Arc<Engine>, request: Request, exports: &Exports, homehost: &str) -> Reply {
    let nbd_uri = exports.nbd_uri.as_str();
    match request {
        Request::Status | Request::WaitEvents { .. } => {
            let mut status = status_of(&engine.snapshot(), nbd_uri, homehost);
            status.pid = std::process::id();
            // Who serves it, after mdadm's part: the process `uraid stop`
            // ends and the export clients connect to.
            status.detail["pid"] = status.pid.into();
            status.detail_text += &format!(
                "\n    Served (uraid):\n{:>22} : {}\n{:>22} : {}\n",
                "pid",
                status.pid,
                "nbd",
                if nbd_uri.is_empty() {
                    "(none)"
                } else {
                    nbd_uri
                }
            );
            if let Some(device) = &exports.ublk {
                status.detail["ublk"] = device.as_str().into();
                status.detail_text += &format!("{:>22} : {device}\n", "ublk");
            }
            status.ublk = exports.ublk.clone();
            status.mismatch_cnt = engine.mismatch_sectors();
            status.jobs_idle = Some(engine.jobs_idle());
            status.check_period_days = engine
                .check_schedule()
                .map(|(p, _)| p.as_secs_f64() / 86400.0);
            status.next_check_in_secs = engine.check_schedule().map(|(_, s)| s);
            status.bitmap_dirty_chunks = engine.bitmap_dirty();
            status.stripe_cache = Some(engine.cache_report());
            status.journal = engine.journal_stats();
            (
                status.speed_limit_min_kib_per_s,
                status.speed_limit_max_kib_per_s,
            ) = engine.speed_limits();
            Reply::Ok {
                status: Box::new(status),
            }
        }
        Request::Fail { device, force } => {
            let message = format!("set {} faulty", device.display());
            done(engine.manage_fail_with(&device, force), message)
        }
        Request::Remove { device } => {
            let message = format!("removed {}", device.display());
            done(engine.manage_remove(&device), message)
        }
        Request::Add { device, force } => {
            let message = format!("added {}", device.display());
            done(engine.manage_add_with(&device, force), message)
        }
        Request::ReAdd { device } => match engine.manage_readd(&device) {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        },
        Request::AutoReAdd { on } => {
            engine.set_auto_readd(on);
            Reply::Done {
                message: format!("auto re-add {}", if on { "on" } else { "off" }),
            }
        }
        Request::CheckPeriod { days } => {
            if !(0.0..=3650.0).contains(&days) {
                return Reply::Error {
                    message: format!("check period {days} days: give 0 (off) to 3650"),
                };
            }
            let period = (days > 0.0).then(|| std::time::Duration::from_secs_f64(days * 86400.0));
            engine.set_check_period(period);
            Reply::Done {
                message: match period {
                    Some(_) => format!(
                        "a check runs every {days} days, the first one {days} days from now"
                    ),
                    None => "no scheduled checks".into(),
                },
            }
        }
        Request::GrowBitmap {
            bitmap,
            chunk_bytes,
        } => {
            let result = match bitmap.as_str() {
                "internal" => engine.grow_bitmap(true, chunk_bytes),
                "none" => engine.grow_bitmap(false, None),
                other => Err(format!("unknown bitmap '{other}': internal or none")),
            };
            match result {
                Ok(message) => Reply::Done { message },
                Err(message) => Reply::Error { message },
            }
        }
        Request::Reshape {
            raid_devices,
            level,
            layout,
            chunk_bytes,
            array_size_sectors,
        } => match reshape_request(engine, raid_devices, level, layout, chunk_bytes).and_then(
            |request| {
                engine.start_reshape(&crate::array::ReshapeRequest {
                    array_sectors: array_size_sectors,
                    ..request
                })
            },
        ) {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        },
        Request::GrowSize { size_sectors } => match engine.grow_size(size_sectors) {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        },
        Request::Replace {
            device,
            with,
            force,
        } => {
            let message = format!("replacing {} with {}", device.display(), with.display());
            done(engine.manage_replace_with(&device, &with, force), message)
        }
        Request::SyncAction { action } => match action.as_str() {
            "check" => done(engine.start_scrub(false), "check started".into()),
            "repair" => done(engine.start_scrub(true), "repair started".into()),
            // md's idle stops a reshape too; uraid keeps it paused until
            // "reshape" (or the next start) continues it.
            "idle" if engine.reshape_running() => {
                engine.pause_reshape();
                Reply::Done {
                    message: "reshape paused; --action reshape continues it".into(),
                }
            }
            "idle" => done(engine.stop_sync(), "background job stopped".into()),
            "reshape" => done(engine.continue_reshape(), "reshape continues".into()),
            other => Reply::Error {
                message: format!("unknown sync action '{other}': check, repair, idle or reshape"),
            },
        },
        Request::Inject { device, fault } => match engine.inject(&device, &fault) {
            Ok(state) => Reply::Done {
                message: format!("{}: {state}", device.display()),
            },
            Err(message) => Reply::Error { message },
        },
        Request::Set {
            settings,
            accept_data_loss,
        } => match engine.set_tunables(&settings, accept_data_loss) {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        },
        Request::ApplyTuned { settings, tuned } => match engine.apply_tuned(&settings, tuned) {
            Ok(message) => Reply::Done { message },
            Err(message) => Reply::Error { message },
        },
        Request::Stop => stop_server(&engine.snapshot()),
        Request::SpeedLimits {
            min_kib_per_s,
            max_kib_per_s,
        } => {
            if min_kib_per_s == Some(0) || max_kib_per_s == Some(0) {
                return Reply::Error {
                    message: "speed limits must be positive (md refuses 0 too)".into(),
                };
            }
            engine.set_speed_limits(min_kib_per_s, max_kib_per_s);
            let (min, max) = engine.speed_limits();
            Reply::Done {
                message: format!("speed_limit_min {min} KiB/s, speed_limit_max {max} KiB/s"),
            }
        }
    }
}

/// Asks this process to stop as SIGTERM asks it. `uraid serve` blocks
/// SIGTERM in every thread and takes it only in its main thread's sigwait,
/// so a stop by request is the very stop an administrator's `kill` starts:
/// in-flight I/O finished, superblocks written, the sockets and the
/// registry entry removed. In a process that does not block SIGTERM the
/// signal would kill it instead, so the request is refused there.
fn stop_server(snapshot: &Snapshot) -> Reply {
    // SAFETY: a zeroed sigset_t is a valid argument for pthread_sigmask to
    // fill, and a null new set only reads the mask in force.
    let blocked = unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
        libc::sigismember(&mask, libc::SIGTERM) == 1
    };
    if !blocked {
        return Reply::Error {
            message: "this process does not stop on request: send it SIGTERM".into(),
        };
    }
    let pid = std::process::id();
    let what = if snapshot.runnable {
        "finishing in-flight I/O and writing the superblocks"
    } else {
        "the array has failed (not every sector can be read); finishing in-flight I/O"
    };
    eprintln!("uraid: stop requested over the control socket");
    // Process-directed, not raise(): a signal sent to this thread alone
    // would stay pending here, blocked, unseen by the main thread's sigwait.
    // SAFETY: kill(2) of this very process with a signal it blocks.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    Reply::Done {
        message: format!("pid {pid} stopping: {what}"),
    }
}

/// Sends a request that changes something; returns the server's message.
pub fn command(path: &Path, request: &Request) -> Result<String, String> {
    match exchange(path, request)? {
        Reply::Done { message } => Ok(message),
        Reply::Ok { .. } => Ok(String::new()),
        Reply::Error { message } => Err(message),
    }
}

fn exchange(path: &Path, request: &Request) -> Result<Reply, String> {
    exchange_within(path, request, Duration::from_secs(30))
}

fn exchange_within(path: &Path, request: &Request, limit: Duration) -> Result<Reply, String> {
    let stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "{}: cannot reach a running uraid serve: {e}",
            path.display()
        )
    })?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_string(request).expect("serializable");
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str::<Reply>(&reply)
        .map_err(|e| format!("{}: malformed reply: {e}", path.display()))
}

/// Sends one request to a control socket and returns the reply.
pub fn request(path: &Path, request: &Request) -> Result<StatusReply, String> {
    match exchange(path, request)? {
        Reply::Ok { status } => Ok(*status),
        Reply::Done { message } => Err(format!("unexpected reply: {message}")),
        Reply::Error { message } => Err(message),
    }
}

/// The status once an event numbered above `after` is logged, or after
/// `timeout` (a server that predates the request answers at once with an
/// error, and the caller polls).
pub fn wait_events(path: &Path, after: u64, timeout: Duration) -> Result<StatusReply, String> {
    let request = Request::WaitEvents {
        after,
        timeout_ms: timeout.as_millis() as u64,
    };
    match exchange_within(path, &request, timeout + Duration::from_secs(30))? {
        Reply::Ok { status } => Ok(*status),
        Reply::Done { message } => Err(format!("unexpected reply: {message}")),
        Reply::Error { message } => Err(message),
    }
}

/// Where sockets go by default: the runtime folder (see `registry`).
pub fn default_socket_dir() -> PathBuf {
    registry::runtime_dir()
}

/// A reshape request in md's numbers, from the names a user gave.
fn reshape_request(
    engine: &Engine,
    raid_devices: Option<u32>,
    level: Option<String>,
    layout: Option<String>,
    chunk_bytes: Option<u64>,
) -> Result<crate::array::ReshapeRequest, String> {
    use crate::geometry::{layout_from_name, level_from_name};
    let level = level
        .map(|name| level_from_name(&name).ok_or_else(|| format!("unknown level '{name}'")))
        .transpose()?;
    let layout_level = level.unwrap_or_else(|| engine.geometry().level());
    let layout = layout
        .map(|name| {
            layout_from_name(layout_level, &name)
                .ok_or_else(|| format!("unknown layout '{name}' for {layout_level}"))
        })
        .transpose()?;
    let chunk_sectors = chunk_bytes
        .map(|bytes| {
            if bytes < 4096 || !bytes.is_power_of_two() {
                Err(format!(
                    "chunk size {bytes} bytes: give a power of two of at least 4K"
                ))
            } else {
                Ok(bytes / 512)
            }
        })
        .transpose()?;
    Ok(crate::array::ReshapeRequest {
        raid_devices,
        level: level.map(|l| l.md_number()),
        layout,
        chunk_sectors,
        array_sectors: None,
    })
}
