//! Batched member I/O: reads and writes on several members that may run at
//! the same time, so that a stripe on 8 members costs about one member's
//! latency instead of eight.
//!
//! `run` takes a set of `IoOp`s and returns one result per op, in the same
//! order. Ops on members that expose a descriptor (`Member::raw_io`: files
//! and block devices) go through this thread's io_uring, all submitted
//! together, at most `uring::MEMBER_DEPTH_MAX` in flight per member; ops on
//! other members (memory, the fault injector, the throttle) go through the
//! `Member` trait one after another while the ring works, so that wrappers
//! keep their behaviour. Where io_uring cannot be set up (no kernel support,
//! seccomp, containers, `kernel.io_uring_disabled`) the whole process falls
//! back to the trait (pread/pwrite) the first time, with one line in the log.
//! `URAID_IO=uring` or `URAID_IO=sync` forces a backend, for tests and
//! benchmarks; with `uring` forced and unavailable, every op fails.
//!
//! The ops of one batch may complete in any order: two ops on one member must
//! not overlap unless both are reads (asserted). An op that fails does not
//! stop the others; its error names the member, the operation and where.
//! Memory need not be aligned, but `AlignedBuf`s save a copy on O_DIRECT
//! members.
//!
//! ```
//! use uraid::member::{batch, AlignedBuf, IoOp, Member, MemberRef, MemoryMember};
//! use std::sync::Arc;
//!
//! let members: Vec<MemberRef> = (0..4)
//!     .map(|i| Arc::new(MemoryMember::new(&format!("m{i}"), 1 << 20, 512)) as MemberRef)
//!     .collect();
//! // Write one 64 KiB strip to each member at the same offset...
//! let strips: Vec<AlignedBuf> = (0..4u8).map(|i| AlignedBuf::copy_from(&[i; 65536])).collect();
//! let mut ops: Vec<IoOp> = members
//!     .iter()
//!     .zip(&strips)
//!     .map(|(m, strip)| IoOp::write(m.as_ref(), 4096, strip))
//!     .collect();
//! for result in batch::run(&mut ops) {
//!     result.expect("write");
//! }
//! // ...and read them back, in one batch too.
//! let mut back: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::zeroed(65536)).collect();
//! let mut ops: Vec<IoOp> = members
//!     .iter()
//!     .zip(back.iter_mut())
//!     .map(|(m, buf)| IoOp::read(m.as_ref(), 4096, buf))
//!     .collect();
//! assert!(batch::run(&mut ops).iter().all(|r| r.is_ok()));
//! assert!(back.iter().zip(&strips).all(|(b, s)| b[..] == s[..]));
//! ```

use super::{uring, Member};
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The memory of one op: filled by a read, sent by a write.
pub enum Buffer<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// One read or write of a member, at a byte offset that is a multiple of
/// the member's logical block, of a whole number of blocks.
pub struct IoOp<'a> {
    pub member: &'a dyn Member,
    pub offset_bytes: u64,
    pub buffer: Buffer<'a>,
    /// A write done only once its bytes are durable (NBD's FUA flag,
    /// RWF_DSYNC on a file), not flushed with everything else later.
    pub fua: bool,
}

impl<'a> IoOp<'a> {
    pub fn read(member: &'a dyn Member, offset_bytes: u64, buf: &'a mut [u8]) -> IoOp<'a> {
        IoOp {
            member,
            offset_bytes,
            buffer: Buffer::Read(buf),
            fua: false,
        }
    }

    pub fn write(member: &'a dyn Member, offset_bytes: u64, buf: &'a [u8]) -> IoOp<'a> {
        IoOp {
            member,
            offset_bytes,
            buffer: Buffer::Write(buf),
            fua: false,
        }
    }

    /// A write with FUA: see [`IoOp::fua`].
    pub fn write_fua(member: &'a dyn Member, offset_bytes: u64, buf: &'a [u8]) -> IoOp<'a> {
        IoOp {
            fua: true,
            ..IoOp::write(member, offset_bytes, buf)
        }
    }

    pub fn len_bytes(&self) -> usize {
        match &self.buffer {
            Buffer::Read(buf) => buf.len(),
            Buffer::Write(buf) => buf.len(),
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(self.buffer, Buffer::Write(_))
    }

    /// Does the op through the `Member` trait, synchronously.
    pub(super) fn run_through_trait(&mut self) -> io::Result<()> {
        match &mut self.buffer {
            Buffer::Read(buf) => super::stats::read_at(self.member, buf, self.offset_bytes),
            Buffer::Write(buf) if self.fua => {
                super::stats::write_at_fua(self.member, buf, self.offset_bytes)
            }
            Buffer::Write(buf) => super::stats::write_at(self.member, buf, self.offset_bytes),
        }
    }
}

/// How batched I/O reaches the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// This thread's io_uring, for members with a descriptor.
    Uring,
    /// One op after another through the `Member` trait (pread/pwrite).
    Sync,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uring => "io_uring",
            Backend::Sync => "sync",
        }
    }
}

/// Runs every op and returns their results in order; see the module doc.
pub fn run(ops: &mut [IoOp]) -> Vec<io::Result<()>> {
    match forced_backend() {
        Some(backend) => run_with(backend, ops),
        None => PROCESS.run(ops, &uring::Ring::new),
    }
}

/// Runs every op with the given backend, whatever the process chose. With
/// `Backend::Uring` and no io_uring, every op fails.
pub fn run_with(backend: Backend, ops: &mut [IoOp]) -> Vec<io::Result<()>> {
    assert_disjoint(ops);
    match backend {
        Backend::Sync => run_sync(ops),
        Backend::Uring => match uring::run(ops, &uring::Ring::new) {
            Ok(results) => results,
            Err(e) => ops
                .iter()
                .map(|op| {
                    Err(io::Error::new(
                        e.kind(),
                        format!("{}: io_uring is unavailable: {e}", op.member.name()),
                    ))
                })
                .collect(),
        },
    }
}

/// The backend `run` uses from now on. When nothing has decided it yet, this
/// sets up the calling thread's ring to find out (so that a server can say
/// which one it uses when it starts).
pub fn backend() -> Backend {
    if let Some(backend) = forced_backend() {
        return backend;
    }
    PROCESS.run(&mut [], &uring::Ring::new);
    PROCESS.current()
}

fn run_sync(ops: &mut [IoOp]) -> Vec<io::Result<()>> {
    let mut results: Vec<Option<io::Result<()>>> = ops.iter().map(|_| None).collect();
    let mut all: Vec<(usize, &mut IoOp)> = ops.iter_mut().enumerate().collect();
    for (i, result) in run_through_trait(&mut all) {
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|r| r.expect("every op has a result"))
        .collect()
}

/// Bytes a batch of trait ops must move before its members are worked in
/// parallel: below it a thread per member costs more than it saves.
const PARALLEL_MIN_BYTES: usize = 1 << 20;
/// Most threads one batch of trait ops starts.
const PARALLEL_MEMBERS_MAX: usize = 64;

/// Runs ops through the `Member` trait, returning each op's index (the
/// first of its pair) and result. Ops of members that can start an I/O
/// without the caller (`Member::start_read`: network members behind their
/// deadline) are all started first and waited for last, so that a stripe's
/// requests to its hosts are on the wire together, not one round trip
/// after another; the others run as `run_in_caller` says.
pub(super) fn run_through_trait(ops: &mut [(usize, &mut IoOp)]) -> Vec<(usize, io::Result<()>)> {
    if ops.len() < 2 {
        return run_in_caller(ops);
    }
    let mut started = Vec::new();
    let mut rest: Vec<(usize, &mut IoOp)> = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter_mut() {
        let member: &dyn Member = op.member;
        let (write, len) = (op.is_write(), op.len_bytes());
        if !member.starts_io() {
            rest.push((*i, &mut **op));
            continue;
        }
        let start = match &mut op.buffer {
            Buffer::Read(buf) => member.start_read(buf, op.offset_bytes),
            Buffer::Write(buf) => member.start_write(buf, op.offset_bytes, op.fua),
        };
        let wait = start.expect("a member that starts I/O starts every op");
        started.push((*i, Instant::now(), wait, member, write, len));
    }
    let mut results = run_in_caller(&mut rest);
    for (i, began, wait, member, write, len) in started {
        let result = wait();
        if let Some(stats) = member.io_stats() {
            stats.record(write, len, result.is_ok(), began.elapsed());
        }
        results.push((i, result));
    }
    results
}

/// Runs ops through the `Member` trait in the calling thread. Ops of one
/// member run in order; the
/// members of a large batch run at the same time, one thread each, as the
/// disks they stand for would: a throttle or an injected latency on each
/// of 24 members must cost a rebuild one member's wait, not 24 in turn.
/// A panic in a member's op is resumed once every thread has ended.
fn run_in_caller(ops: &mut [(usize, &mut IoOp)]) -> Vec<(usize, io::Result<()>)> {
    let bytes: usize = ops.iter().map(|(_, op)| op.len_bytes()).sum();
    // Members in memory never wait: their ops are copies, and a thread
    // per member costs more to start than it saves (two per 1 MiB read
    // of a raid0 on tmpfs, 8,000 thread starts for 4,000 reads).
    let waits = ops.iter().any(|(_, op)| !op.member.in_memory());
    let mut groups: Vec<Vec<&mut (usize, &mut IoOp)>> = Vec::new();
    let mut keys: Vec<*const ()> = Vec::new();
    for entry in ops.iter_mut() {
        let key = entry.1.member as *const dyn Member as *const ();
        match keys.iter().position(|k| *k == key) {
            Some(at) => groups[at].push(entry),
            None => {
                keys.push(key);
                groups.push(vec![entry]);
            }
        }
    }
    let serial = groups.len() < 2 || bytes < PARALLEL_MIN_BYTES || !waits;
    let run_group = |group: Vec<&mut (usize, &mut IoOp)>| -> Vec<(usize, io::Result<()>)> {
        group
            .into_iter()
            .map(|(i, op)| (*i, op.run_through_trait()))
            .collect()
    };
    if serial {
        return groups.into_iter().flat_map(run_group).collect();
    }
    let mut results = Vec::with_capacity(ops_len(&groups));
    for wave in chunk_groups(groups, PARALLEL_MEMBERS_MAX) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = wave
                .into_iter()
                .map(|group| scope.spawn(move || run_group(group)))
                .collect();
            let mut panicked = None;
            for handle in handles {
                match handle.join() {
                    Ok(done) => results.extend(done),
                    Err(payload) => {
                        panicked.get_or_insert(payload);
                    }
                }
            }
            if let Some(payload) = panicked {
                std::panic::resume_unwind(payload);
            }
        });
    }
    results
}

fn ops_len<T>(groups: &[Vec<T>]) -> usize {
    groups.iter().map(Vec::len).sum()
}

/// Splits `groups` into waves of at most `max` groups.
fn chunk_groups<T>(groups: Vec<T>, max: usize) -> Vec<Vec<T>> {
    assert!(max >= 1);
    let mut waves: Vec<Vec<T>> = Vec::new();
    for group in groups {
        match waves.last_mut() {
            Some(wave) if wave.len() < max => wave.push(group),
            _ => waves.push(vec![group]),
        }
    }
    waves
}

/// Two ops of one batch on one member may run in either order, so they
/// must not overlap unless both only read. Checking costs n² comparisons of
/// a few integers, nothing next to one system call for batches of stripe
/// size.
fn assert_disjoint(ops: &[IoOp]) {
    for (i, a) in ops.iter().enumerate() {
        for b in &ops[i + 1..] {
            if !std::ptr::addr_eq(a.member, b.member) || !(a.is_write() || b.is_write()) {
                continue;
            }
            let a_end = a.offset_bytes + a.len_bytes() as u64;
            let b_end = b.offset_bytes + b.len_bytes() as u64;
            assert!(
                a_end <= b.offset_bytes || b_end <= a.offset_bytes,
                "{}: ops at {}+{} and {}+{} of one batch overlap and one writes",
                a.member.name(),
                a.offset_bytes,
                a.len_bytes(),
                b.offset_bytes,
                b.len_bytes()
            );
        }
    }
}

const UNDECIDED: u8 = 0;
const URING: u8 = 1;
const SYNC: u8 = 2;

/// The process's choice of backend: undecided until a ring is set up or
/// fails to be. A failure for a reason that does not go away while the
/// process runs (ENOSYS, EPERM from seccomp or the sysctl, EINVAL from a
/// kernel before the probe, a kernel without the operations) is final for
/// the process. Any other (ENOMEM
/// from the locked-memory limit of kernels before 5.12, EMFILE) is this
/// thread's for now: its next RING_RETRY_BATCHES batches use
/// pread/pwrite, then it tries again, and other threads keep their rings.
pub(super) struct Selector {
    state: AtomicU8,
}

static PROCESS: Selector = Selector::new();

impl Selector {
    pub(super) const fn new() -> Selector {
        Selector {
            state: AtomicU8::new(UNDECIDED),
        }
    }

    pub(super) fn current(&self) -> Backend {
        match self.state.load(Ordering::Relaxed) {
            SYNC => Backend::Sync,
            _ => Backend::Uring,
        }
    }

    /// Runs the ops on this thread's ring (made with `make_ring` if the
    /// thread has none), or through the trait once the ring has failed.
    pub(super) fn run(
        &self,
        ops: &mut [IoOp],
        make_ring: &dyn Fn() -> io::Result<uring::Ring>,
    ) -> Vec<io::Result<()>> {
        assert_disjoint(ops);
        if self.state.load(Ordering::Relaxed) == SYNC {
            return run_sync(ops);
        }
        let waiting = RING_RETRY_IN.with(|n| {
            let left = n.get();
            n.set(left.saturating_sub(1));
            left > 0
        });
        if waiting {
            return run_sync(ops);
        }
        match uring::run(ops, make_ring) {
            Ok(results) => {
                let _ = self.state.compare_exchange(
                    UNDECIDED,
                    URING,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                results
            }
            // No op has been started: the setup failed before any.
            Err(e) if setup_failure_is_final(&e) => {
                if self.state.swap(SYNC, Ordering::Relaxed) != SYNC {
                    eprintln!("uraid: io_uring is unavailable ({e}); member I/O uses pread/pwrite");
                }
                run_sync(ops)
            }
            Err(e) => {
                RING_RETRY_IN.with(|n| n.set(RING_RETRY_BATCHES));
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "uraid: a thread could not set up its io_uring ({e}); its member I/O \
                         uses pread/pwrite until a later try succeeds"
                    )
                });
                run_sync(ops)
            }
        }
    }
}

/// Batches a thread runs with pread/pwrite after its ring could not be
/// set up for a passing reason, before it tries again (a setup is a few
/// system calls; trying at every batch would cost more than the I/O).
const RING_RETRY_BATCHES: u32 = 256;

thread_local! {
    /// Batches this thread still runs without a ring (see RING_RETRY_BATCHES).
    static RING_RETRY_IN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a ring's setup failed for a reason the process cannot outlive:
/// no io_uring in the kernel, forbidden (seccomp, kernel.io_uring_disabled),
/// or without the operations uraid needs.
fn setup_failure_is_final(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS)
            | Some(libc::EPERM)
            | Some(libc::EACCES)
            | Some(libc::EOPNOTSUPP)
            // io_uring_setup's parameters or the probe (Linux 5.6) refused:
            // the kernel is what it is.
            | Some(libc::EINVAL)
    ) || e.kind() == io::ErrorKind::Unsupported
}

/// URAID_IO, read once: `uring`, `sync`, or unset/empty for the automatic
/// choice. Another value is reported once and ignored.
fn forced_backend() -> Option<Backend> {
    static FORCED: OnceLock<Option<Backend>> = OnceLock::new();
    *FORCED.get_or_init(|| {
        let value = std::env::var("URAID_IO").unwrap_or_default();
        parse_backend(&value).unwrap_or_else(|why| {
            eprintln!("uraid: {why}; choosing the I/O backend automatically");
            None
        })
    })
}

fn parse_backend(value: &str) -> Result<Option<Backend>, String> {
    match value {
        "" => Ok(None),
        "uring" | "io_uring" => Ok(Some(Backend::Uring)),
        "sync" => Ok(Some(Backend::Sync)),
        other => Err(format!("URAID_IO={other:?} is not uring or sync")),
    }
}

#[cfg(test)]
mod tests;
