//! Memory that direct I/O accepts: `AlignedBuf`, and the per-thread bounce
//! buffers through which I/O on ordinary memory reaches an O_DIRECT member.
//!
//! O_DIRECT moves data between the device and the caller's memory without a
//! copy, so the kernel refuses (EINVAL) memory that is not aligned to what the
//! device can DMA to. Every device uraid supports is content with 4096 bytes,
//! so one alignment serves them all. The engine's own buffers should be
//! `AlignedBuf`s; memory that is not aligned still works, through a bounce
//! buffer, one copy slower.
//!
//! Safety contract for the `unsafe` in this file: an `AlignedBuf` of `len`
//! above 0 owns one allocation of `Layout { size: len, align: ALIGN_BYTES }`
//! made by `alloc_zeroed`, freed exactly once in `Drop` with the same
//! layout; an empty one owns nothing and its `ptr` is `ALIGN_BYTES` itself,
//! non-null, aligned and never read or written through (its slices are
//! empty). `ptr` is never null and the first `len` bytes are initialised
//! (zeroed, then written only through safe slices).

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;
use std::io;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;

/// The alignment of every `AlignedBuf`, in bytes.
pub const ALIGN_BYTES: usize = 4096;

/// A zeroed byte buffer whose first byte is aligned to `ALIGN_BYTES`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an AlignedBuf owns its memory exclusively, as a Vec<u8> does.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes, aligned to `ALIGN_BYTES`.
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            // A row write asks for an empty buffer per parity column it
            // does not have, on every request: an aligned allocation of a
            // byte would cost more than the 4 KiB write it serves.
            let ptr = NonNull::new(ALIGN_BYTES as *mut u8).expect("not null");
            return AlignedBuf { ptr, len };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (`len` is above 0).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        assert_eq!(ptr.as_ptr() as usize % ALIGN_BYTES, 0);
        AlignedBuf { ptr, len }
    }

    /// A copy of `data` in aligned memory.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }

    fn layout(len: usize) -> Layout {
        assert!(len > 0, "an empty buffer allocates nothing");
        Layout::from_size_align(len, ALIGN_BYTES).expect("buffer size fits in isize")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: allocated in `zeroed` with this very layout, freed once here.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes live at `ptr` while `self` does.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::copy_from(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Whether `ptr` is aligned to `align_bytes` (a power of two).
pub(crate) fn is_aligned(ptr: *const u8, align_bytes: usize) -> bool {
    debug_assert!(align_bytes.is_power_of_two());
    (ptr as usize).is_multiple_of(align_bytes)
}

/// The largest bounce buffer a thread keeps for reuse; a synchronous I/O
/// larger than this is bounced in pieces of this size.
pub(crate) const BOUNCE_BYTES_MAX: usize = 1 << 20;
/// What a thread keeps for reuse, in bytes and in buffers. A batch may need
/// more at once; the rest is freed after it. NBD serves with tens of worker
/// threads, so an idle thread must hold little: 1 MiB at most.
const BOUNCE_POOL_BYTES_MAX: usize = 1 << 20;
const BOUNCE_POOL_MAX: usize = 8;

thread_local! {
    static BOUNCE_POOL: RefCell<Vec<AlignedBuf>> = const { RefCell::new(Vec::new()) };
}

/// A bounce buffer of at least `len` bytes (contents unspecified), from this
/// thread's pool when one fits. Give it back with `give_bounce`.
pub(crate) fn take_bounce(len: usize) -> AlignedBuf {
    let pooled = BOUNCE_POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        // The smallest buffer that fits, so that small I/O leaves the large
        // buffers for large I/O.
        let best = (0..pool.len())
            .filter(|&i| pool[i].len() >= len)
            .min_by_key(|&i| pool[i].len());
        best.map(|i| pool.swap_remove(i))
    });
    pooled.unwrap_or_else(|| AlignedBuf::zeroed(len.next_multiple_of(ALIGN_BYTES)))
}

/// Returns a bounce buffer to this thread's pool, or frees it when the pool
/// would go over its bounds.
pub(crate) fn give_bounce(buf: AlignedBuf) {
    BOUNCE_POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let held_bytes: usize = pool.iter().map(|b| b.len()).sum();
        if pool.len() < BOUNCE_POOL_MAX && held_bytes + buf.len() <= BOUNCE_POOL_BYTES_MAX {
            pool.push(buf);
        }
    });
}

/// Does a synchronous I/O of `len_bytes` at `offset_bytes` through one of
/// this thread's bounce buffers, in pieces of at most BOUNCE_BYTES_MAX:
/// `io(staged, at, piece)` moves the bytes `piece` of the caller's memory
/// between `staged` and the member at `at`. Stops at the first error.
pub(crate) fn in_bounce_pieces(
    len_bytes: usize,
    offset_bytes: u64,
    mut io: impl FnMut(&mut [u8], u64, Range<usize>) -> io::Result<()>,
) -> io::Result<()> {
    let mut bounce = take_bounce(len_bytes.min(BOUNCE_BYTES_MAX));
    let mut result = Ok(());
    for start in (0..len_bytes).step_by(BOUNCE_BYTES_MAX) {
        let piece = start..len_bytes.min(start + BOUNCE_BYTES_MAX);
        let at = offset_bytes + start as u64;
        result = io(&mut bounce[..piece.len()], at, piece);
        if result.is_err() {
            break;
        }
    }
    give_bounce(bounce);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for len in [0, 1, 511, 512, 4096, 4097, 1 << 20] {
            let mut buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(is_aligned(buf.as_ptr(), ALIGN_BYTES));
            assert!(buf.iter().all(|&b| b == 0));
            for (i, b) in buf.iter_mut().enumerate() {
                *b = i as u8;
            }
            let copy = buf.clone();
            assert!(is_aligned(copy.as_ptr(), ALIGN_BYTES));
            assert_eq!(&copy[..], &buf[..]);
            assert_eq!(format!("{buf:?}"), format!("AlignedBuf({len} bytes)"));
        }
    }

    #[test]
    fn bounce_pool_reuses_and_stays_bounded() {
        // The pool is per thread: a fresh thread starts empty.
        std::thread::spawn(|| {
            let a = take_bounce(4096);
            let a_ptr = a.as_ptr();
            give_bounce(a);
            let b = take_bounce(512);
            assert_eq!(b.as_ptr(), a_ptr, "a pooled buffer that fits is reused");
            let big = take_bounce(BOUNCE_BYTES_MAX + 1);
            assert!(big.len() > BOUNCE_BYTES_MAX);
            give_bounce(big);
            give_bounce(b);
            let held: Vec<AlignedBuf> = (0..BOUNCE_POOL_MAX + 3)
                .map(|_| take_bounce(8192))
                .collect();
            for buf in held {
                give_bounce(buf);
            }
            let pool_len = || BOUNCE_POOL.with(|pool| pool.borrow().len());
            assert_eq!(pool_len(), BOUNCE_POOL_MAX, "at most this many are kept");
            // Bytes bound the pool too: with 1 MiB held, not one page more.
            BOUNCE_POOL.with(|pool| pool.borrow_mut().clear());
            give_bounce(take_bounce(BOUNCE_BYTES_MAX));
            give_bounce(take_bounce(4096));
            assert_eq!(pool_len(), 1);
            BOUNCE_POOL.with(|pool| {
                let held_bytes: usize = pool.borrow().iter().map(|b| b.len()).sum();
                assert_eq!(held_bytes, BOUNCE_POOL_BYTES_MAX);
            });
        })
        .join()
        .unwrap();
    }
}
