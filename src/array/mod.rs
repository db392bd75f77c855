//! An array assembled from its members: which member holds which role, where
//! each member's data starts, and the stripe-level data path over them.

mod assemble;
mod bitmap;
mod create;
pub mod dspare;
pub mod integrity;
mod reshape;
mod reshape_raid10;
mod resync;
pub mod scan;
mod stripe_io;
mod superblocks;
mod takeover;
mod update;

pub use assemble::{
    assemble, assemble_members, has_journal_feature, open_members, AssembleError, Assembled,
    DeviceState, FoundDevice,
};
pub use bitmap::{read_bitmap, read_bitmap_node, write_bitmap};
pub use create::{
    create, create_full, create_on_members, create_on_members_full, create_on_members_with_bitmap,
    create_with_bitmap, BitmapRequest, CreateError, CreateOptions, MemberSpec,
};
pub(crate) use create::{refuse_existing_content, Opened};
pub use dspare::{DistributedSpare, SpareArea, SpareRouter, SpareRoutes};
pub use reshape::{
    dirty_parity_members, lowest_data_offset, plan_reshape, reshape_backwards,
    reshape_removed_disks, room_after_data, MemberRoom, ReshapeContext, ReshapePlan,
    ReshapeRequest,
};
pub use resync::{
    places_read, resync, resync_ahead, resync_with, Finding, Pass, ReadAhead, ResyncReport,
};
pub use stripe_io::{recover_lost, StripeError, StripeIo};
pub use superblocks::{read_superblock, write_superblock, SuperblockError};
pub use takeover::{plan_level_change, raid6_twin, LevelChange, Roles, Takeover};
pub use update::{write_array_state, write_array_state_failing, Cleanliness, LostDevice};

use crate::member::MemberRef;

/// A member in its raid role, and where its data area starts.
#[derive(Clone)]
pub struct Slot {
    pub member: MemberRef,
    pub data_offset_bytes: u64,
}

/// The members of an array by raid role; `None` where a member is missing.
pub type Slots = Vec<Option<Slot>>;
#[cfg(test)]
mod tests;
