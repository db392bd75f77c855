//! The io_uring backend of `batch`: one ring per thread, created on first
//! use, that runs a batch's ops on member descriptors concurrently.
//!
//! Bounds: RING_ENTRIES ops in flight per thread, MEMBER_DEPTH_MAX per member
//! (so that one member with many ops does not starve the others of queue
//! slots), RETRIES_MAX resubmissions of an op interrupted by EINTR/EAGAIN.
//! A short read or write is resubmitted for the remainder; each
//! resubmission makes progress, so that loop ends too.
//!
//! Safety contract for the `unsafe` in this file: an SQE points at memory of
//! an op of the batch being run (borrowed `&mut` by `run` for its whole
//! duration) or at a bounce buffer owned by that op's `Slot`; `Ring::run`
//! does not return, and no slot is dropped, while any SQE is in flight: the
//! only way out of the wait loop with ops in flight is `fatal`, which aborts
//! the process rather than let the kernel write into freed memory.

use super::aligned::{give_bounce, is_aligned, take_bounce, AlignedBuf};
use super::batch::{Buffer, IoOp};
use super::{check_io, io_error};
use io_uring::{opcode, squeue, types, IoUring, Probe};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::unix::io::RawFd;
use std::panic::{self, AssertUnwindSafe};

/// Submission queue entries of a thread's ring; the completion queue has
/// twice as many, so it cannot overflow with at most this many in flight.
pub(super) const RING_ENTRIES: u32 = 128;
/// Ops in flight on one member at once.
pub(super) const MEMBER_DEPTH_MAX: u32 = 32;
/// Resubmissions of an op that completes with EINTR or EAGAIN.
const RETRIES_MAX: u32 = 8;
/// The longest SQE: the kernel caps one read or write at about 2 GiB.
const SQE_BYTES_MAX: usize = 1 << 30;
/// io_uring_enter calls in a row that find the kernel busy (EAGAIN, EBUSY)
/// before giving up on the process.
const ENTER_BUSY_MAX: u32 = 100_000;

#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) entries: u32,
    pub(super) member_depth_max: u32,
    pub(super) sqe_bytes_max: usize,
}

pub(super) const LIMITS: Limits = Limits {
    entries: RING_ENTRIES,
    member_depth_max: MEMBER_DEPTH_MAX,
    sqe_bytes_max: SQE_BYTES_MAX,
};

pub(super) struct Ring {
    ring: IoUring,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// Runs the ops on this thread's ring, created with `make_ring` if the
/// thread has none. Err only when the ring could not be created, before any
/// op was started.
pub(super) fn run(
    ops: &mut [IoOp],
    make_ring: &dyn Fn() -> io::Result<Ring>,
) -> io::Result<Vec<io::Result<()>>> {
    run_limited(ops, make_ring, LIMITS)
}

pub(super) fn run_limited(
    ops: &mut [IoOp],
    make_ring: &dyn Fn() -> io::Result<Ring>,
    limits: Limits,
) -> io::Result<Vec<io::Result<()>>> {
    // Taken out while in use: a member's `read_at` that itself ran a batch
    // (none does today) would get a ring of its own instead of a panic.
    let mut ring = match RING.with(|cell| cell.borrow_mut().take()) {
        Some(ring) => ring,
        None => make_ring()?,
    };
    let results = ring.run(ops, limits);
    RING.with(|cell| *cell.borrow_mut() = Some(ring));
    Ok(results)
}

impl Ring {
    /// A ring of RING_ENTRIES, if the kernel lets this process have one with
    /// the plain READ and WRITE operations (Linux 5.6).
    pub(super) fn new() -> io::Result<Ring> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) || !probe.is_supported(opcode::Write::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's io_uring has no READ/WRITE (Linux 5.6 added them)",
            ));
        }
        Ok(Ring { ring })
    }

    fn run(&mut self, ops: &mut [IoOp], limits: Limits) -> Vec<io::Result<()>> {
        assert!(limits.entries >= 1 && limits.entries <= RING_ENTRIES);
        assert!(limits.member_depth_max >= 1 && limits.sqe_bytes_max >= 1);
        let mut results: Vec<Option<io::Result<()>>> = ops.iter().map(|_| None).collect();
        let mut slots: Vec<Option<Slot>> = ops.iter().map(|_| None).collect();
        let mut depths: Vec<(RawFd, u32)> = Vec::new();
        let mut through_trait = Vec::new();
        let mut pending = VecDeque::new();
        for (i, op) in ops.iter_mut().enumerate() {
            if let Err(e) = check_io(op.member, op.offset_bytes, op.len_bytes() as u64) {
                results[i] = Some(Err(e));
                continue;
            }
            let Some(raw) = op.member.raw_io() else {
                through_trait.push(i);
                continue;
            };
            let member = match depths.iter().position(|&(fd, _)| fd == raw.fd) {
                Some(at) => at,
                None => {
                    depths.push((raw.fd, 0));
                    depths.len() - 1
                }
            };
            slots[i] = Some(Slot::new(op, raw.fd, raw.memory_align_bytes, member));
            pending.push_back(i);
        }

        // A panic here with ops in flight must not unwind into the caller,
        // which would free memory the kernel is about to write: the guard
        // aborts instead. A member's own panic (trait ops) is caught and
        // resumed once nothing is in flight.
        let in_flight = Cell::new(0u32);
        let _guard = AbortIfInFlight(&in_flight);
        let mut panicked = None;
        loop {
            // Queue what the bounds allow, oldest first; the rest waits.
            for _ in 0..pending.len() {
                let i = pending.pop_front().expect("counted");
                let slot = slots[i].as_ref().expect("pending ops have a slot");
                let depth = &mut depths[slot.member].1;
                if in_flight.get() == limits.entries || *depth == limits.member_depth_max {
                    pending.push_back(i);
                    continue;
                }
                let sqe = slot.sqe(i as u64, limits.sqe_bytes_max);
                // SAFETY: see the contract at the top: the memory lives in
                // the op or the slot until the completion is reaped.
                let pushed = unsafe { self.ring.submission().push(&sqe) };
                pushed.expect("the submission queue has room: in flight <= entries");
                in_flight.set(in_flight.get() + 1);
                *depth += 1;
            }
            if in_flight.get() == 0 && through_trait.is_empty() {
                assert!(pending.is_empty(), "nothing in flight and ops left");
                break;
            }
            if in_flight.get() > 0 {
                // Wait for a completion, unless there is trait work to do
                // while the kernel works.
                self.enter(usize::from(through_trait.is_empty()));
            }
            if !through_trait.is_empty() {
                let mut wanted: Vec<usize> = std::mem::take(&mut through_trait);
                wanted.sort_unstable();
                // Only the trait ops are borrowed one by one: the others'
                // memory may be in the kernel's hands.
                let mut trait_ops: Vec<(usize, &mut IoOp)> = Vec::with_capacity(wanted.len());
                let mut rest: &mut [IoOp] = &mut ops[..];
                let mut base = 0;
                for &i in &wanted {
                    let (op, tail) = std::mem::take(&mut rest)[i - base..]
                        .split_first_mut()
                        .expect("a trait op's index is in the batch");
                    trait_ops.push((i, op));
                    rest = tail;
                    base = i + 1;
                }
                let done = panic::catch_unwind(AssertUnwindSafe(|| {
                    super::batch::run_through_trait(&mut trait_ops)
                }));
                match done {
                    Ok(done) => {
                        for (i, result) in done {
                            results[i] = Some(result);
                        }
                    }
                    Err(payload) => {
                        panicked.get_or_insert(payload);
                        for i in wanted {
                            results[i].get_or_insert(Err(io::Error::other("panicked")));
                        }
                    }
                }
            }
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                let slot = slots[i].as_mut().expect("a completion for a queued op");
                in_flight.set(in_flight.get() - 1);
                depths[slot.member].1 -= 1;
                match slot.advance(cqe.result()) {
                    Next::Again => pending.push_back(i),
                    Next::Done(result) => {
                        if let Some(stats) = ops[i].member.io_stats() {
                            let elapsed = slot.queued.elapsed();
                            stats.record(slot.write, slot.len, result.is_ok(), elapsed);
                        }
                        results[i] = Some(result.map_err(|e| {
                            let what = if slot.write { "write" } else { "read" };
                            io_error(ops[i].member.name(), what, slot.offset_bytes, slot.len, e)
                        }))
                    }
                }
            }
        }
        debug_assert!(depths.iter().all(|&(_, depth)| depth == 0));

        for (i, slot) in slots.into_iter().enumerate() {
            if let Some(slot) = slot {
                slot.finish(&mut ops[i], results[i].as_ref().is_some_and(|r| r.is_ok()));
            }
        }
        if let Some(payload) = panicked {
            panic::resume_unwind(payload);
        }
        results
            .into_iter()
            .map(|r| r.expect("every op has a result"))
            .collect()
    }

    /// Submits what is queued and waits for `want` completions. With ops in
    /// flight there is no way back but to wait: an error that is not
    /// transient means a broken ring, and the process aborts (see the safety
    /// contract above).
    fn enter(&mut self, want: usize) {
        let mut busy = 0;
        loop {
            let error = match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e) => e,
            };
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EBUSY) if busy < ENTER_BUSY_MAX => {
                    busy += 1;
                    std::thread::yield_now();
                }
                _ => fatal(&error),
            }
        }
    }
}

struct AbortIfInFlight<'a>(&'a Cell<u32>);

impl Drop for AbortIfInFlight<'_> {
    fn drop(&mut self) {
        if self.0.get() > 0 {
            eprintln!(
                "uraid: a panic with {} member I/Os in flight; aborting",
                self.0.get()
            );
            std::process::abort();
        }
    }
}

fn fatal(error: &io::Error) -> ! {
    eprintln!("uraid: io_uring_enter failed with member I/O in flight ({error}); aborting");
    std::process::abort()
}

/// One op's progress on the ring.
struct Slot {
    fd: RawFd,
    write: bool,
    /// RWF_DSYNC on the write: what a block device takes as FUA.
    fua: bool,
    /// Where the data is: the op's memory, or `bounce`.
    data: *mut u8,
    len: usize,
    offset_bytes: u64,
    done_bytes: usize,
    retries: u32,
    bounce: Option<AlignedBuf>,
    /// Index into the per-member depth table.
    member: usize,
    /// When the op was queued, for the member's latency histogram.
    queued: std::time::Instant,
}

/// What an op does after a completion.
#[derive(Debug)]
enum Next {
    /// Submit again for the rest.
    Again,
    Done(io::Result<()>),
}

impl Slot {
    /// Memory that O_DIRECT would refuse is swapped for a bounce buffer here
    /// (filled now for a write, copied out in `finish` for a read).
    fn new(op: &mut IoOp, fd: RawFd, memory_align_bytes: usize, member: usize) -> Slot {
        let len = op.len_bytes();
        let (write, memory) = match &mut op.buffer {
            Buffer::Read(buf) => (false, buf.as_mut_ptr()),
            Buffer::Write(buf) => (true, buf.as_ptr().cast_mut()),
        };
        let mut bounce = None;
        let mut data = memory;
        if !is_aligned(memory, memory_align_bytes) {
            let mut staged = take_bounce(len);
            if let Buffer::Write(buf) = &op.buffer {
                staged[..len].copy_from_slice(buf);
            }
            data = staged.as_mut_ptr();
            bounce = Some(staged);
        }
        Slot {
            fd,
            write,
            fua: write && op.fua,
            data,
            len,
            offset_bytes: op.offset_bytes,
            done_bytes: 0,
            retries: 0,
            bounce,
            member,
            queued: std::time::Instant::now(),
        }
    }

    /// The SQE for what is left of the op, at most `sqe_bytes_max`.
    fn sqe(&self, user_data: u64, sqe_bytes_max: usize) -> squeue::Entry {
        assert!(self.done_bytes < self.len);
        let len = (self.len - self.done_bytes).min(sqe_bytes_max) as u32;
        // SAFETY: done_bytes < len, so the pointer stays inside the memory.
        let data = unsafe { self.data.add(self.done_bytes) };
        let at = self.offset_bytes + self.done_bytes as u64;
        let fd = types::Fd(self.fd);
        let sqe = if self.write {
            let flags = if self.fua { libc::RWF_DSYNC } else { 0 };
            opcode::Write::new(fd, data, len)
                .offset(at)
                .rw_flags(flags)
                .build()
        } else {
            opcode::Read::new(fd, data, len).offset(at).build()
        };
        sqe.user_data(user_data)
    }

    /// Accounts for one completion with result `res` (bytes, or -errno).
    fn advance(&mut self, res: i32) -> Next {
        if res < 0 {
            let errno = -res;
            if (errno == libc::EINTR || errno == libc::EAGAIN) && self.retries < RETRIES_MAX {
                self.retries += 1;
                return Next::Again;
            }
            return Next::Done(Err(io::Error::from_raw_os_error(errno)));
        }
        if res == 0 {
            // No progress on a non-empty request: the end of the file.
            let (kind, what) = if self.write {
                (io::ErrorKind::WriteZero, "wrote nothing")
            } else {
                (io::ErrorKind::UnexpectedEof, "end of file")
            };
            return Next::Done(Err(io::Error::new(
                kind,
                format!("{what} after {} bytes", self.done_bytes),
            )));
        }
        self.done_bytes += res as usize;
        assert!(
            self.done_bytes <= self.len,
            "the kernel did more than asked"
        );
        if self.done_bytes == self.len {
            Next::Done(Ok(()))
        } else {
            Next::Again
        }
    }

    /// Copies a bounced read out, and returns the bounce buffer.
    fn finish(self, op: &mut IoOp, ok: bool) {
        let Some(staged) = self.bounce else {
            return;
        };
        if let (Buffer::Read(buf), true) = (&mut op.buffer, ok) {
            buf.copy_from_slice(&staged[..self.len]);
        }
        give_bounce(staged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(len: usize, write: bool) -> Slot {
        Slot {
            fd: -1,
            write,
            fua: false,
            data: std::ptr::null_mut(),
            len,
            offset_bytes: 0,
            done_bytes: 0,
            retries: 0,
            bounce: None,
            member: 0,
            queued: std::time::Instant::now(),
        }
    }

    #[test]
    fn short_completions_resubmit_the_rest() {
        let mut s = slot(8192, false);
        assert!(matches!(s.advance(512), Next::Again));
        assert_eq!(s.done_bytes, 512);
        assert!(matches!(s.advance(4096), Next::Again));
        assert!(matches!(s.advance(3584), Next::Done(Ok(()))));
        assert_eq!(s.done_bytes, 8192);
    }

    #[test]
    fn interrupted_ops_retry_a_bounded_number_of_times() {
        let mut s = slot(4096, true);
        for _ in 0..RETRIES_MAX {
            assert!(matches!(s.advance(-libc::EINTR), Next::Again));
        }
        let Next::Done(Err(e)) = s.advance(-libc::EAGAIN) else {
            panic!("retries are bounded")
        };
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    }

    #[test]
    fn errors_and_end_of_file_fail_the_op() {
        let Next::Done(Err(e)) = slot(4096, false).advance(-libc::EIO) else {
            panic!()
        };
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        let mut s = slot(4096, false);
        assert!(matches!(s.advance(1024), Next::Again));
        let Next::Done(Err(e)) = s.advance(0) else {
            panic!()
        };
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("after 1024 bytes"), "{e}");
        let Next::Done(Err(e)) = slot(4096, true).advance(0) else {
            panic!()
        };
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    }
}
