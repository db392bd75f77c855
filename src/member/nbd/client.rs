//! One client connection: the fixed newstyle handshake (`NBD_OPT_STARTTLS`
//! when asked, then `NBD_OPT_GO`), and requests one at a time with simple
//! replies (structured replies are never negotiated: a read's data then
//! follows its reply header, the cheapest framing to parse).
//!
//! The handshake is shared with the benchmark's pipelined client, which
//! drives the connection itself afterwards.

use super::proto::{self, BlockSizes, InfoRequest, OptionHeader, ReplyHeader, RequestHeader};
use super::uri::{Address, NbdUri};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Option replies a handshake reads before giving up: a server sends a few
/// `NBD_REP_INFO` before the ACK, never hundreds.
const MAX_OPTION_REPLIES: usize = 64;
/// Largest option reply payload accepted (the protocol's string limit plus
/// room for the fixed fields).
const MAX_OPTION_REPLY_BYTES: u32 = 8192;

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

/// A byte stream a connection runs on: a socket, or TLS over one.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

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
    if header.option != option || header.length > MAX_OPTION_REPLY_BYTES {
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
    for _ in 0..MAX_OPTION_REPLIES {
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

/// A connection in transmission, used by one request at a time.
pub struct Connection {
    stream: Box<dyn Stream>,
    socket: Socket,
    pub info: ExportInfo,
    next_cookie: u64,
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
        let mut stream = socket.into_stream();
        start_handshake(&mut *stream)?;
        if let Some(tls) = &uri.tls {
            request_starttls(&mut *stream)?;
            stream = super::tls::client(stream, uri, tls)?;
        }
        let info = go(&mut *stream, &uri.export)?;
        control.set_timeouts(None)?;
        Ok(Connection {
            stream,
            socket: control,
            info,
            next_cookie: 0,
        })
    }

    /// A handle on the socket, to end the connection from another thread
    /// while a request waits on it.
    pub fn socket_handle(&self) -> io::Result<Socket> {
        self.socket.try_clone()
    }

    /// Sends a request (with a write's payload) and reads its reply (and a
    /// read's data into `read_into`).
    pub fn request(
        &mut self,
        command: u16,
        offset: u64,
        length: u32,
        payload: Option<&[u8]>,
        read_into: Option<&mut [u8]>,
    ) -> Result<(), RequestError> {
        self.next_cookie += 1;
        let cookie = self.next_cookie;
        let header = proto::encode_request_header(&RequestHeader {
            flags: 0,
            command,
            cookie,
            offset,
            length,
        });
        let sent = match payload {
            // Header and payload together: one write for small payloads,
            // no second round of Nagle-like waits for large ones.
            Some(data) if data.len() <= 64 << 10 => {
                let mut message = Vec::with_capacity(header.len() + data.len());
                message.extend_from_slice(&header);
                message.extend_from_slice(data);
                self.stream.write_all(&message)
            }
            Some(data) => self
                .stream
                .write_all(&header)
                .and_then(|_| self.stream.write_all(data)),
            None => self.stream.write_all(&header),
        };
        sent.and_then(|_| self.stream.flush())
            .map_err(RequestError::Connection)?;
        let mut reply = [0u8; proto::SIMPLE_REPLY_LEN];
        self.stream
            .read_exact(&mut reply)
            .map_err(|e| RequestError::Connection(lost(e)))?;
        let (error, reply_cookie) = match proto::decode_reply_header(&reply) {
            Ok(ReplyHeader::Simple { error, cookie }) => (error, cookie),
            Ok(ReplyHeader::Chunk(_)) => {
                return Err(RequestError::Connection(protocol_error(
                    "a structured reply, which was not negotiated",
                )))
            }
            Err(e) => return Err(RequestError::Connection(protocol_error(e))),
        };
        if reply_cookie != cookie {
            return Err(RequestError::Connection(protocol_error(format!(
                "reply for cookie {reply_cookie} to request {cookie}"
            ))));
        }
        if error != 0 {
            return Err(RequestError::Reply(reply_error(error)));
        }
        if let Some(buf) = read_into {
            self.stream
                .read_exact(buf)
                .map_err(|e| RequestError::Connection(lost(e)))?;
        }
        Ok(())
    }

    /// Ends the connection; a polite `NBD_CMD_DISC` first, which a dead
    /// server may never read.
    pub fn close(mut self) {
        let _ = self.socket.set_timeouts(Some(Duration::from_secs(1)));
        let header = proto::encode_request_header(&RequestHeader {
            flags: 0,
            command: proto::CMD_DISC,
            cookie: 0,
            offset: 0,
            length: 0,
        });
        let _ = self
            .stream
            .write_all(&header)
            .and_then(|_| self.stream.flush());
        self.socket.shutdown();
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

    #[test]
    fn reply_errors_become_the_hosts_errno() {
        assert_eq!(reply_error(28).raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(reply_error(1).raw_os_error(), Some(libc::EPERM));
        assert_eq!(reply_error(4242).raw_os_error(), Some(libc::EIO));
    }
}
