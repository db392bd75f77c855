//! `uraid plan --json`: the fields a script reads, and the published
//! 90 × 16 TB case worked through (docs/PLANNING.md).

mod common;
use common::*;

fn plan_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let out = uraid_ok(&all);
    serde_json::from_slice(&out.stdout).expect("plan --json is JSON")
}

#[test]
fn plan_json_has_the_documented_fields() {
    let v = plan_json(&[
        "--level",
        "raid6",
        "--raid-devices",
        "12",
        "--member-size",
        "4TB",
        "--member-speed",
        "200MB/s",
        "--afr",
        "2%",
    ]);
    let layouts = v["layouts"].as_array().unwrap();
    assert_eq!(layouts[0]["level"], "raid6");
    assert_eq!(layouts[0]["requested"], true);
    for layout in layouts {
        for key in [
            "level",
            "rebuild_seconds",
            "rebalance_seconds",
            "reduced_redundancy_seconds",
            "zero_redundancy_seconds",
            "zero_redundancy_at_tolerance_seconds",
            "capacity_bytes",
            "failures_tolerated",
            "p_data_loss",
        ] {
            assert!(layout.get(key).is_some(), "{key} missing from {layout}");
        }
        let p = layout["p_data_loss"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p), "{layout}");
    }
    // 4 TB at 200 MB/s is 20000 s for a hot spare.
    assert!((layouts[0]["rebuild_seconds"].as_f64().unwrap() - 20_000.0).abs() < 1e-6);
    assert_eq!(
        layouts[0]["capacity_bytes"],
        10 * (4_000_000_000_000u64 >> 19 << 19)
    );
    let levels: Vec<&str> = layouts
        .iter()
        .map(|l| l["level"].as_str().unwrap())
        .collect();
    assert!(levels.contains(&"draid2:8d:12c:1s"), "{levels:?}");
    let a = &v["assumptions"];
    assert_eq!(a["afr"], 0.02);
    assert_eq!(a["efficiency"], 1.0);
    assert_eq!(a["ure_per_bit"], 1e-15);
    assert!(a["notes"].as_array().unwrap().len() >= 5);
    assert_eq!(v["members"]["member_bytes"], 4_000_000_000_000u64);
    // Without --level only the comparison is shown; a model brings its
    // own read error rate.
    let ssd = plan_json(&["--raid-devices", "6", "--device-model", "nvme"]);
    assert_eq!(ssd["assumptions"]["ure_per_bit"], 1e-17);
    let layouts = ssd["layouts"].as_array().unwrap();
    assert!(layouts.iter().all(|l| l["requested"] == false));
}

/// The published figures for 90 × 16 TB: ZFS took about 29 h onto a
/// traditional spare and about 7.2 h with draid1:8d. We predict our own
/// engine at full streaming efficiency, which is faster than both.
#[test]
fn the_published_90_disk_case_through_the_command() {
    let f1 = [
        "--device-model",
        "hdd-16t",
        "--raid-devices",
        "90",
        "--level",
        "draid1:8d:1s",
    ];
    let v = plan_json(&f1);
    let layouts = v["layouts"].as_array().unwrap();
    let hours = |level: &str| {
        layouts
            .iter()
            .find(|l| l["level"] == level)
            .map(|l| l["rebuild_seconds"].as_f64().unwrap() / 3600.0)
            .unwrap()
    };
    let draid = hours("draid1:8d:90c:1s");
    let raid6 = hours("raid6");
    assert!(draid > 2.0 && draid < 2.6, "{draid}");
    assert!(raid6 > 21.0 && raid6 < 22.5, "{raid6}");
    assert!(draid < 7.2 && raid6 < 29.0);
    assert_eq!(v["members"]["device_model"], "hdd-16t");
    // Halving the efficiency doubles every time.
    let half = plan_json(&[&f1[..], &["--efficiency", "0.5"]].concat());
    let slow = half["layouts"][0]["rebuild_seconds"].as_f64().unwrap() / 3600.0;
    assert!((slow / draid - 2.0).abs() < 1e-9);
}
