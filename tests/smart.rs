//! SMART polling in `uraid serve`, on loop-device members with a scripted
//! smartctl (URAID_SMARTCTL): health in detail, a predicted failure
//! replaced onto a spare with the data intact, and smartctl's failures
//! (junk, an unreadable device, missing) shown as unavailable and never
//! acted on.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const MEMBER_BYTES: u64 = 32 * MIB;

/// Servers read URAID_SMARTCTL from the environment they are started
/// with; tests that set it start their servers one at a time.
static ENV_LOCK: Mutex<()> = Mutex::new(());

/// A loop device over an image file, detached when dropped.
struct Loop {
    dev: String,
}

impl Loop {
    fn attach(image: &Path) -> Result<Loop, String> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(image)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup -f --show: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// `count` loop devices over new zeroed image files, or None (with the
/// reason printed) where loop devices cannot be made.
fn loops(dir: &Path, count: usize) -> Option<Vec<Loop>> {
    let images = sparse_files(dir, "img", &vec![MEMBER_BYTES; count]);
    let mut devices = Vec::new();
    for image in &images {
        match Loop::attach(image) {
            Ok(l) => devices.push(l),
            Err(e) => {
                println!("SKIPPED: loop devices are unavailable here: {e}");
                return None;
            }
        }
    }
    Some(devices)
}

/// A smartctl stand-in: prints DIR/<device basename>.json (or default.json)
/// and exits with DIR/<basename>.exit (or 0), as smartctl exits with its
/// status bits.
fn scripted_smartctl(dir: &Path) -> PathBuf {
    let script = dir.join("smartctl");
    let text = format!(
        "#!/bin/sh\nfor a; do dev=$a; done\nb=$(basename \"$dev\")\nd={}\n\
         f=$d/$b.json; [ -f \"$f\" ] || f=$d/default.json\ncat \"$f\"\n\
         e=0; [ -f \"$d/$b.exit\" ] && e=$(cat \"$d/$b.exit\")\nexit $e\n",
        dir.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

/// smartctl's JSON for an ATA drive with `reallocated` sectors.
fn ata_json(reallocated: u64) -> String {
    format!(
        r#"{{"json_format_version":[1,0],"smartctl":{{"version":[7,3],"exit_status":0}},
  "device":{{"name":"/dev/sdx","protocol":"ATA"}},"model_name":"Scripted Disk",
  "smart_status":{{"passed":true}},
  "ata_smart_attributes":{{"table":[
    {{"id":5,"name":"Reallocated_Sector_Ct","value":100,"worst":100,"thresh":10,"when_failed":"",
      "flags":{{"prefailure":true}},"raw":{{"value":{reallocated},"string":"{reallocated}"}}}},
    {{"id":197,"name":"Current_Pending_Sector","value":100,"worst":100,"thresh":0,"when_failed":"",
      "flags":{{"prefailure":false}},"raw":{{"value":0,"string":"0"}}}}]}},
  "temperature":{{"current":33}}}}"#
    )
}

/// Writes a file the script reads, whole (a rename), so that a poll never
/// sees half of it.
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn basename(dev: &str) -> &str {
    dev.rsplit('/').next().unwrap()
}

/// `uraid serve --smart-interval 1` with URAID_SMARTCTL set to `smartctl`.
fn serve_polled(dir: &Path, smartctl: &Path, members: &[&str]) -> Served {
    let _guard = ENV_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("URAID_SMARTCTL", smartctl);
    serve(dir, &["--smart-interval", "1"], members)
}

fn health_of(detail: &serde_json::Value, dev: &str) -> serde_json::Value {
    detail_row(detail, dev)
        .map(|r| r["health"].clone())
        .unwrap_or(serde_json::Value::Null)
}

fn row_state(detail: &serde_json::Value, dev: &str) -> String {
    detail_row(detail, dev)
        .and_then(|r| r["state"].as_str())
        .unwrap_or("absent")
        .to_string()
}

/// A raid5 of three loop devices and a fourth as its spare, served with
/// SMART polled every second through the scripted smartctl, random
/// contents written through NBD, and every member's first poll passed.
/// None where loop devices cannot be made.
struct Rig {
    dir: tempfile::TempDir,
    script_dir: PathBuf,
    served: Served,
    data: Vec<u8>,
    loops: Vec<Loop>,
}

impl Rig {
    fn start(name: &str) -> Option<Rig> {
        let dir = scratch(name);
        let loops = loops(dir.path(), 4)?;
        let devs: Vec<&str> = loops.iter().map(|l| l.dev.as_str()).collect();
        let script_dir = dir.path().join("smart");
        std::fs::create_dir(&script_dir).unwrap();
        put(&script_dir, "default.json", &ata_json(0));
        let smartctl = scripted_smartctl(&script_dir);
        let mut create = vec!["create", "-l", "raid5", "-n", "3", "-c", "64K"];
        create.extend_from_slice(&devs[..3]);
        uraid_ok(&create);
        let served = serve_polled(dir.path(), &smartctl, &devs[..3]);
        manage_ok(&served.control, &["--add", devs[3]]);
        let (image, data) = image(dir.path(), "data.img", 7, array_bytes(&devs[..3]));
        nbdcopy_in(&image, served.uri());
        wait_status(
            &served.control,
            "a healthy first poll",
            Duration::from_secs(30),
            |s| {
                devs.iter()
                    .all(|d| health_of(&s["detail"], d)["status"] == "passed")
            },
        );
        Some(Rig {
            dir,
            script_dir,
            served,
            data,
            loops,
        })
    }
}

#[test]
fn predicted_failure_is_replaced_onto_the_spare_with_data_intact() {
    let Some(rig) = Rig::start("smart-replace") else {
        return;
    };
    let devs: Vec<&str> = rig.loops.iter().map(|l| l.dev.as_str()).collect();

    // Healthy: every member, the spare too, passed in detail's JSON.
    let detail = rig.served.detail_json();
    let health = health_of(&detail, devs[1]);
    assert_eq!(health["detail"]["reallocated"], 0, "{health}");
    assert_eq!(health["detail"]["model"], "Scripted Disk", "{health}");
    let text = String::from_utf8_lossy(
        &uraid_ok(&["detail", "--control", rig.served.control.to_str().unwrap()]).stdout,
    )
    .to_string();
    assert!(
        text.contains("Member health (uraid, SMART)") && text.contains("passed, 33 C"),
        "{text}"
    );

    // Member 1's reallocated sectors grow: predicted to fail, replaced
    // onto the spare while it serves, then left faulty as md leaves it.
    put(
        &rig.script_dir,
        &format!("{}.json", basename(devs[1])),
        &ata_json(8),
    );
    let status = wait_status(
        &rig.served.control,
        "the replace onto the spare to finish",
        Duration::from_secs(60),
        |s| {
            status_whole_and_idle(s)
                && row_state(&s["detail"], devs[1]).starts_with("faulty")
                && row_state(&s["detail"], devs[3]) == "active sync"
        },
    );
    let events = status_events(&status);
    let fail = events
        .iter()
        .find(|(e, d, _)| e == "SmartFail" && d == devs[1])
        .unwrap_or_else(|| panic!("no SmartFail for {}: {events:?}", devs[1]));
    assert!(
        fail.2.contains("reallocated sectors grew from 0 to 8"),
        "{fail:?}"
    );
    assert!(
        events
            .iter()
            .any(|(e, d, x)| e == "RebuildStarted" && d == devs[3] && x.contains(devs[1])),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|(e, d, _)| e == "SmartFail" && d != devs[1]),
        "only the failing member is predicted to fail: {events:?}"
    );
    assert_eq!(health_of(&status["detail"], devs[1])["status"], "failing");
    // And in the metrics the monitor serves.
    let reply: uraid::control::StatusReply =
        uraid::control::request(&rig.served.control, &uraid::control::Request::Status).unwrap();
    let metrics = uraid::monitor::metrics::render(&[reply]);
    for (dev, verdict) in [(devs[1], "failing"), (devs[0], "passed")] {
        let wanted = format!("member=\"{dev}\",status=\"{verdict}\"}} 1");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("uraid_member_smart_status{") && l.ends_with(&wanted)),
            "{wanted} not in:\n{metrics}"
        );
    }

    assert_same_bytes(
        &nbdcopy_out(rig.served.uri(), rig.dir.path()),
        &rig.data,
        "served after the replace",
    );
    rig.served.stop();
    let survivors = [devs[0], devs[2], devs[3]];
    assert_same_bytes(
        &copy_out(&survivors, rig.dir.path()),
        &rig.data,
        "copy-out of the new set",
    );
    drop(rig.loops);
}

#[test]
fn unreadable_smart_is_unavailable_and_never_replaces() {
    let Some(rig) = Rig::start("smart-unavailable") else {
        return;
    };
    let devs: Vec<&str> = rig.loops.iter().map(|l| l.dev.as_str()).collect();

    // Member 0 answers junk; member 1 a usable envelope with exit bit 1
    // (the device could not be opened): neither is a prediction.
    put(
        &rig.script_dir,
        &format!("{}.json", basename(devs[0])),
        "Reallocated: lots {{{",
    );
    put(
        &rig.script_dir,
        &format!("{}.json", basename(devs[1])),
        r#"{"json_format_version":[1,0],"smartctl":{"exit_status":2,
           "messages":[{"string":"Smartctl open device failed: No such device","severity":"error"}]}}"#,
    );
    put(&rig.script_dir, &format!("{}.exit", basename(devs[1])), "2");
    let status = wait_status(
        &rig.served.control,
        "junk and an unreadable device shown as unavailable",
        Duration::from_secs(30),
        |s| {
            health_of(&s["detail"], devs[0])["status"] == "unavailable"
                && health_of(&s["detail"], devs[1])["status"] == "unavailable"
        },
    );
    let junk = health_of(&status["detail"], devs[0]);
    assert!(
        junk["summary"]
            .as_str()
            .unwrap()
            .contains("smartctl printed no JSON"),
        "{junk}"
    );
    let unreadable = health_of(&status["detail"], devs[1]);
    assert!(
        unreadable["summary"]
            .as_str()
            .unwrap()
            .contains("open device failed"),
        "{unreadable}"
    );
    // Several more polls: the spare stays a spare.
    std::thread::sleep(Duration::from_secs(3));
    let status = array_status(&rig.served.control);
    let events = status_events(&status);
    assert!(
        events
            .iter()
            .any(|(e, d, _)| e == "SmartUnavailable" && d == devs[0]),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|(e, _, _)| e == "SmartFail" || e == "RebuildStarted"),
        "nothing may be replaced on unreadable SMART: {events:?}"
    );
    assert_eq!(row_state(&status["detail"], devs[3]), "spare");
    rig.served.stop();

    // smartctl missing: unavailable with the reason, serving unaffected.
    let missing = rig.dir.path().join("no-such-smartctl");
    let served = serve_polled(rig.dir.path(), &missing, &devs[..3]);
    let status = wait_status(
        &served.control,
        "a missing smartctl shown as unavailable",
        Duration::from_secs(30),
        |s| health_of(&s["detail"], devs[0])["status"] == "unavailable",
    );
    let h = health_of(&status["detail"], devs[0]);
    assert!(h["summary"].as_str().unwrap().contains("not found"), "{h}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), rig.dir.path()),
        &rig.data,
        "served without smartctl",
    );
    let stderr = served.stop();
    assert!(
        stderr.contains("event SmartUnavailable") && stderr.contains("not found"),
        "{stderr}"
    );
    drop(rig.loops);
}
