//! CNI specification versions the plugin speaks.
//!
//! The plugin accepts network configurations (and `prevResult`s) of the
//! versions in [`SUPPORTED`] and answers in the version it was called with.
//! 0.1.0 and 0.2.0 (the `ip4`/`ip6` result shape) are not supported: no
//! runtime still in use needs them, and a caller asking for them gets error
//! code 1 with the list of supported versions.

use std::fmt;

/// A supported CNI specification version, ordered oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

/// Every version the plugin supports, oldest first (as reported by VERSION).
pub const SUPPORTED: [CniVersion; 5] = [
    CniVersion::V0_3_0,
    CniVersion::V0_3_1,
    CniVersion::V0_4_0,
    CniVersion::V1_0_0,
    CniVersion::V1_1_0,
];

impl CniVersion {
    /// The newest version implemented (the spec version of this plugin).
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version string as it appears in JSON (`"1.1.0"`).
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Parses an exact version string; `None` for anything not supported.
    pub fn parse(s: &str) -> Option<CniVersion> {
        SUPPORTED.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether results of this version carry `ips[].version` (0.3.x, 0.4.0).
    pub fn has_ip_version_field(self) -> bool {
        self < CniVersion::V1_0_0
    }

    /// The supported versions as strings, for messages and VERSION.
    pub fn supported_strings() -> Vec<&'static str> {
        SUPPORTED.iter().map(|v| v.as_str()).collect()
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_and_rejects_others() {
        for v in SUPPORTED {
            assert_eq!(CniVersion::parse(v.as_str()), Some(v));
        }
        for bad in ["", "0.1.0", "0.2.0", "1.1", "1.2.0", "v1.0.0", " 1.0.0"] {
            assert_eq!(CniVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn order_is_chronological() {
        assert!(CniVersion::V0_3_1 < CniVersion::V0_4_0);
        assert!(CniVersion::V0_4_0 < CniVersion::V1_0_0);
        assert!(CniVersion::V1_0_0 < CniVersion::V1_1_0);
        assert!(CniVersion::V0_4_0.has_ip_version_field());
        assert!(!CniVersion::V1_0_0.has_ip_version_field());
    }
}
