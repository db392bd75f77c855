//! A member named by an NBD URI: whether its server answers and takes
//! writes, its size, and what guards it on the way (TLS, a local socket).
//! Its disks are on its server's host, so the local block-queue checks do
//! not apply; they are said to be skipped, once.

use super::{Check, Status};
use crate::member::nbd::uri::{Address, TlsAuth};
use crate::member::nbd::{NbdMember, NbdUri};
use crate::member::Member;
use std::sync::mpsc;
use std::time::Duration;

/// How long the server has to answer the handshake: a server that takes
/// one client at a time (qemu-nbd without --shared) and already serves the
/// array accepts the connection but never answers it.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

pub(super) fn checks(text: &str) -> Vec<Check> {
    let name = |what: &str| format!("nbd {what} {text}");
    let uri: NbdUri = match text.parse() {
        Ok(uri) => uri,
        Err(e) => {
            return vec![Check::new(name("export"), Status::Fail, "bad URI").because(e.to_string())]
        }
    };
    let (size_bytes, block_bytes) = match probe(text) {
        Ok(found) => found,
        Err(reason) => {
            return vec![Check::new(name("export"), Status::Fail, "unreachable")
                .because(reason)
                .fix("start the export's server, or check the host, port, socket and firewall")]
        }
    };
    vec![
        Check::new(name("export"), Status::Ok, "reachable")
            .because("the server answered the handshake and takes writes"),
        Check::new(
            name("size"),
            Status::Ok,
            format!("{size_bytes} bytes, {block_bytes}-byte blocks"),
        )
        .because("the array's members need at least the data offset plus the array's share"),
        transport(&uri, name("transport")),
        Check::unavailable(
            format!("queue {text}"),
            "a network export has no block queue on this host: the server's disks, their \
             queues and SMART are checked on its host",
        )
        .fix("run uraid doctor on the server's host, with its disk"),
    ]
}

/// Opens the export for writing (as serve would: a read-only export is
/// refused), and closes it at once; the open's own error, without the URI
/// the check's name already carries.
fn probe(text: &str) -> Result<(u64, u32), String> {
    let (tx, rx) = mpsc::channel();
    let uri = text.to_string();
    // On its own thread, so that a server that never answers costs
    // ANSWER_WITHIN, not the connection's own longer timeouts.
    let spawned = std::thread::Builder::new()
        .name("uraid-doctor-nbd".into())
        .spawn(move || {
            let opened = NbdMember::open(&uri, true)
                .map(|m| (m.size_bytes(), m.logical_block_bytes()))
                .map_err(|e| e.to_string());
            let _ = tx.send(opened);
        });
    if let Err(e) = spawned {
        return Err(format!("no thread to connect from: {e}"));
    }
    match rx.recv_timeout(ANSWER_WITHIN) {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => Err(e
            .strip_prefix(&format!("{text}: "))
            .map_or(e.clone(), str::to_string)),
        Err(_) => Err(format!(
            "no answer within {} s (a server that takes one client, as qemu-nbd without \
             --shared, does not answer a second while the array is served)",
            ANSWER_WITHIN.as_secs()
        )),
    }
}

/// What protects the member's blocks between here and its server.
fn transport(uri: &NbdUri, check: String) -> Check {
    match (&uri.tls, &uri.address) {
        (Some(tls), _) => {
            let how = match &tls.auth {
                TlsAuth::Psk { username, .. } => format!("a pre-shared key, user {username}"),
                TlsAuth::X509 { dir } if tls.verify_peer => {
                    format!("X.509 from {}, the server's certificate checked", dir.display())
                }
                TlsAuth::X509 { dir } => format!(
                    "X.509 from {}, the server's certificate NOT checked",
                    dir.display()
                ),
                TlsAuth::System => "X.509, the system's certificate authorities".to_string(),
            };
            Check::new(check, Status::Ok, "TLS").because(how)
        }
        (None, Address::Unix(_)) => Check::new(check, Status::Ok, "unix socket")
            .because("a socket on this host: nothing crosses a network"),
        (None, Address::Tcp { host, .. }) if is_loopback(host) => {
            Check::new(check, Status::Ok, "plaintext, loopback")
                .because("the connection stays on this host")
        }
        (None, Address::Tcp { .. }) => Check::new(check, Status::Warn, "plaintext")
            .because("whoever is on the network path can read and change the member's blocks")
            .fix("serve the export with TLS and name it nbds://…?tls-psk-file=FILE (or tls-certificates=DIR)"),
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_over_a_network_is_a_warning_and_tls_or_a_socket_is_not() {
        let status = |text: &str| transport(&text.parse().unwrap(), "t".into()).status;
        assert_eq!(status("nbd://10.0.0.4/d"), Status::Warn);
        assert_eq!(status("nbd://127.0.0.1:10810/d"), Status::Ok);
        assert_eq!(status("nbd://localhost/d"), Status::Ok);
        assert_eq!(status("nbd+unix:///d?socket=/run/s"), Status::Ok);
        assert_eq!(status("nbds://u@10.0.0.4/d?tls-psk-file=/k"), Status::Ok);
    }

    #[test]
    fn an_unreachable_export_is_one_failed_line() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // The listener is gone: nothing answers on the port.
        let text = format!("nbd://127.0.0.1:{port}/d");
        let checks = checks(&text);
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].status, Status::Fail);
        assert!(
            !checks[0].reason.starts_with("nbd://"),
            "{}",
            checks[0].reason
        );
    }
}
