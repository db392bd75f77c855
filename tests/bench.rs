//! `uraid bench`: structure of the report on a tiny array (never speed),
//! the NBD client against nbdkit, and the refusals.

mod common;

use common::{uraid, uraid_refused};
use std::path::Path;
use std::process::Command;
use uraid::bench::targets::Nbdkit;
use uraid::export::nbd::client::NbdSync;

/// `uraid bench` on tiny members in `dir` (64 KiB chunks, no warm-up,
/// the benchmark's own client): these tests check what is reported, never
/// how fast.
fn bench_tiny(dir: &Path, level: &str, devices: &str, size: &str, seconds: &str) -> Command {
    bench_tiny_by("uraid", dir, level, devices, size, seconds)
}

/// `bench_tiny` with the given client.
fn bench_tiny_by(
    client: &str,
    dir: &Path,
    level: &str,
    devices: &str,
    size: &str,
    seconds: &str,
) -> Command {
    let mut command = uraid();
    command
        .args(["bench", "--client", client, "--dir"])
        .arg(dir)
        .args([
            "--level",
            level,
            "--devices",
            devices,
            "--size",
            size,
            "--chunk",
            "64K",
            "--seconds",
            seconds,
            "--warmup",
            "0",
        ]);
    command
}

/// Runs `command`, which must succeed.
fn succeeded(command: &mut Command) -> std::process::Output {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    out
}

const WORKLOADS: [&str; 7] = [
    "fio-randwrite",
    "iozone-seq",
    "dd-seq",
    "randread-qd",
    "seq-1m",
    "seq-stripe",
    "randread",
];

#[test]
fn every_workload_state_and_target_is_reported() {
    let dir = common::scratch("bench-all");
    let json = dir.path().join("report.json");
    let chart = dir.path().join("chart.svg");
    let out = bench_tiny(dir.path(), "raid6", "4", "8M", "0.03")
        .args([
            "--state",
            "healthy,degraded,rebuilding",
            "--verify",
            "--json",
        ])
        .arg(&json)
        .arg("--chart")
        .arg(&chart)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("performance targets:"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let mut targets = vec![
        ("uraid", "healthy"),
        ("uraid", "degraded"),
        ("uraid", "rebuilding"),
        ("raw", "-"),
    ];
    if Nbdkit::installed() {
        targets.push(("nbdkit", "-"));
    } else {
        eprintln!("nbdkit is not installed: its rows are not checked");
    }
    for (target, state) in &targets {
        for workload in WORKLOADS {
            let found: Vec<&serde_json::Value> = rows
                .iter()
                .filter(|r| {
                    r["target"] == *target && r["state"] == *state && r["workload"] == workload
                })
                .collect();
            assert!(!found.is_empty(), "no row for {target} {state} {workload}");
            for r in found {
                for key in ["iops", "mb_per_s", "latency_us_p50", "latency_us_p999"] {
                    assert!(r[key].as_f64().unwrap() > 0.0, "{key} of {r}");
                }
                assert!(r["ops"].as_u64().unwrap() > 0);
                assert!(r["latency_us_p50"].as_f64() <= r["latency_us_p999"].as_f64());
                if *target == "uraid" {
                    assert!(
                        r["ratio_uraid_raw"].as_f64().is_some_and(|v| v > 0.0),
                        "{r}"
                    );
                }
            }
        }
    }
    // randread-qd goes 1..128, and the rebuilding rows ran during a rebuild.
    let qd: Vec<u64> = rows
        .iter()
        .filter(|r| r["target"] == "raw" && r["workload"] == "randread-qd")
        .map(|r| r["queue_depth"].as_u64().unwrap())
        .collect();
    assert_eq!(qd, [1, 2, 4, 8, 16, 32, 64, 128]);
    // Every rebuilding phase starts during a rebuild (one is started again
    // before a phase if the last finished), and one that outlived its
    // rebuild is named in the notes.
    let notes = report["notes"].as_array().unwrap();
    for r in rows.iter().filter(|r| r["state"] == "rebuilding") {
        // A rebuild of these tiny members can end between its start and
        // the phase's (a loaded machine): the row is then named in the
        // notes too, rather than pass for a rebuilding one.
        let background = r["background"].as_str().unwrap_or("none");
        assert!(
            background.starts_with("recovery") || background == "none",
            "{r}"
        );
        if background.ends_with("finished") || background == "none" {
            let named = notes.iter().any(|n| {
                let n = n.as_str().unwrap();
                n.contains("rebuild did not run for the whole phase")
                    && n.contains(r["phase"].as_str().unwrap())
            });
            assert!(named, "{r}\n{notes:?}");
        }
    }
    // The read-modify-write mix is measured on the raw members only, as
    // the reference beside the random-write target.
    let mix: Vec<&str> = rows
        .iter()
        .filter(|r| r["phase"] == "rmw-mix")
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    assert_eq!(mix, ["raw"]);
    // uraid's random writes run again with md's largest stripe cache, in
    // every state, and the knob is set back after.
    for state in ["healthy", "degraded", "rebuilding"] {
        let settings: Vec<Option<&str>> = rows
            .iter()
            .filter(|r| r["target"] == "uraid" && r["state"] == state && r["phase"] == "randwrite")
            .map(|r| r["setting"].as_str())
            .collect();
        assert_eq!(settings, [None, Some("stripe_cache_size=32768")], "{state}");
    }
    let parity_impl = report["array"]["parity_impl"].as_str().unwrap();
    assert!(
        uraid::parity::implementations()
            .iter()
            .any(|i| i.name() == parity_impl),
        "{parity_impl}"
    );
    let in_force = report["array"]["tunables"].as_array().unwrap();
    assert!(
        in_force.contains(&serde_json::json!(["stripe_cache_size", "256"])),
        "{in_force:?}"
    );
    // Members on a disk: its speed is probed before and after each of the
    // targets compared, and the report says whether it held.
    let probes = report["disk_probes"].as_array().unwrap();
    if report["array"]["members_on"] == "disk" {
        let when = |op: &str| -> Vec<&str> {
            probes
                .iter()
                .filter(|p| p["op"] == op)
                .map(|p| p["when"].as_str().unwrap())
                .collect()
        };
        assert_eq!(when("read"), ["before uraid", "after uraid", "after raw"]);
        // Writes only where the members' bytes are no longer wanted.
        assert_eq!(when("write"), ["after uraid", "after raw"]);
        assert!(probes.iter().all(|p| p["iops"].as_f64().unwrap() > 0.0));
        assert!(stdout.contains("note: disk probe"), "{stdout}");
    } else {
        assert!(probes.is_empty(), "no probe in memory: {probes:?}");
    }
    // How busy the members' disk was: for uraid and raw on a disk that
    // /proc/diskstats counts, never for nbdkit's memory nor in memory.
    let on_disk = report["array"]["members_on"] == "disk";
    for r in rows {
        let busy = r["disk_busy"].as_f64();
        if r["target"] == "nbdkit" || !on_disk {
            assert!(busy.is_none(), "{r}");
        } else if let Some(busy) = busy {
            assert!((0.0..=1.0).contains(&busy), "{r}");
        }
    }
    // (A folder on overlayfs or the like is "disk" too, but no device of
    // /proc/diskstats holds it.)
    if on_disk && !uraid::bench::diskbusy::devices_of(&[dir.path()]).is_empty() {
        assert!(
            rows.iter()
                .any(|r| r["target"] == "raw" && r["disk_busy"].as_f64().is_some()),
            "no busy share on a disk"
        );
    }
    assert_eq!(report["array"]["level"], "raid6");
    assert_eq!(report["array"]["stripe_data_bytes"], 2 * 64 * 1024);
    assert!(report["goals"].as_array().is_some());
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{svg:.200}"
    );
    assert!(svg.contains("queue depth") && svg.contains("MB/s"));
    // The member files were in a fresh folder that is gone now.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "only the report and chart stay: {left:?}");
}

#[test]
fn json_to_stdout_keeps_it_parseable() {
    let dir = common::scratch("bench-stdout");
    let out = succeeded(bench_tiny(dir.path(), "raid5", "3", "4M", "0.02").args([
        "--workload",
        "randread",
        "--targets",
        "uraid,raw",
        "--json",
        "-",
    ]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("randread"));
}

/// A sweep's chart: the curve per phase with the raw members' figure
/// beside it, and no empty panel for workloads the run did not have.
#[test]
fn a_sweep_charts_its_curve_against_the_raw_members() {
    let dir = common::scratch("bench-sweep");
    let chart = dir.path().join("sweep.svg");
    let sweep = "--workload seq-1m --targets uraid,raw --sweep stripe_cache_size=256,1024";
    succeeded(
        bench_tiny(dir.path(), "raid6", "4", "8M", "0.02")
            .args(sweep.split(' '))
            .arg("--chart")
            .arg(&chart),
    );
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("MB/s vs stripe_cache_size (uraid; dashed: the raw members)"));
    assert!(svg.contains("healthy seq-1m write") && svg.contains("healthy seq-1m read"));
    assert!(!svg.contains("queue depth"), "an empty queue-depth panel");
}

/// The clients of record: fio's and nbdcopy's own figures make the rows
/// of the NBD targets; the raw files stay with the benchmark's client.
#[test]
fn fio_and_nbdcopy_measure_the_nbd_targets() {
    let installed = |p: &str| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !installed("fio") || !installed("nbdcopy") {
        eprintln!("fio or nbdcopy is not installed: skipping the clients of record");
        return;
    }
    let dir = common::scratch("bench-fio");
    let rows_of = |client: &str| {
        let mut command = bench_tiny_by(client, dir.path(), "raid0", "2", "4M", "0.2");
        command.args([
            "--workload",
            "seq-1m",
            "--targets",
            "uraid,raw",
            "--json",
            "-",
        ]);
        let out = succeeded(&mut command);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["rows"].as_array().unwrap().clone()
    };
    let rows = rows_of("fio");
    let by = |rows: &[serde_json::Value], target: &str, phase: &str| {
        rows.iter()
            .find(|r| r["target"] == target && r["phase"] == phase)
            .unwrap_or_else(|| panic!("no {target} {phase} row in {rows:?}"))
            .clone()
    };
    for phase in ["write", "read"] {
        let row = by(&rows, "uraid", phase);
        assert_eq!(row["client"], "fio", "{row}");
        assert!(row["ops"].as_u64().unwrap() > 0, "{row}");
        assert!(row["latency_us_p99"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(by(&rows, "raw", phase)["client"], "uraid");
    }
    let rows = rows_of("nbdcopy");
    let read = by(&rows, "uraid", "read");
    assert_eq!(read["client"], "nbdcopy", "{read}");
    // nbdcopy reads the whole array once: 2 members of 4 MiB less md's
    // metadata and data offset (1 MiB each).
    assert_eq!(read["bytes"].as_u64().unwrap(), 6 << 20, "{read}");
    assert_eq!(by(&rows, "uraid", "write")["client"], "fio");
}

#[test]
fn refusals_are_one_line_and_touch_nothing() {
    let dir = common::scratch("bench-refuse");
    let member = dir.path().join("precious");
    std::fs::write(&member, vec![0x5a; 1 << 20]).unwrap();
    let m = member.to_str().unwrap();
    let err = uraid_refused(&["bench", "--members", m, m, m, m]);
    assert!(err.contains("--destroy-data"), "{err}");
    assert_eq!(std::fs::read(&member).unwrap(), vec![0x5a; 1 << 20]);
    let d = dir.path().to_str().unwrap();
    uraid_refused(&["bench", "--dir", d, "--workload", "nope"]);
    uraid_refused(&["bench", "--dir", d, "--state", "on-fire"]);
    uraid_refused(&["bench", "--dir", d, "--set", "stripe_cache_size"]);
    uraid_refused(&["bench", "--dir", "/nonexistent-folder"]);
    let err = uraid_refused(&["bench", "--dir", d, "--client", "dd"]);
    assert!(err.contains("known: fio, nbdcopy, uraid"), "{err}");
    // Where fio is missing the refusal says so instead.
    let err = uraid_refused(&["bench", "--dir", d, "--client", "fio", "--verify"]);
    assert!(err.contains("--client"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn nbd_client_against_nbdkit_memory() {
    if !Nbdkit::installed() {
        eprintln!("nbdkit is not installed: skipping the NBD client test against it");
        return;
    }
    let dir = common::scratch("bench-nbdkit");
    // The default sparse allocator: the client must not depend on the
    // malloc one the benchmark uses.
    let nbdkit = Nbdkit::start(&dir.path().join("nbdkit.sock"), 4 << 20, "sparse").unwrap();
    client_round_trip(&nbdkit.socket);
}

fn client_round_trip(socket: &Path) {
    let mut conn = NbdSync::connect(socket, "").unwrap();
    assert_eq!(conn.info.size_bytes, 4 << 20);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    conn.write_at(65536, &data).unwrap();
    conn.flush().unwrap();
    // A second connection sees what the first wrote.
    let mut other = NbdSync::connect(socket, "").unwrap();
    let mut back = vec![0u8; 8192];
    other.read_at(65536, &mut back).unwrap();
    assert_eq!(back, data);
    // Out of range is an NBD error, reported, and the connection goes on.
    let mut beyond = vec![0u8; 4096];
    assert!(other.read_at(4 << 20, &mut beyond).is_err());
    other.read_at(0, &mut beyond).unwrap();
    assert!(beyond.iter().all(|&b| b == 0));
    conn.disconnect().unwrap();
    other.disconnect().unwrap();
}

#[test]
fn existing_members_are_used_with_destroy_data() {
    let dir = common::scratch("bench-members");
    let paths: Vec<String> = (0..3)
        .map(|i| {
            let p = dir.path().join(format!("dev{i}"));
            std::fs::write(&p, vec![0xa5; 4 << 20]).unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();
    let mut args = vec![
        "bench",
        "--level",
        "raid5",
        "--chunk",
        "64K",
        "--seconds",
        "0.02",
    ];
    args.extend([
        "--warmup",
        "0",
        "--workload",
        "randread",
        "--targets",
        "uraid,raw",
    ]);
    args.extend(["--verify", "--json", "-", "--destroy-data", "--members"]);
    args.extend(paths.iter().map(String::as_str));
    let out = uraid().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["array"]["devices"], 3);
    assert_eq!(report["rows"].as_array().unwrap().len(), 2);
    // The devices were overwritten, as asked, and are still there.
    for p in &paths {
        assert_ne!(std::fs::read(p).unwrap(), vec![0xa5; 4 << 20]);
    }
}
