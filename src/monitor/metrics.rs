//! Prometheus metrics of served arrays: `GET /metrics` in the text format
//! 0.0.4.
//!
//! The `node_md_*` families are node_exporter's md collector's, with its
//! names, label sets, types and HELP texts, and with md's way of counting:
//! the `device` label is the array's name as /dev/md/<name> shows it,
//! `node_md_blocks_synced` is /proc/mdstat's done figure, which on a
//! parity level counts KiB per member while `node_md_blocks` counts the
//! array's KiB, a repair shows as a resync, and during a reshape every
//! `node_md_state` series is 0 (the collector has no reshaping state). So
//! dashboards and the node-mixin alerts (NodeRAIDDegraded,
//! NodeRAIDDiskFailure) work unchanged. What md does not tell is in
//! `uraid_*` families: the array's UUID and level (`uraid_array_info`,
//! joined on `device`), the job's progress in bytes, ratio and ETA, the
//! stripe cache's and the journal's counters, the bitmap, mismatch_cnt,
//! and each member's state, I/O errors, bytes and latency histogram, and
//! on arrays with `--integrity` its checksum errors and untrusted blocks.
//!
//! The text is encoded by the Prometheus project's client
//! (`prometheus-client`, a collector built at each scrape) and served by
//! `tiny_http` on one thread.

use crate::control::StatusReply;
use crate::member::stats::LATENCY_BOUNDS_SECONDS;
use crate::member::OpCounts;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where scrapes get the arrays' status from (each call is a scrape).
pub type Source = Arc<dyn Fn() -> Vec<StatusReply> + Send + Sync>;

/// An HTTP server answering `GET /metrics` until stopped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (HOST:PORT; port 0 picks a free one) and serves
    /// scrapes from `source` on a thread of its own.
    pub fn start(
        addr: &str,
        source: Arc<dyn Fn() -> Vec<StatusReply> + Send + Sync>,
    ) -> Result<MetricsServer, String> {
        let server = tiny_http::Server::http(addr)
            .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        let local = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("cannot serve metrics on {addr}: not an IP address"))?;
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_server, thread_stop) = (server.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("uraid-metrics".into())
            .spawn(move || serve(&thread_server, &thread_stop, &source))
            .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        Ok(MetricsServer {
            server,
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and closes the listening socket.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(server: &tiny_http::Server, stop: &AtomicBool, source: &Source) {
    loop {
        let request = match server.recv() {
            Ok(request) => request,
            // An unblock (stop) or a failed accept: only the first ends it.
            Err(_) if stop.load(Ordering::SeqCst) => return,
            Err(_) => continue,
        };
        let path = request.url().split('?').next().unwrap_or("");
        let response = if path != "/metrics" {
            text_response(404, "not found; metrics are at /metrics\n".into())
        } else if !matches!(
            request.method(),
            tiny_http::Method::Get | tiny_http::Method::Head
        ) {
            text_response(405, "GET /metrics\n".into())
        } else {
            // A panic while asking for the status must cost one scrape,
            // not the server.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&source()))) {
                Ok(text) => text_response(200, text).with_header(header(
                    "Content-Type",
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                )),
                Err(_) => text_response(500, "the status could not be read\n".into()),
            }
        };
        // A client that went away has nothing more to hear.
        let _ = request.respond(response);
    }
}

fn text_response(code: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    tiny_http::Response::from_string(body).with_status_code(code)
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid header")
}

/// The exposition text (format 0.0.4) of these arrays.
pub fn render(arrays: &[StatusReply]) -> String {
    let mut arrays: Vec<(String, &StatusReply)> = arrays.iter().map(|a| (device(a), a)).collect();
    // Go's registry sorts series by label values; so do we, so that the
    // text reads as node_exporter's does.
    arrays.sort_by(|a, b| a.0.cmp(&b.0));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(families(&arrays))));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

/// md's device name: the name part of "homehost:name", as /dev/md/<name>
/// (from /proc/mdstat's first word for a server that predates the field).
fn device(a: &StatusReply) -> String {
    if a.name.is_empty() {
        return a.mdstat.split_whitespace().next().unwrap_or("").to_string();
    }
    crate::control::view::array_label(&a.name).to_string()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Gauge,
    /// Written with the `_total` suffix, which the name leaves out.
    Counter,
    Histogram,
}

#[derive(Debug, Clone)]
enum Value {
    Int(u64),
    Float(f64),
    Histogram(OpCounts),
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    series: Vec<(Labels, Value)>,
}

impl Family {
    fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            series: Vec::new(),
        }
    }

    fn add(&mut self, labels: Labels, value: Value) {
        self.series.push((labels, value));
    }

    fn int(&mut self, labels: Labels, value: u64) {
        self.add(labels, Value::Int(value));
    }
}

/// The families of one scrape, encoded in order by the client library.
#[derive(Debug)]
struct Families(Vec<Family>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.0.iter().filter(|f| !f.series.is_empty()) {
            let kind = match family.kind {
                Kind::Gauge => MetricType::Gauge,
                Kind::Counter => MetricType::Counter,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(family.name, family.help, None, kind)?;
            for (labels, value) in &family.series {
                let mut sample = metric.encode_family(labels)?;
                match (family.kind, value) {
                    (Kind::Counter, Value::Int(v)) => {
                        sample.encode_counter::<NoLabelSet, u64, u64>(v, None)?
                    }
                    (Kind::Counter, Value::Float(v)) => {
                        sample.encode_counter::<NoLabelSet, f64, f64>(v, None)?
                    }
                    (Kind::Gauge, Value::Int(v)) => sample.encode_gauge(v)?,
                    // Whole numbers as Go writes them ("1", not "1.0").
                    (Kind::Gauge, Value::Float(v)) if v.fract() == 0.0 && v.abs() < 1e15 => {
                        sample.encode_gauge(&(*v as i64))?
                    }
                    (Kind::Gauge, Value::Float(v)) => sample.encode_gauge(v)?,
                    (Kind::Histogram, Value::Histogram(counts)) => {
                        let bounds = LATENCY_BOUNDS_SECONDS.iter().copied();
                        let buckets: Vec<(f64, u64)> = bounds
                            .chain([f64::INFINITY])
                            .zip(counts.latency_buckets.iter().copied())
                            .collect();
                        let count = buckets.iter().map(|b| b.1).sum();
                        sample.encode_histogram::<NoLabelSet>(
                            counts.latency_seconds_sum,
                            count,
                            &buckets,
                            None,
                        )?
                    }
                    (kind, value) => unreachable!("{kind:?} with {value:?}"),
                }
            }
        }
        Ok(())
    }
}

/// node_exporter's node_md_state series, in Go's order, with the
/// procfs state each one is 1 for.
const MD_STATES: [&str; 5] = ["active", "check", "inactive", "recovering", "resync"];

/// md's sync_action words, "idle" first.
const SYNC_ACTIONS: [&str; 6] = ["idle", "resync", "recover", "check", "repair", "reshape"];

/// The procfs state of an array, as node_exporter's collector matches it;
/// None while it reshapes (no series is 1 then).
fn md_state(a: &StatusReply) -> Option<&'static str> {
    match a.sync.as_ref().map(|s| s.action.as_str()) {
        None => Some("active"),
        Some("recover") => Some("recovering"),
        // /proc/mdstat says "resync" for a repair.
        Some("resync" | "repair") => Some("resync"),
        Some("check") => Some("check"),
        _ => None,
    }
}

/// md's sysfs `degraded`: roles not in sync; raid0 and linear have none.
fn degraded(a: &StatusReply) -> u64 {
    match a.level.as_str() {
        "raid0" | "linear" => 0,
        _ => u64::from(a.raid_disks.saturating_sub(a.in_sync_disks)),
    }
}

fn dev(device: &str) -> Labels {
    vec![("device", device.to_string())]
}

fn with(device: &str, key: &'static str, value: &str) -> Labels {
    vec![("device", device.to_string()), (key, value.to_string())]
}

/// Every family of one scrape, in the order they are written: md's as
/// node_exporter names them, then uraid's by subject. Each step walks the
/// arrays in device order, so a family's series stay in that order.
fn families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    let mut out = md_families(arrays);
    out.extend(info_families(arrays));
    out.extend(job_families(arrays));
    out.extend(job_limit_families(arrays));
    out.extend(consistency_families(arrays));
    out.extend(cache_families(arrays));
    out.extend(journal_families(arrays));
    out.extend(member_families(arrays));
    out.extend(member_io_families(arrays));
    out.extend(member_checksum_families(arrays));
    // Two families of one name would make the text invalid for a scraper.
    let mut names: Vec<&str> = out.iter().map(|f| f.name).collect();
    names.sort_unstable();
    assert!(
        names.windows(2).all(|w| w[0] != w[1]),
        "a metric family is built twice: {names:?}"
    );
    out
}

/// `uraid_array_info`: what md's families lack to tell arrays apart
/// (UUID, name, level), joined on `device`.
fn info_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    let mut info = Family::new(
        "uraid_array_info",
        Kind::Gauge,
        "The array's UUID, name and level; joins node_md_* series on device.",
    );
    for (device, a) in arrays {
        info.int(
            vec![
                ("device", device.clone()),
                ("level", a.level.clone()),
                ("name", a.name.clone()),
                ("uuid", a.uuid.clone()),
            ],
            1,
        );
    }
    vec![info]
}

/// The running background job: which one, and its progress in bytes,
/// ratio, speed and ETA (md gives only blocks per member).
fn job_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::Gauge;
    let mut action = Family::new(
        "uraid_sync_action",
        Gauge,
        "The background job running, by md's sync_action word (1 for the one running).",
    );
    let mut ratio = Family::new(
        "uraid_sync_completed_ratio",
        Gauge,
        "Fraction of the running job done (1 when idle).",
    );
    let mut done = Family::new(
        "uraid_sync_completed_bytes",
        Gauge,
        "Bytes per member the running job has done.",
    );
    let mut total = Family::new(
        "uraid_sync_total_bytes",
        Gauge,
        "Bytes per member the running job covers.",
    );
    let mut speed = Family::new(
        "uraid_sync_speed_bytes_per_second",
        Gauge,
        "Average speed of the running job since it started, bytes per second per member.",
    );
    let mut eta = Family::new(
        "uraid_sync_eta_seconds",
        Gauge,
        "Seconds the running job needs at its average speed.",
    );
    for (device, a) in arrays {
        let d = device.as_str();
        let running = a.sync.as_ref().map_or("idle", |s| s.action.as_str());
        for word in SYNC_ACTIONS {
            action.int(with(d, "action", word), u64::from(word == running));
        }
        let Some(s) = &a.sync else {
            ratio.add(dev(d), Value::Float(1.0));
            continue;
        };
        let left_kib = s.total_kib.saturating_sub(s.done_kib);
        ratio.add(
            dev(d),
            Value::Float(s.done_kib as f64 / s.total_kib.max(1) as f64),
        );
        done.int(dev(d), s.done_kib << 10);
        total.int(dev(d), s.total_kib << 10);
        speed.int(dev(d), s.speed_kib_per_s << 10);
        if s.speed_kib_per_s > 0 {
            eta.add(
                dev(d),
                Value::Float(left_kib as f64 / s.speed_kib_per_s as f64),
            );
        }
    }
    vec![action, ratio, done, total, speed, eta]
}

/// What bounds and schedules the jobs: md's speed limits and the next
/// scheduled check.
fn job_limit_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::Gauge;
    let mut speed_min = Family::new(
        "uraid_sync_speed_limit_min_bytes_per_second",
        Gauge,
        "md's speed_limit_min: the rate a job keeps whatever the foreground load, per member.",
    );
    let mut speed_max = Family::new(
        "uraid_sync_speed_limit_max_bytes_per_second",
        Gauge,
        "md's speed_limit_max: the rate a job never exceeds, per member.",
    );
    let mut next_check = Family::new(
        "uraid_next_check_seconds",
        Gauge,
        "Seconds until the next scheduled consistency check.",
    );
    for (device, a) in arrays {
        let d = device.as_str();
        if a.speed_limit_max_kib_per_s > 0 {
            speed_min.int(dev(d), a.speed_limit_min_kib_per_s << 10);
            speed_max.int(dev(d), a.speed_limit_max_kib_per_s << 10);
        }
        if let Some(secs) = a.next_check_in_secs {
            next_check.int(dev(d), secs);
        }
    }
    vec![speed_min, speed_max, next_check]
}

/// What the last check found inconsistent and what a resync after a
/// crash would cover (the write-intent bitmap).
fn consistency_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::Gauge;
    let mut mismatch = Family::new(
        "uraid_mismatch_cnt",
        Gauge,
        "md's mismatch_cnt: sectors the last check, repair or resync found inconsistent.",
    );
    let mut bitmap_dirty = Family::new(
        "uraid_bitmap_dirty_chunks",
        Gauge,
        "Chunks the write-intent bitmap marks dirty (a resync after a crash covers only these).",
    );
    let mut bitmap_chunks = Family::new(
        "uraid_bitmap_chunks",
        Gauge,
        "Chunks of the write-intent bitmap.",
    );
    for (device, a) in arrays {
        let d = device.as_str();
        mismatch.int(dev(d), a.mismatch_cnt);
        if let Some((dirty, all)) = a.bitmap_dirty_chunks {
            bitmap_dirty.int(dev(d), dirty);
            bitmap_chunks.int(dev(d), all);
        }
    }
    vec![mismatch, bitmap_dirty, bitmap_chunks]
}

/// The stripe cache's occupancy and counters, for arrays that have one.
fn cache_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::{Counter, Gauge};
    let mut cache_used = Family::new(
        "uraid_stripe_cache_entries_used",
        Gauge,
        "Stripe cache entries (md's stripe_cache_size units) held by write batches.",
    );
    let mut cache_size = Family::new(
        "uraid_stripe_cache_size",
        Gauge,
        "md's stripe_cache_size: the stripe cache's entries.",
    );
    let mut cache_hits = Family::new(
        "uraid_stripe_cache_hits",
        Counter,
        "Reads served from memory (kind=read) and read-modify-writes that found their parity in memory (kind=parity).",
    );
    let mut cache_misses = Family::new(
        "uraid_stripe_cache_misses",
        Counter,
        "Reads that went to the members (kind=read) and read-modify-writes that read their parity (kind=parity).",
    );
    let mut cache_rows = Family::new(
        "uraid_stripe_cache_rows_written",
        Counter,
        "Rows the stripe cache wrote out whole, without reads (kind=full), and in part (kind=partial).",
    );
    let mut cache_writes = Family::new(
        "uraid_stripe_cache_writes",
        Counter,
        "Writes that joined a batch (path=gathered) and partial-row writes that went straight to the members (path=direct).",
    );
    for (device, a) in arrays {
        let d = device.as_str();
        let Some(c) = &a.stripe_cache else { continue };
        cache_used.int(dev(d), c.entries_in_use as u64);
        cache_size.int(dev(d), c.capacity as u64);
        cache_hits.int(with(d, "kind", "parity"), c.parity_hits);
        cache_hits.int(with(d, "kind", "read"), c.read_hits);
        cache_misses.int(with(d, "kind", "parity"), c.parity_misses);
        cache_misses.int(with(d, "kind", "read"), c.read_misses);
        cache_rows.int(with(d, "kind", "full"), c.full_rows);
        cache_rows.int(with(d, "kind", "partial"), c.partial_rows);
        cache_writes.int(with(d, "path", "direct"), c.direct_writes);
        cache_writes.int(with(d, "path", "gathered"), c.gathered_writes);
    }
    vec![
        cache_used,
        cache_size,
        cache_hits,
        cache_misses,
        cache_rows,
        cache_writes,
    ]
}

/// The write journal's counters, size and health, for arrays that have
/// one.
fn journal_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::{Counter, Gauge};
    let mut journal_pages = Family::new(
        "uraid_journal_pages_written",
        Counter,
        "Pages written to the write journal.",
    );
    let mut journal_commits = Family::new(
        "uraid_journal_commits",
        Counter,
        "Writes to the journal device, each making one or more callers' rows durable.",
    );
    let mut journal_callers = Family::new(
        "uraid_journal_commit_callers",
        Counter,
        "Callers the journal's commits carried (more callers than commits is group commit).",
    );
    let mut journal_reclaims = Family::new(
        "uraid_journal_reclaims",
        Counter,
        "Times the journal's space was reclaimed.",
    );
    let mut journal_replayed = Family::new(
        "uraid_journal_replayed_rows",
        Counter,
        "Rows the last start replayed from the journal.",
    );
    let mut journal_size = Family::new(
        "uraid_journal_size_bytes",
        Gauge,
        "Size of the journal's ring.",
    );
    let mut journal_failed = Family::new(
        "uraid_journal_failed",
        Gauge,
        "1 when the journal device has failed.",
    );
    for (device, a) in arrays {
        let d = device.as_str();
        let Some(j) = &a.journal else { continue };
        journal_pages.int(dev(d), j.pages_written);
        journal_commits.int(dev(d), j.commits);
        journal_callers.int(dev(d), j.callers);
        journal_reclaims.int(dev(d), j.reclaims);
        journal_replayed.int(dev(d), j.replayed_rows);
        journal_size.int(dev(d), j.ring_sectors * 512);
        journal_failed.int(dev(d), u64::from(j.failed.is_some()));
    }
    vec![
        journal_pages,
        journal_commits,
        journal_callers,
        journal_reclaims,
        journal_replayed,
        journal_size,
        journal_failed,
    ]
}

/// Each member's state and role, and its SMART verdict where it is
/// polled.
fn member_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    let mut state = Family::new(
        "uraid_member_state",
        Kind::Gauge,
        "Each device of the array, with its state (in_sync, rebuilding, replacement, spare, faulty, journal) and role.",
    );
    let mut smart = Family::new(
        "uraid_member_smart_status",
        Kind::Gauge,
        "SMART verdict of each member that is polled (passed, warning, failing, unavailable): 1 for the one in force.",
    );
    for (device, a) in arrays {
        for m in members_by_path(a) {
            let role = m.role.map_or_else(|| "none".to_string(), |r| r.to_string());
            state.int(
                vec![
                    ("device", device.clone()),
                    ("member", m.path.clone()),
                    ("role", role),
                    ("state", m.state.clone()),
                ],
                1,
            );
            let Some(verdict) = &m.smart else { continue };
            for status in ["passed", "warning", "failing", "unavailable"] {
                smart.int(
                    vec![
                        ("device", device.clone()),
                        ("member", m.path.clone()),
                        ("status", status.to_string()),
                    ],
                    u64::from(verdict == status),
                );
            }
        }
    }
    vec![state, smart]
}

/// Each member's I/O errors, bytes and latency, by operation.
fn member_io_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::{Counter, Histogram};
    let mut errors = Family::new(
        "uraid_member_io_errors",
        Counter,
        "Member reads and writes that failed.",
    );
    let mut bytes = Family::new(
        "uraid_member_io_bytes",
        Counter,
        "Bytes of member reads and writes that succeeded.",
    );
    let mut latency = Family::new(
        "uraid_member_io_latency_seconds",
        Histogram,
        "Time of member reads and writes, from queueing to completion.",
    );
    for (device, a) in arrays {
        for m in members_by_path(a) {
            let Some(io) = &m.io else { continue };
            for (op, counts) in [("read", &io.read), ("write", &io.write)] {
                let labels = vec![
                    ("device", device.clone()),
                    ("member", m.path.clone()),
                    ("op", op.to_string()),
                ];
                errors.int(labels.clone(), counts.errors);
                bytes.int(labels.clone(), counts.bytes);
                latency.add(labels, Value::Histogram(counts.clone()));
            }
        }
    }
    vec![errors, bytes, latency]
}

/// Each member's checksum errors (zpool status's CKSUM) and the blocks it
/// reads unverified, on arrays whose members keep checksums.
fn member_checksum_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    let mut errors = Family::new(
        "uraid_member_checksum_errors",
        Kind::Counter,
        "Member blocks that failed their checksum since the member was opened (each corrected from redundancy where it could be).",
    );
    let mut untrusted = Family::new(
        "uraid_member_untrusted_blocks",
        Kind::Gauge,
        "Member blocks whose checksum is not known yet, read without verification until written or checked.",
    );
    for (device, a) in arrays {
        for m in members_by_path(a) {
            let labels = vec![("device", device.clone()), ("member", m.path.clone())];
            if let Some(n) = m.checksum_errors {
                errors.int(labels.clone(), n);
            }
            if let Some(n) = m.untrusted_blocks {
                untrusted.int(labels, n);
            }
        }
    }
    vec![errors, untrusted]
}

/// An array's members in path order, as Go's registry sorts the series.
fn members_by_path(a: &StatusReply) -> Vec<&crate::control::MemberStatus> {
    let mut members: Vec<_> = a.members.iter().collect();
    members.sort_by(|x, y| x.path.cmp(&y.path));
    members
}

/// node_exporter's md collector's families, by name as its registry
/// sorts them.
fn md_families(arrays: &[(String, &StatusReply)]) -> Vec<Family> {
    use Kind::Gauge;
    let mut blocks = Family::new("node_md_blocks", Gauge, "Total number of blocks on device.");
    let mut synced = Family::new(
        "node_md_blocks_synced",
        Gauge,
        "Number of blocks synced on device.",
    );
    let mut degraded_f = Family::new(
        "node_md_degraded",
        Gauge,
        "Number of degraded disks on device.",
    );
    let mut disks = Family::new(
        "node_md_disks",
        Gauge,
        "Number of active/failed/spare disks of device.",
    );
    let mut required = Family::new(
        "node_md_disks_required",
        Gauge,
        "Total number of disks of device.",
    );
    let mut raid_disks = Family::new(
        "node_md_raid_disks",
        Gauge,
        "Number of raid disks on device.",
    );
    let mut state = Family::new("node_md_state", Gauge, "Indicates the state of md-device.");
    for (device, a) in arrays {
        let d = device.as_str();
        blocks.int(dev(d), a.array_kib);
        synced.int(dev(d), a.sync.as_ref().map_or(a.array_kib, |s| s.done_kib));
        degraded_f.int(dev(d), degraded(a));
        disks.int(with(d, "state", "active"), u64::from(a.in_sync_disks));
        disks.int(with(d, "state", "failed"), u64::from(a.failed_disks));
        disks.int(with(d, "state", "spare"), u64::from(a.spare_disks));
        required.int(dev(d), u64::from(a.raid_disks));
        raid_disks.int(dev(d), u64::from(a.raid_disks));
        let now = md_state(a);
        for s in MD_STATES {
            state.int(with(d, "state", s), u64::from(now == Some(s)));
        }
    }
    vec![
        blocks, synced, degraded_f, disks, required, raid_disks, state,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{MemberStatus, SyncStatus};
    use crate::member::IoCounts;

    /// A raid5 of four 1 MiB members ("host:data"), as a server reports it.
    fn raid5() -> StatusReply {
        StatusReply {
            name: "host:data".into(),
            uuid: "0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9".into(),
            level: "raid5".into(),
            raid_disks: 4,
            in_sync_disks: 4,
            array_kib: 3072,
            speed_limit_min_kib_per_s: 1000,
            speed_limit_max_kib_per_s: 200000,
            members: (0..4)
                .map(|role| MemberStatus {
                    path: format!("/dev/loop{role}"),
                    state: "in_sync".into(),
                    role: Some(role),
                    io: None,
                    smart: None,
                    failure: None,
                    checksum_errors: None,
                    untrusted_blocks: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn sync(action: &str, done_kib: u64, total_kib: u64) -> Option<SyncStatus> {
        Some(SyncStatus {
            action: action.into(),
            done_kib,
            total_kib,
            speed_kib_per_s: 100,
            pace: None,
        })
    }

    /// The sample lines of the node_md_* families.
    fn md_samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| l.starts_with("node_md_")).collect()
    }

    fn has(text: &str, line: &str) {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{text}"
        );
    }

    #[test]
    fn healthy_array_reads_as_node_exporters_md_collector() {
        let text = render(&[raid5()]);
        let md: Vec<&str> = text.lines().take_while(|l| !l.contains("uraid_")).collect();
        let expected = r#"# HELP node_md_blocks Total number of blocks on device.
# TYPE node_md_blocks gauge
node_md_blocks{device="data"} 3072
# HELP node_md_blocks_synced Number of blocks synced on device.
# TYPE node_md_blocks_synced gauge
node_md_blocks_synced{device="data"} 3072
# HELP node_md_degraded Number of degraded disks on device.
# TYPE node_md_degraded gauge
node_md_degraded{device="data"} 0
# HELP node_md_disks Number of active/failed/spare disks of device.
# TYPE node_md_disks gauge
node_md_disks{device="data",state="active"} 4
node_md_disks{device="data",state="failed"} 0
node_md_disks{device="data",state="spare"} 0
# HELP node_md_disks_required Total number of disks of device.
# TYPE node_md_disks_required gauge
node_md_disks_required{device="data"} 4
# HELP node_md_raid_disks Number of raid disks on device.
# TYPE node_md_raid_disks gauge
node_md_raid_disks{device="data"} 4
# HELP node_md_state Indicates the state of md-device.
# TYPE node_md_state gauge
node_md_state{device="data",state="active"} 1
node_md_state{device="data",state="check"} 0
node_md_state{device="data",state="inactive"} 0
node_md_state{device="data",state="recovering"} 0
node_md_state{device="data",state="resync"} 0"#;
        assert_eq!(md.join("\n"), expected);
        has(
            &text,
            r#"uraid_array_info{device="data",level="raid5",name="host:data",uuid="0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9"} 1"#,
        );
        has(&text, r#"uraid_sync_action{device="data",action="idle"} 1"#);
        has(&text, r#"uraid_sync_completed_ratio{device="data"} 1"#);
        assert!(!text.contains("uraid_sync_eta_seconds{"), "no job, no ETA");
        has(
            &text,
            r#"uraid_member_state{device="data",member="/dev/loop2",role="2",state="in_sync"} 1"#,
        );
    }

    #[test]
    fn degraded_array_fires_the_mixin_alerts_inputs() {
        let mut a = raid5();
        a.in_sync_disks = 3;
        a.failed_disks = 1;
        a.members[1].state = "faulty".into();
        a.members[1].role = None;
        let text = render(&[a]);
        // NodeRAIDDegraded: disks_required - disks{active} > 0;
        // NodeRAIDDiskFailure: disks{failed} > 0.
        assert_eq!(
            md_samples(&text)
                .into_iter()
                .filter(|l| l.starts_with("node_md_d"))
                .collect::<Vec<_>>(),
            [
                r#"node_md_degraded{device="data"} 1"#,
                r#"node_md_disks{device="data",state="active"} 3"#,
                r#"node_md_disks{device="data",state="failed"} 1"#,
                r#"node_md_disks{device="data",state="spare"} 0"#,
                r#"node_md_disks_required{device="data"} 4"#,
            ]
        );
        has(&text, r#"node_md_state{device="data",state="active"} 1"#);
        has(
            &text,
            r#"uraid_member_state{device="data",member="/dev/loop1",role="none",state="faulty"} 1"#,
        );
    }

    #[test]
    fn recovery_counts_per_member_kib_as_mdstat_does() {
        let mut a = raid5();
        a.in_sync_disks = 3;
        a.members[3].state = "rebuilding".into();
        a.sync = sync("recover", 256, 1024);
        let text = render(&[a]);
        for line in [
            r#"node_md_blocks{device="data"} 3072"#,
            r#"node_md_blocks_synced{device="data"} 256"#,
            r#"node_md_degraded{device="data"} 1"#,
            r#"node_md_disks{device="data",state="spare"} 0"#,
            r#"node_md_state{device="data",state="active"} 0"#,
            r#"node_md_state{device="data",state="recovering"} 1"#,
            r#"uraid_sync_action{device="data",action="recover"} 1"#,
            r#"uraid_sync_action{device="data",action="idle"} 0"#,
            r#"uraid_sync_completed_ratio{device="data"} 0.25"#,
            r#"uraid_sync_completed_bytes{device="data"} 262144"#,
            r#"uraid_sync_total_bytes{device="data"} 1048576"#,
            r#"uraid_sync_speed_bytes_per_second{device="data"} 102400"#,
            r#"uraid_sync_eta_seconds{device="data"} 7.68"#,
        ] {
            has(&text, line);
        }
    }

    #[test]
    fn check_and_repair_take_mds_words() {
        let mut a = raid5();
        a.sync = sync("check", 512, 1024);
        let check = render(&[a.clone()]);
        // /proc/mdstat shows a repair as a resync.
        a.sync = sync("repair", 512, 1024);
        let repair = render(&[a]);
        for (text, line) in [
            (&check, r#"node_md_state{device="data",state="check"} 1"#),
            (&check, r#"node_md_state{device="data",state="active"} 0"#),
            (&check, r#"node_md_blocks_synced{device="data"} 512"#),
            (
                &check,
                r#"uraid_sync_action{device="data",action="check"} 1"#,
            ),
            (&repair, r#"node_md_state{device="data",state="resync"} 1"#),
            (&repair, r#"node_md_state{device="data",state="check"} 0"#),
            (
                &repair,
                r#"uraid_sync_action{device="data",action="repair"} 1"#,
            ),
        ] {
            has(text, line);
        }
    }

    #[test]
    fn every_state_is_zero_during_a_reshape() {
        let mut a = raid5();
        a.sync = sync("reshape", 300, 1024);
        let text = render(&[a]);
        let states: Vec<&str> = md_samples(&text)
            .into_iter()
            .filter(|l| l.starts_with("node_md_state"))
            .collect();
        assert_eq!(states.len(), 5);
        assert!(states.iter().all(|l| l.ends_with(" 0")), "{states:?}");
        has(&text, r#"node_md_blocks_synced{device="data"} 300"#);
        has(
            &text,
            r#"uraid_sync_action{device="data",action="reshape"} 1"#,
        );
    }

    #[test]
    fn raid0_is_never_degraded() {
        let mut a = raid5();
        a.level = "raid0".into();
        a.in_sync_disks = 3;
        let text = render(&[a]);
        has(&text, r#"node_md_degraded{device="data"} 0"#);
    }

    #[test]
    fn members_caches_and_journals_have_their_families() {
        let mut a = raid5();
        let mut counts = OpCounts {
            ops: 5,
            errors: 2,
            bytes: 12288,
            latency_seconds_sum: 0.5,
            latency_buckets: vec![0; LATENCY_BOUNDS_SECONDS.len() + 1],
        };
        counts.latency_buckets[0] = 3;
        counts.latency_buckets[4] = 1;
        counts.latency_buckets[LATENCY_BOUNDS_SECONDS.len()] = 1;
        a.members[0].io = Some(IoCounts {
            read: counts,
            write: OpCounts::default(),
        });
        a.mismatch_cnt = 16;
        a.bitmap_dirty_chunks = Some((3, 64));
        a.stripe_cache = Some(crate::engine::CacheReport {
            capacity: 256,
            read_hits: 7,
            parity_misses: 4,
            ..Default::default()
        });
        let text = render(&[a]);
        let op = r#"device="data",member="/dev/loop0",op="read""#;
        for line in [
            format!("uraid_member_io_errors_total{{{op}}} 2"),
            format!("uraid_member_io_bytes_total{{{op}}} 12288"),
            format!("uraid_member_io_latency_seconds_bucket{{{op},le=\"0.0001\"}} 3"),
            format!("uraid_member_io_latency_seconds_bucket{{{op},le=\"0.00025\"}} 3"),
            format!("uraid_member_io_latency_seconds_bucket{{{op},le=\"0.0025\"}} 4"),
            format!("uraid_member_io_latency_seconds_bucket{{{op},le=\"10\"}} 4"),
            format!("uraid_member_io_latency_seconds_bucket{{{op},le=\"+Inf\"}} 5"),
            format!("uraid_member_io_latency_seconds_sum{{{op}}} 0.5"),
            format!("uraid_member_io_latency_seconds_count{{{op}}} 5"),
            "# TYPE uraid_member_io_latency_seconds histogram".into(),
            "# TYPE uraid_member_io_errors_total counter".into(),
            r#"uraid_mismatch_cnt{device="data"} 16"#.into(),
            r#"uraid_bitmap_dirty_chunks{device="data"} 3"#.into(),
            r#"uraid_bitmap_chunks{device="data"} 64"#.into(),
            r#"uraid_stripe_cache_size{device="data"} 256"#.into(),
            r#"uraid_stripe_cache_hits_total{device="data",kind="read"} 7"#.into(),
            r#"uraid_stripe_cache_misses_total{device="data",kind="parity"} 4"#.into(),
        ] {
            has(&text, &line);
        }
        // Members without counters (loop1..3 here) have no I/O series.
        assert!(!text.contains(r#"member="/dev/loop1",op="#));
        assert!(!text.contains("uraid_journal_"), "no journal, no series");
    }

    #[test]
    fn members_with_checksums_count_their_errors() {
        let mut a = raid5();
        for m in &mut a.members {
            m.checksum_errors = Some(0);
            m.untrusted_blocks = Some(0);
        }
        a.members[1].checksum_errors = Some(2);
        a.members[3].untrusted_blocks = Some(1536);
        let text = render(&[a]);
        for line in [
            "# TYPE uraid_member_checksum_errors_total counter",
            r#"uraid_member_checksum_errors_total{device="data",member="/dev/loop0"} 0"#,
            r#"uraid_member_checksum_errors_total{device="data",member="/dev/loop1"} 2"#,
            "# TYPE uraid_member_untrusted_blocks gauge",
            r#"uraid_member_untrusted_blocks{device="data",member="/dev/loop1"} 0"#,
            r#"uraid_member_untrusted_blocks{device="data",member="/dev/loop3"} 1536"#,
        ] {
            has(&text, line);
        }
        assert!(text.contains("# HELP uraid_member_checksum_errors_total Member blocks"));
        // Without --integrity there is nothing to count: no family at all.
        let plain = render(&[raid5()]);
        assert!(!plain.contains("checksum"), "{plain}");
        assert!(!plain.contains("untrusted"), "{plain}");
    }

    #[test]
    fn arrays_share_each_family_in_device_order() {
        let mut b = raid5();
        b.name = "host:backup".into();
        let text = render(&[raid5(), b]);
        let blocks: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("node_md_blocks{"))
            .collect();
        assert_eq!(
            blocks,
            [
                r#"node_md_blocks{device="backup"} 3072"#,
                r#"node_md_blocks{device="data"} 3072"#
            ]
        );
        assert_eq!(text.matches("# TYPE node_md_blocks gauge").count(), 1);
    }
}
