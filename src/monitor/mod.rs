//! `uraid monitor`: watching served arrays and exporting what they report.

pub mod metrics;
