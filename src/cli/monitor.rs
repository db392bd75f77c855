//! `uraid monitor`: mdadm --monitor's options, checked, then `monitor::run`.

use super::CliResult;
use crate::monitor::{self, alert, Arrays, Options};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct MonitorArgs {
    /// Follow every served array, as they come and go.
    #[arg(long, short = 's')]
    scan: bool,
    /// Follow the arrays of these control sockets.
    #[arg(long, num_args = 1.., value_name = "SOCKET")]
    control: Vec<PathBuf>,
    /// Run PROGRAM EVENT ARRAY [COMPONENT] for every event (no shell).
    #[arg(long, short = 'p', alias = "alert", value_name = "PROGRAM")]
    program: Option<PathBuf>,
    /// How long PROGRAM (or sendmail) may run before it is killed, seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    program_timeout: f64,
    /// Mail Fail, FailSpare, DegradedArray, SparesMissing and TestMessage
    /// events to ADDR through sendmail -t.
    #[arg(long, short = 'm', value_name = "ADDR")]
    mail: Option<String>,
    /// Log every event to syslog (facility daemon).
    #[arg(long, short = 'y')]
    syslog: bool,
    /// Check once and exit (for a daily timer).
    #[arg(long, short = '1')]
    oneshot: bool,
    /// A TestMessage event for every array at start.
    #[arg(long, short = 't')]
    test: bool,
    /// Seconds between passes (an event ends the wait early); default
    /// the config's MONITORDELAY, else 60.
    #[arg(long, short = 'd', value_name = "SECONDS")]
    delay: Option<u64>,
    /// The config file whose PROGRAM, MAILADDR and MONITORDELAY apply where
    /// the command line gives none (default /etc/uraid/uraid.conf).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// RebuildNN events each time progress crosses a multiple of N percent.
    #[arg(long, short = 'r', default_value_t = 20, value_name = "N")]
    increment: u32,
    /// Serve Prometheus metrics of the arrays followed on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<String>,
}

pub fn run(args: &MonitorArgs) -> CliResult {
    // As mdadm: the command line first, then the config's lines.
    let config = crate::config::Config::load_or_default(args.config.as_deref())
        .map_err(|e| e.to_string())?;
    let program = args
        .program
        .clone()
        .or_else(|| config.program.as_ref().map(PathBuf::from));
    let mail_addr = args.mail.clone().or_else(|| config.mail_addr.clone());
    let delay = args.delay.or(config.monitor_delay).unwrap_or(60);
    let arrays = match (args.scan, args.control.is_empty()) {
        (true, false) => return Err("give --scan or --control SOCKET..., not both".into()),
        (false, true) => {
            return Err("monitor needs --scan or the arrays' --control SOCKET...".into())
        }
        (true, true) => Arrays::Scan,
        (false, false) => Arrays::Sockets(args.control.clone()),
    };
    if args.scan && program.is_none() && mail_addr.is_none() && !args.syslog {
        return Err("No mail address or alert command - not monitoring.".into());
    }
    if !(1..=99).contains(&args.increment) {
        return Err(format!(
            "--increment {}: give a whole percent from 1 to 99",
            args.increment
        ));
    }
    if delay == 0 {
        return Err("--delay 0: give at least one second".into());
    }
    if !(args.program_timeout.is_finite() && args.program_timeout > 0.0) {
        return Err(format!(
            "--program-timeout {}: give a positive number of seconds",
            args.program_timeout
        ));
    }
    if let Some(program) = &program {
        if !alert::is_executable(program) {
            return Err(format!(
                "--program {}: not an executable file",
                program.display()
            ));
        }
    }
    let mail = match &mail_addr {
        Some(address) => {
            if address.trim().is_empty() || address.contains(['\n', '\r']) {
                return Err(format!("--mail {address:?}: not a mail address"));
            }
            let sendmail = alert::find_sendmail().ok_or(
                "--mail: no sendmail found (on PATH, /usr/sbin/sendmail, /usr/lib/sendmail)",
            )?;
            Some((address.clone(), sendmail))
        }
        None => None,
    };
    monitor::run(Options {
        arrays,
        sinks: alert::Sinks {
            program,
            timeout: Duration::from_secs_f64(args.program_timeout),
            mail,
            syslog: args.syslog,
            hostname: crate::text::hostname(),
        },
        oneshot: args.oneshot,
        test: args.test,
        delay: Duration::from_secs(delay),
        increment: args.increment,
        metrics: args.metrics.clone(),
        spares_wanted: config
            .arrays
            .iter()
            .filter_map(|a| Some((a.uuid.clone()?, a.spares?)))
            .collect(),
    })
}
