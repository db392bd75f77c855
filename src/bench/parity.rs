//! `uraid bench parity`: P+Q and P+Q+R generation, two- and three-data
//! recovery speed of every parity implementation, next to Intel ISA-L's on
//! the same buffers (P+Q+R and three-data recovery as ISA-L's erasure code
//! with three parity rows, since it has no triple-parity kernels) and the
//! single-core memory copy speed of the same byte count.
//!
//! Speeds are GB/s of data bytes: 10^9 bytes per second, counting the data
//! members' bytes only (data members × chunk), as md's raid6 benchmark does.
//!
//! Timing: every contestant of one cell (geometry and operation) is warmed up,
//! then measured in samples taken in turn (ours, ISA-L, ours, ...), so that
//! the machine's noise falls on all of them alike; memcpy, a yardstick that
//! no verdict rests on, is timed after them the same way. The table shows
//! each contestant's median sample; the JSON has the best as well.
//!
//! The target's verdict judges the implementation the engine runs (chosen
//! at start, `parity::default_impl`), not the best of each cell: an array
//! computes with that one alone. The best is shown beside it. Outputs pass
//! through `std::hint::black_box`, and after timing every output is compared
//! with the reference, so no work can be skipped and ISA-L provably computes
//! the same bytes as uraid.

use crate::member::AlignedBuf;
use crate::parity::{
    self, gf, rebuild, recover_two_data, LostData, LostParity, Path, Scalar, Survivors, Syndrome,
};
use crate::units::parse_size_bytes;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct ParityArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Numbers of data members to measure.
    #[arg(long = "data", num_args = 1.., default_values_t = [4usize, 8, 14])]
    pub data_members: Vec<usize>,
    /// Chunk sizes (K, M suffixes; a bare number is KiB, as mdadm's --chunk).
    #[arg(long = "chunk", num_args = 1.., default_values = ["4K", "64K", "512K"])]
    pub chunks: Vec<String>,
    /// Implementations to measure (default: every one this CPU runs).
    #[arg(long = "impl", num_args = 1..)]
    pub impls: Vec<String>,
    /// Seconds of measurement per implementation, geometry and operation.
    #[arg(long, default_value_t = 0.2)]
    pub seconds: f64,
}

/// Samples per contestant; odd, so that the median is one sample.
const SAMPLES: usize = 9;
/// Bounds on what a user may ask for, so that a typo cannot exhaust memory.
const DATA_MEMBERS_MAX: usize = 253;
const CHUNK_BYTES_MAX: u64 = 16 << 20;
const SECONDS_MAX: f64 = 60.0;
/// md's chunks are whole pages, and ISA-L's pq_gen wants 64-byte multiples.
const CHUNK_ALIGN_BYTES: u64 = 4096;

/// The two data members lost in the two-member recovery measurement.
const LOST: (usize, usize) = (0, 1);
/// The three data members lost in the three-member recovery measurement.
const LOST_THREE: [usize; 3] = [0, 1, 2];

pub fn run(args: &ParityArgs) -> Result<(), String> {
    let plan = Plan::from_args(args)?;
    let isal = isal::Isal::load();
    let mut cells = Vec::new();
    for &data_members in &plan.data_members {
        for &chunk_bytes in &plan.chunks {
            let stripe = Stripe::new(data_members, chunk_bytes);
            cells.push(measure_cell(&stripe, &plan, isal.as_ref().ok())?);
        }
    }
    let report = Report {
        cells,
        impls: plan.impls.iter().map(|i| i.name()).collect(),
        isal: isal.as_ref().map(|_| ()).map_err(Clone::clone),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).expect("JSON")
        );
    } else {
        report.print_table();
    }
    Ok(())
}

/// The validated arguments.
struct Plan {
    data_members: Vec<usize>,
    chunks: Vec<usize>,
    impls: Vec<&'static dyn Syndrome>,
    per_contestant: Duration,
}

impl Plan {
    fn from_args(args: &ParityArgs) -> Result<Plan, String> {
        for &n in &args.data_members {
            if !(2..=DATA_MEMBERS_MAX).contains(&n) {
                return Err(format!("--data {n}: must be 2..={DATA_MEMBERS_MAX}"));
            }
        }
        let mut chunks = Vec::new();
        for text in &args.chunks {
            let bytes = parse_size_bytes(text).map_err(|e| format!("--chunk: {e}"))?;
            if bytes == 0 || bytes % CHUNK_ALIGN_BYTES != 0 || bytes > CHUNK_BYTES_MAX {
                return Err(format!(
                    "--chunk {text}: must be a multiple of 4K, at most {}K",
                    CHUNK_BYTES_MAX >> 10
                ));
            }
            chunks.push(bytes as usize);
        }
        if !(args.seconds > 0.0 && args.seconds <= SECONDS_MAX) {
            return Err(format!(
                "--seconds {}: must be in (0, {SECONDS_MAX}]",
                args.seconds
            ));
        }
        let impls = if args.impls.is_empty() {
            parity::implementations()
        } else {
            args.impls
                .iter()
                .map(|name| parity::by_name(name))
                .collect::<Result<_, _>>()?
        };
        Ok(Plan {
            data_members: args.data_members.clone(),
            chunks,
            impls,
            per_contestant: Duration::from_secs_f64(args.seconds),
        })
    }
}

// Every buffer is a page-aligned `AlignedBuf`, as the engine's are
// (O_DIRECT members, pages of members in memory) and as md's pages are;
// ISA-L's pq_gen needs 64 bytes. The placement matters: with 64-byte
// alignment, where malloc put each block changed a kernel's speed by up
// to a third from one run to the next (4 x 4K: 53 to 81 GB/s), as blocks
// happened to share or not share L1 sets and 4 KiB alias bits.
// Page-aligned blocks all share them, as they do in the engine.

/// One geometry's buffers: random data, its reference P, Q and R (from
/// [`Scalar`], with md's exponents 0..n-1, which are also ISA-L's).
struct Stripe {
    data: Vec<AlignedBuf>,
    exps: Vec<u8>,
    p: AlignedBuf,
    q: AlignedBuf,
    r: AlignedBuf,
    chunk_bytes: usize,
}

impl Stripe {
    fn new(data_members: usize, chunk_bytes: usize) -> Stripe {
        let mut rng = rand::rngs::StdRng::seed_from_u64(data_members as u64 * chunk_bytes as u64);
        let data: Vec<AlignedBuf> = (0..data_members)
            .map(|_| {
                let mut block = AlignedBuf::zeroed(chunk_bytes);
                rng.fill(&mut block[..]);
                block
            })
            .collect();
        let exps: Vec<u8> = (0..data_members as u8).collect();
        let [mut p, mut q, mut r] = [(); 3].map(|_| AlignedBuf::zeroed(chunk_bytes));
        let slices: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
        Scalar.gen_pqr(&slices, &exps, &mut p[..], &mut q[..], &mut r[..]);
        Stripe {
            data,
            exps,
            p,
            q,
            r,
            chunk_bytes,
        }
    }

    /// The data members other than those in `lost`, and their exponents.
    fn survivors(&self, lost: &[usize]) -> (Vec<&[u8]>, Vec<u8>) {
        (0..self.data.len())
            .filter(|k| !lost.contains(k))
            .map(|k| (&self.data[k][..], self.exps[k]))
            .unzip()
    }

    fn slices(&self) -> Vec<&[u8]> {
        self.data.iter().map(|b| &b[..]).collect()
    }

    /// The data bytes one operation covers.
    fn data_bytes(&self) -> usize {
        self.data.len() * self.chunk_bytes
    }

    fn label(&self) -> String {
        format!("{} x {}K", self.data.len(), self.chunk_bytes >> 10)
    }
}

/// One contestant's timing: seconds per operation.
#[derive(Clone, Copy)]
struct Timing {
    median_s: f64,
    best_s: f64,
}

impl Timing {
    fn gbps(seconds: f64, bytes: usize) -> f64 {
        bytes as f64 / seconds / 1e9
    }
    fn json(&self, bytes: usize) -> Value {
        json!({
            "median_gbps": round3(Self::gbps(self.median_s, bytes)),
            "best_gbps": round3(Self::gbps(self.best_s, bytes)),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Times the contestants in turn (see the module docs) and returns each one's
/// median and best seconds per call.
fn time_interleaved(contestants: &mut [&mut dyn FnMut()], per_contestant: Duration) -> Vec<Timing> {
    // Warm up (caches, page faults, frequency) and estimate one call's cost.
    let mut estimate = vec![Duration::MAX; contestants.len()];
    for _ in 0..3 {
        for (c, run) in contestants.iter_mut().enumerate() {
            let start = Instant::now();
            run();
            estimate[c] = estimate[c].min(start.elapsed());
        }
    }
    let per_sample = per_contestant / SAMPLES as u32;
    let iterations: Vec<u32> = estimate
        .iter()
        .map(|e| (per_sample.as_secs_f64() / e.as_secs_f64().max(1e-9)).clamp(1.0, 1e7) as u32)
        .collect();
    let mut samples = vec![Vec::with_capacity(SAMPLES); contestants.len()];
    for _ in 0..SAMPLES {
        for (c, run) in contestants.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..iterations[c] {
                run();
            }
            samples[c].push(start.elapsed().as_secs_f64() / iterations[c] as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            Timing {
                median_s: s[SAMPLES / 2],
                best_s: s[0],
            }
        })
        .collect()
}

/// Results of one geometry: per operation, each implementation's timing by
/// name (ISA-L's as "isa-l"), and memcpy's. `recover_three` is empty for
/// stripes of fewer than three data members.
struct Cell {
    label: String,
    data_members: usize,
    chunk_bytes: usize,
    data_bytes: usize,
    gen_pq: Vec<(&'static str, Timing)>,
    recover_two: Vec<(&'static str, Timing)>,
    gen_pqr: Vec<(&'static str, Timing)>,
    recover_three: Vec<(&'static str, Timing)>,
    memcpy: Timing,
}

const ISAL_NAME: &str = "isa-l";

/// A contestant's work for one operation, run many times by the timing.
type Run<'a> = Box<dyn FnMut() + 'a>;

/// [`time_interleaved`] over boxed contestants.
fn time_runs(runs: &mut [Run<'_>], per_contestant: Duration) -> Vec<Timing> {
    let mut refs: Vec<&mut dyn FnMut()> = runs
        .iter_mut()
        .map(|r| &mut **r as &mut dyn FnMut())
        .collect();
    time_interleaved(&mut refs, per_contestant)
}

fn measure_cell(stripe: &Stripe, plan: &Plan, isal: Option<&isal::Isal>) -> Result<Cell, String> {
    let len = stripe.chunk_bytes;
    let data = stripe.slices();
    let n = data.len();
    let (x, y) = LOST;
    let (present, present_exps) = stripe.survivors(&[x, y]);
    let (p_ref, q_ref, r_ref) = (&stripe.p[..], &stripe.q[..], &stripe.r[..]);

    // One set of output buffers per contestant, checked after timing.
    let n_out = plan.impls.len() + usize::from(isal.is_some());
    let mut outputs: Vec<[AlignedBuf; 3]> = (0..n_out)
        .map(|_| [(); 3].map(|_| AlignedBuf::zeroed(len)))
        .collect();
    let mut isal_gen = isal.map(|lib| lib.pq_gen_job(&data, len));
    let isal_decode = isal
        .map(|lib| lib.data_decoder(n, 2, &[x, y]))
        .transpose()?;
    let isal_encode_pqr = isal.map(|lib| lib.parity_encoder(n, 3));
    let isal_decode_three = isal
        .filter(|_| n >= LOST_THREE.len())
        .map(|lib| lib.data_decoder(n, 3, &LOST_THREE))
        .transpose()?;

    let names: Vec<&'static str> = plan
        .impls
        .iter()
        .map(|i| i.name())
        .chain(isal.map(|_| ISAL_NAME))
        .collect();

    // P+Q generation.
    let gen_times = {
        let mut runs: Vec<Run> = Vec::new();
        let ours = &mut outputs[..plan.impls.len()];
        for (imp, [p, q, _]) in plan.impls.iter().zip(ours.iter_mut()) {
            let (data, exps) = (&data, &stripe.exps);
            runs.push(Box::new(move || {
                imp.gen_pq(black_box(data), exps, &mut p[..], &mut q[..]);
                black_box((p.as_ptr(), q.as_ptr()));
            }));
        }
        if let (Some(lib), Some(job)) = (isal, isal_gen.as_mut()) {
            runs.push(Box::new(move || lib.pq_gen(black_box(job))));
        }
        time_runs(&mut runs, plan.per_contestant)
    };
    for (name, [p, q, _]) in names.iter().zip(&outputs) {
        if *name != ISAL_NAME {
            check_same(name, "P", &p[..], p_ref, stripe)?;
            check_same(name, "Q", &q[..], q_ref, stripe)?;
        }
    }
    if let Some(job) = &isal_gen {
        check_same(ISAL_NAME, "pq_gen P", job.p(), p_ref, stripe)?;
        check_same(ISAL_NAME, "pq_gen Q", job.q(), q_ref, stripe)?;
    }

    // Two-data recovery, from the reference P and Q.
    let recover_times = {
        let mut runs: Vec<Run> = Vec::new();
        let (ours, theirs) = outputs.split_at_mut(plan.impls.len());
        for (imp, [out_x, out_y, _]) in plan.impls.iter().zip(ours.iter_mut()) {
            let (present, present_exps) = (&present, &present_exps);
            let exps = &stripe.exps;
            runs.push(Box::new(move || {
                recover_two_data(
                    *imp,
                    black_box(present),
                    present_exps,
                    p_ref,
                    q_ref,
                    exps[x],
                    exps[y],
                    &mut out_x[..],
                    &mut out_y[..],
                );
                black_box((out_x.as_ptr(), out_y.as_ptr()));
            }));
        }
        if let (Some(decoder), Some([out_x, out_y, _])) = (isal_decode.as_ref(), theirs.first_mut())
        {
            let mut sources: Vec<&[u8]> = present.clone();
            sources.extend([p_ref, q_ref]);
            runs.push(Box::new(move || {
                decoder.run(black_box(&sources), [&mut out_x[..], &mut out_y[..]]);
            }));
        }
        time_runs(&mut runs, plan.per_contestant)
    };
    for (name, [out_x, out_y, _]) in names.iter().zip(&outputs) {
        check_same(name, "recovered data member 0", &out_x[..], data[x], stripe)?;
        check_same(name, "recovered data member 1", &out_y[..], data[y], stripe)?;
    }

    // P+Q+R generation; ISA-L computes it as a three-row erasure code.
    let gen_pqr_times = {
        let mut runs: Vec<Run> = Vec::new();
        let (ours, theirs) = outputs.split_at_mut(plan.impls.len());
        for (imp, [p, q, r]) in plan.impls.iter().zip(ours.iter_mut()) {
            let (data, exps) = (&data, &stripe.exps);
            runs.push(Box::new(move || {
                imp.gen_pqr(black_box(data), exps, &mut p[..], &mut q[..], &mut r[..]);
                black_box((p.as_ptr(), q.as_ptr(), r.as_ptr()));
            }));
        }
        if let (Some(encoder), Some([p, q, r])) = (isal_encode_pqr.as_ref(), theirs.first_mut()) {
            let data = &data;
            runs.push(Box::new(move || {
                encoder.run(black_box(data), [&mut p[..], &mut q[..], &mut r[..]]);
            }));
        }
        time_runs(&mut runs, plan.per_contestant)
    };
    for (name, [p, q, r]) in names.iter().zip(&outputs) {
        check_same(name, "gen_pqr P", &p[..], p_ref, stripe)?;
        check_same(name, "gen_pqr Q", &q[..], q_ref, stripe)?;
        check_same(name, "gen_pqr R", &r[..], r_ref, stripe)?;
    }

    // Three-data recovery, from the reference P, Q and R, through the
    // selector the engine calls.
    let mut recover_three_times = Vec::new();
    if n >= LOST_THREE.len() {
        let (present, present_exps) = stripe.survivors(&LOST_THREE);
        let survivors = Survivors {
            data: &present,
            exps: &present_exps,
            p: Some(p_ref),
            q: Some(q_ref),
            r: Some(r_ref),
        };
        let lost_exps = LOST_THREE.map(|k| stripe.exps[k]);
        let mut runs: Vec<Run> = Vec::new();
        let (ours, theirs) = outputs.split_at_mut(plan.impls.len());
        for (imp, outs) in plan.impls.iter().zip(ours.iter_mut()) {
            let survivors = &survivors;
            runs.push(Box::new(move || {
                let mut lost = lost_exps
                    .into_iter()
                    .zip(outs.iter_mut())
                    .map(|(exp, out)| LostData {
                        exp,
                        out: &mut out[..],
                    });
                let mut lost: [LostData; 3] = std::array::from_fn(|_| lost.next().unwrap());
                let path = rebuild(*imp, black_box(survivors), &mut lost, LostParity::default());
                assert_eq!(path, Ok(Path::PQR));
            }));
        }
        if let (Some(decoder), Some([x, y, z])) = (isal_decode_three.as_ref(), theirs.first_mut()) {
            let mut sources: Vec<&[u8]> = present.clone();
            sources.extend([p_ref, q_ref, r_ref]);
            runs.push(Box::new(move || {
                decoder.run(black_box(&sources), [&mut x[..], &mut y[..], &mut z[..]]);
            }));
        }
        recover_three_times = time_runs(&mut runs, plan.per_contestant);
        drop(runs);
        for (name, outs) in names.iter().zip(&outputs) {
            for (out, k) in outs.iter().zip(LOST_THREE) {
                let what = format!("recovered data member {k} of three");
                check_same(name, &what, &out[..], data[k], stripe)?;
            }
        }
    }

    // Memory copy of the same byte count, from one contiguous buffer.
    let src = AlignedBuf::zeroed(stripe.data_bytes());
    let mut dst = AlignedBuf::zeroed(stripe.data_bytes());
    let mut copy = || {
        dst.copy_from_slice(black_box(&src[..]));
        black_box(dst.as_ptr());
    };
    let memcpy = time_interleaved(&mut [&mut copy as &mut dyn FnMut()], plan.per_contestant)[0];

    let named = |times: Vec<Timing>| names.iter().copied().zip(times).collect();
    Ok(Cell {
        label: stripe.label(),
        data_members: n,
        chunk_bytes: len,
        data_bytes: stripe.data_bytes(),
        gen_pq: named(gen_times),
        recover_two: named(recover_times),
        gen_pqr: named(gen_pqr_times),
        recover_three: named(recover_three_times),
        memcpy,
    })
}

/// Fails loudly when a contestant computed other bytes than the reference:
/// a benchmark of different computations would be meaningless.
fn check_same(
    who: &str,
    what: &str,
    got: &[u8],
    want: &[u8],
    stripe: &Stripe,
) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let at = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(0);
    Err(format!(
        "{who}'s {what} differs from the reference at byte {at} ({}): the comparison is not of the same computation",
        stripe.label()
    ))
}

/// The fastest of our implementations for one operation of a cell, and
/// its speed over ISA-L's (the parity target: at least 1 everywhere).
fn best_vs_isal(list: &Timings, bytes: usize) -> Option<(&'static str, f64)> {
    let gbps = |t: &Timing| Timing::gbps(t.median_s, bytes);
    let (_, theirs) = list.iter().find(|(n, _)| *n == ISAL_NAME)?;
    let (name, best) = list
        .iter()
        .filter(|(n, _)| *n != ISAL_NAME)
        .map(|(n, t)| (*n, gbps(t)))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    Some((name, best / gbps(theirs)))
}

/// The implementation the engine runs (`parity::default_impl`), and its
/// speed over ISA-L's in one operation of a cell: what the parity target
/// judges, since an array computes with that one alone. None if it was
/// not measured (`--impl` left it out) or ISA-L was not loaded.
fn selected_vs_isal(list: &Timings, bytes: usize) -> Option<(&'static str, f64)> {
    let gbps = |t: &Timing| Timing::gbps(t.median_s, bytes);
    let (_, theirs) = list.iter().find(|(n, _)| *n == ISAL_NAME)?;
    let selected = parity::default_impl().name();
    let (name, ours) = list.iter().find(|(n, _)| *n == selected)?;
    Some((name, gbps(ours) / gbps(theirs)))
}

/// What the target judges in one operation of a cell: the selected
/// implementation. An `--impl` list without it judges nothing (the best
/// of the others is not what an array would run).
fn judged_vs_isal(list: &Timings, bytes: usize) -> Option<(&'static str, f64)> {
    selected_vs_isal(list, bytes)
}

/// Each implementation's timing of one operation, by name.
type Timings = [(&'static str, Timing)];

/// The operations of a cell: the table's name, the JSON key, the timings.
fn operations(c: &Cell) -> Vec<(&'static str, &'static str, &Timings)> {
    let all: [(_, _, &Timings); 4] = [
        ("gen P+Q", "gen_pq", &c.gen_pq),
        ("recover 2", "recover_two", &c.recover_two),
        ("gen P+Q+R", "gen_pqr", &c.gen_pqr),
        ("recover 3", "recover_three", &c.recover_three),
    ];
    // A stripe of two data members has no three-member recovery.
    all.into_iter().filter(|(_, _, t)| !t.is_empty()).collect()
}

struct Report {
    cells: Vec<Cell>,
    impls: Vec<&'static str>,
    isal: Result<(), String>,
}

const UNIT: &str =
    "GB/s of data bytes (10^9 bytes/s; data bytes = data members x chunk), one thread";

impl Report {
    fn json(&self) -> Value {
        // An operation a cell does not have (recover_three of two data
        // members) is null.
        let times = |list: &[(&str, Timing)], bytes| -> Value {
            if list.is_empty() {
                return Value::Null;
            }
            list.iter()
                .map(|(name, t)| (name.to_string(), t.json(bytes)))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        json!({
            "unit": UNIT,
            "statistic": format!("median (and best) of {SAMPLES} interleaved samples"),
            "machine": machine_json(),
            "selected": parity::default_impl().name(),
            "implementations": self.impls,
            "isal": match &self.isal {
                Ok(()) => json!({"loaded": true, "library": isal::LIBRARY}),
                Err(why) => json!({"loaded": false, "note": why}),
            },
            "lost_data_members": [LOST.0, LOST.1],
            "lost_data_members_three": LOST_THREE,
            "cells": self.cells.iter().map(|c| json!({
                "data_members": c.data_members,
                "chunk_bytes": c.chunk_bytes,
                "gen_pq": times(&c.gen_pq, c.data_bytes),
                "recover_two": times(&c.recover_two, c.data_bytes),
                "gen_pqr": times(&c.gen_pqr, c.data_bytes),
                "recover_three": times(&c.recover_three, c.data_bytes),
                "memcpy": c.memcpy.json(c.data_bytes),
                "best_vs_isal": operations(c).iter().filter_map(|(_, key, list)| {
                    best_vs_isal(list, c.data_bytes).map(|(name, ratio)| {
                        (key.to_string(), json!({"implementation": name, "ratio": ratio}))
                    })
                }).collect::<serde_json::Map<_, _>>(),
                "judged_vs_isal": operations(c).iter().filter_map(|(_, key, list)| {
                    judged_vs_isal(list, c.data_bytes).map(|(name, ratio)| {
                        (key.to_string(), json!({"implementation": name, "ratio": ratio}))
                    })
                }).collect::<serde_json::Map<_, _>>(),
            })).collect::<Vec<_>>(),
            "target": self.judged().then(|| json!({
                "goal": self.target(),
                "missed": self.misses().iter().map(|(label, op, ratio)| json!({
                    "geometry": label, "operation": op, "ratio": ratio,
                })).collect::<Vec<_>>(),
            })),
        })
    }

    /// Whether this run judges the target: ISA-L was loaded and the
    /// implementation uraid runs was among those measured.
    fn judged(&self) -> bool {
        self.isal.is_ok() && self.impls.contains(&parity::default_impl().name())
    }

    /// The parity target as this run judges it.
    fn target(&self) -> String {
        let selected = parity::default_impl().name();
        format!(
            "the implementation uraid runs ({selected}, selected at start) at least as fast as \
             ISA-L in every geometry and operation"
        )
    }

    /// The cells and operations where the judged implementation (see
    /// [`judged_vs_isal`]) is slower than ISA-L.
    fn misses(&self) -> Vec<(String, &'static str, f64)> {
        let mut missed = Vec::new();
        for c in &self.cells {
            for (op, _, list) in operations(c) {
                if let Some((_, ratio)) = judged_vs_isal(list, c.data_bytes) {
                    if ratio < 1.0 {
                        missed.push((c.label.clone(), op, ratio));
                    }
                }
            }
        }
        missed
    }

    fn print_table(&self) {
        println!("Parity speed in {UNIT};");
        println!("median of {SAMPLES} interleaved samples. Recovery rebuilds data members 0 and 1 from the rest, P and Q;");
        println!("recover 3 rebuilds data members 0, 1 and 2 from the rest, P, Q and R (ISA-L: as a three-row erasure code).");
        println!(
            "CPU: {}; selected: {}",
            machine_json()["cpu"].as_str().unwrap_or("?"),
            parity::default_impl().name()
        );
        if let Err(why) = &self.isal {
            println!("note: {why}");
        }
        let mut header = vec!["geometry".to_string(), "operation".to_string()];
        header.extend(self.impls.iter().map(|s| s.to_string()));
        if self.isal.is_ok() {
            header.push(ISAL_NAME.into());
        }
        header.push("memcpy".into());
        if self.isal.is_ok() {
            header.push("judged/isa-l".into());
            header.push("best/isa-l".into());
        }
        let mut rows = vec![header];
        for c in &self.cells {
            for (op, _, list) in operations(c) {
                let gbps = |t: &Timing| Timing::gbps(t.median_s, c.data_bytes);
                let mut row = vec![c.label.clone(), op.to_string()];
                row.extend(list.iter().map(|(_, t)| format!("{:.2}", gbps(t))));
                row.push(format!("{:.2}", gbps(&c.memcpy)));
                if self.isal.is_ok() {
                    // Every row has both columns: "-" where the one uraid
                    // runs was not measured.
                    row.push(match judged_vs_isal(list, c.data_bytes) {
                        Some((name, ratio)) => {
                            let miss = if ratio < 1.0 { " MISS" } else { "" };
                            format!("{ratio:.2} ({name}){miss}")
                        }
                        None => "-".into(),
                    });
                    row.push(match best_vs_isal(list, c.data_bytes) {
                        Some((best_name, ratio)) => format!("{ratio:.2} ({best_name})"),
                        None => "-".into(),
                    });
                }
                rows.push(row);
            }
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
            .collect();
        for row in rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (s, w))| {
                    if i < 2 {
                        format!("{s:<w$}")
                    } else {
                        format!("{s:>w$}")
                    }
                })
                .collect();
            println!("{}", cells.join("  ").trim_end());
        }
        if self.isal.is_ok() && !self.judged() {
            println!(
                "target not judged: the implementation uraid runs ({}) was not among --impl",
                parity::default_impl().name()
            );
        }
        if self.judged() {
            let missed = self.misses();
            let count: usize = self.cells.iter().map(|c| operations(c).len()).sum();
            let target = self.target();
            if missed.is_empty() {
                println!("target met: {target}, at all {count}");
            } else {
                let list: Vec<String> = missed
                    .iter()
                    .map(|(label, op, ratio)| format!("{label} {op} {ratio:.2}"))
                    .collect();
                println!(
                    "target missed at {} of {count}: {target} ({})",
                    missed.len(),
                    list.join(", ")
                );
            }
        }
    }
}

/// The CPU model and the vector features the implementations use, from
/// /proc/cpuinfo (empty where it cannot be read).
fn machine_json() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let features = field("Features");
    let wanted = [
        "ssse3", "avx2", "avx512f", "avx512bw", "avx512vl", "gfni", "asimd",
    ];
    let present: Vec<&str> = wanted
        .into_iter()
        .filter(|w| flags.split(' ').chain(features.split(' ')).any(|f| f == *w))
        .collect();
    json!({"cpu": field("model name"), "flags": present})
}

/// Intel ISA-L, loaded at run time so that uraid does not depend on it.
mod isal {
    use super::{gf, AlignedBuf};
    use libloading::Library;
    use std::os::raw::{c_int, c_uchar, c_void};

    pub const LIBRARY: &str = "libisal.so.2";

    type PqGen = unsafe extern "C" fn(c_int, c_int, *mut *mut c_void) -> c_int;
    type InvertMatrix = unsafe extern "C" fn(*mut c_uchar, *mut c_uchar, c_int) -> c_int;
    type InitTables = unsafe extern "C" fn(c_int, c_int, *mut c_uchar, *mut c_uchar);
    type EncodeData = unsafe extern "C" fn(
        c_int,
        c_int,
        c_int,
        *mut c_uchar,
        *mut *mut c_uchar,
        *mut *mut c_uchar,
    );

    /// The library and the four functions used, with the C signatures of
    /// isa-l/raid.h and isa-l/erasure_code.h (ISA-L 2.x).
    pub struct Isal {
        pq_gen: PqGen,
        invert_matrix: InvertMatrix,
        init_tables: InitTables,
        encode_data: EncodeData,
        // Last, so that it is dropped after nothing can call into it.
        _library: Library,
    }

    impl Isal {
        /// Loads the library, or says in one line why not.
        pub fn load() -> Result<Isal, String> {
            let why = |e: libloading::Error| {
                format!("ISA-L not measured: cannot load {LIBRARY} ({e}); install libisal2")
            };
            // SAFETY: loading ISA-L runs no initialisers with preconditions;
            // each symbol is given the exact type its header declares.
            unsafe {
                let library = Library::new(LIBRARY).map_err(why)?;
                Ok(Isal {
                    pq_gen: *library.get::<PqGen>(b"pq_gen\0").map_err(why)?,
                    invert_matrix: *library
                        .get::<InvertMatrix>(b"gf_invert_matrix\0")
                        .map_err(why)?,
                    init_tables: *library
                        .get::<InitTables>(b"ec_init_tables\0")
                        .map_err(why)?,
                    encode_data: *library
                        .get::<EncodeData>(b"ec_encode_data\0")
                        .map_err(why)?,
                    _library: library,
                })
            }
        }

        /// Buffers for pq_gen over `data`: its own P and Q, and the pointer
        /// array it takes (data..., P, Q).
        pub fn pq_gen_job(&self, data: &[&[u8]], len: usize) -> PqGenJob {
            let mut p = AlignedBuf::zeroed(len);
            let mut q = AlignedBuf::zeroed(len);
            let mut pointers: Vec<*mut c_void> =
                data.iter().map(|d| d.as_ptr() as *mut c_void).collect();
            pointers.push(p.as_mut_ptr().cast());
            pointers.push(q.as_mut_ptr().cast());
            PqGenJob {
                pointers,
                len,
                _p: p,
                _q: q,
            }
        }

        pub fn pq_gen(&self, job: &mut PqGenJob) {
            // SAFETY: the pointers are 64-byte aligned and valid for `len`
            // bytes (a multiple of 4096); pq_gen writes only the last two,
            // which the job owns. Data pointers are only read, despite the
            // C type.
            let status = unsafe {
                (self.pq_gen)(
                    job.pointers.len() as c_int,
                    job.len as c_int,
                    job.pointers.as_mut_ptr(),
                )
            };
            assert_eq!(status, 0, "ISA-L pq_gen failed");
        }

        /// Row `row` of the generator matrix of `n` data members with P, Q
        /// and R: the identity, then a row of ones, of g^k and of 4^k.
        fn generator_row(n: usize, row: usize) -> Vec<u8> {
            (0..n as u8)
                .map(|k| match row.checked_sub(n) {
                    None => u8::from(row == k as usize),
                    Some(0) => 1,
                    Some(1) => gf::pow2(k),
                    _ => gf::pow2(crate::parity::r_exp(k)),
                })
                .collect()
        }

        /// ec_encode_data prepared for `matrix`, whose rows of `n`
        /// coefficients each give one output from `n` sources.
        fn coder(&self, n: usize, matrix: &[u8]) -> Coder<'_> {
            let rows = matrix.len() / n;
            let mut matrix = matrix.to_vec();
            let mut tables = vec![0u8; 32 * n * rows];
            // SAFETY: `matrix` is rows×n, `tables` 32·n·rows bytes as documented.
            unsafe {
                (self.init_tables)(
                    n as c_int,
                    rows as c_int,
                    matrix.as_mut_ptr(),
                    tables.as_mut_ptr(),
                )
            };
            Coder {
                isal: self,
                n,
                tables,
            }
        }

        /// The first `parity_rows` of P, Q and R of `n` data members as an
        /// erasure code, the way ISA-L users compute more than two parities.
        pub fn parity_encoder(&self, n: usize, parity_rows: usize) -> Coder<'_> {
            let matrix: Vec<u8> = (n..n + parity_rows)
                .flat_map(|row| Self::generator_row(n, row))
                .collect();
            self.coder(n, &matrix)
        }

        /// The decoder ISA-L users build for losing the data members `lost`
        /// of `n` with the first `parity_rows` of P, Q and R (as many as
        /// are lost): the generator matrix's rows for the survivors (data,
        /// then parity) inverted, and the inverse's rows for the lost
        /// members expanded into multiplication tables.
        pub fn data_decoder(
            &self,
            n: usize,
            parity_rows: usize,
            lost: &[usize],
        ) -> Result<Coder<'_>, String> {
            assert_eq!(lost.len(), parity_rows);
            let rows: Vec<usize> = (0..n + parity_rows).filter(|r| !lost.contains(r)).collect();
            let mut survivors: Vec<u8> = rows
                .iter()
                .flat_map(|&r| Self::generator_row(n, r))
                .collect();
            let mut inverse = vec![0u8; n * n];
            // SAFETY: both matrices are n×n bytes.
            let status = unsafe {
                (self.invert_matrix)(survivors.as_mut_ptr(), inverse.as_mut_ptr(), n as c_int)
            };
            if status != 0 {
                return Err("ISA-L gf_invert_matrix found the survivors' matrix singular".into());
            }
            let decode: Vec<u8> = lost
                .iter()
                .flat_map(|&r| inverse[r * n..(r + 1) * n].to_vec())
                .collect();
            Ok(self.coder(n, &decode))
        }
    }

    pub struct PqGenJob {
        pointers: Vec<*mut c_void>,
        len: usize,
        _p: AlignedBuf,
        _q: AlignedBuf,
    }

    impl PqGenJob {
        pub fn p(&self) -> &[u8] {
            &self._p[..]
        }
        pub fn q(&self) -> &[u8] {
            &self._q[..]
        }
    }

    /// ec_encode_data with prepared tables: `tables.len() / 32 / n` outputs
    /// from `n` sources.
    pub struct Coder<'a> {
        isal: &'a Isal,
        n: usize,
        tables: Vec<u8>,
    }

    impl Coder<'_> {
        /// Computes every output from `sources`, in the order the matrix
        /// used (for a decoder: the surviving data members, then the parity).
        pub fn run<const ROWS: usize>(&self, sources: &[&[u8]], outs: [&mut [u8]; ROWS]) {
            assert_eq!(sources.len(), self.n);
            assert_eq!(self.tables.len(), 32 * self.n * ROWS);
            let len = outs[0].len();
            assert!(outs.iter().all(|o| o.len() == len) && sources.iter().all(|s| s.len() == len));
            let mut inputs: Vec<*mut c_uchar> =
                sources.iter().map(|s| s.as_ptr() as *mut c_uchar).collect();
            let mut outputs = outs.map(|o| o.as_mut_ptr());
            // SAFETY: n inputs and ROWS outputs of `len` bytes each; inputs
            // are only read, despite the C type; the tables match n and ROWS.
            unsafe {
                (self.isal.encode_data)(
                    len as c_int,
                    self.n as c_int,
                    ROWS as c_int,
                    self.tables.as_ptr() as *mut c_uchar,
                    inputs.as_mut_ptr(),
                    outputs.as_mut_ptr(),
                )
            };
        }
    }
}
