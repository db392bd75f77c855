//! One entry point, [`rebuild`], for every loss pattern of a stripe with up to
//! three parity blocks: P, Q and R (see the [module docs](super)).
//!
//! The live engine and the offline tools describe a stripe the same way: the
//! surviving data blocks with their exponents, whichever parity blocks could
//! be read ([`Survivors`]), the lost data blocks with their exponents and
//! output buffers ([`LostData`]), and the lost parity blocks they want
//! recomputed ([`LostParity`]). [`plan_rebuild`] tells, before any parity is
//! read, which parity blocks the rebuild will use, so a caller can read only
//! those.
//!
//! # Choosing the path
//!
//! With m data blocks lost, m of the present parity blocks are needed; any m
//! of them will do (see the algebra below), so the cheapest set is taken:
//!
//! | lost data | parity used, first available       | how                                        |
//! |-----------|------------------------------------|--------------------------------------------|
//! | 0         | none                               | nothing to solve                           |
//! | 1         | P, else Q, else R                  | XOR; else one division by g^e (or 4^e)     |
//! | 2         | P+Q, else P+R, else Q+R            | the fused [`recover_two_data`]; Q+R by elimination |
//! | 3         | P+Q+R                              | [`Syndrome::recover_three`]                |
//!
//! R alone, and P with R, reuse Q's code unchanged: R's coefficient for
//! exponent e is 4^e = g^(2e mod 255), so R is the Q of the doubled exponents
//! (see [`r_exps`]), which are distinct whenever the originals
//! are. Lost parity blocks are recomputed last, from the complete data.
//!
//! # The algebra
//!
//! Write a_k = g^(e_k) for data block k. The parity rows restricted to the lost
//! blocks form the matrix with rows (1, ..., 1), (a_x, a_y, ...) and
//! (a_x², a_y², ...), the P, Q and R rows. The right-hand side is each used
//! parity block plus the survivors' own syndrome (S_P = P + P', and so on).
//! Because the exponents are distinct and below 255, the a_k are distinct
//! and nonzero; then every square submatrix made of these rows is invertible:
//! with all three rows it is a Vandermonde matrix, with determinant
//! Π (a_i + a_j) ≠ 0; Q with R has determinant a_x·a_y·(a_x + a_y); P with R
//! has a_x² + a_y² = (a_x + a_y)²; single entries are 1, a_x or a_x². So any
//! loss of at most three of the data, P, Q and R blocks can be rebuilt.
//!
//! For three lost data blocks x, y, z (a, b, c their coefficients), adding
//! b·c times the P equation, (b + c) times the Q equation and the R equation
//! cancels y and z, which leaves
//!
//! ```text
//! D_x = (b·c·S_P + (b + c)·S_Q + S_R) / ((a + b)(a + c))
//! D_y = (c·(S_P + D_x) + (S_Q + a·D_x)) / (b + c)
//! D_z = S_P + D_x + D_y
//! ```
//!
//! where the second line is the two-block solution once D_x's share is taken
//! out of S_P and S_Q. The SIMD implementations evaluate exactly this, in one
//! pass; [`Syndrome::recover_three`]'s default and the Q+R case instead use
//! Gauss-Jordan elimination with the trait's element operations.

use super::recover::{
    check_recovery_exps, recover_data_from_p, recover_data_from_q, recover_two_data,
};
use super::{check_p_args, gf, r_exp, r_exps, Syndrome};

/// What survives of a stripe: the data blocks that can be read, one
/// exponent each, and the parity blocks that can be read (None for a parity
/// block that is lost or that the stripe does not have).
#[derive(Clone, Copy, Debug)]
pub struct Survivors<'a> {
    pub data: &'a [&'a [u8]],
    pub exps: &'a [u8],
    pub p: Option<&'a [u8]>,
    pub q: Option<&'a [u8]>,
    pub r: Option<&'a [u8]>,
}

/// One lost data block: its exponent, and the buffer its bytes are rebuilt in.
#[derive(Debug)]
pub struct LostData<'a> {
    pub exp: u8,
    pub out: &'a mut [u8],
}

/// The lost parity blocks to recompute, each into its buffer; None for a
/// parity block that is not wanted.
#[derive(Debug, Default)]
pub struct LostParity<'a> {
    pub p: Option<&'a mut [u8]>,
    pub q: Option<&'a mut [u8]>,
    pub r: Option<&'a mut [u8]>,
}

/// The parity blocks a rebuild reads, named by the blocks it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// No data block is lost: no parity is read.
    Intact,
    P,
    Q,
    R,
    PQ,
    PR,
    QR,
    PQR,
}

impl Path {
    /// The parity rows this path solves with, in P, Q, R order.
    fn rows(self) -> &'static [Row] {
        match self {
            Path::Intact => &[],
            Path::P => &[Row::P],
            Path::Q => &[Row::Q],
            Path::R => &[Row::R],
            Path::PQ => &[Row::P, Row::Q],
            Path::PR => &[Row::P, Row::R],
            Path::QR => &[Row::Q, Row::R],
            Path::PQR => &[Row::P, Row::Q, Row::R],
        }
    }

    /// Which parity blocks this path reads, as [P, Q, R].
    pub fn reads(self) -> [bool; 3] {
        let rows = self.rows();
        [Row::P, Row::Q, Row::R].map(|row| rows.contains(&row))
    }
}

/// More data blocks are lost than parity blocks survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyLost {
    pub lost_data: usize,
    pub usable_parity: usize,
}

impl std::fmt::Display for TooManyLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} data blocks lost but only {} parity blocks left to rebuild them",
            self.lost_data, self.usable_parity
        )
    }
}

impl std::error::Error for TooManyLost {}

/// The cheapest way to rebuild `lost_data` data blocks when the parity
/// blocks marked in `present` ([P, Q, R]) can be read; see the module docs.
pub fn plan_rebuild(lost_data: usize, present: [bool; 3]) -> Result<Path, TooManyLost> {
    let [p, q, r] = present;
    let path = match (lost_data, p, q, r) {
        (0, ..) => Path::Intact,
        (1, true, ..) => Path::P,
        (1, false, true, _) => Path::Q,
        (1, false, false, true) => Path::R,
        (2, true, true, _) => Path::PQ,
        (2, true, false, true) => Path::PR,
        (2, false, true, true) => Path::QR,
        (3, true, true, true) => Path::PQR,
        _ => {
            return Err(TooManyLost {
                lost_data,
                usable_parity: present.iter().filter(|&&b| b).count(),
            })
        }
    };
    Ok(path)
}

/// Rebuilds every block in `lost` and every parity block asked for in
/// `parity` from the `survivors`, and returns the path taken.
///
/// All blocks must have one length. The exponents of the survivors and of
/// the lost blocks together must be distinct and below 255. Fails, having
/// written nothing, when more data blocks are lost than parity blocks
/// survive.
pub fn rebuild<S: Syndrome + ?Sized>(
    imp: &S,
    survivors: &Survivors<'_>,
    lost: &mut [LostData<'_>],
    parity: LostParity<'_>,
) -> Result<Path, TooManyLost> {
    let Survivors {
        data: present,
        exps,
        p,
        q,
        r,
    } = *survivors;
    let path = plan_rebuild(lost.len(), [p.is_some(), q.is_some(), r.is_some()])?;
    check_rebuild_args(survivors, lost, &parity);
    let mut doubled = [0u8; gf::ORDER];
    match (path, &mut *lost) {
        (Path::Intact, []) => {}
        (Path::P, [x]) => recover_data_from_p(imp, present, used(p), x.out),
        (Path::Q, [x]) => recover_data_from_q(imp, present, exps, used(q), x.exp, x.out),
        (Path::R, [x]) => {
            let r_present = r_exps(exps, &mut doubled);
            recover_data_from_q(imp, present, r_present, used(r), r_exp(x.exp), x.out)
        }
        (Path::PQ, [x, y]) => recover_two_data(
            imp,
            present,
            exps,
            used(p),
            used(q),
            x.exp,
            y.exp,
            x.out,
            y.out,
        ),
        (Path::PR, [x, y]) => {
            let r_present = r_exps(exps, &mut doubled);
            let (ex, ey) = (r_exp(x.exp), r_exp(y.exp));
            recover_two_data(
                imp,
                present,
                r_present,
                used(p),
                used(r),
                ex,
                ey,
                x.out,
                y.out,
            )
        }
        (Path::QR, [x, y]) => solve_composed(
            imp,
            present,
            exps,
            Path::QR.rows(),
            &[used(q), used(r)],
            &[x.exp, y.exp],
            &mut [&mut *x.out, &mut *y.out],
        ),
        (Path::PQR, [x, y, z]) => imp.recover_three(
            present,
            exps,
            [used(p), used(q), used(r)],
            [x.exp, y.exp, z.exp],
            [&mut *x.out, &mut *y.out, &mut *z.out],
        ),
        _ => unreachable!("plan_rebuild's path matches the number of lost blocks"),
    }
    let LostParity { p, q, r } = parity;
    if p.is_some() || q.is_some() || r.is_some() {
        let mut all: Vec<&[u8]> = present.to_vec();
        all.extend(lost.iter().map(|l| &*l.out));
        let mut all_exps = exps.to_vec();
        all_exps.extend(lost.iter().map(|l| l.exp));
        gen_some(imp, &all, &all_exps, [p, q, r]);
    }
    Ok(path)
}

/// A parity block [`plan_rebuild`] chose, which is therefore present.
fn used(block: Option<&[u8]>) -> &[u8] {
    block.expect("plan_rebuild chose a present parity block")
}

/// Asserts that every block has one length and the exponents can be solved for.
fn check_rebuild_args(survivors: &Survivors<'_>, lost: &[LostData<'_>], parity: &LostParity<'_>) {
    let lengths = [survivors.p, survivors.q, survivors.r]
        .into_iter()
        .flatten()
        .map(<[u8]>::len)
        .chain(lost.iter().map(|l| l.out.len()))
        .chain(
            [&parity.p, &parity.q, &parity.r]
                .into_iter()
                .flatten()
                .map(|b| b.len()),
        );
    let mut len = None;
    for l in lengths {
        assert_eq!(*len.get_or_insert(l), l, "rebuild: block lengths differ");
    }
    let len = len.or(survivors.data.first().map(|b| b.len())).unwrap_or(0);
    check_p_args(survivors.data, len);
    assert_eq!(
        survivors.exps.len(),
        survivors.data.len(),
        "rebuild: one exponent per survivor"
    );
    let lost_exps: Vec<u8> = lost.iter().map(|l| l.exp).collect();
    check_recovery_exps(survivors.exps, &lost_exps);
}

/// Computes the parity blocks given in `outs` ([P, Q, R]) of `data`, with as
/// few passes as the kernels allow: P with R is P with Q of the doubled
/// exponents.
fn gen_some<S: Syndrome + ?Sized>(
    imp: &S,
    data: &[&[u8]],
    exps: &[u8],
    outs: [Option<&mut [u8]>; 3],
) {
    let mut doubled = [0u8; gf::ORDER];
    match outs {
        [Some(p), Some(q), Some(r)] => imp.gen_pqr(data, exps, p, q, r),
        [Some(p), Some(q), None] => imp.gen_pq(data, exps, p, q),
        [Some(p), None, Some(r)] => imp.gen_pq(data, r_exps(exps, &mut doubled), p, r),
        [p, q, r] => {
            if let Some(p) = p {
                imp.gen_p(data, p);
            }
            if let Some(q) = q {
                imp.gen_q(data, exps, q);
            }
            if let Some(r) = r {
                imp.gen_q(data, r_exps(exps, &mut doubled), r);
            }
        }
    }
}

/// A parity block, as a row of the system the rebuild solves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    P,
    Q,
    R,
}

impl Row {
    /// The coefficient of a data block with exponent `e` in this parity block.
    fn coef(self, e: u8) -> u8 {
        match self {
            Row::P => 1,
            Row::Q => gf::pow2(e),
            Row::R => gf::pow2(r_exp(e)),
        }
    }
}

/// [`Syndrome::recover_three`]'s default: the three-block system solved by
/// elimination. Arguments must already be checked.
pub(crate) fn three_data_composed<S: Syndrome + ?Sized>(
    imp: &S,
    present: &[&[u8]],
    present_exps: &[u8],
    parity: [&[u8]; 3],
    exps: [u8; 3],
    outs: [&mut [u8]; 3],
) {
    let rows = Path::PQR.rows();
    let mut outs = outs;
    solve_composed(imp, present, present_exps, rows, &parity, &exps, &mut outs);
}

/// Rebuilds the lost data blocks with exponents `lost_exps` into `outs`, one
/// per parity row in `rows` (whose stored blocks are `parity`), with the
/// trait's element operations.
///
/// `outs` first receives the right-hand sides (each parity block plus the
/// survivors' syndrome for it); then Gauss-Jordan elimination, applied to
/// the buffers as row operations (scale a row, add a multiple of one row to
/// another), turns the matrix into the identity and so the buffers into the
/// data. No row exchange is needed: the leading square submatrices of the
/// rows in P, Q, R order are themselves such submatrices, invertible by the
/// module docs, so every pivot is nonzero.
fn solve_composed<S: Syndrome + ?Sized>(
    imp: &S,
    present: &[&[u8]],
    present_exps: &[u8],
    rows: &[Row],
    parity: &[&[u8]],
    lost_exps: &[u8],
    outs: &mut [&mut [u8]],
) {
    let m = rows.len();
    assert!(m <= 3 && parity.len() == m && lost_exps.len() == m && outs.len() == m);
    {
        let mut by_row: [Option<&mut [u8]>; 3] = [None, None, None];
        for (out, row) in outs.iter_mut().zip(rows) {
            by_row[*row as usize] = Some(&mut **out);
        }
        gen_some(imp, present, present_exps, by_row);
    }
    for (out, block) in outs.iter_mut().zip(parity) {
        imp.xor_into(out, block);
    }
    let mut matrix = [[0u8; 3]; 3];
    for (i, row) in rows.iter().enumerate() {
        for (j, &e) in lost_exps.iter().enumerate() {
            matrix[i][j] = row.coef(e);
        }
    }
    for c in 0..m {
        let pivot = matrix[c][c];
        assert_ne!(
            pivot, 0,
            "rebuild: singular system (exponents not distinct?)"
        );
        if pivot != 1 {
            let inv = gf::inv(pivot);
            imp.scale(outs[c], inv);
            matrix[c] = matrix[c].map(|a| gf::mul(a, inv));
        }
        for r in (0..m).filter(|&r| r != c) {
            let factor = matrix[r][c];
            if factor != 0 {
                let (dst, src) = pair_mut(outs, r, c);
                imp.mul_acc(dst, src, factor);
                let pivot_row = matrix[c];
                for (a, b) in matrix[r].iter_mut().zip(pivot_row) {
                    *a ^= gf::mul(factor, b);
                }
            }
        }
    }
}

/// `outs[dst]` mutably and `outs[src]` shared, which must differ.
fn pair_mut<'a>(outs: &'a mut [&mut [u8]], dst: usize, src: usize) -> (&'a mut [u8], &'a [u8]) {
    assert_ne!(dst, src);
    if dst < src {
        let (low, high) = outs.split_at_mut(src);
        (&mut *low[dst], &*high[0])
    } else {
        let (low, high) = outs.split_at_mut(dst);
        (&mut *high[0], &*low[src])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::testutil::*;
    use crate::parity::{implementations, Scalar};

    /// One block of a stripe: a data block by index, or a parity block.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Column {
        Data(usize),
        P,
        Q,
        R,
    }

    /// Every set of at most three of the columns of a stripe with `n` data
    /// blocks and P, Q and R, the empty set included.
    fn loss_sets(n: usize) -> Vec<Vec<Column>> {
        let columns: Vec<Column> = (0..n)
            .map(Column::Data)
            .chain([Column::P, Column::Q, Column::R])
            .collect();
        let c = columns.len();
        let mut sets = vec![vec![]];
        for i in 0..c {
            sets.push(vec![columns[i]]);
            for j in i + 1..c {
                sets.push(vec![columns[i], columns[j]]);
                for k in j + 1..c {
                    sets.push(vec![columns[i], columns[j], columns[k]]);
                }
            }
        }
        sets
    }

    /// Loses the columns in `loss` from a stripe of `data` with `exps`, rebuilds
    /// them with `imp` and checks every rebuilt block and the path taken.
    fn lose_and_rebuild(imp: &dyn Syndrome, data: &[Vec<u8>], exps: &[u8], loss: &[Column]) {
        let len = data[0].len();
        let parity = [
            reference_p(data, len),
            reference_q(data, exps, len),
            reference_r(data, exps, len),
        ];
        let parity_lost = [Column::P, Column::Q, Column::R].map(|c| loss.contains(&c));
        let lost_data: Vec<usize> = (0..data.len())
            .filter(|k| loss.contains(&Column::Data(*k)))
            .collect();
        let kept: Vec<usize> = (0..data.len()).filter(|k| !lost_data.contains(k)).collect();
        let present: Vec<&[u8]> = kept.iter().map(|&k| &data[k][..]).collect();
        let present_exps: Vec<u8> = kept.iter().map(|&k| exps[k]).collect();
        let [p, q, r] = [0, 1, 2].map(|i| (!parity_lost[i]).then_some(&parity[i][..]));
        let survivors = Survivors {
            data: &present,
            exps: &present_exps,
            p,
            q,
            r,
        };
        let mut outs: Vec<Vec<u8>> = lost_data.iter().map(|_| vec![0xa5; len]).collect();
        let mut lost: Vec<LostData> = outs
            .iter_mut()
            .zip(&lost_data)
            .map(|(out, &k)| LostData { exp: exps[k], out })
            .collect();
        let mut new_parity = [vec![0x11; len], vec![0x22; len], vec![0x33; len]];
        let [new_p, new_q, new_r] = &mut new_parity;
        let wanted = LostParity {
            p: parity_lost[0].then_some(&mut new_p[..]),
            q: parity_lost[1].then_some(&mut new_q[..]),
            r: parity_lost[2].then_some(&mut new_r[..]),
        };
        let path = rebuild(imp, &survivors, &mut lost, wanted).expect("at most three lost");
        drop(lost);
        let context = format!("{} len={len} exps={exps:?} loss={loss:?}", imp.name());
        let present_parity = parity_lost.map(|lost| !lost);
        assert_eq!(
            Ok(path),
            plan_rebuild(lost_data.len(), present_parity),
            "{context}"
        );
        for (out, &k) in outs.iter().zip(&lost_data) {
            assert_eq!(out, &data[k], "data {k}: {context}");
        }
        for i in 0..3 {
            if parity_lost[i] {
                assert_eq!(new_parity[i], parity[i], "parity {i}: {context}");
            }
        }
    }

    /// [`lose_and_rebuild`] for every loss set and every implementation.
    fn rebuild_every_loss(data: &[Vec<u8>], exps: &[u8]) {
        for loss in loss_sets(data.len()) {
            for imp in implementations() {
                lose_and_rebuild(imp, data, exps, &loss);
            }
        }
    }

    #[test]
    fn every_loss_of_up_to_three_columns_is_rebuilt() {
        let mut rng = rng(0x3c01);
        for n in 1..=8 {
            for len in [1, 67, 300] {
                for exps in exponent_sets(&mut rng, n) {
                    rebuild_every_loss(&random_blocks(&mut rng, n, len), &exps);
                }
            }
        }
    }

    #[test]
    fn every_loss_of_up_to_three_columns_of_twenty_data_blocks_is_rebuilt() {
        let mut rng = rng(0x3c20);
        let n = 20;
        // A random set, and a spread one reaching 254: 13 is coprime to 255.
        let sets = [
            random_exps(&mut rng, n),
            (0..n).map(|k| (254 - k * 13 % 255) as u8).collect(),
        ];
        for exps in sets {
            rebuild_every_loss(&random_blocks(&mut rng, n, 131), &exps);
        }
    }

    #[test]
    fn three_data_blocks_with_extreme_exponents() {
        // The largest stripe: every exponent in use, the lost ones at both
        // ends and in the middle.
        let mut rng = rng(0x3cff);
        let exps: Vec<u8> = (0..=254).rev().collect();
        let data = random_blocks(&mut rng, exps.len(), 100);
        let loss = [Column::Data(0), Column::Data(127), Column::Data(254)];
        for imp in implementations() {
            lose_and_rebuild(imp, &data, &exps, &loss);
        }
    }

    #[test]
    fn the_cheapest_parity_is_chosen() {
        use Path::*;
        let all = [true, true, true];
        assert_eq!(plan_rebuild(0, [false; 3]), Ok(Intact));
        assert_eq!(plan_rebuild(1, all), Ok(P));
        assert_eq!(plan_rebuild(1, [false, true, true]), Ok(Q));
        assert_eq!(plan_rebuild(1, [false, false, true]), Ok(R));
        assert_eq!(plan_rebuild(2, all), Ok(PQ));
        assert_eq!(plan_rebuild(2, [true, false, true]), Ok(PR));
        assert_eq!(plan_rebuild(2, [false, true, true]), Ok(QR));
        assert_eq!(plan_rebuild(3, all), Ok(PQR));
        assert_eq!(PR.reads(), [true, false, true]);
        assert_eq!(Intact.reads(), [false; 3]);
        let too_many = TooManyLost {
            lost_data: 2,
            usable_parity: 1,
        };
        assert_eq!(plan_rebuild(2, [false, false, true]), Err(too_many));
        assert_eq!(
            plan_rebuild(4, all).unwrap_err().to_string(),
            "4 data blocks lost but only 3 parity blocks left to rebuild them"
        );
    }

    /// Rebuilds one lost block with exponent `lost_exp` from one survivor
    /// with exponent `survivor_exp`, and from `p` as the only parity.
    fn rebuild_one(
        block: &[u8],
        survivor_exp: u8,
        p: Option<&[u8]>,
        lost_exp: u8,
        out: &mut [u8],
    ) -> Result<Path, TooManyLost> {
        let survivors = Survivors {
            data: &[block],
            exps: &[survivor_exp],
            p,
            q: None,
            r: None,
        };
        let mut lost = [LostData { exp: lost_exp, out }];
        rebuild(&Scalar, &survivors, &mut lost, LostParity::default())
    }

    #[test]
    fn too_many_lost_writes_nothing() {
        let mut out = [0xa5u8; 8];
        assert!(rebuild_one(&[7; 8], 0, None, 1, &mut out).is_err());
        assert_eq!(out, [0xa5; 8]);
    }

    #[test]
    #[should_panic(expected = "repeats")]
    fn lost_exponents_must_differ_from_the_survivors() {
        let block = [0u8; 4];
        let _ = rebuild_one(&block, 5, Some(&block), 5, &mut [0; 4]);
    }
}
