//! Assembling an array that md (or uraid) left part way through a reshape:
//! the superblock's reshape fields turned into a [`Reshaping`] geometry, with
//! the checks md's raid5_run (raid10_run for raid10) makes before it trusts
//! them.

use super::assemble::{AssembleError, DeviceState, FoundDevice};
use super::reshape_raid10::{check_raid10_reshaping, plan_raid10_reshape};
use super::Slots;
use crate::format::{MemberSuper, MD_FEATURE_RESHAPE_ACTIVE, MD_FEATURE_RESHAPE_BACKWARDS};
use crate::geometry::{Geometry, GeometryError, GeometryParams, Level, ReshapePoint, Reshaping};
use crate::units::SECTOR_BYTES;

/// Roles a shrinking reshape still has beyond the superblock's (new)
/// raid_disks: md keeps the old count of slots until the reshape ends.
pub fn reshape_removed_disks(sb: &MemberSuper) -> usize {
    if sb.has_feature(MD_FEATURE_RESHAPE_ACTIVE) && sb.delta_disks < 0 {
        sb.delta_disks.unsigned_abs() as usize
    } else {
        0
    }
}

/// Whether a reshape runs from the end of the array to its start: a
/// shrink, or a same-count reshape md chose to run backwards.
pub fn reshape_backwards(sb: &MemberSuper) -> bool {
    sb.delta_disks < 0 || (sb.delta_disks == 0 && sb.has_feature(MD_FEATURE_RESHAPE_BACKWARDS))
}

/// The geometry of an array whose freshest superblock records a reshape in
/// progress. `params` describe the old geometry with every role the
/// reshape has (`raid_disks` the larger count). The slots' data offsets
/// are moved to the lower of each member's two offsets, which the
/// geometry's places are relative to.
pub fn reshaping_geometry(
    sb: &MemberSuper,
    params: GeometryParams,
    slots: &mut Slots,
    devices: &[FoundDevice],
) -> Result<Geometry, AssembleError> {
    let refuse = |why: String| AssembleError::Geometry(GeometryError::Invalid(why));
    if !matches!(
        params.level,
        Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10
    ) {
        return Err(refuse(format!(
            "a {} reshape is in progress, and uraid reads only raid4/5/6/10 arrays mid-reshape; \
             let mdadm finish it (mdadm --assemble)",
            params.level
        )));
    }
    if params.level == Level::Raid10 && sb.new_level != params.level.md_number() {
        return Err(refuse(format!(
            "a raid10 reshape to level {} is recorded, which md never runs",
            sb.new_level
        )));
    }
    if sb.feature_map & crate::format::MD_FEATURE_JOURNAL != 0 {
        return Err(refuse(
            "a reshape is in progress on an array with a write journal, which md never does".into(),
        ));
    }
    let new_level =
        Level::from_md_number(sb.new_level).ok_or(AssembleError::UnknownLevel(sb.new_level))?;
    let roles = params.raid_disks as usize;
    let old_disks = (sb.raid_disks as i64 - i64::from(sb.delta_disks)) as u32;
    let old = Geometry::new(&GeometryParams {
        raid_disks: old_disks,
        ..params.clone()
    })?;
    let new = Geometry::new(&GeometryParams {
        level: new_level,
        layout: sb.new_layout,
        chunk_sectors: u64::from(sb.new_chunk_sectors),
        raid_disks: sb.raid_disks,
        ..params
    })?;
    let mut old_offsets = vec![sb.data_offset_sectors; roles];
    let mut new_offsets = vec![new_data_offset(sb)?; roles];
    for device in devices {
        if let DeviceState::Active { role } | DeviceState::Recovering { role, .. } = device.state {
            old_offsets[role] = device.sb.data_offset_sectors;
            new_offsets[role] = new_data_offset(&device.sb)?;
        }
    }
    let backwards = reshape_backwards(sb);
    if new.level() == Level::Raid10 {
        let moved = devices.iter().filter_map(|device| match device.state {
            DeviceState::Active { role } => {
                let diff = old_offsets[role] as i64 - new_offsets[role] as i64;
                Some(if backwards { -diff } else { diff })
            }
            _ => None,
        });
        check_raid10_reshaping(&old, &new, moved).map_err(refuse)?;
    }
    let reshaping = Reshaping::new(
        old,
        new,
        ReshapePoint {
            position_sectors: sb.reshape_position_sectors,
            backwards,
            old_offset_sectors: old_offsets.clone(),
            new_offset_sectors: new_offsets.clone(),
        },
    )?;
    for (role, slot) in slots.iter_mut().enumerate() {
        if let Some(slot) = slot {
            slot.data_offset_bytes = old_offsets[role].min(new_offsets[role]) * SECTOR_BYTES;
        }
    }
    Ok(Geometry::Reshaping(Box::new(reshaping)))
}

/// A member's data offset in the new geometry, refused when a corrupt
/// new_offset puts it before the device's start.
fn new_data_offset(sb: &MemberSuper) -> Result<u64, AssembleError> {
    u64::try_from(sb.new_data_offset_sectors()).map_err(|_| {
        AssembleError::Geometry(GeometryError::Invalid(format!(
            "new_offset {} puts the data before the start of the device",
            sb.new_offset_sectors
        )))
    })
}

/// What a user asks to change (`manage --grow`): the member count, the
/// chunk, the layout, the level; `None` keeps the current value.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReshapeRequest {
    pub raid_devices: Option<u32>,
    pub level: Option<i32>,
    pub layout: Option<u32>,
    pub chunk_sectors: Option<u64>,
    /// The size the array is to have, in sectors: a reshape that makes it
    /// smaller (removing members) needs it stated, as md needs
    /// `mdadm --grow --array-size` before such a reshape.
    #[serde(default)]
    pub array_sectors: Option<u64>,
}

/// A reshape uraid will run: the new shape and where each member's data
/// moves to (the same change of data offset on every member, as mdadm's
/// set_new_data_offset writes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapePlan {
    pub old: GeometryParams,
    pub new: GeometryParams,
    /// Added to every member's data offset: negative, the data moves
    /// towards the superblock into the headroom mdadm leaves at create
    /// (a forward reshape); positive, into the room after the data (a
    /// shrink, which runs backwards).
    pub new_offset_sectors: i64,
    /// Spares that take the new roles.
    pub spares_needed: usize,
}

impl ReshapePlan {
    pub fn delta_disks(&self) -> i64 {
        i64::from(self.new.raid_disks) - i64::from(self.old.raid_disks)
    }
}

/// The array's state that bears on whether a reshape may start.
pub struct ReshapeContext<'a> {
    pub sb: &'a MemberSuper,
    pub params: GeometryParams,
    /// The lowest data offset any member could move to (past its
    /// superblock, bad-block log and bitmap), per member in the array.
    pub members: Vec<MemberRoom>,
    pub spares: usize,
    /// Roles no in-sync member holds.
    pub missing_roles: Vec<usize>,
    /// A resync, rebuild, check or replacement is running or owed.
    pub busy: Option<String>,
}

/// One member's data offset, the lowest offset its data may start at, and
/// the room past the end of what the array uses of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberRoom {
    pub data_offset_sectors: u64,
    pub data_sectors: u64,
    pub lowest_data_offset_sectors: u64,
    pub room_after_sectors: u64,
}

/// The room after a 1.1/1.2 member's data: what the device holds past the
/// component size the array uses (md's new_offset_store lets the data move
/// up by at most that, once mdadm has let the member's data size reach
/// the device's end).
pub fn room_after_data(sb: &MemberSuper, device_sectors: u64) -> u64 {
    device_sectors.saturating_sub(sb.data_offset_sectors + sb.size_sectors)
}

/// The lowest sector a 1.1/1.2 member's data may start at: past its
/// superblock's 36 KiB (md's super_1_allow_new_offset keeps new data
/// clear of the superblock, the bad-block log and the bitmap, whose
/// `bitmap_bytes` it counts in whole 4 KiB pages).
pub fn lowest_data_offset(sb: &MemberSuper, bitmap_bytes: u64) -> u64 {
    let mut lowest = sb.super_offset_sectors + 72;
    if sb.feature_map & crate::format::MD_FEATURE_BITMAP_OFFSET != 0 {
        let start = sb.super_offset_sectors as i64 + i64::from(sb.bitmap_offset_sectors);
        lowest = lowest.max(start as u64 + bitmap_bytes.div_ceil(4096) * 8);
    }
    if sb.bblog_offset_sectors > 0 {
        lowest = lowest.max(
            (sb.super_offset_sectors as i64 + i64::from(sb.bblog_offset_sectors)) as u64
                + u64::from(sb.bblog_size_sectors),
        );
    }
    lowest
}

/// A reshape that makes the array smaller is run only when the user has
/// stated the size it leaves (mdadm refuses it until `--grow --array-size`
/// has truncated the array); the size is checked against what the new
/// shape holds.
fn check_stated_size(
    stated: Option<u64>,
    old_size: u64,
    new_size: u64,
    shrinks: bool,
) -> Result<(), String> {
    match stated {
        None => Err(format!(
            "this change will reduce the size of the array from {} KiB to {} KiB: state it with --array-size {}K (what lies beyond is dropped)",
            old_size / 2,
            new_size / 2,
            new_size / 2
        )),
        Some(_) if !shrinks => {
            Err("--array-size goes with --raid-devices fewer than the array has".into())
        }
        Some(size) if size != new_size => Err(format!(
            "--array-size {} KiB: with that many members the array holds {} KiB, give --array-size {}K",
            size / 2,
            new_size / 2,
            new_size / 2
        )),
        Some(_) => Ok(()),
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// Checks a reshape request as md and mdadm do and plans it; every refusal
/// is one line saying why.
pub fn plan_reshape(ctx: &ReshapeContext, request: &ReshapeRequest) -> Result<ReshapePlan, String> {
    let old = ctx.params.clone();
    let level = old.level;
    if let Some(busy) = &ctx.busy {
        return Err(format!("cannot reshape while {busy} (md: EBUSY)"));
    }
    if level == Level::Raid10 {
        return plan_raid10_reshape(ctx, request);
    }
    if !matches!(level, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        return Err(format!(
            "uraid reshapes raid4/5/6/10 arrays; changing a {level} array's shape is not supported yet"
        ));
    }
    if let Some(new_level) = request.level.filter(|l| *l != level.md_number()) {
        let name = Level::from_md_number(new_level)
            .map_or("an unknown level".to_string(), |l| l.to_string());
        return Err(format!(
            "changing {level} to {name} is not supported by uraid yet (only raid4 to raid5 and back, and the member count, chunk and layout of raid4/5/6)"
        ));
    }
    restripe_allowed(ctx, !ctx.missing_roles.is_empty())?;
    let new = requested_shape(&old, request)?;
    let fewest = if level == Level::Raid6 { 4 } else { 2 };
    if new.raid_disks < fewest {
        return Err(format!(
            "a {level} needs at least {fewest} members: {} would be too few (md: EINVAL)",
            new.raid_disks
        ));
    }
    plan_restripe(ctx, old, new, request.array_sectors)
}

/// The shape `request` asks for, refused when it changes nothing.
pub(super) fn requested_shape(
    old: &GeometryParams,
    request: &ReshapeRequest,
) -> Result<GeometryParams, String> {
    let new = GeometryParams {
        layout: request.layout.unwrap_or(old.layout),
        chunk_sectors: request.chunk_sectors.unwrap_or(old.chunk_sectors),
        raid_disks: request.raid_devices.unwrap_or(old.raid_disks),
        ..old.clone()
    };
    if new == *old {
        return Err("nothing to change: the array already has that shape".into());
    }
    Ok(new)
}

/// The spares a grow from `old` to `new` members takes (md's start_reshape
/// refuses to end up degraded), or why there are too few.
pub(super) fn check_spares(ctx: &ReshapeContext, old: u32, new: u32) -> Result<usize, String> {
    let needed = new.saturating_sub(old) as usize;
    if ctx.spares < needed {
        return Err(format!(
            "going from {old} to {new} members needs {needed} spare(s), the array has {}: add them first (manage --add)",
            ctx.spares
        ));
    }
    Ok(needed)
}

/// Refuses when a member has less than `shift` sectors free before its
/// data, where the reshape moves it (`how` says which reshape).
pub(super) fn check_room(members: &[MemberRoom], shift: u64, how: &str) -> Result<(), String> {
    for room in members {
        let free = room
            .data_offset_sectors
            .saturating_sub(room.lowest_data_offset_sectors);
        if free < shift {
            return Err(format!(
                "not enough room before the data to reshape {how}: {} KiB needed, {} KiB free",
                shift / 2,
                free / 2
            ));
        }
    }
    Ok(())
}

/// What rules a reshape out whatever its shape: md's refusals for a
/// journal, and uraid's for what it does not move yet. `degraded` counts
/// only where a level change did not itself leave the role empty.
pub(super) fn restripe_allowed(ctx: &ReshapeContext, degraded: bool) -> Result<(), String> {
    if ctx.sb.feature_map & crate::format::MD_FEATURE_JOURNAL != 0 {
        return Err("an array with a write journal cannot be reshaped (md refuses it too)".into());
    }
    if degraded {
        return Err("the array is degraded: rebuild it before reshaping".into());
    }
    if ctx.sb.metadata == crate::format::Metadata::V0_90
        || ctx.sb.metadata == crate::format::Metadata::V1_0
    {
        return Err(format!(
            "{} metadata keeps no room before the data, so a reshape needs mdadm's backup file, which uraid does not support yet",
            ctx.sb.metadata.as_str()
        ));
    }
    Ok(())
}

/// Plans moving the data from `old` to `new` (both raid4/5/6): the
/// array shrinks only to the size the user stated (`stated_sectors`),
/// spares must fill the new roles, and every member needs room to move
/// its data into.
pub(super) fn plan_restripe(
    ctx: &ReshapeContext,
    old: GeometryParams,
    new: GeometryParams,
    stated_sectors: Option<u64>,
) -> Result<ReshapePlan, String> {
    let level = old.level;
    let raid_disks = new.raid_disks;
    let new_geometry = Geometry::new(&new).map_err(|e| e.to_string())?;
    let old_geometry = Geometry::new(&old).map_err(|e| e.to_string())?;
    let (old_size, new_size) = (old_geometry.array_sectors(), new_geometry.array_sectors());
    let shrinks = raid_disks < old.raid_disks;
    if shrinks || stated_sectors.is_some() {
        check_stated_size(stated_sectors, old_size, new_size, shrinks)?;
    } else if new_size < old_size {
        return Err(
            "this change will reduce the size of the array (mdadm refuses it without --array-size)"
                .into(),
        );
    }
    let spares_needed = check_spares(ctx, old.raid_disks, raid_disks)?;
    // mdadm moves the data by the rows both geometries share
    // (compute_backup_blocks): whole old and new rows fit it, so a row is
    // never written over its own unread source. Same-count reshapes also
    // need a move of at least both chunks for the kernel to resume them.
    let old_dd = u64::from(old.raid_disks) - level.parity_members() as u64;
    let new_dd = u64::from(raid_disks) - level.parity_members() as u64;
    let backup_sectors = lcm(old.chunk_sectors * old_dd, new.chunk_sectors * new_dd);
    let mut shift = backup_sectors / old_dd;
    if raid_disks == old.raid_disks {
        shift = shift.max(old.chunk_sectors.max(new.chunk_sectors));
    }
    if shrinks {
        // A shrink runs backwards and moves the data up (set_new_data_offset
        // with delta < 0): the members need that room past the data.
        for room in &ctx.members {
            if room.room_after_sectors < shift {
                return Err(format!(
                    "not enough room after the data to remove members: {} KiB needed, {} KiB free (reduce the component size first: manage --grow --size)",
                    shift / 2,
                    room.room_after_sectors / 2
                ));
            }
        }
        return Ok(ReshapePlan {
            old,
            new,
            new_offset_sectors: shift as i64,
            spares_needed,
        });
    }
    check_room(&ctx.members, shift, "without a backup file")?;
    Ok(ReshapePlan {
        old,
        new,
        new_offset_sectors: -(shift as i64),
        spares_needed,
    })
}

/// Members rebuilt along with a forward reshape that hold only parity
/// where they are not yet in sync: past their recovery offset, the old
/// layout's rows; before the point, the new layout's too. md's raid5_run
/// counts them as dirty parity disks, which a dirty array may lack.
pub fn dirty_parity_members(array: &super::Assembled) -> usize {
    let Some(reshaping) = array.geometry.reshaping().filter(|r| !r.backwards()) else {
        return 0;
    };
    let new = reshaping.new_geometry();
    let new_dd = (new.raid_disks() - new.level().parity_members()) as u64;
    let point = reshaping.position_sectors() / new_dd;
    array
        .devices
        .iter()
        .filter(|d| match d.state {
            DeviceState::Recovering {
                role,
                recovery_offset_sectors,
            } => {
                only_parity(reshaping.old(), role)
                    && (recovery_offset_sectors >= point
                        || only_parity(reshaping.new_geometry(), role))
            }
            _ => false,
        })
        .count()
}

/// Whether `role` holds parity in every row of `g` (one full rotation of
/// its layout is every row there is to see).
fn only_parity(g: &Geometry, role: usize) -> bool {
    let period = (g.raid_disks() as u64).min(g.stripe_count());
    g.level().has_parity()
        && (0..period).all(|stripe| {
            let map = g.stripe(stripe);
            [map.p, map.q]
                .iter()
                .flatten()
                .any(|place| place.member == role)
        })
}
