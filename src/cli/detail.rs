//! `uraid detail`: mdadm --detail's view of an array, from a running server
//! (--control) or from the members' superblocks (offline).

use super::text::hostname;
use super::tuning::{values_for_serve, TuningArgs};
use super::CliResult;
use crate::array::assemble;
use crate::control::{self, view::DetailView, Request};
use crate::engine::tuning::TuningValues;
use crate::engine::Snapshot;
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
/// with --verbose also `level= num-devices=` and the member list.
pub fn run_scan(control_socket: Option<&Path>, devices: &[PathBuf], verbose: bool) -> CliResult {
    if !devices.is_empty() {
        return Err(
            "detail --scan lists the served arrays: give no member devices (examine reads members)"
                .into(),
        );
    }
    for socket in super::status::sockets(control_socket) {
        match control::request(&socket, &Request::Status) {
            Ok(status) => print!("{}", scan_line(&status.detail, verbose)),
            Err(e) if control_socket.is_some() => return Err(e),
            Err(_) => {}
        }
    }
    Ok(())
}

/// One array's line, from its detail (Detail.c's brief output: spares are
/// the devices neither faulty nor in sync, a member being rebuilt included).
pub(crate) fn scan_line(detail: &serde_json::Value, verbose: bool) -> String {
    let text = |key: &str| detail[key].as_str().unwrap_or_default();
    let uuid = text("uuid");
    let device = format!(
        "/dev/md/{}",
        crate::control::registry::label_for(text("name"), uuid)
    );
    let mut line = format!("ARRAY {device}");
    if verbose {
        line.push_str(&format!(
            " level={} num-devices={}",
            text("raid_level"),
            detail["raid_devices"].as_u64().unwrap_or(0)
        ));
    }
    line.push_str(&format!(" metadata={}", text("version")));
    let spares = detail["spare_devices"].as_u64().unwrap_or(0);
    if spares > 0 {
        line.push_str(&format!(" spares={spares}"));
    }
    line.push_str(&format!(" UUID={uuid}"));
    if verbose {
        let mut members: Vec<&str> = detail["devices"]
            .as_array()
            .map(|rows| rows.iter().filter_map(|r| r["path"].as_str()).collect())
            .unwrap_or_default();
        members.sort_unstable();
        if !members.is_empty() {
            line.push_str(&format!("\n   devices={}", members.join(",")));
        }
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::scan_line;

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
        assert_eq!(
            scan_line(&detail, false),
            "ARRAY /dev/md/vol metadata=1.2 UUID=01234567:89abcdef:00112233:44556677\n"
        );
        detail["spare_devices"] = 2.into();
        detail["name"] = "".into();
        assert_eq!(
            scan_line(&detail, true),
            "ARRAY /dev/md/01234567 level=raid5 num-devices=3 metadata=1.2 spares=2 \
             UUID=01234567:89abcdef:00112233:44556677\n   devices=/d/a,/d/b\n"
        );
    }
}
