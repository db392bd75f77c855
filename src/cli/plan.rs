//! `uraid plan`: the rebuild planner's front. Reads the members (a size and
//! a speed, or a device model), the layout asked for and the assumptions,
//! and prints the layouts side by side, or as JSON.

use super::CliResult;
use crate::member::{model_names, DeviceModel};
use crate::plan::{self, Assumptions, LayoutPlan, Members, Plan, Scheme};
use std::fmt::Write;

/// Every value is taken as text and read here, so that a bad one is
/// refused in one line naming it.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The layout to plan: raid1, raid5, raid6, raid10 or a dRAID spec
    /// `draidP[:Dd][:Cc][:Ss]` (C defaults to --raid-devices). Without it,
    /// only the comparison is shown.
    #[arg(long)]
    level: Option<String>,
    /// Members in the array (children, for dRAID).
    #[arg(long, value_name = "N")]
    raid_devices: String,
    /// Chunk size (md rounds each member of a striped level down to whole chunks).
    #[arg(long, value_name = "SIZE")]
    chunk: Option<String>,
    /// Bytes per member: 16TB (decimal, as data sheets), 14.5T or 14TiB (binary).
    #[arg(long, value_name = "SIZE")]
    member_size: Option<String>,
    /// Streaming bandwidth of a member, reads and writes alike: 250MB/s, 200M.
    #[arg(long, value_name = "RATE")]
    member_speed: Option<String>,
    /// A named drive (hdd-14t, hdd-16t, hdd-4t, ssd-sata, nvme): its size, and
    /// its mean bandwidth over the span the array uses.
    #[arg(long, value_name = "MODEL")]
    device_model: Option<String>,
    /// The engine's rebuild rate over the disks' streaming rate, 0 < F <= 1.
    #[arg(long, value_name = "F")]
    efficiency: Option<String>,
    /// dRAID's busiest survivor over the average survivor (>= 1).
    #[arg(long, value_name = "F")]
    imbalance: Option<String>,
    /// Annual failure rate of a member: 1.5% or 0.015.
    #[arg(long, value_name = "RATE")]
    afr: Option<String>,
    /// Unrecoverable read errors per bit read (default: the model's, else 1e-15).
    #[arg(long, value_name = "PER_BIT")]
    ure: Option<String>,
    /// The plan as JSON: members, assumptions, and per layout level,
    /// rebuild_seconds, rebalance_seconds, capacity_bytes, p_data_loss, ...
    #[arg(long)]
    json: bool,
}

/// A size: a number (decimals allowed) with a suffix. K, M, G, T, P and
/// KiB..PiB are powers of 1024, as everywhere in uraid; KB..PB are powers
/// of 1000, as drive data sheets give them. A bare number is bytes.
pub fn parse_size(what: &str, text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let suffix = suffix.trim();
    let power = |letter: char| "KMGTP".find(letter).map(|i| i as i32 + 1);
    let scale = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => Some(1.0),
        s => {
            let mut chars = s.chars();
            let p = chars.next().and_then(power);
            match (p, chars.as_str()) {
                (Some(p), "" | "IB") => Some(1024f64.powi(p)),
                (Some(p), "B") => Some(1000f64.powi(p)),
                _ => None,
            }
        }
    };
    let value: Option<f64> = number.parse().ok();
    match (value, scale) {
        (Some(v), Some(scale)) if v.is_finite() && v > 0.0 => Ok(v * scale),
        (Some(_), Some(_)) => Err(format!("{what} '{text}' must be above zero")),
        _ => Err(format!(
            "{what} '{text}' is not a number with an optional suffix (K, M, G, T, P; KB.. decimal)"
        )),
    }
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let t = text.trim();
    parse_size("member speed", t.strip_suffix("/s").unwrap_or(t))
}

fn parse_number(what: &str, text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (digits, scale) = match t.strip_suffix('%') {
        Some(percent) => (percent, 0.01),
        None => (t, 1.0),
    };
    match digits.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v * scale),
        _ => Err(format!("{what} '{text}' is not a number")),
    }
}

fn members(args: &PlanArgs, devices: u32) -> Result<Members, String> {
    let size = args
        .member_size
        .as_deref()
        .map(|s| parse_size("member size", s).map(|b| b as u64))
        .transpose()?;
    match (&args.device_model, &args.member_speed, size) {
        (Some(_), Some(_), _) => {
            Err("give --device-model or --member-speed, not both: a model sets the speed".into())
        }
        (Some(name), None, size) => Members::of_model(devices, &DeviceModel::by_name(name)?, size),
        (None, Some(speed), Some(size)) => Ok(Members::flat(devices, size, parse_rate(speed)?)),
        (None, _, _) => Err(format!(
            "give --member-size and --member-speed, or --device-model ({})",
            model_names()
        )),
    }
}

fn build(args: &PlanArgs) -> Result<Plan, String> {
    let devices: u32 = args
        .raid_devices
        .trim()
        .parse()
        .ok()
        .filter(|n| (2..=255).contains(n))
        .ok_or_else(|| {
            format!(
                "--raid-devices '{}' is not a whole number from 2 to 255",
                args.raid_devices
            )
        })?;
    let requested = args
        .level
        .as_deref()
        .map(|l| Scheme::parse(l, devices))
        .transpose()?;
    let chunk = match &args.chunk {
        Some(text) => crate::units::parse_size_bytes(text)?,
        None => plan::DEFAULT_CHUNK_BYTES,
    };
    // A drive's own data sheet rate when a model is named: flash is read
    // back a hundred times more reliably than a nearline disk.
    let default_ure = match &args.device_model {
        Some(name) => DeviceModel::by_name(name)?.ure_per_bit,
        None => plan::DEFAULT_URE_PER_BIT,
    };
    let number = |what: &str, text: &Option<String>, default: f64| {
        text.as_deref()
            .map_or(Ok(default), |t| parse_number(what, t))
    };
    let assumptions = Assumptions::new(
        number("efficiency", &args.efficiency, 1.0)?,
        number("imbalance", &args.imbalance, plan::DEFAULT_IMBALANCE)?,
        number("annual failure rate", &args.afr, plan::DEFAULT_AFR)?,
        number("read error rate", &args.ure, default_ure)?,
        chunk,
    );
    assumptions.check()?;
    let members = members(args, devices)?;
    Ok(plan::plan_all(requested, members, assumptions))
}

pub fn run(args: &PlanArgs) -> CliResult {
    let plan = build(args)?;
    let out = if args.json {
        serde_json::to_string_pretty(&plan).map_err(|e| e.to_string())? + "\n"
    } else {
        text(&plan)
    };
    print!("{out}");
    Ok(())
}

/// Bytes in decimal units, as drives are sold.
fn decimal(bytes: f64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1000.0 && unit < units.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", units[unit])
}

fn duration(seconds: f64) -> String {
    if seconds <= 0.0 {
        "-".into()
    } else if seconds < 3600.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

fn row(o: &mut String, l: &LayoutPlan) {
    let _ = writeln!(
        o,
        "{} {:<22} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        if l.requested { "*" } else { " " },
        l.level,
        decimal(l.capacity_bytes as f64),
        l.failures_tolerated,
        duration(l.rebuild_seconds),
        duration(l.reduced_redundancy_seconds),
        duration(l.zero_redundancy_seconds),
        duration(l.zero_redundancy_at_tolerance_seconds),
        duration(l.rebalance_seconds),
        format!("{:.1e}", l.p_data_loss),
    );
}

fn text(plan: &Plan) -> String {
    let m = &plan.members;
    let a = &plan.assumptions;
    let mut o = String::new();
    let source = m
        .device_model
        .as_deref()
        .map(|name| format!(" ({name})"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "{} members of {}{source}, one pass {} at {:.0} MB/s mean; one member failed:\n",
        m.raid_devices,
        decimal(m.member_bytes as f64),
        duration(m.pass_seconds),
        m.mean_bytes_per_s / 1e6
    );
    let _ = writeln!(
        o,
        "  {:<22} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "layout",
        "usable",
        "tolerates",
        "rebuild",
        "degraded",
        "zero-red.",
        "at most",
        "rebalance",
        "P(loss)"
    );
    for layout in &plan.layouts {
        row(&mut o, layout);
    }
    let _ = writeln!(
        o,
        "\n(* the layout asked for; degraded: time with one failure's redundancy \
         missing; zero-red.: of it, with none left; at most: with none left when \
         as many fail as the layout tolerates, the rows that hold them all rebuilt \
         first; P(loss): of losing data before the rebuild ends)\n\nAssumptions: \
         efficiency {}, dRAID imbalance {} or the maps' own over members of few slices, annual failure rate {}%, unrecoverable read \
         errors {:e} per bit, chunk {} KiB.",
        a.efficiency,
        a.imbalance,
        a.afr * 100.0,
        a.ure_per_bit,
        a.chunk_bytes >> 10
    );
    for note in &a.notes {
        let _ = writeln!(o, "  - {note}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_read_both_unit_systems() {
        assert_eq!(parse_size("s", "16TB").unwrap(), 16e12);
        assert_eq!(parse_size("s", "16T").unwrap(), 16.0 * 1024f64.powi(4));
        assert_eq!(parse_size("s", "1.5TiB").unwrap(), 1.5 * 1024f64.powi(4));
        assert_eq!(parse_size("s", "4096").unwrap(), 4096.0);
        assert_eq!(parse_rate("250MB/s").unwrap(), 250e6);
        assert_eq!(parse_rate("200M").unwrap(), 200.0 * 1048576.0);
        assert_eq!(parse_number("afr", "1.5%").unwrap(), 0.015);
        assert_eq!(parse_number("ure", "1e-15").unwrap(), 1e-15);
        for bad in ["", "abc", "0", "-1T", "16XB", "16TBs", "1.2.3T"] {
            let err = parse_size("member size", bad).unwrap_err();
            assert!(err.starts_with("member size '"), "{err}");
        }
        assert!(parse_number("afr", "x%").is_err());
    }
}
