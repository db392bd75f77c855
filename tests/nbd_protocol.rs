//! The NBD server against real clients and hostile ones.
//!
//! Each test starts the server in-process on a unix socket in a temporary
//! directory, backed by a `MemoryBackend`, and drives it with the client tools
//! from Debian (libnbd-bin: nbdinfo, nbdcopy; python3-libnbd: nbdsh; fio with
//! its nbd engine; qemu-utils: qemu-img) or with raw sockets speaking
//! deliberately broken protocol. A missing tool fails the test with the
//! package to install: passing silently would hide that nothing was checked.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uraid::export::nbd::proto::{self, RequestHeader};
use uraid::export::nbd::{self, ServeOptions, ServerHandle};
use uraid::export::{BlockBackend, MemoryBackend};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// Fixture and tool helpers.

struct Fixture {
    dir: tempfile::TempDir,
    sock: PathBuf,
    backend: Arc<MemoryBackend>,
    server: Option<ServerHandle>,
}

impl Fixture {
    fn new(backend: MemoryBackend, options: ServeOptions) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("nbd.sock");
        let backend = Arc::new(backend);
        let listener = nbd::Listener::Unix(sock.clone());
        let server = nbd::serve(&listener, backend.clone() as Arc<dyn BlockBackend>, options)
            .expect("serve");
        Fixture {
            dir,
            sock,
            backend,
            server: Some(server),
        }
    }

    fn default(size: u64) -> Fixture {
        Fixture::new(MemoryBackend::new(size), ServeOptions::default())
    }

    /// The URI of the default ("") export.
    fn uri(&self) -> String {
        self.server.as_ref().unwrap().uri()
    }

    /// The URI naming the export explicitly.
    fn named_uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.sock.display())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// Finds a client tool, or fails with the Debian package that provides it.
fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{name} is not installed: install the Debian package {package} \
         (apt-get install {package}; tests/kernel/install-deps installs the test dependencies)"
    );
}

/// Runs a command with a time limit, so that a hung server fails the test
/// instead of hanging it.
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap_or_else(|e| panic!("{desc}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) of the child this function started.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("{desc} did not finish within {limit:?}");
        }
    }
}

fn run_ok(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let out = run(cmd, limit);
    assert!(
        out.status.success(),
        "{desc} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What every nbdsh script starts with: `expect(errno, fn, *args)` checks
/// that a call fails with that error number.
const NBDSH_PRELUDE: &str = r#"
import errno
import nbd

def expect(code, fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        assert e.errnum == code, "%s%r: expected errno %d, got %r (%s)" % (fn.__name__, args, code, e.errnum, e.string)
        return
    raise AssertionError("%s%r unexpectedly succeeded" % (fn.__name__, args))
"#;

/// Runs a Python script in nbdsh, after `NBDSH_PRELUDE`. The script gets
/// `URI`, connects itself (so that it can relax libnbd's client-side checks
/// first) and signals failure with an exception, which makes nbdsh exit
/// non-zero.
fn nbdsh(uri: &str, script: &str) -> Output {
    let nbdsh = tool("nbdsh", "python3-libnbd");
    // nbdsh is a shell script that runs `python3 -m nbd` from PATH. The nbd
    // module belongs to the distribution's python3, which lives next to
    // nbdsh; a python3 earlier in PATH (pyenv, a venv) would not find it.
    let dir = nbdsh.parent().unwrap();
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let code = format!("URI = {uri:?}\n{NBDSH_PRELUDE}\n{script}");
    let out = run(
        Command::new(&nbdsh).env("PATH", path).arg("-c").arg(&code),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named nbd"),
        "nbdsh cannot import the nbd module: install the Debian package python3-libnbd"
    );
    assert!(
        out.status.success(),
        "nbdsh script failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    // xorshift64*: reproducible data without an RNG dependency in the test.
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------
// A raw client: just enough protocol to talk to the server directly, and to
// break the protocol on purpose.

struct RawClient {
    s: UnixStream,
    structured: bool,
    /// Lengths of reads in flight, needed to parse simple replies.
    reads: HashMap<u64, u32>,
}

#[derive(Debug)]
struct Reply {
    cookie: u64,
    error: u32,
    data: Vec<u8>,
}

fn connect(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).expect("reading from the server");
    buf
}

/// Reads the server's greeting and sends the client flags.
fn greet(s: &mut UnixStream, client_flags: u32) {
    let greeting = read_n(s, proto::GREETING_LEN);
    let flags = proto::decode_greeting(&greeting).unwrap();
    assert_eq!(flags, proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES);
    s.write_all(&client_flags.to_be_bytes()).unwrap();
}

fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
    s.write_all(&proto::encode_option_header(proto::OptionHeader {
        option,
        length: data.len() as u32,
    }))
    .unwrap();
    s.write_all(data).unwrap();
}

/// Reads option replies up to the final one; returns them all.
fn option_replies(s: &mut UnixStream) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let h =
            proto::decode_option_reply_header(&read_n(s, proto::OPTION_REPLY_HEADER_LEN)).unwrap();
        let data = read_n(s, h.length as usize);
        let last = h.reply_type != proto::REP_INFO && h.reply_type != proto::REP_SERVER;
        out.push((h.reply_type, data));
        if last {
            return out;
        }
    }
}

/// Waits for the server to close the connection (EOF or reset), which is
/// how the tests see that it dropped a misbehaving client.
fn assert_closed(s: &mut UnixStream) {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("expected the server to close the connection, got {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server kept the connection open"
        );
    }
}

impl RawClient {
    /// A client that asks for the block sizes, and so agrees to them.
    fn connect(path: &Path, structured: bool) -> RawClient {
        RawClient::connect_asking(path, structured, vec![proto::INFO_BLOCK_SIZE])
    }

    /// A client whose OPT_GO asks for the information items `requests`.
    fn connect_asking(path: &Path, structured: bool, requests: Vec<u16>) -> RawClient {
        let mut s = connect(path);
        greet(
            &mut s,
            proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES,
        );
        if structured {
            send_option(&mut s, proto::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(option_replies(&mut s), vec![(proto::REP_ACK, vec![])]);
        }
        let request = proto::InfoRequest {
            name: String::new(),
            requests,
        };
        send_option(&mut s, proto::OPT_GO, &proto::encode_info_request(&request));
        let replies = option_replies(&mut s);
        assert_eq!(
            replies.last().unwrap().0,
            proto::REP_ACK,
            "GO failed: {replies:?}"
        );
        RawClient {
            s,
            structured,
            reads: HashMap::new(),
        }
    }

    /// An old-style client: OPT_EXPORT_NAME, which cannot agree to block
    /// sizes.
    fn export_name(path: &Path) -> RawClient {
        let mut s = connect(path);
        greet(
            &mut s,
            proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES,
        );
        send_option(&mut s, proto::OPT_EXPORT_NAME, b"");
        // Size and transmission flags, without the zeroes.
        read_n(&mut s, 10);
        RawClient {
            s,
            structured: false,
            reads: HashMap::new(),
        }
    }

    fn send(
        &mut self,
        command: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        if command == proto::CMD_READ {
            self.reads.insert(cookie, length);
        }
        let header = proto::encode_request_header(&RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        self.s.write_all(&header).unwrap();
        self.s.write_all(payload).unwrap();
    }

    /// Reads one complete reply (all chunks of a structured one).
    fn reply(&mut self) -> Reply {
        let magic = read_n(&mut self.s, 4);
        let magic_value = u32::from_be_bytes(magic[..4].try_into().unwrap());
        let len = proto::reply_header_len(magic_value)
            .unwrap_or_else(|| panic!("bad reply magic {magic_value:#x}"));
        let mut header = magic;
        header.extend(read_n(&mut self.s, len - 4));
        match proto::decode_reply_header(&header).unwrap() {
            proto::ReplyHeader::Simple { error, cookie } => {
                let read_len = self.reads.remove(&cookie);
                // Simple replies stay valid for everything but reads.
                assert!(
                    !self.structured || read_len.is_none(),
                    "simple reply to a structured read"
                );
                let data = match (read_len, error) {
                    (Some(n), 0) => read_n(&mut self.s, n as usize),
                    _ => Vec::new(),
                };
                Reply {
                    cookie,
                    error,
                    data,
                }
            }
            proto::ReplyHeader::Chunk(first) => {
                assert!(self.structured, "structured reply without negotiation");
                let cookie = first.cookie;
                let mut chunk = first;
                let mut error = 0;
                let mut data = Vec::new();
                loop {
                    let payload = read_n(&mut self.s, chunk.length as usize);
                    assert_eq!(
                        chunk.cookie, cookie,
                        "chunks of two replies interleaved unexpectedly"
                    );
                    match chunk.chunk_type {
                        proto::REPLY_TYPE_NONE => {}
                        proto::REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&payload[8..]),
                        proto::REPLY_TYPE_ERROR => {
                            error = proto::decode_error_payload(&payload).unwrap().0
                        }
                        other => panic!("unexpected chunk type {other}"),
                    }
                    if chunk.flags & proto::REPLY_FLAG_DONE != 0 {
                        break;
                    }
                    chunk =
                        proto::decode_chunk_header(&read_n(&mut self.s, proto::CHUNK_HEADER_LEN))
                            .unwrap();
                }
                self.reads.remove(&cookie);
                Reply {
                    cookie,
                    error,
                    data,
                }
            }
        }
    }

    fn write(&mut self, cookie: u64, offset: u64, data: &[u8]) {
        self.send(proto::CMD_WRITE, 0, cookie, offset, data.len() as u32, data);
        let r = self.reply();
        assert_eq!((r.cookie, r.error), (cookie, 0));
    }

    fn read(&mut self, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        self.send(proto::CMD_READ, 0, cookie, offset, len, &[]);
        let r = self.reply();
        assert_eq!((r.cookie, r.error), (cookie, 0));
        r.data
    }

    fn disconnect(mut self) {
        self.send(proto::CMD_DISC, 0, 0, 0, 0, &[]);
        assert_closed(&mut self.s);
    }
}

/// A fresh, well-behaved client still gets service.
fn assert_server_works(f: &Fixture) {
    for structured in [false, true] {
        let mut c = RawClient::connect(&f.sock, structured);
        let data = pseudo_random(4096, 77);
        c.write(1, 8192, &data);
        assert_eq!(c.read(2, 8192, 4096), data);
        c.disconnect();
    }
}

// ---------------------------------------------------------------------------
// Real clients.

#[test]
fn nbdinfo_reports_the_export() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let options = ServeOptions {
        export_name: "md0".into(),
        description: "test array".into(),
        ..Default::default()
    };
    let f = Fixture::new(MemoryBackend::new(64 * MIB), options);

    let out = run_ok(
        Command::new(&nbdinfo).arg("--json").arg(f.uri()),
        Duration::from_secs(20),
    );
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("nbdinfo --json output");
    assert_eq!(json["protocol"], "newstyle-fixed");
    assert_eq!(json["structured"], true);
    let export = &json["exports"][0];
    assert_eq!(export["export-size"], 64 * MIB);
    // The default export answers with its canonical name.
    assert_eq!(export["export-name"], "md0");
    assert_eq!(export["description"], "test array");
    for key in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_multi_conn",
        "can_df",
        "can_cache",
    ] {
        assert_eq!(export[key], true, "{key} in {export}");
    }
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["is_rotational"], false);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 * MIB);

    // The configured name works as well as the empty one; others do not.
    let out = run_ok(
        Command::new(&nbdinfo).arg("--size").arg(f.named_uri("md0")),
        Duration::from_secs(20),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (64 * MIB).to_string()
    );
    let out = run(
        Command::new(&nbdinfo)
            .arg("--size")
            .arg(f.named_uri("nosuch")),
        Duration::from_secs(20),
    );
    assert!(!out.status.success(), "an unknown export name was accepted");

    // OPT_LIST.
    let out = run_ok(
        Command::new(&nbdinfo)
            .arg("--list")
            .arg("--json")
            .arg(f.uri()),
        Duration::from_secs(20),
    );
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("nbdinfo --list --json output");
    let exports = json["exports"].as_array().unwrap();
    assert_eq!(exports.len(), 1);
    assert_eq!(exports[0]["export-name"], "md0");
}

#[test]
fn nbdinfo_read_only_single_connection_export() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let backend = MemoryBackend::new(8 * MIB)
        .with_read_only(true)
        .with_multi_conn(false);
    let f = Fixture::new(backend, ServeOptions::default());
    let out = run_ok(
        Command::new(&nbdinfo).arg("--json").arg(f.uri()),
        Duration::from_secs(20),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let export = &json["exports"][0];
    assert_eq!(export["is_read_only"], true);
    assert_eq!(export["can_multi_conn"], false);
    assert_eq!(export["can_trim"], false);
    assert_eq!(export["can_zero"], false);
    assert_eq!(export["can_flush"], true);
}

#[test]
fn nbdinfo_over_tcp() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let listener: nbd::Listener = "tcp:127.0.0.1:0".parse().unwrap();
    let server = nbd::serve(
        &listener,
        Arc::new(MemoryBackend::new(3 * MIB)),
        ServeOptions::default(),
    )
    .unwrap();
    let out = run_ok(
        Command::new(&nbdinfo).arg("--size").arg(server.uri()),
        Duration::from_secs(20),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (3 * MIB).to_string()
    );
    server.shutdown();
}

#[test]
fn nbdcopy_in_and_out() {
    let nbdcopy = tool("nbdcopy", "libnbd-bin");
    let f = Fixture::default(16 * MIB);
    let image = pseudo_random(16 * MIB as usize, 1);
    let input = f.file("in.img");
    std::fs::write(&input, &image).unwrap();

    // nbdcopy uses several connections when the server allows multi-conn.
    run_ok(
        Command::new(&nbdcopy)
            .arg("--flush")
            .arg(&input)
            .arg(f.uri()),
        Duration::from_secs(30),
    );
    assert!(
        f.backend.contents() == image,
        "the export differs from the image copied in"
    );
    assert!(
        f.backend.stats().flushes > 0,
        "nbdcopy --flush did not reach the backend"
    );

    // Change the export, then copy it out.
    let patch = pseudo_random(MIB as usize, 2);
    f.backend.write(5 * MIB, &patch, false).unwrap();
    let output = f.file("out.img");
    std::fs::write(&output, b"").unwrap();
    run_ok(
        Command::new(&nbdcopy).arg(f.uri()).arg(&output),
        Duration::from_secs(30),
    );
    let copied = std::fs::read(&output).unwrap();
    assert!(
        copied == f.backend.contents(),
        "the image copied out differs from the export"
    );
}

#[test]
fn nbdsh_commands_and_errors() {
    let options = ServeOptions {
        export_name: "md0".into(),
        description: "test array".into(),
        ..Default::default()
    };
    let f = Fixture::new(MemoryBackend::new(64 * MIB), options);
    let script = r#"
# Let the server, not libnbd, judge the invalid requests below.
h.set_strict_mode(0)
h.set_full_info(True)
h.connect_uri(URI)
size = h.get_size()
assert size == 64 << 20
assert h.get_structured_replies_negotiated()
# This client asked for the block sizes, so it must obey them.
assert h.get_request_block_size()
assert h.get_canonical_export_name() == "md0", h.get_canonical_export_name()
assert h.get_export_description() == "test array"
assert h.get_block_size(nbd.SIZE_MINIMUM) == 512
assert h.get_block_size(nbd.SIZE_PREFERRED) == 4096
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
assert h.can_fast_zero() and h.can_df() and h.can_cache() and h.can_multi_conn()
assert not h.is_read_only()

data = bytes(range(256)) * 16
h.pwrite(data, 8192)
assert h.pread(4096, 8192) == data
h.pwrite(data, 12288, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 12288, nbd.CMD_FLAG_DF) == data
h.flush()
h.trim(4096, 8192)
assert h.pread(4096, 8192) == bytes(4096)
h.pwrite(data * 4, 65536)
h.zero(8192, 65536, nbd.CMD_FLAG_NO_HOLE)
h.zero(8192, 65536 + 8192, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
assert h.pread(16384, 65536) == bytes(16384)
h.cache(4096, 0)
# A large read and write, up to the maximum payload.
big = bytes(range(251)) * ((32 << 20) // 251) + bytes((32 << 20) % 251)
h.pwrite(big, size - len(big))
assert h.pread(len(big), size - len(big)) == big

# Several requests in flight on this connection at once.
bufs = [nbd.Buffer(4096) for _ in range(32)]
cookies = [h.aio_pread(bufs[i], i * 4096) for i in range(32)]
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)

# Errors, each followed by proof that the connection still works.
expect(errno.EINVAL, h.pread, 512, size)               # past the end
expect(errno.EINVAL, h.pread, 1024, size - 512)        # straddling the end
expect(errno.ENOSPC, h.pwrite, bytes(512), size)       # write past the end
expect(errno.ENOSPC, h.zero, 1024, size - 512)         # zero past the end
expect(errno.EINVAL, h.trim, 512, size)                # trim past the end
expect(errno.EINVAL, h.pread, 512, 1)                  # misaligned offset
expect(errno.EINVAL, h.pwrite, bytes(100), 0)          # misaligned length
expect(errno.EINVAL, h.pread, (32 << 20) + 512, 0)    # beyond the maximum payload
expect(errno.EOVERFLOW, h.pread, (32 << 20) + 512, 0, nbd.CMD_FLAG_DF)  # too long for one chunk
expect(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_NO_HOLE)  # flag not valid for reads
assert h.pread(4096, 8192) == bytes(4096)
h.shutdown()
"#;
    nbdsh(&f.uri(), script);
    let stats = f.backend.stats();
    assert!(stats.fua_writes >= 1, "{stats:?}");
    // The explicit flush, plus the FUA zero.
    assert!(stats.flushes >= 2, "{stats:?}");
    assert!(
        stats.trims >= 1 && stats.zeroes >= 2 && stats.caches >= 1,
        "{stats:?}"
    );
}

#[test]
fn nbdsh_simple_replies_read_only_and_backend_errors() {
    // Without structured replies, errors travel in simple replies.
    let f = Fixture::default(8 * MIB);
    f.backend.set_fail_range(Some(MIB..MIB + 4096));
    let script = r#"
h.set_strict_mode(0)
h.set_request_structured_replies(False)
h.connect_uri(URI)
assert not h.get_structured_replies_negotiated()
assert not h.can_df()
h.pwrite(b"\x55" * 4096, 0)
assert h.pread(4096, 0) == b"\x55" * 4096
expect(errno.EIO, h.pread, 4096, 1 << 20)          # the backend fails there
expect(errno.EIO, h.pwrite, bytes(4096), 1 << 20)
expect(errno.EINVAL, h.pread, 512, 8 << 20)
expect(errno.EINVAL, h.pread, (32 << 20) + 512, 0)  # too long for a simple reply
expect(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_DF)  # DF needs structured replies
assert h.pread(4096, 0) == b"\x55" * 4096
h.shutdown()
"#;
    nbdsh(&f.uri(), script);

    let backend = MemoryBackend::new(8 * MIB).with_read_only(true);
    let ro = Fixture::new(backend, ServeOptions::default());
    let script = r#"
h.set_strict_mode(0)
h.connect_uri(URI)
assert h.is_read_only()
expect(errno.EPERM, h.pwrite, bytes(4096), 0)
expect(errno.EPERM, h.trim, 4096, 0)
expect(errno.EPERM, h.zero, 4096, 0)
assert h.pread(4096, 0) == bytes(4096)
h.flush()
h.shutdown()
"#;
    nbdsh(&ro.uri(), script);
    assert_eq!(ro.backend.stats().writes, 0);
}

/// Clients that agreed to no block sizes, through libnbd: old-style
/// (OPT_EXPORT_NAME, simple replies) and OPT_GO without an
/// NBD_INFO_BLOCK_SIZE request (structured replies). Each addresses single
/// bytes of an export of 512-byte blocks, whose backend refuses anything
/// but whole blocks; the export must then hold exactly what the client
/// wrote, every other byte as it was.
#[test]
fn nbdsh_clients_without_block_sizes_address_bytes() {
    // Larger than the maximum payload, so that an oversized read can lie
    // inside it; only the first MiB holds a pattern.
    const SIZE: u64 = 40 * MIB;
    let script = r#"
h.set_strict_mode(0)
SETUP
h.connect_uri(URI)
assert h.get_protocol() == PROTOCOL, h.get_protocol()
assert h.get_structured_replies_negotiated() == STRUCTURED
size = h.get_size()
data = bytes((i * 13 + 1) % 256 for i in range(1000))
h.pwrite(data, 3)
assert h.pread(1000, 3) == data
h.pwrite(b"\xaa", 511, nbd.CMD_FLAG_FUA)   # the last byte of a block
assert h.pread(1, 511) == b"\xaa"
h.pwrite(data[:300], 5000)                  # astride a block boundary
assert h.pread(300, 5000) == data[:300]
h.zero(7, 2000)                             # inside one block
h.zero(1500, 9000, nbd.CMD_FLAG_FUA)        # two edges and whole blocks between
assert h.pread(1500, 9000) == bytes(1500)
h.trim(1000, 20000)
h.cache(10, 5)
h.flush()
assert h.pread(5, size - 5) == h.pread(512, size - 512)[-5:]
expect(errno.EINVAL, h.pread, 6, size - 5)  # past the end
expect(errno.ENOSPC, h.pwrite, b"xy", size - 1)
expect(errno.EINVAL, h.pread, (32 << 20) + 1, 3)
if STRUCTURED:
    expect(errno.EOVERFLOW, h.pread, (32 << 20) + 1, 3, nbd.CMD_FLAG_DF)
h.shutdown()
"#;
    let modes = [
        ("h.set_handshake_flags(0)", "newstyle", "False"),
        ("h.set_request_block_size(False)", "newstyle-fixed", "True"),
    ];
    for (setup, protocol, structured) in modes {
        let f = Fixture::default(SIZE);
        let mut model = pseudo_random(MIB as usize, 11);
        f.backend.write(0, &model, false).unwrap();
        model.resize(SIZE as usize, 0);
        let script = script
            .replace("SETUP", setup)
            .replace("PROTOCOL", &format!("{protocol:?}"))
            .replace("STRUCTURED", structured);
        nbdsh(&f.uri(), &script);
        // The same changes, on the model.
        let data: Vec<u8> = (0..1000u32).map(|i| ((i * 13 + 1) % 256) as u8).collect();
        model[3..1003].copy_from_slice(&data);
        model[511] = 0xaa;
        model[5000..5300].copy_from_slice(&data[..300]);
        model[2000..2007].fill(0);
        model[9000..10_500].fill(0);
        // The memory backend forgets trimmed blocks as zeroes; the server
        // trims only the whole blocks of the range.
        model[20_480..20_992].fill(0);
        let contents = f.backend.contents();
        let differ = (0..model.len()).find(|&i| contents[i] != model[i]);
        assert_eq!(differ, None, "{setup}: the export differs from the model");
        let stats = f.backend.stats();
        assert!(
            stats.fua_writes >= 2 && stats.flushes >= 2,
            "{setup}: {stats:?}"
        );
        assert!(stats.trims == 1 && stats.caches == 1, "{setup}: {stats:?}");
    }
}

/// fio's JSON report. The nbd engine prints "fio: connected to NBD server"
/// on stdout before it, once per connection, so the JSON starts at the first
/// brace.
fn fio_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in fio's output:\n{text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio JSON output: {e}\n{text}"))
}

#[test]
fn fio_several_connections_with_verification() {
    let fio = tool("fio", "fio");
    let f = Fixture::default(64 * MIB);
    // Four jobs, each its own connection and its own 16 MiB region (verify
    // needs disjoint regions), 16 requests in flight each.
    // fio writes verification state files into its working directory; keep
    // them in the temporary directory and do not save them at all.
    let common = |cmd: &mut Command| {
        cmd.current_dir(f.dir.path())
            .arg("--verify_state_save=0")
            .arg("--name=nbd")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={}", f.uri()))
            .arg("--numjobs=4")
            .arg("--size=16M")
            .arg("--offset_increment=16M")
            .arg("--bs=4k")
            .arg("--iodepth=16")
            .arg("--verify=crc32c")
            .arg("--group_reporting")
            .arg("--output-format=json");
    };
    let mut write = Command::new(&fio);
    common(&mut write);
    write.arg("--rw=randwrite").arg("--do_verify=1");
    let out = run_ok(&mut write, Duration::from_secs(40));
    let json = fio_json(&out);
    for job in json["jobs"].as_array().unwrap() {
        assert_eq!(job["error"], 0, "fio job failed: {job}");
        assert!(
            job["write"]["io_bytes"].as_u64().unwrap() >= 64 * MIB,
            "fio wrote too little: {job}"
        );
    }
    // A second run, on new connections, verifies what the first one wrote.
    let mut verify = Command::new(&fio);
    common(&mut verify);
    verify.arg("--rw=randread").arg("--verify_only=1");
    let out = run_ok(&mut verify, Duration::from_secs(40));
    let json = fio_json(&out);
    for job in json["jobs"].as_array().unwrap() {
        assert_eq!(job["error"], 0, "fio verification failed: {job}");
    }
}

#[test]
fn qemu_img_convert_and_compare() {
    let qemu_img = tool("qemu-img", "qemu-utils");
    let options = ServeOptions {
        export_name: "md0".into(),
        ..Default::default()
    };
    let f = Fixture::new(MemoryBackend::new(16 * MIB), options);
    let input = f.file("in.img");
    let mut image = pseudo_random(16 * MIB as usize, 3);
    // A zero range, which qemu-img may write as a zero request.
    image[4 * MIB as usize..6 * MIB as usize].fill(0);
    std::fs::write(&input, &image).unwrap();
    let uri = f.named_uri("md0");
    run_ok(
        Command::new(&qemu_img)
            .args(["convert", "-n", "-W", "-f", "raw", "-O", "raw"])
            .arg(&input)
            .arg(&uri),
        Duration::from_secs(30),
    );
    assert!(
        f.backend.contents() == image,
        "the export differs from the image qemu-img converted in"
    );
    run_ok(
        Command::new(&qemu_img)
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&input)
            .arg(&uri),
        Duration::from_secs(30),
    );
    // compare must notice a difference (exit status 1).
    f.backend.write(9 * MIB, &[0xee; 512], false).unwrap();
    let out = run(
        Command::new(&qemu_img)
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&input)
            .arg(&uri),
        Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "qemu-img compare: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// ---------------------------------------------------------------------------
// Raw protocol: behaviour the tools cannot show.

#[test]
fn export_name_with_and_without_zeroes() {
    let f = Fixture::default(MIB);
    for (client_flags, reply_len) in [(proto::FLAG_C_FIXED_NEWSTYLE, 134), (3, 10)] {
        let mut s = connect(&f.sock);
        greet(&mut s, client_flags);
        send_option(&mut s, proto::OPT_EXPORT_NAME, b"uraid");
        let reply = read_n(&mut s, reply_len);
        assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), MIB);
        let mut c = RawClient {
            s,
            structured: false,
            reads: HashMap::new(),
        };
        c.write(1, 0, &[9u8; 512]);
        assert_eq!(c.read(2, 0, 512), vec![9u8; 512]);
        c.disconnect();
    }
}

/// Which clients may address bytes: those that agreed to no block sizes
/// (old-style, OPT_GO without the request, even after an OPT_INFO that
/// asked, which commits to nothing). One that asked keeps the export's
/// 512-byte minimum, its misaligned requests refused with EINVAL.
#[test]
fn only_clients_without_block_sizes_address_bytes() {
    let f = Fixture::default(MIB);
    let data = pseudo_random(1000, 5);
    let mut byte_clients = vec![
        ("export name", RawClient::export_name(&f.sock)),
        (
            "GO without",
            RawClient::connect_asking(&f.sock, true, vec![]),
        ),
    ];
    let mut informed = connect(&f.sock);
    greet(&mut informed, 3);
    let asking = proto::InfoRequest {
        name: String::new(),
        requests: vec![proto::INFO_BLOCK_SIZE],
    };
    send_option(
        &mut informed,
        proto::OPT_INFO,
        &proto::encode_info_request(&asking),
    );
    assert_eq!(
        option_replies(&mut informed).last().unwrap().0,
        proto::REP_ACK
    );
    let bare = proto::InfoRequest {
        name: String::new(),
        requests: vec![],
    };
    send_option(
        &mut informed,
        proto::OPT_GO,
        &proto::encode_info_request(&bare),
    );
    assert_eq!(
        option_replies(&mut informed).last().unwrap().0,
        proto::REP_ACK
    );
    let informed = RawClient {
        s: informed,
        structured: false,
        reads: HashMap::new(),
    };
    byte_clients.push(("INFO, then GO without", informed));
    for (n, (what, mut c)) in byte_clients.into_iter().enumerate() {
        let offset = 3 + 4096 * n as u64;
        let before = f.backend.contents();
        c.write(1, offset, &data);
        assert_eq!(c.read(2, offset, 1000), data, "{what}");
        let after = f.backend.contents();
        let at = offset as usize;
        assert!(
            after[..at] == before[..at],
            "{what}: bytes before the write changed"
        );
        assert!(
            after[at + 1000..] == before[at + 1000..],
            "{what}: bytes after it changed"
        );
        // A read of no bytes at an odd offset is fine too.
        assert_eq!(c.read(3, offset, 0), Vec::<u8>::new(), "{what}");
        c.disconnect();
    }

    let before = f.backend.contents();
    for structured in [false, true] {
        let mut c = RawClient::connect(&f.sock, structured);
        c.send(proto::CMD_WRITE, 0, 1, 3, 1000, &data);
        assert_eq!(c.reply().error, 22, "a misaligned write was accepted");
        c.send(proto::CMD_READ, 0, 2, 3, 1000, &[]);
        assert_eq!(c.reply().error, 22, "a misaligned read was accepted");
        c.send(proto::CMD_WRITE_ZEROES, 0, 3, 512, 100, &[]);
        assert_eq!(c.reply().error, 22, "a misaligned zero was accepted");
        c.disconnect();
    }
    assert!(
        f.backend.contents() == before,
        "a refused request changed the export"
    );
}

/// A read beyond the maximum payload is EINVAL, except with DF (structured
/// replies only), whose one chunk could not hold it: EOVERFLOW.
#[test]
fn oversized_reads_are_einval_unless_they_ask_for_one_chunk() {
    let f = Fixture::default(64 * MIB);
    let too_long = (32 << 20) + 512;
    for structured in [false, true] {
        let mut c = RawClient::connect(&f.sock, structured);
        c.send(proto::CMD_READ, 0, 1, 0, too_long, &[]);
        assert_eq!(c.reply().error, 22, "structured {structured}");
        if structured {
            c.send(proto::CMD_READ, proto::CMD_FLAG_DF, 2, 0, too_long, &[]);
            assert_eq!(c.reply().error, 75);
            // DF on a read that fits is answered in one chunk.
            c.send(proto::CMD_READ, proto::CMD_FLAG_DF, 3, 0, 32 << 20, &[]);
            let r = c.reply();
            assert_eq!((r.error, r.data.len()), (0, 32 << 20));
        }
        assert_eq!(c.read(4, 0, 512), vec![0u8; 512]);
        c.disconnect();
    }
}

/// Byte-granular clients on several connections change disjoint bytes of
/// the same blocks at once, while a client that agreed to block sizes
/// rewrites a whole one of them: each reads back what it wrote after every
/// write, which a read-modify-write that straddled another change would
/// break. The slow range widens each read-modify-write to milliseconds.
#[test]
fn partial_block_writes_on_several_connections_are_not_lost() {
    let f = Fixture::default(MIB);
    f.backend
        .set_slow_range(Some((0..1024, Duration::from_millis(1))));
    // (offset, length, checked): the last writer's bytes lie in block 1,
    // which the aligned client overwrites whole, so it cannot check them.
    let owners: [(u64, usize, bool); 4] = [
        (3, 10, true),
        (100, 50, true),
        (500, 12, true),
        (512, 18, false),
    ];
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (n, &(offset, len, checked)) in owners.iter().enumerate() {
            let (f, done) = (&f, &done);
            scope.spawn(move || {
                let mut c = if n % 2 == 0 {
                    RawClient::export_name(&f.sock)
                } else {
                    RawClient::connect_asking(&f.sock, true, vec![])
                };
                for round in 0..30u8 {
                    let data = vec![round ^ (n as u8 * 64 + 1); len];
                    c.write(1, offset, &data);
                    let back = c.read(2, offset, len as u32);
                    if checked {
                        assert_eq!(back, data, "writer {n}, round {round}");
                    }
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.disconnect();
            });
        }
        scope.spawn(|| {
            let mut c = RawClient::connect(&f.sock, true);
            let mut round = 0u8;
            while done.load(std::sync::atomic::Ordering::Relaxed) < owners.len() {
                round = round.wrapping_add(1);
                c.write(1, 512, &[round; 512]);
                let back = c.read(2, 512, 512);
                assert!(
                    back[18..].iter().all(|&b| b == round),
                    "aligned writer, round {round}"
                );
            }
            assert!(round > 0, "the aligned writer never wrote");
            c.disconnect();
        });
    });
}

#[test]
fn option_haggling_edge_cases() {
    let f = Fixture::default(MIB);
    let mut s = connect(&f.sock);
    greet(&mut s, 3);
    // Unknown options, TLS and meta contexts are UNSUP; the server keeps
    // parsing the options that follow.
    for option in [
        0,
        4,
        proto::OPT_STARTTLS,
        proto::OPT_SET_META_CONTEXT,
        proto::OPT_EXTENDED_HEADERS,
        0xdead,
    ] {
        send_option(&mut s, option, b"ignored data");
        assert_eq!(
            option_replies(&mut s)[0].0,
            proto::REP_ERR_UNSUP,
            "option {option}"
        );
    }
    // Options that take no data refuse it.
    send_option(&mut s, proto::OPT_LIST, b"x");
    assert_eq!(option_replies(&mut s)[0].0, proto::REP_ERR_INVALID);
    send_option(&mut s, proto::OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(option_replies(&mut s)[0].0, proto::REP_ERR_INVALID);
    // Malformed INFO, unknown export.
    send_option(&mut s, proto::OPT_INFO, &[0, 0, 0, 9, b'a']);
    assert_eq!(option_replies(&mut s)[0].0, proto::REP_ERR_INVALID);
    let unknown = proto::InfoRequest {
        name: "nosuch".into(),
        requests: vec![],
    };
    send_option(&mut s, proto::OPT_GO, &proto::encode_info_request(&unknown));
    assert_eq!(
        option_replies(&mut s),
        vec![(proto::REP_ERR_UNKNOWN, b"no export named 'nosuch'".to_vec())]
    );
    // Oversized option data is skipped without being buffered.
    send_option(&mut s, proto::OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(option_replies(&mut s)[0].0, proto::REP_ERR_TOO_BIG);
    // LIST, then INFO with every item, then ABORT.
    send_option(&mut s, proto::OPT_LIST, &[]);
    let list = option_replies(&mut s);
    assert_eq!(list.len(), 2);
    assert_eq!(
        list[0],
        (proto::REP_SERVER, proto::encode_rep_server("uraid", ""))
    );
    let all = proto::InfoRequest {
        name: "uraid".into(),
        requests: vec![
            proto::INFO_NAME,
            proto::INFO_DESCRIPTION,
            proto::INFO_BLOCK_SIZE,
            999,
        ],
    };
    send_option(&mut s, proto::OPT_INFO, &proto::encode_info_request(&all));
    let infos: Vec<proto::Info> = option_replies(&mut s)
        .into_iter()
        .filter(|(t, _)| *t == proto::REP_INFO)
        .map(|(_, d)| proto::decode_info(&d).unwrap())
        .collect();
    assert!(infos
        .iter()
        .any(|i| matches!(i, proto::Info::Export { size, .. } if *size == MIB)));
    assert!(infos.contains(&proto::Info::Name("uraid".into())));
    assert!(infos
        .iter()
        .any(|i| matches!(i, proto::Info::BlockSize(b) if b.min == 512)));
    send_option(&mut s, proto::OPT_ABORT, &[]);
    assert_eq!(option_replies(&mut s)[0].0, proto::REP_ACK);
    assert_closed(&mut s);
    assert_server_works(&f);
}

#[test]
fn require_block_size_refuses_clients_that_do_not_ask() {
    let options = ServeOptions {
        require_block_size: true,
        ..Default::default()
    };
    let f = Fixture::new(MemoryBackend::new(MIB), options);
    let mut s = connect(&f.sock);
    greet(&mut s, 3);
    let bare = proto::InfoRequest {
        name: String::new(),
        requests: vec![],
    };
    send_option(&mut s, proto::OPT_GO, &proto::encode_info_request(&bare));
    let replies = option_replies(&mut s);
    assert_eq!(replies.last().unwrap().0, proto::REP_ERR_BLOCK_SIZE_REQD);
    // The block sizes were sent first, so the client can retry at once.
    assert!(replies
        .iter()
        .any(|(t, d)| *t == proto::REP_INFO && d[..2] == proto::INFO_BLOCK_SIZE.to_be_bytes()));
    // OPT_EXPORT_NAME cannot negotiate sizes, so it is dropped.
    send_option(&mut s, proto::OPT_EXPORT_NAME, b"");
    assert_closed(&mut s);
    // A client that asks gets in.
    assert_server_works(&f);
}

#[test]
fn invalid_requests_get_errors_and_the_connection_survives() {
    let f = Fixture::default(MIB);
    for structured in [false, true] {
        let mut c = RawClient::connect(&f.sock, structured);
        let cases: [(u16, u16, u64, u32, u32); 7] = [
            (99, 0, 0, 0, 22),                                 // unknown command
            (proto::CMD_BLOCK_STATUS, 0, 0, 512, 22),          // no meta context negotiated
            (proto::CMD_READ, 1 << 12, 0, 512, 22),            // unknown flag
            (proto::CMD_FLUSH, 0, 512, 0, 22),                 // flush with an offset
            (proto::CMD_TRIM, 0, MIB, 512, 22),                // trim past the end
            (proto::CMD_WRITE_ZEROES, 0, MIB - 512, 1024, 28), // zero past the end
            (proto::CMD_CACHE, 0, 1, 512, 22),                 // misaligned
        ];
        for (i, (command, flags, offset, length, errno)) in cases.into_iter().enumerate() {
            c.send(command, flags, 100 + i as u64, offset, length, &[]);
            let r = c.reply();
            assert_eq!(
                (r.cookie, r.error),
                (100 + i as u64, errno),
                "case {i}, structured {structured}"
            );
        }
        // A refused write's payload is skipped, keeping the stream in step.
        c.send(
            proto::CMD_WRITE,
            proto::CMD_FLAG_NO_HOLE,
            200,
            0,
            4096,
            &[0xab; 4096],
        );
        assert_eq!(c.reply().error, 22);
        c.send(proto::CMD_WRITE, 0, 201, MIB, 4096, &[0xab; 4096]);
        assert_eq!(c.reply().error, 28);
        // A zero-length read and write are harmless.
        assert_eq!(c.read(202, 0, 0), Vec::<u8>::new());
        c.write(203, 0, &[]);
        // The connection still works.
        c.write(204, 4096, &[5u8; 512]);
        assert_eq!(c.read(205, 4096, 512), vec![5u8; 512]);
        c.disconnect();
    }
}

#[test]
fn malformed_input_drops_only_that_connection() {
    let f = Fixture::default(MIB);
    // A client that stays connected throughout, to prove other connections
    // are unaffected.
    let mut bystander = RawClient::connect(&f.sock, true);

    // Garbage instead of client flags.
    let mut s = connect(&f.sock);
    read_n(&mut s, proto::GREETING_LEN);
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_closed(&mut s);

    // Unknown client flag.
    let mut s = connect(&f.sock);
    greet(&mut s, 1 << 5);
    assert_closed(&mut s);

    // Bad option magic.
    let mut s = connect(&f.sock);
    greet(&mut s, 3);
    s.write_all(&[0x42; 16]).unwrap();
    assert_closed(&mut s);

    // An option claiming 4 GiB of data.
    let mut s = connect(&f.sock);
    greet(&mut s, 3);
    s.write_all(&proto::encode_option_header(proto::OptionHeader {
        option: proto::OPT_GO,
        length: u32::MAX,
    }))
    .unwrap();
    assert_closed(&mut s);

    // EXPORT_NAME for an export that does not exist.
    let mut s = connect(&f.sock);
    greet(&mut s, 3);
    send_option(&mut s, proto::OPT_EXPORT_NAME, b"nosuch");
    assert_closed(&mut s);

    // Transmission: a request with a bad magic.
    let mut c = RawClient::connect(&f.sock, false);
    c.s.write_all(&[0xff; 28]).unwrap();
    assert_closed(&mut c.s);

    // Random garbage after the handshake.
    let mut c = RawClient::connect(&f.sock, true);
    c.s.write_all(&pseudo_random(5000, 9)).unwrap();
    assert_closed(&mut c.s);

    // A truncated header, then the client goes away.
    let mut c = RawClient::connect(&f.sock, false);
    let header = proto::encode_request_header(&RequestHeader {
        flags: 0,
        command: proto::CMD_READ,
        cookie: 1,
        offset: 0,
        length: 512,
    });
    c.s.write_all(&header[..13]).unwrap();
    drop(c);

    // A write announcing a payload far beyond the maximum: dropped before
    // the server allocates or reads it.
    let mut c = RawClient::connect(&f.sock, false);
    let header = proto::encode_request_header(&RequestHeader {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie: 1,
        offset: 0,
        length: u32::MAX,
    });
    c.s.write_all(&header).unwrap();
    assert_closed(&mut c.s);

    // A client that disconnects in the middle of a write payload.
    let mut c = RawClient::connect(&f.sock, false);
    let header = proto::encode_request_header(&RequestHeader {
        flags: 0,
        command: proto::CMD_WRITE,
        cookie: 1,
        offset: 0,
        length: 65536,
    });
    c.s.write_all(&header).unwrap();
    c.s.write_all(&[0xcc; 1000]).unwrap();
    drop(c);
    // Nothing of the partial write may reach the backend.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(f.backend.stats().writes, 0);

    // A client that disappears with requests in flight and unread replies.
    let mut c = RawClient::connect(&f.sock, true);
    for i in 0..32 {
        c.send(proto::CMD_READ, 0, i, 0, 65536, &[]);
    }
    drop(c);

    // Still serving, on the old connection and on new ones.
    bystander.write(1, 0, &[3u8; 4096]);
    assert_eq!(bystander.read(2, 0, 4096), vec![3u8; 4096]);
    bystander.disconnect();
    assert_server_works(&f);
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    run_ok(
        Command::new(&nbdinfo).arg("--size").arg(f.uri()),
        Duration::from_secs(20),
    );
}

#[test]
fn stalled_clients_are_dropped_after_the_timeouts() {
    let options = ServeOptions {
        handshake_timeout: Some(Duration::from_millis(200)),
        io_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    let f = Fixture::new(MemoryBackend::new(MIB), options);
    // Connects and never negotiates.
    let mut s = connect(&f.sock);
    let start = Instant::now();
    assert_closed(&mut s);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Sends half a request and stalls.
    let mut c = RawClient::connect(&f.sock, false);
    c.s.write_all(&[0x25, 0x60]).unwrap();
    assert_closed(&mut c.s);
    // An idle client in transmission is not a stalled one.
    let mut idle = RawClient::connect(&f.sock, false);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(idle.read(1, 0, 512), vec![0u8; 512]);
    idle.disconnect();
}

#[test]
fn replies_are_concurrent_and_out_of_order() {
    let f = Fixture::default(4 * MIB);
    f.backend
        .set_slow_range(Some((0..MIB, Duration::from_millis(300))));
    let mut c = RawClient::connect(&f.sock, true);
    // A slow read, then a fast one: the fast one is answered first.
    c.send(proto::CMD_READ, 0, 1, 0, 4096, &[]);
    c.send(proto::CMD_READ, 0, 2, 2 * MIB, 4096, &[]);
    assert_eq!(c.reply().cookie, 2);
    assert_eq!(c.reply().cookie, 1);
    // Eight slow requests complete in about the time of one.
    let start = Instant::now();
    for i in 0..8 {
        c.send(proto::CMD_READ, 0, 10 + i, i * 4096, 4096, &[]);
    }
    let mut cookies: Vec<u64> = (0..8).map(|_| c.reply().cookie).collect();
    let elapsed = start.elapsed();
    cookies.sort();
    assert_eq!(cookies, (10..18).collect::<Vec<_>>());
    assert!(
        elapsed < Duration::from_millis(8 * 300 / 2),
        "requests were serialized: {elapsed:?}"
    );
    c.disconnect();
}

#[test]
fn flush_and_fua_reach_the_backend() {
    let f = Fixture::default(MIB);
    let mut c = RawClient::connect(&f.sock, false);
    c.send(
        proto::CMD_WRITE,
        proto::CMD_FLAG_FUA,
        1,
        0,
        512,
        &[1u8; 512],
    );
    assert_eq!(c.reply().error, 0);
    assert_eq!(f.backend.stats().fua_writes, 1);
    c.write(2, 512, &[2u8; 512]);
    c.send(proto::CMD_FLUSH, 0, 3, 0, 0, &[]);
    assert_eq!(c.reply().error, 0);
    assert_eq!(f.backend.stats().flushes, 1);
    // FUA on a trim means a flush after it.
    c.send(proto::CMD_TRIM, proto::CMD_FLAG_FUA, 4, 0, 512, &[]);
    assert_eq!(c.reply().error, 0);
    assert_eq!(f.backend.stats().flushes, 2);
    c.disconnect();
}

#[test]
fn shutdown_answers_in_flight_requests_then_stops() {
    let mut f = Fixture::default(4 * MIB);
    f.backend.write(0, &[7u8; 4096], false).unwrap();
    f.backend
        .set_slow_range(Some((0..4096, Duration::from_millis(400))));
    let mut c = RawClient::connect(&f.sock, false);
    let mut idle = RawClient::connect(&f.sock, true);
    c.send(proto::CMD_READ, 0, 1, 0, 4096, &[]);
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    f.shutdown();
    // shutdown() waited for the slow read...
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "shutdown did not wait: {:?}",
        start.elapsed()
    );
    // ...whose reply was sent before the connection closed.
    let r = c.reply();
    assert_eq!((r.cookie, r.error, r.data), (1, 0, vec![7u8; 4096]));
    assert_closed(&mut c.s);
    assert_closed(&mut idle.s);
    assert!(!f.sock.exists(), "the socket file was left behind");
    assert!(UnixStream::connect(&f.sock).is_err());
}

#[test]
fn unix_socket_is_private_and_not_stolen() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::default(MIB);
    let mode = std::fs::metadata(&f.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // A second server on the same path is refused while the first listens.
    let second = nbd::serve(
        &nbd::Listener::Unix(f.sock.clone()),
        Arc::new(MemoryBackend::new(MIB)),
        ServeOptions::default(),
    );
    assert_eq!(second.err().unwrap().kind(), std::io::ErrorKind::AddrInUse);
    assert_server_works(&f);
}

#[test]
fn many_connections_at_once() {
    let f = Fixture::default(8 * MIB);
    let sock = f.sock.clone();
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut c = RawClient::connect(&sock, t % 2 == 0);
                let data = pseudo_random(65536, t);
                // Pipeline writes, then read everything back.
                for i in 0..8u64 {
                    c.send(
                        proto::CMD_WRITE,
                        0,
                        i,
                        t * 512 * 1024 + i * 65536,
                        65536,
                        &data,
                    );
                }
                for _ in 0..8 {
                    assert_eq!(c.reply().error, 0);
                }
                for i in 0..8u64 {
                    assert_eq!(c.read(100 + i, t * 512 * 1024 + i * 65536, 65536), data);
                }
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
