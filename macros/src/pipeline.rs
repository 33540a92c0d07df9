//! `pipeline!`: a loop over a block's chunks written as produce → hand off
//! → send (or wait → consume → release), with the credits, the per-chunk
//! signal and the ordering generated from [`doorbell_kernels::pipeline`]'s
//! ring calls. Split into [`parse`] → [`validate`] → [`generate`]; every
//! error points at its token and all of them are reported at once.
//!
//! ```text
//! pipeline!(unsafe send { transport: t, ring: r, ctl: c, chunks: ch,
//!                         first_seq: s, to: dst, outbox: ob, elem: f32 }
//!           |first, len, buf| { /* fill buf[..len] with elements first.. */ })
//! pipeline!(unsafe recv { transport: t, ring: r, ctl: c, chunks: ch,
//!                         first_seq: s, from: src, elem: f32 }
//!           |first, len, slot| { /* read slot[..len] */ })
//! ```

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{braced, Token};

/// Which side of the ring the loop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Send,
    Recv,
}

/// One `key: value` of the braced list (`elem` takes a type, the others an
/// expression).
struct Arg {
    key: syn::Ident,
    value: ArgValue,
}

enum ArgValue {
    Expr(syn::Expr),
    Type(syn::Type),
}

/// The parsed invocation.
struct Invocation {
    unsafety: Option<Token![unsafe]>,
    side: Side,
    side_span: Span,
    args: Vec<Arg>,
    args_span: Span,
    params: Vec<syn::Pat>,
    params_span: Span,
    body: syn::Block,
}

// ---------------------------------------------------------------------------
// parse
// ---------------------------------------------------------------------------

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key: syn::Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let value = if key == "elem" {
            ArgValue::Type(input.parse()?)
        } else {
            ArgValue::Expr(input.parse()?)
        };
        Ok(Arg { key, value })
    }
}

/// The `{ key: value, ... }` of either form, and the span of its braces.
fn parse_args(input: ParseStream) -> syn::Result<(Span, Punctuated<Arg, Token![,]>)> {
    let content;
    let brace = braced!(content in input);
    Ok((brace.span.join(), content.parse_terminated(Arg::parse, Token![,])?))
}

impl Parse for Invocation {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let unsafety: Option<Token![unsafe]> = input.parse()?;
        let side_ident: syn::Ident = input.parse()?;
        let side = match side_ident.to_string().as_str() {
            "send" => Side::Send,
            "recv" => Side::Recv,
            _ => {
                return Err(syn::Error::new(
                    side_ident.span(),
                    "pipeline! is `unsafe send { ... } |first, len, buf| { ... }`, `unsafe recv { ... } |first, len, slot| { ... }` or `unsafe pipe { ... } send |first, len, buf| { ... } recv |first, len, slot| { ... }`",
                ))
            }
        };
        let (args_span, args) = parse_args(input)?;
        let closure: syn::ExprClosure = input.parse()?;
        let params_span = closure
            .or1_token
            .span
            .join(closure.or2_token.span)
            .unwrap_or(closure.or1_token.span);
        let body = match *closure.body {
            syn::Expr::Block(b) => b.block,
            other => {
                return Err(syn::Error::new(
                    other.span(),
                    "the chunk's body is a block: `|first, len, buf| { ... }`",
                ))
            }
        };
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the chunk's body"));
        }
        Ok(Invocation {
            unsafety,
            side,
            side_span: side_ident.span(),
            args: args.into_iter().collect(),
            args_span,
            params: closure.inputs.into_iter().collect(),
            params_span,
            body,
        })
    }
}

// ---------------------------------------------------------------------------
// validate
// ---------------------------------------------------------------------------

/// The checked invocation: every key present once, three plain parameter
/// names.
struct Model {
    side: Side,
    transport: syn::Expr,
    ring: syn::Expr,
    ctl: syn::Expr,
    chunks: syn::Expr,
    first_seq: syn::Expr,
    peer: syn::Expr,
    outbox: Option<syn::Expr>,
    elem: syn::Type,
    /// The body's three names, `mut` kept.
    first: syn::PatIdent,
    len: syn::PatIdent,
    data: syn::PatIdent,
    body: syn::Block,
}

const COMMON_KEYS: [&str; 6] = ["transport", "ring", "ctl", "chunks", "first_seq", "elem"];

fn keys_of(side: Side) -> Vec<&'static str> {
    let mut k = COMMON_KEYS.to_vec();
    match side {
        Side::Send => k.extend(["to", "outbox"]),
        Side::Recv => k.push("from"),
    }
    k
}

fn validate(inv: Invocation) -> Result<Model, Vec<syn::Error>> {
    let mut errors = Vec::new();
    if inv.unsafety.is_none() {
        errors.push(syn::Error::new(
            inv.side_span,
            "pipeline! moves data through the ring's raw device addresses: write `unsafe send` / `unsafe recv`, vouching that the ring, the control word and the outbox are this rank's symmetric allocations of the sizes they claim",
        ));
    }
    let wanted = keys_of(inv.side);
    let mut found: Vec<(String, ArgValue)> = Vec::new();
    for arg in inv.args {
        let name = arg.key.to_string();
        if !wanted.contains(&name.as_str()) {
            errors.push(syn::Error::new(
                arg.key.span(),
                format!("unknown key `{name}`; {} takes {}", side_name(inv.side), wanted.join(", ")),
            ));
        } else if found.iter().any(|(k, _)| *k == name) {
            errors.push(syn::Error::new(arg.key.span(), format!("`{name}` is given twice")));
        } else {
            found.push((name, arg.value));
        }
    }
    for k in &wanted {
        if !found.iter().any(|(f, _)| f == k) {
            errors.push(syn::Error::new(inv.args_span, format!("missing `{k}: ...`")));
        }
    }
    let data_name = if inv.side == Side::Send { "buf" } else { "slot" };
    let mut names = Vec::new();
    if inv.params.len() != 3 {
        errors.push(syn::Error::new(
            inv.params_span,
            format!("the chunk's body takes three names: `|first, len, {data_name}|`"),
        ));
    }
    for p in &inv.params {
        match p {
            syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() && pi.attrs.is_empty() => names.push(pi.clone()),
            other => errors.push(syn::Error::new(other.span(), "a plain name (the macro gives it its type)")),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut take = |k: &str| found.iter().position(|(f, _)| f == k).map(|i| found.remove(i).1);
    let expr = |v: Option<ArgValue>| match v {
        Some(ArgValue::Expr(e)) => e,
        _ => unreachable!("checked above"),
    };
    let elem = match take("elem") {
        Some(ArgValue::Type(t)) => t,
        _ => unreachable!("checked above"),
    };
    Ok(Model {
        side: inv.side,
        transport: expr(take("transport")),
        ring: expr(take("ring")),
        ctl: expr(take("ctl")),
        chunks: expr(take("chunks")),
        first_seq: expr(take("first_seq")),
        peer: expr(take(if inv.side == Side::Send { "to" } else { "from" })),
        outbox: take("outbox").map(|v| expr(Some(v))),
        elem,
        first: names[0].clone(),
        len: names[1].clone(),
        data: names[2].clone(),
        body: inv.body,
    })
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Send => "`send`",
        Side::Recv => "`recv`",
    }
}

// ---------------------------------------------------------------------------
// generate
// ---------------------------------------------------------------------------

fn generate(m: &Model) -> TokenStream {
    let Model {
        transport,
        ring,
        ctl,
        chunks,
        first_seq,
        peer,
        elem,
        first,
        len,
        data,
        body,
        ..
    } = m;
    // The generated names, labels and loop live in `mixed_site` hygiene:
    // the body (call-site tokens) cannot name `__db_j` or the labels, so it
    // cannot step the loop or jump over the hand-off by them. The body's
    // three names are the user's own tokens, so the body sees them.
    let ms = Span::mixed_site();
    let k = quote!(::doorbell_kernels);
    // An error at the user's expression when it is not a `Transport` value.
    let transport_ref = quote_spanned! {transport.span()=> #k::pipeline::transport_value(&(#transport)) };
    let prologue = quote_spanned! {ms=>
        let __db_t = #transport_ref;
        let __db_ring: #k::pipeline::RingSet = #ring;
        let __db_ctl: #k::pipeline::BlockCtl = #ctl;
        let __db_chunks: #k::pipeline::BlockChunks = #chunks;
        let __db_seq0: u64 = #first_seq;
        let __db_peer: u32 = #peer;
        let __db_elem_bytes: u64 = ::core::mem::size_of::<#elem>() as u64;
        // Bad arguments are caught before any wait or store, and end the
        // launch (as the collectives' checks do): a chunk that does not
        // fit a slot (or overflows), no chunk or no block, a peer outside
        // the ring set, slots not aligned for the element.
        let __db_chunk_bytes = __db_chunks.chunk.checked_mul(__db_elem_bytes);
        if __db_chunks.chunk == 0
            || __db_chunks.blocks == 0
            || __db_peer >= __db_ring.peers
            || !::core::matches!(__db_chunk_bytes, ::core::option::Option::Some(b) if b <= __db_ring.slot_bytes)
            || __db_ring.slot_bytes % (::core::mem::align_of::<#elem>() as u64) != 0
            || __db_ring.slots % (::core::mem::align_of::<#elem>() as u64) != 0
        {
            #k::ptx::trap();
        }
        let mut __db_result: ::core::result::Result<(), #k::pipeline::Failed> = ::core::result::Result::Ok(());
        let mut __db_j: u64 = 0;
    };
    // A ring call inside the generated loop: its value, or on `Err` the
    // loop ends with it as the result.
    let ring_call = |call: TokenStream| {
        quote_spanned! {ms=>
            match unsafe { #call } {
                ::core::result::Result::Ok(v) => v,
                ::core::result::Result::Err(e) => {
                    __db_result = ::core::result::Result::Err(e);
                    break;
                }
            }
        }
    };
    let acquire = ring_call(quote_spanned!(ms=> __db_ring.acquire_block(__db_t, __db_ctl, __db_seq, __db_peer)));
    let commit = ring_call(
        quote_spanned!(ms=> __db_ring.commit_block(__db_t, __db_seq, __db_peer, __db_outbox as *const u8, __db_len * __db_elem_bytes)),
    );
    let wait = ring_call(quote_spanned!(ms=> __db_ring.wait_block(__db_t, __db_ctl, __db_seq, __db_peer)));
    let release = ring_call(quote_spanned!(ms=> __db_ring.release_block(__db_t, __db_ctl, __db_seq, __db_peer)));
    let first_let = bind(first, quote!(u64), quote_spanned!(ms=> __db_first));
    let len_let = bind(len, quote!(u64), quote_spanned!(ms=> __db_len));
    let step = match m.side {
        Side::Send => {
            let outbox = m.outbox.as_ref().expect("validated");
            let data_let = bind(data, quote!(*mut #elem), quote_spanned!(ms=> __db_outbox));
            quote_spanned! {ms=>
                let __db_outbox: *mut #elem = #outbox;
                while __db_j < __db_chunks.count() {
                    let (__db_first, __db_len) = __db_chunks.range(__db_j);
                    let __db_seq = __db_seq0 + __db_j;
                    // 1. Credit: the consumer has released chunk `seq - stages`
                    //    of this slot (a wait on the producer's empty counter).
                    // SAFETY: the invocation's `unsafe`: the ring and control
                    // word are this rank's symmetric allocations.
                    #acquire
                    // 2. Produce: the user's body fills the outbox.
                    'produce: {
                        #first_let
                        #len_let
                        #data_let
                        #body
                    }
                    // 3. Hand off: every thread's stores before the put.
                    #k::ptx::sync_threads();
                    // 4. Send: the chunk into the consumer's slot, then that
                    //    slot's full counter, ordered by the transport.
                    // SAFETY: as above; the outbox holds `len` elements, and a
                    // chunk fits a slot (checked before the loop).
                    #commit
                    __db_j += 1;
                }
            }
        }
        Side::Recv => {
            let data_let = bind(data, quote!(*const #elem), quote_spanned!(ms=> __db_slot));
            quote_spanned! {ms=>
                while __db_j < __db_chunks.count() {
                    let (__db_first, __db_len) = __db_chunks.range(__db_j);
                    let __db_seq = __db_seq0 + __db_j;
                    // 1. Wait for exactly this chunk: its slot's full counter.
                    // SAFETY: the invocation's `unsafe`: the ring and control
                    // word are this rank's symmetric allocations.
                    let __db_slot = (#wait) as *const #elem;
                    // 2. Consume: the user's body reads the slot.
                    'consume: {
                        #first_let
                        #len_let
                        #data_let
                        #body
                    }
                    // 3. Release: a block barrier, a fence, then the producer's
                    //    empty counter (the slot may be overwritten after this).
                    // SAFETY: as above.
                    #release
                    __db_j += 1;
                }
            }
        }
    };
    quote_spanned! {ms=>
        {
            #prologue
            #step
            __db_result
        }
    }
}

/// `let [mut] name: ty = value;` for one of the body's names: the user's
/// identifier (call-site: the body sees it) bound to a generated value.
fn bind(name: &syn::PatIdent, ty: TokenStream, value: TokenStream) -> TokenStream {
    let (mutability, ident) = (&name.mutability, &name.ident);
    quote! { let #mutability #ident: #ty = #value; }
}

/// The macro: the loop as one expression of type
/// `Result<(), doorbell_kernels::pipeline::Failed>`, or the errors.
/// `pipeline!(unsafe pipe { transport: t, pipe: p, elems: n, to: a, from: b }
/// send |first, len, buf| { ... } recv |first, len, slot| { ... })`: both
/// sides of a [`Pipe`](doorbell_kernels::pipeline::Pipe) in one form (the
/// producer/consumer split, control words and sequence numbers are
/// `Pipe::run`'s).
struct PipeForm {
    transport: syn::Expr,
    pipe: syn::Expr,
    elems: syn::Expr,
    to: syn::Expr,
    from: syn::Expr,
    send: syn::ExprClosure,
    recv: syn::ExprClosure,
}

const PIPE_KEYS: [&str; 5] = ["transport", "pipe", "elems", "to", "from"];

impl Parse for PipeForm {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let unsafety: Option<Token![unsafe]> = input.parse()?;
        let side: syn::Ident = input.parse()?;
        if unsafety.is_none() {
            return Err(syn::Error::new(
                side.span(),
                "pipeline! moves data through the pipe's raw device addresses: write `unsafe pipe`, vouching that the pipe is `Communicator::rings`'s for this element type",
            ));
        }
        let (args_span, args) = parse_args(input)?;
        let mut found: Vec<(String, syn::Expr)> = Vec::new();
        for arg in args {
            let name = arg.key.to_string();
            let ArgValue::Expr(e) = arg.value else {
                unreachable!("only `elem` takes a type")
            };
            if !PIPE_KEYS.contains(&name.as_str()) {
                return Err(syn::Error::new(
                    arg.key.span(),
                    format!("unknown key `{name}`; `pipe` takes {}", PIPE_KEYS.join(", ")),
                ));
            }
            if found.iter().any(|(k, _)| *k == name) {
                return Err(syn::Error::new(arg.key.span(), format!("`{name}` is given twice")));
            }
            found.push((name, e));
        }
        let mut take = |k: &str| {
            let i = found.iter().position(|(f, _)| f == k);
            i.map(|i| found.remove(i).1)
                .ok_or_else(|| syn::Error::new(args_span, format!("missing `{k}: ...`")))
        };
        let (transport, pipe, elems, to, from) = (take("transport")?, take("pipe")?, take("elems")?, take("to")?, take("from")?);
        let side_body = |want: &str, data: &str| -> syn::Result<syn::ExprClosure> {
            let kw: syn::Ident = input.parse()?;
            if kw != want {
                return Err(syn::Error::new(
                    kw.span(),
                    format!("expected `{want} |first, len, {data}| {{ ... }}`"),
                ));
            }
            let c: syn::ExprClosure = input.parse()?;
            if c.inputs.len() != 3 {
                return Err(syn::Error::new(
                    c.or1_token.span,
                    format!("the chunk's body takes three names: `|first, len, {data}|`"),
                ));
            }
            Ok(c)
        };
        let send = side_body("send", "buf")?;
        let recv = side_body("recv", "slot")?;
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the `recv` body"));
        }
        Ok(PipeForm {
            transport,
            pipe,
            elems,
            to,
            from,
            send,
            recv,
        })
    }
}

fn generate_pipe(f: &PipeForm) -> TokenStream {
    let PipeForm {
        transport,
        pipe,
        elems,
        to,
        from,
        send,
        recv,
    } = f;
    let k = quote!(::doorbell_kernels);
    let transport_ref = quote_spanned! {transport.span()=> #k::pipeline::transport_value(&(#transport)) };
    let ms = Span::mixed_site();
    quote_spanned! {ms=> {
        let __db_t = #transport_ref;
        let __db_pipe = #pipe;
        let __db_peers: (u32, u32) = (#to, #from);
        // SAFETY: the invocation's `unsafe`: the pipe is `Communicator::rings`'s.
        unsafe { __db_pipe.run(__db_t, #elems, __db_peers, #send, #recv) }
    }}
}

pub fn expand(input: TokenStream) -> TokenStream {
    // `pipe`: both sides in one form.
    let fork = input.clone();
    let is_pipe = syn::parse::Parser::parse2(
        |s: ParseStream| {
            let _: Option<Token![unsafe]> = s.parse()?;
            let side: syn::Ident = s.parse()?;
            let _: TokenStream = s.parse()?;
            Ok(side == "pipe")
        },
        fork,
    )
    .unwrap_or(false);
    if is_pipe {
        return match syn::parse2::<PipeForm>(input) {
            Ok(f) => generate_pipe(&f),
            Err(e) => {
                let err = e.to_compile_error();
                quote! {{ #err ::core::result::Result::<(), ::doorbell_kernels::pipeline::Failed>::Ok(()) }}
            }
        };
    }
    let inv: Invocation = match syn::parse2(input) {
        Ok(i) => i,
        // A syntax error stops at the first one (what syn reports).
        Err(e) => return e.to_compile_error(),
    };
    match validate(inv) {
        Ok(m) => generate(&m),
        Err(errors) => {
            let errs = errors.iter().map(syn::Error::to_compile_error);
            // An expression of the right type keeps later errors useful.
            quote_spanned! {Span::call_site()=> {
                #(#errs)*
                ::core::result::Result::<(), ::doorbell_kernels::pipeline::Failed>::Ok(())
            }}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pretty(ts: TokenStream) -> String {
        let file: syn::File = syn::parse2(quote! { fn expansion() { let _ = #ts; } }).expect("the expansion parses");
        prettyplease::unparse(&file)
    }

    /// The generated send and receive loops, pinned: a change to what the
    /// macro writes into a user's kernel shows up in review. After an
    /// intended change: `DOORBELL_BLESS=1 cargo test -p doorbell-macros`.
    #[test]
    fn expansion_snapshots() {
        let cases = [
            (
                "pipeline_send",
                quote! {
                    unsafe send { transport: t, ring: ring, ctl: ctl, chunks: chunks, first_seq: base, to: next, outbox: outbox, elem: f32 }
                    |first, len, buf| {
                        let mut i = tid;
                        while i < len {
                            unsafe { *buf.add(i as usize) = value(first + i) };
                            i += nthr;
                        }
                    }
                },
            ),
            (
                "pipeline_recv",
                quote! {
                    unsafe recv { transport: t, ring: ring, ctl: ctl, chunks: chunks, first_seq: base, from: prev, elem: f32 }
                    |first, len, slot| {
                        let mut i = tid;
                        while i < len {
                            unsafe { *out.add((first + i) as usize) = *slot.add(i as usize) };
                            i += nthr;
                        }
                    }
                },
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expand");
        for (name, input) in cases {
            let got = pretty(expand(input));
            let path = dir.join(format!("{name}.expanded.rs"));
            if std::env::var_os("DOORBELL_BLESS").is_some() {
                std::fs::create_dir_all(&dir).expect("create tests/expand");
                std::fs::write(&path, &got).expect("write the snapshot");
                continue;
            }
            let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (make it with DOORBELL_BLESS=1)", path.display()));
            assert_eq!(got, want, "{name}: the expansion changed; review, then DOORBELL_BLESS=1");
        }
    }

    #[test]
    fn every_mistake_is_reported_at_its_token() {
        let bad = quote! {
            send { transport: t, ring: r, ring: r2, chunks: c, first_seq: 0, to: 1, outbox: o, elem: f32, speed: 3 }
            |first, (a, b)| { }
        };
        let inv: Invocation = syn::parse2(bad).expect("parses");
        let errors = match validate(inv) {
            Err(e) => e.into_iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            Ok(_) => panic!("accepted"),
        };
        for want in [
            "write `unsafe send`",
            "`ring` is given twice",
            "unknown key `speed`",
            "missing `ctl: ...`",
            "three names",
            "a plain name",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "no error containing {want:?} in {errors:#?}"
            );
        }
    }
}
