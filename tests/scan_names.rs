//! One name per member, and ARRAY lines that serve their array again.
//!
//! Arrays are served with relative member paths (relative to the test's
//! working folder, with `..` in them), and every place that names a member
//! must say its canonical name: status, events, the registry and the
//! `devices=` of scan lines. Every line that `detail --scan` and `examine
//! --scan` print (with and without -v), written into a config, must serve
//! the array again through `serve --scan` by UUID and by name: raid1,
//! raid5 and raid6 with a spare, and a dRAID whose distributed spare took
//! over a failed member. And every served array is found by status, doctor
//! and monitor --scan wherever its control socket is.
//!
//! Every test of this file shares one runtime folder (URAID_RUNTIME_DIR,
//! set once for the process and inherited by every server), so each test
//! names its arrays apart and looks only at its own.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(60);

/// The runtime folder of this test process.
fn runtime_dir() -> &'static Path {
    process_runtime_dir()
}

/// `path` relative to this process's working folder, through the root:
/// `../../tmp/...`, a name no member has until it is made canonical.
fn relative(path: &Path) -> String {
    let cwd = std::env::current_dir().unwrap();
    let up = "../".repeat(cwd.components().count() - 1);
    format!("./{up}{}", path.strip_prefix("/").unwrap().display())
}

fn stdout_of(args: &[&str]) -> String {
    let out = run_limited_ok(uraid().args(args), Duration::from_secs(30));
    String::from_utf8(out.stdout).unwrap()
}

/// The registry entry of the array, as its server wrote it.
fn registry_members(uuid: &str) -> Vec<String> {
    let entry = runtime_dir().join("arrays").join(format!("{uuid}.json"));
    let text = std::fs::read_to_string(&entry)
        .unwrap_or_else(|e| panic!("registry entry {}: {e}", entry.display()));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut members: Vec<String> = value["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    members.sort();
    members
}

/// Waits until the registry lists exactly `wanted` (its server rewrites
/// the entry after an event, in its own time).
fn await_registry(uuid: &str, wanted: &[&PathBuf]) {
    let mut wanted: Vec<String> = wanted.iter().map(|p| p.display().to_string()).collect();
    wanted.sort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let members = registry_members(uuid);
        if members == wanted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the registry lists {members:?}, not {wanted:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every member path that status shows (device rows and events) is the
/// member's absolute name; a dRAID's distributed spare keeps its own.
fn assert_canonical_names(status: &serde_json::Value, members: &[PathBuf]) {
    let names: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    let known = |p: &str| names.iter().any(|n| n == p) || p.starts_with("draid");
    for row in status["detail"]["devices"].as_array().unwrap() {
        if let Some(path) = row["path"].as_str() {
            assert!(known(path), "device row {path:?} is not canonical: {row}");
        }
    }
    for (event, device, _) in status_events(status) {
        assert!(
            device.is_empty() || known(&device),
            "event {event} names {device:?}, not a canonical member name"
        );
    }
}

/// What `examine --scan` (and -v) prints for the members named
/// relatively: (what, text).
fn examine_texts(members: &[PathBuf]) -> Vec<(String, String)> {
    let rel: Vec<String> = members.iter().map(|m| relative(m)).collect();
    let rel: Vec<&str> = rel.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for flags in [&["--scan"][..], &["--scan", "-v"]] {
        let args = [&["examine"][..], flags, &rel].concat();
        out.push((format!("{args:?}"), stdout_of(&args)));
    }
    out
}

/// The `detail --scan` lines of the array with `uuid` (other tests' arrays
/// are served too), with and without -v.
fn detail_texts(uuid: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for verbose in [false, true] {
        let mut args = vec!["detail", "--scan"];
        if verbose {
            args.push("-v");
        }
        let text = stdout_of(&args);
        let mut ours = String::new();
        let mut keep = false;
        for line in text.lines() {
            if line.starts_with("ARRAY") {
                keep = line.ends_with(&format!("UUID={uuid}"));
            }
            if keep {
                ours.push_str(line);
                ours.push('\n');
            }
        }
        assert!(
            !ours.is_empty(),
            "detail --scan: no line for {uuid}: {text}"
        );
        out.push((format!("{args:?}"), ours));
    }
    out
}

/// A scan command's `--json`: a list of arrays, ours among them.
fn assert_json_lists(args: &[&str], uuid: &str, members: usize) {
    let text = stdout_of(args);
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"));
    let ours = value
        .as_array()
        .unwrap_or_else(|| panic!("{args:?}: not a list: {value}"))
        .iter()
        .find(|a| a["uuid"] == uuid)
        .unwrap_or_else(|| panic!("{args:?}: {uuid} not listed: {value}"));
    let devices = ours["devices"].as_array().unwrap();
    assert_eq!(devices.len(), members, "{args:?}: {ours}");
    assert!(
        devices.iter().all(|d| d.as_str().unwrap().starts_with('/')),
        "{args:?}: {ours}"
    );
}

/// Serves the array again from each text through `serve --scan`, by UUID
/// and by name; it must come up with every role held.
fn assert_serves_again(dir: &Path, name: &str, uuid: &str, texts: &[(String, String)]) {
    for (k, (what, text)) in texts.iter().enumerate() {
        for line in text.lines() {
            let Some(list) = line.trim_start().strip_prefix("devices=") else {
                continue;
            };
            assert!(
                list.split(',')
                    .all(|d| d.starts_with(&*dir.to_string_lossy())),
                "{what}: devices= names what no DEVICE glob finds: {line}"
            );
        }
        let config = dir.join(format!("scan-{k}.conf"));
        std::fs::write(&config, format!("DEVICE {}/m*\n{text}", dir.display())).unwrap();
        let config = config.to_str().unwrap();
        for pick in [["--uuid", uuid], ["--name", name]] {
            let args = [&["--scan", "--config", config][..], &pick[..]].concat();
            let served = match try_serve(dir, &args, &[]) {
                Ok(served) => served,
                Err((status, stderr)) => {
                    panic!("{what} then serve {args:?}: {status}\n{text}\n{stderr}")
                }
            };
            let detail = served.detail_json();
            assert_eq!(detail["uuid"], uuid, "{what}");
            assert_eq!(
                detail["active_devices"], detail["raid_devices"],
                "{what} then serve {pick:?}: {detail}"
            );
            served.stop();
        }
    }
}

/// Creates the array on DIR/m0..., serves it by relative paths, and checks
/// its names and its scan lines; `change` acts on the served array first.
fn round_trip(
    name: &str,
    options: &[&str],
    files: usize,
    change: impl FnOnce(&Served, &[PathBuf], &str),
) {
    runtime_dir();
    let dir = scratch(name);
    let d = dir.path();
    let mut options = options.to_vec();
    options.extend(["--assume-clean", "--name", name]);
    let members = create_array(d, "m", &options, files, 32 * MIB);
    let rel: Vec<String> = members.iter().map(|m| relative(m)).collect();
    let served = serve(d, &[], &rel.iter().map(String::as_str).collect::<Vec<_>>());
    let uuid = served.detail_json()["uuid"].as_str().unwrap().to_string();
    await_registry(&uuid, &members.iter().collect::<Vec<_>>());
    change(&served, &members, &uuid);
    assert_canonical_names(&array_status(&served.control), &members);
    let mut texts = detail_texts(&uuid);
    assert_json_lists(&["detail", "--scan", "--json"], &uuid, files);
    served.stop();
    texts.extend(examine_texts(&members));
    let abs: Vec<&str> = paths(&members);
    assert_json_lists(
        &[&["examine", "--scan", "--json"][..], &abs].concat(),
        &uuid,
        files,
    );
    assert_serves_again(d, name, &uuid, &texts);
}

#[test]
fn raid1_scan_lines_serve_it_again() {
    round_trip("sn-r1", &["-l", "1", "-n", "2"], 2, |_, _, _| {});
}

#[test]
fn raid5_with_a_spare_keeps_its_names_through_fail_remove_and_add() {
    round_trip(
        "sn-r5",
        &["-l", "5", "-n", "3", "--spare-devices", "1"],
        4,
        |served, members, uuid| {
            // Named relatively here too: the server hears the canonical name.
            let failed = relative(&members[0]);
            manage_ok(&served.control, &["--fail", &failed]);
            wait_status(&served.control, "the spare rebuilt", LIMIT, |s| {
                status_whole_and_idle(s)
            });
            // A failed member stays listed until it is removed.
            await_registry(uuid, &members.iter().collect::<Vec<_>>());
            manage_ok(&served.control, &["--remove", &failed]);
            await_registry(uuid, &members[1..].iter().collect::<Vec<_>>());
            manage_ok(&served.control, &["--add", &failed]);
            await_registry(uuid, &members.iter().collect::<Vec<_>>());
            let status = array_status(&served.control);
            let failed = members[0].display().to_string();
            assert!(
                status_events(&status)
                    .iter()
                    .any(|(e, d, _)| e == "Fail" && *d == failed),
                "{status}"
            );
        },
    );
}

#[test]
fn raid6_with_a_spare_scan_lines_serve_it_again() {
    round_trip("sn-r6", &["-l", "6", "-n", "4", "-x", "1"], 5, |_, _, _| {});
}

#[test]
fn a_draid_on_its_distributed_spare_scan_lines_serve_it_again() {
    round_trip(
        "sn-dr",
        &["--level", "draid2:3d:6c:1s", "--raid-devices", "6"],
        6,
        |served, members, _| {
            manage_ok(&served.control, &["--fail", &relative(&members[2])]);
            wait_status(
                &served.control,
                "the distributed spare in use",
                LIMIT,
                |s| {
                    status_whole_and_idle(s)
                        && status_events(s)
                            .iter()
                            .any(|(e, d, _)| e == "SpareActive" && d == "draid2-0-0")
                },
            );
        },
    );
}

#[test]
fn every_served_array_is_found_wherever_its_control_socket_is() {
    runtime_dir();
    let dir = scratch("sn-found");
    let members = create_array(
        dir.path(),
        "m",
        &["-l", "5", "-n", "3", "--assume-clean", "--name", "sn-found"],
        3,
        32 * MIB,
    );
    // The helper puts the control socket in the test's folder, away from
    // the runtime folder.
    let served = serve(dir.path(), &[], &paths(&members));
    assert!(served.control.starts_with(dir.path()));
    let doctor = stdout_of(&["doctor", "--json"]);
    let member = members[0].display().to_string();
    assert!(
        doctor.contains(&format!("queue scheduler {member}\"")),
        "doctor does not look at {member}:\n{doctor}"
    );
    let monitor = stdout_of(&[
        "monitor",
        "--scan",
        "--oneshot",
        "--test",
        "--program",
        "/bin/true",
    ]);
    assert!(
        monitor
            .lines()
            .any(|l| l == "TestMessage event detected on md device /dev/md/sn-found"),
        "{monitor}"
    );
    let status = stdout_of(&["status"]);
    assert!(status.contains("sn-found : active raid5"), "{status}");
    served.stop();
    // serve --help names the default the server really takes.
    let help = stdout_of(&["serve", "--help"]);
    let control = help
        .lines()
        .find(|l| l.contains("--control <"))
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        control.contains("<name>.ctl in the runtime folder"),
        "{control}"
    );
}
