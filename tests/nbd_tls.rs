//! TLS on NBD exports (`uraid serve --tls`), against the real clients:
//! libnbd's nbdinfo and nbdcopy (`nbds://` URIs with tls-psk-file or
//! tls-certificates) and qemu-img (`tls-creds-psk`, `tls-creds-x509`), all
//! GnuTLS programs. Keys are written in psktool's format and certificates
//! made with certtool at test time.

mod common;
use common::*;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use uraid::export::nbd::proto;

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn mirror(dir: &Path, prefix: &str) -> Vec<String> {
    let members = create_array(
        dir,
        prefix,
        &["--level", "raid1", "--raid-devices", "2"],
        2,
        16 * MIB,
    );
    members.iter().map(|m| m.display().to_string()).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// nbdinfo on `uri`: its output on success, or its stderr on failure.
fn nbdinfo(uri: &str) -> Result<String, String> {
    let tool = client_tool("nbdinfo", "libnbd-bin");
    let out = run_limited(Command::new(tool).arg(uri), LIMIT);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

fn refused(uri: &str, what: &str) -> String {
    match nbdinfo(uri) {
        Ok(out) => panic!("{what}: nbdinfo {uri} was served:\n{out}"),
        Err(stderr) => stderr,
    }
}

fn qemu_img_info(object: &str, port: u16) -> Result<String, String> {
    let tool = client_tool("qemu-img", "qemu-utils");
    let out = run_limited(
        Command::new(tool)
            .args(["info", "--output=json", "--object", object, "--image-opts"])
            .arg(format!(
                "driver=nbd,host=127.0.0.1,port={port},export=uraid,tls-creds=tls0"
            )),
        LIMIT,
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Sends one option on a raw connection and returns the reply's type.
fn option_reply(sock: &mut std::net::TcpStream, option: u32, data: &[u8]) -> u32 {
    let mut msg = proto::IHAVEOPT.to_be_bytes().to_vec();
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    sock.write_all(&msg).unwrap();
    let mut head = [0u8; 20];
    sock.read_exact(&mut head).unwrap();
    assert_eq!(head[0..8], proto::OPTION_REPLY_MAGIC.to_be_bytes());
    assert_eq!(head[8..12], option.to_be_bytes());
    let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
    let mut rest = vec![0u8; len as usize];
    sock.read_exact(&mut rest).unwrap();
    u32::from_be_bytes(head[12..16].try_into().unwrap())
}

/// A psktool key file with one user and a random 32-byte key.
fn psk_file(path: &Path, user: &str, seed: u64) {
    let key: String = random_bytes(seed, 32)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(path, format!("{user}:{key}\n")).unwrap();
}

#[test]
fn psk_require_round_trip_and_refusals() {
    let dir = scratch("nbd-tls-psk");
    let d = dir.path();
    let members = mirror(d, "psk-m");
    let members = strs(&members);
    let keys = d.join("keys.psk");
    psk_file(&keys, "alice", 1);
    let wrong = d.join("wrong.psk");
    psk_file(&wrong, "alice", 2);
    let port = free_port();
    let served = serve_tcp(
        d,
        port,
        &["--tls", "require", "--tls-psk", keys.to_str().unwrap()],
        &members,
    );
    assert!(
        !served.stderr().contains("WARNING"),
        "--tls require warned: {}",
        served.stderr()
    );
    let good = format!(
        "nbds://alice@127.0.0.1:{port}/?tls-psk-file={}",
        keys.display()
    );

    let info = nbdinfo(&good).unwrap_or_else(|e| panic!("nbdinfo {good}: {e}"));
    assert!(info.contains("with TLS"), "{info}");
    let size = array_bytes(&members);
    let (image, data) = image(d, "in.img", 7, size);
    nbdcopy_in(&image, &good);
    assert_same_bytes(&nbdcopy_out(&good, d), &data, "nbdcopy through TLS-PSK");

    // No TLS: every option refused with NBD_REP_ERR_TLS_REQD, no export.
    let stderr = refused(
        &format!("nbd://127.0.0.1:{port}/"),
        "plaintext against require",
    );
    assert!(!stderr.contains("export-size"), "{stderr}");
    // The same on the wire: TLS_REQD for every option but STARTTLS, which
    // is acknowledged.
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(Some(LIMIT)).unwrap();
    let mut greeting = [0u8; 18];
    raw.read_exact(&mut greeting).unwrap();
    raw.write_all(&3u32.to_be_bytes()).unwrap();
    assert_eq!(
        option_reply(&mut raw, proto::OPT_LIST, &[]),
        proto::REP_ERR_TLS_REQD
    );
    let go = proto::encode_info_request(&proto::InfoRequest {
        name: String::new(),
        requests: vec![],
    });
    assert_eq!(
        option_reply(&mut raw, proto::OPT_GO, &go),
        proto::REP_ERR_TLS_REQD
    );
    assert_eq!(
        option_reply(&mut raw, proto::OPT_STARTTLS, &[]),
        proto::REP_ACK
    );
    drop(raw);
    // A wrong key fails the TLS handshake (TLS 1.3's PSK binder).
    refused(
        &format!(
            "nbds://alice@127.0.0.1:{port}/?tls-psk-file={}",
            wrong.display()
        ),
        "wrong key",
    );
    // A user the server does not know, with alice's key.
    let bob = d.join("bob.psk");
    std::fs::write(
        &bob,
        std::fs::read_to_string(&keys)
            .unwrap()
            .replace("alice", "bob"),
    )
    .unwrap();
    refused(
        &format!(
            "nbds://bob@127.0.0.1:{port}/?tls-psk-file={}",
            bob.display()
        ),
        "unknown user",
    );

    // qemu's client: a directory holding keys.psk, and a username.
    let object = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        d.display()
    );
    let info = qemu_img_info(&object, port).unwrap_or_else(|e| panic!("qemu-img info: {e}"));
    assert!(
        info.contains(&format!("\"virtual-size\": {size}")),
        "{info}"
    );

    let stderr = served.stop();
    assert!(stderr.contains("TLS handshake failed"), "{stderr}");
    // What was written through TLS is on the members.
    assert_same_bytes(&copy_out(&members, d), &data, "members after TLS writes");
}

fn certtool(args: &[&str], template: Option<(&Path, &str)>) {
    let tool = client_tool("certtool", "gnutls-bin");
    let mut cmd = Command::new(tool);
    cmd.args(args);
    if let Some((path, text)) = template {
        std::fs::write(path, text).unwrap();
        cmd.arg("--template").arg(path);
    }
    run_limited_ok(&mut cmd, LIMIT);
}

/// A CA in `dir`: ca-key.pem and ca-cert.pem.
fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("ca-key.pem");
    certtool(
        &["--generate-privkey", "--outfile", key.to_str().unwrap()],
        None,
    );
    certtool(
        &[
            "--generate-self-signed",
            "--load-privkey",
            key.to_str().unwrap(),
            "--outfile",
            dir.join("ca-cert.pem").to_str().unwrap(),
        ],
        Some((
            &dir.join("ca.info"),
            &format!("cn = {name}\nca\ncert_signing_key\nexpiration_days = 2\n"),
        )),
    );
}

/// A certificate signed by the CA in `ca`, written as `out/PREFIX-cert.pem`
/// and `out/PREFIX-key.pem`.
fn make_cert(ca: &Path, out: &Path, prefix: &str, role: &str) {
    std::fs::create_dir_all(out).unwrap();
    let key = out.join(format!("{prefix}-key.pem"));
    certtool(
        &["--generate-privkey", "--outfile", key.to_str().unwrap()],
        None,
    );
    certtool(
        &[
            "--generate-certificate",
            "--load-privkey",
            key.to_str().unwrap(),
            "--load-ca-certificate",
            ca.join("ca-cert.pem").to_str().unwrap(),
            "--load-ca-privkey",
            ca.join("ca-key.pem").to_str().unwrap(),
            "--outfile",
            out.join(format!("{prefix}-cert.pem")).to_str().unwrap(),
        ],
        Some((
            &out.join(format!("{prefix}.info")),
            &format!(
                "cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n{role}\n\
                 encryption_key\nsigning_key\nexpiration_days = 2\n"
            ),
        )),
    );
}

#[test]
fn x509_verified_both_ways() {
    let dir = scratch("nbd-tls-x509");
    let d = dir.path();
    let ca = d.join("ca");
    make_ca(&ca, "uraid test CA");
    let server = d.join("server");
    make_cert(&ca, &server, "server", "tls_www_server");
    std::fs::copy(ca.join("ca-cert.pem"), server.join("ca-cert.pem")).unwrap();
    // A client with a certificate from the CA, one with none, and one that
    // trusts another CA.
    let client = d.join("client");
    make_cert(&ca, &client, "client", "tls_www_client");
    std::fs::copy(ca.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
    let anonymous = d.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let stranger = d.join("stranger");
    make_ca(&stranger, "another CA");

    let members = mirror(d, "x509-m");
    let members = strs(&members);
    let port = free_port();
    let served = serve_tcp(
        d,
        port,
        &[
            "--tls",
            "require",
            "--tls-certificates",
            server.to_str().unwrap(),
            "--tls-verify-peer",
        ],
        &members,
    );
    let uri = |certs: &Path| {
        format!(
            "nbds://127.0.0.1:{port}/?tls-certificates={}",
            certs.display()
        )
    };
    let info =
        nbdinfo(&uri(&client)).unwrap_or_else(|e| panic!("nbdinfo with a client certificate: {e}"));
    assert!(info.contains("with TLS"), "{info}");
    assert!(
        info.contains(&format!("export-size: {}", array_bytes(&members))),
        "{info}"
    );
    refused(
        &uri(&anonymous),
        "no client certificate with --tls-verify-peer",
    );
    let stderr = refused(
        &uri(&stranger),
        "a server certificate the client does not trust",
    );
    assert!(stderr.contains("certificate"), "{stderr}");

    // qemu's client finds ca-cert.pem, client-cert.pem and client-key.pem in its dir.
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        client.display()
    );
    let info = qemu_img_info(&object, port).unwrap_or_else(|e| panic!("qemu-img info: {e}"));
    assert!(info.contains("virtual-size"), "{info}");
    served.stop();
}

#[test]
fn tls_on_serves_both_and_plaintext_tcp_warns() {
    let dir = scratch("nbd-tls-on");
    let d = dir.path();
    let members = mirror(d, "on-m");
    let members = strs(&members);
    let keys = d.join("keys.psk");
    psk_file(&keys, "carol", 3);

    let port = free_port();
    let served = serve_tcp(
        d,
        port,
        &["--tls", "on", "--tls-psk", keys.to_str().unwrap()],
        &members,
    );
    assert!(
        served.stderr().contains("also serves plaintext clients"),
        "{}",
        served.stderr()
    );
    let plain = nbdinfo(&format!("nbd://127.0.0.1:{port}/"))
        .unwrap_or_else(|e| panic!("plaintext under --tls on: {e}"));
    assert!(plain.contains("without TLS"), "{plain}");
    let tls = nbdinfo(&format!(
        "nbds://carol@127.0.0.1:{port}/?tls-psk-file={}",
        keys.display()
    ))
    .unwrap_or_else(|e| panic!("TLS under --tls on: {e}"));
    assert!(tls.contains("with TLS"), "{tls}");
    served.stop();

    // A unix socket may carry TLS too, and says nothing about it.
    let served = serve(
        d,
        &["--tls", "require", "--tls-psk", keys.to_str().unwrap()],
        &members,
    );
    assert!(!served.stderr().contains("WARNING"), "{}", served.stderr());
    let socket = served.uri().split("socket=").nth(1).unwrap().to_string();
    let tls = nbdinfo(&format!(
        "nbds+unix://carol@/?socket={socket}&tls-psk-file={}",
        keys.display()
    ))
    .unwrap_or_else(|e| panic!("TLS on a unix socket: {e}"));
    assert!(tls.contains("with TLS"), "{tls}");
    served.stop();

    // Off (the default) on TCP: said loudly, at start.
    let served = serve_tcp(d, free_port(), &[], &members);
    let stderr = served.stop();
    assert!(
        stderr.contains("WARNING") && stderr.contains("anyone who reaches this port"),
        "{stderr}"
    );
}

#[test]
fn missing_or_bad_credentials_serve_nothing() {
    let dir = scratch("nbd-tls-bad");
    let d = dir.path();
    let members = mirror(d, "bad-m");
    let before: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let nbd = format!("tcp:127.0.0.1:{}", free_port());
    let control = d.join("ctl.sock");
    let run = |tls: &[&str]| {
        let mut args = vec![
            "serve",
            "--nbd",
            &nbd,
            "--control",
            control.to_str().unwrap(),
        ];
        args.extend_from_slice(tls);
        args.extend(members.iter().map(String::as_str));
        uraid_refused(&args)
    };
    let missing = d.join("missing.psk");
    let err = run(&["--tls", "require", "--tls-psk", missing.to_str().unwrap()]);
    assert!(err.contains("missing.psk"), "{err}");
    let garbled = d.join("garbled.psk");
    std::fs::write(&garbled, "alice:not-hex\n").unwrap();
    let err = run(&["--tls", "require", "--tls-psk", garbled.to_str().unwrap()]);
    assert!(err.contains("line 1"), "{err}");
    let empty = d.join("empty-dir");
    std::fs::create_dir_all(&empty).unwrap();
    let err = run(&["--tls", "on", "--tls-certificates", empty.to_str().unwrap()]);
    assert!(err.contains("ca-cert.pem"), "{err}");
    let err = run(&["--tls", "require"]);
    assert!(err.contains("--tls-psk"), "{err}");
    let after: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    assert!(before == after, "a refused serve changed the members");
}
