//! Reading a flow file and loading it into an in-process pipeline.
//!
//! A flow file is `ovs-ofctl add-flows` text: one flow per line, `#`
//! comments and blank lines ignored. Loading it is two checks, in order:
//!
//! 1. **Syntax**: [`parse::parse_flow_file`] turns the text into flows or
//!    fails with the line, column and token at fault.
//! 2. **Tables**: the flows become one bundle of `add` flow mods applied to
//!    a fresh [`Pipeline`] atomically, which catches what only the tables
//!    can see (for example a `goto_table` to an earlier table, or a
//!    conjunction whose clauses disagree). The bundle error names the
//!    failing flow mod by its index, which maps back to a line of the file.
//!
//! A group file (`--groups`, `ovs-ofctl add-groups` text) goes into the
//! same bundle, before the flows, so flows may name its groups.
//!
//! Errors print as `FILE:LINE:COLUMN: message (token 'x')`, the format
//! editors and CI logs link to.

use std::io::Read as _;

use anyhow::Context as _;
use oxvs_pipeline::flow::{Flow, FlowMod, FlowModCommand};
use oxvs_pipeline::group::GroupMod;
use oxvs_pipeline::parse::{self, FileError, ParseContext};
use oxvs_pipeline::tables::{FlowModError, Pipeline, TableMod};

/// Flow text plus the name to use for it in messages.
#[derive(Debug)]
pub struct Source {
    /// The path as given, or `<stdin>` for `-`.
    pub name: String,
    pub text: String,
}

impl Source {
    /// Reads `path`; `-` means standard input.
    pub fn read(path: &str) -> anyhow::Result<Source> {
        if path == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read flows from standard input")?;
            return Ok(Source {
                name: "<stdin>".into(),
                text,
            });
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read flow file '{path}'"))?;
        Ok(Source {
            name: path.into(),
            text,
        })
    }
}

/// Why a flow file did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A syntax error.
    #[error("{file}:{}:{}: {} (token '{}')", .err.line, .err.column, .err.error.msg, .err.error.token)]
    Parse { file: String, err: FileError },
    /// The tables refused a flow; `line` is the flow's line when it was found.
    #[error("{file}:{}{err}", line.map(|l| format!("{l}: ")).unwrap_or_else(|| " ".into()))]
    Table {
        file: String,
        line: Option<usize>,
        err: FlowModError,
    },
}

/// A flow file loaded into a pipeline.
#[derive(Debug)]
pub struct Loaded {
    /// The flows in file order.
    pub flows: Vec<Flow>,
    /// The pipeline holding them.
    pub pipeline: Pipeline,
    /// The time the flows were added, on the pipeline's clock (ns).
    pub loaded_at_ns: u64,
}

/// The parse context for flow files: the oxvs table names are accepted.
pub fn parse_context() -> ParseContext {
    ParseContext::default()
}

/// Parses `src` and loads it into a fresh pipeline (see the module doc),
/// with the groups of a group file, if given, in the same bundle before
/// the flows.
pub fn load_with_groups(src: &Source, groups: Option<&Source>) -> Result<Loaded, LoadError> {
    let ctx = parse_context();
    let group_list = match groups {
        Some(g) => parse::parse_group_file(&g.text, &ctx).map_err(|err| LoadError::Parse {
            file: g.name.clone(),
            err,
        })?,
        None => Vec::new(),
    };
    let flows = parse::parse_flow_file(&src.text, &ctx).map_err(|err| LoadError::Parse {
        file: src.name.clone(),
        err,
    })?;
    let pipeline = Pipeline::new();
    let n_groups = group_list.len();
    let mut mods: Vec<TableMod> = group_list
        .into_iter()
        .map(|g| TableMod::Group(GroupMod::Add(g)))
        .collect();
    mods.extend(flows.iter().cloned().map(|f| TableMod::Flow(add_mod(f))));
    // Offline there is no clock worth reading: time starts at 0.
    let loaded_at_ns = 0;
    if let Err(err) = pipeline.apply_bundle(&mods, loaded_at_ns) {
        let (index, err) = match err {
            FlowModError::InBundle { index, error } => (Some(index), *error),
            // A bundle of one is not wrapped: it is that one.
            other => ((mods.len() == 1).then_some(0), other),
        };
        // The failing mod: a group (of the group file) or a flow.
        let (file, lines, index, n) = match (groups, index) {
            (Some(g), Some(i)) if i < n_groups => {
                (g, parse::flow_lines(&g.text), Some(i), n_groups)
            }
            (_, i) => (
                src,
                parse::flow_lines(&src.text),
                i.map(|i| i.saturating_sub(n_groups)),
                flows.len(),
            ),
        };
        let line = index
            .filter(|_| lines.len() == n)
            .and_then(|i| lines.get(i).copied());
        return Err(LoadError::Table {
            file: file.name.clone(),
            line,
            err,
        });
    }
    Ok(Loaded {
        flows,
        pipeline,
        loaded_at_ns,
    })
}

/// An `add-flow` flow mod for `flow`.
pub fn add_mod(flow: Flow) -> FlowMod {
    let table = Some(flow.table);
    FlowMod {
        command: FlowModCommand::Add,
        flow,
        table,
        cookie_mask: 0,
        out_port: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::parse::ParseError;

    #[test]
    fn parse_error_prints_file_line_column_token() {
        let e = LoadError::Parse {
            file: "x.flows".into(),
            err: FileError {
                line: 3,
                column: 17,
                error: ParseError {
                    pos: 16,
                    token: "nw_dts".into(),
                    msg: "unknown field".into(),
                },
            },
        };
        assert_eq!(
            e.to_string(),
            "x.flows:3:17: unknown field (token 'nw_dts')"
        );
    }
}
