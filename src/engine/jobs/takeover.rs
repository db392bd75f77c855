//! Level changes on a served array: the steps `array::plan_level_change`
//! plans, run as md runs them. A takeover swaps the geometry under the
//! reshape gate (nothing moves: both levels map every sector alike); a
//! restripe is a reshape job; a takeover planned for after the restripe
//! runs when the job finishes (`ReshapeJob::then`).

use crate::array::{DeviceState, LevelChange, Roles, Takeover};
use crate::engine::Engine;
use crate::geometry::{layout_name, Geometry, Level};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Engine {
    /// Runs `change` (`manage --grow --level`). Returns a line for the user.
    pub(in crate::engine) fn change_level(
        self: &Arc<Engine>,
        change: LevelChange,
    ) -> Result<String, String> {
        let from = self.geometry().level();
        let to = change.final_level();
        let gate = self.reshape_gate.write().unwrap();
        if let Some(before) = &change.before {
            self.write_out_cache().map_err(|e| e.to_string())?;
            self.apply_takeover(before)?;
        }
        let Some(plan) = change.restripe else {
            if let Some(after) = &change.after {
                self.write_out_cache().map_err(|e| e.to_string())?;
                self.apply_takeover(after)?;
            }
            drop(gate);
            // A new empty role takes a spare, as after a failure.
            self.start_recovery_if_possible();
            return Ok(format!("level changed from {from} to {to}"));
        };
        let taken_over = change.before.is_some();
        let started = self.enter_reshape_mode().and_then(|()| {
            *self.reshape_job.then.lock().unwrap() = change.after.clone();
            self.begin(&plan)
        });
        drop(gate);
        if let Err(e) = started {
            self.reshaping.store(false, Ordering::SeqCst);
            *self.reshape_job.then.lock().unwrap() = None;
            return Err(if taken_over {
                format!(
                    "the level is now {}, but the restripe did not start: {e}",
                    plan.old.level
                )
            } else {
                e
            });
        }
        self.events.push("RebuildStarted", "", "reshape");
        self.spawn_reshape()?;
        let layout =
            |level, layout: u32| layout_name(level, layout).unwrap_or_else(|| layout.to_string());
        Ok(format!(
            "level change from {from} to {to} started: restriping {} {} to {} {}",
            plan.old.level,
            layout(plan.old.level, plan.old.layout),
            plan.new.level,
            layout(plan.new.level, plan.new.layout),
        ))
    }

    /// One takeover: the superblocks take the new level and the roles
    /// change as `t` says. Called under the reshape gate, held exclusively,
    /// with nothing left in the stripe cache.
    pub(in crate::engine) fn apply_takeover(&self, t: &Takeover) -> Result<(), String> {
        let geometry = Geometry::new(&t.params).map_err(|e| e.to_string())?;
        let mut array = self.array.lock().unwrap();
        let old = array.geometry.level();
        match t.roles {
            Roles::Same => {}
            Roles::AddLast => array.slots.push(None),
            Roles::DropLast => {
                let last = array.slots.len() - 1;
                let holds_last = |d: &crate::array::FoundDevice| matches!(d.state, DeviceState::Active { role } | DeviceState::Recovering { role, .. } if role == last);
                if t.params.level == Level::Raid0 {
                    // raid0 keeps no spares: the parity member leaves the
                    // array with its superblock as it was, as mdadm leaves
                    // it (its events fall behind, so it never assembles).
                    if let Some(i) = array.devices.iter().position(holds_last) {
                        let gone = array.devices.remove(i);
                        self.events.push(
                            "Remove",
                            &gone.path,
                            "parity member of the raid0 takeover",
                        );
                    }
                } else {
                    for device in array.devices.iter_mut().filter(|d| holds_last(d)) {
                        device.state = DeviceState::Spare;
                    }
                }
                array.slots.pop();
            }
        }
        assert_eq!(array.slots.len(), t.params.raid_disks as usize);
        if t.params.level == Level::Raid0 {
            // raid0 sizes its zones by each member's data size, which md's
            // raid0_takeover_raid45 sets to the component size: the array
            // keeps its size, then and at every assembly.
            for device in array.devices.iter_mut() {
                device.sb.data_size_sectors = t.params.dev_sectors;
            }
        }
        let sb = &mut array.sb;
        sb.level = t.params.level.md_number();
        sb.layout = t.params.layout;
        sb.chunk_sectors = t.params.chunk_sectors as u32;
        sb.raid_disks = t.params.raid_disks;
        sb.size_sectors = t.params.dev_sectors;
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk_sectors = sb.chunk_sectors;
        sb.delta_disks = 0;
        self.install(&mut array, geometry);
        self.sync.set_stripe_count(self.geometry().stripe_count());
        self.write_state_locked(&mut array, self.active_state())
            .map_err(|e| e.to_string())?;
        drop(array);
        self.events.push(
            "SettingChanged",
            "",
            &format!("level {old} -> {}", t.params.level),
        );
        Ok(())
    }
}
