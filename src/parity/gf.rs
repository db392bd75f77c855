//! Arithmetic in GF(2^8), exactly as Linux md's RAID-6 code (lib/raid6) uses it.
//!
//! The field's elements are bytes. Addition is XOR. Multiplication is polynomial
//! multiplication over GF(2) reduced modulo x^8+x^4+x^3+x^2+1 (0x11d). That
//! polynomial is primitive, so g = {02} generates the whole multiplicative group:
//! every nonzero byte is g^k for exactly one k in 0..=254, and g^255 = 1. The
//! tables below rely on that fact, and the tests check it.
//!
//! All tables are built at compile time by `const fn`s, so there is no lazy
//! initialisation, no synchronisation and no start-up cost.

/// The reduction polynomial x^8+x^4+x^3+x^2+1, with its x^8 term.
pub const POLY: u16 = 0x11d;

/// The generator g = {02} whose powers are md's Q coefficients.
pub const GENERATOR: u8 = 0x02;

/// The multiplicative order of g: g^ORDER = 1, and no smaller positive power is 1.
pub const ORDER: usize = 255;

/// Multiplies by g = {02}: a shift, then a reduction by 0x11d if x^8 appeared.
///
/// Dropping the x^8 bit (the shift out of the byte) and XORing the low eight bits
/// of the polynomial (0x1d) is the same as subtracting 0x11d once.
#[inline]
pub const fn mul2(a: u8) -> u8 {
    (a << 1) ^ if a & 0x80 != 0 { 0x1d } else { 0 }
}

/// g^i for i in 0..512, i.e. g^(i mod 255).
///
/// The table is twice as long as the group's order so that `EXP[LOG[a] + LOG[b]]`
/// needs no reduction modulo 255 (the largest index is 254 + 254 = 508), and
/// so that `pow2` accepts every byte, including 255 (g^255 = g^0 = 1).
pub static EXP: [u8; 512] = build_exp();

/// The discrete logarithm to base g: `EXP[LOG[a] as usize] == a` for a != 0.
///
/// `LOG[0]` is meaningless (0 has no logarithm); it is 0 so that the table is total,
/// and every caller checks for zero first.
pub static LOG: [u8; 256] = build_log();

/// Multiplicative inverses: `mul(a, INV[a]) == 1` for a != 0. `INV[0]` is 0.
pub static INV: [u8; 256] = build_inv();

const fn build_exp() -> [u8; 512] {
    let mut table = [0u8; 512];
    let mut x: u8 = 1;
    let mut i = 0;
    while i < 512 {
        table[i] = x;
        x = mul2(x);
        i += 1;
    }
    // Because g has order 255, the sequence repeats itself after 255 steps, which
    // is what makes the second half equal to the first; the tests check it.
    table
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < ORDER {
        table[exp[i] as usize] = i as u8;
        i += 1;
    }
    table
}

const fn build_inv() -> [u8; 256] {
    let exp = build_exp();
    let log = build_log();
    let mut table = [0u8; 256];
    let mut a = 1;
    while a < 256 {
        // g^k * g^(255-k) = g^255 = 1, so the inverse of g^k is g^(255-k).
        table[a] = exp[ORDER - log[a] as usize];
        a += 1;
    }
    table
}

/// The product a·b in GF(2^8).
///
/// For nonzero operands, a·b = g^(log a + log b); zero has no logarithm and
/// annihilates everything, so it is handled first.
#[inline]
pub const fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// The multiplicative inverse of a. Zero has no inverse, so `a` must be nonzero.
#[inline]
pub const fn inv(a: u8) -> u8 {
    assert!(a != 0, "gf::inv: zero has no inverse");
    INV[a as usize]
}

/// The quotient a / b = a · b^-1. The divisor must be nonzero.
#[inline]
pub const fn div(a: u8, b: u8) -> u8 {
    assert!(b != 0, "gf::div: division by zero");
    if a == 0 {
        0
    } else {
        // log a - log b may be negative; adding 255 (the group order) keeps the
        // index non-negative without changing the power, since g^255 = 1.
        EXP[LOG[a as usize] as usize + ORDER - LOG[b as usize] as usize]
    }
}

/// g^e, the Q coefficient for a data block with exponent `e`. Every byte is
/// accepted; g^255 = g^0 = 1.
#[inline]
pub const fn pow2(e: u8) -> u8 {
    EXP[e as usize]
}

/// The discrete logarithm of a to base g, in 0..=254. `a` must be nonzero.
#[inline]
pub const fn log(a: u8) -> u8 {
    assert!(a != 0, "gf::log: zero has no logarithm");
    LOG[a as usize]
}

// The arithmetic is usable at compile time, which later SIMD code can use to
// build its constant tables; these also pin a few values from md's tables.
const _: () = assert!(mul(0x80, GENERATOR) == 0x1d);
const _: () = assert!(pow2(8) == 0x1d && pow2(255) == 1);
const _: () = assert!(mul(inv(0x53), 0x53) == 1 && div(0x1d, 0x80) == GENERATOR);

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference multiply that shares no code or tables with the module: a
    /// carry-less (XOR) product into 16 bits, then long division by 0x11d.
    fn mul_reference(a: u8, b: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                product ^= (a as u16) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product & (1 << bit) != 0 {
                product ^= POLY << (bit - 8);
            }
        }
        assert!(product < 0x100);
        product as u8
    }

    #[test]
    fn mul_matches_reference_for_all_pairs() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_reference(a, b), "{a:#04x} * {b:#04x}");
            }
        }
    }

    #[test]
    fn mul2_matches_reference() {
        for a in 0..=255u8 {
            assert_eq!(mul2(a), mul_reference(a, 2));
            assert_eq!(mul2(a), mul(a, GENERATOR));
        }
    }

    #[test]
    fn field_axioms_hold() {
        for a in 0..=255u8 {
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul(b, a));
            }
        }
        // Associativity and distributivity over all triples: 16M cheap checks.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let ab = mul(a, b);
                let a_plus_b = a ^ b;
                for c in 0..=255u8 {
                    assert_eq!(mul(ab, c), mul(a, mul(b, c)));
                    assert_eq!(mul(a_plus_b, c), mul(a, c) ^ mul(b, c));
                }
            }
        }
    }

    #[test]
    fn generator_has_order_255() {
        assert_eq!(pow2(255), 1);
        assert_eq!(mul(pow2(254), GENERATOR), 1, "g^255 must be 1");
        // No smaller positive power is 1, and the 255 powers are all distinct, so
        // they cover every nonzero byte.
        let mut seen = [false; 256];
        for e in 0..=254u8 {
            let x = pow2(e);
            assert_ne!(x, 0);
            assert!(!seen[x as usize], "g^{e} repeats");
            seen[x as usize] = true;
            if e > 0 {
                assert_ne!(x, 1);
            }
        }
        assert!(!seen[0]);
        assert!(seen[1..].iter().all(|&s| s));
    }

    #[test]
    fn exp_and_log_tables_agree() {
        for i in 0..512 {
            assert_eq!(EXP[i], EXP[i % ORDER], "EXP must repeat with period 255");
        }
        let mut x = 1u8;
        for e in 0..=255u8 {
            assert_eq!(pow2(e), x);
            x = mul_reference(x, 2);
        }
        for a in 1..=255u8 {
            assert_eq!(pow2(log(a)), a);
            assert!(log(a) < 255);
        }
    }

    #[test]
    fn inverse_and_division() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "inverse of {a:#04x}");
            assert_eq!(inv(inv(a)), a);
            assert_eq!(inv(a), pow2((255 - log(a) as usize) as u8));
        }
        for a in 0..=255u8 {
            for b in 1..=255u8 {
                let q = div(a, b);
                assert_eq!(mul(q, b), a, "{a:#04x} / {b:#04x}");
                assert_eq!(q, mul(a, inv(b)));
            }
        }
    }

    #[test]
    #[should_panic]
    fn inverse_of_zero_panics() {
        inv(std::hint::black_box(0));
    }

    #[test]
    #[should_panic]
    fn division_by_zero_panics() {
        div(std::hint::black_box(1), std::hint::black_box(0));
    }
}
