//! The decisions of the mlx5 NIC that need no hardware, as pure functions:
//! how GPU memory is registered, the geometry of the caller's rings, the
//! RTR/RTS attributes of a QP from the endpoints and [`QpOptions`], and
//! the next hop's MAC address of a RoCE peer.

use rdma_sys_ext::prm::{self, RemoteAddress, RtrParams, RtsParams};

use super::super::{CqRing, Endpoint, LinkLayer, PortInfo, QpOptions, QpRings};

/// PSNs and QP numbers are 24 bits.
pub const MASK_24: u32 = 0xff_ffff;

/// How GPU memory is given to the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegMethod {
    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)` → `ibv_reg_dmabuf_mr` /
    /// DevX umem from the dma-buf.
    DmaBuf,
    /// `ibv_reg_mr` / DevX umem on the GPU pointer itself, which the
    /// `nvidia_peermem` kernel module resolves.
    PeerMem,
}

impl RegMethod {
    /// For the log.
    pub fn describe(self) -> &'static str {
        match self {
            RegMethod::DmaBuf => "GPU memory registered as dma-buf",
            RegMethod::PeerMem => "GPU memory registered through nvidia_peermem",
        }
    }
}

/// The registration methods to try, in order: dma-buf where the kernel
/// and rdma-core support it (the GPU driver may still refuse; then
/// `nvidia_peermem`, if loaded), else `nvidia_peermem`; an error that says
/// what to enable when neither is there.
pub fn registration_order(dmabuf_supported: bool, peermem_loaded: bool) -> Result<Vec<RegMethod>, String> {
    let mut v = Vec::new();
    if dmabuf_supported {
        v.push(RegMethod::DmaBuf);
    }
    if peermem_loaded {
        v.push(RegMethod::PeerMem);
    }
    if v.is_empty() {
        return Err(
            "GPU memory cannot be registered with the NIC: neither dma-buf (needs Linux 5.12+, rdma-core 34+ \
                    and NVIDIA's open kernel modules R515+) nor nvidia_peermem is available; load the peer-memory \
                    module (`modprobe nvidia_peermem`) or use a kernel and driver with dma-buf support"
                .to_string(),
        );
    }
    Ok(v)
}

/// A CQ's geometry as CREATE_CQ needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqGeometry {
    /// log2 of the CQE count.
    pub log_size: u8,
    /// Ring bytes.
    pub bytes: usize,
}

/// Checks a caller's CQ ring.
pub fn cq_geometry(ring: &CqRing) -> Result<CqGeometry, String> {
    if ring.buf.is_null() || ring.dbrec.is_null() {
        return Err("a CQ on mlx5 needs both its ring and its doorbell record (non-null)".to_string());
    }
    if !ring.entries.is_power_of_two() || ring.entries < 2 || ring.entries > 1 << 22 {
        return Err(format!("CQ entries {} must be a power of two in 2..=4194304", ring.entries));
    }
    if !(ring.buf as usize).is_multiple_of(64) || !(ring.dbrec as usize).is_multiple_of(8) {
        return Err("the CQ ring must be 64-byte aligned and its doorbell record 8-byte aligned".to_string());
    }
    Ok(CqGeometry {
        log_size: ring.entries.trailing_zeros() as u8,
        bytes: ring.entries as usize * 64,
    })
}

/// A QP's geometry as CREATE_QP needs it: one work-queue buffer, the RQ
/// (if any) first and the SQ right after it, as the PRM lays them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpGeometry {
    /// Start of the work-queue buffer.
    pub wq_start: usize,
    /// Its bytes.
    pub wq_bytes: usize,
    /// log2 of the SQ's 64-byte basic blocks.
    pub log_sq_size: u8,
    /// log2 of the RQ's WQEs; `None`: zero-length RQ.
    pub log_rq_size: Option<u8>,
    /// log2 of a receive WQE in 16-byte units.
    pub log_rq_stride: u8,
}

/// Checks a caller's QP rings.
pub fn qp_geometry(r: &QpRings) -> Result<QpGeometry, String> {
    if r.sq.is_null() || r.dbrec.is_null() {
        return Err("a QP on mlx5 needs its send queue and doorbell record (non-null)".to_string());
    }
    if !r.sq_wqebbs.is_power_of_two() || r.sq_wqebbs > 1 << 15 {
        return Err(format!("SQ size {} WQEBBs must be a power of two up to 32768", r.sq_wqebbs));
    }
    if !(r.sq as usize).is_multiple_of(64) || !(r.dbrec as usize).is_multiple_of(8) {
        return Err("the SQ must be 64-byte aligned and the doorbell record 8-byte aligned".to_string());
    }
    let sq_bytes = r.sq_wqebbs as usize * 64;
    if r.rq_wqes == 0 {
        return Ok(QpGeometry {
            wq_start: r.sq as usize,
            wq_bytes: sq_bytes,
            log_sq_size: r.sq_wqebbs.trailing_zeros() as u8,
            log_rq_size: None,
            log_rq_stride: 0,
        });
    }
    if r.rq.is_null() || !r.rq_wqes.is_power_of_two() || r.rq_wqes > 1 << 15 || !r.rq_max_sge.is_power_of_two() || r.rq_max_sge > 128 {
        return Err(format!(
            "RQ of {} WQEs × {} scatter entries: both must be powers of two (≤ 32768 WQEs, ≤ 128 entries) over a non-null buffer",
            r.rq_wqes, r.rq_max_sge
        ));
    }
    let rq_bytes = r.rq_wqes as usize * r.rq_max_sge as usize * 16;
    if r.rq as usize + rq_bytes != r.sq as usize {
        return Err(format!(
            "on mlx5 the SQ must follow the RQ in one buffer (RQ at {:#x} + {rq_bytes} bytes, SQ at {:#x})",
            r.rq as usize, r.sq as usize
        ));
    }
    Ok(QpGeometry {
        wq_start: r.rq as usize,
        wq_bytes: rq_bytes + sq_bytes,
        log_sq_size: r.sq_wqebbs.trailing_zeros() as u8,
        log_rq_size: Some(r.rq_wqes.trailing_zeros() as u8),
        log_rq_stride: r.rq_max_sge.trailing_zeros() as u8,
    })
}

/// The local side of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Local<'a> {
    /// The port.
    pub port: &'a PortInfo,
    /// Its number (1-based).
    pub port_num: u8,
    /// This QP.
    pub qpn: u32,
    /// The PSN this QP sends first.
    pub psn: u32,
    /// log2 of the largest message.
    pub log_msg_max: u8,
}

/// The path MTU: the option (or the port's active MTU), no larger than
/// what the peer announced or this port's active MTU.
pub fn path_mtu(port: &PortInfo, remote: &Endpoint, opts: &QpOptions) -> Result<u32, String> {
    let want = opts.mtu.unwrap_or(port.active_mtu);
    prm::mtu_code(want).map_err(|e| e.to_string())?;
    let mut mtu = want.min(port.active_mtu);
    if remote.mtu != 0 {
        prm::mtu_code(remote.mtu).map_err(|e| format!("the peer announced an invalid MTU: {e}"))?;
        mtu = mtu.min(remote.mtu);
    }
    Ok(mtu)
}

/// The UDP source port of a RoCE v2 QP: 0xC000 plus 14 bits from both QP
/// numbers, so flows spread over ECMP paths.
pub fn udp_sport(local_qpn: u32, remote_qpn: u32) -> u16 {
    0xc000 | (((local_qpn ^ remote_qpn.rotate_left(7)) & 0x3fff) as u16)
}

/// INIT → RTR and RTR → RTS toward `remote`. `rmac` is the next hop's MAC
/// (RoCE; see [`resolve_rmac`]).
pub fn plan_connect(
    local: &Local<'_>,
    remote: &Endpoint,
    opts: &QpOptions,
    rmac: Option<[u8; 6]>,
) -> Result<(RtrParams, RtsParams), String> {
    if remote.qpn > MASK_24 {
        return Err(format!("the peer's QPN {:#x} is wider than 24 bits", remote.qpn));
    }
    if opts.timeout > 31 || opts.retry_cnt > 7 || opts.rnr_retry > 7 || opts.sl > 15 {
        return Err(format!(
            "QP options out of range: timeout {} (≤ 31), retry count {} (≤ 7), RNR retry {} (≤ 7), SL {} (≤ 15)",
            opts.timeout, opts.retry_cnt, opts.rnr_retry, opts.sl
        ));
    }
    let mtu = path_mtu(local.port, remote, opts)?;
    let address = match local.port.link_layer {
        LinkLayer::InfiniBand => {
            if remote.lid == 0 {
                return Err("the peer announced LID 0 on InfiniBand (is its port active, is a subnet manager running?)".to_string());
            }
            RemoteAddress::Ib { lid: remote.lid }
        }
        LinkLayer::Ethernet => {
            let sgid_index = local
                .port
                .gid_index
                .ok_or("a RoCE port needs a GID index (none was chosen for this port)")?;
            let sgid_index = u8::try_from(sgid_index).map_err(|_| format!("GID index {sgid_index} is above 255"))?;
            if remote.gid == [0; 16] {
                return Err("the peer announced no GID on a RoCE (Ethernet) port".to_string());
            }
            RemoteAddress::Roce {
                gid: remote.gid,
                sgid_index,
                hop_limit: 64,
                tclass: opts.traffic_class,
                rmac: rmac.ok_or("the peer's MAC address is unknown")?,
                udp_sport: udp_sport(local.qpn, remote.qpn),
            }
        }
    };
    let rtr = RtrParams {
        qpn: local.qpn,
        port: local.port_num,
        mtu,
        remote_qpn: remote.qpn,
        next_rcv_psn: remote.psn & MASK_24,
        max_rd_atomic: opts.max_rd_atomic,
        min_rnr_nak: 12,
        sl: opts.sl,
        remote: address,
        log_msg_max: local.log_msg_max,
    };
    let rts = RtsParams {
        qpn: local.qpn,
        next_send_psn: local.psn & MASK_24,
        retry_count: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        max_rd_atomic: opts.max_rd_atomic,
        ack_timeout: opts.timeout,
    };
    Ok((rtr, rts))
}

/// The next hop's MAC for a RoCE peer at `remote_gid`: this port's own MAC
/// for its own GID (loopback), the EUI-64 MAC inside a link-local GID, or
/// the kernel's ARP entry (`/proc/net/arp` text) for an IPv4-mapped GID.
/// Routed peers (whose next hop is a gateway) and IPv6 global GIDs are
/// not resolved: the error says so.
pub fn resolve_rmac(remote_gid: &[u8; 16], local_gid: &[u8; 16], local_mac: Option<[u8; 6]>, arp: &str) -> Result<[u8; 6], String> {
    if remote_gid == local_gid {
        return local_mac.ok_or_else(|| "this port's MAC address is unknown (no netdev for its GID)".to_string());
    }
    let g = remote_gid;
    if g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff {
        let ip = format!("{}.{}.{}.{}", g[12], g[13], g[14], g[15]);
        for line in arp.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() >= 4 && cols[0] == ip && cols[2] != "0x0" {
                if let Some(mac) = parse_mac(cols[3]) {
                    return Ok(mac);
                }
            }
        }
        return Err(format!(
            "no ARP entry for the peer {ip}: it must be on this port's subnet and reachable (ping it once; routed RoCE peers are not supported)"
        ));
    }
    if g[0] == 0xfe && g[1] & 0xc0 == 0x80 && g[11] == 0xff && g[12] == 0xfe {
        return Ok([g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]]);
    }
    Err(format!(
        "cannot find the MAC address of the peer's GID {}: use IPv4-based or link-local RoCE v2 GIDs",
        format_gid(remote_gid)
    ))
}

/// `aa:bb:cc:dd:ee:ff` → bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// A GID as eight groups of four hex digits.
pub fn format_gid(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `IBV_MTU_*` (1..=5) → bytes.
pub fn mtu_bytes(code: u32) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128u32 << code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys_ext::prm::{ads, qpc, transition_path, transition_qpc, Command};

    fn ib_port() -> PortInfo {
        PortInfo {
            name: "mlx5_0:1".into(),
            lid: 7,
            gid: [0; 16],
            gid_index: None,
            link_layer: LinkLayer::InfiniBand,
            active_mtu: 4096,
        }
    }

    fn roce_port() -> PortInfo {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 1]);
        PortInfo {
            name: "mlx5_2:1".into(),
            lid: 0,
            gid,
            gid_index: Some(3),
            link_layer: LinkLayer::Ethernet,
            active_mtu: 1024,
        }
    }

    fn remote() -> Endpoint {
        Endpoint {
            lid: 9,
            gid: [0; 16],
            qpn: 0x1234,
            psn: 0xfedc_ba98,
            mtu: 4096,
            slot: 0,
        }
    }

    /// QP `qpn` on port 1 of `port`, its first PSN `psn`.
    fn local(port: &PortInfo, qpn: u32, psn: u32) -> Local<'_> {
        Local {
            port,
            port_num: 1,
            qpn,
            psn,
            log_msg_max: 30,
        }
    }

    #[test]
    fn registration_choice() {
        assert_eq!(registration_order(true, true).unwrap(), vec![RegMethod::DmaBuf, RegMethod::PeerMem]);
        assert_eq!(registration_order(true, false).unwrap(), vec![RegMethod::DmaBuf]);
        assert_eq!(registration_order(false, true).unwrap(), vec![RegMethod::PeerMem]);
        let e = registration_order(false, false).unwrap_err();
        assert!(e.contains("nvidia_peermem") && e.contains("dma-buf"), "{e}");
    }

    #[test]
    fn ib_connect_uses_the_lid_and_masks_psns() {
        let port = ib_port();
        let local = local(&port, 0x55, 0x0100_0042);
        let (rtr, rts) = plan_connect(&local, &remote(), &QpOptions::default(), None).unwrap();
        assert_eq!(rtr.remote, RemoteAddress::Ib { lid: 9 });
        assert_eq!(rtr.next_rcv_psn, 0xdc_ba98);
        assert_eq!(rts.next_send_psn, 0x42);
        assert_eq!(rtr.mtu, 4096);
        let m = prm::init2rtr(&rtr).unwrap();
        assert_eq!(m.get(transition_qpc(Command::Init2RtrQp), qpc::MTU), 5);
        assert_eq!(m.get(transition_path(Command::Init2RtrQp), ads::RLID), 9);
        assert_eq!(m.get(transition_path(Command::Init2RtrQp), ads::GRH), 0);
        let s = prm::rtr2rts(&rts).unwrap();
        assert_eq!(s.get(transition_path(Command::Rtr2RtsQp), ads::ACK_TIMEOUT), 18);
        assert_eq!(s.get(transition_qpc(Command::Rtr2RtsQp), qpc::LOG_SRA_MAX), 4);
        let mut r = remote();
        r.lid = 0;
        assert!(plan_connect(&local, &r, &QpOptions::default(), None).unwrap_err().contains("LID 0"));
    }

    #[test]
    fn mtu_is_the_smallest_and_bad_ones_are_refused() {
        let port = roce_port();
        let opts = QpOptions {
            mtu: Some(4096),
            ..QpOptions::default()
        };
        assert_eq!(path_mtu(&port, &remote(), &opts).unwrap(), 1024);
        let mut r = remote();
        r.mtu = 512;
        assert_eq!(path_mtu(&port, &r, &QpOptions::default()).unwrap(), 512);
        let bad = QpOptions {
            mtu: Some(1500),
            ..QpOptions::default()
        };
        assert!(path_mtu(&port, &remote(), &bad).unwrap_err().contains("1500"));
        r.mtu = 9000;
        assert!(path_mtu(&port, &r, &QpOptions::default()).unwrap_err().contains("peer"));
        let opts = QpOptions {
            retry_cnt: 8,
            ..QpOptions::default()
        };
        let local = local(&port, 1, 0);
        assert!(plan_connect(&local, &remote(), &opts, None).unwrap_err().contains("retry count 8"));
    }

    #[test]
    fn roce_connect_uses_the_gid_and_mac() {
        let port = roce_port();
        let local = local(&port, 0x77, 5);
        let mut r = remote();
        r.gid = port.gid;
        r.gid[15] = 2;
        let opts = QpOptions {
            traffic_class: 106,
            ..QpOptions::default()
        };
        assert!(plan_connect(&local, &r, &opts, None).unwrap_err().contains("MAC"));
        let mac = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee];
        let (rtr, _) = plan_connect(&local, &r, &opts, Some(mac)).unwrap();
        match rtr.remote {
            RemoteAddress::Roce {
                gid,
                sgid_index,
                tclass,
                rmac,
                udp_sport,
                ..
            } => {
                assert_eq!(gid, r.gid);
                assert_eq!(sgid_index, 3);
                assert_eq!(tclass, 106);
                assert_eq!(rmac, mac);
                assert!(udp_sport >= 0xc000);
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(rtr.mtu, 1024);
        let m = prm::init2rtr(&rtr).unwrap();
        assert_eq!(m.get(transition_path(Command::Init2RtrQp), ads::GRH), 1);
        assert_eq!(m.get(transition_path(Command::Init2RtrQp), ads::SRC_ADDR_INDEX), 3);
        r.gid = [0; 16];
        assert!(plan_connect(&local, &r, &opts, Some(mac)).unwrap_err().contains("no GID"));
    }

    #[test]
    fn rmac_resolution() {
        let local = roce_port().gid;
        let mac = [2, 0, 0, 0, 0, 1];
        assert_eq!(resolve_rmac(&local, &local, Some(mac), "").unwrap(), mac);
        let mut peer = local;
        peer[15] = 9;
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.0.0.9         0x1         0x2         b8:ce:f6:01:02:03     *        ens1f0\n";
        assert_eq!(resolve_rmac(&peer, &local, None, arp).unwrap(), [0xb8, 0xce, 0xf6, 1, 2, 3]);
        peer[15] = 10;
        assert!(resolve_rmac(&peer, &local, None, arp).unwrap_err().contains("10.0.0.10"));
        let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xba, 0xce, 0xf6, 0xff, 0xfe, 0x01, 0x02, 0x03];
        assert_eq!(resolve_rmac(&ll, &local, None, "").unwrap(), [0xb8, 0xce, 0xf6, 1, 2, 3]);
        assert_eq!(parse_mac("b8:ce:f6:01:02:0g"), None);
    }

    #[test]
    fn ring_geometry() {
        let mut sq = vec![0u64; 1024];
        let base = (sq.as_mut_ptr() as usize + 63) & !63;
        let mut db = [0u32; 2];
        let rings = QpRings {
            sq: base as *mut u8,
            sq_wqebbs: 64,
            rq: std::ptr::null_mut(),
            rq_wqes: 0,
            rq_max_sge: 1,
            dbrec: db.as_mut_ptr(),
            uar: std::ptr::null_mut(),
        };
        let g = qp_geometry(&rings).unwrap();
        assert_eq!((g.log_sq_size, g.log_rq_size, g.wq_bytes), (6, None, 4096));
        let bad = QpRings { sq_wqebbs: 48, ..rings };
        assert!(qp_geometry(&bad).is_err());
        let with_rq = QpRings {
            rq: base as *mut u8,
            rq_wqes: 4,
            rq_max_sge: 2,
            sq: (base + 128) as *mut u8,
            ..rings
        };
        let g = qp_geometry(&with_rq).unwrap();
        assert_eq!(
            (g.wq_start, g.wq_bytes, g.log_rq_size, g.log_rq_stride),
            (base, 128 + 4096, Some(2), 1)
        );
        let apart = QpRings {
            sq: (base + 192) as *mut u8,
            ..with_rq
        };
        assert!(qp_geometry(&apart).unwrap_err().contains("follow"));
        let cq = CqRing {
            buf: base as *mut u8,
            entries: 32,
            dbrec: db.as_mut_ptr(),
        };
        assert_eq!(cq_geometry(&cq).unwrap(), CqGeometry { log_size: 5, bytes: 2048 });
        assert!(cq_geometry(&CqRing { entries: 33, ..cq }).is_err());
        assert!(cq_geometry(&CqRing {
            dbrec: std::ptr::null_mut(),
            ..cq
        })
        .is_err());
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
    }
}
