//! 09 — your own fused kernels end to end: a producer that sends each chunk
//! to the next rank the moment it is computed, and an all-gather, both from
//! `examples/user-kernels/src/fused.rs`, every value checked on the host.
//!
//! ```text
//! cargo run --release --example fused -- [--device gpu|cpu|auto] [--transport p2p|ibgda] [--ranks N]
//! ```
//! The ranks are threads of this process (on one GPU, or the CPU emulator);
//! `--transport ibgda` sends through the soft NIC.

use clap::Parser;
use doorbell::coll::TransportKind;
use doorbell::comm::{CommOptions, Communicator, RingShape};
use doorbell::LaunchConfig;
use doorbell_example_kernels::fused::{all_gather, produce_send, value};
use doorbell_examples::cli::FusedArgs;
use doorbell_examples::{main_with, USER_KERNELS};

fn main() {
    let args = FusedArgs::parse();
    main_with(|| {
        let opts = CommOptions::from_env()?;
        let kind = args.transport.kind();
        let lines = Communicator::local(args.ranks as usize, args.device.backend()?, opts, |comm| run(comm, kind))?;
        println!("{}", lines[0]);
        Ok(())
    });
}

/// One rank: three steps of both kernels, every element checked.
pub fn run(comm: &Communicator, kind: TransportKind) -> doorbell::Result<String> {
    let (me, n, elems, part) = (comm.rank() as u32, comm.world_size() as u32, 100_000u64, 4096usize);
    let module = comm.load_module(&USER_KERNELS)?;
    let (send, gather) = (module.family::<produce_send>()?, module.family::<all_gather>()?);
    let (t, stream) = (comm.transport(kind)?, comm.device().new_stream()?);
    let rings = comm.rings::<f32>(RingShape {
        stages: 4,
        chunk: 2048,
        pairs: 4,
    })?;
    let (data, ready) = (comm.alloc::<f32>(n as usize * part)?, comm.alloc::<u64>(n as usize)?);
    let mut out = comm.device().alloc_zeroed::<f32>(elems as usize)?;
    let threads = if comm.device().is_gpu() { 256 } else { 32 };
    for step in 1..=3u64 {
        // SAFETY: the rings, buffers and `out` are this communicator's, of the sizes the kernels take.
        unsafe {
            stream.launch_family(
                &send,
                LaunchConfig::linear(rings.blocks(), threads),
                t,
                (rings.pipe()?, out.as_mut_ptr(), elems, step),
            )?
        };
        comm.synchronize(&stream)?; // one launch in flight per rank (ranks may share a GPU)
                                    // SAFETY: as above.
        unsafe { stream.launch_family(&gather, LaunchConfig::linear(1, threads), t, (data.sym(), ready.sym(), step))? };
        comm.synchronize(&stream)?;
        let prev = (me + n - 1) % n;
        let sent = wrong(out.to_host()?, |i| value(prev, i as u64, step));
        let gathered = wrong(data.to_host()?, |i| value((i / part) as u32, (i % part) as u64, step));
        if sent + gathered != 0 {
            return Err(doorbell::Error::Comm(format!(
                "rank {me} step {step}: {sent} sent and {gathered} gathered values wrong"
            )));
        }
        comm.barrier()?; // every rank's host reads before the next step's puts
    }
    Ok(format!(
        "{n} ranks over {kind:?}: 3 steps, {elems} values sent and {} gathered per rank, all correct",
        n as usize * part
    ))
}

/// How many of `got` differ from `want(i)`, bit for bit.
fn wrong(got: Vec<f32>, want: impl Fn(usize) -> f32) -> usize {
    got.iter().enumerate().filter(|&(i, v)| v.to_bits() != want(i).to_bits()).count()
}
