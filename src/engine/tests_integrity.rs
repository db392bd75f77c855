//! Silent corruption on arrays with two parities: a block changed on a
//! member behind the engine's back, with no I/O error, is located by the
//! row's syndromes, reported by check with its member and sectors, and put
//! back by repair, where md's repair would recompute the parity from the
//! wrong data.

use super::tests::{check_mismatches, make_array, wait_idle};
use super::*;
use crate::array::assemble;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const PAGE: u64 = 4096;

/// A raid6 of 5 members with 16 KiB chunks (4 pages a strip), filled with
/// random bytes through the engine; the image it holds, and each role's
/// data offset in its file.
fn filled_raid6(dir: &std::path::Path, layout: &str) -> (Vec<PathBuf>, Arc<Engine>, Vec<u8>) {
    let paths = make_array(dir, Level::Raid6, Some(layout), 5, 16);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    wait_idle(&engine);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x33);
    let mut image = vec![0u8; engine.size_bytes() as usize];
    rng.fill(&mut image[..]);
    engine.write(0, &image, false).unwrap();
    engine.flush_members().unwrap();
    assert_eq!(check_mismatches(&engine), 0, "a fresh array is consistent");
    (paths, engine, image)
}

/// Where a place's page lies in its member file.
fn file_offset(paths: &[PathBuf], place: &crate::geometry::Place, page: u64) -> (PathBuf, u64) {
    let slots = assemble(paths, false).unwrap().slots;
    let slot = slots[place.member].as_ref().unwrap();
    let at = slot.data_offset_bytes + place.member_sector * SECTOR_BYTES + page * PAGE;
    (paths[place.member].clone(), at)
}

/// Overwrites one page of a member file (the engine holds the members, so
/// the file is written directly), returning what it held.
fn corrupt(paths: &[PathBuf], place: &crate::geometry::Place, page: u64, seed: u8) -> Vec<u8> {
    let (path, at) = file_offset(paths, place, page);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut before = vec![0u8; PAGE as usize];
    file.read_exact_at(&mut before, at).unwrap();
    let wrong: Vec<u8> = before.iter().map(|b| b ^ seed.max(1)).collect();
    file.write_all_at(&wrong, at).unwrap();
    file.sync_all().unwrap();
    before
}

fn page_of(paths: &[PathBuf], place: &crate::geometry::Place, page: u64) -> Vec<u8> {
    let (path, at) = file_offset(paths, place, page);
    let mut buf = vec![0u8; PAGE as usize];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, at)
        .unwrap();
    buf
}

fn repair(engine: &Arc<Engine>) {
    engine.start_scrub(true).unwrap();
    wait_idle(engine);
}

/// The (event, device, detail) of events named `name` after `after`.
fn events_after(engine: &Engine, after: u64, name: &str) -> Vec<(String, String)> {
    engine
        .snapshot()
        .events
        .into_iter()
        .filter(|e| e.seq > after && e.event == name)
        .map(|e| (e.device, e.detail))
        .collect()
}

fn assert_image(engine: &Engine, image: &[u8], what: &str) {
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    if let Some(at) = back.iter().zip(image).position(|(a, b)| a != b) {
        panic!("{what}: the array differs from what was written at byte {at}");
    }
}

/// One block wrong, in a data strip, P or Q, on a layout whose Q exponents
/// follow the data order (left-symmetric) and one where they do not
/// (left-asymmetric): check names it, repair puts back its bytes.
#[test]
fn one_wrong_block_is_located_by_check_and_put_back_by_repair() {
    for layout in ["left-symmetric", "left-asymmetric"] {
        let dir = tempfile::tempdir().unwrap();
        let (paths, engine, image) = filled_raid6(dir.path(), layout);
        let map = engine.geometry().stripe(3);
        let targets = [
            ("data strip 1", map.data[1].copies[0]),
            ("data strip 2", map.data[2].copies[0]),
            ("P", map.p.unwrap()),
            ("Q", map.q.unwrap()),
        ];
        for (what, place) in targets {
            let case = format!("{layout}, {what}");
            let original = corrupt(&paths, &place, 1, 0x5a);
            let seq = engine.last_event_seq();
            assert_eq!(check_mismatches(&engine), 8, "{case}: one page");
            let found = events_after(&engine, seq, "MismatchLocated");
            assert_eq!(found.len(), 1, "{case}: {found:?}");
            let (device, detail) = &found[0];
            let name = paths[place.member].file_name().unwrap().to_string_lossy();
            assert!(
                device.ends_with(&*name),
                "{case}: blames {device}, not {name}"
            );
            let sector = place.member_sector + 8;
            assert!(
                detail.contains(&format!("{what}, member sectors {sector}..{}", sector + 8))
                    && detail.contains("left as found"),
                "{case}: {detail}"
            );
            assert_ne!(page_of(&paths, &place, 1), original, "{case}: check wrote");

            let seq = engine.last_event_seq();
            repair(&engine);
            let fixed = events_after(&engine, seq, "MismatchLocated");
            assert_eq!(fixed.len(), 1, "{case}: {fixed:?}");
            assert!(
                !fixed[0].1.contains("left as found"),
                "{case}: {}",
                fixed[0].1
            );
            assert_eq!(page_of(&paths, &place, 1), original, "{case}: healed");
            assert_eq!(check_mismatches(&engine), 0, "{case}: consistent again");
            assert_image(&engine, &image, &case);
        }
        engine.shutdown().unwrap();
    }
}

/// Two members wrong in the same page: no one block explains it. Check says
/// so, and repair does what md's does, recomputing the parity from the data
/// as read: the two pages stay wrong, now under parity that agrees.
#[test]
fn two_wrong_blocks_in_a_page_are_reported_and_repaired_as_md_does() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, engine, image) = filled_raid6(dir.path(), "left-symmetric");
    let map = engine.geometry().stripe(2);
    let (a, b) = (map.data[0].copies[0], map.data[2].copies[0]);
    corrupt(&paths, &a, 0, 0x11);
    corrupt(&paths, &b, 0, 0x3c);
    let seq = engine.last_event_seq();
    assert_eq!(check_mismatches(&engine), 8);
    assert!(events_after(&engine, seq, "MismatchLocated").is_empty());
    let unlocated = events_after(&engine, seq, "MismatchUnlocated");
    assert_eq!(unlocated.len(), 1, "{unlocated:?}");
    assert!(
        unlocated[0].1.contains("stripe 2, strip sectors 0..8"),
        "{unlocated:?}"
    );
    let seq = engine.last_event_seq();
    repair(&engine);
    let repaired = events_after(&engine, seq, "MismatchUnlocated");
    assert!(
        repaired.len() == 1 && repaired[0].1.contains("parity recomputed"),
        "{repaired:?}"
    );
    assert_eq!(check_mismatches(&engine), 0);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    let wrong_pages: Vec<usize> = back
        .chunks(PAGE as usize)
        .zip(image.chunks(PAGE as usize))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        wrong_pages.len(),
        2,
        "the two pages md's repair keeps wrong"
    );
    engine.shutdown().unwrap();
}

/// A resync (after a crash) trusts the data, as md's does: a torn write
/// looks just like a wrong data block, and the data is what was written.
#[test]
fn a_resync_recomputes_parity_and_locates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, engine, _) = filled_raid6(dir.path(), "left-symmetric");
    let map = engine.geometry().stripe(1);
    let place = map.data[1].copies[0];
    corrupt(&paths, &place, 2, 0x77);
    let wrong = page_of(&paths, &place, 2);
    let slots = engine.in_sync_slots(1);
    let report = crate::array::resync_with(
        &engine.geometry(),
        &slots,
        1..2,
        crate::array::Pass::Resync,
        |_| {},
        |f| panic!("a resync located {f:?}"),
    )
    .unwrap();
    assert_eq!(report.mismatch_sectors, 8);
    assert_eq!(page_of(&paths, &place, 2), wrong, "the data stays");
    assert_eq!(check_mismatches(&engine), 0, "the parity follows it");
    engine.shutdown().unwrap();
}

/// dRAID with two and with three parities: a data column's page and a
/// parity column's page, each wrong alone, located and put back.
#[test]
fn draid_with_two_or_three_parities_locates_and_repairs_one_wrong_block() {
    for (parity, data, children) in [(2, 2, 9), (3, 1, 9)] {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::tests_draid::make_draid(dir.path(), parity, data, children, 1);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let image = super::tests_draid::fill(&engine, 0x33 + parity as u64);
        engine.flush_members().unwrap();
        assert_eq!(check_mismatches(&engine), 0, "draid{parity}: consistent");
        let map = engine.geometry().stripe(5);
        let mut targets = vec![("data strip 0", map.data[0].copies[0])];
        targets.push(("Q", map.q.unwrap()));
        if parity == 3 {
            targets.push(("R", map.r.unwrap()));
        }
        for (what, place) in targets {
            let case = format!("draid{parity}, {what}");
            let original = corrupt(&paths, &place, 3, 0xa5);
            let seq = engine.last_event_seq();
            assert_eq!(check_mismatches(&engine), 8, "{case}");
            let found = events_after(&engine, seq, "MismatchLocated");
            assert!(
                found.len() == 1 && found[0].1.starts_with(&format!("stripe 5, {what},")),
                "{case}: {found:?}"
            );
            repair(&engine);
            assert_eq!(page_of(&paths, &place, 3), original, "{case}: healed");
            assert_eq!(check_mismatches(&engine), 0, "{case}");
            assert_image(&engine, &image, &case);
        }
        engine.shutdown().unwrap();
    }
}
