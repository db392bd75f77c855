//! `uraid status`: /proc/mdstat for the arrays uraid serves.

use super::CliResult;
use crate::control::{self, registry, Request, StatusReply};
use std::path::{Path, PathBuf};

/// The control sockets to ask: the one given, or every registered server's
/// and any other in the socket folder (a server that could not register).
pub(crate) fn sockets(control_socket: Option<&Path>) -> Vec<PathBuf> {
    if let Some(socket) = control_socket {
        return vec![socket.to_path_buf()];
    }
    let mut found: Vec<PathBuf> = registry::list().into_iter().map(|e| e.control).collect();
    let known: Vec<PathBuf> = found.iter().filter_map(|p| p.canonicalize().ok()).collect();
    let dir = registry::runtime_dir();
    let mut loose: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "ctl"))
            .filter(|p| !p.canonicalize().is_ok_and(|c| known.contains(&c)))
            .collect(),
        Err(_) => Vec::new(),
    };
    loose.sort();
    found.extend(loose);
    found
}

pub fn run(control_socket: Option<&Path>, json: bool) -> CliResult {
    let mut replies: Vec<StatusReply> = Vec::new();
    for socket in sockets(control_socket) {
        match control::request(&socket, &Request::Status) {
            Ok(reply) => replies.push(reply),
            // Without an explicit socket, a stale one is skipped, not fatal.
            Err(e) if control_socket.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    if json {
        let arrays: Vec<serde_json::Value> = replies
            .iter()
            .map(|r| {
                serde_json::json!({
                    "nbd": r.nbd_uri,
                    "pid": r.pid,
                    "mdstat": r.mdstat,
                    "detail": r.detail,
                    "events": r.events,
                    "mismatch_cnt": r.mismatch_cnt,
                    "speed_limit_min_kib_per_s": r.speed_limit_min_kib_per_s,
                    "speed_limit_max_kib_per_s": r.speed_limit_max_kib_per_s,
                    "check_period_days": r.check_period_days,
                    "next_check_in_secs": r.next_check_in_secs,
                    "bitmap_dirty_chunks": r.bitmap_dirty_chunks,
                    "stripe_cache": r.stripe_cache,
                    "journal": r.journal,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&arrays).expect("serializable")
        );
        return Ok(());
    }
    let mut personalities: Vec<String> = Vec::new();
    for r in &replies {
        let level = format!("[{}]", r.detail["raid_level"].as_str().unwrap_or("?"));
        if !personalities.contains(&level) {
            personalities.push(level);
        }
    }
    println!("Personalities : {}", personalities.join(" "));
    for r in &replies {
        print!("{}", served_block(r));
    }
    println!("unused devices: <none>");
    Ok(())
}

/// An array's /proc/mdstat block with the process that serves it as the
/// block's last indented line: the PID `uraid stop` ends, which /proc/mdstat
/// has no line for. (Not the export's URI: its socket path is any word a
/// user chose, and scripts look for words such as "resync" in this text.)
fn served_block(r: &StatusReply) -> String {
    let block = r.mdstat.strip_suffix("      \n").unwrap_or(&r.mdstat);
    format!("{block}      served by pid {}\n      \n", r.pid)
}
