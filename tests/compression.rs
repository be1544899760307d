//! permessage-deflate with Python's `websockets` (PyPI 15.0.1) against the real binary:
//! the extension is negotiated with no context takeover, a compressed 4 KB client
//! message is inflated and answered, and a 4 KB published message arrives intact. The
//! client runs in `tests/common/ws_compression.py`. Skipped, with a message, when
//! `python3 -c "import websockets"` fails, unless `RINGCAST_REQUIRE_TOOLS=1` (CI sets
//! it). Node's `ws`, Chromium, pusher-js's endpoint and raw sockets checking RSV1 are in
//! tests/browser/compression.test.mjs.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::Server;
use serde_json::{json, Value};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/common/ws_compression.py"
);

fn websockets_installed() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import websockets"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("RINGCAST_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!("python3 websockets is not installed (python3 -m pip install websockets==15.0.1)");
    }
    ok
}

#[test]
fn python_websockets_compresses_both_ways() {
    if !websockets_installed() {
        eprintln!("skipped: python3 websockets not installed");
        return;
    }
    let s = Server::start();
    let p = s.project("comp", "1000/s");
    let url = format!("ws://{}/api/v1/ws?key={}", s.addr, p.public);
    let mut child = Command::new("python3")
        .arg(SCRIPT)
        .arg(&url)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run tests/common/ws_compression.py");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> Value {
        let line = lines.next().expect("a line from the client").expect("read");
        serde_json::from_str(&line).expect("JSON line")
    };
    let ext = next();
    assert_eq!(ext["extensions"], json!(["permessage-deflate"]), "{ext}");
    assert_eq!(ext["server_no_context_takeover"], json!([true]), "{ext}");
    assert_eq!(next()["ready"], "pong");
    let items: Vec<Value> = (0..60)
        .map(|i| json!({"id": i, "name": format!("item {i}"), "price": i * 3 + 1, "tags": ["a", "b"]}))
        .collect();
    let data = json!({ "items": items });
    assert!(data.to_string().len() > 3000);
    let (status, _) = s.publish(&p.secret, "big", "e", data.clone());
    assert_eq!(status, 202);
    let got = next();
    assert_eq!(got["message"]["data"], data);
    assert!(child.wait().expect("client exits").success());
}
