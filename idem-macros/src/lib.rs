//! The `#[idempotent]` attribute of the `idem` crate. Use it through `idem`: `use idem::idempotent;`.
//!
//! Thin on purpose: it parses what it is given (`ast`), checks the rules that involve the
//! function or several options (`valid`), and rewrites the function (`expand`); everything else
//! is in `idem-runtime`, reached through `idem::__private`.
#![warn(missing_docs)]

mod ast;
mod expand;
mod resume;
mod valid;

use proc_macro::TokenStream;
use quote::quote;

/// Makes an async function idempotent: the first call with a key runs the body and stores its
/// `Ok` value; a repeat with the same key returns the stored value without running the body.
///
/// ```text
/// use idem::{idempotent, Idem};
///
/// #[idempotent(key = req.order_id, store = self.idem, ttl = "24h", skip(gateway))]
/// async fn charge(&self, req: ChargeRequest, gateway: &Gateway) -> Result<Receipt, PayError> {
///     gateway.charge(&req, idem::current_key().unwrap()).await
/// }
/// ```
///
/// The function must be `async` and return `Result<T, E>` (any `…::Result` alias), with
/// `T: Serialize + DeserializeOwned` and `E: From<idem::Error>`: idempotency failures (in progress,
/// mismatch, store errors) reach the caller as `Err(E::from(..))`. The signature the caller sees
/// is the one written.
///
/// # Options
///
/// - `key = EXPR`: any `impl Serialize`. Default: the tuple of every argument not in `skip(...)`,
///   in order (never `self`, never the argument named by `store = arg`).
/// - `store = EXPR`: anything that derefs to `Idem` (a `static LazyLock<Idem>`, an `Arc<Idem>`, a
///   field, a `&Idem` argument), evaluated inside the function. Default: the handle installed with
///   `Idem::install`.
/// - `ttl = "24h"`, `lease = "30s"`, `wait = "5s"`: a literal with unit `ms`, `s`, `m`, `h` or `d`
///   (checked at compile time), or any `Duration` expression.
/// - `fingerprint = EXPR`: what must match on a repeat with the same key. Default: the tuple of the
///   arguments not skipped (which is the key itself when `key` is not given either).
/// - `skip(a, b)`: arguments left out of the default key and fingerprint (clients, pools, contexts).
/// - `scope = EXPR`: a tenant or principal; the same key in two scopes is two keys.
/// - `name = "charges.v1"`: the namespace of the keys. Default: the function's name.
/// - `on_error = release | keep | path`: an `Err` frees the key (`release`, the default), is stored
///   and replayed (`keep`, needs `E: Serialize + DeserializeOwned`), or a `fn(&E) -> idem::OnError`
///   decides per error.
/// - `crate = path`: where `idem` is, when it is renamed or re-exported (default `::idem`).
/// - `transaction = tx` (features `postgres`, `mysql`): `tx` names an argument of type
///   `&mut sqlx::Transaction<'_, Postgres>` or `&mut sqlx::Transaction<'_, MySql>` (or a
///   connection: `&mut PgConnection`, `&mut MySqlConnection`); the claim and the result are
///   written in that transaction, so they commit or roll back with the body's own writes.
///   Needs a store of the same database; `wait` and `step` do not apply.
/// - `step`: a step of the idempotent call it runs in, keyed under that call's key; a retry of
///   the parent replays the finished steps and runs the rest.
/// - `resume`: the arguments (but the skipped ones) are stored with the claim, and the function
///   registers itself under its name, so that a resumer (`Idem::resumer()`) finishes a call
///   whose process died, with the stored arguments and, for the skipped ones, values provided
///   by type. Free, non-generic functions; not with `transaction` or `step`.
///
/// # What the default key cannot hold
///
/// Every argument in the default key and fingerprint must be `Serialize`, and must not have
/// interior mutability: a `Mutex`, `RwLock` (std's, tokio's, parking_lot's), `RefCell`, `Cell`,
/// `OnceCell`, `OnceLock` or atomic (`AtomicU64`, …), also behind `&`, `&mut`, `Arc`, `Rc`,
/// `Box` or inside a tuple, array or generic type. serde serializes such a value's *current
/// contents*, so a body that changes it would make a new key on every call and idempotency would
/// silently stop. Each is a compile error at the argument: put it in `skip(...)` or write
/// `key = …` and `fingerprint = …`.
///
/// The check reads the type as written, so a type alias (`type Counter = Mutex<u64>;`), a
/// generic parameter or a struct with such a field hides it; name such an argument in
/// `skip(...)` when it is not part of what identifies the call.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match parse_validate_expand(args, item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(e) => fallback(e, item),
    }
}

fn parse_validate_expand(
    args: TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let args = syn::parse::<ast::Args>(args)?;
    let func = ast::parse_fn(item)?;
    let checked = valid::check(&args, &func)?;
    Ok(expand::expand(&args, checked, func))
}

/// The errors, and the function as written: its callers then compile, and the build shows the
/// mistake alone rather than a cascade of errors of their own. Its arguments may be unused now
/// that no expansion uses them, and that warning would only be noise.
fn fallback(e: syn::Error, item: proc_macro2::TokenStream) -> TokenStream {
    let e = e.to_compile_error();
    quote!(#e #[allow(unused_variables)] #item).into()
}
