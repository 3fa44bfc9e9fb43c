//! What the online commands share: where the switch is, how to call it,
//! how to print raw JSON, and how refusals and unreachable switches map to
//! exit codes (1 and 3; see `main.rs`).

use std::path::PathBuf;

use oxvs_api::{Client, ClientError, Request};
use serde_json::Value;

use super::emit;

/// Global options of the online commands.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// oxvs-switchd's control socket.
    pub socket: PathBuf,
    /// Print the raw result JSON instead of text.
    pub json: bool,
}

/// The switch could not be reached (exit code 3); the message names the
/// socket and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

impl Ctx {
    /// Sends `req`; a refusal is an ordinary error (exit 1) carrying the
    /// switch's message, a transport failure is [`Unreachable`].
    pub fn call(&self, req: &Request) -> anyhow::Result<Value> {
        let mut client = Client::connect(&self.socket).map_err(to_anyhow)?;
        client.call(req).map_err(to_anyhow)
    }

    /// With `--json`, prints `result` and returns true.
    pub fn print_json(&self, result: &Value) -> anyhow::Result<bool> {
        if !self.json {
            return Ok(false);
        }
        emit(&format!("{result}\n"))?;
        Ok(true)
    }
}

fn to_anyhow(e: ClientError) -> anyhow::Error {
    if e.is_unreachable() {
        Unreachable(e.to_string()).into()
    } else {
        anyhow::anyhow!("{e}")
    }
}

/// Rewrites the switch's `line L, column C: msg` / `line L: msg` as
/// `FILE:L:C: msg` / `FILE:L: msg`, the offline `check-flows` format.
pub fn locate(file: &str, msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("line ") {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        if !digits.is_empty() {
            if let Some(rest2) = after.strip_prefix(", column ") {
                let col: String = rest2.chars().take_while(char::is_ascii_digit).collect();
                if let Some(m) = rest2[col.len()..].strip_prefix(": ") {
                    if !col.is_empty() {
                        return format!("{file}:{digits}:{col}: {m}");
                    }
                }
            } else if let Some(m) = after.strip_prefix(": ") {
                return format!("{file}:{digits}: {m}");
            }
        }
    }
    format!("{file}: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_rewrites_line_and_column() {
        assert_eq!(
            locate("f.flows", "line 3, column 9: unknown keyword (token 'x')"),
            "f.flows:3:9: unknown keyword (token 'x')"
        );
        assert_eq!(
            locate("f", "line 12: goto_table:0 ..."),
            "f:12: goto_table:0 ..."
        );
        assert_eq!(locate("f", "other"), "f: other");
        assert_eq!(locate("f", "line x: y"), "f: line x: y");
    }
}
