//! An RDMA port as sysfs describes it: its state, link layer, rate, LID and
//! GID table ([`Port`]).

use std::fmt;

/// A port named in an error, with its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortStatus {
    /// The device name.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// The state as sysfs gives it, e.g. `"1: DOWN"`.
    pub state: String,
}

/// A port's logical state (`ports/<n>/state`, e.g. `"4: ACTIVE"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// 1: no link.
    Down,
    /// 2: link up, not yet configured (InfiniBand: waiting for the subnet manager).
    Init,
    /// 3: configured, not yet active.
    Armed,
    /// 4: usable.
    Active,
    /// 5: active, deferring.
    ActiveDefer,
    /// Anything else, with its number if one could be read.
    Unknown(Option<u8>),
}

impl PortState {
    /// Parses sysfs' `"<number>: <NAME>"` text; the number decides.
    pub fn parse(text: &str) -> PortState {
        let num = text.trim().split(':').next().and_then(|n| n.trim().parse::<u8>().ok());
        match num {
            Some(1) => PortState::Down,
            Some(2) => PortState::Init,
            Some(3) => PortState::Armed,
            Some(4) => PortState::Active,
            Some(5) => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }

    /// Whether the port can carry traffic.
    pub fn is_active(self) -> bool {
        self == PortState::Active
    }
}

/// A port's link layer (`ports/<n>/link_layer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// Ethernet: RoCE, addressed by GID.
    Ethernet,
    /// Something else (or unreadable), as text.
    Other(String),
}

impl LinkLayer {
    pub(super) fn parse(text: &str) -> LinkLayer {
        match text.trim() {
            "InfiniBand" => LinkLayer::InfiniBand,
            "Ethernet" => LinkLayer::Ethernet,
            other => LinkLayer::Other(other.to_string()),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Other(s) => write!(f, "{s:?}"),
        }
    }
}

/// A GID entry's type (`ports/<n>/gid_attrs/types/<i>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidType {
    /// `"IB/RoCE v1"`.
    IbRoceV1,
    /// `"RoCE v2"`: routable, UDP/IP encapsulated.
    RoceV2,
    /// Something else, as text.
    Other(String),
}

impl GidType {
    pub(super) fn parse(text: &str) -> GidType {
        match text.trim() {
            "IB/RoCE v1" => GidType::IbRoceV1,
            "RoCE v2" => GidType::RoceV2,
            other => GidType::Other(other.to_string()),
        }
    }
}

/// One readable, non-zero entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID index.
    pub index: u32,
    /// The 16 bytes, network order.
    pub gid: [u8; 16],
    /// The type; `None` when `gid_attrs/types/<i>` is absent or unreadable
    /// (InfiniBand ports and old kernels).
    pub gid_type: Option<GidType>,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped address, `::ffff:a.b.c.d`.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    /// Whether the GID is an IPv6 link-local address, `fe80::/10`.
    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && (self.gid[1] & 0xc0) == 0x80
    }
}

/// Parses sysfs' GID text, eight colon-separated groups of four hex digits.
/// Returns `None` for anything else.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut groups = 0;
    for (i, g) in text.trim().split(':').enumerate() {
        if i >= 8 || g.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        groups += 1;
    }
    (groups == 8).then_some(out)
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The port number (1-based).
    pub number: u8,
    /// The logical state.
    pub state: PortState,
    /// The state as sysfs gives it (`"4: ACTIVE"`), or `"unreadable"`.
    pub state_text: String,
    /// The physical state (`"5: LinkUp"`), if readable.
    pub phys_state: Option<String>,
    /// The link layer.
    pub link_layer: LinkLayer,
    /// The rate (`"200 Gb/sec (4X HDR)"`), if readable.
    pub rate: Option<String>,
    /// The LID (InfiniBand), if readable.
    pub lid: Option<u16>,
    /// The readable, non-zero GID entries, by index.
    pub gids: Vec<GidEntry>,
}

impl Port {
    /// The GID index to use for RoCE v2: among the entries whose type is
    /// RoCE v2, an IPv4-mapped one first (as NCCL does by default), then a
    /// global IPv6 one, then a link-local one; the lowest index within each.
    /// `None` when the table has no RoCE v2 entry.
    pub fn roce_v2_gid_index(&self) -> Option<u32> {
        let rank = |g: &GidEntry| {
            if g.is_ipv4_mapped() {
                0
            } else if !g.is_link_local() {
                1
            } else {
                2
            }
        };
        self.gids
            .iter()
            .filter(|g| g.gid_type == Some(GidType::RoceV2))
            .min_by_key(|g| (rank(g), g.index))
            .map(|g| g.index)
    }
}
