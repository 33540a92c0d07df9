//! Which NIC the IBGDA set-up opens (`DOORBELL_NIC`), on a machine
//! without a ConnectX: `mlx5` fails every rank fast with a
//! `NicUnavailable` naming what is missing; `auto` and `soft` run over the
//! soft NIC. One test sets the variable, so this file holds only it (each
//! test file is its own process).

use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator};
use doorbell::{Backend, Error};

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

#[test]
fn doorbell_nic_picks_the_nic_and_mlx5_without_one_is_named_on_every_rank() {
    // Leave the check to machines without an RDMA device.
    let has_rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if has_rdma {
        eprintln!("this machine has RDMA devices: the no-device path of DOORBELL_NIC=mlx5 is not what runs here");
    } else {
        std::env::set_var("DOORBELL_NIC", "mlx5");
        let t0 = Instant::now();
        let r = Communicator::local(2, Backend::Cpu, opts(), |comm| match comm.ibgda() {
            Ok(_) => Ok(None),
            Err(Error::NicUnavailable { missing }) => Ok(Some(missing)),
            Err(e) => Err(e),
        });
        let took = t0.elapsed();
        match r {
            Ok(per_rank) => {
                for (rank, m) in per_rank.iter().enumerate() {
                    let m = m
                        .as_ref()
                        .unwrap_or_else(|| panic!("rank {rank} opened IBGDA with DOORBELL_NIC=mlx5 and no NIC"));
                    assert!(m.starts_with(&format!("rank {rank}: DOORBELL_NIC=mlx5, but ")), "{m}");
                    assert!(m.contains("DOORBELL_NIC=soft"), "{m}");
                }
            }
            Err(e) => panic!("expected NicUnavailable on both ranks, got {e}"),
        }
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }
    for choice in ["soft", "auto"] {
        std::env::set_var("DOORBELL_NIC", choice);
        let kinds = Communicator::local(2, Backend::Cpu, opts(), |comm| {
            comm.ibgda()?;
            Ok(comm.soft_nic().is_some())
        })
        .unwrap_or_else(|e| panic!("DOORBELL_NIC={choice}: {e}"));
        if choice == "soft" || !has_rdma {
            assert_eq!(kinds, vec![true, true], "DOORBELL_NIC={choice}");
        }
    }
    std::env::set_var("DOORBELL_NIC", "mlx4");
    match Communicator::local(2, Backend::Cpu, opts(), |comm| comm.ibgda().map(|_| ())) {
        Err(Error::BadEnv { var, .. }) => assert_eq!(var, "DOORBELL_NIC"),
        r => panic!("DOORBELL_NIC=mlx4: {r:?}"),
    }
    std::env::remove_var("DOORBELL_NIC");
}
