//! raid10 reshapes between uraid and the Linux kernel's md (in user-mode
//! Linux, tests/kernel/uml-run).
//!
//! - The kernel grows a raid10 (near=2, 4 to 5 members, mdadm's 512K
//!   chunk, which md copies 64K at a time) and changes another's chunk,
//!   slowly, and is stopped midway; `uraid copy-out` reads what md
//!   reads there (md's point is in array sectors and may fall inside a
//!   chunk), `uraid examine` prints what mdadm prints, and `uraid serve`
//!   finishes the reshape.
//! - uraid reshapes raid10 arrays (near and offset, adding members, near to
//!   offset) while an NBD client writes, and one it was killed in (SIGKILL)
//!   midway (which the next `uraid serve` finishes too, on a copy): the
//!   kernel assembles each, finishes what is left, and finds the same
//!   bytes, the new shape and no mismatch.
//! - md's refusals (far layouts, 1.0 metadata, too few spares, a change of
//!   copies) are one line each and change nothing on disk.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};

const MIB: usize = 1 << 20;
/// Each member's size: small, so that each reshape takes seconds.
const MEMBER_BYTES: u64 = 32 << 20;
/// The region the kernel's guest writes while its reshape runs: it spans
/// the point the stop leaves.
const DURING_AT: usize = MIB;
const DURING_LEN: usize = 4 * MIB;
/// md's reshape never passes this point (`sync_max`, in array sectors,
/// a multiple of every old chunk here): the speed limits alone let a
/// guest starved of CPU finish the reshape before the stop, since md
/// catches up at full speed after a pause. Far enough that it is usually
/// the time, not this bound, that sets where md stops.
const STOP_BY_SECTORS: u64 = 40 << 11;
/// md's layout numbers: near=2 and offset=2.
const NEAR2: u32 = 0x102;
const OFFSET2: u32 = 0x10201;

/// A reshape the kernel starts and is stopped in.
struct KernelCase {
    name: &'static str,
    /// Members, the first four make the array, the rest are spares.
    members: usize,
    create: &'static str,
    grow: &'static str,
    delta: i64,
    /// md's shape once the reshape ends: members, chunk (KiB), layout.
    new_shape: (usize, u64, u32),
}

fn kernel_cases() -> [KernelCase; 2] {
    [
        // mdadm's default 512K chunk, which md copies 64K at a time: a
        // point md records by time (every 10 s) may fall inside a chunk.
        KernelCase {
            name: "kgrow",
            members: 5,
            create: "--layout=n2 --chunk=512",
            grow: "--raid-devices=5",
            delta: 1,
            new_shape: (5, 512, NEAR2),
        },
        // A same-count reshape, which mdadm moves down into the middle of
        // the room before the data. (md here fails members when it
        // changes near to offset itself, so uraid's near-to-offset change
        // is checked by md only once done, below.)
        KernelCase {
            name: "kchunk",
            members: 4,
            create: "--layout=n2 --chunk=64",
            grow: "--chunk=128",
            delta: 0,
            new_shape: (4, 128, NEAR2),
        },
    ]
}

/// The guest's lines for one half-done reshape: leaves `NAME.kernel-read`
/// (what md reads while its reshape runs) and `NAME.kernel-examine` (after
/// the stop), prints `SIZE NAME bytes` and `RUNNING NAME yes`.
///
/// md is read while the reshape runs, not reassembled read-only after the
/// stop as the raid5 tests do: a raid10 whose reshape is not running (read
/// only, or frozen) reads the moved chunks at the old data offset
/// (raid10.c's choose_data_offset tests MD_RECOVERY_RESHAPE), which are
/// not where they are.
fn kernel_mid_reshape(case: &KernelCase, dir: &Path, files: &[PathBuf]) -> String {
    let (name, d) = (case.name, dir.display());
    let mut s = losetup_lines(files);
    let _ = writeln!(
        s,
        "mdadm --create /dev/md0 --run --assume-clean --metadata=1.2 --level=10 {} --raid-devices=4 \"${{L[@]:0:4}}\" >{d}/{name}.create 2>&1\n\
         sz=$(blockdev --getsize64 /dev/md0); echo \"SIZE {name} $sz\"\n\
         dd if={d}/pattern of=/dev/md0 bs=1M count=$((sz >> 20)) oflag=direct status=none\n\
         for spare in \"${{L[@]:4}}\"; do mdadm /dev/md0 --add \"$spare\" >/dev/null; done\n\
         echo 1000 > /proc/sys/dev/raid/speed_limit_min; echo 2000 > /proc/sys/dev/raid/speed_limit_max\n\
         echo {} > /sys/block/md0/md/sync_max\n\
         mdadm --grow /dev/md0 {} >{d}/{name}.grow 2>&1\n\
         sleep 0.5\n\
         dd if={d}/during of=/dev/md0 bs=1M seek={} count={} oflag=direct conv=notrunc status=none\n\
         dd if=/dev/md0 of={d}/{name}.kernel-read bs=1M iflag=direct status=none\n\
         grep -q reshape /proc/mdstat && echo \"RUNNING {name} yes\"\n\
         mdadm --stop /dev/md0 >/dev/null\n\
         mdadm --examine \"${{L[0]}}\" >{d}/{name}.kernel-examine 2>&1\n\
         for l in \"${{L[@]}}\"; do losetup -d \"$l\"; done",
        case.create,
        STOP_BY_SECTORS,
        case.grow,
        DURING_AT / MIB,
        DURING_LEN / MIB
    );
    s
}

/// The kernel's point, from its examine text (KiB there), in sectors.
fn reshape_position(examine: &str) -> u64 {
    examine
        .lines()
        .find_map(|l| l.trim().strip_prefix("Reshape pos'n : "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kib| kib * 2)
        .unwrap_or_else(|| panic!("no reshape in progress at the stop: {examine}"))
}

/// The kernel's half-done raid10 reshapes, read and finished by uraid.
fn kernel_started(dir: &Path) -> Vec<KernelCheck> {
    let pattern = random_bytes(61, 64 * MIB);
    let during = random_bytes(62, DURING_LEN);
    std::fs::write(dir.join("pattern"), &pattern).unwrap();
    std::fs::write(dir.join("during"), &during).unwrap();
    let cases = kernel_cases();
    let (out, members) = run_guest_cases(
        dir,
        &cases,
        |c| (c.name, c.members),
        MEMBER_BYTES,
        |c, files| kernel_mid_reshape(c, dir, files),
        300,
    );
    let (sizes, running) = (results(&out, "SIZE"), results(&out, "RUNNING"));
    let mut grown = Vec::new();
    for (case, files) in cases.iter().zip(members) {
        let name = case.name;
        let size: usize = sizes[name].parse().unwrap();
        assert!(
            running.contains_key(name),
            "{name}: md's reshape ended before the stop: {out}"
        );
        let mut expected = pattern[..size].to_vec();
        expected[DURING_AT..DURING_AT + DURING_LEN].copy_from_slice(&during);
        let (new_disks, new_chunk_kib, new_layout) = case.new_shape;
        let new_size = size / 4 * new_disks;
        let finished = finish_kernel_reshape(case, dir, &files, size, &expected);
        assert_eq!(finished.len(), new_size, "{name}: the new size");
        grown.push(KernelCheck {
            name: name.into(),
            expected: expected_file(dir, name, expected, new_size),
            members: files,
            shape: shape("raid10", new_disks, new_chunk_kib, new_layout),
        });
    }
    grown
}

/// One half-done reshape of the kernel's: uraid reads it as md read it,
/// examines it as mdadm does, then `uraid serve` finishes it. Returns what
/// the array then holds.
fn finish_kernel_reshape(
    case: &KernelCase,
    dir: &Path,
    files: &[PathBuf],
    size: usize,
    expected: &[u8],
) -> Vec<u8> {
    let name = case.name;
    let kernel_examine =
        std::fs::read_to_string(dir.join(format!("{name}.kernel-examine"))).unwrap();
    let position = reshape_position(&kernel_examine);
    assert!(
        position > 0 && (position as usize) < size / 512,
        "{name}: the stop came at {position}, not midway"
    );
    eprintln!("{name}: md stopped at sector {position}");
    let kernel_read = std::fs::read(dir.join(format!("{name}.kernel-read"))).unwrap();
    assert_same_bytes(&kernel_read, expected, &format!("{name}: md's bytes"));
    let all = paths(files);
    assert_same_bytes(
        &copy_out(&all, dir),
        &kernel_read,
        &format!("{name}: copy-out"),
    );
    // Without a member: every chunk keeps a copy on either side.
    assert_same_bytes(
        &copy_out(&all[1..], dir),
        &kernel_read,
        &format!("{name}: copy-out without member 0"),
    );
    let ours = String::from_utf8(uraid_ok(&["examine", all[0]]).stdout).unwrap();
    assert_eq!(
        examine_comparable(&kernel_examine),
        examine_comparable(&ours),
        "{name}: examine differs\n--- mdadm\n{kernel_examine}\n--- uraid\n{ours}"
    );
    let detail = detail_offline(&all);
    assert_eq!(
        detail["reshape"]["position_sectors"].as_u64(),
        Some(position),
        "{name}"
    );
    assert_eq!(
        detail["reshape"]["delta_devices"].as_i64(),
        Some(case.delta),
        "{name}"
    );

    // uraid serve continues it from md's point to the end.
    let (served, back) = serve_to_the_end(dir, &all, name);
    assert_same_bytes(
        &back[..size],
        expected,
        &format!("{name}: finished by uraid"),
    );
    served.stop();
    back
}

/// A raid10 uraid creates, serves and fills.
fn raid10_array(
    dir: &Path,
    name: &str,
    layout: &str,
    disks: usize,
    spares: usize,
    seed: u64,
) -> (Vec<PathBuf>, Served, Vec<u8>) {
    // "n2+bitmap": with a write-intent bitmap, which md resizes as a
    // raid10 grow starts.
    let (layout, bitmap) = match layout.strip_suffix("+bitmap") {
        Some(layout) => (layout, true),
        None => (layout, false),
    };
    let mut extra = vec!["--chunk", "64K", "--layout", layout];
    if bitmap {
        extra.extend_from_slice(&["--bitmap", "internal", "--bitmap-chunk", "1M"]);
    }
    let shape = ("raid10", disks, spares);
    filled_array(dir, name, shape, &extra, MEMBER_BYTES, seed)
}

#[test]
fn raid10_reshapes_hand_over_between_uraid_and_the_kernel() {
    let dir = scratch("reshape-raid10");
    let dir = dir.path();
    let mut grown = kernel_started(dir);

    // Reshapes uraid runs to the end under a client's writes.
    type Run = (
        &'static str,
        &'static str,
        usize,
        usize,
        &'static [&'static str],
        usize,
        u32,
    );
    let runs: [Run; 4] = [
        ("n2add", "n2", 4, 2, &["--raid-devices", "6"], 6, NEAR2),
        (
            "n2bitmap",
            "n2+bitmap",
            4,
            1,
            &["--raid-devices", "5"],
            5,
            NEAR2,
        ),
        ("o2add", "o2", 4, 1, &["--raid-devices", "5"], 5, OFFSET2),
        ("n2to_o2", "n2", 4, 0, &["--layout", "o2"], 4, OFFSET2),
    ];
    for (i, (name, layout, disks, spares, change, new_disks, new_layout)) in runs.iter().enumerate()
    {
        let (files, served, pattern) =
            raid10_array(dir, name, layout, *disks, *spares, 70 + i as u64);
        let mdstat = grow_slowly(&served, change);
        assert!(mdstat.contains("reshape ="), "{name}: {mdstat}");
        let (patched, _) = patch_while_reshaping(&served, dir, name, 9 + i as u64, 128 * 1024);
        wait_reshape_finished(&served, name);
        let size = pattern.len() / disks * new_disks;
        assert_reads_back(&served, dir, name, &patched, size);
        served.stop();
        grown.push(KernelCheck {
            name: name.to_string(),
            expected: expected_file(dir, name, patched, size),
            members: files,
            shape: shape("raid10", *new_disks, 64, *new_layout),
        });
    }

    // A reshape uraid is killed in: the kernel continues it. md resyncs
    // the grown part from the first copy (raid10_finish_reshape), so only
    // the old size's bytes are defined.
    let (files, served, pattern) = raid10_array(dir, "n2killed", "n2", 4, 1, 80);
    let examined = kill_mid_reshape(served, &["--raid-devices", "5"], paths(&files)[0]);
    assert!(examined.contains("Delta Devices : 1 (4->5)"), "{examined}");
    // uraid resumes it too, on a copy: the next serve finishes it.
    let copies = copy_files(&files);
    let (resumed, back) = serve_to_the_end(dir, &paths(&copies), "n2killed");
    assert_eq!(back.len(), pattern.len() / 4 * 5);
    assert_same_bytes(
        &back[..pattern.len()],
        &pattern,
        "n2killed: resumed by uraid",
    );
    resumed.stop();
    let prefix = pattern.len();
    grown.push(KernelCheck {
        name: "n2killed".into(),
        expected: expected_file(dir, "n2killed", pattern, prefix),
        members: files,
        shape: shape("raid10", 5, 64, NEAR2),
    });

    check_in_kernel(&grown, dir);
}

/// md's refusals, each one line, with every superblock left as it was.
#[test]
fn raid10_reshape_refusals_change_nothing() {
    let dir = scratch("reshape-raid10-refusals");
    let dir = dir.path();
    /// Name, create options, spares, the change asked for, and the reason.
    type Refusal = (
        &'static str,
        &'static [&'static str],
        usize,
        &'static [&'static str],
        &'static str,
    );
    let cases: [Refusal; 5] = [
        (
            "far",
            &["--layout", "f2"],
            1,
            &["--raid-devices", "5"],
            "far layout",
        ),
        (
            "v10",
            &["--layout", "n2", "--metadata", "1.0"],
            1,
            &["--raid-devices", "5"],
            "1.0 metadata",
        ),
        (
            "nospare",
            &["--layout", "n2"],
            0,
            &["--raid-devices", "5"],
            "needs 1 spare",
        ),
        (
            "copies",
            &["--layout", "n2"],
            0,
            &["--layout", "n3"],
            "number of copies",
        ),
        (
            "tofar",
            &["--layout", "n2"],
            0,
            &["--layout", "f2"],
            "far layout",
        ),
    ];
    for (name, extra, spares, change, why) in cases {
        let mut create = vec!["--chunk", "64K"];
        create.extend_from_slice(extra);
        let (files, served, _) =
            filled_array(dir, name, ("raid10", 4, spares), &create, 8 << 20, 90);
        let all = paths(&files);
        let before = shape_lines(&all);
        let mut grow = vec!["--grow"];
        grow.extend_from_slice(change);
        let refusal = manage_refused(&served.control, &grow);
        assert!(refusal.contains(why), "{name}: {refusal}");
        served.stop();
        assert_eq!(
            shape_lines(&all),
            before,
            "{name}: the refusal changed a superblock"
        );
    }
}

/// The examine lines that say each member's shape and reshape state.
fn shape_lines(members: &[&str]) -> Vec<String> {
    let fields = [
        "Feature Map",
        "Raid Level",
        "Raid Devices",
        "Layout",
        "Chunk Size",
        "Data Offset",
        "New Offset",
        "Reshape",
        "Delta Devices",
        "Device Role",
    ];
    members
        .iter()
        .flat_map(|m| {
            let text = String::from_utf8(uraid_ok(&["examine", m]).stdout).unwrap();
            text.lines()
                .filter(|l| fields.iter().any(|f| l.trim_start().starts_with(f)))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}
