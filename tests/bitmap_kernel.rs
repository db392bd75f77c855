//! The internal write-intent bitmap against mdadm 4.2 and the kernel's md
//! (user-mode Linux, 6.1), in both directions, for raid1, raid5, raid6 and
//! raid10 with metadata 1.0, 1.1 and 1.2:
//!
//! (a) `mdadm --examine-bitmap` (on loop devices, where it finds the bitmap
//!     through the superblock) prints the same fields as `uraid examine
//!     --bitmap`: on arrays uraid made, on the same arrays after the kernel
//!     ran them, and on arrays mdadm made;
//! (b) uraid creates arrays with `--bitmap internal`, copies data in; the
//!     kernel assembles them without calling the bitmap stale or invalid,
//!     shows "bitmap:" in /proc/mdstat, reads the same bytes, and `check`
//!     finds mismatch_cnt 0;
//! (c) mdadm creates arrays with `--bitmap=internal` and writes data; uraid
//!     reads the same bytes (also with a member missing), then copies new
//!     data in, rewriting the kernel's bitmap, and the kernel assembles the
//!     result as in (b).

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};

const MEMBER_BYTES: u64 = 12 << 20;

#[derive(Clone, Debug)]
struct Case {
    level: &'static str,
    layout: Option<&'static str>,
    disks: usize,
    metadata: &'static str,
    /// --bitmap-chunk; None lets mdadm's rule choose (64 MiB here: one bit).
    bitmap_chunk: Option<&'static str>,
    /// uraid only: skip the initial resync (the bits start clear).
    assume_clean: bool,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{}-{}-n{}-e{}-b{}{}",
            self.level,
            self.layout.unwrap_or("default"),
            self.disks,
            self.metadata,
            self.bitmap_chunk.unwrap_or("default"),
            if self.assume_clean { "-clean" } else { "" }
        )
    }

    fn chunk(&self) -> Option<&'static str> {
        (self.level != "raid1").then_some("64K")
    }

    fn uraid_create_args(&self) -> Vec<String> {
        let mut o: Vec<String> = vec![
            "create".into(),
            "--metadata".into(),
            self.metadata.into(),
            "--level".into(),
            self.level.into(),
            "--raid-devices".into(),
            self.disks.to_string(),
            "--bitmap".into(),
            "internal".into(),
        ];
        if let Some(c) = self.bitmap_chunk {
            o.extend(["--bitmap-chunk".into(), c.into()]);
        }
        if let Some(layout) = self.layout {
            o.extend(["--layout".into(), layout.into()]);
        }
        if let Some(chunk) = self.chunk() {
            o.extend(["--chunk".into(), chunk.into()]);
        }
        if self.assume_clean {
            o.push("--assume-clean".into());
        }
        o
    }

    fn mdadm_create_options(&self) -> String {
        let mut o = format!(
            "--metadata={} --level={} --raid-devices={} --bitmap=internal",
            self.metadata, self.level, self.disks
        );
        if let Some(c) = self.bitmap_chunk {
            let _ = write!(o, " --bitmap-chunk={c}");
        }
        if let Some(layout) = self.layout {
            let _ = write!(o, " --layout={layout}");
        }
        if let Some(chunk) = self.chunk() {
            let _ = write!(o, " --chunk={chunk}");
        }
        o
    }
}

/// Every level with a bitmap at every 1.x metadata version, cycling the
/// bitmap chunk (one bit, a few hundred, a few thousand) and, for uraid,
/// whether the create resyncs.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (i, metadata) in ["1.0", "1.1", "1.2"].into_iter().enumerate() {
        let raid10 = [("n2", 4), ("f2", 3), ("o2", 3)][i];
        for (j, (level, layout, disks)) in [
            ("raid1", None, 2),
            ("raid5", None, 3),
            ("raid6", None, 4),
            ("raid10", Some(raid10.0), raid10.1),
        ]
        .into_iter()
        .enumerate()
        {
            let k = i * 4 + j;
            cases.push(Case {
                level,
                layout,
                disks,
                metadata,
                bitmap_chunk: [None, Some("64K"), Some("4K")][k % 3],
                assume_clean: k % 2 == 1,
            });
        }
    }
    cases
}

/// The lines of an --examine-bitmap report that must agree: all but the
/// file name (a loop device in the kernel, a path on the host).
fn bitmap_fields(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("Filename :"))
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn uraid_text(args: &[&str]) -> String {
    String::from_utf8_lossy(&uraid_ok(args).stdout).to_string()
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&uraid_ok(args).stdout).expect("json")
}

/// (superblock events, bitmap events, bitmap events_cleared, dirty bits,
/// bits) of every member.
fn bitmap_state(members: &[&str]) -> Vec<(u64, u64, u64, u64, u64)> {
    let mut args = vec!["examine", "--json"];
    args.extend_from_slice(members);
    let sbs = json(&args);
    let mut args = vec!["examine", "--bitmap", "--json"];
    args.extend_from_slice(members);
    let bms = json(&args);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    (0..members.len())
        .map(|i| {
            (
                n(&sbs[i], "events"),
                n(&bms[i], "events"),
                n(&bms[i], "events_cleared"),
                n(&bms[i], "dirty"),
                n(&bms[i], "bits"),
            )
        })
        .collect()
}

/// What uraid leaves after a create or a copy-in: bitmap events equal to
/// the superblocks', nothing dirty, cleared at the current events.
fn assert_uraid_bitmap_clean(name: &str, members: &[&str]) {
    for (i, (sb, ev, cleared, dirty, bits)) in bitmap_state(members).into_iter().enumerate() {
        assert!(bits > 0, "{name} member {i}: no bits");
        assert_eq!(
            (ev, dirty),
            (sb, 0),
            "{name} member {i}: bitmap events/dirty against superblock events {sb}"
        );
        assert!(
            cleared <= ev,
            "{name} member {i}: events_cleared {cleared} > events {ev}"
        );
    }
}

/// md's rule after the kernel ran an array: the bitmap is written before
/// the superblocks, so it is as fresh or one event ahead.
fn kernel_bitmap_problems(name: &str, members: &[&str]) -> Vec<String> {
    bitmap_state(members)
        .into_iter()
        .enumerate()
        .filter(|(_, (sb, ev, cleared, _, _))| !(*sb <= *ev && *ev <= sb + 1 && cleared <= ev))
        .map(|(i, s)| {
            format!("{name} member {i}: (sb events, events, cleared, dirty, bits) = {s:?}")
        })
        .collect()
}

/// Script lines that assemble the array on $L, compare it with `image`,
/// run `check` and report the mdstat bitmap line and the kernel's bitmap
/// messages, then stop it and save mdadm -X and --examine of member 0.
fn assemble_and_check(name: &str, image: &Path, save: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "dmesg -c >/dev/null");
    let _ = writeln!(
        s,
        "if mdadm --assemble /dev/md0 --run \"${{L[@]}}\" 2>/tmp/asm.err; then"
    );
    let _ = writeln!(s, "  S=$(blockdev --getsize64 /dev/md0)");
    let _ = writeln!(s, "  if cmp -n \"$S\" /dev/md0 {} >/dev/null; then echo \"CMP {name} ok $S\"; else echo \"CMP {name} differ $S\"; fi", image.display());
    let _ = writeln!(
        s,
        "  echo \"MDSTAT {name} $(grep -A4 '^md0' /proc/mdstat | grep -o 'bitmap:.*' | head -1)\""
    );
    let _ = writeln!(s, "  echo check > /sys/block/md0/md/sync_action");
    let _ = writeln!(s, "  sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done");
    let _ = writeln!(
        s,
        "  echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\""
    );
    let _ = writeln!(
        s,
        "else echo \"CMP {name} assemble-failed $(tr '\\n' ' ' </tmp/asm.err)\"; fi"
    );
    s.push_str(&stop_and_save(name, save));
    s
}

/// Stops md0, reports the kernel's bitmap messages, saves mdadm -X and
/// mdadm --examine of member 0 (through its loop device) and detaches.
fn stop_and_save(name: &str, save: &Path) -> String {
    let save = save.display();
    format!(
        "mdadm --stop /dev/md0 >/dev/null 2>&1 || true\n\
         echo \"DMESG {name} $(dmesg -c | grep -i bitmap | tr '\\n' '|')\"\n\
         mdadm --examine-bitmap \"${{L[0]}}\" > {save}.x 2> {save}.x-err\n\
         mdadm --examine \"${{L[0]}}\" > {save}.examine 2>&1\n\
         for l in \"${{L[@]}}\"; do losetup -d \"$l\" || true; done\n"
    )
}

/// Checks what assemble_and_check reported for one array.
fn check_kernel_run(name: &str, stdout: &str, failures: &mut Vec<String>) {
    let get = |key: &str| results(stdout, key).get(name).cloned();
    match get("CMP") {
        Some(v) if v.starts_with("ok ") => {}
        other => failures.push(format!("{name}: kernel read {other:?}")),
    }
    if get("MISMATCH").as_deref() != Some("0") {
        failures.push(format!("{name}: check mismatch_cnt {:?}", get("MISMATCH")));
    }
    match get("MDSTAT") {
        Some(v) if v.starts_with("bitmap: ") && v.contains(" chunk") => {}
        other => failures.push(format!("{name}: no bitmap line in /proc/mdstat: {other:?}")),
    }
    // The kernel names a bitmap it distrusts ("out of date", "invalid
    // bitmap file superblock", "UUID mismatch"); any such line fails.
    let dmesg = get("DMESG").unwrap_or_default();
    for bad in ["out of date", "invalid", "mismatch", "error", "too short"] {
        if dmesg.to_lowercase().contains(bad) {
            failures.push(format!(
                "{name}: kernel complained about the bitmap: {dmesg}"
            ));
            break;
        }
    }
}

/// Compares mdadm -X and mdadm --examine, saved under `save`, with what
/// uraid prints for `member` now.
fn compare_with_mdadm(name: &str, member: &str, save: &Path, failures: &mut Vec<String>) {
    let read = |ext: &str| std::fs::read_to_string(format!("{}.{ext}", save.display()));
    let mdadm_x = read("x").unwrap_or_default();
    let mdadm_x_err = read("x-err").unwrap_or_default();
    if !mdadm_x_err.trim().is_empty() {
        failures.push(format!("{name}: mdadm -X complained: {mdadm_x_err}"));
    }
    let ours = uraid_text(&["examine", "--bitmap", member]);
    if bitmap_fields(&mdadm_x).is_empty() || bitmap_fields(&mdadm_x) != bitmap_fields(&ours) {
        failures.push(format!(
            "{name}: examine --bitmap differs\n--- mdadm -X\n{mdadm_x}\n--- uraid\n{ours}"
        ));
    }
    let mdadm_examine = read("examine").unwrap_or_default();
    let ours = uraid_text(&["examine", member]);
    if examine_comparable(&mdadm_examine) != examine_comparable(&ours) {
        failures.push(format!(
            "{name}: examine differs\n--- mdadm\n{mdadm_examine}\n--- uraid\n{ours}"
        ));
    }
}

/// The lines of --examine and --examine-bitmap that say where the bitmap
/// is and how it is sized: an array uraid creates must match one mdadm
/// creates with the same options on the same devices.
fn placement(examine: &str, examine_bitmap: &str) -> Vec<String> {
    const LABELS: [&str; 11] = [
        "Feature Map",
        "Avail Dev Size",
        "Array Size",
        "Used Dev Size",
        "Data Offset",
        "Super Offset",
        "Unused Space",
        "Internal Bitmap",
        "Bad Block Log",
        "Chunksize",
        "Sync Size",
    ];
    let mut lines: Vec<String> = examine
        .lines()
        .chain(examine_bitmap.lines())
        .filter(|l| {
            l.split_once(" : ")
                .is_some_and(|(k, _)| LABELS.contains(&k.trim()))
        })
        .map(|l| l.trim().to_string())
        .collect();
    // The bit count, without the dirty count (which depends on the writes).
    lines.extend(
        examine_bitmap
            .lines()
            .filter_map(|l| l.split_once(" bits (chunks)"))
            .map(|(bits, _)| bits.trim().to_string()),
    );
    lines
}

/// Creates the same array with uraid on fresh files and compares where the
/// bitmap goes and how large it is with what mdadm chose (saved under `save`).
fn compare_placement(case: &Case, dir: &Path, save: &Path, failures: &mut Vec<String>) {
    let name = case.name();
    let members = sparse_files(dir, &format!("{name}-u"), &vec![MEMBER_BYTES; case.disks]);
    let mut args = case.uraid_create_args();
    args.extend(members.iter().map(|m| m.display().to_string()));
    uraid_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let read = |ext: &str| {
        std::fs::read_to_string(format!("{}.{ext}", save.display())).unwrap_or_default()
    };
    let theirs = placement(&read("examine"), &read("x"));
    let m0 = members[0].to_str().unwrap();
    let ours = placement(
        &uraid_text(&["examine", m0]),
        &uraid_text(&["examine", "--bitmap", m0]),
    );
    if theirs.len() < 8 || theirs != ours {
        failures.push(format!(
            "{name}: bitmap placement differs from mdadm's\n--- mdadm\n{}\n--- uraid\n{}",
            theirs.join("\n"),
            ours.join("\n")
        ));
    }
    for m in &members {
        let _ = std::fs::remove_file(m);
    }
}

struct Prepared {
    case: Case,
    members: Vec<PathBuf>,
    image: PathBuf,
}

impl Prepared {
    fn member_paths(&self) -> Vec<&str> {
        paths(&self.members)
    }
}

/// (a) and (b): uraid's bitmaps, as mdadm -X reads them and as the kernel
/// runs them.
#[test]
fn kernel_runs_arrays_uraid_made_with_a_bitmap() {
    let dir = scratch("bitmap-to-kernel");
    let mut prepared = Vec::new();
    let mut failures = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let name = case.name();
        let members = sparse_files(
            dir.path(),
            &format!("{name}-m"),
            &vec![MEMBER_BYTES; case.disks],
        );
        let mut args = case.uraid_create_args();
        args.extend(members.iter().map(|m| m.display().to_string()));
        uraid_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let p = Prepared {
            case,
            members,
            image: dir.path().join(format!("{name}.img")),
        };
        assert_uraid_bitmap_clean(&name, &p.member_paths());
        let size = array_bytes(&p.member_paths());
        std::fs::write(&p.image, random_bytes(300 + i as u64, size as usize)).unwrap();
        let mut args = vec!["copy-in", "--input", p.image.to_str().unwrap()];
        args.extend(p.member_paths());
        uraid_ok(&args);
        assert_uraid_bitmap_clean(&name, &p.member_paths());
        prepared.push(p);
    }

    // mdadm -X first reads the bitmaps as uraid left them, then the kernel
    // runs each array.
    let mut script = String::from("set +e\n");
    for p in &prepared {
        let name = p.case.name();
        let before = p.image.with_extension("before");
        script.push_str(&losetup_lines(&p.members));
        let _ = writeln!(
            script,
            "mdadm --examine-bitmap \"${{L[0]}}\" > {0}.x 2> {0}.x-err",
            before.display()
        );
        script.push_str(&assemble_and_check(&name, &p.image, &p.image));
    }
    script.push_str("echo done\n");
    let uraid_before: Vec<String> = prepared
        .iter()
        .map(|p| uraid_text(&["examine", "--bitmap", p.member_paths()[0]]))
        .collect();
    let stdout = in_kernel(&script, 600);

    for (p, ours_before) in prepared.iter().zip(&uraid_before) {
        let name = p.case.name();
        let before = p.image.with_extension("before");
        let mdadm_before =
            std::fs::read_to_string(format!("{}.x", before.display())).unwrap_or_default();
        if bitmap_fields(&mdadm_before).is_empty()
            || bitmap_fields(&mdadm_before) != bitmap_fields(ours_before)
        {
            failures.push(format!(
                "{name}: examine --bitmap of uraid's bitmap differs\n--- mdadm -X\n{mdadm_before}\n--- uraid\n{ours_before}"
            ));
        }
        check_kernel_run(&name, &stdout, &mut failures);
        compare_with_mdadm(&name, p.member_paths()[0], &p.image, &mut failures);
        failures.extend(kernel_bitmap_problems(&name, &p.member_paths()));
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        failures.join("\n")
    );
}

/// (c), then (b) on the result: mdadm's bitmaps read by uraid, rewritten by
/// uraid's copy-in, and run again by the kernel.
#[test]
fn uraid_reads_and_keeps_bitmaps_mdadm_made() {
    let dir = scratch("bitmap-from-kernel");
    let mut prepared = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let name = case.name();
        let members = sparse_files(
            dir.path(),
            &format!("{name}-m"),
            &vec![MEMBER_BYTES; case.disks],
        );
        let image = dir.path().join(format!("{name}.img"));
        let upper = MEMBER_BYTES * case.disks as u64;
        std::fs::write(&image, random_bytes(700 + i as u64, upper as usize)).unwrap();
        prepared.push(Prepared {
            case,
            members,
            image,
        });
    }
    let mut script = String::from("set +e\n");
    for p in &prepared {
        let name = p.case.name();
        script.push_str(&losetup_lines(&p.members));
        let _ = writeln!(script, "dmesg -c >/dev/null");
        let _ = writeln!(
            script,
            "if mdadm --create /dev/md0 --run {} \"${{L[@]}}\" >/tmp/create.out 2>&1; then",
            p.case.mdadm_create_options()
        );
        let _ = writeln!(script, "  mdadm --wait /dev/md0 >/dev/null 2>&1");
        let _ = writeln!(script, "  S=$(blockdev --getsize64 /dev/md0)");
        let _ = writeln!(
            script,
            "  head -c \"$S\" {} > /dev/md0 && sync && echo \"WROTE {name} $S\"",
            p.image.display()
        );
        let _ = writeln!(
            script,
            "  echo \"MDSTAT {name} $(grep -A4 '^md0' /proc/mdstat | grep -o 'bitmap:.*' | head -1)\""
        );
        let _ = writeln!(script, "  mdadm --wait /dev/md0 >/dev/null 2>&1");
        let _ = writeln!(
            script,
            "else echo \"WROTE {name} create-failed $(tr '\\n' ' ' </tmp/create.out)\"; fi"
        );
        script.push_str(&stop_and_save(&name, &p.image));
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 600);

    let wrote = results(&stdout, "WROTE");
    let mut failures = Vec::new();
    let mut second = String::from("set +e\n");
    for (i, p) in prepared.iter().enumerate() {
        let name = p.case.name();
        let members = p.member_paths();
        let Some(size) = wrote.get(&name).and_then(|v| v.parse::<usize>().ok()) else {
            failures.push(format!(
                "{name}: mdadm did not write: {:?}",
                wrote.get(&name)
            ));
            continue;
        };
        if !results(&stdout, "MDSTAT")
            .get(&name)
            .is_some_and(|v| v.starts_with("bitmap: "))
        {
            failures.push(format!("{name}: mdadm made no bitmap"));
        }
        compare_with_mdadm(&name, members[0], &p.image, &mut failures);
        compare_placement(&p.case, dir.path(), &p.image, &mut failures);
        failures.extend(kernel_bitmap_problems(&name, &members));
        let expected = std::fs::read(&p.image).unwrap()[..size].to_vec();
        assert_same_bytes(
            &copy_out(&members, dir.path()),
            &expected,
            &format!("{name}: copy-out"),
        );
        assert_same_bytes(
            &copy_out(&members[1..], dir.path()),
            &expected,
            &format!("{name}: copy-out without member 0"),
        );

        // uraid writes new data: its state updates rewrite mdadm's bitmap.
        let again = p.image.with_extension("again");
        std::fs::write(&again, random_bytes(900 + i as u64, size)).unwrap();
        let mut args = vec!["copy-in", "--input", again.to_str().unwrap()];
        args.extend_from_slice(&members);
        uraid_ok(&args);
        assert_uraid_bitmap_clean(&name, &members);
        second.push_str(&losetup_lines(&p.members));
        second.push_str(&assemble_and_check(&name, &again, &again));
    }
    second.push_str("echo done\n");
    let stdout2 = in_kernel(&second, 600);
    for p in &prepared {
        let name = p.case.name();
        if !wrote.contains_key(&name) {
            continue;
        }
        let again = p.image.with_extension("again");
        check_kernel_run(&name, &stdout2, &mut failures);
        compare_with_mdadm(&name, p.member_paths()[0], &again, &mut failures);
        failures.extend(kernel_bitmap_problems(&name, &p.member_paths()));
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}\n--- kernel output\n{stdout}\n--- second run\n{stdout2}",
        failures.len(),
        failures.join("\n")
    );
}

/// Host-only: refusals, and the bits of a degraded create, which md keeps
/// set while a member is missing.
#[test]
fn bitmap_create_options() {
    let dir = scratch("bitmap-options");
    let m = sparse_files(dir.path(), "m", &[MEMBER_BYTES; 3]);
    let m = paths(&m);
    let refused = |extra: &[&str]| {
        let mut args = vec!["create", "--level", "raid1", "--raid-devices", "2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&m[..2]);
        uraid_refused(&args)
    };
    refused(&["--bitmap", "internal", "--metadata", "0.90"]);
    refused(&["--bitmap", "internal", "--bitmap-chunk", "3K"]);
    refused(&["--bitmap", "internal", "--bitmap-chunk", "1K"]);
    refused(&["--bitmap-chunk", "64K"]);
    refused(&["--bitmap", "file"]);
    uraid_refused(&[
        "create",
        "--level",
        "raid0",
        "--raid-devices",
        "2",
        "--bitmap",
        "internal",
        m[0],
        m[1],
    ]);
    // Nothing was written by the refusals.
    assert!(
        uraid()
            .args(["examine", m[0]])
            .output()
            .unwrap()
            .status
            .code()
            == Some(1)
    );

    // No bitmap: examine --bitmap says so in one line.
    uraid_ok(&[
        "create",
        "--level",
        "raid1",
        "--raid-devices",
        "2",
        m[0],
        m[1],
    ]);
    let out = uraid()
        .args(["examine", "--bitmap", m[0]])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no internal bitmap"));

    // Degraded: the resync cannot cover the missing member, so the bits stay
    // set for md to recover it from, at the superblocks' events.
    uraid_ok(&[
        "create",
        "--force",
        "--level",
        "raid5",
        "--raid-devices",
        "3",
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "64K",
        m[0],
        m[1],
        "missing",
    ]);
    for (sb, ev, _, dirty, bits) in bitmap_state(&m[..2]) {
        assert_eq!((ev, dirty), (sb, bits));
    }
}
