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
                    "ublk": r.ublk,
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
                    "sync": r.sync,
                    "jobs_idle": r.jobs_idle,
                    "members": r.members,
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
/// Members that failed checksums are named on a line of their own before
/// it, never in the member list, which parsers of /proc/mdstat read.
fn served_block(r: &StatusReply) -> String {
    let block = r.mdstat.strip_suffix("      \n").unwrap_or(&r.mdstat);
    let checksums = checksum_line(r)
        .map(|line| format!("      {line}\n"))
        .unwrap_or_default();
    format!("{block}{checksums}      served by pid {}\n      \n", r.pid)
}

/// "checksum errors: sdb 3, sdc 1" for the members with checksum errors
/// since they were opened (zpool status's CKSUM), as /proc/mdstat names
/// them; None when no member has any.
fn checksum_line(r: &StatusReply) -> Option<String> {
    let members: Vec<String> = r
        .members
        .iter()
        .filter_map(|m| {
            let errors = m.checksum_errors.filter(|n| *n > 0)?;
            Some(format!("{} {errors}", crate::member::short_name(&m.path)))
        })
        .collect();
    (!members.is_empty()).then(|| format!("checksum errors: {}", members.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::served_block;
    use crate::control::{MemberStatus, StatusReply};

    /// A raid1 of two members served by pid 42, with these checksum
    /// error counts.
    fn raid1(checksum_errors: [Option<u64>; 2]) -> StatusReply {
        StatusReply {
            mdstat: format!("{MDSTAT}      \n"),
            pid: 42,
            members: ["/d/a", "/d/b"]
                .iter()
                .zip(checksum_errors)
                .map(|(path, checksum_errors)| MemberStatus {
                    path: path.to_string(),
                    state: "in_sync".into(),
                    checksum_errors,
                    untrusted_blocks: checksum_errors.map(|_| 0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    const MDSTAT: &str = "data : active raid1 a[0] b[1]\n      1024 blocks super 1.2 [2/2] [UU]\n";

    #[test]
    fn a_member_with_checksum_errors_is_named_before_the_pid() {
        assert_eq!(
            served_block(&raid1([Some(0), Some(2)])),
            format!("{MDSTAT}      checksum errors: b 2\n      served by pid 42\n      \n")
        );
    }

    #[test]
    fn without_checksum_errors_the_block_is_as_before() {
        let before = format!("{MDSTAT}      served by pid 42\n      \n");
        assert_eq!(served_block(&raid1([None, None])), before);
        assert_eq!(served_block(&raid1([Some(0), Some(0)])), before);
    }
}
