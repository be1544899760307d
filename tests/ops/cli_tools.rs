//! The rest of the `ops` tests (one test binary, two files).

use super::*;

#[test]
fn config_show_names_each_values_source_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ringcast.toml");
    std::fs::write(
        &file,
        "max_body_bytes = 1024\nlisten = \"127.0.0.1:9000\"\nworkers = 7\nlog_level = \"debug\"\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let v = config_show(
        &[
            "--redis",
            "redis://:hunter2@10.0.0.5:6379/0",
            "config",
            "show",
            "--config",
            file,
            "--workers",
            "3",
        ],
        &[
            ("RINGCAST_METRICS_LISTEN", "127.0.0.1:9100"),
            // Cluster mode needs a master key file (issue 14); config show names it.
            ("RINGCAST_MASTER_KEY_FILE", "cluster-master.key"),
        ],
    );
    let check = |key: &str, value: Value, source: &str| {
        assert_eq!(v[key]["value"], value, "{key}: {v}");
        assert_eq!(v[key]["source"], source, "{key}: {v}");
    };
    check("max_body_bytes", json!(1024), "file");
    check("listen", json!("127.0.0.1:9000"), "file");
    check("log_level", json!("debug"), "file");
    check("workers", json!(3), "flag");
    check("metrics_listen", json!("127.0.0.1:9100"), "env");
    check("redis", json!("redis://:***@10.0.0.5:6379/0"), "flag");
    check("master_key_file", json!("cluster-master.key"), "env");
    check("heartbeat_s", json!(25), "default");
    check("log_format", json!("text"), "default");
    assert!(!v.to_string().contains("hunter2"));
    // A password in the query (issue 20, finding 12): redis-rs reads `pass` on a unix
    // socket URL.
    let v = config_show(
        &[
            "--redis",
            "redis+unix:///run/redis.sock?db=2&pass=hunter2",
            "config",
            "show",
        ],
        &[("RINGCAST_MASTER_KEY_FILE", "cluster-master.key")],
    );
    assert_eq!(
        v["redis"]["value"], "redis+unix:///run/redis.sock?db=2&pass=***",
        "{v}"
    );
    assert!(!v.to_string().contains("hunter2"));

    // The environment against a flag: the flag is what the user typed on this run.
    let v = config_show(
        &["config", "show", "--listen", "127.0.0.1:9001"],
        &[("RINGCAST_LISTEN", "127.0.0.1:9002")],
    );
    assert_eq!(v["listen"]["value"], "127.0.0.1:9001");
    assert_eq!(v["listen"]["source"], "flag");
    let v = config_show(
        &["config", "show"],
        &[("RINGCAST_LISTEN", "127.0.0.1:9002")],
    );
    assert_eq!(v["listen"]["source"], "env");
    let v = config_show(&["config", "show", "--log-format", "json"], &[]);
    assert_eq!(v["log_format"]["value"], "json");
    assert_eq!(v["log_format"]["source"], "flag");
}

/// `ringcast serve` that must not start: its stderr.
fn refused(args: &[&str], config: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, config).unwrap();
    let out = Command::new(bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn bad_configuration_is_refused_in_one_line_naming_key_value_and_allowed() {
    let e = refused(&[], "max_bdy_bytes = 12\n", &[]);
    assert!(e.contains("unknown key `max_bdy_bytes` (= 12)"), "{e}");
    assert!(e.contains("max_body_bytes"), "lists the known keys: {e}");
    let e = refused(&[], "heartbeat_s = \"soon\"\n", &[]);
    assert!(e.contains("`heartbeat_s` = \"soon\" is not valid"), "{e}");
    let e = refused(&[], "mailbox_high_water_pct = 0\n", &[]);
    assert!(
        e.contains("mailbox_high_water_pct = 0") && e.contains("1 to 100"),
        "{e}"
    );
    let e = refused(&[], "log_format = \"xml\"\n", &[]);
    assert!(
        e.contains("log_format") && e.contains("xml") && e.contains("json"),
        "{e}"
    );
    let e = refused(&[], "tls_cert = \"c.pem\"\n", &[]);
    assert!(e.contains("tls_cert") && e.contains("together"), "{e}");
    let e = refused(&["--tls-cert", "c.pem"], "", &[]);
    assert!(e.contains("--tls-key"), "{e}");
    let e = refused(&[], "", &[("RINGCAST_METRICS_LISTEN", "nowhere")]);
    assert!(e.contains("nowhere") && e.contains("metrics-listen"), "{e}");
    let e = refused(&["--log-format", "xml"], "", &[]);
    assert!(e.contains("xml") && e.contains("text, json"), "{e}");
}

/// `ringcast subscribe` as a child process, its stdout read line by line.
struct Subscriber {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

fn spawn_subscriber(args: &[&str], key: &str) -> Subscriber {
    let mut child = Command::new(bin())
        .arg("subscribe")
        .args(args)
        .env("RINGCAST_KEY", key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Subscriber { child, lines }
}

fn run_publish(args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .arg("publish")
        .args(args)
        .env_remove("RINGCAST_KEY")
        .output()
        .unwrap()
}

fn round_trip(s: &Server, extra: &[&str]) {
    let p = s.project("cli", "100000/s");
    let base = s.url("");
    let mut args = vec!["--url", base.as_str(), "--count", "3"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["news", "sport"]);
    let mut sub = spawn_subscriber(&args, &p.public);
    wait_for(
        Duration::from_secs(5),
        "the CLI subscriber's 2 subscriptions",
        || sample(&s.scrape(), "ringcast_subscriptions") == 2.0,
    );
    let publish = |channel: &str, data: &str| {
        let mut a = vec!["--url", base.as_str(), "--key", p.secret.as_str()];
        a.extend_from_slice(extra);
        a.extend_from_slice(&[channel, "e", data]);
        run_publish(&a)
    };
    let out = publish(
        "news",
        "{\"n\": 1,\n \"big\": 123456789012345678901234567890}",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    assert!(publish("sport", "\"two\"").status.success());
    assert!(publish("elsewhere", "{}").status.success());
    assert!(
        publish("news", "[3]").status.code() == Some(1),
        "an array is a 400"
    );
    assert!(publish("news", "{\"n\":3}").status.success());
    let got: Vec<String> = (0..3)
        .map(|_| sub.lines.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    assert_eq!(
        got[0],
        format!(
            "{{\"type\":\"message\",\"channel\":\"news\",\"event\":\"e\",\"data\":{{\"n\":1,\"big\":123456789012345678901234567890}},\"id\":\"{id}\"}}"
        )
    );
    let second: Value = serde_json::from_str(&got[1]).unwrap();
    assert_eq!(
        (second["channel"].clone(), second["data"].clone()),
        (json!("sport"), json!("two"))
    );
    let third: Value = serde_json::from_str(&got[2]).unwrap();
    assert_eq!(third["data"]["n"], 3);
    assert!(exit_within(&mut sub.child, Duration::from_secs(5)).success());

    // A refused publish: exit 1, the status and body on stderr, nothing on stdout.
    let mut a = vec!["--url", base.as_str(), "--key", "sk_nope"];
    a.extend_from_slice(extra);
    a.extend_from_slice(&["news", "e", "{}"]);
    let out = run_publish(&a);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("HTTP 401") && err.contains("unauthorized"),
        "{err}"
    );
}

#[test]
fn cli_publish_and_subscribe_round_trip() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    round_trip(&s, &[]);

    // SIGINT ends `subscribe` with 0; a missing key is a one-line error.
    let p = s.project("int", "100/s");
    let base = s.url("");
    let mut sub = spawn_subscriber(&["--url", &base, "c"], &p.public);
    wait_for(Duration::from_secs(5), "the subscription", || {
        sample(&s.scrape(), "ringcast_subscriptions") == 1.0
    });
    let _ = Command::new("kill")
        .args(["-INT", &sub.child.id().to_string()])
        .status();
    assert!(exit_within(&mut sub.child, Duration::from_secs(5)).success());
    let out = run_publish(&["--url", &base, "c", "e", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RINGCAST_KEY"));
    // A revoked public key: subscribe fails with the server's 401.
    cli(&s.data_dir, &["key", "revoke", &p.public]);
    s.wait_key_refused(&p.public);
    let out = Command::new(bin())
        .args(["subscribe", "--url", &base, "--key", &p.public, "c"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 401"));
}

/// One plain HTTP answer per connection from a thread, each request head kept.
fn answering(answer: String) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            // Kept before answering, so it is there once the client has its answer.
            if tx
                .send(String::from_utf8_lossy(&head).into_owned())
                .is_err()
            {
                return;
            }
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (addr, rx)
}

/// Issue 20, finding 12: `ringcast publish` does not follow a redirect (it would carry
/// `X-Api-Key` to whatever host the answer names); it reports it and exits 1.
#[test]
fn cli_publish_follows_no_redirect_and_sends_the_key_nowhere_else() {
    let ok = "HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    let (elsewhere, elsewhere_got) = answering(ok.to_string());
    let key = "sk_redirecttestkey0000000000000000";
    // 301/302/303 turn the POST into a GET (and were followed with the key before the
    // fix); 307/308 would resend the POST.
    for status in [301, 302, 303, 307, 308] {
        let redirect = format!(
            "HTTP/1.1 {status} Moved\r\nLocation: http://{elsewhere}/api/v1/publish\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (redirector, redirector_got) = answering(redirect);
        let out = run_publish(&[
            "--url",
            &format!("http://{redirector}"),
            "--key",
            key,
            "c",
            "e",
            "{}",
        ]);
        let first = redirector_got.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(first.contains(key), "the key went to --url: {first}");
        // The command has exited: a followed redirect would have reached `elsewhere`.
        let followed = elsewhere_got.try_recv().ok();
        assert!(
            followed.is_none(),
            "{status}: the redirect was followed, the request: {followed:?}"
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&status.to_string()) && err.contains("not followed") && !err.contains(key),
            "{err}"
        );
    }
}

#[test]
fn cli_publish_and_subscribe_over_tls_with_a_private_ca() {
    let files = TlsFiles::generate();
    let s = Server::start_tls(
        Options {
            config: METRICS.into(),
            ..Options::default()
        },
        &files,
    );
    let ca = files.cert.to_str().unwrap().to_string();
    round_trip(&s, &["--ca-file", &ca]);

    // Without the CA the certificate is not trusted: both refuse to talk.
    let p = s.project("untrusted", "100/s");
    let base = s.url("");
    let out = run_publish(&["--url", &base, "--key", &p.secret, "c", "e", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    let out = Command::new(bin())
        .args(["subscribe", "--url", &base, "--key", &p.public, "c"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

#[test]
fn every_dashboard_query_names_an_exported_metric() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/ringcast.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => collect(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");

    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let text = s.scrape_text();
    let families: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let mut named = 0;
    for expr in &exprs {
        let mut rest = expr.as_str();
        let mut found = false;
        while let Some(i) = rest.find("ringcast_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = name.strip_suffix(suffix)?;
                    (families.get(base) == Some(&"histogram")).then_some(base)
                })
                .unwrap_or(&name);
            assert!(
                families.contains_key(family),
                "dashboard query names {name}, which the server does not export: {expr}"
            );
            found = true;
            named += 1;
        }
        assert!(found, "a query without a ringcast metric: {expr}");
    }
    // Every metric the contract names is on the dashboard.
    for required in [
        "ringcast_connections",
        "ringcast_subscriptions",
        "ringcast_publish_requests_total",
        "ringcast_messages_published_total",
        "ringcast_deliveries_total",
        "ringcast_bytes_sent_total",
        "ringcast_slow_consumer_closes_total",
        "ringcast_mailbox_depth",
        "ringcast_publish_duration_seconds_bucket",
        "ringcast_cluster_connected",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(required)),
            "{required} is not on the dashboard"
        );
    }
    assert!(named > exprs.len());
}

#[test]
fn quota_units_batches_and_replays_are_counted() {
    let s = Server::start_with(Options {
        config: METRICS.into(),
        ..Options::default()
    });
    let v = cli(
        &s.data_dir,
        &[
            "project",
            "create",
            "units",
            "--rate-limit",
            "100000/s",
            "--history",
            "100/600s",
        ],
    );
    let secret = v["secret_key"].as_str().unwrap().to_string();
    let public = v["public_key"].as_str().unwrap().to_string();
    s.wait_key(&secret);
    let mut ws = s.ws_on(&public, "a");
    subscribe(&mut ws, "b");
    let before = s.scrape();

    // One message to two channels: 2 units, 2 deliveries to this one subscriber.
    let body = json!({"channels": ["a", "b"], "event": "e", "data": {"n": 0}});
    let (st, _, _) = s.raw_publish(&secret, "application/json", body.to_string().as_bytes());
    assert_eq!(st, 202);
    // A batch of three messages (a, b, a): 3 units, 3 deliveries.
    let batch = json!({"messages": [
        {"channel": "a", "event": "e", "data": {"n": 1}},
        {"channel": "b", "event": "e", "data": {"n": 2}},
        {"channel": "a", "event": "e", "data": {"n": 3}},
    ]});
    let req = format!(
        "POST /api/v1/publish/batch HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\nX-Api-Key: {secret}\r\nContent-Type: application/json\r\n\r\n{batch}",
        batch.to_string().len()
    );
    assert_eq!(parse_response(&s.raw(req.as_bytes())).0, 202);
    for _ in 0..5 {
        assert_eq!(next_json(&mut ws)["type"], "message");
    }

    // A second client recovers channel "a" from offset 0: its 3 kept messages replayed.
    let mut late = s.ws(&public);
    send_json(
        &mut late,
        json!({"type": "subscribe", "channel": "a", "since": {"offset": 0, "epoch": "x"}}),
    );
    let reply = next_json(&mut late);
    assert_eq!(reply["type"], "subscribed");
    let epoch = reply["epoch"].as_str().unwrap().to_string();
    send_json(&mut late, json!({"type": "unsubscribe", "channel": "a"}));
    assert_eq!(next_json(&mut late)["type"], "unsubscribed");
    send_json(
        &mut late,
        json!({"type": "subscribe", "channel": "a", "since": {"offset": 0, "epoch": epoch}}),
    );
    let reply = next_json(&mut late);
    assert_eq!(reply["recovered"], true, "{reply}");
    for _ in 0..3 {
        assert_eq!(next_json(&mut late)["type"], "message");
    }

    // A worker counts its deliveries just after writing them: the scrape waits for them.
    let want = sample(&before, "ringcast_deliveries_total") + 8.0;
    let after = s.scrape_when(|m| sample(m, "ringcast_deliveries_total") == want);
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(requests(&after, 202) - requests(&before, 202), 2.0);
    assert_eq!(delta("ringcast_messages_published_total"), 5.0);
    assert_eq!(delta("ringcast_deliveries_total"), 5.0 + 3.0);
    assert_eq!(delta("ringcast_publish_duration_seconds_count"), 2.0);
}
