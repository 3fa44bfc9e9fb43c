//! Splits flow text into `key`, `key=value`, `key:value` and `key(args)`
//! items, keeping parenthesised arguments (`ct(commit,exec(...))`) in one
//! item.

use super::error::{PResult, Src};

pub(super) fn is_delim(b: u8) -> bool {
    matches!(b, b',' | b' ' | b'\t' | b'\r' | b'\n')
}

/// One `key`, `key=value`, `key:value` or `key(args)` item.
#[derive(Clone, Copy, Debug)]
pub(super) struct Item<'a> {
    pub(super) key: &'a str,
    /// The value (`None` for a bare key).
    pub(super) value: Option<&'a str>,
    /// Whether the value was written in parentheses.
    pub(super) paren: bool,
    /// The whole item as written (for error tokens).
    pub(super) whole: &'a str,
}

/// Splits text into items the way `ofputil_parse_key_value` does: items are
/// separated by commas/whitespace, a value ends at a top-level delimiter,
/// parentheses nest.
pub(super) struct Lexer<'a> {
    pub(super) src: Src<'a>,
    pub(super) s: &'a str,
    pub(super) i: usize,
}

impl<'a> Lexer<'a> {
    pub(super) fn new(src: Src<'a>, s: &'a str) -> Self {
        Lexer { src, s, i: 0 }
    }

    pub(super) fn next_item(&mut self) -> PResult<Option<Item<'a>>> {
        let b = self.s.as_bytes();
        while self.i < b.len() && is_delim(b[self.i]) {
            self.i += 1;
        }
        if self.i >= b.len() {
            return Ok(None);
        }
        let start = self.i;
        while self.i < b.len()
            && !matches!(b[self.i], b'=' | b':' | b'(' | b')')
            && !is_delim(b[self.i])
        {
            self.i += 1;
        }
        let key = &self.s[start..self.i];
        if key.is_empty() {
            let tok = &self.s[start..(start + 1).min(b.len())];
            return Err(self.src.err(tok, "expected a keyword"));
        }
        if self.i >= b.len() || is_delim(b[self.i]) {
            return Ok(Some(Item {
                key,
                value: None,
                paren: false,
                whole: key,
            }));
        }
        match b[self.i] {
            b'(' => {
                let open = self.i;
                let mut depth = 0usize;
                while self.i < b.len() {
                    match b[self.i] {
                        b'(' => depth += 1,
                        b')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                if self.i >= b.len() {
                    return Err(self.src.err(&self.s[start..], "unbalanced parentheses"));
                }
                let value = &self.s[open + 1..self.i];
                self.i += 1;
                let whole = &self.s[start..self.i];
                if self.i < b.len() && !is_delim(b[self.i]) {
                    let rest_end = self.s[self.i..]
                        .find(|c: char| c == ',' || c.is_whitespace())
                        .map_or(b.len(), |e| self.i + e);
                    return Err(self
                        .src
                        .err(&self.s[self.i..rest_end], "unexpected text after ')'"));
                }
                Ok(Some(Item {
                    key,
                    value: Some(value),
                    paren: true,
                    whole,
                }))
            }
            b')' => Err(self
                .src
                .err(&self.s[self.i..self.i + 1], "unbalanced parentheses")),
            _ => {
                self.i += 1; // '=' or ':'
                let vstart = self.i;
                let mut depth = 0usize;
                while self.i < b.len() {
                    match b[self.i] {
                        b'(' => depth += 1,
                        b')' => {
                            if depth == 0 {
                                return Err(self
                                    .src
                                    .err(&self.s[self.i..self.i + 1], "unbalanced parentheses"));
                            }
                            depth -= 1;
                        }
                        c if depth == 0 && is_delim(c) => break,
                        _ => {}
                    }
                    self.i += 1;
                }
                if depth != 0 {
                    return Err(self
                        .src
                        .err(&self.s[vstart..self.i], "unbalanced parentheses"));
                }
                Ok(Some(Item {
                    key,
                    value: Some(&self.s[vstart..self.i]),
                    paren: false,
                    whole: &self.s[start..self.i],
                }))
            }
        }
    }
}
