//! Which NIC a rank opens: `DOORBELL_NIC` ([`NicChoice`]), then rdma-core,
//! the RDMA devices, the GPU and `DOORBELL_IB_HCA`, then the port nearest
//! the rank's GPU by PCIe distance ([`rdma_sys_ext::topo`]).
//!
//! With `auto` (the default) a machine without a usable ConnectX gets the
//! soft NIC and one info line saying why; with `mlx5` the first thing
//! missing is an [`Error::NicUnavailable`] naming it and what to change
//! (the examples exit with status 2 on it). Each check reads files or
//! loads a library; nothing here waits on a device.

use std::path::Path;
use std::sync::Arc;

use rdma_sys_ext::hca::HcaFilter;
use rdma_sys_ext::topo::{Choice, Topology};
use rdma_sys_ext::{DeviceList, Verbs};

use super::NicChoice;
use crate::error::{Error, Result};

/// What a rank opens.
#[derive(Clone)]
pub enum Selection {
    /// The soft NIC; `reason` says why (logged once per rank at info).
    Soft {
        /// `DOORBELL_NIC=soft`, or what `auto` found missing.
        reason: String,
    },
    /// A port of a ConnectX NIC.
    Mlx5 {
        /// The port, its distance to the GPU and why it was chosen.
        choice: Choice,
        /// The loaded rdma-core libraries.
        verbs: Arc<Verbs>,
    },
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Soft { reason } => f.debug_struct("Soft").field("reason", reason).finish(),
            Selection::Mlx5 { choice, .. } => f.debug_struct("Mlx5").field("choice", choice).finish(),
        }
    }
}

impl Selection {
    /// One line for the log: which NIC and why.
    pub fn describe(&self) -> String {
        match self {
            Selection::Soft { reason } => format!("the soft NIC ({reason})"),
            Selection::Mlx5 { choice, .. } => {
                let mut s = format!(
                    "{}:{} ({}, {} from GPU {}{})",
                    choice.device,
                    choice.port,
                    choice.link_layer,
                    choice.distance,
                    choice.gpu,
                    choice.gid_index.map(|g| format!(", RoCE v2 GID index {g}")).unwrap_or_default()
                );
                if !choice.shared_with.is_empty() {
                    s.push_str(&format!("; shared with GPU(s) {}", choice.shared_with.join(", ")));
                }
                s.push_str(&format!(": {}", choice.reason));
                s
            }
        }
    }
}

/// Loads rdma-core, or says why it cannot ([`Probe::load`]).
pub type LoadVerbs = dyn Fn() -> std::result::Result<Arc<Verbs>, String>;
/// Lists the RDMA devices' names, or says why it cannot ([`Probe::list`]).
pub type ListDevices = dyn Fn(&Arc<Verbs>) -> std::result::Result<Vec<String>, String>;

/// What [`select_with`] looks at; [`Probe::system`] is this machine.
pub struct Probe<'a> {
    /// Where sysfs and procfs are (`/`; a fixture tree in tests).
    pub root: &'a Path,
    /// Loads rdma-core (`Verbs::load`), or says why it cannot.
    pub load: &'a LoadVerbs,
    /// Names of the RDMA devices rdma-core lists.
    pub list: &'a ListDevices,
    /// `DOORBELL_IB_HCA`, parsed.
    pub filter: Option<HcaFilter>,
}

fn load_system() -> std::result::Result<Arc<Verbs>, String> {
    Verbs::load().map(Arc::new).map_err(|e| e.to_string())
}

fn list_system(verbs: &Arc<Verbs>) -> std::result::Result<Vec<String>, String> {
    let list = DeviceList::new(verbs).map_err(|e| e.to_string())?;
    list.iter().map(|d| d.map(|d| d.name).map_err(|e| e.to_string())).collect()
}

impl Probe<'static> {
    /// This machine: `/`, rdma-core loaded with `dlopen`, the filter from
    /// `DOORBELL_IB_HCA` (a malformed one is an error).
    pub fn system() -> Result<Probe<'static>> {
        let filter = HcaFilter::from_env().map_err(|e| Error::BadEnv {
            var: rdma_sys_ext::hca::ENV_VAR.to_string(),
            value: std::env::var_os(rdma_sys_ext::hca::ENV_VAR)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default(),
            reason: e.to_string(),
        })?;
        Ok(Probe {
            root: Path::new("/"),
            load: &load_system,
            list: &list_system,
            filter,
        })
    }
}

/// Chooses this rank's NIC on this machine: [`select_with`] over
/// [`Probe::system`] and `DOORBELL_NIC`.
pub fn select(rank: usize, gpu: Option<&str>, gpus_here: &[String]) -> Result<Selection> {
    select_with(NicChoice::from_env()?, rank, gpu, gpus_here, &Probe::system()?)
}

/// Chooses this rank's NIC. `gpu` is its GPU's PCI bus id (`None` on the
/// emulator); `gpus_here` the bus ids of every rank's GPU on this host
/// (this one included), so GPUs at the same distance get different NICs
/// where possible and GPUs that share one are reported.
pub fn select_with(choice: NicChoice, rank: usize, gpu: Option<&str>, gpus_here: &[String], probe: &Probe<'_>) -> Result<Selection> {
    if choice == NicChoice::Soft {
        return Ok(Selection::Soft {
            reason: format!("{}=soft", super::NIC_ENV),
        });
    }
    // Under `auto` a missing piece means the soft NIC; under `mlx5`, an error.
    let missing = |what: String| -> Result<Selection> {
        match choice {
            NicChoice::Auto => Ok(Selection::Soft {
                reason: format!("{}=auto: {what}", super::NIC_ENV),
            }),
            _ => Err(Error::NicUnavailable {
                missing: format!(
                    "rank {rank}: {nic}=mlx5, but {what}; or set {nic}=soft (or auto) for the soft NIC",
                    nic = super::NIC_ENV
                ),
            }),
        }
    };
    let verbs = match (probe.load)() {
        Ok(v) => v,
        Err(e) => return missing(format!("rdma-core cannot be used: {e}")),
    };
    if !verbs.has_mlx5() {
        let why = verbs.mlx5_load_error().unwrap_or("not found").to_string();
        return missing(format!(
            "libmlx5.so.1 (rdma-core's mlx5 provider, for direct verbs and DevX) cannot be loaded: {why}; install it \
             (Debian/Ubuntu: `apt-get install ibverbs-providers`; RHEL: `dnf install libibverbs`)"
        ));
    }
    let names = match (probe.list)(&verbs) {
        Ok(n) => n,
        Err(e) => return missing(format!("rdma-core cannot list RDMA devices: {e}")),
    };
    if names.is_empty() {
        return missing(
            "rdma-core reports no RDMA device (no ConnectX NIC, or its drivers mlx5_core/mlx5_ib and ib_uverbs are not \
             loaded; in a container, pass the devices with `--device /dev/infiniband`)"
                .to_string(),
        );
    }
    let Some(gpu) = gpu else {
        return missing(
            "this rank runs on the CPU emulator, whose memory no NIC registers as GPU memory; run on a GPU \
             (DOORBELL_DEVICE=gpu)"
                .to_string(),
        );
    };
    let topo = match Topology::read(probe.root) {
        Ok(t) => t,
        Err(e) => return missing(e.to_string()),
    };
    // Only devices rdma-core can open count.
    let mut here: Vec<&str> = gpus_here.iter().map(String::as_str).collect();
    if !here.iter().any(|g| g.eq_ignore_ascii_case(gpu)) {
        here.push(gpu);
    }
    let picked = match topo.assign(&here, probe.filter.as_ref()) {
        Ok(all) => all
            .into_iter()
            .find(|c| rdma_sys_ext::topo::normalize_bus_id(gpu).is_some_and(|g| g == c.gpu)),
        Err(e) => return missing(e.to_string()),
    };
    let Some(choice) = picked else {
        return missing(format!("no port was chosen for GPU {gpu}"));
    };
    if !names.iter().any(|n| n == &choice.device) {
        return missing(format!(
            "{} is in sysfs but rdma-core does not list it (devices listed: {}); load ib_uverbs or check \
             /dev/infiniband permissions",
            choice.device,
            names.join(", ")
        ));
    }
    Ok(Selection::Mlx5 { choice, verbs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_root() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "doorbell-nic-select-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(d.join("sys/class")).expect("temp dir");
        d
    }

    fn no_rdma_core() -> std::result::Result<Arc<Verbs>, String> {
        Err("cannot load libibverbs.so.1 (test)".to_string())
    }

    fn never_listed(_: &Arc<Verbs>) -> std::result::Result<Vec<String>, String> {
        unreachable!("not reached without the libraries")
    }

    /// A probe of an empty sysfs tree, without rdma-core.
    fn probe_without_rdma_core(root: &Path) -> Probe<'_> {
        Probe {
            root,
            load: &no_rdma_core,
            list: &never_listed,
            filter: None,
        }
    }

    #[test]
    fn soft_is_chosen_without_looking_at_the_machine() {
        let root = empty_root();
        let p = probe_without_rdma_core(&root);
        match select_with(NicChoice::Soft, 0, Some("0000:1b:00.0"), &[], &p).expect("soft") {
            Selection::Soft { reason } => assert_eq!(reason, "DOORBELL_NIC=soft"),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn missing_rdma_core_is_soft_under_auto_and_an_error_naming_it_under_mlx5() {
        let root = empty_root();
        let p = probe_without_rdma_core(&root);
        match select_with(NicChoice::Auto, 3, Some("0000:1b:00.0"), &[], &p).expect("auto") {
            Selection::Soft { reason } => assert!(reason.contains("rdma-core cannot be used"), "{reason}"),
            s => panic!("{s:?}"),
        }
        match select_with(NicChoice::Mlx5, 3, Some("0000:1b:00.0"), &[], &p) {
            Err(Error::NicUnavailable { missing }) => {
                assert!(
                    missing.starts_with("rank 3: DOORBELL_NIC=mlx5, but rdma-core cannot be used"),
                    "{missing}"
                );
                assert!(missing.contains("libibverbs.so.1"), "{missing}");
            }
            r => panic!("{r:?}"),
        }
    }

    /// rdma-core really loaded (scripts/setup.sh installs Debian's
    /// libibverbs1 and ibverbs-providers): it lists no device on a machine
    /// without a NIC, and the selection says so.
    #[test]
    fn installed_rdma_core_without_a_device_is_named() {
        let verbs = match Verbs::load() {
            Ok(v) => Arc::new(v),
            Err(e) => panic!("rdma-core's libraries are not installed ({e}); run scripts/setup.sh"),
        };
        assert!(
            verbs.has_mlx5(),
            "libmlx5.so.1 did not load: {:?}; run scripts/setup.sh",
            verbs.mlx5_load_error()
        );
        let names = list_system(&verbs).expect("device list");
        if !names.is_empty() {
            eprintln!("this machine has RDMA devices ({names:?}): the no-device path is not what runs here");
            return;
        }
        let root = empty_root();
        let p = Probe {
            root: &root,
            load: &load_system,
            list: &list_system,
            filter: None,
        };
        let t0 = std::time::Instant::now();
        match select_with(NicChoice::Mlx5, 0, Some("0000:1b:00.0"), &[], &p) {
            Err(Error::NicUnavailable { missing }) => assert!(missing.contains("rdma-core reports no RDMA device"), "{missing}"),
            r => panic!("{r:?}"),
        }
        match select_with(NicChoice::Auto, 0, None, &[], &p).expect("auto") {
            Selection::Soft { reason } => assert!(reason.contains("no RDMA device"), "{reason}"),
            s => panic!("{s:?}"),
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn nic_choice_parses_strictly() {
        assert_eq!(NicChoice::parse("V", "auto").unwrap(), NicChoice::Auto);
        assert_eq!(NicChoice::parse("V", " mlx5 ").unwrap(), NicChoice::Mlx5);
        assert_eq!(NicChoice::parse("V", "soft").unwrap(), NicChoice::Soft);
        assert!(matches!(NicChoice::parse("V", "mlx4"), Err(Error::BadEnv { .. })));
    }
}
