//! Unbounded version of tests/format_fuzz.rs: every decoder must survive any
//! input without panicking, and whatever decodes must re-encode to bytes
//! that decode to the same value.
//!
//! The first two input bytes choose the device size, so that the 1.0 and
//! 0.90 locations (which depend on it) are exercised too; the rest is the
//! buffer read at the superblock location.

#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid::format::{sb090, sb1, Metadata};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let device_sectors = 24 + u64::from(u16::from_le_bytes([data[0], data[1]])) * 64;
    let buf = &data[2..];

    for metadata in [Metadata::V1_0, Metadata::V1_1, Metadata::V1_2] {
        if let Ok(sb) = sb1::decode(buf, metadata, device_sectors) {
            let bytes = sb1::encode(&sb).expect("a decoded superblock must encode");
            assert_eq!(sb1::decode(&bytes, metadata, device_sectors), Ok(sb));
        }
    }
    if let Ok(sb) = sb1::decode_detached(buf) {
        let bytes = sb1::encode(&sb).expect("a decoded superblock must encode");
        assert_eq!(sb1::decode_detached(&bytes), Ok(sb));
    }
    if let Ok(sb) = sb090::decode(buf, device_sectors) {
        let bytes = sb090::encode(&sb).expect("a decoded 0.90 superblock must encode");
        assert_eq!(sb090::decode(&bytes, device_sectors), Ok(sb));
    }
});
