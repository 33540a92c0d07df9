//! DevX command mailboxes: the PRM commands IBGDA's set-up sends through
//! `mlx5dv_devx_obj_create` / `_modify` ([`crate::Verbs::devx_obj_create`]),
//! built as byte buffers with named fields.
//!
//! The PRM lays a mailbox out big-endian, fields addressed by bit offset
//! from the mailbox start (bit 0 is the most significant bit of byte 0)
//! and bit width, as `include/linux/mlx5/mlx5_ifc.h` declares them
//! (`u8 field[width]` arrays). [`Mailbox::set`] writes a [`Field`] at an
//! offset inside a [`Scope`] (the nested struct the field belongs to) and
//! records what it wrote ([`Mailbox::written`]); the test
//! `tests/prm_layout.rs` parses `mlx5_ifc.h` and checks every written
//! field's offset and width, and every opcode, against it.
//!
//! A few fields only DevX users set (the umem ids of a CQ's ring and
//! doorbell record and of a QP's doorbell record) are `reserved_*` in the
//! kernel's header, which never writes them; they are marked
//! [`Field::devx_only`], and the test checks that they lie inside a
//! reserved range of the header's struct.
//!
//! The module is cut along its layers: [`Field`]s and [`Scope`]s name the
//! PRM's layout (`fields`), a [`Mailbox`] writes them and reads a command's
//! answer (`mailbox`), and one function per command builds its mailbox from
//! plain parameters (`commands`).

mod commands;
mod fields;
mod mailbox;
#[cfg(test)]
mod tests;

pub use commands::{
    create_cq, create_qp, init2rtr, log2_floor, mtu_code, rst2init, rtr2rts, to_err, to_rst, transition_path, transition_qpc, CqParams,
    QpParams, RemoteAccess, RemoteAddress, RtrParams, RtsParams, CREATE_CQ_CQC, CREATE_QP_QPC,
};
pub use fields::{ads, cqc, create_cq, create_qp, hdr, qpc, Field, Scope};
pub use mailbox::{
    check_out, created_number, get_bits, input_opcode, opcode_name, output_status, status_name, Command, Mailbox, PrmError, Written,
    MBOX_HDR_BYTES,
};
