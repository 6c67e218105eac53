//! Test-only fault hooks, read from the environment where they fire. Unset in production; both
//! are read on every call, so they sit only on rare paths (purges, metadata writes).

use crate::config::{TEST_CRASH_AT_ENV, TEST_FAIL_AT_ENV};

/// `CAIRN_TEST_CRASH_AT=<point>`: abort the process at `point`, as a crash there would.
pub fn crash_point(point: &str) {
    if std::env::var(TEST_CRASH_AT_ENV).is_ok_and(|value| value == point) {
        eprintln!("{TEST_CRASH_AT_ENV}={point}: aborting");
        std::process::abort();
    }
}

/// `CAIRN_TEST_FAIL_AT=<point>`: the write at `point` fails with an IO error, as on a failing
/// disk, before any of its bytes are written.
pub fn fail_point(point: &str) -> std::io::Result<()> {
    if std::env::var(TEST_FAIL_AT_ENV).is_ok_and(|value| value == point) {
        return Err(std::io::Error::other(format!(
            "{TEST_FAIL_AT_ENV}={point}: injected write failure"
        )));
    }
    Ok(())
}
