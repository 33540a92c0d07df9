//! Where a benchmark's ranks run: threads of this process by default, one
//! rank per process when launcher variables are set (`RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `DOORBELL_TOKEN`).

use doorbell::comm::{CommOptions, Communicator};
use doorbell::world::{World, WorldConfig};
use doorbell::{Backend, Device};
use doorbell_examples::{die, BoxError};

/// What [`run_ranks`] ran.
pub struct RankRun<R> {
    /// The result of every rank of this process, in rank order (one, for
    /// one rank per process).
    pub results: Vec<R>,
    /// True when a launcher made a world of processes, one rank each.
    pub one_process_per_rank: bool,
}

/// A rank's error as the communicator layer carries it: a doorbell error
/// kept as it is (so `main_with` still sees what kind it is, e.g. a NIC
/// this machine lacks), anything else as a communication error.
fn as_comm_error(e: BoxError) -> doorbell::Error {
    match e.downcast::<doorbell::Error>() {
        Ok(e) => *e,
        Err(e) => doorbell::Error::Comm(e.to_string()),
    }
}

/// Runs `body` on every rank. Without launcher variables: `threads` ranks
/// as threads of this process (`Communicator::local`). With them: this
/// process is one rank of the launcher's world (rendezvous tagged
/// `"<name> v1"`, the device `LOCAL_RANK` picks), and a rank whose body
/// fails tells the others at once (`Communicator::abort`) instead of
/// letting them time out. `exact`: the world size the benchmark needs; a
/// launcher's world of another size is bad input (exit status 2).
pub fn run_ranks<R: Send>(
    name: &str,
    threads: usize,
    exact: Option<usize>,
    backend: Backend,
    opts: CommOptions,
    body: impl Fn(&Communicator) -> Result<R, BoxError> + Sync,
) -> Result<RankRun<R>, BoxError> {
    let Some(cfg) = WorldConfig::from_env()? else {
        let results = Communicator::local(threads, backend, opts, |comm| body(comm).map_err(as_comm_error))?;
        return Ok(RankRun {
            results,
            one_process_per_rank: false,
        });
    };
    let world = World::rendezvous(&cfg, format!("{name} v1").as_bytes())?;
    if let Some(n) = exact.filter(|n| *n != world.world_size()) {
        die(format!(
            "{name} runs on {n} ranks; the launcher made a world of {}",
            world.world_size()
        ));
    }
    let dev = match backend {
        Backend::Cpu => Device::emulator(world.local_rank()),
        b => Device::open(b, world.local_rank() % doorbell::gpu_count().max(1))?,
    };
    let comm = Communicator::new(world, dev, opts)?;
    match body(&comm) {
        Ok(r) => Ok(RankRun {
            results: vec![r],
            one_process_per_rank: true,
        }),
        Err(e) => {
            comm.abort(&e.to_string());
            Err(e)
        }
    }
}
