//! `uraid tune` on tiny scratch arrays with short runs and a small budget:
//! the JSON's shape, that the choice is the best point measured or the
//! defaults, the chart, `--apply` on a served array saving the pick (a new
//! `serve` starts with it; detail shows it came from the tuner), and the
//! refusals. Never speed.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// `uraid tune` on 8 MiB members in `dir`, runs of 50 ms without warm-up.
fn tune_tiny(dir: &Path, workloads: &str, budget: &str) -> Command {
    let mut command = uraid();
    command
        .args(["tune", "--dir"])
        .arg(dir)
        .args(["--size", "8M", "--workload", workloads, "--budget", budget])
        .args([
            "--seconds",
            "0.05",
            "--warmup",
            "0",
            "--confirm-rounds",
            "2",
        ]);
    command
}

fn succeeded(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).to_string(), stderr)
}

fn value(v: &serde_json::Value) -> f64 {
    v.as_f64().expect("a number")
}

/// Checks one workload's entry and returns its chosen knobs.
fn check_workload(w: &serde_json::Value) -> serde_json::Value {
    let name = w["workload"].as_str().unwrap();
    let metric = w["metric"].as_str().unwrap();
    assert!(metric == "IOPS" || metric == "MB/s", "{name}: {metric}");
    let points = w["points"].as_array().unwrap();
    assert!(!points.is_empty(), "{name}");
    for p in points {
        assert!(p["knobs"].is_object() && value(&p["value"]) >= 0.0, "{p}");
    }
    for key in ["default", "chosen"] {
        assert!(w[key]["knobs"].is_object(), "{name} {key}");
        value(&w[key]["value"]);
    }
    // The defaults are the first point, measured whatever the budget.
    assert_eq!(points[0]["knobs"], w["default"]["knobs"], "{name}");
    assert_eq!(value(&points[0]["value"]), value(&w["default"]["value"]));
    let chosen = &w["chosen"];
    let confirmed = w["confirmation"]["confirmed"].as_bool().unwrap();
    if confirmed {
        // The best point measured more than once that its latency allows
        // (a point measured once competes with none: it may have been lucky).
        let best = points
            .iter()
            .filter(|p| p["within_latency_guard"].as_bool().unwrap())
            .filter(|p| p["runs"].as_u64().unwrap() >= 2)
            .map(|p| value(&p["value"]))
            .fold(f64::MIN, f64::max);
        assert_eq!(value(&chosen["value"]), best, "{name}");
        assert!(points.iter().any(|p| p["knobs"] == chosen["knobs"]));
        assert_ne!(chosen["knobs"], w["default"]["knobs"]);
    } else {
        assert_eq!(
            chosen, &w["default"],
            "{name}: a dropped pick keeps the defaults"
        );
    }
    // Smarter than the grid: never more runs than it has points.
    assert!(w["evaluations"].as_u64().unwrap() <= w["grid_points"].as_u64().unwrap());
    chosen["knobs"].clone()
}

#[test]
fn the_report_has_each_workloads_points_defaults_and_choice() {
    let dir = scratch("tune-report");
    let json = dir.path().join("tune.json");
    let chart = dir.path().join("tune.svg");
    let (stdout, _) = succeeded(
        tune_tiny(dir.path(), "fio-randwrite,seq-1m", "8s")
            .args(["--level", "raid5", "--devices", "3", "--chunk", "64K"])
            .arg("--json")
            .arg(&json)
            .arg("--chart")
            .arg(&chart),
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let workloads = report["workloads"].as_array().unwrap();
    let names: Vec<&str> = workloads
        .iter()
        .map(|w| w["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fio-randwrite", "seq-1m"]);
    assert_eq!(workloads[0]["metric"], "IOPS");
    assert_eq!(workloads[1]["metric"], "MB/s");
    for w in workloads {
        check_workload(w);
    }
    // The knobs that matter: the stripe cache and its workers for parity
    // writes, read-ahead for sequential reads.
    let knobs = |i: usize| {
        workloads[i]["default"]["knobs"]
            .as_object()
            .unwrap()
            .clone()
    };
    assert!(
        knobs(0).contains_key("stripe_cache_size") && knobs(0).contains_key("group_thread_cnt")
    );
    assert!(knobs(1).contains_key("read_ahead") && !knobs(0).contains_key("read_ahead"));
    assert!(
        stdout.contains("fio-randwrite") && stdout.contains("seq-1m"),
        "{stdout}"
    );
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("<svg") && svg.contains("stripe_cache_size"));
    // Nothing of the scratch array is left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("uraid-bench-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_applied_pick_is_saved_with_the_array_and_shown_as_tuned() {
    let dir = scratch("tune-apply");
    let settings = dir.path().join("settings");
    std::fs::create_dir_all(&settings).unwrap();
    // SAFETY (edition 2021: safe call): the only test here that starts a
    // server, and it sets this before starting any.
    std::env::set_var("URAID_CONFIG_DIR", &settings);
    let members = create_array(
        dir.path(),
        "m",
        &["-l", "5", "-n", "3", "-c", "64K", "--assume-clean"],
        3,
        16 * MIB,
    );
    let members = paths(&members);
    let served = serve(dir.path(), &[], &members);
    let json = dir.path().join("tune.json");
    let (_, stderr) = succeeded(
        tune_tiny(dir.path(), "fio-randwrite", "6s")
            .arg("--apply")
            .arg("--control")
            .arg(&served.control)
            .arg("--json")
            .arg(&json),
    );
    assert!(stderr.contains("uraid: applied"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The scratch array took the served one's shape.
    assert_eq!(report["level"], "raid5");
    assert_eq!(report["devices"], 3);
    let chosen = check_workload(&report["workloads"][0]);
    served.stop();

    // A new server starts with the tuned values, and says where they came from.
    let served = serve(dir.path(), &[], &members);
    let out = uraid_ok(&[
        "detail",
        "--json",
        "--control",
        served.control.to_str().unwrap(),
    ]);
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tuned = &detail["tuned"];
    assert_eq!(tuned["workload"], "fio-randwrite", "{detail}");
    assert!(tuned["when_utc"].as_str().unwrap().ends_with("UTC"));
    for (k, v) in chosen.as_object().unwrap() {
        assert_eq!(&detail["tuning"][k], v, "{k} in force after a restart");
        assert!(tuned["knobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|kv| kv[0] == k.as_str() && &kv[1] == v));
    }
    let text = uraid_ok(&["detail", "--control", served.control.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("uraid tune for fio-randwrite"), "{text}");
    assert!(
        text.contains("stripe_cache_size") && text.contains("(tuned)"),
        "{text}"
    );

    // A knob set by hand is no longer the tuner's.
    uraid_ok(&[
        "manage",
        "--control",
        served.control.to_str().unwrap(),
        "--set",
        "stripe_cache_size=1000",
    ]);
    served.stop();
    let offline = detail_offline(&members);
    assert_eq!(offline["tuning"]["stripe_cache_size"], "1000");
    let still: Vec<String> = offline["tuned"]["knobs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|kv| kv[0].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !still.contains(&"stripe_cache_size".to_string()),
        "{offline}"
    );
}

#[test]
fn bad_input_is_refused_in_one_line_before_anything_runs() {
    let dir = scratch("tune-refusals");
    for (args, says) in [
        (
            vec!["--workload", "fio-randwrite", "--budget", "5x"],
            "--budget 5x",
        ),
        (vec!["--workload", "nope"], "unknown workload 'nope'"),
        (
            vec![
                "--workload",
                "fio-randwrite,seq-1m",
                "--apply",
                "--control",
                "/nonexistent.ctl",
            ],
            "one --workload",
        ),
        (
            vec!["--workload", "randread", "--members", "/nonexistent"],
            "--destroy-data",
        ),
        (
            vec![
                "--workload",
                "randread",
                "--apply",
                "--control",
                "/nonexistent.ctl",
            ],
            "cannot reach a running uraid serve",
        ),
    ] {
        let mut full = vec!["tune", "--dir", dir.path().to_str().unwrap()];
        full.extend(args.iter().copied());
        let stderr = uraid_refused(&full);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
