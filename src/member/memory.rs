//! An in-memory member for tests and simulation.

use super::{check_io, Member};
use std::io;
use std::sync::Mutex;

pub struct MemoryMember {
    name: String,
    block_bytes: u32,
    data: Mutex<Vec<u8>>,
    stats: super::stats::IoStats,
}

impl MemoryMember {
    pub fn new(name: &str, size_bytes: u64, block_bytes: u32) -> MemoryMember {
        assert!(block_bytes.is_power_of_two() && block_bytes >= 512);
        assert_eq!(
            size_bytes % block_bytes as u64,
            0,
            "size must be whole blocks"
        );
        MemoryMember {
            name: name.to_string(),
            block_bytes,
            data: Mutex::new(vec![0; size_bytes as usize]),
            stats: Default::default(),
        }
    }

    /// A copy of the member's bytes, for checkers.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }
}

impl Member for MemoryMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn io_stats(&self) -> Option<&super::stats::IoStats> {
        Some(&self.stats)
    }

    fn size_bytes(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }

    fn logical_block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        let data = self.data.lock().unwrap();
        buf.copy_from_slice(&data[offset_bytes as usize..offset_bytes as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        let mut data = self.data.lock().unwrap();
        data[offset_bytes as usize..offset_bytes as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        let mut data = self.data.lock().unwrap();
        data[offset_bytes as usize..(offset_bytes + len_bytes) as usize].fill(0);
        Ok(())
    }
}
