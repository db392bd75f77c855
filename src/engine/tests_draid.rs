//! dRAID's distributed spares in the live engine: after a failed child's
//! role is rebuilt onto a distributed spare the array survives P more
//! child failures (those holding the spare's space among them) with
//! writes going on, serves every byte, rebuilds what is missing onto a
//! second spare or added disks, and comes back from a crash in the middle
//! of the spare's rebuild and of the rebalance onto a new disk.

use super::*;
use crate::array::{assemble, create, CreateOptions, MemberSpec, StripeIo};
use crate::format::Metadata;
use crate::geometry::Draid;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Room for two 16 MiB slices, the superblock area and the spares'
/// metadata slots on each child.
const CHILD_BYTES: u64 = 38 * MIB;

/// A dRAID of `children` files with one data column per group short of a
/// row's width, so that rows hold two groups (children that share a row
/// with a spare's space and children that do not).
pub(super) fn make_draid(
    dir: &Path,
    parity: usize,
    data: usize,
    children: usize,
    spares: usize,
) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = (0..children)
        .map(|i| new_file(dir, &format!("c{i}")))
        .collect();
    let options = CreateOptions {
        level: Level::from_number(-100 - parity as i32).unwrap(),
        raid_disks: children as u32,
        chunk_bytes: Some(64 * 1024),
        layout: Some(format!("{data}d:{spares}s")),
        metadata: Metadata::V1_2,
        assume_clean: true,
        name: "draid".into(),
        size_sectors: None,
        force: false,
        homehost: None,
        integrity: false,
    };
    let specs: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
    create(&specs, &options, |_, _| {}).unwrap();
    paths
}

fn new_file(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .set_len(CHILD_BYTES)
        .unwrap();
    p
}

fn draid_of(engine: &Engine) -> Draid {
    match &*engine.geometry() {
        Geometry::Draid(d) => d.clone(),
        other => panic!("not a dRAID: {}", other.level()),
    }
}

/// Random writes of up to 256 KiB at 4 KiB alignment, applied to `image`.
fn write_some(engine: &Engine, image: &mut [u8], writes: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..writes {
        let len = rng.gen_range(1..=64usize) * 4096;
        let at = rng.gen_range(0..(image.len() - len) / 4096) * 4096;
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        engine.write(at as u64, &data, rng.gen_bool(0.1)).unwrap();
        image[at..at + len].copy_from_slice(&data);
    }
}

/// Fills the whole array with random bytes and returns them.
pub(super) fn fill(engine: &Engine, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut image = vec![0u8; engine.size_bytes() as usize];
    rng.fill(&mut image[..]);
    for (k, part) in image.chunks(4 * MIB as usize).enumerate() {
        engine.write(k as u64 * 4 * MIB, part, false).unwrap();
    }
    image
}

fn assert_reads(engine: &Engine, image: &[u8], what: &str) {
    let mut back = vec![0u8; image.len()];
    engine
        .read(0, &mut back)
        .unwrap_or_else(|e| panic!("{what}: read: {e}"));
    if let Some(at) = back.iter().zip(image).position(|(a, b)| a != b) {
        panic!("{what}: array byte {at} differs");
    }
}

fn events(snapshot: &Snapshot) -> Vec<String> {
    snapshot
        .events
        .iter()
        .map(|e| format!("{} {} {}", e.event, e.device, e.detail))
        .collect()
}

fn wait_for(engine: &Engine, what: &str, done: impl Fn(&Snapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let snapshot = engine.snapshot();
        if done(&snapshot) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached in 2 minutes; missing {:?}, sync {:?}, events {:?}",
            snapshot.missing_roles,
            snapshot.sync.as_ref().map(|s| s.action),
            events(&snapshot)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// No job runs and no role waits for a spare that is there.
fn idle(s: &Snapshot) -> bool {
    s.sync.is_none()
        && !s.devices.iter().any(|d| {
            matches!(
                d.state,
                DeviceState::Recovering { .. } | DeviceState::Replacement { .. }
            )
        })
}

/// The device (path) holding `role`.
fn holder(s: &Snapshot, role: usize) -> Option<String> {
    s.devices
        .iter()
        .find(|d| d.state == DeviceState::Active { role })
        .map(|d| d.path.clone())
}

/// The children that hold distributed spare `spare`'s space, slice by
/// slice (the ones a failure costs the spare's role a column).
fn spare_space_children(draid: &Draid, spare: usize) -> Vec<usize> {
    let mut children: Vec<usize> = (0..draid.slices())
        .map(|slice| draid.spare_child(spare, slice * draid.devslice_sectors()))
        .collect();
    children.dedup();
    children
}

/// Fails `children` one by one while another thread writes; returns the
/// image with those writes.
fn fail_under_writes(
    engine: &Arc<Engine>,
    paths: &[PathBuf],
    children: &[usize],
    image: Vec<u8>,
    seed: u64,
) -> Vec<u8> {
    let writer = {
        let engine = engine.clone();
        let mut image = image;
        std::thread::spawn(move || {
            write_some(&engine, &mut image, 200, seed);
            image
        })
    };
    for &c in children {
        std::thread::sleep(Duration::from_millis(20));
        engine
            .manage_fail_with(&paths[c], false)
            .unwrap_or_else(|e| panic!("failing child {c}: {e}"));
    }
    writer.join().unwrap()
}

/// Adds fresh disks one at a time until no role is missing and no
/// distributed spare holds one: rebuilds, then rebalances.
fn restore_onto_new_disks(engine: &Arc<Engine>, dir: &Path, what: &str) -> Vec<PathBuf> {
    let mut added = Vec::new();
    for k in 0..8 {
        let s = engine.snapshot();
        let spare_held = s.devices.iter().any(|d| {
            crate::array::dspare::is_spare_name(&d.path)
                && matches!(d.state, DeviceState::Active { .. })
        });
        if s.missing_roles.is_empty() && !spare_held {
            return added;
        }
        let disk = new_file(dir, &format!("new{k}"));
        engine.manage_add(&disk).unwrap();
        added.push(disk);
        wait_for(
            engine,
            &format!("{what}: the work onto new disk {k}"),
            |s| {
                idle(s)
                    && !s.devices.iter().any(|d| {
                        d.state == DeviceState::Spare && d.path.ends_with(&format!("new{k}"))
                    })
            },
        );
    }
    panic!("{what}: still missing roles after 8 new disks")
}

/// The current member of every role, by path, for an offline assembly.
fn members_now(engine: &Engine) -> Vec<PathBuf> {
    let s = engine.snapshot();
    (0..s.sb.raid_disks as usize)
        .filter_map(|r| holder(&s, r))
        .filter(|p| !crate::array::dspare::is_spare_name(p))
        .map(PathBuf::from)
        .collect()
}

fn check_finds_nothing(engine: &Arc<Engine>, what: &str) {
    engine.start_scrub(false).unwrap();
    wait_for(engine, &format!("{what}: the check"), idle);
    assert_eq!(
        engine.mismatch_sectors(),
        0,
        "{what}: the check found mismatches"
    );
}

#[test]
fn after_a_distributed_spare_rebuild_parity_more_children_may_fail() {
    for (parity, data, children, spares) in [
        (1, 2, 7, 1),
        (1, 2, 8, 2),
        (2, 2, 9, 1),
        (2, 2, 10, 2),
        (3, 1, 9, 1),
        (3, 1, 10, 2),
    ] {
        let what = format!("draid{parity}:{data}d:{children}c:{spares}s");
        let dir = tempfile::tempdir().unwrap();
        let paths = make_draid(dir.path(), parity, data, children, spares);
        let engine =
            Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
        let draid = draid_of(&engine);
        let mut image = fill(&engine, parity as u64);

        // Child 0 fails: its role is rebuilt onto the first distributed spare.
        engine.manage_fail(&paths[0]).unwrap();
        wait_for(&engine, &format!("{what}: the spare rebuild"), |s| {
            idle(s) && s.missing_roles.is_empty()
        });
        let spare = crate::array::dspare::spare_name(parity, 0);
        assert_eq!(
            holder(&engine.snapshot(), 0).as_deref(),
            Some(spare.as_str()),
            "{what}"
        );

        // P more children fail, those that hold the spare's space first
        // (each costs the spare's role a column in the rows there), then
        // children that do not, while a client writes.
        let mut pattern: Vec<usize> = spare_space_children(&draid, 0)
            .into_iter()
            .filter(|&c| c != 0)
            .take(parity.div_ceil(2))
            .collect();
        let rest: Vec<usize> = (1..children).filter(|c| !pattern.contains(c)).collect();
        pattern.extend(rest.iter().rev().take(parity - pattern.len()));
        assert_eq!(pattern.len(), parity);
        image = fail_under_writes(&engine, &paths, &pattern, image, 100 + parity as u64);
        // With a second spare, the first of them is rebuilt onto it.
        wait_for(
            &engine,
            &format!("{what}: the work after {pattern:?} failed"),
            idle,
        );
        let s = engine.snapshot();
        assert!(
            s.runnable,
            "{what}: not runnable after {pattern:?} failed: {:?}",
            events(&s)
        );
        assert_eq!(
            holder(&s, 0).as_deref(),
            Some(spare.as_str()),
            "{what}: the spare was failed"
        );
        assert_eq!(
            s.missing_roles.len(),
            parity + 1 - spares.min(parity + 1),
            "{what}: {:?}",
            s.missing_roles
        );
        assert_reads(
            &engine,
            &image,
            &format!("{what}, children {pattern:?} failed"),
        );
        write_some(&engine, &mut image, 100, 200 + parity as u64);
        assert_reads(
            &engine,
            &image,
            &format!("{what}, written with {pattern:?} failed"),
        );

        // New disks: every missing role rebuilt, then the spares' roles
        // moved back; the array is whole and consistent.
        restore_onto_new_disks(&engine, dir.path(), &what);
        assert_reads(&engine, &image, &format!("{what}, restored"));
        check_finds_nothing(&engine, &what);
        let now = members_now(&engine);
        assert_eq!(now.len(), children, "{what}: {now:?}");
        engine.shutdown().unwrap();
        drop(engine);

        // Offline, any P children may go again.
        super::tests::check_consistent(&now);
        for lost in [
            (0..parity).collect::<Vec<_>>(),
            (children - parity..children).collect(),
        ] {
            let some: Vec<PathBuf> = now
                .iter()
                .enumerate()
                .filter(|(i, _)| !lost.contains(i))
                .map(|(_, p)| p.clone())
                .collect();
            let array = assemble(&some, false).unwrap();
            let mut offline = vec![0u8; image.len()];
            StripeIo::new(&array.geometry, &array.slots)
                .read_bytes(0, &mut offline)
                .unwrap();
            assert!(offline == image, "{what}: offline without {lost:?}");
        }
    }
}

/// Drops the engine as a crash would (no shutdown), waiting until its
/// threads let go, and starts it again from the files.
fn crash_and_restart(engine: Arc<Engine>, paths: &[PathBuf]) -> Arc<Engine> {
    let_go(engine);
    let deadline = Instant::now() + Duration::from_secs(60);
    let options = EngineOptions {
        force: true,
        ..EngineOptions::default()
    };
    // A thread that outlived the engine by a moment (a rebuild writer
    // finishing its batch) may still hold a member, and with it its lock;
    // a process killed with -9 would hold none.
    let assembled = loop {
        match assemble(paths, true) {
            Ok(assembled) => break assembled,
            Err(e) if Instant::now() < deadline && e.to_string().contains("in use") => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("assembling after the crash: {e}"),
        }
    };
    Engine::start(assembled, options).unwrap()
}

#[test]
fn a_crash_during_the_spare_rebuild_and_during_the_rebalance_loses_nothing() {
    let (parity, data, children, spares) = (2, 2, 9, 1);
    let dir = tempfile::tempdir().unwrap();
    let mut paths = make_draid(dir.path(), parity, data, children, spares);
    let mut engine =
        Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let draid = draid_of(&engine);
    let mut image = fill(&engine, 7);
    let spare_child = spare_space_children(&draid, 0)[0];
    let spare_child = if spare_child == 0 {
        spare_space_children(&draid, 0)[1]
    } else {
        spare_child
    };

    // Crash in the middle of the rebuild onto the distributed spare, with
    // a child holding the spare's space failed along the way.
    engine.set_speed_limits(Some(1000), Some(20_000));
    engine.manage_fail(&paths[0]).unwrap();
    wait_for(&engine, "the spare rebuild under way", |s| {
        s.sync.as_ref().is_some_and(|p| p.done_kib > 0)
    });
    engine.manage_fail(&paths[spare_child]).unwrap();
    write_some(&engine, &mut image, 50, 8);
    engine = crash_and_restart(engine, &paths);
    engine.set_speed_limits(Some(1000), Some(2_000_000));
    wait_for(&engine, "the resumed spare rebuild", |s| {
        idle(s) && holder(s, 0).is_some()
    });
    assert_reads(&engine, &image, "after the crash in the spare rebuild");
    // One more child may still fail.
    let other = (1..children).find(|c| *c != spare_child).unwrap();
    engine.manage_fail(&paths[other]).unwrap();
    write_some(&engine, &mut image, 50, 9);
    assert_reads(&engine, &image, "with a third child failed");

    // New disks for the two failed children, then one for the spare's
    // role; a crash in the middle of that rebalance.
    for k in 0..2 {
        let missing = engine.snapshot().missing_roles.len();
        let disk = new_file(dir.path(), &format!("new{k}"));
        engine.manage_add(&disk).unwrap();
        wait_for(&engine, "a rebuild onto a new disk", |s| {
            idle(s) && s.missing_roles.len() + 1 == missing
        });
        paths.push(disk);
    }
    assert!(engine.snapshot().missing_roles.is_empty());
    let disk = new_file(dir.path(), "back");
    engine.set_speed_limits(Some(1000), Some(20_000));
    engine.manage_add(&disk).unwrap();
    paths.push(disk);
    wait_for(&engine, "the rebalance under way", |s| {
        s.sync.as_ref().is_some_and(|p| p.done_kib > 0)
    });
    write_some(&engine, &mut image, 50, 10);
    engine = crash_and_restart(engine, &paths);
    engine.set_speed_limits(Some(1000), Some(2_000_000));
    assert_reads(&engine, &image, "after the crash in the rebalance");
    // A crash leaves the new disk a spare (mdadm's --replace): the
    // rebalance is asked again, and ends.
    if holder(&engine.snapshot(), 0).is_some_and(|h| crate::array::dspare::is_spare_name(&h)) {
        wait_for(&engine, "idle after the restart", idle);
        let held = holder(&engine.snapshot(), 0).unwrap();
        if crate::array::dspare::is_spare_name(&held) {
            engine
                .manage_replace(Path::new(&held), paths.last().unwrap())
                .unwrap();
        }
    }
    wait_for(&engine, "the rebalance", |s| {
        idle(s) && holder(s, 0).is_some_and(|h| h.ends_with("back"))
    });
    assert_reads(&engine, &image, "after the rebalance");
    check_finds_nothing(&engine, "after the rebalance");
    engine.shutdown().unwrap();
}

/// Shuts the engine down and waits until its threads let go of the
/// members (and their locks).
fn shut_down(engine: Arc<Engine>) {
    engine.shutdown().unwrap();
    let_go(engine);
}

/// Drops the engine and waits until its threads let go of it.
fn let_go(engine: Arc<Engine>) {
    let weak = Arc::downgrade(&engine);
    drop(engine);
    let deadline = Instant::now() + Duration::from_secs(60);
    while weak.strong_count() > 0 {
        assert!(Instant::now() < deadline, "the engine's threads hold it");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The byte range of distributed spare `spare`'s superblock copy on each
/// child: in its metadata slot after the data, at version 1.2's 4 KiB.
fn spare_superblock_bytes(sb: &crate::format::MemberSuper, spare: u64) -> std::ops::Range<u64> {
    let slot = (sb.data_offset_sectors * (1 + spare) + sb.size_sectors) * 512;
    slot + 4096..slot + 8192
}

fn file_bytes(path: &Path, range: std::ops::Range<u64>) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, range.start)
        .unwrap();
    buf
}

fn put_file_bytes(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, at).unwrap();
}

#[test]
fn a_stale_copy_of_a_spares_superblock_does_not_undo_its_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_draid(dir.path(), 2, 2, 9, 1);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let range = spare_superblock_bytes(&engine.snapshot().sb, 0);
    let before = file_bytes(&paths[1], range.clone());
    let image = fill(&engine, 11);
    engine.manage_fail(&paths[0]).unwrap();
    wait_for(&engine, "the spare rebuild", |s| {
        idle(s) && holder(s, 0).is_some()
    });
    let spare = holder(&engine.snapshot(), 0).unwrap();
    assert!(crate::array::dspare::is_spare_name(&spare), "{spare}");
    shut_down(engine);

    // Child 1, the first one an assembly reads, lost the spare's later
    // superblocks (a volatile cache at a power cut): its copy still says
    // spare. The others say it holds role 0.
    put_file_bytes(&paths[1], range.start, &before);
    let engine = Engine::start(
        assemble(&paths[1..], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    let s = engine.snapshot();
    assert_eq!(holder(&s, 0).as_deref(), Some(spare.as_str()));
    assert!(s.missing_roles.is_empty(), "{:?}", s.missing_roles);
    assert_reads(&engine, &image, "after the restart");
    engine.shutdown().unwrap();
}

#[test]
fn a_disk_added_while_a_spare_is_unreadable_does_not_take_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_draid(dir.path(), 2, 2, 9, 1);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let s = engine.snapshot();
    let range = spare_superblock_bytes(&s.sb, 0);
    let reserved = crate::array::dspare::spare_dev_numbers(s.sb.raid_disks, 1);
    let spare = s
        .devices
        .iter()
        .find(|d| crate::array::dspare::is_spare_name(&d.path))
        .unwrap();
    assert!(reserved.contains(&spare.dev_number), "{}", spare.dev_number);
    let image = fill(&engine, 12);
    engine.manage_fail(&paths[0]).unwrap();
    wait_for(&engine, "the spare rebuild", |s| {
        idle(s) && holder(s, 0).is_some()
    });
    shut_down(engine);

    // Every copy of the spare's superblock is gone: it is left out, and
    // role 0 is missing.
    for p in &paths[1..] {
        put_file_bytes(
            p,
            range.start,
            &vec![0u8; (range.end - range.start) as usize],
        );
    }
    let engine = Engine::start(
        assemble(&paths[1..], true).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    assert_eq!(engine.snapshot().missing_roles, vec![0]);
    assert_reads(&engine, &image, "with the spare left out");
    // The first disk takes the failed child's number 0; the second would
    // take the spare's next.
    for name in ["new", "new2"] {
        let disk = new_file(dir.path(), name);
        engine.manage_add(&disk).unwrap();
        let s = engine.snapshot();
        let added = s.devices.iter().find(|d| d.path.ends_with(name)).unwrap();
        assert!(
            !reserved.contains(&added.dev_number),
            "{name} took the spare's device number {}",
            added.dev_number
        );
        wait_for(&engine, "the rebuild onto the new disk", |s| {
            idle(s) && s.missing_roles.is_empty()
        });
    }
    assert_reads(&engine, &image, "after the rebuild");
    engine.shutdown().unwrap();
}

/// A child lost while a spare's role is being handed to a new disk (the
/// rebalance) is that child's loss alone: the spare keeps the role (its
/// space on the other children is sound), the rebalance is given up and
/// its disk rebuilds the lost child instead. Failing the spare for the
/// child's error would leave two roles short on a single-parity array.
#[test]
fn a_child_lost_during_the_rebalance_costs_the_spare_nothing() {
    use crate::member::{BadRange, Fault, FaultyMember, MemberRef, Ops};
    let dir = tempfile::tempdir().unwrap();
    let paths = make_draid(dir.path(), 1, 2, 7, 1);
    let wrappers: Vec<Arc<FaultyMember>> = crate::array::open_members(&paths, true)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, (_, m))| Arc::new(FaultyMember::with_seed(m, i as u64)))
        .collect();
    let members = paths
        .iter()
        .zip(&wrappers)
        .map(|(p, w)| (p.display().to_string(), w.clone() as MemberRef))
        .collect();
    let engine = Engine::start(
        crate::array::assemble_members(members).unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    let draid = draid_of(&engine);
    let image = fill(&engine, 13);
    // The spare's space in the first slice lies on `child`; the role that
    // fails is another, whose columns there the spare then keeps on it.
    let child = draid.spare_child(0, 0);
    let role = (child + 1) % paths.len();
    engine.manage_fail(&paths[role]).unwrap();
    wait_for(&engine, "the spare rebuild", |s| {
        idle(s) && holder(s, role).is_some()
    });
    let spare = holder(&engine.snapshot(), role).unwrap();
    assert!(crate::array::dspare::is_spare_name(&spare), "{spare}");

    // The rebalance onto a new disk, slowed so that the child goes in the
    // middle of it.
    engine.set_speed_limits(Some(100), Some(1000));
    let disk = new_file(dir.path(), "new");
    engine.manage_add(&disk).unwrap();
    wait_for(&engine, "the rebalance's start", |s| {
        s.devices
            .iter()
            .any(|d| matches!(d.state, DeviceState::Replacement { role: r, .. } if r == role))
    });
    // The child's sectors under the spare's space in that slice go bad for
    // reads and writes: only I/O through the spare meets them, as the
    // first to see a pulled child may be.
    let data_offset = engine.snapshot().sb.data_offset_sectors;
    wrappers[child]
        .apply(&Fault::Eio(BadRange {
            offset_bytes: data_offset * SECTOR_BYTES,
            len_bytes: draid.devslice_sectors() * SECTOR_BYTES,
            ops: Ops::Both,
            remap: false,
        }))
        .unwrap();
    // Every row is read, those whose column of the role lies there among
    // them: each must come back, rebuilt from parity.
    assert_reads(&engine, &image, "with the child failing mid-rebalance");
    assert!(
        wrappers[child].counters().bad_range_errors > 0,
        "no read went through the spare to the bad sectors"
    );
    engine.set_speed_limits(None, Some(1_000_000));
    let child_path = paths[child].display().to_string();
    wait_for(&engine, "the lost child's rebuild", |s| {
        idle(s) && holder(s, child).is_some_and(|h| h != child_path)
    });
    let s = engine.snapshot();
    assert!(s.runnable, "{:?}", events(&s));
    assert_eq!(
        holder(&s, role).as_deref(),
        Some(spare.as_str()),
        "the spare lost its role: {:?}",
        events(&s)
    );
    assert_eq!(
        holder(&s, child).as_deref(),
        Some(disk.display().to_string().as_str()),
        "the new disk does not hold the lost child's role: {:?}",
        events(&s)
    );
    assert!(s.missing_roles.is_empty(), "{:?}", s.missing_roles);
    let stopped = format!("rebalance of role {role} is given up");
    assert!(
        events(&s)
            .iter()
            .any(|e| e.starts_with("SyncStopped") && e.contains(&stopped)),
        "{:?}",
        events(&s)
    );
    assert_reads(&engine, &image, "after the lost child's rebuild");
    check_finds_nothing(&engine, "after the lost child's rebuild");
    engine.shutdown().unwrap();
}

/// Two children of a draid2 lost, the second while the first one's
/// rebuild runs: the groups that hold both are at zero
/// redundancy, the others are not. The first rebuild takes those groups'
/// rows first: once its walk of them ends, every one of them is in sync
/// on the spare while rows after the position are not, the array is no
/// longer at zero redundancy though the rebuild runs on, and status says
/// what the walk did. Then everything is rebuilt and reads back.
#[test]
fn a_rebuild_takes_the_rows_at_zero_redundancy_first() {
    let dir = tempfile::tempdir().unwrap();
    // Three groups per row of 12 children besides the spares: two
    // children share a group in one slice and not in the other.
    let paths = make_draid(dir.path(), 2, 2, 14, 2);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    let image = fill(&engine, 77);
    // Two children that share some groups, not all.
    let geometry = engine.geometry();
    let holds = |map: &crate::geometry::StripeMap, r: usize| {
        !crate::engine::table::places_of(map, r).is_empty()
    };
    let with_3 = |b: usize, together: bool| {
        (0..engine.sync.stripe_count()).any(|s| {
            let map = geometry.stripe(s);
            holds(&map, 3) && holds(&map, b) == together
        })
    };
    let second = (0..14)
        .find(|&b| b != 3 && with_3(b, true) && with_3(b, false))
        .expect("a child sharing some groups with child 3");
    // Slow enough that the walk and what follows it can be seen.
    engine.set_speed_limits(Some(1000), Some(6000));
    engine.manage_fail_with(&paths[3], false).unwrap();
    engine.manage_fail_with(&paths[second], false).unwrap();
    wait_for(&engine, "the walk of the endangered rows", |s| {
        s.sync
            .as_ref()
            .and_then(|p| p.endangered_first)
            .is_some_and(|f| !f.walking && f.rows_done > 0)
    });
    let s = engine.snapshot();
    let role = match s.sync.as_ref().map(|p| p.action) {
        Some(SyncAction::Recovery { role }) => role,
        other => panic!("not a recovery: {other:?}"),
    };
    let other = if role == 3 { second } else { 3 };
    assert_eq!(
        s.zero_redundancy.and_then(|z| z.now_secs),
        None,
        "{:?}",
        events(&s)
    );
    assert!(
        events(&s).iter().any(|e| e.contains("RedundancyRestored")),
        "{:?}",
        events(&s)
    );
    let table = engine.table();
    let (mut endangered, mut waiting) = (0, 0);
    for stripe in 0..engine.sync.stripe_count() {
        let map = geometry.stripe(stripe);
        if !holds(&map, role) {
            continue;
        }
        if holds(&map, other) {
            endangered += 1;
            assert!(
                table.usable(role, stripe),
                "stripe {stripe} not rebuilt first"
            );
        } else if !table.usable(role, stripe) {
            waiting += 1;
        }
    }
    assert!(endangered > 0 && waiting > 0, "{endangered} {waiting}");
    let detail = crate::control::view::DetailView::from_snapshot(&s);
    assert!(
        detail
            .rebuild_order
            .as_deref()
            .is_some_and(|o| o.contains("rows at zero redundancy first")),
        "{:?}",
        detail.rebuild_order
    );
    engine.set_speed_limits(None, Some(1_000_000));
    wait_for(&engine, "both rebuilds", |s| {
        idle(s) && s.missing_roles.is_empty()
    });
    assert_reads(&engine, &image, "after both rebuilds");
    check_finds_nothing(&engine, "after both rebuilds");
    engine.shutdown().unwrap();
}

/// raid10 with three copies over five members, two failed: the chunks
/// whose copies both lost members held are left with one, the others
/// with two. The spare's recovery takes those first (raid10's rows differ
/// as dRAID's do): once its walk ends every one of them is rebuilt while
/// later chunks are not. Then everything is rebuilt and reads back.
#[test]
fn a_raid10_rebuild_takes_the_chunks_left_with_one_copy_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = super::tests::make_array(dir.path(), Level::Raid10, Some("n3"), 5, 64);
    let engine = Engine::start(assemble(&paths, true).unwrap(), EngineOptions::default()).unwrap();
    super::tests::wait_idle(&engine);
    let image = fill(&engine, 78);
    engine.set_speed_limits(Some(1000), Some(6000));
    engine.manage_fail_with(&paths[0], false).unwrap();
    engine.manage_fail_with(&paths[1], false).unwrap();
    // Before the spare: which chunks each role's loss leaves at one copy.
    let geometry = engine.geometry();
    let table = engine.table();
    let stripes = engine.sync.stripe_count();
    let endangered: Vec<Vec<bool>> = (0..2)
        .map(|role| {
            (0..stripes)
                .map(|s| table.margin_without(&geometry.stripe(s), role) == Some(0))
                .collect()
        })
        .collect();
    drop(table);
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    engine.manage_add(&spare).unwrap();
    paths.push(spare);
    wait_for(&engine, "the walk of the endangered chunks", |s| {
        s.sync
            .as_ref()
            .and_then(|p| p.endangered_first)
            .is_some_and(|f| !f.walking && f.rows_done > 0)
    });
    let s = engine.snapshot();
    let role = match s.sync.as_ref().map(|p| p.action) {
        Some(SyncAction::Recovery { role }) => role,
        other => panic!("not a recovery: {other:?}"),
    };
    let table = engine.table();
    let holds = |s: u64| !crate::engine::table::places_of(&geometry.stripe(s), role).is_empty();
    let (mut first, mut waiting) = (0, 0);
    for stripe in 0..stripes {
        if !holds(stripe) {
            continue;
        }
        if endangered[role][stripe as usize] {
            first += 1;
            assert!(
                table.usable(role, stripe),
                "chunk {stripe} not rebuilt first"
            );
        } else if !table.usable(role, stripe) {
            waiting += 1;
        }
    }
    assert!(first > 0 && waiting > 0, "{first} {waiting}");
    drop(table);
    engine.set_speed_limits(None, Some(1_000_000));
    let spare2 = dir.path().join("spare2");
    std::fs::File::create(&spare2)
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    engine.manage_add(&spare2).unwrap();
    wait_for(&engine, "both rebuilds", |s| {
        idle(s) && s.missing_roles.is_empty()
    });
    assert_reads(&engine, &image, "after both rebuilds");
    check_finds_nothing(&engine, "after both rebuilds");
    engine.shutdown().unwrap();
}
