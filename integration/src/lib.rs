//! The tests and examples that need a server's own client, and the harness of the test binaries
//! that need a server ([`harness`], [`server_tests!`]); the README's snippets compile here as doc
//! tests with those clients at hand.

#[cfg(feature = "dynamodb")]
pub mod dynamodb;
pub mod harness;
#[cfg(feature = "outbox")]
pub mod outbox;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The examples of docs/client.md, compiled as doc tests.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../../docs/client.md")]
pub struct ClientDocDoctests;
