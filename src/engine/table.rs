//! The member table: which member holds which role, which are in sync
//! (and up to where, for one being rebuilt), and where a dRAID's
//! distributed spares keep the roles they hold. Data only, below both the
//! request path (engine/datapath/), which reads a snapshot of it, and the
//! membership changes (members.rs, manage.rs), which build a new one and
//! swap it in.

use crate::array::{Slot, SpareRoutes};
use crate::engine::position::Position;
use crate::geometry::{Geometry, Place, StripeMap};
use std::sync::Arc;

/// One role's member.
#[derive(Clone)]
pub struct MemberEntry {
    pub slot: Slot,
    /// For a member being rebuilt: the first stripe not yet rebuilt and the
    /// rows rebuilt ahead of it (shared with the rebuild worker). None for
    /// an in-sync member.
    pub rebuilt_below: Option<Arc<Position>>,
}

#[derive(Clone)]
pub struct MemberTable {
    pub by_role: Vec<Option<MemberEntry>>,
    /// A replacement being built for a role while its member stays in
    /// service (mdadm --replace): it receives writes below its copy point.
    pub replacing: Vec<Option<MemberEntry>>,
    /// Where a dRAID's distributed spares keep the roles they hold; None
    /// when no spare holds one (every other array). Derived from
    /// `by_role` by [`refresh_routes`](Self::refresh_routes).
    pub routes: Option<Arc<SpareRoutes>>,
}

impl MemberTable {
    /// Whether every member's bytes are in memory (`Member::in_memory`).
    pub fn in_memory(&self) -> bool {
        let mut entries = self
            .by_role
            .iter()
            .chain(&self.replacing)
            .flatten()
            .peekable();
        entries.peek().is_some() && entries.all(|e| e.slot.member.in_memory())
    }

    /// The largest logical block of any member, replacements included:
    /// what every request must be aligned to (512 with none).
    pub fn block_bytes(&self) -> u32 {
        self.by_role
            .iter()
            .chain(&self.replacing)
            .flatten()
            .map(|e| e.slot.member.logical_block_bytes())
            .max()
            .unwrap_or(512)
    }

    pub fn entry(&self, role: usize) -> Option<&MemberEntry> {
        self.by_role.get(role).and_then(Option::as_ref)
    }

    /// Whether `role` holds valid data for `stripe`.
    pub fn usable(&self, role: usize, stripe: u64) -> bool {
        match self.entry(role) {
            None => false,
            Some(e) => e
                .rebuilt_below
                .as_ref()
                .is_none_or(|below| below.covers(stripe)),
        }
    }

    /// How many more of the row's places could be lost with every strip
    /// still readable, `role` counted lost (the member a rebuild builds):
    /// 0 for a row at zero redundancy without it. None when the row cannot
    /// be read even so.
    pub fn margin_without(&self, map: &StripeMap, role: usize) -> Option<usize> {
        let stripe = map.stripe;
        let lost = |p: &Place| self.home(p, stripe).member == role || !self.present(p, stripe);
        if map.p.is_none() {
            // Mirrors: the strip with the fewest copies left.
            return map
                .data
                .iter()
                .map(|d| d.copies.iter().filter(|c| !lost(c)).count().checked_sub(1))
                .min()
                .flatten();
        }
        let parity: Vec<Place> = map.parity_places().collect();
        let missing = map.data.iter().filter(|d| lost(&d.copies[0])).count()
            + parity.iter().filter(|p| lost(p)).count();
        parity.len().checked_sub(missing)
    }

    /// Recomputes `routes` from the members now in the roles: called
    /// wherever the table is built or changed.
    pub fn refresh_routes(&mut self, geometry: &Geometry) {
        self.routes = match geometry {
            Geometry::Draid(draid) => SpareRoutes::new(
                draid,
                self.by_role
                    .iter()
                    .map(|e| e.as_ref().map(|e| e.slot.member.name())),
            )
            .map(Arc::new),
            _ => None,
        };
    }

    /// The place that holds the bytes of `place` in `stripe`: itself, or
    /// for a role held by a distributed spare, the child that holds the
    /// spare's space there (see [`SpareRoutes`]). The chain passes a role
    /// only where it is usable and not being replaced: a replacement must
    /// see the writes to every column its role holds, so I/O to such a
    /// role goes to its member (the spare, which routes it itself).
    pub fn home(&self, place: &Place, stripe: u64) -> Place {
        match &self.routes {
            None => *place,
            Some(routes) => routes.home(place, |r| {
                self.usable(r, stripe) && self.replacing[r].is_none()
            }),
        }
    }

    /// Whether the bytes of `place` can be read in `stripe`: its home's
    /// member holds them.
    pub fn present(&self, place: &Place, stripe: u64) -> bool {
        let home = self.home(place, stripe);
        self.usable(home.member, stripe)
    }

    /// The places of `map` whose home is `role`: what `role` holds in the
    /// stripe, its own columns and the columns of spares whose space lies
    /// on it. Asked for a role that is not usable in the stripe (a rebuild,
    /// a read error being corrected) or being replaced, where every chain
    /// through the role ends at it.
    pub fn places_homed<'m>(&self, map: &'m StripeMap, role: usize) -> Vec<&'m Place> {
        let homed: Vec<&Place> = all_places(map)
            .filter(|p| self.home(p, map.stripe).member == role)
            .collect();
        debug_assert!(self.routes.is_some() || homed == places_of(map, role));
        homed
    }

    /// Whether a write to `target` (a member building a role) at `place`
    /// reaches a disk: a distributed spare writes on the child that holds
    /// its space there, through the children in sync (`SpareRouter`), and
    /// where that chain ends at a missing child the column cannot be
    /// placed now. It stays missing, homed at that child, and is rebuilt
    /// with it.
    pub fn reaches_disk(&self, target: &MemberEntry, place: &Place) -> bool {
        let (Some(routes), Some(spare)) = (
            &self.routes,
            crate::array::dspare::spare_index(target.slot.member.name()),
        ) else {
            return true;
        };
        let in_sync = |r: usize| self.entry(r).is_some_and(|e| e.rebuilt_below.is_none());
        let child = routes.spare_child(spare, place.member_sector);
        let home = routes.home(
            &Place {
                member: child,
                member_sector: place.member_sector,
            },
            in_sync,
        );
        in_sync(home.member) && routes.spare_of(home.member).is_none()
    }

    /// Roles that would leave no row at zero redundancy if the others
    /// were lost: in sync, or being rebuilt with the rows that were at
    /// zero redundancy without them already rebuilt (position.rs). What
    /// the time at zero redundancy counts.
    pub fn redundant(&self) -> Vec<bool> {
        self.by_role
            .iter()
            .map(|e| {
                e.as_ref().is_some_and(|e| {
                    e.rebuilt_below
                        .as_ref()
                        .is_none_or(|below| below.endangered_done())
                })
            })
            .collect()
    }

    /// Roles that are fully in sync.
    pub fn in_sync(&self) -> Vec<bool> {
        self.by_role
            .iter()
            .map(|e| e.as_ref().is_some_and(|e| e.rebuilt_below.is_none()))
            .collect()
    }
}

/// The places `role` holds in stripe `map` (data copies, P, Q), by the
/// geometry alone: [`MemberTable::places_homed`] adds the columns of
/// distributed spares whose space lies on the role.
pub(in crate::engine) fn places_of(map: &StripeMap, role: usize) -> Vec<&Place> {
    all_places(map).filter(|p| p.member == role).collect()
}

/// Every place of a stripe: data copies, then P, Q and R.
fn all_places(map: &StripeMap) -> impl Iterator<Item = &Place> {
    map.data
        .iter()
        .flat_map(|d| d.copies.iter())
        .chain(map.p.iter())
        .chain(map.q.iter())
        .chain(map.r.iter())
}
