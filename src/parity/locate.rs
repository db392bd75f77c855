//! Locating the one wrong block of a row whose parity disagrees with its data.
//!
//! A check reads a row's data and its stored parity, recomputes the parity
//! from the data as read, and compares. With P alone a mismatch says only
//! that something is wrong. With Q (and R) the differences also say *where*,
//! as long as a single block is wrong, so that a repair can rewrite that
//! block instead of trusting the data and recomputing the parity over a
//! rotten block.
//!
//! Notation as in the [module docs](super): data blocks D_k with distinct
//! exponents e_k and a_k = g^{e_k}; P = Σ D_k, Q = Σ a_k·D_k, R = Σ a_k²·D_k.
//! Per byte, with P', Q', R' recomputed: dP = P + P', dQ = Q + Q',
//! dR = R + R'. One block wrong by a nonzero error byte e gives
//!
//! | wrong block | dP | dQ     | dR      |
//! |-------------|----|--------|---------|
//! | none        | 0  | 0      | 0       |
//! | P           | e  | 0      | 0       |
//! | Q           | 0  | e      | 0       |
//! | R           | 0  | 0      | e       |
//! | D_z         | e  | a_z·e  | a_z²·e  |
//!
//! so a data error has dQ/dP = a_z, its exponent is e_z = log(dQ / dP), and
//! the error itself is dP ([`correct_data`]).
//!
//! # Consistency over a block
//!
//! One byte alone cannot tell one wrong block from two: two wrong data
//! blocks x, y with errors e1, e2 give dQ/dP = (a_x·e1 + a_y·e2)/(e1 + e2),
//! which can be any element, a valid a_z among them, or 0 and ∞ (then it
//! looks like a wrong P or Q). When a single block is wrong, though, every
//! byte that differs points to the same block, and bytes whose error happens
//! to be zero show no difference at all. So the decision is made over a whole
//! unit (the caller passes 4 KiB pages): every differing byte must name the
//! same culprit, and a data culprit's exponent must belong to the row, or
//! the answer is [`Culprit::Unknown`]. Two wrong blocks are then mistaken
//! for one only if all their differing bytes alias to the same candidate,
//! about (n+2)/255 for one byte and negligible for a few random ones. The
//! exponent test weakens as the row's exponents fill 0..=254.
//!
//! # Three parities
//!
//! With R, a data culprit must also satisfy dR = a_z²·dP, i.e. dQ² = dP·dR,
//! on every differing byte. Two wrong blocks never pass: for data x and y,
//! dQ² + dP·dR = e1·e2·(a_x + a_y)², nonzero because the a_k are distinct;
//! for data and P it is a_x²·e·f, for data and Q f², for data and R e·f, and
//! two wrong parities leave two syndromes differing in a way no single block
//! gives. With P, Q and R every byte therefore locates one wrong block and
//! detects any two; three or more can still alias.

use super::{check_exps_distinct, gf};

/// Which block of a row is wrong, as far as its syndromes can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Culprit {
    /// The stored parity equals the recomputed one.
    Consistent,
    /// Only the stored P is wrong.
    P,
    /// Only the stored Q is wrong.
    Q,
    /// Only the stored R is wrong.
    R,
    /// Only this data block is wrong: an index into the row's data blocks
    /// and `exps`, not its exponent (they differ on most layouts).
    Data(usize),
    /// More than one block is wrong, or the differences fit no single block.
    Unknown,
}

/// A row's syndromes over one decision unit: either as stored or as
/// recomputed from the data as read. `r` is present with triple parity only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Syndromes<'a> {
    pub p: &'a [u8],
    pub q: &'a [u8],
    pub r: Option<&'a [u8]>,
}

/// What the differences say about one row, given its `stored` syndromes,
/// those `fresh`ly recomputed from the data as read, and the data blocks'
/// exponents `exps` (Q = Σ g^`exps[k]`·D_k, R = Σ 4^`exps[k]`·D_k).
///
/// All slices must have one length, `stored` and `fresh` must agree on
/// whether R is present, and the exponents must be distinct and below 255.
/// The whole unit decides (see the [module docs](self)): a culprit is named
/// only if every differing byte names it.
pub fn locate(stored: Syndromes<'_>, fresh: Syndromes<'_>, exps: &[u8]) -> Culprit {
    check_syndromes(&stored, &fresh);
    check_exps_distinct(exps);
    // Most callers come here with a page known to mismatch, but an equal one
    // costs a comparison, not a walk through the field tables.
    if stored == fresh {
        return Culprit::Consistent;
    }
    match agreed_pattern(&stored, &fresh) {
        Agreement::Clean => Culprit::Consistent,
        Agreement::Disagree => Culprit::Unknown,
        Agreement::On(Pattern::P) => Culprit::P,
        Agreement::On(Pattern::Q) => Culprit::Q,
        Agreement::On(Pattern::R) => Culprit::R,
        Agreement::On(Pattern::Data { exp }) => data_index(exps, exp),
    }
}

/// Rewrites a data block that [`locate`] named ([`Culprit::Data`]) to its
/// right value: `block ^= p_stored ^ p_fresh`.
///
/// A single wrong data block is off by exactly dP = P + P', since P is its
/// coefficient-1 sum; `p_fresh` must be the P recomputed from the data as
/// read, the wrong block included.
pub fn correct_data(block: &mut [u8], p_stored: &[u8], p_fresh: &[u8]) {
    assert_eq!(
        p_stored.len(),
        block.len(),
        "locate: stored P and block lengths differ"
    );
    assert_eq!(
        p_fresh.len(),
        block.len(),
        "locate: recomputed P and block lengths differ"
    );
    for ((b, s), f) in block.iter_mut().zip(p_stored).zip(p_fresh) {
        *b ^= s ^ f;
    }
}

/// The single-block explanation one byte's differences fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    P,
    Q,
    R,
    /// A data block with this exponent, which the row may not have.
    Data {
        exp: u8,
    },
}

/// What all the bytes of a unit say together.
enum Agreement {
    /// No byte differs.
    Clean,
    /// Every differing byte fits this pattern.
    On(Pattern),
    /// Some byte fits no pattern, or two bytes fit different ones.
    Disagree,
}

/// Walks the unit byte by byte and stops at the first byte that breaks the
/// agreement, since one such byte already rules out a single culprit.
fn agreed_pattern(stored: &Syndromes<'_>, fresh: &Syndromes<'_>) -> Agreement {
    let mut agreed = None;
    for i in 0..stored.p.len() {
        let dr = stored.r.zip(fresh.r).map(|(s, f)| s[i] ^ f[i]);
        let Some(pattern) = classify(stored.p[i] ^ fresh.p[i], stored.q[i] ^ fresh.q[i], dr) else {
            return Agreement::Disagree;
        };
        match (agreed, pattern) {
            (_, None) => {}
            (None, Some(first)) => agreed = Some(first),
            (Some(seen), Some(this)) if seen == this => {}
            (Some(_), Some(_)) => return Agreement::Disagree,
        }
    }
    agreed.map_or(Agreement::Clean, Agreement::On)
}

/// One byte's differences: `Some(None)` if none, `Some(Some(pattern))` if
/// they fit one wrong block, `None` if they fit none. `dr` is `None` without R.
fn classify(dp: u8, dq: u8, dr: Option<u8>) -> Option<Option<Pattern>> {
    let r_differs = dr.is_some_and(|d| d != 0);
    match (dp != 0, dq != 0, r_differs) {
        (false, false, false) => Some(None),
        (true, false, false) => Some(Some(Pattern::P)),
        (false, true, false) => Some(Some(Pattern::Q)),
        (false, false, true) => Some(Some(Pattern::R)),
        (true, true, _) => {
            // R confirms what P and Q locate: a data error has dR = a_z²·dP.
            // Without R there is nothing to confirm with (distance 3).
            if let Some(dr) = dr {
                if gf::mul(dq, dq) != gf::mul(dp, dr) {
                    return None;
                }
            }
            Some(Some(Pattern::Data {
                exp: gf::log(gf::div(dq, dp)),
            }))
        }
        // Two parities differ but not as a data error does.
        _ => None,
    }
}

/// The data block with exponent `exp`, or Unknown if the row has none: an
/// exponent that belongs to no data block (past the row's exponents, or on
/// the gap a DDF layout leaves for its parity) means more than one block is
/// wrong.
fn data_index(exps: &[u8], exp: u8) -> Culprit {
    assert!((exp as usize) < gf::ORDER, "locate: a logarithm past 254");
    match exps.iter().position(|&e| e == exp) {
        Some(index) => Culprit::Data(index),
        None => Culprit::Unknown,
    }
}

/// Asserts that every slice has one length and that R is on both sides or
/// on neither: syndromes of different units cannot be compared.
fn check_syndromes(stored: &Syndromes<'_>, fresh: &Syndromes<'_>) {
    assert_eq!(
        stored.r.is_some(),
        fresh.r.is_some(),
        "locate: R is stored but not recomputed, or the reverse"
    );
    let len = stored.p.len();
    for (side, s) in [("stored", stored), ("recomputed", fresh)] {
        assert_eq!(s.p.len(), len, "locate: {side} P has another length");
        assert_eq!(s.q.len(), len, "locate: {side} Q has another length");
        if let Some(r) = s.r {
            assert_eq!(r.len(), len, "locate: {side} R has another length");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::testutil::{exponent_sets, random_blocks, rng};
    use crate::parity::{Scalar, Syndrome};
    use rand::Rng;

    const PAGE: usize = 4096;

    /// A row's parity, as `gen_pq` / `gen_pqr` write it.
    struct Parity {
        p: Vec<u8>,
        q: Vec<u8>,
        r: Option<Vec<u8>>,
    }

    impl Parity {
        fn of(data: &[Vec<u8>], exps: &[u8], triple: bool) -> Parity {
            let len = data[0].len();
            let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let (mut p, mut q) = (vec![0; len], vec![0; len]);
            let r = if triple {
                let mut r = vec![0; len];
                Scalar.gen_pqr(&views, exps, &mut p, &mut q, &mut r);
                Some(r)
            } else {
                Scalar.gen_pq(&views, exps, &mut p, &mut q);
                None
            };
            Parity { p, q, r }
        }

        fn syndromes(&self) -> Syndromes<'_> {
            Syndromes {
                p: &self.p,
                q: &self.q,
                r: self.r.as_deref(),
            }
        }
    }

    /// A row as written: its data and the parity stored for it.
    struct Row {
        data: Vec<Vec<u8>>,
        exps: Vec<u8>,
        stored: Parity,
    }

    impl Row {
        fn new(rng: &mut impl Rng, exps: &[u8], triple: bool, len: usize) -> Row {
            let data = random_blocks(rng, exps.len(), len);
            let stored = Parity::of(&data, exps, triple);
            Row {
                data,
                exps: exps.to_vec(),
                stored,
            }
        }

        /// The parity recomputed from the data as it is now.
        fn fresh(&self) -> Parity {
            Parity::of(&self.data, &self.exps, self.stored.r.is_some())
        }

        fn locate(&self) -> Culprit {
            locate(
                self.stored.syndromes(),
                self.fresh().syndromes(),
                &self.exps,
            )
        }
    }

    /// XORs a random nonzero byte into the first byte of `block` and into
    /// about three in four of the others, leaving the rest intact as a real
    /// error does, and returns how many bytes changed.
    fn damage(rng: &mut impl Rng, block: &mut [u8]) -> usize {
        let mut changed = 0;
        for (i, b) in block.iter_mut().enumerate() {
            if i == 0 || rng.gen_range(0..4) != 0 {
                *b ^= rng.gen_range(1..=255u8);
                changed += 1;
            }
        }
        changed
    }

    /// The exponent orders to run with: the shared recovery sets, a rotation
    /// as left-asymmetric raid6 has (data index and exponent differ), and a
    /// DDF-like run with a gap where a parity block sits, e.g. [0, 1, 3, 4].
    fn layouts(rng: &mut impl Rng, n: usize) -> Vec<Vec<u8>> {
        let mut sets = exponent_sets(rng, n);
        sets.push((0..n).map(|k| ((k + n / 2) % n) as u8).collect());
        sets.push((0..=n).filter(|&e| e != n / 2).map(|e| e as u8).collect());
        sets
    }

    #[test]
    fn a_consistent_row_is_consistent() {
        let mut rng = rng(1);
        for triple in [false, true] {
            for exps in layouts(&mut rng, 5) {
                let row = Row::new(&mut rng, &exps, triple, PAGE);
                assert_eq!(row.locate(), Culprit::Consistent, "{exps:?}");
            }
        }
        let empty = Syndromes {
            p: &[],
            q: &[],
            r: None,
        };
        assert_eq!(locate(empty, empty, &[0, 1]), Culprit::Consistent);
    }

    #[test]
    fn one_wrong_data_block_is_located_and_corrected() {
        let mut rng = rng(2);
        for n in 2..=8 {
            for exps in layouts(&mut rng, n) {
                for triple in [false, true] {
                    for x in 0..n {
                        let mut row = Row::new(&mut rng, &exps, triple, PAGE);
                        let right = row.data[x].clone();
                        let changed = damage(&mut rng, &mut row.data[x]);
                        assert!(changed < PAGE, "some bytes stay intact");
                        let what = format!("n={n} exps={exps:?} triple={triple} x={x}");
                        assert_eq!(row.locate(), Culprit::Data(x), "{what}");
                        let fresh = row.fresh();
                        correct_data(&mut row.data[x], &row.stored.p, &fresh.p);
                        assert_eq!(row.data[x], right, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn one_wrong_parity_block_is_named() {
        let mut rng = rng(3);
        for triple in [false, true] {
            for exps in layouts(&mut rng, 4) {
                let mut row = Row::new(&mut rng, &exps, triple, PAGE);
                damage(&mut rng, &mut row.stored.p);
                assert_eq!(row.locate(), Culprit::P, "{exps:?} triple={triple}");
                let mut row = Row::new(&mut rng, &exps, triple, PAGE);
                damage(&mut rng, &mut row.stored.q);
                assert_eq!(row.locate(), Culprit::Q, "{exps:?} triple={triple}");
            }
        }
        for exps in layouts(&mut rng, 4) {
            let mut row = Row::new(&mut rng, &exps, true, PAGE);
            damage(&mut rng, row.stored.r.as_mut().unwrap());
            assert_eq!(row.locate(), Culprit::R, "{exps:?}");
        }
    }

    #[test]
    fn two_wrong_parity_blocks_are_unknown() {
        let mut rng = rng(4);
        let exps = [0, 1, 2, 3];
        let mut row = Row::new(&mut rng, &exps, false, PAGE);
        damage(&mut rng, &mut row.stored.p);
        damage(&mut rng, &mut row.stored.q);
        assert_eq!(row.locate(), Culprit::Unknown);
        // With R, even one byte of two wrong parities fits no single block
        // (`damage` always changes the first byte).
        for len in [1, PAGE] {
            for pair in [[0, 1], [0, 2], [1, 2]] {
                let mut row = Row::new(&mut rng, &exps, true, len);
                for which in pair {
                    let stored = &mut row.stored;
                    let block = [&mut stored.p, &mut stored.q, stored.r.as_mut().unwrap()];
                    damage(&mut rng, block.into_iter().nth(which).unwrap());
                }
                assert_eq!(row.locate(), Culprit::Unknown, "len={len} {pair:?}");
            }
        }
    }

    #[test]
    fn two_wrong_data_blocks_are_unknown() {
        // On raid6 this holds only with overwhelming probability: every one of
        // the ~3900 differing bytes of the page would have to alias to the same
        // valid exponent. With R it holds for every byte.
        let mut rng = rng(5);
        for n in 2..=8 {
            for exps in layouts(&mut rng, n) {
                for triple in [false, true] {
                    let mut row = Row::new(&mut rng, &exps, triple, PAGE);
                    let x = rng.gen_range(0..n);
                    let y = (x + rng.gen_range(1..n)) % n;
                    damage(&mut rng, &mut row.data[x]);
                    damage(&mut rng, &mut row.data[y]);
                    let what = format!("n={n} exps={exps:?} triple={triple} x={x} y={y}");
                    assert_eq!(row.locate(), Culprit::Unknown, "{what}");
                }
            }
        }
    }

    #[test]
    fn two_blocks_wrong_on_different_bytes_are_unknown() {
        // Each byte alone names one block, but not the same one: a page with
        // bad sectors on two members is not repaired as if one were wrong.
        let mut rng = rng(6);
        for triple in [false, true] {
            let mut row = Row::new(&mut rng, &[3, 0, 1, 2], triple, PAGE);
            damage(&mut rng, &mut row.data[1][..512]);
            damage(&mut rng, &mut row.data[2][1024..1536]);
            assert_eq!(row.locate(), Culprit::Unknown, "triple={triple}");
        }
    }

    #[test]
    fn a_one_byte_double_error_can_alias_on_raid6_but_not_with_r() {
        // Rotated exponents, so that the index returned differs from the
        // exponent. Blocks x and y are wrong in one byte by e1 and e2, chosen
        // so that dQ/dP = (a_x·e1 + a_y·e2)/(e1 + e2) = a_z for a third block
        // z: e1·(a_x + a_z) = e2·(a_y + a_z).
        let exps = [3, 0, 1, 2];
        let (x, y, z) = (1, 2, 0);
        let a = |k: usize| gf::pow2(exps[k]);
        let e1 = 0x35;
        let e2 = gf::div(gf::mul(e1, a(x) ^ a(z)), a(y) ^ a(z));
        assert!(e2 != 0 && e2 != e1, "a real double error with dP != 0");
        for triple in [false, true] {
            let mut row = Row::new(&mut rng(7), &exps, triple, 1);
            row.data[x][0] ^= e1;
            row.data[y][0] ^= e2;
            // Distance 3 cannot tell this from one wrong block: raid6 names
            // block z, and correcting it would write a third wrong block.
            // That is the documented limit of one byte; a page of random
            // damage does not alias (two_wrong_data_blocks_are_unknown).
            // R's check dQ² = dP·dR sees the double error.
            let want = if triple {
                Culprit::Unknown
            } else {
                Culprit::Data(z)
            };
            assert_eq!(row.locate(), want, "triple={triple}");
        }
    }

    #[test]
    fn data_and_p_wrong_together_are_unknown_with_r() {
        let mut rng = rng(8);
        for len in [1, PAGE] {
            for exps in layouts(&mut rng, 5) {
                let mut row = Row::new(&mut rng, &exps, true, len);
                let x = rng.gen_range(0..5);
                // Both change the first byte, so that with len = 1 the byte
                // test, not a disagreement between bytes, has to catch it.
                damage(&mut rng, &mut row.data[x]);
                damage(&mut rng, &mut row.stored.p);
                assert_eq!(row.locate(), Culprit::Unknown, "len={len} {exps:?} x={x}");
            }
        }
    }

    #[test]
    fn an_exponent_outside_the_row_is_unknown() {
        // A phantom block with an exponent the row lacks is in the stored
        // parity but not in the data: every byte consistently points at that
        // exponent, which no data block has. Exponent 2 is the DDF gap of
        // [0, 1, 3, 4]; exponent 4 is past md's 0..=3.
        let mut rng = rng(9);
        for (exps, phantom) in [(vec![0, 1, 3, 4], 2), (vec![0, 1, 2, 3], 4)] {
            for triple in [false, true] {
                let row = Row::new(&mut rng, &exps, triple, PAGE);
                let mut with = row.data.clone();
                with.extend(random_blocks(&mut rng, 1, PAGE));
                let mut with_exps = exps.clone();
                with_exps.push(phantom);
                let stored = Parity::of(&with, &with_exps, triple);
                let got = locate(stored.syndromes(), row.fresh().syndromes(), &exps);
                assert_eq!(got, Culprit::Unknown, "{exps:?} triple={triple}");
            }
        }
        // The same in one hand-built byte: dQ/dP = g^2.
        let fresh = Syndromes {
            p: &[0],
            q: &[0],
            r: None,
        };
        let stored = Syndromes {
            p: &[0x9c],
            q: &[gf::mul(gf::pow2(2), 0x9c)],
            r: None,
        };
        assert_eq!(locate(stored, fresh, &[0, 1, 3, 4]), Culprit::Unknown);
        assert_eq!(locate(stored, fresh, &[0, 1, 2, 4]), Culprit::Data(2));
    }

    #[test]
    #[should_panic(expected = "another length")]
    fn syndromes_of_different_lengths_are_refused() {
        let stored = Syndromes {
            p: &[0; 8],
            q: &[0; 8],
            r: None,
        };
        let fresh = Syndromes {
            p: &[0; 8],
            q: &[0; 7],
            r: None,
        };
        locate(stored, fresh, &[0, 1]);
    }

    #[test]
    #[should_panic(expected = "R is stored but not recomputed")]
    fn r_on_one_side_only_is_refused() {
        let stored = Syndromes {
            p: &[0; 8],
            q: &[0; 8],
            r: Some(&[0; 8]),
        };
        let fresh = Syndromes { r: None, ..stored };
        locate(stored, fresh, &[0, 1]);
    }

    #[test]
    #[should_panic(expected = "repeats")]
    fn repeated_exponents_are_refused() {
        let s = Syndromes {
            p: &[1],
            q: &[2],
            r: None,
        };
        locate(s, s, &[0, 1, 0]);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn exponent_255_is_refused() {
        let s = Syndromes {
            p: &[1],
            q: &[2],
            r: None,
        };
        locate(s, s, &[0, 255]);
    }

    #[test]
    #[should_panic(expected = "recomputed P and block lengths differ")]
    fn a_correction_of_another_length_is_refused() {
        correct_data(&mut [0; 8], &[0; 8], &[0; 4]);
    }
}
