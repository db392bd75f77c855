//! Bad input gets one clear line and changes nothing: every refusal below is
//! checked for a non-zero exit, exactly one `uraid: ...` line on stderr, the
//! expected reason, and member files byte-identical before and after.

mod common;
use common::*;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

fn digest(paths: &[PathBuf]) -> Vec<Vec<u8>> {
    paths
        .iter()
        .map(|p| Sha256::digest(std::fs::read(p).unwrap()).to_vec())
        .collect()
}

/// Runs a command that must be refused and must not touch `watched`.
fn refused(args: &[&str], watched: &[PathBuf], reason: &str) {
    let before = digest(watched);
    let stderr = uraid_refused(args);
    assert!(
        stderr.to_lowercase().contains(&reason.to_lowercase()),
        "uraid {args:?}: expected '{reason}' in {stderr:?}"
    );
    assert_eq!(
        before,
        digest(watched),
        "uraid {args:?} changed a device while refusing"
    );
}

fn array(dir: &std::path::Path, prefix: &str, level: &str, n: usize) -> Vec<PathBuf> {
    let members = sparse_files(dir, prefix, &vec![16 << 20; n]);
    let mut args = vec!["create", "--level", level, "--raid-devices"];
    let count = n.to_string();
    args.push(&count);
    args.extend(paths(&members));
    uraid_ok(&args);
    members
}

#[test]
fn create_refuses_bad_devices_and_options() {
    let dir = scratch("refuse-create");
    let blank = sparse_files(dir.path(), "blank", &[16 << 20; 4]);
    let b = paths(&blank);
    refused(
        &[
            "create",
            "--level",
            "raid7",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "unknown level",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--layout",
            "diagonal",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "unknown layout",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--chunk",
            "3K",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "chunk",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--chunk",
            "2K",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "chunk",
    );
    refused(
        &[
            "create",
            "--level",
            "6",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "at least 4",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "4",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "3 devices given for 4",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            b[0],
        ],
        &blank,
        "given twice",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            "/nonexistent/disk",
        ],
        &blank,
        "/nonexistent/disk",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            b[0],
            "missing",
            "missing",
        ],
        &blank,
        "cannot start",
    );
    refused(
        &[
            "create",
            "--level",
            "0",
            "--raid-devices",
            "2",
            b[0],
            "missing",
        ],
        &blank,
        "cannot start",
    );
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--size",
            "1G",
            b[0],
            b[1],
            b[2],
        ],
        &blank,
        "--size",
    );

    let tiny = sparse_files(dir.path(), "tiny", &[64 << 10]);
    let mut watched = blank.clone();
    watched.extend(tiny.clone());
    refused(
        &[
            "create",
            "--level",
            "1",
            "--raid-devices",
            "2",
            b[0],
            tiny[0].to_str().unwrap(),
        ],
        &watched,
        "too small",
    );

    // A device holding another array or a filesystem is refused unless forced.
    let other = array(dir.path(), "other", "raid1", 2);
    let mut watched = blank.clone();
    watched.extend(other.clone());
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            other[0].to_str().unwrap(),
        ],
        &watched,
        "part of an md array",
    );
    let fs = sparse_files(dir.path(), "ext4-", &[16 << 20]);
    let status = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&fs[0])
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(status.success());
    let mut watched = blank.clone();
    watched.extend(fs.clone());
    refused(
        &[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            b[0],
            b[1],
            fs[0].to_str().unwrap(),
        ],
        &watched,
        "ext2/3/4 filesystem",
    );
    // With --force it goes ahead.
    uraid_ok(&[
        "create",
        "--force",
        "--level",
        "5",
        "--raid-devices",
        "3",
        b[0],
        b[1],
        fs[0].to_str().unwrap(),
    ]);
}

#[test]
fn assembly_refuses_mixed_corrupt_and_insufficient_members() {
    let dir = scratch("refuse-assemble");
    let r5 = array(dir.path(), "a", "raid5", 3);
    let r1 = array(dir.path(), "b", "raid1", 2);
    let out = dir.path().join("out.img");
    let out_s = out.to_str().unwrap();
    let a = paths(&r5);
    let mut all = r5.clone();
    all.extend(r1.clone());
    refused(
        &[
            "copy-out",
            "--output",
            out_s,
            a[0],
            a[1],
            r1[0].to_str().unwrap(),
        ],
        &all,
        "different arrays",
    );
    refused(
        &["copy-out", "--output", out_s, a[0]],
        &all,
        "cannot start raid5",
    );
    refused(
        &["copy-out", "--output", out_s, a[0], a[0], a[1]],
        &all,
        "given twice",
    );
    refused(
        &["copy-out", "--output", a[2], a[0], a[1], a[2]],
        &all,
        "one of the array's members",
    );

    let image = dir.path().join("in.img");
    std::fs::write(&image, random_bytes(1, 64 << 20)).unwrap();
    refused(
        &[
            "copy-in",
            "--input",
            image.to_str().unwrap(),
            a[0],
            a[1],
            a[2],
        ],
        &all,
        "more than the array",
    );

    // A flipped byte in a superblock: the checksum no longer matches.
    let corrupt = dir.path().join("corrupt");
    std::fs::copy(&r5[1], &corrupt).unwrap();
    let mut bytes = std::fs::read(&corrupt).unwrap();
    bytes[4096 + 40] ^= 0x55;
    std::fs::write(&corrupt, &bytes).unwrap();
    let mut watched = all.clone();
    watched.push(corrupt.clone());
    refused(
        &["examine", corrupt.to_str().unwrap()],
        &watched,
        "checksum",
    );
    refused(
        &[
            "copy-out",
            "--output",
            out_s,
            a[0],
            corrupt.to_str().unwrap(),
            a[2],
        ],
        &watched,
        "checksum",
    );
    // A member cut short: its superblock promises more data than it holds.
    let truncated = dir.path().join("truncated");
    std::fs::copy(&r5[2], &truncated).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    watched.push(truncated.clone());
    refused(
        &[
            "copy-out",
            "--output",
            out_s,
            a[0],
            a[1],
            truncated.to_str().unwrap(),
        ],
        &watched,
        "exceeds",
    );
    // Something that is no md member at all.
    refused(
        &["examine", image.to_str().unwrap()],
        &watched,
        "no md superblock",
    );
    refused(
        &["detail", image.to_str().unwrap()],
        &watched,
        "no md superblock",
    );
    assert!(
        !out.exists(),
        "no output file is left behind by a refused copy-out"
    );
}

/// `create --level LEVEL --raid-devices N OPTIONS... --write-journal
/// JOURNAL MEMBERS...`.
fn create_journaled<'a>(
    level: &'a str,
    count: &'a str,
    options: &[&'a str],
    journal: &'a str,
    members: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["create", "--level", level, "--raid-devices", count];
    args.extend_from_slice(options);
    args.extend(["--write-journal", journal]);
    args.extend_from_slice(members);
    args
}

#[test]
fn journal_refusals() {
    let dir = scratch("refuse-journal");
    let blank = sparse_files(dir.path(), "blank", &[16 << 20; 3]);
    let journal = sparse_files(dir.path(), "journal", &[16 << 20]);
    let small = sparse_files(dir.path(), "small", &[4 << 20]);
    let b = paths(&blank);
    let j = journal[0].to_str().unwrap();
    let mut watched = blank.clone();
    watched.extend(journal.clone());
    watched.extend(small.clone());

    // A journal is for raid4/5/6 alone, excludes a bitmap, needs metadata
    // whose superblock is not at the end, and room for a row of chunks.
    refused(
        &create_journaled("1", "2", &[], j, &b[..2]),
        &watched,
        "a write journal is for raid4/5/6",
    );
    refused(
        &create_journaled("0", "2", &[], j, &b[..2]),
        &watched,
        "a write journal is for raid4/5/6",
    );
    refused(
        &create_journaled("5", "3", &["--bitmap", "internal"], j, &b),
        &watched,
        "both a write journal and a bitmap",
    );
    refused(
        &create_journaled("5", "3", &["--metadata", "1.0"], j, &b),
        &watched,
        "1.1 or 1.2 metadata",
    );
    refused(
        &create_journaled("5", "3", &[], small[0].to_str().unwrap(), &b),
        &watched,
        "too small for the journal",
    );

    uraid_ok(&create_journaled("5", "3", &[], j, &b));
    let mut array = blank.clone();
    array.extend(journal.clone());
    // Served without its journal it is refused: the journal may hold
    // writes the members lack. try_serve first, so that a server that
    // starts anyway fails the test instead of hanging `refused`.
    let missing = "write journal that was not given";
    match try_serve(dir.path(), &[], &b) {
        Ok(_) => panic!("serve of a journal array without its journal started"),
        Err((_, stderr)) => assert!(stderr.contains(missing), "{stderr}"),
    }
    let nbd = format!("unix:{}", dir.path().join("refused.sock").display());
    let control = dir.path().join("refused.ctl");
    let mut serve_args = vec![
        "serve",
        "--nbd",
        &nbd,
        "--control",
        control.to_str().unwrap(),
    ];
    serve_args.extend_from_slice(&b);
    refused(&serve_args, &array, missing);
    // Read-only, it serves, and writes nothing.
    let before = digest(&array);
    let served = serve(dir.path(), &["--read-only"], &b);
    assert_eq!(
        served.detail_json()["raid_level"],
        "raid5",
        "serve --read-only without the journal"
    );
    served.stop();
    assert_eq!(
        before,
        digest(&array),
        "serve --read-only wrote to the array"
    );

    // copy-in would write behind the journal's back, with or without it given.
    let image = dir.path().join("in.img");
    std::fs::write(&image, random_bytes(2, 1 << 20)).unwrap();
    let image = image.to_str().unwrap();
    let mut with_journal = b.clone();
    with_journal.push(j);
    for devices in [&b, &with_journal] {
        let mut args = vec!["copy-in", "--input", image];
        args.extend_from_slice(devices);
        refused(&args, &array, "the array has a write journal");
    }
}

/// `--set help` lists the knobs on its own, without the devices and
/// options a real create, serve or manage needs (the README points to it).
#[test]
fn set_help_lists_the_knobs_alone() {
    for command in [
        &["create", "--set", "help"][..],
        &["serve", "--set=help"],
        &["manage", "--set", "help"],
    ] {
        let out = uraid_ok(command);
        let text = String::from_utf8_lossy(&out.stdout);
        for knob in ["stripe_cache_size", "read_ahead", "rmw_level", "fast_path"] {
            assert!(text.contains(knob), "{command:?}: {knob} missing:\n{text}");
        }
    }
}

/// A path that is not UTF-8 is a path like any other: a one-line error
/// for a missing device, never a panic of the argument reader.
#[test]
fn arguments_need_not_be_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let out = uraid()
        .arg("examine")
        .arg(std::ffi::OsStr::from_bytes(b"/nonexistent/\xff"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `manage --grow --size` on a served array: refused in one line, with the
/// members as they were (byte for byte while nothing else runs; their size
/// fields while a rebuild writes them).
#[test]
fn grow_size_refusals() {
    let dir = scratch("refuse-grow-size");
    let d = dir.path();
    let size_fields = |members: &[PathBuf]| -> Vec<String> {
        let mut args = vec!["examine"];
        args.extend(paths(members));
        String::from_utf8_lossy(&uraid_ok(&args).stdout)
            .lines()
            .filter(|l| l.contains("Dev Size :") || l.contains("Array Size :"))
            .map(str::to_string)
            .collect()
    };
    let grow_refused = |served: &Served, members: &[PathBuf], size: &str, reason: &str| {
        let before = digest(members);
        let said = manage_refused(&served.control, &["--grow", "--size", size]);
        assert!(
            said.to_lowercase().contains(&reason.to_lowercase()),
            "--size {size}: expected '{reason}' in {said:?}"
        );
        assert_eq!(before, digest(members), "--size {size} changed a member");
    };

    // Refused whatever the size: the level, the layout, the metadata.
    let refused_as_created = |prefix: &str, options: &[&str], disks: usize, reason: &str| {
        let members = create_array(d, prefix, options, disks, 16 << 20);
        let served = serve(d, &[], &paths(&members));
        grow_refused(&served, &members, "max", reason);
        served.stop();
    };
    refused_as_created(
        "r0-",
        &["--level", "0", "--raid-devices", "2"],
        2,
        "cannot change component size",
    );
    refused_as_created(
        "far-",
        &[
            "--level",
            "10",
            "--layout",
            "f2",
            "--raid-devices",
            "4",
            "--size",
            "4M",
        ],
        4,
        "far layouts",
    );
    // 1.0 keeps its bitmap at the end, next to the superblock md would move.
    refused_as_created(
        "v10-",
        &[
            "--level",
            "1",
            "--raid-devices",
            "2",
            "--metadata",
            "1.0",
            "--size",
            "4M",
            "--bitmap",
            "internal",
        ],
        2,
        "remove the bitmap",
    );

    let members = create_array(
        d,
        "r5-",
        &[
            "--level",
            "5",
            "--raid-devices",
            "4",
            "--chunk",
            "64K",
            "--size",
            "4M",
        ],
        4,
        16 << 20,
    );
    let served = serve(d, &["--read-only"], &paths(&members));
    grow_refused(&served, &members, "max", "read-only");
    served.stop();

    let served = serve(d, &[], &paths(&members));
    grow_refused(&served, &members, "100M", "does not fit every member");
    grow_refused(&served, &members, "32K", "below the 64 KiB chunk");
    // Bad strings are refused before the server is asked.
    grow_refused(&served, &members, "12Q", "invalid size");
    grow_refused(&served, &members, "0", "give max");
    let said = manage_refused(&served.control, &["--grow"]);
    assert!(
        said.contains("--bitmap") && said.contains("--size"),
        "{said}"
    );
    // A check (md: EBUSY while any sync runs), slowed down to be caught.
    manage_ok(&served.control, &["--speed-limit-max", "1000"]);
    manage_ok(&served.control, &["--action", "check"]);
    grow_refused(&served, &members, "max", "a check is running");
    manage_ok(&served.control, &["--action", "idle"]);
    // A rebuild writes its member, so only the size fields are compared.
    let spare = sparse_files(d, "spare", &[16 << 20]);
    manage_ok(&served.control, &["--fail", members[1].to_str().unwrap()]);
    manage_ok(&served.control, &["--remove", members[1].to_str().unwrap()]);
    manage_ok(&served.control, &["--add", spare[0].to_str().unwrap()]);
    let mut all = members.clone();
    all.push(spare[0].clone());
    let before = size_fields(&all);
    let said = manage_refused(&served.control, &["--grow", "--size", "max"]);
    assert!(said.contains("recovery is running"), "{said}");
    assert_eq!(before, size_fields(&all), "a refused grow changed a size");
    served.stop();
}

/// `manage --grow` asking for a reshape uraid cannot or may not run:
/// refused in one line, every member (spares too) byte for byte as it was.
#[test]
fn reshape_refusals() {
    let dir = scratch("refuse-reshape");
    let d = dir.path();
    let reshape_refused = |served: &Served, members: &[PathBuf], grow: &[&str], reason: &str| {
        let before = digest(members);
        let mut args = vec!["--grow"];
        args.extend_from_slice(grow);
        let said = manage_refused(&served.control, &args);
        assert!(
            said.to_lowercase().contains(&reason.to_lowercase()),
            "{grow:?}: expected '{reason}' in {said:?}"
        );
        assert_eq!(before, digest(members), "{grow:?} changed a member");
    };
    let r5 = ["--level", "5", "--raid-devices", "4", "--chunk", "64K"];
    let members = create_array(d, "r5-", &r5, 4, 16 << 20);
    let served = serve(d, &[], &paths(&members));
    reshape_refused(&served, &members, &["--raid-devices", "5"], "needs 1 spare");
    // A shrink: the size it leaves must be stated, at least 2 members
    // stay, and the data needs room after it to move up.
    reshape_refused(
        &served,
        &members,
        &["--raid-devices", "3"],
        "this change will reduce the size of the array",
    );
    reshape_refused(
        &served,
        &members,
        &["--raid-devices", "1", "--array-size", "64M"],
        "at least 2 members",
    );
    let two_thirds = format!("{}K", array_bytes(&paths(&members)) / 3 * 2 / 1024);
    reshape_refused(
        &served,
        &members,
        &["--raid-devices", "3", "--array-size", "64M"],
        "--array-size 65536 KiB",
    );
    reshape_refused(
        &served,
        &members,
        &["--raid-devices", "3", "--array-size", &two_thirds],
        "not enough room after the data",
    );
    // Level changes: raid6 needs a spare for Q, raid6 and raid0 are not
    // one step apart, and the level goes alone.
    reshape_refused(&served, &members, &["--level", "6"], "add a spare first");
    reshape_refused(
        &served,
        &members,
        &["--level", "10"],
        "md cannot change raid5 to raid10",
    );
    reshape_refused(
        &served,
        &members,
        &["--level", "6", "--raid-devices", "7"],
        "two commands",
    );
    reshape_refused(
        &served,
        &members,
        &["--level", "4", "--chunk", "128K"],
        "two commands",
    );
    reshape_refused(
        &served,
        &members,
        &["--layout", "sideways"],
        "unknown layout",
    );
    reshape_refused(&served, &members, &["--chunk", "3K"], "power of two");
    reshape_refused(&served, &members, &["--chunk", "64K"], "nothing to change");
    // A check runs (md: EBUSY), slowed down to be caught.
    manage_ok(&served.control, &["--speed-limit-max", "1000"]);
    manage_ok(&served.control, &["--action", "check"]);
    reshape_refused(&served, &members, &["--chunk", "128K"], "a check runs");
    manage_ok(&served.control, &["--action", "idle"]);
    served.stop();

    let served = serve(d, &["--read-only"], &paths(&members));
    reshape_refused(&served, &members, &["--chunk", "128K"], "read-only");
    served.stop();

    let refused_as_created = |prefix: &str, options: &[&str], grow: &[&str], reason: &str| {
        let members = create_array(d, prefix, options, 4, 16 << 20);
        let served = serve(d, &[], &paths(&members));
        reshape_refused(&served, &members, grow, reason);
        served.stop();
    };
    refused_as_created(
        "r1-",
        &["--level", "1", "--raid-devices", "4"],
        &["--raid-devices", "3"],
        "fail and remove members first",
    );
    refused_as_created(
        "r10-",
        &["--level", "10", "--raid-devices", "4"],
        &["--raid-devices", "5"],
        "needs 1 spare",
    );
    refused_as_created(
        "r10f2-",
        &["--level", "10", "--layout", "f2", "--raid-devices", "4"],
        &["--chunk", "128K"],
        "far layout",
    );
    refused_as_created(
        "r1to5-",
        &["--level", "1", "--raid-devices", "4"],
        &["--level", "5"],
        "only a raid1 of 2 members",
    );
    refused_as_created(
        "r6to0-",
        &["--level", "6", "--raid-devices", "4"],
        &["--level", "0"],
        "through raid5",
    );
    refused_as_created(
        "v10-",
        &["--level", "5", "--raid-devices", "4", "--metadata", "1.0"],
        &["--chunk", "128K"],
        "backup file",
    );
}

#[test]
fn plan_refuses_bad_layouts_sizes_and_assumptions() {
    let base = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["plan", "--raid-devices", "12"];
        args.extend_from_slice(extra);
        args
    };
    let speed = ["--member-size", "4TB", "--member-speed", "200MB/s"];
    let with_speed = |extra: &[&'static str]| {
        let mut args = base(&speed);
        args.extend_from_slice(extra);
        args
    };
    for (args, reason) in [
        (with_speed(&["--level", "raid7"]), "unknown level"),
        (
            with_speed(&["--level", "draid4:8d"]),
            "parity 4 is not 1, 2 or 3",
        ),
        (with_speed(&["--level", "draid2:11d:1s"]), "do not fit"),
        (with_speed(&["--level", "draid1:8d:90c"]), "has 90 children"),
        (with_speed(&["--level", "draid1:8d:101s"]), "more than 100"),
        (
            with_speed(&["--level", "draid1:1d:256c"]),
            "outside 2..=255",
        ),
        (with_speed(&["--level", "draid2:8d:4s"]), "do not fit"),
        (with_speed(&["--level", "draid1:8x"]), "unexpected '8x'"),
        (with_speed(&["--efficiency", "0"]), "efficiency 0"),
        (with_speed(&["--efficiency", "fast"]), "efficiency 'fast'"),
        (with_speed(&["--afr", "150%"]), "annual failure rate"),
        (
            with_speed(&["--ure", "0.5"]),
            "unrecoverable read error rate",
        ),
        (with_speed(&["--imbalance", "0.5"]), "imbalance"),
        (with_speed(&["--chunk", "3K"]), "power of two"),
        (with_speed(&["--device-model", "hdd-14t"]), "not both"),
        (base(&["--device-model", "floppy"]), "unknown device model"),
        (
            base(&["--device-model", "hdd-4t", "--member-size", "5TB"]),
            "larger than hdd-4t",
        ),
        (base(&["--member-size", "4TB"]), "--device-model"),
        (
            base(&["--member-size", "abc", "--member-speed", "1M"]),
            "member size 'abc'",
        ),
        (
            base(&["--member-size", "4TB", "--member-speed", "0"]),
            "above zero",
        ),
        (
            vec!["plan", "--raid-devices", "1", "--device-model", "nvme"],
            "from 2 to 255",
        ),
        (
            vec!["plan", "--raid-devices", "x", "--device-model", "nvme"],
            "from 2 to 255",
        ),
        (
            vec![
                "plan",
                "--raid-devices",
                "3",
                "--device-model",
                "nvme",
                "--level",
                "raid6",
            ],
            "at least 4",
        ),
    ] {
        refused(&args, &[], reason);
    }
}
