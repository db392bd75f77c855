//! `uraid serve --ublk` in a kernel that has ublk: the user-mode Linux 6.12
//! that tests/kernel/build-uml-ublk builds once per machine (install-deps
//! runs it). In one boot, on a raid5 of four ubd disks and a fifth as the
//! spare:
//!
//! - the array appears as /dev/ublkbN with its queue limits (block sizes,
//!   the row as optimal_io_size, the chunk as minimum_io_size,
//!   max_sectors_kb, discard, write-zeroes, a write-back cache with FUA),
//!   and `detail` names the device;
//! - ext4 is made and written, fio's io_uring engine verifies its writes
//!   (crc32c) through the file system;
//! - a member fails under the mounted file system, the spare is added and
//!   rebuilt (`manage --wait`), and fsck finds nothing;
//! - kill -9 of the server removes the block device (no hung device, I/O
//!   on the dead mount fails); a new server deletes the dead one's char
//!   device, resyncs the dirty array and
//!   serves every file as written; a SIGTERM stop deletes both device
//!   nodes;
//! - the kernel's md 6.12 assembles the disks uraid wrote: clean,
//!   mismatch_cnt 0 after a check, the same files;
//! - `uraid bench --targets ublk` measures a device of its own with fio;
//! - a stop with ext4 still mounted exits and removes the device;
//! - an array failed under the device (two of four members) fails its
//!   reads with EIO, and its stop still removes the device.
//!
//! And the refusals: a user who may not open /dev/ublk-control, a queue
//! depth out of range, each one line with the members untouched (in the
//! guest); a kernel without the ublk driver (the host, or Debian's UML
//! 6.1), one line.

mod common;
use common::*;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// The guest's script: `STEP name value` lines the host judges.
fn guest_script(uraid: &Path) -> String {
    format!(
        r#"#!/bin/bash
set -u
U={uraid}
DISKS="/dev/ubda /dev/ubdb /dev/ubdc /dev/ubdd"
SPARE=/dev/ubde
C=/run/uraid-ublk.ctl
M=/mnt/ublk
step() {{ echo "STEP $1 $2"; }}
events() {{ $U examine /dev/ubda | grep -m1 'Events :'; }}

# start LOG [DISKS]: serve over ublk alone; D is the device it prints.
start() {{
  rm -f $C
  $U serve --ublk --control $C ${{2:-$DISKS}} >$1 2>&1 &
  SP=$!
  for i in $(seq 300); do
    D=$(grep -o '/dev/ublkb[0-9]*' $1 | head -n 1)
    [ -n "$D" ] && [ -b "$D" ] && return 0
    kill -0 $SP 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}}

# Refusals first, on the untouched array.
before=$(events)
chmod 666 $DISKS
setpriv --reuid=65534 --regid=65534 --clear-groups $U serve --ublk --control /run/nobody.ctl $DISKS >/run/nobody.log 2>&1
step nobody_exit $?
step nobody_lines "$(grep -c . /run/nobody.log)"
step nobody_says "$(grep -c 'ublk-control: permission denied' /run/nobody.log)"
chmod 660 $DISKS
$U serve --ublk --ublk-depth 5000 --control $C $DISKS >/run/depth.log 2>&1
step depth_exit $?
step depth_says "$(grep -c 'between 1 and 4096' /run/depth.log)"
[ "$(events)" = "$before" ] && step untouched ok || step untouched "changed: $before -> $(events)"

start /run/serve1.log && step serve1 ok || step serve1 "failed $(tr '\n' ' ' </run/serve1.log)"
B=$(basename $D)
Q=/sys/block/$B/queue
step size "$(blockdev --getsize64 $D)"
step lbs "$(cat $Q/logical_block_size) $(cat $Q/physical_block_size)"
step io_sizes "$(cat $Q/minimum_io_size) $(cat $Q/optimal_io_size)"
step max_kb "$(cat $Q/max_sectors_kb)"
step discard "$(cat $Q/discard_max_bytes)"
step zeroes "$(cat $Q/write_zeroes_max_bytes)"
step cache "$(cat $Q/write_cache) $(cat $Q/fua)"
step detail "$($U detail --control $C | grep -c "ublk : $D")"
step status "$($U status --json | grep -c "\"ublk\": \"$D\"")"
mkfs.ext4 -q -F $D && step mkfs ok || step mkfs failed
mkdir -p $M
mount $D $M && step mount ok || step mount failed
mkdir -p $M/d
head -c $((20 << 20)) /dev/urandom > $M/f1
head -c $((3 << 20)) /dev/urandom > $M/d/f2
sync
fio --name=verify --filename=$M/fio.dat --size=16M --rw=randwrite --bs=16k --ioengine=io_uring \
    --iodepth=16 --direct=1 --verify=crc32c --do_verify=1 --output=/run/fio.log >/dev/null 2>&1
step fio "$? $(grep -c 'verify: bad' /run/fio.log)"

# A member fails under the mounted file system; a new disk takes its place.
$U manage --control $C --fail /dev/ubdb >/run/m.log 2>&1 && step fail ok || step fail "failed $(tr '\n' ' ' </run/m.log)"
head -c $((8 << 20)) /dev/urandom > $M/f3
sync
$U manage --control $C --remove /dev/ubdb >/run/m.log 2>&1 && step remove ok || step remove "failed $(tr '\n' ' ' </run/m.log)"
$U manage --control $C --add $SPARE >/run/m.log 2>&1 && step add ok || step add "failed $(tr '\n' ' ' </run/m.log)"
head -c $((4 << 20)) /dev/urandom > $M/f4
sync
$U manage --control $C --wait >/run/wait.log 2>&1 && step rebuilt "$(grep -c '4 of 4 members in sync' /run/wait.log)" || step rebuilt "failed $(tr '\n' ' ' </run/wait.log)"
(cd $M && sha256sum f1 d/f2 f3 f4 fio.dat) > /run/sums
umount $M && step umount ok || step umount failed
fsck.ext4 -fn $D >/run/fsck.log 2>&1; step fsck "$? $(grep -c 'Fix?' /run/fsck.log)"

# kill -9 under a mounted file system: the device goes, nothing hangs.
NEW="/dev/ubda $SPARE /dev/ubdc /dev/ubdd"
mount $D $M
kill -9 $SP; wait $SP 2>/dev/null
for i in $(seq 100); do [ -e /sys/block/$B ] || break; sleep 0.1; done
step killed_device "$([ -e /sys/block/$B ] && echo present || echo gone)"
timeout 30 dd if=/dev/zero of=$M/after bs=1M count=1 conv=fsync status=none 2>/dev/null
step write_dead $?
umount $M 2>/dev/null || umount -l $M

# A new server: the dirty array resyncs; every file is there.
start /run/serve2.log "$NEW" && step serve2 ok || step serve2 "failed $(tr '\n' ' ' </run/serve2.log)"
B2=$(basename $D)
step stale_deleted "$(grep -c 'deleted /dev/ublkc[0-9]*, left by a uraid serve' /run/serve2.log)"
$U manage --control $C --wait >/run/wait2.log 2>&1 && step resync2 "$(grep -c 'resync ended' /run/wait2.log)" || step resync2 "failed $(tr '\n' ' ' </run/wait2.log)"
mount $D $M && step mount2 ok || step mount2 failed
(cd $M && sha256sum -c /run/sums >/dev/null 2>&1) && step sums2 ok || step sums2 differ
umount $M
kill -TERM $SP; wait $SP; step serve2_exit $?
step stopped_device "$([ -e /sys/block/$B2 ] && echo present || echo gone) $([ -e /dev/ublkc${{B2#ublkb}} ] && echo present || echo gone)"
grep -q 'stopped cleanly' /run/serve2.log && step stop_said ok || step stop_said "$(tail -n 1 /run/serve2.log)"

# The kernel's md 6.12 on the disks uraid wrote.
if mdadm --assemble /dev/md0 $NEW >/run/asm.log 2>&1; then
  step md_assemble ok
  step md_resync_start "$(cat /sys/block/md0/md/resync_start)"
  echo check > /sys/block/md0/md/sync_action
  sleep 0.2; while [ "$(cat /sys/block/md0/md/sync_action)" != idle ]; do sleep 0.2; done
  step md_mismatch "$(cat /sys/block/md0/md/mismatch_cnt)"
  mount -o ro /dev/md0 $M && step md_mount ok || step md_mount failed
  (cd $M && sha256sum -c /run/sums >/dev/null 2>&1) && step md_sums ok || step md_sums differ
  umount $M
  mdadm --stop /dev/md0 >/dev/null 2>&1
else
  step md_assemble "failed $(tr '\n' ' ' </run/asm.log)"
fi
step md_version "$(uname -r)"

# uraid bench's ublk target: fio's io_uring engine on a device of its own.
BD=$(mktemp -d /tmp/uraid-ublk-bench.XXXXXX)
(cd $BD && timeout 120 $U bench --targets ublk --level raid5 --devices 4 --size 16M --workload randread \
    --seconds 0.3 --warmup 0.1 --client fio --dir $BD --json $BD/bench.json >/run/bench.log 2>&1)
step bench "$? $(grep -o '"target": *"ublk"' $BD/bench.json | wc -l)"
rm -rf $BD

# A stop with the file system still mounted: the kernel writes it back,
# the device goes, and the server exits without waiting for the umount.
start /run/serve4.log "$NEW" && step serve4 ok || step serve4 "failed $(tr '\n' ' ' </run/serve4.log)"
B4=$(basename $D)
mount $D $M
head -c $((1 << 20)) /dev/urandom > $M/f5
kill -TERM $SP
for i in $(seq 300); do kill -0 $SP 2>/dev/null || break; sleep 0.1; done
step mounted_stop "$(kill -0 $SP 2>/dev/null && echo waiting || echo exited) $([ -e /sys/block/$B4 ] && echo present || echo gone)"
kill -9 $SP 2>/dev/null; wait $SP 2>/dev/null
umount $M 2>/dev/null || umount -l $M

# A failed array fails its I/O with EIO and never hangs it.
start /run/serve3.log "$NEW" && step serve3 ok || step serve3 "failed $(tr '\n' ' ' </run/serve3.log)"
$U manage --control $C --fail /dev/ubdc >/dev/null 2>&1
$U manage --control $C --fail /dev/ubdd --force >/dev/null 2>&1
timeout 30 dd if=$D of=/dev/null bs=64K count=16 iflag=direct status=none 2>/run/dd.log
step failed_read "$? $(grep -c 'Input/output error' /run/dd.log)"
kill -TERM $SP; wait $SP
step failed_gone "$([ -e /sys/block/$(basename $D) ] && echo present || echo gone)"
echo "--- serve logs"; cat /run/serve1.log /run/serve2.log
"#,
        uraid = uraid.display()
    )
}

#[test]
fn serve_ublk_in_linux_6_12() {
    if let Some(why) = missing_uml() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let linux = match ublk_kernel() {
        Ok(linux) => linux,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let dir = scratch("ublk-kernel");
    let mut members: Vec<PathBuf> = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "raid5",
            "--raid-devices",
            "4",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        4,
        48 * MIB,
    );
    let size = array_bytes(&paths(&members));
    let spare = dir.path().join("spare");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(48 * MIB)
        .unwrap();
    members.push(spare);
    let script = guest_script(Path::new(env!("CARGO_BIN_EXE_uraid")));
    let stdout = in_kernel_of(Some(&linux), &script, &members, 400);
    eprintln!("{stdout}");
    let steps = results(&stdout, "STEP");
    let ok = || "ok".to_string();
    let mut expect: Vec<(&str, String)> = [
        "untouched",
        "serve1",
        "mkfs",
        "mount",
        "fail",
        "remove",
        "add",
        "umount",
        "serve2",
        "mount2",
        "sums2",
        "stop_said",
        "md_assemble",
        "md_mount",
        "md_sums",
        "serve4",
        "serve3",
    ]
    .iter()
    .map(|s| (*s, ok()))
    .collect();
    expect.extend([
        // Refused in one line each, before anything was written.
        ("nobody_exit", "1".to_string()),
        ("nobody_lines", "1".to_string()),
        ("nobody_says", "1".to_string()),
        ("depth_exit", "1".to_string()),
        ("depth_says", "1".to_string()),
        ("size", size.to_string()),
        ("lbs", "512 4096".to_string()),
        // The chunk, and the row of three data chunks is no power of two:
        // ublk takes the chunk, which divides it.
        ("io_sizes", format!("{} {}", 64 * 1024, 64 * 1024)),
        ("max_kb", "1024".to_string()),
        ("discard", (1u64 << 30).to_string()),
        ("zeroes", (1u64 << 30).to_string()),
        ("cache", "write back 1".to_string()),
        ("detail", "1".to_string()),
        // The array's entry and its detail both name the device.
        ("status", "2".to_string()),
        ("fio", "0 0".to_string()),
        ("rebuilt", "1".to_string()),
        ("fsck", "0 0".to_string()),
        ("killed_device", "gone".to_string()),
        ("write_dead", "1".to_string()),
        ("resync2", "1".to_string()),
        // The killed server's /dev/ublkcN, deleted by the next.
        ("stale_deleted", "1".to_string()),
        ("serve2_exit", "0".to_string()),
        ("stopped_device", "gone gone".to_string()),
        ("md_resync_start", "none".to_string()),
        ("md_mismatch", "0".to_string()),
        ("mounted_stop", "exited gone".to_string()),
        ("bench", "0 1".to_string()),
        ("failed_read", "1 1".to_string()),
        ("failed_gone", "gone".to_string()),
    ]);
    let failures: Vec<String> = expect
        .iter()
        .filter(|(k, v)| steps.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {:?}, expected {v:?}", steps.get(*k)))
        .collect();
    assert!(
        steps
            .get("md_version")
            .is_some_and(|v| v.starts_with("6.12")),
        "not the 6.12 kernel: {stdout}"
    );
    assert!(
        failures.is_empty(),
        "{}\n--- guest output\n{stdout}",
        failures.join("\n")
    );
}

/// Where the kernel has no ublk driver (Debian's UML 6.1, and hosts
/// without ublk_drv loaded): one line that says so, nothing written.
#[test]
fn serve_ublk_without_the_driver_says_so_in_one_line() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!("SKIPPED: this host has /dev/ublk-control");
        return;
    }
    let dir = scratch("ublk-none");
    let files = create_array(dir.path(), "m", &["-l", "1", "-n", "2"], 2, 8 * MIB);
    let members = paths(&files);
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut args = vec!["serve", "--ublk", "--control"];
    let control = dir.path().join("c.ctl");
    args.push(control.to_str().unwrap());
    args.extend(members.iter().copied());
    let said = uraid_refused(&args);
    assert!(said.contains("/dev/ublk-control: not there"), "{said}");
    assert!(said.contains("modprobe ublk_drv"), "{said}");
    let after: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(before == after, "a refused serve wrote to the members");
}

fn missing_uml() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("linux").is_file()) {
        None
    } else {
        Some("user-mode Linux (`linux`) is not installed".into())
    }
}
