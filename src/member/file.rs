//! Members backed by a block device or an image file, with plain positional
//! I/O. (An io_uring backend with O_DIRECT comes with the performance work and
//! sits behind the same trait.)

use super::{check_io, Member};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// How a member is opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Open for writing, exclusively: O_EXCL on block devices (the kernel then
    /// refuses if the device is mounted or held by md/dm) and an exclusive
    /// lock on files, so that two uraid processes never write one member.
    pub write: bool,
}

pub struct FileMember {
    name: String,
    file: File,
    size_bytes: u64,
    block_bytes: u32,
    is_block_device: bool,
}

// From linux/fs.h: _IOR(0x12, 114, size_t), _IO(0x12, 104), _IO(0x12, 119).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileMember {
    pub fn open(path: &Path, options: OpenOptions) -> io::Result<FileMember> {
        let name = path.display().to_string();
        let metadata = std::fs::metadata(path).map_err(|e| annotate(&name, e))?;
        let is_block_device = metadata.file_type().is_block_device();
        if !is_block_device && !metadata.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a block device or a regular file"),
            ));
        }
        let mut open = std::fs::OpenOptions::new();
        open.read(true).write(options.write);
        if is_block_device && options.write {
            open.custom_flags(libc::O_EXCL);
        }
        let file = open.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{name}: device is busy (mounted, or in use by another array or program)"),
            ),
            _ => annotate(&name, e),
        })?;
        if options.write && !is_block_device {
            // SAFETY: flock on a valid, owned descriptor has no memory effects.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("{name}: file is in use by another uraid process"),
                ));
            }
        }
        let (size_bytes, block_bytes) = if is_block_device {
            let mut size: u64 = 0;
            let mut block: libc::c_int = 0;
            // SAFETY: both ioctls write one integer of the given type through the
            // pointer, which points at a live local of that type.
            unsafe {
                if libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) != 0 {
                    return Err(annotate(&name, io::Error::last_os_error()));
                }
                if libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut block as *mut libc::c_int) != 0 {
                    return Err(annotate(&name, io::Error::last_os_error()));
                }
            }
            (size, block as u32)
        } else {
            // A file's last partial sector cannot hold data: md counts whole sectors.
            (metadata.len() & !511, 512)
        };
        Ok(FileMember {
            name,
            file,
            size_bytes,
            block_bytes,
            is_block_device,
        })
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }
}

fn annotate(name: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{name}: {e}"))
}

impl Member for FileMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.file
            .read_exact_at(buf, offset_bytes)
            .map_err(|e| annotate(&self.name, e))
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.file
            .write_all_at(buf, offset_bytes)
            .map_err(|e| annotate(&self.name, e))
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| annotate(&self.name, e))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        let fd = self.file.as_raw_fd();
        // SAFETY: the ioctl reads two u64 from the array, which lives across the
        // call; fallocate takes plain integers.
        let rc = unsafe {
            if self.is_block_device {
                let range = [offset_bytes, len_bytes];
                libc::ioctl(fd, BLKDISCARD, range.as_ptr())
            } else {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes as libc::off_t,
                    len_bytes as libc::off_t,
                )
            }
        };
        if rc != 0 {
            return Err(annotate(&self.name, io::Error::last_os_error()));
        }
        Ok(())
    }
}
