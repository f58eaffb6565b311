//! The `#[idempotent]` attribute (placeholder while the expansion is written).
use proc_macro::TokenStream;

/// Makes an async function idempotent.
#[proc_macro_attribute]
pub fn idempotent(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
