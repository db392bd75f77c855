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
pub struct WriteGuard {
    bitmap: Arc<LiveBitmap>,
    chunks: Range<u64>,
}

impl Drop for WriteGuard {
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

    /// The /proc/mdstat "bitmap:" line's figures: md keeps a 16-bit counter
    /// per chunk in 4 KiB pages (2048 a page); the file size is the on-disk
    /// bitmap rounded to pages.
    /// The bytes the bitmap takes on each member (superblock and bits).
    pub fn area_bytes(&self) -> u64 {
        self.state.lock().unwrap().0.area_bytes()
    }

    pub fn mdstat_line(&self) -> String {
        let state = self.state.lock().unwrap();
        let chunks = state.1.chunks();
        let per_page = 2048u64;
        let pages = chunks.div_ceil(per_page).max(1);
        let busy = (0..pages)
            .filter(|p| (p * per_page..((p + 1) * per_page).min(chunks)).any(|c| state.1.get(c)))
            .count();
        let file_kb = (256 + chunks.div_ceil(8)).div_ceil(4096) * 4;
        let chunk_bytes = state.0.chunk_bytes as u64;
        let chunk = if chunk_bytes >= 1024 {
            format!("{}KB", chunk_bytes / 1024)
        } else {
            format!("{chunk_bytes}B")
        };
        format!("bitmap: {busy}/{pages} pages [{file_kb}KB], {chunk} chunk")
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
    pub(super) fn bitmap_start_write(&self, stripe: u64) -> std::io::Result<Option<WriteGuard>> {
        let Some(bitmap) = self.live_bitmap() else {
            return Ok(None);
        };
        let chunks = bitmap.chunks_of(self.geometry().bitmap_sectors(stripe));
        for c in chunks.clone() {
            bitmap.pending[c as usize].fetch_add(1, Ordering::SeqCst);
        }
        let guard = WriteGuard {
            bitmap: bitmap.clone(),
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
                let lost = write_everywhere_failing(&array, &state.0, &state.1)?;
                drop(state);
                drop(array);
                self.fail_bitmap_writers(lost)?;
            }
        }
        Ok(Some(guard))
    }

    /// Starts the daemon that clears quiet regions' bits.
    pub(super) fn start_bitmap_daemon(self: &Arc<Engine>) {
        let Some(bitmap) = self.live_bitmap() else {
            return;
        };
        let weak: Weak<Engine> = Arc::downgrade(self);
        let mine = Arc::downgrade(&bitmap);
        let handle = std::thread::Builder::new()
            .name("uraid-bitmap".into())
            .spawn(move || bitmap_daemon(weak, mine))
            .expect("spawn the bitmap daemon");
        *bitmap.daemon.lock().unwrap() = Some(handle);
    }

    /// Clears the bits of chunks quiet for `quiet_ms`, after flushing the
    /// members so that what the bits covered is durable. Not while degraded.
    pub fn bitmap_clear_quiet(&self, quiet_ms: u64) -> std::io::Result<u64> {
        let Some(bitmap) = self.live_bitmap() else {
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
        let lost = write_everywhere_failing(&array, &state.0, &state.1)?;
        drop(state);
        drop(array);
        self.fail_bitmap_writers(lost)?;
        Ok(cleared)
    }

    fn snapshot_missing_roles_empty(&self) -> bool {
        self.table().in_sync().iter().all(|s| *s)
    }

    /// Whether stripe `stripe` needs a resync after a crash (or a copy to a
    /// re-added member): with a trusted bitmap only if one of its bits is set.
    pub(super) fn stripe_needs_resync(&self, stripe: u64) -> bool {
        match self.live_bitmap() {
            Some(bitmap) if bitmap.trusted => {
                bitmap.any_dirty(self.geometry().bitmap_sectors(stripe))
            }
            _ => true,
        }
    }
}

impl Engine {
    /// Fails the members in a role whose bitmap could not be written, as
    /// md fails a member whose bitmap page write fails: the write that
    /// needed the bit goes on without them (it would otherwise fail on the
    /// array for one silent member). An error when the array can no
    /// longer serve.
    fn fail_bitmap_writers(&self, lost: Vec<LostWriter>) -> std::io::Result<()> {
        for writer in &lost {
            let reason = super::readd::failure_reason(
                format!("bitmap write error: {}", writer.error),
                &[&writer.error],
            );
            self.fail_member_if(writer.role, Some(&writer.member), &reason);
        }
        match lost.into_iter().next() {
            Some(writer) if !self.runnable() => Err(writer.error),
            _ => Ok(()),
        }
    }
}

/// A member in a role whose bitmap write failed.
struct LostWriter {
    role: usize,
    member: crate::member::MemberRef,
    error: std::io::Error,
}

/// `write_everywhere`, going on past members in a role that fail: they
/// are returned, to be failed once the locks are let go. A failure of any
/// other device (a spare, a replacement) is an error as before.
fn write_everywhere_failing(
    array: &Assembled,
    bsb: &BitmapSuper,
    bits: &Bitmap,
) -> std::io::Result<Vec<LostWriter>> {
    let mut bsb = bsb.clone();
    bsb.events = bsb.events.max(array.sb.events);
    let mut lost = Vec::new();
    for device in array.devices.iter() {
        let role = match device.state {
            DeviceState::Active { role } | DeviceState::Recovering { role, .. } => Some(role),
            DeviceState::Replacement { .. } | DeviceState::Spare => None,
            _ => continue,
        };
        if device.sb.feature_map & crate::format::MD_FEATURE_BITMAP_OFFSET == 0 {
            continue;
        }
        let result = write_bitmap(&*device.member, &device.sb, &bsb, bits)
            .map_err(|e| match e {
                crate::array::SuperblockError::Io { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            })
            .and_then(|()| device.member.flush());
        match (result, role) {
            (Ok(()), _) => {}
            (Err(error), Some(role)) => lost.push(LostWriter {
                role,
                member: device.member.clone(),
                error,
            }),
            (Err(error), None) => return Err(error),
        }
    }
    Ok(lost)
}

/// Writes the bitmap to every member that carries one, and flushes them.
fn write_everywhere(array: &Assembled, bsb: &BitmapSuper, bits: &Bitmap) -> std::io::Result<()> {
    let mut bsb = bsb.clone();
    bsb.events = bsb.events.max(array.sb.events);
    for device in array.devices.iter().filter(|d| {
        matches!(
            d.state,
            DeviceState::Active { .. }
                | DeviceState::Recovering { .. }
                | DeviceState::Replacement { .. }
                | DeviceState::Spare
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

fn bitmap_daemon(weak: Weak<Engine>, mine: Weak<LiveBitmap>) {
    // The engine is held only while working, never while sleeping, so that
    // dropping it (a crash in tests) releases the members at once. The
    // daemon ends when its bitmap is stopped or replaced.
    let current = |weak: &Weak<Engine>| -> Option<(Arc<Engine>, Arc<LiveBitmap>)> {
        let engine = weak.upgrade()?;
        let bitmap = engine.live_bitmap()?;
        let mine = mine.upgrade()?;
        (Arc::ptr_eq(&bitmap, &mine) && !bitmap.stop.load(Ordering::SeqCst))
            .then_some((engine, bitmap))
    };
    loop {
        let sleep_s = match current(&weak) {
            None => return,
            Some((_, bitmap)) => bitmap
                .state
                .lock()
                .unwrap()
                .0
                .daemon_sleep_secs
                .clamp(1, 60) as u64,
        };
        for _ in 0..sleep_s * 10 {
            if current(&weak).is_none() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let Some((engine, _)) = current(&weak) else {
            return;
        };
        // md clears a bit after two quiet daemon periods.
        if let Err(e) = engine.bitmap_clear_quiet(2 * sleep_s * 1000) {
            engine.events.push("BitmapWriteError", "", &e.to_string());
        }
    }
}

impl Engine {
    /// The array's size changed: the bitmap now covers `sync_size_sectors`
    /// (md's resync unit), resized as md_bitmap_resize does (see
    /// [`crate::format::bitmap::resized`]), written to every member and
    /// taken live; the old one's daemon ends. Called with requests held
    /// and the array locked, so no write races the swap.
    pub(super) fn resize_bitmap(
        self: &Arc<Engine>,
        array: &Assembled,
        sync_size_sectors: u64,
    ) -> Result<(), String> {
        let Some(old) = self.live_bitmap() else {
            return Ok(());
        };
        let (bsb, bits) = {
            let state = old.state.lock().unwrap();
            crate::format::bitmap::resized(&state.0, &state.1, sync_size_sectors)
        };
        write_everywhere(array, &bsb, &bits).map_err(|e| e.to_string())?;
        let mut live = LiveBitmap::load(array).ok_or("the resized bitmap does not read back")?;
        // Trusted as the one it replaces was: the bits carried over are
        // the same bits.
        live.trusted = old.trusted;
        old.stop.store(true, Ordering::SeqCst);
        *self.bitmap.write().unwrap() = Some(Arc::new(live));
        self.start_bitmap_daemon();
        Ok(())
    }

    /// `uraid manage --grow --bitmap internal|none` on a live array, as seed
    /// 001 does around a rebuild. Adding writes a bitmap with every bit set
    /// (the daemon clears quiet regions, as md does for a new bitmap) into
    /// the room between the superblock and the bad-block log or the data.
    pub fn grow_bitmap(
        self: &Arc<Engine>,
        internal: bool,
        chunk_bytes: Option<u64>,
    ) -> Result<String, String> {
        if self.read_only {
            return Err("the array is served read-only".into());
        }
        let mut array = self.array.lock().unwrap();
        if !internal {
            let Some(bitmap) = self.bitmap.write().unwrap().take() else {
                return Err("the array has no bitmap".into());
            };
            bitmap.stop.store(true, Ordering::SeqCst);
            for d in array.devices.iter_mut() {
                d.sb.feature_map &= !crate::format::MD_FEATURE_BITMAP_OFFSET;
                d.sb.bitmap_offset_sectors = 0;
            }
            array.sb.feature_map &= !crate::format::MD_FEATURE_BITMAP_OFFSET;
            array.sb.bitmap_offset_sectors = 0;
            crate::array::write_array_state(&mut array, crate::array::Cleanliness::Dirty)
                .map_err(|e| e.to_string())?;
            self.events.push("BitmapRemoved", "", "");
            return Ok("bitmap removed".into());
        }
        if self.live_bitmap().is_some() {
            return Err("the array already has a bitmap".into());
        }
        let sb = array.sb.clone();
        if !matches!(
            sb.metadata,
            crate::format::Metadata::V1_1 | crate::format::Metadata::V1_2
        ) {
            return Err(format!(
                "adding a bitmap to a live {} array is not supported",
                sb.metadata.as_str()
            ));
        }
        if !self.geometry().level().redundant() {
            return Err(format!(
                "{} has no redundancy for a bitmap to protect",
                self.geometry().level()
            ));
        }
        let sync =
            crate::format::bitmap_sync_sectors(sb.level, sb.layout, sb.raid_disks, sb.size_sectors);
        // The room after the superblock: up to the bad-block log if it
        // follows, else up to the data (on every member).
        let offset: i64 = 8;
        let room_sectors = array
            .devices
            .iter()
            .map(|d| {
                let data = d.sb.data_offset_sectors as i64 - d.sb.super_offset_sectors as i64;
                let bblog = d.sb.bblog_offset_sectors as i64;
                let end = if d.sb.bblog_size_sectors > 0 && bblog > offset {
                    bblog.min(data)
                } else {
                    data
                };
                (end - offset).max(0) as u64
            })
            .min()
            .unwrap_or(0);
        let room_bits = (room_sectors * 512).saturating_sub(256) * 8;
        if room_bits == 0 {
            return Err("no room for a bitmap between the superblock and the data".into());
        }
        // mdadm's default (>= 64 MiB chunks, <= 128 KiB of bitmap), made
        // larger until the bits fit the room.
        let mut chunk = chunk_bytes.unwrap_or(64 << 20).max(512).next_power_of_two();
        while crate::format::bitmap::bit_count(sync, chunk) > room_bits {
            if chunk_bytes.is_some() {
                return Err(format!("a {chunk}-byte bitmap chunk needs more room than the {room_sectors} sectors after the superblock"));
            }
            chunk *= 2;
        }
        let bsb = BitmapSuper::new(sb.set_uuid, sb.events, sync, chunk as u32);
        let bits = Bitmap::new(bsb.chunks(), true);
        for d in array.devices.iter_mut() {
            d.sb.feature_map |= crate::format::MD_FEATURE_BITMAP_OFFSET;
            d.sb.bitmap_offset_sectors = offset as i32;
        }
        array.sb.feature_map |= crate::format::MD_FEATURE_BITMAP_OFFSET;
        array.sb.bitmap_offset_sectors = offset as i32;
        write_everywhere(&array, &bsb, &bits).map_err(|e| e.to_string())?;
        crate::array::write_array_state(&mut array, crate::array::Cleanliness::DirtyTracked)
            .map_err(|e| e.to_string())?;
        let live = LiveBitmap::load(&array).ok_or("the new bitmap does not read back")?;
        *self.bitmap.write().unwrap() = Some(Arc::new(live));
        drop(array);
        self.start_bitmap_daemon();
        self.events.push(
            "BitmapAdded",
            "",
            &format!("{} chunks of {} KiB", bsb.chunks(), chunk >> 10),
        );
        Ok(format!(
            "internal bitmap added: {} chunks of {} KiB",
            bsb.chunks(),
            chunk >> 10
        ))
    }
}
