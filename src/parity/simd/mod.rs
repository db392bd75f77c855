//! SIMD implementations of [`Syndrome`]: the kernels are written once, generic
//! over a [`Vector`] of bytes, and instantiated per instruction set.
//!
//! # How the kernels work
//!
//! Syndromes are computed as md's and ISA-L's assembly does: for each group of
//! `U` consecutive vectors (64 to 256 bytes), the loop walks every data block,
//! keeping P, Q (and R, for triple parity) in registers, and stores them once.
//! The syndromes therefore never make a round trip through memory, and each
//! data byte is read exactly once. Q is evaluated by Horner's rule in
//! decreasing exponent order (see [`HornerPlan`]): one multiplication by g per
//! block for md's contiguous exponents, and a multiplication by the constant
//! g^gap where DDF layouts leave gaps. R follows the same order with base
//! 4 = g^2: two multiplications by g per block, or by the constant 4^gap.
//!
//! Multiplication by g is a shift plus a conditional XOR of 0x1d (or one affine
//! instruction with GFNI). Multiplication by any other constant c uses two
//! 16-entry tables, c·(low nibble) and c·(high nibble), looked up with a byte
//! shuffle (pshufb, tbl), or one gf2p8affineqb with c's 8×8 bit matrix. GFNI's
//! own gf2p8mulb reduces by 0x11b (AES's field), not md's 0x11d, so it is not used.
//!
//! Two-data-member recovery is one fused pass ([`recover_two`]): the survivors'
//! P' and Q' are computed in registers exactly as above, then both missing
//! blocks are derived from them, P and Q with two multiplications by constants,
//! instead of the six passes the trait-level composition makes. Three-data
//! recovery ([`recover_three`]) likewise computes P', Q' and R' in registers
//! and applies the closed form of [`rebuild`]'s docs: six multiplications by
//! constants per vector, one pass instead of about a dozen.
//!
//! # Unsafe
//!
//! The kernels use raw pointers and CPU-specific instructions. Their contract,
//! stated once here: (1) the CPU has the vector type's features, which holds
//! because a [`Simd`] value, the only way to reach the kernels, is handed out
//! only after run-time detection; (2) every pointer is valid for `body` bytes,
//! which the safe wrappers in [`Simd`]'s [`Syndrome`] impl guarantee by
//! checking all slice lengths before taking pointers.

#[cfg(target_arch = "aarch64")]
pub(super) mod neon;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use super::scalar::HornerPlan;
use super::{check_p_args, check_q_args, gf, r_exp, rebuild, recover, Scalar, Syndrome};
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// One SIMD register of bytes and the GF(2^8) operations on it.
///
/// Every method is unsafe because it executes the implementing type's
/// instructions: see the module's contract.
pub(super) trait Vector: Copy {
    /// Bytes in one vector.
    const BYTES: usize;
    /// A multiplier by one constant, prepared for [`mul`](Self::mul).
    type Mul: Copy;
    unsafe fn zero() -> Self;
    /// Loads `BYTES` bytes from `src`, which need not be aligned.
    unsafe fn load(src: *const u8) -> Self;
    /// Stores `BYTES` bytes to `dst`, which need not be aligned.
    unsafe fn store(self, dst: *mut u8);
    unsafe fn xor(self, other: Self) -> Self;
    /// Multiplies every byte by g = {02}.
    unsafe fn mul2(self) -> Self;
    unsafe fn prepare(c: u8) -> Self::Mul;
    /// Multiplies every byte by the constant `m` was prepared for.
    unsafe fn mul(self, m: &Self::Mul) -> Self;
}

/// The 16-entry tables c·i and c·(i << 4), for i in 0..16, that byte-shuffle
/// multiplication looks up: c·x = c·(x & 0x0f) + c·(x & 0xf0).
pub(super) fn nibble_tables(c: u8) -> &'static [[u8; 16]; 2] {
    &NIBBLE_TABLES[c as usize]
}

/// [`nibble_tables`] for every c, built at compile time (8 KiB).
static NIBBLE_TABLES: [[[u8; 16]; 2]; 256] = {
    let mut tables = [[[0u8; 16]; 2]; 256];
    let mut c = 0;
    while c < 256 {
        let mut i = 0;
        while i < 16 {
            tables[c][0][i] = gf::mul(c as u8, i as u8);
            tables[c][1][i] = gf::mul(c as u8, (i as u8) << 4);
            i += 1;
        }
        c += 1;
    }
    tables
};

/// [`affine_matrix`] for every c, built at compile time (2 KiB).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // Used by x86 GFNI.
pub(super) static AFFINE_MATRICES: [u64; 256] = {
    let mut matrices = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        matrices[c] = affine_matrix(c as u8);
        c += 1;
    }
    matrices
};

/// The 8×8 bit matrix A, in gf2p8affineqb's layout, for which A·x = c·x in
/// md's field. Multiplication by c is linear over GF(2), so column j of A is
/// c·2^j; the instruction computes result bit i from the row in byte 7 - i.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // Used by x86 GFNI and the tests.
pub(super) const fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut j = 0;
        while j < 8 {
            if (gf::mul(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
            j += 1;
        }
        matrix |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    matrix
}

/// Whether the exponents are e, e+1, e+2, ...: then the Horner order is
/// simply the blocks from last to first, which saves [`HornerPlan`]'s sort.
fn is_consecutive(exps: &[u8]) -> bool {
    exps.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]))
}

/// One data block in a [`Plan`]: where it starts, and how the Q accumulator is
/// multiplied before the block is added (0: by g; k: by `muls[k - 1]`).
#[derive(Clone, Copy)]
struct Step {
    ptr: *const u8,
    mul: u8,
}

/// [`HornerPlan`] with pointers and prepared multipliers, built inside the
/// instruction set's target-feature context.
struct Plan<V: Vector> {
    /// The first `len` are initialised: left uninitialised, the array costs
    /// nothing to create, where zeroing it took as long as the whole kernel
    /// on a 4 KiB chunk.
    steps: [MaybeUninit<Step>; gf::ORDER],
    len: usize,
    /// Multipliers for the gaps of more than one exponent; empty (and so not
    /// allocated) for md's contiguous exponents.
    muls: Vec<V::Mul>,
    /// g^(smallest exponent), or None when it is g^0 = 1.
    final_mul: Option<V::Mul>,
    /// R's counterparts of `muls` (same indices) and `final_mul`: the squares
    /// of Q's multipliers, filled only for a plan that computes R. R's
    /// multiplier for a step of one exponent is 4, two multiplications by g.
    r_muls: Vec<V::Mul>,
    r_final_mul: Option<V::Mul>,
}

impl<V: Vector> Plan<V> {
    /// A plan with no steps, to be filled in place by [`fill`](Self::fill).
    #[inline(always)]
    fn empty() -> Self {
        Plan {
            steps: [const { MaybeUninit::uninit() }; gf::ORDER],
            len: 0,
            muls: Vec::new(),
            final_mul: None,
            r_muls: Vec::new(),
            r_final_mul: None,
        }
    }

    /// Makes this empty plan the Horner plan for `data` with `exps`, or, for
    /// P alone (`exps` None), the blocks in their order. With `want_r`, R's
    /// multipliers are prepared too: R follows the same Horner order as Q
    /// with base 4 = g^2, so each of its multipliers is the square of Q's
    /// (see [`r_exp`]).
    ///
    /// In place rather than a constructor: a plan returned by value was
    /// copied whole (4 KiB, a memcpy call) once its steps were written,
    /// a third of the kernel's time on a 4 x 4 KiB stripe.
    #[inline(always)]
    unsafe fn fill(&mut self, data: &[&[u8]], exps: Option<&[u8]>, want_r: bool) {
        assert!(data.len() <= gf::ORDER);
        assert_eq!(self.len, 0, "a plan is filled once");
        match exps {
            _ if data.is_empty() => {}
            None => {
                for block in data {
                    self.push(block, 0);
                }
            }
            Some(exps) if is_consecutive(exps) => {
                // md's usual layouts (and DDF's without a gap): Horner visits
                // the blocks from the last, each step a multiplication by g.
                for block in data.iter().rev() {
                    self.push(block, 0);
                }
                self.set_final(exps[0], want_r);
            }
            Some(exps) => {
                let horner = HornerPlan::new(exps);
                for &(k, shift) in horner.steps() {
                    let mut mul = 0;
                    if shift > 1 {
                        self.muls.push(V::prepare(gf::pow2(shift)));
                        if want_r {
                            self.r_muls.push(V::prepare(gf::pow2(r_exp(shift))));
                        }
                        mul = self.muls.len() as u8;
                    }
                    self.push(data[k as usize], mul);
                }
                self.set_final(horner.final_shift, want_r);
            }
        }
        assert_eq!(self.len, data.len());
    }

    /// The final multipliers g^shift and, with `want_r`, 4^shift; none for
    /// shift 0, where both are 1.
    #[inline(always)]
    unsafe fn set_final(&mut self, shift: u8, want_r: bool) {
        if shift != 0 {
            self.final_mul = Some(V::prepare(gf::pow2(shift)));
            if want_r {
                self.r_final_mul = Some(V::prepare(gf::pow2(r_exp(shift))));
            }
        }
    }

    #[inline(always)]
    fn push(&mut self, block: &[u8], mul: u8) {
        self.steps[self.len].write(Step {
            ptr: block.as_ptr(),
            mul,
        });
        self.len += 1;
    }

    #[inline(always)]
    fn steps(&self) -> &[Step] {
        // SAFETY: `push` initialised the first `len` steps, and MaybeUninit<Step>
        // has Step's layout.
        unsafe { std::slice::from_raw_parts(self.steps.as_ptr().cast::<Step>(), self.len) }
    }
}

/// P, Q and R of the `U` vectors at byte offset `off` of every block in
/// `plan`, each only if wanted (the others are left zero). With no blocks all
/// are zero. R needs a plan filled with `want_r`.
#[inline(always)]
unsafe fn syndromes<
    V: Vector,
    const U: usize,
    const WANT_P: bool,
    const WANT_Q: bool,
    const WANT_R: bool,
>(
    plan: &Plan<V>,
    off: usize,
) -> ([V; U], [V; U], [V; U]) {
    let mut p = [V::zero(); U];
    let mut q = [V::zero(); U];
    let mut r = [V::zero(); U];
    let Some((first, rest)) = plan.steps().split_first() else {
        return (p, q, r);
    };
    for u in 0..U {
        let d = V::load(first.ptr.add(off + u * V::BYTES));
        p[u] = d;
        q[u] = d;
        r[u] = d;
    }
    for step in rest {
        let mut d = [V::zero(); U];
        for (u, d) in d.iter_mut().enumerate() {
            *d = V::load(step.ptr.add(off + u * V::BYTES));
        }
        // Q's multiplier is g (step.mul 0) or a gap's g^k, R's its square.
        let gap = step.mul.checked_sub(1).map(usize::from);
        if WANT_Q {
            horner_step(&mut q, &d, gap.map(|i| &plan.muls[i]), 1);
        }
        if WANT_R {
            horner_step(&mut r, &d, gap.map(|i| &plan.r_muls[i]), 2);
        }
        if WANT_P {
            for u in 0..U {
                p[u] = p[u].xor(d[u]);
            }
        }
    }
    for (want, acc, m) in [
        (WANT_Q, &mut q, &plan.final_mul),
        (WANT_R, &mut r, &plan.r_final_mul),
    ] {
        if let (true, Some(m)) = (want, m) {
            for v in acc.iter_mut() {
                *v = v.mul(m);
            }
        }
    }
    (p, q, r)
}

/// One step of Horner's rule on `U` vectors: acc = acc·m + d, where the
/// multiplier m is the prepared `mul`, or else g^`doublings` (g or 4), which
/// is cheaper as repeated multiplication by g.
#[inline(always)]
unsafe fn horner_step<V: Vector, const U: usize>(
    acc: &mut [V; U],
    d: &[V; U],
    mul: Option<&V::Mul>,
    doublings: usize,
) {
    for (a, d) in acc.iter_mut().zip(d) {
        let mut v = *a;
        match mul {
            Some(m) => v = v.mul(m),
            None => {
                for _ in 0..doublings {
                    v = v.mul2();
                }
            }
        }
        *a = v.xor(*d);
    }
}

/// The work on one group of `N` consecutive vectors at byte offset `off`.
///
/// Kernels are structs implementing this rather than closures: a closure is
/// compiled without its enclosing function's target features, so the
/// intrinsics inside it would become calls instead of single instructions.
trait Group<V: Vector> {
    unsafe fn run<const N: usize>(&self, off: usize);
}

/// Runs `group` for each group of `U` vectors in `0..body`, then for each
/// remaining vector. `body` is a multiple of the vector size.
#[inline(always)]
unsafe fn over_groups<V: Vector, const U: usize>(body: usize, group: &impl Group<V>) {
    debug_assert_eq!(body % V::BYTES, 0);
    let wide = U * V::BYTES;
    let mut off = 0;
    while off + wide <= body {
        group.run::<U>(off);
        off += wide;
    }
    while off < body {
        group.run::<1>(off);
        off += V::BYTES;
    }
}

/// Stores `N` vectors at `dst + off`.
#[inline(always)]
unsafe fn store_all<V: Vector, const N: usize>(vectors: &[V; N], dst: *mut u8, off: usize) {
    for (u, v) in vectors.iter().enumerate() {
        v.store(dst.add(off + u * V::BYTES));
    }
}

/// Loads `N` vectors from `src + off`.
#[inline(always)]
unsafe fn load_all<V: Vector, const N: usize>(src: *const u8, off: usize) -> [V; N] {
    let mut vectors = [V::zero(); N];
    for (u, v) in vectors.iter_mut().enumerate() {
        *v = V::load(src.add(off + u * V::BYTES));
    }
    vectors
}

/// The wanted ones of P, Q and R of a plan's blocks, stored to `p`, `q`, `r`.
struct Generate<'a, V: Vector, const WANT_P: bool, const WANT_Q: bool, const WANT_R: bool> {
    plan: &'a Plan<V>,
    p: *mut u8,
    q: *mut u8,
    r: *mut u8,
}

impl<V: Vector, const WANT_P: bool, const WANT_Q: bool, const WANT_R: bool> Group<V>
    for Generate<'_, V, WANT_P, WANT_Q, WANT_R>
{
    #[inline(always)]
    unsafe fn run<const N: usize>(&self, off: usize) {
        let (p, q, r) = syndromes::<V, N, WANT_P, WANT_Q, WANT_R>(self.plan, off);
        if WANT_P {
            store_all(&p, self.p, off);
        }
        if WANT_Q {
            store_all(&q, self.q, off);
        }
        if WANT_R {
            store_all(&r, self.r, off);
        }
    }
}

/// The wanted ones of P, Q and R of `data` over the first `body` bytes.
#[inline(always)]
unsafe fn generate<
    V: Vector,
    const U: usize,
    const WANT_P: bool,
    const WANT_Q: bool,
    const WANT_R: bool,
>(
    data: &[&[u8]],
    exps: Option<&[u8]>,
    outputs: [*mut u8; 3],
    body: usize,
) {
    let [p, q, r] = outputs;
    let mut plan = Plan::<V>::empty();
    plan.fill(data, if WANT_Q || WANT_R { exps } else { None }, WANT_R);
    let group = Generate::<V, WANT_P, WANT_Q, WANT_R> {
        plan: &plan,
        p,
        q,
        r,
    };
    over_groups::<V, U>(body, &group);
}

/// The two constants of two-data recovery: with A = P + P' and B = Q + Q',
/// D_y = coef_b·B + coef_a·A (see [`recover::recover_two_data`]).
fn two_data_coefs(exp_x: u8, exp_y: u8) -> (u8, u8) {
    let gx = gf::pow2(exp_x);
    let coef_b = gf::inv(gx ^ gf::pow2(exp_y));
    (gf::mul(coef_b, gx), coef_b)
}

/// The survivors and P, Q and the outputs of a two-data recovery, as pointers.
pub(super) struct TwoData<'a> {
    present: &'a [&'a [u8]],
    present_exps: &'a [u8],
    p: *const u8,
    q: *const u8,
    exp_x: u8,
    exp_y: u8,
    out_x: *mut u8,
    out_y: *mut u8,
}

/// Both missing blocks from the survivors' syndromes, P and Q.
struct RecoverTwo<'a, V: Vector> {
    plan: &'a Plan<V>,
    job: &'a TwoData<'a>,
    mul_a: V::Mul,
    mul_b: V::Mul,
}

impl<V: Vector> Group<V> for RecoverTwo<'_, V> {
    #[inline(always)]
    unsafe fn run<const N: usize>(&self, off: usize) {
        let (partial_p, partial_q, _) = syndromes::<V, N, true, true, false>(self.plan, off);
        let (p, q) = (
            load_all::<V, N>(self.job.p, off),
            load_all::<V, N>(self.job.q, off),
        );
        let (mut x, mut y) = ([V::zero(); N], [V::zero(); N]);
        for u in 0..N {
            let a = partial_p[u].xor(p[u]);
            let b = partial_q[u].xor(q[u]);
            y[u] = b.mul(&self.mul_b).xor(a.mul(&self.mul_a));
            x[u] = a.xor(y[u]);
        }
        store_all(&x, self.job.out_x, off);
        store_all(&y, self.job.out_y, off);
    }
}

/// Rebuilds two data blocks over the first `body` bytes in one pass.
#[inline(always)]
unsafe fn recover_two<V: Vector, const U: usize>(job: &TwoData, body: usize) {
    let mut plan = Plan::<V>::empty();
    plan.fill(job.present, Some(job.present_exps), false);
    let (coef_a, coef_b) = two_data_coefs(job.exp_x, job.exp_y);
    let group = RecoverTwo {
        plan: &plan,
        job,
        mul_a: V::prepare(coef_a),
        mul_b: V::prepare(coef_b),
    };
    over_groups::<V, U>(body, &group);
}

/// The six constants of three-data recovery, in the order [`RecoverThree`]
/// uses them: with S_P, S_Q, S_R the parity blocks plus the survivors'
/// syndromes and a, b, c the lost blocks' Q coefficients,
/// D_x = k0·S_P + k1·S_Q + k2·S_R, then with S_P' = S_P + D_x and
/// S_Q' = S_Q + a·D_x, D_y = ky_p·S_P' + ky_q·S_Q' (see [`rebuild`]'s
/// docs for the derivation).
///
/// [`rebuild`]: mod@crate::parity::rebuild
fn three_data_coefs(exps: [u8; 3]) -> [u8; 6] {
    let [a, b, c] = exps.map(gf::pow2);
    let k2 = gf::inv(gf::mul(a ^ b, a ^ c));
    let ky_q = gf::inv(b ^ c);
    [
        gf::mul(gf::mul(b, c), k2),
        gf::mul(b ^ c, k2),
        k2,
        a,
        gf::mul(c, ky_q),
        ky_q,
    ]
}

/// The survivors, P, Q, R and the outputs of a three-data recovery, as
/// pointers.
pub(super) struct ThreeData<'a> {
    present: &'a [&'a [u8]],
    present_exps: &'a [u8],
    /// P, Q and R.
    parity: [*const u8; 3],
    exps: [u8; 3],
    outs: [*mut u8; 3],
}

/// The three missing blocks from the survivors' syndromes, P, Q and R.
struct RecoverThree<'a, V: Vector> {
    plan: &'a Plan<V>,
    job: &'a ThreeData<'a>,
    /// [`three_data_coefs`], prepared.
    muls: [V::Mul; 6],
}

impl<V: Vector> Group<V> for RecoverThree<'_, V> {
    #[inline(always)]
    unsafe fn run<const N: usize>(&self, off: usize) {
        let (partial_p, partial_q, partial_r) = syndromes::<V, N, true, true, true>(self.plan, off);
        let [p, q, r] = self.job.parity.map(|block| load_all::<V, N>(block, off));
        let [k0, k1, k2, a, ky_p, ky_q] = &self.muls;
        let (mut x, mut y, mut z) = ([V::zero(); N], [V::zero(); N], [V::zero(); N]);
        for u in 0..N {
            let s_p = partial_p[u].xor(p[u]);
            let s_q = partial_q[u].xor(q[u]);
            let s_r = partial_r[u].xor(r[u]);
            x[u] = s_p.mul(k0).xor(s_q.mul(k1)).xor(s_r.mul(k2));
            let s_p = s_p.xor(x[u]);
            let s_q = s_q.xor(x[u].mul(a));
            y[u] = s_p.mul(ky_p).xor(s_q.mul(ky_q));
            z[u] = s_p.xor(y[u]);
        }
        let [out_x, out_y, out_z] = self.job.outs;
        store_all(&x, out_x, off);
        store_all(&y, out_y, off);
        store_all(&z, out_z, off);
    }
}

/// Rebuilds three data blocks over the first `body` bytes in one pass.
#[inline(always)]
unsafe fn recover_three<V: Vector, const U: usize>(job: &ThreeData, body: usize) {
    let mut plan = Plan::<V>::empty();
    plan.fill(job.present, Some(job.present_exps), true);
    let group = RecoverThree {
        plan: &plan,
        job,
        muls: three_data_coefs(job.exps).map(|c| V::prepare(c)),
    };
    over_groups::<V, U>(body, &group);
}

/// dst = c·src, or dst ^= c·src when `ACC`; src == dst is allowed.
struct MulInto<V: Vector, const ACC: bool> {
    dst: *mut u8,
    src: *const u8,
    m: V::Mul,
}

impl<V: Vector, const ACC: bool> Group<V> for MulInto<V, ACC> {
    #[inline(always)]
    unsafe fn run<const N: usize>(&self, off: usize) {
        let mut out = load_all::<V, N>(self.src, off);
        for v in out.iter_mut() {
            *v = v.mul(&self.m);
        }
        if ACC {
            let old = load_all::<V, N>(self.dst, off);
            for (v, old) in out.iter_mut().zip(old) {
                *v = v.xor(old);
            }
        }
        store_all(&out, self.dst, off);
    }
}

#[inline(always)]
unsafe fn mul_into<V: Vector, const U: usize, const ACC: bool>(
    dst: *mut u8,
    src: *const u8,
    c: u8,
    body: usize,
) {
    let group = MulInto::<V, ACC> {
        dst,
        src,
        m: V::prepare(c),
    };
    over_groups::<V, U>(body, &group);
}

/// dst ^= src.
struct XorInto {
    dst: *mut u8,
    src: *const u8,
}

impl<V: Vector> Group<V> for XorInto {
    #[inline(always)]
    unsafe fn run<const N: usize>(&self, off: usize) {
        let mut out = load_all::<V, N>(self.src, off);
        for (v, old) in out.iter_mut().zip(load_all::<V, N>(self.dst, off)) {
            *v = v.xor(old);
        }
        store_all(&out, self.dst, off);
    }
}

#[inline(always)]
unsafe fn xor_into<V: Vector, const U: usize>(dst: *mut u8, src: *const u8, body: usize) {
    over_groups::<V, U>(body, &XorInto { dst, src });
}

/// The entry points of one instruction set, each compiled with its target
/// features by [`simd_entries!`].
///
/// # Safety
/// Implementors' functions execute the instruction set's instructions, so
/// they may only be called on a CPU that has them, with pointers valid for
/// `body` bytes (a multiple of `BYTES`). [`Simd`] ensures both.
pub(super) unsafe trait Entries: Send + Sync + 'static {
    const NAME: &'static str;
    const BYTES: usize;
    /// P, Q and R for the non-null ones of `outputs` (in that order).
    unsafe fn generate(data: &[&[u8]], exps: Option<&[u8]>, outputs: [*mut u8; 3], body: usize);
    unsafe fn recover_two(job: &TwoData, body: usize);
    unsafe fn recover_three(job: &ThreeData, body: usize);
    unsafe fn mul_into(dst: *mut u8, src: *const u8, c: u8, body: usize, accumulate: bool);
    unsafe fn xor_into(dst: *mut u8, src: *const u8, body: usize);
}

/// Implements [`Entries`] for `$set`, with kernels on vector type `$vector`
/// unrolled `$unroll` times and compiled with target features `$features`.
macro_rules! simd_entries {
    ($set:ident, $name:literal, $vector:ty, $unroll:literal, $features:literal) => {
        pub(in crate::parity) struct $set;

        // SAFETY: the functions below only run instructions of `$features`,
        // and Simd<$set> exists only where detection found them.
        unsafe impl $crate::parity::simd::Entries for $set {
            const NAME: &'static str = $name;
            const BYTES: usize = <$vector as $crate::parity::simd::Vector>::BYTES;

            #[target_feature(enable = $features)]
            unsafe fn generate(
                data: &[&[u8]],
                exps: Option<&[u8]>,
                outputs: [*mut u8; 3],
                body: usize,
            ) {
                use $crate::parity::simd::generate;
                let (v, b) = (outputs, body);
                // Only the combinations `Simd::gen` asks for are compiled.
                match outputs.map(|o| !o.is_null()) {
                    [true, true, true] => {
                        generate::<$vector, $unroll, true, true, true>(data, exps, v, b)
                    }
                    [true, true, false] => {
                        generate::<$vector, $unroll, true, true, false>(data, exps, v, b)
                    }
                    [true, false, false] => {
                        generate::<$vector, $unroll, true, false, false>(data, exps, v, b)
                    }
                    [false, true, false] => {
                        generate::<$vector, $unroll, false, true, false>(data, exps, v, b)
                    }
                    _ => unreachable!("gen with outputs other than P, Q, PQ or PQR"),
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn recover_two(job: &$crate::parity::simd::TwoData, body: usize) {
                $crate::parity::simd::recover_two::<$vector, $unroll>(job, body)
            }

            #[target_feature(enable = $features)]
            unsafe fn recover_three(job: &$crate::parity::simd::ThreeData, body: usize) {
                // Three syndromes and three outputs per vector do not fit
                // the registers eight vectors wide: spilled, the kernel ran
                // at a fifth of its speed four wide.
                const UNROLL: usize = if $unroll > 4 { 4 } else { $unroll };
                $crate::parity::simd::recover_three::<$vector, UNROLL>(job, body)
            }

            #[target_feature(enable = $features)]
            unsafe fn mul_into(dst: *mut u8, src: *const u8, c: u8, body: usize, acc: bool) {
                use $crate::parity::simd::mul_into;
                if acc {
                    mul_into::<$vector, $unroll, true>(dst, src, c, body)
                } else {
                    mul_into::<$vector, $unroll, false>(dst, src, c, body)
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn xor_into(dst: *mut u8, src: *const u8, body: usize) {
                $crate::parity::simd::xor_into::<$vector, $unroll>(dst, src, body)
            }
        }
    };
}
pub(super) use simd_entries;

/// A SIMD implementation of [`Syndrome`]. Its field is private to this module
/// and its children, which create values only after detecting the CPU features.
pub(super) struct Simd<E: Entries> {
    detected: PhantomData<E>,
}

impl<E: Entries> Simd<E> {
    /// # Safety
    /// The CPU must have `E`'s instruction set.
    const unsafe fn new() -> Self {
        Simd {
            detected: PhantomData,
        }
    }
}

/// The length SIMD handles, a multiple of the vector size; Scalar does the rest.
fn body_len<E: Entries>(len: usize) -> usize {
    len - len % E::BYTES
}

/// Every block's bytes from `start` on.
fn tails<'a>(blocks: &[&'a [u8]], start: usize) -> Vec<&'a [u8]> {
    blocks.iter().map(|b| &b[start..]).collect()
}

impl<E: Entries> Simd<E> {
    /// P, Q and R, those given, over the body with SIMD, then the tail with
    /// Scalar. The combinations are P, Q, P+Q and P+Q+R.
    fn gen(
        &self,
        data: &[&[u8]],
        exps: Option<&[u8]>,
        mut p: Option<&mut [u8]>,
        mut q: Option<&mut [u8]>,
        mut r: Option<&mut [u8]>,
    ) {
        let len = p.as_ref().or(q.as_ref()).map_or(0, |b| b.len());
        let body = body_len::<E>(len);
        if data.is_empty() {
            // The empty sum is zero.
            for out in [p, q, r].into_iter().flatten() {
                out.fill(0);
            }
            return;
        }
        let ptr = |b: &mut Option<&mut [u8]>| {
            b.as_deref_mut()
                .map_or(std::ptr::null_mut(), <[u8]>::as_mut_ptr)
        };
        let outputs = [ptr(&mut p), ptr(&mut q), ptr(&mut r)];
        if body > 0 {
            // SAFETY: Simd<E> exists only on CPUs with E's features; the
            // callers checked that every block and output has `len` bytes.
            unsafe { E::generate(data, exps, outputs, body) };
        }
        if body < len {
            let rest = tails(data, body);
            match (p, q, r, exps) {
                (Some(p), Some(q), Some(r), Some(exps)) => {
                    Scalar.gen_pqr(&rest, exps, &mut p[body..], &mut q[body..], &mut r[body..])
                }
                (Some(p), Some(q), None, Some(exps)) => {
                    Scalar.gen_pq(&rest, exps, &mut p[body..], &mut q[body..])
                }
                (Some(p), None, None, _) => Scalar.gen_p(&rest, &mut p[body..]),
                (None, Some(q), None, Some(exps)) => Scalar.gen_q(&rest, exps, &mut q[body..]),
                _ => unreachable!("gen needs an output, and exponents for Q"),
            }
        }
    }
}

impl<E: Entries> Syndrome for Simd<E> {
    fn name(&self) -> &'static str {
        E::NAME
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) {
        check_p_args(data, p.len());
        self.gen(data, None, Some(p), None, None);
    }

    fn gen_pq(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8]) {
        assert_eq!(q.len(), p.len(), "parity: P and Q lengths differ");
        check_q_args(data, exps, p.len());
        self.gen(data, Some(exps), Some(p), Some(q), None);
    }

    fn gen_pqr(&self, data: &[&[u8]], exps: &[u8], p: &mut [u8], q: &mut [u8], r: &mut [u8]) {
        assert!(
            q.len() == p.len() && r.len() == p.len(),
            "parity: P, Q and R lengths differ"
        );
        check_q_args(data, exps, p.len());
        self.gen(data, Some(exps), Some(p), Some(q), Some(r));
    }

    fn gen_q(&self, data: &[&[u8]], exps: &[u8], q: &mut [u8]) {
        check_q_args(data, exps, q.len());
        self.gen(data, Some(exps), None, Some(q), None);
    }

    fn xor_into(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "parity: xor_into lengths differ");
        let body = body_len::<E>(dst.len());
        // SAFETY: as in `gen`; both slices have at least `body` bytes.
        unsafe { E::xor_into(dst.as_mut_ptr(), src.as_ptr(), body) };
        Scalar.xor_into(&mut dst[body..], &src[body..]);
    }

    fn mul_acc(&self, dst: &mut [u8], src: &[u8], coef: u8) {
        assert_eq!(dst.len(), src.len(), "parity: mul_acc lengths differ");
        match coef {
            0 => {}
            1 => self.xor_into(dst, src),
            _ => {
                let body = body_len::<E>(dst.len());
                // SAFETY: as in `xor_into`.
                unsafe { E::mul_into(dst.as_mut_ptr(), src.as_ptr(), coef, body, true) };
                Scalar.mul_acc(&mut dst[body..], &src[body..], coef);
            }
        }
    }

    fn scale(&self, buf: &mut [u8], coef: u8) {
        match coef {
            0 => buf.fill(0),
            1 => {}
            _ => {
                let body = body_len::<E>(buf.len());
                let ptr = buf.as_mut_ptr();
                // SAFETY: as in `xor_into`; source and destination are the
                // same bytes, each vector read before it is written.
                unsafe { E::mul_into(ptr, ptr, coef, body, false) };
                Scalar.scale(&mut buf[body..], coef);
            }
        }
    }

    fn recover_two(
        &self,
        present: &[&[u8]],
        present_exps: &[u8],
        p: &[u8],
        q: &[u8],
        exp_x: u8,
        exp_y: u8,
        out_x: &mut [u8],
        out_y: &mut [u8],
    ) {
        let len = p.len();
        assert!(q.len() == len && out_x.len() == len && out_y.len() == len);
        check_q_args(present, present_exps, len);
        let body = body_len::<E>(len);
        let job = TwoData {
            present,
            present_exps,
            p: p.as_ptr(),
            q: q.as_ptr(),
            exp_x,
            exp_y,
            out_x: out_x.as_mut_ptr(),
            out_y: out_y.as_mut_ptr(),
        };
        // SAFETY: as in `gen`; every block and buffer has `len` bytes.
        unsafe { E::recover_two(&job, body) };
        if body < len {
            recover::two_data_composed(
                &Scalar,
                &tails(present, body),
                present_exps,
                &p[body..],
                &q[body..],
                exp_x,
                exp_y,
                &mut out_x[body..],
                &mut out_y[body..],
            );
        }
    }

    fn recover_three(
        &self,
        present: &[&[u8]],
        present_exps: &[u8],
        parity: [&[u8]; 3],
        exps: [u8; 3],
        outs: [&mut [u8]; 3],
    ) {
        let len = parity[0].len();
        let lengths = parity
            .iter()
            .map(|b| b.len())
            .chain(outs.iter().map(|o| o.len()));
        assert!(
            lengths.into_iter().all(|l| l == len),
            "parity: block lengths differ"
        );
        check_q_args(present, present_exps, len);
        let body = body_len::<E>(len);
        let mut outs = outs;
        let job = ThreeData {
            present,
            present_exps,
            parity: parity.map(<[u8]>::as_ptr),
            exps,
            outs: [0, 1, 2].map(|i| outs[i].as_mut_ptr()),
        };
        // SAFETY: as in `gen`; every block and buffer has `len` bytes.
        unsafe { E::recover_three(&job, body) };
        if body < len {
            let [x, y, z] = outs;
            rebuild::three_data_composed(
                &Scalar,
                &tails(present, body),
                present_exps,
                parity.map(|b| &b[body..]),
                exps,
                [&mut x[body..], &mut y[body..], &mut z[body..]],
            );
        }
    }
}

/// Every SIMD implementation this CPU can run, slowest first.
pub(super) fn detected() -> Vec<&'static dyn Syndrome> {
    #[cfg(target_arch = "x86_64")]
    return x86::detected();
    #[cfg(target_arch = "aarch64")]
    return neon::detected();
    #[allow(unreachable_code)]
    Vec::new()
}

/// Names of every SIMD implementation uraid has for this architecture,
/// whether or not this CPU runs it.
pub(super) fn known_names() -> &'static [&'static str] {
    #[cfg(target_arch = "x86_64")]
    return x86::NAMES;
    #[cfg(target_arch = "aarch64")]
    return neon::NAMES;
    #[allow(unreachable_code)]
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::testutil::*;
    use crate::parity::{implementations, recover_two_data};
    use rand::Rng;

    /// Every length up to three 256-byte groups of the widest vectors, so that
    /// each split between groups, single vectors and the scalar tail occurs,
    /// and a few chunk-sized ones with and without a tail.
    fn lengths() -> impl Iterator<Item = usize> {
        (0..=800).chain([4095, 4096, 4097, 65536 + 63])
    }

    /// Exponent sets: [`exponent_sets`] plus DDF-like runs with one gap.
    fn all_exponent_sets(rng: &mut impl Rng, n: usize) -> Vec<Vec<u8>> {
        let mut sets = exponent_sets(rng, n);
        let gap_at = n / 2;
        sets.push(
            (0..n as u8)
                .map(|k| if k as usize >= gap_at { k + 1 } else { k })
                .collect(),
        );
        sets.push(
            (0..n as u8)
                .map(|k| if k as usize >= gap_at { k + 3 } else { k + 1 })
                .collect(),
        );
        sets
    }

    /// The SIMD implementations only (Scalar is the reference).
    fn simd_impls() -> Vec<&'static dyn Syndrome> {
        implementations()
            .into_iter()
            .filter(|i| i.name() != "scalar")
            .collect()
    }

    #[test]
    fn generation_matches_scalar() {
        let mut rng = rng(0x51ad);
        for len in lengths() {
            // Fewer block counts for the long lengths, to bound the test's time.
            let counts: &[usize] = if len <= 800 {
                &[1, 2, 5, 14]
            } else {
                &[1, 3, 4, 8, 14, 17]
            };
            for &n in counts {
                for exps in all_exponent_sets(&mut rng, n) {
                    // Offsets 0..3 into larger buffers make the blocks unaligned.
                    let skew = rng.gen_range(0..4);
                    let raw = random_blocks(&mut rng, n, len + skew);
                    let data: Vec<&[u8]> = raw.iter().map(|b| &b[skew..]).collect();
                    let (mut p_ref, mut q_ref, mut r_ref) =
                        (vec![0; len], vec![0; len], vec![0; len]);
                    Scalar.gen_pqr(&data, &exps, &mut p_ref, &mut q_ref, &mut r_ref);
                    for imp in simd_impls() {
                        let context = format!("{} len={len} exps={exps:?}", imp.name());
                        let (mut p, mut q) = (vec![0xa5; len], vec![0x5a; len]);
                        imp.gen_pq(&data, &exps, &mut p, &mut q);
                        assert_eq!(p, p_ref, "P {context}");
                        assert_eq!(q, q_ref, "Q {context}");
                        q.fill(0x33);
                        imp.gen_q(&data, &exps, &mut q);
                        assert_eq!(q, q_ref, "gen_q {context}");
                        p.fill(0x33);
                        imp.gen_p(&data, &mut p);
                        assert_eq!(p, p_ref, "gen_p {context}");
                        let mut r = vec![0x77; len];
                        p.fill(0x11);
                        q.fill(0x22);
                        imp.gen_pqr(&data, &exps, &mut p, &mut q, &mut r);
                        assert_eq!(p, p_ref, "gen_pqr P {context}");
                        assert_eq!(q, q_ref, "gen_pqr Q {context}");
                        assert_eq!(r, r_ref, "gen_pqr R {context}");
                    }
                }
            }
        }
    }

    #[test]
    fn fused_recovery_matches_scalar_for_every_pair() {
        let mut rng = rng(0xfa11);
        for len in [0, 1, 63, 64, 65, 255, 256, 257, 300, 4096, 4099] {
            for n in [2, 3, 4, 8, 14] {
                for exps in all_exponent_sets(&mut rng, n) {
                    let blocks = random_blocks(&mut rng, n, len);
                    let data = as_slices(&blocks);
                    let (mut p, mut q) = (vec![0; len], vec![0; len]);
                    Scalar.gen_pq(&data, &exps, &mut p, &mut q);
                    for x in 0..n {
                        for y in (0..n).filter(|&y| y != x) {
                            let keep = |k: &usize| *k != x && *k != y;
                            let present: Vec<&[u8]> =
                                (0..n).filter(keep).map(|k| data[k]).collect();
                            let present_exps: Vec<u8> =
                                (0..n).filter(keep).map(|k| exps[k]).collect();
                            for imp in simd_impls() {
                                let (mut out_x, mut out_y) = (vec![0xa5; len], vec![0x5a; len]);
                                recover_two_data(
                                    imp,
                                    &present,
                                    &present_exps,
                                    &p,
                                    &q,
                                    exps[x],
                                    exps[y],
                                    &mut out_x,
                                    &mut out_y,
                                );
                                let context =
                                    format!("{} len={len} exps={exps:?} x={x} y={y}", imp.name());
                                assert_eq!(out_x, blocks[x], "{context}");
                                assert_eq!(out_y, blocks[y], "{context}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fused_three_data_recovery_matches_scalar() {
        let mut rng = rng(0x3fa1);
        let lengths = [0, 1, 63, 64, 65, 255, 256, 257, 511, 512, 513, 4096, 4099];
        for len in lengths {
            for n in [3, 4, 7, 14] {
                for exps in all_exponent_sets(&mut rng, n) {
                    // Unaligned blocks, as in generation_matches_scalar.
                    let skew = rng.gen_range(0..4);
                    let raw = random_blocks(&mut rng, n, len + skew);
                    let data: Vec<&[u8]> = raw.iter().map(|b| &b[skew..]).collect();
                    let mut parity = [vec![0; len], vec![0; len], vec![0; len]];
                    let [p, q, r] = &mut parity;
                    Scalar.gen_pqr(&data, &exps, p, q, r);
                    // The first, last and a middle block: their order in the
                    // Horner walk differs from the solve's x, y, z.
                    let lost = [0, n / 2, n - 1];
                    let keep = |k: &usize| !lost.contains(k);
                    let present: Vec<&[u8]> = (0..n).filter(keep).map(|k| data[k]).collect();
                    let present_exps: Vec<u8> = (0..n).filter(keep).map(|k| exps[k]).collect();
                    for imp in simd_impls() {
                        let mut outs = [vec![0xa5; len], vec![0x5a; len], vec![0x33; len]];
                        let [x, y, z] = &mut outs;
                        let parity = [&p[..], &q[..], &r[..]];
                        let lost_exps = lost.map(|k| exps[k]);
                        imp.recover_three(&present, &present_exps, parity, lost_exps, [x, y, z]);
                        for (out, k) in outs.iter().zip(lost) {
                            let context = format!("{} len={len} exps={exps:?} k={k}", imp.name());
                            assert_eq!(&out[..], data[k], "{context}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn element_operations_match_scalar_on_unaligned_buffers() {
        let mut rng = rng(0xe1e);
        for len in lengths() {
            let skew = len % 4;
            let src_raw = random_blocks(&mut rng, 1, len + skew).remove(0);
            let dst_raw = random_blocks(&mut rng, 1, len + skew).remove(0);
            let (src, dst) = (&src_raw[skew..], &dst_raw[skew..]);
            let coef: u8 = rng.gen();
            for imp in simd_impls() {
                let (mut got, mut want) = (dst.to_vec(), dst.to_vec());
                imp.mul_acc(&mut got, src, coef);
                Scalar.mul_acc(&mut want, src, coef);
                assert_eq!(got, want, "{} mul_acc len={len} coef={coef}", imp.name());
                imp.scale(&mut got, coef);
                Scalar.scale(&mut want, coef);
                assert_eq!(got, want, "{} scale len={len} coef={coef}", imp.name());
                imp.xor_into(&mut got, src);
                Scalar.xor_into(&mut want, src);
                assert_eq!(got, want, "{} xor_into len={len}", imp.name());
            }
        }
    }

    #[test]
    fn every_simd_implementation_this_cpu_has_is_listed() {
        let names: Vec<&str> = implementations().iter().map(|i| i.name()).collect();
        assert_eq!(names[0], "scalar");
        for name in &names[1..] {
            assert!(known_names().contains(name), "{name}");
        }
        #[cfg(target_arch = "x86_64")]
        {
            let expect = [
                ("ssse3", is_x86_feature_detected!("ssse3")),
                ("avx2", is_x86_feature_detected!("avx2")),
                ("avx512bw", is_x86_feature_detected!("avx512bw")),
                (
                    "gfni",
                    is_x86_feature_detected!("gfni") && is_x86_feature_detected!("avx512bw"),
                ),
            ];
            for (name, detected) in expect {
                assert_eq!(names.contains(&name), detected, "{name}");
            }
            let gfni_avx2 = is_x86_feature_detected!("gfni") && is_x86_feature_detected!("avx2");
            assert_eq!(names.contains(&"gfni-avx2"), gfni_avx2);
        }
        // NEON is part of every ARMv8-A CPU: on aarch64 (run under
        // qemu-user by tests/cross/aarch64-parity) the tests above and
        // below must have run it.
        #[cfg(target_arch = "aarch64")]
        assert!(names.contains(&"neon"), "{names:?}");
    }

    #[test]
    fn nibble_tables_multiply() {
        for c in 0..=255u8 {
            let [lo, hi] = nibble_tables(c);
            for x in 0..=255u8 {
                let product = lo[(x & 15) as usize] ^ hi[(x >> 4) as usize];
                assert_eq!(product, mul_bitwise(c, x));
            }
        }
    }

    /// gf2p8affineqb emulated from Intel's pseudocode, to check the matrices
    /// on machines without GFNI as well.
    fn affine_byte(matrix: u64, x: u8) -> u8 {
        (0..8).fold(0u8, |out, i| {
            let row = (matrix >> (8 * (7 - i))) as u8;
            out | ((((row & x).count_ones() & 1) as u8) << i)
        })
    }

    #[test]
    fn affine_matrices_multiply() {
        for c in 0..=255u8 {
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(affine_byte(matrix, x), mul_bitwise(c, x), "c={c} x={x}");
            }
        }
    }
}
