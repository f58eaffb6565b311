//! Every rule that involves the function or several options, each reported at the span of the
//! mistake. All of them are checked, so one build shows every mistake at once; what they
//! establish (the return type, the arguments in the default key) is handed to `expand`.

use crate::ast::{Args, OnAbandonedArg, Opt};
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, PatType, ReturnType, Type};

/// What the rules established about a function that passed them.
pub struct Checked {
    /// The `Result<T, E>` the function returns.
    pub ret: Type,
    /// The arguments in the default key and fingerprint, in order.
    pub defaults: Vec<Ident>,
}

/// Checks `args` against `func`.
pub fn check(args: &Args, func: &ItemFn) -> syn::Result<Checked> {
    let mut errors = Errors::default();
    let sig = &func.sig;

    transaction_excludes(args, &mut errors);
    resume_rules(args, func, &mut errors);
    if let (Some(_), Some(OnAbandonedArg::Park)) = (&args.reconcile, args.on_abandoned) {
        errors.push(syn::Error::new(
            args.span_of(Opt::OnAbandoned)
                .unwrap_or_else(Span::call_site),
            "`on_abandoned = park` has no effect with `reconcile = …`: the reconcile decides a \
             takeover (`Ok(None)` runs the body, `Err(_)` leaves the key abandoned); remove one \
             of the two",
        ));
    }

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: add `async` (the call claims its key in the \
             store and awaits it)",
        ));
    }
    let ret = return_type(&func.sig, &mut errors);

    let typed: Vec<&PatType> = sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(pt) => Some(pt),
            FnArg::Receiver(_) => None,
        })
        .collect();
    let names: Vec<&Ident> = typed.iter().filter_map(|pt| name_of(pt)).collect();

    for skipped in &args.skip {
        if !names.contains(&skipped) {
            errors.push(syn::Error::new(
                skipped.span(),
                format!(
                    "`skip({skipped})`: `{}` has no argument `{skipped}`; {}",
                    sig.ident,
                    real_arguments(&sig.ident, &names)
                ),
            ));
        }
    }
    if let Some(tx) = &args.transaction {
        if !names.contains(&tx) {
            errors.push(syn::Error::new(
                tx.span(),
                format!(
                    "`transaction = {tx}`: `{}` has no argument `{tx}`; {}; name the \
                     `&mut sqlx::Transaction<'_, sqlx::Postgres>` (or `MySql`) argument",
                    sig.ident,
                    real_arguments(&sig.ident, &names)
                ),
            ));
        }
    }

    // What the default key and fingerprint are needed for, to say what to write instead.
    let instead = match (args.key.is_none(), args.fingerprint.is_none()) {
        (true, true) => Some("`key = …` and `fingerprint = …`"),
        (true, false) => Some("`key = …`"),
        (false, true) => Some("`fingerprint = …`"),
        (false, false) => None,
    };
    let store_arg = store_argument(args);
    let mut defaults: Vec<Ident> = Vec::new();
    for pt in typed {
        let Some(name) = name_of(pt) else {
            if let Some(instead) = instead {
                errors.push(syn::Error::new(
                    pt.pat.span(),
                    format!(
                        "this argument is a pattern, not a name, so it cannot be part of the default \
                         key and fingerprint of #[idempotent]: bind it to a name (e.g. \
                         `pair: (u8, u8)`, and destructure it in the body), or set {instead}"
                    ),
                ));
            }
            continue;
        };
        // Neither a skipped argument, nor the store's handle, nor the transaction is part of
        // the key.
        if args.skip.contains(name)
            || store_arg == Some(name)
            || args.transaction.as_ref() == Some(name)
        {
            continue;
        }
        if let Some(instead) = instead {
            if let Some(cell) = interior_mutability(&pt.ty) {
                errors.push(interior_mutability_error(args, pt, name, &cell, instead));
            }
        }
        defaults.push(name.clone());
    }

    errors.finish()?;
    Ok(Checked {
        ret: ret.expect("an error is reported when there is no return type"),
        defaults,
    })
}

/// The errors found so far, reported together.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// `resume`: a resumer calls the function again from a registry, with its stored arguments
/// decoded and its skipped ones provided by type; each rule at the offending span.
fn resume_rules(args: &Args, func: &ItemFn, errors: &mut Errors) {
    let Some(at) = args.span_of(Opt::Resume) else {
        return;
    };
    if args.transaction.is_some() {
        errors.push(syn::Error::new(
            at,
            "`resume` cannot be combined with `transaction = …`: a resumer calls the function \
             without the caller's transaction; make the transactional call a step of a \
             resumable one, or remove `resume`",
        ));
    }
    if args.step {
        errors.push(syn::Error::new(
            at,
            "`resume` does not apply to a `step`: a step is resumed with the call it runs in \
             (its finished steps replay); put `resume` on that call",
        ));
    }
    let sig = &func.sig;
    if let Some(param) = sig
        .generics
        .params
        .iter()
        .find(|p| !matches!(p, syn::GenericParam::Lifetime(_)))
    {
        errors.push(syn::Error::new(
            param.span(),
            "`resume` needs a function without type or const parameters: the resumer decodes \
             the stored arguments into the function's own types",
        ));
    }
    for input in &sig.inputs {
        let pt = match input {
            FnArg::Receiver(r) => {
                errors.push(syn::Error::new(
                    r.span(),
                    "`resume` needs a free function: a resumer calls it without a `self`; take \
                     what the method uses as arguments (skipped ones are provided by type)",
                ));
                continue;
            }
            FnArg::Typed(pt) => pt,
        };
        let Some(name) = name_of(pt) else {
            errors.push(syn::Error::new(
                pt.pat.span(),
                "`resume` stores each argument by name: bind this one to a name (e.g. `pair: \
                 (u8, u8)`) and destructure it in the body",
            ));
            continue;
        };
        if args.transaction.as_ref() == Some(name) {
            continue; // refused above with `transaction` itself: one error for one mistake
        }
        match &*pt.ty {
            Type::Reference(r) if r.mutability.is_some() => errors.push(syn::Error::new(
                pt.ty.span(),
                format!(
                    "`resume` cannot store or provide `{name}`, a `&mut` argument: take it by \
                     value or by `&` (a skipped `&T` is provided to the resumer by type)"
                ),
            )),
            Type::ImplTrait(_) => errors.push(syn::Error::new(
                pt.ty.span(),
                format!("`resume` cannot decode `{name}`, an `impl Trait` argument: name its type"),
            )),
            _ => {}
        }
    }
}

/// `wait` and `step` do not apply in the transactional mode: each is refused at its own span.
fn transaction_excludes(args: &Args, errors: &mut Errors) {
    if args.transaction.is_none() {
        return;
    }
    if let Some(span) = args.span_of(Opt::Wait) {
        errors.push(syn::Error::new(
            span,
            "`wait` does not apply with `transaction = …`: a duplicate already waits on the \
             first transaction's row lock until it commits (then it replays) or rolls back \
             (then it runs); bound that wait with PostgreSQL's `SET lock_timeout` or MySQL's \
             `innodb_lock_wait_timeout`",
        ));
    }
    if let Some(span) = args.span_of(Opt::Step) {
        errors.push(syn::Error::new(
            span,
            "`step` cannot be combined with `transaction = …`: a step is keyed under the \
             idempotent call it runs in and stored outside any transaction; make the step's \
             writes part of the transactional call's body instead",
        ));
    }
}

/// The return type when it is a `Result`; otherwise an error at it (or at the name when there
/// is none).
fn return_type(sig: &syn::Signature, errors: &mut Errors) -> Option<Type> {
    match &sig.output {
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
    }
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

/// `name: T` (or `mut name: T`, `ref name: T`); `None` for a destructuring pattern or `_`, which
/// have no name to put in a key.
fn name_of(pt: &PatType) -> Option<&Ident> {
    match &*pt.pat {
        Pat::Ident(pi) if pi.subpat.is_none() => Some(&pi.ident),
        _ => None,
    }
}

/// `store = handle` where `handle` is an argument: a handle is never part of the key.
pub(crate) fn store_argument(args: &Args) -> Option<&Ident> {
    match &args.store {
        Some(Expr::Path(p)) if p.qself.is_none() => p.path.get_ident(),
        _ => None,
    }
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

/// The types whose serialized form is their current contents, read through a shared reference:
/// `Mutex`, `RwLock` (std's, tokio's, parking_lot's: recognised by the last path segment),
/// the cells, and every `Atomic*`.
fn is_interior_mutable(name: &str) -> bool {
    matches!(
        name,
        "Mutex"
            | "RwLock"
            | "ReentrantMutex"
            | "RefCell"
            | "Cell"
            | "OnceCell"
            | "OnceLock"
            | "UnsafeCell"
    ) || name.starts_with("Atomic")
}

/// The interior-mutable type that `ty` is or contains (behind references, smart pointers, in
/// tuples, arrays, slices and any generic argument), by name. Only what is written is seen: a
/// type alias or a generic parameter hides it.
fn interior_mutability(ty: &Type) -> Option<Ident> {
    match ty {
        Type::Reference(r) => interior_mutability(&r.elem),
        Type::Paren(p) => interior_mutability(&p.elem),
        Type::Group(g) => interior_mutability(&g.elem),
        Type::Array(a) => interior_mutability(&a.elem),
        Type::Slice(s) => interior_mutability(&s.elem),
        Type::Tuple(t) => t.elems.iter().find_map(interior_mutability),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            if is_interior_mutable(&last.ident.to_string()) {
                return Some(last.ident.clone());
            }
            p.path
                .segments
                .iter()
                .find_map(|segment| match &segment.arguments {
                    syn::PathArguments::AngleBracketed(generic) => {
                        generic.args.iter().find_map(|arg| match arg {
                            syn::GenericArgument::Type(t) => interior_mutability(t),
                            _ => None,
                        })
                    }
                    _ => None,
                })
        }
        _ => None,
    }
}

fn interior_mutability_error(
    args: &Args,
    pt: &PatType,
    name: &Ident,
    cell: &Ident,
    instead: &str,
) -> syn::Error {
    let (part, what) = if args.key.is_none() {
        (
            "key",
            "a new key on every call, so every call would run the body again",
        )
    } else {
        (
            "fingerprint",
            "a new fingerprint on every call, so every repeat would be refused as a mismatch",
        )
    };
    syn::Error::new_spanned(
        pt,
        format!(
            "argument `{name}` has interior mutability (`{cell}`): in the default {part} of \
             #[idempotent] its current contents would make {what}; add it to `skip({name})`, \
             or write {instead}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn found(ty: proc_macro2::TokenStream) -> Option<String> {
        interior_mutability(&syn::parse2(ty).unwrap()).map(|i| i.to_string())
    }

    #[test]
    fn interior_mutability_is_seen_through_wrappers() {
        assert_eq!(
            found(quote!(&std::sync::Mutex<u64>)).as_deref(),
            Some("Mutex")
        );
        assert_eq!(
            found(quote!(Arc<RwLock<Vec<u8>>>)).as_deref(),
            Some("RwLock")
        );
        assert_eq!(found(quote!(&mut Box<Cell<u8>>)).as_deref(), Some("Cell"));
        assert_eq!(
            found(quote!(Rc<RefCell<String>>)).as_deref(),
            Some("RefCell")
        );
        assert_eq!(found(quote!(&AtomicU64)).as_deref(), Some("AtomicU64"));
        assert_eq!(
            found(quote!((u8, OnceLock<u8>))).as_deref(),
            Some("OnceLock")
        );
        assert_eq!(
            found(quote!(Vec<core::cell::OnceCell<u8>>)).as_deref(),
            Some("OnceCell")
        );
        assert_eq!(
            found(quote!([AtomicBool; 4])).as_deref(),
            Some("AtomicBool")
        );
        assert_eq!(
            found(quote!(tokio::sync::Mutex<u8>)).as_deref(),
            Some("Mutex")
        );
    }

    #[test]
    fn plain_types_are_not_interior_mutable() {
        for ty in [
            quote!(u64),
            quote!(&str),
            quote!(Arc<String>),
            quote!(Vec<(u8, String)>),
            quote!(HashMap<String, u64>),
            quote!(MutexGuardless),
            quote!(Cellar),
        ] {
            assert_eq!(found(ty.clone()), None, "{ty}");
        }
    }

    fn check_str(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let args: Args = syn::parse2(args).unwrap();
        let item: ItemFn = syn::parse2(item).unwrap();
        match check(&args, &item) {
            Ok(_) => String::new(),
            Err(e) => e.into_iter().map(|e| e.to_string() + "\n").collect(),
        }
    }

    #[test]
    fn interior_mutability_only_matters_in_the_default_key() {
        let f = quote!(
            async fn count(order: u64, seen: &Mutex<u64>) -> Result<u64, E> {
                Ok(order)
            }
        );
        assert!(check_str(quote!(), f.clone()).contains("`skip(seen)`"));
        assert!(check_str(quote!(key = order), f.clone()).contains("new fingerprint"));
        assert!(check_str(quote!(fingerprint = order), f.clone()).contains("new key"));
        assert_eq!(check_str(quote!(skip(seen)), f.clone()), "");
        assert_eq!(check_str(quote!(key = order, fingerprint = order), f), "");
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let errors = check_str(
            quote!(skip(nope), transaction = tx, wait = "1s"),
            quote!(
                fn f(tx: &mut Tx, (a, b): (u8, u8)) -> Option<u8> {
                    None
                }
            ),
        );
        assert_eq!(errors.lines().count(), 5, "{errors}");
    }
}
