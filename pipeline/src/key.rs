//! The flow key: every field of a packet and its metadata, as fixed words.
//!
//! A [`FlowKey`] is `KEY_WORDS` 64-bit words; [`Field::slot`] says where each
//! field lives. The same type is used for keys, match values and masks, so a
//! match is `(key & mask) == value` word by word, a megaflow mask is a
//! `FlowKey`, and hashing a masked key is hashing words. Unused bits are
//! always zero.

use crate::field::{Field, KEY_WORDS};

// `hash64` hashes the words in lanes of four.
const _: () = assert!(KEY_WORDS.is_multiple_of(4));

/// A packet's flow key, a match value, or a mask (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    /// The raw words. Layout: [`Field::slot`].
    pub w: [u64; KEY_WORDS],
}

impl std::fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for field in Field::ALL {
            if !self.owns(*field) {
                continue;
            }
            let v = self.get(*field);
            if v != 0 {
                m.entry(&field.name(), &format_args!("{v:#x}"));
            }
        }
        m.finish()
    }
}

impl FlowKey {
    /// A key with every bit zero (also: the all-wildcard mask).
    pub const ZERO: FlowKey = FlowKey { w: [0; KEY_WORDS] };

    /// Reads a field (right-aligned).
    #[inline]
    pub fn get(&self, field: Field) -> u128 {
        let s = field.slot();
        let w = s.word as usize;
        if s.bits > 64 {
            ((self.w[w] as u128) << 64) | self.w[w + 1] as u128
        } else if s.bits == 64 {
            self.w[w] as u128
        } else {
            ((self.w[w] >> s.shift) & ((1u64 << s.bits) - 1)) as u128
        }
    }

    /// Whether this key's packet owns the bits of `field`: always, except
    /// for the fields that share bits with another packet kind's
    /// ([`Field::owned_by`] of the key's `dl_type`).
    #[inline]
    pub fn owns(&self, field: Field) -> bool {
        !field.shares_storage() || field.owned_by(self.get(Field::DlType) as u16)
    }

    /// Writes a field; bits of `value` beyond the field's width are ignored.
    #[inline]
    pub fn set(&mut self, field: Field, value: u128) {
        let s = field.slot();
        let w = s.word as usize;
        if s.bits > 64 {
            self.w[w] = (value >> 64) as u64;
            self.w[w + 1] = value as u64;
        } else if s.bits == 64 {
            self.w[w] = value as u64;
        } else {
            let m = ((1u64 << s.bits) - 1) << s.shift;
            self.w[w] = (self.w[w] & !m) | (((value as u64) << s.shift) & m);
        }
    }

    /// Writes the bits of `value` selected by `mask` into a field, leaving the
    /// other bits as they were.
    #[inline]
    pub fn set_masked(&mut self, field: Field, value: u128, mask: u128) {
        let old = self.get(field);
        self.set(field, (old & !mask) | (value & mask));
    }

    /// `self & mask`, word by word.
    #[inline]
    pub fn and(&self, mask: &FlowKey) -> FlowKey {
        let mut out = FlowKey::ZERO;
        for i in 0..KEY_WORDS {
            out.w[i] = self.w[i] & mask.w[i];
        }
        out
    }

    /// `self | other`, word by word (union of masks).
    #[inline]
    pub fn or_assign(&mut self, other: &FlowKey) {
        for i in 0..KEY_WORDS {
            self.w[i] |= other.w[i];
        }
    }

    /// Whether `(self & mask) == value`, i.e. this key matches a (value, mask) pair.
    #[inline]
    pub fn matches(&self, value: &FlowKey, mask: &FlowKey) -> bool {
        let mut diff = 0u64;
        for i in 0..KEY_WORDS {
            diff |= (self.w[i] & mask.w[i]) ^ value.w[i];
        }
        diff == 0
    }

    /// Whether every bit is zero.
    pub fn is_zero(&self) -> bool {
        self.w.iter().all(|w| *w == 0)
    }

    /// Sets every bit of `field` (for building masks).
    #[inline]
    pub fn mask_field(&mut self, field: Field) {
        self.set(field, u128::MAX);
    }

    /// A 64-bit hash of the whole key (for exact-match and megaflow tables).
    ///
    /// Four independent multiply-rotate lanes (words `i`, `i+4`, ...) so the
    /// CPU overlaps the multiplications, then a final avalanche so every
    /// output bit (the caches index with the low ones) depends on every
    /// input bit. Not DoS-resistant: the caches are bounded, so a collision
    /// storm only costs slow-path time.
    #[inline]
    pub fn hash64(&self) -> u64 {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut lanes: [u64; 4] = [
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        ];
        for chunk in self.w.chunks_exact(4) {
            for (lane, w) in lanes.iter_mut().zip(chunk) {
                *lane = (*lane ^ w).wrapping_mul(K).rotate_left(29);
            }
        }
        let mut h = lanes[0]
            ^ lanes[1].rotate_left(17)
            ^ lanes[2].rotate_left(31)
            ^ lanes[3].rotate_left(47);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A `Hasher` for hash maps whose keys already are 64-bit hashes (of a
/// masked [`FlowKey`]): `write_u64` passes the value through.
#[derive(Default, Clone, Copy)]
pub struct PrehashedU64(u64);

impl std::hash::Hasher for PrehashedU64 {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are used; fold anything else in anyway.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_set_roundtrip() {
        let mut k = FlowKey::ZERO;
        k.set(Field::Reg(3), 0xdead_beef);
        k.set(Field::Ipv6Src, 0x2001_0db8_0000_0000_0000_0000_0000_0001);
        k.set(Field::TpDst, 0x1_0050); // truncated to 16 bits
        assert_eq!(k.get(Field::Reg(3)), 0xdead_beef);
        assert_eq!(k.get(Field::Reg(2)), 0);
        assert_eq!(k.get(Field::Xreg(1)), 0xdead_beef);
        assert_eq!(
            k.get(Field::Ipv6Src),
            0x2001_0db8_0000_0000_0000_0000_0000_0001
        );
        assert_eq!(k.get(Field::TpDst), 0x50);
        k.set_masked(Field::Reg(3), 0x1234, 0xffff);
        assert_eq!(k.get(Field::Reg(3)), 0xdead_1234);
    }

    #[test]
    fn hash_spreads_single_bit_changes() {
        // Every single-bit change of a key changes the hash, and the low 13
        // bits (an EMC index) take many values over a field's range.
        let base = FlowKey::ZERO;
        let h0 = base.hash64();
        for word in 0..KEY_WORDS {
            for bit in 0..64 {
                let mut k = base;
                k.w[word] ^= 1 << bit;
                assert_ne!(k.hash64(), h0, "word {word} bit {bit}");
            }
        }
        let mut seen = std::collections::HashSet::new();
        for port in 0..4096u128 {
            let mut k = base;
            k.set(Field::TpSrc, port);
            seen.insert(k.hash64() & 0x1fff);
        }
        assert!(seen.len() > 3000, "{} distinct EMC slots", seen.len());
    }

    #[test]
    fn masked_match() {
        let mut k = FlowKey::ZERO;
        k.set(Field::NwDst, 0x0a00_0105);
        let mut mask = FlowKey::ZERO;
        mask.set(Field::NwDst, 0xffff_ff00);
        let value = k.and(&mask);
        let mut other = FlowKey::ZERO;
        other.set(Field::NwDst, 0x0a00_01ff);
        assert!(other.matches(&value, &mask));
        other.set(Field::NwDst, 0x0a00_0201);
        assert!(!other.matches(&value, &mask));
    }
}
