//! Command-line surface of the `ringcast` binary, exactly as `docs/protocol.md` documents it.
//!
//! Owns only argument parsing (clap derive). It never touches the database or the
//! network: `main.rs` hands the parsed [`Cli`] to `admin` (project/key commands) or to
//! `server` (serve). Global flags (`--data-dir`, `--redis`) are accepted before or after
//! the subcommand, so `ringcast --data-dir d project list` and
//! `ringcast project list --data-dir d` mean the same thing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

/// Real-time publish service: HTTP publish in, WebSocket fan-out.
#[derive(Debug, Parser)]
#[command(name = "ringcast", version, about)]
pub struct Cli {
    /// Directory holding the embedded database.
    #[arg(
        long,
        global = true,
        env = "RINGCAST_DATA_DIR",
        default_value = "./ringcast-data"
    )]
    pub data_dir: PathBuf,

    /// Redis URL: join a cluster and keep projects and keys in Redis. `rediss://` for
    /// TLS; `redis://USER:PASSWORD@host:port/` for an ACL user.
    #[arg(long, global = true, env = "RINGCAST_REDIS_URL")]
    pub redis: Option<String>,

    /// File of the master key that seals token secrets (64 hex characters). Default:
    /// `<data-dir>/master.key`, created on first use; required in cluster mode.
    #[arg(long, global = true, env = "RINGCAST_MASTER_KEY_FILE")]
    pub master_key_file: Option<PathBuf>,

    /// PEM file of the CA certificate(s) that sign the Redis server's certificate
    /// (`rediss://` only). Default: the system's trusted roots.
    #[arg(long, global = true, env = "RINGCAST_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Manage projects.
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// End a user's access: disconnect, block, unblock, show (a running server acts
    /// within 1 second).
    #[command(subcommand)]
    User(UserCommand),
    /// Inspect the configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Publish one message to a running server (POST /api/v1/publish); prints the answer.
    Publish(PublishArgs),
    /// Subscribe to channels of a running server; prints each message as one JSON line.
    Subscribe(SubscribeArgs),
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Close every connection of the user in the project, on every server (4010).
    Disconnect { project_id: String, user_id: String },
    /// Refuse the user's tokens and sign-ins until a time (or for ever), and
    /// disconnect them.
    Block {
        project_id: String,
        user_id: String,
        /// Until these unix seconds (default: for ever).
        #[arg(long, conflicts_with = "for_")]
        until: Option<i64>,
        /// For this long from now: e.g. 90s, 10m, 1h (at most 30 days).
        #[arg(long = "for", id = "for_")]
        for_: Option<String>,
    },
    /// Lift a user's block.
    Unblock { project_id: String, user_id: String },
    /// Print the user's block.
    Show { project_id: String, user_id: String },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective serve configuration (same flags as `serve`) as one JSON
    /// object: each key's value and where it came from (default, file, env, flag).
    Show(ServeArgs),
}

/// The log line format of `serve`.
#[derive(
    Debug, Clone, Copy, Default, ValueEnum, PartialEq, Eq, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Where a command-line value came from: the flag itself or its environment variable.
/// Filled in by [`Cli::parse_with_sources`]; values clap defaulted are absent.
pub(crate) type FlagSources = BTreeMap<&'static str, &'static str>;

/// Options shared by `publish` and `subscribe`.
#[derive(Debug, Args, Clone)]
pub struct RemoteArgs {
    /// The server's base URL, http:// or https:// with host and port.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The key: sk_... to publish, pk_... to subscribe.
    #[arg(long, env = "RINGCAST_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// PEM file of the CA (or self-signed certificate) to trust for https:// and wss://,
    /// instead of the built-in public roots.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Args, Clone)]
pub struct PublishArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    pub channel: String,
    pub event: String,
    /// The message's data: JSON text (an object, or a string in quotes).
    pub data: String,
    /// Send `Idempotency-Key: KEY` (1 to 255 printable ASCII characters): running the
    /// same command again within the server's `idempotency_window_s` prints the same
    /// answer and publishes nothing again.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct SubscribeArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Exit 0 after this many messages (default: run until SIGINT).
    #[arg(long)]
    pub count: Option<u64>,
    #[arg(required = true)]
    pub channels: Vec<String>,
}

impl Cli {
    /// Parse the command line (exiting with clap's message on an error), recording for
    /// `serve` and `config show` which values came from a flag and which from the
    /// environment (`config show` reports it).
    pub fn parse_with_sources() -> Cli {
        let matches = Cli::command()
            .try_get_matches()
            .unwrap_or_else(|e| exit_one_line(e));
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_one_line(e));
        let sub = matches.subcommand().map(|(_, m)| m);
        let sub = match (&cli.command, sub) {
            (Command::Config(_), Some(m)) => m.subcommand().map(|(_, m)| m),
            (_, m) => m,
        };
        if let (Some(args), Some(m)) = (cli.serve_args_mut(), sub) {
            args.sources = sources(m);
        }
        cli
    }

    fn serve_args_mut(&mut self) -> Option<&mut ServeArgs> {
        match &mut self.command {
            Command::Serve(a) | Command::Config(ConfigCommand::Show(a)) => Some(a),
            _ => None,
        }
    }
}

/// Exit on a command-line error with one line (clap's message without its usage
/// block); help and version print as clap prints them.
fn exit_one_line(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let message = text
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("{message}");
    std::process::exit(2);
}

/// The serve options a user set, by config key, with "flag" or "env".
fn sources(m: &ArgMatches) -> FlagSources {
    const ARGS: [(&str, &str); 11] = [
        ("listen", "listen"),
        ("workers", "workers"),
        ("tls_cert", "tls_cert"),
        ("tls_key", "tls_key"),
        ("metrics_listen", "metrics_listen"),
        ("log_format", "log_format"),
        ("data_dir", "data_dir"),
        ("redis", "redis"),
        ("master_key_file", "master_key_file"),
        ("dev", "console"),
        ("config", "config"),
    ];
    let mut out = FlagSources::new();
    let limits = LimitArgs::KEYS.iter().map(|k| (*k, *k));
    for (id, key) in ARGS.into_iter().chain(limits) {
        match m.try_get_raw(id).ok().and_then(|_| m.value_source(id)) {
            Some(ValueSource::CommandLine) => {
                out.insert(key, "flag");
            }
            Some(ValueSource::EnvVariable) => {
                out.insert(key, "env");
            }
            _ => {}
        }
    }
    out
}

#[derive(Debug, Args, Clone, Default)]
pub struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long, env = "RINGCAST_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Worker threads, one per core (default: available cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// PEM certificate chain: serve HTTPS and WSS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// On an empty data directory, create a project `dev` and print its keys once.
    #[arg(long)]
    pub dev: bool,
    /// Serve Prometheus metrics at GET /metrics on this address (off by default).
    #[arg(long, env = "RINGCAST_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log line format on stderr.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// The limits added by contract 1.3, each also a flag and an environment variable.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Which values came from a flag or the environment (not a flag itself).
    #[arg(skip)]
    pub(crate) sources: FlagSources,
}

/// Declares config keys that `serve` (and `config show`) also take as `--key-with-dashes`
/// and `RINGCAST_KEY`. Each value is kept as text and applied over the file's
/// configuration as a TOML value (`20`, `true`, `on`), so the field's own type and
/// [`crate::config::Config::validate`] decide what is accepted: one definition per key.
macro_rules! limit_args {
    ($( $(#[$doc:meta])* $field:ident => $env:literal, )*) => {
        /// Config keys (contract 1.3 and later) that are also flags and env variables.
        #[derive(Debug, Args, Clone, Default)]
        pub struct LimitArgs {
            $(
                $(#[$doc])*
                #[arg(long, env = $env, value_name = "VALUE")]
                pub $field: Option<String>,
            )*
        }

        impl LimitArgs {
            /// The keys given, as (config key, text as given).
            pub(crate) fn given(&self) -> Vec<(&'static str, &str)> {
                let mut out = Vec::new();
                $(
                    if let Some(v) = &self.$field {
                        out.push((stringify!($field), v.as_str()));
                    }
                )*
                out
            }

            /// Every key this struct declares (for the source table).
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];
        }
    };
}

limit_args! {
    /// Subscribes and token refreshes per second per connection (token bucket, burst
    /// max_subscriptions_per_connection). Default 20.
    subscribe_rate_per_connection => "RINGCAST_SUBSCRIBE_RATE_PER_CONNECTION",
    /// Largest `GET /api/v1/history` answer, bytes. Default 4194304 (4 MiB).
    max_history_answer_bytes => "RINGCAST_MAX_HISTORY_ANSWER_BYTES",
    /// HTTP answers one connection may have buffered, bytes. Default 262144 (256 KiB).
    max_pending_answer_bytes => "RINGCAST_MAX_PENDING_ANSWER_BYTES",
    /// Allow webhook URLs resolving to loopback, private, link-local and similar
    /// addresses: true or false. Default false.
    webhook_allow_private_addresses => "RINGCAST_WEBHOOK_ALLOW_PRIVATE_ADDRESSES",
    /// User blocks a project may hold in force (1 to 1000000). Default 10000.
    max_blocked_users_per_project => "RINGCAST_MAX_BLOCKED_USERS_PER_PROJECT",
    /// How long an Idempotency-Key is remembered, seconds. Default 300.
    idempotency_window_s => "RINGCAST_IDEMPOTENCY_WINDOW_S",
    /// Idempotency keys remembered per project. Default 100000.
    idempotency_max_keys_per_project => "RINGCAST_IDEMPOTENCY_MAX_KEYS_PER_PROJECT",
    /// WebSocket upgrades per second, node-wide; over it 1013 retry_after (Pusher 4100).
    /// 0 = off. Default 2000.
    max_upgrades_per_second => "RINGCAST_MAX_UPGRADES_PER_SECOND",
    /// Seconds over which shutdown spreads its 1001 closes. Default 5.
    drain_spread_s => "RINGCAST_DRAIN_SPREAD_S",
    /// Proxies whose PROXY header or X-Forwarded-For names the client: addresses or
    /// CIDRs, comma-separated (or a TOML list). Default none.
    trusted_proxies => "RINGCAST_TRUSTED_PROXIES",
    /// permessage-deflate on WebSocket upgrades: on or off. Default on.
    ws_compression => "RINGCAST_WS_COMPRESSION",
    /// Smallest message payload sent compressed, bytes (0: all). Default 512.
    ws_compression_min_bytes => "RINGCAST_WS_COMPRESSION_MIN_BYTES",
    /// Cluster mode: bytes of recently replayed history frames kept per node (0: off).
    /// Default 8 MiB.
    replay_cache_bytes => "RINGCAST_REPLAY_CACHE_BYTES",
}

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project with one secret and one public key.
    Create {
        name: String,
        /// Quota: N/s or N/min (default 100/s).
        #[arg(long)]
        rate_limit: Option<String>,
        /// Channel history: SIZE/TTL, e.g. 100/120s (default off).
        #[arg(long)]
        history: Option<String>,
    },
    /// List projects.
    List,
    /// Change a project's quota (a running server applies it within 1 second).
    SetRateLimit {
        project_id: String,
        rate_limit: String,
    },
    /// Change a project's channel history: SIZE/TTL, e.g. 100/120s; 0/0s turns it off.
    SetHistory { project_id: String, history: String },
    /// Make a new token secret for private channels (printed once); the old ones keep
    /// verifying for the grace period.
    RotateTokenSecret {
        project_id: String,
        /// How long the previous secrets keep verifying: e.g. 60s, 10m, 1h, 0s.
        #[arg(long, default_value = "60s")]
        grace: String,
    },
    /// Register a public key (ES256 P-256 or EdDSA Ed25519) that verifies tokens naming
    /// its id in `kid`.
    AddTokenKey {
        project_id: String,
        /// PEM file with the public key (-----BEGIN PUBLIC KEY-----).
        #[arg(long)]
        public_key_file: PathBuf,
    },
    /// Remove a registered token key.
    RemoveTokenKey { project_id: String, key_id: String },
    /// Change a project's own limits (a running server applies them within 1 second).
    SetLimits {
        project_id: String,
        /// WebSocket connections the project may hold per node: a number (0 =
        /// unlimited) or `default` (the server's max_ws_connections_per_project).
        #[arg(long, required_unless_present_any = ["client_events", "pusher", "require_user"])]
        max_connections: Option<String>,
        /// Whether subscribers of private and presence channels may send client
        /// events (`client-*`) to each other: `on` or `off` (the default).
        #[arg(long, value_enum)]
        client_events: Option<OnOff>,
        /// Whether Pusher clients and the Pusher REST API may use the project (as
        /// app `pusher_app_id`): `on` (the default) or `off`.
        #[arg(long, value_enum)]
        pusher: Option<OnOff>,
        /// Whether every WebSocket needs a valid connection token (a user): `on` or
        /// `off` (the default).
        #[arg(long, value_enum)]
        require_user: Option<OnOff>,
    },
    /// Send the project's events (channel occupied/vacated, member added/removed,
    /// client events) to URL as Pusher-format webhooks, or turn them off with --off.
    SetWebhook {
        project_id: String,
        /// Where to POST: an http:// or https:// URL.
        #[arg(required_unless_present = "off", conflicts_with = "off")]
        url: Option<String>,
        /// Comma-separated event kinds: channel_occupied, channel_vacated, member_added,
        /// member_removed, client_event (default: all but client_event).
        #[arg(long, conflicts_with = "off")]
        events: Option<String>,
        /// Turn the project's webhook off.
        #[arg(long)]
        off: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create a key for a project.
    Create {
        project_id: String,
        #[arg(long, value_enum)]
        kind: KeyKindArg,
    },
    /// Revoke a key, by full key or by id.
    Revoke { key_or_id: String },
    /// List a project's keys (prefixes only).
    List { project_id: String },
}

/// A switch given on the command line.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum KeyKindArg {
    Secret,
    Public,
}
