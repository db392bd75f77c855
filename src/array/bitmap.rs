//! Reading and writing the internal write-intent bitmap on members, and
//! keeping it consistent with the md superblocks whenever the array's state
//! is written.
//!
//! uraid does not track which chunks its writes touch. It keeps md's
//! promise the coarse way instead: while the array is dirty every bit is
//! set, so a kernel that finds it after a crash resyncs everything, as it
//! would without a bitmap; when the array is marked clean (and has all its
//! members) every bit is cleared. While members are missing the bits are
//! left set, as md leaves them, so that a later re-add in the kernel
//! recovers the member instead of trusting stale data.

use super::assemble::{Assembled, DeviceState, FoundDevice};
use super::superblocks::SuperblockError;
use super::update::Cleanliness;
use crate::format::bitmap::{bitmap_region_bytes, decode_area, Bitmap, BitmapSuper};
use crate::format::bitmap::{BITMAP_STATE_STALE, BITMAP_SUPER_BYTES};
use crate::format::MemberSuper;
use crate::member::Member;
use std::io;
use std::ops::Range;

fn invalid(member: &dyn Member, text: String) -> SuperblockError {
    SuperblockError::Io {
        device: member.name().to_string(),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("internal bitmap: {text}"),
        ),
    }
}

fn io_error(member: &dyn Member, source: io::Error) -> SuperblockError {
    SuperblockError::Io {
        device: member.name().to_string(),
        source,
    }
}

/// The member blocks that hold `bytes`: members take whole logical blocks.
fn block_span(member: &dyn Member, bytes: &Range<u64>) -> Range<u64> {
    let block = u64::from(member.logical_block_bytes());
    bytes.start / block * block..bytes.end.div_ceil(block) * block
}

fn read_bytes(member: &dyn Member, bytes: Range<u64>) -> Result<Vec<u8>, SuperblockError> {
    let span = block_span(member, &bytes);
    let mut buf = vec![0u8; (span.end - span.start) as usize];
    member
        .read_at(&mut buf, span.start)
        .map_err(|e| io_error(member, e))?;
    let from = (bytes.start - span.start) as usize;
    Ok(buf[from..from + (bytes.end - bytes.start) as usize].to_vec())
}

/// Writes `data` at `at`, reading and rewriting the partial blocks at
/// either end so that the bytes around it are kept.
fn write_bytes(member: &dyn Member, at: u64, data: &[u8]) -> Result<(), SuperblockError> {
    let bytes = at..at + data.len() as u64;
    let span = block_span(member, &bytes);
    let mut buf = vec![0u8; (span.end - span.start) as usize];
    if span != bytes {
        member
            .read_at(&mut buf, span.start)
            .map_err(|e| io_error(member, e))?;
    }
    let from = (at - span.start) as usize;
    buf[from..from + data.len()].copy_from_slice(data);
    member
        .write_at(&buf, span.start)
        .map_err(|e| io_error(member, e))
}

/// Where this member's bitmap is, or None when it has none.
fn region(member: &dyn Member, sb: &MemberSuper) -> Option<Range<u64>> {
    bitmap_region_bytes(sb, member.size_sectors())
}

/// Reads the bitmap of md-cluster node slot `node` (0 for an ordinary
/// bitmap), whose slots are `node_stride_bytes` apart. None when the member
/// has no internal bitmap; an error when it has one that md would refuse or
/// that does not fit the room its superblock leaves.
pub fn read_bitmap_node(
    member: &dyn Member,
    sb: &MemberSuper,
    node: u32,
    node_stride_bytes: u64,
) -> Result<Option<(BitmapSuper, Bitmap)>, SuperblockError> {
    let Some(room) = region(member, sb) else {
        return Ok(None);
    };
    let start = room.start + u64::from(node) * node_stride_bytes;
    let header_end = start + BITMAP_SUPER_BYTES as u64;
    if header_end > member.size_bytes() {
        return Err(invalid(
            member,
            format!("node slot {node} is beyond the device"),
        ));
    }
    let header = read_bytes(member, start..header_end)?;
    let bsb = BitmapSuper::decode(&header).map_err(|e| invalid(member, e.to_string()))?;
    // Clustered slots follow one another past the first slot's room; only
    // an ordinary bitmap is bounded by it.
    let need = bsb.area_bytes();
    let limit = if node == 0 {
        room.end
    } else {
        member.size_bytes()
    };
    if start + need > limit {
        return Err(invalid(
            member,
            format!(
                "{need} bytes of bitmap do not fit the {} bytes md leaves for it",
                limit.saturating_sub(start)
            ),
        ));
    }
    let area = read_bytes(member, start..start + need)?;
    let (bsb, bits) = decode_area(&area).map_err(|e| invalid(member, e.to_string()))?;
    Ok(Some((bsb, bits)))
}

/// Reads a member's internal bitmap (node slot 0).
pub fn read_bitmap(
    member: &dyn Member,
    sb: &MemberSuper,
) -> Result<Option<(BitmapSuper, Bitmap)>, SuperblockError> {
    read_bitmap_node(member, sb, 0, 0)
}

/// Writes a bitmap superblock and its bits where `sb` says the bitmap is,
/// then reads them back: a bitmap md would refuse is never left behind.
pub fn write_bitmap(
    member: &dyn Member,
    sb: &MemberSuper,
    bsb: &BitmapSuper,
    bits: &Bitmap,
) -> Result<(), SuperblockError> {
    let Some(room) = region(member, sb) else {
        return Err(invalid(
            member,
            "the superblock does not place an internal bitmap".into(),
        ));
    };
    let area = crate::format::bitmap::encode_area(bsb, bits)
        .map_err(|e| invalid(member, e.to_string()))?;
    if room.start + area.len() as u64 > room.end {
        return Err(invalid(
            member,
            format!(
                "{} bytes of bitmap do not fit the {} bytes md leaves for it",
                area.len(),
                room.end - room.start
            ),
        ));
    }
    write_bytes(member, room.start, &area)?;
    let back = read_bitmap(member, sb)?.expect("a bitmap was just written");
    assert!(
        back.0 == *bsb && back.1 == *bits,
        "{}: bitmap read back differs from what was written",
        member.name()
    );
    Ok(())
}

/// Whether md would count the array as degraded: a role without a member,
/// or a member still being rebuilt.
fn degraded(array: &Assembled) -> bool {
    !array.missing_roles().is_empty()
        || array
            .devices
            .iter()
            .any(|d| matches!(d.state, DeviceState::Recovering { .. }))
}

/// The array's bitmap as the first in-sync member holds it (md reads it
/// from the first In_sync device), checked against the array's UUID.
fn reference_bitmap(
    array: &Assembled,
    targets: &[&FoundDevice],
) -> Result<(BitmapSuper, Bitmap), SuperblockError> {
    let mut ordered: Vec<&FoundDevice> = targets.to_vec();
    ordered.sort_by_key(|d| !matches!(d.state, DeviceState::Active { .. }));
    let mut first_error = None;
    for device in ordered {
        match read_bitmap(&*device.member, &device.sb) {
            Ok(Some((bsb, _))) if bsb.uuid != array.sb.set_uuid => {
                first_error.get_or_insert(invalid(
                    &*device.member,
                    "its UUID is not the array's".into(),
                ));
            }
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.expect("targets all have a bitmap region"))
}

/// Brings every member's bitmap in line with the array state about to be
/// written (`array.sb.events` already holds the new events count): events
/// follow the superblocks', and the bits are set while dirty and cleared
/// when clean (see the module notes). Written and flushed before the
/// superblocks, as md writes the bitmap first, so that a crash between the
/// two leaves a bitmap at most one event ahead, which md accepts.
pub(crate) fn sync_bitmaps(array: &Assembled, state: Cleanliness) -> Result<(), SuperblockError> {
    let targets: Vec<&FoundDevice> = array
        .devices
        .iter()
        .filter(|d| {
            !matches!(
                d.state,
                DeviceState::Stale { .. } | DeviceState::Duplicate { .. } | DeviceState::Faulty
            )
        })
        .filter(|d| region(&*d.member, &d.sb).is_some())
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    let events = array.sb.events;
    let (mut bsb, mut bits) = reference_bitmap(array, &targets)?;
    // Behind the superblocks it is about to follow: md calls it out of date
    // and trusts none of its bits.
    let stale = bsb.is_stale() || bsb.events.saturating_add(1) < events;
    match state {
        Cleanliness::Clean if !degraded(array) => {
            bits.clear_all();
            bsb.events_cleared = events;
        }
        Cleanliness::Clean | Cleanliness::DirtyTracked if !stale => {}
        _ => bits.set_all(),
    }
    bsb.state &= !BITMAP_STATE_STALE;
    bsb.events = events;
    bsb.events_cleared = bsb.events_cleared.min(events);
    for device in targets {
        write_bitmap(&*device.member, &device.sb, &bsb, &bits)?;
        device
            .member
            .flush()
            .map_err(|e| io_error(&*device.member, e))?;
    }
    Ok(())
}
