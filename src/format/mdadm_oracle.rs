//! Cross-checks against the real mdadm: superblocks produced by this module
//! are written into sparse image files and `mdadm --examine` must accept
//! them, report a correct checksum and print the values we encoded.
//!
//! `mdadm --examine` reads plain files, so no block device or root access is
//! needed. The tests pass silently when mdadm is not installed, because the
//! oracle is a bonus on top of the unit tests, not a build requirement.

use super::create::{plan_create, CreateDevice, CreateMember, CreateSpec};
use super::{sb090, sb1, ConsistencyPolicy, MemberSuper, Metadata};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;

/// Finds mdadm in the usual places (it lives in sbin, often outside PATH).
fn mdadm() -> Option<PathBuf> {
    ["/usr/sbin/mdadm", "/sbin/mdadm", "/usr/local/sbin/mdadm"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Writes `bytes` at `super_offset_sectors` of a sparse image of
/// `device_sectors` sectors and returns mdadm's --examine output, or `None`
/// when mdadm is absent.
fn examine(device_sectors: u64, super_offset_sectors: u64, bytes: &[u8]) -> Option<String> {
    let mdadm = mdadm()?;
    let file = tempfile::NamedTempFile::new().expect("temporary image");
    file.as_file()
        .set_len(device_sectors * 512)
        .expect("size the image");
    file.as_file()
        .write_all_at(bytes, super_offset_sectors * 512)
        .expect("write the superblock");
    let out = Command::new(mdadm)
        .arg("--examine")
        .arg(file.path())
        .env("MDADM_NO_UDEV", "1")
        .output()
        .expect("run mdadm");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdadm --examine failed:\n{text}");
    Some(text)
}

/// The value printed after "label :" on one line of --examine output.
fn field<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(" : ")?;
            (name.trim() == label).then(|| value.trim())
        })
        .unwrap_or_else(|| panic!("no '{label}' line in:\n{text}"))
}

const DEV: u64 = 131_072;

#[test]
fn mdadm_accepts_v1_superblocks() {
    for metadata in [Metadata::V1_0, Metadata::V1_1, Metadata::V1_2] {
        let sb = sb1::tests::sample(metadata);
        let bytes = sb1::encode(&sb).unwrap();
        let csum = u32::from_le_bytes([bytes[216], bytes[217], bytes[218], bytes[219]]);
        let Some(text) = examine(DEV, sb.super_offset_sectors, &bytes) else {
            return;
        };
        println!("{text}");
        assert_eq!(field(&text, "Magic"), "a92b4efc");
        assert_eq!(field(&text, "Version"), metadata.as_str());
        assert_eq!(field(&text, "Feature Map"), "0x0");
        assert_eq!(field(&text, "Array UUID"), sb.uuid_string());
        assert!(field(&text, "Name").starts_with("uraidhost:test"));
        assert_eq!(field(&text, "Raid Level"), "raid5");
        assert_eq!(field(&text, "Raid Devices"), "3");
        assert!(field(&text, "Avail Dev Size")
            .starts_with(&format!("{} sectors", sb.data_size_sectors)));
        assert_eq!(
            field(&text, "Super Offset"),
            format!("{} sectors", sb.super_offset_sectors)
        );
        assert_eq!(field(&text, "State"), "clean");
        assert_eq!(field(&text, "Device UUID"), sb.device_uuid_string());
        assert_eq!(field(&text, "Checksum"), format!("{csum:x} - correct"));
        assert_eq!(field(&text, "Events"), "18");
        assert_eq!(field(&text, "Layout"), "left-symmetric");
        assert_eq!(field(&text, "Chunk Size"), "512K");
        assert_eq!(field(&text, "Device Role"), "Active device 1");
        assert!(field(&text, "Array State").starts_with("AAA "));
        assert!(field(&text, "Bad Block Log").starts_with(&format!(
            "512 entries available at offset {} sectors",
            sb.bblog_offset_sectors
        )));
    }
}

#[test]
fn mdadm_agrees_with_a_created_raid5() {
    let devices = [CreateDevice::Disk; 3];
    let plan = plan_create(5, 3, &devices, false, false).unwrap();
    let spec = CreateSpec {
        metadata: Metadata::V1_2,
        level: 5,
        layout: 2,
        chunk_sectors: 1024,
        raid_disks: 3,
        size_sectors: 126_976,
        name: "r5".into(),
        homehost: Some("uraidhost".into()),
        set_uuid: *b"0123456789abcdef",
        ctime_secs: 1_700_000_000,
        clean: plan.clean,
        policy: ConsistencyPolicy::Resync,
        bad_block_log: true,
        roles: plan.roles.clone(),
        spare_disks: plan.spare_disks,
        raid0_layout_feature: false,
    };
    for (index, dev_number) in plan.dev_numbers.iter().enumerate() {
        let member = CreateMember {
            dev_number: dev_number.unwrap(),
            device_sectors: DEV,
            data_offset_sectors: None,
            device_uuid: [index as u8 + 1; 16],
            write_mostly: false,
            failfast: false,
        };
        let sb = MemberSuper::new_for_create(&spec, &member).unwrap();
        let bytes = sb1::encode(&sb).unwrap();
        let Some(text) = examine(DEV, 8, &bytes) else {
            return;
        };
        println!("{text}");
        assert!(field(&text, "Checksum").ends_with(" - correct"));
        assert_eq!(field(&text, "Data Offset"), "4096 sectors");
        assert_eq!(
            field(&text, "Bad Block Log"),
            "512 entries available at offset 16 sectors"
        );
        assert_eq!(field(&text, "Events"), "0");
        assert!(field(&text, "Array Size").starts_with("126976 KiB"));
        assert!(field(&text, "Array State").starts_with("AA. "));
        let role = if index == 2 {
            "spare".to_string()
        } else {
            format!("Active device {index}")
        };
        assert_eq!(field(&text, "Device Role"), role);
    }
}

#[test]
fn mdadm_accepts_a_0_90_superblock() {
    let sb = sb090::tests::sample();
    let bytes = sb090::encode(&sb).unwrap();
    let csum = u32::from_le_bytes([bytes[152], bytes[153], bytes[154], bytes[155]]);
    let Some(text) = examine(DEV, sb.super_offset_sectors, &bytes) else {
        return;
    };
    println!("{text}");
    assert_eq!(field(&text, "Magic"), "a92b4efc");
    assert_eq!(field(&text, "Version"), "0.90.00");
    assert!(field(&text, "UUID").starts_with(&sb.uuid_string()));
    assert_eq!(field(&text, "Raid Level"), "raid1");
    assert!(field(&text, "Used Dev Size").starts_with("65472 "));
    assert_eq!(field(&text, "Raid Devices"), "2");
    assert_eq!(field(&text, "Preferred Minor"), "3");
    assert_eq!(field(&text, "State"), "clean");
    assert_eq!(field(&text, "Checksum"), format!("{csum:x} - correct"));
    assert_eq!(field(&text, "Events"), "4294967301");
}
