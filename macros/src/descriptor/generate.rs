//! [`Layout`]s → code: the struct, host encoders/decoders on byte and word
//! images, and the device builder (`to_words` in registers, `store` with
//! 16-byte stores).
//!
//! Memory words: word `i` is bytes `4i..4i+4` read as a little-endian `u32`,
//! which is what a 32-bit store writes on the GPU and on little-endian hosts.
//! A field's container may span several words; each word gets the part of
//! the field that lands in its bytes, computed from the value in registers,
//! so building a descriptor never reads memory.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::{DescriptorModel, Endian, Layout, Prim};

/// The bytes `k0..k1` of a field's container that fall in memory word `word`.
struct Chunk {
    word: u32,
    k0: u32,
    k1: u32,
}

fn chunks(l: &Layout) -> Vec<Chunk> {
    let n = l.word_bytes;
    let b = l.byte;
    let field_mask: u128 = ((1u128 << l.width) - 1) << l.bit;
    (b / 4..=(b + n - 1) / 4)
        .map(|w| Chunk {
            word: w,
            k0: (4 * w).saturating_sub(b),
            k1: (4 * w + 4 - b).min(n),
        })
        .filter(|c| {
            // Skip words that hold only bits of the container the field does not use.
            let (lo, hi) = container_bits(l, c);
            let span: u128 = ((1u128 << (hi - lo)) - 1) << lo;
            field_mask & span != 0
        })
        .collect()
}

/// Container-value bit range `lo..hi` stored in the chunk's bytes.
fn container_bits(l: &Layout, c: &Chunk) -> (u32, u32) {
    match l.endian {
        Endian::Big => (8 * (l.word_bytes - c.k1), 8 * (l.word_bytes - c.k0)),
        Endian::Little => (8 * c.k0, 8 * c.k1),
    }
}

/// Shift of the chunk inside its memory word.
fn word_shift(l: &Layout, c: &Chunk) -> u32 {
    8 * ((l.byte + c.k0) % 4)
}

/// The chunk's contribution to its word, for container value `cv` (a `u64`
/// expression). Mirrors [`contribution_value`].
fn contribution_expr(l: &Layout, c: &Chunk, cv: &TokenStream) -> TokenStream {
    let m = c.k1 - c.k0;
    let (lo, _) = container_bits(l, c);
    let lo = Literal::u32_unsuffixed(lo);
    let mask = Literal::u64_suffixed(if m == 8 { u64::MAX } else { (1u64 << (8 * m)) - 1 });
    let sh = Literal::u32_unsuffixed(word_shift(l, c));
    match l.endian {
        Endian::Big => {
            let down = Literal::u32_unsuffixed(32 - 8 * m);
            quote! { (((((#cv >> #lo) & #mask) as u32).swap_bytes() >> #down) << #sh) }
        }
        Endian::Little => quote! { ((((#cv >> #lo) & #mask) as u32) << #sh) },
    }
}

/// [`contribution_expr`] evaluated now (for masks).
fn contribution_value(l: &Layout, c: &Chunk, cv: u64) -> u32 {
    let m = c.k1 - c.k0;
    let (lo, _) = container_bits(l, c);
    let s = (cv >> lo) & if m == 8 { u64::MAX } else { (1u64 << (8 * m)) - 1 };
    match l.endian {
        Endian::Big => ((s as u32).swap_bytes() >> (32 - 8 * m)) << word_shift(l, c),
        Endian::Little => (s as u32) << word_shift(l, c),
    }
}

/// The part of the container value held by the chunk, from word `w` (a `u32`
/// expression), as a `u64` in container position.
fn extract_expr(l: &Layout, c: &Chunk, w: &TokenStream) -> TokenStream {
    let m = c.k1 - c.k0;
    let (lo, _) = container_bits(l, c);
    let lo = Literal::u32_unsuffixed(lo);
    let sh = Literal::u32_unsuffixed(word_shift(l, c));
    let mask32 = Literal::u32_suffixed(if m == 4 { u32::MAX } else { (1u32 << (8 * m)) - 1 });
    match l.endian {
        Endian::Big => {
            let up = Literal::u32_unsuffixed(32 - 8 * m);
            quote! { (((((#w >> #sh) & #mask32) << #up).swap_bytes() as u64) << #lo) }
        }
        Endian::Little => quote! { ((((#w >> #sh) & #mask32) as u64) << #lo) },
    }
}

fn field_mask(l: &Layout) -> u64 {
    if l.width == 64 {
        u64::MAX
    } else {
        (1u64 << l.width) - 1
    }
}

fn rust_type(p: Prim) -> TokenStream {
    match p {
        Prim::Bool => quote!(bool),
        Prim::U8 => quote!(u8),
        Prim::U16 => quote!(u16),
        Prim::U32 => quote!(u32),
        Prim::U64 => quote!(u64),
    }
}

/// `v` (of the field's type) → container value (`u64`, field bits in place).
fn to_container(l: &Layout, v: &TokenStream) -> TokenStream {
    let mask = Literal::u64_suffixed(field_mask(l));
    let bit = Literal::u32_unsuffixed(l.bit);
    quote! { (((#v as u64) & #mask) << #bit) }
}

/// Container value → field value.
fn from_container(l: &Layout, cv: &TokenStream) -> TokenStream {
    let mask = Literal::u64_suffixed(field_mask(l));
    let bit = Literal::u32_unsuffixed(l.bit);
    match l.ty {
        Prim::Bool => quote! { ((#cv >> #bit) & #mask) != 0 },
        other => {
            let t = rust_type(other);
            quote! { ((#cv >> #bit) & #mask) as #t }
        }
    }
}

fn describe(l: &Layout) -> String {
    let endian = match (l.endian, l.word_bytes) {
        (_, 1) => "",
        (Endian::Big, _) => "big-endian ",
        (Endian::Little, _) => "little-endian ",
    };
    format!(
        "bits {}..{} of the {endian}{}-bit word at byte {}",
        l.bit,
        l.bit + l.width,
        l.word_bytes * 8,
        l.byte
    )
}

/// The field's name without a raw-identifier prefix (`r#type` → `type`), as
/// used in accessor and constant names.
fn plain_name(l: &Layout) -> String {
    l.ident.to_string().trim_start_matches("r#").to_string()
}

/// `get_<field>_words`: the word-image reader, which `from_words` calls too.
fn word_getter(l: &Layout) -> syn::Ident {
    format_ident!("get_{}_words", plain_name(l))
}

/// The body of `to_words`: one `let __cv_<field>` per field (its container
/// value), then one OR-expression per memory word (`0u32` for a word no field
/// touches).
fn to_words_body(layouts: &[Layout], nwords: usize) -> (Vec<TokenStream>, Vec<TokenStream>) {
    let mut word_terms: Vec<Vec<TokenStream>> = vec![Vec::new(); nwords];
    let mut cv_lets = Vec::new();
    for l in layouts {
        let f = &l.ident;
        let cv = format_ident!("__cv_{}", f);
        let v = quote!(self.#f);
        let into = to_container(l, &v);
        cv_lets.push(quote! { let #cv: u64 = #into; });
        for c in chunks(l) {
            word_terms[c.word as usize].push(contribution_expr(l, &c, &quote!(#cv)));
        }
    }
    let word_exprs = word_terms
        .iter()
        .map(|t| if t.is_empty() { quote!(0u32) } else { quote!(#(#t)|*) })
        .collect();
    (cv_lets, word_exprs)
}

/// The field's `<FIELD>_MAX` and `<FIELD>_BYTE` constants.
fn field_consts(l: &Layout) -> TokenStream {
    let fname_plain = plain_name(l);
    let max_c = format_ident!("{}_MAX", fname_plain.to_uppercase());
    let byte_c = format_ident!("{}_BYTE", fname_plain.to_uppercase());
    let where_ = describe(l);
    let max = Literal::u64_suffixed(field_mask(l));
    let byte = Literal::usize_unsuffixed(l.byte as usize);
    quote! {
        #[doc = concat!("Largest value `", #fname_plain, "` holds (", #where_, ").")]
        pub const #max_c: u64 = #max;
        #[doc = concat!("Byte offset of the word that holds `", #fname_plain, "`.")]
        pub const #byte_c: usize = #byte;
    }
}

/// The field's row in `LAYOUT`: (name, byte, container bytes, bit, width).
fn layout_row(l: &Layout) -> TokenStream {
    let fname_plain = plain_name(l);
    let (b, wb, bit, width) = (l.byte, l.word_bytes, l.bit, l.width);
    quote! { (#fname_plain, #b, #wb, #bit, #width) }
}

/// The field's getters and setters on word images (`get_<f>_words`,
/// `set_<f>_words`) and on byte images (`get_<f>`, `set_<f>`).
fn field_accessors(l: &Layout, size_lit: &Literal, nwords_lit: &Literal) -> TokenStream {
    let fname_plain = plain_name(l);
    let t = rust_type(l.ty);
    let get = format_ident!("get_{}", fname_plain);
    let set = format_ident!("set_{}", fname_plain);
    let get_w = word_getter(l);
    let set_w = format_ident!("set_{}_words", fname_plain);
    let where_ = describe(l);

    // Reader: OR together the container's bytes from each word it spans.
    let parts: Vec<TokenStream> = chunks(l)
        .iter()
        .map(|c| {
            let i = Literal::usize_unsuffixed(c.word as usize);
            extract_expr(l, c, &quote!(w[#i]))
        })
        .collect();
    let cv_get = quote!(__cv);
    let out = from_container(l, &cv_get);
    // Writer: in each word it spans, clear the field's bits and OR in the new ones.
    let v = quote!(v);
    let into = to_container(l, &v);
    let stores: Vec<TokenStream> = chunks(l)
        .iter()
        .map(|c| {
            let i = Literal::usize_unsuffixed(c.word as usize);
            let keep = Literal::u32_suffixed(!contribution_value(l, c, field_mask(l) << l.bit));
            let add = contribution_expr(l, c, &quote!(__cv));
            quote! { w[#i] = (w[#i] & #keep) | #add; }
        })
        .collect();
    quote! {
        #[doc = concat!("Reads `", #fname_plain, "` (", #where_, ") from a word image.")]
        #[inline(always)]
        pub const fn #get_w(w: &[u32; #nwords_lit]) -> #t {
            let __cv: u64 = #(#parts)|*;
            #out
        }
        #[doc = concat!("Writes `", #fname_plain, "` into a word image; other fields keep their bits, bits of `v` above the field's width are dropped.")]
        #[inline(always)]
        pub const fn #set_w(w: &mut [u32; #nwords_lit], v: #t) {
            let __cv: u64 = #into;
            #(#stores)*
        }
        #[doc = concat!("Reads `", #fname_plain, "` (", #where_, ") from a byte image.")]
        #[inline(always)]
        pub const fn #get(b: &[u8; #size_lit]) -> #t {
            Self::#get_w(&Self::bytes_to_words(b))
        }
        #[doc = concat!("Writes `", #fname_plain, "` into a byte image; see `", stringify!(#set_w), "`.")]
        #[inline(always)]
        pub const fn #set(b: &mut [u8; #size_lit], v: #t) {
            let mut w = Self::bytes_to_words(b);
            Self::#set_w(&mut w, v);
            *b = Self::words_to_bytes(&w);
        }
    }
}

/// The device memory methods: `store`, `store_words` (16-byte stores, then
/// 4-byte stores for a tail that is not a whole 16 bytes) and `load_words`
/// (the same split for loads).
fn memory_methods(nwords: usize) -> TokenStream {
    let nwords_lit = Literal::usize_unsuffixed(nwords);
    let full = nwords / 4;
    let v4_stores = (0..full).map(|c| {
        let (a, b, cc, d) = (4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3);
        quote! { ::doorbell_kernels::ptx::st_v4_u32(dst.add(#a), [w[#a], w[#b], w[#cc], w[#d]]); }
    });
    let tail_stores = (4 * full..nwords).map(|i| quote! { ::core::ptr::write_volatile(dst.add(#i), w[#i]); });
    let v4_loads = (0..full).map(|c| {
        let a = 4 * c;
        quote! {
            let q = ::doorbell_kernels::ptx::ld_v4_u32(src.add(#a));
            w[#a] = q[0]; w[#a + 1] = q[1]; w[#a + 2] = q[2]; w[#a + 3] = q[3];
        }
    });
    let tail_loads = (4 * full..nwords).map(|i| quote! { w[#i] = ::core::ptr::read_volatile(src.add(#i)); });
    let store_doc = if nwords.is_multiple_of(4) {
        format!("with {} 16-byte stores (`st.v4.u32`)", nwords / 4)
    } else {
        "with 16-byte stores (`st.v4.u32`) and 4-byte stores for the tail".to_string()
    };
    quote! {
        #[doc = concat!("Device builder: writes the descriptor at `dst` ", #store_doc, ", each word computed in registers (no read-modify-write).")]
        ///
        /// # Safety
        /// `dst` is valid for `SIZE` bytes of writes and 16-byte aligned.
        #[inline(always)]
        pub unsafe fn store(&self, dst: *mut u32) {
            Self::store_words(dst, &self.to_words())
        }

        /// Writes a word image at `dst` (see [`Self::store`]).
        ///
        /// # Safety
        /// As for [`Self::store`].
        #[inline(always)]
        pub unsafe fn store_words(dst: *mut u32, w: &[u32; #nwords_lit]) {
            // SAFETY: the caller guarantees SIZE writable, 16-byte aligned bytes.
            unsafe {
                #(#v4_stores)*
                #(#tail_stores)*
            }
        }

        /// Reads a word image from `src` with 16-byte loads (weak: order it
        /// with an acquire or fence before calling).
        ///
        /// # Safety
        /// `src` is valid for `SIZE` bytes of reads and 16-byte aligned.
        #[inline(always)]
        pub unsafe fn load_words(src: *const u32) -> [u32; #nwords_lit] {
            let mut w = [0u32; #nwords_lit];
            // SAFETY: the caller guarantees SIZE readable, 16-byte aligned bytes.
            unsafe {
                #(#v4_loads)*
                #(#tail_loads)*
            }
            w
        }
    }
}

/// The descriptor struct (with its derives) and its `impl`: sizes, `LAYOUT`,
/// per-field constants, whole-descriptor encoders/decoders, the device memory
/// methods and per-field accessors.
pub(crate) fn generate(m: &DescriptorModel, layouts: &[Layout]) -> TokenStream {
    let item = &m.item;
    let name = &item.ident;
    let size = m.size.expect("validated").value as usize;
    let nwords = size / 4;
    let size_lit = Literal::usize_unsuffixed(size);
    let nwords_lit = Literal::usize_unsuffixed(nwords);

    let (cv_lets, word_exprs) = to_words_body(layouts, nwords);
    let consts = layouts.iter().map(field_consts);
    let layout_rows = layouts.iter().map(layout_row);
    let from_fields = layouts.iter().map(|l| {
        let (f, get_w) = (&l.ident, word_getter(l));
        quote! { #f: Self::#get_w(w) }
    });
    let accessors = layouts.iter().map(|l| field_accessors(l, &size_lit, &nwords_lit));
    let memory = memory_methods(nwords);
    let nfields = layouts.len();

    quote! {
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #item

        #[allow(dead_code, clippy::identity_op, clippy::erasing_op, clippy::unnecessary_cast)]
        impl #name {
            /// Size of the descriptor in bytes.
            pub const SIZE: usize = #size_lit;
            /// Size of the descriptor in 32-bit memory words.
            pub const WORDS: usize = #nwords_lit;
            /// Every field: (name, byte offset of its container word, container
            /// bytes, bit offset in the container's value, width in bits).
            pub const LAYOUT: [(&'static str, u32, u32, u32, u32); #nfields] = [#(#layout_rows),*];
            #(#consts)*

            /// Device builder: the descriptor as memory words, assembled in
            /// registers (no memory is read; unset bits are zero).
            #[inline(always)]
            pub const fn to_words(&self) -> [u32; #nwords_lit] {
                #(#cv_lets)*
                [#(#word_exprs),*]
            }

            /// Decodes every field from a word image.
            #[inline(always)]
            pub const fn from_words(w: &[u32; #nwords_lit]) -> Self {
                Self { #(#from_fields),* }
            }

            /// Host encoder: the descriptor's bytes as the NIC reads them.
            #[inline(always)]
            pub const fn to_bytes(&self) -> [u8; #size_lit] {
                Self::words_to_bytes(&self.to_words())
            }

            /// Decodes every field from a byte image.
            #[inline(always)]
            pub const fn from_bytes(b: &[u8; #size_lit]) -> Self {
                Self::from_words(&Self::bytes_to_words(b))
            }

            /// Byte image → word image (word `i` = bytes `4i..4i+4`, little-endian).
            #[inline(always)]
            pub const fn bytes_to_words(b: &[u8; #size_lit]) -> [u32; #nwords_lit] {
                ::doorbell_kernels::layout::bytes_to_words(b)
            }

            /// Word image → byte image.
            #[inline(always)]
            pub const fn words_to_bytes(w: &[u32; #nwords_lit]) -> [u8; #size_lit] {
                ::doorbell_kernels::layout::words_to_bytes(w)
            }

            #memory

            #(#accessors)*
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(byte: u32, word_bytes: u32, bit: u32, width: u32, endian: Endian) -> Layout {
        Layout {
            ident: format_ident!("f"),
            ty: Prim::U64,
            byte,
            word_bytes,
            bit,
            width,
            endian,
        }
    }

    /// Reference: the field's bytes computed one byte at a time.
    fn bytes_of(l: &Layout, v: u64, size: usize) -> Vec<u8> {
        let cv = ((v & field_mask(l)) as u128) << l.bit;
        let mut out = vec![0u8; size];
        for k in 0..l.word_bytes {
            let shift = match l.endian {
                Endian::Big => 8 * (l.word_bytes - 1 - k),
                Endian::Little => 8 * k,
            };
            out[(l.byte + k) as usize] = (cv >> shift) as u8;
        }
        out
    }

    #[test]
    fn chunk_contributions_match_a_byte_by_byte_reference_for_every_placement() {
        for endian in [Endian::Big, Endian::Little] {
            for word_bytes in [1u32, 2, 4, 8] {
                for byte in 0..8u32 {
                    for (bit, width) in [(0, 1), (0, word_bytes * 8), (3, word_bytes * 8 - 5), (word_bytes * 8 - 1, 1)] {
                        if width == 0 || bit + width > word_bytes * 8 {
                            continue;
                        }
                        let l = layout(byte, word_bytes, bit, width, endian);
                        let v = 0x8123_4567_89ab_cdefu64;
                        let cv = (v & field_mask(&l)) << l.bit;
                        let mut words = [0u32; 4];
                        for c in chunks(&l) {
                            words[c.word as usize] |= contribution_value(&l, &c, cv);
                        }
                        let got: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                        assert_eq!(got, bytes_of(&l, v, 16), "{l:?}");
                    }
                }
            }
        }
    }
}
