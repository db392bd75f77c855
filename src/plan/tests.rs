use super::*;

fn hdd16(devices: u32) -> Members {
    let model = DeviceModel::by_name("hdd-16t").unwrap();
    Members::of_model(devices, &model, None).unwrap()
}

fn defaults() -> Assumptions {
    Assumptions::new(
        1.0,
        DEFAULT_IMBALANCE,
        DEFAULT_AFR,
        DEFAULT_URE_PER_BIT,
        DEFAULT_CHUNK_BYTES,
    )
}

fn hours(seconds: f64) -> f64 {
    seconds / 3600.0
}

/// The published 90 × 16 TB figures: a traditional spare took about 29 h
/// and draid1:8d about 7.2 h under ZFS. This model predicts a streaming
/// engine, so it must come in below both, in the same ratio as the ideal.
#[test]
fn the_published_90_disk_case() {
    let members = hdd16(90);
    let a = defaults();
    let raid6 = plan(Scheme::Raid6, &members, &a);
    let draid = plan(Scheme::parse("draid1:8d:1s", 90).unwrap(), &members, &a);
    // 16 TB at the mean of 265 and 145 MB/s.
    assert!(
        (hours(raid6.rebuild_seconds) - 21.68).abs() < 0.01,
        "{raid6:?}"
    );
    assert!(hours(raid6.rebuild_seconds) < 29.0);
    assert_eq!(raid6.rebalance_seconds, 0.0);
    // 9/89 of a pass, times the imbalance.
    let expected = 21.68 * 9.0 / 89.0 * 1.06;
    assert!(
        (hours(draid.rebuild_seconds) - expected).abs() < 0.01,
        "{draid:?}"
    );
    assert!(hours(draid.rebuild_seconds) < 7.2);
    assert_eq!(draid.rebuild_target, "distributed spare");
    assert_eq!(draid.rebalance_seconds, raid6.rebuild_seconds);
    // A shorter window at the same tolerance of further failures is a
    // smaller chance of loss than raid5's; raid5 over 89 × 16 TB of reads
    // is all but certain to meet an unreadable sector.
    let raid5 = plan(Scheme::Raid5, &members, &a);
    assert!(raid5.p_data_loss > 0.99, "{raid5:?}");
    assert!(draid.p_data_loss < raid5.p_data_loss);
    assert!(raid6.p_data_loss < 1e-2, "{raid6:?}");
    // Capacity: 88 data members for raid6, about 89 · 8/9 for dRAID.
    assert_eq!(
        raid6.capacity_bytes,
        88 * (16_000_000_000_000 / (512 << 10)) * (512 << 10)
    );
    let approx = 89.0 * 16e12 * 8.0 / 9.0;
    assert!((draid.capacity_bytes as f64 / approx - 1.0).abs() < 1e-3);
}

#[test]
fn efficiency_scales_times_and_draid_without_spares_uses_a_hot_spare() {
    let members = Members::flat(12, 1_000_000_000_000, 100e6);
    let half = Assumptions {
        efficiency: 0.5,
        ..defaults()
    };
    let whole = plan(Scheme::Raid6, &members, &defaults());
    let slow = plan(Scheme::Raid6, &members, &half);
    assert!((whole.rebuild_seconds - 10_000.0).abs() < 1e-6);
    assert!((slow.rebuild_seconds - 20_000.0).abs() < 1e-6);
    let no_spare = plan(
        Scheme::parse("draid2:4d", 12).unwrap(),
        &members,
        &defaults(),
    );
    assert_eq!(no_spare.rebuild_target, "hot spare");
    assert_eq!(no_spare.rebuild_seconds, whole.rebuild_seconds);
    assert_eq!(no_spare.rebalance_seconds, 0.0);
    // raid10's rebuild reads one partner: only it is at risk.
    let raid10 = plan(Scheme::Raid10, &members, &defaults());
    let raid5 = plan(Scheme::Raid5, &members, &defaults());
    assert!((raid5.p_further_failures / raid10.p_further_failures - 11.0).abs() < 0.01);
    assert_eq!(raid10.read_bytes, 1e12);
}

#[test]
fn binomial_tails_add_up() {
    let p = 0.01;
    let total: f64 = (0..=89).map(|k| exactly(k, 89, p)).sum();
    assert!((total - 1.0).abs() < 1e-9);
    assert!((at_least(1, 89, p) - (1.0 - 0.99f64.powi(89))).abs() < 1e-12);
    assert_eq!(at_least(0, 5, p), 1.0);
    assert_eq!(at_least(6, 5, p), 0.0);
    assert!(at_least(2, 254, 0.3) > 0.99);
}

#[test]
fn comparisons_fit_the_member_count() {
    let names = |n| comparisons(n).iter().map(Scheme::name).collect::<Vec<_>>();
    assert_eq!(names(6), ["raid5", "raid6", "raid10", "draid1:4d:6c:1s"]);
    assert_eq!(names(90).len(), 9);
    assert_eq!(names(3), ["raid5"]);
    let plan = plan_all(
        Some(Scheme::Raid6),
        Members::flat(6, 1 << 40, 200e6),
        defaults(),
    );
    assert!(plan.layouts[0].requested && plan.layouts[0].level == "raid6");
    assert_eq!(
        plan.layouts.iter().filter(|l| l.level == "raid6").count(),
        1
    );
}

#[test]
fn bad_layouts_and_assumptions_are_refused_in_one_line() {
    for (text, n, why) in [
        ("raid7", 6, "unknown level"),
        ("raid6", 3, "at least 4"),
        ("draid2:8d:90c:1s", 12, "has 90 children"),
        ("draid2:8d:1s", 10, "do not fit"),
    ] {
        let err = Scheme::parse(text, n).unwrap_err();
        assert!(err.contains(why), "{text}: {err}");
        assert_eq!(err.lines().count(), 1);
    }
    for bad in [
        Assumptions {
            efficiency: 0.0,
            ..defaults()
        },
        Assumptions {
            efficiency: 1.5,
            ..defaults()
        },
        Assumptions {
            imbalance: 0.9,
            ..defaults()
        },
        Assumptions {
            afr: 1.0,
            ..defaults()
        },
        Assumptions {
            ure_per_bit: -1.0,
            ..defaults()
        },
        Assumptions {
            chunk_bytes: 3000,
            ..defaults()
        },
    ] {
        assert_eq!(bad.check().unwrap_err().lines().count(), 1);
    }
    let model = DeviceModel::by_name("hdd-4t").unwrap();
    assert!(Members::of_model(4, &model, Some(5_000_000_000_000)).is_err());
}

/// Members of few slices rotate the permutation maps too little to spread a
/// rebuild evenly: the plan takes the busiest survivor the maps give
/// (scripts/bench-draid's 48 slices of 8d+2p measured 48 s at 48 children,
/// where an even spread would take 30).
#[test]
fn few_slices_plan_with_the_maps_own_imbalance() {
    let spec = crate::geometry::DraidSpec::parse("draid2:8d:48c:1s", Some(48)).unwrap();
    let slices_48 = 7520u64 << 20;
    let imbalance = layout_imbalance(spec, slices_48, DEFAULT_CHUNK_BYTES).unwrap();
    assert!((1.3..1.45).contains(&imbalance), "{imbalance}");
    let members = Members::flat(48, slices_48, 50.0 * 1048576.0);
    let draid = plan(Scheme::Draid(spec), &members, &defaults());
    let even = 9.0 / 47.0 * members.pass_seconds;
    assert!(
        (draid.rebuild_seconds / even - imbalance).abs() < 1e-9,
        "{draid:?}"
    );
    // Members of many slices take the assumption, the maps' full rotation.
    assert_eq!(
        layout_imbalance(spec, 16_000_000_000_000, DEFAULT_CHUNK_BYTES),
        None
    );
}

/// After one failure a layout that tolerates one has no redundancy left
/// for the whole rebuild; one that tolerates two keeps one failure's.
#[test]
fn zero_redundancy_lasts_the_rebuild_only_where_one_failure_was_all_it_took() {
    let members = hdd16(12);
    let a = defaults();
    let raid5 = plan(Scheme::Raid5, &members, &a);
    assert_eq!(raid5.zero_redundancy_seconds, raid5.rebuild_seconds);
    let draid1 = plan(Scheme::parse("draid1:8d:1s", 12).unwrap(), &members, &a);
    assert_eq!(draid1.zero_redundancy_seconds, draid1.rebuild_seconds);
    let raid6 = plan(Scheme::Raid6, &members, &a);
    assert_eq!(raid6.zero_redundancy_seconds, 0.0);
    let draid2 = plan(Scheme::parse("draid2:8d:1s", 12).unwrap(), &members, &a);
    assert_eq!(draid2.zero_redundancy_seconds, 0.0);
}

/// When as many members fail as the layout tolerates, md's levels are at
/// zero redundancy for the whole first rebuild; a dRAID for the share of
/// the first child's rows that hold the others too (draid2:8d over 24
/// children: 9 of the 23 others share a group).
#[test]
fn zero_redundancy_at_the_tolerance_is_the_endangered_rows_share_of_a_draid_rebuild() {
    let members = hdd16(24);
    let a = defaults();
    let raid6 = plan(Scheme::Raid6, &members, &a);
    assert_eq!(
        raid6.zero_redundancy_at_tolerance_seconds,
        raid6.rebuild_seconds
    );
    let raid5 = plan(Scheme::Raid5, &members, &a);
    assert_eq!(
        raid5.zero_redundancy_at_tolerance_seconds,
        raid5.rebuild_seconds
    );
    let draid2 = plan(Scheme::parse("draid2:8d:24c:0s", 24).unwrap(), &members, &a);
    let share = draid2.zero_redundancy_at_tolerance_seconds / draid2.rebuild_seconds;
    assert!((share - 9.0 / 23.0).abs() < 1e-9, "{share}");
    let draid3 = plan(Scheme::parse("draid3:8d:24c:1s", 24).unwrap(), &members, &a);
    let share = draid3.zero_redundancy_at_tolerance_seconds / draid3.rebuild_seconds;
    assert!((share - 10.0 / 22.0 * 9.0 / 21.0).abs() < 1e-9, "{share}");
}
