//! The `#[idempotent]` attribute of the `idem` crate. Use it through `idem`: `use idem::idempotent;`.
//!
//! Thin on purpose: it parses the options (`args`), checks the function, and rewrites it
//! (`expand`); everything else is in `idem-runtime`, reached through `idem::__private`.
#![warn(missing_docs)]

mod args;
mod expand;

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
/// - `transaction = tx` (feature `postgres`): `tx` names an argument of type
///   `&mut sqlx::Transaction<'_, Postgres>` (or `&mut PgConnection`); the claim and the result
///   are written in that transaction, so they commit or roll back with the body's own writes.
///   Needs a PostgreSQL store; `wait` and `step` do not apply.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    let args = match syn::parse::<args::Args>(args) {
        Ok(args) => args,
        Err(e) => return with_item(e, original),
    };
    match syn::parse::<syn::ItemFn>(item) {
        Ok(func) => expand::expand(args, func).into(),
        Err(_) => {
            let e = match syn::parse2::<syn::TraitItemFn>(original.clone()) {
                Ok(f) if f.default.is_none() => syn::Error::new(
                    f.sig.ident.span(),
                    "#[idempotent] needs the function's body: put it on the method of the \
                     `impl` block, not on the trait's declaration",
                ),
                _ => syn::Error::new(
                    proc_macro2::Span::call_site(),
                    "#[idempotent] goes on an `async fn` with a body (a free function, a method, \
                     or a method of a trait impl)",
                ),
            };
            with_item(e, original)
        }
    }
}

/// The error, and the item as written: its users then see no cascade of errors of their own.
fn with_item(e: syn::Error, item: proc_macro2::TokenStream) -> TokenStream {
    let e = e.to_compile_error();
    quote!(#e #[allow(unused_variables)] #item).into()
}
