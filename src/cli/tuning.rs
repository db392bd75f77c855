//! The seeds' knobs on the command line, shared by `create` (saved with
//! the array), `serve` (for this run) and `manage` (live, and saved).

use crate::engine::tuning::{saved, split_setting, TuningValues, WritePolicy, KNOBS};

#[derive(clap::Args, Debug, Default, Clone)]
pub struct TuningArgs {
    /// Stripe cache entries, 17..32768 (md's stripe_cache_size; default 256).
    #[arg(long, value_name = "ENTRIES")]
    pub stripe_cache_size: Option<String>,
    /// Read-ahead on sequential reads, in 512-byte sectors (as `blockdev --setra`; 0 = off).
    #[arg(long, value_name = "SECTORS")]
    pub read_ahead: Option<String>,
    /// Largest I/O sent to a member, KiB (the block layer's max_sectors_kb).
    #[arg(long, value_name = "KIB")]
    pub max_sectors_kb: Option<String>,
    /// write-through (ack when on the members) or write-back (ack from cache; needs --i-accept-data-loss).
    #[arg(long, value_name = "POLICY")]
    pub write_policy: Option<String>,
    /// Keep data read in the stripe cache for later reads (small random reads on the fast path bypass it): on or off.
    #[arg(long, value_name = "on|off")]
    pub read_cache: Option<String>,
    /// Send small random reads straight to their member (over NBD, on the connection's io_uring): on or off.
    #[arg(long, value_name = "on|off")]
    pub fast_path: Option<String>,
    /// 0: never read-modify-write; 1: when it saves reads (default); 2: also on ties.
    #[arg(long, value_name = "0|1|2")]
    pub rmw_level: Option<String>,
    /// Stripe worker threads doing the parity work of writes, as md's
    /// group_thread_cnt (0 = each write's own thread does it).
    #[arg(long, value_name = "N")]
    pub group_thread_cnt: Option<String>,
    /// Pace rebuild, resync, check, repair and reshape by the clients'
    /// p99 request latency: as fast as it stays at or under MS
    /// milliseconds (off or 0: md's speed limits alone).
    #[arg(long, value_name = "MS")]
    pub rebuild_latency_target: Option<String>,
    /// Any knob as KEY=VALUE (repeatable); `--set help` lists them.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Allow write-back without a journal: writes acknowledged from memory are lost in a crash.
    #[arg(long)]
    pub i_accept_data_loss: bool,
}

impl TuningArgs {
    /// The settings given, as (key, value) in a fixed order, each checked
    /// against `base` so that a bad one is refused before anything changes;
    /// `journaled` says the array has a write journal, which protects
    /// write-back as --i-accept-data-loss consents to its risk.
    pub fn settings(
        &self,
        base: &TuningValues,
        journaled: bool,
    ) -> Result<Vec<(String, String)>, String> {
        let out = self.pairs()?;
        let mut check = *base;
        for (k, v) in &out {
            check.set(k, v, self.i_accept_data_loss || journaled)?;
        }
        Ok(out)
    }

    /// The settings given, unchecked.
    pub fn pairs(&self) -> Result<Vec<(String, String)>, String> {
        let named = [
            ("stripe_cache_size", &self.stripe_cache_size),
            ("read_ahead", &self.read_ahead),
            ("max_sectors_kb", &self.max_sectors_kb),
            ("write_policy", &self.write_policy),
            ("read_cache", &self.read_cache),
            ("fast_path", &self.fast_path),
            ("rmw_level", &self.rmw_level),
            ("group_thread_cnt", &self.group_thread_cnt),
            ("rebuild_latency_target", &self.rebuild_latency_target),
        ];
        let mut out: Vec<(String, String)> = named
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), v.clone())))
            .collect();
        for text in &self.set {
            let (k, v) = split_setting(text)?;
            out.push((k.to_string(), v.to_string()));
        }
        // Two values for one knob would leave the one in force to the
        // order of the flags: refused rather than guessed.
        for (i, (k, v)) in out.iter().enumerate() {
            if let Some((_, w)) = out[..i].iter().find(|(old, _)| old == k) {
                return Err(format!("{k} given twice ({w} and {v})"));
            }
        }
        Ok(out)
    }

    /// Whether any knob was given.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.pairs().is_ok_and(|p| p.is_empty())
    }
}

/// Says, at a start, that write-back without a journal is in force: saved
/// with the array, it would otherwise go on silently run after run, long
/// after the --i-accept-data-loss that allowed it was forgotten.
pub fn warn_unjournaled_write_back(values: &TuningValues, journaled: bool) {
    if values.write_policy == WritePolicy::WriteBack && !journaled {
        eprintln!(
            "uraid: WARNING: write-back without a write journal: writes acknowledged from \
             memory are lost in a crash (turn it off with `uraid manage --control SOCK \
             --write-policy write-through`, which is saved, or serve --write-policy write-through)"
        );
    }
}

/// Lists the knobs (`--set help`).
pub fn print_help() -> super::CliResult {
    for (key, meaning) in KNOBS {
        println!("{key:18} {meaning}");
    }
    Ok(())
}

/// The values an array starts with: md's defaults, then its saved
/// settings, then what `serve` was given for this run.
pub fn values_for_serve(
    uuid: &str,
    defaults: TuningValues,
    args: &TuningArgs,
    journaled: bool,
) -> Result<(TuningValues, bool), String> {
    values_for_serve_with(uuid, defaults, &[], args, journaled)
}

/// [`values_for_serve`] with the knobs of the config's SYSFS lines for the
/// array between its saved settings and this run's options (mdadm writes
/// SYSFS values after assembly, over what the array had; the command line
/// is the latest word).
pub fn values_for_serve_with(
    uuid: &str,
    defaults: TuningValues,
    config: &[(String, String)],
    args: &TuningArgs,
    journaled: bool,
) -> Result<(TuningValues, bool), String> {
    let stored = saved::load(uuid)?;
    let accept = stored.accept_data_loss || args.i_accept_data_loss;
    let given = args.pairs()?;
    let (mut values, warnings) = saved::apply(defaults, &stored, accept || journaled)?;
    // A saved write policy that this run sets anew needs no warning.
    if !given
        .iter()
        .chain(config.iter())
        .any(|(k, _)| k == "write_policy")
    {
        for warning in warnings {
            eprintln!("uraid: {warning}");
        }
    }
    for (k, v) in config {
        if given.iter().any(|(g, _)| g == k) {
            continue;
        }
        values
            .set(k, v, accept || journaled)
            .map_err(|e| format!("SYSFS {k}={v}: {e}"))?;
    }
    for (k, v) in given {
        values.set(&k, &v, accept || journaled)?;
    }
    Ok((values, accept))
}
