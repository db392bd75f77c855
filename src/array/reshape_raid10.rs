//! raid10's reshape rules, which differ from raid4/5/6's: md moves a raid10
//! by copying chunks from the old layout to the new one with nothing tying
//! chunks together, so it needs no backup and records any point, but it
//! always moves the data offset (raid10.c's raid10_check_reshape,
//! raid10_start_reshape and raid10_run; mdadm's analyse_change and
//! raid10_reshape).

use super::reshape::{
    check_room, check_spares, requested_shape, ReshapeContext, ReshapePlan, ReshapeRequest,
};
use crate::format::Metadata;
use crate::geometry::{Geometry, Level, Raid10};

fn raid10_of(g: &Geometry) -> &Raid10 {
    g.raid10().expect("a raid10 geometry")
}

/// How far md moves every member's data for a raid10 reshape: the larger of
/// the old and the new chunk times its far copies (mdadm's
/// min_offset_change). The kernel will neither start nor resume a reshape
/// whose members moved less (raid10_start_reshape, raid10_run).
pub fn raid10_offset_change(old: &Geometry, new: &Geometry) -> u64 {
    let span = |g: &Raid10| g.chunk_sectors() * g.far_copies() as u64;
    span(raid10_of(old)).max(span(raid10_of(new)))
}

/// The checks md's raid10_run makes before it resumes a reshape it finds
/// recorded: neither layout may be far, and every member's data must have
/// moved far enough ("offset difference not enough to continue reshape").
/// `moved` is each active member's move in the reshape's direction.
pub fn check_raid10_reshaping(
    old: &Geometry,
    new: &Geometry,
    moved: impl Iterator<Item = i64>,
) -> Result<(), String> {
    if raid10_of(old).is_far() || raid10_of(new).is_far() {
        return Err("a raid10 reshape with the far layout is recorded, which md never runs".into());
    }
    let least = moved.map(|m| m.max(0) as u64).min().unwrap_or(0);
    let needed = raid10_offset_change(old, new);
    if least < needed {
        return Err(format!(
            "the raid10 reshape recorded moves the data by {least} sectors, and md needs {needed} to continue it (offset difference not enough to continue reshape)"
        ));
    }
    Ok(())
}

/// Checks a raid10 reshape request as md and mdadm do and plans it. uraid
/// runs what moves forwards: adding members, and same-count changes
/// (near to offset and back, the chunk) moving the data down.
pub fn plan_raid10_reshape(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<ReshapePlan, String> {
    let old = ctx.params.clone();
    if let Some(level) = request.level.filter(|l| *l != Level::Raid10.md_number()) {
        let name =
            Level::from_md_number(level).map_or("an unknown level".to_string(), |l| l.to_string());
        return Err(format!(
            "changing raid10 to {name} is not supported by uraid yet (a raid10 changes its member count, chunk and layout)"
        ));
    }
    let old_geometry = Geometry::new(&old).map_err(|e| e.to_string())?;
    if raid10_of(&old_geometry).is_far() {
        return Err(
            "md never reshapes a raid10 with the far layout (its copies span the whole member)"
                .into(),
        );
    }
    let new = requested_shape(&old, request)?;
    let raid_disks = new.raid_disks;
    if raid_disks < old.raid_disks || request.array_sectors.is_some() {
        return Err(format!(
            "removing members of a raid10 ({} to {raid_disks}) runs a reshape backwards, which uraid does not run for raid10 yet",
            old.raid_disks
        ));
    }
    let new_geometry = Geometry::new(&new).map_err(|e| e.to_string())?;
    let new10 = raid10_of(&new_geometry);
    if new10.is_far() {
        return Err("md cannot reshape a raid10 to the far layout".into());
    }
    if new10.copies() != raid10_of(&old_geometry).copies() {
        return Err(format!(
            "a raid10 reshape keeps the number of copies ({}), md cannot change it",
            raid10_of(&old_geometry).copies()
        ));
    }
    if old_geometry.array_sectors() % new.chunk_sectors != 0 {
        return Err(format!(
            "the array's size is not a multiple of the new chunk ({}K), which md refuses for raid10",
            new.chunk_sectors / 2
        ));
    }
    if !ctx.missing_roles.is_empty() {
        return Err("the array is degraded: rebuild it before reshaping".into());
    }
    match ctx.sb.metadata {
        Metadata::V0_90 => {
            return Err("md cannot reshape a raid10 with 0.90 metadata, which cannot record a new data offset".into())
        }
        Metadata::V1_0 => {
            return Err("1.0 metadata keeps no room before the data, and md reshapes a raid10 forwards only by moving its data down".into())
        }
        Metadata::V1_1 | Metadata::V1_2 => {}
    }
    let spares_needed = check_spares(ctx, old.raid_disks, raid_disks)?;
    let shift = raid10_offset_change(&old_geometry, &new_geometry);
    check_room(&ctx.members, shift, "the raid10")?;
    Ok(ReshapePlan {
        old,
        new,
        new_offset_sectors: -(shift as i64),
        spares_needed,
    })
}
