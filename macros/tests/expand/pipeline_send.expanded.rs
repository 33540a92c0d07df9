fn expansion() {
    let _ = {
        let __db_t = ::doorbell_kernels::pipeline::transport_value(&(t));
        let __db_ring: ::doorbell_kernels::pipeline::RingSet = ring;
        let __db_ctl: ::doorbell_kernels::pipeline::BlockCtl = ctl;
        let __db_chunks: ::doorbell_kernels::pipeline::BlockChunks = chunks;
        let __db_seq0: u64 = base;
        let __db_peer: u32 = next;
        let __db_elem_bytes: u64 = ::core::mem::size_of::<f32>() as u64;
        let __db_chunk_bytes = __db_chunks.chunk.checked_mul(__db_elem_bytes);
        if __db_chunks.chunk == 0 || __db_chunks.blocks == 0
            || __db_peer >= __db_ring.peers
            || !::core::matches!(
                __db_chunk_bytes, ::core::option::Option::Some(b) if b <= __db_ring
                .slot_bytes
            ) || __db_ring.slot_bytes % (::core::mem::align_of::<f32>() as u64) != 0
            || __db_ring.slots % (::core::mem::align_of::<f32>() as u64) != 0
        {
            ::doorbell_kernels::ptx::trap();
        }
        let mut __db_result: ::core::result::Result<
            (),
            ::doorbell_kernels::pipeline::Failed,
        > = ::core::result::Result::Ok(());
        let mut __db_j: u64 = 0;
        let __db_outbox: *mut f32 = outbox;
        while __db_j < __db_chunks.count() {
            let (__db_first, __db_len) = __db_chunks.range(__db_j);
            let __db_seq = __db_seq0 + __db_j;
            match unsafe {
                __db_ring.acquire_block(__db_t, __db_ctl, __db_seq, __db_peer)
            } {
                ::core::result::Result::Ok(v) => v,
                ::core::result::Result::Err(e) => {
                    __db_result = ::core::result::Result::Err(e);
                    break;
                }
            }
            'produce: {
                let first: u64 = __db_first;
                let len: u64 = __db_len;
                let buf: *mut f32 = __db_outbox;
                {
                    let mut i = tid;
                    while i < len {
                        unsafe { *buf.add(i as usize) = value(first + i) };
                        i += nthr;
                    }
                }
            }
            ::doorbell_kernels::ptx::sync_threads();
            match unsafe {
                __db_ring
                    .commit_block(
                        __db_t,
                        __db_seq,
                        __db_peer,
                        __db_outbox as *const u8,
                        __db_len * __db_elem_bytes,
                    )
            } {
                ::core::result::Result::Ok(v) => v,
                ::core::result::Result::Err(e) => {
                    __db_result = ::core::result::Result::Err(e);
                    break;
                }
            }
            __db_j += 1;
        }
        __db_result
    };
}
