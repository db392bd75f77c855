//! `uraid manage --grow --size` (mdadm --grow --size) on a served array,
//! checked against the Linux kernel's md in user-mode Linux.
//!
//! Each case makes two identical arrays with `uraid create --size`, half or
//! a third of their members. uraid serves the first: nbdcopy writes it
//! whole, the size grows live, `uraid status` shows the resync of the new
//! region as /proc/mdstat would, a new NBD connection sees the new size
//! (nbdinfo), the old bytes read back, and new bytes are written over the
//! whole grown array. In one boot the kernel then assembles it: it must
//! report the same component size, read the same bytes, and a `check` must
//! find mismatch_cnt 0. The kernel also grows the twin with mdadm 4.2's
//! `--grow --size`, and what it wrote (the members' data size, the size,
//! the bitmap's chunk and sync size) must be what uraid wrote.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Every member's file; the arrays start using a part of it.
const MEMBER_BYTES: u64 = 24 * MIB;

struct Case {
    name: &'static str,
    create: &'static [&'static str],
    disks: usize,
    /// The argument of --grow --size.
    grow_to: &'static str,
    /// The chunk of an internal bitmap, if the array has one.
    bitmap_chunk: Option<&'static str>,
}

const R5: &[&str] = &["--level", "5", "--chunk", "64K", "--size", "8M"];
const R6: &[&str] = &["--level", "6", "--chunk", "64K", "--size", "8M"];
const R1: &[&str] = &["--level", "1", "--size", "8M"];

const CASES: [Case; 9] = [
    Case {
        name: "r1",
        create: R1,
        disks: 2,
        grow_to: "max",
        bitmap_chunk: None,
    },
    Case {
        name: "r5",
        create: R5,
        disks: 4,
        grow_to: "max",
        bitmap_chunk: None,
    },
    // An explicit size: md records it as the grown members' data size.
    Case {
        name: "r6",
        create: R6,
        disks: 5,
        grow_to: "16M",
        bitmap_chunk: None,
    },
    Case {
        name: "r10",
        create: &["--level", "10", "--chunk", "64K", "--size", "8M"],
        disks: 4,
        grow_to: "max",
        bitmap_chunk: None,
    },
    Case {
        name: "r10o",
        create: &[
            "--level", "10", "--layout", "o2", "--chunk", "64K", "--size", "8M",
        ],
        disks: 3,
        grow_to: "max",
        bitmap_chunk: None,
    },
    // 1.0 keeps its superblock where it is: the room is the data size it
    // records, as the kernel computes it for a device that has not grown.
    Case {
        name: "r5v10",
        create: &[
            "--level",
            "5",
            "--chunk",
            "64K",
            "--size",
            "8M",
            "--metadata",
            "1.0",
        ],
        disks: 4,
        grow_to: "max",
        bitmap_chunk: None,
    },
    // 4 KiB bitmap chunks over 8 MiB fill one sector of bits: grown to
    // about three times that, the chunk doubles twice (md_bitmap_resize).
    Case {
        name: "r5b",
        create: R5,
        disks: 4,
        grow_to: "max",
        bitmap_chunk: Some("4K"),
    },
    Case {
        name: "r6b",
        create: R6,
        disks: 5,
        grow_to: "max",
        bitmap_chunk: Some("4K"),
    },
    // A bitmap whose chunk still fits after the grow keeps it.
    Case {
        name: "r1b",
        create: R1,
        disks: 2,
        grow_to: "max",
        bitmap_chunk: Some("64K"),
    },
];

/// The value after " : " of every line of `text` whose label is in `labels`.
fn labelled(text: &str, labels: &[&str]) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(" : "))
        .filter(|(label, _)| labels.contains(&label.trim()))
        .map(|(label, value)| format!("{}: {}", label.trim(), value.trim()))
        .collect()
}

/// What md's size change writes: the members' data size and the array's
/// sizes on the superblock, the bitmap's chunk and sync size.
fn size_fields(member: &Path) -> Vec<String> {
    let m = member.to_str().unwrap();
    let examine = String::from_utf8_lossy(&uraid_ok(&["examine", m]).stdout).to_string();
    let mut fields = labelled(&examine, &["Avail Dev Size", "Array Size", "Used Dev Size"]);
    if examine.contains("Internal Bitmap") {
        let bitmap =
            String::from_utf8_lossy(&uraid_ok(&["examine", "--bitmap", m]).stdout).to_string();
        fields.extend(labelled(&bitmap, &["Chunksize", "Sync Size"]));
    }
    fields
}

fn nbdinfo_size(uri: &str) -> u64 {
    let nbdinfo = client_tool("nbdinfo", "libnbd-bin");
    let out = run_limited_ok(
        std::process::Command::new(nbdinfo).arg("--size").arg(uri),
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("nbdinfo --size: a number")
}

/// Serves the array, fills it, grows it live and fills it again; returns
/// the image the members now hold and the component size in KiB.
fn grow_served(dir: &Path, case: &Case, members: &[PathBuf]) -> (PathBuf, u64) {
    let served = serve(dir, &[], &paths(members));
    let old_bytes = nbdinfo_size(served.uri());
    let before = dir.join(format!("{}-before.img", case.name));
    std::fs::write(&before, random_bytes(1, old_bytes as usize)).unwrap();
    nbdcopy_in(&before, served.uri());
    // Slow enough that status sees the resync of the new region.
    manage_ok(&served.control, &["--speed-limit-max", "8000"]);
    let said = manage_ok(&served.control, &["--grow", "--size", case.grow_to]);
    assert!(
        said.contains("resyncing the new region"),
        "{}: {said}",
        case.name
    );
    let status = array_status(&served.control);
    let mdstat = status["mdstat"].as_str().unwrap_or_default().to_string();
    let line = sync_line(&mdstat).unwrap_or_else(|| {
        panic!(
            "{}: no resync line right after the grow:\n{mdstat}",
            case.name
        )
    });
    assert_eq!(line.action, "resync", "{}: {mdstat}", case.name);
    let detail = served.detail_json();
    let component_kib = detail["used_dev_size_kib"]
        .as_u64()
        .unwrap_or_else(|| panic!("detail without used_dev_size_kib: {detail}"));
    let array_bytes = detail["array_size_kib"].as_u64().unwrap() * 1024;
    assert!(array_bytes > old_bytes, "{}: {detail}", case.name);
    // md's resync of raid1/4/5/6 counts member KiB, raid10's array KiB;
    // either way it starts past the old end.
    assert!(
        line.total_kib == component_kib || line.total_kib == array_bytes / 1024,
        "{}: resync total {} KiB, component {component_kib} KiB: {mdstat}",
        case.name,
        line.total_kib
    );
    assert!(
        line.done_kib * 3 >= line.total_kib,
        "{}: {mdstat}",
        case.name
    );
    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    wait_status(
        &served.control,
        "the resync of the new region",
        Duration::from_secs(120),
        status_whole_and_idle,
    );
    // A new connection sees the grown array; the old bytes are where they were.
    assert_eq!(nbdinfo_size(served.uri()), array_bytes, "{}", case.name);
    let read = nbdcopy_out(served.uri(), dir);
    assert_eq!(read.len() as u64, array_bytes, "{}", case.name);
    assert_same_bytes(
        &read[..old_bytes as usize],
        &std::fs::read(&before).unwrap(),
        &format!("{}: the old region after the grow", case.name),
    );
    let after = dir.join(format!("{}-after.img", case.name));
    std::fs::write(&after, random_bytes(2, array_bytes as usize)).unwrap();
    nbdcopy_in(&after, served.uri());
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir),
        &std::fs::read(&after).unwrap(),
        &format!("{}: the grown array rewritten", case.name),
    );
    let status = array_status(&served.control);
    assert_eq!(
        status["mismatch_cnt"], 0,
        "{}: resync mismatches",
        case.name
    );
    served.stop();
    (after, component_kib)
}

#[test]
fn grown_arrays_match_the_kernel() {
    let dir = scratch("grow-size");
    let mut script = String::new();
    let mut expected = Vec::new();
    for case in &CASES {
        let mut options: Vec<&str> = case.create.to_vec();
        let disks = case.disks.to_string();
        options.extend(["--raid-devices", &disks]);
        if let Some(chunk) = case.bitmap_chunk {
            options.extend(["--bitmap", "internal", "--bitmap-chunk", chunk]);
        }
        let [grown, twin] = ["g", "t"].map(|side| {
            create_array(
                dir.path(),
                &format!("{}-{side}", case.name),
                &options,
                case.disks,
                MEMBER_BYTES,
            )
        });
        let (image, component_kib) = grow_served(dir.path(), case, &grown);
        let uraid_fields = size_fields(&grown[0]);
        let mut needed = vec!["Avail Dev Size", "Array Size"];
        if case.bitmap_chunk.is_some() {
            needed.extend(["Chunksize", "Sync Size"]);
        }
        for label in needed {
            assert!(
                uraid_fields.iter().any(|f| f.starts_with(label)),
                "{}: examine lacks {label}: {uraid_fields:?}",
                case.name
            );
        }
        let name = case.name;
        // The array uraid grew.
        script.push_str(&losetup_lines(&grown));
        let _ = writeln!(
            script,
            "mdadm --assemble /dev/md0 \"${{L[@]}}\" >/tmp/asm.out 2>&1 || echo \"ASSEMBLE {name} $(tr '\\n' ' ' </tmp/asm.out)\"\n\
             echo \"SIZE {name} $(cat /sys/block/md0/md/component_size)\"\n\
             echo \"RESYNC {name} $(cat /sys/block/md0/md/resync_start)\"\n\
             if cmp /dev/md0 {img} >/tmp/cmp.out 2>&1; then echo \"CMP {name} ok\"; else echo \"CMP {name} $(tr '\\n' ' ' </tmp/cmp.out)\"; fi\n\
             echo check > /sys/block/md0/md/sync_action\n\
             sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done\n\
             echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\"\n\
             mdadm --stop /dev/md0 >/dev/null 2>&1\n\
             for l in \"${{L[@]}}\"; do losetup -d \"$l\" || true; done",
            img = image.display()
        );
        // The twin, grown by the kernel.
        script.push_str(&losetup_lines(&twin));
        let _ = writeln!(
            script,
            "mdadm --assemble /dev/md0 \"${{L[@]}}\" >/tmp/asm.out 2>&1 || echo \"ASSEMBLE {name}-twin $(tr '\\n' ' ' </tmp/asm.out)\"\n\
             mdadm --grow /dev/md0 --size {size} >/tmp/grow.out 2>&1 || echo \"GROW {name} $(tr '\\n' ' ' </tmp/grow.out)\"\n\
             mdadm --wait /dev/md0 >/dev/null 2>&1 || true\n\
             echo \"TWINSIZE {name} $(cat /sys/block/md0/md/component_size)\"\n\
             mdadm --stop /dev/md0 >/dev/null 2>&1\n\
             for l in \"${{L[@]}}\"; do losetup -d \"$l\" || true; done",
            size = case.grow_to
        );
        expected.push((name, component_kib, uraid_fields, twin));
    }
    let stdout = in_kernel(&script, 600);
    let mut failures = Vec::new();
    for key in ["ASSEMBLE", "GROW"] {
        for (name, what) in results(&stdout, key) {
            failures.push(format!("{name}: {key} failed: {what}"));
        }
    }
    let sizes = results(&stdout, "SIZE");
    let twin_sizes = results(&stdout, "TWINSIZE");
    let resync = results(&stdout, "RESYNC");
    let cmp = results(&stdout, "CMP");
    let mismatch = results(&stdout, "MISMATCH");
    for (name, component_kib, uraid_fields, twin) in &expected {
        let name = name.to_string();
        let kib = component_kib.to_string();
        if sizes.get(&name) != Some(&kib) {
            failures.push(format!(
                "{name}: the kernel's component_size {:?}, uraid's {kib}",
                sizes.get(&name)
            ));
        }
        if twin_sizes.get(&name) != Some(&kib) {
            failures.push(format!(
                "{name}: the kernel grew the twin to {:?} KiB, uraid to {kib}",
                twin_sizes.get(&name)
            ));
        }
        if resync.get(&name).map(String::as_str) != Some("none") {
            failures.push(format!("{name}: resync_start {:?}", resync.get(&name)));
        }
        if cmp.get(&name).map(String::as_str) != Some("ok") {
            failures.push(format!("{name}: kernel read {:?}", cmp.get(&name)));
        }
        if mismatch.get(&name).map(String::as_str) != Some("0") {
            failures.push(format!("{name}: mismatch_cnt {:?}", mismatch.get(&name)));
        }
        let kernel_fields = size_fields(&twin[0]);
        if &kernel_fields != uraid_fields {
            failures.push(format!(
                "{name}: the superblocks differ\n  uraid:  {uraid_fields:?}\n  kernel: {kernel_fields:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n--- kernel output\n{stdout}",
        failures.join("\n")
    );
}
