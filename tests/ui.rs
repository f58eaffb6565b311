//! Compile-pass and compile-fail cases of `#[idempotent]`, with the compiler's messages pinned
//! in `tests/ui/fail/*.stderr`.
//!
//! rustc's messages list "other types that implement `Serialize`", and that list depends on
//! which crates are linked, so the pinned messages are those of the CI feature set
//! (`--all-features`); other feature sets say that they skip them.

#[cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "axum"
))]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

#[cfg(not(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "axum"
)))]
#[test]
fn ui() {
    eprintln!(
        "skipped: the #[idempotent] UI tests pin compiler output for the CI feature set; \
         run `cargo test --workspace --all-features --test ui`"
    );
}
