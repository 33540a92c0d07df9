//! `doorbell doctor`: what this machine offers doorbell, and what stops it.
//!
//! The diagnosis behind the `doorbell doctor` command (the `doorbell`
//! binary of this crate), for set-up problems and bug reports. [`run`]
//! probes the machine and returns a [`Report`]; [`Report::render`] prints
//! it as text, and it serializes (serde) to the one JSON object of
//! `doorbell doctor --json`. The sections:
//!
//! * **GPUs**: the CUDA driver (loaded at run time, as the runtime loads
//!   it) and its version, each GPU's name, compute capability, memory and
//!   PCI bus id; without a driver or a GPU, the CPU emulator runs.
//! * **Kernels**: the embedded PTX images ([`crate::KERNELS`], the soft
//!   NIC's [`crate::comm::SOFTNIC`]): their PTX ISA version and target,
//!   their cubins and arch, checked against the driver (a PTX ISA newer
//!   than the driver can compile does not load) and the GPUs.
//! * **Peers**: the peer-access matrix of the GPUs (`cuDeviceCanAccessPeer`,
//!   native atomics) and NVLink where NVML (`libnvidia-ml.so.1`, optional)
//!   says.
//! * **RDMA**: rdma-core's libraries and versions, the RDMA devices, their
//!   ports, state, link layer and RoCE v2 GIDs, their distance to each GPU
//!   ([`rdma_sys_ext::topo`]), and the NIC each GPU's rank would open
//!   ([`crate::nic::select`]).
//! * **Routes**: the route each pair of ranks of a world on this host
//!   would take ([`crate::comm::route_to`], the communicator's own
//!   decision), and whether the routed transport sends it through the NIC.
//! * **Environment**: every `DOORBELL_*` variable set, checked by the
//!   crate's own parsers ([`crate::env::CHECKS`], the world's); names no
//!   part of doorbell reads are flagged.
//!
//! Each problem is a [`Finding`] with its reason and a fix; a report with
//! problems exits 1 ([`Report::exit_code`]). No GPU is a warning (the
//! emulator runs) unless a GPU is required ([`Options::require_gpu`]).
//! Nothing here panics on a machine that lacks something: a probe that
//! fails becomes a line saying what could not be read and why.

pub mod env;
pub mod nvml;
pub mod ptx;
pub mod rdma;
pub mod routes;

mod checks;
mod probe;
mod render;
mod report;

pub use report::{EnvSection, Finding, Gpu, GpuSection, Image, KernelSection, PeerCell, PeerSection, Report, RouteSection};
pub use routes::Launch;

/// What to diagnose.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks of the modelled world (`None`: one per GPU, or 2 without GPUs).
    pub ranks: Option<usize>,
    /// How those ranks are launched.
    pub launch: Launch,
    /// No GPU is a problem, not a warning.
    pub require_gpu: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ranks: None,
            launch: Launch::Processes,
            require_gpu: false,
        }
    }
}

/// Probes this machine.
pub fn run(opts: &Options) -> Report {
    let mut report = Report {
        doorbell_version: env!("CARGO_PKG_VERSION"),
        gpus: GpuSection::default(),
        kernels: KernelSection::default(),
        peers: PeerSection::default(),
        rdma: rdma::RdmaReport::default(),
        routes: RouteSection {
            ranks: 0,
            launch: opts.launch,
            rank_per_gpu: false,
            placement: Vec::new(),
            nic: String::new(),
            pairs: Vec::new(),
        },
        environment: EnvSection::default(),
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    checks::probe_env(&mut report);
    probe::probe_gpus(&mut report);
    let device = crate::backend::Backend::from_env().ok();
    let gpus = report.gpus.devices.len();
    report.gpus.backend = match (device, gpus) {
        (Some(crate::Backend::Cpu), _) => "cpu emulator (DOORBELL_DEVICE=cpu)".into(),
        (_, 0) => "cpu emulator".into(),
        _ => "gpu".into(),
    };
    if gpus == 0 {
        let why = report
            .gpus
            .errors
            .first()
            .cloned()
            .unwrap_or_else(|| "the driver reports no GPU".into());
        let fix = "install the NVIDIA driver and make the GPUs visible (in a container: --gpus all); without them doorbell runs on its CPU emulator";
        if opts.require_gpu || device == Some(crate::Backend::Gpu) {
            let by = if opts.require_gpu { "--require-gpu" } else { "DOORBELL_DEVICE=gpu" };
            report.problem("gpus", format!("no GPU ({why}), and {by} asks for one"), fix);
        } else {
            report.warning("gpus", format!("no GPU ({why}): the CPU emulator will be used"), fix);
        }
    } else {
        for e in report.gpus.errors.clone() {
            report.warning("gpus", e, "check the driver with nvidia-smi");
        }
    }
    checks::probe_kernels(&mut report);
    let links = probe::probe_peers(&mut report);
    probe::probe_rdma(&mut report);
    checks::probe_routes(&mut report, opts, &links);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON object's shape: what bug reports and scripts rely on.
    #[test]
    fn json_has_every_section() {
        let report = run(&Options {
            ranks: Some(3),
            ..Options::default()
        });
        let v: serde_json::Value = serde_json::to_value(&report).expect("serializes");
        for key in Report::SECTIONS {
            assert!(v.get(key).is_some(), "no {key} in {v}");
        }
        assert_eq!(v.as_object().map(|o| o.len()), Some(Report::SECTIONS.len()), "{v}");
        assert!(v["problems"].is_array() && v["warnings"].is_array());
        assert_eq!(v["routes"]["ranks"], 3);
        assert_eq!(v["routes"]["pairs"].as_array().map(Vec::len), Some(3));
        let images = v["kernels"]["images"].as_array().expect("images");
        assert_eq!(images.len(), 2);
        for i in images {
            for key in ["name", "ptx_built", "ptx_isa", "target", "cubin_bytes", "cubin_arch"] {
                assert!(i.get(key).is_some(), "no {key} in {i}");
            }
            // Built without PTX or with it: the two agree with the header.
            assert_eq!(i["ptx_built"].as_bool(), Some(!i["ptx_isa"].is_null()), "{i}");
        }
        assert!(v["rdma"]["libraries"].as_array().is_some_and(|l| l.len() == 2));
        assert_eq!(report.exit_code(), i32::from(!report.problems.is_empty()));
        let text = report.render();
        for head in [
            "== GPUs ==",
            "== Kernels ==",
            "== Peer access ==",
            "== RDMA ==",
            "== Routes",
            "== Environment ==",
            "result: ",
        ] {
            assert!(text.contains(head), "no {head} in\n{text}");
        }
    }
}
