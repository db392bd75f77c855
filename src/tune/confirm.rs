//! A pick is offered only if it beats the defaults when the two are
//! measured again, alternately (A B A B ...), so that a drift of the
//! machine during the run weighs on both alike: every pick run must beat
//! the defaults run before it, and the mean gain must exceed the noise
//! seen in the repeats of either.

use super::search::{mean, spread, Measure};
use super::{Knobs, Sample};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The pick beat the defaults beyond the noise.
    pub confirmed: bool,
    /// The defaults' and the pick's values, in the order measured (A B A B).
    pub default_values: Vec<f64>,
    pub pick_values: Vec<f64>,
    /// mean(pick) / mean(defaults) − 1.
    pub gain: f64,
    /// The relative noise the verdict judged against.
    pub noise: f64,
    /// Why, in a sentence.
    pub reason: String,
}

/// Measures `default` and `pick` alternately `rounds` times each and judges
/// the pick. `noise_before` is the noise the search measured;
/// `latency_guard` bounds the pick's p99 latency against the defaults'.
pub fn confirm(
    measure: &mut dyn Measure,
    default: &Knobs,
    pick: &Knobs,
    rounds: usize,
    noise_before: f64,
    latency_guard: f64,
) -> Result<Verdict, String> {
    assert!(rounds >= 1);
    if pick == default {
        return Ok(Verdict {
            confirmed: false,
            default_values: Vec::new(),
            pick_values: Vec::new(),
            gain: 0.0,
            noise: noise_before,
            reason: "the search found nothing better than the defaults beyond the noise".into(),
        });
    }
    let mut a: Vec<Sample> = Vec::new();
    let mut b: Vec<Sample> = Vec::new();
    for _ in 0..rounds {
        a.push(measure.measure(default)?);
        b.push(measure.measure(pick)?);
    }
    Ok(judge(&a, &b, noise_before, latency_guard))
}

/// The verdict on alternated samples of the defaults (`a`) and the pick (`b`).
pub fn judge(a: &[Sample], b: &[Sample], noise_before: f64, latency_guard: f64) -> Verdict {
    assert_eq!(a.len(), b.len());
    let default_values: Vec<f64> = a.iter().map(|s| s.value).collect();
    let pick_values: Vec<f64> = b.iter().map(|s| s.value).collect();
    let base = mean(default_values.iter().copied());
    let gain = if base > 0.0 {
        mean(pick_values.iter().copied()) / base - 1.0
    } else {
        0.0
    };
    let noise = noise_before
        .max(spread(&default_values))
        .max(spread(&pick_values));
    let every_round = default_values.iter().zip(&pick_values).all(|(x, y)| y > x);
    let p99_a = mean(a.iter().map(|s| s.latency_us_p99));
    let p99_b = mean(b.iter().map(|s| s.latency_us_p99));
    let latency_ok = p99_a <= 0.0 || p99_b <= p99_a * latency_guard;
    let (confirmed, reason) = if !latency_ok {
        (
            false,
            format!(
                "dropped: p99 latency {p99_b:.0} us against the defaults' {p99_a:.0} us \
                 (more than {latency_guard}x)"
            ),
        )
    } else if !every_round {
        (
            false,
            format!(
                "dropped: the pick lost a round against the defaults (gain {:+.1}%)",
                gain * 100.0
            ),
        )
    } else if gain <= noise {
        (
            false,
            format!(
                "dropped: gain {:+.1}% within the noise measured ({:.1}%)",
                gain * 100.0,
                noise * 100.0
            ),
        )
    } else {
        (
            true,
            format!(
                "confirmed: gain {:+.1}% beyond the noise measured ({:.1}%), every round won",
                gain * 100.0,
                noise * 100.0
            ),
        )
    };
    Verdict {
        confirmed,
        default_values,
        pick_values,
        gain,
        noise,
        reason,
    }
}
