//! Where running servers can be found: every `uraid serve` writes an entry
//! in the runtime folder (`<dir>/arrays/<uuid>.json`) once its sockets
//! listen, and removes it when it stops, wherever its --control and --nbd
//! sockets are. `uraid status`, `detail --scan` and `monitor --scan` list
//! the entries; one whose process is gone (a crash, SIGKILL) or whose
//! control socket does not answer is skipped and removed. A served array's
//! entry lists its members by their canonical names and is written again
//! whenever a member fails, goes, comes or is replaced.

use crate::array::dspare::is_spare_name;
use crate::engine::{Engine, Snapshot};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the member follower sleeps between events at most: it wakes on
/// every event anyway, so this only bounds how stale a change that raised
/// no event can get.
const FOLLOW_WAIT: Duration = Duration::from_secs(10);

/// The variable that moves the runtime folder (and the default sockets).
pub const RUNTIME_DIR_VAR: &str = "URAID_RUNTIME_DIR";

/// The runtime folder: `$URAID_RUNTIME_DIR`, else /run/uraid for root, else
/// `$XDG_RUNTIME_DIR/uraid`, else a per-user folder in the temp folder.
/// Default sockets live here too.
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(RUNTIME_DIR_VAR).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/uraid");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("uraid"),
        None => std::env::temp_dir().join(format!("uraid-{uid}")),
    }
}

/// The short name a served array goes by: the part of its name after the
/// host (md's /dev/md/<name>), or the first eight digits of its UUID when
/// it has no name.
pub fn label_for(set_name: &str, uuid: &str) -> String {
    let label = super::view::array_label(set_name);
    if label.is_empty() {
        uuid.chars().take(8).collect()
    } else {
        label.to_string()
    }
}

/// Creates `dir` (and its parents) private to the user, if missing.
pub fn ensure_private_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

fn arrays_dir() -> PathBuf {
    runtime_dir().join("arrays")
}

/// One served array, as its server registered it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Entry {
    pub uuid: String,
    /// The array's name as the superblock holds it ("host:name"), may be empty.
    pub name: String,
    /// The short name the server exports and monitors use (/dev/md/<label>).
    pub label: String,
    pub level: String,
    pub pid: u32,
    pub control: PathBuf,
    pub nbd_uri: String,
    /// The ublk block device (/dev/ublkbN), when it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ublk: Option<String>,
    /// The devices the server holds (members, spares, failed members not
    /// yet removed) by [`crate::member::canonical_name`], as
    /// [`member_names`] lists them.
    pub members: Vec<String>,
    /// When the server started serving, seconds since the epoch.
    pub started_secs: u64,
}

impl Entry {
    /// The name mdadm would give the array's device.
    pub fn md_device(&self) -> String {
        format!("/dev/md/{}", self.label)
    }
}

/// Whether `pid` names a live process (one that cannot be signalled by
/// this user counts as live).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn answers(control: &Path) -> bool {
    UnixStream::connect(control).is_ok()
}

/// Whether the entry's server is alive and answers on its control socket.
fn live(entry: &Entry) -> bool {
    process_alive(entry.pid) && answers(&entry.control)
}

/// The registered servers that are alive and answer on their control
/// socket, by name then UUID. Entries of dead servers are removed.
pub fn list() -> Vec<Entry> {
    list_in(&arrays_dir())
}

fn list_in(dir: &Path) -> Vec<Entry> {
    let Ok(files) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut entries = Vec::new();
    for file in files.flatten() {
        let path = file.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        // A file being written is a dot-file; one that cannot be read or
        // parsed is left alone (it may be a newer server's).
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(entry) = serde_json::from_str::<Entry>(&text) else {
            continue;
        };
        if live(&entry) {
            entries.push(entry);
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
    entries.sort_by(|a, b| (&a.label, &a.uuid, a.pid).cmp(&(&b.label, &b.uuid, b.pid)));
    entries
}

/// The devices a served array holds, by the names its engine gives them
/// (canonical since assembly): a dRAID's distributed spares are space on
/// the other members, not devices, and are left out.
pub fn member_names(snapshot: &Snapshot) -> Vec<String> {
    snapshot
        .devices
        .iter()
        .map(|d| d.path.clone())
        .filter(|p| !is_spare_name(p))
        .collect()
}

/// A server's entry; removed when dropped (or by `remove`).
pub struct Registration {
    path: PathBuf,
    pid: u32,
    /// The thread that keeps the member list current, and its stop flag.
    follower: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Registration {
    /// Writes the entry, atomically (a temporary file renamed into place).
    /// A live entry of another server of the same UUID (a copy of the same
    /// members served elsewhere) is kept, and this one gets its pid in its
    /// file name.
    pub fn register(entry: &Entry) -> Result<Registration, String> {
        register_in(&arrays_dir(), entry)
    }

    /// Registers the array `engine` serves with the members it holds, and
    /// keeps that list current until dropped: after each of the engine's
    /// events the entry is written again if the list changed.
    pub fn register_served(mut entry: Entry, engine: Arc<Engine>) -> Result<Registration, String> {
        let mut seen = engine.last_event_seq();
        entry.members = member_names(&engine.snapshot());
        let mut registration = register_in(&arrays_dir(), &entry)?;
        let stop = Arc::new(AtomicBool::new(false));
        let path = registration.path.clone();
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("registry".into())
            .spawn(move || loop {
                if !engine.wait_for_event(seen, FOLLOW_WAIT, || stopped.load(Ordering::SeqCst))
                    && stopped.load(Ordering::SeqCst)
                {
                    return;
                }
                // The number before the snapshot: an event during it is
                // waited for next time, not missed.
                seen = engine.last_event_seq();
                let members = member_names(&engine.snapshot());
                if members != entry.members {
                    entry.members = members;
                    if let Err(e) = write_entry(&path, &entry) {
                        eprintln!("uraid: registry entry not updated: {e}");
                    }
                }
            })
            .map_err(|e| format!("registry follower: {e}"))?;
        registration.follower = Some((stop, thread));
        Ok(registration)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the entry now.
    pub fn remove(self) {}
}

fn register_in(dir: &Path, entry: &Entry) -> Result<Registration, String> {
    ensure_private_dir(dir)?;
    let mut path = dir.join(format!("{}.json", entry.uuid));
    let other_live = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<Entry>(&t).ok())
        .is_some_and(|e| e.pid != entry.pid && live(&e));
    if other_live {
        path = dir.join(format!("{}-{}.json", entry.uuid, entry.pid));
    }
    write_entry(&path, entry)?;
    Ok(Registration {
        path,
        pid: entry.pid,
        follower: None,
    })
}

/// Writes `entry` at `path` atomically: a temporary dot-file (which
/// readers skip) renamed into place.
fn write_entry(path: &Path, entry: &Entry) -> Result<(), String> {
    let dir = path.parent().expect("an entry lives in the arrays folder");
    let tmp = dir.join(format!(".{}-{}.tmp", entry.uuid, entry.pid));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        let mut text = serde_json::to_vec_pretty(entry).expect("serializable");
        text.push(b'\n');
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })
}

impl Drop for Registration {
    fn drop(&mut self) {
        // The follower first, so that it cannot write the entry again
        // after it is removed.
        if let Some((stop, thread)) = self.follower.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
        // Only our own entry: another server may have registered the same
        // UUID since (after a crash of this one, say).
        let ours = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| serde_json::from_str::<Entry>(&t).ok())
            .is_some_and(|e| e.pid == self.pid);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn entry(dir: &Path, uuid: &str, pid: u32) -> (Entry, UnixListener) {
        let control = dir.join(format!("{uuid}-{pid}.ctl"));
        let listener = UnixListener::bind(&control).unwrap();
        let e = Entry {
            uuid: uuid.into(),
            name: "host:vol".into(),
            label: "vol".into(),
            level: "raid5".into(),
            pid,
            control,
            nbd_uri: "nbd+unix:///vol?socket=/x".into(),
            ublk: None,
            members: vec!["/a".into(), "/b".into()],
            started_secs: 1,
        };
        (e, listener)
    }

    fn scratch() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "uraid-registry-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn entries_live_until_their_server_goes() {
        let dir = scratch();
        let arrays = dir.join("arrays");
        let me = std::process::id();
        let (e, listener) = entry(&dir, "aaaa", me);
        let reg = register_in(&arrays, &e).unwrap();
        assert_eq!(list_in(&arrays), vec![e.clone()]);
        // The control socket stops answering: skipped and cleaned.
        drop(listener);
        let _ = std::fs::remove_file(&e.control);
        assert!(list_in(&arrays).is_empty());
        assert!(!reg.path().exists());
        drop(reg);

        // A dead pid: skipped and cleaned although its socket answers.
        let (mut dead, _l) = entry(&dir, "bbbb", me);
        dead.pid = i32::MAX as u32;
        let reg = register_in(&arrays, &dead).unwrap();
        assert!(list_in(&arrays).is_empty());
        drop(reg);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_second_server_of_one_uuid_keeps_the_first_entry() {
        let dir = scratch();
        let arrays = dir.join("arrays");
        let me = std::process::id();
        let (first, _l1) = entry(&dir, "cccc", me);
        let reg1 = register_in(&arrays, &first).unwrap();
        // pid 1 is alive (and may not be signalled: still alive).
        let (second, _l2) = entry(&dir, "cccc", 1);
        let reg2 = register_in(&arrays, &second).unwrap();
        assert_ne!(reg1.path(), reg2.path());
        assert_eq!(list_in(&arrays).len(), 2);
        drop(reg2);
        assert_eq!(list_in(&arrays), vec![first]);
        drop(reg1);
        assert!(std::fs::read_dir(&arrays).unwrap().next().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
