//! `uraid zero-superblock`: mdadm --zero-superblock. Erases every md
//! superblock (0.90, 1.0, 1.1, 1.2) and uraid's dRAID label a device holds,
//! so that neither uraid, mdadm nor the kernel takes it for a member again.
//!
//! Every device is checked before any is written: a member of a served
//! array, a device in use, or a device without a superblock refuses the
//! whole command and nothing changes.

use super::CliResult;
use crate::array::read_superblock;
use crate::control::registry;
use crate::format::{self, Metadata, DRAID_SB_MAGIC, MD_SB_MAGIC};
use crate::member::{Identity, Member, MemberRef, OpenOptions};
use crate::units::SECTOR_BYTES;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ZeroArgs {
    /// Pass over a device that holds no superblock (it is left as it is)
    /// instead of refusing the command.
    #[arg(long)]
    force: bool,
    /// The devices or image files to erase the superblocks of.
    #[arg(required = true, value_name = "DEVICE")]
    devices: Vec<PathBuf>,
}

/// The bytes md reads and writes at a superblock location.
const SUPERBLOCK_BYTES: usize = 4096;

/// A superblock found on a device: which kind, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Found {
    kind: &'static str,
    sector: u64,
}

/// A device checked and held open (its exclusive claim taken), with the
/// superblocks to erase.
struct Planned {
    path: PathBuf,
    member: MemberRef,
    found: Vec<Found>,
}

pub fn run(args: &ZeroArgs) -> CliResult {
    let served = registry::list();
    let mut planned: Vec<Planned> = Vec::new();
    let mut identities: Vec<Identity> = Vec::new();
    for path in &args.devices {
        let identity = crate::member::identity(path).map_err(|e| e.to_string())?;
        if identities.contains(&identity) {
            return Err(format!("{}: named twice", path.display()));
        }
        refuse_served(path, &identity, &served)?;
        // The write open takes the claim a server holds on its members (a
        // lock on a file, O_EXCL on a device): one that serves it without
        // a registry entry refuses here.
        let member =
            crate::member::open(path, OpenOptions { write: true }).map_err(|e| e.to_string())?;
        let found = find_superblocks(&*member).map_err(|e| format!("{}: {e}", path.display()))?;
        if found.is_empty() && !args.force {
            return Err(format!(
                "{}: Unrecognised md component device: no md or uraid superblock \
                 (--force passes over it)",
                path.display()
            ));
        }
        identities.push(identity);
        planned.push(Planned {
            path: path.clone(),
            member,
            found,
        });
    }
    for device in &planned {
        erase(device)?;
    }
    Ok(())
}

/// Refuses a device that a running server holds, by the registry's member
/// lists (which also cover a server that opened its members read-only).
fn refuse_served(path: &Path, identity: &Identity, served: &[registry::Entry]) -> CliResult {
    let holder = served.iter().find(|entry| {
        entry
            .members
            .iter()
            .any(|m| crate::member::identity(Path::new(m)).is_ok_and(|other| other == *identity))
    });
    match holder {
        Some(entry) => Err(format!(
            "{}: a member of {}, served by pid {}: stop it first (uraid stop {})",
            path.display(),
            entry.md_device(),
            entry.pid,
            entry.label
        )),
        None => Ok(()),
    }
}

/// Every location where md or uraid keeps a superblock and one begins:
/// the magic alone counts, so that a damaged superblock, which uraid and
/// the kernel refuse to use but still recognise, is erased too.
fn find_superblocks(member: &dyn Member) -> std::io::Result<Vec<Found>> {
    let device_sectors = member.size_sectors();
    let mut found: Vec<Found> = Vec::new();
    for metadata in [
        Metadata::V1_2,
        Metadata::V1_1,
        Metadata::V1_0,
        Metadata::V0_90,
    ] {
        let Some(sector) = format::superblock_offset_sectors(metadata, device_sectors) else {
            continue;
        };
        if sector * SECTOR_BYTES + SUPERBLOCK_BYTES as u64 > member.size_bytes()
            || found.iter().any(|f| f.sector == sector)
        {
            continue;
        }
        let mut block = vec![0u8; SUPERBLOCK_BYTES];
        member.read_at(&mut block, sector * SECTOR_BYTES)?;
        let magic = u32::from_le_bytes(block[0..4].try_into().expect("four bytes"));
        let kind = match magic {
            MD_SB_MAGIC => metadata.as_str(),
            DRAID_SB_MAGIC => "uraid dRAID",
            _ => continue,
        };
        found.push(Found { kind, sector });
    }
    Ok(found)
}

/// Zeroes each superblock found, makes it durable, and checks that none
/// is found any more.
fn erase(device: &Planned) -> CliResult {
    let name = device.path.display();
    if device.found.is_empty() {
        eprintln!("uraid: {name}: no superblock, left as it is");
        return Ok(());
    }
    let zeroes = vec![0u8; SUPERBLOCK_BYTES];
    for found in &device.found {
        device
            .member
            .write_at(&zeroes, found.sector * SECTOR_BYTES)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    device.member.flush().map_err(|e| format!("{name}: {e}"))?;
    let left = find_superblocks(&*device.member).map_err(|e| format!("{name}: {e}"))?;
    let decoded = read_superblock(&*device.member).map_err(|e| e.to_string())?;
    if !left.is_empty() || decoded.is_some() {
        return Err(format!(
            "{name}: a superblock is still found after zeroing: the device does not keep what \
             is written to it"
        ));
    }
    let kinds: Vec<String> = device
        .found
        .iter()
        .map(|f| format!("{} (sector {})", f.kind, f.sector))
        .collect();
    eprintln!("uraid: {name}: zeroed the superblock {}", kinds.join(", "));
    Ok(())
}
