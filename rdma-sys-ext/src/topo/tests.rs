use std::fs;
use std::path::Path;

use super::*;

fn path(hb: &str, chain: &[&str]) -> PciPath {
    PciPath {
        host_bridge: hb.into(),
        chain: chain.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn bus_ids() {
    assert_eq!(normalize_bus_id("0000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
    assert_eq!(normalize_bus_id("00000000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
    assert_eq!(normalize_bus_id("1b:00.1").as_deref(), Some("0000:1b:00.1"));
    assert_eq!(normalize_bus_id("0001:c1:1f.7").as_deref(), Some("0001:c1:1f.7"));
    assert_eq!(normalize_bus_id("0001C8B2:00:00.0").as_deref(), Some("1c8b2:00:00.0"));
    for bad in [
        "",
        "1b",
        "0000:1b:00",
        "0000:1b:20.0",
        "0000:1b:00.8",
        "0000:1bb:00.0",
        "0000:1b:00.0x",
        "x:1b:00.0",
        "100000000:1b:00.0",
    ] {
        assert_eq!(normalize_bus_id(bad), None, "{bad}");
    }
}

#[test]
fn gids() {
    let g = parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001").unwrap();
    assert_eq!(&g[10..], &[0xff, 0xff, 10, 0, 0, 1]);
    let e = GidEntry {
        index: 0,
        gid: g,
        gid_type: None,
    };
    assert!(e.is_ipv4_mapped() && !e.is_link_local());
    let ll = GidEntry {
        index: 0,
        gid: parse_gid("fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d").unwrap(),
        gid_type: None,
    };
    assert!(ll.is_link_local() && !ll.is_ipv4_mapped());
    assert_eq!(parse_gid("fe80::1"), None);
    assert_eq!(parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001:0000"), None);
    assert_eq!(parse_gid("0000:0000:0000:0000:0000:ffff:0a00"), None);
    assert_eq!(parse_gid("zzzz:0000:0000:0000:0000:ffff:0a00:0001"), None);
}

#[test]
fn states() {
    assert_eq!(PortState::parse("4: ACTIVE"), PortState::Active);
    assert_eq!(PortState::parse("1: DOWN"), PortState::Down);
    assert_eq!(PortState::parse("2: INIT"), PortState::Init);
    assert_eq!(PortState::parse("9: WHAT"), PortState::Unknown(Some(9)));
    assert_eq!(PortState::parse("garbage"), PortState::Unknown(None));
}

#[test]
fn distances() {
    let gpu = path("pci0000:17", &["0000:17:01.0", "0000:18:00.0", "0000:19:00.0", "0000:1b:00.0"]);
    let same_switch = path("pci0000:17", &["0000:17:01.0", "0000:18:00.0", "0000:19:01.0", "0000:1c:00.0"]);
    let same_rp = path("pci0000:17", &["0000:17:01.0", "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"]);
    let same_hb = path("pci0000:17", &["0000:17:02.0", "0000:30:00.0"]);
    let other_hb = path("pci0000:40", &["0000:40:01.0", "0000:41:00.0"]);
    assert_eq!(Distance::between(&gpu, Some(0), &same_switch, Some(0)), Distance::Pix);
    assert_eq!(Distance::between(&gpu, Some(0), &same_rp, Some(0)), Distance::Pxb);
    assert_eq!(Distance::between(&gpu, Some(0), &same_hb, Some(0)), Distance::Phb);
    assert_eq!(Distance::between(&gpu, Some(0), &other_hb, Some(0)), Distance::Node);
    assert_eq!(Distance::between(&gpu, None, &other_hb, None), Distance::Node);
    assert_eq!(Distance::between(&gpu, Some(0), &other_hb, Some(1)), Distance::Sys);
    assert_eq!(Distance::between(&gpu, Some(0), &other_hb, None), Distance::Sys);
    assert!(
        Distance::Pix < Distance::Pxb && Distance::Pxb < Distance::Phb && Distance::Phb < Distance::Node && Distance::Node < Distance::Sys
    );
}

#[test]
fn pci_paths() {
    let root = Path::new("/r");
    let p = PciPath::from_sysfs(
        root,
        Path::new("/r/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/infiniband/mlx5_0"),
    )
    .unwrap();
    assert_eq!(p, path("pci0000:17", &["0000:17:01.0", "0000:18:00.0"]));
    assert_eq!(p.bus_id(), "0000:18:00.0");
    assert_eq!(p.bridges(), &["0000:17:01.0".to_string()]);
    assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/virtual/net/eth0")), None);
    assert_eq!(
        PciPath::from_sysfs(root, Path::new("/other/sys/devices/pci0000:17/0000:17:01.0")),
        None
    );
    assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/pci0000:17")), None);
    let hv = PciPath::from_sysfs(
        root,
        Path::new("/r/sys/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01/47505500-0001-0000-3130-444531304235/pci0001:00/0001:00:00.0"),
    )
    .unwrap();
    assert_eq!(hv, path("pci0001:00", &["0001:00:00.0"]));
    assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/platform/pcie-0/x")), None);
}

#[test]
fn natural_order() {
    let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "mlx4_0", "mlx5_01"];
    v.sort_by(|a, b| natural_cmp(a, b));
    assert_eq!(v, ["mlx4_0", "mlx5_1", "mlx5_01", "mlx5_2", "mlx5_10"]);
}

#[test]
fn roce_gid_choice() {
    let g = |index, text: &str, t: Option<GidType>| GidEntry {
        index,
        gid: parse_gid(text).unwrap(),
        gid_type: t,
    };
    let mut port = Port {
        number: 1,
        state: PortState::Active,
        state_text: "4: ACTIVE".into(),
        phys_state: None,
        link_layer: LinkLayer::Ethernet,
        rate: None,
        lid: None,
        gids: vec![
            g(0, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", Some(GidType::IbRoceV1)),
            g(1, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", Some(GidType::RoceV2)),
            g(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", Some(GidType::IbRoceV1)),
            g(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", Some(GidType::RoceV2)),
        ],
    };
    assert_eq!(port.roce_v2_gid_index(), Some(3));
    port.gids.truncate(2);
    assert_eq!(port.roce_v2_gid_index(), Some(1));
    port.gids
        .push(g(5, "2001:0db8:0000:0000:0000:0000:0000:0001", Some(GidType::RoceV2)));
    assert_eq!(port.roce_v2_gid_index(), Some(5));
    port.gids.retain(|e| e.gid_type != Some(GidType::RoceV2));
    assert_eq!(port.roce_v2_gid_index(), None);
}

#[test]
fn kernel_release_parse() {
    let dir = std::env::temp_dir().join(format!("doorbell-topo-unit-{}", std::process::id()));
    let proc_dir = dir.join("proc/sys/kernel");
    fs::create_dir_all(&proc_dir).unwrap();
    let write = |s: &str| fs::write(proc_dir.join("osrelease"), s).unwrap();
    write("5.15.0-91-generic\n");
    assert_eq!(kernel_version(&dir).unwrap(), (5, 15));
    assert!(dmabuf_supported_by_kernel(&dir).unwrap());
    write("5.11.22\n");
    assert!(!dmabuf_supported_by_kernel(&dir).unwrap());
    write("6.8.0\n");
    assert!(dmabuf_supported_by_kernel(&dir).unwrap());
    write("4.18.0-513.el8.x86_64");
    assert!(!dmabuf_supported_by_kernel(&dir).unwrap());
    write("5-12");
    assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
    write("6");
    assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
    write("6.x");
    assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
    write("6.10-rc1");
    assert_eq!(kernel_version(&dir).unwrap(), (6, 10));
    write("linux");
    assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
    fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(kernel_version(&dir), Err(TopoError::Io { .. })));
}
