//! Arrays the Linux kernel's md left part way through a reshape (in
//! user-mode Linux, tests/kernel/uml-run), read by uraid.
//!
//! For each conversion mdadm 4.2 and the kernel run (raid5 and raid6 gaining
//! a member, raid5 changing its chunk, its layout, and becoming raid6), the
//! guest creates the array, fills it with a known pattern, starts the
//! reshape under a low speed limit, overwrites a region while it runs, and
//! stops the array midway. It then assembles it again read-only, where the
//! reshape cannot move, and reads every byte: that is what md serves, the
//! oracle. On the host:
//!
//! - `uraid copy-out` reads exactly the kernel's bytes, also with a member
//!   missing; where mdadm's reshape is sound (a grow) those bytes are the
//!   pattern with the overwritten region;
//! - `uraid examine` prints what `mdadm --examine` prints, reshape lines
//!   included; `uraid detail` says "reshaping" with md's Delta Devices and
//!   New Layout/Chunksize;
//! - `uraid serve --read-only` serves the array mid-reshape, each sector
//!   from its side of the point, the new member of a raid5-to-raid6 (which
//!   md rebuilds along with the reshape) only on the done side.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};

const MIB: usize = 1 << 20;
/// Each member's size: small, so that the reshape is seconds long.
const MEMBER_BYTES: u64 = 48 << 20;
/// The region written while the reshape runs (array offset and length).
const DURING_AT: usize = 4 * MIB;
const DURING_LEN: usize = 2 * MIB;

struct Case {
    name: &'static str,
    /// Member files; the first `initial` make the array, the rest are
    /// added as spares before the grow.
    members: usize,
    initial: usize,
    create: &'static str,
    grow: &'static str,
    /// Whether the kernel's reshape, stopped midway, keeps every byte. A
    /// same-size reshape stopped by `mdadm --stop` does not in the kernel
    /// this suite boots (6.1 with mdadm 4.2): the region at the reshape
    /// point reads back data from further on. uraid must read what md
    /// reads all the same.
    kernel_keeps_data: bool,
    delta: i64,
    new_layout: Option<&'static str>,
    new_chunk_kib: Option<u64>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "r5grow",
            members: 5,
            initial: 4,
            create: "--level=5 --raid-devices=4 --chunk=64",
            grow: "--raid-devices=5",
            kernel_keeps_data: true,
            delta: 1,
            new_layout: None,
            new_chunk_kib: None,
        },
        Case {
            name: "r6grow",
            members: 6,
            initial: 5,
            create: "--level=6 --raid-devices=5 --chunk=32 --layout=left-asymmetric",
            grow: "--raid-devices=6",
            kernel_keeps_data: true,
            delta: 1,
            new_layout: None,
            new_chunk_kib: None,
        },
        Case {
            name: "r5chunk",
            members: 4,
            initial: 4,
            create: "--level=5 --raid-devices=4 --chunk=64",
            grow: "--chunk=128",
            kernel_keeps_data: false,
            delta: 0,
            new_layout: None,
            new_chunk_kib: Some(128),
        },
        Case {
            name: "r5layout",
            members: 4,
            initial: 4,
            create: "--level=5 --raid-devices=4 --chunk=64",
            grow: "--layout=right-asymmetric",
            kernel_keeps_data: false,
            delta: 0,
            new_layout: Some("right-asymmetric"),
            new_chunk_kib: None,
        },
        Case {
            name: "r5to6",
            members: 5,
            initial: 4,
            create: "--level=5 --raid-devices=4 --chunk=64",
            grow: "--level=6 --raid-devices=5",
            kernel_keeps_data: false,
            delta: 0,
            new_layout: Some("left-symmetric"),
            new_chunk_kib: None,
        },
    ]
}

/// The guest's lines for one case. Prints `SIZE name bytes` and
/// `POS name sectors`, leaves `name.kernel-examine` and `name.kernel-read`.
fn guest_lines(case: &Case, dir: &Path, files: &[PathBuf]) -> String {
    let name = case.name;
    let d = dir.display();
    let mut s = format!("echo '== {name}'\n{}", losetup_lines(files));
    let _ = writeln!(
        s,
        "mdadm --create /dev/md0 --run --assume-clean --metadata=1.2 {} \"${{L[@]:0:{}}}\" >{d}/{name}.create 2>&1",
        case.create, case.initial
    );
    s.push_str("sz=$(blockdev --getsize64 /dev/md0)\n");
    let _ = writeln!(s, "echo \"SIZE {name} $sz\"");
    let _ = writeln!(
        s,
        "dd if={d}/pattern of=/dev/md0 bs=1M count=$((sz >> 20)) oflag=direct status=none"
    );
    for spare in case.initial..case.members {
        let _ = writeln!(s, "mdadm /dev/md0 --add \"${{L[{spare}]}}\" >/dev/null");
    }
    // Slow enough to stop midway (uml-run raised the minimum).
    s.push_str("echo 1000 > /proc/sys/dev/raid/speed_limit_min\n");
    s.push_str("echo 2000 > /proc/sys/dev/raid/speed_limit_max\n");
    let _ = writeln!(
        s,
        "mdadm --grow /dev/md0 {} >{d}/{name}.grow 2>&1",
        case.grow
    );
    // mdadm's helper for a same-size reshape raises this array's minimum
    // to 200000 KiB/s (mdadm 4.2); lower it again, twice, in case the
    // helper wrote it after the first.
    for pause in ["0.5", "0.5"] {
        s.push_str("echo 1000 > /sys/block/md0/md/sync_speed_min || true\n");
        s.push_str("echo 2000 > /sys/block/md0/md/sync_speed_max || true\n");
        let _ = writeln!(s, "sleep {pause}");
    }
    let _ = writeln!(
        s,
        "dd if={d}/during of=/dev/md0 bs=1M seek={} count={} oflag=direct conv=notrunc status=none",
        DURING_AT / MIB,
        DURING_LEN / MIB
    );
    let _ = writeln!(
        s,
        "echo \"POS {name} $(cat /sys/block/md0/md/reshape_position)\""
    );
    s.push_str("mdadm --stop /dev/md0 >/dev/null\n");
    let _ = writeln!(
        s,
        "mdadm --examine \"${{L[0]}}\" >{d}/{name}.kernel-examine 2>&1"
    );
    // Read-only, md does not move the reshape on: what it serves now is
    // what it would serve had it never stopped.
    s.push_str("mdadm --assemble --readonly /dev/md0 \"${L[@]}\" >/dev/null\n");
    let _ = writeln!(
        s,
        "dd if=/dev/md0 of={d}/{name}.kernel-read bs=1M iflag=direct status=none"
    );
    s.push_str("mdadm --stop /dev/md0 >/dev/null\n");
    s.push_str("for l in \"${L[@]}\"; do losetup -d \"$l\"; done\n");
    s
}

#[test]
fn kernel_mid_reshape_arrays_read_as_the_kernel_reads_them() {
    let dir = scratch("reshape-kernel");
    let dir = dir.path();
    let pattern = random_bytes(19, 300 * MIB);
    let during = random_bytes(20, DURING_LEN);
    std::fs::write(dir.join("pattern"), &pattern).unwrap();
    std::fs::write(dir.join("during"), &during).unwrap();
    let cases = cases();
    let (out, members) = run_guest_cases(
        dir,
        &cases,
        |c| (c.name, c.members),
        MEMBER_BYTES,
        |c, files| guest_lines(c, dir, files),
        400,
    );
    let sizes = results(&out, "SIZE");
    let positions = results(&out, "POS");

    for (case, files) in cases.iter().zip(&members) {
        let name = case.name;
        let size: usize = sizes[name].parse().unwrap();
        let kernel_examine =
            std::fs::read_to_string(dir.join(format!("{name}.kernel-examine"))).unwrap();
        // Where the stop left it, as md recorded it (KiB in mdadm's text).
        let position = kernel_examine
            .lines()
            .find_map(|l| l.trim().strip_prefix("Reshape pos'n : "))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 2)
            .unwrap_or_else(|| {
                panic!(
                    "{name}: no reshape in progress at the stop ({:?}): {kernel_examine}",
                    positions.get(name)
                )
            });
        assert!(
            position > 0 && (position as usize) < size / 512,
            "{name}: the stop came at {position}, not midway"
        );
        let kernel_read = std::fs::read(dir.join(format!("{name}.kernel-read"))).unwrap();
        assert_eq!(kernel_read.len(), size, "{name}: md serves the old size");
        let all = paths(files);
        assert_same_bytes(
            &copy_out(&all, dir),
            &kernel_read,
            &format!("{name}: copy-out"),
        );
        let mut expected = pattern[..size].to_vec();
        expected[DURING_AT..DURING_AT + DURING_LEN].copy_from_slice(&during);
        let damaged = differing_range(&kernel_read, &expected);
        if case.kernel_keeps_data {
            assert_same_bytes(&kernel_read, &expected, &format!("{name}: md's bytes"));
        } else if let Some(range) = &damaged {
            // What md lost lies past the point it recorded: rows it had
            // rewritten in the new geometry after its last checkpoint,
            // over old rows the record still points to.
            let at = position as usize * 512;
            assert!(
                range.start >= at,
                "{name}: md's bytes differ at {range:?}, before the reshape point {at}"
            );
        }
        // Without a member, reconstructed in whichever geometry holds the
        // sector. Rows md left inconsistent reconstruct to other bytes than
        // md reads from their members, so they are left out.
        let mask = |bytes: &[u8]| -> Vec<u8> {
            let mut bytes = bytes.to_vec();
            if let Some(range) = &damaged {
                if !case.kernel_keeps_data {
                    let row = 4 * MIB;
                    let from = range.start / row * row;
                    let to = (range.end.div_ceil(row) * row).min(bytes.len());
                    bytes[from..to].fill(0);
                }
            }
            bytes
        };
        for missing in [0, case.members - 1] {
            let some: Vec<&str> = (0..case.members)
                .filter(|m| *m != missing)
                .map(|m| all[m])
                .collect();
            assert_same_bytes(
                &mask(&copy_out(&some, dir)),
                &mask(&kernel_read),
                &format!("{name}: copy-out without member {missing}"),
            );
        }

        let ours = String::from_utf8(uraid_ok(&["examine", all[0]]).stdout).unwrap();
        assert_eq!(
            examine_comparable(&kernel_examine),
            examine_comparable(&ours),
            "{name}: examine differs\n--- mdadm\n{kernel_examine}\n--- uraid\n{ours}"
        );

        let detail = detail_offline(&all);
        assert!(
            detail["state"].as_str().unwrap().contains("reshaping"),
            "{name}: {detail}"
        );
        assert_eq!(
            detail["array_size_kib"].as_u64().unwrap() as usize,
            size / 1024
        );
        let reshape = &detail["reshape"];
        assert_eq!(
            reshape["position_sectors"].as_u64(),
            Some(position),
            "{name}"
        );
        assert_eq!(
            reshape["delta_devices"].as_i64(),
            Some(case.delta),
            "{name}"
        );
        assert_eq!(reshape["new_layout"].as_str(), case.new_layout, "{name}");
        assert_eq!(
            reshape["new_chunk_kib"].as_u64(),
            case.new_chunk_kib,
            "{name}"
        );

        // Served read-only, the array stays mid-reshape and NBD reads map
        // each sector by its side of the point (for raid5-to-raid6, the
        // new Q member serves only the done side).
        let served = serve(dir, &["--read-only"], &all);
        let status = array_status(&served.control);
        assert!(
            status["mdstat"].as_str().unwrap().contains("reshape ="),
            "{name}: {}",
            status["mdstat"]
        );
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir),
            &kernel_read,
            &format!("{name}: served read-only"),
        );
        served.stop();
        let after = String::from_utf8(uraid_ok(&["examine", all[0]]).stdout).unwrap();
        assert_eq!(ours, after, "{name}: serving changed the superblock");
    }
}

/// The span from the first to the last byte where `a` and `b` differ.
fn differing_range(a: &[u8], b: &[u8]) -> Option<std::ops::Range<usize>> {
    assert_eq!(a.len(), b.len());
    let first = a.iter().zip(b).position(|(x, y)| x != y)?;
    let last = a.iter().zip(b).rposition(|(x, y)| x != y)?;
    Some(first..last + 1)
}

/// Creates `level` on `disks` members and `spares` spares with uraid and
/// fills it with a pattern; returns the members and the pattern.
fn uraid_array(
    dir: &Path,
    name: &str,
    level: &str,
    disks: usize,
    spares: usize,
    chunk: &str,
    seed: u64,
) -> (Vec<PathBuf>, Served, Vec<u8>) {
    let chunk_args: &[&str] = if chunk.is_empty() {
        &[]
    } else {
        &["--chunk", chunk]
    };
    filled_array(
        dir,
        name,
        (level, disks, spares),
        chunk_args,
        MEMBER_BYTES,
        seed,
    )
}

/// uraid reshapes arrays while a client writes and reads through NBD; the
/// kernel assembles each result: same bytes, the new shape, mismatch_cnt 0.
/// A reshape uraid was killed in (SIGKILL) is continued by the kernel; one
/// the kernel stopped midway is continued by `uraid serve`.
#[test]
fn uraid_reshapes_while_serving_and_hands_over_to_and_from_the_kernel() {
    let dir = scratch("reshape-serve");
    let dir = dir.path();
    let mut grown: Vec<KernelCheck> = Vec::new();

    // Reshapes uraid runs to the end, under a client's writes.
    type Run = (
        &'static str,
        &'static str,
        usize,
        usize,
        &'static str,
        &'static [&'static str],
        &'static str,
    );
    let runs: [Run; 6] = [
        (
            "r5add",
            "raid5",
            4,
            1,
            "64K",
            &["--raid-devices", "5"],
            "raid5 5 64 2",
        ),
        (
            "r6add",
            "raid6",
            5,
            2,
            "32K",
            &["--raid-devices", "7"],
            "raid6 7 32 2",
        ),
        (
            "r5chunk",
            "raid5",
            4,
            0,
            "64K",
            &["--chunk", "128K"],
            "raid5 4 128 2",
        ),
        (
            "r5layout",
            "raid5",
            4,
            0,
            "64K",
            &["--layout", "left-asymmetric"],
            "raid5 4 64 0",
        ),
        // A takeover: raid4 is raid5's parity-last layout, nothing moves.
        (
            "r4to5",
            "raid4",
            4,
            0,
            "64K",
            &["--level", "5"],
            "raid5 4 64 5",
        ),
        // A raid1 grows at once; the spare is recovered into the new role.
        (
            "r1add",
            "raid1",
            2,
            1,
            "",
            &["--raid-devices", "3"],
            "raid1 3 0 0",
        ),
    ];
    for (i, (name, level, disks, spares, chunk, change, md_shape)) in runs.iter().enumerate() {
        let (files, served, _) =
            uraid_array(dir, name, level, *disks, *spares, chunk, 100 + i as u64);
        let mdstat = grow_slowly(&served, change);
        // A takeover and a raid1's new count take effect at once.
        let takeover = change[0] == "--level" || *level == "raid1";
        assert_eq!(mdstat.contains("reshape ="), !takeover, "{name}: {mdstat}");
        let (patched, _) = patch_while_reshaping(&served, dir, name, 7 + i as u64, 256 * 1024);
        if !takeover {
            wait_reshape_finished(&served, name);
        }
        let size = array_bytes(&paths(&files)[..*disks + *spares]) as usize;
        assert_reads_back(&served, dir, name, &patched, size);
        served.stop();
        let parts: Vec<&str> = md_shape.split(' ').collect();
        grown.push(KernelCheck {
            name: name.to_string(),
            expected: expected_file(dir, name, patched, size),
            members: files,
            shape: shape(
                parts[0],
                parts[1].parse().unwrap(),
                parts[2].parse().unwrap(),
                parts[3].parse::<i32>().unwrap(),
            ),
        });
    }

    // A reshape uraid is killed in: the kernel continues it.
    let (files, served, pattern) = uraid_array(dir, "r5killed", "raid5", 4, 1, "64K", 200);
    kill_mid_reshape(served, &["--raid-devices", "5"], paths(&files)[0]);
    // The new size: the old one with a fourth data member.
    let size = pattern.len() / 3 * 4;
    // uraid resumes it too, on a copy: the next serve finishes it.
    let copies = copy_files(&files);
    let (resumed, back) = serve_to_the_end(dir, &paths(&copies), "r5killed");
    assert_eq!(back.len(), size);
    assert_same_bytes(
        &back[..pattern.len()],
        &pattern,
        "r5killed: resumed by uraid",
    );
    resumed.stop();
    grown.push(KernelCheck {
        name: "r5killed".into(),
        expected: expected_file(dir, "r5killed", pattern, size),
        members: files,
        shape: shape("raid5", 5, 64, 2),
    });

    // A reshape the kernel stopped midway: uraid serve continues it.
    let kfiles = sparse_files(dir, "kstarted.", &[MEMBER_BYTES; 5]);
    let kpattern = random_bytes(300, 200 * MIB);
    std::fs::write(dir.join("kpattern"), &kpattern).unwrap();
    let d = dir.display();
    let mut script = format!("export MDADM_NO_SYSTEMCTL=1\n{}", losetup_lines(&kfiles));
    let _ = writeln!(
        script,
        "mdadm --create /dev/md0 --run --assume-clean --metadata=1.2 --level=5 --raid-devices=4 --chunk=64 \"${{L[@]:0:4}}\" >/dev/null 2>&1\n\
         sz=$(blockdev --getsize64 /dev/md0); echo \"SIZE kstarted $sz\"\n\
         dd if={d}/kpattern of=/dev/md0 bs=1M count=$((sz >> 20)) oflag=direct status=none\n\
         mdadm /dev/md0 --add \"${{L[4]}}\" >/dev/null\n\
         echo 1000 > /proc/sys/dev/raid/speed_limit_min; echo 2000 > /proc/sys/dev/raid/speed_limit_max\n\
         mdadm --grow /dev/md0 --raid-devices=5 >/dev/null 2>&1\n\
         sleep 2\n\
         mdadm --stop /dev/md0 >/dev/null\n\
         for l in \"${{L[@]}}\"; do losetup -d \"$l\"; done"
    );
    let out = in_kernel(&script, 300);
    let ksize: usize = results(&out, "SIZE")["kstarted"].parse().unwrap();
    let kall = paths(&kfiles);
    let (served, back) = serve_to_the_end(dir, &kall, "kstarted");
    assert_same_bytes(
        &back[..ksize],
        &kpattern[..ksize],
        "kstarted: finished by uraid",
    );
    let new_size = back.len();
    served.stop();
    grown.push(KernelCheck {
        name: "kstarted".into(),
        expected: expected_file(dir, "kstarted", kpattern[..ksize].to_vec(), new_size),
        members: kfiles,
        shape: shape("raid5", 5, 64, 2),
    });

    // The kernel assembles each: it finishes what is left, reads the same
    // bytes, has the new shape, and finds parity consistent.
    check_in_kernel(&grown, dir);
}

/// Level changes uraid runs while a client writes, each as mdadm chains
/// them (a takeover, a restripe, a takeover), checked by the kernel:
/// same bytes, md's shape, no mismatch. A raid5-to-raid6 restripe, which
/// rebuilds the new Q member along with it, is handed over both ways:
/// uraid killed in it, the kernel finishes it (and uraid, on a copy);
/// the kernel stopped in it, uraid finishes it.
#[test]
fn uraid_changes_levels_while_serving_and_hands_over() {
    let dir = scratch("reshape-levels");
    let dir = dir.path();
    let mut grown: Vec<KernelCheck> = Vec::new();

    // The kernel's raid5-to-raid6, stopped midway: uraid serve finishes
    // it, and reads what md read mid-way.
    std::fs::write(dir.join("pattern"), random_bytes(19, 300 * MIB)).unwrap();
    std::fs::write(dir.join("during"), random_bytes(20, DURING_LEN)).unwrap();
    let case = cases().into_iter().find(|c| c.name == "r5to6").unwrap();
    let kfiles = sparse_files(dir, "r5to6.", &vec![MEMBER_BYTES; case.members]);
    let script = format!(
        "export MDADM_NO_SYSTEMCTL=1\n{}",
        guest_lines(&case, dir, &kfiles)
    );
    in_kernel(&script, 300);
    let kernel_read = std::fs::read(dir.join("r5to6.kernel-read")).unwrap();
    let (served, back) = serve_to_the_end(dir, &paths(&kfiles), "k5to6");
    assert!(
        status_whole_and_idle(&array_status(&served.control)),
        "k5to6: the new member is not in sync"
    );
    assert_same_bytes(&back, &kernel_read, "r5to6: finished by uraid");
    served.stop();
    grown.push(KernelCheck {
        name: "k5to6".into(),
        expected: dir.join("r5to6.kernel-read"),
        members: kfiles,
        shape: shape("raid6", 5, 64, 2),
    });

    // (name, level, members, spares, create's options, change, members the
    // result keeps, md's shape after)
    type Run = (
        &'static str,
        &'static str,
        usize,
        usize,
        &'static str,
        &'static [&'static str],
        usize,
        &'static str,
    );
    let runs: [Run; 9] = [
        (
            "u5to6",
            "raid5",
            4,
            1,
            "--chunk 64K",
            &["--level", "6"],
            5,
            "raid6 5 64 2",
        ),
        (
            "r6to5",
            "raid6",
            5,
            0,
            "--chunk 64K",
            &["--level", "5"],
            5,
            "raid5 4 64 2",
        ),
        (
            "r0to5",
            "raid0",
            3,
            1,
            "--chunk 64K",
            &["--level", "5"],
            4,
            "raid5 4 64 2",
        ),
        (
            "r0to4",
            "raid0",
            3,
            1,
            "--chunk 64K",
            &["--level", "4"],
            4,
            "raid4 4 64 5",
        ),
        (
            "r5to0",
            "raid5",
            4,
            0,
            "--chunk 64K",
            &["--level", "0"],
            3,
            "raid0 3 64 -1",
        ),
        (
            "r1to5",
            "raid1",
            2,
            1,
            "",
            &["--level", "5", "--raid-devices", "3"],
            3,
            "raid5 3 64 2",
        ),
        (
            "r5to1",
            "raid5",
            2,
            0,
            "--chunk 64K",
            &["--level", "1"],
            2,
            "raid1 2 0 0",
        ),
        // With a write-intent bitmap, which md keeps through a reshape.
        (
            "b5add",
            "raid5",
            4,
            1,
            "--chunk 64K --bitmap internal --bitmap-chunk 1M",
            &["--raid-devices", "5"],
            5,
            "raid5 5 64 2",
        ),
        (
            "b5to6",
            "raid5",
            4,
            1,
            "--chunk 32K --bitmap internal --bitmap-chunk 1M",
            &["--level", "6"],
            5,
            "raid6 5 32 2",
        ),
    ];
    for (i, (name, level, disks, spares, create, change, kept, md_shape)) in runs.iter().enumerate()
    {
        // md's raid0 takes no spares: they join once it has parity.
        let raid0 = *level == "raid0";
        let early = if raid0 { 0 } else { *spares };
        let create: Vec<&str> = create.split_whitespace().collect();
        let (mut files, served, _) = filled_array(
            dir,
            name,
            (level, *disks, early),
            &create,
            MEMBER_BYTES,
            500 + i as u64,
        );
        grow_slowly(&served, change);
        if raid0 {
            files.extend(sparse_files(
                dir,
                &format!("{name}.late."),
                &vec![MEMBER_BYTES; *spares],
            ));
            for spare in &files[*disks..] {
                manage_ok(&served.control, &["--add", spare.to_str().unwrap()]);
            }
        }
        let (patched, _) = patch_while_reshaping(&served, dir, name, 17 + i as u64, 256 * 1024);
        let status = wait_status(
            &served.control,
            "the level change and its rebuild to end",
            std::time::Duration::from_secs(240),
            status_whole_and_idle,
        );
        let md = status["mdstat"].as_str().unwrap_or_default().to_string();
        assert!(
            md.contains(md_shape.split(' ').next().unwrap()),
            "{name}: {md}"
        );
        let back = nbdcopy_out(served.uri(), dir);
        assert!(back.len() >= patched.len(), "{name}: the array shrank");
        assert_same_bytes(
            &back[..patched.len()],
            &patched,
            &format!("{name}: after the level change"),
        );
        served.stop();
        let size = back.len();
        let parts: Vec<&str> = md_shape.split(' ').collect();
        grown.push(KernelCheck {
            name: name.to_string(),
            expected: expected_file(dir, name, patched, size),
            members: files[..*kept].to_vec(),
            shape: shape(
                parts[0],
                parts[1].parse().unwrap(),
                parts[2].parse().unwrap(),
                parts[3].parse::<i32>().unwrap(),
            ),
        });
    }

    // uraid killed in a raid5-to-raid6 restripe: the kernel finishes it,
    // and so does uraid on a copy of the members.
    let (files, served, pattern) = uraid_array(dir, "u5to6killed", "raid5", 4, 1, "64K", 600);
    kill_mid_reshape(served, &["--level", "6"], paths(&files)[0]);
    let examined = String::from_utf8(uraid_ok(&["examine", paths(&files)[4]]).stdout).unwrap();
    assert!(
        examined.contains("Recovery Offset"),
        "the new member is rebuilt along with the restripe: {examined}"
    );
    let copies = copy_files(&files);
    let (resumed, back) = serve_to_the_end(dir, &paths(&copies), "u5to6killed");
    assert_same_bytes(&back, &pattern, "u5to6killed: resumed by uraid");
    resumed.stop();
    grown.push(KernelCheck {
        name: "u5to6killed".into(),
        expected: expected_file(dir, "u5to6killed", pattern, back.len()),
        members: files,
        shape: shape("raid6", 5, 64, 2),
    });

    check_in_kernel(&grown, dir);
}

/// A same-count reshape md runs backwards (mdadm picks the direction with
/// more room, here after the data, which `--size` left): the kernel is
/// stopped midway, `uraid serve` finishes it, reading what md read, and
/// the kernel then finds the new shape and consistent parity.
#[test]
fn a_backward_reshape_the_kernel_started_is_finished_by_uraid() {
    let dir = scratch("reshape-backward");
    let dir = dir.path();
    std::fs::write(dir.join("pattern"), random_bytes(21, 300 * MIB)).unwrap();
    std::fs::write(dir.join("during"), random_bytes(22, DURING_LEN)).unwrap();
    let case = Case {
        name: "r5back",
        members: 4,
        initial: 4,
        create: "--level=5 --raid-devices=4 --chunk=64 --size=40M",
        grow: "--chunk=128",
        kernel_keeps_data: false,
        delta: 0,
        new_layout: None,
        new_chunk_kib: Some(128),
    };
    let files = sparse_files(dir, "r5back.", &vec![MEMBER_BYTES; case.members]);
    let script = format!(
        "export MDADM_NO_SYSTEMCTL=1\n{}",
        guest_lines(&case, dir, &files)
    );
    in_kernel(&script, 300);
    let examine = std::fs::read_to_string(dir.join("r5back.kernel-examine")).unwrap();
    // md's RESHAPE_BACKWARDS feature bit (0x20), with a reshape in progress.
    let features = examine
        .lines()
        .find_map(|l| l.trim().strip_prefix("Feature Map : 0x"))
        .and_then(|v| u32::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    assert!(
        features & 0x20 != 0 && examine.contains("Reshape pos'n"),
        "md ran it forwards or finished it: {examine}"
    );
    let kernel_read = std::fs::read(dir.join("r5back.kernel-read")).unwrap();
    let (served, back) = serve_to_the_end(dir, &paths(&files), "r5back");
    assert_same_bytes(&back, &kernel_read, "r5back: finished by uraid");
    served.stop();
    let examined = String::from_utf8(uraid_ok(&["examine", paths(&files)[0]]).stdout).unwrap();
    assert!(
        !examined.contains("Reshape") && examined.contains("Chunk Size : 128K"),
        "{examined}"
    );
    check_in_kernel(
        &[KernelCheck {
            name: "r5back".into(),
            expected: dir.join("r5back.kernel-read"),
            members: files,
            shape: shape("raid5", 4, 128, 2),
        }],
        dir,
    );
}
