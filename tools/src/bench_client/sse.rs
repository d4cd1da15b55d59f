//! Incremental parsing of server-sent events: bytes arrive in arbitrary pieces, events are
//! separated by a blank line, and an event's `data:` lines are joined with newlines.

/// Splits a byte stream into the `data` of its events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the line being received.
    line: Vec<u8>,
    /// `data` lines of the event being received.
    data: Vec<String>,
}

/// What an event's data says in OpenAI streams.
#[derive(Debug, Clone, PartialEq)]
pub enum SseData {
    /// A JSON chunk (or any other payload).
    Chunk(String),
    /// `[DONE]`: the stream is complete.
    Done,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseData> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.line_end(&line, &mut out);
            } else {
                self.line.push(b);
            }
        }
        out
    }

    /// The end of the stream: an event not closed by a blank line still counts.
    pub fn finish(&mut self) -> Vec<SseData> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_end(&line, &mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn line_end(&mut self, line: &[u8], out: &mut Vec<SseData>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let text = String::from_utf8_lossy(line);
        // Other fields (event:, id:, retry:) and comments (":") do not matter here.
        if let Some(rest) = text.strip_prefix("data:") {
            let value = rest.strip_prefix(' ').unwrap_or(rest);
            self.data.push(value.to_string());
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseData>) {
        if self.data.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.data).join("\n");
        out.push(if data.trim() == "[DONE]" {
            SseData::Done
        } else {
            SseData::Chunk(data)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(s: &str) -> SseData {
        SseData::Chunk(s.to_string())
    }

    #[test]
    fn events_split_across_pieces() {
        let stream =
            b"data: {\"a\":1}\n\ndata: {\"b\"\r\n\r\n: keep-alive\n\nevent: x\ndata: [DONE]\n\n";
        // Feed one byte at a time: the result must not depend on where pieces end.
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for b in stream.iter() {
            got.extend(p.push(std::slice::from_ref(b)));
        }
        got.extend(p.finish());
        assert_eq!(
            got,
            vec![chunk("{\"a\":1}"), chunk("{\"b\""), SseData::Done]
        );
    }

    #[test]
    fn multi_line_data_and_no_space() {
        let mut p = SseParser::default();
        let got = p.push(b"data:one\ndata: two\n\n");
        assert_eq!(got, vec![chunk("one\ntwo")]);
    }

    #[test]
    fn unterminated_last_event_is_flushed() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"x\":2}").is_empty());
        assert_eq!(p.finish(), vec![chunk("{\"x\":2}")]);
        assert!(p.finish().is_empty());
    }
}
