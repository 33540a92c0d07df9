use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{parse::Parser, punctuated::Punctuated, visit_mut::VisitMut, FnArg, Ident, ItemFn, Meta, Pat, Path, Token, Type};

/// Parsed model of `#[kernel(...)] fn ...`.
struct KernelModel {
    item: ItemFn,
    /// `no_spill`: ptxas must report no local-memory spills for the entry
    /// (checked by the PTX tests through the `DOORBELL_NO_SPILL_` marker).
    no_spill: bool,
    /// `no_spill(A, B)`: only these transports' entries.
    no_spill_only: Vec<Path>,
    params: Vec<(Ident, Type)>,
    /// `transports(A, B)`: instantiate the generic body once per type.
    transports: Vec<Path>,
    /// `launch_bounds(threads = N, min_blocks = M)`: CUDA's
    /// `__launch_bounds__(N, M)`, as PTX `.maxntid N, 1, 1` and
    /// `.minnctapersm M` (ptxas then keeps the registers within what `M`
    /// blocks of `N` threads per SM allow).
    bounds: Option<(u32, u32)>,
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
    let mut no_spill = false;
    let mut no_spill_only = Vec::new();
    let mut transports = Vec::new();
    let mut bounds = None;
    let mut errors: Option<syn::Error> = None;
    let mut push = |e: syn::Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let opts = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr)?;
    for opt in opts {
        match &opt {
            Meta::Path(p) if p.is_ident("no_spill") => no_spill = true,
            Meta::Path(p) if p.is_ident("hot") => push(syn::Error::new_spanned(p, "`hot` is now `no_spill`")),
            Meta::List(l) if l.path.is_ident("hot") => push(syn::Error::new_spanned(&l.path, "`hot(...)` is now `no_spill(...)`")),
            Meta::List(l) if l.path.is_ident("no_spill") => {
                match Punctuated::<Path, Token![,]>::parse_terminated.parse2(l.tokens.clone()) {
                    Ok(list) if !list.is_empty() => no_spill_only.extend(list),
                    Ok(_) => push(syn::Error::new_spanned(
                        l,
                        "`no_spill(...)` needs at least one transport type (or plain `no_spill`)",
                    )),
                    Err(e) => push(e),
                }
            }
            Meta::List(l) if l.path.is_ident("transports") => {
                match Punctuated::<Path, Token![,]>::parse_terminated.parse2(l.tokens.clone()) {
                    Ok(list) if !list.is_empty() => transports.extend(list),
                    Ok(_) => push(syn::Error::new_spanned(l, "`transports(...)` needs at least one transport type")),
                    Err(e) => push(e),
                }
            }
            Meta::List(l) if l.path.is_ident("launch_bounds") => match parse_bounds(l) {
                Ok(b) => bounds = Some(b),
                Err(e) => push(e),
            },
            other => push(syn::Error::new_spanned(
                other,
                "unknown kernel option; expected `no_spill`, `no_spill(Type, ...)`, `transports(Type, ...)` \
                 or `launch_bounds(threads = N, min_blocks = M)`",
            )),
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
        None => Ok(KernelModel {
            item,
            no_spill,
            no_spill_only,
            params,
            transports,
            bounds,
        }),
    }
}

/// `launch_bounds(threads = N)` or `launch_bounds(threads = N, min_blocks = M)`:
/// `N` in 1..=1024, `M` >= 1 (default 1).
fn parse_bounds(l: &syn::MetaList) -> syn::Result<(u32, u32)> {
    let usage = "expected `launch_bounds(threads = N, min_blocks = M)` with N in 1..=1024 and M >= 1";
    let items = Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated.parse2(l.tokens.clone())?;
    let (mut threads, mut min_blocks, mut seen_min) = (None, 1u32, false);
    for nv in &items {
        let value = match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<u32>()?,
            other => return Err(syn::Error::new_spanned(other, usage)),
        };
        if (nv.path.is_ident("threads") && threads.is_some()) || (nv.path.is_ident("min_blocks") && seen_min) {
            return Err(syn::Error::new_spanned(nv, "this `launch_bounds` key is given twice"));
        }
        if nv.path.is_ident("threads") && (1..=1024).contains(&value) {
            threads = Some(value);
        } else if nv.path.is_ident("min_blocks") && value >= 1 {
            min_blocks = value;
            seen_min = true;
        } else {
            return Err(syn::Error::new_spanned(nv, usage));
        }
    }
    match threads {
        Some(t) => Ok((t, min_blocks)),
        None => Err(syn::Error::new_spanned(l, usage)),
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
    let key = |p: &Path| quote!(#p).to_string();
    for p in &m.no_spill_only {
        if !m.transports.iter().any(|t| key(t) == key(p)) {
            errors.push(syn::Error::new_spanned(
                p,
                "`no_spill(...)` names a transport that is not in `transports(...)`",
            ));
        }
    }
    if m.transports.is_empty() {
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            errors.push(syn::Error::new_spanned(
                &sig.generics,
                "a kernel cannot be generic: PTX entry points are monomorphic \
                 (a body generic over its transport takes `#[kernel(transports(P2p, ...))]`)",
            ));
        }
    } else {
        let types: Vec<_> = sig.generics.type_params().collect();
        let only_one_type = types.len() == 1 && sig.generics.params.len() == 1;
        if !only_one_type {
            errors.push(syn::Error::new_spanned(
                &sig.generics,
                "`transports(...)` needs exactly one generic type parameter, the transport: `fn k<T: Transport>(t: T, ...)`",
            ));
        } else if let Some(e) = check_handle_first(m, types[0].ident.clone()) {
            errors.push(e);
        }
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

/// A family's transport handle is its first parameter, of the generic type
/// itself (`t: T`): the host joins a handle and the other arguments into
/// an entry's arguments in that order (`ForTransport::args`).
fn check_handle_first(m: &KernelModel, generic: Ident) -> Option<syn::Error> {
    let msg = format!(
        "`transports(...)`: the transport handle must be the first parameter, of type `{generic}` itself: \
         `fn {}<{generic}: Transport>(t: {generic}, ...)`",
        m.item.sig.ident
    );
    match m.item.sig.inputs.first() {
        Some(FnArg::Typed(pt)) => match &*pt.ty {
            Type::Path(tp) if tp.qself.is_none() && tp.path.is_ident(&generic) => None,
            _ => Some(syn::Error::new_spanned(pt, msg)),
        },
        Some(FnArg::Receiver(_)) => None, // reported by `parse`
        None => Some(syn::Error::new(m.item.sig.ident.span(), msg)),
    }
}

/// Whether `ty` names the identifier `generic` anywhere.
fn mentions(ty: &Type, generic: &Ident) -> bool {
    fn walk(ts: TokenStream, generic: &Ident) -> bool {
        ts.into_iter().any(|tt| match tt {
            proc_macro2::TokenTree::Ident(i) => i == *generic,
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), generic),
            _ => false,
        })
    }
    walk(quote!(#ty), generic)
}

/// Replaces the generic parameter `from` by the type `to` in a type.
struct Substitute<'a> {
    from: &'a Ident,
    to: &'a Path,
}

impl VisitMut for Substitute<'_> {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::Path(tp) = ty {
            if tp.qself.is_none() && tp.path.is_ident(self.from) {
                *ty = Type::Path(syn::TypePath {
                    qself: None,
                    path: self.to.clone(),
                });
                return;
            }
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

/// `P2p` → `p2p`, `SoftNicIbgda` → `soft_nic_ibgda`.
fn snake(ident: &Ident) -> String {
    let mut out = String::new();
    let s = ident.to_string();
    let chars: Vec<char> = s.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 && (chars[i - 1].is_lowercase() || chars[i - 1].is_ascii_digit()) {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// `#[kernel(transports(A, B))] fn k<T: Transport>(...)`: the generic body
/// stays a plain (inlined) function `k`; each transport gets an entry point
/// `k_a`, `k_b` that calls it, and the marker `k` maps each transport to
/// its entry through `doorbell_kernels::ForTransport`.
fn generate_instances(m: &KernelModel) -> TokenStream {
    let ItemFn { attrs, vis, sig, block } = &m.item;
    let name = &sig.ident;
    let generic = sig.generics.type_params().next().map(|p| p.ident.clone()).expect("validated");
    let names: Vec<&Ident> = m.params.iter().map(|(n, _)| n).collect();
    let docs: Vec<_> = attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let mut out = quote! {
        #(#attrs)*
        #[inline(always)]
        // The user's own signature, re-emitted: a kernel's parameter list is
        // its launch ABI, which the macro does not judge.
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        #vis #sig #block

        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = concat!("Launch marker of the `", stringify!(#name), "` kernel family: `<", stringify!(#name), " as ForTransport<T>>::Kernel` is the entry for transport `T`.")]
        #[allow(non_camel_case_types)]
        #vis struct #name {}
    };
    let (mut entries, mut visits) = (Vec::new(), Vec::new());
    for tr in &m.transports {
        let last = &tr.segments.last().expect("a path has a segment").ident;
        let entry = format_ident!("{}_{}", name, snake(last));
        let mut inst_sig = sig.clone();
        inst_sig.ident = entry.clone();
        inst_sig.generics = syn::Generics::default();
        let mut sub = Substitute { from: &generic, to: tr };
        for input in inst_sig.inputs.iter_mut() {
            if let FnArg::Typed(pt) = input {
                sub.visit_type_mut(&mut pt.ty);
            }
        }
        let inst = ItemFn {
            attrs: docs.iter().map(|a| (*a).clone()).collect(),
            vis: vis.clone(),
            sig: inst_sig,
            block: Box::new(syn::parse_quote! {{
                // SAFETY: the entry's contract is the generic body's.
                unsafe { #name::<#tr>( #( #names ),* ) }
            }}),
        };
        let params = m
            .params
            .iter()
            .map(|(n, t)| {
                let mut t = t.clone();
                sub.visit_type_mut(&mut t);
                (n.clone(), t)
            })
            .collect();
        let key = |p: &Path| quote!(#p).to_string();
        let inst_model = KernelModel {
            item: inst,
            no_spill: m.no_spill || m.no_spill_only.iter().any(|p| key(p) == key(tr)),
            no_spill_only: Vec::new(),
            params,
            transports: Vec::new(),
            bounds: m.bounds,
        };
        let rest: Vec<Type> = inst_model.params.iter().skip(1).map(|(_, t)| t.clone()).collect();
        let idx = (0..rest.len()).map(syn::Index::from);
        let entry_tokens = generate(&inst_model);
        out.extend(quote! {
            #entry_tokens

            #[cfg(not(target_arch = "nvptx64"))]
            impl ::doorbell_kernels::ForTransport<#tr> for #name {
                type Kernel = #entry;
                type Rest = ( #( #rest, )* );
                #[allow(unused_variables)]
                fn args(t: #tr, rest: Self::Rest) -> <#entry as ::doorbell_kernels::Kernel>::Args {
                    (t, #( rest.#idx, )*)
                }
            }
        });
        let entry_str = entry.to_string();
        let tr_str = snake(last);
        entries.push(quote! {
            ::doorbell_kernels::FamilyEntry {
                transport: #tr_str,
                transport_type: ::core::any::TypeId::of::<#tr>,
                entry: #entry_str,
            }
        });
        visits.push(quote! {
            if let ::core::option::Option::Some(t) = handle.downcast_ref::<#tr>() {
                let args = <Self as ::doorbell_kernels::ForTransport<#tr>>::args(*t, rest);
                return ::core::option::Option::Some(visitor.visit::<#entry>(args));
            }
        });
    }
    let name_str = name.to_string();
    out.extend(quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        impl ::doorbell_kernels::KernelFamily for #name {
            const NAME: &'static str = #name_str;
            const ENTRIES: &'static [::doorbell_kernels::FamilyEntry] = &[ #( #entries ),* ];
        }
    });
    // One rest tuple for every entry: the parameters after the handle do
    // not name the transport type.
    let rest: Vec<&Type> = m.params.iter().skip(1).map(|(_, t)| t).collect();
    if !rest.iter().any(|t| mentions(t, &generic)) {
        out.extend(quote! {
            #[cfg(not(target_arch = "nvptx64"))]
            impl ::doorbell_kernels::AnyFamily for #name {
                type Rest = ( #( #rest, )* );
                fn visit_entry<V: ::doorbell_kernels::EntryVisitor>(
                    handle: &dyn ::core::any::Any,
                    rest: Self::Rest,
                    visitor: V,
                ) -> ::core::option::Option<V::Output> {
                    #( #visits )*
                    let _ = (rest, visitor);
                    ::core::option::Option::None
                }
            }
        });
    }
    out
}

/// A one-byte global named `marker` in the PTX only: how the macro tells
/// the PTX build and its checks about an entry (rustc has no attribute for
/// what they do with it).
fn ptx_marker(marker: &Ident) -> TokenStream {
    quote! {
        #[cfg(target_arch = "nvptx64")]
        #[used]
        #[no_mangle]
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        pub static #marker: u8 = 0;
    }
}

fn generate(m: &KernelModel) -> TokenStream {
    if !m.transports.is_empty() {
        return generate_instances(m);
    }
    let ItemFn { attrs, vis, sig, block } = &m.item;
    let name = &sig.ident;
    let name_str = name.to_string();
    let inputs = &sig.inputs;
    let names: Vec<&Ident> = m.params.iter().map(|(n, _)| n).collect();
    let types: Vec<&Type> = m.params.iter().map(|(_, t)| t).collect();
    let no_spill_marker = if m.no_spill {
        ptx_marker(&format_ident!("DOORBELL_NO_SPILL_{}", name))
    } else {
        quote! {}
    };
    let no_spill = m.no_spill;
    // The PTX build turns this marker into the entry's `.maxntid` and
    // `.minnctapersm` directives (rustc has no attribute for them).
    let (bounds_marker, max_threads) = match m.bounds {
        Some((threads, min_blocks)) => {
            let marker = format_ident!("DOORBELL_BOUNDS_{}_{}_{}", threads, min_blocks, name);
            (ptx_marker(&marker), threads)
        }
        None => (quote! {}, 0),
    };
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

        #no_spill_marker
        #bounds_marker

        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = concat!("Launch marker for the `", #name_str, "` kernel (see `doorbell_kernels::Kernel`).")]
        #[allow(non_camel_case_types)]
        #vis struct #name {}

        #[cfg(not(target_arch = "nvptx64"))]
        impl ::doorbell_kernels::Kernel for #name {
            const NAME: &'static str = #name_str;
            const NO_SPILL: bool = #no_spill;
            const MAX_THREADS: u32 = #max_threads;
            type Args = #args_ty;
            unsafe fn emulate(args: Self::Args) {
                let ( #( #names, )* ) = args;
                // SAFETY: the launcher's caller promised the kernel's contract.
                unsafe { #name( #( #names ),* ) }
            }
        }
    }
}
