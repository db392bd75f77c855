//! Checks every geometry against tables taken from the Linux kernel's md.
//!
//! tests/fixtures/kernel-layouts.txt was produced by tests/kernel/gen-layout-tables:
//! mdadm created each array in user-mode Linux, a tagged pattern was written
//! through /dev/md0, and the members were read back to see where every chunk
//! (and, for raid6, every Q coefficient) landed. Here uraid draws the same table
//! from its own mapping and the two must agree entry for entry.

use super::*;

const TABLES: &str = include_str!("../../tests/fixtures/kernel-layouts.txt");

struct KernelTable {
    header: String,
    params: GeometryParams,
    chunk_sectors: u64,
    member_chunks: Vec<u64>,
    /// rows[r][m]: what member m holds at chunk row r.
    rows: Vec<Vec<String>>,
}

fn field<'a>(header: &'a str, key: &str) -> &'a str {
    header
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
        .unwrap_or_else(|| panic!("'{key}' missing in '{header}'"))
}

fn parse_tables() -> Vec<KernelTable> {
    let mut tables = Vec::new();
    let mut current: Option<KernelTable> = None;
    for line in TABLES.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("geometry ") {
            let level = level_from_name(field(line, "level")).expect("known level");
            let chunk_sectors = field(line, "chunk_kib").parse::<u64>().unwrap() * 2;
            let member_chunks: Vec<u64> = field(line, "member_chunks")
                .split(',')
                .map(|c| c.parse().unwrap())
                .collect();
            let member_data_sectors: Vec<u64> =
                member_chunks.iter().map(|c| c * chunk_sectors).collect();
            let params = GeometryParams {
                level,
                layout: field(line, "layout").parse().unwrap(),
                chunk_sectors,
                raid_disks: field(line, "disks").parse().unwrap(),
                dev_sectors: *member_data_sectors.iter().min().unwrap(),
                member_data_sectors,
                raid0_layout_feature: true,
            };
            current = Some(KernelTable {
                header: line.to_string(),
                params,
                chunk_sectors,
                member_chunks,
                rows: vec![],
            });
        } else if let Some(rest) = line.strip_prefix("row ") {
            let (_, entries) = rest.split_once(':').expect("row N: entries");
            current
                .as_mut()
                .expect("row inside a geometry")
                .rows
                .push(entries.split_whitespace().map(String::from).collect());
        } else if line == "end" {
            tables.push(current.take().expect("end after a geometry"));
        } else {
            panic!("unexpected line in kernel-layouts.txt: {line}");
        }
    }
    tables
}

/// uraid's own table for the same geometry, in the fixture's notation.
fn draw(table: &KernelTable) -> Vec<Vec<String>> {
    let geometry = Geometry::new(&table.params).unwrap_or_else(|e| panic!("{}: {e}", table.header));
    let disks = table.params.raid_disks as usize;
    let rows = *table.member_chunks.iter().max().unwrap() as usize;
    let mut drawn = vec![vec!["-".to_string(); disks]; rows];
    let chunk = table.chunk_sectors;
    let raid6 = table.params.level == Level::Raid6;
    let mut put = |place: &Place, offset: u64, label: String| {
        let row = ((place.member_sector + offset) / chunk) as usize;
        assert!(
            row < rows,
            "{}: member {} row {row} beyond the table",
            table.header,
            place.member
        );
        drawn[row][place.member] = label;
    };
    for stripe in 0..geometry.stripe_count() {
        let map = geometry.stripe(stripe);
        for offset in (0..map.strip_sectors).step_by(chunk as usize) {
            for (i, strip) in map.data.iter().enumerate() {
                let logical = (map.array_sector + i as u64 * map.strip_sectors + offset) / chunk;
                let label = if raid6 {
                    format!("D{logical}^{}", strip.q_exponent)
                } else {
                    format!("D{logical}")
                };
                for copy in &strip.copies {
                    put(copy, offset, label.clone());
                }
            }
            if let Some(p) = &map.p {
                put(p, offset, "P".into());
            }
            if let Some(q) = &map.q {
                put(q, offset, "Q".into());
            }
        }
    }
    // Chunks beyond a member's own size do not exist; the fixture has no entry there.
    for (r, row) in drawn.iter_mut().enumerate() {
        row.truncate(disks);
        for (m, entry) in row.iter_mut().enumerate() {
            if r as u64 >= table.member_chunks[m] {
                *entry = "-".into();
            }
        }
    }
    drawn
}

#[test]
fn every_geometry_matches_the_kernel() {
    let tables = parse_tables();
    assert!(
        tables.len() >= 100,
        "the fixture should cover every level and layout, has {}",
        tables.len()
    );
    let mut failures = Vec::new();
    for table in &tables {
        let drawn = draw(table);
        let kernel_rows = table.rows.len();
        // The kernel's table may stop at the last used row; compare what it has
        // and require that anything past it is unused in ours too.
        for (r, row) in drawn.iter().enumerate() {
            let expected: Vec<String> = if r < kernel_rows {
                table.rows[r].clone()
            } else {
                vec!["-".to_string(); row.len()]
            };
            if *row != expected {
                failures.push(format!(
                    "{}\n  row {r}: kernel {:?}\n  row {r}: uraid  {:?}",
                    table.header, expected, row
                ));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} geometries differ:\n{}",
        failures.len(),
        tables.len(),
        failures.join("\n")
    );
}

#[test]
fn levels_cover_what_the_issue_lists() {
    let tables = parse_tables();
    let has = |level: Level, layout: u32| {
        tables
            .iter()
            .any(|t| t.params.level == level && t.params.layout == layout)
    };
    for layout in 0..=5 {
        assert!(has(Level::Raid5, layout), "raid5 layout {layout}");
    }
    for layout in [0, 1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 18, 19, 20] {
        assert!(has(Level::Raid6, layout), "raid6 layout {layout}");
    }
    for layout in [0x102, 0x103, 0x201, 0x301, 0x10201, 0x10301] {
        assert!(has(Level::Raid10, layout), "raid10 layout {layout:#x}");
    }
    for level in [Level::Linear, Level::Raid0, Level::Raid1, Level::Raid4] {
        assert!(tables.iter().any(|t| t.params.level == level), "{level}");
    }
}

/// The read fast path's `locate` must name exactly the strip that the
/// stripe map holds the sector in, for every level and layout the kernel
/// tables cover (mirrors excepted: they have no single place).
#[test]
fn locate_agrees_with_the_stripe_map_for_every_sector() {
    let mut checked = 0u64;
    for table in parse_tables() {
        let geometry = Geometry::new(&table.params).unwrap();
        let mirrored = matches!(geometry.level(), Level::Raid1 | Level::Raid10);
        for stripe in 0..geometry.stripe_count() {
            let map = geometry.stripe(stripe);
            for (i, strip) in map.data.iter().enumerate() {
                let first = map.array_sector + i as u64 * map.strip_sectors;
                for in_strip in 0..map.strip_sectors {
                    let located = geometry.locate(first + in_strip);
                    if mirrored {
                        assert_eq!(located, None, "{}", table.header);
                        continue;
                    }
                    let expected = Located {
                        stripe,
                        data_index: i,
                        place: strip.copies[0],
                        strip_sectors: map.strip_sectors,
                        in_strip_sectors: in_strip,
                    };
                    assert_eq!(
                        located,
                        Some(expected),
                        "{}: sector {}",
                        table.header,
                        first + in_strip
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 10_000, "only {checked} sectors checked");
}
