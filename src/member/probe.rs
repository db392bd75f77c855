//! Looks at what a device already holds before uraid writes over it, the way
//! mdadm and mkfs warn before they destroy something.

use super::Member;
use std::io;

/// What was found on a device that a create would destroy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Filesystem(&'static str),
    PartitionTable(&'static str),
}

impl std::fmt::Display for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::Filesystem(kind) => write!(f, "a {kind} filesystem"),
            Content::PartitionTable(kind) => write!(f, "a {kind} partition table"),
        }
    }
}

/// Signatures at fixed offsets: (offset in bytes, magic, what it means).
const SIGNATURES: &[(u64, &[u8], Content)] = &[
    (1080, &[0x53, 0xef], Content::Filesystem("ext2/3/4")),
    (0, b"XFSB", Content::Filesystem("xfs")),
    (65536 + 64, b"_BHRfS_M", Content::Filesystem("btrfs")),
    (4086, b"SWAPSPACE2", Content::Filesystem("swap")),
    (0, b"LUKS\xba\xbe", Content::Filesystem("LUKS")),
    (3, b"NTFS    ", Content::Filesystem("ntfs")),
    (82, b"FAT32   ", Content::Filesystem("vfat")),
    (512, b"EFI PART", Content::PartitionTable("GPT")),
];

/// Reports a filesystem or partition table at the start of the member, if any.
/// md superblocks are recognised separately by the format layer.
pub fn existing_content(member: &dyn Member) -> io::Result<Option<Content>> {
    let probe_bytes = 68 * 1024u64;
    if member.size_bytes() < probe_bytes {
        return Ok(None);
    }
    let mut head = vec![0u8; probe_bytes as usize];
    member.read_at(&mut head, 0)?;
    for (offset, magic, content) in SIGNATURES {
        let at = *offset as usize;
        if &head[at..at + magic.len()] == *magic {
            return Ok(Some(content.clone()));
        }
    }
    // An MBR: the boot signature plus at least one non-empty partition entry.
    if head[510] == 0x55 && head[511] == 0xaa && (0..4).any(|i| head[446 + 16 * i + 4] != 0) {
        return Ok(Some(Content::PartitionTable("MBR")));
    }
    Ok(None)
}
