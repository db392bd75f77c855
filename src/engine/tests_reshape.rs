//! The reshape job on image files: the array keeps every byte while it
//! moves to the new geometry under concurrent writes, and ends in md's
//! format with consistent parity.

use super::tests::assemble_after_crash;
use super::*;
use crate::array::{assemble, create, CreateOptions, MemberSpec, ReshapeRequest};
use crate::format::Metadata;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `disks` members and `spares` spares of `member_mib` MiB each.
pub(super) fn array_with_spares(
    dir: &std::path::Path,
    level: Level,
    disks: u32,
    spares: u32,
    chunk_kib: u64,
    member_mib: u64,
) -> Vec<PathBuf> {
    sized_array(dir, level, (disks, spares), chunk_kib, member_mib, None)
}

/// `array_with_spares` using `size_sectors` of each member (create --size).
pub(super) fn sized_array(
    dir: &std::path::Path,
    level: Level,
    (disks, spares): (u32, u32),
    chunk_kib: u64,
    member_mib: u64,
    size_sectors: Option<u64>,
) -> Vec<PathBuf> {
    let options = CreateOptions {
        level,
        raid_disks: disks,
        chunk_bytes: (chunk_kib > 0).then_some(chunk_kib * 1024),
        layout: None,
        metadata: Metadata::V1_2,
        assume_clean: true,
        name: "reshape".into(),
        size_sectors,
        force: false,
        homehost: None,
        integrity: false,
    };
    array_with_options(dir, &options, spares, member_mib)
}

/// An array created with `options`, and `spares` spares, on members of
/// `member_mib` MiB each.
pub(super) fn array_with_options(
    dir: &std::path::Path,
    options: &CreateOptions,
    spares: u32,
    member_mib: u64,
) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..options.raid_disks + spares)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(member_mib << 20)
                .unwrap();
            p
        })
        .collect();
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    create(&specs, options, |_, _| {}).unwrap();
    paths
}

pub(super) fn wait_reshaped(engine: &Arc<Engine>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while engine.geometry().reshaping().is_some() || engine.snapshot().sync.is_some() {
        assert!(
            Instant::now() < deadline,
            "reshape did not end: {:?}",
            engine.snapshot().events
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(super) fn random_image(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// One random write of up to `max_sectors`, applied to `image` too.
pub(super) fn write_random(
    engine: &Engine,
    rng: &mut rand::rngs::StdRng,
    image: &mut [u8],
    max_sectors: usize,
) {
    let len = rng.gen_range(1..max_sectors) * 512;
    let at = rng.gen_range(0..(image.len() - len) / 512) * 512;
    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    engine.write(at as u64, &data, false).unwrap();
    image[at..at + len].copy_from_slice(&data);
}

/// Lets the reshape run at full speed to its end, then reads the array's
/// first `image.len()` bytes back.
pub(super) fn finish_and_compare(engine: &Arc<Engine>, image: &[u8], what: &str) {
    engine.set_speed_limits(None, Some(200_000));
    wait_reshaped(engine);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "{what}: bytes changed by the reshape");
}

#[test]
fn a_grow_keeps_every_byte_and_ends_in_the_new_geometry() {
    for (level, disks, chunk_kib, request) in [
        (
            Level::Raid5,
            4,
            64,
            ReshapeRequest {
                raid_devices: Some(5),
                ..Default::default()
            },
        ),
        (
            Level::Raid6,
            5,
            32,
            ReshapeRequest {
                raid_devices: Some(7),
                ..Default::default()
            },
        ),
        (
            Level::Raid5,
            4,
            64,
            ReshapeRequest {
                chunk_sectors: Some(256),
                ..Default::default()
            },
        ),
        (
            Level::Raid5,
            4,
            64,
            ReshapeRequest {
                layout: Some(0),
                ..Default::default()
            },
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let spares = request.raid_devices.map_or(0, |n| n - disks);
        let paths = array_with_spares(dir.path(), level, disks, spares, chunk_kib, 12);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let old_size = engine.size_bytes() as usize;
        let mut image = random_image(old_size, 7);
        engine.write(0, &image, false).unwrap();
        engine.set_speed_limits(Some(1000), Some(8000));
        engine.start_reshape(&request).unwrap();
        // Writes while it moves, on both sides of the point.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        while engine.geometry().reshaping().is_some() {
            write_random(&engine, &mut rng, &mut image, 64);
            std::thread::sleep(Duration::from_millis(1));
        }
        finish_and_compare(&engine, &image, &format!("{level} {request:?}"));
        let new_size = engine.size_bytes() as usize;
        assert!(new_size >= old_size);
        let mut tail = vec![0u8; new_size - old_size];
        engine.read(old_size as u64, &mut tail).unwrap();
        assert!(tail.iter().all(|b| *b == 0), "the grown part reads zeroes");
        engine.shutdown().unwrap();
        drop(engine);
        super::tests::check_consistent(&paths);
        let array = assemble(&paths, false).unwrap();
        assert!(array.geometry.reshaping().is_none());
        assert_eq!(array.geometry.array_sectors() as usize * 512, new_size);
    }
}

#[test]
fn a_member_failing_mid_reshape_loses_nothing_and_is_rebuilt_after() {
    let dir = tempfile::tempdir().unwrap();
    // raid6 5 -> 6, one spare for the new role and one for the failure.
    let paths = array_with_spares(dir.path(), Level::Raid6, 5, 2, 32, 16);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let old_size = engine.size_bytes() as usize;
    let mut image = random_image(old_size, 21);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(4000));
    engine
        .start_reshape(&ReshapeRequest {
            raid_devices: Some(6),
            ..Default::default()
        })
        .unwrap();
    // Once the point has moved, a member fails (md goes on degraded).
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine
        .geometry()
        .reshaping()
        .is_some_and(|r| r.position_sectors() == 0)
    {
        assert!(Instant::now() < deadline, "the reshape does not move");
        std::thread::sleep(Duration::from_millis(5));
    }
    engine.fail_member(2, "failed by the test");
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    for _ in 0..200 {
        write_random(&engine, &mut rng, &mut image, 32);
    }
    finish_and_compare(&engine, &image, "a member lost mid-reshape");
    // The spare takes the failed role once the reshape has ended.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !engine.snapshot().missing_roles.is_empty() || engine.snapshot().sync.is_some() {
        assert!(Instant::now() < deadline, "{:?}", engine.snapshot().events);
        std::thread::sleep(Duration::from_millis(5));
    }
    let snapshot = engine.snapshot();
    assert!(snapshot.missing_roles.is_empty(), "{:?}", snapshot.events);
    // md recovers nothing while it reshapes: the recovery starts after.
    let events: Vec<&str> = snapshot.events.iter().map(|e| e.event.as_str()).collect();
    let reshaped = snapshot
        .events
        .iter()
        .position(|e| e.event == "RebuildFinished" && e.detail == "reshape");
    let recovered = snapshot
        .events
        .iter()
        .rposition(|e| e.event == "SpareActive");
    assert!(reshaped.is_some() && recovered > reshaped, "{events:?}");
    assert!(!events.contains(&"RebuildFailed"), "{events:?}");
    engine.shutdown().unwrap();
    drop(engine);
    super::tests::check_consistent(&paths);
}

#[test]
fn a_raid1_shrinks_by_packing_its_members_and_assembles_so() {
    let dir = tempfile::tempdir().unwrap();
    let paths = array_with_spares(dir.path(), Level::Raid1, 3, 0, 0, 8);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let image = random_image(engine.size_bytes() as usize, 31);
    engine.write(0, &image, false).unwrap();
    // The member in role 0 leaves: roles 1 and 2 become 0 and 1.
    engine.manage_fail(&paths[0]).unwrap();
    engine.manage_remove(&paths[0]).unwrap();
    let two = ReshapeRequest {
        raid_devices: Some(2),
        ..Default::default()
    };
    engine.start_reshape(&two).unwrap();
    let snapshot = engine.snapshot();
    assert!(snapshot.missing_roles.is_empty(), "{:?}", snapshot.events);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "bytes changed by the shrink");
    engine.shutdown().unwrap();
    drop(engine);
    let array = assemble(&paths[1..], false).unwrap();
    assert_eq!(array.geometry.raid_disks(), 2);
    assert!(array.missing_roles().is_empty());
    assert_eq!(
        array
            .devices
            .iter()
            .map(|d| d.state.clone())
            .collect::<Vec<_>>(),
        vec![
            DeviceState::Active { role: 0 },
            DeviceState::Active { role: 1 }
        ]
    );
}

/// Drops the engine as a crash would (no shutdown: no clean state, the
/// reshape's point only as the last window recorded it) and waits for
/// its threads to let go.
pub(super) fn crash(engine: Arc<Engine>) {
    let weak = Arc::downgrade(&engine);
    drop(engine);
    let deadline = Instant::now() + Duration::from_secs(60);
    while weak.strong_count() > 0 {
        assert!(Instant::now() < deadline, "the engine outlives its drop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_reshape_crashed_at_random_points_resumes_and_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let paths = array_with_spares(dir.path(), Level::Raid5, 4, 1, 32, 12);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let old_size = engine.size_bytes() as usize;
    let mut image = random_image(old_size, 41);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(6000));
    engine
        .start_reshape(&ReshapeRequest {
            raid_devices: Some(5),
            ..Default::default()
        })
        .unwrap();
    let engine = crash_until_done(engine, &paths, &mut image, 43);
    engine.shutdown().unwrap();
    drop(engine);
    super::tests::check_consistent(&paths);
    let array = assemble(&paths, false).unwrap();
    assert!(array.geometry.reshaping().is_none());
    assert_eq!(array.geometry.raid_disks(), 5);
}

/// Crashes a running reshape a few times at random points between random
/// writes (acknowledged before the crash, so they must survive it),
/// restarting the engine each time, then lets it end and checks every
/// byte. Returns the engine once the resync the crashes owe has ended.
pub(super) fn crash_until_done(
    engine: Arc<Engine>,
    paths: &[PathBuf],
    image: &mut [u8],
    seed: u64,
) -> Arc<Engine> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut engine = engine;
    let mut crashes = 0;
    while engine.geometry().reshaping().is_some() && crashes < 6 {
        for _ in 0..rng.gen_range(5..40) {
            write_random(&engine, &mut rng, image, 32);
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(10..200)));
        crash(engine);
        crashes += 1;
        let array = assemble_after_crash(paths);
        engine = Engine::start(array, EngineOptions::default()).unwrap();
        engine.set_speed_limits(Some(1000), Some(6000));
    }
    assert!(
        crashes >= 2,
        "the reshape ended before it could be crashed twice"
    );
    finish_and_compare(&engine, image, "crashed reshape");
    // The crash left the array unclean: a resync follows the reshape.
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.snapshot().sync.is_some() {
        assert!(
            Instant::now() < deadline,
            "the resync after the reshape did not end"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    engine
}

/// Waits for every background job (reshape, recovery) to end.
fn wait_idle(engine: &Arc<Engine>) {
    engine.set_speed_limits(None, Some(200_000));
    let deadline = Instant::now() + Duration::from_secs(120);
    while engine.geometry().reshaping().is_some()
        || engine.snapshot().sync.is_some()
        || engine.reshape_running()
    {
        assert!(
            Instant::now() < deadline,
            "jobs did not end: {:?}",
            engine.snapshot().events
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn level_changes_keep_every_byte_and_end_in_the_new_level() {
    use crate::geometry::{LEFT_SYMMETRIC, PARITY_N};
    // (from, members, spares, chunk KiB, to, raid_devices, layout) and the
    // shape expected: level, members in use, layout.
    type Case = (
        Level,
        u32,
        u32,
        u64,
        Level,
        Option<u32>,
        Option<u32>,
        (Level, usize, u32),
    );
    let cases: [Case; 8] = [
        (
            Level::Raid5,
            4,
            1,
            64,
            Level::Raid6,
            None,
            None,
            (Level::Raid6, 5, LEFT_SYMMETRIC),
        ),
        (
            Level::Raid5,
            4,
            1,
            64,
            Level::Raid6,
            Some(5),
            Some(PARITY_N),
            (Level::Raid6, 5, PARITY_N),
        ),
        (
            Level::Raid6,
            5,
            0,
            64,
            Level::Raid5,
            None,
            None,
            (Level::Raid5, 4, LEFT_SYMMETRIC),
        ),
        (
            Level::Raid0,
            3,
            1,
            64,
            Level::Raid5,
            None,
            None,
            (Level::Raid5, 4, LEFT_SYMMETRIC),
        ),
        (
            Level::Raid0,
            3,
            0,
            64,
            Level::Raid4,
            None,
            None,
            (Level::Raid4, 4, PARITY_N),
        ),
        (
            Level::Raid5,
            4,
            0,
            64,
            Level::Raid0,
            None,
            None,
            (Level::Raid0, 3, 0),
        ),
        (
            Level::Raid1,
            2,
            1,
            0,
            Level::Raid5,
            Some(3),
            None,
            (Level::Raid5, 3, LEFT_SYMMETRIC),
        ),
        (
            Level::Raid5,
            2,
            0,
            64,
            Level::Raid1,
            None,
            None,
            (Level::Raid1, 2, 0),
        ),
    ];
    for (from, disks, spares, chunk_kib, to, raid_devices, layout, (level, members, end_layout)) in
        cases
    {
        let what = format!("{from} {disks}+{spares} -> {to}");
        let dir = tempfile::tempdir().unwrap();
        let paths = array_with_spares(dir.path(), from, disks, spares, chunk_kib, 12);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let size = engine.size_bytes() as usize;
        let mut image = random_image(size, 51);
        engine.write(0, &image, false).unwrap();
        engine.set_speed_limits(Some(1000), Some(8000));
        let request = ReshapeRequest {
            level: Some(to.md_number()),
            raid_devices,
            layout,
            ..Default::default()
        };
        engine
            .start_reshape(&request)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(53);
        while engine.geometry().reshaping().is_some() {
            write_random(&engine, &mut rng, &mut image, 64);
            std::thread::sleep(Duration::from_millis(1));
        }
        wait_idle(&engine);
        let mut back = vec![0u8; size];
        engine.read(0, &mut back).unwrap();
        assert!(back == image, "{what}: bytes changed");
        assert_eq!(engine.geometry().level(), level, "{what}");
        assert_eq!(engine.geometry().raid_disks(), members, "{what}");
        let snapshot = engine.snapshot();
        // raid0 to raid4 without a spare stays degraded, as md leaves it.
        let degraded = from == Level::Raid0 && spares == 0;
        assert_eq!(
            !snapshot.missing_roles.is_empty(),
            degraded,
            "{what}: {:?}",
            snapshot.events
        );
        engine.shutdown().unwrap();
        drop(engine);
        if !degraded && level.has_parity() {
            super::tests::check_consistent(&paths);
        }
        let kept: Vec<PathBuf> = paths
            .iter()
            .take(members.max(disks as usize) + spares as usize)
            .cloned()
            .collect();
        let array = assemble(&kept, true).unwrap();
        assert!(array.geometry.reshaping().is_none(), "{what}");
        assert_eq!(array.level(), level, "{what}");
        assert_eq!(array.sb.layout, end_layout, "{what}");
        assert!(
            array.geometry.array_sectors() as usize * 512 >= size,
            "{what}: {} < {size}",
            array.geometry.array_sectors() * 512
        );
    }
}

#[test]
fn a_raid0_becomes_raid5_degraded_and_a_spare_added_during_it_is_rebuilt_after() {
    let dir = tempfile::tempdir().unwrap();
    let paths = array_with_spares(dir.path(), Level::Raid0, 3, 0, 64, 12);
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(12 << 20)
        .unwrap();
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let size = engine.size_bytes() as usize;
    let mut image = random_image(size, 61);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(8000));
    engine
        .start_reshape(&ReshapeRequest {
            level: Some(5),
            ..Default::default()
        })
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(63);
    for _ in 0..50 {
        write_random(&engine, &mut rng, &mut image, 64);
    }
    engine.manage_add(&spare).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.geometry().reshaping().is_some() {
        assert!(Instant::now() < deadline, "{:?}", engine.snapshot().events);
        write_random(&engine, &mut rng, &mut image, 64);
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_idle(&engine);
    let snapshot = engine.snapshot();
    assert!(snapshot.missing_roles.is_empty(), "{:?}", snapshot.events);
    let mut back = vec![0u8; size];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "bytes changed");
    engine.shutdown().unwrap();
    drop(engine);
    let mut all = paths.clone();
    all.push(spare);
    super::tests::check_consistent(&all);
}

#[test]
fn a_spare_added_mid_reshape_records_the_move_so_a_restart_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = array_with_spares(dir.path(), Level::Raid5, 4, 1, 32, 12);
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(12 << 20)
        .unwrap();
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let size = engine.size_bytes() as usize;
    let image = random_image(size, 71);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(2000));
    engine
        .start_reshape(&ReshapeRequest {
            raid_devices: Some(5),
            ..Default::default()
        })
        .unwrap();
    engine.manage_add(&spare).unwrap();
    assert!(
        engine.geometry().reshaping().is_some(),
        "the reshape ended too soon"
    );
    engine.shutdown().unwrap();
    drop(engine);
    // The spare's superblock is as fresh as the members' and may speak for
    // the array: it must say the data moves as theirs do.
    let mut all = paths.clone();
    all.push(spare);
    let engine = Engine::start(assemble(&all, true).unwrap(), EngineOptions::default()).unwrap();
    finish_and_compare(
        &engine,
        &image,
        "reshape resumed with a spare added during it",
    );
    engine.shutdown().unwrap();
}
