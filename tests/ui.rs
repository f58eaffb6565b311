//! Compile-pass and compile-fail cases of `#[idempotent]`, with the compiler's messages pinned
//! in `tests/ui/fail/*.stderr`.
//!
//! rustc's messages list "other types that implement `Serialize`", and that list depends on
//! which crates are linked, so the pinned messages are those of the CI feature set
//! (`--all-features`); other feature sets say that they skip them.
//!
//! `tests/ui/no_postgres` holds what only a build without the `postgres` feature can show
//! (`transaction = …` without it); CI runs it with the default features
//! (`cargo test --test ui`).

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

#[cfg(not(feature = "postgres"))]
#[test]
fn ui_without_postgres() {
    trybuild::TestCases::new().compile_fail("tests/ui/no_postgres/*.rs");
}

#[cfg(feature = "postgres")]
#[test]
fn ui_without_postgres() {
    eprintln!(
        "skipped: tests/ui/no_postgres needs a build without the postgres feature; \
         run `cargo test --test ui`"
    );
}
