//! The NBD server over a live engine: reads spliced from members' page
//! cache or served inline by the worker that read them, small reads on the
//! connection's fast path and their fall-back when a member fails them,
//! pipes per request in flight, staged writes served inline or handed off,
//! big writes from the socket to the member files without a copy, a member
//! in memory cut short. These sit above the engine, beside the server.

use crate::array::{assemble, DeviceState};
use crate::engine::tests::*;
use crate::engine::*;
use crate::export::nbd::client as nbd_client;
use crate::export::{BlockBackend, ExtentUse};
use crate::geometry::Level;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Arc;

/// Serves `engine` over NBD as export "t" on a unix socket in `dir`.
fn serve_in(
    dir: &std::path::Path,
    engine: &Arc<Engine>,
) -> (crate::export::nbd::ServerHandle, PathBuf) {
    serve_with_cpus(
        dir,
        engine,
        crate::export::nbd::ServeOptions::default().cpus,
    )
}

/// `serve_in` as if the machine had `cpus` CPUs: whether small reads of
/// members in memory are served inline depends on it (`Conn::reads_handed_off`).
fn serve_with_cpus(
    dir: &std::path::Path,
    engine: &Arc<Engine>,
    cpus: usize,
) -> (crate::export::nbd::ServerHandle, PathBuf) {
    use crate::export::nbd::{serve, Listener, ServeOptions};
    let socket = dir.join("socket");
    let listener: Listener = format!("unix:{}", socket.display()).parse().unwrap();
    // The splice path's tests run their clients here.
    let options = ServeOptions {
        export_name: "t".into(),
        splice_to_local_clients: true,
        cpus,
        ..ServeOptions::default()
    };
    let server = serve(&listener, engine.clone() as Arc<dyn BlockBackend>, options).unwrap();
    (server, socket)
}

/// Reads of 64 KiB and more from buffered members are spliced from the
/// members' page cache to the socket (`BlockBackend::read_extents`): over
/// NBD they must return the written bytes across strips and stripes and
/// at odd sector offsets, and fall back to the copying path, still right,
/// with bytes pending in the stripe cache and with a member missing.
/// Smaller reads of members in memory are served inline by the worker
/// that read them (`BlockBackend::reads_from_memory`), healthy and
/// degraded.
#[test]
fn reads_of_members_in_memory_are_spliced_or_served_inline_over_nbd() {
    use crate::export::nbd::client::NbdSync;
    for (level, layout, disks) in [
        (Level::Raid0, None, 3),
        (Level::Raid5, Some("left-symmetric"), 4),
    ] {
        // Members in memory are opened buffered: their bytes are in the page cache.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let paths = make_array(dir.path(), level, layout, disks, 64);
        let options = EngineOptions {
            accept_data_loss: true,
            ..EngineOptions::default()
        };
        let engine = Engine::start(assemble(&paths, true).unwrap(), options).unwrap();
        // Read-ahead would take some reads (a lone sequential reader) off
        // the splice path, which this test wants to know it is on.
        engine.set_tunable("read_ahead", "0").unwrap();
        // One CPU: no read is handed off for want of a busy CPU, so every
        // small one is served inline however the client's requests arrive.
        let (server, socket) = serve_with_cpus(dir.path(), &engine, 1);
        let mut client = NbdSync::connect(&socket, "t").unwrap();
        let size = engine.size_bytes() as usize;
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut image: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
        for (i, part) in image.chunks(1 << 20).enumerate() {
            client.write_at((i << 20) as u64, part).unwrap();
        }
        assert!(
            engine.read_extents(0, 1 << 20, ExtentUse::Splice).is_some(),
            "{level}: a healthy read is spliced"
        );
        let reads =
            |client: &mut NbdSync, image: &[u8], rng: &mut rand::rngs::StdRng, state: &str| {
                let mut spans = vec![
                    (0, 1 << 20),
                    (512, 64 << 10),
                    (3 * (64 << 10) - 512, 200 << 10),
                ];
                spans.push((size - (1 << 20), 1 << 20));
                // Beyond pipe-max-size (1 MiB): spliced as root, else copied.
                spans.push((4096, 3 << 20));
                for _ in 0..40 {
                    let len = rng.gen_range(128..=2048) * 512;
                    spans.push((rng.gen_range(0..=(size - len) / 512) * 512, len));
                }
                for (at, len) in spans {
                    let mut back = vec![0u8; len];
                    client.read_at(at as u64, &mut back).unwrap();
                    assert!(
                        back == image[at..at + len],
                        "{level} {state}: {len} bytes at {at}"
                    );
                }
            };
        reads(&mut client, &image, &mut rng, "healthy");
        // Small reads of members in memory are served inline, by the
        // worker that read them.
        assert!(engine.reads_from_memory(), "{level}: members in /dev/shm");
        let before = server.inline_reads();
        assert!(pipelined_reads(&socket, &image, &mut rng).is_empty());
        let inline = server.inline_reads() - before;
        assert!(
            inline >= 190,
            "{level}: only {inline} of 200 small reads inline"
        );
        // Their replies are held and sent together before the server
        // waits for the client: a client with one small read at a time
        // must get each reply without sending anything more (a reply held
        // too long would hang it; it is watched from here).
        let lone: Vec<(usize, usize)> = (0..64)
            .map(|_| {
                let len = rng.gen_range(1..=127) * 512;
                (rng.gen_range(0..=(size - len) / 512) * 512, len)
            })
            .collect();
        let (done, finished) = std::sync::mpsc::channel();
        let (socket_, image_) = (socket.clone(), image.clone());
        // Not scoped: a thread stuck in a read must not hold the test up.
        std::thread::spawn(move || {
            let mut client = NbdSync::connect(&socket_, "t").unwrap();
            for (at, len) in lone {
                let mut back = vec![0u8; len];
                client.read_at(at as u64, &mut back).unwrap();
                assert!(back == image_[at..at + len], "{len} bytes at {at}");
            }
            client.disconnect().unwrap();
            done.send(()).unwrap();
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("lone small reads answered in time");
        if level.has_parity() {
            // A write-back write stays in the stripe cache for a while: a
            // read over it must see it, so it is not spliced from the
            // members. (Batches only leave the cache while nobody writes:
            // one still there after the question was there during it.)
            engine.set_tunable("write_policy", "write-back").unwrap();
            let mut busy = 0;
            for k in 0..32 {
                let at = 4096 * (1 + (k * 577 + 5) % ((size - (256 << 10)) / 4096));
                let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
                engine.write(at as u64, &data, false).unwrap();
                image[at..at + 4096].copy_from_slice(&data);
                let spliced = engine
                    .read_extents(at as u64 - 4096, 128 << 10, ExtentUse::Splice)
                    .is_some();
                if cache_has_batches(&engine) {
                    busy += 1;
                    assert!(!spliced, "{level}: spliced over bytes in the stripe cache");
                }
                let mut back = vec![0u8; 128 << 10];
                client.read_at(at as u64 - 4096, &mut back).unwrap();
                assert!(
                    back == image[at - 4096..at - 4096 + (128 << 10)],
                    "{level}: write-back"
                );
            }
            assert!(busy > 0, "{level}: the stripe cache was never found busy");
            engine.set_tunable("write_policy", "write-through").unwrap();
            client.flush().unwrap();
            // Role 1 rebuilt up to stripe `half` only: a read of its strip
            // below is spliced, above it is not (it is reconstructed).
            let half = engine.geometry().stripe_count() / 2;
            let strip_of_1 = |stripe: u64| {
                let map = engine.geometry().stripe(stripe);
                let i = map
                    .data
                    .iter()
                    .position(|d| d.copies[0].member == 1)
                    .unwrap();
                map.array_sector * 512 + i as u64 * map.strip_sectors * 512
            };
            while_rebuilt_below(&engine, 1, half, || {
                assert!(engine
                    .read_extents(strip_of_1(half - 1), 64 << 10, ExtentUse::Splice)
                    .is_some());
                assert!(
                    engine
                        .read_extents(strip_of_1(half), 64 << 10, ExtentUse::Splice)
                        .is_none(),
                    "{level}: spliced from a member not rebuilt there"
                );
            });
            engine.manage_fail(&paths[1]).unwrap();
            assert!(
                engine.read_extents(0, size, ExtentUse::Splice).is_none(),
                "a missing member is not spliced"
            );
            reads(&mut client, &image, &mut rng, "degraded");
            // Rebuilt from parity, still inline.
            let before = server.inline_reads();
            assert!(pipelined_reads(&socket, &image, &mut rng).is_empty());
            assert!(
                server.inline_reads() - before >= 190,
                "{level}: degraded inline"
            );
        }
        client.disconnect().unwrap();
        server.shutdown();
        engine.shutdown().unwrap();
    }
}

/// A lone client that sends one small read at a time has each one served
/// by the worker that read it after it lets go of the reader, not inline,
/// so that the next request can be read on the other CPU
/// (`Conn::reads_handed_off`); with a second connection open on two CPUs
/// they are inline again. Either way the bytes are the array's.
#[test]
fn a_lone_client_at_a_low_depth_has_its_small_reads_handed_off() {
    use crate::export::nbd::client::NbdSync;
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let paths = make_array(dir.path(), Level::Raid0, None, 3, 16);
    let options = EngineOptions {
        accept_data_loss: true,
        ..EngineOptions::default()
    };
    let engine = Engine::start(assemble(&paths, true).unwrap(), options).unwrap();
    assert!(engine.reads_from_memory(), "members in /dev/shm");
    let size = engine.size_bytes() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let image: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
    engine.write(0, &image, false).unwrap();
    let (server, socket) = serve_with_cpus(dir.path(), &engine, 2);
    let lone_reads = |client: &mut NbdSync, rng: &mut rand::rngs::StdRng| {
        for _ in 0..32 {
            let len = rng.gen_range(1..=8) * 4096;
            let at = rng.gen_range(0..=(size - len) / 4096) * 4096;
            let mut back = vec![0u8; len];
            client.read_at(at as u64, &mut back).unwrap();
            assert!(back == image[at..at + len], "{len} bytes at {at}");
        }
    };
    let mut client = NbdSync::connect(&socket, "t").unwrap();
    let before = server.inline_reads();
    lone_reads(&mut client, &mut rng);
    assert_eq!(
        server.inline_reads(),
        before,
        "a lone client's reads inline"
    );
    let other = NbdSync::connect(&socket, "t").unwrap();
    let before = server.inline_reads();
    lone_reads(&mut client, &mut rng);
    assert_eq!(
        server.inline_reads() - before,
        32,
        "with a connection per CPU, small reads inline"
    );
    other.disconnect().unwrap();
    client.disconnect().unwrap();
    server.shutdown();
    engine.shutdown().unwrap();
}

/// Sends 200 reads of 4..64 KiB at random 4 KiB-aligned offsets over one
/// connection at once, then NBD_CMD_DISC: every one must be answered
/// before the server closes, each once. Returns the cookies answered with
/// an error; every other reply must hold `image`'s bytes.
fn pipelined_reads(
    socket: &std::path::Path,
    image: &[u8],
    rng: &mut rand::rngs::StdRng,
) -> Vec<u64> {
    let size = image.len();
    let (mut sender, mut receiver, _) = nbd_client::connect(socket, "t").unwrap();
    let mut spans = Vec::new();
    for cookie in 0..200u64 {
        let len = rng.gen_range(1..=16) * 4096;
        let at = rng.gen_range(0..=(size - len) / 4096) * 4096;
        spans.push((at, len));
        sender.send_read(cookie, at as u64, len as u32).unwrap();
    }
    sender.send_disconnect().unwrap();
    let mut failed = Vec::new();
    let mut seen = vec![false; spans.len()];
    for _ in 0..spans.len() {
        let reply = receiver.recv().unwrap();
        let cookie = reply.cookie as usize;
        assert!(
            !std::mem::replace(&mut seen[cookie], true),
            "answered twice"
        );
        if reply.error != 0 {
            failed.push(reply.cookie);
            continue;
        }
        let (at, len) = spans[cookie];
        let mut back = vec![0u8; len];
        receiver.recv_data(&mut back).unwrap();
        assert!(back == image[at..at + len], "{len} bytes at {at}");
    }
    failed
}

/// Small reads take the NBD server's fast path (`export/nbd/fastpath.rs`):
/// the backend maps them to member files (`ExtentUse::Read`) and the
/// server reads them on its own io_uring, many in flight from one thread.
/// Pipelined reads of every size up to the limit, across strips, must
/// return the written bytes and be counted as fast; `fast_path off` must
/// keep them off it; and when a member is cut short under the array (its
/// reads come back short), each read that hit it must be read again
/// through the engine: rebuilt from redundancy on raid6 and raid10, an
/// I/O error on raid0, never short or wrong bytes. A mirror's reads
/// choose among its copies, and count as in flight until answered.
#[test]
fn small_reads_take_the_fast_path_and_fall_back_when_a_member_fails_them() {
    for (level, layout, disks) in [
        (Level::Raid0, None, 3),
        (Level::Raid6, Some("left-symmetric"), 5),
        (Level::Raid10, Some("n2"), 4),
    ] {
        // On a disk (members in memory are served inline instead).
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let paths = make_array(dir.path(), level, layout, disks, 64);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let (server, socket) = serve_in(dir.path(), &engine);
        let size = engine.size_bytes() as usize;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let image: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
        {
            let mut client = nbd_client::NbdSync::connect(&socket, "t").unwrap();
            for (i, part) in image.chunks(1 << 20).enumerate() {
                client.write_at((i << 20) as u64, part).unwrap();
            }
            client.disconnect().unwrap();
        }
        let before = server.fast_reads();
        assert!(
            pipelined_reads(&socket, &image, &mut rng).is_empty(),
            "{level}: a healthy read failed"
        );
        let fast = server.fast_reads() - before;
        // Read-ahead may take a read that happens to follow another.
        assert!(
            fast >= 190,
            "{level}: only {fast} of 200 reads took the fast path"
        );
        assert!(engine.read_extents(0, 4096, ExtentUse::Read).is_some());
        // Every read handed out was counted back in when it was answered.
        let pending = pending_reads(&engine);
        assert!(
            pending.iter().all(|&p| p == 0),
            "{level}: reads left pending {pending:?}"
        );

        engine.set_tunable("fast_path", "off").unwrap();
        assert!(engine.read_extents(0, 4096, ExtentUse::Read).is_none());
        let before = server.fast_reads();
        assert!(pipelined_reads(&socket, &image, &mut rng).is_empty());
        assert_eq!(
            server.fast_reads(),
            before,
            "{level}: fast path taken while off"
        );
        engine.set_tunable("fast_path", "on").unwrap();

        // The victim loses its data area (a file cut short under the
        // array): its reads come back with nothing. The array is read in
        // order, a strip at a time, so that each read of the victim lies
        // beyond what was written back before it: raid6 and raid10
        // rewrite a strip they rebuilt (md's read-error correction), which
        // extends the file, and a hole left below would read as zeroes,
        // silently, as it would from any disk. A lone reader of a mirror
        // reads the first copy, so there the victim is member 0.
        let victim = if level == Level::Raid10 { 0 } else { 1 };
        let first_copy = |at: usize| {
            let sector = at as u64 / 512;
            let map = engine
                .geometry()
                .stripe(engine.geometry().stripe_of(sector));
            let i = ((sector - map.array_sector) / map.strip_sectors) as usize;
            map.data[i].copies[0].member
        };
        let strip = 64 << 10;
        let on_victim = (0..size)
            .step_by(strip)
            .filter(|&at| first_copy(at) == victim)
            .count();
        assert!(on_victim > 0);
        engine.set_tunable("read_ahead", "0").unwrap();
        let data_offset = data_offset_of(&engine, victim);
        std::fs::File::options()
            .write(true)
            .open(&paths[victim])
            .unwrap()
            .set_len(data_offset)
            .unwrap();
        let mut client = nbd_client::NbdSync::connect(&socket, "t").unwrap();
        let before = server.fast_reads();
        let mut failed = 0;
        for at in (0..size).step_by(strip) {
            let mut back = vec![0u8; strip];
            match client.read_at(at as u64, &mut back) {
                Ok(()) => assert!(back == image[at..at + strip], "{level}: strip at {at}"),
                Err(_) => failed += 1,
            }
        }
        client.disconnect().unwrap();
        let strips = (size / strip) as u64;
        let fast = server.fast_reads() - before;
        if level == Level::Raid0 {
            assert_eq!(failed, on_victim, "{level}: reads of the member cut short");
            // raid0 gives up the member at its first error: one read of it
            // went fast and fell back, the others went to the engine.
            let healthy = strips - on_victim as u64;
            assert!(
                fast > healthy && fast <= strips,
                "{level}: {fast} reads taken fast"
            );
        } else {
            assert_eq!(
                failed, 0,
                "{level}: reads failed with redundancy to serve them"
            );
            // Every read went fast (a mirror's other copy is as good), and
            // those of the victim fell back.
            assert_eq!(fast, strips, "{level}: reads taken fast");
        }
        server.shutdown();
        engine.shutdown().unwrap();
    }
}

/// Sends a round of writes of 64 KiB to 1 MiB over one connection at once
/// (each in a 1 MiB slot of its own, so none overlap, at 512-byte
/// offsets), applies them to `image`, and checks every answer.
/// Gives the writes it sent (offset, length).
fn pipelined_writes(
    socket: &std::path::Path,
    image: &mut [u8],
    rng: &mut rand::rngs::StdRng,
) -> Vec<(usize, usize)> {
    use rand::seq::SliceRandom;
    let (mut sender, mut receiver, _) = nbd_client::connect(socket, "t").unwrap();
    let mut slots: Vec<usize> = (0..image.len() >> 20).collect();
    slots.shuffle(rng);
    let writes: Vec<(usize, Vec<u8>)> = slots
        .iter()
        .take(12)
        .map(|&slot| {
            let len = rng.gen_range(128..=2048) * 512;
            let at = (slot << 20) + rng.gen_range(0..=((1 << 20) - len) / 512) * 512;
            (at, (0..len).map(|_| rng.gen()).collect())
        })
        .collect();
    for (cookie, (at, data)) in writes.iter().enumerate() {
        sender.send_write(cookie as u64, *at as u64, data).unwrap();
    }
    for _ in &writes {
        let reply = receiver.recv().unwrap();
        assert_eq!(reply.error, 0, "write {} failed", reply.cookie);
    }
    sender.send_disconnect().unwrap();
    let spans = writes.iter().map(|(at, data)| (*at, data.len())).collect();
    for (at, data) in writes {
        image[at..at + data.len()].copy_from_slice(&data);
    }
    spans
}

/// Spliced reads and staged writes take their pipes from a pool their
/// connection shares and give them back when answered: a connection that
/// keeps 4 big reads in flight makes about as many pipes, not one for
/// each of its 64 workers (which took turns, and in time each made its
/// own, past the user's pipe quota). The reads must still come back right.
#[test]
fn a_connection_makes_pipes_for_its_requests_in_flight_not_for_each_worker() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let paths = make_array(dir.path(), Level::Raid0, None, 3, 64);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    engine.set_tunable("read_ahead", "0").unwrap();
    let (server, socket) = serve_in(dir.path(), &engine);
    let size = engine.size_bytes() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let image: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
    let mut client = nbd_client::NbdSync::connect(&socket, "t").unwrap();
    for (i, part) in image.chunks(1 << 20).enumerate() {
        client.write_at((i << 20) as u64, part).unwrap();
    }
    client.disconnect().unwrap();
    let before = server.pipes_made();
    let (mut sender, mut receiver, _) = nbd_client::connect(&socket, "t").unwrap();
    const DEPTH: u64 = 4;
    const READS: u64 = 400;
    let len = 256 << 10;
    let span = |cookie: u64| ((cookie as usize * 7919) % (size / len)) * len;
    for cookie in 0..DEPTH {
        sender
            .send_read(cookie, span(cookie) as u64, len as u32)
            .unwrap();
    }
    let mut back = vec![0u8; len];
    for next in DEPTH..READS + DEPTH {
        let reply = receiver.recv().unwrap();
        assert_eq!(reply.error, 0, "read {} failed", reply.cookie);
        receiver.recv_data(&mut back).unwrap();
        let at = span(reply.cookie);
        assert!(back == image[at..at + len], "the read at {at}");
        if next < READS {
            sender
                .send_read(next, span(next) as u64, len as u32)
                .unwrap();
        }
    }
    sender.send_disconnect().unwrap();
    let made = server.pipes_made() - before;
    assert!(made >= 1, "no read was spliced");
    assert!(
        made <= 3 * DEPTH,
        "{made} pipes made for {READS} reads, {DEPTH} in flight"
    );
}

/// A staged write is served by the worker that read it when more
/// connections are busy than there are CPUs (no hand-off to the next
/// worker), and handed off while fewer are (so that a connection's next
/// write is read while the last is stored); either way it lands right, and
/// a connection stops counting as busy when its last request is answered.
/// The server is told of one CPU, so that one other busy connection is
/// enough whatever the machine.
#[test]
fn staged_writes_are_served_inline_when_more_connections_are_busy_than_cpus() {
    use crate::export::nbd::{serve, Listener, ServeOptions};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 64);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let socket = dir.path().join("socket");
    let listener: Listener = format!("unix:{}", socket.display()).parse().unwrap();
    let options = ServeOptions {
        export_name: "t".into(),
        cpus: 1,
        ..ServeOptions::default()
    };
    let server = serve(&listener, engine.clone() as Arc<dyn BlockBackend>, options).unwrap();
    let mut image = vec![0u8; engine.size_bytes() as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let deadline = Instant::now() + Duration::from_secs(60);
    let wait_busy = |busy: usize, what: &str| {
        while server.busy_connections() != busy {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    // Pipelined writes on a connection of their own: how many were staged,
    // and how many staged writes were served inline (counted when chosen,
    // so one the engine then declines counts there only).
    let staged_and_inline = |image: &mut Vec<u8>, rng: &mut rand::rngs::StdRng| {
        let before = (server.staged_writes(), server.inline_writes());
        let _ = pipelined_writes(&socket, image, rng);
        let staged = server.staged_writes() - before.0;
        assert!(staged > 0, "no write was staged");
        (staged, server.inline_writes() - before.1)
    };
    // One connection alone: handed off.
    let (_, inline) = staged_and_inline(&mut image, &mut rng);
    assert_eq!(inline, 0, "alone");
    wait_busy(0, "the lone connection left busy");
    // Another connection holds a write whose payload is late: busy until
    // it comes.
    let (mut sender, mut receiver, _) = nbd_client::connect(&socket, "t").unwrap();
    let at = 1 << 20;
    let data: Vec<u8> = (0..64 << 10).map(|_| rng.gen()).collect();
    sender
        .send_write_header(1, at as u64, data.len() as u32)
        .unwrap();
    sender.send_payload(&data[..4096]).unwrap();
    wait_busy(1, "the late write's connection not busy");
    let (staged, inline) = staged_and_inline(&mut image, &mut rng);
    assert!(inline >= staged, "{inline} of {staged} served inline");
    sender.send_payload(&data[4096..]).unwrap();
    let reply = receiver.recv().unwrap();
    assert_eq!(reply.error, 0, "the late write failed");
    image[at..at + data.len()].copy_from_slice(&data);
    sender.send_disconnect().unwrap();
    reads_back(&socket, &image, "after inline and handed-off writes");
    assert_eq!(check_mismatches(&engine), 0, "parity differs");
    wait_busy(0, "connections left busy");
}

/// Reads the whole array over NBD and compares it with `image`.
fn reads_back(socket: &std::path::Path, image: &[u8], what: &str) {
    let mut client = nbd_client::NbdSync::connect(socket, "t").unwrap();
    for (i, part) in image.chunks(1 << 20).enumerate() {
        let mut back = vec![0u8; part.len()];
        client.read_at((i << 20) as u64, &mut back).unwrap();
        assert!(back == part, "{what}: the MiB at {i}");
    }
    client.disconnect().unwrap();
}

/// Writes of 64 KiB and more to members in memory go from the socket into
/// a pipe and from there into the members, never copied into the process
/// (`BlockBackend::write_staged`): stored in the mapped members' pages,
/// parity computed in place for whole rows of raid6, partial rows copied.
/// Over NBD, many in flight at once, across strips and rows, they must
/// read back as written and leave the redundancy right: healthy, with a
/// member failed, after it is rebuilt, and while a replacement is built
/// (it gets the writes below its copy point). A write longer than a pipe
/// holds is copied, still right.
#[test]
fn big_writes_go_from_the_socket_to_member_files_without_a_copy() {
    for (level, layout, disks, chunk) in [
        (Level::Raid0, None, 3, 64),
        (Level::Linear, None, 2, 0),
        (Level::Raid1, None, 2, 0),
        (Level::Raid10, Some("n2"), 4, 64),
        (Level::Raid6, Some("left-symmetric"), 5, 64),
    ] {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let paths = make_array(dir.path(), level, layout, disks, chunk);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let (server, socket) = serve_in(dir.path(), &engine);
        let mut image = vec![0u8; engine.size_bytes() as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let sent: Vec<(usize, usize)> = (0..3)
            .flat_map(|_| pipelined_writes(&socket, &mut image, &mut rng))
            .collect();
        let staged = server.staged_writes() as usize;
        let staged_rows = staged_rows_of(&engine);
        let (mapped, in_place) = (staged_rows.mapped, staged_rows.parity_in_place);
        assert_eq!(staged_rows.spliced, 0, "{level}: members are mapped");
        if level.has_parity() {
            assert!(
                in_place > 0,
                "{level}: no row had its parity computed in place"
            );
        } else {
            assert!(mapped > 0, "{level}: no row stored in mapped members");
        }
        if level.has_parity() {
            // On raid6, only writes that hold a whole row, and none while
            // the stripe cache gathers another's partial rows.
            let row = 3 * (chunk << 10) as usize;
            let whole = |&&(at, len): &&(usize, usize)| at.div_ceil(row) * row + row <= at + len;
            let expected = sent.iter().filter(whole).count();
            assert!(
                staged > 0 && staged <= expected,
                "{level}: {staged} of {expected} staged"
            );
        } else {
            // All but a write whose socket fragments filled the pipe.
            assert!(
                staged * 10 >= sent.len() * 9,
                "{level}: {staged} of {} staged",
                sent.len()
            );
        }
        // More than a pipe holds unless the process may grow pipes past
        // pipe-max-size: copied or staged, the bytes must land.
        let mut client = nbd_client::NbdSync::connect(&socket, "t").unwrap();
        let big: Vec<u8> = (0..3 << 20).map(|_| rng.gen()).collect();
        client.write_at(4096, &big).unwrap();
        client.disconnect().unwrap();
        image[4096..4096 + big.len()].copy_from_slice(&big);
        reads_back(&socket, &image, &format!("{level} healthy"));
        if level != Level::Raid0 && level != Level::Linear {
            assert_eq!(check_mismatches(&engine), 0, "{level}: copies differ");
            engine.manage_fail(&paths[0]).unwrap();
            let before = server.staged_writes();
            let _ = pipelined_writes(&socket, &mut image, &mut rng);
            assert!(
                server.staged_writes() > before,
                "{level}: degraded writes not staged"
            );
            reads_back(&socket, &image, &format!("{level} degraded"));
            engine.manage_remove(&paths[0]).unwrap();
            engine.manage_add(&paths[0]).unwrap();
            wait_idle(&engine);
            assert!(
                engine.snapshot().missing_roles.is_empty(),
                "{level}: rebuilt"
            );
            assert_eq!(
                check_mismatches(&engine),
                0,
                "{level}: copies differ after the rebuild"
            );
            // A replacement slow enough that the writes land during the copy.
            let new = dir.path().join("new");
            std::fs::File::create(&new)
                .unwrap()
                .set_len(6 << 20)
                .unwrap();
            // Half copied: the writes land on both sides of the copy point.
            engine.set_speed_limits(Some(100), Some(4000));
            engine.manage_replace(&paths[1], &new).unwrap();
            wait_until(&engine, "the replacement half copied", |s| {
                s.sync
                    .as_ref()
                    .is_some_and(|p| p.done_kib * 2 >= p.total_kib)
            });
            let before = server.staged_writes();
            let _ = pipelined_writes(&socket, &mut image, &mut rng);
            assert!(
                engine.snapshot().sync.is_some(),
                "{level}: the copy ended too soon"
            );
            assert!(
                server.staged_writes() > before,
                "{level}: writes during a replace not staged"
            );
            engine.set_speed_limits(None, Some(1_000_000));
            wait_idle(&engine);
            let replaced = state_of(&engine, &paths[1]) == Some(DeviceState::Faulty);
            assert!(
                replaced,
                "{level}: the replaced member is not marked faulty"
            );
            assert_eq!(
                check_mismatches(&engine),
                0,
                "{level}: the replacement differs"
            );
            reads_back(&socket, &image, &format!("{level} replaced"));
        }
        server.shutdown();
        engine.shutdown().unwrap();
    }
}

/// A member in memory is mapped, and its reads and writes are copies
/// through the mapping. When another process cuts its file short, the
/// copies meet a bus error: the member must fail as for an I/O error and
/// the array go on from its redundancy (raid6, raid1), or the reads fail
/// (raid0), never the process. Writes right after the cut come over NBD,
/// so that staged rows (stored into the mappings in place) meet it too.
#[test]
fn a_member_in_memory_cut_short_fails_the_member_not_the_process() {
    for (level, layout, disks, chunk) in [
        (Level::Raid6, Some("left-symmetric"), 5, 64),
        (Level::Raid1, None, 2, 0),
        (Level::Raid0, None, 3, 64),
    ] {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let paths = make_array(dir.path(), level, layout, disks, chunk);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let mut image = hammer(&engine, 2, 200, 11);
        // The whole image once more, so that every unit of every member is
        // written (and read from here on through the mappings).
        engine.write(0, &image, false).unwrap();
        let victim = &paths[1];
        assert!(
            member_of_role(&engine, 1).mapped().is_some(),
            "{level}: a member in memory is mapped"
        );
        std::fs::OpenOptions::new()
            .write(true)
            .open(victim)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let mut back = vec![0u8; image.len()];
        if level == Level::Raid0 {
            let e = engine
                .read(0, &mut back)
                .expect_err("raid0 has no redundancy");
            assert!(!e.to_string().is_empty());
            engine.shutdown().unwrap();
            continue;
        }
        let (server, socket) = serve_in(dir.path(), &engine);
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        // A write is staged only while the stripe cache holds no gathered
        // writes (the hammer's may still be there on a loaded machine) and
        // when it covers a whole row: rounds until one is.
        let before = server.staged_writes();
        for _ in 0..50 {
            pipelined_writes(&socket, &mut image, &mut rng);
            if server.staged_writes() > before {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            server.staged_writes() > before,
            "{level}: no write was staged"
        );
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level}: read back from redundancy");
        assert_eq!(
            state_of(&engine, victim),
            Some(DeviceState::Faulty),
            "{level}: the member cut short is failed"
        );
        // The cut member was not grown back over what was cut.
        assert_eq!(std::fs::metadata(victim).unwrap().len(), 4096);
        // Writes go on, degraded, and read back.
        hammer_onto(&engine, 2, 100, 12, &mut image);
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level}: degraded writes");
        server.shutdown();
        engine.shutdown().unwrap();
    }
}
