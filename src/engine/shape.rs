//! The engine's geometry, replaceable while the array serves.
//!
//! A size change (`manage --grow --size`) gives the array a new geometry.
//! For the levels whose size can change (raid1, raid4/5/6, raid10 near and
//! offset) every sector below both sizes lives at the same place in the old
//! and the new geometry: only the bounds move. So the request path may keep
//! using whichever geometry it looked up, and the lookup must stay as cheap
//! as the plain field it replaces (it runs several times per request).
//!
//! Each geometry the engine has had is kept, in a fixed table of slots that
//! are each set once; the current one is an index. A reader loads the index
//! and borrows the slot: no lock, no reference count, and a borrow stays
//! valid for as long as the engine lives. The table's size bounds how many
//! size changes one run of the engine takes (a restart starts afresh), which
//! is far more than a member swap-and-grow cycle needs.

use crate::geometry::Geometry;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Size changes one run of the engine takes.
const GEOMETRY_SLOTS: usize = 64;

pub(super) struct GeometryCell {
    slots: Box<[OnceLock<Geometry>]>,
    current: AtomicUsize,
    /// Serializes replacements (readers never take it).
    change: Mutex<()>,
}

impl GeometryCell {
    pub(super) fn new(geometry: Geometry) -> GeometryCell {
        let slots: Box<[OnceLock<Geometry>]> =
            (0..GEOMETRY_SLOTS).map(|_| OnceLock::new()).collect();
        slots[0].set(geometry).expect("a fresh slot");
        GeometryCell {
            slots,
            current: AtomicUsize::new(0),
            change: Mutex::new(()),
        }
    }

    pub(super) fn get(&self) -> &Geometry {
        self.slots[self.current.load(Ordering::Acquire)]
            .get()
            .expect("a slot is published only once set")
    }

    /// Whether another geometry can be taken (see the module notes).
    pub(super) fn can_replace(&self) -> bool {
        self.current.load(Ordering::Acquire) + 1 < self.slots.len()
    }

    /// Makes `geometry` the current one. Requests that already hold the
    /// previous one go on with it.
    pub(super) fn replace(&self, geometry: Geometry) -> Result<(), String> {
        let _change = self.change.lock().unwrap();
        let next = self.current.load(Ordering::Acquire) + 1;
        if next >= self.slots.len() {
            return Err(format!(
                "this run of uraid serve has changed the size {} times, its limit: restart it to change the size again",
                self.slots.len() - 1
            ));
        }
        self.slots[next]
            .set(geometry)
            .map_err(|_| "the geometry slot is taken".to_string())?;
        self.current.store(next, Ordering::Release);
        Ok(())
    }
}
