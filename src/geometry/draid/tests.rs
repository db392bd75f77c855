use std::collections::HashMap;

use super::*;

fn params(parity: usize, data: usize, children: usize, spares: usize) -> DraidParams {
    DraidParams {
        parity,
        data,
        children,
        spares,
        chunk_sectors: ROW_SECTORS / 4,
        dev_sectors: 0,
    }
}

/// A small array of `slices` slices, with four stripes per group.
fn small(parity: usize, data: usize, children: usize, spares: usize, slices: u64) -> Draid {
    let probe = Draid::new(&DraidParams {
        dev_sectors: u64::MAX / 2,
        ..params(parity, data, children, spares)
    })
    .unwrap();
    Draid::new(&DraidParams {
        dev_sectors: slices * probe.devslice_sectors() + 7,
        ..params(parity, data, children, spares)
    })
    .unwrap()
}

#[test]
fn the_published_examples_have_their_shapes() {
    // draid1:4d:11c:1s: W=5, N=10.
    let g = small(1, 4, 11, 1, 2);
    assert_eq!((g.groups_per_slice(), g.rows_per_slice()), (2, 1));
    assert_eq!(g.devslice_sectors(), ROW_SECTORS);
    // draid1:8d:14c:2s: W=9, N=12.
    let g = small(1, 8, 14, 2, 1);
    assert_eq!((g.groups_per_slice(), g.rows_per_slice()), (4, 3));
    assert_eq!(g.devslice_sectors(), 3 * ROW_SECTORS);
    // draid2:8d:68c:2s: W=10, N=66.
    let g = small(2, 8, 68, 2, 1);
    assert_eq!((g.groups_per_slice(), g.rows_per_slice()), (33, 5));
    assert_eq!(g.devslice_sectors(), 5 * ROW_SECTORS);
    assert_eq!(g.array_sectors(), 33 * 8 * ROW_SECTORS);
}

#[test]
fn bad_parameters_are_refused() {
    let ok = DraidParams {
        dev_sectors: 1 << 30,
        ..params(1, 4, 11, 1)
    };
    assert!(Draid::new(&ok).is_ok());
    let bad = [
        DraidParams {
            parity: 0,
            ..ok.clone()
        },
        DraidParams {
            parity: 4,
            ..ok.clone()
        },
        DraidParams {
            data: 0,
            ..ok.clone()
        },
        DraidParams {
            children: 1,
            ..ok.clone()
        },
        DraidParams {
            children: 256,
            ..ok.clone()
        },
        DraidParams {
            spares: 101,
            ..ok.clone()
        },
        DraidParams {
            spares: 7,
            ..ok.clone()
        },
        DraidParams {
            chunk_sectors: 4,
            ..ok.clone()
        },
        DraidParams {
            chunk_sectors: 24,
            ..ok.clone()
        },
        DraidParams {
            chunk_sectors: 2 * ROW_SECTORS,
            ..ok.clone()
        },
        DraidParams {
            dev_sectors: ROW_SECTORS - 1,
            ..ok.clone()
        },
    ];
    for p in bad {
        let err = Draid::new(&p).unwrap_err();
        assert!(matches!(err, GeometryError::Invalid(_)), "{p:?}");
        assert!(!err.to_string().contains('\n'));
    }
}

/// Every (child, chunk-high cell) the array uses, and what holds it.
fn cells(g: &Draid) -> HashMap<(usize, u64), Holding> {
    let end = g.slices() * g.devslice_sectors();
    let mut all = HashMap::new();
    for child in 0..g.raid_disks() {
        for sector in (0..end).step_by(g.chunk_sectors() as usize) {
            all.insert((child, sector), g.columns_at(child, sector));
        }
    }
    all
}

/// Small arrays of each parity count, with and without wrapping groups
/// and with one and several rows per slice.
fn shapes() -> [Draid; 4] {
    [
        small(1, 4, 11, 1, 3),
        small(1, 8, 14, 2, 2),
        small(2, 8, 14, 2, 2),
        small(3, 5, 13, 2, 2),
    ]
}

/// In every slice each group column has one child, every child of a group
/// is different, and each spare has one child per chunk of height.
#[test]
fn slices_are_permutations_of_the_children() {
    for g in shapes() {
        let all = cells(&g);
        let mut column_holders: HashMap<(u64, usize, usize), Vec<usize>> = HashMap::new();
        let mut spare_holders: HashMap<(usize, u64), Vec<usize>> = HashMap::new();
        for (&(child, sector), holding) in &all {
            match *holding {
                Holding::Column {
                    slice,
                    group,
                    column,
                    ..
                } => {
                    assert_eq!(slice, g.slice_of(sector));
                    column_holders
                        .entry((slice, group, column))
                        .or_default()
                        .push(child)
                }
                Holding::Spare(s) => {
                    assert_eq!(g.spare_child(s, sector), child);
                    spare_holders.entry((s, sector)).or_default().push(child)
                }
            }
        }
        let width = g.data() + g.parity();
        let chunks = (ROW_SECTORS / g.chunk_sectors()) as usize;
        assert_eq!(
            column_holders.len() as u64,
            g.slices() * (g.groups_per_slice() * width) as u64
        );
        for ((slice, group, _), holders) in &column_holders {
            // One child, for every chunk of the column's height.
            assert_eq!(holders.len(), chunks);
            assert!(holders.iter().all(|&c| c == holders[0]));
            let others: Vec<usize> = (0..width)
                .map(|col| column_holders[&(*slice, *group, col)][0])
                .collect();
            let mut distinct = others.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(
                distinct.len(),
                width,
                "a child holds two columns of a group"
            );
        }
        for holders in spare_holders.values() {
            assert_eq!(holders.len(), 1);
        }
    }
}

/// The stripe maps of all stripes cover every data and parity cell once
/// and no spare cell, and what a cell says it holds agrees with the map.
#[test]
fn stripes_cover_every_column_cell_once() {
    for g in shapes() {
        let all = cells(&g);
        let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
        for stripe in 0..g.stripe_count() {
            let map = g.stripe(stripe);
            assert_eq!(map.data.len(), g.data());
            assert_eq!(map.parity_places().count(), g.parity());
            let places = map
                .parity_places()
                .chain(map.data.iter().map(|d| d.copies[0]));
            for (column, place) in places.enumerate() {
                *seen.entry((place.member, place.member_sector)).or_default() += 1;
                match all[&(place.member, place.member_sector)] {
                    Holding::Column {
                        column: c,
                        stripe: s,
                        ..
                    } => assert_eq!((c, s), (column, stripe)),
                    Holding::Spare(_) => panic!("stripe {stripe} uses a spare cell"),
                }
            }
            for (j, strip) in map.data.iter().enumerate() {
                assert_eq!(strip.q_exponent as usize, j);
            }
        }
        assert!(seen.values().all(|&n| n == 1));
        let columns = all
            .values()
            .filter(|h| matches!(h, Holding::Column { .. }))
            .count();
        assert_eq!(seen.len(), columns);
    }
}

#[test]
fn locate_and_stripe_of_agree_with_the_stripe_map() {
    let g = small(2, 3, 9, 1, 2);
    let step = g.chunk_sectors() / 2 + 1;
    for sector in (0..g.array_sectors()).step_by(step as usize) {
        let stripe = g.stripe_of(sector);
        let map = g.stripe(stripe);
        assert!(map.array_sector <= sector && sector < map.array_sector + map.data_sectors());
        let located = g.locate(sector);
        assert_eq!(located.stripe, stripe);
        let index = ((sector - map.array_sector) / map.strip_sectors) as usize;
        assert_eq!(located.data_index, index);
        assert_eq!(located.place, map.data[index].copies[0]);
        assert_eq!(
            located.in_strip_sectors,
            (sector - map.array_sector) % map.strip_sectors
        );
    }
}

/// Resync and recovery progress is kept in member sectors and resumed by
/// a binary search over stripes, which needs positions that grow with the
/// stripe number and find their stripe again; the bitmap's range of a
/// stripe covers its cells.
#[test]
fn resync_positions_never_decrease() {
    for g in [
        small(1, 4, 11, 1, 3),
        small(1, 8, 14, 2, 2),
        small(2, 8, 68, 2, 2),
    ] {
        let mut last = 0;
        for stripe in 0..=g.stripe_count() {
            let position = g.resync_position_sectors(stripe);
            assert!(stripe == 0 || position > last, "stripe {stripe}");
            assert_eq!(g.stripe_at_resync_position_for_test(position), stripe);
            last = position;
            if stripe < g.stripe_count() {
                let map = g.stripe(stripe);
                let range = g.bitmap_sectors(stripe);
                assert_eq!(map.p.unwrap().member_sector, range.start);
                for place in map
                    .parity_places()
                    .chain(map.data.iter().map(|d| d.copies[0]))
                {
                    assert!(range.start <= place.member_sector);
                    assert!(place.member_sector + map.strip_sectors <= range.end);
                }
            }
        }
        assert_eq!(last, g.slices() * g.devslice_sectors());
    }
}

/// Worst over survivors of total rebuild I/O (reads and writes), divided by
/// the least, for one failure over a full rotation cycle.
fn imbalance(g: &Draid, failed: usize) -> f64 {
    let load = g.rebuild_load(failed, 0..g.slices());
    let totals: Vec<u64> = load
        .iter()
        .enumerate()
        .filter(|(child, _)| *child != failed)
        .map(|(_, (r, w))| r + w)
        .collect();
    let max = *totals.iter().max().unwrap() as f64;
    let min = *totals.iter().min().unwrap() as f64;
    max / min
}

/// A whole rotation cycle of slices for `children` children.
fn full_cycle(parity: usize, data: usize, children: usize, spares: usize) -> Draid {
    small(
        parity,
        data,
        children,
        spares,
        (nperms(children) * children) as u64,
    )
}

#[test]
fn rebuild_load_is_balanced_over_a_rotation_cycle() {
    for (parity, data, children) in [(1, 4, 11), (2, 8, 24), (2, 8, 48)] {
        let g = full_cycle(parity, data, children, 1);
        for failed in [0, children / 2, children - 1] {
            let ratio = imbalance(&g, failed);
            eprintln!("draid{parity}:{data}d:{children}c:1s failed {failed}: max/min {ratio:.4}");
            assert!(ratio <= 1.15, "{children} children: {ratio}");
        }
    }
}

/// What a rebuild reads and writes adds up: W - 1 reads and one write of a
/// column for every group the failed child had a column in.
#[test]
fn rebuild_load_counts_every_degraded_group() {
    let g = small(2, 8, 14, 2, 5);
    let failed = 3;
    let load = g.rebuild_load(failed, 0..g.slices());
    assert_eq!(load[failed], (0, 0));
    let degraded = cells(&g)
        .iter()
        .filter(|((child, sector), h)| {
            *child == failed && sector % ROW_SECTORS == 0 && matches!(h, Holding::Column { .. })
        })
        .count() as u64;
    let reads: u64 = load.iter().map(|l| l.0).sum();
    let writes: u64 = load.iter().map(|l| l.1).sum();
    assert_eq!(reads, degraded * 9 * ROW_SECTORS);
    assert_eq!(writes, degraded * ROW_SECTORS);
}

fn geometry_params(layout: u32, raid_disks: u32) -> crate::geometry::GeometryParams {
    crate::geometry::GeometryParams {
        level: crate::geometry::Level::Draid2,
        layout,
        chunk_sectors: 1024,
        raid_disks,
        // Two slices of draid2:8d:14c:2s, whose slices are five rows tall.
        dev_sectors: 2 * 5 * ROW_SECTORS + 5,
        member_data_sectors: Vec::new(),
        raid0_layout_feature: false,
    }
}

/// Geometry reads dRAID's data and spare counts from the layout word and
/// answers for it as for the md levels.
#[test]
fn geometry_serves_draid_from_the_layout_word() {
    use crate::geometry::{draid_layout, Geometry, Level};
    let g = Geometry::new(&geometry_params(draid_layout(8, 2), 14)).unwrap();
    let d = g.draid().unwrap();
    assert_eq!((d.data(), d.spares(), d.parity()), (8, 2, 2));
    assert_eq!(
        (g.level(), g.raid_disks(), g.max_failed_members()),
        (Level::Draid2, 14, 2)
    );
    assert!(g.raid10().is_none() && g.reshaping().is_none());
    let mut missing = vec![false; 14];
    missing[3] = true;
    missing[9] = true;
    assert!(g.survives(&missing));
    missing[0] = true;
    assert!(!g.survives(&missing));
    for stripe in 0..g.stripe_count() {
        let position = g.resync_position_sectors(stripe);
        let resumed = g.stripe_at_resync_position(position);
        // Resuming never skips a stripe and repeats at most the stripes
        // that share this position.
        assert!(resumed <= stripe);
        assert_eq!(g.resync_position_sectors(resumed), position);
        let map = g.stripe(stripe);
        let located = g.locate(map.array_sector + 1).unwrap();
        assert_eq!(located.place, map.data[0].copies[0]);
        assert!(!g.bitmap_sectors(stripe).is_empty());
    }
    assert_eq!(g.stripe_at_resync_position(0), 0);
    assert_eq!(
        g.resync_position_sectors(g.stripe_count()),
        2 * d.devslice_sectors()
    );
}

#[test]
fn geometry_refuses_bad_draid_layouts_and_counts() {
    use crate::geometry::{draid_layout, Geometry, Level};
    let unknown = Geometry::new(&geometry_params(draid_layout(8, 2) | 1 << 16, 14));
    assert!(matches!(unknown, Err(GeometryError::UnknownLayout { .. })));
    let few = Geometry::new(&geometry_params(draid_layout(1, 0), 2));
    assert!(matches!(
        few,
        Err(GeometryError::TooFewDisks { min: 3, .. })
    ));
    let wide = Geometry::new(&geometry_params(draid_layout(11, 2), 14));
    assert!(matches!(wide, Err(GeometryError::Invalid(_))));
    assert!(Geometry::new(&geometry_params(draid_layout(1, 0), 3)).is_ok());
    assert_eq!(Level::Draid1.min_raid_disks(), 2);
    assert_eq!(Level::Draid3.parity_members(), 3);
}

/// dRAID's level numbers belong to uraid's own superblock: an md
/// superblock carrying one is not read as dRAID.
#[test]
fn draid_levels_are_not_md_levels() {
    use crate::geometry::{level_from_name, level_name, Level};
    for level in [Level::Draid1, Level::Draid2, Level::Draid3] {
        assert!(level.md_number() < -100);
        assert_eq!(Level::from_md_number(level.md_number()), None);
        assert_eq!(Level::from_number(level.md_number()), Some(level));
        assert_eq!(level_from_name(level_name(level)), Some(level));
    }
    assert_eq!(Level::from_md_number(6), Some(Level::Raid6));
}

/// Consecutive stripes of a band lie in different slices, whose spare
/// columns are on different children: a rebuild's batch writes to many.
#[test]
fn consecutive_stripes_take_the_slices_of_a_band_in_turn() {
    let g = small(2, 8, 24, 1, 30);
    let children = 24u64;
    let per_slice = g.stripe_count() / g.slices();
    let slices: Vec<u64> = (0..children)
        .map(|s| g.slice_of(g.stripe(s).p.unwrap().member_sector))
        .collect();
    assert_eq!(slices, (0..children).collect::<Vec<_>>());
    let spare_children: std::collections::BTreeSet<usize> = (0..children)
        .map(|s| g.spare_child(0, g.stripe(s).p.unwrap().member_sector))
        .collect();
    assert_eq!(
        spare_children.len(),
        24,
        "every child holds one slice's spare column"
    );
    // The last band is short (30 slices = 24 + 6): its stripes take its 6
    // slices in turn.
    let last = g.stripe_count() - 6 * per_slice;
    let tail: Vec<u64> = (last..last + 6)
        .map(|s| g.slice_of(g.stripe(s).p.unwrap().member_sector))
        .collect();
    assert_eq!(tail, (24..30).collect::<Vec<_>>());
}
