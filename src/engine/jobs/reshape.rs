//! The reshape job: moves a served array from one geometry to another while
//! clients read and write, as md's reshape does, and records its progress in
//! the superblocks in md's format, so that the kernel can take over a
//! reshape uraid started and uraid one the kernel started.
//!
//! The job moves a *window* of rows at a time, forwards from the start of
//! the array (or, for a shrink, backwards from its new end). Holding the
//! engine's reshape gate exclusively (no request is in flight), it reads
//! the window through the current geometry (the old side of the point,
//! reconstructing what a missing member held), moves the point across the
//! window in memory, writes the window through the
//! engine again (now the new side: whole rows, fresh parity, at the
//! members' new data offset), flushes, and records the new point in every
//! superblock before it lets requests in again. So the point on disk is
//! always the point requests are mapped by: a crash between two windows
//! loses nothing, and one during a window redoes it from its old copy,
//! which the window's writes never touch (below). Requests wait for a
//! window; between windows they run as usual, on the plain paths (see
//! `Engine::reshaping`).
//!
//! Where the new rows go: every member's data starts earlier by the plan's
//! shift (mdadm's set_new_data_offset moves the data offset the same way,
//! into the headroom left at create), so the rows written for a window end
//! before the old rows the window still needs. A window is cut short where
//! it would not, which only happens near the start. A shrink mirrors this:
//! the data starts later by the shift, into the room after it, and the
//! window's new rows begin past the end of the old rows it reads. A raid10
//! moves the same way, chunk by chunk with their copies instead of rows
//! with parity, its data moved down by md's min_offset_change
//! (`raid10_window_end`).

use super::job::{SyncAction, SyncProgress, Throttle};
use crate::array::{
    lowest_data_offset, plan_level_change, plan_reshape, reshape_backwards, room_after_data,
    DeviceState, MemberRoom, ReshapeContext, ReshapePlan, ReshapeRequest, Takeover,
};
use crate::engine::position::Position;
use crate::engine::{Engine, MemberEntry};
use crate::format::{MD_FEATURE_NEW_OFFSET, MD_FEATURE_RESHAPE_ACTIVE};
use crate::geometry::{Geometry, GeometryParams, ReshapePoint, Reshaping};
use crate::units::SECTOR_BYTES;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// At most this much array data moves in one window: the time requests
/// wait for a window, and the superblock writes per byte moved.
const WINDOW_BYTES_MAX: u64 = 4 << 20;

/// The running job, for status and for stopping it.
#[derive(Default)]
pub struct ReshapeJob {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    started: Mutex<Option<(Instant, u64)>>,
    /// A resync is owed once the reshape ends (the array stopped uncleanly
    /// while reshaping): md's recovery_cp survives the reshape.
    pub(in crate::engine) resync_after: AtomicBool,
    last_event_step: AtomicU64,
    /// The takeover a level change makes once its restripe is done
    /// (raid6→raid5 drops Q then). Held in memory only: the kernel's
    /// superblock has no word for it, so a restripe cut short by a stop
    /// ends at the restripe's level, as md's does.
    pub(in crate::engine) then: Mutex<Option<Takeover>>,
}

impl Engine {
    /// Starts a reshape that `request` asks for (`manage --grow`). Returns
    /// a line for the user.
    pub fn start_reshape(self: &Arc<Engine>, request: &ReshapeRequest) -> Result<String, String> {
        if self.read_only {
            return Err("the array is served read-only".into());
        }
        self.refuse_with_integrity("a reshape")?;
        let level = self.geometry().level();
        if level.is_draid() {
            // Neither md nor ZFS reshapes a declustered array: its layout
            // is fixed by its permutation maps and group width.
            return Err(format!(
                "a {level} array cannot be reshaped or change level: its declustered layout is fixed at create"
            ));
        }
        // Read under the gate: the job's last window swaps in the new
        // geometry and clears the flag while it holds the gate alone, so a
        // request that sees the reshape ended also sees the flag down.
        let reshaping = {
            let _gate = self.reshape_gate.read().unwrap();
            self.reshaping.load(Ordering::SeqCst)
        };
        if reshaping {
            return Err("a reshape is already in progress".into());
        }
        let plan = {
            let array = self.array.lock().unwrap();
            let busy = self
                .sync
                .action()
                .map(|a| format!("a {} runs", a.word()))
                .or_else(|| {
                    array
                        .devices
                        .iter()
                        .any(|d| {
                            matches!(
                                d.state,
                                DeviceState::Replacement { .. } | DeviceState::Recovering { .. }
                            )
                        })
                        .then(|| "a member is being rebuilt or replaced".to_string())
                });
            let bitmap_bytes = self.live_bitmap().map_or(0, |b| b.area_bytes());
            let members = array
                .devices
                .iter()
                .filter(|d| matches!(d.state, DeviceState::Active { .. } | DeviceState::Spare))
                .map(|d| MemberRoom {
                    data_offset_sectors: d.sb.data_offset_sectors,
                    data_sectors: d.sb.data_size_sectors,
                    lowest_data_offset_sectors: lowest_data_offset(&d.sb, bitmap_bytes),
                    room_after_sectors: room_after_data(&d.sb, d.member.size_sectors()),
                })
                .collect();
            let ctx = ReshapeContext {
                sb: &array.sb,
                params: params_of(&array.sb, &array.geometry),
                members,
                spares: array
                    .devices
                    .iter()
                    .filter(|d| d.state == DeviceState::Spare)
                    .count(),
                missing_roles: array.missing_roles(),
                busy,
            };
            if let Some(change) = plan_level_change(&ctx, request) {
                let change = change?;
                drop(array);
                return self.change_level(change);
            }
            if ctx.params.level == crate::geometry::Level::Raid1 {
                let count = mirror_count(&ctx, request)?;
                drop(array);
                return self.change_mirror_count(count);
            }
            plan_reshape(&ctx, request)?
        };
        let gate = self.reshape_gate.write().unwrap();
        self.enter_reshape_mode()?;
        let started = self
            .begin(&plan)
            .and_then(|()| self.resize_bitmap_for(&plan));
        drop(gate);
        if let Err(e) = started {
            self.reshaping.store(false, Ordering::SeqCst);
            return Err(e);
        }
        self.events.push("RebuildStarted", "", "reshape");
        self.spawn_reshape()?;
        Ok(format!(
            "reshape started: {} to {} members, chunk {}K, layout {}",
            plan.old.raid_disks,
            plan.new.raid_disks,
            plan.new.chunk_sectors / 2,
            crate::geometry::layout_name(plan.new.level, plan.new.layout)
                .unwrap_or_else(|| plan.new.layout.to_string())
        ))
    }

    /// A raid1's member count (md's raid1_reshape): immediate, no data
    /// moves. Growing adds empty roles, which spares then recover; a
    /// shrink packs the members in use into the lowest roles (every copy
    /// holds the same bytes) and needs no more of them than roles left.
    fn change_mirror_count(self: &Arc<Engine>, count: u32) -> Result<String, String> {
        let count = count as usize;
        let gate = self.reshape_gate.write().unwrap();
        let mut array = self.array.lock().unwrap();
        let old = array.slots.len();
        let active: Vec<usize> = (0..array.devices.len())
            .filter(|&i| matches!(array.devices[i].state, DeviceState::Active { .. }))
            .collect();
        if active.len() > count {
            return Err(format!(
                "{} members are in use and {count} roles would be left: fail and remove members first (md: EBUSY)",
                active.len()
            ));
        }
        let mut order = active.clone();
        order.sort_by_key(|&i| match array.devices[i].state {
            DeviceState::Active { role } => role,
            _ => unreachable!("active devices only"),
        });
        let mut slots = vec![None; count];
        for (new_role, &i) in order.iter().enumerate() {
            let device = &mut array.devices[i];
            device.state = DeviceState::Active { role: new_role };
            slots[new_role] = Some(crate::engine::members::slot_of(device));
        }
        array.slots = slots;
        array.sb.raid_disks = count as u32;
        let params = GeometryParams {
            raid_disks: count as u32,
            ..params_of(&array.sb, &array.geometry)
        };
        let geometry = Geometry::new(&params).map_err(|e| e.to_string())?;
        self.install(&mut array, geometry);
        self.sync.set_stripe_count(self.geometry().stripe_count());
        self.write_state_locked(&mut array, self.active_state())
            .map_err(|e| e.to_string())?;
        drop(array);
        drop(gate);
        self.events
            .push("SettingChanged", "", &format!("raid_disks={count}"));
        // New roles are missing: spares take them, as after a failure.
        self.start_recovery_if_possible();
        Ok(format!("raid1 members: {old} -> {count}"))
    }

    /// Requests from here on take the plain paths. Called with the gate
    /// held exclusively: what the stripe cache holds is written out, hot
    /// parity forgotten, and reads the server fetches itself are awaited,
    /// all in the old geometry.
    pub(in crate::engine) fn enter_reshape_mode(&self) -> Result<(), String> {
        self.reshaping.store(true, Ordering::SeqCst);
        self.write_out_cache().map_err(|e| e.to_string())?;
        self.datapath.parity_cache.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .datapath
            .pending_reads
            .iter()
            .any(|r| r.load(Ordering::SeqCst) > 0)
        {
            if Instant::now() > deadline {
                self.reshaping.store(false, Ordering::SeqCst);
                return Err("reads in flight did not finish; try again".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Records the reshape in every superblock (md's raid5_start_reshape:
    /// spares take the new roles in sync, the point is 0, or the new end of
    /// a shrink, which runs backwards) and switches the engine to the two
    /// geometries.
    pub(in crate::engine) fn begin(&self, plan: &ReshapePlan) -> Result<(), String> {
        let mut array = self.array.lock().unwrap();
        let old_roles = plan.old.raid_disks as usize;
        let new_roles = plan.new.raid_disks as usize;
        // A spare fills an empty old role first, rebuilt as the point
        // passes (md's raid5_start_reshape: recovery_offset 0, raised at
        // each checkpoint); then the new roles, in sync at once.
        let mut empty: std::collections::VecDeque<usize> = (0..old_roles)
            .filter(|&role| {
                array.slots[role].is_none()
                    && !array.devices.iter().any(
                        |d| matches!(d.state, DeviceState::Recovering { role: r, .. } if r == role),
                    )
            })
            .collect();
        let mut next_role = old_roles;
        for device in array.devices.iter_mut() {
            if device.state != DeviceState::Spare {
                continue;
            }
            if let Some(role) = empty.pop_front() {
                device.state = DeviceState::Recovering {
                    role,
                    recovery_offset_sectors: 0,
                };
            } else if next_role < new_roles {
                device.state = DeviceState::Active { role: next_role };
                next_role += 1;
            }
        }
        assert_eq!(
            next_role,
            new_roles.max(old_roles),
            "the plan counted the spares"
        );
        while array.slots.len() < new_roles {
            array.slots.push(None);
        }
        let shift = plan.new_offset_sectors;
        let mut slots = array.slots.clone();
        for device in array.devices.iter_mut() {
            if matches!(
                device.state,
                DeviceState::Active { .. } | DeviceState::Recovering { .. } | DeviceState::Spare
            ) {
                device.sb.feature_map |= MD_FEATURE_NEW_OFFSET;
                device.sb.new_offset_sectors = shift as i32;
                // Data moving up needs a data area reaching past the rows it
                // holds; mdadm then lets it reach the device's end (it
                // writes the member's size 0 when new_offset is refused).
                let sb = &mut device.sb;
                if shift > 0 && sb.data_size_sectors < sb.size_sectors + shift as u64 {
                    sb.data_size_sectors = device.member.size_sectors() - sb.data_offset_sectors;
                }
            }
            if let DeviceState::Active { role } = device.state {
                slots[role] = Some(crate::engine::members::slot_of(device));
            }
        }
        array.slots = slots;
        // A shrink starts at the end of the smaller new array and moves
        // down (the kernel writes RESHAPE_BACKWARDS only when the count
        // stays: a negative delta_disks says it).
        let position = if plan.delta_disks() < 0 {
            Geometry::new(&plan.new)
                .map_err(|e| e.to_string())?
                .array_sectors()
        } else {
            0
        };
        let sb = &mut array.sb;
        sb.feature_map |= MD_FEATURE_RESHAPE_ACTIVE;
        sb.reshape_position_sectors = position;
        sb.new_level = plan.new.level.md_number();
        sb.delta_disks = plan.delta_disks() as i32;
        sb.new_layout = plan.new.layout;
        sb.new_chunk_sectors = plan.new.chunk_sectors as u32;
        sb.raid_disks = plan.new.raid_disks;
        let geometry = reshaping_at(&array, plan.old.clone(), plan.new.clone(), position)?;
        self.install(&mut array, geometry);
        self.write_state_locked(&mut array, self.active_state())
            .map_err(|e| e.to_string())
    }

    /// A raid10 counts its bitmap in array sectors, so a reshape that
    /// changes its size resizes the bitmap as it starts (raid10_start_reshape
    /// calls md_bitmap_resize with the new size); raid4/5/6 count theirs per
    /// member, which a reshape keeps.
    fn resize_bitmap_for(self: &Arc<Engine>, plan: &ReshapePlan) -> Result<(), String> {
        if plan.new.level != crate::geometry::Level::Raid10 || plan.delta_disks() == 0 {
            return Ok(());
        }
        let new = Geometry::new(&plan.new).map_err(|e| e.to_string())?;
        let array = self.array.lock().unwrap();
        self.resize_bitmap(&array, new.resync_position_sectors(new.stripe_count()))
    }

    /// Makes `geometry` the engine's and the array's, with each member's
    /// data starting where the geometry's places count from.
    pub(in crate::engine) fn install(
        &self,
        array: &mut crate::array::Assembled,
        geometry: Geometry,
    ) {
        let offsets = base_offsets(array, &geometry);
        for (role, slot) in array.slots.iter_mut().enumerate() {
            if let (Some(slot), Some(offset)) = (slot.as_mut(), offsets[role]) {
                slot.data_offset_bytes = offset * SECTOR_BYTES;
            }
        }
        let slots = array.slots.clone();
        // A member rebuilt along with a reshape holds what lies on the
        // done side of the point; outside a reshape, what lies below its
        // recovery offset.
        let rebuilding: Vec<(usize, MemberEntry)> = array
            .devices
            .iter()
            .filter_map(|d| match d.state {
                DeviceState::Recovering {
                    role,
                    recovery_offset_sectors,
                } if role < slots.len() && slots[role].is_none() => {
                    let below = match geometry.reshaping() {
                        Some(r) => r.done_stripes(),
                        None => geometry.stripe_at_resync_position(recovery_offset_sectors),
                    };
                    let mut slot = crate::engine::members::slot_of(d);
                    slot.data_offset_bytes = offsets[role].unwrap_or(0) * SECTOR_BYTES;
                    Some((
                        role,
                        MemberEntry {
                            slot,
                            rebuilt_below: Some(Arc::new(Position::new(below))),
                        },
                    ))
                }
                _ => None,
            })
            .collect();
        self.update_table(|table| {
            table.by_role.resize(slots.len(), None);
            table.replacing.resize(slots.len(), None);
            for (role, slot) in slots.iter().enumerate() {
                table.by_role[role] = slot.clone().map(|slot| MemberEntry {
                    slot,
                    rebuilt_below: None,
                });
            }
            for (role, entry) in rebuilding {
                table.by_role[role] = Some(entry);
            }
        });
        array.geometry = geometry.clone();
        *self.geometry.write().unwrap() = Arc::new(geometry);
    }

    pub(in crate::engine) fn spawn_reshape(self: &Arc<Engine>) -> Result<(), String> {
        let job = &self.reshape_job;
        job.stop.store(false, Ordering::SeqCst);
        let position = self
            .geometry()
            .reshaping()
            .map_or(0, |r| r.position_sectors());
        *job.started.lock().unwrap() = Some((Instant::now(), position));
        let weak: Weak<Engine> = Arc::downgrade(self);
        let alive = self.sync.threads.enter();
        let handle = std::thread::Builder::new()
            .name("uraid-reshape".into())
            .spawn(move || {
                run(weak);
                drop(alive);
            })
            .map_err(|e| e.to_string())?;
        *job.thread.lock().unwrap() = Some(handle);
        Ok(())
    }

    /// Continues a reshape the array was assembled in the middle of (md
    /// resumes one at every start).
    pub(in crate::engine) fn resume_reshape(self: &Arc<Engine>) {
        let gate = self.reshape_gate.write().unwrap();
        let entered = self.enter_reshape_mode();
        drop(gate);
        if let Err(e) = entered.and_then(|()| self.spawn_reshape()) {
            self.events.push("SyncFailed", "", &format!("reshape: {e}"));
            return;
        }
        self.events.push("RebuildStarted", "", "reshape");
    }

    /// Whether the reshape job is running.
    pub fn reshape_running(&self) -> bool {
        self.reshape_job
            .thread
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Stops the reshape job and waits for it; the point stays where the
    /// last window left it, in memory and on disk (`--action idle`, and a
    /// shutdown). Returns whether a job was running.
    pub fn pause_reshape(&self) -> bool {
        self.reshape_job.stop.store(true, Ordering::SeqCst);
        let handle = self.reshape_job.thread.lock().unwrap().take();
        match handle {
            Some(handle) if handle.thread().id() != std::thread::current().id() => {
                let _ = handle.join();
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Starts a paused reshape again (`--action reshape`).
    pub fn continue_reshape(self: &Arc<Engine>) -> Result<(), String> {
        if self.geometry().reshaping().is_none() {
            return Err("no reshape is in progress".into());
        }
        if self.reshape_running() {
            return Err("the reshape is already running".into());
        }
        if self.read_only || self.sync.is_closed() {
            return Err("the array is not writable".into());
        }
        self.spawn_reshape()?;
        self.events.push("RebuildStarted", "", "reshape");
        Ok(())
    }

    /// Progress as /proc/mdstat shows it: per member, in KiB.
    pub(in crate::engine) fn reshape_progress(&self) -> Option<SyncProgress> {
        let geometry = self.geometry();
        let reshaping = geometry.reshaping()?;
        let new = reshaping.new_geometry();
        let end = new.array_sectors();
        let position = reshaping.position_sectors();
        let backwards = reshaping.backwards();
        // md counts a backward reshape's progress from the end.
        let done = |position: u64| if backwards { end - position } else { position };
        let (done_kib, total_kib) = if new.raid10().is_some() {
            // md counts a raid10 reshape in array sectors up to the size
            // it serves meanwhile (resync_max_sectors); uraid's zeroing of
            // the grown part beyond shows as done.
            let total = reshaping.array_sectors();
            (position.min(total) / 2, total / 2)
        } else {
            (
                progress_sectors(new, done(position)) / 2,
                progress_sectors(new, end) / 2,
            )
        };
        let speed = self
            .reshape_job
            .started
            .lock()
            .unwrap()
            .filter(|_| self.reshape_running())
            .map(|(at, from)| {
                let moved_kib =
                    progress_sectors(new, done(position).saturating_sub(done(from))) / 2;
                (moved_kib as f64 / at.elapsed().as_secs_f64().max(1e-3)) as u64
            })
            .unwrap_or(0);
        Some(SyncProgress {
            action: SyncAction::Reshape,
            done_kib,
            total_kib,
            speed_kib_per_s: speed,
            mismatch_sectors: 0,
            pace: self.reshape_running().then(|| self.sync.pace.report()),
            endangered_first: None,
        })
    }

    /// Moves one window (see the module's comment). Returns false once the
    /// reshape has ended.
    fn reshape_window(self: &Arc<Engine>) -> Result<Option<u64>, String> {
        let _gate = self.reshape_gate.write().unwrap();
        let geometry = self.geometry();
        let Some(reshaping) = geometry.reshaping() else {
            return Ok(None);
        };
        let (old, new) = (reshaping.old(), reshaping.new_geometry());
        let position = reshaping.position_sectors();
        let end = new.array_sectors();
        let done = if reshaping.backwards() {
            position == 0
        } else {
            position >= end
        };
        if done {
            self.finish_reshape()?;
            return Ok(None);
        }
        let offsets = self.table_offsets(&geometry);
        // The window [from, to) and the point once it has moved.
        let (from, to, next) = if reshaping.backwards() {
            let start = window_start(reshaping, &offsets)?;
            (start, position, start)
        } else {
            let next = window_end(reshaping, &offsets)?;
            (position, next, next)
        };
        assert!(from < to && to <= end && (next == from || next == to));
        // The window's bytes, read in the old geometry; past the old end
        // (a grow) there are none, and the new rows hold zeroes there.
        let len = ((to - from) * SECTOR_BYTES) as usize;
        let mut data = crate::member::AlignedBuf::zeroed(len);
        let readable = old.array_sectors().min(to).saturating_sub(from);
        if readable > 0 {
            self.read_bytes(
                from * SECTOR_BYTES,
                &mut data[..(readable * SECTOR_BYTES) as usize],
            )
            .map_err(|e| format!("reading the rows to move: {e}"))?;
        }
        self.move_point(next)?;
        self.datapath.parity_cache.clear();
        if let Err(e) = self.write_bytes(from * SECTOR_BYTES, &data, false) {
            // The point goes back: the old rows are intact.
            self.move_point(position)?;
            return Err(format!("writing the moved rows: {e}"));
        }
        self.flush_members()
            .map_err(|e| format!("flushing the moved rows: {e}"))?;
        self.checkpoint(next)?;
        Ok(Some(member_sectors(new, to - from)))
    }

    /// Each role's data offsets in the old and the new geometry.
    fn table_offsets(&self, geometry: &Geometry) -> Vec<(u64, u64)> {
        let array = self.array.lock().unwrap();
        role_offsets(&array, geometry.raid_disks())
    }

    /// Puts the in-memory point at `position` (requests are held off).
    fn move_point(&self, position: u64) -> Result<(), String> {
        let mut array = self.array.lock().unwrap();
        let geometry = {
            let current = self.geometry();
            let r = current.reshaping().expect("reshaping");
            reshaping_at(
                &array,
                params_of_geometry(r.old(), &array.sb),
                params_of_geometry(r.new_geometry(), &array.sb),
                position,
            )?
        };
        let done = geometry
            .reshaping()
            .filter(|r| !r.backwards())
            .map(Reshaping::done_stripes);
        array.geometry = geometry.clone();
        *self.geometry.write().unwrap() = Arc::new(geometry);
        // Members rebuilt along with the reshape hold the done side now.
        if let Some(done) = done {
            for entry in self.table().by_role.iter().flatten() {
                if let Some(below) = &entry.rebuilt_below {
                    below.store(done, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    /// Records the point in every superblock (md's reshape_position), and
    /// how far members rebuilt along with it are in sync (md raises their
    /// recovery_offset to the point's member sector at each checkpoint).
    fn checkpoint(&self, position: u64) -> Result<(), String> {
        let mut array = self.array.lock().unwrap();
        let reshaping = array.geometry.reshaping().expect("reshaping");
        // The point recorded is the point served (move_point put it
        // there), and it only moves the reshape's way: assembly reads it
        // back through Reshaping::new, which checks its bounds and rows.
        let last = array.sb.reshape_position_sectors;
        assert_eq!(reshaping.position_sectors(), position, "checkpoint");
        assert!(
            if reshaping.backwards() {
                position < last
            } else {
                position > last
            },
            "reshape point {position} after {last} (backwards: {})",
            reshaping.backwards()
        );
        let new_dd = data_disks(reshaping.new_geometry()) as u64;
        array.sb.reshape_position_sectors = position;
        for device in array.devices.iter_mut() {
            if let DeviceState::Recovering {
                recovery_offset_sectors,
                ..
            } = &mut device.state
            {
                *recovery_offset_sectors = position / new_dd;
            }
        }
        self.write_state_locked(&mut array, self.active_state())
            .map_err(|e| e.to_string())
    }

    /// The last window is in place: the new geometry becomes the array's
    /// (md_finish_reshape and raid5_finish_reshape).
    fn finish_reshape(self: &Arc<Engine>) -> Result<(), String> {
        let mut array = self.array.lock().unwrap();
        let current = self.geometry();
        let reshaping = current.reshaping().expect("reshaping");
        let new_params = params_of_geometry(reshaping.new_geometry(), &array.sb);
        for device in array.devices.iter_mut() {
            let sb = &mut device.sb;
            if sb.feature_map & MD_FEATURE_NEW_OFFSET != 0 {
                let moved = i64::from(sb.new_offset_sectors);
                sb.data_offset_sectors = (sb.data_offset_sectors as i64 + moved) as u64;
                // The data area keeps its end: it grows by what it moved.
                sb.data_size_sectors = (sb.data_size_sectors as i64 - moved) as u64;
                sb.feature_map &= !MD_FEATURE_NEW_OFFSET;
                sb.new_offset_sectors = 0;
            }
        }
        // Members rebuilt along with the reshape are whole now.
        for i in 0..array.devices.len() {
            if let DeviceState::Recovering { role, .. } = array.devices[i].state {
                array.devices[i].state = DeviceState::Active { role };
                let slot = crate::engine::members::slot_of(&array.devices[i]);
                array.slots[role] = Some(slot);
            }
        }
        release_removed_roles(&mut array, new_params.raid_disks as usize);
        let sb = &mut array.sb;
        sb.feature_map &=
            !(MD_FEATURE_RESHAPE_ACTIVE | crate::format::MD_FEATURE_RESHAPE_BACKWARDS);
        sb.level = new_params.level.md_number();
        sb.layout = new_params.layout;
        sb.chunk_sectors = new_params.chunk_sectors as u32;
        sb.reshape_position_sectors = 0;
        sb.delta_disks = 0;
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk_sectors = sb.chunk_sectors;
        let geometry = Geometry::new(&new_params).map_err(|e| e.to_string())?;
        self.install(&mut array, geometry);
        self.sync.set_stripe_count(self.geometry().stripe_count());
        self.write_state_locked(&mut array, self.active_state())
            .map_err(|e| e.to_string())?;
        drop(array);
        self.reshaping.store(false, Ordering::SeqCst);
        self.events.push("RebuildFinished", "", "reshape");
        let then = self.reshape_job.then.lock().unwrap().take();
        if let Some(takeover) = then {
            self.apply_takeover(&takeover)?;
        }
        Ok(())
    }

    /// Events at each fifth, as md's monitor reports a sync's progress.
    fn reshape_progressed(&self) {
        let Some(progress) = self.reshape_progress() else {
            return;
        };
        let step = progress.done_kib * 5 / progress.total_kib.max(1);
        let last = self
            .reshape_job
            .last_event_step
            .swap(step, Ordering::SeqCst);
        if step > last && (1..5).contains(&step) {
            self.events
                .push(&format!("Rebuild{}", step * 20), "", "reshape");
        }
    }
}

fn run(weak: Weak<Engine>) {
    let mut throttle = Throttle::new();
    loop {
        let Some(engine) = weak.upgrade() else { return };
        let stop = engine.reshape_job.stop.clone();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match engine.reshape_window() {
            Ok(Some(kib_moved)) => {
                engine.reshape_progressed();
                throttle.account(&engine, kib_moved / 2, &stop);
            }
            Ok(None) => {
                let resync = engine
                    .reshape_job
                    .resync_after
                    .swap(false, Ordering::SeqCst);
                if resync {
                    let next = Arc::new(Position::new(0));
                    let _ = crate::engine::SyncWorker::start(&engine, SyncAction::Resync, 0, next);
                } else {
                    engine.start_recovery_if_possible();
                }
                return;
            }
            Err(e) => {
                engine
                    .events
                    .push("SyncFailed", "", &format!("reshape stopped: {e}"));
                return;
            }
        }
    }
}

/// After a shrink the members of the roles past the new count hold nothing
/// the array needs: md clears their In_sync (raid5_finish_reshape) and
/// then takes them out of their slots, so they stay on as spares.
fn release_removed_roles(array: &mut crate::array::Assembled, roles: usize) {
    for device in array.devices.iter_mut() {
        if matches!(device.state, DeviceState::Active { role } if role >= roles) {
            device.state = DeviceState::Spare;
        }
    }
    array.slots.truncate(roles);
}

fn data_disks(g: &Geometry) -> usize {
    g.raid_disks() - g.level().parity_members()
}

/// A reshape's progress in md's unit: per member for raid4/5/6, in array
/// sectors for raid10 (raid10.c's reshape_request reports its point).
fn progress_sectors(g: &Geometry, array_sectors: u64) -> u64 {
    if g.raid10().is_some() {
        array_sectors
    } else {
        array_sectors / data_disks(g) as u64
    }
}

/// What moving `array_sectors` of the array writes to each member: md's
/// unit for a sync's speed.
fn member_sectors(g: &Geometry, array_sectors: u64) -> u64 {
    match g.raid10() {
        Some(r) => array_sectors * r.copies() as u64 / g.raid_disks() as u64,
        None => array_sectors / data_disks(g) as u64,
    }
}

/// The parameters a geometry was built from, with the array's sizes.
fn params_of_geometry(g: &Geometry, sb: &crate::format::MemberSuper) -> GeometryParams {
    let map = g.stripe(0);
    GeometryParams {
        level: g.level(),
        layout: layout_of(g, sb),
        chunk_sectors: map.strip_sectors,
        raid_disks: g.raid_disks() as u32,
        dev_sectors: sb.size_sectors,
        member_data_sectors: vec![sb.data_size_sectors; g.raid_disks()],
        raid0_layout_feature: false,
    }
}

fn layout_of(g: &Geometry, sb: &crate::format::MemberSuper) -> u32 {
    match g {
        Geometry::Raid456(r) => r.algorithm(),
        Geometry::Raid10(r) => r.layout(),
        _ => sb.layout,
    }
}

/// The array's own parameters now (before a reshape starts).
fn params_of(sb: &crate::format::MemberSuper, g: &Geometry) -> GeometryParams {
    GeometryParams {
        layout: sb.layout,
        ..params_of_geometry(g, sb)
    }
}

/// Each role's data offset in the old and the new geometry, from the
/// superblock of the device holding it (the array's for an empty role).
fn role_offsets(array: &crate::array::Assembled, roles: usize) -> Vec<(u64, u64)> {
    // From the member's own fields: its superblock may not carry
    // RESHAPE_ACTIVE yet when the reshape is being set up.
    let of = |sb: &crate::format::MemberSuper| {
        let new = if sb.feature_map & MD_FEATURE_NEW_OFFSET != 0 {
            (sb.data_offset_sectors as i64 + i64::from(sb.new_offset_sectors)).max(0) as u64
        } else {
            sb.data_offset_sectors
        };
        (sb.data_offset_sectors, new)
    };
    // An empty role (a degraded reshape) moves as the members do.
    let members = array
        .devices
        .iter()
        .find(|d| matches!(d.state, DeviceState::Active { .. }));
    let mut offsets = vec![of(members.map_or(&array.sb, |d| &d.sb)); roles];
    for device in &array.devices {
        if let DeviceState::Active { role } | DeviceState::Recovering { role, .. } = device.state {
            if role < roles {
                offsets[role] = of(&device.sb);
            }
        }
    }
    offsets
}

/// Where each role's data area starts for `geometry`: the lower of its two
/// offsets while reshaping.
fn base_offsets(array: &crate::array::Assembled, geometry: &Geometry) -> Vec<Option<u64>> {
    let offsets = role_offsets(array, array.slots.len());
    (0..array.slots.len())
        .map(|role| {
            let (old, new) = offsets[role];
            Some(if geometry.reshaping().is_some() {
                old.min(new)
            } else {
                old
            })
        })
        .collect()
}

/// The two geometries with the point at `position`.
fn reshaping_at(
    array: &crate::array::Assembled,
    old: GeometryParams,
    new: GeometryParams,
    position: u64,
) -> Result<Geometry, String> {
    let roles = old.raid_disks.max(new.raid_disks) as usize;
    let offsets = role_offsets(array, roles);
    let old = Geometry::new(&old).map_err(|e| e.to_string())?;
    let new = Geometry::new(&new).map_err(|e| e.to_string())?;
    let reshaping = Reshaping::new(
        old,
        new,
        ReshapePoint {
            position_sectors: position,
            backwards: reshape_backwards(&array.sb),
            old_offset_sectors: offsets.iter().map(|o| o.0).collect(),
            new_offset_sectors: offsets.iter().map(|o| o.1).collect(),
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(Geometry::Reshaping(Box::new(reshaping)))
}

/// The end of the next window from the point: whole units of md's
/// (the larger chunk across the new data members), at most
/// WINDOW_BYTES_MAX, and no further than the new rows can go without
/// reaching the old rows the window still reads (the members' new data
/// start lies `shift` before the old one).
fn window_end(reshaping: &Reshaping, offsets: &[(u64, u64)]) -> Result<u64, String> {
    if reshaping.old().raid10().is_some() {
        return raid10_window_end(reshaping, offsets);
    }
    let WindowUnits {
        old_chunk,
        old_dd,
        new_dd,
        unit,
        most,
    } = WindowUnits::of(reshaping);
    let old = reshaping.old();
    let position = reshaping.position_sectors();
    let end = reshaping.new_geometry().array_sectors();
    let lead = least_lead(offsets);
    // The first old row the window still reads starts at this member
    // sector (relative to the old data start).
    let old_first = position / (old_chunk * old_dd) * old_chunk;
    let mut next = (position + most).min(end);
    while next > position {
        // The new rows of the window end at this member sector (relative
        // to the new data start).
        let new_end = next / new_dd;
        if new_end <= old_first + lead || position >= old.array_sectors() {
            return Ok(next);
        }
        next -= unit.min(next - position);
    }
    Err(stuck(position))
}

/// A window's sizes: the chunks' rows, md's unit of work (the larger chunk
/// across the new data members) and the most one window moves.
struct WindowUnits {
    old_chunk: u64,
    old_dd: u64,
    new_dd: u64,
    unit: u64,
    most: u64,
}

impl WindowUnits {
    fn of(reshaping: &Reshaping) -> WindowUnits {
        let (old, new) = (reshaping.old(), reshaping.new_geometry());
        let old_chunk = old.stripe(0).strip_sectors;
        let new_chunk = new.stripe(0).strip_sectors;
        let new_dd = data_disks(new) as u64;
        let unit = old_chunk.max(new_chunk) * new_dd;
        WindowUnits {
            old_chunk,
            old_dd: data_disks(old) as u64,
            new_dd,
            unit,
            most: (WINDOW_BYTES_MAX / SECTOR_BYTES / unit).max(1) * unit,
        }
    }
}

fn stuck(position: u64) -> String {
    format!(
        "the next rows cannot move without overwriting rows not yet moved (at sector {position}): the data offset moved too little"
    )
}

/// The start of the next window of a backward reshape, which ends at the
/// point: the mirror of `window_end`. Whole units, at most
/// WINDOW_BYTES_MAX, and no lower than where the window's new rows (the
/// members' new data start lies `shift` after the old one) begin past the
/// end of the old rows the window reads; so a window never overwrites
/// the old copy it is redone from after a crash, nor any row not yet read.
fn window_start(reshaping: &Reshaping, offsets: &[(u64, u64)]) -> Result<u64, String> {
    let w = WindowUnits::of(reshaping);
    let position = reshaping.position_sectors();
    debug_assert!(position.is_multiple_of(w.unit), "the point lies on a unit");
    // How far the new data start lies after the old one, the least over
    // the members: the room the new rows have above the old.
    let lead = offsets
        .iter()
        .map(|(old_offset, new_offset)| new_offset.saturating_sub(*old_offset))
        .min()
        .unwrap_or(0);
    // The old rows the window reads end at this member sector (relative
    // to the old data start): the old row holding the sector below the
    // point, whole.
    let old_end = position.div_ceil(w.old_chunk * w.old_dd) * w.old_chunk;
    let mut start = position.saturating_sub(w.most);
    while start < position {
        // The window's new rows begin at this member sector (relative to
        // the new data start).
        let new_start = start / w.new_dd;
        if new_start + lead >= old_end {
            return Ok(start);
        }
        start += w.unit;
    }
    Err(stuck(position))
}

/// How far the new data start lies before the old one, the least over the
/// members: the room the new rows have ahead of the old.
fn least_lead(offsets: &[(u64, u64)]) -> u64 {
    offsets
        .iter()
        .map(|(old_offset, new_offset)| old_offset.saturating_sub(*new_offset))
        .min()
        .unwrap_or(0)
}

/// The end of the next raid10 window: whole chunks (the smaller of the two,
/// the most md copies at once) up to WINDOW_BYTES_MAX, cut where the new
/// places of its chunks would reach the old places of the chunk at the
/// point, which a crash during the window would read again (raid10.c's
/// reshape_request compares last_dev_address of what it writes with
/// first_dev_address of the safe point, plus the offset difference).
fn raid10_window_end(reshaping: &Reshaping, offsets: &[(u64, u64)]) -> Result<u64, String> {
    let (old, new) = (reshaping.old(), reshaping.new_geometry());
    let (old10, new10) = (old.raid10().expect("raid10"), new.raid10().expect("raid10"));
    let position = reshaping.position_sectors();
    let unit = old10.chunk_sectors().min(new10.chunk_sectors());
    let end = new.array_sectors();
    let lead = least_lead(offsets);
    let old_first = old10.first_member_sector(position);
    let fits = |next: u64| {
        position >= old.array_sectors() || new10.member_sectors_end(next - 1) <= old_first + lead
    };
    let most = (WINDOW_BYTES_MAX / SECTOR_BYTES / unit).max(1) * unit;
    // Window ends fall on chunk boundaries (or the end), wherever the point
    // is: a point the kernel left mid-chunk is realigned by the first one.
    let mut next = ((position + most) / unit * unit).min(end);
    while next > position {
        if fits(next) {
            return Ok(next);
        }
        let below = (next - 1) / unit * unit;
        next = below.max(position);
    }
    Err(format!(
        "the next chunks cannot move without overwriting chunks not yet moved (at sector {position}): the data offset moved too little"
    ))
}

/// Whether uraid can continue the reshape an array was assembled in the
/// middle of; the reason it cannot otherwise.
pub(in crate::engine) fn check_resumable(array: &crate::array::Assembled) -> Result<(), String> {
    let reshaping = array.geometry.reshaping().expect("reshaping");
    let why = if reshaping.backwards() && array.sb.delta_disks > 0 {
        Some("it adds members yet runs backwards, which md never writes")
    } else if reshaping.backwards() && reshaping.old().raid10().is_some() {
        Some("a raid10 reshape running backwards (removing members, or md's choice for a same-count one), which uraid does not run yet")
    } else if array.sb.feature_map & MD_FEATURE_NEW_OFFSET == 0 {
        Some("it keeps its data offset and relies on mdadm's backup file, which uraid does not support")
    } else if array
        .devices
        .iter()
        .any(|d| matches!(d.state, DeviceState::Replacement { .. }))
    {
        Some("a member is being replaced, which md never runs along with a reshape")
    } else if array.devices.iter().any(|d| {
        // A member rebuilt along with the reshape (a level change) must
        // be in sync up to the point, as md's checkpoints keep it. One
        // whose superblock is a single update behind missed only the last
        // checkpoint (a stop between two members' superblock writes): the
        // rows up to that point were written, on it too, before the
        // checkpoint began, so it holds them.
        let new_dd = data_disks(reshaping.new_geometry()) as u64;
        let missed_last_checkpoint = d.sb.events + 1 == array.sb.events;
        matches!(d.state, DeviceState::Recovering { recovery_offset_sectors, .. }
            if recovery_offset_sectors < reshaping.position_sectors() / new_dd
                && !missed_last_checkpoint)
    }) {
        Some("a member being rebuilt along with it lags behind the reshape point")
    } else {
        None
    };
    match why {
        Some(why) => Err(format!(
            "{}, but uraid cannot continue it: {why}; let the kernel finish it (mdadm --assemble), or read it offline with uraid copy-out",
            reshaping.describe()
        )),
        None => Ok(()),
    }
}

/// The member count a raid1 request asks for: md changes nothing else of
/// a raid1 (no chunk, no layout) and refuses while a job runs.
fn mirror_count(ctx: &ReshapeContext, request: &ReshapeRequest) -> Result<u32, String> {
    if let Some(busy) = &ctx.busy {
        return Err(format!(
            "cannot change the member count while {busy} (md: EBUSY)"
        ));
    }
    let Some(count) = request.raid_devices else {
        return Err("a raid1 changes only its member count (--raid-devices)".into());
    };
    if request.level.is_some_and(|l| l != 1)
        || request.layout.is_some()
        || request.chunk_sectors.is_some()
    {
        return Err("a raid1 changes only its member count (--raid-devices); changing its level is not supported yet".into());
    }
    if count == 0 {
        return Err("a raid1 needs at least one member".into());
    }
    if count == ctx.params.raid_disks {
        return Err("nothing to change: the array already has that shape".into());
    }
    Ok(count)
}
