//! RAID parity: md's P and Q syndromes over GF(2^8), dRAID's third syndrome R,
//! and recovery from them.
//!
//! This layer is pure code: it computes on byte slices and does no I/O.
//!
//! # The algebra
//!
//! A stripe has data blocks D_k, each with a coefficient exponent e_k in 0..=254,
//! and up to three parity blocks, computed bytewise in GF(2^8) (see [`gf`]):
//!
//! ```text
//! P = Σ_k D_k               (XOR)
//! Q = Σ_k g^{e_k} · D_k     (g = {02})
//! R = Σ_k 4^{e_k} · D_k     (4 = g^2; dRAID's triple parity, md has no R)
//! ```
//!
//! md's coefficient order depends on the layout, and DDF layouts leave gaps (for
//! example exponents 2, 3, 4), so every function that computes or uses Q takes an
//! explicit exponent per data block rather than assuming 0, 1, 2, ... Exponents
//! of one stripe must be distinct: two blocks sharing a coefficient could not be
//! told apart by Q.
//!
//! R's coefficient for block k is the square of its Q coefficient a_k = g^{e_k}:
//! 4^{e_k} = g^{2·e_k mod 255}, because g^255 = 1. What R needs is therefore
//! that the a_k be distinct (and they are nonzero), which distinct exponents in
//! 0..=254 give: then the rows (1, a_k, a_k^2) of P, Q and R form a Vandermonde
//! matrix, and any loss of up to three blocks among the data, P, Q and R can be
//! rebuilt (see [`rebuild`](mod@rebuild)). Since doubling modulo 255 permutes
//! 0..=254, R is also the Q of the exponents 2·e_k mod 255 ([`r_exps`]), which
//! lets every Q routine serve R.
//!
//! # Implementations
//!
//! The bulk work is behind the object-safe [`Syndrome`] trait so that SIMD
//! implementations can be added next to the portable [`Scalar`] one and chosen
//! at run time ([`implementations`], [`default_impl`]). The recovery functions in
//! [`recover`] (md's RAID-6 cases) and the selector [`rebuild()`] for every
//! loss pattern of up to three parity blocks are written once, on top of the
//! trait, and are re-exported here.

pub mod gf;
pub mod locate;
pub mod rebuild;
pub mod recover;
mod scalar;
mod select;
mod simd;

#[cfg(test)]
mod testutil;

pub use locate::{correct_data, locate, Culprit, Syndromes};
pub use rebuild::{plan_rebuild, rebuild, LostData, LostParity, Path, Survivors, TooManyLost};
pub use recover::{recover_data_from_p, recover_data_from_q, recover_two_data};
pub use scalar::Scalar;
pub use select::{by_name, default_impl, select, select_from_env, ENV_VAR};

/// The largest number of data blocks a stripe may have with Q: exponents are
/// distinct values in 0..=254. (md itself allows at most 256 members, so at most
/// 254 data blocks in RAID-6.)
pub const Q_DATA_MAX: usize = gf::ORDER;

/// One implementation of the parity kernels.
///
/// All blocks passed to one call must have the same length, which may be zero;
/// implementations assert it. Every output is fully overwritten (`gen_*`) or
/// updated in place (`xor_into`, `mul_acc`, `scale`); none reads uninitialised
/// state or keeps any between calls, so one instance may serve many threads.
pub trait Syndrome: Send + Sync {
    /// A short stable name for logs and benchmarks, such as "scalar".
    fn name(&self) -> &'static str;

    /// P = XOR of all `data` blocks. With no data blocks, P is all zero.
    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]);

    /// P as in [`gen_p`](Self::gen_p) and Q = Σ_k g^(`exps[k]`)·`data[k]`, in one pass.
    ///
    /// `exps` has one exponent per data block; they must be distinct and in 0..=254.
    fn gen_pq(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8]);

    /// Q alone, with the same contract as [`gen_pq`](Self::gen_pq).
    ///
    /// The default builds Q from [`mul_acc`](Self::mul_acc), one pass per data
    /// block; implementations should override it with a single pass.
    fn gen_q(&self, data: &[&[u8]], exps: &[u8], q: &mut [u8]) {
        check_q_args(data, exps, q.len());
        q.fill(0);
        for (block, &e) in data.iter().zip(exps) {
            self.mul_acc(q, block, gf::pow2(e));
        }
    }

    /// P and Q as in [`gen_pq`](Self::gen_pq) and R = Σ_k 4^(`exps[k]`)·`data[k]`,
    /// the third syndrome of triple parity, in one pass.
    ///
    /// The exponents follow [`gen_pq`](Self::gen_pq)'s contract; 4^e = g^(2e mod
    /// 255), so each block's R coefficient is the square of its Q coefficient.
    ///
    /// The default makes two passes, P and Q first and then R as a Q with the
    /// doubled exponents (see [`r_exps`]); implementations should override it
    /// with a single pass.
    fn gen_pqr(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8], r: &mut [u8]) {
        assert!(
            q.len() == p.len() && r.len() == p.len(),
            "parity: P, Q and R lengths differ"
        );
        self.gen_pq(data, exps, p, q);
        self.gen_q(data, r_exps(exps, &mut [0; gf::ORDER]), r);
    }

    /// dst ^= src.
    fn xor_into(&self, dst: &mut [u8], src: &[u8]);

    /// dst ^= coef · src, bytewise in GF(2^8).
    fn mul_acc(&self, dst: &mut [u8], src: &[u8], coef: u8);

    /// buf = coef · buf, bytewise in GF(2^8).
    fn scale(&self, buf: &mut [u8], coef: u8);

    /// The work of [`recover_two_data`], which checks the arguments first and
    /// documents the algebra: rebuilds the data blocks with exponents `exp_x`
    /// and `exp_y` from the survivors, P and Q.
    ///
    /// The default composes the element operations above (six passes over
    /// the buffers); SIMD implementations fuse them into one.
    #[allow(clippy::too_many_arguments)] // Each argument is a distinct input of the algebra.
    fn recover_two(
        &self,
        present_data: &[&[u8]],
        present_exps: &[u8],
        p: &[u8],
        q: &[u8],
        exp_x: u8,
        exp_y: u8,
        out_x: &mut [u8],
        out_y: &mut [u8],
    ) {
        recover::two_data_composed(
            self,
            present_data,
            present_exps,
            p,
            q,
            exp_x,
            exp_y,
            out_x,
            out_y,
        );
    }

    /// Rebuilds the three data blocks with exponents `exps` into `outs` from
    /// the survivors and `parity` (P, Q and R in that order): the work [`rebuild()`] does when three data
    /// blocks are lost. Arguments must already be checked (equal lengths,
    /// one exponent per survivor, all exponents distinct and below 255).
    ///
    /// The default computes the survivors' syndromes, then solves the 3×3
    /// system by elimination with the element operations above (about a
    /// dozen passes over the buffers); SIMD implementations fuse it into one
    /// pass with the closed form documented in [`rebuild`](mod@rebuild).
    fn recover_three(
        &self,
        present_data: &[&[u8]],
        present_exps: &[u8],
        parity: [&[u8]; 3],
        exps: [u8; 3],
        outs: [&mut [u8]; 3],
    ) {
        rebuild::three_data_composed(self, present_data, present_exps, parity, exps, outs);
    }
}

/// Every implementation usable on this machine, the portable one first, then
/// the SIMD ones this CPU has (detected at run time), roughly slowest first.
pub fn implementations() -> Vec<&'static dyn Syndrome> {
    let mut all: Vec<&'static dyn Syndrome> = vec![&Scalar];
    all.extend(simd::detected());
    all
}

/// The exponents under which Q's code computes R: 2·e mod 255 for each e.
///
/// R's coefficient for a block with exponent e is 4^e = (g^2)^e = g^(2e), and
/// since g^255 = 1 that is g^(2e mod 255). Doubling modulo 255 is a bijection
/// of 0..=254 (2 and 255 are coprime), so distinct exponents stay distinct and
/// in range: every Q routine, generation and recovery alike, works on R
/// unchanged when handed these exponents. `buf` holds the result.
pub fn r_exps<'a>(exps: &[u8], buf: &'a mut [u8; gf::ORDER]) -> &'a [u8] {
    let out = &mut buf[..exps.len()];
    for (o, &e) in out.iter_mut().zip(exps) {
        *o = r_exp(e);
    }
    out
}

/// The exponent of g that equals 4^e: 2·e mod 255 (see [`r_exps`]).
#[inline]
pub const fn r_exp(e: u8) -> u8 {
    ((2 * e as usize) % gf::ORDER) as u8
}

/// Folds the change of one data block into its row's parity (the heart of
/// a read-modify-write): `delta` is the block's old bytes XOR its new ones,
/// `exp` its Q exponent; each parity present (P, Q, R in that order) gains
/// the delta times its coefficient: 1 for P, g^e for Q, 4^e = g^(2e) for
/// R. The parity is linear in every block, so what the row's other blocks
/// contribute is untouched.
pub fn apply_delta(syndrome: &dyn Syndrome, delta: &[u8], exp: u8, parity: [Option<&mut [u8]>; 3]) {
    let [p, q, r] = parity;
    for (column, buf) in [p, q, r].into_iter().enumerate() {
        let Some(buf) = buf else { continue };
        assert_eq!(buf.len(), delta.len(), "parity: a delta of another length");
        match column {
            0 => syndrome.xor_into(buf, delta),
            1 => syndrome.mul_acc(buf, delta, gf::pow2(exp)),
            _ => syndrome.mul_acc(buf, delta, gf::pow2(r_exp(exp))),
        }
    }
}

/// Asserts the preconditions shared by every P-only computation: all data blocks
/// have the parity block's length.
#[inline]
pub(crate) fn check_p_args(data: &[&[u8]], len: usize) {
    for (k, block) in data.iter().enumerate() {
        assert_eq!(
            block.len(),
            len,
            "parity: data block {k} has length {}, expected {len}",
            block.len()
        );
    }
}

/// Asserts the preconditions shared by every computation involving Q: equal
/// lengths, one exponent per data block, exponents in 0..=254 and distinct.
#[inline]
pub(crate) fn check_q_args(data: &[&[u8]], exps: &[u8], len: usize) {
    assert_eq!(
        exps.len(),
        data.len(),
        "parity: {} exponents for {} data blocks",
        exps.len(),
        data.len()
    );
    check_p_args(data, len);
    check_exps_distinct(exps);
}

/// Asserts that every exponent is in 0..=254 and no exponent repeats.
///
/// 255 is refused although g^255 is defined, because it equals g^0 and so would
/// silently alias exponent 0.
pub(crate) fn check_exps_distinct(exps: &[u8]) {
    let mut seen = [0u64; 4];
    for &e in exps {
        assert!(
            (e as usize) < gf::ORDER,
            "parity: exponent {e} out of range 0..=254"
        );
        let (word, bit) = (e as usize / 64, e as usize % 64);
        assert!(seen[word] & (1 << bit) == 0, "parity: exponent {e} repeats");
        seen[word] |= 1 << bit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md_test_vector() {
        // Three one-byte data blocks of value 1 with exponents 0, 1, 2:
        // P = 1 ^ 1 ^ 1 = 1 and Q = g^0 + g^1 + g^2 = 1 ^ 2 ^ 4 = 7.
        for imp in implementations() {
            let data: [&[u8]; 3] = [&[1], &[1], &[1]];
            let (mut p, mut q) = ([0xaau8], [0x55u8]);
            imp.gen_pq(&data, &[0, 1, 2], &mut p, &mut q);
            assert_eq!((p[0], q[0]), (1, 7), "{}", imp.name());
            let mut q_only = [0xffu8];
            imp.gen_q(&data, &[0, 1, 2], &mut q_only);
            assert_eq!(q_only[0], 7, "{}", imp.name());
        }
    }

    /// A row's parity after `apply_delta` is the parity generated from
    /// the new blocks, for P, Q and R, with every implementation.
    #[test]
    fn a_folded_delta_gives_the_regenerated_parity() {
        let old: Vec<Vec<u8>> = (0..5u8)
            .map(|b| {
                (0..64u8)
                    .map(|i| i.wrapping_mul(31) ^ b.wrapping_mul(97))
                    .collect()
            })
            .collect();
        let exps = [0u8, 1, 7, 100, 254];
        for imp in implementations() {
            let gen = |blocks: &[Vec<u8>]| {
                let views: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
                let (mut p, mut q, mut r) = (vec![0; 64], vec![0; 64], vec![0; 64]);
                imp.gen_pqr(&views, &exps, &mut p, &mut q, &mut r);
                (p, q, r)
            };
            let (mut p, mut q, mut r) = gen(&old);
            let mut new = old.clone();
            for (b, byte) in new[3].iter_mut().enumerate() {
                *byte = byte.wrapping_add(b as u8 | 1);
            }
            let delta: Vec<u8> = old[3].iter().zip(&new[3]).map(|(a, b)| a ^ b).collect();
            apply_delta(
                imp,
                &delta,
                exps[3],
                [Some(&mut p), Some(&mut q), Some(&mut r)],
            );
            assert_eq!((p, q, r), gen(&new), "{}", imp.name());
        }
    }

    #[test]
    fn implementations_are_listed() {
        let all = implementations();
        assert!(!all.is_empty());
        assert_eq!(all[0].name(), "scalar");
        assert!(all.iter().any(|i| i.name() == default_impl().name()));
    }

    #[test]
    #[should_panic(expected = "repeats")]
    fn duplicate_exponents_are_refused() {
        check_exps_distinct(&[3, 1, 3]);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn exponent_255_is_refused() {
        check_exps_distinct(&[0, 255]);
    }

    #[test]
    fn all_exponents_0_to_254_are_accepted() {
        let exps: Vec<u8> = (0..=254).rev().collect();
        check_exps_distinct(&exps);
    }
}
