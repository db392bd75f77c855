//! The fast path for small reads (seed 002's FastPath): a read that the
//! backend maps to plain files (`BlockBackend::read_extents` with
//! `ExtentUse::Read`) is started on the connection's io_uring by the worker
//! that read its request, which goes straight on to the next request
//! instead of waiting. Whichever worker holds the connection's reader
//! collects finished reads (it watches the ring beside the socket) and
//! answers them, many in one send.
//!
//! Why: with a thread per request in flight, every small read cost a
//! thread hand-off and a sleep and wake-up for its one member I/O; at
//! queue depth 32 on a 2-core machine that, not the disk, was the limit
//! (docs/BENCHMARKS.md, "Fast path"). Here one thread keeps every read in
//! flight and wakes once for however many finish together.
//!
//! Bounds: RING_ENTRIES member reads in flight per connection (the
//! completion queue has twice as many, so it cannot overflow),
//! EXTENTS_MAX member reads per request, and the connection's in-flight
//! budget, which these reads count against as every request does.
//!
//! Safety contract for the `unsafe` here: an SQE points into the buffer of
//! an `Op` in `FastReads::ops`, which is neither dropped nor moved (its
//! buffer is a separate heap allocation that moving the `Op` leaves in
//! place) until every SQE of that op has completed. `FastReads` is not
//! dropped with reads in flight: `Drop` waits for them, and aborts the
//! process if the ring fails so that it cannot (the kernel would write
//! into freed memory).

use crate::export::FileExtent;
use crate::member::AlignedBuf;
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Member reads in flight on one connection's ring.
const RING_ENTRIES: u32 = 256;
/// Member reads one request may take; a request needing more is read by
/// a worker (it is large, and the copy, not the wait, is its cost).
pub(super) const EXTENTS_MAX: usize = 16;
/// The longest read taken: beyond it, reads are spliced or copied by a
/// worker, which costs no more than the I/O.
pub(super) const READ_MAX: usize = 64 << 10;
/// Spare buffers kept for reuse; a read needs one of at most READ_MAX.
const BUFFERS_KEPT: usize = 64;
/// io_uring_enter's flag to wait for completions.
const ENTER_GETEVENTS: u32 = 1;
/// io_uring_enter calls in a row that are interrupted or find the kernel
/// short of memory before the process gives up.
const ENTER_RETRIES_MAX: u32 = 100_000;

/// A read in flight.
struct Op {
    cookie: u64,
    offset: u64,
    len: usize,
    /// The connection's in-flight charge, released when it is answered.
    cost: u64,
    buf: AlignedBuf,
    /// Where its bytes are read from; they keep the members' descriptors
    /// open until every read is done.
    extents: Vec<FileExtent>,
    /// Member reads not yet completed.
    remaining: usize,
    /// A member read failed or came back short.
    failed: bool,
    /// When its reads were queued, for the members' latency counters.
    queued: std::time::Instant,
}

/// A read that has finished: its bytes are in `buf[..len]` unless it
/// `failed`, and then the caller reads them the slow way.
pub(super) struct Done {
    pub(super) cookie: u64,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) cost: u64,
    pub(super) buf: AlignedBuf,
    pub(super) failed: bool,
    /// When its reads were queued: the request's time on the ring.
    pub(super) queued: std::time::Instant,
}

/// A connection's ring and the reads on it. Used only by the worker that
/// holds the connection's reader, so it needs no lock of its own.
pub(super) struct FastReads {
    ring: IoUring,
    /// Reads in flight, indexed by an SQE's user data.
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Member reads submitted or queued and not yet completed.
    in_flight: usize,
    /// Member reads queued in the SQ and not yet submitted.
    queued: u32,
    buffers: Vec<AlignedBuf>,
}

impl FastReads {
    pub(super) fn new() -> io::Result<FastReads> {
        Ok(FastReads {
            ring: IoUring::new(RING_ENTRIES)?,
            ops: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            queued: 0,
            buffers: Vec::new(),
        })
    }

    /// The ring's descriptor: readable when reads have finished.
    pub(super) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Whether any read is in flight (answered by `reap` later).
    pub(super) fn busy(&self) -> bool {
        self.in_flight > 0
    }

    /// Whether `extents` more member reads fit in the ring now.
    pub(super) fn has_room(&self, extents: usize) -> bool {
        self.in_flight + extents <= RING_ENTRIES as usize
    }

    /// Queues the member reads of a request (submitted by `submit`). The
    /// caller has made room (`has_room`).
    pub(super) fn start(
        &mut self,
        cookie: u64,
        offset: u64,
        len: usize,
        cost: u64,
        extents: Vec<FileExtent>,
    ) {
        assert!(len > 0 && len <= READ_MAX);
        assert!(!extents.is_empty() && extents.len() <= EXTENTS_MAX);
        assert!(self.has_room(extents.len()));
        assert_eq!(extents.iter().map(|e| e.len).sum::<usize>(), len);
        let mut buf = match self.buffers.pop() {
            Some(buf) => buf,
            None => AlignedBuf::zeroed(READ_MAX),
        };
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        let mut at = 0;
        let mut sq = self.ring.submission();
        for (i, extent) in extents.iter().enumerate() {
            // SAFETY: buf[at..at + len] stays valid until this op's SQEs
            // have all completed (the module's safety contract).
            let dst = buf[at..at + extent.len].as_mut_ptr();
            let entry = opcode::Read::new(types::Fd(extent.fd), dst, extent.len as u32)
                .offset(extent.offset)
                .build()
                .user_data(user_data(index, i));
            // SAFETY: as above; the SQ has room (has_room counts every
            // entry in flight, queued ones included).
            unsafe { sq.push(&entry) }.expect("the ring has room for what has_room allowed");
            at += extent.len;
        }
        drop(sq);
        self.in_flight += extents.len();
        self.queued += extents.len() as u32;
        self.ops[index] = Some(Op {
            cookie,
            offset,
            len,
            cost,
            remaining: extents.len(),
            extents,
            buf,
            failed: false,
            queued: std::time::Instant::now(),
        });
    }

    /// Hands queued reads to the kernel. Called before the worker holding
    /// the reader may block, so that nothing queued waits for it.
    pub(super) fn submit(&mut self) {
        let mut tries = 0;
        while self.queued > 0 {
            match self.ring.submit() {
                Ok(n) => self.queued -= (n as u32).min(self.queued),
                Err(e) => retry_or_fail(e, &mut tries),
            }
        }
    }

    /// Collects the reads that have finished. With `wait`, first submits
    /// what is queued and waits until at least one has (if any is in
    /// flight).
    pub(super) fn reap(&mut self, wait: bool) -> Vec<Done> {
        if wait {
            self.submit();
        }
        if wait && self.in_flight > 0 && self.ring.completion().is_empty() {
            let mut tries = 0;
            loop {
                // SAFETY: enter with nothing to submit only waits; no
                // argument is passed.
                let waited = unsafe {
                    self.ring
                        .submitter()
                        .enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
                };
                match waited {
                    Ok(_) => break,
                    Err(e) => retry_or_fail(e, &mut tries),
                }
            }
        }
        let mut done = Vec::new();
        let finished: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (data, result) in finished {
            let (index, extent) = split_user_data(data);
            self.in_flight -= 1;
            let op = self.ops[index]
                .as_mut()
                .expect("a completion is for an op in flight");
            op.remaining -= 1;
            // Every extent lies inside its member, so a short read is a
            // failure too (the file shrank under it): the slow path, which
            // knows what to do with a member that fails, reads it again.
            let ok = result >= 0 && result as usize == op.extents[extent].len;
            if !ok {
                op.failed = true;
            }
            let run = &op.extents[extent];
            if let Some(stats) = run.member.as_ref().and_then(|m| m.io_stats()) {
                stats.record(false, run.len, ok, op.queued.elapsed());
            }
            if op.remaining == 0 {
                let op = self.ops[index].take().expect("checked above");
                self.free.push(index);
                done.push(Done {
                    cookie: op.cookie,
                    offset: op.offset,
                    len: op.len,
                    cost: op.cost,
                    buf: op.buf,
                    failed: op.failed,
                    queued: op.queued,
                });
            }
        }
        done
    }

    /// Takes back a finished read's buffer for the next read.
    pub(super) fn recycle(&mut self, buf: AlignedBuf) {
        if self.buffers.len() < BUFFERS_KEPT && buf.len() >= READ_MAX {
            self.buffers.push(buf);
        }
    }
}

/// An SQE's user data: the op's index and which of its extents it reads.
fn user_data(op: usize, extent: usize) -> u64 {
    assert!(extent < EXTENTS_MAX);
    (op as u64) * EXTENTS_MAX as u64 + extent as u64
}

fn split_user_data(data: u64) -> (usize, usize) {
    (
        (data / EXTENTS_MAX as u64) as usize,
        (data % EXTENTS_MAX as u64) as usize,
    )
}

/// An interrupted enter, or one that found the kernel short of memory, is
/// tried again, up to ENTER_RETRIES_MAX times in a row. (The completion
/// queue cannot overflow, so EBUSY does not happen; it is retried the same
/// way.) Anything else is fatal.
fn retry_or_fail(e: io::Error, tries: &mut u32) {
    let again = matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    );
    *tries += 1;
    if !again || *tries > ENTER_RETRIES_MAX {
        fatal(&e);
    }
}

/// The ring failed with reads in flight into memory this process owns:
/// nothing can be freed safely, so the process ends.
fn fatal(e: &io::Error) -> ! {
    eprintln!("uraid nbd: the fast path's io_uring failed with reads in flight: {e}; aborting");
    std::process::abort()
}

impl Drop for FastReads {
    fn drop(&mut self) {
        while self.in_flight > 0 {
            // Answers are no longer possible; the reads only have to end.
            for done in self.reap(true) {
                drop(done);
            }
        }
    }
}
