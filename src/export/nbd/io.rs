//! Socket I/O for connections: non-blocking sockets driven by poll(2), so
//! that every wait can also watch the server's shutdown pipe and a deadline.
//!
//! A blocking read cannot be interrupted portably from another thread, and a
//! blocking write to a client that stopped reading would hang a worker (and
//! with it shutdown) forever. With O_NONBLOCK plus poll, a reader gives up
//! when the server stops or a client stalls mid-message, and a writer gives
//! up after a timeout.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Why a read did not deliver the bytes asked for.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed the connection before sending anything of this
    /// message (a clean end, when it happens between messages).
    Eof,
    /// The peer closed the connection part way through a message.
    Truncated {
        have: usize,
        need: usize,
    },
    /// The server is shutting down.
    Stopped,
    /// The deadline passed.
    TimedOut,
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Eof => write!(f, "connection closed by the client"),
            ReadError::Truncated { have, need } => {
                write!(
                    f,
                    "connection closed by the client mid-message ({have} of {need} bytes)"
                )
            }
            ReadError::Stopped => write!(f, "server shutting down"),
            ReadError::TimedOut => write!(f, "timed out waiting for the client"),
            ReadError::Io(e) => write!(f, "read error: {e}"),
        }
    }
}

/// A connected socket (unix or TCP), non-blocking.
pub(crate) struct Sock {
    fd: OwnedFd,
}

impl Sock {
    pub(crate) fn new(fd: OwnedFd) -> io::Result<Sock> {
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Sock { fd })
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether the peer runs on this host: a unix socket, or TCP from a
    /// loopback address or from the address it reached. Such a client
    /// copies every byte out of the socket on this host's CPUs.
    pub(crate) fn peer_on_this_host(&self) -> bool {
        use std::net::{IpAddr, SocketAddr};
        // SAFETY: the descriptor is ours and lives in `self`; ManuallyDrop
        // keeps the borrowed stream from closing it.
        let stream = std::mem::ManuallyDrop::new(unsafe {
            <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(self.raw())
        });
        let ip = |a: io::Result<SocketAddr>| {
            a.ok().map(|a| match a.ip() {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
                v4 => v4,
            })
        };
        match (ip(stream.peer_addr()), ip(stream.local_addr())) {
            (Some(peer), Some(local)) => peer.is_loopback() || peer == local,
            // Not an IP socket: a unix socket (or the TLS relay's pair).
            _ => true,
        }
    }

    /// Shuts down both directions, which makes a blocked poll on either side
    /// return and the peer see the connection end at once.
    pub(crate) fn shutdown(&self) {
        // SAFETY: shutdown on a descriptor we own; errors (already closed by
        // the peer) do not matter.
        unsafe {
            libc::shutdown(self.raw(), libc::SHUT_RDWR);
        }
    }

    /// One recv(2); `WouldBlock` when nothing is available.
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid for buf.len() bytes.
            let n = unsafe { libc::recv(self.raw(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Sends all of `bufs` (gathered, so a reply header and its data go out
    /// in one system call when the socket has room), waiting up to `timeout`
    /// each time the socket buffer is full.
    ///
    /// MSG_NOSIGNAL turns a write to a closed connection into EPIPE instead of
    /// a SIGPIPE that would kill the whole process.
    /// After a send on the nonblocking socket failed with `err`: Ok to try
    /// again (interrupted, or there is room now), or the error to give up
    /// with (the client has not read its replies within `timeout`).
    fn retry_send(&self, err: io::Error, timeout: Option<Duration>) -> io::Result<()> {
        match err.kind() {
            io::ErrorKind::Interrupted => Ok(()),
            io::ErrorKind::WouldBlock => {
                let deadline = timeout.map(|t| Instant::now() + t);
                match poll_one(self.raw(), libc::POLLOUT, None, deadline)? {
                    PollResult::Ready => Ok(()),
                    PollResult::TimedOut => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client has not read its replies for too long",
                    )),
                    PollResult::Woken => unreachable!("no wake descriptor given"),
                }
            }
            _ => Err(err),
        }
    }

    pub(crate) fn send_all(&self, bufs: &[&[u8]], timeout: Option<Duration>) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b))
            .collect();
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        while !rest.is_empty() {
            // SAFETY: msghdr is plain data; the iovec array is IoSlice, which
            // is ABI-compatible with iovec on unix.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = rest.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = rest.len().min(1024) as _;
            // SAFETY: msg points at valid iovecs for the duration of the call.
            let n = unsafe { libc::sendmsg(self.raw(), &msg, libc::MSG_NOSIGNAL) };
            if n < 0 {
                self.retry_send(io::Error::last_os_error(), timeout)?;
                continue;
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "sendmsg wrote nothing",
                ));
            }
            IoSlice::advance_slices(&mut rest, n as usize);
        }
        Ok(())
    }
}

/// A pipe that stages the bytes of a spliced read reply (see
/// [`Sock::send_spliced`]): page references, not copies. Both ends are
/// non-blocking, so that staging more than it holds fails rather than
/// waits.
pub(crate) struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl SplicePipe {
    /// A pipe that holds at least `bytes`, or why not (the system's
    /// pipe-max-size may be smaller).
    pub(crate) fn new(bytes: usize) -> io::Result<SplicePipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors that we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        use std::os::fd::FromRawFd;
        // SAFETY: both descriptors are fresh and ours.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = i32::try_from(bytes).map_err(|_| io::Error::other("pipe too large"))?;
        // SAFETY: fcntl on a descriptor we own.
        let got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(SplicePipe {
            read,
            write,
            capacity: got as usize,
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Moves `len` bytes at `offset` of the file `fd` into the pipe. The
    /// pipe must have room (a staged reply is at most its capacity);
    /// anything short is an error, after which the pipe holds a partial
    /// reply and must be dropped.
    pub(crate) fn fill_from(&self, fd: RawFd, offset: u64, len: usize) -> io::Result<()> {
        let mut off = i64::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        let mut left = len;
        while left > 0 {
            // SAFETY: plain descriptors; `off` is a valid i64 we own.
            let n = unsafe {
                libc::splice(
                    fd,
                    &mut off,
                    self.write.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "end of file while splicing",
                ));
            }
            left -= n as usize;
        }
        Ok(())
    }

    /// Writes what of `bytes` fits (a copy into the pipe's pages); 0 when
    /// it is full.
    fn write_some(&self, bytes: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: bytes is valid for bytes.len() bytes.
            let n =
                unsafe { libc::write(self.write.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        }
    }

    /// Whether another buffer fits in the pipe. Bytes spliced from a
    /// socket come as the socket's fragments, each taking a slot however
    /// short, so a pipe may be full before `capacity` bytes.
    fn has_room(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.write.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no wait.
        unsafe { libc::poll(&mut fd, 1, 0) == 1 && fd.revents & libc::POLLOUT != 0 }
    }

    /// Takes exactly `out.len()` bytes from the front of the pipe, by copy.
    pub(crate) fn read_exact(&self, out: &mut [u8]) -> io::Result<()> {
        let mut have = 0;
        while have < out.len() {
            let rest = &mut out[have..];
            // SAFETY: rest is valid for rest.len() bytes.
            let n =
                unsafe { libc::read(self.read.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
            if n > 0 {
                have += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            if n < 0 && err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(dry(n, err));
        }
        Ok(())
    }

    /// Throws away `len` bytes from the front of the pipe.
    pub(crate) fn discard(&self, mut len: usize) -> io::Result<()> {
        let mut scratch = [0u8; 16 << 10];
        while len > 0 {
            let n = len.min(scratch.len());
            self.read_exact(&mut scratch[..n])?;
            len -= n;
        }
        Ok(())
    }

    /// Moves `len` bytes from the front of the pipe into the file `fd` at
    /// `offset` (the file's own copy from the pipe's pages, none here).
    /// Gives how many were moved and, if the file failed, why; an error
    /// of the pipe itself (it ran dry) is the outer `Err`.
    pub(crate) fn drain_to_file(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
    ) -> io::Result<(usize, Option<io::Error>)> {
        let mut off = i64::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        let mut moved = 0;
        while moved < len {
            // SAFETY: plain descriptors; `off` is a valid i64 we own.
            let n = unsafe {
                libc::splice(
                    self.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    fd,
                    &mut off,
                    len - moved,
                    libc::SPLICE_F_MOVE,
                )
            };
            if n > 0 {
                moved += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                _ if n == 0 => return Err(dry(0, err)),
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Err(dry(n, err)),
                _ => return Ok((moved, Some(err))),
            }
        }
        Ok((moved, None))
    }

    /// Puts references to the first `len` bytes of this pipe into `other`
    /// (empty, and as large as this one), leaving this one as it was.
    pub(crate) fn tee_to(&self, other: &SplicePipe, len: usize) -> io::Result<()> {
        loop {
            // SAFETY: plain descriptors, no offsets (two pipes).
            let n = unsafe {
                libc::tee(
                    self.read.as_raw_fd(),
                    other.write.as_raw_fd(),
                    len,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            if n >= 0 {
                // tee copies from the front each time: a short one cannot
                // be continued, so the pipes must take it in one go.
                return if n as usize == len {
                    Ok(())
                } else {
                    Err(io::Error::other(format!("tee moved {n} of {len} bytes")))
                };
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

/// A write's payload staged in a worker's pipe, as the backend takes it
/// (`BlockBackend::write_staged`). Copies for more than one file are
/// made with `tee` into the spare pipe: page references, not copies.
pub(crate) struct StagedPayload<'a> {
    pipe: &'a SplicePipe,
    spare: &'a mut Option<SplicePipe>,
    len: usize,
    left: usize,
    /// A pipe failed: what is in it is unknown.
    broken: bool,
}

impl<'a> StagedPayload<'a> {
    pub(crate) fn new(
        pipe: &'a SplicePipe,
        spare: &'a mut Option<SplicePipe>,
        len: usize,
    ) -> StagedPayload<'a> {
        StagedPayload {
            pipe,
            spare,
            len,
            left: len,
            broken: false,
        }
    }

    /// Nothing was taken.
    pub(crate) fn untouched(&self) -> bool {
        self.left == self.len && !self.broken
    }

    /// Every byte was taken and the pipe is empty again.
    pub(crate) fn consumed(&self) -> bool {
        self.left == 0 && !self.broken
    }

    fn take(&mut self, len: usize) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other("the staging pipe failed earlier"));
        }
        if len > self.left {
            return Err(io::Error::other(format!(
                "{len} bytes asked of a staged write with {} left",
                self.left
            )));
        }
        self.left -= len;
        Ok(())
    }

    /// A copy of the next `len` bytes in the spare pipe.
    fn spare_copy(&mut self, len: usize) -> io::Result<&SplicePipe> {
        let capacity = self.pipe.capacity();
        if self.spare.as_ref().is_none_or(|p| p.capacity() < capacity) {
            *self.spare = Some(SplicePipe::new(capacity)?);
        }
        let spare = self.spare.as_ref().expect("made above");
        self.pipe.tee_to(spare, len)?;
        Ok(spare)
    }
}

impl StagedPayload<'_> {
    /// The next `len` bytes, by copy, into every one of `targets` with
    /// pwrite: for the copies of a strip when the spare pipe cannot be had
    /// or failed, the main pipe holding the bytes still.
    fn by_copy(
        &mut self,
        len: usize,
        targets: &[(RawFd, u64)],
        errors: &mut [Option<io::Error>],
    ) -> io::Result<()> {
        let mut bytes = vec![0u8; len];
        self.pipe
            .read_exact(&mut bytes)
            .inspect_err(|_| self.broken = true)?;
        for (&(fd, at), error) in targets.iter().zip(errors) {
            *error = pwrite_all(fd, &bytes, at).err();
        }
        Ok(())
    }
}

/// Writes all of `bytes` at `offset` of the file `fd`, which stays open.
fn pwrite_all(fd: RawFd, bytes: &[u8], offset: u64) -> io::Result<()> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: `fd` is open for the call; ManuallyDrop keeps it open after.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    file.write_all_at(bytes, offset)
}

impl crate::export::StagedWrite for StagedPayload<'_> {
    /// Each target but the last gets the bytes from a `tee` into the spare
    /// pipe; the last from the main pipe. Once a target has its bytes, a
    /// failure of the pipes is not the write's `Err` (that would leave the
    /// copies different with no member failed): a spare that cannot be
    /// had or fails gives way to a copy from the main pipe, and a main
    /// pipe that fails then counts as the last target's failure.
    fn into_files(
        &mut self,
        len: usize,
        targets: &[(RawFd, u64)],
    ) -> io::Result<Vec<Option<io::Error>>> {
        self.take(len)?;
        let mut errors: Vec<Option<io::Error>> = targets.iter().map(|_| None).collect();
        let Some(((last_fd, last_at), others)) = targets.split_last() else {
            return self
                .pipe
                .discard(len)
                .inspect_err(|_| self.broken = true)
                .map(|()| errors);
        };
        for (k, &(fd, at)) in others.iter().enumerate() {
            let copied = self.spare_copy(len).and_then(|spare| {
                let (moved, failed) = spare.drain_to_file(fd, at, len)?;
                if failed.is_some() {
                    spare.discard(len - moved)?;
                }
                Ok(failed)
            });
            match copied {
                Ok(failed) => errors[k] = failed,
                Err(_) => {
                    // The spare may hold part of a copy: a new one next
                    // time. This target and the rest get the bytes by copy.
                    *self.spare = None;
                    match self.by_copy(len, &targets[k..], &mut errors[k..]) {
                        Ok(()) => return Ok(errors),
                        Err(e) if k == 0 => return Err(e),
                        Err(e) => {
                            for error in &mut errors[k..] {
                                *error = Some(io::Error::new(e.kind(), e.to_string()));
                            }
                            return Ok(errors);
                        }
                    }
                }
            }
        }
        let last = self
            .pipe
            .drain_to_file(*last_fd, *last_at, len)
            .and_then(|(moved, failed)| {
                if failed.is_some() {
                    self.pipe.discard(len - moved)?;
                }
                Ok(failed)
            });
        match last {
            Ok(failed) => errors[others.len()] = failed,
            Err(e) => {
                self.broken = true;
                if others.is_empty() {
                    return Err(e);
                }
                errors[others.len()] = Some(e);
            }
        }
        Ok(errors)
    }

    fn into_memory(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.take(buf.len())?;
        self.pipe
            .read_exact(buf)
            .inspect_err(|_| self.broken = true)
    }
}

/// The error for a pipe that had fewer bytes than it should (`n` what
/// the call returned, `err` errno after it).
fn dry(n: isize, err: io::Error) -> io::Error {
    if n == 0 || err.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::UnexpectedEof, "the staging pipe ran dry")
    } else {
        err
    }
}

impl Sock {
    /// Sends `head`, then `len` bytes staged in `pipe`, waiting up to
    /// `timeout` each time the socket buffer is full. The bytes go from
    /// the pipe to the socket as page references (no copy).
    pub(crate) fn send_spliced(
        &self,
        head: &[u8],
        pipe: &SplicePipe,
        len: usize,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        self.send_all(&[head], timeout)?;
        let mut left = len;
        while left > 0 {
            // SAFETY: plain descriptors, no offsets (a pipe and a socket).
            let n = unsafe {
                libc::splice(
                    pipe.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    self.raw(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
                )
            };
            if n < 0 {
                self.retry_send(io::Error::last_os_error(), timeout)?;
                continue;
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the pipe ran dry while splicing a reply",
                ));
            }
            left -= n as usize;
        }
        Ok(())
    }
}

pub(crate) enum PollResult {
    Ready,
    Woken,
    TimedOut,
}

/// Waits until `fd` has `events` (or an error/hangup), `wake` becomes
/// readable, or `deadline` passes.
pub(crate) fn poll_one(
    fd: RawFd,
    events: i16,
    wake: Option<RawFd>,
    deadline: Option<Instant>,
) -> io::Result<PollResult> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd,
                events,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(PollResult::TimedOut);
                }
                // Round up so that a sub-millisecond remainder does not spin.
                left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32
            }
        };
        let count = if wake.is_some() { 2 } else { 1 };
        // SAFETY: fds is a valid array of `count` pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // Shutdown wins over pending data: the server stops reading new
        // requests promptly even from a client that keeps sending.
        if wake.is_some() && fds[1].revents != 0 {
            return Ok(PollResult::Woken);
        }
        if fds[0].revents != 0 {
            return Ok(PollResult::Ready);
        }
        if n == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(PollResult::TimedOut);
        }
    }
}

/// recv into `dst`, waiting (for data, the shutdown pipe or the deadline) as
/// needed; Ok(0) means end of stream.
fn recv_some(
    sock: &Sock,
    wake: RawFd,
    dst: &mut [u8],
    deadline: Option<Instant>,
) -> Result<usize, ReadError> {
    loop {
        match sock.recv(dst) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match poll_one(sock.raw(), libc::POLLIN, Some(wake), deadline)
                    .map_err(ReadError::Io)?
                {
                    PollResult::Ready => {}
                    PollResult::Woken => return Err(ReadError::Stopped),
                    PollResult::TimedOut => return Err(ReadError::TimedOut),
                }
            }
            // A reset connection is just a client that went away.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(0),
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

/// A buffered reader over a [`Sock`] that watches the shutdown pipe.
///
/// The buffer lets one recv(2) pick up several pipelined request headers (a
/// client with many requests in flight sends them back to back), while large
/// payloads are read straight into their destination.
pub(crate) struct SockReader<'a> {
    sock: &'a Sock,
    wake: RawFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The next refill takes at most this much (see `stage`).
    refill_limit: Option<usize>,
}

const READ_BUFFER: usize = 64 * 1024;

/// The length of an NBD request header.
const REQUEST_HEADER_LEN: usize = super::proto::REQUEST_HEADER_LEN;

impl<'a> SockReader<'a> {
    pub(crate) fn new(sock: &'a Sock, wake: RawFd) -> SockReader<'a> {
        SockReader {
            sock,
            wake,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            refill_limit: None,
        }
    }

    /// Fills `out` completely. `deadline` bounds the whole message.
    pub(crate) fn read_exact(
        &mut self,
        out: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<(), ReadError> {
        let need = out.len();
        let mut have = 0;
        while have < need {
            if self.start < self.end {
                let n = (self.end - self.start).min(need - have);
                out[have..have + n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                have += n;
                continue;
            }
            let closed = || {
                if have == 0 {
                    ReadError::Eof
                } else {
                    ReadError::Truncated { have, need }
                }
            };
            // Large remainders go straight to the destination; small ones
            // refill the buffer so that the next header rides along.
            if need - have >= self.buf.len() {
                let n = recv_some(self.sock, self.wake, &mut out[have..], deadline)?;
                if n == 0 {
                    return Err(closed());
                }
                have += n;
            } else {
                self.start = 0;
                self.end = 0;
                let limit = self.refill_limit.take().unwrap_or(self.buf.len());
                let n = recv_some(self.sock, self.wake, &mut self.buf[..limit], deadline)?;
                if n == 0 {
                    return Err(closed());
                }
                self.end = n;
            }
        }
        Ok(())
    }

    /// Bytes received and not yet read.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Waits until the socket has something to read (data, its end, or an
    /// error), the server stops, or `other` is readable; says whether it
    /// was one of the first two, after which a read will not wait. With
    /// bytes already buffered it returns at once.
    pub(crate) fn wait_readable(&self, other: RawFd) -> io::Result<bool> {
        if self.buffered() > 0 {
            return Ok(true);
        }
        let mut fds = [self.sock.raw(), self.wake, other].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        loop {
            // SAFETY: fds is a valid array of three pollfd.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, -1) };
            if n >= 0 {
                return Ok(fds[0].revents != 0 || fds[1].revents != 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Stages the next `len` bytes of the stream in `pipe`: what is
    /// buffered here by copy, the rest spliced from the socket as page
    /// references. Gives how many were staged: fewer than `len` only when
    /// the pipe filled up (the caller takes them back and reads the rest).
    pub(crate) fn stage(
        &mut self,
        pipe: &SplicePipe,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<usize, ReadError> {
        // A client that writes big payloads is likely to send another
        // behind this one: the next refill takes only a request header, so
        // that the next payload is not read into the buffer (and copied
        // into a pipe from there) but spliced.
        self.refill_limit = Some(REQUEST_HEADER_LEN);
        let mut have = 0;
        let buffered = self.buffered().min(len);
        if buffered > 0 {
            let n = pipe
                .write_some(&self.buf[self.start..self.start + buffered])
                .map_err(ReadError::Io)?;
            self.start += n;
            have += n;
            if n < buffered {
                return Ok(have);
            }
        }
        // After poll says the socket is readable, a splice that still
        // gets nothing means the pipe cannot take the next fragment.
        let mut idle_after_ready = 0;
        while have < len {
            // SAFETY: plain descriptors, no offsets (a socket and a pipe).
            let n = unsafe {
                libc::splice(
                    self.sock.raw(),
                    std::ptr::null_mut(),
                    pipe.write.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - have,
                    libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
                )
            };
            if n > 0 {
                have += n as usize;
                idle_after_ready = 0;
                continue;
            }
            if n == 0 {
                return Err(ReadError::Truncated { have, need: len });
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => {
                    if !pipe.has_room() || idle_after_ready >= 2 {
                        return Ok(have);
                    }
                    match poll_one(self.sock.raw(), libc::POLLIN, Some(self.wake), deadline)
                        .map_err(ReadError::Io)?
                    {
                        PollResult::Ready => idle_after_ready += 1,
                        PollResult::Woken => return Err(ReadError::Stopped),
                        PollResult::TimedOut => return Err(ReadError::TimedOut),
                    }
                }
                io::ErrorKind::ConnectionReset => {
                    return Err(ReadError::Truncated { have, need: len })
                }
                _ => return Err(ReadError::Io(err)),
            }
        }
        Ok(have)
    }

    /// Reads and throws away `len` bytes (the data of an option the server
    /// refuses), without allocating for it.
    pub(crate) fn discard(
        &mut self,
        mut len: u64,
        deadline: Option<Instant>,
    ) -> Result<(), ReadError> {
        let mut scratch = [0u8; 4096];
        while len > 0 {
            let n = len.min(scratch.len() as u64) as usize;
            self.read_exact(&mut scratch[..n], deadline)?;
            len -= n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn pair() -> (Sock, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Sock::new(OwnedFd::from(a)).unwrap(), b)
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors that we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        use std::os::fd::FromRawFd;
        // SAFETY: both descriptors are fresh.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn reads_across_buffer_boundaries() {
        let (sock, mut peer) = pair();
        let (wake_r, _wake_w) = pipe();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || {
                for piece in data.chunks(7001) {
                    peer.write_all(piece).unwrap();
                }
            })
        };
        let mut r = SockReader::new(&sock, wake_r.as_raw_fd());
        let mut got = vec![0u8; data.len()];
        // Mix small and large reads.
        r.read_exact(&mut got[..28], None).unwrap();
        r.read_exact(&mut got[28..100_000], None).unwrap();
        r.read_exact(&mut got[100_000..100_003], None).unwrap();
        r.read_exact(&mut got[100_003..], None).unwrap();
        assert_eq!(got, data);
        writer.join().unwrap();
        assert!(matches!(
            r.read_exact(&mut [0u8; 4], None),
            Err(ReadError::Eof)
        ));
    }

    #[test]
    fn truncation_timeout_and_stop() {
        let (sock, mut peer) = pair();
        let (wake_r, wake_w) = pipe();
        let mut r = SockReader::new(&sock, wake_r.as_raw_fd());
        peer.write_all(&[1, 2, 3]).unwrap();
        let deadline = Some(Instant::now() + Duration::from_millis(50));
        assert!(matches!(
            r.read_exact(&mut [0u8; 8], deadline),
            Err(ReadError::TimedOut)
        ));
        // SAFETY: writing one byte to our pipe.
        assert_eq!(
            unsafe { libc::write(wake_w.as_raw_fd(), [1u8].as_ptr().cast(), 1) },
            1
        );
        assert!(matches!(
            r.read_exact(&mut [0u8; 8], None),
            Err(ReadError::Stopped)
        ));
        drop(peer);
        let (sock, mut peer) = pair();
        let (wake_r, _wake_w) = pipe();
        let mut r = SockReader::new(&sock, wake_r.as_raw_fd());
        peer.write_all(&[1, 2, 3]).unwrap();
        drop(peer);
        assert!(matches!(
            r.read_exact(&mut [0u8; 8], None),
            Err(ReadError::Truncated { have: 3, need: 8 })
        ));
    }

    /// A payload staged from the socket (part already buffered, part
    /// spliced) goes into two files, one of them by `tee`; a file that
    /// fails gets its error and the next bytes still come in order; a
    /// pipe too small for the payload stages part, and the rest is read.
    #[test]
    fn staged_payloads_reach_files_in_order() {
        use crate::export::StagedWrite;
        use std::os::unix::fs::FileExt;
        let (sock, mut peer) = pair();
        let (wake_r, _wake_w) = pipe();
        let payload: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let payload = payload.clone();
            std::thread::spawn(move || {
                peer.write_all(b"head").unwrap();
                peer.write_all(&payload).unwrap();
                peer.write_all(b"next").unwrap();
                peer.write_all(&payload).unwrap();
                peer.write_all(b"tail").unwrap();
                peer
            })
        };
        let mut r = SockReader::new(&sock, wake_r.as_raw_fd());
        let mut head = [0u8; 4];
        r.read_exact(&mut head, None).unwrap();
        assert_eq!(&head, b"head");
        let staging = SplicePipe::new(1 << 20).unwrap();
        assert_eq!(
            r.stage(&staging, payload.len(), None).unwrap(),
            payload.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        let (a, b) = (open("a"), open("b"));
        let read_only = std::fs::File::open(dir.path().join("a")).unwrap();
        let mut spare = None;
        let mut staged = StagedPayload::new(&staging, &mut spare, payload.len());
        let first = 200_000;
        let errors = staged
            .into_files(first, &[(a.as_raw_fd(), 4096), (b.as_raw_fd(), 0)])
            .unwrap();
        assert!(errors.iter().all(Option::is_none));
        // A file that cannot be written fails alone, as the first or the
        // last target, and its bytes are taken all the same.
        let errors = staged
            .into_files(
                100_000,
                &[(read_only.as_raw_fd(), 0), (b.as_raw_fd(), first as u64)],
            )
            .unwrap();
        assert!(errors[0].is_some() && errors[1].is_none());
        let errors = staged
            .into_files(
                100_000,
                &[(b.as_raw_fd(), 300_000), (read_only.as_raw_fd(), 0)],
            )
            .unwrap();
        assert!(errors[0].is_none() && errors[1].is_some());
        // A spare pipe that cannot take a copy (full of other bytes here):
        // both files still get the bytes, by copy, and the spare is dropped.
        let full = SplicePipe::new(staging.capacity()).unwrap();
        while full.write_some(&[0xee; 4096]).unwrap() > 0 {}
        *staged.spare = Some(full);
        let errors = staged
            .into_files(
                100_000,
                &[(a.as_raw_fd(), 1 << 20), (b.as_raw_fd(), 400_000)],
            )
            .unwrap();
        assert!(errors.iter().all(Option::is_none));
        assert!(staged.spare.is_none(), "the failed spare is dropped");
        let mut back = vec![0u8; 100_000];
        a.read_exact_at(&mut back, 1 << 20).unwrap();
        assert!(back == payload[400_000..500_000], "first copy");
        b.read_exact_at(&mut back, 400_000).unwrap();
        assert!(back == payload[400_000..500_000], "last copy");
        let mut rest = vec![0u8; payload.len() - 500_000];
        staged.into_memory(&mut rest).unwrap();
        assert!(staged.consumed());
        assert!(
            staged.into_memory(&mut [0u8; 1]).is_err(),
            "nothing is left"
        );
        let mut back = vec![0u8; first];
        a.read_exact_at(&mut back, 4096).unwrap();
        assert!(back == payload[..first]);
        let mut back = vec![0u8; 400_000];
        b.read_exact_at(&mut back, 0).unwrap();
        assert!(back == payload[..400_000]);
        assert!(rest == payload[500_000..]);
        r.read_exact(&mut head, None).unwrap();
        assert_eq!(&head, b"next", "the stream goes on after the payload");
        // A pipe too small: part is staged, and the caller reads the rest.
        let small = SplicePipe::new(64 << 10).unwrap();
        let have = r.stage(&small, payload.len(), None).unwrap();
        assert!(have > 0 && have < payload.len(), "{have} staged");
        let mut back = vec![0u8; payload.len()];
        small.read_exact(&mut back[..have]).unwrap();
        r.read_exact(&mut back[have..], None).unwrap();
        assert!(back == payload);
        r.read_exact(&mut head, None).unwrap();
        assert_eq!(&head, b"tail");
        drop(writer.join().unwrap());
    }

    #[test]
    fn send_all_to_a_closed_peer_is_an_error_not_a_signal() {
        let (sock, peer) = pair();
        drop(peer);
        let err = sock
            .send_all(&[b"hello", b"world"], Some(Duration::from_secs(1)))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn send_all_times_out_when_the_peer_does_not_read() {
        let (sock, _peer) = pair();
        let big = vec![0u8; 8 << 20];
        let err = sock
            .send_all(&[&big], Some(Duration::from_millis(100)))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
