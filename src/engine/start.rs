//! The steps of `Engine::start`, in the order it takes them: what refuses
//! an array, the write journal opened and replayed, what a crash makes
//! untrusted, the array marked active, the member table built from the
//! devices' states, and the work an array resumes once it serves.

use super::{
    journal, members, reshape, Arc, Engine, EngineError, EngineOptions, MemberEntry, MemberTable,
    Ordering, SyncAction, SyncWorker, SECTOR_BYTES,
};
use crate::array::{write_array_state_failing, Assembled, Cleanliness, DeviceState};
use crate::engine::position::Position;
use crate::geometry::{Geometry, Level};

/// Refuses what md refuses to run: an array without enough members, a
/// reshape it cannot resume, a dirty degraded parity array (unless
/// forced), a missing journal for writing, a journal beside a bitmap.
pub(super) fn refuse_unstartable(
    array: &Assembled,
    options: &EngineOptions,
) -> Result<(), EngineError> {
    array.require_runnable()?;
    if array.geometry.reshaping().is_some() {
        reshape::check_resumable(array).map_err(EngineError::Reshaping)?;
    }
    let level = array.level();
    // A member rebuilt along with a reshape that held only parity in
    // the old layout has nothing a crash could make reconstruct wrongly
    // (raid5_run's dirty_parity_disks).
    let degraded = array.missing_roles().len() > crate::array::dirty_parity_members(array);
    if level.has_parity() && degraded && !array.is_clean() && !options.force {
        return Err(EngineError::DirtyDegraded { level });
    }
    if array.journal_missing() && !options.read_only {
        return Err(EngineError::JournalMissing);
    }
    if crate::array::has_journal_feature(&array.sb)
        && array.sb.feature_map & crate::format::MD_FEATURE_BITMAP_OFFSET != 0
    {
        return Err(EngineError::JournalWithBitmap);
    }
    Ok(())
}

/// The array's write journal, if it has one (raid4/5/6 only, as md's
/// raid5-cache).
pub(super) fn open_journal(
    array: &Assembled,
) -> Result<Option<Arc<journal::Journal>>, EngineError> {
    let Some(device) = array.journal() else {
        return Ok(None);
    };
    let level = array.level();
    if !matches!(level, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        return Err(EngineError::JournalLevel { level });
    }
    Ok(Some(Arc::new(journal::Journal::new(
        device.member.clone(),
        &device.path,
        device.sb.data_offset_sectors,
        device.sb.data_size_sectors,
        device.sb.recovery_offset_sectors,
        &array.sb.set_uuid,
        &array.geometry,
    )?)))
}

/// Pages of data the journal holds without their parity, to be written
/// through the engine once it runs: (array sector, page).
pub(super) type DataOnly = Vec<(u64, Vec<u8>)>;

/// Rows torn by a crash are made whole from the journal before anything
/// reads them (md's r5l_recovery_log). Returns the data logged without
/// parity, and whether anything was replayed.
pub(super) fn replay_journal(
    array: &mut Assembled,
    journal: &journal::Journal,
) -> Result<(DataOnly, bool), EngineError> {
    // A member being rebuilt gets the replay too (md writes every rdev
    // present): below its recovery offset it is trusted.
    let mut slots = array.slots.clone();
    for device in &array.devices {
        if let DeviceState::Recovering { role, .. } = device.state {
            slots[role].get_or_insert_with(|| members::slot_of(device));
        }
    }
    let recovered = journal
        .recover(&array.geometry, &slots)
        .map_err(EngineError::JournalReplay)?;
    if recovered.units > 1 || !recovered.data_only.is_empty() {
        eprintln!(
            "uraid: write journal {}: {} units read, {} rows replayed, {} pages of data to write",
            journal.path(),
            recovered.units,
            recovered.rows_replayed,
            recovered.data_only.len()
        );
    }
    let replayed = recovered.rows_replayed > 0 || !recovered.data_only.is_empty();
    let tail = journal.tail();
    for d in array.devices.iter_mut() {
        if d.state == DeviceState::Journal {
            d.sb.recovery_offset_sectors = tail;
        }
    }
    Ok((recovered.data_only, replayed))
}

/// A replacement's copy resumes where it stood only after an orderly
/// stop: after a crash, writes in flight (or replayed from the journal,
/// or redone by the resync) may have reached the member it copies and not
/// it, and what it holds is not trusted.
pub(super) fn distrust_replacements(array: &mut Assembled) {
    for d in array.devices.iter_mut() {
        if let DeviceState::Replacement {
            recovery_offset_sectors,
            ..
        } = &mut d.state
        {
            *recovery_offset_sectors = 0;
        }
    }
}

/// Marks the array active in every superblock, as md does at its first
/// write: tracked by the bitmap, journaled, or plainly dirty. A member
/// whose superblock cannot be written starts out failed.
pub(super) fn mark_active(
    array: &mut Assembled,
    bitmap: bool,
    journal_clean: bool,
) -> Result<(), EngineError> {
    let state = if bitmap {
        Cleanliness::DirtyTracked
    } else if journal_clean {
        Cleanliness::DirtyJournaled
    } else {
        Cleanliness::Dirty
    };
    for lost in write_array_state_failing(array, state)? {
        eprintln!("uraid: {} failed at start: {}", lost.path, lost.error);
    }
    array.require_runnable()?;
    Ok(())
}

/// The member table from the devices' states: the members in sync, those
/// left half-rebuilt, and the replacements.
pub(super) fn member_table(array: &mut Assembled, geometry: &Geometry) -> MemberTable {
    let mut table = MemberTable {
        by_role: array
            .slots
            .iter()
            .map(|s| {
                s.clone().map(|slot| MemberEntry {
                    slot,
                    rebuilt_below: None,
                })
            })
            .collect(),
        replacing: vec![None; array.slots.len()],
        routes: None,
    };
    add_half_rebuilt(&mut table, array, geometry);
    add_replacements(&mut table, array, geometry);
    table
}

/// A member left half-rebuilt is in sync below its recovery offset, and
/// must stay so while a crash resync runs before its recovery resumes: md
/// keeps such a member in the array, writes go to it and the resync covers
/// it there. Left out, it would miss those writes and the recovery,
/// resuming at the old offset, would trust it.
fn add_half_rebuilt(table: &mut MemberTable, array: &Assembled, geometry: &Geometry) {
    for device in &array.devices {
        let DeviceState::Recovering {
            role,
            recovery_offset_sectors,
        } = device.state
        else {
            continue;
        };
        if table.by_role[role].is_some() {
            continue;
        }
        // Along with a reshape, the done side (see check_resumable).
        let below = match geometry.reshaping() {
            Some(r) => r.done_stripes(),
            None => geometry.stripe_at_resync_position(recovery_offset_sectors),
        };
        // Mid-reshape, places count from the lower of the member's two
        // data offsets, as the slots' do.
        let mut slot = members::slot_of(device);
        if geometry.reshaping().is_some() {
            let new = u64::try_from(device.sb.new_data_offset_sectors()).unwrap_or(0);
            slot.data_offset_bytes = device.sb.data_offset_sectors.min(new) * SECTOR_BYTES;
        }
        table.by_role[role] = Some(MemberEntry {
            slot,
            rebuilt_below: Some(Arc::new(Position::new(below))),
        });
    }
}

/// A replacement takes writes below where its copy stood (see
/// manage_replace); its job resumes once the array is in sync. One whose
/// original is gone (its superblock write failed at start) holds the role
/// as a member being rebuilt, as at assembly.
fn add_replacements(table: &mut MemberTable, array: &mut Assembled, geometry: &Geometry) {
    for device in array.devices.iter_mut() {
        let DeviceState::Replacement {
            role,
            recovery_offset_sectors,
        } = device.state
        else {
            continue;
        };
        let below = geometry.stripe_at_resync_position(recovery_offset_sectors);
        let entry = Some(MemberEntry {
            slot: members::slot_of(device),
            rebuilt_below: Some(Arc::new(Position::new(below))),
        });
        if table.by_role[role].is_none() {
            table.by_role[role] = entry;
            device.state = DeviceState::Recovering {
                role,
                recovery_offset_sectors,
            };
        } else {
            table.replacing[role] = entry;
        }
    }
}

/// What a writable array resumes once it serves: the journal's data
/// without parity written through the engine, then the reshape, or the
/// resync owed, or a recovery a spare can take.
pub(super) fn resume_work(
    engine: &Arc<Engine>,
    data_only: DataOnly,
    reshaping: bool,
    resync_owed: bool,
    resync_from: Option<u64>,
) -> Result<(), EngineError> {
    for (array_sector, page) in data_only {
        engine
            .write_bytes(array_sector * SECTOR_BYTES, &page, false)
            .map_err(EngineError::JournalReplay)?;
    }
    if reshaping {
        engine
            .reshape_job
            .resync_after
            .store(resync_owed, Ordering::SeqCst);
        engine.resume_reshape();
    } else if let Some(from) = resync_from {
        let next = Arc::new(Position::new(from));
        SyncWorker::start(engine, SyncAction::Resync, from, next).expect("no job runs yet");
    } else {
        engine.start_recovery_if_possible();
    }
    Ok(())
}

/// Takes over the members opened with checksums (`Engine::open_integrity`):
/// whether a check must derive checksums no resync will.
pub(super) fn open_integrity(
    engine: &Arc<Engine>,
    resync_pending: bool,
) -> Result<bool, EngineError> {
    engine.open_integrity(resync_pending).map_err(|source| {
        EngineError::Superblock(crate::array::SuperblockError::Io {
            device: "checksum regions".into(),
            source,
        })
    })
}

/// Checksums no resync will derive (writes made elsewhere): a check gives
/// them back where each row agrees, unless a job runs already (a rebuild
/// writes its rows; the next check derives the rest).
pub(super) fn derive_by_check(engine: &Arc<Engine>, needed: bool) {
    if needed && engine.sync.action().is_none() {
        let _ = engine.start_scrub(false);
    }
}
