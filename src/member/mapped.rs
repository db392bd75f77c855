//! A member in memory (a file on tmpfs or ramfs) mapped into the process,
//! so that a write can land in its pages in place: the bytes of a staged
//! write are copied once, from the server's pipe into the mapping, and
//! parity is computed straight into the parity members' pages. Through
//! `pwrite` each byte would also go through the page cache's write path
//! (a lookup, a lock and a dirty mark per 4 KiB page, and the file's lock),
//! which costs as much again on a machine of few cores.
//!
//! A store into a mapped page that tmpfs cannot allocate (the file system
//! is full) is a SIGBUS, not an error. So a range is *reserved* before it
//! is written through the mapping: its pages are allocated with
//! `fallocate`, which fails with ENOSPC like a write would, once per
//! `UNIT` and remembered. A punched hole (a discard) forgets its units.

use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The granularity of reservations: a write reserves the whole units it
/// touches, so a sparse member grows by at most this much more than its
/// writes.
const UNIT: u64 = 1 << 20;

pub struct Mapped {
    map: MmapRaw,
    /// The mapped file's descriptor, open for as long as this lives (it is
    /// a field of the member that owns the file).
    fd: RawFd,
    len: u64,
    /// One bit per `UNIT`: its pages are allocated.
    reserved: Box<[AtomicU64]>,
}

impl Mapped {
    /// Maps the first `len` bytes of `file` shared, for reading and writing.
    /// `file` must outlive the result.
    pub(super) fn new(file: &File, len: u64) -> io::Result<Mapped> {
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| io::Error::other("member too large to map"))?)
            .map_raw(file)?;
        let units = len.div_ceil(UNIT);
        Ok(Mapped {
            map,
            fd: file.as_raw_fd(),
            len,
            reserved: (0..units.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn units(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / UNIT..(offset + len).div_ceil(UNIT)
    }

    fn is_reserved(&self, unit: u64) -> bool {
        self.reserved[(unit / 64) as usize].load(Ordering::Acquire) & (1 << (unit % 64)) != 0
    }

    /// Makes sure the pages of `[offset, offset + len)` exist, so that
    /// storing into them cannot fault; an error (ENOSPC) is the write's.
    pub fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        for unit in self.units(offset, len) {
            if self.is_reserved(unit) {
                continue;
            }
            let start = unit * UNIT;
            let n = UNIT.min(self.len - start);
            // SAFETY: fallocate on a descriptor that is open (see `fd`).
            let rc = unsafe { libc::fallocate(self.fd, 0, start as libc::off_t, n as libc::off_t) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            self.reserved[(unit / 64) as usize].fetch_or(1 << (unit % 64), Ordering::AcqRel);
        }
        Ok(())
    }

    /// After a hole was punched in `[offset, offset + len)`: its units
    /// must be reserved again before the next store.
    pub(super) fn forget(&self, offset: u64, len: u64) {
        for unit in self.units(offset, len.min(self.len.saturating_sub(offset))) {
            self.reserved[(unit / 64) as usize].fetch_and(!(1 << (unit % 64)), Ordering::AcqRel);
        }
    }

    /// The bytes `[offset, offset + len)` of the member, to write in place.
    ///
    /// # Safety
    /// The range must be reserved, and nothing else in the process may
    /// use it while the slice lives (the engine holds the row's lock; the
    /// member's other I/O goes through the kernel, not through memory).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        assert!(offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len));
        // SAFETY: inside the mapping (asserted), which lives as long as
        // `self`; exclusive use is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset as usize), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Bytes stored through the mapping are the file's (pread sees them);
    /// a reservation allocates whole units of a sparse file, once; a
    /// punched hole is reserved again.
    #[test]
    fn stores_in_reserved_ranges_are_the_files_bytes() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("m");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(3 * UNIT + 4096).unwrap();
        let allocated = || {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&path).unwrap().blocks() * 512
        };
        let mapped = Mapped::new(&file, 3 * UNIT + 4096).unwrap();
        assert_eq!(allocated(), 0, "sparse");
        mapped.reserve(UNIT + 4096, 8192).unwrap();
        // At least the unit (a tmpfs with huge pages allocates more).
        let one = allocated();
        assert!(one >= UNIT, "one unit: {one}");
        assert!(mapped.is_reserved(1) && !mapped.is_reserved(0));
        // SAFETY: reserved above; nothing else uses the file.
        let bytes = unsafe { mapped.slice_mut(UNIT + 4096, 8192) };
        bytes.fill(0xab);
        let mut back = [0u8; 8192];
        file.read_exact_at(&mut back, UNIT + 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0xab));
        // The last, short unit.
        mapped.reserve(3 * UNIT, 4096).unwrap();
        let two = allocated();
        assert!(two > one && mapped.is_reserved(3));
        // Reserved once: a second reservation allocates nothing.
        mapped.reserve(UNIT, UNIT).unwrap();
        assert_eq!(allocated(), two);
        // SAFETY: as above.
        unsafe { mapped.slice_mut(3 * UNIT, 4096) }.fill(1);
        // A hole punched over the first store: forgotten, reserved anew.
        // SAFETY: plain fallocate on an open descriptor.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                UNIT as i64,
                UNIT as i64,
            )
        };
        assert_eq!(rc, 0);
        mapped.forget(UNIT, UNIT);
        assert!(!mapped.is_reserved(1) && mapped.is_reserved(3));
        assert!(allocated() < two, "the hole");
        mapped.reserve(UNIT, 4096).unwrap();
        assert!(mapped.is_reserved(1));
        assert_eq!(allocated(), two);
    }
}
