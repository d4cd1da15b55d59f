//! No import cycles between the files of a crate (issue #12).
//!
//! For each checked crate, every `.rs` file under `src/` is a node (`a/b.rs` and `a/b/mod.rs`
//! are module `a::b`); a file that names `crate::x::y` (in code or in a doc link) has an edge
//! to the longest such prefix that is a file of the crate. `super::` paths are resolved the
//! same way. A module's own ancestors and descendants are not edges (a parent declares its
//! children, children use their parent's items), and test code (`tests` files and trailing
//! `#[cfg(test)] mod tests` blocks) is ignored. A cycle means no file of it can be read,
//! changed or moved without the others: the test fails and prints each cycle with its edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose files must not import each other in a circle.
const CRATES: &[&str] = &["actors", "model", "api", "kernels", "gpu_check"];

/// Module path (`a::b`, `""` for the crate root) -> the modules it references.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn no_import_cycles_between_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = String::new();
    for krate in CRATES {
        let graph = file_graph(&root.join(krate).join("src"));
        assert!(graph.len() > 1, "no sources found for {krate}");
        for cycle in cycles(&graph) {
            report.push_str(&format!("{krate}: cycle between {cycle:?}\n"));
            for m in &cycle {
                let inside: Vec<_> = graph[m].iter().filter(|t| cycle.contains(t)).collect();
                report.push_str(&format!("    {m} -> {inside:?}\n"));
            }
        }
    }
    assert!(report.is_empty(), "import cycles:\n{report}");
}

/// Builds the reference graph of the crate whose sources are under `src`.
fn file_graph(src: &Path) -> Graph {
    let files = module_files(src);
    let mut graph = Graph::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let mut targets = BTreeSet::new();
        for segments in referenced_paths(strip_tests(&text), module) {
            // The longest prefix that names a file of the crate.
            let target = (1..=segments.len())
                .rev()
                .map(|k| segments[..k].join("::"))
                .find(|cand| files.contains_key(cand));
            if let Some(t) = target {
                let related = t == *module
                    || module.starts_with(&format!("{t}::"))
                    || t.starts_with(&format!("{module}::"))
                    || module.is_empty();
                if !related {
                    targets.insert(t);
                }
            }
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

/// Every non-test `.rs` file under `src`, by module path.
fn module_files(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            if parts.last().is_some_and(|p| p == "tests") {
                continue;
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The text before a trailing `#[cfg(test)] mod tests` block, which may use anything.
fn strip_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests") {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// The absolute module paths (as segments) that `text`, the source of `module`, names
/// through `crate::` or `super::`.
fn referenced_paths(text: &str, module: &str) -> Vec<Vec<String>> {
    let base: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let mut out = Vec::new();
    for (prefix, relative) in [("crate::", false), ("super::", true)] {
        for (i, _) in text.match_indices(prefix) {
            // `super::super::x` is found once, at its first `super::`.
            if relative && text[..i].ends_with("super::") {
                continue;
            }
            // `super` is the parent module, whether the file is `b.rs` or `b/mod.rs`.
            let mut segments = if relative {
                base[..base.len().saturating_sub(1)].to_vec()
            } else {
                Vec::new()
            };
            let mut rest = &text[i + prefix.len()..];
            while let Some(tail) = rest.strip_prefix("super::").filter(|_| relative) {
                segments.pop();
                rest = tail;
            }
            for seg in rest.split("::") {
                let name: String = seg
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let whole = name.len() == seg.len();
                if !name.is_empty() {
                    segments.push(name);
                }
                if !whole || segments.is_empty() {
                    break;
                }
            }
            out.push(segments);
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in &self.graph[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    self.low.insert(v, self.low[v].min(self.low[w]));
                } else if self.stack.contains(&w) {
                    self.low.insert(v, self.low[v].min(self.index[w]));
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).unwrap();
                let comp: Vec<String> = self.stack.drain(at..).map(String::from).collect();
                if comp.len() > 1 {
                    self.found.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found
}
