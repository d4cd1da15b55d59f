//! What the compile step needs to know about a CUDA source before the host compiler sees
//! it: the `__global__` kernels (name, `extern "C"`, `__launch_bounds__`, the
//! `__shared__` declarations of their bodies) and the `extern __shared__` declarations
//! to rewrite. A token scan, not a parser: it reads the kernels of this project and
//! sources written like them; what it misreads the host compiler rejects.

/// One `__global__` function definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelDecl {
    pub name: String,
    pub extern_c: bool,
    pub templated: bool,
    /// The first argument of `__launch_bounds__`, if any.
    pub launch_bounds: Option<String>,
    /// `sizeof` expressions of the body's static `__shared__` variables.
    pub shared_sizes: Vec<String>,
}

/// A source scanned: its kernels and the text with `extern __shared__` rewritten.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub kernels: Vec<KernelDecl>,
    pub rewritten: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ident,
    Str,
    Punct,
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
}

/// Tokens of `src`, comments and preprocessor lines skipped (string and character
/// literals are single tokens).
fn tokenize(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'#' && line_start {
            // A directive, with its continuation lines.
            while i < b.len() && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'\n' {
                    i += 1;
                }
                i += 1;
            }
            continue;
        }
        line_start = false;
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i = (i + 2).min(b.len());
            continue;
        }
        let start = i;
        let kind = if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            Kind::Str
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            Kind::Ident
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            Kind::Other
        } else {
            i += 1;
            Kind::Punct
        };
        out.push(Tok {
            kind,
            start,
            end: i,
        });
    }
    out
}

struct Scanner<'a> {
    src: &'a str,
    toks: Vec<Tok>,
}

impl<'a> Scanner<'a> {
    fn text(&self, i: usize) -> &'a str {
        let t = self.toks[i];
        &self.src[t.start..t.end]
    }

    fn is(&self, i: usize, s: &str) -> bool {
        i < self.toks.len() && self.text(i) == s
    }

    /// The index of the token closing the group opened at `open` (`(`, `[` or `{`).
    fn close_of(&self, open: usize) -> Option<usize> {
        let (o, c) = match self.text(open) {
            "(" => ("(", ")"),
            "[" => ("[", "]"),
            _ => ("{", "}"),
        };
        let mut depth = 0usize;
        for i in open..self.toks.len() {
            if self.is(i, o) {
                depth += 1;
            } else if self.is(i, c) {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
        }
        None
    }

    /// The first `;` at depth 0 from `from`.
    fn statement_end(&self, from: usize) -> Option<usize> {
        let mut depth = 0i32;
        for i in from..self.toks.len() {
            match self.text(i) {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth -= 1,
                ";" if depth == 0 => return Some(i),
                _ => {}
            }
        }
        None
    }

    /// Source text of tokens first..=last (as written).
    fn span(&self, first: usize, last: usize) -> &'a str {
        &self.src[self.toks[first].start..self.toks[last].end]
    }

    /// Whether the declaration holding token `at` starts with `extern "..."` or
    /// `template`: looks back to the previous `;`, `}` or `{`.
    fn prefix_has(&self, at: usize) -> (bool, bool) {
        let (mut ext, mut templ) = (false, false);
        let mut i = at;
        while i > 0 {
            i -= 1;
            match self.text(i) {
                // Inside `extern "C" { ... }` every declaration is extern "C".
                "{" => {
                    ext |= i >= 2 && self.toks[i - 1].kind == Kind::Str && self.is(i - 2, "extern");
                    break;
                }
                ";" | "}" => break,
                "extern" if self.toks.get(i + 1).map(|t| t.kind) == Some(Kind::Str) => ext = true,
                "template" => templ = true,
                _ => {}
            }
        }
        (ext, templ)
    }
}

/// Drops `__align__(…)` / `alignas(…)` groups and returns the remaining tokens' texts.
fn decl_tokens<'a>(s: &Scanner<'a>, first: usize, last: usize) -> Vec<(Kind, &'a str)> {
    let mut out = Vec::new();
    let mut i = first;
    while i <= last {
        let t = s.text(i);
        if (t == "__align__" || t == "alignas") && s.is(i + 1, "(") {
            i = s.close_of(i + 1).map_or(last + 1, |c| c + 1);
            continue;
        }
        out.push((s.toks[i].kind, t));
        i += 1;
    }
    out
}

/// One declarator: its prefix (such as `*`), name and array suffix (such as `[4][8]`).
type Declarator = (String, String, String);

/// Splits a declaration (tokens after `__shared__`, before `;`) into its base type and
/// each declarator's (prefix such as `*`, name, array suffix).
fn split_declarators(toks: &[(Kind, &str)]) -> Option<(String, Vec<Declarator>)> {
    let mut segments: Vec<Vec<(Kind, &str)>> = vec![Vec::new()];
    let mut depth = 0;
    for &(k, t) in toks {
        match t {
            "(" | "[" | "<" => depth += 1,
            ")" | "]" | ">" => depth -= 1,
            "," if depth == 0 => {
                segments.push(Vec::new());
                continue;
            }
            _ => {}
        }
        if let Some(seg) = segments.last_mut() {
            seg.push((k, t));
        }
    }
    let join = |ts: &[(Kind, &str)]| ts.iter().map(|t| t.1).collect::<Vec<_>>().join(" ");
    let mut base = String::new();
    let mut decls = Vec::new();
    for (n, seg) in segments.iter().enumerate() {
        let bracket = seg.iter().position(|t| t.1 == "[").unwrap_or(seg.len());
        let name_at = bracket.checked_sub(1)?;
        if seg[name_at].0 != Kind::Ident {
            return None;
        }
        let before = &seg[..name_at];
        let (prefix, ty) = if n == 0 {
            // Pointer marks belong to the declarator; the rest is the base type.
            let stars = before
                .iter()
                .rev()
                .take_while(|t| t.1 == "*" || t.1 == "&")
                .count();
            (
                join(&before[before.len() - stars..]),
                join(&before[..before.len() - stars]),
            )
        } else {
            (join(before), String::new())
        };
        if n == 0 {
            if ty.is_empty() {
                return None;
            }
            base = ty;
        }
        decls.push((prefix, seg[name_at].1.to_owned(), join(&seg[bracket..])));
    }
    Some((base, decls))
}

/// Scans `src` (see the module comment).
pub fn scan(src: &str) -> Scanned {
    let s = Scanner {
        src,
        toks: tokenize(src),
    };
    let mut kernels: Vec<KernelDecl> = Vec::new();
    // (byte range, replacement) of each `extern __shared__` declaration.
    let mut rewrites: Vec<(usize, usize, String)> = Vec::new();
    let n = s.toks.len();
    for i in 0..n {
        if s.is(i, "extern") && s.is(i + 1, "__shared__") {
            if let Some(end) = s.statement_end(i + 2) {
                let toks = decl_tokens(&s, i + 2, end - 1);
                if let Some((base, decls)) = split_declarators(&toks) {
                    let text: Vec<String> = decls
                        .iter()
                        .map(|(prefix, name, _)| {
                            format!("::dcpemu::DynShared<{base} {prefix}> {name};")
                        })
                        .collect();
                    let (a, b) = (s.toks[i].start, s.toks[end].end);
                    let newlines = src[a..b].matches('\n').count();
                    rewrites.push((a, b, format!("{}{}", text.join(" "), "\n".repeat(newlines))));
                }
            }
        }
        if !s.is(i, "__global__") {
            continue;
        }
        let (extern_c, templated) = s.prefix_has(i);
        let mut j = i + 1;
        let mut launch_bounds = None;
        let mut name = None;
        while j + 1 < n && !s.is(j, ";") && !s.is(j, "{") {
            if s.is(j, "__launch_bounds__") && s.is(j + 1, "(") {
                if let Some(c) = s.close_of(j + 1) {
                    // Its first argument (up to a top-level comma).
                    let mut k = j + 2;
                    let mut depth = 0;
                    while k < c && !(depth == 0 && s.is(k, ",")) {
                        match s.text(k) {
                            "(" => depth += 1,
                            ")" => depth -= 1,
                            _ => {}
                        }
                        k += 1;
                    }
                    if k > j + 2 {
                        launch_bounds = Some(s.span(j + 2, k - 1).to_owned());
                    }
                    j = c + 1;
                    continue;
                }
            }
            if s.toks[j].kind == Kind::Ident && s.is(j + 1, "(") {
                name = Some(j);
                break;
            }
            j += 1;
        }
        let Some(name_at) = name else { continue };
        let Some(params_close) = s.close_of(name_at + 1) else {
            continue;
        };
        // A definition has its body next (possibly after qualifiers); a declaration ends.
        let mut b = params_close + 1;
        while b < n && !s.is(b, "{") && !s.is(b, ";") {
            b += 1;
        }
        if !s.is(b, "{") {
            continue;
        }
        let body_end = s.close_of(b).unwrap_or(n - 1);
        let mut shared_sizes = Vec::new();
        for k in b..body_end {
            if s.is(k, "__shared__") && !s.is(k.wrapping_sub(1), "extern") {
                if let Some(end) = s.statement_end(k + 1) {
                    let toks = decl_tokens(&s, k + 1, end - 1);
                    if let Some((base, decls)) = split_declarators(&toks) {
                        for (prefix, _, dims) in decls {
                            shared_sizes.push(format!("sizeof({base} {prefix} {dims})"));
                        }
                    }
                }
            }
        }
        let name = s.text(name_at).to_owned();
        if kernels.iter().all(|k| k.name != name) {
            kernels.push(KernelDecl {
                name,
                extern_c,
                templated,
                launch_bounds,
                shared_sizes,
            });
        }
    }
    let mut rewritten = String::with_capacity(src.len());
    let mut at = 0;
    for (a, b, text) in rewrites {
        rewritten.push_str(&src[at..a]);
        rewritten.push_str(&text);
        at = b;
    }
    rewritten.push_str(&src[at..]);
    Scanned { kernels, rewritten }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_bounds_and_shared() {
        let src = r#"
// __global__ void commented_out(int x) {}
#define X 4
struct S { float a[3]; };
extern "C" __global__ void __launch_bounds__(X * 2, 1)
k1(const float* __restrict__ a, S s) {
    __shared__ float m[X][32 * 2];
    __shared__ float p, *q;
    __shared__ __align__(16) S sh;
    extern __shared__ float dyn[];
    const char* t = "__global__ void not_a_kernel(int)";
}
__global__ void k2(int n);
template <typename T> __global__ void k3(T v) {}
"#;
        let s = scan(src);
        assert_eq!(s.kernels.len(), 2, "{:?}", s.kernels);
        let k1 = &s.kernels[0];
        assert_eq!(k1.name, "k1");
        assert!(k1.extern_c && !k1.templated);
        assert_eq!(k1.launch_bounds.as_deref(), Some("X * 2"));
        assert_eq!(
            k1.shared_sizes,
            [
                "sizeof(float  [ X ] [ 32 * 2 ])",
                "sizeof(float  )",
                "sizeof(float * )",
                "sizeof(S  )"
            ]
        );
        assert_eq!(s.kernels[1].name, "k3");
        assert!(s.kernels[1].templated);
        assert!(s.rewritten.contains("::dcpemu::DynShared<float > dyn;"));
        assert_eq!(s.rewritten.lines().count(), src.lines().count());
    }
}
