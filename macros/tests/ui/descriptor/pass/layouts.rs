//! Accepted layouts encode as documented, in const context too.
use doorbell_kernels::descriptor;

#[descriptor(size = 16, endian = big)]
#[derive()]
/// A segment with a big-endian u64 that straddles words, packed sub-word
/// fields and a little-endian override.
pub struct Mixed {
    #[field(byte = 0, word = u32, bit = 0, width = 8)]
    pub opcode: u8,
    #[field(byte = 0, word = u32, bit = 8, width = 16)]
    pub index: u16,
    #[field(byte = 0, word = u32, bit = 31, width = 1)]
    pub top: bool,
    /// Bytes 4..12: spans memory words 1 and 2.
    #[field(byte = 4)]
    pub addr: u64,
    #[field(byte = 13)]
    pub odd: u16,
    #[field(byte = 15, word = u8, bit = 4, width = 4, endian = little)]
    pub nibble: u8,
}

const M: Mixed = Mixed { opcode: 0x12, index: 0x3456, top: true, addr: 0x0102_0304_0506_0708, odd: 0xa1b2, nibble: 0xc };
const B: [u8; 16] = M.to_bytes();
const _: () = assert!(B[0] == 0x80 && B[1] == 0x34 && B[2] == 0x56 && B[3] == 0x12);
const _: () = assert!(B[4] == 0x01 && B[11] == 0x08);
const _: () = assert!(B[12] == 0 && B[13] == 0xa1 && B[14] == 0xb2 && B[15] == 0xc0);
const _: () = assert!(Mixed::SIZE == 16 && Mixed::WORDS == 4 && Mixed::INDEX_MAX == 0xffff && Mixed::ADDR_BYTE == 4);

#[descriptor(size = 8, endian = little)]
struct Le {
    #[field(byte = 2, word = u32, bit = 4, width = 20)]
    value: u32,
}

fn main() {
    assert_eq!(Mixed::from_bytes(&B), M);
    assert_eq!(Mixed::get_addr(&B), M.addr);
    let mut w = M.to_words();
    Mixed::set_odd_words(&mut w, 0xffff);
    assert_eq!(Mixed::from_words(&w), Mixed { odd: 0xffff, ..M });
    // 16-byte stores need 16-byte alignment (the emulator checks, as the GPU faults).
    #[repr(C, align(16))]
    struct Aligned([u32; 4]);
    let mut buf = Aligned([0u32; 4]);
    // SAFETY: 16 aligned bytes.
    unsafe { M.store(buf.0.as_mut_ptr()) };
    assert_eq!(buf.0, M.to_words());
    assert_eq!(unsafe { Mixed::load_words(buf.0.as_ptr()) }, buf.0);

    let le = Le { value: 0xabcde };
    // Container bytes 2..6 little-endian hold 0xabcde << 4 = 0x00abcde0.
    assert_eq!(le.to_bytes(), [0, 0, 0xe0, 0xcd, 0xab, 0x00, 0, 0]);
    assert_eq!(Le::LAYOUT, [("value", 2, 4, 4, 20)]);
}
