//! The portable implementation of [`Syndrome`], in safe Rust without SIMD.
//!
//! It works on 64-bit words holding eight field elements each ("SWAR"), as the
//! kernel's int.uc does: XOR is lane-wise already, and multiplication by g can be
//! done lane-wise with masks (see [`mul2_word`]). Multiplication by an arbitrary
//! constant is a sum of multiplications by powers of g, one per set bit.
//!
//! Syndromes are computed a chunk of [`CHUNK`] bytes at a time across all data
//! blocks, so that the P and Q accumulators stay in L1 cache (and largely in
//! registers) instead of being re-read from memory once per data block.
//!
//! Words are read and written with native byte order. Every operation here is
//! independent per byte lane, so the byte order does not change any result.

use super::{check_p_args, check_q_args, gf, r_exp, Syndrome};

/// The portable implementation. It runs everywhere and is the reference the
/// SIMD implementations are tested against.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scalar;

/// Words per chunk: 512 bytes keeps the four accumulators (P, Q, R and the
/// current data words) at 2 KiB, far inside any L1 cache.
const WORDS: usize = 64;
const CHUNK: usize = WORDS * 8;

type Words = [u64; WORDS];

/// The low seven bits of every byte lane.
const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
/// The top bit of every byte lane.
const HIGH1: u64 = 0x8080_8080_8080_8080;

/// 0x1d, the low eight bits of the field polynomial, in every byte lane.
const POLY_LOW: u64 = 0x1d1d_1d1d_1d1d_1d1d;

/// Multiplies each of the eight byte lanes of `v` by g = {02}.
///
/// Per lane this is [`gf::mul2`]: shift left within the lane (masking first so
/// no bit crosses into the next lane), and XOR 0x1d into the lanes whose top bit
/// was set. With `hi = v & HIGH1`, each lane j whose top bit is set contributes
/// 2^(8j+8) to `hi << 1` and 2^(8j) to `hi >> 7`, and (2^(8j+8) - 2^(8j)) is
/// 0xff in lane j and zero elsewhere; so `(hi << 1) - (hi >> 7)` (wrapping, as
/// lane 7's 2^64 leaves the word) is 0xff in exactly those lanes. This is the
/// kernel's int.uc trick; unlike a multiplication by 0x1d it vectorises.
#[inline(always)]
fn mul2_word(v: u64) -> u64 {
    let hi = v & HIGH1;
    let overflowed = (hi << 1).wrapping_sub(hi >> 7);
    ((v & LOW7) << 1) ^ (overflowed & POLY_LOW)
}

/// Multiplication of byte lanes by one constant c, prepared for branch-free use.
///
/// With c = Σ_i c_i·2^i (bits c_i), c·v = Σ_{i: c_i = 1} g^i·v in GF(2^8),
/// because {02}^i is the field element whose only set bit is bit i. So the
/// product is an XOR of successive doublings of v, selected by c's bits. The
/// selection uses all-ones/all-zero masks rather than branches, so the inner
/// loops have a fixed shape the compiler can unroll and vectorise.
#[derive(Clone, Copy)]
struct MulConst {
    /// `masks[i]` is all ones if bit i of c is set, else zero.
    masks: [u64; 8],
}

impl MulConst {
    #[inline(always)]
    fn new(c: u8) -> Self {
        MulConst {
            masks: std::array::from_fn(|i| 0u64.wrapping_sub(u64::from((c >> i) & 1))),
        }
    }

    /// c·v in each of the eight byte lanes of `v`.
    #[inline(always)]
    fn apply(&self, mut v: u64) -> u64 {
        let mut product = v & self.masks[0];
        for mask in &self.masks[1..] {
            v = mul2_word(v);
            product ^= v & mask;
        }
        product
    }
}

/// Multiplies each byte lane of `v` by the constant `c`.
#[cfg(test)]
fn mul_const_word(v: u64, c: u8) -> u64 {
    MulConst::new(c).apply(v)
}

/// Multiplies every byte lane of `words` by g^shift.
#[inline(always)]
fn mul_pow2_words(words: &mut [u64], shift: u8) {
    match shift {
        0 => {}
        1 => words.iter_mut().for_each(|w| *w = mul2_word(*w)),
        _ => {
            let c = MulConst::new(gf::pow2(shift));
            words.iter_mut().for_each(|w| *w = c.apply(*w));
        }
    }
}

/// Reads `src` (at most [`CHUNK`] bytes) into the front of `dst` as words,
/// zero-padding a final partial word, and returns the number of words filled.
#[inline(always)]
fn load(dst: &mut Words, src: &[u8]) -> usize {
    debug_assert!(src.len() <= CHUNK);
    let n = src.len().div_ceil(8);
    load_slice(&mut dst[..n], src);
    n
}

/// Reads `src` into `dst`, which must hold exactly `src.len().div_ceil(8)` words.
///
/// A final partial word is zero-padded; those lanes past the end take part in
/// the arithmetic but are never stored, and lanes do not interact.
#[inline(always)]
fn load_slice(dst: &mut [u64], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len().div_ceil(8));
    let full = src.chunks_exact(8);
    let rest = full.remainder();
    for (word, bytes) in dst.iter_mut().zip(full) {
        *word = u64::from_ne_bytes(bytes.try_into().expect("chunks_exact(8)"));
    }
    if !rest.is_empty() {
        let mut padded = [0u8; 8];
        padded[..rest.len()].copy_from_slice(rest);
        dst[src.len() / 8] = u64::from_ne_bytes(padded);
    }
}

/// Writes the first `dst.len()` bytes held in `src` to `dst` (at most [`CHUNK`]).
#[inline(always)]
fn store(src: &Words, dst: &mut [u8]) {
    debug_assert!(dst.len() <= CHUNK);
    let n = dst.len() / 8;
    let mut full = dst.chunks_exact_mut(8);
    for (bytes, word) in (&mut full).zip(src.iter()) {
        bytes.copy_from_slice(&word.to_ne_bytes());
    }
    let rest = full.into_remainder();
    if !rest.is_empty() {
        let len = rest.len();
        rest.copy_from_slice(&src[n].to_ne_bytes()[..len]);
    }
}

/// The order in which [`Scalar::gen_q_chunked`] visits the data blocks.
///
/// Horner's rule evaluates Σ g^{e_k}·D_k with one multiplication by g per
/// step when the exponents are 0..n-1: Q = (((D_{n-1})·g + D_{n-2})·g + ...)·g + D_0.
/// With arbitrary distinct exponents the same idea still works once the blocks
/// are visited in decreasing exponent order: between two consecutive blocks
/// with exponents a > b the accumulator is multiplied by g^(a-b), and at the
/// end by g^(smallest exponent). By induction, after visiting the blocks with
/// exponents e_1 > ... > e_j the accumulator is Σ_{i<=j} g^(e_i - e_j)·D_i, so
/// the final multiplication by g^(e_n) yields Σ g^(e_i)·D_i. For md's usual
/// contiguous exponents every step is the cheap multiplication by g.
pub(super) struct HornerPlan {
    /// (data block index, shift applied to the accumulator before adding that
    /// block); the first entry's shift is unused.
    steps: [(u8, u8); gf::ORDER],
    len: usize,
    /// The smallest exponent, by which the accumulator is finally multiplied.
    pub(super) final_shift: u8,
}

impl HornerPlan {
    /// Builds the plan for exponents already checked to be distinct and < 255.
    pub(super) fn new(exps: &[u8]) -> Self {
        assert!(!exps.is_empty() && exps.len() <= gf::ORDER);
        // At most 255 blocks, so indices are at most 254 and u8::MAX is free to
        // mean "no block has this exponent".
        let mut by_exp = [u8::MAX; gf::ORDER];
        for (k, &e) in exps.iter().enumerate() {
            debug_assert_eq!(by_exp[e as usize], u8::MAX);
            by_exp[e as usize] = k as u8;
        }
        let mut plan = HornerPlan {
            steps: [(0, 0); gf::ORDER],
            len: 0,
            final_shift: 0,
        };
        let mut previous: Option<u8> = None;
        for e in (0..gf::ORDER as u8).rev() {
            let k = by_exp[e as usize];
            if k != u8::MAX {
                let shift = previous.map_or(0, |p| p - e);
                plan.steps[plan.len] = (k, shift);
                plan.len += 1;
                previous = Some(e);
            }
        }
        assert_eq!(plan.len, exps.len());
        plan.final_shift = previous.expect("at least one exponent");
        plan
    }

    pub(super) fn steps(&self) -> &[(u8, u8)] {
        &self.steps[..self.len]
    }
}

/// The Q and R multipliers for a Horner step of `shift`: g^shift and its
/// square 4^shift = g^(2·shift mod 255) (see [`r_exp`]).
#[inline(always)]
fn mul_pow2_qr(q: &mut [u64], r: Option<&mut [u64]>, shift: u8) {
    mul_pow2_words(q, shift);
    if let Some(r) = r {
        mul_pow2_words(r, r_exp(shift));
    }
}

impl Scalar {
    /// Computes Q, and P and R as well if they are given, in one pass over the
    /// data.
    ///
    /// R is evaluated by the same Horner order as Q (see [`HornerPlan`]) with
    /// base 4 = g^2: between blocks with exponents a > b its accumulator is
    /// multiplied by 4^(a-b), the square of Q's multiplier, and at the end by
    /// 4^(smallest exponent), so it ends as Σ 4^(e_k)·D_k.
    ///
    /// Arguments must already be checked (equal lengths, distinct exponents).
    fn gen_q_chunked(
        &self,
        data: &[&[u8]],
        exps: &[u8],
        mut p: Option<&mut [u8]>,
        q: &mut [u8],
        mut r: Option<&mut [u8]>,
    ) {
        let len = q.len();
        if data.is_empty() {
            // The empty sum is zero.
            q.fill(0);
            for out in [p, r].into_iter().flatten() {
                out.fill(0);
            }
            return;
        }
        let want_r = r.is_some();
        let plan = HornerPlan::new(exps);
        let steps = plan.steps();
        let mut p_words: Words = [0; WORDS];
        let mut q_words: Words = [0; WORDS];
        let mut r_words: Words = [0; WORDS];
        let mut d_words: Words = [0; WORDS];
        for start in (0..len).step_by(CHUNK) {
            let end = len.min(start + CHUNK);
            let (first, _) = steps[0];
            let n = load(&mut q_words, &data[first as usize][start..end]);
            let (pw, qw, dw) = (&mut p_words[..n], &mut q_words[..n], &mut d_words[..n]);
            let rw = &mut r_words[..n];
            pw.copy_from_slice(qw);
            if want_r {
                rw.copy_from_slice(qw);
            }
            for &(k, shift) in &steps[1..] {
                load_slice(dw, &data[k as usize][start..end]);
                match (shift, want_r) {
                    // The common contiguous case, fused into one loop.
                    (1, false) => {
                        for ((p, q), d) in pw.iter_mut().zip(qw.iter_mut()).zip(dw.iter()) {
                            *p ^= d;
                            *q = mul2_word(*q) ^ d;
                        }
                    }
                    (1, true) => {
                        let accumulators = pw.iter_mut().zip(qw.iter_mut()).zip(rw.iter_mut());
                        for (((p, q), r), d) in accumulators.zip(dw.iter()) {
                            *p ^= d;
                            *q = mul2_word(*q) ^ d;
                            *r = mul2_word(mul2_word(*r)) ^ d;
                        }
                    }
                    _ => {
                        mul_pow2_qr(qw, want_r.then_some(&mut *rw), shift);
                        for ((p, q), d) in pw.iter_mut().zip(qw.iter_mut()).zip(dw.iter()) {
                            *p ^= d;
                            *q ^= d;
                        }
                        if want_r {
                            rw.iter_mut().zip(dw.iter()).for_each(|(r, d)| *r ^= d);
                        }
                    }
                }
            }
            mul_pow2_qr(qw, want_r.then_some(&mut *rw), plan.final_shift);
            store(&q_words, &mut q[start..end]);
            if let Some(p) = p.as_deref_mut() {
                store(&p_words, &mut p[start..end]);
            }
            if let Some(r) = r.as_deref_mut() {
                store(&r_words, &mut r[start..end]);
            }
        }
    }
}

/// Applies `f(dst_word, src_word) -> new dst_word` to every 8-byte word of `dst`
/// and `src`, and to the final partial word zero-padded.
#[inline(always)]
fn zip_words(dst: &mut [u8], src: &[u8], f: impl Fn(u64, u64) -> u64) {
    debug_assert_eq!(dst.len(), src.len());
    let mut dst_full = dst.chunks_exact_mut(8);
    let mut src_full = src.chunks_exact(8);
    for (d, s) in (&mut dst_full).zip(&mut src_full) {
        let dw = u64::from_ne_bytes((&*d).try_into().expect("chunks_exact(8)"));
        let sw = u64::from_ne_bytes(s.try_into().expect("chunks_exact(8)"));
        d.copy_from_slice(&f(dw, sw).to_ne_bytes());
    }
    let (d, s) = (dst_full.into_remainder(), src_full.remainder());
    if !d.is_empty() {
        let (mut dp, mut sp) = ([0u8; 8], [0u8; 8]);
        dp[..d.len()].copy_from_slice(d);
        sp[..s.len()].copy_from_slice(s);
        let r = f(u64::from_ne_bytes(dp), u64::from_ne_bytes(sp)).to_ne_bytes();
        let len = d.len();
        d.copy_from_slice(&r[..len]);
    }
}

impl Syndrome for Scalar {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        let len = p.len();
        check_p_args(data, len);
        let Some((first, rest)) = data.split_first() else {
            p.fill(0);
            return;
        };
        let mut p_words: Words = [0; WORDS];
        let mut d_words: Words = [0; WORDS];
        for start in (0..len).step_by(CHUNK) {
            let end = len.min(start + CHUNK);
            let n = load(&mut p_words, &first[start..end]);
            let (pw, dw) = (&mut p_words[..n], &mut d_words[..n]);
            for block in rest {
                load_slice(dw, &block[start..end]);
                pw.iter_mut().zip(dw.iter()).for_each(|(p, d)| *p ^= d);
            }
            store(&p_words, &mut p[start..end]);
        }
    }

    fn gen_pq(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8]) {
        let len = p.len();
        assert_eq!(q.len(), len, "parity: P and Q lengths differ");
        check_q_args(data, exps, len);
        self.gen_q_chunked(data, exps, Some(p), q, None);
    }

    fn gen_pqr(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8], r: &mut [u8]) {
        let len = p.len();
        assert!(
            q.len() == len && r.len() == len,
            "parity: P, Q and R lengths differ"
        );
        check_q_args(data, exps, len);
        self.gen_q_chunked(data, exps, Some(p), q, Some(r));
    }

    fn gen_q(&self, data: &[&[u8]], exps: &[u8], q: &mut [u8]) {
        check_q_args(data, exps, q.len());
        self.gen_q_chunked(data, exps, None, q, None);
    }

    fn xor_into(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "parity: xor_into lengths differ");
        zip_words(dst, src, |d, s| d ^ s);
    }

    fn mul_acc(&self, dst: &mut [u8], src: &[u8], coef: u8) {
        assert_eq!(dst.len(), src.len(), "parity: mul_acc lengths differ");
        match coef {
            0 => {}
            1 => zip_words(dst, src, |d, s| d ^ s),
            _ => {
                let c = MulConst::new(coef);
                zip_words(dst, src, |d, s| d ^ c.apply(s));
            }
        }
    }

    fn scale(&self, buf: &mut [u8], coef: u8) {
        match coef {
            0 => buf.fill(0),
            1 => {}
            _ => {
                let c = MulConst::new(coef);
                let mut full = buf.chunks_exact_mut(8);
                for bytes in &mut full {
                    let w = u64::from_ne_bytes((&*bytes).try_into().expect("chunks_exact(8)"));
                    bytes.copy_from_slice(&c.apply(w).to_ne_bytes());
                }
                for b in full.into_remainder() {
                    *b = gf::mul(*b, coef);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::implementations;
    use crate::parity::testutil::*;
    use proptest::prelude::*;

    /// Lengths around the word and chunk boundaries, where off-by-one errors live.
    const LENGTHS: [usize; 14] = [0, 1, 7, 8, 9, 63, 64, 511, 512, 513, 1000, 4096, 4097, 9000];

    #[test]
    fn mul2_word_matches_gf_in_every_lane() {
        for a in 0..=255u8 {
            let word = u64::from_ne_bytes([a, !a, a ^ 0x80, 0, 0x80, a, 0xff, a.rotate_left(3)]);
            let expected = word.to_ne_bytes().map(gf::mul2);
            assert_eq!(mul2_word(word).to_ne_bytes(), expected);
        }
    }

    #[test]
    fn mul_const_word_matches_gf_for_all_pairs() {
        for c in 0..=255u8 {
            for a in (0..=255u8).step_by(8) {
                let lanes: [u8; 8] = std::array::from_fn(|i| a + i as u8);
                let word = u64::from_ne_bytes(lanes);
                let expected = lanes.map(|x| mul_bitwise(x, c));
                assert_eq!(mul_const_word(word, c).to_ne_bytes(), expected, "c={c}");
            }
        }
    }

    #[test]
    fn horner_plan_visits_exponents_in_decreasing_order() {
        let plan = HornerPlan::new(&[2, 3, 4]);
        assert_eq!(plan.steps(), &[(2, 0), (1, 1), (0, 1)]);
        assert_eq!(plan.final_shift, 2);

        let plan = HornerPlan::new(&[7, 0, 200]);
        assert_eq!(plan.steps(), &[(2, 0), (0, 193), (1, 7)]);
        assert_eq!(plan.final_shift, 0);

        let all: Vec<u8> = (0..=254).collect();
        let plan = HornerPlan::new(&all);
        assert_eq!(plan.steps().len(), 255);
        assert!(plan.steps()[1..].iter().all(|&(_, shift)| shift == 1));
    }

    #[test]
    fn gen_pq_matches_reference_for_random_stripes() {
        let mut rng = rng(1);
        for imp in implementations() {
            for len in LENGTHS {
                for n in [0, 1, 2, 3, 5, 8, 16, 31, 100, 255] {
                    for exps in [(0..n as u8).collect(), random_exps(&mut rng, n)] {
                        let data = random_blocks(&mut rng, n, len);
                        let slices = as_slices(&data);
                        let (mut p, mut q) = (vec![0xa5; len], vec![0x5a; len]);
                        imp.gen_pq(&slices, &exps, &mut p, &mut q);
                        let context = format!("{} len={len} exps={exps:?}", imp.name());
                        assert_eq!(p, reference_p(&data, len), "P {context}");
                        assert_eq!(q, reference_q(&data, &exps, len), "Q {context}");

                        let mut q_only = vec![0x33; len];
                        imp.gen_q(&slices, &exps, &mut q_only);
                        assert_eq!(q_only, q, "gen_q {context}");
                        let mut p_only = vec![0x33; len];
                        imp.gen_p(&slices, &mut p_only);
                        assert_eq!(p_only, p, "gen_p {context}");
                    }
                }
            }
        }
    }

    #[test]
    fn gen_pqr_matches_reference_for_random_stripes() {
        let mut rng = rng(4);
        for imp in implementations() {
            for len in LENGTHS {
                for n in [0, 1, 2, 3, 5, 8, 20, 255] {
                    // exponent_sets' sparse set stops at 17 blocks; 7 is
                    // coprime to 255, so k·7 mod 255 is distinct for any n.
                    let mut sets = vec![(0..n).map(|k| (k * 7 % 255) as u8).collect()];
                    if n <= 16 {
                        sets.extend(exponent_sets(&mut rng, n));
                    } else {
                        sets.push(random_exps(&mut rng, n));
                    }
                    for exps in sets {
                        let data = random_blocks(&mut rng, n, len);
                        let (mut p, mut q, mut r) =
                            (vec![0xa5; len], vec![0x5a; len], vec![3; len]);
                        imp.gen_pqr(&as_slices(&data), &exps, &mut p, &mut q, &mut r);
                        let context = format!("{} len={len} exps={exps:?}", imp.name());
                        assert_eq!(p, reference_p(&data, len), "P {context}");
                        assert_eq!(q, reference_q(&data, &exps, len), "Q {context}");
                        assert_eq!(r, reference_r(&data, &exps, len), "R {context}");
                    }
                }
            }
        }
    }

    #[test]
    fn gen_pq_of_zero_data_is_zero() {
        for imp in implementations() {
            let zero = vec![0u8; 4097];
            let data: Vec<&[u8]> = vec![&zero; 4];
            let (mut p, mut q) = (vec![1u8; 4097], vec![2u8; 4097]);
            imp.gen_pq(&data, &[9, 0, 254, 17], &mut p, &mut q);
            assert!(p.iter().chain(&q).all(|&b| b == 0));
        }
    }

    /// Delegates everything to [`Scalar`] except `gen_q` and `gen_pqr`, so that
    /// the trait's defaults are tested too (future implementations may rely
    /// on them).
    struct DefaultGenQ;

    impl Syndrome for DefaultGenQ {
        fn name(&self) -> &'static str {
            "default-gen-q"
        }
        fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
            Scalar.gen_p(data, p)
        }
        fn gen_pq(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8]) {
            Scalar.gen_pq(data, exps, p, q)
        }
        fn xor_into(&self, dst: &mut [u8], src: &[u8]) {
            Scalar.xor_into(dst, src)
        }
        fn mul_acc(&self, dst: &mut [u8], src: &[u8], coef: u8) {
            Scalar.mul_acc(dst, src, coef)
        }
        fn scale(&self, buf: &mut [u8], coef: u8) {
            Scalar.scale(buf, coef)
        }
    }

    #[test]
    fn default_gen_q_and_gen_pqr_match_reference() {
        let mut rng = rng(2);
        for len in [0, 1, 7, 64, 4096] {
            for n in [0, 1, 4, 16] {
                let exps = random_exps(&mut rng, n);
                let data = random_blocks(&mut rng, n, len);
                let mut q = vec![0xee; len];
                DefaultGenQ.gen_q(&as_slices(&data), &exps, &mut q);
                assert_eq!(q, reference_q(&data, &exps, len));
                let (mut p, mut r) = (vec![1; len], vec![3; len]);
                DefaultGenQ.gen_pqr(&as_slices(&data), &exps, &mut p, &mut q, &mut r);
                assert_eq!(p, reference_p(&data, len));
                assert_eq!(q, reference_q(&data, &exps, len));
                assert_eq!(r, reference_r(&data, &exps, len));
            }
        }
    }

    #[test]
    fn elementwise_ops_match_reference_for_every_coefficient() {
        let mut rng = rng(3);
        for imp in implementations() {
            for len in LENGTHS {
                let src = random_blocks(&mut rng, 1, len).remove(0);
                let dst = random_blocks(&mut rng, 1, len).remove(0);

                let mut x = dst.clone();
                imp.xor_into(&mut x, &src);
                let expected: Vec<u8> = dst.iter().zip(&src).map(|(d, s)| d ^ s).collect();
                assert_eq!(x, expected, "xor_into len={len}");

                for coef in 0..=255u8 {
                    let mut acc = dst.clone();
                    imp.mul_acc(&mut acc, &src, coef);
                    let expected: Vec<u8> = dst
                        .iter()
                        .zip(&src)
                        .map(|(d, s)| d ^ mul_bitwise(coef, *s))
                        .collect();
                    assert_eq!(acc, expected, "mul_acc coef={coef} len={len}");

                    let mut scaled = src.clone();
                    imp.scale(&mut scaled, coef);
                    let expected: Vec<u8> = src.iter().map(|s| mul_bitwise(coef, *s)).collect();
                    assert_eq!(scaled, expected, "scale coef={coef} len={len}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn mul_acc_is_linear(
            a in proptest::collection::vec(any::<u8>(), 0..600),
            coef in any::<u8>(),
            coef2 in any::<u8>(),
        ) {
            // (c1 + c2)·a = c1·a + c2·a, and c·(c^-1·a) = a, over any slice length.
            let scalar = Scalar;
            let mut sum = vec![0u8; a.len()];
            scalar.mul_acc(&mut sum, &a, coef);
            scalar.mul_acc(&mut sum, &a, coef2);
            let mut direct = a.clone();
            scalar.scale(&mut direct, coef ^ coef2);
            prop_assert_eq!(&sum, &direct);
            if coef != 0 {
                let mut round_trip = a.clone();
                scalar.scale(&mut round_trip, coef);
                scalar.scale(&mut round_trip, gf::inv(coef));
                prop_assert_eq!(&round_trip, &a);
            }
        }
    }
}
