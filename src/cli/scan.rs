//! `--scan`: arrays found among many devices by their superblocks, as
//! mdadm's --examine --scan and --assemble --scan find them: the ARRAY
//! lines of `examine --scan`, and the members `serve --scan` assembles by
//! UUID or name, with the knobs of the config's SYSFS lines.

use super::CliResult;
use crate::array::scan::{self, Probed};
use crate::config::{self, Config, DevicePattern, Knob};
use crate::format::{MemberSuper, Metadata, Role};
use std::path::{Path, PathBuf};

/// The devices the config says to search: its DEVICE lines, or with none
/// the devices of /proc/partitions (mdadm's `DEVICE partitions containers`).
pub fn candidate_paths(config: &Config) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let patterns = if config.devices.is_empty() {
        vec![DevicePattern::Partitions]
    } else {
        config.devices.clone()
    };
    for pattern in patterns {
        let found = match pattern {
            DevicePattern::Glob(g) => scan::expand_globs(&[g]),
            DevicePattern::Partitions => scan::proc_partitions(),
            DevicePattern::Containers => Vec::new(),
        };
        for path in found {
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

fn load(path: Option<&Path>) -> Result<Config, String> {
    Config::load_or_default(path).map_err(|e| e.to_string())
}

/// An ARRAY line's tags as data: what `examine --scan --json` and
/// `detail --scan --json` print, one object per array.
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct ArrayLine {
    /// The md device the line names (`/dev/md/NAME`, `/dev/mdN`); none
    /// for an array without a name.
    pub device: Option<String>,
    pub level: Option<String>,
    pub num_devices: u64,
    /// `1.0`, `1.1`, `1.2`, `0.90` or `uraid-draid`.
    pub metadata: String,
    pub spares: u64,
    pub uuid: String,
    /// The devices by their canonical names, as `devices=` lists them.
    pub devices: Vec<String>,
}

/// `uraid examine --scan [-v] [--json] [DEV...]`: one ARRAY line per array
/// found, as `mdadm --examine --scan` prints them. The devices given are
/// named by their canonical names, as DEVICE globs and served arrays name
/// them, so that a `devices=` tag matches wherever the line is used.
pub fn run_examine(
    devices: &[PathBuf],
    verbose: bool,
    json: bool,
    config: Option<&Path>,
) -> CliResult {
    let candidates: Vec<PathBuf> = if devices.is_empty() {
        candidate_paths(&load(config)?)
    } else {
        devices
            .iter()
            .map(|d| PathBuf::from(crate::member::canonical_name(d)))
            .collect()
    };
    let probed = scan::probe(&candidates);
    if json {
        let lines: Vec<ArrayLine> = group_arrays(&probed)
            .iter()
            .map(|a| examine_line(a.sb, &a.devices, a.spares))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&lines).expect("serializable")
        );
    } else {
        print!("{}", brief_examine(&probed, verbose));
    }
    Ok(())
}

/// mdadm's compare_super: devices of one array have the same UUID and the
/// same creation and shape in their superblocks; a device that differs
/// gets a line of its own.
fn same_array(a: &MemberSuper, b: &MemberSuper) -> bool {
    let version_one = a.metadata != Metadata::V0_90;
    config::metadata_text(a).starts_with('0') == config::metadata_text(b).starts_with('0')
        && is_draid(a) == is_draid(b)
        && a.set_uuid == b.set_uuid
        && (a.ctime_secs, a.ctime_micros) == (b.ctime_secs, b.ctime_micros)
        && a.level == b.level
        && a.size_sectors == b.size_sectors
        && a.raid_disks == b.raid_disks
        && (!version_one || (a.layout == b.layout && a.chunk_sectors == b.chunk_sectors))
}

fn is_draid(sb: &MemberSuper) -> bool {
    config::metadata_text(sb) == "uraid-draid"
}

/// Whether mdadm's getinfo_super marks the device in sync (a spare, a
/// faulty device and a journal are not; mdadm counts them as spares=).
fn in_sync(sb: &MemberSuper) -> bool {
    match &sb.v090 {
        Some(extra) => extra.this_disk.state & (1 << crate::format::sb090::MD_DISK_SYNC) != 0,
        None => matches!(sb.this_role(), Role::Active(_)),
    }
}

/// One array among the devices examined: the first device's superblock,
/// every device's name, and how many are not in sync.
struct Entry<'a> {
    sb: &'a MemberSuper,
    devices: Vec<String>,
    spares: usize,
}

/// The devices grouped into arrays by mdadm's compare_super, in the
/// reverse order of their first device, as mdadm prepends each new one to
/// its list.
fn group_arrays(devices: &[Probed]) -> Vec<Entry<'_>> {
    let mut arrays: Vec<Entry> = Vec::new();
    for d in devices {
        let i = match arrays.iter().position(|a| same_array(a.sb, &d.sb)) {
            Some(i) => i,
            None => {
                arrays.push(Entry {
                    sb: &d.sb,
                    devices: Vec::new(),
                    spares: 0,
                });
                arrays.len() - 1
            }
        };
        arrays[i].devices.push(d.name());
        if !in_sync(&d.sb) {
            arrays[i].spares += 1;
        }
    }
    arrays.reverse();
    arrays
}

/// The text of `mdadm --examine --scan` (Examine.c with `brief`) for these
/// devices.
pub fn brief_examine(devices: &[Probed], verbose: bool) -> String {
    let mut out = String::new();
    for a in group_arrays(devices) {
        out.push_str(&brief_line(a.sb, verbose));
        out.push('\n');
        if a.spares > 0 {
            out.push_str(&format!("   spares={}", a.spares));
        }
        if verbose {
            out.push_str(&format!("   devices={}", a.devices.join(",")));
        }
        if a.spares > 0 || verbose {
            out.push('\n');
        }
    }
    out
}

/// One ARRAY line (without its newline), as mdadm's brief_examine_super0
/// and brief_examine_super1 print it, spaces included (a name is followed
/// by two). uraid's dRAID members get `metadata=uraid-draid`, which mdadm's
/// config parser does not know: it warns and skips the tag, and finds no
/// md superblock on the devices, so it never assembles them.
///
/// mdadm 4.2 also printed ` name=<set_name>` at the end of a version-1
/// line; 4.3 dropped it (and ignores name= in ARRAY lines): uraid prints
/// what current mdadm prints.
pub fn brief_line(sb: &MemberSuper, verbose: bool) -> String {
    let level = config::level_text(sb.level);
    if let Some(extra) = &sb.v090 {
        let mut o = format!("ARRAY /dev/md{}", extra.md_minor);
        if verbose {
            o.push_str(&format!(
                " level={} num-devices={}",
                level.unwrap_or("-unknown-"),
                sb.raid_disks
            ));
        }
        o.push_str(&format!(" UUID={}", sb.uuid_string()));
        return o;
    }
    let mut o = String::from("ARRAY ");
    if let Some(name) = md_name(sb) {
        o.push_str(&format!("/dev/md/{name} "));
    }
    if let (true, Some(level)) = (verbose, level) {
        o.push_str(&format!(" level={level}"));
    }
    o.push_str(&format!(" metadata={} ", metadata_tag(sb)));
    if verbose {
        o.push_str(&format!("num-devices={} ", sb.raid_disks));
    }
    o.push_str(&format!("UUID={}", sb.uuid_string()));
    o
}

/// The tags `brief_line` prints, as data.
fn examine_line(sb: &MemberSuper, devices: &[String], spares: usize) -> ArrayLine {
    let device = match &sb.v090 {
        Some(extra) => Some(format!("/dev/md{}", extra.md_minor)),
        None => md_name(sb).map(|name| format!("/dev/md/{name}")),
    };
    ArrayLine {
        device,
        level: config::level_text(sb.level).map(str::to_string),
        num_devices: u64::from(sb.raid_disks),
        metadata: metadata_tag(sb).to_string(),
        spares: spares as u64,
        uuid: sb.uuid_string(),
        devices: devices.to_vec(),
    }
}

/// The name of a version-1 array's md device: its name without the host.
fn md_name(sb: &MemberSuper) -> Option<&str> {
    match sb.set_name.split_once(':') {
        Some((_, short)) => Some(short),
        None if !sb.set_name.is_empty() => Some(sb.set_name.as_str()),
        None => None,
    }
}

/// The `metadata=` value of an array's line.
fn metadata_tag(sb: &MemberSuper) -> &'static str {
    if sb.v090.is_some() {
        "0.90"
    } else if is_draid(sb) {
        "uraid-draid"
    } else if sb.super_offset_sectors <= 4 {
        "1.1"
    } else if sb.super_offset_sectors <= 8 {
        "1.2"
    } else {
        "1.0"
    }
}

/// Which array `serve --scan` is to serve.
pub enum Wanted<'a> {
    Uuid(&'a str),
    Name(&'a str),
    /// Every array found: serve runs one per process, so this lists them.
    All,
}

/// What `serve --scan` found: the members to assemble and the knobs of
/// the config's SYSFS lines for the array, in the order to apply them.
pub struct Found {
    pub paths: Vec<PathBuf>,
    pub knobs: Vec<Knob>,
}

/// Finds the members of the wanted array among the config's devices (or
/// `devices`, when given), by mdadm's rules; prints what is left out.
pub fn find_for_serve(
    wanted: Wanted,
    config_path: Option<&Path>,
    devices: &[PathBuf],
    force: bool,
) -> Result<Found, String> {
    let config = load(config_path)?;
    let (candidates, searched) = if devices.is_empty() {
        let searched = if config.devices.is_empty() {
            "/proc/partitions (no DEVICE line)".to_string()
        } else {
            format!("the DEVICE lines of {}", config.origin)
        };
        (candidate_paths(&config), searched)
    } else {
        (devices.to_vec(), "the devices given".to_string())
    };
    let probed = scan::probe(&candidates);
    let searched = format!("{} devices of {searched}", candidates.len());
    // The UUID is the array's identity: given, or on the ARRAY line that
    // names the array; else the name picks the superblocks.
    let (line, target, by_uuid) = match wanted {
        Wanted::All => return Err(list_all(&config, probed, &searched)),
        Wanted::Uuid(text) => {
            let uuid = config::normalize_uuid(text)
                .ok_or_else(|| format!("--uuid {text}: not a UUID (32 hex digits)"))?;
            let line = config
                .arrays
                .iter()
                .find(|a| a.uuid.as_deref() == Some(&uuid));
            (line, format!("UUID {uuid}"), Some(uuid))
        }
        Wanted::Name(name) => {
            let line = config.arrays.iter().find(|a| a.names(name));
            (
                line,
                format!("name {name}"),
                line.and_then(|l| l.uuid.clone()),
            )
        }
    };
    let matching: Vec<Probed> = probed
        .into_iter()
        .filter(|p| match (&by_uuid, &wanted) {
            (Some(u), _) => p.sb.uuid_string() == *u,
            (None, Wanted::Name(n)) => config::name_matches(&p.sb.set_name, n),
            _ => false,
        })
        .collect();
    let mut groups = scan::group_by_uuid(matching);
    match groups.len() {
        0 => return Err(format!("no array with {target} found among {searched}")),
        1 => {}
        _ => {
            let list: Vec<String> = groups
                .iter()
                .map(|(uuid, members)| format!("{uuid} ({})", members[0].name()))
                .collect();
            return Err(format!(
                "{target} matches {} arrays: {}; choose one with --uuid",
                groups.len(),
                list.join(", ")
            ));
        }
    }
    let (uuid, mut members) = groups.remove(0);
    let line = line.or_else(|| {
        config
            .arrays
            .iter()
            .find(|a| a.uuid.as_deref() == Some(uuid.as_str()))
    });
    if let Some(line) = line {
        if line.ignore {
            return Err(format!(
                "array {uuid} is marked <ignore> at {}:{}",
                config.origin, line.line
            ));
        }
        members.retain(|p| match line.mismatch(&p.name(), &p.sb) {
            Some(why) => {
                eprintln!("uraid: {why}");
                false
            }
            None => true,
        });
        if members.is_empty() {
            return Err(format!(
                "no device of array {uuid} matches the ARRAY line at {}:{}",
                config.origin, line.line
            ));
        }
    }
    let set_name = members[0].sb.set_name.clone();
    let selection = scan::select_members(members, force).map_err(|e| e.to_string())?;
    for message in &selection.left_out {
        eprintln!("uraid: {message}");
    }
    Ok(Found {
        paths: selection.paths,
        knobs: config.sysfs_for(&uuid, &set_name),
    })
}

/// `--all`: serve runs one array per process (a template unit per array is
/// the model), so it names the arrays to serve each with --uuid.
fn list_all(config: &Config, probed: Vec<Probed>, searched: &str) -> String {
    let groups = scan::group_by_uuid(probed);
    let listed: Vec<String> = groups
        .iter()
        .filter(|(_, members)| {
            let idents = &config.arrays;
            let ignored = idents
                .iter()
                .any(|a| a.ignore && a.mismatch(&members[0].name(), &members[0].sb).is_none());
            let wanted = idents.iter().all(|a| a.ignore)
                || idents
                    .iter()
                    .any(|a| !a.ignore && a.mismatch(&members[0].name(), &members[0].sb).is_none());
            !ignored && wanted
        })
        .map(|(uuid, members)| {
            let name = members[0].sb.set_name.as_str();
            if name.is_empty() {
                uuid.clone()
            } else {
                format!("{uuid} ({name})")
            }
        })
        .collect();
    if listed.is_empty() {
        return format!("--all: no array found among {searched}");
    }
    format!(
        "serve runs one array per process: serve each with --scan --uuid UUID \
         (a unit per array); found: {}",
        listed.join(", ")
    )
}

/// The config's knobs as `--set` settings, and the speed limits.
pub fn split_knobs(knobs: &[Knob]) -> (Vec<(String, String)>, Option<u64>, Option<u64>) {
    let mut settings: Vec<(String, String)> = Vec::new();
    let (mut min, mut max) = (None, None);
    for knob in knobs {
        match knob {
            Knob::Tuning { key, value } => {
                settings.retain(|(k, _)| k != key);
                settings.push((key.clone(), value.clone()));
            }
            Knob::SyncSpeedMin(v) => min = *v,
            Knob::SyncSpeedMax(v) => max = *v,
        }
    }
    (settings, min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probed(path: &str, sb: MemberSuper) -> Probed {
        Probed {
            path: PathBuf::from(path),
            sb,
        }
    }

    #[test]
    fn version_090_lines_name_the_minor_and_count_spares() {
        let sb = crate::format::sb090::tests::sample();
        let minor = sb.v090.as_ref().unwrap().md_minor;
        let uuid = sb.uuid_string();
        let mut spare = sb.clone();
        let extra = spare.v090.as_mut().unwrap();
        extra.this_disk.state = 0;
        let text = brief_examine(&[probed("/a", sb.clone()), probed("/b", spare)], false);
        assert_eq!(
            text,
            format!("ARRAY /dev/md{minor} UUID={uuid}\n   spares=1\n")
        );
        let text = brief_examine(&[probed("/a", sb.clone())], true);
        assert_eq!(
            text,
            format!(
                "ARRAY /dev/md{minor} level=raid1 num-devices={} UUID={uuid}\n   devices=/a\n",
                sb.raid_disks
            )
        );
    }

    #[test]
    fn version_one_lines_follow_mdadm_spacing() {
        let mut sb = crate::format::sb1::tests::sample(Metadata::V1_2);
        let uuid = sb.uuid_string();
        sb.set_name = "host:data".into();
        assert_eq!(
            brief_line(&sb, false),
            format!("ARRAY /dev/md/data  metadata=1.2 UUID={uuid}")
        );
        sb.set_name = String::new();
        assert_eq!(
            brief_line(&sb, true),
            format!(
                "ARRAY  level=raid5 metadata=1.2 num-devices={} UUID={uuid}",
                sb.raid_disks
            )
        );
        // Two creations under one UUID are two arrays, the later first.
        let mut other = sb.clone();
        other.ctime_secs += 1;
        other.set_name = "x".into();
        let text = brief_examine(&[probed("/a", sb), probed("/b", other)], false);
        assert!(text.starts_with("ARRAY /dev/md/x  metadata=1.2"), "{text}");
        assert_eq!(text.lines().count(), 2);
    }
}
