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
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
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

/// Where copy-out writes, opened once every check on it has passed.
struct Sink {
    file: File,
    /// A regular file or a disk, whose data a sync makes durable; a pipe or
    /// a character device (/dev/null) has nothing to sync.
    durable: bool,
}

/// Opens copy-out's output as an admin expects each kind to be treated.
/// A missing or empty file is written; a file that holds data is refused
/// without --force, since the copy would replace it. A pipe and a character
/// device (/dev/null, a tape) take the stream as it comes. A block device
/// is written from its start as dd writes an image: refused if it cannot
/// hold the array, and without --force if it holds an array, a filesystem
/// or a partition table (as create refuses it); it is opened exclusively,
/// so the kernel refuses one that is mounted or in an array.
fn open_sink(output: &Path, force: bool, array_bytes: u64) -> Result<Sink, String> {
    let name = output.display().to_string();
    let meta = match std::fs::metadata(output) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let file = File::create(output).map_err(|e| format!("{name}: {e}"))?;
            return Ok(Sink {
                file,
                durable: true,
            });
        }
        Err(e) => return Err(format!("{name}: {e}")),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        let held = meta.len();
        if held > 0 && !force {
            return Err(format!(
                "{name} exists and holds {held} bytes; use --force to overwrite it"
            ));
        }
        let file = File::create(output).map_err(|e| format!("{name}: {e}"))?;
        return Ok(Sink {
            file,
            durable: true,
        });
    }
    if kind.is_block_device() {
        refuse_small_or_valuable_disk(output, force, array_bytes)?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(if kind.is_block_device() {
            libc::O_EXCL
        } else {
            0
        })
        .open(output)
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(Sink {
        file,
        durable: kind.is_block_device(),
    })
}

/// A disk that copy-out would write over: it must hold the whole array,
/// and (unless forced) hold nothing that the copy would destroy.
fn refuse_small_or_valuable_disk(output: &Path, force: bool, array_bytes: u64) -> CliResult {
    let name = output.display().to_string();
    let member = crate::member::open(output, crate::member::OpenOptions { write: false })
        .map_err(|e| format!("{name}: {e}"))?;
    let disk_bytes = member.size_bytes();
    if disk_bytes < array_bytes {
        return Err(format!(
            "{name} holds {disk_bytes} bytes, less than the array's {array_bytes}"
        ));
    }
    if force {
        return Ok(());
    }
    crate::array::refuse_existing_content(&crate::array::Opened { path: name, member })
        .map_err(|e| e.to_string())
}

pub fn copy_out(output: &Path, force: bool, devices: &[PathBuf]) -> CliResult {
    refuse_member_path(output, devices)?;
    let array = assemble(devices, false).map_err(|e| e.to_string())?;
    array.require_runnable().map_err(|e| e.to_string())?;
    if !array.is_clean() && !array.missing_roles().is_empty() {
        eprintln!("uraid: warning: the array is degraded and was not shut down cleanly; recently written stripes may not reconstruct correctly");
    }
    if crate::array::has_journal_feature(&array.sb) {
        eprintln!("uraid: note: copy-out does not replay the write journal; after a crash, serve the array once (it replays the journal) before copying out");
    }
    let total = array.array_sectors() * SECTOR_BYTES;
    let Sink {
        file: mut sink,
        durable,
    } = open_sink(output, force, total)?;
    let io = StripeIo::new(&array.geometry, &array.slots);
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
    if durable {
        sink.sync_all()
            .map_err(|e| format!("{}: {e}", output.display()))?;
    }
    bar.finish_and_clear();
    Ok(())
}
