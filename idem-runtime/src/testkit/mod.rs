//! The conformance suite: one set of scenarios, generic over the store, that every store runs.
//!
//! A store's test file is one line:
//!
//! ```text
//! idem::conformance_suite!(make_store); // async fn make_store() -> Option<idem::Idem>
//! ```
//!
//! which expands into one `#[test]` per scenario, each on its own multi-thread runtime. The
//! constructor returns `None` to skip (a server that is not configured); use [`service_url`]
//! so that CI, which sets `IDEM_REQUIRE_SERVICES=1`, fails instead of skipping. For a store that
//! needs a server, `idem::conformance_suite!(main: make_store);` in a test with
//! `harness = false` shows the skipped scenarios as ignored (see [`crate::conformance_suite!`]).
//!
//! Scenarios never assume an empty store: every one works in namespaces of its own, so the
//! suite can run against a shared database, in parallel, and twice in a row.

pub mod scenarios;
mod support;

pub use support::*;

/// Test hooks for the fuzz targets (`fuzz/`): how a stored value decodes into a call's result,
/// and how the Redis store reads a record from a script's reply.
#[doc(hidden)]
pub use crate::codec::{decode_stored, encode_stored};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(hidden)]
pub use crate::store::redis::parse_record_reply;

/// The status a SQL store reads from its `status` column's value (`None`: a value this version
/// does not know, which the store reports as a corrupt row). A test hook for the fuzz targets.
#[doc(hidden)]
pub fn status_from_column(v: i64) -> Option<crate::store::Status> {
    crate::store::Status::from_column(v)
}

/// Expands into one `#[test]` per conformance scenario against the store `make` opens.
///
/// `conformance_suite!(main: make)` expands instead into the `fn main` of a test binary with
/// `harness = false`, on [`libtest-mimic`](https://docs.rs/libtest-mimic) (a dev-dependency of
/// the calling crate): when `make` returns `None` (a server that is not configured), every
/// scenario shows as *ignored* in the summary `cargo test` prints, not as passed.
///
/// A second opener after `sealed:` runs every scenario again on the handle it opens, under the
/// names `sealed::<scenario>` (a module `sealed` of `#[test]`s without `main:`; it must not
/// exist already). One test binary then covers a store both as it is and with whatever the
/// second opener turns on, typically [`sealed`] (encryption, compression and the local cache):
///
/// ```text
/// async fn open() -> Option<idem::Idem> { … }
/// async fn open_sealed() -> Option<idem::Idem> {
///     open().await.map(idem::testkit::sealed)
/// }
/// idem::conformance_suite!(main: open, sealed: open_sealed);
/// ```
#[macro_export]
macro_rules! conformance_suite {
    (main: $make:path, sealed: $sealed:path $(,)?) => {
        $crate::conformance_suite!(@scenarios main_sealed ($make, $sealed));
    };
    (main: $make:path $(,)?) => {
        $crate::conformance_suite!(@scenarios main $make);
    };
    ($make:path, sealed: $sealed:path $(,)?) => {
        $crate::conformance_suite!($make);
        mod sealed {
            #[allow(unused_imports)]
            use super::*;
            // The opener's path resolves from in here, through `use super::*`.
            $crate::conformance_suite!(@scenarios tests $sealed);
        }
    };
    ($make:path $(,)?) => {
        $crate::conformance_suite!(@scenarios tests $make);
    };
    (@scenarios $mode:ident $make:tt) => {
        $crate::conformance_suite!(@$mode $make;
            first_call_runs_body_once, repeat_after_finish_replays, repeat_in_flight_is_in_progress,
            wait_replays_the_finished_value, wait_gives_up_with_in_progress, mismatch_is_refused,
            err_releases_the_key, panic_releases_the_key, dropped_future_lapses_after_lease,
            lease_lost_completion_is_fenced, store_steps_are_fenced, released_tokens_are_never_reused,
            renewal_keeps_a_slow_body_exclusive,
            type_change_is_a_codec_error, ttl_expiry_frees_the_key, concurrent_duplicates_run_once,
            odd_keys_are_just_keys, kept_errors_replay, scope_and_name_separate_keys,
            current_key_is_stable_across_retries, purge_removes_only_expired_records,
            purge_spares_claims_taken_over_meanwhile,
            get_returns_the_live_record, force_release_frees_a_live_claim, values_are_binary_safe,
            copied_values_do_not_decrypt_under_another_key,
            steps_replay_finished_and_rerun_failed, steps_survive_a_crash_between_steps,
            steps_nest_and_dedupe, step_with_other_arguments_is_a_mismatch,
            lapsed_claim_is_taken_over_as_abandoned, released_key_is_not_abandoned,
            parked_key_is_live_and_held_by_nobody, abandon_makes_the_next_claim_a_takeover,
            resolve_acts_only_on_parked_keys, force_release_frees_a_parked_key,
            purge_keeps_parked_and_abandoned_records,
            takeover_reruns_by_default_and_says_so, parked_key_answers_outcome_unknown_until_resolved,
            resolve_refuses_a_key_that_is_not_parked, a_resolved_value_of_another_type_is_a_codec_error,
            reconcile_decides_a_takeover, a_released_key_is_not_taken_over,
            tombstone_refuses_a_late_repeat, tombstone_ends_and_frees_the_key,
            tombstone_keeps_no_value_and_blocks_claims,
            large_values_round_trip, over_the_limit_is_refused_and_released,
            abandoned_calls_lists_only_abandoned_records_with_arguments,
            a_takeover_keeps_arguments_again);
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::run_scenario($make, $crate::testkit::scenarios::$name);
            }
        )*
    };
    (@main $make:path; $($name:ident),* $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::testkit::roomy_test_threads();
            let trials = ::std::vec![
                $($crate::conformance_suite!(@trial ::std::stringify!($name), $make, $name)),*
            ];
            ::libtest_mimic::run(&::libtest_mimic::Arguments::from_args(), trials).exit_code()
        }
    };
    (@main_sealed ($make:path, $sealed:path); $($name:ident),* $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::testkit::roomy_test_threads();
            let trials = ::std::vec![
                $($crate::conformance_suite!(@trial ::std::stringify!($name), $make, $name),)*
                $($crate::conformance_suite!(
                    @trial ::std::concat!("sealed::", ::std::stringify!($name)), $sealed, $name
                )),*
            ];
            ::libtest_mimic::run(&::libtest_mimic::Arguments::from_args(), trials).exit_code()
        }
    };
    (@trial $label:expr, $make:path, $name:ident) => {
        ::libtest_mimic::Trial::ignorable_test($label, || {
            match $crate::testkit::try_scenario($make, $crate::testkit::scenarios::$name) {
                $crate::testkit::Ran::Completed => {
                    ::std::result::Result::Ok(::libtest_mimic::Completion::Completed)
                }
                $crate::testkit::Ran::Skipped(why) => {
                    ::std::result::Result::Ok(::libtest_mimic::Completion::ignored_with(why))
                }
            }
        })
    };
}
