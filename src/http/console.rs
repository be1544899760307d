//! `GET /console`: a page to watch channels live in a browser, served from assets
//! compiled into the binary (`clients/console/index.html` and the JavaScript client
//! `clients/js/ringcast.js` it imports, at `/console/ringcast.js`).
//!
//! On with `serve --dev` or `console = true`; otherwise the paths are 404 like any
//! unknown path. The page asks only for a public key (it never sees a secret key) and
//! shows the `curl` command to publish.

use super::outcome::Outcome;
use super::parse::{Method, RequestHead};
use super::response::write_body;

const PAGE: &str = include_str!("../../clients/console/index.html");
const CLIENT: &str = include_str!("../../clients/js/ringcast.js");

pub(crate) fn handle(head: &RequestHead, path: &[u8], out: &mut Vec<u8>) -> Outcome {
    let head_only = head.method() == Method::Head;
    if path == b"/console/ringcast.js" {
        write_body(
            out,
            "text/javascript; charset=utf-8",
            CLIENT.as_bytes(),
            head_only,
        );
    } else {
        write_body(out, "text/html; charset=utf-8", PAGE.as_bytes(), head_only);
    }
    Outcome::Answered { close: false }
}
