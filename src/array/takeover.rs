//! Level changes, planned as md makes them: a *takeover* swaps the level
//! at once where both levels lay the data out alike (raid.c's
//! `*_takeover` functions), and a *restripe* moves the data where the
//! layouts differ. mdadm chains them: raid5→raid6 takes over to raid6
//! with the `-6` twin of the layout (Q on a new, empty last member) and
//! restripes to the wanted layout while a spare fills that member;
//! raid6→raid5 restripes to the `-6` twin first and then drops Q.
//! [`LevelChange`] is that chain as data; the engine runs it.

use super::reshape::{plan_restripe, restripe_allowed, ReshapeContext, ReshapePlan};
use super::ReshapeRequest;
use crate::geometry::{Geometry, GeometryParams, Level, PARITY_N};

/// What a takeover does to the array's roles besides relabelling them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Roles {
    /// Every role keeps its member.
    Same,
    /// A new, empty last role: raid0→raid4/5's parity, raid5→raid6's Q.
    AddLast,
    /// The last role leaves: raid6→raid5's Q becomes a spare,
    /// raid4/5→raid0's parity member leaves the array.
    DropLast,
}

/// One instant level change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The array's parameters once it is done.
    pub params: GeometryParams,
    pub roles: Roles,
}

/// A level change: a takeover, then a restripe, then a takeover; each
/// step optional, at least one present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelChange {
    pub before: Option<Takeover>,
    pub restripe: Option<ReshapePlan>,
    pub after: Option<Takeover>,
}

impl LevelChange {
    /// The level the array ends at.
    pub fn final_level(&self) -> Level {
        self.after
            .as_ref()
            .map(|t| t.params.level)
            .or(self.restripe.as_ref().map(|r| r.new.level))
            .or(self.before.as_ref().map(|t| t.params.level))
            .expect("a level change has a step")
    }
}

/// raid6's twin of a raid5 layout: the same rotation over the first n−1
/// members with Q on the last (raid5.c's ALGORITHM_*_6); parity-last is
/// its own twin, P and Q both fixed at the end.
pub fn raid6_twin(raid5_layout: u32) -> Option<u32> {
    match raid5_layout {
        0..=4 => Some(raid5_layout + 16),
        PARITY_N => Some(PARITY_N),
        _ => None,
    }
}

/// The raid5 layout whose twin `raid6_layout` is, or that it already is.
fn raid5_of(raid6_layout: u32) -> Option<u32> {
    match raid6_layout {
        16..=20 => Some(raid6_layout - 16),
        0..=PARITY_N => Some(raid6_layout),
        _ => None,
    }
}

/// md's chunk for a raid1 (or a two-member raid5 going to raid1) taken
/// over by raid5 (raid5_takeover_raid1): the largest power of two up to
/// 64 KiB that divides the array, at least one 4 KiB page.
fn takeover_chunk(array_sectors: u64) -> Option<u64> {
    let mut chunk = 128;
    while chunk > 0 && !array_sectors.is_multiple_of(chunk) {
        chunk >>= 1;
    }
    (chunk >= 8).then_some(chunk)
}

/// Plans the level change `request` asks for; `None` when it asks for
/// none (no level, or the array's own).
pub fn plan_level_change(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Option<Result<LevelChange, String>> {
    let old = ctx.params.level;
    let wanted = request.level.filter(|l| *l != old.md_number())?;
    Some(match Level::from_md_number(wanted) {
        None => Err(format!("level {wanted} is not one md knows")),
        Some(new) => plan(ctx, request, new),
    })
}

fn plan(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
    new_level: Level,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    if let Some(busy) = &ctx.busy {
        return Err(format!("cannot change the level while {busy} (md: EBUSY)"));
    }
    if request.array_sectors.is_some() {
        return Err("--array-size goes with --raid-devices fewer than the array has, not with a level change".into());
    }
    let unsupported = || {
        let via = match (old.level, new_level) {
            (Level::Raid6, Level::Raid0) => " (md goes through raid5: --level 5, then --level 0)",
            (Level::Raid0 | Level::Raid1, Level::Raid6) | (Level::Raid4, Level::Raid6) => {
                " (md goes through raid5: --level 5 first)"
            }
            _ => "",
        };
        Err(format!(
            "md cannot change {} to {new_level}{via}",
            old.level
        ))
    };
    match (old.level, new_level) {
        (Level::Raid4, Level::Raid5) => from_raid4_to_raid5(ctx, request),
        (Level::Raid5, Level::Raid4) | (Level::Raid4 | Level::Raid5, Level::Raid0) => {
            to_parity_last_then(ctx, request, new_level)
        }
        (Level::Raid0, Level::Raid4 | Level::Raid5) => from_raid0(ctx, request, new_level),
        (Level::Raid5, Level::Raid6) => from_raid5_to_raid6(ctx, request),
        (Level::Raid6, Level::Raid5) => from_raid6_to_raid5(ctx, request),
        (Level::Raid1, Level::Raid5) => from_raid1_to_raid5(ctx, request),
        (Level::Raid5, Level::Raid1) => from_raid5_to_raid1(ctx, request),
        _ => unsupported(),
    }
}

/// The request may name only what the level change itself sets.
fn no_other_change(
    request: &ReshapeRequest,
    raid_disks: u32,
    chunk: u64,
    what: &str,
) -> Result<(), String> {
    if request.raid_devices.is_some_and(|n| n != raid_disks)
        || request.chunk_sectors.is_some_and(|c| c != chunk)
    {
        return Err(format!(
            "{what} keeps {raid_disks} members and the chunk: change the level and the shape in two commands, the level first"
        ));
    }
    Ok(())
}

fn with(old: &GeometryParams, level: Level, layout: u32, raid_disks: u32) -> GeometryParams {
    let mut params = GeometryParams {
        level,
        layout,
        raid_disks,
        ..old.clone()
    };
    params
        .member_data_sectors
        .resize(raid_disks as usize, old.dev_sectors);
    params
}

/// A restripe to `to` after `before` (or of the array as it is), with
/// md's checks.
fn restripe(
    ctx: &ReshapeContext,
    before: Option<&Takeover>,
    to: GeometryParams,
) -> Result<ReshapePlan, String> {
    // The role a takeover adds is empty by design; any other is not.
    restripe_allowed(ctx, !ctx.missing_roles.is_empty())?;
    let from = before.map_or_else(|| ctx.params.clone(), |t| t.params.clone());
    plan_restripe(ctx, from, to, None)
}

/// The restripe to `layout` after `before` (or of the array as it is),
/// none when the array already has it.
fn restripe_to_layout(
    ctx: &ReshapeContext,
    before: Option<&Takeover>,
    layout: u32,
) -> Result<Option<ReshapePlan>, String> {
    let from = before.map_or(&ctx.params, |t| &t.params);
    if from.layout == layout {
        return Ok(None);
    }
    let to = GeometryParams {
        layout,
        ..from.clone()
    };
    restripe(ctx, before, to).map(Some)
}

fn from_raid4_to_raid5(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    no_other_change(request, old.raid_disks, old.chunk_sectors, "raid4 to raid5")?;
    // raid4 is raid5's parity-last layout: nothing moves unless another
    // layout is asked for.
    let before = Takeover {
        params: with(old, Level::Raid5, PARITY_N, old.raid_disks),
        roles: Roles::Same,
    };
    let restripe = restripe_to_layout(ctx, Some(&before), request.layout.unwrap_or(PARITY_N))?;
    Ok(LevelChange {
        before: Some(before),
        restripe,
        after: None,
    })
}

/// raid5→raid4 and raid4/5→raid0: md takes these over only from the
/// parity-last layout (raid0_takeover_raid45, raid4 being that layout),
/// so another raid5 layout is restriped to it first. raid0 has no parity:
/// its member leaves the array.
fn to_parity_last_then(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
    new_level: Level,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    let to_raid0 = new_level == Level::Raid0;
    let raid_disks = old.raid_disks - u32::from(to_raid0);
    no_other_change(
        request,
        raid_disks,
        old.chunk_sectors,
        &format!("{} to {new_level}", old.level),
    )?;
    if request.layout.is_some()
        && !to_raid0
        && request.layout != Some(0)
        && request.layout != Some(PARITY_N)
    {
        return Err("raid4 has one layout, parity on the last member".into());
    }
    let last = old.raid_disks as usize - 1;
    if to_raid0 {
        if ctx.missing_roles.iter().any(|&r| r != last) {
            return Err(
                "a data member is missing: raid0 needs every one (md's raid0_takeover_raid45)"
                    .into(),
            );
        }
        if ctx.sb.feature_map & crate::format::MD_FEATURE_BITMAP_OFFSET != 0 {
            return Err(
                "raid0 has no write-intent bitmap: remove it first (manage --grow --bitmap none)"
                    .into(),
            );
        }
        if ctx.sb.feature_map & crate::format::MD_FEATURE_JOURNAL != 0 {
            return Err(
                "raid0 has no journal: an array with a write journal cannot become raid0".into(),
            );
        }
        if ctx.spares > 0 {
            return Err("raid0 keeps no spares: remove them first (manage --remove)".into());
        }
    }
    let restripe = match old.level {
        Level::Raid5 => restripe_to_layout(ctx, None, PARITY_N)?,
        _ => None,
    };
    let after = Takeover {
        params: if to_raid0 {
            let mut params = with(old, Level::Raid0, 0, raid_disks);
            params.member_data_sectors = vec![old.dev_sectors; raid_disks as usize];
            params
        } else {
            with(old, Level::Raid4, PARITY_N, raid_disks)
        },
        roles: if to_raid0 {
            Roles::DropLast
        } else {
            Roles::Same
        },
    };
    Geometry::new(&after.params).map_err(|e| e.to_string())?;
    Ok(LevelChange {
        before: None,
        restripe,
        after: Some(after),
    })
}

/// raid0→raid4/5 (raid45_takeover_raid0): the data members keep their
/// places and an empty parity member joins at the end, which a spare then
/// fills; raid5 is restriped from parity-last to the wanted layout
/// (left-symmetric, as mdadm), degraded or with the spare following.
fn from_raid0(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
    new_level: Level,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    let raid_disks = old.raid_disks + 1;
    no_other_change(
        request,
        raid_disks,
        old.chunk_sectors,
        &format!("raid0 to {new_level}"),
    )?;
    // One zone only: every member holds as many whole chunks as the
    // smallest (md's raid45_takeover_raid0 refuses several zones).
    let chunk = old.chunk_sectors;
    let per_member: Vec<u64> = ctx
        .members
        .iter()
        .map(|m| m.data_sectors / chunk * chunk)
        .collect();
    let zone = per_member.iter().copied().min().unwrap_or(0);
    if per_member.iter().any(|&s| s != zone) {
        return Err("the raid0's members differ in size (several zones): md takes over only a raid0 of one zone".into());
    }
    let mut params = with(old, new_level, PARITY_N, raid_disks);
    params.dev_sectors = zone;
    params.member_data_sectors = vec![zone; raid_disks as usize];
    let before = Takeover {
        params,
        roles: Roles::AddLast,
    };
    let layout = match new_level {
        Level::Raid4 => {
            if request.layout.is_some_and(|l| l != 0 && l != PARITY_N) {
                return Err("raid4 has one layout, parity on the last member".into());
            }
            PARITY_N
        }
        _ => request.layout.unwrap_or(crate::geometry::LEFT_SYMMETRIC),
    };
    let restripe = restripe_to_layout(ctx, Some(&before), layout)?;
    Ok(LevelChange {
        before: Some(before),
        restripe,
        after: None,
    })
}

/// raid5→raid6 (raid6_takeover, then mdadm's restripe): Q goes on a new
/// last member, which a spare fills as the restripe passes; the layout
/// stays the raid5's unless another is asked for.
fn from_raid5_to_raid6(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    let raid_disks = old.raid_disks + 1;
    no_other_change(request, raid_disks, old.chunk_sectors, "raid5 to raid6")?;
    if raid_disks < 4 {
        return Err("a raid6 needs at least 4 members: grow the raid5 to 3 first".into());
    }
    if !ctx.missing_roles.is_empty() {
        return Err("the array is degraded: rebuild it before changing its level".into());
    }
    if ctx.spares == 0 {
        return Err(
            "raid6 needs one more member: add a spare first (manage --add); mdadm refuses to leave the array degraded too".into(),
        );
    }
    let twin = raid6_twin(old.layout).ok_or("this raid5 layout has no raid6 twin")?;
    let before = Takeover {
        params: with(old, Level::Raid6, twin, raid_disks),
        roles: Roles::AddLast,
    };
    let restripe = restripe_to_layout(ctx, Some(&before), request.layout.unwrap_or(old.layout))?;
    Ok(LevelChange {
        before: Some(before),
        restripe,
        after: None,
    })
}

/// raid6→raid5: restripe to the `-6` twin of the raid5 layout, then drop
/// Q (raid5_takeover_raid6), whose member becomes a spare. The kernel
/// this works with records the restripe as raid6 to raid6 (it has no
/// new_level to say more), so a restripe cut short by a stop ends as a
/// raid6 in the twin layout, and a second `--level 5` is then instant.
fn from_raid6_to_raid5(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    let raid_disks = old.raid_disks - 1;
    no_other_change(request, raid_disks, old.chunk_sectors, "raid6 to raid5")?;
    if !ctx.missing_roles.is_empty() {
        return Err("the array is degraded: rebuild it before changing its level".into());
    }
    let layout = match request.layout {
        Some(l) => l,
        None => raid5_of(old.layout)
            .ok_or("this raid6 layout has no raid5 counterpart: name one with --layout")?,
    };
    let twin = raid6_twin(layout).ok_or("a raid5 layout is needed")?;
    let restripe = restripe_to_layout(ctx, None, twin)?;
    let after = Takeover {
        params: with(old, Level::Raid5, layout, raid_disks),
        roles: Roles::DropLast,
    };
    Ok(LevelChange {
        before: None,
        restripe,
        after: Some(after),
    })
}

/// raid1 of two→raid5 of two (raid5_takeover_raid1): both members hold
/// the same bytes, which is what a two-member raid5 holds (parity of one
/// strip is that strip). More members then come by a grow.
fn from_raid1_to_raid5(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    if old.raid_disks != 2 {
        return Err(format!(
            "md takes over only a raid1 of 2 members to raid5; this one has {}: change its member count first",
            old.raid_disks
        ));
    }
    if !ctx.missing_roles.is_empty() {
        return Err("the array is degraded: rebuild it before changing its level".into());
    }
    let chunk = match request.chunk_sectors {
        Some(c) => c,
        None => takeover_chunk(old.dev_sectors)
            .ok_or("the array's size is not a multiple of 4 KiB, which a raid5 chunk needs")?,
    };
    if !old.dev_sectors.is_multiple_of(chunk) {
        return Err("the array's size must be a multiple of the chunk".into());
    }
    let layout = request.layout.unwrap_or(crate::geometry::LEFT_SYMMETRIC);
    let mut params = with(old, Level::Raid5, layout, 2);
    params.chunk_sectors = chunk;
    Geometry::new(&params).map_err(|e| e.to_string())?;
    let before = Takeover {
        params,
        roles: Roles::Same,
    };
    let restripe = match request.raid_devices.filter(|&n| n != 2) {
        Some(n) => Some(restripe(
            ctx,
            Some(&before),
            GeometryParams {
                raid_disks: n,
                ..before.params.clone()
            },
        )?),
        None => None,
    };
    Ok(LevelChange {
        before: Some(before),
        restripe,
        after: None,
    })
}

/// raid5 of two→raid1 (raid1_takeover): the reverse of the above.
fn from_raid5_to_raid1(
    ctx: &ReshapeContext,
    request: &ReshapeRequest,
) -> Result<LevelChange, String> {
    let old = &ctx.params;
    if old.raid_disks != 2 {
        return Err(format!(
            "md takes over only a raid5 of 2 members to raid1; this one has {}: shrink it first",
            old.raid_disks
        ));
    }
    if request.raid_devices.is_some_and(|n| n != 2)
        || request.layout.is_some()
        || request.chunk_sectors.is_some()
    {
        return Err("change the level and the shape in two commands, the level first".into());
    }
    let mut params = with(old, Level::Raid1, 0, 2);
    params.chunk_sectors = 0;
    Ok(LevelChange {
        before: Some(Takeover {
            params,
            roles: Roles::Same,
        }),
        restripe: None,
        after: None,
    })
}
