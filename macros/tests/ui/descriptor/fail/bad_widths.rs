use doorbell_kernels::descriptor;

#[descriptor(size = 32)]
pub struct Seg {
    #[field(byte = 0, width = 0)]
    pub zero: u32,
    #[field(byte = 8, width = 65)]
    pub too_wide: u64,
    #[field(byte = 16, word = u32, bit = 8, width = 25)]
    pub does_not_fit_the_word: u32,
    #[field(byte = 20, word = u32, bit = 0, width = 24)]
    pub does_not_fit_the_type: u16,
    #[field(byte = 24, word = u16, bit = 16, width = 1)]
    pub bit_past_the_word: bool,
}

fn main() {}
