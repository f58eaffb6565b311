//! The rewrite: the body stays in the same function, as an `async move` block run by
//! `__private::run` under a claim. Generated code reaches the runtime only via `#krate::__private`.

use crate::args::{Args, DurationArg, OnErrorArg};
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Type};

/// One argument of the function, as the default key sees it.
enum Arg {
    /// `name: T` (or `mut name: T`, `ref name: T`).
    Named(Ident),
    /// A destructuring pattern, `_`, …: it has no name to put in a key.
    Pattern(Span),
}

/// Expands `#[idempotent(args)] item`. On a misuse, the errors plus the function as written (so
/// that its callers do not add a cascade of errors of their own).
pub fn expand(args: Args, mut item: ItemFn) -> TokenStream {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &item.sig;

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: add `async` (the call claims its key in the \
             store and awaits it)",
        ));
    }

    let ret: Option<Type> = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => Some((**ty).clone()),
        ReturnType::Type(_, ty) => {
            errors.push(syn::Error::new(
                ty.span(),
                "an #[idempotent] function must return `Result<T, E>`, with `E: From<idem::Error>`: \
                 idempotency failures reach the caller as `Err`; an alias works when its name \
                 ends in `Result` (`io::Result<T>`, `AppResult<T>`)",
            ));
            None
        }
        ReturnType::Default => {
            errors.push(syn::Error::new(
                sig.ident.span(),
                "an #[idempotent] function must return `Result<T, E>` (with `E: From<idem::Error>`): \
                 add a return type; idempotency failures reach the caller as `Err`",
            ));
            None
        }
    };

    let mut fn_args: Vec<Arg> = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(pt) = input {
            fn_args.push(match &*pt.pat {
                Pat::Ident(pi) if pi.subpat.is_none() => Arg::Named(pi.ident.clone()),
                other => Arg::Pattern(other.span()),
            });
        }
    }
    let names: Vec<&Ident> = fn_args
        .iter()
        .filter_map(|a| match a {
            Arg::Named(i) => Some(i),
            Arg::Pattern(_) => None,
        })
        .collect();

    for skipped in &args.skip {
        if !names.contains(&skipped) {
            let real = real_arguments(&sig.ident, &names);
            errors.push(syn::Error::new(
                skipped.span(),
                format!(
                    "`skip({skipped})`: `{}` has no argument `{skipped}`; {real}",
                    sig.ident
                ),
            ));
        }
    }

    if let Some(tx) = &args.transaction {
        if !names.contains(&tx) {
            let real = real_arguments(&sig.ident, &names);
            errors.push(syn::Error::new(
                tx.span(),
                format!(
                    "`transaction = {tx}`: `{}` has no argument `{tx}`; {real}; name the \
                     `&mut sqlx::Transaction<'_, sqlx::Postgres>` argument",
                    sig.ident
                ),
            ));
        }
    }

    // `store = handle` where `handle` is an argument: a handle is never part of the key.
    let store_arg: Option<Ident> = match &args.store {
        Some(Expr::Path(p)) if p.qself.is_none() => p.path.get_ident().cloned(),
        _ => None,
    };
    // Nor is the transaction.
    let in_default = |name: &Ident| {
        !args.skip.iter().any(|s| s == name)
            && store_arg.as_ref() != Some(name)
            && args.transaction.as_ref() != Some(name)
    };

    // The default key and fingerprint: every argument not skipped, in order.
    let needs_default = args.key.is_none() || args.fingerprint.is_none();
    let mut parts: Vec<TokenStream> = Vec::new();
    let krate: TokenStream = match &args.krate {
        Some(p) => p.to_token_stream(),
        None => quote!(::idem),
    };
    for arg in &fn_args {
        match arg {
            Arg::Named(name) if in_default(name) => {
                // `key_part` reports a non-`Serialize` argument at its own span; the element
                // itself is then a placeholder, so the key tuple adds no second error.
                parts.push(quote_spanned! {name.span()=>
                    {
                        let _ = #krate::__private::key_part(&#name);
                        (&#krate::__private::Arg(&#name)).__idem_part()
                    }
                });
            }
            Arg::Named(_) => {}
            Arg::Pattern(span) if needs_default => {
                let what = match (args.key.is_none(), args.fingerprint.is_none()) {
                    (true, true) => "`key = …` and `fingerprint = …`",
                    (true, false) => "`key = …`",
                    _ => "`fingerprint = …`",
                };
                errors.push(syn::Error::new(
                    *span,
                    format!(
                        "this argument is a pattern, not a name, so it cannot be part of the default \
                         key and fingerprint of #[idempotent]: bind it to a name (e.g. \
                         `pair: (u8, u8)`, and destructure it in the body), or set {what}"
                    ),
                ));
            }
            Arg::Pattern(_) => {}
        }
    }

    if let Some(e) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        let err = e.to_compile_error();
        // The function as written, so its callers compile; its arguments may be unused now that
        // the expansion does not use them, and that warning would only be noise.
        return quote!(#err #[allow(unused_variables)] #item);
    }
    let ret = ret.expect("checked above");

    let name = args
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&item.sig.ident.unraw().to_string(), item.sig.ident.span()));
    let default_tuple = if parts.is_empty() {
        quote!(())
    } else {
        quote!({
            use #krate::__private::{OtherArg as _, SerializeArg as _};
            ( #(#parts,)* )
        })
    };

    // The transactional mode's items exist only with the `postgres` feature: the module's name
    // is the compile error without it.
    let tx_mod = quote!(#krate::__private::transaction_needs_the_postgres_feature);
    let builder_ty = match &args.transaction {
        Some(_) => quote!(#tx_mod::TxBuilder),
        None => quote!(#krate::__private::CallBuilder),
    };
    let builder = match &args.store {
        Some(store) => {
            let store_ref = quote_spanned!(store.span()=> &(#store));
            quote!(#builder_ty::new(#store_ref, #name))
        }
        None => quote!(#builder_ty::installed(#name)),
    };
    let mut setup = builder;
    match &args.key {
        Some(key) => setup.extend(quote_spanned!(key.span()=> .key(&(#key)))),
        None => setup.extend(quote!(.key(&#default_tuple))),
    }
    match (&args.key, &args.fingerprint) {
        (_, Some(fp)) => setup.extend(quote_spanned!(fp.span()=> .fingerprint(&(#fp)))),
        (Some(_), None) => setup.extend(quote!(.fingerprint(&#default_tuple))),
        // Both default: the fingerprint defaults to the key.
        (None, None) => {}
    }
    if let Some(scope) = &args.scope {
        setup.extend(quote_spanned!(scope.span()=> .scope(&(#scope))));
    }
    if args.step {
        setup.extend(quote!(.step()));
    }
    for (method, value) in [
        ("ttl", &args.ttl),
        ("lease", &args.lease),
        ("wait", &args.wait),
    ] {
        if let Some(value) = value {
            let method = Ident::new(method, Span::call_site());
            let d = duration(&krate, value);
            setup.extend(quote!(.#method(#d)));
        }
    }

    let policy = match &args.on_error {
        None | Some(OnErrorArg::Release) => quote!(#krate::__private::ReleaseErrors),
        Some(OnErrorArg::Keep) => quote!(#krate::__private::KeepErrors),
        Some(OnErrorArg::Decide(path)) => {
            quote_spanned!(path.span()=> #krate::__private::decide(#path))
        }
    };

    // The call to `run` is spanned at the return type, so that its unsatisfied bounds
    // (`T: Serialize + DeserializeOwned`, `E: From<idem::Error>`) point there.
    let stmts = &item.block.stmts;
    let ret_span = ret.span();
    if let Some(tx) = &args.transaction {
        let body = transactional(&tx_mod, tx, &ret, setup, policy, stmts);
        item.block = Box::new(syn::parse2(body).expect("the generated body is a block"));
        return item.into_token_stream();
    }
    let krate_at_ret = respan(krate.clone(), ret_span);
    let run = quote_spanned! {ret_span=>
        #krate_at_ret::__private::run(__idem_call, #policy, async move {
            // Pins the block's return type, so that `?` and `return` in the body infer.
            if let ::core::option::Option::Some(__idem_ret) = ::core::option::Option::None::<#ret> {
                #[allow(unreachable_code)]
                return __idem_ret;
            }
            let __idem_ret: #ret = { #(#stmts)* };
            #[allow(unreachable_code)]
            __idem_ret
        })
        .await
    };
    let body = quote! {{
        let __idem_call = #setup;
        #run
    }};
    item.block = Box::new(syn::parse2(body).expect("the generated body is a block"));
    item.into_token_stream()
}

/// "its arguments are `a`, `b`", for an option that names an argument that does not exist.
fn real_arguments(func: &Ident, names: &[&Ident]) -> String {
    if names.is_empty() {
        return format!("`{func}` has no named arguments");
    }
    let list = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("its arguments are {list}")
}

/// The body in the transactional mode: claim on the transaction's connection, return a replay
/// (or an idempotency failure) without running the body, else run the body (which uses the
/// transaction itself, through a reborrow that ends with it) and store its result on the same
/// transaction. The caller commits or rolls back both.
fn transactional(
    tx_mod: &TokenStream,
    tx: &Ident,
    ret: &Type,
    setup: TokenStream,
    policy: TokenStream,
    stmts: &[syn::Stmt],
) -> TokenStream {
    // Spanned at the return type, as `run` is: unsatisfied bounds on `T` and `E` point there.
    let ret_span = ret.span();
    let m_at_ret = respan(tx_mod.clone(), ret_span);
    // Spanned at the argument: a wrong type is reported there.
    let m_at_tx = respan(tx_mod.clone(), tx.span());
    let conn = quote_spanned!(tx.span()=> #m_at_tx::conn(#tx));
    quote! {{
        let __idem_call = #setup;
        let __idem_policy = #policy;
        let __idem_claim = match #m_at_ret::claim(__idem_call, #conn, &__idem_policy).await {
            #tx_mod::Step::Run(__idem_claim) => __idem_claim,
            #tx_mod::Step::Done(__idem_done) => return __idem_done,
        };
        let __idem_ret: #ret = {
            // The body's own `tx`: a reborrow, so that the transaction is still ours to write
            // the result on once the body is done.
            #[allow(unused_variables)]
            let #tx = &mut *#tx;
            #tx_mod::scope(&__idem_claim, async move {
                // Pins the block's return type, so that `?` and `return` in the body infer.
                if let ::core::option::Option::Some(__idem_ret) = ::core::option::Option::None::<#ret> {
                    #[allow(unreachable_code)]
                    return __idem_ret;
                }
                let __idem_ret: #ret = { #(#stmts)* };
                #[allow(unreachable_code)]
                __idem_ret
            })
            .await
        };
        #m_at_ret::finish(__idem_claim, #conn, &__idem_policy, __idem_ret).await
    }}
}

/// `Result<..>`, `io::Result<T>`, `anyhow::Result<T>`, `AppResult<T>`, …: any path whose last
/// segment is (or ends in) `Result`. Anything else is refused; an alias under another name cannot
/// be seen through from a macro.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Result")),
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        _ => false,
    }
}

/// The same tokens at `span`: a path spanned partly at the call site and partly at the user's
/// code would be reported at the attribute.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

fn duration(krate: &TokenStream, d: &DurationArg) -> TokenStream {
    match d {
        DurationArg::Millis(ms, span) => {
            let secs = (ms / 1000) as u64;
            let nanos = ((ms % 1000) * 1_000_000) as u32;
            quote_spanned!(*span=>
                #krate::__private::duration(::core::time::Duration::new(#secs, #nanos))
            )
        }
        DurationArg::Expr(e) => quote_spanned!(e.span()=> #krate::__private::duration(#e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        let args: Args = syn::parse2(args).unwrap();
        let item: ItemFn = syn::parse2(item).unwrap();
        expand(args, item).to_string()
    }

    #[test]
    fn default_key_and_no_fingerprint() {
        let out = expand_str(
            quote!(store = idem, skip(gw)),
            quote!(
                async fn charge(order: u64, gw: &Gw, idem: &Idem) -> Result<u64, E> {
                    Ok(order)
                }
            ),
        );
        assert!(
            out.contains("CallBuilder :: new (& (idem) , \"charge\")"),
            "{out}"
        );
        assert!(out.contains("key_part (& order)"), "{out}");
        // `gw` is skipped, `idem` is the store: neither is in the key.
        assert!(!out.contains("key_part (& gw)"), "{out}");
        assert!(!out.contains("key_part (& idem)"), "{out}");
        // Both default: the fingerprint is the key, so it is not set.
        assert!(!out.contains(". fingerprint"), "{out}");
        assert!(
            out.contains(":: idem :: __private :: ReleaseErrors"),
            "{out}"
        );
    }

    #[test]
    fn options_reach_the_builder() {
        let out = expand_str(
            quote!(
                key = order,
                ttl = "24h",
                lease = "250ms",
                wait = d,
                scope = t,
                name = "charges.v1",
                on_error = keep,
                crate = ::renamed
            ),
            quote!(
                async fn charge(&self, order: u64, t: u8, d: Duration) -> Result<u64, E> {
                    Ok(order)
                }
            ),
        );
        assert!(
            out.contains("CallBuilder :: installed (\"charges.v1\")"),
            "{out}"
        );
        assert!(out.contains(". key (& (order))"), "{out}");
        // `key` given: the fingerprint is every argument (never `self`).
        assert!(out.contains(". fingerprint"), "{out}");
        assert!(!out.contains("key_part (& self)"), "{out}");
        assert!(out.contains("Duration :: new (86400u64 , 0u32)"), "{out}");
        assert!(
            out.contains("Duration :: new (0u64 , 250000000u32)"),
            "{out}"
        );
        assert!(
            out.contains(". wait (:: renamed :: __private :: duration (d))"),
            "{out}"
        );
        assert!(out.contains(". scope (& (t))"), "{out}");
        assert!(
            out.contains(":: renamed :: __private :: KeepErrors"),
            "{out}"
        );
        assert!(!out.contains(":: idem ::"), "{out}");
    }

    #[test]
    fn transaction_mode() {
        let out = expand_str(
            quote!(transaction = tx, store = idem, lease = "1s"),
            quote!(
                async fn place(order: u64, idem: &Idem, tx: &mut Tx) -> Result<u64, E> {
                    Ok(order)
                }
            ),
        );
        let m = ":: idem :: __private :: transaction_needs_the_postgres_feature";
        assert!(
            out.contains(&format!("{m} :: TxBuilder :: new (& (idem) , \"place\")")),
            "{out}"
        );
        // Neither the store nor the transaction is part of the default key.
        assert!(out.contains("key_part (& order)"), "{out}");
        assert!(!out.contains("key_part (& tx)"), "{out}");
        // Claimed and finished on the transaction; the body gets a reborrow of it.
        assert!(
            out.contains(&format!("{m} :: claim (__idem_call , {m} :: conn (tx)")),
            "{out}"
        );
        assert!(out.contains("let tx = & mut * tx ;"), "{out}");
        assert!(
            out.contains(&format!("{m} :: finish (__idem_claim , {m} :: conn (tx)")),
            "{out}"
        );
        assert!(!out.contains("__private :: run"), "{out}");
    }
}
