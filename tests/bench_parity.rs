//! `uraid bench parity` runs end to end and prints well-formed JSON naming
//! every implementation. Speeds are measured, never asserted here.

use std::process::Command;

fn uraid(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_uraid"));
    command.args(args).env_remove("URAID_PARITY");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run uraid")
}

#[test]
fn json_names_every_implementation_in_every_cell() {
    let out = uraid(
        &[
            "bench",
            "parity",
            "--seconds",
            "0.01",
            "--json",
            "--data",
            "2",
            "4",
            "--chunk",
            "4K",
            "8K",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("well-formed JSON");
    let implementations: Vec<&str> = uraid::parity::implementations()
        .iter()
        .map(|i| i.name())
        .collect();
    let listed: Vec<&str> = report["implementations"]
        .as_array()
        .expect("implementations")
        .iter()
        .map(|v| v.as_str().expect("a name"))
        .collect();
    assert_eq!(listed, implementations);
    assert!(implementations.contains(&report["selected"].as_str().expect("selected")));
    assert!(report["unit"]
        .as_str()
        .expect("unit")
        .starts_with("GB/s of data bytes (10^9"));
    let isal_loaded = report["isal"]["loaded"].as_bool().expect("isal.loaded");
    let cells = report["cells"].as_array().expect("cells");
    let geometries: Vec<(u64, u64)> = cells
        .iter()
        .map(|c| {
            (
                c["data_members"].as_u64().unwrap(),
                c["chunk_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(geometries, [(2, 4096), (2, 8192), (4, 4096), (4, 8192)]);
    assert_eq!(
        report["lost_data_members_three"],
        serde_json::json!([0, 1, 2])
    );
    for cell in cells {
        assert!(cell["memcpy"]["median_gbps"].as_f64().expect("memcpy") > 0.0);
        // Two data members cannot lose three: that operation is null there
        // and has no ratios.
        if cell["data_members"] == 2 {
            assert!(cell["recover_three"].is_null(), "{cell}");
            assert!(cell["best_vs_isal"].get("recover_three").is_none());
            assert!(cell["judged_vs_isal"].get("recover_three").is_none());
        }
        for op in operations(cell) {
            let results = cell[op].as_object().expect(op);
            for name in &implementations {
                let speed = &results[*name];
                assert!(
                    speed["median_gbps"].as_f64().expect("median") > 0.0,
                    "{op} {name}"
                );
                assert!(
                    speed["best_gbps"].as_f64().expect("best")
                        >= speed["median_gbps"].as_f64().unwrap()
                );
            }
            assert_eq!(results.contains_key("isa-l"), isal_loaded, "{op}");
            assert_eq!(
                results.len(),
                implementations.len() + usize::from(isal_loaded)
            );
            // Our best over ISA-L's, from the same medians.
            let best = &cell["best_vs_isal"][op];
            if isal_loaded {
                let name = best["implementation"].as_str().expect("best's name");
                let gbps = |n: &str| results[n]["median_gbps"].as_f64().unwrap();
                let fastest = implementations.iter().map(|n| gbps(n)).fold(0.0, f64::max);
                assert_eq!(gbps(name), fastest, "{op}: {name} is the fastest");
                let ratio = best["ratio"].as_f64().expect("ratio");
                assert!((ratio - fastest / gbps("isa-l")).abs() < 0.01, "{op}");
            } else {
                assert!(best.is_null(), "{op}: no ratio without ISA-L");
            }
        }
    }
    // The target judges the implementation the engine runs, and its
    // verdict lists exactly the ratios below 1.
    if isal_loaded {
        let selected = report["selected"].as_str().unwrap();
        for cell in cells {
            for op in operations(cell) {
                let judged = &cell["judged_vs_isal"][op];
                assert_eq!(judged["implementation"], selected, "{op}");
                let gbps = |n: &str| cell[op][n]["median_gbps"].as_f64().unwrap();
                let ratio = judged["ratio"].as_f64().unwrap();
                assert!((ratio - gbps(selected) / gbps("isa-l")).abs() < 0.01);
            }
        }
        assert!(
            report["target"]["goal"]
                .as_str()
                .unwrap()
                .contains(selected),
            "{}",
            report["target"]
        );
        let missed = report["target"]["missed"].as_array().expect("missed");
        let below: usize = cells
            .iter()
            .flat_map(|c| {
                operations(c)
                    .into_iter()
                    .map(|op| c["judged_vs_isal"][op]["ratio"].as_f64().unwrap())
            })
            .filter(|r| *r < 1.0)
            .count();
        assert_eq!(missed.len(), below);
    } else {
        assert!(report["target"].is_null());
    }
}

/// The operations a cell of the JSON report has: all four, except
/// three-member recovery with fewer than three data members.
fn operations(cell: &serde_json::Value) -> Vec<&'static str> {
    let mut ops = vec!["gen_pq", "recover_two", "gen_pqr"];
    if cell["data_members"].as_u64().expect("data_members") >= 3 {
        ops.push("recover_three");
    }
    ops
}

/// A one-cell run, as short as a measurement can be.
const ONE_CELL: [&str; 8] = [
    "bench",
    "parity",
    "--seconds",
    "0.01",
    "--data",
    "3",
    "--chunk",
    "4K",
];

#[test]
fn table_has_a_row_per_geometry_and_operation() {
    let out = uraid(&[&ONE_CELL[..], &["--impl", "scalar"]].concat(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("Parity speed in GB/s of data bytes"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("3 x 4K") && l.contains("gen P+Q")),
        "{text}"
    );
    for op in ["recover 2", "gen P+Q+R", "recover 3"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("3 x 4K") && l.contains(op)),
            "{op}: {text}"
        );
    }
}

#[test]
fn bad_names_and_sizes_are_refused_in_one_line() {
    for (args, env, reason) in [
        (
            vec!["bench", "parity", "--impl", "nonesuch"],
            vec![],
            "'nonesuch' is unknown; available: scalar",
        ),
        (
            vec!["bench", "parity", "--chunk", "0"],
            vec![],
            "multiple of 4K",
        ),
        (vec!["bench", "parity", "--data", "1"], vec![], "--data 1"),
        (
            vec!["bench", "parity", "--seconds", "0"],
            vec![],
            "--seconds",
        ),
        (
            vec!["bench", "parity", "--data", "3"],
            vec![("URAID_PARITY", "bogus")],
            "URAID_PARITY: parity implementation 'bogus'",
        ),
    ] {
        let out = uraid(&args, &env);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("uraid: ") && stderr.contains(reason),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn uraid_parity_forces_the_implementation() {
    let out = uraid(
        &[
            "bench",
            "parity",
            "--seconds",
            "0.01",
            "--json",
            "--data",
            "3",
            "--chunk",
            "4K",
            "--impl",
            "scalar",
        ],
        &[("URAID_PARITY", "scalar")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["selected"], "scalar");
}

/// The verdict is about the implementation uraid runs: with it forced to
/// scalar and only another one measured, there is nothing to judge, and
/// the report says so rather than judge the other.
#[test]
fn without_the_implementation_uraid_runs_the_target_is_not_judged() {
    let Some(other) = uraid::parity::implementations()
        .iter()
        .map(|i| i.name())
        .find(|n| *n != "scalar")
    else {
        eprintln!("this CPU runs no SIMD implementation: nothing to leave out");
        return;
    };
    let args = [&ONE_CELL[..], &["--impl", other]].concat();
    let forced = [("URAID_PARITY", "scalar")];
    let json = uraid(&[&args[..], &["--json"]].concat(), &forced);
    assert!(json.status.success());
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["selected"], "scalar");
    assert!(report["target"].is_null(), "{}", report["target"]);
    let text = String::from_utf8(uraid(&args, &forced).stdout).unwrap();
    if report["isal"]["loaded"] == true {
        assert!(text.contains("target not judged"), "{text}");
    }
    assert!(!text.contains("target met"), "{text}");
}
