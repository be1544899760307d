//! Unit tests of the configuration: defaults, TOML, validation.
use super::*;

/// Loading `args` fails with an error that names `key`.
#[track_caller]
fn assert_refused(args: &ServeArgs, key: &str) {
    let err = Config::load_sourced(args, Path::new("./d"), None, None).unwrap_err();
    assert!(err.to_string().contains(key), "{key}: {err}");
}

#[test]
fn defaults_are_valid() {
    Config::default().validate().unwrap();
}

#[test]
fn file_overrides_defaults_and_rejects_unknown_keys() {
    let cfg = Config::from_toml("max_body_bytes = 1024\nheartbeat_s = 5\n").unwrap();
    assert_eq!(cfg.max_body_bytes, 1024);
    assert_eq!(cfg.heartbeat_s, 5);
    assert_eq!(cfg.max_headers, 64);
    assert!(Config::from_toml("max_bdy_bytes = 1").is_err());
}

fn file_error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    Config::from_file(&path).unwrap_err().to_string()
}

#[test]
fn file_errors_are_one_line_naming_key_value_and_allowed() {
    let e = file_error("max_bdy_bytes = 12\n");
    assert!(e.contains("unknown key `max_bdy_bytes` (= 12)"), "{e}");
    assert!(e.contains("known keys: listen,"), "{e}");
    let e = file_error("heartbeat_s = \"soon\"\n");
    assert!(e.contains("`heartbeat_s` = \"soon\" is not valid"), "{e}");
    let e = file_error("log_format = \"xml\"\n");
    assert!(e.contains("`log_format` = \"xml\""), "{e}");
    assert!(e.contains("text") && e.contains("json"), "{e}");
    for e in [e, file_error("listen = \"nowhere\"\n")] {
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn validation_names_key_value_and_allowed() {
    let cfg = Config {
        mailbox_high_water_pct: 120,
        ..Config::default()
    };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("mailbox_high_water_pct = 120"), "{e}");
    assert!(e.contains("1 to 100"), "{e}");
    let cfg = Config {
        log_level: "info,=[".into(),
        ..Config::default()
    };
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("log_level"));
}

#[test]
fn redis_passwords_are_redacted() {
    assert_eq!(
        redact_url("redis://:hunter2@10.0.0.5:6379/0"),
        "redis://:***@10.0.0.5:6379/0"
    );
    assert_eq!(
        redact_url("rediss://app:hunter2@h:6380"),
        "rediss://app:***@h:6380"
    );
    assert_eq!(redact_url("redis://tok@h/"), "redis://***@h/");
    assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
    // Passwords in the query (issue 20, finding 12): redis-rs reads `pass` on unix
    // sockets; other names and forms are redacted as well.
    assert_eq!(
        redact_url("redis+unix:///run/redis.sock?db=2&pass=hunter2"),
        "redis+unix:///run/redis.sock?db=2&pass=***"
    );
    assert_eq!(
        redact_url("unix:///run/redis.sock?pass=hunter2&user=app"),
        "unix:///run/redis.sock?pass=***&user=app"
    );
    assert_eq!(
        redact_url("redis://h:6379?Password=hunter2"),
        "redis://h:6379?Password=***"
    );
    assert_eq!(
        redact_url("rediss://app:pw1@h:6380/0?protocol=resp3&password=pw2#x"),
        "rediss://app:***@h:6380/0?protocol=resp3&password=***#x"
    );
    assert_eq!(
        redact_url("redis://:pa?ss@h/?db=1"),
        "redis://:***@h/?db=1",
        "a ? inside the password"
    );
    assert_eq!(
        redact_url("redis+unix:///r.sock?db=1&passenger=x"),
        "redis+unix:///r.sock?db=1&passenger=x"
    );
    for url in [
        "redis+unix:///run/redis.sock?db=2&pass=hunter2",
        "redis://h?password=hunter2",
        "rediss://:hunter2@h?pass=hunter2",
    ] {
        assert!(!redact_url(url).contains("hunter2"), "{url}");
    }
}

#[test]
fn limit_flags_and_env_override_the_file_with_their_source() {
    let mut args = ServeArgs::default();
    args.limits.subscribe_rate_per_connection = Some("7".into());
    args.limits.webhook_allow_private_addresses = Some("true".into());
    args.sources.insert("subscribe_rate_per_connection", "env");
    args.sources
        .insert("webhook_allow_private_addresses", "flag");
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert_eq!(loaded.config.subscribe_rate_per_connection, 7);
    assert!(loaded.config.webhook_allow_private_addresses);
    let shown = loaded.show();
    assert_eq!(shown["subscribe_rate_per_connection"]["source"], "env");
    assert_eq!(shown["webhook_allow_private_addresses"]["source"], "flag");
    assert_eq!(shown["max_pending_answer_bytes"]["value"], 262144);

    args.limits.max_pending_answer_bytes = Some("lots".into());
    assert_refused(&args, "max_pending_answer_bytes");
    args.limits.max_pending_answer_bytes = Some("0".into());
    assert_refused(&args, "max_pending_answer_bytes");
}

#[test]
fn zero_limits_are_rejected() {
    let cfg = Config {
        max_body_bytes: 0,
        ..Config::default()
    };
    assert!(cfg.validate().is_err());
    let cfg = Config::from_toml("max_fragments_per_message = 0\n").unwrap();
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("max_fragments_per_message"), "{err}");
}

#[test]
fn limits_kept_in_u32_stop_at_4_gib() {
    let cfg = Config::from_toml("max_frame_bytes = 4294967296\n").unwrap();
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("max_frame_bytes"), "{err}");
    let cfg = Config::from_toml("send_backlog_bytes = 4294967296\n").unwrap();
    assert!(cfg.validate().is_err());
    Config::from_toml("send_backlog_bytes = 4294967295\n")
        .unwrap()
        .validate()
        .unwrap();
}

#[test]
fn fragment_cap_defaults_to_64() {
    assert_eq!(Config::default().max_fragments_per_message, 64);
    let cfg = Config::from_toml("max_fragments_per_message = 1000\n").unwrap();
    assert_eq!(cfg.max_fragments_per_message, 1000);
    cfg.validate().unwrap();
}

#[test]
fn admission_keys_by_file_env_and_flag_with_their_checks() {
    let cfg = Config::from_toml(
        "max_upgrades_per_second = 50\ndrain_spread_s = 2\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n",
    )
    .unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.max_upgrades_per_second, 50);
    assert_eq!(cfg.drain_spread_s, 2);
    assert_eq!(cfg.trusted_proxies, ["10.0.0.0/8", "::1"]);
    let d = Config::default();
    assert_eq!(d.max_upgrades_per_second, DEFAULT_MAX_UPGRADES_PER_SECOND);
    assert_eq!(d.drain_spread_s, 5);
    assert!(d.trusted_proxies.is_empty());

    let mut args = ServeArgs::default();
    // An environment variable or a flag gives the list as comma-separated text.
    args.limits.trusted_proxies = Some("10.1.0.0/16, 192.168.0.1".into());
    args.limits.max_upgrades_per_second = Some("0".into());
    args.limits.drain_spread_s = Some("1".into());
    args.sources.insert("trusted_proxies", "env");
    args.sources.insert("max_upgrades_per_second", "flag");
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert_eq!(
        loaded.config.trusted_proxies,
        ["10.1.0.0/16", "192.168.0.1"]
    );
    assert_eq!(loaded.config.max_upgrades_per_second, 0);
    assert_eq!(loaded.config.drain_spread_s, 1);
    let shown = loaded.show();
    assert_eq!(shown["trusted_proxies"]["source"], "env");
    assert_eq!(shown["max_upgrades_per_second"]["source"], "flag");
    assert_eq!(shown["drain_spread_s"]["value"], 1);

    for (key, value) in [
        ("trusted_proxies", "10.0.0.0/33"),
        ("trusted_proxies", "proxy.example"),
        ("drain_spread_s", "601"),
        ("max_upgrades_per_second", "10000001"),
        ("max_upgrades_per_second", "-1"),
    ] {
        let mut args = ServeArgs::default();
        match key {
            "trusted_proxies" => args.limits.trusted_proxies = Some(value.into()),
            "drain_spread_s" => args.limits.drain_spread_s = Some(value.into()),
            _ => args.limits.max_upgrades_per_second = Some(value.into()),
        }
        assert_refused(&args, key);
    }
}

#[test]
fn ws_compression_keys_default_override_and_validate() {
    let mut args = ServeArgs::default();
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert!(loaded.config.ws_compression.is_on());
    assert_eq!(loaded.config.ws_compression_min_bytes, 512);
    let shown = loaded.show();
    assert_eq!(shown["ws_compression"]["value"], "on");
    assert_eq!(shown["ws_compression_min_bytes"]["value"], 512);

    args.limits.ws_compression = Some("off".into());
    args.limits.ws_compression_min_bytes = Some("0".into());
    args.sources.insert("ws_compression", "env");
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert!(!loaded.config.ws_compression.is_on());
    assert_eq!(loaded.config.ws_compression_min_bytes, 0);
    assert_eq!(loaded.show()["ws_compression"]["source"], "env");

    args.limits.ws_compression = Some("maybe".into());
    assert_refused(&args, "ws_compression");
    args.limits.ws_compression = Some("on".into());
    args.limits.ws_compression_min_bytes = Some("16777217".into());
    assert_refused(&args, "ws_compression_min_bytes");
}

#[test]
fn replay_cache_bytes_defaults_overrides_and_validates() {
    let mut args = ServeArgs::default();
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert_eq!(loaded.config.replay_cache_bytes, 8 << 20);
    assert_eq!(loaded.show()["replay_cache_bytes"]["value"], 8 << 20);
    args.limits.replay_cache_bytes = Some("0".into());
    args.sources.insert("replay_cache_bytes", "env");
    let loaded = Config::load_sourced(&args, Path::new("./d"), None, None).unwrap();
    assert_eq!(loaded.config.replay_cache_bytes, 0);
    assert_eq!(loaded.show()["replay_cache_bytes"]["source"], "env");
    args.limits.replay_cache_bytes = Some("1073741825".into());
    assert_refused(&args, "replay_cache_bytes");
}
