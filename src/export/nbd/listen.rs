//! Where the server listens: parsing `unix:PATH` / `tcp:HOST:PORT`, and
//! creating the listening socket safely.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// An address to listen on.
///
/// Written as `unix:PATH` for a unix-domain socket (the usual choice on one
/// host: no network exposure, and access controlled by file permissions) or
/// `tcp:HOST:PORT` for TCP, where HOST may be a name, an IPv4 address or a
/// bracketed IPv6 address (`tcp:[::1]:10809`). Port 0 picks a free port; the
/// actual one is in [`super::ServerHandle::local_addr`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listener {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl FromStr for Listener {
    type Err = String;

    fn from_str(text: &str) -> Result<Listener, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(format!("'{text}': the unix socket path is empty"));
            }
            // sun_path holds 108 bytes including the terminating NUL.
            if path.len() > 107 {
                return Err(format!(
                    "'{text}': unix socket paths are limited to 107 bytes"
                ));
            }
            if path.contains('\0') {
                return Err(format!("'{text}': the path contains NUL"));
            }
            return Ok(Listener::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("tcp:") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| format!("'{text}': expected tcp:HOST:PORT"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| format!("'{text}': '{port}' is not a port number"))?;
            let host = match host.strip_prefix('[') {
                Some(inner) => inner
                    .strip_suffix(']')
                    .ok_or_else(|| format!("'{text}': unterminated '[' in the host"))?,
                None if host.contains(':') => {
                    return Err(format!(
                        "'{text}': write IPv6 addresses in brackets, as tcp:[::1]:{port}"
                    ))
                }
                None => host,
            };
            if host.is_empty() {
                return Err(format!(
                    "'{text}': the host is empty (use 0.0.0.0 or [::] for every address)"
                ));
            }
            return Ok(Listener::Tcp {
                host: host.to_string(),
                port,
            });
        }
        Err(format!("'{text}': expected unix:PATH or tcp:HOST:PORT"))
    }
}

impl fmt::Display for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listener::Unix(path) => write!(f, "unix:{}", path.display()),
            Listener::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Listener::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

/// The address a running server is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl BoundAddr {
    /// The NBD URI a libnbd or qemu client would use for the default export.
    pub fn uri(&self) -> String {
        match self {
            BoundAddr::Unix(path) => format!("nbd+unix:///?socket={}", path.display()),
            BoundAddr::Tcp(SocketAddr::V4(a)) => format!("nbd://{}:{}", a.ip(), a.port()),
            BoundAddr::Tcp(SocketAddr::V6(a)) => format!("nbd://[{}]:{}", a.ip(), a.port()),
        }
    }
}

impl fmt::Display for BoundAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            BoundAddr::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// A bound, listening socket.
pub(crate) enum Bound {
    /// The listener, its path, and the (device, inode) of the socket file we
    /// created, so that shutdown removes our file and not a successor's.
    Unix(UnixListener, PathBuf, (u64, u64)),
    Tcp(TcpListener),
}

impl Bound {
    pub(crate) fn addr(&self) -> io::Result<BoundAddr> {
        match self {
            Bound::Unix(_, path, _) => Ok(BoundAddr::Unix(path.clone())),
            Bound::Tcp(l) => Ok(BoundAddr::Tcp(l.local_addr()?)),
        }
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        match self {
            Bound::Unix(l, _, _) => l.as_raw_fd(),
            Bound::Tcp(l) => l.as_raw_fd(),
        }
    }

    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Bound::Unix(l, _, _) => l.set_nonblocking(true),
            Bound::Tcp(l) => l.set_nonblocking(true),
        }
    }

    /// Removes the socket file if it is still the one this server created.
    pub(crate) fn remove_socket_file(&self) {
        if let Bound::Unix(_, path, id) = self {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if (meta.dev(), meta.ino()) == *id {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}

/// Binds and listens.
pub(crate) fn bind(listener: &Listener) -> io::Result<Bound> {
    match listener {
        Listener::Unix(path) => bind_unix(path),
        Listener::Tcp { host, port } => {
            let addrs: Vec<SocketAddr> = (host.as_str(), *port).to_socket_addrs()?.collect();
            if addrs.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("'{host}' resolves to no address"),
                ));
            }
            Ok(Bound::Tcp(TcpListener::bind(&addrs[..])?))
        }
    }
}

/// Creates a unix socket that only the owner can connect to.
///
/// A leftover socket file from a server that died is removed, but only after
/// checking that nothing accepts connections on it: deleting the socket of a
/// running server would silently orphan it (its clients could no longer
/// reconnect). Anything at the path that is not a socket is left alone.
fn bind_unix(path: &Path) -> io::Result<Bound> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{}: another server is listening on this socket",
                        path.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{}: cannot tell whether the existing socket is in use: {e}",
                        path.display()
                    ),
                ))
            }
        },
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }

    // std's UnixListener::bind creates the file with the process umask, which
    // typically leaves it connectable by group or others for a moment (or for
    // good). On Linux the mode of the socket inode at bind time becomes the
    // file's mode, so setting it with fchmod before bind closes that window
    // without touching the process-wide umask (other threads may be creating
    // files). The chmod afterwards covers platforms where fchmod on a socket
    // does not carry over.
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod on a valid descriptor.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sockaddr_un is plain data; zeroed is a valid initial value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not usable as a unix socket path (too long or contains NUL)",
                path.display()
            ),
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: addr is a properly initialised sockaddr_un of at least `len` bytes.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        let err = io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(err);
    }
    let meta = std::fs::symlink_metadata(path)?;
    Ok(Bound::Unix(
        UnixListener::from(fd),
        path.to_path_buf(),
        (meta.dev(), meta.ino()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!(
            "unix:/run/uraid.sock".parse(),
            Ok(Listener::Unix("/run/uraid.sock".into()))
        );
        assert_eq!("unix:rel/x".parse(), Ok(Listener::Unix("rel/x".into())));
        assert_eq!(
            "tcp:localhost:10809".parse(),
            Ok(Listener::Tcp {
                host: "localhost".into(),
                port: 10809
            })
        );
        assert_eq!(
            "tcp:0.0.0.0:0".parse(),
            Ok(Listener::Tcp {
                host: "0.0.0.0".into(),
                port: 0
            })
        );
        assert_eq!(
            "tcp:[::1]:10809".parse(),
            Ok(Listener::Tcp {
                host: "::1".into(),
                port: 10809
            })
        );
        for text in ["unix:/a", "tcp:h:1", "tcp:[::1]:2"] {
            assert_eq!(text.parse::<Listener>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "/tmp/sock",
            "unix:",
            "udp:h:1",
            "tcp:",
            "tcp:host",
            "tcp:host:",
            "tcp:host:65536",
            "tcp:host:-1",
            "tcp::10809",
            "tcp:::1:10809",
            "tcp:[::1:10809",
            "tcp:[]:1",
        ] {
            assert!(bad.parse::<Listener>().is_err(), "{bad:?} should not parse");
        }
        let long = format!("unix:/{}", "a".repeat(200));
        assert!(long.parse::<Listener>().is_err());
    }

    #[test]
    fn uris() {
        assert_eq!(
            BoundAddr::Unix("/x/s".into()).uri(),
            "nbd+unix:///?socket=/x/s"
        );
        assert_eq!(
            BoundAddr::Tcp("127.0.0.1:5".parse().unwrap()).uri(),
            "nbd://127.0.0.1:5"
        );
        assert_eq!(
            BoundAddr::Tcp("[::1]:5".parse().unwrap()).uri(),
            "nbd://[::1]:5"
        );
    }

    #[test]
    fn unix_socket_mode_and_stale_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let bound = bind_unix(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A live socket is not replaced.
        let err = bind_unix(&path).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // A dead one is.
        drop(bound);
        assert!(path.exists());
        let again = bind_unix(&path).unwrap();
        again.remove_socket_file();
        assert!(!path.exists());
        // A regular file is never removed.
        std::fs::write(&path, b"precious").unwrap();
        assert_eq!(
            bind_unix(&path).err().unwrap().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }
}
