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
