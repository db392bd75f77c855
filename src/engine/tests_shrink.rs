//! Shrinks on image files: removing members runs the reshape backwards, the
//! array keeps every byte below its new size under concurrent writes, a
//! crash at any point resumes, and the result is md's: new shape, data
//! offset moved up, the removed members spares.

use super::tests::assemble_after_crash;
use super::tests_reshape::{crash, random_image, sized_array, wait_reshaped};
use super::*;
use crate::array::{assemble, ReshapeRequest};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Duration;

/// `disks` members of `member_mib` MiB, the array using `used_mib` of each
/// so that the data has room to move up.
fn array(
    dir: &std::path::Path,
    level: Level,
    disks: u32,
    member_mib: u64,
    used_mib: Option<u64>,
) -> Vec<PathBuf> {
    sized_array(
        dir,
        level,
        (disks, 0),
        64,
        member_mib,
        used_mib.map(|m| m << 11),
    )
}

fn write_random(engine: &Engine, rng: &mut rand::rngs::StdRng, image: &mut [u8]) {
    let len = rng.gen_range(1..48) * 512;
    let at = rng.gen_range(0..(image.len() - len) / 512) * 512;
    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
    engine.write(at as u64, &data, false).unwrap();
    image[at..at + len].copy_from_slice(&data);
}

/// The size the array has with `disks` members, as the planner wants it
/// stated.
fn shrink_to(engine: &Engine, disks: u32) -> ReshapeRequest {
    let old = engine.geometry();
    let data = |n: u32| u64::from(n) - old.level().parity_members() as u64;
    let old_data = data(old.raid_disks() as u32);
    ReshapeRequest {
        raid_devices: Some(disks),
        array_sectors: Some(old.array_sectors() / old_data * data(disks)),
        ..Default::default()
    }
}

#[test]
fn a_shrink_keeps_every_byte_below_the_new_size_and_frees_the_removed_members() {
    // With the count, the chunk may change too (the larger one is md's
    // unit of work).
    for (level, disks, to, chunk_sectors) in [
        (Level::Raid5, 5, 4, None),
        (Level::Raid6, 6, 5, None),
        (Level::Raid5, 4, 2, None),
        (Level::Raid5, 5, 4, Some(256)),
        (Level::Raid6, 6, 5, Some(64)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let paths = array(dir.path(), level, disks, 16, Some(12));
        let before = assemble(&paths, false).unwrap();
        let old_offset = before.devices[0].sb.data_offset_sectors;
        drop(before);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let mut image = random_image(engine.size_bytes() as usize, 3);
        engine.write(0, &image, false).unwrap();
        engine.set_speed_limits(Some(1000), Some(8000));
        let request = ReshapeRequest {
            chunk_sectors,
            ..shrink_to(&engine, to)
        };
        engine.start_reshape(&request).unwrap();
        let new_size = engine.size_bytes() as usize;
        assert_eq!(new_size as u64, request.array_sectors.unwrap() * 512);
        image.truncate(new_size);
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        while engine.geometry().reshaping().is_some() {
            write_random(&engine, &mut rng, &mut image);
            std::thread::sleep(Duration::from_millis(1));
        }
        engine.set_speed_limits(None, Some(200_000));
        engine.set_speed_limits(None, Some(200_000));
        wait_reshaped(&engine);
        let mut back = vec![0u8; new_size];
        engine.read(0, &mut back).unwrap();
        assert!(
            back == image,
            "{level} {disks}->{to}: bytes changed by the shrink"
        );
        engine.shutdown().unwrap();
        drop(engine);
        super::tests::check_consistent(&paths[..to as usize]);
        let array = assemble(&paths, false).unwrap();
        assert!(array.geometry.reshaping().is_none());
        assert_eq!(array.geometry.raid_disks(), to as usize);
        assert_eq!(array.geometry.array_sectors() as usize * 512, new_size);
        let states: Vec<DeviceState> = array.devices.iter().map(|d| d.state.clone()).collect();
        for (i, state) in states.iter().enumerate() {
            let expected = if i < to as usize {
                DeviceState::Active { role: i }
            } else {
                DeviceState::Spare
            };
            assert_eq!(state, &expected, "{level} {disks}->{to}: {states:?}");
        }
        let shift = array.devices[0].sb.data_offset_sectors - old_offset;
        assert!(shift > 0, "the data moved up");
        for device in &array.devices {
            let sb = &device.sb;
            assert_eq!(sb.data_offset_sectors, old_offset + shift);
            assert_eq!(sb.data_offset_sectors + sb.data_size_sectors, 16 << 11);
        }
    }
}

#[test]
fn a_shrink_crashed_at_random_points_resumes_and_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let paths = array(dir.path(), Level::Raid5, 5, 16, Some(12));
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let mut image = random_image(engine.size_bytes() as usize, 13);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(6000));
    engine.start_reshape(&shrink_to(&engine, 4)).unwrap();
    image.truncate(engine.size_bytes() as usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut engine = engine;
    let mut crashes = 0;
    while engine.geometry().reshaping().is_some() && crashes < 6 {
        for _ in 0..rng.gen_range(5..40) {
            write_random(&engine, &mut rng, &mut image);
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(10..200)));
        crash(engine);
        crashes += 1;
        engine = Engine::start(assemble_after_crash(&paths), EngineOptions::default()).unwrap();
        engine.set_speed_limits(Some(1000), Some(6000));
    }
    assert!(
        crashes >= 2,
        "the shrink ended before it could be crashed twice"
    );
    engine.set_speed_limits(None, Some(200_000));
    wait_reshaped(&engine);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image, "bytes changed by the crashed shrink");
    engine.shutdown().unwrap();
    drop(engine);
    super::tests::check_consistent(&paths[..4]);
}

#[test]
fn a_shrink_is_refused_in_one_line_without_its_size_or_room_or_members() {
    let dir = tempfile::tempdir().unwrap();
    // The array uses all of each member: no room after the data.
    let full = array(dir.path(), Level::Raid6, 5, 8, None);
    let engine = Engine::start(assemble(&full, true).unwrap(), EngineOptions::default()).unwrap();
    let stated = shrink_to(&engine, 4);
    let unstated = ReshapeRequest {
        array_sectors: None,
        ..stated.clone()
    };
    let wrong = ReshapeRequest {
        array_sectors: Some(stated.array_sectors.unwrap() - 128),
        ..stated.clone()
    };
    for (request, expected) in [
        (unstated, "this change will reduce the size of the array"),
        (wrong, "--array-size"),
        (stated, "not enough room after the data"),
        (shrink_to(&engine, 3), "at least 4 members"),
    ] {
        let refusal = engine.start_reshape(&request).unwrap_err();
        assert!(refusal.contains(expected), "{request:?}: {refusal}");
        assert!(!refusal.contains('\n'), "{refusal}");
        assert!(engine.geometry().reshaping().is_none());
    }
    engine.shutdown().unwrap();
}
