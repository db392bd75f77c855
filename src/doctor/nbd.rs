//! A member named by an NBD URI: whether its server answers and takes
//! writes, its size, and what guards it on the way (TLS, a local socket).
//! Its disks are on its server's host, so the local block-queue checks do
//! not apply; they are said to be skipped, once.

use super::{Check, Status};
use crate::member::nbd::uri::{Address, TlsAuth};
use crate::member::nbd::{NbdMember, NbdUri};
use crate::member::Member;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long the server has to answer the handshake: a server that takes
/// one client at a time (qemu-nbd without --shared) and already serves the
/// array accepts the connection but never answers it.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The export's size and block size, or why it could not be opened.
/// What opening the export found.
struct Opened {
    size_bytes: u64,
    block_bytes: u32,
    /// The TLS protocol and suite negotiated, on a TLS export.
    tls_session: Option<String>,
}

/// An export being asked, from a thread of its own, so that several are
/// asked at once and a server that never answers costs `ANSWER_WITHIN`,
/// not the connection's own longer timeouts.
pub(super) struct Probe {
    text: String,
    deadline: Instant,
    answer: Result<mpsc::Receiver<Result<Opened, String>>, String>,
}

impl Probe {
    /// Opens the export for writing (as serve would: a read-only export is
    /// refused), and closes it at once.
    pub(super) fn start(text: &str) -> Probe {
        let (tx, rx) = mpsc::channel();
        let uri = text.to_string();
        let spawned = std::thread::Builder::new()
            .name("uraid-doctor-nbd".into())
            .spawn(move || {
                let opened = NbdMember::open(&uri, true)
                    .map(|m| Opened {
                        size_bytes: m.size_bytes(),
                        block_bytes: m.logical_block_bytes(),
                        tls_session: m.tls_session(),
                    })
                    .map_err(|e| e.to_string());
                let _ = tx.send(opened);
            });
        Probe {
            text: text.to_string(),
            deadline: Instant::now() + ANSWER_WITHIN,
            answer: spawned
                .map(|_| rx)
                .map_err(|e| format!("no thread to connect from: {e}")),
        }
    }

    /// The open's result; its error without the URI the check's name
    /// already carries.
    fn answer(&self) -> Result<Opened, String> {
        let rx = self.answer.as_ref().map_err(String::clone)?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(e
                .strip_prefix(&format!("{}: ", self.text))
                .map_or(e.clone(), str::to_string)),
            Err(_) => Err(format!(
                "no answer within {} s (a server that takes no more clients while it \
                 serves the array, as qemu-nbd without --shared, accepts and never answers)",
                ANSWER_WITHIN.as_secs()
            )),
        }
    }

    pub(super) fn checks(self) -> Vec<Check> {
        let text = self.text.as_str();
        let name = |what: &str| format!("nbd {what} {text}");
        let uri: NbdUri = match text.parse() {
            Ok(uri) => uri,
            Err(e) => {
                return vec![
                    Check::new(name("export"), Status::Fail, "bad URI").because(e.to_string())
                ]
            }
        };
        let Opened {
            size_bytes,
            block_bytes,
            tls_session,
        } = match self.answer() {
            Ok(found) => found,
            Err(reason) => {
                return vec![Check::new(name("export"), Status::Fail, "unreachable")
                    .because(reason)
                    .fix(
                        "start the export's server, or check the host, port, socket and firewall",
                    )]
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
            .because(
                "what the export offers: a member holds its data offset and its share of the array",
            ),
            transport(&uri, name("transport"), tls_session.as_deref()),
            no_queue(text),
        ]
    }
}

/// A member of an array served here: its state there stands for the
/// answer of its server, which is not asked again.
pub(super) fn served_checks(text: &str, state: &str) -> Vec<Check> {
    let name = |what: &str| format!("nbd {what} {text}");
    let export = if state.contains("faulty") {
        Check::new(name("export"), Status::Warn, format!("served: {state}"))
            .because("the array serving it failed it")
            .fix("uraid detail says why; uraid manage --add it once its server answers")
    } else {
        Check::new(name("export"), Status::Ok, format!("served: {state}"))
            .because("a member of an array served here, answering it")
    };
    let mut checks = vec![export];
    if let Ok(uri) = text.parse::<NbdUri>() {
        checks.push(transport(&uri, name("transport"), None));
    }
    checks.push(no_queue(text));
    checks
}

fn no_queue(text: &str) -> Check {
    Check::unavailable(
        format!("queue {text}"),
        "a network export has no block queue on this host: the server's disks, their \
         queues and SMART are checked on its host",
    )
    .fix("run uraid doctor on the server's host, with its disk")
}

/// What protects the member's blocks between here and its server, with
/// the TLS session negotiated when the export was asked.
fn transport(uri: &NbdUri, check: String, session: Option<&str>) -> Check {
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
            match session {
                Some(session) => Check::new(check, Status::Ok, format!("TLS, {session}"))
                    .because(format!("{how}; the session's protocol and suite")),
                None => Check::new(check, Status::Ok, "TLS").because(how),
            }
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
        let status = |text: &str| transport(&text.parse().unwrap(), "t".into(), None).status;
        assert_eq!(status("nbd://10.0.0.4/d"), Status::Warn);
        assert_eq!(status("nbd://127.0.0.1:10810/d"), Status::Ok);
        assert_eq!(status("nbd://localhost/d"), Status::Ok);
        assert_eq!(status("nbd+unix:///d?socket=/run/s"), Status::Ok);
        assert_eq!(status("nbds://u@10.0.0.4/d?tls-psk-file=/k"), Status::Ok);
    }

    #[test]
    fn a_served_member_is_judged_by_its_array_not_asked_again() {
        let text = "nbd://10.0.0.4/d";
        let checks = served_checks(text, "active sync");
        assert_eq!(checks.len(), 3, "{checks:?}");
        assert_eq!(checks[0].status, Status::Ok);
        assert_eq!(checks[2].status, Status::Unavailable);
        let failed = served_checks(text, "faulty");
        assert_eq!(failed[0].status, Status::Warn);
        assert!(failed[0].value.contains("faulty"), "{:?}", failed[0]);
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
        let checks = Probe::start(&text).checks();
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].status, Status::Fail);
        assert!(
            !checks[0].reason.starts_with("nbd://"),
            "{}",
            checks[0].reason
        );
    }
}
