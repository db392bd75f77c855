//! `uraid serve`: assemble an array and export it over NBD until SIGINT or
//! SIGTERM; then finish in-flight I/O, mark the array clean and exit 0.

use super::scan::{find_for_serve, split_knobs, Wanted};
use super::CliResult;
use crate::array::{assemble_members, open_members};
use crate::control::registry::{self, Registration};
use crate::control::ControlServer;
use crate::engine::{Engine, EngineOptions};
use crate::export::nbd::{self, Listener, ServeOptions, Tls, TlsCredentials, TlsMode};
use crate::export::BlockBackend;
use crate::member::Wrapping;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to export: unix:PATH (default: a socket in /run/uraid, unless
    /// --ublk alone is given) or tcp:HOST:PORT.
    #[arg(long)]
    nbd: Option<String>,
    /// Also (or, without --nbd, only) serve the array as a local block
    /// device, /dev/ublkbN, through the kernel's ublk driver (Linux 6.0+,
    /// root).
    #[arg(long)]
    ublk: bool,
    /// With --ublk: the device's hardware queues, each a thread with its
    /// own ring (1-64).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "ublk")]
    ublk_queues: u16,
    /// With --ublk: requests in flight per queue (1-4096).
    #[arg(long, value_name = "D", default_value_t = crate::export::ublk::DEPTH_DEFAULT, requires = "ublk")]
    ublk_depth: u16,
    /// The control socket for status, detail and manage (default: <name>.ctl in the runtime folder: $URAID_RUNTIME_DIR, else /run/uraid for root, else $XDG_RUNTIME_DIR/uraid).
    #[arg(long)]
    control: Option<PathBuf>,
    /// TLS through NBD's STARTTLS, as nbdkit's --tls: off (never), on
    /// (offered; plaintext clients served too) or require (nothing but
    /// STARTTLS until TLS is up). on and require need --tls-psk or
    /// --tls-certificates.
    #[arg(long, value_enum, default_value_t = TlsArg::Off)]
    tls: TlsArg,
    /// A psktool key file (lines `username:hexkey`): clients authenticate
    /// with a user name and its pre-shared key.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_certificates")]
    tls_psk: Option<PathBuf>,
    /// A directory with ca-cert.pem, server-cert.pem and server-key.pem
    /// (nbdkit's and qemu-nbd's layout).
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// With --tls-certificates: clients must present a certificate signed
    /// by ca-cert.pem.
    #[arg(long, requires = "tls_certificates")]
    tls_verify_peer: bool,
    /// Serve without writing anything, superblocks included.
    #[arg(long)]
    read_only: bool,
    /// Start even a dirty degraded parity array (md refuses it by default).
    #[arg(long)]
    force: bool,
    /// Wrap every member in a fault injector driven by `uraid manage --inject`
    /// (pull, offline, I/O errors, latency, torn writes): for rehearsals and tests.
    #[arg(long)]
    fault_injection: bool,
    /// Seconds a member I/O may take before the member is failed (as an
    /// I/O error fails it: the array goes degraded and serves from the
    /// others); 0 waits for ever. Applies to members whose I/O goes through
    /// uraid's member interface (network members, fault-injected members);
    /// local files and disks that uraid drives on io_uring rely on the
    /// kernel's own command timers.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_MEMBER_TIMEOUT_SECS)]
    member_timeout: u64,
    /// Re-add members that failed by a timeout by themselves, once they
    /// answer again and their superblock says they belong (bitmap-guided:
    /// only what changed meanwhile is copied); `manage --auto-re-add`
    /// turns it on or off while serving.
    #[arg(long)]
    auto_re_add: bool,
    /// Seconds between SMART polls of members that are block devices
    /// (`smartctl -j -H -A -i`, or $URAID_SMARTCTL); 0 polls never.
    #[arg(long, value_name = "S", default_value_t = 300)]
    smart_interval: u64,
    /// The array's knobs for this run, over its saved settings (see `--set help`).
    #[command(flatten)]
    tuning: super::tuning::TuningArgs,
    /// Find the members by their superblocks among the config's DEVICE
    /// paths (or the devices given), as mdadm --assemble --scan; one of
    /// --uuid, --name, --all says which array.
    #[arg(long)]
    scan: bool,
    /// The config file for --scan (default /etc/uraid/uraid.conf).
    #[arg(long, value_name = "FILE", requires = "scan")]
    config: Option<PathBuf>,
    /// With --scan: the array with this UUID (any punctuation).
    #[arg(long, requires = "scan", conflicts_with_all = ["name", "all"])]
    uuid: Option<String>,
    /// With --scan: the array of this name (`data`, `host:data` or `/dev/md/data`).
    #[arg(long, requires = "scan", conflicts_with = "all")]
    name: Option<String>,
    /// With --scan: list the arrays found; serve runs one array per process
    /// (serve each with --uuid), so this serves none and exits 1.
    #[arg(long, requires = "scan")]
    all: bool,
    /// The member devices or image files (with --scan: where to search
    /// instead of the config's DEVICE lines).
    #[arg(required_unless_present = "scan")]
    devices: Vec<PathBuf>,
}

/// 30 s, as the SCSI disk command timer (/sys/block/sdX/device/timeout),
/// NVMe's io_timeout and blk-mq's default request timeout: the time after
/// which the kernel itself gives up on a local disk's I/O and md sees an
/// error. The kernel's NBD client has no timeout unless one is set
/// (nbd-client -timeout; a request then waits for ever), and the usual
/// advice for md over NBD is to set one in this range, so that md fails
/// the member instead of the array hanging with it: a member on another
/// host gets the same grace as a local disk. Long enough for a congested
/// network or a member host's brief stall, short enough that a client
/// (whose own NBD timeout is often 30 s or more) sees a slow request, not
/// a dead export.
const DEFAULT_MEMBER_TIMEOUT_SECS: u64 = 30;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum TlsArg {
    Off,
    On,
    Require,
}

/// Loads the TLS credentials the arguments name, before anything is served.
fn tls_config(args: &ServeArgs) -> Result<Option<Tls>, String> {
    let mode = match args.tls {
        TlsArg::Off => {
            if args.tls_psk.is_some() || args.tls_certificates.is_some() {
                return Err(
                    "--tls-psk and --tls-certificates need --tls on or --tls require".into(),
                );
            }
            return Ok(None);
        }
        TlsArg::On => TlsMode::On,
        TlsArg::Require => TlsMode::Require,
    };
    let credentials = match (&args.tls_psk, &args.tls_certificates) {
        (Some(file), _) => TlsCredentials::Psk(file.clone()),
        (None, Some(dir)) => TlsCredentials::X509 {
            dir: dir.clone(),
            verify_peer: args.tls_verify_peer,
        },
        (None, None) => {
            return Err("--tls on and require need --tls-psk FILE or --tls-certificates DIR".into())
        }
    };
    Tls::load(mode, &credentials).map(Some)
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts, so
/// that they are taken only by the sigwait below, at a point where an
/// orderly stop is possible.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: the set is initialised by sigemptyset before use, and
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_stop_signal(set: &libc::sigset_t) -> i32 {
    let mut signal: libc::c_int = 0;
    // SAFETY: set is a valid, initialised signal set; signal is a live local.
    unsafe { libc::sigwait(set, &mut signal) };
    signal
}

pub fn run(args: &ServeArgs) -> CliResult {
    let (paths, knobs) = if args.scan {
        let wanted = match (&args.uuid, &args.name, args.all) {
            (Some(uuid), _, _) => Wanted::Uuid(uuid),
            (_, Some(name), _) => Wanted::Name(name),
            (_, _, true) => Wanted::All,
            _ => return Err("--scan needs --uuid UUID, --name NAME or --all".into()),
        };
        let found = find_for_serve(wanted, args.config.as_deref(), &args.devices, args.force)?;
        (found.paths, found.knobs)
    } else {
        (args.devices.clone(), Vec::new())
    };
    let (config_settings, speed_min, speed_max) = split_knobs(&knobs);
    let tls = tls_config(args)?;
    let signals = block_stop_signals();
    let mut members = open_members(&paths, !args.read_only).map_err(|e| e.to_string())?;
    let wrapping = Wrapping {
        fault_injection: args.fault_injection,
        timeout: (args.member_timeout > 0)
            .then(|| std::time::Duration::from_secs(args.member_timeout)),
    };
    let mut injectors = Vec::new();
    for (name, member) in members.iter_mut() {
        let wrapped = wrapping.wrap(member.clone());
        if let Some(injector) = wrapped.injector {
            injectors.push((name.clone(), injector));
        }
        *member = wrapped.member;
    }
    let array = assemble_members(members).map_err(|e| e.to_string())?;
    let set_name = array.sb.set_name.clone();
    let label = registry::label_for(&set_name, &array.sb.uuid_string());
    let (nbd_address, control_path) = addresses(args, &label)?;
    let listener: Option<Listener> = nbd_address
        .as_ref()
        .map(|a| a.parse().map_err(|e| format!("--nbd {a}: {e}")))
        .transpose()?;
    if listener.is_none() && tls.is_some() {
        return Err("--tls goes with an NBD export (--nbd); --ublk alone has no socket".into());
    }
    let ublk = args.ublk.then_some(crate::export::ublk::UblkOptions {
        queues: args.ublk_queues,
        depth: args.ublk_depth,
    });
    // Refuse sockets that a running server owns, and a ublk device this
    // kernel or user cannot make, before anything is written: starting the
    // engine marks the members active.
    if let Some(address) = &nbd_address {
        refuse_live_socket(address)?;
    }
    refuse_live_socket(&format!("unix:{}", control_path.display()))?;
    if let Some(options) = &ublk {
        options.check()?;
        crate::export::ublk::probe()?;
    }
    let nbd_address = nbd_address.unwrap_or_default();
    if matches!(listener, Some(Listener::Tcp { .. })) {
        match &tls {
            None => eprintln!(
                "uraid: WARNING: {nbd_address} without TLS: anyone who reaches this port can read \
                 and write the array (use --tls require, or a unix socket)"
            ),
            Some(t) if t.mode == TlsMode::On => eprintln!(
                "uraid: WARNING: {nbd_address} with --tls on also serves plaintext clients: \
                 anyone who reaches this port can read and write the array (use --tls require)"
            ),
            Some(_) => {}
        }
    }
    let level = array.level();
    let uuid = array.sb.uuid_string();
    let defaults =
        crate::engine::tuning::TuningValues::defaults(array.geometry.stripe(0).data_sectors());
    let journaled = crate::array::has_journal_feature(&array.sb);
    let (tuning, accept_data_loss) = super::tuning::values_for_serve_with(
        &uuid,
        defaults,
        &config_settings,
        &args.tuning,
        journaled,
    )?;
    let engine = Engine::start(
        array,
        EngineOptions {
            read_only: args.read_only,
            force: args.force,
            tuning: Some(tuning),
            accept_data_loss,
        },
    )
    .map_err(|e| e.to_string())?;
    engine.set_injectors(injectors);
    engine.set_member_wrapping(wrapping);
    if args.auto_re_add {
        engine.set_auto_readd(true);
    }
    engine.set_speed_limits(speed_min, speed_max);
    if !args.read_only {
        super::tuning::warn_unjournaled_write_back(&engine.tuning(), journaled);
    }
    let size = engine.size_bytes();
    let options = ServeOptions {
        export_name: label.clone(),
        description: format!("uraid {level} array {uuid}"),
        tls,
        ..ServeOptions::default()
    };
    let serving = start_exports(
        &engine,
        listener.as_ref(),
        options,
        ublk,
        &control_path,
        &nbd_address,
    )?;
    let (uri, exports) = (serving.exports.nbd_uri.clone(), serving.exports.clone());
    let smart = start_smart(&engine, args.smart_interval);
    // Registered once both sockets answer, so that whoever lists it can
    // reach it; a registry that cannot be written costs only the listing.
    let entry = registry::Entry {
        uuid: uuid.clone(),
        name: set_name,
        label: label.clone(),
        level: level.to_string(),
        pid: std::process::id(),
        control: absolute(&control_path),
        nbd_uri: uri.clone(),
        ublk: exports.ublk.clone(),
        // The engine's own list, kept current by the registration.
        members: Vec::new(),
        started_secs: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let registration = Registration::register_served(entry, engine.clone())
        .map_err(|e| eprintln!("uraid: not registered for status and monitor --scan: {e}"))
        .ok();
    let on: Vec<&str> = [
        Some(uri.as_str()).filter(|u| !u.is_empty()),
        exports.ublk.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    eprintln!(
        "uraid: serving {level} array {uuid} ({size} bytes) on {} (control {})",
        on.join(" and "),
        control_path.display()
    );
    let signal = wait_for_stop_signal(&signals);
    if engine.runnable() {
        eprintln!("uraid: signal {signal}: finishing in-flight I/O and writing the superblocks");
    } else {
        eprintln!("uraid: signal {signal}: finishing in-flight I/O; the array has failed and is not marked clean");
    }
    if let Some(smart) = smart {
        smart.stop();
    }
    drop(registration);
    serving.stop();
    let stopped = engine.shutdown().map_err(|e| e.to_string());
    // A member lost in the last flush may fail the array during the stop.
    if let Some(note) = engine.failed_stop_note() {
        eprintln!("uraid: stopped: {note}");
        return stopped.map(|_| ());
    }
    match stopped? {
        crate::engine::Stopped::Clean => eprintln!("uraid: stopped cleanly"),
        other => eprintln!("uraid: stopped: {other}"),
    }
    Ok(())
}

/// What serves the array: its NBD server, its ublk device, the control
/// socket, and where they are.
struct Serving {
    server: Option<nbd::ServerHandle>,
    device: Option<crate::export::ublk::UblkDevice>,
    control: ControlServer,
    exports: crate::control::Exports,
}

impl Serving {
    /// The block device first: the kernel hands over what it still holds
    /// (the page cache's last writes, a flush) before the device goes.
    fn stop(self) {
        if let Some(device) = &self.device {
            if let Err(e) = device.stop() {
                eprintln!("uraid: {}: {e}", device.path());
            }
        }
        drop(self.device);
        if let Some(server) = self.server {
            server.shutdown();
        }
        self.control.stop();
    }
}

/// Starts the NBD server (when there is a listener), the ublk device
/// (when asked for) and the control socket; if one fails, what started
/// stops and the engine shuts down.
fn start_exports(
    engine: &Arc<Engine>,
    listener: Option<&Listener>,
    options: ServeOptions,
    ublk: Option<crate::export::ublk::UblkOptions>,
    control_path: &Path,
    nbd_address: &str,
) -> Result<Serving, String> {
    let backend = || engine.clone() as Arc<dyn BlockBackend>;
    let failed = |server: Option<nbd::ServerHandle>, e: String| {
        if let Some(server) = server {
            server.shutdown();
        }
        let _ = engine.shutdown();
        e
    };
    let server = listener
        .map(|l| nbd::serve(l, backend(), options))
        .transpose()
        .map_err(|e| failed(None, format!("{nbd_address}: {e}")))?;
    let device = match ublk
        .map(|o| crate::export::ublk::serve(backend(), o))
        .transpose()
    {
        Ok(device) => device,
        Err(e) => return Err(failed(server, e)),
    };
    let exports = crate::control::Exports {
        nbd_uri: server.as_ref().map(|s| s.uri()).unwrap_or_default(),
        ublk: device.as_ref().map(|d| d.path()),
    };
    match ControlServer::start(control_path, engine.clone(), exports.clone()) {
        Ok(control) => Ok(Serving {
            server,
            device,
            control,
            exports,
        }),
        Err(e) => {
            drop(device);
            Err(failed(server, e.to_string()))
        }
    }
}

/// SMART polling, in its own thread: a smartctl that hangs never holds up
/// serving.
fn start_smart(engine: &Arc<Engine>, interval_secs: u64) -> Option<crate::smart::SmartPoller> {
    if interval_secs == 0 {
        return None;
    }
    crate::smart::SmartPoller::start(
        engine.clone(),
        std::time::Duration::from_secs(interval_secs),
    )
    .map_err(|e| eprintln!("uraid: SMART polling not started: {e}"))
    .ok()
}

/// Fails if `address` is a unix socket on which a server answers, or a TCP
/// port that cannot be bound.
fn refuse_live_socket(address: &str) -> Result<(), String> {
    if let Some(path) = address.strip_prefix("unix:") {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("{path}: another server is listening there"));
        }
    } else if let Some(host_port) = address.strip_prefix("tcp:") {
        let host_port = host_port.replace(['[', ']'], "");
        if let Some((host, port)) = host_port.rsplit_once(':') {
            if port != "0" {
                std::net::TcpListener::bind((
                    host,
                    port.parse::<u16>().map_err(|e| format!("{address}: {e}"))?,
                ))
                .map_err(|e| format!("{address}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// The NBD address and control socket path, with defaults in the socket folder.
fn addresses(args: &ServeArgs, label: &str) -> Result<(Option<String>, PathBuf), String> {
    let dir = registry::runtime_dir();
    // --ublk alone exports no socket.
    let nbd_default = args.nbd.is_none() && !args.ublk;
    if nbd_default || args.control.is_none() {
        registry::ensure_private_dir(&dir)?;
    }
    let nbd = match &args.nbd {
        Some(address) => Some(address.clone()),
        None if nbd_default => Some(format!(
            "unix:{}",
            dir.join(format!("{label}.nbd")).display()
        )),
        None => None,
    };
    let control = args
        .control
        .clone()
        .unwrap_or_else(|| dir.join(format!("{label}.ctl")));
    Ok((nbd, control))
}

/// `path` from the root, for clients that run elsewhere: the folder made
/// canonical (the file itself may be a socket or a device link).
fn absolute(path: &Path) -> PathBuf {
    let joined = std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .unwrap_or_else(|_| path.to_path_buf());
    match (joined.parent(), joined.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or(joined.clone()),
        _ => joined,
    }
}
