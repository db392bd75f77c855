//! Background jobs paced by the clients' latency (`rebuild_latency_target`,
//! engine/jobs/pace.rs): the mechanism, not its speed.

use super::tests::*;
use super::*;
use crate::engine::jobs::pace::Why;
use crate::geometry::Level;
use std::sync::atomic::AtomicBool;

fn pace_of(snapshot: &Snapshot) -> Option<PaceReport> {
    snapshot.sync.as_ref().and_then(|p| p.pace)
}

/// A check under clients whose reads take longer than the target backs
/// off to speed_limit_min and says why; when the clients stop it takes
/// speed_limit_max at once; with the target off it follows md's rule
/// again, and status shows no latency. The job's progress goes on all the
/// while, and a client's bytes stay right.
#[test]
fn a_job_paced_by_latency_backs_off_over_the_target_and_takes_the_limit_when_clients_stop() {
    let (array, wrappers) = faulty_array(Level::Raid1, 2, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    let image = hammer(&engine, 2, 20, 5);
    // Slow enough that the check is still running when looked at: 4 MiB
    // members at most 256 KiB/s.
    engine.set_speed_limits(Some(64), Some(256));
    engine.set_tunable("rebuild_latency_target", "1").unwrap();
    engine.set_tunable("read_ahead", "0").unwrap();
    for w in &wrappers {
        w.apply_str("latency:3ms").unwrap();
    }
    engine.start_scrub(false).unwrap();
    let clients_stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut buf = vec![0u8; 4096];
            let mut k = 0u64;
            while !clients_stop.load(Ordering::Relaxed) {
                let at = (k * 4096 * 7) % (image.len() as u64 - 4096);
                engine.read(at, &mut buf).unwrap();
                assert!(
                    buf == image[at as usize..at as usize + 4096],
                    "bytes at {at}"
                );
                k += 1;
            }
        });
        // Every client read takes 3 ms or more, over the 1 ms target.
        wait_until(&engine, "backed off to speed_limit_min", |s| {
            pace_of(s).is_some_and(|p| p.why == Why::SpeedLimitMin)
        });
        let pace = pace_of(&engine.snapshot()).unwrap();
        assert_eq!(pace.rate_kib_per_s, 64, "{pace:?}");
        assert_eq!(pace.target_us, Some(1000));
        assert!(pace.client_p99_us.unwrap() >= 3000, "{pace:?}");
        assert!(pace.why.words().contains("held at speed_limit_min"));
        clients_stop.store(true, Ordering::Relaxed);
    });
    wait_until(&engine, "the limit once the clients stop", |s| {
        pace_of(s).is_some_and(|p| p.why == Why::Idle && p.rate_kib_per_s == 256)
    });
    assert!(
        pace_of(&engine.snapshot()).unwrap().client_p99_us.is_none(),
        "no client, no latency"
    );
    // Off: md's rule, which shows no latency and no target.
    engine.set_tunable("rebuild_latency_target", "off").unwrap();
    wait_until(&engine, "md's rule again", |s| {
        pace_of(s).is_some_and(|p| p.target_us.is_none() && p.why != Why::Idle)
    });
    let done = engine.snapshot().sync.unwrap().done_kib;
    assert!(done > 0, "the check made progress");
    engine.stop_sync().unwrap();
    wait_idle(&engine);
    engine.shutdown().unwrap();
}

/// The knob reads milliseconds, fractions and `off`, refuses what is out
/// of range with one line, and prints back as given.
#[test]
fn the_latency_target_knob_parses_and_prints_back() {
    let (array, _wrappers) = faulty_array(Level::Raid1, 2, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    let shown = |engine: &Engine| {
        engine
            .tuning()
            .pairs()
            .into_iter()
            .find(|(k, _)| k == "rebuild_latency_target")
            .unwrap()
            .1
    };
    assert_eq!(shown(&engine), "off", "md's rule is the default");
    for (given, us, back) in [("2", 2000, "2"), ("0.5", 500, "0.5"), ("3ms", 3000, "3")] {
        engine.set_tunable("rebuild_latency_target", given).unwrap();
        assert_eq!(engine.tunables.rebuild_latency_target_us(), us);
        assert_eq!(shown(&engine), back);
    }
    for bad in ["-1", "0.01", "fast", "70000"] {
        let e = engine
            .set_tunable("rebuild_latency_target", bad)
            .unwrap_err();
        assert!(
            e.contains("rebuild_latency_target") && !e.contains('\n'),
            "{e}"
        );
        assert_eq!(
            engine.tunables.rebuild_latency_target_us(),
            3000,
            "unchanged"
        );
    }
    engine.set_tunable("rebuild_latency_target", "0").unwrap();
    assert_eq!(shown(&engine), "off");
    wait_idle(&engine);
    engine.shutdown().unwrap();
}

/// A job held back by a low speed_limit_max takes a raised one at its
/// next look, as md reads its limits at every step, not after sleeping
/// off what the old limit owed (at 1 KiB/s, hours for this check).
#[test]
fn a_raised_speed_limit_frees_a_job_that_sleeps_under_the_old_one() {
    let (array, _wrappers) = faulty_array(Level::Raid1, 2, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    engine.set_speed_limits(Some(1), Some(1));
    engine.start_scrub(false).unwrap();
    wait_until(&engine, "the check's first step", |s| {
        s.sync.as_ref().is_some_and(|p| p.done_kib > 0)
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    engine.set_speed_limits(Some(1000), Some(1_000_000));
    wait_until(&engine, "the check's end", |s| s.sync.is_none());
    engine.shutdown().unwrap();
}

/// A raid5 that loses a member is at zero redundancy until the rebuild
/// onto a spare ends: an event at each end, and the time in the snapshot.
/// A raid6 that loses one member is not; its second loss is.
#[test]
fn the_time_at_zero_redundancy_is_reported_from_the_failure_to_the_rebuild() {
    let (array, wrappers) = faulty_array(Level::Raid5, 4, 1);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    assert_eq!(engine.snapshot().zero_redundancy, None);
    // Slow enough that the exposure is seen while it lasts.
    for w in &wrappers {
        w.apply_str("latency:1ms").unwrap();
    }
    engine.fail_member(1, "failed by the test");
    let now = engine.snapshot();
    assert!(has_event(&now, "NoRedundancy"), "{:?}", now.events);
    wait_idle(&engine);
    let after = engine.snapshot();
    assert!(
        has_event(&after, "RedundancyRestored"),
        "{:?}",
        after.events
    );
    let z = after.zero_redundancy.unwrap();
    assert_eq!(z.now_secs, None, "whole again");
    assert!(z.total_secs > 0.0);
    engine.shutdown().unwrap();

    let (array, _wrappers) = faulty_array(Level::Raid6, 5, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    engine.fail_member(1, "failed by the test");
    assert_eq!(engine.snapshot().zero_redundancy, None, "one loss left");
    engine.fail_member(3, "failed by the test");
    let z = engine.snapshot().zero_redundancy.unwrap();
    assert!(z.now_secs.is_some());
    engine.shutdown().unwrap();
}

/// A check and a repair read their rows in batches: each member's reads
/// are a few large requests, not one per row, and a row the check finds
/// wrong is counted, and repaired, all the same.
#[test]
fn check_and_repair_read_their_rows_in_batches() {
    let (array, wrappers) = faulty_array(Level::Raid5, 4, 0);
    let engine = Engine::start(array, EngineOptions::default()).unwrap();
    wait_idle(&engine);
    let stripes = engine.sync.stripe_count();
    // The fault injector counts every read request, batched or not.
    let reads_of_m0 = || wrappers[0].counters().reads;
    // One strip of a row made wrong behind the engine's back.
    let map = engine.geometry().stripe(stripes / 2);
    let place = map.data[0].copies[0];
    let slot = engine.table().entry(place.member).unwrap().slot.clone();
    let at = slot.data_offset_bytes + place.member_sector * crate::units::SECTOR_BYTES;
    slot.member.write_at(&[0x5a; 4096], at).unwrap();
    for (repair, found) in [(false, 8), (true, 8), (false, 0)] {
        let before = reads_of_m0();
        engine.start_scrub(repair).unwrap();
        wait_idle(&engine);
        let ops = reads_of_m0() - before;
        assert!(
            ops * 8 < stripes,
            "{ops} reads of a member for {stripes} rows"
        );
        assert_eq!(engine.mismatch_sectors(), found, "repair {repair}");
    }
    engine.shutdown().unwrap();
}

/// A read error inside a check's batch: the batch ends, the row goes the
/// one-stripe way, which corrects it from redundancy (md rewrites a bad
/// sector a check meets), and the check goes on in batches to the end.
#[test]
fn a_read_error_in_a_checks_batch_is_corrected_and_the_check_goes_on() {
    let (engine, image) = raid5_with_a_bad_start_on_member_1(23, "");
    engine.start_scrub(false).unwrap();
    wait_idle(&engine);
    let s = engine.snapshot();
    assert!(s.missing_roles.is_empty(), "{:?}", s.events);
    assert!(
        engine
            .corrected_reads
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0,
        "{:?}",
        s.events
    );
    assert_eq!(engine.mismatch_sectors(), 0);
    assert!(has_event(&s, "RebuildFinished"), "{:?}", s.events);
    let mut back = vec![0u8; image.len()];
    engine.read(0, &mut back).unwrap();
    assert!(back == image);
    engine.shutdown().unwrap();
}
