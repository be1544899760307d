//! Every knob of the server: its default, its unit, and where it comes from.
//!
//! Precedence, lowest to highest: built-in defaults, the TOML file (`--config`), the
//! environment (`RINGCAST_LISTEN`, `RINGCAST_DATA_DIR`, `RINGCAST_REDIS_URL`,
//! `RINGCAST_METRICS_LISTEN`, read by clap), then command-line flags. [`Config::validate`]
//! rejects values that would make a limit meaningless (a zero body limit, a mailbox of
//! zero) before anything listens. Unknown keys in the file are an error, so a typo never
//! silently becomes a default.
//!
//! Every refusal is one line naming the key, the value given and what is allowed.
//! [`Loaded::show`] is `ringcast config show`: each effective value with its source
//! (`default`, `file`, `env`, `flag`), the Redis password redacted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cli::{Cli, LogFormat, ServeArgs};

/// Failure to build a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {}", one_line(source.message()))]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("config file {path}: unknown key `{key}` (= {value}); known keys: {known}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        value: String,
        known: String,
    },
    #[error("config file {path}: `{key}` = {value} is not valid: {why}")]
    BadValue {
        path: PathBuf,
        key: String,
        value: String,
        why: String,
    },
}

/// The server's configuration. Field docs state default and unit; docs/configuration.md's
/// configuration table mirrors them.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listen address. Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Worker threads (one per core, pinned). Default: available cores. 0 = default.
    pub workers: usize,
    /// Data directory of the embedded database. Default `./ringcast-data`.
    pub data_dir: PathBuf,
    /// Redis URL for cluster mode. Default: none (single node).
    pub redis: Option<String>,
    /// CA certificate PEM for `rediss://` (flag `--redis-ca-file`, env
    /// `RINGCAST_REDIS_CA_FILE`). Default: none (the system's roots).
    pub redis_ca_file: Option<PathBuf>,
    /// TLS certificate chain (PEM). Default: none (plaintext).
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM). Default: none.
    pub tls_key: Option<PathBuf>,
    /// Largest accepted publish body, bytes. Default 65536 (64 KiB). Over: 413.
    pub max_body_bytes: usize,
    /// Most messages in one `POST /api/v1/publish/batch`. Default 100. Over: 400.
    pub max_batch_messages: usize,
    /// Largest batch publish body, bytes. Default 1048576 (1 MiB). Over: 413. Each
    /// message of a batch also obeys `max_body_bytes`.
    pub max_batch_body_bytes: usize,
    /// Largest request head (request line + headers), bytes. Default 16384. Over: 431.
    pub max_header_bytes: usize,
    /// Most headers in one request. Default 64, at most 128. Over: 431.
    pub max_headers: usize,
    /// Time allowed to receive a whole request (head and body) once its first byte
    /// arrived, milliseconds. Default 10000. Over: 408, then the connection is closed.
    /// The TLS handshake gets the same time.
    pub header_read_timeout_ms: u64,
    /// Idle keep-alive HTTP connection lifetime, seconds. Default 60.
    pub http_idle_timeout_s: u64,
    /// Largest WebSocket message a client may send (after reassembly), bytes.
    /// Default 16384. Over: close 1009.
    pub max_frame_bytes: usize,
    /// Most frames one client WebSocket message may arrive in (the first frame and its
    /// continuations, empty ones included), count. Default 64. Over: close 1009.
    pub max_fragments_per_message: usize,
    /// Most channels one WebSocket connection may be subscribed to. Default 100.
    /// Over: an error frame `too_many_subscriptions`, the connection stays open.
    pub max_subscriptions_per_connection: usize,
    /// Most distinct users (members) one presence channel holds. Default 100. Over: the
    /// subscribe of another user gets an error frame `presence_full`.
    pub max_presence_members: usize,
    /// Unsent bytes queued for one WebSocket connection before it is closed with 4008.
    /// Default 1048576 (1 MiB).
    pub send_backlog_bytes: usize,
    /// Write coalescing window per WebSocket connection, milliseconds. A connection
    /// written to less than this long ago waits for the window to pass, so frames
    /// published in quick succession leave in one write. Connections that receive less
    /// than one message per window are never delayed. Default 3. 0 = write at once.
    pub write_coalesce_ms: u64,
    /// Most open connections (HTTP and WebSocket) per worker. Default 25000.
    /// Over: HTTP 503 and the connection is closed.
    pub max_connections_per_worker: usize,
    /// Most WebSocket connections per project on this node. Default 100000; 0 =
    /// unlimited. A project's own value (`project set-limits --max-connections`) wins.
    /// Over: the upgrade is refused with 503.
    pub max_ws_connections_per_project: usize,
    /// Back-pressure: while more than this many bytes wait in a WebSocket's queue, the
    /// server handles no more frames from that client (its replies cannot pile up).
    /// Default 65536 (64 KiB); at most half of `send_backlog_bytes` takes effect.
    pub ws_read_pause_bytes: usize,
    /// Bytes all WebSocket queues of one worker may hold together: each connection's
    /// own frames in full plus 64 per queued broadcast (shared by its subscribers).
    /// Over it the largest queues are closed with 4008 first. Default 268435456
    /// (256 MiB).
    pub worker_send_budget_bytes: usize,
    /// Most subscriptions one worker holds (all its connections). Default 500000. Over:
    /// an error frame `too_many_subscriptions`, the connection stays open.
    pub max_subscriptions_per_worker: usize,
    /// New WebSocket connections per second per client address, for the whole node.
    /// Default 0 (off: behind a load balancer every client shares one address). Over:
    /// 429 `rate_limited` with `Retry-After: 1`.
    pub ws_connect_rate_per_ip: u32,
    /// Messages each worker's mailbox holds before publishes get 503. Default 8192.
    pub mailbox_capacity: usize,
    /// Mailbox fill ratio above which `/health` reports degraded, percent. Default 75.
    pub mailbox_high_water_pct: u8,
    /// Heartbeat period announced to clients and used for server pings, seconds.
    /// Default 25. A client silent for 3 periods is closed.
    pub heartbeat_s: u64,
    /// How often the key watcher checks the database for changes, milliseconds.
    /// Default 250 (changes apply within 1 s).
    pub key_refresh_ms: u64,
    /// Quota of projects created without `--rate-limit`. Default `100/s`.
    pub default_rate_limit: String,
    /// Time allowed for graceful shutdown, milliseconds. Default 4000.
    pub shutdown_grace_ms: u64,
    /// Bytes of channel history this node keeps across all channels of all projects.
    /// Default 67108864 (64 MiB). Each project's share is this divided by the projects
    /// holding history on the node; over the budget, the oldest entries of the largest
    /// channels of the project furthest over its share are dropped first.
    pub history_max_bytes: usize,
    /// Serve the live console page at `GET /console`. Default false; `serve --dev`
    /// turns it on. Off: 404.
    pub console: bool,
    /// Address of the Prometheus metrics listener (`GET /metrics`). Default: none (off).
    pub metrics_listen: Option<SocketAddr>,
    /// Log line format on stderr: `text` or `json`. Default `text`.
    pub log_format: LogFormat,
    /// Log filter when `RUST_LOG` is not set (tracing's env-filter syntax, e.g. `info`
    /// or `warn,ringcast=debug`). Default `info`.
    pub log_level: String,
    /// Webhook events waiting to be sent, per project (and in the hand-over queue from
    /// the workers to the webhook sender). Default 10000. Over it an event is dropped,
    /// counted in `ringcast_webhook_events_dropped_total` and logged.
    pub webhook_queue_events: usize,
    /// File holding the master key that seals token secrets (64 hex characters).
    /// Default: none, meaning `<data_dir>/master.key`, created with mode 0600 on first
    /// start (embedded store). Required in cluster mode: the same file on every node.
    pub master_key_file: Option<PathBuf>,
    /// Subscribes and token refreshes per connection per second: a token bucket of
    /// burst `max_subscriptions_per_connection`. Over: an error frame `rate_limited`
    /// (Pusher: `pusher:subscription_error` status 429), never a close. Token signatures
    /// are verified only within it. Default 20.
    pub subscribe_rate_per_connection: u32,
    /// Largest `GET /api/v1/history` answer, bytes: the messages that fit, oldest first,
    /// with `"more": true` when it stopped early. Default 4194304 (4 MiB).
    pub max_history_answer_bytes: usize,
    /// HTTP answers one connection may have buffered and unsent, bytes: pipelined
    /// requests wait until the client has read what came before. Default 262144 (256 KiB).
    pub max_pending_answer_bytes: usize,
    /// Whether webhook URLs may resolve to loopback, private, link-local, unique-local,
    /// unspecified or multicast addresses. Default false (refused at connect time).
    pub webhook_allow_private_addresses: bool,
    /// User blocks a project may hold in force (`POST /api/v1/users/{id}/block`); over it
    /// the block is refused with 409 `too_many_blocks`. Expired blocks do not count.
    /// Default 10000.
    pub max_blocked_users_per_project: usize,
    /// How long an `Idempotency-Key` answer is remembered, seconds. Default 300.
    pub idempotency_window_s: u64,
    /// Idempotency keys remembered per project; over it the oldest is forgotten first.
    /// Default 100000.
    pub idempotency_max_keys_per_project: usize,
    /// WebSocket upgrades this node completes per second (all workers, burst one
    /// second's worth); over it the upgrade is closed at once with 1013
    /// `retry_after=<s>` (Pusher 4100). 0 = off. Default sized from a measurement
    /// (docs/production.md, "Admission").
    pub max_upgrades_per_second: u32,
    /// Seconds over which shutdown spreads its 1001 closes. Default 5; 0 closes all
    /// at once. The process exits within this plus `shutdown_grace_ms` plus 1 s.
    pub drain_spread_s: u64,
    /// Peers (addresses or CIDR blocks) whose PROXY protocol header or
    /// `X-Forwarded-For` names the client address. Default empty (none trusted).
    #[serde(deserialize_with = "list_or_text")]
    pub trusted_proxies: Vec<String>,
    /// permessage-deflate on WebSocket upgrades: `on` (default) or `off`.
    pub ws_compression: crate::ws::deflate::Compression,
    /// Smallest message payload sent compressed, bytes (0: all). Default 512.
    pub ws_compression_min_bytes: usize,
    /// Cluster mode: bytes of recently replayed history frames each node keeps, so that
    /// recoveries of the same messages share one frame and one deflate (0: off).
    /// Default 8 MiB.
    pub replay_cache_bytes: usize,
}

/// A list given as a TOML array, or as one text of comma-separated items (how an
/// environment variable or a flag gives it).
fn list_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Given::deserialize(d)? {
        Given::List(items) => items,
        Given::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

/// `max_upgrades_per_second`'s default: about half of what one node completed per
/// second on the 2-core reference machine (docs/production.md, "Admission"), so that a reconnect
/// storm leaves room for the connections already held.
pub(crate) const DEFAULT_MAX_UPGRADES_PER_SECOND: u32 = 2000;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: 0,
            data_dir: PathBuf::from("./ringcast-data"),
            redis: None,
            redis_ca_file: None,
            tls_cert: None,
            tls_key: None,
            max_body_bytes: 64 * 1024,
            max_batch_messages: 100,
            max_batch_body_bytes: 1024 * 1024,
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            header_read_timeout_ms: 10_000,
            http_idle_timeout_s: 60,
            max_frame_bytes: 16 * 1024,
            max_fragments_per_message: 64,
            max_subscriptions_per_connection: 100,
            max_presence_members: 100,
            send_backlog_bytes: 1024 * 1024,
            write_coalesce_ms: 3,
            max_connections_per_worker: 25_000,
            max_ws_connections_per_project: 100_000,
            ws_read_pause_bytes: 64 * 1024,
            worker_send_budget_bytes: 256 * 1024 * 1024,
            max_subscriptions_per_worker: 500_000,
            ws_connect_rate_per_ip: 0,
            mailbox_capacity: 8192,
            mailbox_high_water_pct: 75,
            heartbeat_s: 25,
            key_refresh_ms: 250,
            default_rate_limit: "100/s".to_string(),
            shutdown_grace_ms: 4000,
            history_max_bytes: 64 * 1024 * 1024,
            console: false,
            metrics_listen: None,
            log_format: LogFormat::Text,
            log_level: "info".to_string(),
            webhook_queue_events: 10_000,
            master_key_file: None,
            subscribe_rate_per_connection: 20,
            max_history_answer_bytes: 4 * 1024 * 1024,
            max_pending_answer_bytes: 256 * 1024,
            webhook_allow_private_addresses: false,
            max_blocked_users_per_project: 10_000,
            idempotency_window_s: 300,
            idempotency_max_keys_per_project: 100_000,
            max_upgrades_per_second: DEFAULT_MAX_UPGRADES_PER_SECOND,
            drain_spread_s: 5,
            trusted_proxies: Vec::new(),
            ws_compression: crate::ws::deflate::Compression::On,
            ws_compression_min_bytes: crate::ws::deflate::DEFAULT_MIN_BYTES,
            replay_cache_bytes: 8 << 20,
        }
    }
}

/// Apply `--key value` / `RINGCAST_KEY=value` overrides: each text is read as a TOML
/// value (`20`, `true`; anything else is a string, so `on` stays `"on"`) and the whole
/// configuration is read back, so a wrong type is refused exactly as in the file.
fn apply_overrides(cfg: Config, given: &[(&'static str, &str)]) -> Result<Config, ConfigError> {
    let invalid = |key: &str, value: &str, why: String| {
        ConfigError::Invalid(format!("{key} = {value:?} is not allowed ({why})"))
    };
    let mut table = toml::Table::try_from(&cfg)
        .map_err(|e| ConfigError::Invalid(format!("configuration: {e}")))?;
    for (key, text) in given {
        let value = match format!("v = {text}").parse::<toml::Table>() {
            Ok(mut t) => t
                .remove("v")
                .unwrap_or_else(|| toml::Value::String(text.to_string())),
            Err(_) => toml::Value::String(text.to_string()),
        };
        table.insert(key.to_string(), value);
        let _: Config = table
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| invalid(key, text, one_line(e.message())))?;
    }
    table
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Invalid(one_line(e.message())))
}

/// Where an effective value came from (`config show`).
pub(crate) type Sources = std::collections::BTreeMap<String, &'static str>;

/// A configuration with the source of each value.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub(crate) sources: Sources,
}

impl Loaded {
    /// `ringcast config show`: `{"key": {"value": ..., "source": "default"|"file"|"env"|"flag"}, ...}`
    /// with secrets redacted.
    pub fn show(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        let values = serde_json::to_value(&self.config).unwrap_or_default();
        if let serde_json::Value::Object(values) = values {
            for (key, mut value) in values {
                if key == "redis" {
                    if let Some(url) = value.as_str() {
                        value = serde_json::Value::String(redact_url(url));
                    }
                }
                let source = self.sources.get(&key).copied().unwrap_or("default");
                out.insert(key, serde_json::json!({"value": value, "source": source}));
            }
        }
        serde_json::Value::Object(out)
    }
}

/// `ringcast config show`: the effective serve configuration, one JSON object on stdout.
pub fn run_show(cli: &Cli, args: &ServeArgs) -> Result<(), ConfigError> {
    let loaded = Config::load_sourced(
        args,
        &cli.data_dir,
        cli.redis.as_deref(),
        cli.master_key_file.as_deref(),
    )?;
    println!("{}", loaded.show());
    Ok(())
}

/// A URL with its password (if any) replaced by `***`: `redis://:pw@h/` → `redis://:***@h/`,
/// and the value of a password query parameter too (`redis+unix:///run/r.sock?pass=pw`
/// → `...?pass=***`; see [`SECRET_PARAMS`]).
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_query(url);
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, tail) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                (format!("{user}:***@"), format!("{host}{path}"))
            } else {
                // `redis://token@host`: a lone userinfo is the password for Redis.
                ("***@".to_string(), format!("{host}{path}"))
            }
        }
        None => (String::new(), rest.to_string()),
    };
    format!("{scheme}://{userinfo}{}", redact_query(&tail))
}

/// Query parameters whose value is a secret (names compared without case): redis-rs
/// reads `pass` (unix sockets); the others are common spellings an operator may use.
const SECRET_PARAMS: [&str; 7] = [
    "pass", "password", "passwd", "pwd", "auth", "token", "secret",
];

/// `text` with the value of every [`SECRET_PARAMS`] query parameter replaced by `***`.
fn redact_query(text: &str) -> String {
    let Some((base, query)) = text.split_once('?') else {
        return text.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if SECRET_PARAMS.iter().any(|s| name.eq_ignore_ascii_case(s)) => {
                format!("{name}=***")
            }
            _ => param.to_string(),
        })
        .collect();
    let mut out = format!("{base}?{}", params.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// The first line of a (possibly multi-line) parser message.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

impl Config {
    /// Build the serve configuration from the file (if any), then the environment and
    /// the flags.
    pub fn load(
        args: &ServeArgs,
        data_dir: &Path,
        redis: Option<&str>,
        master_key_file: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        Self::load_sourced(args, data_dir, redis, master_key_file).map(|l| l.config)
    }

    /// [`Config::load`], keeping where each value came from.
    pub fn load_sourced(
        args: &ServeArgs,
        data_dir: &Path,
        redis: Option<&str>,
        master_key_file: Option<&Path>,
    ) -> Result<Loaded, ConfigError> {
        let mut sources = Sources::new();
        let mut cfg = match &args.config {
            Some(path) => {
                let (cfg, keys) = Self::from_file_keys(path)?;
                for k in keys {
                    sources.insert(k, "file");
                }
                cfg
            }
            None => Config::default(),
        };
        let file_has_data_dir = sources.contains_key("data_dir");
        // clap already folded the env vars into these; a flag or env beats the file.
        let from = |key: &str| args.sources.get(key).copied().unwrap_or("flag");
        let mut set = |key: &str| {
            sources.insert(key.to_string(), from(key));
        };
        if let Some(listen) = args.listen {
            cfg.listen = listen;
            set("listen");
        }
        if let Some(workers) = args.workers {
            cfg.workers = workers;
            set("workers");
        }
        // `--data-dir` has a default in clap: only a value the user gave beats the file.
        let data_dir_given = args.sources.contains_key("data_dir")
            || (args.sources.is_empty() && data_dir != Path::new("./ringcast-data"));
        if data_dir_given || !file_has_data_dir {
            cfg.data_dir = data_dir.to_path_buf();
            if data_dir_given {
                set("data_dir");
            }
        }
        if let Some(url) = redis {
            cfg.redis = Some(url.to_string());
            set("redis");
        }
        if let Some(file) = master_key_file {
            cfg.master_key_file = Some(file.to_path_buf());
            set("master_key_file");
        }
        if args.tls_cert.is_some() {
            cfg.tls_cert = args.tls_cert.clone();
            cfg.tls_key = args.tls_key.clone();
            set("tls_cert");
            set("tls_key");
        }
        if args.dev {
            cfg.console = true;
            set("console");
        }
        if let Some(addr) = args.metrics_listen {
            cfg.metrics_listen = Some(addr);
            set("metrics_listen");
        }
        if let Some(format) = args.log_format {
            cfg.log_format = format;
            set("log_format");
        }
        let given = args.limits.given();
        if !given.is_empty() {
            cfg = apply_overrides(cfg, &given)?;
            for (key, _) in given {
                set(key);
            }
        }
        if cfg.workers == 0 {
            cfg.workers = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
        }
        cfg.validate()?;
        Ok(Loaded {
            config: cfg,
            sources,
        })
    }

    /// Parse a TOML file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        Self::from_file_keys(path).map(|(c, _)| c)
    }

    /// Parse a TOML file; also returns the keys it set. Unknown keys and bad values are
    /// refused one at a time, each in one line naming the key and the value.
    fn from_file_keys(path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let table: toml::Table = text.parse().map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        let known = Self::keys();
        for (key, value) in &table {
            if !known.iter().any(|k| k == key) {
                return Err(ConfigError::UnknownKey {
                    path: path.to_path_buf(),
                    key: key.clone(),
                    value: value.to_string(),
                    known: known.join(", "),
                });
            }
        }
        for (key, value) in &table {
            let mut one = toml::Table::new();
            one.insert(key.clone(), value.clone());
            if let Err(e) = one.try_into::<Config>() {
                return Err(ConfigError::BadValue {
                    path: path.to_path_buf(),
                    key: key.clone(),
                    value: value.to_string(),
                    why: one_line(e.message()),
                });
            }
        }
        let keys = table.keys().cloned().collect();
        let cfg = table.try_into().map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        Ok((cfg, keys))
    }

    /// Every configuration key, in declaration order.
    pub fn keys() -> Vec<String> {
        match serde_json::to_value(Config::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Parse TOML text (no validation of cross-field rules; see [`Config::validate`]).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::new(),
            source: Box::new(source),
        })
    }

    /// Reject values that would disable a limit or make the server unusable. Each
    /// error names the key, the value and what is allowed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, value: &dyn std::fmt::Display, allowed: &str| {
            Err(ConfigError::Invalid(format!(
                "{key} = {value} is not allowed ({allowed})"
            )))
        };
        let positive = [
            ("max_body_bytes", self.max_body_bytes),
            ("max_batch_messages", self.max_batch_messages),
            ("max_batch_body_bytes", self.max_batch_body_bytes),
            ("history_max_bytes", self.history_max_bytes),
            ("max_header_bytes", self.max_header_bytes),
            ("max_headers", self.max_headers),
            ("max_frame_bytes", self.max_frame_bytes),
            ("max_fragments_per_message", self.max_fragments_per_message),
            (
                "max_subscriptions_per_connection",
                self.max_subscriptions_per_connection,
            ),
            ("max_presence_members", self.max_presence_members),
            ("send_backlog_bytes", self.send_backlog_bytes),
            ("ws_read_pause_bytes", self.ws_read_pause_bytes),
            ("worker_send_budget_bytes", self.worker_send_budget_bytes),
            (
                "max_subscriptions_per_worker",
                self.max_subscriptions_per_worker,
            ),
            (
                "max_connections_per_worker",
                self.max_connections_per_worker,
            ),
            ("mailbox_capacity", self.mailbox_capacity),
            ("webhook_queue_events", self.webhook_queue_events),
            (
                "subscribe_rate_per_connection",
                self.subscribe_rate_per_connection as usize,
            ),
            ("max_history_answer_bytes", self.max_history_answer_bytes),
            ("max_pending_answer_bytes", self.max_pending_answer_bytes),
            ("idempotency_window_s", self.idempotency_window_s as usize),
            (
                "idempotency_max_keys_per_project",
                self.idempotency_max_keys_per_project,
            ),
            ("heartbeat_s", self.heartbeat_s as usize),
            ("key_refresh_ms", self.key_refresh_ms as usize),
            (
                "header_read_timeout_ms",
                self.header_read_timeout_ms as usize,
            ),
        ];
        for (name, value) in positive {
            if value == 0 {
                return bad(name, &value, "an integer greater than 0");
            }
        }
        // Kept in `u32`s in every connection's record (`ws::conn`, `ws::message`).
        for (name, value) in [
            ("max_frame_bytes", self.max_frame_bytes),
            ("send_backlog_bytes", self.send_backlog_bytes),
        ] {
            if value > u32::MAX as usize {
                return bad(name, &value, "at most 4294967295 (4 GiB)");
            }
        }
        if self.max_upgrades_per_second > crate::quota::rate_limit::MAX_COUNT {
            return bad(
                "max_upgrades_per_second",
                &self.max_upgrades_per_second,
                "0 (off) to 10000000",
            );
        }
        if self.ws_compression_min_bytes > 16 << 20 {
            let v = self.ws_compression_min_bytes;
            return bad("ws_compression_min_bytes", &v, "0 to 16777216 bytes");
        }
        if self.replay_cache_bytes > 1 << 30 {
            let v = self.replay_cache_bytes;
            return bad("replay_cache_bytes", &v, "0 (off) to 1073741824 bytes");
        }
        if self.max_blocked_users_per_project == 0 || self.max_blocked_users_per_project > 1_000_000
        {
            let v = self.max_blocked_users_per_project;
            return bad("max_blocked_users_per_project", &v, "1 to 1000000");
        }
        if self.drain_spread_s > 600 {
            return bad("drain_spread_s", &self.drain_spread_s, "0 to 600 seconds");
        }
        if let Err(e) = crate::admission::trusted::TrustedProxies::parse(&self.trusted_proxies) {
            return bad(
                "trusted_proxies",
                &format!("{:?}", self.trusted_proxies),
                &e.to_string(),
            );
        }
        if self.mailbox_high_water_pct == 0 || self.mailbox_high_water_pct > 100 {
            return bad(
                "mailbox_high_water_pct",
                &self.mailbox_high_water_pct,
                "1 to 100",
            );
        }
        if self.max_headers > 128 {
            return bad("max_headers", &self.max_headers, "1 to 128");
        }
        if self.write_coalesce_ms > 1000 {
            return bad("write_coalesce_ms", &self.write_coalesce_ms, "0 to 1000");
        }
        if self.workers > 1024 {
            return bad("workers", &self.workers, "0 (one per core) to 1024");
        }
        if self.redis.is_some() && self.master_key_file.is_none() {
            return bad(
                "master_key_file",
                &"(none)",
                "cluster mode needs master_key_file (--master-key-file / RINGCAST_MASTER_KEY_FILE): the same file on every node",
            );
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), None) => {
                return bad(
                    "tls_cert",
                    &format!("{:?}", cert.display().to_string()),
                    "tls_cert and tls_key are given together",
                )
            }
            (None, Some(key)) => {
                return bad(
                    "tls_key",
                    &format!("{:?}", key.display().to_string()),
                    "tls_cert and tls_key are given together",
                )
            }
            _ => {}
        }
        if let Err(e) = crate::quota::RateLimit::parse(&self.default_rate_limit) {
            return bad(
                "default_rate_limit",
                &format!("{:?}", self.default_rate_limit),
                &format!("N/s or N/min: {e}"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return bad(
                "log_level",
                &format!("{:?}", self.log_level),
                &format!(
                    "a level (error, warn, info, debug, trace) or an env-filter directive: {}",
                    one_line(&e.to_string())
                ),
            );
        }
        // Port 0 (tests) gives each listener its own port; anything else must differ.
        if self.metrics_listen == Some(self.listen) && self.listen.port() != 0 {
            return bad(
                "metrics_listen",
                &self.listen,
                "an address other than listen",
            );
        }
        Ok(())
    }

    /// The largest body any endpoint takes (the read buffer's bound).
    pub fn max_request_body(&self) -> usize {
        self.max_body_bytes.max(self.max_batch_body_bytes)
    }

    /// The back-pressure threshold in effect: below the backlog bound with room to
    /// spare, so back-pressure acts before a client's own replies could reach 4008.
    pub fn read_pause_bytes(&self) -> usize {
        self.ws_read_pause_bytes.min(self.send_backlog_bytes / 2)
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn http_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.http_idle_timeout_s)
    }

    /// Mailbox length above which health is degraded. In u128: a huge configured
    /// capacity must not overflow (found by tests/fuzz_props.rs).
    pub fn mailbox_high_water(&self) -> usize {
        ((self.mailbox_capacity as u128 * u128::from(self.mailbox_high_water_pct) / 100) as usize)
            .max(1)
    }
}

#[cfg(test)]
mod tests;
