/*
 * Byte-exact reference for mlx5 send WQEs and CQEs, built ONLY for tests.
 *
 * Everything here is derived from rdma-core's own <infiniband/mlx5dv.h>:
 * its inline helpers (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg), its
 * segment structs and its enum values. The Rust side of rdma-sys-ext
 * re-states these values by hand; the tests compare the two.
 *
 * Nothing in this file calls into libibverbs or libmlx5: only static
 * inline helpers and compile-time values are used, so the object links
 * without rdma-core's libraries.
 */
#include <endian.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

/* Mirror of rdma_sys_ext::shim::WqeParams' C form (RawWqeParams in Rust).
 * Field order: 8-byte fields, then 4-byte, then 2-byte, then 1-byte, so
 * the layout has no interior padding on any ABI. */
struct doorbell_wqe_params {
	uint64_t raddr;
	uint64_t laddr;
	uint64_t add;
	uint64_t compare;
	uint64_t swap;
	uint32_t op;
	uint32_t qpn;
	uint32_t rkey;
	uint32_t lkey;
	uint32_t len;
	uint32_t imm;
	uint16_t wqe_index;
	uint8_t signaled;
	uint8_t fence;
	uint8_t solicited;
};

enum {
	DOORBELL_OP_NOP = 0,
	DOORBELL_OP_WRITE = 1,
	DOORBELL_OP_WRITE_IMM = 2,
	DOORBELL_OP_READ = 3,
	DOORBELL_OP_FETCH_ADD = 4,
	DOORBELL_OP_COMPARE_SWAP = 5,
};

size_t doorbell_ref_params_size(void)
{
	return sizeof(struct doorbell_wqe_params);
}

/*
 * Build one WQE into buf (cap bytes). Returns the number of bytes written
 * (ds * 16), or -1 for an unknown op or a buffer that is too small.
 */
int doorbell_ref_wqe(const struct doorbell_wqe_params *p, uint8_t *buf,
		     size_t cap)
{
	uint8_t opcode;
	uint8_t ds;
	uint32_t imm = 0;
	uint8_t fm_ce_se = 0;

	switch (p->op) {
	case DOORBELL_OP_NOP:
		opcode = MLX5_OPCODE_NOP;
		ds = 1;
		break;
	case DOORBELL_OP_WRITE:
		opcode = MLX5_OPCODE_RDMA_WRITE;
		ds = 3;
		break;
	case DOORBELL_OP_WRITE_IMM:
		opcode = MLX5_OPCODE_RDMA_WRITE_IMM;
		ds = 3;
		/* mlx5dv_set_ctrl_seg stores imm "as is": the caller passes
		 * it already in network order (as ibv_send_wr.imm_data). */
		imm = htobe32(p->imm);
		break;
	case DOORBELL_OP_READ:
		opcode = MLX5_OPCODE_RDMA_READ;
		ds = 3;
		break;
	case DOORBELL_OP_FETCH_ADD:
		opcode = MLX5_OPCODE_ATOMIC_FA;
		ds = 4;
		break;
	case DOORBELL_OP_COMPARE_SWAP:
		opcode = MLX5_OPCODE_ATOMIC_CS;
		ds = 4;
		break;
	default:
		return -1;
	}

	if (cap < (size_t)ds * 16)
		return -1;
	memset(buf, 0, (size_t)ds * 16);

	if (p->fence)
		fm_ce_se |= MLX5_WQE_CTRL_FENCE;
	if (p->signaled)
		fm_ce_se |= MLX5_WQE_CTRL_CQ_UPDATE;
	if (p->solicited)
		fm_ce_se |= MLX5_WQE_CTRL_SOLICITED;

	/* Build in properly aligned locals, then copy out: buf may be any
	 * alignment. */
	struct mlx5_wqe_ctrl_seg ctrl;
	memset(&ctrl, 0, sizeof(ctrl));
	mlx5dv_set_ctrl_seg(&ctrl, p->wqe_index, opcode, 0,
			    p->qpn & 0xffffff, fm_ce_se, ds, 0, imm);
	memcpy(buf, &ctrl, sizeof(ctrl));
	if (ds == 1)
		return 16;

	struct mlx5_wqe_raddr_seg raddr;
	memset(&raddr, 0, sizeof(raddr));
	raddr.raddr = htobe64(p->raddr);
	raddr.rkey = htobe32(p->rkey);
	raddr.reserved = 0;
	memcpy(buf + 16, &raddr, sizeof(raddr));

	struct mlx5_wqe_data_seg data;
	if (ds == 3) {
		mlx5dv_set_data_seg(&data, p->len, p->lkey,
				    (uintptr_t)p->laddr);
		memcpy(buf + 32, &data, sizeof(data));
		return 48;
	}

	struct mlx5_wqe_atomic_seg atomic;
	if (p->op == DOORBELL_OP_FETCH_ADD) {
		atomic.swap_add = htobe64(p->add);
		atomic.compare = 0;
	} else {
		atomic.swap_add = htobe64(p->swap);
		atomic.compare = htobe64(p->compare);
	}
	memcpy(buf + 32, &atomic, sizeof(atomic));

	/* The 8-byte local buffer that receives the original remote value. */
	mlx5dv_set_data_seg(&data, 8, p->lkey, (uintptr_t)p->laddr);
	memcpy(buf + 48, &data, sizeof(data));
	return 64;
}

/*
 * Fill a 64-byte CQE the way the HCA writes it (all multi-byte fields
 * big-endian). Error opcodes (REQ_ERR, RESP_ERR) use struct mlx5_err_cqe,
 * where byte_cnt has no place; every other opcode uses struct mlx5_cqe64.
 */
void doorbell_ref_cqe(uint8_t opcode, uint8_t owner, uint16_t wqe_counter,
		      uint8_t syndrome, uint8_t vendor_syndrome, uint32_t qpn,
		      uint32_t byte_cnt, uint8_t out[64])
{
	_Static_assert(sizeof(struct mlx5_cqe64) == 64, "cqe64 size");
	_Static_assert(sizeof(struct mlx5_err_cqe) == 64, "err cqe size");

	if (opcode == MLX5_CQE_REQ_ERR || opcode == MLX5_CQE_RESP_ERR) {
		struct mlx5_err_cqe e;
		memset(&e, 0, sizeof(e));
		e.syndrome = syndrome;
		e.vendor_err_synd = vendor_syndrome;
		e.s_wqe_opcode_qpn = htobe32(qpn & 0xffffff);
		e.wqe_counter = htobe16(wqe_counter);
		e.op_own = (uint8_t)((opcode << 4) | (owner & MLX5_CQE_OWNER_MASK));
		memcpy(out, &e, sizeof(e));
	} else {
		struct mlx5_cqe64 c;
		memset(&c, 0, sizeof(c));
		c.byte_cnt = htobe32(byte_cnt);
		c.sop_drop_qpn = htobe32(qpn & 0xffffff);
		c.wqe_counter = htobe16(wqe_counter);
		c.op_own = (uint8_t)((opcode << 4) | (owner & MLX5_CQE_OWNER_MASK));
		memcpy(out, &c, sizeof(c));
	}
}

/* ---- header values, for comparison with the Rust constants ---------- */

struct doorbell_header_value {
	const char *name;
	uint64_t value;
};

#define V(x) { #x, (uint64_t)(x) }
#define SZ(t) { "sizeof(" #t ")", (uint64_t)sizeof(struct t) }
#define OFF(t, f) { "offsetof(" #t "," #f ")", (uint64_t)offsetof(struct t, f) }

static const struct doorbell_header_value doorbell_header_values[] = {
	/* send opcodes */
	V(MLX5_OPCODE_NOP),
	V(MLX5_OPCODE_SEND_INVAL),
	V(MLX5_OPCODE_RDMA_WRITE),
	V(MLX5_OPCODE_RDMA_WRITE_IMM),
	V(MLX5_OPCODE_SEND),
	V(MLX5_OPCODE_SEND_IMM),
	V(MLX5_OPCODE_TSO),
	V(MLX5_OPCODE_RDMA_READ),
	V(MLX5_OPCODE_ATOMIC_CS),
	V(MLX5_OPCODE_ATOMIC_FA),
	V(MLX5_OPCODE_ATOMIC_MASKED_CS),
	V(MLX5_OPCODE_ATOMIC_MASKED_FA),
	V(MLX5_OPCODE_FMR),
	V(MLX5_OPCODE_LOCAL_INVAL),
	V(MLX5_OPCODE_CONFIG_CMD),
	V(MLX5_OPCODE_SET_PSV),
	V(MLX5_OPCODE_UMR),
	V(MLX5_OPCODE_TAG_MATCHING),
	V(MLX5_OPCODE_FLOW_TBL_ACCESS),
	V(MLX5_OPCODE_MMO),
	/* ctrl segment flags and WQE geometry */
	V(MLX5_WQE_CTRL_CQ_UPDATE),
	V(MLX5_WQE_CTRL_SOLICITED),
	V(MLX5_WQE_CTRL_FENCE),
	V(MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE),
	V(MLX5_SEND_WQE_BB),
	V(MLX5_SEND_WQE_SHIFT),
	V(MLX5_INLINE_SEG),
	/* CQE opcodes */
	V(MLX5_CQE_OWNER_MASK),
	V(MLX5_CQE_REQ),
	V(MLX5_CQE_RESP_WR_IMM),
	V(MLX5_CQE_RESP_SEND),
	V(MLX5_CQE_RESP_SEND_IMM),
	V(MLX5_CQE_RESP_SEND_INV),
	V(MLX5_CQE_RESIZE_CQ),
	V(MLX5_CQE_NO_PACKET),
	V(MLX5_CQE_SIG_ERR),
	V(MLX5_CQE_REQ_ERR),
	V(MLX5_CQE_RESP_ERR),
	V(MLX5_CQE_INVALID),
	/* CQE error syndromes */
	V(MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR),
	V(MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR),
	V(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR),
	V(MLX5_CQE_SYNDROME_WR_FLUSH_ERR),
	V(MLX5_CQE_SYNDROME_MW_BIND_ERR),
	V(MLX5_CQE_SYNDROME_BAD_RESP_ERR),
	V(MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR),
	V(MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR),
	V(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR),
	V(MLX5_CQE_SYNDROME_REMOTE_OP_ERR),
	V(MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR),
	V(MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR),
	V(MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR),
	V(MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT),
	/* CQ doorbell */
	V(MLX5_CQ_DOORBELL),
	V(MLX5_CQ_DB_REQ_NOT_SOL),
	V(MLX5_CQ_DB_REQ_NOT),
	/* struct sizes */
	SZ(mlx5_wqe_ctrl_seg),
	SZ(mlx5_wqe_raddr_seg),
	SZ(mlx5_wqe_data_seg),
	SZ(mlx5_wqe_atomic_seg),
	SZ(mlx5_cqe64),
	SZ(mlx5_err_cqe),
	/* field offsets */
	OFF(mlx5_wqe_ctrl_seg, opmod_idx_opcode),
	OFF(mlx5_wqe_ctrl_seg, qpn_ds),
	OFF(mlx5_wqe_ctrl_seg, signature),
	OFF(mlx5_wqe_ctrl_seg, dci_stream_channel_id),
	OFF(mlx5_wqe_ctrl_seg, fm_ce_se),
	OFF(mlx5_wqe_ctrl_seg, imm),
	OFF(mlx5_wqe_raddr_seg, raddr),
	OFF(mlx5_wqe_raddr_seg, rkey),
	OFF(mlx5_wqe_data_seg, byte_count),
	OFF(mlx5_wqe_data_seg, lkey),
	OFF(mlx5_wqe_data_seg, addr),
	OFF(mlx5_wqe_atomic_seg, swap_add),
	OFF(mlx5_wqe_atomic_seg, compare),
	OFF(mlx5_cqe64, srqn_uidx),
	OFF(mlx5_cqe64, imm_inval_pkey),
	OFF(mlx5_cqe64, byte_cnt),
	OFF(mlx5_cqe64, timestamp),
	OFF(mlx5_cqe64, sop_drop_qpn),
	OFF(mlx5_cqe64, wqe_counter),
	OFF(mlx5_cqe64, signature),
	OFF(mlx5_cqe64, op_own),
	OFF(mlx5_err_cqe, srqn),
	OFF(mlx5_err_cqe, vendor_err_synd),
	OFF(mlx5_err_cqe, syndrome),
	OFF(mlx5_err_cqe, s_wqe_opcode_qpn),
	OFF(mlx5_err_cqe, wqe_counter),
	OFF(mlx5_err_cqe, signature),
	OFF(mlx5_err_cqe, op_own),
};

const struct doorbell_header_value *doorbell_ref_header_values(size_t *count)
{
	*count = sizeof(doorbell_header_values) / sizeof(doorbell_header_values[0]);
	return doorbell_header_values;
}
