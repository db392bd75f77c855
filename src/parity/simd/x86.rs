//! x86-64 vector types: SSSE3 and AVX2 (byte-shuffle multiplication),
//! AVX-512BW, and GFNI at 256 and 512 bits (affine multiplication).
//!
//! Every function here is an `unsafe fn` that executes the instructions of its
//! type's feature set; see the contract in the [parent module](super).

use super::{affine_matrix, nibble_tables, simd_entries, Simd, Vector, AFFINE_MATRICES};
use crate::parity::Syndrome;
use std::arch::x86_64::*;

/// The low eight bits of md's polynomial, 0x11d, as an i8 for `set1`.
const POLY: i8 = 0x1d;

/// g's affine matrix, for multiplication by g with GFNI.
const MATRIX_2: i64 = affine_matrix(2) as i64;

#[derive(Clone, Copy)]
pub(in crate::parity) struct Ssse3(__m128i);

impl Vector for Ssse3 {
    const BYTES: usize = 16;
    type Mul = [__m128i; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Ssse3(_mm_setzero_si128())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Ssse3(_mm_loadu_si128(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm_storeu_si128(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Ssse3(_mm_xor_si128(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // Bytes with the top bit set are negative as i8: those get 0x1d.
        let overflow = _mm_cmpgt_epi8(_mm_setzero_si128(), self.0);
        let reduce = _mm_and_si128(overflow, _mm_set1_epi8(POLY));
        Ssse3(_mm_xor_si128(_mm_add_epi8(self.0, self.0), reduce))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        let [lo, hi] = nibble_tables(c);
        [
            _mm_loadu_si128(lo.as_ptr().cast()),
            _mm_loadu_si128(hi.as_ptr().cast()),
        ]
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        let low4 = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(self.0, low4);
        let hi = _mm_and_si128(_mm_srli_epi64::<4>(self.0), low4);
        Ssse3(_mm_xor_si128(
            _mm_shuffle_epi8(m[0], lo),
            _mm_shuffle_epi8(m[1], hi),
        ))
    }
}

#[derive(Clone, Copy)]
pub(in crate::parity) struct Avx2(__m256i);

impl Vector for Avx2 {
    const BYTES: usize = 32;
    type Mul = [__m256i; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx2(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx2(_mm256_loadu_si256(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx2(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        let overflow = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
        let reduce = _mm256_and_si256(overflow, _mm256_set1_epi8(POLY));
        Avx2(_mm256_xor_si256(_mm256_add_epi8(self.0, self.0), reduce))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        // vpshufb looks up within each 128-bit lane, so both lanes hold the table.
        let [lo, hi] = nibble_tables(c);
        let lane = |t: &[u8; 16]| _mm_loadu_si128(t.as_ptr().cast());
        [
            _mm256_broadcastsi128_si256(lane(lo)),
            _mm256_broadcastsi128_si256(lane(hi)),
        ]
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        let low4 = _mm256_set1_epi8(0x0f);
        let lo = _mm256_and_si256(self.0, low4);
        let hi = _mm256_and_si256(_mm256_srli_epi64::<4>(self.0), low4);
        Avx2(_mm256_xor_si256(
            _mm256_shuffle_epi8(m[0], lo),
            _mm256_shuffle_epi8(m[1], hi),
        ))
    }
}

#[derive(Clone, Copy)]
pub(in crate::parity) struct Avx512(__m512i);

impl Vector for Avx512 {
    const BYTES: usize = 64;
    type Mul = [__m512i; 2];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx512(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx512(_mm512_loadu_si512(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx512(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // The top bit of each byte, as a mask register, selects the 0x1d bytes.
        let overflow = _mm512_movepi8_mask(self.0);
        let reduce = _mm512_maskz_mov_epi8(overflow, _mm512_set1_epi8(POLY));
        Avx512(_mm512_xor_si512(_mm512_add_epi8(self.0, self.0), reduce))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        let [lo, hi] = nibble_tables(c);
        let lane = |t: &[u8; 16]| _mm_loadu_si128(t.as_ptr().cast());
        [
            _mm512_broadcast_i32x4(lane(lo)),
            _mm512_broadcast_i32x4(lane(hi)),
        ]
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        let low4 = _mm512_set1_epi8(0x0f);
        let lo = _mm512_and_si512(self.0, low4);
        let hi = _mm512_and_si512(_mm512_srli_epi64::<4>(self.0), low4);
        Avx512(_mm512_xor_si512(
            _mm512_shuffle_epi8(m[0], lo),
            _mm512_shuffle_epi8(m[1], hi),
        ))
    }
}

/// AVX-512 registers with GFNI multiplication: one affine instruction per
/// multiplication, by g or by any constant.
#[derive(Clone, Copy)]
pub(in crate::parity) struct Gfni512(__m512i);

impl Vector for Gfni512 {
    const BYTES: usize = 64;
    type Mul = __m512i;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Gfni512(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Gfni512(_mm512_loadu_si512(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Gfni512(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        self.mul(&_mm512_set1_epi64(MATRIX_2))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        _mm512_set1_epi64(AFFINE_MATRICES[c as usize] as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        Gfni512(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, *m))
    }
}

/// AVX2 registers with GFNI multiplication, for CPUs with GFNI but without
/// AVX-512 (or where 512-bit instructions lower the clock).
#[derive(Clone, Copy)]
pub(in crate::parity) struct Gfni256(__m256i);

impl Vector for Gfni256 {
    const BYTES: usize = 32;
    type Mul = __m256i;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Gfni256(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Gfni256(_mm256_loadu_si256(src.cast()))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst.cast(), self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Gfni256(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        self.mul(&_mm256_set1_epi64x(MATRIX_2))
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        _mm256_set1_epi64x(AFFINE_MATRICES[c as usize] as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, m: &Self::Mul) -> Self {
        Gfni256(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, *m))
    }
}

simd_entries!(Ssse3Set, "ssse3", Ssse3, 4, "ssse3");
simd_entries!(Avx2Set, "avx2", Avx2, 4, "avx2");
simd_entries!(Avx512Set, "avx512bw", Avx512, 4, "avx512f,avx512bw");
simd_entries!(Gfni256Set, "gfni-avx2", Gfni256, 4, "avx2,gfni");
// GFNI at 512 bits walks eight vectors (512 bytes) of every block per
// group: page-aligned blocks all share L1 sets, and the longer run per
// block keeps more lines in flight. Measured against four on this
// project's Zen 4 (docs/BENCHMARKS.md, "Parity"), gen P+Q over
// ISA-L: 4 x 64K 1.15 against 0.99, 14 x 4K 1.59-1.70 against 1.43; four
// is ahead at 8 x 4K (1.44-1.51 against 1.31), both are above ISA-L
// everywhere. It has 32 registers for the 24 (P, Q, data) it needs.
simd_entries!(Gfni512Set, "gfni", Gfni512, 8, "avx512f,avx512bw,gfni");

// SAFETY (all five): these values are only handed out by `detected`, after
// the CPU was found to have the instruction set.
static SSSE3: Simd<Ssse3Set> = unsafe { Simd::new() };
static AVX2: Simd<Avx2Set> = unsafe { Simd::new() };
static AVX512: Simd<Avx512Set> = unsafe { Simd::new() };
static GFNI256: Simd<Gfni256Set> = unsafe { Simd::new() };
static GFNI512: Simd<Gfni512Set> = unsafe { Simd::new() };

/// Every implementation's name, detected or not, in [`detected`]'s order.
pub(in crate::parity) const NAMES: &[&str] = &["ssse3", "avx2", "avx512bw", "gfni-avx2", "gfni"];

/// The implementations this CPU runs, roughly slowest first.
pub(in crate::parity) fn detected() -> Vec<&'static dyn Syndrome> {
    let mut found: Vec<&'static dyn Syndrome> = Vec::new();
    if is_x86_feature_detected!("ssse3") {
        found.push(&SSSE3);
    }
    if is_x86_feature_detected!("avx2") {
        found.push(&AVX2);
    }
    let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    if avx512 {
        found.push(&AVX512);
    }
    let gfni = is_x86_feature_detected!("gfni");
    if gfni && is_x86_feature_detected!("avx2") {
        found.push(&GFNI256);
    }
    if gfni && avx512 {
        found.push(&GFNI512);
    }
    found
}
