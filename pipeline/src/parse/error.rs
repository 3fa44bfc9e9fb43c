//! Parse errors and where they are: [`ParseError`] (the token and its byte
//! offset), [`FileError`] (line and column in a flow file), and [`Src`],
//! the whole text, which turns a token (a sub-slice of it) back into its
//! offset.

/// A parse error: what was wrong, the offending token and its byte position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg} at byte {pos}: '{token}'")]
pub struct ParseError {
    /// Byte offset of `token` in the parsed text.
    pub pos: usize,
    pub token: String,
    pub msg: String,
}

/// A parse error in a flow file, with its 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {error}")]
pub struct FileError {
    pub line: usize,
    pub column: usize,
    pub error: ParseError,
}

/// The whole text being parsed; turns sub-slices into byte offsets.
#[derive(Clone, Copy)]
pub(super) struct Src<'a> {
    pub(super) text: &'a str,
}

impl<'a> Src<'a> {
    /// Byte offset of `tok` (a sub-slice of the source) in the source.
    pub(super) fn pos(&self, tok: &str) -> usize {
        let start = self.text.as_ptr() as usize;
        let p = tok.as_ptr() as usize;
        if p >= start && p <= start + self.text.len() {
            p - start
        } else {
            0
        }
    }

    pub(super) fn err(&self, tok: &str, msg: impl Into<String>) -> ParseError {
        ParseError {
            pos: self.pos(tok),
            token: tok.to_string(),
            msg: msg.into(),
        }
    }

    /// An empty token at the end of `tok` (for "missing X" errors).
    pub(super) fn end_of(&self, tok: &'a str) -> &'a str {
        &tok[tok.len()..]
    }
}

pub(super) type PResult<T> = Result<T, ParseError>;
