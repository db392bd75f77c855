//! Helpers shared by the integration tests: the uraid binary, scratch
//! folders, deterministic data, and the user-mode Linux kernel.
#![allow(dead_code)]

use rand::{RngCore, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn uraid() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uraid"))
}

/// Runs uraid and returns its output, panicking with stderr if it failed.
pub fn uraid_ok(args: &[&str]) -> Output {
    let out = uraid().args(args).output().expect("run uraid");
    assert!(out.status.success(), "uraid {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Runs uraid expecting a refusal: non-zero exit and a one-line reason.
pub fn uraid_refused(args: &[&str]) -> String {
    let out = uraid().args(args).output().expect("run uraid");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "uraid {args:?} should have failed");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "uraid {args:?}: expected one line of error, got {stderr:?}");
    assert!(lines[0].starts_with("uraid: "), "{stderr}");
    stderr
}

/// A scratch folder under /tmp (which user-mode Linux sees too, through hostfs).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("uraid-{name}-")).tempdir_in("/tmp").expect("tempdir")
}

/// Sparse, zero-filled files of the given sizes.
pub fn sparse_files(dir: &Path, prefix: &str, sizes: &[u64]) -> Vec<PathBuf> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, size)| {
            let path = dir.join(format!("{prefix}{i}"));
            let file = std::fs::File::create(&path).expect("create member");
            file.set_len(*size).expect("size member");
            path
        })
        .collect()
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    data
}

pub fn paths(files: &[PathBuf]) -> Vec<&str> {
    files.iter().map(|p| p.to_str().unwrap()).collect()
}

/// The array size in bytes, from `uraid detail --json`.
pub fn array_bytes(members: &[&str]) -> u64 {
    let mut args = vec!["detail", "--json"];
    args.extend_from_slice(members);
    let out = uraid_ok(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("detail json");
    v["array_size_kib"].as_u64().expect("array_size_kib") * 1024
}

/// Runs a shell script as root inside user-mode Linux (tests/kernel/uml-run),
/// with md and loop loaded. Returns stdout; panics with the output on failure.
pub fn in_kernel(script: &str, timeout_s: u32) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = scratch("uml-script");
    let script_path = dir.path().join("script.sh");
    std::fs::write(&script_path, format!("#!/bin/bash\nset -eu\n{script}")).unwrap();
    let out = Command::new(root.join("tests/kernel/uml-run"))
        .args(["--mem", "768M", "--timeout", &timeout_s.to_string(), "--", "bash"])
        .arg(&script_path)
        .output()
        .expect("run tests/kernel/uml-run (install user-mode-linux: tests/kernel/install-deps)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "kernel script failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    stdout
}
