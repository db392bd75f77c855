//! Which knobs matter for which workload, and their candidate values.
//! A knob that cannot change a workload's result is left out: every value
//! it adds multiplies the grid and costs the search measurements.

use super::search::{Knob, Space};
use super::Knobs;
use crate::bench::workload::{Op, Pattern, Workload};
use crate::engine::tuning::TuningValues;

/// What the scratch array allows.
#[derive(Clone, Copy, Debug)]
pub struct ArrayFacts {
    /// raid4/5/6 or dRAID: the stripe cache batches writes, rmw_level and
    /// the stripe workers do parity work.
    pub parity: bool,
    /// A write journal protects write-back.
    pub journaled: bool,
}

/// Candidate values, the default among them (sorted in for ordered knobs).
fn candidates(values: &[u32], default: u32) -> Vec<String> {
    let mut v: Vec<u32> = values.to_vec();
    if !v.contains(&default) {
        v.push(default);
    }
    v.sort_unstable();
    v.into_iter().map(|n| n.to_string()).collect()
}

fn knob(name: &'static str, defaults: &TuningValues) -> Knob {
    let ordered = |values: &[u32], default| Knob {
        name,
        values: candidates(values, default),
        ordered: true,
    };
    let choice = |values: &[&str]| Knob {
        name,
        values: values.iter().map(|s| s.to_string()).collect(),
        ordered: false,
    };
    match name {
        "stripe_cache_size" => ordered(
            &[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
            defaults.stripe_cache_size,
        ),
        "read_ahead" => ordered(&[0, 256, 1024, 4096, 16384, 65536], defaults.read_ahead),
        "max_sectors_kb" => ordered(&[64, 128, 256, 512, 1280, 4096], defaults.max_sectors_kb),
        "group_thread_cnt" => ordered(&[0, 1, 2, 4], defaults.group_thread_cnt),
        "rmw_level" => ordered(&[0, 1, 2], u32::from(defaults.rmw_level)),
        "read_cache" | "fast_path" => choice(&["off", "on"]),
        "write_policy" => choice(&["write-through", "write-back"]),
        other => unreachable!("no candidates for {other}"),
    }
}

/// The knobs that matter for `workload`, most telling first (coordinate
/// descent settles the first ones while the others are at their
/// defaults), and the pairs that interact.
pub fn space(workload: Workload, facts: ArrayFacts, defaults: &TuningValues) -> Space {
    let phases = workload.phases(1 << 20);
    let writes = phases.iter().any(|p| p.op == Op::Write);
    let reads = phases.iter().any(|p| p.op == Op::Read);
    let sequential = phases.iter().any(|p| p.pattern == Pattern::Sequential);
    let small_random = phases
        .iter()
        .any(|p| p.pattern == Pattern::Random && p.block_bytes <= 64 << 10);
    let mut names: Vec<&'static str> = Vec::new();
    if writes && facts.parity {
        names.extend(["stripe_cache_size", "group_thread_cnt"]);
        if small_random {
            names.push("rmw_level");
        }
    }
    if reads && sequential {
        if !names.contains(&"stripe_cache_size") {
            // Read-ahead is kept in the stripe cache's memory, at most half.
            names.push("stripe_cache_size");
        }
        names.push("read_ahead");
    }
    if sequential {
        names.push("max_sectors_kb");
    }
    if reads {
        names.push("read_cache");
    }
    if reads && small_random {
        names.push("fast_path");
    }
    if writes && facts.journaled {
        names.push("write_policy");
    }
    let mut pairs = Vec::new();
    if names.contains(&"group_thread_cnt") {
        pairs.push(("stripe_cache_size", "group_thread_cnt"));
    }
    let knobs: Vec<Knob> = names.iter().map(|n| knob(n, defaults)).collect();
    let in_force: Knobs = defaults.pairs().into_iter().collect();
    let default = knobs
        .iter()
        .map(|k| (k.name.to_string(), in_force[k.name].clone()))
        .collect();
    Space {
        knobs,
        pairs,
        default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_has_knobs_and_its_defaults_are_candidates() {
        let defaults = TuningValues::defaults(768);
        for journaled in [false, true] {
            for parity in [false, true] {
                for w in Workload::ALL {
                    let s = space(w, ArrayFacts { parity, journaled }, &defaults);
                    // Small random writes without parity or a journal have
                    // no knob that changes them.
                    let none = !parity && !journaled && w == Workload::FioRandwrite;
                    assert_eq!(s.knobs.is_empty(), none, "{}", w.name());
                    for k in &s.knobs {
                        assert!(k.values.contains(&s.default[k.name]), "{}", k.name);
                        let mut check = defaults;
                        for v in &k.values {
                            check.set(k.name, v, true).unwrap();
                        }
                    }
                    let has = |n| s.knobs.iter().any(|k| k.name == n);
                    assert_eq!(
                        has("write_policy"),
                        journaled && w != Workload::Randread && w != Workload::RandreadQd
                    );
                    for (a, b) in &s.pairs {
                        assert!(has(a) && has(b));
                    }
                }
            }
        }
        let rw = space(
            Workload::FioRandwrite,
            ArrayFacts {
                parity: true,
                journaled: false,
            },
            &defaults,
        );
        let names: Vec<&str> = rw.knobs.iter().map(|k| k.name).collect();
        assert_eq!(
            names,
            ["stripe_cache_size", "group_thread_cnt", "rmw_level"]
        );
        assert_eq!(rw.pairs, [("stripe_cache_size", "group_thread_cnt")]);
        // md's default for read-ahead (two stripes) is sorted in.
        let dd = space(
            Workload::DdSeq,
            ArrayFacts {
                parity: true,
                journaled: false,
            },
            &defaults,
        );
        let ra = dd.knobs.iter().find(|k| k.name == "read_ahead").unwrap();
        assert!(ra.values.contains(&"1536".to_string()));
    }
}
