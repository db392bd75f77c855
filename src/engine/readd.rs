//! Members that fail and come back: why each failed member failed (shown in
//! detail and status), and the automatic re-add of members that failed by a
//! timeout (`serve --auto-re-add`, `manage --auto-re-add on|off`).
//!
//! A member that stopped answering (a network path down, a member host
//! rebooting) is failed like any other, so that the array serves on from
//! redundancy; unlike a disk with I/O errors it is likely to come back
//! whole. With auto re-add on, a prober thread opens each such member
//! again now and then (`Member::reopen`: a new descriptor, a reconnect),
//! reads its superblock and, when it answers and belongs (this array's
//! UUID, its role still free, its events not ahead of the array's and not
//! older than the bitmap's last clear), re-adds it as `manage --add` does:
//! only the regions the write-intent bitmap marks are copied to it. A
//! member that failed with I/O errors, by request or without a bitmap to
//! guide its return is never re-added by itself.

use super::Engine;
use crate::array::DeviceState;
use crate::member::MemberRef;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// How a reason for a failure begins when the member did not answer in
/// time, so that people and the prober can tell it from an I/O error.
pub const TIMEOUT_REASON: &str = "timeout";

/// How often failed members are probed.
const PROBE_PERIOD: Duration = Duration::from_secs(2);

fn written_bytes(member: &MemberRef) -> u64 {
    member.io_stats().map_or(0, |s| s.counts().write.bytes)
}

/// The reason for a failure caused by `errors`: `what`, or when one of
/// them is a timeout, "timeout: " and that error (the rest of the story,
/// a correction refused by the same silent member, adds nothing).
pub(super) fn failure_reason(what: String, errors: &[&io::Error]) -> String {
    match errors.iter().find(|e| e.kind() == io::ErrorKind::TimedOut) {
        Some(e) => format!("{TIMEOUT_REASON}: {e}"),
        None => what,
    }
}

#[derive(Default)]
pub(super) struct Returns {
    /// Why each failed device failed, by path, for as long as it stays failed.
    failures: Mutex<Vec<(String, String)>>,
    auto: AtomicBool,
    prober: OnceLock<()>,
    /// Members re-added through the bitmap, by path, with the bytes written
    /// to them when the copy started: its end says how much it copied.
    copies: Mutex<Vec<(String, u64)>>,
}

impl Returns {
    pub(super) fn failed(&self, path: &str, reason: &str) {
        if path.is_empty() {
            return;
        }
        let mut failures = self.failures.lock().unwrap();
        failures.retain(|(p, _)| p != path);
        failures.push((path.to_string(), reason.to_string()));
    }

    pub(super) fn back(&self, path: &str) {
        let path = std::path::Path::new(path);
        self.failures
            .lock()
            .unwrap()
            .retain(|(p, _)| !Engine::same_device(p, path));
    }

    pub(super) fn copy_started(&self, path: &str, member: &MemberRef) {
        let mut copies = self.copies.lock().unwrap();
        copies.retain(|(p, _)| p != path);
        copies.push((path.to_string(), written_bytes(member)));
    }

    /// What the end of a re-add's copy says: the bytes it wrote (the
    /// regions the bitmap marked, and the superblock and bitmap updates).
    pub(super) fn copy_finished(&self, path: &str, member: Option<&MemberRef>) -> String {
        let mut copies = self.copies.lock().unwrap();
        let Some(at) = copies.iter().position(|(p, _)| p == path) else {
            return String::new();
        };
        let (_, before) = copies.swap_remove(at);
        match member {
            Some(member) => format!(
                "re-add through the bitmap: {} KiB written",
                written_bytes(member).saturating_sub(before) / 1024
            ),
            None => String::new(),
        }
    }

    pub(super) fn reasons(&self) -> Vec<(String, String)> {
        self.failures.lock().unwrap().clone()
    }

    fn timed_out(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, reason)| reason.starts_with(TIMEOUT_REASON))
            .map(|(path, _)| path.clone())
            .collect()
    }
}

impl Engine {
    /// Turns the automatic re-add of members failed by a timeout on or off.
    pub fn set_auto_readd(self: &Arc<Engine>, on: bool) {
        self.returns.auto.store(on, Ordering::SeqCst);
        if on {
            self.returns.prober.get_or_init(|| {
                let weak = Arc::downgrade(self);
                let spawned = std::thread::Builder::new()
                    .name("uraid-readd".into())
                    .spawn(move || probe_loop(&weak));
                if let Err(e) = spawned {
                    eprintln!("uraid: automatic re-add not started: {e}");
                }
            });
        }
    }

    pub fn auto_readd(&self) -> bool {
        self.returns.auto.load(Ordering::SeqCst)
    }

    /// The member of the failed device at `path`, opened again; None when
    /// no failed device has that path, and `Unsupported` when its backend
    /// cannot open itself again.
    pub(super) fn reopen_failed(&self, path: &std::path::Path) -> Option<io::Result<MemberRef>> {
        let old = {
            let array = self.array.lock().unwrap();
            array
                .devices
                .iter()
                .find(|d| d.state == DeviceState::Faulty && Self::same_device(&d.path, path))
                .map(|d| d.member.clone())?
        };
        // Outside the array lock: a reconnect may take its time.
        Some(old.reopen())
    }

    /// One pass of the prober: each member failed by a timeout that opens
    /// again, answers and belongs is re-added through the bitmap.
    fn probe_failed(self: &Arc<Engine>) {
        if !self.auto_readd() || self.read_only || self.sync.action().is_some() {
            return;
        }
        for path in self.returns.timed_out() {
            let path = std::path::Path::new(&path);
            let member = match self.reopen_failed(path) {
                Some(Ok(member)) => member,
                // Removed meanwhile, or not back yet.
                None | Some(Err(_)) => continue,
            };
            if !self.belongs(&member) {
                continue;
            }
            if let Ok(true) = self.try_readd(path, &member) {
                self.events.push(
                    "AutoReAdd",
                    &path.display().to_string(),
                    "answers again after a timeout",
                );
                // One job at a time: the next waits for this one.
                return;
            }
        }
    }

    /// Whether `member`'s superblock says it is this array's and not from
    /// its future: a member whose events are ahead of the array's was
    /// written by someone else meanwhile (assembled elsewhere), and its
    /// bitmap does not tell what differs.
    fn belongs(&self, member: &MemberRef) -> bool {
        let Ok(Some(sb)) = crate::array::read_superblock(&**member) else {
            return false;
        };
        let array = self.array.lock().unwrap();
        sb.set_uuid == array.sb.set_uuid && sb.events <= array.sb.events
    }
}

fn probe_loop(weak: &Weak<Engine>) {
    loop {
        std::thread::sleep(PROBE_PERIOD);
        let Some(engine) = weak.upgrade() else {
            return;
        };
        if engine.sync.is_closed() {
            return;
        }
        engine.probe_failed();
    }
}
