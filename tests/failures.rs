//! Member failures on a served array, end to end on the host: members pulled
//! and failed while clients write, hot spares taking over, rebuilds that are
//! throttled, interrupted by a crash and resumed, read errors corrected from
//! redundancy, check and repair, and md's speed limits.
//!
//! Every test serves arrays of sparse files in a /tmp scratch folder with
//! `uraid serve --fault-injection` (tests/common `serve`, which stops the
//! server with SIGTERM and requires exit 0), drives failures with
//! `uraid manage` (`--inject DEV pull`, `--fail`, `--add`, `--action`,
//! `--speed-limit-max`), waits for what it expects by polling
//! `uraid status --json` against a deadline, and checks the data with real
//! clients (nbdcopy, nbdsh, fio's nbd engine, ext4 over nbdfuse and a loop
//! device) and offline (`uraid copy-out` with members left out).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(data))
}

fn data_offset_bytes(member: &str) -> u64 {
    let out = uraid_ok(&["examine", "--json", member]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["data_offset_sectors"]
        .as_u64()
        .expect("data_offset_sectors")
        * 512
}

fn has_event(status: &serde_json::Value, event: &str, device: Option<&str>) -> bool {
    status_events(status)
        .iter()
        .any(|(e, d, _)| e == event && device.is_none_or(|want| same_path(d, want)))
}

fn same_path(a: &str, b: &str) -> bool {
    a == b
        || (std::fs::canonicalize(a).is_ok()
            && std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok())
}

/// Asserts that `wanted` events occur in this order among the events (other
/// events may come between them). Each is (event, device or "" for any).
fn assert_event_order(status: &serde_json::Value, wanted: &[(&str, &str)], what: &str) {
    let events = status_events(status);
    let mut at = 0;
    for (event, device) in wanted {
        match events[at..]
            .iter()
            .position(|(e, d, _)| e == event && (device.is_empty() || same_path(d, device)))
        {
            Some(i) => at += i + 1,
            None => panic!(
                "{what}: no event {event} {device} (in order) among:\n{}",
                events
                    .iter()
                    .map(|(e, d, x)| format!("  {e} {d} {x}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }
    }
}

/// The state of a member in `detail` (e.g. "active sync", "spare",
/// "faulty") and its raid role.
fn member_state(status: &serde_json::Value, path: &str) -> (String, Option<u64>) {
    let row = detail_row(&status["detail"], path)
        .unwrap_or_else(|| panic!("no device row for {path}: {}", status["detail"]));
    (
        row["state"].as_str().unwrap_or_default().to_string(),
        row["raid_device"].as_u64(),
    )
}

/// Waits until `spare` holds `role`, in sync, and the array is whole and
/// idle again (RebuildFinished and SpareActive for it).
fn wait_rebuilt_onto(
    served: &Served,
    spare: &str,
    role: u64,
    limit: Duration,
    what: &str,
) -> serde_json::Value {
    let status = wait_status(&served.control, what, limit, |s| {
        has_event(s, "SpareActive", Some(spare)) && status_whole_and_idle(s)
    });
    let (state, r) = member_state(&status, spare);
    assert!(
        state.starts_with("active sync") && r == Some(role),
        "{what}: {spare} is {state:?} in role {r:?}, expected active sync in role {role}"
    );
    status
}

fn assert_root() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (loop devices, mount); CI runs it as root"
    );
}

// ---------------------------------------------------------------------------
// ext4 through nbdfuse and a loop device, with a writer in the background.

/// What the writer has written: file name -> sha256 of its contents once
/// fsync returned, None while the file is being (re)written.
#[derive(Default)]
struct Written {
    files: BTreeMap<String, Option<String>>,
    /// Files completed (written and fsynced).
    completed: usize,
    error: Option<String>,
}

/// A thread writing files of random sizes (4 KiB..640 KiB) into a folder of
/// the mounted file system, each fsynced before its checksum is recorded,
/// cycling over 96 names (rewriting the oldest) so that it can run for as
/// long as needed without filling the file system. It stops at the first
/// error, which it records.
struct Writer {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<Written>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(folder: PathBuf, seed: u64) -> Writer {
        use rand::{Rng, SeedableRng};
        std::fs::create_dir_all(&folder).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(Written::default()));
        let (thread_stop, thread_state) = (stop.clone(), state.clone());
        let thread = std::thread::spawn(move || {
            use std::io::Write;
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut i = 0u64;
            while !thread_stop.load(Ordering::SeqCst) {
                let name = format!("f{:02}", i % 96);
                let len = rng.gen_range(4096..640 << 10);
                let data = random_bytes(seed * 1_000_000 + i, len);
                thread_state
                    .lock()
                    .unwrap()
                    .files
                    .insert(name.clone(), None);
                let result = std::fs::File::create(folder.join(&name))
                    .and_then(|mut f| f.write_all(&data).and_then(|_| f.sync_all()));
                let mut s = thread_state.lock().unwrap();
                match result {
                    Ok(()) => {
                        s.files.insert(name, Some(sha256_hex(&data)));
                        s.completed += 1;
                    }
                    Err(e) => {
                        s.error = Some(format!("writing {name}: {e}"));
                        return;
                    }
                }
                i += 1;
            }
        });
        Writer {
            stop,
            state,
            thread: Some(thread),
        }
    }

    fn completed(&self) -> usize {
        let s = self.state.lock().unwrap();
        assert!(s.error.is_none(), "the writer failed: {:?}", s.error);
        s.completed
    }

    /// Waits until the writer has completed `more` files after `from`,
    /// failing if it stops with an error.
    fn wait_for(&self, from: usize, more: usize, limit: Duration, what: &str) -> usize {
        let deadline = Instant::now() + limit;
        loop {
            let n = self.completed();
            if n >= from + more {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the writer completed only {} files in {limit:?}",
                n - from
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the writer and returns what it wrote. With `expect_error`
    /// false an error fails the test; with true (the server was killed)
    /// the writer may stop on one.
    fn stop(mut self, expect_error: bool) -> Written {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !thread.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the writer did not stop within 60 s (blocked on the file system?)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        thread.join().expect("writer thread");
        let state = std::mem::take(&mut *self.state.lock().unwrap());
        if !expect_error {
            assert!(
                state.error.is_none(),
                "the writer failed: {:?}",
                state.error
            );
        }
        state
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Every file the writer completed (and did not start rewriting) reads
/// back with its recorded sha256; returns how many were checked.
fn verify_files(folder: &Path, written: &Written, what: &str) -> usize {
    let mut checked = 0;
    for (name, sha) in &written.files {
        let Some(sha) = sha else { continue };
        let got = std::fs::read(folder.join(name))
            .unwrap_or_else(|e| panic!("{what}: reading {name}: {e}"));
        assert_eq!(
            &sha256_hex(&got),
            sha,
            "{what}: {name} differs ({} bytes)",
            got.len()
        );
        checked += 1;
    }
    checked
}

/// The ext4 scenario's array: raid6 on six 48 MiB members and two spares,
/// served with fault injection; the spares added (they wait: the array is
/// healthy); ext4 made on it over nbdfuse + loop and mounted.
struct Ext4Rig {
    dir: tempfile::TempDir,
    members: Vec<String>,
    spares: Vec<String>,
    size: u64,
    fs_dir: PathBuf,
}

fn ext4_rig(name: &str) -> (Ext4Rig, Served, Stack) {
    assert_root();
    let dir = scratch(name);
    let members = create_array(
        dir.path(),
        "m",
        &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
        6,
        48 * MIB,
    );
    let members: Vec<String> = paths(&members).iter().map(|s| s.to_string()).collect();
    let spares = sparse_files(dir.path(), "s", &[48 * MIB; 2]);
    let spares: Vec<String> = paths(&spares).iter().map(|s| s.to_string()).collect();
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    let size = array_bytes(&m);
    let served = serve(dir.path(), &["--fault-injection"], &m);
    for s in &spares {
        manage_ok(&served.control, &["--add", s]);
    }
    let status = array_status(&served.control);
    assert!(
        status_whole_and_idle(&status),
        "spares added to a healthy array: {status}"
    );
    assert_eq!(status["detail"]["spare_devices"], 2, "{}", status["detail"]);
    for s in &spares {
        assert_eq!(member_state(&status, s).0, "spare", "{s} after --add");
    }
    let mut stack = Stack::attach(dir.path(), served.uri(), size);
    sh_ok(
        Command::new(client_tool("mkfs.ext4", "e2fsprogs"))
            .args(["-q", "-F"])
            .arg(stack.dev()),
    );
    let fs_dir = dir.path().join("fs");
    stack.mount(&fs_dir);
    (
        Ext4Rig {
            dir,
            members,
            spares,
            size,
            fs_dir,
        },
        served,
        stack,
    )
}

/// Pulls `member` (role `role`) while the writer runs and waits for the
/// rebuild onto `spare`, checking the events in between.
fn pull_and_wait_rebuilt(served: &Served, writer: &Writer, member: &str, role: u64, spare: &str) {
    let before = writer.completed();
    manage_ok(&served.control, &["--inject", member, "pull"]);
    let status = wait_rebuilt_onto(
        served,
        spare,
        role,
        Duration::from_secs(90),
        &format!("the rebuild of role {role} onto {spare} after pulling {member}"),
    );
    assert_event_order(
        &status,
        &[
            ("FaultInjected", member),
            ("Fail", member),
            ("DegradedArray", ""),
            ("RebuildStarted", spare),
            ("Rebuild20", ""),
            ("Rebuild40", ""),
            ("Rebuild60", ""),
            ("Rebuild80", ""),
            ("RebuildFinished", spare),
            ("SpareActive", spare),
        ],
        &format!("pulling {member}"),
    );
    assert_eq!(
        member_state(&status, member).0,
        "faulty",
        "{member} after the pull"
    );
    // The file system kept working through the failure and the rebuild.
    writer.wait_for(before, 5, Duration::from_secs(60), "after the rebuild");
}

/// A served raid6 with ext4 and a writer loses two members, one after the
/// other, to pulls; each is rebuilt onto a hot spare while the writer goes
/// on. Then e2fsck is clean and every file reads back, also after a restart
/// of the server on the six members now in the array (the pulled ones left
/// out), and the rebuilt members' parity is consistent offline.
#[test]
fn ext4_on_raid6_loses_two_members_to_hot_spares_while_writing() {
    let (rig, served, mut stack) = ext4_rig("fail-ext4");
    let writer = Writer::start(rig.fs_dir.join("w"), 1);
    writer.wait_for(0, 10, Duration::from_secs(60), "before the first pull");

    pull_and_wait_rebuilt(&served, &writer, &rig.members[1], 1, &rig.spares[0]);
    pull_and_wait_rebuilt(&served, &writer, &rig.members[4], 4, &rig.spares[1]);
    let status = array_status(&served.control);
    assert_eq!(status["detail"]["spare_devices"], 0, "{}", status["detail"]);

    let written = writer.stop(false);
    sh_ok(Command::new("sync").arg("-f").arg(&rig.fs_dir));
    let n = verify_files(&rig.fs_dir.join("w"), &written, "through the page cache");
    stack.umount();
    run_e2fsck(stack.dev(), "after two pulls and rebuilds");
    stack.detach(true);
    served.stop();

    // The array now: the rebuilt spares in roles 1 and 4.
    let now: Vec<&str> = vec![
        &rig.members[0],
        &rig.spares[0],
        &rig.members[2],
        &rig.members[3],
        &rig.spares[1],
        &rig.members[5],
    ];
    assert_eq!(examine_states(&now), vec!["clean"; 6]);
    let detail = detail_offline(&now);
    assert_eq!(detail["state"], "clean", "{detail}");
    assert_eq!(detail["active_devices"], 6, "{detail}");

    let served = serve(rig.dir.path(), &[], &now);
    let mut stack = Stack::attach(rig.dir.path(), served.uri(), rig.size);
    run_e2fsck(stack.dev(), "after a restart on the rebuilt members");
    stack.mount(&rig.fs_dir);
    let m = verify_files(&rig.fs_dir.join("w"), &written, "after a restart");
    assert_eq!(n, m);
    assert!(m >= 20, "only {m} files were written");
    eprintln!("{m} files verified; {} written in all", written.completed);
    stack.detach(true);
    served.stop();
    assert_redundancy_consistent(&now, 2, None, rig.dir.path());
}

/// The same, but the server is killed (SIGKILL) in the middle of the second
/// rebuild (throttled so that it is), after the writer has run through the
/// pull and stopped (see the kill for why no write is in flight). The array
/// is then dirty and degraded, which md refuses to start without being
/// forced, and so must uraid; forced, on the members that remain (the
/// pulled ones left out), it must resync and resume the rebuild onto the
/// spare, which its superblock says was under way (Recovery Offset), and
/// finish with all six roles in sync. ext4's journal recovers, e2fsck is
/// clean and every file the writer completed reads back.
#[test]
fn ext4_rebuild_resumes_after_the_server_is_killed_mid_rebuild() {
    let (rig, served, mut stack) = ext4_rig("fail-ext4-kill");
    let writer = Writer::start(rig.fs_dir.join("w"), 2);
    writer.wait_for(0, 10, Duration::from_secs(60), "before the first pull");
    pull_and_wait_rebuilt(&served, &writer, &rig.members[1], 1, &rig.spares[0]);

    // 48 MiB at 3000 KiB/s: about 16 s, and the writer slows it further.
    manage_ok(&served.control, &["--speed-limit-max", "3000"]);
    manage_ok(&served.control, &["--inject", &rig.members[4], "pull"]);
    let spare = rig.spares[1].as_str();
    // Past 20 %, where the rebuild records its first checkpoint.
    let status = wait_status(
        &served.control,
        "the second rebuild past its first checkpoint",
        Duration::from_secs(60),
        |s| {
            let events = status_events(s);
            events
                .iter()
                .position(|(e, d, _)| e == "RebuildStarted" && same_path(d, spare))
                .is_some_and(|i| events[i..].iter().any(|(e, _, _)| e == "Rebuild20"))
        },
    );
    let line = sync_line(status["mdstat"].as_str().unwrap())
        .unwrap_or_else(|| panic!("no recovery line:\n{}", status["mdstat"]));
    assert_eq!(line.action, "recovery", "{line:?}");
    assert!(
        line.done_kib < line.total_kib * 3 / 4,
        "the throttled rebuild is nearly done already: {line:?}"
    );
    // The writer stops and the file system is synced before the kill, which
    // still comes mid-rebuild. A crash with writes in flight on a degraded
    // raid6 falls into md's write hole: a torn stripe rebuilds the missing
    // member's strip in it wrongly, blocks committed long before included
    // (seen once here as an ext4 journal that would not load). That is why
    // md, and uraid, refuse to start a dirty degraded array without --force;
    // only a journal closes it, and uraid has none yet.
    let written = writer.stop(false);
    sh_ok(&mut Command::new("sync"));
    served.kill();
    stack.detach(false);

    let now: Vec<&str> = vec![
        &rig.members[0],
        &rig.spares[0],
        &rig.members[2],
        &rig.members[3],
        spare,
        &rig.members[5],
    ];
    assert_eq!(examine_states(&now), vec!["active"; 6], "after SIGKILL");
    let uraid_offset = recovery_offset_line(&String::from_utf8_lossy(
        &uraid_ok(&["examine", spare]).stdout,
    ));
    let mdadm = run_limited_ok(
        Command::new(client_tool("mdadm", "mdadm"))
            .arg("--examine")
            .arg(spare),
        Duration::from_secs(30),
    );
    let mdadm_offset = recovery_offset_line(&String::from_utf8_lossy(&mdadm.stdout));
    assert!(
        uraid_offset.is_some_and(|o| o > 0),
        "{spare}: no Recovery Offset after being killed past 20 %: {uraid_offset:?}"
    );
    assert_eq!(
        uraid_offset, mdadm_offset,
        "uraid examine and mdadm --examine"
    );

    // md: "cannot start dirty degraded array"; uraid likewise without --force.
    if let Ok(s) = try_serve(rig.dir.path(), &[], &now) {
        let stderr = s.stderr();
        s.stop();
        panic!("a dirty degraded raid6 was served without --force:\n{stderr}");
    }
    let served = serve(rig.dir.path(), &["--force"], &now);
    let status = wait_status(
        &served.control,
        &format!("the rebuild onto {spare} to resume and finish after the restart"),
        Duration::from_secs(45),
        |s| status_whole_and_idle(s) && has_event(s, "SpareActive", Some(spare)),
    );
    assert_eq!(
        member_state(&status, spare),
        ("active sync".to_string(), Some(4))
    );

    let mut stack = Stack::attach(rig.dir.path(), served.uri(), rig.size);
    // Mounting replays the journal; then the check.
    stack.mount(&rig.fs_dir);
    let m = verify_files(
        &rig.fs_dir.join("w"),
        &written,
        "after the crash and restart",
    );
    assert!(m >= 10, "only {m} files were completed before the crash");
    stack.umount();
    run_e2fsck(
        stack.dev(),
        "after the crash, the journal replay and the resumed rebuild",
    );
    stack.detach(true);
    served.stop();
    assert_eq!(examine_states(&now), vec!["clean"; 6]);
    assert_redundancy_consistent(&now, 2, None, rig.dir.path());
}

// ---------------------------------------------------------------------------
// Degraded and rebuilding, per level, under concurrent I/O.

/// How a member is lost.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// `uraid manage --fail`.
    Fail,
    /// `--inject DEV pull`: the member vanishes; uraid notices on I/O.
    Pull,
}

fn fio_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in fio's output:\n{text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio JSON output: {e}\n{text}"))
}

/// fio on two connections (one per job), each on its own region of the
/// second half of the array: random writes of mixed sizes with crc32c
/// headers, verified (`do_verify`), or `verify_only` afterwards.
fn fio_two_connections(dir: &Path, uri: &str, half: u64, region: u64, extra: &[&str]) {
    let fio = client_tool("fio", "fio");
    let mut cmd = Command::new(fio);
    cmd.current_dir(dir)
        .arg("--verify_state_save=0")
        .arg("--name=nbd")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg("--numjobs=2")
        .arg(format!("--offset={half}"))
        .arg(format!("--size={region}"))
        .arg(format!("--offset_increment={region}"))
        .arg("--rw=randwrite")
        .arg("--bssplit=4k/30:16k/30:64k/25:128k/15")
        .arg("--iodepth=8")
        .arg("--verify=crc32c")
        .arg("--randseed=77")
        .arg("--group_reporting")
        .arg("--output-format=json")
        .args(extra);
    let out = run_limited_ok(&mut cmd, Duration::from_secs(120));
    let json = fio_json(&out.stdout);
    let job = &json["jobs"][0];
    assert_eq!(job["error"], 0, "fio {extra:?} failed: {job}");
    assert_eq!(
        job["read"]["io_bytes"].as_u64(),
        Some(2 * region),
        "fio {extra:?} verified too little: {job}"
    );
}

/// Rewrites the first MiB of the export with what it already holds, and
/// flushes: every member is written, so a pulled one is noticed, and the
/// contents do not change.
fn touch_every_member(uri: &str) {
    nbdsh_script(
        uri,
        r#"
h.connect_uri(URI)
n = min(1 << 20, h.get_size())
h.pwrite(h.pread(n, 0), 0)
h.flush()
h.shutdown()
"#,
        Duration::from_secs(60),
    );
}

/// One level: healthy reads; members lost (failed or pulled) and the
/// degraded array reads the same; spares added, the rebuild throttled to
/// 2000 KiB/s so that it is seen in progress (status: recovery) while the
/// data is read again and fio writes and verifies on two connections; the
/// limit raised, the rebuild finishes; everything verified again, after a
/// restart, and offline with members left out.
fn degrade_and_rebuild(
    name: &str,
    options: &[&str],
    disks: usize,
    lost: &[(usize, Loss)],
    losable: usize,
) {
    let dir = scratch(&format!("fail-level-{name}"));
    let files = create_array(dir.path(), "m", options, disks, 24 * MIB);
    let members = paths(&files);
    let spare_files = sparse_files(dir.path(), "s", &vec![24 * MIB; lost.len()]);
    let spares = paths(&spare_files);
    let size = array_bytes(&members);
    let (img, data) = image(dir.path(), "a.img", 0xd15c + disks as u64, size);
    let half = size / 2 / (128 << 10) * (128 << 10);
    let region = (size - half) / 2 / (128 << 10) * (128 << 10);

    let served = serve(dir.path(), &["--fault-injection"], &members);
    nbdcopy_in(&img, served.uri());
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        &format!("{name}: healthy"),
    );
    assert!(status_whole_and_idle(&array_status(&served.control)));
    manage_ok(&served.control, &["--speed-limit-max", "2000"]);
    let status = array_status(&served.control);
    assert_eq!(
        status["speed_limit_max_kib_per_s"], 2000,
        "{name}: speed limit in status"
    );

    // Lose the members.
    for (role, how) in lost {
        match how {
            Loss::Fail => {
                manage_ok(&served.control, &["--fail", members[*role]]);
            }
            Loss::Pull => {
                manage_ok(&served.control, &["--inject", members[*role], "pull"]);
            }
        }
    }
    touch_every_member(served.uri());
    let status = wait_status(
        &served.control,
        &format!("{name}: {} members failed", lost.len()),
        Duration::from_secs(30),
        |s| s["detail"]["active_devices"].as_u64() == Some((disks - lost.len()) as u64),
    );
    let state = status["detail"]["state"].as_str().unwrap();
    assert!(state.contains("degraded"), "{name}: state {state:?}");
    let flags: String = (0..disks)
        .map(|r| {
            if lost.iter().any(|(l, _)| *l == r) {
                '_'
            } else {
                'U'
            }
        })
        .collect();
    let health = format!("[{disks}/{}] [{flags}]", disks - lost.len());
    assert!(
        status["mdstat"].as_str().unwrap().contains(&health),
        "{name}: mdstat lacks {health}:\n{}",
        status["mdstat"]
    );
    for (role, _) in lost {
        assert!(
            has_event(&status, "Fail", Some(members[*role])),
            "{name}: no Fail event for role {role}"
        );
        assert_eq!(
            member_state(&status, members[*role]).0,
            "faulty",
            "{name}: role {role}"
        );
    }
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        &format!("{name}: degraded"),
    );

    // Spares: the rebuild starts at once, throttled.
    for s in &spares {
        manage_ok(&served.control, &["--add", s]);
    }
    let status = wait_status(
        &served.control,
        &format!("{name}: a recovery in status"),
        Duration::from_secs(30),
        |s| sync_line(s["mdstat"].as_str().unwrap()).is_some_and(|l| l.action == "recovery"),
    );
    let state = status["detail"]["state"].as_str().unwrap();
    assert!(
        state.contains("recovering"),
        "{name}: state {state:?} while rebuilding"
    );
    assert!(
        has_event(&status, "RebuildStarted", Some(spares[0])),
        "{name}: no RebuildStarted"
    );
    assert_eq!(
        member_state(&status, spares[0]).0,
        "spare rebuilding",
        "{name}"
    );
    // Reads during the rebuild: below the rebuild point from the new
    // member, above it by reconstruction.
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        &format!("{name}: while rebuilding"),
    );
    fio_two_connections(dir.path(), served.uri(), half, region, &["--do_verify=1"]);
    let status = array_status(&served.control);
    let line = sync_line(status["mdstat"].as_str().unwrap());
    assert!(
        line.as_ref().is_some_and(|l| l.action == "recovery"),
        "{name}: the rebuild was to outlast the reads and fio (2000 KiB/s): {line:?}\n{}",
        status["mdstat"]
    );

    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    let status = wait_status(
        &served.control,
        &format!("{name}: every rebuild finished"),
        Duration::from_secs(60),
        |s| status_whole_and_idle(s) && spares.iter().all(|p| has_event(s, "SpareActive", Some(p))),
    );
    for ((role, _), s) in lost.iter().zip(&spares) {
        let (state, r) = member_state(&status, s);
        assert!(
            state.starts_with("active sync") && r.is_some(),
            "{name}: spare {s} (for role {role}) is {state:?} in role {r:?}"
        );
    }
    let whole = nbdcopy_out(served.uri(), dir.path());
    assert_same_bytes(
        &whole[..half as usize],
        &data[..half as usize],
        &format!("{name}: first half after the rebuild"),
    );
    fio_two_connections(dir.path(), served.uri(), half, region, &["--verify_only=1"]);
    served.stop();

    let now: Vec<&str> = members
        .iter()
        .enumerate()
        .filter(|(r, _)| !lost.iter().any(|(l, _)| l == r))
        .map(|(_, m)| *m)
        .chain(spares.iter().copied())
        .collect();
    assert_eq!(examine_states(&now), vec!["clean"; disks], "{name}");
    let served = serve(dir.path(), &[], &now);
    assert!(
        status_whole_and_idle(&array_status(&served.control)),
        "{name}: after a restart"
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &whole,
        &format!("{name}: after a restart"),
    );
    served.stop();
    assert_redundancy_consistent(&now, losable, Some(&whole), dir.path());
}

#[test]
fn raid1_degraded_and_rebuilt_under_io() {
    degrade_and_rebuild(
        "raid1",
        &["--level", "raid1", "--raid-devices", "2"],
        2,
        &[(0, Loss::Pull)],
        1,
    );
}

#[test]
fn raid10_degraded_and_rebuilt_under_io() {
    degrade_and_rebuild(
        "raid10",
        &[
            "--level",
            "raid10",
            "--raid-devices",
            "4",
            "--layout",
            "n2",
            "--chunk",
            "64K",
        ],
        4,
        &[(1, Loss::Fail)],
        1,
    );
}

#[test]
fn raid4_parity_member_pulled_and_rebuilt_under_io() {
    degrade_and_rebuild(
        "raid4",
        &["--level", "raid4", "--raid-devices", "4", "--chunk", "32K"],
        4,
        &[(3, Loss::Pull)],
        1,
    );
}

#[test]
fn raid5_degraded_and_rebuilt_under_io() {
    degrade_and_rebuild(
        "raid5",
        &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
        4,
        &[(2, Loss::Fail)],
        1,
    );
}

#[test]
fn raid6_two_failures_rebuilt_under_io() {
    degrade_and_rebuild(
        "raid6",
        &["--level", "raid6", "--raid-devices", "6", "--chunk", "32K"],
        6,
        &[(1, Loss::Fail), (4, Loss::Pull)],
        2,
    );
}

// ---------------------------------------------------------------------------
// Read errors.

/// Bad sectors that fail reads (`eio:read:RANGE`) on a member: reads
/// through NBD still return the right data, a CorrectedRead event names
/// the member, which stays active. Sectors that fail writes too
/// (`eio:both:RANGE:noremap`) cannot be corrected: that member is failed,
/// and the data still reads right. For raid1, raid5 and raid6; raid1 is
/// read by a lone reader, which always reads the first mirror (a deeper
/// queue spreads reads over both, and might never touch the bad sectors).
#[test]
fn read_errors_are_corrected_or_fail_the_member() {
    let dir = scratch("fail-eio");
    // (name, options, disks, member with read errors, member with write errors too)
    let cases: &[(&str, &[&str], usize, usize, usize)] = &[
        (
            "raid1",
            &["--level", "raid1", "--raid-devices", "2"],
            2,
            0,
            0,
        ),
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
            4,
            1,
            2,
        ),
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "5", "--chunk", "32K"],
            5,
            3,
            0,
        ),
    ];
    for (i, (name, options, disks, soft, hard)) in cases.iter().enumerate() {
        let files = create_array(dir.path(), &format!("{name}-m"), options, *disks, 16 * MIB);
        let members = paths(&files);
        let size = array_bytes(&members);
        let (img, data) = image(dir.path(), &format!("{name}.img"), 0xe10 + i as u64, size);
        let served = serve(dir.path(), &["--fault-injection"], &members);
        nbdcopy_in(&img, served.uri());
        let read_all = |uri: &str| match *name {
            "raid1" => nbdcopy_out_lone(uri, dir.path()),
            _ => nbdcopy_out(uri, dir.path()),
        };
        let off = data_offset_bytes(members[*soft]);

        // 256 KiB of the member's data area: several chunks, so data strips
        // (which reads touch) are among them whatever the layout.
        let fault = format!("eio:read:{}+256K", off + MIB);
        manage_ok(&served.control, &["--inject", members[*soft], &fault]);
        assert_same_bytes(
            &read_all(served.uri()),
            &data,
            &format!("{name}: reads with {fault} on {}", members[*soft]),
        );
        let status = array_status(&served.control);
        assert!(
            has_event(&status, "CorrectedRead", Some(members[*soft])),
            "{name}: no CorrectedRead event for {}: {:?}",
            members[*soft],
            status_events(&status)
        );
        assert!(
            !has_event(&status, "Fail", None),
            "{name}: a correctable read error failed a member: {:?}",
            status_events(&status)
        );
        assert!(
            member_state(&status, members[*soft])
                .0
                .starts_with("active sync"),
            "{name}"
        );
        assert!(
            status_whole_and_idle(&status),
            "{name}: {}",
            status["mdstat"]
        );
        // Only what was read was corrected: parity strips in the range stay
        // bad until written. Clear them, so that what follows is a single
        // fault (with another member failed, a bad parity sector would be
        // a second one, and an EIO the right answer).
        manage_ok(&served.control, &["--inject", members[*soft], "restore"]);

        let off = data_offset_bytes(members[*hard]);
        let fault = format!("eio:both:{}+256K:noremap", off + 3 * MIB);
        manage_ok(&served.control, &["--inject", members[*hard], &fault]);
        assert_same_bytes(
            &read_all(served.uri()),
            &data,
            &format!("{name}: reads with {fault} on {}", members[*hard]),
        );
        let status = wait_status(
            &served.control,
            &format!("{name}: {} failed", members[*hard]),
            Duration::from_secs(20),
            |s| has_event(s, "Fail", Some(members[*hard])),
        );
        assert_eq!(member_state(&status, members[*hard]).0, "faulty", "{name}");
        assert!(
            status["detail"]["state"]
                .as_str()
                .unwrap()
                .contains("degraded"),
            "{name}"
        );
        assert_same_bytes(
            &read_all(served.uri()),
            &data,
            &format!("{name}: with {} failed", members[*hard]),
        );
        served.stop();
        // Offline, without the failed member: the corrected one holds the
        // right data (for raid1, the other mirror alone would too, so the
        // corrected member is read alone when it is not the failed one).
        let remaining: Vec<&str> = members
            .iter()
            .enumerate()
            .filter(|(r, _)| r != hard)
            .map(|(_, m)| *m)
            .collect();
        assert_same_bytes(
            &copy_out(&remaining, dir.path()),
            &data,
            &format!("{name}: offline"),
        );
    }
}

// ---------------------------------------------------------------------------
// check and repair.

/// One array for the check/repair test.
#[derive(Clone, Copy)]
struct CheckCase {
    name: &'static str,
    options: &'static [&'static str],
    disks: usize,
    /// The member whose first chunk holds redundancy (parity, or a second
    /// mirror) in stripe 0: the one corrupted.
    victim: usize,
    /// md's exact mismatch_cnt for 16 KiB corrupted, where it is defined
    /// per page.
    expect: Option<u64>,
    /// Members that may be left out offline.
    losable: usize,
}

/// A region of redundancy (a parity strip, or the second mirror) is
/// corrupted behind the server's back (the member is a regular file: an
/// ordinary open for writing gets past the server's flock). Reads are not
/// affected; `--action check` counts the mismatch (md's mismatch_cnt: for
/// raid4/5/6, 8 sectors per 4 KiB page that disagrees) and changes nothing,
/// so a second check counts it again; `--action repair` fixes it; a check
/// then finds 0, and offline the parity agrees with the data everywhere.
#[test]
fn check_counts_corruption_and_repair_fixes_it() {
    use std::os::unix::fs::FileExt;
    let dir = scratch("fail-check");
    let case = |name, options, disks, victim, expect, losable| CheckCase {
        name,
        options,
        disks,
        victim,
        expect,
        losable,
    };
    let cases = [
        // left-symmetric raid5 on 4: stripe 0's parity is on the last member.
        case(
            "raid5",
            &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
            4,
            3,
            Some(32),
            1,
        ),
        // left-symmetric raid6 on 6: stripe 0's P is on member 5, Q on member 0.
        case(
            "raid6-q",
            &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
            6,
            0,
            Some(32),
            2,
        ),
        case(
            "raid6-p",
            &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
            6,
            5,
            Some(32),
            2,
        ),
        // raid4: parity is always on the last member.
        case(
            "raid4",
            &["--level", "raid4", "--raid-devices", "3", "--chunk", "64K"],
            3,
            2,
            Some(32),
            1,
        ),
        // raid1 reads the first mirror: corrupt the second. md counts raid1
        // mismatches per resync block, not per page: only > 0 is required.
        case(
            "raid1",
            &["--level", "raid1", "--raid-devices", "2"],
            2,
            1,
            None,
            1,
        ),
    ];
    for (i, c) in cases.iter().enumerate() {
        let CheckCase {
            name,
            options,
            disks,
            victim,
            expect,
            losable,
        } = *c;
        let files = create_array(dir.path(), &format!("{name}-m"), options, disks, 16 * MIB);
        let members = paths(&files);
        let size = array_bytes(&members);
        let (img, data) = image(dir.path(), &format!("{name}.img"), 0xc4ec + i as u64, size);
        let served = serve(dir.path(), &[], &members);
        nbdcopy_in(&img, served.uri());

        let check = |action: &str| -> u64 {
            let finished_before = status_events(&array_status(&served.control))
                .iter()
                .filter(|(e, _, _)| e == "RebuildFinished")
                .count();
            manage_ok(&served.control, &["--action", action]);
            let status = wait_status(
                &served.control,
                &format!("{name}: {action} to finish"),
                Duration::from_secs(60),
                |s| {
                    status_whole_and_idle(s)
                        && status_events(s)
                            .iter()
                            .filter(|(e, _, _)| e == "RebuildFinished")
                            .count()
                            > finished_before
                },
            );
            status["mismatch_cnt"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: no mismatch_cnt: {status}"))
        };
        assert_eq!(check("check"), 0, "{name}: check of a consistent array");

        // 16 KiB, page-aligned, 8 KiB into the member's first chunk.
        let at = data_offset_bytes(members[victim]) + 8192;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(members[victim])
            .unwrap();
        f.write_all_at(&random_bytes(0xbad + i as u64, 16 << 10), at)
            .unwrap();
        f.sync_all().unwrap();
        drop(f);
        // Redundancy only: reads are unchanged (a mirror's second copy is
        // redundancy only to a lone reader, which reads the first; md's
        // read_balance would hand a deeper queue either copy too).
        let read_all = if name == "raid1" {
            nbdcopy_out_lone
        } else {
            nbdcopy_out
        };
        assert_same_bytes(
            &read_all(served.uri(), dir.path()),
            &data,
            &format!(
                "{name}: reads after corrupting redundancy on {}",
                members[victim]
            ),
        );

        let first = check("check");
        match expect {
            Some(n) => assert_eq!(first, n, "{name}: mismatch_cnt after check"),
            None => assert!(first > 0, "{name}: check found no mismatch"),
        }
        assert_eq!(
            check("check"),
            first,
            "{name}: a second check (check must not repair)"
        );
        let repaired = check("repair");
        assert_eq!(repaired, first, "{name}: mismatch_cnt reported by repair");
        assert_eq!(check("check"), 0, "{name}: check after repair");
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir.path()),
            &data,
            &format!("{name}: after repair"),
        );
        // Refusals: one job at a time is not tested here (jobs are fast);
        // an unknown action is refused.
        manage_refused(&served.control, &["--action", "scrub"]);
        served.stop();
        assert_redundancy_consistent(&members, losable, Some(&data), dir.path());
    }
}

// ---------------------------------------------------------------------------
// Speed limits.

/// md's speed_limit_max holds a rebuild back: at 2000 KiB/s per member, a
/// rebuild of 64 MiB members progresses at about that rate (measured over
/// 3 s, within 50 %) and the status shows the limit and a speed near it;
/// 0 is refused, as md refuses it; raised, the rebuild finishes quickly.
#[test]
fn speed_limit_max_throttles_a_rebuild_and_raising_it_finishes_it() {
    let dir = scratch("fail-speed");
    let files = create_array(
        dir.path(),
        "m",
        &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
        4,
        64 * MIB,
    );
    let members = paths(&files);
    let spare = sparse_files(dir.path(), "s", &[64 * MIB]);
    let spare = spare[0].to_str().unwrap();
    let size = array_bytes(&members);
    let (img, data) = image(dir.path(), "a.img", 0x5eed, size);
    let served = serve(dir.path(), &["--fault-injection"], &members);
    nbdcopy_in(&img, served.uri());
    manage_ok(&served.control, &["--add", spare]);
    let limit = 2000u64;
    manage_ok(&served.control, &["--speed-limit-max", &limit.to_string()]);
    manage_refused(&served.control, &["--speed-limit-max", "0"]);
    let status = array_status(&served.control);
    assert_eq!(
        status["speed_limit_max_kib_per_s"], limit,
        "after a refused 0"
    );
    assert!(status_whole_and_idle(&status));

    manage_ok(&served.control, &["--fail", members[1]]);
    let first = wait_status(
        &served.control,
        "the rebuild to start",
        Duration::from_secs(20),
        |s| sync_line(s["mdstat"].as_str().unwrap()).is_some_and(|l| l.action == "recovery"),
    );
    let t1 = Instant::now();
    let l1 = sync_line(first["mdstat"].as_str().unwrap()).unwrap();
    // A measurement over 3 s, not a synchronisation.
    std::thread::sleep(Duration::from_secs(3));
    let second = array_status(&served.control);
    let t2 = Instant::now();
    let l2 = sync_line(second["mdstat"].as_str().unwrap()).unwrap_or_else(|| {
        panic!(
            "the rebuild ended within 3 s at {limit} KiB/s:\n{}",
            second["mdstat"]
        )
    });
    let rate = (l2.done_kib - l1.done_kib) as f64 / (t2 - t1).as_secs_f64();
    eprintln!("rebuild at {rate:.0} KiB/s per member (limit {limit}); status: {l2:?}");
    assert!(
        rate <= limit as f64 * 1.5 && rate >= limit as f64 * 0.5,
        "rebuild progress {rate:.0} KiB/s with speed_limit_max {limit}: {l1:?} -> {l2:?}"
    );
    assert!(
        l2.speed_kib_per_s <= limit * 3 / 2 && l2.speed_kib_per_s >= limit / 2,
        "status speed {} with speed_limit_max {limit}",
        l2.speed_kib_per_s
    );
    assert_eq!(
        l2.total_kib,
        64 * 1024 - data_offset_bytes(members[0]) / 1024,
        "{l2:?}"
    );

    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    let done = wait_status(
        &served.control,
        "the rebuild to finish once unthrottled",
        Duration::from_secs(30),
        |s| status_whole_and_idle(s) && has_event(s, "SpareActive", Some(spare)),
    );
    assert_eq!(done["speed_limit_max_kib_per_s"], 200000);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "after the rebuild",
    );
    served.stop();
    let now = [members[0], spare, members[2], members[3]];
    assert_redundancy_consistent(&now, 1, Some(&data), dir.path());
}

// ---------------------------------------------------------------------------
// The status command.

/// `uraid status --json` shows, next to mdstat and detail, the event log,
/// mismatch_cnt and the speed limits (README: "then: uraid status --json
/// (mismatch_cnt)"; docs/architecture/members-and-jobs.md: events "kept
/// (256) for `uraid status --json`").
#[test]
fn status_json_shows_events_mismatch_cnt_and_speed_limits() {
    let dir = scratch("fail-status");
    let files = create_array(
        dir.path(),
        "m",
        &["--level", "raid5", "--raid-devices", "3"],
        3,
        16 * MIB,
    );
    let members = paths(&files);
    let spare = sparse_files(dir.path(), "s", &[16 * MIB]);
    let served = serve(dir.path(), &[], &members);
    manage_ok(&served.control, &["--add", spare[0].to_str().unwrap()]);
    manage_ok(&served.control, &["--speed-limit-max", "12345"]);
    let out = run_limited_ok(
        uraid()
            .args(["status", "--json", "--control"])
            .arg(&served.control),
        Duration::from_secs(20),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = &v[0];
    let missing: Vec<&str> = STATUS_EXTRA_FIELDS
        .iter()
        .copied()
        .filter(|k| entry.get(k).is_none())
        .collect();
    served.stop();
    assert!(
        missing.is_empty(),
        "uraid status --json lacks {missing:?}; its keys: {:?}",
        entry.as_object().map(|o| o.keys().collect::<Vec<_>>())
    );
    assert!(
        entry["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["event"] == "SpareAdded")),
        "{entry}"
    );
    assert_eq!(entry["speed_limit_max_kib_per_s"], 12345, "{entry}");
    assert_eq!(entry["mismatch_cnt"], 0, "{entry}");
}

// ---------------------------------------------------------------------------
// A throttled member, slowed down and sped up again while served.

/// `--inject DEV throttle:RATE` slows a member down live: a check, which
/// reads every member whole, takes at least the member's bytes over the
/// rate; status shows the throttle; a bad rate is refused and changes
/// nothing; `throttle:off` and `restore` lift it.
#[test]
fn a_member_throttled_live_slows_a_check_and_lifts_again() {
    let dir = scratch("fail-throttle");
    let files = create_array(
        dir.path(),
        "m",
        &["--level", "raid1", "--raid-devices", "2"],
        2,
        16 * MIB,
    );
    let members = paths(&files);
    let served = serve(dir.path(), &["--fault-injection"], &members);
    let slow = members[1];
    let faults_of = |status: &serde_json::Value| -> Vec<String> {
        status["detail"]["injected_faults"]
            .as_object()
            .and_then(|by_path| {
                by_path
                    .iter()
                    .find(|(path, _)| same_path(path, slow))
                    .map(|(_, faults)| faults.clone())
            })
            .and_then(|faults| serde_json::from_value(faults).ok())
            .unwrap_or_default()
    };
    let timed_check = || -> Duration {
        let finished_before = status_events(&array_status(&served.control))
            .iter()
            .filter(|(e, _, _)| e == "RebuildFinished")
            .count();
        let start = Instant::now();
        manage_ok(&served.control, &["--action", "check"]);
        wait_status(
            &served.control,
            "the check to finish",
            Duration::from_secs(60),
            |s| {
                status_whole_and_idle(s)
                    && status_events(s)
                        .iter()
                        .filter(|(e, _, _)| e == "RebuildFinished")
                        .count()
                        > finished_before
            },
        );
        start.elapsed()
    };

    let reply = manage_ok(&served.control, &["--inject", slow, "throttle:4M"]);
    assert!(reply.contains("throttle:4M"), "{reply}");
    let status = array_status(&served.control);
    assert_eq!(faults_of(&status), ["throttle:4M"], "{}", status["detail"]);
    let out = run_limited_ok(
        uraid().args(["detail", "--control"]).arg(&served.control),
        Duration::from_secs(20),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Injected faults"), "{text}");
    assert!(text.contains("throttle:4M"), "{text}");

    for bad in ["throttle:0", "throttle:abc"] {
        let err = manage_refused(&served.control, &["--inject", slow, bad]);
        assert!(err.contains(bad), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(
            faults_of(&array_status(&served.control)),
            ["throttle:4M"],
            "after a refused {bad}"
        );
    }

    // About 15 MiB of data area at 4 MiB/s: close to 4 s; 2 s is a floor
    // that only a throttle that is not applied would miss.
    let throttled = timed_check();
    eprintln!("check with {slow} at throttle:4M took {throttled:?}");
    assert!(throttled >= Duration::from_secs(2), "{throttled:?}");

    manage_ok(&served.control, &["--inject", slow, "throttle:off"]);
    assert!(faults_of(&array_status(&served.control)).is_empty());
    let free = timed_check();
    eprintln!("check unthrottled took {free:?}");
    assert!(free < throttled, "{free:?} against {throttled:?}");

    manage_ok(&served.control, &["--inject", slow, "throttle:2M:iops=100"]);
    assert_eq!(
        faults_of(&array_status(&served.control)),
        ["throttle:2M:iops=100"]
    );
    manage_ok(&served.control, &["--inject", slow, "restore"]);
    let status = array_status(&served.control);
    assert!(faults_of(&status).is_empty());
    assert!(status["detail"].get("injected_faults").is_none());
    served.stop();
}
