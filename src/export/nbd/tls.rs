//! TLS for NBD (`NBD_OPT_STARTTLS`), with OpenSSL.
//!
//! OpenSSL rather than rustls because the usual NBD clients (libnbd's
//! nbdinfo/nbdcopy, qemu-nbd, nbd-client) are GnuTLS programs that also
//! authenticate with an external pre-shared key under a user name (psktool's
//! key files), which rustls does not implement; OpenSSL's PSK server
//! callback answers them in TLS 1.2 and 1.3 alike.
//!
//! After the handshake the connection is served exactly as a plaintext
//! one: a relay thread moves bytes between the TLS session and one end of a
//! socketpair, and the NBD connection runs on the other end. That keeps the
//! transmission code (non-blocking sockets, splice, leader/follower
//! readers) unaware of TLS, at the cost of one copy each way.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::ssl::{
    ErrorCode, HandshakeError, SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode,
    SslVersion,
};

use super::io::{poll_one, PollResult, Sock};
use super::tls_config::{TlsCredentials, TlsMode};
use crate::member::nbd::psk::load_psk_file;
use crate::member::nbd::{first_reason, tls13_suites};

/// A loaded TLS configuration, shared by every connection.
#[derive(Clone)]
pub struct Tls {
    pub mode: TlsMode,
    acceptor: Arc<SslAcceptor>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tls({:?})", self.mode)
    }
}

/// Relayed bytes buffered in each direction before the relay stops reading.
const RELAY_BUFFER: usize = 256 * 1024;

impl Tls {
    /// Reads the credentials; the error is one line naming the file.
    pub fn load(mode: TlsMode, credentials: &TlsCredentials) -> Result<Tls, String> {
        let ssl_err = |what: &Path, e: openssl::error::ErrorStack| {
            format!("{}: {}", what.display(), first_reason(&e))
        };
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| format!("TLS setup: {e}"))?;
        builder
            .set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| format!("TLS setup: {e}"))?;
        // The client's order decides; ours, for a client without one.
        builder
            .set_ciphersuites(tls13_suites())
            .map_err(|e| format!("TLS setup: {e}"))?;
        match credentials {
            TlsCredentials::Psk(path) => {
                let keys = load_psk_file(path)?;
                // The PSK suites (GnuTLS's NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK);
                // TLS 1.3 suites are set apart (`tls13_suites`).
                builder
                    .set_cipher_list("ECDHEPSK:DHEPSK:PSK:!aNULL:!eNULL:!3DES:!RC4:!SHA1")
                    .map_err(|e| ssl_err(path, e))?;
                builder.set_psk_server_callback(move |_ssl, identity, out| {
                    let key = identity
                        .and_then(|id| std::str::from_utf8(id).ok())
                        .and_then(|id| keys.get(id));
                    match key {
                        Some(key) if key.len() <= out.len() => {
                            out[..key.len()].copy_from_slice(key);
                            Ok(key.len())
                        }
                        // Zero bytes: unknown user, the handshake fails.
                        _ => Ok(0),
                    }
                });
            }
            TlsCredentials::X509 { dir, verify_peer } => {
                let ca = dir.join("ca-cert.pem");
                let cert = dir.join("server-cert.pem");
                let key = dir.join("server-key.pem");
                for file in [&ca, &cert, &key] {
                    std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
                }
                builder
                    .set_certificate_chain_file(&cert)
                    .map_err(|e| ssl_err(&cert, e))?;
                builder
                    .set_private_key_file(&key, SslFiletype::PEM)
                    .map_err(|e| ssl_err(&key, e))?;
                builder.check_private_key().map_err(|e| {
                    format!(
                        "{}: does not match {}: {}",
                        key.display(),
                        cert.display(),
                        first_reason(&e)
                    )
                })?;
                builder.set_ca_file(&ca).map_err(|e| ssl_err(&ca, e))?;
                if *verify_peer {
                    builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
                } else {
                    builder.set_verify(SslVerifyMode::NONE);
                }
            }
        }
        Ok(Tls {
            mode,
            acceptor: Arc::new(builder.build()),
        })
    }

    /// Runs the TLS handshake on `sock` (whose `NBD_REP_ACK` to STARTTLS has
    /// gone out) and starts the relay. Returns the plaintext side, on which
    /// negotiation continues, and the relay thread.
    pub(crate) fn start(
        &self,
        sock: &Sock,
        wake: RawFd,
        deadline: Option<Instant>,
        linger: Option<Duration>,
    ) -> Result<(Sock, std::thread::JoinHandle<()>), String> {
        let fd = dup(sock.raw()).map_err(|e| format!("dup: {e}"))?;
        let stream = FdStream(fd);
        let mut attempt = self.acceptor.accept(stream);
        let tls = loop {
            match attempt {
                Ok(tls) => break tls,
                Err(HandshakeError::WouldBlock(mid)) => {
                    let events = if mid.error().code() == ErrorCode::WANT_WRITE {
                        libc::POLLOUT
                    } else {
                        libc::POLLIN
                    };
                    match poll_one(mid.get_ref().0.as_raw_fd(), events, Some(wake), deadline) {
                        Ok(PollResult::Ready) => {}
                        Ok(PollResult::Woken) => return Err("the server is stopping".into()),
                        Ok(PollResult::TimedOut) => return Err("TLS handshake timed out".into()),
                        Err(e) => return Err(format!("TLS handshake: {e}")),
                    }
                    attempt = mid.handshake();
                }
                Err(HandshakeError::Failure(mid)) => {
                    return Err(format!("TLS handshake failed: {}", describe(mid.error())))
                }
                Err(HandshakeError::SetupFailure(e)) => {
                    return Err(format!("TLS setup failed: {e}"))
                }
            }
        };
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors socketpair writes.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(format!("socketpair: {}", io::Error::last_os_error()));
        }
        // SAFETY: socketpair returned two new descriptors that we now own.
        let (inner, outer) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let inner = Sock::new(inner).map_err(|e| format!("socketpair: {e}"))?;
        let relay = std::thread::Builder::new()
            .name("nbd-tls".into())
            .spawn(move || relay(tls, outer, linger))
            .map_err(|e| format!("cannot start the TLS relay: {e}"))?;
        Ok((inner, relay))
    }
}

fn describe(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => first_reason(stack),
        None => match e.io_error() {
            Some(io) => io.to_string(),
            None => "the client closed the connection".into(),
        },
    }
}

fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we hold; a new one on success.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new is a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A non-blocking socket as OpenSSL's transport; MSG_NOSIGNAL keeps a write
/// to a closed connection from raising SIGPIPE.
struct FdStream(OwnedFd);

impl Read for FdStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv(self.0.as_raw_fd(), buf)
    }
}

impl Write for FdStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send(self.0.as_raw_fd(), buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Which way OpenSSL needs the TLS socket to move before it can go on.
fn wants(e: &openssl::ssl::Error) -> Option<i16> {
    match e.code() {
        ErrorCode::WANT_READ => Some(libc::POLLIN),
        ErrorCode::WANT_WRITE => Some(libc::POLLOUT),
        _ => None,
    }
}

/// Moves bytes both ways between the TLS session and the plaintext socket
/// until either side ends. Each direction is buffered up to RELAY_BUFFER
/// and non-blocking, so a connection that writes replies while its client
/// sends requests never waits on itself. Once the connection has ended,
/// its last replies wait at most `linger` for a client that does not read
/// them, so that a stopping server is not held up.
fn relay(mut tls: SslStream<FdStream>, plain: OwnedFd, linger: Option<Duration>) {
    let tls_fd = tls.get_ref().0.as_raw_fd();
    let plain_fd = plain.as_raw_fd();
    let mut to_plain: Vec<u8> = Vec::new();
    let mut to_tls: Vec<u8> = Vec::new();
    let mut tls_open = true;
    let mut plain_open = true;
    let mut plain_write_shut = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let mut tls_events: i16 = 0;
        // Decrypted bytes to the connection.
        if !to_plain.is_empty() {
            match send(plain_fd, &to_plain) {
                Ok(n) => drop(to_plain.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        // From the client.
        while tls_open && to_plain.len() < RELAY_BUFFER {
            match tls.ssl_read(&mut chunk) {
                Ok(0) => tls_open = false,
                Ok(n) => to_plain.extend_from_slice(&chunk[..n]),
                Err(e) => {
                    match wants(&e) {
                        Some(events) => tls_events |= events,
                        None => tls_open = false,
                    }
                    break;
                }
            }
        }
        // From the connection.
        while plain_open && to_tls.len() < RELAY_BUFFER {
            match recv(plain_fd, &mut chunk) {
                Ok(0) => plain_open = false,
                Ok(n) => to_tls.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => plain_open = false,
            }
        }
        // Encrypted to the client.
        let mut tls_dead = false;
        while !to_tls.is_empty() {
            match tls.ssl_write(&to_tls) {
                Ok(n) => drop(to_tls.drain(..n)),
                Err(e) => {
                    match wants(&e) {
                        Some(events) => tls_events |= events,
                        None => tls_dead = true,
                    }
                    break;
                }
            }
        }
        if tls_dead {
            break;
        }
        if !tls_open && to_plain.is_empty() && !plain_write_shut {
            // The client is done sending: the connection reads its end.
            // SAFETY: shutdown on a descriptor we own.
            unsafe { libc::shutdown(plain_fd, libc::SHUT_WR) };
            plain_write_shut = true;
        }
        if !plain_open && to_tls.is_empty() {
            let _ = tls.shutdown();
            break;
        }
        if tls_open && to_plain.len() < RELAY_BUFFER {
            tls_events |= libc::POLLIN;
        }
        let mut plain_events: i16 = 0;
        if plain_open && to_tls.len() < RELAY_BUFFER {
            plain_events |= libc::POLLIN;
        }
        if !to_plain.is_empty() {
            plain_events |= libc::POLLOUT;
        }
        let mut fds = [
            libc::pollfd {
                fd: tls_fd,
                events: tls_events,
                revents: 0,
            },
            libc::pollfd {
                fd: plain_fd,
                events: plain_events,
                revents: 0,
            },
        ];
        if tls_events == 0 && plain_events == 0 {
            break;
        }
        let timeout = match linger {
            Some(t) if !plain_open => t.as_millis().min(i32::MAX as u128) as i32,
            _ => -1,
        };
        // SAFETY: fds is a valid array of two pollfd.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if rc == 0 || (rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted) {
            break;
        }
    }
    // SAFETY: shutdown on descriptors we own; the connection sees its end.
    unsafe {
        libc::shutdown(plain_fd, libc::SHUT_RDWR);
        libc::shutdown(tls_fd, libc::SHUT_RDWR);
    }
}
