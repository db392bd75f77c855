//! `uraid serve` against the Linux kernel's md (in user-mode Linux), in both
//! directions, for every level:
//!
//! (a) uraid creates arrays, serves them, and real NBD clients write random
//!     data (nbdcopy, then sector-aligned but chunk-unaligned nbdsh writes,
//!     some in flight together on two connections); some arrays are written
//!     degraded, one is crashed (SIGKILL) mid-write, torn and resynced. After
//!     SIGTERM one boot assembles every array with mdadm: the kernel must see
//!     it clean (resync_start none), degraded exactly where uraid left it so,
//!     read the expected bytes, and `check` must report mismatch_cnt 0.
//! (b) mdadm creates arrays (healthy; raid5/raid6 degraded with --fail and
//!     --remove after writing, or created with `missing`; raid6 left half-way
//!     through mdadm --replace) and writes random data; uraid serves each (stale members given too) and nbdcopy reads
//!     the same bytes; clients write more through uraid, and a second boot
//!     checks that the kernel reads that and finds parity consistent.

mod common;
use common::*;
use std::fmt::Write;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// Assembles the members (loop devices L) as /dev/md0 in the guest and
/// prints, for `name`: ASSEMBLE; RESYNC (resync_start at once: "none" when
/// the superblocks said clean); DEGRADED once any recovery onto spares has
/// finished (mdadm --wait); CMP against `image`; and, for a redundant array
/// with nothing missing, MISMATCH, the mismatch_cnt after a full `check`.
/// Then stops the array and detaches.
fn kernel_verify_lines(
    name: &str,
    members: &[PathBuf],
    image: &Path,
    run: bool,
    redundant: bool,
) -> String {
    let mut s = losetup_lines(members);
    let run = if run { "--run " } else { "" };
    let _ = writeln!(
        s,
        "if mdadm --assemble /dev/md0 {run}\"${{L[@]}}\" >/tmp/asm.out 2>&1; then"
    );
    let _ = writeln!(s, "  echo \"ASSEMBLE {name} ok\"");
    let _ = writeln!(
        s,
        "  echo \"RESYNC {name} $(cat /sys/block/md0/md/resync_start)\""
    );
    let _ = writeln!(s, "  mdadm --wait /dev/md0 >/dev/null 2>&1");
    let _ = writeln!(
        s,
        "  D=$(cat /sys/block/md0/md/degraded 2>/dev/null || echo -)"
    );
    let _ = writeln!(s, "  echo \"DEGRADED {name} $D\"");
    let _ = writeln!(s, "  S=$(blockdev --getsize64 /dev/md0)");
    let _ = writeln!(
        s,
        "  if [ \"$S\" = \"$(stat -c %s {img})\" ] && cmp /dev/md0 {img} >/tmp/cmp.out 2>&1; then echo \"CMP {name} ok\"; else echo \"CMP {name} differ size=$S $(tr '\\n' ' ' </tmp/cmp.out)\"; fi",
        img = image.display()
    );
    if redundant {
        let _ = writeln!(s, "  if [ \"$D\" = 0 ]; then");
        let _ = writeln!(s, "    echo check > /sys/block/md0/md/sync_action");
        let _ = writeln!(s, "    sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done");
        let _ = writeln!(
            s,
            "    echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\""
        );
        let _ = writeln!(s, "  fi");
    }
    let _ = writeln!(s, "  mdadm --stop /dev/md0 >/dev/null 2>&1");
    let _ = writeln!(
        s,
        "else echo \"ASSEMBLE {name} failed $(tr '\\n' ' ' </tmp/asm.out)\"; fi"
    );
    s.push_str("for l in \"${L[@]}\"; do losetup -d \"$l\" || true; done\n");
    s
}

/// What the kernel must report for one array.
struct Expect {
    name: String,
    /// The acceptable numbers of missing members (None: not a redundant level).
    degraded: Option<Vec<usize>>,
    /// A `check` must have run (and found nothing): nothing was missing.
    check: bool,
}

fn judge(stdout: &str, expect: &[Expect]) {
    // What the kernel reported, for the log (cargo test -- --nocapture).
    for l in stdout.lines().filter(|l| {
        l.starts_with("DEGRADED ") || l.starts_with("MISMATCH ") || l.starts_with("CMP ")
    }) {
        eprintln!("kernel: {l}");
    }
    let assembled = results(stdout, "ASSEMBLE");
    let resync = results(stdout, "RESYNC");
    let degraded = results(stdout, "DEGRADED");
    let cmp = results(stdout, "CMP");
    let mismatch = results(stdout, "MISMATCH");
    let mut failures = Vec::new();
    for e in expect {
        let name = &e.name;
        if assembled.get(name).map(String::as_str) != Some("ok") {
            failures.push(format!(
                "{name}: mdadm --assemble: {:?}",
                assembled.get(name)
            ));
            continue;
        }
        // A dirty superblock would make the kernel resync from resync_start.
        if resync.get(name).map(String::as_str) != Some("none") {
            failures.push(format!(
                "{name}: the kernel found the array dirty: resync_start {:?}",
                resync.get(name)
            ));
        }
        if let Some(ok) = &e.degraded {
            if !ok
                .iter()
                .any(|d| degraded.get(name) == Some(&d.to_string()))
            {
                failures.push(format!(
                    "{name}: degraded {:?}, expected one of {ok:?}",
                    degraded.get(name)
                ));
            }
        }
        if cmp.get(name).map(String::as_str) != Some("ok") {
            failures.push(format!("{name}: kernel read {:?}", cmp.get(name)));
        }
        if (e.check || mismatch.contains_key(name))
            && mismatch.get(name).map(String::as_str) != Some("0")
        {
            failures.push(format!(
                "{name}: check mismatch_cnt {:?}",
                mismatch.get(name)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} arrays failed:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        expect.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------
// (a) uraid creates and serves, the kernel checks.

struct Case {
    name: &'static str,
    options: Vec<&'static str>,
    sizes: Vec<u64>,
    chunk: u64,
    /// Data bytes per stripe (where writes should cross boundaries).
    width: u64,
    /// Parity or mirrors: `check` applies.
    redundant: bool,
    /// Roles left out while the clients write (the kernel must then find
    /// exactly these missing and the stale members not used).
    lost: Vec<usize>,
    /// SIGKILL mid-write, a torn stripe, and a resync on the next serve.
    crash: bool,
    /// Members in /dev/shm while uraid serves: the clients' big writes take
    /// the staged path (into mapped members, raid6 parity computed in
    /// place). The kernel checks copies of them in the scratch folder
    /// (the guest sees the host's /tmp, not its /dev/shm).
    in_memory: bool,
}

fn case(
    name: &'static str,
    options: &[&'static str],
    disks: usize,
    chunk: u64,
    data_disks: u64,
) -> Case {
    Case {
        name,
        options: options.to_vec(),
        sizes: vec![16 * MIB; disks],
        chunk,
        width: chunk * data_disks,
        redundant: !matches!(options[1], "raid0" | "linear"),
        lost: vec![],
        crash: false,
        in_memory: false,
    }
}

fn uraid_cases() -> Vec<Case> {
    const K: u64 = 1024;
    vec![
        Case {
            sizes: vec![12 * MIB, 16 * MIB, 20 * MIB],
            ..case(
                "linear-3-unequal",
                &["--level", "linear", "--raid-devices", "3"],
                3,
                64 * K,
                4,
            )
        },
        case(
            "raid0-4-c16",
            &["--level", "raid0", "--raid-devices", "4", "--chunk", "16K"],
            4,
            16 * K,
            4,
        ),
        Case {
            sizes: vec![12 * MIB, 16 * MIB, 20 * MIB],
            ..case(
                "raid0-3-unequal-alternate",
                &[
                    "--level",
                    "raid0",
                    "--raid-devices",
                    "3",
                    "--chunk",
                    "32K",
                    "--layout",
                    "alternate",
                ],
                3,
                32 * K,
                3,
            )
        },
        Case {
            in_memory: true,
            ..case(
                "raid1-3",
                &["--level", "raid1", "--raid-devices", "3"],
                3,
                64 * K,
                1,
            )
        },
        case(
            "raid4-4-c32",
            &["--level", "raid4", "--raid-devices", "4", "--chunk", "32K"],
            4,
            32 * K,
            3,
        ),
        case(
            "raid5-3-la-c64",
            &[
                "--level",
                "raid5",
                "--raid-devices",
                "3",
                "--chunk",
                "64K",
                "--layout",
                "left-asymmetric",
            ],
            3,
            64 * K,
            2,
        ),
        case(
            "raid5-5-c16",
            &["--level", "raid5", "--raid-devices", "5", "--chunk", "16K"],
            5,
            16 * K,
            4,
        ),
        case(
            "raid5-6-rs-c8",
            &[
                "--level",
                "raid5",
                "--raid-devices",
                "6",
                "--chunk",
                "8K",
                "--layout",
                "right-symmetric",
            ],
            6,
            8 * K,
            5,
        ),
        Case {
            in_memory: true,
            ..case(
                "raid6-4-c64",
                &["--level", "raid6", "--raid-devices", "4", "--chunk", "64K"],
                4,
                64 * K,
                2,
            )
        },
        case(
            "raid6-7-ra-c16",
            &[
                "--level",
                "raid6",
                "--raid-devices",
                "7",
                "--chunk",
                "16K",
                "--layout",
                "right-asymmetric",
            ],
            7,
            16 * K,
            5,
        ),
        case(
            "raid10-n2-3",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "3",
                "--layout",
                "n2",
                "--chunk",
                "64K",
            ],
            3,
            64 * K,
            3,
        ),
        case(
            "raid10-f2-5",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "5",
                "--layout",
                "f2",
                "--chunk",
                "32K",
            ],
            5,
            32 * K,
            5,
        ),
        case(
            "raid10-o2-4",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "4",
                "--layout",
                "o2",
                "--chunk",
                "16K",
            ],
            4,
            16 * K,
            4,
        ),
        Case {
            lost: vec![1],
            ..case(
                "raid5-4-degraded",
                &["--level", "raid5", "--raid-devices", "4", "--chunk", "32K"],
                4,
                32 * K,
                3,
            )
        },
        Case {
            lost: vec![0, 3],
            ..case(
                "raid6-6-degraded2",
                &["--level", "raid6", "--raid-devices", "6", "--chunk", "16K"],
                6,
                16 * K,
                4,
            )
        },
        Case {
            crash: true,
            ..case(
                "raid6-6-crashed",
                &["--level", "raid6", "--raid-devices", "6", "--chunk", "32K"],
                6,
                32 * K,
                4,
            )
        },
        Case {
            crash: true,
            ..case(
                "raid5-5-crashed",
                &["--level", "raid5", "--raid-devices", "5", "--chunk", "64K"],
                5,
                64 * K,
                4,
            )
        },
    ]
}

#[test]
fn kernel_reads_what_clients_wrote_through_uraid() {
    let dir = scratch("serve-to-kernel");
    let mut script = String::from("set +e\n");
    let mut expect = Vec::new();
    for (i, c) in uraid_cases().into_iter().enumerate() {
        let name = c.name;
        let shm = tempfile::Builder::new()
            .prefix("uraid-serve-to-kernel-")
            .tempdir_in("/dev/shm")
            .expect("tempdir in /dev/shm");
        let members_dir = if c.in_memory { shm.path() } else { dir.path() };
        let members = sparse_files(members_dir, &format!("{name}-m"), &c.sizes);
        let mut args = vec!["create"];
        args.extend_from_slice(&c.options);
        args.extend(paths(&members));
        uraid_ok(&args);
        let all = paths(&members);
        let present: Vec<&str> = all
            .iter()
            .enumerate()
            .filter(|(r, _)| !c.lost.contains(r))
            .map(|(_, m)| *m)
            .collect();
        let size = array_bytes(&all) as usize;
        let img = dir.path().join(format!("{name}.img"));
        std::fs::write(&img, random_bytes(2000 + i as u64, size)).unwrap();
        let model_path = dir.path().join(format!("{name}.model"));

        let served = serve(dir.path(), &[], &present);
        nbdcopy_in(&img, served.uri());
        let mut model = nbd_patch(
            served.uri(),
            &img,
            &model_path,
            3000 + i as u64,
            c.chunk,
            c.width,
            40,
        );
        if c.crash {
            crash_while_hammering(served, 4000 + i as u64, c.width);
            assert_eq!(
                examine_states(&all),
                vec!["active"; all.len()],
                "{name}: after SIGKILL"
            );
            tear_a_stripe(&members[1]);
            let served = serve(dir.path(), &[], &present);
            wait_until_in_sync(&served, std::time::Duration::from_secs(120));
            served.stop();
            // The second half was being written when the server died: its
            // contents are whatever uraid reads now. The first half was
            // flushed before, and must be as written.
            let now = copy_out(&all, dir.path());
            assert_same_bytes(
                &now[..size / 2],
                &model[..size / 2],
                &format!("{name}: first half after the crash"),
            );
            model = now;
            std::fs::write(&model_path, &model).unwrap();
        } else {
            served.stop();
        }
        assert_eq!(
            examine_states(&present),
            vec!["clean"; present.len()],
            "{name}: after SIGTERM"
        );
        assert_same_bytes(
            &copy_out(&present, dir.path()),
            &model,
            &format!("{name}: copy-out"),
        );

        let members: Vec<PathBuf> = if c.in_memory {
            members
                .iter()
                .map(|m| {
                    let copy = dir.path().join(m.file_name().unwrap());
                    std::fs::copy(m, &copy).unwrap();
                    copy
                })
                .collect()
        } else {
            members
        };
        // Every member is given to mdadm, the stale (left-out) ones too.
        // The left-out members were never given to uraid again: they are
        // stale, and the kernel must leave them out.
        let degraded = c.redundant.then(|| vec![c.lost.len()]);
        let _ = writeln!(script, "echo '== {name}'");
        script.push_str(&kernel_verify_lines(
            name,
            &members,
            &model_path,
            !c.lost.is_empty(),
            c.redundant,
        ));
        expect.push(Expect {
            name: name.to_string(),
            check: c.redundant && c.lost.is_empty(),
            degraded,
        });
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 600);
    judge(&stdout, &expect);
}

// ---------------------------------------------------------------------------
// (b) mdadm creates and writes, uraid serves, the kernel checks again.

struct KernelCase {
    name: &'static str,
    mdadm: &'static str,
    disks: usize,
    /// Roles created as `missing`.
    missing: Vec<usize>,
    /// Roles failed and removed after the first write; more is written after.
    fail: Vec<usize>,
    /// A role the kernel starts to replace (mdadm --replace) after the
    /// first write and leaves half-copied (mdadm --stop): uraid must take
    /// the copy for a replacement and finish it.
    replace: Option<usize>,
    chunk: u64,
    width: u64,
    redundant: bool,
}

fn kernel_cases() -> Vec<KernelCase> {
    const K: u64 = 1024;
    let c = |name, mdadm, disks, chunk, width, redundant| KernelCase {
        name,
        mdadm,
        disks,
        missing: vec![],
        fail: vec![],
        replace: None,
        chunk,
        width,
        redundant,
    };
    vec![
        c(
            "linear-2",
            "--level=linear --raid-devices=2",
            2,
            64 * K,
            128 * K,
            false,
        ),
        c(
            "raid0-3-c32",
            "--level=raid0 --raid-devices=3 --chunk=32",
            3,
            32 * K,
            96 * K,
            false,
        ),
        c(
            "raid1-2-e090",
            "--metadata=0.90 --level=raid1 --raid-devices=2",
            2,
            64 * K,
            64 * K,
            true,
        ),
        c(
            "raid4-3-c16",
            "--level=raid4 --raid-devices=3 --chunk=16",
            3,
            16 * K,
            32 * K,
            true,
        ),
        c(
            "raid5-4-e10",
            "--metadata=1.0 --level=raid5 --raid-devices=4 --chunk=64",
            4,
            64 * K,
            192 * K,
            true,
        ),
        c(
            "raid6-5-e11-c32",
            "--metadata=1.1 --level=raid6 --raid-devices=5 --chunk=32",
            5,
            32 * K,
            96 * K,
            true,
        ),
        c(
            "raid10-n2-4",
            "--level=raid10 --raid-devices=4 --layout=n2 --chunk=64",
            4,
            64 * K,
            128 * K,
            true,
        ),
        c(
            "raid10-f2-3",
            "--level=raid10 --raid-devices=3 --layout=f2 --chunk=32",
            3,
            32 * K,
            96 * K,
            true,
        ),
        KernelCase {
            fail: vec![2],
            ..c(
                "raid5-4-failed",
                "--level=raid5 --raid-devices=4 --chunk=32",
                4,
                32 * K,
                96 * K,
                true,
            )
        },
        KernelCase {
            fail: vec![1, 4],
            ..c(
                "raid6-6-failed2",
                "--level=raid6 --raid-devices=6 --chunk=16",
                6,
                16 * K,
                64 * K,
                true,
            )
        },
        KernelCase {
            replace: Some(2),
            ..c(
                "raid6-5-mid-replace",
                "--level=raid6 --raid-devices=5 --chunk=32",
                5,
                32 * K,
                96 * K,
                true,
            )
        },
        KernelCase {
            missing: vec![1],
            ..c(
                "raid5-3-missing",
                "--level=raid5 --raid-devices=3 --chunk=64",
                3,
                64 * K,
                128 * K,
                true,
            )
        },
        KernelCase {
            missing: vec![0, 3],
            ..c(
                "raid6-5-missing2",
                "--level=raid6 --raid-devices=5 --chunk=16",
                5,
                16 * K,
                48 * K,
                true,
            )
        },
    ]
}

/// Writes the kernel makes after failing members: (sector offset, sectors),
/// as fractions of the array so they fit every size; odd on purpose.
fn patches(size: u64) -> Vec<(u64, u64)> {
    let sectors = size / 512;
    vec![
        (sectors / 3 + 7, 333),
        (sectors * 2 / 3 + 1, 1000),
        (sectors - 129, 129),
    ]
}

#[test]
fn uraid_serves_what_the_kernel_wrote_and_the_kernel_reads_it_back() {
    let dir = scratch("serve-from-kernel");
    let cases = kernel_cases();
    let member_bytes = 16 * MIB;
    // Boot 1: mdadm creates and writes.
    let mut script = String::from("set +e\n");
    let mut files: Vec<Vec<Option<PathBuf>>> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let name = c.name;
        let roles: Vec<Option<PathBuf>> = (0..c.disks)
            .map(|r| {
                (!c.missing.contains(&r)).then(|| {
                    let p = dir.path().join(format!("{name}-m{r}"));
                    std::fs::File::create(&p)
                        .unwrap()
                        .set_len(member_bytes)
                        .unwrap();
                    p
                })
            })
            .collect();
        let upper = member_bytes * c.disks as u64;
        std::fs::write(
            dir.path().join(format!("{name}.img")),
            random_bytes(6000 + i as u64, upper as usize),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(format!("{name}.patch")),
            random_bytes(7000 + i as u64, 1 << 20),
        )
        .unwrap();
        let _ = writeln!(script, "echo '== {name}'\nD=()");
        for r in &roles {
            match r {
                Some(p) => {
                    let _ = writeln!(script, "D+=(\"$(losetup -f --show {})\")", p.display());
                }
                None => script.push_str("D+=(missing)\n"),
            }
        }
        let _ = writeln!(
            script,
            "if mdadm --create /dev/md0 --run {} \"${{D[@]}}\" >/tmp/create.out 2>&1; then",
            c.mdadm
        );
        script.push_str(
            "  mdadm --wait /dev/md0 >/dev/null 2>&1\n  S=$(blockdev --getsize64 /dev/md0)\n",
        );
        let _ = writeln!(
            script,
            "  head -c \"$S\" {}/{name}.img > /dev/md0 && sync",
            dir.path().display()
        );
        script.push_str("  mdadm --wait /dev/md0 >/dev/null 2>&1\n");
        if !c.fail.is_empty() {
            for r in &c.fail {
                let _ = writeln!(script, "  mdadm /dev/md0 --fail \"${{D[{r}]}}\" >/dev/null 2>&1 && mdadm /dev/md0 --remove \"${{D[{r}]}}\" >/dev/null 2>&1 || echo \"FAILREMOVE {name} failed\"");
            }
            // Written only to the remaining members: the failed ones go stale.
            script.push_str("  P=0\n");
            // The same offsets as `patches`, in shell arithmetic.
            script.push_str("  s=$((S / 512))\n  for p in $((s / 3 + 7)):333 $((s * 2 / 3 + 1)):1000 $((s - 129)):129; do\n");
            let _ = writeln!(
                script,
                "    dd if={}/{name}.patch of=/dev/md0 bs=512 skip=$P seek=${{p%:*}} count=${{p#*:}} conv=notrunc oflag=direct status=none || echo \"PATCH {name} failed\"",
                dir.path().display()
            );
            script.push_str("    P=$((P + ${p#*:}))\n  done\n  sync\n");
        }
        if let Some(r) = c.replace {
            // Slow enough to stop part way: 16 MiB at 1000 KiB/s.
            let new = dir.path().join(format!("{name}-new"));
            std::fs::File::create(&new)
                .unwrap()
                .set_len(member_bytes)
                .unwrap();
            let _ = writeln!(script, "  NEW=$(losetup -f --show {})", new.display());
            script.push_str("  echo 100 > /proc/sys/dev/raid/speed_limit_min\n");
            script.push_str("  echo 1000 > /proc/sys/dev/raid/speed_limit_max\n");
            let _ = writeln!(
                script,
                "  mdadm /dev/md0 --add \"$NEW\" >/dev/null 2>&1 && mdadm /dev/md0 --replace \"${{D[{r}]}}\" --with \"$NEW\" >/dev/null 2>&1 || echo \"REPLACEFAIL {name}\""
            );
            script.push_str("  C=none; for i in $(seq 400); do C=$(cat /sys/block/md0/md/sync_completed); case \"$C\" in [0-9]*) [ \"${C%% *}\" -gt 4096 ] && break;; esac; sleep 0.05; done\n");
            let _ = writeln!(script, "  echo \"MIDREPLACE {name} $C\"");
            script.push_str("  mdadm --stop /dev/md0 >/dev/null 2>&1\n");
            script.push_str("  echo 2000000 > /proc/sys/dev/raid/speed_limit_max\n");
            script.push_str("  echo 1000000 > /proc/sys/dev/raid/speed_limit_min\n");
            script.push_str("  losetup -d \"$NEW\"\n");
        }
        let _ = writeln!(
            script,
            "  echo \"WROTE {name} $S\"\n  mdadm --stop /dev/md0 >/dev/null 2>&1"
        );
        let _ = writeln!(
            script,
            "else echo \"WROTE {name} create-failed $(tr '\\n' ' ' </tmp/create.out)\"; fi"
        );
        script
            .push_str("for l in \"${D[@]}\"; do [ \"$l\" = missing ] || losetup -d \"$l\"; done\n");
        files.push(roles);
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 600);
    assert!(
        !stdout.contains("FAILREMOVE")
            && !stdout.contains("PATCH ")
            && !stdout.contains("REPLACEFAIL"),
        "mdadm --fail/--remove, a patch or --replace failed:\n{stdout}"
    );
    let wrote = results(&stdout, "WROTE");

    // uraid serves each array, reads what the kernel wrote, clients write more.
    let mut script = String::from("set +e\n");
    let mut expect = Vec::new();
    let mut failures = Vec::new();
    for (i, (c, roles)) in cases.iter().zip(&files).enumerate() {
        let name = c.name;
        let Some(size) = wrote.get(name).and_then(|v| v.parse::<usize>().ok()) else {
            failures.push(format!(
                "{name}: the kernel did not write: {:?}",
                wrote.get(name)
            ));
            continue;
        };
        let mut expected = std::fs::read(dir.path().join(format!("{name}.img"))).unwrap();
        expected.truncate(size);
        if !c.fail.is_empty() {
            let patch = std::fs::read(dir.path().join(format!("{name}.patch"))).unwrap();
            let mut p = 0usize;
            for (at, n) in patches(size as u64) {
                let (at, n) = (at as usize * 512, n as usize * 512);
                expected[at..at + n].copy_from_slice(&patch[p..p + n]);
                p += n;
            }
        }
        let mut existing: Vec<PathBuf> = roles.iter().flatten().cloned().collect();
        let replacement = c.replace.map(|r| {
            let new = dir.path().join(format!("{name}-new"));
            // The kernel stopped part way: md's replacement flag and
            // Recovery Offset are on the copy, and uraid shows it as a
            // spare being rebuilt into the role its original still holds.
            let examine =
                String::from_utf8_lossy(&uraid_ok(&["examine", new.to_str().unwrap()]).stdout)
                    .to_string();
            assert!(
                examine.contains(&format!("Device Role : Replacement device {r}")),
                "{name}: uraid examine of the kernel's replacement:\n{examine}"
            );
            existing.push(new.clone());
            let detail = detail_offline(&paths(&existing));
            let row = detail_row(&detail, new.to_str().unwrap())
                .unwrap_or_else(|| panic!("{name}: {detail}"));
            assert_eq!(row["state"], "spare rebuilding", "{name}: {detail}");
            assert_eq!(
                detail["active_devices"].as_u64(),
                Some(c.disks as u64),
                "{detail}"
            );
            (r, new)
        });
        let all = paths(&existing);
        // The members whose superblocks uraid keeps up to date: not the
        // failed ones, nor the one its replacement takes over from.
        let mut fresh: Vec<&str> = roles
            .iter()
            .enumerate()
            .filter(|(r, p)| p.is_some() && !c.fail.contains(r) && c.replace != Some(*r))
            .map(|(_, p)| p.as_ref().unwrap().to_str().unwrap())
            .collect();
        if let Some((_, new)) = &replacement {
            fresh.push(new.to_str().unwrap());
        }
        let gone = c.missing.len() + c.fail.len();

        if !c.fail.is_empty() {
            // First without the failed (stale) members.
            let served = serve(dir.path(), &[], &fresh);
            assert_same_bytes(
                &nbdcopy_out(served.uri(), dir.path()),
                &expected,
                &format!("{name}: nbdcopy out without the stale members"),
            );
            served.stop();
        }

        // Every file given, stale ones too: uraid must not read them as
        // current; it may rebuild onto them (as onto spares) while serving,
        // and then the kernel checks the rebuilt array below.
        let served = serve(dir.path(), &[], &all);
        if let Some((_, new)) = &replacement {
            // The copy goes on from where the kernel left it, not from 0.
            let status = array_status(&served.control);
            assert!(
                status_events(&status)
                    .iter()
                    .any(|(e, d, detail)| e == "RebuildStarted"
                        && d == new.to_str().unwrap()
                        && detail.starts_with("resuming the replacement")
                        && !detail.ends_with(" at stripe 0")),
                "{name}: the kernel's copy did not resume: {status}"
            );
        }
        let detail = served.detail_json();
        let active = detail["active_devices"].as_u64().unwrap() as usize;
        assert!(
            active == c.disks - gone || (!c.fail.is_empty() && active <= c.disks - c.missing.len()),
            "{name}: {active} active devices: {detail}"
        );
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir.path()),
            &expected,
            &format!("{name}: nbdcopy out of what the kernel wrote"),
        );
        let img = dir.path().join(format!("{name}.kimg"));
        std::fs::write(&img, &expected).unwrap();
        let model_path = dir.path().join(format!("{name}.model"));
        // Written while any rebuild runs.
        nbd_patch(
            served.uri(),
            &img,
            &model_path,
            8000 + i as u64,
            c.chunk,
            c.width,
            30,
        );
        // A rebuild onto the stale members, if any, finishes before the stop,
        // so that the kernel sees a settled array.
        wait_until_in_sync(&served, std::time::Duration::from_secs(120));
        let detail = served.detail_json();
        if let Some((r, new)) = &replacement {
            // The copy finished: it holds the role, its original is faulty.
            let row = detail_row(&detail, new.to_str().unwrap())
                .unwrap_or_else(|| panic!("{name}: {detail}"));
            assert_eq!(row["state"], "active sync", "{name}: {detail}");
            assert_eq!(
                row["raid_device"].as_u64(),
                Some(*r as u64),
                "{name}: {detail}"
            );
            let old = roles[*r].as_ref().unwrap().to_str().unwrap();
            let row = detail_row(&detail, old).unwrap_or_else(|| panic!("{name}: {detail}"));
            assert_eq!(row["state"], "faulty", "{name}: {detail}");
        }
        let detail = served.detail_json();
        assert_eq!(
            detail["state"].as_str().unwrap().contains("degraded"),
            detail["active_devices"].as_u64() != Some(c.disks as u64),
            "{name}: {detail}"
        );
        served.stop();
        assert_eq!(
            examine_states(&fresh),
            vec!["clean"; fresh.len()],
            "{name}: after SIGTERM"
        );

        // The failed members were given to uraid with the others: uraid may
        // leave them alone (as mdadm --assemble does: the kernel then leaves
        // them out too) or rebuild onto them (then nothing is missing, and
        // `check` verifies the rebuilt members' parity). Either is consistent.
        let mut degraded = vec![gone];
        if !c.fail.is_empty() {
            degraded.push(c.missing.len());
        }
        let _ = writeln!(script, "echo '== {name}'");
        script.push_str(&kernel_verify_lines(
            name,
            &existing,
            &model_path,
            gone > 0,
            c.redundant,
        ));
        expect.push(Expect {
            name: name.to_string(),
            check: c.redundant && gone == 0,
            degraded: c.redundant.then_some(degraded),
        });
    }
    assert!(
        failures.is_empty(),
        "{}\n--- kernel output\n{stdout}",
        failures.join("\n")
    );

    // Boot 2: the kernel reads what uraid's clients wrote.
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 600);
    judge(&stdout, &expect);
}
