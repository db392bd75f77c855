//! Removing members from raid5 and raid6 (a backward reshape), checked
//! against the Linux kernel's md in user-mode Linux (tests/kernel/uml-run).
//!
//! - uraid shrinks raid5 5 -> 4 and raid6 6 -> 5 while a client writes and
//!   reads through NBD;
//! - uraid is killed (SIGKILL) in the middle of a shrink, and the kernel
//!   continues it;
//! - the kernel starts a shrink (after `mdadm --grow --array-size`), the
//!   array is stopped midway, and `uraid serve` finishes it;
//!
//! then the kernel assembles each: it finishes what is left, reads the
//! same bytes, has the new shape with the removed members as spares, and
//! its check finds mismatch_cnt 0.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Each member, and the part of it the array uses (create --size): the
/// rest is the room the data moves up into.
const MEMBER_BYTES: u64 = 24 * MIB;
const USED_KIB: u64 = 16 * 1024;

/// Creates `level` on `disks` members with uraid, leaving room after the
/// data, serves it and fills it with a pattern.
fn uraid_array(
    dir: &Path,
    name: &str,
    level: &str,
    disks: usize,
    seed: u64,
) -> (Vec<PathBuf>, Served, Vec<u8>) {
    let size = format!("{USED_KIB}K");
    filled_array(
        dir,
        name,
        (level, disks, 0),
        &["--chunk", "64K", "--size", &size],
        MEMBER_BYTES,
        seed,
    )
}

/// `manage --grow` arguments that remove one member of an array with
/// `data_members` data members now.
fn shrink_args(data_members: u64, disks: usize) -> (String, String) {
    let new_kib = USED_KIB * (data_members - 1);
    ((disks - 1).to_string(), format!("{new_kib}K"))
}

fn finished(status: &serde_json::Value) -> bool {
    status_events(status)
        .iter()
        .any(|e| e.0 == "RebuildFinished")
}

/// The value of one `examine` line (as mdadm --examine prints it).
fn examine_field<'a>(examine: &'a str, key: &str) -> Option<&'a str> {
    examine
        .lines()
        .find_map(|l| l.trim().strip_prefix(key)?.trim().strip_prefix(": "))
}

/// The expected image of `name`, written where the kernel can read it.
fn expected_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(format!("{name}.expected"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Guest lines: mdadm creates a raid5 on 5 members and fills it; mdadm
/// truncates it (`--array-size`) and md removes a member, and the array is
/// stopped in the middle of that. mdadm 4.2 itself cannot start this shrink
/// without a backup file: its set_new_data_offset sets no reshape_direction
/// when members go, and md refuses a higher new_offset on a forward
/// reshape ("Cannot set new_offset"). So the guest makes the sysfs writes
/// mdadm would with the direction set, and md runs the reshape itself:
/// reshape_direction, each member's new_offset (data_offset + 192 KiB,
/// mdadm's backup_blocks / old data members), raid_disks, sync_action.
/// Prints `SIZE kstarted bytes` (the new size).
fn kernel_started_lines(dir: &Path, files: &[PathBuf]) -> String {
    let d = dir.display();
    let mut s = losetup_lines(files);
    let _ = writeln!(
        s,
        "mdadm --create /dev/md0 --run --assume-clean --metadata=1.2 --level=5 --raid-devices=5 --chunk=64 --size={USED_KIB} \"${{L[@]}}\" >/dev/null 2>&1\n\
         sz=$(blockdev --getsize64 /dev/md0)\n\
         dd if={d}/kpattern of=/dev/md0 bs=1M count=$((sz >> 20)) oflag=direct status=none\n\
         echo 1000 > /proc/sys/dev/raid/speed_limit_min; echo 2000 > /proc/sys/dev/raid/speed_limit_max\n\
         mdadm --grow /dev/md0 --array-size={} >{d}/kstarted.arraysize 2>&1\n\
         echo \"SIZE kstarted $(blockdev --getsize64 /dev/md0)\"\n\
         md=/sys/block/md0/md\n\
         echo frozen > $md/sync_action\n\
         echo backwards > $md/reshape_direction\n\
         for dev in $md/dev-*; do echo 0 > $dev/size; echo $(( $(cat $dev/offset) + 384 )) > $dev/new_offset; done\n\
         echo 4 > $md/raid_disks\n\
         echo reshape > $md/sync_action\n\
         sleep 2\n\
         echo \"POS kstarted $(cat $md/reshape_position)\"\n\
         mdadm --stop /dev/md0 >/dev/null\n\
         mdadm --examine \"${{L[0]}}\" >{d}/kstarted.kernel-examine 2>&1\n\
         for l in \"${{L[@]}}\"; do losetup -d \"$l\"; done",
        USED_KIB * 3
    );
    s
}

#[test]
fn shrinks_run_backwards_and_hand_over_to_and_from_the_kernel() {
    let dir = scratch("reshape-shrink");
    let dir = dir.path();
    let mut shrunk: Vec<KernelCheck> = Vec::new();

    // The kernel starts a shrink and is stopped midway.
    let kfiles = sparse_files(dir, "kstarted.", &[MEMBER_BYTES; 5]);
    let kpattern = random_bytes(300, (USED_KIB * 1024 * 4) as usize);
    std::fs::write(dir.join("kpattern"), &kpattern).unwrap();
    let script = format!(
        "export MDADM_NO_SYSTEMCTL=1\n{}",
        kernel_started_lines(dir, &kfiles)
    );
    let out = in_kernel(&script, 200);
    let ksize: usize = results(&out, "SIZE")["kstarted"].parse().unwrap();
    assert_eq!(ksize as u64, USED_KIB * 1024 * 3, "{out}");
    let kernel_examine = std::fs::read_to_string(dir.join("kstarted.kernel-examine")).unwrap();
    assert!(
        kernel_examine.contains("Delta Devices : -1"),
        "the kernel's shrink was not stopped midway: {:?}\n{kernel_examine}",
        results(&out, "POS"),
    );

    // uraid reads it as mdadm does, and serve finishes it.
    let kall = paths(&kfiles);
    let ours = String::from_utf8(uraid_ok(&["examine", kall[0]]).stdout).unwrap();
    assert_eq!(
        examine_comparable(&kernel_examine),
        examine_comparable(&ours),
        "examine differs mid-shrink\n--- mdadm\n{kernel_examine}\n--- uraid\n{ours}"
    );
    let served = serve(dir, &[], &kall);
    assert!(
        finished(&wait_reshaped(&served)),
        "uraid did not finish the kernel's shrink"
    );
    let back = nbdcopy_out(served.uri(), dir);
    assert_same_bytes(&back, &kpattern[..ksize], "kstarted: finished by uraid");
    served.stop();
    // How uraid ended it: a kept member and the removed one, compared with
    // how the kernel ends the shrink uraid is killed in (below).
    let uraid_ended: Vec<String> = [kall[0], kall[4]]
        .iter()
        .map(|m| String::from_utf8(uraid_ok(&["examine", m]).stdout).unwrap())
        .collect();
    shrunk.push(KernelCheck {
        name: "kstarted".into(),
        expected: expected_file(dir, "kstarted", &kpattern[..ksize]),
        members: kfiles,
        shape: "raid5 4 65536 2".into(),
    });

    // uraid shrinks while a client writes and reads.
    for (i, (name, level, disks, shape)) in [
        ("r5shrink", "raid5", 5, "raid5 4 65536 2"),
        ("r6shrink", "raid6", 6, "raid6 5 65536 2"),
    ]
    .into_iter()
    .enumerate()
    {
        let (files, served, pattern) = uraid_array(dir, name, level, disks, 100 + i as u64);
        let parity = if level == "raid6" { 2 } else { 1 };
        let (count, size) = shrink_args((disks - parity) as u64, disks);
        manage_ok(&served.control, &["--speed-limit-max", "3000"]);
        manage_ok(
            &served.control,
            &["--grow", "--raid-devices", &count, "--array-size", &size],
        );
        let status = array_status(&served.control);
        assert!(
            status["mdstat"].as_str().unwrap().contains("reshape ="),
            "{name}: {}",
            status["mdstat"]
        );
        let new_size = pattern.len() / (disks - parity) * (disks - parity - 1);
        let image = dir.join(format!("{name}.image"));
        std::fs::write(&image, &pattern[..new_size]).unwrap();
        let patched = nbd_patch(
            served.uri(),
            &image,
            &dir.join(format!("{name}.patched")),
            7 + i as u64,
            64 * 1024,
            192 * 1024,
            40,
        );
        assert_eq!(
            patched.len(),
            new_size,
            "{name}: the client sees the new size"
        );
        manage_ok(&served.control, &["--speed-limit-max", "200000"]);
        assert!(finished(&wait_reshaped(&served)), "{name}");
        let back = nbdcopy_out(served.uri(), dir);
        assert_same_bytes(&back, &patched, &format!("{name}: after the shrink"));
        served.stop();
        shrunk.push(KernelCheck {
            name: name.to_string(),
            expected: expected_file(dir, name, &patched),
            members: files,
            shape: shape.into(),
        });
    }

    // uraid is killed in a shrink: the kernel continues it.
    let (files, served, pattern) = uraid_array(dir, "r5killed", "raid5", 5, 200);
    let (count, size) = shrink_args(4, 5);
    manage_ok(&served.control, &["--speed-limit-max", "2000"]);
    manage_ok(
        &served.control,
        &["--grow", "--raid-devices", &count, "--array-size", &size],
    );
    let start = pattern.len() as u64 / 4 * 3 / 512;
    wait_status(
        &served.control,
        "the shrink to move",
        Duration::from_secs(60),
        |s| {
            s["detail"]["reshape"]["position_sectors"]
                .as_u64()
                .is_some_and(|p| p < start)
        },
    );
    served.kill();
    // The superblocks uraid left say what the kernel's say mid-shrink.
    let examined = String::from_utf8(uraid_ok(&["examine", paths(&files)[0]]).stdout).unwrap();
    for key in [
        "Feature Map",
        "Raid Devices",
        "Delta Devices",
        "New Offset",
        "Data Offset",
    ] {
        assert!(examine_field(&examined, key).is_some(), "{key}: {examined}");
        assert_eq!(
            examine_field(&examined, key),
            examine_field(&kernel_examine, key),
            "{key}\n--- uraid\n{examined}\n--- kernel\n{kernel_examine}"
        );
    }
    shrunk.push(KernelCheck {
        name: "r5killed".into(),
        expected: expected_file(dir, "r5killed", &pattern[..pattern.len() / 4 * 3]),
        members: files,
        shape: "raid5 4 65536 2".into(),
    });

    let mut script = String::from("export MDADM_NO_SYSTEMCTL=1\n");
    for s in &shrunk {
        script.push_str(&kernel_check_lines(dir, s));
    }
    let out = in_kernel(&script, 300);
    let spares = results(&out, "SPARES");
    let killed = &shrunk
        .iter()
        .find(|s| s.name == "r5killed")
        .unwrap()
        .members;
    for (ours, member) in uraid_ended.iter().zip([&killed[0], &killed[4]]) {
        let kernels =
            String::from_utf8(uraid_ok(&["examine", member.to_str().unwrap()]).stdout).unwrap();
        for key in [
            "Feature Map",
            "Raid Devices",
            "Avail Dev Size",
            "Used Dev Size",
            "Data Offset",
            "Device Role",
            "Layout",
        ] {
            assert!(examine_field(ours, key).is_some(), "{key}: {ours}");
            assert_eq!(
                examine_field(ours, key),
                examine_field(&kernels, key),
                "{key} after the shrink\n--- uraid\n{ours}\n--- kernel\n{kernels}"
            );
        }
    }
    for s in &shrunk {
        assert_kernel_checked(&out, s);
        assert_eq!(
            spares.get(&s.name).map(String::as_str),
            Some("1"),
            "{}: the removed member is a spare\n{out}",
            s.name
        );
    }
}
