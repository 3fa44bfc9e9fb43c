//! ICMPv6 Neighbour Discovery solicitations and advertisements (RFC 4861
//! 4.3, 4.4): the fields Open vSwitch puts in the flow key, read the way
//! OVS's `parse_icmpv6` (lib/flow.c) reads them.
//!
//! A message is the 8-byte ICMPv6 header (type, code, checksum, a 32-bit
//! word: reserved in a solicitation, the R/S/O flags in an advertisement),
//! the 16-byte target address, then options of `len * 8` bytes each.

use super::{mac_at, u128_at, u32_at};

/// ICMPv6 type of a Neighbour Solicitation.
pub const SOLICIT: u8 = 135;
/// ICMPv6 type of a Neighbour Advertisement.
pub const ADVERT: u8 = 136;
/// Option type: source link-layer address.
pub const OPT_SLL: u8 = 1;
/// Option type: target link-layer address.
pub const OPT_TLL: u8 = 2;
/// Bytes of the ICMPv6 header, flags word and target (OVS `ovs_nd_msg`).
pub const MSG_LEN: usize = 24;
/// The option length unit, and the size of an Ethernet link-layer option.
pub const OPT_UNIT: usize = 8;

/// Byte offsets inside the message (from the ICMPv6 header).
pub mod field {
    use core::ops::Range;
    /// Solicitation: reserved; advertisement: R/S/O flags and reserved.
    pub const RESERVED: Range<usize> = 4..8;
    pub const TARGET: Range<usize> = 8..24;
    /// Inside an option: its type and length (in units of 8 bytes).
    pub const OPT_TYPE: usize = 0;
    pub const OPT_LEN: usize = 1;
    /// Inside an Ethernet link-layer option: the address.
    pub const OPT_MAC: Range<usize> = 2..8;
}

/// The ND fields of the flow key, as OVS extracts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NdFields {
    pub target: u128,
    pub sll: u64,
    pub tll: u64,
    pub reserved: u32,
    pub options_type: u8,
}

/// Whether an ICMPv6 message with this type and code is one OVS parses as
/// ND (it checks neither the hop limit nor the checksum).
#[inline(always)]
pub fn is_nd(msg_type: u8, code: u8) -> bool {
    code == 0 && (msg_type == SOLICIT || msg_type == ADVERT)
}

/// Parses the ND fields of `msg`, an ICMPv6 message of at least 8 bytes
/// whose type and code pass [`is_nd`]. Like OVS:
///
/// - no target (the message stops before byte 24): only `reserved`;
/// - options are walked while 8 bytes remain; one of length 0 or longer
///   than what remains ends the walk, keeping what was found;
/// - the first 8-byte SLL option gives `sll`, the first 8-byte TLL option
///   `tll`, whichever comes first `options_type` (on any message type);
/// - a second SLL or TLL option makes the message invalid: target, SLL
///   and TLL read as zero (`reserved` and `options_type` stay).
pub fn parse(msg: &[u8]) -> NdFields {
    let mut nd = NdFields {
        reserved: u32_at(msg, field::RESERVED),
        ..NdFields::default()
    };
    let Some(options) = msg.get(MSG_LEN..) else {
        return nd;
    };
    nd.target = u128_at(msg, field::TARGET);
    if !read_lla_options(options, &mut nd) {
        nd.target = 0;
        nd.sll = 0;
        nd.tll = 0;
    }
    nd
}

/// Walks the options into `nd`; false if an SLL or TLL option repeats.
fn read_lla_options(mut options: &[u8], nd: &mut NdFields) -> bool {
    let (mut seen_sll, mut seen_tll) = (false, false);
    while let Some(head) = options.first_chunk::<OPT_UNIT>() {
        let len = usize::from(head[field::OPT_LEN]) * OPT_UNIT;
        if len == 0 || len > options.len() {
            break;
        }
        let ty = head[field::OPT_TYPE];
        let slot = match ty {
            OPT_SLL if len == OPT_UNIT => Some((&mut seen_sll, &mut nd.sll)),
            OPT_TLL if len == OPT_UNIT => Some((&mut seen_tll, &mut nd.tll)),
            _ => None,
        };
        if let Some((seen, mac)) = slot {
            if *seen {
                return false;
            }
            *seen = true;
            *mac = mac_at(head, field::OPT_MAC);
            if nd.options_type == 0 {
                nd.options_type = ty;
            }
        }
        options = options.get(len..).unwrap_or_default();
    }
    true
}

/// The offset (in `options`) of the first Ethernet link-layer option (SLL
/// or TLL, 8 bytes), and its type: the one option OVS's `packet_set_nd`
/// rewrites. The walk stops at an option of length 0, or one that does not
/// fit in what remains.
pub fn first_lla_option(options: &[u8]) -> Option<(usize, u8)> {
    let mut at = 0usize;
    loop {
        let head = options.get(at..)?.first_chunk::<OPT_UNIT>()?;
        let len = usize::from(head[field::OPT_LEN]) * OPT_UNIT;
        if len == 0 || at + len > options.len() {
            return None;
        }
        let ty = head[field::OPT_TYPE];
        if len == OPT_UNIT && (ty == OPT_SLL || ty == OPT_TLL) {
            return Some((at, ty));
        }
        at += len;
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn msg(ty: u8, opts: &[u8]) -> Vec<u8> {
        let mut m = vec![ty, 0, 0, 0, 0x60, 0, 0, 0];
        m.extend_from_slice(&0xfd00_0000_0000_0000_0000_0000_0000_0001u128.to_be_bytes());
        m.extend_from_slice(opts);
        m
    }

    const SLL: [u8; 8] = [1, 1, 2, 0, 0, 0, 0, 5];
    const TLL: [u8; 8] = [2, 1, 2, 0, 0, 0, 0, 6];

    #[test]
    fn solicitation_with_sll() {
        let nd = parse(&msg(SOLICIT, &SLL));
        assert_eq!(nd.target, 0xfd00_0000_0000_0000_0000_0000_0000_0001);
        assert_eq!((nd.sll, nd.tll), (0x0200_0000_0005, 0));
        assert_eq!((nd.reserved, nd.options_type), (0x6000_0000, 1));
    }

    #[test]
    fn both_options_and_first_type_wins() {
        let nd = parse(&msg(ADVERT, &[TLL, SLL].concat()));
        assert_eq!(
            (nd.sll, nd.tll, nd.options_type),
            (0x0200_0000_0005, 0x0200_0000_0006, 2)
        );
    }

    #[test]
    fn duplicate_option_is_invalid_but_keeps_flags_and_type() {
        let nd = parse(&msg(SOLICIT, &[SLL, SLL].concat()));
        assert_eq!((nd.target, nd.sll, nd.tll), (0, 0, 0));
        assert_eq!((nd.reserved, nd.options_type), (0x6000_0000, 1));
    }

    #[test]
    fn zero_length_or_overlong_option_ends_the_walk() {
        let zero = [0u8, 0, 0, 0, 0, 0, 0, 0];
        let nd = parse(&msg(SOLICIT, &[zero, SLL].concat()));
        assert_eq!((nd.sll, nd.options_type), (0, 0));
        assert_ne!(nd.target, 0, "the target is kept");
        let nd = parse(&msg(SOLICIT, &[SLL, [1, 2, 0, 0, 0, 0, 0, 0]].concat()));
        assert_eq!(nd.sll, 0x0200_0000_0005, "found before the bad option");
    }

    #[test]
    fn long_options_are_skipped() {
        // A 16-byte option of another type (nonce, 14), then TLL.
        let nonce = [14u8, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let m = msg(ADVERT, &[&nonce[..], &TLL].concat());
        assert_eq!(parse(&m).tll, 0x0200_0000_0006);
        assert_eq!(first_lla_option(&m[MSG_LEN..]), Some((16, OPT_TLL)));
        assert_eq!(first_lla_option(&nonce), None);
    }

    #[test]
    fn truncated_target_gives_only_the_flags_word() {
        let m = msg(SOLICIT, &SLL);
        for cut in 8..MSG_LEN {
            assert_eq!(
                parse(&m[..cut]),
                NdFields {
                    reserved: 0x6000_0000,
                    ..NdFields::default()
                }
            );
        }
        assert!(is_nd(SOLICIT, 0) && !is_nd(SOLICIT, 1) && !is_nd(128, 0));
    }
}
