//! Host side of the `wqe_dump` example: argument parsing and formatting,
//! here so they are unit-tested.
//!
//! ```text
//! wqe_dump OP [--index N] [--qpn N] [--raddr N] [--rkey N] [--laddr N] [--lkey N]
//!             [--len N] [--imm N] [--add N] [--compare N] [--swap N]
//!             [--signaled] [--fence] [--solicited]
//! ```

use super::wqe::{WqeOp, WqeRequest, FLAG_FENCE, FLAG_SIGNALED, FLAG_SOLICITED};

/// Usage line.
pub const USAGE: &str = "usage: wqe_dump OP [--index N] [--qpn N] [--raddr N] [--rkey N] [--laddr N] [--lkey N] [--len N] \
[--imm N] [--add N] [--compare N] [--swap N] [--signaled] [--fence] [--solicited]\n\
OP: nop | write | write-imm | read | fetch-add | cas; N: decimal or 0x hex";

/// Value options: (name, largest value).
const VALUE_OPTIONS: [(&str, u64); 11] = [
    ("index", u16::MAX as u64),
    ("qpn", 0xff_ffff),
    ("raddr", u64::MAX),
    ("rkey", u32::MAX as u64),
    ("laddr", u64::MAX),
    ("lkey", u32::MAX as u64),
    ("len", u32::MAX as u64),
    ("imm", u32::MAX as u64),
    ("add", u64::MAX),
    ("compare", u64::MAX),
    ("swap", u64::MAX),
];
const FLAG_OPTIONS: [&str; 3] = ["signaled", "fence", "solicited"];

/// The value options that mean something for `op`.
fn applies(op: WqeOp, name: &str) -> bool {
    match name {
        "index" | "qpn" => true,
        "raddr" | "rkey" | "laddr" | "lkey" => op != WqeOp::Nop,
        "len" => matches!(op, WqeOp::Write | WqeOp::WriteImm | WqeOp::Read),
        "imm" => op == WqeOp::WriteImm,
        "add" => op == WqeOp::FetchAdd,
        "compare" | "swap" => op == WqeOp::CompareSwap,
        _ => false,
    }
}

/// The operation named `s`.
pub fn parse_op(s: &str) -> Option<WqeOp> {
    WqeOp::ALL.into_iter().find(|op| op.name() == s)
}

/// Decimal or `0x`/`0X` hex, `_` separators allowed.
pub fn parse_number(s: &str) -> Option<u64> {
    let t = s.replace('_', "");
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if h.is_empty() {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse().ok()
    } else {
        None
    }
}

/// Parses the arguments (without the program name) into a request.
pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<WqeRequest, String> {
    let mut it = args.iter().map(|s| s.as_ref());
    let op_name = it.next().ok_or_else(|| format!("missing OP\n{USAGE}"))?;
    let op = parse_op(op_name)
        .ok_or_else(|| format!("unknown OP `{op_name}`; expected one of nop, write, write-imm, read, fetch-add, cas\n{USAGE}"))?;
    let mut r = WqeRequest {
        op: op as u32,
        ..Default::default()
    };
    let mut seen: Vec<&str> = Vec::new();
    while let Some(arg) = it.next() {
        let Some(opt) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument `{arg}`\n{USAGE}"));
        };
        let (name, inline) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        if seen.contains(&name) {
            return Err(format!("--{name} given twice"));
        }
        if let Some(flag) = FLAG_OPTIONS.iter().find(|f| **f == name) {
            if inline.is_some() {
                return Err(format!("--{name} is a flag and takes no value"));
            }
            r.flags |= match *flag {
                "signaled" => FLAG_SIGNALED,
                "fence" => FLAG_FENCE,
                _ => FLAG_SOLICITED,
            };
            seen.push(name);
            continue;
        }
        let Some(&(_, max)) = VALUE_OPTIONS.iter().find(|(n, _)| *n == name) else {
            return Err(format!("unknown option --{name}\n{USAGE}"));
        };
        if !applies(op, name) {
            return Err(format!("--{name} means nothing for `{}`", op.name()));
        }
        let text = match inline {
            Some(v) => v,
            None => it.next().ok_or_else(|| format!("--{name} needs a value"))?,
        };
        let v = parse_number(text).ok_or_else(|| format!("--{name} {text:?} is not a number (decimal or 0x hex)"))?;
        if v > max {
            return Err(format!("--{name} {text} is out of range (at most {max:#x})"));
        }
        match name {
            "index" => r.wqe_index = v as u16,
            "qpn" => r.qpn = v as u32,
            "raddr" => r.raddr = v,
            "rkey" => r.rkey = v as u32,
            "laddr" => r.laddr = v,
            "lkey" => r.lkey = v as u32,
            "len" => r.len = v as u32,
            "imm" => r.imm = v as u32,
            "add" => r.add = v,
            "compare" => r.compare = v,
            _ => r.swap = v,
        }
        seen.push(name);
    }
    Ok(r)
}

/// Lowercase hex, one 16-byte unit per line (32 characters), `\n` after each.
pub fn format_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2 + bytes.len() / 16 + 1);
    for unit in bytes.chunks(16) {
        for b in unit {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
    }
    s
}

/// What `wqe_dump` prints for `r`: its `ds × 16` bytes, from the host encoder.
pub fn dump(r: &WqeRequest) -> String {
    format_hex(&r.to_bytes()[..r.wqe_len()])
}
