//! The array's side of the integrity layer (`member::integrity`): where a
//! member's checksum region lies given its superblock, which members of an
//! assembly carry one, and whether their checksums can be trusted as found.
//!
//! The region follows md's data area (data_offset + data_size) and exists
//! only with metadata 1.1 and 1.2, whose superblock sits at the start: md
//! reads and writes nothing past the data area there, so the kernel
//! assembles the array and reads the same bytes. With 0.90 and 1.0 the
//! superblock sits at the end, where the region would have to go.
//!
//! Trust. A member closed cleanly by uraid records md's event count at
//! that moment; when its superblock says more at the next start, something
//! else (the kernel's md, another tool) has run the array since, and no
//! checksum of it is trusted until a pass over the rows derives them again
//! where the row's parity agrees. A member not closed cleanly (kill -9, a
//! power cut) may have rows in flight whose checksum pages were not
//! written: the engine untrusts those rows (the bitmap's dirty ones, or all)
//! and the resync that follows derives them.

use crate::format::{MemberSuper, Metadata};
use crate::member::{IntegrityHeader, IntegrityLayout, IntegrityMember, MemberRef};
use crate::units::SECTOR_BYTES;
use std::sync::Arc;

/// The only scheme there is; the name `create --integrity` takes.
pub const INTEGRITY_SCHEME: &str = "crc32c";

/// Where the checksum region of a member with this superblock lies, when
/// its metadata leaves room after the data area.
pub fn layout_of(sb: &MemberSuper) -> Option<IntegrityLayout> {
    match sb.metadata {
        Metadata::V1_1 | Metadata::V1_2 => Some(IntegrityLayout::after_data(
            sb.data_offset_sectors * SECTOR_BYTES,
            sb.data_size_sectors * SECTOR_BYTES,
        )),
        _ => None,
    }
}

/// How far a member's checksums can be trusted as opened.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Trust {
    /// Closed cleanly by uraid at the event count its superblock holds.
    Kept,
    /// Closed cleanly, but the array ran elsewhere since (the superblock's
    /// event count moved on): every checksum is stale.
    Stale { closed_at: u64, now: u64 },
    /// Not closed cleanly: the rows that were in flight are in doubt.
    Unclean,
}

/// A member opened with its checksum region.
#[derive(Clone)]
pub struct IntegrityOpened {
    pub path: String,
    pub member: Arc<IntegrityMember>,
    pub trust: Trust,
}

impl Trust {
    fn of(header: &IntegrityHeader, sb: &MemberSuper) -> Trust {
        match (header.clean, header.events == sb.events) {
            (true, true) => Trust::Kept,
            (true, false) => Trust::Stale {
                closed_at: header.events,
                now: sb.events,
            },
            (false, _) => Trust::Unclean,
        }
    }
}

/// Opens the checksum region of a member, when it has one: the member the
/// array then uses (the layer over `member`) and how it was found. A region
/// that is there but unreadable, or names another array or device, is an
/// error that stops the assembly: serving without it would silently drop
/// the protection the array was made with.
pub fn open_member(
    path: &str,
    member: MemberRef,
    sb: &MemberSuper,
) -> Result<(MemberRef, Option<IntegrityOpened>), String> {
    let Some(layout) = layout_of(sb) else {
        return Ok((member, None));
    };
    if layout.end_bytes() > member.size_bytes() {
        return Ok((member, None));
    }
    let opened = IntegrityMember::open(member.clone(), layout, sb.set_uuid, sb.device_uuid)
        .map_err(|e| format!("{path}: checksum region: {e}"))?;
    let Some((integrity, header)) = opened else {
        return Ok((member, None));
    };
    let trust = Trust::of(&header, sb);
    // Untrusted here, before anything reads through the layer; the crash
    // window is the engine's to untrust (it knows the bitmap).
    if matches!(trust, Trust::Stale { .. }) {
        integrity.untrust_all();
        // Past the size the array uses md writes nothing: what is there
        // is uraid's own and keeps its checksums (no check would derive it).
        derive_unused(&integrity, sb).map_err(|e| format!("{path}: checksum region: {e}"))?;
    }
    let opened = IntegrityOpened {
        path: path.to_string(),
        member: integrity.clone(),
        trust,
    };
    Ok((integrity as MemberRef, Some(opened)))
}

/// Writes a new checksum region on a member whose superblock was just
/// made, and returns the layer over it (every block untrusted: the caller
/// derives them).
pub fn format_member(member: MemberRef, sb: &MemberSuper) -> Result<Arc<IntegrityMember>, String> {
    let layout = layout_of(sb).ok_or_else(|| {
        format!(
            "--integrity needs metadata 1.1 or 1.2 (the checksums live after md's data area); \
             this array has {}",
            sb.metadata
        )
    })?;
    IntegrityMember::format(member, layout, sb.set_uuid, sb.device_uuid, sb.events)
        .map_err(|e| format!("{}: writing the checksum region: {e}", sb_name(sb)))
}

fn sb_name(sb: &MemberSuper) -> String {
    format!("device {}", sb.dev_number)
}

/// Gives checksums to the blocks of md's data area past the size the
/// array uses (`size_sectors`, md's used device size: the rounding to whole
/// chunks, and a dRAID's spare metadata): no row covers them, so no pass
/// would derive them, and a new member would report them untrusted for
/// ever. Read as they are: nothing but uraid's own metadata is kept there.
pub fn derive_unused(integrity: &IntegrityMember, sb: &MemberSuper) -> std::io::Result<()> {
    let layout = integrity.layout();
    let block = crate::member::INTEGRITY_BLOCK_BYTES;
    let start = (sb.data_offset_sectors + sb.size_sectors) * SECTOR_BYTES;
    let start = start.div_ceil(block) * block;
    let end = layout.data_start_bytes + layout.data_bytes;
    let mut buf = crate::member::AlignedBuf::zeroed(1 << 20);
    let mut at = start;
    while at < end {
        let len = (end - at).min(buf.len() as u64) as usize;
        integrity.inner().read_at(&mut buf[..len], at)?;
        integrity.derive(at, &buf[..len]);
        at += len as u64;
    }
    Ok(())
}

/// The sectors of a device of `device_sectors` that md may be given when
/// the rest keeps the checksums of what it is given.
pub fn usable_sectors(device_sectors: u64) -> Option<u64> {
    IntegrityLayout::usable_bytes(device_sectors * SECTOR_BYTES).map(|b| b / SECTOR_BYTES)
}

/// Gives an existing array checksums (`uraid integrity crc32c`), offline:
/// each member's md data area is cut to what the array uses plus the
/// region (refused, changing nothing, where a member has no room), the
/// regions are written, and a check over every row derives the checksums
/// where the row's parity agrees. Rows that disagree stay untrusted (a
/// repair, then a check, gives them theirs). Returns what it did.
pub fn enable(members: Vec<(String, MemberRef)>) -> Result<String, String> {
    let array = super::assemble_members(members).map_err(|e| e.to_string())?;
    refuse_unfit(&array)?;
    let mut planned = Vec::new();
    for device in &array.devices {
        let sb = &device.sb;
        let used = sb.data_offset_sectors + sb.size_sectors;
        let room = usable_sectors(device.member.size_sectors()).unwrap_or(0);
        if room < used {
            return Err(format!(
                "{}: no room for checksums: the array uses {used} of its {} sectors and the \
                 checksums need {} more; shrink the array (manage --grow --size) first",
                device.path,
                device.member.size_sectors(),
                used - room
            ));
        }
        let mut sb = sb.clone();
        sb.data_size_sectors = room - sb.data_offset_sectors;
        planned.push((device.path.clone(), device.member.clone(), sb));
    }
    // Every member was checked: only now is anything written.
    for (path, member, sb) in &planned {
        super::write_superblock(member.as_ref(), sb).map_err(|e| format!("{path}: {e}"))?;
        format_member(member.clone(), sb).map_err(|e| format!("{path}: {e}"))?;
    }
    let members = planned.into_iter().map(|(p, m, _)| (p, m)).collect();
    let array = super::assemble_members(members).map_err(|e| e.to_string())?;
    let stripes = array.geometry.stripe_count();
    let report = super::resync_with(
        &array.geometry,
        &array.slots,
        0..stripes,
        super::Pass::Check,
        |_| {},
        |_| {},
    )
    .map_err(|e| format!("deriving the checksums: {e}"))?;
    for opened in &array.integrity {
        let device = array
            .devices
            .iter()
            .find(|d| d.path == opened.path)
            .expect("an integrity member is a device of the array");
        let io = |e: std::io::Error| format!("{}: {e}", opened.path);
        derive_unused(&opened.member, &device.sb).map_err(io)?;
        opened.member.close(device.sb.events).map_err(io)?;
    }
    let mut said = format!(
        "checksums ({INTEGRITY_SCHEME}) on {} members, derived over {stripes} stripes",
        array.integrity.len()
    );
    if report.mismatch_sectors > 0 {
        said.push_str(&format!(
            "; {} sectors in rows whose parity disagrees with their data are left without \
             (serve, then manage --action repair and --action check)",
            report.mismatch_sectors
        ));
    }
    Ok(said)
}

/// What `enable` needs of an array: redundancy, metadata with room after
/// the data area, every member in sync, clean, no journal, no reshape.
fn refuse_unfit(array: &super::Assembled) -> Result<(), String> {
    let level = array.level();
    if !array.integrity.is_empty() {
        return Err(format!(
            "the array has checksums already ({INTEGRITY_SCHEME}); `uraid integrity none` drops them"
        ));
    }
    if !level.redundant() {
        return Err(format!(
            "{level} has no redundancy to correct from: checksums would only turn wrong bytes into errors"
        ));
    }
    if level.is_draid() {
        return Err(
            "a dRAID keeps its distributed spares' metadata after its data: give it checksums \
             at create (--integrity crc32c)"
                .into(),
        );
    }
    if !matches!(array.sb.metadata, Metadata::V1_1 | Metadata::V1_2) {
        return Err(format!(
            "checksums need metadata 1.1 or 1.2 (they live after md's data area, where {} keeps \
             its superblock)",
            array.sb.metadata
        ));
    }
    if array.geometry.reshaping().is_some() {
        return Err("the array is reshaping: let the reshape finish first".into());
    }
    if !array.missing_roles().is_empty() {
        return Err(format!(
            "roles {:?} are missing: every member must be given and in sync to derive the \
             checksums from",
            array.missing_roles()
        ));
    }
    if !array.is_clean() {
        return Err(
            "the array was not stopped cleanly: serve it until its resync ends, stop it, then \
             give it checksums"
                .into(),
        );
    }
    Ok(())
}

/// Drops an array's checksums (`uraid integrity none`), offline: each
/// member's region header is erased and md's data area given back the
/// room. Returns what it did.
pub fn disable(members: Vec<(String, MemberRef)>) -> Result<String, String> {
    let array = super::assemble_members(members).map_err(|e| e.to_string())?;
    if array.integrity.is_empty() {
        return Err("the array has no checksums to drop".into());
    }
    let mut dropped = 0;
    for device in &array.devices {
        let Some(integrity) = device.member.integrity() else {
            continue;
        };
        let inner = integrity.inner().clone();
        let header_at = integrity.layout().region_start_bytes;
        let zeros =
            crate::member::AlignedBuf::zeroed(crate::member::INTEGRITY_BLOCK_BYTES as usize);
        inner
            .write_at(&zeros, header_at)
            .and_then(|()| inner.flush())
            .map_err(|e| format!("{}: erasing the checksum region: {e}", device.path))?;
        let mut sb = device.sb.clone();
        sb.data_size_sectors = inner.size_sectors() - sb.data_offset_sectors;
        super::write_superblock(inner.as_ref(), &sb)
            .map_err(|e| format!("{}: {e}", device.path))?;
        dropped += 1;
    }
    Ok(format!("checksums dropped from {dropped} members"))
}
