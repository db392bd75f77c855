//! The dRAID layout spec string, `draid[P][:Dd][:Cc][:Ss]`, as ZFS spells
//! it: P parity columns per group (1 to 3, default 1), D data columns per
//! group, C children, S distributed spares. Pure parsing and the arithmetic
//! that follows from the four numbers alone (group width, groups per slice,
//! usable capacity), so that the planner and the dRAID geometry can share
//! one reading of a spec.
//!
//! Defaults follow ZFS: S is 0, D is min(C − S − P, 8), and C may come from
//! the caller (the `--raid-devices` of the command) when the spec omits it.

use std::fmt;
use std::str::FromStr;

/// Most parity columns a group may have: three independent syndromes
/// (P, Q, R) are all that the 1, 2, 4 coefficients give.
pub const PARITY_MAX: u32 = 3;
/// Fewest and most children: ZFS's permutation maps cover 2..=255.
pub const CHILDREN_MIN: u32 = 2;
pub const CHILDREN_MAX: u32 = 255;
/// Most distributed spares.
pub const SPARES_MAX: u32 = 100;
/// Data columns per group when the spec does not say.
pub const DEFAULT_DATA: u32 = 8;
/// The height of one row on each child: a whole 16 MiB block fits even when
/// D is 1.
pub const ROW_BYTES: u64 = 16 << 20;
/// Space kept at the end of each child for a future expansion.
pub const RESERVE_BYTES: u64 = 32 << 20;

/// A validated dRAID layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DraidSpec {
    pub parity: u32,
    pub data: u32,
    pub children: u32,
    pub spares: u32,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl DraidSpec {
    /// Parses a spec; `children` stands in when the spec has no `:Cc`. The
    /// error is one line naming the spec.
    pub fn parse(text: &str, children: Option<u32>) -> Result<DraidSpec, String> {
        parse(text, children).map_err(|why| format!("invalid dRAID spec '{text}': {why}"))
    }

    /// Checks the four numbers against each other; one line saying what is
    /// wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=PARITY_MAX).contains(&self.parity) {
            return Err(format!("parity {} is not 1, 2 or 3", self.parity));
        }
        if !(CHILDREN_MIN..=CHILDREN_MAX).contains(&self.children) {
            return Err(format!(
                "{} children is outside {CHILDREN_MIN}..={CHILDREN_MAX}",
                self.children
            ));
        }
        if self.spares > SPARES_MAX {
            return Err(format!(
                "{} distributed spares is more than {SPARES_MAX}",
                self.spares
            ));
        }
        if self.data == 0 {
            return Err("a group needs at least 1 data column".into());
        }
        let width = self.data + self.parity;
        if width > self.children.saturating_sub(self.spares) {
            return Err(format!(
                "{}d + {}p = {width} columns do not fit in {} children less {} spares",
                self.data, self.parity, self.children, self.spares
            ));
        }
        Ok(())
    }

    /// Columns per redundancy group, W = D + P.
    pub fn group_width(&self) -> u32 {
        self.data + self.parity
    }

    /// Children that hold groups (the rest of each slice is spare space),
    /// N = C − S.
    pub fn ndisks(&self) -> u32 {
        self.children - self.spares
    }

    /// Groups per slice: the fewest whole groups that fill whole rows of N,
    /// LCM(W, N) / W.
    pub fn groups_per_slice(&self) -> u64 {
        let (w, n) = (u64::from(self.group_width()), u64::from(self.ndisks()));
        n / gcd(w, n)
    }

    /// Usable bytes with every child `child_bytes` large, by ZFS's rule: keep
    /// the reserve, round each child down to whole rows, then the N
    /// children's space down to whole groups, of which D/W is data.
    pub fn capacity_bytes(&self, child_bytes: u64) -> u64 {
        let per_child = child_bytes.saturating_sub(RESERVE_BYTES) / ROW_BYTES * ROW_BYTES;
        let group_bytes = u64::from(self.group_width()) * ROW_BYTES;
        let all = u128::from(per_child) * u128::from(self.ndisks());
        let whole_groups = all / u128::from(group_bytes) * u128::from(group_bytes);
        let data = whole_groups * u128::from(self.data) / u128::from(self.group_width());
        u64::try_from(data).unwrap_or(u64::MAX)
    }
}

/// A count with its one-letter unit (`8d`), or `None` if the letter is not
/// the one given.
fn counted(part: &str, letter: char) -> Option<Result<u32, String>> {
    let digits = part.strip_suffix(letter)?;
    Some(
        digits
            .parse::<u32>()
            .map_err(|_| format!("'{part}' is not a whole number followed by '{letter}'")),
    )
}

fn parse(text: &str, default_children: Option<u32>) -> Result<DraidSpec, String> {
    let lower = text.trim().to_ascii_lowercase();
    let mut parts = lower.split(':');
    let head = parts.next().unwrap_or("");
    let parity_text = head
        .strip_prefix("draid")
        .ok_or("a dRAID spec starts with 'draid', e.g. draid2:8d:90c:1s")?;
    let parity = match parity_text {
        "" => 1,
        digits => digits
            .parse::<u32>()
            .map_err(|_| format!("parity '{digits}' is not a whole number"))?,
    };
    let (mut data, mut children, mut spares) = (None, None, None);
    for part in parts {
        let (slot, value, name) = if let Some(v) = counted(part, 'd') {
            (&mut data, v?, "data count")
        } else if let Some(v) = counted(part, 'c') {
            (&mut children, v?, "children count")
        } else if let Some(v) = counted(part, 's') {
            (&mut spares, v?, "spare count")
        } else {
            return Err(format!(
                "unexpected '{part}' (expected Nd data, Nc children or Ns spares)"
            ));
        };
        if slot.replace(value).is_some() {
            return Err(format!("the {name} is given twice"));
        }
    }
    let children = children
        .or(default_children)
        .ok_or("the number of children is not given (add :Nc)")?;
    let spares = spares.unwrap_or(0);
    let data = match data {
        Some(d) => d,
        None => {
            let room = children.saturating_sub(spares).saturating_sub(parity);
            if room == 0 {
                return Err(format!(
                    "too few children: {children} children less {spares} spares leave no \
                     room for {parity} parity and a data column"
                ));
            }
            room.min(DEFAULT_DATA)
        }
    };
    let spec = DraidSpec {
        parity,
        data,
        children,
        spares,
    };
    spec.validate()?;
    Ok(spec)
}

impl FromStr for DraidSpec {
    type Err = String;

    /// Parses a spec that names its children.
    fn from_str(text: &str) -> Result<DraidSpec, String> {
        DraidSpec::parse(text, None)
    }
}

impl fmt::Display for DraidSpec {
    /// The full form, every number spelled out: `draid2:8d:90c:1s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "draid{}:{}d:{}c:{}s",
            self.parity, self.data, self.children, self.spares
        )
    }
}

impl DraidSpec {
    /// The level of a dRAID with this many parity columns.
    pub fn level(&self) -> super::Level {
        match self.parity {
            1 => super::Level::Draid1,
            2 => super::Level::Draid2,
            _ => super::Level::Draid3,
        }
    }

    /// The layout word of uraid's dRAID superblock (docs/DRAID-FORMAT.md):
    /// D in bits 0-7, S in bits 8-15.
    pub fn layout_word(&self) -> u32 {
        assert!(self.data < 256 && self.spares < 256, "checked by validate");
        self.data | self.spares << 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(p: u32, d: u32, c: u32, s: u32) -> DraidSpec {
        DraidSpec {
            parity: p,
            data: d,
            children: c,
            spares: s,
        }
    }

    #[test]
    fn specs_parse_with_zfs_defaults() {
        assert_eq!("draid2:8d:90c:1s".parse(), Ok(spec(2, 8, 90, 1)));
        assert_eq!("DRAID1:4d:11c:1s".parse(), Ok(spec(1, 4, 11, 1)));
        assert_eq!(DraidSpec::parse("draid", Some(90)), Ok(spec(1, 8, 90, 0)));
        assert_eq!(DraidSpec::parse("draid3", Some(8)), Ok(spec(3, 5, 8, 0)));
        assert_eq!(DraidSpec::parse("draid2:2s", Some(6)), Ok(spec(2, 2, 6, 2)));
        // The spec's own children win over the caller's.
        assert_eq!(
            DraidSpec::parse("draid1:24c", Some(90)),
            Ok(spec(1, 8, 24, 0))
        );
        assert_eq!(
            DraidSpec::parse("draid1:4d:1s:11c", None),
            Ok(spec(1, 4, 11, 1))
        );
        for text in [
            "draid2:8d:90c:1s",
            "draid1:1d:2c:0s",
            "draid3:16d:255c:100s",
        ] {
            assert_eq!(text.parse::<DraidSpec>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn bad_specs_are_refused_in_one_line() {
        for (text, children, why) in [
            ("raidz2", Some(8), "starts with 'draid'"),
            ("draid4:8d:90c", None, "parity 4 is not 1, 2 or 3"),
            ("draid0:8d:90c", None, "parity 0"),
            ("draidx", Some(8), "parity 'x'"),
            ("draid1:8d", None, "children is not given"),
            ("draid1:1d:1c", None, "outside 2..=255"),
            ("draid1:8d:256c", None, "outside 2..=255"),
            ("draid1:1d:255c:101s", None, "more than 100"),
            ("draid2:8d:10c:1s", None, "do not fit"),
            ("draid1:0d:10c", None, "at least 1 data"),
            ("draid2:3c:1s", None, "too few children"),
            ("draid1:8d:8d:20c", None, "given twice"),
            ("draid1:8x:20c", None, "unexpected '8x'"),
            ("draid1:d:20c", None, "'d' is not a whole number"),
        ] {
            let err = DraidSpec::parse(text, children).unwrap_err();
            assert!(
                err.starts_with(&format!("invalid dRAID spec '{text}': ")),
                "{err}"
            );
            assert!(err.contains(why), "{text}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    #[test]
    fn derived_sizes_match_the_brief_examples() {
        let docs = spec(1, 4, 11, 1);
        assert_eq!((docs.group_width(), docs.ndisks()), (5, 10));
        assert_eq!(docs.groups_per_slice(), 2);
        assert_eq!(spec(1, 8, 12, 0).groups_per_slice(), 4);
        assert_eq!(spec(2, 8, 68, 2).groups_per_slice(), 33);
        assert_eq!(spec(1, 8, 14, 2).groups_per_slice(), 4);
        // 10 children of 1 GiB: 992 MiB each after the reserve, 62 rows;
        // 620 rows over groups of 5 columns is 124 groups, 4/5 of it data.
        let gib = 1u64 << 30;
        assert_eq!(docs.capacity_bytes(gib), 620 * ROW_BYTES * 4 / 5);
        // About (C − S) · X · D / W for large children.
        let x = 16_000_000_000_000u64;
        let approx = 89.0 * x as f64 * 8.0 / 9.0;
        let exact = spec(1, 8, 90, 1).capacity_bytes(x) as f64;
        assert!((exact / approx - 1.0).abs() < 1e-3, "{exact} {approx}");
    }
}
