//! The options of `#[idempotent(...)]`: parsed and checked here, at the span of each mistake.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Lit, LitStr, Path, Token};

/// Every option, in the order the docs list them.
pub const OPTIONS: &[&str] = &[
    "key",
    "store",
    "ttl",
    "lease",
    "wait",
    "fingerprint",
    "skip",
    "scope",
    "name",
    "on_error",
    "crate",
    "step",
    "transaction",
];

/// A `ttl`, `lease` or `wait` value.
pub enum DurationArg {
    /// A literal checked at compile time: the whole value in milliseconds.
    Millis(u128, Span),
    /// Any expression of type `Duration`.
    Expr(Box<Expr>),
}

/// `on_error = …`.
pub enum OnErrorArg {
    Release,
    Keep,
    Decide(Path),
}

/// The parsed options.
#[derive(Default)]
pub struct Args {
    pub key: Option<Expr>,
    pub store: Option<Expr>,
    pub ttl: Option<DurationArg>,
    pub lease: Option<DurationArg>,
    pub wait: Option<DurationArg>,
    pub fingerprint: Option<Expr>,
    /// The names in `skip(...)` (never `self`: that is refused while parsing).
    pub skip: Vec<Ident>,
    pub scope: Option<Expr>,
    pub name: Option<LitStr>,
    pub on_error: Option<OnErrorArg>,
    pub krate: Option<Path>,
    /// `step`: keyed under the idempotent call it runs in.
    pub step: bool,
    /// `transaction = tx`: the argument whose PostgreSQL transaction holds the claim and result.
    pub transaction: Option<Ident>,
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        let mut seen: Vec<String> = Vec::new();
        let mut spans: Vec<(String, Span)> = Vec::new();
        while !input.is_empty() {
            let ident = Ident::parse_any(input)?;
            let option = ident.to_string();
            if !OPTIONS.contains(&option.as_str()) {
                return Err(unknown_option(&ident));
            }
            if seen.contains(&option) {
                return Err(syn::Error::new(
                    ident.span(),
                    format!("duplicate option `{option}`: #[idempotent] takes each option once"),
                ));
            }
            seen.push(option.clone());
            spans.push((option.clone(), ident.span()));

            if option == "skip" {
                args.skip = parse_skip(input, &ident)?;
            } else if option == "step" {
                if input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        ident.span(),
                        "`step` is a flag: write `step`, not `step = …`",
                    ));
                }
                args.step = true;
            } else {
                if !input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        ident.span(),
                        format!("expected `{option} = …`: {}", usage(&option)),
                    ));
                }
                input.parse::<Token![=]>()?;
                match option.as_str() {
                    "key" => args.key = Some(parse_expr(input, &option)?),
                    "store" => args.store = Some(parse_expr(input, &option)?),
                    "fingerprint" => args.fingerprint = Some(parse_expr(input, &option)?),
                    "scope" => args.scope = Some(parse_expr(input, &option)?),
                    "ttl" => args.ttl = Some(parse_duration(input, &option)?),
                    "lease" => args.lease = Some(parse_duration(input, &option)?),
                    "wait" => args.wait = Some(parse_duration(input, &option)?),
                    "name" => args.name = Some(parse_name(input)?),
                    "on_error" => args.on_error = Some(parse_on_error(input)?),
                    "crate" => args.krate = Some(parse_crate(input)?),
                    "transaction" => args.transaction = Some(parse_transaction(input)?),
                    _ => unreachable!("every option is handled"),
                }
            }

            if input.is_empty() {
                break;
            }
            if !input.peek(Token![,]) {
                return Err(input.error(format!(
                    "expected `,` after the value of `{option}`: options are separated by commas"
                )));
            }
            input.parse::<Token![,]>()?;
        }
        if args.transaction.is_some() {
            check_transaction(&spans)?;
        }
        Ok(args)
    }
}

/// The options that do not apply in the transactional mode, refused at their own span.
fn check_transaction(spans: &[(String, Span)]) -> syn::Result<()> {
    for (option, span) in spans {
        let why = match option.as_str() {
            "wait" => {
                "`wait` does not apply with `transaction = …`: a duplicate already waits on the \
                 first transaction's row lock until it commits (then it replays) or rolls back \
                 (then it runs); bound that wait with PostgreSQL's `SET lock_timeout`"
            }
            "step" => {
                "`step` cannot be combined with `transaction = …`: a step is keyed under the \
                 idempotent call it runs in and stored outside any transaction; make the step's \
                 writes part of the transactional call's body instead"
            }
            _ => continue,
        };
        return Err(syn::Error::new(*span, why));
    }
    Ok(())
}

fn parse_transaction(input: ParseStream) -> syn::Result<Ident> {
    let wrong = |span: Span| {
        syn::Error::new(
            span,
            format!("`transaction` takes {}", usage("transaction")),
        )
    };
    if input.peek(Token![self]) || !input.peek(Ident) {
        let span = input
            .cursor()
            .token_tree()
            .map_or(input.span(), |(t, _)| t.span());
        return Err(wrong(span));
    }
    let ident: Ident = input.parse()?;
    if !input.is_empty() && !input.peek(Token![,]) {
        // e.g. `transaction = self.tx` or `transaction = &mut tx`: not an argument's name.
        return Err(wrong(ident.span()));
    }
    Ok(ident)
}

fn usage(option: &str) -> &'static str {
    match option {
        "key" => "the key is any `impl Serialize` expression, e.g. `key = req.order_id`",
        "store" => "an expression that derefs to `idem::Idem`, e.g. `store = self.idem`",
        "fingerprint" => "any `impl Serialize` expression, e.g. `fingerprint = (req.amount, req.currency)`",
        "scope" => "any `impl Serialize` expression, e.g. `scope = tenant_id`",
        "ttl" | "lease" | "wait" => "a literal such as \"30s\", \"5m\", \"24h\", \"7d\", \"250ms\", or a `Duration` expression",
        "name" => "a string literal, e.g. `name = \"charges.v1\"`",
        "on_error" => "`on_error = release`, `on_error = keep` or `on_error = path::to::decide` (a `fn(&E) -> idem::OnError`)",
        "crate" => "a path to the `idem` crate, e.g. `crate = ::my_idem`",
        "step" => "a flag: `step` keys this call under the idempotent call it runs in",
        "transaction" => "the name of an argument of type `&mut sqlx::Transaction<'_, sqlx::Postgres>`, e.g. `transaction = tx`: the claim and the result are written in that transaction",
        _ => "",
    }
}

fn unknown_option(ident: &Ident) -> syn::Error {
    let given = ident.to_string();
    let list = OPTIONS
        .iter()
        .map(|o| format!("`{o}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let hint = suggestion(&given)
        .map(|o| format!(" (did you mean `{o}`?)"))
        .unwrap_or_default();
    syn::Error::new(
        ident.span(),
        format!("unknown option `{given}` of #[idempotent]{hint}; the options are {list}"),
    )
}

/// The option closest to a misspelt one, if one is close.
fn suggestion(given: &str) -> Option<&'static str> {
    OPTIONS
        .iter()
        .map(|o| (distance(given, o), *o))
        .filter(|(d, o)| *d <= (o.len() / 3).max(1))
        .min()
        .map(|(_, o)| o)
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

fn parse_expr(input: ParseStream, option: &str) -> syn::Result<Expr> {
    if input.is_empty() || input.peek(Token![,]) {
        return Err(input.error(format!("`{option} = ` needs a value: {}", usage(option))));
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

fn parse_name(input: ParseStream) -> syn::Result<LitStr> {
    let lit: LitStr = match input.parse::<Lit>() {
        Ok(Lit::Str(s)) => s,
        Ok(other) => {
            return Err(syn::Error::new(
                other.span(),
                "`name` must be a string literal, e.g. `name = \"charges.v1\"`",
            ))
        }
        Err(e) => {
            return Err(syn::Error::new(
                e.span(),
                "`name` must be a string literal, e.g. `name = \"charges.v1\"`",
            ))
        }
    };
    if lit.value().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "`name` must not be empty: it is the namespace of this function's keys",
        ));
    }
    Ok(lit)
}

fn parse_on_error(input: ParseStream) -> syn::Result<OnErrorArg> {
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
        let span = input
            .cursor()
            .token_tree()
            .map_or(input.span(), |(t, _)| t.span());
        return Err(wrong(span));
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

fn parse_crate(input: ParseStream) -> syn::Result<Path> {
    input.call(Path::parse_mod_style).map_err(|e| {
        syn::Error::new(
            e.span(),
            "`crate` must be a path to the `idem` crate, e.g. `crate = ::my_idem` or `crate = my::reexport::idem`",
        )
    })
}

fn parse_duration(input: ParseStream, option: &str) -> syn::Result<DurationArg> {
    if input.is_empty() || input.peek(Token![,]) {
        return Err(input.error(format!("`{option} = ` needs a value: {}", usage(option))));
    }
    if input.peek(Lit) {
        let lit: Lit = input.parse()?;
        return match lit {
            Lit::Str(s) => {
                let ms = duration_millis(&s.value()).map_err(|why| {
                    syn::Error::new(s.span(), format!("bad duration for `{option}`: {why}"))
                })?;
                if ms == 0 && option == "lease" {
                    return Err(syn::Error::new(
                        s.span(),
                        "`lease` must be above zero: it is how long a claim lives without renewal",
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
                format!("`{option}` takes {}", usage(option)),
            )),
        };
    }
    Ok(DurationArg::Expr(Box::new(input.parse()?)))
}

/// `"24h"` → milliseconds; the error says what is wrong and what to write.
pub fn duration_millis(s: &str) -> Result<u128, String> {
    const HELP: &str =
        "write a whole number and a unit, e.g. \"250ms\", \"30s\", \"5m\", \"24h\", \"7d\"";
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{s}` does not start with a number; {HELP}"));
    }
    let n: u128 = num
        .parse()
        .map_err(|_| format!("`{s}` is too large; {HELP}"))?;
    let mul: u128 = match unit.trim() {
        "" => return Err(format!("`{s}` has no unit; {HELP}")),
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
        assert_eq!(suggestion("leese"), Some("lease"));
        assert_eq!(suggestion("fingerprnt"), Some("fingerprint"));
        assert_eq!(suggestion("retries"), None);
    }
}
