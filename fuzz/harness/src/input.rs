//! A reader that turns fuzzer bytes into structured choices.
//!
//! Every getter is total: once the input is exhausted it returns zeros
//! (and empty slices), so a harness never has to handle "too short" and a
//! shorter input is always a prefix of the same run. The fuzzer mutates
//! bytes; the harness decides what they mean.

/// Consumes `data` front to back.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// Whether every byte has been used.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A value in `0..n` (`n > 0`); 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            self.u32() as usize % n
        }
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'b, T>(&mut self, items: &'b [T]) -> &'b T {
        &items[self.below(items.len())]
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A length byte, then that many bytes (at most 255).
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }

    /// A 16-bit length, then that many bytes.
    pub fn long_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let r = self.data;
        self.data = &[];
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_input_reads_zeros() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0102);
        assert_eq!(i.u32(), 0x0300_0000);
        assert!(i.is_empty());
        assert_eq!(i.bytes(4), &[] as &[u8]);
        assert_eq!(i.below(7), 0);
        assert!(!i.bool());
    }
}
