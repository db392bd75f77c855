//! The engine: a live, assembled array serving reads and writes.
//!
//! It owns the members (by role), the stripe locks, the array's superblock
//! state (dirty while serving, clean after an orderly stop) and the
//! background resync. Everything above it — the NBD export, the control
//! socket — calls its small API and never looks at the level.

mod io;
mod locks;
mod resync;

pub use resync::SyncProgress;

use crate::array::{write_array_state, Assembled, Cleanliness, DeviceState, Slots};
use crate::export::{BlockBackend, BlockSizes, ZeroFlags};
use crate::geometry::{Geometry, Level};
use crate::parity::{self, Syndrome};
use crate::units::SECTOR_BYTES;
use locks::StripeLocks;
use resync::SyncWorker;
use std::sync::{Arc, Mutex};

/// Stripe lock slots; a power of two, sized for many concurrent requests.
const STRIPE_LOCK_SLOTS: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Assemble(#[from] crate::array::AssembleError),
    #[error("{0}")]
    Superblock(#[from] crate::array::SuperblockError),
    #[error("the {level} array is degraded and was not shut down cleanly: stripes written at the crash may reconstruct wrongly (md refuses to start it too); use --force to start anyway")]
    DirtyDegraded { level: Level },
}

#[derive(Clone, Copy, Debug, Default)]
pub struct EngineOptions {
    /// Serve without writing anything, superblocks included.
    pub read_only: bool,
    /// Start a dirty degraded parity array anyway.
    pub force: bool,
}

pub struct Engine {
    geometry: Geometry,
    slots: Slots,
    locks: StripeLocks,
    syndrome: &'static dyn Syndrome,
    read_only: bool,
    /// The superblocks and devices, for state updates and status.
    array: Mutex<Assembled>,
    sync: Arc<SyncWorker>,
}

impl Engine {
    /// Starts serving an assembled array: marks it active (dirty) and, if it
    /// was not shut down cleanly, starts resyncing it in the background.
    pub fn start(mut array: Assembled, options: EngineOptions) -> Result<Arc<Engine>, EngineError> {
        array.require_runnable()?;
        let level = array.level();
        let degraded = !array.missing_roles().is_empty();
        if level.has_parity() && degraded && !array.is_clean() && !options.force {
            return Err(EngineError::DirtyDegraded { level });
        }
        let geometry = array.geometry.clone();
        // A resync is owed from where the last one stopped; md records that
        // point in resync_offset when it shuts down mid-resync.
        let resync_from = (!array.is_clean() && level.md_number() > 0 && level != Level::Raid0)
            .then(|| geometry.stripe_at_resync_position(array.sb.resync_offset_sectors));
        if !options.read_only {
            write_array_state(&mut array, Cleanliness::Dirty)?;
        }
        let slots = array.slots.clone();
        let sync = SyncWorker::new(geometry.stripe_count());
        let engine = Arc::new(Engine {
            geometry,
            slots,
            locks: StripeLocks::new(STRIPE_LOCK_SLOTS),
            syndrome: parity::default_impl(),
            read_only: options.read_only,
            array: Mutex::new(array),
            sync,
        });
        if let (Some(from), false) = (resync_from, options.read_only) {
            SyncWorker::start_resync(&engine, from);
        }
        Ok(engine)
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_sectors() * SECTOR_BYTES
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The largest logical block of any member: requests must be aligned to it.
    fn member_block_bytes(&self) -> u32 {
        self.slots
            .iter()
            .flatten()
            .map(|s| s.member.logical_block_bytes())
            .max()
            .unwrap_or(512)
    }

    /// Flushes every present member: all completed writes become durable.
    pub fn flush_members(&self) -> std::io::Result<()> {
        for slot in self.slots.iter().flatten() {
            slot.member.flush()?;
        }
        Ok(())
    }

    /// A snapshot of the array for status and detail.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::from_assembled(&self.array.lock().unwrap());
        snapshot.sync = self.sync.progress(&self.geometry);
        snapshot.read_only = self.read_only;
        snapshot.serving = true;
        snapshot
    }

    /// Orderly stop: ends the resync, flushes, and marks the array clean, or,
    /// if the resync did not finish, records where it must resume.
    pub fn shutdown(&self) -> Result<(), EngineError> {
        let resume = self.sync.stop();
        if self.read_only {
            return Ok(());
        }
        self.flush_members()
            .map_err(|source| crate::array::SuperblockError::Io {
                device: "members".into(),
                source,
            })?;
        let state = match resume {
            None => Cleanliness::Clean,
            Some(stripe) => Cleanliness::ResyncFrom(self.geometry.resync_position_sectors(stripe)),
        };
        write_array_state(&mut self.array.lock().unwrap(), state)?;
        Ok(())
    }
}

/// One device as the engine sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotDevice {
    pub path: String,
    pub dev_number: u32,
    pub state: DeviceState,
}

/// The live state of an array, for status, detail and monitoring.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub sb: crate::format::MemberSuper,
    pub devices: Vec<SnapshotDevice>,
    pub level: Level,
    pub array_sectors: u64,
    pub missing_roles: Vec<usize>,
    pub sync: Option<SyncProgress>,
    pub read_only: bool,
    /// Whether a running engine serves it (else it was read from the members).
    pub serving: bool,
    /// Whether every array sector can be read.
    pub runnable: bool,
}

impl Snapshot {
    /// The state of an array that is not running, from its superblocks.
    pub fn from_assembled(array: &Assembled) -> Snapshot {
        Snapshot {
            sb: array.sb.clone(),
            devices: array
                .devices
                .iter()
                .map(|d| SnapshotDevice {
                    path: d.path.clone(),
                    dev_number: d.sb.dev_number,
                    state: d.state.clone(),
                })
                .collect(),
            level: array.level(),
            array_sectors: array.geometry.array_sectors(),
            missing_roles: array.missing_roles(),
            sync: None,
            read_only: false,
            serving: false,
            runnable: array.runnable(),
        }
    }
}

impl BlockBackend for Engine {
    fn size_bytes(&self) -> u64 {
        Engine::size_bytes(self)
    }

    fn block_sizes(&self) -> BlockSizes {
        let min = self.member_block_bytes();
        // The chunk is the largest power of two that maps to one member, so
        // it is the size that avoids splitting (raid1/linear have none).
        let chunk_bytes = match &self.geometry {
            Geometry::Raid456(_) | Geometry::Raid10(_) | Geometry::Raid0(_) => {
                (self.geometry.stripe(0).strip_sectors * SECTOR_BYTES) as u32
            }
            _ => 64 * 1024,
        };
        BlockSizes {
            min,
            preferred: chunk_bytes.clamp(min.max(4096), 2 << 20),
            max_payload: 32 << 20,
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn multi_conn_safe(&self) -> bool {
        // One engine serves every connection, and flush flushes every member.
        true
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.read_bytes(offset, buf)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        assert!(
            !self.read_only,
            "the export refuses writes on a read-only array"
        );
        self.write_bytes(offset, data)?;
        if fua {
            self.flush_members()?;
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        self.flush_members()
    }

    fn trim(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
        // Trim is a hint. Passing it to members would leave copies and
        // parity disagreeing on devices that do not read back zeroes, so
        // uraid keeps the data and reports success, as the protocol allows.
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> std::io::Result<()> {
        crate::export::write_zeroes_by_writing(
            self,
            offset,
            len,
            ZeroFlags {
                fua: flags.fua,
                may_trim: false,
            },
        )
    }
}

#[cfg(test)]
mod tests;
