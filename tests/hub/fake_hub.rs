//! A stand-in for the Hugging Face hub on 127.0.0.1, speaking the part of its HTTP API the
//! `hf-hub` client uses: `GET /api/models/REPO/revision/REV` (the commit and file list)
//! and `GET /REPO/resolve/REV/FILE` with a `Range` (headers `x-repo-commit`, `etag`,
//! `content-range`, then the bytes). Anything else is 404, as the hub answers for a repo
//! that does not exist. Every request is logged for the test to inspect.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One request as the hub saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
}

/// A running stand-in hub (its thread lives as long as the test process).
pub struct FakeHub {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

struct Repo {
    id: String,
    commit: String,
    files: Vec<(String, Vec<u8>)>,
}

impl FakeHub {
    /// Serves `repo` at `commit` (as revision `main` and as the commit itself).
    pub fn start(repo: &str, commit: &str, files: Vec<(String, Vec<u8>)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let repo = Repo {
            id: repo.to_string(),
            commit: commit.to_string(),
            files,
        };
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &repo, &log);
            }
        });
        Self { addr, seen }
    }

    /// The endpoint to give the client (`HF_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The paths of the file downloads seen so far (range requests of whole files).
    pub fn downloads(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path.contains("/resolve/"))
            .map(|s| s.path.clone())
            .collect()
    }
}

fn answer(stream: TcpStream, repo: &Repo, log: &Mutex<Vec<Seen>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut range, mut authorization) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_string()),
                "authorization" => authorization = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    log.lock().unwrap().push(Seen {
        path: path.clone(),
        authorization,
    });
    let mut out = stream;
    let revisions = ["main", repo.commit.as_str()];
    for rev in revisions {
        if path == format!("/api/models/{}/revision/{rev}", repo.id) {
            let siblings: Vec<serde_json::Value> = repo
                .files
                .iter()
                .map(|(name, _)| serde_json::json!({ "rfilename": name }))
                .collect();
            let body =
                serde_json::json!({ "id": repo.id, "sha": repo.commit, "siblings": siblings })
                    .to_string();
            return respond(
                &mut out,
                "200 OK",
                &[("content-type", "application/json".into())],
                body.as_bytes(),
            );
        }
        let prefix = format!("/{}/resolve/{rev}/", repo.id);
        if let Some(file) = path.strip_prefix(&prefix) {
            if let Some((_, bytes)) = repo.files.iter().find(|(n, _)| n == file) {
                let (start, end) = parse_range(range.as_deref(), bytes.len());
                let headers = [
                    ("x-repo-commit", repo.commit.clone()),
                    ("etag", format!("\"{}\"", crate::cache_layout::etag(bytes))),
                    (
                        "content-range",
                        format!("bytes {start}-{end}/{}", bytes.len()),
                    ),
                ];
                return respond(
                    &mut out,
                    "206 Partial Content",
                    &headers,
                    &bytes[start..=end],
                );
            }
        }
    }
    respond(&mut out, "404 Not Found", &[], b"Repository not found")
}

/// `bytes=S-E` or `bytes=S-` (the whole file when absent).
fn parse_range(range: Option<&str>, len: usize) -> (usize, usize) {
    let last = len.saturating_sub(1);
    let Some(spec) = range.and_then(|r| r.strip_prefix("bytes=")) else {
        return (0, last);
    };
    let (s, e) = spec.split_once('-').unwrap_or((spec, ""));
    let start = s.parse().unwrap_or(0);
    let end = e.parse().unwrap_or(last).min(last);
    (start.min(end), end)
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}
