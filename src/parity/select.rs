//! Which implementation runs: chosen once per process, by a benchmark of a few
//! milliseconds as md's raid6_select_algo does, or forced by name.
//!
//! The choice is cached in a `OnceLock`: the first of [`select`] and
//! [`default_impl`] to run fixes it for the life of the process, so every
//! stripe of every array uses the same code (which keeps a mismatch found by
//! `check` reproducible).

use super::{implementations, simd, Syndrome};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable that forces an implementation by name.
pub const ENV_VAR: &str = "URAID_PARITY";

static CHOSEN: OnceLock<&'static dyn Syndrome> = OnceLock::new();

/// The implementation to use: the one [`select`]ed or named by `URAID_PARITY`,
/// else the fastest on a short benchmark run the first time this is called.
///
/// # Panics
/// If `URAID_PARITY` names no implementation this CPU runs. The command line
/// calls [`select_from_env`] first, which reports that as a one-line error.
pub fn default_impl() -> &'static dyn Syndrome {
    *CHOSEN.get_or_init(|| match std::env::var(ENV_VAR) {
        Ok(name) => by_name(&name).unwrap_or_else(|e| panic!("{e}")),
        Err(_) => fastest(),
    })
}

/// Forces the implementation called `name` for the rest of the process.
///
/// Fails with one line, listing the available names, if `name` is unknown or
/// this CPU cannot run it; and if another implementation was already chosen.
pub fn select(name: &str) -> Result<&'static dyn Syndrome, String> {
    let wanted = by_name(name)?;
    let chosen = *CHOSEN.get_or_init(|| wanted);
    if chosen.name() != wanted.name() {
        return Err(format!(
            "parity implementation already chosen: {}",
            chosen.name()
        ));
    }
    Ok(chosen)
}

/// Applies `URAID_PARITY` if it is set; a bad name is a one-line error.
pub fn select_from_env() -> Result<(), String> {
    match std::env::var(ENV_VAR) {
        Ok(name) => select(&name)
            .map(|_| ())
            .map_err(|e| format!("{ENV_VAR}: {e}")),
        Err(_) => Ok(()),
    }
}

/// The implementation called `name`, if this CPU runs it.
pub fn by_name(name: &str) -> Result<&'static dyn Syndrome, String> {
    let available = implementations();
    if let Some(found) = available.iter().find(|imp| imp.name() == name) {
        return Ok(*found);
    }
    let names: Vec<&str> = available.iter().map(|imp| imp.name()).collect();
    let why = if simd::known_names().contains(&name) {
        "is not supported by this CPU"
    } else {
        "is unknown"
    };
    Err(format!(
        "parity implementation '{name}' {why}; available: {}",
        names.join(", ")
    ))
}

/// Data blocks and bytes per block of the selection benchmark: a 64 KiB
/// stripe, which stays in L2 so that the CPU's speed, not memory's, decides.
const BENCH_DATA: usize = 8;
const BENCH_BLOCK_BYTES: usize = 8192;
/// Time spent on each implementation, split over three tries of which the
/// best counts, so that one interruption does not decide.
const BENCH_TIME_PER_TRY: Duration = Duration::from_micros(300);
const BENCH_TRIES: usize = 3;

/// The implementation with the highest throughput on P+Q generation plus
/// two-data recovery (the work of a write and of a degraded read).
fn fastest() -> &'static dyn Syndrome {
    // Every block page aligned, as the engine's buffers are: where malloc
    // happens to put blocks changes a kernel's speed by up to a third
    // (docs/BENCHMARKS.md, "Parity"), and the choice must not hang on it.
    const PAGE: usize = 4096;
    let blocks = BENCH_DATA + 4; // the data, P, Q, and two recovered
    let mut arena = vec![0u8; blocks * BENCH_BLOCK_BYTES + PAGE];
    let skip = arena.as_ptr().align_offset(PAGE);
    let mut chunks = arena[skip..skip + blocks * BENCH_BLOCK_BYTES].chunks_mut(BENCH_BLOCK_BYTES);
    let mut data_blocks: Vec<&mut [u8]> = chunks.by_ref().take(BENCH_DATA).collect();
    for (k, block) in data_blocks.iter_mut().enumerate() {
        for (i, byte) in block.iter_mut().enumerate() {
            *byte = (i * 31 + k * 7) as u8;
        }
    }
    let data: Vec<&[u8]> = data_blocks.into_iter().map(|b| &*b).collect();
    let exps: Vec<u8> = (0..BENCH_DATA as u8).collect();
    let [p, q, x, y] = [(); 4].map(|_| chunks.next().expect("four more blocks"));
    let mut best: Option<(&'static dyn Syndrome, Duration)> = None;
    for imp in implementations() {
        let round = |p: &mut [u8], q: &mut [u8], x: &mut [u8], y: &mut [u8]| {
            imp.gen_pq(&data, &exps, p, q);
            imp.recover_two(&data[2..], &exps[2..], p, q, 0, 1, x, y);
            std::hint::black_box((&p[0], &x[0]));
        };
        let mut fastest_round = Duration::MAX;
        for _ in 0..BENCH_TRIES {
            let start = Instant::now();
            let mut rounds = 0u32;
            // At least one round: on a busy machine the thread may lose
            // the whole try before its first round (then 0 rounds divided
            // the time by zero and uraid panicked at start).
            loop {
                round(p, q, x, y);
                rounds += 1;
                if start.elapsed() >= BENCH_TIME_PER_TRY {
                    break;
                }
            }
            fastest_round = fastest_round.min(start.elapsed() / rounds);
        }
        if best.is_none_or(|(_, time)| fastest_round < time) {
            best = Some((imp, fastest_round));
        }
    }
    best.expect("Scalar is always available").0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_available_ones() {
        let error = by_name("nonesuch").err().expect("unknown");
        assert!(error.starts_with("parity implementation 'nonesuch' is unknown; available: scalar"));
        assert!(!error.contains('\n'));
        for imp in implementations() {
            assert!(error.contains(imp.name()));
            assert_eq!(by_name(imp.name()).unwrap().name(), imp.name());
        }
    }

    #[test]
    fn the_benchmark_picks_an_available_implementation() {
        let chosen = fastest();
        assert!(implementations()
            .iter()
            .any(|imp| imp.name() == chosen.name()));
    }
}
