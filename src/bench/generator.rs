//! The closed-loop load generator: `jobs` jobs, each keeping
//! `depth_per_job` requests in flight, at aligned offsets drawn from a fixed
//! seed, for a warm-up and then a measured interval.
//!
//! Over NBD a job is one connection with its requests pipelined, driven
//! by one thread that sends requests and reads replies in batches. On
//! plain files a job is `depth_per_job` threads doing synchronous
//! positional I/O, as fio's psync engine with that many jobs: the same
//! concurrency without an async I/O layer.

use super::buffers::{check_pattern, fill_pattern, noise, AlignedBuf};
use super::targets::{thread_cpu_seconds, Access, RawStripes};
use super::workload::{Op, Pattern, Phase, JOB_DEPTH_MAX};
use crate::export::nbd::client as nbd_client;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latencies above this are recorded as this (an hour, in ns).
const LATENCY_NS_MAX: u64 = 3_600_000_000_000;

/// How long a phase runs.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What a phase measured.
pub struct Outcome {
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Request latencies in ns, submit to completion.
    pub latency_ns: Histogram<u64>,
    /// CPU time of the generator's own threads (client side) in the
    /// measured window (each from its first submission in it).
    pub cpu_client_seconds: f64,
}

/// How data is written and checked.
#[derive(Clone, Copy, Debug)]
pub struct DataMode {
    /// `Some(salt)`: writes carry the address pattern and reads are checked.
    pub verify_salt: Option<u64>,
    pub seed: u64,
}

/// The measured interval of a phase, shared by its threads. Requests are
/// submitted until `end`, and past it, up to `GRACE`, while none has been
/// recorded yet: a phase always measures at least one request, however
/// slow. The requests in flight at `end` are waited for and counted, and
/// the measured time runs to the last completion, as fio counts.
struct Window {
    measure_from: Instant,
    end: Instant,
    recorded: AtomicU64,
    /// Nanoseconds from `measure_from` to the latest recorded completion.
    last_completion_ns: AtomicU64,
}

/// How long past its end a phase goes on waiting for its first request.
const GRACE: Duration = Duration::from_secs(60);

impl Window {
    fn keep_going(&self, now: Instant) -> bool {
        now < self.end || (self.recorded.load(Ordering::Relaxed) == 0 && now < self.end + GRACE)
    }

    fn seconds(&self) -> f64 {
        let last = Duration::from_nanos(self.last_completion_ns.load(Ordering::Relaxed));
        last.max(self.end - self.measure_from).as_secs_f64()
    }
}

/// Counts the requests submitted inside the measured window.
struct Recorder {
    latency_ns: Histogram<u64>,
    ops: u64,
    bytes: u64,
    /// The thread's CPU time when it first submitted in the measured
    /// window: its CPU is counted from there, as the requests are (the
    /// warm-up's CPU is not the measured requests').
    cpu_at_window: Option<f64>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            latency_ns: Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid bounds"),
            ops: 0,
            bytes: 0,
            cpu_at_window: None,
        }
    }

    /// The thread's CPU seconds in the measured window, given its CPU time
    /// now (at its end).
    fn window_cpu(result: &Result<Recorder, String>, now: f64) -> f64 {
        match result {
            Ok(Recorder {
                cpu_at_window: Some(at),
                ..
            }) => (now - at).max(0.0),
            _ => 0.0,
        }
    }

    fn record(&mut self, window: &Window, submitted: Instant, completed: Instant, bytes: u64) {
        if submitted < window.measure_from {
            return;
        }
        let ns = completed.duration_since(submitted).as_nanos() as u64;
        self.latency_ns.saturating_record(ns.max(1));
        self.ops += 1;
        self.bytes += bytes;
        window.recorded.fetch_add(1, Ordering::Relaxed);
        let since = completed.duration_since(window.measure_from).as_nanos() as u64;
        window
            .last_completion_ns
            .fetch_max(since, Ordering::Relaxed);
    }

    /// Called as requests are submitted: at the first one in the measured
    /// window, the thread's CPU time is taken (its CPU counts from there,
    /// as the target's does from the window's opening).
    fn note_submitted(&mut self, window: &Window, at: Instant) {
        if self.cpu_at_window.is_none() && at >= window.measure_from {
            self.cpu_at_window = Some(thread_cpu_seconds());
        }
    }

    fn merge(&mut self, other: Recorder) {
        self.latency_ns.add(&other.latency_ns).expect("same bounds");
        self.ops += other.ops;
        self.bytes += other.bytes;
    }
}

/// Where the next request of a job goes.
struct Offsets {
    pattern: Pattern,
    block_bytes: u64,
    /// Random: the whole target. Sequential: the job's own region.
    region_start: u64,
    region_blocks: u64,
    /// Sequential position, shared by the lanes of a job.
    cursor: AtomicU64,
}

impl Offsets {
    fn new(phase: &Phase, size_bytes: u64, job: u32) -> Result<Offsets, String> {
        let block = phase.block_bytes;
        let (region_start, region_bytes) = match phase.pattern {
            Pattern::Random => (0, size_bytes),
            Pattern::Sequential => {
                let per_job = size_bytes / phase.jobs as u64 / block * block;
                (job as u64 * per_job, per_job)
            }
        };
        let region_blocks = region_bytes / block;
        if region_blocks == 0 {
            return Err(format!(
                "{} {}: the target ({size_bytes} bytes) is too small for {} jobs of {block}-byte requests",
                phase.workload.name(),
                phase.name,
                phase.jobs
            ));
        }
        Ok(Offsets {
            pattern: phase.pattern,
            block_bytes: block,
            region_start,
            region_blocks,
            cursor: AtomicU64::new(0),
        })
    }

    fn next(&self, rng: &mut impl Rng) -> u64 {
        let block = match self.pattern {
            Pattern::Random => rng.gen_range(0..self.region_blocks),
            Pattern::Sequential => self.cursor.fetch_add(1, Ordering::Relaxed) % self.region_blocks,
        };
        self.region_start + block * self.block_bytes
    }
}

fn lane_rng(seed: u64, job: u32, lane: u32) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ ((job as u64) << 40) ^ ((lane as u64) << 20))
}

/// Runs one phase against a target.
/// Runs one phase; `at_window` is called once the warm-up is over, when
/// the measured window opens (the caller samples the target's CPU there).
pub fn run_phase(
    access: &Access,
    phase: &Phase,
    limits: Limits,
    data: DataMode,
    at_window: &(dyn Fn() + Sync),
) -> Result<Outcome, String> {
    let size_bytes = access.size_bytes();
    let offsets: Vec<Arc<Offsets>> = (0..phase.jobs)
        .map(|job| Offsets::new(phase, size_bytes, job).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let measure_from = start + limits.warmup;
    let window = Arc::new(Window {
        measure_from,
        end: measure_from + limits.measure,
        recorded: AtomicU64::new(0),
        last_completion_ns: AtomicU64::new(0),
    });
    let client_cpu = Arc::new(Mutex::new(0.0f64));
    let results: Vec<Result<Recorder, String>> = std::thread::scope(|scope| {
        scope.spawn(move || {
            std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
            at_window();
        });
        let mut handles = Vec::new();
        for (job, offsets) in offsets.iter().enumerate() {
            let job = job as u32;
            match access {
                Access::Nbd { socket, export, .. } => {
                    let (socket, export, offsets, cpu, window) = (
                        socket.clone(),
                        export.clone(),
                        offsets.clone(),
                        client_cpu.clone(),
                        window.clone(),
                    );
                    handles.push(scope.spawn(move || {
                        let spec = NbdJob {
                            socket: &socket,
                            export: &export,
                            phase,
                            offsets: &offsets,
                            data,
                            job,
                            window: &window,
                            cpu: &cpu,
                        };
                        spec.run()
                    }));
                }
                Access::Files(files) => {
                    for lane in 0..phase.depth_per_job {
                        let (files, offsets, cpu, window) = (
                            files.clone(),
                            offsets.clone(),
                            client_cpu.clone(),
                            window.clone(),
                        );
                        handles.push(scope.spawn(move || {
                            let result =
                                file_lane(&files, phase, &offsets, data, job, lane, &window);
                            *cpu.lock().unwrap() +=
                                Recorder::window_cpu(&result, thread_cpu_seconds());
                            result
                        }));
                    }
                }
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect()
    });
    let mut total = Recorder::new();
    for result in results {
        total.merge(result?);
    }
    let cpu_client_seconds = *client_cpu.lock().unwrap();
    Ok(Outcome {
        ops: total.ops,
        bytes: total.bytes,
        seconds: window.seconds(),
        latency_ns: total.latency_ns,
        cpu_client_seconds,
    })
}

/// One synchronous lane over the raw files.
#[allow(clippy::too_many_arguments)]
fn file_lane(
    files: &RawStripes,
    phase: &Phase,
    offsets: &Offsets,
    data: DataMode,
    job: u32,
    lane: u32,
    window: &Window,
) -> Result<Recorder, String> {
    let mut rng = lane_rng(data.seed, job, lane);
    let mut recorder = Recorder::new();
    let len = phase.block_bytes as usize;
    let noise_buf = match (phase.op, data.verify_salt) {
        (Op::Write | Op::Mixed, None) => Some(noise(len, data.seed ^ job as u64)),
        _ => None,
    };
    let mut buf = AlignedBuf::zeroed(len);
    loop {
        let submitted = Instant::now();
        recorder.note_submitted(window, submitted);
        if !window.keep_going(submitted) {
            return Ok(recorder);
        }
        let offset = offsets.next(&mut rng);
        let op = match phase.op {
            Op::Mixed if rng.gen_bool(0.5) => Op::Read,
            Op::Mixed => Op::Write,
            op => op,
        };
        match op {
            Op::Write => match data.verify_salt {
                Some(salt) => {
                    fill_pattern(&mut buf, offset, salt);
                    files.write_at(offset, &buf)
                }
                None => files.write_at(offset, noise_buf.as_ref().expect("made for writes")),
            },
            Op::Read => files.read_at(offset, &mut buf),
            Op::Mixed => unreachable!("drawn above"),
        }
        .map_err(|e| format!("raw files at {offset}: {e}"))?;
        let completed = Instant::now();
        if let (Op::Read, Some(salt)) = (op, data.verify_salt) {
            verify(&buf, offset, salt)?;
        }
        recorder.record(window, submitted, completed, len as u64);
    }
}

fn verify(buf: &[u8], offset: u64, salt: u64) -> Result<(), String> {
    match check_pattern(buf, offset, salt) {
        None => Ok(()),
        Some(bad) => Err(format!(
            "verify: the {}-byte read at {offset} holds wrong data at byte {bad}",
            buf.len()
        )),
    }
}

/// A request in flight on a connection, by cookie.
#[derive(Clone, Copy)]
struct Pending {
    offset: u64,
    submitted: Instant,
}

struct NbdJob<'a> {
    socket: &'a std::path::Path,
    export: &'a str,
    phase: &'a Phase,
    offsets: &'a Offsets,
    data: DataMode,
    job: u32,
    window: &'a Arc<Window>,
    cpu: &'a Mutex<f64>,
}

impl NbdJob<'_> {
    /// Keeps `depth` requests in flight on one connection until the end,
    /// then waits for them all, on this one thread (`nbd_client::Pipeline`):
    /// each pass reads what replies the socket holds, queues a new request
    /// in each freed slot and sends them (small ones together). The cookie
    /// of a request is its slot.
    fn run(&self) -> Result<Recorder, String> {
        let result = self.drive();
        *self.cpu.lock().unwrap() += Recorder::window_cpu(&result, thread_cpu_seconds());
        result
    }

    fn drive(&self) -> Result<Recorder, String> {
        if self.phase.op == Op::Mixed {
            // The pipeline carries one kind of request (see
            // `nbd_client::Pipeline`); mixed phases are raw references.
            return Err("a phase of mixed reads and writes runs on raw files only".into());
        }
        let depth = self.phase.depth_per_job as usize;
        // The bound that lets one thread drive the connection (see
        // `nbd_client::Pipeline`).
        assert!(depth <= JOB_DEPTH_MAX as usize);
        let len = self.phase.block_bytes as usize;
        let mut conn = nbd_client::Pipeline::connect(self.socket, self.export)
            .map_err(|e| format!("{}: {e}", self.socket.display()))?;
        assert!(conn.info.size_bytes >= self.offsets.region_start + self.offsets.block_bytes);
        let mut pending = vec![
            Pending {
                offset: 0,
                submitted: Instant::now()
            };
            depth
        ];
        let mut rng = lane_rng(self.data.seed, self.job, 0);
        let mut buffers: Vec<AlignedBuf> = match (self.phase.op, self.data.verify_salt) {
            (Op::Write, Some(_)) => (0..depth).map(|_| AlignedBuf::zeroed(len)).collect(),
            (Op::Write, None) => vec![noise(len, self.data.seed ^ self.job as u64)],
            (Op::Read, _) => Vec::new(),
            (Op::Mixed, _) => unreachable!("refused above"),
        };
        let mut scratch = AlignedBuf::zeroed(if self.phase.op == Op::Read { len } else { 0 });
        let mut recorder = Recorder::new();
        let mut queue = |slot: usize,
                         conn: &mut nbd_client::Pipeline,
                         pending: &mut [Pending]|
         -> Result<(), String> {
            let offset = self.offsets.next(&mut rng);
            pending[slot] = Pending {
                offset,
                submitted: Instant::now(),
            };
            let cookie = slot as u64;
            match self.phase.op {
                Op::Read => {
                    conn.queue_read(cookie, offset, len as u32);
                    Ok(())
                }
                Op::Mixed => unreachable!("refused above"),
                Op::Write => {
                    let buf = match self.data.verify_salt {
                        Some(salt) => {
                            fill_pattern(&mut buffers[slot], offset, salt);
                            &buffers[slot]
                        }
                        None => &buffers[0],
                    };
                    conn.queue_write(cookie, offset, buf)
                }
            }
            .map_err(|e| format!("NBD send: {e}"))
        };
        // Each pass: queue a request in every freed slot and send them,
        // then read what replies the socket holds. A request is stamped when
        // queued, just before the send; a reply when parsed, before any
        // request of the next pass is queued (a write over 64 KiB is sent as
        // it is queued, and a reply that arrives meanwhile is stamped after
        // it: at most one payload's send late).
        let mut freed: Vec<usize> = (0..depth).collect();
        let mut busy = vec![false; depth];
        let mut in_flight = 0usize;
        while in_flight > 0 || !freed.is_empty() {
            for slot in freed.drain(..) {
                queue(slot, &mut conn, &mut pending)?;
                busy[slot] = true;
                in_flight += 1;
            }
            recorder.note_submitted(self.window, Instant::now());
            conn.flush().map_err(|e| format!("NBD send: {e}"))?;
            conn.receive().map_err(|e| format!("NBD receive: {e}"))?;
            while let Some(reply) = conn.next_reply().map_err(|e| format!("NBD receive: {e}"))? {
                let slot = reply.cookie as usize;
                if !busy.get(slot).copied().unwrap_or(false) {
                    return Err(format!(
                        "NBD reply with cookie {} for no request in flight",
                        reply.cookie
                    ));
                }
                let request = pending[slot];
                if reply.error != 0 {
                    return Err(format!(
                        "NBD error {} for the request at {}",
                        reply.error, request.offset
                    ));
                }
                if self.phase.op == Op::Read {
                    conn.take_data(&mut scratch)
                        .map_err(|e| format!("NBD read data: {e}"))?;
                }
                let completed = Instant::now();
                if let (Op::Read, Some(salt)) = (self.phase.op, self.data.verify_salt) {
                    verify(&scratch, request.offset, salt)?;
                }
                recorder.record(self.window, request.submitted, completed, len as u64);
                busy[slot] = false;
                in_flight -= 1;
                if self.window.keep_going(completed) {
                    freed.push(slot);
                }
            }
        }
        // Everything is measured: a connection that fails now changes
        // nothing in the figures.
        let _ = conn.disconnect();
        Ok(recorder)
    }
}
