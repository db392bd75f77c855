//! Members on NBD servers: an export named by an NBD URI
//! (`nbd://host[:port]/export`, `nbds://…`, `nbd+unix:///export?socket=…`)
//! is a member like a disk.
//!
//! A member holds a small pool of connections, each carrying one request
//! at a time: a request takes a free connection (or waits for one), so the
//! requests in flight per member are bounded by the pool, and no reply has
//! to be matched to a request on another thread. The pool has several
//! connections only when the server advertises `NBD_FLAG_CAN_MULTI_CONN`
//! (a flush on one then covers the writes done on all); otherwise one.
//!
//! A connection that breaks (the server died, the network went away, the
//! server broke the protocol) is dropped and its request fails with an
//! I/O error, as a disk's would, so the engine fails the member; every
//! later request fails at once, on whichever connection. `Member::reconnect` opens the pool anew,
//! for a member brought back (or `member::open` opens the URI again).

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
pub(crate) use tls::first_reason;
pub use uri::{is_nbd_uri, NbdUri};

use super::stats::IoStats;
use super::{check_io, io_error, Member};
use client::{Connection, RequestError};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The largest request sent, whatever the server allows: 32 MiB is the
/// protocol's usual cap and what nbdkit and qemu-nbd accept.
const MAX_REQUEST_BYTES: u32 = 32 << 20;

pub struct NbdMember {
    uri: NbdUri,
    write: bool,
    info: ExportInfo,
    block_bytes: u32,
    size_bytes: u64,
    max_request_bytes: u32,
    /// `None`: the connection broke and waits for `reconnect`.
    pool: Vec<Mutex<Option<Connection>>>,
    /// The pool's sockets, to end them without waiting for the requests
    /// that hold their connections.
    sockets: Mutex<Vec<Socket>>,
    next: AtomicUsize,
    /// A connection broke: every request fails until `reconnect`, so that
    /// the member reads as gone, not as a disk that fails now and then.
    broken: AtomicBool,
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
            first.close();
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: the export is read-only", uri.text),
            ));
        }
        let sizes = info.block_sizes;
        let block_bytes = sizes.map_or(512, |s| s.min.max(512));
        if !block_bytes.is_power_of_two() || block_bytes > 65536 {
            first.close();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the server's block size {block_bytes} is not usable",
                    uri.text
                ),
            ));
        }
        let max_request_bytes =
            sizes.map_or(MAX_REQUEST_BYTES, |s| s.max_payload.min(MAX_REQUEST_BYTES)) / block_bytes
                * block_bytes;
        let count = if info.has(proto::TFLAG_CAN_MULTI_CONN) {
            uri.connections
        } else {
            1
        };
        let mut pool = vec![Mutex::new(Some(first))];
        for _ in 1..count {
            // The extra connections are a speed-up: a server that takes
            // fewer than asked still serves the member.
            match Connection::open(&uri) {
                Ok(conn) if conn.info == info => pool.push(Mutex::new(Some(conn))),
                Ok(conn) => {
                    conn.close();
                    break;
                }
                Err(_) => break,
            }
        }
        let sockets = pool
            .iter()
            .filter_map(|slot| slot.lock().unwrap().as_ref()?.socket_handle().ok())
            .collect();
        Ok(NbdMember {
            sockets: Mutex::new(sockets),
            size_bytes: info.size_bytes / block_bytes as u64 * block_bytes as u64,
            uri,
            write,
            info,
            block_bytes,
            max_request_bytes: max_request_bytes.max(block_bytes),
            pool,
            next: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
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
        for socket in self.sockets.lock().unwrap().drain(..) {
            socket.shutdown();
        }
        let mut fresh = Vec::with_capacity(self.pool.len());
        for _ in 0..self.pool.len() {
            let conn = Connection::open(&self.uri).map_err(|e| named(&self.uri, e))?;
            let same = conn.info.size_bytes == self.info.size_bytes
                && conn.info.block_sizes.map_or(512, |s| s.min.max(512)) == self.block_bytes
                && !(self.write && conn.info.has(proto::TFLAG_READ_ONLY));
            if !same {
                conn.close();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: the export changed (size, block size or read-only)",
                        self.uri.text
                    ),
                ));
            }
            fresh.push(conn);
        }
        let mut sockets = self.sockets.lock().unwrap();
        for (slot, conn) in self.pool.iter().zip(fresh) {
            sockets.extend(conn.socket_handle());
            if let Some(old) = slot.lock().unwrap().replace(conn) {
                old.close();
            }
        }
        drop(sockets);
        self.broken.store(false, Ordering::Release);
        Ok(())
    }

    /// Runs one request on a free connection (or waits for the next one
    /// in turn); a broken connection is dropped and its error returned.
    fn request(
        &self,
        command: u16,
        offset: u64,
        length: u32,
        payload: Option<&[u8]>,
        read_into: Option<&mut [u8]>,
    ) -> io::Result<()> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.pool.len();
        let mut guard = (0..n)
            .find_map(|i| self.pool[(start + i) % n].try_lock().ok())
            .unwrap_or_else(|| self.pool[start % n].lock().unwrap());
        let conn = match guard.as_mut() {
            Some(conn) if !self.broken.load(Ordering::Acquire) => conn,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the connection to the server was lost",
                ))
            }
        };
        match conn.request(command, offset, length, payload, read_into) {
            Ok(()) => Ok(()),
            Err(RequestError::Reply(e)) => Err(e),
            Err(RequestError::Connection(e)) => {
                self.broken.store(true, Ordering::Release);
                if let Some(conn) = guard.take() {
                    conn.close();
                }
                Err(e)
            }
        }
    }
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
            if let Some(conn) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
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
        let mut done = 0usize;
        for chunk in buf.chunks_mut(self.max_request_bytes as usize) {
            let at = offset_bytes + done as u64;
            let len = chunk.len();
            self.request(proto::CMD_READ, at, len as u32, None, Some(chunk))
                .map_err(|e| io_error(&self.uri.text, "read", at, len, e))?;
            done += len;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        if !self.write {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: opened read-only", self.uri.text),
            ));
        }
        let mut done = 0usize;
        for chunk in buf.chunks(self.max_request_bytes as usize) {
            let at = offset_bytes + done as u64;
            self.request(proto::CMD_WRITE, at, chunk.len() as u32, Some(chunk), None)
                .map_err(|e| io_error(&self.uri.text, "write", at, chunk.len(), e))?;
            done += chunk.len();
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.write || !self.info.has(proto::TFLAG_SEND_FLUSH) {
            // A server without FLUSH writes through (the protocol's
            // meaning of not advertising it).
            return Ok(());
        }
        self.request(proto::CMD_FLUSH, 0, 0, None, None)
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
            self.request(proto::CMD_TRIM, at, len as u32, None, None)
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
        Ok(std::sync::Arc::new(fresh))
    }
}
