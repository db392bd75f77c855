//! Members: the storage an array is built on.
//!
//! A member is a small trait (size, read, write, flush, discard) so that the
//! layers above never care whether they talk to a block device, an image file,
//! memory in a test, or a wrapper that injects faults. Offsets and lengths are
//! in bytes and must be multiples of the member's logical block size; every
//! backend checks that, because a misaligned request that happens to work on a
//! file would fail on a 4Kn disk.

mod fault;
mod file;
mod memory;
pub mod probe;
mod throttle;

pub use fault::{
    injected_errno, BadRange, Crash, CrashReport, EioRate, Fault, FaultCounters, FaultPlan,
    FaultyMember, Heal, InjectedError, Latency, Offline, OfflineUntil, Ops, Torn, WriteCache,
};
pub use file::{FileMember, OpenOptions};
pub use memory::MemoryMember;
pub use throttle::{ThrottleLimits, ThrottleStats, ThrottledMember};

use std::io;
use std::sync::Arc;

pub trait Member: Send + Sync {
    /// A name for messages: the path, or a test label.
    fn name(&self) -> &str;
    /// Usable size in bytes.
    fn size_bytes(&self) -> u64;
    /// The smallest unit of I/O the member accepts (512 or 4096).
    fn logical_block_bytes(&self) -> u32;
    /// Reads exactly `buf.len()` bytes at `offset_bytes`.
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset_bytes`.
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Tells the member a range is unused (a hint; contents become unspecified).
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;

    /// Sectors of 512 bytes, the unit md counts in.
    fn size_sectors(&self) -> u64 {
        self.size_bytes() / crate::units::SECTOR_BYTES
    }
}

pub type MemberRef = Arc<dyn Member>;

/// Checks that an I/O is aligned to the member's logical block and inside it.
pub(crate) fn check_io(member: &dyn Member, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let block = member.logical_block_bytes() as u64;
    if !offset_bytes.is_multiple_of(block) || !len_bytes.is_multiple_of(block) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: I/O at {offset_bytes}+{len_bytes} is not aligned to {block}-byte blocks",
                member.name()
            ),
        ));
    }
    if offset_bytes
        .checked_add(len_bytes)
        .is_none_or(|end| end > member.size_bytes())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: I/O at {offset_bytes}+{len_bytes} beyond the end ({} bytes)",
                member.name(),
                member.size_bytes()
            ),
        ));
    }
    Ok(())
}
