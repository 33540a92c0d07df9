use doorbell_kernels::descriptor;

#[descriptor(size = 8)]
pub struct Seg {
    #[field(byte = 0, word = u32, bit = 0, width = 12)]
    pub a: u16,
    // Bits 8..16 of the same word: shares bits 8..12 with `a`.
    #[field(byte = 0, word = u32, bit = 8, width = 8)]
    pub b: u8,
    // Byte 3 is the low byte of the big-endian word at 0: `a` again.
    #[field(byte = 3)]
    pub c: u8,
    #[field(byte = 4)]
    pub d: u32,
}

fn main() {
    // The struct is still emitted: naming it causes no further errors.
    let _ = Seg { a: 1, b: 2, c: 3, d: 4 };
}
