//! A socket file made by [`bind_private_unix`] is mode 0600 from the
//! moment `bind(2)` creates it, whatever the umask. The umask is process
//! wide, so this is the only test of this binary.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use nix::sys::stat::{umask, Mode};
use oxvs_api::listen::{bind_private_unix, SOCKET_MODE};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn born_private_under_a_permissive_umask() {
    let old = umask(Mode::empty());
    let dir = tempfile::tempdir().unwrap();
    // The naive way: bind, then chmod. Between the two the
    // file is 0777 & ~umask: here, world-writable (anyone may connect).
    let naive = dir.path().join("naive.sock");
    let _l = UnixListener::bind(&naive).unwrap();
    assert_eq!(mode(&naive), 0o777, "the window bind-then-chmod leaves");
    // bind_private_unix checks the mode right after bind and refuses to
    // serve a socket that was not born private, so Ok here means the file
    // never had group or other bits.
    for i in 0..20 {
        let p = dir.path().join(format!("s{i}.sock"));
        let _l = bind_private_unix(&p).expect("bind under umask 000");
        assert_eq!(mode(&p), SOCKET_MODE, "{}", p.display());
    }
    umask(old);
}
