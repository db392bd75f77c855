//! Members backed by a block device or an image file: positional I/O on one
//! descriptor, opened with O_DIRECT where the file system allows it.
//!
//! O_DIRECT keeps member data out of the page cache: the array's own caches
//! decide what stays in memory, a write is on the device (or in its cache,
//! which `flush` empties) when it completes, and the memory of a large rebuild
//! does not push everything else out. The descriptor is handed to `batch`
//! (io_uring) through `raw_io`. A member opened for direct I/O does all of its
//! I/O that way: mixing buffered and direct I/O on one file can read stale
//! page cache, so memory that is not aligned is bounced through an aligned
//! buffer instead of switching to buffered I/O.

use super::aligned::{in_bounce_pieces, is_aligned, AlignedBuf, ALIGN_BYTES};
use super::{check_io, io_error, Member, RawIo};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// How a member is opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Open for writing, exclusively: O_EXCL on block devices (the kernel then
    /// refuses if the device is mounted or held by md/dm) and an exclusive
    /// lock on files, so that two uraid processes never write one member.
    pub write: bool,
}

/// Whether a member's data goes through the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// O_DIRECT where the file system supports it at the member's block
    /// size, buffered otherwise (noted once in the log).
    #[default]
    Direct,
    /// Always through the page cache.
    Buffered,
}

pub struct FileMember {
    name: String,
    file: File,
    /// Read at open and again by `refresh_size` (a device grown while served).
    size_bytes: AtomicU64,
    block_bytes: u32,
    is_block_device: bool,
    /// Whether the descriptor has O_DIRECT.
    direct: bool,
    /// The alignment O_DIRECT needs of memory; 1 when buffered.
    memory_align_bytes: usize,
    /// The file lives on tmpfs or ramfs (see `Member::in_memory`).
    in_memory: bool,
    /// A writable file in memory, mapped (see `Member::mapped`).
    mapped: Option<super::mapped::Mapped>,
    stats: super::stats::IoStats,
    writable: bool,
    /// After `reopen`: the earlier descriptor, kept because it holds the
    /// exclusive claim (the flock, or O_EXCL on a block device) that the
    /// new one could not take beside it.
    claim: Option<File>,
}

// From linux/fs.h: _IOR(0x12, 114, size_t), _IO(0x12, 104), _IO(0x12, 119).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileMember {
    /// Opens with direct I/O where possible (`CacheMode::Direct`).
    pub fn open(path: &Path, options: OpenOptions) -> io::Result<FileMember> {
        FileMember::open_with(path, options, CacheMode::default())
    }

    pub fn open_with(
        path: &Path,
        options: OpenOptions,
        cache: CacheMode,
    ) -> io::Result<FileMember> {
        FileMember::open_claimed(path, options, cache, None)
    }

    /// Opens `path`; with `claim` (a descriptor of the same member that
    /// holds its exclusive claim) the claim is not taken again.
    fn open_claimed(
        path: &Path,
        options: OpenOptions,
        cache: CacheMode,
        claim: Option<File>,
    ) -> io::Result<FileMember> {
        let name = path.display().to_string();
        let metadata = std::fs::metadata(path).map_err(|e| annotate(&name, e))?;
        let is_block_device = metadata.file_type().is_block_device();
        if !is_block_device && !metadata.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a block device or a regular file"),
            ));
        }
        let exclusive = if is_block_device && options.write && claim.is_none() {
            libc::O_EXCL
        } else {
            0
        };
        let mut open = std::fs::OpenOptions::new();
        open.read(true).write(options.write).custom_flags(exclusive);
        let busy = |e: io::Error| match e.raw_os_error() {
            Some(libc::EBUSY) => io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{name}: device is busy (mounted, or in use by another array or program)"),
            ),
            _ => annotate(&name, e),
        };
        let mut direct = cache == CacheMode::Direct;
        let file = if direct {
            let mut open_direct = open.clone();
            open_direct.custom_flags(exclusive | libc::O_DIRECT);
            match open_direct.open(path) {
                // A file system without direct I/O refuses the flag at open.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    note_buffered(&name, "the file system refuses O_DIRECT");
                    direct = false;
                    open.open(path).map_err(busy)?
                }
                other => other.map_err(busy)?,
            }
        } else {
            open.open(path).map_err(busy)?
        };
        if options.write && !is_block_device && claim.is_none() {
            // SAFETY: flock on a valid, owned descriptor has no memory effects.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("{name}: file is in use by another uraid process"),
                ));
            }
        }
        let size_bytes =
            current_size_bytes(&file, is_block_device).map_err(|e| annotate(&name, e))?;
        let block_bytes = if is_block_device {
            let mut block: libc::c_int = 0;
            // SAFETY: the ioctl writes one integer of the given type through the
            // pointer, which points at a live local of that type.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut block as *mut libc::c_int) }
                != 0
            {
                return Err(annotate(&name, io::Error::last_os_error()));
            }
            block as u32
        } else {
            512
        };
        let mut memory_align_bytes = 1;
        // (A device node lives on devtmpfs, hence only for regular files.)
        if direct && !is_block_device && lives_in_memory(&file) {
            // tmpfs accepts O_DIRECT (Linux 6.6) and still copies through its
            // page cache, so nothing is lost and there is nothing to note; the
            // member is then buffered, which keeps it off io_uring (see
            // `raw_io`).
            set_direct(&file, false).map_err(|e| annotate(&name, e))?;
            direct = false;
        }
        if direct {
            match direct_alignment(&file, is_block_device, block_bytes, size_bytes) {
                Ok(align) => memory_align_bytes = align,
                Err(why) => {
                    set_direct(&file, false).map_err(|e| annotate(&name, e))?;
                    note_buffered(&name, &why);
                    direct = false;
                }
            }
        }
        let in_memory = !is_block_device && on_memory_fs(&file);
        // Without a mapping, writes take the page cache's path: nothing is
        // lost if the map is refused (address space, a limit).
        let mapped = (in_memory && options.write && size_bytes > 0)
            .then(|| super::mapped::Mapped::new(&file, size_bytes).ok())
            .flatten();
        Ok(FileMember {
            name,
            file,
            size_bytes: AtomicU64::new(size_bytes),
            block_bytes,
            is_block_device,
            direct,
            memory_align_bytes,
            in_memory,
            mapped,
            stats: Default::default(),
            writable: options.write,
            claim,
        })
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Reads through bounce buffers when `buf` is not aligned as O_DIRECT
    /// needs.
    fn read_exact_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        if is_aligned(buf.as_ptr(), self.memory_align_bytes) {
            return self.file.read_exact_at(buf, offset_bytes);
        }
        in_bounce_pieces(buf.len(), offset_bytes, |staged, at, piece| {
            self.file.read_exact_at(staged, at)?;
            buf[piece].copy_from_slice(staged);
            Ok(())
        })
    }

    fn write_all_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        if is_aligned(buf.as_ptr(), self.memory_align_bytes) {
            return self.file.write_all_at(buf, offset_bytes);
        }
        in_bounce_pieces(buf.len(), offset_bytes, |staged, at, piece| {
            staged.copy_from_slice(&buf[piece]);
            self.file.write_all_at(staged, at)
        })
    }
}

/// Writes all of `buf` at `offset_bytes` with RWF_DSYNC: each write
/// returns once its bytes (and what the file needs to find them) are
/// durable, as a block device's FUA write, without syncing the rest.
fn write_all_dsync(file: &File, mut buf: &[u8], mut offset_bytes: u64) -> io::Result<()> {
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr().cast_mut().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: one iovec describing `buf`, which outlives the call; the
        // kernel only reads it.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                offset_bytes as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
        offset_bytes += n as u64;
    }
    Ok(())
}

/// Says once per process that a member fell back to buffered I/O: the
/// others probably did too, for the same reason, and one line is enough.
fn note_buffered(name: &str, why: &str) {
    static NOTED: Once = Once::new();
    NOTED.call_once(|| eprintln!("uraid: {name}: no direct I/O ({why}); using buffered I/O"));
}

/// Whether the file is on tmpfs, whose files are page cache and nothing else.
fn lives_in_memory(file: &File) -> bool {
    // From linux/magic.h.
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: fstatfs writes one struct statfs through the pointer, which
    // points at a zeroed local of that type.
    let (rc, stat) = unsafe {
        let mut stat: libc::statfs = std::mem::zeroed();
        (libc::fstatfs(file.as_raw_fd(), &mut stat), stat)
    };
    // f_type is i64 on x86-64 and narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let f_type = stat.f_type as i64;
    rc == 0 && f_type == TMPFS_MAGIC
}

/// Sets or clears O_DIRECT on an open descriptor (Linux allows it with
/// F_SETFL), so that a fallback keeps the exclusive open and its lock.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl F_GETFL/F_SETFL on an owned descriptor reads and sets
    // integer flags only.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What statx says direct I/O needs of a file: (memory, offset) alignment in
/// bytes, an offset alignment of 0 meaning "not supported". None when the
/// kernel or file system does not say (STATX_DIOALIGN came with Linux 6.1).
fn statx_dio_alignment(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx writes one struct statx through the pointer, which points
    // at a zeroed local of that type; the path is an empty C string, which
    // AT_EMPTY_PATH makes refer to the descriptor itself.
    let (rc, stx) = unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        );
        (rc, stx)
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// Decides from statx's answer whether direct I/O can serve a member with
/// `block_bytes` logical blocks: Ok(the memory alignment it needs), or why not.
/// `None` (not reported) yields Ok(None): the caller has to try.
fn direct_support(dio: Option<(u32, u32)>, block_bytes: u32) -> Result<Option<usize>, String> {
    let Some((memory_align, offset_align)) = dio else {
        return Ok(None);
    };
    if offset_align == 0 {
        return Err("the file system does not support it on this file".to_string());
    }
    if offset_align > block_bytes {
        return Err(format!(
            "it needs {offset_align}-byte aligned I/O and the member has {block_bytes}-byte blocks"
        ));
    }
    let memory_align = memory_align.max(1) as usize;
    if !memory_align.is_power_of_two() || memory_align > ALIGN_BYTES {
        return Err(format!("it needs {memory_align}-byte aligned memory"));
    }
    Ok(Some(memory_align))
}

/// The memory alignment direct I/O needs on an O_DIRECT descriptor, or why it
/// cannot be used. Without statx's answer, a block device needs its logical
/// block (the rule before Linux 6.0); a file is tried with one block-sized
/// read at an offset of one block, in memory aligned to ALIGN_BYTES, which is
/// then the alignment required.
fn direct_alignment(
    file: &File,
    is_block_device: bool,
    block_bytes: u32,
    size_bytes: u64,
) -> Result<usize, String> {
    if let Some(align) = direct_support(statx_dio_alignment(file), block_bytes)? {
        return Ok(align);
    }
    if is_block_device {
        return Ok(block_bytes as usize);
    }
    let block = block_bytes as u64;
    if size_bytes < 2 * block {
        return Err("the file is too small to try it".to_string());
    }
    let mut probe = AlignedBuf::zeroed(block_bytes as usize);
    match file.read_exact_at(&mut probe, block) {
        Ok(()) => Ok(ALIGN_BYTES),
        Err(e) => Err(format!("a {block_bytes}-byte read failed: {e}")),
    }
}

impl AsRawFd for FileMember {
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }
}

/// The size of an open file (its whole sectors: md counts no partial one)
/// or block device, as it is now.
fn current_size_bytes(file: &File, is_block_device: bool) -> io::Result<u64> {
    if !is_block_device {
        return Ok(file.metadata()?.len() & !511);
    }
    let mut size: u64 = 0;
    // SAFETY: the ioctl writes one u64 through the pointer, which points at
    // a live local of that type.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn annotate(name: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{name}: {e}"))
}

impl Member for FileMember {
    fn name(&self) -> &str {
        &self.name
    }

    /// The path opened again, as it was (O_DIRECT or not, for writing or
    /// not): a disk that went away and came back under the same name is
    /// reached through a fresh descriptor. The claim stays with the
    /// descriptor that took it (a duplicate of it is kept), so that no
    /// other process can take the member in between.
    fn reopen(&self) -> io::Result<super::MemberRef> {
        let claim = self.claim.as_ref().unwrap_or(&self.file).try_clone()?;
        let cache = if self.direct {
            CacheMode::Direct
        } else {
            CacheMode::Buffered
        };
        let options = OpenOptions {
            write: self.writable,
        };
        let member = FileMember::open_claimed(Path::new(&self.name), options, cache, Some(claim))?;
        Ok(std::sync::Arc::new(member))
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Relaxed)
    }

    /// The size as the device or file says it now. Only growth is taken:
    /// the array's data lies below the old size, and a device that shrank
    /// under it fails the I/O there by itself. A mapped file keeps the
    /// size of its mapping, which cannot grow under requests in flight;
    /// it grows at the next start.
    fn refresh_size(&self) -> io::Result<u64> {
        if self.mapped.is_none() {
            let now = current_size_bytes(&self.file, self.is_block_device)
                .map_err(|e| annotate(&self.name, e))?;
            self.size_bytes.fetch_max(now, Ordering::Relaxed);
        }
        Ok(self.size_bytes())
    }

    fn logical_block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        if let Some(read) = self.mapped.as_ref().and_then(|m| m.read(offset_bytes, buf)) {
            return read.map_err(|e| io_error(&self.name, "read", offset_bytes, buf.len(), e));
        }
        self.read_exact_at(buf, offset_bytes)
            .map_err(|e| io_error(&self.name, "read", offset_bytes, buf.len(), e))
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        if let Some(written) = self
            .mapped
            .as_ref()
            .and_then(|m| m.write(offset_bytes, buf))
        {
            return written.map_err(|e| io_error(&self.name, "write", offset_bytes, buf.len(), e));
        }
        self.write_all_at(buf, offset_bytes)
            .map_err(|e| io_error(&self.name, "write", offset_bytes, buf.len(), e))
    }

    /// RWF_DSYNC on the write instead of a sync of the whole file; a
    /// mapped file, memory that needs an aligned copy, or a kernel without
    /// the flag take the default write and flush.
    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        if self.mapped.is_none() && is_aligned(buf.as_ptr(), self.memory_align_bytes) {
            match write_all_dsync(&self.file, buf, offset_bytes) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {}
                done => {
                    return done
                        .map_err(|e| io_error(&self.name, "write", offset_bytes, buf.len(), e))
                }
            }
        }
        self.write_at(buf, offset_bytes)?;
        self.flush()
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| annotate(&self.name, e))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        // Forgotten first: a read through the mapping between the punch and
        // this would load from the hole and make tmpfs allocate its page.
        if let Some(mapped) = &self.mapped {
            mapped.forget(offset_bytes, len_bytes);
        }
        let fd = self.file.as_raw_fd();
        // SAFETY: the ioctl reads two u64 from the array, which lives across the
        // call; fallocate takes plain integers.
        let rc = unsafe {
            if self.is_block_device {
                let range = [offset_bytes, len_bytes];
                libc::ioctl(fd, BLKDISCARD, range.as_ptr())
            } else {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes as libc::off_t,
                    len_bytes as libc::off_t,
                )
            }
        };
        if rc != 0 {
            return Err(annotate(&self.name, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Only with direct I/O: a buffered read or write is a copy to or from
    /// the page cache that the kernel does at once in the calling thread,
    /// and io_uring hands it to a kernel worker thread instead, which made a
    /// stripe of 8 buffered members 0.1-0.9 times as fast as 8 plain calls
    /// (docs/BENCHMARKS.md, "Member I/O"). With O_DIRECT the calls wait for
    /// the device, and waiting for 8 at once is what the ring is for.
    fn raw_io(&self) -> Option<RawIo> {
        self.direct.then(|| RawIo {
            fd: self.file.as_raw_fd(),
            memory_align_bytes: self.memory_align_bytes,
        })
    }

    fn splice_fd(&self) -> Option<RawFd> {
        (!self.direct).then(|| self.file.as_raw_fd())
    }

    fn in_memory(&self) -> bool {
        self.in_memory
    }

    fn mapped(&self) -> Option<&super::mapped::Mapped> {
        self.mapped.as_ref()
    }

    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        Some(&self.stats)
    }
}

/// Whether a file lives on a file system whose pages exist only in memory
/// (tmpfs, ramfs). From linux/magic.h.
fn on_memory_fs(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: statfs is plain data, filled by fstatfs on a valid descriptor.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) };
    rc == 0 && matches!(stat.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// A file member that gives its descriptor to `batch`'s io_uring even when
/// buffered (a `FileMember` does only with O_DIRECT, see its `raw_io`): for
/// the tests of the ring's own paths, whatever /tmp supports, and for the
/// benchmark that measures why buffered members stay off the ring.
pub struct RingAlways(pub FileMember);

impl Member for RingAlways {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn refresh_size(&self) -> io::Result<u64> {
        self.0.refresh_size()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.0.logical_block_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.0.read_at(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.0.write_at(buf, offset_bytes)
    }

    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.0.discard(offset_bytes, len_bytes)
    }

    fn raw_io(&self) -> Option<RawIo> {
        Some(RawIo {
            fd: self.0.as_raw_fd(),
            memory_align_bytes: self.0.memory_align_bytes,
        })
    }

    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        self.0.io_stats()
    }
}
