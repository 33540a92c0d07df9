use doorbell_kernels::descriptor;

#[descriptor(size = 16, packed, colour = red)]
pub struct Seg {
    #[field(byte = 0, offset = 3)]
    pub a: u32,
    #[field(byte = 4, word = u24)]
    pub b: u32,
    #[field(byte = 8, endian = middle)]
    pub c: u32,
}

fn main() {}
