//! The search and the confirmation against synthetic response surfaces:
//! a known best, seeded noise, a budget in measurements.

use super::confirm::{confirm, judge};
use super::search::{search, Knob, Measure, SearchSettings, Space};
use super::{Knobs, Sample};

type Surface = Box<dyn Fn(&Knobs) -> (f64, f64)>;

/// A surface with seeded, uniform relative noise, counting measurements.
struct Synthetic {
    surface: Surface,
    noise: f64,
    state: u64,
    count: usize,
    limit: usize,
}

impl Synthetic {
    fn new(surface: Surface, noise: f64, seed: u64) -> Synthetic {
        Synthetic {
            surface,
            noise,
            state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            count: 0,
            limit: usize::MAX,
        }
    }

    /// Uniform in [-1, 1) (xorshift64*).
    fn jitter(&mut self) -> f64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let x = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        x as f64 / (1u64 << 52) as f64 - 1.0
    }
}

impl Measure for Synthetic {
    fn measure(&mut self, knobs: &Knobs) -> Result<Sample, String> {
        self.count += 1;
        let (value, p99) = (self.surface)(knobs);
        Ok(Sample {
            value: value * (1.0 + self.noise * self.jitter()),
            latency_us_p99: p99,
        })
    }

    fn exhausted(&self) -> bool {
        self.count >= self.limit
    }
}

fn ordered(name: &'static str, values: &[u32]) -> Knob {
    Knob {
        name,
        values: values.iter().map(u32::to_string).collect(),
        ordered: true,
    }
}

/// Five knobs as the tuner sees a parity array's sequential workload:
/// 10 × 4 × 3 × 6 × 7 = 5040 points.
fn space() -> Space {
    let knobs = vec![
        ordered(
            "stripe_cache_size",
            &[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        ),
        ordered("group_thread_cnt", &[0, 1, 2, 4]),
        ordered("rmw_level", &[0, 1, 2]),
        ordered("max_sectors_kb", &[64, 128, 256, 512, 1280, 4096]),
        ordered("read_ahead", &[0, 256, 1024, 1536, 4096, 16384, 65536]),
    ];
    let default = [
        ("stripe_cache_size", "256"),
        ("group_thread_cnt", "0"),
        ("rmw_level", "1"),
        ("max_sectors_kb", "1280"),
        ("read_ahead", "1536"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Space {
        knobs,
        pairs: vec![("stripe_cache_size", "group_thread_cnt")],
        default,
    }
}

fn index(space: &Space, knobs: &Knobs, name: &str) -> f64 {
    let knob = space.knobs.iter().find(|k| k.name == name).unwrap();
    knob.values.iter().position(|v| v == &knobs[name]).unwrap() as f64
}

/// A peaked surface whose stripe cache optimum moves with the worker
/// count (the interaction), with smooth hills for the other knobs.
fn peaked(space: &Space) -> Surface {
    let space = space.clone();
    Box::new(move |k: &Knobs| {
        let scs = index(&space, k, "stripe_cache_size");
        let gtc = index(&space, k, "group_thread_cnt");
        let rmw = index(&space, k, "rmw_level");
        let msk = index(&space, k, "max_sectors_kb");
        let ra = index(&space, k, "read_ahead");
        let peak = 3.0 + 2.0 * gtc;
        let value = 1000.0
            * (-(scs - peak).powi(2) / 6.0).exp()
            * (1.0 + 0.15 * gtc)
            * (1.0 - 0.1 * (rmw - 1.0).abs())
            * (1.0 - 0.04 * (msk - 3.0).powi(2).min(9.0))
            * (1.0 + 0.3 * (-(ra - 4.0).powi(2) / 2.0).exp());
        (value, 100.0)
    })
}

fn grid(space: &Space) -> Vec<Knobs> {
    let mut points = vec![Knobs::new()];
    for knob in &space.knobs {
        points = points
            .into_iter()
            .flat_map(|p| {
                knob.values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.insert(knob.name.to_string(), v.clone());
                    q
                })
            })
            .collect();
    }
    points
}

fn grid_best(space: &Space, surface: &Surface) -> f64 {
    grid(space).iter().map(|k| surface(k).0).fold(0.0, f64::max)
}

#[test]
fn the_grid_is_what_the_space_says() {
    let s = space();
    assert_eq!(grid(&s).len() as u64, s.grid_points());
    assert_eq!(s.grid_points(), 5040);
}

#[test]
fn the_search_reaches_the_grids_best_in_a_fraction_of_its_runs() {
    let s = space();
    let best = grid_best(&s, &peaked(&s));
    for (noise, seed) in [(0.0, 1), (0.02, 2), (0.02, 3), (0.03, 4)] {
        let mut m = Synthetic::new(peaked(&s), noise, seed);
        let out = search(&s, SearchSettings::default(), &mut m).unwrap();
        let found = (peaked(&s))(&out.best).0;
        assert!(
            found >= 0.95 * best,
            "noise {noise}: {found:.1} against the grid's {best:.1} ({:?})",
            out.best
        );
        assert_eq!(out.evaluations, m.count);
        assert!(
            out.evaluations * 20 <= s.grid_points() as usize,
            "{} runs for a grid of {}",
            out.evaluations,
            s.grid_points()
        );
        assert!(!out.cut_short);
    }
}

#[test]
fn the_search_is_deterministic_given_the_measurements() {
    let s = space();
    let run = || {
        let mut m = Synthetic::new(peaked(&s), 0.03, 7);
        let out = search(&s, SearchSettings::default(), &mut m).unwrap();
        (out.best, out.evaluations)
    };
    assert_eq!(run(), run());
}

fn flat(_: &Knobs) -> (f64, f64) {
    (1000.0, 100.0)
}

#[test]
fn noise_alone_is_never_offered_as_a_gain() {
    let s = space();
    for seed in 0..40 {
        let mut m = Synthetic::new(Box::new(flat), 0.04, seed);
        let out = search(&s, SearchSettings::default(), &mut m).unwrap();
        let v = confirm(&mut m, &s.default, &out.best, 3, out.noise, 1.5).unwrap();
        assert!(
            !v.confirmed,
            "seed {seed}: {:?} offered: {}",
            out.best, v.reason
        );
    }
}

#[test]
fn a_real_gain_survives_the_noise_and_is_confirmed() {
    let s = space();
    // 4096 entries give 30 % more, a step the descent must find.
    let surface = |k: &Knobs| {
        let big = k["stripe_cache_size"].parse::<u32>().unwrap() >= 4096;
        (if big { 1300.0 } else { 1000.0 }, 100.0)
    };
    for seed in 0..10 {
        let mut m = Synthetic::new(Box::new(surface), 0.04, seed);
        let out = search(&s, SearchSettings::default(), &mut m).unwrap();
        assert!(out.best["stripe_cache_size"].parse::<u32>().unwrap() >= 4096);
        let v = confirm(&mut m, &s.default, &out.best, 3, out.noise, 1.5).unwrap();
        assert!(v.confirmed, "seed {seed}: {}", v.reason);
        assert!(v.gain > 0.2 && v.default_values.len() == 3);
    }
}

#[test]
fn the_latency_guard_keeps_out_a_faster_point_that_queues() {
    let s = space();
    // The largest cache is fastest, but its p99 is four times the defaults'.
    let surface = |k: &Knobs| match k["stripe_cache_size"].as_str() {
        "32768" => (2000.0, 400.0),
        "16384" => (1200.0, 110.0),
        _ => (1000.0, 100.0),
    };
    let mut m = Synthetic::new(Box::new(surface), 0.0, 1);
    let out = search(&s, SearchSettings::default(), &mut m).unwrap();
    assert_eq!(out.best["stripe_cache_size"], "16384");
    assert!(out.point(&out.best).is_some());
}

#[test]
fn the_budget_stops_the_search_with_the_defaults_measured() {
    let s = space();
    let mut m = Synthetic::new(peaked(&s), 0.0, 1);
    m.limit = 0;
    let out = search(&s, SearchSettings::default(), &mut m).unwrap();
    assert!(out.cut_short);
    assert_eq!(out.evaluations, 1, "the defaults once, whatever the budget");
    assert_eq!(out.best, s.default);
    let mut m = Synthetic::new(peaked(&s), 0.0, 1);
    m.limit = 12;
    let out = search(&s, SearchSettings::default(), &mut m).unwrap();
    assert!(out.cut_short && out.evaluations <= 12);
}

fn samples(values: &[f64]) -> Vec<Sample> {
    values
        .iter()
        .map(|&value| Sample {
            value,
            latency_us_p99: 100.0,
        })
        .collect()
}

#[test]
fn the_verdict_wants_every_round_and_a_gain_beyond_the_noise() {
    let a = samples(&[100.0, 101.0, 99.0]);
    let won = judge(&a, &samples(&[120.0, 119.0, 121.0]), 0.02, 1.5);
    assert!(won.confirmed, "{}", won.reason);
    // A large mean gain from one lucky round: a round lost.
    let lucky = judge(&a, &samples(&[200.0, 98.0, 100.0]), 0.02, 1.5);
    assert!(!lucky.confirmed && lucky.reason.contains("lost a round"));
    // Every round won, but by less than the noise measured.
    let small = judge(&a, &samples(&[101.5, 102.0, 100.0]), 0.03, 1.5);
    assert!(!small.confirmed && small.reason.contains("within the noise"));
    // Faster but queueing.
    let mut slow = samples(&[150.0, 150.0, 150.0]);
    slow.iter_mut().for_each(|s| s.latency_us_p99 = 200.0);
    let queued = judge(&a, &slow, 0.02, 1.5);
    assert!(!queued.confirmed && queued.reason.contains("p99"));
}

#[test]
fn the_defaults_as_pick_need_no_confirmation_runs() {
    let s = space();
    let mut m = Synthetic::new(Box::new(flat), 0.0, 1);
    let v = confirm(&mut m, &s.default, &s.default, 2, 0.02, 1.5).unwrap();
    assert!(!v.confirmed && m.count == 0);
}
