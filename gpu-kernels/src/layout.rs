//! Byte images ↔ word images of descriptors (used by `#[descriptor]`'s
//! generated code and by the WQE encoders). Word `i` holds bytes
//! `4i..4i+4` in little-endian order — the order in which a 32-bit store
//! writes them.

/// Word image → byte image. `B` must be `4 * W` (checked at compile time
/// where the call is const-evaluated, at run time otherwise).
#[inline(always)]
pub const fn words_to_bytes<const W: usize, const B: usize>(w: &[u32; W]) -> [u8; B] {
    assert!(B == 4 * W, "a byte image holds 4 bytes per word");
    let mut b = [0u8; B];
    let mut i = 0;
    while i < W {
        let x = w[i].to_le_bytes();
        b[4 * i] = x[0];
        b[4 * i + 1] = x[1];
        b[4 * i + 2] = x[2];
        b[4 * i + 3] = x[3];
        i += 1;
    }
    b
}

/// Byte image → word image. `B` must be `4 * W`.
#[inline(always)]
pub const fn bytes_to_words<const B: usize, const W: usize>(b: &[u8; B]) -> [u32; W] {
    assert!(B == 4 * W, "a byte image holds 4 bytes per word");
    let mut w = [0u32; W];
    let mut i = 0;
    while i < W {
        w[i] = u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        i += 1;
    }
    w
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_order() {
        let w = [0x0403_0201u32, 0x0807_0605];
        let b: [u8; 8] = super::words_to_bytes(&w);
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(super::bytes_to_words::<8, 2>(&b), w);
    }
}
