//! The engine's side of the integrity layer (`member::integrity`): the
//! events and counts of checksum errors, the policy that fails a member
//! that keeps returning bad data, the trust of each member's checksums at
//! start (a crash's window, writes made elsewhere) and the pass that
//! derives them again, and their clean close at stop.
//!
//! A block that fails its checksum is a read error to the request path,
//! which corrects it as md corrects one (rebuilds the strip from the rest
//! of its row, rewrites it, reads it back): the client gets the original
//! bytes and the disk is healed; a row with more wrong blocks than
//! redundancy is an I/O error to the client, never wrong bytes.

use super::Engine;
use crate::array::integrity::{IntegrityOpened, Trust};
use crate::member::{IntegrityMember, MemberRef};
use crate::units::SECTOR_BYTES;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Checksum errors a member may return within `CHECKSUM_ERRORS_WINDOW`
/// before it is failed: ZFS's zed degrades a vdev after 10 checksum errors
/// in 10 minutes, and a disk that keeps returning bad data is not one to
/// keep healing (each error is a row read twice and rewritten).
pub(super) const CHECKSUM_ERRORS_TOLERATED: usize = 10;
pub(super) const CHECKSUM_ERRORS_WINDOW: Duration = Duration::from_secs(600);
/// `ChecksumError` events logged per member; the count goes on past it.
const CHECKSUM_EVENTS_MAX: u64 = 64;

/// The recent corrected checksum errors of each member, by path, for the
/// failure policy.
#[derive(Default)]
pub(super) struct ChecksumPolicy {
    recent: Mutex<Vec<(String, VecDeque<Instant>)>>,
}

impl ChecksumPolicy {
    /// Records one corrected read whose data failed its checksum on
    /// `path`; true when the member has now passed what the policy
    /// tolerates.
    pub(super) fn record(&self, path: &str, now: Instant) -> bool {
        let mut recent = self.recent.lock().unwrap();
        let at = match recent.iter().position(|(p, _)| p == path) {
            Some(at) => at,
            None => {
                recent.push((path.to_string(), VecDeque::new()));
                recent.len() - 1
            }
        };
        let times = &mut recent[at].1;
        times.push_back(now);
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) > CHECKSUM_ERRORS_WINDOW)
        {
            times.pop_front();
        }
        times.len() > CHECKSUM_ERRORS_TOLERATED
    }
}

impl Engine {
    /// Takes over the members opened with checksums: their errors become
    /// events, their crash window and stale checksums are untrusted, and
    /// their headers say open. Returns whether a check must run to derive
    /// checksums no resync will (the array ran elsewhere, or was stopped
    /// uncleanly with no resync owed).
    pub(super) fn open_integrity(self: &Arc<Self>, resync_owed: bool) -> std::io::Result<bool> {
        let opened: Vec<IntegrityOpened> = self.array.lock().unwrap().integrity.clone();
        let mut check = false;
        for o in &opened {
            self.watch_checksums(&o.member);
            match &o.trust {
                Trust::Kept => {}
                Trust::Stale { closed_at, now } => {
                    check = true;
                    self.events.push(
                        "IntegrityStale",
                        &o.path,
                        &format!(
                            "checksums not trusted: the array was run outside uraid since they \
                             were written (events {closed_at} -> {now}); a check derives them \
                             again where each row's parity agrees"
                        ),
                    );
                }
                // With a write journal every row in flight was in it, and
                // its replay has rewritten them through the layer; the
                // rows it had let go of were flushed first (the journal's
                // reclaim flushes the members, checksum pages included).
                Trust::Unclean if self.journal.is_some() => {
                    self.events.push(
                        "IntegrityUnclean",
                        &o.path,
                        "not closed cleanly: the write journal's replay rewrote the rows that \
                         were in flight, checksums with them",
                    );
                }
                Trust::Unclean => {
                    self.untrust_crash_window(&o.member, resync_owed);
                    check |= !resync_owed;
                    self.events.push(
                        "IntegrityUnclean",
                        &o.path,
                        &format!(
                            "not closed cleanly: the checksums of {} block(s) that may have been \
                             in flight are not trusted until the {} derives them",
                            o.member.untrusted_blocks(),
                            if resync_owed { "resync" } else { "check" }
                        ),
                    );
                }
            }
            if !self.read_only {
                o.member.mark_open()?;
            }
        }
        Ok(check && !self.read_only)
    }

    /// Installs the sink that turns a member's failed checksums into
    /// events (the first `CHECKSUM_EVENTS_MAX`; the count has them all).
    pub(super) fn watch_checksums(self: &Arc<Self>, member: &Arc<IntegrityMember>) {
        let weak: Weak<Engine> = Arc::downgrade(self);
        let logged = Arc::new(std::sync::atomic::AtomicU64::new(0));
        member.set_sink(Arc::new(move |name: &str, offset_bytes: u64| {
            let Some(engine) = weak.upgrade() else { return };
            let n = logged.fetch_add(1, Ordering::SeqCst);
            if n < CHECKSUM_EVENTS_MAX {
                engine.events.push(
                    "ChecksumError",
                    name,
                    &format!(
                        "member sectors {}..{}: the bytes read do not match their checksum; \
                         read from the rest of the row instead",
                        offset_bytes / SECTOR_BYTES,
                        offset_bytes / SECTOR_BYTES + 8
                    ),
                );
            } else if n == CHECKSUM_EVENTS_MAX {
                engine.events.push(
                    "ChecksumError",
                    name,
                    "further checksum errors on this member are counted, not logged",
                );
            }
        }));
    }

    /// After a crash: the blocks of the rows that may have been in flight,
    /// whose checksum pages may not have reached the disk. With a trusted
    /// bitmap, its dirty rows (bits are cleared only after the members,
    /// checksum pages included, are flushed); otherwise every block.
    /// Every block too when md's superblocks owe no resync: the array was
    /// stopped in order, or idle and marked clean, yet this region was not
    /// closed (its close failed, or a write to it did), so no bitmap bit
    /// tells which of its pages missed the disk.
    fn untrust_crash_window(&self, member: &Arc<IntegrityMember>, resync_owed: bool) {
        let geometry = self.geometry();
        let trusted_bitmap = self.live_bitmap().is_some_and(|b| b.trusted);
        if !trusted_bitmap || geometry.draid().is_some() || !resync_owed {
            // Every row the array uses; past them nothing is in flight.
            let used = self.array.lock().unwrap().sb.size_sectors * SECTOR_BYTES;
            member.untrust(member.layout().data_start_bytes, used);
            return;
        }
        let table = self.table();
        let Some(role) = (0..table.by_role.len()).find(|&r| {
            table.entry(r).is_some_and(|e| {
                e.slot
                    .member
                    .integrity()
                    .is_some_and(|i| std::ptr::eq(i, member.as_ref()))
            })
        }) else {
            // Not in a role (a spare): nothing of it is read before a
            // rebuild writes it.
            return;
        };
        let data_offset = table
            .entry(role)
            .expect("found above")
            .slot
            .data_offset_bytes;
        for stripe in 0..geometry.stripe_count() {
            if !self.stripe_needs_resync(stripe) {
                continue;
            }
            let map = geometry.stripe(stripe);
            let strip_bytes = map.strip_sectors * SECTOR_BYTES;
            let places = map
                .data
                .iter()
                .flat_map(|d| d.copies.iter())
                .chain(map.p.iter())
                .chain(map.q.iter())
                .chain(map.r.iter());
            for place in places.filter(|p| p.member == role) {
                member.untrust(
                    data_offset + place.member_sector * SECTOR_BYTES,
                    strip_bytes,
                );
            }
        }
    }

    /// A read error that was a checksum mismatch, corrected: counted for
    /// the policy. True when the member must now be failed instead.
    pub(super) fn checksum_error_fails(&self, path: &str) -> bool {
        self.checksum_policy.record(path, Instant::now())
    }

    /// The member a device joining an integrity array is used through: its
    /// layer as it is, its region opened (a member coming back), or a new
    /// region written (`new`, or one that has none). Its errors become
    /// events from here on, and its header says open.
    pub(super) fn with_integrity(
        self: &Arc<Self>,
        array: &mut crate::array::Assembled,
        name: &str,
        member: MemberRef,
        sb: &crate::format::MemberSuper,
        new: bool,
    ) -> Result<MemberRef, String> {
        if member.integrity().is_some() {
            return Ok(member);
        }
        let opened = match new {
            true => None,
            false => crate::array::integrity::open_member(name, member.clone(), sb)?.1,
        };
        let opened = match opened {
            Some(opened) => opened,
            None => {
                let layer = crate::array::integrity::format_member(member, sb)
                    .map_err(|e| format!("{name}: {e}"))?;
                // The rebuild writes every row; what lies past them is
                // derived now.
                crate::array::integrity::derive_unused(&layer, sb)
                    .map_err(|e| format!("{name}: {e}"))?;
                IntegrityOpened {
                    path: name.to_string(),
                    member: layer,
                    trust: Trust::Kept,
                }
            }
        };
        self.watch_checksums(&opened.member);
        if !self.read_only {
            opened
                .member
                .mark_open()
                .map_err(|e| format!("{name}: checksum region: {e}"))?;
        }
        let layer = opened.member.clone() as MemberRef;
        array.integrity.retain(|o| o.path != name);
        array.integrity.push(opened);
        Ok(layer)
    }

    /// Refuses what would move md's data area on an integrity array: its
    /// checksum region lies right after it, and a reshape or a size change
    /// does not carry the region along (yet).
    pub(super) fn refuse_with_integrity(&self, what: &str) -> Result<(), String> {
        let array = self.array.lock().unwrap();
        match array.devices.iter().any(|d| d.member.integrity().is_some()) {
            true => Err(format!(
                "{what} is not supported on an array with --integrity: its checksums live right \
                 after md's data area, which {what} moves"
            )),
            false => Ok(()),
        }
    }

    /// Whether the array would still serve every sector with `role` lost
    /// too: the policy fails a member only then (with nothing left to
    /// correct from, its errors are the client's I/O errors anyway).
    pub(super) fn survives_without(&self, role: usize) -> bool {
        let table = self.table();
        let mut missing: Vec<bool> = table.in_sync().iter().map(|s| !s).collect();
        if role < missing.len() {
            missing[role] = true;
        }
        self.geometry().survives(&missing)
    }

    /// Checksums a pass could not derive because a member was missing (the
    /// resync after a crash of a degraded array: no parity left over to
    /// tell a rotten block from a good one) stay untrusted, and rot there
    /// goes unseen, until a check of the whole array. Once the last missing
    /// role is rebuilt, that check starts by itself instead of waiting for
    /// the next scheduled scrub.
    pub(super) fn derive_once_whole(self: &Arc<Self>) {
        if self.read_only || self.sync.action().is_some() {
            return;
        }
        let table = self.table();
        if table.by_role.iter().any(|e| e.is_none()) {
            return;
        }
        let untrusted = table.by_role.iter().flatten().any(|e| {
            e.slot
                .member
                .integrity()
                .is_some_and(|i| i.untrusted_blocks() > 0)
        });
        drop(table);
        if untrusted {
            let _ = self.start_scrub(false);
        }
    }

    /// Closes every checksum region at the event count its member's
    /// superblock ends with, after the last superblock write of a stop.
    pub(super) fn close_integrity(&self) {
        // The devices, not the list opened at start: a member that came
        // back is used through a new layer, and the old one must not write
        // its stale pages over the new one's.
        //
        // A member whose close fails does not fail the stop: md's
        // superblocks are written and clean, and the region left open is
        // untrusted whole at the next start (`untrust_crash_window`) and
        // derived again by a check, so it can raise no false error.
        let array = self.array.lock().unwrap();
        let mut unclosed = Vec::new();
        for device in &array.devices {
            let Some(integrity) = device.member.integrity() else {
                continue;
            };
            if device.state == crate::array::DeviceState::Faulty {
                continue;
            }
            if let Err(e) = integrity.close(device.sb.events) {
                unclosed.push((device.path.clone(), e));
            }
        }
        drop(array);
        for (path, e) in unclosed {
            self.events.push(
                "IntegrityNotClosed",
                &path,
                &format!(
                    "checksum region not closed ({e}): the next start trusts none of its \
                     checksums and a check derives them again"
                ),
            );
        }
    }
}
