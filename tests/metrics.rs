//! Prometheus metrics of a real served array: `uraid serve --fault-injection`
//! on sparse files, `uraid::monitor::metrics::MetricsServer` on 127.0.0.1
//! with a source that asks the control socket, scraped over HTTP through a
//! member failure and a rebuild onto a spare. Every scrape must pass
//! `promtool check metrics` (Debian's `prometheus` package) and show what
//! node_exporter's md collector would for the same md array, so that the
//! node-mixin alerts read it unchanged.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use uraid::control::{self, Request, StatusReply};
use uraid::monitor::metrics::MetricsServer;

const MIB: u64 = 1 << 20;

/// A response: status code, headers (lower-case names) and body.
struct Response {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

fn http_get(addr: SocketAddr, path: &str) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics server");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header and a body");
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response {
        code,
        headers,
        body: body.to_string(),
    }
}

fn promtool() -> PathBuf {
    client_tool("promtool", "prometheus")
}

/// Scrapes /metrics, requires `promtool check metrics` to accept it
/// (exit 0, nothing said), and returns the text.
fn scrape(addr: SocketAddr) -> String {
    let r = http_get(addr, "/metrics");
    assert_eq!(r.code, 200, "{}", r.body);
    let content_type = r
        .headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v.as_str());
    assert_eq!(
        content_type,
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(r.body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics ({}):\n{}{}\non:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        r.body
    );
    r.body
}

/// The value of the sample `series` (name and labels as written).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// Requires each series to have its value.
fn expect(text: &str, want: &[(&str, f64)]) {
    for (series, v) in want {
        assert_eq!(value(text, series), *v, "{series} in:\n{text}");
    }
}

fn status(control: &Path) -> StatusReply {
    control::request(control, &Request::Status).expect("status over the control socket")
}

fn speed_limit_max(control: &Path, kib_per_s: u64) {
    control::command(
        control,
        &Request::SpeedLimits {
            min_kib_per_s: None,
            max_kib_per_s: Some(kib_per_s),
        },
    )
    .expect("speed limits");
}

#[test]
fn metrics_follow_a_failure_and_a_rebuild() {
    let dir = scratch("metrics");
    let members = create_array(
        dir.path(),
        "m",
        &[
            "--level",
            "raid5",
            "--raid-devices",
            "4",
            "--chunk",
            "64K",
            "--name",
            "vault",
        ],
        4,
        32 * MIB,
    );
    let spare = sparse_files(dir.path(), "s", &[32 * MIB]).remove(0);
    let m = paths(&members);
    let served = serve(dir.path(), &["--fault-injection"], &m);
    let control = served.control.clone();

    let reply = status(&control);
    assert_eq!(reply.name.rsplit(':').next(), Some("vault"), "{reply:?}");
    let source_control = control.clone();
    let metrics = MetricsServer::start(
        "127.0.0.1:0",
        Arc::new(move || vec![status(&source_control)]),
    )
    .expect("metrics server");
    let addr = metrics.local_addr();
    assert_ne!(addr.port(), 0);

    // Healthy.
    let text = scrape(addr);
    let kib = reply.array_kib as f64;
    assert!(
        kib > (3 * 30 * MIB / 1024) as f64,
        "three members' data: {kib}"
    );
    expect(
        &text,
        &[
            (r#"node_md_blocks{device="vault"}"#, kib),
            (r#"node_md_blocks_synced{device="vault"}"#, kib),
            (r#"node_md_disks_required{device="vault"}"#, 4.0),
            (r#"node_md_raid_disks{device="vault"}"#, 4.0),
            (r#"node_md_disks{device="vault",state="active"}"#, 4.0),
            (r#"node_md_disks{device="vault",state="failed"}"#, 0.0),
            (r#"node_md_degraded{device="vault"}"#, 0.0),
            (r#"node_md_state{device="vault",state="active"}"#, 1.0),
        ],
    );
    let info = format!(
        r#"uraid_array_info{{device="vault",level="raid5",name="{}",uuid="{}"}}"#,
        reply.name, reply.uuid
    );
    expect(&text, &[(info.as_str(), 1.0)]);

    // A member pulled, found by reads: the array is degraded, the member
    // failed, and its read errors counted.
    let pulled = m[1];
    manage_ok(&control, &["--inject", pulled, "pull"]);
    nbdcopy_out(served.uri(), dir.path());
    wait_status(
        &control,
        "the pulled member failed",
        Duration::from_secs(30),
        |s| s["detail"]["failed_devices"] == 1,
    );
    let text = scrape(addr);
    expect(
        &text,
        &[
            (r#"node_md_disks{device="vault",state="failed"}"#, 1.0),
            (r#"node_md_disks{device="vault",state="active"}"#, 3.0),
            (r#"node_md_degraded{device="vault"}"#, 1.0),
            (r#"node_md_state{device="vault",state="active"}"#, 1.0),
        ],
    );
    let errors =
        format!(r#"uraid_member_io_errors_total{{device="vault",member="{pulled}",op="read"}}"#);
    assert!(value(&text, &errors) >= 1.0, "{text}");
    let healthy = format!(
        r#"uraid_member_io_errors_total{{device="vault",member="{}",op="read"}}"#,
        m[0]
    );
    expect(&text, &[(healthy.as_str(), 0.0)]);
    let reads = format!(
        r#"uraid_member_io_latency_seconds_count{{device="vault",member="{}",op="read"}}"#,
        m[0]
    );
    assert!(value(&text, &reads) >= 1.0, "the copy read member 0");
    let faulty = format!(
        r#"uraid_member_state{{device="vault",member="{pulled}",role="none",state="faulty"}}"#
    );
    expect(&text, &[(faulty.as_str(), 1.0)]);

    // A spare added: the rebuild runs, held at 1 MiB/s per member so that
    // it is still running when scraped (32 MiB take 30 s at that rate).
    speed_limit_max(&control, 1024);
    manage_ok(&control, &["--add", spare.to_str().unwrap()]);
    wait_status(&control, "the rebuild", Duration::from_secs(30), |s| {
        sync_line(s["mdstat"].as_str().unwrap_or_default()).is_some()
    });
    let text = scrape(addr);
    expect(
        &text,
        &[
            (r#"node_md_state{device="vault",state="recovering"}"#, 1.0),
            (r#"node_md_state{device="vault",state="active"}"#, 0.0),
            (r#"node_md_degraded{device="vault"}"#, 1.0),
            (r#"node_md_disks{device="vault",state="spare"}"#, 0.0),
            (r#"uraid_sync_action{device="vault",action="recover"}"#, 1.0),
        ],
    );
    let synced = value(&text, r#"node_md_blocks_synced{device="vault"}"#);
    assert!(
        synced < (32 * MIB / 1024) as f64,
        "per-member KiB: {synced}"
    );
    let ratio = value(&text, r#"uraid_sync_completed_ratio{device="vault"}"#);
    assert!((0.0..1.0).contains(&ratio), "{ratio}");
    let total = value(&text, r#"uraid_sync_total_bytes{device="vault"}"#);
    assert!(
        total > (30 * MIB) as f64 && total <= (32 * MIB) as f64,
        "one member's data: {total}"
    );
    let rebuilding = format!(
        r#"uraid_member_state{{device="vault",member="{}",role="1",state="rebuilding"}}"#,
        spare.display()
    );
    expect(&text, &[(rebuilding.as_str(), 1.0)]);

    // Unthrottled, it finishes: whole again, the pulled member still listed.
    speed_limit_max(&control, 200_000);
    wait_status(
        &control,
        "the rebuild's end",
        Duration::from_secs(60),
        status_whole_and_idle,
    );
    let text = scrape(addr);
    expect(
        &text,
        &[
            (r#"node_md_state{device="vault",state="active"}"#, 1.0),
            (r#"node_md_state{device="vault",state="recovering"}"#, 0.0),
            (r#"node_md_degraded{device="vault"}"#, 0.0),
            (r#"node_md_disks{device="vault",state="active"}"#, 4.0),
            (r#"node_md_disks{device="vault",state="failed"}"#, 1.0),
            (r#"node_md_blocks_synced{device="vault"}"#, kib),
            (r#"uraid_sync_completed_ratio{device="vault"}"#, 1.0),
        ],
    );
    let written = format!(
        r#"uraid_member_io_bytes_total{{device="vault",member="{}",op="write"}}"#,
        spare.display()
    );
    assert!(
        value(&text, &written) >= (32 * MIB - 4 * MIB) as f64,
        "{text}"
    );

    // Elsewhere than /metrics: 404.
    assert_eq!(http_get(addr, "/").code, 404);
    assert_eq!(http_get(addr, "/metricsx").code, 404);

    // An address that cannot be bound: one clear line.
    for bad in [
        addr.to_string(),
        "256.0.0.1:9100".into(),
        "localhost".into(),
    ] {
        let e = MetricsServer::start(&bad, Arc::new(Vec::new))
            .err()
            .unwrap_or_else(|| panic!("{bad} was bound"));
        assert!(
            e.starts_with(&format!("cannot serve metrics on {bad}: ")) && !e.contains('\n'),
            "{e}"
        );
    }

    // tiny_http's accept thread closes the socket once woken, after stop.
    metrics.stop();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "still listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    served.stop();
}
