//! Hugging Face chat templates (Jinja) rendered with minijinja, in the environment transformers
//! uses: `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a
//! `tojson` filter that writes like Python's `json.dumps`, and Python string/dict methods.

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::json_file::read_json_opt;

const TEMPLATE_NAME: &str = "chat";

/// Most template instructions one render may execute (minijinja's fuel): a template from a
/// downloaded model that loops without end fails with an error instead of holding a
/// request forever. Real chat templates use a few hundred instructions per message.
pub const MAX_RENDER_FUEL: u64 = 20_000_000;
/// Longest rendered prompt, in bytes (twice the largest request body the API accepts).
pub const MAX_RENDER_BYTES: usize = 64 << 20;
/// Largest `indent` the `tojson` filter accepts (Python accepts any; nothing real needs more).
pub const MAX_TOJSON_INDENT: usize = 64;

/// Bounds of one render: time (as minijinja fuel) and output size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// Most template instructions executed per render.
    pub fuel: u64,
    /// Longest output, in bytes.
    pub max_output_bytes: usize,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            fuel: MAX_RENDER_FUEL,
            max_output_bytes: MAX_RENDER_BYTES,
        }
    }
}

/// One conversation turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` (`system`, `user`, `assistant`, ...) and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    max_output_bytes: usize,
}

/// Jinja2's `indent(width=4, first=false, blank=false)`, as transformers renders it (its
/// line splitting, and a trailing newline kept, unlike minijinja's own), refusing an indented
/// text longer than a render may write: minijinja's builds it whole first, so a template
/// with `indent(4555555555555550)` asked the allocator for 4.5 PB and aborted the process
/// (found by the chat_template fuzzer).
fn bounded_indent(
    max_bytes: usize,
) -> impl Fn(String, Option<usize>, Option<bool>, Option<bool>, Kwargs) -> Result<String, Error>
       + Send
       + Sync
       + 'static {
    move |value, width, first, blank, kwargs| {
        let width = match width {
            Some(w) => w,
            None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
        };
        let first = match first {
            Some(f) => f,
            None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
        };
        let blank = match blank {
            Some(b) => b,
            None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
        };
        kwargs.assert_all_used()?;
        // Jinja2 appends "\n" and splits as Python's `str.splitlines`.
        let text = format!("{value}\n");
        let lines = python_splitlines(&text);
        let needed = width
            .checked_mul(lines.len() + 1)
            .and_then(|n| n.checked_add(text.len()));
        if needed.is_none_or(|n| n > max_bytes) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "indent({width}) of {} lines would exceed the render's {max_bytes} bytes",
                    lines.len()
                ),
            ));
        }
        let pad = " ".repeat(width);
        let mut out = String::with_capacity(needed.unwrap_or(0));
        if first {
            out.push_str(&pad);
        }
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
                if blank || !line.is_empty() {
                    out.push_str(&pad);
                }
            }
            out.push_str(line);
        }
        Ok(out)
    }
}

/// Python's `str.splitlines()`: the lines without their breaks (`\n`, `\r\n`, `\r`, `\v`,
/// `\f`, `\x1c`–`\x1e`, `\x85`, U+2028, U+2029), no empty line after a final break.
fn python_splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let is_break = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if is_break {
            lines.push(&s[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r' && it.peek().is_some_and(|&(_, n)| n == '\n') {
                it.next();
                end += 1;
            }
            start = end;
        }
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

fn template_err(e: Error) -> ModelError {
    // The kind, detail and "(in name:line)", without minijinja's source excerpt (`{:#}`):
    // drawing the excerpt subtracts a span's columns, and a span whose end column is before
    // its start (found by the chat_template fuzzer) overflows there (minijinja 2.24,
    // debug.rs), a panic in any build with overflow checks and a "^" repeated ~2^64 times
    // without them.
    ModelError::ChatTemplate(e.to_string())
}

impl ChatTemplate {
    /// Compiles `source`. `bos` / `eos` are exposed to the template as `bos_token` /
    /// `eos_token` (empty strings when the tokenizer has none). Renders are bounded by
    /// [`RenderLimits::default`].
    pub fn new(source: &str, bos: Option<&str>, eos: Option<&str>) -> Result<Self, ModelError> {
        Self::with_limits(source, bos, eos, RenderLimits::default())
    }

    /// Like [`ChatTemplate::new`] with other bounds: a render that runs out of fuel or
    /// writes more than `max_output_bytes` fails with [`ModelError::ChatTemplate`].
    ///
    /// ```
    /// use dcpserve_model::chat_template::{ChatTemplate, RenderLimits};
    /// let limits = RenderLimits { fuel: 10_000, max_output_bytes: 100 };
    /// let t = ChatTemplate::with_limits("{% for i in range(200) %}x{% endfor %}", None, None, limits);
    /// assert!(t.unwrap().render(&[], false).unwrap_err().to_string().contains("100 bytes"));
    /// let spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    /// let t = ChatTemplate::with_limits(spin, None, None, limits).unwrap();
    /// assert!(t.render(&[], false).is_err());
    /// ```
    pub fn with_limits(
        source: &str,
        bos: Option<&str>,
        eos: Option<&str>,
        limits: RenderLimits,
    ) -> Result<Self, ModelError> {
        let source = strip_generation_tags(source);
        let mut env = Environment::new();
        env.set_fuel(Some(limits.fuel));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("indent", bounded_indent(limits.max_output_bytes));
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(template_err)?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos.unwrap_or_default().to_string(),
            eos_token: eos.unwrap_or_default().to_string(),
            max_output_bytes: limits.max_output_bytes,
        })
    }

    /// The template source (after removing `{% generation %}` markers).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; `add_generation_prompt` appends the assistant turn header.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_value(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
        })
    }

    /// Renders with an arbitrary context (e.g. `messages` with tool calls, `tools`), given as
    /// a JSON object; `bos_token` / `eos_token` are supplied unless the context sets them.
    pub fn render_json(&self, context: &serde_json::Value) -> Result<String, ModelError> {
        if !context.is_object() {
            return Err(ModelError::ChatTemplate(
                "the render context must be a JSON object".into(),
            ));
        }
        self.render_value(Value::from_serialize(context))
    }

    fn render_value(&self, ctx: Value) -> Result<String, ModelError> {
        let defaults = minijinja::context! {
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            add_generation_prompt => false,
        };
        // Later contexts only fill what earlier ones lack, so the caller's values win.
        let ctx = minijinja::context! { ..ctx, ..defaults };
        let mut out = CappedWriter {
            buf: Vec::new(),
            limit: self.max_output_bytes,
            overflowed: false,
        };
        // minijinja panics on some templates (`range(0)[::-1]`: reversing an empty
        // sequence indexes past its end, minijinja 2.24 value/ops.rs; found by the
        // chat_template fuzzer): a template from a downloaded model must fail its request
        // with an error, not take the thread down.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.env
                .get_template(TEMPLATE_NAME)
                .and_then(|t| t.render_captured_to(ctx, &mut out).map(drop))
        }))
        .map_err(|_| {
            ModelError::ChatTemplate(
                "the template renderer (minijinja) failed on this template: a defect of \
                 minijinja, reported instead of crashing"
                    .into(),
            )
        })?;
        if out.overflowed {
            return Err(ModelError::ChatTemplate(format!(
                "the rendered prompt exceeds {} bytes",
                self.max_output_bytes
            )));
        }
        rendered.map_err(template_err)?;
        String::from_utf8(out.buf)
            .map_err(|e| ModelError::ChatTemplate(format!("rendered invalid UTF-8: {e}")))
    }

    /// The template of a Hugging Face folder: `chat_template.jinja`, else `chat_template` in
    /// `tokenizer_config.json` (a string, or a list of `{name, template}` of which "default"
    /// is used). `Ok(None)` when there is none.
    pub fn from_hf_dir(
        dir: &Path,
        bos: Option<&str>,
        eos: Option<&str>,
    ) -> Result<Option<Self>, ModelError> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?;
            return Self::new(&source, bos, eos).map(Some);
        }
        let config_path = dir.join("tokenizer_config.json");
        let Some(config) = read_json_opt(&config_path)? else {
            return Ok(None);
        };
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let default = list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                match default
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(ModelError::corrupt(
                            &config_path,
                            "chat_template is a list without a \"default\" template",
                        ))
                    }
                }
            }
            Some(other) => {
                return Err(ModelError::corrupt(
                    &config_path,
                    format!("chat_template should be a string or a list, found {other}"),
                ))
            }
        };
        Self::new(&source, bos, eos).map(Some)
    }

    /// The template in a GGUF's `tokenizer.chat_template`; `Ok(None)` when absent.
    pub fn from_gguf(
        file: &GgufFile,
        bos: Option<&str>,
        eos: Option<&str>,
    ) -> Result<Option<Self>, ModelError> {
        match file.get_str("tokenizer.chat_template")? {
            Some(source) => Self::new(source, bos, eos).map(Some),
            None => Ok(None),
        }
    }
}

/// An output buffer that refuses to grow past `limit` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` markers (its
/// AssistantTracker extension, used only to build training masks), which minijinja would reject.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        let Some(len) = rest[start + 2..].find("%}").map(|n| n + 2) else {
            break;
        };
        let tag = &rest[start + 2..start + len];
        let word = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if word != "generation" && word != "endgeneration" {
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `json.dumps(x, ensure_ascii=False, indent=indent)`: Python separates items with `", "` and
/// keys with `": "` when not indenting, unlike serde_json's compact form.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    // serde_json's map keeps keys sorted unless "preserve_order" is on; either way honour an
    // explicit sort_keys=True by sorting.
    let json = if sort_keys == Some(true) {
        sort_json(json)
    } else {
        json
    };
    let mut buf = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut buf,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            json.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut buf, PythonFormatter);
            json.serialize(&mut ser)
        }
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(buf)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

fn sort_json(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<_> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_json(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sort_json).collect())
        }
        other => other,
    }
}

/// serde_json formatter producing Python's default `json.dumps` separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `datetime.now().strftime(format)` for the directives chat templates use, in UTC.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(format_time(secs, &format)?))
}

fn format_time(unix_secs: u64, format: &str) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (unix_secs / 86400) as i64;
    let secs_of_day = unix_secs % 86400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('j') => out.push_str(&format!("{:03}", doy_from_jan(year, month, day))),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn doy_from_jan(year: i64, month: i64, day: i64) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUM[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_tag_delimiters_are_an_error_not_a_panic() {
        // Found by the chat_template fuzzer: `{%}` made the tag scanner slice backwards.
        assert_eq!(strip_generation_tags("{%}x"), "{%}x");
        assert!(ChatTemplate::new("{%}{ messages[1|unique }}", None, None).is_err());
    }

    #[test]
    fn indent_writes_as_jinja_and_refuses_widths_past_the_output_bound() {
        let r = |src: &str| {
            let t = ChatTemplate::new(src, None, None).unwrap();
            t.render(&[], false).map_err(|e| e.to_string())
        };
        // Each expected text is what Jinja2 3.1 renders.
        assert_eq!(
            r(r#"{{ "a\nb\n\nc\n" | indent(2) }}"#).unwrap(),
            "a\n  b\n\n  c\n"
        );
        assert_eq!(
            r(r#"{{ "a\n\nb" | indent(width=1, first=true, blank=true) }}"#).unwrap(),
            " a\n \n b"
        );
        assert_eq!(r(r#"{{ "x\r\ny" | indent }}"#).unwrap(), "x\n    y");
        assert_eq!(
            r(r#"{{ "x\n" | indent(2, blank=true) }}"#).unwrap(),
            "x\n  "
        );
        // minijinja panics reversing an empty sequence; the render fails instead.
        let e = r(r#"{% for i in range(0)[::-1] %}{{ i }}{% endfor %}"#).unwrap_err();
        assert!(e.contains("minijinja"), "{e}");
        let e = r(r#"{{ "a\nb" | indent(4555555555555550) }}"#).unwrap_err();
        assert!(e.contains("would exceed"), "{e}");
    }

    #[test]
    fn renders_are_bounded_in_time_and_size_by_default() {
        let spin =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = ChatTemplate::new(spin, None, None)
            .unwrap()
            .render(&[], true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fuel"), "{e}");
        let huge = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
        let e = ChatTemplate::new(huge, None, None)
            .unwrap()
            .render(&[], true)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&MAX_RENDER_BYTES.to_string()), "{e}");
    }

    #[test]
    fn python_features() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if loop.first %}[{{ bos_token }}]{% endif %}\
             {{ m.role.upper() }}:{{ m.content.strip() }}{% if m.content.startswith(' x') %}!{% endif %}\
             {% if not loop.last %}|{% endif %}{% endfor %}\
             {% generation %}{{ {'a': [1, 'é<'], 'b': true} | tojson }}{% endgeneration %}",
            Some("<s>"),
            None,
        )
        .unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::new("user", " x hi "),
                    ChatMessage::new("assistant", "yo"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "[<s>]USER:x hi!|ASSISTANT:yo{\"a\": [1, \"é<\"], \"b\": true}"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
        assert!(ChatTemplate::new("{% for %}", None, None).is_err());
    }

    #[test]
    fn tojson_indent_and_dates() {
        let t = ChatTemplate::new("{{ x | tojson(indent=2) }}", None, None).unwrap();
        let out = t
            .render_json(&serde_json::json!({"x": {"k": [1]}}))
            .unwrap();
        assert_eq!(out, "{\n  \"k\": [\n    1\n  ]\n}");
        // 2024-02-29 13:05:09 UTC was a Thursday.
        let s = format_time(1_709_211_909, "%d %b %Y %A %H:%M:%S %j %-d %%").unwrap();
        assert_eq!(s, "29 Feb 2024 Thursday 13:05:09 060 29 %");
    }
}
