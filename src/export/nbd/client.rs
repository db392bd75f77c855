//! A small NBD client, for `uraid bench`'s load generator and for tests
//! that drive the server: fixed newstyle handshake with
//! `NBD_OPT_GO`, then pipelined READ/WRITE/FLUSH told apart by cookie.
//!
//! It speaks only what the benchmark needs, over a unix socket, with simple
//! replies (no structured replies: a read's data then follows its reply
//! header directly, which is the cheapest framing to parse). The messages
//! are built and parsed by the server's own encoders and decoders in
//! `member::nbd::proto`, so the two sides cannot drift apart.
//!
//! Two ways to drive a connection:
//! - `Pipeline`, the load generator's: one thread queues requests and sends
//!   them together, and reads replies many per system call, as fio's
//!   io_uring and libnbd engines batch theirs. A reply's slot is reused by
//!   the same thread at once, so no thread hand-off sits between a reply
//!   and the next request: what the generator adds to each request's round
//!   trip is a few microseconds of its own, not a wake-up.
//! - `connect`'s sender and receiver, for tests that mix kinds of request
//!   on two threads: the receiver keeps draining replies while the sender
//!   is blocked writing a large payload, so both ends cannot wait on each
//!   other with full socket buffers.

use crate::member::nbd;
use crate::member::nbd::proto::{self, ReplyHeader, RequestHeader};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

pub use crate::member::nbd::ExportInfo;

/// The writing half of a connection.
pub struct NbdSender {
    stream: UnixStream,
}

/// The reading half of a connection.
pub struct NbdReceiver {
    stream: UnixStream,
}

/// One reply: the cookie of its request and the NBD error (0 is success).
/// For a successful read, the caller then takes the data with
/// [`NbdReceiver::recv_data`] or [`Pipeline::take_data`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
}

/// A request's header, as every request of this client carries it (no
/// flags).
fn request_header(
    command: u16,
    cookie: u64,
    offset: u64,
    length: u32,
) -> [u8; proto::REQUEST_HEADER_LEN] {
    proto::encode_request_header(&RequestHeader {
        flags: 0,
        command,
        cookie,
        offset,
        length,
    })
}

/// A simple reply's header; a structured one is an error (never negotiated).
fn decode_reply(header: &[u8]) -> io::Result<Reply> {
    match proto::decode_reply_header(header).map_err(protocol_error)? {
        ReplyHeader::Simple { error, cookie } => Ok(Reply { cookie, error }),
        ReplyHeader::Chunk(_) => Err(protocol_error(
            "a structured reply, which this client did not negotiate",
        )),
    }
}

fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("NBD: {what}"))
}

/// Connects to the export `name` at a unix socket and negotiates with
/// `NBD_OPT_GO` (the NBD member's handshake).
pub fn connect(socket: &Path, name: &str) -> io::Result<(NbdSender, NbdReceiver, ExportInfo)> {
    let mut stream = UnixStream::connect(socket)?;
    nbd::start_handshake(&mut stream)?;
    let info = nbd::go(&mut stream, name)?;
    let reader = stream.try_clone()?;
    Ok((NbdSender { stream }, NbdReceiver { stream: reader }, info))
}

impl NbdSender {
    fn send(&mut self, command: u16, cookie: u64, offset: u64, length: u32) -> io::Result<()> {
        self.stream
            .write_all(&request_header(command, cookie, offset, length))
    }

    pub fn send_read(&mut self, cookie: u64, offset: u64, length: u32) -> io::Result<()> {
        assert!(length > 0);
        self.send(proto::CMD_READ, cookie, offset, length)
    }

    pub fn send_write(&mut self, cookie: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let length = u32::try_from(data.len()).expect("a request carries less than 4 GiB");
        assert!(length > 0);
        self.send(proto::CMD_WRITE, cookie, offset, length)?;
        self.stream.write_all(data)
    }

    /// Sends a write's header alone; its payload follows by
    /// [`NbdSender::send_payload`]. For tests of a request whose payload
    /// is late.
    pub fn send_write_header(&mut self, cookie: u64, offset: u64, length: u32) -> io::Result<()> {
        assert!(length > 0);
        self.send(proto::CMD_WRITE, cookie, offset, length)
    }

    /// Sends bytes of a payload whose header went out before.
    pub fn send_payload(&mut self, data: &[u8]) -> io::Result<()> {
        self.stream.write_all(data)
    }

    pub fn send_flush(&mut self, cookie: u64) -> io::Result<()> {
        self.send(proto::CMD_FLUSH, cookie, 0, 0)
    }

    /// Ends the session politely; the server closes the connection.
    pub fn send_disconnect(&mut self) -> io::Result<()> {
        self.send(proto::CMD_DISC, 0, 0, 0)
    }
}

impl NbdReceiver {
    /// The next reply header, in whatever order the server completes them.
    pub fn recv(&mut self) -> io::Result<Reply> {
        let mut header = [0u8; proto::SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut header)?;
        decode_reply(&header)
    }

    /// The data of a successful read, right after its reply header.
    pub fn recv_data(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.stream.read_exact(buf)
    }
}

/// Bytes the pipeline reads per system call at most: many small replies,
/// or a good part of a large read's data.
const PIPELINE_READ_BYTES: usize = 256 << 10;

/// Writes of at most this many bytes are copied behind their header and
/// sent with the other queued requests; larger ones go out at once from
/// the caller's buffer, header and data in one vectored write.
const PIPELINE_INLINE_WRITE_BYTES: usize = 64 << 10;

/// A connection driven by one thread (see the module's notes).
///
/// One thread is enough only because a pipeline carries one kind of
/// request (asserted here) with a bounded number in flight (asserted by
/// its user, the generator: at most `JOB_DEPTH_MAX`): a read's
/// requests (28 bytes each) or a write's replies (16 bytes each) always fit
/// in the socket's buffer, so a blocking send of requests can never wait
/// on a server that is itself blocked sending replies nobody reads.
pub struct Pipeline {
    stream: UnixStream,
    pub info: ExportInfo,
    /// The command every request of this pipeline carries, once one was
    /// queued.
    command: Option<u16>,
    /// Requests queued and not yet sent.
    out: Vec<u8>,
    /// Bytes read and not yet parsed: `input[start..end]`.
    input: Vec<u8>,
    start: usize,
    end: usize,
}

impl Pipeline {
    pub fn connect(socket: &Path, name: &str) -> io::Result<Pipeline> {
        let (sender, receiver, info) = connect(socket, name)?;
        drop(receiver);
        Ok(Pipeline {
            stream: sender.stream,
            info,
            command: None,
            out: Vec::with_capacity(PIPELINE_INLINE_WRITE_BYTES * 2),
            input: vec![0u8; PIPELINE_READ_BYTES],
            start: 0,
            end: 0,
        })
    }

    fn queue(&mut self, command: u16, cookie: u64, offset: u64, length: u32) {
        assert_eq!(
            *self.command.get_or_insert(command),
            command,
            "a pipeline carries one kind of request"
        );
        self.out
            .extend_from_slice(&request_header(command, cookie, offset, length));
    }

    /// Queues a read; `flush` sends it.
    pub fn queue_read(&mut self, cookie: u64, offset: u64, length: u32) {
        assert!(length > 0);
        self.queue(proto::CMD_READ, cookie, offset, length);
    }

    /// Queues a write (or sends it with what is queued, if large).
    pub fn queue_write(&mut self, cookie: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let length = u32::try_from(data.len()).expect("a request carries less than 4 GiB");
        assert!(length > 0);
        self.queue(proto::CMD_WRITE, cookie, offset, length);
        if data.len() <= PIPELINE_INLINE_WRITE_BYTES {
            self.out.extend_from_slice(data);
            return Ok(());
        }
        let mut slices = [io::IoSlice::new(&self.out), io::IoSlice::new(data)];
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            match self.stream.write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        Ok(())
    }

    /// Sends every queued request.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends the disconnect request (and anything still queued).
    pub fn disconnect(mut self) -> io::Result<()> {
        self.out
            .extend_from_slice(&request_header(proto::CMD_DISC, 0, 0, 0));
        self.flush()
    }

    /// The next reply whose header is already read, if any; a read's data
    /// must then be taken with `take_data` before the next reply.
    pub fn next_reply(&mut self) -> io::Result<Option<Reply>> {
        if self.end - self.start < proto::SIMPLE_REPLY_LEN {
            return Ok(None);
        }
        let reply = decode_reply(&self.input[self.start..self.start + proto::SIMPLE_REPLY_LEN])?;
        self.start += proto::SIMPLE_REPLY_LEN;
        Ok(Some(reply))
    }

    /// Takes the data that follows a read's reply: what is already read,
    /// then the rest straight from the socket.
    pub fn take_data(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let have = (self.end - self.start).min(buf.len());
        buf[..have].copy_from_slice(&self.input[self.start..self.start + have]);
        self.start += have;
        self.stream.read_exact(&mut buf[have..])
    }

    /// Waits for more replies: one read of whatever the socket holds.
    pub fn receive(&mut self) -> io::Result<()> {
        assert!(
            self.end - self.start < proto::SIMPLE_REPLY_LEN,
            "a whole reply is still unparsed"
        );
        if self.start > 0 {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.stream.read(&mut self.input[self.end..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A connection used one request at a time: for setup and for tests.
pub struct NbdSync {
    sender: NbdSender,
    receiver: NbdReceiver,
    pub info: ExportInfo,
    next_cookie: u64,
}

impl NbdSync {
    pub fn connect(socket: &Path, name: &str) -> io::Result<NbdSync> {
        let (sender, receiver, info) = connect(socket, name)?;
        Ok(NbdSync {
            sender,
            receiver,
            info,
            next_cookie: 1,
        })
    }

    fn finish(&mut self, cookie: u64) -> io::Result<()> {
        let reply = self.receiver.recv()?;
        if reply.cookie != cookie {
            return Err(protocol_error(format!(
                "reply for cookie {} to request {cookie}",
                reply.cookie
            )));
        }
        if reply.error != 0 {
            return Err(io::Error::other(format!("NBD error {}", reply.error)));
        }
        Ok(())
    }

    fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let cookie = self.cookie();
        self.sender.send_read(cookie, offset, buf.len() as u32)?;
        self.finish(cookie)?;
        self.receiver.recv_data(buf)
    }

    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let cookie = self.cookie();
        self.sender.send_write(cookie, offset, data)?;
        self.finish(cookie)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let cookie = self.cookie();
        self.sender.send_flush(cookie)?;
        self.finish(cookie)
    }

    pub fn disconnect(mut self) -> io::Result<()> {
        self.sender.send_disconnect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::memory::MemoryBackend;
    use crate::export::nbd::{serve, Listener, ServeOptions};
    use crate::export::BlockBackend;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    /// The pipeline's framing: 32 requests in flight, small writes copied
    /// behind their headers and large ones sent from the caller's buffer,
    /// reads whose data is all buffered, split over two socket reads, or
    /// longer than the read buffer; every byte lands and comes back where
    /// it belongs, checked against the server's memory.
    #[test]
    fn a_pipeline_writes_and_reads_back_every_size_in_flight_together() {
        const SIZE: usize = 64 << 20;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("socket");
        let listener: Listener = format!("unix:{}", socket.display()).parse().unwrap();
        let backend = Arc::new(MemoryBackend::new(SIZE as u64));
        let options = ServeOptions {
            export_name: "t".into(),
            ..ServeOptions::default()
        };
        let server = serve(&listener, backend.clone() as Arc<dyn BlockBackend>, options).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let image: Vec<u8> = (0..SIZE).map(|_| rng.gen()).collect();
        // Writes: 4 KiB (copied into the queue), then 1 MiB (sent at once).
        for len in [4096usize, 1 << 20] {
            let count = if len == 4096 { 256 } else { SIZE / len };
            pipelined(
                &socket,
                count,
                |conn, i| {
                    let at = i * len;
                    conn.queue_write(i as u64, at as u64, &image[at..at + len])
                        .unwrap();
                },
                |_, reply| assert!((reply.cookie as usize) < count),
            );
        }
        assert!(backend.contents() == image, "the writes landed where sent");
        // Reads: 4 KiB, 64 KiB and 1 MiB (four times the read buffer).
        for len in [4096usize, 64 << 10, 1 << 20] {
            let mut data = vec![0u8; len];
            pipelined(
                &socket,
                SIZE / len,
                |conn, i| conn.queue_read(i as u64, (i * len) as u64, len as u32),
                |conn, reply| {
                    conn.take_data(&mut data).unwrap();
                    let at = reply.cookie as usize * len;
                    assert!(data == image[at..at + len], "{len} bytes at {at}");
                },
            );
        }
        server.shutdown();
    }

    /// Sends requests 0..count with at most 32 in flight, each queued by
    /// `queue`, and hands each successful reply to `answer`.
    fn pipelined(
        socket: &Path,
        count: usize,
        mut queue: impl FnMut(&mut Pipeline, usize),
        mut answer: impl FnMut(&mut Pipeline, Reply),
    ) {
        let mut conn = Pipeline::connect(socket, "t").unwrap();
        let (mut in_flight, mut next, mut answered) = (0usize, 0usize, 0usize);
        while answered < count {
            while in_flight < 32 && next < count {
                queue(&mut conn, next);
                next += 1;
                in_flight += 1;
            }
            conn.flush().unwrap();
            conn.receive().unwrap();
            while let Some(reply) = conn.next_reply().unwrap() {
                assert_eq!(reply.error, 0);
                answer(&mut conn, reply);
                in_flight -= 1;
                answered += 1;
            }
        }
        conn.disconnect().unwrap();
    }
}
