//! No import cycles between the files of a crate (issues #12, #25).
//!
//! For each checked crate, every `.rs` file under `src/` is a node (`a/b.rs` and `a/b/mod.rs`
//! are module `a::b`); a file that names `crate::x::y` (in code or in a doc link) has an edge
//! to the longest such prefix that is a file of the crate. `super::` and `self::` paths are
//! resolved the same way, and so are paths from a child module's name (`chat::handle` in
//! `routes/mod.rs`), from a module imported whole (`use crate::routes;` then
//! `routes::chat::handle`), and each item of a `{..}` group. A child's use of its ancestors
//! is not an edge (children use their parent's items); a parent's use of its child's items,
//! beyond the `mod` that declares it and `pub use` re-exports of them, is. The crate root (which declares and re-exports)
//! has no edges, and test code (`tests` files and trailing `#[cfg(test)] mod tests` blocks)
//! is ignored. A cycle means no file of it can be read, changed or moved without the
//! others: the test fails and prints each cycle with its edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose files must not import each other in a circle, by folder ("" is the
/// root package, the `Engine` facade; `cli` the command line).
const CRATES: &[&str] = &[
    "",
    "cli",
    "actors",
    "model",
    "api",
    "kernels",
    "gpu_check",
    "gpu_emu",
];

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
            let krate = if krate.is_empty() { "dcpserve" } else { krate };
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
        for (segments, reexport) in referenced_paths(strip_tests(&text), module, &files) {
            // The longest prefix that names a file of the crate.
            let target = (1..=segments.len())
                .rev()
                .map(|k| segments[..k].join("::"))
                .find(|cand| files.contains_key(cand));
            if let Some(t) = target {
                // A child may use its ancestors' items; a parent that uses its child's items
                // (beyond declaring it) depends on it like on any other file.
                // Re-exporting a descendant's items (`pub use ops::X`) is declaring it.
                let own_ancestor = t == *module || module.starts_with(&format!("{t}::"));
                let shows_descendant = reexport && t.starts_with(&format!("{module}::"));
                if !own_ancestor && !shows_descendant && !module.is_empty() {
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

/// The absolute module paths (as segments) that `text`, the source of `module`, names:
/// paths from `crate::`, `super::` or `self::`, paths from a child module's name (`chat::`
/// in `routes/mod.rs`), and paths from a module imported by name (`use crate::routes;` then
/// `routes::chat::handle`); `{a, b::c}` groups name each of their paths. Each comes with
/// whether it is re-exported (`pub use`) rather than used.
fn referenced_paths(
    text: &str,
    module: &str,
    files: &BTreeMap<String, PathBuf>,
) -> Vec<(Vec<String>, bool)> {
    let base: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let starts = path_starts(text);
    let mut out = Vec::new();
    // Modules imported whole, by the name they go by in this file.
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for &(at, head) in &starts {
        let mut segments = match head {
            "crate" => Vec::new(),
            "super" => base[..base.len().saturating_sub(1)].to_vec(),
            "self" => base.clone(),
            child if files.contains_key(&join(&base, child)) => {
                let mut s = base.clone();
                s.push(child.to_string());
                s
            }
            _ => continue,
        };
        let mut rest = &text[at + head.len() + 2..];
        // `super::super::x` climbs once per `super`.
        while let Some(tail) = rest.strip_prefix("super::").filter(|_| head == "super") {
            segments.pop();
            rest = tail;
        }
        let before_use = text[..at].trim_end().strip_suffix("use");
        let is_use = before_use
            .is_some_and(|before| before.is_empty() || before.ends_with(char::is_whitespace));
        // `pub use`, `pub(crate) use`: the module shows another's items, it does not use them.
        let reexport = is_use
            && before_use.is_some_and(|before| {
                let before = before.trim_end();
                before.ends_with("pub")
                    || before
                        .strip_suffix(')')
                        .and_then(|b| b.rsplit_once("pub("))
                        .is_some_and(|(_, scope)| scope.chars().all(|c| is_ident(c) || c == ':'))
            });
        let mut paths = Vec::new();
        read_paths(rest, segments, &mut paths);
        for (path, name) in paths {
            if let (true, Some(name)) = (is_use, name) {
                if files.contains_key(&path.join("::")) {
                    aliases.insert(name, path.clone());
                }
            }
            out.push((path, reexport));
        }
    }
    for &(at, head) in &starts {
        if let Some(target) = aliases.get(head) {
            let mut paths = Vec::new();
            read_paths(&text[at + head.len() + 2..], target.clone(), &mut paths);
            out.extend(paths.into_iter().map(|(path, _)| (path, false)));
        }
    }
    out
}

fn join(base: &[String], name: &str) -> String {
    base.iter()
        .map(String::as_str)
        .chain([name])
        .collect::<Vec<_>>()
        .join("::")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
}

/// Where each path that starts with a lowercase name and `::` begins in `text`, and that
/// name (`crate`, `super`, a module, an external crate, ...); not the later segments.
fn path_starts(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for (sep, _) in text.match_indices("::") {
        let head_start = text[..sep]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_ident(c) || c.is_ascii_uppercase())
            .last()
            .map_or(sep, |(i, _)| i);
        let head = &text[head_start..sep];
        let before = text[..head_start].chars().next_back();
        let mid_path = before.is_some_and(|c| c == ':' || is_ident(c) || c.is_ascii_uppercase());
        if !head.is_empty() && head.chars().all(is_ident) && !mid_path {
            out.push((head_start, head));
        }
    }
    out
}

/// The paths named by `s`, the text after `prefix::`, each with the name it imports under
/// when it is a whole `use` item (its last segment, or its `as` name); `{..}` groups give
/// one path per item.
fn read_paths(s: &str, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut segments = prefix;
    let mut rest = s.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut from) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    '}' | ',' if depth == 0 => {
                        if !group[from..i].trim().is_empty() {
                            read_paths(&group[from..i], segments.clone(), out);
                        }
                        if c == '}' {
                            return;
                        }
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        let after = &rest[name.len()..];
        if name.is_empty() || after.starts_with(|c: char| c.is_ascii_uppercase()) {
            out.push((segments, None));
            return;
        }
        match after.strip_prefix("::") {
            Some(tail) => {
                segments.push(name);
                rest = tail.trim_start();
            }
            None => {
                let alias = after.trim_start().strip_prefix("as ").map(|a| {
                    a.trim_start()
                        .chars()
                        .take_while(|&c| is_ident(c))
                        .collect()
                });
                let whole = after.trim_start().starts_with([';', ',', '}']) || alias.is_some();
                let imported = if name == "self" {
                    segments.last().cloned()
                } else {
                    segments.push(name.clone());
                    Some(name)
                };
                out.push((segments, whole.then(|| alias.or(imported)).flatten()));
                return;
            }
        }
    }
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
