//! Creating an array: check the devices, choose sizes and offsets as mdadm
//! does, write the superblocks, and make the redundancy consistent.
//!
//! Nothing is written until every check has passed, so a refused create
//! leaves every device as it was.

use super::assemble::{assemble_members, AssembleError, Assembled};
use super::bitmap::write_bitmap;
use super::resync::resync;
use super::superblocks::{read_superblock, write_superblock, SuperblockError};
use super::update::{write_array_state, Cleanliness};
use crate::format::bitmap::{Bitmap, BitmapSuper};
use crate::format::{
    self, ConsistencyPolicy, CreateDevice, CreateMember, CreateSpec, FormatError, InternalBitmap,
    MemberSuper, Metadata,
};
use crate::geometry::{layout_from_name, Geometry, GeometryParams, Level};
use crate::member::{probe, MemberRef, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// mdadm's default chunk.
pub const DEFAULT_CHUNK_BYTES: u64 = 512 * 1024;

/// A device argument of create: a path, or the word "missing".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberSpec {
    Device(PathBuf),
    Missing,
}

#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub level: Level,
    pub raid_disks: u32,
    pub chunk_bytes: Option<u64>,
    pub layout: Option<String>,
    pub metadata: Metadata,
    pub assume_clean: bool,
    pub name: String,
    /// Sectors of each member to use (md's size); None uses all of the smallest.
    pub size_sectors: Option<u64>,
    pub force: bool,
    pub homehost: Option<String>,
    /// A checksum of every 4 KiB of every member (`--integrity crc32c`),
    /// kept after md's data area: reads verified and healed from
    /// redundancy (`array::integrity`).
    pub integrity: bool,
}

/// The write-intent bitmap a create makes (mdadm's --bitmap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BitmapRequest {
    #[default]
    None,
    /// An internal bitmap next to each superblock, placed and sized as
    /// mdadm places it; `chunk_bytes` None lets mdadm's rule choose
    /// (at least 64 MiB, at most 128 KiB of bitmap).
    Internal { chunk_bytes: Option<u64> },
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Device(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error("initial resync: {0}")]
    Resync(String),
}

fn invalid(text: impl Into<String>) -> CreateError {
    CreateError::Invalid(text.into())
}

/// The chunk in sectors that `level` uses, checked as md checks it.
fn chunk_sectors_for(level: Level, chunk_bytes: Option<u64>) -> Result<u32, CreateError> {
    let uses_chunk = level.is_draid()
        || matches!(
            level,
            Level::Raid0 | Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10
        );
    let bytes = match (chunk_bytes, uses_chunk) {
        (None, true) => DEFAULT_CHUNK_BYTES,
        (None, false) => return Ok(0),
        (Some(_), false) if level == Level::Raid1 => {
            return Err(invalid("raid1 has no chunk size; drop --chunk"))
        }
        (Some(b), _) => b,
    };
    if !bytes.is_power_of_two() || bytes < 4096 {
        return Err(invalid(format!(
            "invalid chunk size {bytes} bytes: it must be a power of two of at least 4K"
        )));
    }
    u32::try_from(bytes / 512).map_err(|_| invalid("chunk size too large"))
}

/// The layout number mdadm would write for this level.
fn layout_for(level: Level, name: Option<&str>) -> Result<u32, CreateError> {
    match (level, name) {
        (Level::Raid1 | Level::Linear, Some(n)) => {
            Err(invalid(format!("{level} has no layouts, got '{n}'")))
        }
        (_, Some(n)) => layout_from_name(level, n)
            .ok_or_else(|| invalid(format!("unknown layout '{n}' for {level}"))),
        (Level::Raid5 | Level::Raid6, None) => Ok(2),
        (Level::Raid4, None) => Ok(0),
        (Level::Raid10, None) => Ok(0x102),
        (Level::Raid0, None) => Ok(1),
        (Level::Raid1 | Level::Linear, None) => Ok(0),
        (Level::Draid1 | Level::Draid2 | Level::Draid3, None) => Err(invalid(
            "a dRAID needs its layout: data columns per group and distributed spares",
        )),
    }
}

pub(crate) struct Opened {
    pub(crate) path: String,
    pub(crate) member: MemberRef,
}

/// Refuses a device that holds something a create would destroy: another
/// array's superblock (even a corrupt one), a filesystem or a partition table.
/// `manage --add` asks the same of a device it is given.
pub(crate) fn refuse_existing_content(o: &Opened) -> Result<(), CreateError> {
    let name = &o.path;
    match read_superblock(&*o.member) {
        Ok(Some(sb)) => {
            return Err(CreateError::Device(format!(
                "{name} appears to be part of an md array (UUID {}); use --force to overwrite it",
                sb.uuid_string()
            )))
        }
        Err(e) => {
            return Err(CreateError::Device(format!(
                "{e}; use --force to overwrite it"
            )))
        }
        Ok(None) => {}
    }
    if let Some(content) =
        probe::existing_content(&*o.member).map_err(|e| CreateError::Device(e.to_string()))?
    {
        return Err(CreateError::Device(format!(
            "{name} holds {content}; use --force to overwrite it"
        )));
    }
    Ok(())
}

/// Opens every device exclusively and refuses duplicates.
fn open_devices(devices: &[MemberSpec]) -> Result<Vec<Option<Opened>>, CreateError> {
    let mut seen = Vec::new();
    let mut opened = Vec::new();
    for spec in devices {
        let MemberSpec::Device(path) = spec else {
            opened.push(None);
            continue;
        };
        let name = path.display().to_string();
        let identity =
            crate::member::identity(path).map_err(|e| CreateError::Device(e.to_string()))?;
        if seen.contains(&identity) {
            return Err(CreateError::Device(format!("{name} is given twice")));
        }
        seen.push(identity);
        let member = crate::member::open(path, OpenOptions { write: true })
            .map_err(|e| CreateError::Device(e.to_string()))?;
        opened.push(Some(Opened { path: name, member }));
    }
    Ok(opened)
}

/// A 0.90 superblock for a new array: built as a 1.0 one (both keep data at
/// the start of the device and the superblock at the end), then moved to the
/// 0.90 location, with the fields 0.90 lacks (name, bad-block log) cleared
/// and its disk table filled from the roles.
fn superblock_090(spec: &CreateSpec, member: &CreateMember) -> Result<MemberSuper, CreateError> {
    let spec_10 = CreateSpec {
        metadata: Metadata::V1_0,
        bad_block_log: false,
        ..spec.clone()
    };
    let mut sb = MemberSuper::new_for_create(&spec_10, member)?;
    let super_offset = format::sb090::superblock_offset_sectors(member.device_sectors)
        .ok_or_else(|| invalid("device too small for 0.90 metadata"))?;
    sb.metadata = Metadata::V0_90;
    sb.super_offset_sectors = super_offset;
    sb.data_offset_sectors = 0;
    sb.data_size_sectors = super_offset;
    sb.set_name = String::new();
    sb.bblog_offset_sectors = 0;
    sb.bblog_size_sectors = 0;
    sb.max_dev = format::sb090::MD_SB_DISKS as u32;
    sb.dev_roles.truncate(format::sb090::MD_SB_DISKS);
    let mut extra = format::sb090::extra_for_roles(&sb.dev_roles, 0);
    extra.this_disk = extra.disks[member.dev_number as usize];
    sb.v090 = Some(extra);
    Ok(sb)
}

/// Creates the array on the devices at these paths and returns it
/// assembled. `progress` receives (stripes done, stripes in all) during the
/// initial resync.
pub fn create(
    devices: &[MemberSpec],
    opts: &CreateOptions,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    create_with_bitmap(devices, opts, BitmapRequest::None, progress)
}

/// [`create`] with a write-intent bitmap.
pub fn create_with_bitmap(
    devices: &[MemberSpec],
    opts: &CreateOptions,
    bitmap: BitmapRequest,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    create_full(devices, None, opts, bitmap, progress)
}

/// [`create`] with a write-intent bitmap or a write journal on `journal`.
pub fn create_full(
    devices: &[MemberSpec],
    journal: Option<&std::path::Path>,
    opts: &CreateOptions,
    bitmap: BitmapRequest,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    check_device_count(devices.len(), opts)?;
    let mut all = devices.to_vec();
    all.extend(journal.map(|j| MemberSpec::Device(j.to_path_buf())));
    let mut opened: Vec<Option<(String, MemberRef)>> = open_devices(&all)?
        .into_iter()
        .map(|o| o.map(|o| (o.path, o.member)))
        .collect();
    let journal = match journal {
        Some(_) => opened.pop().flatten(),
        None => None,
    };
    create_on_members_full(opened, journal, opts, bitmap, progress)
}

/// The consistency policy for a bitmap request: the bitmap's chunk and
/// place as mdadm's add_internal_bitmap1 chooses them at create.
fn bitmap_policy(
    request: BitmapRequest,
    opts: &CreateOptions,
    layout: u32,
    size_sectors: u64,
) -> Result<ConsistencyPolicy, CreateError> {
    let BitmapRequest::Internal { chunk_bytes } = request else {
        return Ok(ConsistencyPolicy::Resync);
    };
    let level = opts.level;
    // mdadm: "bitmaps not meaningful with level" for linear and raid0,
    // which have no redundancy to resync.
    if md_like_level(level) <= 0 {
        return Err(invalid(format!(
            "a write-intent bitmap is not meaningful with {level}"
        )));
    }
    if opts.metadata == Metadata::V0_90 {
        return Err(invalid(
            "uraid creates internal bitmaps with 1.x metadata only; use --metadata 1.2",
        ));
    }
    if let Some(c) = chunk_bytes {
        if !c.is_power_of_two() || !(512..=1 << 31).contains(&c) {
            return Err(invalid(format!(
                "invalid bitmap chunk size {c} bytes: it must be a power of two from 512 bytes to 2G"
            )));
        }
    }
    let sync =
        format::bitmap_sync_sectors(md_like_level(level), layout, opts.raid_disks, size_sectors);
    let bm = format::default_internal_bitmap(opts.metadata, size_sectors, sync, chunk_bytes)?;
    if bm.chunk_bytes > 1 << 31 {
        return Err(invalid("the devices are too large for an internal bitmap"));
    }
    Ok(ConsistencyPolicy::Bitmap(bm))
}

/// Writes a new member's bitmap: mdadm's bitmap superblock with the
/// member superblock's events, every bit set when a resync will follow
/// (write_array_state clears them when the resync has made the array
/// clean) and clear otherwise.
fn write_initial_bitmap(
    o: &Opened,
    sb: &MemberSuper,
    bm: &InternalBitmap,
    dirty: bool,
) -> Result<(), CreateError> {
    let chunk_bytes = u32::try_from(bm.chunk_bytes).expect("checked by bitmap_policy");
    let bsb = BitmapSuper::new(sb.set_uuid, sb.events, bm.sync_sectors, chunk_bytes);
    let bits = Bitmap::new(bsb.chunks(), dirty);
    write_bitmap(&*o.member, sb, &bsb, &bits)?;
    Ok(())
}

/// The start of a new journal, as mdadm's write_empty_r5l_meta_block
/// writes it: an empty meta block at the journal's data offset, position 0,
/// a random sequence number (journal_tail, in the superblock, is 0).
fn write_empty_journal(o: &Opened, sb: &MemberSuper) -> Result<(), CreateError> {
    use format::journal as fmt;
    let block = fmt::MetaBlock {
        seq: u64::from(rand::random::<u32>()),
        position: 0,
        payloads: Vec::new(),
    };
    let bytes = fmt::encode(&block, fmt::uuid_seed(&sb.set_uuid)).expect("an empty block fits");
    o.member
        .write_at(
            &crate::member::AlignedBuf::copy_from(&bytes),
            sb.data_offset_sectors * crate::units::SECTOR_BYTES,
        )
        .map_err(|e| CreateError::Device(format!("{}: writing the journal: {e}", o.path)))
}

fn check_device_count(count: usize, opts: &CreateOptions) -> Result<(), CreateError> {
    if opts.raid_disks < opts.level.min_raid_disks() {
        return Err(invalid(format!(
            "{} needs at least {} raid devices",
            opts.level,
            opts.level.min_raid_disks()
        )));
    }
    if count < opts.raid_disks as usize {
        return Err(invalid(format!(
            "{count} devices given for {} raid devices",
            opts.raid_disks
        )));
    }
    Ok(())
}

/// Creates the array on members already opened (None stands for "missing").
pub fn create_on_members(
    members: Vec<Option<(String, MemberRef)>>,
    opts: &CreateOptions,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    create_on_members_with_bitmap(members, opts, BitmapRequest::None, progress)
}

/// [`create_on_members`] with a write-intent bitmap.
pub fn create_on_members_with_bitmap(
    members: Vec<Option<(String, MemberRef)>>,
    opts: &CreateOptions,
    bitmap: BitmapRequest,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    create_on_members_full(members, None, opts, bitmap, progress)
}

/// Keeps device numbers `raid_disks..raid_disks + spares` for a dRAID's
/// distributed spares (`dspare::spare_dev_numbers`): hot spares and a
/// journal listed at create, which mdadm's numbering puts from
/// `raid_disks` on, move up past them. The spares keep these numbers for
/// the array's life, so that a disk added while a spare's superblock cannot
/// be read never takes one.
fn reserve_distributed_spare_numbers(
    plan: &mut format::CreatePlan,
    raid_disks: u32,
    spares: usize,
) {
    if spares == 0 {
        return;
    }
    let reserved = super::dspare::spare_dev_numbers(raid_disks, spares);
    let shift = reserved.end - reserved.start;
    for n in plan.dev_numbers.iter_mut().flatten() {
        if *n >= reserved.start {
            *n += shift;
        }
    }
    let at = (reserved.start as usize).min(plan.roles.len());
    plan.roles.splice(
        at..at,
        std::iter::repeat_n(format::Role::Spare, shift as usize),
    );
    assert!(plan
        .dev_numbers
        .iter()
        .flatten()
        .all(|n| !reserved.contains(n)));
}

/// [`create_on_members`] with a write-intent bitmap or a write journal
/// (mdadm's --write-journal: md's raid5-cache device, for raid4/5/6).
///
/// Every check comes before the first write: the request, the device
/// list, the sizes, the geometry and what it survives, the journal's room,
/// and every superblock built. Only then are they written, the array
/// assembled from them and, unless --assume-clean, resynced.
pub fn create_on_members_full(
    mut members: Vec<Option<(String, MemberRef)>>,
    journal: Option<(String, MemberRef)>,
    opts: &CreateOptions,
    bitmap: BitmapRequest,
    progress: impl FnMut(u64, u64),
) -> Result<Assembled, CreateError> {
    check_device_count(members.len(), opts)?;
    if journal.is_some() {
        check_journal_request(opts, bitmap)?;
    }
    // The journal comes last in mdadm's device list: after the spares.
    let journal_index = journal.as_ref().map(|_| members.len());
    members.extend(journal.map(Some));
    let (devices, opened) = device_list(members);
    if !opts.force {
        for o in opened.iter().flatten() {
            refuse_existing_content(o)?;
        }
    }
    let level = opts.level;
    // md's rules for a redundant level fit dRAID where md's level number is
    // asked (sizes, missing devices, the bitmap): it is raid6's, not one
    // of md's negative numbers, which mean levels without redundancy.
    let md_like = md_like_level(level);
    check_device_list(&devices, opts)?;
    let raid_disks = opts.raid_disks as usize;
    let chunk_sectors = chunk_sectors_for(level, opts.chunk_bytes)?;
    let layout = layout_for(level, opts.layout.as_deref())?;
    let missing: Vec<bool> = devices[..raid_disks]
        .iter()
        .map(|d| *d == MemberSpec::Missing)
        .collect();
    if missing.iter().all(|m| *m) {
        return Err(invalid("every raid device is missing"));
    }
    let sizes = member_sizes(&opened, opts, journal_index)?;
    let spare_end = journal_index.unwrap_or(devices.len());
    let sizing = size_members(&opened, &sizes, spare_end, opts, chunk_sectors, layout)?;
    let Sizing {
        data_offset,
        size_sectors,
        ..
    } = sizing;
    let (geometry, raid0_layout_feature) =
        geometry_of(opts, layout, chunk_sectors, &sizes, &sizing)?;
    if !geometry.survives(&missing) {
        return Err(invalid(format!(
            "{level} cannot start with {} of {raid_disks} devices missing",
            missing.iter().filter(|m| **m).count()
        )));
    }
    // Linear and raid0 use every member whole; the other levels use as much
    // of each as the smallest has, unless --size said how much.
    if md_like > 0 && opts.size_sectors.is_none() && !opts.force {
        refuse_uneven_sizes(&sizing.given, size_sectors, geometry.array_sectors())?;
    }
    if let Some(j) = journal_index {
        let path = &opened[j].as_ref().expect("the journal is a device").path;
        let device_sectors = sizes[j].expect("opened");
        check_journal_room(path, device_sectors, data_offset, chunk_sectors, raid_disks)?;
    }
    let CreatePlan {
        dev_numbers,
        spec,
        needs_resync,
    } = plan_superblocks(
        &devices,
        journal_index,
        opts,
        bitmap,
        layout,
        chunk_sectors,
        size_sectors,
        raid0_layout_feature,
    )?;
    let supers = member_superblocks(opened, &sizes, &dev_numbers, &spec, data_offset)?;
    let spare_supers =
        distributed_spare_superblocks(&supers, draid_spares(level, layout), size_sectors)?;
    // Every superblock was built: only now is anything written.
    write_created(&supers, &spare_supers, &spec.policy, needs_resync)?;
    if opts.integrity {
        format_integrity(&supers, journal_index.is_some())?;
    }
    let mut array = assemble_members(
        supers
            .into_iter()
            .map(|(o, _)| (o.path, o.member))
            .collect(),
    )?;
    if needs_resync {
        resync_created(&mut array, progress)?;
    }
    if opts.integrity {
        derive_created(&array, needs_resync)?;
    }
    Ok(array)
}

/// The sectors of each device md may use: all of it, or with checksums
/// (refused where they cannot be) what their region leaves (the journal
/// keeps its own).
fn member_sizes(
    opened: &[Option<Opened>],
    opts: &CreateOptions,
    journal_index: Option<usize>,
) -> Result<Vec<Option<u64>>, CreateError> {
    if opts.integrity {
        check_integrity_request(opts)?;
    }
    opened
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let o = o.as_ref()?;
            let device = o.member.size_sectors();
            if !opts.integrity || Some(i) == journal_index {
                return Some(Ok(device));
            }
            Some(super::integrity::usable_sectors(device).ok_or_else(|| {
                CreateError::Device(format!("{}: too small for a checksum region", o.path))
            }))
        })
        .map(Option::transpose)
        .collect()
}

/// What `--integrity` needs: redundancy to heal from, and a superblock at
/// the start so that the region after md's data area is md's to ignore.
fn check_integrity_request(opts: &CreateOptions) -> Result<(), CreateError> {
    if !opts.level.redundant() {
        return Err(invalid(format!(
            "--integrity needs redundancy to correct from; {} has none",
            opts.level
        )));
    }
    if !matches!(opts.metadata, Metadata::V1_1 | Metadata::V1_2) {
        return Err(invalid(format!(
            "--integrity needs metadata 1.1 or 1.2 (its checksums live after md's data area, \
             where {} keeps its superblock)",
            opts.metadata
        )));
    }
    Ok(())
}

/// Writes every member's checksum region (every block untrusted until
/// derived), after the superblocks that place it. The journal (the last
/// device) keeps none: its blocks carry their own checksums.
fn format_integrity(supers: &[(Opened, MemberSuper)], journal: bool) -> Result<(), CreateError> {
    let members = &supers[..supers.len() - usize::from(journal)];
    for (o, sb) in members {
        super::integrity::format_member(o.member.clone(), sb)
            .map_err(|e| CreateError::Device(format!("{}: {e}", o.path)))?;
    }
    Ok(())
}

/// Gives a new integrity array its checksums: a resync derived those of
/// every row it made consistent; an array made --assume-clean is taken at
/// its word and checksummed as it is. Then each region is closed at the
/// event count its superblock ends with, so that `serve` trusts it.
fn derive_created(array: &Assembled, resynced: bool) -> Result<(), CreateError> {
    for opened in &array.integrity {
        let io = |e: std::io::Error| CreateError::Device(format!("{}: {e}", opened.path));
        let device = array
            .devices
            .iter()
            .find(|d| d.path == opened.path)
            .expect("an integrity member is a device of the array");
        match resynced {
            true => super::integrity::derive_unused(&opened.member, &device.sb).map_err(io)?,
            false => opened.member.derive_all_from_disk(|_, _| {}).map_err(io)?,
        }
        opened.member.close(device.sb.events).map_err(io)?;
    }
    Ok(())
}

/// The device list as mdadm's create reads it ('missing' where a member
/// is none), beside the devices opened.
fn device_list(
    members: Vec<Option<(String, MemberRef)>>,
) -> (Vec<MemberSpec>, Vec<Option<Opened>>) {
    let devices: Vec<MemberSpec> = members
        .iter()
        .map(|m| match m {
            Some((name, _)) => MemberSpec::Device(name.into()),
            None => MemberSpec::Missing,
        })
        .collect();
    let opened: Vec<Option<Opened>> = members
        .into_iter()
        .map(|m| m.map(|(path, member)| Opened { path, member }))
        .collect();
    (devices, opened)
}

/// What every superblock of a new array will say, and who gets which
/// number: md's device numbering, the distributed spares' numbers kept,
/// the consistency policy, clean unless the array needs a resync.
struct CreatePlan {
    dev_numbers: Vec<Option<u32>>,
    spec: CreateSpec,
    needs_resync: bool,
}

#[allow(clippy::too_many_arguments)]
fn plan_superblocks(
    devices: &[MemberSpec],
    journal_index: Option<usize>,
    opts: &CreateOptions,
    bitmap: BitmapRequest,
    layout: u32,
    chunk_sectors: u32,
    size_sectors: u64,
    raid0_layout_feature: bool,
) -> Result<CreatePlan, CreateError> {
    let level = opts.level;
    let md_like = md_like_level(level);
    let kinds: Vec<CreateDevice> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if Some(i) == journal_index {
                CreateDevice::Journal
            } else if *d == MemberSpec::Missing {
                CreateDevice::Missing
            } else {
                CreateDevice::Disk
            }
        })
        .collect();
    // uraid computes redundancy itself below, so it numbers devices the way
    // mdadm does with --force (no spare-rebuild trick).
    let mut plan = format::plan_create(md_like, opts.raid_disks, &kinds, true, true)?;
    reserve_distributed_spare_numbers(&mut plan, opts.raid_disks, draid_spares(level, layout));
    let needs_resync = level.redundant() && !opts.assume_clean;
    let policy = bitmap_policy(bitmap, opts, layout, size_sectors)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let spec = CreateSpec {
        metadata: opts.metadata,
        level: level.md_number(),
        layout,
        chunk_sectors,
        raid_disks: opts.raid_disks,
        size_sectors,
        name: opts.name.clone(),
        homehost: opts.homehost.clone(),
        set_uuid: rand::random(),
        ctime_secs: now,
        clean: !needs_resync,
        policy,
        bad_block_log: true,
        roles: plan.roles.clone(),
        spare_disks: plan.spare_disks,
        raid0_layout_feature,
    };
    assert_eq!(plan.dev_numbers.len(), devices.len());
    Ok(CreatePlan {
        dev_numbers: plan.dev_numbers,
        spec,
        needs_resync,
    })
}

/// A write journal is md's raid5-cache: for raid4/5/6, without a bitmap,
/// on 1.1 or 1.2 metadata.
fn check_journal_request(opts: &CreateOptions, bitmap: BitmapRequest) -> Result<(), CreateError> {
    if !matches!(opts.level, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        return Err(invalid(format!(
            "a write journal is for raid4/5/6, not {}",
            opts.level
        )));
    }
    if bitmap != BitmapRequest::None {
        return Err(invalid(
            "an array cannot have both a write journal and a bitmap (md refuses to run it)",
        ));
    }
    if !matches!(opts.metadata, Metadata::V1_1 | Metadata::V1_2) {
        return Err(invalid(
            "uraid creates write journals with 1.1 or 1.2 metadata; use --metadata 1.2",
        ));
    }
    Ok(())
}

/// What the device list itself must be: 'missing' only for raid devices,
/// no more devices than 0.90's table holds, dRAID on 1.2 metadata.
fn check_device_list(devices: &[MemberSpec], opts: &CreateOptions) -> Result<(), CreateError> {
    if opts.level.is_draid() && opts.metadata != Metadata::V1_2 {
        return Err(invalid(
            "a dRAID array keeps uraid's own superblock at the 1.2 location; use --metadata 1.2",
        ));
    }
    if devices[opts.raid_disks as usize..].contains(&MemberSpec::Missing) {
        return Err(invalid(
            "'missing' can only stand for a raid device, not a spare",
        ));
    }
    if opts.metadata == Metadata::V0_90 && devices.len() > format::sb090::MD_SB_DISKS {
        return Err(invalid(format!(
            "0.90 metadata holds at most {} devices",
            format::sb090::MD_SB_DISKS
        )));
    }
    Ok(())
}

/// How much of each device the array uses.
struct Sizing<'a> {
    /// Sectors before the data on every member (mdadm takes the first
    /// device's and uses it for all).
    data_offset: u64,
    /// Sectors of data per member.
    size_sectors: u64,
    /// The raid devices and spares, for the size check.
    given: Vec<GivenDevice<'a>>,
}

/// The data offset and the per-member size: what the smallest device (the
/// journal aside) has room for after md's metadata, or --size, cut to
/// whole chunks, and for dRAID to whole rows after its distributed spares'
/// metadata.
fn size_members<'a>(
    opened: &'a [Option<Opened>],
    sizes: &[Option<u64>],
    spare_end: usize,
    opts: &CreateOptions,
    chunk_sectors: u32,
    layout: u32,
) -> Result<Sizing<'a>, CreateError> {
    let level = opts.level;
    let md_like = md_like_level(level);
    let first_size = sizes
        .iter()
        .flatten()
        .next()
        .copied()
        .expect("one device at least");
    let data_offset = match opts.metadata {
        Metadata::V1_0 | Metadata::V0_90 => 0,
        _ => format::default_data_offset_sectors(first_size, chunk_sectors, false),
    };
    let mut free = Vec::new();
    // md's journal is exempt from the member size check (mdadm: "skip write
    // journal for size check"); its own minimum is checked apart.
    let mut given: Vec<GivenDevice> = Vec::new();
    for (i, (o, size)) in opened.iter().zip(sizes).enumerate().take(spare_end) {
        let (Some(o), Some(size)) = (o, size) else {
            continue;
        };
        given.push(GivenDevice {
            path: &o.path,
            sectors: *size,
            raid_device: i < opts.raid_disks as usize,
        });
        let room = format::mdadm_freesize_sectors(opts.metadata, *size, data_offset, false)
            .filter(|room| *room >= chunk_sectors.max(128) as u64)
            .ok_or_else(|| {
                CreateError::Device(format!(
                    "{}: too small ({size} sectors) for an md member",
                    o.path
                ))
            })?;
        free.push(room);
    }
    let min_free = *free.iter().min().expect("one device at least");
    // A dRAID child keeps its distributed spares' metadata after its data.
    let spare_meta = draid_spares(level, layout) as u64 * data_offset;
    let min_free = if level.is_draid() {
        min_free.checked_sub(spare_meta).ok_or_else(|| {
            CreateError::Device(format!(
                "the devices are too small for the distributed spares' metadata ({} KiB each)",
                spare_meta / 2
            ))
        })?
    } else {
        min_free
    };
    let size_sectors = match opts.size_sectors {
        Some(s) if s > min_free => {
            return Err(invalid(format!(
                "--size asks for {} KiB per device but the smallest has {} KiB",
                s / 2,
                min_free / 2
            )))
        }
        Some(s) => format::default_size_sectors(md_like, chunk_sectors, s),
        None => format::default_size_sectors(md_like, chunk_sectors, min_free),
    };
    let size_sectors = if level.is_draid() {
        draid_size_sectors(level, layout, chunk_sectors, opts.raid_disks, size_sectors)?
    } else {
        size_sectors
    };
    if md_like > 0 && size_sectors == 0 {
        return Err(invalid("the devices are too small for one chunk of data"));
    }
    assert!(size_sectors <= min_free);
    Ok(Sizing {
        data_offset,
        size_sectors,
        given,
    })
}

/// The array's geometry from the sizes, and whether raid0 needs md's
/// layout feature (members of different sizes).
fn geometry_of(
    opts: &CreateOptions,
    layout: u32,
    chunk_sectors: u32,
    sizes: &[Option<u64>],
    sizing: &Sizing,
) -> Result<(Geometry, bool), CreateError> {
    let raid_disks = opts.raid_disks as usize;
    let data_offset = sizing.data_offset;
    let member_data: Vec<u64> = sizes
        .iter()
        .take(raid_disks)
        .map(|s| s.map_or(0, |s| s - data_offset))
        .collect();
    let raid0_layout_feature = opts.level == Level::Raid0
        && format::raid0_needs_layout(
            layout,
            chunk_sectors,
            &sizes
                .iter()
                .take(raid_disks)
                .map(|s| (s.unwrap_or(0), data_offset))
                .collect::<Vec<_>>(),
        );
    let geometry = Geometry::new(&GeometryParams {
        level: opts.level,
        layout,
        chunk_sectors: chunk_sectors as u64,
        raid_disks: opts.raid_disks,
        dev_sectors: sizing.size_sectors,
        member_data_sectors: member_data,
        raid0_layout_feature,
    })
    .map_err(|e| invalid(e.to_string()))?;
    Ok((geometry, raid0_layout_feature))
}

/// The journal's ring (whole journal blocks after the data offset) must
/// hold what md's raid5-cache needs for this chunk and device count.
fn check_journal_room(
    path: &str,
    device_sectors: u64,
    data_offset: u64,
    chunk_sectors: u32,
    raid_disks: usize,
) -> Result<(), CreateError> {
    let ring = device_sectors.saturating_sub(data_offset) / format::journal::BLOCK_SECTORS
        * format::journal::BLOCK_SECTORS;
    let needed = format::journal::min_ring_sectors(chunk_sectors as u64, raid_disks);
    if ring < needed {
        return Err(CreateError::Device(format!(
            "{path}: too small for the journal ({} KiB after the data offset; {} KiB chunks on {raid_disks} devices need {} KiB)",
            ring / 2,
            chunk_sectors / 2,
            needed / 2
        )));
    }
    Ok(())
}

/// One superblock per device given, numbered by the plan.
fn member_superblocks(
    opened: Vec<Option<Opened>>,
    sizes: &[Option<u64>],
    dev_numbers: &[Option<u32>],
    spec: &CreateSpec,
    data_offset: u64,
) -> Result<Vec<(Opened, MemberSuper)>, CreateError> {
    assert_eq!(opened.len(), dev_numbers.len());
    assert_eq!(opened.len(), sizes.len());
    let mut supers = Vec::new();
    for ((o, dev_number), size) in opened.into_iter().zip(dev_numbers).zip(sizes) {
        let (Some(o), Some(dev_number)) = (o, dev_number) else {
            continue;
        };
        // What md may use of the device: all of it, or with checksums what
        // their region leaves.
        let device_sectors = size.expect("an opened device has a size");
        assert!(device_sectors <= o.member.size_sectors());
        let member = CreateMember {
            dev_number: *dev_number,
            device_sectors,
            data_offset_sectors: Some(data_offset),
            device_uuid: rand::random(),
            write_mostly: false,
            failfast: false,
        };
        let sb = match spec.metadata {
            Metadata::V0_90 => superblock_090(spec, &member)?,
            _ => MemberSuper::new_for_create(spec, &member)?,
        };
        supers.push((o, sb));
    }
    Ok(supers)
}

/// The distributed spares are spares from the start, with the numbers
/// kept for them (`reserve_distributed_spare_numbers`) and superblocks
/// like a spare disk's.
fn distributed_spare_superblocks(
    supers: &[(Opened, MemberSuper)],
    spare_count: usize,
    size_sectors: u64,
) -> Result<Vec<MemberSuper>, CreateError> {
    if spare_count == 0 {
        return Ok(Vec::new());
    }
    let template = supers
        .first()
        .map(|(_, sb)| sb.clone())
        .ok_or_else(|| invalid("no device to create on"))?;
    let numbers = super::dspare::spare_dev_numbers(template.raid_disks, spare_count);
    assert!(supers
        .iter()
        .all(|(_, sb)| !numbers.contains(&sb.dev_number)));
    let mut spare_supers = Vec::new();
    for dev_number in numbers {
        let mut sb = template.clone();
        sb.dev_number = dev_number;
        sb.device_uuid = rand::random();
        sb.data_size_sectors = size_sectors;
        if sb.max_dev <= sb.dev_number {
            return Err(invalid("too many devices for the superblock's role table"));
        }
        sb.dev_roles[sb.dev_number as usize] = format::MD_DISK_ROLE_SPARE;
        spare_supers.push(sb);
    }
    Ok(spare_supers)
}

/// Writes every superblock built, the journal's empty ring, the initial
/// bitmap, and the distributed spares' metadata, each device flushed.
fn write_created(
    supers: &[(Opened, MemberSuper)],
    spare_supers: &[MemberSuper],
    policy: &ConsistencyPolicy,
    needs_resync: bool,
) -> Result<(), CreateError> {
    for (o, sb) in supers {
        write_superblock(&*o.member, sb)?;
        if sb.role_of(sb.dev_number) == format::Role::Journal {
            write_empty_journal(o, sb)?;
        }
        if let ConsistencyPolicy::Bitmap(bm) = policy {
            write_initial_bitmap(o, sb, bm, needs_resync)?;
        }
        o.member
            .flush()
            .map_err(|e| CreateError::Device(format!("{}: {e}", o.path)))?;
    }
    if !spare_supers.is_empty() {
        write_distributed_spares(supers, spare_supers, policy, needs_resync)?;
    }
    Ok(())
}

/// Makes a new redundant array's redundancy agree with its data, then
/// records it clean.
fn resync_created(
    array: &mut Assembled,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), CreateError> {
    let total = array.geometry.stripe_count();
    resync(&array.geometry, &array.slots, 0..total, true, |done| {
        progress(done, total)
    })
    .map_err(|e| CreateError::Resync(e.to_string()))?;
    for slot in array.slots.iter().flatten() {
        slot.member
            .flush()
            .map_err(|e| CreateError::Device(e.to_string()))?;
    }
    write_array_state(array, Cleanliness::Clean)?;
    Ok(())
}

/// A device of a create, for the size check: a raid device or a spare.
struct GivenDevice<'a> {
    path: &'a str,
    sectors: u64,
    raid_device: bool,
}

/// Refuses a device more than 1% smaller than the largest raid device:
/// every member would give only what the smallest has, and the array
/// would quietly be smaller than its devices promise. mdadm warns at the
/// same point (its largest drive "exceeds size ... by more than 1%") and
/// asks before it goes on; uraid asks for --force (or --size). A spare
/// larger than the raid devices shrinks nothing and is not counted as
/// the largest.
fn refuse_uneven_sizes(
    given: &[GivenDevice],
    member_sectors: u64,
    array_sectors: u64,
) -> Result<(), CreateError> {
    // The first of equals, as the devices were given, names each side.
    let largest = given
        .iter()
        .filter(|d| d.raid_device)
        .min_by_key(|d| std::cmp::Reverse(d.sectors))
        .expect("a raid device is present: not every one is missing");
    let smallest = given
        .iter()
        .min_by_key(|d| d.sectors)
        .expect("the largest is one of them");
    assert!(smallest.sectors <= largest.sectors);
    if smallest.sectors * 100 >= largest.sectors * 99 {
        return Ok(());
    }
    Err(CreateError::Device(format!(
        "{} ({} KiB) is more than 1% smaller than {} ({} KiB): every device would give only {} KiB and the array would be {} KiB; use --force to create it so, or --size to say how much of each device to use",
        smallest.path,
        smallest.sectors / 2,
        largest.path,
        largest.sectors / 2,
        member_sectors / 2,
        array_sectors / 2
    )))
}

/// md's level number for md's rules that a level follows: raid6's for
/// dRAID (redundant, chunked, parity), the level's own otherwise.
fn md_like_level(level: Level) -> i32 {
    if level.is_draid() {
        6
    } else {
        level.md_number()
    }
}

/// A dRAID layout word's distributed spares (0 for every other level).
fn draid_spares(level: Level, layout: u32) -> usize {
    if level.is_draid() {
        ((layout >> 8) & 0xff) as usize
    } else {
        0
    }
}

/// The sectors of each child a dRAID uses: whole slices of its layout,
/// at most `room`.
fn draid_size_sectors(
    level: Level,
    layout: u32,
    chunk_sectors: u32,
    raid_disks: u32,
    room: u64,
) -> Result<u64, CreateError> {
    let params = |dev_sectors| GeometryParams {
        level,
        layout,
        chunk_sectors: chunk_sectors as u64,
        raid_disks,
        dev_sectors,
        member_data_sectors: vec![dev_sectors; raid_disks as usize],
        raid0_layout_feature: false,
    };
    let geometry = Geometry::new(&params(room)).map_err(|e| invalid(e.to_string()))?;
    let draid = geometry
        .draid()
        .expect("a dRAID level builds a dRAID geometry");
    Ok(draid.slices() * draid.devslice_sectors())
}

/// Writes the superblocks (and bitmaps) of a new dRAID's distributed
/// spares into their metadata slots on every child.
fn write_distributed_spares(
    children: &[(Opened, MemberSuper)],
    spares: &[MemberSuper],
    policy: &ConsistencyPolicy,
    dirty: bool,
) -> Result<(), CreateError> {
    let first = &children.first().expect("a dRAID has children").1;
    let level = Level::from_number(first.level).expect("a dRAID level");
    let geometry = Geometry::new(&GeometryParams {
        level,
        layout: first.layout,
        chunk_sectors: first.chunk_sectors as u64,
        raid_disks: first.raid_disks,
        dev_sectors: first.size_sectors,
        member_data_sectors: vec![first.size_sectors; first.raid_disks as usize],
        raid0_layout_feature: false,
    })
    .map_err(|e| invalid(e.to_string()))?;
    let draid = geometry
        .draid()
        .expect("a dRAID level builds a dRAID geometry");
    let mut roles: Vec<Option<MemberRef>> = vec![None; first.raid_disks as usize];
    for (o, sb) in children {
        if let format::Role::Active(role) = sb.this_role() {
            roles[role as usize] = Some(o.member.clone());
        }
    }
    let block_bytes = children
        .iter()
        .map(|(o, _)| o.member.logical_block_bytes())
        .max()
        .unwrap_or(512);
    let router = super::dspare::SpareRouter::new(roles);
    let area = super::dspare::SpareArea {
        data_offset_sectors: first.data_offset_sectors,
        dev_sectors: first.size_sectors,
    };
    for (s, sb) in spares.iter().enumerate() {
        let member =
            super::dspare::DistributedSpare::new(draid, s, area, router.clone(), block_bytes);
        let member: MemberRef = Arc::new(member);
        let opened = Opened {
            path: member.name().to_string(),
            member,
        };
        write_superblock(&*opened.member, sb)?;
        if let ConsistencyPolicy::Bitmap(bm) = policy {
            write_initial_bitmap(&opened, sb, bm, dirty)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CreateDevice, Role};

    #[test]
    fn hot_spares_and_a_journal_move_past_the_distributed_spares_numbers() {
        use CreateDevice::*;
        // Four children (the last missing), a hot spare and a journal.
        let kinds = [Disk, Disk, Disk, Missing, Disk, Journal];
        let mut plan = format::plan_create(5, 4, &kinds, true, true).unwrap();
        assert_eq!(
            plan.dev_numbers,
            vec![Some(0), Some(1), Some(2), None, Some(4), Some(5)]
        );
        reserve_distributed_spare_numbers(&mut plan, 4, 2);
        assert_eq!(
            plan.dev_numbers,
            vec![Some(0), Some(1), Some(2), None, Some(6), Some(7)]
        );
        assert_eq!(plan.roles[4..6], [Role::Spare, Role::Spare]);
        assert_eq!(plan.roles[6], Role::Spare);
        assert_eq!(plan.roles[7], Role::Journal);
        // Without distributed spares nothing moves.
        let before = format::plan_create(5, 4, &kinds, true, true).unwrap();
        let mut same = before.clone();
        reserve_distributed_spare_numbers(&mut same, 4, 0);
        assert_eq!(same, before);
    }
}
