//! Finding an array's members among many devices, as mdadm --assemble
//! --scan does (Assemble.c): expand the candidate paths, read each one's
//! superblock, group by array UUID, and choose the members to assemble by
//! mdadm's rules. What is chosen then goes through [`super::assemble_members`],
//! which applies the kernel's rules (super_1_validate) to it as to any list
//! of members given by hand.
//!
//! Devices that do not exist, cannot be read or hold no valid superblock are
//! skipped without a word, as mdadm skips them: a scan of /proc/partitions
//! meets many of them.

use super::superblocks::read_superblock;
use crate::format::{MemberSuper, Role};
use crate::geometry::Level;
use crate::member::{CacheMode, FileMember, MemberRef, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A device that holds a superblock.
#[derive(Debug, Clone)]
pub struct Probed {
    pub path: PathBuf,
    pub sb: MemberSuper,
}

impl Probed {
    pub fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// mdadm's "superblock on %s doesn't match others - assembly aborted",
    /// with what differs.
    #[error("superblock on {device} doesn't match others ({what}) - assembly aborted")]
    Mismatch { device: String, what: String },
}

/// The paths that glob(3) gives for each pattern, in order, each once.
/// A pattern that matches nothing adds nothing.
pub fn expand_globs(patterns: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for pattern in patterns {
        let Ok(c_pattern) = std::ffi::CString::new(pattern.as_str()) else {
            continue;
        };
        // SAFETY: glob_t is plain data that glob(3) fills in; it is read
        // only after a successful return and freed with globfree.
        unsafe {
            let mut g: libc::glob_t = std::mem::zeroed();
            if libc::glob(c_pattern.as_ptr(), 0, None, &mut g) == 0 {
                for i in 0..g.gl_pathc {
                    let p = *g.gl_pathv.add(i);
                    if p.is_null() {
                        continue;
                    }
                    let bytes = std::ffi::CStr::from_ptr(p).to_bytes();
                    let path = PathBuf::from(std::ffi::OsStr::from_encoded_bytes_unchecked(bytes));
                    if !out.contains(&path) {
                        out.push(path);
                    }
                }
            }
            libc::globfree(&mut g);
        }
    }
    out
}

/// The devices of /proc/partitions (whole disks and partitions), as
/// mdadm's load_partitions lists them.
pub fn proc_partitions() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/partitions")
        .map(|text| partitions_from(&text))
        .unwrap_or_default()
}

fn partitions_from(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [major, minor, _blocks, name]
                    if major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok() =>
                {
                    Some(Path::new("/dev").join(name))
                }
                _ => None,
            }
        })
        .collect()
}

/// Reads the superblock of every path that holds one. A file or device
/// reached under two names is read once.
pub fn probe(paths: &[PathBuf]) -> Vec<Probed> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for path in paths {
        let Ok(identity) = crate::member::identity(path) else {
            continue;
        };
        if seen.contains(&identity) {
            continue;
        }
        seen.push(identity);
        let member: MemberRef = if crate::member::is_uri(path) {
            match crate::member::open(path, OpenOptions::default()) {
                Ok(member) => member,
                Err(_) => continue,
            }
        } else {
            match FileMember::open_with(path, OpenOptions::default(), CacheMode::Buffered) {
                Ok(member) => Arc::new(member),
                Err(_) => continue,
            }
        };
        if let Ok(Some(sb)) = read_superblock(&*member) {
            out.push(Probed {
                path: path.clone(),
                sb,
            });
        }
    }
    out
}

/// The devices grouped by array UUID, in the order each UUID was first met.
pub fn group_by_uuid(probed: Vec<Probed>) -> Vec<(String, Vec<Probed>)> {
    let mut groups: Vec<(String, Vec<Probed>)> = Vec::new();
    for p in probed {
        let uuid = p.sb.uuid_string();
        match groups.iter_mut().find(|(u, _)| *u == uuid) {
            Some((_, members)) => members.push(p),
            None => groups.push((uuid, vec![p])),
        }
    }
    groups
}

/// The members chosen, and what was left out and why (one line each).
#[derive(Debug, Default)]
pub struct Selection {
    pub paths: Vec<PathBuf>,
    pub left_out: Vec<String>,
}

/// What kind of superblock: md 0.90, md 1.x, or uraid's dRAID.
fn family(sb: &MemberSuper) -> &'static str {
    if Level::from_number(sb.level).is_some_and(Level::is_draid) {
        "uraid-draid"
    } else {
        sb.metadata.as_str()
    }
}

/// The role a device claims in its own superblock, if it claims one
/// (mdadm's disk.state active|sync).
fn own_active_role(sb: &MemberSuper) -> Option<u32> {
    match sb.this_role() {
        Role::Active(r) => Some(r),
        _ => None,
    }
}

/// Whether the device's role table has a working device in `role`
/// (mdadm's devmap from getinfo_super).
fn sees_role(sb: &MemberSuper, role: u32) -> bool {
    role < sb.raid_disks
        && sb
            .dev_roles
            .iter()
            .take(sb.max_dev as usize)
            .any(|r| *r as u32 == role)
}

/// Chooses among the devices of one array (one UUID) by mdadm's rules:
/// - every superblock must be of one kind (0.90, 1.0, 1.1, 1.2 or uraid's
///   dRAID) and one creation: else the assembly stops, as mdadm's does;
/// - of two devices claiming one role, the one with more events (the first
///   on a tie) is taken;
/// - the freshest device is the one with the most events among those
///   that hold a role;
/// - a device whose role table has no working device in the freshest
///   one's role was part of another history ("ignoring %s as it reports %s
///   as failed"), unless `force`;
/// - a device holding a role (or the journal) more than one event behind
///   the freshest is out of date and left out (md kicks it as non-fresh);
///   spares are taken whatever their events.
///
/// The freshest device's role table then decides the rest in assembly
/// (members it records as failed are faulty, not used).
pub fn select_members(devices: Vec<Probed>, force: bool) -> Result<Selection, ScanError> {
    let mut selection = Selection::default();
    let Some(first) = devices.first().cloned() else {
        return Ok(selection);
    };
    for d in &devices[1..] {
        let what = if family(&d.sb) != family(&first.sb) {
            Some(format!(
                "metadata {} on {}, {} on {}",
                family(&d.sb),
                d.name(),
                family(&first.sb),
                first.name()
            ))
        } else if (d.sb.ctime_secs, d.sb.ctime_micros)
            != (first.sb.ctime_secs, first.sb.ctime_micros)
        {
            Some(format!(
                "created at another time than {}: a different array with the same UUID",
                first.name()
            ))
        } else {
            None
        };
        if let Some(what) = what {
            return Err(ScanError::Mismatch {
                device: d.name(),
                what,
            });
        }
    }
    // One device per role: the one with the most events.
    let mut kept: Vec<Probed> = Vec::new();
    for d in devices {
        let holder = own_active_role(&d.sb).and_then(|role| {
            kept.iter()
                .position(|k| own_active_role(&k.sb) == Some(role))
        });
        match holder {
            Some(i) if kept[i].sb.events < d.sb.events => {
                selection.left_out.push(format!(
                    "{} holds the same role as {} with fewer events ({} < {}): left out",
                    kept[i].name(),
                    d.name(),
                    kept[i].sb.events,
                    d.sb.events
                ));
                kept[i] = d;
            }
            Some(i) => selection.left_out.push(format!(
                "{} holds the same role as {} with {} events: left out",
                d.name(),
                kept[i].name(),
                if d.sb.events == kept[i].sb.events {
                    "as many"
                } else {
                    "fewer"
                }
            )),
            None => kept.push(d),
        }
    }
    let most_recent = kept
        .iter()
        .enumerate()
        .filter(|(_, d)| own_active_role(&d.sb).is_some())
        .fold(None::<usize>, |best, (i, d)| match best {
            Some(b) if kept[b].sb.events >= d.sb.events => Some(b),
            _ => Some(i),
        });
    let max_events = kept.iter().map(|d| d.sb.events).max().unwrap_or(0);
    for (i, d) in kept.iter().enumerate() {
        let holds_role = own_active_role(&d.sb).is_some();
        if let (Some(m), true, false) = (most_recent, holds_role, force) {
            let freshest = &kept[m];
            if i != m {
                if let Some(role) = own_active_role(&freshest.sb) {
                    if !sees_role(&d.sb, role) {
                        selection.left_out.push(format!(
                            "ignoring {} as it reports {} as failed",
                            d.name(),
                            freshest.name()
                        ));
                        continue;
                    }
                }
            }
        }
        let journal = d.sb.this_role() == Role::Journal;
        if (holds_role || journal) && d.sb.events + 1 < max_events {
            selection.left_out.push(format!(
                "kicking non-fresh {} from array (events {}, the freshest {})",
                d.name(),
                d.sb.events,
                max_events
            ));
            continue;
        }
        selection.paths.push(d.path.clone());
    }
    Ok(selection)
}

/// Refuses `member` as a new member of the array `own_uuid` when joining
/// would destroy what it holds: another array's superblock (a corrupt one
/// too), a filesystem or a partition table, as create refuses them. A
/// device with this array's own superblock (one that left and comes
/// back) is not refused. The message says `--force` insists.
pub fn refuse_valuable(name: &str, member: &MemberRef, own_uuid: [u8; 16]) -> Result<(), String> {
    if let Ok(Some(sb)) = read_superblock(&**member) {
        if sb.set_uuid == own_uuid {
            return Ok(());
        }
    }
    super::create::refuse_existing_content(&super::create::Opened {
        path: name.to_string(),
        member: member.clone(),
    })
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::sb1::tests::sample;
    use crate::format::Metadata;

    fn member(path: &str, dev_number: u32, events: u64, roles: &[u16]) -> Probed {
        let mut sb = sample(Metadata::V1_2);
        sb.dev_number = dev_number;
        sb.events = events;
        sb.dev_roles = roles.to_vec();
        sb.max_dev = roles.len() as u32;
        sb.raid_disks = 3;
        Probed {
            path: PathBuf::from(path),
            sb,
        }
    }

    #[test]
    fn stale_and_split_brain_members_are_left_out() {
        const SPARE: u16 = 0xffff;
        const FAULTY: u16 = 0xfffe;
        let devices = vec![
            member("/d/c", 2, 7, &[0, 1, 2, SPARE]),
            member("/d/a", 0, 10, &[0, 1, FAULTY, SPARE]),
            member("/d/b", 1, 9, &[0, 1, FAULTY, SPARE]),
            member("/d/s", 3, 2, &[0, 1, 2, SPARE]),
        ];
        let s = select_members(devices.clone(), false).unwrap();
        let names: Vec<String> = s.paths.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(names, ["/d/a", "/d/b", "/d/s"], "{:?}", s.left_out);
        assert_eq!(
            s.left_out,
            ["kicking non-fresh /d/c from array (events 7, the freshest 10)"]
        );
        // b ran alone after a failed: a split brain.
        let mut split = devices;
        split[2] = member("/d/b", 1, 9, &[FAULTY, 1, 2, SPARE]);
        split.remove(0);
        let s = select_members(split.clone(), false).unwrap();
        assert_eq!(s.left_out, ["ignoring /d/b as it reports /d/a as failed"]);
        let s = select_members(split, true).unwrap();
        assert!(s.left_out.is_empty());
    }

    #[test]
    fn a_copy_of_a_member_with_fewer_events_is_left_out() {
        let devices = vec![
            member("/d/old", 0, 5, &[0, 1, 2]),
            member("/d/a", 0, 10, &[0, 1, 2]),
            member("/d/b", 1, 10, &[0, 1, 2]),
        ];
        let s = select_members(devices, false).unwrap();
        assert_eq!(s.paths, [PathBuf::from("/d/a"), PathBuf::from("/d/b")]);
        assert_eq!(s.left_out.len(), 1, "{:?}", s.left_out);
    }

    #[test]
    fn mixed_metadata_stops_the_assembly() {
        let a = member("/d/a", 0, 1, &[0, 1, 2]);
        let mut b = member("/d/b", 1, 1, &[0, 1, 2]);
        b.sb.metadata = Metadata::V1_0;
        let err = select_members(vec![a, b], false).unwrap_err().to_string();
        assert_eq!(
            err,
            "superblock on /d/b doesn't match others (metadata 1.0 on /d/b, 1.2 on /d/a) - assembly aborted"
        );
    }

    #[test]
    fn proc_partitions_lists_devices() {
        let text = "major minor  #blocks  name\n\n 254        0   20971520 vda\n 254        1   20970479 vda1\n   7        0     102400 loop0\n";
        assert_eq!(
            partitions_from(text),
            [
                PathBuf::from("/dev/vda"),
                PathBuf::from("/dev/vda1"),
                PathBuf::from("/dev/loop0")
            ]
        );
    }
}
