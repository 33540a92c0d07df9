//! The test kernel `pipe_by_launch` (`doorbell_test_kernels::pipeline`) on
//! one rank: its family, rings, output and stream, launched over P2P and
//! checked against the values the previous rank sends.

use doorbell::comm::{Communicator, RingShape, Rings};
use doorbell::kernels::transport::P2p;
use doorbell::{DeviceBuffer, Family, LaunchConfig, Module, Stream};
use doorbell_test_kernels::pipeline::{pipe_by_launch, ring_pattern};

/// `pipe_by_launch` set up on one rank: `elems` values a launch, through
/// rings of 2 stages of `chunk` elements and `pairs` block pairs.
pub struct PipeByLaunch<'c> {
    pub family: Family<pipe_by_launch>,
    pub rings: Rings<'c, u32>,
    pub out: DeviceBuffer<u32>,
    pub stream: Stream,
    pub cfg: LaunchConfig,
    /// The P2P handle, taken last (after a `trace_start`, it carries the
    /// trace word).
    pub t: P2p,
    out_ptr: *mut u32,
    elems: u64,
}

impl<'c> PipeByLaunch<'c> {
    /// The family from `module`, the rings (collective: every rank calls
    /// it), a zeroed output, a stream, the launch shape (`rings.blocks()`
    /// blocks of 128 threads on a GPU, 32 on the emulator) and the P2P handle.
    pub fn new(comm: &'c Communicator, module: &Module, chunk: u64, pairs: u32, elems: u64) -> doorbell::Result<Self> {
        let d = comm.device();
        let family = module.family::<pipe_by_launch>()?;
        let rings = comm.rings::<u32>(RingShape { stages: 2, chunk, pairs })?;
        let mut out = d.alloc_zeroed::<u32>(elems as usize)?;
        let stream = d.new_stream()?;
        let cfg = LaunchConfig::linear(rings.blocks(), if d.is_gpu() { 128 } else { 32 });
        let (t, out_ptr) = (comm.p2p()?, out.as_mut_ptr());
        Ok(PipeByLaunch {
            family,
            rings,
            out,
            stream,
            cfg,
            t,
            out_ptr,
            elems,
        })
    }

    /// Launches the kernel once on the stream (no barrier, no wait).
    pub fn launch(&self) -> doorbell::Result<()> {
        // SAFETY: the rings and `out` (`elems`) are this communicator's.
        unsafe {
            self.stream
                .launch_family(&self.family, self.cfg, self.t, (self.rings.pipe()?, self.out_ptr, self.elems))
        }
    }

    /// How many values of `out` differ from what the previous rank sent in
    /// launch `launch` (counting from 0).
    pub fn wrong_values(&self, comm: &Communicator, launch: u64) -> doorbell::Result<usize> {
        let world = comm.world_size() as u64;
        let prev = (comm.rank() as u64 + world - 1) % world;
        let got = self.out.to_host()?;
        let tag = launch * 1_000_000 + prev;
        Ok((0..self.elems).filter(|&i| got[i as usize] != ring_pattern(tag, i)).count())
    }
}
