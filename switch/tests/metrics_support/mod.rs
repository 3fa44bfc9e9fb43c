//! Scraping `/metrics` from inside a test's network namespace (the daemons
//! listen on the namespace's loopback): `python3` fetches the page in the
//! namespace, [`oxvs_api::metrics::parse`] checks every line of it.
//! Shared by `switch/tests/metrics_e2e.rs` and `agent/tests/metrics_e2e.rs`
//! (with `#[path]`, after `mod common`).
#![allow(dead_code)]

use oxvs_api::metrics::{parse, Parsed, CONTENT_TYPE};

use crate::common::Netns;

/// Fetches URL (retrying connection refusals for up to 5 s: the server may
/// still be starting); prints the Content-Type line, then the body.
const FETCH: &str = r#"
import sys, time, urllib.request
deadline = time.time() + 5
while True:
    try:
        r = urllib.request.urlopen(sys.argv[1], timeout=5); break
    except OSError as e:
        if time.time() > deadline: print("fetch failed:", e, file=sys.stderr); sys.exit(2)
        time.sleep(0.1)
sys.stdout.write(r.headers.get("Content-Type", "") + "\n")
sys.stdout.write(r.read().decode())
"#;

/// One scrape: the raw text and what it says (checked).
pub struct Scrape {
    pub text: String,
    pub parsed: Parsed,
}

impl Scrape {
    /// The value of the sample with exactly `labels`; panics (showing the
    /// page) if there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.parsed
            .value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{}", self.text))
    }

    /// Sum of the samples of `name` carrying `labels` (0 if none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.parsed.sum(name, labels)
    }
}

/// GETs `http://ADDR/metrics` from namespace `ns`, checks the content type
/// and that the page is a valid exposition.
pub fn scrape(ns: &Netns, addr: &str) -> Scrape {
    let url = format!("http://{addr}/metrics");
    let out = ns.exec(&["python3", "-c", FETCH, &url]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "scraping {url} in {} failed: {}\n{stdout}",
        ns.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let (ctype, text) = stdout.split_once('\n').unwrap_or((&stdout, ""));
    assert_eq!(ctype, CONTENT_TYPE, "Content-Type of {url}");
    let parsed =
        parse(text).unwrap_or_else(|e| panic!("{url} is not a valid exposition: {e}\n{text}"));
    Scrape {
        text: text.to_owned(),
        parsed,
    }
}
