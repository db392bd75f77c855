//! An NBD (Network Block Device) server for any [`BlockBackend`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use uraid::export::{nbd, MemoryBackend};
//!
//! let backend = Arc::new(MemoryBackend::new(64 << 20));
//! let listener: nbd::Listener = "unix:/run/uraid/md0.sock".parse().unwrap();
//! let server = nbd::serve(&listener, backend, nbd::ServeOptions::default()).unwrap();
//! // Clients connect to server.uri(), e.g. `nbdinfo nbd+unix:///?socket=/run/uraid/md0.sock`.
//! server.shutdown(); // answers what is in flight, then returns
//! ```
//!
//! What is implemented, from the protocol document (NetworkBlockDevice/nbd
//! `doc/proto.md`):
//!
//! - Handshake: fixed newstyle with NO_ZEROES; `OPT_EXPORT_NAME`, `OPT_LIST`,
//!   `OPT_INFO`/`OPT_GO` (INFO_EXPORT, NAME, DESCRIPTION, BLOCK_SIZE),
//!   `OPT_STRUCTURED_REPLY`, `OPT_ABORT` and `OPT_STARTTLS` (when
//!   [`ServeOptions::tls`] is set: see `tls`); everything else (meta
//!   contexts, extended headers) is answered `NBD_REP_ERR_UNSUP`. One export,
//!   reachable by its configured name or the empty name.
//! - Transmission: READ, WRITE, FLUSH, TRIM, WRITE_ZEROES (NO_HOLE,
//!   FAST_ZERO), CACHE (a hint passed to the backend), DISC, the FUA flag,
//!   and DF (trivially: a read is always answered with one data chunk).
//!   Structured replies are used for reads and errors when negotiated.
//! - Alignment: a client that asked for the block sizes in its OPT_GO must
//!   obey them, and its misaligned requests are refused. Any other client
//!   (OPT_EXPORT_NAME, or OPT_GO without NBD_INFO_BLOCK_SIZE) may address
//!   single bytes, the spec's default minimum block size of 1: the server
//!   cuts its requests at the backend's blocks and reads, modifies and
//!   writes back the partial ones, ordered against every other change of
//!   those blocks (see `unaligned`).
//! - Errors: EINVAL for unknown commands or flags, misaligned or out-of-range
//!   requests, and reads or writes beyond the maximum payload; EOVERFLOW
//!   only for a read with DF beyond it (the spec keeps EOVERFLOW for that);
//!   ENOSPC for writes past the end; EPERM for writes to a read-only
//!   export; ENOTSUP for a fast zero the backend cannot do fast; the
//!   backend's own errors mapped by [`proto::NbdError::from_io_error`].
//!
//! Concurrency: a pool of worker threads per connection takes turns reading
//! requests and each serves what it read, up to `max_inflight` at once;
//! replies are written whole under a per-connection lock, in completion
//! order. `NBD_FLAG_CAN_MULTI_CONN` is advertised only when the backend says
//! several connections are safe.
//!
//! [`BlockBackend`]: crate::export::BlockBackend

pub mod client;
mod conn;
mod fastpath;
mod io;
mod listen;
pub use crate::member::nbd::proto;
mod server;
#[cfg(test)]
mod tests_engine;
#[cfg(feature = "tls")]
mod tls;
#[cfg(not(feature = "tls"))]
#[path = "tls_off.rs"]
mod tls;
mod tls_config;
mod unaligned;

pub use listen::{BoundAddr, Listener};
pub use server::{serve, ServeOptions, ServerHandle, Stopper};
pub use tls::Tls;
pub use tls_config::{TlsCredentials, TlsMode};
