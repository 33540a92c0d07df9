fn expansion() {
    let _ = {
        let __db_t = ::doorbell_kernels::pipeline::transport_value(&(t));
        let __db_ring: ::doorbell_kernels::pipeline::RingSet = ring;
        let __db_ctl: ::doorbell_kernels::pipeline::BlockCtl = ctl;
        let __db_chunks: ::doorbell_kernels::pipeline::BlockChunks = chunks;
        let __db_seq0: u64 = base;
        let __db_peer: u32 = prev;
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
        while __db_j < __db_chunks.count() {
            let (__db_first, __db_len) = __db_chunks.range(__db_j);
            let __db_seq = __db_seq0 + __db_j;
            let __db_slot = (match unsafe {
                __db_ring.wait_block(__db_t, __db_ctl, __db_seq, __db_peer)
            } {
                ::core::result::Result::Ok(v) => v,
                ::core::result::Result::Err(e) => {
                    __db_result = ::core::result::Result::Err(e);
                    break;
                }
            }) as *const f32;
            'consume: {
                let first: u64 = __db_first;
                let len: u64 = __db_len;
                let slot: *const f32 = __db_slot;
                {
                    let mut i = tid;
                    while i < len {
                        unsafe {
                            *out.add((first + i) as usize) = *slot.add(i as usize)
                        };
                        i += nthr;
                    }
                }
            }
            match unsafe {
                __db_ring.release_block(__db_t, __db_ctl, __db_seq, __db_peer)
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
