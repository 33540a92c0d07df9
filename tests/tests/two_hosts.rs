//! A world whose two ranks run on different hosts (told apart by
//! `DOORBELL_HOSTNAME`, as two nodes would be), on the emulator: the
//! communicator forms, each rank sees the other as `PeerRoute::Remote`,
//! the P2P handle is refused naming the peer and the way out, and IBGDA
//! over the soft NIC (the only NIC here) is refused naming the ConnectX it
//! needs. The test binary re-runs itself as rank 1; it is the only test
//! here that sets `DOORBELL_HOSTNAME`.

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, PeerRoute};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Device, Error};

const TOKEN: &str = "two-hosts-test-token-5f1e8a07c3";

/// What one rank checks; `Err` says what differed.
fn rank_checks(world: World) -> Result<(), String> {
    let opts = CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let comm = Communicator::new(world, Device::emulator(0), opts).map_err(|e| format!("Communicator::new: {e}"))?;
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let routes = comm.describe_peers().to_vec();
    if routes[peer] != PeerRoute::Remote || routes[me] != PeerRoute::Local {
        return Err(format!("rank {me}: routes {routes:?}"));
    }
    match comm.p2p() {
        Err(Error::PeerUnreachable { rank, peer: p, reason }) if rank == me && p == peer => {
            if !(reason.contains("another host") && reason.contains("Communicator::ibgda")) {
                return Err(format!("rank {me}: p2p refusal: {reason}"));
            }
        }
        Err(e) => return Err(format!("rank {me}: p2p: {e}")),
        Ok(_) => return Err(format!("rank {me}: a P2P handle to a rank of another host")),
    }
    let local = comm.alloc::<u64>(4).map_err(|e| format!("alloc: {e}"))?;
    if comm.peer_address(local.as_ptr(), peer).is_ok() {
        return Err(format!("rank {me}: an address in the heap of a rank of another host"));
    }
    match comm.ibgda() {
        Err(Error::NicUnavailable { missing }) => {
            if !(missing.contains(&format!("rank {peer} runs on another host")) && missing.contains("DOORBELL_NIC=mlx5")) {
                return Err(format!("rank {me}: ibgda refusal: {missing}"));
            }
        }
        Err(e) => return Err(format!("rank {me}: ibgda: {e}")),
        Ok(_) => return Err(format!("rank {me}: the soft NIC set up across hosts")),
    }
    Ok(())
}

#[test]
#[ignore = "a child process's entry point: the test that needs it runs it with --ignored"]
fn child_rank_on_node_b() {
    assert!(
        std::env::var("DOORBELL_TEST_TWO_HOSTS_CHILD").is_ok(),
        "rank 1 of ranks_on_two_hosts_form_a_communicator_that_only_a_nic_can_serve; run that test instead"
    );
    let cfg = WorldConfig::from_env().unwrap().expect("launcher variables set by the parent");
    let world = World::rendezvous(&cfg, b"two-hosts").unwrap();
    match rank_checks(world) {
        Ok(()) => println!("CHILD-OK"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn ranks_on_two_hosts_form_a_communicator_that_only_a_nic_can_serve() {
    std::env::set_var("DOORBELL_HOSTNAME", "node-a");
    std::env::set_var("DOORBELL_NIC", "auto");
    let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_rendezvous_timeout(Duration::from_secs(30));
    let host = RendezvousHost::bind(&cfg).unwrap();
    let port = host.local_addr().port();
    let child = doorbell_tests::spawn_rank1(
        "child_rank_on_node_b",
        port,
        TOKEN,
        0,
        &[("DOORBELL_TEST_TWO_HOSTS_CHILD", "1"), ("DOORBELL_HOSTNAME", "node-b")],
    );
    let world = host.accept(b"two-hosts").unwrap();
    let mine = rank_checks(world);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-OK"),
        "rank 1 failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    mine.unwrap();
}
