//! The `wqe_dump` example: its parser and formatter (in
//! `doorbell_kernels::mlx5::dump`), and the built binary's output and exit
//! codes when it exists (`cargo build --release --example wqe_dump`).

use doorbell_kernels::mlx5::dump::{dump, format_hex, parse_args, parse_number};
use doorbell_kernels::mlx5::wqe::{FLAG_FENCE, FLAG_SIGNALED, FLAG_SOLICITED};
use doorbell_kernels::mlx5::{WqeOp, WqeRequest};
use std::path::PathBuf;
use std::process::Command;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[test]
fn parses_every_op_and_option() {
    let r = parse_args(&args(
        "write --index 0x10 --qpn 0xabc --raddr 0x1000 --rkey 7 --laddr 0x2000 --lkey 9 --len 64 --signaled",
    ))
    .unwrap();
    assert_eq!(
        r,
        WqeRequest {
            op: WqeOp::Write as u32,
            wqe_index: 16,
            qpn: 0xabc,
            raddr: 0x1000,
            rkey: 7,
            laddr: 0x2000,
            lkey: 9,
            len: 64,
            flags: FLAG_SIGNALED,
            ..Default::default()
        }
    );
    let r = parse_args(&args("cas --compare 1 --swap=2 --fence --solicited")).unwrap();
    assert_eq!(
        (r.op(), r.compare, r.swap, r.flags),
        (Some(WqeOp::CompareSwap), 1, 2, FLAG_FENCE | FLAG_SOLICITED)
    );
    assert_eq!(parse_args(&args("fetch-add --add 0xffffffffffffffff")).unwrap().add, u64::MAX);
    assert_eq!(parse_args(&args("write-imm --imm 0xdeadbeef")).unwrap().imm, 0xdead_beef);
    assert_eq!(parse_args(&args("nop --index 65535 --qpn 0xffffff")).unwrap().wqe_index, 65535);
    assert_eq!(parse_number("1_000"), Some(1000));
    assert_eq!(parse_number("0x"), None);
    assert_eq!(parse_number("-1"), None);
}

#[test]
fn rejects_bad_input_with_a_clear_message() {
    for (cmd, needle) in [
        ("", "missing OP"),
        ("send", "unknown OP `send`"),
        ("write --bogus 1", "unknown option --bogus"),
        ("write --index 70000", "--index 70000 is out of range"),
        ("write --qpn 0x1000000", "--qpn 0x1000000 is out of range"),
        ("write --rkey 0x100000000", "out of range"),
        ("write --len", "--len needs a value"),
        ("write --len ten", "is not a number"),
        ("write --imm 5", "--imm means nothing for `write`"),
        ("nop --raddr 5", "--raddr means nothing for `nop`"),
        ("read --add 1", "--add means nothing for `read`"),
        ("fetch-add --swap 1", "--swap means nothing for `fetch-add`"),
        ("cas --len 8", "--len means nothing for `cas`"),
        ("write --len 1 --len 2", "given twice"),
        ("write --signaled=1", "takes no value"),
        ("write extra", "unexpected argument `extra`"),
    ] {
        let e = parse_args(&args(cmd)).unwrap_err();
        assert!(e.contains(needle), "`{cmd}`: {e}");
    }
}

#[test]
fn prints_one_16_byte_unit_per_line_in_lowercase_hex() {
    let r = parse_args(&args("write-imm --index 0x1234 --qpn 0xabcdef --raddr 0x1122334455667788 --rkey 0xaabbccdd --laddr 0x99 --lkey 0x42 --len 0x100 --imm 0xcafef00d --signaled --fence")).unwrap();
    assert_eq!(
        dump(&r),
        "00123409abcdef030000008 8cafef00d\n1122334455667788aabbccdd00000000\n0000010000000042 0000000000000099\n".replace(' ', "")
    );
    let atomic = dump(&parse_args(&args("fetch-add --add 1 --laddr 0x10 --lkey 3")).unwrap());
    assert_eq!(atomic.lines().count(), 4);
    assert_eq!(atomic.lines().nth(3).unwrap(), "00000008000000030000000000000010");
    assert_eq!(dump(&parse_args(&args("nop")).unwrap()), "00000000000000010000000000000000\n");
    assert_eq!(format_hex(&[0xAB; 20]), format!("{}\n{}\n", "ab".repeat(16), "ab".repeat(4)));
}

/// The example binary next to this test binary (target/<profile>/examples).
fn example_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let p = profile_dir.join("examples").join("wqe_dump");
    p.exists().then_some(p)
}

#[test]
fn the_built_example_prints_wqes_and_rejects_bad_input() {
    let Some(bin) = example_binary() else {
        eprintln!("wqe_dump not built in this profile (cargo build --release --example wqe_dump): skipping the binary check");
        return;
    };
    let out = Command::new(&bin)
        .args(args(
            "read --index 3 --qpn 0x10 --raddr 0x40 --rkey 1 --laddr 0x80 --lkey 2 --len 64",
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout,
        "00000310000010030000000000000000\n0000000000000040000000010000000 0\n00000040000000020000000000000080\n".replace(' ', "")
    );
    for bad in [
        "write --index 70000",
        "write --qpn 0x1000000",
        "frob",
        "write --lkey",
        "write --imm 1",
        "write --nope 1",
    ] {
        let out = Command::new(&bin).args(args(bad)).output().unwrap();
        assert!(!out.status.success(), "`{bad}` succeeded");
        assert!(out.stdout.is_empty(), "`{bad}` printed to stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: "), "`{bad}`: {err}");
    }
}
