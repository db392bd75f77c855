//! `uraid doctor` on this host: every check answers one of the four
//! statuses with a reason where it is not ok, the text has one line per
//! check, and a device given gets its queue checks (an image file:
//! unavailable, with the reason); an NBD URI is asked of its server.

mod common;

use common::*;
use std::process::Command;

const STATUSES: [&str; 4] = ["ok", "warn", "fail", "unavailable"];

/// `uraid doctor ARGS --json`: the checks, and whether it exited 0.
fn doctor_json(args: &[&str]) -> (Vec<serde_json::Value>, bool) {
    let out = uraid()
        .arg("doctor")
        .arg("--json")
        .args(args)
        .output()
        .expect("run uraid doctor");
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not a JSON list: {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    for c in &checks {
        for key in ["check", "status", "value", "reason", "fix"] {
            assert!(c[key].is_string(), "{key} missing in {c}");
        }
        let status = c["status"].as_str().unwrap();
        assert!(STATUSES.contains(&status), "{c}");
        if status != "ok" {
            assert!(!c["reason"].as_str().unwrap().is_empty(), "no reason: {c}");
        }
    }
    let failed = checks.iter().any(|c| c["status"] == "fail");
    assert_eq!(
        out.status.success(),
        !failed,
        "exit status {} against the checks: {checks:?}",
        out.status
    );
    (checks, out.status.success())
}

fn find<'a>(checks: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
}

#[test]
fn host_checks_answer_in_json_and_text() {
    let (checks, _) = doctor_json(&[]);
    for name in [
        "cpu",
        "simd",
        "parity",
        "memory_dimms",
        "numa",
        "memory_free",
        "io_uring",
        "nbd",
        "ublk",
        "cpu_governor",
        "io_pressure",
    ] {
        find(&checks, name);
    }
    // What a VM lacks is unavailable, never a failure.
    assert_ne!(find(&checks, "memory_dimms")["status"], "fail");
    assert_ne!(find(&checks, "cpu_governor")["status"], "fail");
    assert!(!find(&checks, "parity")["value"]
        .as_str()
        .unwrap()
        .is_empty());

    let out = uraid().arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), checks.len(), "one line per check:\n{text}");
    for (line, check) in lines.iter().zip(&checks) {
        let status = check["status"].as_str().unwrap();
        assert!(line.starts_with(status), "{line:?} for {check}");
        assert!(line.contains(check["check"].as_str().unwrap()), "{line:?}");
    }
}

#[test]
fn devices_get_their_queue_checks() {
    let dir = scratch("doctor");
    let image = &sparse_files(dir.path(), "img", &[16 << 20])[0];
    let image = image.to_str().unwrap();
    let (checks, _) = doctor_json(&[image]);
    for attr in [
        "scheduler",
        "read_ahead_kb",
        "max_sectors_kb",
        "nr_requests",
        "write_cache",
    ] {
        let c = find(&checks, &format!("queue {attr} {image}"));
        assert_eq!(c["status"], "unavailable", "{c}");
        assert!(c["reason"].as_str().unwrap().contains("image file"), "{c}");
    }

    let attached = Command::new("losetup")
        .args(["-f", "--show", image])
        .output();
    let Some(out) = attached.ok().filter(|o| o.status.success()) else {
        println!("SKIPPED the loop device: losetup is unavailable here");
        return;
    };
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (checks, _) = doctor_json(&[&dev]);
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    let queue: Vec<&serde_json::Value> = checks
        .iter()
        .filter(|c| {
            let name = c["check"].as_str().unwrap();
            name.starts_with("queue ") && name.ends_with(&format!(" {dev}"))
        })
        .collect();
    assert_eq!(queue.len(), 6, "six queue checks for {dev}: {checks:?}");
    for c in queue {
        assert!(c["status"] == "ok" || c["status"] == "warn", "{c}");
        assert!(!c["value"].as_str().unwrap().is_empty(), "{c}");
    }
    find(&checks, &format!("queue rotational {dev}"));

    let refused = uraid_refused(&["doctor", "/no/such/device"]);
    assert!(refused.contains("/no/such/device"), "{refused}");
}

#[test]
fn nbd_uris_are_asked_of_their_servers() {
    let tcp = || PeerListen::Tcp {
        addr: "127.0.0.1".into(),
        port: free_tcp_port(),
    };
    let peer = start_nbdkit_peer(tcp(), &[], &["memory", "16M"]);
    let uri = peer.uri();
    let (checks, _) = doctor_json(&[&uri]);
    assert_eq!(find(&checks, &format!("nbd export {uri}"))["status"], "ok");
    let size = find(&checks, &format!("nbd size {uri}"));
    assert!(
        size["value"]
            .as_str()
            .unwrap()
            .starts_with("16777216 bytes"),
        "{size}"
    );
    let transport = find(&checks, &format!("nbd transport {uri}"));
    assert_eq!(transport["status"], "ok", "{transport}");
    let queue = find(&checks, &format!("queue {uri}"));
    assert_eq!(queue["status"], "unavailable", "{queue}");

    // A read-only export cannot be a member.
    let read_only = start_nbdkit_peer(tcp(), &["-r"], &["memory", "16M"]);
    let ro_uri = read_only.uri();
    let (checks, ok) = doctor_json(&[&ro_uri]);
    assert!(!ok);
    let c = find(&checks, &format!("nbd export {ro_uri}"));
    assert_eq!(c["status"], "fail", "{c}");
    assert!(c["reason"].as_str().unwrap().contains("read-only"), "{c}");

    // Nobody serves the port: one failed line names the URI, nothing more.
    let nobody = format!("nbd://127.0.0.1:{}/disk", free_tcp_port());
    let out = uraid().args(["doctor", &nobody]).output().unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&nobody)).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].starts_with("fail") && lines[0].contains("refused"),
        "{}",
        lines[0]
    );

    let refused = uraid_refused(&["doctor", "nbd://127.0.0.1:port/disk"]);
    assert!(refused.contains("bad port"), "{refused}");
}
