//! `oxvsctl check-flows FILE`: parse and validate a flow file.
//!
//! Validation is what loading the file into a switch would do (see
//! [`crate::flowfile`]): the syntax of every line, then the whole file as
//! one atomic bundle into an in-process pipeline. Prints
//! `N flows in M tables OK` on success, `FILE:LINE:COLUMN: message (token 'x')`
//! on a syntax error (exit code 1).

use std::collections::BTreeSet;

use clap::Args;

use super::{emit, Reported};
use crate::flowfile::{self, Source};

#[derive(Debug, Args)]
pub struct CheckFlows {
    /// The flow file (`ovs-ofctl add-flows` syntax); `-` reads standard input.
    file: String,
    /// A group file (`ovs-ofctl add-groups` text) the flows' `group:ID`
    /// actions may name, loaded in the same bundle.
    #[arg(long, value_name = "FILE")]
    groups: Option<String>,
}

impl CheckFlows {
    pub fn exec(self) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let groups = self.groups.as_deref().map(Source::read).transpose()?;
        let loaded = match flowfile::load_with_groups(&src, groups.as_ref()) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                return Err(Reported.into());
            }
        };
        emit(&format!("{}\n", summary(&loaded.flows)))
    }
}

/// `N flows in M tables OK`.
fn summary(flows: &[oxvs_pipeline::Flow]) -> String {
    let tables: BTreeSet<u8> = flows.iter().map(|f| f.table).collect();
    format!(
        "{} flow{} in {} table{} OK",
        flows.len(),
        if flows.len() == 1 { "" } else { "s" },
        tables.len(),
        if tables.len() == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::Flow;

    #[test]
    fn summary_counts_flows_and_distinct_tables() {
        let f = |table| Flow {
            table,
            ..Flow::default()
        };
        assert_eq!(summary(&[]), "0 flows in 0 tables OK");
        assert_eq!(summary(&[f(0)]), "1 flow in 1 table OK");
        assert_eq!(summary(&[f(0), f(10), f(10)]), "3 flows in 2 tables OK");
    }
}
