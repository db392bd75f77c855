//! The background jobs, which the control plane starts and the request
//! path only yields to: resync, check and repair (`resync`, in batches
//! by `scrub`), the rebuild of
//! a member and its batched copy (`rebuild`), reshape (`reshape`), size
//! changes (`resize`), level takeovers (`takeover`), and the scrub period
//! (`schedule`). `job` holds what they share: the action, its progress,
//! its outcome and the speed limits; `pace` the pacing by the clients'
//! latency (`rebuild_latency_target`).

pub(super) mod job;
pub mod pace;
pub(super) mod rebuild;
pub(super) mod reshape;
pub(super) mod resize;
pub(super) mod resync;
pub(super) mod schedule;
pub(super) mod scrub;
pub(super) mod takeover;
