//! `uraid serve` end to end, on the host, with real NBD clients.
//!
//! Every test creates arrays on sparse member files in a /tmp scratch folder,
//! starts `uraid serve` as a child process on a unix socket, waits for its
//! `uraid: serving` line, drives it with Debian's client tools (nbdinfo,
//! nbdcopy, nbdsh, fio's nbd engine, nbdfuse + loop + ext4) and stops it with
//! SIGTERM, requiring exit status 0 (the `Served` guard in tests/common stops
//! it on failure too). Afterwards the members are checked offline: state
//! clean, `uraid copy-out` equal to what the clients wrote, and parity
//! consistent (copy-out with members left out reads the same bytes).
//! A missing tool fails the test with its package: a pass must mean checked.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn nbdinfo_json(uri: &str) -> serde_json::Value {
    let nbdinfo = client_tool("nbdinfo", "libnbd-bin");
    let out = run_limited_ok(
        Command::new(nbdinfo).arg("--json").arg(uri),
        Duration::from_secs(30),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json output");
    v["exports"][0].clone()
}

fn strs(v: &[PathBuf]) -> Vec<&str> {
    paths(v)
}

/// The members without the given roles (a degraded set).
fn without<'a>(members: &[&'a str], lost: &[usize]) -> Vec<&'a str> {
    members
        .iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(_, m)| *m)
        .collect()
}

// ---------------------------------------------------------------------------

/// The export's size is the array's, for every level, and it offers flush,
/// FUA and multi-conn (an md array is one coherent device, so several
/// connections may be used at once); over TCP too; `--read-only` exports a
/// read-only device and writes nothing at all to the members.
#[test]
fn nbdinfo_reports_size_and_flags_for_each_level() {
    let dir = scratch("serve-info");
    let geometries: &[(&str, &[&str], usize)] = &[
        ("linear", &["--level", "linear", "--raid-devices", "2"], 2),
        (
            "raid0",
            &["--level", "raid0", "--raid-devices", "3", "--chunk", "64K"],
            3,
        ),
        ("raid1", &["--level", "raid1", "--raid-devices", "2"], 2),
        (
            "raid4",
            &["--level", "raid4", "--raid-devices", "3", "--chunk", "16K"],
            3,
        ),
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
            4,
        ),
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "5", "--chunk", "32K"],
            5,
        ),
        (
            "raid10",
            &["--level", "raid10", "--raid-devices", "4", "--layout", "n2"],
            4,
        ),
        (
            "raid10-f2-odd",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "3",
                "--layout",
                "f2",
                "--chunk",
                "64K",
            ],
            3,
        ),
    ];
    for (name, options, disks) in geometries {
        let members = create_array(dir.path(), &format!("{name}-m"), options, *disks, 16 * MIB);
        let members = strs(&members);
        let size = array_bytes(&members);
        let served = serve(dir.path(), &[], &members);
        let export = nbdinfo_json(served.uri());
        assert_eq!(
            export["export-size"].as_u64(),
            Some(size),
            "{name}: export size, array is {size}: {export}"
        );
        for key in ["can_flush", "can_fua", "can_multi_conn"] {
            assert_eq!(export[key], true, "{name}: {key} in {export}");
        }
        assert_eq!(export["is_read_only"], false, "{name}: {export}");
        let detail = served.detail_json();
        assert_eq!(
            detail["array_size_kib"].as_u64().map(|k| k * 1024),
            Some(size),
            "{name}: detail --control: {detail}"
        );
        served.stop();
        assert!(
            examine_states(&members).iter().all(|s| s == "clean"),
            "{name}: not clean after stop: {:?}",
            examine_states(&members)
        );
    }

    // TCP, on a port that was free a moment ago.
    let members = create_array(
        dir.path(),
        "tcp-m",
        &["--level", "raid5", "--raid-devices", "3"],
        3,
        16 * MIB,
    );
    let members = strs(&members);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let served = serve_tcp(dir.path(), port, &[], &members);
    let export = nbdinfo_json(served.uri());
    assert_eq!(
        export["export-size"].as_u64(),
        Some(array_bytes(&members)),
        "{export}"
    );
    served.stop();

    // --read-only: md does not write superblocks of a read-only array, so
    // the members must stay byte-identical; writes are refused with EPERM.
    let members = create_array(
        dir.path(),
        "ro-m",
        &["--level", "raid6", "--raid-devices", "4", "--chunk", "16K"],
        4,
        16 * MIB,
    );
    let members = strs(&members);
    let size = array_bytes(&members);
    let (img, data) = image(dir.path(), "ro.img", 11, size);
    let mut args = vec!["copy-in", "--input", img.to_str().unwrap()];
    args.extend_from_slice(&members);
    uraid_ok(&args);
    let before: Vec<String> = members.iter().map(|m| sha256_file(Path::new(m))).collect();
    let served = serve(dir.path(), &["--read-only"], &members);
    let export = nbdinfo_json(served.uri());
    assert_eq!(export["is_read_only"], true, "{export}");
    nbdsh_script(
        served.uri(),
        r#"
import errno, nbd
h.connect_uri(URI)
assert h.is_read_only()
try:
    h.pwrite(bytes(4096), 0)
    raise AssertionError("a write to a read-only export succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
h.shutdown()
"#,
        Duration::from_secs(30),
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "read-only export",
    );
    served.stop();
    let after: Vec<String> = members.iter().map(|m| sha256_file(Path::new(m))).collect();
    assert_eq!(
        before, after,
        "serving --read-only changed the member files"
    );
}

/// nbdcopy in; SIGTERM marks the array clean; the members hold the image
/// (copy-out, also with members left out); a second serve reads it back.
/// The raid6's, raid1's and raid0's members are in memory (/dev/shm):
/// nbdcopy's big writes there go from the socket through a pipe into the
/// mapped members, raid6's whole rows with their parity computed in place,
/// and a copy out in 4K requests is served inline, many replies per send.
#[test]
fn nbdcopy_round_trip_survives_a_restart() {
    let dir = scratch("serve-copy");
    let geometries: &[(&str, &[&str], usize, usize)] = &[
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
            4,
            1,
        ),
        (
            "raid6",
            &[
                "--level",
                "raid6",
                "--raid-devices",
                "5",
                "--chunk",
                "16K",
                "--layout",
                "right-asymmetric",
            ],
            5,
            2,
        ),
        (
            "raid10",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "3",
                "--layout",
                "n2",
                "--chunk",
                "32K",
            ],
            3,
            1,
        ),
        ("raid1", &["--level", "raid1", "--raid-devices", "3"], 3, 2),
        (
            "raid0",
            &["--level", "raid0", "--raid-devices", "2", "--chunk", "64K"],
            2,
            0,
        ),
    ];
    for (i, (name, options, disks, losable)) in geometries.iter().enumerate() {
        // A folder per array, removed after it: /dev/shm may be small.
        let shm = tempfile::Builder::new()
            .prefix("uraid-serve-copy-")
            .tempdir_in("/dev/shm")
            .expect("tempdir in /dev/shm");
        let in_memory = matches!(*name, "raid1" | "raid0" | "raid6");
        let members_dir = if in_memory { shm.path() } else { dir.path() };
        let members = create_array(members_dir, &format!("{name}-m"), options, *disks, 32 * MIB);
        let members = strs(&members);
        let size = array_bytes(&members);
        let (img, data) = image(dir.path(), &format!("{name}.img"), 100 + i as u64, size);

        let served = serve(dir.path(), &[], &members);
        nbdcopy_in(&img, served.uri());
        served.stop();
        let detail = detail_offline(&members);
        assert_eq!(detail["state"], "clean", "{name}: after SIGTERM: {detail}");
        assert_eq!(examine_states(&members), vec!["clean"; *disks], "{name}");
        assert_redundancy_consistent(&members, *losable, Some(&data), dir.path());

        let served = serve(dir.path(), &[], &members);
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir.path()),
            &data,
            &format!("{name}: nbdcopy out after a restart"),
        );
        if in_memory {
            assert_same_bytes(
                &nbdcopy_out_small(served.uri(), dir.path()),
                &data,
                &format!("{name}: nbdcopy out in 4K requests"),
            );
        }
        served.stop();
        assert_eq!(examine_states(&members), vec!["clean"; *disks], "{name}");
    }
}

/// fio's JSON report; the nbd engine prints a line per connection first.
fn fio_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in fio's output:\n{text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio JSON output: {e}\n{text}"))
}

/// fio: four jobs, each its own connection and region (verification needs
/// disjoint regions), random writes of mixed sizes (4k..128k) with crc32c
/// headers, verified in the same run; then, after a restart of the server,
/// a verify-only pass over what the first run wrote. Finally parity must be
/// consistent offline.
#[test]
fn fio_mixed_sizes_on_four_connections_verified_across_a_restart() {
    let fio = client_tool("fio", "fio");
    let dir = scratch("serve-fio");
    let geometries: &[(&str, &[&str], usize, usize)] = &[
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "5", "--chunk", "64K"],
            5,
            1,
        ),
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "6", "--chunk", "32K"],
            6,
            2,
        ),
    ];
    for (name, options, disks, losable) in geometries {
        let members = create_array(dir.path(), &format!("{name}-m"), options, *disks, 32 * MIB);
        let members = strs(&members);
        let size = array_bytes(&members);
        let region = size / 4 / (128 << 10) * (128 << 10);
        let fio_run = |uri: &str, extra: &[&str]| {
            let mut cmd = Command::new(&fio);
            // Verification state files go into the working directory: keep
            // them out of the source tree, and do not save them at all.
            cmd.current_dir(dir.path())
                .arg("--verify_state_save=0")
                .arg("--name=nbd")
                .arg("--ioengine=nbd")
                .arg(format!("--uri={uri}"))
                .arg("--numjobs=4")
                .arg(format!("--size={region}"))
                .arg(format!("--offset_increment={region}"))
                .arg("--rw=randwrite")
                .arg("--bssplit=4k/25:8k/15:12k/10:16k/15:64k/20:128k/15")
                .arg("--iodepth=8")
                .arg("--verify=crc32c")
                .arg("--randseed=4242")
                .arg("--runtime=150")
                .arg("--group_reporting")
                .arg("--output-format=json")
                .args(extra);
            let out = run_limited_ok(&mut cmd, Duration::from_secs(180));
            fio_json(&out.stdout)
        };

        let served = serve(dir.path(), &[], &members);
        let json = fio_run(served.uri(), &["--do_verify=1"]);
        let job = &json["jobs"][0];
        assert_eq!(job["error"], 0, "{name}: fio write+verify failed: {job}");
        // All of each region written: verify_only below needs the whole run.
        assert_eq!(
            job["write"]["io_bytes"].as_u64(),
            Some(4 * region),
            "{name}: fio stopped early (runtime?): {job}"
        );
        assert_eq!(
            job["read"]["io_bytes"].as_u64(),
            Some(4 * region),
            "{name}: fio verified too little: {job}"
        );
        served.stop();
        assert_eq!(examine_states(&members), vec!["clean"; *disks], "{name}");

        let served = serve(dir.path(), &[], &members);
        let json = fio_run(served.uri(), &["--verify_only=1"]);
        let job = &json["jobs"][0];
        assert_eq!(
            job["error"], 0,
            "{name}: fio verify_only after a restart failed: {job}"
        );
        assert_eq!(
            job["read"]["io_bytes"].as_u64(),
            Some(4 * region),
            "{name}: fio verified too little: {job}"
        );
        served.stop();
        assert_redundancy_consistent(&members, *losable, None, dir.path());
    }
}

/// Writes whose offsets and lengths are multiples of 512 but not of the
/// chunk, across chunk and stripe boundaries and up to the end of the
/// array, with and without FUA, many in flight on two connections, flushes;
/// everything read back through NBD and, after a clean stop, offline with
/// every member (and raid6 pairs) left out in turn.
#[test]
fn unaligned_and_fua_writes_through_nbdsh() {
    let dir = scratch("serve-unaligned");
    // (name, options, disks, chunk, data bytes per stripe, losable)
    type Geometry<'a> = (&'a str, &'a [&'a str], usize, u64, u64, usize);
    let geometries: &[Geometry] = &[
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "5", "--chunk", "64K"],
            5,
            64 << 10,
            4 * (64 << 10),
            1,
        ),
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "6", "--chunk", "16K"],
            6,
            16 << 10,
            4 * (16 << 10),
            2,
        ),
        (
            "raid4",
            &["--level", "raid4", "--raid-devices", "3", "--chunk", "8K"],
            3,
            8 << 10,
            2 * (8 << 10),
            1,
        ),
        (
            "raid10",
            &[
                "--level",
                "raid10",
                "--raid-devices",
                "3",
                "--layout",
                "f2",
                "--chunk",
                "32K",
            ],
            3,
            32 << 10,
            3 * (32 << 10),
            1,
        ),
        (
            "raid0",
            &["--level", "raid0", "--raid-devices", "3", "--chunk", "4K"],
            3,
            4 << 10,
            3 * (4 << 10),
            0,
        ),
    ];
    for (i, (name, options, disks, chunk, width, losable)) in geometries.iter().enumerate() {
        let members = create_array(dir.path(), &format!("{name}-m"), options, *disks, 16 * MIB);
        let members = strs(&members);
        let size = array_bytes(&members);
        let (img, _) = image(dir.path(), &format!("{name}.img"), 200 + i as u64, size);
        let served = serve(dir.path(), &[], &members);
        nbdcopy_in(&img, served.uri());
        let model = nbd_patch(
            served.uri(),
            &img,
            &dir.path().join(format!("{name}.model")),
            300 + i as u64,
            *chunk,
            *width,
            120,
        );
        served.stop();
        assert_eq!(examine_states(&members), vec!["clean"; *disks], "{name}");
        assert_redundancy_consistent(&members, *losable, Some(&model), dir.path());
    }
}

/// The `[n/m] [UU_U]` part of an mdstat line.
fn mdstat_health(disks: usize, lost: &[usize]) -> String {
    let flags: String = (0..disks)
        .map(|i| if lost.contains(&i) { '_' } else { 'U' })
        .collect();
    format!("[{disks}/{}] [{flags}]", disks - lost.len())
}

/// Checks `status` and `detail --json` over the control socket.
fn check_status(served: &Served, level: &str, disks: usize, lost: &[usize], members: &[&str]) {
    let text = served.status_text();
    assert!(
        text.lines().any(|l| l.contains(&format!("active {level}"))),
        "status lacks `active {level}`:\n{text}"
    );
    let health = mdstat_health(disks, lost);
    assert!(
        text.lines().any(|l| l.contains(&health)),
        "status lacks `{health}`:\n{text}"
    );
    let size_kib = array_bytes(members) / 1024;
    assert!(
        text.contains(&format!("{size_kib} blocks")),
        "status lacks `{size_kib} blocks`:\n{text}"
    );
    let out = run_limited_ok(
        uraid()
            .args(["status", "--json", "--control"])
            .arg(&served.control),
        Duration::from_secs(20),
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });

    let detail = served.detail_json();
    assert_eq!(detail["raid_level"], level, "{detail}");
    assert_eq!(
        detail["raid_devices"].as_u64(),
        Some(disks as u64),
        "{detail}"
    );
    assert_eq!(
        detail["active_devices"].as_u64(),
        Some((disks - lost.len()) as u64),
        "{detail}"
    );
    assert_eq!(
        detail["array_size_kib"].as_u64(),
        Some(size_kib),
        "{detail}"
    );
    let state = detail["state"].as_str().unwrap();
    assert_eq!(
        state.contains("degraded"),
        !lost.is_empty(),
        "state {state:?} with {} lost: {detail}",
        lost.len()
    );
    let rows = detail["devices"].as_array().expect("devices");
    let roles: Vec<usize> = (0..disks).filter(|r| !lost.contains(r)).collect();
    for (role, path) in roles.into_iter().zip(members) {
        let row = rows
            .iter()
            .find(|r| r["raid_device"].as_u64() == Some(role as u64) && r["path"].is_string());
        let row = row.unwrap_or_else(|| panic!("no device row for role {role}: {detail}"));
        assert!(
            row["state"].as_str().unwrap().starts_with("active sync"),
            "role {role}: {row}"
        );
        assert_eq!(
            std::fs::canonicalize(row["path"].as_str().unwrap()).ok(),
            std::fs::canonicalize(path).ok(),
            "role {role}: {row}"
        );
    }
}

#[test]
fn status_and_detail_while_serving() {
    let dir = scratch("serve-status");
    let members = create_array(
        dir.path(),
        "m",
        &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
        6,
        16 * MIB,
    );
    let members = strs(&members);
    let served = serve(dir.path(), &[], &members);
    check_status(&served, "raid6", 6, &[], &members);
    served.stop();
}

/// Writes an image, then serves without the `lost` members: reads match,
/// status shows the holes, more writes go in degraded; then with every
/// member given again the left-out ones are stale (not active) and the
/// latest data is what is read.
fn degraded_round(
    level: &str,
    options: &[&str],
    disks: usize,
    chunk: u64,
    width: u64,
    lost: &[usize],
    seed: u64,
) {
    let dir = scratch(&format!("serve-degraded-{level}"));
    let members = create_array(dir.path(), "m", options, disks, 24 * MIB);
    let all = strs(&members);
    let present = without(&all, lost);
    let size = array_bytes(&all);
    let (img, data) = image(dir.path(), "a.img", seed, size);

    let served = serve(dir.path(), &[], &all);
    nbdcopy_in(&img, served.uri());
    served.stop();

    let served = serve(dir.path(), &[], &present);
    check_status(&served, level, disks, lost, &present);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "degraded read",
    );
    // Partial-stripe writes while degraded need the lost strips' contents
    // reconstructed to update parity.
    let model = nbd_patch(
        served.uri(),
        &img,
        &dir.path().join("b.img"),
        seed + 1,
        chunk,
        width,
        60,
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &model,
        "degraded read after degraded writes",
    );
    served.stop();
    let detail = detail_offline(&present);
    assert_eq!(detail["state"], "clean, degraded", "{detail}");
    assert_eq!(examine_states(&present), vec!["clean"; present.len()]);

    // Every member again: the left-out ones are older than the others.
    let detail = detail_offline(&all);
    assert_eq!(
        detail["active_devices"].as_u64(),
        Some(present.len() as u64),
        "stale members counted as active: {detail}"
    );
    for &i in lost {
        let row = detail["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["path"].as_str() == Some(all[i]))
            .unwrap_or_else(|| panic!("no row for stale member {}: {detail}", all[i]));
        assert!(
            !row["state"].as_str().unwrap().starts_with("active"),
            "stale member {} shown as {row}",
            all[i]
        );
    }
    let served = serve(dir.path(), &[], &all);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &model,
        "read with the stale members given again",
    );
    // uraid may rebuild onto the stale members (as onto spares): let that
    // finish, then the result must be consistent either way.
    wait_until_in_sync(&served, Duration::from_secs(120));
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &model,
        "read after any rebuild onto the stale members",
    );
    served.stop();
    assert_same_bytes(
        &copy_out(&all, dir.path()),
        &model,
        "copy-out with the stale members given",
    );
    assert_same_bytes(
        &copy_out(&present, dir.path()),
        &model,
        "copy-out of the fresh members",
    );
    let detail = detail_offline(&all);
    if detail["active_devices"].as_u64() == Some(disks as u64) {
        // Rebuilt: every member holds current data or parity again.
        assert_eq!(detail["state"], "clean", "{detail}");
        assert_redundancy_consistent(&all, lost.len(), Some(&model), dir.path());
    } else {
        assert_eq!(
            detail["active_devices"].as_u64(),
            Some(present.len() as u64),
            "a partial rebuild after waiting for it: {detail}"
        );
    }
}

#[test]
fn degraded_raid6_two_missing_then_stale_members_return() {
    degraded_round(
        "raid6",
        &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
        6,
        64 << 10,
        4 * (64 << 10),
        &[1, 4],
        400,
    );
}

#[test]
fn degraded_raid5_one_missing_then_stale_member_returns() {
    degraded_round(
        "raid5",
        &["--level", "raid5", "--raid-devices", "4", "--chunk", "32K"],
        4,
        32 << 10,
        3 * (32 << 10),
        &[2],
        500,
    );
}

/// SIGKILL in the middle of writes leaves the array dirty (State : active);
/// the next serve resyncs it in the background while serving, data flushed
/// before the crash survives, and after SIGTERM the array is clean and its
/// parity consistent — including a stripe torn on purpose while the array
/// was down, which only a resync repairs.
#[test]
fn crash_mid_write_then_background_resync() {
    let dir = scratch("serve-crash");
    let geometries: &[(&str, &[&str], usize, u64, usize)] = &[
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "5", "--chunk", "64K"],
            5,
            4 * (64 << 10),
            1,
        ),
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "6", "--chunk", "32K"],
            6,
            4 * (32 << 10),
            2,
        ),
    ];
    for (i, (name, options, disks, width, losable)) in geometries.iter().enumerate() {
        let member_files =
            create_array(dir.path(), &format!("{name}-m"), options, *disks, 32 * MIB);
        let members = strs(&member_files);
        let size = array_bytes(&members);
        let (img, data) = image(dir.path(), &format!("{name}.img"), 600 + i as u64, size);
        // The restart after the crash reuses the socket paths, which the
        // killed server left behind.
        let sock = dir.path().join(format!("{name}.sock"));
        let control = dir.path().join(format!("{name}.ctl"));
        let served = try_serve_at(&sock, &control, &[], &members)
            .unwrap_or_else(|e| panic!("{name}: serve: {e:?}"));
        nbdcopy_in(&img, served.uri());
        crash_while_hammering(served, 700 + i as u64, *width);

        assert_eq!(
            examine_state_lines(&members),
            vec!["active"; *disks],
            "{name}: examine after SIGKILL"
        );
        assert_eq!(
            examine_states(&members),
            vec!["active"; *disks],
            "{name}: examine --json after SIGKILL"
        );
        let detail = detail_offline(&members);
        assert!(
            detail["state"].as_str().unwrap().starts_with("active"),
            "{name}: detail after SIGKILL: {detail}"
        );
        tear_a_stripe(&member_files[1]);

        let served = try_serve_at(&sock, &control, &[], &members).unwrap_or_else(|e| {
            panic!("{name}: serve on the socket paths a killed server left: {e:?}")
        });
        let status = served.status_text();
        assert!(
            !status.contains("resync") || status.contains("resync ="),
            "{name}: a resync in progress shows as `resync = N%`:\n{status}"
        );
        // Served while resyncing: the flushed first half reads back at once.
        let half = (size / 2) as usize;
        let got = nbdcopy_out(served.uri(), dir.path());
        assert_same_bytes(
            &got[..half],
            &data[..half],
            &format!("{name}: first half (flushed before the crash)"),
        );
        let saw_resync = wait_until_in_sync(&served, Duration::from_secs(120));
        eprintln!(
            "{name}: resync {}",
            if saw_resync {
                "observed in status"
            } else {
                "already finished at the first look"
            }
        );
        served.stop();
        assert_eq!(
            examine_states(&members),
            vec!["clean"; *disks],
            "{name}: after the resync and SIGTERM"
        );
        let whole = assert_redundancy_consistent(&members, *losable, None, dir.path());
        assert_same_bytes(
            &whole[..half],
            &data[..half],
            &format!("{name}: first half offline"),
        );
    }
}

/// The percentage in a `resync = 12.5%` status line.
fn resync_percent(status: &str) -> Option<f64> {
    let rest = &status[status.find("resync =")? + "resync =".len()..];
    rest.trim_start().split('%').next()?.trim().parse().ok()
}

/// A dirty array big enough that its resync takes a while (6 sparse
/// members of 512 MiB, about 2 GiB to read and check): the next serve is
/// ready while the resync runs (status shows its progress), serves reads
/// and writes meanwhile, and a SIGTERM in the middle leaves the array dirty,
/// as md does (it records a checkpoint and does not claim a clean array it
/// has not finished checking); a third serve finishes it and stops clean.
#[test]
fn resync_runs_in_the_background_and_a_stop_keeps_it_dirty() {
    let dir = scratch("serve-bg-resync");
    // --assume-clean: all-zero members are a consistent raid6 (P = Q = 0).
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "raid6",
            "--raid-devices",
            "6",
            "--chunk",
            "64K",
            "--assume-clean",
        ],
        6,
        512 * MIB,
    );
    let members = strs(&members);
    let served = serve(dir.path(), &[], &members);
    served.kill();
    assert_eq!(
        examine_states(&members),
        vec!["active"; 6],
        "a killed server leaves the array dirty"
    );

    let served = serve(dir.path(), &[], &members);
    let status = served.status_text();
    let percent = resync_percent(&status).unwrap_or_else(|| {
        panic!("serving a dirty array: no `resync = N%` in status right after serving:\n{status}")
    });
    let detail = served.detail_json();
    assert!(
        detail["state"].as_str().unwrap().contains("resync"),
        "detail state during the resync: {detail}"
    );
    // I/O while the resync runs, near the start (resynced already) and the
    // end (not yet) of the array.
    nbdsh_script(
        served.uri(),
        r#"
import nbd, random
h.connect_uri(URI)
size = h.get_size()
rng = random.Random(5)
for off in (4096 * 3 + 512, size // 2 - 1536, size - 300 * 1024):
    data = rng.randbytes(200 * 1024)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA)
    assert h.pread(len(data), off) == data, off
    assert h.pread(4096, off + len(data)) == bytes(4096), "after %d" % off
h.flush()
h.shutdown()
"#,
        Duration::from_secs(60),
    );
    let status = served.status_text();
    let percent_before_stop = resync_percent(&status);
    served.stop();
    eprintln!(
        "resync at {percent}% right after serving, {percent_before_stop:?}% just before SIGTERM"
    );
    if percent_before_stop.is_some_and(|p| p < 50.0) {
        assert_eq!(
            examine_states(&members),
            vec!["active"; 6],
            "stopped mid-resync ({status}) but marked clean"
        );
    }

    let served = serve(dir.path(), &[], &members);
    wait_until_in_sync(&served, Duration::from_secs(180));
    nbdsh_script(
        served.uri(),
        r#"
import random
h.connect_uri(URI)
size = h.get_size()
rng = random.Random(5)
for off in (4096 * 3 + 512, size // 2 - 1536, size - 300 * 1024):
    assert h.pread(200 * 1024, off) == rng.randbytes(200 * 1024), off
h.shutdown()
"#,
        Duration::from_secs(60),
    );
    served.stop();
    assert_eq!(
        examine_states(&members),
        vec!["clean"; 6],
        "after the resync finished and SIGTERM"
    );
}

// ---------------------------------------------------------------------------
// ext4 through nbdfuse and a loop device.

/// A tree of 200 files of random sizes (some empty, some over a stripe)
/// in 10 folders: relative path -> contents.
fn file_tree() -> Vec<(String, Vec<u8>)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(77);
    (0..200)
        .map(|i| {
            let len = match i % 10 {
                0 => 0,
                1 => rng.gen_range(1..512),
                _ => rng.gen_range(1..600 << 10),
            };
            (format!("d{}/f{i:03}", i % 10), random_bytes(1000 + i, len))
        })
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(data))
}

/// mkfs.ext4 on a loop device over nbdfuse's file of a served raid6; a tree
/// of files written, unmounted, the server restarted, mounted again and every
/// file's sha256 compared; e2fsck -fn clean; everything torn down and the
/// server stopped cleanly; then the array is checked offline.
#[test]
fn ext4_through_nbdfuse_and_loop() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (loop devices, mount); CI runs it as root"
    );
    let dir = scratch("serve-ext4");
    let members = create_array(
        dir.path(),
        "m",
        &["--level", "raid6", "--raid-devices", "6", "--chunk", "64K"],
        6,
        48 * MIB,
    );
    let members = strs(&members);
    let size = array_bytes(&members);
    let fs_dir = dir.path().join("fs");
    let tree = file_tree();

    let served = serve(dir.path(), &[], &members);
    let mut stack = Stack::attach(dir.path(), served.uri(), size);
    sh_ok(
        Command::new(client_tool("mkfs.ext4", "e2fsprogs"))
            .args(["-q", "-F"])
            .arg(stack.dev()),
    );
    stack.mount(&fs_dir);
    for (rel, data) in &tree {
        let path = fs_dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, data).unwrap();
    }
    sh_ok(&mut Command::new("sync"));
    stack.detach(true);
    served.stop();
    assert_eq!(examine_states(&members), vec!["clean"; 6]);

    let served = serve(dir.path(), &[], &members);
    let mut stack = Stack::attach(dir.path(), served.uri(), size);
    stack.mount(&fs_dir);
    for (rel, data) in &tree {
        let got = std::fs::read(fs_dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(
            sha256_hex(&got),
            sha256_hex(data),
            "{rel} differs after remounting on a restarted server"
        );
    }
    stack.umount();
    let out = run_limited(
        Command::new(client_tool("e2fsck", "e2fsprogs"))
            .arg("-fn")
            .arg(stack.dev()),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "e2fsck -fn found problems ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    stack.detach(true);
    served.stop();
    assert_eq!(examine_states(&members), vec!["clean"; 6]);
    assert_redundancy_consistent(&members[..], 1, None, dir.path());
}

// ---------------------------------------------------------------------------
// Refusals.

/// `uraid serve` must refuse: non-zero exit, one line `uraid: ...` on
/// stderr. A server that starts serving instead is stopped and fails the test.
fn serve_refused(dir: &Path, members: &[&str], why: &str) {
    match try_serve(dir, &[], members) {
        Ok(served) => {
            let stderr = served.stderr();
            served.stop();
            panic!("{why}: uraid serve {members:?} served instead of refusing; stderr:\n{stderr}");
        }
        Err((status, stderr)) => {
            assert!(!status.success(), "{why}: exit status {status}");
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(
                lines.len(),
                1,
                "{why}: expected one line on stderr, got {stderr:?}"
            );
            assert!(lines[0].starts_with("uraid: "), "{why}: {stderr:?}");
        }
    }
}

#[test]
fn bad_member_sets_are_refused_and_left_untouched() {
    let dir = scratch("serve-refuse");
    let a = create_array(
        dir.path(),
        "a",
        &["--level", "raid5", "--raid-devices", "3"],
        3,
        16 * MIB,
    );
    let b = create_array(
        dir.path(),
        "b",
        &["--level", "raid5", "--raid-devices", "3"],
        3,
        16 * MIB,
    );
    let c = create_array(
        dir.path(),
        "c",
        &["--level", "raid6", "--raid-devices", "5"],
        5,
        16 * MIB,
    );
    let junk = dir.path().join("junk");
    std::fs::write(&junk, random_bytes(9, 16 * MIB as usize)).unwrap();
    let (a, b, c) = (strs(&a), strs(&b), strs(&c));
    let junk = junk.to_str().unwrap();
    let alias = dir.path().join(".").join("a1");
    let alias = alias.to_str().unwrap();
    let absent = dir.path().join("absent");
    let absent = absent.to_str().unwrap();

    let all_files: Vec<&str> = a
        .iter()
        .chain(&b)
        .chain(&c)
        .copied()
        .chain([junk])
        .collect();
    let before: Vec<String> = all_files
        .iter()
        .map(|f| sha256_file(Path::new(f)))
        .collect();

    serve_refused(
        dir.path(),
        &[a[0], a[1], b[2]],
        "members of two different arrays",
    );
    serve_refused(
        dir.path(),
        &[a[0], b[1], b[2]],
        "members of two different arrays, the other way round",
    );
    serve_refused(
        dir.path(),
        &[a[0], a[1], a[2], junk],
        "a file without an md superblock added",
    );
    serve_refused(
        dir.path(),
        &[a[0], a[1], junk],
        "a file without an md superblock instead of a member",
    );
    serve_refused(dir.path(), &[junk], "only a file without an md superblock");
    serve_refused(
        dir.path(),
        &[a[0]],
        "raid5 with two of three members missing",
    );
    serve_refused(
        dir.path(),
        &[c[0], c[3]],
        "raid6 with three of five members missing",
    );
    serve_refused(dir.path(), &[a[0], a[1], a[1]], "the same member twice");
    serve_refused(
        dir.path(),
        &[a[0], a[1], alias],
        "the same member twice under another path",
    );
    serve_refused(
        dir.path(),
        &[a[0], a[1], a[2], absent],
        "a path that does not exist",
    );

    let after: Vec<String> = all_files
        .iter()
        .map(|f| sha256_file(Path::new(f)))
        .collect();
    for ((f, x), y) in all_files.iter().zip(&before).zip(&after) {
        assert_eq!(x, y, "{f} changed although serve refused");
    }

    // Collisions with a running server: its members, its NBD socket, its
    // control socket. The running server must go on serving.
    let sock = dir.path().join("busy.sock");
    let control = dir.path().join("busy.ctl");
    let a_size = array_bytes(&a);
    let served = try_serve_at(&sock, &control, &[], &a).unwrap_or_else(|e| panic!("serve: {e:?}"));
    let hashes = |files: &[&str]| {
        files
            .iter()
            .map(|f| sha256_file(Path::new(f)))
            .collect::<Vec<_>>()
    };
    let collide = |sock: &Path, control: &Path, members: &[&str], why: &str| {
        let before = hashes(members);
        match try_serve_at(sock, control, &[], members) {
            Ok(other) => {
                let stderr = other.stderr();
                other.stop();
                panic!("{why}: a second server started; stderr:\n{stderr}");
            }
            Err((status, stderr)) => {
                assert!(!status.success(), "{why}: exit status {status}");
                let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
                assert_eq!(
                    lines.len(),
                    1,
                    "{why}: expected one line on stderr, got {stderr:?}"
                );
                assert!(lines[0].starts_with("uraid: "), "{why}: {stderr:?}");
            }
        }
        // The running server writes its own members, so only a refused
        // serve of other members can be checked this way.
        if members != a.as_slice() {
            assert_eq!(
                before,
                hashes(members),
                "{why}: the refused serve changed the members {members:?}"
            );
        }
    };
    collide(
        &dir.path().join("other.sock"),
        &dir.path().join("other.ctl"),
        &a,
        "members already being served",
    );
    collide(
        &sock,
        &dir.path().join("other2.ctl"),
        &b,
        "the NBD socket of a running server",
    );
    collide(
        &dir.path().join("other3.sock"),
        &control,
        &b,
        "the control socket of a running server",
    );
    let export = nbdinfo_json(served.uri());
    assert_eq!(
        export["export-size"].as_u64(),
        Some(a_size),
        "the running server after the collisions: {export}"
    );
    assert!(
        served.status_text().contains("[3/3] [UUU]"),
        "{}",
        served.status_text()
    );
    served.stop();
}

/// md refuses to start a dirty degraded parity array (its parity may not
/// match the data, so reconstructing the missing member could return
/// garbage): so must `uraid serve`, without touching the members, unless
/// --force is given; then the data written and flushed before the crash
/// reads back.
#[test]
fn dirty_degraded_array_needs_force() {
    let dir = scratch("serve-force");
    let member_files = create_array(
        dir.path(),
        "m",
        &["--level", "raid5", "--raid-devices", "4", "--chunk", "64K"],
        4,
        16 * MIB,
    );
    let members = strs(&member_files);
    let size = array_bytes(&members);
    let (img, data) = image(dir.path(), "a.img", 900, size);
    let served = serve(dir.path(), &[], &members);
    nbdcopy_in(&img, served.uri());
    served.kill();
    assert_eq!(examine_states(&members), vec!["active"; 4]);

    let degraded = without(&members, &[2]);
    let before: Vec<String> = members.iter().map(|m| sha256_file(Path::new(m))).collect();
    serve_refused(
        dir.path(),
        &degraded,
        "a dirty degraded raid5 without --force",
    );
    let after: Vec<String> = members.iter().map(|m| sha256_file(Path::new(m))).collect();
    assert_eq!(before, after, "the refused serve changed the members");

    let served = serve(dir.path(), &["--force"], &degraded);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "a forced dirty degraded array",
    );
    served.stop();
}

/// A size change reaches new connections only (NBD has no resize): one
/// opened before a grow keeps the old size and still works; after a
/// shrink, one opened before is refused past the new end, and the bytes
/// below it are intact.
#[test]
fn size_changes_reach_new_connections_only() {
    let dir = scratch("serve-size");
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "6",
            "--raid-devices",
            "5",
            "--chunk",
            "64K",
            "--size",
            "4M",
        ],
        5,
        16 * MIB,
    );
    let served = serve(dir.path(), &[], &paths(&members));
    let prelude = format!(
        "import nbd, subprocess\n\
         def manage(*args):\n    subprocess.run([{uraid:?}, 'manage', '--control', {control:?}, *args], check=True, capture_output=True)\n\
         def connect():\n    c = nbd.NBD()\n    c.connect_uri(URI)\n    return c\n",
        uraid = env!("CARGO_BIN_EXE_uraid"),
        control = served.control.to_str().unwrap(),
    );
    let grow = r#"
h = connect()
old = h.get_size()
assert old == 12 << 20, old
h.pwrite(b"\x5a" * 4096, old - 4096)
manage("--grow", "--size", "max")
assert h.get_size() == old
assert h.pread(4096, old - 4096) == b"\x5a" * 4096
g = connect()
new = g.get_size()
assert new > old, (new, old)
assert g.pread(4096, old - 4096) == b"\x5a" * 4096
g.pwrite(b"\xa5" * 4096, new - 4096)
assert g.pread(4096, new - 4096) == b"\xa5" * 4096
print(new)
"#;
    let out = nbdsh_script(
        served.uri(),
        &format!("{prelude}{grow}"),
        Duration::from_secs(60),
    );
    let grown: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    wait_status(
        &served.control,
        "the resync of the new region",
        Duration::from_secs(60),
        status_whole_and_idle,
    );
    let shrink = format!(
        r#"
h = connect()
assert h.get_size() == {grown}
manage("--grow", "--size", "2M")
s = connect()
assert s.get_size() == 6 << 20, s.get_size()
try:
    h.pwrite(bytes(4096), {grown} - 4096)
    raise AssertionError("a write past the new end succeeded")
except nbd.Error:
    pass
assert h.pread(4096, 0) == s.pread(4096, 0)
"#
    );
    nbdsh_script(
        served.uri(),
        &format!("{prelude}{shrink}"),
        Duration::from_secs(60),
    );
    let status = array_status(&served.control);
    assert_eq!(status["detail"]["used_dev_size_kib"], 2048, "{status}");
    served.stop();
    // The next start serves the size on disk, clean.
    let served = serve(dir.path(), &[], &paths(&members));
    let detail = served.detail_json();
    assert_eq!(detail["array_size_kib"], 6 * 1024, "{detail}");
    served.stop();
}

/// The seed's scenario: every member replaced by a bigger one while the
/// array serves (`--replace`), then `--grow --size max` takes the room they
/// all have; the data stays, the new region is resynced, and the next
/// start serves the grown array from the new members alone.
#[test]
fn bigger_members_then_grow_max() {
    let dir = scratch("serve-bigger");
    let old = create_array(
        dir.path(),
        "old",
        &["--level", "5", "--raid-devices", "3", "--chunk", "64K"],
        3,
        8 * MIB,
    );
    let new = sparse_files(dir.path(), "new", &[16 * MIB; 3]);
    let served = serve(dir.path(), &[], &paths(&old));
    let image = dir.path().join("data.img");
    let size = nbdcopy_out(served.uri(), dir.path()).len();
    std::fs::write(&image, random_bytes(7, size)).unwrap();
    nbdcopy_in(&image, served.uri());
    for (o, n) in old.iter().zip(&new) {
        manage_ok(
            &served.control,
            &[
                "--replace",
                o.to_str().unwrap(),
                "--with",
                n.to_str().unwrap(),
            ],
        );
        wait_status(
            &served.control,
            "the replacement",
            Duration::from_secs(60),
            status_whole_and_idle,
        );
    }
    let said = manage_ok(&served.control, &["--grow", "--size", "max"]);
    assert!(said.contains("resyncing the new region"), "{said}");
    wait_status(
        &served.control,
        "the resync of the new region",
        Duration::from_secs(60),
        status_whole_and_idle,
    );
    let detail = served.detail_json();
    // 16 MiB members past mdadm's 1 MiB data offset, in whole 64 KiB chunks.
    assert_eq!(detail["used_dev_size_kib"], 15 * 1024, "{detail}");
    let read = nbdcopy_out(served.uri(), dir.path());
    assert_eq!(read.len() as u64, 2 * 15 * MIB);
    assert_same_bytes(
        &read[..size],
        &std::fs::read(&image).unwrap(),
        "after the grow",
    );
    assert_eq!(array_status(&served.control)["mismatch_cnt"], 0);
    served.stop();
    let served = serve(dir.path(), &[], &paths(&new));
    assert_eq!(served.detail_json()["array_size_kib"], 2 * 15 * 1024);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path())[..size],
        &std::fs::read(&image).unwrap(),
        "served again",
    );
    served.stop();
}
