//! dRAID's distributed spares as members.
//!
//! A distributed spare is not a disk: its space is one column of every
//! slice of the dRAID layout, spread over all the children (geometry's
//! `Draid::spare_child`). Seen from above it is a member like any other, so
//! md's machinery serves it unchanged: a failed child's role is rebuilt onto
//! it as onto a hot spare (recovery_offset and all), a real replacement is
//! later copied from it as by mdadm's --replace (ZFS's rebalance), and its
//! superblock and bitmap are written as any member's.
//!
//! Where its bytes live:
//! - its data area (from the children's data offset, `dev_sectors` long) is
//!   routed sector by sector to the child that holds the spare's column in
//!   that slice, at the same member sector: no remapping table, nothing to
//!   lose (ZFS's `vdev_draid_spare_get_child`);
//! - what md keeps before the data (superblock, bitmap) lives in a metadata
//!   slot per spare after every child's data area, written to every child
//!   and read from the first that answers, so that it survives as long as
//!   the array does.
//!
//! A child's role may itself be served by a distributed spare (a chain);
//! routing follows it through the router, bounded by the number of spares,
//! so a cycle (two spares whose columns sit on each other's failed disks,
//! where no data lives) is an I/O error rather than a hang.

use crate::geometry::Draid;
use crate::member::{check_io, Member, MemberRef};
use crate::units::SECTOR_BYTES;
use std::cell::Cell;
use std::io;
use std::sync::{Arc, RwLock, Weak};

/// The in-sync member of every role, shared by an array's distributed
/// spares; the owner of the member table keeps it current.
#[derive(Default)]
pub struct SpareRouter {
    roles: RwLock<Vec<Option<MemberRef>>>,
}

impl SpareRouter {
    pub fn new(roles: Vec<Option<MemberRef>>) -> Arc<SpareRouter> {
        Arc::new(SpareRouter {
            roles: RwLock::new(roles),
        })
    }

    /// Replaces the table: `roles[r]` is the member that holds role r and
    /// is in sync, or None.
    pub fn set(&self, roles: Vec<Option<MemberRef>>) {
        *self.roles.write().unwrap() = roles;
    }

    fn role(&self, role: usize) -> Option<MemberRef> {
        self.roles.read().unwrap().get(role).cloned().flatten()
    }

    /// The children present, for the spares' metadata: real disks only,
    /// never a distributed spare standing in a role (whose own metadata
    /// would be written through itself).
    fn present(&self) -> Vec<MemberRef> {
        self.roles
            .read()
            .unwrap()
            .iter()
            .flatten()
            .filter(|m| !is_spare_name(m.name()))
            .cloned()
            .collect()
    }
}

/// The I/O done on one piece: the member, its byte offset, and the range
/// of the caller's buffer.
type PieceIo<'a> = dyn FnMut(&dyn Member, u64, std::ops::Range<usize>) -> io::Result<()> + 'a;

thread_local! {
    /// How deep the current thread is in a chain of spares.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Where the metadata slots of the distributed spares start on each child,
/// and how long each is: what md keeps before the data, per spare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpareArea {
    /// The children's (and the spares') data offset, in sectors.
    pub data_offset_sectors: u64,
    /// Sectors of data per child (md's size): a whole number of slices.
    pub dev_sectors: u64,
}

impl SpareArea {
    /// The sectors a child needs after its data offset: its data and one
    /// metadata slot per spare.
    pub fn child_data_sectors(&self, spares: usize) -> u64 {
        self.dev_sectors + spares as u64 * self.data_offset_sectors
    }

    fn slot_bytes(&self, spare: usize) -> u64 {
        (self.data_offset_sectors + self.dev_sectors + spare as u64 * self.data_offset_sectors)
            * SECTOR_BYTES
    }
}

/// One distributed spare, as a member.
pub struct DistributedSpare {
    name: String,
    spare: usize,
    draid: Draid,
    area: SpareArea,
    /// Weak: the router may list this spare in the role it stands in for,
    /// and a strong reference both ways would keep every member (and its
    /// file lock) alive after the array is dropped. The array's owner
    /// holds the router.
    router: Weak<SpareRouter>,
    block_bytes: u32,
}

/// The name of distributed spare `spare` of a dRAID with `parity` parity
/// columns, as ZFS names them (`draid2-0-1`: parity, vdev 0, spare).
pub fn spare_name(parity: usize, spare: usize) -> String {
    format!("draid{parity}-0-{spare}")
}

/// Whether a member name is a distributed spare's.
pub fn is_spare_name(name: &str) -> bool {
    let mut parts = name.splitn(3, '-');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(level), Some("0"), Some(s))
            if level.starts_with("draid") && s.parse::<usize>().is_ok()
    )
}

impl DistributedSpare {
    pub fn new(
        draid: &Draid,
        spare: usize,
        area: SpareArea,
        router: Arc<SpareRouter>,
        block_bytes: u32,
    ) -> DistributedSpare {
        assert!(spare < draid.spares(), "spare {spare} beyond the layout");
        assert_eq!(area.dev_sectors % draid.devslice_sectors(), 0);
        DistributedSpare {
            name: spare_name(draid.parity(), spare),
            spare,
            draid: draid.clone(),
            area,
            router: Arc::downgrade(&router),
            block_bytes,
        }
    }

    pub fn spare(&self) -> usize {
        self.spare
    }

    fn router(&self) -> io::Result<Arc<SpareRouter>> {
        self.router
            .upgrade()
            .ok_or_else(|| io::Error::other(format!("{}: the array is gone", self.name)))
    }

    /// Runs `io` on the child holding member byte `offset` (in the data
    /// area), for at most `len` bytes (cut at the slice's end); returns the
    /// bytes done.
    fn route(&self, offset: u64, len: usize, io: &mut PieceIo, done: usize) -> io::Result<usize> {
        let data_offset = self.area.data_offset_sectors * SECTOR_BYTES;
        let member_sector = (offset - data_offset) / SECTOR_BYTES;
        let slice_sectors = self.draid.devslice_sectors();
        let slice_end = (member_sector / slice_sectors + 1) * slice_sectors;
        let piece = (len as u64).min((slice_end - member_sector) * SECTOR_BYTES) as usize;
        let child = self.draid.spare_child(self.spare, member_sector);
        let member = self.router()?.role(child).ok_or_else(|| {
            io::Error::other(format!(
                "{}: its space on child {child} is unavailable (the child is missing or not in sync)",
                self.name
            ))
        })?;
        let depth = DEPTH.with(|d| d.get());
        if depth > self.draid.spares() {
            return Err(io::Error::other(format!(
                "{}: a chain of distributed spares loops at member sector {member_sector}",
                self.name
            )));
        }
        DEPTH.with(|d| d.set(depth + 1));
        let result = io(&*member, offset, done..done + piece);
        DEPTH.with(|d| d.set(depth));
        result.map(|()| piece)
    }

    /// Splits `[offset, offset+len)` into metadata and routed data pieces.
    fn each_piece(
        &self,
        offset: u64,
        len: usize,
        mut meta: impl FnMut(u64, std::ops::Range<usize>) -> io::Result<()>,
        mut data: impl FnMut(&dyn Member, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let data_offset = self.area.data_offset_sectors * SECTOR_BYTES;
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            if at < data_offset {
                let piece = ((data_offset - at) as usize).min(len - done);
                meta(self.area.slot_bytes(self.spare) + at, done..done + piece)?;
                done += piece;
            } else {
                done += self.route(at, len - done, &mut data, done)?;
            }
        }
        Ok(())
    }

    /// A write, FUA or not, to the children that hold its pieces.
    fn write_pieces(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        self.each_piece(
            offset_bytes,
            buf.len(),
            |at, range| {
                // Every child gets the metadata; one copy is enough to keep.
                let mut written = 0;
                let mut last = None;
                for child in self.router()?.present() {
                    let piece = &buf[range.clone()];
                    let done = match fua {
                        true => child.write_at_fua(piece, at),
                        false => child.write_at(piece, at),
                    };
                    match done {
                        Ok(()) => written += 1,
                        Err(e) => last = Some(e),
                    }
                }
                match (written, last) {
                    (0, Some(e)) => Err(e),
                    (0, None) => Err(io::Error::other(format!(
                        "{}: no child to write to",
                        self.name
                    ))),
                    _ => Ok(()),
                }
            },
            |member, at, range| match fua {
                true => member.write_at_fua(&buf[range], at),
                false => member.write_at(&buf[range], at),
            },
        )
    }
}

impl Member for DistributedSpare {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        (self.area.data_offset_sectors + self.area.dev_sectors) * SECTOR_BYTES
    }

    fn logical_block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, buf.len() as u64)?;
        let len = buf.len();
        let buf = std::cell::RefCell::new(buf);
        self.each_piece(
            offset_bytes,
            len,
            |at, range| {
                // The first child that answers: every child holds a copy.
                let mut last = io::Error::other(format!("{}: no child to read from", self.name));
                for child in self.router()?.present() {
                    match child.read_at(&mut buf.borrow_mut()[range.clone()], at) {
                        Ok(()) => return Ok(()),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            },
            |member, at, range| member.read_at(&mut buf.borrow_mut()[range], at),
        )
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_pieces(buf, offset_bytes, false)
    }

    /// FUA on the children's writes, not a flush of every child.
    fn write_at_fua(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.write_pieces(buf, offset_bytes, true)
    }

    fn flush(&self) -> io::Result<()> {
        for child in self.router()?.present() {
            child.flush()?;
        }
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_io(self, offset_bytes, len_bytes)?;
        self.each_piece(
            offset_bytes,
            len_bytes as usize,
            // Metadata is never discarded.
            |_, _| Ok(()),
            |member, at, range| member.discard(at, range.len() as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::DraidParams;
    use crate::member::{FaultyMember, MemoryMember};

    /// A FUA write to a distributed spare is FUA on the child that holds
    /// each piece (and on every child for its metadata), not a flush of
    /// every child: at a crash of the children's volatile caches it stays,
    /// and nothing was flushed.
    #[test]
    fn a_fua_write_is_fua_on_the_children_that_hold_it() {
        let probe = DraidParams {
            parity: 1,
            data: 2,
            children: 5,
            spares: 1,
            chunk_sectors: 8,
            dev_sectors: 1 << 20,
        };
        let slice = Draid::new(&probe).unwrap().devslice_sectors();
        let draid = Draid::new(&DraidParams {
            dev_sectors: 4 * slice,
            ..probe
        })
        .unwrap();
        let area = SpareArea {
            data_offset_sectors: 64,
            dev_sectors: 4 * slice,
        };
        let child_bytes = (area.data_offset_sectors + area.child_data_sectors(1)) * SECTOR_BYTES;
        let children: Vec<Arc<FaultyMember>> = (0..5)
            .map(|i| {
                let inner = Arc::new(MemoryMember::new(&format!("c{i}"), child_bytes, 512));
                let child = Arc::new(FaultyMember::new(inner));
                child.apply_str("cache").unwrap();
                child
            })
            .collect();
        let roles = children
            .iter()
            .map(|c| Some(c.clone() as MemberRef))
            .collect();
        let router = SpareRouter::new(roles);
        let spare = DistributedSpare::new(&draid, 0, area, router.clone(), 512);
        let data_at = area.data_offset_sectors * SECTOR_BYTES + 8192;
        spare.write_at_fua(&[0xa5; 4096], data_at).unwrap();
        spare.write_at_fua(&[0x5a; 512], 512).unwrap();
        let flushes: u64 = children.iter().map(|c| c.counters().flushes).sum();
        let fua: u64 = children.iter().map(|c| c.counters().fua_writes).sum();
        assert_eq!(flushes, 0, "a FUA write flushed children");
        assert_eq!(fua, 1 + 5, "the data's child, and every child's metadata");
        for c in &children {
            c.crash().unwrap();
            c.apply_str("restore").unwrap();
        }
        let mut back = vec![0u8; 4096];
        spare.read_at(&mut back, data_at).unwrap();
        assert!(back == [0xa5; 4096], "the FUA write was lost");
        let mut meta = vec![0u8; 512];
        spare.read_at(&mut meta, 512).unwrap();
        assert!(meta == [0x5a; 512], "the FUA metadata write was lost");
    }
}
