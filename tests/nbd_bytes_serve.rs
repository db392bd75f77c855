//! Byte-addressed NBD clients against `uraid serve` on a real array.
//!
//! The engine itself refuses anything but whole member blocks; a client
//! that agreed to no block sizes may still address single bytes, and the
//! server reads, modifies and writes back the partial blocks. Three nbdsh
//! clients at once, each on its own connection with many requests in
//! flight: an old-style one (OPT_EXPORT_NAME), one whose OPT_GO does not ask
//! for the block sizes, both writing disjoint bytes of the same 512-byte
//! blocks, and one that agreed to block sizes writing whole blocks beside
//! them. Afterwards the export, read through NBD and offline, must hold
//! exactly what each wrote, every other byte as the image had it.

mod common;
use common::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Where the writes go: one place every PAGE_STRIDE bytes, an odd stride
/// that lands them at every position within the 64 KiB chunks.
const PAGE_STRIDE: u64 = 69_632 + 4096;
const PAGES: u64 = 160;
const ROUNDS: u64 = 4;

/// A client's writes: its setup call, and the byte ranges it owns within
/// each page (offset from the page's start, length).
struct Writer {
    setup: &'static str,
    protocol: &'static str,
    ranges: &'static [(u64, u64)],
}

const WRITERS: [Writer; 3] = [
    Writer {
        setup: "h.set_handshake_flags(0)",
        protocol: "newstyle",
        // Two ranges in the page's first block, and one astride blocks 1-2.
        ranges: &[(3, 100), (150, 30), (1000, 100)],
    },
    Writer {
        setup: "h.set_request_block_size(False)",
        protocol: "newstyle-fixed",
        // Between the first writer's, in the same blocks; one page-crossing
        // run of whole blocks with partial ends.
        ranges: &[(200, 300), (1100, 1500)],
    },
    Writer {
        setup: "pass",
        protocol: "newstyle-fixed",
        // Whole blocks only, beside the others' partial ones.
        ranges: &[(3072, 1024)],
    },
];

/// The byte `writer` puts at every position of a range in `page` in
/// `round`; the same formula as the script's.
fn fill(writer: u64, round: u64, page: u64) -> u8 {
    ((writer * 31 + round * 7 + page * 3 + 1) % 251) as u8
}

const SCRIPT: &str = r#"
import nbd

h.set_strict_mode(0)
SETUP
h.connect_uri(URI)
assert h.get_protocol() == PROTOCOL, h.get_protocol()
for rnd in range(ROUNDS):
    bufs = []
    for page in range(PAGES):
        for (start, length) in RANGES:
            byte = (WRITER * 31 + rnd * 7 + page * 3 + 1) % 251
            buf = nbd.Buffer.from_bytearray(bytearray([byte]) * length)
            flags = nbd.CMD_FLAG_FUA if page % 5 == 0 else 0
            bufs.append(buf)
            h.aio_pwrite(buf, page * STRIDE + start, flags=flags)
            while h.aio_in_flight() >= 32:
                h.poll(-1)
    # Each round's writes are all answered before the next round's start:
    # two writes of the same bytes in flight at once have no order.
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for page in range(0, PAGES, 7):
        for (start, length) in RANGES:
            byte = (WRITER * 31 + rnd * 7 + page * 3 + 1) % 251
            got = h.pread(length, page * STRIDE + start)
            assert got == bytes([byte]) * length, (rnd, page, start)
h.flush()
h.shutdown()
"#;

#[test]
fn byte_writes_from_three_connections_on_raid5() {
    let dir = scratch("nbd-bytes");
    let options = ["--level", "raid5", "--raid-devices", "5", "--chunk", "64K"];
    let members = create_array(dir.path(), "m", &options, 5, 16 * MIB);
    let members = paths(&members);
    let size = array_bytes(&members);
    assert!(PAGES * PAGE_STRIDE <= size);
    let (img, mut model) = image(dir.path(), "in.img", 17, size);
    let served = serve(dir.path(), &[], &members);
    nbdcopy_in(&img, served.uri());

    std::thread::scope(|scope| {
        for (n, w) in WRITERS.iter().enumerate() {
            let script = SCRIPT
                .replace("SETUP", w.setup)
                .replace("PROTOCOL", &format!("{:?}", w.protocol))
                .replace("WRITER", &n.to_string())
                .replace("ROUNDS", &ROUNDS.to_string())
                .replace("PAGES", &PAGES.to_string())
                .replace("STRIDE", &PAGE_STRIDE.to_string())
                .replace("RANGES", &format!("{:?}", w.ranges));
            let uri = served.uri().to_string();
            scope.spawn(move || nbdsh_script(&uri, &script, Duration::from_secs(240)));
        }
    });

    for (n, w) in WRITERS.iter().enumerate() {
        for page in 0..PAGES {
            for &(start, len) in w.ranges {
                let at = (page * PAGE_STRIDE + start) as usize;
                model[at..at + len as usize].fill(fill(n as u64, ROUNDS - 1, page));
            }
        }
    }
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &model,
        "read through NBD",
    );
    served.stop();
    assert_eq!(examine_states(&members), vec!["clean"; 5]);
    // With every member, and without each one in turn: parity agrees.
    assert_redundancy_consistent(&members, 1, Some(&model), dir.path());
}
