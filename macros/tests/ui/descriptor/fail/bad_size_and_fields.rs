use doorbell_kernels::descriptor;

#[descriptor(size = 10)]
pub struct BadSize {
    #[field(byte = 0)]
    pub a: u32,
}

#[descriptor(endian = little)]
pub struct NoSize {
    #[field(byte = 0)]
    pub a: u32,
}

#[descriptor(size = 8)]
pub struct BadFields {
    pub no_attribute: u32,
    #[field(word = u32)]
    pub no_byte: u32,
    #[field(byte = 4)]
    pub not_an_integer: i32,
}

#[descriptor(size = 8)]
pub struct Tuple(u32, u32);

fn main() {}
