//! NIC selection on fixture sysfs trees: PCIe distance classes, the nearest
//! ACTIVE port per GPU, spreading GPUs over NICs, RoCE v2 GID choice, the
//! device filter, the errors, and the start-up detection helpers.

mod fixtures;

use fixtures::{Gid, PortSpec, Tree, ZERO_GID};
use rdma_sys_ext::hca::HcaFilter;
use rdma_sys_ext::topo::{
    devx_privilege_hint, dmabuf_supported_by_kernel, nvidia_peermem_loaded, Distance, LinkLayer, PortState, TopoError, Topology,
};

/// A DGX-like node: 4 host bridges (2 per NUMA node), each with one root
/// port and two PCIe switches under it; each switch holds one GPU and one
/// NIC. GPU `i` is paired with NIC `mlx5_{7-i}`, so name order and bus
/// order disagree. Returns the tree and the GPU bus ids (upper case, as
/// CUDA prints them).
fn dgx() -> (Tree, Vec<String>) {
    let t = Tree::new("dgx");
    let mut gpus = Vec::new();
    for h in 0..4u32 {
        let b = 0x10 + 0x20 * h;
        let hb = format!("pci0000:{b:02x}");
        let rp = format!("0000:{b:02x}:01.0");
        let numa = (h / 2) as i32;
        for s in 0..2u32 {
            let i = h * 2 + s;
            let up = format!("0000:{:02x}:00.0", b + 1 + s * 4);
            let down0 = format!("0000:{:02x}:00.0", b + 2 + s * 4);
            let down1 = format!("0000:{:02x}:01.0", b + 2 + s * 4);
            let gpu = format!("0000:{:02x}:00.0", b + 3 + s * 4);
            let nic = format!("0000:{:02x}:00.0", b + 4 + s * 4);
            t.pci(&hb, &[&rp, &up, &down0, &gpu], numa, Some("nvidia"));
            let nic_dir = t.pci(&hb, &[&rp, &up, &down1, &nic], numa, Some("mlx5_core"));
            t.rdma(&format!("mlx5_{}", 7 - i), &nic_dir, &[PortSpec::ib_active(1)]);
            gpus.push(gpu.to_uppercase());
        }
    }
    (t, gpus)
}

fn ids(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn reads_devices_and_ports() {
    let (t, _) = dgx();
    let topo = Topology::read(t.root()).unwrap();
    let names: Vec<&str> = topo.devices().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
    );
    let d = &topo.devices()[7]; // paired with GPU 0 under host bridge 0x10
    assert_eq!(d.driver.as_deref(), Some("mlx5_core"));
    assert_eq!(d.numa_node, Some(0));
    let pci = d.pci.as_ref().unwrap();
    assert_eq!(pci.host_bridge, "pci0000:10");
    assert_eq!(pci.chain, ["0000:10:01.0", "0000:11:00.0", "0000:12:01.0", "0000:14:00.0"]);
    assert_eq!(topo.devices()[0].numa_node, Some(1));
    let p = &d.ports[0];
    assert_eq!(p.number, 1);
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.state_text, "4: ACTIVE");
    assert_eq!(p.phys_state.as_deref(), Some("5: LinkUp"));
    assert_eq!(p.link_layer, LinkLayer::InfiniBand);
    assert_eq!(p.rate.as_deref(), Some("400 Gb/sec (4X NDR)"));
    assert_eq!(p.lid, Some(0x11));
    assert!(p.gids.is_empty());

    let g = topo.gpu("0000:13:00.0").unwrap();
    assert_eq!(g.bus_id, "0000:13:00.0");
    assert_eq!(g.numa_node, Some(0));
    assert_eq!(
        g.pci.unwrap().chain,
        ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"]
    );
}

#[test]
fn dgx_distances_each_class() {
    let (t, gpus) = dgx();
    let topo = Topology::read(t.root()).unwrap();
    let g0 = topo.gpu(&gpus[0]).unwrap();
    let by_name = |n: &str| topo.devices().iter().find(|d| d.name == n).unwrap();
    // GPU 0: own NIC mlx5_7, sibling switch mlx5_6, other host bridge on
    // NUMA 0 mlx5_5/4, NUMA 1 mlx5_3..0.
    let want = [
        ("mlx5_7", Distance::Pix),
        ("mlx5_6", Distance::Pxb),
        ("mlx5_5", Distance::Node),
        ("mlx5_4", Distance::Node),
        ("mlx5_3", Distance::Sys),
        ("mlx5_0", Distance::Sys),
    ];
    for (n, d) in want {
        assert_eq!(Topology::distance(&g0, by_name(n)), d, "{n}");
    }
}

#[test]
fn dgx_each_gpu_gets_its_own_nic_at_pix() {
    let (t, gpus) = dgx();
    let topo = Topology::read(t.root()).unwrap();
    for (i, g) in gpus.iter().enumerate() {
        let c = topo.nearest(g, None).unwrap();
        assert_eq!(c.device, format!("mlx5_{}", 7 - i), "GPU {g}");
        assert_eq!(c.port, 1);
        assert_eq!(c.distance, Distance::Pix);
        assert_eq!(c.link_layer, LinkLayer::InfiniBand);
        assert_eq!(c.gid_index, None);
        assert_eq!(c.gpu, g.to_lowercase());
        assert_eq!(c.driver.as_deref(), Some("mlx5_core"));
        assert!(c.reason.contains("PIX") && c.reason.contains(&c.device), "{}", c.reason);
    }
    let all = topo.assign(&ids(&gpus), None).unwrap();
    assert_eq!(all.len(), 8);
    for (i, c) in all.iter().enumerate() {
        assert_eq!(c.device, format!("mlx5_{}", 7 - i));
        assert_eq!(c.distance, Distance::Pix);
        assert!(c.shared_with.is_empty());
    }
    // The 8-digit domain nvidia-smi prints works too.
    let c = topo.nearest("00000000:13:00.0", None).unwrap();
    assert_eq!(c.device, "mlx5_7");
}

#[test]
fn filters_applied() {
    let (t, gpus) = dgx();
    let topo = Topology::read(t.root()).unwrap();
    // GPU 7 is paired with mlx5_0; excluding it sends GPU 7 to its sibling
    // switch's NIC (mlx5_1, PXB) and leaves the others alone.
    let f: HcaFilter = "^mlx5_0".parse().unwrap();
    let c = topo.nearest(&gpus[7], Some(&f)).unwrap();
    assert_eq!((c.device.as_str(), c.distance), ("mlx5_1", Distance::Pxb));
    assert_eq!(topo.nearest(&gpus[0], Some(&f)).unwrap().device, "mlx5_7");
    let all = topo.assign(&ids(&gpus), Some(&f)).unwrap();
    assert_eq!(all[7].device, "mlx5_1");
    assert_eq!(all[6].device, "mlx5_1");
    assert_eq!(all[7].shared_with, [gpus[6].to_lowercase()]);
    assert_eq!(all[6].shared_with, [gpus[7].to_lowercase()]);

    // Only mlx5_1 port 1: every GPU gets it, at its own distance.
    let f: HcaFilter = "=mlx5_1:1".parse().unwrap();
    let all = topo.assign(&ids(&gpus), Some(&f)).unwrap();
    assert!(all.iter().all(|c| c.device == "mlx5_1" && c.port == 1));
    assert_eq!(all[6].distance, Distance::Pix);
    assert_eq!(all[0].distance, Distance::Sys);
    assert_eq!(all[4].distance, Distance::Node);
    assert_eq!(all[0].shared_with.len(), 7);
    assert!(all[0].reason.contains("shared with"), "{}", all[0].reason);

    // A prefix matching everything changes nothing.
    let f: HcaFilter = "mlx5".parse().unwrap();
    let all = topo.assign(&ids(&gpus), Some(&f)).unwrap();
    assert_eq!(
        all.iter().map(|c| c.device.clone()).collect::<Vec<_>>(),
        (0..8).rev().map(|i| format!("mlx5_{i}")).collect::<Vec<_>>()
    );

    // Filters that match nothing say so, quoting the filter.
    for spec in ["mlx4", "=mlx5_1:2", "^mlx5"] {
        let f: HcaFilter = spec.parse().unwrap();
        let e = topo.nearest(&gpus[0], Some(&f)).unwrap_err();
        match &e {
            TopoError::FilterExcludesAll { filter, available } => {
                assert_eq!(filter, spec);
                assert_eq!(available.len(), 8);
                assert!(available.contains(&"mlx5_3:1".to_string()));
            }
            other => panic!("{spec}: {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(&format!("`{spec}`")) && msg.contains("DOORBELL_IB_HCA"), "{msg}");
    }
}

/// One PCIe switch with two GPUs and one NIC, and a second NIC on the other
/// socket.
#[test]
fn two_gpus_share_one_nic() {
    let t = Tree::new("shared");
    let rp = "0000:10:01.0";
    let up = "0000:11:00.0";
    t.pci("pci0000:10", &[rp, up, "0000:12:00.0", "0000:13:00.0"], 0, Some("nvidia"));
    t.pci("pci0000:10", &[rp, up, "0000:12:01.0", "0000:14:00.0"], 0, Some("nvidia"));
    let nic = t.pci("pci0000:10", &[rp, up, "0000:12:02.0", "0000:15:00.0"], 0, Some("mlx5_core"));
    t.rdma("mlx5_0", &nic, &[PortSpec::ib_active(1)]);
    let far = t.pci("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1, Some("mlx5_core"));
    t.rdma("mlx5_1", &far, &[PortSpec::ib_active(1)]);

    let topo = Topology::read(t.root()).unwrap();
    let all = topo.assign(&["0000:13:00.0", "0000:14:00.0"], None).unwrap();
    assert_eq!(all[0].device, "mlx5_0");
    assert_eq!(all[1].device, "mlx5_0");
    assert_eq!(all[0].distance, Distance::Pix);
    assert_eq!(all[0].shared_with, ["0000:14:00.0"]);
    assert_eq!(all[1].shared_with, ["0000:13:00.0"]);
    assert!(all[1].reason.contains("shared with GPU(s) 0000:13:00.0"), "{}", all[1].reason);
    // The same GPU listed twice is one GPU: same port, not shared.
    let twice = topo.assign(&["0000:13:00.0", "0000:13:00.0"], None).unwrap();
    assert_eq!(twice[0], twice[1]);
    assert!(twice[0].shared_with.is_empty());
}

/// GPUs equally near to several NICs get different ones where possible;
/// GPUs left over share the least-loaded one (ties by name).
#[test]
fn equal_distance_spreads_over_nics() {
    let t = Tree::new("spread");
    let (rp, up) = ("0000:10:01.0", "0000:11:00.0");
    // One switch: GPUs A, C, D and NICs mlx5_0, mlx5_1 (all PIX to each other).
    t.pci("pci0000:10", &[rp, up, "0000:12:00.0", "0000:13:00.0"], 0, None); // A
    t.pci("pci0000:10", &[rp, up, "0000:12:03.0", "0000:16:00.0"], 0, None); // C
    t.pci("pci0000:10", &[rp, up, "0000:12:04.0", "0000:17:00.0"], 0, None); // D
    let n0 = t.pci("pci0000:10", &[rp, up, "0000:12:01.0", "0000:14:00.0"], 0, Some("mlx5_core"));
    let n1 = t.pci("pci0000:10", &[rp, up, "0000:12:02.0", "0000:15:00.0"], 0, Some("mlx5_core"));
    t.rdma("mlx5_0", &n0, &[PortSpec::ib_active(1)]);
    t.rdma("mlx5_1", &n1, &[PortSpec::ib_active(1)]);
    // Another root port: GPU B beside a dual-port mlx5_2 whose port 1 is down.
    t.pci(
        "pci0000:10",
        &["0000:10:02.0", "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"],
        0,
        None,
    ); // B
    let n2 = t.pci(
        "pci0000:10",
        &["0000:10:02.0", "0000:20:00.0", "0000:21:01.0", "0000:23:00.0"],
        0,
        Some("mlx5_core"),
    );
    t.rdma("mlx5_2", &n2, &[PortSpec::ib(1, "1: DOWN"), PortSpec::ib_active(2)]);

    let topo = Topology::read(t.root()).unwrap();
    let all = topo
        .assign(&["0000:13:00.0", "0000:16:00.0", "0000:22:00.0", "0000:17:00.0"], None)
        .unwrap();
    assert_eq!(
        all.iter().map(|c| (c.device.as_str(), c.port)).collect::<Vec<_>>(),
        [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 2), ("mlx5_0", 1)]
    );
    assert!(all.iter().all(|c| c.distance == Distance::Pix));
    assert_eq!(all[0].shared_with, ["0000:17:00.0"]);
    assert_eq!(all[3].shared_with, ["0000:13:00.0"]);
    assert!(all[1].shared_with.is_empty() && all[2].shared_with.is_empty());
    assert!(all[3].reason.contains("more GPUs than ports"), "{}", all[3].reason);
    // Alone, each GPU of the switch takes the first NIC in name order.
    assert_eq!(topo.nearest("0000:16:00.0", None).unwrap().device, "mlx5_0");
}

/// A maximum matching, not greedy name order: X is equally near (PXB) to
/// mlx5_a and mlx5_b, Y is nearest (PIX) only to mlx5_a. X comes first
/// but must leave mlx5_a to Y.
#[test]
fn equal_distance_matching_beats_greedy() {
    let t = Tree::new("kuhn");
    let rp = "0000:10:01.0";
    t.pci("pci0000:10", &[rp, "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"], 0, None); // X
    let a = t.pci("pci0000:10", &[rp, "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"], 0, None);
    t.pci("pci0000:10", &[rp, "0000:20:00.0", "0000:21:01.0", "0000:23:00.0"], 0, None); // Y
    let b = t.pci("pci0000:10", &[rp, "0000:30:00.0", "0000:31:00.0", "0000:32:00.0"], 0, None);
    t.rdma("mlx5_a", &a, &[PortSpec::ib_active(1)]);
    t.rdma("mlx5_b", &b, &[PortSpec::ib_active(1)]);
    let topo = Topology::read(t.root()).unwrap();
    let dev = |n: &str| topo.devices().iter().find(|d| d.name == n).unwrap().clone();
    let (x, y) = (topo.gpu("0000:13:00.0").unwrap(), topo.gpu("0000:23:00.0").unwrap());
    assert_eq!(Topology::distance(&x, &dev("mlx5_a")), Distance::Pxb);
    assert_eq!(Topology::distance(&x, &dev("mlx5_b")), Distance::Pxb);
    assert_eq!(Topology::distance(&y, &dev("mlx5_a")), Distance::Pix);
    assert_eq!(Topology::distance(&y, &dev("mlx5_b")), Distance::Pxb);
    assert_eq!(topo.nearest("0000:13:00.0", None).unwrap().device, "mlx5_a");
    let all = topo.assign(&["0000:13:00.0", "0000:23:00.0"], None).unwrap();
    assert_eq!((all[0].device.as_str(), all[0].distance), ("mlx5_b", Distance::Pxb));
    assert_eq!((all[1].device.as_str(), all[1].distance), ("mlx5_a", Distance::Pix));
    assert!(all[0].shared_with.is_empty() && all[1].shared_with.is_empty());
}

#[test]
fn down_port_skipped_for_farther_active_one() {
    let t = Tree::new("down");
    let (rp, up) = ("0000:10:01.0", "0000:11:00.0");
    t.pci("pci0000:10", &[rp, up, "0000:12:00.0", "0000:13:00.0"], 0, Some("nvidia"));
    let near = t.pci("pci0000:10", &[rp, up, "0000:12:01.0", "0000:14:00.0"], 0, Some("mlx5_core"));
    t.rdma("mlx5_0", &near, &[PortSpec::ib(1, "1: DOWN")]);
    let far = t.pci("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1, Some("mlx5_core"));
    t.rdma("mlx5_1", &far, &[PortSpec::ib_active(1)]);
    let init = t.pci("pci0000:90", &["0000:90:01.0", "0000:91:00.0"], 0, Some("mlx5_core"));
    t.rdma("mlx5_2", &init, &[PortSpec::ib(1, "2: INIT")]);

    let topo = Topology::read(t.root()).unwrap();
    let c = topo.nearest("0000:13:00.0", None).unwrap();
    assert_eq!(c.device, "mlx5_1");
    assert_eq!(c.distance, Distance::Sys);
    assert!(c.reason.contains("mlx5_0:1 is nearer (PIX) but 1: DOWN"), "{}", c.reason);
    assert!(c.reason.contains("mlx5_2:1 is nearer (NODE) but 2: INIT"), "{}", c.reason);

    // With the active one filtered out, every port is down: list them.
    let f: HcaFilter = "^=mlx5_1".parse().unwrap();
    let e = topo.nearest("0000:13:00.0", Some(&f)).unwrap_err();
    match &e {
        TopoError::AllPortsDown { ports, filter } => {
            let got: Vec<(&str, u8, &str)> = ports.iter().map(|p| (p.device.as_str(), p.port, p.state.as_str())).collect();
            assert_eq!(got, [("mlx5_0", 1, "1: DOWN"), ("mlx5_2", 1, "2: INIT")]);
            assert_eq!(filter.as_deref(), Some("^=mlx5_1"));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("mlx5_0:1 is 1: DOWN") && msg.contains("subnet manager") && msg.contains("^=mlx5_1"),
        "{msg}"
    );
}

fn roce_tree(gids: Vec<Gid>) -> Tree {
    let t = Tree::new("roce");
    let (rp, up) = ("0000:10:01.0", "0000:11:00.0");
    t.pci("pci0000:10", &[rp, up, "0000:12:00.0", "0000:13:00.0"], 0, Some("nvidia"));
    let nic = t.pci("pci0000:10", &[rp, up, "0000:12:01.0", "0000:14:00.0"], 0, Some("mlx5_core"));
    t.rdma(
        "mlx5_0",
        &nic,
        &[PortSpec {
            number: 1,
            state: "4: ACTIVE",
            link_layer: "Ethernet",
            gids,
        }],
    );
    t
}

const LL: &str = "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d";
const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0105";
const V6: &str = "2001:0db8:0000:0000:0000:0000:0000:0042";

fn gid(index: u32, text: Option<&'static str>, t: Option<&'static str>) -> Gid {
    Gid { index, text, gid_type: t }
}

#[test]
fn roce_gid_index() {
    let v1 = Some("IB/RoCE v1");
    let v2 = Some("RoCE v2");
    // Zero entry typed v2 at 0, link-local v1/v2, IPv4-mapped v1/v2,
    // unreadable entries, another IPv4-mapped v2 later.
    let t = roce_tree(vec![
        gid(0, Some(ZERO_GID), v2),
        gid(1, Some(LL), v1),
        gid(2, Some(LL), v2),
        gid(3, Some(V4), v1),
        gid(4, Some(V4), v2),
        gid(5, None, None),
        gid(6, Some(ZERO_GID), None),
        gid(7, Some(V4), v2),
    ]);
    let topo = Topology::read(t.root()).unwrap();
    let port = &topo.devices()[0].ports[0];
    assert_eq!(port.gids.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2, 3, 4, 7]);
    let c = topo.nearest("0000:13:00.0", None).unwrap();
    assert_eq!(c.link_layer, LinkLayer::Ethernet);
    assert_eq!(c.gid_index, Some(4));
    assert!(c.reason.contains("RoCE v2 GID index 4"), "{}", c.reason);

    // No IPv4-mapped v2: a global IPv6 v2 beats a lower link-local v2.
    let t = roce_tree(vec![
        gid(0, Some(LL), v1),
        gid(1, Some(LL), v2),
        gid(2, Some(V4), v1),
        gid(3, Some(V6), v2),
    ]);
    assert_eq!(
        Topology::read(t.root()).unwrap().nearest("0000:13:00.0", None).unwrap().gid_index,
        Some(3)
    );

    // Only link-local v2: the lowest such index.
    let t = roce_tree(vec![
        gid(0, Some(LL), v1),
        gid(1, None, None),
        gid(2, Some(LL), v2),
        gid(3, Some(LL), v2),
    ]);
    assert_eq!(
        Topology::read(t.root()).unwrap().nearest("0000:13:00.0", None).unwrap().gid_index,
        Some(2)
    );

    // No RoCE v2 entry at all: a clear error naming the port.
    let t = roce_tree(vec![gid(0, Some(LL), v1), gid(1, Some(V4), v1), gid(2, Some(ZERO_GID), v2)]);
    let e = Topology::read(t.root()).unwrap().nearest("0000:13:00.0", None).unwrap_err();
    match &e {
        TopoError::NoRoceV2Gid { ports } => assert_eq!((ports[0].device.as_str(), ports[0].port), ("mlx5_0", 1)),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("mlx5_0:1") && e.to_string().contains("IP address"), "{e}");
}

#[test]
fn roce_port_without_gid_passed_over_for_ib() {
    let t = roce_tree(vec![gid(0, Some(LL), Some("IB/RoCE v1"))]);
    let far = t.pci("pci0000:80", &["0000:80:01.0", "0000:81:00.0"], 1, Some("mlx5_core"));
    t.rdma("mlx5_1", &far, &[PortSpec::ib_active(1)]);
    let topo = Topology::read(t.root()).unwrap();
    let c = topo.nearest("0000:13:00.0", None).unwrap();
    assert_eq!((c.device.as_str(), c.gid_index, c.distance), ("mlx5_1", None, Distance::Sys));
    assert!(c.reason.contains("mlx5_0:1 is Ethernet without a RoCE v2 GID"), "{}", c.reason);
}

#[test]
fn no_device_at_all() {
    let t = Tree::new("empty");
    t.pci("pci0000:10", &["0000:10:01.0", "0000:11:00.0"], 0, Some("nvidia"));
    let topo = Topology::read(t.root()).unwrap();
    assert!(topo.devices().is_empty());
    let e = topo.nearest("0000:11:00.0", None).unwrap_err();
    assert!(matches!(e, TopoError::NoDevice { .. }), "{e:?}");
    assert!(e.to_string().contains("DOORBELL_NIC=soft"), "{e}");
    let e = topo.assign(&["0000:11:00.0"], None).unwrap_err();
    assert!(matches!(e, TopoError::NoDevice { .. }), "{e:?}");
}

#[test]
fn devices_without_ports() {
    let t = Tree::new("noports");
    t.pci("pci0000:10", &["0000:10:01.0", "0000:11:00.0"], 0, Some("nvidia"));
    let nic = t.pci("pci0000:10", &["0000:10:02.0", "0000:12:00.0"], 0, Some("mlx5_core"));
    t.rdma("mlx5_0", &nic, &[]);
    let topo = Topology::read(t.root()).unwrap();
    let e = topo.nearest("0000:11:00.0", None).unwrap_err();
    match &e {
        TopoError::NoPorts { devices } => assert_eq!(devices, &["mlx5_0"]),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("mlx5_0") && e.to_string().contains("ibv_devinfo"), "{e}");
}

#[test]
fn gpu_lookup_errors() {
    let (t, _) = dgx();
    let topo = Topology::read(t.root()).unwrap();
    match topo.nearest("0000:ee:00.0", None).unwrap_err() {
        TopoError::GpuNotFound { bus_id, .. } => assert_eq!(bus_id, "0000:ee:00.0"),
        other => panic!("{other:?}"),
    }
    for bad in ["GPU-1234", "0000:13:00", ""] {
        match topo.nearest(bad, None).unwrap_err() {
            TopoError::BadBusId { bus_id } => assert_eq!(bus_id, bad),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        topo.assign(&["0000:13:00.0", "nope"], None),
        Err(TopoError::BadBusId { .. })
    ));
}

#[test]
fn device_not_on_pci_counts_as_sys() {
    let t = Tree::new("rxe");
    t.pci("pci0000:10", &["0000:10:01.0", "0000:11:00.0"], 0, Some("nvidia"));
    t.virtual_rdma(
        "rxe0",
        &[PortSpec {
            number: 1,
            state: "4: ACTIVE",
            link_layer: "Ethernet",
            gids: vec![gid(1, Some(V4), Some("RoCE v2"))],
        }],
    );
    let topo = Topology::read(t.root()).unwrap();
    assert_eq!(topo.devices()[0].pci, None);
    assert_eq!(topo.devices()[0].driver, None);
    let c = topo.nearest("0000:11:00.0", None).unwrap();
    assert_eq!((c.device.as_str(), c.distance, c.gid_index), ("rxe0", Distance::Sys, Some(1)));
    assert!(c.reason.contains("not on PCI"), "{}", c.reason);
}

#[test]
fn detection_helpers() {
    let t = Tree::new("detect");
    assert!(!nvidia_peermem_loaded(t.root()));
    t.module("nvidia");
    assert!(!nvidia_peermem_loaded(t.root()));
    t.module("nvidia_peermem");
    assert!(nvidia_peermem_loaded(t.root()));

    assert!(matches!(dmabuf_supported_by_kernel(t.root()), Err(TopoError::Io { .. })));
    t.osrelease("5.12.0\n");
    assert!(dmabuf_supported_by_kernel(t.root()).unwrap());
    t.osrelease("5.4.0-150-generic\n");
    assert!(!dmabuf_supported_by_kernel(t.root()).unwrap());
    t.osrelease("6.1.0-13-amd64\n");
    assert!(dmabuf_supported_by_kernel(t.root()).unwrap());

    let hint = devx_privilege_hint();
    assert!(hint.contains("CAP_NET_RAW") && hint.contains("/dev/infiniband"), "{hint}");
}

/// On this machine's own root the readers must not fail (whatever it has).
#[test]
fn reads_the_real_root() {
    let topo = Topology::read(std::path::Path::new("/")).unwrap();
    for d in topo.devices() {
        assert!(!d.name.is_empty());
    }
}
