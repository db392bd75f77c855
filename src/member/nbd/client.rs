//! One client connection: the fixed newstyle handshake (`NBD_OPT_STARTTLS`
//! when asked, then `NBD_OPT_GO`), and pipelined requests with simple
//! replies (structured replies are never negotiated: a read's data then
//! follows its reply header, the cheapest framing to parse), matched to
//! their requests by cookie.
//!
//! The handshake is shared with the benchmark's pipelined client, which
//! drives the connection itself afterwards.

use super::proto::{
    self, BlockSizes, InfoRequest, OptionHeader, ReplyHeader, RequestHeader, Stream,
};
use super::uri::{Address, NbdUri};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Option replies a handshake reads before giving up: a server sends a few
/// `NBD_REP_INFO` before the ACK, never hundreds.
const OPTION_REPLIES_MAX: usize = 64;
/// Largest option reply payload accepted (the protocol's string limit plus
/// room for the fixed fields).
const OPTION_REPLY_BYTES_MAX: u32 = 8192;

/// How long connecting and the handshake may take: a host that does not
/// answer is an error in seconds, not a command that hangs.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

/// TCP keepalive: a peer gone without a word (power, network) is noticed
/// after about IDLE + INTERVAL * COUNT seconds of silence, and data
/// unacknowledged for `USER_TIMEOUT` fails the socket, so a request never
/// waits on a dead connection forever.
const KEEPALIVE_IDLE_SECS: i32 = 10;
const KEEPALIVE_INTERVAL_SECS: i32 = 5;
const KEEPALIVE_COUNT: i32 = 3;
const USER_TIMEOUT_MS: i32 = 30_000;

/// What `NBD_OPT_GO` negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    /// The server's block size constraints, when it sent them.
    pub block_sizes: Option<BlockSizes>,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
}

/// The socket under a connection, kept apart from its stream (which may be
/// TLS) to set timeouts and shut it down.
pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Socket::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }

    /// How long a blocking send may wait for room in the socket's buffer
    /// before it fails (`None`: for ever). The reading side keeps waiting:
    /// an idle connection is not a hung one.
    fn set_send_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_write_timeout(timeout),
            Socket::Unix(s) => s.set_write_timeout(timeout),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(on),
            Socket::Unix(s) => s.set_nonblocking(on),
        }
    }

    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    /// Ends the connection at once: a thread blocked on it gets an error.
    pub fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    pub fn into_stream(self) -> Box<dyn Stream> {
        match self {
            Socket::Tcp(s) => Box::new(s),
            Socket::Unix(s) => Box::new(s),
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }
}

fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("NBD: {what}"))
}

fn set_int_option(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt on a descriptor we own, with a live int.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Connects to the URI's socket, with keepalive on TCP.
pub fn connect_socket(uri: &NbdUri) -> io::Result<Socket> {
    match &uri.address {
        Address::Unix(path) => {
            let socket = UnixStream::connect(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Ok(Socket::Unix(socket))
        }
        Address::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| io::Error::new(e.kind(), format!("{host}: {e}")))?
                .collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT) {
                    Ok(stream) => {
                        let fd = stream.as_raw_fd();
                        stream.set_nodelay(true)?;
                        set_int_option(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
                        set_int_option(
                            fd,
                            libc::IPPROTO_TCP,
                            libc::TCP_KEEPIDLE,
                            KEEPALIVE_IDLE_SECS,
                        )?;
                        set_int_option(
                            fd,
                            libc::IPPROTO_TCP,
                            libc::TCP_KEEPINTVL,
                            KEEPALIVE_INTERVAL_SECS,
                        )?;
                        set_int_option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_COUNT)?;
                        set_int_option(
                            fd,
                            libc::IPPROTO_TCP,
                            libc::TCP_USER_TIMEOUT,
                            USER_TIMEOUT_MS,
                        )?;
                        return Ok(Socket::Tcp(stream));
                    }
                    Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
                }
            }
            Err(last)
        }
    }
}

/// Sends one option with its data.
fn send_option(stream: &mut dyn Stream, option: u32, data: &[u8]) -> io::Result<()> {
    let mut message = proto::encode_option_header(OptionHeader {
        option,
        length: data.len() as u32,
    })
    .to_vec();
    message.extend_from_slice(data);
    stream.write_all(&message)
}

/// Reads one option reply: its type and data.
fn read_option_reply(stream: &mut dyn Stream, option: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut header = [0u8; proto::OPTION_REPLY_HEADER_LEN];
    stream.read_exact(&mut header)?;
    let header = proto::decode_option_reply_header(&header).map_err(protocol_error)?;
    if header.option != option || header.length > OPTION_REPLY_BYTES_MAX {
        return Err(protocol_error(format!(
            "unexpected option reply {header:?}"
        )));
    }
    let mut data = vec![0u8; header.length as usize];
    stream.read_exact(&mut data)?;
    Ok((header.reply_type, data))
}

/// An option's error reply in words.
fn option_refusal(option: &str, reply_type: u32, data: &[u8], export: &str) -> io::Error {
    let message = String::from_utf8_lossy(data);
    let why = match reply_type {
        proto::REP_ERR_UNKNOWN => format!("the server has no export named {export:?}"),
        proto::REP_ERR_TLS_REQD => "the server requires TLS (use nbds://)".to_string(),
        proto::REP_ERR_POLICY => "refused by the server's policy".to_string(),
        proto::REP_ERR_UNSUP => format!("the server does not support {option}"),
        proto::REP_ERR_SHUTDOWN => "the server is shutting down".to_string(),
        other => format!("refused ({other:#x})"),
    };
    let kind = match reply_type {
        proto::REP_ERR_UNKNOWN => io::ErrorKind::NotFound,
        proto::REP_ERR_POLICY | proto::REP_ERR_TLS_REQD => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    if message.is_empty() {
        io::Error::new(kind, why)
    } else {
        io::Error::new(kind, format!("{why}: {}", message.trim_end()))
    }
}

/// The greeting and the client's flags: what every handshake starts with.
pub fn start_handshake(stream: &mut dyn Stream) -> io::Result<()> {
    let mut greeting = [0u8; proto::GREETING_LEN];
    stream.read_exact(&mut greeting).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            protocol_error("the server closed the connection before its greeting")
        } else {
            e
        }
    })?;
    let handshake_flags = proto::decode_greeting(&greeting)
        .map_err(|e| protocol_error(format!("not an NBD newstyle server ({e})")))?;
    if handshake_flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol_error("the server does not speak fixed newstyle"));
    }
    let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
    if handshake_flags & proto::FLAG_NO_ZEROES != 0 {
        client_flags |= proto::FLAG_C_NO_ZEROES;
    }
    stream.write_all(&client_flags.to_be_bytes())
}

/// `NBD_OPT_STARTTLS`: after its ACK the stream is handed to TLS.
pub fn request_starttls(stream: &mut dyn Stream) -> io::Result<()> {
    send_option(stream, proto::OPT_STARTTLS, &[])?;
    match read_option_reply(stream, proto::OPT_STARTTLS)? {
        (proto::REP_ACK, _) => Ok(()),
        (proto::REP_ERR_UNSUP | proto::REP_ERR_POLICY, _) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the server does not offer TLS",
        )),
        (reply_type, data) => Err(option_refusal("STARTTLS", reply_type, &data, "")),
    }
}

/// `NBD_OPT_GO` for `export`, asking for its block sizes.
pub fn go(stream: &mut dyn Stream, export: &str) -> io::Result<ExportInfo> {
    let data = proto::encode_info_request(&InfoRequest {
        name: export.to_string(),
        requests: vec![proto::INFO_BLOCK_SIZE],
    });
    send_option(stream, proto::OPT_GO, &data)?;
    let mut size_and_flags = None;
    let mut block_sizes = None;
    for _ in 0..OPTION_REPLIES_MAX {
        let (reply_type, data) = read_option_reply(stream, proto::OPT_GO)?;
        match reply_type {
            proto::REP_ACK => {
                let (size_bytes, transmission_flags) = size_and_flags.ok_or_else(|| {
                    protocol_error("NBD_OPT_GO acknowledged without the export size")
                })?;
                return Ok(ExportInfo {
                    size_bytes,
                    transmission_flags,
                    block_sizes,
                });
            }
            proto::REP_INFO => match proto::decode_info(&data).map_err(protocol_error)? {
                proto::Info::Export {
                    size,
                    transmission_flags,
                } => size_and_flags = Some((size, transmission_flags)),
                proto::Info::BlockSize(sizes) => block_sizes = Some(sizes),
                _ => {}
            },
            error if error & (1 << 31) != 0 => {
                return Err(option_refusal("NBD_OPT_GO", error, &data, export))
            }
            other => return Err(protocol_error(format!("unexpected reply type {other:#x}"))),
        }
    }
    Err(protocol_error("too many option replies"))
}

/// Requests one connection keeps in flight: enough to cover a round trip
/// of the array's queue depth spread over a member's connections, and what
/// nbdkit serves at once per connection (its default of 16 threads).
pub const CONNECTION_DEPTH: usize = 16;

/// A connection in transmission. Callers send their requests themselves,
/// one message at a time under `send`, and wait; a reader thread takes the
/// replies as they come, in any order, matches them by cookie and wakes
/// their callers, writing a read's data straight into the caller's memory.
/// At most `CONNECTION_DEPTH` requests are in flight; a caller beyond waits
/// for room.
///
/// A connection that breaks (a send or a read fails, the server breaks the
/// protocol, `close`) fails every request in flight with the same error and
/// every later one at once.
pub struct Connection {
    pub info: ExportInfo,
    /// The TLS protocol and suite negotiated, on a TLS connection.
    pub tls_session: Option<String>,
    shared: Arc<Shared>,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Shared {
    send: Mutex<Half>,
    state: Mutex<State>,
    /// Signalled when a request leaves the table (or the connection dies).
    room: Condvar,
    /// To end the connection from any thread.
    socket: Socket,
}

#[derive(Default)]
struct State {
    in_flight: HashMap<u64, Pending>,
    next_cookie: u64,
    /// Why the connection is unusable, once it is.
    dead: Option<(io::ErrorKind, String)>,
}

/// A request waiting for its reply. Whoever takes it out of the table (the
/// reader for its reply, or whoever ends the connection) completes it, and
/// nobody else touches its memory afterwards.
struct Pending {
    read_into: Option<(*mut u8, usize)>,
    done: Arc<Done>,
}

// SAFETY: the pointer is a caller's buffer that the caller does not touch
// (it waits in `Ticket::wait`) until the request completes; only the one
// thread that took the `Pending` out of the table writes to it.
unsafe impl Send for Pending {}

#[derive(Default)]
struct Done {
    result: Mutex<Option<Result<(), RequestError>>>,
    cv: Condvar,
}

impl Done {
    fn complete(&self, result: Result<(), RequestError>) {
        *self.result.lock().unwrap() = Some(result);
        self.cv.notify_all();
    }
}

/// When a request must have its answer (`serve --member-timeout`): a
/// request not answered by then fails its connection with
/// `ErrorKind::TimedOut`.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    pub at: Instant,
    /// The timeout it was set from, for messages.
    pub after: Duration,
}

impl Deadline {
    pub fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + timeout,
            after: timeout,
        }
    }

    fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    pub fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer within {} (member timeout)",
                crate::units::duration_text(self.after)
            ),
        )
    }
}

/// A request sent: `wait` for its reply. A ticket dropped unwaited whose
/// request lends a read buffer ends the connection and waits for the
/// reader to let go of that buffer, which may be given back right after.
#[must_use]
pub struct Ticket {
    done: Arc<Done>,
    cookie: u64,
    shared: Arc<Shared>,
    lends_buffer: bool,
    settled: bool,
}

impl Ticket {
    /// Waits for the reply until `deadline`. A request still unanswered
    /// then is taken back and its connection failed (every request in
    /// flight on it fails with the same timeout); if the reader is already
    /// writing its data, the wait goes on until the reader lets go, which
    /// the failed connection makes prompt. Either way, once this returns
    /// nothing writes into the request's buffer.
    pub fn wait_until(mut self, deadline: Option<Deadline>) -> Result<(), RequestError> {
        if let Some(done) = self.take_result(deadline) {
            self.settled = true;
            return done;
        }
        let deadline = deadline.expect("only a wait with a deadline gives up");
        Err(self.abandon(deadline.error()))
    }

    /// The reply, or `None` when the deadline passed first.
    fn take_result(&self, deadline: Option<Deadline>) -> Option<Result<(), RequestError>> {
        let mut result = self.done.result.lock().unwrap();
        loop {
            if let Some(done) = result.take() {
                return Some(done);
            }
            result = match deadline {
                None => self.done.cv.wait(result).unwrap(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d.at {
                        return None;
                    }
                    self.done.cv.wait_timeout(result, d.at - now).unwrap().0
                }
            };
        }
    }

    /// Gives the request up: out of the table if it still is there (the
    /// reader never touches it then), the connection failed with `why`,
    /// and, when the reader had it, a wait until it is done with it.
    fn abandon(&mut self, why: io::Error) -> RequestError {
        let mine = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_flight
            .remove(&self.cookie)
            .is_some();
        let error = io::Error::new(why.kind(), why.to_string());
        self.shared.fail(why);
        if !mine {
            let _ = self.take_result(None);
        }
        self.settled = true;
        RequestError::Connection(error)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled && self.lends_buffer {
            self.abandon(io::Error::new(
                io::ErrorKind::Interrupted,
                "a read was given up before its reply",
            ));
        }
    }
}

/// One direction of a connection's byte stream. A plain socket is two
/// descriptors of one socket, read by the reader thread and written by the
/// senders, each blocking. A TLS session cannot be split: both sides share
/// it behind a lock, on a non-blocking socket, each polling the descriptor
/// without holding the lock while it waits, so a sender never stops the
/// reader (and with it the server) and the reverse.
enum Half {
    Own(Box<dyn Stream>),
    Shared(Arc<Mutex<Box<dyn Stream>>>, RawFd),
}

/// How long a side of a TLS session polls before trying again: OpenSSL may
/// want to write while reading (a key update), which a poll for input
/// alone would not notice.
const TLS_POLL_MS: i32 = 100;

fn poll_fd(fd: RawFd, events: libc::c_short) {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, alive for the call. An error or timeout just
    // means trying the stream again, which reports what is wrong.
    unsafe { libc::poll(&mut pfd, 1, TLS_POLL_MS) };
}

impl Half {
    /// Sends all of `data`. A plain socket's blocking send is bounded by
    /// the socket's send timeout (`Connection::set_send_timeout`); a TLS
    /// side polls, and gives up at `deadline`.
    fn write_all(&mut self, mut data: &[u8], deadline: Option<Deadline>) -> io::Result<()> {
        match self {
            Half::Own(stream) => stream
                .write_all(data)
                .and_then(|_| stream.flush())
                .map_err(|e| match (e.kind(), deadline) {
                    // The send timeout: the server stopped reading.
                    (io::ErrorKind::WouldBlock, Some(d)) => d.error(),
                    _ => e,
                }),
            Half::Shared(stream, fd) => {
                while !data.is_empty() {
                    let wrote = stream.lock().unwrap().write(data);
                    match wrote {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => data = &data[n..],
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if let Some(d) = deadline.filter(Deadline::passed) {
                                return Err(d.error());
                            }
                            poll_fd(*fd, libc::POLLOUT)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        match self {
            Half::Own(stream) => stream.read_exact(buf),
            Half::Shared(stream, fd) => {
                while !buf.is_empty() {
                    let read = stream.lock().unwrap().read(buf);
                    match read {
                        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Ok(n) => buf = &mut buf[n..],
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            poll_fd(*fd, libc::POLLIN)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }
}

/// What a request failed of.
pub enum RequestError {
    /// The server answered with an error; the connection is still good.
    Reply(io::Error),
    /// The connection broke or the server broke the protocol: it is
    /// unusable from now on.
    Connection(io::Error),
}

impl Connection {
    /// Connects to the URI and negotiates, TLS first if the URI says so.
    pub fn open(uri: &NbdUri) -> io::Result<Connection> {
        let socket = connect_socket(uri)?;
        socket.set_timeouts(Some(HANDSHAKE_TIMEOUT))?;
        let control = socket.try_clone()?;
        let reading = socket.try_clone()?;
        let mut stream = socket.into_stream();
        start_handshake(&mut *stream)?;
        let tls = uri.tls.is_some();
        let mut tls_session = None;
        if let Some(tls) = &uri.tls {
            request_starttls(&mut *stream)?;
            let (secured, session) = super::tls::client(stream, uri, tls)?;
            stream = secured;
            tls_session = Some(session);
        }
        let info = go(&mut *stream, &uri.export)?;
        control.set_timeouts(None)?;
        let (send, receive) = if tls {
            control.set_nonblocking(true)?;
            let fd = control.as_raw_fd();
            let shared = Arc::new(Mutex::new(stream));
            (Half::Shared(shared.clone(), fd), Half::Shared(shared, fd))
        } else {
            (Half::Own(stream), Half::Own(reading.into_stream()))
        };
        let shared = Arc::new(Shared {
            send: Mutex::new(send),
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            socket: control,
        });
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("uraid-nbd-reply".into())
                .spawn(move || shared.read_replies(receive))?
        };
        Ok(Connection {
            info,
            tls_session,
            shared,
            reader: Mutex::new(Some(reader)),
        })
    }

    /// Whether the connection broke (or was closed).
    pub fn is_dead(&self) -> bool {
        self.shared.state.lock().unwrap().dead.is_some()
    }

    /// Bounds every send on the connection (see `Half::write_all`): a
    /// server that stops reading fails a send after `timeout`.
    pub fn set_send_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.shared.socket.set_send_timeout(timeout)
    }

    /// Sends a request (with a write's payload) and returns at once, or
    /// after waiting for room; its reply (and a read's data, written to
    /// `read_into`) comes through the ticket. With a deadline, a request
    /// that finds no room or cannot be sent by then fails the connection
    /// with the timeout.
    ///
    /// # Safety
    /// `read_into`, when given, must stay valid and untouched until the
    /// ticket's wait returns or the ticket is dropped (the reply reader
    /// writes to it meanwhile).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn submit(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        payload: Option<&[u8]>,
        read_into: Option<(*mut u8, usize)>,
        length: u32,
        deadline: Option<Deadline>,
    ) -> Result<Ticket, RequestError> {
        let done = Arc::new(Done::default());
        let cookie = {
            let mut state = self.shared.state.lock().unwrap();
            while state.dead.is_none() && state.in_flight.len() >= CONNECTION_DEPTH {
                state = match deadline {
                    None => self.shared.room.wait(state).unwrap(),
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d.at {
                            drop(state);
                            self.shared.fail(d.error());
                            return Err(RequestError::Connection(d.error()));
                        }
                        self.shared.room.wait_timeout(state, d.at - now).unwrap().0
                    }
                };
            }
            if let Some((kind, why)) = &state.dead {
                return Err(RequestError::Connection(io::Error::new(*kind, why.clone())));
            }
            state.next_cookie += 1;
            let cookie = state.next_cookie;
            let pending = Pending {
                read_into,
                done: done.clone(),
            };
            state.in_flight.insert(cookie, pending);
            cookie
        };
        let ticket = Ticket {
            done,
            cookie,
            shared: self.shared.clone(),
            lends_buffer: read_into.is_some(),
            settled: false,
        };
        let header = proto::encode_request_header(&RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        let sent = {
            let mut send = self.shared.send.lock().unwrap();
            match payload {
                // Header and payload together: one write for small
                // payloads, no second round of Nagle-like waits.
                Some(data) if data.len() <= 64 << 10 => {
                    let mut message = Vec::with_capacity(header.len() + data.len());
                    message.extend_from_slice(&header);
                    message.extend_from_slice(data);
                    send.write_all(&message, deadline)
                }
                Some(data) => send
                    .write_all(&header, deadline)
                    .and_then(|_| send.write_all(data, deadline)),
                None => send.write_all(&header, deadline),
            }
        };
        if let Err(e) = sent {
            // A message half sent leaves the stream unusable: everything
            // in flight on it fails, this request with them.
            self.shared.fail(e);
        }
        Ok(ticket)
    }

    /// Sends a request and waits for its reply (and a read's data), until
    /// the deadline when there is one.
    pub fn request(
        &self,
        command: u16,
        offset: u64,
        length: u32,
        payload: Option<&[u8]>,
        read_into: Option<&mut [u8]>,
        deadline: Option<Deadline>,
    ) -> Result<(), RequestError> {
        let into = read_into.map(|buf| (buf.as_mut_ptr(), buf.len()));
        // SAFETY: the buffer is borrowed until the wait returns.
        unsafe { self.submit(command, 0, offset, payload, into, length, deadline) }?
            .wait_until(deadline)
    }

    /// Fails the connection with `why`, as a broken stream would: every
    /// request in flight and every later one fails.
    pub fn abort(&self, why: io::Error) {
        self.shared.fail(why);
    }

    /// Ends the connection; a polite `NBD_CMD_DISC` first, which a dead
    /// server may never read. Requests in flight fail.
    pub fn close(&self) {
        let _ = self
            .shared
            .socket
            .set_timeouts(Some(Duration::from_secs(1)));
        let header = proto::encode_request_header(&RequestHeader {
            flags: 0,
            command: proto::CMD_DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        });
        if !self.is_dead() {
            if let Ok(mut send) = self.shared.send.try_lock() {
                let _ = send.write_all(&header, None);
            }
        }
        self.shared.fail(io::Error::new(
            io::ErrorKind::NotConnected,
            "the connection was closed",
        ));
        if let Some(reader) = self.reader.lock().unwrap().take() {
            let _ = reader.join();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    /// Marks the connection dead with `e` (the first reason stays), fails
    /// every request in flight and shuts the socket, which ends the reader.
    fn fail(&self, e: io::Error) {
        let taken: Vec<Pending> = {
            let mut state = self.state.lock().unwrap();
            if state.dead.is_none() {
                state.dead = Some((e.kind(), e.to_string()));
            }
            state.in_flight.drain().map(|(_, p)| p).collect()
        };
        self.room.notify_all();
        self.socket.shutdown();
        let (kind, why) = (e.kind(), e.to_string());
        for pending in taken {
            let error = io::Error::new(kind, why.clone());
            pending.done.complete(Err(RequestError::Connection(error)));
        }
    }

    /// The reader thread: replies until the connection ends.
    fn read_replies(&self, mut receive: Half) {
        let e = loop {
            match self.read_one(&mut receive) {
                Ok(()) => {}
                Err(e) => break e,
            }
        };
        self.fail(e);
    }

    /// Reads one reply and completes its request.
    fn read_one(&self, receive: &mut Half) -> io::Result<()> {
        let mut reply = [0u8; proto::SIMPLE_REPLY_LEN];
        receive.read_exact(&mut reply).map_err(lost)?;
        let (error, cookie) = match proto::decode_reply_header(&reply) {
            Ok(ReplyHeader::Simple { error, cookie }) => (error, cookie),
            Ok(ReplyHeader::Chunk(_)) => {
                return Err(protocol_error(
                    "a structured reply, which was not negotiated",
                ))
            }
            Err(e) => return Err(protocol_error(e)),
        };
        let pending = self.state.lock().unwrap().in_flight.remove(&cookie);
        let Some(pending) = pending else {
            return Err(protocol_error(format!(
                "a reply for cookie {cookie}, which is not in flight"
            )));
        };
        if error != 0 {
            self.room.notify_one();
            pending
                .done
                .complete(Err(RequestError::Reply(reply_error(error))));
            return Ok(());
        }
        let mut result = Ok(());
        if let Some((ptr, len)) = pending.read_into {
            // SAFETY: see `Pending`: the caller waits, and this thread took
            // the request out of the table, so it alone writes there.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            result = receive.read_exact(buf).map_err(lost);
        }
        self.room.notify_one();
        match result {
            Ok(()) => {
                pending.done.complete(Ok(()));
                Ok(())
            }
            Err(e) => {
                let error = io::Error::new(e.kind(), e.to_string());
                pending.done.complete(Err(RequestError::Connection(error)));
                Err(e)
            }
        }
    }
}

/// The server closing mid-request is an I/O error, said plainly.
fn lost(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the server closed the connection",
        )
    } else {
        e
    }
}

/// An NBD error number as the host's errno (the protocol's values are
/// Linux's); an unknown one is EIO.
fn reply_error(code: u32) -> io::Error {
    let errno = match proto::NbdError::from_code(code) {
        Some(proto::NbdError::Perm) => libc::EPERM,
        Some(proto::NbdError::NoMem) => libc::ENOMEM,
        Some(proto::NbdError::Inval) => libc::EINVAL,
        Some(proto::NbdError::NoSpc) => libc::ENOSPC,
        Some(proto::NbdError::Overflow) => libc::EOVERFLOW,
        Some(proto::NbdError::NotSup) => libc::EOPNOTSUPP,
        Some(proto::NbdError::Shutdown) => libc::ESHUTDOWN,
        Some(proto::NbdError::Io) | None => libc::EIO,
    };
    io::Error::from_raw_os_error(errno)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A server on a unix socket that negotiates an export of `size` bytes,
    /// then hands its stream to `serve`.
    fn fake_server(
        dir: &std::path::Path,
        serve: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (NbdUri, std::thread::JoinHandle<()>) {
        let path = dir.join("fake.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(&proto::encode_greeting(proto::FLAG_FIXED_NEWSTYLE))
                .unwrap();
            let mut flags = [0u8; 4];
            s.read_exact(&mut flags).unwrap();
            let mut header = [0u8; proto::OPTION_HEADER_LEN];
            s.read_exact(&mut header).unwrap();
            let header = proto::decode_option_header(&header).unwrap();
            assert_eq!(header.option, proto::OPT_GO);
            let mut data = vec![0u8; header.length as usize];
            s.read_exact(&mut data).unwrap();
            let export = proto::encode_info_export(1 << 20, proto::TFLAG_HAS_FLAGS);
            s.write_all(&proto::encode_option_reply(
                proto::OPT_GO,
                proto::REP_INFO,
                &export,
            ))
            .unwrap();
            s.write_all(&proto::encode_option_reply(
                proto::OPT_GO,
                proto::REP_ACK,
                &[],
            ))
            .unwrap();
            serve(s);
        });
        let uri = format!("nbd+unix:///?socket={}", path.display())
            .parse()
            .unwrap();
        (uri, server)
    }

    fn read_request(s: &mut UnixStream) -> RequestHeader {
        let mut header = [0u8; proto::REQUEST_HEADER_LEN];
        s.read_exact(&mut header).unwrap();
        proto::decode_request_header(&header).unwrap()
    }

    /// Reads 4 KiB at (i + 1) * 4 KiB from each of `callers` threads at
    /// once, and returns what each got.
    fn read_in_threads(
        conn: &Arc<Connection>,
        callers: usize,
    ) -> Vec<(Vec<u8>, Result<(), RequestError>)> {
        let threads: Vec<_> = (0..callers)
            .map(|i| {
                let conn = conn.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    let at = (i as u64 + 1) << 12;
                    let result =
                        conn.request(proto::CMD_READ, at, 4096, None, Some(&mut buf), None);
                    (buf, result)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Requests from several threads are on the wire together, and each
    /// gets its own reply and data although they come back in reverse.
    #[test]
    fn requests_in_flight_together_get_their_own_replies() {
        const CALLERS: usize = 6;
        let dir = tempfile::tempdir().unwrap();
        let (uri, server) = fake_server(dir.path(), |mut s| {
            // Nothing is answered before every caller's request is in:
            // one request at a time per connection would wait for ever.
            let requests: Vec<RequestHeader> = (0..CALLERS).map(|_| read_request(&mut s)).collect();
            for request in requests.iter().rev() {
                assert_eq!(request.command, proto::CMD_READ);
                s.write_all(&proto::encode_simple_reply(0, request.cookie))
                    .unwrap();
                let fill = (request.offset >> 12) as u8;
                s.write_all(&vec![fill; request.length as usize]).unwrap();
            }
            let disc = read_request(&mut s);
            assert_eq!(disc.command, proto::CMD_DISC);
        });
        let conn = Arc::new(Connection::open(&uri).unwrap());
        for (i, (buf, result)) in read_in_threads(&conn, CALLERS).into_iter().enumerate() {
            assert!(result.is_ok(), "caller {i}'s read failed");
            assert!(buf.iter().all(|&b| b == i as u8 + 1), "caller {i}");
        }
        conn.close();
        server.join().unwrap();
    }

    /// A connection that breaks fails every request in flight on it, and
    /// every later one at once.
    #[test]
    fn a_broken_connection_fails_every_request_in_flight() {
        const CALLERS: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let (uri, server) = fake_server(dir.path(), |mut s| {
            for _ in 0..CALLERS {
                read_request(&mut s);
            }
            // The server goes away without a word.
        });
        let conn = Arc::new(Connection::open(&uri).unwrap());
        for (_, result) in read_in_threads(&conn, CALLERS) {
            match result {
                Err(RequestError::Connection(e)) => {
                    assert!(e.to_string().contains("closed the connection"), "{e}")
                }
                Err(RequestError::Reply(e)) => panic!("an error reply: {e}"),
                Ok(()) => panic!("answered"),
            }
        }
        server.join().unwrap();
        assert!(conn.is_dead());
        let later = conn.request(proto::CMD_FLUSH, 0, 0, None, None, None);
        assert!(matches!(later, Err(RequestError::Connection(_))));
    }

    /// A read not answered by its deadline fails with the timeout, and so
    /// does the connection with everything else in flight on it; the
    /// reply the server sends later lands nowhere (the buffer is given
    /// back untouched). Twice: the server silent after the request, and
    /// the server stalled halfway through the read's data, when the reader
    /// already holds the buffer.
    #[test]
    fn a_read_past_its_deadline_times_out_and_its_buffer_is_left_alone() {
        for halfway in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (late, go) = std::sync::mpsc::channel::<()>();
            let (uri, server) = fake_server(dir.path(), move |mut s| {
                let first = read_request(&mut s);
                let _second = read_request(&mut s);
                if halfway {
                    s.write_all(&proto::encode_simple_reply(0, first.cookie))
                        .unwrap();
                    s.write_all(&[9u8; 2048]).unwrap();
                }
                go.recv().unwrap();
                // Too late: the client has given up and shut the socket.
                let _ = s.write_all(&proto::encode_simple_reply(0, first.cookie));
                let _ = s.write_all(&[9u8; 4096]);
            });
            let conn = Arc::new(Connection::open(&uri).unwrap());
            let other = {
                let conn = conn.clone();
                std::thread::spawn(move || {
                    // Sent second, waited for without a deadline.
                    std::thread::sleep(Duration::from_millis(50));
                    let mut buf = vec![0u8; 4096];
                    conn.request(proto::CMD_READ, 8192, 4096, None, Some(&mut buf), None)
                })
            };
            let mut buf = vec![0u8; 4096];
            let began = Instant::now();
            let deadline = Deadline::after(Duration::from_millis(300));
            // SAFETY: `buf` outlives the wait.
            let ticket = unsafe {
                conn.submit(
                    proto::CMD_READ,
                    0,
                    4096,
                    None,
                    Some((buf.as_mut_ptr(), buf.len())),
                    4096,
                    Some(deadline),
                )
            }
            .ok()
            .unwrap();
            let result = ticket.wait_until(Some(deadline));
            let waited = began.elapsed();
            match result {
                Err(RequestError::Connection(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
                    assert!(e.to_string().contains("0.300 s"), "{e}");
                }
                _ => panic!("halfway {halfway}: not a timeout"),
            }
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
            assert!(waited < Duration::from_secs(10), "{waited:?}");
            let buf_after = buf.clone();
            late.send(()).unwrap();
            server.join().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(buf, buf_after, "written after the timeout");
            match other.join().unwrap() {
                Err(RequestError::Connection(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}")
                }
                _ => panic!("the other request was not failed with the timeout"),
            }
            assert!(conn.is_dead());
        }
    }

    /// An NBD member keeps the member timeout itself: the read that finds
    /// the host silent fails with the timeout, and every later request
    /// fails at once, naming the first.
    #[test]
    fn an_nbd_member_past_its_deadline_expires() {
        use crate::member::{Member, NbdMember};
        let dir = tempfile::tempdir().unwrap();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (uri, server) = fake_server(dir.path(), move |mut s| {
            read_request(&mut s);
            stopped.recv().unwrap();
        });
        let member = NbdMember::open(&uri.text, true).unwrap();
        assert!(member.keep_deadline(Duration::from_millis(200)));
        let mut buf = vec![0u8; 4096];
        let err = member.read_at(&mut buf, 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("read at 4096+4096"), "{err}");
        let began = Instant::now();
        let err = member.write_at(&[1u8; 4096], 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("stopped answering"), "{err}");
        assert!(began.elapsed() < Duration::from_millis(150));
        stop.send(()).unwrap();
        server.join().unwrap();
    }

    #[test]
    fn reply_errors_become_the_hosts_errno() {
        assert_eq!(reply_error(28).raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(reply_error(1).raw_os_error(), Some(libc::EPERM));
        assert_eq!(reply_error(4242).raw_os_error(), Some(libc::EIO));
    }
}
