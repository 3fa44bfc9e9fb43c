//! Small command-line value parsers: conntrack states, hex packets, table
//! selectors. Each returns an error naming the bad value; none panics.

use oxvs_pipeline::field::ct_state;
use oxvs_pipeline::names::TableNames;

/// Parses a `--ct-next` conntrack state as `ofproto/trace` accepts it:
/// flag names separated by `,` or `|`, each optionally prefixed by `+`
/// (`trk,new`, `new|trk`, `+trk+est`). `trk` is implied, as in OVS.
pub fn parse_ct_state(text: &str) -> Result<u32, String> {
    let mut state = ct_state::TRK;
    let mut any = false;
    for word in text.split([',', '|', '+']).filter(|w| !w.is_empty()) {
        let bit = ct_state::NAMES
            .iter()
            .find(|(name, _)| *name == word)
            .map(|(_, bit)| *bit)
            .ok_or_else(|| {
                format!(
                    "unknown conntrack state flag '{word}' in '{text}' (expected: new, est, rel, rpl, inv, trk, snat, dnat)"
                )
            })?;
        state |= bit;
        any = true;
    }
    if !any {
        return Err(format!("empty conntrack state '{text}'"));
    }
    Ok(state)
}

/// Parses a packet given in hex (`0a580af40004...`); whitespace, `:` and a
/// leading `0x` are allowed (the control protocol's own hex reader).
pub fn parse_hex_packet(text: &str) -> Result<Vec<u8>, String> {
    oxvs_api::from_hex(text)
}

/// Parses a table given by number (`50`) or name (`L3Forwarding`).
pub fn parse_table(text: &str, names: &TableNames) -> Result<u8, String> {
    if let Ok(n) = text.parse::<u8>() {
        if n < 255 {
            return Ok(n);
        }
        return Err(format!("table number {n} out of range (0..=254)"));
    }
    names
        .id(text)
        .ok_or_else(|| format!("unknown table '{text}' (give a number 0..=254 or a table name)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_state_forms() {
        let tn = ct_state::TRK | ct_state::NEW;
        assert_eq!(parse_ct_state("trk,new"), Ok(tn));
        assert_eq!(parse_ct_state("new|trk"), Ok(tn));
        assert_eq!(parse_ct_state("+trk+new"), Ok(tn));
        assert_eq!(parse_ct_state("new"), Ok(tn));
        assert_eq!(
            parse_ct_state("est,rpl"),
            Ok(ct_state::TRK | ct_state::EST | ct_state::RPL)
        );
        assert!(parse_ct_state("trk,bogus").unwrap_err().contains("bogus"));
        assert!(parse_ct_state(",").is_err());
    }

    #[test]
    fn hex_packets() {
        assert_eq!(parse_hex_packet("0x0aFF"), Ok(vec![0x0a, 0xff]));
        assert_eq!(parse_hex_packet("0a ff\n01:02"), Ok(vec![0x0a, 0xff, 1, 2]));
        assert!(parse_hex_packet("abc").unwrap_err().contains("odd"));
        assert!(parse_hex_packet("zz").unwrap_err().contains("'zz'"));
        assert!(parse_hex_packet("  ").is_err());
        // Multi-byte UTF-8 never panics.
        assert!(parse_hex_packet("é1").is_err());
    }

    #[test]
    fn tables_by_number_or_name() {
        let names = TableNames::default();
        assert_eq!(parse_table("50", &names), Ok(50));
        assert_eq!(parse_table("SpoofGuard", &names), Ok(10));
        assert!(parse_table("255", &names).is_err());
        assert!(parse_table("Nope", &names).unwrap_err().contains("Nope"));
    }
}
