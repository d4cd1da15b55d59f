//! The web page served at `GET /`: a chat with any served model and a live view of the
//! engines (from `/v1/engine/status`). Three static files compiled into the binary — no
//! external asset, no framework; the page holds no data until the browser calls the API
//! (with the API key typed into it, when the server has one).
//!
//! ```
//! let index = dcpserve_api::web::asset("").unwrap();
//! assert_eq!(index.content_type, "text/html; charset=utf-8");
//! assert!(index.body.contains("/web/app.js"));
//! assert!(dcpserve_api::web::asset("/web/nope.js").is_none());
//! ```

use warp::http::HeaderValue;
use warp::reply::Response;

/// One file of the page.
#[derive(Debug)]
pub struct Asset {
    /// Its path (the page itself is `/`).
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

static ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("index.html"),
    },
    Asset {
        path: "/web/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("app.js"),
    },
    Asset {
        path: "/web/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("app.css"),
    },
];

/// The file served at `path` (the page at `/`, `` or `/index.html`), if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    let path = match path {
        "" | "/index.html" => "/",
        p => p,
    };
    ASSETS.iter().find(|a| a.path == path)
}

/// A 200 response with the file; the policy keeps the page to its own origin (no
/// script, style or connection elsewhere).
pub fn response(asset: &Asset) -> Response {
    let mut r = Response::new(asset.body.into());
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static(asset.content_type));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}
