//! The listening side: `serve`, the accept loop, and shutdown.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn;
use super::io::{poll_one, PollResult, Sock};
use super::listen::{self, Bound, BoundAddr, Listener};
use super::proto;
use super::unaligned::WriteLocks;
use crate::export::{BlockBackend, BlockSizes};

/// Tunables of an NBD server. `ServeOptions::default()` suits a local RAID
/// export; every field is public so callers change only what they need.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The export's name. Clients may use it or the empty (default) name.
    pub export_name: String,
    /// A human-readable description (NBD_INFO_DESCRIPTION, and the detail
    /// text of NBD_OPT_LIST). Empty means none.
    pub description: String,
    /// Cap on the payload of one request, on top of the backend's own
    /// maximum. Bounds the memory a single request can pin.
    pub max_payload: u32,
    /// Requests one connection may have in flight at once. Once reached, the
    /// server stops reading from that connection until one completes.
    pub max_inflight: usize,
    /// Bytes of read and write buffers one connection may have in flight
    /// (a request larger than this is still admitted when it is alone).
    pub max_inflight_bytes: u64,
    /// Threads per connection that execute requests against the backend.
    pub workers_per_connection: usize,
    /// Connections served at once; further ones are closed on accept.
    pub max_connections: usize,
    /// Time a client has to finish option negotiation; `None` waits forever.
    pub handshake_timeout: Option<Duration>,
    /// Time a client may leave a request half-sent, or leave its replies
    /// unread, before the server drops it; `None` waits forever.
    pub io_timeout: Option<Duration>,
    /// Refuse clients that do not ask for the block size constraints
    /// (NBD_REP_ERR_BLOCK_SIZE_REQD to OPT_GO; OPT_EXPORT_NAME is dropped).
    /// Off by default: clients that do not ask may address single bytes, as
    /// the spec asks of a server, and the server reads, modifies and writes
    /// back the partial blocks of their requests.
    pub require_block_size: bool,
    /// Log every connection and disconnection, not only errors.
    pub log_connections: bool,
    /// The CPUs the server plans for (the process's, by default): with more
    /// busy connections than this, staged writes are stored by the worker
    /// that read them (`conn::Conn::serves_inline`).
    pub cpus: usize,
    /// TLS offered or required through `NBD_OPT_STARTTLS`; `None` answers
    /// it `NBD_REP_ERR_UNSUP`.
    pub tls: Option<super::Tls>,
    /// Splice big read replies to clients on this host too. Off: such a
    /// client reads spliced page-cache pages at a higher CPU cost than the
    /// copy saves the server (docs/BENCHMARKS.md); the tests of the splice
    /// path, whose clients are all local, turn it on.
    pub splice_to_local_clients: bool,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            export_name: "uraid".to_string(),
            description: String::new(),
            max_payload: 32 << 20,
            max_inflight: 128,
            max_inflight_bytes: 128 << 20,
            workers_per_connection: 64,
            max_connections: 256,
            handshake_timeout: Some(Duration::from_secs(30)),
            io_timeout: Some(Duration::from_secs(60)),
            require_block_size: false,
            log_connections: false,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tls: None,
            splice_to_local_clients: false,
        }
    }
}

/// What the server knows about its one export, fixed at `serve` time. The
/// size is not: each connection asks the backend at its handshake, so that
/// after an array grows a new connection sees the new size (NBD has no
/// resize; a connection keeps the size it was given).
pub(crate) struct ExportInfo {
    pub(crate) block_sizes: BlockSizes,
    pub(crate) read_only: bool,
    pub(crate) multi_conn: bool,
    pub(crate) rotational: bool,
}

impl ExportInfo {
    /// The transmission flags for a connection, which depend on whether it
    /// negotiated structured replies (DF is only meaningful with them).
    pub(crate) fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags = proto::TFLAG_HAS_FLAGS
            | proto::TFLAG_SEND_FLUSH
            | proto::TFLAG_SEND_FUA
            | proto::TFLAG_SEND_CACHE;
        if self.read_only {
            flags |= proto::TFLAG_READ_ONLY;
        } else {
            // FAST_ZERO is advertised whatever the backend: the spec allows a
            // server that answers every fast-zero request with a quick
            // ENOTSUP, and that answer is exactly what lets a client skip a
            // slow pre-zeroing pass.
            flags |= proto::TFLAG_SEND_TRIM
                | proto::TFLAG_SEND_WRITE_ZEROES
                | proto::TFLAG_SEND_FAST_ZERO;
        }
        if structured_replies {
            flags |= proto::TFLAG_SEND_DF;
        }
        if self.multi_conn {
            flags |= proto::TFLAG_CAN_MULTI_CONN;
        }
        if self.rotational {
            flags |= proto::TFLAG_ROTATIONAL;
        }
        flags
    }
}

/// State shared by the accept loop, every connection and the handle.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn BlockBackend>,
    pub(crate) export: ExportInfo,
    pub(crate) options: ServeOptions,
    stopping: AtomicBool,
    /// The shutdown pipe: one byte is written on stop and never read, so the
    /// read end stays readable and wakes every poll that includes it.
    wake_r: OwnedFd,
    wake_w: OwnedFd,
    pub(crate) live_connections: AtomicUsize,
    /// Reads answered by the fast path (see `fastpath`), since start.
    pub(crate) fast_reads: AtomicU64,
    /// Reads served inline by the worker that read them (members in
    /// memory, see `conn::Conn::serves_inline`), since start.
    pub(crate) inline_reads: AtomicU64,
    /// Writes whose payload went from the socket to the backend's files
    /// through a pipe (see `BlockBackend::write_staged`), since start.
    pub(crate) staged_writes: AtomicU64,
    /// Staged writes served by the worker that read them (see
    /// `conn::Conn::serves_inline`), since start.
    pub(crate) inline_writes: AtomicU64,
    /// Connections with at least one request in flight, kept by each
    /// connection's in-flight count as it leaves and returns to zero.
    pub(crate) busy_connections: Arc<AtomicUsize>,
    /// Pipes made (or tried) for spliced reads and staged writes, since
    /// start (each connection keeps a few empty ones for reuse:
    /// `conn::PipePool`).
    pub(crate) pipes_made: Arc<AtomicU64>,
    /// Order the read-modify-writes of partial blocks against every other
    /// change of those blocks, on any connection (see `unaligned`).
    pub(crate) write_locks: WriteLocks,
}

impl Shared {
    pub(crate) fn wake_fd(&self) -> RawFd {
        self.wake_r.as_raw_fd()
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        // SAFETY: write(2) of one byte from a valid buffer. The pipe is
        // non-blocking, so a second stop (pipe already holding a byte) cannot
        // block; its EAGAIN is irrelevant because the pipe is readable anyway.
        unsafe {
            libc::write(self.wake_w.as_raw_fd(), [1u8].as_ptr().cast(), 1);
        }
    }
}

/// Stops a server from anywhere: another thread, or a signal handler.
///
/// [`Stopper::stop`] only stores an atomic flag and writes one byte to a
/// pipe, both async-signal-safe, so a SIGTERM handler may call it (keep the
/// `Stopper` in a static). The server then finishes in-flight requests and
/// [`ServerHandle::wait`] returns.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
}

impl Stopper {
    pub fn stop(&self) {
        self.shared.stop();
    }
}

/// A running server. Dropping it shuts the server down (like
/// [`ServerHandle::shutdown`]).
pub struct ServerHandle {
    shared: Arc<Shared>,
    addr: BoundAddr,
    accept_thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Where the server listens (with the actual port for `tcp:HOST:0`).
    pub fn local_addr(&self) -> &BoundAddr {
        &self.addr
    }

    /// The NBD URI of the default export, for libnbd and qemu clients.
    pub fn uri(&self) -> String {
        self.addr.uri()
    }

    /// A handle that stops the server; see [`Stopper`].
    pub fn stopper(&self) -> Stopper {
        Stopper {
            shared: self.shared.clone(),
        }
    }

    /// Connections currently open (in handshake or transmission).
    pub fn connections(&self) -> usize {
        self.shared.live_connections.load(Ordering::Acquire)
    }

    /// Reads served by the fast path since the server started: started on
    /// a connection's io_uring by the worker that read them, answered
    /// without a worker of their own (those that had to be read again
    /// through the backend are counted too).
    pub fn fast_reads(&self) -> u64 {
        self.shared.fast_reads.load(Ordering::Relaxed)
    }

    /// Small reads served by the worker that read them, without a hand-off,
    /// because the backend's reads never wait for a device.
    pub fn inline_reads(&self) -> u64 {
        self.shared.inline_reads.load(Ordering::Relaxed)
    }

    /// Writes taken by the backend from a pipe, not copied through memory.
    pub fn staged_writes(&self) -> u64 {
        self.shared.staged_writes.load(Ordering::Relaxed)
    }

    /// Staged writes served inline by the worker that read them, since
    /// start.
    pub fn inline_writes(&self) -> u64 {
        self.shared.inline_writes.load(Ordering::Relaxed)
    }

    /// Connections with a request in flight now.
    pub fn busy_connections(&self) -> usize {
        self.shared.busy_connections.load(Ordering::Relaxed)
    }

    /// Pipes made (or tried) for spliced reads and staged writes since
    /// start; the spare pipes of mirrored writes are not counted.
    pub fn pipes_made(&self) -> u64 {
        self.shared.pipes_made.load(Ordering::Relaxed)
    }

    /// Blocks until the server has been stopped (by a [`Stopper`]) and has
    /// drained: no longer accepting, every in-flight request answered, every
    /// connection closed and the unix socket file removed.
    pub fn wait(mut self) {
        self.join();
    }

    /// Stops accepting connections, lets in-flight requests finish and reply,
    /// closes every connection, removes the unix socket file, and returns.
    ///
    /// Connections still negotiating are closed; connections in transmission
    /// stop reading new requests (a request half-received is dropped) and are
    /// closed once the requests they had in flight have been answered.
    pub fn shutdown(mut self) {
        self.shared.stop();
        self.join();
    }

    fn join(&mut self) {
        if let Some(thread) = self.accept_thread.take() {
            if thread.join().is_err() {
                eprintln!("uraid nbd: the accept thread panicked");
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.accept_thread.is_some() {
            self.shared.stop();
            self.join();
        }
    }
}

/// Starts an NBD server for `backend` on `listener` and returns at once.
///
/// The server speaks the fixed newstyle handshake and serves one export,
/// reachable under `options.export_name` or the empty name. Every connection
/// gets `options.workers_per_connection` threads that take turns reading
/// requests and serve them concurrently, so replies may go out of order (the
/// protocol allows that, and the kernel, libnbd and qemu clients all handle
/// it). A malformed or hostile client only ever loses its own connection; the
/// reason is logged on stderr.
///
/// Fails if the backend advertises invalid block sizes, if the options are
/// unusable, or if the address cannot be bound (including a unix socket path
/// on which another server is listening).
pub fn serve(
    listener: &Listener,
    backend: Arc<dyn BlockBackend>,
    options: ServeOptions,
) -> io::Result<ServerHandle> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let mut block_sizes = backend.block_sizes();
    block_sizes
        .validate()
        .map_err(|e| invalid(format!("backend block sizes: {e}")))?;
    // The effective maximum is the smaller of the backend's and ours, rounded
    // down to whole minimum blocks so that a maximal request is also an
    // aligned one.
    let max = block_sizes.max_payload.min(options.max_payload);
    block_sizes.max_payload = max - max % block_sizes.min;
    if block_sizes.max_payload < block_sizes.preferred {
        return Err(invalid(format!(
            "max_payload {} is below the backend's preferred block size {}",
            options.max_payload, block_sizes.preferred
        )));
    }
    if options.max_inflight == 0
        || options.workers_per_connection == 0
        || options.max_connections == 0
        || options.cpus == 0
    {
        return Err(invalid(
            "max_inflight, workers_per_connection, max_connections and cpus must be positive"
                .into(),
        ));
    }
    if options.export_name.len() > proto::STRING_BYTES_MAX
        || options.description.len() > proto::STRING_BYTES_MAX
    {
        return Err(invalid(
            "export name and description are limited to 4096 bytes".into(),
        ));
    }
    let size = backend.size_bytes();
    if !size.is_multiple_of(block_sizes.min as u64) {
        eprintln!(
            "uraid nbd: warning: export size {size} is not a multiple of the minimum block size {}; \
             clients cannot reach the last {} bytes",
            block_sizes.min,
            size % block_sizes.min as u64
        );
    }
    let export = ExportInfo {
        block_sizes,
        read_only: backend.read_only(),
        multi_conn: backend.multi_conn_safe(),
        rotational: backend.rotational(),
    };

    let (wake_r, wake_w) = nonblocking_pipe()?;
    let bound = listen::bind(listener)?;
    bound.set_nonblocking()?;
    let addr = bound.addr()?;
    let shared = Arc::new(Shared {
        backend,
        export,
        options,
        stopping: AtomicBool::new(false),
        wake_r,
        wake_w,
        live_connections: AtomicUsize::new(0),
        fast_reads: AtomicU64::new(0),
        inline_reads: AtomicU64::new(0),
        staged_writes: AtomicU64::new(0),
        inline_writes: AtomicU64::new(0),
        busy_connections: Arc::new(AtomicUsize::new(0)),
        pipes_made: Arc::new(AtomicU64::new(0)),
        write_locks: WriteLocks::new(),
    });
    let accept_shared = shared.clone();
    let accept_thread = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || accept_loop(accept_shared, bound))
        .inspect_err(|_| {
            // The listener moved into the failed closure and is closed; only
            // the file remains to clean up.
            if let Listener::Unix(path) = listener {
                let _ = std::fs::remove_file(path);
            }
        })?;
    Ok(ServerHandle {
        shared,
        addr,
        accept_thread: Some(accept_thread),
    })
}

fn nonblocking_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors which we take ownership of.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Decrements the live-connection count however the connection thread ends.
struct LiveGuard(Arc<Shared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(shared: Arc<Shared>, bound: Bound) {
    let next_id = AtomicU64::new(1);
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    loop {
        match poll_one(bound.raw_fd(), libc::POLLIN, Some(shared.wake_fd()), None) {
            Ok(PollResult::Ready) => {}
            Ok(PollResult::Woken) | Ok(PollResult::TimedOut) => break,
            Err(e) => {
                eprintln!("uraid nbd: poll on the listening socket failed: {e}; stopping");
                break;
            }
        }
        let accepted = match &bound {
            Bound::Unix(l, _, _) => l
                .accept()
                .map(|(s, _)| (OwnedFd::from(s), "unix".to_string())),
            Bound::Tcp(l) => l.accept().map(|(s, peer)| {
                // NBD replies are latency-bound request/response traffic; the
                // spec asks both sides to disable Nagle.
                let _ = s.set_nodelay(true);
                (OwnedFd::from(s), peer.to_string())
            }),
        };
        let (fd, peer) = match accepted {
            Ok(x) => x,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) => {
                // Typically EMFILE/ENFILE/ENOMEM: pause rather than spin, and
                // stay responsive to shutdown meanwhile.
                eprintln!("uraid nbd: accept failed: {e}");
                let pause = Instant::now() + Duration::from_millis(100);
                if let Ok(PollResult::Woken) =
                    poll_one(shared.wake_fd(), libc::POLLIN, None, Some(pause))
                {
                    break;
                }
                continue;
            }
        };
        connections.retain(|t| !t.is_finished());
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        if shared.live_connections.load(Ordering::Acquire) >= shared.options.max_connections {
            eprintln!(
                "uraid nbd: connection {id} ({peer}): refused, already serving {} connections",
                shared.options.max_connections
            );
            continue;
        }
        let sock = match Sock::new(fd) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("uraid nbd: connection {id} ({peer}): cannot set up the socket: {e}");
                continue;
            }
        };
        shared.live_connections.fetch_add(1, Ordering::AcqRel);
        let guard = LiveGuard(shared.clone());
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let _guard = guard;
                conn::run(conn_shared, sock, id, peer);
            });
        match spawned {
            Ok(t) => connections.push(t),
            // The closure (with the socket and the guard) was dropped, which
            // closed the connection and fixed the count.
            Err(e) => eprintln!("uraid nbd: connection {id}: cannot start a thread: {e}"),
        }
    }
    // Refuse new clients at once: remove the socket file and close the
    // listener before waiting for the existing connections to drain.
    bound.remove_socket_file();
    drop(bound);
    for t in connections {
        if t.join().is_err() {
            eprintln!("uraid nbd: a connection thread panicked");
        }
    }
}
