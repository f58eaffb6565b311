//! Compile-time checks of `#[idempotent]`: what must compile, and the errors of each misuse.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
