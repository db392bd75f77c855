//! `uraid examine`: each device's superblock, laid out as mdadm --examine
//! prints it so that people (and scripts) that know mdadm read it at once.

use super::CliResult;
use crate::array::{read_bitmap, read_bitmap_node, read_superblock};
use crate::format::bitmap::{Bitmap, BitmapSuper, BITMAP_MAGIC, BITMAP_STATE_STALE};
use crate::format::{
    MemberSuper, Metadata, Role, MD_FEATURE_BAD_BLOCKS, MD_FEATURE_BITMAP_OFFSET,
    MD_FEATURE_NEW_OFFSET, MD_FEATURE_RAID0_LAYOUT, MD_FEATURE_RECOVERY_OFFSET,
    MD_FEATURE_REPLACEMENT, MD_FEATURE_RESHAPE_ACTIVE,
};
use crate::geometry::{layout_name, Level};
use crate::member::{Member, OpenOptions};
use crate::text::{chunk_text, ctime, hostname, human_size_paren};
use std::fmt::Write;
use std::path::PathBuf;

pub fn run(devices: &[PathBuf], json: bool) -> CliResult {
    let mut reports = Vec::new();
    let mut text = String::new();
    for path in devices {
        let member =
            crate::member::open(path, OpenOptions::default()).map_err(|e| e.to_string())?;
        let sb = read_superblock(&*member)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: no md superblock found", path.display()))?;
        if json {
            reports.push(summary(
                &path.display().to_string(),
                &sb,
                member.size_sectors(),
            ));
        } else {
            let _ = writeln!(text, "{}:", path.display());
            let stored =
                stored_checksum(&*member, &sb).map_err(|e| format!("{}: {e}", path.display()))?;
            match sb.metadata {
                Metadata::V0_90 => text.push_str(&examine_text_090(&sb, stored)),
                _ => text.push_str(&examine_text(
                    &sb,
                    member.size_sectors(),
                    &hostname(),
                    stored,
                )),
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("serializable")
        );
    } else {
        print!("{text}");
    }
    Ok(())
}

/// The facts of one superblock, for --json and for tests.
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct Summary {
    pub device: String,
    pub metadata: String,
    pub uuid: String,
    pub name: String,
    pub level: String,
    pub layout: Option<String>,
    pub layout_number: u32,
    pub chunk_kib: u32,
    pub raid_disks: u32,
    pub role: String,
    pub dev_number: u32,
    pub data_offset_sectors: u64,
    pub super_offset_sectors: u64,
    pub avail_dev_size_sectors: u64,
    pub used_dev_size_sectors: u64,
    pub array_size_kib: Option<u64>,
    pub events: u64,
    pub state: &'static str,
    pub device_uuid: String,
    pub feature_map: u32,
    pub array_state: String,
}

fn level_text(level: i32) -> String {
    Level::from_number(level)
        .map(|l| l.to_string())
        .unwrap_or_else(|| "-unknown-".into())
}

pub fn summary(device: &str, sb: &MemberSuper, _device_sectors: u64) -> Summary {
    let level = Level::from_number(sb.level);
    Summary {
        device: device.to_string(),
        metadata: sb.metadata.as_str().to_string(),
        uuid: sb.uuid_string(),
        name: sb.set_name.clone(),
        level: level_text(sb.level),
        layout: level.and_then(|l| layout_name(l, sb.layout)),
        layout_number: sb.layout,
        chunk_kib: sb.chunk_sectors / 2,
        raid_disks: sb.raid_disks,
        role: role_text(sb),
        dev_number: sb.dev_number,
        data_offset_sectors: sb.data_offset_sectors,
        super_offset_sectors: sb.super_offset_sectors,
        avail_dev_size_sectors: sb.data_size_sectors,
        used_dev_size_sectors: sb.size_sectors,
        array_size_kib: array_size_bytes(sb).map(|b| b >> 10),
        events: sb.events,
        state: if sb.is_clean() { "clean" } else { "active" },
        device_uuid: sb.device_uuid_string(),
        feature_map: sb.feature_map,
        array_state: array_state(sb),
    }
}

/// The array size as examine derives it from one superblock (data members
/// times the used size); None for raid0 and linear, whose size needs every member.
fn array_size_bytes(sb: &MemberSuper) -> Option<u64> {
    let (data, denominator) = match sb.level {
        1 => (1, 1),
        4 | 5 => (sb.raid_disks as u64 - 1, 1),
        6 => (sb.raid_disks as u64 - 2, 1),
        10 => (
            sb.raid_disks as u64,
            ((sb.layout & 255) * ((sb.layout >> 8) & 255)).max(1) as u64,
        ),
        _ => return None,
    };
    Some((sb.size_sectors << 9) * data / denominator)
}

fn role_text(sb: &MemberSuper) -> String {
    match sb.this_role() {
        Role::Spare | Role::Faulty => "spare".into(),
        Role::Journal => "Journal".into(),
        Role::Active(r) if sb.has_feature(MD_FEATURE_REPLACEMENT) => {
            format!("Replacement device {r}")
        }
        Role::Active(r) => format!("Active device {r}"),
    }
}

/// One character per raid slot: A active, R active with a replacement, . missing.
fn array_state(sb: &MemberSuper) -> String {
    let slots = sb.raid_disks as i64
        + if sb.has_feature(MD_FEATURE_RESHAPE_ACTIVE) {
            (-sb.delta_disks).max(0) as i64
        } else {
            0
        };
    (0..slots)
        .map(|slot| {
            let holders = sb.dev_roles.iter().filter(|r| **r as i64 == slot).count();
            match holders {
                0 => '.',
                1 => 'A',
                2 if sb.level > 0 => 'R',
                _ => '?',
            }
        })
        .collect()
}

/// Space before and after the data area, as mdadm's getinfo_super1 computes it.
fn unused_space(sb: &MemberSuper, device_sectors: u64) -> (u64, u64) {
    let data_size = if sb.level <= 0 {
        sb.data_size_sectors
    } else {
        sb.size_sectors
    };
    let super_offset = sb.super_offset_sectors;
    let (before, after);
    if sb.data_offset_sectors < super_offset {
        // 1.0: data first, superblock (and bad-block log, bitmap) at the end.
        let mut end = super_offset;
        if sb.bblog_offset_sectors != 0 && sb.bblog_size_sectors != 0 {
            end = end.min(super_offset.saturating_add_signed(sb.bblog_offset_sectors as i64));
        }
        if sb.has_feature(MD_FEATURE_BITMAP_OFFSET) {
            end = end.min(super_offset.saturating_add_signed(sb.bitmap_offset_sectors as i64));
        }
        before = sb.data_offset_sectors;
        after = end.saturating_sub(sb.data_offset_sectors + data_size);
    } else {
        // The kernel keeps the first 36 KiB after the superblock for itself.
        let mut earliest = super_offset + 72;
        if sb.bblog_offset_sectors != 0 && sb.bblog_size_sectors != 0 {
            let bb_end = super_offset.saturating_add_signed(sb.bblog_offset_sectors as i64)
                + sb.bblog_size_sectors as u64;
            earliest = earliest.max(bb_end);
        }
        before = sb.data_offset_sectors.saturating_sub(earliest);
        after = device_sectors.saturating_sub(data_size + sb.data_offset_sectors);
    }
    if before == 0 && after == 0 {
        (0, 1)
    } else {
        (before, after)
    }
}

/// mdadm --examine's text for a version-1 superblock (0.90 gets the same
/// fields in a shorter form).
pub fn examine_text(
    sb: &MemberSuper,
    device_sectors: u64,
    homehost: &str,
    checksum: u32,
) -> String {
    let mut o = String::new();
    // Decoding checked that the magic and the level agree: a dRAID level
    // comes only with uraid's own magic.
    let level = Level::from_number(sb.level);
    let _ = writeln!(
        o,
        "          Magic : {:x}{}",
        crate::format::magic_for_level(sb.level),
        if level.is_some_and(Level::is_draid) {
            " (uraid dRAID, docs/DRAID-FORMAT.md)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "        Version : {}",
        if sb.metadata == Metadata::V0_90 {
            "0.90.00"
        } else {
            sb.metadata.as_str()
        }
    );
    let _ = writeln!(o, "    Feature Map : {:#x}", sb.feature_map);
    let _ = writeln!(o, "     Array UUID : {}", sb.uuid_string());
    let local = !homehost.is_empty()
        && homehost.len() < 32
        && sb.set_name.len() > homehost.len()
        && sb.set_name.starts_with(homehost)
        && sb.set_name.as_bytes()[homehost.len()] == b':';
    let _ = writeln!(
        o,
        "           Name : {}{}",
        sb.set_name,
        if local {
            format!("  (local to host {homehost})")
        } else {
            String::new()
        }
    );
    let _ = writeln!(o, "  Creation Time : {}", ctime(sb.ctime_secs));
    let _ = writeln!(o, "     Raid Level : {}", level_text(sb.level));
    let _ = writeln!(o, "   Raid Devices : {}", sb.raid_disks);
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        " Avail Dev Size : {} sectors{}",
        sb.data_size_sectors,
        human_size_paren(sb.data_size_sectors << 9)
    );
    // mdadm compares the level as an unsigned number here, so linear (-1)
    // takes this branch too and shows its "Used Dev Size : 0 sectors".
    if sb.level != 0 {
        if let Some(bytes) = array_size_bytes(sb) {
            let _ = writeln!(
                o,
                "     Array Size : {} KiB{}",
                bytes >> 10,
                human_size_paren(bytes)
            );
        }
        if sb.size_sectors != sb.data_size_sectors {
            let _ = writeln!(
                o,
                "  Used Dev Size : {} sectors{}",
                sb.size_sectors,
                human_size_paren(sb.size_sectors << 9)
            );
        }
    }
    if sb.data_offset_sectors != 0 {
        let _ = writeln!(o, "    Data Offset : {} sectors", sb.data_offset_sectors);
    }
    if sb.new_offset_sectors != 0 && sb.has_feature(MD_FEATURE_NEW_OFFSET) {
        let _ = writeln!(
            o,
            "     New Offset : {} sectors",
            sb.new_data_offset_sectors()
        );
    }
    let _ = writeln!(o, "   Super Offset : {} sectors", sb.super_offset_sectors);
    if sb.has_feature(MD_FEATURE_RECOVERY_OFFSET) {
        let _ = writeln!(
            o,
            "Recovery Offset : {} sectors",
            sb.recovery_offset_sectors
        );
    }
    let (before, after) = unused_space(sb, device_sectors);
    if after != 1 && !sb.has_feature(MD_FEATURE_NEW_OFFSET) {
        let _ = writeln!(
            o,
            "   Unused Space : before={before} sectors, after={after} sectors"
        );
    }
    let _ = writeln!(
        o,
        "          State : {}",
        if sb.is_clean() { "clean" } else { "active" }
    );
    let _ = writeln!(o, "    Device UUID : {}", sb.device_uuid_string());
    let _ = writeln!(o);
    if sb.has_feature(MD_FEATURE_BITMAP_OFFSET) {
        let _ = writeln!(
            o,
            "Internal Bitmap : {} sectors from superblock",
            sb.bitmap_offset_sectors
        );
    }
    if sb.has_feature(MD_FEATURE_RESHAPE_ACTIVE) {
        let _ = writeln!(
            o,
            "  Reshape pos'n : {}{}",
            sb.reshape_position_sectors / 2,
            human_size_paren(sb.reshape_position_sectors << 9)
        );
        if sb.delta_disks != 0 {
            let old = sb.raid_disks as i64 - sb.delta_disks as i64;
            let _ = writeln!(
                o,
                "  Delta Devices : {} ({}->{})",
                sb.delta_disks, old, sb.raid_disks
            );
        }
        reshape_targets(&mut o, sb);
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "    Update Time : {}", ctime(sb.utime_secs));
    if sb.bblog_size_sectors != 0 && sb.bblog_offset_sectors != 0 {
        let _ = writeln!(
            o,
            "  Bad Block Log : {} entries available at offset {} sectors{}",
            sb.bblog_size_sectors as u32 * 512 / 8,
            sb.bblog_offset_sectors,
            if sb.has_feature(MD_FEATURE_BAD_BLOCKS) {
                " - bad blocks present."
            } else {
                ""
            }
        );
    }
    // A superblock that failed its checksum is refused before it gets here.
    let _ = writeln!(o, "       Checksum : {:x} - correct", checksum);
    let _ = writeln!(o, "         Events : {}", sb.events);
    let _ = writeln!(o);
    if let Some(level) = level {
        let show_layout = match level {
            Level::Raid0 => sb.has_feature(MD_FEATURE_RAID0_LAYOUT),
            Level::Raid5 | Level::Raid6 | Level::Raid10 => true,
            Level::Draid1 | Level::Draid2 | Level::Draid3 => true,
            _ => false,
        };
        if show_layout {
            let name = layout_name(level, sb.layout).unwrap_or_else(|| "-unknown-".into());
            let _ = writeln!(o, "         Layout : {name}");
        }
        match level {
            Level::Raid0
            | Level::Raid4
            | Level::Raid5
            | Level::Raid6
            | Level::Raid10
            | Level::Draid1
            | Level::Draid2
            | Level::Draid3 => {
                let _ = writeln!(o, "     Chunk Size : {}", chunk_text(sb.chunk_sectors));
            }
            Level::Linear => {
                let _ = writeln!(o, "       Rounding : {}", chunk_text(sb.chunk_sectors));
            }
            Level::Raid1 => {}
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "   Device Role : {}", role_text(sb));
    let _ = writeln!(
        o,
        "   Array State : {} ('A' == active, '.' == missing, 'R' == replacing)",
        array_state(sb)
    );
    o
}

/// The checksum as it is stored on the device, which is what mdadm prints
/// (the superblock decoded only if it matched the computed one).
fn stored_checksum(member: &dyn Member, sb: &MemberSuper) -> std::io::Result<u32> {
    let mut buf = [0u8; 512];
    member.read_at(&mut buf, sb.super_offset_sectors * 512)?;
    // 1.x keeps sb_csum at byte 216; 0.90 at word 38 of its header.
    let at = if sb.metadata == Metadata::V0_90 {
        38 * 4
    } else {
        216
    };
    Ok(u32::from_le_bytes(
        buf[at..at + 4].try_into().expect("four bytes"),
    ))
}

/// One 0.90 disk descriptor's state words, as mdadm lists them.
fn disk_state_090(state: u32) -> String {
    use crate::format::sb090::{
        MD_DISK_ACTIVE, MD_DISK_FAILFAST, MD_DISK_FAULTY, MD_DISK_REMOVED, MD_DISK_SYNC,
        MD_DISK_WRITEMOSTLY,
    };
    let bit = |b: u32| state & (1 << b) != 0;
    let mut words = String::new();
    for (b, word) in [
        (MD_DISK_FAULTY, " faulty"),
        (MD_DISK_ACTIVE, " active"),
        (MD_DISK_SYNC, " sync"),
        (MD_DISK_REMOVED, " removed"),
        (MD_DISK_WRITEMOSTLY, " write-mostly"),
        (MD_DISK_FAILFAST, " failfast"),
    ] {
        if bit(b) {
            words.push_str(word);
        }
    }
    if state & !((1 << MD_DISK_WRITEMOSTLY) | (1 << MD_DISK_FAILFAST)) == 0 {
        words.push_str(" spare");
    }
    words
}

/// mdadm --examine's text for a 0.90 superblock (super0.c's layout).
pub fn examine_text_090(sb: &MemberSuper, checksum: u32) -> String {
    let extra = sb.v090.clone().unwrap_or_default();
    let mut o = String::new();
    let _ = writeln!(o, "          Magic : a92b4efc");
    let _ = writeln!(o, "        Version : 0.90.{:02}", extra.patch_version);
    let _ = writeln!(o, "           UUID : {}", sb.uuid_string());
    let _ = writeln!(o, "  Creation Time : {}", ctime(sb.ctime_secs));
    let _ = writeln!(o, "     Raid Level : {}", level_text(sb.level));
    if sb.level > 0 {
        let size_kib = sb.size_sectors / 2;
        let _ = writeln!(
            o,
            "  Used Dev Size : {}{}",
            size_kib,
            human_size_paren(size_kib << 10)
        );
        if let Some(bytes) = array_size_bytes(sb) {
            let _ = writeln!(
                o,
                "     Array Size : {}{}",
                bytes >> 10,
                human_size_paren(bytes)
            );
        }
    }
    let _ = writeln!(o, "   Raid Devices : {}", sb.raid_disks);
    let _ = writeln!(o, "  Total Devices : {}", extra.nr_disks);
    let _ = writeln!(o, "Preferred Minor : {}", extra.md_minor);
    let _ = writeln!(o);
    let _ = writeln!(o, "    Update Time : {}", ctime(sb.utime_secs));
    let _ = writeln!(
        o,
        "          State : {}",
        if sb.is_clean() { "clean" } else { "active" }
    );
    if sb.has_feature(MD_FEATURE_BITMAP_OFFSET) {
        let _ = writeln!(o, "Internal Bitmap : present");
    }
    let _ = writeln!(o, " Active Devices : {}", extra.active_disks);
    let _ = writeln!(o, "Working Devices : {}", extra.working_disks);
    let _ = writeln!(o, " Failed Devices : {}", extra.failed_disks);
    let _ = writeln!(o, "  Spare Devices : {}", extra.spare_disks);
    let _ = writeln!(o, "       Checksum : {:x} - correct", checksum);
    let _ = writeln!(o, "         Events : {}", sb.events);
    let _ = writeln!(o);
    if let Some(level) = Level::from_md_number(sb.level) {
        if matches!(level, Level::Raid5 | Level::Raid6 | Level::Raid10) {
            let _ = writeln!(
                o,
                "         Layout : {}",
                layout_name(level, sb.layout).unwrap_or_else(|| "-unknown-".into())
            );
        }
        match level {
            Level::Raid0 | Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10 => {
                let _ = writeln!(o, "     Chunk Size : {}", chunk_text(sb.chunk_sectors));
            }
            Level::Linear => {
                let _ = writeln!(o, "       Rounding : {}", chunk_text(sb.chunk_sectors));
            }
            // An md superblock never names a dRAID level: from_md_number
            // refuses their numbers.
            Level::Raid1 | Level::Draid1 | Level::Draid2 | Level::Draid3 => {}
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "      Number   Major   Minor   RaidDevice State");
    let listed = sb.raid_disks as usize + extra.spare_disks as usize;
    let row = |label: String, d: &crate::format::sb090::Sb090Disk| {
        format!(
            "{label:>4} {:5}   {:5}    {:5}    {:5}     {}\n",
            d.number,
            d.major,
            d.minor,
            d.raid_disk,
            disk_state_090(d.state)
        )
    };
    o.push_str(&row("this".into(), &extra.this_disk));
    o.push('\n');
    for (i, d) in extra.disks.iter().enumerate().take(listed) {
        o.push_str(&row(i.to_string(), d));
    }
    o
}

/// `uraid examine --bitmap`: each member's internal write-intent bitmap,
/// laid out as mdadm --examine-bitmap (-X) prints it.
pub fn run_bitmap(devices: &[PathBuf], json: bool) -> CliResult {
    let mut reports = Vec::new();
    let mut text = String::new();
    for path in devices {
        let name = path.display().to_string();
        let member =
            crate::member::open(path, OpenOptions::default()).map_err(|e| e.to_string())?;
        let sb = read_superblock(&*member)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{name}: no md superblock found"))?;
        let (bsb, bits) = read_bitmap(&*member, &sb)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{name}: the array has no internal bitmap"))?;
        // md-cluster keeps one bitmap per node slot, each in its own
        // 4 KiB-rounded space after the first.
        let mut nodes = Vec::new();
        for node in 0..bsb.nodes {
            let found = read_bitmap_node(&*member, &sb, node, bsb.reserved_bytes())
                .map_err(|e| e.to_string())?
                .expect("the first slot was found");
            nodes.push(found);
        }
        if json {
            reports.push(bitmap_summary(&name, &sb, &bsb, &bits));
        } else {
            text.push_str(&examine_bitmap_text(&name, &sb, &bsb, &bits, &nodes));
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("serializable")
        );
    } else {
        print!("{text}");
    }
    Ok(())
}

/// The facts of one bitmap, for --json and for tests.
#[derive(serde::Serialize, Debug, Clone, PartialEq)]
pub struct BitmapSummary {
    pub device: String,
    pub version: u32,
    pub uuid: String,
    pub events: u64,
    pub events_cleared: u64,
    pub state: u32,
    pub chunk_bytes: u32,
    pub daemon_sleep_secs: u32,
    pub write_behind: u32,
    pub sync_size_sectors: u64,
    pub bits: u64,
    pub dirty: u64,
}

pub fn bitmap_summary(
    device: &str,
    sb: &MemberSuper,
    bsb: &BitmapSuper,
    bits: &Bitmap,
) -> BitmapSummary {
    BitmapSummary {
        device: device.to_string(),
        version: bsb.version,
        uuid: bitmap_uuid_text(sb, bsb),
        events: bsb.events,
        events_cleared: bsb.events_cleared,
        state: bsb.state,
        chunk_bytes: bsb.chunk_bytes,
        daemon_sleep_secs: bsb.daemon_sleep_secs,
        write_behind: bsb.write_behind,
        sync_size_sectors: bsb.sync_size_sectors,
        bits: bits.chunks(),
        dirty: bits.count_set(),
    }
}

/// The bitmap's UUID as mdadm -X prints it: bytes in order for 1.x, and
/// for 0.90 (whose superswitch does not swap) each group as a native
/// little-endian word, as --examine prints the 0.90 UUID.
fn bitmap_uuid_text(sb: &MemberSuper, bsb: &BitmapSuper) -> String {
    let groups: Vec<String> = bsb
        .uuid
        .chunks(4)
        .map(|g| {
            let word: [u8; 4] = g.try_into().expect("4 bytes");
            if sb.metadata == Metadata::V0_90 {
                format!("{:08x}", u32::from_le_bytes(word))
            } else {
                format!("{:08x}", u32::from_be_bytes(word))
            }
        })
        .collect();
    groups.join(":")
}

/// mdadm's human_chunksize: "64 MB", "4 KB", "512 B".
fn bitmap_chunk_text(bytes: u32) -> String {
    let mut value = bytes;
    let mut unit = 0;
    while value >> 10 != 0 {
        value >>= 10;
        unit += 1;
    }
    format!("{value} {}", ["B", "KB", "MB", "GB", "TB"][unit])
}

fn bitmap_state_text(state: u32) -> &'static str {
    match state {
        0 => "OK",
        BITMAP_STATE_STALE => "Out of date",
        _ => "Unknown",
    }
}

fn bitmap_bits_line(bits: &Bitmap) -> String {
    let dirty = bits.count_set();
    let pct = 100.0 * dirty as f64 / bits.chunks().max(1) as f64;
    format!(
        "          Bitmap : {} bits (chunks), {dirty} dirty ({pct:.1}%)\n",
        bits.chunks()
    )
}

/// mdadm --examine-bitmap's text (bitmap.c ExamineBitmap); `nodes` holds
/// the per-slot bitmaps of an md-cluster array (empty otherwise).
pub fn examine_bitmap_text(
    filename: &str,
    sb: &MemberSuper,
    bsb: &BitmapSuper,
    bits: &Bitmap,
    nodes: &[(BitmapSuper, Bitmap)],
) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "        Filename : {filename}");
    let _ = writeln!(o, "           Magic : {BITMAP_MAGIC:08x}");
    let _ = writeln!(o, "         Version : {}", bsb.version);
    let _ = writeln!(o, "            UUID : {}", bitmap_uuid_text(sb, bsb));
    if bsb.nodes == 0 {
        let _ = writeln!(o, "          Events : {}", bsb.events);
        let _ = writeln!(o, "  Events Cleared : {}", bsb.events_cleared);
        let _ = writeln!(o, "           State : {}", bitmap_state_text(bsb.state));
    }
    let _ = writeln!(
        o,
        "       Chunksize : {}",
        bitmap_chunk_text(bsb.chunk_bytes)
    );
    let _ = writeln!(
        o,
        "          Daemon : {}s flush period",
        bsb.daemon_sleep_secs
    );
    if bsb.write_behind != 0 {
        let _ = writeln!(
            o,
            "      Write Mode : Allow write behind, max {}",
            bsb.write_behind
        );
    } else {
        let _ = writeln!(o, "      Write Mode : Normal");
    }
    let _ = writeln!(
        o,
        "       Sync Size : {}{}",
        bsb.sync_size_sectors / 2,
        human_size_paren(bsb.sync_size_sectors.saturating_mul(512))
    );
    if bsb.nodes == 0 {
        o.push_str(&bitmap_bits_line(bits));
        return o;
    }
    let _ = writeln!(o, "   Cluster nodes : {}", bsb.nodes);
    let _ = writeln!(o, "    Cluster name : {:<64}", bsb.cluster_name_text());
    for (slot, (node_sb, node_bits)) in nodes.iter().enumerate() {
        let _ = writeln!(o, "       Node Slot : {slot}");
        let _ = writeln!(o, "          Events : {}", node_sb.events);
        let _ = writeln!(o, "  Events Cleared : {}", node_sb.events_cleared);
        let _ = writeln!(o, "           State : {}", bitmap_state_text(node_sb.state));
        o.push_str(&bitmap_bits_line(node_bits));
    }
    o
}

/// mdadm --examine's lines for what a reshape changes besides the member
/// count: level, layout (named in the old level's table), chunk.
fn reshape_targets(o: &mut String, sb: &MemberSuper) {
    if sb.new_level != sb.level {
        let name =
            Level::from_md_number(sb.new_level).map_or("-unknown-", crate::geometry::level_name);
        let _ = writeln!(o, "      New Level : {name}");
    }
    if sb.new_layout != sb.layout {
        if let Some(level @ (Level::Raid5 | Level::Raid6 | Level::Raid10)) =
            Level::from_md_number(sb.level)
        {
            let name = layout_name(level, sb.new_layout);
            let _ = writeln!(
                o,
                "     New Layout : {}",
                name.as_deref().unwrap_or("-unknown-")
            );
        }
    }
    if sb.new_chunk_sectors != sb.chunk_sectors {
        let _ = writeln!(o, "  New Chunksize : {}K", sb.new_chunk_sectors / 2);
    }
}
