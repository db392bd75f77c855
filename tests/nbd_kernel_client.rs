//! The kernel's own NBD client (nbd.ko, set up by `nbd-client`) on a uraid
//! array, in one user-mode Linux boot: uraid serves a raid6 array on the
//! guest's ubd disks over a unix socket, `nbd-client -C 4` attaches it as
//! /dev/nbd0 with four connections, ext4 is made, mounted, written and
//! trimmed; then the server is SIGKILLed under the mounted file system.
//!
//! What the kernel does then (nbd-client 3.24, Linux 6.1): nbd-client sets
//! the device up over netlink and exits, so nobody is left to reconnect
//! (tried with `-persist` too: it exits all the same, and the I/O fails
//! the same way); with no dead-connection timeout the kernel fails the
//! I/O at once, and ext4
//! aborts its journal. The test checks exactly that: a write after the kill
//! fails with EIO. Nothing acknowledged may be lost: after unmounting,
//! `nbd-client -d`, a new server (which resyncs the dirty array) and a new
//! attach, the journal replays, every file synced before the kill has its
//! checksum, and `fsck.ext4 -fn` is clean. Finally a clean `nbd-client -d`,
//! SIGTERM to the server, and the kernel's md assembles the same disks:
//! clean, mismatch_cnt 0 after a check, the same files and checksums.

mod common;
use common::*;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// Why the test cannot run here, if user-mode Linux or its nbd.ko is absent.
fn missing_uml() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|d| d.join("linux").is_file()) {
        return Some("user-mode Linux (`linux`) is not installed".into());
    }
    let has_nbd = std::fs::read_dir("/usr/lib/uml/modules")
        .into_iter()
        .flatten()
        .flatten()
        .any(|v| v.path().join("kernel/drivers/block/nbd.ko").is_file());
    if has_nbd {
        None
    } else {
        Some("no /usr/lib/uml/modules/*/kernel/drivers/block/nbd.ko".into())
    }
}

/// The guest's script. It goes on after a failed step (so that the output
/// says what else held) and prints `STEP name value` lines that the host
/// judges; nothing in it decides whether the test passed.
fn guest_script(uraid: &Path, disks: &[&str]) -> String {
    let disks = disks.join(" ");
    format!(
        r#"#!/bin/bash
set -u
U={uraid}
DISKS="{disks}"
S=/run/uraid-nbd.sock
C=/run/uraid-nbd.ctl
M=/mnt/nbd
step() {{ echo "STEP $1 $2"; }}

start_server() {{
  rm -f $S $C
  $U serve --nbd unix:$S --control $C $DISKS >>/run/serve.log 2>&1 &
  SP=$!
  for i in $(seq 300); do [ -S $S ] && return 0; sleep 0.1; done
  return 1
}}
attach() {{
  nbd-client -unix $S /dev/nbd0 -N uraid -C 4 -b 4096 >/run/attach.log 2>&1
}}
sums() {{ (cd $M && sha256sum f1 dir/f2 f3 2>&1); }}

start_server && step serve1 ok || step serve1 failed
attach && step attach1 ok || step attach1 "failed $(tr '\n' ' ' </run/attach.log)"
step connections "$(grep -c Negotiation: /run/attach.log)"
step size "$(blockdev --getsize64 /dev/nbd0)"
step discard "$(cat /sys/block/nbd0/queue/discard_max_bytes)"
mkfs.ext4 -q -F /dev/nbd0 && step mkfs ok || step mkfs failed
mkdir -p $M
mount /dev/nbd0 $M && step mount1 ok || step mount1 failed
mkdir -p $M/dir
head -c $((24 << 20)) /dev/urandom > $M/f1
head -c $((3 << 20)) /dev/urandom > $M/dir/f2
head -c $((40 << 20)) /dev/urandom > $M/junk
sync
rm $M/junk
# Trims the junk's blocks (and the rest of the free space) through uraid.
fstrim -v $M >/run/fstrim.log 2>&1 && step fstrim "ok $(tr '\n' ' ' </run/fstrim.log)" || step fstrim "failed $(tr '\n' ' ' </run/fstrim.log)"
head -c $((5 << 20)) /dev/urandom > $M/f3
sync
sums > /run/sums.before

kill -9 $SP; wait $SP 2>/dev/null
# No server: the kernel fails the write (its fsync reports the error).
if head -c $((1 << 20)) /dev/urandom | dd of=$M/after-kill bs=1M conv=fsync status=none 2>/run/dd.log; then
  step write_after_kill ok
else
  grep -q 'Input/output error' /run/dd.log && step write_after_kill eio || step write_after_kill "failed $(tr '\n' ' ' </run/dd.log)"
fi
umount $M && step umount_dead ok || step umount_dead failed
dmesg | grep -q 'Aborting journal on device nbd0' && step journal_aborted yes || step journal_aborted no
nbd-client -d /dev/nbd0 >/dev/null 2>&1
step detached_dead "$(cat /sys/block/nbd0/size)"

# The same socket, a new server; the array was left dirty, so it resyncs.
start_server && step serve2 ok || step serve2 failed
attach && step attach2 ok || step attach2 "failed $(tr '\n' ' ' </run/attach.log)"
mount /dev/nbd0 $M && step mount2 ok || step mount2 failed
sums > /run/sums.after
cmp -s /run/sums.before /run/sums.after && step sums2 ok || step sums2 "differ $(tr '\n' ' ' </run/sums.after)"
head -c $((2 << 20)) /dev/urandom > $M/f4
sync
(cd $M && sha256sum f4) > /run/sums.f4
umount $M && step umount2 ok || step umount2 failed
fsck.ext4 -fn /dev/nbd0 >/run/fsck.log 2>&1; step fsck2 "$? $(grep -c 'Fix?' /run/fsck.log)"
nbd-client -d /dev/nbd0 >/run/detach.log 2>&1 && step detach2 ok || step detach2 "failed $(tr '\n' ' ' </run/detach.log)"
step detached2 "$(cat /sys/block/nbd0/size)"
# The resync the dirty start began ends first (mdadm --wait's way), so
# that md finds the array clean.
$U manage --control $C --wait >/run/wait.log 2>&1 && step wait2 ok || step wait2 "failed $(tr '\n' ' ' </run/wait.log)"
kill -TERM $SP; wait $SP; step serve2_exit $?

# The kernel's md on the same disks.
if mdadm --assemble /dev/md0 $DISKS >/run/asm.log 2>&1; then
  step md_assemble ok
  step md_resync_start "$(cat /sys/block/md0/md/resync_start)"
  echo check > /sys/block/md0/md/sync_action
  sleep 0.2; while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
  step md_mismatch "$(cat /sys/block/md0/md/mismatch_cnt)"
  fsck.ext4 -fn /dev/md0 >/run/fsck-md.log 2>&1; step md_fsck "$? $(grep -c 'Fix?' /run/fsck-md.log)"
  mount -o ro /dev/md0 $M && step md_mount ok || step md_mount failed
  sums > /run/sums.md
  cmp -s /run/sums.before /run/sums.md && step md_sums ok || step md_sums "differ $(tr '\n' ' ' </run/sums.md)"
  (cd $M && sha256sum f4) | cmp -s /run/sums.f4 - && step md_f4 ok || step md_f4 differ
  umount $M
  mdadm --stop /dev/md0 >/dev/null 2>&1
else
  step md_assemble "failed $(tr '\n' ' ' </run/asm.log)"
fi
echo "--- serve log"; grep -v SmartUnavailable /run/serve.log
echo "--- fsck"; cat /run/fsck.log
echo "--- dmesg"; dmesg | grep -i 'nbd\|ext4\|md0' | tail -40
"#,
        uraid = uraid.display(),
    )
}

#[test]
fn kernel_nbd_client_on_raid6_survives_a_killed_server() {
    if let Some(why) = missing_uml() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    client_tool("nbd-client", "nbd-client");
    let dir = scratch("nbd-kernel");
    let members: Vec<PathBuf> = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "raid6",
            "--raid-devices",
            "5",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        5,
        48 * MIB,
    );
    let size = array_bytes(&paths(&members));
    let ubd: Vec<String> = (0..members.len())
        .map(|i| format!("/dev/ubd{}", (b'a' + i as u8) as char))
        .collect();
    let ubd: Vec<&str> = ubd.iter().map(String::as_str).collect();
    let script = guest_script(Path::new(env!("CARGO_BIN_EXE_uraid")), &ubd);
    let stdout = in_kernel_with_disks(&script, &members, 240);

    let steps = results(&stdout, "STEP");
    let ok = "ok".to_string();
    let mut expect: Vec<(&str, String)> = [
        "serve1",
        "attach1",
        "mkfs",
        "mount1",
        "umount_dead",
        "serve2",
        "attach2",
        "mount2",
        "sums2",
        "umount2",
        "detach2",
        "wait2",
        "md_assemble",
        "md_mount",
        "md_sums",
        "md_f4",
    ]
    .iter()
    .map(|s| (*s, ok.clone()))
    .collect();
    expect.extend([
        ("connections", "4".to_string()),
        ("size", size.to_string()),
        // The kernel failed the write, and ext4 stopped its journal.
        ("write_after_kill", "eio".to_string()),
        ("journal_aborted", "yes".to_string()),
        ("detached_dead", "0".to_string()),
        ("detached2", "0".to_string()),
        // fsck's status and its count of questions.
        ("fsck2", "0 0".to_string()),
        ("md_fsck", "0 0".to_string()),
        ("serve2_exit", "0".to_string()),
        ("md_resync_start", "none".to_string()),
        ("md_mismatch", "0".to_string()),
    ]);
    let mut failures: Vec<String> = expect
        .iter()
        .filter(|(k, v)| steps.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {:?}, expected {v:?}", steps.get(*k)))
        .collect();
    if steps.get("discard").is_none_or(|d| d == "0") {
        failures.push(format!(
            "discard: {:?}: the kernel saw no discard support",
            steps.get("discard")
        ));
    }
    if !steps
        .get("fstrim")
        .is_some_and(|f| f.starts_with("ok ") && f.contains("trimmed"))
    {
        failures.push(format!("fstrim: {:?}", steps.get("fstrim")));
    }
    assert!(
        failures.is_empty(),
        "{}\n--- guest output\n{stdout}",
        failures.join("\n")
    );
}
