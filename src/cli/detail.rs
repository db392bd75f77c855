//! `uraid detail`: mdadm --detail's view of an array, from a running server
//! (--control) or from the members' superblocks (offline).

use super::scan::ArrayLine;
use super::tuning::{values_for_serve, TuningArgs};
use super::CliResult;
use crate::array::assemble;
use crate::array::dspare::is_spare_name;
use crate::control::{self, view::DetailView, Request};
use crate::engine::tuning::TuningValues;
use crate::engine::Snapshot;
use crate::geometry::{level_from_name, Level};
use crate::text::hostname;
use std::path::{Path, PathBuf};

pub fn run(control_socket: Option<&Path>, devices: &[PathBuf], json: bool) -> CliResult {
    let (text, value) = match (control_socket, devices.is_empty()) {
        (Some(socket), true) => {
            let status = control::request(socket, &Request::Status)?;
            (status.detail_text, status.detail)
        }
        (Some(_), false) => {
            return Err("give either --control SOCKET or member devices, not both".into())
        }
        (None, true) => {
            return Err(
                "detail needs member devices, or --control SOCKET for a running array".into(),
            )
        }
        (None, false) => {
            let array = assemble(devices, false).map_err(|e| e.to_string())?;
            let mut view = DetailView::from_snapshot(&Snapshot::from_assembled(&array));
            // Not served, so nothing is in force: show what `serve` would
            // start with, md's defaults and the settings saved with the array.
            let defaults = TuningValues::defaults(array.geometry.stripe(0).data_sectors());
            // A settings file that cannot be read does not hide the array.
            match values_for_serve(
                &array.sb.uuid_string(),
                defaults,
                &TuningArgs::default(),
                crate::array::has_journal_feature(&array.sb),
            ) {
                Ok((values, _)) => {
                    let data_strips = array.geometry.stripe(0).data.len();
                    view.tuning = values.shown(data_strips).into_iter().collect();
                    view.tuning_saved = true;
                }
                Err(e) => eprintln!("uraid: saved settings not shown: {e}"),
            }
            view.tuned = crate::engine::tuning::saved::load(&array.sb.uuid_string())
                .ok()
                .and_then(|s| s.tuned);
            (
                view.text(&hostname()),
                serde_json::to_value(&view).expect("serializable"),
            )
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("serializable")
        );
    } else {
        print!("{text}");
    }
    Ok(())
}

/// `detail --scan`: mdadm --detail --scan's line for every served array (or
/// the one given): `ARRAY /dev/md/<name> metadata=1.2 [spares=N] UUID=...`,
/// with --verbose also `level= num-devices=` and the member list; with
/// --json the same identities as a list of objects.
pub fn run_scan(
    control_socket: Option<&Path>,
    devices: &[PathBuf],
    verbose: bool,
    json: bool,
) -> CliResult {
    if !devices.is_empty() {
        return Err(
            "detail --scan lists the served arrays: give no member devices (examine reads members)"
                .into(),
        );
    }
    let mut lines: Vec<ArrayLine> = Vec::new();
    for socket in super::status::sockets(control_socket) {
        match control::request(&socket, &Request::Status) {
            Ok(status) => lines.push(array_line(&status.detail)),
            Err(e) if control_socket.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&lines).expect("serializable")
        );
    } else {
        for line in &lines {
            print!("{}", scan_text(line, verbose));
        }
    }
    Ok(())
}

/// One array's identity, from its detail (Detail.c's brief output: spares
/// are the devices neither faulty nor in sync, a member being rebuilt
/// included). A dRAID says `metadata=uraid-draid`, as its members'
/// superblocks do for `examine --scan` and as `serve --scan` requires;
/// its distributed spares are space on the members, not devices to list.
pub(crate) fn array_line(detail: &serde_json::Value) -> ArrayLine {
    let text = |key: &str| detail[key].as_str().unwrap_or_default();
    let uuid = text("uuid");
    let level = text("raid_level");
    let draid = level_from_name(level).is_some_and(Level::is_draid);
    let mut devices: Vec<String> = detail["devices"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r["path"].as_str())
                .filter(|p| !is_spare_name(p))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    devices.sort_unstable();
    ArrayLine {
        device: Some(format!(
            "/dev/md/{}",
            crate::control::registry::label_for(text("name"), uuid)
        )),
        level: Some(level.to_string()),
        num_devices: detail["raid_devices"].as_u64().unwrap_or(0),
        metadata: if draid {
            "uraid-draid"
        } else {
            text("version")
        }
        .to_string(),
        spares: detail["spare_devices"].as_u64().unwrap_or(0),
        uuid: uuid.to_string(),
        devices,
    }
}

/// The line as mdadm --detail --scan prints it (one space between tags).
fn scan_text(a: &ArrayLine, verbose: bool) -> String {
    let mut line = format!("ARRAY {}", a.device.as_deref().unwrap_or_default());
    if verbose {
        line.push_str(&format!(
            " level={} num-devices={}",
            a.level.as_deref().unwrap_or_default(),
            a.num_devices
        ));
    }
    line.push_str(&format!(" metadata={}", a.metadata));
    if a.spares > 0 {
        line.push_str(&format!(" spares={}", a.spares));
    }
    line.push_str(&format!(" UUID={}", a.uuid));
    if verbose && !a.devices.is_empty() {
        line.push_str(&format!("\n   devices={}", a.devices.join(",")));
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::{array_line, scan_text};

    #[test]
    fn scan_lines_follow_mdadm() {
        let mut detail = serde_json::json!({
            "uuid": "01234567:89abcdef:00112233:44556677",
            "name": "box:vol",
            "version": "1.2",
            "raid_level": "raid5",
            "raid_devices": 3,
            "spare_devices": 0,
            "devices": [{"path": "/d/b"}, {"path": "/d/a"}, {"path": null}],
        });
        let line = |d: &serde_json::Value, verbose| scan_text(&array_line(d), verbose);
        assert_eq!(
            line(&detail, false),
            "ARRAY /dev/md/vol metadata=1.2 UUID=01234567:89abcdef:00112233:44556677\n"
        );
        detail["spare_devices"] = 2.into();
        detail["name"] = "".into();
        assert_eq!(
            line(&detail, true),
            "ARRAY /dev/md/01234567 level=raid5 num-devices=3 metadata=1.2 spares=2 \
             UUID=01234567:89abcdef:00112233:44556677\n   devices=/d/a,/d/b\n"
        );
    }

    #[test]
    fn a_draid_line_names_its_metadata_and_only_real_devices() {
        let detail = serde_json::json!({
            "uuid": "01234567:89abcdef:00112233:44556677",
            "name": "box:dr",
            "version": "1.2",
            "raid_level": "draid2",
            "raid_devices": 6,
            "spare_devices": 0,
            "devices": [{"path": "/d/a"}, {"path": "draid2-0-0"}, {"path": "/d/c"}],
        });
        let a = array_line(&detail);
        assert_eq!(a.metadata, "uraid-draid");
        assert_eq!(a.devices, ["/d/a", "/d/c"]);
        assert_eq!(
            scan_text(&a, true),
            "ARRAY /dev/md/dr level=draid2 num-devices=6 metadata=uraid-draid \
             UUID=01234567:89abcdef:00112233:44556677\n   devices=/d/a,/d/c\n"
        );
    }
}
