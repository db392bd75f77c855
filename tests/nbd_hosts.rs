//! NBD members on real hosts: six network namespaces the test creates, each
//! with its own address behind a bridge, each running nbdkit (file plugin)
//! or qemu-nbd on a file. An array over the six keeps serving when one
//! host's link goes down (the member fails once TCP gives up on it), and
//! its members' files are then checked by the Linux kernel's md.
//!
//! Needs root (`ip netns`, a bridge and veth pairs).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const MEMBER_BYTES: u64 = 24 << 20;
const HOSTS: usize = 6;
const NBD_PORT: u16 = 10809;

static NETS: AtomicUsize = AtomicUsize::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Hosts on one bridge in the root namespace: host i is namespace
/// `ns(i)`, reached at `addr(i)` through a veth pair whose root end is a
/// port of the bridge. Names carry the pid and a counter, so parallel tests
/// and runs do not meet; dropping it removes everything it made.
struct Net {
    bridge: String,
    hosts: Vec<String>,
    ports: Vec<String>,
    subnet: String,
}

impl Net {
    fn new(hosts: usize) -> Net {
        let k = NETS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{pid}x{k}");
        let mut net = Net {
            bridge: format!("ub{tag}"),
            hosts: Vec::new(),
            ports: Vec::new(),
            subnet: format!("10.{}.{}", 200 + k % 50, pid % 250),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &net.bridge,
        ]);
        ip(&["link", "set", &net.bridge, "up"]);
        for i in 0..hosts {
            let ns = format!("uh{tag}h{i}");
            let port = format!("uv{tag}h{i}");
            ip(&["netns", "add", &ns]);
            net.hosts.push(ns.clone());
            ip(&[
                "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            net.ports.push(port.clone());
            ip(&["link", "set", &port, "master", &net.bridge, "up"]);
            let addr = format!("{}/24", net.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn addr(&self, host: usize) -> String {
        format!("{}.{}", self.subnet, 10 + host)
    }

    fn listen(&self, host: usize) -> PeerListen {
        PeerListen::Tcp {
            addr: self.addr(host),
            port: NBD_PORT,
        }
    }

    /// `ip netns exec HOST program`: the program runs in the host's
    /// namespace (ip execs it, so the child is the program itself).
    fn exec(&self, host: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[host]]).arg(program);
        cmd
    }

    /// nbdkit's file plugin on `file`, inside `host`.
    fn nbdkit(&self, host: usize, file: &Path) -> Peer {
        let cmd = self.exec(host, &client_tool("nbdkit", "nbdkit"));
        let file = file.to_str().unwrap();
        start_nbdkit_peer_as(
            cmd,
            self.listen(host),
            &["--exit-with-parent"],
            &["file", file],
        )
    }

    /// qemu-nbd on `file` as export `name`, inside `host`.
    fn qemu_nbd(&self, host: usize, file: &Path, name: &str) -> Peer {
        let cmd = self.exec(host, &client_tool("qemu-nbd", "qemu-utils"));
        start_qemu_nbd_peer_as(cmd, self.listen(host), file, name)
    }

    /// The host's cable pulled: its end of the pair goes down inside its
    /// namespace, so nothing reaches it and nothing answers.
    fn link(&self, host: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.hosts[host], "link", "set", "eth0", state]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Best effort and quiet: this also runs while a test is failing.
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip").args(args).output();
        };
        for port in &self.ports {
            quiet(&["link", "del", port]);
        }
        for ns in &self.hosts {
            quiet(&["netns", "del", ns]);
        }
        quiet(&["link", "del", &self.bridge]);
    }
}

/// Six hosts: nbdkit on the first four, qemu-nbd on the last two, each on
/// its own file in `dir`.
fn six_hosts(net: &Net, dir: &Path) -> (Vec<Peer>, Vec<PathBuf>) {
    let files = sparse_files(dir, "host", &[MEMBER_BYTES; HOSTS]);
    let peers = (0..HOSTS)
        .map(|i| match i {
            0..=3 => net.nbdkit(i, &files[i]),
            _ => net.qemu_nbd(i, &files[i], &format!("disk{i}")),
        })
        .collect();
    (peers, files)
}

fn create<'a>(level: &str, uris: &'a [String]) -> Vec<&'a str> {
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut args = vec!["create", "--level", level, "--raid-devices", "6"];
    args.extend_from_slice(&members);
    uraid_ok(&args);
    members
}

/// An ext4 filesystem image of `size` bytes holding a few random files.
fn ext4_image(dir: &Path, name: &str, seed: u64, size: u64) -> (PathBuf, Vec<u8>) {
    let content = dir.join(format!("{name}.d"));
    std::fs::create_dir_all(&content).unwrap();
    for f in 0..4u64 {
        let bytes = random_bytes(seed * 10 + f, (1 << 20) + f as usize * 4099);
        std::fs::write(content.join(format!("f{f}")), bytes).unwrap();
    }
    let path = dir.join(name);
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(size).unwrap();
    sh_ok(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-E", "nodiscard", "-d"])
            .arg(&content)
            .arg(&path),
    );
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// Copies `image` into the array and reads it back: the same bytes, and
/// `e2fsck -fn` finds the filesystem whole.
fn write_and_check(served: &Served, dir: &Path, image: &Path, bytes: &[u8], what: &str) {
    nbdcopy_in(image, served.uri());
    let back = nbdcopy_out(served.uri(), dir);
    assert_same_bytes(&back, bytes, what);
    let copy = dir.join("fsck.img");
    std::fs::write(&copy, &back).unwrap();
    run_e2fsck(copy.to_str().unwrap(), what);
    let _ = std::fs::remove_file(&copy);
}

/// Waits (TCP's user timeout on the member's socket, not a fixed delay)
/// until the served array reports the member in `role` failed: its event
/// names the URI, status marks that role (F). Returns the status text.
fn wait_failed(served: &Served, members: &[&str], role: usize) -> String {
    let uri = members[role];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let text = served.status_text();
        let stderr = served.stderr();
        if stderr.contains(&format!("event Fail {uri}")) && text.contains(&format!("[{role}](F)")) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{uri} never failed; status:\n{text}\nstderr:\n{stderr}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn raid6_over_six_hosts_survives_a_host_losing_its_link_and_md_agrees() {
    let dir = scratch("nbd-hosts-raid6");
    let d = dir.path();
    let net = Net::new(HOSTS);
    let (mut peers, files) = six_hosts(&net, d);
    let uris: Vec<String> = peers.iter().map(Peer::uri).collect();
    let members = create("6", &uris);
    let size = array_bytes(&members);

    let served = serve(d, &[], &members);
    let (first_path, first) = ext4_image(d, "first.img", 1, size);
    write_and_check(&served, d, &first_path, &first, "ext4 on six hosts");

    // Host 2's link goes down: the first request to it waits until TCP
    // gives up, then the member fails and the array serves degraded.
    net.link(2, false);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &first,
        "read with host 2 unreachable",
    );
    let status = wait_failed(&served, &members, 2);
    let detail = served.detail_json();
    assert!(
        detail["state"].as_str().unwrap_or("").contains("degraded"),
        "{detail}"
    );
    let failed_row = detail.to_string();
    assert!(failed_row.contains(members[2]), "{failed_row}");

    // Writes go on degraded: a second filesystem replaces the first.
    let (second_path, second) = ext4_image(d, "second.img", 2, size);
    write_and_check(&served, d, &second_path, &second, "ext4 written degraded");

    // The link comes back; the failed member is removed and added again,
    // and rebuilt from the other five.
    net.link(2, true);
    manage_ok(&served.control, &["--remove", members[2]]);
    manage_ok(&served.control, &["--add", members[2]]);
    wait_until_in_sync(&served, Duration::from_secs(60));
    let state = served.detail_json()["state"].to_string();
    assert!(!state.contains("degraded"), "{state}\n{status}");
    served.stop();
    peers.clear();

    // md assembles the six backing files, reads the second filesystem and
    // its check finds parity consistent.
    let c = KernelCheck {
        name: "hosts6".into(),
        members: files,
        expected: second_path,
        shape: shape("raid6", 6, 512, 2),
    };
    check_in_kernel(&[c], d);
}

#[test]
fn raid10_over_six_hosts_reads_back_with_a_host_down() {
    let dir = scratch("nbd-hosts-raid10");
    let d = dir.path();
    let net = Net::new(HOSTS);
    let (_peers, _files) = six_hosts(&net, d);
    let uris: Vec<String> = _peers.iter().map(Peer::uri).collect();
    let members = create("10", &uris);
    let size = array_bytes(&members);

    let served = serve(d, &[], &members);
    let (image_path, _) = image(d, "image", 10, size);
    nbdcopy_in(&image_path, served.uri());

    // Host 4's link goes down while a new image is written: the writes to
    // its copies wait until TCP gives up on it, then go on without it.
    net.link(4, false);
    let (image_path, image_bytes) = image(d, "image2", 11, size);
    nbdcopy_in(&image_path, served.uri());
    wait_failed(&served, &members, 4);
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &image_bytes,
        "read back with host 4 unreachable",
    );
    served.stop();
}

/// A member timeout shorter than TCP's fails the member by itself: with
/// `--member-timeout 3` a host whose link goes down is failed by the
/// member's own deadline (its reason says so), not by the socket giving
/// up at 30 s, and status names the host that went. When its link comes
/// back, `--auto-re-add` takes it back through the write-intent bitmap:
/// only what was written while it was away is copied.
#[test]
fn a_member_timeout_below_tcps_fails_a_host_off_the_network_by_itself() {
    let dir = scratch("nbd-hosts-timeout");
    let d = dir.path();
    let net = Net::new(3);
    let files = sparse_files(d, "host", &[MEMBER_BYTES; 3]);
    let _peers: Vec<Peer> = (0..3).map(|i| net.nbdkit(i, &files[i])).collect();
    let uris: Vec<String> = _peers.iter().map(Peer::uri).collect();
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut args = vec![
        "create",
        "--level",
        "5",
        "--raid-devices",
        "3",
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "1M",
    ];
    args.extend_from_slice(&members);
    uraid_ok(&args);
    let size = array_bytes(&members);

    let served = serve(d, &["--member-timeout", "3", "--auto-re-add"], &members);
    let (image_path, image_bytes) = image(d, "image", 20, size);
    nbdcopy_in(&image_path, served.uri());
    // The bitmap forgets that write once it is on every member (md's
    // daemon clears bits a few seconds later), so that the re-add below
    // copies only what changes while the host is away.
    wait_status(
        &served.control,
        "a clean bitmap",
        Duration::from_secs(60),
        |s| s["bitmap_dirty_chunks"][0] == 0,
    );

    net.link(1, false);
    // Only the first megabytes change while the host is away; the first
    // write to reach it finds it silent.
    let (patch, changed) = image(d, "patch", 22, 3 << 20);
    let mut expected = image_bytes.clone();
    expected[..changed.len()].copy_from_slice(&changed);
    nbdcopy_in(&patch, served.uri());
    let status = wait_status(
        &served.control,
        "host 1 failed",
        Duration::from_secs(120),
        |s| s["detail"]["member_failures"][members[1]].is_string(),
    );
    let reason = status["detail"]["member_failures"][members[1]]
        .as_str()
        .unwrap();
    assert!(
        reason.starts_with("timeout: ") && reason.contains("no answer within 3 s"),
        "failed by the member timeout, not by TCP: {reason}"
    );
    let text = served.status_text();
    let named = format!("{}:{NBD_PORT}/[1](F)", net.addr(1));
    assert!(text.contains(&named), "{named} in:\n{text}");
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &expected,
        "read back with host 1 off the network",
    );
    net.link(1, true);
    let status = wait_status(
        &served.control,
        "host 1 back in sync",
        Duration::from_secs(120),
        |s| {
            status_whole_and_idle(s)
                && status_events(s)
                    .iter()
                    .any(|(e, d, _)| e == "RebuildFinished" && d == members[1])
        },
    );
    let events = status_events(&status);
    assert!(
        events
            .iter()
            .any(|(e, d, _)| e == "AutoReAdd" && d == members[1]),
        "{events:?}"
    );
    let kib = readd_copied_kib(&events, members[1]);
    assert!(
        kib > 0 && kib < MEMBER_BYTES / 1024 / 4,
        "the re-add copied {kib} KiB of a {} KiB member",
        MEMBER_BYTES / 1024
    );
    assert_same_bytes(
        &nbdcopy_out(served.uri(), d),
        &expected,
        "read back with host 1 re-added",
    );
    served.stop();
}
