//! What a served array puts around each member it drives: the fault
//! injector (`serve --fault-injection`) and the member timeout's watchdog
//! (`serve --member-timeout`). One policy for the members opened at start
//! and for those added while serving (`manage --add`, `--replace`, a spare
//! that takes over), so that a new member that hangs is failed as an old
//! one would be.

use super::{DeadlineMember, FaultyMember, Member, MemberRef};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wrapping {
    pub fault_injection: bool,
    /// `None`: I/O waits for ever.
    pub timeout: Option<Duration>,
}

/// A member with its wrappers, and its injector when there is one (the
/// handle `manage --inject` drives).
pub struct Wrapped {
    pub member: MemberRef,
    pub injector: Option<Arc<FaultyMember>>,
}

impl Wrapping {
    pub fn wrap(&self, member: MemberRef) -> Wrapped {
        let (mut member, injector) = if self.fault_injection {
            let faulty = Arc::new(FaultyMember::new(member));
            (faulty.clone() as MemberRef, Some(faulty))
        } else {
            (member, None)
        };
        if let Some(timeout) = self.timeout {
            // A member that keeps the deadline itself needs no watchdog.
            if !member.keep_deadline(timeout) && through_trait(member.as_ref()) {
                member = Arc::new(DeadlineMember::new(member, timeout));
            }
        }
        Wrapped { member, injector }
    }
}

/// Whether every I/O of the member goes through its trait methods, where
/// a deadline can be kept. A member the engine drives through its own
/// descriptor (io_uring, splice, a mapping) lends the kernel the caller's
/// memory and cannot be walked away from; it is a local file or disk,
/// whose hangs the kernel's command timers turn into errors.
fn through_trait(member: &dyn Member) -> bool {
    member.raw_io().is_none() && member.splice_fd().is_none() && member.mapped().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemoryMember;

    #[test]
    fn an_injector_is_handed_out_only_with_fault_injection() {
        let plain = Wrapping::default().wrap(Arc::new(MemoryMember::new("m", 1 << 20, 512)));
        assert!(plain.injector.is_none());
        let wrapping = Wrapping {
            fault_injection: true,
            timeout: Some(Duration::from_secs(1)),
        };
        let wrapped = wrapping.wrap(Arc::new(MemoryMember::new("m", 1 << 20, 512)));
        assert!(wrapped.injector.is_some());
        assert_eq!(wrapped.member.name(), "m");
        assert_eq!(wrapped.member.size_bytes(), 1 << 20);
    }
}
