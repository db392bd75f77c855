use super::*;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn ata(realloc: u64, pending: u64, passed: bool, exit: u8) -> String {
    format!(
        r#"{{"json_format_version":[1,0],
            "smartctl":{{"version":[7,3],"exit_status":{exit}}},
            "device":{{"name":"/dev/sda","protocol":"ATA"}},
            "model_name":"Disk X","serial_number":"S1",
            "smart_status":{{"passed":{passed}}},
            "ata_smart_attributes":{{"table":[
              {{"id":5,"name":"Reallocated_Sector_Ct","value":100,"worst":100,"thresh":10,
                "when_failed":"","flags":{{"prefailure":true}},"raw":{{"value":{realloc},"string":"{realloc}"}}}},
              {{"id":197,"name":"Current_Pending_Sector","value":100,"worst":100,"thresh":0,
                "when_failed":"","flags":{{"prefailure":false}},"raw":{{"value":{pending},"string":"{pending}"}}}},
              {{"id":198,"name":"Offline_Uncorrectable","value":100,"worst":100,"thresh":0,
                "when_failed":"","flags":{{"prefailure":false}},"raw":{{"value":0,"string":"0"}}}}]}},
            "temperature":{{"current":34}}}}"#
    )
}

#[test]
fn healthy_ata_passes_with_its_figures() {
    let h = parse(ata(0, 0, true, 0).as_bytes(), Some(0));
    assert_eq!(h.status, Status::Passed, "{h:?}");
    assert_eq!(h.reallocated, Some(0));
    assert_eq!(h.pending, Some(0));
    assert_eq!(h.offline_uncorrectable, Some(0));
    assert_eq!(h.temperature, Some(34));
    assert_eq!(h.model.as_deref(), Some("Disk X"));
    assert!(h.summary().starts_with("passed, 34 C"), "{}", h.summary());
}

#[test]
fn growing_counts_predict_a_failure_and_standing_counts_warn() {
    let first = compare(None, parse(ata(0, 0, true, 0).as_bytes(), Some(0)));
    assert_eq!(first.status, Status::Passed);
    let grown = compare(Some(&first), parse(ata(8, 0, true, 0).as_bytes(), Some(0)));
    assert_eq!(grown.status, Status::Failing, "{grown:?}");
    assert!(grown.reasons[0].contains("reallocated sectors grew from 0 to 8"));
    let standing = compare(Some(&grown), parse(ata(8, 0, true, 0).as_bytes(), Some(0)));
    assert_eq!(standing.status, Status::Warning, "{standing:?}");
    let pending = compare(
        Some(&standing),
        parse(ata(8, 3, true, 0).as_bytes(), Some(0)),
    );
    assert_eq!(pending.status, Status::Failing);
}

#[test]
fn failed_verdict_and_exit_bits() {
    let h = parse(ata(0, 0, false, 8).as_bytes(), Some(8));
    assert_eq!(h.status, Status::Failing);
    assert!(h.exit_bits.iter().any(|b| b.contains("DISK FAILING")));
    let h = parse(ata(0, 0, true, 64).as_bytes(), Some(64));
    assert_eq!(h.status, Status::Warning, "{h:?}");
    assert!(h.reasons[0].contains("error log"));
    // Bit 2 alone: the figures cannot be trusted.
    let h = parse(ata(0, 0, true, 4).as_bytes(), Some(4));
    assert_eq!(h.status, Status::Unavailable, "{h:?}");
}

#[test]
fn open_failure_is_unavailable_with_smartctls_message() {
    let out = r#"{"json_format_version":[1,0],"smartctl":{"exit_status":2,
        "messages":[{"string":"/dev/sdz: No such device","severity":"error"}]}}"#;
    let h = parse(out.as_bytes(), Some(2));
    assert_eq!(h.status, Status::Unavailable);
    assert!(h.reasons[0].contains("No such device"), "{:?}", h.reasons);
    assert!(h.reasons[0].contains("open or IDENTIFY"), "{:?}", h.reasons);
}

#[test]
fn junk_is_unavailable() {
    assert_eq!(parse(b"garbage", Some(0)).status, Status::Unavailable);
    assert_eq!(parse(b"", None).status, Status::Unavailable);
    let h = parse(br#"{"foo":1}"#, Some(0));
    assert_eq!(h.status, Status::Unavailable);
    assert!(h.reasons[0].contains("not smartctl's JSON"));
    // An envelope and no verdict: nothing to judge by.
    let h = parse(
        br#"{"json_format_version":[1,0],"smartctl":{"exit_status":0}}"#,
        Some(0),
    );
    assert_eq!(h.status, Status::Unavailable);
    // Unavailable is never compared into a failure.
    let before = parse(ata(0, 0, true, 0).as_bytes(), Some(0));
    assert_eq!(
        compare(Some(&before), parse(b"x", None)).status,
        Status::Unavailable
    );
}

#[test]
fn nvme_warnings() {
    let nvme = |cw: u64, used: u64, spare: u64| {
        format!(
            r#"{{"json_format_version":[1,0],"smartctl":{{"exit_status":0}},
            "smart_status":{{"passed":{}}},
            "nvme_smart_health_information_log":{{"critical_warning":{cw},"temperature":40,
              "available_spare":{spare},"available_spare_threshold":10,
              "percentage_used":{used},"media_errors":0}}}}"#,
            cw == 0
        )
    };
    let h = parse(nvme(0, 3, 100).as_bytes(), Some(0));
    assert_eq!(h.status, Status::Passed, "{h:?}");
    assert_eq!(h.temperature, Some(40));
    let h = parse(nvme(0b101, 3, 100).as_bytes(), Some(0));
    assert_eq!(h.status, Status::Failing);
    assert_eq!(
        h.critical_warnings,
        vec!["available spare below threshold", "reliability degraded"]
    );
    assert_eq!(
        parse(nvme(0, 100, 100).as_bytes(), Some(0)).status,
        Status::Failing
    );
    assert_eq!(
        parse(nvme(0, 3, 5).as_bytes(), Some(0)).status,
        Status::Failing
    );
}

#[test]
fn runner_reports_missing_and_hanging_programs() {
    let stop = AtomicBool::new(false);
    let missing = run_smartctl(
        &"/nonexistent/smartctl".into(),
        "/dev/x",
        SMARTCTL_TIMEOUT,
        &stop,
    )
    .unwrap_err();
    assert!(missing.contains("not found"), "{missing}");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hang");
    std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hung = run_smartctl(
        &script.clone().into(),
        "/dev/x",
        Duration::from_millis(300),
        &stop,
    )
    .unwrap_err();
    assert!(hung.contains("did not answer"), "{hung}");
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").unwrap();
    let refused = run_smartctl(&plain.into(), "/dev/x", SMARTCTL_TIMEOUT, &stop).unwrap_err();
    assert!(refused.contains("not executable"), "{refused}");
}
