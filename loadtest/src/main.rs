//! `loadtest`: the load-test harness of ringcast (and of Nchan as a peer).
//!
//! Layout:
//! - `main.rs`: the command line and the dispatch to a scenario; prints the one JSON
//!   line on stdout and sets the exit status.
//! - `scenario/`: one module per mode (publish, fanout, ramp, idle, soak, floor): its
//!   flags, its phases and its report (the JSON line and a short table on stderr).
//! - `subrun.rs` / `pubrun.rs` start, watch and merge subscriber and publisher
//!   threads; `report.rs` CPU snapshots, progress lines and tables.
//! - `subs.rs` subscriber threads (mio loops over many `WsConn`s), `wsconn.rs` one
//!   WebSocket client connection, `ws.rs` the frame codec.
//! - `publisher.rs` keep-alive HTTP publishers, `http.rs` the response parser.
//! - `target.rs` ringcast, Nchan and Pusher-protocol adapters, `net.rs` loopback-only sockets,
//!   `tls.rs` the TLS client of `wss://`/`https://` targets (`--ca-file`),
//!   `stats.rs` histograms and /proc readings, `trend.rs` soak slopes, `ramp.rs` the
//!   ramp's rate search, `floor.rs` the kernel floor (`floor_pace.rs` its rate-matched
//!   rounds, `floor_reader.rs` its reader thread or process).
//! - `storm/` the reconnect storm: reconnecting clients that count lost and duplicated
//!   messages, and a publisher that fails over with its `Idempotency-Key`.
//!
//! Invariants: only loopback targets; every phase is bounded in time; the harness's
//! own CPU is always reported beside the server's so a reader can tell which one was
//! the bottleneck. Exit status: 0 when the run is `ok`, 1 when not, 2 on an error.

mod floor;
mod floor_pace;
mod floor_reader;
mod floor_send;
mod http;
mod net;
mod publisher;
mod pubrun;
mod ramp;
mod report;
mod scenario;
mod stats;
mod storm;
mod subrun;
mod subs;
mod target;
mod tls;
mod trend;
mod ws;
mod wsconn;

use clap::{Args, Parser, Subcommand};
use scenario::{fanout, idle, publish, soak};
use serde_json::{json, Value};
use std::time::Duration;
use target::{Kind, PublishApi, Target};

#[derive(Parser)]
#[command(
    name = "loadtest",
    about = "Load-test harness for ringcast, Nchan and Pusher-protocol servers (loopback only)"
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    mode: Mode,
}

/// Flags every mode takes (before or after the mode's name).
#[derive(Args, Clone)]
pub struct Common {
    /// Which server speaks at --url.
    #[arg(long, value_enum, default_value = "ringcast", global = true)]
    pub target: Kind,
    /// Base URL of the server; must be loopback. `wss://` (or `https://`): subscribers
    /// and publishers speak TLS, trusting --ca-file.
    #[arg(long, default_value = "http://127.0.0.1:8080", global = true)]
    pub url: String,
    /// PEM certificate(s) to trust for a `wss://` (`https://`) --url or --publish-url:
    /// the server's CA, or its self-signed certificate. Required with TLS; verification
    /// is never turned off.
    #[arg(long, global = true)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Publish to this URL instead of --url (loopback only): subscribers stay on --url.
    /// For cluster runs: subscribe on one node, publish on another.
    #[arg(long, global = true)]
    pub publish_url: Option<String>,
    /// ringcast secret key for publishing (sk_...).
    #[arg(long, env = "LOADTEST_SECRET_KEY", default_value = "", global = true)]
    pub secret_key: String,
    /// ringcast public key for subscribing (pk_...).
    #[arg(long, env = "LOADTEST_PUBLIC_KEY", default_value = "", global = true)]
    pub public_key: String,
    /// Server process id(s) to read CPU, RSS and fds from (repeat for nginx workers).
    #[arg(long = "server-pid", global = true)]
    pub server_pids: Vec<u32>,
    /// Loopback source addresses to spread connections over (127.0.0.1..N), for >28k.
    #[arg(long, default_value_t = 1, global = true)]
    pub source_ips: usize,
    /// Subscriber threads (each one epoll loop).
    #[arg(long, default_value_t = 2, global = true)]
    pub threads: usize,
    /// Free-form label copied into the JSON line (scenario name, repetition).
    #[arg(long, default_value = "", global = true)]
    pub label: String,
    /// No progress lines on stderr.
    #[arg(long, global = true)]
    pub quiet: bool,
    /// Start of every channel name: `private-lt` measures private channels (with --token).
    #[arg(long, default_value = "lt", global = true)]
    pub channel_prefix: String,
    /// Fixed channel tag instead of a per-run one (so a token can name the channels:
    /// `<prefix><tag>c<index>`). Use a new one per run.
    #[arg(long, global = true)]
    pub tag: Option<String>,
    /// Subscription token (JWT) for ringcast subscribe frames (private channels).
    #[arg(long, env = "LOADTEST_TOKEN", global = true)]
    pub token: Option<String>,
    /// The API publishers use: `native` (ringcast's /api/v1/publish, --secret-key),
    /// `pusher` (Pusher REST /apps/{id}/events, --app-id and --app-secret) or `nchan`.
    /// Default: the target's own (ringcast and uws: native, pusher: pusher, nchan: nchan).
    /// `--target pusher --publish native`: Pusher subscribers on ringcast's /app/{key},
    /// publishes through ringcast's native API.
    #[arg(long, value_enum, global = true)]
    pub publish: Option<PublishApi>,
    /// Pusher REST: the app id (`/apps/{app_id}/events`; ringcast: `pusher_app_id`).
    #[arg(long, env = "LOADTEST_APP_ID", default_value = "", global = true)]
    pub app_id: String,
    /// Pusher REST: the app secret that signs publishes (ringcast: the token secret).
    /// The key (`auth_key`, and the `/app/{key}` of subscribers) is --public-key.
    #[arg(long, env = "LOADTEST_APP_SECRET", default_value = "", global = true)]
    pub app_secret: String,
    /// Send a fresh `Idempotency-Key` with every publish (ringcast, issue 22): what a
    /// keyed publish costs beside an unkeyed one.
    #[arg(long, global = true)]
    pub idempotency_keys: bool,
    /// Subscribers offer permessage-deflate (no context takeover) and inflate what
    /// arrives compressed: benchmarks of compression on vs off.
    #[arg(long, global = true)]
    pub compression: bool,
    /// `--pad` fills the message with realistic JSON records (order lines: ids, SKUs,
    /// names, prices, states, timestamps, varying per message) instead of one run of
    /// `x`, which deflates to nothing: what compression saves on real traffic.
    #[arg(long, global = true)]
    pub pad_json: bool,
}

#[derive(Subcommand)]
enum Mode {
    /// M keep-alive connections posting as fast as possible (or at --rate).
    Publish(publish::PublishArgs),
    /// N WebSocket subscribers over K channels, publishers at rate R for D seconds.
    Fanout(fanout::FanoutArgs),
    /// Fan-out with the rate raised step by step (double, then bisect) until p99 >
    /// --p99-limit-ms or anything is lost; reports the highest passing rate.
    Ramp(scenario::ramp::RampArgs),
    /// Open N WebSocket connections, hold them, report server RSS per connection.
    Idle(idle::IdleArgs),
    /// Churn for a long run; server RSS and fds sampled every --sample-every seconds.
    Soak(soak::SoakArgs),
    /// The kernel floor: one pre-encoded frame written to N loopback sockets.
    Floor(scenario::floor::FloorArgs),
    /// Reconnect storm (issue 26): reconnecting clients with `since`, or the failover
    /// publisher; lost and duplicated messages counted (loadtest/storm.sh runs it).
    Storm(storm::StormArgs),
}

fn main() {
    let cli = Cli::parse();
    let nofile = net::raise_nofile();
    match dispatch(&cli) {
        Ok(mut v) => {
            v["nofile_limit"] = json!(nofile);
            if !cli.common.label.is_empty() {
                v["label"] = json!(cli.common.label);
            }
            println!("{v}");
            let ok = v.get("ok").and_then(Value::as_bool).unwrap_or(true);
            std::process::exit(if ok { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("loadtest: {e}");
            std::process::exit(2);
        }
    }
}

fn dispatch(cli: &Cli) -> Result<Value, String> {
    let c = &cli.common;
    ws::set_compression(c.compression);
    target::set_pad_json(c.pad_json);
    match &cli.mode {
        // The floor talks to no server: it must run without keys or a target.
        Mode::Floor(a) => scenario::floor::run(a),
        Mode::Storm(a) => storm::run(c, a),
        Mode::Publish(a) => publish::run(c, &make_target(c)?, a),
        Mode::Fanout(a) => fanout::run(c, &make_target(c)?, a),
        Mode::Ramp(a) => scenario::ramp::run(c, &make_target(c)?, a),
        Mode::Idle(a) => idle::run(c, &make_target(c)?, a),
        Mode::Soak(a) => soak::run(c, &make_target(c)?, a),
    }
}

/// The TLS client of a `wss://`/`https://` endpoint from --ca-file; `None` on plaintext.
fn tls_client(c: &Common, url: &str, e: &net::Endpoint) -> Result<Option<tls::Client>, String> {
    match (&c.ca_file, e.tls) {
        (Some(ca), true) => tls::Client::new(ca, &e.host).map(Some),
        (None, true) => Err(format!(
            "{url}: TLS needs --ca-file (the server's CA or self-signed certificate)"
        )),
        (_, false) => Ok(None),
    }
}

/// Seconds from the command line as a `Duration`, clamped to [0, a week]:
/// `from_secs_f64` panics on a negative value, and a mistyped huge one would leave a
/// phase practically unbounded.
fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.0, 86_400.0 * 7.0))
}

/// The server a scenario drives, from the common flags. The channel tag mixes the
/// time and the pid, so neither successive nor concurrent runs share a channel.
fn make_target(c: &Common) -> Result<Target, String> {
    let endpoint = net::parse_url(&c.url)?;
    let publish_endpoint = c.publish_url.as_deref().map(net::parse_url).transpose()?;
    let tls = tls_client(c, &c.url, &endpoint)?;
    let publish_tls = match (&c.publish_url, &publish_endpoint) {
        (Some(url), Some(e)) => tls_client(c, url, e)?,
        _ => None,
    };
    if c.ca_file.is_some() && tls.is_none() && publish_tls.is_none() {
        return Err("--ca-file goes with a wss:// (or https://) --url or --publish-url".into());
    }
    if matches!(c.target, Kind::Ringcast | Kind::Uws)
        && (c.secret_key.is_empty() || c.public_key.is_empty())
    {
        return Err("ringcast (and uws) needs --secret-key sk_... and --public-key pk_... (or LOADTEST_SECRET_KEY / LOADTEST_PUBLIC_KEY)".into());
    }
    let publish = c.publish.unwrap_or(PublishApi::default_for(c.target));
    match (c.target, publish) {
        (Kind::Nchan, PublishApi::Nchan) => {}
        (Kind::Nchan, _) | (_, PublishApi::Nchan) => {
            return Err("--publish nchan goes with --target nchan only".into());
        }
        _ => {}
    }
    if c.target == Kind::Pusher && c.public_key.is_empty() {
        return Err("pusher needs --public-key (the app key of /app/{key})".into());
    }
    if c.target == Kind::Pusher && c.token.is_some() {
        return Err("pusher: --token is not supported (public channels only)".into());
    }
    if publish == PublishApi::Native && c.secret_key.is_empty() {
        return Err("--publish native needs --secret-key sk_...".into());
    }
    if publish == PublishApi::Pusher && (c.app_id.is_empty() || c.app_secret.is_empty()) {
        return Err(
            "--publish pusher needs --app-id and --app-secret (or LOADTEST_APP_ID / LOADTEST_APP_SECRET)"
                .into(),
        );
    }
    let nanos = stats::unix_ns();
    Ok(Target {
        kind: c.target,
        endpoint,
        publish_endpoint,
        secret_key: c.secret_key.clone(),
        public_key: c.public_key.clone(),
        tag: c.tag.clone().unwrap_or_else(|| {
            format!("{:x}", (nanos / 1000) ^ u64::from(std::process::id()) << 20)
                .chars()
                .rev()
                .take(8)
                .collect()
        }),
        channel_prefix: c.channel_prefix.clone(),
        token: c.token.clone(),
        publish,
        app_id: c.app_id.clone(),
        app_secret: c.app_secret.clone(),
        idempotency_keys: c.idempotency_keys,
        tls,
        publish_tls,
    })
}
