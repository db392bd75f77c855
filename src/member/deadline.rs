//! Member I/O with a deadline: a member that does not answer in time is a
//! failed member, not a stuck array.
//!
//! A member behind a network (NBD) or a wedged controller may take an I/O
//! and never answer. The thread that made the call is then stuck in a
//! system call that nothing can interrupt, and with it the request, its
//! stripe lock and whoever waits behind them. `DeadlineMember` wraps any
//! member so that its callers never make the call themselves: each I/O is
//! handed, with a buffer of its own, to one of the member's worker threads,
//! and the caller waits for the answer until the deadline. An I/O that
//! misses it fails with `ErrorKind::TimedOut`, which the engine treats as
//! it treats an I/O error (a write fails the member at once, a read is
//! served from redundancy), and the member is *expired*: every later I/O
//! fails at once, so that nothing else waits a whole timeout for it.
//!
//! A member that can keep the deadline without a thread in between takes
//! it itself (`Member::keep_deadline`: an NBD member's requests wait for
//! their replies until their deadline) and is not wrapped; this watchdog
//! is for the rest (a member behind the fault injector, whose injected
//! hang is a call that does not return).
//!
//! The worker that made the stuck call stays stuck; when the call returns,
//! its result goes into a slot nobody reads any more and is dropped with
//! the worker's buffer: a late success is never reported to a caller that
//! was already answered with the timeout (and served from the other
//! members). The caller's own buffer is never lent to the worker, so a late
//! read cannot write into memory that was given back.
//!
//! A member comes back through `reopen`: a new wrapper (not expired) over
//! the inner member opened again, or over the same inner member when it
//! cannot be opened again (it is then probed as it is) once every call
//! that got stuck in it has returned: until then it is still hung, and a
//! probe would only leave one more thread stuck in it.

use super::{AlignedBuf, Member, MemberRef};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Workers one member may have at once: as many I/Os as that run on it
/// together; more wait in its queue (their deadline runs meanwhile).
const WORKERS_MAX: usize = 128;
/// A worker with nothing to do for this long ends.
const WORKER_IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
}

#[derive(Default)]
struct Pool {
    queue: Mutex<Queue>,
    work: Condvar,
}

impl Pool {
    fn submit(self: &Arc<Pool>, job: Job) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.jobs.push_back(job);
        if queue.jobs.len() > queue.idle && queue.threads < WORKERS_MAX {
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name("uraid-member-io".into())
                .spawn(move || pool.work());
            match spawned {
                Ok(_) => queue.threads += 1,
                Err(e) if queue.threads == 0 => {
                    // No thread to hand it to: the caller does it itself
                    // (without a deadline) rather than time out for nothing.
                    eprintln!("uraid: no thread for member I/O ({e}): done in the caller");
                    let job = queue.jobs.pop_back().expect("just pushed");
                    drop(queue);
                    job();
                    return;
                }
                Err(_) => {}
            }
        }
        drop(queue);
        self.work.notify_one();
    }

    fn work(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(job) = queue.jobs.pop_front() {
                drop(queue);
                job();
                queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            queue.idle += 1;
            let (next, waited) = self
                .work
                .wait_timeout(queue, WORKER_IDLE)
                .unwrap_or_else(PoisonError::into_inner);
            queue = next;
            queue.idle -= 1;
            if waited.timed_out() && queue.jobs.is_empty() {
                queue.threads -= 1;
                return;
            }
        }
    }
}

/// Where a worker leaves an I/O's result for its caller.
struct Answer<T> {
    result: Mutex<Option<io::Result<T>>>,
    ready: Condvar,
}

/// A member whose every I/O answers within `timeout`; see the module doc.
pub struct DeadlineMember {
    inner: MemberRef,
    timeout: Duration,
    pool: Arc<Pool>,
    expired: AtomicBool,
    /// The I/O that expired it, for the errors of those refused since.
    first: Mutex<String>,
    /// Calls handed to the inner member that have not returned, shared by
    /// every wrapper over the same inner member.
    pending: Arc<AtomicUsize>,
}

impl DeadlineMember {
    pub fn new(inner: MemberRef, timeout: Duration) -> DeadlineMember {
        DeadlineMember::sharing(inner, timeout, Arc::default())
    }

    fn sharing(inner: MemberRef, timeout: Duration, pending: Arc<AtomicUsize>) -> DeadlineMember {
        DeadlineMember {
            inner,
            timeout,
            pool: Arc::new(Pool::default()),
            expired: AtomicBool::new(false),
            first: Mutex::new(String::new()),
            pending,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether an I/O missed its deadline (every I/O fails since).
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }

    fn call<T: Send + 'static>(
        &self,
        what: &str,
        at: Option<(u64, usize)>,
        op: impl FnOnce(&dyn Member) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        self.begin(what, at, op)?()
    }

    /// Hands `op` to a worker and returns the wait for its answer, so that
    /// a caller may hand over several before waiting (a batch); the
    /// deadline counts from the handing over.
    fn begin<T: Send + 'static>(
        &self,
        what: &str,
        at: Option<(u64, usize)>,
        op: impl FnOnce(&dyn Member) -> io::Result<T> + Send + 'static,
    ) -> io::Result<impl FnOnce() -> io::Result<T> + Send + '_> {
        let place = at.map_or(String::new(), |(offset, len)| format!(" at {offset}+{len}"));
        if self.expired() {
            let first = self.first.lock().unwrap_or_else(PoisonError::into_inner);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{}: {what}{place} not sent: the member stopped answering ({first})",
                    self.name(),
                ),
            ));
        }
        let answer = Arc::new(Answer {
            result: Mutex::new(None),
            ready: Condvar::new(),
        });
        let inner = self.inner.clone();
        let slot = answer.clone();
        let pending = self.pending.clone();
        pending.fetch_add(1, Ordering::SeqCst);
        self.pool.submit(Box::new(move || {
            let result = op(&*inner);
            // Let go of the member before answering: once the caller has
            // its answer the array may stop, and a reference held a moment
            // longer here would keep the member's file claimed, refusing
            // the next open of it ("in use by another uraid process").
            drop(inner);
            pending.fetch_sub(1, Ordering::SeqCst);
            *slot.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
            slot.ready.notify_one();
        }));
        let deadline = Instant::now() + self.timeout;
        let what = what.to_string();
        Ok(move || self.wait(&answer, deadline, &what, &place))
    }

    fn wait<T>(
        &self,
        answer: &Answer<T>,
        deadline: Instant,
        what: &str,
        place: &str,
    ) -> io::Result<T> {
        let mut result = answer.result.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(done) = result.take() {
                return done;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            result = answer
                .ready
                .wait_timeout(result, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let why = format!(
            "{what}{place}: no answer within {}",
            crate::units::duration_text(self.timeout)
        );
        {
            let mut first = self.first.lock().unwrap_or_else(PoisonError::into_inner);
            if first.is_empty() {
                first.clone_from(&why);
            }
        }
        self.expired.store(true, Ordering::Release);
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{}: {why} (member timeout)", self.name()),
        ))
    }
}

impl Member for DeadlineMember {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn refresh_size(&self) -> io::Result<u64> {
        self.inner.refresh_size()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.inner.logical_block_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        super::check_io(self, offset_bytes, buf.len() as u64)?;
        let len = buf.len();
        let filled = self.call("read", Some((offset_bytes, len)), move |m| {
            let mut own = AlignedBuf::zeroed(len);
            m.read_at(&mut own, offset_bytes).map(|()| own)
        })?;
        buf.copy_from_slice(&filled);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        super::check_io(self, offset_bytes, buf.len() as u64)?;
        let own = AlignedBuf::copy_from(buf);
        self.call("write", Some((offset_bytes, buf.len())), move |m| {
            m.write_at(&own, offset_bytes)
        })
    }

    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        super::check_io(self, offset_bytes, buf.len() as u64)?;
        let own = AlignedBuf::copy_from(buf);
        self.call("write", Some((offset_bytes, buf.len())), move |m| {
            m.write_at_fua(&own, offset_bytes)
        })
    }

    fn starts_io(&self) -> bool {
        true
    }

    /// The read handed to a worker at once: the caller's buffer is filled
    /// when it waits, from the worker's own.
    fn start_read<'a>(
        &'a self,
        buf: &'a mut [u8],
        offset_bytes: u64,
    ) -> Option<super::Started<'a>> {
        let len = buf.len();
        let started = super::check_io(self, offset_bytes, len as u64).and_then(|()| {
            self.begin("read", Some((offset_bytes, len)), move |m| {
                let mut own = AlignedBuf::zeroed(len);
                m.read_at(&mut own, offset_bytes).map(|()| own)
            })
        });
        Some(Box::new(move || {
            let filled = started?()?;
            buf.copy_from_slice(&filled);
            Ok(())
        }))
    }

    fn start_write<'a>(
        &'a self,
        buf: &'a [u8],
        offset_bytes: u64,
        fua: bool,
    ) -> Option<super::Started<'a>> {
        let started = super::check_io(self, offset_bytes, buf.len() as u64).and_then(|()| {
            let own = AlignedBuf::copy_from(buf);
            self.begin(
                "write",
                Some((offset_bytes, buf.len())),
                move |m| match fua {
                    true => m.write_at_fua(&own, offset_bytes),
                    false => m.write_at(&own, offset_bytes),
                },
            )
        });
        Some(Box::new(move || started?()))
    }

    fn flush(&self) -> io::Result<()> {
        self.call("flush", None, |m| m.flush())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.call(
            "discard",
            Some((offset_bytes, len_bytes as usize)),
            move |m| m.discard(offset_bytes, len_bytes),
        )
    }

    /// The inner member's: its I/O is counted where it is done.
    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        self.inner.io_stats()
    }

    /// Not under the deadline: it ends the stuck calls (an NBD member
    /// shuts its sockets first).
    fn reconnect(&self) -> io::Result<()> {
        self.inner.reconnect()
    }

    fn reopen(&self) -> io::Result<MemberRef> {
        match self.inner.reopen() {
            Ok(inner) => Ok(Arc::new(DeadlineMember::new(inner, self.timeout))),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                let stuck = self.pending.load(Ordering::SeqCst);
                if stuck > 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "{}: {stuck} earlier I/Os have not answered yet",
                            self.name()
                        ),
                    ));
                }
                Ok(Arc::new(DeadlineMember::sharing(
                    self.inner.clone(),
                    self.timeout,
                    self.pending.clone(),
                )))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::{FaultyMember, MemoryMember};

    fn hung_member(timeout_ms: u64) -> (Arc<FaultyMember>, DeadlineMember) {
        let faulty = Arc::new(FaultyMember::new(Arc::new(MemoryMember::new(
            "m0",
            1 << 20,
            512,
        ))));
        let timed = DeadlineMember::new(faulty.clone(), Duration::from_millis(timeout_ms));
        (faulty, timed)
    }

    #[test]
    fn answers_pass_through() {
        let (_, timed) = hung_member(5_000);
        timed.write_at(&[7u8; 4096], 8192).unwrap();
        let mut back = [0u8; 4096];
        timed.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, [7u8; 4096]);
        timed.flush().unwrap();
        assert!(!timed.expired());
    }

    #[test]
    fn a_hung_io_times_out_and_later_ones_fail_at_once() {
        let (faulty, timed) = hung_member(200);
        timed.write_at(&[1u8; 512], 0).unwrap();
        faulty.apply_str("hang").unwrap();
        let mut buf = [0u8; 512];
        let err = timed.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(timed.expired());
        // A late write must never be reported: later I/O fails without
        // waiting, even once the hang is lifted.
        let started = Instant::now();
        let err = timed.write_at(&[2u8; 512], 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // Still hung: it cannot come back yet.
        assert!(timed.reopen().is_err());
        faulty.apply_str("hang:off").unwrap();
        assert!(timed.read_at(&mut buf, 0).is_err());
        let started = Instant::now();
        while timed.pending.load(Ordering::SeqCst) > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the stuck read never returned"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Reopened, it answers again (a memory member cannot be opened
        // again: the wrapper is new, the member the same).
        let back = timed.reopen().unwrap();
        back.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1u8; 512]);
    }

    /// A batch's ops go through the wrappers' started I/O: the healthy
    /// member's read is filled and its write lands, and only the hung
    /// member's op times out.
    #[test]
    fn a_batch_starts_every_op_and_only_the_hung_one_times_out() {
        use crate::member::{batch, Backend, IoOp};
        let (_, good) = hung_member(30_000);
        let (faulty, bad) = hung_member(200);
        good.write_at(&[5u8; 4096], 0).unwrap();
        faulty.apply_str("hang").unwrap();
        let data = [6u8; 4096];
        let (mut back, mut lost) = ([0u8; 4096], [0u8; 4096]);
        let mut ops = vec![
            IoOp::read(&good, 0, &mut back),
            IoOp::write(&good, 8192, &data),
            IoOp::read(&bad, 0, &mut lost),
        ];
        let results = batch::run_with(Backend::Sync, &mut ops);
        drop(ops);
        assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
        let err = results[2].as_ref().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert_eq!(back, [5u8; 4096]);
        let mut again = [0u8; 4096];
        good.read_at(&mut again, 8192).unwrap();
        assert_eq!(again, data);
        faulty.apply_str("hang:off").unwrap();
    }
}
