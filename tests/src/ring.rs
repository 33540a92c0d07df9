//! The ring exchange of the test kernels (`doorbell_test_kernels::testing::ring`)
//! from the host: every rank puts its pattern to the next rank, signals it,
//! and gets the previous rank's pattern back, over any transport; then what
//! arrived is checked byte for byte, and nothing outside the ranges.

use doorbell::comm::{Communicator, SymBuffer};
use doorbell::kernels::transport::{Ibgda, P2p, Proxy, Routed};
use doorbell::{DeviceBuffer, LaunchConfig};
use doorbell_test_kernels::testing::{ring_ibgda, ring_p2p, ring_proxy, ring_routed, STATUS_OK};

use crate::TEST_KERNELS;

/// Rank `rank`'s pattern of `n` bytes (differs per rank and per byte).
pub fn pattern(rank: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u8)
                .wrapping_mul(13)
                .wrapping_add((rank as u8).wrapping_mul(41).wrapping_add(1))
        })
        .collect()
}

/// The arguments of the test kernel `ring`
/// (`doorbell_test_kernels::testing::ring`).
pub type RingArgs<T> = (T, *mut u8, *mut u8, *mut u8, u64, u64, *mut u64, u64, u32, *mut u32);

/// `ring`'s arguments for one round by the whole block, with `bufs` =
/// `(src, dst, got)`: this rank puts `bytes` of `src` to the next rank's
/// `dst` (offset 0) and adds 1 to its `sig`, waits for its own `sig` to
/// reach 1, then gets the previous rank's `src` into `got`; the outcome
/// goes to `status`.
pub fn ring_round<T>(t: T, bufs: (*mut u8, *mut u8, *mut u8), bytes: u64, sig: *mut u64, status: *mut u32) -> RingArgs<T> {
    let (src, dst, got) = bufs;
    (t, src, dst, got, bytes, 0, sig, 1, 0, status)
}

/// The transport a ring runs over (the kernel is chosen by it).
pub enum RingTransport {
    /// Load/store.
    P2p(P2p),
    /// The NIC for every peer.
    Ibgda(Ibgda),
    /// Load/store where it reaches, the NIC for the rest.
    Routed(Routed),
    /// A host thread of each rank posts the WQEs (the CPU proxy).
    Proxy(Proxy),
}

/// The ring kernels' buffers on one rank: `src` holds this rank's
/// pattern; `dst` and `got` one byte more than `offset + bytes`, so a
/// write past the range shows.
pub struct RingBufs<'c> {
    /// This rank's pattern.
    pub src: SymBuffer<'c, u8>,
    /// Where the previous rank's put lands.
    pub dst: SymBuffer<'c, u8>,
    /// Where this rank's get of the previous rank's `src` lands.
    pub got: SymBuffer<'c, u8>,
    /// The signal word the previous rank adds 1 to.
    pub sig: SymBuffer<'c, u64>,
    /// The kernel's status word (`STATUS_OK` when every call succeeded).
    pub status: DeviceBuffer<u32>,
}

impl<'c> RingBufs<'c> {
    /// Allocates (collective) and fills `src`.
    pub fn new(comm: &'c Communicator, bytes: usize, offset: usize) -> doorbell::Result<Self> {
        let b = RingBufs {
            src: comm.alloc::<u8>(bytes.max(1))?,
            dst: comm.alloc::<u8>(bytes + offset + 1)?,
            got: comm.alloc::<u8>(bytes + offset + 1)?,
            sig: comm.alloc::<u64>(1)?,
            status: comm.device().alloc_zeroed::<u32>(1)?,
        };
        b.src.copy_from_host(&pattern(comm.rank(), bytes.max(1)))?;
        Ok(b)
    }

    /// Checks the ring once its kernel has finished: every call succeeded,
    /// the previous rank's `bytes` arrived at `offset` by put (`dst`) and
    /// by get (`got`), nothing was written outside, the signal came once.
    pub fn check(&self, comm: &Communicator, bytes: usize, offset: usize) -> doorbell::Result<()> {
        assert_eq!(self.status.to_host()?[0], STATUS_OK, "rank {}", comm.rank());
        let prev = (comm.rank() + comm.world_size() - 1) % comm.world_size();
        let want = pattern(prev, bytes.max(1));
        for (v, call) in [(self.dst.to_host()?, "put"), (self.got.to_host()?, "get")] {
            let first_bad = v[offset..offset + bytes].iter().zip(&want[..bytes]).position(|(a, b)| a != b);
            assert_eq!(
                first_bad,
                None,
                "{call}: rank {} from {prev}, {bytes} B at +{offset}: first differing byte",
                comm.rank()
            );
            assert!(
                v[..offset].iter().all(|&b| b == 0) && v[offset + bytes] == 0,
                "{call} wrote outside its range"
            );
        }
        assert_eq!(self.sig.to_host()?, vec![1]);
        Ok(())
    }
}

/// One ring of `bytes` at `offset` on every rank of `comm` (collective),
/// by block or by warp (`use_warp`), in one block of `threads`: the
/// buffers are allocated first, then `transport` makes the handle (an
/// IBGDA set-up after the allocations, so none waits behind the soft NIC's
/// engine), then the kernel runs and what arrived is checked.
pub fn ring_once(
    comm: &Communicator,
    bytes: usize,
    offset: usize,
    use_warp: bool,
    threads: u32,
    transport: impl FnOnce(&Communicator) -> doorbell::Result<RingTransport>,
) -> doorbell::Result<()> {
    let dev = comm.device();
    let m = dev.load_module(&TEST_KERNELS)?;
    let mut b = RingBufs::new(comm, bytes, offset)?;
    let t = transport(comm)?;
    comm.barrier()?;
    let s = dev.new_stream()?;
    let (a, d, c) = (b.src.as_mut_ptr(), b.dst.as_mut_ptr(), b.got.as_mut_ptr());
    let (n, o, g, w, st) = (
        bytes as u64,
        offset as u64,
        b.sig.as_mut_ptr(),
        use_warp as u32,
        b.status.as_mut_ptr(),
    );
    let cfg = LaunchConfig::linear(1, threads);
    let over = match t {
        RingTransport::P2p(_) => None,
        RingTransport::Proxy(_) => Some(true),
        _ => Some(false),
    };
    // SAFETY: sizes as the ring kernel documents: `bytes` from `src`,
    // `offset + bytes` into `dst` and `got` (one byte to spare), one signal
    // word, one status word.
    unsafe {
        match t {
            RingTransport::P2p(t) => s.launch(&m.function::<ring_p2p>()?, cfg, (t, a, d, c, n, o, g, 1u64, w, st))?,
            RingTransport::Ibgda(t) => s.launch(&m.function::<ring_ibgda>()?, cfg, (t, a, d, c, n, o, g, 1u64, w, st))?,
            RingTransport::Routed(t) => s.launch(&m.function::<ring_routed>()?, cfg, (t, a, d, c, n, o, g, 1u64, w, st))?,
            RingTransport::Proxy(t) => s.launch(&m.function::<ring_proxy>()?, cfg, (t, a, d, c, n, o, g, 1u64, w, st))?,
        }
    };
    comm.synchronize(&s)?;
    match over {
        Some(true) => comm.proxy_check()?,
        Some(false) => comm.ibgda_check()?,
        None => {}
    }
    b.check(comm, bytes, offset)
}
