//! uraid.conf and assembly by UUID: `examine --scan` against real mdadm's
//! ARRAY lines, and `serve --scan` finding members by UUID or name among a
//! DEVICE glob, with mdadm's rules and the SYSFS knobs in force.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Creates an array on new files DIR/<name> (in role order) with the
/// settings folder of the test.
fn create(dir: &Path, names: &[&str], options: &[&str]) -> Vec<PathBuf> {
    let files: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    for f in &files {
        std::fs::File::create(f).unwrap().set_len(64 * MIB).unwrap();
    }
    let mut cmd = uraid();
    cmd.arg("create").args(options).args(&files);
    sh_ok(cmd.env("URAID_CONFIG_DIR", dir.join("settings")));
    files
}

fn uuid_of(member: &Path) -> String {
    let v = detail_offline(&[member.to_str().unwrap()]);
    v["uuid"].as_str().unwrap().to_string()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("uraid.conf");
    std::fs::write(&path, text).unwrap();
    path
}

/// The member paths `detail` lists with a raid role, sorted.
fn active_paths(detail: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = detail["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["raid_device"].is_null())
        .filter_map(|r| r["path"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

fn names(files: &[&PathBuf]) -> Vec<String> {
    let mut out: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    out.sort();
    out
}

fn refused_with(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run uraid");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{cmd:?} should have failed");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{cmd:?}: one line of error: {stderr:?}");
    stderr
}

#[test]
fn serve_scan_finds_members_by_uuid_and_name() {
    let dir = scratch("config-scan");
    let d = dir.path();
    // Role order differs from the glob's (alphabetical) order.
    let data = create(
        d,
        &["q.img", "c.img", "x.img", "a.img"],
        &["-l", "5", "-n", "4", "--assume-clean", "-N", "data"],
    );
    let logs = create(
        d,
        &["m.img", "b.img"],
        &["-l", "1", "-n", "2", "--assume-clean", "-N", "logs"],
    );
    let data_uuid = uuid_of(&data[0]);
    let logs_uuid = uuid_of(&logs[0]);

    // a.img misses a run of the array: it falls two events behind.
    let degraded: Vec<&str> = data[..3].iter().map(|p| p.to_str().unwrap()).collect();
    serve(d, &[], &degraded).stop();

    let conf = write_config(
        d,
        &format!(
            "# members of two arrays under one glob\n\
             DEVICE {0}/*.img\n\
             \x20      {0}/absent/*\n\
             ARRAY /dev/md/data metadata=1.2 UUID={data_uuid}\n\
             sysfs name=/dev/md/logs stripe_cache_size=8192\n\
             \tsync_speed_max=12345\n\
             SYSFS uuid={logs_uuid} stripe_cache_size=1024 group_thread_cnt=2\n",
            d.display()
        ),
    );
    let conf = conf.to_str().unwrap();

    // By UUID, in mdadm's form or another punctuation: the stale member is
    // left out with the kernel's words, the other array's are not touched.
    let dashed = data_uuid.replace(':', "-");
    let served = serve(d, &["--scan", "--config", conf, "--uuid", &dashed], &[]);
    let detail = served.detail_json();
    assert_eq!(detail["uuid"].as_str(), Some(data_uuid.as_str()));
    assert_eq!(
        active_paths(&detail),
        names(&[&data[0], &data[1], &data[2]])
    );
    assert_eq!(detail["active_devices"], 3, "{detail}");
    assert_eq!(detail["total_devices"], 3, "{detail}");
    let stderr = served.stop();
    assert!(
        stderr.contains(&format!(
            "uraid: kicking non-fresh {} from array",
            data[3].display()
        )),
        "{stderr}"
    );

    // By name, with the SYSFS knobs: the first line that names the array
    // wins where two set one knob (mdadm applies them last to first).
    let served = serve(d, &["--scan", "--config", conf, "--name", "logs"], &[]);
    let detail = served.detail_json();
    assert_eq!(detail["uuid"].as_str(), Some(logs_uuid.as_str()));
    assert_eq!(active_paths(&detail), names(&[&logs[0], &logs[1]]));
    assert_eq!(detail["tuning"]["stripe_cache_size"], "8192", "{detail}");
    assert_eq!(detail["tuning"]["group_thread_cnt"], "2", "{detail}");
    let status = array_status(&served.control);
    assert_eq!(status["speed_limit_max_kib_per_s"], 12345, "{status}");
    served.stop();

    // The command line is the latest word over the config.
    let served = serve(
        d,
        &[
            "--scan",
            "--config",
            conf,
            "--name",
            "/dev/md/logs",
            "--stripe-cache-size",
            "512",
        ],
        &[],
    );
    assert_eq!(served.detail_json()["tuning"]["stripe_cache_size"], "512");
    served.stop();

    // Two arrays of one name: refused, naming both.
    let twins = d.join("twins");
    std::fs::create_dir(&twins).unwrap();
    let t1 = create(
        &twins,
        &["t0", "t1"],
        &["-l", "1", "-n", "2", "--assume-clean", "-N", "twin"],
    );
    let t2 = create(
        &twins,
        &["u0", "u1"],
        &["-l", "1", "-n", "2", "--assume-clean", "-N", "twin"],
    );
    let twin_conf = twins.join("twins.conf");
    std::fs::write(&twin_conf, format!("DEV {}/*\n", twins.display())).unwrap();
    let err = refused_with(
        uraid()
            .args(["serve", "--scan", "--name", "twin", "--config"])
            .arg(&twin_conf),
    );
    assert!(err.contains("matches 2 arrays"), "{err}");
    for member in [&t1[0], &t2[0]] {
        assert!(err.contains(&uuid_of(member)), "{err}");
    }

    // Nothing matching, a bad config line, --all: one line each, nothing served.
    let err = refused_with(uraid().args([
        "serve",
        "--scan",
        "--config",
        conf,
        "--uuid",
        "00000000:00000000:00000000:00000001",
    ]));
    assert!(
        err.contains("no array with UUID 00000000:00000000:00000000:00000001"),
        "{err}"
    );
    let bad = d.join("bad.conf");
    std::fs::write(&bad, "DEVICE /tmp/*\n\nARAY uuid=1\n").unwrap();
    let err = refused_with(
        uraid()
            .args(["serve", "--scan", "--name", "data", "--config"])
            .arg(&bad),
    );
    assert_eq!(
        err.trim(),
        format!("uraid: {}:3: unknown keyword 'ARAY'", bad.display())
    );
    std::fs::write(
        &bad,
        format!(
            "DEVICE {}/*.img\nSYSFS name=data stripe_cache=1\n",
            d.display()
        ),
    )
    .unwrap();
    let err = refused_with(
        uraid()
            .args(["serve", "--scan", "--name", "data", "--config"])
            .arg(&bad),
    );
    assert!(err.contains(":2: unknown knob 'stripe_cache'"), "{err}");
    let err = refused_with(uraid().args(["serve", "--scan", "--all", "--config", conf]));
    assert!(err.contains("one array per process"), "{err}");
    // With ARRAY lines, only the arrays they identify (as mdadm --assemble --scan).
    assert!(
        err.contains(&data_uuid) && !err.contains(&logs_uuid),
        "{err}"
    );
    let err = refused_with(uraid().args([
        "serve",
        "--scan",
        "--config",
        "/nonexistent.conf",
        "--name",
        "x",
    ]));
    assert!(err.contains("/nonexistent.conf"), "{err}");
}

/// `losetup --find --show -r FILE`, or None where loop devices cannot be made.
fn attach_loop(file: &Path) -> Option<String> {
    let out = Command::new("losetup")
        .args(["--find", "--show", "-r"])
        .arg(file)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

struct Loops(Vec<String>);

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in &self.0 {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

/// mdadm before 4.3 ends a version-1 line with ` name=<set name>`; later
/// ones print none, as uraid does.
fn without_old_name_tag(mdadm_text: &str) -> String {
    mdadm_text
        .lines()
        .map(|l| match l.find(" name=") {
            Some(i) if l.starts_with("ARRAY") => &l[..i],
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn examine_scan_prints_what_mdadm_prints() {
    let dir = scratch("examine-scan");
    let d = dir.path();
    create(
        d,
        &["d0", "d1", "d2", "d3"],
        &[
            "-l",
            "5",
            "-n",
            "3",
            "-x",
            "1",
            "--assume-clean",
            "-N",
            "data",
        ],
    );
    let logs = create(
        d,
        &["l0", "l1"],
        &[
            "-l",
            "1",
            "-n",
            "2",
            "-e",
            "1.0",
            "--assume-clean",
            "-N",
            "logs",
        ],
    );
    let bare = create(
        d,
        &["n0", "n1"],
        &[
            "-l",
            "1",
            "-n",
            "2",
            "-e",
            "1.1",
            "-N",
            "",
            "--homehost",
            "<none>",
        ],
    );
    let files: Vec<PathBuf> = ["d0", "l0", "d1", "n0", "d2", "d3", "l1", "n1"]
        .iter()
        .map(|n| d.join(n))
        .collect();
    let paths: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let ours =
        String::from_utf8(uraid_ok(&[&["examine", "--scan"][..], &paths].concat()).stdout).unwrap();
    // Arrays in the reverse order of their first device, as mdadm lists them.
    let lines: Vec<&str> = ours.lines().collect();
    assert_eq!(lines.len(), 4, "{ours}");
    assert!(lines[0].starts_with("ARRAY  metadata=1.1 UUID="), "{ours}");
    assert!(
        lines[1].starts_with("ARRAY /dev/md/logs  metadata=1.0 UUID="),
        "{ours}"
    );
    assert!(
        lines[2].starts_with("ARRAY /dev/md/data  metadata=1.2 UUID="),
        "{ours}"
    );
    assert_eq!(lines[3], "   spares=1");
    assert!(lines[1].ends_with(&uuid_of(&logs[0])));
    assert!(lines[0].ends_with(&uuid_of(&bare[0])));

    let have_mdadm = Command::new("mdadm").arg("--version").output().is_ok();
    if !have_mdadm {
        eprintln!("mdadm not installed: the comparison with mdadm is skipped");
        return;
    }
    let mut loops = Loops(Vec::new());
    for f in &files {
        match attach_loop(f) {
            Some(dev) => loops.0.push(dev),
            None => {
                eprintln!("no loop devices here: the comparison with mdadm is skipped");
                return;
            }
        }
    }
    let devs: Vec<&str> = loops.0.iter().map(String::as_str).collect();
    for verbose in [false, true] {
        let flags: &[&str] = if verbose {
            &["--scan", "-v"]
        } else {
            &["--scan"]
        };
        let mdadm = Command::new("mdadm")
            .arg("--examine")
            .args(flags)
            .args(&devs)
            .output()
            .unwrap();
        assert!(
            mdadm.status.success(),
            "{}",
            String::from_utf8_lossy(&mdadm.stderr)
        );
        let theirs = without_old_name_tag(&String::from_utf8_lossy(&mdadm.stdout));
        let ours = uraid_ok(&[&["examine"][..], flags, &devs].concat()).stdout;
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            theirs,
            "verbose {verbose}"
        );
    }
}
