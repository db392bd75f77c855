//! Bus errors in member mappings. A load or store through a mapping past
//! the end of its file (another process cut the member's file short under
//! the array) or into a page tmpfs cannot allocate is a SIGBUS, which
//! would end the process: every array it serves, for one member's trouble.
//! md in the same place gets an I/O error and fails the member.
//!
//! So mappings are registered here, and a SIGBUS handler (installed with
//! the first) that finds the faulting address inside one puts an anonymous
//! page where the file's page was, so that the instruction completes, and
//! marks the mapping *faulted*. Whoever copied through it checks the mark
//! afterwards (`Mapped`'s reads and writes do) and reports an I/O error;
//! the engine then fails the member as it would for any other. A bus error
//! anywhere else goes to the handler that was there before (Rust's stack
//! overflow report) or, if there was none, ends the process as it would
//! have.
//!
//! The handler only reads atomics and calls `mmap`, which is safe in a
//! signal handler in practice (a system call, no lock of this process).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Mappings registered at most at once; past that a member is not mapped
/// and its I/O goes through `pread`/`pwrite` (slower, nothing else).
const REGISTERED_MAX: usize = 4096;

/// A slot being filled: its range is not to be looked at yet.
const CLAIMED: usize = usize::MAX;

struct Slot {
    /// The mapping's first byte; 0 when the slot is free.
    base: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static SLOTS: [Slot; REGISTERED_MAX] = [FREE; REGISTERED_MAX];

/// The SIGBUS disposition before ours, for bus errors that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();
static PAGE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A mapping's registration, released when dropped (before the mapping
/// is unmapped: the field that holds it comes first).
pub(super) struct Registration(usize);

impl Registration {
    /// Registers `[base, base + len)`, installing the handler if it is not
    /// yet. `None` when every slot is taken or the handler cannot be
    /// installed: the caller does not map then.
    pub(super) fn new(base: usize, len: usize) -> Option<Registration> {
        assert!(base != 0 && base != CLAIMED && len > 0);
        if !install() {
            return None;
        }
        for (index, slot) in SLOTS.iter().enumerate() {
            if slot
                .base
                .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                slot.len.store(len, Ordering::Release);
                slot.faulted.store(false, Ordering::SeqCst);
                // The range becomes visible to the handler whole.
                slot.base.store(base, Ordering::Release);
                return Some(Registration(index));
            }
        }
        None
    }

    /// Whether a bus error has hit the mapping: what it holds from then on
    /// is not the file's.
    pub(super) fn faulted(&self) -> bool {
        SLOTS[self.0].faulted.load(Ordering::SeqCst)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        SLOTS[self.0].base.store(0, Ordering::Release);
    }
}

/// Installs the handler once; says whether it is in place.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        PAGE_BYTES.store(usize::try_from(page).unwrap_or(4096), Ordering::Relaxed);
        // SAFETY: a zeroed sigaction is a valid value; every field used is
        // set below.
        let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
        ours.sa_sigaction = on_bus_error as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sa_mask is ours to fill.
        unsafe { libc::sigemptyset(&mut ours.sa_mask) };
        // SAFETY: as above.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live sigaction values.
        if unsafe { libc::sigaction(libc::SIGBUS, &ours, &mut previous) } == 0 {
            let _ = PREVIOUS.set(previous);
        }
    });
    PREVIOUS.get().is_some()
}

extern "C" fn on_bus_error(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A SIGBUS sent by a process (kill, sigqueue) is not a fault here.
    let fault = code > 0;
    for slot in SLOTS.iter().filter(|_| fault) {
        let base = slot.base.load(Ordering::Acquire);
        if base == 0 || base == CLAIMED || address < base {
            continue;
        }
        let len = slot.len.load(Ordering::Acquire);
        // The slot could have been released and claimed again between the
        // two loads: then its base and length are not one mapping's.
        if slot.base.load(Ordering::Acquire) != base || address - base >= len {
            continue;
        }
        // Marked before the page is replaced: a copy on another thread
        // that reads the new page's zeros must find the mark when it checks.
        slot.faulted.store(true, Ordering::SeqCst);
        let page_bytes = PAGE_BYTES.load(Ordering::Relaxed);
        let page = address & !(page_bytes - 1);
        // SAFETY: the page lies in a mapping this process made and still
        // holds (registered); an anonymous page in its place is what the
        // faulting copy completes into, and the mark says so.
        let replaced = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                page_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if replaced == libc::MAP_FAILED {
            // Returning would fault again forever.
            // SAFETY: abort is async-signal-safe.
            unsafe { libc::abort() };
        }
        return;
    }
    pass_on(signal, info, context, fault);
}

/// A bus error that is not in a member's mapping: what would have happened
/// without this module.
fn pass_on(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
    fault: bool,
) {
    // Unset only while the handler is being installed, before any mapping
    // exists: then there was no fault of ours to tell apart either.
    let handler = PREVIOUS.get().map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_IGN && !fault {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Back to the default, and the faulting instruction runs again: the
        // process ends with SIGBUS (ignoring it would loop forever). A sent
        // signal is sent again, to be delivered once this handler returns.
        // SAFETY: resetting a disposition and raise are async-signal-safe.
        unsafe {
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
            if !fault {
                libc::raise(libc::SIGBUS);
            }
        }
        return;
    }
    let previous = PREVIOUS.get().expect("a handler was there, so it was kept");
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: a handler installed with SA_SIGINFO has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(signal, info, context);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO has this one.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
}
