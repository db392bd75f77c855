//! `uraid doctor [--json] [DEVICE|URI...]`: the host checks, and the queues
//! of the devices given or of the members of the arrays served here (an NBD
//! member's server asked instead).

use super::CliResult;
use crate::array::dspare::is_spare_name;
use crate::control::{self, Request};
use crate::doctor::{self, ArrayNeed, Targets};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// A list of {check, status, value, reason, fix} on stdout.
    #[arg(long)]
    json: bool,
    /// Member devices or image files whose queues to check, or NBD URIs
    /// whose servers to ask (default: the members of the arrays served here).
    devices: Vec<PathBuf>,
}

/// The served arrays (through their control sockets, found as `status`
/// finds them: the registry, wherever --control put them, and the socket
/// folder): each one's members and stripe_cache_size. A socket nobody
/// answers is skipped. A dRAID's distributed spares are space on the
/// members, not devices with queues of their own.
fn served_arrays() -> Vec<(ArrayNeed, Vec<(PathBuf, String)>)> {
    super::status::sockets(None)
        .iter()
        .filter_map(|socket| control::request(socket, &Request::Status).ok())
        .map(|reply| {
            let detail = &reply.detail;
            let members: Vec<(PathBuf, String)> = detail["devices"]
                .as_array()
                .map(|rows| {
                    rows.iter()
                        .filter_map(|r| {
                            let state = r["state"].as_str().unwrap_or_default().to_string();
                            r["path"]
                                .as_str()
                                .filter(|p| !is_spare_name(p))
                                .map(|p| (PathBuf::from(p), state))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let stripe_cache_size = detail["tuning"]["stripe_cache_size"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(crate::engine::tuning::STRIPE_CACHE_DEFAULT);
            let need = ArrayNeed {
                name: detail["name"].as_str().unwrap_or("array").to_string(),
                members: members.len(),
                stripe_cache_size,
            };
            (need, members)
        })
        .collect()
}

pub fn run(args: &DoctorArgs) -> CliResult {
    for device in &args.devices {
        match device.to_str().filter(|_| crate::member::is_uri(device)) {
            Some(uri) => {
                uri.parse::<crate::member::nbd::NbdUri>()
                    .map_err(|e| e.to_string())?;
            }
            None => {
                std::fs::metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
            }
        }
    }
    let served = served_arrays();
    let members: Vec<(PathBuf, String)> = served.iter().flat_map(|(_, m)| m.clone()).collect();
    let targets = if args.devices.is_empty() {
        Targets {
            devices: members.iter().map(|(p, _)| p.clone()).collect(),
            arrays: served.into_iter().map(|(a, _)| a).collect(),
            served: members,
        }
    } else {
        // The devices given, as one array at md's default stripe cache,
        // beside the arrays already served.
        let mut arrays: Vec<ArrayNeed> = served.into_iter().map(|(a, _)| a).collect();
        arrays.push(ArrayNeed {
            name: "the devices given".into(),
            members: args.devices.len(),
            stripe_cache_size: crate::engine::tuning::STRIPE_CACHE_DEFAULT,
        });
        Targets {
            devices: args.devices.clone(),
            arrays,
            served: members,
        }
    };
    let checks = doctor::run(&targets);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&checks).expect("serializable")
        );
    } else {
        for check in &checks {
            println!("{}", check.line());
        }
    }
    if doctor::any_failed(&checks) {
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| c.status == doctor::Status::Fail)
            .map(|c| c.check.as_str())
            .collect();
        return Err(format!("failed: {}", failed.join(", ")));
    }
    Ok(())
}
