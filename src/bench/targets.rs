//! What the benchmark measures: how each target is reached (NBD socket or
//! plain files), prepared (prefilled, flushed, caches dropped) and how its
//! CPU time is read.
//!
//! - `uraid`: the array, served in process by the same code `uraid serve`
//!   runs, reached over a unix socket by our NBD client;
//! - `raw`: the member files themselves, the same job spread over them in
//!   1 MiB stripes (a raid0 without metadata), O_DIRECT when the file system
//!   takes it;
//! - `nbdkit`: `nbdkit memory`, the transport ceiling: the same client and
//!   socket with nothing behind them but memory;
//! - `ublk`: the array served in process as /dev/ublkbN, reached by fio's
//!   io_uring engine through the kernel's block layer (hosts with ublk).

use super::buffers::{fill_pattern, noise, AlignedBuf};
use crate::export::nbd::client::NbdSync;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The stripe unit of the raw target: units are dealt round-robin over the
/// files, so that a sequential job keeps every file busy as an array would.
/// A request that crosses a unit is split.
pub const RAW_CHUNK_BYTES: u64 = 1 << 20;

/// How long nbdkit may take to open its socket.
const NBDKIT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// How a target is reached.
pub enum Access {
    Nbd {
        socket: PathBuf,
        export: String,
        size_bytes: u64,
    },
    Files(Arc<RawStripes>),
}

impl Access {
    pub fn size_bytes(&self) -> u64 {
        match self {
            Access::Nbd { size_bytes, .. } => *size_bytes,
            Access::Files(files) => files.size_bytes(),
        }
    }

    /// Makes completed writes durable (NBD FLUSH, fdatasync).
    pub fn flush(&self) -> Result<(), String> {
        match self {
            Access::Nbd { socket, export, .. } => {
                let mut conn = NbdSync::connect(socket, export).map_err(|e| e.to_string())?;
                conn.flush().map_err(|e| format!("NBD flush: {e}"))?;
                conn.disconnect().map_err(|e| e.to_string())
            }
            Access::Files(files) => files.sync(),
        }
    }

    /// Writes the whole target once, sequentially, so that reads find data
    /// rather than holes (a hole reads back without touching storage).
    pub fn prefill(&self, verify_salt: Option<u64>, seed: u64) -> Result<(), String> {
        let size = self.size_bytes();
        let block = RAW_CHUNK_BYTES.min(size) as usize;
        let mut buf = noise(block, seed);
        let mut conn = match self {
            Access::Nbd { socket, export, .. } => {
                Some(NbdSync::connect(socket, export).map_err(|e| e.to_string())?)
            }
            Access::Files(_) => None,
        };
        let mut offset = 0;
        while offset < size {
            let len = (size - offset).min(block as u64) as usize;
            let data = &mut buf[..len];
            if let Some(salt) = verify_salt {
                fill_pattern(data, offset, salt);
            }
            match (self, conn.as_mut()) {
                (_, Some(conn)) => conn.write_at(offset, data),
                (Access::Files(files), None) => files.write_at(offset, data),
                (Access::Nbd { .. }, None) => unreachable!("connected above"),
            }
            .map_err(|e| format!("prefill at {offset}: {e}"))?;
            offset += len as u64;
        }
        if let Some(conn) = conn {
            conn.disconnect().map_err(|e| e.to_string())?;
        }
        self.flush()
    }
}

/// The member files as one device: 1 MiB units dealt round-robin.
pub struct RawStripes {
    files: Vec<File>,
    /// The one block device these are (the array's ublk device), which fio
    /// opens itself; None for member files.
    pub device: Option<PathBuf>,
    /// Bytes used on each file, a multiple of the unit.
    file_bytes: u64,
    /// Whether the files were opened with O_DIRECT.
    pub direct: bool,
}

impl RawStripes {
    /// Opens the files for reading and writing, with O_DIRECT if every one
    /// of them takes it. `file_bytes` caps the bytes used on each.
    pub fn open(paths: &[PathBuf], file_bytes: u64) -> Result<RawStripes, String> {
        assert!(!paths.is_empty());
        let file_bytes = file_bytes / RAW_CHUNK_BYTES * RAW_CHUNK_BYTES;
        if file_bytes == 0 {
            return Err(format!(
                "members of less than {RAW_CHUNK_BYTES} bytes are too small to measure"
            ));
        }
        let direct = paths.iter().all(|p| direct_io_works(p));
        let files = paths
            .iter()
            .map(|p| {
                let mut options = OpenOptions::new();
                options.read(true).write(true);
                if direct {
                    options.custom_flags(libc::O_DIRECT);
                }
                options.open(p).map_err(|e| format!("{}: {e}", p.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(RawStripes {
            files,
            device: None,
            file_bytes,
            direct,
        })
    }

    /// A block device of `bytes` (the array's /dev/ublkbN) as a target.
    pub fn open_device(path: &Path, bytes: u64) -> Result<RawStripes, String> {
        let mut one = RawStripes::open(&[path.to_path_buf()], bytes)?;
        one.device = Some(path.to_path_buf());
        Ok(one)
    }

    pub fn size_bytes(&self) -> u64 {
        self.file_bytes * self.files.len() as u64
    }

    /// Each piece of a request: (file, offset in it, range of the buffer).
    fn pieces(
        &self,
        offset: u64,
        len: usize,
    ) -> impl Iterator<Item = (usize, u64, std::ops::Range<usize>)> + '_ {
        assert!(
            offset + len as u64 <= self.size_bytes(),
            "request past the end"
        );
        let n = self.files.len() as u64;
        let mut done = 0usize;
        std::iter::from_fn(move || {
            if done == len {
                return None;
            }
            let at = offset + done as u64;
            let unit = at / RAW_CHUNK_BYTES;
            let within = at % RAW_CHUNK_BYTES;
            let take = ((RAW_CHUNK_BYTES - within) as usize).min(len - done);
            let piece = (
                (unit % n) as usize,
                (unit / n) * RAW_CHUNK_BYTES + within,
                done..done + take,
            );
            done += take;
            Some(piece)
        })
    }

    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        for (file, at, range) in self.pieces(offset, buf.len()) {
            self.files[file].read_exact_at(&mut buf[range], at)?;
        }
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (file, at, range) in self.pieces(offset, data.len()) {
            self.files[file].write_all_at(&data[range], at)?;
        }
        Ok(())
    }

    pub fn sync(&self) -> Result<(), String> {
        for f in &self.files {
            f.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
        }
        Ok(())
    }
}

/// Whether an aligned O_DIRECT read works on this file (tmpfs before Linux
/// 6.6 and some FUSE file systems refuse the flag).
fn direct_io_works(path: &Path) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return false;
    };
    let mut buf = AlignedBuf::zeroed(crate::member::aligned::ALIGN_BYTES);
    file.read_at(&mut buf, 0).is_ok()
}

/// Drops the kernel's cached pages of these files (after writing them
/// back): what `echo 3 > drop_caches` does for them, without root. On tmpfs
/// the pages are the storage and stay.
pub fn drop_file_caches(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        file.sync_data()
            .map_err(|e| format!("{}: fdatasync: {e}", path.display()))?;
        // SAFETY: fd is a valid open descriptor for the call's duration.
        let rc = unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(format!(
                "{}: posix_fadvise: {}",
                path.display(),
                io::Error::from_raw_os_error(rc)
            ));
        }
    }
    Ok(())
}

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// User+system CPU seconds of the calling thread.
pub fn thread_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

/// User+system CPU seconds of this whole process.
pub fn process_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// `nbdkit memory` on a unix socket, stopped when dropped.
pub struct Nbdkit {
    child: Child,
    pub socket: PathBuf,
}

impl Nbdkit {
    /// Whether nbdkit can be run here.
    pub fn installed() -> bool {
        Command::new("nbdkit")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts `nbdkit memory SIZE allocator=ALLOCATOR`. The malloc
    /// allocator is the ceiling to compare with: its locking lets requests
    /// run concurrently, where the default sparse array serialises them.
    pub fn start(socket: &Path, size_bytes: u64, allocator: &str) -> Result<Nbdkit, String> {
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(socket)
            .args(["memory", &size_bytes.to_string()])
            .arg(format!("allocator={allocator}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("nbdkit: {e}"))?;
        let mut nbdkit = Nbdkit {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + NBDKIT_START_TIMEOUT;
        // A whole handshake, not a bare connect: nbdkit logs a connection
        // dropped before its handshake as an error.
        while NbdSync::connect(socket, "")
            .and_then(NbdSync::disconnect)
            .is_err()
        {
            if let Ok(Some(status)) = nbdkit.child.try_wait() {
                return Err(format!("nbdkit exited at start: {status}"));
            }
            if Instant::now() > deadline {
                return Err("nbdkit did not open its socket within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nbdkit)
    }

    /// nbdkit's user+system CPU seconds so far, from /proc/PID/stat.
    pub fn cpu_seconds(&self) -> Result<f64, String> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .map_err(|e| format!("nbdkit stat: {e}"))?;
        // The command name (field 2) may hold spaces; fields count from after it.
        let after_name = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .ok_or("nbdkit stat: no command name")?;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // utime and stime are fields 14 and 15; field 3 is fields[0] here.
        let ticks = |i: usize| -> Result<u64, String> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| "nbdkit stat: short line".to_string())
        };
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Ok((ticks(11)? + ticks(12)?) as f64 / hz)
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_stripes_deal_units_round_robin() {
        let dir = std::env::temp_dir().join(format!("uraid-raw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("f{i}"))).collect();
        for p in &paths {
            File::create(p).unwrap().set_len(2 << 20).unwrap();
        }
        let raw = RawStripes::open(&paths, 2 << 20).unwrap();
        assert_eq!(raw.size_bytes(), 6 << 20);
        let pieces: Vec<_> = raw.pieces((1 << 20) - 4096, 8192).collect();
        assert_eq!(
            pieces,
            vec![(0, (1 << 20) - 4096, 0..4096), (1, 0, 4096..8192)]
        );
        let pieces: Vec<_> = raw.pieces(4 << 20, 4096).collect();
        assert_eq!(pieces, vec![(1, 1 << 20, 0..4096)]);
        let mut data = AlignedBuf::zeroed(8192);
        fill_pattern(&mut data, (3 << 20) - 4096, 5);
        raw.write_at((3 << 20) - 4096, &data).unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        raw.read_at((3 << 20) - 4096, &mut back).unwrap();
        assert_eq!(&data[..], &back[..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
