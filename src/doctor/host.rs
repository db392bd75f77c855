//! The host's checks: CPU, SIMD and the parity implementation, memory
//! (DIMMs, NUMA, room for the stripe cache), kernel interfaces (io_uring,
//! NBD, ublk), the CPU governor and I/O pressure.

use super::{ArrayNeed, Check, Status};
use crate::engine::tuning::{STRIPE_CACHE_DEFAULT, STRIPE_CACHE_PAGE};
use std::path::Path;

pub(super) fn checks(arrays: &[ArrayNeed]) -> Vec<Check> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok();
    vec![
        cpu(cpuinfo.as_deref()),
        simd(cpuinfo.as_deref()),
        parity(),
        dimms(),
        numa(),
        memory(
            std::fs::read_to_string("/proc/meminfo").ok().as_deref(),
            arrays,
        ),
        io_uring(),
        nbd(),
        ublk(),
        governor(),
        io_pressure(std::fs::read_to_string("/proc/pressure/io").ok().as_deref()),
    ]
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The first value of `key` in /proc/cpuinfo's `key : value` lines.
fn cpuinfo_field<'a>(cpuinfo: &'a str, key: &str) -> Option<&'a str> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

pub(super) fn cpu(cpuinfo: Option<&str>) -> Check {
    let Some(cpuinfo) = cpuinfo else {
        return Check::unavailable("cpu", "/proc/cpuinfo cannot be read");
    };
    let model = cpuinfo_field(cpuinfo, "model name")
        .or_else(|| cpuinfo_field(cpuinfo, "Model"))
        .unwrap_or("unknown model");
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cores: std::collections::BTreeSet<(String, String)> = cpuinfo
        .split("\n\n")
        .filter_map(|block| {
            Some((
                cpuinfo_field(block, "physical id")?.to_string(),
                cpuinfo_field(block, "core id")?.to_string(),
            ))
        })
        .collect();
    let value = if cores.is_empty() {
        format!("{model}, {cpus} CPUs")
    } else {
        format!("{model}, {cpus} CPUs, {} cores", cores.len())
    };
    if cpus < 2 {
        Check::new("cpu", Status::Warn, value)
            .because("one CPU: parity, NBD workers and the background job take turns")
            .fix("give the host (or VM) at least 2 CPUs")
    } else {
        Check::new("cpu", Status::Ok, value)
    }
}

/// The instruction sets the parity code uses, as /proc/cpuinfo names them.
const SIMD_FLAGS: [&str; 9] = [
    "ssse3",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "gfni",
    "vpclmulqdq",
    "asimd",
    "sve",
];

pub(super) fn simd(cpuinfo: Option<&str>) -> Check {
    let Some(cpuinfo) = cpuinfo else {
        return Check::unavailable("simd", "/proc/cpuinfo cannot be read");
    };
    let flags: Vec<&str> = cpuinfo_field(cpuinfo, "flags")
        .or_else(|| cpuinfo_field(cpuinfo, "Features"))
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let have: Vec<&str> = SIMD_FLAGS
        .iter()
        .copied()
        .filter(|f| flags.contains(f))
        .collect();
    let value = if have.is_empty() {
        "none".to_string()
    } else {
        have.join(" ")
    };
    let wide = have.iter().any(|f| matches!(*f, "avx2" | "asimd"));
    if wide {
        Check::new("simd", Status::Ok, value)
    } else {
        Check::new("simd", Status::Warn, value)
            .because("no AVX2 (x86-64) or NEON (aarch64): parity runs narrower kernels or the portable code")
            .fix("for parity arrays, a CPU with AVX2 or better")
    }
}

pub(super) fn parity() -> Check {
    let chosen = crate::parity::default_impl().name();
    let how = if std::env::var_os(crate::parity::ENV_VAR).is_some() {
        "forced by URAID_PARITY"
    } else {
        "the fastest in a start-up benchmark, as md's raid6_select_algo"
    };
    let best_available = crate::parity::implementations()
        .iter()
        .any(|i| i.name() != "scalar");
    if chosen == "scalar" && best_available {
        Check::new("parity", Status::Warn, chosen)
            .because(format!("{how}, while SIMD implementations run here"))
            .fix(
                "unset URAID_PARITY, or name a SIMD implementation (uraid bench parity lists them)",
            )
    } else {
        Check::new("parity", Status::Ok, chosen).because(how)
    }
}

/// DIMMs per memory controller from EDAC (no root), else from dmidecode
/// as root.
fn dimms() -> Check {
    let edac = Path::new("/sys/devices/system/edac/mc");
    if let Ok(controllers) = std::fs::read_dir(edac) {
        let mut per_mc = Vec::new();
        let mut uncorrected = 0u64;
        for mc in controllers.flatten() {
            let name = mc.file_name().to_string_lossy().to_string();
            if !name.starts_with("mc") {
                continue;
            }
            let dimms: Vec<_> = std::fs::read_dir(mc.path())
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            let n = e.file_name().to_string_lossy().to_string();
                            n.starts_with("dimm") || n.starts_with("rank")
                        })
                        .collect()
                })
                .unwrap_or_default();
            for d in &dimms {
                for file in ["dimm_ue_count", "ue_count"] {
                    uncorrected += read_trim(d.path().join(file))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                }
            }
            per_mc.push((name, dimms.len()));
        }
        if !per_mc.is_empty() {
            return dimm_verdict(&per_mc, uncorrected, "EDAC");
        }
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        if let Ok(out) = std::process::Command::new("dmidecode")
            .args(["-t", "memory"])
            .output()
        {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                let installed = dmidecode_installed(&text);
                if installed > 0 {
                    return dimm_verdict(&[("all".into(), installed)], 0, "dmidecode");
                }
            }
        }
    }
    Check::unavailable(
        "memory_dimms",
        if root {
            "no EDAC in sysfs and dmidecode gave no memory devices (a VM, or no DMI tables)"
        } else {
            "no EDAC in sysfs (a VM, or no EDAC driver), and DMI tables need root"
        },
    )
    .fix("on bare metal: load the EDAC driver of the platform, or run `uraid doctor` as root with dmidecode installed")
}

/// Memory devices with a module in them, in `dmidecode -t memory` output.
pub(super) fn dmidecode_installed(text: &str) -> usize {
    text.split("Memory Device")
        .skip(1)
        .filter(|block| {
            block.lines().any(|l| {
                let l = l.trim();
                l.starts_with("Size:") && !l.contains("No Module") && !l.contains("Not Installed")
            })
        })
        .count()
}

fn dimm_verdict(per_mc: &[(String, usize)], uncorrected: u64, source: &str) -> Check {
    let value = per_mc
        .iter()
        .map(|(mc, n)| format!("{mc}: {n} DIMM{}", if *n == 1 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join(", ");
    if uncorrected > 0 {
        return Check::new("memory_dimms", Status::Fail, value)
            .because(format!(
                "{uncorrected} uncorrected memory errors ({source})"
            ))
            .fix("replace the DIMM that EDAC names before trusting parity computed in it");
    }
    if per_mc.iter().any(|(_, n)| *n == 1) {
        return Check::new("memory_dimms", Status::Warn, value)
            .because(format!(
                "one DIMM on a memory controller ({source}): one channel, as seed 004's box that rebuilt at half speed"
            ))
            .fix("install DIMMs in pairs, in the slots the board's manual names for dual channel");
    }
    Check::new("memory_dimms", Status::Ok, value).because(source.to_string())
}

fn numa() -> Check {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/node") else {
        return Check::unavailable(
            "numa",
            "/sys/devices/system/node is absent (no NUMA support)",
        );
    };
    let mut nodes: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("node") && n[4..].parse::<u32>().is_ok())
        .collect();
    nodes.sort();
    let described: Vec<String> = nodes
        .iter()
        .map(|n| {
            let cpus =
                read_trim(format!("/sys/devices/system/node/{n}/cpulist")).unwrap_or_default();
            format!("{n} cpus {cpus}")
        })
        .collect();
    let value = format!("{} node(s): {}", nodes.len(), described.join("; "));
    if nodes.len() > 1 {
        Check::new("numa", Status::Warn, value)
            .because(
                "several NUMA nodes: members behind one node's PCIe root cost the other node a hop",
            )
            .fix(
                "keep an array's members and its `uraid serve` on one node (numactl --cpunodebind)",
            )
    } else {
        Check::new("numa", Status::Ok, value)
    }
}

/// MiB of MemAvailable in /proc/meminfo.
pub(super) fn mem_available_kib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

pub(super) fn memory(meminfo: Option<&str>, arrays: &[ArrayNeed]) -> Check {
    let Some(available) = meminfo.and_then(mem_available_kib) else {
        return Check::unavailable("memory_free", "no MemAvailable in /proc/meminfo");
    };
    // md's stripe_head holds a page of every member per entry; uraid's
    // cache is bounded the same way.
    let need_kib: u64 = arrays
        .iter()
        .map(|a| a.stripe_cache_size as u64 * a.members as u64 * STRIPE_CACHE_PAGE as u64 / 1024)
        .sum();
    let what = if arrays.is_empty() {
        format!(
            "no array given or served; one member at stripe_cache_size {STRIPE_CACHE_DEFAULT} needs {} KiB",
            STRIPE_CACHE_DEFAULT as usize * STRIPE_CACHE_PAGE / 1024
        )
    } else {
        arrays
            .iter()
            .map(|a| {
                format!(
                    "{}: {} x {} members x 4 KiB",
                    a.name, a.stripe_cache_size, a.members
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let value = format!(
        "{} MiB available, stripe cache needs {} MiB",
        available / 1024,
        need_kib.div_ceil(1024)
    );
    if need_kib > available {
        Check::new("memory_free", Status::Fail, value)
            .because(what)
            .fix("lower stripe_cache_size (uraid manage --set stripe_cache_size=N) or add memory")
    } else if need_kib * 2 > available {
        Check::new("memory_free", Status::Warn, value)
            .because(format!("{what}: more than half of what is available"))
            .fix("lower stripe_cache_size or add memory, so that the page cache keeps room")
    } else {
        Check::new("memory_free", Status::Ok, value).because(what)
    }
}

fn io_uring() -> Check {
    if let Some(disabled) = read_trim("/proc/sys/kernel/io_uring_disabled") {
        if disabled == "2" {
            return Check::new("io_uring", Status::Warn, "disabled")
                .because("kernel.io_uring_disabled = 2: member I/O falls back to pread/pwrite")
                .fix("sysctl kernel.io_uring_disabled=0");
        }
    }
    match ::io_uring::IoUring::new(8) {
        Ok(_) => Check::new("io_uring", Status::Ok, "a ring was set up"),
        Err(e) => Check::new("io_uring", Status::Warn, "unavailable")
            .because(format!("io_uring_setup: {e}; member I/O falls back to pread/pwrite"))
            .fix("a kernel 5.6 or later, io_uring not blocked by seccomp or kernel.io_uring_disabled"),
    }
}

/// Whether `module` is loaded, or can be (modinfo finds it).
fn module_state(module: &str) -> Option<&'static str> {
    if Path::new("/sys/module").join(module).exists() {
        return Some("loaded");
    }
    let known = std::process::Command::new("modinfo")
        .arg(module)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    known.then_some("available as a module, not loaded")
}

fn nbd() -> Check {
    match module_state("nbd") {
        Some("loaded") => Check::new("nbd", Status::Ok, "loaded")
            .because("the kernel's NBD client can attach /dev/nbdN to uraid's export"),
        Some(state) => Check::new("nbd", Status::Ok, state)
            .because("the kernel's NBD client is there when needed")
            .fix("modprobe nbd (before nbd-client or qemu-nbd --connect)"),
        None => Check::new("nbd", Status::Warn, "absent")
            .because("no nbd module: the export is reached by user-space clients only (nbdfuse, qemu, libnbd)")
            .fix("a kernel built with CONFIG_BLK_DEV_NBD"),
    }
}

fn ublk() -> Check {
    let control = Path::new("/dev/ublk-control").exists();
    match module_state("ublk_drv") {
        Some("loaded") | None if control => {
            Check::new("ublk", Status::Ok, "loaded, /dev/ublk-control present")
        }
        Some("loaded") => Check::new("ublk", Status::Warn, "loaded, no /dev/ublk-control")
            .because("the module is loaded but its control device is missing")
            .fix("check udev and the permissions of /dev/ublk-control"),
        Some(state) => Check::new("ublk", Status::Ok, state).fix("modprobe ublk_drv"),
        None => Check::new("ublk", Status::Warn, "absent")
            .because("no ublk_drv: a block device from user space needs NBD instead")
            .fix("a kernel 6.0 or later built with CONFIG_BLK_DEV_UBLK"),
    }
}

fn governor() -> Check {
    let Ok(cpus) = std::fs::read_dir("/sys/devices/system/cpu") else {
        return Check::unavailable("cpu_governor", "/sys/devices/system/cpu cannot be read");
    };
    let mut governors: Vec<String> = cpus
        .flatten()
        .filter_map(|c| read_trim(c.path().join("cpufreq/scaling_governor")))
        .collect();
    governors.sort();
    governors.dedup();
    governor_verdict(&governors)
}

pub(super) fn governor_verdict(governors: &[String]) -> Check {
    if governors.is_empty() {
        return Check::unavailable(
            "cpu_governor",
            "no cpufreq in sysfs: a VM, or frequency left to the firmware",
        );
    }
    let value = governors.join(", ");
    if governors.iter().all(|g| g == "performance") {
        Check::new("cpu_governor", Status::Ok, value)
    } else {
        Check::new("cpu_governor", Status::Warn, value)
            .because("a governor other than performance slows parity and small I/O until the clock ramps up")
            .fix("cpupower frequency-set -g performance (or tuned-adm profile throughput-performance)")
    }
}

pub(super) fn io_pressure(text: Option<&str>) -> Check {
    let Some(text) = text else {
        return Check::unavailable(
            "io_pressure",
            "/proc/pressure/io is absent (PSI off: psi=1 on the kernel command line)",
        );
    };
    let field = |line: &str, key: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    };
    let Some(some) = text.lines().find(|l| l.starts_with("some")) else {
        return Check::unavailable("io_pressure", "/proc/pressure/io has no 'some' line");
    };
    let (Some(avg10), Some(avg60)) = (field(some, "avg10"), field(some, "avg60")) else {
        return Check::unavailable("io_pressure", "/proc/pressure/io cannot be read");
    };
    let value = format!("some avg10={avg10:.2}% avg60={avg60:.2}%");
    if avg60 >= 25.0 {
        Check::new("io_pressure", Status::Warn, value)
            .because("tasks waited for I/O a quarter of the last minute: the disks are busy")
            .fix("find the load (iostat -x 1, or uraid status) before benchmarking or rebuilding")
    } else {
        Check::new("io_pressure", Status::Ok, value)
    }
}
