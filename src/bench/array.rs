//! The array under test: created on member files (or, with
//! `--destroy-data`, on devices the user named), served in process exactly
//! as `uraid serve` serves it (assemble, `Engine::start`,
//! `export::nbd::serve` on a unix socket), and moved between the states the
//! benchmark measures through the engine's manage API.

use crate::array::{create_full, CreateOptions, MemberSpec};
use crate::engine::{Engine, EngineOptions};
use crate::export::nbd::{self, Listener, ServeOptions, ServerHandle};
use crate::export::BlockBackend;
use crate::format::Metadata;
use crate::geometry::Level;
use crate::units::SECTOR_BYTES;
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rebuild the benchmark waits for (to go back to the healthy
/// state) may go without progress before the state is given up. Not a
/// limit on the whole rebuild: on real disks of terabytes it takes hours.
const REBUILD_STALL_MAX: Duration = Duration::from_secs(120);
/// The export name of the benchmark's array.
pub const EXPORT_NAME: &str = "bench";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Healthy,
    /// One member failed and removed.
    Degraded,
    /// That member added back as a spare, measured while it is rebuilt.
    Rebuilding,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Degraded => "degraded",
            State::Rebuilding => "rebuilding",
        }
    }

    pub fn parse(name: &str) -> Result<State, String> {
        [State::Healthy, State::Degraded, State::Rebuilding]
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| format!("unknown state '{name}' (known: healthy, degraded, rebuilding)"))
    }
}

/// What array to build.
#[derive(Clone, Debug)]
pub struct ArraySpec {
    pub level: Level,
    pub chunk_bytes: Option<u64>,
    pub layout: Option<String>,
    /// Bytes of each member the array uses (md's --size); None uses all.
    pub member_bytes: Option<u64>,
    /// A write journal of this size, in a file beside the first member or
    /// in `journal_dir`.
    pub journal_bytes: Option<u64>,
    pub journal_dir: Option<PathBuf>,
}

/// Makes `count` sparse member files in `dir`.
pub fn create_member_files(dir: &Path, count: u32, bytes: u64) -> Result<Vec<PathBuf>, String> {
    (0..count)
        .map(|i| {
            let path = dir.join(format!("member{i}"));
            let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            file.set_len(bytes)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// Returns member files to all zeroes (and sparse), so that a new array on
/// them is consistent without a resync: zero data has zero parity.
pub fn zero_member_files(paths: &[PathBuf], bytes: u64) -> Result<(), String> {
    for path in paths {
        let file = File::options()
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        file.set_len(0)
            .and_then(|()| file.set_len(bytes))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// A served array and the state it is in.
pub struct LiveArray {
    pub engine: Arc<Engine>,
    server: Option<ServerHandle>,
    pub socket: PathBuf,
    /// The member failed for the degraded and rebuilding states.
    victim: PathBuf,
    state: State,
    /// A journal file made outside the benchmark's folder, removed when
    /// the array goes.
    journal_outside: Option<PathBuf>,
}

impl Drop for LiveArray {
    fn drop(&mut self) {
        if let Some(path) = &self.journal_outside {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl LiveArray {
    /// Creates the array on `paths` and serves it on `socket`.
    /// `assume_clean` skips the initial resync (members known to be zero);
    /// `force` overwrites devices that hold data (`--destroy-data`).
    pub fn create_and_serve(
        paths: &[PathBuf],
        spec: &ArraySpec,
        assume_clean: bool,
        force: bool,
        socket: &Path,
    ) -> Result<LiveArray, String> {
        assert!(!paths.is_empty());
        let devices: Vec<MemberSpec> = paths.iter().cloned().map(MemberSpec::Device).collect();
        let options = CreateOptions {
            level: spec.level,
            raid_disks: paths.len() as u32,
            chunk_bytes: spec.chunk_bytes,
            layout: spec.layout.clone(),
            metadata: Metadata::V1_2,
            assume_clean,
            name: EXPORT_NAME.to_string(),
            size_sectors: spec.member_bytes.map(|b| b / SECTOR_BYTES),
            force,
            homehost: None,
            integrity: false,
        };
        let journal = match spec.journal_bytes {
            Some(bytes) => {
                let path = match &spec.journal_dir {
                    Some(dir) => dir.join(format!("uraid-bench-journal-{}", std::process::id())),
                    None => paths[0].with_file_name("journal"),
                };
                File::create(&path)
                    .and_then(|f| f.set_len(bytes))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Some(path)
            }
            None => None,
        };
        let array = create_full(
            &devices,
            journal.as_deref(),
            &options,
            crate::array::BitmapRequest::None,
            |_, _| {},
        )
        .map_err(|e| e.to_string())?;
        let engine = Engine::start(array, EngineOptions::default()).map_err(|e| e.to_string())?;
        let listener: Listener = format!("unix:{}", socket.display())
            .parse()
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        let options = ServeOptions {
            export_name: EXPORT_NAME.to_string(),
            description: "uraid bench".to_string(),
            ..ServeOptions::default()
        };
        let server = match nbd::serve(&listener, engine.clone() as Arc<dyn BlockBackend>, options) {
            Ok(server) => server,
            Err(e) => {
                let _ = engine.shutdown();
                return Err(format!("{}: {e}", socket.display()));
            }
        };
        Ok(LiveArray {
            engine,
            server: Some(server),
            socket: socket.to_path_buf(),
            victim: paths.last().expect("members").clone(),
            state: State::Healthy,
            journal_outside: journal.filter(|_| spec.journal_dir.is_some()),
        })
    }

    /// The array's data bytes per stripe (what a full-stripe write covers).
    pub fn stripe_data_bytes(&self) -> u64 {
        self.engine.geometry().stripe(0).data_sectors() * SECTOR_BYTES
    }

    fn can_degrade(&self) -> Result<(), String> {
        let level = self.engine.geometry().level();
        if self.engine.geometry().max_failed_members() == 0 {
            return Err(format!("{level} has no redundancy: it cannot run degraded"));
        }
        Ok(())
    }

    fn fail_and_remove(&self) -> Result<(), String> {
        self.engine.manage_fail(&self.victim)?;
        self.engine.manage_remove(&self.victim)
    }

    fn add_back(&self) -> Result<(), String> {
        // The member just removed may still be held for a moment by work
        // that took the member table before the removal (a write-back
        // destage, a reply in flight), and with it the file's claim: the
        // add waits for that to end rather than fail the bench.
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match self.engine.manage_add(&self.victim) {
                Err(e) if e.contains("in use") && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                result => return result,
            }
        }
    }

    fn rebuild_running(&self) -> bool {
        self.engine.snapshot().sync.is_some()
    }

    /// Moves the array into `state`.
    pub fn enter(&mut self, state: State) -> Result<(), String> {
        if state != State::Healthy {
            self.can_degrade()?;
        }
        match (self.state, state) {
            (a, b) if a == b => {}
            (State::Healthy, State::Degraded) => self.fail_and_remove()?,
            (State::Healthy, State::Rebuilding) => {
                self.fail_and_remove()?;
                self.add_back()?;
            }
            (State::Degraded, State::Rebuilding) => self.add_back()?,
            // The member being rebuilt (or rebuilt already) fails again.
            (State::Rebuilding, State::Degraded) => self.fail_and_remove()?,
            (State::Degraded, State::Healthy) => {
                self.add_back()?;
                self.wait_for_rebuild()?;
            }
            (State::Rebuilding, State::Healthy) => self.wait_for_rebuild()?,
            _ => unreachable!("every transition is listed"),
        }
        self.state = state;
        Ok(())
    }

    /// Before each phase of the rebuilding state: if the last rebuild
    /// finished, start another, so that every phase runs during one.
    pub fn keep_rebuilding(&self) -> Result<(), String> {
        if self.state == State::Rebuilding && !self.rebuild_running() {
            self.fail_and_remove()?;
            self.add_back()?;
        }
        Ok(())
    }

    /// "recovery 12%" while a background job runs.
    pub fn background(&self) -> Option<String> {
        self.engine.snapshot().sync.map(|p| {
            format!(
                "{} {}%",
                p.action.word(),
                p.done_kib * 100 / p.total_kib.max(1)
            )
        })
    }

    /// Waits for the running rebuild with its speed limit lifted, then puts
    /// the limit back.
    fn wait_for_rebuild(&self) -> Result<(), String> {
        let (min, max) = self.engine.speed_limits();
        self.engine.set_speed_limits(None, Some(u64::MAX / 4));
        let mut progress = (0, Instant::now());
        let result = loop {
            let snapshot = self.engine.snapshot();
            if snapshot.sync.is_none() && snapshot.missing_roles.is_empty() {
                break Ok(());
            }
            let Some(sync) = snapshot.sync else {
                break Err("the array stayed degraded: no rebuild ran".to_string());
            };
            if sync.done_kib != progress.0 {
                progress = (sync.done_kib, Instant::now());
            } else if progress.1.elapsed() > REBUILD_STALL_MAX {
                break Err(format!(
                    "the rebuild made no progress for {} s (at {} of {} KiB)",
                    REBUILD_STALL_MAX.as_secs(),
                    sync.done_kib,
                    sync.total_kib
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.engine.set_speed_limits(Some(min), Some(max));
        result
    }

    /// Stops serving, finishes in-flight I/O and marks the array clean.
    pub fn stop(mut self) -> Result<(), String> {
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
        self.engine
            .shutdown()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
