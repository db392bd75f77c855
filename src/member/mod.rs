//! Members: the storage an array is built on.
//!
//! A member is one trait, [`Member`], so that the layers above never care
//! whether they talk to a block device, an image file, an NBD export, memory
//! in a test, or a wrapper that injects faults. Its core is size, read,
//! write, flush and discard; the rest have defaults that a backend overrides
//! when it can do better (FUA writes, reads and writes started without the
//! caller for a batch, reconnect and reopen, the member timeout kept by the
//! member itself, counters). Offsets and lengths are
//! in bytes and must be multiples of the member's logical block size; every
//! backend checks that, because a misaligned request that happens to work on a
//! file would fail on a 4Kn disk.

pub mod aligned;
pub mod batch;
mod deadline;
mod fault;
mod file;
pub mod integrity;
pub mod mapped;
mod memory;
mod model;
pub mod nbd;
pub mod probe;
pub mod stats;
mod throttle;
mod uring;
mod wrap;

pub use aligned::AlignedBuf;
pub use batch::{Backend, IoOp};
pub use deadline::DeadlineMember;
pub use fault::{
    injected_errno, BadRange, CorruptMode, CorruptRange, Crash, CrashReport, EioRate, Fault,
    FaultCounters, FaultPlan, FaultyMember, Hang, Heal, InjectedError, Latency, Offline,
    OfflineUntil, Ops, Torn, WriteCache,
};
pub use file::{CacheMode, FileMember, OpenOptions, RingAlways};
pub use integrity::{
    checksum_mismatch, ChecksumMismatch, IntegrityHeader, IntegrityLayout, IntegrityMember,
    INTEGRITY_BLOCK_BYTES,
};
pub use memory::MemoryMember;
pub use model::{model_names, DeviceModel, ModelName, MODELS};
pub use nbd::NbdMember;
pub use stats::{IoCounts, IoStats, OpCounts};
pub use throttle::{Pacer, ThrottleLimits, ThrottleStats, ThrottledMember};
pub use wrap::{Wrapped, Wrapping};

use std::io;
use std::os::unix::io::RawFd;
use std::path::Path;
use std::sync::Arc;

/// An I/O under way (`Member::start_read`, `Member::start_write`): call it
/// to wait for its end (a read's buffer is filled by then). Dropped
/// uncalled, it lets go of the buffer before the drop returns.
pub type Started<'a> = Box<dyn FnOnce() -> io::Result<()> + Send + 'a>;

pub trait Member: Send + Sync {
    /// A name for messages: the path, or a test label.
    fn name(&self) -> &str;
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// The smallest unit of I/O the member accepts (512 or 4096).
    fn logical_block_bytes(&self) -> u32;
    /// Reads exactly `buf.len()` bytes at `offset_bytes`.
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset_bytes`.
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Tells the member a range is unused (a hint; contents become unspecified).
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;

    /// Writes all of `buf` at `offset_bytes` and returns once those bytes
    /// are durable (a write with FUA). By default a write and a flush;
    /// members that can make one write durable by itself (NBD's FUA flag)
    /// do that instead of flushing everything.
    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_at(buf, offset_bytes)?;
        self.flush()
    }

    /// Starts a read into `buf` at `offset_bytes` that goes on without
    /// the caller, for members whose I/O waits on something other than the
    /// calling thread (a network member's connections, a member behind
    /// its deadline's workers): a batch starts all of them before waiting
    /// for any, instead of one round trip after another. `None`: the
    /// member does its I/O in the caller (`read_at`); `starts_io` says
    /// which before any buffer is lent.
    fn start_read<'a>(&'a self, _buf: &'a mut [u8], _offset_bytes: u64) -> Option<Started<'a>> {
        None
    }

    /// `start_read` for a write of `buf`; with `fua`, done only once the
    /// bytes are durable, as `write_at_fua`.
    fn start_write<'a>(
        &'a self,
        _buf: &'a [u8],
        _offset_bytes: u64,
        _fua: bool,
    ) -> Option<Started<'a>> {
        None
    }

    /// Whether `start_read` and `start_write` start I/O (return `Some`).
    fn starts_io(&self) -> bool {
        false
    }

    /// Takes on the member timeout itself (`serve --member-timeout`):
    /// every I/O answers within `timeout` or fails with
    /// `ErrorKind::TimedOut`, and then every later one fails at once until
    /// the member is reconnected or reopened. A member that can do this
    /// without a thread between the caller and its I/O (an NBD member's
    /// requests wait for their replies with a deadline) returns true and
    /// is not wrapped in `DeadlineMember`; by default false. Wrappers say
    /// false: their own behaviour (an injected hang) needs the watchdog.
    fn keep_deadline(&self, _timeout: std::time::Duration) -> bool {
        false
    }

    /// The descriptor through which `batch` may do this member's reads and
    /// writes itself (io_uring), bypassing `read_at`/`write_at`. Only a member
    /// whose I/O is nothing but positional reads and writes on one descriptor
    /// may return one; wrappers that add behaviour (faults, throttling) must
    /// not, or batched I/O would go around them.
    fn raw_io(&self) -> Option<RawIo> {
        None
    }

    /// The descriptor whose page cache holds this member's bytes, from
    /// which a read may be spliced to a socket, and into which a staged
    /// write may be spliced from a pipe, without copying them (buffered
    /// files only: O_DIRECT bytes are not in the page cache). The same
    /// rule as `raw_io`: only a member whose reads and writes are nothing
    /// but positional reads and writes of that descriptor may return one.
    fn splice_fd(&self) -> Option<RawFd> {
        None
    }

    /// Whether the member's bytes are in memory, so that no read of it
    /// waits for a device (a file on tmpfs, a memory member). A server may
    /// then serve a small read on the thread that reads its requests.
    /// Wrappers that add behaviour (faults, throttling) must say no: an
    /// injected latency is a wait.
    fn in_memory(&self) -> bool {
        false
    }

    /// The member's bytes mapped into the process, where staged writes
    /// land in place and the member's own reads and writes are copies
    /// (`mapped::Mapped`): writable files on tmpfs or ramfs.
    /// Wrappers must say no, as for `raw_io`.
    fn mapped(&self) -> Option<&mapped::Mapped> {
        None
    }

    /// The member's I/O counters (`stats`), kept by the member that does
    /// the I/O; wrappers hand out their inner member's.
    fn io_stats(&self) -> Option<&stats::IoStats> {
        None
    }

    /// Opens the member's connection anew after it broke (an NBD member
    /// whose server came back); the same export, or an error. Local
    /// members have nothing to reconnect. Wrappers pass it on.
    fn reconnect(&self) -> io::Result<()> {
        Ok(())
    }

    /// The same device opened again, for a member that failed and may have
    /// come back (a reconnected network member, a disk whose path answers
    /// again): the engine probes what this returns and re-adds it if its
    /// superblock says it belongs. `Unsupported` when the backend cannot.
    fn reopen(&self) -> io::Result<MemberRef> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: this kind of member cannot be opened again",
                self.name()
            ),
        ))
    }

    /// Reads the member's size again, for a disk or file grown while the
    /// array serves (`manage --grow --size max` asks, as md re-reads a
    /// device's size), and returns it; `size_bytes` says the same from
    /// then on. By default the size known at open: a member whose size
    /// cannot change under it. Wrappers pass it on.
    fn refresh_size(&self) -> io::Result<u64> {
        Ok(self.size_bytes())
    }

    /// The integrity layer this member is (`integrity::IntegrityMember`),
    /// for the jobs that derive checksums from rows they have verified and
    /// the reports that count checksum errors. The layer is the outermost
    /// wrapper of a member, so no wrapper passes this on.
    fn integrity(&self) -> Option<&integrity::IntegrityMember> {
        None
    }

    /// Sectors of 512 bytes, the unit md counts in.
    fn size_sectors(&self) -> u64 {
        self.size_bytes() / crate::units::SECTOR_BYTES
    }
}

pub type MemberRef = Arc<dyn Member>;

/// Opens a member named on a command line: an NBD URI (`nbd://…`,
/// `nbds://…`, `nbd+unix://…`) or a path to a device or image file. The
/// one place that tells the two apart.
pub fn open(spec: &Path, options: OpenOptions) -> io::Result<MemberRef> {
    match spec.to_str().filter(|s| nbd::is_nbd_uri(s)) {
        Some(uri) => Ok(Arc::new(NbdMember::open(uri, options.write)?)),
        None => Ok(Arc::new(FileMember::open(spec, options)?)),
    }
}

/// What makes two member names the same member: the file or device
/// under any of its names, or the same export of the same server (a host
/// name and one of its addresses, a socket under two paths).
#[derive(Clone, Debug)]
pub enum Identity {
    File {
        dev: u64,
        ino: u64,
    },
    Device(u64),
    Nbd {
        /// Where the server is reached: resolved `address:port`s, or a
        /// socket's canonical path.
        endpoints: Vec<String>,
        export: String,
    },
}

impl PartialEq for Identity {
    fn eq(&self, other: &Identity) -> bool {
        match (self, other) {
            (Identity::File { dev, ino }, Identity::File { dev: d, ino: i }) => {
                dev == d && ino == i
            }
            (Identity::Device(a), Identity::Device(b)) => a == b,
            (
                Identity::Nbd { endpoints, export },
                Identity::Nbd {
                    endpoints: e,
                    export: x,
                },
            ) => export == x && endpoints.iter().any(|p| e.contains(p)),
            _ => false,
        }
    }
}

pub fn identity(spec: &Path) -> io::Result<Identity> {
    use std::os::unix::fs::MetadataExt;
    if let Some(text) = spec.to_str().filter(|s| nbd::is_nbd_uri(s)) {
        let uri: nbd::NbdUri = text.parse().map_err(|e: nbd::uri::UriError| {
            io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
        })?;
        return Ok(Identity::Nbd {
            endpoints: uri.endpoints(),
            export: uri.export,
        });
    }
    let meta = std::fs::metadata(spec)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", spec.display())))?;
    Ok(if meta.file_type().is_file() {
        Identity::File {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    } else {
        Identity::Device(meta.rdev())
    })
}

/// Whether a member name is an NBD URI rather than a path.
pub fn is_uri(spec: &Path) -> bool {
    spec.to_str().is_some_and(nbd::is_nbd_uri)
}

/// The one name a member goes by in events, alerts, status, the registry
/// and scan lines (`manage` sends the server the same): an NBD URI as
/// written, since it says where the export is from anywhere; a path made
/// absolute without resolving links, so that a DEVICE glob's or a by-id
/// link's name stays the one the user chose. `..` is taken out where the
/// shorter path is still the same file (it is not past a link).
pub fn canonical_name(spec: &Path) -> String {
    if is_uri(spec) {
        return spec.display().to_string();
    }
    let Ok(absolute) = std::path::absolute(spec) else {
        return spec.display().to_string();
    };
    let mut short = std::path::PathBuf::new();
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                short.pop();
            }
            std::path::Component::CurDir => {}
            other => short.push(other),
        }
    }
    let same_file = matches!(
        (identity(&short), identity(&absolute)),
        (Ok(a), Ok(b)) if a == b
    );
    let name = if same_file { short } else { absolute };
    name.display().to_string()
}

/// A member's name where one word must do (/proc/mdstat's member list):
/// a path's file name, and for an NBD export where it is served, since the
/// export's name alone (`disk4`) would not say which host to look at:
/// `host:port/export` on TCP, `unix:SOCKET/export` with the socket's file
/// name on a unix socket. The query (TLS files, options) is left out.
pub fn short_name(name: &str) -> String {
    if !nbd::is_nbd_uri(name) {
        return Path::new(name)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| name.to_string());
    }
    let Ok(uri) = name.parse::<nbd::NbdUri>() else {
        return name.to_string();
    };
    // The export as written, still percent-encoded: no spaces in one word.
    let after_scheme = name.split_once("://").map_or("", |(_, rest)| rest);
    let before_query = after_scheme.split('?').next().unwrap_or("");
    let export = before_query.find('/').map_or("/", |at| &before_query[at..]);
    match &uri.address {
        nbd::uri::Address::Tcp { host, port } if host.contains(':') => {
            format!("[{host}]:{port}{export}")
        }
        nbd::uri::Address::Tcp { host, port } => format!("{host}:{port}{export}"),
        nbd::uri::Address::Unix(socket) => {
            let socket = socket.file_name().map_or_else(
                || socket.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            format!("unix:{socket}{export}")
        }
    }
}

/// What `batch` needs to do a member's I/O on its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawIo {
    /// Open for as long as the member lives.
    pub fd: RawFd,
    /// The alignment the I/O's memory must have (a power of two, at most
    /// `aligned::ALIGN_BYTES`); 1 when any address will do.
    pub memory_align_bytes: usize,
}

/// Checks that an I/O is aligned to the member's logical block and inside it.
pub(crate) fn check_io(member: &dyn Member, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let block = member.logical_block_bytes() as u64;
    if !offset_bytes.is_multiple_of(block) || !len_bytes.is_multiple_of(block) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: I/O at {offset_bytes}+{len_bytes} is not aligned to {block}-byte blocks",
                member.name()
            ),
        ));
    }
    if offset_bytes
        .checked_add(len_bytes)
        .is_none_or(|end| end > member.size_bytes())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: I/O at {offset_bytes}+{len_bytes} beyond the end ({} bytes)",
                member.name(),
                member.size_bytes()
            ),
        ));
    }
    Ok(())
}

/// An I/O error that names the member, the operation and where it was, so
/// that a log line alone says which disk failed where.
pub(crate) fn io_error(
    member_name: &str,
    what: &str,
    offset_bytes: u64,
    len_bytes: usize,
    source: io::Error,
) -> io::Error {
    io::Error::new(
        source.kind(),
        format!("{member_name}: {what} at {offset_bytes}+{len_bytes}: {source}"),
    )
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn short_names_say_where_an_export_is_served() {
        for (name, short) in [
            ("/dev/sdb1", "sdb1"),
            ("disk.img", "disk.img"),
            ("nbd://10.0.0.2:10810/disk4", "10.0.0.2:10810/disk4"),
            ("nbd://host4/disk4", "host4:10809/disk4"),
            ("nbd://host4", "host4:10809/"),
            ("nbd://[fd00::4]:10809/d", "[fd00::4]:10809/d"),
            ("nbds://u@host4/d?tls-psk-file=/etc/k.psk", "host4:10809/d"),
            ("nbd://host4/a%20b", "host4:10809/a%20b"),
            (
                "nbd+unix:///d?socket=/run/peers/kit0.sock",
                "unix:kit0.sock/d",
            ),
            ("nbd+unix:///?socket=kit0.sock", "unix:kit0.sock/"),
        ] {
            assert_eq!(short_name(name), short, "{name}");
        }
    }
}
