//! dRAID end to end on the host: create with ZFS's spec strings, serve,
//! lose children and rebuild onto the distributed spare, move the data
//! back onto a real disk while clients write (ZFS's rebalance), survive
//! every loss within parity, resume a rebuild after kill -9, and refuse
//! impossible specs and md-only operations with one line.
//!
//! Arrays are sparse files in a scratch folder; the data is checked with
//! nbdcopy against what was written and offline with `uraid copy-out`
//! with children left out.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn has_event(status: &serde_json::Value, event: &str, device: &str) -> bool {
    status_events(status)
        .iter()
        .any(|(e, d, _)| e == event && (device.is_empty() || d.ends_with(device)))
}

/// The role a detail row shows for a device (its raid_device), if active.
fn role_of(detail: &serde_json::Value, name: &str) -> Option<u64> {
    detail["devices"]
        .as_array()?
        .iter()
        .find(|r| r["path"].as_str().is_some_and(|p| p.ends_with(name)))?["raid_device"]
        .as_u64()
}

/// `uraid copy-out` with only `members` (others left out).
fn copy_out_of(members: &[&str], dir: &Path) -> Vec<u8> {
    copy_out(members, dir)
}

/// Offline, the children at `lost` left out, the array reads `expected`.
fn assert_copy_out_without(
    names: &[&str],
    lost: &[usize],
    expected: &[u8],
    dir: &Path,
    what: &str,
) {
    let some: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(_, m)| *m)
        .collect();
    assert_same_bytes(
        &copy_out_of(&some, dir),
        expected,
        &format!("{what}: copy-out without children {lost:?}"),
    );
}

#[test]
fn a_lost_child_is_rebuilt_onto_the_distributed_spare_and_moved_back_to_a_new_disk() {
    let dir = scratch("draid-spare");
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "draid2:4d:11c:1s",
            "--raid-devices",
            "11",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        11,
        120 * MIB,
    );
    let names = paths(&members);
    let detail = detail_offline(&names);
    assert_eq!(detail["raid_level"], "draid2", "{detail}");
    let size = detail["array_size_kib"].as_u64().expect("array size") * 1024;
    // Two slices of 48 MiB per child, 10 of 11 children's worth of data
    // at 4 data in 6 columns.
    assert_eq!(size, 2 * 48 * MIB * 10 * 4 / 6);
    let (first, first_data) = image(dir.path(), "first.img", 1, size);
    let served = serve(dir.path(), &[], &names);
    nbdcopy_in(&first, served.uri());

    // A child fails: its role is rebuilt at once onto the distributed
    // spare, with no spare disk.
    manage_ok(&served.control, &["--fail", names[3]]);
    let status = wait_status(
        &served.control,
        "the rebuild onto the distributed spare",
        Duration::from_secs(120),
        |s| status_whole_and_idle(s) && has_event(s, "SpareActive", "draid2-0-0"),
    );
    let detail = &status["detail"];
    // The failed child's role: children are given in role order.
    let role = 3;
    assert_eq!(role_of(detail, "draid2-0-0"), Some(role), "{detail}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &first_data,
        "after the rebuild",
    );
    manage_ok(&served.control, &["--action", "check"]);
    let status = wait_status(
        &served.control,
        "the check",
        Duration::from_secs(120),
        |s| status_whole_and_idle(s) && has_event(s, "RebuildFinished", ""),
    );
    assert_eq!(status["mismatch_cnt"], 0, "{status}");

    // A real disk comes: the role moves back onto it while a client
    // writes, and the distributed spare is free again.
    let new = sparse_files(dir.path(), "new", &[120 * MIB]).remove(0);
    let (second, second_data) = image(dir.path(), "second.img", 2, size);
    let uri = served.uri().to_string();
    let writer = std::thread::spawn(move || nbdcopy_in(&second, &uri));
    manage_ok(&served.control, &["--add", new.to_str().unwrap()]);
    writer.join().unwrap();
    let status = wait_status(
        &served.control,
        "the rebalance onto the new disk",
        Duration::from_secs(120),
        |s| status_whole_and_idle(s) && has_event(s, "SpareFreed", "draid2-0-0"),
    );
    let detail = &status["detail"];
    assert_eq!(role_of(detail, "new0"), Some(role), "{detail}");
    assert_eq!(role_of(detail, "draid2-0-0"), None, "{detail}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &second_data,
        "after the rebalance",
    );
    served.stop();

    // Offline, with the new disk in place of the failed one, the array is
    // whole and consistent: any two children may go.
    let mut now: Vec<&str> = names.clone();
    now[3] = new.to_str().unwrap();
    assert_same_bytes(&copy_out_of(&now, dir.path()), &second_data, "copy-out");
    for lost in [[0usize, 1], [3, 10], [5, 7]] {
        assert_copy_out_without(&now, &lost, &second_data, dir.path(), "after the rebalance");
    }
}

#[test]
fn every_loss_within_parity_reads_back_and_one_more_is_refused() {
    for (spec, parity) in [
        ("draid1:3d:4c", 1usize),
        ("draid2:3d:5c", 2),
        ("draid3:3d:6c", 3),
    ] {
        let dir = scratch("draid-losses");
        let children = spec.rsplit(':').next().unwrap().trim_end_matches('c');
        let children: usize = children.parse().unwrap();
        let members = create_array(
            dir.path(),
            "m",
            &[
                "--level",
                spec,
                "--raid-devices",
                &children.to_string(),
                "--chunk",
                "16K",
            ],
            children,
            20 * MIB,
        );
        let names = paths(&members);
        let size = detail_offline(&names)["array_size_kib"].as_u64().unwrap() * 1024;
        let (img, data) = image(dir.path(), "data.img", 7, size);
        let served = serve(dir.path(), &[], &names);
        nbdcopy_in(&img, served.uri());
        served.stop();
        // Every set of at most `parity` children left out.
        let mut sets: Vec<Vec<usize>> = vec![vec![]];
        for _ in 0..parity {
            let mut next = Vec::new();
            for set in &sets {
                let from = set.last().map_or(0, |l| l + 1);
                for c in from..children {
                    let mut s = set.clone();
                    s.push(c);
                    next.push(s);
                }
            }
            sets.extend(next.iter().cloned());
            sets = sets
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
        }
        for lost in sets.iter().filter(|s| s.len() <= parity) {
            assert_copy_out_without(&names, lost, &data, dir.path(), spec);
        }
        // One more than parity: refused with one line, nothing read.
        let few: Vec<&str> = names[parity + 1..].to_vec();
        let out = dir.path().join("nothing.img");
        let mut args = vec!["copy-out", "--output", out.to_str().unwrap()];
        args.extend(few);
        let error = uraid_refused(&args);
        assert!(
            error.contains("missing") || error.contains("cannot"),
            "{spec}: {error}"
        );
    }
}

#[test]
fn a_rebuild_killed_mid_way_resumes_where_it_stood() {
    let dir = scratch("draid-kill");
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "draid2:3d:6c:1s",
            "--raid-devices",
            "6",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        6,
        40 * MIB,
    );
    let names = paths(&members);
    let size = detail_offline(&names)["array_size_kib"].as_u64().unwrap() * 1024;
    let (img, data) = image(dir.path(), "data.img", 3, size);
    let served = serve(dir.path(), &[], &names);
    nbdcopy_in(&img, served.uri());
    manage_ok(&served.control, &["--speed-limit-max", "2000"]);
    manage_ok(&served.control, &["--fail", names[2]]);
    // Past the first checkpoint (20%), then a crash.
    wait_status(
        &served.control,
        "a checkpoint",
        Duration::from_secs(120),
        |s| has_event(s, "Rebuild20", ""),
    );
    served.kill();
    let others: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, m)| *m)
        .collect();
    // Dirty and degraded, as md would say: started on purpose. md resyncs
    // an unclean array first; the rebuild goes on after, from where it
    // stood.
    let served = serve(dir.path(), &["--force"], &others);
    let status = wait_status(
        &served.control,
        "the rebuild again",
        Duration::from_secs(120),
        |s| has_event(s, "RebuildStarted", "draid2-0-0"),
    );
    let resumed_at: Vec<u64> = status_events(&status)
        .iter()
        .filter(|(e, d, _)| e == "RebuildStarted" && d.ends_with("draid2-0-0"))
        .filter_map(|(_, _, x)| {
            x.split(" at stripe ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        resumed_at.first().is_some_and(|at| *at > 0),
        "the rebuild resumes where its checkpoint stood, not at 0: {status}"
    );
    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    wait_status(
        &served.control,
        "the resumed rebuild",
        Duration::from_secs(120),
        status_whole_and_idle,
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "after the resumed rebuild",
    );
    served.stop();
}

#[test]
fn impossible_specs_and_md_only_operations_are_refused_with_one_line() {
    let dir = scratch("draid-refusals");
    let files = sparse_files(dir.path(), "m", &[64 * MIB; 6]);
    let names = paths(&files);
    for (spec, words) in [
        ("draid2:8d:6c:1s", "do not fit"),
        ("draid4", "is not 1, 2 or 3"),
        ("draid1:0d", "at least 1 data column"),
        ("draid2:2d:7c", "says 7 children but 6"),
        ("draid1:1d:1s:200s", "given twice"),
    ] {
        let mut args = vec!["create", "--level", spec, "--raid-devices", "6"];
        args.extend(names.iter().copied());
        let error = uraid_refused(&args);
        assert!(error.contains(words), "{spec}: {error}");
    }
    // Too small for one slice: one line, nothing written.
    let mut args = vec![
        "create",
        "--level",
        "draid1:4d:6c",
        "--raid-devices",
        "6",
        "--chunk",
        "64K",
    ];
    args.extend(names.iter().copied());
    let error = uraid_refused(&args);
    assert!(error.contains("slice"), "{error}");
    let error = uraid_refused(&["examine", names[0]]);
    assert!(
        error.contains("no md superblock"),
        "a refused create wrote a superblock: {error}"
    );

    // A real dRAID: md-only operations are refused, and md finds nothing.
    let members = create_array(
        dir.path(),
        "d",
        &[
            "--level",
            "draid1:2d:4c:1s",
            "--raid-devices",
            "4",
            "--chunk",
            "64K",
        ],
        4,
        40 * MIB,
    );
    let names = paths(&members);
    let served = serve(dir.path(), &[], &names);
    for args in [
        vec!["--grow", "--level", "6"],
        vec!["--grow", "--chunk", "128K"],
        vec!["--grow", "--size", "max"],
    ] {
        let error = manage_refused(&served.control, &args);
        assert!(error.contains("draid1"), "{args:?}: {error}");
    }
    // The array is untouched by the refusals.
    let status = array_status(&served.control);
    assert!(status_whole_and_idle(&status), "{status}");
    served.stop();
    // Its members are not md's: the first four bytes are not md's magic.
    let head = std::fs::read(&members[0]).unwrap();
    assert_ne!(&head[4096..4100], &0xa92b_4efcu32.to_le_bytes());
    assert_eq!(&head[4096..4100], b"uDRD");
    // A create over a dRAID member is refused like over any array.
    let mut args = vec!["create", "--level", "raid5", "--raid-devices", "4"];
    args.extend(names.iter().copied());
    let error = uraid_refused(&args);
    assert!(error.contains("d0"), "{error}");
}

/// The children that hold distributed spare 0's space, slice by slice,
/// read from the array's own geometry.
fn spare_space_children(members: &[&str]) -> Vec<usize> {
    let paths: Vec<std::path::PathBuf> = members.iter().map(std::path::PathBuf::from).collect();
    let array = uraid::array::assemble(&paths, true).expect("assemble");
    let uraid::geometry::Geometry::Draid(draid) = &array.geometry else {
        panic!("not a dRAID");
    };
    let mut children: Vec<usize> = (0..draid.slices())
        .map(|slice| draid.spare_child(0, slice * draid.devslice_sectors()))
        .collect();
    children.sort_unstable();
    children.dedup();
    children
}

/// The case of OpenZFS's promise: a child rebuilt onto the distributed
/// spare, then two more children fail (one of them holding the spare's
/// space, so the spare's role loses a column in the rows there) while a
/// client writes. Every byte reads back, after kill -9 and `serve --force`
/// too; detail says what is missing; new disks restore full redundancy.
#[test]
fn after_the_spare_rebuild_two_more_children_may_fail() {
    let dir = scratch("draid-promise");
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "draid2:4d:11c:1s",
            "--raid-devices",
            "11",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        11,
        120 * MIB,
    );
    let names = paths(&members);
    let size = detail_offline(&names)["array_size_kib"].as_u64().unwrap() * 1024;
    let space = spare_space_children(&names);
    let (first, _) = image(dir.path(), "first.img", 11, size);
    let served = serve(dir.path(), &[], &names);
    nbdcopy_in(&first, served.uri());
    manage_ok(&served.control, &["--fail", names[3]]);
    wait_status(
        &served.control,
        "the rebuild onto the distributed spare",
        Duration::from_secs(120),
        |s| status_whole_and_idle(s) && has_event(s, "SpareActive", "draid2-0-0"),
    );
    // One child that holds the spare's space, one that does not, while a
    // client writes the whole array again.
    let holding = *space
        .iter()
        .find(|c| **c != 3)
        .expect("a child holds the spare's space");
    let other = (0..11)
        .rev()
        .find(|c| *c != 3 && !space.contains(c))
        .expect("a child without the spare's space");
    let (second, second_data) = image(dir.path(), "second.img", 12, size);
    let uri = served.uri().to_string();
    let writer = std::thread::spawn(move || nbdcopy_in(&second, &uri));
    std::thread::sleep(Duration::from_millis(200));
    manage_ok(&served.control, &["--fail", names[holding]]);
    manage_ok(&served.control, &["--fail", names[other]]);
    writer.join().unwrap();
    let status = array_status(&served.control);
    assert!(
        !has_event(&status, "Fail", "draid2-0-0") && !has_event(&status, "Failed", ""),
        "the spare or the array was failed: {status}"
    );
    assert_eq!(
        role_of(&status["detail"], "draid2-0-0"),
        Some(3),
        "{status}"
    );
    let state = status["detail"]["state"].as_str().unwrap_or_default();
    assert!(state.contains("degraded"), "{state}: {status}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &second_data,
        "with two more children failed",
    );
    // kill -9: dirty and degraded, started on purpose as md would be.
    served.kill();
    let left: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != holding && *i != other)
        .map(|(_, m)| *m)
        .collect();
    let served = serve(dir.path(), &["--force"], &left);
    let detail = served.detail_json();
    assert_eq!(role_of(&detail, "draid2-0-0"), Some(3), "{detail}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &second_data,
        "after kill -9 and serve --force",
    );
    // Offline too, with the same children missing.
    assert_same_bytes(&copy_out_of(&left, dir.path()), &second_data, "copy-out");

    // Two new disks take the missing roles, a third the spare's.
    for k in 0..3 {
        let disk = sparse_files(dir.path(), &format!("new{k}-"), &[120 * MIB]).remove(0);
        let name = disk.file_name().unwrap().to_str().unwrap().to_string();
        manage_ok(&served.control, &["--add", disk.to_str().unwrap()]);
        wait_status(
            &served.control,
            "the work onto a new disk",
            Duration::from_secs(180),
            |s| {
                let idle = sync_line(s["mdstat"].as_str().unwrap_or_default()).is_none()
                    && s["detail"]["sync_status"].is_null();
                idle && role_of(&s["detail"], &name).is_some()
            },
        );
    }
    let status = wait_status(
        &served.control,
        "the rebalance",
        Duration::from_secs(180),
        |s| status_whole_and_idle(s) && role_of(&s["detail"], "draid2-0-0").is_none(),
    );
    let state = status["detail"]["state"].as_str().unwrap_or_default();
    assert!(!state.contains("degraded"), "{state}: {status}");
    manage_ok(&served.control, &["--action", "check"]);
    let status = wait_status(
        &served.control,
        "the check",
        Duration::from_secs(120),
        |s| {
            status_whole_and_idle(s)
                && has_event(s, "RebuildFinished", "")
                && s["mismatch_cnt"].is_number()
        },
    );
    assert_eq!(status["mismatch_cnt"], 0, "{status}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &second_data,
        "restored",
    );
    served.stop();
}
