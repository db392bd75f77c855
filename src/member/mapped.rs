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
//!
//! The member's reads and writes go through the mapping too (`read`,
//! `write`):
//! a copy instead of a system call, a page-cache lookup and, for a write,
//! the file's lock, which every writer of a member takes in turn (a raid6
//! small write is three member writes). Members in memory went from
//! 75,000-90,000 to 113,000 4K random writes a second and from 270,000 to
//! 440,000 degraded random reads (docs/BENCHMARKS.md, "Member I/O in
//! memory through the mapping"). A read goes through the mapping only
//! where the units are reserved: a load
//! from a hole would make tmpfs allocate a page of zeros, where `pread`
//! allocates nothing. Units already written when the member is opened
//! count as reserved (found with SEEK_DATA/SEEK_HOLE).
//!
//! A file cut short under the mapping by another process is a SIGBUS too:
//! `bus` catches it, and every copy through a mapping that met one fails
//! with an I/O error from then on, which fails the member.
//!
//! Reads are not ordered against writes to the same bytes (the engine
//! locks rows for writes, not for reads): such a read returns old or new
//! bytes, as `pread` racing `pwrite` would, and as a block device promises
//! no better for overlapping requests in flight.

mod bus;

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
    /// First, so that it is released before the mapping goes.
    registration: bus::Registration,
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
        let registration = bus::Registration::new(map.as_ptr() as usize, map.len())
            .ok_or_else(|| io::Error::other("no room to register another mapping"))?;
        let units = len.div_ceil(UNIT);
        let mapped = Mapped {
            registration,
            map,
            fd: file.as_raw_fd(),
            len,
            reserved: (0..units.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        };
        mapped.note_written_units();
        Ok(mapped)
    }

    /// Marks reserved the units that hold data throughout, so that reads
    /// of a member written before it was opened go through the mapping.
    fn note_written_units(&self) {
        let units = self.len.div_ceil(UNIT);
        let mut at = 0u64;
        while at < self.len {
            // SAFETY: lseek on a descriptor that is open (see `fd`); the
            // member's I/O is positional, so its file offset is unused.
            let data = unsafe { libc::lseek(self.fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                // ENXIO: only a hole is left (or the file system cannot
                // tell: then nothing is marked, and reads use pread).
                return;
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(self.fd, data, libc::SEEK_HOLE) };
            if hole < 0 {
                return;
            }
            let (data, hole) = (data as u64, (hole as u64).min(self.len));
            for unit in data.div_ceil(UNIT)..units {
                if (unit * UNIT + UNIT).min(self.len) > hole {
                    break;
                }
                self.mark_reserved(unit);
            }
            if hole <= at {
                return;
            }
            at = hole;
        }
    }

    /// Whether a bus error has hit the mapping (`bus`): it no longer holds
    /// the file's bytes, and every copy through it fails.
    pub fn faulted(&self) -> bool {
        self.registration.faulted()
    }

    /// An I/O error once the mapping has met a bus error.
    pub fn check(&self) -> io::Result<()> {
        if self.faulted() {
            return Err(io::Error::other(
                "bus error in the member's mapping: its file was cut short under the array",
            ));
        }
        Ok(())
    }

    /// Loads a byte of every page of `[offset, offset + len)`, so that a
    /// page past the file's end meets its bus error and marks the mapping:
    /// for a store the kernel made (a `read` from a pipe into the
    /// mapping), which gets EFAULT there instead, unmarked.
    pub fn touch(&self, offset: u64, len: usize) {
        assert!(offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len));
        let mut byte = 0u8;
        let mut at = offset;
        while at < offset + len as u64 {
            // SAFETY: inside the mapping (asserted); memcpy as in `read`.
            unsafe {
                libc::memcpy(
                    (&mut byte as *mut u8).cast(),
                    self.map.as_ptr().add(at as usize).cast(),
                    1,
                )
            };
            at = (at / 4096 + 1) * 4096;
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping, where every
    /// unit they touch is reserved; `None` otherwise (read them with
    /// `pread`).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        assert!(offset
            .checked_add(buf.len() as u64)
            .is_some_and(|end| end <= self.len));
        if let Err(e) = self.check() {
            return Some(Err(e));
        }
        if !self
            .units(offset, buf.len() as u64)
            .all(|u| self.is_reserved(u))
        {
            return None;
        }
        // SAFETY: inside the mapping (asserted), which lives as long as
        // `self`. The copy is libc's memcpy, opaque to the compiler as
        // pread's copy in the kernel was: a staged write may be storing to
        // the same bytes through its slice (see the module's note on
        // order), and no Rust access here races it.
        unsafe {
            libc::memcpy(
                buf.as_mut_ptr().cast(),
                self.map.as_ptr().add(offset as usize).cast(),
                buf.len(),
            )
        };
        Some(self.check())
    }

    /// Copies `buf` into the mapping at `offset`, reserving its units
    /// first; `None` when they cannot be reserved (the plain write meets
    /// the same error and reports it). The caller holds the row's lock, so
    /// no other write stores to these bytes.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Option<io::Result<()>> {
        if let Err(e) = self.check() {
            return Some(Err(e));
        }
        self.reserve(offset, buf.len() as u64).ok()?;
        // SAFETY: inside the mapping (asserted by reserve) and reserved, so
        // the stores cannot fault for want of pages; memcpy, as above.
        unsafe {
            libc::memcpy(
                self.map.as_mut_ptr().add(offset as usize).cast(),
                buf.as_ptr().cast(),
                buf.len(),
            )
        };
        Some(self.check())
    }

    fn units(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / UNIT..(offset + len).div_ceil(UNIT)
    }

    fn mark_reserved(&self, unit: u64) {
        self.reserved[(unit / 64) as usize].fetch_or(1 << (unit % 64), Ordering::AcqRel);
    }

    fn is_reserved(&self, unit: u64) -> bool {
        self.reserved[(unit / 64) as usize].load(Ordering::Acquire) & (1 << (unit % 64)) != 0
    }

    /// Makes sure the pages of `[offset, offset + len)` exist, so that
    /// storing into them cannot fault; an error (ENOSPC) is the write's.
    pub fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        self.check()?;
        for unit in self.units(offset, len) {
            if self.is_reserved(unit) {
                continue;
            }
            let start = unit * UNIT;
            let n = UNIT.min(self.len - start);
            // SAFETY: fallocate on a descriptor that is open (see `fd`).
            // KEEP_SIZE: a member never grows; if its file was cut short
            // under the array, this must not grow it back over a hole
            // where reads would find zeros instead of a bus error.
            let rc = unsafe {
                libc::fallocate(
                    self.fd,
                    libc::FALLOC_FL_KEEP_SIZE,
                    start as libc::off_t,
                    n as libc::off_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            self.mark_reserved(unit);
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
    /// store to it while the slice lives (the engine holds the row's
    /// lock). Reads of it may run meanwhile: `read` copies with libc's
    /// memcpy, which the compiler cannot see into, as it could not see
    /// into `pread`; what they get is old or new bytes.
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

    fn shm_file(dir: &tempfile::TempDir, len: u64) -> File {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("m"))
            .unwrap();
        file.set_len(len).unwrap();
        file
    }

    /// Reads and writes through the mapping are the file's bytes both
    /// ways; a read of a hole is left to pread (it would allocate), and
    /// units written before the mapping was made are read through it.
    #[test]
    fn reads_and_writes_through_the_mapping_are_the_files() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = shm_file(&dir, 4 * UNIT);
        file.write_all_at(&vec![7u8; UNIT as usize], 2 * UNIT)
            .unwrap();
        let mapped = Mapped::new(&file, 4 * UNIT).unwrap();
        assert!(mapped.is_reserved(2), "written before: found at open");
        assert!(!mapped.is_reserved(0) && !mapped.is_reserved(1) && !mapped.is_reserved(3));
        let mut buf = vec![0u8; 8192];
        assert!(
            mapped.read(0, &mut buf).is_none(),
            "a hole is read by pread"
        );
        assert!(
            mapped.read(UNIT - 4096, &mut buf).is_none(),
            "half a hole too"
        );
        mapped.read(2 * UNIT + 4096, &mut buf).unwrap().unwrap();
        assert!(buf.iter().all(|&b| b == 7));
        let bytes: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        mapped.write(UNIT + 512, &bytes).unwrap().unwrap();
        let mut back = vec![0u8; 8192];
        file.read_exact_at(&mut back, UNIT + 512).unwrap();
        assert_eq!(back, bytes, "pread sees the store");
        file.write_all_at(&[9u8; 4096], UNIT + 512).unwrap();
        mapped.read(UNIT + 512, &mut back).unwrap().unwrap();
        assert!(
            back[..4096].iter().all(|&b| b == 9),
            "the mapping sees pwrite"
        );
        assert_eq!(back[4096..], bytes[4096..]);
        assert!(!mapped.faulted());
    }

    /// A file cut short under its mapping is a bus error that fails the
    /// copies through the mapping, from then on, and not the process.
    #[test]
    fn a_file_cut_short_fails_copies_instead_of_the_process() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let file = shm_file(&dir, 2 * UNIT);
        let mapped = Mapped::new(&file, 2 * UNIT).unwrap();
        mapped.write(UNIT, &[1u8; 4096]).unwrap().unwrap();
        // Another process truncating the member, as far as the mapping
        // can tell.
        file.set_len(4096).unwrap();
        let mut buf = [0u8; 4096];
        let read = mapped.read(UNIT, &mut buf).expect("the unit is reserved");
        let e = read.expect_err("past the file's end");
        assert!(e.to_string().contains("bus error"), "{e}");
        assert!(mapped.faulted());
        // Every copy fails now, even inside what is left of the file.
        assert!(mapped.read(0, &mut buf).is_some_and(|r| r.is_err()));
        assert!(mapped.write(0, &buf).is_some_and(|r| r.is_err()));
        assert!(mapped.reserve(0, 4096).is_err());
        // Another mapping is not affected.
        let other_dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let other = shm_file(&other_dir, UNIT);
        let fine = Mapped::new(&other, UNIT).unwrap();
        fine.write(0, &[2u8; 4096]).unwrap().unwrap();
        assert!(!fine.faulted());
    }

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
