//! Arrays made with `uraid create --integrity crc32c` handed to the Linux
//! kernel's md (in user-mode Linux, tests/kernel/uml-run) and back, for
//! raid1, raid5, raid6 and raid10 with metadata 1.2. The checksums live
//! after md's data area, which md never reads or writes:
//!
//! (a) uraid serves the new array, nbdcopy writes random data, SIGTERM
//!     closes the checksums cleanly; the kernel assembles the members, reads
//!     the same bytes, and its `check` finds mismatch_cnt 0;
//! (b) in the same boot the kernel writes 2 MiB over part of the array
//!     (sector-aligned but not page-aligned, so that some 4 KiB blocks are
//!     changed in part) and stops it. uraid serves it again: the superblocks'
//!     event count moved on, so every member is `IntegrityStale`, the array
//!     reads the kernel's bytes, and the check that derives the checksums
//!     again raises no `ChecksumError`. Then one 4 KiB block the kernel
//!     wrote is corrupted in its member file: a read still returns the
//!     right bytes, a `ChecksumError` names that member (the derived
//!     checksum is trusted), and the block is healed on the disk. A last
//!     start finds every checksum trusted.

mod common;
use common::*;
use std::fmt::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;
const MEMBER_BYTES: u64 = 16 * MIB;
/// Where the kernel writes (512-byte sectors): an odd sector, so that the
/// first and last 4 KiB blocks it touches change in part.
const KERNEL_WRITE_SECTOR: u64 = 2071;
const KERNEL_WRITE_BYTES: usize = 2 << 20;
/// The array offset of the block corrupted in (b), inside what the kernel
/// wrote and 4 KiB aligned (so it is one whole block of one member).
const CORRUPT_AT: usize = (1 << 20) + (64 << 10);

struct Case {
    name: &'static str,
    options: &'static [&'static str],
    disks: usize,
    seed: u64,
}

/// The guest's lines: assemble the members; CMP1 against the image uraid's
/// client wrote; MISMATCH1 after a `check`; the kernel's write (PATCH);
/// CMP2 against the expected bytes; MISMATCH2 after a second `check`; STOP.
fn kernel_lines(
    dir: &Path,
    members: &[PathBuf],
    image: &Path,
    patch: &Path,
    expected: &Path,
) -> String {
    let d = dir.display();
    let check = |key: &str| {
        format!(
            "  echo check > /sys/block/md0/md/sync_action\n  \
             sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done\n  \
             echo \"{key} $(cat /sys/block/md0/md/mismatch_cnt)\"\n"
        )
    };
    let cmp = |key: &str, file: &Path| {
        format!(
            "  if [ \"$(blockdev --getsize64 /dev/md0)\" = \"$(stat -c %s {f})\" ] && cmp /dev/md0 {f} >{d}/cmp.out 2>&1; \
             then echo \"{key} ok\"; else echo \"{key} differ $(blockdev --getsize64 /dev/md0) $(tr '\\n' ' ' <{d}/cmp.out)\"; fi\n",
            f = file.display()
        )
    };
    let mut s = String::from("set +e\nexport MDADM_NO_SYSTEMCTL=1\n");
    s.push_str(&losetup_lines(members));
    let _ = writeln!(
        s,
        "if mdadm --assemble /dev/md0 --run \"${{L[@]}}\" >{d}/asm.out 2>&1; then"
    );
    s.push_str("  echo \"ASSEMBLE ok\"\n");
    s.push_str("  echo \"RESYNC $(cat /sys/block/md0/md/resync_start)\"\n");
    s.push_str(&cmp("CMP1", image));
    s.push_str(&check("MISMATCH1"));
    let _ = writeln!(
        s,
        "  if dd if={} of=/dev/md0 bs=512 seek={KERNEL_WRITE_SECTOR} count={} conv=notrunc oflag=direct status=none && sync; \
         then echo \"PATCH ok\"; else echo \"PATCH failed\"; fi",
        patch.display(),
        KERNEL_WRITE_BYTES / 512
    );
    s.push_str(&cmp("CMP2", expected));
    s.push_str(&check("MISMATCH2"));
    s.push_str("  if mdadm --stop /dev/md0 >/dev/null 2>&1; then echo \"STOP ok\"; else echo \"STOP failed\"; fi\n");
    let _ = writeln!(
        s,
        "else echo \"ASSEMBLE failed $(tr '\\n' ' ' <{d}/asm.out)\"; fi"
    );
    s.push_str("for l in \"${L[@]}\"; do losetup -d \"$l\" || true; done\necho done\n");
    s
}

/// The value printed after KEY by the guest (first word on).
fn guest_value(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .map(str::to_string)
}

fn events_text(events: &[(String, String, String)]) -> String {
    events
        .iter()
        .map(|(e, d, x)| format!("  {e} {d} {x}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A member field of `detail.devices` (`checksum_errors`,
/// `untrusted_blocks`) for each member, where status has it.
fn member_counts(status: &serde_json::Value, members: &[&str], field: &str) -> Option<Vec<u64>> {
    members
        .iter()
        .map(|m| detail_row(&status["detail"], m).and_then(|r| r[field].as_u64()))
        .collect()
}

/// Where the member data lies in each member file: (data offset, data
/// size) in bytes, from `uraid examine --json`.
fn data_areas(members: &[&str]) -> Vec<(u64, u64)> {
    let mut args = vec!["examine", "--json"];
    args.extend_from_slice(members);
    let v: serde_json::Value =
        serde_json::from_slice(&uraid_ok(&args).stdout).expect("examine json");
    v.as_array()
        .expect("examine --json: a list")
        .iter()
        .map(|d| {
            (
                d["data_offset_sectors"].as_u64().unwrap() * 512,
                d["avail_dev_size_sectors"].as_u64().unwrap() * 512,
            )
        })
        .collect()
}

/// The first member (in role order: a mirror's first copy) whose data area
/// holds `page`, and the file offset there. The data is random, so the
/// page is found only where the layout put those array bytes.
fn member_holding(members: &[&str], page: &[u8]) -> Option<(usize, u64)> {
    for (i, (offset, size)) in data_areas(members).into_iter().enumerate() {
        let file = std::fs::read(members[i]).unwrap();
        let area = &file[offset as usize..(offset + size) as usize];
        if let Some(k) = area.chunks_exact(PAGE).position(|p| p == page) {
            return Some((i, offset + (k * PAGE) as u64));
        }
    }
    None
}

fn flip_page(member: &str, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(member)
        .unwrap();
    let mut page = vec![0u8; PAGE];
    file.read_exact_at(&mut page, at).unwrap();
    for b in &mut page {
        *b ^= 0x5a;
    }
    file.write_all_at(&page, at).unwrap();
    file.sync_data().unwrap();
}

fn read_page(member: &str, at: u64) -> Vec<u8> {
    let file = std::fs::File::open(member).unwrap();
    let mut page = vec![0u8; PAGE];
    file.read_exact_at(&mut page, at).unwrap();
    page
}

/// Waits until the served array runs no job (the derive check over).
fn wait_idle(served: &Served, what: &str) -> serde_json::Value {
    wait_status(&served.control, what, Duration::from_secs(180), |s| {
        status_whole_and_idle(s)
    })
}

/// What (a) leaves for the kernel.
struct Written {
    members: Vec<PathBuf>,
    image: PathBuf,
    data: Vec<u8>,
    /// Each member's `untrusted_blocks` on the new array, where status
    /// has it: the blocks of md's data area that no row uses (past the
    /// used device size, which md rounds down to the chunk), which no
    /// pass derives. A derive after the kernel must give back the rest.
    untrusted_new: Option<Vec<u64>>,
}

/// (a): the array, written through uraid and stopped cleanly.
fn write_through_uraid(dir: &Path, c: &Case) -> Written {
    let name = c.name;
    let mut options = vec!["--metadata", "1.2", "--integrity", "crc32c"];
    options.extend_from_slice(c.options);
    let members = create_array(dir, &format!("{name}-m"), &options, c.disks, MEMBER_BYTES);
    let all = paths(&members);
    let size = array_bytes(&all);
    let (img, data) = image(dir, &format!("{name}.img"), c.seed, size);

    let served = serve(dir, &[], &all);
    nbdcopy_in(&img, served.uri());
    let status = wait_idle(&served, "the array to settle after the writes");
    let events = status_events(&status);
    assert!(
        !events
            .iter()
            .any(|(e, _, _)| e.starts_with("Integrity") || e == "ChecksumError"),
        "{name}: a new array's checksums are trusted and match:\n{}",
        events_text(&events)
    );
    let untrusted_new = member_counts(&status, &all, "untrusted_blocks");
    served.stop();
    assert_eq!(
        examine_states(&all),
        vec!["clean"; all.len()],
        "{name}: after SIGTERM"
    );
    Written {
        members,
        image: img,
        data,
        untrusted_new,
    }
}

fn run(c: Case) {
    let name = c.name;
    let dir = scratch(&format!("kernel-integrity-{name}"));
    let Written {
        members,
        image: img,
        data,
        untrusted_new,
    } = write_through_uraid(dir.path(), &c);
    let all = paths(&members);

    let patch_bytes = random_bytes(c.seed + 1, KERNEL_WRITE_BYTES);
    let patch = dir.path().join(format!("{name}.patch"));
    std::fs::write(&patch, &patch_bytes).unwrap();
    let mut expected = data.clone();
    let at = (KERNEL_WRITE_SECTOR * 512) as usize;
    expected[at..at + KERNEL_WRITE_BYTES].copy_from_slice(&patch_bytes);
    let expected_path = dir.path().join(format!("{name}.expected"));
    std::fs::write(&expected_path, &expected).unwrap();
    assert!(at < CORRUPT_AT && CORRUPT_AT + PAGE <= at + KERNEL_WRITE_BYTES);

    // One boot: (a)'s reads and check, then (b)'s write.
    let stdout = in_kernel(
        &kernel_lines(dir.path(), &members, &img, &patch, &expected_path),
        300,
    );
    let got = |key: &str| guest_value(&stdout, key);
    assert_eq!(
        got("ASSEMBLE").as_deref(),
        Some("ok"),
        "{name}: md assembles\n{stdout}"
    );
    assert_eq!(
        got("RESYNC").as_deref(),
        Some("none"),
        "{name}: md finds it clean\n{stdout}"
    );
    assert_eq!(
        got("CMP1").as_deref(),
        Some("ok"),
        "{name}: md reads what uraid's client wrote\n{stdout}"
    );
    assert_eq!(
        got("MISMATCH1").as_deref(),
        Some("0"),
        "{name}: md's check of uraid's array\n{stdout}"
    );
    assert_eq!(
        got("PATCH").as_deref(),
        Some("ok"),
        "{name}: the kernel's write\n{stdout}"
    );
    assert_eq!(
        got("CMP2").as_deref(),
        Some("ok"),
        "{name}: md reads its own write\n{stdout}"
    );
    assert_eq!(
        got("MISMATCH2").as_deref(),
        Some("0"),
        "{name}: md's check after its write\n{stdout}"
    );
    assert_eq!(
        got("STOP").as_deref(),
        Some("ok"),
        "{name}: mdadm --stop\n{stdout}"
    );

    // (b) uraid again: every checksum stale, derived by a check.
    let served = serve(dir.path(), &[], &all);
    let events = status_events(&array_status(&served.control));
    for m in &all {
        assert!(
            events
                .iter()
                .any(|(e, d, _)| e == "IntegrityStale" && d == m),
            "{name}: no IntegrityStale for {m}:\n{}",
            events_text(&events)
        );
    }
    // Read while the derive check may still run, and after it.
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &expected,
        &format!("{name}: uraid reads what the kernel wrote"),
    );
    let status = wait_idle(&served, "the check that derives the checksums");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &expected,
        &format!("{name}: uraid reads what the kernel wrote, checksums derived"),
    );
    let status_after = array_status(&served.control);
    let events = status_events(&status_after);
    assert!(
        !events
            .iter()
            .any(|(e, _, _)| e == "ChecksumError" || e.starts_with("Mismatch")),
        "{name}: the derive check found checksums wrong where md's data is right:\n{}",
        events_text(&events)
    );
    assert_eq!(
        status["mismatch_cnt"].as_u64(),
        Some(0),
        "{name}: the derive check's mismatch_cnt: {status}"
    );
    if let Some(errors) = member_counts(&status_after, &all, "checksum_errors") {
        assert_eq!(
            errors,
            vec![0; all.len()],
            "{name}: checksum errors after the derive check"
        );
    }
    if let Some(untrusted) = member_counts(&status_after, &all, "untrusted_blocks") {
        assert_eq!(
            Some(untrusted),
            untrusted_new,
            "{name}: blocks left untrusted after the derive check (left), as on the new array (right)"
        );
    }

    // One block the kernel wrote, corrupted on its member: found by the
    // checksum the check derived.
    let page = &expected[CORRUPT_AT..CORRUPT_AT + PAGE];
    let (victim, at) = member_holding(&all, page)
        .unwrap_or_else(|| panic!("{name}: no member holds array offset {CORRUPT_AT} as data"));
    let victim_path = all[victim];
    flip_page(victim_path, at);
    // One reader with one request: a mirror's reads go to its first copy,
    // the one corrupted.
    assert_same_bytes(
        &nbdcopy_out_lone(served.uri(), dir.path()),
        &expected,
        &format!("{name}: uraid reads past the corrupted block"),
    );
    let status = array_status(&served.control);
    let events = status_events(&status);
    let flagged: Vec<&str> = events
        .iter()
        .filter(|(e, _, _)| e == "ChecksumError")
        .map(|(_, d, _)| d.as_str())
        .collect();
    assert!(
        flagged.contains(&victim_path) && flagged.iter().all(|d| *d == victim_path),
        "{name}: a ChecksumError must name {victim_path} (file offset {at}) and no other member:\n{}",
        events_text(&events)
    );
    if let Some(errors) = member_counts(&status, &all, "checksum_errors") {
        let mut want = vec![0; all.len()];
        want[victim] = 1;
        assert_eq!(
            errors, want,
            "{name}: checksum errors after one corrupted block"
        );
    }
    served.stop();
    assert_eq!(
        read_page(victim_path, at),
        page,
        "{name}: the corrupted block was not healed on {victim_path}"
    );

    // Closed cleanly after a stale start: trusted as it is.
    let served = serve(dir.path(), &[], &all);
    let status = wait_idle(&served, "a start after the derive");
    let events = status_events(&status);
    assert!(
        !events
            .iter()
            .any(|(e, _, _)| e.starts_with("Integrity") || e == "ChecksumError"),
        "{name}: the derived checksums were not kept:\n{}",
        events_text(&events)
    );
    served.stop();
}

#[test]
fn raid1_checksums_survive_the_kernel() {
    run(Case {
        name: "raid1",
        options: &["--level", "raid1", "--raid-devices", "2"],
        disks: 2,
        seed: 100,
    });
}

#[test]
fn raid5_checksums_survive_the_kernel() {
    run(Case {
        name: "raid5",
        options: &["--level", "raid5", "--raid-devices", "4"],
        disks: 4,
        seed: 200,
    });
}

#[test]
fn raid6_checksums_survive_the_kernel() {
    run(Case {
        name: "raid6",
        options: &["--level", "raid6", "--raid-devices", "5"],
        disks: 5,
        seed: 300,
    });
}

#[test]
fn raid10_checksums_survive_the_kernel() {
    run(Case {
        name: "raid10",
        options: &["--level", "raid10", "--layout", "n2", "--raid-devices", "4"],
        disks: 4,
        seed: 400,
    });
}
