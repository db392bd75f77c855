//! The live engine on image files: concurrent writes of any size and
//! alignment from several threads, healthy and degraded, must read back as
//! written and leave every stripe's redundancy consistent.

use super::*;
use crate::array::{assemble, create, resync, write_array_state, CreateOptions, MemberSpec};
use crate::engine::position::Position;
use crate::export::ExtentUse;
use crate::format::Metadata;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

pub(crate) fn make_array(
    dir: &std::path::Path,
    level: Level,
    layout: Option<&str>,
    disks: u32,
    chunk_kib: u64,
) -> Vec<PathBuf> {
    make_array_of(dir, level, layout, disks, chunk_kib, None, None)
}

/// [`make_array`] using `size_sectors` of each member (create's --size),
/// with an internal bitmap of `bitmap_chunk_bytes` chunks if given.
pub(crate) fn make_array_of(
    dir: &std::path::Path,
    level: Level,
    layout: Option<&str>,
    disks: u32,
    chunk_kib: u64,
    size_sectors: Option<u64>,
    bitmap_chunk_bytes: Option<u64>,
) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..disks)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p).unwrap().set_len(6 << 20).unwrap();
            p
        })
        .collect();
    let options = CreateOptions {
        level,
        raid_disks: disks,
        chunk_bytes: (chunk_kib > 0).then_some(chunk_kib * 1024),
        layout: layout.map(String::from),
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "test".into(),
        size_sectors,
        force: false,
        homehost: None,
        integrity: false,
    };
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    match bitmap_chunk_bytes {
        Some(chunk_bytes) => {
            let bitmap = crate::array::BitmapRequest::Internal {
                chunk_bytes: Some(chunk_bytes),
            };
            crate::array::create_with_bitmap(&specs, &options, bitmap, |_, _| {}).unwrap();
        }
        None => {
            create(&specs, &options, |_, _| {}).unwrap();
        }
    }
    paths
}

/// The seam that tests above the engine (the NBD server's, in
/// export/nbd/tests_engine.rs) look through: what they read of the engine's
/// insides, and the one state they set, named here rather than opened up.
pub(crate) fn cache_has_batches(engine: &Engine) -> bool {
    engine.datapath.cache.has_batches()
}

/// Runs `f` while `role` counts as rebuilt below stripe `below` only, as in
/// the middle of its recovery, then puts the member's entry back.
pub(crate) fn while_rebuilt_below(engine: &Engine, role: usize, below: u64, f: impl FnOnce()) {
    let entry = engine.table().entry(role).unwrap().clone();
    engine.update_table(|t| {
        t.by_role[role] = Some(MemberEntry {
            rebuilt_below: Some(Arc::new(Position::new(below))),
            ..entry.clone()
        })
    });
    f();
    engine.update_table(|t| t.by_role[role] = Some(entry));
}

/// Reads handed out and not yet counted back in, per role.
pub(crate) fn pending_reads(engine: &Engine) -> Vec<u32> {
    engine
        .datapath
        .pending_reads
        .iter()
        .map(|p| p.load(Ordering::Relaxed))
        .collect()
}

pub(crate) fn data_offset_of(engine: &Engine, role: usize) -> u64 {
    engine.table().entry(role).unwrap().slot.data_offset_bytes
}

pub(crate) fn member_of_role(engine: &Engine, role: usize) -> MemberRef {
    engine.table().entry(role).unwrap().slot.member.clone()
}

/// How the staged rows were written so far (see staged::StagedRows).
pub(crate) struct StagedRowCounts {
    pub mapped: u64,
    pub parity_in_place: u64,
    pub spliced: u64,
}

pub(crate) fn staged_rows_of(engine: &Engine) -> StagedRowCounts {
    let rows = &engine.datapath.staged_rows;
    StagedRowCounts {
        mapped: rows.mapped.load(Ordering::Relaxed),
        parity_in_place: rows.parity_in_place.load(Ordering::Relaxed),
        spliced: rows.spliced.load(Ordering::Relaxed),
    }
}

/// Writes random extents from `threads` threads, each in its own interleaved
/// set of 3 KiB slots (so threads share stripes but never bytes), and
/// returns the expected image.
pub(crate) fn hammer(
    engine: &Arc<Engine>,
    threads: usize,
    writes_per_thread: usize,
    seed: u64,
) -> Vec<u8> {
    let mut image = vec![0u8; engine.size_bytes() as usize];
    hammer_onto(engine, threads, writes_per_thread, seed, &mut image);
    image
}

/// [`hammer`], applying the writes to an expected image that already holds
/// earlier writes; they land in the bytes the image covers (the array may
/// grow meanwhile).
pub(crate) fn hammer_onto(
    engine: &Arc<Engine>,
    threads: usize,
    writes_per_thread: usize,
    seed: u64,
    image: &mut [u8],
) {
    let size = image.len();
    let slot = 3 * 1024;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t as u64);
                let mut written = Vec::new();
                for _ in 0..writes_per_thread {
                    let slots = size / slot;
                    let s = rng.gen_range(0..slots / threads) * threads + t;
                    // Odd offsets and lengths inside the slot (sector-aligned, as NBD min block is 512).
                    let start = s * slot + rng.gen_range(0..4) * 512;
                    let len = rng.gen_range(1..=(slot - (start - s * slot)) / 512) * 512;
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    engine.write(start as u64, &data, false).unwrap();
                    written.push((start, data));
                }
                written
            })
        })
        .collect();
    for h in handles {
        for (start, data) in h.join().unwrap() {
            image[start..start + data.len()].copy_from_slice(&data);
        }
    }
}

/// Every stripe's redundancy agrees with its data (also used by the
/// reshape tests).
pub(super) fn check_consistent(paths: &[PathBuf]) {
    let array = assemble(paths, false).unwrap();
    let report = resync(
        &array.geometry,
        &array.slots,
        0..array.geometry.stripe_count(),
        false,
        |_| {},
    )
    .unwrap();
    assert_eq!(report.mismatch_sectors, 0, "redundancy disagrees with data");
}

#[test]
fn concurrent_writes_read_back_and_keep_parity() {
    for (level, layout, disks, chunk) in [
        (Level::Raid5, Some("left-symmetric"), 4, 16),
        (Level::Raid6, Some("left-asymmetric"), 5, 8),
        (Level::Raid6, Some("ddf-N-continue"), 6, 4),
        (Level::Raid4, None, 3, 8),
        (Level::Raid10, Some("f2"), 3, 8),
        (Level::Raid1, None, 3, 0),
        (Level::Raid0, None, 3, 8),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_array(dir.path(), level, layout, disks, chunk);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        assert!(
            !engine.snapshot().sb.is_clean(),
            "a serving array is marked active"
        );
        let image = hammer(&engine, 4, 150, 11);
        let mut back = vec![0u8; image.len()];
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level} {layout:?}: read differs");
        engine.shutdown().unwrap();
        drop(engine);
        check_consistent(&paths);
        let array = assemble(&paths, false).unwrap();
        assert!(array.is_clean(), "an orderly stop marks the array clean");
    }
}

/// Hot parity and whole-row writes: a partial write leaves its window's
/// parity in the cache, a whole-row write replaces the row's parity on the
/// members without storing it, and the next partial write of the same
/// window must not take the first write's parity from the cache (it would
/// write parity that disagrees with the data).
#[test]
fn a_whole_row_write_leaves_no_stale_hot_parity() {
    for (level, disks) in [(Level::Raid5, 4u32), (Level::Raid6, 6)] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_array(dir.path(), level, None, disks, 16);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let row = 16 * 1024 * (disks as usize - level.parity_members());
        let mut image = vec![0u8; engine.size_bytes() as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut write = |at: usize, len: usize| {
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            engine.write(at as u64, &data, false).unwrap();
            image[at..at + len].copy_from_slice(&data);
        };
        for r in 0..8 {
            let base = r * row;
            write(base + 4096, 4096);
            write(base, row);
            write(base + 4096, 4096);
            // Another strip, same window: read-modify-write of P and Q.
            write(base + 16 * 1024 + 4096, 4096);
        }
        let mut back = vec![0u8; image.len()];
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level}: read differs");
        engine.shutdown().unwrap();
        drop(engine);
        check_consistent(&paths);
    }
}

/// A small write that finds no parity hot reads its neighbours' parity
/// too while the cache has room: the next small write in the same 64 KiB
/// of the stripe finds its parity hot, whichever strip it writes. Parity
/// kept that way must stay the members' through later writes of those
/// neighbours, of whole rows, and of strips in between: the array is
/// checked consistent at the end, after random small writes from several
/// threads.
#[test]
fn a_small_write_reads_its_neighbours_parity_for_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    // Eight members: a small write reads less by read-modify-write (three
    // reads) than by reconstruct-write (five).
    let paths = make_array(dir.path(), Level::Raid6, None, 8, 128);
    let engine =
        Arc::new(Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap());
    engine.set_tunable("stripe_cache_size", "32768").unwrap();
    // The initial resync drops the pages of each stripe it passes.
    wait_idle(&engine);
    let strip = 128 * 1024;
    let hits = || engine.cache_report().parity_hits;
    let mut image = vec![0u8; engine.size_bytes() as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut write = |at: usize, len: usize| {
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        engine.write(at as u64, &data, false).unwrap();
        image[at..at + len].copy_from_slice(&data);
    };
    // A first small write misses, and the pages around it come with its
    // parity.
    let row = 6 * strip;
    write(row + 4096, 4096);
    let before = hits();
    // Another strip, another page of the same 64 KiB: its parity is hot.
    write(row + strip + 12 * 4096, 4096);
    // A hit for P and one for Q.
    assert_eq!(hits(), before + 2, "a neighbour's parity was not kept");
    // Past the 64 KiB: not read with the first.
    write(row + 2 * strip + 20 * 4096, 4096);
    assert_eq!(hits(), before + 2, "parity beyond the span was kept");
    // A whole row rewrites the stripe's parity; a small write after it
    // must not take the parity read before it.
    write(row, row);
    write(row + 3 * strip + 5 * 4096, 4096);
    write(row + 5 * strip + 6 * 4096, 4096);
    // A smaller pool lets go of what it held: the rows read with those
    // writes are not hot any more.
    let hot = hits();
    engine.set_tunable("stripe_cache_size", "1024").unwrap();
    write(row + 7 * 4096, 4096);
    assert_eq!(hits(), hot, "parity kept through a smaller stripe cache");
    engine.set_tunable("stripe_cache_size", "32768").unwrap();
    // Then random small writes from four threads, each on its own pages.
    let size = image.len();
    {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let engine = engine.clone();
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(40 + t);
                    let pages = size / 4096;
                    let mut written = Vec::new();
                    for _ in 0..300 {
                        // Each thread its own pages: the image is exact.
                        let page = rng.gen_range(0..pages / 4) * 4 + t as usize;
                        let len = if rng.gen_range(0..8) == 0 {
                            3 * 512
                        } else {
                            4096
                        };
                        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        engine.write((page * 4096) as u64, &data, false).unwrap();
                        written.push((page * 4096, data));
                    }
                    written
                })
            })
            .collect();
        for t in threads {
            for (at, data) in t.join().unwrap() {
                image[at..at + data.len()].copy_from_slice(&data);
            }
        }
    }
    assert!(
        hits() > before + 100,
        "random small writes found parity hot {} times",
        hits() - before
    );
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "read differs");
    engine.shutdown().unwrap();
    drop(engine);
    check_consistent(&paths);
}

#[test]
fn degraded_writes_and_reads_reconstruct() {
    for (level, layout, disks, lose) in [
        (Level::Raid5, "right-asymmetric", 4, vec![2]),
        (Level::Raid6, "left-symmetric", 5, vec![0, 3]),
        (Level::Raid6, "parity-first-6", 5, vec![4]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_array(dir.path(), level, Some(layout), disks, 8);
        let present: Vec<PathBuf> = paths
            .iter()
            .enumerate()
            .filter(|(i, _)| !lose.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        let engine =
            Engine::start(assemble(&present, true).unwrap(), EngineOptions::default()).unwrap();
        let image = hammer(&engine, 3, 120, 23);
        let mut back = vec![0u8; image.len()];
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level} {layout}: degraded read differs");
        engine.shutdown().unwrap();
        drop(engine);
        // The offline reference path must agree with what the engine wrote.
        let array = assemble(&present, false).unwrap();
        let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
        let mut offline = vec![0u8; image.len()];
        io.read_bytes(0, &mut offline).unwrap();
        assert!(
            offline == image,
            "{level} {layout}: offline read of degraded writes differs"
        );
    }
}

#[test]
fn dirty_array_resyncs_in_the_background_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 4);
    // Scribble on a parity area behind the engine's back, then mark the array
    // dirty, as a crash between data and parity writes would leave it.
    {
        let mut array = assemble(&paths, true).unwrap();
        let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
        io.write_bytes(0, &vec![7u8; 1 << 20]).unwrap();
        let slot = array.slots[4].as_ref().unwrap();
        slot.member
            .write_at(&[0xee; 4096], slot.data_offset_bytes)
            .unwrap();
        write_array_state(&mut array, Cleanliness::Dirty).unwrap();
    }
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.snapshot().sync.is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    engine.shutdown().unwrap();
    drop(engine);
    check_consistent(&paths);
    assert!(assemble(&paths, false).unwrap().is_clean());
}

#[test]
fn dirty_degraded_parity_array_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid5, None, 3, 8);
    let mut array = assemble(&paths[..2], true).unwrap();
    write_array_state(&mut array, Cleanliness::Dirty).unwrap();
    drop(array);
    let refused = Engine::start(
        assemble(&paths[..2], true).unwrap(),
        EngineOptions::default(),
    );
    assert!(matches!(refused, Err(EngineError::DirtyDegraded { .. })));
    let forced = Engine::start(
        assemble(&paths[..2], true).unwrap(),
        EngineOptions {
            force: true,
            ..Default::default()
        },
    );
    assert!(forced.is_ok());
}

#[test]
fn members_with_4096_byte_blocks_work_end_to_end() {
    use crate::array::{assemble_members, create_on_members};
    use crate::member::{MemberRef, MemoryMember};
    // Memory members refuse any I/O that is not aligned to their 4 KiB
    // blocks, so this proves every path (superblocks, create's resync,
    // reads, partial writes) issues whole blocks only.
    let members: Vec<MemberRef> = (0..5)
        .map(|i| Arc::new(MemoryMember::new(&format!("4kn{i}"), 8 << 20, 4096)) as MemberRef)
        .collect();
    let named = |ms: &[MemberRef]| -> Vec<(String, MemberRef)> {
        ms.iter()
            .enumerate()
            .map(|(i, m)| (format!("4kn{i}"), m.clone()))
            .collect()
    };
    let options = CreateOptions {
        level: Level::Raid6,
        raid_disks: 5,
        chunk_bytes: Some(16 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "4kn".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    create_on_members(
        named(&members).into_iter().map(Some).collect(),
        &options,
        |_, _| {},
    )
    .unwrap();
    let engine = Engine::start(
        assemble_members(named(&members)).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    assert_eq!(engine.block_sizes().min, 4096);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut image = vec![0u8; engine.size_bytes() as usize];
    for _ in 0..200 {
        let start = rng.gen_range(0..image.len() / 4096 - 8) * 4096;
        let len = rng.gen_range(1..=8) * 4096;
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        engine
            .write(start as u64, &data, rng.gen_bool(0.1))
            .unwrap();
        image[start..start + len].copy_from_slice(&data);
    }
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image);
    engine.shutdown().unwrap();
    drop(engine);
    // Degraded by two, still whole-block I/O and the same bytes.
    let engine = Engine::start(
        assemble_members(named(&members[..3])).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    engine.read(0, &mut back).unwrap();
    assert!(back == image);
}

/// `grow_size` while writers hammer the old region: requests wait at the
/// gate for the swap, nothing is lost, the new region is resynced, and
/// the grown array takes writes everywhere with parity and mirrors
/// consistent, on disk as at the next assembly.
#[test]
fn growing_under_writes_keeps_every_byte() {
    for (level, layout, disks, chunk, bitmap) in [
        (Level::Raid5, Some("left-symmetric"), 4, 16, None),
        (Level::Raid6, Some("right-asymmetric"), 5, 8, None),
        (Level::Raid1, None, 2, 0, None),
        (Level::Raid10, Some("n2"), 3, 8, None),
        // The bitmap is resized and swapped under the writes (its chunk
        // doubling is in tests/grow_size_kernel.rs, on bigger members).
        (Level::Raid6, Some("left-symmetric"), 4, 8, Some(4096)),
        (Level::Raid1, None, 2, 0, Some(4096)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // 2 MiB of each 6 MiB member.
        let paths = make_array_of(dir.path(), level, layout, disks, chunk, Some(4096), bitmap);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let old_bytes = engine.size_bytes();
        let writers = {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut image = vec![0u8; old_bytes as usize];
                hammer_onto(&engine, 4, 1000, 5, &mut image);
                image
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(!writers.is_finished(), "{level}: the grow must meet writes");
        let said = engine.grow_size(None).unwrap();
        assert!(said.contains("resyncing the new region"), "{level}: {said}");
        let image = writers.join().unwrap();
        wait_idle(&engine);
        assert!(engine.size_bytes() > 2 * old_bytes, "{level}");
        let mut back = vec![0u8; engine.size_bytes() as usize];
        engine.read(0, &mut back).unwrap();
        assert!(
            back[..old_bytes as usize] == image[..],
            "{level}: the old region changed"
        );
        assert_eq!(check_mismatches(&engine), 0, "{level}: after the resync");
        hammer_onto(&engine, 4, 200, 6, &mut back);
        let mut again = vec![0u8; back.len()];
        engine.read(0, &mut again).unwrap();
        assert!(
            again == back,
            "{level}: the grown array reads back differently"
        );
        engine.shutdown().unwrap();
        drop(engine);
        check_consistent(&paths);
        let array = assemble(&paths, false).unwrap();
        assert!(array.is_clean(), "{level}");
        assert_eq!(
            array.geometry.array_sectors() * 512,
            again.len() as u64,
            "{level}"
        );
    }
}

/// Runs a check (md's sync_action "check") to its end and returns the
/// sectors it found inconsistent.
pub(crate) fn check_mismatches(engine: &Arc<Engine>) -> u64 {
    engine.start_scrub(false).unwrap();
    wait_idle(engine);
    engine.mismatch_sectors()
}

pub(crate) fn wait_idle(engine: &Arc<Engine>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // Not only no job shown: none ending either (its member marked in sync).
    while !engine.jobs_idle() {
        assert!(
            std::time::Instant::now() < deadline,
            "background job did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn fail_add_and_rebuild_under_io_keeps_every_byte() {
    for (level, layout, disks, fail, chunk) in [
        (Level::Raid6, Some("left-symmetric"), 5, vec![1usize, 3], 8),
        (Level::Raid5, Some("right-symmetric"), 4, vec![2], 8),
        (Level::Raid1, None, 3, vec![0], 0),
        (Level::Raid10, Some("n2"), 4, vec![1], 8),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_array(dir.path(), level, layout, disks, chunk);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let mut image = hammer(&engine, 3, 60, 31);
        for &role in &fail {
            engine.manage_fail(&paths[role]).unwrap();
        }
        assert_eq!(engine.snapshot().missing_roles, fail);
        // Writes while degraded, then spares arrive and rebuild under I/O.
        hammer_onto(&engine, 2, 60, 77, &mut image);
        let spares: Vec<PathBuf> = fail
            .iter()
            .map(|i| {
                let p = dir.path().join(format!("spare{i}"));
                std::fs::File::create(&p).unwrap().set_len(6 << 20).unwrap();
                p
            })
            .collect();
        engine.set_speed_limits(Some(1000), Some(200_000));
        for spare in &spares {
            engine.manage_add(spare).unwrap();
        }
        hammer_onto(&engine, 2, 40, 99, &mut image);
        // The second spare's recovery starts when the first finishes.
        wait_until(&engine, &format!("{level}: every spare active"), |s| {
            s.missing_roles.is_empty()
                && s.sync.is_none()
                && s.events.iter().filter(|e| e.event == "SpareActive").count() == fail.len()
        });
        let mut back = vec![0u8; image.len()];
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{level}: data differs after rebuild");
        let events: Vec<String> = engine
            .snapshot()
            .events
            .iter()
            .map(|e| e.event.clone())
            .collect();
        for name in [
            "Fail",
            "DegradedArray",
            "RebuildStarted",
            "RebuildFinished",
            "SpareActive",
        ] {
            assert!(
                events.iter().any(|e| e == name),
                "{level}: no {name} event in {events:?}"
            );
        }
        // The failed members can go; the array is whole on the spares.
        for &role in &fail {
            engine.manage_remove(&paths[role]).unwrap();
        }
        engine.shutdown().unwrap();
        drop(engine);
        let mut now: Vec<PathBuf> = paths
            .iter()
            .enumerate()
            .filter(|(i, _)| !fail.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        now.extend(spares.clone());
        check_consistent(&now);
        let array = assemble(&now, false).unwrap();
        assert!(array.is_clean() && array.missing_roles().is_empty());
        // Only the rebuilt members, without the survivors' copies, still give the data.
        let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
        let mut offline = vec![0u8; image.len()];
        io.read_bytes(0, &mut offline).unwrap();
        assert!(offline == image);
    }
}

#[test]
fn check_counts_and_repair_fixes_mismatches() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 4);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    hammer(&engine, 2, 50, 3);
    engine.flush_members().unwrap();
    // Corrupt 8 KiB of one member's data area behind the engine's back.
    // (The engine holds the members exclusively, so write to the file directly.)
    let data_offset = assemble(&paths, false).unwrap().slots[2]
        .as_ref()
        .unwrap()
        .data_offset_bytes;
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    file.write_all_at(&[0x5a; 8192], data_offset + 65536)
        .unwrap();
    file.sync_all().unwrap();
    assert_eq!(
        check_mismatches(&engine),
        16,
        "check counts the corrupted sectors, page by page"
    );
    engine.start_scrub(true).unwrap();
    wait_idle(&engine);
    assert_eq!(
        check_mismatches(&engine),
        0,
        "repair rewrote the redundancy"
    );
}

#[test]
fn recovery_is_throttled_by_speed_limit_max() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid1, None, 2, 0);
    let engine = Engine::start(
        assemble(&paths[..1], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    // 2000 KiB/s over a ~6 MiB member: about three seconds, far above the
    // unthrottled time. Whatever the machine's load (which only slows the
    // copy), the progress seen after `elapsed` cannot exceed what the limit
    // allows in that time, plus the extent in flight.
    let limit_kib_per_s = 2000;
    engine.set_speed_limits(Some(100), Some(limit_kib_per_s));
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    let started = std::time::Instant::now();
    engine.manage_add(&spare).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let progress = engine.snapshot().sync;
    let elapsed = started.elapsed().as_secs_f64();
    let allowed_kib = (limit_kib_per_s as f64 * elapsed) as u64 + 256;
    match progress {
        Some(progress) => assert!(
            progress.done_kib <= allowed_kib,
            "recovery ran past its speed limit: {progress:?} after {elapsed:.2} s"
        ),
        None => assert!(
            allowed_kib >= 6 << 10,
            "the recovery finished in {elapsed:.2} s, faster than its limit allows"
        ),
    }
    engine.set_speed_limits(None, Some(1_000_000));
    wait_until(&engine, "the recovery finished", |s| {
        s.missing_roles.is_empty() && s.sync.is_none()
    });
}

/// An array served and written (returns the expected image), and a blank
/// file of a member's size beside it: where replace tests start.
fn written_array_and_blank(
    dir: &std::path::Path,
    level: Level,
    layout: Option<&str>,
    disks: u32,
    chunk_kib: u64,
    seed: u64,
) -> (Vec<PathBuf>, Arc<Engine>, Vec<u8>, PathBuf) {
    let paths = make_array(dir, level, layout, disks, chunk_kib);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let image = hammer(&engine, 2, 60, seed);
    let new = dir.join("new");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    (paths, engine, image, new)
}

/// Starts replacing `old` by `new` at a crawl, and waits until the copy
/// is under way (512 KiB copied).
fn replace_slowly(engine: &Arc<Engine>, old: &std::path::Path, new: &std::path::Path) {
    engine.set_speed_limits(Some(100), Some(1500));
    engine.manage_replace(old, new).unwrap();
    wait_until(engine, "the copy under way", |s| {
        s.sync.as_ref().is_some_and(|p| p.done_kib >= 512)
    });
}

/// The state the engine reports for the device at `path`.
pub(crate) fn state_of(engine: &Engine, path: &std::path::Path) -> Option<DeviceState> {
    let name = path.display().to_string();
    let snapshot = engine.snapshot();
    let device = snapshot.devices.iter().find(|d| d.path == name)?;
    Some(device.state.clone())
}

#[test]
fn replace_copies_a_member_while_it_serves_then_swaps() {
    for (level, layout, disks, chunk) in [
        (Level::Raid6, Some("left-symmetric"), 5, 8),
        (Level::Raid1, None, 2, 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (paths, engine, mut image, new) =
            written_array_and_blank(dir.path(), level, layout, disks, chunk, 41);
        // Slow enough that the writes below land during the copy.
        engine.set_speed_limits(Some(100), Some(4000));
        engine.manage_replace(&paths[1], &new).unwrap();
        assert!(
            engine.snapshot().missing_roles.is_empty(),
            "the old member serves during the copy"
        );
        hammer_onto(&engine, 2, 60, 43, &mut image);
        engine.set_speed_limits(None, Some(1_000_000));
        // The swap happens as the copy ends, just after the job leaves status.
        let old = paths[1].display().to_string();
        wait_until(&engine, "the replaced member marked faulty", |s| {
            s.sync.is_none()
                && s.devices
                    .iter()
                    .any(|d| d.path == old && d.state == DeviceState::Faulty)
        });
        engine.shutdown().unwrap();
        drop(engine);
        // The array without the replaced member is whole and consistent.
        let mut now: Vec<PathBuf> = paths.clone();
        now[1] = new.clone();
        check_consistent(&now);
        let array = assemble(&now, false).unwrap();
        assert!(
            array.missing_roles().is_empty(),
            "{level}: the replacement holds role 1"
        );
        let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
        let mut back = vec![0u8; image.len()];
        io.read_bytes(0, &mut back).unwrap();
        assert!(back == image, "{level}: data differs after replace");
    }
}

/// Waits until `new` holds role 1 with no job running, stops the engine,
/// and checks the array with `new` in role 1: whole, consistent, and
/// reading `image`. Returns its members.
fn replacement_holds_role_1(
    engine: Arc<Engine>,
    paths: &[PathBuf],
    new: &std::path::Path,
    image: &[u8],
    what: &str,
) -> Vec<PathBuf> {
    let name = new.display().to_string();
    wait_until(&engine, "the replacement holds role 1", |s| {
        s.sync.is_none()
            && s.devices
                .iter()
                .any(|d| d.path == name && d.state == DeviceState::Active { role: 1 })
    });
    engine.shutdown().unwrap();
    drop(engine);
    let mut now: Vec<PathBuf> = paths.to_vec();
    now[1] = new.to_path_buf();
    check_consistent(&now);
    let array = assemble(&now, false).unwrap();
    assert!(array.missing_roles().is_empty(), "{what}");
    let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
    let mut back = vec![0u8; image.len()];
    io.read_bytes(0, &mut back).unwrap();
    assert!(back == image, "{what}: data differs");
    now
}

/// A replacement is on disk as md records it (the role of the member it
/// copies, md's replacement flag and its recovery offset on its own
/// superblock), so that a stop in the middle of the copy loses nothing:
/// started again with the member it copies, the copy resumes where it
/// stood; started without it, the replacement is all the role has and is
/// rebuilt on from there (md promotes it the same way).
#[test]
fn a_replacement_stopped_half_way_resumes_at_the_next_start() {
    use crate::format::{MD_FEATURE_RECOVERY_OFFSET, MD_FEATURE_REPLACEMENT};
    for with_original in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (paths, engine, mut image, new) =
            written_array_and_blank(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 8, 51);
        replace_slowly(&engine, &paths[1], &new);
        let new_name = new.display().to_string();
        hammer_onto(&engine, 2, 40, 53, &mut image);
        let state = state_of(&engine, &new);
        assert!(
            matches!(state, Some(DeviceState::Replacement { role: 1, .. })),
            "{state:?}"
        );
        engine.shutdown().unwrap();
        drop(engine);

        let sb = read_superblock_of(&new);
        assert_ne!(
            sb.feature_map & MD_FEATURE_REPLACEMENT,
            0,
            "replacement flag"
        );
        assert_ne!(sb.feature_map & MD_FEATURE_RECOVERY_OFFSET, 0);
        let offset = sb.recovery_offset_sectors;
        assert!(offset > 0 && offset < sb.size_sectors, "offset {offset}");
        assert_eq!(sb.this_role(), crate::format::Role::Active(1));

        let mut given: Vec<PathBuf> = paths.clone();
        if with_original {
            given.push(new.clone());
        } else {
            given[1] = new.clone();
        }
        let array = assemble(&given, true).unwrap();
        let found = array
            .devices
            .iter()
            .find(|d| d.path == new_name)
            .unwrap()
            .state
            .clone();
        if with_original {
            assert_eq!(
                found,
                DeviceState::Replacement {
                    role: 1,
                    recovery_offset_sectors: offset
                }
            );
        } else {
            assert_eq!(
                found,
                DeviceState::Recovering {
                    role: 1,
                    recovery_offset_sectors: offset
                }
            );
        }
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        let resumed = engine.snapshot().events.iter().any(|e| {
            e.event == "RebuildStarted"
                && e.detail.contains("resum")
                && !e.detail.ends_with(" at stripe 0")
                && !e.detail.ends_with(" at 0 sectors")
        });
        assert!(
            resumed,
            "the copy resumed where it stood: {:?}",
            engine.snapshot().events
        );
        hammer_onto(&engine, 2, 40, 57, &mut image);
        let what = format!("with_original {with_original}");
        replacement_holds_role_1(engine, &paths, &new, &image, &what);
        assert_eq!(
            read_superblock_of(&new).feature_map & MD_FEATURE_REPLACEMENT,
            0
        );
    }
}

/// The member being replaced fails during the copy: the replacement takes
/// its role at once as a member rebuilt up to where the copy stood (md's
/// raid5_remove_disk), keeps getting writes there, and the copy goes on as
/// its rebuild to the end. Meanwhile a second replace of the role and a
/// removal of the replacement are refused, as md refuses them.
#[test]
fn a_replacement_takes_the_role_when_its_original_fails_mid_copy() {
    // With the copy running when the original fails, and with the copy
    // stopped ("idle") first: then the rebuild resumes from the table.
    for stopped in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (paths, engine, mut image, new) =
            written_array_and_blank(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 8, 61);
        let other = dir.path().join("other");
        std::fs::File::create(&other)
            .unwrap()
            .set_len(6 << 20)
            .unwrap();
        replace_slowly(&engine, &paths[1], &new);
        if stopped {
            engine.stop_sync().unwrap();
            let refused = engine.manage_replace(&paths[1], &other).unwrap_err();
            assert!(refused.contains("already under way"), "{refused}");
        }
        let refused = engine.manage_remove(&new).unwrap_err();
        assert!(refused.contains("replacement"), "{refused}");

        let original = {
            let name = paths[1].display().to_string();
            let array = engine.array.lock().unwrap();
            let found = array.devices.iter().find(|d| d.path == name).unwrap();
            found.member.clone()
        };
        engine.manage_fail(&paths[1]).unwrap();
        // A late error from a write that was in flight on the original must
        // not fail the replacement that holds the role now.
        engine.fail_member_if(1, Some(&original), "a late write error");
        let now_state = state_of(&engine, &new);
        assert!(
            matches!(now_state, Some(DeviceState::Recovering { role: 1, .. })),
            "{now_state:?}"
        );
        // Written while it is rebuilt on: below the copy it must take them.
        hammer_onto(&engine, 2, 60, 63, &mut image);
        engine.set_speed_limits(None, Some(1_000_000));
        let now =
            replacement_holds_role_1(engine, &paths, &new, &image, &format!("stopped {stopped}"));
        let mut back = vec![0u8; image.len()];
        // Two others missing: role 1's data comes from the replacement.
        let mut without: Vec<PathBuf> = now.clone();
        without.remove(3);
        without.remove(0);
        let array = assemble(&without, false).unwrap();
        let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
        io.read_bytes(0, &mut back).unwrap();
        assert!(
            back == image,
            "stopped {stopped}: data differs read through the replacement"
        );
    }
}

#[test]
fn bitmap_marks_written_regions_and_bounds_the_resync_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let paths = raid5_with_bitmap(dir.path());
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let (dirty, chunks) = engine.bitmap_dirty().expect("the array has a bitmap");
    assert_eq!(dirty, 0, "a clean array starts with clear bits");
    assert!(chunks > 8);
    // One write at the start of the array dirties the first region only.
    engine.write(0, &[7u8; 8192], false).unwrap();
    assert_eq!(engine.bitmap_dirty().unwrap().0, 1);
    // Quiet regions are cleared (after the members are flushed).
    assert_eq!(engine.bitmap_clear_quiet(0).unwrap(), 1);
    assert_eq!(engine.bitmap_dirty().unwrap().0, 0);
    // Dirty the region at 4 MiB of the array, then "crash": no shutdown.
    engine.write(4 << 20, &[9u8; 8192], false).unwrap();
    drop(engine);
    // Break parity in two places behind its back: inside the dirty region
    // (the resync must fix it) and in the first, clean region (a bitmap-
    // bounded resync must leave it, which proves it was skipped).
    let array = assemble(&paths, false).unwrap();
    let geometry = array.geometry.clone();
    let parity_at = |array_byte: u64| {
        let map = geometry.stripe(geometry.stripe_of(array_byte / 512));
        let p = map.p.unwrap();
        (
            p.member,
            array.slots[p.member].as_ref().unwrap().data_offset_bytes + p.member_sector * 512,
        )
    };
    let (dirty_member, dirty_at) = parity_at(4 << 20);
    let (clean_member, clean_at) = parity_at(0);
    drop(array);
    use std::os::unix::fs::FileExt;
    for (member, at) in [(dirty_member, dirty_at), (clean_member, clean_at)] {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[member])
            .unwrap();
        f.write_all_at(&[0xff; 4096], at).unwrap();
    }
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    wait_idle(&engine);
    assert_eq!(
        check_mismatches(&engine),
        8,
        "only the clean region's page is left inconsistent"
    );
    engine.shutdown().unwrap();
}

#[test]
fn scheduled_checks_run_every_period() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid5, None, 3, 8);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    engine.set_check_period(Some(std::time::Duration::from_millis(600)));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let checks = |e: &Arc<Engine>| {
        e.snapshot()
            .events
            .iter()
            .filter(|ev| ev.event == "RebuildFinished" && ev.detail.starts_with("check"))
            .count()
    };
    while checks(&engine) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "two scheduled checks did not run"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    engine.set_check_period(None);
    assert_eq!(engine.mismatch_sectors(), 0);
    engine.shutdown().unwrap();
}

#[test]
fn readd_with_a_bitmap_copies_only_what_changed() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let paths = raid5_with_bitmap(dir.path());
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let mut image = hammer(&engine, 2, 40, 5);
    engine.bitmap_clear_quiet(0).unwrap();
    // Member 2 goes away; one region is written while it is gone.
    engine.manage_fail(&paths[2]).unwrap();
    engine.manage_remove(&paths[2]).unwrap();
    let data = vec![0x42u8; 64 << 10];
    engine.write(6 << 20, &data, false).unwrap();
    image[6 << 20..(6 << 20) + data.len()].copy_from_slice(&data);
    // Scribble on the absent member's parity (left-symmetric, 4 members:
    // stripe 1 keeps P on member 2) in a region nobody wrote meanwhile: a
    // bitmap-guided re-add must not copy there, so a check will see it.
    let data_offset = read_superblock_of(&paths[2]).data_offset_sectors * 512;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap()
        .write_all_at(&[0xee; 4096], data_offset + (64 << 10))
        .unwrap();
    engine.manage_add(&paths[2]).unwrap();
    assert!(
        engine.snapshot().events.iter().any(|e| e.event == "ReAdd"),
        "the member came back as a re-add"
    );
    wait_until(&engine, "the re-added member in sync", |s| {
        s.missing_roles.is_empty() && s.sync.is_none()
    });
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "data differs after the re-add");
    assert_eq!(
        check_mismatches(&engine),
        8,
        "only the scribbled, never-rewritten page disagrees: nothing else was copied or lost"
    );
    engine.shutdown().unwrap();
}

/// A file removed from the array may still be held a moment by work that
/// took the member table before the removal; adding it back at once waits
/// for that work to let go instead of refusing the file as in use.
#[test]
fn a_file_removed_and_added_at_once_waits_for_work_that_still_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = raid5_with_bitmap(dir.path());
    let assembled = assemble(&paths, true).unwrap();
    let held = assembled
        .devices
        .iter()
        .find(|d| Engine::same_device(&d.path, &paths[2]))
        .unwrap()
        .member
        .clone();
    let engine = Engine::start(assembled, EngineOptions::default()).unwrap();
    engine.manage_fail(&paths[2]).unwrap();
    engine.manage_remove(&paths[2]).unwrap();
    let began = std::time::Instant::now();
    let work = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    engine.manage_add(&paths[2]).unwrap();
    assert!(began.elapsed() >= std::time::Duration::from_millis(250));
    work.join().unwrap();
    wait_until(&engine, "the member back in sync", |s| {
        s.missing_roles.is_empty() && s.sync.is_none()
    });
    engine.shutdown().unwrap();
}

fn read_superblock_of(path: &std::path::Path) -> crate::format::MemberSuper {
    let member = crate::member::FileMember::open(path, Default::default()).unwrap();
    crate::array::read_superblock(&member).unwrap().unwrap()
}

/// A 4-member raid5 (64K chunks) on 8 MiB files with an internal bitmap of
/// 256 KiB chunks, small enough that a few writes dirty distinct regions.
fn raid5_with_bitmap(dir: &std::path::Path) -> Vec<PathBuf> {
    use crate::array::{create_with_bitmap, BitmapRequest};
    let paths: Vec<PathBuf> = (0..4)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
            p
        })
        .collect();
    let options = CreateOptions {
        level: Level::Raid5,
        raid_disks: 4,
        chunk_bytes: Some(64 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "bm".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    let bitmap = BitmapRequest::Internal {
        chunk_bytes: Some(256 << 10),
    };
    create_with_bitmap(&specs, &options, bitmap, |_, _| {}).unwrap();
    paths
}

/// Waits (at most a minute) until `done` holds: tests wait for what they
/// need, never for a fixed time, so that a loaded machine only slows them.
pub(crate) fn wait_until(engine: &Arc<Engine>, what: &str, done: impl Fn(&Snapshot) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let snapshot = engine.snapshot();
        if done(&snapshot) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not reached within a minute; events: {:?}",
            snapshot
                .events
                .iter()
                .map(|e| format!("{} {} {}", e.event, e.device, e.detail))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub(crate) fn has_event(snapshot: &Snapshot, event: &str) -> bool {
    snapshot.events.iter().any(|e| e.event == event)
}

/// An array on in-memory members behind fault injectors: `disks` members,
/// then `spares` spares; 4 MiB each, 8 KiB chunks.
pub(crate) fn faulty_array(
    level: Level,
    disks: usize,
    spares: usize,
) -> (Assembled, Vec<Arc<crate::member::FaultyMember>>) {
    use crate::member::{FaultyMember, MemberRef, MemoryMember};
    let wrappers: Vec<Arc<FaultyMember>> = (0..disks + spares)
        .map(|i| {
            let inner: MemberRef = Arc::new(MemoryMember::new(&format!("m{i}"), 4 << 20, 512));
            Arc::new(FaultyMember::with_seed(inner, i as u64))
        })
        .collect();
    let options = CreateOptions {
        level,
        raid_disks: disks as u32,
        chunk_bytes: (level != Level::Raid1).then_some(8 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "faulty".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    let members = wrappers
        .iter()
        .enumerate()
        .map(|(i, w)| Some((format!("m{i}"), w.clone() as MemberRef)))
        .collect();
    let array = crate::array::create_on_members(members, &options, |_, _| {}).unwrap();
    (array, wrappers)
}

fn reassemble(wrappers: &[Arc<crate::member::FaultyMember>]) -> Assembled {
    let members = wrappers
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("m{i}"), w.clone() as crate::member::MemberRef))
        .collect();
    crate::array::assemble_members(members).unwrap()
}

/// Drops the engine as a crash would (no shutdown) and waits until its
/// background threads have let go of it.
/// Assembles `paths` again after `crash`: the engine's last reference may
/// have gone in one of its own threads, which may still be closing the
/// member files when `crash` sees no reference left, and a file still
/// open there is still claimed (flock) for a moment.
pub(crate) fn assemble_after_crash(paths: &[PathBuf]) -> Assembled {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match assemble(paths, true) {
            Err(e) if e.to_string().contains("in use") && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            other => return other.unwrap(),
        }
    }
}

pub(crate) fn crash(engine: Arc<Engine>) {
    let weak = Arc::downgrade(&engine);
    drop(engine);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while weak.strong_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the engine outlives its drop"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Reads of a mirror go to the copy whose member has the fewest reads in
/// flight: concurrent random reads spread over every copy, a lone reader
/// stays on one member, and a missing copy is never chosen.
#[test]
fn mirror_reads_spread_over_the_copies_and_a_lone_reader_stays_on_one() {
    for (level, disks) in [(Level::Raid1, 2), (Level::Raid10, 4)] {
        let (array, wrappers) = faulty_array(level, disks, 0);
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        // No read-ahead or read cache: every read goes to a member.
        engine.set_tunable("read_ahead", "0").unwrap();
        let image = hammer(&engine, 2, 40, 3);
        let reads = || -> Vec<u64> { wrappers.iter().map(|w| w.counters().reads).collect() };
        let size = engine.size_bytes();
        // Reads that take a while, so that concurrent ones overlap.
        for w in &wrappers {
            w.apply_str("latency:2ms").unwrap();
        }
        let check = |at: u64, buf: &[u8]| {
            assert!(
                buf == &image[at as usize..at as usize + buf.len()],
                "{level}: bytes at {at}"
            );
        };

        let before = reads();
        let mut buf = vec![0u8; 4096];
        for k in 0..20u64 {
            let at = k * 4096;
            engine.read(at, &mut buf).unwrap();
            check(at, &buf);
        }
        let lone: Vec<u64> = reads().iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(lone.iter().sum::<u64>(), 20, "{level}: {lone:?}");
        // raid1's two copies of everything, or raid10 near-2's pairs of
        // members that hold the same chunks: one of each pair serves it.
        for pair in lone.chunks(2) {
            assert!(pair.contains(&0), "{level}: a lone reader moved: {lone:?}");
        }

        let before = reads();
        std::thread::scope(|scope| {
            for t in 0..8u64 {
                let (engine, check) = (&engine, &check);
                scope.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let mut buf = vec![0u8; 4096];
                    for _ in 0..25 {
                        let at = rng.gen_range(0..size / 4096) * 4096;
                        engine.read(at, &mut buf).unwrap();
                        check(at, &buf);
                    }
                });
            }
        });
        let spread: Vec<u64> = reads().iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(spread.iter().sum::<u64>(), 200, "{level}: {spread:?}");
        // Each pair shares the reads of what it holds.
        for pair in spread.chunks(2) {
            let (low, total) = (pair[0].min(pair[1]), pair[0] + pair[1]);
            assert!(
                low * 4 >= total,
                "{level}: reads not spread over copies: {spread:?}"
            );
        }

        // With member 0 gone, its partner serves everything.
        wrappers[0].pull();
        engine.fail_member(0, "pulled by the test");
        let before = reads();
        for k in 0..20u64 {
            let at = k * 8192;
            engine.read(at, &mut buf).unwrap();
            check(at, &buf);
        }
        assert_eq!(reads()[0], before[0], "{level}: a missing copy was read");
        engine.shutdown().unwrap();
    }
}

/// After an unclean stop a mirror's copies may differ until the resync has
/// run, so reads keep to the first copy until it has (md's read_balance):
/// otherwise two reads of one block could see different bytes.
#[test]
fn mirror_reads_stay_on_the_first_copy_until_a_resync_makes_the_copies_agree() {
    let (array, wrappers) = faulty_array(Level::Raid1, 2, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    let map = engine.geometry().stripe(0);
    let copies = &map.data[0].copies;
    // Member 0 busier: a balanced choice is the second copy.
    engine.datapath.pending_reads[0].store(100, Ordering::Relaxed);
    assert_eq!(engine.pick_copy(copies, |_| true).unwrap().member, 1);
    engine.datapath.pending_reads[0].store(0, Ordering::Relaxed);
    hammer(&engine, 2, 20, 7);

    crash(engine);
    // A slow resync, so that it is still running when looked at.
    for w in &wrappers {
        w.apply_str("latency:2ms").unwrap();
    }
    let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
    assert!(
        engine.snapshot().sync.is_some(),
        "no resync after an unclean stop"
    );
    engine.datapath.pending_reads[0].store(100, Ordering::Relaxed);
    assert_eq!(
        engine.pick_copy(copies, |_| true).unwrap().member,
        0,
        "balanced over copies that a resync has not made agree"
    );
    wait_idle(&engine);
    assert_eq!(engine.pick_copy(copies, |_| true).unwrap().member, 1);
    engine.datapath.pending_reads[0].store(0, Ordering::Relaxed);
    engine.shutdown().unwrap();
}

/// A raid5 of 4 in memory, written (returns the expected image), whose
/// member 1 then fails reads of its first 64 KiB of data; `remap` is ""
/// (a rewrite fixes them) or ":noremap" (they stay bad).
pub(crate) fn raid5_with_a_bad_start_on_member_1(seed: u64, remap: &str) -> (Arc<Engine>, Vec<u8>) {
    let (array, wrappers) = faulty_array(Level::Raid5, 4, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    let image = hammer(&engine, 2, 40, seed);
    let data_offset = engine.array.lock().unwrap().devices[1]
        .sb
        .data_offset_sectors
        * 512;
    wrappers[1]
        .apply(
            &format!("eio:read:{data_offset}+64K{remap}")
                .parse()
                .unwrap(),
        )
        .unwrap();
    (engine, image)
}

#[test]
fn a_bad_sector_that_stays_bad_is_served_from_redundancy_and_fails_the_member() {
    // Reads of member 1's first data fail, and rewriting does not help.
    let (engine, image) = raid5_with_a_bad_start_on_member_1(11, ":noremap");
    let mut back = vec![0u8; image.len()];
    engine
        .read(0, &mut back)
        .expect("the data comes from redundancy");
    assert!(back == image);
    let snapshot = engine.snapshot();
    assert_eq!(
        snapshot.missing_roles,
        vec![1],
        "the member that stays bad is failed"
    );
    assert!(has_event(&snapshot, "Fail"));
    engine.shutdown().unwrap();
}

/// The member being replaced fails a read during the copy: the copy
/// corrects it from redundancy, as any read error is corrected (md does
/// the same on a replace), and goes on; the replacement is not blamed.
#[test]
fn a_read_error_on_the_member_being_replaced_is_corrected_and_the_copy_goes_on() {
    // Remappable: rewriting the sectors makes them readable again.
    let (engine, image) = raid5_with_a_bad_start_on_member_1(17, "");
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("new");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    engine
        .manage_replace(std::path::Path::new("m1"), &new)
        .unwrap();
    let name = new.display().to_string();
    wait_until(&engine, "the replacement holds role 1", |s| {
        s.sync.is_none()
            && s.devices
                .iter()
                .any(|d| d.path == name && d.state == DeviceState::Active { role: 1 })
    });
    let snapshot = engine.snapshot();
    assert!(
        has_event(&snapshot, "CorrectedRead"),
        "{:?}",
        snapshot.events
    );
    assert!(
        !has_event(&snapshot, "ReplaceFailed"),
        "{:?}",
        snapshot.events
    );
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image);
    engine.shutdown().unwrap();
}

#[test]
fn a_member_whose_superblock_write_fails_is_failed_and_the_others_still_written() {
    let (array, wrappers) = faulty_array(Level::Raid6, 5, 0);
    let super_offset = array.devices[0].sb.super_offset_sectors * 512;
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    let image = hammer(&engine, 2, 40, 12);
    // Member 0 can no longer write its superblock (its data area is fine).
    wrappers[0]
        .apply(&format!("eio:write:{super_offset}+4K").parse().unwrap())
        .unwrap();
    engine.manage_fail(std::path::Path::new("m3")).unwrap();
    let snapshot = engine.snapshot();
    assert_eq!(snapshot.missing_roles, vec![0, 3]);
    engine.shutdown().expect("raid6 survives two lost members");
    drop(engine);
    // The members that could be written say so: both lost roles are faulty.
    let array = reassemble(&wrappers);
    assert_eq!(array.missing_roles(), vec![0, 3]);
    assert!(array.is_clean());
    let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
    let mut back = vec![0u8; image.len()];
    io.read_bytes(0, &mut back).unwrap();
    assert!(back == image);
}

#[test]
fn shutdown_starts_no_rebuild_when_a_flush_fails() {
    let (array, wrappers) = faulty_array(Level::Raid5, 4, 1);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    hammer(&engine, 2, 20, 13);
    wrappers[2].apply(&"pull".parse().unwrap()).unwrap();
    engine.shutdown().expect("raid5 survives one lost member");
    let snapshot = engine.snapshot();
    assert!(snapshot.sync.is_none(), "a job runs after shutdown");
    assert!(
        !has_event(&snapshot, "RebuildStarted"),
        "shutdown started a rebuild"
    );
    drop(engine);
    wrappers[2].apply(&"restore".parse().unwrap()).unwrap();
    let array = reassemble(&wrappers);
    assert!(array.is_clean());
    assert_eq!(array.missing_roles(), vec![2]);
    assert_eq!(array.devices[4].state, DeviceState::Spare);
}

#[test]
fn a_failure_during_a_check_interrupts_it_and_the_spare_takes_over() {
    let (array, _wrappers) = faulty_array(Level::Raid5, 4, 1);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    hammer(&engine, 2, 20, 14);
    // A check slow enough to be running when the member fails.
    engine.set_speed_limits(Some(1), Some(50));
    engine.start_scrub(false).unwrap();
    engine.manage_fail(std::path::Path::new("m1")).unwrap();
    engine.set_speed_limits(None, Some(1_000_000));
    wait_until(&engine, "the spare rebuilt", |s| {
        s.missing_roles.is_empty() && has_event(s, "SpareActive")
    });
    assert!(has_event(&engine.snapshot(), "SyncStopped"));
    engine.shutdown().unwrap();
}

#[test]
fn a_spare_added_during_a_check_interrupts_it_and_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid5, None, 4, 8);
    let engine = Engine::start(
        assemble(&paths[..3], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    engine.set_speed_limits(Some(1), Some(500));
    engine.start_scrub(false).unwrap();
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    engine.manage_add(&spare).unwrap();
    // As md does, a check gives way to the recovery that restores the
    // array's redundancy: the check is stopped and said to be.
    assert_eq!(
        engine.snapshot().sync.map(|p| p.action),
        Some(SyncAction::Recovery { role: 3 })
    );
    assert!(has_event(&engine.snapshot(), "SyncStopped"));
    engine.set_speed_limits(None, Some(1_000_000));
    wait_until(&engine, "the spare rebuilt", |s| {
        s.missing_roles.is_empty() && has_event(s, "SpareActive")
    });
    engine.shutdown().unwrap();
}

#[test]
fn a_half_rebuilt_member_takes_writes_during_the_resync_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid1, None, 2, 0);
    let engine = Engine::start(
        assemble(&paths[..1], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    let mut image = hammer(&engine, 2, 30, 15);
    engine.set_speed_limits(Some(1), Some(1000));
    engine.manage_add(&paths[1]).unwrap();
    // The recovery checkpoints its offset at 20 %; then the power fails.
    wait_until(&engine, "the recovery at 20 %", |s| {
        has_event(s, "Rebuild20")
    });
    crash(engine);
    let array = assemble_after_crash(&paths);
    let offset = match array.devices[1].state {
        DeviceState::Recovering {
            recovery_offset_sectors,
            ..
        } => recovery_offset_sectors,
        ref other => panic!("the new member is {other:?}, not recovering"),
    };
    assert!(offset > 0 && !array.is_clean());
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    // During the resync the member is in the array below its offset...
    let below = engine.geometry().stripe_at_resync_position(offset);
    let table = engine.table();
    let entry = table
        .entry(1)
        .expect("the half-rebuilt member is in the table");
    assert!(entry
        .rebuilt_below
        .as_ref()
        .is_some_and(|b| b.load(Ordering::SeqCst) >= below));
    // ...so a write there reaches it, and the resumed recovery keeps it.
    let data = vec![0x6bu8; 64 << 10];
    engine.write(0, &data, false).unwrap();
    image[..data.len()].copy_from_slice(&data);
    engine.set_speed_limits(None, Some(1_000_000));
    wait_until(&engine, "the recovery resumed and finished", |s| {
        s.missing_roles.is_empty() && has_event(s, "SpareActive") && s.sync.is_none()
    });
    engine.shutdown().unwrap();
    drop(engine);
    // The rebuilt member alone holds every byte.
    let array = assemble(&paths[1..], false).unwrap();
    let io = crate::array::StripeIo::new(&array.geometry, &array.slots);
    let mut back = vec![0u8; image.len()];
    io.read_bytes(0, &mut back).unwrap();
    assert!(back == image, "the rebuilt member misses writes");
}

/// A recovery job that has built its member to the end clears its action
/// before its thread runs its end (resync::run): a resume in between (a
/// member failing or a spare added meanwhile) goes on from where the member
/// is built, not from the superblock's checkpoint (0 for raid10). Moved back
/// to it, the position let a write skip the member, and the late end then
/// declared the member in sync without that write.
#[test]
fn a_resume_racing_the_end_of_a_finished_recovery_loses_no_write() {
    use super::jobs::job::Outcome;
    let (array, _wrappers) = faulty_array(Level::Raid10, 4, 1);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    hammer(&engine, 2, 20, 16);
    // Foreground I/O all along holds the recovery in its throttle once it
    // has written its one batch (a member's share fits in one), with the
    // member built to the end and the job not yet at its end.
    engine.set_speed_limits(Some(1), None);
    let pumping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let pump = {
        let (engine, pumping) = (engine.clone(), pumping.clone());
        std::thread::spawn(move || {
            while pumping.load(Ordering::SeqCst) {
                engine
                    .datapath
                    .foreground_ios
                    .fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    engine.manage_fail(std::path::Path::new("m1")).unwrap();
    let next = (engine.table().entry(1))
        .and_then(|e| e.rebuilt_below.clone())
        .expect("role 1 is being rebuilt");
    let count = engine.sync.stripe_count();
    wait_until(&engine, "the recovery built to the end", |_| {
        next.load(Ordering::SeqCst) == count
    });
    // Stopped there, it stands as a finished job does between the two.
    engine.stop_sync().unwrap();
    pumping.store(false, Ordering::SeqCst);
    pump.join().unwrap();
    assert_eq!(engine.sync.action(), None);
    assert!(matches!(
        state_of(&engine, std::path::Path::new("m4")),
        Some(DeviceState::Recovering { role: 1, .. })
    ));
    // A job that went back would wait for stripe 0's lock: the write below
    // comes before it could copy anything.
    let stripe_0 = engine
        .datapath
        .locks
        .lock_slot(engine.datapath.locks.slot(0));
    engine.start_recovery_if_possible();
    // A strip with a copy on role 1, in the last stripes (far from where
    // a job that went back stands), and not under stripe 0's lock.
    let (map, index, place) = (1..count)
        .rev()
        .map(|s| engine.geometry().stripe(s))
        .filter(|m| engine.datapath.locks.slot(m.stripe) != engine.datapath.locks.slot(0))
        .find_map(|m| {
            let (i, c) = (m.data.iter().enumerate())
                .find_map(|(i, d)| d.copies.iter().find(|c| c.member == 1).map(|c| (i, *c)))?;
            Some((m, i, c))
        })
        .expect("a strip with a copy on role 1");
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    let data = vec![0xa7u8; strip_bytes];
    let at = (map.array_sector + index as u64 * map.strip_sectors) * SECTOR_BYTES;
    engine.write(at, &data, false).unwrap();
    // The end of the first job, late.
    engine.sync_ended(
        SyncAction::Recovery { role: 1 },
        Outcome::Finished {
            mismatch_sectors: 0,
        },
        &next,
    );
    drop(stripe_0);
    wait_idle(&engine);
    assert!(matches!(
        state_of(&engine, std::path::Path::new("m4")),
        Some(DeviceState::Active { role: 1 })
    ));
    let slot = engine.table().entry(1).unwrap().slot.clone();
    let mut back = vec![0u8; strip_bytes];
    slot.member
        .read_at(
            &mut back,
            slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
        )
        .unwrap();
    assert!(back == data, "the member rebuilt in role 1 misses a write");
    engine.shutdown().unwrap();
}

#[test]
fn raid6_check_with_a_data_member_missing_still_checks_q() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 8);
    let missing = 4;
    let engine = Engine::start(
        assemble(&paths[..missing], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    hammer(&engine, 2, 40, 16);
    engine.flush_members().unwrap();
    // A stripe where the missing member holds data: its Q is corrupted.
    let map = (0..engine.geometry().stripe_count())
        .map(|s| engine.geometry().stripe(s))
        .find(|m| m.data.iter().any(|d| d.copies[0].member == missing))
        .unwrap();
    let q = map.q.unwrap();
    let data_offset = engine
        .table()
        .entry(q.member)
        .unwrap()
        .slot
        .data_offset_bytes;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[q.member])
        .unwrap();
    file.write_all_at(&[0xa5; 4096], data_offset + q.member_sector * 512)
        .unwrap();
    file.sync_all().unwrap();
    assert_eq!(
        check_mismatches(&engine),
        8,
        "Q is checked against the strip rebuilt from P"
    );
    engine.start_scrub(true).unwrap();
    wait_idle(&engine);
    assert_eq!(check_mismatches(&engine), 0, "repair rewrote Q");
    engine.shutdown().unwrap();
}

#[test]
fn stripe_workers_batch_rows_of_many_writers_and_survive_a_live_thread_count_change() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 6, 4);
    let options = EngineOptions {
        tuning: Some(tuning::TuningValues {
            group_thread_cnt: 1,
            ..tuning::TuningValues::defaults(4 * 8 * 2)
        }),
        ..EngineOptions::default()
    };
    let engine = Engine::start(assemble(&paths, true).unwrap(), options).unwrap();
    // One worker, sixteen writers: rows must share rounds.
    let mut image = hammer(&engine, 16, 60, 21);
    let one = engine.cache_report();
    assert_eq!(one.stripe_workers, 1);
    assert!(one.stripe_rows >= 16 * 60, "every write went to the worker");
    assert!(
        one.stripe_rounds < one.stripe_rows,
        "rounds {} for rows {}: nothing was batched",
        one.stripe_rounds,
        one.stripe_rows
    );
    // The count changes while writers run: queues change hands.
    let changer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            for n in ["3", "2", "0", "1", "4"] {
                std::thread::sleep(Duration::from_millis(15));
                engine.set_tunable("group_thread_cnt", n).unwrap();
            }
        })
    };
    hammer_onto(&engine, 8, 80, 22, &mut image);
    changer.join().unwrap();
    assert_eq!(engine.cache_report().stripe_workers, 4);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "read differs after the thread count changed");
    engine.shutdown().unwrap();
    drop(engine);
    check_consistent(&paths);
}

/// Reads every 4 KiB block of the array one by one, and smaller and
/// straddling reads (sector-aligned, as NBD's are), as a random reader
/// does: these take the direct path (one member read, no stripe map) when
/// they fit in a strip whose member is usable.
fn check_small_reads(engine: &Arc<Engine>, image: &[u8], state: &str) {
    let mut block = [0u8; 4096];
    for at in (0..image.len()).step_by(4096) {
        engine.read(at as u64, &mut block).unwrap();
        assert!(block[..] == image[at..at + 4096], "{state}: 4 KiB at {at}");
        // Inside a block, and across blocks (so across strips at times).
        for (odd, len) in [(at + 1536, 1024), (at + 2048, 4096)] {
            if odd + len > image.len() {
                continue;
            }
            engine.read(odd as u64, &mut block[..len]).unwrap();
            assert!(
                block[..len] == image[odd..odd + len],
                "{state}: {len} bytes at {odd}"
            );
        }
    }
}

/// The direct read must return what the full path would in every state
/// the full path handles: healthy, bytes still in the stripe cache
/// (write-back), a member missing (its strips are reconstructed), and a
/// member half rebuilt (read only below the rebuild's position). A direct
/// path that read a missing or not yet rebuilt member, or ignored pending
/// bytes, would return zeroes or old bytes here.
#[test]
fn small_reads_return_the_written_bytes_in_every_state() {
    for (level, layout, disks) in [
        (Level::Raid6, Some("left-symmetric"), 5),
        (Level::Raid5, Some("right-asymmetric"), 4),
        (Level::Raid0, None, 3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_array(dir.path(), level, layout, disks, 8);
        let options = EngineOptions {
            accept_data_loss: true,
            ..EngineOptions::default()
        };
        let engine = Engine::start(assemble(&paths, true).unwrap(), options).unwrap();
        // Without read-ahead every read reaches read_bytes as it is (the
        // blocks are read in order, which read-ahead would widen).
        engine.set_tunable("read_ahead", "0").unwrap();
        let mut image = hammer(&engine, 3, 80, 5);
        check_small_reads(&engine, &image, &format!("{level} healthy"));

        // Write-back keeps random writes in batches for a while: reads
        // right after them must see the batches' bytes.
        engine.set_tunable("write_policy", "write-back").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut saw_pending = 0;
        for _ in 0..64 {
            let at = rng.gen_range(0..image.len() / 4096) * 4096;
            let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
            engine.write(at as u64, &data, false).unwrap();
            image[at..at + 4096].copy_from_slice(&data);
            saw_pending += usize::from(engine.datapath.cache.has_batches());
            let mut back = vec![0u8; 4096];
            engine.read(at as u64, &mut back).unwrap();
            assert!(
                back == data,
                "{level}: a write-back write read back at {at}"
            );
            let mut part = vec![0u8; 1024];
            engine.read(at as u64 + 512, &mut part).unwrap();
            assert!(
                part[..] == data[512..1536],
                "{level}: part of a write-back write"
            );
        }
        if level.has_parity() {
            assert!(saw_pending > 0, "{level}: no read found bytes pending");
        }
        engine.set_tunable("write_policy", "write-through").unwrap();
        check_small_reads(&engine, &image, &format!("{level} after write-back"));
        // Every batch written out: the copy of role 1 below is taken
        // behind the engine's back, and a batch written after it would
        // be missing from the copy.
        BlockBackend::flush(&*engine).unwrap();
        assert!(!engine.datapath.cache.has_batches());
        if !level.has_parity() {
            engine.shutdown().unwrap();
            continue;
        }

        // Role 1 half rebuilt: below stripe `half` it holds its data, above
        // it garbage, as a spare does before the rebuild reaches it.
        let old = engine.table().entry(1).unwrap().slot.clone();
        let mut bytes = vec![0u8; old.member.size_bytes() as usize];
        old.member.read_at(&mut bytes, 0).unwrap();
        let half = engine.geometry().stripe_count() / 2;
        let member_sector = engine.geometry().stripe(half).p.unwrap().member_sector;
        bytes[(old.data_offset_bytes + member_sector * 512) as usize..].fill(0xee);
        let copy = crate::member::MemoryMember::new("half", bytes.len() as u64, 512);
        crate::member::Member::write_at(&copy, &bytes, 0).unwrap();
        engine.update_table(|t| {
            t.by_role[1] = Some(MemberEntry {
                slot: crate::array::Slot {
                    member: Arc::new(copy),
                    data_offset_bytes: old.data_offset_bytes,
                },
                rebuilt_below: Some(Arc::new(Position::new(half))),
            })
        });
        check_small_reads(&engine, &image, &format!("{level} half rebuilt"));

        engine.manage_fail(&paths[1]).unwrap();
        check_small_reads(&engine, &image, &format!("{level} degraded"));
        engine.shutdown().unwrap();
    }
}

/// Read-ahead is for a lone sequential reader: a read that follows another
/// the server still holds on the fast path is not one.
#[test]
fn read_ahead_leaves_alone_a_reader_with_fast_reads_in_flight() {
    // On a disk: the fast path takes O_DIRECT members.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 64);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    assert!(engine.tunables.read_ahead_sectors() > 0);
    let first = engine
        .read_extents(0, 4096, ExtentUse::Read)
        .expect("a first read takes the fast path");
    // While the server holds that read, one that follows it comes from a
    // client with a queue, which is its own read-ahead: it goes fast too.
    // (Before, fast reads in flight did not count, and a random reader at
    // queue depth 32 had one read in 1,500 turned into two full stripes.)
    let second = engine.read_extents(4096, 4096, ExtentUse::Read);
    assert!(
        second.is_some(),
        "a read behind one in flight was taken for a lone sequential reader"
    );
    drop((first, second));
    // A lone reader that goes on where it stopped is read ahead for once
    // it has made a habit of it: the fast path declines its reads from
    // then on and the engine's read path fetches more. (Before the habit,
    // a 16-deep reader whose replies drained together had its next read
    // taken for a lone one, one read in nine at 1 MiB.)
    let habit = super::datapath::readcache::LONE_HABIT as u64;
    assert!(habit >= 2, "one lone instant must not make a lone reader");
    for n in 0..habit - 1 {
        let at = 8192 + n * 4096;
        let fast = engine.read_extents(at, 4096, ExtentUse::Read);
        assert!(fast.is_some(), "read {n} alone took read-ahead");
    }
    for n in habit - 1..habit + 3 {
        let at = 8192 + n * 4096;
        assert!(
            engine.read_extents(at, 4096, ExtentUse::Read).is_none(),
            "lone read {n} was not read ahead"
        );
        // The engine's path reads it, as the server would.
        let mut buf = vec![0u8; 4096];
        engine.read(at, &mut buf).unwrap();
    }
    engine.shutdown().unwrap();
}

#[test]
fn a_misaligned_request_is_refused_and_fails_no_member() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid5, None, 3, 8);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let mut buf = vec![0u8; 4096];
    for (offset, len) in [(100u64, 4096usize), (0, 1000), (512, 513)] {
        let read = engine.read(offset, &mut buf[..len]).unwrap_err();
        assert_eq!(read.kind(), std::io::ErrorKind::InvalidInput, "{read}");
        let write = engine.write(offset, &buf[..len], false).unwrap_err();
        assert_eq!(write.kind(), std::io::ErrorKind::InvalidInput, "{write}");
    }
    let snapshot = engine.snapshot();
    assert!(snapshot.missing_roles.is_empty(), "a member was failed");
    assert!(!has_event(&snapshot, "Fail"), "a member was failed");
    engine.read(512, &mut buf[..512]).unwrap();
    engine.shutdown().unwrap();
}

/// raid4/5/6 on in-memory members behind fault injectors, plus a journal
/// member; `assume_clean` members are zero, which is consistent.
fn journaled_array(
    level: Level,
    disks: usize,
    journal_bytes: u64,
) -> (Assembled, Vec<Arc<crate::member::FaultyMember>>) {
    use crate::member::{FaultyMember, MemberRef, MemoryMember};
    let wrappers: Vec<Arc<FaultyMember>> = (0..=disks)
        .map(|i| {
            let size = if i == disks { journal_bytes } else { 4 << 20 };
            let inner: MemberRef = Arc::new(MemoryMember::new(&format!("m{i}"), size, 512));
            Arc::new(FaultyMember::with_seed(inner, i as u64))
        })
        .collect();
    let options = CreateOptions {
        level,
        raid_disks: disks as u32,
        chunk_bytes: Some(16 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: true,
        name: "journaled".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    let mut members: Vec<Option<(String, crate::member::MemberRef)>> = wrappers
        .iter()
        .enumerate()
        .map(|(i, w)| Some((format!("m{i}"), w.clone() as MemberRef)))
        .collect();
    let journal = members.pop().flatten();
    let array = crate::array::create_on_members_full(
        members,
        journal,
        &options,
        crate::array::BitmapRequest::None,
        |_, _| {},
    )
    .unwrap();
    (array, wrappers)
}

/// Writes of whole 4 KiB blocks from `threads` threads, each in its own
/// rows (row r belongs to thread r mod threads): a run of 1 to all of a
/// row's pages at a random place in it, so writes touch one strip or
/// several, part of a row or all of it. Returns the image they leave.
fn hammer_pages(engine: &Arc<Engine>, threads: usize, writes: usize, seed: u64) -> Vec<u8> {
    let size = engine.size_bytes() as usize;
    let row = engine.datapath.row.strip_bytes * engine.datapath.row.data_strips;
    let rows = size / row;
    let image = Arc::new(Mutex::new(vec![0u8; size]));
    std::thread::scope(|s| {
        for t in 0..threads {
            let image = image.clone();
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + t as u64);
                for _ in 0..writes {
                    let r = rng.gen_range(0..rows / threads) * threads + t;
                    let pages = rng.gen_range(1..=row / 4096);
                    let first = rng.gen_range(0..=row / 4096 - pages);
                    let off = r * row + first * 4096;
                    let data: Vec<u8> = (0..pages * 4096).map(|_| rng.gen()).collect();
                    engine.write_bytes(off as u64, &data, false).unwrap();
                    image.lock().unwrap()[off..off + data.len()].copy_from_slice(&data);
                }
            });
        }
    });
    Arc::try_unwrap(image).unwrap().into_inner().unwrap()
}

fn read_all(engine: &Arc<Engine>) -> Vec<u8> {
    let mut got = vec![0u8; engine.size_bytes() as usize];
    for (i, chunk) in got.chunks_mut(1 << 20).enumerate() {
        engine.read_bytes((i as u64) << 20, chunk).unwrap();
    }
    got
}

/// A client's FUA write reaches the members as FUA writes of its data and
/// parity (or copies), with no flush of anything else, as md passes
/// REQ_FUA to a stripe's writes; on a parity level the stripe workers'
/// batches keep the flag too. At a power cut that empties every member's
/// volatile write cache, the FUA write is there and a plain write made
/// after it, never flushed, is not (which shows the cut loses what it
/// should). With write-back and a journal, the FUA write goes out of the
/// stripe cache at once, with FUA.
#[test]
fn a_fua_write_is_fua_on_its_members_and_survives_a_power_cut() {
    use crate::member::FaultCounters;
    let counts = |wrappers: &[Arc<crate::member::FaultyMember>]| -> Vec<FaultCounters> {
        wrappers.iter().map(|w| w.counters()).collect()
    };
    let delta = |before: &[FaultCounters], after: &[FaultCounters]| -> (u64, u64) {
        let fua: u64 = (before.iter().zip(after))
            .map(|(b, a)| a.fua_writes - b.fua_writes)
            .sum();
        let flushes: u64 = (before.iter().zip(after))
            .map(|(b, a)| a.flushes - b.flushes)
            .sum();
        (fua, flushes)
    };
    // Member writes a 4 KiB write in one strip makes: data and parity
    // (read-modify-write), or every copy.
    for (level, disks, workers, members_written, journal) in [
        (Level::Raid6, 5, 0, 3, false),
        (Level::Raid6, 5, 2, 3, false),
        (Level::Raid5, 4, 2, 2, false),
        (Level::Raid1, 2, 0, 2, false),
        (Level::Raid10, 4, 0, 2, false),
        (Level::Raid6, 5, 0, 3, true),
    ] {
        let what = format!("{level} of {disks}, workers {workers}, journal {journal}");
        let (array, wrappers) = match journal {
            true => journaled_array(level, disks, 8 << 20),
            false => faulty_array(level, disks, 0),
        };
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        let mut settings = vec![("group_thread_cnt".into(), workers.to_string())];
        if journal {
            settings.push(("write_policy".into(), "write-back".into()));
        }
        engine.set_tunables(&settings, false).unwrap();
        wait_idle(&engine);
        let members = &wrappers[..disks];
        for w in members {
            w.apply_str("cache").unwrap();
        }
        // Two writes in other rows, whatever the level's row size.
        let size = engine.size_bytes();
        let (fua_at, plain_at) = (size / 4, size / 2);
        let before = counts(members);
        let fua_bytes = vec![0xa5u8; 4096];
        engine.write(fua_at, &fua_bytes, true).unwrap();
        let (fua, flushes) = delta(&before, &counts(members));
        if journal {
            // The journal's own commits may flush; the row goes out with FUA.
            assert!(fua >= members_written, "{what}: {fua} FUA writes");
        } else {
            assert_eq!(fua, members_written, "{what}: FUA member writes");
            assert_eq!(flushes, 0, "{what}: a FUA write flushes nothing");
        }
        let before = counts(members);
        engine.write(plain_at, &[0x5au8; 4096], false).unwrap();
        assert_eq!(
            delta(&before, &counts(members)).0,
            0,
            "{what}: a plain write is not FUA"
        );
        if journal {
            // The power cut takes the stripe cache's memory too.
            engine.datapath.cache.forget_unwritten();
        }
        crash(engine);
        for w in members {
            w.crash().unwrap();
            w.apply_str("restore").unwrap();
        }
        let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
        let mut back = vec![0u8; 4096];
        engine.read_bytes(fua_at, &mut back).unwrap();
        assert!(back == fua_bytes, "{what}: the FUA write was lost");
        if !journal {
            engine.read_bytes(plain_at, &mut back).unwrap();
            assert!(
                back != [0x5au8; 4096],
                "{what}: the unflushed write survived: the cut lost nothing"
            );
        }
        engine.shutdown().unwrap();
    }
}

/// A member whose flush, once armed, meets the others' before it returns
/// (once: the last to arrive disarms them all): flushed one after
/// another, the first would wait for the rest in vain and fail.
struct Rendezvous {
    inner: crate::member::MemberRef,
    armed: Arc<std::sync::atomic::AtomicBool>,
    met: Arc<(Mutex<usize>, std::sync::Condvar)>,
    expected: usize,
    fails: bool,
}

impl crate::member::Member for Rendezvous {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_block_bytes(&self) -> u32 {
        self.inner.logical_block_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if !self.armed.load(Ordering::SeqCst) {
            return self.inner.flush();
        }
        let (count, all_here) = &*self.met;
        let mut here = count.lock().unwrap();
        *here += 1;
        if *here == self.expected {
            self.armed.store(false, Ordering::SeqCst);
        }
        all_here.notify_all();
        let (here, waited) = all_here
            .wait_timeout_while(here, std::time::Duration::from_secs(10), |n| {
                *n % self.expected != 0
            })
            .unwrap();
        drop(here);
        if waited.timed_out() {
            return Err(std::io::Error::other("flushed alone"));
        }
        match self.fails {
            true => Err(std::io::Error::from_raw_os_error(libc::EIO)),
            false => self.inner.flush(),
        }
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
}

/// A FLUSH goes to every member at once (as md sends its flushes), and a
/// member whose flush fails is failed while the array goes on.
#[test]
fn a_flush_reaches_every_member_at_once_and_fails_a_member_whose_flush_fails() {
    use crate::member::{MemberRef, MemoryMember};
    let disks = 4;
    let met = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let members = (0..disks)
        .map(|i| {
            let inner: MemberRef = Arc::new(MemoryMember::new(&format!("m{i}"), 4 << 20, 512));
            let member: MemberRef = Arc::new(Rendezvous {
                inner,
                armed: armed.clone(),
                met: met.clone(),
                expected: disks,
                fails: i == 2,
            });
            Some((format!("m{i}"), member))
        })
        .collect();
    let options = CreateOptions {
        level: Level::Raid6,
        raid_disks: disks as u32,
        chunk_bytes: Some(8 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: true,
        name: "flush".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    let array = crate::array::create_on_members(members, &options, |_, _| {}).unwrap();
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    engine.write(0, &[7u8; 4096], false).unwrap();
    armed.store(true, Ordering::SeqCst);
    engine.flush().unwrap();
    let snapshot = engine.snapshot();
    assert_eq!(
        snapshot.missing_roles,
        vec![2],
        "the member whose flush failed"
    );
    let mut back = vec![0u8; 4096];
    engine.read(0, &mut back).unwrap();
    assert!(back == [7u8; 4096]);
}

/// The write hole, closed: writes go to members whose volatile caches a
/// power cut then empties (so rows are left torn or unwritten), and the
/// restart replays the journal: every acknowledged byte reads back and
/// parity agrees with the data, for raid4, raid5 and raid6, healthy and
/// degraded, with and without stripe workers.
#[test]
fn a_power_cut_loses_member_writes_and_the_journal_replays_them() {
    for (level, disks, lost, workers) in [
        (Level::Raid5, 4, None, 0),
        (Level::Raid6, 5, None, 2),
        (Level::Raid4, 3, None, 0),
        (Level::Raid6, 5, Some(1), 0),
        (Level::Raid5, 4, Some(3), 1),
    ] {
        let what = format!("{level} of {disks}, lost {lost:?}, workers {workers}");
        let (array, wrappers) = journaled_array(level, disks, 2 << 20);
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        engine
            .set_tunable("group_thread_cnt", &workers.to_string())
            .unwrap();
        if let Some(role) = lost {
            engine.fail_member(role, "test");
        }
        for w in &wrappers[..disks] {
            w.apply_str("cache").unwrap();
        }
        let image = hammer_pages(&engine, 3, 40, disks as u64);
        let stats = engine.journal_stats().unwrap();
        assert!(
            stats.units_written > 0 && stats.failed.is_none(),
            "{what}: {stats:?}"
        );
        assert!(
            stats.reclaims > 0,
            "{what}: the ring never filled: {stats:?}"
        );
        crash(engine);
        let mut lost_blocks = 0;
        for w in &wrappers[..disks] {
            lost_blocks += w.crash().unwrap().lost_blocks;
            w.apply_str("restore").unwrap();
        }
        assert!(lost_blocks > 0, "{what}: the power cut lost nothing");
        let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
        assert!(
            engine.journal_stats().unwrap().replayed_rows > 0,
            "{what}: nothing replayed"
        );
        assert!(
            read_all(&engine) == image,
            "{what}: data differs after replay"
        );
        if lost.is_none() {
            assert_eq!(check_mismatches(&engine), 0, "{what}: parity after replay");
        }
        engine.shutdown().unwrap();
        // A clean stop leaves nothing to replay, and the data stays.
        let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
        assert_eq!(engine.journal_stats().unwrap().replayed_rows, 0, "{what}");
        assert!(
            read_all(&engine) == image,
            "{what}: data differs after a clean restart"
        );
        engine.shutdown().unwrap();
    }
}

/// Without its journal the array is refused read-write (md starts it
/// read-only); a journal that fails a write refuses writes from then on,
/// and reads go on.
#[test]
fn a_missing_or_failed_journal_stops_writes_not_reads() {
    let (array, wrappers) = journaled_array(Level::Raid5, 4, 2 << 20);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    let image = hammer_pages(&engine, 2, 10, 9);
    engine.shutdown().unwrap();
    let without: Vec<_> = wrappers[..4]
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("m{i}"), w.clone() as crate::member::MemberRef))
        .collect();
    let array = crate::array::assemble_members(without.clone()).unwrap();
    assert!(matches!(
        Engine::start(array, EngineOptions::default()),
        Err(EngineError::JournalMissing)
    ));
    let array = crate::array::assemble_members(without).unwrap();
    let read_only = EngineOptions {
        read_only: true,
        ..EngineOptions::default()
    };
    let engine = Engine::start(array, read_only).unwrap();
    assert!(read_all(&engine) == image);
    engine.shutdown().unwrap();

    let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
    wrappers[4].apply_str("eio:write:0+2M").unwrap();
    let err = engine.write_bytes(0, &[7u8; 4096], false).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ReadOnlyFilesystem, "{err}");
    assert!(engine.write_bytes(8192, &[7u8; 4096], false).is_err());
    assert!(read_all(&engine) == image, "reads after the journal failed");
    assert!(engine
        .snapshot()
        .events
        .iter()
        .any(|e| e.event == "Fail" && e.device == "m4"));
    // Misaligned for the journal's pages: refused before anything is written.
    let err = BlockBackend::write(&*engine, 512, &[1u8; 512], false).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

/// Write-back with a journal (md's r5c): writes acknowledged from the
/// stripe cache are in the journal first, so a power cut that loses both
/// the cache (the engine's memory) and the members' volatile caches loses
/// no acknowledged byte: the restart writes the data logged alone through
/// the engine and replays the rows whose parity was logged. No
/// --i-accept-data-loss is needed: the journal is the protection.
#[test]
fn write_back_with_a_journal_loses_nothing_acknowledged_at_a_power_cut() {
    for (level, disks, workers, lost) in [
        (Level::Raid5, 4, 0, None),
        (Level::Raid6, 5, 2, None),
        (Level::Raid6, 5, 0, Some(2)),
    ] {
        let what = format!("{level} of {disks}, workers {workers}, lost {lost:?}");
        // Room for all that the test writes: the cache's writers stop
        // below, so nothing frees the journal's share for the cache.
        let (array, wrappers) = journaled_array(level, disks, 24 << 20);
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        engine
            .set_tunables(
                &[
                    ("write_policy".into(), "write-back".into()),
                    ("group_thread_cnt".into(), workers.to_string()),
                ],
                false,
            )
            .unwrap_or_else(|e| panic!("{what}: write-back refused with a journal: {e}"));
        if let Some(role) = lost {
            engine.fail_member(role, "test");
        }
        for w in &wrappers[..disks] {
            w.apply_str("cache").unwrap();
        }
        // The cache's writers stop, so that what it acknowledges stays in
        // memory until the cut (writers still write batches out themselves
        // when the journal's share for the cache runs short).
        engine.datapath.cache.stop.store(true, Ordering::SeqCst);
        engine.datapath.cache.wake_workers();
        let image = hammer_pages(&engine, 3, 30, 11 + disks as u64);
        // The power cut takes the cache's memory with it.
        let held = engine.datapath.cache.forget_unwritten();
        crash(engine);
        for w in &wrappers[..disks] {
            w.crash().unwrap();
            w.apply_str("restore").unwrap();
        }
        let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
        let stats = engine.journal_stats().unwrap();
        assert!(
            stats.replayed_rows + stats.replayed_data_pages > 0,
            "{what}: nothing replayed: {stats:?}"
        );
        assert!(held > 0, "{what}: the cache held nothing at the power cut");
        assert!(
            stats.replayed_data_pages > 0,
            "{what}: {held} batches were lost with the cache but no data was logged alone"
        );
        assert!(read_all(&engine) == image, "{what}: acknowledged data lost");
        if lost.is_none() {
            assert_eq!(check_mismatches(&engine), 0, "{what}: parity after replay");
        }
        engine.shutdown().unwrap();
    }
}

/// Write-back with a journal while the cache's writers run, two writers
/// sharing a few rows (each its own pages): batches are written out while
/// the next writes to their rows arrive, so data logged for a row's next
/// batch and the parity of its last write-out meet in the journal. Data
/// logged before a write-out's parity must be in that write-out (md holds
/// new writes to a stripe being written out): at a power cut that loses
/// the cache and the members' caches, the replay must leave every
/// acknowledged byte and parity consistent with it.
#[test]
fn write_back_rows_written_while_written_out_replay_consistently() {
    for seed in 0..4u64 {
        let (array, wrappers) = journaled_array(Level::Raid6, 5, 24 << 20);
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        engine
            .set_tunables(&[("write_policy".into(), "write-back".into())], false)
            .unwrap();
        for w in &wrappers[..5] {
            w.apply_str("cache").unwrap();
        }
        let row = engine.datapath.row.strip_bytes * engine.datapath.row.data_strips;
        let pages = 4 * row / 4096;
        let image = Arc::new(Mutex::new(vec![0u8; engine.size_bytes() as usize]));
        std::thread::scope(|s| {
            for t in 0..2usize {
                let (engine, image) = (&engine, image.clone());
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 10 + t as u64);
                    for _ in 0..300 {
                        let page = rng.gen_range(0..pages / 2) * 2 + t;
                        let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
                        engine
                            .write_bytes(page as u64 * 4096, &data, false)
                            .unwrap();
                        image.lock().unwrap()[page * 4096..][..4096].copy_from_slice(&data);
                        if rng.gen_range(0..8) == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                    }
                });
            }
        });
        engine.datapath.cache.forget_unwritten();
        crash(engine);
        for w in &wrappers[..5] {
            w.crash().unwrap();
            w.apply_str("restore").unwrap();
        }
        let engine = Engine::start(reassemble(&wrappers), EngineOptions::default()).unwrap();
        let image = Arc::try_unwrap(image).unwrap().into_inner().unwrap();
        assert!(
            read_all(&engine) == image,
            "seed {seed}: acknowledged data lost"
        );
        assert_eq!(
            check_mismatches(&engine),
            0,
            "seed {seed}: parity after replay"
        );
        engine.shutdown().unwrap();
    }
}

/// Members in memory that are not mapped: their staged writes are
/// spliced into the files (`Member::splice_fd`), not stored in place.
struct Unmapped(crate::member::MemberRef);

impl crate::member::Member for Unmapped {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn logical_block_bytes(&self) -> u32 {
        self.0.logical_block_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.discard(offset, len)
    }
    fn splice_fd(&self) -> Option<std::os::fd::RawFd> {
        self.0.splice_fd()
    }
    fn in_memory(&self) -> bool {
        self.0.in_memory()
    }
}

/// A staged write's failures are settled as a plain write's. Spliced
/// into files: a mirror copy that fails is failed and the write succeeds
/// on the other; on raid0 the write fails. Stored in mapped members: a
/// source that fails part way fails the write and no member, and leaves
/// a mirror's copies equal and a raid6 row's parity right. (A stand-in
/// source writes the bytes with pwrite and makes the failures up.)
#[test]
fn a_staged_write_settles_failures_as_a_plain_write() {
    struct Source {
        bytes: Vec<u8>,
        taken: usize,
        /// Which target of the first call fails.
        failing: Option<usize>,
        /// The source fails at this byte.
        broken_at: Option<usize>,
    }
    impl crate::export::StagedWrite for Source {
        fn into_files(
            &mut self,
            len: usize,
            targets: &[(std::os::fd::RawFd, u64)],
        ) -> std::io::Result<Vec<Option<std::io::Error>>> {
            if self.broken_at.is_some_and(|b| b < self.taken + len) {
                return Err(std::io::Error::other("the pipe ran dry"));
            }
            let bytes = &self.bytes[self.taken..self.taken + len];
            self.taken += len;
            let failing = self.failing.take();
            Ok(targets
                .iter()
                .enumerate()
                .map(|(k, &(fd, at))| {
                    if failing == Some(k) {
                        return Some(std::io::Error::from_raw_os_error(libc::EIO));
                    }
                    // SAFETY: bytes is valid for its length; fd is open.
                    let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), len, at as i64) };
                    assert_eq!(n, len as isize);
                    None
                })
                .collect())
        }
        fn into_memory(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
            let end = self.taken + buf.len();
            let have = self.broken_at.map_or(end, |b| b.clamp(self.taken, end));
            buf[..have - self.taken].copy_from_slice(&self.bytes[self.taken..have]);
            self.taken = have;
            if have < end {
                return Err(std::io::Error::other("the pipe ran dry"));
            }
            Ok(())
        }
    }
    let source = |bytes: &[u8], failing, broken_at| Source {
        bytes: bytes.to_vec(),
        taken: 0,
        failing,
        broken_at,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let data: Vec<u8> = (0..384 << 10).map(|_| rng.gen()).collect();
    let len = data.len();
    for (level, layout, disks, chunk) in [
        (Level::Raid1, None, 2, 0),
        (Level::Raid0, None, 2, 64),
        (Level::Raid6, Some("left-symmetric"), 5, 64),
    ] {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let paths = make_array(dir.path(), level, layout, disks, chunk);
        for mapped in [true, false] {
            let mut array = assemble(&paths, true).unwrap();
            if !mapped {
                if level.has_parity() {
                    continue;
                }
                for slot in array.slots.iter_mut().flatten() {
                    slot.member = Arc::new(Unmapped(slot.member.clone()));
                }
            }
            let engine = Engine::start(array, EngineOptions::default()).unwrap();
            let what = format!("{level} mapped {mapped}");
            assert!(engine.takes_staged_writes(0, len), "{what}");
            let written = engine.write_staged(0, len, false, &mut source(&data, None, None));
            assert!(
                matches!(written, Some(Ok(()))),
                "{what}: a clean staged write"
            );
            let mut back = vec![0u8; len];
            engine.read(0, &mut back).unwrap();
            assert!(back == data, "{what}: read back");
            // Other bytes, so that a copy or parity left behind shows.
            let other: Vec<u8> = data.iter().map(|b| !b).collect();
            let broken = engine.write_staged(
                0,
                len,
                false,
                &mut source(&other, None, Some(len / 2 + 4096)),
            );
            assert!(
                matches!(broken, Some(Err(_))),
                "{what}: a broken source fails the write"
            );
            assert!(
                engine.snapshot().missing_roles.is_empty(),
                "{what}: and no member"
            );
            if level != Level::Raid0 {
                assert_eq!(
                    check_mismatches(&engine),
                    0,
                    "{what}: redundancy after a broken source"
                );
            }
            if !mapped {
                let failed = engine.write_staged(0, len, false, &mut source(&data, Some(0), None));
                if level == Level::Raid1 {
                    assert!(
                        matches!(failed, Some(Ok(()))),
                        "raid1: the other copy took it"
                    );
                    assert_eq!(
                        engine.snapshot().missing_roles.len(),
                        1,
                        "raid1: one copy failed"
                    );
                    engine.read(0, &mut back).unwrap();
                    assert!(back == data, "raid1: read back from the other copy");
                } else {
                    assert!(matches!(failed, Some(Err(_))), "raid0: the write fails");
                }
            }
            engine.shutdown().ok();
        }
    }
}

/// md's rmw_level decides which old bytes a small write reads, and
/// max_sectors_kb how big each member I/O may be. raid6 of 6 members (4
/// data strips): a 4 KiB write into one strip reads its old data and P
/// and Q by read-modify-write (3 reads) or the other 3 strips by
/// reconstruct-write (3 reads, a tie); of 8 members, 3 against 5.
#[test]
fn member_io_follows_rmw_level_and_max_sectors_kb() {
    use std::collections::BTreeSet;
    for (disks, level, rmw) in [
        (6, "0", false),
        (6, "1", false), // a tie goes to reconstruct-write
        (6, "2", true),
        (8, "0", false),
        (8, "1", true),
        (8, "2", true),
    ] {
        let (array, wrappers) = faulty_array(Level::Raid6, disks, 0);
        let engine = Engine::start(array, EngineOptions::default()).unwrap();
        engine.set_tunable("rmw_level", level).unwrap();
        engine.set_tunable("read_ahead", "0").unwrap();
        let counts = || -> Vec<(u64, u64, u64)> {
            wrappers
                .iter()
                .map(|w| {
                    let c = w.counters();
                    (c.reads, c.read_bytes, c.writes)
                })
                .collect()
        };
        let strip = 8 << 10;
        let data_strips = disks - 2;
        let stripes = engine.size_bytes() as usize / (strip * data_strips);
        let mut image = vec![0u8; engine.size_bytes() as usize];
        // Stripes far apart, each written once, so that no parity is hot
        // and no write looks sequential.
        for s in (0..stripes).step_by(7).take(8) {
            let map = engine.geometry().stripe(s as u64);
            let i = s % data_strips;
            let at = s * strip * data_strips + i * strip + 4096;
            let data: Vec<u8> = (0..4096).map(|k| (k as usize * 7 + s) as u8).collect();
            engine.drop_caches().unwrap();
            let before = counts();
            engine.write(at as u64, &data, false).unwrap();
            image[at..at + 4096].copy_from_slice(&data);
            let after = counts();
            let read: BTreeSet<usize> = (0..disks).filter(|&m| after[m].0 > before[m].0).collect();
            let written: BTreeSet<usize> =
                (0..disks).filter(|&m| after[m].2 > before[m].2).collect();
            let role = |p: &crate::geometry::Place| p.member;
            let target = role(&map.data[i].copies[0]);
            let parity: BTreeSet<usize> =
                [map.p.unwrap(), map.q.unwrap()].iter().map(role).collect();
            let others: BTreeSet<usize> = (0..data_strips)
                .filter(|&k| k != i)
                .map(|k| role(&map.data[k].copies[0]))
                .collect();
            let expected_reads: BTreeSet<usize> = if rmw {
                parity.iter().copied().chain([target]).collect()
            } else {
                others
            };
            assert_eq!(
                read, expected_reads,
                "{disks} members, rmw_level {level}, stripe {s}: members read"
            );
            let expected_writes: BTreeSet<usize> = parity.iter().copied().chain([target]).collect();
            assert_eq!(
                written, expected_writes,
                "{disks} members, rmw_level {level}"
            );
        }
        // max_sectors_kb: a read of one whole strip (8 KiB, one member)
        // goes out in member reads of at most the limit.
        engine.set_tunable("max_sectors_kb", "4").unwrap();
        let before = counts();
        let mut buf = vec![0u8; strip];
        let at = strip * data_strips; // stripe 1, strip 0: one member
        engine.read(at as u64, &mut buf).unwrap();
        assert_eq!(buf, image[at..at + strip]);
        let after = counts();
        let reads: u64 = (0..disks).map(|m| after[m].0 - before[m].0).sum();
        let bytes: u64 = (0..disks).map(|m| after[m].1 - before[m].1).sum();
        assert_eq!(bytes, strip as u64, "one strip read");
        assert_eq!(reads, (strip / 4096) as u64, "in 4 KiB member reads");
        // And a write of a whole row: every member write at most 4 KiB.
        let before = counts();
        let row: Vec<u8> = (0..strip * data_strips).map(|k| k as u8).collect();
        engine.write(0, &row, false).unwrap();
        let after = counts();
        for m in 0..disks {
            assert_eq!(
                after[m].2 - before[m].2,
                (strip / 4096) as u64,
                "member {m}: a strip written in 4 KiB pieces"
            );
        }
        engine.shutdown().unwrap();
    }
}

/// The stripe cache never holds more than stripe_cache_size entries,
/// however many writers open batches at once: 16 threads of write-back
/// partial-row writes at the smallest size md allows (17 entries: 8
/// batches of 2 on 8 KiB chunks), sampled all along, then read back.
#[test]
fn the_stripe_cache_never_holds_more_than_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_array(dir.path(), Level::Raid6, Some("left-symmetric"), 6, 8);
    let options = EngineOptions {
        accept_data_loss: true,
        ..EngineOptions::default()
    };
    let engine = Engine::start(assemble(&paths, true).unwrap(), options).unwrap();
    engine.set_tunable("stripe_cache_size", "17").unwrap();
    engine.set_tunable("write_policy", "write-back").unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (engine, done) = (engine.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut peak, mut samples) = (0, 0u64);
            while !done.load(Ordering::SeqCst) {
                let report = engine.cache_report();
                assert!(
                    report.entries_in_use <= report.capacity,
                    "{} entries in a cache of {}",
                    report.entries_in_use,
                    report.capacity
                );
                peak = peak.max(report.entries_in_use);
                samples += 1;
            }
            (peak, samples)
        })
    };
    let image = hammer(&engine, 16, 60, 21);
    done.store(true, Ordering::SeqCst);
    let (peak, samples) = sampler.join().unwrap();
    assert!(
        peak > 0 && samples > 10,
        "the cache was used ({peak} at most, {samples} samples)"
    );
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "the writes read back");
    engine.shutdown().unwrap();
}

#[test]
fn a_hung_member_times_out_and_comes_back_through_the_bitmap() {
    use crate::member::{DeadlineMember, FaultyMember, MemberRef};
    let dir = tempfile::tempdir().unwrap();
    let paths = raid5_with_bitmap(dir.path());
    let mut faulty = Vec::new();
    let members = crate::array::open_members(&paths, true)
        .unwrap()
        .into_iter()
        .map(|(name, member)| {
            let injector = Arc::new(FaultyMember::new(member));
            faulty.push(injector.clone());
            let timed: MemberRef = Arc::new(DeadlineMember::new(
                injector,
                std::time::Duration::from_millis(300),
            ));
            (name, timed)
        })
        .collect();
    let array = crate::array::assemble_members(members).unwrap();
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    let mut image = hammer(&engine, 2, 20, 9);
    engine.bitmap_clear_quiet(0).unwrap();
    faulty[2].apply_str("hang").unwrap();
    // The write meets the hang, fails the member and is served without it.
    let data = vec![0x5au8; 64 << 10];
    engine.write(6 << 20, &data, false).unwrap();
    image[6 << 20..(6 << 20) + data.len()].copy_from_slice(&data);
    let name = paths[2].display().to_string();
    let snapshot = engine.snapshot();
    let reason = snapshot
        .member_failures
        .iter()
        .find(|(p, _)| *p == name)
        .map(|(_, r)| r.clone())
        .expect("the hung member failed");
    assert!(reason.starts_with("timeout: "), "{reason}");
    // Its stuck write has not returned: it cannot come back yet.
    assert!(engine.manage_add(&paths[2]).is_err());
    faulty[2].apply_str("hang:off").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while let Err(e) = engine.manage_add(&paths[2]) {
        assert!(std::time::Instant::now() < deadline, "re-add: {e}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The event follows the table's change: wait for both.
    wait_until(&engine, "the re-added member in sync", |s| {
        s.missing_roles.is_empty()
            && s.sync.is_none()
            && s.events
                .iter()
                .any(|e| e.event == "RebuildFinished" && e.device == name)
    });
    let events = engine.snapshot().events;
    let copied = events
        .iter()
        .find(|e| e.event == "RebuildFinished" && e.device == name)
        .map(|e| e.detail.clone())
        .unwrap_or_default();
    assert!(
        copied.starts_with("re-add through the bitmap: "),
        "{copied}"
    );
    assert!(engine.snapshot().member_failures.is_empty());
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "data differs after the re-add");
    assert_eq!(check_mismatches(&engine), 0);
    engine.shutdown().unwrap();
}
