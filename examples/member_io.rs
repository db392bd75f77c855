//! Micro-benchmark of member I/O: one stripe on 8 member files done as 8
//! sequential pread/pwrite calls versus one io_uring batch, for 4 KiB and
//! 128 KiB strips, with O_DIRECT on and off, in each directory given (default
//! /tmp and /dev/shm). Run by hand (see docs/BENCHMARKS.md, "Member I/O"):
//!
//!     cargo run --release --example member_io -- [--seconds S] [DIR...]
//!
//! One thread issues stripe after stripe for S seconds (default 1) per line:
//! the figure is what one engine thread gets, not what the storage can do.
//! 4 KiB strips go to random stripes, 128 KiB strips sequentially.

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use uraid::member::{
    batch, AlignedBuf, Backend, CacheMode, FileMember, IoOp, Member, OpenOptions, RingAlways,
};

const MEMBERS: usize = 8;
const MEMBER_BYTES: u64 = 64 << 20;

struct Args {
    seconds: f64,
    dirs: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 1.0,
        dirs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--seconds" {
            let value = it.next().ok_or("--seconds needs a value")?;
            args.seconds = value
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && *s <= 600.0)
                .ok_or(format!("--seconds {value:?} is not a number in (0, 600]"))?;
        } else if arg.starts_with('-') {
            return Err(format!("unknown option {arg:?}"));
        } else {
            args.dirs.push(PathBuf::from(arg));
        }
    }
    if args.dirs.is_empty() {
        args.dirs = vec![PathBuf::from("/tmp"), PathBuf::from("/dev/shm")];
    }
    Ok(args)
}

/// Member files written in full once, so that the runs overwrite allocated
/// blocks instead of measuring the file system's allocator.
fn make_members(dir: &Path) -> std::io::Result<(tempfile::TempDir, Vec<PathBuf>)> {
    let scratch = tempfile::Builder::new()
        .prefix("uraid-member-io-")
        .tempdir_in(dir)?;
    let fill = vec![0xa5u8; 1 << 20];
    let mut paths = Vec::new();
    for i in 0..MEMBERS {
        let path = scratch.path().join(format!("m{i}"));
        let mut file = std::fs::File::create(&path)?;
        for _ in 0..MEMBER_BYTES / fill.len() as u64 {
            std::io::Write::write_all(&mut file, &fill)?;
        }
        file.sync_all()?;
        paths.push(path);
    }
    Ok((scratch, paths))
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// `Member::write_at`/`read_at` on each member in turn.
    Sequential,
    /// One `batch::run_with(Backend::Uring, ..)` per stripe, every member on
    /// the ring (`RingAlways`), buffered ones too.
    Batch,
}

/// Stripes per second for one configuration.
fn measure(members: &[RingAlways], strip_bytes: usize, write: bool, way: Way, seconds: f64) -> f64 {
    let mut buffers: Vec<AlignedBuf> = (0..MEMBERS)
        .map(|i| AlignedBuf::copy_from(&vec![i as u8; strip_bytes]))
        .collect();
    let stripes = MEMBER_BYTES / strip_bytes as u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < deadline {
        // A batch of 64 stripes between clock reads keeps the clock's cost out.
        for _ in 0..64 {
            let stripe = if strip_bytes <= 4096 {
                rng.gen_range(0..stripes)
            } else {
                done % stripes
            };
            let at = stripe * strip_bytes as u64;
            match way {
                Way::Sequential => {
                    for (member, buf) in members.iter().zip(buffers.iter_mut()) {
                        if write {
                            member.write_at(buf, at).expect("write");
                        } else {
                            member.read_at(buf, at).expect("read");
                        }
                    }
                }
                Way::Batch => {
                    let mut ops: Vec<IoOp> = members
                        .iter()
                        .zip(buffers.iter_mut())
                        .map(|(member, buf)| {
                            if write {
                                IoOp::write(member, at, buf)
                            } else {
                                IoOp::read(member, at, buf)
                            }
                        })
                        .collect();
                    for result in batch::run_with(Backend::Uring, &mut ops) {
                        result.expect("batched I/O");
                    }
                }
            }
            done += 1;
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("member_io: {why}");
            std::process::exit(2);
        }
    };
    println!(
        "| dir | O_DIRECT | strip | op | sequential stripes/s | io_uring batch stripes/s | batch / sequential | batch MB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for dir in &args.dirs {
        let (_scratch, paths) = match make_members(dir) {
            Ok(made) => made,
            Err(e) => {
                eprintln!("member_io: {}: {e}", dir.display());
                std::process::exit(1);
            }
        };
        let mut seen = Vec::new();
        for cache in [CacheMode::Direct, CacheMode::Buffered] {
            let members: Vec<RingAlways> = paths
                .iter()
                .map(|p| {
                    let member = FileMember::open_with(p, OpenOptions { write: true }, cache);
                    RingAlways(member.expect("open"))
                })
                .collect();
            // tmpfs is buffered whatever was asked: measure it once.
            let direct = members[0].0.direct();
            if seen.contains(&direct) {
                continue;
            }
            seen.push(direct);
            let direct = if direct { "on" } else { "off" };
            for strip_bytes in [4096usize, 128 * 1024] {
                for write in [true, false] {
                    let sequential =
                        measure(&members, strip_bytes, write, Way::Sequential, args.seconds);
                    let batched = measure(&members, strip_bytes, write, Way::Batch, args.seconds);
                    let mb_per_s = batched * (strip_bytes * MEMBERS) as f64 / 1e6;
                    println!(
                        "| {} | {direct} | {} KiB | {} | {sequential:.0} | {batched:.0} | {:.2} | {mb_per_s:.0} |",
                        dir.display(),
                        strip_bytes / 1024,
                        if write { "write" } else { "read" },
                        batched / sequential,
                    );
                }
            }
        }
    }
}
