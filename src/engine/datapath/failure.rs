//! Failures on the request path as values. A read that a member fails
//! (after its one retry) comes back as `PathError::MemberRead` with the
//! role it holds, so that the caller corrects it from redundancy or fails
//! the member (md's fix_read_error) by looking at a field; anything else
//! is the array's (too many members lost, a journal that failed, a target
//! gone) and goes to the client as it is. Member writes need no such
//! value: the executor settles them per target (`View::settle_writes`).
//!
//! A distributed spare is a member too, and the member trait speaks
//! `io::Error`: the child it met an error on travels inside that error
//! (`array::dspare::child_of`), the one place the engine looks inside one.

use std::io;

#[derive(Debug)]
pub(in crate::engine) enum PathError {
    /// The member in `role` failed a read.
    MemberRead { role: usize, error: io::Error },
    /// The request cannot be served as asked; no one member is to blame.
    Array(io::Error),
}

impl PathError {
    /// The error underneath, for a reason or an event.
    pub(in crate::engine) fn error(&self) -> &io::Error {
        match self {
            PathError::MemberRead { error, .. } | PathError::Array(error) => error,
        }
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::MemberRead { role, error } => write!(f, "member {role}: {error}"),
            PathError::Array(error) => write!(f, "{error}"),
        }
    }
}

impl From<io::Error> for PathError {
    fn from(error: io::Error) -> Self {
        PathError::Array(error)
    }
}

impl PathError {
    /// What a client or a job's event is told, the member named. Not a
    /// `From`: a `?` that turned a member's failure into a plain error
    /// would hide it from the caller that corrects it.
    pub(in crate::engine) fn into_io(self) -> io::Error {
        match self {
            PathError::MemberRead { ref error, .. } => {
                io::Error::new(error.kind(), self.to_string())
            }
            PathError::Array(error) => error,
        }
    }
}
