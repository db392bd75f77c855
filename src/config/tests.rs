use super::*;

const U: &str = "bead5eb6:31c17a27:da120ba2:7dfda40d";

fn parse(text: &str) -> Config {
    Config::parse(text, "uraid.conf").unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    Config::parse(text, "uraid.conf")
        .expect_err("should be refused")
        .to_string()
}

#[test]
fn a_full_config_reads_into_typed_fields() {
    let c = parse(
        "# uraid.conf\n\
         DEVICE /srv/raid/*.img partitions\n\
         DEVICE containers\n\
         ARRAY /dev/md/data metadata=1.2 UUID=bead5eb6:31c17a27:da120ba2:7dfda40d\n\
         ARRAY <ignore> uuid=00000000-0000-0000-0000-000000000001\n\
         MAILADDR root@example.org\n\
         MAILFROM Storage <raid@example.org>\n\
         PROGRAM /usr/local/bin/raid-event\n\
         MONITORDELAY 30\n\
         SYSFS uuid=bead5eb6:31c17a27:da120ba2:7dfda40d stripe_cache_size=8192 sync_speed_max=50000\n\
         HOMEHOST <system>\n",
    );
    assert_eq!(
        c.devices,
        vec![
            DevicePattern::Glob("/srv/raid/*.img".into()),
            DevicePattern::Partitions,
            DevicePattern::Containers
        ]
    );
    assert_eq!(c.arrays.len(), 2);
    assert_eq!(c.arrays[0].devname.as_deref(), Some("/dev/md/data"));
    assert_eq!(c.arrays[0].uuid.as_deref(), Some(U));
    assert_eq!(c.arrays[0].metadata, Some(MetadataTag::V1(Metadata::V1_2)));
    assert_eq!(c.arrays[0].line, 4);
    assert!(c.arrays[1].ignore);
    assert_eq!(
        c.arrays[1].uuid.as_deref(),
        Some("00000000:00000000:00000000:00000001")
    );
    assert_eq!(c.mail_addr.as_deref(), Some("root@example.org"));
    assert_eq!(c.mail_from.as_deref(), Some("Storage <raid@example.org>"));
    assert_eq!(c.program.as_deref(), Some("/usr/local/bin/raid-event"));
    assert_eq!(c.monitor_delay, Some(30));
    assert_eq!(c.sysfs.len(), 1);
    assert_eq!(
        c.sysfs[0].knobs,
        vec![
            Knob::Tuning {
                key: "stripe_cache_size".into(),
                value: "8192".into()
            },
            Knob::SyncSpeedMax(Some(50000))
        ]
    );
    assert_eq!(c.unused, vec![(11, "homehost".to_string())]);
}

#[test]
fn continuations_comments_and_quotes_follow_mdadm() {
    let c = parse(
        "ARRAY /dev/md/data\n\
         \x20  uuid=bead5eb6:31c17a27:da120ba2:7dfda40d # the data array\n\
         \n\
         \tlevel=raid5 num-devices=4\n\
         # a comment ends the line above\n\
         \x20 DEVICE '/srv/my disks/*'\n",
    );
    let a = &c.arrays[0];
    assert_eq!(a.uuid.as_deref(), Some(U));
    assert_eq!(a.level, Some(Level::Raid5));
    assert_eq!(a.num_devices, Some(4));
    // After a comment at the start of a line, an indented line starts a
    // new one (mdadm reads its first word as the keyword).
    assert_eq!(c.devices[0], DevicePattern::Glob("/srv/my disks/*".into()));
    // '#' inside a word is part of it.
    assert_eq!(
        error("dev#ice /a\n"),
        "uraid.conf:1: unknown keyword 'dev#ice'"
    );
}

#[test]
fn keywords_are_case_insensitive_and_cut_to_three_letters() {
    let c = parse(&format!(
        "dev /a\nDEVI /b\narr uuid={U}\nMAI a@b\nmailf x\npro /bin/true\nMon 5\nsys uuid={U} rmw_level=2\n"
    ));
    assert_eq!(c.devices.len(), 2);
    assert_eq!(c.arrays.len(), 1);
    assert_eq!(c.mail_addr.as_deref(), Some("a@b"));
    assert_eq!(c.mail_from.as_deref(), Some("x"));
    assert_eq!(c.program.as_deref(), Some("/bin/true"));
    assert_eq!(c.monitor_delay, Some(5));
    assert_eq!(c.sysfs.len(), 1);
    assert!(error("de /a\n").contains("unknown keyword 'de'"));
    assert!(error("devicesx /a\n").contains("unknown keyword 'devicesx'"));
}

#[test]
fn bad_lines_name_file_and_line() {
    let cases: &[(&str, &str)] = &[
        (
            "DEVICE /a\n\nARAY uuid=1\n",
            "uraid.conf:3: unknown keyword 'ARAY'",
        ),
        (
            "DEVICE disks/*\n",
            "uraid.conf:1: DEVICE takes absolute paths",
        ),
        (
            "ARRAY /dev/md/x uuid=1234\n",
            "uraid.conf:1: bad uuid: 1234",
        ),
        (
            "ARRAY /dev/md/x\n",
            "uraid.conf:1: ARRAY line /dev/md/x has no identity",
        ),
        (
            "ARRAY /dev/md/x\n  uuid=bead5eb6:31c17a27:da120ba2:7dfda40d\n  colour=red\n",
            "uraid.conf:3: unrecognised word on ARRAY line: colour=red",
        ),
        (
            "ARRAY name=a level=raid7\n",
            "uraid.conf:1: unknown raid level: raid7",
        ),
        (
            "ARRAY name=a metadata=ddf\n",
            "uraid.conf:1: metadata format ddf unknown",
        ),
        ("ARRAY name=a name=b\n", "uraid.conf:1: name= given twice"),
        (
            "ARRAY /dev/sda name=a\n",
            "uraid.conf:1: /dev/sda is an invalid name",
        ),
        (
            "MONITORDELAY soon\n",
            "uraid.conf:1: MONITORDELAY takes seconds",
        ),
        (
            "MAILADDR a@b\nMAILADDR c@d\n",
            "uraid.conf:2: MAILADDR given twice",
        ),
        (
            "PROGRAM /bin/a -x\n",
            "uraid.conf:1: PROGRAM takes one word",
        ),
        (
            "SYSFS uuid=bead5eb6:31c17a27:da120ba2:7dfda40d\n  stripe_cahce_size=8192\n",
            "uraid.conf:2: unknown knob 'stripe_cahce_size'",
        ),
        (
            "SYSFS name=/dev/md/x stripe_cache_size=5\n",
            "uraid.conf:1: stripe_cache_size 5 is outside 17..32768",
        ),
        (
            "SYSFS stripe_cache_size=512\n",
            "uraid.conf:1: SYSFS line names no array",
        ),
        (
            "SYSFS name=x sync_speed_max=fast\n",
            "uraid.conf:1: sync_speed_max=fast",
        ),
        (
            "SYSFS name=x rmw_level=1 rmw_level=2\n",
            "uraid.conf:1: rmw_level given twice",
        ),
    ];
    for (text, want) in cases {
        let got = error(text);
        assert!(
            got.starts_with(want),
            "{text:?}: got {got:?}, want {want:?}"
        );
        assert!(!got.contains('\n'), "{got}");
    }
}

#[test]
fn uuids_take_any_punctuation() {
    for text in [
        "bead5eb6:31c17a27:da120ba2:7dfda40d",
        "BEAD5EB6-31C1-7A27-DA12-0BA27DFDA40D",
        "bead5eb631c17a27da120ba27dfda40d",
    ] {
        assert_eq!(normalize_uuid(text).as_deref(), Some(U), "{text}");
    }
    assert_eq!(normalize_uuid("bead5eb6"), None);
}

#[test]
fn names_match_whole_short_or_as_md_device() {
    assert!(name_matches("host:data", "data"));
    assert!(name_matches("host:data", "host:data"));
    assert!(name_matches("host:data", "/dev/md/data"));
    assert!(name_matches("data", "data"));
    assert!(!name_matches("host:data", "host"));
    assert!(!name_matches("", ""));
}

#[test]
fn sysfs_lines_apply_last_to_first_so_the_first_wins() {
    let c = parse(&format!(
        "SYSFS uuid={U} stripe_cache_size=1024\n\
         SYSFS name=/dev/md/data stripe_cache_size=2048 group_thread_cnt=2\n\
         SYSFS name=other stripe_cache_size=4096\n"
    ));
    let knobs = c.sysfs_for(U, "host:data");
    let scs: Vec<&Knob> = knobs
        .iter()
        .filter(|k| matches!(k, Knob::Tuning { key, .. } if key == "stripe_cache_size"))
        .collect();
    assert_eq!(scs.len(), 2);
    assert_eq!(
        scs.last().unwrap(),
        &&Knob::Tuning {
            key: "stripe_cache_size".into(),
            value: "1024".into()
        }
    );
    assert!(c
        .sysfs_for("00000000:00000000:00000000:00000000", "x")
        .is_empty());
}

#[test]
fn array_tags_must_all_match() {
    let mut sb = crate::format::sb1::tests::sample(Metadata::V1_2);
    sb.set_name = "host:data".into();
    let uuid = sb.uuid_string();
    let c = parse(&format!(
        "ARRAY /dev/md/data uuid={uuid} name=data level={} num-devices={} metadata=1.2 devices=/srv/*.img\n",
        level_text(sb.level).unwrap(),
        sb.raid_disks
    ));
    let a = &c.arrays[0];
    assert_eq!(a.mismatch("/srv/a.img", &sb), None);
    assert!(a.names("data") && a.names("/dev/md/data"));
    assert_eq!(
        a.mismatch("/srv/sub/a.img", &sb).as_deref(),
        Some("/srv/sub/a.img is not one of /srv/*.img")
    );
    let mut other = sb.clone();
    other.set_name = "host:logs".into();
    assert_eq!(
        a.mismatch("/srv/a.img", &other).as_deref(),
        Some("/srv/a.img has wrong name.")
    );
    other = sb.clone();
    other.raid_disks += 1;
    assert_eq!(
        a.mismatch("/srv/a.img", &other).as_deref(),
        Some("/srv/a.img requires wrong number of drives.")
    );
    other = sb.clone();
    other.set_uuid[0] ^= 1;
    assert_eq!(
        a.mismatch("/srv/a.img", &other).as_deref(),
        Some("/srv/a.img has wrong uuid.")
    );
}
