use super::host::*;
use super::queue::advise;
use super::*;

#[test]
fn memory_weighs_the_stripe_cache_against_what_is_available() {
    let meminfo = "MemTotal: 4000000 kB\nMemAvailable: 1048576 kB\n";
    assert_eq!(mem_available_kib(meminfo), Some(1048576));
    let array = |size: u32, members: usize| ArrayNeed {
        name: "a".into(),
        members,
        stripe_cache_size: size,
    };
    // 256 x 4 x 4 KiB = 4 MiB of 1 GiB.
    assert_eq!(memory(Some(meminfo), &[array(256, 4)]).status, Status::Ok);
    // 32768 x 6 x 4 KiB = 768 MiB: more than half.
    assert_eq!(
        memory(Some(meminfo), &[array(32768, 6)]).status,
        Status::Warn
    );
    // 32768 x 12 x 4 KiB = 1.5 GiB: more than there is.
    assert_eq!(
        memory(Some(meminfo), &[array(32768, 12)]).status,
        Status::Fail
    );
    assert_eq!(memory(None, &[]).status, Status::Unavailable);
}

#[test]
fn governor_pressure_and_dimms() {
    assert_eq!(governor_verdict(&[]).status, Status::Unavailable);
    assert_eq!(governor_verdict(&["performance".into()]).status, Status::Ok);
    assert_eq!(governor_verdict(&["powersave".into()]).status, Status::Warn);
    let psi = "some avg10=0.00 avg60=1.89 avg300=8.84 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.25 total=2\n";
    assert_eq!(io_pressure(Some(psi)).status, Status::Ok);
    let busy = "some avg10=80.00 avg60=60.00 avg300=8.84 total=1\n";
    assert_eq!(io_pressure(Some(busy)).status, Status::Warn);
    assert_eq!(io_pressure(None).status, Status::Unavailable);
    let dmi = "Handle 0x1\nMemory Device\n\tSize: 16 GB\n\tLocator: A1\n\nMemory Device\n\tSize: No Module Installed\n";
    assert_eq!(dmidecode_installed(dmi), 1);
}

#[test]
fn cpu_and_simd_from_cpuinfo() {
    let cpuinfo = "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu ssse3 avx2 gfni\n\n";
    assert!(cpu(Some(cpuinfo)).value.starts_with("Test CPU"));
    let simd_check = simd(Some(cpuinfo));
    assert_eq!(simd_check.status, Status::Ok);
    assert_eq!(simd_check.value, "ssse3 avx2 gfni");
    assert_eq!(simd(Some("flags : fpu\n")).status, Status::Warn);
    assert_eq!(simd(None).status, Status::Unavailable);
}

#[test]
fn queue_advice() {
    let check = |attr: &str, value: &str, rot: bool| advise("c".into(), attr, value, rot).status;
    assert_eq!(
        check("scheduler", "none [mq-deadline] kyber bfq", true),
        Status::Ok
    );
    assert_eq!(check("scheduler", "[none] mq-deadline", true), Status::Warn);
    assert_eq!(check("scheduler", "[none] mq-deadline", false), Status::Ok);
    assert_eq!(check("read_ahead_kb", "8192", false), Status::Ok);
    assert_eq!(check("read_ahead_kb", "0", false), Status::Warn);
    assert_eq!(check("max_sectors_kb", "128", false), Status::Warn);
    assert_eq!(check("nr_requests", "32", false), Status::Warn);
    assert_eq!(check("write_cache", "write back", false), Status::Ok);
}
