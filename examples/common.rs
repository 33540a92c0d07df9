//! Pieces shared by the examples: their command lines (`cli`, clap), the
//! benchmark plots (`plot`, plotters), error reporting and small helpers.
//! Everything an example parses or validates lives here, so it is tested as
//! plain functions (`tests/tests/examples_cli.rs`).

pub mod cli;
pub mod embedding;
pub mod nccl;
pub mod pairs;
pub mod plot;
pub mod timeline;

pub use clap;

/// PTX of the user kernel crate (`examples/user-kernels`), built by this
/// package's `build.rs` with `doorbell::build::PtxBuilder`.
pub const USER_KERNELS_PTX: &str = USER_KERNELS.ptx;
/// [`USER_KERNELS_PTX`] with its cubin where the build found a `ptxas`
/// (`doorbell::ModuleImage`): what the examples load.
pub const USER_KERNELS: doorbell::ModuleImage = doorbell::module_image!("doorbell_example_kernels");

/// An example's error: printed as `error: ...` on stderr, exit status 1.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs an example's body after setting up logging (`DOORBELL_LOG`) and
/// checking every `DOORBELL_*` variable (a bad one: exit status 2, like a
/// bad flag), and exits with the message (never a backtrace) when the body
/// fails: status 2 when it asked for a NIC this machine cannot use
/// (`DOORBELL_NIC=mlx5` without one) or a variable only the world can
/// check is wrong for it (`DOORBELL_NODES` that does not divide the
/// ranks), else 1.
pub fn main_with(body: impl FnOnce() -> Result<(), BoxError>) {
    if let Err(e) = doorbell::init_logging().and_then(|()| doorbell::env::check()) {
        die(e);
    }
    if let Err(e) = body() {
        eprintln!("error: {e}");
        // Both are bad input, as a bad flag is.
        let bad_input = matches!(
            e.downcast_ref::<doorbell::Error>(),
            Some(doorbell::Error::NicUnavailable { .. } | doorbell::Error::BadEnv { .. })
        );
        std::process::exit(if bad_input { 2 } else { 1 });
    }
}

/// Exits with `msg` on stderr and status 2 (bad input).
pub fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

/// `n` elements made by `f`, or an error (not an abort) when the host
/// cannot hold them.
pub fn host_vec<T>(n: u64, f: impl FnMut(u64) -> T) -> Result<Vec<T>, String> {
    let len = usize::try_from(n).map_err(|_| format!("{n} elements do not fit this host's address space"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        format!(
            "could not allocate {n} elements of {} bytes in host memory; ask for less",
            std::mem::size_of::<T>()
        )
    })?;
    v.extend((0..n).map(f));
    Ok(v)
}

/// `a / b`, or `None` when it means nothing (`b` is zero or either is not finite).
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

/// FNV-1a over bytes: a short fingerprint to compare outputs across runs.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Every rank's part of an all-gather read as exactly `count` little-endian
/// values of `N` bytes each (`decode` makes one): a part of another length
/// (a peer built from other code, or a malformed one) is an error naming
/// the rank and `what`, never a slice out of bounds.
pub fn gathered<const N: usize, T>(
    all: &[Vec<u8>],
    count: usize,
    what: &str,
    decode: impl Fn([u8; N]) -> T,
) -> doorbell::Result<Vec<Vec<T>>> {
    all.iter()
        .enumerate()
        .map(|(r, b)| {
            if count.checked_mul(N) != Some(b.len()) {
                return Err(doorbell::Error::Comm(format!(
                    "rank {r} sent {} bytes for {what}, not {count} values of {N} bytes",
                    b.len()
                )));
            }
            Ok(b.chunks_exact(N)
                .map(|c| decode(c.try_into().expect("chunks_exact gives N bytes")))
                .collect())
        })
        .collect()
}

/// The largest of every rank's one `f64` (an all-gather of
/// `x.to_le_bytes()`): e.g. the slowest rank's time. A malformed part is an
/// error naming the rank.
pub fn slowest(all: &[Vec<u8>], what: &str) -> doorbell::Result<f64> {
    Ok(gathered(all, 1, what, f64::from_le_bytes)?.iter().map(|v| v[0]).fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_parts_of_the_wrong_length_are_errors_naming_the_rank() {
        let good = vec![1.5f64.to_le_bytes().to_vec(), 4.0f64.to_le_bytes().to_vec()];
        assert_eq!(slowest(&good, "the time").unwrap(), 4.0);
        for bad in [vec![], vec![0u8; 7], vec![0u8; 9], vec![0u8; 16]] {
            let all = vec![good[0].clone(), bad.clone()];
            let e = slowest(&all, "the time").unwrap_err().to_string();
            assert!(e.contains("rank 1") && e.contains(&format!("{} bytes", bad.len())), "{e}");
        }
        let words: Vec<Vec<u8>> = vec![
            [1u32, 2].iter().flat_map(|w| w.to_le_bytes()).collect(),
            vec![9, 0, 0, 0, 3, 0, 0, 0],
        ];
        assert_eq!(
            gathered(&words, 2, "counts", u32::from_le_bytes).unwrap(),
            vec![vec![1, 2], vec![9, 3]]
        );
        let e = gathered(&words, 3, "counts", u32::from_le_bytes).unwrap_err().to_string();
        assert!(e.contains("rank 0 sent 8 bytes for counts"), "{e}");
        assert!(gathered(&words, usize::MAX, "counts", u32::from_le_bytes).is_err());
    }
}
