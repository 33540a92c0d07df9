//! The all-reduce over ranks forming modeled nodes (`RdmaPeers::Nodes`:
//! load/store inside a node, the soft NIC between nodes — posted by the
//! GPU over the routed transport, by the CPU proxy's thread over the
//! proxy), on the emulator: the plan picks the hierarchical algorithm,
//! its results are bit for bit the node-wise reference
//! (`allreduce_sum_nodes`) for the plain and the fused all-reduce, it
//! sends fewer WQEs through the NIC than the pipelined algorithm on the
//! same data, and bad combinations are refused.

use std::time::Duration;

use doorbell::coll::reference::{allreduce_sum_nodes, first_mismatch};
use doorbell::coll::{Algo, AllReduce, AllReduceOptions, Bf16, DType, HostElement, TransportKind};
use doorbell::comm::{CommOptions, Communicator, RdmaPeers};
use doorbell::{AnyTransport, Backend, DeviceBuffer};
use doorbell_example_kernels::allreduce::{fused_grad_allreduce, grad, COMPUTE_HASH};

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 16 << 20,
        wait_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// Rank `r`'s element `i` in launch `launch`: not an integer, different
/// per rank, element and launch.
fn value(r: usize, i: usize, launch: u64) -> f32 {
    ((r * 7 + i * 13 + launch as usize * 5) % 29) as f32 * 0.3125 - 4.0 + (i % 3) as f32 * 0.001
}

fn node_opts(transport: TransportKind, nodes: usize) -> AllReduceOptions {
    AllReduceOptions {
        transport,
        rdma_peers: Some(RdmaPeers::Nodes(nodes)),
        stages: Some(2),
        chunk_bytes: Some(1024),
        ..Default::default()
    }
}

/// `launches` plain all-reduces of `elems` `T` (in place every other
/// launch) with `opts`; every element checked against the node-wise
/// reference. Returns the WQEs this rank posted to the NIC meanwhile.
fn plain<T: HostElement>(
    comm: &Communicator,
    elems: usize,
    launches: u64,
    opts: &AllReduceOptions,
    node_ranks: usize,
) -> doorbell::Result<u64> {
    let ar = AllReduce::with_options(comm, elems, T::DTYPE, opts)?;
    let (ranks, me) = (comm.world_size(), comm.rank());
    let dev = comm.device();
    let s = dev.new_stream()?;
    let before = nic_wqes(comm);
    for launch in 0..launches {
        let inputs: Vec<Vec<T>> = (0..ranks)
            .map(|r| (0..elems).map(|i| T::from_f32(value(r, i, launch))).collect())
            .collect();
        let want = match ar.algo() {
            Algo::Hierarchical => allreduce_sum_nodes(&inputs, node_ranks),
            _ => allreduce_sum_nodes(&inputs, ranks),
        };
        let mut input = dev.alloc_from(&inputs[me])?;
        let got = if launch % 2 == 1 {
            ar.run_in_place(&s, &mut input)?;
            comm.synchronize(&s)?;
            input.to_host()?
        } else {
            let mut out: DeviceBuffer<T> = dev.alloc_zeroed(elems)?;
            ar.run(&s, &input, &mut out)?;
            comm.synchronize(&s)?;
            out.to_host()?
        };
        if let Some(i) = first_mismatch(&got, &want) {
            panic!(
                "{} {} x {elems}, launch {launch}, rank {me}: element {i} is {:?}, want {:?}",
                ar.algo().name(),
                T::DTYPE.name(),
                got[i].to_f32(),
                want[i].to_f32()
            );
        }
        comm.barrier()?;
    }
    Ok(nic_wqes(comm) - before)
}

/// WQEs of this rank through the NIC so far: executed by the soft NIC for
/// IBGDA's QPs, posted by the proxy's thread for its own.
fn nic_wqes(comm: &Communicator) -> u64 {
    comm.ibgda_progress().map_or(0, |p| p.record.executed) + comm.proxy_stats().map_or(0, |p| p.wqes)
}

/// The handle `opts` was planned for, routed by its nodes.
fn node_handle(comm: &Communicator, opts: &AllReduceOptions) -> doorbell::Result<AnyTransport> {
    let peers = opts.rdma_peers.as_ref().expect("nodes");
    Ok(match opts.transport {
        TransportKind::Proxy => comm.proxy_routed(peers)?.into(),
        _ => comm.routed_with(peers)?.into(),
    })
}

/// Two steps of the fused all-reduce (the hash producer) over the
/// transport's nodes, checked against the node-wise reference.
fn fused(comm: &Communicator, elems: usize, dtype: DType, opts: &AllReduceOptions, node_ranks: usize) -> doorbell::Result<()> {
    let ar = AllReduce::with_options(
        comm,
        elems,
        dtype,
        &AllReduceOptions {
            fused: true,
            ..opts.clone()
        },
    )?;
    assert_eq!(ar.algo(), Algo::Hierarchical);
    let module = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let f = module.family::<fused_grad_allreduce>()?;
    let t = node_handle(comm, opts)?;
    let s = comm.device().new_stream()?;
    for step in 0..2u32 {
        let bad = match dtype {
            DType::F32 => fused_step::<f32>(comm, &ar, &f, t, &s, elems, step, node_ranks)?,
            DType::Bf16 => fused_step::<Bf16>(comm, &ar, &f, t, &s, elems, step, node_ranks)?,
        };
        assert_eq!(bad, None, "fused {} x {elems}, step {step}, rank {}", dtype.name(), comm.rank());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn fused_step<T: HostElement>(
    comm: &Communicator,
    ar: &AllReduce<'_>,
    f: &doorbell::Family<fused_grad_allreduce>,
    t: AnyTransport,
    s: &doorbell::Stream,
    elems: usize,
    step: u32,
    node_ranks: usize,
) -> doorbell::Result<Option<usize>> {
    let mut out: DeviceBuffer<T> = comm.device().alloc_zeroed(elems)?;
    if let Some((a, cfg)) = ar.fused_args(s, &mut out)? {
        // SAFETY: arguments from fused_args for this world and buffer,
        // launched with the transport the all-reduce was made for.
        unsafe { s.launch_family(f, cfg, t, (a, COMPUTE_HASH, step))? };
    }
    comm.synchronize(s)?;
    let inputs: Vec<Vec<T>> = (0..comm.world_size() as u32)
        .map(|r| (0..elems as u64).map(|i| T::from_f32(grad(COMPUTE_HASH, r, i, step))).collect())
        .collect();
    let got = out.to_host()?;
    comm.barrier()?;
    Ok(first_mismatch(&got, &allreduce_sum_nodes(&inputs, node_ranks)))
}

/// 4 ranks as 2 nodes, 6 as 2 and as 3 (the proxy: 4 as 2, 6 as 3): the
/// hierarchical plan, f32 and bf16, a size that leaves a short last
/// chunk, launches in and out of place, the fused all-reduce.
#[test]
fn hierarchical_all_reduce_is_bit_for_bit_the_node_wise_sum() {
    let cases = [
        (TransportKind::Routed, 4usize, 2usize),
        (TransportKind::Routed, 6, 2),
        (TransportKind::Routed, 6, 3),
        (TransportKind::Proxy, 4, 2),
        (TransportKind::Proxy, 6, 3),
    ];
    for (transport, ranks, nodes) in cases {
        let k = ranks / nodes;
        let o = node_opts(transport, nodes);
        Communicator::local(ranks, Backend::Cpu, opts(), |comm| {
            let ar = AllReduce::with_options(comm, 3001, DType::F32, &o)?;
            assert_eq!((ar.algo(), ar.plan().args.node_ranks), (Algo::Hierarchical, k as u32));
            drop(ar);
            plain::<f32>(comm, 3001, 3, &o, k)?;
            plain::<Bf16>(comm, 1000, 2, &o, k)?;
            fused(comm, 2000, DType::F32, &o, k)?;
            fused(comm, 999, DType::Bf16, &o, k)?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{transport}: {ranks} ranks as {nodes} nodes: {e}"));
    }
}

/// The schedule's edges, 4 ranks as 2 nodes: one stage per ring (no lag
/// between reducing and receiving), the default stages (the most lag),
/// and more blocks than chunks (blocks with nothing to do), f32, two
/// launches each.
#[test]
fn hierarchical_holds_at_one_stage_the_default_stages_and_idle_blocks() {
    let o = node_opts(TransportKind::Routed, 2);
    let variants = [
        (Some(1), None, 3001),
        (None, None, 3001),
        (Some(2), Some(3), 2000),
        (Some(2), Some(3), 100),
    ];
    Communicator::local(4, Backend::Cpu, opts(), |comm| {
        for (stages, blocks, elems) in variants {
            let v = AllReduceOptions {
                stages,
                blocks,
                ..o.clone()
            };
            plain::<f32>(comm, elems, 2, &v, 2)
                .map_err(|e| doorbell::Error::Comm(format!("{stages:?} stages, {blocks:?} blocks, {elems}: {e}")))?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("4 ranks as 2 nodes: {e}"));
}

/// The same data through the pipelined algorithm and the hierarchical one
/// (4 ranks as 2 nodes), over the routed transport and the proxy: the
/// hierarchical sends each chunk across the NIC once per pair of nodes,
/// so each rank's NIC executes well under the pipelined algorithm's
/// WQEs.
#[test]
fn hierarchical_sends_fewer_wqes_through_the_nic_than_pipelined() {
    for transport in [TransportKind::Routed, TransportKind::Proxy] {
        fewer_wqes(transport);
    }
}

fn fewer_wqes(transport: TransportKind) {
    let o = node_opts(transport, 2);
    let counts = Communicator::local(4, Backend::Cpu, opts(), |comm| {
        let piped = plain::<f32>(
            comm,
            16384,
            2,
            &AllReduceOptions {
                algo: Some(Algo::Pipelined),
                ..o.clone()
            },
            2,
        )?;
        let hier = plain::<f32>(comm, 16384, 2, &o, 2)?;
        Ok((piped, hier))
    })
    .unwrap_or_else(|e| panic!("{transport}: 4 ranks as 2 nodes: {e}"));
    for (r, (piped, hier)) in counts.iter().enumerate() {
        assert!(*hier > 0, "{transport}: rank {r}: no WQE through the NIC");
        assert!(
            4 * hier < 3 * piped,
            "{transport}: rank {r}: hierarchical {hier} WQEs, pipelined {piped}"
        );
    }
}

/// Bad combinations name what is missing: the hierarchical algorithm over
/// a transport that does not route by node, over one node, or over a
/// node per rank.
#[test]
fn hierarchical_without_nodes_is_refused() {
    Communicator::local(4, Backend::Cpu, opts(), |comm| {
        let hier = |transport, rdma_peers| AllReduceOptions {
            transport,
            rdma_peers,
            algo: Some(Algo::Hierarchical),
            ..Default::default()
        };
        for (o, why) in [
            (hier(TransportKind::P2p, None), "over p2p"),
            (hier(TransportKind::Ibgda, None), "over ibgda"),
            (hier(TransportKind::Proxy, None), "1 per node"),
            (hier(TransportKind::Proxy, Some(RdmaPeers::All)), "1 per node"),
            (hier(TransportKind::Routed, Some(RdmaPeers::Nodes(1))), "4 per node"),
            (hier(TransportKind::Routed, Some(RdmaPeers::Nodes(4))), "1 per node"),
            (hier(TransportKind::Routed, Some(RdmaPeers::All)), "1 per node"),
            (hier(TransportKind::Routed, Some(RdmaPeers::Nodes(3))), "1 per node"),
        ] {
            let e = AllReduce::with_options(comm, 100, DType::F32, &o)
                .err()
                .expect("refused")
                .to_string();
            assert!(e.contains("hierarchical") && e.contains(why), "{o:?}: {e}");
        }
        Ok(())
    })
    .unwrap();
}
