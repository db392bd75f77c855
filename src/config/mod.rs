//! uraid.conf: mdadm.conf's syntax and keywords (mdadm.conf(5), config.c),
//! parsed into typed fields. Pure: [`Config::parse`] reads text, and only
//! [`Config::load`] touches the file system.
//!
//! The syntax, as mdadm reads it:
//! - words are separated by spaces and tabs; `'` or `"` quote a word with
//!   spaces in it (the quotes are dropped);
//! - `#` at the start of a word begins a comment to the end of the line;
//! - a line that starts with a space or tab continues the one before it
//!   (empty lines in between do not end it, a line starting with anything
//!   else, `#` included, does);
//! - the keyword is case-insensitive and may be cut to any prefix of three
//!   letters or more, the first keyword in mdadm's list that it starts winning
//!   (`dev` is DEVICE, `mai` MAILADDR, `hom` HOMEHOST).
//!
//! What uraid takes from it:
//! - `DEVICE` lines: glob(7) patterns of absolute paths, or the words
//!   `partitions` (the devices of /proc/partitions) and `containers` (taken and
//!   unused: uraid has no containers). No DEVICE line means `partitions`, as
//!   mdadm assumes `DEVICE partitions containers`.
//! - `ARRAY` lines ([`ArrayIdent`]): every tag given must match a member for
//!   it to be taken.
//! - `MAILADDR`, `MAILFROM`, `PROGRAM`, `MONITORDELAY`: for `uraid monitor`,
//!   kept here as mdadm keeps them.
//! - `SYSFS` lines ([`SysfsLine`]): an array's knobs, applied when it is
//!   served with `--scan` (mdadm writes them to /sys/block/mdX/md/ after
//!   assembly).
//! - mdadm's other keywords (CREATE, HOMEHOST, HOMECLUSTER, AUTO, POLICY,
//!   PART-POLICY, ENCRYPTION_NO_VERIFY, PROBING) are accepted and unused, so
//!   that an mdadm.conf reads without error; anything else is an error.
//!
//! Every error names the file and line, `uraid.conf:12: unknown keyword 'ARAY'`,
//! where mdadm would print a warning and go on: a config that says something
//! uraid would silently not do is refused.

use crate::engine::tuning::{TuningValues, KNOBS};
use crate::format::{MemberSuper, Metadata};
use crate::geometry::{level_from_name, level_name, Level};
use std::fmt;
use std::path::{Path, PathBuf};

/// Where uraid looks when no `--config` is given.
pub const DEFAULT_PATH: &str = "/etc/uraid/uraid.conf";

/// A parsed uraid.conf.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The file it came from, for messages.
    pub origin: String,
    /// DEVICE lines' words in order; empty when there is no DEVICE line (then
    /// the devices of /proc/partitions are searched, as mdadm does).
    pub devices: Vec<DevicePattern>,
    /// ARRAY lines in order.
    pub arrays: Vec<ArrayIdent>,
    /// MAILADDR: where `uraid monitor` mails its alerts.
    pub mail_addr: Option<String>,
    /// MAILFROM: the From: address of those mails (the words joined by one
    /// space, as mdadm joins them).
    pub mail_from: Option<String>,
    /// PROGRAM: run by `uraid monitor` for each event, with the event's name,
    /// the array and, where there is one, the member as arguments.
    pub program: Option<String>,
    /// MONITORDELAY: seconds between the monitor's polls (mdadm's default is
    /// 60 when neither this nor `--delay` is given).
    pub monitor_delay: Option<u64>,
    /// SYSFS lines in file order; [`Config::sysfs_for`] gives an array's knobs.
    pub sysfs: Vec<SysfsLine>,
    /// mdadm keywords uraid accepts and does not use, with their line.
    pub unused: Vec<(usize, String)>,
}

/// One word of a DEVICE line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicePattern {
    /// A glob(7) pattern of absolute paths.
    Glob(String),
    /// Every device of /proc/partitions.
    Partitions,
    /// mdadm's active containers: uraid has none, so it adds nothing.
    Containers,
}

/// An ARRAY line: the identity of an array. Tags not given match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArrayIdent {
    /// Its line in the file.
    pub line: usize,
    /// The md device it names (`/dev/md/NAME`, `/dev/mdN` or a bare name),
    /// if any; `<ignore>` sets [`ArrayIdent::ignore`] instead.
    pub devname: Option<String>,
    /// `<ignore>`: the array this line identifies is not to be assembled.
    pub ignore: bool,
    /// `uuid=`, in mdadm's form (four groups of eight hex digits).
    pub uuid: Option<String>,
    /// `name=`: matches the superblock's name, or its part after ':'.
    pub name: Option<String>,
    /// `devices=`: paths or glob patterns, comma-separated; a member must
    /// be one of them.
    pub devices: Vec<String>,
    /// `level=` (any of mdadm's names for it).
    pub level: Option<Level>,
    /// `num-devices=` (or mdadm's older `disks=`): raid disks.
    pub num_devices: Option<u32>,
    /// `spares=`: how many spares the array should have. As in mdadm, not a
    /// condition for assembly: only the monitor's SparesMissing uses it.
    pub spares: Option<u32>,
    /// `metadata=`.
    pub metadata: Option<MetadataTag>,
    /// `spare-group=`: for the monitor, which moves spares within a group.
    pub spare_group: Option<String>,
}

/// The value of a `metadata=` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTag {
    V0_90,
    /// `1` or `1.x`: any version-1 superblock.
    V1Any,
    V1(Metadata),
    /// uraid's dRAID superblock (`uraid-draid`, as `examine --scan` prints it).
    Draid,
}

/// A SYSFS line: knobs for the array it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsLine {
    pub line: usize,
    pub target: SysfsTarget,
    /// The knobs in the order given.
    pub knobs: Vec<Knob>,
}

/// The array a SYSFS line applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysfsTarget {
    /// In mdadm's form (four groups of eight hex digits).
    Uuid(String),
    /// `name=/dev/md/NAME` (or `name=NAME`): the array of that name.
    Name(String),
}

/// One knob of a SYSFS line, mapped from md's sysfs attribute (or uraid's
/// own knob name) to what uraid sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Knob {
    /// One of uraid's `--set` knobs ([`KNOBS`]), value as given (checked).
    Tuning { key: String, value: String },
    /// md's sync_speed_min, KiB/s per member; None for `system` (the default).
    SyncSpeedMin(Option<u64>),
    /// md's sync_speed_max, KiB/s per member; None for `system`.
    SyncSpeedMax(Option<u64>),
}

/// A config error: the file, the line (none for the file as a whole) and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub origin: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// mdadm's keywords, in mdadm's order: an abbreviation takes the first it
/// starts.
const KEYWORDS: &[&str] = &[
    "devices",
    "array",
    "mailaddr",
    "mailfrom",
    "program",
    "create",
    "homehost",
    "homecluster",
    "auto",
    "policy",
    "part-policy",
    "sysfs",
    "monitordelay",
    "encryption_no_verify",
    "probing",
];

/// A keyword as mdadm's match_keyword reads it: at least three letters, any
/// case, a prefix of the keyword.
fn match_keyword(word: &str) -> Option<&'static str> {
    if word.len() < 3 {
        return None;
    }
    let lower = word.to_ascii_lowercase();
    KEYWORDS.iter().copied().find(|k| k.starts_with(&lower))
}

/// A word and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Word {
    line: usize,
    text: String,
}

/// Splits the text into logical lines of words, as mdadm's conf_line and
/// conf_word do.
fn logical_lines(text: &str) -> Vec<Vec<Word>> {
    let mut lines: Vec<Vec<Word>> = Vec::new();
    let mut current: Option<Vec<Word>> = None;
    for (index, physical) in text.lines().enumerate() {
        let number = index + 1;
        if physical.is_empty() {
            continue;
        }
        let continues = physical.starts_with([' ', '\t']);
        if !continues {
            if let Some(done) = current.take() {
                lines.push(done);
            }
            if physical.starts_with('#') {
                continue;
            }
        }
        let words = split_words(physical, number);
        if words.is_empty() {
            continue;
        }
        current.get_or_insert_with(Vec::new).extend(words);
    }
    if let Some(done) = current {
        lines.push(done);
    }
    lines.retain(|l| !l.is_empty());
    lines
}

/// The words of one physical line: quotes group, `#` at a word's start
/// ends the line.
fn split_words(line: &str, number: usize) -> Vec<Word> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            _ => {}
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(&c) = chars.peek() {
            if quote.is_none() && (c == ' ' || c == '\t') {
                break;
            }
            chars.next();
            match quote {
                Some(q) if c == q => quote = None,
                None if c == '\'' || c == '"' => quote = Some(c),
                _ => word.push(c),
            }
        }
        words.push(Word {
            line: number,
            text: word,
        });
    }
    words
}

/// A UUID as mdadm's parse_uuid reads it (32 hex digits, anything else
/// between them ignored), in mdadm's printed form.
pub fn normalize_uuid(text: &str) -> Option<String> {
    let digits: String = text
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.len() != 32 {
        return None;
    }
    Some(format!(
        "{}:{}:{}:{}",
        &digits[0..8],
        &digits[8..16],
        &digits[16..24],
        &digits[24..32]
    ))
}

/// Whether an array called `set_name` in its superblock answers to
/// `wanted`: the whole name (`host:data`), the part after ':' (`data`), or
/// either as an md device (`/dev/md/data`).
pub fn name_matches(set_name: &str, wanted: &str) -> bool {
    let wanted = wanted.strip_prefix("/dev/md/").unwrap_or(wanted);
    if wanted.is_empty() || set_name.is_empty() {
        return false;
    }
    let short = set_name.split_once(':').map_or(set_name, |(_, n)| n);
    set_name == wanted || short == wanted
}

/// The metadata family of a superblock, as `metadata=` names it.
pub fn metadata_text(sb: &MemberSuper) -> &'static str {
    if is_draid(sb) {
        "uraid-draid"
    } else {
        sb.metadata.as_str()
    }
}

fn is_draid(sb: &MemberSuper) -> bool {
    Level::from_number(sb.level).is_some_and(Level::is_draid)
}

impl MetadataTag {
    fn parse(text: &str) -> Option<MetadataTag> {
        Some(match text.to_ascii_lowercase().as_str() {
            "0" | "0.90" | "0.9" | "00.90" => MetadataTag::V0_90,
            "1" | "1.x" => MetadataTag::V1Any,
            "1.0" => MetadataTag::V1(Metadata::V1_0),
            "1.1" => MetadataTag::V1(Metadata::V1_1),
            "1.2" | "default" => MetadataTag::V1(Metadata::V1_2),
            "uraid-draid" => MetadataTag::Draid,
            _ => return None,
        })
    }

    fn matches(self, sb: &MemberSuper) -> bool {
        match self {
            MetadataTag::Draid => is_draid(sb),
            _ if is_draid(sb) => false,
            MetadataTag::V0_90 => sb.metadata == Metadata::V0_90,
            MetadataTag::V1Any => sb.metadata != Metadata::V0_90,
            MetadataTag::V1(m) => sb.metadata == m,
        }
    }
}

impl ArrayIdent {
    /// Why the device at `path` (superblock `sb`) is not a member of the
    /// array this line identifies, in mdadm's words ("has wrong uuid.");
    /// None when every tag given matches. `devices=` patterns are glob(7)
    /// patterns, matched here against the path as given.
    pub fn mismatch(&self, path: &str, sb: &MemberSuper) -> Option<String> {
        if let Some(uuid) = &self.uuid {
            if *uuid != sb.uuid_string() {
                return Some(format!("{path} has wrong uuid."));
            }
        }
        if let Some(name) = &self.name {
            if !name_matches(&sb.set_name, name) {
                return Some(format!("{path} has wrong name."));
            }
        }
        if let Some(level) = self.level {
            if Level::from_number(sb.level) != Some(level) {
                return Some(format!("{path} has wrong raid level."));
            }
        }
        if let Some(n) = self.num_devices {
            if sb.raid_disks != n {
                return Some(format!("{path} requires wrong number of drives."));
            }
        }
        if let Some(metadata) = self.metadata {
            if !metadata.matches(sb) {
                return Some(format!(
                    "{path} has metadata {}, not the one required.",
                    metadata_text(sb)
                ));
            }
        }
        if !self.devices.is_empty() && !self.devices.iter().any(|p| glob_matches(p, path)) {
            return Some(format!("{path} is not one of {}", self.devices.join(",")));
        }
        None
    }

    /// Whether this line names the array `wanted` (by name= or by its md
    /// device name).
    pub fn names(&self, wanted: &str) -> bool {
        let wanted = wanted.strip_prefix("/dev/md/").unwrap_or(wanted);
        let by_name = self.name.as_deref().is_some_and(|n| {
            let n = n.strip_prefix("/dev/md/").unwrap_or(n);
            n == wanted || n.split_once(':').is_some_and(|(_, s)| s == wanted)
        });
        let by_dev = self.devname.as_deref().is_some_and(|d| {
            let d = d.strip_prefix("/dev/md/").unwrap_or(d);
            d == wanted
        });
        by_name || by_dev
    }
}

/// fnmatch(3) with FNM_PATHNAME (as glob(7) matches each component).
fn glob_matches(pattern: &str, path: &str) -> bool {
    let (Ok(p), Ok(s)) = (
        std::ffi::CString::new(pattern),
        std::ffi::CString::new(path),
    ) else {
        return false;
    };
    // SAFETY: both are valid NUL-terminated strings that outlive the call.
    unsafe { libc::fnmatch(p.as_ptr(), s.as_ptr(), libc::FNM_PATHNAME) == 0 }
}

/// md's sysfs attributes that uraid has, by the name mdadm writes.
fn knob(key: &str, value: &str) -> Result<Knob, String> {
    let speed = |v: &str| -> Result<Option<u64>, String> {
        if v == "system" {
            return Ok(None);
        }
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!(
                "{key}={v}: expected KiB/s (a positive number) or 'system'"
            )),
        }
    };
    match key {
        "sync_speed_min" => return Ok(Knob::SyncSpeedMin(speed(value)?)),
        "sync_speed_max" => return Ok(Knob::SyncSpeedMax(speed(value)?)),
        _ => {}
    }
    if !KNOBS.iter().any(|(k, _)| *k == key) {
        let names: Vec<&str> = KNOBS.iter().map(|(k, _)| *k).collect();
        return Err(format!(
            "unknown knob '{key}' (known: {}, sync_speed_min, sync_speed_max)",
            names.join(", ")
        ));
    }
    // Checked now so that a bad value is refused with its line; write-back
    // is judged when the array is served, knowing whether it has a journal.
    TuningValues::defaults(0).set(key, value, true)?;
    Ok(Knob::Tuning {
        key: key.to_string(),
        value: value.to_string(),
    })
}

impl Config {
    /// Reads uraid.conf text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let mut config = Config {
            origin: origin.to_string(),
            ..Config::default()
        };
        let err = |line: usize, message: String| ConfigError {
            origin: origin.to_string(),
            line: Some(line),
            message,
        };
        for words in logical_lines(text) {
            let head = &words[0];
            let Some(keyword) = match_keyword(&head.text) else {
                return Err(err(head.line, format!("unknown keyword '{}'", head.text)));
            };
            let rest = &words[1..];
            match keyword {
                "devices" => config.device_line(rest).map_err(|(l, m)| err(l, m))?,
                "array" => {
                    let ident = array_line(head.line, rest).map_err(|(l, m)| err(l, m))?;
                    config.arrays.push(ident);
                }
                "mailaddr" | "mailfrom" | "program" | "monitordelay" => {
                    config
                        .monitor_line(keyword, head, rest)
                        .map_err(|(l, m)| err(l, m))?;
                }
                "sysfs" => {
                    let line = sysfs_line(head.line, rest).map_err(|(l, m)| err(l, m))?;
                    config.sysfs.push(line);
                }
                other => config.unused.push((head.line, other.to_string())),
            }
        }
        Ok(config)
    }

    /// Reads the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            origin: origin.clone(),
            line: None,
            message: e.to_string(),
        })?;
        Config::parse(&text, &origin)
    }

    /// Reads `--config FILE` if given (it must exist), else the default
    /// file if there is one (none is an empty config).
    pub fn load_or_default(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            Some(path) => Config::load(path),
            None => {
                let path = PathBuf::from(DEFAULT_PATH);
                match std::fs::metadata(&path) {
                    Ok(_) => Config::load(&path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config {
                        origin: DEFAULT_PATH.to_string(),
                        ..Config::default()
                    }),
                    Err(e) => Err(ConfigError {
                        origin: DEFAULT_PATH.to_string(),
                        line: None,
                        message: e.to_string(),
                    }),
                }
            }
        }
    }

    /// MAILADDR, MAILFROM, PROGRAM, MONITORDELAY: one line each. mdadm
    /// keeps the first word of MAILADDR and PROGRAM and ignores the rest;
    /// uraid refuses what it would ignore.
    fn monitor_line(
        &mut self,
        keyword: &str,
        head: &Word,
        rest: &[Word],
    ) -> Result<(), (usize, String)> {
        let upper = keyword.to_ascii_uppercase();
        let Some(first) = rest.first() else {
            return Err((head.line, format!("{upper} without a value")));
        };
        let given = match keyword {
            "mailaddr" => self.mail_addr.is_some(),
            "mailfrom" => self.mail_from.is_some(),
            "program" => self.program.is_some(),
            _ => self.monitor_delay.is_some(),
        };
        if given {
            return Err((head.line, format!("{upper} given twice")));
        }
        if keyword != "mailfrom" && rest.len() > 1 {
            return Err((
                rest[1].line,
                format!("{upper} takes one word; '{}' is extra", rest[1].text),
            ));
        }
        match keyword {
            "mailaddr" => self.mail_addr = Some(first.text.clone()),
            // mdadm joins MAILFROM's words with one space ("Name <addr>").
            "mailfrom" => {
                let words: Vec<&str> = rest.iter().map(|w| w.text.as_str()).collect();
                self.mail_from = Some(words.join(" "));
            }
            "program" => self.program = Some(first.text.clone()),
            _ => {
                let delay = first.text.parse::<u64>().ok().filter(|d| *d > 0);
                self.monitor_delay = Some(delay.ok_or((
                    first.line,
                    format!("MONITORDELAY takes seconds above 0, not '{}'", first.text),
                ))?);
            }
        }
        Ok(())
    }

    fn device_line(&mut self, words: &[Word]) -> Result<(), (usize, String)> {
        for w in words {
            let pattern = if w.text.eq_ignore_ascii_case("partitions") {
                DevicePattern::Partitions
            } else if w.text.eq_ignore_ascii_case("containers") {
                DevicePattern::Containers
            } else if w.text.starts_with('/') {
                DevicePattern::Glob(w.text.clone())
            } else {
                return Err((
                    w.line,
                    format!(
                        "DEVICE takes absolute paths or glob patterns, 'partitions' or \
                         'containers', not '{}'",
                        w.text
                    ),
                ));
            };
            self.devices.push(pattern);
        }
        Ok(())
    }

    /// The knobs of the SYSFS lines that name this array, in the order to
    /// apply them: mdadm applies the lines from the last to the first, so
    /// where two lines set one knob the first line's value stays.
    pub fn sysfs_for(&self, uuid: &str, set_name: &str) -> Vec<Knob> {
        self.sysfs
            .iter()
            .rev()
            .filter(|line| match &line.target {
                SysfsTarget::Uuid(u) => u == uuid,
                SysfsTarget::Name(n) => name_matches(set_name, n),
            })
            .flat_map(|line| line.knobs.iter().cloned())
            .collect()
    }
}

fn tag<'a>(word: &'a str, name: &str) -> Option<&'a str> {
    let (key, value) = word.split_once('=')?;
    key.eq_ignore_ascii_case(name).then_some(value)
}

fn array_line(line: usize, words: &[Word]) -> Result<ArrayIdent, (usize, String)> {
    let mut ident = ArrayIdent {
        line,
        ..ArrayIdent::default()
    };
    let mut seen: Vec<String> = Vec::new();
    for w in words {
        let t = w.text.as_str();
        let bad = |m: String| (w.line, m);
        if t.starts_with('/') || !t.contains('=') {
            if ident.devname.is_some() || ident.ignore {
                return Err(bad(format!("only one device per ARRAY line ('{t}')")));
            }
            if t.eq_ignore_ascii_case("<ignore>") {
                ident.ignore = true;
            } else if valid_md_name(t) {
                ident.devname = Some(t.to_string());
            } else {
                return Err(bad(format!("{t} is an invalid name for an md device")));
            }
            continue;
        }
        let (key, value) = t.split_once('=').expect("has '='");
        let key = key.to_ascii_lowercase();
        let key = if key == "disks" {
            "num-devices".to_string()
        } else {
            key
        };
        if seen.contains(&key) {
            return Err(bad(format!("{key}= given twice")));
        }
        seen.push(key.clone());
        let number = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| bad(format!("{key}={v}: not a number")))
        };
        match key.as_str() {
            "uuid" => {
                ident.uuid =
                    Some(normalize_uuid(value).ok_or_else(|| bad(format!("bad uuid: {value}")))?)
            }
            "name" => {
                if value.len() > 32 {
                    return Err(bad(format!("name too long: {value}")));
                }
                ident.name = Some(value.to_string());
            }
            "devices" => {
                ident.devices = value
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "level" => {
                ident.level = Some(
                    level_from_name(value)
                        .ok_or_else(|| bad(format!("unknown raid level: {value}")))?,
                )
            }
            "num-devices" => ident.num_devices = Some(number(value)?),
            "spares" => ident.spares = Some(number(value)?),
            "metadata" => {
                ident.metadata = Some(
                    MetadataTag::parse(value)
                        .ok_or_else(|| bad(format!("metadata format {value} unknown")))?,
                )
            }
            "spare-group" => ident.spare_group = Some(value.to_string()),
            // mdadm's tags for what uraid does not have (containers,
            // external bitmaps, minor numbers, device nodes): an ARRAY
            // line that relies on them cannot be honoured.
            _ => {
                return Err(bad(format!(
                    "unrecognised word on ARRAY line: {t} (uraid takes uuid=, name=, \
                     devices=, level=, num-devices=, spares=, metadata=, spare-group=)"
                )))
            }
        }
    }
    if ident.uuid.is_none() && ident.name.is_none() && ident.devices.is_empty() {
        return Err((
            line,
            format!(
                "ARRAY line {}has no identity information (uuid=, name= or devices=)",
                ident
                    .devname
                    .as_deref()
                    .map(|d| format!("{d} "))
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(ident)
}

/// mdadm's create_mddev rules for an ARRAY line's device.
fn valid_md_name(w: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    w.starts_with("/dev/md/")
        || (!w.starts_with('/') && !w.starts_with('<'))
        || w.strip_prefix("/dev/md_d").is_some_and(number)
        || w.strip_prefix("/dev/md").is_some_and(number)
}

fn sysfs_line(line: usize, words: &[Word]) -> Result<SysfsLine, (usize, String)> {
    let mut target = None;
    let mut knobs: Vec<Knob> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    for w in words {
        let t = w.text.as_str();
        let bad = |m: String| (w.line, m);
        let new_target = if let Some(u) = tag(t, "uuid") {
            Some(SysfsTarget::Uuid(
                normalize_uuid(u).ok_or_else(|| bad(format!("bad uuid: {u}")))?,
            ))
        } else {
            tag(t, "name").map(|n| SysfsTarget::Name(n.to_string()))
        };
        if let Some(new_target) = new_target {
            if target.is_some() {
                return Err(bad(format!(
                    "only one uuid= or name= per SYSFS line ('{t}')"
                )));
            }
            target = Some(new_target);
            continue;
        }
        let Some((key, value)) = t
            .split_once('=')
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        else {
            return Err(bad(format!("cannot parse '{t}': expected ATTRIBUTE=VALUE")));
        };
        if keys.iter().any(|k| k == key) {
            return Err(bad(format!("{key} given twice on one SYSFS line")));
        }
        keys.push(key.to_string());
        knobs.push(knob(key, value).map_err(bad)?);
    }
    let target = target.ok_or((
        line,
        "SYSFS line names no array (uuid= or name=)".to_string(),
    ))?;
    Ok(SysfsLine {
        line,
        target,
        knobs,
    })
}

/// The level name mdadm prints for a superblock's level number (`pers`
/// in maps.c), uraid's dRAID levels by uraid's names.
pub fn level_text(level: i32) -> Option<&'static str> {
    match level {
        -4 => Some("multipath"),
        -5 => Some("faulty"),
        -100 => Some("container"),
        n => Level::from_number(n).map(level_name),
    }
}

#[cfg(test)]
mod tests;
