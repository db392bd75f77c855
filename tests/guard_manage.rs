//! The guard rails of `uraid manage` on a served array: a `--fail` the
//! array would not survive, an `--add` over something of value, a
//! `--re-add` that cannot be one, are refused in one line that says how to
//! insist, and leave the array serving as it was; re-adds while another
//! recovery runs are queued, as md queues them; knobs go together; and
//! `--grow --size max` sees members that grew while served.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const MEMBER_BYTES: u64 = 8 * MIB;
const DRAID_MEMBER_BYTES: u64 = 20 * MIB;
const LIMIT: Duration = Duration::from_secs(60);

/// The state detail gives `path` ("active sync", "faulty", ...).
fn member_state(control: &Path, path: &str) -> String {
    let status = array_status(control);
    let row = detail_row(&status["detail"], path)
        .unwrap_or_else(|| panic!("no device row for {path}: {}", status["detail"]));
    row["state"].as_str().unwrap_or_default().to_string()
}

fn has_event(status: &serde_json::Value, event: &str, device: &str) -> bool {
    status_events(status)
        .iter()
        .any(|(e, d, _)| e == event && d == device)
}

/// Writes the bytes of `file` into the export at `offset` (flushed).
fn nbd_write(uri: &str, file: &Path, offset: u64) {
    let script = format!(
        "h = nbd.NBD()\nh.connect_uri(URI)\ndata = open({:?}, 'rb').read()\n\
         for at in range(0, len(data), 1 << 20):\n    h.pwrite(data[at:at + (1 << 20)], {offset} + at)\n\
         h.flush()\nh.shutdown()\n",
        file.to_str().unwrap()
    );
    nbdsh_script(uri, &script, Duration::from_secs(60));
}

/// Serves a new array of `disks` members of MEMBER_BYTES with `options`
/// (a dRAID's of DRAID_MEMBER_BYTES: a slice must fit); returns the
/// members, the server and the array's bytes (zeros).
fn blank(dir: &Path, options: &[&str], disks: usize) -> (Vec<String>, Served, Vec<u8>) {
    let draid = options.iter().any(|o| o.starts_with("draid"));
    let member_bytes = if draid {
        DRAID_MEMBER_BYTES
    } else {
        MEMBER_BYTES
    };
    let files = create_array(dir, "m", options, disks, member_bytes);
    let members: Vec<String> = paths(&files).iter().map(|s| s.to_string()).collect();
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    let size = array_bytes(&m);
    let served = serve(dir, &[], &m);
    (members, served, vec![0; size as usize])
}

/// [`blank`], filled with random bytes from `seed`.
fn filled(dir: &Path, options: &[&str], disks: usize, seed: u64) -> (Vec<String>, Served, Vec<u8>) {
    let (members, served, data) = blank(dir, options, disks);
    let (img, data) = image(dir, "data.img", seed, data.len() as u64);
    nbdcopy_in(&img, served.uri());
    (members, served, data)
}

/// For each level: the failures it survives go through, the next one is
/// refused with the state it would leave and `--force`, the array still
/// serves every byte, and `--force` fails it.
#[test]
fn failing_beyond_redundancy_is_refused_unless_forced() {
    // (level, create options, members, roles failed first, the role refused, the refusal)
    type Case<'a> = (&'a str, &'a [&'a str], usize, &'a [usize], usize, &'a str);
    let cases: [Case; 5] = [
        (
            "raid6",
            &["--level", "raid6", "--raid-devices", "5", "--assume-clean"],
            5,
            &[0, 3],
            4,
            "would leave the raid6 array with 3 of 5 members missing",
        ),
        (
            "raid5",
            &["--level", "raid5", "--raid-devices", "3", "--assume-clean"],
            3,
            &[1],
            2,
            "would leave the raid5 array with 2 of 3 members missing",
        ),
        (
            "raid1",
            &["--level", "raid1", "--raid-devices", "2", "--assume-clean"],
            2,
            &[0],
            1,
            "would leave the raid1 array with 2 of 2 members missing",
        ),
        // Roles 0 and 1 hold the two copies of each near-2 chunk; 2 and 3
        // the others: losing 0 and 2 is survivable, 1 after them is not.
        (
            "raid10",
            &[
                "--level",
                "raid10",
                "--layout",
                "n2",
                "--raid-devices",
                "4",
                "--assume-clean",
            ],
            4,
            &[0, 2],
            1,
            "would leave the raid10 array with 3 of 4 members missing",
        ),
        // No distributed spare: the lost child stays missing.
        (
            "draid1",
            &[
                "--level",
                "draid1:3d:4c",
                "--raid-devices",
                "4",
                "--chunk",
                "16K",
            ],
            4,
            &[2],
            0,
            "would leave the draid1 array with 2 of 4 members missing",
        ),
    ];
    for (name, options, disks, survivable, last, refusal) in cases {
        let dir = scratch(&format!("guard-fail-{name}"));
        let (members, served, data) = filled(dir.path(), options, disks, 0x6a11 + disks as u64);
        for role in survivable {
            manage_ok(&served.control, &["--fail", &members[*role]]);
        }
        let refused = manage_refused(&served.control, &["--fail", &members[last]]);
        assert!(
            refused.contains(refusal) && refused.contains("--force"),
            "{name}: {refused}"
        );
        assert!(
            member_state(&served.control, &members[last]).starts_with("active sync"),
            "{name}: the refused member still serves"
        );
        assert_same_bytes(
            &nbdcopy_out(served.uri(), dir.path()),
            &data,
            &format!("{name}: after the refused fail"),
        );
        manage_ok(&served.control, &["--fail", &members[last], "--force"]);
        assert_eq!(
            member_state(&served.control, &members[last]),
            "faulty",
            "{name}: --force fails it"
        );
        served.stop();
    }
}

/// Writes an ext4 superblock magic where blkid looks for it.
fn make_ext4_like(path: &Path) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_at(&[0x53, 0xef], 1080).unwrap();
}

/// `--add` and `--replace --with` refuse a member of another array and a
/// device with a filesystem, leaving them byte for byte; `--force` adds;
/// a member of this array that left comes back without a question.
#[test]
fn adding_over_another_array_or_a_filesystem_is_refused_unless_forced() {
    let dir = scratch("guard-add");
    let d = dir.path();
    let shape = ["--level", "raid5", "--raid-devices", "3", "--assume-clean"];
    let (members, served, data) = filled(d, &shape, 3, 0xadd);
    let other = create_array(d, "other", &shape, 3, MEMBER_BYTES);
    let other = other[0].to_str().unwrap();
    let fs = sparse_files(d, "fs", &[MEMBER_BYTES]);
    let fs = fs[0].to_str().unwrap();
    make_ext4_like(Path::new(fs));
    let before = [sha256_file(Path::new(other)), sha256_file(Path::new(fs))];

    let refused = manage_refused(&served.control, &["--add", other]);
    assert!(
        refused.contains("part of an md array") && refused.contains("--force"),
        "{refused}"
    );
    let refused = manage_refused(&served.control, &["--add", fs]);
    assert!(
        refused.contains("ext2/3/4 filesystem") && refused.contains("--force"),
        "{refused}"
    );
    let refused = manage_refused(&served.control, &["--replace", &members[1], "--with", fs]);
    assert!(refused.contains("ext2/3/4 filesystem"), "{refused}");
    assert_eq!(
        [sha256_file(Path::new(other)), sha256_file(Path::new(fs))],
        before,
        "the refused devices are untouched"
    );
    let status = array_status(&served.control);
    assert!(status_whole_and_idle(&status), "{status}");
    assert_eq!(status["detail"]["spare_devices"], 0, "no spare was added");

    manage_ok(&served.control, &["--add", other, "--force"]);
    assert_eq!(member_state(&served.control, other), "spare");
    manage_ok(&served.control, &["--remove", other]);

    // A member of this array that left is no stranger.
    manage_ok(&served.control, &["--fail", &members[2]]);
    manage_ok(&served.control, &["--remove", &members[2]]);
    manage_ok(&served.control, &["--add", &members[2]]);
    wait_status(
        &served.control,
        "the member back in sync",
        LIMIT,
        status_whole_and_idle,
    );
    assert_same_bytes(&nbdcopy_out(served.uri(), d), &data, "after the re-add");
    served.stop();
}

/// `--re-add` says in one line why a device cannot come back through the
/// bitmap, and takes back one that can.
#[test]
fn readd_takes_back_a_member_or_says_why_it_cannot() {
    let dir = scratch("guard-readd");
    let d = dir.path();
    let plain = ["--level", "raid5", "--raid-devices", "3", "--assume-clean"];
    let (members, served, _) = filled(d, &plain, 3, 0x4e);
    manage_ok(&served.control, &["--fail", &members[1]]);
    let refused = manage_refused(&served.control, &["--re-add", &members[1]]);
    assert!(
        refused.contains("no write-intent bitmap") && refused.contains("--add"),
        "{refused}"
    );
    served.stop();

    let dir = scratch("guard-readd-bitmap");
    let d = dir.path();
    let shape = [
        "--level",
        "raid5",
        "--raid-devices",
        "3",
        "--assume-clean",
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "1M",
    ];
    // Blank, so that the bitmap marks only what is written while away.
    let (members, served, mut data) = blank(d, &shape, 3);
    let blank = sparse_files(d, "blank", &[MEMBER_BYTES, MEMBER_BYTES]);
    let blank: Vec<&str> = paths(&blank);
    let refused = manage_refused(&served.control, &["--re-add", blank[0]]);
    assert!(refused.contains("holds no md superblock"), "{refused}");
    let other = create_array(d, "other", &plain, 3, MEMBER_BYTES);
    let refused = manage_refused(&served.control, &["--re-add", other[0].to_str().unwrap()]);
    assert!(refused.contains("member of another array"), "{refused}");

    // Member 1 leaves, a region is written, and it comes back: only what
    // the bitmap marks is copied.
    manage_ok(&served.control, &["--fail", &members[1]]);
    let patch = random_bytes(0x50, MIB as usize);
    let file = d.join("patch");
    std::fs::write(&file, &patch).unwrap();
    nbd_write(served.uri(), &file, 2 * MIB);
    data[2 * MIB as usize..3 * MIB as usize].copy_from_slice(&patch);
    let said = manage_ok(&served.control, &["--re-add", &members[1]]);
    assert!(said.contains("re-added"), "{said}");
    let status = wait_status(
        &served.control,
        "the re-added member in sync",
        LIMIT,
        status_whole_and_idle,
    );
    assert!(has_event(&status, "ReAdd", &members[1]), "{status}");
    let copied = readd_copied_kib(&status_events(&status), &members[1]);
    assert!(copied < 4 * 1024, "the re-add copied {copied} KiB");
    assert_same_bytes(&nbdcopy_out(served.uri(), d), &data, "after the re-add");

    // Member 2 leaves and a spare takes its role: its role is taken.
    manage_ok(&served.control, &["--fail", &members[2]]);
    manage_ok(&served.control, &["--add", blank[1]]);
    wait_status(
        &served.control,
        "the spare rebuilt",
        LIMIT,
        status_whole_and_idle,
    );
    let refused = manage_refused(&served.control, &["--re-add", &members[2]]);
    assert!(
        refused.contains("role 2 is taken by") && refused.contains(blank[1]),
        "{refused}"
    );
    served.stop();
}

/// An administrator whose two member hosts come back re-adds both at once,
/// while a check runs: the check gives way, the first re-add runs, the
/// second is accepted and waits its turn, and both end in sync with every
/// byte intact.
#[test]
fn two_members_readded_back_to_back_both_end_in_sync() {
    let dir = scratch("guard-two-readds");
    let d = dir.path();
    let shape = [
        "--level",
        "raid6",
        "--raid-devices",
        "6",
        "--assume-clean",
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "1M",
    ];
    // Blank, so that the bitmap marks only what is written while away.
    let (members, served, mut data) = blank(d, &shape, 6);
    manage_ok(&served.control, &["--fail", &members[1]]);
    manage_ok(&served.control, &["--fail", &members[4]]);
    // Half the array written while they are away: the bitmap marks it.
    let half = data.len() / 2;
    let patch = random_bytes(0x2ae, half);
    let file = d.join("patch");
    std::fs::write(&file, &patch).unwrap();
    nbd_write(served.uri(), &file, 0);
    data[..half].copy_from_slice(&patch);

    manage_ok(&served.control, &["--speed-limit-max", "1000"]);
    manage_ok(&served.control, &["--action", "check"]);
    let first = manage_ok(&served.control, &["--re-add", &members[1]]);
    assert!(first.contains("copying only the regions"), "{first}");
    let second = manage_ok(&served.control, &["--re-add", &members[4]]);
    assert!(
        second.contains("starts when the running recovery ends"),
        "{second}"
    );
    let status = array_status(&served.control);
    assert!(
        has_event(&status, "ReAdd", &members[4]),
        "the second is taken at once, its copy queued: {status}"
    );
    assert!(
        status_events(&status)
            .iter()
            .any(|(e, _, x)| e == "SyncStopped" && x.contains("check interrupted")),
        "the check gave way: {status}"
    );
    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    let status = wait_status(
        &served.control,
        "both re-added members in sync",
        LIMIT,
        status_whole_and_idle,
    );
    for m in [&members[1], &members[4]] {
        assert_eq!(member_state(&served.control, m), "active sync", "{m}");
        let copied = readd_copied_kib(&status_events(&status), m);
        assert!(copied > 0, "{m}: the re-add copied the marked regions");
    }
    assert_same_bytes(&nbdcopy_out(served.uri(), d), &data, "after both re-adds");
    manage_ok(&served.control, &["--action", "check"]);
    let status = wait_status(&served.control, "the check", LIMIT, status_whole_and_idle);
    assert_eq!(status["mismatch_cnt"], 0, "{status}");
    served.stop();
}

/// Both speed limits in one call.
#[test]
fn speed_limits_go_together() {
    let dir = scratch("guard-speed");
    let shape = ["--level", "raid1", "--raid-devices", "2", "--assume-clean"];
    let (_, served, _) = filled(dir.path(), &shape, 2, 0x5bd);
    manage_ok(
        &served.control,
        &["--speed-limit-min", "3000", "--speed-limit-max", "7000"],
    );
    let status = array_status(&served.control);
    assert_eq!(status["speed_limit_min_kib_per_s"], 3000, "{status}");
    assert_eq!(status["speed_limit_max_kib_per_s"], 7000, "{status}");
    served.stop();
}

/// Members grown while served give their room to `--grow --size max`
/// without a restart, as md re-reads a device's size.
#[test]
fn grow_size_max_sees_members_grown_while_served() {
    let dir = scratch("guard-grow");
    let d = dir.path();
    let shape = ["--level", "raid5", "--raid-devices", "3", "--assume-clean"];
    let (members, served, data) = filled(d, &shape, 3, 0x960);
    let before = array_status(&served.control)["detail"]["array_size_kib"].clone();
    for m in &members {
        let file = std::fs::OpenOptions::new().write(true).open(m).unwrap();
        file.set_len(16 * MIB).unwrap();
    }
    let said = manage_ok(&served.control, &["--grow", "--size", "max"]);
    assert!(said.contains("(was "), "{said}");
    let status = wait_status(
        &served.control,
        "the grown region resynced",
        LIMIT,
        status_whole_and_idle,
    );
    let after = &status["detail"]["array_size_kib"];
    assert!(
        after.as_u64().unwrap() > before.as_u64().unwrap() + 12 * 1024,
        "array size {before} -> {after}"
    );
    let back = nbdcopy_out(served.uri(), d);
    assert_same_bytes(&back[..data.len()], &data, "below the old end");
    served.stop();
}

/// `manage --wait`, as mdadm --wait: it returns once the recovery has
/// ended and its member is in sync (not in the moment between the job's
/// end and the member's), says so, and returns at once when nothing runs.
#[test]
fn wait_returns_once_the_job_has_ended_and_says_how() {
    let dir = scratch("guard-wait");
    let shape = ["--level", "raid6", "--raid-devices", "6", "--assume-clean"];
    let (members, served, data) = filled(dir.path(), &shape, 6, 0x3a1);
    let said = manage_ok(&served.control, &["--wait"]);
    assert!(said.contains("no resync, recovery"), "{said}");

    // About two seconds of recovery at 3 MiB/s per member.
    manage_ok(&served.control, &["--speed-limit-max", "3000"]);
    manage_ok(&served.control, &["--fail", &members[2]]);
    manage_ok(&served.control, &["--remove", &members[2]]);
    manage_ok(&served.control, &["--add", &members[2], "--force"]);
    let said = manage_ok(&served.control, &["--wait"]);
    assert!(
        said.contains("recovery ended; 6 of 6 members in sync"),
        "{said}"
    );
    let status = array_status(&served.control);
    assert!(status["sync"].is_null(), "{status}");
    assert_eq!(status["jobs_idle"], true, "{status}");
    assert_eq!(member_state(&served.control, &members[2]), "active sync");

    manage_ok(&served.control, &["--action", "check"]);
    let said = manage_ok(&served.control, &["--wait"]);
    assert!(
        said.contains("check ended") && said.contains("mismatch_cnt 0"),
        "{said}"
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), dir.path()),
        &data,
        "after the wait",
    );
    served.stop();
}
