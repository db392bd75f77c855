//! The time an array spends at zero redundancy: while it still serves
//! every sector but one more member failure would lose some (a degraded
//! raid5, a raid6 with two members missing, a raid10 pair down to one
//! copy, a dRAID group that lost as many children as its parity). It is
//! the figure a rebuild's order and speed exist to shrink, so the engine
//! keeps it: an event when it starts (NoRedundancy) and when it ends
//! (RedundancyRestored, with how long), and in status the time so far.
//!
//! Asked of the geometry alone (`Geometry::survives`), over the roles in
//! sync: a rebuilt member counts once its rebuild is done, or once it has
//! rebuilt every row that was at zero redundancy without it (a rebuild
//! takes those first, jobs/rebuild.rs).

use crate::geometry::Geometry;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether the roles in sync (`in_sync`, by role) serve every sector and
/// one more failure of any of them would not. Arrays without redundancy
/// (raid0, linear) have none to lose: never.
pub fn at_zero_redundancy(geometry: &Geometry, in_sync: &[bool]) -> bool {
    if !geometry.level().redundant() || in_sync.len() != geometry.raid_disks() {
        return false;
    }
    let mut missing: Vec<bool> = in_sync.iter().map(|s| !s).collect();
    if !geometry.survives(&missing) {
        // Failed, not exposed: that state has words of its own.
        return false;
    }
    (0..missing.len()).any(|role| {
        if missing[role] {
            return false;
        }
        missing[role] = true;
        let lost = !geometry.survives(&missing);
        missing[role] = false;
        lost
    })
}

/// What status shows of it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExposureReport {
    /// Seconds at zero redundancy now, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_secs: Option<f64>,
    /// Seconds at zero redundancy since the engine started, now included.
    pub total_secs: f64,
}

#[derive(Default)]
struct State {
    since: Option<Instant>,
    before: Duration,
}

/// What happened to the exposure at a change of the member table.
#[derive(Debug, PartialEq)]
pub enum Change {
    None,
    Started,
    Ended(Duration),
}

#[derive(Default)]
pub struct Exposure {
    state: Mutex<State>,
}

impl Exposure {
    /// Records whether the array is at zero redundancy now.
    pub fn note(&self, exposed: bool) -> Change {
        let mut state = self.state.lock().unwrap();
        match (state.since, exposed) {
            (None, true) => {
                state.since = Some(Instant::now());
                Change::Started
            }
            (Some(since), false) => {
                let spell = since.elapsed();
                state.before += spell;
                state.since = None;
                Change::Ended(spell)
            }
            _ => Change::None,
        }
    }

    /// None when the array never was at zero redundancy.
    pub fn report(&self) -> Option<ExposureReport> {
        let state = self.state.lock().unwrap();
        let now = state.since.map(|s| s.elapsed());
        let total = state.before + now.unwrap_or_default();
        (now.is_some() || !state.before.is_zero()).then(|| ExposureReport {
            now_secs: now.map(|d| d.as_secs_f64()),
            total_secs: total.as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{Geometry, Level};

    fn geometry(level: Level, disks: u32, layout: Option<&str>) -> Geometry {
        let layout = layout.map_or(0, |name| {
            crate::geometry::layout_from_name(level, name).unwrap()
        });
        Geometry::new(&crate::geometry::GeometryParams {
            level,
            layout,
            chunk_sectors: 8,
            raid_disks: disks,
            dev_sectors: 1024,
            member_data_sectors: vec![1024; disks as usize],
            raid0_layout_feature: false,
        })
        .unwrap()
    }

    #[test]
    fn zero_redundancy_is_one_failure_from_loss_and_not_yet_lost() {
        let raid5 = geometry(Level::Raid5, 4, Some("left-symmetric"));
        assert!(!at_zero_redundancy(&raid5, &[true; 4]));
        assert!(at_zero_redundancy(&raid5, &[true, false, true, true]));
        assert!(
            !at_zero_redundancy(&raid5, &[true, false, false, true]),
            "failed"
        );
        let raid6 = geometry(Level::Raid6, 5, Some("left-symmetric"));
        assert!(!at_zero_redundancy(
            &raid6,
            &[true, false, true, true, true]
        ));
        assert!(at_zero_redundancy(
            &raid6,
            &[true, false, false, true, true]
        ));
        // raid10 n2 of 4: roles 0+1 and 2+3 hold the same chunks.
        let raid10 = geometry(Level::Raid10, 4, Some("n2"));
        assert!(at_zero_redundancy(&raid10, &[false, true, true, true]));
        assert!(!at_zero_redundancy(&raid10, &[true; 4]));
        let raid0 = geometry(Level::Raid0, 3, None);
        assert!(!at_zero_redundancy(&raid0, &[true; 3]), "nothing to lose");
    }

    #[test]
    fn spells_at_zero_redundancy_add_up() {
        let exposure = Exposure::default();
        assert_eq!(exposure.report(), None);
        assert_eq!(exposure.note(false), Change::None);
        assert_eq!(exposure.note(true), Change::Started);
        assert_eq!(exposure.note(true), Change::None);
        assert!(exposure.report().unwrap().now_secs.is_some());
        assert!(matches!(exposure.note(false), Change::Ended(_)));
        let report = exposure.report().unwrap();
        assert_eq!(report.now_secs, None);
        assert!(report.total_secs >= 0.0);
    }
}
