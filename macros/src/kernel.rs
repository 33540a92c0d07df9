use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{parse::Parser, punctuated::Punctuated, FnArg, Ident, ItemFn, Pat, Token, Type};

/// Parsed model of `#[kernel(...)] fn ...`.
struct KernelModel {
    item: ItemFn,
    hot: bool,
    params: Vec<(Ident, Type)>,
}

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let err = e.to_compile_error();
            return quote! { #err #item };
        }
    };
    match parse(attr, item_fn.clone()).and_then(|m| validate(&m).map(|()| m)) {
        Ok(model) => generate(&model),
        Err(e) => {
            let err = e.to_compile_error();
            quote! { #err #item_fn }
        }
    }
}

fn parse(attr: TokenStream, item: ItemFn) -> syn::Result<KernelModel> {
    let mut hot = false;
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let opts = Punctuated::<Ident, Token![,]>::parse_terminated.parse2(attr)?;
    for opt in opts {
        if opt == "hot" {
            hot = true;
        } else {
            push(syn::Error::new_spanned(
                &opt,
                format!("unknown kernel option `{opt}`; expected `hot`"),
            ));
        }
    }
    let mut params = Vec::new();
    for input in &item.sig.inputs {
        match input {
            FnArg::Receiver(r) => push(syn::Error::new_spanned(r, "a kernel cannot take `self`")),
            FnArg::Typed(pt) => match &*pt.pat {
                Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => params.push((pi.ident.clone(), (*pt.ty).clone())),
                other => push(syn::Error::new_spanned(other, "kernel parameters must be plain identifiers")),
            },
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(KernelModel { item, hot, params }),
    }
}

fn validate(m: &KernelModel) -> syn::Result<()> {
    let sig = &m.item.sig;
    let mut errors: Vec<syn::Error> = Vec::new();
    if sig.unsafety.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            "a kernel must be an `unsafe fn`: it runs on raw device pointers the launcher cannot check",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "a kernel cannot be generic: PTX entry points are monomorphic",
        ));
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        errors.push(syn::Error::new_spanned(
            ty,
            "a kernel returns nothing; write results through a pointer",
        ));
    }
    if let Some(a) = &sig.asyncness {
        errors.push(syn::Error::new_spanned(a, "a kernel cannot be `async`"));
    }
    if let Some(c) = &sig.constness {
        errors.push(syn::Error::new_spanned(c, "a kernel cannot be `const`"));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            "do not give a kernel an ABI; #[kernel] chooses it per target",
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new_spanned(v, "a kernel cannot be variadic"));
    }
    let mut it = errors.into_iter();
    match it.next() {
        None => Ok(()),
        Some(mut first) => {
            for e in it {
                first.combine(e);
            }
            Err(first)
        }
    }
}

fn generate(m: &KernelModel) -> TokenStream {
    let ItemFn { attrs, vis, sig, block } = &m.item;
    let name = &sig.ident;
    let name_str = name.to_string();
    let inputs = &sig.inputs;
    let names: Vec<&Ident> = m.params.iter().map(|(n, _)| n).collect();
    let types: Vec<&Type> = m.params.iter().map(|(_, t)| t).collect();
    let hot_marker = if m.hot {
        let marker = format_ident!("DOORBELL_HOT_{}", name);
        quote! {
            #[cfg(target_arch = "nvptx64")]
            #[used]
            #[no_mangle]
            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            pub static #marker: u8 = 0;
        }
    } else {
        quote! {}
    };
    let hot = m.hot;
    let args_ty = quote! { ( #( #types, )* ) };
    quote! {
        #[cfg(target_arch = "nvptx64")]
        #(#attrs)*
        #[no_mangle]
        #vis unsafe extern "ptx-kernel" fn #name(#inputs) #block

        #[cfg(not(target_arch = "nvptx64"))]
        #(#attrs)*
        #[allow(clippy::missing_safety_doc)]
        #vis unsafe fn #name(#inputs) #block

        #hot_marker

        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = concat!("Launch marker for the `", #name_str, "` kernel (see `doorbell_kernels::Kernel`).")]
        #[allow(non_camel_case_types)]
        #vis struct #name {}

        #[cfg(not(target_arch = "nvptx64"))]
        impl ::doorbell_kernels::Kernel for #name {
            const NAME: &'static str = #name_str;
            const HOT: bool = #hot;
            type Args = #args_ty;
            unsafe fn emulate(args: Self::Args) {
                let ( #( #names, )* ) = args;
                // SAFETY: the launcher's caller promised the kernel's contract.
                unsafe { #name( #( #names ),* ) }
            }
        }
    }
}
