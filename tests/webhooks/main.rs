//! Webhooks, black box: the real binary, the real CLI (`project set-webhook`), real
//! WebSocket clients sending client events (the event source until occupancy and
//! presence transitions land), and a local HTTP receiver in the test (a std
//! `TcpListener` on 127.0.0.1:0) that answers as scripted and checks every request's
//! HMAC signature with the project's token secret and its `X-Pusher-Key`.

#[path = "../common/mod.rs"]
mod common;
use common::channel_token as token;
use common::cluster as support;
/// Every project here has its token secret in use.
use common::Project as Private;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{
    cli, next_json, send_json, set_timeout, wait_for, Options, Server, Ws, ALLOW_PRIVATE_WEBHOOKS,
};
use serde_json::{json, Value};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hook {
    at: Instant,
    content_type: Option<String>,
    key: Option<String>,
    signature: Option<String>,
    body: Vec<u8>,
}

impl Hook {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn events(&self) -> Vec<Value> {
        self.json()["events"].as_array().expect("events").clone()
    }

    /// Whether `X-Pusher-Signature` is the hex HMAC-SHA256 of the raw body under
    /// `secret` (an independent implementation: ring's, called from the test).
    fn signed_with(&self, secret: &str) -> bool {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
        let Some(sig) = self.signature.as_deref().and_then(|s| hex::decode(s).ok()) else {
            return false;
        };
        ring::hmac::verify(&key, &self.body, &sig).is_ok()
    }
}

/// A scripted webhook endpoint: answers each request with the next scripted status,
/// after the scripted delay (200 at once when the script is used up), and records it
/// when it arrives.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Hook>>>,
}

impl Receiver {
    fn start(script: &[u16]) -> Receiver {
        let script: Vec<_> = script.iter().map(|s| (*s, Duration::ZERO)).collect();
        Receiver::scripted(&script)
    }

    fn scripted(script: &[(u16, Duration)]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind receiver");
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let (g, s) = (got.clone(), script.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (g, s) = (g.clone(), s.clone());
                std::thread::spawn(move || serve(stream, &g, &s));
            }
        });
        Receiver { addr, got }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/ringcast", self.addr)
    }

    fn hooks(&self) -> Vec<Hook> {
        self.got.lock().unwrap().clone()
    }

    fn wait_hooks(&self, n: usize, limit: Duration) -> Vec<Hook> {
        wait_for(limit, &format!("{n} webhook requests"), || {
            self.hooks().len() >= n
        });
        self.hooks()
    }
}

/// Serve requests on one connection (keep-alive, as ureq uses it) until it closes.
fn serve(stream: TcpStream, got: &Mutex<Vec<Hook>>, script: &Mutex<VecDeque<(u16, Duration)>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /hooks/ringcast "), "{line}");
        let (mut len, mut content_type, mut key, mut signature) = (0, None, None, None);
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (name, value) = h.split_once(':').unwrap();
            let value = value.trim().to_string();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => len = value.parse().unwrap(),
                "content-type" => content_type = Some(value),
                "x-pusher-key" => key = Some(value),
                "x-pusher-signature" => signature = Some(value),
                _ => {}
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        got.lock().unwrap().push(Hook {
            at: Instant::now(),
            content_type,
            key,
            signature,
            body,
        });
        let (status, delay) = script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((200, Duration::ZERO));
        // A slow endpoint, as scripted.
        std::thread::sleep(delay);
        let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok");
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Server options for tests whose receiver (on 127.0.0.1) must get webhooks.
fn allowed() -> Options {
    Options {
        env: vec![ALLOW_PRIVATE_WEBHOOKS],
        ..Options::default()
    }
}

/// A project with client events on, its keys known to the server (the switch reaches the
/// server within its refresh: a test that sends events waits with
/// `wait_client_events_on`).
fn project(server: &Server, name: &str) -> Private {
    let (p, v) = server.project_json(name, &["--rate-limit", "10000/s"]);
    assert_eq!(v["project"]["webhook"], "off", "off by default: {v}");
    cli(
        &server.data_dir,
        &["project", "set-limits", &p.id, "--client-events", "on"],
    );
    p
}

/// A connection subscribed to `channel`, and its connection id.
fn member(url: &str, p: &Private, channel: &str, user: &str) -> (Ws, String) {
    let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
    set_timeout(&mut ws, Duration::from_secs(10));
    let hello = next_json(&mut ws);
    assert_eq!(hello["type"], "connected", "{hello}");
    let id = hello["connection_id"].as_str().unwrap().to_string();
    send_json(
        &mut ws,
        json!({"type": "subscribe", "channel": channel, "token": token(&p.token_secret, channel, user)}),
    );
    assert_eq!(next_json(&mut ws)["type"], "subscribed");
    (ws, id)
}

/// Send a client event from `from` and wait until `to` has it: the server relayed it
/// (and so decided about its webhook) before this returns.
/// Send client events 1, 2, ... from `a` to `b` on `ch`, 4 a second (well under the 10/s
/// client-event limit), until `done` holds, within `limit`; returns how many were sent.
fn events_until(
    (a, b, ch): (&mut Ws, &mut Ws, &str),
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> u64 {
    let mut n = 0;
    wait_for(limit, what, || {
        n += 1;
        client_event(a, b, ch, n);
        std::thread::sleep(Duration::from_millis(250));
        done()
    });
    n
}

fn client_event(from: &mut Ws, to: &mut Ws, channel: &str, n: u64) {
    send_json(
        from,
        json!({"type": "client_event", "channel": channel, "event": "client-n", "data": {"n": n}}),
    );
    let got = next_event(to);
    assert_eq!(
        (got["event"].as_str(), got["data"]["n"].as_u64()),
        (Some("client-n"), Some(n)),
        "{got}"
    );
}

/// Wait until the server applied `--client-events on` (a separate CLI call, so the
/// watcher may have seen the project before it): a probe from `from` is no longer
/// refused, and `to` receives it.
/// `project set-webhook` of `p` to `url` for `events`; the JSON the CLI printed.
fn set_webhook(s: &Server, p: &Private, url: &str, events: &str) -> Value {
    cli(
        &s.data_dir,
        &["project", "set-webhook", &p.id, url, "--events", events],
    )
}

/// Members `users.0` and `users.1` of `channel`, connected at `url`, once a client event
/// from the first reaches the second: ((socket, connection id), (socket, connection id)).
fn chatting(
    url: &str,
    p: &Private,
    channel: &str,
    users: (&str, &str),
) -> ((Ws, String), (Ws, String)) {
    let (mut a, a_id) = member(url, p, channel, users.0);
    let (mut b, b_id) = member(url, p, channel, users.1);
    wait_client_events_on(&mut a, &mut b, channel);
    ((a, a_id), (b, b_id))
}

fn wait_client_events_on(from: &mut Ws, to: &mut Ws, channel: &str) {
    wait_for(Duration::from_secs(10), "client events to be on", || {
        send_json(
            from,
            json!({"type": "client_event", "channel": channel, "event": "client-probe", "data": {}}),
        );
        set_timeout(from, Duration::from_millis(300));
        let accepted = loop {
            match from.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["type"] == "presence" {
                        continue;
                    }
                    assert_eq!(v["code"], "forbidden", "{v}");
                    break false;
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => break true, // no answer: relayed
            }
        };
        set_timeout(from, Duration::from_secs(10));
        accepted
    });
    assert_eq!(next_event(to)["event"], "client-probe");
}

/// The next frame that is not a presence join/leave.
fn next_event(ws: &mut Ws) -> Value {
    loop {
        let v = next_json(ws);
        if v["type"] != "presence" {
            return v;
        }
    }
}

/// The `n` of each `client-n` event of a request (probes left out).
fn ns(hook: &Hook) -> Vec<u64> {
    hook.events()
        .iter()
        .filter(|e| e["event"] == "client-n")
        .map(|e| {
            let data: Value =
                serde_json::from_str(e["data"].as_str().expect("data is a string")).unwrap();
            data["n"].as_u64().unwrap()
        })
        .collect()
}

/// Signed with the token secret, keyed with the public key, batched within 1 s, retried
/// (the same events, re-stamped and re-signed) after two 500s; `--off` stops them.
#[test]
fn client_events_are_signed_batched_retried_and_stop_when_off() {
    let s = Server::start_with(allowed());
    let p = project(&s, "hooks");
    let receiver = Receiver::start(&[500, 500]);
    let set = set_webhook(&s, &p, &receiver.url(), "client_event");
    assert_eq!(
        set["project"]["webhook"],
        json!({"url": receiver.url(), "events": ["client_event"]})
    );
    let ch = "private-room";
    let url = s.ws_url(&p.public);
    let ((mut a, a_id), (mut b, _)) = chatting(&url, &p, ch, ("u1", "u2"));

    // The server applies the webhook within a second: probe (4 a second, well under the
    // 10/s client-event limit) until one arrives.
    let n = events_until(
        (&mut a, &mut b, ch),
        Duration::from_secs(15),
        "the first webhook",
        || !receiver.hooks().is_empty(),
    );
    // The first request failed (500); its retries carry the very same events. Events
    // sent now wait behind them (one request in flight per project).
    let first = receiver.hooks()[0].clone();
    assert!(!first.events().is_empty());
    let burst: Vec<u64> = (n + 1..=n + 3).collect();
    for &m in &burst {
        client_event(&mut a, &mut b, ch, m);
    }
    let hooks = receiver.wait_hooks(4, Duration::from_secs(20));
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;

    let mut times = Vec::new();
    for h in &hooks {
        assert_eq!(h.content_type.as_deref(), Some("application/json"));
        assert_eq!(h.key.as_deref(), Some(p.public.as_str()), "X-Pusher-Key");
        assert!(
            h.signed_with(&p.token_secret),
            "signature of {:?}",
            String::from_utf8_lossy(&h.body)
        );
        assert!(!h.signed_with(&p.secret));
        let time_ms = h.json()["time_ms"].as_u64().expect("time_ms");
        assert!(time_ms <= before && time_ms + 60_000 > before, "{time_ms}");
        times.push(time_ms);
    }
    // Attempts 1..3 are the same events, each re-stamped (1 s, then 2 s of backoff).
    assert_eq!(hooks[1].events(), first.events());
    assert_eq!(hooks[2].events(), first.events());
    assert!(
        times[1] >= times[0] + 900 && times[2] >= times[1] + 1900,
        "{times:?}"
    );
    assert!(hooks[1].at >= hooks[0].at + Duration::from_millis(900));
    assert_ne!(hooks[0].signature, hooks[1].signature, "re-signed");
    // Then the burst: one request for the three events sent within a second, in order.
    let later: Vec<u64> = hooks[3..].iter().flat_map(ns).collect();
    assert!(
        later.ends_with(&burst) && hooks.last().map(ns).unwrap().ends_with(&burst),
        "the burst in one request, in order: {later:?}"
    );
    let events = hooks[0].events();
    let event = events
        .iter()
        .find(|e| e["event"] == "client-n")
        .expect("a client-n event");
    assert_eq!(event["name"], "client_event");
    assert_eq!(event["channel"], ch);
    assert_eq!(event["event"], "client-n");
    assert_eq!(event["socket_id"], a_id.as_str());
    assert!(
        event.get("user_id").is_none(),
        "no user_id on a private channel: {event}"
    );

    // Off: events are relayed, no request follows.
    let off = cli(&s.data_dir, &["project", "set-webhook", &p.id, "--off"]);
    assert_eq!(off["project"]["webhook"], "off");
    // The change reaches the server within 1 s (key_refresh_ms 250); give it 1.5 s,
    // then a request would come within the 1 s batch window.
    std::thread::sleep(Duration::from_millis(1500));
    let seen = receiver.hooks().len();
    for m in 1000..1003 {
        client_event(&mut a, &mut b, ch, m);
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(receiver.hooks().len(), seen, "no webhook after --off");
}

/// The events filter: without `client_event` in `--events`, client events send nothing;
/// listed, they do (with `user_id` on a presence channel).
#[test]
fn client_events_are_sent_only_when_listed() {
    let s = Server::start_with(allowed());
    let p = project(&s, "filtered");
    let receiver = Receiver::start(&[]);
    // The default list: every kind but client_event.
    let set = cli(
        &s.data_dir,
        &["project", "set-webhook", &p.id, &receiver.url()],
    );
    assert_eq!(
        set["project"]["webhook"]["events"],
        json!([
            "channel_occupied",
            "channel_vacated",
            "member_added",
            "member_removed"
        ])
    );
    let ch = "presence-room";
    let url = s.ws_url(&p.public);
    let ((mut a, a_id), (mut b, _)) = chatting(&url, &p, ch, ("alice", "bob"));
    // Let the webhook reach the server (the contract: within 1 s), then send: not
    // wanted, so never sent. (Nothing the server does shows it applied a list without
    // client_event, hence the bounded wait.)
    std::thread::sleep(Duration::from_millis(1500));
    client_event(&mut a, &mut b, ch, 0);

    set_webhook(&s, &p, &receiver.url(), "client_event,member_added");
    // Membership and occupancy webhooks (wanted from the start) may have arrived too,
    // depending on when the server applied the first setting: look for client events
    // across every request.
    let n = events_until(
        (&mut a, &mut b, ch),
        Duration::from_secs(15),
        "a client_event webhook",
        || receiver.hooks().iter().any(|h| !ns(h).is_empty()),
    );
    let hooks = receiver.hooks();
    let sent: Vec<u64> = hooks.iter().flat_map(ns).collect();
    assert!(
        !sent.contains(&0),
        "the event sent before client_event was listed: {sent:?}"
    );
    assert!(sent.iter().all(|m| *m >= 1 && *m <= n), "{sent:?}");
    let with_events = hooks
        .iter()
        .find(|h| !ns(h).is_empty())
        .expect("a request with client events");
    let events = with_events.events();
    let event = events
        .iter()
        .find(|e| e["event"] == "client-n")
        .expect("a client-n event");
    assert_eq!(event["user_id"], "alice", "{event}");
    assert_eq!(event["socket_id"], a_id.as_str());
    assert!(with_events.signed_with(&p.token_secret));
}

/// The value of one series (name with labels) of a scrape.
fn scrape(s: &Server, series: &str) -> u64 {
    common::metrics::sample(&s.scrape(), series) as u64
}

/// A slow endpoint (it takes 4 s to answer) holds up only its own project: another
/// project's webhooks and every publish go on meanwhile. Its queue holds
/// `webhook_queue_events` (3 here) events; the ones that do not fit are dropped,
/// counted in the metrics and logged, and the ones kept follow once it answers.
#[test]
fn a_slow_endpoint_holds_up_only_its_own_project_and_a_full_queue_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let s = Server::start_with(Options {
        config: "webhook_queue_events = 3\nmetrics_listen = \"127.0.0.1:0\"\n".into(),
        log_file: Some(log.clone()),
        ..allowed()
    });
    let slow = project(&s, "slow");
    let fast = project(&s, "fast");
    let slow_rx = Receiver::scripted(&[(200, Duration::from_millis(4000))]);
    let fast_rx = Receiver::start(&[]);
    for (p, r) in [(&slow, &slow_rx), (&fast, &fast_rx)] {
        cli(
            &s.data_dir,
            &[
                "project",
                "set-webhook",
                &p.id,
                &r.url(),
                "--events",
                "client_event",
            ],
        );
    }
    let ch = "private-x";
    let (mut a, _) = member(&s.ws_url(&slow.public), &slow, ch, "u1");
    let (mut a2, _) = member(&s.ws_url(&slow.public), &slow, ch, "u3");
    let (mut b, _) = member(&s.ws_url(&slow.public), &slow, ch, "u2");
    wait_client_events_on(&mut a, &mut b, ch);
    events_until(
        (&mut a, &mut b, ch),
        Duration::from_secs(15),
        "the slow project's first request",
        || !slow_rx.hooks().is_empty(),
    );
    let stuck_since = slow_rx.hooks()[0].at;

    // While it hangs: 8 more events of the slow project (from a connection that sent
    // none yet, under the 10/s limit); its queue keeps 3 at most.
    for m in 100..108 {
        client_event(&mut a2, &mut b, ch, m);
    }
    // The other project's webhooks go on, and publishing is not slowed.
    let ((mut c, _), (mut d, _)) = chatting(&s.ws_url(&fast.public), &fast, ch, ("u1", "u2"));
    events_until(
        (&mut c, &mut d, ch),
        Duration::from_secs(4),
        "the fast project's webhook",
        || !fast_rx.hooks().is_empty(),
    );
    let started = Instant::now();
    let (status, _) = s.publish(&fast.secret, "news", "e", json!({"x": 1}));
    assert_eq!(status, 202);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        fast_rx.hooks()[0].at < stuck_since + Duration::from_millis(4000),
        "the fast project's webhook came while the slow one was still stuck"
    );
    assert_eq!(slow_rx.hooks().len(), 1, "still one request in flight");

    let dropped = "ringcast_webhook_events_dropped_total{reason=\"queue_full\"}";
    assert!(scrape(&s, dropped) >= 5, "8 events into a queue of 3");
    // The slow endpoint answers; the kept events follow, at most 3.
    let hooks = slow_rx.wait_hooks(2, Duration::from_secs(10));
    let kept = ns(&hooks[1]);
    assert!(!kept.is_empty() && kept.len() <= 3, "{kept:?}");
    wait_for(
        Duration::from_secs(5),
        "the metrics to count the answers",
        || scrape(&s, "ringcast_webhook_requests_total{result=\"ok\"}") >= 3,
    );
    assert_eq!(
        scrape(&s, "ringcast_webhook_requests_total{result=\"failed\"}"),
        0
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("webhook event dropped"), "{text}");
    assert!(!text.contains(&slow.token_secret) && !text.contains(&slow_rx.url()));
}

/// `(name, channel, user_id)` of every event the receiver got about `channel`, in
/// arrival order, with the arrival time of its request.
fn about(r: &Receiver, channel: &str) -> Vec<(String, String, Instant)> {
    r.hooks()
        .iter()
        .flat_map(|h| {
            h.events()
                .into_iter()
                .filter(|e| e["channel"] == channel)
                .map(|e| {
                    let user = e["user_id"].as_str().unwrap_or("").to_string();
                    (e["name"].as_str().unwrap().to_string(), user, h.at)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn names(events: &[(String, String, Instant)]) -> Vec<String> {
    events
        .iter()
        .map(|(n, u, _)| {
            if u.is_empty() {
                n.clone()
            } else {
                format!("{n}:{u}")
            }
        })
        .collect()
}

mod cluster_and_addresses;
