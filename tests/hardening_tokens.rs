//! Issue 20, finding 2, black box: subscribes and token refreshes are bounded per
//! connection (`subscribe_rate_per_connection`, a token bucket of burst
//! `max_subscriptions_per_connection`), token signatures are checked only within that
//! budget, and a flood of forged tokens costs the server bounded CPU and another project
//! nothing. Tokens are made by the `jsonwebtoken` crate, keys by rcgen.

mod common;
use common::unix_now;
/// Every project here has its token secret in use.
use common::Project as App;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{cli, next_json, send_json, wait_for, Options, Server, Ws};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tungstenite::Message;

/// Register a new P-256 public key for the project; returns its kid and private half.
fn add_es256_key(server: &Server, a: &App) -> (String, EncodingKey) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let path = server.data_dir.join("es256.pem");
    std::fs::write(&path, pair.public_key_pem()).unwrap();
    let v = cli(
        &server.data_dir,
        &[
            "project",
            "add-token-key",
            &a.id,
            "--public-key-file",
            path.to_str().unwrap(),
        ],
    );
    let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
    (v["token_key_id"].as_str().unwrap().to_string(), key)
}

fn es256(kid: &str, key: &EncodingKey, channel: &str) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.into());
    encode(
        &h,
        &json!({"channel": channel, "exp": unix_now() + 600}),
        key,
    )
    .unwrap()
}

/// An ES256 token naming `kid` with a signature nobody made (64 bytes that only a
/// signature check can tell from a real one).
fn forged(kid: &str, channel: &str, seed: u64) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = json!({"alg": "ES256", "typ": "JWT", "kid": kid}).to_string();
    let claims = json!({"channel": channel, "exp": unix_now() + 600}).to_string();
    let sig: Vec<u8> = (0..64u64)
        .map(|i| (seed.wrapping_mul(6364136223846793005).wrapping_add(i * 97) >> 7) as u8)
        .collect();
    format!(
        "{}.{}.{}",
        b64(header.as_bytes()),
        b64(claims.as_bytes()),
        b64(&sig)
    )
}

fn hs256(secret: &str, channel: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &json!({"channel": channel, "exp": unix_now() + 600}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// The server's CPU time so far (user + system), from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after `)`.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap();
    Duration::from_millis(ticks * 1000 / hz)
}

fn ping_pong(ws: &mut Ws) {
    send_json(ws, json!({"type": "ping"}));
    loop {
        let f = next_json(ws);
        if f["type"] == "pong" {
            return;
        }
    }
}

/// Send `frames` in batches and read one answer per frame; returns the answers' codes.
fn flood(ws: &mut Ws, frames: &[Value]) -> Vec<String> {
    let mut codes = Vec::with_capacity(frames.len());
    for batch in frames.chunks(50) {
        for f in batch {
            ws.write(Message::text(f.to_string())).unwrap();
        }
        ws.flush().unwrap();
        for _ in batch {
            let a = next_json(ws);
            codes.push(
                a["code"]
                    .as_str()
                    .unwrap_or(a["type"].as_str().unwrap_or(""))
                    .to_string(),
            );
        }
    }
    codes
}

fn count(codes: &[String], code: &str) -> usize {
    codes.iter().filter(|c| *c == code).count()
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Two sockets flood one worker with forged ES256 tokens naming a real kid: beyond the
/// burst they are answered `rate_limited` (no signature check), the sockets stay open,
/// the server's CPU time stays bounded, and another project's subscriber on the same
/// worker gets every message promptly.
#[test]
fn forged_token_floods_are_rate_limited_and_cost_bounded_cpu() {
    let server = Server::start_with(Options::default().workers(1));
    let victim = server.test_project("victim");
    let attacker = server.test_project("attacker");
    let (kid, key) = add_es256_key(&server, &attacker);
    // The forged tokens must name a kid the server knows (an unknown kid is refused
    // before any signature check): wait until a real token of that kid verifies.
    let mut probe = server.ws(&attacker.public);
    wait_for(Duration::from_secs(3), "the kid to be known", || {
        let frame = json!({"type": "subscribe", "channel": "private-probe",
            "token": es256(&kid, &key, "private-probe")});
        send_json(&mut probe, frame);
        next_json(&mut probe)["type"] == "subscribed"
    });

    // The other project's subscriber (a reader thread measuring publish->delivery) and
    // a paced publisher.
    let mut sub = server.ws_on(&victim.public, "news");
    let reader = std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        let mut n = 0u64;
        loop {
            let m = next_json(&mut sub);
            if m["event"] == "end" {
                return (n, worst);
            }
            assert_eq!(m["data"]["n"], n, "{m}");
            let at = m["data"]["at"].as_u64().unwrap();
            worst = worst.max(Duration::from_micros(unix_us().saturating_sub(at)));
            n += 1;
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (stop, base) = (stop.clone(), server.url(""));
        let secret = victim.secret.clone();
        std::thread::spawn(move || {
            let agent = ureq::Agent::new_with_defaults();
            let publish = |event: &str, data: Value| {
                let body = json!({"channel": "news", "event": event, "data": data});
                let r = agent
                    .post(format!("{base}/api/v1/publish"))
                    .header("X-Api-Key", &secret)
                    .header("Content-Type", "application/json")
                    .send(body.to_string());
                assert_eq!(r.map(|r| r.status().as_u16()).unwrap_or(0), 202);
            };
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                publish("t", json!({"n": sent, "at": unix_us()}));
                sent += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            publish("end", json!({}));
            sent
        })
    };

    let frames: Vec<Value> = (0..1500)
        .map(|i| {
            let channel = format!("private-f{i}");
            json!({"type": "subscribe", "channel": channel, "token": forged(&kid, &channel, i)})
        })
        .collect();
    let sockets = [server.ws(&attacker.public), server.ws(&attacker.public)];
    let cpu_before = cpu_time(server.pid());
    let start = Instant::now();
    let flooders: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| {
            let frames = frames.clone();
            std::thread::spawn(move || {
                let codes = flood(&mut ws, &frames);
                (ws, codes)
            })
        })
        .collect();
    let results: Vec<(Ws, Vec<String>)> = flooders.into_iter().map(|t| t.join().unwrap()).collect();
    let elapsed = start.elapsed();
    let cpu = cpu_time(server.pid()) - cpu_before;
    stop.store(true, Ordering::Relaxed);
    let sent = publisher.join().unwrap();
    let (received, worst) = reader.join().unwrap();

    let checked: usize = results.iter().map(|(_, c)| count(c, "forbidden")).sum();
    eprintln!(
        "flood: 3000 forged ES256 subscribes in {elapsed:?}, {checked} signature checks, \
         server CPU {cpu:?}; victim: {received}/{sent} messages, worst publish->delivery {worst:?}"
    );
    for (mut ws, codes) in results {
        let forbidden = count(&codes, "forbidden");
        let limited = count(&codes, "rate_limited");
        assert_eq!(forbidden + limited, codes.len(), "{codes:?}");
        // The burst (100) and 20 per second: nothing more is ever checked.
        let budget = 100 + (20.0 * elapsed.as_secs_f64()).ceil() as usize + 1;
        assert!(
            forbidden <= budget,
            "{forbidden} signature checks in {elapsed:?} on one connection (budget {budget})"
        );
        assert!(limited + budget >= codes.len(), "{limited} rate_limited");
        // Still open, and still answering.
        ping_pong(&mut ws);
    }
    // 3000 pure-Rust ES256 checks cost ~0.9 s of CPU in a release build (a debug
    // build: ~15 s); after the fix ~20 ms (release) or ~150 ms (debug).
    assert!(
        cpu < Duration::from_millis(600),
        "the flood cost the server {cpu:?} of CPU"
    );
    // Every message of the other project arrived, in order, promptly.
    assert_eq!(received, sent);
    assert!(sent > 0);
    assert!(
        worst < Duration::from_millis(500),
        "worst latency {worst:?}"
    );
}

fn codes_of(ws: &mut Ws, frames: &[Value]) -> Vec<String> {
    flood(ws, frames)
}

/// Subscribes refused for another reason (an invalid name, the subscription limit, a
/// channel already held, a private channel without a token, a refresh of a channel not
/// held) keep their own answers and take nothing from the budget; refreshes are charged.
#[test]
fn subscribes_refused_for_another_reason_take_nothing_from_the_budget() {
    let server = Server::start_with(
        Options::config(
            "max_subscriptions_per_connection = 3\nsubscribe_rate_per_connection = 1\n",
        )
        .workers(1),
    );
    let a = server.test_project("a");
    let mut ws = server.ws(&a.public);
    // The burst: 3 subscribes.
    for c in ["c0", "c1", "c2"] {
        common::subscribe(&mut ws, c);
    }
    let sub = |c: &str| json!({"type": "subscribe", "channel": c});
    let mut refused = Vec::new();
    for _ in 0..20 {
        refused.push(sub("c3")); // over the subscription limit
        refused.push(sub("c0")); // held already
        refused.push(sub("")); // invalid name
        refused.push(sub("private-x")); // no token
        refused.push(json!({"type": "refresh", "channel": "private-x", "token": "a.b.c"}));
    }
    let codes = codes_of(&mut ws, &refused);
    for (i, code) in codes.iter().enumerate() {
        let want = [
            "too_many_subscriptions",
            "subscribed",
            "invalid_channel",
            "forbidden",
            "forbidden",
        ][i % 5];
        assert_eq!(code, want, "answer {i}");
    }
    // Had those 100 frames been charged, the next subscribe would wait ~100 s; a unit
    // comes back within a second.
    send_json(&mut ws, json!({"type": "unsubscribe", "channel": "c0"}));
    assert_eq!(next_json(&mut ws)["type"], "unsubscribed");
    let start = Instant::now();
    wait_for(Duration::from_secs(3), "a unit of the budget", || {
        send_json(&mut ws, sub("c4"));
        let reply = next_json(&mut ws);
        if reply["type"] == "subscribed" {
            return true;
        }
        assert_eq!(reply["code"], "rate_limited", "{reply}");
        assert_eq!(reply["channel"], "c4", "{reply}");
        std::thread::sleep(Duration::from_millis(50));
        false
    });
    eprintln!(
        "a new subscribe after 100 refused ones: accepted after {:?}",
        start.elapsed()
    );

    // Refreshes are charged: a held private channel, refreshed in a loop, meets the rate.
    let token = hs256(&a.token_secret, "private-r");
    send_json(&mut ws, json!({"type": "unsubscribe", "channel": "c1"}));
    assert_eq!(next_json(&mut ws)["type"], "unsubscribed");
    wait_for(Duration::from_secs(3), "the private subscribe", || {
        send_json(
            &mut ws,
            json!({"type": "subscribe", "channel": "private-r", "token": token}),
        );
        let reply = next_json(&mut ws);
        std::thread::sleep(Duration::from_millis(50));
        reply["type"] == "subscribed"
    });
    let refresh = json!({"type": "refresh", "channel": "private-r", "token": token});
    let codes = codes_of(&mut ws, &vec![refresh; 10]);
    assert!(count(&codes, "rate_limited") >= 7, "{codes:?}");
    assert!(count(&codes, "refreshed") >= 1 || count(&codes, "rate_limited") == 10);
    ping_pong(&mut ws);
}

/// The Pusher protocol: forged `auth` beyond the budget is answered
/// `pusher:subscription_error` with status 429, and the connection stays open.
#[test]
fn the_pusher_path_answers_429_beyond_the_budget() {
    let server = Server::start_with(Options::default().workers(1));
    let a = server.test_project("p");
    let url = format!(
        "ws://{}/app/{}?protocol=7&client=js&version=8.6.0",
        server.addr, a.public
    );
    let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
    common::set_timeout(&mut ws, Duration::from_secs(10));
    assert_eq!(next_json(&mut ws)["event"], "pusher:connection_established");
    let frames: Vec<Value> = (0..400)
        .map(|i| {
            let data = json!({"channel": format!("private-p{i}"), "auth": format!("{}:{}", a.public, "0".repeat(64))});
            json!({"event": "pusher:subscribe", "data": data})
        })
        .collect();
    let mut statuses = Vec::new();
    for batch in frames.chunks(50) {
        for f in batch {
            ws.write(Message::text(f.to_string())).unwrap();
        }
        ws.flush().unwrap();
        for _ in batch {
            let f = next_json(&mut ws);
            assert_eq!(f["event"], "pusher:subscription_error", "{f}");
            let d: Value = serde_json::from_str(f["data"].as_str().unwrap()).unwrap();
            statuses.push(d["status"].as_u64().unwrap());
        }
    }
    let refused = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(refused + limited, 400, "{statuses:?}");
    assert!((100..=140).contains(&refused), "{refused} auth checks");
    send_json(&mut ws, json!({"event": "pusher:ping", "data": {}}));
    assert_eq!(next_json(&mut ws)["event"], "pusher:pong");
}
