//! uraid: a user-space RAID engine, on-disk compatible with Linux md.
//!
//! The modules follow the layers of docs/ARCHITECTURE.md, from the bottom
//! up; a layer uses only those below it:
//! - pure: `units`, `format` (md superblocks), `geometry` (md's address
//!   mapping and dRAID's), `parity` (GF(2^8) P/Q/R);
//! - `member`: the storage trait and its backends (files, block devices,
//!   NBD exports, memory, fault, throttle and deadline wrappers);
//! - `array`: an assembled array offline (assembly, create, scan, resync,
//!   reshape on members);
//! - `engine`: a live array (requests, stripe cache, background jobs,
//!   journal, bitmap, reshape, failures and re-add);
//! - `export`: the NBD server; `control`: the control socket and the
//!   registry of served arrays; `config`: uraid.conf;
//! - beside them, reading only their outputs: `smart`, `doctor`, `plan`
//!   (the rebuild planner), `bench`, `tune` (the auto-tuner on bench's
//!   targets), `monitor` (control replies to events, mail, metrics);
//! - `cli`: the `uraid` command, one file per command.

pub mod array;
pub mod bench;
pub mod cli;
pub mod config;
pub mod control;
pub mod doctor;
pub mod engine;
pub mod export;
pub mod format;
pub mod geometry;
pub mod member;
pub mod monitor;
pub mod parity;
pub mod plan;
pub mod smart;
pub mod text;
pub mod tune;
pub mod units;
