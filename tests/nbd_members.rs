//! NBD exports as array members: a raid6 over nbdkit and qemu-nbd peers on
//! unix sockets and loopback TCP, served, losing a peer, rebuilt onto a new
//! one, copied out offline; TLS with a pre-shared key; and the refusals.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MEMBER_BYTES: u64 = 48 << 20;

fn nbdkit_memory(listen: PeerListen) -> Peer {
    start_nbdkit_peer(listen, &[], &["memory", &MEMBER_BYTES.to_string()])
}

fn tcp() -> PeerListen {
    PeerListen::Tcp {
        addr: "127.0.0.1".into(),
        port: free_tcp_port(),
    }
}

fn unix(dir: &Path, name: &str) -> PeerListen {
    PeerListen::Unix(dir.join(name))
}

/// The "state" of a served array's detail, once it contains `want`.
fn wait_for_state(served: &Served, want: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let state = served.detail_json()["state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state.contains(want) {
            return state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the array's state is {state:?}, never {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn raid6_over_nbd_peers_serves_degrades_rebuilds_and_copies_out() {
    let dir = scratch("nbd-members");
    let d = dir.path();
    let files = sparse_files(d, "qemu", &[MEMBER_BYTES, MEMBER_BYTES]);
    let file_peer = sparse_files(d, "kitfile", &[MEMBER_BYTES]);
    let mut peers = [
        nbdkit_memory(unix(d, "kit0.sock")),
        nbdkit_memory(tcp()),
        start_nbdkit_peer(tcp(), &[], &["file", file_peer[0].to_str().unwrap()]),
        nbdkit_memory(unix(d, "kit3.sock")),
        start_qemu_nbd_peer(unix(d, "qemu0.sock"), &files[0], "disk0"),
        start_qemu_nbd_peer(tcp(), &files[1], "disk1"),
    ];
    let uris: Vec<String> = peers.iter().map(Peer::uri).collect();
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();

    let mut args = vec!["create", "--level", "6", "--raid-devices", "6"];
    args.extend_from_slice(&members);
    uraid_ok(&args);

    // examine and detail read a URI as they read a file.
    let out = uraid_ok(&["examine", members[5]]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("{}:", members[5])), "{text}");
    assert!(text.contains("Raid Level : raid6"), "{text}");
    assert_eq!(examine_states(&members), vec!["clean"; 6]);
    let detail = detail_offline(&members);
    assert_eq!(detail["raid_devices"], 6, "{detail}");
    let size = array_bytes(&members);

    let served = serve(d, &[], &members);
    // The short status names where each export is served, not only the
    // export (which an nbdkit peer leaves empty): host:port, or the socket.
    let tcp_name = |uri: &str| uri.strip_prefix("nbd://").unwrap().to_string();
    let status = served.status_text();
    for named in [
        "unix:kit0.sock/[0]".to_string(),
        format!("{}[1]", tcp_name(members[1])),
        "unix:qemu0.sock/disk0[4]".to_string(),
        format!("{}[5]", tcp_name(members[5])),
    ] {
        assert!(status.contains(&named), "{named} in:\n{status}");
    }
    assert!(tcp_name(members[5]).starts_with("127.0.0.1:"), "{status}");
    let (image_path, image_bytes) = image(d, "image", 61, size);
    nbdcopy_in(&image_path, served.uri());
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &image_bytes,
        "read back through the array",
    );

    // A peer dies: its member fails on the next I/O, the data stays.
    peers[1].kill();
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &image_bytes,
        "read with one peer gone",
    );
    let state = wait_for_state(&served, "degraded");
    let stderr = served.stderr();
    assert!(
        stderr.contains(&format!("event Fail {}", members[1])),
        "state {state}; stderr:\n{stderr}"
    );
    let status = served.status_text();
    let failed = format!("{}[1](F)", tcp_name(members[1]));
    assert!(status.contains(&failed), "{failed} in:\n{status}");

    // A peer nobody serves is refused in one line, and nothing changes.
    let nobody = format!("nbd://127.0.0.1:{}/", free_tcp_port());
    let err = manage_refused(&served.control, &["--add", &nobody]);
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(served.detail_json()["state"].as_str(), Some(state.as_str()));

    // A new peer takes its place and is rebuilt from the others.
    let spare = nbdkit_memory(tcp());
    let spare_uri = spare.uri();
    manage_ok(&served.control, &["--add", &spare_uri]);
    wait_until_in_sync(&served, Duration::from_secs(30));
    let state = served.detail_json()["state"].to_string();
    assert!(!state.contains("degraded"), "{state}");
    served.stop();

    // Offline, with the rebuilt member in place of the lost one and the
    // first member left out: copy-out reconstructs it.
    let mut offline: Vec<&str> = members.clone();
    offline[1] = &spare_uri;
    offline.remove(0);
    assert_same_bytes(&copy_out(&offline, d), &image_bytes, "copy-out");
    drop(spare);
}

#[test]
fn nbds_with_a_pre_shared_key_is_a_member_and_plaintext_is_refused() {
    let dir = scratch("nbd-tls");
    let d = dir.path();
    let psk = d.join("keys.psk");
    std::fs::write(
        &psk,
        "alice:8fd0ec1d56b9e0f3b4c0dd2c8ba0a9e6ba3d5e1f0c7a92f3d1e4b6a8c0d2e4f6\n",
    )
    .unwrap();
    let listen = tcp();
    let tls_peer = start_nbdkit_peer(
        listen.clone(),
        &["--tls=require", &format!("--tls-psk={}", psk.display())],
        &["memory", &MEMBER_BYTES.to_string()],
    );
    let plain_peer = nbdkit_memory(unix(d, "plain.sock"));
    let tls_uri = format!(
        "{}?tls-psk-file={}&tls-username=alice",
        listen.uri_with_scheme(true, ""),
        psk.display()
    );
    let plain_uri = plain_peer.uri();
    uraid_ok(&[
        "create",
        "--level",
        "1",
        "--raid-devices",
        "2",
        &tls_uri,
        &plain_uri,
    ]);
    let out = uraid_ok(&["examine", &tls_uri]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Raid Level : raid1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The session is TLS 1.3, and on a CPU with AES instructions its
    // suite is AES-GCM (with a PSK, OpenSSL's own order would pick
    // ChaCha20, several times slower there).
    let out = uraid().args(["doctor", &tls_uri]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("nbd transport"))
        .unwrap_or_else(|| panic!("no transport line in:\n{text}"));
    assert!(line.contains("TLS, TLSv1.3 TLS_"), "{line}");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has_aes = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "aes"));
    if has_aes {
        assert!(line.contains("TLS_AES_128_GCM_SHA256"), "{line}");
    }

    // The same server without TLS, a key file that is not there, a user
    // without a key: one line each.
    let err = uraid_refused(&["examine", &tls_peer.uri()]);
    assert!(err.contains("requires TLS"), "{err}");
    let missing = tls_uri.replace("keys.psk", "nokeys.psk");
    let err = uraid_refused(&["examine", &missing]);
    assert!(
        err.contains("nokeys.psk") && err.contains("No such file"),
        "{err}"
    );
    let bob = tls_uri.replace("tls-username=alice", "tls-username=bob");
    let err = uraid_refused(&["examine", &bob]);
    assert!(err.contains("no key for user \"bob\""), "{err}");
}

#[test]
fn bad_nbd_members_are_refused_in_one_line_and_change_nothing() {
    let dir = scratch("nbd-refusals");
    let d = dir.path();
    let good: Vec<Peer> = (0..3)
        .map(|i| nbdkit_memory(unix(d, &format!("good{i}.sock"))))
        .collect();
    let uris: Vec<String> = good.iter().map(Peer::uri).collect();
    let small = start_nbdkit_peer(unix(d, "small.sock"), &[], &["memory", "1M"]);
    let image = sparse_files(d, "named", &[MEMBER_BYTES]);
    let named = start_qemu_nbd_peer(unix(d, "named.sock"), &image[0], "only");
    let unreachable = format!("nbd://127.0.0.1:{}/", free_tcp_port());

    let create = |last: &str| {
        uraid_refused(&[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            &uris[0],
            &uris[1],
            last,
        ])
    };
    let err = create(&unreachable);
    assert!(err.contains("Connection refused"), "{err}");
    let err = create(&named.listen.uri("other"));
    assert!(err.contains("no export named \"other\""), "{err}");
    let err = create(&small.uri());
    assert!(err.contains("too small") || err.contains("small"), "{err}");
    for (uri, why) in [
        ("nbd+unix:///x", "needs ?socket="),
        ("nbd://h/e?bogus=1", "unknown query parameter"),
        ("nbd://127.0.0.1:99999/e", "bad port"),
    ] {
        let err = create(uri);
        assert!(err.contains(why), "{uri}: {err}");
    }
    // Nothing was written to the good members.
    for uri in &uris {
        let err = uraid_refused(&["examine", uri]);
        assert!(err.contains("no md superblock"), "{err}");
    }

    // An export that is another array's member is that array's, as a file.
    uraid_ok(&[
        "create",
        "--level",
        "1",
        "--raid-devices",
        "2",
        &uris[0],
        &uris[1],
    ]);
    let err = create(&uris[2]);
    assert!(err.contains("appears to be part of an md array"), "{err}");
    // The same export under two spellings is one member: a socket by two
    // paths, a server by its name and its address.
    let twice = |a: &str, b: &str| {
        let err = uraid_refused(&["create", "--level", "1", "--raid-devices", "2", a, b]);
        assert!(err.contains("given twice"), "{a} {b}: {err}");
    };
    twice(&uris[2], &uris[2].replace("?socket=", "?socket=/."));
    let port = free_tcp_port();
    let _tcp_peer = nbdkit_memory(PeerListen::Tcp {
        addr: "127.0.0.1".into(),
        port,
    });
    twice(
        &format!("nbd://localhost:{port}/e"),
        &format!("nbd://127.0.0.1:{port}/e"),
    );
}

/// A member whose server dies fails its requests at once, stays failed,
/// and serves again after `reconnect` once a server is back on the same
/// export; a server with another export there is refused.
#[test]
fn a_dead_connection_errors_and_reconnect_brings_the_member_back() {
    use uraid::member::{Member, NbdMember};
    let dir = scratch("nbd-reconnect");
    let d = dir.path();
    let file = sparse_files(d, "backing", &[8 << 20]);
    let file_arg = file[0].to_str().unwrap();
    let listen = unix(d, "kit.sock");
    let mut peer = start_nbdkit_peer(listen.clone(), &[], &["file", file_arg]);
    let member = NbdMember::open(&peer.uri(), true).unwrap();
    assert_eq!(member.size_bytes(), 8 << 20);
    let data = random_bytes(3, 1 << 20);
    member.write_at(&data, 1 << 20).unwrap();
    member.flush().unwrap();

    peer.kill();
    let mut buf = vec![0u8; 1 << 20];
    let first = member.read_at(&mut buf, 1 << 20).unwrap_err();
    assert!(first.to_string().contains(&peer.uri()), "{first}");
    let again = member.read_at(&mut buf, 0).unwrap_err();
    assert!(again.to_string().contains("lost"), "{again}");

    // A killed nbdkit leaves its socket file behind.
    let _ = std::fs::remove_file(d.join("kit.sock"));
    let mut other = start_nbdkit_peer(listen.clone(), &[], &["memory", "4M"]);
    let err = member.reconnect().unwrap_err();
    assert!(err.to_string().contains("export changed"), "{err}");
    other.kill();
    let _ = std::fs::remove_file(d.join("kit.sock"));
    let _back = start_nbdkit_peer(listen, &[], &["file", file_arg]);
    member.reconnect().unwrap();
    member.read_at(&mut buf, 1 << 20).unwrap();
    assert_same_bytes(&buf, &data, "read after reconnect");
}

/// A server that never answers holds a request until `reconnect`, which
/// ends the old connections first: the request fails instead of waiting
/// on, and the member serves on the new ones.
#[test]
fn reconnect_ends_a_request_that_a_hung_server_holds() {
    use std::sync::Arc;
    use uraid::member::{Member, NbdMember};
    let dir = scratch("nbd-hung");
    let peer = start_nbdkit_peer(
        unix(dir.path(), "slow.sock"),
        &["--filter=delay"],
        &["memory", "4M", "delay-read=120", "delay-write=0"],
    );
    let member =
        Arc::new(NbdMember::open(&format!("{}&x-connections=1", peer.uri()), true).unwrap());
    member.write_at(&[7u8; 4096], 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = member.clone();
    let waiting = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let _ = tx.send(reader.read_at(&mut buf, 0).map(|_| buf));
    });
    // The read is under way (or about to be): it waits on the server.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    member.reconnect().unwrap();
    let result = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the hung read ended with the reconnect");
    assert!(
        result.is_err(),
        "the read was answered: the server did not hang"
    );
    waiting.join().unwrap();
    member.write_at(&[9u8; 4096], 4096).unwrap();
}

/// A write with FUA reaches the server as one (`NBD_CMD_FLAG_FUA`, which
/// nbdkit's log filter shows as fua=1), also through the member timeout's
/// wrapper; a plain write does not carry it.
#[test]
fn a_fua_write_reaches_the_server_with_its_flag() {
    use std::sync::Arc;
    use uraid::member::{DeadlineMember, Member, NbdMember};
    let dir = scratch("nbd-fua");
    let log = dir.path().join("kit.log");
    let log_arg = format!("logfile={}", log.display());
    let peer = start_nbdkit_peer(
        unix(dir.path(), "kit.sock"),
        &["--filter=log"],
        &["memory", "4M", &log_arg],
    );
    let member: Arc<dyn Member> = Arc::new(NbdMember::open(&peer.uri(), true).unwrap());
    member.write_at(&[1u8; 4096], 0).unwrap();
    member.write_at_fua(&[2u8; 4096], 8192).unwrap();
    let timed = DeadlineMember::new(member.clone(), Duration::from_secs(30));
    timed.write_at_fua(&[3u8; 4096], 16384).unwrap();
    let mut back = vec![0u8; 4096];
    member.read_at(&mut back, 8192).unwrap();
    assert_same_bytes(&back, &[2u8; 4096], "the FUA write's bytes");
    let text = std::fs::read_to_string(&log).unwrap();
    let writes: Vec<&str> = text.lines().filter(|l| l.contains("Write id=")).collect();
    let fua_at = |offset: &str| {
        writes
            .iter()
            .any(|l| l.contains(&format!("offset={offset} ")) && l.contains("fua=1"))
    };
    assert!(fua_at("0x2000"), "no FUA write at 8192 in the log:\n{text}");
    assert!(
        fua_at("0x4000"),
        "no FUA write at 16384 in the log:\n{text}"
    );
    assert!(!fua_at("0x0"), "the plain write carried FUA:\n{text}");
}

/// A client's FUA write to an array over NBD hosts reaches the hosts as
/// FUA writes of its data and both parities (nbdkit's log filter shows
/// fua=1), with no flush of the members; a plain write carries no FUA,
/// and a client's FLUSH reaches every host as one.
#[test]
fn a_clients_fua_write_reaches_the_hosts_as_fua_and_flush_as_flush() {
    let dir = scratch("nbd-fua-array");
    let d = dir.path();
    let logs: Vec<PathBuf> = (0..4).map(|i| d.join(format!("kit{i}.log"))).collect();
    let peers: Vec<Peer> = logs
        .iter()
        .enumerate()
        .map(|(i, log)| {
            let log_arg = format!("logfile={}", log.display());
            start_nbdkit_peer(
                unix(d, &format!("kit{i}.sock")),
                &["--filter=log"],
                &["memory", &MEMBER_BYTES.to_string(), &log_arg],
            )
        })
        .collect();
    let uris: Vec<String> = peers.iter().map(Peer::uri).collect();
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut args = vec![
        "create",
        "--level",
        "6",
        "--raid-devices",
        "4",
        "--assume-clean",
    ];
    args.extend_from_slice(&members);
    uraid_ok(&args);
    let served = serve(d, &[], &members);
    // What the hosts were asked from here on: their logs' new request
    // lines (" Write id=..."; a reply's line reads "...Write id=...").
    let seen: Vec<usize> = logs.iter().map(|l| log_lines(l).len()).collect();
    let since = |what: &str| -> Vec<String> {
        logs.iter()
            .zip(&seen)
            .flat_map(|(l, &n)| log_lines(l).into_iter().skip(n))
            .filter(|l| l.contains(&format!(" {what}")))
            .collect()
    };
    nbdsh_script(
        served.uri(),
        "h.connect_uri(URI)\n\
         h.pwrite(b'\\x5a' * 4096, 1 << 20)\n\
         h.pwrite(b'\\xa5' * 4096, 2 << 20, nbd.CMD_FLAG_FUA)\n\
         assert h.pread(4096, 2 << 20) == b'\\xa5' * 4096\n",
        Duration::from_secs(60),
    );
    let writes = since("Write id=");
    let fua: Vec<&String> = writes.iter().filter(|l| l.contains("fua=1")).collect();
    let all = writes.join("\n");
    // raid6 of 4: a 4 KiB write in one strip writes it, P and Q.
    assert_eq!(fua.len(), 3, "FUA writes on the hosts:\n{all}");
    assert_eq!(
        writes.len(),
        6,
        "member writes for two 4 KiB writes:\n{all}"
    );
    let flushes = since("Flush id=");
    assert!(
        flushes.is_empty(),
        "a FUA write flushed members:\n{flushes:?}"
    );
    nbdsh_script(
        served.uri(),
        "h.connect_uri(URI)\nh.flush()\n",
        Duration::from_secs(60),
    );
    assert_eq!(since("Flush id=").len(), 4, "a client's FLUSH on the hosts");
    served.stop();
}

/// The lines of an nbdkit log (none yet: empty).
fn log_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}
