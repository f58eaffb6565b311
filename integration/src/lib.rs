//! The tests and examples that need a server's own client, and the harness of the test binaries
//! that need a server ([`harness`], [`server_tests!`]); the README's and docs/*.md's snippets
//! compile here as doc tests with those clients at hand.

#[cfg(feature = "dynamodb")]
pub mod dynamodb;
pub mod harness;
#[cfg(feature = "outbox")]
pub mod outbox;

/// The guides' examples (README.md and docs/*.md), compiled and run as doc tests. A snippet
/// that needs a feature says so in its hidden lines, so each page compiles with any set.
#[cfg(doctest)]
pub mod guides {
    macro_rules! guides {
        ($($name:ident = $path:literal,)*) => {
            $(
                #[doc = include_str!($path)]
                pub struct $name;
            )*
        };
    }
    guides! {
        Readme = "../../README.md",
        Board = "../../docs/board.md",
        Client = "../../docs/client.md",
        CrashWindow = "../../docs/crash-window.md",
        Dynamodb = "../../docs/dynamodb.md",
        Guarantees = "../../docs/guarantees.md",
        Http = "../../docs/http.md",
        Layout = "../../docs/layout.md",
        Mysql = "../../docs/mysql.md",
        Operating = "../../docs/operating.md",
        ParkedKeys = "../../docs/parked-keys.md",
        Outbox = "../../docs/outbox.md",
        Postgres = "../../docs/postgres.md",
        Protocol = "../../docs/protocol.md",
        Queues = "../../docs/queues.md",
        Redis = "../../docs/redis.md",
        Resume = "../../docs/resume.md",
        Steps = "../../docs/steps.md",
        StoredValues = "../../docs/stored-values.md",
        Testing = "../../docs/testing.md",
        Tombstones = "../../docs/tombstones.md",
        WhereUsed = "../../docs/where-used.md",
        Benchmarks = "../../docs/benchmarks.md",
    }
}

#[cfg(test)]
mod tests {
    /// A page added to docs/ without a line in [`guides`] would keep Rust blocks no one compiles.
    #[test]
    fn every_guide_is_compiled() {
        let listed = include_str!("lib.rs");
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        for entry in std::fs::read_dir(&docs).expect("docs/") {
            let file = entry.expect("a docs/ entry").file_name();
            let file = file.to_string_lossy();
            if file.ends_with(".md") {
                assert!(
                    listed.contains(&format!("\"../../docs/{file}\"")),
                    "docs/{file} is not in integration/src/lib.rs's guides: its Rust blocks are not compiled"
                );
            }
        }
    }
}
