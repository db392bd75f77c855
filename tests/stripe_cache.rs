//! The stripe cache and the seeds' knobs on a served array, through real
//! NBD clients (fio with its nbd engine, nbdsh, nbdcopy):
//! - write-through: sequential writes smaller than a row are gathered into
//!   whole rows (counted in `status --json`), fio's verification passes and
//!   parity is consistent afterwards;
//! - write-back: refused without --i-accept-data-loss; with it, writes are
//!   acknowledged from the cache, reads see them at once, a FLUSH puts them
//!   on the members (they survive a SIGKILL), and a clean stop leaves the
//!   members consistent;
//! - the knobs: set at create (saved), at serve, live with manage, shown
//!   by detail; bad values refused with one line, changing nothing.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Saved settings go to a folder of this test run, not /etc/uraid.
fn config_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("uraid-stripe-cache-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY (edition 2021: safe call): every test sets the same value
    // before it starts any child process.
    std::env::set_var("URAID_CONFIG_DIR", &dir);
    dir
}

const MIB: u64 = 1 << 20;

/// A raid6 of 6 members with 64K chunks: a row holds 256 KiB of data.
fn raid6(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut options = vec!["-l", "6", "-n", "6", "-c", "64K", "--assume-clean"];
    options.extend_from_slice(extra);
    create_array(dir, "m", &options, 6, 40 * MIB)
        .iter()
        .map(|p| p.to_str().unwrap().to_string())
        .collect()
}

fn fio(dir: &Path, uri: &str, args: &[&str]) {
    let fio = client_tool("fio", "fio");
    let out = run_limited(
        Command::new(fio)
            .current_dir(dir)
            .args(["--name=job", "--ioengine=nbd", "--direct=1"])
            .arg(format!("--uri={uri}"))
            .args(args),
        Duration::from_secs(300),
    );
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("verify: bad"),
        "fio {args:?} failed ({}):\n{text}",
        out.status
    );
}

fn cache_counters(served: &Served) -> serde_json::Value {
    let status = array_status(&served.control);
    status["stripe_cache"].clone()
}

#[test]
fn write_through_gathers_sequential_writes_into_whole_rows() {
    config_dir();
    let dir = scratch("cache-wt");
    let members = raid6(dir.path(), &[]);
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    let served = serve(dir.path(), &["--stripe-cache-size", "1024"], &m);
    // 16 KiB sequential writes, 32 in flight: 16 of them make a row.
    fio(
        dir.path(),
        served.uri(),
        &[
            "--rw=write",
            "--bs=16k",
            "--iodepth=32",
            "--size=24M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    let cache = cache_counters(&served);
    let full = cache["full_rows"].as_u64().unwrap();
    let gathered = cache["gathered_writes"].as_u64().unwrap();
    assert!(
        full > 0 && gathered >= 16,
        "sequential 16K writes were not gathered into whole rows: {cache}"
    );
    assert_eq!(
        cache["batches"], 0,
        "nothing may wait once fio is done: {cache}"
    );
    // One writer, 16K at a time: each strip of a row finds the parity of
    // its window hot from the strip before, and reads only its own data.
    fio(
        dir.path(),
        served.uri(),
        &[
            "--rw=write",
            "--bs=16k",
            "--iodepth=1",
            "--offset=24M",
            "--size=4M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    let cache = cache_counters(&served);
    assert!(
        cache["parity_hits"].as_u64().unwrap() > 0,
        "sequential 16K writes at queue depth 1 never found their parity hot: {cache}"
    );
    // Random writes are not delayed into batches of their own.
    fio(
        dir.path(),
        served.uri(),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=24M",
            "--io_size=4M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    // Read-ahead and the read cache serve sequential reads from memory and
    // stay coherent with writes mixed in.
    manage_ok(
        &served.control,
        &["--read-cache", "on", "--read-ahead", "1024"],
    );
    fio(
        dir.path(),
        served.uri(),
        &[
            "--rw=randrw",
            "--bs=16k",
            "--iodepth=8",
            "--size=24M",
            "--io_size=8M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    fio(
        dir.path(),
        served.uri(),
        &["--rw=read", "--bs=16k", "--iodepth=4", "--size=24M"],
    );
    let cache = cache_counters(&served);
    assert!(
        cache["read_hits"].as_u64().unwrap() > 0,
        "sequential reads never hit the read-ahead: {cache}"
    );
    let image = nbdcopy_out(served.uri(), dir.path());
    served.stop();
    assert_redundancy_consistent(&m, 2, Some(&image), dir.path());
}

#[test]
fn write_back_needs_consent_acks_from_cache_and_flush_makes_it_durable() {
    config_dir();
    let dir = scratch("cache-wb");
    let members = raid6(dir.path(), &[]);
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    let before = examine_states(&m);

    // Refused without consent, and nothing written.
    match try_serve(dir.path(), &["--write-policy", "write-back"], &m) {
        Ok(served) => {
            served.stop();
            panic!("write-back was accepted without --i-accept-data-loss");
        }
        Err((status, stderr)) => {
            assert!(!status.success());
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            assert!(
                lines.len() == 1 && lines[0].contains("--i-accept-data-loss"),
                "{stderr}"
            );
        }
    }
    assert_eq!(
        examine_states(&m),
        before,
        "a refused serve changed the members"
    );

    let wb = ["--write-policy", "write-back", "--i-accept-data-loss"];
    let served = serve(dir.path(), &wb, &m);
    // Reads verify what was written while much of it may still be in the
    // cache: they must see it.
    for (rw, bs) in [("write", "16k"), ("randwrite", "4k")] {
        fio(
            dir.path(),
            served.uri(),
            &[
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                "--iodepth=16",
                "--size=16M",
                "--io_size=8M",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
            ],
        );
    }
    let detail = served.detail_json();
    assert_eq!(detail["tuning"]["write_policy"], "write-back", "{detail}");

    // A partial row, flushed, then a crash: the flushed bytes are on the
    // members.
    let flushed = random_bytes(0xcac4e, 48 * 1024);
    let at = 3 * 256 * 1024 + 8192;
    let hex: String = flushed.iter().map(|b| format!("{b:02x}")).collect();
    nbdsh_script(
        served.uri(),
        &format!(
            "h = nbd.NBD()\nh.connect_uri(URI)\nh.pwrite(bytes.fromhex({hex:?}), {at})\nh.flush()\n"
        ),
        Duration::from_secs(60),
    );
    served.kill();
    let served = serve(dir.path(), &[], &m);
    assert!(wait_until_in_sync(&served, Duration::from_secs(120)));
    let image = nbdcopy_out(served.uri(), dir.path());
    assert_same_bytes(
        &image[at as usize..at as usize + flushed.len()],
        &flushed,
        "flushed write-back data after SIGKILL",
    );
    served.stop();

    // A clean stop writes everything out: the members alone hold the data.
    let served = serve(dir.path(), &wb, &m);
    fio(
        dir.path(),
        served.uri(),
        &[
            "--rw=randwrite",
            "--bs=8k",
            "--iodepth=8",
            "--size=16M",
            "--io_size=2M",
        ],
    );
    let image = nbdcopy_out(served.uri(), dir.path());
    served.stop();
    assert_redundancy_consistent(&m, 2, Some(&image), dir.path());
}

#[test]
fn knobs_are_saved_set_live_shown_and_checked() {
    let config = config_dir();
    let dir = scratch("cache-knobs");
    let members = raid6(
        dir.path(),
        &["--stripe-cache-size", "2048", "--rmw-level", "2"],
    );
    let m: Vec<&str> = members.iter().map(String::as_str).collect();
    assert!(
        std::fs::read_dir(&config).unwrap().count() > 0,
        "create saved no settings in {}",
        config.display()
    );
    // A bad value at create is refused before anything is written.
    let other = sparse_files(dir.path(), "x", &[40 * MIB; 4]);
    let mut args = vec!["create", "-l", "5", "-n", "4", "--stripe-cache-size", "16"];
    args.extend(paths(&other));
    let why = uraid_refused(&args);
    assert!(why.contains("stripe_cache_size"), "{why}");
    assert!(
        std::fs::read(&other[0]).unwrap().iter().all(|b| *b == 0),
        "a refused create wrote to a member"
    );

    let served = serve(dir.path(), &["--read-ahead", "512"], &m);
    let tuning = &served.detail_json()["tuning"];
    assert_eq!(
        tuning["stripe_cache_size"], "2048",
        "saved at create: {tuning}"
    );
    assert_eq!(tuning["rmw_level"], "2", "saved at create: {tuning}");
    assert_eq!(tuning["read_ahead"], "512", "given to serve: {tuning}");
    assert_eq!(tuning["write_policy"], "write-through");

    manage_ok(
        &served.control,
        &["--stripe-cache-size", "8192", "--set", "fast_path=off"],
    );
    for bad in [
        vec!["--stripe-cache-size", "40000"],
        vec!["--set", "colour=blue"],
        vec!["--set", "max_sectors_kb=6"],
        vec!["--write-policy", "write-back"],
        vec!["--rebuild-latency-target", "0.01"],
        vec!["--set", "rebuild_latency_target=soon"],
    ] {
        manage_refused(&served.control, &bad);
    }
    // The latency target for background jobs: md's rule by default, set by
    // its own flag or as a knob, shown in ms.
    assert_eq!(
        served.detail_json()["tuning"]["rebuild_latency_target"],
        "off"
    );
    manage_ok(&served.control, &["--set", "rebuild_latency_target=0.5"]);
    assert_eq!(
        served.detail_json()["tuning"]["rebuild_latency_target"],
        "0.5"
    );
    manage_ok(&served.control, &["--rebuild-latency-target", "4"]);
    let detail = served.detail_json();
    assert_eq!(detail["tuning"]["stripe_cache_size"], "8192", "{detail}");
    assert_eq!(detail["tuning"]["fast_path"], "off", "{detail}");
    assert_eq!(
        detail["tuning"]["write_policy"], "write-through",
        "{detail}"
    );
    let detail_text = String::from_utf8_lossy(
        &uraid_ok(&["detail", "--control", served.control.to_str().unwrap()]).stdout,
    )
    .to_string();
    assert!(
        detail_text.contains("stripe_cache_size : 8192"),
        "detail does not show the knobs:\n{detail_text}"
    );
    // And the parity code the server computes with, and why that one.
    let parity = detail["parity"].as_str().expect("parity shown");
    assert!(parity.contains("URAID_PARITY"), "{parity}");
    assert!(
        detail_text.contains(&format!("parity : {parity}")),
        "{detail_text}"
    );
    // read_ahead fetches at most half the stripe cache's memory: at 17
    // entries of 4 data strips that is 17 x 4 KiB x 4 / 2 = 272 sectors,
    // and detail shows that value in force beside the 512 set.
    manage_ok(&served.control, &["--stripe-cache-size", "17"]);
    let read_ahead = served.detail_json()["tuning"]["read_ahead"].clone();
    assert_eq!(
        read_ahead, "272 (set 512; at most half the stripe cache)",
        "{read_ahead}"
    );
    manage_ok(&served.control, &["--stripe-cache-size", "8192"]);
    assert_eq!(served.detail_json()["tuning"]["read_ahead"], "512");
    served.stop();
    // Changes made live are saved with the array.
    let served = serve(dir.path(), &[], &m);
    assert_eq!(served.detail_json()["tuning"]["stripe_cache_size"], "8192");
    assert_eq!(
        served.detail_json()["tuning"]["rebuild_latency_target"],
        "4"
    );
    served.stop();
    // Offline, detail shows what a server would start with, and says so.
    let mut args = vec!["detail"];
    args.extend(m.iter().copied());
    let offline = String::from_utf8_lossy(&uraid_ok(&args).stdout).to_string();
    assert!(
        offline.contains("Tuning (uraid, saved; applied when served):")
            && offline.contains("stripe_cache_size : 8192")
            && offline.contains("fast_path : off"),
        "{offline}"
    );
    // A settings file that is not one leaves detail working, without knobs.
    // Only this array's: the other tests of this process share the folder.
    let mut json_args = args.clone();
    json_args.push("--json");
    let offline_json: serde_json::Value =
        serde_json::from_slice(&uraid_ok(&json_args).stdout).unwrap();
    let uuid = offline_json["uuid"].as_str().unwrap();
    std::fs::write(config.join(format!("{uuid}.json")), "not json").unwrap();
    let out = uraid_ok(&args);
    let offline = String::from_utf8_lossy(&out.stdout);
    assert!(!offline.contains("Tuning"), "{offline}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("saved settings not shown"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn write_back_consent_is_saved_and_a_refused_command_changes_nothing() {
    let config = config_dir();
    let dir = scratch("cache-consent");
    let members = raid6(dir.path(), &[]);
    let m: Vec<&str> = members.iter().map(String::as_str).collect();

    // A command refused for any of its settings grants nothing, not even
    // the permission to write back that it carried.
    let served = serve(dir.path(), &[], &m);
    let uuid = served.detail_json()["uuid"].as_str().unwrap().to_string();
    let path = config.join(format!("{uuid}.json"));
    let why = manage_refused(
        &served.control,
        &[
            "--write-policy",
            "write-back",
            "--i-accept-data-loss",
            "--set",
            "colour=blue",
        ],
    );
    assert!(why.contains("colour"), "{why}");
    manage_refused(&served.control, &["--write-policy", "write-back"]);
    // Consent given with other knobs only is consent to nothing.
    manage_ok(
        &served.control,
        &["--read-ahead", "256", "--i-accept-data-loss"],
    );
    manage_refused(&served.control, &["--write-policy", "write-back"]);
    // One knob given twice is refused, not left to the order of the flags.
    let why = manage_refused(
        &served.control,
        &[
            "--stripe-cache-size",
            "200",
            "--set",
            "stripe_cache_size=100",
        ],
    );
    assert!(why.contains("twice"), "{why}");
    assert_eq!(served.detail_json()["tuning"]["stripe_cache_size"], "256");
    served.stop();

    // Write-back set live on a server started with consent is saved with
    // that consent: the next plain serve starts with it.
    let served = serve(dir.path(), &["--i-accept-data-loss"], &m);
    manage_ok(&served.control, &["--write-policy", "write-back"]);
    served.stop();
    let served = serve(dir.path(), &[], &m);
    let detail = served.detail_json();
    assert_eq!(detail["tuning"]["write_policy"], "write-back", "{detail}");
    served.stop();

    // Saved write-back that nothing protects any more (edited here) does
    // not stop the array: it writes through and serve says so.
    let mut saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    saved["accept_data_loss"] = false.into();
    std::fs::write(&path, saved.to_string()).unwrap();
    let served = serve(dir.path(), &[], &m);
    let detail = served.detail_json();
    assert_eq!(
        detail["tuning"]["write_policy"], "write-through",
        "{detail}"
    );
    let said = served.stop();
    assert!(said.contains("writing through"), "{said}");
    // Consent given to this run brings it back.
    let served = serve(dir.path(), &["--i-accept-data-loss"], &m);
    assert_eq!(served.detail_json()["tuning"]["write_policy"], "write-back");
    served.stop();

    // On a read-only server a command with write_policy is refused whole:
    // the stripe cache size it also carried is not applied either.
    let served = serve(dir.path(), &["--read-only"], &m);
    let before = served.detail_json()["tuning"]["stripe_cache_size"].clone();
    manage_refused(
        &served.control,
        &[
            "--stripe-cache-size",
            "512",
            "--write-policy",
            "write-through",
        ],
    );
    assert_eq!(served.detail_json()["tuning"]["stripe_cache_size"], before);
    served.stop();

    // Offline, detail shows read-ahead as a server would cap it: at 17
    // entries of 4 data strips, half the cache is 272 sectors.
    std::fs::remove_file(&path).unwrap();
    let served = serve(dir.path(), &[], &m);
    manage_ok(
        &served.control,
        &["--stripe-cache-size", "17", "--read-ahead", "512"],
    );
    served.stop();
    let mut args = vec!["detail"];
    args.extend(m.iter().copied());
    let offline = String::from_utf8_lossy(&uraid_ok(&args).stdout).to_string();
    assert!(
        offline.contains("read_ahead : 272 (set 512; at most half the stripe cache)"),
        "{offline}"
    );
}
