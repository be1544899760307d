//! Every knob of the server: its default, its unit, and where it comes from.
//!
//! Precedence, lowest to highest: built-in defaults, the TOML file (`--config`), the
//! environment (`RINGCAST_LISTEN`, `RINGCAST_DATA_DIR`, `RINGCAST_REDIS_URL`, read by
//! clap), then command-line flags. [`Config::validate`] rejects values that would make a
//! limit meaningless (a zero body limit, a mailbox of zero) before anything listens.
//! Unknown keys in the file are an error, so a typo never silently becomes a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cli::ServeArgs;

/// Failure to build a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The server's configuration. Field docs state default and unit; the README's
/// configuration table mirrors them.
#[derive(Debug, Clone, Deserialize)]
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
    /// Most WebSocket connections per project on this node. Default 0 (unlimited).
    /// Over: the upgrade is refused with 503.
    pub max_ws_connections_per_project: usize,
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
    /// Default 67108864 (64 MiB). Over it, the oldest entries of the largest channels
    /// are dropped first.
    pub history_max_bytes: usize,
    /// Serve the live console page at `GET /console`. Default false; `serve --dev`
    /// turns it on. Off: 404.
    pub console: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: 0,
            data_dir: PathBuf::from("./ringcast-data"),
            redis: None,
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
            send_backlog_bytes: 1024 * 1024,
            write_coalesce_ms: 3,
            max_connections_per_worker: 25_000,
            max_ws_connections_per_project: 0,
            mailbox_capacity: 8192,
            mailbox_high_water_pct: 75,
            heartbeat_s: 25,
            key_refresh_ms: 250,
            default_rate_limit: "100/s".to_string(),
            shutdown_grace_ms: 4000,
            history_max_bytes: 64 * 1024 * 1024,
            console: false,
        }
    }
}

impl Config {
    /// Build the serve configuration from the file (if any), then the flags.
    pub fn load(
        args: &ServeArgs,
        data_dir: &Path,
        redis: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = match &args.config {
            Some(path) => Self::from_file(path)?,
            None => Config::default(),
        };
        // clap already folded the env vars into these; a flag or env beats the file.
        if let Some(listen) = args.listen {
            cfg.listen = listen;
        }
        if let Some(workers) = args.workers {
            cfg.workers = workers;
        }
        if data_dir != Path::new("./ringcast-data") || args.config.is_none() {
            cfg.data_dir = data_dir.to_path_buf();
        }
        if let Some(url) = redis {
            cfg.redis = Some(url.to_string());
        }
        if args.tls_cert.is_some() {
            cfg.tls_cert = args.tls_cert.clone();
            cfg.tls_key = args.tls_key.clone();
        }
        if args.dev {
            cfg.console = true;
        }
        if cfg.workers == 0 {
            cfg.workers = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parse a TOML file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Parse TOML text (no validation of cross-field rules; see [`Config::validate`]).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::new(),
            source: Box::new(source),
        })
    }

    /// Reject values that would disable a limit or make the server unusable.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
            ("send_backlog_bytes", self.send_backlog_bytes),
            (
                "max_connections_per_worker",
                self.max_connections_per_worker,
            ),
            ("mailbox_capacity", self.mailbox_capacity),
            ("heartbeat_s", self.heartbeat_s as usize),
            ("key_refresh_ms", self.key_refresh_ms as usize),
            (
                "header_read_timeout_ms",
                self.header_read_timeout_ms as usize,
            ),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be greater than 0"
                )));
            }
        }
        if self.mailbox_high_water_pct == 0 || self.mailbox_high_water_pct > 100 {
            return Err(ConfigError::Invalid(
                "mailbox_high_water_pct must be between 1 and 100".into(),
            ));
        }
        if self.max_headers > 128 {
            return Err(ConfigError::Invalid(
                "max_headers must be at most 128".into(),
            ));
        }
        if self.write_coalesce_ms > 1000 {
            return Err(ConfigError::Invalid(
                "write_coalesce_ms must be at most 1000".into(),
            ));
        }
        if self.workers > 1024 {
            return Err(ConfigError::Invalid("workers must be at most 1024".into()));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "tls_cert and tls_key must be given together".into(),
            ));
        }
        crate::quota::RateLimit::parse(&self.default_rate_limit)
            .map_err(|e| ConfigError::Invalid(format!("default_rate_limit: {e}")))?;
        Ok(())
    }

    /// The largest body any endpoint takes (the read buffer's bound).
    pub fn max_request_body(&self) -> usize {
        self.max_body_bytes.max(self.max_batch_body_bytes)
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
mod tests {
    use super::*;

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
    fn fragment_cap_defaults_to_64() {
        assert_eq!(Config::default().max_fragments_per_message, 64);
        let cfg = Config::from_toml("max_fragments_per_message = 1000\n").unwrap();
        assert_eq!(cfg.max_fragments_per_message, 1000);
        cfg.validate().unwrap();
    }
}
