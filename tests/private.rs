//! Private channels, black box: the real binary, the real CLI, tokens made by an
//! independent JWT library (the `jsonwebtoken` crate here, PyJWT in the example backend),
//! keys made by rcgen.

mod common;
/// Every project here has its token secret in use.
use common::Project as Private;
use common::{hs256, unix_now};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::{cli, next_json, send_json, set_timeout, subscribe, wait_for, Server, Ws};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

fn with_kid(alg: Algorithm, kid: &str, key: &EncodingKey, claims: Value) -> String {
    let mut h = Header::new(alg);
    h.kid = Some(kid.into());
    encode(&h, &claims, key).unwrap()
}

fn ws(server: &Server, public: &str) -> Ws {
    let mut ws = server.ws(public);
    set_timeout(&mut ws, Duration::from_secs(15));
    ws
}

fn sub_frame(channel: &str, token: &str) -> Value {
    json!({"type": "subscribe", "channel": channel, "token": token})
}

fn expect_subscribed(ws: &mut Ws, channel: &str, token: &str) {
    send_json(ws, sub_frame(channel, token));
    let reply = next_json(ws);
    assert_eq!(reply, json!({"type": "subscribed", "channel": channel}));
}

fn expect_forbidden(ws: &mut Ws, frame: Value) -> Value {
    let channel = frame["channel"].clone();
    send_json(ws, frame);
    let reply = next_json(ws);
    assert_eq!(reply["type"], "error", "{reply}");
    assert_eq!(reply["code"], "forbidden", "{reply}");
    assert_eq!(reply["channel"], channel, "{reply}");
    assert!(reply["message"].as_str().is_some_and(|m| !m.is_empty()));
    reply
}

/// Publish to each channel, then to a public sentinel the socket holds: the sentinel's
/// message must be the next frame, so none of the channels delivered anything (one
/// publisher's messages reach a worker in order).
fn expect_no_delivery(server: &Server, ws: &mut Ws, p: &Private, channels: &[&str]) {
    for c in channels {
        let (status, body) = server.publish(&p.secret, c, "e", json!({"leak": c}));
        assert_eq!(status, 202, "{body}");
    }
    let (status, _) = server.publish(&p.secret, "sentinel", "e", json!("s"));
    assert_eq!(status, 202);
    let next = next_json(ws);
    assert_eq!(
        next["channel"], "sentinel",
        "a refused channel delivered: {next}"
    );
}

fn expect_message(server: &Server, ws: &mut Ws, p: &Private, channel: &str) {
    let (status, _) = server.publish(&p.secret, channel, "e", json!({"to": channel}));
    assert_eq!(status, 202);
    let m = next_json(ws);
    assert_eq!(m["type"], "message", "{m}");
    assert_eq!(m["channel"], channel, "{m}");
}

fn key_file(dir: &std::path::Path, name: &str, pem: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path.to_str().unwrap().to_string()
}

fn add_key(server: &Server, p: &Private, pem_file: &str) -> String {
    let v = cli(
        &server.data_dir,
        &[
            "project",
            "add-token-key",
            &p.id,
            "--public-key-file",
            pem_file,
        ],
    );
    v["token_key_id"].as_str().unwrap().to_string()
}

/// Subscribe attempts until one is answered `subscribed` (the watcher has the change).
fn wait_accepted(ws: &mut Ws, channel: &str, token: &str) {
    let what = "the token to be accepted";
    attempts_until(ws, (channel, token), (2, what), |r| {
        r["type"] == "subscribed"
    });
}

/// Subscribe attempts until one is refused with forbidden.
fn wait_refused(ws: &mut Ws, channel: &str, token: &str) -> Duration {
    let start = Instant::now();
    let what = "the token to be refused";
    attempts_until(ws, (channel, token), (3, what), |r| {
        r["code"] == "forbidden"
    });
    start.elapsed()
}

/// Subscribe to `channel` with `token` until the answer satisfies `done` (each other
/// attempt undone with an unsubscribe), within `secs` seconds.
fn attempts_until(
    ws: &mut Ws,
    (channel, token): (&str, &str),
    (secs, what): (u64, &str),
    done: impl Fn(&Value) -> bool,
) {
    wait_for(Duration::from_secs(secs), what, || {
        send_json(ws, sub_frame(channel, token));
        if done(&next_json(ws)) {
            return true;
        }
        send_json(ws, json!({"type": "unsubscribe", "channel": channel}));
        next_json(ws);
        false
    });
}

#[test]
fn valid_hs256_es256_and_eddsa_tokens_subscribe_and_receive() {
    let server = Server::start();
    let p = server.test_project("shop");
    let dir = tempfile::tempdir().unwrap();
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let ec_kid = add_key(
        &server,
        &p,
        &key_file(dir.path(), "ec.pem", &ec.public_key_pem()),
    );
    let ed_kid = add_key(
        &server,
        &p,
        &key_file(dir.path(), "ed.pem", &ed.public_key_pem()),
    );
    let exp = unix_now() + 600;
    let mut ws = ws(&server, &p.public);
    subscribe(&mut ws, "sentinel");

    let hs = hs256(
        &p.token_secret,
        json!({"channel": "private-a", "exp": exp, "sub": "u1"}),
    );
    expect_subscribed(&mut ws, "private-a", &hs);
    expect_message(&server, &mut ws, &p, "private-a");

    let many = hs256(
        &p.token_secret,
        json!({"channels": ["private-x", "private-b"], "exp": exp, "iat": unix_now(), "nbf": unix_now()}),
    );
    expect_subscribed(&mut ws, "private-b", &many);
    expect_message(&server, &mut ws, &p, "private-b");

    let ec_key = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
    let ed_key = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
    let es_token = |channel: &str| {
        with_kid(
            Algorithm::ES256,
            &ec_kid,
            &ec_key,
            json!({"channel": channel, "exp": exp}),
        )
    };
    let es = es_token("private-es");
    let eddsa = with_kid(
        Algorithm::EdDSA,
        &ed_kid,
        &ed_key,
        json!({"channel": "private-ed", "exp": exp}),
    );
    for (channel, token) in [("private-es", &es), ("private-ed", &eddsa)] {
        wait_accepted(&mut ws, channel, token);
        expect_message(&server, &mut ws, &p, channel);
    }

    // Public channels need no token, and a token there is ignored.
    expect_subscribed(&mut ws, "news", "whatever");
    expect_message(&server, &mut ws, &p, "news");

    // Removing the key applies within a second: its tokens are refused from then on.
    let v = cli(
        &server.data_dir,
        &["project", "remove-token-key", &p.id, &ec_kid],
    );
    assert_eq!(v["removed"], ec_kid.as_str());
    let took = wait_refused(&mut ws, "private-es2", &es_token("private-es2"));
    assert!(took < Duration::from_secs(1), "removal took {took:?}");
    // The very token that verified before (and that the worker remembers as verified)
    // is refused too: the worker's cache of verified tokens ends with the snapshot.
    let took = wait_refused(&mut ws, "private-es", &es);
    assert!(
        took < Duration::from_secs(1),
        "replay refused after {took:?}"
    );
}

#[test]
fn refused_tokens_answer_forbidden_and_deliver_nothing() {
    let server = Server::start();
    let p = server.test_project("shop");
    let other = server.test_project("other");
    let dir = tempfile::tempdir().unwrap();
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ec_pem = ec.public_key_pem();
    let kid = add_key(&server, &p, &key_file(dir.path(), "ec.pem", &ec_pem));
    let mut ws = ws(&server, &p.public);
    subscribe(&mut ws, "sentinel");
    // The key is known once an ES256 token verifies.
    let ec_key = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
    wait_accepted(
        &mut ws,
        "private-ok",
        &with_kid(
            Algorithm::ES256,
            &kid,
            &ec_key,
            json!({"channel": "private-ok", "exp": unix_now() + 60}),
        ),
    );

    let exp = unix_now() + 600;
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let claims = |c: &str| json!({"channel": c, "exp": exp});
    let mut cases: Vec<(&str, Option<String>)> = vec![
        ("private-missing", None),
        (
            "private-wrong-secret",
            Some(hs256("ts_not_the_secret", claims("private-wrong-secret"))),
        ),
        (
            "private-other-project",
            Some(hs256(&other.token_secret, claims("private-other-project"))),
        ),
        (
            "private-wrong-channel",
            Some(hs256(&p.token_secret, claims("private-elsewhere"))),
        ),
        (
            "private-expired",
            Some(hs256(
                &p.token_secret,
                json!({"channel": "private-expired", "exp": unix_now() - 10}),
            )),
        ),
        (
            "private-nbf",
            Some(hs256(
                &p.token_secret,
                json!({"channel": "private-nbf", "exp": exp, "nbf": unix_now() + 60}),
            )),
        ),
        (
            "private-no-exp",
            Some(hs256(&p.token_secret, json!({"channel": "private-no-exp"}))),
        ),
        (
            "private-none",
            Some(format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT"})),
                b64(&claims("private-none"))
            )),
        ),
        (
            "private-none-kid",
            Some(format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "kid": kid})),
                b64(&claims("private-none-kid"))
            )),
        ),
        // The classic confusion: HS256 keyed with the registered public key's bytes.
        (
            "private-confused",
            Some(with_kid(
                Algorithm::HS256,
                &kid,
                &EncodingKey::from_secret(ec_pem.as_bytes()),
                claims("private-confused"),
            )),
        ),
        (
            "private-confused-nokid",
            Some(hs256(&ec_pem, claims("private-confused-nokid"))),
        ),
        (
            "private-unknown-kid",
            Some(with_kid(
                Algorithm::ES256,
                "tk_0000000000000000",
                &ec_key,
                claims("private-unknown-kid"),
            )),
        ),
        // ES256 signature without a kid: only HS256 is tried without one.
        (
            "private-es-nokid",
            Some(
                encode(
                    &Header::new(Algorithm::ES256),
                    &claims("private-es-nokid"),
                    &ec_key,
                )
                .unwrap(),
            ),
        ),
        (
            "private-hs384",
            Some(
                encode(
                    &Header::new(Algorithm::HS384),
                    &claims("private-hs384"),
                    &EncodingKey::from_secret(p.token_secret.as_bytes()),
                )
                .unwrap(),
            ),
        ),
        ("private-malformed", Some("not.a.jwt".into())),
        ("presence-room", None),
    ];
    // A tampered payload under a valid signature.
    let good = hs256(&p.token_secret, claims("private-tampered"));
    let parts: Vec<&str> = good.split('.').collect();
    cases.push((
        "private-tampered",
        Some(format!(
            "{}.{}.{}",
            parts[0],
            b64(&json!({"channel": "private-tampered", "exp": exp + 1})),
            parts[2]
        )),
    ));

    let mut channels = Vec::new();
    for (channel, token) in &cases {
        let mut frame = json!({"type": "subscribe", "channel": channel});
        if let Some(t) = token {
            frame["token"] = json!(t);
        }
        expect_forbidden(&mut ws, frame);
        channels.push(*channel);
    }
    channels.push("private-elsewhere");
    expect_no_delivery(&server, &mut ws, &p, &channels);

    // A subscribe without token on a private channel the socket does not hold, and a
    // refresh of a channel it does not hold: forbidden too; the connection stays usable.
    expect_forbidden(
        &mut ws,
        json!({"type": "refresh", "channel": "private-x", "token": hs256(&p.token_secret, claims("private-x"))}),
    );
    send_json(&mut ws, json!({"type": "ping"}));
    assert_eq!(next_json(&mut ws)["type"], "pong");

    // The CLI refuses a private key, and never stores one.
    let priv_file = key_file(dir.path(), "private.pem", &ec.serialize_pem());
    let out = Command::new(common::bin())
        .arg("--data-dir")
        .arg(&server.data_dir)
        .args([
            "project",
            "add-token-key",
            &p.id,
            "--public-key-file",
            &priv_file,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("private key"));
}

#[test]
fn expiry_unsubscribes_at_exp_plus_five_seconds_unless_refreshed() {
    let server = Server::start();
    let p = server.test_project("shop");
    let mut ws = ws(&server, &p.public);
    subscribe(&mut ws, "sentinel");
    let exp = unix_now() + 1;
    let claims = |c: &str, exp: u64| json!({"channel": c, "exp": exp, "sub": "u1"});
    expect_subscribed(
        &mut ws,
        "private-short",
        &hs256(&p.token_secret, claims("private-short", exp)),
    );
    expect_subscribed(
        &mut ws,
        "private-kept",
        &hs256(&p.token_secret, claims("private-kept", exp)),
    );
    expect_message(&server, &mut ws, &p, "private-short");

    // A refused refresh (another user) leaves the old exp in force.
    let other_user = hs256(
        &p.token_secret,
        json!({"channel": "private-short", "exp": exp + 600, "sub": "u2"}),
    );
    expect_forbidden(
        &mut ws,
        json!({"type": "refresh", "channel": "private-short", "token": other_user}),
    );
    let expired_refresh = hs256(&p.token_secret, claims("private-short", unix_now() - 30));
    expect_forbidden(
        &mut ws,
        json!({"type": "refresh", "channel": "private-short", "token": expired_refresh}),
    );

    // A refresh in time moves private-kept's expiry.
    let new_exp = unix_now() + 600;
    send_json(
        &mut ws,
        json!({"type": "refresh", "channel": "private-kept", "token": hs256(&p.token_secret, claims("private-kept", new_exp))}),
    );
    assert_eq!(
        next_json(&mut ws),
        json!({"type": "refreshed", "channel": "private-kept", "exp": new_exp})
    );

    let ended = next_json(&mut ws);
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert_eq!(
        ended,
        json!({"type": "unsubscribed", "channel": "private-short", "reason": "token_expired"})
    );
    assert!(
        at >= (exp + 5) as f64,
        "ended at {at}, before exp + 5 = {}",
        exp + 5
    );
    assert!(
        at < (exp + 7) as f64,
        "ended at {at}, long after exp + 5 = {}",
        exp + 5
    );

    // Nothing more on the expired channel; the refreshed one keeps receiving.
    expect_no_delivery(&server, &mut ws, &p, &["private-short"]);
    expect_message(&server, &mut ws, &p, "private-kept");
    // The expired channel can be subscribed again with a fresh token.
    expect_subscribed(
        &mut ws,
        "private-short",
        &hs256(&p.token_secret, claims("private-short", unix_now() + 600)),
    );
    expect_message(&server, &mut ws, &p, "private-short");
}

#[test]
fn exp_and_nbf_get_exactly_five_seconds_of_leeway() {
    let server = Server::start();
    let p = server.test_project("shop");
    let mut ws = ws(&server, &p.public);
    let n = unix_now();
    expect_subscribed(
        &mut ws,
        "private-a",
        &hs256(
            &p.token_secret,
            json!({"channel": "private-a", "exp": n - 3}),
        ),
    );
    expect_subscribed(
        &mut ws,
        "private-b",
        &hs256(
            &p.token_secret,
            json!({"channel": "private-b", "exp": n + 600, "nbf": n + 3}),
        ),
    );
    expect_forbidden(
        &mut ws,
        sub_frame(
            "private-c",
            &hs256(
                &p.token_secret,
                json!({"channel": "private-c", "exp": n - 7}),
            ),
        ),
    );
    expect_forbidden(
        &mut ws,
        sub_frame(
            "private-d",
            &hs256(
                &p.token_secret,
                json!({"channel": "private-d", "exp": n + 600, "nbf": n + 8}),
            ),
        ),
    );
    // private-a (exp n - 3) ends at n + 2 at the latest.
    let ended = next_json(&mut ws);
    assert_eq!(ended["reason"], "token_expired");
    assert_eq!(ended["channel"], "private-a");
    assert!(unix_now() <= n + 3);
}

#[test]
fn rotation_keeps_the_old_secret_for_the_grace_only() {
    let server = Server::start();
    let p = server.test_project("shop");
    let mut ws = ws(&server, &p.public);
    let exp = unix_now() + 600;
    let old = |c: &str| hs256(&p.token_secret, json!({"channel": c, "exp": exp}));
    expect_subscribed(&mut ws, "private-0", &old("private-0"));

    let v = cli(
        &server.data_dir,
        &["project", "rotate-token-secret", &p.id, "--grace", "3s"],
    );
    let rotated_at = Instant::now();
    let new_secret = v["token_secret"].as_str().unwrap().to_string();
    assert!(new_secret.starts_with("ts_") && new_secret != p.token_secret);
    let new = |c: &str| hs256(&new_secret, json!({"channel": c, "exp": exp}));
    wait_accepted(&mut ws, "private-1", &new("private-1"));
    assert!(rotated_at.elapsed() < Duration::from_secs(1));
    // Both verify during the grace.
    expect_subscribed(&mut ws, "private-2", &old("private-2"));
    // The old one stops at the end of the grace.
    wait_for(Duration::from_secs(5), "the grace to end", || {
        send_json(&mut ws, sub_frame("private-3", &old("private-3")));
        let r = next_json(&mut ws);
        r["code"] == "forbidden"
    });
    let took = rotated_at.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "old secret refused after {took:?}"
    );
    expect_subscribed(&mut ws, "private-4", &new("private-4"));

    // --grace 0s: the previous secret stops within a second.
    let v = cli(
        &server.data_dir,
        &["project", "rotate-token-secret", &p.id, "--grace", "0s"],
    );
    let third = v["token_secret"].as_str().unwrap().to_string();
    let took = wait_refused(&mut ws, "private-5", &new("private-5"));
    assert!(took < Duration::from_secs(1), "grace 0s took {took:?}");
    expect_subscribed(
        &mut ws,
        "private-6",
        &hs256(&third, json!({"channel": "private-6", "exp": exp})),
    );
}

#[test]
fn the_master_key_is_created_with_mode_0600_and_secrets_are_sealed() {
    let server = Server::start();
    let p = server.test_project("shop");
    let path = server.data_dir.join("master.key");
    let meta = std::fs::metadata(&path).expect("master.key in the data directory");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(&server.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "master.key") {
            bytes.extend(std::fs::read(path).unwrap());
        }
    }
    let needle = &p.token_secret.as_bytes()[3..];
    assert!(
        !bytes.windows(needle.len()).any(|w| w == needle),
        "token secret stored in clear"
    );
}

#[test]
fn the_example_backend_signs_tokens_the_server_accepts() {
    let server = Server::start();
    let p = server.test_project("shop");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/token_endpoint.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg("0")
        .env("RINGCAST_TOKEN_SECRET", &p.token_secret)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 examples/token_endpoint.py (needs PyJWT: pip install pyjwt)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the example's start line")
        .to_string();
    let get = |path: &str, user: Option<&str>| {
        let mut req = ureq::get(format!("{base}{path}"));
        if let Some(u) = user {
            req = req.header("Cookie", format!("session={u}"));
        }
        match req.call() {
            Ok(mut r) => (
                r.status().as_u16(),
                serde_json::from_str::<Value>(&r.body_mut().read_to_string().unwrap()).unwrap(),
            ),
            Err(ureq::Error::StatusCode(code)) => (code, Value::Null),
            Err(e) => panic!("{e}"),
        }
    };
    let (status, body) = get("/ringcast/token?channel=private-user-42", Some("42"));
    assert_eq!(status, 200, "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    assert_eq!(
        get("/ringcast/token?channel=private-user-7", Some("42")).0,
        403
    );
    assert_eq!(get("/ringcast/token?channel=private-user-42", None).0, 401);

    let mut ws = ws(&server, &p.public);
    subscribe(&mut ws, "sentinel");
    expect_subscribed(&mut ws, "private-user-42", &token);
    expect_message(&server, &mut ws, &p, "private-user-42");
    // User 42's token does not open user 7's channel.
    expect_forbidden(&mut ws, sub_frame("private-user-7", &token));
    expect_no_delivery(&server, &mut ws, &p, &["private-user-7"]);
    let _ = child.kill();
    let _ = child.wait();
}
