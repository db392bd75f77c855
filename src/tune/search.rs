//! The search: coordinate descent over each knob's candidate values
//! (coarse, then refined beside the best), a small joint sweep of the
//! pairs of knobs that interact, and the leading points measured again.
//! It sees the array only through [`Measure`], so that it is deterministic
//! given the measurements and is tested on synthetic response surfaces.

use super::{Knobs, Sample};
use std::collections::BTreeMap;

/// One knob and the values the search may give it.
#[derive(Clone, Debug)]
pub struct Knob {
    pub name: &'static str,
    /// Candidates; for an ordered knob, in increasing order.
    pub values: Vec<String>,
    /// Neighbouring values give neighbouring results (sizes, counts): the
    /// search samples every other value first and refines beside the best.
    pub ordered: bool,
}

/// What the search may change, and where it starts.
#[derive(Clone, Debug)]
pub struct Space {
    pub knobs: Vec<Knob>,
    /// Pairs whose best values depend on each other, swept jointly.
    pub pairs: Vec<(&'static str, &'static str)>,
    /// The value of every knob in `knobs` before tuning.
    pub default: Knobs,
}

impl Space {
    /// Points of the full grid: what a search without a strategy would
    /// measure.
    pub fn grid_points(&self) -> u64 {
        self.knobs.iter().map(|k| k.values.len() as u64).product()
    }

    fn knob(&self, name: &str) -> &Knob {
        self.knobs
            .iter()
            .find(|k| k.name == name)
            .expect("pairs name knobs of the space")
    }
}

/// Measures the workload with the given knobs.
pub trait Measure {
    fn measure(&mut self, knobs: &Knobs) -> Result<Sample, String>;
    /// The search's share of the budget is spent: stop measuring new points.
    fn exhausted(&self) -> bool {
        false
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SearchSettings {
    /// Measurements of the defaults before anything else: their spread is
    /// the noise a move must beat.
    pub default_repeats: usize,
    /// The best points measured once more at the end.
    pub top_repeats: usize,
    /// Passes over every knob, at most (a pass that moves nothing ends it).
    pub passes: usize,
    /// A point whose p99 latency is above this many times the defaults' is
    /// never picked, whatever its throughput.
    pub latency_guard: f64,
    /// The least relative difference counted as a gain.
    pub noise_floor: f64,
}

impl Default for SearchSettings {
    fn default() -> SearchSettings {
        SearchSettings {
            default_repeats: 3,
            top_repeats: 3,
            passes: 2,
            latency_guard: 1.5,
            noise_floor: 0.02,
        }
    }
}

/// A measured point and every sample taken of it.
#[derive(Clone, Debug)]
pub struct Point {
    pub knobs: Knobs,
    pub samples: Vec<Sample>,
}

impl Point {
    pub fn value(&self) -> f64 {
        mean(self.samples.iter().map(|s| s.value))
    }

    pub fn latency_us_p99(&self) -> f64 {
        mean(self.samples.iter().map(|s| s.latency_us_p99))
    }
}

pub fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// The spread of repeated measurements relative to their mean:
/// (max − min) / mean, 0 for fewer than two.
pub fn spread(values: &[f64]) -> f64 {
    let m = mean(values.iter().copied());
    if values.len() < 2 || m <= 0.0 {
        return 0.0;
    }
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (max - min) / m
}

#[derive(Clone, Debug)]
pub struct SearchOutcome {
    /// Every point measured, in the order first measured; the first is
    /// the defaults.
    pub points: Vec<Point>,
    /// The best point within the latency guard (the defaults if none is
    /// better).
    pub best: Knobs,
    /// The relative noise the search measured on the defaults (at least
    /// the floor).
    pub noise: f64,
    /// Measurements taken.
    pub evaluations: usize,
    /// The budget ran out before the search finished.
    pub cut_short: bool,
}

impl SearchOutcome {
    pub fn point(&self, knobs: &Knobs) -> Option<&Point> {
        self.points.iter().find(|p| &p.knobs == knobs)
    }
}

/// `base` with some knobs changed.
fn with(base: &Knobs, changes: &[(&str, &str)]) -> Knobs {
    let mut k = base.clone();
    for (name, value) in changes {
        k.insert((*name).to_string(), (*value).to_string());
    }
    k
}

struct Search<'a> {
    space: &'a Space,
    settings: SearchSettings,
    measure: &'a mut dyn Measure,
    points: Vec<Point>,
    index: BTreeMap<Knobs, usize>,
    evaluations: usize,
    cut_short: bool,
    noise: f64,
}

impl Search<'_> {
    /// Measures `knobs` once more (a new point or a repeat); false once the
    /// budget is spent.
    fn sample(&mut self, knobs: &Knobs) -> Result<bool, String> {
        if self.measure.exhausted() {
            self.cut_short = true;
            return Ok(false);
        }
        self.sample_now(knobs)?;
        Ok(true)
    }

    /// Measures `knobs` whatever the budget says.
    fn sample_now(&mut self, knobs: &Knobs) -> Result<(), String> {
        let sample = self.measure.measure(knobs)?;
        assert!(sample.value.is_finite() && sample.value >= 0.0);
        self.evaluations += 1;
        match self.index.get(knobs) {
            Some(&i) => self.points[i].samples.push(sample),
            None => {
                self.index.insert(knobs.clone(), self.points.len());
                self.points.push(Point {
                    knobs: knobs.clone(),
                    samples: vec![sample],
                });
            }
        }
        Ok(())
    }

    /// Measures `knobs` unless it was measured already.
    fn visit(&mut self, knobs: &Knobs) -> Result<bool, String> {
        if self.index.contains_key(knobs) {
            return Ok(true);
        }
        self.sample(knobs)
    }

    fn value(&self, knobs: &Knobs) -> Option<f64> {
        self.index.get(knobs).map(|&i| self.points[i].value())
    }

    fn admissible(&self, knobs: &Knobs) -> bool {
        let guard = self.points[0].latency_us_p99() * self.settings.latency_guard;
        self.index
            .get(knobs)
            .is_some_and(|&i| guard <= 0.0 || self.points[i].latency_us_p99() <= guard)
    }

    /// The better of `current` and `candidate`: the candidate must beat the
    /// current point by more than the noise.
    fn better(&self, current: &Knobs, candidate: &Knobs) -> bool {
        match (self.value(current), self.value(candidate)) {
            (Some(c), Some(v)) => self.admissible(candidate) && v > c * (1.0 + self.noise),
            _ => false,
        }
    }

    /// The best of `candidates` (each `base` with one change), or `base`.
    fn best_of(&mut self, base: &Knobs, candidates: &[Knobs]) -> Result<(Knobs, bool), String> {
        let mut best = base.clone();
        for c in candidates {
            if !self.visit(c)? {
                return Ok((best, false));
            }
            let best_value = self.value(&best).unwrap_or(0.0);
            if self.admissible(c) && self.value(c).unwrap_or(0.0) > best_value {
                best = c.clone();
            }
        }
        Ok((best, true))
    }

    /// One knob from `current`: coarse values, then beside the best.
    fn descend(&mut self, current: &Knobs, knob: &Knob) -> Result<(Knobs, bool), String> {
        let at = knob
            .values
            .iter()
            .position(|v| Some(v) == current.get(knob.name));
        let coarse: Vec<Knobs> = knob
            .values
            .iter()
            .enumerate()
            .filter(|(i, _)| !knob.ordered || i % 2 == 0 || Some(*i) == at)
            .map(|(_, v)| with(current, &[(knob.name, v)]))
            .collect();
        let (best, more) = self.best_of(current, &coarse)?;
        if !more {
            return Ok((best, false));
        }
        if !knob.ordered {
            return Ok((best, true));
        }
        let i = knob
            .values
            .iter()
            .position(|v| Some(v) == best.get(knob.name))
            .expect("the best is a candidate");
        let near: Vec<Knobs> = [i.checked_sub(1), Some(i + 1)]
            .into_iter()
            .flatten()
            .filter_map(|j| knob.values.get(j))
            .map(|v| with(current, &[(knob.name, v)]))
            .collect();
        let (refined, more) = self.best_of(&best, &near)?;
        Ok((refined, more))
    }

    /// A pair jointly, as `descend` does one knob: a coarse grid of both
    /// (each knob's coarse values), then the grid's neighbours of its best.
    /// A diagonal ridge (the best stripe cache grows with the workers)
    /// stops a descent along either axis; a joint sweep crosses it.
    fn sweep_pair(&mut self, current: &Knobs, a: &Knob, b: &Knob) -> Result<(Knobs, bool), String> {
        let coarse = |k: &Knob| -> Vec<usize> {
            let at = k.values.iter().position(|v| Some(v) == current.get(k.name));
            (0..k.values.len())
                .filter(|&i| !k.ordered || k.values.len() <= 4 || i % 2 == 0 || Some(i) == at)
                .collect()
        };
        let point =
            |i: usize, j: usize| with(current, &[(a.name, &a.values[i]), (b.name, &b.values[j])]);
        let mut joint = Vec::new();
        for i in coarse(a) {
            for j in coarse(b) {
                joint.push(point(i, j));
            }
        }
        let (best, more) = self.best_of(current, &joint)?;
        if !more {
            return Ok((best, false));
        }
        let at = |k: &Knob| {
            k.values
                .iter()
                .position(|v| Some(v) == best.get(k.name))
                .unwrap_or(0)
        };
        let (bi, bj) = (at(a), at(b));
        let mut near = Vec::new();
        for i in bi.saturating_sub(1)..(bi + 2).min(a.values.len()) {
            for j in bj.saturating_sub(1)..(bj + 2).min(b.values.len()) {
                near.push(point(i, j));
            }
        }
        self.best_of(&best, &near)
    }

    fn run(mut self) -> Result<SearchOutcome, String> {
        let space = self.space;
        let default = space.default.clone();
        // The defaults at least once, whatever the budget: every verdict
        // is against them.
        self.sample_now(&default)?;
        for _ in 1..self.settings.default_repeats {
            if !self.sample(&default)? {
                break;
            }
        }
        let values: Vec<f64> = self
            .points
            .first()
            .map_or(Vec::new(), |p| p.samples.iter().map(|s| s.value).collect());
        self.noise = spread(&values).max(self.settings.noise_floor);
        let mut current = default.clone();
        'passes: for _ in 0..self.settings.passes {
            let mut moved = false;
            for knob in &space.knobs {
                let (best, more) = self.descend(&current, knob)?;
                if self.better(&current, &best) {
                    current = best;
                    moved = true;
                }
                if !more {
                    break 'passes;
                }
            }
            for (a, b) in &space.pairs {
                let (best, more) = self.sweep_pair(&current, space.knob(a), space.knob(b))?;
                if self.better(&current, &best) {
                    current = best;
                    moved = true;
                }
                if !more {
                    break 'passes;
                }
            }
            if !moved {
                break;
            }
        }
        self.repeat_leaders()?;
        let best = self.best_measured(&default);
        Ok(SearchOutcome {
            points: self.points,
            best,
            noise: self.noise,
            evaluations: self.evaluations,
            cut_short: self.cut_short,
        })
    }

    /// Measures the leading points again, so that one lucky run does not
    /// decide: a point measured once is ranked on that run alone.
    fn repeat_leaders(&mut self) -> Result<(), String> {
        let mut ranked: Vec<usize> = (1..self.points.len()).collect();
        ranked.sort_by(|&x, &y| self.points[y].value().total_cmp(&self.points[x].value()));
        let leaders: Vec<Knobs> = ranked
            .into_iter()
            .filter(|&i| self.points[i].samples.len() < 2)
            .take(self.settings.top_repeats)
            .map(|i| self.points[i].knobs.clone())
            .collect();
        for knobs in leaders {
            if !self.sample(&knobs)? {
                break;
            }
        }
        Ok(())
    }

    /// The best point by its mean within the latency guard, the defaults
    /// unless one beats them by more than the noise.
    fn best_measured(&self, default: &Knobs) -> Knobs {
        // A point measured once is the likeliest to have been lucky: once
        // the leaders are measured again, only repeated points compete.
        let repeated = |p: &&Point| p.samples.len() >= 2 || &p.knobs == default;
        let best = self
            .points
            .iter()
            .filter(repeated)
            .filter(|p| self.admissible(&p.knobs))
            .max_by(|x, y| x.value().total_cmp(&y.value()))
            .map_or(default.clone(), |p| p.knobs.clone());
        if self.better(default, &best) {
            best
        } else {
            default.clone()
        }
    }
}

/// Searches `space` for the knobs that give the highest value.
pub fn search(
    space: &Space,
    settings: SearchSettings,
    measure: &mut dyn Measure,
) -> Result<SearchOutcome, String> {
    assert!(space.knobs.iter().all(|k| !k.values.is_empty()));
    assert!(space
        .knobs
        .iter()
        .all(|k| k.values.contains(&space.default[k.name])));
    Search {
        space,
        settings,
        measure,
        points: Vec::new(),
        index: BTreeMap::new(),
        evaluations: 0,
        cut_short: false,
        noise: settings.noise_floor,
    }
    .run()
}
