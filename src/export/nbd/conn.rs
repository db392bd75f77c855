//! One client connection: the handshake, then the transmission phase with
//! requests executed concurrently by a pool of worker threads.
//!
//! The workers take turns at reading (leader and followers, as nbdkit's
//! parallel model): the one holding the reader parses the next request,
//! refuses an invalid one itself, then lets go of the reader and serves the
//! request, calling the backend and writing the reply under the
//! connection's writer lock, so replies go out whole but in completion
//! order. A request never changes threads, which at 4 KiB costs more than
//! the I/O itself. A counter of requests and buffer bytes in flight bounds
//! both concurrency and memory: when it is full the reader stops reading,
//! and TCP flow control pushes back on the client. (Two bounded exceptions:
//! the fast path's ring, and the replies to small reads of members in
//! memory, which the worker holding the reader serves itself and sends
//! together: see `HeldReplies`. With members in memory it also stores a
//! staged write itself while more connections are busy than there are
//! CPUs: see `Conn::serves_inline`.)

use crate::member::AlignedBuf;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::fastpath::{self, Done, FastReads};
use super::io::{ReadError, Sock, SockReader, SplicePipe, StagedPayload};
use super::proto::{
    self, Command, InfoRequest, NbdError, ProtoError, RequestHeader, TransmissionParams,
};
use super::server::Shared;
use super::unaligned;
use crate::export::{BlockSizes, ExtentUse, ZeroFlags};

/// Option data beyond this is not buffered: the option is refused with
/// `NBD_REP_ERR_TOO_BIG` (its data discarded) or, beyond
/// `OPTION_DISCARD_MAX`, the client is dropped as hostile. The largest
/// legitimate option is INFO/GO with a 4 KiB name and a few requests.
const OPTION_DATA_MAX: u32 = 64 * 1024;
const OPTION_DISCARD_MAX: u32 = 1 << 20;
/// A client negotiating longer than this is not trying to connect.
const OPTIONS_MAX: usize = 1024;

/// Why a connection ended early.
enum ConnError {
    Read(ReadError),
    Proto(ProtoError),
    Write(std::io::Error),
    Refused(String),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Read(e) => write!(f, "{e}"),
            ConnError::Proto(e) => write!(f, "protocol violation: {e}"),
            ConnError::Write(e) => write!(f, "write error: {e}"),
            ConnError::Refused(why) => write!(f, "{why}"),
        }
    }
}

impl From<ReadError> for ConnError {
    fn from(e: ReadError) -> ConnError {
        ConnError::Read(e)
    }
}

impl From<ProtoError> for ConnError {
    fn from(e: ProtoError) -> ConnError {
        ConnError::Proto(e)
    }
}

/// Identifies a connection in log lines.
struct Log {
    id: u64,
    peer: String,
}

impl Log {
    fn line(&self, msg: impl std::fmt::Display) {
        eprintln!("uraid nbd: connection {} ({}): {msg}", self.id, self.peer);
    }
}

/// Runs a connection to the end. Never panics on client input: every
/// malformed message becomes a logged disconnect of this connection only.
pub(crate) fn run(shared: Arc<Shared>, sock: Sock, id: u64, peer: String) {
    let log = Log { id, peer };
    if shared.options.log_connections {
        log.line("connected");
    }
    let sock = Arc::new(sock);
    if let Some(no_zeroes) = negotiate_and_serve(&shared, &sock, &log, None) {
        // STARTTLS acknowledged: the handshake, then negotiation again
        // inside TLS, on the relay's plaintext side.
        let tls = shared
            .options
            .tls
            .as_ref()
            .expect("STARTTLS is only acked with TLS set");
        let deadline = shared.options.handshake_timeout.map(|t| Instant::now() + t);
        match tls.start(&sock, shared.wake_fd(), deadline, shared.options.io_timeout) {
            Ok((inner, relay)) => {
                let inner = Arc::new(inner);
                // STARTTLS inside TLS is refused, so this returns None.
                negotiate_and_serve(&shared, &inner, &log, Some(no_zeroes));
                inner.shutdown();
                let _ = relay.join();
            }
            Err(e) => log.line(format_args!("refused: {e}")),
        }
    }
    sock.shutdown();
    if shared.options.log_connections {
        log.line("closed");
    }
}

/// Negotiates on `sock` and serves the transmission phase if the client
/// gets there; returns `Some(no_zeroes)` when the client asked for TLS
/// instead (the ACK has been sent and nothing else read).
fn negotiate_and_serve(
    shared: &Arc<Shared>,
    sock: &Arc<Sock>,
    log: &Log,
    tls_flags: Option<bool>,
) -> Option<bool> {
    let mut reader = SockReader::new(sock, shared.wake_fd());
    match handshake(shared, sock, &mut reader, tls_flags) {
        Ok(Negotiated::Transmission(agreed)) => transmission(shared, sock, reader, agreed, log),
        Ok(Negotiated::StartTls(no_zeroes)) => return Some(no_zeroes),
        Ok(Negotiated::Aborted) => {}
        // A client that leaves, or a server that stops, is not worth a log
        // line; a liveness probe (connect, then close) looks exactly so.
        Err(ConnError::Read(ReadError::Eof)) | Err(ConnError::Read(ReadError::Stopped)) => {}
        Err(ConnError::Write(e)) if client_gone(&e) => {}
        Err(e) => log.line(format_args!("during negotiation: {e}")),
    }
    None
}

/// How option negotiation ended without an error.
enum Negotiated {
    /// In transmission, on the terms agreed.
    Transmission(Agreed),
    Aborted,
    /// STARTTLS was acknowledged: TLS starts on the socket now. Holds the
    /// client's NO_ZEROES flag, which still applies inside TLS.
    StartTls(bool),
}

/// What a client that entered transmission agreed to.
struct Agreed {
    structured_replies: bool,
    /// The export size the client was given.
    size: u64,
    /// Whether the client asked for the block sizes in its OPT_GO (and so
    /// must obey them); else it may address single bytes.
    block_sizes: bool,
}

/// Whether a write failed only because the client closed the connection.
fn client_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    )
}

// ---------------------------------------------------------------------------
// Handshake.

fn send(shared: &Shared, sock: &Sock, parts: &[&[u8]]) -> Result<(), ConnError> {
    sock.send_all(parts, shared.options.io_timeout)
        .map_err(ConnError::Write)
}

fn send_option_reply(
    shared: &Shared,
    sock: &Sock,
    option: u32,
    reply: u32,
    data: &[u8],
) -> Result<(), ConnError> {
    send(
        shared,
        sock,
        &[&proto::encode_option_reply(option, reply, data)],
    )
}

/// What a handshake has agreed so far, and what it enforces.
struct Negotiation {
    /// Read once: what the client is told is what the connection enforces,
    /// even if the array's size changes during the handshake.
    size: u64,
    deadline: Option<Instant>,
    in_tls: bool,
    no_zeroes: bool,
    structured: bool,
    tls_required: bool,
}

/// Negotiates until the client enters transmission, aborts, asks for TLS,
/// or breaks the protocol. Inside TLS (`tls_flags` holds whether the client
/// asked for NO_ZEROES before it) there is no greeting: the client goes on
/// with its options.
fn handshake(
    shared: &Shared,
    sock: &Sock,
    reader: &mut SockReader,
    tls_flags: Option<bool>,
) -> Result<Negotiated, ConnError> {
    let deadline = shared.options.handshake_timeout.map(|t| Instant::now() + t);
    let in_tls = tls_flags.is_some();
    let no_zeroes = match tls_flags {
        Some(no_zeroes) => no_zeroes,
        None => greet(shared, sock, reader, deadline)?,
    };
    let mut n = Negotiation {
        size: shared.backend.size_bytes(),
        deadline,
        in_tls,
        no_zeroes,
        structured: false,
        tls_required: !in_tls
            && matches!(&shared.options.tls, Some(tls) if tls.mode == super::TlsMode::Require),
    };
    for _ in 0..OPTIONS_MAX {
        let Some((option, data)) = read_option(shared, sock, reader, n.deadline)? else {
            continue;
        };
        if let Some(outcome) = answer_option(shared, sock, &mut n, option, &data)? {
            return Ok(outcome);
        }
    }
    Err(ConnError::Refused(format!(
        "more than {OPTIONS_MAX} options without entering transmission"
    )))
}

/// The server's greeting and the client's flags: whether the client asked
/// for NO_ZEROES.
fn greet(
    shared: &Shared,
    sock: &Sock,
    reader: &mut SockReader,
    deadline: Option<Instant>,
) -> Result<bool, ConnError> {
    let offered = proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES;
    send(shared, sock, &[&proto::encode_greeting(offered)])?;
    let mut flags = [0u8; 4];
    reader.read_exact(&mut flags, deadline)?;
    let client_flags = proto::decode_client_flags(&flags, offered)?;
    Ok(client_flags & proto::FLAG_C_NO_ZEROES != 0)
}

/// One option's header and data; None for an option too large to take,
/// already answered (its data discarded), so the client may go on.
fn read_option(
    shared: &Shared,
    sock: &Sock,
    reader: &mut SockReader,
    deadline: Option<Instant>,
) -> Result<Option<(u32, Vec<u8>)>, ConnError> {
    let mut header = [0u8; proto::OPTION_HEADER_LEN];
    reader.read_exact(&mut header, deadline)?;
    let header = proto::decode_option_header(&header)?;
    let option = header.option;
    if header.length > OPTION_DATA_MAX {
        if option == proto::OPT_EXPORT_NAME || header.length > OPTION_DISCARD_MAX {
            return Err(ConnError::Refused(format!(
                "option {option} with {} bytes of data is too large",
                header.length
            )));
        }
        reader.discard(header.length as u64, deadline)?;
        send_option_reply(
            shared,
            sock,
            option,
            proto::REP_ERR_TOO_BIG,
            b"option data too large",
        )?;
        return Ok(None);
    }
    let mut data = vec![0u8; header.length as usize];
    reader.read_exact(&mut data, deadline)?;
    Ok(Some((option, data)))
}

/// Answers one option; Some when the handshake ends with it.
fn answer_option(
    shared: &Shared,
    sock: &Sock,
    n: &mut Negotiation,
    option: u32,
    data: &[u8],
) -> Result<Option<Negotiated>, ConnError> {
    let options = &shared.options;
    if n.tls_required && option != proto::OPT_STARTTLS && option != proto::OPT_ABORT {
        if option == proto::OPT_EXPORT_NAME {
            return Err(ConnError::Refused(
                "OPT_EXPORT_NAME before STARTTLS, which this server requires".into(),
            ));
        }
        let msg = b"this server requires TLS: send NBD_OPT_STARTTLS first";
        send_option_reply(shared, sock, option, proto::REP_ERR_TLS_REQD, msg)?;
        return Ok(None);
    }
    match option {
        proto::OPT_EXPORT_NAME => export_name(shared, sock, n, data).map(Some),
        proto::OPT_ABORT => {
            // The client may already have closed; a failed ACK is fine.
            let _ = send_option_reply(shared, sock, option, proto::REP_ACK, &[]);
            Ok(Some(Negotiated::Aborted))
        }
        proto::OPT_LIST => {
            if !data.is_empty() {
                send_option_reply(
                    shared,
                    sock,
                    option,
                    proto::REP_ERR_INVALID,
                    b"OPT_LIST takes no data",
                )?;
                return Ok(None);
            }
            let server = proto::encode_rep_server(&options.export_name, &options.description);
            send_option_reply(shared, sock, option, proto::REP_SERVER, &server)?;
            send_option_reply(shared, sock, option, proto::REP_ACK, &[])?;
            Ok(None)
        }
        proto::OPT_INFO | proto::OPT_GO => info_or_go(shared, sock, n, option, data),
        proto::OPT_STRUCTURED_REPLY => {
            if !data.is_empty() {
                let msg = b"OPT_STRUCTURED_REPLY takes no data";
                send_option_reply(shared, sock, option, proto::REP_ERR_INVALID, msg)?;
                return Ok(None);
            }
            n.structured = true;
            send_option_reply(shared, sock, option, proto::REP_ACK, &[])?;
            Ok(None)
        }
        proto::OPT_STARTTLS => {
            let (reply, msg): (u32, &[u8]) = if n.in_tls {
                (proto::REP_ERR_INVALID, b"TLS is already active")
            } else if options.tls.is_none() {
                (proto::REP_ERR_UNSUP, b"TLS is not enabled on this server")
            } else if !data.is_empty() {
                (proto::REP_ERR_INVALID, b"OPT_STARTTLS takes no data")
            } else {
                // Nothing agreed before TLS carries over: negotiation
                // starts afresh inside it.
                send_option_reply(shared, sock, option, proto::REP_ACK, &[])?;
                return Ok(Some(Negotiated::StartTls(n.no_zeroes)));
            };
            send_option_reply(shared, sock, option, reply, msg)?;
            Ok(None)
        }
        _ => {
            // Including LIST/SET_META_CONTEXT (no block status yet) and
            // EXTENDED_HEADERS: clients fall back when told UNSUP.
            send_option_reply(shared, sock, option, proto::REP_ERR_UNSUP, &[])?;
            Ok(None)
        }
    }
}

/// Whether a client's export name names this export ("" is the default).
fn name_ok(shared: &Shared, name: &str) -> bool {
    name.is_empty() || name == shared.options.export_name
}

/// OPT_EXPORT_NAME: transmission at once, or a disconnect.
fn export_name(
    shared: &Shared,
    sock: &Sock,
    n: &Negotiation,
    data: &[u8],
) -> Result<Negotiated, ConnError> {
    // This option cannot be answered with an error, so every refusal is a
    // disconnect, as the spec requires.
    let name = proto::decode_string(data)?;
    if !name_ok(shared, &name) {
        return Err(ConnError::Refused(format!(
            "OPT_EXPORT_NAME for unknown export '{name}'"
        )));
    }
    if shared.options.require_block_size {
        return Err(ConnError::Refused(
            "OPT_EXPORT_NAME cannot negotiate block sizes, which this server requires".into(),
        ));
    }
    let flags = shared.export.transmission_flags(n.structured);
    send(
        shared,
        sock,
        &[&proto::encode_export_name_reply(n.size, flags, n.no_zeroes)],
    )?;
    Ok(Negotiated::Transmission(Agreed {
        structured_replies: n.structured,
        size: n.size,
        block_sizes: false,
    }))
}

/// OPT_INFO and OPT_GO: the export's information, and for GO the start of
/// transmission.
fn info_or_go(
    shared: &Shared,
    sock: &Sock,
    n: &Negotiation,
    option: u32,
    data: &[u8],
) -> Result<Option<Negotiated>, ConnError> {
    let request = match proto::decode_info_request(data) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("malformed request: {e}");
            send_option_reply(shared, sock, option, proto::REP_ERR_INVALID, msg.as_bytes())?;
            return Ok(None);
        }
    };
    if !name_ok(shared, &request.name) {
        let msg = format!("no export named '{}'", request.name);
        send_option_reply(shared, sock, option, proto::REP_ERR_UNKNOWN, msg.as_bytes())?;
        return Ok(None);
    }
    send_export_info(shared, sock, option, &request, n.structured, n.size)?;
    if option == proto::OPT_GO
        && shared.options.require_block_size
        && !request.wants(proto::INFO_BLOCK_SIZE)
    {
        let msg = b"this export requires the client to accept block size constraints";
        send_option_reply(shared, sock, option, proto::REP_ERR_BLOCK_SIZE_REQD, msg)?;
        return Ok(None);
    }
    send_option_reply(shared, sock, option, proto::REP_ACK, &[])?;
    if option != proto::OPT_GO {
        return Ok(None);
    }
    Ok(Some(Negotiated::Transmission(Agreed {
        structured_replies: n.structured,
        size: n.size,
        // An earlier OPT_INFO that asked commits to nothing.
        block_sizes: request.wants(proto::INFO_BLOCK_SIZE),
    })))
}

/// The `NBD_REP_INFO` replies for INFO/GO (everything but the final reply).
fn send_export_info(
    shared: &Shared,
    sock: &Sock,
    option: u32,
    request: &InfoRequest,
    structured: bool,
    size: u64,
) -> Result<(), ConnError> {
    let export = &shared.export;
    let options = &shared.options;
    let flags = export.transmission_flags(structured);
    send_option_reply(
        shared,
        sock,
        option,
        proto::REP_INFO,
        &proto::encode_info_export(size, flags),
    )?;
    if request.wants(proto::INFO_NAME) {
        let info = proto::encode_info_string(proto::INFO_NAME, &options.export_name);
        send_option_reply(shared, sock, option, proto::REP_INFO, &info)?;
    }
    if request.wants(proto::INFO_DESCRIPTION) && !options.description.is_empty() {
        let info = proto::encode_info_string(proto::INFO_DESCRIPTION, &options.description);
        send_option_reply(shared, sock, option, proto::REP_INFO, &info)?;
    }
    // Block sizes are sent even when not requested: the spec lets a server
    // send information the client did not ask for (clients ignore what they
    // do not want), and a client that learns the constraints avoids EINVAL.
    let info = proto::encode_info_block_size(export.block_sizes);
    send_option_reply(shared, sock, option, proto::REP_INFO, &info)
}

// ---------------------------------------------------------------------------
// Transmission.

/// Counts requests and buffer bytes in flight on one connection.
struct Inflight {
    state: Mutex<InflightState>,
    cond: Condvar,
    max_requests: usize,
    max_bytes: u64,
    /// The server's count of busy connections (`Shared::busy_connections`):
    /// this connection is one while it has a request in flight.
    busy_connections: Arc<AtomicUsize>,
}

struct InflightState {
    requests: usize,
    bytes: u64,
    /// Whether the reader waits for room. Only then does a release wake it:
    /// a condvar notify is a system call even with nobody waiting, and at
    /// 4 KiB that was one more system call per request.
    waiting: bool,
}

impl Inflight {
    fn new(max_requests: usize, max_bytes: u64, busy_connections: Arc<AtomicUsize>) -> Inflight {
        Inflight {
            busy_connections,
            state: Mutex::new(InflightState {
                requests: 0,
                bytes: 0,
                waiting: false,
            }),
            cond: Condvar::new(),
            max_requests,
            max_bytes,
        }
    }

    /// Waits for room for a request holding `bytes` of buffers. A request
    /// bigger than the byte budget is admitted when nothing else is in
    /// flight, so that it cannot wait forever. Only the worker holding the
    /// reader calls it, so there is at most one waiter. While there is no
    /// room it calls `help` (which answers fast-path reads, that only this
    /// worker can answer) for as long as that says it did something.
    fn acquire(&self, bytes: u64, help: &mut dyn FnMut() -> bool) {
        let full = |state: &InflightState| {
            state.requests >= self.max_requests
                || (state.requests > 0 && state.bytes + bytes > self.max_bytes)
        };
        while full(&self.state.lock().unwrap_or_else(|e| e.into_inner())) && help() {}
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while full(&state) {
            state.waiting = true;
            state = self.cond.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.waiting = false;
        if state.requests == 0 {
            self.busy_connections.fetch_add(1, Ordering::Relaxed);
        }
        state.requests += 1;
        state.bytes += bytes;
    }

    /// Requests admitted and not yet answered.
    fn requests(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests
    }

    fn release(&self, bytes: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        assert!(state.requests > 0 && state.bytes >= bytes);
        state.requests -= 1;
        state.bytes -= bytes;
        if state.requests == 0 {
            self.busy_connections.fetch_sub(1, Ordering::Relaxed);
        }
        if state.waiting {
            self.cond.notify_all();
        }
    }
}

impl Drop for Inflight {
    /// A request whose worker panicked outside the backend's guard is never
    /// released; the connection must still stop counting as busy when it
    /// ends, or every later staged write would be served inline.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.requests > 0 {
            self.busy_connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What workers share about their connection.
struct Conn {
    shared: Arc<Shared>,
    sock: Arc<Sock>,
    params: TransmissionParams,
    /// Held while a reply is written, so that replies do not interleave.
    /// The flag records that the connection can no longer be written to.
    writer: Mutex<bool>,
    inflight: Inflight,
    /// Empty pipes for spliced reads and staged writes.
    pipes: PipePool,
    /// Whether big reads are spliced to the socket (see `splice_read`).
    splice_reads: bool,
    log: Log,
}

/// A request handed to a worker.
struct Job {
    cookie: u64,
    command: Command,
    /// Bytes of write payload, at the start of the worker's payload buffer
    /// or, if `staged`, in the worker's staging pipe.
    payload_len: usize,
    staged: bool,
    /// Not aligned to the backend's blocks: served cut at them (see
    /// `Conn::cut`), never by the fast path, a splice or inline.
    cut: bool,
    /// The bytes counted in `Inflight` for this request.
    cost: u64,
}

/// How the reader loop ended.
enum End {
    /// The client sent NBD_CMD_DISC, closed the connection, or the server is
    /// stopping: finish what is in flight and reply.
    Graceful,
    /// The client broke the protocol or the connection failed: drop it now.
    Abort,
}

/// The block sizes a connection's requests are checked against: the
/// export's when the client agreed to them, as the spec then lets the
/// server refuse misaligned requests; else a minimum of 1, the spec's
/// default, with the server cutting requests at the backend's blocks
/// (`unaligned`). An export that is not whole blocks keeps its minimum:
/// its last, partial block cannot be read whole.
fn connection_block_sizes(export: BlockSizes, agreed: &Agreed) -> BlockSizes {
    let whole_blocks = agreed.size.is_multiple_of(export.min as u64);
    if agreed.block_sizes || !whole_blocks {
        return export;
    }
    BlockSizes { min: 1, ..export }
}

fn transmission(
    shared: &Arc<Shared>,
    sock: &Arc<Sock>,
    reader: SockReader,
    agreed: Agreed,
    log: &Log,
) {
    let options = &shared.options;
    // The size now: an array that grew (a reshape or a size change that
    // ended) is offered whole to connections made since; one made before
    // keeps the size it was given, as NBD has no way to tell it.
    let structured = agreed.structured_replies;
    let params = TransmissionParams {
        size: agreed.size,
        block_sizes: connection_block_sizes(shared.export.block_sizes, &agreed),
        transmission_flags: shared.export.transmission_flags(structured),
        structured_replies: structured,
    };
    let conn = Arc::new(Conn {
        shared: shared.clone(),
        sock: sock.clone(),
        params,
        writer: Mutex::new(false),
        inflight: Inflight::new(
            options.max_inflight,
            options.max_inflight_bytes,
            shared.busy_connections.clone(),
        ),
        pipes: PipePool {
            pipes: Mutex::new(Vec::new()),
            made: shared.pipes_made.clone(),
        },
        splice_reads: options.splice_to_local_clients || !sock.peer_on_this_host(),
        log: Log {
            id: log.id,
            peer: log.peer.clone(),
        },
    });

    // Leader and followers: whichever worker holds the reader reads the
    // next request and then serves it itself. No request changes threads
    // on its way, which at small I/O sizes costs more than the I/O.
    let reader = Mutex::new(Reader {
        reader,
        ended: false,
        fast: None,
        fast_refused: false,
        held: HeldReplies::default(),
    });
    std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for n in 0..options.workers_per_connection {
            let (conn, reader) = (&conn, &reader);
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-worker-{}-{n}", log.id))
                .spawn_scoped(scope, move || worker(conn, reader));
            match spawned {
                Ok(t) => workers.push(t),
                Err(e) => log.line(format_args!("cannot start worker thread {n}: {e}")),
            }
        }
        if workers.is_empty() {
            log.line("no worker threads; closing");
        }
        for t in workers {
            if t.join().is_err() {
                log.line("a worker thread panicked");
            }
        }
    });
}

/// The connection's reading side, held by one worker at a time.
struct Reader<'a> {
    reader: SockReader<'a>,
    /// The connection has ended: workers finish what they hold and exit.
    ended: bool,
    /// The fast path's ring and the reads in flight on it, made at the
    /// first read that can take it.
    fast: Option<FastReads>,
    /// No ring could be made: reads take the workers' path.
    fast_refused: bool,
    /// Replies to reads served inline, sent together before the reader
    /// could wait (see `HeldReplies`).
    held: HeldReplies,
}

/// Replies to small reads served inline by the worker holding the reader,
/// kept until it would wait for the client (or leave the reader, or has
/// HELD_REPLIES_MAX) and then sent in one system call: a client that
/// sends eight reads at once gets eight replies in one `sendmsg` instead
/// of eight. Used only by the worker holding the reader.
#[derive(Default)]
struct HeldReplies {
    /// Reply heads and their data (`data[i][..lens[i]]`).
    heads: Vec<Vec<u8>>,
    data: Vec<AlignedBuf>,
    lens: Vec<usize>,
    /// Buffers of replies already sent, for the next reads.
    spare: Vec<AlignedBuf>,
}

/// Replies held at most before they are sent. Each holds a buffer of its
/// read's size, less than SPLICE_MIN_BYTES (reads that long are spliced or
/// served as before), and as many are kept spare: under 2 MiB per
/// connection, outside the in-flight budget (which a held reply no longer
/// counts against: its read is done).
const HELD_REPLIES_MAX: usize = 16;

/// What `read_request` asks of the fast path before it may wait.
enum BeforeWait {
    /// Hand queued reads to the kernel (before waiting for the client).
    Submit,
    /// There is no room for the request: answer finished reads, waiting
    /// for one; says whether there was any in flight.
    Help,
}

/// Reads the next request: `Ok(Some(job))` to serve, `Ok(None)` when it was
/// invalid and has been answered here, `Err` when the connection ends.
/// A write's payload goes into `payload`, the worker's own buffer.
fn read_request(
    conn: &Conn,
    reader: &mut SockReader,
    payload: &mut AlignedBuf,
    staging: &mut Staging,
    before_wait: &mut dyn FnMut(BeforeWait) -> bool,
) -> Result<Option<Job>, End> {
    let io_timeout = conn.shared.options.io_timeout;
    let mut header = [0u8; proto::REQUEST_HEADER_LEN];
    if conn.shared.stopping() {
        return Err(End::Graceful);
    }
    // Idle time between requests is unlimited (an idle kernel client is
    // normal); once a request has started, the rest must follow within
    // the I/O timeout.
    if let Err(e) = reader.read_exact(&mut header[..1], None) {
        return Err(read_failed(conn, e, "request"));
    }
    let deadline = io_timeout.map(|t| Instant::now() + t);
    if let Err(e) = reader.read_exact(&mut header[1..], deadline) {
        // Count the first byte too, so the message matches the wire.
        let e = match e {
            ReadError::Eof => ReadError::Truncated {
                have: 1,
                need: header.len(),
            },
            ReadError::Truncated { have, need } => ReadError::Truncated {
                have: have + 1,
                need: need + 1,
            },
            e => e,
        };
        return Err(read_failed(conn, e, "request header"));
    }
    // A header that cannot be understood leaves no way to find the next
    // request on the stream: the connection ends.
    let violation = |e: &dyn std::fmt::Display| {
        conn.log
            .line(format_args!("protocol violation: {e}; disconnecting"));
        End::Abort
    };
    let request = proto::decode_request_header(&header).map_err(|e| violation(&e))?;
    let payload_len =
        proto::request_payload_len(&request, &conn.params).map_err(|e| violation(&e))?;
    let command = match check_request(&request, &conn.params) {
        Ok(c) => c,
        Err(err) => {
            // The payload of a refused write is still on the wire and
            // must be consumed to stay in step with the client.
            if payload_len > 0 {
                if reader.buffered() < payload_len as usize {
                    before_wait(BeforeWait::Submit);
                }
                if let Err(e) = reader.discard(payload_len as u64, deadline) {
                    return Err(read_failed(conn, e, "write payload"));
                }
            }
            conn.reply_error(&request, err, &refusal_message(&request, err, &conn.params));
            return Ok(None);
        }
    };
    if let Command::Disconnect = command {
        return Err(End::Graceful);
    }
    let cut = conn.cut(&command);
    let cost = match command {
        Command::Read { length, .. } | Command::Write { length, .. } => length as u64,
        _ => 0,
    };
    // Wait for room before allocating: this is what bounds memory.
    conn.inflight
        .acquire(cost, &mut || before_wait(BeforeWait::Help));
    let payload_len = payload_len as usize;
    let mut staged = false;
    if payload_len > 0 {
        if reader.buffered() < payload_len {
            before_wait(BeforeWait::Submit);
        }
        let mut have = 0;
        if let (Command::Write { offset, .. }, false) = (command, cut) {
            match stage_write(conn, reader, staging, offset, payload_len, deadline) {
                Ok(n) if n == payload_len => staged = true,
                Ok(n) => have = n,
                Err(e) => {
                    conn.inflight.release(cost);
                    return Err(read_failed(conn, e, "write payload"));
                }
            }
        }
        if !staged {
            if payload.len() < payload_len {
                *payload = AlignedBuf::zeroed(payload_len);
            }
            // What a full pipe holds comes back by copy, the rest is read.
            if have > 0 {
                let pipe = staging.pipe.as_ref().expect("bytes were staged in it");
                if let Err(e) = pipe.read_exact(&mut payload[..have]) {
                    staging.pipe = None;
                    conn.inflight.release(cost);
                    return Err(read_failed(conn, ReadError::Io(e), "staged write payload"));
                }
            }
            if let Err(e) = reader.read_exact(&mut payload[have..payload_len], deadline) {
                conn.inflight.release(cost);
                return Err(read_failed(conn, e, "write payload"));
            }
        }
    }
    Ok(Some(Job {
        cookie: request.cookie,
        command,
        payload_len,
        staged,
        cut,
        cost,
    }))
}

/// `proto::check_request`, with EOVERFLOW kept to what the spec reserves it
/// for among reads: one with the DF flag, whose single chunk cannot be that
/// long. Any other read beyond the maximum payload is EINVAL, as nbdkit
/// answers too (nbd-tester-client checks it).
fn check_request(
    request: &RequestHeader,
    params: &TransmissionParams,
) -> Result<Command, NbdError> {
    match proto::check_request(request, params) {
        Err(NbdError::Overflow) if request.flags & proto::CMD_FLAG_DF == 0 => Err(NbdError::Inval),
        checked => checked,
    }
}

/// Stages a write's payload in the worker's pipe when the backend will
/// likely take it from there (see `BlockBackend::write_staged`): the bytes
/// then go from the socket to the member files without a copy through
/// this process. Gives how many bytes were staged: 0 when it was not
/// tried, fewer than `len` when the pipe filled up.
fn stage_write(
    conn: &Conn,
    reader: &mut SockReader,
    staging: &mut Staging,
    offset: u64,
    len: usize,
    deadline: Option<Instant>,
) -> Result<usize, ReadError> {
    if len < SPLICE_MIN_BYTES || !conn.shared.backend.takes_staged_writes(offset, len) {
        return Ok(0);
    }
    // Spliced bytes come as the socket's fragments, and a short one takes
    // a slot of its own: room for twice the bytes where a pipe may be that
    // large (pipe-max-size is 1 MiB by default), else a pipe of the
    // payload's size, which holds it unless the fragments are small (then
    // part is staged and copied back, and the rest read).
    let want = if 2 * len <= PIPE_MAX_USUAL {
        2 * len
    } else {
        len
    };
    let Some(pipe) = staging.ready(want) else {
        return Ok(0);
    };
    let result = reader.stage(pipe, len, deadline);
    if result.is_err() {
        // Part of a payload is in the pipe: it goes with the connection.
        staging.pipe = None;
    }
    result
}

/// Decides how the connection ends after a failed read of `what` (a part
/// of a request), logging anything other than a clean end.
fn read_failed(conn: &Conn, err: ReadError, what: &str) -> End {
    match err {
        ReadError::Eof if what == "request" => End::Graceful,
        ReadError::Stopped => End::Graceful,
        // The server itself shut the socket after a failed reply, which was
        // logged then.
        _ if *conn.writer.lock().unwrap_or_else(|e| e.into_inner()) => End::Abort,
        ReadError::Eof => {
            conn.log.line(format_args!(
                "connection closed by the client before the {what}; disconnecting"
            ));
            End::Abort
        }
        ReadError::Truncated { have, need } => {
            conn.log.line(format_args!(
                "connection closed by the client mid-{what} ({have} of {need} bytes); disconnecting"
            ));
            End::Abort
        }
        e => {
            conn.log
                .line(format_args!("reading the {what}: {e}; disconnecting"));
            End::Abort
        }
    }
}

/// A message for the error chunk of a refused request.
fn refusal_message(request: &RequestHeader, err: NbdError, params: &TransmissionParams) -> String {
    let what = format!(
        "command {} at {}+{}",
        request.command, request.offset, request.length
    );
    match err {
        NbdError::Perm => format!("{what}: the export is read-only"),
        NbdError::NoSpc => format!(
            "{what}: beyond the end of the export ({} bytes)",
            params.size
        ),
        NbdError::Overflow => format!(
            "{what}: longer than the maximum payload {}, which a read with DF gets in one chunk",
            params.block_sizes.max_payload
        ),
        _ if matches!(request.command, proto::CMD_READ | proto::CMD_WRITE)
            && request.length > params.block_sizes.max_payload =>
        {
            format!(
                "{what}: longer than the maximum payload {}",
                params.block_sizes.max_payload
            )
        }
        _ => format!("{what}: invalid (unknown command or flag, misaligned, or out of range)"),
    }
}

/// The largest buffer a worker keeps between requests: with 64 workers a
/// connection keeps at most 256 MiB, and usually far less (what its
/// requests needed).
const SCRATCH_KEPT: usize = 2 << 20;

/// Empty pipes a connection's workers share. A worker takes one for a
/// spliced read or a staged write and gives it back once the request is
/// answered, so that a connection holds about as many pipes as it has such
/// requests in flight, not one per worker: the workers take turns, so in
/// time each of the 64 made its own, and 4 connections' 256 pipes of 1 MiB
/// passed the user's pipe quota (pipe-user-pages-soft, 64 MiB), past which
/// a pipe cannot be made that large and the worker copies instead
/// (docs/BENCHMARKS.md, "Staged writes").
struct PipePool {
    pipes: Mutex<Vec<SplicePipe>>,
    /// The server's count of pipes made (`Shared::pipes_made`).
    made: Arc<AtomicU64>,
}

/// Empty pipes a connection keeps between requests.
const PIPES_KEPT: usize = 8;

impl PipePool {
    /// An empty pipe that holds at least `bytes`, if one is kept.
    fn take(&self, bytes: usize) -> Option<SplicePipe> {
        let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        let at = pipes.iter().position(|p| p.capacity() >= bytes)?;
        Some(pipes.swap_remove(at))
    }

    /// Keeps an empty pipe for the next request, up to PIPES_KEPT.
    fn give(&self, pipe: SplicePipe) {
        let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        if pipes.len() < PIPES_KEPT {
            pipes.push(pipe);
        }
    }
}

/// A worker's pipes for spliced reads and staged writes, taken from the
/// connection's pool for a request and given back after it.
struct Staging<'c> {
    pool: &'c PipePool,
    pipe: Option<SplicePipe>,
    /// The smallest pipe size that was refused.
    refused_from: usize,
    /// A second pipe, for the copies of a staged write (raid1, raid10).
    spare: Option<SplicePipe>,
}

impl Staging<'_> {
    /// The pipe, holding at least `bytes`: one the pool keeps, else a new
    /// one if a pipe that size is allowed (pipe-max-size, or the user's
    /// pipe pages); once refused, this worker makes none this size or
    /// larger again, but still takes one the pool has. The pipe is empty.
    fn ready(&mut self, bytes: usize) -> Option<&SplicePipe> {
        if self.pipe.as_ref().is_none_or(|p| p.capacity() < bytes) {
            self.give_back();
            self.pipe = self.pool.take(bytes);
            if self.pipe.is_none() && bytes < self.refused_from {
                self.pool.made.fetch_add(1, Ordering::Relaxed);
                self.pipe = SplicePipe::new(bytes)
                    .ok()
                    .filter(|p| p.capacity() >= bytes);
                if self.pipe.is_none() {
                    self.refused_from = bytes;
                }
            }
        }
        self.pipe.as_ref()
    }

    /// Gives the pipe back to the connection's pool. Called when a request
    /// is answered: a pipe still held then is empty (one left with bytes
    /// in it was dropped where that happened, a panic included). The
    /// spare, made only for the copies of mirrored writes into unmapped
    /// members, stays with the worker.
    fn give_back(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pool.give(pipe);
        }
    }
}

/// The longest read served inline (see `Conn::serves_inline`): longer ones
/// are spliced or copied by a worker of their own, so that one big copy
/// does not hold up the requests behind it.
const INLINE_READ_MAX: usize = fastpath::READ_MAX;

/// Reads at least this long are spliced from the backend's files when it
/// allows (see `BlockBackend::read_extents`): the copies saved outweigh
/// the extra system calls (a splice per extent in, one out) from here on.
const SPLICE_MIN_BYTES: usize = 64 << 10;

/// The default pipe-max-size: the largest pipe a process without
/// CAP_SYS_RESOURCE may have unless the system says otherwise.
const PIPE_MAX_USUAL: usize = 1 << 20;

/// An error to answer a request with, and the message for a structured
/// reply's error chunk.
type Refusal = (NbdError, String);

/// How a request ended: for a read, where its reply's bytes lie in the
/// worker's scratch buffer.
type Outcome = Result<Option<std::ops::Range<usize>>, Refusal>;

/// A backend's result as a request's: its error mapped to NBD's, with what
/// failed.
fn io(result: std::io::Result<()>, what: &str) -> Result<(), Refusal> {
    result.map_err(|e| (NbdError::from_io_error(&e), format!("{what} failed: {e}")))
}

fn worker(conn: &Conn, reader: &Mutex<Reader<'_>>) {
    // The worker's buffers, reused: a new buffer per request costs a page
    // fault per 4 KiB (big allocations come fresh from mmap), more than
    // the copy into it.
    let mut scratch = AlignedBuf::zeroed(0);
    let mut payload = AlignedBuf::zeroed(0);
    // Where a spliced read reply is staged; made at the first one.
    let mut pipe = Staging {
        pool: &conn.pipes,
        pipe: None,
        refused_from: usize::MAX,
        spare: None,
    };
    loop {
        // The reader is held only to read requests; serving runs unlocked.
        // Reads that take the fast path are started and left in flight, and
        // the worker goes on reading: it leaves with the first request it
        // serves itself.
        let job = {
            let mut guard = reader.lock().unwrap_or_else(|e| e.into_inner());
            let Reader {
                reader: sock_reader,
                ended,
                fast,
                fast_refused,
                held,
            } = &mut *guard;
            loop {
                if *ended {
                    conn.send_held(held);
                    return;
                }
                if sock_reader.buffered() < proto::REQUEST_HEADER_LEN {
                    conn.send_held(held);
                }
                if let Some(f) = fast.as_mut() {
                    conn.answer_fast(f, false);
                    // Queued reads go to the kernel before the worker may
                    // wait for the client, and while it waits it also
                    // watches for reads that finish.
                    if sock_reader.buffered() < proto::REQUEST_HEADER_LEN {
                        f.submit();
                        if f.busy() {
                            match sock_reader.wait_readable(f.fd()) {
                                Ok(true) => {}
                                Ok(false) => continue,
                                // poll itself failed: the socket's read
                                // will report the trouble.
                                Err(_) => {}
                            }
                        }
                    }
                }
                let mut before_wait = |what: BeforeWait| {
                    conn.send_held(held);
                    match (fast.as_mut(), what) {
                        (Some(f), BeforeWait::Submit) => {
                            f.submit();
                            true
                        }
                        (Some(f), BeforeWait::Help) if f.busy() => {
                            conn.answer_fast(f, true);
                            true
                        }
                        _ => false,
                    }
                };
                match read_request(conn, sock_reader, &mut payload, &mut pipe, &mut before_wait) {
                    Ok(Some(job)) => match conn.start_fast(fast, fast_refused, job) {
                        None => continue,
                        Some(job)
                            if conn.serves_inline(
                                &job,
                                sock_reader.buffered() >= proto::REQUEST_HEADER_LEN,
                            ) =>
                        {
                            let served = if job.staged {
                                &conn.shared.inline_writes
                            } else {
                                &conn.shared.inline_reads
                            };
                            served.fetch_add(1, Ordering::Relaxed);
                            if let Some(job) = conn.serve_held(job, held) {
                                // Its reply goes out now (a splice, say),
                                // and may wait for the socket: the held
                                // ones go first.
                                conn.send_held(held);
                                conn.serve(job, &payload, &mut scratch, &mut pipe);
                                pipe.give_back();
                            }
                            continue;
                        }
                        Some(job) => {
                            conn.send_held(held);
                            if let Some(f) = fast.as_mut() {
                                f.submit();
                            }
                            break job;
                        }
                    },
                    Ok(None) => continue,
                    Err(end) => {
                        if let End::Graceful = end {
                            conn.send_held(held);
                        }
                        *ended = true;
                        if let End::Abort = end {
                            // Replies to requests still in flight cannot be
                            // trusted to arrive; closing now tells the client.
                            conn.sock.shutdown();
                        }
                        // Reads in flight are answered (or, after an abort,
                        // just finished) before the connection's end.
                        if let Some(f) = fast.as_mut() {
                            while f.busy() {
                                conn.answer_fast(f, true);
                            }
                        }
                        return;
                    }
                }
            }
        };
        conn.serve(job, &payload, &mut scratch, &mut pipe);
        pipe.give_back();
        // A big read's buffer is not kept: 64 workers would pin 64 of them.
        if scratch.len() > SCRATCH_KEPT {
            scratch = AlignedBuf::zeroed(0);
        }
        if payload.len() > SCRATCH_KEPT {
            payload = AlignedBuf::zeroed(0);
        }
    }
}

impl Conn {
    /// Serves a request and gives back its share of the in-flight budget.
    fn serve(&self, job: Job, payload: &AlignedBuf, scratch: &mut AlignedBuf, pipe: &mut Staging) {
        let cost = job.cost;
        // A panicking backend must not take the connection's accounting
        // with it: the request is answered with EIO and the worker goes on.
        if catch_unwind(AssertUnwindSafe(|| {
            self.execute(job, payload, scratch, pipe)
        }))
        .is_err()
        {
            self.log
                .line("the backend panicked while serving a request");
            // What the pipes hold is unknown: they must not go back to the
            // connection's pool.
            pipe.pipe = None;
            pipe.spare = None;
        }
        self.inflight.release(cost);
    }

    /// Serves a small read inline and holds its reply (`HeldReplies`), or
    /// gives the job back for `serve` (a read that a splice may take, an
    /// empty one). A failed read is answered at once: replies may go in
    /// any order.
    fn serve_held(&self, job: Job, held: &mut HeldReplies) -> Option<Job> {
        let Command::Read { offset, length } = job.command else {
            return Some(job);
        };
        let len = length as usize;
        if len == 0 || len >= SPLICE_MIN_BYTES {
            return Some(job);
        }
        // A buffer of the read's size (in 4 KiB), or a spare one that
        // holds it; a spare too short is dropped.
        let mut buf = match held.spare.pop() {
            Some(buf) if buf.len() >= len => buf,
            _ => AlignedBuf::zeroed(len.next_multiple_of(4096)),
        };
        let backend = &*self.shared.backend;
        let result = catch_unwind(AssertUnwindSafe(|| backend.read(offset, &mut buf[..len])))
            .unwrap_or_else(|_| {
                self.log
                    .line("the backend panicked while serving a request");
                Err(std::io::Error::other(
                    "internal error in the storage backend",
                ))
            });
        // The reply's memory is bounded by HELD_REPLIES_MAX, not the budget.
        self.inflight.release(job.cost);
        let head = match result {
            Ok(()) => self.read_reply_head(job.cookie, offset, len),
            Err(e) => {
                self.reply_error_raw(
                    job.cookie,
                    NbdError::from_io_error(&e),
                    &format!("read failed: {e}"),
                );
                held.spare.push(buf);
                return None;
            }
        };
        match head {
            Ok(head) => {
                held.heads.push(head);
                held.data.push(buf);
                held.lens.push(len);
            }
            Err(e) => {
                self.reply_error_raw(
                    job.cookie,
                    NbdError::Io,
                    &format!("cannot encode reply: {e}"),
                );
                held.spare.push(buf);
            }
        }
        if held.heads.len() >= HELD_REPLIES_MAX {
            self.send_held(held);
        }
        None
    }

    /// Sends the held replies, all in one `sendmsg` when the socket takes
    /// them.
    fn send_held(&self, held: &mut HeldReplies) {
        if held.heads.is_empty() {
            return;
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * held.heads.len());
        for ((head, data), &len) in held.heads.iter().zip(&held.data).zip(&held.lens) {
            parts.push(head);
            parts.push(&data[..len]);
        }
        self.send(&parts);
        held.heads.clear();
        held.lens.clear();
        for buf in held.data.drain(..) {
            if held.spare.len() < HELD_REPLIES_MAX {
                held.spare.push(buf);
            }
        }
    }

    /// Whether a request must be cut at the backend's blocks (`unaligned`):
    /// only a connection whose client agreed to no block sizes has a
    /// smaller minimum than the backend's, and so sends such requests.
    fn cut(&self, command: &Command) -> bool {
        let block = self.shared.export.block_sizes.min;
        let (offset, length) = match *command {
            Command::Read { offset, length }
            | Command::Write { offset, length, .. }
            | Command::Trim { offset, length, .. }
            | Command::Cache { offset, length }
            | Command::WriteZeroes { offset, length, .. } => (offset, length),
            Command::Flush | Command::Disconnect => return false,
        };
        self.params.block_sizes.min < block && !unaligned::is_aligned(offset, length as u64, block)
    }

    /// Whether a small read of members in memory is served by the worker
    /// that read it after it lets go of the reader, as nbdkit's threads
    /// do, instead of inline: when no other request is buffered behind it
    /// and fewer connections are open than there are CPUs. A client at a
    /// low depth sends a request at a time, and one thread that reads,
    /// copies and replies in turn leaves the other CPU idle; handed off,
    /// the next request is read while this one is copied and sent. With
    /// requests buffered behind it, inline serving and held replies save
    /// a switch and a system call a request, and with a connection per
    /// CPU every CPU already has a reader. raid0 4K reads on one connection
    /// (fio, QD 1 and 4): 10,000-12,700 and 44,000-61,000 IOPS inline,
    /// 15,400-15,700 and 59,000-64,000 handed off, the same from QD 16
    /// (docs/BENCHMARKS.md, "IOPS by queue depth").
    fn reads_handed_off(&self, more_buffered: bool) -> bool {
        !more_buffered
            && self.shared.live_connections.load(Ordering::Relaxed) < self.shared.options.cpus
    }

    /// Whether the worker holding the reader serves this request itself
    /// and reads on, instead of letting go of the reader. Only requests
    /// that never wait for a device (members in memory) qualify:
    /// - a small read: handing it to the next worker (a wake-up and a
    ///   switch) costs more than the copy: nbdkit memory's ratio went from
    ///   0.78–0.90 to 0.97–1.02; except at a low depth on a lone
    ///   connection (`reads_handed_off`);
    /// - a staged write, when more connections are busy than there are
    ///   CPUs: every core then has a connection's reader to run, and a
    ///   hand-off only adds a switch per write (raid6 full-stripe writes
    ///   over 4 connections on 2 CPUs: 5.5–5.8 to 6.3–6.6 GB/s). With
    ///   fewer, the hand-off is what lets the next worker read a
    ///   connection's next write while the last is stored (1 connection:
    ///   2,789–3,235 MiB/s handed off, 2,229–2,480 inline; docs/
    ///   BENCHMARKS.md, "Staged writes"). A staged write waits only for its rows'
    ///   locks (`Engine::write_staged_bytes`); one the engine declines at
    ///   the last moment (a stripe-cache batch opened meanwhile) takes the
    ///   plain path and may wait in a batch with the reader held, for at
    ///   most the cache's gather deadlines.
    fn serves_inline(&self, job: &Job, more_buffered: bool) -> bool {
        let backend = &self.shared.backend;
        if job.cut {
            return false;
        }
        match job.command {
            Command::Read { length, .. } => {
                length as usize <= INLINE_READ_MAX
                    && backend.reads_from_memory()
                    && !self.reads_handed_off(more_buffered)
            }
            Command::Write { .. } => {
                job.staged
                    && backend.reads_from_memory()
                    && self.shared.busy_connections.load(Ordering::Relaxed)
                        > self.shared.options.cpus
            }
            _ => false,
        }
    }

    /// Serves one request; `scratch` is the worker's read buffer, reused so
    /// that a read does not allocate and zero a new one each time, and
    /// `pipe` where it stages spliced reads.
    fn execute(
        &self,
        job: Job,
        payload: &AlignedBuf,
        scratch: &mut AlignedBuf,
        pipe: &mut Staging,
    ) {
        let cookie = job.cookie;
        if let Command::Read { offset, length } = job.command {
            if !job.cut && self.splice_read(cookie, offset, length as usize, pipe) {
                return;
            }
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            if job.cut {
                self.run_cut(&job, payload, scratch)
            } else {
                self.run(&job, payload, scratch, pipe)
            }
        }))
        .unwrap_or_else(|_| {
            // A staged payload may be half taken.
            if job.staged {
                pipe.pipe = None;
            }
            Err((NbdError::Io, "internal error in the storage backend".into()))
        });

        match result {
            Ok(Some(bytes)) => self.reply_read(cookie, &job.command, &scratch[bytes]),
            Ok(None) => self.send(&[&proto::encode_simple_reply(0, cookie)]),
            Err((err, msg)) => self.reply_error_raw(cookie, err, &msg),
        }
    }

    /// Runs a request on the backend's own blocks. Every change of blocks
    /// holds the shared write locks of its range while the backend runs it,
    /// so that no read-modify-write of a block it changes straddles it.
    fn run(
        &self,
        job: &Job,
        payload: &AlignedBuf,
        scratch: &mut AlignedBuf,
        pipe: &mut Staging,
    ) -> Outcome {
        let backend = &*self.shared.backend;
        let locks = &self.shared.write_locks;
        match job.command {
            Command::Read { offset, length } => {
                let length = length as usize;
                if scratch.len() < length {
                    *scratch = AlignedBuf::zeroed(length);
                }
                if length > 0 {
                    // Other requests of this connection in flight
                    // (replies being sent) make it no lone reader.
                    let company = self.inflight.requests() > 1;
                    let buf = &mut scratch[..length];
                    io(backend.read_among(offset, buf, company), "read")?;
                }
                Ok(Some(0..length))
            }
            Command::Write { offset, fua, .. } if job.staged => {
                let _shared = locks.shared(offset, job.payload_len as u64);
                self.write_staged(job.payload_len, offset, fua, scratch, pipe)
            }
            Command::Write { offset, fua, .. } => {
                if job.payload_len > 0 {
                    let data = &payload[..job.payload_len];
                    let _shared = locks.shared(offset, data.len() as u64);
                    io(backend.write(offset, data, fua), "write")?;
                }
                Ok(None)
            }
            // Every write already answered has returned from the backend,
            // so one backend flush covers exactly what the spec requires.
            Command::Flush => io(backend.flush(), "flush").map(|_| None),
            Command::Trim {
                offset,
                length,
                fua,
            } => {
                if length > 0 {
                    let _shared = locks.shared(offset, length as u64);
                    io(backend.trim(offset, length as u64), "trim")?;
                }
                self.flush_after_trim(fua)
            }
            Command::Cache { offset, length } => {
                io(backend.cache(offset, length as u64), "cache").map(|_| None)
            }
            Command::WriteZeroes { offset, length, .. } => {
                let flags = self.zero_flags(&job.command)?;
                if length > 0 {
                    let _shared = locks.shared(offset, length as u64);
                    let zeroed = backend.write_zeroes(offset, length as u64, flags);
                    io(zeroed, "write zeroes")?;
                }
                Ok(None)
            }
            Command::Disconnect => Ok(None),
        }
    }

    /// Runs a request that is not aligned to the backend's blocks, from a
    /// client that agreed to no block sizes: cut at the blocks, its edges
    /// read, modified and written back (see `unaligned`).
    fn run_cut(&self, job: &Job, payload: &AlignedBuf, scratch: &mut AlignedBuf) -> Outcome {
        let backend = &*self.shared.backend;
        let locks = &self.shared.write_locks;
        let sizes = self.shared.export.block_sizes;
        let block = sizes.min;
        match job.command {
            Command::Read { offset, length } => {
                let len = length as usize;
                let read = unaligned::read(backend, block, sizes.max_payload, offset, len, scratch);
                read.map(Some)
                    .map_err(|e| (NbdError::from_io_error(&e), format!("read failed: {e}")))
            }
            Command::Write { offset, fua, .. } => {
                let data = &payload[..job.payload_len];
                let written = unaligned::write(backend, locks, block, offset, data, fua);
                io(written, "write").map(|()| None)
            }
            Command::Trim {
                offset,
                length,
                fua,
            } => {
                let trimmed = unaligned::trim(backend, locks, block, offset, length as u64);
                io(trimmed, "trim")?;
                self.flush_after_trim(fua)
            }
            Command::Cache { offset, length } => {
                let (start, len) = unaligned::covering(offset, length as u64, block);
                io(backend.cache(start, len), "cache").map(|_| None)
            }
            Command::WriteZeroes { offset, length, .. } => {
                let flags = self.zero_flags(&job.command)?;
                let len = length as u64;
                let zeroed = unaligned::write_zeroes(backend, locks, block, offset, len, flags);
                io(zeroed, "write zeroes").map(|()| None)
            }
            Command::Flush | Command::Disconnect => {
                unreachable!("only commands with a range are cut")
            }
        }
    }

    /// Writes a payload of `len` bytes staged in the worker's pipe: moved
    /// into the backend's files when it takes it, else copied back into
    /// `scratch` and written.
    fn write_staged(
        &self,
        len: usize,
        offset: u64,
        fua: bool,
        scratch: &mut AlignedBuf,
        pipe: &mut Staging,
    ) -> Outcome {
        let backend = &*self.shared.backend;
        let staged = pipe.pipe.as_ref().expect("a staged payload has its pipe");
        let mut data = StagedPayload::new(staged, &mut pipe.spare, len);
        let result = backend.write_staged(offset, len, fua, &mut data);
        let whole = data.untouched();
        let clean = data.consumed();
        if let Some(result) = result {
            if !clean {
                pipe.pipe = None;
            }
            let counter = &self.shared.staged_writes;
            counter.fetch_add(1, Ordering::Relaxed);
            return io(result, "write").map(|()| None);
        }
        // Declined: the bytes come back by copy.
        assert!(whole, "a declined staged write took bytes");
        if scratch.len() < len {
            *scratch = AlignedBuf::zeroed(len);
        }
        if let Err(e) = staged.read_exact(&mut scratch[..len]) {
            pipe.pipe = None;
            return io(Err(e), "write").map(|()| None);
        }
        io(backend.write(offset, &scratch[..len], fua), "write")?;
        Ok(None)
    }

    fn flush_after_trim(&self, fua: bool) -> Outcome {
        if fua {
            io(self.shared.backend.flush(), "flush after trim")?;
        }
        Ok(None)
    }

    /// The backend's flags for a write-zeroes; ENOTSUP at once for a fast
    /// zero that the backend cannot do faster than writing.
    fn zero_flags(&self, command: &Command) -> Result<ZeroFlags, Refusal> {
        let Command::WriteZeroes {
            fua, no_hole, fast, ..
        } = *command
        else {
            unreachable!("flags of a write-zeroes only")
        };
        if fast && !self.shared.backend.zeroes_are_fast() {
            return Err((
                NbdError::NotSup,
                "zeroing is not faster than writing on this export".into(),
            ));
        }
        Ok(ZeroFlags {
            fua,
            may_trim: !no_hole,
        })
    }

    /// Starts a read on the fast path when it can take it: a read of at
    /// most `fastpath::READ_MAX` that the backend maps to at most
    /// `fastpath::EXTENTS_MAX` file extents. Else gives the job back.
    fn start_fast(
        &self,
        fast: &mut Option<FastReads>,
        refused: &mut bool,
        job: Job,
    ) -> Option<Job> {
        let Command::Read { offset, length } = job.command else {
            return Some(job);
        };
        let len = length as usize;
        if len == 0 || len > fastpath::READ_MAX || *refused || job.cut {
            return Some(job);
        }
        let backend = &*self.shared.backend;
        let Ok(Some(extents)) = catch_unwind(AssertUnwindSafe(|| {
            backend.read_extents(offset, len, ExtentUse::Read)
        })) else {
            return Some(job);
        };
        if extents.is_empty() || extents.len() > fastpath::EXTENTS_MAX {
            return Some(job);
        }
        if fast.is_none() {
            match FastReads::new() {
                Ok(f) => *fast = Some(f),
                Err(e) => {
                    self.log.line(format_args!(
                        "no io_uring for the fast path ({e}); reads take the workers' path"
                    ));
                    *refused = true;
                    return Some(job);
                }
            }
        }
        let f = fast.as_mut().expect("made above");
        while !f.has_room(extents.len()) {
            self.answer_fast(f, true);
        }
        f.start(job.cookie, offset, len, job.cost, extents);
        self.shared.fast_reads.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Answers the fast path's reads that have finished, waiting for one
    /// with `wait`: their replies go out in one send. A read that failed is
    /// read again through the backend (whose read handles a failing
    /// member), here, before the others are answered.
    fn answer_fast(&self, fast: &mut FastReads, wait: bool) {
        let mut done = fast.reap(wait);
        if done.is_empty() {
            return;
        }
        let backend = &*self.shared.backend;
        let mut heads = Vec::with_capacity(done.len());
        let mut errors = Vec::new();
        for d in &mut done {
            let Done {
                offset, len, buf, ..
            } = d;
            if d.failed {
                let again =
                    catch_unwind(AssertUnwindSafe(|| backend.read(*offset, &mut buf[..*len])))
                        .unwrap_or_else(|_| {
                            Err(std::io::Error::other(
                                "internal error in the storage backend",
                            ))
                        });
                if let Err(e) = again {
                    errors.push((d.cookie, e));
                    heads.push(None);
                    continue;
                }
            }
            match self.read_reply_head(d.cookie, d.offset, d.len) {
                Ok(head) => heads.push(Some(head)),
                Err(e) => {
                    errors.push((
                        d.cookie,
                        std::io::Error::other(format!("cannot encode reply: {e}")),
                    ));
                    heads.push(None);
                }
            }
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * done.len());
        for (d, head) in done.iter().zip(&heads) {
            if let Some(head) = head {
                parts.push(head);
                parts.push(&d.buf[..d.len]);
            }
        }
        if !parts.is_empty() {
            self.send(&parts);
        }
        for (cookie, e) in errors {
            self.reply_error_raw(
                cookie,
                NbdError::from_io_error(&e),
                &format!("read failed: {e}"),
            );
        }
        let timed = backend.times_requests();
        for d in done {
            if timed {
                backend.request_done(d.queued.elapsed());
            }
            self.inflight.release(d.cost);
            fast.recycle(d.buf);
        }
    }

    /// Answers a read by splicing its bytes from the backend's files (page
    /// references from their page cache to the socket, no copy in this
    /// process) when the backend says where they lie; says whether it did.
    /// Every byte is staged in the pipe before the reply starts, so a
    /// failure to get them (a short file, an error) falls back to `read`
    /// with nothing sent.
    ///
    /// Not for a client on this host: it copies the bytes out of the
    /// socket, and from spliced page-cache pages (cold, 4 KiB each) that
    /// cost it 1.5-1.9 times its CPU against bytes this server copied into
    /// the socket (warm, in large fragments); on shared cores the
    /// client's CPU is the bound (fio's nbd engine over loopback: 0.58 of
    /// `nbdkit memory` spliced, 0.88 copied, docs/BENCHMARKS.md).
    fn splice_read(&self, cookie: u64, offset: u64, length: usize, staging: &mut Staging) -> bool {
        if !self.splice_reads || length < SPLICE_MIN_BYTES || length >= staging.refused_from {
            return false;
        }
        let backend = &*self.shared.backend;
        let start = backend.times_requests().then(std::time::Instant::now);
        let Ok(Some(extents)) = catch_unwind(AssertUnwindSafe(|| {
            backend.read_extents(offset, length, ExtentUse::Splice)
        })) else {
            return false;
        };
        if staging.ready(length).is_none() {
            return false;
        }
        let pipe = &mut staging.pipe;
        let Some(staged) = pipe.as_ref() else {
            return false;
        };
        for extent in &extents {
            if staged
                .fill_from(extent.fd, extent.offset, extent.len)
                .is_err()
            {
                // What was staged cannot be taken back: a new pipe next time.
                *pipe = None;
                return false;
            }
        }
        let Ok(head) = self.read_reply_head(cookie, offset, length) else {
            *pipe = None;
            return false;
        };
        let sent =
            self.send_with(|sock, timeout| sock.send_spliced(&head, staged, length, timeout));
        if !sent {
            // The connection is gone; whatever is left in the pipe goes with it.
            *pipe = None;
        }
        // The extents count as the backend's reads in flight until the
        // reply has gone: the pipe holds references to the files' pages,
        // not copies, so the read is not over once staged; and a client
        // that keeps many reads in flight, whose replies wait for the
        // socket, must not look like a lone reader that read-ahead would
        // serve by copy.
        drop(extents);
        if let Some(start) = start {
            backend.request_done(start.elapsed());
        }
        true
    }

    fn reply_read(&self, cookie: u64, command: &Command, data: &[u8]) {
        let offset = match command {
            Command::Read { offset, .. } => *offset,
            _ => 0,
        };
        if self.params.structured_replies && data.is_empty() {
            // A content chunk must hold at least one byte, so an empty read
            // is answered with just the final NONE chunk.
            self.send(&[&proto::encode_none_chunk(cookie)]);
            return;
        }
        match self.read_reply_head(cookie, offset, data.len()) {
            Ok(head) => self.send(&[&head, data]),
            Err(e) => {
                self.reply_error_raw(cookie, NbdError::Io, &format!("cannot encode reply: {e}"))
            }
        }
    }

    /// What goes before the `len` (> 0 when structured) bytes of a read's
    /// reply: a simple reply, or a data chunk that is the final one (the
    /// data is complete before anything is sent, so no error can follow).
    fn read_reply_head(&self, cookie: u64, offset: u64, len: usize) -> Result<Vec<u8>, ProtoError> {
        if !self.params.structured_replies {
            return Ok(proto::encode_simple_reply(0, cookie).to_vec());
        }
        // A read is at most the negotiated maximum payload (32 MiB).
        assert!(len <= u32::MAX as usize);
        proto::encode_offset_data_prefix(cookie, proto::REPLY_FLAG_DONE, offset, len as u32)
            .map(|prefix| prefix.to_vec())
    }

    fn reply_error(&self, request: &RequestHeader, err: NbdError, message: &str) {
        self.reply_error_raw(request.cookie, err, message);
    }

    /// Sends an error reply: a structured error chunk (with a message for
    /// humans) when structured replies are on, which the spec requires for
    /// reads and prefers for everything else; a simple reply otherwise.
    fn reply_error_raw(&self, cookie: u64, err: NbdError, message: &str) {
        if self.params.structured_replies {
            self.send(&[&proto::encode_error_chunk(
                cookie,
                proto::REPLY_FLAG_DONE,
                err.code(),
                message,
            )]);
        } else {
            self.send(&[&proto::encode_simple_reply(err.code(), cookie)]);
        }
    }

    /// Writes one whole reply under the writer lock. After a failure the
    /// connection is shut down (which also ends the reader) and later replies
    /// are dropped.
    fn send(&self, parts: &[&[u8]]) {
        self.send_with(|sock, timeout| sock.send_all(parts, timeout));
    }

    /// Writes one whole reply with `write` under the writer lock; says
    /// whether it went out (see [`send`](Self::send)).
    fn send_with(
        &self,
        write: impl FnOnce(&Sock, Option<std::time::Duration>) -> std::io::Result<()>,
    ) -> bool {
        let mut broken = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if *broken {
            return false;
        }
        if let Err(e) = write(&self.sock, self.shared.options.io_timeout) {
            *broken = true;
            if !client_gone(&e) {
                self.log
                    .line(format_args!("cannot send a reply: {e}; disconnecting"));
            }
            self.sock.shutdown();
            return false;
        }
        true
    }
}
