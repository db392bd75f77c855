//! Arrays that uraid changed through failures, handed to the Linux kernel's
//! md (in user-mode Linux, tests/kernel/uml-run):
//!
//! - rebuilt: a member failed and removed, a new one added and rebuilt by
//!   uraid while clients wrote;
//! - resynced: the server killed (SIGKILL) in the middle of writes, a stripe
//!   torn while it was down, and resynced by the next `uraid serve`;
//! - left mid-recovery: a throttled rebuild onto a spare stopped by SIGTERM,
//!   which records md's Recovery Offset in the new member's superblock
//!   (`mdadm --examine` must show it, with the value `uraid examine` shows);
//! - left mid-replace: a throttled `--replace` stopped by SIGTERM, which
//!   records md's replacement flag and Recovery Offset on the copy; the
//!   kernel must show it as a replacement ("(R)") and resume its copy there.
//!
//! One boot assembles each with mdadm. The kernel must find it clean
//! (resync_start none); an array left mid-recovery must resume the
//! recovery where uraid stopped (sync_completed, read under a low speed
//! limit, at or past the Recovery Offset) and run it to the end
//! (sync_action idle); then nothing is missing, the array reads the
//! expected bytes, and a `check` finds mismatch_cnt 0.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const K: u64 = 1024;

/// Parses "KEY name value..." lines printed by the kernel script.
/// One array for the kernel.
struct Prepared {
    name: String,
    /// Every file to give mdadm (stale members too: the kernel must leave
    /// them out).
    files: Vec<PathBuf>,
    /// What the array must read.
    model: PathBuf,
    /// The Recovery Offset (sectors) of a member left mid-recovery.
    recovery_offset: Option<u64>,
    /// Left mid-replace: the kernel must see a replacement ("(R)" in
    /// /proc/mdstat) next to the member it copies.
    replacing: bool,
}

/// The guest's lines for one array: assemble; RESYNC (resync_start); for an
/// array left mid-recovery, RESUME (the first sync_completed seen while the
/// speed limit is 1000 KiB/s) and ACTION; then the limit is raised and the
/// recovery awaited (sync_action idle); DEGRADED; CMP against the model;
/// MISMATCH after a full check.
fn kernel_lines(p: &Prepared) -> String {
    let name = &p.name;
    let mut s = format!("echo '== {name}'\nL=()\n");
    for f in &p.files {
        let _ = writeln!(s, "L+=(\"$(losetup -f --show {})\")", f.display());
    }
    let resuming = p.recovery_offset.is_some();
    if resuming {
        // Slow enough that the first look shows where the recovery started
        // (uml-run raised the minimum, which md lets a job reach whatever
        // the maximum).
        s.push_str("echo 100 > /proc/sys/dev/raid/speed_limit_min\n");
        s.push_str("echo 1000 > /proc/sys/dev/raid/speed_limit_max\n");
    }
    let _ = writeln!(
        s,
        "if mdadm --assemble /dev/md0 --run \"${{L[@]}}\" >/tmp/asm.out 2>&1; then"
    );
    let _ = writeln!(s, "  echo \"ASSEMBLE {name} ok\"");
    let _ = writeln!(
        s,
        "  echo \"RESYNC {name} $(cat /sys/block/md0/md/resync_start)\""
    );
    if p.replacing {
        let _ = writeln!(
            s,
            "  echo \"REPLACING {name} $(grep -c '(R)' /proc/mdstat)\""
        );
    }
    if resuming {
        let _ = writeln!(
            s,
            "  C=none; for i in $(seq 200); do C=$(cat /sys/block/md0/md/sync_completed); case \"$C\" in [0-9]*) break;; esac; sleep 0.05; done"
        );
        let _ = writeln!(s, "  echo \"RESUME {name} $C\"");
        let _ = writeln!(
            s,
            "  echo \"ACTION {name} $(cat /sys/block/md0/md/sync_action)\""
        );
        s.push_str("  echo 2000000 > /proc/sys/dev/raid/speed_limit_max\n");
        s.push_str("  echo 1000000 > /proc/sys/dev/raid/speed_limit_min\n");
    }
    // Any recovery to its end (one minute at most).
    s.push_str("  for i in $(seq 600); do [ \"$(cat /sys/block/md0/md/sync_action)\" = idle ] && break; sleep 0.1; done\n");
    let _ = writeln!(
        s,
        "  echo \"IDLE {name} $(cat /sys/block/md0/md/sync_action)\""
    );
    let _ = writeln!(
        s,
        "  echo \"DEGRADED {name} $(cat /sys/block/md0/md/degraded)\""
    );
    let _ = writeln!(
        s,
        "  if [ \"$(blockdev --getsize64 /dev/md0)\" = \"$(stat -c %s {img})\" ] && cmp /dev/md0 {img} >/tmp/cmp.out 2>&1; then echo \"CMP {name} ok\"; else echo \"CMP {name} differ $(tr '\\n' ' ' </tmp/cmp.out)\"; fi",
        img = p.model.display()
    );
    s.push_str("  echo check > /sys/block/md0/md/sync_action\n");
    s.push_str("  for i in $(seq 600); do [ \"$(cat /sys/block/md0/md/sync_action)\" = idle ] && break; sleep 0.1; done\n");
    let _ = writeln!(
        s,
        "  echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\""
    );
    s.push_str("  mdadm --stop /dev/md0 >/dev/null 2>&1\n");
    let _ = writeln!(
        s,
        "else echo \"ASSEMBLE {name} failed $(tr '\\n' ' ' </tmp/asm.out)\"; fi"
    );
    s.push_str("for l in \"${L[@]}\"; do losetup -d \"$l\" || true; done\n");
    s
}

fn judge(stdout: &str, prepared: &[Prepared]) {
    for l in stdout.lines().filter(|l| {
        [
            "RESUME ",
            "DEGRADED ",
            "MISMATCH ",
            "CMP ",
            "IDLE ",
            "REPLACING ",
        ]
        .iter()
        .any(|k| l.starts_with(k))
    }) {
        eprintln!("kernel: {l}");
    }
    let get = |key: &str, name: &str| results(stdout, key).get(name).cloned();
    let mut failures = Vec::new();
    for p in prepared {
        let name = p.name.as_str();
        let mut expect = |key: &str, want: &str, why: &str| {
            let got = get(key, name);
            if got.as_deref() != Some(want) {
                failures.push(format!("{name}: {key} {got:?}, expected {want:?} ({why})"));
            }
        };
        expect("ASSEMBLE", "ok", "mdadm --assemble");
        if get("ASSEMBLE", name).as_deref() != Some("ok") {
            continue;
        }
        expect("RESYNC", "none", "the superblocks say clean");
        expect("IDLE", "idle", "any recovery ran to its end");
        expect("DEGRADED", "0", "nothing missing once recovered");
        expect("CMP", "ok", "the array reads what uraid's clients wrote");
        expect("MISMATCH", "0", "check after recovery");
        if p.replacing {
            expect("REPLACING", "1", "a replacement next to its original");
        }
        if let Some(offset) = p.recovery_offset {
            // "A / B" in sectors of a member, as recovery_offset.
            let resume = get("RESUME", name).unwrap_or_default();
            let started = resume
                .split('/')
                .next()
                .and_then(|a| a.trim().parse::<u64>().ok());
            match started {
                Some(a) if a >= offset => {}
                _ => failures.push(format!(
                    "{name}: the kernel's recovery started at {resume:?} (sync_completed), \
                     not at or past the Recovery Offset {offset} uraid recorded"
                )),
            }
            let action = get("ACTION", name).unwrap_or_default();
            if action != "recover" {
                failures.push(format!(
                    "{name}: sync_action {action:?} right after assembly, expected recover"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        failures.join("\n")
    );
}

/// An array to make: `uraid create` options, its members, and where
/// client writes should cross chunk and stripe boundaries.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    options: &'static [&'static str],
    disks: usize,
    member_bytes: u64,
    chunk: u64,
    /// Data bytes in one stripe.
    width: u64,
    seed: u64,
}

fn write_image(dir: &Path, name: &str, seed: u64, size: u64) -> PathBuf {
    let path = dir.join(format!("{name}.img"));
    std::fs::write(&path, random_bytes(seed, size as usize)).unwrap();
    path
}

/// The recovery line of a status, if a recovery runs.
fn recovering(status: &serde_json::Value) -> Option<SyncLine> {
    sync_line(status["mdstat"].as_str().unwrap_or_default()).filter(|l| l.action == "recovery")
}

/// Fails `lost` (--fail, --remove), adds a new member (rebuilt at once)
/// and writes through NBD while it is rebuilt; stops once it has finished.
/// The removed member is given to the kernel too: it is stale.
fn rebuilt(dir: &Path, shape: &Shape, lost: usize) -> Prepared {
    let Shape {
        name,
        options,
        disks,
        member_bytes,
        chunk,
        width,
        seed,
    } = *shape;
    let files = create_array(dir, &format!("{name}-m"), options, disks, member_bytes);
    let members = paths(&files);
    let spare = dir.join(format!("{name}-new"));
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(member_bytes)
        .unwrap();
    let spare = spare.to_str().unwrap();
    let size = array_bytes(&members);
    let img = write_image(dir, name, seed, size);
    let served = serve(dir, &[], &members);
    nbdcopy_in(&img, served.uri());
    manage_ok(&served.control, &["--fail", members[lost]]);
    manage_ok(&served.control, &["--remove", members[lost]]);
    // Slow enough that the writes below meet the rebuild.
    manage_ok(&served.control, &["--speed-limit-max", "4000"]);
    manage_ok(&served.control, &["--add", spare]);
    let status = array_status(&served.control);
    assert!(
        recovering(&status).is_some(),
        "{name}: no recovery after --add:\n{}",
        status["mdstat"]
    );
    let model = dir.join(format!("{name}.model"));
    nbd_patch(served.uri(), &img, &model, seed + 1, chunk, width, 30);
    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    wait_status(
        &served.control,
        &format!("{name}: the rebuild onto {spare}"),
        Duration::from_secs(60),
        status_whole_and_idle,
    );
    served.stop();
    let mut now: Vec<&str> = members.clone();
    now[lost] = spare;
    assert_eq!(examine_states(&now), vec!["clean"; disks], "{name}");
    assert_same_bytes(
        &copy_out(&now, dir),
        &std::fs::read(&model).unwrap(),
        &format!("{name}: copy-out"),
    );
    let mut given: Vec<PathBuf> = now.iter().map(PathBuf::from).collect();
    given.push(files[lost].clone());
    Prepared {
        name: name.into(),
        files: given,
        model,
        recovery_offset: None,
        replacing: false,
    }
}

/// SIGKILL while writes are in flight, a stripe torn while the server is
/// down, and the resync of the next serve; stopped once in sync.
fn resynced(dir: &Path, shape: &Shape) -> Prepared {
    let Shape {
        name,
        options,
        disks,
        member_bytes,
        chunk,
        width,
        seed,
    } = *shape;
    let files = create_array(dir, &format!("{name}-m"), options, disks, member_bytes);
    let members = paths(&files);
    let size = array_bytes(&members) as usize;
    let img = write_image(dir, name, seed, size as u64);
    let model_path = dir.join(format!("{name}.model"));
    let served = serve(dir, &[], &members);
    nbdcopy_in(&img, served.uri());
    let model = nbd_patch(served.uri(), &img, &model_path, seed + 1, chunk, width, 30);
    crash_while_hammering(served, seed + 2, width);
    assert_eq!(
        examine_states(&members),
        vec!["active"; disks],
        "{name}: after SIGKILL"
    );
    tear_a_stripe(&files[1]);
    let served = serve(dir, &[], &members);
    let status = wait_status(
        &served.control,
        &format!("{name}: the resync after the crash"),
        Duration::from_secs(60),
        |s| {
            status_whole_and_idle(s)
                && status_events(s)
                    .iter()
                    .any(|(e, _, d)| e == "RebuildFinished" && d.starts_with("resync"))
        },
    );
    assert!(
        status_events(&status)
            .iter()
            .any(|(e, _, d)| e == "RebuildFinished" && d.starts_with("resync")),
        "{name}: no resync after the crash"
    );
    served.stop();
    assert_eq!(examine_states(&members), vec!["clean"; disks], "{name}");
    // The first half was flushed before the hammering (second half) began.
    let now = copy_out(&members, dir);
    assert_same_bytes(
        &now[..size / 2],
        &model[..size / 2],
        &format!("{name}: first half"),
    );
    std::fs::write(&model_path, &now).unwrap();
    Prepared {
        name: name.into(),
        files,
        model: model_path,
        recovery_offset: None,
        replacing: false,
    }
}

/// A job onto a blank device of a member's size, held to 2000 KiB/s, past
/// its first checkpoint while clients write: the array is made, filled
/// with its image and served; `begin` starts the job (given the members
/// and the blank); `model` is what the array must read afterwards.
struct MidJob {
    files: Vec<PathBuf>,
    blank: String,
    model: PathBuf,
    served: Served,
}

fn mid_job(
    dir: &Path,
    shape: &Shape,
    blank: &str,
    begin: impl FnOnce(&Served, &[&str], &str),
) -> MidJob {
    let Shape {
        name,
        options,
        disks,
        member_bytes,
        chunk,
        width,
        seed,
    } = *shape;
    let files = create_array(dir, &format!("{name}-m"), options, disks, member_bytes);
    let path = dir.join(format!("{name}-{blank}"));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(member_bytes)
        .unwrap();
    let blank = path.to_str().unwrap().to_string();
    let members = paths(&files);
    let img = write_image(dir, name, seed, array_bytes(&members));
    let served = serve(dir, &[], &members);
    nbdcopy_in(&img, served.uri());
    manage_ok(&served.control, &["--speed-limit-max", "2000"]);
    begin(&served, &members, &blank);
    wait_status(
        &served.control,
        &format!("{name}: the job onto {blank} past 20 %"),
        Duration::from_secs(60),
        |s| {
            let events = status_events(s);
            events
                .iter()
                .rposition(|(e, d, _)| e == "RebuildStarted" && d == &blank)
                .is_some_and(|i| events[i..].iter().any(|(e, _, _)| e == "Rebuild20"))
        },
    );
    let model = dir.join(format!("{name}.model"));
    nbd_patch(served.uri(), &img, &model, seed + 1, chunk, width, 30);
    MidJob {
        files,
        blank,
        model,
        served,
    }
}

/// `mdadm --examine DEVICE`'s text.
fn mdadm_examine(device: &str) -> String {
    let out = run_limited_ok(
        std::process::Command::new(client_tool("mdadm", "mdadm"))
            .arg("--examine")
            .arg(device),
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A spare waits; a member is failed; the rebuild onto the spare, held to
/// 2000 KiB/s, passes its first checkpoint while clients write; SIGTERM.
/// The failed member is given to the kernel too.
fn mid_recovery(dir: &Path, shape: &Shape, lost: usize) -> Prepared {
    let name = shape.name;
    let MidJob {
        files,
        blank: spare,
        model,
        served,
    } = mid_job(dir, shape, "spare", |served, members, spare| {
        manage_ok(&served.control, &["--add", spare]);
        manage_ok(&served.control, &["--fail", members[lost]]);
    });
    let members = paths(&files);
    let spare = spare.as_str();
    let status = array_status(&served.control);
    let line = recovering(&status).unwrap_or_else(|| {
        panic!(
            "{name}: the rebuild ended before the stop:\n{}",
            status["mdstat"]
        )
    });
    served.stop();

    let examine = String::from_utf8_lossy(&uraid_ok(&["examine", spare]).stdout).to_string();
    let offset = recovery_offset_line(&examine)
        .unwrap_or_else(|| panic!("{name}: uraid examine shows no Recovery Offset:\n{examine}"));
    let mdadm = mdadm_examine(spare);
    assert_eq!(
        recovery_offset_line(&mdadm),
        Some(offset),
        "{name}: mdadm --examine's Recovery Offset:\n{mdadm}"
    );
    // At least where status last showed the rebuild (KiB of a member).
    assert!(
        offset >= line.done_kib * 2 && offset < line.total_kib * 2,
        "{name}: Recovery Offset {offset} sectors, status showed {line:?}"
    );
    let mut now: Vec<&str> = members.clone();
    now[lost] = spare;
    assert_eq!(examine_states(&now), vec!["clean"; shape.disks], "{name}");
    let detail = detail_offline(&now);
    let row = detail_row(&detail, spare).unwrap_or_else(|| panic!("{name}: {detail}"));
    assert_eq!(row["state"], "spare rebuilding", "{name}: {detail}");
    // uraid reads the same offline (the rebuilt part of the spare is used
    // or not: either way the bytes are the model's).
    assert_same_bytes(
        &copy_out(&now, dir),
        &std::fs::read(&model).unwrap(),
        &format!("{name}: copy-out"),
    );
    let mut given: Vec<PathBuf> = now.iter().map(PathBuf::from).collect();
    given.push(files[lost].clone());
    Prepared {
        name: name.into(),
        files: given,
        model,
        recovery_offset: Some(offset),
        replacing: false,
    }
}

/// `--replace` of a member, held to 2000 KiB/s, passes its first
/// checkpoint while clients write; SIGTERM. The replacement's superblock
/// carries md's replacement flag and Recovery Offset (mdadm --examine shows
/// "Replacement device"), and the kernel must take it as a replacement and
/// resume its copy there (uraid resuming it is an engine test).
fn mid_replace(dir: &Path, shape: &Shape, old: usize) -> Prepared {
    let name = shape.name;
    let MidJob {
        files,
        blank: new,
        model,
        served,
    } = mid_job(dir, shape, "new", |served, members, new| {
        manage_ok(&served.control, &["--replace", members[old], "--with", new]);
    });
    let members = paths(&files);
    let new = new.as_str();
    served.stop();
    let examine = mdadm_examine(new);
    assert!(
        examine.contains(&format!("Device Role : Replacement device {old}")),
        "{name}: mdadm --examine of the replacement:\n{examine}"
    );
    let first = recovery_offset_line(&examine)
        .unwrap_or_else(|| panic!("{name}: no Recovery Offset:\n{examine}"));
    let mut given: Vec<&str> = members.clone();
    given.push(new);
    let detail = detail_offline(&given);
    let row = detail_row(&detail, new).unwrap_or_else(|| panic!("{name}: {detail}"));
    assert_eq!(row["state"], "spare rebuilding", "{name}: {detail}");
    assert_eq!(
        detail["active_devices"].as_u64(),
        Some(shape.disks as u64),
        "{detail}"
    );

    assert_same_bytes(
        &copy_out(&given, dir),
        &std::fs::read(&model).unwrap(),
        &format!("{name}: copy-out"),
    );
    Prepared {
        name: name.into(),
        files: given.iter().map(PathBuf::from).collect(),
        model,
        recovery_offset: Some(first),
        replacing: true,
    }
}

#[test]
fn kernel_takes_over_arrays_uraid_rebuilt_resynced_or_left_mid_recovery() {
    let dir = scratch("fail-kernel");
    let d = dir.path();
    let prepared = vec![
        rebuilt(
            d,
            &Shape {
                name: "raid5-rebuilt",
                options: &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
                disks: 4,
                member_bytes: 16 * MIB,
                chunk: 64 * K,
                width: 3 * 64 * K,
                seed: 100,
            },
            1,
        ),
        rebuilt(
            d,
            &Shape {
                name: "raid10-rebuilt",
                options: &[
                    "--level",
                    "raid10",
                    "--raid-devices",
                    "4",
                    "--layout",
                    "n2",
                    "--chunk",
                    "32K",
                ],
                disks: 4,
                member_bytes: 16 * MIB,
                chunk: 32 * K,
                width: 2 * 32 * K,
                seed: 200,
            },
            2,
        ),
        resynced(
            d,
            &Shape {
                name: "raid6-resynced",
                options: &["--level", "raid6", "--raid-devices", "6", "--chunk", "32K"],
                disks: 6,
                member_bytes: 16 * MIB,
                chunk: 32 * K,
                width: 4 * 32 * K,
                seed: 300,
            },
        ),
        mid_recovery(
            d,
            &Shape {
                name: "raid6-mid-recovery",
                options: &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
                disks: 6,
                member_bytes: 32 * MIB,
                chunk: 64 * K,
                width: 4 * 64 * K,
                seed: 400,
            },
            2,
        ),
        mid_recovery(
            d,
            &Shape {
                name: "raid5-mid-recovery",
                options: &["--level", "raid5", "--raid-devices", "3", "--chunk", "16K"],
                disks: 3,
                member_bytes: 24 * MIB,
                chunk: 16 * K,
                width: 2 * 16 * K,
                seed: 500,
            },
            0,
        ),
        mid_recovery(
            d,
            &Shape {
                name: "raid1-mid-recovery",
                options: &["--level", "raid1", "--raid-devices", "2"],
                disks: 2,
                member_bytes: 24 * MIB,
                chunk: 64 * K,
                width: 64 * K,
                seed: 600,
            },
            1,
        ),
        mid_replace(
            d,
            &Shape {
                name: "raid6-mid-replace",
                options: &["--level", "raid6", "--raid-devices", "5", "--chunk", "32K"],
                disks: 5,
                member_bytes: 24 * MIB,
                chunk: 32 * K,
                width: 3 * 32 * K,
                seed: 700,
            },
            3,
        ),
    ];
    let mut script = String::from("set +e\n");
    for p in &prepared {
        script.push_str(&kernel_lines(p));
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 600);
    judge(&stdout, &prepared);
}
