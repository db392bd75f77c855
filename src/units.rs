//! Units and size parsing shared by every layer.
//!
//! Sizes inside uraid are plain integers whose names carry their unit
//! (`_sectors`, `_bytes`, `_kib`). A sector is always 512 bytes, as in md,
//! whatever the logical block size of the member.

/// Bytes in one md sector.
pub const SECTOR_BYTES: u64 = 512;

/// Parses a size as mdadm does: a number with an optional K, M, G or T
/// suffix (powers of 1024). A bare number is taken as KiB, like mdadm's
/// `--chunk` and `--size`. Returns bytes.
pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, multiplier_kib) = match text.chars().last() {
        Some('K') | Some('k') => (&text[..text.len() - 1], 1u64),
        Some('M') | Some('m') => (&text[..text.len() - 1], 1024),
        Some('G') | Some('g') => (&text[..text.len() - 1], 1024 * 1024),
        Some('T') | Some('t') => (&text[..text.len() - 1], 1024 * 1024 * 1024),
        _ => (text, 1),
    };
    let value: u64 = digits.parse().map_err(|_| {
        format!("invalid size '{text}': expected a number with an optional K, M, G or T suffix")
    })?;
    value
        .checked_mul(multiplier_kib * 1024)
        .ok_or_else(|| format!("size '{text}' is too large"))
}

/// A duration for messages: "30 s", or "0.250 s" below whole seconds.
pub fn duration_text(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

/// Formats bytes the way mdadm prints sizes in --examine/--detail
/// ("62.00 MiB 65.01 MB"), with mdadm's rounding to hundredths: binary and
/// decimal units side by side, MiB below 2 GiB, GiB below 2 TiB, else TiB.
pub fn human_size(bytes: u64) -> String {
    let b = bytes as u128;
    let (binary, decimal, unit_bin, unit_dec) = if b < 2 << 30 {
        (
            (b * 200 / (1 << 20)).div_ceil(2),
            (b / (1_000_000 / 200)).div_ceil(2),
            "MiB",
            "MB",
        )
    } else if b < 2 << 40 {
        (
            (b * 200 / (1 << 30)).div_ceil(2),
            (b / (1_000_000_000 / 200)).div_ceil(2),
            "GiB",
            "GB",
        )
    } else {
        (
            (b * 200 / (1 << 40)).div_ceil(2),
            (b / (1_000_000_000_000 / 200)).div_ceil(2),
            "TiB",
            "TB",
        )
    };
    format!(
        "{}.{:02} {unit_bin} {}.{:02} {unit_dec}",
        binary / 100,
        binary % 100,
        decimal / 100,
        decimal % 100
    )
}

/// A byte count with an optional K, M, G or T suffix (powers of 1024) or `s`
/// for 512-byte sectors. Unlike mdadm's `--size`, a bare number is bytes:
/// fault offsets are copied from error messages, which give bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let multiplier: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "s" => 512,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => {
            return Err(format!(
                "size '{text}' is not a number with an optional K, M, G, T or s (sectors) suffix"
            ))
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("size '{text}' is not a number"))?;
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size '{text}' is too large"))
}

/// Formats bytes with the largest suffix that divides them exactly, so that
/// `parse_bytes` reads back the same number.
pub fn format_bytes(bytes: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A duration with a unit (`us`, `ms`, `s`, `m`); decimals are allowed
/// (`1.5s`). Returns microseconds.
pub fn parse_duration_us(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_us: f64 = match unit {
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" | "min" => 60e6,
        "" => return Err(format!("duration '{text}' needs a unit: us, ms, s or m")),
        _ => {
            return Err(format!(
                "duration '{text}' has an unknown unit (us, ms, s or m)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("duration '{text}' is not a number"))?;
    let us = (value * unit_us).round();
    if !(0.0..=u64::MAX as f64 / 2.0).contains(&us) {
        return Err(format!("duration '{text}' is too long"));
    }
    Ok(us as u64)
}

/// Formats microseconds in the largest unit that divides them exactly.
pub fn format_us(us: u64) -> String {
    if us == 0 {
        "0ms".to_string()
    } else if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_mdadm() {
        assert_eq!(parse_size_bytes("512K").unwrap(), 512 * 1024);
        assert_eq!(parse_size_bytes("64").unwrap(), 64 * 1024);
        assert_eq!(parse_size_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size_bytes("2G").unwrap(), 2 << 30);
        assert!(parse_size_bytes("12Q").is_err());
        assert!(parse_size_bytes("").is_err());
        // Figures from a real mdadm --examine of a 64 MiB member.
        assert_eq!(human_size(126976 * 512), "62.00 MiB 65.01 MB");
        assert_eq!(human_size(126976 * 1024), "124.00 MiB 130.02 MB");
    }
}
