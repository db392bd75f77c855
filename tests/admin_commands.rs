//! The administrator's commands beside serve: `uraid stop` (mdadm --stop)
//! over the control socket or by name, `uraid zero-superblock` (mdadm
//! --zero-superblock) checked with mdadm itself, and the manual pages,
//! shell completions and install script generated from the command line.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A name no other test's array has, for lookups in the shared registry.
fn unique_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// The state letter of /proc/PID/stat, None when there is no such process.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn stop_ok(args: &[&str]) -> String {
    let mut cmd = uraid();
    cmd.arg("stop").args(args);
    stderr_of(&run_limited_ok(&mut cmd, Duration::from_secs(90)))
}

/// After `uraid stop` returned, the server (our child, not yet reaped) must
/// already have exited: a zombie, not a running process.
fn assert_exited(pid: i32) {
    assert_eq!(
        process_state(pid),
        Some('Z'),
        "uraid stop returned while pid {pid} still runs"
    );
}

#[test]
fn stop_by_control_socket_returns_once_the_server_has_exited_clean() {
    let dir = scratch("stop-control");
    let d = dir.path();
    let name = unique_name("stopc");
    let members = create_array(
        d,
        "m",
        &[
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--assume-clean",
            "--name",
            &name,
        ],
        3,
        32 * MIB,
    );
    let served = serve(d, &[], &paths(&members));
    let pid = served.pid();
    assert_eq!(
        array_status(&served.control)["pid"].as_i64(),
        Some(pid as i64),
        "status --json names the serving pid"
    );
    assert!(
        served
            .status_text()
            .contains(&format!("served by pid {pid}\n")),
        "{}",
        served.status_text()
    );
    let detail = run_limited_ok(
        uraid().arg("detail").arg("--control").arg(&served.control),
        Duration::from_secs(20),
    );
    let detail = String::from_utf8_lossy(&detail.stdout);
    assert!(detail.contains(&format!("pid : {pid}")), "{detail}");
    assert_eq!(served.detail_json()["pid"].as_i64(), Some(pid as i64));

    let said = stop_ok(&["--control", served.control.to_str().unwrap()]);
    assert_exited(pid);
    assert!(said.contains("superblocks clean"), "{said}");
    assert!(
        !served.control.exists(),
        "the control socket is left behind"
    );
    assert_eq!(examine_states(&paths(&members)), vec!["clean"; 3]);
    let log = served.stop();
    assert!(
        log.contains("stop requested over the control socket"),
        "{log}"
    );
}

#[test]
fn stop_by_name_finds_the_array_in_the_registry() {
    let dir = scratch("stop-name");
    let d = dir.path();
    let name = unique_name("stopn");
    let members = create_array(
        d,
        "m",
        &[
            "--level",
            "1",
            "--raid-devices",
            "2",
            "--assume-clean",
            "--name",
            &name,
        ],
        2,
        16 * MIB,
    );
    let served = serve(d, &[], &paths(&members));
    let pid = served.pid();
    let refused = uraid_refused(&["stop", &format!("{name}-not-served")]);
    assert!(refused.contains("no served array"), "{refused}");
    assert_eq!(process_state(pid).map(|s| s != 'Z'), Some(true));
    let said = stop_ok(&[&name]);
    assert_exited(pid);
    assert!(said.contains(&format!("stopped {name}")), "{said}");
    served.stop();
    // Neither a socket nor a name: a usage error, as clap reports them.
    let out = uraid().arg("stop").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

/// Starts `uraid serve` with stderr in a file, for a server whose exit
/// status the test reads itself (one that cannot stop cleanly exits 1).
fn spawn_serve(dir: &Path, extra: &[&str], members: &[&str]) -> (std::process::Child, PathBuf) {
    let log = dir.join("serve.log");
    let control = dir.join("ctl.sock");
    let child = uraid()
        .arg("serve")
        .arg("--nbd")
        .arg(format!("unix:{}", dir.join("nbd.sock").display()))
        .arg("--control")
        .arg(&control)
        .args(extra)
        .args(members)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + SERVE_READY_LIMIT;
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("uraid: serving")
    {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, control)
}

#[test]
fn a_stop_that_cannot_write_the_superblocks_is_not_called_clean() {
    let dir = scratch("stop-failed");
    let d = dir.path();
    let members = create_array(
        d,
        "m",
        &["--level", "0", "--raid-devices", "2"],
        2,
        16 * MIB,
    );
    let (mut child, control) = spawn_serve(d, &["--fault-injection"], &paths(&members));
    manage_ok(
        &control,
        &["--inject", members[0].to_str().unwrap(), "pull"],
    );
    let out = run_limited(
        uraid().arg("stop").arg("--control").arg(&control),
        Duration::from_secs(90),
    );
    let said = stderr_of(&out);
    assert!(!out.status.success(), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.contains("has exited, but not every superblock is clean"),
        "{said}"
    );
    assert!(!said.contains("superblocks clean"), "{said}");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "the server's own verdict");
}

/// The 4 KiB blocks `uraid zero-superblock` may write on a device of
/// `bytes`: md's four superblock locations (dRAID's is 1.2's).
fn superblock_blocks(bytes: u64) -> Vec<u64> {
    let sectors = bytes / 512;
    vec![
        0,
        8 * 512,
        ((sectors - 16) & !7) * 512,
        ((sectors & !127) - 128) * 512,
    ]
}

/// `before` with the superblock blocks zeroed: all that may differ after.
fn with_blocks_zeroed(mut before: Vec<u8>) -> Vec<u8> {
    for offset in superblock_blocks(before.len() as u64) {
        before[offset as usize..offset as usize + 4096].fill(0);
    }
    before
}

fn assert_no_superblock_found(device: &Path) {
    let shown = device.to_str().unwrap();
    let refused = uraid_refused(&["examine", shown]);
    assert!(refused.contains("no md superblock"), "{refused}");
    let mdadm = client_tool("mdadm", "mdadm");
    let out = Command::new(mdadm)
        .arg("--examine")
        .arg(device)
        .output()
        .unwrap();
    assert!(
        !out.status.success() && stderr_of(&out).contains("No md superblock detected"),
        "mdadm --examine {shown}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
}

#[test]
fn zero_superblock_leaves_nothing_for_uraid_or_mdadm_to_find() {
    let dir = scratch("zero-all");
    let d = dir.path();
    let mut devices: Vec<PathBuf> = Vec::new();
    for metadata in ["0.90", "1.0", "1.1", "1.2"] {
        let prefix = format!("md{metadata}-");
        let options = [
            "--level",
            "1",
            "--raid-devices",
            "2",
            "--metadata",
            metadata,
        ];
        let pair = create_array(d, &prefix, &options, 2, 8 * MIB);
        let out = Command::new(client_tool("mdadm", "mdadm"))
            .arg("--examine")
            .arg(&pair[0])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mdadm reads {metadata}: {}",
            stderr_of(&out)
        );
        devices.extend(pair);
    }
    // Two superblocks on one device: a 1.0 array made over by a 1.2 one.
    let twice = create_array(
        d,
        "twice-",
        &["--level", "1", "--raid-devices", "2", "--metadata", "1.0"],
        2,
        8 * MIB,
    );
    let mut again = vec!["create", "--level", "1", "--raid-devices", "2", "--force"];
    again.extend(paths(&twice));
    uraid_ok(&again);
    devices.extend(twice);
    devices.extend(create_array(
        d,
        "draid-",
        &["--level", "draid1:2d:1s", "--raid-devices", "4"],
        4,
        32 * MIB,
    ));

    let before: Vec<Vec<u8>> = devices.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let mut args = vec!["zero-superblock"];
    args.extend(paths(&devices));
    let said = stderr_of(&uraid_ok(&args));
    assert!(
        said.contains("1.0 (sector"),
        "both of the twice-made device: {said}"
    );
    for (device, before) in devices.iter().zip(before) {
        assert_no_superblock_found(device);
        let after = std::fs::read(device).unwrap();
        assert!(
            after == with_blocks_zeroed(before),
            "{}: bytes changed outside the superblock blocks",
            device.display()
        );
    }
}

#[test]
fn zero_superblock_refuses_a_member_of_a_served_array() {
    let dir = scratch("zero-served");
    let d = dir.path();
    let writable = create_array(
        d,
        "w",
        &[
            "--level",
            "1",
            "--raid-devices",
            "2",
            "--name",
            &unique_name("zw"),
        ],
        2,
        8 * MIB,
    );
    let read_only = create_array(
        d,
        "r",
        &[
            "--level",
            "1",
            "--raid-devices",
            "2",
            "--name",
            &unique_name("zr"),
        ],
        2,
        8 * MIB,
    );
    let served = serve(d, &[], &paths(&writable));
    // Read-only, the server holds no lock: the registry alone says so.
    let served_ro = serve(d, &["--read-only"], &paths(&read_only));
    for member in [&writable[1], &read_only[0]] {
        let before = sha256_file(member);
        let refused = uraid_refused(&["zero-superblock", member.to_str().unwrap()]);
        assert!(refused.contains("uraid stop"), "{refused}");
        assert!(refused.contains("pid "), "{refused}");
        assert_eq!(sha256_file(member), before, "{} changed", member.display());
    }
    served.stop();
    served_ro.stop();
    uraid_ok(&["zero-superblock", writable[1].to_str().unwrap()]);
    assert_no_superblock_found(&writable[1]);
}

#[test]
fn zero_superblock_refuses_a_device_without_one_unless_forced() {
    let dir = scratch("zero-blank");
    let d = dir.path();
    let members = create_array(d, "m", &["--level", "1", "--raid-devices", "2"], 2, 8 * MIB);
    let blank = sparse_files(d, "blank", &[8 * MIB]).remove(0);
    let (member, blank_s) = (members[0].to_str().unwrap(), blank.to_str().unwrap());
    let before = sha256_file(&members[0]);
    let refused = uraid_refused(&["zero-superblock", member, blank_s]);
    assert!(
        refused.contains("Unrecognised md component device"),
        "{refused}"
    );
    assert!(refused.contains(blank_s), "{refused}");
    assert_eq!(
        sha256_file(&members[0]),
        before,
        "refused, yet the member changed"
    );
    let refused = uraid_refused(&["zero-superblock", member, member]);
    assert!(refused.contains("named twice"), "{refused}");

    uraid_ok(&["zero-superblock", "--force", member, blank_s]);
    assert_no_superblock_found(&members[0]);
    let blank_bytes = std::fs::read(&blank).unwrap();
    assert!(
        blank_bytes.iter().all(|&b| b == 0),
        "--force wrote on the blank device"
    );
}

/// The subcommands `uraid --help` lists, `help` aside.
fn subcommands() -> Vec<String> {
    let help = String::from_utf8(uraid_ok(&["--help"]).stdout).unwrap();
    let listed: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|name| name != "help")
        .collect();
    assert!(listed.len() > 10, "{help}");
    listed
}

#[test]
fn man_pages_are_written_for_every_command_and_parse() {
    let dir = scratch("man");
    let pages = dir.path().join("man8");
    uraid_ok(&["man", "--dir", pages.to_str().unwrap()]);
    let mut expected: Vec<String> = subcommands().iter().map(|s| format!("uraid-{s}")).collect();
    expected.push("uraid".into());
    expected.push("uraid-bench-parity".into());
    let groff = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|p| p.join("groff"))
        .find(|p| p.is_file());
    for page in &expected {
        let path = pages.join(format!("{page}.8"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let title = text
            .lines()
            .find(|l| l.starts_with(".TH "))
            .unwrap_or_default();
        assert!(
            title.starts_with(&format!(".TH {page} 8 ")),
            "{page}: {title:?}"
        );
        assert!(
            text.contains("\n.SH NAME\n") && text.contains("\n.SH SYNOPSIS\n"),
            "{page}"
        );
        if let Some(groff) = &groff {
            let out = Command::new(groff)
                .args(["-man", "-z", "-ww"])
                .arg(&path)
                .env("LC_ALL", "C")
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "groff on {page}: {}",
                stderr_of(&out)
            );
        }
    }
    assert!(std::fs::read_to_string(pages.join("uraid-stop.8"))
        .unwrap()
        .contains("\\-\\-control"));
}

#[test]
fn bash_completion_sources_and_completes_a_subcommand() {
    let binary = env!("CARGO_BIN_EXE_uraid");
    let script = format!(
        "source <({binary} completions bash) && complete -p uraid && \
         COMP_WORDS=(uraid zero) COMP_CWORD=1 COMP_LINE='uraid zero' COMP_POINT=10 && \
         _uraid uraid zero uraid && echo \"reply: ${{COMPREPLY[*]}}\""
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", stderr_of(&out));
    assert!(stdout.contains("-F _uraid uraid"), "{stdout}");
    assert!(stdout.contains("reply: zero-superblock"), "{stdout}");
    for shell in ["zsh", "fish"] {
        let text = String::from_utf8(uraid_ok(&["completions", shell]).stdout).unwrap();
        assert!(
            text.contains("zero-superblock") && text.contains("stop"),
            "{shell}"
        );
    }
    let refused = uraid().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

#[test]
fn install_script_puts_everything_under_destdir() {
    let dir = scratch("install");
    let dest = dir.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run_limited_ok(
        Command::new(root.join("scripts/install"))
            .args(["--binary", env!("CARGO_BIN_EXE_uraid")])
            .env("DESTDIR", dest)
            .env("PREFIX", "/opt/uraid"),
        Duration::from_secs(60),
    );
    let under = dest.join("opt/uraid");
    let files = [
        "bin/uraid",
        "share/man/man8/uraid.8",
        "share/man/man8/uraid-stop.8",
        "share/man/man8/uraid-zero-superblock.8",
        "share/bash-completion/completions/uraid",
        "share/zsh/site-functions/_uraid",
        "share/fish/vendor_completions.d/uraid.fish",
        "lib/systemd/system/uraid@.service",
        "lib/systemd/system/uraid-monitor.service",
        "lib/systemd/system/uraid-check@.service",
        "lib/systemd/system/uraid-check@.timer",
    ];
    for file in files {
        assert!(
            under.join(file).is_file(),
            "{file} not installed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let version = Command::new(under.join("bin/uraid"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    let unit = std::fs::read_to_string(under.join("lib/systemd/system/uraid@.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/opt/uraid/bin/uraid serve"),
        "the unit runs the installed binary: {unit}"
    );
}
