//! The live write-intent bitmap, as md keeps it: before a write touches a
//! region whose bit is clear, the bit is set on every member's bitmap (and
//! flushed); a daemon clears bits of regions that have been quiet for a
//! while, after flushing the members, and never while the array is
//! degraded (the bits then say what a returning member missed). After a
//! crash only the regions whose bits are set need a resync.

use super::Engine;
use crate::array::{read_bitmap, write_bitmap, Assembled, DeviceState};
use crate::format::bitmap::{Bitmap, BitmapSuper};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub struct LiveBitmap {
    /// The bitmap as it is on disk.
    state: Mutex<(BitmapSuper, Bitmap)>,
    /// Writes in flight per bitmap chunk.
    pending: Vec<AtomicU32>,
    /// When each chunk was last written, in ms since `epoch`.
    touched_ms: Vec<AtomicU64>,
    epoch: Instant,
    /// Whether its bits can be trusted to bound a resync (not stale).
    pub trusted: bool,
    stop: AtomicBool,
    daemon: Mutex<Option<JoinHandle<()>>>,
}

/// Counts a write in flight on a range of chunks; dropping it ends it.
pub struct WriteGuard<'a> {
    bitmap: &'a LiveBitmap,
    chunks: Range<u64>,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let now = self.bitmap.epoch.elapsed().as_millis() as u64;
        for c in self.chunks.clone() {
            self.bitmap.touched_ms[c as usize].store(now, Ordering::Relaxed);
            self.bitmap.pending[c as usize].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl LiveBitmap {
    /// Reads the array's bitmap from its first active member, if it has one.
    pub fn load(array: &Assembled) -> Option<LiveBitmap> {
        let device = array
            .devices
            .iter()
            .find(|d| matches!(d.state, DeviceState::Active { .. }))?;
        let (bsb, bits) = read_bitmap(&*device.member, &device.sb).ok()??;
        if bsb.uuid != array.sb.set_uuid {
            return None;
        }
        // md trusts a bitmap that is not stale and not behind the superblocks.
        let trusted = !bsb.is_stale() && bsb.events + 1 >= array.sb.events;
        let chunks = bits.chunks() as usize;
        Some(LiveBitmap {
            state: Mutex::new((bsb, bits)),
            pending: (0..chunks).map(|_| AtomicU32::new(0)).collect(),
            touched_ms: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            trusted,
            stop: AtomicBool::new(false),
            daemon: Mutex::new(None),
        })
    }

    /// The chunks covering a range in md's resync units.
    fn chunks_of(&self, sectors: Range<u64>) -> Range<u64> {
        let state = self.state.lock().unwrap();
        let chunks = state.0.chunks_touching(sectors);
        chunks.start.min(state.1.chunks())..chunks.end.min(state.1.chunks())
    }

    /// Whether any bit of a range is set (the region may be out of sync).
    pub fn any_dirty(&self, sectors: Range<u64>) -> bool {
        let chunks = self.chunks_of(sectors);
        let state = self.state.lock().unwrap();
        chunks.into_iter().any(|c| state.1.get(c))
    }

    /// The bitmap's (events, events_cleared).
    pub fn events(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap();
        (state.0.events, state.0.events_cleared)
    }

    pub fn dirty_count(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap();
        (state.1.count_set(), state.1.chunks())
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.daemon.lock().unwrap().take() {
            let _ = handle.join();
        }
    }
}

impl Engine {
    /// Called before a write to `stripe`: sets (and makes durable) the bits
    /// of its regions, and counts the write in flight.
    pub(super) fn bitmap_start_write(
        &self,
        stripe: u64,
    ) -> std::io::Result<Option<WriteGuard<'_>>> {
        let Some(bitmap) = self.bitmap.as_ref() else {
            return Ok(None);
        };
        let range = self.geometry.resync_position_sectors(stripe)
            ..self.geometry.resync_position_sectors(stripe + 1);
        let chunks = bitmap.chunks_of(range);
        for c in chunks.clone() {
            bitmap.pending[c as usize].fetch_add(1, Ordering::SeqCst);
        }
        let guard = WriteGuard {
            bitmap,
            chunks: chunks.clone(),
        };
        let clear = {
            let state = bitmap.state.lock().unwrap();
            chunks.clone().any(|c| !state.1.get(c))
        };
        if clear {
            // Array lock first, then the bitmap: the order the superblock
            // path uses too.
            let array = self.array.lock().unwrap();
            let mut state = bitmap.state.lock().unwrap();
            if chunks.clone().any(|c| !state.1.get(c)) {
                for c in chunks.clone() {
                    state.1.set(c);
                }
                write_everywhere(&array, &state.0, &state.1)?;
            }
        }
        Ok(Some(guard))
    }

    /// Starts the daemon that clears quiet regions' bits.
    pub(super) fn start_bitmap_daemon(self: &Arc<Engine>) {
        let Some(bitmap) = self.bitmap.as_ref() else {
            return;
        };
        let weak: Weak<Engine> = Arc::downgrade(self);
        let handle = std::thread::Builder::new()
            .name("uraid-bitmap".into())
            .spawn(move || bitmap_daemon(weak))
            .expect("spawn the bitmap daemon");
        *bitmap.daemon.lock().unwrap() = Some(handle);
    }

    /// Clears the bits of chunks quiet for `quiet_ms`, after flushing the
    /// members so that what the bits covered is durable. Not while degraded.
    pub fn bitmap_clear_quiet(&self, quiet_ms: u64) -> std::io::Result<u64> {
        let Some(bitmap) = self.bitmap.as_ref() else {
            return Ok(0);
        };
        if !self.snapshot_missing_roles_empty() || self.sync.action().is_some() {
            return Ok(0);
        }
        let now = bitmap.epoch.elapsed().as_millis() as u64;
        let quiet: Vec<u64> = {
            let state = bitmap.state.lock().unwrap();
            state
                .1
                .dirty_chunks()
                .filter(|&c| {
                    bitmap.pending[c as usize].load(Ordering::SeqCst) == 0
                        && now.saturating_sub(bitmap.touched_ms[c as usize].load(Ordering::Relaxed))
                            >= quiet_ms
                })
                .collect()
        };
        if quiet.is_empty() {
            return Ok(0);
        }
        self.flush_members()?;
        let array = self.array.lock().unwrap();
        let mut state = bitmap.state.lock().unwrap();
        let mut cleared = 0;
        for c in quiet {
            // A write may have started since: leave its bit.
            if bitmap.pending[c as usize].load(Ordering::SeqCst) == 0 {
                state.1.clear(c);
                cleared += 1;
            }
        }
        state.0.events_cleared = state.0.events;
        write_everywhere(&array, &state.0, &state.1)?;
        Ok(cleared)
    }

    fn snapshot_missing_roles_empty(&self) -> bool {
        self.table().in_sync().iter().all(|s| *s)
    }

    /// Whether stripe `stripe` needs a resync after a crash (or a copy to a
    /// re-added member): with a trusted bitmap only if one of its bits is set.
    pub(super) fn stripe_needs_resync(&self, stripe: u64) -> bool {
        match self.bitmap.as_ref() {
            Some(bitmap) if bitmap.trusted => {
                let range = self.geometry.resync_position_sectors(stripe)
                    ..self.geometry.resync_position_sectors(stripe + 1);
                bitmap.any_dirty(range)
            }
            _ => true,
        }
    }
}

/// Writes the bitmap to every member that carries one, and flushes them.
fn write_everywhere(array: &Assembled, bsb: &BitmapSuper, bits: &Bitmap) -> std::io::Result<()> {
    let mut bsb = bsb.clone();
    bsb.events = bsb.events.max(array.sb.events);
    for device in array.devices.iter().filter(|d| {
        matches!(
            d.state,
            DeviceState::Active { .. } | DeviceState::Recovering { .. } | DeviceState::Spare
        )
    }) {
        if device.sb.feature_map & crate::format::MD_FEATURE_BITMAP_OFFSET == 0 {
            continue;
        }
        write_bitmap(&*device.member, &device.sb, &bsb, bits)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        device.member.flush()?;
    }
    Ok(())
}

fn bitmap_daemon(weak: Weak<Engine>) {
    // The engine is held only while working, never while sleeping, so that
    // dropping it (a crash in tests) releases the members at once.
    let stopped = |weak: &Weak<Engine>| match weak.upgrade() {
        None => true,
        Some(engine) => engine
            .bitmap
            .as_ref()
            .is_none_or(|b| b.stop.load(Ordering::SeqCst)),
    };
    loop {
        let sleep_s = match weak.upgrade() {
            None => return,
            Some(engine) => match engine.bitmap.as_ref() {
                None => return,
                Some(bitmap) => bitmap
                    .state
                    .lock()
                    .unwrap()
                    .0
                    .daemon_sleep_secs
                    .clamp(1, 60) as u64,
            },
        };
        for _ in 0..sleep_s * 10 {
            if stopped(&weak) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some(engine) = weak.upgrade() else { return };
        // md clears a bit after two quiet daemon periods.
        if let Err(e) = engine.bitmap_clear_quiet(2 * sleep_s * 1000) {
            engine.events.push("BitmapWriteError", "", &e.to_string());
        }
    }
}
