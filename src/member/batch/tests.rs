//! The batch API against both backends, on files with direct I/O on and off,
//! with aligned and unaligned memory, short I/O, errors and the fallback.

use super::*;
use crate::member::uring::{self, Limits, Ring};
use crate::member::{
    AlignedBuf, CacheMode, FaultyMember, FileMember, MemberRef, MemoryMember, OpenOptions, RawIo,
    RingAlways,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

const MEMBER_BYTES: u64 = 1 << 20;

fn member_files(dir: &Path, count: usize, size_bytes: u64) -> Vec<PathBuf> {
    (0..count)
        .map(|i| {
            let path = dir.join(format!("m{i}"));
            std::fs::File::create(&path)
                .unwrap()
                .set_len(size_bytes)
                .unwrap();
            path
        })
        .collect()
}

fn open(path: &Path, cache: CacheMode) -> FileMember {
    FileMember::open_with(path, OpenOptions { write: true }, cache).unwrap()
}

/// Opened so that batches use the ring, buffered or not.
fn open_on_ring(path: &Path, cache: CacheMode) -> RingAlways {
    RingAlways(open(path, cache))
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    data
}

/// Memory for one op: aligned, or deliberately one byte off so that an
/// O_DIRECT member has to bounce it.
enum Memory {
    Aligned(AlignedBuf),
    Unaligned(Vec<u8>),
}

impl Memory {
    fn new(len: usize, aligned: bool) -> Memory {
        if aligned {
            Memory::Aligned(AlignedBuf::zeroed(len))
        } else {
            Memory::Unaligned(vec![0; len + 1])
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Memory::Aligned(buf) => buf,
            Memory::Unaligned(buf) => &mut buf[1..],
        }
    }
}

/// A random plan of disjoint ops: per member, a few of its 64 KiB slots,
/// each with a random whole number of blocks at a random block offset.
fn plan(rng: &mut StdRng, members: usize, block_bytes: u64) -> Vec<(usize, u64, usize)> {
    let slot_bytes = 64 * 1024;
    let mut ops = Vec::new();
    for member in 0..members {
        let slots = MEMBER_BYTES / slot_bytes;
        let mut chosen: Vec<u64> = (0..slots).collect();
        for _ in 0..rng.gen_range(1..=4) {
            let slot = chosen.swap_remove(rng.gen_range(0..chosen.len()));
            let blocks = slot_bytes / block_bytes;
            let start = rng.gen_range(0..blocks);
            let len = rng.gen_range(1..=blocks - start);
            ops.push((
                member,
                slot * slot_bytes + start * block_bytes,
                (len * block_bytes) as usize,
            ));
        }
    }
    ops
}

/// Writes a random plan with `write_with`, reads it back with `read_with`
/// into fresh memory, and checks the bytes, also against the files read
/// without uraid.
fn round_trip(
    members: &[&dyn Member],
    paths: Option<&[PathBuf]>,
    block_bytes: u64,
    write_with: Backend,
    read_with: Backend,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = plan(&mut rng, members.len(), block_bytes);
    let mut written: Vec<Memory> = Vec::new();
    for &(_, _, len) in &plan {
        let mut memory = Memory::new(len, rng.gen_bool(0.5));
        memory.bytes().copy_from_slice(&random_bytes(&mut rng, len));
        written.push(memory);
    }
    let mut ops: Vec<IoOp> = plan
        .iter()
        .zip(written.iter_mut())
        .map(|(&(m, at, _), memory)| IoOp::write(members[m], at, memory.bytes()))
        .collect();
    for result in run_with(write_with, &mut ops) {
        result.unwrap();
    }
    let mut read: Vec<Memory> = plan
        .iter()
        .map(|&(_, _, len)| Memory::new(len, rng.gen_bool(0.5)))
        .collect();
    let mut ops: Vec<IoOp> = plan
        .iter()
        .zip(read.iter_mut())
        .map(|(&(m, at, _), memory)| IoOp::read(members[m], at, memory.bytes()))
        .collect();
    for result in run_with(read_with, &mut ops) {
        result.unwrap();
    }
    for (i, &(m, at, len)) in plan.iter().enumerate() {
        assert!(
            read[i].bytes() == written[i].bytes(),
            "seed {seed}: op {i} (member {m} at {at}+{len}) read back differs"
        );
    }
    let Some(paths) = paths else { return };
    let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for (i, &(m, at, len)) in plan.iter().enumerate() {
        assert!(
            files[m][at as usize..][..len] == *written[i].bytes(),
            "seed {seed}: op {i} not in the file"
        );
    }
}

#[test]
fn both_backends_agree_on_files_with_and_without_direct_io() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 8, MEMBER_BYTES);
    for (round, cache) in [CacheMode::Direct, CacheMode::Buffered]
        .into_iter()
        .enumerate()
    {
        let members: Vec<RingAlways> = paths.iter().map(|p| open_on_ring(p, cache)).collect();
        for RingAlways(member) in &members {
            // What `direct()` says is what the descriptor has, and only a
            // direct member offers its descriptor to the ring by itself.
            let flags = unsafe { libc::fcntl(member.as_raw_fd(), libc::F_GETFL) };
            assert_eq!(flags & libc::O_DIRECT != 0, member.direct());
            assert_eq!(member.raw_io().is_some(), member.direct());
            if cache == CacheMode::Buffered {
                assert!(!member.direct());
            }
        }
        let dyns: Vec<&dyn Member> = members.iter().map(|m| m as &dyn Member).collect();
        for (pair, (w, r)) in [
            (Backend::Uring, Backend::Sync),
            (Backend::Sync, Backend::Uring),
            (Backend::Uring, Backend::Uring),
        ]
        .into_iter()
        .enumerate()
        {
            round_trip(&dyns, Some(&paths), 512, w, r, (round * 10 + pair) as u64);
        }
    }
}

#[test]
fn direct_io_is_used_where_the_file_system_has_it() {
    // /tmp is where the test suite keeps its members; on ext4, xfs, btrfs and
    // tmpfs (Linux 6.6 and later) it supports O_DIRECT. Where it does not,
    // this says so instead of failing: the fallback is the designed answer.
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 1, MEMBER_BYTES);
    let member = open(&paths[0], CacheMode::Direct);
    if !member.direct() {
        eprintln!("note: /tmp has no O_DIRECT here; the direct path is untested on this machine");
        return;
    }
    let raw = member.raw_io().unwrap();
    eprintln!(
        "/tmp: O_DIRECT with {}-byte aligned memory",
        raw.memory_align_bytes
    );
    assert!(raw.memory_align_bytes.is_power_of_two());
    assert!(raw.memory_align_bytes <= crate::member::aligned::ALIGN_BYTES);
}

#[test]
fn members_on_tmpfs_are_buffered_and_stay_off_the_ring() {
    let shm = Path::new("/dev/shm");
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    let path = std::ffi::CString::new("/dev/shm").unwrap();
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 || stat.f_type as i64 != 0x0102_1994 {
        eprintln!("note: /dev/shm is not tmpfs here; untested");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let paths = member_files(dir.path(), 1, MEMBER_BYTES);
    let member = open(&paths[0], CacheMode::Direct);
    assert!(!member.direct());
    assert!(member.raw_io().is_none());
    let flags = unsafe { libc::fcntl(member.as_raw_fd(), libc::F_GETFL) };
    assert_eq!(flags & libc::O_DIRECT, 0);
}

#[test]
fn unaligned_memory_is_bounced_through_the_trait_too() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 1, 8 << 20);
    let member = open(&paths[0], CacheMode::Direct);
    let mut rng = StdRng::seed_from_u64(7);
    // Larger than a bounce buffer, so that it goes in pieces.
    let len = 3 * crate::member::aligned::BOUNCE_BYTES_MAX + 4096;
    let mut source = vec![0u8; len + 1];
    rng.fill(&mut source[1..]);
    member.write_at(&source[1..], 512).unwrap();
    let mut back = vec![0u8; len + 3];
    member.read_at(&mut back[3..], 512).unwrap();
    assert!(back[3..] == source[1..]);
    assert!(std::fs::read(&paths[0]).unwrap()[512..][..len] == source[1..]);
}

#[test]
fn queue_bounds_and_short_submissions_still_move_every_byte() {
    // Four ring entries, two per member, 4 KiB per submission: a 64 KiB op
    // takes sixteen, and most ops wait for room.
    let limits = Limits {
        entries: 4,
        member_depth_max: 2,
        sqe_bytes_max: 4096,
    };
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 4, MEMBER_BYTES);
    let members: Vec<RingAlways> = paths
        .iter()
        .map(|p| open_on_ring(p, CacheMode::Direct))
        .collect();
    let mut rng = StdRng::seed_from_u64(11);
    let mut data: Vec<(usize, u64, Vec<u8>)> = Vec::new();
    for m in 0..4 {
        for k in 0..5u64 {
            data.push((m, k * 65536, random_bytes(&mut rng, 65536)));
        }
    }
    let mut ops: Vec<IoOp> = data
        .iter()
        .map(|(m, at, d)| IoOp::write(&members[*m], *at, d))
        .collect();
    let results = uring::run_limited(&mut ops, &Ring::new, limits).unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let mut back: Vec<Vec<u8>> = data.iter().map(|_| vec![0; 65536]).collect();
    let mut ops: Vec<IoOp> = data
        .iter()
        .zip(back.iter_mut())
        .map(|((m, at, _), b)| IoOp::read(&members[*m], *at, b))
        .collect();
    let results = uring::run_limited(&mut ops, &Ring::new, limits).unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    for ((_, _, d), b) in data.iter().zip(&back) {
        assert!(d == b);
    }
}

#[test]
fn a_bad_op_fails_alone_with_the_member_and_offset_in_its_error() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 2, MEMBER_BYTES);
    let members: Vec<FileMember> = paths.iter().map(|p| open(p, CacheMode::Direct)).collect();
    for backend in [Backend::Uring, Backend::Sync] {
        let mut a = AlignedBuf::zeroed(4096);
        let mut beyond = AlignedBuf::zeroed(4096);
        let mut misaligned = AlignedBuf::zeroed(4096);
        let mut ops = vec![
            IoOp::read(&members[0], 0, &mut a),
            IoOp::read(&members[1], MEMBER_BYTES - 2048, &mut beyond),
            IoOp::read(&members[1], 100, &mut misaligned),
        ];
        let results = run_with(backend, &mut ops);
        assert!(results[0].is_ok());
        let e = results[1].as_ref().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("beyond the end") && e.to_string().contains("/m1"),
            "{e}"
        );
        let e = results[2].as_ref().unwrap_err();
        assert!(e.to_string().contains("not aligned"), "{e}");
    }
}

/// Members that misbehave. `BadDescriptor` gives the ring a descriptor that
/// is not open (-1 rather than one closed here: the number of a closed one
/// can be reused at once by another test's thread); `Panics` panics on
/// every I/O, as a bug in a wrapper would.
enum Misbehaving {
    BadDescriptor,
    Panics,
}

use Misbehaving::{BadDescriptor, Panics};

impl Member for Misbehaving {
    fn name(&self) -> &str {
        match self {
            BadDescriptor => "bad-fd",
            Panics => "panics",
        }
    }
    fn size_bytes(&self) -> u64 {
        MEMBER_BYTES
    }
    fn logical_block_bytes(&self) -> u32 {
        512
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
        match self {
            BadDescriptor => Err(io::Error::from_raw_os_error(libc::EBADF)),
            Panics => panic!("member panicked"),
        }
    }
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        unreachable!("the tests only read them")
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> io::Result<()> {
        Ok(())
    }
    fn raw_io(&self) -> Option<RawIo> {
        match self {
            BadDescriptor => Some(RawIo {
                fd: -1,
                memory_align_bytes: 1,
            }),
            Panics => None,
        }
    }
}

#[test]
fn a_descriptor_that_is_not_open_fails_its_op() {
    let mut buf = vec![0u8; 4096];
    let mut ops = vec![IoOp::read(&BadDescriptor, 8192, &mut buf)];
    let results = run_with(Backend::Uring, &mut ops);
    let e = results[0].as_ref().unwrap_err();
    assert_eq!(e.raw_os_error(), None, "annotated errors carry a message");
    assert!(e.to_string().contains("bad-fd: read at 8192+4096"), "{e}");
    assert!(
        e.to_string()
            .contains(&io::Error::from_raw_os_error(libc::EBADF).to_string()),
        "{e}"
    );
}

#[test]
fn a_file_cut_short_ends_a_read_with_end_of_file() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 1, MEMBER_BYTES);
    let member = open_on_ring(&paths[0], CacheMode::Buffered);
    // The member still believes in 1 MiB; the file now ends 1000 bytes
    // into the last 8 KiB, so the read comes back short, then empty.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[0])
        .unwrap()
        .set_len(MEMBER_BYTES - 8192 + 1000)
        .unwrap();
    for backend in [Backend::Uring, Backend::Sync] {
        let mut buf = vec![0u8; 8192];
        let mut ops = vec![IoOp::read(&member, MEMBER_BYTES - 8192, &mut buf)];
        let results = run_with(backend, &mut ops);
        let e = results[0].as_ref().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{backend:?}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("read at {}+8192", MEMBER_BYTES - 8192)),
            "{e}"
        );
    }
}

#[test]
fn members_without_a_descriptor_keep_their_behaviour_in_a_mixed_batch() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 1, MEMBER_BYTES);
    let file = open(&paths[0], CacheMode::Direct);
    let memory: MemberRef = Arc::new(MemoryMember::new("mem", MEMBER_BYTES, 512));
    let faulty = FaultyMember::new(Arc::new(MemoryMember::new("faulty", MEMBER_BYTES, 512)));
    faulty.pull();
    assert!(faulty.raw_io().is_none() && memory.raw_io().is_none());
    let data = AlignedBuf::copy_from(&[0x5a; 8192]);
    let mut ops = vec![
        IoOp::write(&file, 4096, &data),
        IoOp::write(memory.as_ref(), 4096, &data),
        IoOp::write(&faulty, 4096, &data),
    ];
    let results = run_with(Backend::Uring, &mut ops);
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    assert!(
        results[2].is_err(),
        "the fault injector still fails a pulled member"
    );
    let mut back = vec![0u8; 8192];
    memory.read_at(&mut back, 4096).unwrap();
    assert!(back == data[..]);
    file.read_at(&mut back, 4096).unwrap();
    assert!(back == data[..]);
}

#[test]
#[should_panic(expected = "overlap")]
fn overlapping_writes_in_one_batch_are_refused() {
    let member = MemoryMember::new("mem", MEMBER_BYTES, 512);
    let a = vec![1u8; 4096];
    let mut b = vec![0u8; 4096];
    let mut ops = vec![
        IoOp::write(&member, 0, &a),
        IoOp::read(&member, 2048, &mut b),
    ];
    run_with(Backend::Sync, &mut ops);
}

#[test]
#[should_panic(expected = "member panicked")]
fn a_member_that_panics_mid_batch_unwinds_after_the_ring_is_drained() {
    // The ring's op is in flight while the trait op panics; the panic must
    // come out (not abort the process) and only once the kernel is done.
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 1, MEMBER_BYTES);
    let file = open_on_ring(&paths[0], CacheMode::Direct);
    let mut a = vec![0u8; 65536];
    let mut b = vec![0u8; 4096];
    let mut ops = vec![IoOp::read(&file, 0, &mut a), IoOp::read(&Panics, 0, &mut b)];
    run_with(Backend::Uring, &mut ops);
}

/// A ring setup that always fails with `errno`, counting its tries.
fn refusing_setup(setups: &AtomicU32, errno: i32) -> impl Fn() -> io::Result<Ring> + '_ {
    move || {
        setups.fetch_add(1, Ordering::SeqCst);
        Err(io::Error::from_raw_os_error(errno))
    }
}

#[test]
fn a_ring_that_cannot_be_set_up_falls_back_for_good() {
    // A fresh thread: its ring does not exist yet, so the failing setup is
    // what the selector meets.
    std::thread::spawn(|| {
        let selector = Selector::new();
        let setups = AtomicU32::new(0);
        let refuse = refusing_setup(&setups, libc::ENOSYS);
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let paths = member_files(dir.path(), 2, MEMBER_BYTES);
        let members: Vec<FileMember> = paths.iter().map(|p| open(p, CacheMode::Direct)).collect();
        for round in 0..3u8 {
            let data = AlignedBuf::copy_from(&[round + 1; 4096]);
            let mut ops: Vec<IoOp> = members.iter().map(|m| IoOp::write(m, 0, &data)).collect();
            assert!(selector.run(&mut ops, &refuse).iter().all(|r| r.is_ok()));
            for path in &paths {
                assert_eq!(std::fs::read(path).unwrap()[..4096], data[..]);
            }
        }
        assert_eq!(
            setups.load(Ordering::SeqCst),
            1,
            "tried once, then sync for good"
        );
        assert_eq!(selector.current(), Backend::Sync);
    })
    .join()
    .unwrap();
}

#[test]
fn a_ring_that_cannot_be_set_up_for_now_is_tried_again_later() {
    // ENOMEM (the locked-memory limit of older kernels) is this thread's
    // trouble for now: its batches go through pread/pwrite, the process
    // does not give up io_uring, and the thread tries again later.
    std::thread::spawn(|| {
        let selector = Selector::new();
        let setups = AtomicU32::new(0);
        let refuse = refusing_setup(&setups, libc::ENOMEM);
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let paths = member_files(dir.path(), 1, MEMBER_BYTES);
        let member = open(&paths[0], CacheMode::Direct);
        let data = AlignedBuf::copy_from(&[7u8; 4096]);
        let rounds = RING_RETRY_BATCHES + 2;
        for _ in 0..rounds {
            let mut ops = vec![IoOp::write(&member, 0, &data)];
            assert!(selector.run(&mut ops, &refuse).iter().all(|r| r.is_ok()));
        }
        assert_eq!(std::fs::read(&paths[0]).unwrap()[..4096], data[..]);
        assert_eq!(
            setups.load(Ordering::SeqCst),
            2,
            "tried, waited, tried again"
        );
        assert_eq!(selector.current(), Backend::Uring, "not given up for good");
    })
    .join()
    .unwrap();
}

#[test]
fn a_ring_that_can_be_set_up_is_used() {
    std::thread::spawn(|| {
        let selector = Selector::new();
        let mut buf = AlignedBuf::zeroed(512);
        let member = BadDescriptor;
        let mut ops = vec![IoOp::read(&member, 0, &mut buf)];
        // BadDescriptor's trait read and its ring read both fail; only the
        // ring's error names the operation and the offset.
        let results = selector.run(&mut ops, &Ring::new);
        assert!(results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("read at 0+512"));
        assert_eq!(selector.current(), Backend::Uring);
    })
    .join()
    .unwrap();
}

/// Run by `the_environment_forces_a_backend` in a child process, whose
/// URAID_IO it reports: the variable is read once per process.
#[test]
#[ignore = "run in a child process by the_environment_forces_a_backend"]
fn child_reports_its_backend() {
    println!("backend={}", backend().name());
}

#[test]
fn the_environment_forces_a_backend() {
    for (value, expected) in [("sync", "backend=sync"), ("uring", "backend=io_uring")] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "--nocapture"])
            .arg("member::batch::tests::child_reports_its_backend")
            .env("URAID_IO", value)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(expected),
            "URAID_IO={value}: {stdout}"
        );
    }
}

#[test]
fn the_environment_names_a_backend() {
    assert_eq!(parse_backend(""), Ok(None));
    assert_eq!(parse_backend("uring"), Ok(Some(Backend::Uring)));
    assert_eq!(parse_backend("io_uring"), Ok(Some(Backend::Uring)));
    assert_eq!(parse_backend("sync"), Ok(Some(Backend::Sync)));
    assert!(parse_backend("fast").unwrap_err().contains("\"fast\""));
}

/// A loop device with 4096-byte logical blocks over a file, detached on drop.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn new(backing: &Path) -> Option<LoopDevice> {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--sector-size", "4096"])
            .arg(backing)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(LoopDevice(PathBuf::from(
            String::from_utf8(out.stdout).ok()?.trim(),
        )))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn members_with_4096_byte_blocks_on_loop_devices() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 3, MEMBER_BYTES);
    let devices: Vec<LoopDevice> = paths.iter().filter_map(|p| LoopDevice::new(p)).collect();
    if devices.len() < paths.len() {
        eprintln!("note: no loop devices here (needs root); 4096-byte blocks untested");
        return;
    }
    for cache in [CacheMode::Direct, CacheMode::Buffered] {
        let members: Vec<RingAlways> = devices.iter().map(|d| open_on_ring(&d.0, cache)).collect();
        for RingAlways(member) in &members {
            assert!(member.is_block_device());
            assert_eq!(member.logical_block_bytes(), 4096);
            assert_eq!(member.direct(), cache == CacheMode::Direct);
        }
        let dyns: Vec<&dyn Member> = members.iter().map(|m| m as &dyn Member).collect();
        round_trip(&dyns, None, 4096, Backend::Uring, Backend::Sync, 40);
        round_trip(&dyns, None, 4096, Backend::Sync, Backend::Uring, 41);
        // 512-byte I/O is refused on a 4Kn member, by both backends.
        let mut buf = AlignedBuf::zeroed(512);
        for backend in [Backend::Uring, Backend::Sync] {
            let mut ops = vec![IoOp::read(dyns[0], 512, &mut buf)];
            assert!(run_with(backend, &mut ops)[0].is_err());
        }
        for member in &members {
            member.flush().unwrap();
        }
    }
}

/// A FUA write (RWF_DSYNC) lands like a plain one on both backends, direct
/// and buffered, and through `write_at_fua` itself, aligned or not.
#[test]
fn fua_writes_land_on_both_backends_and_through_the_trait() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let paths = member_files(dir.path(), 2, MEMBER_BYTES);
    let mut rng = StdRng::seed_from_u64(11);
    for cache in [CacheMode::Direct, CacheMode::Buffered] {
        for backend in [Backend::Uring, Backend::Sync] {
            let members: Vec<RingAlways> = paths.iter().map(|p| open_on_ring(p, cache)).collect();
            let data: Vec<AlignedBuf> = (0..2)
                .map(|_| AlignedBuf::copy_from(&random_bytes(&mut rng, 64 << 10)))
                .collect();
            let mut ops: Vec<IoOp> = members
                .iter()
                .zip(&data)
                .map(|(m, d)| IoOp::write_fua(m, 4096, d))
                .collect();
            for result in run_with(backend, &mut ops) {
                result.unwrap_or_else(|e| panic!("{cache:?} {backend:?}: {e}"));
            }
            for (m, d) in members.iter().zip(&data) {
                let mut back = AlignedBuf::zeroed(d.len());
                m.read_at(&mut back, 4096).unwrap();
                assert!(back[..] == d[..], "{cache:?} {backend:?}: read back");
            }
        }
        let member = open(&paths[0], cache);
        let source = random_bytes(&mut rng, 8193);
        member.write_at_fua(&source[1..], 8192).unwrap();
        let mut back = vec![0u8; 8192];
        member.read_at(&mut back, 8192).unwrap();
        assert!(back[..] == source[1..], "{cache:?}: unaligned write_at_fua");
    }
}
