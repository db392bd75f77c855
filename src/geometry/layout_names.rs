//! mdadm's names for levels and layouts (maps.c, util.c parse_layout_10), so
//! that uraid accepts and prints exactly what mdadm does.

use super::raid456::*;
use super::Level;

const LEVEL_NAMES: &[(&str, Level)] = &[
    ("linear", Level::Linear),
    ("-1", Level::Linear),
    ("raid0", Level::Raid0),
    ("0", Level::Raid0),
    ("stripe", Level::Raid0),
    ("raid1", Level::Raid1),
    ("1", Level::Raid1),
    ("mirror", Level::Raid1),
    ("raid4", Level::Raid4),
    ("4", Level::Raid4),
    ("raid5", Level::Raid5),
    ("5", Level::Raid5),
    ("raid6", Level::Raid6),
    ("6", Level::Raid6),
    ("raid10", Level::Raid10),
    ("10", Level::Raid10),
    ("draid1", Level::Draid1),
    ("draid2", Level::Draid2),
    ("draid3", Level::Draid3),
];

pub fn level_from_name(name: &str) -> Option<Level> {
    let lower = name.to_ascii_lowercase();
    LEVEL_NAMES
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(_, l)| *l)
}

pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Linear => "linear",
        Level::Raid0 => "raid0",
        Level::Raid1 => "raid1",
        Level::Raid4 => "raid4",
        Level::Raid5 => "raid5",
        Level::Raid6 => "raid6",
        Level::Raid10 => "raid10",
        Level::Draid1 => "draid1",
        Level::Draid2 => "draid2",
        Level::Draid3 => "draid3",
    }
}

/// raid5/6 names, in mdadm's order; the first name for a number is the one printed.
const R5_NAMES: &[(&str, u32)] = &[
    ("left-asymmetric", LEFT_ASYMMETRIC),
    ("right-asymmetric", RIGHT_ASYMMETRIC),
    ("left-symmetric", LEFT_SYMMETRIC),
    ("right-symmetric", RIGHT_SYMMETRIC),
    ("default", LEFT_SYMMETRIC),
    ("la", LEFT_ASYMMETRIC),
    ("ra", RIGHT_ASYMMETRIC),
    ("ls", LEFT_SYMMETRIC),
    ("rs", RIGHT_SYMMETRIC),
    ("parity-first", PARITY_0),
    ("parity-last", PARITY_N),
];

const R6_EXTRA_NAMES: &[(&str, u32)] = &[
    ("ddf-zero-restart", ROTATING_ZERO_RESTART),
    ("ddf-N-restart", ROTATING_N_RESTART),
    ("ddf-N-continue", ROTATING_N_CONTINUE),
    ("left-asymmetric-6", LEFT_ASYMMETRIC_6),
    ("right-asymmetric-6", RIGHT_ASYMMETRIC_6),
    ("left-symmetric-6", LEFT_SYMMETRIC_6),
    ("right-symmetric-6", RIGHT_SYMMETRIC_6),
    ("parity-first-6", PARITY_0_6),
];

/// For raid5, mdadm accepts the DDF names as aliases of plain raid5 layouts.
const R5_DDF_ALIASES: &[(&str, u32)] = &[
    ("ddf-zero-restart", RIGHT_ASYMMETRIC),
    ("ddf-N-restart", LEFT_ASYMMETRIC),
    ("ddf-N-continue", LEFT_SYMMETRIC),
];

/// The layout number mdadm would write for `name` at this level.
pub fn layout_from_name(level: Level, name: &str) -> Option<u32> {
    let find = |table: &[(&str, u32)]| table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    match level {
        Level::Raid5 => find(R5_NAMES).or_else(|| find(R5_DDF_ALIASES)),
        Level::Raid4 => match name {
            "default" => Some(0),
            "parity-last" => Some(PARITY_N),
            _ => None,
        },
        Level::Raid6 => find(R5_NAMES).or_else(|| find(R6_EXTRA_NAMES)),
        Level::Raid10 => raid10_layout_from_name(name),
        Level::Raid0 => match name {
            "original" | "1" => Some(1),
            "alternate" | "2" => Some(2),
            "dangerous" | "0" => Some(0),
            _ => None,
        },
        // dRAID's layout is the tail of ZFS's spec string, "8d:1s": data
        // columns per group and distributed spares (docs/DRAID-FORMAT.md).
        Level::Draid1 | Level::Draid2 | Level::Draid3 => {
            let (data, spares) = name.split_once(':')?;
            let data: u32 = data.strip_suffix('d')?.parse().ok()?;
            let spares: u32 = spares.strip_suffix('s')?.parse().ok()?;
            (data < 256 && spares < 256).then_some(data | spares << 8)
        }
        Level::Linear | Level::Raid1 => None,
    }
}

/// `nK`, `fK` and `oK`, as parse_layout_10 reads them.
fn raid10_layout_from_name(name: &str) -> Option<u32> {
    let mut chars = name.chars();
    let kind = chars.next()?;
    let copies: u32 = chars.as_str().parse().ok()?;
    if !(1..=255).contains(&copies) {
        return None;
    }
    match kind {
        'n' => Some(0x100 | copies),
        'f' => Some((copies << 8) | 1),
        'o' => Some(0x10000 | (copies << 8) | 1),
        _ => None,
    }
}

/// The layout as mdadm --examine prints it, or None when mdadm prints no layout.
pub fn layout_name(level: Level, layout: u32) -> Option<String> {
    match level {
        Level::Raid5 | Level::Raid6 => {
            let table: Vec<&(&str, u32)> = R5_NAMES.iter().chain(R6_EXTRA_NAMES.iter()).collect();
            Some(
                table
                    .iter()
                    .find(|(_, v)| *v == layout)
                    .map(|(n, _)| n.to_string())
                    .unwrap_or_else(|| "-unknown-".to_string()),
            )
        }
        Level::Raid10 => {
            let near = layout & 0xff;
            let far = (layout >> 8) & 0xff;
            let offset = layout & 0x10000 != 0;
            let mut text = String::new();
            if near > 1 {
                text.push_str(&format!("near={near}"));
            }
            if far > 1 {
                if !text.is_empty() {
                    text.push_str(", ");
                }
                text.push_str(&format!("{}={far}", if offset { "offset" } else { "far" }));
            }
            Some(text)
        }
        Level::Raid0 => match layout {
            1 => Some("original".into()),
            2 => Some("alternate".into()),
            _ => None,
        },
        Level::Draid1 | Level::Draid2 | Level::Draid3 => {
            Some(format!("{}d:{}s", layout & 0xff, (layout >> 8) & 0xff))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (name, value) in R5_NAMES.iter().take(4).chain(R6_EXTRA_NAMES) {
            assert_eq!(layout_from_name(Level::Raid6, name), Some(*value));
            assert_eq!(layout_name(Level::Raid6, *value).as_deref(), Some(*name));
        }
        assert_eq!(layout_from_name(Level::Raid10, "n2"), Some(0x102));
        assert_eq!(layout_from_name(Level::Raid10, "f2"), Some(0x201));
        assert_eq!(layout_from_name(Level::Raid10, "o2"), Some(0x10201));
        assert_eq!(layout_name(Level::Raid10, 0x102).as_deref(), Some("near=2"));
        assert_eq!(
            layout_name(Level::Raid10, 0x10201).as_deref(),
            Some("offset=2")
        );
        assert_eq!(
            layout_from_name(Level::Raid5, "ddf-N-continue"),
            Some(LEFT_SYMMETRIC)
        );
        assert_eq!(level_from_name("RAID6"), Some(Level::Raid6));
        assert_eq!(layout_from_name(Level::Raid6, "nonsense"), None);
    }
}
