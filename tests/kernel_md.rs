//! uraid against the Linux kernel's md, in both directions, for every level
//! and layout, at several member counts (odd ones too), chunk sizes and
//! superblock versions:
//!
//! (a) uraid creates an array and copies random data in; the kernel (in
//!     user-mode Linux) assembles it, reads the same bytes, `check` reports
//!     mismatch_cnt 0, and mdadm --examine agrees with uraid examine;
//! (b) mdadm creates an array and writes random data through /dev/md0;
//!     uraid copy-out gives the same bytes, healthy and with one member
//!     missing (two for raid6).

mod common;
use common::*;
use std::fmt::Write;
use std::path::PathBuf;

const MEMBER_BYTES: u64 = 12 << 20;

#[derive(Clone, Debug)]
struct Case {
    level: &'static str,
    layout: Option<&'static str>,
    disks: usize,
    chunk: Option<&'static str>,
    metadata: &'static str,
    /// Member sizes differ (raid0 zones, linear).
    unequal: bool,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{}-{}-n{}-c{}-e{}{}",
            self.level,
            self.layout.unwrap_or("default"),
            self.disks,
            self.chunk.unwrap_or("default"),
            self.metadata,
            if self.unequal { "-unequal" } else { "" }
        )
    }

    fn sizes(&self) -> Vec<u64> {
        (0..self.disks as u64)
            .map(|i| {
                if self.unequal {
                    MEMBER_BYTES + i * (3 << 20)
                } else {
                    MEMBER_BYTES
                }
            })
            .collect()
    }

    /// Members that may be lost while every sector stays readable.
    fn losable(&self) -> usize {
        match self.level {
            "raid6" => 2,
            "raid1" | "raid4" | "raid5" | "raid10" => 1,
            _ => 0,
        }
    }

    /// mdadm's options for this case.
    fn mdadm_options(&self) -> String {
        let mut o = format!(
            "--metadata={} --level={} --raid-devices={}",
            self.metadata, self.level, self.disks
        );
        if let Some(layout) = self.layout {
            let _ = write!(o, " --layout={layout}");
        }
        if let Some(chunk) = self.chunk {
            let _ = write!(o, " --chunk={chunk}");
        }
        o
    }

    fn uraid_options(&self) -> Vec<String> {
        let mut o = vec![
            "--metadata".into(),
            self.metadata.into(),
            "--level".into(),
            self.level.into(),
        ];
        o.extend(["--raid-devices".into(), self.disks.to_string()]);
        if let Some(layout) = self.layout {
            o.extend(["--layout".into(), layout.into()]);
        }
        if let Some(chunk) = self.chunk {
            o.extend(["--chunk".into(), chunk.into()]);
        }
        o
    }
}

/// Every level and layout, cycling member counts, chunks and metadata so
/// that each dimension is covered without trying every product.
fn cases() -> Vec<Case> {
    let chunks = [Some("4K"), Some("64K"), None, Some("16K"), Some("128K")];
    let metadata = ["1.2", "1.1", "1.0"];
    let mut cases = Vec::new();
    let mut i = 0usize;
    let mut add = |level, layout, disks, unequal: bool, chunked: bool| {
        cases.push(Case {
            level,
            layout,
            disks,
            chunk: if chunked {
                chunks[i % chunks.len()]
            } else {
                None
            },
            metadata: metadata[i % metadata.len()],
            unequal,
        });
        i += 1;
    };
    add("linear", None, 2, true, false);
    add("linear", None, 3, true, false);
    add("raid0", None, 2, false, true);
    add("raid0", None, 5, false, true);
    add("raid0", Some("original"), 3, true, true);
    add("raid0", Some("alternate"), 4, true, true);
    add("raid1", None, 2, false, false);
    add("raid1", None, 3, false, false);
    add("raid4", None, 3, false, true);
    add("raid4", None, 4, false, true);
    for (k, layout) in [
        "left-asymmetric",
        "right-asymmetric",
        "left-symmetric",
        "right-symmetric",
        "parity-first",
        "parity-last",
    ]
    .into_iter()
    .enumerate()
    {
        add("raid5", Some(layout), [3, 4, 5, 6, 7, 2][k], false, true);
    }
    for (k, layout) in [
        "left-asymmetric",
        "right-asymmetric",
        "left-symmetric",
        "right-symmetric",
        "parity-first",
        "parity-last",
        "ddf-zero-restart",
        "ddf-N-restart",
        "ddf-N-continue",
        "left-asymmetric-6",
        "right-asymmetric-6",
        "left-symmetric-6",
        "right-symmetric-6",
        "parity-first-6",
    ]
    .into_iter()
    .enumerate()
    {
        add("raid6", Some(layout), [4, 5, 6, 7][k % 4], false, true);
    }
    for (layout, disks) in [
        ("n2", 2),
        ("n2", 3),
        ("n3", 4),
        ("f2", 4),
        ("f2", 5),
        ("f3", 3),
        ("o2", 3),
        ("o3", 5),
    ] {
        add("raid10", Some(layout), disks, false, true);
    }
    // 0.90 superblocks (at the end of the device, host-endian), a few levels.
    for (level, layout, disks, chunk) in [
        ("raid1", None, 2, None),
        ("linear", None, 3, None),
        ("raid5", Some("left-symmetric"), 4, Some("64K")),
        ("raid6", Some("right-asymmetric"), 5, None),
        ("raid10", Some("n2"), 4, Some("16K")),
    ] {
        cases.push(Case {
            level,
            layout,
            disks,
            chunk,
            metadata: "0.90",
            unequal: false,
        });
    }
    cases
}

/// A per-case folder with member files and an image.
struct Prepared {
    case: Case,
    members: Vec<PathBuf>,
    image: PathBuf,
}

/// Stops the array, saves mdadm --examine of its first member (through the
/// loop device: mdadm cannot open hostfs files directly) and detaches.
fn cleanup(examine_to: &std::path::Path) -> String {
    format!(
        "mdadm --stop /dev/md0 >/dev/null 2>&1 || true\nmdadm --examine \"${{L[0]}}\" > {}.kernel-examine 2>&1\nfor l in \"${{L[@]}}\"; do losetup -d \"$l\" || true; done\n",
        examine_to.display()
    )
}

#[test]
fn kernel_reads_what_uraid_wrote() {
    let dir = scratch("to-kernel");
    let mut prepared = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let name = case.name();
        let members = sparse_files(dir.path(), &format!("{name}-m"), &case.sizes());
        let mut args: Vec<String> = vec!["create".into()];
        args.extend(case.uraid_options());
        args.extend(members.iter().map(|m| m.display().to_string()));
        uraid_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let size = array_bytes(&paths(&members));
        let image = dir.path().join(format!("{name}.img"));
        std::fs::write(&image, random_bytes(1000 + i as u64, size as usize)).unwrap();
        let mut args = vec!["copy-in", "--input", image.to_str().unwrap()];
        args.extend(paths(&members));
        uraid_ok(&args);
        prepared.push(Prepared {
            case,
            members,
            image,
        });
    }

    let mut script = String::from("set +e\n");
    for p in &prepared {
        let name = p.case.name();
        let check = !matches!(p.case.level, "raid0" | "linear");
        script.push_str(&losetup_lines(&p.members));
        let _ = writeln!(
            script,
            "if mdadm --assemble /dev/md0 --run \"${{L[@]}}\" 2>/tmp/asm.err; then"
        );
        let _ = writeln!(script, "  S=$(blockdev --getsize64 /dev/md0)");
        let _ = writeln!(script, "  if cmp -n \"$S\" /dev/md0 {} >/dev/null; then echo \"CMP {name} ok $S\"; else echo \"CMP {name} differ $S\"; fi", p.image.display());
        if check {
            let _ = writeln!(script, "  echo check > /sys/block/md0/md/sync_action");
            let _ = writeln!(script, "  sleep 0.2; while [ \"$(cat /sys/block/md0/md/sync_action)\" != idle ]; do sleep 0.2; done");
            let _ = writeln!(
                script,
                "  echo \"MISMATCH {name} $(cat /sys/block/md0/md/mismatch_cnt)\""
            );
        }
        let _ = writeln!(
            script,
            "else echo \"CMP {name} assemble-failed $(tr '\\n' ' ' </tmp/asm.err)\"; fi"
        );
        // Examined after the kernel stopped the array, so that both see its final state.
        script.push_str(&cleanup(&p.image));
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 1200);
    let cmp = results(&stdout, "CMP");
    let mismatch = results(&stdout, "MISMATCH");
    let mut failures = Vec::new();
    for p in &prepared {
        let name = p.case.name();
        match cmp.get(&name) {
            Some(v) if v.starts_with("ok ") => {}
            other => failures.push(format!("{name}: kernel read {other:?}")),
        }
        if !matches!(p.case.level, "raid0" | "linear")
            && mismatch.get(&name).map(String::as_str) != Some("0")
        {
            failures.push(format!(
                "{name}: check mismatch_cnt {:?}",
                mismatch.get(&name)
            ));
        }
        let kernel_examine =
            std::fs::read_to_string(format!("{}.kernel-examine", p.image.display()))
                .unwrap_or_default();
        let ours = uraid_ok(&["examine", p.members[0].to_str().unwrap()]);
        let ours = String::from_utf8_lossy(&ours.stdout).to_string();
        if examine_comparable(&kernel_examine) != examine_comparable(&ours) {
            failures.push(format!(
                "{name}: examine differs\n--- mdadm\n{kernel_examine}\n--- uraid\n{ours}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        prepared.len(),
        failures.join("\n")
    );
}

#[test]
fn uraid_reads_what_the_kernel_wrote() {
    let dir = scratch("from-kernel");
    let mut prepared = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let name = case.name();
        let members = sparse_files(dir.path(), &format!("{name}-m"), &case.sizes());
        let upper: u64 = case.sizes().iter().sum();
        let image = dir.path().join(format!("{name}.img"));
        std::fs::write(&image, random_bytes(5000 + i as u64, upper as usize)).unwrap();
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
        let _ = writeln!(
            script,
            "if mdadm --create /dev/md0 --run {} \"${{L[@]}}\" >/tmp/create.out 2>&1; then",
            p.case.mdadm_options()
        );
        let _ = writeln!(script, "  mdadm --wait /dev/md0 >/dev/null 2>&1");
        let _ = writeln!(script, "  S=$(blockdev --getsize64 /dev/md0)");
        let _ = writeln!(
            script,
            "  head -c \"$S\" {} > /dev/md0 && sync && echo \"WROTE {name} $S\"",
            p.image.display()
        );
        let _ = writeln!(script, "  mdadm --wait /dev/md0 >/dev/null 2>&1");
        let _ = writeln!(
            script,
            "else echo \"WROTE {name} create-failed $(tr '\\n' ' ' </tmp/create.out)\"; fi"
        );
        script.push_str(&cleanup(&p.image));
    }
    script.push_str("echo done\n");
    let stdout = in_kernel(&script, 1200);
    let wrote = results(&stdout, "WROTE");
    let mut failures = Vec::new();
    for p in &prepared {
        let name = p.case.name();
        let Some(size) = wrote.get(&name).and_then(|v| v.parse::<usize>().ok()) else {
            failures.push(format!(
                "{name}: kernel did not write: {:?}",
                wrote.get(&name)
            ));
            continue;
        };
        let expected = &std::fs::read(&p.image).unwrap()[..size];
        let members = paths(&p.members);
        // Healthy, then without the first `losable` members.
        for lost in 0..=p.case.losable() {
            let out = p.image.with_extension(format!("out{lost}"));
            let mut args = vec!["copy-out", "--output", out.to_str().unwrap()];
            args.extend_from_slice(&members[lost..]);
            let run = uraid().args(&args).output().unwrap();
            if !run.status.success() {
                failures.push(format!(
                    "{name}: copy-out with {lost} lost failed: {}",
                    String::from_utf8_lossy(&run.stderr)
                ));
                continue;
            }
            let got = std::fs::read(&out).unwrap();
            if got.len() != size || got != expected {
                failures.push(format!(
                    "{name}: copy-out with {lost} lost differs ({} bytes, expected {size})",
                    got.len()
                ));
            }
            let _ = std::fs::remove_file(&out);
        }
        let kernel_examine =
            std::fs::read_to_string(format!("{}.kernel-examine", p.image.display()))
                .unwrap_or_default();
        let ours = uraid_ok(&["examine", members[0]]);
        let ours = String::from_utf8_lossy(&ours.stdout).to_string();
        if examine_comparable(&kernel_examine) != examine_comparable(&ours) {
            failures.push(format!(
                "{name}: examine differs\n--- mdadm\n{kernel_examine}\n--- uraid\n{ours}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\n--- kernel output\n{stdout}",
        failures.len(),
        prepared.len(),
        failures.join("\n")
    );
}
