//! The SMART poller of `uraid serve`: runs smartctl on every member that
//! is a block device, at start and then every interval, hands the health
//! to the engine for detail and status, raises SmartFail / SmartWarning /
//! SmartUnavailable, and replaces a member predicted to fail onto a spare
//! while it still serves (md's replace; a controller's SMART copyback).
//!
//! The engine knows nothing of smartctl: it gets a `MemberHealth` to show
//! and a replace request, as from `uraid manage`.

use super::{compare, parse, Health, Status};
use crate::array::DeviceState;
use crate::engine::{Engine, MemberHealth};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The smartctl to run instead of `smartctl` on PATH.
pub const SMARTCTL_ENV: &str = "URAID_SMARTCTL";

/// How long one smartctl run may take. `-H -A -i` reads a few log pages
/// and answers in well under a second on a healthy drive; a drive that
/// hangs its commands must not hold the poller (or a stop) for long.
pub const SMARTCTL_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a predicted failure waiting for a spare (or for the running
/// job to end) looks again: a spare added is taken within this.
const REPLACE_TICK: Duration = Duration::from_millis(500);

/// Runs `program -j -H -A -i DEVICE`, for at most `timeout` (or until
/// `stop` is set): its stdout and exit code, or one line saying why not.
pub fn run_smartctl(
    program: &OsString,
    device: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(Vec<u8>, Option<i32>), String> {
    let shown = program.to_string_lossy();
    let mut child = Command::new(program)
        .args(["-j", "-H", "-A", "-i", device])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own group, so that a timeout kills whatever it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("{shown} not found (install smartmontools, or set {SMARTCTL_ENV})")
            }
            std::io::ErrorKind::PermissionDenied => format!("{shown}: not executable"),
            _ => format!("{shown}: {e}"),
        })?;
    let mut pipe = child.stdout.take().expect("piped stdout");
    // Read while it runs: output larger than the pipe would block it.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.by_ref().take(16 << 20).read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let out = reader.join().unwrap_or_default();
                return Ok((out, status.code()));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("{shown}: {e}")),
        }
        let stopping = stop.load(Ordering::SeqCst);
        if stopping || Instant::now() >= deadline {
            // SAFETY: kill(2) of the group of our own child, not yet reaped.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err(if stopping {
                format!("{shown} stopped: the server is stopping")
            } else {
                format!(
                    "{shown} did not answer within {} s on {device} (killed)",
                    timeout.as_secs()
                )
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the poller remembers of a member between polls.
#[derive(Default)]
struct Member {
    /// The last health smartctl could read: the counts that must not grow.
    last_readable: Option<Health>,
    /// Why the member was predicted to fail; kept until the server stops,
    /// since a count that grew once does not heal by standing still.
    predicted: Option<String>,
    /// The status and reasons last reported, so that an event is raised
    /// on a change, not at every poll.
    reported: Option<(Status, Vec<String>)>,
    /// The last reason a replacement could not start, said once.
    replace_blocked: Option<String>,
}

pub struct SmartPoller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SmartPoller {
    /// Starts polling the engine's block-device members every `interval`
    /// (the first poll at once).
    pub fn start(engine: Arc<Engine>, interval: Duration) -> std::io::Result<SmartPoller> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("uraid-smart".into())
            .spawn(move || run(&engine, interval, &thread_stop))?;
        Ok(SmartPoller {
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SmartPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn is_block_device(path: &str) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

fn run(engine: &Arc<Engine>, interval: Duration, stop: &AtomicBool) {
    let mut members: HashMap<String, Member> = HashMap::new();
    let mut next_poll = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next_poll {
            poll(engine, &mut members, stop);
            next_poll = Instant::now() + interval;
        }
        replace_predicted(engine, &mut members);
        let wait = next_poll
            .saturating_duration_since(Instant::now())
            .min(REPLACE_TICK);
        std::thread::sleep(wait.max(Duration::from_millis(10)));
    }
}

fn poll(engine: &Arc<Engine>, members: &mut HashMap<String, Member>, stop: &AtomicBool) {
    let program = std::env::var_os(SMARTCTL_ENV).unwrap_or_else(|| "smartctl".into());
    let paths: Vec<String> = engine
        .snapshot()
        .devices
        .into_iter()
        .map(|d| d.path)
        .filter(|p| is_block_device(p))
        .collect();
    members.retain(|path, _| {
        let present = paths.contains(path);
        if !present {
            engine.set_member_health(path, None);
        }
        present
    });
    for path in paths {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let state = members.entry(path.clone()).or_default();
        let mut health = match run_smartctl(&program, &path, SMARTCTL_TIMEOUT, stop) {
            Ok((out, code)) => compare(state.last_readable.as_ref(), parse(&out, code)),
            Err(reason) => Health::unavailable(reason),
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if health.status != Status::Unavailable {
            state.last_readable = Some(health.clone());
        }
        if health.status == Status::Failing && state.predicted.is_none() {
            state.predicted = Some(health.reasons.join("; "));
        } else if let Some(earlier) = state.predicted.as_ref() {
            if health.status != Status::Failing {
                health
                    .reasons
                    .insert(0, format!("predicted to fail: {earlier}"));
                health.status = Status::Failing;
            }
        }
        report(engine, &path, state, &health);
    }
}

/// Shows the health and raises an event when the verdict changed.
fn report(engine: &Engine, path: &str, state: &mut Member, health: &Health) {
    let key = (health.status, health.reasons.clone());
    let was = state.reported.replace(key.clone());
    let changed = was.as_ref() != Some(&key);
    let was_failing = was.is_some_and(|(s, _)| s == Status::Failing);
    let event = match health.status {
        Status::Failing if !was_failing => Some("SmartFail"),
        Status::Warning if changed => Some("SmartWarning"),
        Status::Unavailable if changed => Some("SmartUnavailable"),
        _ => None,
    };
    if let Some(event) = event {
        engine.raise_event(event, path, &health.reasons.join("; "));
    }
    engine.set_member_health(
        path,
        Some(MemberHealth {
            status: health.status.as_str().into(),
            summary: health.summary(),
            detail: serde_json::to_value(health).unwrap_or_default(),
        }),
    );
}

/// Starts md's replace of each active member predicted to fail onto a
/// spare, once one is there and no other job runs.
fn replace_predicted(engine: &Arc<Engine>, members: &mut HashMap<String, Member>) {
    if !members.values().any(|m| m.predicted.is_some()) {
        return;
    }
    let snapshot = engine.snapshot();
    for (path, state) in members.iter_mut() {
        if state.predicted.is_none() {
            continue;
        }
        let Some(role) = snapshot.devices.iter().find_map(|d| match d.state {
            DeviceState::Active { role } if &d.path == path => Some(role),
            _ => None,
        }) else {
            continue;
        };
        let under_way = snapshot
            .devices
            .iter()
            .any(|d| matches!(d.state, DeviceState::Replacement { role: r, .. } if r == role));
        if under_way {
            continue;
        }
        // A missing role takes a spare first, as md rebuilds before it
        // replaces; so does a job already running.
        let blocked = if !snapshot.missing_roles.is_empty() {
            Err("the array is degraded: a missing member is rebuilt first".to_string())
        } else {
            // A spare SMART itself calls failing is no place to copy to.
            let spare = snapshot.devices.iter().find(|d| {
                d.state == DeviceState::Spare
                    && snapshot_health(&snapshot, &d.path) != Some(Status::Failing.as_str())
            });
            match spare {
                None => Err("no spare: add one and it takes this member's place".to_string()),
                Some(spare) => engine.manage_replace(
                    std::path::Path::new(path),
                    std::path::Path::new(&spare.path),
                ),
            }
        };
        match blocked {
            Ok(()) => state.replace_blocked = None,
            Err(reason) => {
                if state.replace_blocked.as_ref() != Some(&reason) {
                    eprintln!("uraid: SMART: {path} is predicted to fail; replace waits: {reason}");
                    state.replace_blocked = Some(reason);
                }
            }
        }
    }
}

fn snapshot_health<'a>(snapshot: &'a crate::engine::Snapshot, path: &str) -> Option<&'a str> {
    snapshot
        .member_health
        .iter()
        .find(|(p, _)| p == path)
        .map(|(_, h)| h.status.as_str())
}
