//! The aarch64 vector type: NEON, with `tbl` lookups for multiplication.
//!
//! Every function here is an `unsafe fn` that executes NEON instructions; see
//! the contract in the [parent module](super).

use super::{nibble_tables, simd_entries, Simd, Vector};
use crate::parity::Syndrome;
use std::arch::aarch64::*;

#[derive(Clone, Copy)]
pub(in crate::parity) struct Neon(uint8x16_t);

impl Vector for Neon {
    const BYTES: usize = 16;
    type Mul = [uint8x16_t; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Neon(vdupq_n_u8(0))
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Neon(vld1q_u8(src))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        vst1q_u8(dst, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Neon(veorq_u8(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // An arithmetic shift by 7 spreads each byte's top bit over the byte:
        // 0xff where the doubling overflows, which selects 0x1d.
        let overflow = vreinterpretq_u8_s8(vshrq_n_s8::<7>(vreinterpretq_s8_u8(self.0)));
        let reduce = vandq_u8(overflow, vdupq_n_u8(0x1d));
        Neon(veorq_u8(vaddq_u8(self.0, self.0), reduce))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        let [lo, hi] = nibble_tables(c);
        [vld1q_u8(lo.as_ptr()), vld1q_u8(hi.as_ptr())]
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        let lo = vandq_u8(self.0, vdupq_n_u8(0x0f));
        let hi = vshrq_n_u8::<4>(self.0);
        Neon(veorq_u8(vqtbl1q_u8(m[0], lo), vqtbl1q_u8(m[1], hi)))
    }
}

simd_entries!(NeonSet, "neon", Neon, 4, "neon");

// SAFETY: handed out only by `detected`, after NEON was found.
static NEON: Simd<NeonSet> = unsafe { Simd::new() };

/// Every implementation's name, detected or not.
pub(in crate::parity) const NAMES: &[&str] = &["neon"];

/// The implementations this CPU runs.
pub(in crate::parity) fn detected() -> Vec<&'static dyn Syndrome> {
    if std::arch::is_aarch64_feature_detected!("neon") {
        vec![&NEON]
    } else {
        Vec::new()
    }
}
