//! `#[descriptor]`: a DSL for NIC descriptor layouts (mlx5 WQE segments,
//! CQEs, ...), split into [`parse`] → [`validate`] → [`generate`].
//!
//! The parsed model keeps the tokens of every option so errors point at the
//! offending token; all errors of an item are reported at once, and on error
//! the struct is still emitted (with the `#[field]` helper attributes
//! removed) so later code that names it keeps compiling.

use proc_macro2::{Span, TokenStream};
use quote::quote;

mod generate;
mod parse;
mod validate;

/// Byte order of a multi-byte container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endian {
    Big,
    Little,
}

/// An unsigned integer type: a field's Rust type or its container word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prim {
    Bool,
    U8,
    U16,
    U32,
    U64,
}

impl Prim {
    pub(crate) fn from_ident(s: &str) -> Option<Prim> {
        Some(match s {
            "bool" => Prim::Bool,
            "u8" => Prim::U8,
            "u16" => Prim::U16,
            "u32" => Prim::U32,
            "u64" => Prim::U64,
            _ => return None,
        })
    }

    /// Bits the type can hold (`bool`: 1).
    pub(crate) fn value_bits(self) -> u32 {
        match self {
            Prim::Bool => 1,
            Prim::U8 => 8,
            Prim::U16 => 16,
            Prim::U32 => 32,
            Prim::U64 => 64,
        }
    }

    /// Bytes the type occupies as a container word (`bool`: 1).
    pub(crate) fn bytes(self) -> u32 {
        match self {
            Prim::Bool | Prim::U8 => 1,
            Prim::U16 => 2,
            Prim::U32 => 4,
            Prim::U64 => 8,
        }
    }
}

/// A number given in an attribute, with the span of its token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

/// One `#[field(...)]` of the descriptor.
pub(crate) struct FieldModel {
    pub ident: syn::Ident,
    pub ty: syn::Type,
    /// The Rust type, when it is one the DSL supports.
    pub prim: Option<Prim>,
    /// Tokens of the `#[field]` attribute (or the field's name when it has
    /// none), for errors about the field as a whole.
    pub attr_tokens: TokenStream,
    /// Whether the field carried a `#[field]` attribute.
    pub has_attr: bool,
    pub byte: Option<Spanned<u64>>,
    pub word: Option<Spanned<Option<Prim>>>,
    pub bit: Option<Spanned<u64>>,
    pub width: Option<Spanned<u64>>,
    pub endian: Option<Spanned<Endian>>,
}

/// The parsed `#[descriptor(...)] struct`.
pub(crate) struct DescriptorModel {
    /// The struct with `#[field]` attributes removed.
    pub item: syn::ItemStruct,
    pub size: Option<Spanned<u64>>,
    pub endian: Spanned<Endian>,
    pub fields: Vec<FieldModel>,
}

/// A field after validation: every option resolved to a number.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub ident: syn::Ident,
    pub ty: Prim,
    /// Byte offset of the container word.
    pub byte: u32,
    /// Container word size in bytes (1, 2, 4, 8).
    pub word_bytes: u32,
    /// Offset of the field's least significant bit in the container's value.
    pub bit: u32,
    pub width: u32,
    pub endian: Endian,
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_struct: syn::ItemStruct = match syn::parse2(item.clone()) {
        Ok(s) => s,
        Err(e) => {
            let err = e.to_compile_error();
            let err2 = syn::Error::new(Span::call_site(), "#[descriptor] applies to a struct with named fields").to_compile_error();
            return quote! { #err #err2 #item };
        }
    };
    let (model, mut errors) = parse::parse(attr, item_struct);
    let layouts = validate::validate(&model, &mut errors);
    match errors.finish() {
        Ok(()) => generate::generate(&model, &layouts),
        Err(e) => {
            let err = e.to_compile_error();
            let item = &model.item;
            quote! { #err #item }
        }
    }
}

/// Collects errors, then combines them into one.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: &str, item: &str) -> String {
        expand(attr.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    #[test]
    fn the_device_builder_stores_whole_16_byte_units_and_reads_nothing() {
        let out = expand_str(
            "size = 32",
            "pub struct S { #[field(byte = 0)] pub a: u32, #[field(byte = 6)] pub b: u64, #[field(byte = 28)] pub c: u16 }",
        );
        assert!(!out.contains("compile_error"), "{out}");
        assert_eq!(out.matches(":: doorbell_kernels :: ptx :: st_v4_u32").count(), 2, "{out}");
        assert!(!out.contains("write_volatile"), "no 4-byte tail stores for a multiple of 16");
        // `to_words` builds from field values only.
        let to_words = &out[out.find("fn to_words").unwrap()..out.find("fn from_words").unwrap()];
        assert!(
            !to_words.contains("ld_v4") && !to_words.contains("read_volatile") && !to_words.contains("w ["),
            "{to_words}"
        );
        // Helper attributes are consumed.
        assert!(!out.contains("# [field"), "{out}");
    }

    #[test]
    fn errors_come_with_the_struct_and_without_helper_attributes() {
        let out = expand_str(
            "size = 4",
            "pub struct S { #[field(byte = 0, width = 0)] pub a: u32, #[field(byte = 2)] pub b: u32 }",
        );
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("pub struct S"));
        assert!(!out.contains("# [field"), "{out}");
    }
}
