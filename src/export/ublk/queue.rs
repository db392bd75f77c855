//! One ublk queue: its thread owns the queue's ring (the driver takes a
//! queue's commands only from the thread that fetched first), fetches a
//! request per tag, and hands each request to the queue's workers, which
//! call the backend and give the result back through an eventfd; the
//! queue thread then commits it and fetches the tag's next request.
//!
//! A tag's buffer belongs to the driver from a fetch's submission to its
//! completion, to one worker from there to its result, and to the queue
//! thread again until the commit: never to two at once.

use super::sys::{self, IoCmd, IoDesc};
use crate::export::{BlockBackend, ZeroFlags};
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

/// The user_data of the eventfd's read (tags are below MAX_QUEUE_DEPTH).
const WAKE: u64 = u64::MAX;

/// What one queue needs to start.
pub struct QueueSetup {
    pub dev_id: u32,
    pub q_id: u16,
    pub depth: u16,
    pub buf_bytes: usize,
    pub workers: usize,
    pub backend: Arc<dyn BlockBackend>,
}

/// A request taken from the queue, for a worker.
struct Job {
    tag: u16,
    desc: IoDesc,
    buf: *mut u8,
}

// SAFETY: `buf` points into the queue's buffer area, which outlives the
// workers (they are joined before it is unmapped), and the tag's buffer is
// used by this one job until its result is committed (module comment).
unsafe impl Send for Job {}

/// The hand-over between the queue thread and its workers.
#[derive(Default)]
struct Exchange {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
    done: Mutex<Vec<(u16, i32)>>,
}

/// Memory mapped with mmap(2), unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping, owned by the result.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }

    /// The queue's request descriptors, which the driver writes.
    fn descriptors(file: &File, q_id: u16, depth: u16) -> io::Result<Mapping> {
        let len = descriptors_bytes(depth);
        // SAFETY: a read-only shared mapping of the char device at the
        // queue's offset, as the driver documents; owned by the result.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                (usize::from(q_id) * len) as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr and len are those mmap returned; nothing uses the
        // mapping after its owner is dropped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// A queue's descriptor area: depth descriptors rounded up to pages.
fn descriptors_bytes(depth: u16) -> usize {
    let page = 4096;
    (usize::from(depth) * std::mem::size_of::<IoDesc>()).div_ceil(page) * page
}

/// Runs queue `setup.q_id` until the device stops: every tag's fetch has
/// ended with IO_RES_ABORT and every worker has returned. `fetched` is
/// called once every tag's first fetch is submitted (START_DEV waits for
/// them).
pub fn run(setup: QueueSetup, char_dev: &File, fetched: impl FnOnce()) -> io::Result<()> {
    let depth = setup.depth;
    assert!(depth > 0 && depth <= sys::MAX_QUEUE_DEPTH);
    assert!(setup.buf_bytes.is_multiple_of(4096) && setup.buf_bytes > 0);
    let descs = Mapping::descriptors(char_dev, setup.q_id, depth)?;
    let buffers = Mapping::anonymous(usize::from(depth) * setup.buf_bytes)?;
    let buf_of = |tag: u16| -> *mut u8 {
        assert!(tag < depth);
        // SAFETY: within the mapping of depth * buf_bytes.
        unsafe { (buffers.ptr as *mut u8).add(usize::from(tag) * setup.buf_bytes) }
    };
    let wake = eventfd()?;
    let mut ring = IoUring::new(u32::from(depth) * 2 + 2)?;
    let exchange = Arc::new(Exchange::default());
    let workers = spawn_workers(&setup, &exchange, wake.as_raw_fd())?;
    let dev = types::Fd(char_dev.as_raw_fd());
    let io_cmd = |op: u32, tag: u16, result: i32| {
        let cmd = IoCmd {
            q_id: setup.q_id,
            tag,
            result,
            addr: buf_of(tag) as u64,
        };
        opcode::UringCmd16::new(dev, sys::io_op(op))
            .cmd(sys::bytes_of(&cmd))
            .build()
            .user_data(u64::from(tag))
    };
    let mut wake_buf = [0u8; 8];
    let wake_ptr = wake_buf.as_mut_ptr();
    let wake_read = || {
        opcode::Read::new(types::Fd(wake.as_raw_fd()), wake_ptr, 8)
            .build()
            .user_data(WAKE)
    };
    let push = |ring: &mut IoUring, entry: &io_uring::squeue::Entry| {
        // SAFETY: every buffer an entry names (a tag's buffer, wake_buf)
        // lives until the ring is dropped after the loop below.
        unsafe { ring.submission().push(entry) }.expect("the ring holds every tag and the wake")
    };
    for tag in 0..depth {
        push(&mut ring, &io_cmd(sys::IO_FETCH_REQ, tag, -1));
    }
    push(&mut ring, &wake_read());
    ring.submit()?;
    fetched();

    let mut aborted = 0usize;
    let mut result = Ok(());
    while aborted < usize::from(depth) {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (user_data, res) in completions {
            if user_data == WAKE {
                let done = std::mem::take(&mut *exchange.done.lock().unwrap());
                for (tag, res) in done {
                    push(&mut ring, &io_cmd(sys::IO_COMMIT_AND_FETCH_REQ, tag, res));
                }
                push(&mut ring, &wake_read());
                continue;
            }
            let tag = user_data as u16;
            match res {
                sys::IO_RES_OK => hand_over(&exchange, &descs, tag, buf_of(tag)),
                sys::IO_RES_ABORT => aborted += 1,
                other => {
                    result = Err(io::Error::other(format!(
                        "ublk queue {}: tag {tag} completed with {other}",
                        setup.q_id
                    )));
                    aborted += 1;
                }
            }
        }
    }
    exchange.jobs.lock().unwrap().1 = true;
    exchange.ready.notify_all();
    for worker in workers {
        let _ = worker.join();
    }
    drop(ring);
    drop(descs);
    drop(buffers);
    result
}

/// The queue's wake-up: workers write to it, the ring reads it.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) returns a new descriptor, owned by the result.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn spawn_workers(
    setup: &QueueSetup,
    exchange: &Arc<Exchange>,
    wake: i32,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    (0..setup.workers.max(1))
        .map(|i| {
            let exchange = exchange.clone();
            let backend = setup.backend.clone();
            let buf_bytes = setup.buf_bytes;
            std::thread::Builder::new()
                .name(format!("uraid-ublk{}q{}w{i}", setup.dev_id, setup.q_id))
                .spawn(move || work(&exchange, &*backend, wake, buf_bytes))
        })
        .collect()
}

/// A fetch completed with a request for `tag`: its descriptor goes to a
/// worker with the tag's buffer.
fn hand_over(exchange: &Exchange, descs: &Mapping, tag: u16, buf: *mut u8) {
    // SAFETY: the driver wrote this tag's descriptor before completing its
    // fetch; the area holds the queue's depth of descriptors, and the tag
    // is below it (run asserts it in buf_of).
    let desc = unsafe {
        (descs.ptr as *const IoDesc)
            .add(usize::from(tag))
            .read_volatile()
    };
    exchange
        .jobs
        .lock()
        .unwrap()
        .0
        .push_back(Job { tag, desc, buf });
    exchange.ready.notify_one();
}

/// A worker: takes requests, serves them from the backend, hands the
/// results back and wakes the queue thread.
fn work(exchange: &Exchange, backend: &dyn BlockBackend, wake: i32, buf_bytes: usize) {
    loop {
        let job = {
            let mut jobs = exchange.jobs.lock().unwrap();
            loop {
                if let Some(job) = jobs.0.pop_front() {
                    break job;
                }
                if jobs.1 {
                    return;
                }
                jobs = exchange.ready.wait(jobs).unwrap();
            }
        };
        let res = serve(backend, &job, buf_bytes);
        exchange.done.lock().unwrap().push((job.tag, res));
        let one: u64 = 1;
        // SAFETY: an 8-byte write to the queue's eventfd, which outlives
        // the workers.
        unsafe { libc::write(wake, &one as *const u64 as *const libc::c_void, 8) };
    }
}

/// One request: bytes moved (reads and writes) or 0, else -errno.
fn serve(backend: &dyn BlockBackend, job: &Job, buf_bytes: usize) -> i32 {
    let op = job.desc.op_flags & 0xff;
    let offset = job.desc.start_sector << 9;
    let len = u64::from(job.desc.nr_sectors) << 9;
    let fua = job.desc.op_flags & sys::IO_F_FUA != 0;
    let data = |len: u64| {
        assert!(
            len as usize <= buf_bytes,
            "a request larger than max_sectors"
        );
        // SAFETY: the tag's buffer, this job's alone (module comment),
        // buf_bytes long.
        unsafe { std::slice::from_raw_parts_mut(job.buf, len as usize) }
    };
    let done = match op {
        sys::IO_OP_READ => backend.read(offset, data(len)).map(|()| len),
        sys::IO_OP_WRITE if backend.read_only() => Err(io::Error::from_raw_os_error(libc::EROFS)),
        sys::IO_OP_WRITE => backend.write(offset, data(len), fua).map(|()| len),
        sys::IO_OP_FLUSH => backend.flush().map(|()| 0),
        sys::IO_OP_DISCARD if backend.read_only() => Err(io::Error::from_raw_os_error(libc::EROFS)),
        sys::IO_OP_DISCARD => backend.trim(offset, len).map(|()| 0),
        sys::IO_OP_WRITE_ZEROES if backend.read_only() => {
            Err(io::Error::from_raw_os_error(libc::EROFS))
        }
        sys::IO_OP_WRITE_ZEROES => {
            let flags = ZeroFlags {
                fua,
                may_trim: job.desc.op_flags & sys::IO_F_NOUNMAP == 0,
            };
            backend.write_zeroes(offset, len, flags).map(|()| 0)
        }
        _ => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
    };
    match done {
        Ok(bytes) => bytes as i32,
        Err(e) => -e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO),
    }
}
