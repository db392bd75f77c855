//! An in-memory [`BlockBackend`] for tests and demonstrations.
//!
//! Memory is split into independently locked 1 MiB segments, allocated on
//! first write, so that concurrent requests to different parts of the device
//! do not contend and a large sparse device costs only what is written. It
//! also counts operations and can inject errors and latency, which is what the
//! server's tests need to observe flushes, error replies and out-of-order
//! completion.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use super::{BlockBackend, BlockSizes, ZeroFlags};

const SEGMENT: u64 = 1 << 20;

/// Operation counts, for tests that check what the server asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub caches: u64,
}

#[derive(Default)]
struct Hooks {
    /// Reads and writes overlapping this range fail with EIO.
    fail: Option<Range<u64>>,
    /// Reads and writes overlapping this range sleep first.
    slow: Option<(Range<u64>, Duration)>,
}

/// A RAM disk. See the module documentation.
pub struct MemoryBackend {
    size: u64,
    block_sizes: BlockSizes,
    read_only: bool,
    multi_conn: bool,
    segments: Vec<RwLock<Option<Box<[u8]>>>>,
    hooks_active: AtomicBool,
    hooks: Mutex<Hooks>,
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    zeroes: AtomicU64,
    caches: AtomicU64,
}

impl MemoryBackend {
    /// A zero-filled writable device of `size` bytes with 512-byte minimum
    /// blocks, 4 KiB preferred blocks and 32 MiB maximum payload: the shape
    /// of a typical disk, and of the RAID devices this crate exports.
    pub fn new(size: u64) -> MemoryBackend {
        let count = size.div_ceil(SEGMENT) as usize;
        MemoryBackend {
            size,
            block_sizes: BlockSizes {
                min: 512,
                preferred: 4096,
                max_payload: 32 << 20,
            },
            read_only: false,
            multi_conn: true,
            segments: (0..count).map(|_| RwLock::new(None)).collect(),
            hooks_active: AtomicBool::new(false),
            hooks: Mutex::new(Hooks::default()),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            zeroes: AtomicU64::new(0),
            caches: AtomicU64::new(0),
        }
    }

    pub fn with_block_sizes(mut self, block_sizes: BlockSizes) -> MemoryBackend {
        self.block_sizes = block_sizes;
        self
    }

    pub fn with_read_only(mut self, read_only: bool) -> MemoryBackend {
        self.read_only = read_only;
        self
    }

    pub fn with_multi_conn(mut self, multi_conn: bool) -> MemoryBackend {
        self.multi_conn = multi_conn;
        self
    }

    /// Makes reads and writes that overlap `range` fail with EIO (or stop
    /// doing so, with `None`).
    pub fn set_fail_range(&self, range: Option<Range<u64>>) {
        let mut hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        hooks.fail = range;
        self.update_hooks_active(&hooks);
    }

    /// Makes reads and writes that overlap `range` take `delay` longer.
    pub fn set_slow_range(&self, slow: Option<(Range<u64>, Duration)>) {
        let mut hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        hooks.slow = slow;
        self.update_hooks_active(&hooks);
    }

    fn update_hooks_active(&self, hooks: &Hooks) {
        self.hooks_active.store(
            hooks.fail.is_some() || hooks.slow.is_some(),
            Ordering::Release,
        );
    }

    /// Applies the injected latency and errors to an access of
    /// `offset..offset+len`.
    fn hooks(&self, offset: u64, len: u64) -> io::Result<()> {
        // The flag keeps the common (no hooks) path free of a shared lock.
        if !self.hooks_active.load(Ordering::Acquire) {
            return Ok(());
        }
        let (fail, slow) = {
            let hooks = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
            (hooks.fail.clone(), hooks.slow.clone())
        };
        let overlaps = |r: &Range<u64>| offset < r.end && r.start < offset + len.max(1);
        if let Some((range, delay)) = slow {
            if overlaps(&range) {
                std::thread::sleep(delay);
            }
        }
        if let Some(range) = fail {
            if overlaps(&range) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(())
    }

    /// Refuses what the server guarantees never to send (see
    /// `BlockBackend`), as the engine does: an access outside the device or
    /// not aligned to its minimum block. A test of the server then sees a
    /// request that the server should have cut at the blocks.
    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        let min = self.block_sizes.min as u64;
        if !offset.is_multiple_of(min) || !len.is_multiple_of(min) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("access at {offset}+{len} is not aligned to {min}-byte blocks"),
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "access at {offset}+{len} beyond the end ({} bytes)",
                    self.size
                ),
            ));
        }
        Ok(())
    }

    /// Calls `f(segment index, offset in segment, offset in the request,
    /// length)` for each segment piece of `offset..offset+len`.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let in_seg = pos % SEGMENT;
            let n = (SEGMENT - in_seg).min(len - done);
            f(
                (pos / SEGMENT) as usize,
                in_seg as usize,
                done as usize,
                n as usize,
            );
            done += n;
        }
    }

    fn segment_len(&self, index: usize) -> usize {
        (self.size - index as u64 * SEGMENT).min(SEGMENT) as usize
    }

    /// Sets a range to zero, dropping segments that become entirely unused.
    fn zero_range(&self, offset: u64, len: u64) {
        Self::for_each_piece(offset, len, |seg, at, _, n| {
            let mut guard = self.segments[seg]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            if n == self.segment_len(seg) {
                *guard = None;
            } else if let Some(data) = guard.as_mut() {
                data[at..at + n].fill(0);
            }
        });
    }

    /// A copy of the whole device, for comparisons in tests.
    pub fn contents(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.size as usize];
        self.copy_out(0, &mut out);
        out
    }

    /// Copies bytes out without the checks of `read`, which a device whose
    /// size is not whole blocks would fail for its last bytes.
    fn copy_out(&self, offset: u64, buf: &mut [u8]) {
        Self::for_each_piece(offset, buf.len() as u64, |seg, at, pos, n| {
            let guard = self.segments[seg].read().unwrap_or_else(|e| e.into_inner());
            match guard.as_ref() {
                Some(data) => buf[pos..pos + n].copy_from_slice(&data[at..at + n]),
                None => buf[pos..pos + n].fill(0),
            }
        });
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fua_writes: self.fua_writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            trims: self.trims.load(Ordering::Relaxed),
            zeroes: self.zeroes.load(Ordering::Relaxed),
            caches: self.caches.load(Ordering::Relaxed),
        }
    }
}

impl BlockBackend for MemoryBackend {
    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn block_sizes(&self) -> BlockSizes {
        self.block_sizes
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn multi_conn_safe(&self) -> bool {
        self.multi_conn
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.hooks(offset, buf.len() as u64)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.copy_out(offset, buf);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, data.len() as u64)?;
        self.hooks(offset, data.len() as u64)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Self::for_each_piece(offset, data.len() as u64, |seg, at, pos, n| {
            let seg_len = self.segment_len(seg);
            let mut guard = self.segments[seg]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let segment = guard.get_or_insert_with(|| vec![0u8; seg_len].into_boxed_slice());
            segment[at..at + n].copy_from_slice(&data[pos..pos + n]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // Memory is as durable as it gets; the count lets tests check that
        // the server forwarded the flush.
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, len)?;
        self.trims.fetch_add(1, Ordering::Relaxed);
        // Zeroing is a valid way to forget data, and it makes trimmed ranges
        // deterministic for the tests.
        self.zero_range(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, len)?;
        self.hooks(offset, len)?;
        self.zeroes.fetch_add(1, Ordering::Relaxed);
        self.zero_range(offset, len);
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn zeroes_are_fast(&self) -> bool {
        true
    }

    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.caches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_across_segments() {
        let m = MemoryBackend::new(3 * SEGMENT + 4096);
        let data: Vec<u8> = (0..(2 * SEGMENT + 1024)).map(|i| (i % 251) as u8).collect();
        m.write(SEGMENT - 512, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read(SEGMENT - 512, &mut back).unwrap();
        assert_eq!(back, data);
        // Untouched areas read as zeroes, including the short last segment.
        let mut tail = vec![1u8; 3072];
        m.read(3 * SEGMENT + 1024, &mut tail).unwrap();
        assert!(tail.iter().all(|&b| b == 0));
        assert!(m.read(3 * SEGMENT + 2048, &mut tail).is_err());
        assert!(m.write(u64::MAX - 1, &[0, 0, 0], false).is_err());
    }

    #[test]
    fn trim_and_zero() {
        let m = MemoryBackend::new(2 * SEGMENT);
        m.write(0, &vec![7u8; 2 * SEGMENT as usize], true).unwrap();
        m.trim(0, SEGMENT).unwrap();
        m.write_zeroes(
            SEGMENT + 512,
            512,
            ZeroFlags {
                fua: true,
                may_trim: true,
            },
        )
        .unwrap();
        let c = m.contents();
        assert!(c[..SEGMENT as usize].iter().all(|&b| b == 0));
        assert!(c[SEGMENT as usize..SEGMENT as usize + 512]
            .iter()
            .all(|&b| b == 7));
        assert!(c[SEGMENT as usize + 512..SEGMENT as usize + 1024]
            .iter()
            .all(|&b| b == 0));
        assert!(c[SEGMENT as usize + 1024..].iter().all(|&b| b == 7));
        let s = m.stats();
        assert_eq!(
            (s.writes, s.fua_writes, s.trims, s.zeroes, s.flushes),
            (1, 1, 1, 1, 1)
        );
    }

    #[test]
    fn hooks_and_read_only() {
        let m = MemoryBackend::new(SEGMENT);
        m.set_fail_range(Some(4096..8192));
        let mut buf = [0u8; 512];
        assert_eq!(m.read(4096 - 512, &mut buf).unwrap(), ());
        assert_eq!(
            m.read(4096, &mut buf).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        m.set_fail_range(None);
        assert!(m.read(4096, &mut buf).is_ok());
        // What the server must never pass on: a block cut short.
        assert!(m.read(4097, &mut buf).is_err());
        assert!(m.write(0, &buf[..100], false).is_err());
        assert!(m.trim(512, 1).is_err());
        let ro = MemoryBackend::new(SEGMENT).with_read_only(true);
        assert_eq!(
            ro.write(0, &buf, false).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
    }
}
