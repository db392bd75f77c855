//! The guards around making, copying out and stopping an array: a create
//! that would quietly take devices as spares or shrink the array to a
//! small device is refused unless asked for; copy-out does not write over
//! a file or a disk that holds data; a failed array's stop says what it
//! leaves and the next start says how to insist; write-back without a
//! journal is named at every start; and clients that hang up leave nothing
//! in the server's log.

mod common;
use common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn digest(paths: &[PathBuf]) -> Vec<Vec<u8>> {
    paths
        .iter()
        .map(|p| Sha256::digest(std::fs::read(p).unwrap()).to_vec())
        .collect()
}

/// `uraid create ARGS... DEVICES...` refused with `reason`, the devices
/// untouched.
fn create_refused(args: &[&str], devices: &[PathBuf], reason: &str) -> String {
    let before = digest(devices);
    let mut all = vec!["create"];
    all.extend_from_slice(args);
    all.extend(paths(devices));
    let stderr = uraid_refused(&all);
    assert!(
        stderr.contains(reason),
        "{all:?}: expected {reason:?} in {stderr:?}"
    );
    assert_eq!(before, digest(devices), "{all:?} wrote while refusing");
    stderr
}

/// `uraid create ARGS... DEVICES...`; returns its last line.
fn create_ok(args: &[&str], devices: &[PathBuf]) -> String {
    let mut all = vec!["create"];
    all.extend_from_slice(args);
    all.extend(paths(devices));
    let out = uraid_ok(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    stderr
        .lines()
        .rfind(|l| l.starts_with("uraid: created"))
        .unwrap_or_else(|| panic!("{all:?}: no 'created' line in {stderr:?}"))
        .to_string()
}

/// `create_ok`, whose line must end "on SUMMARY".
fn created_on(args: &[&str], devices: &[PathBuf], summary: &str) {
    let line = create_ok(args, devices);
    assert!(line.ends_with(&format!("on {summary}")), "{line}");
}

#[test]
fn create_takes_devices_beyond_the_raid_devices_only_as_spares_it_was_told_of() {
    let dir = scratch("guard-spares");
    let d = dir.path();
    let five = sparse_files(d, "m", &[16 * MIB; 5]);
    create_refused(
        &["-l", "5", "-n", "3"],
        &five[..4],
        "4 devices given for 3 raid devices: the last would become a spare",
    );
    create_refused(&["-l", "5", "-n", "3"], &five, "say --spare-devices 2");
    create_refused(
        &["-l", "5", "-n", "3", "--spare-devices", "2"],
        &five[..4],
        "--spare-devices 2 but 1 device follows the 3 raid devices",
    );
    create_refused(
        &["-l", "5", "-n", "3", "--spare-devices", "1"],
        &five[..3],
        "--spare-devices 1 but 0 devices follow",
    );
    // A dRAID's --raid-devices counts its children; its distributed spares
    // are in the spec, and a further device is a spare like any other.
    let children = sparse_files(d, "c", &[40 * MIB; 5]);
    let said = create_refused(
        &["-l", "draid1:2d:4c:1s", "-n", "4", "-c", "64K"],
        &children,
        "the last would become a spare",
    );
    assert!(
        said.contains("distributed spares are in its spec"),
        "{said}"
    );

    created_on(
        &["-l", "5", "-n", "3", "--spare-devices", "2"],
        &five,
        "5 devices: 3 raid devices, 2 spares",
    );
    let detail = detail_offline(&paths(&five));
    assert_eq!(detail["raid_devices"], 3, "{detail}");
    assert_eq!(detail["spare_devices"], 2, "{detail}");

    created_on(
        &["-l", "draid1:2d:4c:1s", "-n", "4", "-c", "64K"],
        &children[..4],
        "4 devices: 4 children, 1 distributed spare",
    );
}

#[test]
fn create_names_the_journal_and_missing_devices_and_counts_no_journal_as_a_spare() {
    let dir = scratch("guard-journal");
    let d = dir.path();
    let members = sparse_files(d, "m", &[16 * MIB; 4]);
    let journal = sparse_files(d, "j", &[16 * MIB]).remove(0);
    let j = journal.to_str().unwrap();
    created_on(
        &["-l", "6", "-n", "4", "-c", "64K", "--write-journal", j],
        &members,
        "5 devices: 4 raid devices, 1 journal",
    );
    let mut fresh = sparse_files(d, "f", &[16 * MIB; 2]);
    fresh.push("missing".into());
    created_on(
        &["-l", "5", "-n", "3", "--force"],
        &fresh,
        "2 devices: 3 raid devices (1 missing)",
    );
}

#[test]
fn create_refuses_a_device_more_than_one_percent_smaller_unless_forced() {
    let dir = scratch("guard-sizes");
    let d = dir.path();
    let devices = sparse_files(d, "u", &[32 * MIB, 32 * MIB, 24 * MIB]);
    let said = create_refused(
        &["-l", "5", "-n", "3"],
        &devices,
        "u2 (24576 KiB) is more than 1% smaller than",
    );
    // It names the largest, the first of equals, and what the array would get.
    assert!(said.contains("u0 (32768 KiB)"), "{said}");
    assert!(said.contains("the array would be"), "{said}");
    assert!(said.contains("use --force"), "{said}");
    // raid1 and dRAID lose the room too; a smaller spare would shrink the array.
    create_refused(&["-l", "1", "-n", "3"], &devices, "u2 (24576 KiB)");
    create_refused(
        &["-l", "5", "-n", "2", "--spare-devices", "1"],
        &devices,
        "u2 (24576 KiB)",
    );
    // Linear and raid0 use every member whole: nothing is lost.
    create_ok(&["-l", "0", "-n", "3"], &devices);
    create_ok(&["-l", "linear", "-n", "3", "--force"], &devices);
    // --force accepts it, and the array is the small device's size on each.
    let line = create_ok(&["-l", "5", "-n", "3", "--force"], &devices);
    let even = sparse_files(d, "e", &[24 * MIB; 3]);
    let even_line = create_ok(&["-l", "5", "-n", "3"], &even);
    let size = |l: &str| {
        l.split('(')
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(size(&line), size(&even_line), "{line} / {even_line}");
    // --size says how much of each to use: no silent loss either.
    let sized = sparse_files(d, "s", &[32 * MIB, 32 * MIB, 24 * MIB]);
    create_ok(&["-l", "5", "-n", "3", "--size", "16M"], &sized);
    // Within 1%, and a larger spare, shrink nothing worth asking about.
    let close = sparse_files(
        d,
        "c",
        &[32 * MIB, 32 * MIB - 256 * 1024, 32 * MIB, 40 * MIB],
    );
    create_ok(&["-l", "5", "-n", "3", "-x", "1"], &close);
}

/// A loop device on a file of `bytes`, detached when dropped; None (and a
/// SKIPPED line) where loop devices cannot be made.
struct LoopDevice(String);

impl LoopDevice {
    fn on(file: &Path) -> Option<LoopDevice> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()?;
        if !out.status.success() {
            println!(
                "SKIPPED: no loop device: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(LoopDevice(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn copy_out_args<'a>(output: &'a str, extra: &[&'a str], members: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["copy-out", "--output", output];
    args.extend_from_slice(extra);
    args.extend_from_slice(members);
    args
}

#[test]
fn copy_out_writes_over_nothing_that_holds_data_unless_forced() {
    let dir = scratch("guard-copy-out");
    let d = dir.path();
    let files = create_array(d, "m", &["-l", "1", "-n", "2"], 2, 8 * MIB);
    let members = paths(&files);
    let size = array_bytes(&members);
    let (image, data) = common::image(d, "in.img", 31, size);
    let mut args = vec!["copy-in", "--input", image.to_str().unwrap()];
    args.extend_from_slice(&members);
    uraid_ok(&args);

    // A file that holds data stays as it was; an empty one is written.
    let kept = d.join("kept.img");
    std::fs::write(&kept, b"precious").unwrap();
    let k = kept.to_str().unwrap();
    let said = uraid_refused(&copy_out_args(k, &[], &members));
    assert!(
        said.contains("exists and holds 8 bytes; use --force"),
        "{said}"
    );
    assert_eq!(std::fs::read(&kept).unwrap(), b"precious");
    uraid_ok(&copy_out_args(k, &["--force"], &members));
    assert_same_bytes(&std::fs::read(&kept).unwrap(), &data, "copy-out --force");
    let empty = d.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    uraid_ok(&copy_out_args(empty.to_str().unwrap(), &[], &members));
    assert_same_bytes(
        &std::fs::read(&empty).unwrap(),
        &data,
        "copy-out to an empty file",
    );

    // /dev/null and a pipe take the stream: there is nothing to sync.
    uraid_ok(&copy_out_args("/dev/null", &[], &members));
    let fifo = d.join("pipe");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    uraid_ok(&copy_out_args(fifo.to_str().unwrap(), &[], &members));
    assert_same_bytes(&reader.join().unwrap(), &data, "copy-out into a pipe");

    copy_out_onto_disks(d, &members, &data);
}

/// A disk is written as dd writes one, unless it is too small or holds
/// something (here a filesystem) that --force must insist on.
fn copy_out_onto_disks(d: &Path, members: &[&str], data: &[u8]) {
    let images = sparse_files(d, "disk", &[16 * MIB, 16 * MIB, MIB]);
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&images[1])
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(status.success());
    let Some(blank) = LoopDevice::on(&images[0]) else {
        return;
    };
    let held = LoopDevice::on(&images[1]).expect("a second loop device");
    let small = LoopDevice::on(&images[2]).expect("a third loop device");
    let before = digest(&images[1..]);
    let said = uraid_refused(&copy_out_args(&held.0, &[], members));
    assert!(
        said.contains("filesystem") && said.contains("--force"),
        "{said}"
    );
    let said = uraid_refused(&copy_out_args(&small.0, &["--force"], members));
    assert!(said.contains("less than the array's"), "{said}");
    assert_eq!(before, digest(&images[1..]), "a refused copy-out wrote");
    uraid_ok(&copy_out_args(&blank.0, &[], members));
    uraid_ok(&copy_out_args(&held.0, &["--force"], members));
    for image in &images[..2] {
        let written = std::fs::read(image).unwrap();
        assert_same_bytes(&written[..data.len()], data, "copy-out onto a disk");
    }
}

#[test]
fn a_failed_arrays_stop_says_so_and_the_next_serve_says_how_to_insist() {
    let dir = scratch("guard-failed-stop");
    let files = create_array(dir.path(), "m", &["-l", "5", "-n", "3"], 3, 16 * MIB);
    let members = paths(&files);
    let served = serve(dir.path(), &[], &members);
    manage_ok(&served.control, &["--fail", members[0]]);
    manage_ok(&served.control, &["--fail", members[1], "--force"]);
    let said = served.stop();
    assert!(!said.contains("marking the array clean"), "{said}");
    assert!(!said.contains("stopped cleanly"), "{said}");
    assert!(
        said.contains("the array is failed (2 of 3 members lost)")
            && said.contains("superblocks are left active")
            && said.contains("`uraid serve --force`"),
        "{said}"
    );
    // md's way: the superblocks stay active, so that an assembly can try again.
    assert_eq!(examine_state_lines(&members[1..]), vec!["active"; 2]);

    let before = digest(&files);
    match try_serve(dir.path(), &[], &members) {
        Ok(_) => panic!("a failed, dirty array started without --force"),
        Err((_, stderr)) => {
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
            assert_eq!(lines.len(), 1, "{stderr}");
            assert!(
                lines[0].contains("`uraid serve --force` starts it")
                    && lines[0].contains("at the risk that those stripes read back wrong"),
                "{stderr}"
            );
        }
    }
    assert_eq!(before, digest(&files), "a refused serve wrote");
    let served = serve(dir.path(), &["--force"], &members);
    served.stop();
}

const WRITE_BACK_WARNING: &str = "WARNING: write-back without a write journal";

/// The settings folder of this test process (create saves knobs there).
fn settings_dir() {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("guard-settings");
        // Edition 2021: a safe call; set before any child process starts.
        std::env::set_var("URAID_CONFIG_DIR", dir.path());
        dir
    });
}

#[test]
fn write_back_without_a_journal_is_named_at_every_start() {
    settings_dir();
    let dir = scratch("guard-write-back");
    let wb = ["--write-policy", "write-back", "--i-accept-data-loss"];
    let mut options = vec!["-l", "5", "-n", "3", "-c", "64K"];
    options.extend(wb);
    let files = create_array(dir.path(), "m", &options, 3, 16 * MIB);
    let members = paths(&files);
    // Saved with the array, it is in force at a plain serve: said each time.
    for _ in 0..2 {
        let served = serve(dir.path(), &[], &members);
        let detail = served.detail_json();
        assert_eq!(detail["tuning"]["write_policy"], "write-back", "{detail}");
        let said = served.stop();
        let warnings: Vec<&str> = said
            .lines()
            .filter(|l| l.contains(WRITE_BACK_WARNING))
            .collect();
        assert_eq!(warnings.len(), 1, "{said}");
        assert!(
            warnings[0].contains("lost in a crash")
                && warnings[0].contains("--write-policy write-through"),
            "{said}"
        );
    }
    let served = serve(dir.path(), &["--write-policy", "write-through"], &members);
    let said = served.stop();
    assert!(!said.contains(WRITE_BACK_WARNING), "{said}");

    // A journal protects write-back: nothing to warn about.
    let journal = sparse_files(dir.path(), "j", &[16 * MIB]).remove(0);
    let j = journal.to_str().unwrap();
    let mut options = vec!["-l", "5", "-n", "3", "-c", "64K", "--write-journal", j];
    options.extend(wb);
    let files = create_array(dir.path(), "jm", &options, 3, 16 * MIB);
    let mut members = paths(&files);
    members.push(j);
    let served = serve(dir.path(), &[], &members);
    assert_eq!(served.detail_json()["tuning"]["write_policy"], "write-back");
    let said = served.stop();
    assert!(!said.contains(WRITE_BACK_WARNING), "{said}");
}

#[test]
fn clients_that_hang_up_leave_nothing_in_the_servers_log() {
    process_runtime_dir();
    let dir = scratch("guard-log-noise");
    let options = ["-l", "1", "-n", "2", "--name", "guard-noise"];
    let files = create_array(dir.path(), "m", &options, 2, 16 * MIB);
    let served = serve(dir.path(), &[], &paths(&files));
    for _ in 0..3 {
        // A bare status lists the registry, probing each server's socket.
        let out = uraid_ok(&["status"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("guard-noise"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        served.status_text();
        drop(std::os::unix::net::UnixStream::connect(&served.control).unwrap());
    }
    // A request followed by a hang-up before the reply is read.
    {
        use std::io::Write;
        let mut stream = std::os::unix::net::UnixStream::connect(&served.control).unwrap();
        stream.write_all(b"{\"command\":\"status\"}\n").unwrap();
    }
    served.status_text();
    let said = served.stop();
    assert!(!said.contains("control connection"), "{said}");
}

/// A stop in the middle of a resync says where it stopped, not "clean":
/// md's resync_offset holds the point, and the next start resumes there.
#[test]
fn a_stop_during_a_resync_says_where_it_stopped() {
    let dir = scratch("guard-resync-stop");
    let d = dir.path();
    let files = create_array(
        d,
        "m",
        &["-l", "5", "-n", "3", "--assume-clean"],
        3,
        16 * MIB,
    );
    let members = paths(&files);
    // Killed: the array is left dirty, so the next start resyncs it.
    serve(d, &[], &members).kill();
    let uuid = detail_offline(&members[..1])["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    // At 1 MiB/s per member from its start, the resync takes 16 s.
    let conf = d.join("uraid.conf");
    std::fs::write(
        &conf,
        format!(
            "DEVICE {}/m*\nSYSFS uuid={uuid} sync_speed_max=1000\n",
            d.display()
        ),
    )
    .unwrap();
    let conf = conf.to_str().unwrap();
    let served = serve(d, &["--scan", "--config", conf, "--uuid", &uuid], &[]);
    let status = wait_status(
        &served.control,
        "the resync under way",
        Duration::from_secs(30),
        |s| s["sync"]["action"] == "resync" && s["sync"]["done_kib"].as_u64() > Some(0),
    );
    assert_eq!(status["jobs_idle"], false, "{status}");
    let said = served.stop();
    assert!(!said.contains("stopped cleanly"), "{said}");
    assert!(
        said.contains("uraid: stopped: the resync stopped at")
            && said.contains("the next start (uraid or md) resumes the resync there"),
        "{said}"
    );
    assert_eq!(examine_state_lines(&members), vec!["active"; 3]);

    // The next start goes on from there, to the end.
    let served = serve(d, &[], &members);
    let said = manage_ok(&served.control, &["--wait"]);
    assert!(
        said.contains("resync ended; 3 of 3 members in sync"),
        "{said}"
    );
    assert!(served.stop().contains("uraid: stopped cleanly"));
    assert_eq!(examine_state_lines(&members), vec!["clean"; 3]);
}
