//! The reachability truth table, printed the way the upstream Kubernetes
//! NetworkPolicy e2e tests print theirs: one row per source pod ("from"),
//! one column per destination ("to"), `ns/pod` names in the header and
//! first column, `.` for reachable, `X` for blocked, `?` for no answer
//! (unsupported protocol, probe error, or a pair never probed). Columns are
//! padded to the widest name so the matrix lines up in a terminal.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Reachable,
    Blocked,
    Unknown,
}

impl Mark {
    pub fn symbol(self) -> char {
        match self {
            Mark::Reachable => '.',
            Mark::Blocked => 'X',
            Mark::Unknown => '?',
        }
    }
    pub fn from_symbol(c: char) -> Option<Mark> {
        match c {
            '.' => Some(Mark::Reachable),
            'X' | 'x' => Some(Mark::Blocked),
            '?' => Some(Mark::Unknown),
            _ => None,
        }
    }
}

/// A from x to matrix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TruthTable {
    pub froms: Vec<String>,
    pub tos: Vec<String>,
    cells: BTreeMap<(String, String), Mark>,
}

impl TruthTable {
    pub fn new(froms: Vec<String>, tos: Vec<String>) -> TruthTable {
        TruthTable {
            froms,
            tos,
            cells: BTreeMap::new(),
        }
    }

    pub fn set(&mut self, from: &str, to: &str, mark: Mark) {
        self.cells.insert((from.to_string(), to.to_string()), mark);
    }

    pub fn get(&self, from: &str, to: &str) -> Mark {
        self.cells
            .get(&(from.to_string(), to.to_string()))
            .copied()
            .unwrap_or(Mark::Unknown)
    }

    /// How many cells are marked `mark`.
    pub fn count(&self, mark: Mark) -> usize {
        self.froms
            .iter()
            .flat_map(|f| self.tos.iter().map(move |t| (f, t)))
            .filter(|(f, t)| self.get(f, t) == mark)
            .count()
    }

    /// The pairs where `self` and `other` differ (`from`, `to`, ours, theirs).
    pub fn diff(&self, other: &TruthTable) -> Vec<(String, String, Mark, Mark)> {
        let mut out = Vec::new();
        for f in &self.froms {
            for t in &self.tos {
                let (a, b) = (self.get(f, t), other.get(f, t));
                if a != b {
                    out.push((f.clone(), t.clone(), a, b));
                }
            }
        }
        out
    }

    /// The table as text: a header line starting with `-`, then one line
    /// per source; every line ends with a newline.
    pub fn render(&self) -> String {
        let first = self
            .froms
            .iter()
            .map(String::len)
            .chain(std::iter::once(1))
            .max()
            .unwrap_or(1);
        let widths: Vec<usize> = self.tos.iter().map(|t| t.len().max(1)).collect();
        let mut s = String::new();
        let mut line = format!("{:<first$}", "-");
        for (t, w) in self.tos.iter().zip(&widths) {
            let _ = write!(line, "  {t:<w$}");
        }
        s.push_str(line.trim_end());
        s.push('\n');
        for f in &self.froms {
            let mut line = format!("{f:<first$}");
            for (t, w) in self.tos.iter().zip(&widths) {
                let _ = write!(line, "  {:<w$}", self.get(f, t).symbol());
            }
            s.push_str(line.trim_end());
            s.push('\n');
        }
        s
    }

    /// Parses [`TruthTable::render`]'s format (whitespace-separated), e.g.
    /// an expected table in a test.
    pub fn parse(text: &str) -> Result<TruthTable, String> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let header = lines.next().ok_or("empty truth table")?;
        let mut cols = header.split_whitespace();
        if cols.next() != Some("-") {
            return Err(format!("header must start with '-': {header:?}"));
        }
        let tos: Vec<String> = cols.map(str::to_string).collect();
        let mut t = TruthTable::new(Vec::new(), tos.clone());
        for line in lines {
            let mut words = line.split_whitespace();
            let from = words.next().ok_or("empty row")?.to_string();
            let marks: Vec<&str> = words.collect();
            if marks.len() != tos.len() {
                return Err(format!(
                    "row {from}: {} cells for {} columns",
                    marks.len(),
                    tos.len()
                ));
            }
            for (to, m) in tos.iter().zip(marks) {
                let mark = m
                    .chars()
                    .next()
                    .filter(|_| m.len() == 1)
                    .and_then(Mark::from_symbol)
                    .ok_or_else(|| format!("row {from}: bad cell {m:?} (use . X ?)"))?;
                t.set(&from, to, mark);
            }
            t.froms.push(from);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_rows_and_columns() {
        let names = vec!["x/a".to_string(), "x/b".to_string(), "yy/long".to_string()];
        let mut t = TruthTable::new(names.clone(), names.clone());
        for f in &names {
            for to in &names {
                t.set(f, to, Mark::Reachable);
            }
        }
        t.set("x/a", "x/b", Mark::Blocked);
        t.set("yy/long", "x/a", Mark::Unknown);
        let want = "\
-        x/a  x/b  yy/long
x/a      .    X    .
x/b      .    .    .
yy/long  ?    .    .
";
        assert_eq!(t.render(), want);
        assert_eq!(t.count(Mark::Reachable), 7);
        assert_eq!(t.count(Mark::Blocked), 1);
        assert_eq!(t.count(Mark::Unknown), 1);
    }

    #[test]
    fn missing_cells_print_as_unknown_and_parse_round_trips() {
        let mut t = TruthTable::new(vec!["a/a".into()], vec!["a/a".into(), "b/b".into()]);
        t.set("a/a", "a/a", Mark::Blocked);
        let text = t.render();
        assert_eq!(text, "-    a/a  b/b\na/a  X    ?\n");
        let back = TruthTable::parse(&text).expect("parse");
        assert_eq!(back.render(), text);
        assert!(back.diff(&t).is_empty());
        let mut other = back.clone();
        other.set("a/a", "b/b", Mark::Reachable);
        assert_eq!(
            t.diff(&other),
            vec![("a/a".into(), "b/b".into(), Mark::Unknown, Mark::Reachable)]
        );
    }

    #[test]
    fn parse_rejects_malformed_tables() {
        assert!(TruthTable::parse("").is_err());
        assert!(TruthTable::parse("x a b\n").is_err());
        assert!(TruthTable::parse("- a b\na . \n").is_err());
        assert!(TruthTable::parse("- a\na Y\n").is_err());
    }
}
