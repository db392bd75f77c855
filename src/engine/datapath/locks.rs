//! Stripe locks: writes (and reads that reconstruct from parity) hold the
//! lock of the stripe they touch, so that two writes to one stripe never
//! interleave their data and parity updates, and a reconstruction never sees
//! a stripe half-written.
//!
//! The table is a fixed pool of mutexes indexed by a hash of the stripe
//! number: memory stays bounded whatever the array size, and two stripes
//! that share a slot merely wait for each other. A stripe worker takes the
//! locks of a whole round of rows at once, in slot order; the batched
//! rebuild takes a batch's in slot order too, and while it still holds an
//! earlier batch's it only tries (see engine/jobs/rebuild.rs); every other
//! thread holds at most one stripe lock at a time, so no cycle can form.

use std::sync::{Mutex, MutexGuard};

pub struct StripeLocks {
    slots: Vec<Mutex<()>>,
}

impl StripeLocks {
    pub fn new(slot_count: usize) -> StripeLocks {
        assert!(slot_count.is_power_of_two());
        StripeLocks {
            slots: (0..slot_count).map(|_| Mutex::new(())).collect(),
        }
    }

    pub fn lock(&self, stripe: u64) -> MutexGuard<'_, ()> {
        self.lock_slot(self.slot(stripe))
    }

    /// The slot that guards `stripe`.
    pub fn slot(&self, stripe: u64) -> usize {
        // Fibonacci hashing spreads neighbouring stripes over the table.
        let hash = stripe.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        hash as usize & (self.slots.len() - 1)
    }

    /// Locks one slot if no one holds it, the calling thread included: a
    /// thread that already holds slots out of ascending order may only try.
    pub fn try_lock_slot(&self, index: usize) -> Option<MutexGuard<'_, ()>> {
        match self.slots[index].try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Locks one slot. A thread taking several takes them in ascending order.
    pub fn lock_slot(&self, index: usize) -> MutexGuard<'_, ()> {
        // A poisoned lock means a thread panicked mid-stripe; the data path
        // stays usable (the panic itself is reported elsewhere).
        self.slots[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
