use doorbell_kernels::descriptor;

#[descriptor(size = 16, endian = big)]
pub struct Seg {
    #[field(byte = 8)]
    pub addr: u64,
    #[field(byte = 14)]
    pub key: u32,
    #[field(byte = 16, word = u8, bit = 0, width = 1)]
    pub flag: bool,
}

fn main() {}
