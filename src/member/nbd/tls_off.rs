//! The stand-in for `tls.rs` in a build without the `tls` feature.

use super::proto::Stream;
use super::uri::{NbdUri, Tls};
use std::io;

pub fn client(
    _stream: Box<dyn Stream>,
    uri: &NbdUri,
    _tls: &Tls,
) -> io::Result<(Box<dyn Stream>, String)> {
    Err(unsupported(uri))
}

pub fn unsupported(uri: &NbdUri) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "{}: this uraid was built without TLS (cargo feature `tls`)",
            uri.text
        ),
    )
}
