//! The `resume` part of the rewrite: the call keeps its arguments (but the skipped ones) with
//! its claim, and the function registers itself, with how a resumer calls it again.

use crate::ast::Args;
use crate::valid::store_argument;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, LitStr, Pat, Type};

/// One argument, as a resumer gets it.
enum Source<'a> {
    /// Stored with the claim, decoded again (`&T`: as `T::Owned`, then borrowed).
    Stored(&'a Ident, &'a Type),
    /// Skipped (or the store's handle): provided to the resumer by type.
    Provided(&'a Type),
}

fn sources<'a>(args: &'a Args, func: &'a ItemFn) -> Vec<Source<'a>> {
    let store = store_argument(args);
    func.sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(pt) => match &*pt.pat {
                Pat::Ident(p) => Some((&p.ident, &*pt.ty)),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .map(|(name, ty)| {
            if args.skip.contains(name) || store == Some(name) {
                Source::Provided(ty)
            } else {
                Source::Stored(name, ty)
            }
        })
        .collect()
}

/// The builder, made resumable: the stored arguments as one tuple. An argument that is not
/// `Serialize` is reported once, at the argument (by the default key's check when it is in
/// the default key, else here).
pub fn resumable(
    krate: &TokenStream,
    args: &Args,
    func: &ItemFn,
    in_key: &[Ident],
    setup: TokenStream,
) -> TokenStream {
    let parts = sources(args, func).into_iter().filter_map(|s| match s {
        Source::Stored(name, _) => {
            let check = (!in_key.contains(name)).then(
                || quote_spanned!(name.span()=> let _ = #krate::__private::resume::stored(&#name);),
            );
            Some(quote_spanned! {name.span()=>
                {
                    #check
                    (&#krate::__private::Arg(&#name)).__idem_part()
                }
            })
        }
        Source::Provided(..) => None,
    });
    quote! {
        #krate::__private::resume::resumable(#setup, &{
            use #krate::__private::{OtherArg as _, SerializeArg as _};
            ( #(#parts,)* )
        })
    }
}

/// The registration: a function that calls this one with stored arguments, and what it needs
/// provided, submitted to the registry at link time.
pub fn registration(krate: &TokenStream, args: &Args, name: &LitStr, func: &ItemFn) -> TokenStream {
    let r = quote!(#krate::__private::resume);
    let f = &func.sig.ident;
    let mut decode = Vec::new();
    let mut call_args = Vec::new();
    let mut needs = Vec::new();
    for (i, source) in sources(args, func).into_iter().enumerate() {
        let var = format_ident!("__idem_arg{}", i);
        match source {
            Source::Stored(_, ty) => {
                let (owned, pass) = match ty {
                    Type::Reference(reference) => {
                        let elem = &reference.elem;
                        (
                            quote_spanned!(ty.span()=> <#elem as ::std::borrow::ToOwned>::Owned),
                            quote!(::std::borrow::Borrow::borrow(&#var)),
                        )
                    }
                    _ => (quote!(#ty), quote!(#var)),
                };
                decode.push(quote_spanned! {ty.span()=>
                    let #var: #owned = match __idem_args.take::<#owned>() {
                        ::core::result::Result::Ok(v) => v,
                        ::core::result::Result::Err(e) => return #r::Resumed::Undecodable(e),
                    };
                });
                call_args.push(pass);
            }
            Source::Provided(ty) => {
                let (provided, t) = match ty {
                    Type::Reference(reference) => {
                        let elem = &reference.elem;
                        (
                            quote_spanned!(ty.span()=> #r::provided_ref::<#elem>),
                            quote!(#elem),
                        )
                    }
                    _ => (quote_spanned!(ty.span()=> #r::provided::<#ty>), quote!(#ty)),
                };
                decode.push(quote! {
                    let #var = match #provided(__idem_provided) {
                        ::core::result::Result::Ok(v) => v,
                        ::core::result::Result::Err(t) => return #r::Resumed::Missing(t),
                    };
                });
                needs.push(quote!(#r::need::<#t>()));
                call_args.push(quote!(#var));
            }
        }
    }
    let function = LitStr::new(&f.to_string(), Span::call_site());
    quote! {
        const _: () = {
            fn __idem_resume<'a>(
                __idem_args: &'a [u8],
                __idem_provided: &'a #r::Provided,
            ) -> #r::BoxFuture<'a, #r::Resumed> {
                ::std::boxed::Box::pin(async move {
                    let mut __idem_args = match #r::Args::open(__idem_args) {
                        ::core::result::Result::Ok(a) => a,
                        ::core::result::Result::Err(e) => return #r::Resumed::Undecodable(e),
                    };
                    #(#decode)*
                    if let ::core::result::Result::Err(e) = __idem_args.end() {
                        return #r::Resumed::Undecodable(e);
                    }
                    match #f(#(#call_args),*).await {
                        ::core::result::Result::Ok(_) => #r::Resumed::Done,
                        ::core::result::Result::Err(e) => #r::Resumed::Failed({
                            use #r::{DebugError as _, OtherError as _};
                            (&#r::Describe(&e)).__idem_describe()
                        }),
                    }
                })
            }
            fn __idem_needs() -> ::std::vec::Vec<#r::Need> {
                ::std::vec![#(#needs),*]
            }
            #r::inventory::submit! {
                #r::Resumable {
                    name: #name,
                    function: ::core::concat!(::core::module_path!(), "::", #function),
                    needs: __idem_needs,
                    resume: __idem_resume,
                }
            }
        };
    }
}
