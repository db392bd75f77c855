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

// Why the slice is the unit (docs/DRAID-FORMAT.md): today's layout beside
// finer candidates, cell by cell.

#[path = "unit_study.rs"]
mod unit_study;

use unit_study::{CellLayout, Guarantees};

/// Sectors in a MiB.
const MIB_SECTORS: u64 = 2048;

/// The layouts the study of the unit measures, as (P, D, C, S).
const STUDIED: [(usize, usize, usize, usize); 4] =
    [(1, 4, 8, 1), (2, 8, 24, 1), (2, 8, 48, 2), (3, 8, 48, 2)];

fn studied(shape: (usize, usize, usize, usize)) -> DraidParams {
    let (parity, data, children, spares) = shape;
    params(parity, data, children, spares)
}

fn spec_name(p: &DraidParams) -> String {
    format!(
        "draid{}:{}d:{}c:{}s",
        p.parity, p.data, p.children, p.spares
    )
}

/// Version 1 on children of `dev_sectors`, or `None` where it refuses them.
fn version_1(p: &DraidParams, dev_sectors: u64) -> Option<Draid> {
    Draid::new(&DraidParams {
        dev_sectors,
        ..p.clone()
    })
    .ok()
}

fn slice_sectors(p: &DraidParams) -> u64 {
    unit_study::probe(p).devslice_sectors()
}

/// What a layout that keeps the format's guarantees shows: no group with
/// two columns on a child, no spare on a child of the same group, and at
/// most P columns of a group lost to P failures after a rebuild.
fn kept(p: &DraidParams) -> Guarantees {
    Guarantees {
        repeated: 0,
        spare_clashes: 0,
        worst_loss: p.parity,
    }
}

/// The cell model of version 1 is the geometry: every group column and
/// spare sits where `columns_at` and `spare_child` say, and a rebuild reads
/// and writes what `rebuild_load` says. The study's figures for version 1
/// are then the format's own.
#[test]
fn the_cell_model_is_the_geometry() {
    for g in shapes() {
        let p = DraidParams {
            dev_sectors: g.slices() * g.devslice_sectors(),
            ..params(g.parity(), g.data(), g.raid_disks(), g.spares())
        };
        let layout = CellLayout::slices(&g, &p);
        assert_eq!(layout.rows() as u64, g.slices() * g.rows_per_slice() as u64);
        for group in 0..layout.groups() {
            for (column, (row, pos)) in layout.places(group).enumerate() {
                let at = g.columns_at(layout.child(row, pos), row as u64 * ROW_SECTORS);
                let Holding::Column {
                    slice,
                    group: in_slice,
                    column: c,
                    ..
                } = at
                else {
                    panic!("group {group} column {column} on a spare cell");
                };
                let per_slice = g.groups_per_slice();
                assert_eq!(
                    (slice, in_slice, c),
                    ((group / per_slice) as u64, group % per_slice, column)
                );
            }
        }
        for row in 0..layout.rows() {
            for s in 0..g.spares() {
                let child = layout.child(row, g.raid_disks() - 1 - s);
                assert_eq!(child, g.spare_child(s, row as u64 * ROW_SECTORS));
            }
        }
        for (failed, load) in layout.rebuild_loads().iter().enumerate() {
            let rows: Vec<(u64, u64)> = load
                .iter()
                .map(|(r, w)| (r * ROW_SECTORS, w * ROW_SECTORS))
                .collect();
            assert_eq!(rows, g.rebuild_load(failed, 0..g.slices()));
        }
    }
}

/// Version 1 keeps every group within its parity after a rebuild onto a
/// distributed spare, over a whole band of slices, and trying every choice
/// of further failures agrees where that is cheap.
#[test]
fn version_1_groups_lose_at_most_p_columns_after_a_rebuild_onto_a_spare() {
    for (i, shape) in STUDIED.into_iter().enumerate() {
        let p = studied(shape);
        let dev_sectors = p.children as u64 * slice_sectors(&p);
        let g = version_1(&p, dev_sectors).unwrap();
        let layout = CellLayout::slices(&g, &p);
        assert_eq!(layout.guarantees(), kept(&p), "{}", spec_name(&p));
        if i < 2 {
            for failed in [0, p.children / 2, p.children - 1] {
                assert_eq!(layout.worst_loss_by_trial(failed, p.parity), p.parity);
            }
        }
    }
}

/// A last slice of whole groups, OpenZFS's rounding, is version 1 wherever
/// version 1 has slices, uses a child smaller than a slice that version 1
/// refuses, and keeps the guarantees in its partial slice.
#[test]
fn a_partial_last_slice_is_version_1_up_to_its_last_slice() {
    for shape in STUDIED {
        let p = studied(shape);
        let whole = 3 * slice_sectors(&p);
        let v1 = CellLayout::slices(&version_1(&p, whole).unwrap(), &p);
        let same = CellLayout::partial_slices(&p, whole);
        assert_eq!((same.cells(), same.groups()), (v1.cells(), v1.groups()));
        let odd = CellLayout::partial_slices(&p, whole + 63 * MIB_SECTORS);
        assert_eq!(&odd.cells()[..v1.cells().len()], v1.cells());
        assert!(odd.groups() > v1.groups());
        assert_eq!(odd.guarantees(), kept(&p));
        assert!(slice_sectors(&p) > 63 * MIB_SECTORS);
        assert!(version_1(&p, 63 * MIB_SECTORS).is_none());
        let small = CellLayout::partial_slices(&p, 63 * MIB_SECTORS);
        assert!(small.groups() > 0);
        assert_eq!(small.guarantees(), kept(&p));
    }
}

/// A permutation per row, or per row group shorter than a slice, breaks
/// the guarantees where a group wraps into a row drawn independently of
/// the row before; fitted to that row, or with no group crossing a row, it
/// keeps them.
#[test]
fn a_finer_unit_keeps_the_guarantees_only_where_groups_cross_it_safely() {
    for (i, shape) in STUDIED.into_iter().enumerate() {
        let p = studied(shape);
        let dev_sectors = 4 * slice_sectors(&p) + 5 * ROW_SECTORS;
        let naive = CellLayout::rows_naive(&p, dev_sectors);
        let found = naive.guarantees();
        // Spare clashes are the commoner break: a group's own columns meet
        // on a child only when the two rows' draws collide.
        assert!(found.spare_clashes > 0, "{found:?}");
        assert!(found.worst_loss > p.parity, "{found:?}");
        // A row group as tall as a slice is the slice: no group crosses
        // its boundaries and nothing is fitted.
        let slice_rows = unit_study::probe(&p).rows_per_slice();
        let as_slices = CellLayout::rows_fitted(&p, dev_sectors, slice_rows);
        let partial = CellLayout::partial_slices(&p, dev_sectors);
        assert_eq!(as_slices.cells(), partial.cells());
        let group_rows = slice_rows.div_ceil(2);
        let safe = [
            CellLayout::rows_fitted(&p, dev_sectors, 1),
            CellLayout::rows_fitted(&p, dev_sectors, group_rows),
            CellLayout::rows_whole(&p, dev_sectors),
        ];
        for layout in &safe {
            assert_eq!(layout.guarantees(), kept(&p), "{}", layout.name);
        }
        if i < 2 {
            let worst = |layout: &CellLayout| {
                (0..p.children)
                    .map(|failed| layout.worst_loss_by_trial(failed, p.parity))
                    .max()
                    .unwrap()
            };
            assert!(worst(&naive) > p.parity);
            assert_eq!(worst(&safe[0]), p.parity);
        }
    }
}

/// A row fitted after a wrap holds the same children, and only moves them
/// where the wrapping group or the spare children of the row before forbid
/// them: by one swap, or through a spare position when every child free to
/// start the row sits on one.
#[test]
fn fitting_a_row_moves_only_what_the_wrap_forbids() {
    let previous: Vec<u8> = (0..7).collect();
    // N = 5 of C = 7, W = 4, the group's head at positions 3 and 4: the
    // next row's first 2 positions may not hold 3, 4 (the head) nor 5, 6
    // (the spares), and its spare positions may not hold 3 or 4.
    let (ndisks, tail_start, width) = (5, 3, 4);
    let fits = |row: &[u8]| {
        row[..2].iter().all(|c| *c <= 2) && row[ndisks..].iter().all(|c| *c != 3 && *c != 4)
    };
    for next in [
        [0, 1, 2, 3, 4, 5, 6],
        [3, 5, 0, 1, 2, 4, 6],
        [3, 0, 4, 5, 6, 1, 2],
    ] {
        let mut fitted = next;
        unit_study::fit_after_wrap(&previous, &mut fitted, ndisks, tail_start, width);
        assert!(fits(&fitted), "{next:?} became {fitted:?}");
        let mut sorted = fitted;
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4, 5, 6]);
        if fits(&next) {
            assert_eq!(fitted, next);
        }
    }
}

/// Sizes of child the usable share is measured at: one smaller than every
/// studied slice, and a few that are whole slices of none.
const ODD_SIZES_SECTORS: [(&str, u64); 4] = [
    ("63 MiB", 63 * MIB_SECTORS),
    ("1000 MiB", 1000 * MIB_SECTORS),
    ("100 GB", 100_000_000_000 / 512),
    ("4 TB", 4_000_000_000_000 / 512),
];

/// The share of each child that version 1 (whole slices), whole groups
/// (a partial last slice, or any unit with wrapping groups) and rows with
/// no wrap use.
fn measure_usable_share(p: &DraidParams) {
    let (width, ndisks) = (p.data + p.parity, p.children - p.spares);
    for (label, dev_sectors) in ODD_SIZES_SECTORS {
        let v1 = version_1(p, dev_sectors)
            .map(|g| unit_study::usable_fraction(p, g.slices() as usize * g.ngroups, dev_sectors));
        let (_, groups) = unit_study::rows_and_groups(p, dev_sectors);
        let whole_groups = unit_study::usable_fraction(p, groups, dev_sectors);
        let rows = (dev_sectors / ROW_SECTORS) as usize;
        let no_wrap = unit_study::usable_fraction(p, rows * (ndisks / width), dev_sectors);
        // Whole groups leave less than one group's share of the N children
        // and the part of a row at the end: under W/N + 1 rows of each.
        let bound =
            1.0 - (width as f64 / ndisks as f64 + 1.0) * ROW_SECTORS as f64 / dev_sectors as f64;
        assert!(whole_groups > bound && whole_groups >= v1.unwrap_or(0.0));
        assert!(no_wrap <= whole_groups);
        let v1 = v1.map_or("refused".to_string(), |f| format!("{f:.4}"));
        eprintln!(
            "| {} | {label} | {v1} | {whole_groups:.4} | {no_wrap:.4} |",
            spec_name(p)
        );
    }
}

/// Worst single-failure rebuild balance, busiest survivor over the mean
/// (reads; reads and writes), for each unit on children of `slices`
/// version-1 slices.
fn measure_balance(p: &DraidParams, slices: u64) {
    let dev_sectors = slices * slice_sectors(p);
    let g = version_1(p, dev_sectors).unwrap();
    let group_rows = g.rows_per_slice().div_ceil(2);
    let layouts = [
        CellLayout::slices(&g, p),
        CellLayout::slices_rows_first(p, dev_sectors),
        CellLayout::rows_fitted(p, dev_sectors, group_rows),
        CellLayout::rows_fitted(p, dev_sectors, 1),
        CellLayout::rows_whole(p, dev_sectors),
    ];
    let figures: Vec<String> = layouts
        .iter()
        .map(|layout| {
            let b = layout.balance();
            assert!(b.reads >= 1.0 && b.total >= 1.0);
            format!("{:.3} ({:.3})", b.reads, b.total)
        })
        .collect();
    eprintln!("| {} | {slices} | {} |", spec_name(p), figures.join(" | "));
}

/// The guarantees of each unit on children of 48 slices and a few rows.
fn measure_guarantees(p: &DraidParams) {
    let dev_sectors = 48 * slice_sectors(p) + 5 * ROW_SECTORS;
    let group_rows = unit_study::probe(p).rows_per_slice().div_ceil(2);
    let layouts = [
        CellLayout::partial_slices(p, dev_sectors),
        CellLayout::rows_naive(p, dev_sectors),
        CellLayout::rows_fitted(p, dev_sectors, group_rows),
        CellLayout::rows_fitted(p, dev_sectors, 1),
        CellLayout::rows_whole(p, dev_sectors),
    ];
    for layout in &layouts {
        let found = layout.guarantees();
        assert_eq!(
            found == kept(p),
            layout.name != "row, naive",
            "{}",
            layout.name
        );
        eprintln!(
            "| {} | {} | {} | {} | {} | {} |",
            spec_name(p),
            layout.name,
            layout.groups(),
            found.repeated,
            found.spare_clashes,
            found.worst_loss
        );
    }
}

/// Version 1's balance on `slices` slices with the frozen map beside the
/// maps of 32 other seeds: how much of it the seed decides.
fn measure_seeds(p: &DraidParams, slices: u64) {
    let g = version_1(p, slices * slice_sectors(p)).unwrap();
    let frozen = CellLayout::slices(&g, p).balance().reads;
    let mut others: Vec<f64> = (0..32)
        .map(|i| super::table::seed_for(1000 + i))
        .map(|seed| {
            CellLayout::slices(&unit_study::with_seed(&g, seed), p)
                .balance()
                .reads
        })
        .collect();
    others.sort_by(f64::total_cmp);
    eprintln!(
        "| {} | {slices} | {frozen:.3} | {:.3} | {:.3} | {:.3} |",
        spec_name(p),
        others[0],
        others[16],
        others[31]
    );
}

/// The figures of "Why the slice is the unit" in docs/DRAID-FORMAT.md:
/// `cargo test --release --lib measure_the_unit -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement of some seconds; prints the tables of the format document"]
fn measure_the_unit() {
    eprintln!("| layout | child | slice (v1) | whole groups | row, no wrap |");
    for shape in STUDIED {
        measure_usable_share(&studied(shape));
    }
    eprintln!("| layout | slices | slice (v1) | slice, rows first | row group, fitted | row, fitted | row, no wrap |");
    for shape in STUDIED {
        for slices in [48, 480, 4800] {
            measure_balance(&studied(shape), slices);
        }
    }
    eprintln!("| layout | unit | groups | repeated | spare clashes | worst loss |");
    for shape in STUDIED {
        measure_guarantees(&studied(shape));
    }
    eprintln!("| layout | slices | frozen seed | best of 32 | median | worst |");
    for shape in STUDIED {
        for slices in [48, 480] {
            measure_seeds(&studied(shape), slices);
        }
    }
}

/// How often positions p and p + δ of a row (δ counted on through the end
/// of the row into the next, as groups wrap) hold columns of one group,
/// over the groups of `groups`, indexed [p][δ].
fn shared_by_distance(width: usize, ndisks: usize, groups: Range<usize>) -> Vec<Vec<usize>> {
    let mut shared = vec![vec![0; width]; ndisks];
    for group in groups {
        let start = group * width % ndisks;
        for first in 0..width {
            // Column `first` shares the group with the width - 1 - first
            // columns after it, at distances 1 up to that.
            let by_delta = &mut shared[(start + first) % ndisks];
            for count in &mut by_delta[1..width - first] {
                *count += 1;
            }
        }
    }
    shared
}

/// Inside a slice every position is placed alike in the groups: with
/// gcd(W, N) = 1, positions δ apart share a group W - δ times wherever
/// they are. One row of groups does not: some positions share a group
/// with their neighbour and others not. Rotating a slice over the children
/// then spreads that evenness over children, which a shorter unit has not
/// got to spread.
#[test]
fn a_slice_places_every_position_alike_in_its_groups() {
    for shape in STUDIED {
        let p = studied(shape);
        let (width, ndisks) = (p.data + p.parity, p.children - p.spares);
        if gcd(width, ndisks) != 1 {
            continue;
        }
        let g = unit_study::probe(&p);
        let slice = shared_by_distance(width, ndisks, 0..g.groups_per_slice());
        for (pos, by_delta) in slice.iter().enumerate() {
            for (delta, &n) in by_delta.iter().enumerate().skip(1) {
                assert_eq!(n, width - delta, "{} position {pos}", spec_name(&p));
            }
        }
        let first_row = shared_by_distance(width, ndisks, 0..g.first_group[1]);
        let neighbours: Vec<usize> = first_row.iter().map(|d| d[1]).collect();
        assert!(neighbours.contains(&0) && neighbours.contains(&1));
    }
}
