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
}

const READ_BUFFER: usize = 64 * 1024;

impl<'a> SockReader<'a> {
    pub(crate) fn new(sock: &'a Sock, wake: RawFd) -> SockReader<'a> {
        SockReader {
            sock,
            wake,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
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
                let n = recv_some(self.sock, self.wake, &mut self.buf, deadline)?;
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
