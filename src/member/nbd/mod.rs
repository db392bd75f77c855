//! Members on NBD servers: an export named by an NBD URI
//! (`nbd://host[:port]/export`, `nbds://…`, `nbd+unix:///export?socket=…`)
//! is a member like a disk.
//!
//! A member holds a small pool of connections, each carrying up to
//! `client::CONNECTION_DEPTH` requests at once: callers send on the next
//! connection in turn and wait for their own reply, which the connection's
//! reader thread matches by cookie, so that the array's concurrent I/O is
//! not queued behind one round trip per connection. The pool has several
//! connections only when the server advertises `NBD_FLAG_CAN_MULTI_CONN`
//! (a flush on one then covers the writes done on all); otherwise one.
//! A flush covers what the server has acknowledged, which is every write
//! whose caller has returned: callers that want a write flushed wait for it
//! first, as with a disk.
//!
//! A connection that breaks (the server died, the network went away, the
//! server broke the protocol) fails every request in flight on it with an
//! I/O error, as a disk's would, so the engine fails the member; every
//! later request fails at once, on whichever connection. `Member::reconnect`
//! opens the pool anew, for a member brought back (or `member::open` opens
//! the URI again).

mod client;
pub mod proto;
pub mod psk;
#[cfg(feature = "tls")]
mod tls;
#[cfg(not(feature = "tls"))]
#[path = "tls_off.rs"]
mod tls;
pub mod uri;

pub use client::{connect_socket, go, request_starttls, start_handshake, ExportInfo, Socket};
#[cfg(feature = "tls")]
pub(crate) use tls::{first_reason, tls13_suites};
pub use uri::{is_nbd_uri, NbdUri};

use super::batch::Buffer;
use super::stats::IoStats;
use super::{check_io, io_error, Member, Started};
use client::{Connection, Deadline, RequestError};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The largest request sent, whatever the server allows: 32 MiB is the
/// protocol's usual cap and what nbdkit and qemu-nbd accept.
const REQUEST_BYTES_MAX: u32 = 32 << 20;

pub struct NbdMember {
    uri: NbdUri,
    write: bool,
    info: ExportInfo,
    block_bytes: u32,
    size_bytes: u64,
    max_request_bytes: u32,
    /// `None`: closed by a `reconnect` that could not open it again.
    pool: Vec<Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
    /// A connection broke: every request fails until `reconnect`, so that
    /// the member reads as gone, not as a disk that fails now and then.
    broken: AtomicBool,
    /// The member timeout it keeps itself (`Member::keep_deadline`), in
    /// microseconds; 0: none.
    timeout_us: AtomicU64,
    /// The request that missed its deadline, while the member is broken
    /// by it: later requests fail at once with it as their reason.
    expired: Mutex<Option<String>>,
    stats: IoStats,
}

impl std::fmt::Debug for NbdMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdMember({})", self.uri.text)
    }
}

/// Prefixes an error with the URI, once.
fn named(uri: &NbdUri, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", uri.text))
}

impl NbdMember {
    /// Parses `text` and connects. With `write`, a read-only export is
    /// refused.
    pub fn open(text: &str, write: bool) -> io::Result<NbdMember> {
        let uri: NbdUri = text.parse().map_err(|e: uri::UriError| {
            io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
        })?;
        Self::open_uri(uri, write)
    }

    pub fn open_uri(uri: NbdUri, write: bool) -> io::Result<NbdMember> {
        check_tls_before_connecting(&uri)?;
        let first = Connection::open(&uri).map_err(|e| named(&uri, e))?;
        let info = first.info;
        if write && info.has(proto::TFLAG_READ_ONLY) {
            drop(first);
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: the export is read-only", uri.text),
            ));
        }
        let sizes = info.block_sizes;
        let block_bytes = sizes.map_or(512, |s| s.min.max(512));
        if !block_bytes.is_power_of_two() || block_bytes > 65536 {
            drop(first);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the server's block size {block_bytes} is not usable",
                    uri.text
                ),
            ));
        }
        let max_request_bytes =
            sizes.map_or(REQUEST_BYTES_MAX, |s| s.max_payload.min(REQUEST_BYTES_MAX)) / block_bytes
                * block_bytes;
        let count = if info.has(proto::TFLAG_CAN_MULTI_CONN) {
            uri.connections
        } else {
            1
        };
        let mut pool = vec![Mutex::new(Some(Arc::new(first)))];
        for _ in 1..count {
            // The extra connections are a speed-up: a server that takes
            // fewer than asked still serves the member (a connection of
            // another export is dropped, which closes it).
            match Connection::open(&uri) {
                Ok(conn) if conn.info == info => pool.push(Mutex::new(Some(Arc::new(conn)))),
                _ => break,
            }
        }
        Ok(NbdMember {
            size_bytes: info.size_bytes / block_bytes as u64 * block_bytes as u64,
            uri,
            write,
            info,
            block_bytes,
            max_request_bytes: max_request_bytes.max(block_bytes),
            pool,
            next: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            timeout_us: AtomicU64::new(0),
            expired: Mutex::new(None),
            stats: IoStats::default(),
        })
    }

    /// The parsed URI.
    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    /// What the server negotiated.
    pub fn export_info(&self) -> ExportInfo {
        self.info
    }

    /// The TLS protocol and suite of its first connection ("TLSv1.3
    /// TLS_AES_128_GCM_SHA256"), on a TLS member.
    pub fn tls_session(&self) -> Option<String> {
        let conn = self.pool.first()?.lock().unwrap().clone()?;
        conn.tls_session.clone()
    }

    /// Connections the member holds (broken ones included).
    pub fn connections(&self) -> usize {
        self.pool.len()
    }

    /// Opens every connection anew (a broken one, or all after the server
    /// came back), for a member taken back into service. The export must
    /// still have the size and block size it had: another export behind
    /// the same URI is refused. Requests still waiting on the old
    /// connections (a server that hangs) fail first.
    fn reconnect_pool(&self) -> io::Result<()> {
        self.broken.store(true, Ordering::Release);
        for slot in &self.pool {
            let old = slot.lock().unwrap().take();
            if let Some(old) = old {
                old.close();
            }
        }
        let mut fresh = Vec::with_capacity(self.pool.len());
        for _ in 0..self.pool.len() {
            let conn = Connection::open(&self.uri).map_err(|e| named(&self.uri, e))?;
            let same = conn.info.size_bytes == self.info.size_bytes
                && conn.info.block_sizes.map_or(512, |s| s.min.max(512)) == self.block_bytes
                && !(self.write && conn.info.has(proto::TFLAG_READ_ONLY));
            if !same {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: the export changed (size, block size or read-only)",
                        self.uri.text
                    ),
                ));
            }
            conn.set_send_timeout(self.timeout())?;
            fresh.push(conn);
        }
        for (slot, conn) in self.pool.iter().zip(fresh) {
            *slot.lock().unwrap() = Some(Arc::new(conn));
        }
        *self.expired.lock().unwrap() = None;
        self.broken.store(false, Ordering::Release);
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        match self.timeout_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// The deadline of a request starting now.
    fn deadline(&self) -> Option<Deadline> {
        self.timeout().map(Deadline::after)
    }

    /// A request missed its deadline: the host is not answering. Every
    /// connection is failed, so that what is in flight on the others
    /// fails now instead of each at its own deadline, and every later
    /// request fails at once, until `reconnect` (or a reopened member).
    fn expire(&self, why: &str) {
        {
            let mut expired = self.expired.lock().unwrap();
            if expired.is_none() {
                *expired = Some(why.to_string());
            }
        }
        self.broken.store(true, Ordering::Release);
        for slot in &self.pool {
            let conn = slot.lock().unwrap().clone();
            if let Some(conn) = conn {
                conn.abort(io::Error::new(io::ErrorKind::TimedOut, why.to_string()));
            }
        }
    }

    /// The next connection in turn, unless the member lost one.
    fn connection(&self) -> io::Result<Arc<Connection>> {
        let lost = || {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection to the server was lost",
            )
        };
        if self.broken.load(Ordering::Acquire) {
            if let Some(first) = self.expired.lock().unwrap().as_ref() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("not sent: the member stopped answering ({first})"),
                ));
            }
            return Err(lost());
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        self.pool[at].lock().unwrap().clone().ok_or_else(lost)
    }

    /// A request's error; a broken connection breaks the member, and a
    /// missed deadline expires it.
    fn failed(&self, e: RequestError) -> io::Error {
        match e {
            RequestError::Reply(e) => e,
            RequestError::Connection(e) => {
                if e.kind() == io::ErrorKind::TimedOut {
                    self.expire(&e.to_string());
                }
                self.broken.store(true, Ordering::Release);
                e
            }
        }
    }

    /// Sends every piece of one transfer (at most `max_request_bytes`
    /// each) and returns them with the first error met sending, for
    /// `finish` to wait for.
    ///
    /// # Safety
    /// A read's buffer must stay valid and untouched until `finish` has
    /// returned or the pieces are dropped.
    unsafe fn send(&self, flags: u16, offset_bytes: u64, buffer: Buffer) -> Sent {
        let (what, command, len, payload, into) = match buffer {
            Buffer::Read(buf) => (
                "read",
                proto::CMD_READ,
                buf.len(),
                None,
                Some(buf.as_mut_ptr()),
            ),
            Buffer::Write(buf) => ("write", proto::CMD_WRITE, buf.len(), Some(buf), None),
        };
        let deadline = self.deadline();
        let step = self.max_request_bytes as usize;
        let mut sent = Sent {
            what,
            deadline,
            pieces: Vec::with_capacity(len.div_ceil(step)),
            first_error: None,
        };
        for done in (0..len).step_by(step) {
            let piece = step.min(len - done);
            let at = offset_bytes + done as u64;
            let ticket = self.connection().and_then(|conn| {
                let data = payload.map(|p| &p[done..done + piece]);
                // SAFETY: the pieces are disjoint parts of the read's
                // buffer, which the caller keeps until they are done.
                let dest = into.map(|p| (unsafe { p.add(done) }, piece));
                unsafe { conn.submit(command, flags, at, data, dest, piece as u32, deadline) }
                    .map_err(|e| self.failed(e))
            });
            match ticket {
                Ok(ticket) => sent.pieces.push((at, piece, ticket)),
                Err(e) => {
                    sent.first_error = Some(io_error(&self.uri.text, what, at, piece, e));
                    break;
                }
            }
        }
        sent
    }

    /// Waits for every piece sent, until their deadline, and returns the
    /// first error.
    fn finish(&self, sent: Sent) -> io::Result<()> {
        let Sent {
            what,
            deadline,
            pieces,
            mut first_error,
        } = sent;
        for (at, piece, ticket) in pieces {
            if let Err(e) = ticket.wait_until(deadline) {
                let e = self.failed(e);
                first_error.get_or_insert_with(|| io_error(&self.uri.text, what, at, piece, e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn transfer(&self, flags: u16, offset_bytes: u64, buffer: Buffer) -> io::Result<()> {
        // SAFETY: the buffer is borrowed until `finish` returns.
        let sent = unsafe { self.send(flags, offset_bytes, buffer) };
        self.finish(sent)
    }

    /// One request without data, waited for.
    fn simple(&self, command: u16, offset: u64, length: u32) -> io::Result<()> {
        let conn = self.connection()?;
        conn.request(command, offset, length, None, None, self.deadline())
            .map_err(|e| self.failed(e))
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.write {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: opened read-only", self.uri.text),
        ))
    }
}

/// The pieces of one transfer on the wire (`NbdMember::send`).
struct Sent {
    what: &'static str,
    deadline: Option<Deadline>,
    pieces: Vec<(u64, usize, client::Ticket)>,
    first_error: Option<io::Error>,
}

/// Refuses what would fail after connecting anyway, before any byte goes
/// out: TLS in a build without it, a key file that cannot be read.
fn check_tls_before_connecting(uri: &NbdUri) -> io::Result<()> {
    let Some(tls) = &uri.tls else {
        return Ok(());
    };
    if !cfg!(feature = "tls") {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: this uraid was built without TLS (cargo feature `tls`)",
                uri.text
            ),
        ));
    }
    if let uri::TlsAuth::Psk { file, username } = &tls.auth {
        let keys = psk::load_psk_file(file).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", uri.text))
        })?;
        if !keys.contains_key(username) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {} has no key for user {username:?} (give tls-username= or user@ in the URI)",
                    uri.text,
                    file.display()
                ),
            ));
        }
    }
    Ok(())
}

impl Drop for NbdMember {
    fn drop(&mut self) {
        for slot in &self.pool {
            let conn = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(conn) = conn {
                conn.close();
            }
        }
    }
}

impl Member for NbdMember {
    fn name(&self) -> &str {
        &self.uri.text
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.transfer(0, offset_bytes, Buffer::Read(buf))
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.check_writable()?;
        self.transfer(0, offset_bytes, Buffer::Write(buf))
    }

    /// With `NBD_CMD_FLAG_FUA` on every piece when the server takes it:
    /// the server makes those writes durable before it answers, without a
    /// flush of everything else it holds.
    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        if !self.write || !self.info.has(proto::TFLAG_SEND_FUA) {
            self.write_at(buf, offset_bytes)?;
            return self.flush();
        }
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.transfer(proto::CMD_FLAG_FUA, offset_bytes, Buffer::Write(buf))
    }

    fn starts_io(&self) -> bool {
        true
    }

    /// Every piece on the wire at once, read straight into `buf` by the
    /// connections' readers: a batch sends all its ops before waiting.
    fn start_read<'a>(&'a self, buf: &'a mut [u8], offset_bytes: u64) -> Option<Started<'a>> {
        if let Err(e) = check_io(self, offset_bytes, buf.len() as u64) {
            return Some(Box::new(move || Err(e)));
        }
        // SAFETY: the closure holds the borrow of `buf` until it has
        // waited for every piece, or drops them (which waits for the
        // readers to let go).
        let sent = unsafe { self.send(0, offset_bytes, Buffer::Read(&mut *buf)) };
        Some(Box::new(move || {
            let _lent = buf;
            self.finish(sent)
        }))
    }

    /// A write's pieces are sent before this returns (the payload is
    /// copied into the sockets), so only the replies are waited for later.
    /// With `fua`, as `write_at_fua`: the flag on every piece, or a flush
    /// after the replies when the server does not take it.
    fn start_write<'a>(
        &'a self,
        buf: &'a [u8],
        offset_bytes: u64,
        fua: bool,
    ) -> Option<Started<'a>> {
        let checked =
            check_io(self, offset_bytes, buf.len() as u64).and_then(|()| self.check_writable());
        if let Err(e) = checked {
            return Some(Box::new(move || Err(e)));
        }
        let flagged = fua && self.info.has(proto::TFLAG_SEND_FUA);
        let flags = if flagged { proto::CMD_FLAG_FUA } else { 0 };
        // SAFETY: a write lends nothing past the send.
        let sent = unsafe { self.send(flags, offset_bytes, Buffer::Write(buf)) };
        Some(Box::new(move || {
            self.finish(sent)?;
            if fua && !flagged {
                return self.flush();
            }
            Ok(())
        }))
    }

    /// The member timeout, kept by the requests themselves: a request
    /// waits for its reply until its deadline and then fails its
    /// connection, with no thread between the caller and the socket. The
    /// reader writes a read's data into the caller's buffer, and a request
    /// given up is taken out of its connection first (or waited for while
    /// the reader is still writing it), so a late reply lands nowhere.
    fn keep_deadline(&self, timeout: Duration) -> bool {
        let us = (timeout.as_micros() as u64).max(1);
        self.timeout_us.store(us, Ordering::Relaxed);
        for slot in &self.pool {
            let conn = slot.lock().unwrap().clone();
            if let Some(conn) = conn {
                // A failure here leaves sends unbounded by the socket; the
                // replies are still waited for until the deadline.
                let _ = conn.set_send_timeout(Some(timeout));
            }
        }
        true
    }

    fn flush(&self) -> io::Result<()> {
        if !self.write || !self.info.has(proto::TFLAG_SEND_FLUSH) {
            // A server without FLUSH writes through (the protocol's
            // meaning of not advertising it).
            return Ok(());
        }
        self.simple(proto::CMD_FLUSH, 0, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: flush: {e}", self.uri.text)))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        if !self.write || !self.info.has(proto::TFLAG_SEND_TRIM) {
            return Ok(());
        }
        // A trim carries no payload, but its length is 32 bits.
        let step = (u32::MAX / self.block_bytes * self.block_bytes) as u64;
        let mut at = offset_bytes;
        let end = offset_bytes + len_bytes;
        while at < end {
            let len = (end - at).min(step);
            self.simple(proto::CMD_TRIM, at, len as u32)
                .map_err(|e| io_error(&self.uri.text, "discard", at, len as usize, e))?;
            at += len;
        }
        Ok(())
    }

    fn io_stats(&self) -> Option<&IoStats> {
        Some(&self.stats)
    }

    fn reconnect(&self) -> io::Result<()> {
        self.reconnect_pool()
    }

    /// A fresh member on new connections to the same URI (a host that came
    /// back), for the engine's re-add; another export behind the URI (a
    /// different size or block size) is refused, as by `reconnect`.
    fn reopen(&self) -> io::Result<super::MemberRef> {
        let fresh = NbdMember::open_uri(self.uri.clone(), self.write)?;
        if fresh.size_bytes != self.size_bytes || fresh.block_bytes != self.block_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the export behind the URI is another one now",
                    self.uri.text
                ),
            ));
        }
        if let Some(timeout) = self.timeout() {
            fresh.keep_deadline(timeout);
        }
        Ok(std::sync::Arc::new(fresh))
    }
}
