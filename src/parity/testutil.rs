//! Test helpers: naive reference syndromes and random stripes.
//!
//! The references are deliberately the most direct transcription of the
//! definitions, byte by byte, using a multiply that does not use the gf tables,
//! so that they cannot share a bug with the implementations under test.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Shift-and-add multiply in GF(2^8) modulo 0x11d, independent of `gf`'s tables.
pub fn mul_bitwise(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    product
}

/// g^e by repeated multiplication.
pub fn pow2_bitwise(e: u8) -> u8 {
    (0..e).fold(1u8, |x, _| mul_bitwise(x, 2))
}

/// P = XOR of all blocks, byte by byte.
pub fn reference_p(data: &[Vec<u8>], len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    for block in data {
        for (p, d) in p.iter_mut().zip(block) {
            *p ^= d;
        }
    }
    p
}

/// Q = Σ g^{e_k}·D_k, byte by byte.
pub fn reference_q(data: &[Vec<u8>], exps: &[u8], len: usize) -> Vec<u8> {
    let mut q = vec![0u8; len];
    for (block, &e) in data.iter().zip(exps) {
        let c = pow2_bitwise(e);
        for (q, d) in q.iter_mut().zip(block) {
            *q ^= mul_bitwise(c, *d);
        }
    }
    q
}

/// R = Σ 4^{e_k}·D_k, byte by byte, with 4^e by repeated multiplication by 4
/// (not through Q's exponents, so that the doubling trick is tested too).
pub fn reference_r(data: &[Vec<u8>], exps: &[u8], len: usize) -> Vec<u8> {
    let mut r = vec![0u8; len];
    for (block, &e) in data.iter().zip(exps) {
        let c = (0..e).fold(1u8, |x, _| mul_bitwise(x, 4));
        for (r, d) in r.iter_mut().zip(block) {
            *r ^= mul_bitwise(c, *d);
        }
    }
    r
}

/// A deterministic generator, so that a failure reproduces.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` random blocks of `len` bytes.
pub fn random_blocks(rng: &mut impl Rng, n: usize, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let mut block = vec![0u8; len];
            rng.fill(&mut block[..]);
            block
        })
        .collect()
}

/// `n` distinct random exponents in 0..=254, in random order.
pub fn random_exps(rng: &mut impl Rng, n: usize) -> Vec<u8> {
    let mut all: Vec<u8> = (0..=254).collect();
    all.shuffle(rng);
    all.truncate(n);
    all
}

/// The exponent sets every recovery test runs with: md's contiguous 0..n-1,
/// a DDF-like contiguous run that does not start at 0, a reversed order, sparse
/// exponents with large gaps (including 254), and random ones.
pub fn exponent_sets(rng: &mut impl Rng, n: usize) -> Vec<Vec<u8>> {
    vec![
        (0..n as u8).collect(),
        (2..n as u8 + 2).collect(),
        (0..n as u8).rev().collect(),
        (0..n).map(|k| (254 - 15 * k) as u8).collect(),
        random_exps(rng, n),
    ]
}

/// Borrows a list of owned blocks as the slice-of-slices the API takes.
pub fn as_slices(blocks: &[Vec<u8>]) -> Vec<&[u8]> {
    blocks.iter().map(Vec::as_slice).collect()
}
