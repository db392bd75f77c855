//! The engine's live knobs, behind one small adapter so that the benchmark
//! does not depend on how the engine spells them.
//!
//! The engine is getting `Engine::set_tunable(key, value)` and
//! `Engine::tunables()` (stripe_cache_size, read-ahead, max I/O size, write
//! policy, read cache, fast path; issue #5). Until they exist this adapter
//! says so, and `--set`/`--sweep` are refused before anything is created.

use crate::engine::Engine;

/// Whether the engine offers live tunables.
pub fn available() -> bool {
    false
}

/// Sets one knob on a live engine.
pub fn set(_engine: &Engine, key: &str, value: &str) -> Result<(), String> {
    Err(format!(
        "{key}={value}: this engine has no live tunables yet (Engine::set_tunable, issue #5)"
    ))
}

/// Every knob and its value in force, for the report.
pub fn list(_engine: &Engine) -> Vec<(String, String)> {
    Vec::new()
}

/// Drops the engine's own caches (dd-seq does between its phases). The
/// engine keeps no cache of its own yet; the returned note says so.
pub fn drop_engine_caches(_engine: &Engine) -> Option<&'static str> {
    Some("the engine has no cache of its own to drop yet; only the members' page cache was dropped")
}
