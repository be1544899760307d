//! Command-line surface of the `ringcast` binary, exactly as `docs/protocol.md` documents it.
//!
//! Owns only argument parsing (clap derive). It never touches the database or the
//! network: `main.rs` hands the parsed [`Cli`] to `admin` (project/key commands) or to
//! `server` (serve). Global flags (`--data-dir`, `--redis`) are accepted before or after
//! the subcommand, so `ringcast --data-dir d project list` and
//! `ringcast project list --data-dir d` mean the same thing.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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

    /// Redis URL: join a cluster and keep projects and keys in Redis.
    #[arg(long, global = true, env = "RINGCAST_REDIS_URL")]
    pub redis: Option<String>,

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

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum KeyKindArg {
    Secret,
    Public,
}
