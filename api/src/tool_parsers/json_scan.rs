//! Just enough JSON scanning to find where values begin and end in text that may still be
//! growing (a streamed model output): [`scan_value`] finds the extent of one value, and
//! [`scan_call`] reads a tool-call object (`{"name": .., "arguments": {..}}`) as far as it
//! goes. Nothing here decides validity on its own: complete calls are checked with
//! `serde_json` by the parsers.

/// How far a value goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The value ends just before this byte offset.
    Complete(usize),
    /// The text ends inside the value.
    Incomplete,
    /// Not a JSON value: the byte at this offset cannot continue it.
    Invalid(usize),
}

/// The first offset at or after `i` that is not JSON whitespace.
pub fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Finds the end of the JSON value starting at `s[i]` (which must not be whitespace).
/// Containers are matched by bracket depth outside strings; a number or literal is complete
/// only once a character after it is seen.
pub fn scan_value(s: &[u8], i: usize) -> Scan {
    let Some(&first) = s.get(i) else {
        return Scan::Incomplete;
    };
    match first {
        b'"' => scan_string(s, i),
        b'{' | b'[' => {
            let mut stack = Vec::new();
            let mut j = i;
            while j < s.len() {
                match s[j] {
                    b'"' => match scan_string(s, j) {
                        Scan::Complete(e) => {
                            j = e;
                            continue;
                        }
                        other => return other,
                    },
                    b'{' => stack.push(b'}'),
                    b'[' => stack.push(b']'),
                    c @ (b'}' | b']') => {
                        if stack.pop() != Some(c) {
                            return Scan::Invalid(j);
                        }
                        if stack.is_empty() {
                            return Scan::Complete(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Scan::Incomplete
        }
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let mut j = i;
            while j < s.len()
                && matches!(s[j], b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'E')
            {
                j += 1;
            }
            if j == s.len() {
                Scan::Incomplete
            } else {
                Scan::Complete(j)
            }
        }
        _ => Scan::Invalid(i),
    }
}

/// The end of the string starting at `s[i] == b'"'`.
fn scan_string(s: &[u8], i: usize) -> Scan {
    let mut j = i + 1;
    while j < s.len() {
        match s[j] {
            b'\\' => j += 2,
            b'"' => return Scan::Complete(j + 1),
            _ => j += 1,
        }
    }
    Scan::Incomplete
}

/// A tool-call object read as far as the text goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallScan {
    /// The function name, once its string is complete.
    pub name: Option<String>,
    /// Where the arguments value starts, and where it ends once complete.
    pub args: Option<(usize, Option<usize>)>,
    /// The offset just after the closing `}` of the object, once complete.
    pub end: Option<usize>,
    /// The text cannot be such an object.
    pub invalid: bool,
}

impl CallScan {
    fn invalid(mut self) -> Self {
        self.invalid = true;
        self
    }

    /// The arguments text that is certain to begin the final arguments: the whole value once
    /// complete, the text so far inside an object or array, nothing of an unfinished scalar;
    /// for arguments that turned out invalid, the text before the byte that broke them.
    pub fn args_prefix<'a>(&self, s: &'a str) -> &'a str {
        match self.args {
            Some((start, Some(end))) => &s[start..end],
            Some((start, None)) if matches!(s.as_bytes()[start], b'{' | b'[') => &s[start..],
            _ => "",
        }
    }
}

/// Reads the object starting at the first non-whitespace byte at or after `start`: the
/// string value of `"name"` and the span of the first key in `arg_keys`.
pub fn scan_call(s: &str, start: usize, arg_keys: &[&str]) -> CallScan {
    let b = s.as_bytes();
    let mut out = CallScan::default();
    let mut i = skip_ws(b, start);
    match b.get(i) {
        None => return out,
        Some(b'{') => i += 1,
        Some(_) => return out.invalid(),
    }
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            None => return out,
            Some(b'}') => {
                out.end = Some(i + 1);
                return out;
            }
            Some(b'"') => {}
            Some(_) => return out.invalid(),
        }
        let key_end = match scan_string(b, i) {
            Scan::Complete(e) => e,
            _ => return out,
        };
        let Ok(key) = serde_json::from_str::<String>(&s[i..key_end]) else {
            return out.invalid();
        };
        i = skip_ws(b, key_end);
        match b.get(i) {
            None => return out,
            Some(b':') => i = skip_ws(b, i + 1),
            Some(_) => return out.invalid(),
        }
        if i >= b.len() {
            return out;
        }
        let is_args = arg_keys.contains(&key.as_str()) && out.args.is_none();
        match scan_value(b, i) {
            Scan::Complete(e) => {
                if key == "name" {
                    if out.name.is_some() {
                        // Two names: ambiguous, so not a call (the first one stays, as
                        // streamed before the second was read).
                        return out.invalid();
                    }
                    match serde_json::from_str::<String>(&s[i..e]) {
                        Ok(n) => out.name = Some(n),
                        Err(_) => return out.invalid(),
                    }
                } else if is_args {
                    out.args = Some((i, Some(e)));
                }
                i = skip_ws(b, e);
                match b.get(i) {
                    None => return out,
                    Some(b',') => i += 1,
                    Some(b'}') => {
                        out.end = Some(i + 1);
                        return out;
                    }
                    Some(_) => return out.invalid(),
                }
            }
            Scan::Incomplete => {
                if is_args {
                    out.args = Some((i, None));
                }
                return out;
            }
            Scan::Invalid(at) => {
                if is_args {
                    // As far as the arguments went before the error (what streaming
                    // snapshots of shorter text showed of them).
                    out.args = Some((i, Some(at)));
                }
                return out.invalid();
            }
        }
    }
}

/// `text` as far as it is settled: while streaming (`done` false), without a tail that may
/// still become `marker` (whose text is not this part's once the marker completes).
pub fn settled<'a>(text: &'a str, marker: &str, done: bool) -> &'a str {
    if done {
        text
    } else {
        &text[..text.len() - partial_marker_len(text, marker)]
    }
}

/// The longest suffix of `text` that is a proper prefix of `marker` (text to hold back
/// while it could still become the marker).
pub fn partial_marker_len(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k) && marker.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_their_ends() {
        let s = br#"{"a": [1, "}"], "b": {"c": null}} tail"#;
        assert_eq!(scan_value(s, 0), Scan::Complete(33));
        assert_eq!(scan_value(b"\"a\\\"b\" x", 0), Scan::Complete(6));
        assert_eq!(scan_value(b"123", 0), Scan::Incomplete);
        assert_eq!(scan_value(b"123,", 0), Scan::Complete(3));
        assert_eq!(scan_value(b"{\"a\": [1", 0), Scan::Incomplete);
        assert_eq!(scan_value(b"{]", 0), Scan::Invalid(1));
        assert_eq!(scan_value(b"?", 0), Scan::Invalid(0));
    }

    #[test]
    fn call_objects_partial_and_whole() {
        let s = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let c = scan_call(s, 0, &["arguments"]);
        assert_eq!(c.name.as_deref(), Some("get_weather"));
        assert_eq!(c.args_prefix(s), r#"{"city": "Paris"}"#);
        assert_eq!(c.end, Some(s.len()));
        for cut in 0..s.len() {
            let p = &s[..cut];
            let c = scan_call(p, 0, &["arguments"]);
            assert!(!c.invalid, "{p}");
            assert!(r#"{"city": "Paris"}"#.starts_with(c.args_prefix(p)), "{p}");
        }
        // Arguments before the name, and a scalar that is held until complete.
        let s = r#"{"parameters": 5, "name": "f"}"#;
        assert_eq!(
            scan_call(&s[..16], 0, &["parameters"]).args_prefix(&s[..16]),
            ""
        );
        let c = scan_call(s, 0, &["parameters"]);
        assert_eq!((c.name.as_deref(), c.args_prefix(s)), (Some("f"), "5"));
        assert!(scan_call("[1]", 0, &["arguments"]).invalid);
        // Arguments broken by a mismatched bracket keep what came before it.
        let s = r#"{"name": "f", "arguments": ["a", 1}"#;
        let c = scan_call(s, 0, &["arguments"]);
        assert!(c.invalid);
        assert_eq!(c.args_prefix(s), r#"["a", 1"#);
        assert!(scan_call(r#"{"name": 3}"#, 0, &["arguments"]).invalid);
        let c = scan_call(r#"{"name": "f", "name": "g"}"#, 0, &["arguments"]);
        assert!(c.invalid);
        assert_eq!(c.name.as_deref(), Some("f"));
    }

    #[test]
    fn partial_markers() {
        assert_eq!(partial_marker_len("abc<tool_", "<tool_call>"), 6);
        assert_eq!(partial_marker_len("abc", "<tool_call>"), 0);
        assert_eq!(partial_marker_len("<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_marker_len("x<｜tool", "<｜tool▁calls▁begin｜>"), 8);
        assert_eq!(settled("abc<tool_", "<tool_call>", false), "abc");
        assert_eq!(settled("abc<tool_", "<tool_call>", true), "abc<tool_");
    }
}
