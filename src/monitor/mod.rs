//! `uraid monitor`: mdadm --monitor for served arrays. It reads only the
//! replies of the servers' control sockets (status and the numbered event
//! log), never engine internals, so it runs as its own process beside any
//! number of servers.
//!
//! A pass asks every array for its status and turns what changed into
//! alerts (`tracker`), delivered by `alert`. Between passes it waits
//! `delay`, or less: each array it follows has a thread waiting on the
//! control socket for the next event (a long poll), which ends the wait.

pub mod alert;
pub mod metrics;
pub mod tracker;

use crate::control::{self, registry, Request, StatusReply};
use alert::Sinks;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracker::{Alert, Tracked};

/// Which arrays to follow.
pub enum Arrays {
    /// Every registered server, listed again at every pass.
    Scan,
    /// These control sockets.
    Sockets(Vec<PathBuf>),
}

pub struct Options {
    pub arrays: Arrays,
    pub sinks: Sinks,
    pub oneshot: bool,
    pub test: bool,
    pub delay: Duration,
    pub increment: u32,
    pub metrics: Option<String>,
    /// The spares each array should have (the config's ARRAY `spares=`,
    /// by UUID in mdadm's form): fewer at first sight is SparesMissing.
    pub spares_wanted: Vec<(String, u32)>,
}

/// One array the monitor follows.
struct Watched {
    socket: PathBuf,
    /// Its device name for alerts, once known (else the socket).
    md: String,
    /// None while it cannot be reached.
    tracked: Option<Tracked>,
    /// It was unreachable (DeviceDisappeared given): back is NewArray.
    errored: bool,
    waiter: Option<Arc<AtomicBool>>,
}

/// The latest status of every array followed, for --metrics.
type Latest = Arc<Mutex<BTreeMap<String, StatusReply>>>;

pub fn run(options: Options) -> Result<(), String> {
    let latest: Latest = Arc::default();
    let metrics = match &options.metrics {
        Some(addr) => {
            let source = latest.clone();
            let source: Arc<dyn Fn() -> Vec<StatusReply> + Send + Sync> =
                Arc::new(move || source.lock().unwrap().values().cloned().collect());
            let server = metrics::MetricsServer::start(addr, source)
                .map_err(|e| format!("--metrics {addr}: {e}"))?;
            eprintln!(
                "uraid: monitor: metrics on http://{}/metrics",
                server.local_addr()
            );
            Some(server)
        }
        None => None,
    };
    if options.sinks.syslog {
        alert::open_syslog();
    }
    let (wake_tx, wake_rx) = mpsc::channel::<()>();
    let mut watched: BTreeMap<String, Watched> = BTreeMap::new();
    if let Arrays::Sockets(sockets) = &options.arrays {
        for socket in sockets {
            watched.insert(socket.display().to_string(), Watched::new(socket.clone()));
        }
    }
    let mut first = true;
    loop {
        pass(&options, &mut watched, &latest, first, &wake_tx);
        first = false;
        if options.oneshot {
            break;
        }
        wait(&wake_rx, options.delay);
    }
    if let Some(server) = metrics {
        server.stop();
    }
    Ok(())
}

impl Watched {
    fn new(socket: PathBuf) -> Watched {
        Watched {
            md: socket.display().to_string(),
            socket,
            tracked: None,
            errored: false,
            waiter: None,
        }
    }

    fn stop_waiter(&mut self) {
        if let Some(flag) = self.waiter.take() {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// Waits `delay`, or until a waiter reports an event.
fn wait(wake: &Receiver<()>, delay: Duration) {
    if wake.recv_timeout(delay).is_ok() {
        // Events come in bursts (Fail, DegradedArray, RebuildStarted):
        // take the burst in one pass.
        std::thread::sleep(Duration::from_millis(100));
        while wake.try_recv().is_ok() {}
    }
}

/// Arrays mdadm --monitor --scan leaves out: no redundancy to lose.
fn without_redundancy(level: &str) -> bool {
    matches!(level, "raid0" | "linear")
}

fn pass(
    options: &Options,
    watched: &mut BTreeMap<String, Watched>,
    latest: &Latest,
    first: bool,
    wake: &Sender<()>,
) {
    let scan = matches!(options.arrays, Arrays::Scan);
    if scan {
        let entries: BTreeMap<String, registry::Entry> = registry::list()
            .into_iter()
            .filter(|e| !without_redundancy(&e.level))
            .map(|e| (format!("{} {}", e.uuid, e.control.display()), e))
            .collect();
        // Gone from the registry: stopped (or crashed) since the last pass.
        let gone: Vec<String> = watched
            .keys()
            .filter(|k| !entries.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            let mut w = watched.remove(&key).expect("listed");
            w.stop_waiter();
            latest.lock().unwrap().remove(&key);
            if w.tracked.is_some() {
                deliver(options, &w, &Alert::new("DeviceDisappeared", &w.md), latest);
            }
        }
        for (key, entry) in entries {
            watched.entry(key).or_insert_with(|| {
                let mut w = Watched::new(entry.control.clone());
                w.md = entry.md_device();
                // Found by the scan: announced as new once reached.
                w.errored = true;
                w
            });
        }
    }
    let keys: Vec<String> = watched.keys().cloned().collect();
    for key in keys {
        let w = watched.get_mut(&key).expect("listed");
        // The state is read before a test message's program runs, so that
        // what happens while it runs is news, not history.
        let reply = control::request(&w.socket, &Request::Status);
        if first && options.test {
            if let Ok(reply) = &reply {
                w.md = tracker::md_device(reply);
                // A test mail shows the array's status too.
                latest.lock().unwrap().insert(key.clone(), reply.clone());
            }
            deliver(options, w, &Alert::new("TestMessage", &w.md), latest);
        }
        let mut alerts = Vec::new();
        let mut notes = Vec::new();
        match reply {
            Ok(reply) => {
                let level = reply.detail["raid_level"].as_str().unwrap_or_default();
                if without_redundancy(level) {
                    if w.tracked.is_none() && !w.errored {
                        let mut alert =
                            Alert::new("DeviceDisappeared", &tracker::md_device(&reply));
                        alert.description = Some("Wrong-Level".into());
                        alerts.push(alert);
                    }
                    w.errored = true;
                } else {
                    alerts = observe(w, &reply, options, &mut notes);
                    latest.lock().unwrap().insert(key.clone(), reply);
                    if w.waiter.is_none() && !options.oneshot {
                        w.waiter = Some(start_waiter(w, options.delay, wake.clone()));
                    }
                }
            }
            Err(_) => {
                latest.lock().unwrap().remove(&key);
                w.stop_waiter();
                if w.tracked.take().is_some() || (!w.errored && !scan) {
                    alerts.push(Alert::new("DeviceDisappeared", &w.md));
                }
                w.errored = true;
            }
        }
        for note in notes {
            eprintln!("uraid: monitor: {note}");
        }
        for alert in &alerts {
            deliver(options, w, alert, latest);
        }
    }
}

/// Turns a reply into alerts, seeing the array anew when it is another
/// instance (the old one disappeared).
fn observe(
    w: &mut Watched,
    reply: &StatusReply,
    options: &Options,
    notes: &mut Vec<String>,
) -> Vec<Alert> {
    let mut alerts = Vec::new();
    if let Some(tracked) = w.tracked.as_mut() {
        match tracker::update(tracked, reply, options.increment, notes) {
            Some(found) => return found,
            None => {
                alerts.push(Alert::new("DeviceDisappeared", &tracked.md));
                w.errored = true;
                w.stop_waiter();
            }
        }
    }
    let wanted = options
        .spares_wanted
        .iter()
        .find(|(uuid, _)| *uuid == reply.uuid)
        .map(|(_, n)| *n);
    let (tracked, found) = tracker::first_sight(reply, w.errored, wanted);
    w.md = tracked.md.clone();
    w.tracked = Some(tracked);
    w.errored = false;
    alerts.extend(found);
    alerts
}

fn deliver(options: &Options, w: &Watched, alert: &Alert, latest: &Latest) {
    let mdstat = mdstat_text(latest);
    options.sinks.deliver(alert, Some(&w.socket), &mdstat);
}

/// /proc/mdstat's text for the arrays followed, for mails.
fn mdstat_text(latest: &Latest) -> String {
    let latest = latest.lock().unwrap();
    let mut personalities: Vec<String> = Vec::new();
    for r in latest.values() {
        let level = format!("[{}]", r.detail["raid_level"].as_str().unwrap_or("?"));
        if !personalities.contains(&level) {
            personalities.push(level);
        }
    }
    let mut text = format!("Personalities : {}\n", personalities.join(" "));
    for r in latest.values() {
        text.push_str(&r.mdstat);
    }
    text.push_str("unused devices: <none>\n");
    text
}

/// A thread that waits on the array's control socket for its next event
/// and wakes the monitor; it ends when told, or when the array is gone.
fn start_waiter(w: &Watched, delay: Duration, wake: Sender<()>) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let socket = w.socket.clone();
    let mut after = w.tracked.as_ref().map_or(0, |t| t.last_seq());
    let spawned = std::thread::Builder::new()
        .name("uraid-monitor-wait".into())
        .spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match control::wait_events(&socket, after, delay) {
                    Ok(reply) => {
                        let last = reply.events.iter().map(|e| e.seq).max().unwrap_or(0);
                        if last != after {
                            after = last;
                            if flag.load(Ordering::SeqCst) || wake.send(()).is_err() {
                                break;
                            }
                        }
                    }
                    // A server without the long poll: the monitor polls.
                    Err(e) if e.starts_with("bad request") => break,
                    Err(_) => {
                        let _ = wake.send(());
                        break;
                    }
                }
            }
        });
    if spawned.is_err() {
        stop.store(true, Ordering::SeqCst);
    }
    stop
}
