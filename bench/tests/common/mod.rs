//! Helpers shared by the bench crate's tests.
#![allow(dead_code)] // each test binary uses a different subset

/// Whether this test can run (root); if not, [`oxvs_testutil::skip_or_fail`]
/// says why (a failure with `OXVS_TESTS_NO_SKIP=1`).
pub fn root() -> bool {
    let ok = oxvs_testutil::is_root();
    if !ok {
        oxvs_testutil::skip_or_fail("needs root");
    }
    ok
}
