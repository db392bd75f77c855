//! NBD URIs (NetworkBlockDevice/nbd `doc/uri.md`): `nbd://host[:port]/export`,
//! `nbds://…` (TLS), `nbd+unix:///export?socket=PATH` and `nbds+unix://…`,
//! with the query parameters libnbd accepts for TLS. Pure.

use std::fmt;
use std::net::ToSocketAddrs;
use std::path::PathBuf;

/// The port IANA assigned to NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Connections a member opens at most, when `x-connections` is not given
/// and the server allows several.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// The largest `x-connections` accepted: each connection is a socket and,
/// on the server, usually a thread.
pub const CONNECTIONS_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// How the client proves itself, or checks the server, under TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsAuth {
    /// A psktool key file and the user name whose key to use.
    Psk { file: PathBuf, username: String },
    /// A folder in libnbd's layout: `ca-cert.pem`, and optionally
    /// `client-cert.pem` and `client-key.pem`.
    X509 { dir: PathBuf },
    /// The system's certificate authorities.
    System,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    pub auth: TlsAuth,
    /// The name the server's certificate must carry (the host by default).
    pub hostname: Option<String>,
    pub verify_peer: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// The URI as given, for messages and as the member's name.
    pub text: String,
    pub address: Address,
    pub export: String,
    pub tls: Option<Tls>,
    /// `x-connections`: the most connections to open when the server
    /// allows several (`NBD_FLAG_CAN_MULTI_CONN`).
    pub connections: usize,
}

/// Whether `text` is meant as an NBD URI rather than a path: it starts
/// with one of the schemes (a path never contains `://` after a scheme-like
/// word, and a file literally named so can still be given as `./nbd:…`).
pub fn is_nbd_uri(text: &str) -> bool {
    ["nbd:", "nbds:", "nbd+", "nbds+"]
        .iter()
        .any(|scheme| text.starts_with(scheme))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriError(String);

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UriError {}

fn percent_decode(text: &str, what: &str) -> Result<String, UriError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| UriError(format!("bad percent-escape in the {what}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UriError(format!("the {what} is not UTF-8")))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, UriError> {
    match value {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(UriError(format!("{key}={value}: expected 0 or 1"))),
    }
}

/// The local user's name: the default TLS user name, as libnbd's.
fn login_name() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; the
    // name is copied out at once, on this thread.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            if let Ok(name) = std::ffi::CStr::from_ptr((*pw).pw_name).to_str() {
                return name.to_string();
            }
        }
    }
    std::env::var("USER").unwrap_or_else(|_| "root".into())
}

impl std::str::FromStr for NbdUri {
    type Err = UriError;

    fn from_str(text: &str) -> Result<NbdUri, UriError> {
        let bad = |why: &str| UriError(format!("{text}: {why}"));
        let (scheme, rest) = text.split_once("://").ok_or_else(|| {
            bad("not an NBD URI (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")
        })?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => {
                return Err(bad(
                    "unknown scheme (nbd, nbds, nbd+unix or nbds+unix; vsock is not supported)",
                ))
            }
        };
        if rest.contains('#') {
            return Err(bad("an NBD URI has no fragment"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path, "export name").map_err(|e| bad(&e.0))?;
        if export.contains('\0') {
            return Err(bad("the export name contains NUL"));
        }
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((user, hostport)) => (
                Some(percent_decode(user, "user name").map_err(|e| bad(&e.0))?),
                hostport,
            ),
            None => (None, authority),
        };

        let mut socket = None;
        let mut psk_file = None;
        let mut username = userinfo;
        let mut certificates = None;
        let mut hostname = None;
        let mut verify_peer = true;
        let mut tls_type = None;
        let mut connections = DEFAULT_CONNECTIONS;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value, key).map_err(|e| bad(&e.0))?;
            match key {
                "socket" => socket = Some(PathBuf::from(value)),
                "tls-psk-file" => psk_file = Some(PathBuf::from(value)),
                "tls-username" => username = Some(value),
                "tls-certificates" => certificates = Some(PathBuf::from(value)),
                "tls-hostname" => hostname = Some(value),
                "tls-verify-peer" => {
                    verify_peer = parse_bool(key, &value).map_err(|e| bad(&e.0))?
                }
                "tls-type" => tls_type = Some(value),
                "x-connections" => {
                    connections = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=CONNECTIONS_MAX).contains(n))
                        .ok_or_else(|| {
                            bad(&format!(
                                "x-connections={value}: expected 1 to {CONNECTIONS_MAX}"
                            ))
                        })?
                }
                _ => return Err(bad(&format!("unknown query parameter `{key}`"))),
            }
        }

        let address = if unix {
            if !hostport.is_empty() {
                return Err(bad(&format!(
                    "a unix-socket URI has no host (write {scheme}:///EXPORT?socket=PATH)"
                )));
            }
            let socket = socket.ok_or_else(|| bad("a unix-socket URI needs ?socket=PATH"))?;
            if socket.as_os_str().is_empty() {
                return Err(bad("socket= is empty"));
            }
            Address::Unix(socket)
        } else {
            if socket.is_some() {
                return Err(bad(&format!(
                    "socket= belongs to {scheme}+unix:// URIs, not {scheme}://"
                )));
            }
            let (host, port) = split_host_port(hostport).map_err(|e| bad(&e))?;
            Address::Tcp { host, port }
        };

        let any_tls_parameter = psk_file.is_some()
            || certificates.is_some()
            || hostname.is_some()
            || tls_type.is_some();
        let tls = if tls {
            let auth = match (tls_type.as_deref(), psk_file, certificates) {
                (Some("anon"), _, _) => {
                    return Err(bad("tls-type=anon: anonymous TLS is not supported"))
                }
                (_, Some(_), Some(_)) => {
                    return Err(bad("give tls-psk-file or tls-certificates, not both"))
                }
                (Some("x509"), Some(_), _) => return Err(bad("tls-type=x509 with tls-psk-file")),
                (Some("psk"), None, _) => return Err(bad("tls-type=psk needs tls-psk-file=FILE")),
                (Some(other), _, _) if !matches!(other, "psk" | "x509") => {
                    return Err(bad(&format!("tls-type={other}: expected psk or x509")))
                }
                (_, Some(file), None) => TlsAuth::Psk {
                    file,
                    username: username.unwrap_or_else(login_name),
                },
                (_, None, Some(dir)) => TlsAuth::X509 { dir },
                (_, None, None) => TlsAuth::System,
            };
            Some(Tls {
                auth,
                hostname,
                verify_peer,
            })
        } else {
            if any_tls_parameter {
                return Err(bad(&format!(
                    "TLS parameters in a plaintext URI: use {}",
                    if unix { "nbds+unix://" } else { "nbds://" }
                )));
            }
            None
        };
        Ok(NbdUri {
            text: text.to_string(),
            address,
            export,
            tls,
            connections,
        })
    }
}

fn split_host_port(hostport: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address needs its closing `]`")?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or("junk after the IPv6 address")?,
                ),
            ),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("no host (nbd://HOST[:PORT]/EXPORT)".into());
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port `{port}`"))?,
    };
    Ok((host.to_string(), port))
}

impl NbdUri {
    /// Where the server is reached, for refusing one export given twice
    /// under two names: the host's addresses (its name when it does not
    /// resolve), or the socket's canonical path.
    pub fn endpoints(&self) -> Vec<String> {
        match &self.address {
            Address::Tcp { host, port } => match (host.as_str(), *port).to_socket_addrs() {
                Ok(addrs) => addrs.map(|a| a.to_string()).collect(),
                Err(_) => vec![format!("{}:{port}", host.to_ascii_lowercase())],
            },
            Address::Unix(path) => {
                let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                vec![path.display().to_string()]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NbdUri, String> {
        text.parse::<NbdUri>().map_err(|e| e.to_string())
    }

    #[test]
    fn the_spec_examples_name_their_exports() {
        for (uri, export) in [
            ("nbd://example.com/disk", "disk"),
            ("nbd+unix:///disk?socket=sock", "disk"),
            ("nbd://example.com/", ""),
            ("nbd://example.com", ""),
            ("nbd://example.com//disk", "/disk"),
            ("nbd://example.com/hello%20world", "hello world"),
        ] {
            assert_eq!(parse(uri).unwrap().export, export, "{uri}");
        }
    }

    #[test]
    fn ports_default_to_10809_and_ipv6_literals_keep_their_colons() {
        let uri = parse("nbd://example.com/d").unwrap();
        assert_eq!(
            uri.address,
            Address::Tcp {
                host: "example.com".into(),
                port: 10809
            }
        );
        let uri = parse("nbd://[::1]:1234/d").unwrap();
        assert_eq!(
            uri.address,
            Address::Tcp {
                host: "::1".into(),
                port: 1234
            }
        );
        assert_eq!(
            parse("nbd://[fe80::1]/").unwrap().address,
            Address::Tcp {
                host: "fe80::1".into(),
                port: 10809
            }
        );
    }

    #[test]
    fn tls_takes_its_credentials_from_the_query() {
        let uri = parse("nbds://alice@h:99/e?tls-psk-file=/k%20s").unwrap();
        assert_eq!(
            uri.tls.unwrap().auth,
            TlsAuth::Psk {
                file: "/k s".into(),
                username: "alice".into()
            }
        );
        let uri = parse("nbds+unix:///e?socket=/s&tls-certificates=/c&tls-verify-peer=0").unwrap();
        let tls = uri.tls.unwrap();
        assert_eq!(tls.auth, TlsAuth::X509 { dir: "/c".into() });
        assert!(!tls.verify_peer);
        assert_eq!(uri.address, Address::Unix("/s".into()));
        assert_eq!(parse("nbd://h/e?x-connections=2").unwrap().connections, 2);
    }

    #[test]
    fn malformed_uris_are_refused_with_a_reason() {
        for (uri, why) in [
            ("nbd+unix:///e", "needs ?socket="),
            ("nbd+unix://h/e?socket=/s", "has no host"),
            ("nbd:///e", "no host"),
            ("nbd://h:0/e", "bad port"),
            ("nbd://h:70000/e", "bad port"),
            ("nbd://h/e?frobnicate=1", "unknown query parameter"),
            ("nbd://h/e?tls-psk-file=/k", "use nbds://"),
            ("nbd://h/e?socket=/s", "belongs to"),
            ("nbd://h/%zz", "percent-escape"),
            ("nbd://h/e?x-connections=0", "expected 1 to"),
            ("nbds://h/e?tls-type=anon", "not supported"),
            ("nbd+vsock:///e", "unknown scheme"),
            ("nbd://[::1/e", "closing"),
        ] {
            let err = parse(uri).unwrap_err();
            assert!(err.contains(why), "{uri}: {err}");
            assert!(!err.contains('\n'));
        }
    }

    #[test]
    fn only_the_nbd_schemes_are_uris() {
        assert!(is_nbd_uri("nbd://h/e"));
        assert!(is_nbd_uri("nbds+unix:///e?socket=/s"));
        assert!(!is_nbd_uri("/dev/sda"));
        assert!(!is_nbd_uri("./nbd://x"));
    }
}
