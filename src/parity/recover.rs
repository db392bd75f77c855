//! Reconstruction of lost blocks from the survivors, on top of [`Syndrome`].
//!
//! Notation: the stripe's data blocks are D_k with distinct exponents e_k,
//! P = Σ D_k and Q = Σ g^{e_k}·D_k (see the [module docs](super)). Addition in
//! GF(2^8) is XOR, so every element is its own negative and "subtracting" the
//! surviving blocks' contribution is XORing it again.
//!
//! The six failure cases of a RAID-6 stripe map onto these functions:
//!
//! | lost         | how                                                        |
//! |--------------|------------------------------------------------------------|
//! | one data     | [`recover_data_from_p`] (also RAID-4/5)                    |
//! | data and P   | [`recover_data_from_q`], then `gen_p` if P is wanted       |
//! | data and Q   | [`recover_data_from_p`], then `gen_q`                      |
//! | two data     | [`recover_two_data`]                                       |
//! | P and/or Q   | `gen_p`, `gen_q` or `gen_pq` from the data                 |
//!
//! Each function takes the implementation to run on, so callers can pass
//! [`default_impl()`](super::default_impl) or a specific one in tests.
//!
//! Stripes with a third parity block, R, are rebuilt through
//! [`rebuild()`](super::rebuild()), which picks among these functions and the
//! triple-parity paths for every loss pattern.

use super::{check_exps_distinct, check_p_args, gf, Syndrome};

/// Rebuilds the one missing data block from the others and P.
///
/// Since P = Σ_k D_k, the missing block is D_x = P + Σ_{k≠x} D_k: the XOR of P
/// and every surviving data block. `present_data` lists the surviving data
/// blocks in any order (it may be empty when the stripe has one data block,
/// whose copy P then is).
pub fn recover_data_from_p<S: Syndrome + ?Sized>(
    imp: &S,
    present_data: &[&[u8]],
    p: &[u8],
    out: &mut [u8],
) {
    assert_eq!(p.len(), out.len(), "recover: P and output lengths differ");
    check_p_args(present_data, out.len());
    imp.gen_p(present_data, out);
    imp.xor_into(out, p);
}

/// Rebuilds the one missing data block, with exponent `missing_exp`, from the
/// surviving data blocks and Q (used when P is lost as well).
///
/// Let Q' = Σ_{k≠x} g^{e_k}·D_k be the syndrome of the survivors alone. Then
/// Q + Q' = g^{e_x}·D_x, and since g^{e_x} is nonzero it is invertible:
/// D_x = g^{-e_x}·(Q + Q'), where g^{-e_x} = g^{255-e_x}.
pub fn recover_data_from_q<S: Syndrome + ?Sized>(
    imp: &S,
    present_data: &[&[u8]],
    present_exps: &[u8],
    q: &[u8],
    missing_exp: u8,
    out: &mut [u8],
) {
    assert_eq!(q.len(), out.len(), "recover: Q and output lengths differ");
    check_recovery_exps(present_exps, &[missing_exp]);
    imp.gen_q(present_data, present_exps, out);
    imp.xor_into(out, q);
    imp.scale(out, gf::inv(gf::pow2(missing_exp)));
}

/// Rebuilds two missing data blocks, with exponents `exp_x` and `exp_y`, from
/// the surviving data blocks, P and Q.
///
/// Let P' and Q' be the syndromes of the survivors alone, and
/// A = P + P' = D_x + D_y and B = Q + Q' = g^x·D_x + g^y·D_y (writing x, y for
/// the exponents). Multiplying the first equation by g^x and adding the second
/// eliminates D_x: g^x·A + B = (g^x + g^y)·D_y. Because the exponents differ
/// and are below 255, g^x ≠ g^y, so g^x + g^y ≠ 0 and
///
/// ```text
/// D_y = (g^x + g^y)^{-1} · (B + g^x·A)
/// D_x = A + D_y
/// ```
///
/// The computation happens in place in the outputs: `out_x` first holds A and
/// `out_y` holds B, then `out_y` becomes D_y and `out_x` becomes A + D_y.
#[allow(clippy::too_many_arguments)] // Each argument is a distinct input of the algebra.
pub fn recover_two_data<S: Syndrome + ?Sized>(
    imp: &S,
    present_data: &[&[u8]],
    present_exps: &[u8],
    p: &[u8],
    q: &[u8],
    exp_x: u8,
    exp_y: u8,
    out_x: &mut [u8],
    out_y: &mut [u8],
) {
    let len = p.len();
    assert!(
        q.len() == len && out_x.len() == len && out_y.len() == len,
        "recover: P, Q and output lengths differ"
    );
    check_recovery_exps(present_exps, &[exp_x, exp_y]);
    assert_eq!(
        present_exps.len(),
        present_data.len(),
        "recover: one exponent per survivor"
    );
    check_p_args(present_data, len);
    imp.recover_two(present_data, present_exps, p, q, exp_x, exp_y, out_x, out_y);
}

/// [`recover_two_data`] composed from the trait's element operations: the
/// reference ([`Syndrome::recover_two`]'s default), which fused SIMD kernels
/// are tested against. Arguments must already be checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn two_data_composed<S: Syndrome + ?Sized>(
    imp: &S,
    present_data: &[&[u8]],
    present_exps: &[u8],
    p: &[u8],
    q: &[u8],
    exp_x: u8,
    exp_y: u8,
    out_x: &mut [u8],
    out_y: &mut [u8],
) {
    imp.gen_pq(present_data, present_exps, out_x, out_y);
    imp.xor_into(out_x, p); // A
    imp.xor_into(out_y, q); // B
    let gx = gf::pow2(exp_x);
    let denominator_inv = gf::inv(gx ^ gf::pow2(exp_y));
    // D_y = (g^x + g^y)^{-1}·B + (g^x + g^y)^{-1}·g^x·A.
    imp.scale(out_y, denominator_inv);
    imp.mul_acc(out_y, out_x, gf::mul(denominator_inv, gx));
    imp.xor_into(out_x, out_y); // D_x = A + D_y
}

/// Asserts that the survivors' and the missing blocks' exponents together are
/// distinct and in 0..=254; otherwise the missing blocks could not be solved for.
pub(super) fn check_recovery_exps(present_exps: &[u8], missing_exps: &[u8]) {
    let mut all = [0u8; gf::ORDER + 2];
    assert!(
        present_exps.len() + missing_exps.len() <= gf::ORDER,
        "recover: more than 255 data blocks"
    );
    let n = present_exps.len();
    all[..n].copy_from_slice(present_exps);
    all[n..n + missing_exps.len()].copy_from_slice(missing_exps);
    check_exps_distinct(&all[..n + missing_exps.len()]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::testutil::*;
    use crate::parity::{implementations, Syndrome};

    const LENGTHS: [usize; 5] = [0, 1, 7, 64, 4096];

    /// The survivors of `data` once the blocks at `lost` are removed, with
    /// their exponents.
    fn survivors<'a>(data: &'a [Vec<u8>], exps: &[u8], lost: &[usize]) -> (Vec<&'a [u8]>, Vec<u8>) {
        (0..data.len())
            .filter(|k| !lost.contains(k))
            .map(|k| (data[k].as_slice(), exps[k]))
            .unzip()
    }

    /// Runs `check` for every implementation, data count 1..=16, block length
    /// and exponent set, with a random stripe and its reference P and Q.
    fn for_every_stripe(mut check: impl FnMut(&dyn Syndrome, &[Vec<u8>], &[u8], &[u8], &[u8])) {
        let mut rng = rng(0x5eed_9a71);
        for imp in implementations() {
            for n in 1..=16 {
                for len in LENGTHS {
                    for exps in exponent_sets(&mut rng, n) {
                        let data = random_blocks(&mut rng, n, len);
                        let p = reference_p(&data, len);
                        let q = reference_q(&data, &exps, len);
                        check(imp, &data, &exps, &p, &q);
                    }
                }
            }
        }
    }

    #[test]
    fn one_data_block_via_p() {
        for_every_stripe(|imp, data, exps, p, _q| {
            for x in 0..data.len() {
                let (present, _) = survivors(data, exps, &[x]);
                let mut out = vec![0xa5; p.len()];
                recover_data_from_p(imp, &present, p, &mut out);
                assert_eq!(out, data[x], "{} n={} x={x}", imp.name(), data.len());
            }
        });
    }

    #[test]
    fn one_data_block_via_q() {
        for_every_stripe(|imp, data, exps, _p, q| {
            for x in 0..data.len() {
                let (present, present_exps) = survivors(data, exps, &[x]);
                let mut out = vec![0xa5; q.len()];
                recover_data_from_q(imp, &present, &present_exps, q, exps[x], &mut out);
                assert_eq!(out, data[x], "{} exps={exps:?} x={x}", imp.name());
            }
        });
    }

    #[test]
    fn data_block_and_p() {
        // Q rebuilds the data block, then P is regenerated from complete data.
        for_every_stripe(|imp, data, exps, p, q| {
            for x in 0..data.len() {
                let (present, present_exps) = survivors(data, exps, &[x]);
                let mut out = vec![0xa5; q.len()];
                recover_data_from_q(imp, &present, &present_exps, q, exps[x], &mut out);
                assert_eq!(out, data[x]);
                let mut all = present.clone();
                all.push(&out);
                let mut new_p = vec![0x5a; p.len()];
                imp.gen_p(&all, &mut new_p);
                assert_eq!(new_p, p, "{} exps={exps:?} x={x}", imp.name());
            }
        });
    }

    #[test]
    fn data_block_and_q() {
        // P rebuilds the data block, then Q is regenerated from complete data.
        for_every_stripe(|imp, data, exps, p, q| {
            for x in 0..data.len() {
                let (present, mut all_exps) = survivors(data, exps, &[x]);
                let mut out = vec![0xa5; p.len()];
                recover_data_from_p(imp, &present, p, &mut out);
                assert_eq!(out, data[x]);
                let mut all = present.clone();
                all.push(&out);
                all_exps.push(exps[x]);
                let mut new_q = vec![0x5a; q.len()];
                imp.gen_q(&all, &all_exps, &mut new_q);
                assert_eq!(new_q, q, "{} exps={exps:?} x={x}", imp.name());
            }
        });
    }

    #[test]
    fn two_data_blocks() {
        for_every_stripe(|imp, data, exps, p, q| {
            let n = data.len();
            for x in 0..n {
                for y in 0..n {
                    if x == y {
                        continue;
                    }
                    let (present, present_exps) = survivors(data, exps, &[x, y]);
                    let mut out_x = vec![0xa5; p.len()];
                    let mut out_y = vec![0x5a; p.len()];
                    recover_two_data(
                        imp,
                        &present,
                        &present_exps,
                        p,
                        q,
                        exps[x],
                        exps[y],
                        &mut out_x,
                        &mut out_y,
                    );
                    let context = format!("{} exps={exps:?} x={x} y={y}", imp.name());
                    assert_eq!(out_x, data[x], "{context}");
                    assert_eq!(out_y, data[y], "{context}");
                }
            }
        });
    }

    #[test]
    fn p_and_q() {
        for_every_stripe(|imp, data, exps, p, q| {
            let all = as_slices(data);
            let mut new_p = vec![0xa5; p.len()];
            let mut new_q = vec![0x5a; q.len()];
            imp.gen_pq(&all, exps, &mut new_p, &mut new_q);
            assert_eq!(
                (&new_p[..], &new_q[..]),
                (p, q),
                "{} exps={exps:?}",
                imp.name()
            );
        });
    }

    #[test]
    fn all_zero_stripes_recover_to_zero() {
        for imp in implementations() {
            let zero = vec![0u8; 4096];
            let present: Vec<&[u8]> = vec![&zero; 3];
            let (mut x, mut y) = (vec![1u8; 4096], vec![2u8; 4096]);
            recover_two_data(
                imp,
                &present,
                &[0, 1, 2],
                &zero,
                &zero,
                3,
                4,
                &mut x,
                &mut y,
            );
            assert!(x.iter().chain(&y).all(|&b| b == 0));
            recover_data_from_q(imp, &present, &[0, 1, 2], &zero, 3, &mut x);
            assert!(x.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn two_data_blocks_with_extreme_exponents() {
        // Exponents 0 and 254 are the most distant pair, and 254 is the
        // largest allowed; the survivors use every other exponent.
        let mut rng = rng(254);
        let len = 100;
        let exps: Vec<u8> = (0..=254).collect();
        let data = random_blocks(&mut rng, exps.len(), len);
        let (p, q) = (reference_p(&data, len), reference_q(&data, &exps, len));
        for imp in implementations() {
            let (present, present_exps) = survivors(&data, &exps, &[0, 254]);
            let (mut x, mut y) = (vec![0; len], vec![0; len]);
            recover_two_data(imp, &present, &present_exps, &p, &q, 0, 254, &mut x, &mut y);
            assert_eq!((&x, &y), (&data[0], &data[254]));
        }
    }

    #[test]
    #[should_panic(expected = "repeats")]
    fn missing_exponent_must_differ_from_survivors() {
        let block = [0u8; 4];
        let mut out = [0u8; 4];
        recover_data_from_q(&crate::parity::Scalar, &[&block], &[1], &block, 1, &mut out);
    }

    #[test]
    #[should_panic(expected = "repeats")]
    fn two_missing_exponents_must_differ() {
        let block = [0u8; 4];
        let (mut x, mut y) = ([0u8; 4], [0u8; 4]);
        recover_two_data(
            &crate::parity::Scalar,
            &[],
            &[],
            &block,
            &block,
            2,
            2,
            &mut x,
            &mut y,
        );
    }

    #[test]
    #[should_panic(expected = "length")]
    fn unequal_lengths_are_refused() {
        let (short, long) = ([0u8; 3], [0u8; 4]);
        let mut out = [0u8; 4];
        recover_data_from_p(&crate::parity::Scalar, &[&short], &long, &mut out);
    }
}
