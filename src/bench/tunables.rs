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

/// Every knob and its value in force, for the report.
pub fn list(engine: &Engine) -> Vec<(String, String)> {
    engine.tunables()
}

/// Drops the engine's own caches (dd-seq does between its phases). The
/// FLUSH sent before this writes the stripe cache's pending rows out; the
/// engine keeps no read cache unless read_cache is on, and offers no call
/// to drop one: the returned note says so.
pub fn drop_engine_caches(_engine: &Engine) -> Option<&'static str> {
    Some("dd-seq: the FLUSH before each phase wrote the stripe cache out; the engine offers no call to drop a read cache, so only the members' page cache was dropped")
}

/// The stripe cache's rows written whole and in part so far.
pub fn row_counters(engine: &Engine) -> (u64, u64) {
    let report = engine.cache_report();
    (report.full_rows, report.partial_rows)
}
