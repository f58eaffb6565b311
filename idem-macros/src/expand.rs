//! The rewrite, and nothing else: the function has passed `valid::check`. The body stays in the
//! same function, as an `async move` block run under a claim. Generated code reaches the
//! runtime only through `#krate::__private`.

use crate::ast::{Args, DurationArg, OnAbandonedArg, OnErrorArg, SizeArg};
use crate::valid::Checked;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, Type};

/// Rewrites the body of `item` to run under a claim, as `args` say.
pub fn expand(args: &Args, checked: Checked, mut item: ItemFn) -> TokenStream {
    let krate: TokenStream = match &args.krate {
        Some(p) => p.to_token_stream(),
        None => quote!(::idem),
    };
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&item.sig.ident.unraw().to_string(), item.sig.ident.span()));
    let stmts = &item.block.stmts;
    let body = match &args.transaction {
        Some(tx) => transactional(&krate, args, &checked, &name, tx, stmts),
        None => {
            let builder = builder(args, &quote!(#krate::__private::CallBuilder), &name);
            let mut setup = setup(&krate, args, &checked, builder);
            if args.resume {
                setup = crate::resume::resumable(&krate, args, &item, &checked.defaults, setup);
            }
            let policy = policy(&krate, args);
            // The call to `run` is spanned at the return type, so that its unsatisfied bounds
            // (`T: Serialize + DeserializeOwned`, `E: From<idem::Error>`) point there.
            let ret_span = checked.ret.span();
            let body = pinned_body(&checked.ret, &reconcile(&krate, args), stmts, ret_span);
            let krate_at_ret = respan(krate.clone(), ret_span);
            let run = quote_spanned! {ret_span=>
                #krate_at_ret::__private::run(__idem_call, #policy, #body).await
            };
            quote! {{
                let __idem_call = #setup;
                #run
            }}
        }
    };
    item.block = Box::new(syn::parse2(body).expect("the generated body is a block"));
    let registration = if args.resume {
        crate::resume::registration(&krate, args, &name, &item)
    } else {
        TokenStream::new()
    };
    let mut out = item.into_token_stream();
    out.extend(registration);
    out
}

/// `Builder::new(&(store), name)`, or `Builder::installed(name)` without `store = …`.
fn builder(args: &Args, builder_ty: &TokenStream, name: &LitStr) -> TokenStream {
    match &args.store {
        Some(store) => {
            let store_ref = quote_spanned!(store.span()=> &(#store));
            quote!(#builder_ty::new(#store_ref, #name))
        }
        None => quote!(#builder_ty::installed(#name)),
    }
}

/// The builder with every option set: key, fingerprint, scope, step, durations.
fn setup(krate: &TokenStream, args: &Args, checked: &Checked, builder: TokenStream) -> TokenStream {
    let default_tuple = default_tuple(krate, &checked.defaults);
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
    if args.reconcile.is_some() {
        setup = quote!(#krate::__private::reconciling(#setup));
    }
    if args.on_abandoned == Some(OnAbandonedArg::Park) {
        setup = quote!(#krate::__private::park(#setup));
    }
    match &args.max_value {
        Some(SizeArg::Bytes(bytes, span)) => {
            let lit = proc_macro2::Literal::u64_unsuffixed(*bytes);
            setup.extend(quote_spanned!(*span=> .max_value(#lit)));
        }
        Some(SizeArg::Expr(expr)) => setup.extend(quote_spanned!(expr.span()=> .max_value(#expr))),
        None => {}
    }
    for (method, value) in [
        ("ttl", &args.ttl),
        ("lease", &args.lease),
        ("wait", &args.wait),
        ("tombstone", &args.tombstone),
    ] {
        if let Some(value) = value {
            let method = Ident::new(method, Span::call_site());
            let d = duration(krate, value);
            setup.extend(quote!(.#method(#d)));
        }
    }
    setup
}

/// The tuple of the arguments in the default key and fingerprint, in order.
fn default_tuple(krate: &TokenStream, defaults: &[Ident]) -> TokenStream {
    if defaults.is_empty() {
        return quote!(());
    }
    // `key_part` reports a non-`Serialize` argument at its own span; the element itself is
    // then a placeholder, so the key tuple adds no second error.
    let parts = defaults.iter().map(|name| {
        quote_spanned! {name.span()=>
            {
                let _ = #krate::__private::key_part(&#name);
                (&#krate::__private::Arg(&#name)).__idem_part()
            }
        }
    });
    quote!({
        use #krate::__private::{OtherArg as _, SerializeArg as _};
        ( #(#parts,)* )
    })
}

/// What decides about an `Err`: `on_error = …`, released by default.
fn policy(krate: &TokenStream, args: &Args) -> TokenStream {
    match &args.on_error {
        None | Some(OnErrorArg::Release) => quote!(#krate::__private::ReleaseErrors),
        Some(OnErrorArg::Keep) => quote!(#krate::__private::KeepErrors),
        Some(OnErrorArg::Decide(path)) => {
            quote_spanned!(path.span()=> #krate::__private::decide(#path))
        }
    }
}

/// `reconcile = …` as the start of the body: on a takeover of an abandoned attempt, its
/// `Some(result)` is the call's result and the body does not run. Spanned at the expression, so
/// that a future of the wrong output type is reported there.
fn reconcile(krate: &TokenStream, args: &Args) -> TokenStream {
    let Some(expr) = &args.reconcile else {
        return TokenStream::new();
    };
    let found = quote_spanned! {expr.span()=>
        #krate::__private::reconcile_output(#expr.await)
    };
    quote! {
        if let ::core::option::Option::Some(__idem_found) =
            #krate::__private::reconcile(async { #found }).await
        {
            return __idem_found;
        }
    }
}

/// The body as an `async move` block whose output is pinned to the function's return type, so
/// that `?` and `return` in the body infer as they would in the function itself; `prelude`
/// (a reconcile) runs first. `span` is where a bound the block fails is reported.
fn pinned_body(ret: &Type, prelude: &TokenStream, stmts: &[syn::Stmt], span: Span) -> TokenStream {
    quote_spanned! {span=>
        async move {
            if let ::core::option::Option::Some(__idem_ret) = ::core::option::Option::None::<#ret> {
                #[allow(unreachable_code)]
                return __idem_ret;
            }
            #prelude
            let __idem_ret: #ret = { #(#stmts)* };
            #[allow(unreachable_code)]
            __idem_ret
        }
    }
}

/// The body in the transactional mode (`transaction = tx`): claim on the transaction's
/// connection, return a replay (or an idempotency failure) without running the body, else run
/// the body (which uses the transaction itself, through a reborrow that ends with it) and store
/// its result on the same transaction. The caller commits or rolls back both.
fn transactional(
    krate: &TokenStream,
    args: &Args,
    checked: &Checked,
    name: &LitStr,
    tx: &Ident,
    stmts: &[syn::Stmt],
) -> TokenStream {
    // The transactional mode's items exist only with the `postgres` or `mysql` feature: the
    // module's name is the compile error without them.
    let tx_mod = quote!(#krate::__private::transaction_needs_the_postgres_or_mysql_feature);
    // The same call as every other mode; only its executor differs (the transaction).
    let builder = builder(args, &quote!(#krate::__private::CallBuilder), name);
    let setup = setup(krate, args, checked, builder);
    let policy = policy(krate, args);
    let ret = &checked.ret;
    let body = pinned_body(ret, &reconcile(krate, args), stmts, Span::call_site());
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
            #tx_mod::scope(&__idem_claim, #body).await
        };
        #m_at_ret::finish(__idem_claim, #conn, &__idem_policy, __idem_ret).await
    }}
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
        let checked = crate::valid::check(&args, &item).unwrap_or_else(|e| panic!("{e}"));
        expand(&args, checked, item).to_string()
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
        let m = ":: idem :: __private :: transaction_needs_the_postgres_or_mysql_feature";
        assert!(
            out.contains(":: idem :: __private :: CallBuilder :: new (& (idem) , \"place\")"),
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
