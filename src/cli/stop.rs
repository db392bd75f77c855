//! `uraid stop`: mdadm --stop for a served array. The server is asked over
//! its control socket to stop as SIGTERM stops it, and the command returns
//! once that process has exited, so that whatever runs next (zeroing a
//! member, serving it elsewhere, a kernel assembly) finds it released.

use super::CliResult;
use crate::array::dspare::is_spare_name;
use crate::array::read_superblock;
use crate::control::{self, registry, Request};
use crate::member::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct StopArgs {
    /// The control socket of the `uraid serve` to stop.
    #[arg(long, conflicts_with = "array")]
    control: Option<PathBuf>,
    /// The served array to stop, by name (`data`, `host:data`,
    /// `/dev/md/data`) or UUID, as `uraid status` and `detail --scan` list
    /// them.
    #[arg(required_unless_present = "control")]
    array: Option<String>,
    /// Seconds to wait for the server to exit: it finishes in-flight I/O
    /// and writes the superblocks first.
    #[arg(long, value_name = "S", default_value_t = 60)]
    wait: u64,
}

/// How often the server's process is looked at while it stops.
const POLL: Duration = Duration::from_millis(50);

pub fn run(args: &StopArgs) -> CliResult {
    let socket = match (&args.control, &args.array) {
        (Some(socket), _) => socket.clone(),
        (None, Some(name)) => find_served(name)?.control,
        (None, None) => return Err("stop needs --control SOCKET or an array name".into()),
    };
    let status = control::request(&socket, &Request::Status)?;
    let label = registry::label_for(&status.name, &status.uuid);
    let pid = status.pid;
    if pid == 0 {
        return Err(format!(
            "{}: the server does not say its pid",
            socket.display()
        ));
    }
    // Taken before the request: a process that has exited leaves nothing
    // to read, and a new one under the same number starts later.
    let started = process_start(pid).ok_or_else(|| format!("pid {pid}: no such process"))?;
    let message = control::command(&socket, &Request::Stop)?;
    eprintln!("uraid: {label}: {message}");
    let limit = Duration::from_secs(args.wait);
    if !wait_for_exit(pid, started, limit) {
        return Err(format!(
            "{label}: pid {pid} has not exited after {} s: its stop goes on (its log says \
             where), wait for it or run uraid stop again",
            limit.as_secs()
        ));
    }
    // The server's own verdict goes to its log; what it left on the
    // members is read here, so that a stop that could not write them is
    // not reported as a clean one.
    if status.mdstat.contains("(read-only)") {
        eprintln!(
            "uraid: stopped {label}: pid {pid} has exited (served read-only: nothing written)"
        );
        return Ok(());
    }
    let not_clean = members_not_clean(&status.members);
    if !not_clean.is_empty() {
        return Err(format!(
            "{label}: pid {pid} has exited, but not every superblock is clean ({}): the \
             server's log says why",
            not_clean.join(", ")
        ));
    }
    eprintln!("uraid: stopped {label}: pid {pid} has exited, superblocks clean");
    Ok(())
}

/// The devices a stopped array held (failed ones aside) whose superblock
/// does not say clean, each with what it says instead.
fn members_not_clean(members: &[control::MemberStatus]) -> Vec<String> {
    let mut not_clean = Vec::new();
    for member in members {
        // A failed member is not written at the stop; a distributed spare
        // is space on the others, not a device.
        if member.state == "faulty" || is_spare_name(&member.path) {
            continue;
        }
        let read = crate::member::open(Path::new(&member.path), OpenOptions::default())
            .map_err(|e| e.to_string())
            .and_then(|m| read_superblock(&*m).map_err(|e| e.to_string()));
        let short = crate::member::short_name(&member.path);
        match read {
            Ok(Some(sb)) if sb.is_clean() => {}
            Ok(Some(_)) => not_clean.push(format!("{short}: active")),
            Ok(None) => not_clean.push(format!("{short}: no superblock")),
            Err(e) => not_clean.push(format!("{short}: unread: {e}")),
        }
    }
    not_clean
}

/// The one served array that `name` names: its short name, its full name,
/// /dev/md/<name>, or its UUID in any punctuation.
fn find_served(name: &str) -> Result<registry::Entry, String> {
    let digits = |text: &str| -> String {
        text.chars()
            .filter(char::is_ascii_hexdigit)
            .collect::<String>()
            .to_ascii_lowercase()
    };
    let wanted_uuid = digits(name);
    let matches: Vec<registry::Entry> = registry::list()
        .into_iter()
        .filter(|e| {
            e.label == name
                || e.name == name
                || e.md_device() == name
                || (wanted_uuid.len() == 32 && digits(&e.uuid) == wanted_uuid)
        })
        .collect();
    match matches.len() {
        0 => Err(format!(
            "{name}: no served array of that name or UUID (uraid status lists them)"
        )),
        1 => Ok(matches.into_iter().next().expect("one entry")),
        n => Err(format!(
            "{name}: {n} served arrays go by that name: give --control SOCKET or the UUID"
        )),
    }
}

/// Waits until the process `pid` that started at `started` is gone, for at
/// most `limit`. A zombie has exited: only its parent's wait is left.
fn wait_for_exit(pid: u32, started: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if process_start(pid) != Some(started) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// The start time (in clock ticks since boot) of the running process
/// `pid`, from /proc/PID/stat; None when there is none or it is a zombie.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces or ')': the
    // fields that follow start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is the state (field 3), fields[19] the start time (22).
    let state = *fields.first()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::process_start;

    #[test]
    fn this_process_has_a_start_and_a_free_number_has_none() {
        let me = process_start(std::process::id()).expect("this process runs");
        assert!(me > 0);
        assert_eq!(process_start(u32::MAX), None);
    }
}
