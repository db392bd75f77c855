//! What `uraid serve --tls` asks for, apart from the TLS library: so that a
//! build without the `tls` feature (the cross-compiled parity tests, which
//! have no target OpenSSL) still parses and refuses the options clearly.

use std::path::PathBuf;

/// How a server offers TLS, with nbdkit's `--tls` meanings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// `NBD_OPT_STARTTLS` is offered; plaintext clients are served too.
    On,
    /// Every option but `NBD_OPT_STARTTLS` (and `NBD_OPT_ABORT`) is refused
    /// with `NBD_REP_ERR_TLS_REQD` until TLS is up.
    Require,
}

/// Where the server's TLS credentials come from.
#[derive(Clone, Debug)]
pub enum TlsCredentials {
    /// A psktool key file: lines `username:hexkey`.
    Psk(PathBuf),
    /// A directory with `ca-cert.pem`, `server-cert.pem` and
    /// `server-key.pem` (nbdkit's and qemu's layout); with `verify_peer`,
    /// clients must present a certificate signed by the CA.
    X509 { dir: PathBuf, verify_peer: bool },
}
