//! `uraid monitor` against real servers: the events a PROGRAM receives, in
//! order, as a member fails, a spare is rebuilt and arrays come and go;
//! --oneshot --test; programs that fail or hang; mail through a sendmail
//! found on PATH; and the registry behind bare `uraid status` and `uraid
//! detail --scan`.
//!
//! Every test of this file shares one runtime folder (URAID_RUNTIME_DIR,
//! set once for the process and inherited by every server and monitor), so
//! each test names its arrays apart and looks only at its own.

mod common;

use common::*;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// How long any awaited event may take to show.
const EVENT_LIMIT: Duration = Duration::from_secs(30);

/// The runtime folder of this test process.
fn runtime_dir() -> &'static Path {
    process_runtime_dir()
}

fn raid5(dir: &Path, name: &str) -> Vec<PathBuf> {
    runtime_dir();
    create_array(
        dir,
        &format!("{name}-m"),
        &["--level", "raid5", "--raid-devices", "3", "--name", name],
        3,
        32 * MIB,
    )
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A PROGRAM that appends its arguments, one call a line, to `log`.
fn logging_program(dir: &Path, log: &Path) -> PathBuf {
    script(
        dir,
        "log-event",
        &format!("echo \"$@\" >> '{}'", log.display()),
    )
}

/// A running `uraid monitor`; killed (SIGKILL, by its id) when dropped.
struct Monitor {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Monitor {
    fn start(args: &[&str]) -> Monitor {
        runtime_dir();
        let mut child = uraid()
            .arg("monitor")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run uraid monitor");
        let stdout = line_reader(child.stdout.take().unwrap());
        let mut pipe = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        Monitor {
            child,
            stdout,
            stderr,
        }
    }

    /// Stops the monitor; returns its stdout lines and stderr.
    fn finish(mut self) -> (Vec<String>, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let lines = self.stdout.try_iter().collect();
        let stderr = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new));
        (lines, stderr.join().unwrap_or_default())
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `log` about `md`, with the array's name left out.
fn calls(log: &Path, md: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (event, rest) = l.split_once(' ')?;
            let rest = rest.strip_prefix(md)?;
            (rest.is_empty() || rest.starts_with(' ')).then(|| format!("{event}{rest}"))
        })
        .collect()
}

/// Waits until the calls about `md` include `wanted`; returns them.
fn await_call(log: &Path, md: &str, wanted: &str) -> Vec<String> {
    let deadline = Instant::now() + EVENT_LIMIT;
    loop {
        let seen = calls(log, md);
        if seen.iter().any(|c| c == wanted) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "no `{wanted}` for {md} within {EVENT_LIMIT:?}; calls so far: {seen:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn scan_follows_a_failure_a_rebuild_and_arrays_coming_and_going() {
    let dir = scratch("monitor-scan");
    let a = raid5(dir.path(), "mon-scan-a");
    let a: Vec<&str> = paths(&a);
    let spare = sparse_files(dir.path(), "mon-scan-spare", &[32 * MIB]);
    let spare = spare[0].to_str().unwrap();
    let served_a = serve(dir.path(), &["--fault-injection"], &a);
    let log = dir.path().join("events.log");
    let program = logging_program(dir.path(), &log);
    let monitor = Monitor::start(&[
        "--scan",
        "--program",
        program.to_str().unwrap(),
        "--delay",
        "1",
    ]);
    let md_a = "/dev/md/mon-scan-a";
    await_call(&log, md_a, "NewArray");
    manage_ok(&served_a.control, &["--fail", a[1]]);
    await_call(&log, md_a, "DegradedArray");
    manage_ok(&served_a.control, &["--add", spare]);
    await_call(&log, md_a, &format!("SpareActive {spare}"));
    served_a.stop();
    await_call(&log, md_a, "DeviceDisappeared");
    let b = raid5(dir.path(), "mon-scan-b");
    let served_b = serve(dir.path(), &[], &paths(&b));
    let md_b = "/dev/md/mon-scan-b";
    let seen_b = await_call(&log, md_b, "NewArray");
    drop(served_b);
    let (stdout, stderr) = monitor.finish();

    let seen = calls(&log, md_a);
    let rebuilding = |c: &String| c.starts_with("Rebuild") && c[7..].parse::<u32>().is_ok();
    let steps: Vec<u32> = seen
        .iter()
        .filter(|c| rebuilding(c))
        .map(|c| c[7..].parse().unwrap())
        .collect();
    let mut expected: Vec<String> = [
        "NewArray".to_string(),
        format!("Fail {}", a[1]),
        "DegradedArray".into(),
        "RebuildStarted".into(),
    ]
    .into();
    expected.extend(steps.iter().map(|n| format!("Rebuild{n:02}")));
    expected.extend([
        "RebuildFinished".to_string(),
        format!("SpareActive {spare}"),
        "DeviceDisappeared".into(),
    ]);
    assert_eq!(seen, expected, "monitor stderr:\n{stderr}");
    // mdadm's rule at the default increment of 20: a step each time the
    // percent crosses into a higher multiple of 20.
    assert!(!steps.is_empty(), "no RebuildNN: {seen:?}");
    for pair in steps.windows(2) {
        assert!(pair[0] / 20 < pair[1] / 20, "steps {steps:?}");
    }
    assert!(steps.iter().all(|n| (20..100).contains(n)), "{steps:?}");
    assert_eq!(seen_b, ["NewArray"]);
    // mdadm's message, on stdout.
    let fail = format!(
        "Fail event detected on md device {md_a}, component device {}",
        a[1]
    );
    assert!(stdout.contains(&fail), "{fail:?} not in {stdout:#?}");
}

#[test]
fn oneshot_test_reports_each_array_and_exits() {
    let dir = scratch("monitor-oneshot");
    let x = raid5(dir.path(), "mon-once-x");
    let y = raid5(dir.path(), "mon-once-y");
    let served_x = serve(dir.path(), &[], &paths(&x));
    let _served_y = serve(dir.path(), &[], &paths(&y));
    let scan = run_limited_ok(
        uraid().args([
            "monitor",
            "--scan",
            "--oneshot",
            "--test",
            "--program",
            "/bin/true",
        ]),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&scan.stdout);
    for md in ["/dev/md/mon-once-x", "/dev/md/mon-once-y"] {
        let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(md)).collect();
        assert_eq!(
            lines,
            [
                format!("TestMessage event detected on md device {md}"),
                format!("NewArray event detected on md device {md}"),
            ],
            "{stdout}"
        );
    }
    // Arrays named on the command line are not new (mdadm's device list).
    let listed = run_limited_ok(
        uraid()
            .args(["monitor", "--oneshot", "--test", "--control"])
            .arg(&served_x.control),
        Duration::from_secs(30),
    );
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "TestMessage event detected on md device /dev/md/mon-once-x\n"
    );
    // PROGRAM from the config file, as mdadm.conf's: the command line
    // names no alert, and the config's program gets the calls.
    let log = dir.path().join("config-events.log");
    let program = logging_program(dir.path(), &log);
    let config = dir.path().join("uraid.conf");
    let uuid = served_x.detail_json()["uuid"].as_str().unwrap().to_string();
    std::fs::write(
        &config,
        format!(
            "PROGRAM {}\nMONITORDELAY 5\nARRAY /dev/md/mon-once-x UUID={uuid} spares=1\n",
            program.display()
        ),
    )
    .unwrap();
    run_limited_ok(
        uraid()
            .args(["monitor", "--oneshot", "--test", "--config"])
            .arg(&config)
            .arg("--control")
            .arg(&served_x.control),
        Duration::from_secs(30),
    );
    // The ARRAY line wants a spare the array lacks: SparesMissing, as
    // mdadm checks it, at first sight.
    assert_eq!(
        calls(&log, "/dev/md/mon-once-x"),
        ["TestMessage", "SparesMissing"]
    );
    // A bad config line stops the monitor before it starts, with file:line.
    std::fs::write(&config, "PROGRAM /bin/true\nMONITORDELY 5\n").unwrap();
    let bad = uraid()
        .args(["monitor", "--scan", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(
        text.contains("uraid.conf:2: ") && text.lines().count() == 1,
        "{text}"
    );
}

#[test]
fn a_program_that_fails_or_hangs_does_not_stop_the_monitor() {
    let dir = scratch("monitor-program");
    let m = raid5(dir.path(), "mon-prog");
    let m: Vec<&str> = paths(&m);
    let served = serve(dir.path(), &["--fault-injection"], &m);
    let log = dir.path().join("events.log");
    let program = script(
        dir.path(),
        "bad-handler",
        &format!(
            "echo \"$@\" >> '{}'\ncase \"$1\" in TestMessage) sleep 1000;; esac\nexit 1",
            log.display()
        ),
    );
    let control = served.control.to_str().unwrap();
    let monitor = Monitor::start(&[
        "--control",
        control,
        "--test",
        "--program",
        program.to_str().unwrap(),
        "--program-timeout",
        "1",
        // Longer than the test: the events can only come through the
        // long poll that ends the wait.
        "--delay",
        "600",
    ]);
    let md = "/dev/md/mon-prog";
    await_call(&log, md, "TestMessage");
    manage_ok(&served.control, &["--fail", m[0]]);
    let seen = await_call(&log, md, "DegradedArray");
    let (_, stderr) = monitor.finish();
    assert_eq!(
        seen,
        [
            "TestMessage".to_string(),
            format!("Fail {}", m[0]),
            "DegradedArray".into()
        ]
    );
    assert!(
        stderr.contains("TestMessage /dev/md/mon-prog: still running after 1s, killed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Fail /dev/md/mon-prog: exit status: 1"),
        "{stderr}"
    );
}

#[test]
fn mail_goes_through_the_sendmail_on_path() {
    let dir = scratch("monitor-mail");
    let m = raid5(dir.path(), "mon-mail");
    let served = serve(dir.path(), &[], &paths(&m));
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let mail = dir.path().join("mail.txt");
    script(
        &bin,
        "sendmail",
        &format!("{{ echo \"ARGS $*\"; cat; }} >> '{}'", mail.display()),
    );
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    run_limited_ok(
        uraid()
            .env("PATH", &path)
            .args([
                "monitor",
                "--oneshot",
                "--test",
                "--mail",
                "ops@example.org",
            ])
            .arg("--control")
            .arg(&served.control),
        Duration::from_secs(30),
    );
    let text = std::fs::read_to_string(&mail).expect("sendmail was run");
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap();
    for line in [
        "ARGS -t".to_string(),
        "To: ops@example.org".into(),
        format!(
            "Subject: TestMessage event on /dev/md/mon-mail:{}",
            host.trim()
        ),
        "TestMessage event detected on md device /dev/md/mon-mail".into(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
    }
    assert!(text.contains("mon-mail : active raid5"), "{text}");
    assert_eq!(text.matches("ARGS").count(), 1, "one mail only: {text}");

    // Without any sendmail: one clear line, before anything is watched.
    if !Path::new("/usr/sbin/sendmail").exists() && !Path::new("/usr/lib/sendmail").exists() {
        let out = uraid()
            .env("PATH", dir.path())
            .args(["monitor", "--scan", "--mail", "ops@example.org"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "uraid: --mail: no sendmail found (on PATH, /usr/sbin/sendmail, /usr/lib/sendmail)\n"
        );
    }
}

#[test]
fn bad_monitor_options_are_refused_in_one_line() {
    runtime_dir();
    let no_alert = uraid_refused(&["monitor", "--scan"]);
    assert_eq!(
        no_alert,
        "uraid: No mail address or alert command - not monitoring.\n"
    );
    uraid_refused(&["monitor", "--scan", "--syslog", "--control", "/nowhere"]);
    uraid_refused(&["monitor", "--syslog"]);
    uraid_refused(&["monitor", "--scan", "--syslog", "--increment", "0"]);
    uraid_refused(&["monitor", "--scan", "--program", "/nonexistent/handler"]);
    // A port someone else holds.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let metrics = uraid_refused(&["monitor", "--scan", "--syslog", "--metrics", &addr]);
    assert!(
        metrics.starts_with(&format!("uraid: --metrics {addr}: ")) && metrics.lines().count() == 1,
        "{metrics}"
    );
}

/// GET `path` from `addr`: the status line and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

#[test]
fn monitor_serves_metrics_that_promtool_accepts_through_a_failure() {
    let dir = scratch("monitor-metrics");
    let m = raid5(dir.path(), "mon-metrics");
    let m: Vec<&str> = paths(&m);
    let served = serve(dir.path(), &["--fault-injection"], &m);
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let monitor = Monitor::start(&["--scan", "--syslog", "--delay", "1", "--metrics", &addr]);
    let scrape = |wanted: &str| -> String {
        let deadline = Instant::now() + EVENT_LIMIT;
        loop {
            if let Ok((status, body)) = http_get(&addr, "/metrics") {
                assert!(status.contains(" 200"), "{status}");
                if body.lines().any(|l| l == wanted) {
                    return body;
                }
            }
            assert!(Instant::now() < deadline, "no {wanted:?} in the metrics");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let healthy = scrape(r#"node_md_disks{device="mon-metrics",state="active"} 3"#);
    assert!(
        healthy.contains(r#"node_md_degraded{device="mon-metrics"} 0"#),
        "{healthy}"
    );
    manage_ok(&served.control, &["--fail", m[1]]);
    let degraded = scrape(r#"node_md_disks{device="mon-metrics",state="failed"} 1"#);
    assert!(
        degraded.contains(r#"node_md_degraded{device="mon-metrics"} 1"#),
        "{degraded}"
    );
    let (missing, _) = http_get(&addr, "/nothing").unwrap();
    assert!(missing.contains(" 404"), "{missing}");
    for body in [&healthy, &degraded] {
        let mut promtool = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package) runs");
        {
            use std::io::Write;
            promtool
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
        }
        let out = promtool.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(served);
    monitor.finish();
}

#[test]
fn status_and_detail_scan_find_arrays_wherever_their_sockets_are() {
    let dir = scratch("monitor-registry");
    // The helper puts both sockets in the test's own folder, away from
    // the runtime folder.
    let m = raid5(dir.path(), "mon-reg");
    let served = serve(dir.path(), &[], &paths(&m));
    let uuid = served.detail_json()["uuid"].as_str().unwrap().to_string();
    let listed = |args: &[&str]| {
        let out = run_limited_ok(uraid().args(args), Duration::from_secs(20));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(
        listed(&["status"]).contains("mon-reg : active raid5"),
        "{}",
        listed(&["status"])
    );
    let json: serde_json::Value = serde_json::from_str(&listed(&["status", "--json"])).unwrap();
    assert!(
        json.as_array()
            .unwrap()
            .iter()
            .any(|a| a["nbd"] == served.uri() && a["detail"]["uuid"] == uuid.as_str()),
        "{json}"
    );
    let line = format!("ARRAY /dev/md/mon-reg metadata=1.2 UUID={uuid}");
    let scan = listed(&["detail", "--scan"]);
    assert!(scan.lines().any(|l| l == line), "{line:?} not in {scan:?}");
    // A spare shows as mdadm counts it.
    let spare = sparse_files(dir.path(), "mon-reg-spare", &[32 * MIB]);
    manage_ok(&served.control, &["--add", spare[0].to_str().unwrap()]);
    let line = format!("ARRAY /dev/md/mon-reg metadata=1.2 spares=1 UUID={uuid}");
    let scan = listed(&["detail", "--scan"]);
    assert!(scan.lines().any(|l| l == line), "{line:?} not in {scan:?}");
    let verbose = listed(&["detail", "--scan", "--verbose"]);
    assert!(
        verbose.contains(&format!(
            "ARRAY /dev/md/mon-reg level=raid5 num-devices=3 metadata=1.2 spares=1 UUID={uuid}\n   devices="
        )),
        "{verbose}"
    );
    let entry = runtime_dir().join("arrays").join(format!("{uuid}.json"));
    assert!(entry.exists(), "no registry entry {}", entry.display());

    // A crash leaves its entry behind; listing skips it and cleans it.
    served.kill();
    assert!(!listed(&["status"]).contains("mon-reg"));
    assert!(!listed(&["detail", "--scan"]).contains("mon-reg"));
    assert!(!entry.exists(), "the dead server's entry is still there");
}
