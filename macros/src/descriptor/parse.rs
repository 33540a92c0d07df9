//! Attribute syntax → [`DescriptorModel`], keeping spans. Never stops at the
//! first error: every problem goes into [`Errors`].

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{Expr, Lit, Meta, Token};

use super::{DescriptorModel, Endian, Errors, FieldModel, Prim, Spanned};

const DESCRIPTOR_OPTIONS: &str = "expected `size = BYTES` or `endian = big|little`";
const FIELD_OPTIONS: &str = "expected `byte = N`, `word = u8|u16|u32|u64`, `bit = N`, `width = N` or `endian = big|little`";

pub(crate) fn parse(attr: TokenStream, mut item: syn::ItemStruct) -> (DescriptorModel, Errors) {
    let mut errors = Errors::default();
    let mut size = None;
    let mut endian = Spanned {
        value: Endian::Big,
        span: Span::call_site(),
    };
    match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr) {
        Ok(opts) => {
            for opt in opts {
                let Some((key, value)) = name_value(&opt, DESCRIPTOR_OPTIONS, &mut errors) else {
                    continue;
                };
                match key.as_str() {
                    "size" => set_once(&mut size, int(value, &mut errors), &opt, &mut errors),
                    "endian" => {
                        if let Some(e) = endian_of(value, &mut errors) {
                            endian = e;
                        }
                    }
                    _ => errors.push(syn::Error::new_spanned(
                        opt.path(),
                        format!("unknown descriptor option `{key}`; {DESCRIPTOR_OPTIONS}"),
                    )),
                }
            }
        }
        Err(e) => errors.push(e),
    }

    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(&item.generics, "a descriptor cannot be generic"));
    }

    let mut fields = Vec::new();
    match &mut item.fields {
        syn::Fields::Named(named) => {
            for f in named.named.iter_mut() {
                fields.push(parse_field(f, &mut errors));
            }
        }
        other => errors.push(syn::Error::new_spanned(
            &*other,
            "a descriptor needs named fields, each with `#[field(byte = N, ...)]`",
        )),
    }
    (
        DescriptorModel {
            item,
            size,
            endian,
            fields,
        },
        errors,
    )
}

/// Parses and removes the field's `#[field(...)]` attributes.
fn parse_field(f: &mut syn::Field, errors: &mut Errors) -> FieldModel {
    let ident = f.ident.clone().expect("named field");
    let prim = match &f.ty {
        syn::Type::Path(p) if p.qself.is_none() => p.path.get_ident().and_then(|i| Prim::from_ident(&i.to_string())),
        _ => None,
    };
    let mut m = FieldModel {
        ident,
        ty: f.ty.clone(),
        prim,
        attr_tokens: f.ident.to_token_stream(),
        has_attr: false,
        byte: None,
        word: None,
        bit: None,
        width: None,
        endian: None,
    };
    let mut seen_attr = false;
    let mut keep = Vec::new();
    for attr in std::mem::take(&mut f.attrs) {
        if !attr.path().is_ident("field") {
            keep.push(attr);
            continue;
        }
        if seen_attr {
            errors.push(syn::Error::new_spanned(&attr, "duplicate `#[field]` attribute"));
            continue;
        }
        seen_attr = true;
        m.has_attr = true;
        m.attr_tokens = attr.to_token_stream();
        let opts = match attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
            Ok(o) => o,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for opt in opts {
            let Some((key, value)) = name_value(&opt, FIELD_OPTIONS, errors) else {
                continue;
            };
            match key.as_str() {
                "byte" => set_once(&mut m.byte, int(value, errors), &opt, errors),
                "bit" => set_once(&mut m.bit, int(value, errors), &opt, errors),
                "width" => set_once(&mut m.width, int(value, errors), &opt, errors),
                "word" => {
                    let w = match value {
                        Expr::Path(p) if p.path.get_ident().is_some() => {
                            let name = p.path.get_ident().unwrap().to_string();
                            let prim = Prim::from_ident(&name).filter(|p| *p != Prim::Bool);
                            if prim.is_none() {
                                errors.push(syn::Error::new_spanned(
                                    p,
                                    format!("unknown container word `{name}`; expected u8, u16, u32 or u64"),
                                ));
                            }
                            Some(Spanned {
                                value: prim,
                                span: p.span(),
                            })
                        }
                        other => {
                            errors.push(syn::Error::new_spanned(other, "expected a container word: u8, u16, u32 or u64"));
                            None
                        }
                    };
                    set_once(&mut m.word, w, &opt, errors)
                }
                "endian" => {
                    let e = endian_of(value, errors);
                    set_once(&mut m.endian, e, &opt, errors)
                }
                _ => errors.push(syn::Error::new_spanned(
                    opt.path(),
                    format!("unknown field option `{key}`; {FIELD_OPTIONS}"),
                )),
            }
        }
    }
    f.attrs = keep;
    m
}

/// `key = value` → (key, value); reports bare words and lists.
fn name_value<'a>(opt: &'a Meta, expected: &str, errors: &mut Errors) -> Option<(String, &'a Expr)> {
    let key = opt
        .path()
        .get_ident()
        .map(|i| i.to_string())
        .unwrap_or_else(|| quote::quote!(#opt).to_string());
    match opt {
        Meta::NameValue(nv) => Some((key, &nv.value)),
        _ => {
            errors.push(syn::Error::new_spanned(opt, format!("unknown option `{key}`; {expected}")));
            None
        }
    }
}

fn set_once<T>(slot: &mut Option<T>, v: Option<T>, opt: &Meta, errors: &mut Errors) {
    if let Some(v) = v {
        if slot.is_some() {
            errors.push(syn::Error::new_spanned(opt, "option given twice"));
        } else {
            *slot = Some(v);
        }
    }
}

fn int(e: &Expr, errors: &mut Errors) -> Option<Spanned<u64>> {
    if let Expr::Lit(syn::ExprLit { lit: Lit::Int(i), .. }) = e {
        match i.base10_parse::<u64>() {
            Ok(v) => return Some(Spanned { value: v, span: i.span() }),
            Err(err) => {
                errors.push(err);
                return None;
            }
        }
    }
    errors.push(syn::Error::new_spanned(e, "expected an unsigned integer literal"));
    None
}

fn endian_of(e: &Expr, errors: &mut Errors) -> Option<Spanned<Endian>> {
    if let Expr::Path(p) = e {
        if let Some(i) = p.path.get_ident() {
            match i.to_string().as_str() {
                "big" => {
                    return Some(Spanned {
                        value: Endian::Big,
                        span: i.span(),
                    })
                }
                "little" => {
                    return Some(Spanned {
                        value: Endian::Little,
                        span: i.span(),
                    })
                }
                _ => {}
            }
        }
    }
    errors.push(syn::Error::new_spanned(e, "expected `big` or `little`"));
    None
}
