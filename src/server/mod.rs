//! Start-up, the worker threads, and graceful shutdown.
//!
//! Order at start: configuration → TLS certificate and key (if configured; a bad file
//! stops the start here, before the store is opened or anything listens) → key store →
//! key snapshot → mailboxes → listeners
//! (worker 0 binds first so that port 0 resolves to one port that every other worker
//! then shares through SO_REUSEPORT) → the key watcher → one pinned worker thread per
//! core. If io_uring cannot be used, every worker runs monoio's epoll driver instead and
//! this is logged once.
//!
//! Logs (tracing, `log_format` text or json, `RUST_LOG` or `log_level`): one start line
//! with the version, listen address, workers, driver, store and cluster; warnings for
//! faults (Redis lost and back, a worker thread gone, slow-consumer closes summed per
//! [`SLOW_CONSUMER_LOG_INTERVAL`], never one line per close). No line holds a key, token
//! or Redis password. A refused start in json format is one JSON error line; in text
//! format it is the binary's one `error: ...` line.
//!
//! Metrics (`metrics_listen`): every worker's counters are kept whatever the setting
//! (each worker's own block, see `crate::metrics`); the listener ([`metrics_http`]) and
//! the publish-duration clock reads only run when an address is configured.
//!
//! Shutdown (SIGTERM/SIGINT): publishes get 503 at once, every worker receives a
//! Shutdown envelope behind the broadcasts already queued (so those are delivered),
//! stops accepting, closes its WebSockets with 1001 spread over `drain_spread_s`
//! (`crate::admission::drain`), and the process exits 0 within `drain_spread_s` plus
//! `shutdown_grace_ms` plus one second.

mod alloc;
pub(crate) mod fault;
pub(crate) mod metrics_http;
pub(crate) mod worker;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::auth::KeyCache;
use crate::cli::{Cli, LogFormat, ServeArgs};
use crate::config::{redact_url, Config};
use crate::metrics::Metrics;
use crate::sealed::MasterKey;
use crate::shard::mailbox::{Envelope, Mailboxes};

use crate::node::Node;

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot listen for metrics on {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsConfigError),
}

/// The TLS configuration named by `config`, if any.
fn load_tls(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>, ServeError> {
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(crate::tls::load_server_config(cert, key)?)),
        // `Config::validate` rejects one without the other.
        _ => Ok(None),
    }
}

/// How often slow-consumer closes are summed into one warning.
pub(crate) const SLOW_CONSUMER_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The start failed and the failure was already logged (json format): the binary exits
/// non-zero without printing it again.
#[derive(Debug, thiserror::Error)]
#[error("the start was refused (logged)")]
pub struct AlreadyLogged;

/// Logs on stderr: `RUST_LOG` if set and valid, else `level`.
fn init_tracing(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => {
            // A panic is a log line too (one JSON object), not the default hook's text;
            // it still ends the process, as the binary's own hook does.
            std::panic::set_hook(Box::new(|info| {
                let thread = std::thread::current();
                tracing::error!(
                    thread = thread.name().unwrap_or("unnamed"),
                    panic = %info,
                    "a thread panicked"
                );
                std::process::abort();
            }));
            builder
                .json()
                .with_current_span(false)
                .with_span_list(false)
                .try_init()
        }
    };
}

/// A line for stdout: the text itself, or in json format one object shaped as the log
/// lines (`timestamp`, `level`, `fields`, `target`), so every line the server prints
/// parses as JSON.
fn stdout_line(format: LogFormat, text: &str, fields: serde_json::Value) -> String {
    match format {
        LogFormat::Text => text.to_string(),
        LogFormat::Json => serde_json::json!({
            "timestamp": rfc3339_utc(std::time::SystemTime::now()),
            "level": "INFO",
            "fields": fields,
            "target": "ringcast::server",
        })
        .to_string(),
    }
}

/// `2026-01-02T03:04:05.678901Z` (UTC), as tracing's json lines stamp theirs.
fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Bind one SO_REUSEPORT listener.
pub(crate) fn bind_listener(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let make = || -> std::io::Result<TcpListener> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        socket.listen(4096)?;
        Ok(socket.into())
    };
    make().map_err(|source| ServeError::Bind { addr, source })
}

/// `ringcast serve`. A refused start is logged as one line (see the module doc).
pub fn run_cli(cli: &Cli, args: &ServeArgs) -> anyhow::Result<()> {
    let mut config = match Config::load(
        args,
        &cli.data_dir,
        cli.redis.as_deref(),
        cli.master_key_file.as_deref(),
    ) {
        Ok(config) => config,
        Err(e) => {
            let format = args.log_format.unwrap_or_default();
            init_tracing(format, "info");
            return Err(refused(format, e.into()));
        }
    };
    if cli.redis_ca_file.is_some() {
        config.redis_ca_file = cli.redis_ca_file.clone();
    }
    init_tracing(config.log_format, &config.log_level);
    let format = config.log_format;
    start(args, config).map_err(|e| refused(format, e))
}

/// Report a refused start: json logs get it as an error event (and the binary prints
/// nothing more); text logs leave it to the binary's one `error: ...` line.
fn refused(format: LogFormat, e: anyhow::Error) -> anyhow::Error {
    match format {
        LogFormat::Text => e,
        LogFormat::Json => {
            tracing::error!(error = %format!("{e:#}"), "start refused");
            anyhow::Error::new(AlreadyLogged)
        }
    }
}

fn start(args: &ServeArgs, config: Config) -> anyhow::Result<()> {
    let tls = load_tls(&config)?;
    // Node-wide: every worker shares a message's one compressed frame.
    crate::ws::deflate::configure(config.ws_compression_min_bytes);
    crate::cluster::inbound::configure_replay_cache(config.replay_cache_bytes);
    let mut store = crate::store::open_store(
        &config.data_dir,
        config.redis.as_deref(),
        config.redis_ca_file.as_deref(),
    )
    .with_context(|| format!("cannot open the key store in {}", config.data_dir.display()))?;
    // The master key before anything listens: a wrong or missing one stops the start.
    let master = MasterKey::load(
        config.master_key_file.as_deref(),
        &config.data_dir,
        config.redis.is_some(),
    )?;
    if args.dev {
        let rate = crate::quota::RateLimit::parse(&config.default_rate_limit)?;
        if let Some(dev) = crate::admin::dev_bootstrap_with(&mut *store, rate, &master)? {
            let project = &dev.project;
            let line = serde_json::json!({
                "dev_project": {
                    "id": project.id,
                    "name": project.name,
                    "rate_limit": project.rate_limit.to_string(),
                    "pusher_app_id": project.pusher_app_id.to_string(),
                },
                "secret_key": dev.secret_key,
                "public_key": dev.public_key,
                "token_secret": dev.token_secret,
            });
            println!("{line}");
        }
    }
    let keys = KeyCache::with_master(master);
    let unopened = keys.rebuild(store.load_all()?);
    if unopened > 0 {
        anyhow::bail!(
            "{unopened} stored token secrets do not open with this master key: give every node (and the admin CLI) the same master_key_file"
        );
    }
    serve(config, tls, store, keys)
}

fn serve(
    config: Config,
    tls: Option<Arc<rustls::ServerConfig>>,
    store: Box<dyn crate::store::Store>,
    keys: Arc<KeyCache>,
) -> anyhow::Result<()> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let workers = config.workers.max(1);
    let mailboxes = Mailboxes::new(workers, config.mailbox_capacity);
    let metrics = Arc::new(Metrics::new(workers));
    let metrics_timing = config.metrics_listen.is_some();
    let db_ok = Arc::new(AtomicBool::new(true));
    let listen = config.listen;

    let first = bind_listener(listen)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..workers {
        listeners.push(bind_listener(addr)?);
    }

    // Cluster mode: the bridge threads start now and connect in the background (a Redis
    // that is down at this instant only makes health degraded until it answers).
    let (cluster, cluster_threads) = match config.redis.as_deref() {
        Some(url) => {
            let ca = config.redis_ca_file.as_deref();
            let (cluster, threads) =
                crate::cluster::Cluster::start(url, ca, keys.clone(), mailboxes.clone())?;
            (Some(cluster), threads)
        }
        None => (None, Vec::new()),
    };
    let config_history_max = config.history_max_bytes;
    let connect_rate = crate::quota::connect_rate::ConnectRate::new(config.ws_connect_rate_per_ip);
    let config_upgrades = config.max_upgrades_per_second;
    let trusted = crate::admission::trusted::TrustedProxies::parse(&config.trusted_proxies)
        .map_err(|e| anyhow::anyhow!("trusted_proxies: {e}"))?;
    // Webhooks first: the presence hub reports its transitions to them.
    let webhooks = crate::webhook::Webhooks::start(&config, keys.clone());
    let transitions: Arc<dyn crate::presence::Transitions> = webhooks.clone();
    // The presence hub shares the bridge's node id: its relayed frames carry it, so the
    // bridge skips this node's own.
    let presence_cluster = match (&cluster, config.redis.as_deref()) {
        (Some(c), Some(url)) => Some(crate::presence::remote::Setup {
            client: crate::redis_link::client(url, config.redis_ca_file.as_deref())?,
            node_id: c.node_id(),
            keys: keys.clone(),
        }),
        _ => None,
    };
    let presence = crate::presence::Hub::start(
        mailboxes.clone(),
        config.max_presence_members,
        Some(transitions),
        presence_cluster,
    )?;
    let history = Arc::new(crate::history::History::new(
        config_history_max,
        if cluster.is_some() {
            crate::history::Recoveries::Refused
        } else {
            crate::history::Recoveries::Allowed
        },
    ));
    // History's one seam, chosen here once: Redis in cluster mode, else this node's.
    let backend: Arc<dyn crate::history::backend::Backend> = match &cluster {
        Some(c) => c.clone(),
        None => history.clone(),
    };
    let shared = Arc::new(Node {
        presence,
        config,
        keys: keys.clone(),
        mailboxes: mailboxes.clone(),
        cluster: cluster.clone(),
        shutting_down: AtomicBool::new(false),
        db_ok: db_ok.clone(),
        history,
        backend,
        metrics_timing,
        connect_rate,
        upgrades: crate::admission::upgrades::UpgradeBucket::new(config_upgrades),
        trusted,
        webhooks,
    });
    let metrics_addr = match shared.config.metrics_listen {
        Some(addr) => Some(metrics_http::spawn(addr, metrics.clone(), shared.clone())?),
        None => None,
    };

    let fault = fault::Fault::from_env();
    let stop_watcher = Arc::new(AtomicBool::new(false));
    let notify = mailboxes.clone();
    let on_end = crate::cluster::users::on_end(mailboxes.clone(), keys.clone());
    let watcher = crate::auth::spawn_watcher(
        store,
        keys,
        Duration::from_millis(shared.config.key_refresh_ms),
        Box::new(move || {
            fault.on_key_change();
            notify.control(|| Envelope::KeysChanged)
        }),
        on_end,
        db_ok,
        stop_watcher.clone(),
    )?;

    let force_epoll = std::env::var_os("RINGCAST_FORCE_EPOLL").is_some_and(|v| v == "1");
    let uring = !force_epoll && worker::uring_available();
    if !uring {
        tracing::warn!("io_uring is not available; running on the epoll driver");
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let mut threads = Vec::with_capacity(workers);
    for (index, listener) in listeners.into_iter().enumerate() {
        let Some(mailbox) = mailboxes.get(index) else {
            continue;
        };
        let setup = worker::WorkerSetup {
            index,
            node: shared.clone(),
            listener,
            mailbox,
            tls: tls.clone(),
            core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
            uring,
            metrics: metrics.worker(index),
            fault,
        };
        let handle = std::thread::Builder::new()
            .name(format!("ringcast-w{index}"))
            .spawn(move || {
                if let Err(e) = worker::run(setup) {
                    tracing::error!(worker = index, error = %e, "worker stopped");
                }
            })
            .map_err(ServeError::Thread)?;
        threads.push(handle);
    }

    let driver = if uring { "io_uring" } else { "epoll" };
    let cfg = &shared.config;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %format!("{scheme}://{addr}"),
        workers,
        driver,
        store = if cfg.redis.is_some() { "redis" } else { "sqlite" },
        data_dir = %cfg.data_dir.display(),
        cluster = %cfg.redis.as_deref().map_or_else(|| "off".to_string(), redact_url),
        metrics = %metrics_addr.map_or_else(|| "off".to_string(), |a| format!("http://{a}/metrics")),
        "ringcast started"
    );
    // The lines tests and scripts wait for: the metrics address first (when on), then
    // the listening line, last, once everything is up. In json format each is one JSON
    // object shaped as a log line, the same text in `fields.message`.
    let mut stdout = std::io::stdout();
    if let Some(a) = metrics_addr {
        let url = format!("http://{a}/metrics");
        let message = format!("ringcast metrics on {url}");
        let fields = serde_json::json!({ "message": message, "metrics": url });
        let _ = writeln!(stdout, "{}", stdout_line(cfg.log_format, &message, fields));
    }
    let listen = format!("{scheme}://{addr}");
    let message = format!("ringcast listening on {listen} ({workers} workers, {driver})");
    let fields = serde_json::json!({
        "message": message, "listen": listen, "workers": workers, "driver": driver,
    });
    let _ = writeln!(stdout, "{}", stdout_line(cfg.log_format, &message, fields));
    let _ = stdout.flush();

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    // Every thread here runs until shutdown. One that ends before (a worker whose
    // runtime returned, the key watcher, a cluster bridge thread) leaves the node unable
    // to keep its promises: stop, and exit non-zero so a supervisor restarts the process.
    // (A panic never gets here: the binary's panic hook aborts the process.)
    let mut failed: Option<String> = None;
    let mut slow_seen = 0u64;
    let mut next_summary = Instant::now() + SLOW_CONSUMER_LOG_INTERVAL;
    'wait: loop {
        if signals.pending().next().is_some() {
            break 'wait;
        }
        let control = std::iter::once(&watcher).chain(cluster_threads.iter());
        if let Some(t) = threads.iter().chain(control).find(|t| t.is_finished()) {
            let name = t.thread().name().unwrap_or("unnamed").to_string();
            tracing::error!(thread = %name, "a thread ended unexpectedly; shutting down");
            failed = Some(name);
            break 'wait;
        }
        if Instant::now() >= next_summary {
            next_summary += SLOW_CONSUMER_LOG_INTERVAL;
            let total = metrics.slow_consumer_closes();
            if total > slow_seen {
                tracing::warn!(
                    closed = total - slow_seen,
                    interval_s = SLOW_CONSUMER_LOG_INTERVAL.as_secs(),
                    "slow consumers closed with 4008 (send backlog over send_backlog_bytes)"
                );
            }
            slow_seen = total;
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    tracing::info!("shutting down");
    shared.shutting_down.store(true, Ordering::SeqCst);
    mailboxes.control(|| Envelope::Shutdown);
    // The closes are spread over `drain_spread_s`, then the grace (docs/production.md, "Admission").
    let deadline = Instant::now()
        + Duration::from_secs(shared.config.drain_spread_s)
        + Duration::from_millis(shared.config.shutdown_grace_ms + 500);
    while Instant::now() < deadline && !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop_watcher.store(true, Ordering::SeqCst);
    // The workers' leaves are queued before this: members go before the lease does.
    shared.presence.stop(Duration::from_secs(2));
    if let Some(cluster) = &cluster {
        cluster.stop();
    }
    for t in threads {
        if t.is_finished() {
            let _ = t.join();
        }
    }
    let _ = watcher;
    match failed {
        Some(name) => Err(anyhow::anyhow!("thread {name} ended unexpectedly")),
        None => Ok(()),
    }
}
