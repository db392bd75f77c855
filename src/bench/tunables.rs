//! The engine's live knobs (stripe_cache_size, read_ahead, max_sectors_kb,
//! write_policy, read_cache, fast_path, rmw_level, group_thread_cnt),
//! behind one small adapter so that the benchmark depends on the engine's
//! API in one place only.

use crate::engine::Engine;

/// Sets one knob on a live engine, as `uraid manage --set` does.
pub fn set(engine: &Engine, key: &str, value: &str) -> Result<(), String> {
    engine
        .set_tunable(key, value)
        .map_err(|e| format!("{key}={value}: {e}"))
}

/// Sets one knob and returns the value it had, to be set back.
pub fn swap(engine: &Engine, key: &str, value: &str) -> Result<String, String> {
    // The values as set, not as `list` shows them: read_ahead in force
    // may carry a note that `set` would refuse.
    let before = engine
        .tuning()
        .pairs()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| format!("{key}: no such knob"))?;
    set(engine, key, value)?;
    Ok(before)
}

/// Every knob and its value in force, for the report.
pub fn list(engine: &Engine) -> Vec<(String, String)> {
    engine.tunables()
}

/// Drops the engine's own caches (dd-seq does before each phase): writes
/// out what the stripe cache holds and forgets cached reads.
pub fn drop_engine_caches(engine: &Engine) -> Result<(), String> {
    engine
        .drop_caches()
        .map_err(|e| format!("dropping the engine's caches: {e}"))
}

/// The stripe cache's rows written whole and in part so far.
pub fn row_counters(engine: &Engine) -> (u64, u64) {
    let report = engine.cache_report();
    (report.full_rows, report.partial_rows)
}
