//! A member that hangs is a failed member, not a stuck array: `uraid serve
//! --member-timeout` fails a member whose I/O does not answer in time, the
//! I/O goes on from the others, and the member comes back through the
//! write-intent bitmap by `manage --add` or by itself with `--auto-re-add`.
//! The hang is the fault injector's (`--inject DEV hang`, lifted with
//! `hang:off`), on raid6 image files; the client is nbdsh. A member added
//! while serving is watched as one opened at start.

mod common;

use common::*;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const MEMBER_BYTES: u64 = 32 * MIB;
/// Generous: an I/O must finish at all, not fast (the timeout is 2 s).
const IO_LIMIT: Duration = Duration::from_secs(60);

struct Rig {
    dir: tempfile::TempDir,
    members: Vec<String>,
    served: Served,
    /// What the array should hold.
    expected: Vec<u8>,
}

fn rig(name: &str, extra: &[&str]) -> Rig {
    let dir = scratch(name);
    let shape: Vec<&str> = "--level raid6 --raid-devices 5 --chunk 64K --bitmap internal \
                            --bitmap-chunk 1M --assume-clean"
        .split_whitespace()
        .collect();
    let members = create_array(dir.path(), "m", &shape, 5, MEMBER_BYTES);
    let members: Vec<String> = paths(&members).iter().map(|s| s.to_string()).collect();
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    let size = array_bytes(&m);
    let mut args = vec!["--fault-injection", "--member-timeout", "2"];
    args.extend_from_slice(extra);
    let served = serve(dir.path(), &args, &m);
    Rig {
        dir,
        members,
        served,
        expected: vec![0u8; size as usize],
    }
}

impl Rig {
    /// Writes `len` random bytes at `offset` through NBD (flushed), and
    /// reads back `check` (offset, len) first if given; both must finish
    /// within IO_LIMIT.
    fn io(&mut self, seed: u64, offset: u64, len: usize, read_first: bool) {
        let data = random_bytes(seed, len);
        let file = self.dir.path().join(format!("data-{seed}"));
        std::fs::write(&file, &data).unwrap();
        let read = if read_first {
            // A region written before: its bytes must come back.
            "got = h.pread(len(old), 0)\nassert got == old, 'read back differs'\n"
        } else {
            ""
        };
        let old = self.dir.path().join("old");
        std::fs::write(&old, &self.expected[..MIB as usize]).unwrap();
        let script = format!(
            "h.connect_uri(URI)\nold = open({old:?}, 'rb').read()\n{read}\
             h.pwrite(open({file:?}, 'rb').read(), {offset})\nh.flush()\n",
            old = old.display().to_string(),
            file = file.display().to_string(),
        );
        let started = Instant::now();
        nbdsh_script(self.served.uri(), &script, IO_LIMIT);
        assert!(started.elapsed() < IO_LIMIT);
        self.expected[offset as usize..offset as usize + len].copy_from_slice(&data);
    }

    /// Writes a region, hangs member `index`, and sends the I/O that
    /// meets the hang (a read of that region first with `read_first`, else
    /// a write at `offset`): it must finish, and fail the member by a
    /// timeout. Returns the member's path.
    fn hang(&mut self, index: usize, seed: u64, offset: u64, read_first: bool) -> String {
        let hung = self.members[index].clone();
        self.io(seed, 0, MIB as usize, false);
        self.manage(&["--inject", &hung, "hang"]);
        self.io(seed + 1, offset, MIB as usize, read_first);
        self.wait_failed_by_timeout(&hung);
        hung
    }

    fn manage(&self, args: &[&str]) -> String {
        manage_ok(&self.served.control, args)
    }

    fn wait(&self, what: &str, done: impl FnMut(&serde_json::Value) -> bool) -> serde_json::Value {
        wait_status(&self.served.control, what, Duration::from_secs(60), done)
    }

    /// Waits for `member` to be failed by a timeout, as status says it.
    fn wait_failed_by_timeout(&self, member: &str) -> serde_json::Value {
        let status = self.wait(&format!("{member} failed by a timeout"), |s| {
            s["detail"]["member_failures"][member].is_string()
        });
        let reason = status["detail"]["member_failures"][member]
            .as_str()
            .unwrap();
        assert!(reason.starts_with("timeout: "), "{reason}");
        assert!(reason.contains("no answer within 2 s"), "{reason}");
        let events = status_events(&status);
        assert!(
            events
                .iter()
                .any(|(e, d, x)| e == "Fail" && d == member && x.starts_with("timeout: ")),
            "no Fail event with a timeout for {member}: {events:?}"
        );
        let row = detail_row(&status["detail"], member).expect("the failed member is listed");
        assert_eq!(row["state"], "faulty", "{row}");
        assert_eq!(status["detail"]["active_devices"], 4);
        let text = run_limited_ok(
            uraid()
                .args(["detail", "--control"])
                .arg(&self.served.control),
            Duration::from_secs(20),
        );
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains("Member failures (uraid):") && text.contains("timeout: "),
            "{text}"
        );
        status
    }

    /// Waits for the array to be whole again after `member`'s re-add and
    /// returns the KiB its copy wrote, from the RebuildFinished event.
    fn wait_readded(&self, member: &str) -> u64 {
        let status = self.wait("the re-added member in sync", |s| {
            status_whole_and_idle(s)
                && status_events(s)
                    .iter()
                    .any(|(e, d, _)| e == "RebuildFinished" && d == member)
        });
        let events = status_events(&status);
        assert!(
            events.iter().any(|(e, d, _)| e == "ReAdd" && d == member),
            "{member} came back as a re-add: {events:?}"
        );
        assert!(
            status["detail"]["member_failures"].is_null(),
            "a member back in sync has no failure: {}",
            status["detail"]
        );
        readd_copied_kib(&events, member)
    }

    /// Every byte as written, and parity consistent with it (a check
    /// finds no mismatch: the re-added member holds what it should, also
    /// where the bitmap let the copy skip).
    fn verify(&self) {
        let back = nbdcopy_out(self.served.uri(), self.dir.path());
        assert_same_bytes(&back, &self.expected, "the array after the re-add");
        self.manage(&["--action", "check"]);
        let status = self.wait("the check to end", |s| {
            status_whole_and_idle(s)
                && status_events(s)
                    .iter()
                    .any(|(e, _, x)| e == "RebuildFinished" && x.starts_with("check"))
        });
        assert_eq!(status["mismatch_cnt"], 0, "{status}");
    }
}

/// The bytes of the member a whole recovery would write, in KiB: a copy
/// through the bitmap must be far below it.
const FULL_COPY_KIB: u64 = MEMBER_BYTES / 1024;

#[test]
fn a_hung_member_is_failed_and_re_added_through_the_bitmap() {
    let mut rig = rig("timeout-readd", &[]);
    // The first I/O to reach the hung member is a write: it counts as
    // failed for that member, and the client's write completes without it.
    let hung = rig.hang(1, 1, 40 * MIB, false);
    // Degraded: reads are rebuilt from parity, writes go on.
    rig.io(3, 60 * MIB, MIB as usize, true);
    // Still hung: its stuck I/O has not returned, so it cannot come back.
    let refused = manage_refused(&rig.served.control, &["--add", &hung]);
    assert!(refused.contains("have not answered"), "{refused}");
    rig.manage(&["--inject", &hung, "hang:off"]);
    // The stuck calls return once the hang is lifted; until then --add
    // is refused as above.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = run_limited(
            uraid()
                .args(["manage", "--control"])
                .arg(&rig.served.control)
                .args(["--add", &hung]),
            Duration::from_secs(30),
        );
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "--add after lifting the hang: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let kib = rig.wait_readded(&hung);
    assert!(
        kib > 0 && kib < FULL_COPY_KIB / 4,
        "the re-add copied {kib} KiB of a {FULL_COPY_KIB} KiB member: only bitmap regions"
    );
    rig.verify();
}

#[test]
fn auto_re_add_brings_a_member_back_by_itself() {
    let mut rig = rig("timeout-auto", &["--auto-re-add"]);
    // The first I/O to reach the hung member is a read: its caller is
    // served from the others.
    let hung = rig.hang(3, 11, 30 * MIB, true);
    rig.io(13, 50 * MIB, MIB as usize, false);
    // Still hung: the prober leaves it alone (nothing comes back by itself).
    std::thread::sleep(Duration::from_secs(5));
    let status = array_status(&rig.served.control);
    assert!(
        status["detail"]["member_failures"][&hung].is_string(),
        "a member that still hangs stays failed: {}",
        status["detail"]
    );
    rig.manage(&["--inject", &hung, "hang:off"]);
    let kib = rig.wait_readded(&hung);
    let events = status_events(&array_status(&rig.served.control));
    assert!(
        events
            .iter()
            .any(|(e, d, _)| e == "AutoReAdd" && d == &hung),
        "{events:?}"
    );
    assert!(
        kib > 0 && kib < FULL_COPY_KIB / 4,
        "the re-add copied {kib} KiB of a {FULL_COPY_KIB} KiB member: only bitmap regions"
    );
    rig.verify();
    // Off again: a member failed by a timeout now stays failed.
    rig.manage(&["--auto-re-add", "off"]);
}

/// A member added while serving gets the watchdog of the members opened
/// at start: a spare added by `manage --add` takes over a failed member's
/// role, then hangs, and is failed by the timeout while client I/O goes on.
#[test]
fn a_member_added_while_serving_is_failed_by_the_timeout_too() {
    let mut rig = rig("timeout-added", &[]);
    rig.io(21, 0, MIB as usize, false);
    let added = sparse_files(rig.dir.path(), "added", &[MEMBER_BYTES]);
    let added = added[0].display().to_string();
    rig.manage(&["--add", &added]);
    let failed = rig.members[2].clone();
    rig.manage(&["--fail", &failed]);
    rig.wait("the spare rebuilt into the failed member's role", |s| {
        status_whole_and_idle(s)
            && status_events(s)
                .iter()
                .any(|(e, d, _)| e == "RebuildFinished" && d == &added)
    });
    rig.manage(&["--inject", &added, "hang"]);
    // The write that meets the hang finishes without the added member.
    rig.io(23, 40 * MIB, MIB as usize, false);
    rig.wait_failed_by_timeout(&added);
    rig.io(25, 60 * MIB, MIB as usize, true);
    rig.manage(&["--inject", &added, "hang:off"]);
    let back = nbdcopy_out(rig.served.uri(), rig.dir.path());
    assert_same_bytes(&back, &rig.expected, "the array without the hung member");
}
