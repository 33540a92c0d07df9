//! Checks the model: a size, every field placed inside it, widths that fit,
//! no two fields sharing a bit. Produces one [`Layout`] per field.

use super::{DescriptorModel, Endian, Errors, FieldModel, Layout, Prim};

/// Largest descriptor accepted (bytes): far above any NIC descriptor, small
/// enough that a mistyped size is caught.
const MAX_SIZE: u64 = 4096;

pub(crate) fn validate(m: &DescriptorModel, errors: &mut Errors) -> Vec<Layout> {
    let size = match m.size {
        None => {
            errors.push(syn::Error::new_spanned(
                &m.item.ident,
                "missing the descriptor size: write `#[descriptor(size = BYTES)]`",
            ));
            None
        }
        Some(s) if s.value == 0 || s.value % 4 != 0 || s.value > MAX_SIZE => {
            errors.at(
                s.span,
                format!(
                    "a descriptor size must be a multiple of 4 bytes between 4 and {MAX_SIZE}, not {}",
                    s.value
                ),
            );
            None
        }
        Some(s) => Some(s.value),
    };
    let layouts: Vec<Layout> = m
        .fields
        .iter()
        .filter_map(|f| field_layout(f, m.endian.value, size, errors))
        .collect();
    if let Some(size) = size {
        check_overlaps(&layouts, &m.fields, size as usize, errors);
    }
    layouts
}

fn field_layout(f: &FieldModel, default_endian: Endian, size: Option<u64>, errors: &mut Errors) -> Option<Layout> {
    let name = &f.ident;
    if !f.has_attr {
        errors.push(syn::Error::new_spanned(
            &f.ident,
            format!("field `{name}` has no place in the descriptor: add `#[field(byte = N)]`"),
        ));
        return None;
    }
    let mut ok = true;
    let Some(ty) = f.prim else {
        errors.push(syn::Error::new_spanned(
            &f.ty,
            "a descriptor field is `u8`, `u16`, `u32`, `u64` or `bool`",
        ));
        return None;
    };
    let Some(byte) = f.byte else {
        errors.push(syn::Error::new_spanned(
            &f.attr_tokens,
            format!("field `{name}` needs its byte offset: `byte = N`"),
        ));
        return None;
    };
    let word = match f.word {
        Some(w) => w.value?, // unknown word names were reported by parse
        None => {
            if ty == Prim::Bool {
                Prim::U8
            } else {
                ty
            }
        }
    };
    let word_bits = word.value_bits() as u64;
    let bit = f.bit.map(|b| b.value).unwrap_or(0);
    let width = f.width.map(|w| w.value).unwrap_or(ty.value_bits() as u64);
    let width_span = f.width.map(|w| w.span);
    // An error on an option's token, or on the whole attribute when the
    // option was left to its default.
    let mut err = |span: Option<proc_macro2::Span>, msg: String| match span {
        Some(s) => errors.at(s, msg),
        None => errors.push(syn::Error::new_spanned(&f.attr_tokens, msg)),
    };
    if width == 0 {
        err(width_span, format!("field `{name}` has width 0; a field is at least 1 bit wide"));
        ok = false;
    } else if width > 64 {
        err(
            width_span,
            format!("field `{name}` is {width} bits wide; fields are at most 64 bits"),
        );
        ok = false;
    } else if width > ty.value_bits() as u64 {
        err(
            width_span,
            format!("a {width}-bit field does not fit in its type `{}`", type_name(ty)),
        );
        ok = false;
    } else if bit >= word_bits || bit + width > word_bits {
        err(
            f.bit.map(|b| b.span).or(width_span),
            format!(
                "bits {bit}..{} of field `{name}` do not fit in its {word_bits}-bit container word (`word = {}`)",
                bit + width,
                type_name(word)
            ),
        );
        ok = false;
    }
    if let Some(size) = size {
        let end = byte.value + word.bytes() as u64;
        if end > size {
            err(
                Some(byte.span),
                format!(
                    "field `{name}` spans bytes {}..{end}, past the end of the {size}-byte descriptor",
                    byte.value
                ),
            );
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    Some(Layout {
        ident: f.ident.clone(),
        ty,
        byte: byte.value as u32,
        word_bytes: word.bytes(),
        bit: bit as u32,
        width: width as u32,
        endian: f.endian.map(|e| e.value).unwrap_or(default_endian),
    })
}

fn type_name(p: Prim) -> &'static str {
    match p {
        Prim::Bool => "bool",
        Prim::U8 => "u8",
        Prim::U16 => "u16",
        Prim::U32 => "u32",
        Prim::U64 => "u64",
    }
}

/// The bits a field occupies in memory: (byte index, bit mask in that byte).
pub(crate) fn memory_bits(l: &Layout) -> Vec<(usize, u8)> {
    let n = l.word_bytes;
    let mask: u128 = ((1u128 << l.width) - 1) << l.bit;
    (0..n)
        .filter_map(|k| {
            let shift = match l.endian {
                Endian::Big => 8 * (n - 1 - k),
                Endian::Little => 8 * k,
            };
            let m = ((mask >> shift) & 0xff) as u8;
            (m != 0).then_some(((l.byte + k) as usize, m))
        })
        .collect()
}

fn check_overlaps(layouts: &[Layout], fields: &[FieldModel], size: usize, errors: &mut Errors) {
    // Owner of each bit of the image, by layout index.
    let mut owner: Vec<[Option<usize>; 8]> = vec![[None; 8]; size];
    for (i, l) in layouts.iter().enumerate() {
        let mut clash: Option<(usize, usize)> = None;
        for (byte, m) in memory_bits(l) {
            for (b, bit_owner) in owner[byte].iter_mut().enumerate() {
                if m & (1 << b) == 0 {
                    continue;
                }
                match *bit_owner {
                    Some(j) if clash.is_none() => clash = Some((j, byte)),
                    Some(_) => {}
                    None => *bit_owner = Some(i),
                }
            }
        }
        if let Some((j, byte)) = clash {
            let other = &layouts[j].ident;
            let msg = format!("field `{}` overlaps field `{other}` (first shared bits in byte {byte})", l.ident);
            match fields.iter().find(|f| f.ident == l.ident) {
                Some(f) => errors.push(syn::Error::new_spanned(&f.attr_tokens, msg)),
                None => errors.at(l.ident.span(), msg),
            }
        }
    }
}
