//! Benchmarks behind `uraid bench`: measurements a user runs on their own
//! machine, never asserted in tests.

pub mod parity;
