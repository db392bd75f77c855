//! The write journal against the Linux kernel's md (in user-mode Linux), in
//! both directions. Each side crashes with writes in its journal, the rows
//! those writes touched are then wiped on every member (the member writes a
//! crash lost, made certain), and the other side must assemble the array,
//! replay the journal, and read every byte that was written, with parity
//! consistent:
//!
//! (a) uraid creates raid5 and raid6 arrays with `--write-journal`, serves
//!     them, nbdcopy writes an image and nbdsh rewrites whole rows, then the
//!     server is SIGKILLed. The kernel assembles each array with mdadm (the
//!     journal among the devices) and must report that it recovered
//!     data-parity stripes, read the expected bytes, and `check` must find
//!     mismatch_cnt 0.
//! (b) mdadm creates a raid5 and a raid6 array with `--write-journal` in the
//!     kernel, dd writes to them (O_DIRECT, fsync), and the guest is killed
//!     from outside while the arrays are still running (no stop, no
//!     reclaim). uraid serves each array (the journal given with the
//!     members) and must say it replayed rows, nbdcopy must read the
//!     expected bytes, and `check` must find mismatch_cnt 0.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const MEMBER_BYTES: u64 = 24 * MIB;
const JOURNAL_BYTES: u64 = 64 * MIB;

/// One array shape: level, members, chunk in KiB.
struct Shape {
    name: &'static str,
    level: &'static str,
    disks: usize,
    chunk_kib: u64,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "raid5",
        level: "5",
        disks: 4,
        chunk_kib: 64,
    },
    Shape {
        name: "raid6",
        level: "6",
        disks: 5,
        chunk_kib: 32,
    },
];

impl Shape {
    fn data_disks(&self) -> u64 {
        self.disks as u64 - if self.level == "6" { 2 } else { 1 }
    }

    /// Bytes of data in one row (a stripe of chunks).
    fn row_bytes(&self) -> u64 {
        self.chunk_kib * 1024 * self.data_disks()
    }

    /// New sparse member files and a journal file for the array `name`.
    fn files(&self, dir: &Path, name: &str) -> (Vec<PathBuf>, PathBuf) {
        let members = sparse_files(dir, &format!("{name}-m"), &vec![MEMBER_BYTES; self.disks]);
        let journal = sparse_files(dir, &format!("{name}-journal"), &[JOURNAL_BYTES]).remove(0);
        (members, journal)
    }

    /// The rows the test rewrites: whole rows, so that wiping them on every
    /// member leaves nothing outside what the journal holds.
    fn rewritten_rows(&self) -> std::ops::Range<u64> {
        40..52
    }
}

/// Writes zeros over `rows` on every member's data area (data offset
/// `data_offset` bytes): what a crash would leave where the member writes of
/// those rows were lost, made certain. Only the journal can bring them back.
fn wipe_rows(members: &[PathBuf], data_offset: u64, chunk_bytes: u64, rows: std::ops::Range<u64>) {
    use std::os::unix::fs::FileExt;
    let zeros = vec![0u8; ((rows.end - rows.start) * chunk_bytes) as usize];
    for m in members {
        let f = std::fs::OpenOptions::new().write(true).open(m).unwrap();
        f.write_all_at(&zeros, data_offset + rows.start * chunk_bytes)
            .unwrap();
        f.sync_all().unwrap();
    }
}

fn data_offset_of(member: &Path) -> u64 {
    let out = uraid_ok(&["examine", "--json", member.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["data_offset_sectors"]
        .as_u64()
        .unwrap_or_else(|| panic!("no data_offset_sectors in {v}"))
        * 512
}

/// (a): uraid writes and crashes; the kernel replays uraid's journal. A
/// third array is stopped cleanly instead: the chain uraid leaves then
/// holds nothing to replay, and the kernel must find it so.
#[test]
fn kernel_replays_the_journal_uraid_wrote() {
    let dir = scratch("journal-to-kernel");
    let mut script = String::new();
    // (shape, name, crashed, write-back): the write-back array's rows are
    // rewritten in 16 KiB writes acknowledged from the stripe cache, so its
    // journal holds data logged alone and parity logged apart (md's r5c
    // format), and the kill comes with no flush.
    let cases = [
        (&SHAPES[0], "raid5", true, false),
        (&SHAPES[1], "raid6", true, false),
        (&SHAPES[0], "raid5-stopped", false, false),
        (&SHAPES[1], "raid6-write-back", true, true),
    ];
    for (i, &(shape, name, crash, write_back)) in cases.iter().enumerate() {
        let (members, journal) = shape.files(dir.path(), name);
        let chunk = format!("{}K", shape.chunk_kib);
        let disks = shape.disks.to_string();
        let mut args = vec![
            "create",
            "--level",
            shape.level,
            "--raid-devices",
            &disks,
            "--chunk",
            &chunk,
            "--assume-clean",
            "--write-journal",
            journal.to_str().unwrap(),
        ];
        args.extend(paths(&members));
        uraid_ok(&args);
        let mut all: Vec<&str> = paths(&members);
        all.push(journal.to_str().unwrap());
        let size = array_bytes(&paths(&members));
        let image = random_bytes(0x10ad + i as u64, size as usize);
        let image_path = dir.path().join(format!("{name}.img"));
        std::fs::write(&image_path, &image).unwrap();

        let served = serve(dir.path(), &[], &all);
        nbdcopy_in(&image_path, served.uri());
        // Whole rows rewritten, then flushed: acknowledged and durable.
        let rows = shape.rewritten_rows();
        let at = rows.start * shape.row_bytes();
        let new = random_bytes(
            0xbeef + i as u64,
            ((rows.end - rows.start) * shape.row_bytes()) as usize,
        );
        let new_path = dir.path().join(format!("{name}.new"));
        std::fs::write(&new_path, &new).unwrap();
        let client = if write_back {
            manage_ok(&served.control, &["--write-policy", "write-back"]);
            format!(
                "h.connect_uri(URI)\nd = open({:?}, 'rb').read()\nfor i in range(0, len(d), 16384):\n    h.pwrite(d[i:i + 16384], {at} + i)\n",
                new_path.to_str().unwrap()
            )
        } else {
            format!(
                "h.connect_uri(URI)\nh.pwrite(open({:?}, 'rb').read(), {at})\nh.flush()\nh.shutdown()\n",
                new_path.to_str().unwrap()
            )
        };
        nbdsh_script(served.uri(), &client, Duration::from_secs(60));
        if crash {
            served.kill();
            wipe_rows(
                &members,
                data_offset_of(&members[0]),
                shape.chunk_kib * 1024,
                rows,
            );
        } else {
            served.stop();
        }
        let mut expected = image;
        expected[at as usize..at as usize + new.len()].copy_from_slice(&new);
        let expected_path = dir.path().join(format!("{name}.expected"));
        std::fs::write(&expected_path, &expected).unwrap();

        let mut devices = members.clone();
        devices.push(journal);
        script.push_str(&losetup_lines(&devices));
        let _ = writeln!(script, "dmesg -c >/dev/null");
        let _ = writeln!(
            script,
            "if mdadm --assemble /dev/md0 --run \"${{L[@]}}\" 2>/tmp/asm.err; then"
        );
        let _ = writeln!(script, "  S=$(blockdev --getsize64 /dev/md0)");
        let _ = writeln!(
            script,
            "  if cmp -n \"$S\" /dev/md0 {} >/dev/null; then echo \"CMP {name} ok\"; else echo \"CMP {name} differ\"; fi",
            expected_path.display()
        );
        let _ = writeln!(script, "  echo check > /sys/block/md0/md/sync_action");
        let _ = writeln!(script, "  sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done");
        let _ = writeln!(
            script,
            "  echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\""
        );
        let _ = writeln!(
            script,
            "  echo \"MODE {name} $(cat /sys/block/md0/md/journal_mode 2>&1 | tr ' ' _)\""
        );
        let _ = writeln!(script, "  mdadm --stop /dev/md0 >/dev/null 2>&1 || true");
        let _ = writeln!(
            script,
            "else echo \"CMP {name} assemble-failed $(tr '\\n' ' ' </tmp/asm.err)\"; fi"
        );
        let _ = writeln!(
            script,
            "echo \"DMESG {name} $(dmesg -c | grep -i -E 'journal|recover|r5l|raid' | tr '\\n' '|')\""
        );
        let _ = writeln!(
            script,
            "for l in \"${{L[@]}}\"; do losetup -d \"$l\" || true; done"
        );
    }
    let stdout = in_kernel(&script, 600);
    let mut failures = Vec::new();
    for &(_, name, crash, _) in &cases {
        let get = |key: &str| results(&stdout, key).get(name).cloned();
        if get("CMP").as_deref() != Some("ok") {
            failures.push(format!("{name}: kernel read {:?}", get("CMP")));
        }
        if get("MISMATCH").as_deref() != Some("0") {
            failures.push(format!("{name}: mismatch_cnt {:?}", get("MISMATCH")));
        }
        // md: "recovering N data-only stripes and M data-parity stripes".
        let dmesg = get("DMESG").unwrap_or_default();
        let replayed = dmesg
            .split("data-parity stripes")
            .next()
            .and_then(|head| head.rsplit(' ').nth(1))
            .and_then(|n| n.parse::<u64>().ok());
        if crash && replayed.is_none_or(|n| n == 0) {
            failures.push(format!(
                "{name}: the kernel did not say it replayed data-parity stripes: {dmesg}"
            ));
        }
        if !crash && replayed.is_some_and(|n| n > 0) {
            failures.push(format!(
                "{name}: after a clean stop the kernel replayed stripes: {dmesg}"
            ));
        }
        if !get("MODE").unwrap_or_default().contains("[write-through]") {
            failures.push(format!("{name}: journal_mode {:?}", get("MODE")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        failures.join("\n")
    );
}

/// Runs `script` in user-mode Linux until it creates `marker`, then kills
/// the guest outright: no array is stopped, nothing is flushed or
/// reclaimed, as at a power cut.
fn in_kernel_until_killed(script: &str, marker: &Path, limit: Duration) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = scratch("uml-killed");
    let script_path = dir.path().join("script.sh");
    std::fs::write(
        &script_path,
        format!(
            "#!/bin/bash\nset -eu\n{script}\ntouch {}\nsleep 1000\n",
            marker.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(root.join("tests/kernel/uml-run"))
        .args(["--mem", "768M", "--timeout"])
        .arg((limit.as_secs() + 60).to_string())
        .args(["--quiet", "--", "bash"])
        .arg(&script_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tests/kernel/uml-run (install user-mode-linux: tests/kernel/install-deps)");
    let deadline = Instant::now() + limit;
    while !marker.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the guest ended ({status}) before the script finished:\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            Instant::now() < deadline,
            "the kernel script did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // uml-run names the guest uml-run-<its pid>-<random>; its processes are
    // found by that.
    let pattern = format!("umid=uml-run-{}-", child.id());
    let _ = Command::new("pkill")
        .args(["-KILL", "-f", &pattern])
        .status();
    let _ = child.wait_with_output();
}

/// (b): the kernel writes and is killed; uraid replays the kernel's journal.
#[test]
fn uraid_replays_the_journal_the_kernel_wrote() {
    let dir = scratch("journal-from-kernel");
    let marker = dir.path().join("written");
    let mut script = String::new();
    let mut arrays = Vec::new();
    for (i, shape) in SHAPES.iter().enumerate() {
        let name = shape.name;
        let (members, journal) = shape.files(dir.path(), name);
        // Little enough that md reclaims nothing: it moves the tail only
        // once a quarter of the journal could be freed.
        let head = random_bytes(0xe1 + i as u64, (4 * MIB) as usize);
        let rows = shape.rewritten_rows();
        let at = rows.start * shape.row_bytes();
        let new = random_bytes(
            0xe2 + i as u64,
            ((rows.end - rows.start) * shape.row_bytes()) as usize,
        );
        let head_path = dir.path().join(format!("{name}.head"));
        let new_path = dir.path().join(format!("{name}.new"));
        std::fs::write(&head_path, &head).unwrap();
        std::fs::write(&new_path, &new).unwrap();
        let md = format!("/dev/md{i}");
        let mut devices = members.clone();
        devices.push(journal.clone());
        script.push_str(&losetup_lines(&devices));
        let _ = writeln!(script, "J{i}=${{L[{}]}}", shape.disks);
        let _ = writeln!(
            script,
            "mdadm --create {md} --run --level={} --raid-devices={} --chunk={} --assume-clean --write-journal \"$J{i}\" \"${{L[@]:0:{}}}\" >/dev/null 2>&1",
            shape.level, shape.disks, shape.chunk_kib, shape.disks
        );
        let _ = writeln!(
            script,
            "dd if={} of={md} bs=1M oflag=direct conv=fsync status=none",
            head_path.display()
        );
        let _ = writeln!(
            script,
            "dd if={} of={md} bs={} seek={} oflag=direct conv=fsync status=none",
            new_path.display(),
            shape.row_bytes(),
            rows.start
        );
        arrays.push((shape, members, journal, head, at, new));
    }
    in_kernel_until_killed(&script, &marker, Duration::from_secs(300));

    for (shape, members, journal, head, at, new) in arrays {
        let name = shape.name;
        wipe_rows(
            &members,
            data_offset_of(&members[0]),
            shape.chunk_kib * 1024,
            shape.rewritten_rows(),
        );
        let size = array_bytes(&paths(&members)) as usize;
        let mut expected = vec![0u8; size];
        expected[..head.len()].copy_from_slice(&head);
        expected[at as usize..at as usize + new.len()].copy_from_slice(&new);
        let mut all = paths(&members);
        all.push(journal.to_str().unwrap());
        let served = serve(dir.path(), &[], &all);
        let stderr = served.stderr();
        let replayed = stderr
            .split(" rows replayed")
            .next()
            .and_then(|h| h.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok());
        assert!(
            replayed.is_some_and(|n| n > 0),
            "{name}: uraid did not replay the kernel's journal:\n{stderr}"
        );
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir.path()),
            &expected,
            &format!("{name}: after replaying the kernel's journal"),
        );
        manage_ok(&served.control, &["--action", "check"]);
        let status = wait_status(
            &served.control,
            &format!("{name}: check finished"),
            Duration::from_secs(60),
            |s| {
                status_whole_and_idle(s)
                    && status_events(s)
                        .iter()
                        .any(|(e, _, _)| e == "RebuildFinished")
            },
        );
        assert_eq!(status["mismatch_cnt"], 0, "{name}: parity after the replay");
        served.stop();
    }
}
