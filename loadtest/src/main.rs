//! `loadtest`: the load-test harness of ringcast (and of Nchan as a peer).
//!
//! Layout:
//! - `main.rs`: the command line, the scenarios (publish, fanout, idle, soak, floor),
//!   progress, and the report (one JSON line on stdout, a short table on stderr).
//! - `subs.rs` subscriber threads (mio loops over many `WsConn`s), `wsconn.rs` one
//!   WebSocket client connection, `ws.rs` the frame codec.
//! - `publisher.rs` keep-alive HTTP publishers, `http.rs` the response parser.
//! - `target.rs` ringcast and Nchan adapters, `net.rs` loopback-only sockets,
//!   `stats.rs` histograms and /proc readings, `floor.rs` the kernel floor.
//!
//! Invariants: only loopback targets; every phase is bounded in time; the harness's
//! own CPU is always reported beside the server's so a reader can tell which one was
//! the bottleneck.

mod floor;
mod http;
mod net;
mod publisher;
mod ramp;
mod stats;
mod subs;
mod target;
mod trend;
mod ws;
mod wsconn;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use stats::{sample_pids, self_cpu_s, summarize, ProcSample};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use target::{Kind, Target};

#[derive(Parser)]
#[command(
    name = "loadtest",
    about = "Load-test harness for ringcast and Nchan (loopback only)"
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Args, Clone)]
struct Common {
    /// Which server speaks at --url.
    #[arg(long, value_enum, default_value = "ringcast", global = true)]
    target: Kind,
    /// Base URL of the server; must be loopback.
    #[arg(long, default_value = "http://127.0.0.1:8080", global = true)]
    url: String,
    /// Publish to this URL instead of --url (loopback only): subscribers stay on --url.
    /// For cluster runs: subscribe on one node, publish on another.
    #[arg(long, global = true)]
    publish_url: Option<String>,
    /// ringcast secret key for publishing (sk_...).
    #[arg(long, env = "LOADTEST_SECRET_KEY", default_value = "", global = true)]
    secret_key: String,
    /// ringcast public key for subscribing (pk_...).
    #[arg(long, env = "LOADTEST_PUBLIC_KEY", default_value = "", global = true)]
    public_key: String,
    /// Server process id(s) to read CPU, RSS and fds from (repeat for nginx workers).
    #[arg(long = "server-pid", global = true)]
    server_pids: Vec<u32>,
    /// Loopback source addresses to spread connections over (127.0.0.1..N), for >28k.
    #[arg(long, default_value_t = 1, global = true)]
    source_ips: usize,
    /// Subscriber threads (each one epoll loop).
    #[arg(long, default_value_t = 2, global = true)]
    threads: usize,
    /// Free-form label copied into the JSON line (scenario name, repetition).
    #[arg(long, default_value = "", global = true)]
    label: String,
    /// No progress lines on stderr.
    #[arg(long, global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Mode {
    /// M keep-alive connections posting as fast as possible (or at --rate).
    Publish {
        #[arg(long, default_value_t = 64)]
        conns: usize,
        /// Total publishes per second; default: as fast as responses come back.
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Requests in flight per connection (HTTP/1.1 pipelining).
        #[arg(long, default_value_t = 1)]
        pipeline: usize,
        #[arg(long, default_value_t = 1)]
        channels: u32,
        /// Publisher threads.
        #[arg(long, default_value_t = 1)]
        pub_threads: usize,
        #[arg(long, default_value_t = 0)]
        pad: usize,
    },
    /// N WebSocket subscribers over K channels, publishers at rate R for D seconds.
    Fanout {
        #[arg(long, default_value_t = 1000)]
        subs: usize,
        #[arg(long, default_value_t = 1)]
        channels: u32,
        /// Total publishes per second.
        #[arg(long, default_value_t = 10.0)]
        rate: f64,
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        #[arg(long, default_value_t = 4)]
        pub_conns: usize,
        #[arg(long, default_value_t = 1)]
        pub_threads: usize,
        /// Seconds to wait for late deliveries after the last publish.
        #[arg(long, default_value_t = 5.0)]
        drain: f64,
        #[arg(long, default_value_t = 60.0)]
        connect_timeout: f64,
        /// Handshakes in flight per subscriber thread.
        #[arg(long, default_value_t = 256)]
        inflight: usize,
        #[arg(long, default_value_t = 0)]
        pad: usize,
    },
    /// Fan-out with the rate raised step by step (double, then bisect) until p99 >
    /// --p99-limit-ms or anything is lost; reports the highest passing rate.
    Ramp {
        #[arg(long, default_value_t = 10000)]
        subs: usize,
        #[arg(long, default_value_t = 1)]
        channels: u32,
        /// Publishes per second of the first step.
        #[arg(long, default_value_t = 1.0)]
        start_rate: f64,
        #[arg(long, default_value_t = 0.1)]
        min_rate: f64,
        #[arg(long, default_value_t = 100000.0)]
        max_rate: f64,
        /// Seconds of publishing per step.
        #[arg(long, default_value_t = 5.0)]
        step_duration: f64,
        /// Seconds to wait for late deliveries after each step's last publish.
        #[arg(long, default_value_t = 3.0)]
        drain: f64,
        #[arg(long, default_value_t = 250.0)]
        p99_limit_ms: f64,
        /// Bisection stops when the lowest failing rate is within this fraction of the best pass.
        #[arg(long, default_value_t = 0.1)]
        tolerance: f64,
        #[arg(long, default_value_t = 12)]
        max_steps: usize,
        /// Seconds of pause between steps (closed connections settle).
        #[arg(long, default_value_t = 2.0)]
        pause: f64,
        #[arg(long, default_value_t = 8)]
        pub_conns: usize,
        #[arg(long, default_value_t = 60.0)]
        connect_timeout: f64,
        #[arg(long, default_value_t = 256)]
        inflight: usize,
    },
    /// Open N WebSocket connections, hold them, report server RSS per connection.
    Idle {
        #[arg(long, default_value_t = 10000)]
        conns: usize,
        /// Seconds to hold all connections before the RSS reading.
        #[arg(long, default_value_t = 5.0)]
        hold: f64,
        /// Channels the connections subscribe to (0: connect only, no subscription).
        #[arg(long, default_value_t = 1)]
        channels: u32,
        #[arg(long, default_value_t = 60.0)]
        connect_timeout: f64,
        #[arg(long, default_value_t = 256)]
        inflight: usize,
    },
    /// Churn for a long run; server RSS and fds sampled every --sample-every seconds.
    Soak {
        #[arg(long, default_value_t = 2000)]
        conns: usize,
        #[arg(long, default_value_t = 100)]
        channels: u32,
        #[arg(long, default_value_t = 200.0)]
        rate: f64,
        #[arg(long, default_value_t = 1800.0)]
        duration: f64,
        #[arg(long, default_value_t = 10.0)]
        sample_every: f64,
        /// Samples before this many seconds are left out of the slope.
        #[arg(long, default_value_t = 60.0)]
        warmup: f64,
        #[arg(long, default_value_t = 5.0)]
        min_life: f64,
        #[arg(long, default_value_t = 60.0)]
        max_life: f64,
        #[arg(long, default_value_t = 5.0)]
        flip_every: f64,
        /// Publishes carry 0..=pad filler bytes (mixed sizes).
        #[arg(long, default_value_t = 2000)]
        pad: usize,
    },
    /// The kernel floor: one pre-encoded frame written to N loopback sockets.
    Floor {
        #[arg(long, default_value_t = 1000)]
        sockets: usize,
        #[arg(long, default_value_t = 3.0)]
        duration: f64,
        #[arg(long, default_value_t = 150)]
        frame_bytes: usize,
        /// Sends per io_uring submission, and frames per write in `coalesce`.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Comma-separated: write, uring, coalesce.
        #[arg(long, default_value = "write,uring,coalesce")]
        variants: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let nofile = net::raise_nofile();
    let result = match &cli.mode {
        Mode::Floor {
            sockets,
            duration,
            frame_bytes,
            batch,
            variants,
        } => run_floor(
            &cli.common,
            &floor::FloorOpts {
                sockets: *sockets,
                duration: secs(*duration),
                frame_bytes: *frame_bytes,
                batch: *batch,
                variants: variants.split(',').map(|s| s.trim().to_string()).collect(),
            },
        ),
        mode => make_target(&cli.common).and_then(|t| match mode {
            Mode::Publish {
                conns,
                rate,
                duration,
                pipeline,
                channels,
                pub_threads,
                pad,
            } => run_publish(
                &cli.common,
                &t,
                PublishArgs {
                    conns: *conns,
                    rate: *rate,
                    duration: *duration,
                    pipeline: *pipeline,
                    channels: *channels,
                    pub_threads: *pub_threads,
                    pad: *pad,
                },
            ),
            Mode::Fanout {
                subs,
                channels,
                rate,
                duration,
                pub_conns,
                pub_threads,
                drain,
                connect_timeout,
                inflight,
                pad,
            } => run_fanout(
                &cli.common,
                &t,
                &FanoutArgs {
                    subs: *subs,
                    channels: *channels,
                    rate: *rate,
                    duration: *duration,
                    pub_conns: *pub_conns,
                    pub_threads: *pub_threads,
                    drain: *drain,
                    connect_timeout: *connect_timeout,
                    inflight: *inflight,
                    pad: *pad,
                },
            ),
            Mode::Ramp {
                subs,
                channels,
                start_rate,
                min_rate,
                max_rate,
                step_duration,
                drain,
                p99_limit_ms,
                tolerance,
                max_steps,
                pause,
                pub_conns,
                connect_timeout,
                inflight,
            } => run_ramp(
                &cli.common,
                &t,
                &RampArgs {
                    fanout: FanoutArgs {
                        subs: *subs,
                        channels: *channels,
                        rate: *start_rate,
                        duration: *step_duration,
                        pub_conns: *pub_conns,
                        pub_threads: 1,
                        drain: *drain,
                        connect_timeout: *connect_timeout,
                        inflight: *inflight,
                        pad: 0,
                    },
                    search: ramp::Search::new(
                        *start_rate,
                        *min_rate,
                        *max_rate,
                        *tolerance,
                        (*max_steps).min(40),
                    ),
                    p99_limit_ms: *p99_limit_ms,
                    pause: *pause,
                },
            ),
            Mode::Idle {
                conns,
                hold,
                channels,
                connect_timeout,
                inflight,
            } => run_idle(
                &cli.common,
                &t,
                *conns,
                *hold,
                *channels,
                *connect_timeout,
                *inflight,
            ),
            Mode::Soak {
                conns,
                channels,
                rate,
                duration,
                sample_every,
                warmup,
                min_life,
                max_life,
                flip_every,
                pad,
            } => run_soak(
                &cli.common,
                &t,
                &SoakArgs {
                    conns: *conns,
                    channels: *channels,
                    rate: *rate,
                    duration: *duration,
                    sample_every: *sample_every,
                    warmup: *warmup,
                    min_life: *min_life,
                    max_life: *max_life,
                    flip_every: *flip_every,
                    pad: *pad,
                },
            ),
            Mode::Floor { .. } => Err("unreachable".into()),
        }),
    };
    match result {
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

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.0, 86_400.0 * 7.0))
}

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn make_target(c: &Common) -> Result<Target, String> {
    let endpoint = net::parse_url(&c.url)?;
    let publish_endpoint = c.publish_url.as_deref().map(net::parse_url).transpose()?;
    if c.target == Kind::Ringcast && (c.secret_key.is_empty() || c.public_key.is_empty()) {
        return Err("ringcast needs --secret-key sk_... and --public-key pk_... (or LOADTEST_SECRET_KEY / LOADTEST_PUBLIC_KEY)".into());
    }
    let nanos = stats::unix_ns();
    Ok(Target {
        kind: c.target,
        endpoint,
        publish_endpoint,
        secret_key: c.secret_key.clone(),
        public_key: c.public_key.clone(),
        tag: format!("{:x}", (nanos / 1000) ^ u64::from(std::process::id()) << 20)
            .chars()
            .rev()
            .take(8)
            .collect(),
    })
}

/// CPU and memory readings of the harness and the server at one instant.
#[derive(Clone, Copy)]
struct Snapshot {
    at: Instant,
    self_cpu: f64,
    server: ProcSample,
    missing: usize,
}

fn snapshot(c: &Common) -> Snapshot {
    let (server, missing) = sample_pids(&c.server_pids);
    Snapshot {
        at: Instant::now(),
        self_cpu: self_cpu_s(),
        server,
        missing,
    }
}

/// CPU figures over [a, b]; `per` is the unit count (deliveries, publishes).
fn cpu_json(c: &Common, a: &Snapshot, b: &Snapshot, per: u64, per_name: &str) -> Value {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    let mut v = json!({
        "window_s": r3(wall),
        "harness_cpu_s": r3(b.self_cpu - a.self_cpu),
        "harness_cpu_pct": r1(100.0 * (b.self_cpu - a.self_cpu) / wall.max(1e-9)),
    });
    if !c.server_pids.is_empty() {
        let scpu = b.server.cpu_s - a.server.cpu_s;
        v["server_cpu_s"] = json!(r3(scpu));
        v["server_cpu_pct"] = json!(r1(100.0 * scpu / wall.max(1e-9)));
        v["server_rss_bytes"] = json!(b.server.rss_bytes);
        v["server_fds"] = json!(b.server.fds);
        v["server_pids_missing"] = json!(b.missing.max(a.missing));
        if per > 0 {
            v[format!("server_cpu_us_per_{per_name}")] = json!(r3(scpu * 1e6 / per as f64));
        }
    }
    v
}

fn progress(c: &Common, mode: &str, start: Instant, line: String) {
    if !c.quiet {
        eprintln!("[{mode} {:>5.1}s] {line}", start.elapsed().as_secs_f64());
    }
}

fn table(rows: &[(&str, String)]) {
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (k, v) in rows {
        eprintln!("  {k:<w$}  {v}");
    }
}

// ---------------------------------------------------------------- subscribers

struct SubRun {
    shared: Arc<subs::Shared>,
    handles: Vec<std::thread::JoinHandle<subs::SubResult>>,
    total: usize,
}

#[allow(clippy::too_many_arguments)]
fn start_subscribers(
    c: &Common,
    t: &Target,
    n: usize,
    channels: u32,
    inflight: usize,
    connect_timeout: f64,
    hard_deadline: Instant,
    churn: Option<subs::Churn>,
) -> SubRun {
    let shared = Arc::new(subs::Shared::default());
    let threads = c.threads.clamp(1, 64);
    let mut handles = Vec::new();
    for th in 0..threads {
        let conns: Vec<(usize, u32)> = (th..n)
            .step_by(threads)
            .map(|i| {
                (
                    i,
                    if channels == 0 {
                        0
                    } else {
                        (i % channels as usize) as u32
                    },
                )
            })
            .collect();
        let plan = subs::SubPlan {
            target: t.clone(),
            // channels == 0: connect-only idle connections, no subscribe frames.
            subscribe: channels > 0,
            conns,
            source_ips: c.source_ips,
            max_inflight: inflight.max(1),
            connect_timeout: secs(connect_timeout),
            hard_deadline,
            churn,
        };
        let sh = shared.clone();
        handles.push(std::thread::spawn(move || subs::run(plan, sh)));
    }
    SubRun {
        shared,
        handles,
        total: n,
    }
}

/// Wait until every subscriber is ready or failed (bounded by `timeout`).
fn wait_ready(c: &Common, mode: &str, run: &SubRun, timeout: f64) -> Duration {
    let start = Instant::now();
    let deadline = start + secs(timeout + 1.0);
    let mut last = Instant::now();
    loop {
        let ready = run.shared.ready.load(Relaxed);
        let failed = run.shared.failed.load(Relaxed);
        if ready + failed >= run.total as u64 || Instant::now() >= deadline {
            return start.elapsed();
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            progress(
                c,
                mode,
                start,
                format!("connecting: ready {ready}/{} failed {failed}", run.total),
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct SubTotals {
    latency: hdrhistogram::Histogram<u64>,
    connect: hdrhistogram::Histogram<u64>,
    received: u64,
    duplicates: u64,
    untracked: u64,
    ready_per_channel: BTreeMap<u32, u64>,
    json: Value,
}

fn join_subscribers(run: SubRun) -> SubTotals {
    run.shared.stop.store(true, Relaxed);
    let mut t = SubTotals {
        latency: stats::new_histogram(),
        connect: stats::new_histogram(),
        received: 0,
        duplicates: 0,
        untracked: 0,
        ready_per_channel: BTreeMap::new(),
        json: json!({}),
    };
    let mut closes: BTreeMap<String, u64> = BTreeMap::new();
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let (mut server_errors, mut fragmented, mut opened) = (0, 0, 0);
    for h in run.handles {
        let Ok(r) = h.join() else {
            *failures
                .entry("subscriber thread panicked".into())
                .or_default() += 1;
            continue;
        };
        let _ = t.latency.add(&r.latency);
        let _ = t.connect.add(&r.connect);
        t.received += r.received;
        t.duplicates += r.duplicates;
        t.untracked += r.untracked;
        for (k, v) in r.ready_per_channel {
            *t.ready_per_channel.entry(k).or_default() += v;
        }
        for (k, v) in r.close_codes {
            *closes.entry(k.to_string()).or_default() += v;
        }
        for (k, v) in r.refused {
            *refused.entry(k.to_string()).or_default() += v;
        }
        for (k, v) in r.failures {
            *failures.entry(k.to_string()).or_default() += v;
        }
        server_errors += r.server_errors;
        fragmented += r.fragmented;
        opened += r.opened;
    }
    t.json = json!({
        "close_codes": closes, "refused_status": refused, "failures": failures,
        "server_error_frames": server_errors, "fragmented": fragmented, "opened": opened,
    });
    t
}

// ---------------------------------------------------------------- publishers

struct PubRun {
    shared: Arc<publisher::PubShared>,
    handles: Vec<std::thread::JoinHandle<publisher::PubResult>>,
}

#[allow(clippy::too_many_arguments)]
fn start_publishers(
    c: &Common,
    t: &Target,
    conns: usize,
    threads: usize,
    rate: Option<f64>,
    duration: f64,
    channels: u32,
    pipeline: usize,
    pad: usize,
    pad_vary: bool,
) -> PubRun {
    let shared = Arc::new(publisher::PubShared::default());
    let threads = threads.clamp(1, 64);
    let handles = (0..threads)
        .map(|i| {
            let plan = publisher::PubPlan {
                target: t.for_publishers(),
                conns: (conns / threads + usize::from(i < conns % threads)).max(1),
                rate: rate.map(|r| r / threads as f64),
                duration: secs(duration),
                channels: channels.max(1),
                thread_idx: i,
                threads,
                pipeline,
                pad,
                pad_vary,
                source_ips: c.source_ips,
                answer_grace: Duration::from_secs(5),
            };
            let sh = shared.clone();
            std::thread::spawn(move || publisher::run(plan, sh))
        })
        .collect();
    PubRun { shared, handles }
}

struct PubTotals {
    statuses: BTreeMap<u16, u64>,
    accepted_per_channel: Vec<u64>,
    accepted: u64,
    sent: u64,
    unanswered: u64,
    response: hdrhistogram::Histogram<u64>,
    max_lag: Duration,
    elapsed: Duration,
    json: Value,
}

fn join_publishers(run: PubRun, channels: u32) -> PubTotals {
    let mut t = PubTotals {
        statuses: BTreeMap::new(),
        accepted_per_channel: vec![0; channels.max(1) as usize],
        accepted: 0,
        sent: 0,
        unanswered: 0,
        response: stats::new_histogram(),
        max_lag: Duration::ZERO,
        elapsed: Duration::ZERO,
        json: json!({}),
    };
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for h in run.handles {
        let Ok(r) = h.join() else {
            *errors
                .entry("publisher thread panicked".into())
                .or_default() += 1;
            continue;
        };
        for (k, v) in r.statuses {
            *t.statuses.entry(k).or_default() += v;
        }
        for (i, a) in r.accepted_per_channel.iter().enumerate() {
            if let Some(x) = t.accepted_per_channel.get_mut(i) {
                *x += a;
            }
        }
        t.sent += r.sent;
        t.unanswered += r.unanswered;
        let _ = t.response.add(&r.response);
        t.max_lag = t.max_lag.max(r.max_lag);
        t.elapsed = t.elapsed.max(r.elapsed);
        for (k, v) in r.conn_errors {
            *errors.entry(k.to_string()).or_default() += v;
        }
    }
    t.accepted = t.accepted_per_channel.iter().sum();
    let mut classes = BTreeMap::from([
        ("202", 0u64),
        ("2xx_other", 0),
        ("429", 0),
        ("503", 0),
        ("other", 0),
    ]);
    for (&s, &n) in &t.statuses {
        let k = match s {
            202 => "202",
            // Nchan answers 201 (delivered) or 202 (queued, no subscriber).
            200..=299 => "2xx_other",
            429 => "429",
            503 => "503",
            _ => "other",
        };
        *classes.entry(k).or_default() += n;
    }
    let statuses: BTreeMap<String, u64> = t
        .statuses
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    t.json = json!({
        "sent": t.sent, "accepted_2xx": t.accepted, "unanswered": t.unanswered,
        "status": classes, "status_exact": statuses, "conn_errors": errors,
        "max_schedule_lag_ms": r1(t.max_lag.as_secs_f64() * 1000.0),
        "response_latency": summarize(&t.response).to_json(),
    });
    t
}

// ---------------------------------------------------------------- modes

struct PublishArgs {
    conns: usize,
    rate: Option<f64>,
    duration: f64,
    pipeline: usize,
    channels: u32,
    pub_threads: usize,
    pad: usize,
}

fn run_publish(c: &Common, t: &Target, a: PublishArgs) -> Result<Value, String> {
    let start = Instant::now();
    let s0 = snapshot(c);
    let run = start_publishers(
        c,
        t,
        a.conns,
        a.pub_threads,
        a.rate,
        a.duration,
        a.channels,
        a.pipeline,
        a.pad,
        false,
    );
    let mut last = (Instant::now(), 0u64);
    // Bounded: publishers end at their deadline plus a grace period.
    while run.handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if last.0.elapsed() >= Duration::from_secs(1) {
            let acc = run.shared.accepted.load(Relaxed);
            let rate = (acc - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), acc);
            progress(
                c,
                "publish",
                start,
                format!(
                    "sent {} accepted {acc} ({rate:.0}/s)",
                    run.shared.sent.load(Relaxed)
                ),
            );
        }
    }
    let s1 = snapshot(c);
    let p = join_publishers(run, a.channels);
    let secs_run = p.elapsed.as_secs_f64().max(1e-9);
    let mut v = json!({
        "mode": "publish", "target": t.kind.name(),
        "params": {"conns": a.conns, "rate": a.rate, "duration_s": a.duration, "pipeline": a.pipeline,
                   "channels": a.channels, "pub_threads": a.pub_threads, "pad": a.pad},
        "publish": p.json,
        "requests_per_s": (p.statuses.values().sum::<u64>() as f64 / secs_run).round(),
        "accepted_per_s": (p.accepted as f64 / secs_run).round(),
        "cpu": cpu_json(c, &s0, &s1, p.accepted, "accepted_publish"),
    });
    v["ok"] = json!(p.accepted > 0);
    eprintln!(
        "publish against {} ({} conns, {:.0}s):",
        t.kind.name(),
        a.conns,
        a.duration
    );
    table(&[
        ("requests/s", v["requests_per_s"].to_string()),
        ("accepted (2xx)", p.accepted.to_string()),
        ("status", v["publish"]["status"].to_string()),
        (
            "response p50/p99 us",
            format!(
                "{} / {}",
                v["publish"]["response_latency"]["p50_us"],
                v["publish"]["response_latency"]["p99_us"]
            ),
        ),
        (
            "server CPU us/publish",
            v["cpu"]["server_cpu_us_per_accepted_publish"].to_string(),
        ),
        ("harness CPU %", v["cpu"]["harness_cpu_pct"].to_string()),
    ]);
    Ok(v)
}

struct FanoutArgs {
    subs: usize,
    channels: u32,
    rate: f64,
    duration: f64,
    pub_conns: usize,
    pub_threads: usize,
    drain: f64,
    connect_timeout: f64,
    inflight: usize,
    pad: usize,
}

fn run_fanout(c: &Common, t: &Target, a: &FanoutArgs) -> Result<Value, String> {
    let start = Instant::now();
    let channels = a.channels.max(1);
    let hard = start + secs(a.connect_timeout + a.duration + a.drain + 30.0);
    let run = start_subscribers(
        c,
        t,
        a.subs,
        channels,
        a.inflight,
        a.connect_timeout,
        hard,
        None,
    );
    let connect_time = wait_ready(c, "fanout", &run, a.connect_timeout);
    let ready = run.shared.ready.load(Relaxed);
    progress(
        c,
        "fanout",
        start,
        format!(
            "{ready}/{} subscribers ready in {:.2}s",
            a.subs,
            connect_time.as_secs_f64()
        ),
    );

    let s0 = snapshot(c);
    let pubs = start_publishers(
        c,
        t,
        a.pub_conns,
        a.pub_threads,
        Some(a.rate),
        a.duration,
        channels,
        1,
        a.pad,
        false,
    );
    let mut last = (Instant::now(), 0u64);
    while pubs.handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if last.0.elapsed() >= Duration::from_secs(1) {
            let rec = run.shared.received.load(Relaxed);
            let rate = (rec - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), rec);
            progress(
                c,
                "fanout",
                start,
                format!(
                    "published {} accepted {} delivered {rec} ({rate:.0}/s) closed {}",
                    pubs.shared.sent.load(Relaxed),
                    pubs.shared.accepted.load(Relaxed),
                    run.shared.closed.load(Relaxed)
                ),
            );
        }
    }
    let publish_end = Instant::now();
    let p = join_publishers(pubs, channels);

    // Expected deliveries need the per-channel ready counts, which live in the
    // threads; approximate progress with the total until the threads report.
    let expected_est: u64 = if channels == 1 {
        ready * p.accepted
    } else {
        ready * p.accepted / u64::from(channels)
    };
    let drain_deadline = Instant::now() + secs(a.drain);
    while Instant::now() < drain_deadline && run.shared.received.load(Relaxed) < expected_est {
        std::thread::sleep(Duration::from_millis(5));
    }
    let delivered_at = Instant::now();
    let s1 = snapshot(c);
    let subs_t = join_subscribers(run);
    let expected: u64 = subs_t
        .ready_per_channel
        .iter()
        .map(|(ch, n)| {
            n * p
                .accepted_per_channel
                .get(*ch as usize)
                .copied()
                .unwrap_or(0)
        })
        .sum();
    let ratio = if expected > 0 {
        subs_t.received as f64 / expected as f64
    } else {
        0.0
    };
    let deliver_window = delivered_at.duration_since(s0.at).as_secs_f64().max(1e-9);
    let lat = summarize(&subs_t.latency);
    let mut v = json!({
        "mode": "fanout", "target": t.kind.name(),
        "params": {"subs": a.subs, "channels": channels, "rate": a.rate, "duration_s": a.duration,
                   "pub_conns": a.pub_conns, "threads": c.threads, "pad": a.pad,
                   "publish_url": c.publish_url},
        "subscribers_ready": ready,
        "connect_time_s": r3(connect_time.as_secs_f64()),
        "connect_latency": summarize(&subs_t.connect).to_json(),
        "publish": p.json,
        "expected": expected, "received": subs_t.received, "duplicates": subs_t.duplicates,
        "untracked_seq": subs_t.untracked,
        "delivery_ratio": (ratio * 1e6).round() / 1e6,
        "deliveries_per_s": (subs_t.received as f64 / deliver_window).round(),
        "drain_s": r3(delivered_at.duration_since(publish_end).as_secs_f64()),
        "latency": lat.to_json(),
        "subscribers": subs_t.json,
        "cpu": cpu_json(c, &s0, &s1, subs_t.received, "delivery"),
    });
    v["ok"] = json!(expected > 0 && subs_t.received == expected && subs_t.duplicates == 0);
    eprintln!(
        "fanout against {} ({} subs, {} channels, {}/s for {}s):",
        t.kind.name(),
        a.subs,
        channels,
        a.rate,
        a.duration
    );
    table(&[
        (
            "subscribers ready",
            format!("{ready} in {:.2}s", connect_time.as_secs_f64()),
        ),
        (
            "publishes accepted",
            format!("{} of {} ({})", p.accepted, p.sent, v["publish"]["status"]),
        ),
        (
            "delivered / expected",
            format!(
                "{} / {expected} (ratio {:.6}, dup {})",
                subs_t.received, ratio, subs_t.duplicates
            ),
        ),
        ("deliveries/s", v["deliveries_per_s"].to_string()),
        (
            "latency p50/p90/p99/p99.9/max ms",
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2} / {:.2}",
                lat.p50_us / 1e3,
                lat.p90_us / 1e3,
                lat.p99_us / 1e3,
                lat.p999_us / 1e3,
                lat.max_us / 1e3
            ),
        ),
        (
            "server CPU us/delivery",
            v["cpu"]["server_cpu_us_per_delivery"].to_string(),
        ),
        ("server CPU %", v["cpu"]["server_cpu_pct"].to_string()),
        ("harness CPU %", v["cpu"]["harness_cpu_pct"].to_string()),
    ]);
    Ok(v)
}

struct RampArgs {
    /// The fanout of every step; `rate` is replaced by the search's.
    fanout: FanoutArgs,
    search: ramp::Search,
    p99_limit_ms: f64,
    pause: f64,
}

fn run_ramp(c: &Common, t: &Target, a: &RampArgs) -> Result<Value, String> {
    let start = Instant::now();
    let mut search = a.search.clone();
    let mut steps: Vec<Value> = Vec::new();
    let mut best: Option<Value> = None;
    let mut aborted: Option<String> = None;
    // Bounded: the search ends after at most max_steps (<= 40) steps.
    while let Some(rate) = search.next() {
        let mut st = t.clone();
        st.tag = format!("{}s{}", t.tag, search.steps);
        let fa = FanoutArgs { rate, ..a.fanout };
        progress(
            c,
            "ramp",
            start,
            format!(
                "step {}: {rate}/s x {} subs for {}s",
                search.steps + 1,
                fa.subs,
                fa.duration
            ),
        );
        let v = run_fanout(c, &st, &fa)?;
        if v["subscribers_ready"].as_u64() == Some(0) {
            aborted = Some(format!("step at {rate}/s: no subscriber connected"));
            break;
        }
        let (pass, why) = ramp::judge(&v, rate, fa.duration, a.p99_limit_ms);
        let step = ramp::step_json(&v, rate, fa.duration, pass, &why);
        eprintln!(
            "ramp step {}: {rate}/s {} ({}) p99 {} ms, {} deliveries/s",
            search.steps + 1,
            if pass { "PASS" } else { "FAIL" },
            if why.is_empty() { "ok" } else { why.as_str() },
            step["p99_ms"],
            step["sustained_deliveries_per_s"]
        );
        search.record(rate, pass);
        if pass
            && best
                .as_ref()
                .map_or(true, |b| b["rate"].as_f64() < Some(rate))
        {
            best = Some(step.clone());
        }
        steps.push(step);
        if search.next().is_some() {
            std::thread::sleep(secs(a.pause));
        }
    }
    let lowest_fail = steps
        .iter()
        .filter(|s| s["pass"] == json!(false))
        .min_by(|x, y| {
            x["rate"]
                .as_f64()
                .partial_cmp(&y["rate"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned();
    let f = &a.fanout;
    let mut v = json!({
        "mode": "ramp", "target": t.kind.name(),
        "params": {"subs": f.subs, "channels": f.channels, "step_duration_s": f.duration,
                   "drain_s": f.drain, "p99_limit_ms": a.p99_limit_ms, "start_rate": a.search.start,
                   "max_rate": a.search.max_rate, "tolerance": a.search.tolerance,
                   "max_steps": a.search.max_steps, "pub_conns": f.pub_conns, "threads": c.threads,
                   "publish_url": c.publish_url},
        "steps": steps,
        "best": best,
        "lowest_failure": lowest_fail,
        "best_rate": best.as_ref().map(|b| b["rate"].clone()),
        "sustained_deliveries_per_s": best.as_ref().map(|b| b["sustained_deliveries_per_s"].clone()),
        "elapsed_s": r1(start.elapsed().as_secs_f64()),
        "aborted": aborted,
    });
    v["ok"] = json!(best.is_some() && aborted.is_none());
    eprintln!(
        "ramp against {} ({} subs, {} channel(s), {}s steps):",
        t.kind.name(),
        f.subs,
        f.channels,
        f.duration
    );
    table(&[
        (
            "steps",
            v["steps"].as_array().map_or(0, Vec::len).to_string(),
        ),
        ("best rate (publishes/s)", v["best_rate"].to_string()),
        (
            "sustained deliveries/s",
            v["sustained_deliveries_per_s"].to_string(),
        ),
        (
            "best p99 ms",
            best.as_ref()
                .map_or("null".into(), |b| b["p99_ms"].to_string()),
        ),
        (
            "lowest failing rate",
            lowest_fail
                .as_ref()
                .map_or("none".into(), |l| format!("{} ({})", l["rate"], l["why"])),
        ),
    ]);
    Ok(v)
}

fn run_idle(
    c: &Common,
    t: &Target,
    conns: usize,
    hold: f64,
    channels: u32,
    connect_timeout: f64,
    inflight: usize,
) -> Result<Value, String> {
    let start = Instant::now();
    let s0 = snapshot(c);
    let hard = start + secs(connect_timeout + hold + 30.0);
    let run = start_subscribers(c, t, conns, channels, inflight, connect_timeout, hard, None);
    let connect_time = wait_ready(c, "idle", &run, connect_timeout);
    let ready = run.shared.ready.load(Relaxed);
    progress(
        c,
        "idle",
        start,
        format!(
            "{ready}/{conns} connections ready in {:.2}s; holding {hold}s",
            connect_time.as_secs_f64()
        ),
    );
    let hold_end = Instant::now() + secs(hold);
    while Instant::now() < hold_end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let s1 = snapshot(c);
    let still_open = ready - run.shared.closed.load(Relaxed).min(ready);
    let subs_t = join_subscribers(run);
    let rss_delta = s1.server.rss_bytes as i64 - s0.server.rss_bytes as i64;
    let per_conn = if still_open > 0 {
        rss_delta as f64 / still_open as f64
    } else {
        0.0
    };
    let mut v = json!({
        "mode": "idle", "target": t.kind.name(),
        "params": {"conns": conns, "hold_s": hold, "channels": channels, "threads": c.threads},
        "connections_ready": ready, "connections_open": still_open,
        "connect_time_s": r3(connect_time.as_secs_f64()),
        "connect_latency": summarize(&subs_t.connect).to_json(),
        "subscribers": subs_t.json,
        "cpu": cpu_json(c, &s0, &s1, 0, "none"),
    });
    if !c.server_pids.is_empty() {
        v["server_rss_before_bytes"] = json!(s0.server.rss_bytes);
        v["server_rss_after_bytes"] = json!(s1.server.rss_bytes);
        v["server_fds_after"] = json!(s1.server.fds);
        v["server_bytes_per_connection"] = json!(per_conn.round());
    }
    v["ok"] = json!(still_open as usize == conns);
    eprintln!("idle against {} ({conns} connections):", t.kind.name());
    table(&[
        (
            "connections open",
            format!("{still_open} (ready in {:.2}s)", connect_time.as_secs_f64()),
        ),
        (
            "server RSS before/after",
            format!("{} / {}", s0.server.rss_bytes, s1.server.rss_bytes),
        ),
        ("server bytes/connection", format!("{per_conn:.0}")),
        ("harness CPU s", v["cpu"]["harness_cpu_s"].to_string()),
    ]);
    Ok(v)
}

struct SoakArgs {
    conns: usize,
    channels: u32,
    rate: f64,
    duration: f64,
    sample_every: f64,
    warmup: f64,
    min_life: f64,
    max_life: f64,
    flip_every: f64,
    pad: usize,
}

fn run_soak(c: &Common, t: &Target, a: &SoakArgs) -> Result<Value, String> {
    let start = Instant::now();
    let channels = a.channels.max(1);
    let churn = subs::Churn {
        min_life: secs(a.min_life),
        max_life: secs(a.max_life.max(a.min_life)),
        flip_every: secs(a.flip_every.max(0.1)),
        channels,
    };
    let hard = start + secs(a.duration + 30.0);
    let s0 = snapshot(c);
    let run = start_subscribers(c, t, a.conns, channels, 256, 30.0, hard, Some(churn));
    let pubs = start_publishers(
        c,
        t,
        4,
        1,
        Some(a.rate),
        a.duration,
        channels,
        1,
        a.pad,
        true,
    );
    let mut samples: Vec<Value> = Vec::new();
    let mut points_rss: Vec<(f64, f64)> = Vec::new();
    let mut points_fds: Vec<(f64, f64)> = Vec::new();
    let every = secs(a.sample_every.max(1.0));
    let mut next_sample = Instant::now();
    let mut last_progress = Instant::now();
    let end = start + secs(a.duration);
    let mut take_sample = |samples: &mut Vec<Value>| {
        let s = snapshot(c);
        let x = start.elapsed().as_secs_f64();
        let open = run
            .shared
            .ready
            .load(Relaxed)
            .saturating_sub(run.shared.closed.load(Relaxed));
        samples.push(
            json!({"t_s": r1(x), "rss_bytes": s.server.rss_bytes, "fds": s.server.fds,
                            "open": open, "opened": run.shared.opened.load(Relaxed),
                            "flips": run.shared.flips.load(Relaxed),
                            "delivered": run.shared.received.load(Relaxed)}),
        );
        points_rss.push((x, s.server.rss_bytes as f64));
        points_fds.push((x, s.server.fds as f64));
    };
    // Bounded by the duration.
    while Instant::now() < end {
        if Instant::now() >= next_sample {
            // Skip missed ticks (a stalled machine) instead of bunching samples.
            while next_sample <= Instant::now() {
                next_sample += every;
            }
            take_sample(&mut samples);
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            progress(
                c,
                "soak",
                start,
                format!(
                    "opened {} ready {} closed {} flips {} published {} delivered {}",
                    run.shared.opened.load(Relaxed),
                    run.shared.ready.load(Relaxed),
                    run.shared.closed.load(Relaxed),
                    run.shared.flips.load(Relaxed),
                    pubs.shared.accepted.load(Relaxed),
                    run.shared.received.load(Relaxed)
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // One last sample at the end, with the churn still running.
    take_sample(&mut samples);
    let flips = run.shared.flips.load(Relaxed);
    pubs.shared.stop.store(true, Relaxed);
    let p = join_publishers(pubs, channels);
    let s1 = snapshot(c);
    let subs_t = join_subscribers(run);
    let rss_trend = trend::summary(&points_rss, a.warmup);
    let fds_trend = trend::summary(&points_fds, a.warmup);
    let rss_slope = rss_trend["slope_per_min"].as_f64();
    let mut v = json!({
        "mode": "soak", "target": t.kind.name(),
        "params": {"conns": a.conns, "channels": channels, "rate": a.rate, "duration_s": a.duration,
                   "sample_every_s": a.sample_every, "warmup_s": a.warmup, "min_life_s": a.min_life,
                   "max_life_s": a.max_life, "flip_every_s": a.flip_every, "pad_max": a.pad},
        "publish": p.json,
        "received": subs_t.received,
        "subscription_changes": flips,
        "latency": summarize(&subs_t.latency).to_json(),
        "subscribers": subs_t.json,
        "samples": samples,
        "rss_slope_bytes_per_min": rss_slope,
        "fds_slope_per_min": fds_trend["slope_per_min"],
        "rss_after_warmup": rss_trend,
        "fds_after_warmup": fds_trend,
        "cpu": cpu_json(c, &s0, &s1, subs_t.received, "delivery"),
    });
    v["ok"] = json!(subs_t.received > 0);
    eprintln!(
        "soak against {} ({} conns churning, {}s):",
        t.kind.name(),
        a.conns,
        a.duration
    );
    table(&[
        ("connections opened", v["subscribers"]["opened"].to_string()),
        ("publishes accepted", p.accepted.to_string()),
        ("delivered", subs_t.received.to_string()),
        ("RSS slope bytes/min", format!("{rss_slope:?}")),
        ("fds slope /min", v["fds_slope_per_min"].to_string()),
    ]);
    Ok(v)
}

fn run_floor(c: &Common, opts: &floor::FloorOpts) -> Result<Value, String> {
    if opts.sockets * 2 + 64 > net::raise_nofile() as usize {
        return Err(format!(
            "{} sockets need {} fds; the limit is {}",
            opts.sockets,
            opts.sockets * 2 + 64,
            net::raise_nofile()
        ));
    }
    let variants = floor::run(opts)?;
    eprintln!(
        "floor ({} sockets, {}-byte frame):",
        opts.sockets, opts.frame_bytes
    );
    let rows: Vec<(String, String)> = variants
        .iter()
        .map(|v| {
            let name = v["variant"].as_str().unwrap_or("?").to_string();
            let val = match v.get("error") {
                Some(e) => format!("error: {e}"),
                None => format!(
                    "{} us CPU/frame, {} frames/s, eagain {}",
                    v["sender_cpu_us_per_frame"], v["frames_per_s"], v["eagain"]
                ),
            };
            (name, val)
        })
        .collect();
    let refs: Vec<(&str, String)> = rows.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
    table(&refs);
    let _ = c;
    Ok(json!({
        "mode": "floor",
        "params": {"sockets": opts.sockets, "duration_s": opts.duration.as_secs_f64(),
                   "frame_bytes": opts.frame_bytes, "batch": opts.batch},
        "variants": variants,
        "ok": variants.iter().all(|v| v.get("error").is_none()),
    }))
}
