//! Fault-injecting and throttled members over real backends: memory and
//! image files. Each test keeps a model of what may be on the member (per
//! block, the set of writes it may hold) and checks every read against it, so
//! a fault that corrupts instead of failing, or a crash that leaves half a
//! block, is caught.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uraid::member::{
    injected_errno, BadRange, Crash, EioRate, Fault, FaultyMember, FileMember, Heal, Latency,
    Member, MemberRef, MemoryMember, Offline, OpenOptions, Ops, ThrottleLimits, ThrottledMember,
    Torn, WriteCache,
};

/// A block filled with one tag, so that any read block tells which write it
/// came from, and a block mixing two writes shows up as not uniform.
fn fill(tag: u64, len_bytes: usize) -> Vec<u8> {
    tag.to_le_bytes().repeat(len_bytes / 8)
}

/// The tag of a uniform block, or `None` if the block mixes writes.
fn block_tag(block: &[u8]) -> Option<u64> {
    let tag = u64::from_le_bytes(block[..8].try_into().unwrap());
    block
        .chunks_exact(8)
        .all(|word| word == tag.to_le_bytes())
        .then_some(tag)
}

fn tags(data: &[u8], block_bytes: usize) -> Vec<u64> {
    data.chunks_exact(block_bytes)
        .map(|block| block_tag(block).expect("a block mixes two writes"))
        .collect()
}

fn memory(size_bytes: u64, block_bytes: u32) -> Arc<MemoryMember> {
    Arc::new(MemoryMember::new("mem0", size_bytes, block_bytes))
}

/// An image file of `size_bytes` zeros, opened for writing.
fn image(size_bytes: u64) -> (tempfile::NamedTempFile, Arc<FileMember>) {
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().set_len(size_bytes).unwrap();
    let member = FileMember::open(file.path(), OpenOptions { write: true }).unwrap();
    (file, Arc::new(member))
}

fn errno(result: io::Result<()>) -> i32 {
    let err = result.expect_err("the I/O should have failed");
    injected_errno(&err).unwrap_or_else(|| panic!("not an injected error: {err}"))
}

fn read(member: &dyn Member, offset_bytes: u64, len_bytes: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len_bytes];
    member.read_at(&mut buf, offset_bytes).map(|()| buf)
}

#[test]
fn a_pulled_member_fails_everything_until_restored() {
    let faulty = FaultyMember::new(memory(64 << 10, 512));
    faulty.write_at(&fill(1, 4096), 0).unwrap();
    faulty.apply_str("pull").unwrap();
    let err = faulty.read_at(&mut [0u8; 512], 0).unwrap_err();
    assert_eq!(injected_errno(&err), Some(libc::ENODEV));
    let message = err.to_string();
    assert!(message.starts_with("mem0: No such device"), "{message}");
    assert!(message.contains("pulled"), "{message}");
    assert_eq!(errno(faulty.write_at(&[0u8; 512], 0)), libc::ENODEV);
    assert_eq!(errno(faulty.flush()), libc::ENODEV);
    assert_eq!(errno(faulty.discard(0, 512)), libc::ENODEV);
    assert_eq!(faulty.counters().pulled_errors, 4);
    assert!(faulty.describe().starts_with("pull; "));

    faulty.apply_str("restore").unwrap();
    assert_eq!(read(&faulty, 0, 4096).unwrap(), fill(1, 4096));
    // The refused read counts as a read.
    assert!(faulty
        .describe()
        .starts_with("healthy; 2 reads, 2 writes, 4 errors"));
}

#[test]
fn an_offline_member_comes_back_by_itself() {
    let faulty = FaultyMember::new(memory(64 << 10, 512));
    faulty.apply_str("offline:150ms").unwrap();
    let started = Instant::now();
    assert_eq!(errno(faulty.read_at(&mut [0u8; 512], 0)), libc::EIO);
    match faulty.faults().as_slice() {
        [Fault::Offline(Offline { ms: Some(ms) })] => assert!(*ms <= 150),
        other => panic!("{other:?}"),
    }
    while faulty.read_at(&mut [0u8; 512], 0).is_err() {
        assert!(started.elapsed() < Duration::from_secs(2));
        thread::sleep(Duration::from_millis(10));
    }
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(faulty.faults().is_empty());

    // Without a duration it stays away until restored.
    faulty.apply_str("offline").unwrap();
    thread::sleep(Duration::from_millis(30));
    assert_eq!(errno(faulty.write_at(&[0u8; 512], 0)), libc::EIO);
    faulty.restore();
    faulty.write_at(&[0u8; 512], 0).unwrap();
}

#[test]
fn bad_ranges_fail_the_operations_they_name() {
    let (_file, file_member) = image(1 << 20);
    let faulty = FaultyMember::new(file_member);
    faulty.write_at(&fill(1, 1 << 20), 0).unwrap();
    faulty.apply_str("eio:read:64K+4K").unwrap();
    faulty.apply_str("eio:write:128K+4K").unwrap();
    faulty.apply_str("eio:192K+4K").unwrap();
    faulty.apply_str("eio:read:256K+4K:noremap").unwrap();

    // Only I/O touching a range fails, however little it touches.
    assert_eq!(errno(faulty.read_at(&mut [0u8; 8192], 60 << 10)), libc::EIO);
    read(&faulty, 56 << 10, 8192).unwrap();
    read(&faulty, 68 << 10, 512).unwrap();
    // A write-bad range reads fine but refuses writes, and writes nothing.
    read(&faulty, 128 << 10, 4096).unwrap();
    assert_eq!(errno(faulty.write_at(&fill(2, 8192), 124 << 10)), libc::EIO);
    assert_eq!(read(&faulty, 124 << 10, 8192).unwrap(), fill(1, 8192));
    // A dead range refuses both.
    assert_eq!(errno(faulty.read_at(&mut [0u8; 512], 192 << 10)), libc::EIO);
    assert_eq!(errno(faulty.write_at(&[0u8; 512], 192 << 10)), libc::EIO);
    // A pending sector heals when written, as a drive remaps it...
    faulty.write_at(&fill(3, 4096), 64 << 10).unwrap();
    assert_eq!(read(&faulty, 64 << 10, 4096).unwrap(), fill(3, 4096));
    // ...unless remapping is off: the write lands but reads still fail.
    faulty.write_at(&fill(3, 4096), 256 << 10).unwrap();
    assert_eq!(errno(faulty.read_at(&mut [0u8; 512], 256 << 10)), libc::EIO);
    assert_eq!(faulty.counters().healed_bytes, 4096);
    assert_eq!(faulty.plan().bad_ranges.len(), 3);

    faulty.apply_str("heal:192K+2K").unwrap();
    read(&faulty, 192 << 10, 2048).unwrap();
    assert!(read(&faulty, 194 << 10, 512).is_err());
    faulty.apply_str("heal").unwrap();
    read(&faulty, 0, 1 << 20).unwrap();
    assert_eq!(faulty.counters().bad_range_errors, 6);
}

/// Which of `count` reads fail under a rate, as a string of `x` and `.`.
fn failure_pattern(faulty: &FaultyMember, count: usize) -> String {
    (0..count)
        .map(|_| match faulty.read_at(&mut [0u8; 512], 0) {
            Ok(()) => '.',
            Err(_) => 'x',
        })
        .collect()
}

#[test]
fn error_rates_replay_from_a_seed() {
    let run = |seed: u64, extra: &[&str]| {
        let faulty = FaultyMember::with_seed(memory(64 << 10, 512), seed);
        for text in extra {
            faulty.apply_str(text).unwrap();
        }
        faulty.apply_str("eio-rate:0.25:read").unwrap();
        failure_pattern(&faulty, 400)
    };
    let pattern = run(42, &[]);
    assert_eq!(pattern, run(42, &[]));
    assert_ne!(pattern, run(43, &[]));
    // Other random faults draw from their own streams.
    assert_eq!(pattern, run(42, &["latency:0ms:jitter=2us", "torn:keep=1"]));
    let failures = pattern.chars().filter(|&c| c == 'x').count();
    assert!((60..140).contains(&failures), "{failures} of 400");

    // A seed in the fault replays the same draws whatever the member's seed.
    let reseeded = |member_seed: u64| {
        let faulty = FaultyMember::with_seed(memory(64 << 10, 512), member_seed);
        faulty.apply_str("eio-rate:0.5:seed=7").unwrap();
        failure_pattern(&faulty, 200)
    };
    assert_eq!(reseeded(1), reseeded(2));

    // Writes are spared by a read-only rate.
    let faulty = FaultyMember::new(memory(64 << 10, 512));
    faulty.apply_str("eio-rate:1:read").unwrap();
    faulty.write_at(&[0u8; 512], 0).unwrap();
    assert_eq!(failure_pattern(&faulty, 3), "xxx");
}

#[test]
fn latency_applies_to_the_operations_named() {
    let faulty = FaultyMember::new(memory(64 << 10, 512));
    faulty.apply_str("latency:5ms:write").unwrap();
    let started = Instant::now();
    for _ in 0..10 {
        faulty.read_at(&mut [0u8; 512], 0).unwrap();
    }
    let reads = started.elapsed();
    let started = Instant::now();
    for _ in 0..10 {
        faulty.write_at(&[0u8; 512], 0).unwrap();
    }
    let writes = started.elapsed();
    assert!(writes >= Duration::from_millis(50), "{writes:?}");
    // The counters say exactly which I/Os waited; the clock only that reads
    // did not wait 5 ms each (with room for a loaded machine).
    let counters = faulty.counters();
    assert_eq!((counters.delayed_ios, counters.delay_us), (10, 50_000));
    assert!(reads < Duration::from_millis(45), "{reads:?}");

    faulty.apply_str("latency:1ms:jitter=2ms").unwrap();
    for _ in 0..10 {
        faulty.read_at(&mut [0u8; 512], 0).unwrap();
    }
    let counters = faulty.counters();
    assert_eq!(counters.delayed_ios, 20);
    assert!((60_000..=80_000).contains(&counters.delay_us));
}

#[test]
fn a_torn_write_keeps_a_prefix_of_whole_blocks() {
    // 4096-byte blocks: the prefix is counted in logical blocks, not sectors.
    let inner = memory(256 << 10, 4096);
    let faulty = FaultyMember::new(inner.clone());
    faulty.write_at(&fill(1, 32 << 10), 0).unwrap();
    faulty.apply_str("torn:keep=2").unwrap();
    let err = faulty.write_at(&fill(2, 32 << 10), 0).unwrap_err();
    assert_eq!(injected_errno(&err), Some(libc::EIO));
    assert!(
        err.to_string().contains("torn write: 2 of 8 blocks"),
        "{err}"
    );
    assert_eq!(
        tags(&inner.snapshot()[..32 << 10], 4096),
        [2, 2, 1, 1, 1, 1, 1, 1]
    );
    // One write only: the next goes through whole.
    faulty.write_at(&fill(3, 32 << 10), 0).unwrap();
    assert_eq!(tags(&inner.snapshot()[..32 << 10], 4096), [3; 8]);
    // A write no longer than the prefix lands whole and still fails: the
    // acknowledgement was lost.
    faulty.apply_str("torn:keep=2").unwrap();
    assert_eq!(errno(faulty.write_at(&fill(4, 4096), 0)), libc::EIO);
    assert_eq!(tags(&inner.snapshot()[..4096], 4096), [4]);
}

#[test]
fn random_torn_prefixes_replay_from_a_seed() {
    let run = |seed: u64| {
        let inner = memory(32 << 10, 512);
        let faulty = FaultyMember::with_seed(inner.clone(), seed);
        faulty.apply_str("torn:40").unwrap();
        let mut kept = Vec::new();
        for write in 1..=40u64 {
            let previous = tags(&inner.snapshot()[..4096], 512);
            assert_eq!(errno(faulty.write_at(&fill(write, 4096), 0)), libc::EIO);
            let now = tags(&inner.snapshot()[..4096], 512);
            // A prefix of the new write, then what was there before.
            let prefix = now.iter().take_while(|&&t| t == write).count();
            assert!(prefix < 8, "a random tear keeps less than the whole write");
            assert_eq!(now[prefix..], previous[prefix..]);
            kept.push(prefix);
        }
        faulty.write_at(&fill(99, 4096), 0).unwrap();
        assert_eq!(faulty.counters().torn_writes, 40);
        kept
    };
    let kept = run(5);
    assert_eq!(kept, run(5));
    assert_ne!(kept, run(6));
    assert!(kept.contains(&0) && kept.iter().any(|&k| k > 0));
}

#[test]
fn a_crash_loses_exactly_what_was_not_flushed() {
    let (file, file_member) = image(256 << 10);
    let faulty = FaultyMember::new(file_member);
    faulty.apply_str("write-cache").unwrap();
    faulty.write_at(&fill(1, 64 << 10), 0).unwrap();
    faulty.flush().unwrap();
    faulty.write_at(&fill(2, 16 << 10), 32 << 10).unwrap();
    faulty.write_at(&fill(3, 16 << 10), 128 << 10).unwrap();
    assert_eq!(faulty.unflushed_blocks(), 64);
    // Until the crash, reads see the cache.
    assert_eq!(read(&faulty, 32 << 10, 512).unwrap(), fill(2, 512));

    let report = faulty.crash().unwrap();
    assert_eq!((report.kept_blocks, report.lost_blocks), (0, 64));
    assert_eq!(read(&faulty, 0, 64 << 10).unwrap(), fill(1, 64 << 10));
    assert_eq!(
        read(&faulty, 128 << 10, 16 << 10).unwrap(),
        vec![0u8; 16 << 10]
    );
    drop(faulty);
    // The image itself holds the flushed data and nothing else.
    let reopened = FileMember::open(file.path(), OpenOptions::default()).unwrap();
    assert_eq!(read(&reopened, 0, 64 << 10).unwrap(), fill(1, 64 << 10));
    assert_eq!(
        read(&reopened, 128 << 10, 16 << 10).unwrap(),
        vec![0u8; 16 << 10]
    );
}

#[test]
fn a_pulled_drive_loses_its_cache() {
    let inner = memory(64 << 10, 512);
    let faulty = FaultyMember::new(inner.clone());
    faulty.apply_str("write-cache").unwrap();
    faulty.write_at(&fill(7, 4096), 0).unwrap();
    faulty.pull();
    faulty.restore();
    assert_eq!(faulty.unflushed_blocks(), 0);
    assert_eq!(read(&faulty, 0, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(faulty.counters().crash_lost_blocks, 8);
}

/// Writes the same sequence to a cached member, then crashes keeping half of
/// the unflushed blocks; returns the member's contents afterwards.
fn crash_keeping_half(seed: u64) -> Vec<u8> {
    let inner = memory(64 << 10, 512);
    let faulty = FaultyMember::with_seed(inner.clone(), seed);
    faulty.apply_str("write-cache").unwrap();
    faulty.write_at(&fill(1, 64 << 10), 0).unwrap();
    faulty.flush().unwrap();
    let mut workload = StdRng::seed_from_u64(77);
    let mut latest = vec![1u64; 128];
    for tag in 2..60u64 {
        let first = workload.gen_range(0..120);
        let blocks = workload.gen_range(1..=8);
        faulty
            .write_at(&fill(tag, blocks * 512), first as u64 * 512)
            .unwrap();
        latest[first..first + blocks].fill(tag);
    }
    let dirty = faulty.unflushed_blocks();
    let report = faulty.crash_keeping(0.5).unwrap();
    assert_eq!(report.kept_blocks + report.lost_blocks, dirty);
    assert!(report.kept_blocks > 0 && report.lost_blocks > 0);
    let after = tags(&inner.snapshot(), 512);
    // Each block is whole: the flushed copy or the latest unflushed one.
    for (block, &tag) in after.iter().enumerate() {
        assert!(tag == 1 || tag == latest[block], "block {block}: {tag}");
    }
    let changed = after.iter().filter(|&&t| t != 1).count() as u64;
    assert_eq!(changed, report.kept_blocks);
    inner.snapshot()
}

#[test]
fn a_crash_keeping_a_subset_is_seeded_and_block_whole() {
    let contents = crash_keeping_half(3);
    assert_eq!(contents, crash_keeping_half(3));
    assert_ne!(contents, crash_keeping_half(4));
}

#[test]
fn a_scripted_run_of_every_random_fault_replays_from_its_seed() {
    let run = |seed: u64| {
        let inner = memory(64 << 10, 512);
        let faulty = FaultyMember::with_seed(inner.clone(), seed);
        for text in ["write-cache", "eio-rate:0.1", "torn:20", "eio:read:8K+2K"] {
            faulty.apply_str(text).unwrap();
        }
        let mut workload = StdRng::seed_from_u64(1);
        let mut outcomes = String::new();
        for tag in 1..300u64 {
            let first = workload.gen_range(0..120u64);
            let blocks = workload.gen_range(1..=8);
            let result = match workload.gen_range(0..10) {
                0 => faulty.flush(),
                1 => faulty.crash_keeping(0.5).map(drop),
                2..=5 => read(&faulty, first * 512, blocks * 512).map(|data| {
                    tags(&data, 512);
                }),
                _ => faulty.write_at(&fill(tag, blocks * 512), first * 512),
            };
            outcomes.push(if result.is_ok() { '.' } else { 'x' });
        }
        tags(&inner.snapshot(), 512);
        (outcomes, faulty.counters(), inner.snapshot())
    };
    let first = run(9);
    assert!(first.1.random_errors > 0 && first.1.torn_writes == 20);
    assert_eq!(first, run(9));
    assert_ne!(first, run(10));
}

/// Per block of a thread's region, the writes it may hold.
type Allowed = Vec<Vec<u64>>;

/// Reads or writes random runs of a thread's own region until `stop`,
/// checking every read against what the region may hold. Failed writes may
/// have landed in part (torn) or not at all, so they widen what is allowed;
/// successful reads narrow it again.
fn churn(faulty: &FaultyMember, thread: u64, stop: &AtomicBool) -> (Allowed, u64) {
    const REGION_BLOCKS: usize = 128;
    let base_bytes = thread * (REGION_BLOCKS as u64 * 512);
    let mut allowed: Allowed = vec![vec![0]; REGION_BLOCKS];
    let mut rng = StdRng::seed_from_u64(thread);
    let mut ios = 0;
    for seq in 1.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        ios += 1;
        let first = rng.gen_range(0..REGION_BLOCKS - 16);
        let blocks = rng.gen_range(1..=16);
        let offset_bytes = base_bytes + first as u64 * 512;
        let span = first..first + blocks;
        if rng.gen_bool(0.5) {
            let tag = ((thread + 1) << 32) | seq;
            match faulty.write_at(&fill(tag, blocks * 512), offset_bytes) {
                Ok(()) => allowed[span].iter_mut().for_each(|a| *a = vec![tag]),
                Err(e) => {
                    assert!(injected_errno(&e).is_some(), "{e}");
                    allowed[span].iter_mut().for_each(|a| a.push(tag));
                }
            }
        } else {
            match read(faulty, offset_bytes, blocks * 512) {
                Ok(data) => {
                    for (block, tag) in span.zip(tags(&data, 512)) {
                        assert!(allowed[block].contains(&tag), "block {block}: {tag:#x}");
                        allowed[block] = vec![tag];
                    }
                }
                Err(e) => assert!(injected_errno(&e).is_some(), "{e}"),
            }
        }
    }
    (allowed, ios)
}

#[test]
fn io_stays_consistent_while_faults_change_underneath() {
    let faulty = Arc::new(FaultyMember::with_seed(memory(512 << 10, 512), 11));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u64)
        .map(|thread| {
            let (faulty, stop) = (faulty.clone(), stop.clone());
            thread::spawn(move || churn(&faulty, thread, &stop))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(99);
    for _ in 0..150 {
        let offset_kib = rng.gen_range(0..500);
        let text = match rng.gen_range(0..14) {
            0 => "pull".to_string(),
            1 => "offline:5ms".to_string(),
            2 => "offline".to_string(),
            3 => "eio-rate:0.2".to_string(),
            4 => "latency:200us:jitter=300us".to_string(),
            5 => "torn:2".to_string(),
            6 => "torn:3:keep=1".to_string(),
            7 => format!("eio:read:{offset_kib}K+4K"),
            8 => format!("eio:write:{offset_kib}K+2K"),
            9 => format!("eio:{offset_kib}K+1K:noremap"),
            10 => "heal".to_string(),
            _ => "restore".to_string(),
        };
        faulty.apply_str(&text).unwrap();
        thread::sleep(Duration::from_millis(3));
    }
    stop.store(true, Ordering::Relaxed);
    faulty.restore();
    let mut ios = 0;
    for (thread, worker) in workers.into_iter().enumerate() {
        let (allowed, thread_ios) = worker.join().unwrap();
        ios += thread_ios;
        // Healthy again, every block holds one of the writes it may hold.
        let data = read(&*faulty, thread as u64 * (64 << 10), 64 << 10).unwrap();
        for (block, tag) in tags(&data, 512).into_iter().enumerate() {
            assert!(
                allowed[block].contains(&tag),
                "thread {thread} block {block}"
            );
        }
    }
    let counters = faulty.counters();
    assert_eq!(counters.reads + counters.writes, ios + 4);
    assert!(counters.errors_injected() > 0, "{counters:?}");
    assert!(
        counters.pulled_errors > 0 && counters.torn_writes > 0,
        "{counters:?}"
    );
}

#[test]
fn writers_survive_crashes_of_the_write_cache() {
    const REGION_BYTES: u64 = 32 << 10;
    let inner = memory(4 * REGION_BYTES, 512);
    let faulty = Arc::new(FaultyMember::with_seed(inner.clone(), 5));
    faulty.apply_str("write-cache").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u64)
        .map(|thread| {
            let (faulty, stop) = (faulty.clone(), stop.clone());
            thread::spawn(move || {
                let base_bytes = thread * REGION_BYTES;
                let blocks = (REGION_BYTES / 512) as usize;
                // Per block: the copy known to be on the inner member, and
                // the writes since, any of which a crash may leave.
                let mut flushed = vec![0u64; blocks];
                let mut since: Vec<Vec<u64>> = vec![Vec::new(); blocks];
                let mut rng = StdRng::seed_from_u64(thread);
                let mut seq = 0;
                let check = |data: &[u8], flushed: &[u64], since: &[Vec<u64>]| {
                    for (block, tag) in tags(data, 512).into_iter().enumerate() {
                        assert!(
                            tag == flushed[block] || since[block].contains(&tag),
                            "thread {thread} block {block}: {tag:#x}"
                        );
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let tag = ((thread + 1) << 32) | seq;
                    let first = rng.gen_range(0..blocks - 8);
                    let len = rng.gen_range(1..=8);
                    faulty
                        .write_at(&fill(tag, len * 512), base_bytes + first as u64 * 512)
                        .unwrap();
                    since[first..first + len]
                        .iter_mut()
                        .for_each(|s| s.push(tag));
                    let data = read(&*faulty, base_bytes, REGION_BYTES as usize).unwrap();
                    check(&data, &flushed, &since);
                    if seq % 8 == 0 {
                        // After a flush the region is on the inner member,
                        // where no crash can reach it.
                        faulty.flush().unwrap();
                        let data = read(&*faulty, base_bytes, REGION_BYTES as usize).unwrap();
                        check(&data, &flushed, &since);
                        flushed = tags(&data, 512);
                        since.iter_mut().for_each(Vec::clear);
                    }
                }
                let last = fill(u64::MAX - thread, REGION_BYTES as usize);
                faulty.write_at(&last, base_bytes).unwrap();
                faulty.flush().unwrap();
                seq
            })
        })
        .collect();
    let mut crashes = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        faulty.crash_keeping(0.5).unwrap();
        crashes += 1;
        thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        assert!(worker.join().unwrap() > 8);
    }
    // The final flushed writes are all on the inner member.
    let snapshot = inner.snapshot();
    for (thread, region) in snapshot.chunks_exact(REGION_BYTES as usize).enumerate() {
        assert_eq!(tags(region, 512), vec![u64::MAX - thread as u64; 64]);
    }
    assert_eq!(faulty.counters().crashes, crashes);
    assert!(faulty.counters().crash_lost_blocks > 0);
}

#[test]
fn the_documented_json_and_command_lines_agree() {
    let pairs = [
        (r#"{"pull":{}}"#, "pull"),
        (r#"{"restore":{}}"#, "restore"),
        (r#"{"offline":{"ms":2000}}"#, "offline:2s"),
        (r#"{"offline":{}}"#, "offline"),
        (
            r#"{"eio":{"offset":1048576,"len":65536,"ops":"read"}}"#,
            "eio:read:1M+64K",
        ),
        (r#"{"eio_rate":{"rate":0.01}}"#, "eio-rate:0.01"),
        (r#"{"latency":{"us":5000}}"#, "latency:5ms"),
        (r#"{"torn":{}}"#, "torn"),
        (r#"{"write_cache":{"enabled":false}}"#, "write-cache:off"),
        (r#"{"crash":{"keep":0.5}}"#, "crash:0.5"),
        (r#"{"heal":{"offset":0,"len":512}}"#, "heal:0+512"),
    ];
    for (json, text) in pairs {
        let from_json: Fault = serde_json::from_str(json).unwrap();
        let from_text: Fault = text.parse().unwrap();
        assert_eq!(from_json, from_text, "{json} vs {text}");
        assert_eq!(from_json.to_string(), text);
    }
    assert_eq!(
        Fault::parse_list("pull, latency:5ms,").unwrap(),
        vec![Fault::Pull {}, "latency:5ms".parse().unwrap()]
    );
    let err = Fault::parse_list("pull,eio-rate:2").unwrap_err();
    assert_eq!(
        err,
        "invalid fault 'eio-rate:2': rate '2' is not a number between 0 and 1"
    );
    // JSON that parses but makes no sense is refused when applied.
    let faulty = FaultyMember::new(memory(64 << 10, 512));
    for json in [
        r#"{"heal":{"offset":0}}"#,
        r#"{"eio_rate":{"rate":3}}"#,
        r#"{"eio":{"offset":0,"len":1048576}}"#,
    ] {
        let fault: Fault = serde_json::from_str(json).unwrap();
        let err = faulty.apply(&fault).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{json}");
    }
    assert!(faulty.faults().is_empty());
}

fn ops() -> impl Strategy<Value = Ops> {
    prop_oneof![Just(Ops::Read), Just(Ops::Write), Just(Ops::Both)]
}

/// Fractions with a short exact decimal form, so that JSON's float parsing
/// cannot be off by one ulp.
fn fraction() -> impl Strategy<Value = f64> {
    (0u32..=1024).prop_map(|k| f64::from(k) / 1024.0)
}

fn any_fault() -> impl Strategy<Value = Fault> {
    let range = (0u64..1 << 50, 1u64..1 << 40);
    prop_oneof![
        Just(Fault::Pull {}),
        Just(Fault::Restore {}),
        proptest::option::of(0u64..1 << 40).prop_map(|ms| Fault::Offline(Offline { ms })),
        (range.clone(), ops(), any::<bool>()).prop_map(
            |((offset_bytes, len_bytes), ops, remap)| {
                Fault::Eio(BadRange {
                    offset_bytes,
                    len_bytes,
                    ops,
                    remap,
                })
            }
        ),
        (fraction(), ops(), proptest::option::of(any::<u64>()))
            .prop_map(|(rate, ops, seed)| Fault::EioRate(EioRate { rate, ops, seed })),
        (0u64..30_000_000, 0u64..30_000_000, ops()).prop_map(|(delay_us, jitter_us, ops)| {
            Fault::Latency(Latency {
                delay_us,
                jitter_us,
                ops,
            })
        }),
        (any::<u32>(), proptest::option::of(any::<u64>())).prop_map(|(writes, keep_blocks)| {
            Fault::Torn(Torn {
                writes,
                keep_blocks,
            })
        }),
        (any::<bool>(), proptest::option::of(1u64..=1 << 30)).prop_map(
            |(enabled, capacity_bytes)| Fault::WriteCache(WriteCache {
                enabled,
                capacity_bytes
            })
        ),
        fraction().prop_map(|keep| Fault::Crash(Crash { keep })),
        proptest::option::of(range).prop_map(|range| Fault::Heal(Heal {
            offset_bytes: range.map(|r| r.0),
            len_bytes: range.map(|r| r.1),
        })),
    ]
}

proptest! {
    #[test]
    fn every_fault_round_trips_through_text_and_json(fault in any_fault()) {
        prop_assert_eq!(fault.check(), Ok(()));
        let text = fault.to_string();
        prop_assert_eq!(&text.parse::<Fault>().unwrap(), &fault, "{}", text);
        let json = serde_json::to_string(&fault).unwrap();
        prop_assert_eq!(&serde_json::from_str::<Fault>(&json).unwrap(), &fault, "{}", json);
    }

    #[test]
    fn garbage_is_refused_in_one_line(text in "[a-z:=+0-9.]{0,24}") {
        if let Err(err) = text.parse::<Fault>() {
            prop_assert!(err.starts_with("invalid fault '"));
            prop_assert_eq!(err.lines().count(), 1);
        }
    }
}

#[test]
fn a_bandwidth_limit_paces_an_image_file() {
    let (_file, file_member) = image(1 << 20);
    let throttled = ThrottledMember::new(file_member, "bw=2M,burst=10ms".parse().unwrap()).unwrap();
    let started = Instant::now();
    for piece in 0..8u64 {
        throttled
            .write_at(&fill(piece, 64 << 10), piece * (64 << 10))
            .unwrap();
    }
    // 512 KiB at 2 MiB/s, less a 20 KiB burst: about 240 ms.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1000), "{elapsed:?}");
    let stats = throttled.stats();
    assert_eq!((stats.ios, stats.bytes), (8, 512 << 10));
    assert!(stats.waited_us >= 150_000, "{stats:?}");
    assert_eq!(read(&throttled, 448 << 10, 512).unwrap(), fill(7, 512));
}

#[test]
fn lifting_a_limit_wakes_waiting_io() {
    let throttled = Arc::new(
        ThrottledMember::new(memory(1 << 20, 512), "bw=1K,burst=1ms".parse().unwrap()).unwrap(),
    );
    let started = Instant::now();
    let writers: Vec<_> = (0..3u64)
        .map(|n| {
            let throttled = throttled.clone();
            // At 1 KiB/s each of these would take over a minute.
            thread::spawn(move || throttled.write_at(&fill(n, 64 << 10), n * (64 << 10)))
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    throttled.set_limits(ThrottleLimits::UNLIMITED).unwrap();
    for writer in writers {
        writer.join().unwrap().unwrap();
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(throttled.set_limits("bw=1M".parse().unwrap()).is_ok());
    assert_eq!(throttled.limits().to_string(), "bw=1M");
    let zero = ThrottleLimits {
        iops: Some(0),
        ..ThrottleLimits::UNLIMITED
    };
    assert!(throttled.set_limits(zero).is_err());
    assert_eq!(throttled.limits().to_string(), "bw=1M");
}

#[test]
fn an_iops_limit_is_shared_by_concurrent_callers() {
    let throttled = Arc::new(
        ThrottledMember::new(memory(1 << 20, 512), "iops=400,burst=5ms".parse().unwrap()).unwrap(),
    );
    let started = Instant::now();
    let readers: Vec<_> = (0..4u64)
        .map(|n| {
            let throttled = throttled.clone();
            thread::spawn(move || {
                for i in 0..25 {
                    read(&*throttled, (n * 25 + i) * 512, 512).unwrap();
                }
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    // 100 I/Os at 400 per second, less a burst of 2: about 245 ms.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1000), "{elapsed:?}");
}

#[test]
fn wrappers_stack_over_an_image_file() {
    let (_file, file_member) = image(256 << 10);
    let faulty = Arc::new(FaultyMember::new(file_member));
    let stack: MemberRef =
        Arc::new(ThrottledMember::new(faulty.clone(), "iops=1000".parse().unwrap()).unwrap());
    stack.write_at(&fill(1, 4096), 0).unwrap();
    faulty.apply_str("eio:read:0+512").unwrap();
    let err = read(&*stack, 0, 4096).unwrap_err();
    assert_eq!(injected_errno(&err), Some(libc::EIO));
    assert!(err.to_string().contains("medium error at byte 0"), "{err}");
    faulty.apply_str("pull").unwrap();
    assert_eq!(errno(stack.flush()), libc::ENODEV);
    faulty.apply_str("restore").unwrap();
    assert_eq!(read(&*stack, 0, 4096).unwrap(), fill(1, 4096));
    assert_eq!(stack.name(), faulty.inner().name());
    assert_eq!(stack.size_bytes(), 256 << 10);
}
