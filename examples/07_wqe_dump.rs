//! wqe_dump — prints the mlx5 WQE the host encoder builds for one work
//! request, one 16-byte unit per line in lowercase hex, nothing else on stdout.
//!
//! ```text
//! cargo run --release --example wqe_dump -- --help
//! cargo run --release --example wqe_dump -- OP [options]
//!   OP: nop | write | write-imm | read | fetch-add | cas
//!   --index N (16 bit) --qpn N (24 bit) --raddr N --rkey N --laddr N --lkey N
//!   --len N --imm N (as the receiver reads it) --add N --compare N --swap N
//!   --signaled --fence --solicited          N: decimal or 0x hex
//! ```
//! Lines: the ctrl segment; then raddr and data (write, write-imm, read), or
//! raddr, atomic and the 8-byte data segment (fetch-add, cas). Bad input
//! prints an error on stderr and exits with status 2.

use clap::Parser;
use doorbell_examples::cli::WqeDumpArgs;
use doorbell_examples::die;
use doorbell_kernels::mlx5::dump;

fn main() {
    let args = WqeDumpArgs::parse();
    match args.request() {
        Ok(req) => print!("{}", dump::dump(&req)),
        Err(e) => die(e),
    }
}
