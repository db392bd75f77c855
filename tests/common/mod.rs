//! Helpers shared by the integration tests: the uraid binary, scratch
//! folders, deterministic data, and the user-mode Linux kernel.
#![allow(dead_code)]

use rand::{RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn uraid() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uraid"))
}

/// Runs uraid and returns its output, panicking with stderr if it failed.
pub fn uraid_ok(args: &[&str]) -> Output {
    let out = uraid().args(args).output().expect("run uraid");
    assert!(
        out.status.success(),
        "uraid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs uraid expecting a refusal: non-zero exit and a one-line reason.
pub fn uraid_refused(args: &[&str]) -> String {
    let out = uraid().args(args).output().expect("run uraid");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "uraid {args:?} should have failed");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "uraid {args:?}: expected one line of error, got {stderr:?}"
    );
    assert!(lines[0].starts_with("uraid: "), "{stderr}");
    stderr
}

/// A scratch folder under /tmp (which user-mode Linux sees too, through hostfs).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("uraid-{name}-"))
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// One runtime folder (URAID_RUNTIME_DIR) for the whole test process, set
/// once and inherited by every server and client it starts: the tests of
/// a file that list served arrays (bare `status`, `monitor --scan`) see
/// only that file's, so each test names its arrays apart.
pub fn process_runtime_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("runtime");
        // Edition 2021: a safe call; every test sets the same value
        // before it starts any child process.
        std::env::set_var("URAID_RUNTIME_DIR", dir.path());
        dir
    })
    .path()
}

/// Sparse, zero-filled files of the given sizes.
pub fn sparse_files(dir: &Path, prefix: &str, sizes: &[u64]) -> Vec<PathBuf> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, size)| {
            let path = dir.join(format!("{prefix}{i}"));
            let file = std::fs::File::create(&path).expect("create member");
            file.set_len(*size).expect("size member");
            path
        })
        .collect()
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    data
}

pub fn paths(files: &[PathBuf]) -> Vec<&str> {
    files.iter().map(|p| p.to_str().unwrap()).collect()
}

/// The array size in bytes, from `uraid detail --json`.
pub fn array_bytes(members: &[&str]) -> u64 {
    let mut args = vec!["detail", "--json"];
    args.extend_from_slice(members);
    let out = uraid_ok(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("detail json");
    v["array_size_kib"].as_u64().expect("array_size_kib") * 1024
}

/// Runs a shell script as root inside user-mode Linux (tests/kernel/uml-run),
/// with md and loop loaded. Returns stdout; panics with the output on failure.
pub fn in_kernel(script: &str, timeout_s: u32) -> String {
    in_kernel_with_disks(&format!("#!/bin/bash\nset -eu\n{script}"), &[], timeout_s)
}

/// Runs a whole bash script (its own `set` options included) inside
/// user-mode Linux with `disks` attached as /dev/ubda, /dev/ubdb, ...
pub fn in_kernel_with_disks(script: &str, disks: &[PathBuf], timeout_s: u32) -> String {
    in_kernel_of(None, script, disks, timeout_s)
}

/// The user-mode Linux 6.12 with ublk_drv (and md 6.12) that
/// tests/kernel/build-uml-ublk builds once per machine (install-deps runs
/// it), or why it is not there.
pub fn ublk_kernel() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/kernel/build-uml-ublk"))
        .arg("--print")
        .output()
        .map_err(|e| format!("tests/kernel/build-uml-ublk: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// [`in_kernel_with_disks`] in the kernel `linux` (None: Debian's UML 6.1).
pub fn in_kernel_of(
    linux: Option<&Path>,
    script: &str,
    disks: &[PathBuf],
    timeout_s: u32,
) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = scratch("uml-script");
    let script_path = dir.path().join("script.sh");
    std::fs::write(&script_path, script).unwrap();
    let mut cmd = Command::new(root.join("tests/kernel/uml-run"));
    if let Some(linux) = linux {
        cmd.env("UML_RUN_LINUX", linux);
    }
    cmd.args(["--mem", "768M", "--timeout", &timeout_s.to_string()]);
    for d in disks {
        cmd.arg("--disk").arg(d);
    }
    let out =
        cmd.args(["--", "bash"]).arg(&script_path).output().expect(
            "run tests/kernel/uml-run (install user-mode-linux: tests/kernel/install-deps)",
        );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "kernel script failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stdout
}

/// Parses "KEY name value..." lines printed by the kernel scripts: the
/// value of KEY for each name.
pub fn results(stdout: &str, key: &str) -> std::collections::HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key} ")))
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(n, v)| (n.to_string(), v.to_string()))
        })
        .collect()
}

/// The lines of `mdadm --examine` that uraid must print identically. The
/// device line differs (a loop device in the kernel) and so may the
/// "(local to host ...)" note, which depends on the host's name.
pub fn examine_comparable(examine: &str) -> Vec<String> {
    examine
        .lines()
        .skip_while(|l| !l.contains("Magic :"))
        .filter(|l| !l.contains("Name :"))
        .map(|l| match l.find(" (local to host") {
            Some(at) => l[..at].to_string(),
            None => l.trim_end().to_string(),
        })
        // 0.90 disk tables name the device by its major:minor, which only
        // resolves inside the kernel that had those loop devices.
        .map(|l| match l.find("   /dev/") {
            Some(at) if l.contains(" sync") || l.contains(" spare") => l[..at].to_string(),
            _ => l,
        })
        .collect()
}

/// An array a test reshaped, for the kernel to check afterwards.
pub struct KernelCheck {
    pub name: String,
    pub members: Vec<PathBuf>,
    /// What md must read from the array's start: the whole new size, or
    /// only a prefix where md leaves the rest undefined.
    pub expected: PathBuf,
    /// What /sys/block/md0/md shows once md has it: level, raid_disks,
    /// chunk_size (bytes), layout.
    pub shape: String,
}

/// Guest lines that assemble `c`'s members (`mdadm --assemble --run`), let
/// md finish any reshape, and print for its name: `SHAPE` (level,
/// raid_disks, chunk_size, layout from sysfs), `CMP` (`same` when md reads
/// exactly the expected bytes), `SPARES` (members md holds as spares) and
/// `MISMATCH` (mismatch_cnt after a check; raid0 has no redundancy to
/// check). Read with [`assert_kernel_checked`].
pub fn kernel_check_lines(dir: &Path, c: &KernelCheck) -> String {
    let (d, name, expected) = (dir.display(), &c.name, c.expected.display());
    let mut s = losetup_lines(&c.members);
    s.push_str(&format!(
        "mdadm --assemble /dev/md0 --run \"${{L[@]}}\" >{d}/{name}.assemble 2>&1 || echo \"ASSEMBLE {name} failed\"\n\
         echo 200000 > /proc/sys/dev/raid/speed_limit_max\n\
         mdadm --wait /dev/md0 >/dev/null 2>&1 || true\n\
         while grep -qE 'reshape|recovery' /proc/mdstat; do sleep 0.5; done\n\
         mdadm --wait /dev/md0 >/dev/null 2>&1 || true\n\
         md=/sys/block/md0/md\n\
         echo \"SHAPE {name} $(cat $md/level) $(cat $md/raid_disks) $(cat $md/chunk_size) $(cat $md/layout)\"\n\
         echo \"SPARES {name} $(grep -l spare $md/dev-*/state | wc -l)\"\n\
         [ \"$(blockdev --getsize64 /dev/md0)\" -ge \"$(stat -c %s {expected})\" ] && \
         cmp -n \"$(stat -c %s {expected})\" /dev/md0 {expected} >/dev/null 2>&1 && echo \"CMP {name} same\" || echo \"CMP {name} differs\"\n\
         if [ \"$(cat $md/level)\" = raid0 ]; then echo \"MISMATCH {name} 0\"; else\n\
         echo check > $md/sync_action; sleep 0.2; mdadm --wait /dev/md0 >/dev/null 2>&1 || true\n\
         while [ \"$(cat $md/sync_action)\" != idle ]; do sleep 0.2; done\n\
         echo \"MISMATCH {name} $(cat $md/mismatch_cnt)\"; fi\n\
         mdadm --stop /dev/md0 >/dev/null\n\
         for l in \"${{L[@]}}\"; do losetup -d \"$l\"; done\n"
    ));
    s
}

/// Checks what [`kernel_check_lines`] printed for `c`: md has its shape,
/// reads the expected bytes and finds parity consistent.
pub fn assert_kernel_checked(out: &str, c: &KernelCheck) {
    let name = &c.name;
    let got = |key: &str| results(out, key).get(name).cloned();
    assert_eq!(
        got("SHAPE").as_ref(),
        Some(&c.shape),
        "{name}: md's shape\n{out}"
    );
    assert_eq!(
        got("CMP").as_deref(),
        Some("same"),
        "{name}: md's bytes\n{out}"
    );
    assert_eq!(
        got("MISMATCH").as_deref(),
        Some("0"),
        "{name}: md's check\n{out}"
    );
}

/// Script lines that attach each file to a loop device in the guest, into
/// the bash array L (mdadm cannot open hostfs files directly).
pub fn losetup_lines(files: &[PathBuf]) -> String {
    let mut s = String::from("L=()\n");
    for f in files {
        s.push_str(&format!("L+=(\"$(losetup -f --show {})\")\n", f.display()));
    }
    s
}

// ---------------------------------------------------------------------------
// Serving arrays: `uraid serve` as a child process, and the NBD client tools
// that talk to it (tests/serve.rs, tests/serve_kernel.rs).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Finds a client tool on PATH, or fails with the Debian package that
/// provides it: a test that passed without its tool would have checked nothing.
pub fn client_tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{name} is not installed: install the Debian package {package} (tests/kernel/install-deps installs the test dependencies)");
}

/// Runs a command with a time limit, so that a hung server fails the test
/// instead of hanging it. The command is killed when the limit passes.
pub fn run_limited(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap_or_else(|e| panic!("{desc}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) of the child started above (not yet reaped: the
            // waiting thread has not returned).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{desc} did not finish within {limit:?}");
        }
    }
}

/// `run_limited`, requiring success; the failure message has both outputs.
pub fn run_limited_ok(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let out = run_limited(cmd, limit);
    assert!(
        out.status.success(),
        "{desc} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A Command for nbdsh. nbdsh runs `python3 -m nbd` from PATH, and the nbd
/// module belongs to the distribution's python3 next to nbdsh; a python3
/// earlier in PATH (pyenv, a venv) would not find it, so nbdsh's folder goes
/// first.
pub fn nbdsh_command() -> Command {
    let nbdsh = client_tool("nbdsh", "python3-libnbd");
    let dir = nbdsh.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let mut cmd = Command::new(&nbdsh);
    cmd.env("PATH", path);
    cmd
}

/// Runs a Python script in nbdsh, with `URI` defined. The script connects
/// itself and fails with an exception, which makes nbdsh exit non-zero.
pub fn nbdsh_script(uri: &str, script: &str, limit: Duration) -> Output {
    let code = format!("URI = {uri:?}\n{script}");
    let out = run_limited(nbdsh_command().arg("-c").arg(&code), limit);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named nbd"),
        "nbdsh cannot import the nbd module: install the Debian package python3-libnbd"
    );
    assert!(
        out.status.success(),
        "nbdsh script failed ({}):\n{script}\n--- stdout\n{}\n--- stderr\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// Copies a file into the export with nbdcopy (several connections when the
/// server offers multi-conn), flushing at the end.
pub fn nbdcopy_in(image: &Path, uri: &str) {
    let nbdcopy = client_tool("nbdcopy", "libnbd-bin");
    run_limited_ok(
        Command::new(nbdcopy).arg("--flush").arg(image).arg(uri),
        Duration::from_secs(120),
    );
}

/// Copies the whole export out with nbdcopy and returns its bytes.
pub fn nbdcopy_out(uri: &str, dir: &Path) -> Vec<u8> {
    nbdcopy_out_with(uri, dir, &[])
}

/// The whole export read by one reader with one request in flight. A
/// mirror's reads go to the copy with the fewest reads in flight, the first
/// of equals (md's read_balance): a lone reader always reads the first
/// copy, so a test can say which copy its reads reach.
pub fn nbdcopy_out_lone(uri: &str, dir: &Path) -> Vec<u8> {
    nbdcopy_out_with(uri, dir, &["--connections=1", "--requests=1"])
}

/// The whole export read in 4 KiB requests, 16 in flight on each of two
/// connections (libnbd negotiates structured replies): small reads of
/// members in memory are served inline and their replies sent together.
pub fn nbdcopy_out_small(uri: &str, dir: &Path) -> Vec<u8> {
    nbdcopy_out_with(
        uri,
        dir,
        &["--connections=2", "--requests=16", "--request-size=4096"],
    )
}

fn nbdcopy_out_with(uri: &str, dir: &Path, options: &[&str]) -> Vec<u8> {
    let nbdcopy = client_tool("nbdcopy", "libnbd-bin");
    let out = dir.join("nbdcopy-out.img");
    std::fs::write(&out, b"").unwrap();
    run_limited_ok(
        Command::new(nbdcopy).args(options).arg(uri).arg(&out),
        Duration::from_secs(120),
    );
    let data = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    data
}

/// Panics with the first differing offset when two images differ (printing
/// whole images would drown the report).
pub fn assert_same_bytes(got: &[u8], expected: &[u8], what: &str) {
    if got == expected {
        return;
    }
    let first = got.iter().zip(expected).position(|(a, b)| a != b);
    panic!(
        "{what}: {} bytes, expected {}; first difference at {:?}",
        got.len(),
        expected.len(),
        first.map(|o| format!("offset {o} (0x{o:x})"))
    );
}

pub fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    format!("{:x}", Sha256::digest(&data))
}

/// A random image the size of the array, written to DIR/NAME.
pub fn image(dir: &Path, name: &str, seed: u64, size: u64) -> (PathBuf, Vec<u8>) {
    let data = random_bytes(seed, size as usize);
    let path = dir.join(name);
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

/// `uraid create` on new sparse member files `DIR/PREFIX0..`, all `size` bytes.
pub fn create_array(
    dir: &Path,
    prefix: &str,
    options: &[&str],
    disks: usize,
    size: u64,
) -> Vec<PathBuf> {
    let members = sparse_files(dir, prefix, &vec![size; disks]);
    let mut args = vec!["create"];
    args.extend_from_slice(options);
    args.extend(paths(&members));
    uraid_ok(&args);
    members
}

/// `uraid copy-out` of the given members into memory.
pub fn copy_out(members: &[&str], dir: &Path) -> Vec<u8> {
    let out = dir.join("copy-out.img");
    let mut args = vec!["copy-out", "--output", out.to_str().unwrap()];
    args.extend_from_slice(members);
    uraid_ok(&args);
    let data = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    data
}

/// The "state" field of `uraid examine --json` for each member.
pub fn examine_states(members: &[&str]) -> Vec<String> {
    let mut args = vec!["examine", "--json"];
    args.extend_from_slice(members);
    let out = uraid_ok(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("examine json");
    v.as_array()
        .expect("examine --json: a list")
        .iter()
        .map(|d| d["state"].as_str().expect("state").to_string())
        .collect()
}

/// The value of the "State :" line of `uraid examine` (text) for each member.
pub fn examine_state_lines(members: &[&str]) -> Vec<String> {
    let mut args = vec!["examine"];
    args.extend_from_slice(members);
    let out = uraid_ok(&args);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("State :")
                .map(|v| v.trim().to_string())
        })
        .collect()
}

/// `uraid detail --json` on members (offline).
pub fn detail_offline(members: &[&str]) -> serde_json::Value {
    let mut args = vec!["detail", "--json"];
    args.extend_from_slice(members);
    let out = uraid_ok(&args);
    serde_json::from_slice(&out.stdout).expect("detail json")
}

static SERVE_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A running `uraid serve` on a unix socket. Dropping it stops the server
/// (SIGTERM) and, unless the test is already failing, requires exit status 0;
/// `stop` does the same explicitly, `kill` sends SIGKILL.
pub struct Served {
    child: Option<Child>,
    pub sock: PathBuf,
    pub control: PathBuf,
    uri: String,
    /// The whole stderr so far (the reader thread appends to it).
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a server may take to say it is serving, and to stop.
pub const SERVE_READY_LIMIT: Duration = Duration::from_secs(60);
pub const SERVE_STOP_LIMIT: Duration = Duration::from_secs(60);

/// Starts `uraid serve --nbd unix:DIR/nbd-K.sock --control DIR/ctl-K.sock
/// EXTRA... MEMBERS...` and waits for its `uraid: serving` line, which must
/// name the socket's URI. Each call in a folder gets new socket names.
pub fn serve(dir: &Path, extra: &[&str], members: &[&str]) -> Served {
    match try_serve(dir, extra, members) {
        Ok(s) => s,
        Err((status, stderr)) => {
            panic!("uraid serve {extra:?} {members:?} exited ({status}) before serving:\n{stderr}")
        }
    }
}

/// `serve`, returning the exit status and stderr when the server exits
/// instead of serving. Still panics if it neither serves nor exits in time.
pub fn try_serve(
    dir: &Path,
    extra: &[&str],
    members: &[&str],
) -> Result<Served, (ExitStatus, String)> {
    let k = SERVE_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let sock = dir.join(format!("nbd-{k}.sock"));
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    spawn_server(
        dir,
        k,
        format!("unix:{}", sock.display()),
        sock,
        uri,
        extra,
        members,
    )
}

/// `serve` on `--nbd tcp:127.0.0.1:PORT`; the serving line must name
/// nbd://127.0.0.1:PORT.
pub fn serve_tcp(dir: &Path, port: u16, extra: &[&str], members: &[&str]) -> Served {
    let k = SERVE_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let uri = format!("nbd://127.0.0.1:{port}");
    match spawn_server(
        dir,
        k,
        format!("tcp:127.0.0.1:{port}"),
        PathBuf::new(),
        uri,
        extra,
        members,
    ) {
        Ok(s) => s,
        Err((status, stderr)) => panic!(
            "uraid serve --nbd tcp:127.0.0.1:{port} exited ({status}) before serving:\n{stderr}"
        ),
    }
}

/// `try_serve` on the given NBD and control socket paths (to restart a
/// server where the last one was, or to collide with a running one).
pub fn try_serve_at(
    sock: &Path,
    control: &Path,
    extra: &[&str],
    members: &[&str],
) -> Result<Served, (ExitStatus, String)> {
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    spawn_server_at(
        format!("unix:{}", sock.display()),
        sock.to_path_buf(),
        control.to_path_buf(),
        uri,
        extra,
        members,
    )
}

fn spawn_server(
    dir: &Path,
    k: usize,
    nbd: String,
    sock: PathBuf,
    uri: String,
    extra: &[&str],
    members: &[&str],
) -> Result<Served, (ExitStatus, String)> {
    spawn_server_at(
        nbd,
        sock,
        dir.join(format!("ctl-{k}.sock")),
        uri,
        extra,
        members,
    )
}

fn spawn_server_at(
    nbd: String,
    sock: PathBuf,
    control: PathBuf,
    uri: String,
    extra: &[&str],
    members: &[&str],
) -> Result<Served, (ExitStatus, String)> {
    let mut cmd = uraid();
    cmd.arg("serve")
        .arg("--nbd")
        .arg(nbd)
        .arg("--control")
        .arg(&control)
        .args(extra)
        .args(members)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let stderr = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let pipe = child.stderr.take().unwrap();
    let sink = stderr.clone();
    let stderr_thread = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + SERVE_READY_LIMIT;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with("uraid: serving") => {
                assert!(
                    line.contains(&uri),
                    "{desc}: the serving line does not name {uri}: {line:?}"
                );
                return Ok(Served {
                    child: Some(child),
                    sock,
                    control,
                    uri,
                    stderr,
                    stderr_thread: Some(stderr_thread),
                });
            }
            Ok(_) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stderr closed: the server exited (or closed stderr, which it must not).
                let status = wait_limited(&mut child, SERVE_STOP_LIMIT).unwrap_or_else(|| {
                    panic!("{desc} closed stderr without serving but did not exit")
                });
                let _ = stderr_thread.join();
                let text = stderr.lock().unwrap().clone();
                return Err((status, text));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: kill(2) of our own child, not yet reaped.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                let _ = child.wait();
                let text = stderr.lock().unwrap().clone();
                panic!("{desc} did not print `uraid: serving` within {SERVE_READY_LIMIT:?}; stderr:\n{text}");
            }
        }
    }
}

/// Waits for a child to exit, for at most `limit`; None if it is still running.
fn wait_limited(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Served {
    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server still running").id() as i32
    }

    /// The server's stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn signal_and_wait(&mut self, signal: i32) -> Result<(ExitStatus, String), String> {
        let Some(mut child) = self.child.take() else {
            return Err("the server was already stopped".into());
        };
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = match wait_limited(&mut child, SERVE_STOP_LIMIT) {
            Some(status) => status,
            None => {
                // SAFETY: as above.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                let _ = child.wait();
                return Err(format!("uraid serve did not exit within {SERVE_STOP_LIMIT:?} of signal {signal}; stderr:\n{}", self.stderr()));
            }
        };
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        Ok((status, self.stderr()))
    }

    /// SIGTERM: the server finishes in-flight I/O, marks the array clean and
    /// must exit 0. Returns its stderr.
    pub fn stop(mut self) -> String {
        match self.signal_and_wait(libc::SIGTERM) {
            Ok((status, stderr)) => {
                assert!(
                    status.success(),
                    "uraid serve exited with {status} after SIGTERM; stderr:\n{stderr}"
                );
                stderr
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// SIGKILL: a crash, which leaves the array dirty.
    pub fn kill(mut self) {
        match self.signal_and_wait(libc::SIGKILL) {
            Ok((status, _)) => assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGKILL),
                "the server was not killed by SIGKILL but exited with {status}"
            ),
            Err(e) => panic!("{e}"),
        }
    }

    /// `uraid status --control SOCK` (text).
    pub fn status_text(&self) -> String {
        let out = run_limited_ok(
            uraid().arg("status").arg("--control").arg(&self.control),
            Duration::from_secs(20),
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `uraid detail --json --control SOCK`.
    pub fn detail_json(&self) -> serde_json::Value {
        let out = run_limited_ok(
            uraid()
                .args(["detail", "--json", "--control"])
                .arg(&self.control),
            Duration::from_secs(20),
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "detail --control --json: {e}\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        // Always stop the server, also when the test failed: a server left
        // behind would keep the member files open and the socket bound.
        let result = self.signal_and_wait(libc::SIGTERM);
        let complaint = match result {
            Ok((status, _)) if status.success() => return,
            Ok((status, stderr)) => {
                format!("uraid serve exited with {status} after SIGTERM; stderr:\n{stderr}")
            }
            Err(e) => e,
        };
        if std::thread::panicking() {
            eprintln!("(while failing) {complaint}");
        } else {
            panic!("{complaint}");
        }
    }
}

/// Reads lines from a child's stdout in a thread, so that a test can wait
/// for a line with a time limit.
pub fn line_reader(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// An nbdsh script that writes through the export and keeps a model of its
/// contents: sector-aligned (512-byte) writes whose offsets and lengths are
/// not multiples of the chunk, crossing chunk and stripe boundaries and the
/// end of the array, some with FUA, each read back with its neighbourhood;
/// then many disjoint writes in flight at once on two connections, inside
/// the same few stripes (parity updates of one stripe racing), a flush, and
/// a full read compared with the model, which is saved to OUT.
/// Parameters: IMG (the export's current contents), OUT, SEED, CH (chunk
/// bytes), W (bytes of data in one stripe), COUNT (random writes).
pub const PATCH_SCRIPT: &str = r#"
import nbd, random
rng = random.Random(SEED)
h.connect_uri(URI)
size = h.get_size()
model = bytearray(open(IMG, "rb").read())
assert len(model) == size, "image %d bytes, export %d" % (len(model), size)
assert h.can_flush() and h.can_fua() and h.can_multi_conn(), "flush/fua/multi-conn not offered"
S = 512

def check(c, off, n, what):
    for o in range(off, off + n, 4 << 20):
        k = min(4 << 20, off + n - o)
        got = c.pread(k, o)
        if got != model[o:o + k]:
            bad = next(i for i in range(k) if got[i] != model[o + i])
            raise AssertionError("%s: array offset %d reads %r, expected %r" % (what, o + bad, got[bad:bad + 8], bytes(model[o + bad:o + bad + 8])))

def write(off, n, flags=0):
    data = rng.randbytes(n)
    h.pwrite(data, off, flags)
    model[off:off + n] = data
    # A margin around the write: neighbouring sectors must be untouched.
    lo = max(0, off - 4096)
    hi = min(size, off + n + 4096)
    check(h, lo, hi - lo, "after writing %d bytes at %d (flags %d)" % (n, off, flags))

targeted = [
    (0, S), (S, S), (CH - S, 2 * S), (CH - 3 * S, CH + 5 * S),
    (W - S, 2 * S), (W - 7 * S, W + 9 * S), (2 * W + 3 * S, 3 * W - 5 * S),
    (5 * W - CH - S, 3 * CH + 3 * S), (size - S, S), (size - W - 3 * S, W + 3 * S),
]
for i, (off, n) in enumerate(targeted):
    assert 0 <= off and off + n <= size, (off, n, size)
    write(off, n, nbd.CMD_FLAG_FUA if i % 2 else 0)
for i in range(COUNT):
    n = S * rng.randint(1, (3 * W) // S)
    off = S * rng.randrange(0, (size - n) // S + 1)
    write(off, n, nbd.CMD_FLAG_FUA if i % 3 == 0 else 0)
if h.can_zero():
    # Offered, so it must work: zeroes across a stripe boundary.
    off, n = 3 * W - 5 * S, 2 * CH + 7 * S
    h.zero(n, off)
    model[off:off + n] = bytes(n)
    check(h, off - S, n + 2 * S, "after zeroing %d bytes at %d" % (n, off))
h.flush()

h2 = nbd.NBD()
h2.connect_uri(URI)
base = S * rng.randrange(0, (size - 8 * W) // S)
pending = []
off = base
j = 0
while off < base + 8 * W:
    n = min(S * rng.randint(1, 16), base + 8 * W - off)
    data = bytearray(rng.randbytes(n))
    model[off:off + n] = data
    c = h if j % 2 == 0 else h2
    buf = nbd.Buffer.from_bytearray(data)
    pending.append((c, c.aio_pwrite(buf, off, flags=nbd.CMD_FLAG_FUA if j % 5 == 0 else 0), buf))
    off += n
    j += 1
for c in (h, h2):
    while c.aio_in_flight() > 0:
        c.poll(-1)
for c, cookie, _ in pending:
    assert c.aio_command_completed(cookie)
h.flush()
h2.flush()
check(h2, 0, size, "full read on a second connection")
open(OUT, "wb").write(model)
h2.shutdown()
h.shutdown()
print("patched", len(pending), "concurrent writes")
"#;

/// Runs PATCH_SCRIPT against a served export whose contents are `image`;
/// returns the new contents (also left in `out`).
pub fn nbd_patch(
    uri: &str,
    image: &Path,
    out: &Path,
    seed: u64,
    chunk: u64,
    width: u64,
    count: usize,
) -> Vec<u8> {
    let script = format!(
        "IMG = {:?}\nOUT = {:?}\nSEED = {seed}\nCH = {chunk}\nW = {width}\nCOUNT = {count}\n{PATCH_SCRIPT}",
        image.to_str().unwrap(),
        out.to_str().unwrap()
    );
    nbdsh_script(uri, &script, Duration::from_secs(180));
    std::fs::read(out).unwrap()
}

/// An nbdsh script that keeps 32 random writes in flight in the second half
/// of the export (from the first whole stripe there on) until it is killed,
/// printing "hammering" once 64 writes have completed.
/// Parameters: SEED, W (bytes of data in one stripe).
pub const HAMMER_SCRIPT: &str = r#"
import nbd, random
rng = random.Random(SEED)
h.connect_uri(URI)
size = h.get_size()
lo = (size // 2 + W - 1) // W * W
inflight = {}
done = 0
announced = False
while True:
    while h.aio_in_flight() < 32:
        n = 512 * rng.randint(1, (2 * W) // 512)
        off = lo + 512 * rng.randrange(0, (size - lo - n) // 512 + 1)
        buf = nbd.Buffer.from_bytearray(bytearray(rng.randbytes(n)))
        inflight[h.aio_pwrite(buf, off)] = buf
    h.poll(-1)
    for cookie in list(inflight):
        if h.aio_command_completed(cookie):
            del inflight[cookie]
            done += 1
    if done >= 64 and not announced:
        print("hammering", flush=True)
        announced = True
"#;

/// Starts HAMMER_SCRIPT, waits until it says it is hammering, SIGKILLs the
/// server in the middle of the writes, and reaps the client.
pub fn crash_while_hammering(served: Served, seed: u64, width: u64) {
    let code = format!(
        "URI = {:?}\nSEED = {seed}\nW = {width}\n{HAMMER_SCRIPT}",
        served.uri()
    );
    let mut client = nbdsh_command()
        .arg("-c")
        .arg(&code)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nbdsh");
    let lines = line_reader(client.stdout.take().unwrap());
    let ready = lines.recv_timeout(Duration::from_secs(60));
    if ready.as_deref() != Ok("hammering") {
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(client.id() as i32, libc::SIGKILL) };
        let out = client.wait_with_output().unwrap();
        panic!(
            "the writing client did not start hammering ({ready:?}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    served.kill();
    // The client loses its connection and fails; it must not outlive the test.
    if wait_limited(&mut client, Duration::from_secs(20)).is_none() {
        // SAFETY: as above.
        unsafe { libc::kill(client.id() as i32, libc::SIGKILL) };
        let _ = client.wait();
    }
}

/// `e2fsck -fn` on a device or image file: the filesystem must be whole.
pub fn run_e2fsck(dev: &str, what: &str) {
    let out = run_limited(
        Command::new(client_tool("e2fsck", "e2fsprogs"))
            .arg("-fn")
            .arg(dev),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{what}: e2fsck -fn found problems ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `status` and `detail --json` over the control socket until neither
/// reports a resync or recovery; returns whether one was seen.
pub fn wait_until_in_sync(served: &Served, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut seen = false;
    loop {
        let text = served.status_text();
        let detail = served.detail_json();
        let state = detail["state"]
            .as_str()
            .unwrap_or_else(|| panic!("detail without state: {detail}"))
            .to_string();
        let busy = |s: &str| {
            let s = s.to_lowercase();
            s.contains("resync") || s.contains("recover")
        };
        if !busy(&text) && !busy(&state) {
            return seen;
        }
        seen = true;
        assert!(
            Instant::now() < deadline,
            "still resyncing after {limit:?}:\n{text}\nstate: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Overwrites 4 KiB of one member at 3/4 of its data area: a torn stripe, as
/// a crash between the writes of one stripe leaves it, in the second half
/// of the array. Only a resync makes the stripe consistent again.
pub fn tear_a_stripe(member: &Path) {
    use std::os::unix::fs::FileExt;
    let out = uraid_ok(&["examine", "--json", member.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let offset = v[0]["data_offset_sectors"].as_u64().unwrap() * 512;
    let used = v[0]["used_dev_size_sectors"].as_u64().unwrap() * 512;
    let at = offset + (used * 3 / 4) / 4096 * 4096;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(member)
        .unwrap();
    f.write_all_at(&random_bytes(0x7ea2, 4096), at).unwrap();
}

/// Checks parity (and mirror) consistency offline: reading the array with
/// any one member missing (and, for raid6, any two adjacent members) gives
/// the same bytes as reading it whole, which is `expected` when given.
/// Returns the whole array's bytes.
pub fn assert_redundancy_consistent(
    members: &[&str],
    losable: usize,
    expected: Option<&[u8]>,
    dir: &Path,
) -> Vec<u8> {
    let whole = copy_out(members, dir);
    if let Some(e) = expected {
        assert_same_bytes(&whole, e, "copy-out of all members");
    }
    let n = members.len();
    let mut lost_sets: Vec<Vec<usize>> = Vec::new();
    if losable >= 1 {
        lost_sets.extend((0..n).map(|i| vec![i]));
    }
    if losable >= 2 {
        lost_sets.extend((0..n).map(|i| vec![i, (i + 1) % n]));
    }
    for lost in lost_sets {
        let subset: Vec<&str> = members
            .iter()
            .enumerate()
            .filter(|(i, _)| !lost.contains(i))
            .map(|(_, m)| *m)
            .collect();
        let got = copy_out(&subset, dir);
        assert_same_bytes(
            &got,
            &whole,
            &format!("copy-out without member(s) {lost:?} (parity/mirror inconsistent)"),
        );
    }
    whole
}

// ---------------------------------------------------------------------------
// Failures, rebuilds and background jobs on a served array
// (tests/failures.rs, tests/failures_kernel.rs).

/// `uraid manage --control SOCK ARGS...`, requiring success; returns the
/// server's message (manage prints it on stderr).
pub fn manage_ok(control: &Path, args: &[&str]) -> String {
    let out = run_limited_ok(
        uraid()
            .arg("manage")
            .arg("--control")
            .arg(control)
            .args(args),
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// `uraid manage`, expecting a refusal: non-zero exit and one line
/// `uraid: ...` on stderr, which is returned.
pub fn manage_refused(control: &Path, args: &[&str]) -> String {
    let out = run_limited(
        uraid()
            .arg("manage")
            .arg("--control")
            .arg(control)
            .args(args),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "uraid manage {args:?} should have been refused; it said {stderr:?}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("uraid: "),
        "uraid manage {args:?}: expected one line `uraid: ...`, got {stderr:?}"
    );
    stderr
}

/// The fields of a status that `uraid status --json` documents next to
/// mdstat and detail.
pub const STATUS_EXTRA_FIELDS: [&str; 4] = [
    "events",
    "mismatch_cnt",
    "speed_limit_min_kib_per_s",
    "speed_limit_max_kib_per_s",
];

/// `uraid status --json --control SOCK`: the one array's entry (mdstat,
/// detail, events, mismatch_cnt, speed limits, ...).
pub fn array_status(control: &Path) -> serde_json::Value {
    let out = run_limited_ok(
        uraid().args(["status", "--json", "--control"]).arg(control),
        Duration::from_secs(20),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let arrays = v.as_array().expect("status --json: a list");
    assert_eq!(arrays.len(), 1, "status --json --control: one array: {v}");
    arrays[0].clone()
}

/// The events of a status as (event, device, detail).
pub fn status_events(status: &serde_json::Value) -> Vec<(String, String, String)> {
    status["events"]
        .as_array()
        .unwrap_or_else(|| panic!("status without events: {status}"))
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("event"), s("device"), s("detail"))
        })
        .collect()
}

/// What the last re-add of `member` through the bitmap copied, in KiB, as
/// its `RebuildFinished` event says ("re-add through the bitmap: N KiB
/// written").
pub fn readd_copied_kib(events: &[(String, String, String)], member: &str) -> u64 {
    let (_, _, detail) = events
        .iter()
        .rev()
        .find(|(e, d, _)| e == "RebuildFinished" && d == member)
        .unwrap_or_else(|| panic!("no RebuildFinished for {member}: {events:?}"));
    detail
        .strip_prefix("re-add through the bitmap: ")
        .and_then(|rest| rest.strip_suffix(" KiB written"))
        .unwrap_or_else(|| panic!("RebuildFinished says what it copied: {detail:?}"))
        .parse()
        .unwrap()
}

/// The background job in an mdstat block, from its progress line
/// `[==>...]  recovery = 12.5% (8192/65536) finish=0.2min speed=5000K/sec`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncLine {
    /// md's word: resync, recovery, check or repair.
    pub action: String,
    pub done_kib: u64,
    pub total_kib: u64,
    pub speed_kib_per_s: u64,
}

pub fn sync_line(mdstat: &str) -> Option<SyncLine> {
    let line = mdstat.lines().find(|l| l.contains("% ("))?;
    // The bar before the word is made of '=' too: split at " = " after it.
    let bar_end = line.find(']')? + 1;
    let (before, after) = line[bar_end..].split_once('=')?;
    let action = before.split_whitespace().last()?.to_string();
    let inside = after.split_once('(')?.1.split_once(')')?.0;
    let (done, total) = inside.split_once('/')?;
    let speed = after
        .split("speed=")
        .nth(1)?
        .trim_end()
        .trim_end_matches("K/sec")
        .parse()
        .ok()?;
    Some(SyncLine {
        action,
        done_kib: done.trim().parse().ok()?,
        total_kib: total.trim().parse().ok()?,
        speed_kib_per_s: speed,
    })
}

/// Polls `array_status` every 100 ms until `done` holds, for at most
/// `limit`; returns the status that satisfied it. Fails with the last
/// status (mdstat, state, events) otherwise.
pub fn wait_status(
    control: &Path,
    what: &str,
    limit: Duration,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let status = array_status(control);
        if done(&status) {
            return status;
        }
        if Instant::now() >= deadline {
            let events: Vec<String> = status_events(&status)
                .iter()
                .map(|(e, d, x)| format!("  {e} {d} {x}"))
                .collect();
            panic!(
                "timed out after {limit:?} waiting for {what}; last status:\n{}state: {}\nevents:\n{}",
                status["mdstat"].as_str().unwrap_or_default(),
                status["detail"]["state"],
                events.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a status shows the array whole and idle: every role active and
/// in sync, no background job.
pub fn status_whole_and_idle(status: &serde_json::Value) -> bool {
    let detail = &status["detail"];
    detail["active_devices"] == detail["raid_devices"]
        && sync_line(status["mdstat"].as_str().unwrap_or_default()).is_none()
        && detail["sync_status"].is_null()
        // No job is ending either (its member marked, its successor started).
        && status["jobs_idle"] != false
}

/// The row of `detail` for a member path (compared canonically).
pub fn detail_row<'a>(detail: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    let want = std::fs::canonicalize(path).ok();
    detail["devices"].as_array()?.iter().find(|r| {
        r["path"]
            .as_str()
            .is_some_and(|p| p == path || (want.is_some() && std::fs::canonicalize(p).ok() == want))
    })
}

/// The "Recovery Offset : N sectors" line of an examine text (uraid's or
/// mdadm's), if the superblock has one.
pub fn recovery_offset_line(examine_text: &str) -> Option<u64> {
    examine_text.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Recovery Offset :")
            .and_then(|v| v.trim().strip_suffix("sectors"))
            .and_then(|v| v.trim().parse().ok())
    })
}

// ---------------------------------------------------------------------------
// ext4 through nbdfuse and a loop device (tests/serve.rs, tests/failures.rs).

pub fn sh_ok(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run_limited_ok(cmd, Duration::from_secs(120)).stdout)
        .trim()
        .to_string()
}

/// An ext4 test's stack: nbdfuse + loop + mount, torn down in reverse
/// order on drop (also when the test fails, so that no mount, loop device
/// or FUSE mount is left behind).
pub struct Stack {
    fuse_dir: Option<PathBuf>,
    nbdfuse: Option<Child>,
    loop_dev: Option<String>,
    mount: Option<PathBuf>,
}

impl Stack {
    /// nbdfuse DIR/fuse URI (file DIR/fuse/nbd), ready once its pid file
    /// is written; then a loop device over that file.
    pub fn attach(dir: &Path, uri: &str, size: u64) -> Stack {
        let nbdfuse = client_tool("nbdfuse", "nbdfuse");
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: this test needs FUSE"
        );
        let fuse_dir = dir.join("fuse");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        let pidfile = dir.join("nbdfuse.pid");
        let _ = std::fs::remove_file(&pidfile);
        let child = Command::new(nbdfuse)
            .arg("-P")
            .arg(&pidfile)
            .arg(&fuse_dir)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let mut stack = Stack {
            fuse_dir: Some(fuse_dir.clone()),
            nbdfuse: Some(child),
            loop_dev: None,
            mount: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = stack.nbdfuse.as_mut().unwrap().try_wait() {
                panic!("nbdfuse exited ({status}) before it was ready: is FUSE usable here?");
            }
            if std::fs::read_to_string(&pidfile).is_ok_and(|s| !s.trim().is_empty()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "nbdfuse did not write its pid file"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let file = fuse_dir.join("nbd");
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            size,
            "nbdfuse's file size"
        );
        let out = run_limited(
            Command::new(client_tool("losetup", "mount"))
                .args(["-f", "--show"])
                .arg(&file),
            Duration::from_secs(30),
        );
        assert!(
            out.status.success(),
            "losetup -f --show {} failed (this test needs root and loop devices): {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        stack.loop_dev = Some(String::from_utf8_lossy(&out.stdout).trim().to_string());
        stack
    }

    pub fn dev(&self) -> &str {
        self.loop_dev.as_deref().unwrap()
    }

    pub fn mount(&mut self, at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        sh_ok(
            Command::new("mount")
                .args(["-t", "ext4"])
                .arg(self.dev())
                .arg(at),
        );
        self.mount = Some(at.to_path_buf());
    }

    pub fn umount(&mut self) {
        if let Some(at) = self.mount.take() {
            sh_ok(Command::new("umount").arg(&at));
        }
    }

    /// Unmounts, detaches the loop device, unmounts nbdfuse and waits for it
    /// to exit. With `server_alive` false (the server was killed) failures
    /// of the teardown itself are expected and tolerated: only leaving
    /// nothing behind matters.
    pub fn detach(&mut self, server_alive: bool) {
        if server_alive {
            self.umount();
        } else if let Some(at) = self.mount.take() {
            let ok = Command::new("umount")
                .arg(&at)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&at).status();
            }
        }
        if let Some(dev) = self.loop_dev.take() {
            if server_alive {
                sh_ok(Command::new("losetup").arg("-d").arg(&dev));
            } else {
                let _ = Command::new("losetup").arg("-d").arg(&dev).status();
            }
        }
        if let Some(fuse_dir) = self.fuse_dir.take() {
            let mut cmd = Command::new(client_tool("fusermount3", "fuse3"));
            cmd.arg("-u");
            if server_alive {
                sh_ok(cmd.arg(&fuse_dir));
            } else {
                let _ = cmd.arg("-z").arg(&fuse_dir).status();
            }
        }
        if let Some(mut child) = self.nbdfuse.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(
                        status.success() || !server_alive,
                        "nbdfuse exited with {status}"
                    );
                    break;
                }
                if Instant::now() >= deadline {
                    // SAFETY: kill(2) of our own child, not yet reaped.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    let _ = child.wait();
                    panic!("nbdfuse did not exit after fusermount3 -u");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(at) = self.mount.take() {
            let _ = Command::new("umount").arg("-l").arg(&at).status();
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
        if let Some(fuse_dir) = self.fuse_dir.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&fuse_dir)
                .status();
        }
        if let Some(mut child) = self.nbdfuse.take() {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Reshapes uraid runs and the kernel checks afterwards (tests/reshape_*kernel.rs).

/// Creates an array with uraid, `shape` being its level, members and
/// spares, with `create_extra` for `uraid create` (chunk, layout), on
/// members of `member_bytes`; serves it, fills it with a pattern and adds
/// the spares. Returns the members, the server and the pattern.
pub fn filled_array(
    dir: &Path,
    name: &str,
    shape: (&str, usize, usize),
    create_extra: &[&str],
    member_bytes: u64,
    seed: u64,
) -> (Vec<PathBuf>, Served, Vec<u8>) {
    let (level, disks, spares) = shape;
    let files = sparse_files(
        dir,
        &format!("{name}."),
        &vec![member_bytes; disks + spares],
    );
    let all = paths(&files);
    let disks_arg = disks.to_string();
    let mut args = vec![
        "create",
        "--level",
        level,
        "--raid-devices",
        &disks_arg,
        "--assume-clean",
    ];
    args.extend_from_slice(create_extra);
    args.extend_from_slice(&all[..disks]);
    uraid_ok(&args);
    let served = serve(dir, &[], &all[..disks]);
    let size = array_bytes(&all[..disks]) as usize;
    let pattern = random_bytes(seed, size);
    let image = dir.join(format!("{name}.image"));
    std::fs::write(&image, &pattern).unwrap();
    nbdcopy_in(&image, served.uri());
    for spare in &all[disks..] {
        manage_ok(&served.control, &["--add", spare]);
    }
    (files, served, pattern)
}

/// `manage --grow CHANGE` on a served array, slowed so that clients can
/// act while the point moves; returns mdstat right after.
pub fn grow_slowly(served: &Served, change: &[&str]) -> String {
    manage_ok(&served.control, &["--speed-limit-max", "4000"]);
    let mut grow = vec!["--grow"];
    grow.extend_from_slice(change);
    manage_ok(&served.control, &grow);
    array_status(&served.control)["mdstat"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Writes and full reads through NBD (`nbd_patch` on `DIR/NAME.image`, in
/// pieces of `width`) while the reshape runs, then lets it end at full
/// speed. Returns the array's new contents and the final status.
pub fn patch_while_reshaping(
    served: &Served,
    dir: &Path,
    name: &str,
    seed: u64,
    width: u64,
) -> (Vec<u8>, serde_json::Value) {
    let image = dir.join(format!("{name}.image"));
    let patched = nbd_patch(
        served.uri(),
        &image,
        &dir.join(format!("{name}.patched")),
        seed,
        64 * 1024,
        width,
        40,
    );
    assert_ne!(
        patched,
        std::fs::read(&image).unwrap(),
        "{name}: nothing written"
    );
    manage_ok(&served.control, &["--speed-limit-max", "200000"]);
    (patched, wait_reshaped(served))
}

/// A new connection sees the array at `size` bytes, starting with `patched`.
pub fn assert_reads_back(served: &Served, dir: &Path, name: &str, patched: &[u8], size: usize) {
    assert!(size >= patched.len());
    let back = nbdcopy_out(served.uri(), dir);
    assert_eq!(
        back.len(),
        size,
        "{name}: a new connection sees the new size"
    );
    assert_same_bytes(
        &back[..patched.len()],
        patched,
        &format!("{name}: after the reshape"),
    );
}

/// Starts `manage --grow CHANGE` slowly, SIGKILLs the server once the
/// reshape's point has moved, and returns the first member's examine text,
/// which must show the reshape in progress.
pub fn kill_mid_reshape(served: Served, change: &[&str], first_member: &str) -> String {
    manage_ok(&served.control, &["--speed-limit-max", "2000"]);
    let mut grow = vec!["--grow"];
    grow.extend_from_slice(change);
    manage_ok(&served.control, &grow);
    wait_status(
        &served.control,
        "the reshape to move",
        Duration::from_secs(60),
        |s| {
            s["detail"]["reshape"]["position_sectors"]
                .as_u64()
                .unwrap_or(0)
                > 0
        },
    );
    served.kill();
    let examined = String::from_utf8(uraid_ok(&["examine", first_member]).stdout).unwrap();
    assert!(examined.contains("Reshape pos'n"), "{examined}");
    examined
}

/// Serves an array assembled mid-reshape, which `uraid serve` continues,
/// until the reshape ends; returns the server and what a new connection
/// then reads.
pub fn serve_to_the_end(dir: &Path, members: &[&str], what: &str) -> (Served, Vec<u8>) {
    let served = serve(dir, &[], members);
    wait_reshape_finished(&served, what);
    let back = nbdcopy_out(served.uri(), dir);
    (served, back)
}

/// Waits until a served array's reshape job has ended and said so
/// (`RebuildFinished`, which follows the new geometry by a moment), and
/// fails with the events if it stopped instead.
pub fn wait_reshape_finished(served: &Served, what: &str) {
    let has = |s: &serde_json::Value, event: &str| status_events(s).iter().any(|e| e.0 == event);
    let status = wait_status(
        &served.control,
        "the reshape to finish",
        Duration::from_secs(240),
        |s| {
            has(s, "SyncFailed")
                || (has(s, "RebuildFinished")
                    && !s["mdstat"].as_str().unwrap_or_default().contains("reshape"))
        },
    );
    assert!(
        has(&status, "RebuildFinished"),
        "{what}: uraid did not finish the reshape: {:?}",
        status_events(&status)
    );
}

/// Runs one guest script for several cases: each gets member files
/// `DIR/NAME.0..` of `member_bytes` (`members` gives a case's name and
/// count) and the lines `lines` writes for them. Returns the guest's
/// stdout and each case's files.
pub fn run_guest_cases<C>(
    dir: &Path,
    cases: &[C],
    members: impl Fn(&C) -> (&'static str, usize),
    member_bytes: u64,
    lines: impl Fn(&C, &[PathBuf]) -> String,
    timeout_s: u32,
) -> (String, Vec<Vec<PathBuf>>) {
    let mut script = String::from("export MDADM_NO_SYSTEMCTL=1\n");
    let mut all = Vec::new();
    for case in cases {
        let (name, count) = members(case);
        let files = sparse_files(dir, &format!("{name}."), &vec![member_bytes; count]);
        script.push_str(&lines(case, &files));
        all.push(files);
    }
    (in_kernel(&script, timeout_s), all)
}

/// A copy of each member file next to it (`FILE.copy`), to run a second
/// course of events on the same state.
pub fn copy_files(files: &[PathBuf]) -> Vec<PathBuf> {
    files
        .iter()
        .map(|f| {
            let copy = PathBuf::from(format!("{}.copy", f.display()));
            std::fs::copy(f, &copy).unwrap();
            copy
        })
        .collect()
}

/// Waits until a served array's reshape has ended.
pub fn wait_reshaped(served: &Served) -> serde_json::Value {
    wait_status(
        &served.control,
        "the reshape to end",
        Duration::from_secs(240),
        |s| {
            !s["mdstat"].as_str().unwrap_or_default().contains("reshape")
                && s["detail"]["reshape"].is_null()
        },
    )
}

/// md's view of the new shape, as the guest prints it from sysfs.
pub fn shape(level: &str, disks: usize, chunk_kib: u64, layout: impl std::fmt::Display) -> String {
    format!("{level} {disks} {} {layout}", chunk_kib * 1024)
}

/// The expected image at `size`: what was written, zeroes after.
pub fn expected_file(dir: &Path, name: &str, mut bytes: Vec<u8>, size: usize) -> PathBuf {
    assert!(bytes.len() <= size);
    bytes.resize(size, 0);
    let path = dir.join(format!("{name}.expected"));
    std::fs::write(&path, &bytes).unwrap();
    path
}

/// The kernel assembles each array: it finishes what is left, reads the
/// expected bytes, has the new shape, and its `check` finds no mismatch.
pub fn check_in_kernel(grown: &[KernelCheck], dir: &Path) {
    let mut script = String::from("export MDADM_NO_SYSTEMCTL=1\n");
    for g in grown {
        script.push_str(&kernel_check_lines(dir, g));
    }
    let out = in_kernel(&script, 600);
    for g in grown {
        assert_kernel_checked(&out, g);
    }
}

// ---------------------------------------------------------------------------
// NBD servers as array members (tests/nbd_members.rs): nbdkit and qemu-nbd
// peers, each a child process, reachable by a URI.

/// Where a peer listens.
#[derive(Clone, Debug)]
pub enum PeerListen {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// TCP on this address and port (`free_tcp_port` finds one).
    Tcp { addr: String, port: u16 },
}

impl PeerListen {
    /// The plain NBD URI of `export` there (`nbd://` or `nbd+unix://`).
    pub fn uri(&self, export: &str) -> String {
        self.uri_with_scheme(false, export)
    }

    /// The URI with TLS (`nbds://` or `nbds+unix://`) when `tls`.
    pub fn uri_with_scheme(&self, tls: bool, export: &str) -> String {
        let s = if tls { "s" } else { "" };
        match self {
            PeerListen::Unix(path) => {
                format!("nbd{s}+unix:///{export}?socket={}", path.display())
            }
            PeerListen::Tcp { addr, port } => format!("nbd{s}://{addr}:{port}/{export}"),
        }
    }

    fn ready(&self) -> bool {
        match self {
            PeerListen::Unix(path) => std::os::unix::net::UnixStream::connect(path).is_ok(),
            PeerListen::Tcp { addr, port } => {
                std::net::TcpStream::connect((addr.as_str(), *port)).is_ok()
            }
        }
    }
}

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago.
pub fn free_tcp_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().unwrap().port()
}

/// An NBD server process serving one export. Dropping it kills it.
pub struct Peer {
    child: Option<Child>,
    pub listen: PeerListen,
    /// The export name clients ask for.
    pub export: String,
}

impl Peer {
    /// The peer's plain URI.
    pub fn uri(&self) -> String {
        self.listen.uri(&self.export)
    }

    /// SIGKILL: the server vanishes mid-whatever, as a crashed host's would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `program args` (a server that stays in the foreground) and waits
/// until it accepts connections at `listen`.
pub fn start_peer(mut cmd: Command, listen: PeerListen, export: &str) -> Peer {
    let desc = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let mut peer = Peer {
        child: Some(child),
        listen,
        export: export.to_string(),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !peer.listen.ready() {
        if let Some(status) = peer.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("{desc} exited ({status}) before listening");
        }
        assert!(
            Instant::now() < deadline,
            "{desc} is not listening after 15 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    peer
}

/// `nbdkit -f PLUGIN ARGS...` at `listen`, with `extra` options (e.g.
/// `--tls=require`) before the plugin. nbdkit serves any export name.
pub fn start_nbdkit_peer(listen: PeerListen, extra: &[&str], plugin: &[&str]) -> Peer {
    let nbdkit = client_tool("nbdkit", "nbdkit");
    start_nbdkit_peer_as(Command::new(nbdkit), listen, extra, plugin)
}

/// [`start_nbdkit_peer`] with `cmd` as the nbdkit to run: a wrapper such
/// as `ip netns exec NS nbdkit` puts it elsewhere.
pub fn start_nbdkit_peer_as(
    mut cmd: Command,
    listen: PeerListen,
    extra: &[&str],
    plugin: &[&str],
) -> Peer {
    cmd.arg("-f");
    match &listen {
        PeerListen::Unix(path) => cmd.arg("-U").arg(path),
        PeerListen::Tcp { addr, port } => cmd.arg("-i").arg(addr).arg("-p").arg(port.to_string()),
    };
    cmd.args(extra).args(plugin);
    start_peer(cmd, listen, "")
}

/// `qemu-nbd` serving a raw image file as export `name`, persistent and
/// shared (several connections, one after another or at once).
pub fn start_qemu_nbd_peer(listen: PeerListen, image: &Path, name: &str) -> Peer {
    let qemu_nbd = client_tool("qemu-nbd", "qemu-utils");
    start_qemu_nbd_peer_as(Command::new(qemu_nbd), listen, image, name)
}

/// [`start_qemu_nbd_peer`] with `cmd` as the qemu-nbd to run.
pub fn start_qemu_nbd_peer_as(
    mut cmd: Command,
    listen: PeerListen,
    image: &Path,
    name: &str,
) -> Peer {
    cmd.args([
        "-f",
        "raw",
        "-t",
        "-e",
        "8",
        "--cache=writeback",
        "-x",
        name,
    ]);
    match &listen {
        PeerListen::Unix(path) => cmd.arg("-k").arg(path),
        PeerListen::Tcp { addr, port } => cmd.arg("-b").arg(addr).arg("-p").arg(port.to_string()),
    };
    cmd.arg(image);
    start_peer(cmd, listen, name)
}
