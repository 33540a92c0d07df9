//! The crate's one error type.

use std::io;

/// What to install when rdma-core's libraries cannot be opened.
pub(crate) const INSTALL_HINT: &str = "install rdma-core's user-space libraries: \
     Debian/Ubuntu `apt-get install libibverbs1 ibverbs-providers`, \
     RHEL/Fedora `dnf install libibverbs rdma-core` (libmlx5 ships in ibverbs-providers / libibverbs)";

/// Every failure of this crate: loading rdma-core, and each C call.
///
/// C calls report `errno`: verbs that return an `int` return it (some
/// providers return it negated, or `-1` with `errno` set; all three are
/// folded into `source`), verbs that return a pointer return `NULL` and set
/// `errno`. Variants name the call and carry the arguments that help tell
/// why it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `dlopen` of `library` failed: rdma-core (or its mlx5 provider) is not
    /// installed on this machine.
    #[error("cannot load {library} ({source}); {hint}", hint = INSTALL_HINT)]
    LibraryNotFound {
        /// The soname that was opened, e.g. `"libibverbs.so.1"`.
        library: &'static str,
        /// The loader's message.
        source: libloading::Error,
    },
    /// The library loaded but lacks `symbol`: the installed rdma-core is
    /// older than the verb (e.g. `ibv_reg_dmabuf_mr` needs rdma-core 34+).
    #[error("{library} has no symbol `{symbol}`: the installed rdma-core is too old for this verb ({detail})")]
    MissingSymbol {
        /// The soname that lacks it.
        library: &'static str,
        /// The C function name.
        symbol: &'static str,
        /// The loader's message from `dlsym`.
        detail: String,
    },
    /// libmlx5 was not loaded (see [`crate::Verbs::mlx5_load_error`]), so a
    /// direct-verbs call cannot be made.
    #[error("libmlx5.so.1 is not loaded ({reason}); {hint}", hint = INSTALL_HINT)]
    Mlx5Unavailable {
        /// Why loading libmlx5.so.1 failed.
        reason: String,
    },
    /// The provider does not implement a verb through its `verbs_context`
    /// ops table and there is no fallback.
    #[error("the device's provider does not implement {op}")]
    Unsupported {
        /// The verb.
        op: &'static str,
    },
    /// `ibv_get_device_list` failed (`ENOSYS`: the kernel has no RDMA
    /// support; [`crate::DeviceList`] reports that as an empty list).
    #[error("ibv_get_device_list failed: {source}")]
    GetDeviceList {
        /// errno.
        source: io::Error,
    },
    /// `ibv_get_device_name` returned NULL.
    #[error("ibv_get_device_name failed: {source}")]
    GetDeviceName {
        /// errno.
        source: io::Error,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({device}) failed: {source}")]
    OpenDevice {
        /// The device's name.
        device: String,
        /// errno.
        source: io::Error,
    },
    /// `ibv_close_device` failed.
    #[error("ibv_close_device failed: {source}")]
    CloseDevice {
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_device` failed.
    #[error("ibv_query_device failed: {source}")]
    QueryDevice {
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_device_ex` failed.
    #[error("ibv_query_device_ex failed: {source}")]
    QueryDeviceEx {
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_port` failed.
    #[error("ibv_query_port(port {port}) failed: {source}")]
    QueryPort {
        /// The port number (1-based).
        port: u8,
        /// errno.
        source: io::Error,
    },
    /// `ibv_query_gid` failed.
    #[error("ibv_query_gid(port {port}, index {index}) failed: {source}")]
    QueryGid {
        /// The port number (1-based).
        port: u8,
        /// The GID table index.
        index: i32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd failed: {source}")]
    AllocPd {
        /// errno.
        source: io::Error,
    },
    /// `ibv_dealloc_pd` failed (`EBUSY`: MRs or QPs still use the PD).
    #[error("ibv_dealloc_pd failed: {source}")]
    DeallocPd {
        /// errno.
        source: io::Error,
    },
    /// `ibv_reg_mr` failed.
    #[error("ibv_reg_mr(addr {addr:#x}, len {len}, access {access:#x}) failed: {source}")]
    RegMr {
        /// Start of the region.
        addr: usize,
        /// Length in bytes.
        len: usize,
        /// `IBV_ACCESS_*` flags.
        access: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_reg_dmabuf_mr` failed.
    #[error("ibv_reg_dmabuf_mr(fd {fd}, offset {offset:#x}, len {len}, iova {iova:#x}, access {access:#x}) failed: {source}")]
    RegDmabufMr {
        /// The dma-buf file descriptor.
        fd: i32,
        /// Offset into the dma-buf.
        offset: u64,
        /// Length in bytes.
        len: usize,
        /// I/O virtual address the region is registered at.
        iova: u64,
        /// `IBV_ACCESS_*` flags.
        access: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_dereg_mr` failed.
    #[error("ibv_dereg_mr failed: {source}")]
    DeregMr {
        /// errno.
        source: io::Error,
    },
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq(cqe {cqe}) failed: {source}")]
    CreateCq {
        /// Requested number of entries.
        cqe: i32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_destroy_cq` failed.
    #[error("ibv_destroy_cq failed: {source}")]
    DestroyCq {
        /// errno.
        source: io::Error,
    },
    /// `ibv_create_qp` / `ibv_create_qp_ex` failed.
    #[error("ibv_create_qp(type {qp_type}) failed: {source}")]
    CreateQp {
        /// `IBV_QPT_*`.
        qp_type: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_destroy_qp` failed.
    #[error("ibv_destroy_qp(qpn {qpn:#x}) failed: {source}")]
    DestroyQp {
        /// The QP number.
        qpn: u32,
        /// errno.
        source: io::Error,
    },
    /// `ibv_modify_qp` failed (`EINVAL` usually means a missing or
    /// extra attribute for the state transition).
    #[error("ibv_modify_qp(qpn {qpn:#x}, to state {state}, mask {attr_mask:#x}) failed: {source}")]
    ModifyQp {
        /// The QP number.
        qpn: u32,
        /// `qp_state` from the attributes (`IBV_QPS_*`).
        state: u32,
        /// `IBV_QP_*` attribute mask.
        attr_mask: u32,
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_init_obj` failed.
    #[error("mlx5dv_init_obj(obj_type {obj_type:#x}) failed: {source}")]
    Mlx5InitObj {
        /// `MLX5DV_OBJ_*` flags.
        obj_type: u64,
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_query_device` failed (`EOPNOTSUPP`: not an mlx5 device).
    #[error("mlx5dv_query_device failed: {source}")]
    Mlx5QueryDevice {
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_devx_umem_reg` failed.
    #[error("mlx5dv_devx_umem_reg(addr {addr:#x}, len {len}, access {access:#x}) failed: {source}")]
    DevxUmemReg {
        /// Start of the region.
        addr: usize,
        /// Length in bytes.
        len: usize,
        /// `IBV_ACCESS_*` flags.
        access: u32,
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_devx_umem_dereg` failed.
    #[error("mlx5dv_devx_umem_dereg failed: {source}")]
    DevxUmemDereg {
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_devx_alloc_uar` failed.
    #[error("mlx5dv_devx_alloc_uar(flags {flags:#x}) failed: {source}")]
    DevxAllocUar {
        /// `MLX5DV_UAR_ALLOC_TYPE_*`.
        flags: u32,
        /// errno.
        source: io::Error,
    },
    /// A DevX command failed: the C call, the command (name and opcode)
    /// and the firmware's status and syndrome from the output mailbox
    /// (status 0 with an errno: the kernel refused it before the device
    /// saw it, e.g. `EPERM` without DevX rights).
    #[error(
        "{call}({command}, opcode {opcode:#x}) failed: status {status:#x} ({status_name}), syndrome {syndrome:#010x}: {source}",
        status_name = crate::prm::status_name(*status)
    )]
    DevxCmd {
        /// `mlx5dv_devx_obj_create`, `..._modify`, `..._query` or `mlx5dv_devx_general_cmd`.
        call: &'static str,
        /// The command's PRM name, e.g. `"CREATE_QP"`.
        command: &'static str,
        /// Its opcode (`MLX5_CMD_OP_*`).
        opcode: u16,
        /// The output mailbox's status (`MLX5_CMD_STAT_*`).
        status: u8,
        /// The output mailbox's syndrome (firmware-specific detail).
        syndrome: u32,
        /// errno.
        source: io::Error,
    },
    /// A DevX mailbox shorter than its 16-byte header was passed.
    #[error("{call}: mailboxes must hold at least their 16-byte header (in {in_len} bytes, out {out_len} bytes)")]
    DevxMailbox {
        /// The C call.
        call: &'static str,
        /// Input mailbox length.
        in_len: usize,
        /// Output mailbox length.
        out_len: usize,
    },
    /// `mlx5dv_devx_obj_destroy` failed.
    #[error("mlx5dv_devx_obj_destroy failed: {source}")]
    DevxDestroy {
        /// errno.
        source: io::Error,
    },
    /// `mlx5dv_devx_query_eqn` failed.
    #[error("mlx5dv_devx_query_eqn(vector {vector}) failed: {source}")]
    DevxQueryEqn {
        /// The completion vector.
        vector: u32,
        /// errno.
        source: io::Error,
    },
}

/// errno for an `int`-returning verb: positive errno, negative errno, or
/// `-1` with `errno` set all occur across rdma-core providers.
pub(crate) fn errno_from_rc(rc: i32) -> io::Error {
    match rc {
        -1 => nonzero(io::Error::last_os_error(), rc),
        rc if rc < 0 => io::Error::from_raw_os_error(-rc),
        rc => io::Error::from_raw_os_error(rc),
    }
}

/// errno for a pointer-returning verb that returned NULL.
pub(crate) fn errno_from_null() -> io::Error {
    nonzero(io::Error::last_os_error(), 0)
}

fn nonzero(e: io::Error, rc: i32) -> io::Error {
    if e.raw_os_error() == Some(0) {
        io::Error::other(format!("call failed (returned {rc}) without setting errno"))
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_conventions() {
        assert_eq!(errno_from_rc(22).raw_os_error(), Some(22));
        assert_eq!(errno_from_rc(-22).raw_os_error(), Some(22));
        let e = Error::QueryPort {
            port: 1,
            source: errno_from_rc(19),
        };
        assert!(e.to_string().starts_with("ibv_query_port(port 1) failed: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn devx_errors_name_the_command_status_and_syndrome() {
        let e = Error::DevxCmd {
            call: "mlx5dv_devx_obj_create",
            command: crate::prm::opcode_name(0x500),
            opcode: 0x500,
            status: 0x3,
            syndrome: 0x1a2b_3c4d,
            source: errno_from_rc(121),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("mlx5dv_devx_obj_create(CREATE_QP, opcode 0x500) failed: status 0x3 (BAD_PARAM_ERR), syndrome 0x1a2b3c4d: "),
            "{s}"
        );
    }

    #[test]
    fn short_devx_mailboxes_are_refused_before_any_call() {
        let verbs = crate::Verbs::load().expect("rdma-core (libibverbs1, ibverbs-providers): run scripts/setup.sh");
        let mut out = [0u8; 8];
        // SAFETY: refused before the context is used.
        let r = unsafe { verbs.devx_general_cmd(core::ptr::null_mut(), &[0u8; 4], &mut out) };
        assert!(matches!(r, Err(Error::DevxMailbox { in_len: 4, out_len: 8, .. })), "{r:?}");
    }
}
