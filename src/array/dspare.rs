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
//!   and read from the first that answers (children whose copy a write
//!   failed on are asked last), so that it survives as long as the array
//!   does.
//!
//! A child's role may itself be served by a distributed spare (a chain);
//! routing follows it through the router, bounded by the number of spares,
//! so a cycle (two spares whose columns sit on each other's failed disks,
//! where no data lives) is an I/O error rather than a hang.
//!
//! The engine and the offline paths do not send data through a spare they
//! can route around: [`SpareRoutes`] finds each column's home, so that
//! availability is asked per row (see docs/architecture/draid.md).

use crate::geometry::{Draid, Place, StripeMap};
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
    /// Children a spare's metadata write failed on, by identity: what
    /// they hold of the spares' metadata may be torn or old, so reads go
    /// to the others first. A failed write is the child's own failure (the
    /// array fails it through its own device); until the table says so, a
    /// superblock read back from it would fail the spare instead.
    stale: RwLock<Vec<usize>>,
}

/// A member's identity while it lives: the address of what its `Arc`
/// points to.
fn identity(member: &MemberRef) -> usize {
    Arc::as_ptr(member) as *const u8 as usize
}

impl SpareRouter {
    pub fn new(roles: Vec<Option<MemberRef>>) -> Arc<SpareRouter> {
        Arc::new(SpareRouter {
            roles: RwLock::new(roles),
            stale: RwLock::default(),
        })
    }

    /// Replaces the table: `roles[r]` is the member that holds role r and
    /// is in sync, or None. A child that leaves the table leaves the
    /// stale set with it: a new member in its place is judged afresh.
    pub fn set(&self, roles: Vec<Option<MemberRef>>) {
        let kept: Vec<usize> = roles.iter().flatten().map(identity).collect();
        self.stale.write().unwrap().retain(|s| kept.contains(s));
        *self.roles.write().unwrap() = roles;
    }

    fn mark_stale(&self, child: &MemberRef) {
        let id = identity(child);
        let mut stale = self.stale.write().unwrap();
        if !stale.contains(&id) {
            stale.push(id);
        }
    }

    /// The children present, those with a whole copy of the spares'
    /// metadata first: a child whose metadata write failed is read last.
    fn present_for_reads(&self) -> Vec<MemberRef> {
        let stale = self.stale.read().unwrap();
        let (mut fresh, old): (Vec<MemberRef>, Vec<MemberRef>) = self
            .present()
            .into_iter()
            .partition(|m| !stale.contains(&identity(m)));
        fresh.extend(old);
        fresh
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

/// Which distributed spare holds each role: what the data path needs to
/// find where a column's bytes are.
///
/// A role held by distributed spare s keeps its column of a slice on the
/// child at s's position in that slice, at the same member sector
/// ([`Draid::spare_child`]); that child's role may itself be held by
/// another spare, so a column's bytes are found by following the chain to
/// its *home*: the first role that is held by a real disk, or that the
/// caller does not let the chain pass (missing, not yet rebuilt there,
/// being replaced). Availability is then asked of the home, per row: a
/// spare whose space lies on a failed child loses one column in the rows
/// that use that space and nothing elsewhere, as OpenZFS's dRAID has it.
///
/// After the head, every role of a chain sits at a spare position of the
/// slice, each a different spare's (each spare holds one role), so a
/// chain visits at most `spares` roles beyond its head and never loops.
#[derive(Clone, Debug)]
pub struct SpareRoutes {
    draid: Draid,
    /// `spare_of[role]`: the distributed spare holding `role`, if one does.
    spare_of: Vec<Option<usize>>,
}

impl SpareRoutes {
    /// The routes of a table whose member names are `names` (None where a
    /// role has no member); None when no distributed spare holds a role,
    /// so that every other array pays nothing on its data path.
    pub fn new<'n>(
        draid: &Draid,
        names: impl IntoIterator<Item = Option<&'n str>>,
    ) -> Option<SpareRoutes> {
        let spare_of: Vec<Option<usize>> = names
            .into_iter()
            .map(|name| name.and_then(spare_index))
            .collect();
        assert_eq!(spare_of.len(), draid.raid_disks());
        if spare_of.iter().all(Option::is_none) {
            return None;
        }
        for s in spare_of.iter().flatten() {
            assert!(*s < draid.spares(), "spare {s} beyond the layout");
            let holders = spare_of.iter().filter(|o| **o == Some(*s)).count();
            assert_eq!(holders, 1, "distributed spare {s} holds {holders} roles");
        }
        Some(SpareRoutes {
            draid: draid.clone(),
            spare_of,
        })
    }

    /// The routes of offline slots (a distributed spare's slot holds its
    /// member, named as the spare).
    pub fn of_slots(geometry: &crate::geometry::Geometry, slots: &super::Slots) -> Option<Self> {
        let crate::geometry::Geometry::Draid(draid) = geometry else {
            return None;
        };
        SpareRoutes::new(
            draid,
            slots.iter().map(|s| s.as_ref().map(|s| s.member.name())),
        )
    }

    /// The child holding distributed spare `spare`'s space at
    /// `member_sector`.
    pub fn spare_child(&self, spare: usize, member_sector: u64) -> usize {
        self.draid.spare_child(spare, member_sector)
    }

    /// The distributed spare holding `role`, if one does.
    pub fn spare_of(&self, role: usize) -> Option<usize> {
        self.spare_of[role]
    }

    /// The home of `place`: the chain of distributed spares followed
    /// through every role `through` lets pass.
    pub fn home(&self, place: &Place, through: impl Fn(usize) -> bool) -> Place {
        let mut role = place.member;
        for _ in 0..=self.draid.spares() {
            match self.spare_of[role] {
                Some(s) if through(role) => role = self.draid.spare_child(s, place.member_sector),
                _ => {
                    return Place {
                        member: role,
                        member_sector: place.member_sector,
                    }
                }
            }
        }
        unreachable!(
            "a chain of distributed spares from role {} at member sector {} loops",
            place.member, place.member_sector
        )
    }

    /// `map` with every place moved to its home (see [`home`](Self::home)),
    /// for a path that reads and writes members by role.
    pub fn route_map(&self, map: &StripeMap, through: impl Fn(usize) -> bool) -> StripeMap {
        let mut routed = map.clone();
        let places = routed
            .data
            .iter_mut()
            .flat_map(|d| d.copies.iter_mut())
            .chain(routed.p.iter_mut())
            .chain(routed.q.iter_mut())
            .chain(routed.r.iter_mut());
        for place in places {
            *place = self.home(place, &through);
        }
        debug_assert!(
            distinct_members(&routed),
            "two columns of a row at one home"
        );
        routed
    }
}

/// Whether every place of `map` lies on a different member: true of every
/// dRAID row, routed or not (a child is at one position of a slice).
fn distinct_members(map: &StripeMap) -> bool {
    let mut members: Vec<usize> = map.parity_places().map(|p| p.member).collect();
    members.extend(
        map.data
            .iter()
            .flat_map(|d| d.copies.iter().map(|c| c.member)),
    );
    let all = members.len();
    members.sort_unstable();
    members.dedup();
    members.len() == all
}

/// The spare index in a distributed spare's name (`draid2-0-1` is 1).
pub fn spare_index(name: &str) -> Option<usize> {
    if !is_spare_name(name) {
        return None;
    }
    name.rsplit('-').next()?.parse().ok()
}

/// An I/O error a distributed spare met on the child that holds its space
/// there, tagged with that child's role: the array fails the child for it,
/// not the spare, whose space on every other child is sound (a spare
/// failed for one child's error would lose its column in every row). An
/// error already tagged (a chain of spares) keeps the innermost child: the
/// disk that erred.
#[derive(Debug)]
pub struct ChildIoError {
    spare: String,
    role: usize,
    /// No I/O reached the child: it was missing or not in sync. Its loss
    /// is already the array's, and whatever holds its role now (a disk
    /// being rebuilt) did not fail this.
    absent: bool,
    source: io::Error,
}

impl std::fmt::Display for ChildIoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (its space on role {}): {}",
            self.spare, self.role, self.source
        )
    }
}

impl std::error::Error for ChildIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn child_error(spare: &str, role: usize, absent: bool, source: io::Error) -> io::Error {
    if child_of(&source).is_some() {
        return source;
    }
    io::Error::new(
        source.kind(),
        ChildIoError {
            spare: spare.to_string(),
            role,
            absent,
            source,
        },
    )
}

/// The role of the child a distributed spare's I/O error came from, if it
/// did: found through the wrappers that keep their source (the engine's
/// tag of a member's role).
pub fn child_of(error: &io::Error) -> Option<usize> {
    find_child(error).map(|c| c.role)
}

/// Whether a distributed spare's error is that of a child already missing
/// (no I/O reached it), so that nothing is to be failed for it.
pub fn child_absent(error: &io::Error) -> bool {
    find_child(error).is_some_and(|c| c.absent)
}

fn find_child(error: &io::Error) -> Option<&ChildIoError> {
    let mut inner: &(dyn std::error::Error + 'static) = error.get_ref()?;
    // Each step goes one wrapper down; a chain of spares is bounded by the
    // spares, and the engine adds one tag: a few steps at most.
    for _ in 0..16 {
        if let Some(child) = inner.downcast_ref::<ChildIoError>() {
            return Some(child);
        }
        let next = inner.source()?;
        inner = match next.downcast_ref::<io::Error>() {
            Some(io) => io.get_ref()?,
            None => next,
        };
    }
    None
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

/// The device numbers (superblock slots) create gives a dRAID's
/// distributed spares: from `raid_disks` on. They stay the spares' for the
/// array's life: a disk added later never takes one, also while a spare's
/// superblock cannot be read (a number given away would make the spare, once
/// readable again, claim the role of the disk that took it).
pub fn spare_dev_numbers(raid_disks: u32, spares: usize) -> std::ops::Range<u32> {
    let spares = u32::try_from(spares).expect("a handful of spares");
    raid_disks..raid_disks + spares
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
        // A missing child is that child's loss too: the column is missing
        // in this row, homed at the child, and the spare stays.
        let member = self.router()?.role(child).ok_or_else(|| {
            child_error(
                &self.name,
                child,
                true,
                io::Error::other("the child is missing or not in sync"),
            )
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
        result
            .map(|()| piece)
            .map_err(|e| child_error(&self.name, child, false, e))
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
                let router = self.router()?;
                for child in router.present() {
                    let piece = &buf[range.clone()];
                    let done = match fua {
                        true => child.write_at_fua(piece, at),
                        false => child.write_at(piece, at),
                    };
                    match done {
                        Ok(()) => written += 1,
                        Err(e) => {
                            router.mark_stale(&child);
                            last = Some(e);
                        }
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
                for child in self.router()?.present_for_reads() {
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

    /// Every child present is flushed; the spare fails only when none
    /// could be. A child whose flush fails is failing itself: the array
    /// fails it through its own device, and the columns of this spare that
    /// lie on it are then missing in their rows only (availability per
    /// row). Failing the spare for it would cost every row it serves.
    fn flush(&self) -> io::Result<()> {
        let mut flushed = 0;
        let mut last = None;
        for child in self.router()?.present() {
            match child.flush() {
                Ok(()) => flushed += 1,
                Err(e) => last = Some(e),
            }
        }
        match (flushed, last) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
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

    /// A dRAID of `slices` slices (one chunk of 4 KiB per stripe column).
    fn small_draid(
        parity: usize,
        data: usize,
        children: usize,
        spares: usize,
        slices: u64,
    ) -> Draid {
        let probe = DraidParams {
            parity,
            data,
            children,
            spares,
            chunk_sectors: 8192,
            dev_sectors: 1 << 40,
        };
        let slice = Draid::new(&probe).unwrap().devslice_sectors();
        Draid::new(&DraidParams {
            dev_sectors: slices * slice,
            ..probe
        })
        .unwrap()
    }

    /// The most columns any stripe of `draid` has homed at a missing role.
    fn most_lost(draid: &Draid, routes: &SpareRoutes, missing: &[bool]) -> usize {
        (0..draid.stripe_count())
            .map(|stripe| {
                let map = draid.stripe(stripe);
                let routed = routes.route_map(&map, |r| !missing[r]);
                assert!(
                    distinct_members(&routed),
                    "stripe {stripe}: two columns at one home"
                );
                routed.parity_places().filter(|p| missing[p.member]).count()
                    + routed
                        .data
                        .iter()
                        .filter(|d| missing[d.copies[0].member])
                        .count()
            })
            .max()
            .unwrap()
    }

    fn subsets(of: &[usize], k: usize) -> Vec<Vec<usize>> {
        if k == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for (i, &x) in of.iter().enumerate() {
            for mut rest in subsets(&of[i + 1..], k - 1) {
                rest.insert(0, x);
                out.push(rest);
            }
        }
        out
    }

    /// OpenZFS's promise for distributed spares, asked of the routes: once
    /// a failed child's role is held by a distributed spare, any P further
    /// children may fail (those that hold the spare's space included) and
    /// no stripe loses more than P columns; with a second distributed
    /// spare holding a second failed role, the same. Every pattern of the
    /// small layouts, for every parity.
    #[test]
    fn after_a_spare_rebuild_any_parity_more_failures_leave_every_row_readable() {
        for (parity, data, children, spares) in [
            (1, 2, 7, 1),
            (1, 2, 8, 2),
            (2, 2, 9, 1),
            (2, 2, 10, 2),
            (3, 2, 11, 1),
            (3, 1, 10, 2),
        ] {
            let draid = small_draid(parity, data, children, spares, 3);
            let what = format!("draid{parity}:{data}d:{children}c:{spares}s");
            for held in 1..=spares {
                // Roles 0..held failed and are held by spares 0..held.
                let names: Vec<Option<String>> = (0..children)
                    .map(|r| {
                        Some(match r < held {
                            true => spare_name(parity, r),
                            false => format!("c{r}"),
                        })
                    })
                    .collect();
                let routes = SpareRoutes::new(&draid, names.iter().map(|n| n.as_deref())).unwrap();
                let others: Vec<usize> = (held..children).collect();
                let mut patterns = 0;
                for failed in subsets(&others, parity) {
                    let mut missing = vec![false; children];
                    failed.iter().for_each(|&c| missing[c] = true);
                    let lost = most_lost(&draid, &routes, &missing);
                    assert!(
                        lost <= parity,
                        "{what}, {held} spare(s) in use, children {failed:?} failed: a row lost {lost} columns"
                    );
                    patterns += 1;
                }
                // Some pattern of one more than parity loses a row, as it
                // must (the count above is not vacuous).
                let over = subsets(&others, parity + 1).into_iter().any(|failed| {
                    let mut missing = vec![false; children];
                    failed.iter().for_each(|&c| missing[c] = true);
                    most_lost(&draid, &routes, &missing) > parity
                });
                assert!(
                    over,
                    "{what}: no pattern of {} failures loses a row",
                    parity + 1
                );
                assert!(patterns > 1, "{what}");
            }
        }
    }

    /// Without routes the chain is the place itself, and a spare whose
    /// space lies on a missing child is homed at that child.
    #[test]
    fn a_spare_column_is_homed_where_its_space_lies() {
        let draid = small_draid(1, 2, 7, 1, 2);
        let names = ["draid1-0-0", "c1", "c2", "c3", "c4", "c5", "c6"];
        let routes = SpareRoutes::new(&draid, names.iter().map(|n| Some(*n))).unwrap();
        assert_eq!(spare_index("draid1-0-0"), Some(0));
        assert_eq!(spare_index("draid3-0-12"), Some(12));
        assert_eq!(spare_index("/dev/sda"), None);
        for stripe in 0..draid.stripe_count() {
            let map = draid.stripe(stripe);
            for place in map
                .parity_places()
                .chain(map.data.iter().map(|d| d.copies[0]))
            {
                let home = routes.home(&place, |_| true);
                if place.member == 0 {
                    assert_eq!(home.member, draid.spare_child(0, place.member_sector));
                    assert_ne!(home.member, 0);
                    // Not let through (the spare not in sync there): itself.
                    assert_eq!(routes.home(&place, |_| false), place);
                } else {
                    assert_eq!(home, place);
                }
                assert_eq!(home.member_sector, place.member_sector);
            }
        }
        let none = ["c0", "c1", "c2", "c3", "c4", "c5", "c6"];
        assert!(SpareRoutes::new(&draid, none.iter().map(|n| Some(*n))).is_none());
    }

    /// A FUA write to a distributed spare is FUA on the child that holds
    /// each piece (and on every child for its metadata), not a flush of
    /// every child: at a crash of the children's volatile caches it stays,
    /// and nothing was flushed.
    /// A spare's superblock write torn on one child (which the array then
    /// fails through its own device) leaves a part-written copy there: the
    /// read back that checks the write takes a whole copy from another
    /// child, so the spare is not failed for the child's fault.
    #[test]
    fn metadata_torn_on_one_child_reads_back_whole_from_another() {
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
                Arc::new(FaultyMember::new(inner))
            })
            .collect();
        let roles: Vec<Option<MemberRef>> = children
            .iter()
            .map(|c| Some(c.clone() as MemberRef))
            .collect();
        let router = SpareRouter::new(roles.clone());
        let spare = DistributedSpare::new(&draid, 0, area, router.clone(), 512);
        spare.write_at(&[0x11; 4096], 4096).unwrap();
        children[0].apply_str("torn:keep=2").unwrap();
        spare
            .write_at(&[0x5a; 4096], 4096)
            .expect("the other children took the write");
        assert_eq!(children[0].counters().torn_writes, 1);
        let mut back = vec![0u8; 4096];
        spare.read_at(&mut back, 4096).unwrap();
        assert!(back == [0x5a; 4096], "read back the torn copy");
        // Once the torn child has left the table and a member is back in
        // its role, that member is read like any other.
        let mut without = roles.clone();
        without[0] = None;
        router.set(without);
        router.set(roles);
        assert!(router.stale.read().unwrap().is_empty());
    }

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
