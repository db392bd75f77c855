//! uraid: a user-space RAID engine, on-disk compatible with Linux md.
//!
//! The modules follow the layers of docs/ARCHITECTURE.md, from the bottom up:
//! `format` (md superblocks, pure), `geometry` (md's address mapping, pure),
//! `parity` (GF(2^8) P/Q, pure), `member` (the storage trait and its backends),
//! `array` (an assembled array: its levels' I/O over members), and `cli`.

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
pub mod tune;
pub mod units;
