//! Exporting a block device to clients.
//!
//! The export layer sits on top of whatever provides the blocks (the engine's
//! live array; a [`MemoryBackend`] in tests) and speaks a block protocol to
//! clients. The only protocol so far is NBD ([`nbd`]), which the kernel's
//! `nbd` driver, qemu, libnbd tools and fio all speak.
//!
//! The contract between the two halves is [`BlockBackend`]: a synchronous,
//! thread-safe byte-addressed device. The server calls it from many threads at
//! once (several connections, several requests in flight per connection), so an
//! implementation must not assume requests arrive one at a time or in order.

pub mod memory;
pub mod nbd;
pub mod ublk;

pub use crate::member::nbd::proto::BlockSizes;
pub use memory::MemoryBackend;

use std::io;

/// Options of a write-zeroes request, passed to [`BlockBackend::write_zeroes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Do not return before the zeroes are durable (NBD's FUA flag).
    pub fua: bool,
    /// The backend may deallocate the range (punch a hole) instead of writing
    /// zeroes, as long as it reads back as zeroes. False when the client sent
    /// NBD's NO_HOLE flag, asking for the range to stay fully provisioned.
    pub may_trim: bool,
}

/// A block device as the export layer sees it.
///
/// All offsets and lengths are in bytes. The server guarantees that every call
/// is inside `size_bytes()`, aligned to `block_sizes().min`, and (for `read`
/// and `write`) no longer than `block_sizes().max_payload`; the backend need
/// not check again, although it may. Calls arrive concurrently from many
/// threads; overlapping requests in flight at the same time have no defined
/// order, exactly as on a real disk.
///
/// Errors are reported to the client as NBD error numbers:
/// `EPERM`/`EACCES`/`EROFS` become EPERM, `ENOSPC`/`EDQUOT`/`EFBIG` ENOSPC,
/// `EINVAL` EINVAL, `ENOMEM` ENOMEM, and anything else EIO.
pub trait BlockBackend: Send + Sync {
    /// The size of the device.
    fn size_bytes(&self) -> u64;

    /// The block size constraints to advertise and enforce.
    fn block_sizes(&self) -> BlockSizes;

    /// Whether writes are refused. The server then answers every write, trim
    /// and write-zeroes with EPERM without calling the backend.
    fn read_only(&self) -> bool;

    /// Whether several connections may use the device at once safely: a
    /// flush or FUA write on one connection makes data written through any
    /// connection durable and visible to all of them. True for anything with a
    /// single shared cache (one in-process engine); this becomes NBD's
    /// `CAN_MULTI_CONN`, without which clients use a single connection.
    fn multi_conn_safe(&self) -> bool;

    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes all of `data` at `offset`. With `fua`, returns only once the
    /// data is durable.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;

    /// Makes every write that has completed (returned) so far durable.
    fn flush(&self) -> io::Result<()>;

    /// A hint that a range is no longer needed; its contents become
    /// unspecified until written again. Doing nothing is a valid
    /// implementation.
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Makes a range read back as zeroes. [`write_zeroes_by_writing`] is a
    /// correct implementation for backends without a faster way.
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> io::Result<()>;

    /// Whether `write_zeroes` is substantially faster than writing zeroes
    /// with `write`. NBD clients that ask for a "fast zero" get ENOTSUP at
    /// once when this is false, so that they can fall back to writing only
    /// the data they have instead of zeroing everything first.
    fn zeroes_are_fast(&self) -> bool {
        false
    }

    /// `read`, from a client that has `company`: other requests in flight
    /// on its connection, whose replies may still be on their way, so that
    /// it is no lone reader whatever the backend sees of them (read-ahead
    /// serves lone readers). The default ignores it.
    fn read_among(&self, offset: u64, buf: &mut [u8], company: bool) -> io::Result<()> {
        let _ = company;
        self.read(offset, buf)
    }

    /// Whether the backend wants `request_done` for the reads it answers
    /// with extents (`read_extents`), which the server completes itself.
    /// The default says no.
    fn times_requests(&self) -> bool {
        false
    }

    /// A read answered through `read_extents` (the fast path, a splice)
    /// took `elapsed` from its request's arrival to its reply: the backend
    /// may count it as it counts the requests it serves itself. The
    /// default ignores it.
    fn request_done(&self, _elapsed: std::time::Duration) {}

    /// Whether reads never wait for a device (every byte is in memory): a
    /// server may then serve small reads on the thread that reads
    /// requests, which saves handing each to another thread. The default
    /// says no.
    fn reads_from_memory(&self) -> bool {
        false
    }

    /// The I/O size that writes whole rows (chunk × data members), for a
    /// block device's optimal_io_size; None where there is none.
    fn optimal_io_bytes(&self) -> Option<u64> {
        None
    }

    /// The largest request the backend wants at once (the array's
    /// max_sectors_kb), for a block device's max_sectors; None: any up to
    /// `block_sizes().max_payload`.
    fn max_io_bytes(&self) -> Option<u32> {
        None
    }

    /// Whether the device is a rotating disk (a scheduling hint for clients).
    fn rotational(&self) -> bool {
        false
    }

    /// A hint that a range will be read soon. The default does nothing.
    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// Where the bytes of a read of `len` bytes at `offset` lie, in order,
    /// when the server may fetch them from files itself (`how`) instead of
    /// calling `read`; `None` to use `read`. The server falls back to
    /// `read` if fetching them fails before the reply starts, so a backend
    /// that offers extents must give the same bytes from `read`. The
    /// default never offers any.
    fn read_extents(&self, _offset: u64, _len: usize, _how: ExtentUse) -> Option<Vec<FileExtent>> {
        None
    }

    /// Whether a write of `len` bytes at `offset` is likely to be taken by
    /// [`write_staged`](Self::write_staged): a server then stages its
    /// payload outside memory (a pipe) instead of reading it. A cheap
    /// guess; the default says no.
    fn takes_staged_writes(&self, _offset: u64, _len: usize) -> bool {
        false
    }

    /// Writes `len` bytes at `offset` whose data the server holds staged
    /// (see [`StagedWrite`]), moving them into files without a copy
    /// through this process. `None`, having taken nothing from `data`,
    /// when it cannot: the server then copies the bytes into memory and
    /// calls `write`. With `Some`, bytes left in `data` are thrown away.
    fn write_staged(
        &self,
        _offset: u64,
        _len: usize,
        _fua: bool,
        _data: &mut dyn StagedWrite,
    ) -> Option<io::Result<()>> {
        None
    }
}

/// The payload of a write that a server has staged outside its memory
/// (in a pipe, spliced from its socket as page references), for
/// [`BlockBackend::write_staged`]. The bytes are taken from the front,
/// each once.
// "into": the bytes go into files or memory, taken from the payload piece
// by piece, so the methods borrow it rather than consume it.
#[allow(clippy::wrong_self_convention)]
pub trait StagedWrite {
    /// Moves the next `len` bytes into each of `targets` (a descriptor of
    /// a buffered file, and the offset to write at). They are taken
    /// whatever happens to the targets; the result has each target's
    /// error, in order. `Err` when the staged bytes themselves could not
    /// be moved (nothing is known of the targets then).
    fn into_files(
        &mut self,
        len: usize,
        targets: &[(std::os::fd::RawFd, u64)],
    ) -> io::Result<Vec<Option<io::Error>>>;

    /// Copies the next `buf.len()` bytes into `buf`.
    fn into_memory(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// What a server will do with the extents of [`BlockBackend::read_extents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentUse {
    /// Splice them from the files' page caches to the socket, without a
    /// copy: buffered files only (O_DIRECT bytes are not in the page cache).
    Splice,
    /// Read them asynchronously (io_uring) into memory aligned to
    /// `member::ALIGN_BYTES`: any descriptor whose reads are plain
    /// positional reads, each extent at most one member I/O long.
    Read,
}

/// A run of bytes in a file, for [`BlockBackend::read_extents`].
pub struct FileExtent {
    /// Open for as long as `owner` lives.
    pub fd: std::os::fd::RawFd,
    pub offset: u64,
    pub len: usize,
    /// Keeps `fd` open while the extent is in use.
    pub owner: Box<dyn std::any::Any + Send>,
    /// The member whose I/O counters a read of the extent on a ring
    /// counts in (`Member::io_stats`).
    pub member: Option<crate::member::MemberRef>,
}

/// Implements [`BlockBackend::write_zeroes`] by writing buffers of zeroes, for
/// backends that have no cheaper way to zero a range.
///
/// The chunks are written without FUA and followed by one flush when FUA was
/// asked for: that gives the same durability with a single flush instead of
/// one per chunk.
pub fn write_zeroes_by_writing(
    backend: &dyn BlockBackend,
    offset: u64,
    len: u64,
    flags: ZeroFlags,
) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        backend.write(offset + done, &zeroes[..n], false)?;
        done += n as u64;
    }
    if flags.fua {
        backend.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_validation() {
        assert!(BlockSizes::PROTOCOL_DEFAULT.validate().is_ok());
        assert!(BlockSizes {
            min: 512,
            preferred: 4096,
            max_payload: 4096
        }
        .validate()
        .is_ok());
        assert!(BlockSizes {
            min: 4096,
            preferred: 65536,
            max_payload: 1 << 25
        }
        .validate()
        .is_ok());
        assert!(BlockSizes {
            min: 3,
            preferred: 4096,
            max_payload: 1 << 20
        }
        .validate()
        .is_err());
        assert!(BlockSizes {
            min: 1 << 17,
            preferred: 1 << 17,
            max_payload: 1 << 20
        }
        .validate()
        .is_err());
        assert!(BlockSizes {
            min: 1,
            preferred: 256,
            max_payload: 1 << 20
        }
        .validate()
        .is_err());
        assert!(BlockSizes {
            min: 4096,
            preferred: 512,
            max_payload: 1 << 20
        }
        .validate()
        .is_err());
        assert!(BlockSizes {
            min: 512,
            preferred: 4096,
            max_payload: 4095
        }
        .validate()
        .is_err());
    }

    #[test]
    fn zeroing_by_writing() {
        let m = MemoryBackend::new(3 << 20);
        m.write(0, &vec![0xaa; 3 << 20], false).unwrap();
        write_zeroes_by_writing(
            &m,
            4096,
            (2 << 20) + 512,
            ZeroFlags {
                fua: true,
                may_trim: false,
            },
        )
        .unwrap();
        let data = m.contents();
        assert!(data[..4096].iter().all(|&b| b == 0xaa));
        assert!(data[4096..4096 + (2 << 20) + 512].iter().all(|&b| b == 0));
        assert!(data[4096 + (2 << 20) + 512..].iter().all(|&b| b == 0xaa));
        assert_eq!(m.stats().flushes, 1);
    }
}
