//! Pusher's Python server SDK (PyPI `pusher` 3.3.4) against the real binary: the calls
//! an application makes (`trigger` to one and several channels and with `socket_id`,
//! `trigger_batch`, `channels_info`, `channel_info`, `users_info`) signed by the SDK
//! itself, deliveries checked on native WebSocket clients, and `authenticate()`'s output
//! (Python's `json.dumps`, spaces after `:` and `,`) accepted by ringcast's Pusher
//! WebSocket, and a webhook ringcast sent valid to its `validate_webhook`. The SDK also
//! refuses non-numeric app ids, so this shows ours are numeric.
//!
//! The SDK runs in `tests/common/pusher_sdk.py`, one call per stdin line, one JSON
//! answer per stdout line. Skipped, with a message, when `python3 -c "import pusher"`
//! fails, unless `RINGCAST_REQUIRE_TOOLS=1` (CI sets it), which makes that a failure
//! (`python3 -m pip install -q pusher==3.3.4`, as scripts/test.sh does).

mod common;
use common::unix_now;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{
    cli, expect_silence, next_json, send_json, set_timeout, wait_for, Options, Server, Ws,
    ALLOW_PRIVATE_WEBHOOKS,
};
use serde_json::{json, Value};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/pusher_sdk.py");

fn sdk_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import pusher"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The SDK process: one call in, one JSON answer out.
struct Sdk {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sdk {
    fn start(s: &Server, app_id: &str, key: &str, secret: &str) -> Sdk {
        let mut child = Command::new("python3")
            .arg(SCRIPT)
            .args([
                &s.addr.ip().to_string(),
                &s.addr.port().to_string(),
                app_id,
                key,
                secret,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run tests/common/pusher_sdk.py");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Sdk {
            child,
            stdin,
            stdout,
        }
    }

    fn call(&mut self, call: &str, args: Value, kwargs: Value) -> Value {
        let line = json!({"call": call, "args": args, "kwargs": kwargs});
        writeln!(self.stdin, "{line}").expect("write to the SDK script");
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .expect("read the SDK script");
        serde_json::from_str(&answer).unwrap_or_else(|_| panic!("SDK answered {answer:?}"))
    }

    /// A call that must succeed: what the SDK returned.
    fn ok(&mut self, call: &str, args: Value, kwargs: Value) -> Value {
        let v = self.call(call, args.clone(), kwargs);
        assert!(v.get("error").is_none(), "{call}{args}: {v}");
        v["ok"].clone()
    }
}

impl Drop for Sdk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A native client subscribed to `channel`, and its connection id.
fn native_on(s: &Server, key: &str, channel: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(s.ws_url(key)).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    let id = hello["connection_id"].as_str().unwrap().to_string();
    common::subscribe(&mut ws, channel);
    (ws, id)
}

fn message(ws: &mut Ws, channel: &str, event: &str) -> Value {
    let v = next_json(ws);
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(
        (&v["channel"], &v["event"]),
        (&json!(channel), &json!(event)),
        "{v}"
    );
    v["data"].clone()
}

#[test]
fn the_python_server_sdk_works_against_ringcast() {
    if !sdk_installed() {
        if std::env::var("RINGCAST_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!(
                "the Python `pusher` package is not installed and RINGCAST_REQUIRE_TOOLS=1: \
                 python3 -m pip install -q pusher==3.3.4"
            );
        }
        eprintln!(
            "SKIPPED the_python_server_sdk_works_against_ringcast: `python3 -c \"import pusher\"` \
             fails (python3 -m pip install -q pusher==3.3.4; set RINGCAST_REQUIRE_TOOLS=1 to \
             make this fatal)"
        );
        return;
    }
    // Its webhook receiver listens on 127.0.0.1: private addresses allowed.
    let s = Server::start_with(Options {
        env: vec![ALLOW_PRIVATE_WEBHOOKS],
        ..Options::default()
    });
    let v = cli(
        &s.data_dir,
        &["project", "create", "sdk", "--rate-limit", "10000/s"],
    );
    let app_id = v["project"]["pusher_app_id"].as_str().unwrap().to_string();
    let key = v["public_key"].as_str().unwrap().to_string();
    let secret = v["token_secret"].as_str().unwrap().to_string();
    let mut sdk = Sdk::start(&s, &app_id, &key, &secret);
    wait_for(Duration::from_secs(5), "the server to know the app", || {
        sdk.call("channels_info", json!([]), json!({}))
            .get("ok")
            .is_some()
    });

    // trigger, one channel: the SDK sends data as JSON text; natives get that string.
    let (mut a, a_id) = native_on(&s, &key, "orders");
    let (mut b, _) = native_on(&s, &key, "orders");
    let r = sdk.ok(
        "trigger",
        json!(["orders", "created", {"id": 42}]),
        json!({}),
    );
    assert_eq!(r, json!({}));
    for ws in [&mut a, &mut b] {
        let data = message(ws, "orders", "created");
        let text = data
            .as_str()
            .expect("a Pusher publish reaches natives as a string");
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            json!({"id": 42})
        );
    }

    // trigger, several channels.
    let mut subs: Vec<(Ws, &str)> = ["x", "y", "z"]
        .into_iter()
        .map(|c| (native_on(&s, &key, c).0, c))
        .collect();
    sdk.ok(
        "trigger",
        json!([["x", "y", "z"], "tick", "hello"]),
        json!({}),
    );
    for (ws, c) in &mut subs {
        assert_eq!(message(ws, c, "tick"), "hello");
    }

    // trigger with socket_id: that connection is left out (Laravel's toOthers()).
    sdk.ok(
        "trigger",
        json!(["orders", "others", "1"]),
        json!({"socket_id": a_id}),
    );
    assert_eq!(message(&mut b, "orders", "others"), "1");
    expect_silence(&mut a, Duration::from_millis(300));

    // trigger_batch: in order; one invalid event refuses the whole batch.
    let batch: Vec<Value> = (0..3)
        .map(|i| json!({"channel": "orders", "name": "step", "data": i.to_string()}))
        .collect();
    assert_eq!(
        sdk.ok("trigger_batch", json!([batch]), json!({})),
        json!({})
    );
    for i in 0..3 {
        assert_eq!(message(&mut a, "orders", "step"), i.to_string());
    }
    let bad = json!([[
        {"channel": "orders", "name": "step", "data": "3"},
        {"channel": "orders", "name": "pusher:reserved", "data": "4"},
    ]]);
    let r = sdk.call("trigger_batch", bad, json!({}));
    assert_eq!(r["error"], "PusherBadRequest", "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("\"index\":1"),
        "{r}"
    );
    expect_silence(&mut a, Duration::from_millis(300));

    // Presence, through native members: the queries as the SDK makes them (it sends
    // body_md5 of the empty body on every GET).
    let mut members = Vec::new();
    for user in ["u1", "u2"] {
        let claims = json!({"channel": "presence-room", "exp": unix_now() + 600, "sub": user});
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap();
        let (mut ws, _) = tungstenite::connect(s.ws_url(&key)).unwrap();
        set_timeout(&mut ws, Duration::from_secs(10));
        next_json(&mut ws);
        send_json(
            &mut ws,
            json!({"type": "subscribe", "channel": "presence-room", "token": token}),
        );
        assert_eq!(next_json(&mut ws)["type"], "subscribed");
        members.push(ws);
    }
    wait_for(Duration::from_secs(5), "the hub's counts", || {
        sdk.ok(
            "channel_info",
            json!(["presence-room", ["user_count"]]),
            json!({}),
        ) == json!({"occupied": true, "user_count": 2})
    });
    let r = sdk.ok(
        "channels_info",
        json!([]),
        json!({"prefix_filter": "presence-", "attributes": ["user_count"]}),
    );
    assert_eq!(r, json!({"channels": {"presence-room": {"user_count": 2}}}));
    let r = sdk.ok("users_info", json!(["presence-room"]), json!({}));
    assert_eq!(r, json!({"users": [{"id": "u1"}, {"id": "u2"}]}));
    let r = sdk.call(
        "channels_info",
        json!([]),
        json!({"attributes": ["user_count"]}),
    );
    assert_eq!(r["error"], "PusherBadRequest", "{r}");

    // authenticate(): its output is accepted by the Pusher WebSocket, for a private
    // channel and for a presence channel (channel_data as Python's json.dumps writes it).
    let url = format!(
        "ws://{}/app/{key}?protocol=7&client=py-test&version=1",
        s.addr
    );
    let (mut p, socket_id) = common::pusher_connect(&url);

    let auth = sdk.ok("authenticate", json!(["private-x", socket_id]), json!({}));
    send_json(
        &mut p,
        json!({"event": "pusher:subscribe", "data": {"channel": "private-x", "auth": auth["auth"]}}),
    );
    let ok = next_json(&mut p);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    assert_eq!(ok["channel"], "private-x");

    let auth = sdk.ok(
        "authenticate",
        json!(["presence-room", socket_id, {"user_id": "u3", "user_info": {"name": "Cy"}}]),
        json!({}),
    );
    let channel_data = auth["channel_data"].as_str().unwrap();
    assert!(
        channel_data.contains("\": \""),
        "Python's spacing: {channel_data}"
    );
    send_json(
        &mut p,
        json!({"event": "pusher:subscribe", "data": {
            "channel": "presence-room", "auth": auth["auth"], "channel_data": channel_data,
        }}),
    );
    let ok = next_json(&mut p);
    assert_eq!(
        ok["event"], "pusher_internal:subscription_succeeded",
        "{ok}"
    );
    let presence: Value = serde_json::from_str(ok["data"].as_str().unwrap()).unwrap();
    assert_eq!(presence["presence"]["count"], 3, "{presence}");
    assert_eq!(
        presence["presence"]["hash"]["u3"]["name"], "Cy",
        "{presence}"
    );

    // The SDK's trigger reaches the Pusher client on its private channel.
    sdk.ok("trigger", json!(["private-x", "e", {"a": 1}]), json!({}));
    let f = next_json(&mut p);
    assert_eq!(
        (&f["event"], &f["channel"]),
        (&json!("e"), &json!("private-x")),
        "{f}"
    );
    let data: Value = serde_json::from_str(f["data"].as_str().unwrap()).unwrap();
    assert_eq!(data, json!({"a": 1}));

    // A webhook ringcast sends is valid to the SDK's validate_webhook (key, signature,
    // and its time_ms within 300 s); a changed body is not.
    let hook = capture_one_webhook(&s, v["project"]["id"].as_str().unwrap(), &mut p);
    let r = sdk.ok(
        "validate_webhook",
        json!([hook.key, hook.signature, hook.body]),
        json!({}),
    );
    assert_eq!(r["events"][0]["name"], "channel_occupied", "{r}");
    let forged = hook.body.replace("occupied", "vacated");
    let r = sdk.call(
        "validate_webhook",
        json!([hook.key, hook.signature, forged]),
        json!({}),
    );
    // The SDK answers None for a webhook that does not verify.
    assert_eq!(r, json!({"ok": null}));
}

/// One webhook request as the receiver saw it.
struct Hook {
    key: String,
    signature: String,
    body: String,
}

/// Point the project's webhook at a one-request receiver on a free port, make a
/// channel occupied through the Pusher client `p`, and return the request.
fn capture_one_webhook(s: &Server, project_id: &str, p: &mut Ws) -> Hook {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("a webhook request");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head, body_start) = loop {
            let n = stream.read(&mut chunk).expect("read the request");
            assert!(n > 0, "the request ended early");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break (String::from_utf8_lossy(&buf[..i]).to_string(), i + 4);
            }
        };
        let header = |name: &str| {
            head.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_default()
        };
        let len: usize = header("content-length").parse().expect("a Content-Length");
        while buf.len() < body_start + len {
            let n = stream.read(&mut chunk).expect("read the body");
            assert!(n > 0, "the body ended early");
            buf.extend_from_slice(&chunk[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        Hook {
            key: header("x-pusher-key"),
            signature: header("x-pusher-signature"),
            body: String::from_utf8_lossy(&buf[body_start..body_start + len]).to_string(),
        }
    });
    cli(
        &s.data_dir,
        &[
            "project",
            "set-webhook",
            project_id,
            &url,
            "--events",
            "channel_occupied",
        ],
    );
    // The webhook setting reaches the server within a second: subscribe to fresh
    // channels until a request arrives.
    for i in 0..20 {
        send_json(
            p,
            json!({"event": "pusher:subscribe", "data": {"channel": format!("hooked-{i}")}}),
        );
        std::thread::sleep(Duration::from_millis(500));
        if receiver.is_finished() {
            break;
        }
    }
    receiver.join().expect("the receiver saw a webhook")
}
