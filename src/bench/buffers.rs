//! The benchmark's data: I/O buffers aligned for O_DIRECT (the members'
//! `AlignedBuf`), filled with a pattern that depends only on the byte's
//! address, so that `--verify` can check any read against what must be
//! there whatever order concurrent writes landed in.

pub use crate::member::AlignedBuf;

/// The verify pattern: every 8-byte word holds its own byte address mixed
/// with a per-target salt. Offsets are multiples of 8 (requests are sector
/// aligned), so the pattern of a range depends on nothing else.
pub fn fill_pattern(buf: &mut [u8], offset: u64, salt: u64) {
    assert!(offset.is_multiple_of(8) && buf.len().is_multiple_of(8));
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        let address = offset + 8 * i as u64;
        word.copy_from_slice(&pattern_word(address, salt).to_le_bytes());
    }
}

/// The first byte address in `buf` (read at `offset`) that does not hold the
/// pattern, if any.
pub fn check_pattern(buf: &[u8], offset: u64, salt: u64) -> Option<u64> {
    assert!(offset.is_multiple_of(8) && buf.len().is_multiple_of(8));
    buf.chunks_exact(8).enumerate().find_map(|(i, word)| {
        let address = offset + 8 * i as u64;
        let expected = pattern_word(address, salt).to_le_bytes();
        (word != expected).then_some(address)
    })
}

fn pattern_word(address: u64, salt: u64) -> u64 {
    // A multiplicative hash, so that a block shifted by some sectors (a
    // mapping bug) does not read back as the pattern.
    (address ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Bytes for writes when not verifying: random once, so that no layer can
/// shortcut zeroes, and reused for every request.
pub fn noise(len: usize, seed: u64) -> AlignedBuf {
    use rand::{RngCore, SeedableRng};
    let mut buf = AlignedBuf::zeroed(len);
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trip_and_detects_shifts() {
        let mut a = AlignedBuf::zeroed(4096);
        fill_pattern(&mut a, 8192, 7);
        assert_eq!(check_pattern(&a, 8192, 7), None);
        // The same bytes are wrong one sector later, or with another salt.
        assert_eq!(check_pattern(&a, 8192 + 512, 7), Some(8192 + 512));
        assert_eq!(check_pattern(&a, 8192, 8), Some(8192));
        // A range read in two halves checks the same as whole.
        assert_eq!(check_pattern(&a[2048..], 8192 + 2048, 7), None);
        a[100] ^= 1;
        assert_eq!(check_pattern(&a, 8192, 7), Some(8192 + 96));
    }
}
