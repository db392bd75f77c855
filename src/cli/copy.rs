//! `uraid copy-in` and `uraid copy-out`: move a whole image into or out of an
//! array offline. copy-out is the recovery path for someone holding disk
//! images of an md array: it assembles read-only and reconstructs what
//! missing members held.

use super::CliResult;
use crate::array::{assemble, write_array_state, Assembled, Cleanliness, StripeIo};
use crate::units::SECTOR_BYTES;
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes moved per step: large enough to cover many stripes of any geometry.
const STEP_BYTES: usize = 16 << 20;

fn progress_bar(total_bytes: u64, verb: &str) -> ProgressBar {
    let bar =
        ProgressBar::with_draw_target(Some(total_bytes), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{verb} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}"
        ))
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// Refuses an input or output file that is also one of the members.
fn refuse_member_path(file: &Path, devices: &[PathBuf]) -> Result<(), String> {
    let Ok(meta) = std::fs::metadata(file) else {
        return Ok(());
    };
    for device in devices {
        if let Ok(dm) = std::fs::metadata(device) {
            if dm.dev() == meta.dev() && dm.ino() == meta.ino() {
                return Err(format!("{} is one of the array's members", file.display()));
            }
        }
    }
    Ok(())
}

pub fn copy_in(input: &Path, devices: &[PathBuf]) -> CliResult {
    refuse_member_path(input, devices)?;
    let mut source = File::open(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let input_bytes = source
        .metadata()
        .map_err(|e| format!("{}: {e}", input.display()))?
        .len();
    let mut array = assemble(devices, true).map_err(|e| e.to_string())?;
    array.require_runnable().map_err(|e| e.to_string())?;
    let array_bytes = array.array_sectors() * SECTOR_BYTES;
    if input_bytes > array_bytes {
        return Err(format!(
            "{} holds {input_bytes} bytes, more than the array's {array_bytes}",
            input.display()
        ));
    }
    if !array.is_clean() {
        return Err("the array was not shut down cleanly and needs a resync first (assemble it with `uraid serve` or the kernel)".into());
    }
    // Rows in its journal would be replayed over what is copied in, and
    // these writes would not be in it: only the engine keeps a journal.
    if crate::array::has_journal_feature(&array.sb) {
        return Err("the array has a write journal: copy in through `uraid serve`, which replays and keeps it".into());
    }
    // Marked dirty first: if the copy is interrupted, md (and uraid) will know
    // that parity may not match the data and resync.
    write_array_state(&mut array, Cleanliness::Dirty).map_err(|e| e.to_string())?;
    copy_into_array(&array, &mut source, input_bytes)?;
    write_array_state(&mut array, Cleanliness::Clean).map_err(|e| e.to_string())?;
    Ok(())
}

fn copy_into_array(array: &Assembled, source: &mut File, input_bytes: u64) -> Result<(), String> {
    let io = StripeIo::new(&array.geometry, &array.slots);
    let bar = progress_bar(input_bytes, "copy-in");
    let mut buf = vec![0u8; STEP_BYTES];
    let mut done = 0u64;
    while done < input_bytes {
        let len = STEP_BYTES.min((input_bytes - done) as usize);
        source
            .read_exact(&mut buf[..len])
            .map_err(|e| format!("reading the input: {e}"))?;
        io.write_bytes(done, &buf[..len])
            .map_err(|e| e.to_string())?;
        done += len as u64;
        bar.set_position(done);
    }
    for slot in array.slots.iter().flatten() {
        slot.member.flush().map_err(|e| e.to_string())?;
    }
    bar.finish_and_clear();
    Ok(())
}

pub fn copy_out(output: &Path, devices: &[PathBuf]) -> CliResult {
    refuse_member_path(output, devices)?;
    let array = assemble(devices, false).map_err(|e| e.to_string())?;
    array.require_runnable().map_err(|e| e.to_string())?;
    if !array.is_clean() && !array.missing_roles().is_empty() {
        eprintln!("uraid: warning: the array is degraded and was not shut down cleanly; recently written stripes may not reconstruct correctly");
    }
    if crate::array::has_journal_feature(&array.sb) {
        eprintln!("uraid: note: copy-out does not replay the write journal; after a crash, serve the array once (it replays the journal) before copying out");
    }
    let mut sink = File::create(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let io = StripeIo::new(&array.geometry, &array.slots);
    let total = array.array_sectors() * SECTOR_BYTES;
    let bar = progress_bar(total, "copy-out");
    let mut buf = vec![0u8; STEP_BYTES];
    let mut done = 0u64;
    while done < total {
        let len = STEP_BYTES.min((total - done) as usize);
        io.read_bytes(done, &mut buf[..len])
            .map_err(|e| e.to_string())?;
        sink.write_all(&buf[..len])
            .map_err(|e| format!("{}: {e}", output.display()))?;
        done += len as u64;
        bar.set_position(done);
    }
    sink.sync_all()
        .map_err(|e| format!("{}: {e}", output.display()))?;
    bar.finish_and_clear();
    Ok(())
}
