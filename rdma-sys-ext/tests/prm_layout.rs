//! Checks `rdma_sys_ext::prm` against the kernel's `mlx5_ifc.h`: every
//! field the command builders write (offset and width, bit for bit), the
//! output fields read back, the mailbox sizes and the opcodes.
//!
//! The header ships in Debian's `linux-headers-<version>-common`
//! (`scripts/setup.sh` installs one). Without it this test fails: it never
//! passes without having compared anything.

use std::collections::HashMap;
use std::path::PathBuf;

use rdma_sys_ext::prm::{self, Command, Mailbox, RemoteAccess, RemoteAddress};

/// One member of a PRM struct: its name, and either a width in bits
/// (`u8 name[w]`, arrays multiplied out) or a nested struct/union type.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    ty: Option<String>,
    bits: u64,
}

#[derive(Debug, Clone)]
struct Layout {
    union: bool,
    members: Vec<Member>,
}

fn find_header() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("include/linux/mlx5/mlx5_ifc.h"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    match found.pop() {
        Some(p) => p,
        None => panic!(
            "mlx5_ifc.h not found under /usr/src/linux-headers-*/include/linux/mlx5/: \
             run scripts/setup.sh (it installs a linux-headers-*-common package)"
        ),
    }
}

fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        match rest[i + 2..].find("*/") {
            Some(j) => rest = &rest[i + 2 + j + 2..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// The index of the `}` matching the `{` at `open`.
fn matching_brace(s: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, b) in s.bytes().enumerate().skip(open) {
        if b == b'{' {
            depth += 1;
        } else if b == b'}' {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    panic!("unbalanced braces in mlx5_ifc.h");
}

/// The members of a struct body; anonymous `union { ... };` and
/// `struct { ... };` blocks become members of a synthetic type named
/// `<parent>.anonN` (with an empty name when the block has none).
fn parse_body(body: &str, name: &str, map: &mut HashMap<String, Layout>) -> Vec<Member> {
    let mut members = Vec::new();
    let mut rest = body.trim_start();
    let mut anon = 0;
    while !rest.is_empty() {
        let agg = ["union {", "union{", "struct {", "struct{"].iter().find(|k| rest.starts_with(**k));
        if let Some(k) = agg {
            let open = rest.find('{').expect("brace");
            let close = matching_brace(rest, open);
            let ty = format!("{name}.anon{anon}");
            anon += 1;
            let inner = parse_body(&rest[open + 1..close], &ty, map);
            map.insert(
                ty.clone(),
                Layout {
                    union: k.starts_with("union"),
                    members: inner,
                },
            );
            let semi = rest[close..].find(';').expect("`;` after a block") + close;
            members.push(Member {
                name: rest[close + 1..semi].trim().to_string(),
                ty: Some(ty),
                bits: 0,
            });
            rest = rest[semi + 1..].trim_start();
            continue;
        }
        let Some(semi) = rest.find(';') else {
            assert!(rest.trim().is_empty(), "{name}: trailing `{rest}`");
            break;
        };
        let stmt = rest[..semi].split_whitespace().collect::<Vec<_>>().join(" ");
        rest = rest[semi + 1..].trim_start();
        if stmt.is_empty() {
            continue;
        }
        members.push(parse_member(name, &stmt));
    }
    members
}

fn parse_member(name: &str, stmt: &str) -> Member {
    let words: Vec<&str> = stmt.splitn(3, ' ').collect();
    if let Some(args) = stmt.strip_prefix("DECLARE_FLEX_ARRAY(") {
        // A flexible array: no bits of the fixed layout.
        let n = args.trim_end_matches(')').rsplit(',').next().unwrap_or("").trim();
        Member {
            name: n.to_string(),
            ty: None,
            bits: 0,
        }
    } else if (words[0] == "struct" || words[0] == "union") && words.len() == 3 {
        let ty = words[1].trim_start_matches("mlx5_ifc_").trim_end_matches("_bits");
        Member {
            name: words[2].trim().to_string(),
            ty: Some(ty.to_string()),
            bits: 0,
        }
    } else if words[0] == "u8" {
        let decl = stmt[3..].replace(' ', "");
        let b = decl.find('[').unwrap_or_else(|| panic!("{name}: cannot parse `{stmt}`"));
        let mut bits = 1u64;
        for dim in decl[b..].split('[').skip(1) {
            let d = dim.trim_end_matches(']');
            bits *= if d.is_empty() {
                0
            } else {
                parse_number(d).unwrap_or_else(|| panic!("{name}: `{stmt}`"))
            };
        }
        Member {
            name: decl[..b].to_string(),
            ty: None,
            bits,
        }
    } else {
        panic!("{name}: cannot parse `{stmt}`");
    }
}

/// `struct|union mlx5_ifc_<name>_bits { ... };` → name → members.
fn parse_structs(src: &str) -> HashMap<String, Layout> {
    let mut map = HashMap::new();
    let bytes = src.as_bytes();
    let mut pos = 0;
    while pos < src.len() {
        let next = ["struct mlx5_ifc_", "union mlx5_ifc_"]
            .iter()
            .filter_map(|k| src[pos..].find(k).map(|i| (pos + i, k.starts_with("union"), k.len())))
            .min();
        let Some((start, union, klen)) = next else { break };
        let name_start = start + klen;
        let after: &str = &src[name_start..];
        let name_end = after.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(0);
        let ident = &after[..name_end];
        let tail = after[name_end..].trim_start();
        pos = name_start + name_end;
        let Some(name) = ident.strip_suffix("_bits") else { continue };
        if !tail.starts_with('{') {
            continue; // a use, not a definition
        }
        let open = pos + after[name_end..].find('{').expect("brace");
        let mut depth = 0;
        let mut end = open;
        for (i, &b) in bytes.iter().enumerate().skip(open) {
            if b == b'{' {
                depth += 1;
            } else if b == b'}' {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
        }
        let body = &src[open + 1..end];
        let members = parse_body(body, name, &mut map);
        map.insert(name.to_string(), Layout { union, members });
        pos = end;
    }
    map
}

struct Ifc {
    structs: HashMap<String, Layout>,
}

impl Ifc {
    fn size(&self, name: &str) -> u64 {
        let l = self.structs.get(name).unwrap_or_else(|| panic!("struct {name} not in mlx5_ifc.h"));
        let sizes = l.members.iter().map(|m| self.member_bits(m));
        if l.union {
            sizes.max().unwrap_or(0)
        } else {
            sizes.sum()
        }
    }

    fn member_bits(&self, m: &Member) -> u64 {
        match &m.ty {
            Some(t) => self.size(t),
            None => m.bits,
        }
    }

    /// (offset, width, type) of `member` inside struct `name`.
    fn member(&self, name: &str, member: &str) -> Option<(u64, u64, Option<String>)> {
        let l = self.structs.get(name)?;
        let mut off = 0;
        for m in &l.members {
            let w = self.member_bits(m);
            if m.name == member {
                return Some((off, w, m.ty.clone()));
            }
            if m.name.is_empty() {
                if let Some((o, w, t)) = m.ty.as_deref().and_then(|t| self.member(t, member)) {
                    return Some((off + o, w, t));
                }
            }
            if !l.union {
                off += w;
            }
        }
        None
    }

    /// Resolves `create_qp_in.qpc.log_sq_size` → (bit offset, width).
    fn resolve(&self, path: &str) -> Result<(u64, u64), String> {
        let mut parts = path.split('.');
        let mut cur = parts.next().unwrap().to_string();
        let mut off = 0;
        let mut width = self.size(&cur);
        for p in parts {
            let (o, w, ty) = self.member(&cur, p).ok_or_else(|| format!("{path}: no member `{p}` in {cur}"))?;
            off += o;
            width = w;
            match ty {
                Some(t) => cur = t,
                None => cur = String::new(),
            }
        }
        Ok((off, width))
    }

    /// For a DevX-only field: the containing struct's path must have a
    /// `reserved_*` member covering `[off, off + bits)` (relative to the
    /// mailbox start).
    fn reserved_covers(&self, path: &str, off: u64, bits: u64) -> Result<(), String> {
        let (parent, _) = path.rsplit_once('.').expect("dotted path");
        let (poff, _) = self.resolve(parent)?;
        let mut cur = parent.split('.').next().unwrap().to_string();
        for p in parent.split('.').skip(1) {
            cur = self
                .member(&cur, p)
                .and_then(|m| m.2)
                .ok_or_else(|| format!("{parent}: {p} is not a struct"))?;
        }
        let l = &self.structs[&cur];
        let mut o = poff;
        for m in &l.members {
            let w = self.member_bits(m);
            if o <= off && off + bits <= o + w {
                return if m.name.starts_with("reserved") {
                    Ok(())
                } else {
                    Err(format!("{path} at {off:#x}+{bits} overlaps named field {cur}.{}", m.name))
                };
            }
            o += w;
        }
        Err(format!("{path} at {off:#x}+{bits}: no single member of {cur} covers it"))
    }
}

fn opcodes(src: &str) -> HashMap<String, u64> {
    let mut m = HashMap::new();
    for line in src.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("MLX5_CMD_OP_") {
            if let Some((name, val)) = rest.split_once('=') {
                if let Some(v) = parse_number(val.trim().trim_end_matches(',')) {
                    m.insert(name.trim().to_string(), v);
                }
            }
        }
    }
    m
}

/// Every command, built every way the builders can build it.
fn all_mailboxes() -> Vec<Mailbox> {
    let cq = prm::create_cq(&prm::CqParams {
        log_cq_size: 10,
        uar_page: 0x12345,
        eqn: 7,
        cq_umem_id: 3,
        cq_umem_offset: 0x40,
        dbr_umem_id: 4,
        dbr_offset: 8,
    })
    .unwrap();
    let qp = |rq: Option<u8>| {
        prm::create_qp(&prm::QpParams {
            pd: 0x11,
            uar_page: 0x12345,
            log_sq_size: 8,
            log_rq_size: rq,
            log_rq_stride: 2,
            cqn: 0x99,
            wq_umem_id: 5,
            wq_umem_offset: 0,
            dbr_umem_id: 6,
            dbr_offset: 0,
            log_msg_max: 30,
        })
        .unwrap()
    };
    let access = RemoteAccess {
        read: true,
        write: true,
        atomic: true,
    };
    let rtr = |remote| {
        prm::init2rtr(&prm::RtrParams {
            qpn: 0x100,
            port: 1,
            mtu: 4096,
            remote_qpn: 0x200,
            next_rcv_psn: 0xabcdef,
            max_rd_atomic: 16,
            min_rnr_nak: 12,
            sl: 2,
            remote,
            log_msg_max: 30,
        })
        .unwrap()
    };
    vec![
        cq,
        qp(None),
        qp(Some(6)),
        prm::rst2init(0x100, 1, access).unwrap(),
        rtr(RemoteAddress::Ib { lid: 0x1234 }),
        rtr(RemoteAddress::Roce {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            sgid_index: 3,
            hop_limit: 64,
            tclass: 106,
            rmac: [2, 0, 0, 0, 0, 1],
            udp_sport: 0xc123,
        }),
        prm::rtr2rts(&prm::RtsParams {
            qpn: 0x100,
            next_send_psn: 0x123456,
            retry_count: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ack_timeout: 18,
        })
        .unwrap(),
        prm::to_err(0x100).unwrap(),
        prm::to_rst(0x100).unwrap(),
    ]
}

#[test]
fn builders_match_mlx5_ifc() {
    let path = find_header();
    let src = strip_comments(&std::fs::read_to_string(&path).expect("read mlx5_ifc.h"));
    let ifc = Ifc {
        structs: parse_structs(&src),
    };
    assert!(
        ifc.structs.len() > 200,
        "parsed only {} structs from {}",
        ifc.structs.len(),
        path.display()
    );
    // The parser itself: two well-known facts of the PRM.
    assert_eq!(ifc.size("qpc"), 0x740);
    assert_eq!(ifc.size("ads"), 0x160);

    let mut checked = 0;
    let mut devx_only = 0;
    let mut errors = Vec::new();
    let mut commands_seen = Vec::new();
    for m in all_mailboxes() {
        let cmd = m.command();
        commands_seen.push(cmd);
        assert!(!m.written().is_empty());
        for w in m.written() {
            if w.devx_only {
                devx_only += 1;
                if let Err(e) = ifc.reserved_covers(&w.path, u64::from(w.off), u64::from(w.bits)) {
                    errors.push(e);
                }
                continue;
            }
            match ifc.resolve(&w.path) {
                Ok((off, bits)) => {
                    if (off, bits) != (u64::from(w.off), u64::from(w.bits)) {
                        errors.push(format!(
                            "{}: prm writes bit {:#x} width {}, mlx5_ifc.h has bit {off:#x} width {bits}",
                            w.path, w.off, w.bits
                        ));
                    }
                    checked += 1;
                }
                Err(e) => errors.push(e),
            }
        }
        // The bytes agree with the log: the opcode is where the header says.
        let (ooff, obits) = ifc.resolve(&format!("{}_in.opcode", cmd.ifc_struct())).unwrap();
        assert_eq!((ooff, obits), (0, 16));
        assert_eq!(u16::from_be_bytes([m.bytes()[0], m.bytes()[1]]), cmd.opcode());
    }
    assert!(
        errors.is_empty(),
        "layout mismatches against {}:\n{}",
        path.display(),
        errors.join("\n")
    );
    assert!(checked > 60, "only {checked} fields checked");
    assert_eq!(
        devx_only, 5,
        "DevX-only writes: cq_umem_offset, cq_umem_id, cqc.dbr_umem_id, qpc.dbr_umem_id twice"
    );

    for cmd in Command::ALL {
        assert!(commands_seen.contains(&cmd), "{} not built", cmd.name());
        let base = cmd.ifc_struct();
        assert_eq!(ifc.size(&format!("{base}_in")), cmd.in_len() as u64 * 8, "{base}_in size");
        assert_eq!(ifc.size(&format!("{base}_out")), cmd.out_len() as u64 * 8, "{base}_out size");
        let out = format!("{base}_out");
        assert_eq!(ifc.resolve(&format!("{out}.status")).unwrap(), (0, 8));
        assert_eq!(ifc.resolve(&format!("{out}.syndrome")).unwrap(), (0x20, 32));
    }
    let n = prm::hdr::OBJ_NUMBER;
    assert_eq!(ifc.resolve("create_cq_out.cqn").unwrap(), (u64::from(n.off), u64::from(n.bits)));
    assert_eq!(ifc.resolve("create_qp_out.qpn").unwrap(), (u64::from(n.off), u64::from(n.bits)));
    for (scope, name) in [
        (prm::CREATE_CQ_CQC, "create_cq_in.cq_context"),
        (prm::CREATE_QP_QPC, "create_qp_in.qpc"),
    ] {
        assert_eq!(ifc.resolve(name).unwrap().0, u64::from(scope.off), "{name}");
    }

    let ops = opcodes(&src);
    for cmd in Command::ALL {
        let want = ops
            .get(cmd.name())
            .unwrap_or_else(|| panic!("MLX5_CMD_OP_{} not in mlx5_ifc.h", cmd.name()));
        assert_eq!(u64::from(cmd.opcode()), *want, "MLX5_CMD_OP_{}", cmd.name());
        assert_eq!(prm::opcode_name(cmd.opcode()), cmd.name());
    }
}
