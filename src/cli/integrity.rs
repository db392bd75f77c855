//! `uraid integrity crc32c|none DEVICE...`: gives a stopped array
//! checksums, or drops them (`array::integrity::enable`, `disable`). The
//! devices are opened exclusively, so an array a server holds is refused.

use super::CliResult;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct IntegrityArgs {
    /// `crc32c` to give the array checksums (every member must have room
    /// for them after the part of md's data area the array uses), `none`
    /// to drop them.
    #[arg(value_name = "SCHEME")]
    scheme: String,
    /// Every member of the array (stopped).
    #[arg(required = true, value_name = "DEVICE")]
    devices: Vec<PathBuf>,
}

pub fn run(args: &IntegrityArgs) -> CliResult {
    let enable = match args.scheme.as_str() {
        crate::array::integrity::INTEGRITY_SCHEME => true,
        "none" => false,
        other => {
            return Err(format!(
                "'{other}' is not a scheme uraid has; use crc32c or none"
            ))
        }
    };
    let members = crate::array::open_members(&args.devices, true).map_err(|e| e.to_string())?;
    let said = match enable {
        true => crate::array::integrity::enable(members)?,
        false => crate::array::integrity::disable(members)?,
    };
    println!("{said}");
    Ok(())
}
