//! The array as a local block device, /dev/ublkbN, through the kernel's
//! ublk driver (Linux 6.0+): the driver hands each block request to this
//! process over io_uring commands, and the same [`BlockBackend`] the NBD
//! server calls serves it. No NBD socket and no nbd-client in between.
//!
//! Built on the io-uring crate the project already uses, without a ublk
//! library: libublk (the maintained Rust binding) generates its kernel
//! bindings with bindgen at build time (libclang on every build machine)
//! and brings an async runtime uraid's threads do not use; the interface
//! uraid needs is a few structures and five commands (`sys`).
//!
//! `ctrl`: /dev/ublk-control (add, parameters, start, stop, delete).
//! `queue`: a queue's thread, its ring and its workers.

mod ctrl;
mod queue;
mod sys;

use crate::export::BlockBackend;
use std::fs::File;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Queues and depth as `serve --ublk-queues/--ublk-depth` give them.
#[derive(Clone, Copy, Debug)]
pub struct UblkOptions {
    pub queues: u16,
    pub depth: u16,
}

impl Default for UblkOptions {
    fn default() -> Self {
        UblkOptions {
            queues: 1,
            depth: DEPTH_DEFAULT,
        }
    }
}

/// The default queue depth: as the NBD path's per-connection limit and
/// ublk's usual 64-128, enough to keep every member busy.
pub const DEPTH_DEFAULT: u16 = 128;
/// The most queues uraid asks for (the driver takes up to 4096; more
/// queues than CPUs only add threads).
pub const QUEUES_MAX: u16 = 64;
/// Workers per queue: the backend's calls block, so a queue serves this
/// many requests at once.
const WORKERS_PER_QUEUE_MAX: usize = 16;
/// The largest request buffer per tag; the device's max_sectors follows.
const BUF_BYTES_MAX: usize = 1 << 20;

const _: () = assert!(QUEUES_MAX <= sys::MAX_QUEUES);

impl UblkOptions {
    /// Refuses values the driver would refuse, before anything is made.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=QUEUES_MAX).contains(&self.queues) {
            return Err(format!(
                "--ublk-queues {}: between 1 and {QUEUES_MAX}",
                self.queues
            ));
        }
        if !(1..=sys::MAX_QUEUE_DEPTH).contains(&self.depth) {
            return Err(format!(
                "--ublk-depth {}: between 1 and {} (the ublk driver's limit)",
                self.depth,
                sys::MAX_QUEUE_DEPTH
            ));
        }
        Ok(())
    }
}

/// A started ublk device; [`UblkDevice::stop`] (or drop) removes it.
pub struct UblkDevice {
    control: ctrl::Control,
    dev_id: u32,
    queues: Mutex<Vec<JoinHandle<std::io::Result<()>>>>,
    /// Added and not yet deleted.
    live: std::sync::atomic::AtomicBool,
}

impl UblkDevice {
    /// The device's number N, of /dev/ublkbN.
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// /dev/ublkbN.
    pub fn path(&self) -> String {
        format!("/dev/ublkb{}", self.dev_id)
    }

    /// Removes the device: the driver first lets the queues serve the
    /// requests it holds (the page cache's last writes and a flush among
    /// them), then ends their fetches; once the queue threads have closed
    /// the char device it is deleted. Idempotent.
    pub fn stop(&self) -> Result<(), String> {
        if !self.live.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let stopped = self.control.stop(self.dev_id);
        let mut failure = stopped.err().map(|e| format!("ublk STOP_DEV: {e}"));
        for queue in queues {
            match queue.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failure = failure.or(Some(e.to_string())),
                Err(_) => failure = failure.or(Some("a ublk queue thread panicked".into())),
            }
        }
        // Without waiting for whoever still holds /dev/ublkbN open (a
        // file system left mounted would hold the stop for ever); a kernel
        // before 6.7 has only the waiting DEL_DEV.
        let deleted = match self.control.delete_async(self.dev_id) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                self.control.delete(self.dev_id)
            }
            other => other,
        };
        if let Err(e) = deleted {
            failure = failure.or(Some(format!("ublk DEL_DEV: {e}")));
        }
        failure.map_or(Ok(()), Err)
    }
}

impl Drop for UblkDevice {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Whether this kernel and user can make ublk devices: the control device
/// opens (one line saying why not otherwise).
pub fn probe() -> Result<(), String> {
    ctrl::Control::open().map(|_| ())
}

/// Creates /dev/ublkbN for `backend` and serves it until stopped. Fails in
/// one line, with nothing left behind, when the kernel has no ublk driver,
/// the control device is not open to this user, or the device cannot
/// start.
pub fn serve(backend: Arc<dyn BlockBackend>, options: UblkOptions) -> Result<UblkDevice, String> {
    options.check()?;
    let control = ctrl::Control::open()?;
    delete_dead(&control);
    let buf_bytes = buffer_bytes(&*backend);
    let info = sys::DevInfo {
        nr_hw_queues: options.queues,
        queue_depth: options.depth,
        max_io_buf_bytes: buf_bytes as u32,
        dev_id: u32::MAX,
        flags: sys::F_CMD_IOCTL_ENCODE,
        ublksrv_flags: sys::URAID_MARK,
        ..sys::DevInfo::default()
    };
    let info = control
        .add(info)
        .map_err(|e| format!("ublk ADD_DEV: {e}"))?;
    let dev_id = info.dev_id;
    // From here on a failure deletes the device again.
    let device = UblkDevice {
        control,
        dev_id,
        queues: Mutex::new(Vec::new()),
        live: std::sync::atomic::AtomicBool::new(true),
    };
    let delete = |device: UblkDevice, e: String| -> String {
        let _ = device.stop();
        e
    };
    let params = params_of(&*backend, buf_bytes);
    if let Err(e) = device.control.set_params(dev_id, &params) {
        return Err(delete(device, format!("ublk SET_PARAMS: {e}")));
    }
    let char_dev = match open_char_dev(dev_id) {
        Ok(file) => Arc::new(file),
        Err(e) => return Err(delete(device, e)),
    };
    let (fetched_tx, fetched_rx) = mpsc::channel::<()>();
    for q_id in 0..options.queues {
        let setup = queue::QueueSetup {
            dev_id,
            q_id,
            depth: options.depth,
            buf_bytes,
            workers: usize::from(options.depth).min(WORKERS_PER_QUEUE_MAX),
            backend: backend.clone(),
        };
        let char_dev = char_dev.clone();
        let fetched = fetched_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("uraid-ublk{dev_id}q{q_id}"))
            .spawn(move || {
                let ran = queue::run(setup, &char_dev, move || {
                    let _ = fetched.send(());
                });
                // Said at once: the queue's requests fail from here on
                // (the driver cancels what its ring held).
                if let Err(e) = &ran {
                    eprintln!("uraid: /dev/ublkb{dev_id}: queue {q_id} ended: {e}");
                }
                ran
            });
        match spawned {
            Ok(handle) => device.queues.lock().unwrap().push(handle),
            Err(e) => return Err(delete(device, format!("ublk queue thread: {e}"))),
        }
    }
    drop(fetched_tx);
    // START_DEV waits for every tag's fetch: the queues must have sent
    // theirs, or it would wait for ever.
    for _ in 0..options.queues {
        if fetched_rx.recv().is_err() {
            return Err(delete(
                device,
                "a ublk queue ended before it started".into(),
            ));
        }
    }
    drop(char_dev);
    if let Err(e) = device.control.start(dev_id) {
        return Err(delete(device, format!("ublk START_DEV: {e}")));
    }
    Ok(device)
}

/// Deletes the devices an earlier uraid made whose server is gone (killed:
/// the driver removed the block device but keeps /dev/ublkcN until it is
/// deleted), so that they do not pile up. Devices of other servers, and
/// of uraid servers alive, are left alone.
fn delete_dead(control: &ctrl::Control) {
    let Ok(entries) = std::fs::read_dir("/dev") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ublkc"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(info) = control.info(id) else { continue };
        // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
        let alive = info.ublksrv_pid > 0
            && (unsafe { libc::kill(info.ublksrv_pid, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
        if info.ublksrv_flags == sys::URAID_MARK && !alive {
            match control.delete(id) {
                Ok(()) => eprintln!(
                    "uraid: deleted /dev/ublkc{id}, left by a uraid serve (pid {}) that is gone",
                    info.ublksrv_pid
                ),
                Err(e) => eprintln!(
                    "uraid: /dev/ublkc{id}, left by a uraid serve that is gone, not deleted: {e}"
                ),
            }
        }
    }
}

/// The request buffer per tag: the largest I/O the backend takes, a whole
/// number of pages, at most BUF_BYTES_MAX.
fn buffer_bytes(backend: &dyn BlockBackend) -> usize {
    let max = backend
        .max_io_bytes()
        .map_or(BUF_BYTES_MAX, |b| b as usize)
        .min(backend.block_sizes().max_payload as usize)
        .clamp(4096, BUF_BYTES_MAX);
    max / 4096 * 4096
}

/// The queue limits of the device: block sizes, the array's I/O sizes,
/// the largest request, and the cache's flush and FUA.
fn params_of(backend: &dyn BlockBackend, buf_bytes: usize) -> sys::Params {
    let sizes = backend.block_sizes();
    let shift = |bytes: u64| bytes.trailing_zeros() as u8;
    assert!(sizes.min.is_power_of_two() && sizes.min >= 512);
    let logical = shift(u64::from(sizes.min));
    let io_min = shift(u64::from(sizes.preferred.max(sizes.min)));
    // ublk takes sizes as powers of two: a stripe that is not one (three
    // data members) is given as its chunk, which divides it.
    let io_opt = backend
        .optimal_io_bytes()
        .filter(|b| b.is_power_of_two())
        .map_or(io_min, shift);
    let mut attrs = sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA;
    if backend.read_only() {
        attrs |= sys::ATTR_READ_ONLY;
    }
    if backend.rotational() {
        attrs |= sys::ATTR_ROTATIONAL;
    }
    let sectors = (buf_bytes / 512) as u32;
    let zero_sectors = (1u32 << 30) >> 9;
    sys::Params {
        len: sys::PARAMS_LEN,
        types: sys::PARAM_TYPE_BASIC | sys::PARAM_TYPE_DISCARD,
        basic: sys::ParamBasic {
            attrs,
            logical_bs_shift: logical,
            physical_bs_shift: logical.max(12),
            io_opt_shift: io_opt,
            io_min_shift: io_min,
            max_sectors: sectors,
            chunk_sectors: 0,
            dev_sectors: backend.size_bytes() >> 9,
            virt_boundary_mask: 0,
        },
        discard: sys::ParamDiscard {
            discard_alignment: 0,
            discard_granularity: sizes.min.max(4096),
            max_discard_sectors: zero_sectors,
            max_write_zeroes_sectors: zero_sectors,
            max_discard_segments: 1,
            reserved0: 0,
        },
    }
}

/// Opens /dev/ublkcN, which devtmpfs or udev makes a moment after ADD_DEV.
fn open_char_dev(dev_id: u32) -> Result<File, String> {
    let path = format!("/dev/ublkc{dev_id}");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(format!(
                    "{path}: {e} (the device node appears through devtmpfs or udev)"
                ))
            }
        }
    }
}
