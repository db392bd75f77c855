//! dRAID's spec string, as ZFS writes it: `draidP[:Dd][:Cc][:Ss]`.
//!
//! P is the parity columns per group (1..=3), D the data columns per group
//! (default min(C−S−P, 8), as `zpool create` chooses), C the children and S
//! the distributed spares (default 0). C may come from elsewhere (uraid's
//! `--raid-devices`); given twice, the two must agree.

use super::Level;
use std::fmt;

/// ZFS's limits (`VDEV_DRAID_MAX_CHILDREN`, the spare limit of
/// `vdev_draid_init`).
pub const MAX_CHILDREN: usize = 255;
pub const MAX_SPARES: usize = 100;
/// ZFS's default data columns per group.
pub const DEFAULT_DATA: usize = 8;

/// A dRAID's shape, before it has members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraidSpec {
    pub parity: usize,
    pub data: usize,
    pub children: usize,
    pub spares: usize,
}

impl DraidSpec {
    /// Parses `text` (`draid2:8d:24c:1s`, `draid1`, ...); `raid_devices` is
    /// C when the string leaves it out. One line of error for each way the
    /// spec can be impossible.
    pub fn parse(text: &str, raid_devices: Option<usize>) -> Result<DraidSpec, String> {
        let mut parts = text.trim().split(':');
        let head = parts.next().unwrap_or_default();
        let parity = match head.strip_prefix("draid") {
            Some("") => 1,
            Some(p) => p
                .parse::<usize>()
                .ok()
                .filter(|p| (1..=3).contains(p))
                .ok_or_else(|| format!("dRAID parity must be 1, 2 or 3, got '{p}' in '{text}'"))?,
            None => {
                return Err(format!(
                    "'{text}' is not a dRAID spec (draidP[:Dd][:Cc][:Ss])"
                ))
            }
        };
        let (mut data, mut children, mut spares) = (None, None, None);
        for part in parts {
            let (number, kind) = part.split_at(part.len().saturating_sub(1));
            let value: usize = number.parse().map_err(|_| {
                format!("'{part}' in '{text}' is not a number followed by d, c or s")
            })?;
            let slot = match kind {
                "d" => &mut data,
                "c" => &mut children,
                "s" => &mut spares,
                _ => return Err(format!("'{part}' in '{text}' is not Nd, Nc or Ns")),
            };
            if slot.replace(value).is_some() {
                return Err(format!("'{part}' is given twice in '{text}'"));
            }
        }
        let children = match (children, raid_devices) {
            (Some(c), Some(n)) if c != n => {
                return Err(format!(
                    "'{text}' says {c} children but {n} raid devices are given"
                ))
            }
            (Some(c), _) | (None, Some(c)) => c,
            (None, None) => return Err(format!("'{text}' needs its children count (Nc)")),
        };
        let spares = spares.unwrap_or(0);
        let data = match data {
            Some(d) => d,
            None => children
                .checked_sub(spares + parity)
                .filter(|d| *d >= 1)
                .map(|d| d.min(DEFAULT_DATA))
                .ok_or_else(|| {
                    format!(
                        "'{text}': {children} children leave no data column beside {parity} parity and {spares} spares"
                    )
                })?,
        };
        let spec = DraidSpec {
            parity,
            data,
            children,
            spares,
        };
        spec.check()?;
        Ok(spec)
    }

    /// Refuses shapes that cannot be laid out.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=3).contains(&self.parity) {
            return Err(format!(
                "dRAID parity must be 1, 2 or 3, got {}",
                self.parity
            ));
        }
        if self.data == 0 {
            return Err("a dRAID group needs at least one data column (0d)".into());
        }
        if !(2..=MAX_CHILDREN).contains(&self.children) {
            return Err(format!(
                "a dRAID has 2 to {MAX_CHILDREN} children, got {}",
                self.children
            ));
        }
        if self.spares > MAX_SPARES {
            return Err(format!(
                "a dRAID has at most {MAX_SPARES} distributed spares, got {}",
                self.spares
            ));
        }
        if self.data + self.parity + self.spares > self.children {
            return Err(format!(
                "{self}: a group of {} data + {} parity columns does not fit in {} children less {} spares",
                self.data, self.parity, self.children, self.spares
            ));
        }
        Ok(())
    }

    pub fn level(&self) -> Level {
        match self.parity {
            1 => Level::Draid1,
            2 => Level::Draid2,
            _ => Level::Draid3,
        }
    }

    /// The superblock's layout word (docs/DRAID-FORMAT.md): D in bits 0-7,
    /// S in bits 8-15.
    pub fn layout_word(&self) -> u32 {
        assert!(self.data < 256 && self.spares < 256);
        self.data as u32 | (self.spares as u32) << 8
    }

    /// The spec of a layout word, for `children` children of `level`.
    pub fn from_layout(level: Level, layout: u32, children: usize) -> Option<DraidSpec> {
        if !level.is_draid() || layout >> 16 != 0 {
            return None;
        }
        let spec = DraidSpec {
            parity: level.parity_members(),
            data: (layout & 0xff) as usize,
            children,
            spares: ((layout >> 8) & 0xff) as usize,
        };
        spec.check().ok().map(|()| spec)
    }
}

impl fmt::Display for DraidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "draid{}:{}d:{}c:{}s",
            self.parity, self.data, self.children, self.spares
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_zfs_spec_strings() {
        let spec = DraidSpec::parse("draid2:8d:24c:1s", None).unwrap();
        assert_eq!(
            (spec.parity, spec.data, spec.children, spec.spares),
            (2, 8, 24, 1)
        );
        assert_eq!(spec.to_string(), "draid2:8d:24c:1s");
        // C from --raid-devices, D by ZFS's default.
        let spec = DraidSpec::parse("draid1:2s", Some(11)).unwrap();
        assert_eq!(
            (spec.parity, spec.data, spec.children, spec.spares),
            (1, 8, 11, 2)
        );
        let spec = DraidSpec::parse("draid", Some(5)).unwrap();
        assert_eq!((spec.parity, spec.data), (1, 4));
        let spec = DraidSpec::parse("draid3:4d:1s", Some(12)).unwrap();
        assert_eq!(spec.level(), Level::Draid3);
        assert_eq!(
            DraidSpec::from_layout(Level::Draid3, spec.layout_word(), 12),
            Some(spec)
        );
    }

    #[test]
    fn refuses_impossible_specs_with_one_line() {
        for (text, devices, words) in [
            ("draid4:2d", Some(10), "parity must be 1, 2 or 3"),
            ("draid2:8d:10c:1s", None, "does not fit"),
            ("draid1:8d:12c", Some(10), "says 12 children but 10"),
            ("draid1:0d", Some(4), "at least one data column"),
            ("draid2:1d:1c", None, "2 to 255 children"),
            ("draid1:1d:300c", None, "2 to 255 children"),
            ("draid1:1d:200c:101s", None, "at most 100"),
            ("draid2:xd", Some(8), "not a number"),
            ("draid2:8q", Some(8), "not Nd, Nc or Ns"),
            ("draid2:8d:4d", Some(20), "given twice"),
            ("draid2", None, "needs its children count"),
            ("draid2:2s", Some(4), "leave no data column"),
            ("raid6", Some(4), "not a dRAID spec"),
        ] {
            let error = DraidSpec::parse(text, devices).unwrap_err();
            assert!(error.contains(words), "{text}: {error}");
            assert!(!error.contains('\n'), "{text}: {error}");
        }
    }
}
