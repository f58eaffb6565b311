//! What `#[idempotent(...)]` is given, parsed into typed values: the options (one `Args`) and the
//! function. Each syntax error is reported at its own span; rules that involve the function or
//! several options are checked in `valid.rs`.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, ItemFn, Lit, LitStr, Path, Token};

/// Declares the options once: the enum, its list in the docs' order, each option's name and
/// what to write for it (quoted by the errors). Adding an option is one line here plus its arm
/// in `Args::parse`, which the compiler then asks for.
macro_rules! options {
    ($($opt:ident = $name:literal: $usage:literal,)*) => {
        /// One option of `#[idempotent(...)]`.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Opt {
            $($opt,)*
        }

        impl Opt {
            /// Every option, in the order the docs list them.
            pub const ALL: &'static [Opt] = &[$(Opt::$opt,)*];

            /// The option as it is written.
            pub fn name(self) -> &'static str {
                match self {
                    $(Opt::$opt => $name,)*
                }
            }

            /// What the option takes, for the errors that say what to write.
            pub fn usage(self) -> &'static str {
                match self {
                    $(Opt::$opt => $usage,)*
                }
            }
        }
    };
}

options! {
    Key = "key": "the key is any `impl Serialize` expression, e.g. `key = req.order_id`",
    Store = "store": "an expression that derefs to `idem::Idem`, e.g. `store = self.idem`",
    Ttl = "ttl": "a literal such as \"30s\", \"5m\", \"24h\", \"7d\", \"250ms\", or a `Duration` expression",
    Lease = "lease": "a literal such as \"30s\", \"5m\", \"24h\", \"7d\", \"250ms\", or a `Duration` expression",
    Wait = "wait": "a literal such as \"30s\", \"5m\", \"24h\", \"7d\", \"250ms\", or a `Duration` expression",
    MaxValue = "max_value": "a size literal such as \"512KiB\", \"1MiB\", \"16MiB\" (units: B, KiB, MiB, GiB), or a `usize` expression of bytes",
    Tombstone = "tombstone": "a literal such as \"90d\", \"24h\", or a `Duration` expression: how long the key is refused (`idem::Error::Expired`) after `ttl`",
    Fingerprint = "fingerprint": "any `impl Serialize` expression, e.g. `fingerprint = (req.amount, req.currency)`",
    Skip = "skip": "the names of the arguments left out of the default key and fingerprint, e.g. `skip(client, pool)`",
    Scope = "scope": "any `impl Serialize` expression, e.g. `scope = tenant_id`",
    Name = "name": "a string literal, e.g. `name = \"charges.v1\"`",
    OnError = "on_error": "`on_error = release`, `on_error = keep` or `on_error = path::to::decide` (a `fn(&E) -> idem::OnError`)",
    Crate = "crate": "a path to the `idem` crate, e.g. `crate = ::my_idem`",
    Step = "step": "a flag: `step` keys this call under the idempotent call it runs in",
    Reconcile = "reconcile": "an `impl Future<Output = Result<Option<T>, E>>` expression run when the call takes over an abandoned attempt, e.g. `reconcile = gateway.find_charge(order_id)`",
    OnAbandoned = "on_abandoned": "`on_abandoned = rerun` (the default: run the body again) or `on_abandoned = park` (run nothing until an operator resolves the key)",
    Resume = "resume": "a flag: `resume` stores the arguments with the claim so that a resumer (`Idem::resumer`) finishes an abandoned call",
    Transaction = "transaction": "the name of an argument of type `&mut sqlx::Transaction<'_, sqlx::Postgres>` or `&mut sqlx::Transaction<'_, sqlx::MySql>`, e.g. `transaction = tx`: the claim and the result are written in that transaction",
}

impl Opt {
    fn from_name(name: &str) -> Option<Opt> {
        Opt::ALL.iter().copied().find(|o| o.name() == name)
    }
}

/// A `ttl`, `lease`, `wait` or `tombstone` value.
pub enum DurationArg {
    /// A literal checked at compile time: the whole value in milliseconds.
    Millis(u128, Span),
    /// Any expression of type `Duration`.
    Expr(Box<Expr>),
}

/// A `max_value` value.
pub enum SizeArg {
    /// A literal checked at compile time, in bytes.
    Bytes(u64, Span),
    /// Any expression of type `usize`.
    Expr(Box<Expr>),
}

/// `on_error = …`.
pub enum OnErrorArg {
    Release,
    Keep,
    Decide(Path),
}

/// `on_abandoned = …`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnAbandonedArg {
    Rerun,
    Park,
}

/// The options, as one typed value.
#[derive(Default)]
pub struct Args {
    pub key: Option<Expr>,
    pub store: Option<Expr>,
    pub ttl: Option<DurationArg>,
    pub lease: Option<DurationArg>,
    pub wait: Option<DurationArg>,
    /// `tombstone = …`: kept after `ttl`, refusing a late repeat.
    pub tombstone: Option<DurationArg>,
    /// `max_value = …`: this function's limit on a stored result.
    pub max_value: Option<SizeArg>,
    pub fingerprint: Option<Expr>,
    /// The names in `skip(...)` (never `self`: that is refused while parsing).
    pub skip: Vec<Ident>,
    pub scope: Option<Expr>,
    pub name: Option<LitStr>,
    pub on_error: Option<OnErrorArg>,
    pub krate: Option<Path>,
    /// `step`: keyed under the idempotent call it runs in.
    pub step: bool,
    /// `transaction = tx`: the argument whose SQL transaction holds the claim and result.
    pub transaction: Option<Ident>,
    /// `reconcile = …`: run on a takeover of an abandoned attempt, before the body.
    pub reconcile: Option<Expr>,
    /// `on_abandoned = …`.
    pub on_abandoned: Option<OnAbandonedArg>,
    /// `resume`: the arguments are stored with the claim; the function registers itself.
    pub resume: bool,
    /// The options as written, each with the span of its name: a rule about an option points
    /// there, and a second occurrence is refused.
    written: Vec<(Opt, Span)>,
}

impl Args {
    /// Where `opt` is written, if it is.
    pub fn span_of(&self, opt: Opt) -> Option<Span> {
        self.written
            .iter()
            .find(|(o, _)| *o == opt)
            .map(|(_, span)| *span)
    }
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let ident = Ident::parse_any(input)?;
            let opt = Opt::from_name(&ident.to_string()).ok_or_else(|| unknown_option(&ident))?;
            if args.span_of(opt).is_some() {
                return Err(syn::Error::new(
                    ident.span(),
                    format!(
                        "duplicate option `{}`: #[idempotent] takes each option once",
                        opt.name()
                    ),
                ));
            }
            args.written.push((opt, ident.span()));

            match opt {
                Opt::Skip => args.skip = parse_skip(input, &ident)?,
                Opt::Step => {
                    if input.peek(Token![=]) {
                        return Err(syn::Error::new(
                            ident.span(),
                            "`step` is a flag: write `step`, not `step = …`",
                        ));
                    }
                    args.step = true;
                }
                Opt::Resume => {
                    if input.peek(Token![=]) {
                        return Err(syn::Error::new(
                            ident.span(),
                            "`resume` is a flag: write `resume`, not `resume = …`",
                        ));
                    }
                    args.resume = true;
                }
                Opt::Key => args.key = Some(value(input, &ident, opt, parse_expr)?),
                Opt::Store => args.store = Some(value(input, &ident, opt, parse_expr)?),
                Opt::Fingerprint => {
                    args.fingerprint = Some(value(input, &ident, opt, parse_expr)?);
                }
                Opt::Scope => args.scope = Some(value(input, &ident, opt, parse_expr)?),
                Opt::Ttl => args.ttl = Some(value(input, &ident, opt, parse_duration)?),
                Opt::Lease => args.lease = Some(value(input, &ident, opt, parse_duration)?),
                Opt::Wait => args.wait = Some(value(input, &ident, opt, parse_duration)?),
                Opt::MaxValue => args.max_value = Some(value(input, &ident, opt, parse_size)?),
                Opt::Tombstone => {
                    args.tombstone = Some(value(input, &ident, opt, parse_duration)?);
                }
                Opt::Name => args.name = Some(value(input, &ident, opt, parse_name)?),
                Opt::OnError => args.on_error = Some(value(input, &ident, opt, parse_on_error)?),
                Opt::Crate => args.krate = Some(value(input, &ident, opt, parse_crate)?),
                Opt::Transaction => {
                    args.transaction = Some(value(input, &ident, opt, parse_transaction)?);
                }
                Opt::Reconcile => args.reconcile = Some(value(input, &ident, opt, parse_expr)?),
                Opt::OnAbandoned => {
                    args.on_abandoned = Some(value(input, &ident, opt, parse_on_abandoned)?);
                }
            }

            if input.is_empty() {
                break;
            }
            if !input.peek(Token![,]) {
                return Err(input.error(format!(
                    "expected `,` after the value of `{}`: options are separated by commas",
                    opt.name()
                )));
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// The function the attribute is on. A trait's declaration (no body) gets its own message.
pub fn parse_fn(item: TokenStream) -> syn::Result<ItemFn> {
    syn::parse2::<ItemFn>(item.clone()).map_err(|_| match syn::parse2::<syn::TraitItemFn>(item) {
        Ok(f) if f.default.is_none() => syn::Error::new(
            f.sig.ident.span(),
            "#[idempotent] needs the function's body: put it on the method of the \
                 `impl` block, not on the trait's declaration",
        ),
        _ => syn::Error::new(
            Span::call_site(),
            "#[idempotent] goes on an `async fn` with a body (a free function, a method, \
                 or a method of a trait impl)",
        ),
    })
}

/// `= VALUE` of an option that takes a value.
fn value<T>(
    input: ParseStream,
    ident: &Ident,
    opt: Opt,
    parse: fn(ParseStream, Opt) -> syn::Result<T>,
) -> syn::Result<T> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            ident.span(),
            format!("expected `{} = …`: {}", opt.name(), opt.usage()),
        ));
    }
    input.parse::<Token![=]>()?;
    parse(input, opt)
}

fn unknown_option(ident: &Ident) -> syn::Error {
    let given = ident.to_string();
    let list = Opt::ALL
        .iter()
        .map(|o| format!("`{}`", o.name()))
        .collect::<Vec<_>>()
        .join(", ");
    let hint = suggestion(&given)
        .map(|o| format!(" (did you mean `{}`?)", o.name()))
        .unwrap_or_default();
    syn::Error::new(
        ident.span(),
        format!("unknown option `{given}` of #[idempotent]{hint}; the options are {list}"),
    )
}

/// The option closest to a misspelt one, if one is close.
fn suggestion(given: &str) -> Option<Opt> {
    Opt::ALL
        .iter()
        .map(|o| (distance(given, o.name()), o.name(), *o))
        .filter(|(d, name, _)| *d <= (name.len() / 3).max(1))
        .min_by_key(|(d, name, _)| (*d, *name))
        .map(|(_, _, o)| o)
}

/// Levenshtein distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// The span of the next token, for an error about a value that is not of the expected form.
fn next_span(input: ParseStream) -> Span {
    input
        .cursor()
        .token_tree()
        .map_or(input.span(), |(t, _)| t.span())
}

fn parse_expr(input: ParseStream, opt: Opt) -> syn::Result<Expr> {
    if input.is_empty() || input.peek(Token![,]) {
        return Err(input.error(format!(
            "`{} = ` needs a value: {}",
            opt.name(),
            opt.usage()
        )));
    }
    input.parse()
}

fn parse_skip(input: ParseStream, skip: &Ident) -> syn::Result<Vec<Ident>> {
    if !input.peek(syn::token::Paren) {
        return Err(syn::Error::new(
            skip.span(),
            "expected `skip(arg, …)`: the names of the arguments left out of the default key and fingerprint",
        ));
    }
    let content;
    syn::parenthesized!(content in input);
    let names = Punctuated::<Ident, Token![,]>::parse_terminated_with(&content, Ident::parse_any)?;
    let mut out: Vec<Ident> = Vec::new();
    for name in names {
        if name == "self" {
            return Err(syn::Error::new(
                name.span(),
                "`self` is never part of the key: remove it from `skip(...)`",
            ));
        }
        if out.contains(&name) {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` is listed twice in `skip(...)`"),
            ));
        }
        out.push(name);
    }
    Ok(out)
}

fn parse_name(input: ParseStream, _: Opt) -> syn::Result<LitStr> {
    const WHAT: &str = "`name` must be a string literal, e.g. `name = \"charges.v1\"`";
    let lit = match input.parse::<Lit>() {
        Ok(Lit::Str(s)) => s,
        Ok(other) => return Err(syn::Error::new(other.span(), WHAT)),
        Err(e) => return Err(syn::Error::new(e.span(), WHAT)),
    };
    if lit.value().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "`name` must not be empty: it is the namespace of this function's keys",
        ));
    }
    Ok(lit)
}

fn parse_on_abandoned(input: ParseStream, _: Opt) -> syn::Result<OnAbandonedArg> {
    let wrong = |span: Span| {
        syn::Error::new(
            span,
            "`on_abandoned` takes `rerun` (run the body again, the default) or `park` (run \
             nothing: callers get `idem::Error::OutcomeUnknown` until an operator resolves the key)",
        )
    };
    let ident = Ident::parse_any(input).map_err(|e| wrong(e.span()))?;
    if !input.is_empty() && !input.peek(Token![,]) {
        return Err(wrong(input.span()));
    }
    match ident.to_string().as_str() {
        "rerun" => Ok(OnAbandonedArg::Rerun),
        "park" => Ok(OnAbandonedArg::Park),
        _ => Err(wrong(ident.span())),
    }
}

fn parse_on_error(input: ParseStream, _: Opt) -> syn::Result<OnErrorArg> {
    let wrong = |span: Span| {
        syn::Error::new(
            span,
            "`on_error` takes `release` (an `Err` frees the key, the default), `keep` (the `Err` is \
             stored and replayed) or a path to a `fn(&E) -> idem::OnError` that decides per error",
        )
    };
    if !(input.peek(Ident)
        || input.peek(Token![::])
        || input.peek(Token![crate])
        || input.peek(Token![self])
        || input.peek(Token![super])
        || input.peek(Token![Self]))
    {
        return Err(wrong(next_span(input)));
    }
    let path: Path = input.parse().map_err(|e| wrong(e.span()))?;
    if !input.is_empty() && !input.peek(Token![,]) {
        // e.g. `on_error = keep()` or `on_error = a + b`: not a plain path.
        return Err(wrong(input.span()));
    }
    Ok(if path.is_ident("release") {
        OnErrorArg::Release
    } else if path.is_ident("keep") {
        OnErrorArg::Keep
    } else {
        OnErrorArg::Decide(path)
    })
}

fn parse_crate(input: ParseStream, _: Opt) -> syn::Result<Path> {
    input.call(Path::parse_mod_style).map_err(|e| {
        syn::Error::new(
            e.span(),
            "`crate` must be a path to the `idem` crate, e.g. `crate = ::my_idem` or `crate = my::reexport::idem`",
        )
    })
}

fn parse_transaction(input: ParseStream, opt: Opt) -> syn::Result<Ident> {
    let wrong = |span: Span| syn::Error::new(span, format!("`transaction` takes {}", opt.usage()));
    if input.peek(Token![self]) || !input.peek(Ident) {
        return Err(wrong(next_span(input)));
    }
    let ident: Ident = input.parse()?;
    if !input.is_empty() && !input.peek(Token![,]) {
        // e.g. `transaction = self.tx` or `transaction = &mut tx`: not an argument's name.
        return Err(wrong(ident.span()));
    }
    Ok(ident)
}

fn parse_duration(input: ParseStream, opt: Opt) -> syn::Result<DurationArg> {
    let option = opt.name();
    if input.is_empty() || input.peek(Token![,]) {
        return Err(input.error(format!("`{option} = ` needs a value: {}", opt.usage())));
    }
    if !input.peek(Lit) {
        return Ok(DurationArg::Expr(Box::new(input.parse()?)));
    }
    match input.parse::<Lit>()? {
        Lit::Str(s) => {
            let ms = duration_millis(&s.value()).map_err(|why| {
                syn::Error::new(s.span(), format!("bad duration for `{option}`: {why}"))
            })?;
            if ms == 0 && opt == Opt::Lease {
                return Err(syn::Error::new(
                    s.span(),
                    "`lease` must be above zero: it is how long a claim lives without renewal",
                ));
            }
            if ms == 0 && opt == Opt::Ttl {
                return Err(syn::Error::new(
                    s.span(),
                    "`ttl` must be above zero: a result kept for no time is never replayed, so \
                     every call would run the body",
                ));
            }
            if ms > MAX_MILLIS {
                return Err(syn::Error::new(
                    s.span(),
                    format!(
                        "`{option}` is above the maximum of 36500 days (100 years): write a \
                         shorter duration, e.g. \"7d\""
                    ),
                ));
            }
            if ms == 0 && opt == Opt::Tombstone {
                return Err(syn::Error::new(
                    s.span(),
                    "`tombstone = \"0s\"` keeps no tombstone: remove it (without `tombstone`, \
                     an expired key is free again) or give how long a late repeat is refused, \
                     e.g. \"90d\"",
                ));
            }
            Ok(DurationArg::Millis(ms, s.span()))
        }
        Lit::Int(i) => Err(syn::Error::new(
            i.span(),
            format!(
                "a bare number has no unit: write `{option} = \"{}s\"` (units: ms, s, m, h, d) or a `Duration` expression",
                i.base10_digits()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{option}` takes {}", opt.usage()),
        )),
    }
}

/// The longest `ttl`, `lease`, `wait` or `tombstone`, in milliseconds: 100 years, as the
/// runtime's `idem::protocol::MAX_DURATION` (a call with a `Duration` expression above it fails
/// there).
const MAX_MILLIS: u128 = 36_500 * 86_400_000;

fn parse_size(input: ParseStream, opt: Opt) -> syn::Result<SizeArg> {
    if input.is_empty() || input.peek(Token![,]) {
        return Err(input.error(format!("`max_value = ` needs a value: {}", opt.usage())));
    }
    // A number that starts an expression (`64 * 1024`) is that expression.
    if input.peek(syn::LitInt) {
        let ahead = input.fork();
        ahead.parse::<syn::LitInt>()?;
        if !(ahead.is_empty() || ahead.peek(Token![,])) {
            return Ok(SizeArg::Expr(Box::new(input.parse()?)));
        }
    }
    if !input.peek(Lit) {
        return Ok(SizeArg::Expr(Box::new(input.parse()?)));
    }
    match input.parse::<Lit>()? {
        Lit::Str(s) => {
            let bytes = size_bytes(&s.value()).map_err(|why| {
                syn::Error::new(s.span(), format!("bad size for `max_value`: {why}"))
            })?;
            Ok(SizeArg::Bytes(bytes, s.span()))
        }
        Lit::Int(i) => Err(syn::Error::new(
            i.span(),
            format!(
                "a bare number has no unit: write `max_value = \"{}B\"` (units: B, KiB, MiB, GiB), or an expression such as `64 * 1024`",
                i.base10_digits()
            ),
        )),
        other => Err(syn::Error::new(
            other.span(),
            format!("`max_value` takes {}", opt.usage()),
        )),
    }
}

/// `"1MiB"` → bytes; the error says what is wrong and what to write. Zero is refused: a
/// function whose every result is refused is a mistake.
pub fn size_bytes(s: &str) -> Result<u64, String> {
    const HELP: &str = "write a whole number and a unit, e.g. \"512KiB\", \"1MiB\", \"16MiB\"";
    let (n, unit) = number_and_unit(s, HELP)?;
    let mul: u128 = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "`{s}` has an unknown unit `{other}` (sizes are binary: B, KiB, MiB, GiB); {HELP}"
            ))
        }
    };
    match n.checked_mul(mul).map(u64::try_from) {
        Some(Ok(0)) => Err(format!("`{s}` refuses every result; {HELP}")),
        Some(Ok(bytes)) => Ok(bytes),
        _ => Err(format!("`{s}` is too large")),
    }
}

/// A literal's number and unit (`"24h"` → `(24, "h")`), both required; the errors say what to
/// write (`help`).
fn number_and_unit<'a>(s: &'a str, help: &str) -> Result<(u128, &'a str), String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{s}` does not start with a number; {help}"));
    }
    let n: u128 = num
        .parse()
        .map_err(|_| format!("`{s}` is too large; {help}"))?;
    match unit.trim() {
        "" => Err(format!("`{s}` has no unit; {help}")),
        unit => Ok((n, unit)),
    }
}

/// `"24h"` → milliseconds; the error says what is wrong and what to write.
pub fn duration_millis(s: &str) -> Result<u128, String> {
    const HELP: &str =
        "write a whole number and a unit, e.g. \"250ms\", \"30s\", \"5m\", \"24h\", \"7d\"";
    let (n, unit) = number_and_unit(s, HELP)?;
    let mul: u128 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("`{s}` has an unknown unit `{other}`; {HELP}")),
    };
    n.checked_mul(mul)
        .filter(|ms| *ms / 1000 <= u64::MAX as u128)
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn a_size_is_a_literal_with_a_unit_or_an_expression() {
        let args: Args = syn::parse2(quote!(max_value = 64 * 1024, ttl = "1s")).unwrap();
        assert!(matches!(args.max_value, Some(SizeArg::Expr(_))));
        let args: Args = syn::parse2(quote!(max_value = "1MiB")).unwrap();
        assert!(matches!(args.max_value, Some(SizeArg::Bytes(1_048_576, _))));
        let bare = syn::parse2::<Args>(quote!(max_value = 65536))
            .err()
            .unwrap();
        assert!(bare.to_string().contains("no unit"), "{bare}");
        let bare = syn::parse2::<Args>(quote!(max_value = 65536, ttl = "1s"))
            .err()
            .unwrap();
        assert!(bare.to_string().contains("no unit"), "{bare}");
    }

    #[test]
    fn sizes() {
        assert_eq!(size_bytes("1MiB"), Ok(1 << 20));
        assert_eq!(size_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(size_bytes("100B"), Ok(100));
        assert_eq!(size_bytes(" 2GiB "), Ok(2 << 30));
        for bad in ["", "MiB", "1", "1MB", "0KiB", "99999999999999GiB"] {
            assert!(size_bytes(bad).is_err(), "{bad}");
        }
        assert!(size_bytes("1MB").unwrap_err().contains("binary"));
    }

    #[test]
    fn durations() {
        assert_eq!(duration_millis("24h"), Ok(86_400_000));
        assert_eq!(duration_millis("250ms"), Ok(250));
        assert_eq!(duration_millis("30s"), Ok(30_000));
        assert_eq!(duration_millis("5m"), Ok(300_000));
        assert_eq!(duration_millis("7d"), Ok(7 * 86_400_000));
        assert!(duration_millis("5").is_err());
        assert!(duration_millis("h").is_err());
        assert!(duration_millis("5y").is_err());
        assert!(duration_millis("").is_err());
        assert!(duration_millis("1.5h").is_err());
    }

    #[test]
    fn suggestions() {
        assert_eq!(distance("tll", "ttl"), 1);
        assert_eq!(distance("kye", "key"), 2);
        assert_eq!(distance("ttl", "ttl"), 0);
        assert_eq!(suggestion("leese"), Some(Opt::Lease));
        assert_eq!(suggestion("fingerprnt"), Some(Opt::Fingerprint));
        assert_eq!(suggestion("retries"), None);
    }

    #[test]
    fn every_option_is_found_by_its_name() {
        for opt in Opt::ALL {
            assert_eq!(Opt::from_name(opt.name()), Some(*opt));
            assert!(!opt.usage().is_empty(), "{opt:?}");
        }
    }

    #[test]
    fn duplicates_are_refused_whatever_the_form() {
        for args in [
            quote!(step, step),
            quote!(skip(a), skip(b)),
            quote!(key = a, key = b),
        ] {
            let err = syn::parse2::<Args>(args)
                .err()
                .expect("a duplicate is refused");
            assert!(err.to_string().starts_with("duplicate option"), "{err}");
        }
    }

    #[test]
    fn options_remember_where_they_are_written() {
        let args: Args = syn::parse2(quote!(wait = "1s", step, transaction = tx)).unwrap();
        assert!(args.span_of(Opt::Wait).is_some());
        assert!(args.span_of(Opt::Step).is_some());
        assert!(args.span_of(Opt::Lease).is_none());
        assert_eq!(args.transaction.unwrap(), "tx");
    }
}
