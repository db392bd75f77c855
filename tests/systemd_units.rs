//! The systemd units in dist/systemd/ pass `systemd-analyze verify` with
//! nothing to say, with their ExecStart pointing at the built binary (the
//! installed path need not exist here), and start what the README says.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const INSTALLED: &str = "/usr/local/bin/uraid";

/// Each unit file and the unit name to verify it by (an instance for a
/// template, which systemd verifies only as an instance).
const UNITS: [(&str, &str); 4] = [
    ("uraid@.service", "uraid@data.service"),
    ("uraid-monitor.service", "uraid-monitor.service"),
    ("uraid-check@.service", "uraid-check@data.service"),
    ("uraid-check@.timer", "uraid-check@data.timer"),
];

fn unit_text(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("dist/systemd")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let dir = scratch("systemd-units");
    let binary = env!("CARGO_BIN_EXE_uraid");
    for (file, _) in UNITS {
        let text = unit_text(file);
        assert!(
            file.ends_with(".timer") || text.contains(INSTALLED),
            "{file} does not run {INSTALLED}"
        );
        std::fs::write(dir.path().join(file), text.replace(INSTALLED, binary)).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(UNITS.iter().map(|(_, instance)| dir.path().join(instance)))
        .output()
        .expect("systemd-analyze (package systemd, in tests/kernel/install-deps)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify ({}):\n{said}",
        out.status
    );
}

#[test]
fn units_run_the_commands_they_are_meant_to() {
    let exec = |file: &str| -> String {
        unit_text(file)
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{file}: no ExecStart"))
            .to_string()
    };
    assert_eq!(
        exec("uraid@.service"),
        format!("{INSTALLED} serve --scan --name %i")
    );
    assert_eq!(
        exec("uraid-monitor.service"),
        format!("{INSTALLED} monitor --scan --syslog")
    );
    // The socket `uraid serve` makes as root for the array's name.
    assert_eq!(
        exec("uraid-check@.service"),
        format!("{INSTALLED} manage --control /run/uraid/%i.ctl --action check")
    );
    let serve = unit_text("uraid@.service");
    for line in ["Type=simple", "KillSignal=SIGTERM", "Restart=on-failure"] {
        assert!(
            serve.lines().any(|l| l == line),
            "uraid@.service: no {line}"
        );
    }
    // The manage command line parses (the socket is absent: refused with
    // one line naming it, not a usage error).
    let refused = uraid_refused(&[
        "manage",
        "--control",
        "/nonexistent/uraid/data.ctl",
        "--action",
        "check",
    ]);
    assert!(refused.contains("/nonexistent/uraid/data.ctl"), "{refused}");
    // First Sunday of the month, as mdcheck.
    assert!(unit_text("uraid-check@.timer").contains("OnCalendar=Sun *-*-1..7 "));
}
