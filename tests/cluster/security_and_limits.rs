//! The rest of the `cluster` tests (one test binary, two files).

use super::*;

#[test]
fn cluster_mode_needs_the_master_key_file() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["project", "create", "x"][..],
        &["serve", "--listen", "127.0.0.1:0"],
    ] {
        let out = Command::new(common::bin())
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--redis", &redis.url()])
            .env_remove("RINGCAST_MASTER_KEY_FILE")
            .args(args)
            .output()
            .expect("run ringcast");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("master_key_file"), "{args:?}: {err}");
    }
    // A node with another master key refuses to start on the cluster's secrets.
    cli(&redis, &["project", "create", "x"]);
    let other = dir.path().join("other.key");
    std::fs::write(&other, "cd".repeat(32)).unwrap();
    let out = Command::new(common::bin())
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--redis", &redis.url()])
        .env("RINGCAST_MASTER_KEY_FILE", &other)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("run ringcast");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("master key"));
}

/// Issue 10, finding 7: `subscribed` is answered for a node's first subscriber of a
/// channel only once Redis confirmed the node's SUBSCRIBE, so a publish on another node
/// sent right after `subscribed` always arrives. Before, the answer went out before the
/// SUBSCRIBE reached Redis, and such publishes were lost.
#[test]
fn a_publish_on_another_node_right_after_subscribed_always_arrives() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let p = support::project_on(&redis, "window", "1000000/s", &[&a, &b]);
    const ROUNDS: usize = 1000;
    const PER_CONN: usize = 100; // the default max_subscriptions_per_connection
                                 // Every round subscribes to a fresh channel: the first subscriber on node b, so each
                                 // one waits for a Redis SUBSCRIBE.
    let mut conns: Vec<Ws> = (0..ROUNDS / PER_CONN).map(|_| b.ws(&p.public)).collect();
    let mut got = vec![false; ROUNDS];
    fn mark(got: &mut [bool], v: &Value) {
        assert_eq!(v["type"], "message", "{v}");
        let n = v["data"]["n"].as_u64().expect("n") as usize;
        assert!(!got[n], "message {n} twice");
        got[n] = true;
    }
    for i in 0..ROUNDS {
        let ws = &mut conns[i / PER_CONN];
        let channel = format!("w{i}");
        common::send_json(ws, json!({"type": "subscribe", "channel": channel}));
        loop {
            let v = next_json(ws);
            if v["type"] == "subscribed" {
                assert_eq!(v["channel"], channel.as_str());
                break;
            }
            mark(&mut got, &v);
        }
        assert_eq!(a.publish(&p.secret, &channel, json!({"n": i})).0, 202);
    }
    // Collect the rest; a message still missing after a quiet second is lost.
    for (c, ws) in conns.iter_mut().enumerate() {
        set_timeout(ws, Duration::from_secs(1));
        while !got[c * PER_CONN..(c + 1) * PER_CONN].iter().all(|g| *g) {
            match ws.read() {
                Ok(tungstenite::Message::Text(t)) => {
                    mark(&mut got, &serde_json::from_str(t.as_str()).unwrap())
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    let missed: Vec<usize> = (0..ROUNDS).filter(|i| !got[*i]).collect();
    assert!(
        missed.is_empty(),
        "{} of {ROUNDS} publishes after `subscribed` were missed (first: {:?})",
        missed.len(),
        &missed[..missed.len().min(10)]
    );
}

/// `project set-limits --max-connections` in cluster mode: stored in Redis, applied by
/// every node (issue 10, finding 3).
#[test]
fn set_limits_is_stored_in_redis_and_applied_by_the_nodes() {
    let Some(redis) = Redis::start() else { return };
    let a = Node::start(&redis);
    let p = support::project_on(&redis, "capped", "100/s", &[&a]);
    let out = cli(
        &redis,
        &["project", "set-limits", &p.id, "--max-connections", "1"],
    );
    assert_eq!(out["project"]["max_connections"], 1, "{out}");
    let _first = a.ws(&p.public);
    let url = format!("ws://{}/api/v1/ws?key={}", a.addr, p.public);
    wait_for("the limit to reach the node", || {
        matches!(tungstenite::connect(url.as_str()),
                 Err(tungstenite::Error::Http(r)) if r.status().as_u16() == 503)
    });
    let listed = cli(&redis, &["project", "list"]);
    assert_eq!(listed["projects"][0]["max_connections"], 1, "{listed}");
}

/// Issue 10, finding 6: a Redis writer cannot make browsers receive arbitrary bytes. A
/// payload in ringcast's own format (version, origin) carrying a close frame, a binary
/// frame, broken JSON or another channel's message is dropped by the receiving node;
/// the next real publish arrives as the subscriber's next frame. Before, the node
/// forwarded the frame bytes as they came.
#[test]
fn frames_injected_through_redis_are_dropped() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let p = support::project_on(&redis, "inject", "100000/s", &[&a, &b]);
    let mut on_b = b.ws_on(&p.public, "c");
    redis.wait_numsub(&p.id, "c", 1);
    let mut c = redis.conn().expect("redis");
    let frame = |first: u8, payload: &[u8]| {
        let mut f = vec![first, payload.len() as u8];
        f.extend_from_slice(payload);
        f
    };
    let other = br#"{"type":"message","channel":"d","event":"e","data":{},"id":"x"}"#;
    let injected: Vec<Vec<u8>> = vec![
        frame(0x88, b"\x03\xe8"),              // close 1000
        frame(0x82, b"\x00\x01"),              // binary
        frame(0x81, b"{\"type\":\"message\""), // broken JSON
        frame(0x81, other),                    // another channel's message
        frame(0x81, b"\"not an object\""),
    ];
    for f in &injected {
        let mut payload = vec![1u8];
        payload.extend_from_slice(&42u64.to_le_bytes()); // an origin that is no node
        payload.extend_from_slice(f);
        redis::cmd("PUBLISH")
            .arg(format!("ringcast:m:{}:c", p.id))
            .arg(payload)
            .query::<u64>(&mut c)
            .expect("PUBLISH");
    }
    assert_eq!(a.publish(&p.secret, "c", json!({"real": true})).0, 202);
    let v = next_json(&mut on_b);
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["data"], json!({"real": true}), "{v}");
}

/// A `redis-server` with TLS only (no plaintext port) and an ACL user, its CA in a PEM
/// file. `None` when redis-server is missing (and tools are optional).
struct TlsRedis {
    port: u16,
    ca: PathBuf,
    _dir: tempfile::TempDir,
    child: Child,
}

impl TlsRedis {
    fn start() -> Option<TlsRedis> {
        let probe = Redis::start()?; // checks that redis-server exists
        drop(probe);
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let path = |n: &str| dir.path().join(n);
        std::fs::write(path("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(path("cert.pem"), cert.pem()).unwrap();
        std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
        let port = support::spare_port();
        // ACL users are config-file lines (a command-line `--user` takes one word).
        std::fs::write(
            path("redis.conf"),
            "user ringcast on >s3cret ~* &* +@all\nuser default off\n",
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(path("redis.conf"))
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--tls-cert-file")
            .arg(path("cert.pem"))
            .arg("--tls-key-file")
            .arg(path("key.pem"))
            .arg("--tls-ca-cert-file")
            .arg(path("ca.pem"))
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server with TLS");
        let r = TlsRedis {
            port,
            ca: path("ca.pem"),
            _dir: dir,
            child,
        };
        wait_for("redis-server to listen on its TLS port", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Some(r)
    }

    fn url(&self, user: &str, password: &str) -> String {
        format!("rediss://{user}:{password}@127.0.0.1:{}/", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 10, finding 6: `rediss://` with an ACL user and `--redis-ca-file` works for the
/// CLI and for two nodes (cross-node delivery); a wrong password or no CA is refused.
#[test]
fn rediss_with_an_acl_user_and_a_ca_file() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let url = redis.url("ringcast", "s3cret");
    let ca = redis.ca.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    // Cluster mode needs one master key file for every node and the CLI.
    let master = dir.path().join("cluster-master.key");
    std::fs::write(&master, format!("{}\n", "ab".repeat(32))).unwrap();
    let run = |args: &[&str], url: &str, ca: Option<&str>| {
        let mut cmd = Command::new(common::bin());
        cmd.arg("--data-dir").arg(dir.path()).args(["--redis", url]);
        cmd.env("RINGCAST_MASTER_KEY_FILE", &master);
        if let Some(ca) = ca {
            cmd.args(["--redis-ca-file", ca]);
        }
        cmd.args(args).output().expect("run ringcast CLI")
    };
    let out = run(
        &["project", "create", "tls", "--rate-limit", "1000/s"],
        &url,
        Some(&ca),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (secret, public) = (
        v["secret_key"].as_str().unwrap(),
        v["public_key"].as_str().unwrap(),
    );
    // Refused: a wrong password; the system roots (which do not know this CA).
    let bad = run(
        &["project", "list"],
        &redis.url("ringcast", "wrong"),
        Some(&ca),
    );
    assert!(!bad.status.success());
    let no_ca = run(&["project", "list"], &url, None);
    assert!(!no_ca.status.success());

    let start = |_: ()| {
        let d = tempfile::tempdir().unwrap();
        let mut cmd = node_command(&d, &url, &master, 1);
        Node::launch(cmd.args(["--redis-ca-file", &ca]), d)
    };
    let a = start(());
    let b = start(());
    a.wait_key(secret);
    b.wait_key(secret);
    wait_health(&a, 200);
    wait_health(&b, 200);
    let mut on_b = b.ws(public);
    subscribe(&mut on_b, "news");
    assert_eq!(a.publish(secret, "news", json!({"over": "tls"})).0, 202);
    assert_eq!(next_message(&mut on_b), json!({"over": "tls"}));
}

/// Pusher app ids in cluster mode: numbered from 1000000 by Redis's counter. Projects
/// stored before app ids existed are numbered, oldest first, by the next process that
/// opens the store; one a running node finds without a number (an older CLI made it) is
/// numbered by that node's reload. No number is handed out twice. `--pusher off` is
/// stored in Redis like `--client-events`.
#[test]
fn pusher_app_ids_are_numbered_in_redis_and_never_reused() {
    let Some(redis) = Redis::start() else { return };
    let a = project(&redis, "a", "10/s");
    let b = project(&redis, "b", "10/s");
    let app_ids = || -> Vec<String> {
        cli(&redis, &["project", "list"])["projects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pusher_app_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(app_ids(), ["1000000", "1000001"]);

    // A Redis written before app ids: neither the hash nor the counter.
    let mut c = redis.conn().expect("redis");
    redis::cmd("DEL")
        .arg("ringcast:pusher_app_ids")
        .arg("ringcast:pusher_app_seq")
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(app_ids(), ["1000000", "1000001"], "creation order");
    let v = cli(&redis, &["project", "create", "c"]);
    assert_eq!(v["project"]["pusher_app_id"], "1000002", "{v}");
    assert_eq!(v["project"]["pusher"], "on", "{v}");

    let v = cli(&redis, &["project", "set-limits", &b.id, "--pusher", "off"]);
    assert_eq!(v["project"]["pusher"], "off", "{v}");
    let listed = cli(&redis, &["project", "list"]);
    assert_eq!(listed["projects"][1]["pusher"], "off", "{listed}");
    assert_eq!(listed["projects"][0]["pusher"], "on", "{listed}");

    let node = Node::start(&redis);
    node.wait_key(&a.secret);
    let numbered = |c: &mut redis::Connection| -> Option<u64> {
        redis::cmd("HGET")
            .arg("ringcast:pusher_app_ids")
            .arg(&a.id)
            .query(c)
            .unwrap()
    };
    redis::pipe()
        .atomic()
        .hdel("ringcast:pusher_app_ids", &a.id)
        .incr("ringcast:version", 1)
        .query::<()>(&mut c)
        .unwrap();
    wait_for("the node to number the project", || {
        numbered(&mut c).is_some()
    });
    assert_eq!(
        numbered(&mut c),
        Some(1_000_003),
        "a new number, never 1000000 again"
    );
    assert_eq!(app_ids(), ["1000003", "1000001", "1000002"]);
    // The node still serves the project under its keys.
    assert_eq!(node.publish(&a.secret, "x", json!("y")).0, 202);
}

/// `socket_id` across nodes: a publish on node a naming a connection of node b leaves
/// exactly that one out (the relay carries it); the Pusher client on b gets the message
/// in Pusher's form when it is not the one named.
#[test]
fn a_socket_id_of_another_node_is_left_out_there() {
    let Some((redis, a, b)) = support::two_nodes() else {
        return;
    };
    let p = support::project_on(&redis, "toothers", "100000/s", &[&a, &b]);
    let pusher = |node: &Node| {
        let url = format!("ws://{}/app/{}?protocol=7", node.addr, p.public);
        let (mut ws, _) = tungstenite::connect(url).expect("ws connect");
        set_timeout(&mut ws, Duration::from_secs(10));
        let hello = next_json(&mut ws);
        let data: Value = serde_json::from_str(hello["data"].as_str().unwrap()).unwrap();
        let id = data["socket_id"].as_str().unwrap().to_string();
        common::send_json(
            &mut ws,
            json!({"event": "pusher:subscribe", "data": {"channel": "chat"}}),
        );
        assert_eq!(
            next_json(&mut ws)["event"],
            "pusher_internal:subscription_succeeded"
        );
        (ws, id)
    };
    let (mut left_out, id) = pusher(&b);
    let (mut other, _) = pusher(&b);
    let mut native = b.ws_on(&p.public, "chat");
    redis.wait_numsub(&p.id, "chat", 1);
    let body =
        json!({"channel": "chat", "event": "said", "data": {"n": 1}, "socket_id": id}).to_string();
    let req = format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {}\r\nContent-Type: application/json\r\n\r\n{body}",
        body.len(),
        p.secret
    );
    assert_eq!(parse_response(&a.raw(req.as_bytes())).0, 202);
    let got = next_json(&mut other);
    assert_eq!(got["event"], "said", "{got}");
    assert_eq!(got["data"], "{\"n\":1}");
    assert_eq!(next_message(&mut native), json!({"n": 1}));
    expect_silence(&mut left_out, Duration::from_millis(500));
}
