//! The reshape job on raid10 arrays: every byte kept under concurrent
//! writes and crashes, copies consistent at the end, md's superblock
//! fields while it runs, and md's refusals.

use super::tests_reshape::{
    array_with_options, crash, crash_until_done, finish_and_compare, random_image, write_random,
};
use super::*;
use crate::array::{assemble, CreateOptions, ReshapeRequest};
use crate::format::{Metadata, MD_FEATURE_NEW_OFFSET, MD_FEATURE_RESHAPE_ACTIVE};
use rand::SeedableRng;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn raid10(
    dir: &std::path::Path,
    layout: &str,
    disks: u32,
    spares: u32,
    chunk_kib: u64,
) -> Vec<PathBuf> {
    raid10_on(dir, layout, disks, spares, chunk_kib, Metadata::V1_2)
}

fn raid10_on(
    dir: &std::path::Path,
    layout: &str,
    disks: u32,
    spares: u32,
    chunk_kib: u64,
    metadata: Metadata,
) -> Vec<PathBuf> {
    let options = CreateOptions {
        level: Level::Raid10,
        raid_disks: disks,
        chunk_bytes: Some(chunk_kib * 1024),
        layout: Some(layout.into()),
        metadata,
        assume_clean: true,
        name: "reshape10".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    array_with_options(dir, &options, spares, 12)
}

fn grow(disks: u32) -> ReshapeRequest {
    ReshapeRequest {
        raid_devices: Some(disks),
        ..Default::default()
    }
}

#[test]
fn a_raid10_reshape_keeps_every_byte_and_ends_in_the_new_geometry() {
    let cases: [(&str, u32, u64, ReshapeRequest, u32); 5] = [
        ("n2", 4, 64, grow(5), 0x102),
        ("n2", 4, 32, grow(6), 0x102),
        ("o2", 4, 64, grow(5), 0x10201),
        (
            "n2",
            4,
            64,
            ReshapeRequest {
                layout: Some(0x10201),
                ..Default::default()
            },
            0x10201,
        ),
        (
            "n2",
            4,
            64,
            ReshapeRequest {
                chunk_sectors: Some(256),
                ..Default::default()
            },
            0x102,
        ),
    ];
    for (layout, disks, chunk_kib, request, new_layout) in cases {
        let what = format!("raid10 {layout} {disks} {chunk_kib}K {request:?}");
        let dir = tempfile::tempdir().unwrap();
        let spares = request.raid_devices.map_or(0, |n| n - disks);
        let paths = raid10(dir.path(), layout, disks, spares, chunk_kib);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let old_size = engine.size_bytes() as usize;
        let mut image = random_image(old_size, 17);
        engine.write(0, &image, false).unwrap();
        engine.set_speed_limits(Some(1000), Some(8000));
        engine.start_reshape(&request).unwrap();
        let sb = engine.snapshot().sb;
        assert!(sb.has_feature(MD_FEATURE_RESHAPE_ACTIVE), "{what}");
        assert_eq!(sb.new_layout, new_layout, "{what}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        while engine.geometry().reshaping().is_some() {
            write_random(&engine, &mut rng, &mut image, 64);
            std::thread::sleep(Duration::from_millis(1));
        }
        finish_and_compare(&engine, &image, &what);
        let new_size = engine.size_bytes() as usize;
        assert!(new_size >= old_size, "{what}");
        let mut tail = vec![0u8; new_size - old_size];
        engine.read(old_size as u64, &mut tail).unwrap();
        assert!(
            tail.iter().all(|b| *b == 0),
            "{what}: the grown part reads zeroes"
        );
        engine.shutdown().unwrap();
        drop(engine);
        super::tests::check_consistent(&paths);
        let array = assemble(&paths, false).unwrap();
        assert!(array.geometry.reshaping().is_none(), "{what}");
        assert_eq!(array.geometry.array_sectors() as usize * 512, new_size);
        assert_eq!(array.sb.layout, new_layout, "{what}");
        assert_eq!(
            array.sb.raid_disks,
            request.raid_devices.unwrap_or(disks),
            "{what}"
        );
        assert_eq!(array.sb.feature_map & MD_FEATURE_NEW_OFFSET, 0, "{what}");
    }
}

#[test]
fn a_raid10_reshape_records_its_point_in_array_sectors_as_md() {
    let dir = tempfile::tempdir().unwrap();
    let paths = raid10(dir.path(), "n2", 4, 1, 64);
    let before = assemble(&paths, false).unwrap().sb.data_offset_sectors;
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    engine.set_speed_limits(Some(1000), Some(2000));
    engine.start_reshape(&grow(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine
        .geometry()
        .reshaping()
        .is_some_and(|r| r.position_sectors() < 2048)
    {
        assert!(Instant::now() < deadline, "the reshape does not move");
        std::thread::sleep(Duration::from_millis(5));
    }
    engine.pause_reshape();
    let sb = engine.snapshot().sb;
    let position = engine.geometry().reshaping().unwrap().position_sectors();
    assert_eq!(sb.reshape_position_sectors, position);
    assert_eq!(sb.delta_disks, 1);
    assert_eq!(sb.raid_disks, 5);
    // Every member's data moves down by one chunk (mdadm's
    // min_offset_change for near copies).
    for device in &engine.array.lock().unwrap().devices {
        assert!(device.sb.has_feature(MD_FEATURE_NEW_OFFSET));
        assert_eq!(device.sb.new_offset_sectors, -128);
        assert_eq!(device.sb.data_offset_sectors, before);
    }
    crash(engine);
}

#[test]
fn a_raid10_reshape_crashed_at_random_points_resumes_and_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let paths = raid10(dir.path(), "n2", 4, 1, 32);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let old_size = engine.size_bytes() as usize;
    let mut image = random_image(old_size, 47);
    engine.write(0, &image, false).unwrap();
    engine.set_speed_limits(Some(1000), Some(6000));
    engine.start_reshape(&grow(5)).unwrap();
    let engine = crash_until_done(engine, &paths, &mut image, 53);
    engine.shutdown().unwrap();
    drop(engine);
    super::tests::check_consistent(&paths);
    assert_eq!(assemble(&paths, false).unwrap().geometry.raid_disks(), 5);
}

/// Each refusal is one line and leaves every superblock as it was.
#[test]
fn md_refusals_for_raid10_reshapes_change_nothing() {
    let cases: [(&str, Metadata, u32, ReshapeRequest, &str); 7] = [
        ("f2", Metadata::V1_2, 1, grow(5), "far layout"),
        ("n2", Metadata::V1_0, 1, grow(5), "1.0 metadata"),
        ("n2", Metadata::V0_90, 0, grow(5), "0.90 metadata"),
        ("n2", Metadata::V1_2, 0, grow(5), "needs 1 spare"),
        (
            "n2",
            Metadata::V1_2,
            0,
            ReshapeRequest {
                layout: Some(0x103),
                ..Default::default()
            },
            "number of copies",
        ),
        (
            "n2",
            Metadata::V1_2,
            0,
            ReshapeRequest {
                layout: Some(0x201),
                ..Default::default()
            },
            "far layout",
        ),
        ("n2", Metadata::V1_2, 0, grow(3), "backwards"),
    ];
    for (layout, metadata, spares, request, why) in cases {
        let dir = tempfile::tempdir().unwrap();
        let paths = raid10_on(dir.path(), layout, 4, spares, 64, metadata);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let before = engine.snapshot().sb;
        let err = engine.start_reshape(&request).unwrap_err();
        assert!(err.contains(why), "{layout} {request:?}: {err}");
        assert!(!err.contains('\n'), "{err}");
        assert_eq!(
            engine.snapshot().sb,
            before,
            "{why}: the superblock changed"
        );
        assert!(engine.geometry().reshaping().is_none());
    }
}

#[test]
fn a_raid10_without_room_before_its_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let paths = raid10(dir.path(), "n2", 4, 1, 64);
    let array = assemble(&paths, false).unwrap();
    // What an earlier reshape leaves: less than a chunk before the data.
    let offset = array.sb.data_offset_sectors;
    let ctx = crate::array::ReshapeContext {
        sb: &array.sb,
        params: crate::geometry::GeometryParams {
            level: Level::Raid10,
            layout: array.sb.layout,
            chunk_sectors: 128,
            raid_disks: 4,
            dev_sectors: array.sb.size_sectors,
            member_data_sectors: vec![array.sb.data_size_sectors; 4],
            raid0_layout_feature: false,
        },
        members: vec![
            crate::array::MemberRoom {
                data_offset_sectors: offset,
                data_sectors: array.sb.data_size_sectors,
                lowest_data_offset_sectors: offset - 100,
                room_after_sectors: 0,
            };
            5
        ],
        spares: 1,
        missing_roles: Vec::new(),
        busy: None,
    };
    let err = crate::array::plan_reshape(&ctx, &grow(5)).unwrap_err();
    assert!(err.contains("not enough room before the data"), "{err}");
    assert!(err.contains("64 KiB needed, 50 KiB free"), "{err}");
}
