//! Finding, reading and writing md superblocks on members.

use crate::format::{self, sb090, sb1, FormatError, MemberSuper, Metadata, MD_SB_MAGIC};
use crate::member::Member;
use crate::units::SECTOR_BYTES;
use std::io;

/// Why a member's superblock could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockError {
    #[error("{device}: {source}")]
    Io { device: String, source: io::Error },
    #[error("{device}: corrupt md {metadata} superblock: {source}")]
    Corrupt {
        device: String,
        metadata: &'static str,
        source: FormatError,
    },
}

/// Bytes the kernel reads at a superblock location.
const SB_READ_BYTES: usize = 4096;

/// Looks for an md superblock in every place md puts one (1.2, 1.1, 1.0, then
/// 0.90), as mdadm --examine does. Returns None when there is none; a
/// superblock whose magic is right but whose contents are not is an error,
/// because silently ignoring it could let a create destroy an array.
pub fn read_superblock(member: &dyn Member) -> Result<Option<MemberSuper>, SuperblockError> {
    let device_sectors = member.size_sectors();
    let io_err = |source| SuperblockError::Io {
        device: member.name().to_string(),
        source,
    };
    for metadata in [
        Metadata::V1_2,
        Metadata::V1_1,
        Metadata::V1_0,
        Metadata::V0_90,
    ] {
        let Some(sb_sector) = format::superblock_offset_sectors(metadata, device_sectors) else {
            continue;
        };
        if (sb_sector * SECTOR_BYTES) as usize + SB_READ_BYTES > member.size_bytes() as usize {
            continue;
        }
        let mut buf = vec![0u8; SB_READ_BYTES];
        member
            .read_at(&mut buf, sb_sector * SECTOR_BYTES)
            .map_err(io_err)?;
        let magic = u32::from_le_bytes(buf[0..4].try_into().unwrap());
        // uraid's dRAID superblock lives only where 1.2's does.
        let draid = magic == format::DRAID_SB_MAGIC && metadata == Metadata::V1_2;
        if magic != MD_SB_MAGIC && !draid {
            continue;
        }
        // The same magic starts both formats; the major version tells them apart.
        let major = u32::from_le_bytes(buf[4..8].try_into().unwrap());
        let decoded = match metadata {
            Metadata::V0_90 if major == 0 => sb090::decode(&buf, device_sectors),
            Metadata::V0_90 => continue,
            _ if major != 1 => continue,
            _ => sb1::decode_with_block_size(
                &buf,
                metadata,
                device_sectors,
                member.logical_block_bytes(),
            ),
        };
        return decoded
            .map(Some)
            .map_err(|source| SuperblockError::Corrupt {
                device: member.name().to_string(),
                metadata: metadata.as_str(),
                source,
            });
    }
    Ok(None)
}

/// Writes `sb` at its location, then reads it back and checks that it decodes
/// to the same value: a superblock that md would refuse must never be left
/// behind silently.
pub fn write_superblock(member: &dyn Member, sb: &MemberSuper) -> Result<(), SuperblockError> {
    let device = member.name().to_string();
    let corrupt = |source| SuperblockError::Corrupt {
        device: device.clone(),
        metadata: sb.metadata.as_str(),
        source,
    };
    let buf: Vec<u8> = match sb.metadata {
        Metadata::V0_90 => sb090::encode(sb).map_err(corrupt)?,
        _ => sb1::encode_padded(sb).map_err(corrupt)?.to_vec(),
    };
    assert_eq!(buf.len(), SB_READ_BYTES);
    let io_err = |source| SuperblockError::Io {
        device: device.clone(),
        source,
    };
    member
        .write_at(&buf, sb.super_offset_sectors * SECTOR_BYTES)
        .map_err(io_err)?;
    // A device that does not give back what it was just given is failing:
    // an error for the caller to fail it, never a panic of the server.
    let lost = |what: &str| SuperblockError::Io {
        device: device.clone(),
        source: io::Error::other(format!("the superblock just written {what}")),
    };
    let read_back = read_superblock(member)?.ok_or_else(|| lost("does not read back"))?;
    let again = match sb.metadata {
        Metadata::V0_90 => sb090::encode(&read_back).map_err(corrupt)?,
        _ => sb1::encode_padded(&read_back).map_err(corrupt)?.to_vec(),
    };
    if again != buf {
        return Err(lost("reads back different"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{create_on_members, CreateOptions};
    use crate::geometry::Level;
    use crate::member::{MemberRef, MemoryMember};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A device that acknowledges writes and, once told to, keeps none.
    struct Forgetful {
        inner: MemoryMember,
        forget: AtomicBool,
    }

    impl Member for Forgetful {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn logical_block_bytes(&self) -> u32 {
            self.inner.logical_block_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if self.forget.load(Ordering::SeqCst) {
                return Ok(());
            }
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
            self.inner.discard(offset, len)
        }
    }

    #[test]
    fn a_device_that_loses_a_superblock_write_is_an_error_not_a_panic() {
        let members: Vec<Arc<Forgetful>> = (0..3)
            .map(|i| {
                Arc::new(Forgetful {
                    inner: MemoryMember::new(&format!("m{i}"), 8 << 20, 512),
                    forget: AtomicBool::new(false),
                })
            })
            .collect();
        let options = CreateOptions {
            level: Level::Raid5,
            raid_disks: 3,
            chunk_bytes: Some(64 << 10),
            layout: None,
            metadata: crate::format::Metadata::V1_2,
            assume_clean: true,
            name: "forget".into(),
            size_sectors: None,
            force: false,
            homehost: None,
            integrity: false,
        };
        let named = members
            .iter()
            .map(|m| Some((m.name().to_string(), m.clone() as MemberRef)))
            .collect();
        let array = create_on_members(named, &options, |_, _| {}).unwrap();
        let mut sb = array.devices[1].sb.clone();
        sb.events += 1;
        members[1].forget.store(true, Ordering::SeqCst);
        let err = write_superblock(members[1].as_ref(), &sb).unwrap_err();
        assert!(err.to_string().contains("reads back different"), "{err}");
    }
}
