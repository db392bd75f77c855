//! `create --integrity crc32c`: a block a member returns wrong without an
//! error is caught by its checksum on every read and check, the client
//! gets the original bytes, the member is healed, and the count and the
//! event name it; more wrong blocks in a row than redundancy is an I/O
//! error, never wrong bytes; the checksums survive a stop and start and
//! are re-derived, without false errors, after writes made elsewhere.

use super::tests::{check_mismatches, wait_idle};
use super::*;
use crate::array::{assemble, create, CreateOptions, MemberSpec};
use crate::format::Metadata;
use crate::geometry::Place;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const PAGE: u64 = 4096;

/// Member files of 6 MiB with an integrity array on them.
fn make(
    dir: &Path,
    level: Level,
    layout: Option<&str>,
    disks: u32,
    chunk_kib: u64,
) -> Vec<PathBuf> {
    make_with(dir, level, layout, disks, chunk_kib, Consistency::Resync)
}

/// How a test array keeps its rows consistent across a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Consistency {
    Resync,
    Bitmap,
    Journal,
}

/// `make`, with a bitmap or a write journal (the last path) as asked.
fn make_with(
    dir: &Path,
    level: Level,
    layout: Option<&str>,
    disks: u32,
    chunk_kib: u64,
    consistency: Consistency,
) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..disks)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            // A dRAID child holds whole slices of its rows.
            let bytes = if level.is_draid() { 72 << 20 } else { 6 << 20 };
            std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
            p
        })
        .collect();
    let options = CreateOptions {
        level,
        raid_disks: disks,
        chunk_bytes: (chunk_kib > 0).then_some(chunk_kib * 1024),
        layout: layout.map(String::from),
        metadata: Metadata::V1_2,
        assume_clean: level.is_draid(),
        name: "cksum".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: true,
    };
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    let journal = dir.join("journal");
    let (journal, bitmap) = match consistency {
        Consistency::Resync => (None, crate::array::BitmapRequest::None),
        Consistency::Bitmap => (
            None,
            crate::array::BitmapRequest::Internal {
                chunk_bytes: Some(64 << 10),
            },
        ),
        Consistency::Journal => {
            std::fs::File::create(&journal)
                .unwrap()
                .set_len(8 << 20)
                .unwrap();
            (Some(journal.as_path()), crate::array::BitmapRequest::None)
        }
    };
    crate::array::create_full(&specs, journal, &options, bitmap, |_, _| {}).unwrap();
    let mut all = paths;
    if consistency == Consistency::Journal {
        all.push(dir.join("journal"));
    }
    all
}

fn start(paths: &[PathBuf]) -> Arc<Engine> {
    let engine = Engine::start(assemble(paths, true).unwrap(), EngineOptions::default()).unwrap();
    wait_idle(&engine);
    engine
}

fn fill(engine: &Arc<Engine>, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut image = vec![0u8; engine.size_bytes() as usize];
    rng.fill(&mut image[..]);
    engine.write(0, &image, false).unwrap();
    engine.flush_members().unwrap();
    image
}

/// A fresh 6 MiB member file added to the array (its rebuild starts).
fn add_new_member(engine: &Arc<Engine>, dir: &Path) -> PathBuf {
    let new = dir.join("new");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    engine.manage_add(&new).unwrap();
    new
}

/// `count` writes of one to three pages at random places, not flushed,
/// kept in `image`.
fn scribble(engine: &Arc<Engine>, image: &mut [u8], seed: u64, count: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..count {
        let at = rng.gen_range(0..image.len() / 4096 - 4) * 4096;
        let mut piece = vec![0u8; 4096 * rng.gen_range(1..4usize)];
        rng.fill(&mut piece[..]);
        engine.write(at as u64, &piece, false).unwrap();
        image[at..at + piece.len()].copy_from_slice(&piece);
    }
}

fn read_all(engine: &Arc<Engine>) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; engine.size_bytes() as usize];
    // In pieces of a few rows, as a client reads.
    for (i, piece) in buf.chunks_mut(64 << 10).enumerate() {
        engine.read(i as u64 * (64 << 10), piece)?;
    }
    Ok(buf)
}

/// Where a place's page lies in its member file.
fn file_offset(paths: &[PathBuf], place: &Place, page: u64) -> (PathBuf, u64) {
    let array = assemble(paths, false).unwrap();
    let slot = array.slots[place.member].as_ref().unwrap();
    let at = slot.data_offset_bytes + place.member_sector * SECTOR_BYTES + page * PAGE;
    (paths[place.member].clone(), at)
}

/// Changes one page of a member file behind the engine's back (bit rot),
/// returning what it held.
fn rot(paths: &[PathBuf], place: &Place, page: u64) -> Vec<u8> {
    let (path, at) = file_offset(paths, place, page);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut before = vec![0u8; PAGE as usize];
    file.read_exact_at(&mut before, at).unwrap();
    let wrong: Vec<u8> = before.iter().map(|b| b ^ 0x5a).collect();
    file.write_all_at(&wrong, at).unwrap();
    file.sync_all().unwrap();
    before
}

fn page_of(paths: &[PathBuf], place: &Place, page: u64) -> Vec<u8> {
    let (path, at) = file_offset(paths, place, page);
    let mut buf = vec![0u8; PAGE as usize];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    buf
}

fn checksum_errors(engine: &Arc<Engine>, path: &Path) -> u64 {
    let snapshot = engine.snapshot();
    let device = snapshot
        .devices
        .iter()
        .find(|d| d.path == path.display().to_string())
        .expect("a device of the array");
    device.checksum_errors.expect("an integrity member")
}

fn events_named(engine: &Arc<Engine>, name: &str) -> Vec<Event> {
    engine
        .snapshot()
        .events
        .into_iter()
        .filter(|e| e.event == name)
        .collect()
}

const LEVELS: [(Level, Option<&str>, u32, u64); 5] = [
    (Level::Raid1, None, 3, 0),
    (Level::Raid5, Some("left-symmetric"), 4, 16),
    (Level::Raid6, Some("left-symmetric"), 5, 16),
    (Level::Raid10, Some("n2"), 4, 16),
    (Level::Raid4, None, 3, 16),
];

#[test]
fn a_rotten_data_block_reads_back_right_and_is_healed_on_every_level() {
    for (level, layout, disks, chunk) in LEVELS {
        let dir = tempfile::tempdir().unwrap();
        let paths = make(dir.path(), level, layout, disks, chunk);
        let engine = start(&paths);
        let image = fill(&engine, 0x33);
        let map = engine.geometry().stripe(3);
        let place = map.data[0].copies[0];
        let before = rot(&paths, &place, 1);
        assert_ne!(page_of(&paths, &place, 1), before);
        assert!(
            read_all(&engine).unwrap() == image,
            "{level}: the client gets the original bytes"
        );
        assert_eq!(
            page_of(&paths, &place, 1),
            before,
            "{level}: the member is healed"
        );
        assert_eq!(checksum_errors(&engine, &paths[place.member]), 1, "{level}");
        let events = events_named(&engine, "ChecksumError");
        assert_eq!(events.len(), 1, "{level}: {events:?}");
        assert_eq!(events[0].device, paths[place.member].display().to_string());
        assert!(read_all(&engine).unwrap() == image, "{level}");
        assert_eq!(
            checksum_errors(&engine, &paths[place.member]),
            1,
            "{level}: healed for good"
        );
        engine.shutdown().unwrap();
    }
}

#[test]
fn check_finds_and_heals_rotten_parity_and_copies() {
    for (level, layout, disks, chunk) in LEVELS {
        let dir = tempfile::tempdir().unwrap();
        let paths = make(dir.path(), level, layout, disks, chunk);
        let engine = start(&paths);
        let image = fill(&engine, 0x34);
        let map = engine.geometry().stripe(2);
        // What a read never touches: parity, or a mirror's second copy.
        let place = map
            .q
            .or(map.p)
            .unwrap_or_else(|| *map.data[0].copies.last().unwrap());
        let before = rot(&paths, &place, 0);
        assert_eq!(
            check_mismatches(&engine),
            0,
            "{level}: healed before it was compared"
        );
        assert_eq!(
            page_of(&paths, &place, 0),
            before,
            "{level}: the check healed it"
        );
        assert_eq!(checksum_errors(&engine, &paths[place.member]), 1, "{level}");
        assert!(read_all(&engine).unwrap() == image, "{level}");
        engine.shutdown().unwrap();
    }
}

#[test]
fn more_rotten_blocks_in_a_row_than_redundancy_is_an_io_error_never_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid5, Some("left-symmetric"), 4, 16);
    let engine = start(&paths);
    let image = fill(&engine, 0x35);
    let map = engine.geometry().stripe(5);
    rot(&paths, &map.data[0].copies[0], 2);
    rot(&paths, &map.data[1].copies[0], 2);
    let at = map.array_sector * SECTOR_BYTES;
    let strip = map.strip_sectors * SECTOR_BYTES;
    let mut buf = vec![0u8; (2 * strip) as usize];
    let result = engine.read(at, &mut buf);
    assert!(
        result.is_err(),
        "two wrong blocks in one raid5 row cannot be corrected"
    );
    // The rest of the array still reads right.
    let mut other = vec![0u8; strip as usize];
    engine.read(0, &mut other).unwrap();
    assert!(other == image[..strip as usize]);
    // No disk is failed for one lost row; the event says what was lost.
    assert!(engine.snapshot().runnable);
    assert!(engine.table().in_sync().iter().all(|s| *s));
    assert!(events_named(&engine, "Fail").is_empty());
    assert_eq!(events_named(&engine, "ChecksumUncorrectable").len(), 1);
    // A check goes on past it and ends.
    check_mismatches(&engine);
    assert!(engine.table().in_sync().iter().all(|s| *s));
}

#[test]
fn the_checksums_survive_a_stop_and_start() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid6, Some("left-symmetric"), 5, 16);
    let engine = start(&paths);
    let image = fill(&engine, 0x36);
    engine.shutdown().unwrap();
    drop(engine);
    let engine = start(&paths);
    assert!(events_named(&engine, "IntegrityStale").is_empty());
    assert!(events_named(&engine, "IntegrityUnclean").is_empty());
    let map = engine.geometry().stripe(7);
    let place = map.data[1].copies[0];
    let before = rot(&paths, &place, 3);
    assert!(read_all(&engine).unwrap() == image);
    assert_eq!(page_of(&paths, &place, 3), before);
    assert_eq!(checksum_errors(&engine, &paths[place.member]), 1);
    engine.shutdown().unwrap();
}

#[test]
fn writes_made_elsewhere_are_rederived_without_false_errors() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid5, Some("left-symmetric"), 4, 16);
    let engine = start(&paths);
    fill(&engine, 0x37);
    engine.shutdown().unwrap();
    drop(engine);
    // Another md runs the array, unaware of the checksums: the members
    // without their layer (as the kernel sees them), new data written.
    let mut array = assemble(&paths, true).unwrap();
    for slot in array.slots.iter_mut().flatten() {
        let inner = slot.member.integrity().unwrap().inner().clone();
        slot.member = inner;
    }
    for device in array.devices.iter_mut() {
        if let Some(i) = device.member.integrity() {
            device.member = i.inner().clone();
        }
    }
    array.integrity.clear();
    let elsewhere = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&elsewhere);
    let image = fill(&elsewhere, 0x38);
    elsewhere.shutdown().unwrap();
    drop(elsewhere);
    let engine = start(&paths);
    let stale = events_named(&engine, "IntegrityStale");
    assert_eq!(stale.len(), 4, "{stale:?}");
    wait_idle(&engine);
    for d in engine.snapshot().devices {
        assert_eq!(
            d.untrusted_blocks,
            Some(0),
            "the check derived every row: {}",
            d.path
        );
    }
    // The check started at open has derived them again.
    assert!(read_all(&engine).unwrap() == image);
    assert!(events_named(&engine, "ChecksumError").is_empty());
    for d in engine.snapshot().devices {
        assert_eq!(d.checksum_errors, Some(0), "{}", d.path);
    }
    // And they are trusted again: rot is caught.
    let map = engine.geometry().stripe(1);
    let place = map.data[0].copies[0];
    let before = rot(&paths, &place, 0);
    assert!(read_all(&engine).unwrap() == image);
    assert_eq!(page_of(&paths, &place, 0), before);
    engine.shutdown().unwrap();
}

#[test]
fn a_member_that_keeps_returning_bad_data_is_failed() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid5, Some("left-symmetric"), 4, 16);
    let engine = start(&paths);
    let image = fill(&engine, 0x39);
    let geometry = engine.geometry();
    // Rot on role 1 in many rows: each corrected read is one error.
    let mut rotten = 0;
    for stripe in 0..geometry.stripe_count() {
        let map = geometry.stripe(stripe);
        if let Some(d) = map.data.iter().find(|d| d.copies[0].member == 1) {
            rot(&paths, &d.copies[0], 0);
            rotten += 1;
        }
        if rotten > super::integrity::CHECKSUM_ERRORS_TOLERATED + 2 {
            break;
        }
    }
    assert!(
        read_all(&engine).unwrap() == image,
        "every byte right, failed member or not"
    );
    let fails = events_named(&engine, "Fail");
    assert_eq!(fails.len(), 1, "{fails:?}");
    assert!(
        fails[0].detail.contains("checksum errors"),
        "{}",
        fails[0].detail
    );
    assert!(!engine.table().in_sync()[1]);
}

#[test]
fn create_refuses_integrity_without_redundancy_or_with_metadata_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("m{i}"));
            std::fs::File::create(&p).unwrap().set_len(6 << 20).unwrap();
            p
        })
        .collect();
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    let mut options = CreateOptions {
        level: Level::Raid0,
        raid_disks: 2,
        chunk_bytes: None,
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "x".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: true,
    };
    let e = create(&specs, &options, |_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("redundancy"), "{e}");
    options.level = Level::Raid1;
    options.metadata = Metadata::V1_0;
    let e = create(&specs, &options, |_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("metadata 1.1 or 1.2"), "{e}");
    // Nothing was written.
    assert!(crate::array::read_superblock(
        &*crate::member::open(&paths[0], Default::default()).unwrap()
    )
    .unwrap()
    .is_none());
}

#[test]
fn a_member_added_to_an_integrity_array_gets_checksums_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid5, Some("left-symmetric"), 4, 16);
    let engine = start(&paths);
    let image = fill(&engine, 0x3a);
    engine.manage_fail(&paths[2]).unwrap();
    engine.manage_remove(&paths[2]).unwrap();
    let new = add_new_member(&engine, dir.path());
    wait_idle(&engine);
    assert!(engine.table().in_sync().iter().all(|s| *s));
    let snapshot = engine.snapshot();
    let added = snapshot
        .devices
        .iter()
        .find(|d| d.path == new.display().to_string())
        .unwrap();
    assert_eq!(added.checksum_errors, Some(0));
    assert_eq!(
        added.untrusted_blocks,
        Some(0),
        "the rebuild wrote every row"
    );
    // Rot on the new member is caught and healed like on any other.
    let mut all = paths.clone();
    all[2] = new.clone();
    let map = engine.geometry().stripe(4);
    let place = *map
        .data
        .iter()
        .flat_map(|d| d.copies.iter())
        .chain(map.p.iter())
        .find(|p| p.member == 2)
        .unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let before = rot(&all, &place, 1);
    let engine = start(&all);
    assert!(events_named(&engine, "IntegrityStale").is_empty());
    assert_eq!(check_mismatches(&engine), 0);
    assert_eq!(page_of(&all, &place, 1), before);
    assert_eq!(checksum_errors(&engine, &new), 1);
    assert!(read_all(&engine).unwrap() == image);
    engine.shutdown().unwrap();
}

#[test]
fn draid_reads_and_checks_heal_rotten_blocks_too() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(
        dir.path(),
        Level::from_number(-102).unwrap(),
        Some("2d:1s"),
        6,
        64,
    );
    let engine = start(&paths);
    let image = fill(&engine, 0x3b);
    let map = engine.geometry().stripe(2);
    let data = map.data[1].copies[0];
    let parity = map.q.unwrap();
    let before_data = rot(&paths, &data, 0);
    let before_parity = rot(&paths, &parity, 5);
    assert!(read_all(&engine).unwrap() == image);
    assert_eq!(page_of(&paths, &data, 0), before_data);
    assert_eq!(check_mismatches(&engine), 0);
    assert_eq!(page_of(&paths, &parity, 5), before_parity);
    assert_eq!(events_named(&engine, "ChecksumError").len(), 2);
    engine.shutdown().unwrap();
}

#[test]
fn a_new_array_has_every_block_it_uses_checksummed() {
    for (level, layout, disks, chunk) in LEVELS {
        let dir = tempfile::tempdir().unwrap();
        let paths = make(dir.path(), level, layout, disks, chunk);
        let engine = start(&paths);
        for d in engine.snapshot().devices {
            assert_eq!(d.untrusted_blocks, Some(0), "{level}: {}", d.path);
        }
        engine.shutdown().unwrap();
    }
}

/// A raid5 without checksums on 6 MiB files, using `size_sectors` of
/// each (None: all).
fn make_plain(dir: &Path, size_sectors: Option<u64>) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..4)
        .map(|i| {
            let p = dir.join(format!("p{i}"));
            std::fs::File::create(&p).unwrap().set_len(6 << 20).unwrap();
            p
        })
        .collect();
    let options = CreateOptions {
        level: Level::Raid5,
        raid_disks: 4,
        chunk_bytes: Some(16 << 10),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: false,
        name: "plain".into(),
        size_sectors,
        force: false,
        homehost: None,
        integrity: false,
    };
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    create(&specs, &options, |_, _| {}).unwrap();
    paths
}

fn opened(paths: &[PathBuf]) -> Vec<(String, crate::member::MemberRef)> {
    crate::array::open_members(paths, true).unwrap()
}

#[test]
fn an_existing_array_with_room_gets_checksums_and_can_drop_them() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_plain(dir.path(), Some(8192));
    let engine = start(&paths);
    let image = fill(&engine, 0x3c);
    engine.shutdown().unwrap();
    drop(engine);
    let said = crate::array::integrity::enable(opened(&paths)).unwrap();
    assert!(said.contains("4 members"), "{said}");
    let engine = start(&paths);
    assert!(events_named(&engine, "IntegrityStale").is_empty());
    for d in engine.snapshot().devices {
        assert_eq!(d.untrusted_blocks, Some(0), "{}", d.path);
    }
    let map = engine.geometry().stripe(6);
    let place = map.data[2].copies[0];
    let before = rot(&paths, &place, 0);
    assert!(read_all(&engine).unwrap() == image);
    assert_eq!(page_of(&paths, &place, 0), before);
    engine.shutdown().unwrap();
    drop(engine);
    let e = crate::array::integrity::enable(opened(&paths)).unwrap_err();
    assert!(e.contains("already"), "{e}");
    crate::array::integrity::disable(opened(&paths)).unwrap();
    let engine = start(&paths);
    assert!(engine
        .snapshot()
        .devices
        .iter()
        .all(|d| d.checksum_errors.is_none()));
    assert!(read_all(&engine).unwrap() == image);
    assert_eq!(check_mismatches(&engine), 0);
    engine.shutdown().unwrap();
}

#[test]
fn an_array_without_room_for_checksums_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_plain(dir.path(), None);
    let before: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let e = crate::array::integrity::enable(opened(&paths)).unwrap_err();
    assert!(e.contains("no room for checksums"), "{e}");
    let after: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(before == after, "nothing written");
}

#[test]
fn a_crash_raises_no_false_checksum_error_with_a_bitmap_without_one_or_with_a_journal() {
    for consistency in [
        Consistency::Bitmap,
        Consistency::Resync,
        Consistency::Journal,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_with(
            dir.path(),
            Level::Raid5,
            Some("left-symmetric"),
            4,
            16,
            consistency,
        );
        let engine = start(&paths);
        let mut image = fill(&engine, 0x3d);
        // Writes after the last flush: their checksum pages are in memory
        // only when the crash comes.
        scribble(&engine, &mut image, 0x3e, 40);
        super::tests::crash(engine);
        let engine = start(&paths);
        let unclean = events_named(&engine, "IntegrityUnclean");
        assert_eq!(unclean.len(), 4, "{consistency:?}: {unclean:?}");
        assert!(read_all(&engine).unwrap() == image, "{consistency:?}");
        wait_idle(&engine);
        for d in engine
            .snapshot()
            .devices
            .iter()
            .filter(|d| !d.path.ends_with("journal"))
        {
            assert_eq!(d.untrusted_blocks, Some(0), "{consistency:?}: {}", d.path);
        }
        assert!(
            events_named(&engine, "ChecksumError").is_empty(),
            "{consistency:?}: {:?}",
            events_named(&engine, "ChecksumError")
        );
        // Protection is back once the window is derived: rot is caught.
        let map = engine.geometry().stripe(9);
        let place = map.data[0].copies[0];
        let before = rot(&paths, &place, 1);
        assert!(read_all(&engine).unwrap() == image, "{consistency:?}");
        assert_eq!(page_of(&paths, &place, 1), before, "{consistency:?}");
        engine.shutdown().unwrap();
    }
}

#[test]
fn blocks_a_degraded_pass_could_not_derive_are_derived_once_the_array_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make(dir.path(), Level::Raid5, Some("left-symmetric"), 4, 16);
    let engine = start(&paths);
    let mut image = fill(&engine, 0x3f);
    engine.manage_fail(&paths[2]).unwrap();
    engine.manage_remove(&paths[2]).unwrap();
    scribble(&engine, &mut image, 0x40, 20);
    super::tests::crash(engine);
    // Degraded after a crash: no parity is left over to tell a rotten block
    // from a good one, so what the crash left untrusted stays so.
    let survivors: Vec<PathBuf> = paths
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, p)| p.clone())
        .collect();
    // md refuses a dirty degraded raid5 unless forced (--run --force).
    let forced = EngineOptions {
        force: true,
        ..EngineOptions::default()
    };
    let engine = Engine::start(assemble(&survivors, true).unwrap(), forced).unwrap();
    wait_idle(&engine);
    assert!(read_all(&engine).unwrap() == image);
    let untrusted: u64 = engine
        .snapshot()
        .devices
        .iter()
        .map(|d| d.untrusted_blocks.unwrap())
        .sum();
    assert!(untrusted > 0, "a degraded raid5 derives nothing");
    add_new_member(&engine, dir.path());
    // The rebuild, then the check that starts by itself as it ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while engine
        .snapshot()
        .devices
        .iter()
        .any(|d| d.untrusted_blocks != Some(0))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "still untrusted: {:?}",
            engine.snapshot().devices
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    wait_idle(&engine);
    let checks = events_named(&engine, "RebuildFinished");
    assert!(
        checks.iter().any(|e| e.detail.starts_with("check")),
        "{checks:?}"
    );
    assert!(events_named(&engine, "ChecksumError").is_empty());
    assert!(read_all(&engine).unwrap() == image);
    engine.shutdown().unwrap();
}
