//! Where alerts go: stdout always, and as asked a program (`PROGRAM EVENT
//! ARRAY [COMPONENT]`, no shell, as mdadm runs it), mail through sendmail
//! (mdadm's mailed events and Subject) and syslog (facility daemon).
//!
//! A program or sendmail that fails is reported on stderr; one that hangs
//! past the time limit is killed with its process group. Neither stops the
//! monitor.

use super::tracker::Alert;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sinks {
    pub program: Option<PathBuf>,
    pub timeout: Duration,
    /// The address, and the sendmail that takes the message.
    pub mail: Option<(String, PathBuf)>,
    pub syslog: bool,
    pub hostname: String,
}

/// sendmail as mdadm runs it (`sendmail -t`): the first on PATH, else the
/// usual places.
pub fn find_sendmail() -> Option<PathBuf> {
    let on_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("sendmail"))
                .collect()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin/sendmail", "/usr/lib/sendmail"].map(PathBuf::from))
        .find(|p| is_executable(p))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Opens the connection to syslog, as the daemon facility.
pub fn open_syslog() {
    // SAFETY: the identity is a static C string, as openlog keeps the pointer.
    unsafe { libc::openlog(c"uraid".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
}

impl Sinks {
    /// Delivers one alert everywhere it should go. `control` is the
    /// array's control socket, given to the program in URAID_CONTROL;
    /// `mdstat` goes at the end of a mail, as mdadm appends /proc/mdstat.
    pub fn deliver(&self, alert: &Alert, control: Option<&Path>, mdstat: &str) {
        let message = alert.message();
        println!("{message}");
        let _ = std::io::stdout().flush();
        if let Some(program) = &self.program {
            let mut cmd = Command::new(program);
            cmd.arg(&alert.event).arg(&alert.array);
            if let Some(component) = &alert.component {
                cmd.arg(component);
            }
            if let Some(control) = control {
                cmd.env("URAID_CONTROL", control);
            }
            let what = format!("{} {} {}", program.display(), alert.event, alert.array);
            run(&mut cmd, None, self.timeout, &what);
        }
        if let Some((address, sendmail)) = &self.mail {
            if alert.is_mailed() {
                let mail = self.mail_text(alert, address, mdstat);
                let mut cmd = Command::new(sendmail);
                cmd.arg("-t");
                let what = format!("{} -t ({} to {address})", sendmail.display(), alert.event);
                run(&mut cmd, Some(mail.as_bytes()), self.timeout, &what);
            }
        }
        if self.syslog {
            if let Ok(text) = CString::new(message) {
                // SAFETY: a constant format with one C string argument.
                unsafe { libc::syslog(alert.priority(), c"%s".as_ptr(), text.as_ptr()) };
            }
        }
    }

    fn mail_text(&self, alert: &Alert, address: &str, mdstat: &str) -> String {
        let mut m = String::new();
        m.push_str("From: uraid monitoring <root>\n");
        m.push_str(&format!("To: {address}\n"));
        m.push_str(&format!(
            "Subject: {} event on {}:{}\n\n",
            alert.event, alert.array, self.hostname
        ));
        m.push_str("This is an automatically generated mail message.\n");
        m.push_str(&format!("{}\n", alert.message()));
        m.push_str("The uraid status currently contains the following:\n\n");
        m.push_str(mdstat);
        m
    }
}

/// Runs a command in a process group of its own, with `input` on stdin,
/// for at most `limit`; reports a failure on stderr.
fn run(cmd: &mut Command, input: Option<&[u8]>, limit: Duration, what: &str) {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("uraid: monitor: {what}: {e}");
            return;
        }
    };
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A writer that stops reading must not hold the monitor: the
        // pipe's buffer takes a mail, and an error is reported below.
        if let Err(e) = stdin.write_all(input) {
            eprintln!("uraid: monitor: {what}: {e}");
        }
    }
    match wait_limited(&mut child, limit) {
        Some(status) if status.success() => {}
        Some(status) => eprintln!("uraid: monitor: {what}: {status}"),
        None => {
            // SAFETY: kill(2) of the process group of our own child,
            // which is not reaped yet (its id cannot have been reused).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            eprintln!(
                "uraid: monitor: {what}: still running after {}s, killed",
                limit.as_secs_f64()
            );
        }
    }
}

fn wait_limited(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return None,
            Err(_) => return None,
        }
    }
}
