//! The stand-in for `tls.rs` in a build without the `tls` feature: the same
//! interface, and every attempt to load credentials refused in one line.

use super::io::Sock;
use super::tls_config::{TlsCredentials, TlsMode};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Never built: `load` always refuses.
#[derive(Clone, Debug)]
pub struct Tls {
    pub mode: TlsMode,
    never: std::convert::Infallible,
}

impl Tls {
    pub fn load(_mode: TlsMode, _credentials: &TlsCredentials) -> Result<Tls, String> {
        Err("this uraid was built without TLS (cargo feature `tls`)".into())
    }

    pub(crate) fn start(
        &self,
        _sock: &Sock,
        _wake: RawFd,
        _deadline: Option<Instant>,
        _linger: Option<Duration>,
    ) -> Result<(Sock, std::thread::JoinHandle<()>), String> {
        match self.never {}
    }
}
