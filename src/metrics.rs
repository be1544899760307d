//! The node's counters, gauges and the publish-duration histogram, and their
//! Prometheus text rendering (served by `server::metrics_http` on `metrics_listen`).
//!
//! Invariants:
//! - **Each worker writes only its own [`WorkerMetrics`]**, a cache-line-aligned block
//!   reached through a thread-local ([`with`]). Every write is a plain load and store
//!   (`Relaxed`), never a read-modify-write: there is one writer, so no lock prefix and
//!   no cache line shared with another core on the hot path. A scrape (another thread)
//!   only loads, and sums the workers.
//! - **Deliveries are counted once per broadcast per worker** (the fan-out adds how
//!   many connections took the frame), never once per subscriber.
//! - A leaf of the layers: it names no other module (`shard`, `ws`, `http` and the
//!   server write to it; the metrics listener reads it).
//! - A thread without metrics installed (unit tests, the Autobahn echo example, the
//!   CLI) pays one thread-local read and a branch: every helper is a no-op there.
//! - No label carries a channel, key or connection id: labels are the API, the HTTP
//!   status (a fixed table) and the worker index.
//! - The per-worker blocks live as long as the process (leaked once at start): a
//!   worker's thread-local must never dangle, and there is one server per process.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Statuses the publish APIs answer with, each with its own counter slot; anything
/// else lands in the last slot, rendered as `status="other"`.
const STATUSES: [u16; 17] = [
    200, 202, 400, 401, 403, 404, 405, 408, 409, 411, 413, 415, 422, 429, 431, 500, 503,
];
const STATUS_SLOTS: usize = STATUSES.len() + 1;

/// The publish APIs, the `api` label of `ringcast_publish_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `/api/v1/publish` and `/api/v1/publish/batch`.
    Native,
    /// Pusher's `/apps/{app_id}/events` and `/apps/{app_id}/batch_events`.
    Pusher,
}

impl Api {
    const ALL: [Api; 2] = [Api::Native, Api::Pusher];

    fn label(self) -> &'static str {
        match self {
            Api::Native => "native",
            Api::Pusher => "pusher",
        }
    }

    /// The statuses rendered even at 0 (so rate() has a series from the first scrape):
    /// success, the usual refusals, and the API's quota status (429 native, 403 Pusher).
    fn common(self) -> [u16; 5] {
        match self {
            Api::Native => [202, 400, 401, 429, 503],
            Api::Pusher => [200, 400, 401, 403, 503],
        }
    }
}

/// Upper bounds of the publish-duration buckets, seconds. A publish (parse, quota,
/// encode, mailbox push) takes a few microseconds; the upper buckets catch a stalled
/// worker or a contended mailbox.
pub(crate) const DURATION_BUCKETS: [f64; 14] = [
    0.000_002, 0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001,
    0.002_5, 0.005, 0.01, 0.025, 0.1,
];
const BUCKET_NS: [u64; 14] = [
    2_000,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
];

/// A counter or gauge written by exactly one thread (its worker), read by the scrape.
#[derive(Debug, Default)]
struct Cell64(AtomicU64);

impl Cell64 {
    /// One writer: load and store, no read-modify-write.
    #[inline]
    fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    #[inline]
    fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One worker's metrics. Aligned to two cache lines (the adjacent-line prefetcher pairs
/// them) so no other worker's block shares a line with it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct WorkerMetrics {
    publish_requests: [[Cell64; STATUS_SLOTS]; Api::ALL.len()],
    messages_published: Cell64,
    deliveries: Cell64,
    bytes_sent: Cell64,
    slow_consumer_closes: Cell64,
    client_events: Cell64,
    user_disconnects: Cell64,
    user_blocks: Cell64,
    connections: Cell64,
    user_connections: Cell64,
    subscriptions: Cell64,
    duration_buckets: [Cell64; BUCKET_NS.len()],
    duration_sum_ns: Cell64,
    duration_count: Cell64,
    idempotent_replays: Cell64,
    idempotency_in_progress: Cell64,
    idempotency_key_reused: Cell64,
    idempotency_keys_evicted: Cell64,
    upgrades_refused: Cell64,
    compressed_frames: Cell64,
    compression_saved: Cell64,
    deflate_runs: Cell64,
}

impl WorkerMetrics {
    /// One HTTP request of a publish API answered with `status`.
    pub(crate) fn publish_request(&self, api: Api, status: u16) {
        let slot = STATUSES
            .iter()
            .position(|&s| s == status)
            .unwrap_or(STATUSES.len());
        self.publish_requests[api as usize][slot].add(1);
    }

    /// `frames` permessage-deflate frames handed to connections, `saved` bytes fewer
    /// than their plain forms.
    pub(crate) fn compressed(&self, frames: u64, saved: u64) {
        self.compressed_frames.add(frames);
        self.compression_saved.add(saved);
    }

    /// Time from a publish request complete to its message handed to every mailbox.
    pub(crate) fn publish_duration(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // Cumulative buckets are built at render time: one store here, not fourteen.
        if let Some(i) = BUCKET_NS.iter().position(|&b| ns <= b) {
            self.duration_buckets[i].add(1);
        }
        self.duration_sum_ns.add(ns);
        self.duration_count.add(1);
    }
}

/// Declares the [`WorkerMetrics`] recorders that each write one cell: `count` adds one
/// event, `add` adds `n`, `set` stores a gauge. One form a kind, so every recorder keeps
/// the single-writer load-and-store of [`Cell64`] and none is written out by hand again
/// (a macro because a function cannot declare methods; the bodies are what they were).
macro_rules! recorders {
    (
        count { $($(#[$cd:meta])* $cm:ident => $cf:ident,)* }
        add { $($(#[$ad:meta])* $am:ident => $af:ident,)* }
        set { $($(#[$sd:meta])* $sm:ident => $sf:ident,)* }
    ) => {
        impl WorkerMetrics {
            $($(#[$cd])* pub(crate) fn $cm(&self) { self.$cf.add(1); })*
            $($(#[$ad])* pub(crate) fn $am(&self, n: u64) { self.$af.add(n); })*
            $($(#[$sd])* pub(crate) fn $sm(&self, n: usize) { self.$sf.set(n as u64); })*
        }
    };
}

recorders! {
    count {
        /// One message frame deflated (`ws::deflate::codec`), whether or not it shrank.
        deflate_run => deflate_runs,
        slow_consumer_close => slow_consumer_closes,
        /// One WebSocket upgrade refused over `max_upgrades_per_second` (1013 or Pusher 4100).
        upgrade_refused => upgrades_refused,
        /// One user disconnected (REST disconnect or block, Pusher terminate_connections)
        /// by a request this worker took.
        user_disconnect => user_disconnects,
        /// One user block stored by a request this worker took.
        user_block => user_blocks,
        /// One client event accepted from a connection of this worker and relayed.
        client_event => client_events,
        /// A keyed publish answered from the remembered answer (`Idempotent-Replayed`).
        idempotent_replay => idempotent_replays,
        /// A keyed publish answered 409 `idempotency_key_in_progress`.
        idempotency_in_progress => idempotency_in_progress,
        /// A keyed publish answered 422 `idempotency_key_reused`.
        idempotency_key_reused => idempotency_key_reused,
    }
    add {
        /// Quota units of an accepted publish (one per channel per message).
        messages_published => messages_published,
        /// Message frames one broadcast handed to this worker's connections.
        deliveries => deliveries,
        bytes_sent => bytes_sent,
        /// Idempotency keys this worker forgot before their window ended (over
        /// `idempotency_max_keys_per_project`).
        idempotency_keys_evicted => idempotency_keys_evicted,
    }
    set {
        /// This worker's open WebSocket connections now.
        set_connections => connections,
        /// This worker's WebSocket connections with a user (connection token or sign-in).
        set_user_connections => user_connections,
        /// This worker's (connection, channel) subscriptions now.
        set_subscriptions => subscriptions,
    }
}

thread_local! {
    static LOCAL: Cell<Option<&'static WorkerMetrics>> = const { Cell::new(None) };
}

/// Make `m` this thread's metrics (a worker, once, at start).
pub(crate) fn install(m: &'static WorkerMetrics) {
    LOCAL.with(|l| l.set(Some(m)));
}

/// Run `f` on this thread's metrics, if it has any.
#[inline]
pub(crate) fn with(f: impl FnOnce(&WorkerMetrics)) {
    if let Some(m) = LOCAL.with(Cell::get) {
        f(m);
    }
}

/// Node-wide values the scrape reads from elsewhere (mailboxes, the cluster bridge).
#[derive(Debug, Default)]
pub(crate) struct NodeGauges {
    /// Each worker's mailbox length, by worker index.
    pub mailbox_depths: Vec<usize>,
    /// `None` on a single node; else whether both Redis connections are up.
    pub cluster_connected: Option<bool>,
    /// Cluster relays dropped (queue full or Redis away), when in cluster mode.
    pub cluster_relay_dropped: u64,
    /// Messages received from Redis and dropped (mailboxes full, unknown project, not a
    /// frame ringcast makes): a gap on this node, so operators must see it.
    pub cluster_receive_dropped: u64,
    /// History publishes or reads that Redis answered with something unexpected.
    pub cluster_history_errors: u64,
    /// Webhook events dropped because a queue was full.
    pub webhook_dropped_queue_full: u64,
    /// Webhook events dropped after 5 minutes of failed retries.
    pub webhook_dropped_retries_exhausted: u64,
    /// Webhook requests answered 2xx.
    pub webhook_requests_ok: u64,
    /// Webhook requests answered otherwise or not at all (each is retried).
    pub webhook_requests_failed: u64,
}

/// A metric family summed over workers: name, type, help, and how to read one worker.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&WorkerMetrics) -> u64,
);

/// A node-wide value of one series: name, type, help, value.
type NodeSeries = (&'static str, &'static str, &'static str, u64);

/// A node-wide counter of two labelled series: name, help, label name, and each
/// series' label value and value.
type NodeLabelled = (
    &'static str,
    &'static str,
    &'static str,
    [(&'static str, u64); 2],
);

/// Write a metric family's `# HELP` and `# TYPE` lines.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Every worker's metrics, for the scrape.
#[derive(Debug)]
pub(crate) struct Metrics {
    workers: Vec<&'static WorkerMetrics>,
}

impl Metrics {
    /// One block per worker, living as long as the process (see the module doc).
    pub(crate) fn new(workers: usize) -> Metrics {
        Metrics {
            workers: (0..workers)
                .map(|_| &*Box::leak(Box::<WorkerMetrics>::default()))
                .collect(),
        }
    }

    pub(crate) fn worker(&self, index: usize) -> Option<&'static WorkerMetrics> {
        self.workers.get(index).copied()
    }

    fn sum(&self, f: impl Fn(&WorkerMetrics) -> u64) -> u64 {
        self.workers
            .iter()
            .fold(0u64, |acc, w| acc.wrapping_add(f(w)))
    }

    /// Slow-consumer closes of all workers so far.
    pub(crate) fn slow_consumer_closes(&self) -> u64 {
        self.sum(|w| w.slow_consumer_closes.get())
    }

    /// The Prometheus text exposition (format 0.0.4) of everything.
    pub(crate) fn render(&self, node: &NodeGauges) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP ringcast_build_info Always 1; the version label is the server's version.\n\
             # TYPE ringcast_build_info gauge\nringcast_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );

        let simple: [Family; 18] = [
            (
                "ringcast_connections",
                "gauge",
                "Open WebSocket connections.",
                |w| w.connections.get(),
            ),
            (
                "ringcast_user_connections",
                "gauge",
                "Open WebSocket connections with a user (a connection token or a Pusher sign-in).",
                |w| w.user_connections.get(),
            ),
            (
                "ringcast_subscriptions",
                "gauge",
                "Channel subscriptions of open WebSocket connections.",
                |w| w.subscriptions.get(),
            ),
            (
                "ringcast_messages_published_total",
                "counter",
                "Messages accepted for broadcast, in quota units (one per channel).",
                |w| w.messages_published.get(),
            ),
            (
                "ringcast_deliveries_total",
                "counter",
                "Message frames handed to subscribed connections.",
                |w| w.deliveries.get(),
            ),
            (
                "ringcast_bytes_sent_total",
                "counter",
                "WebSocket bytes written to clients (before TLS).",
                |w| w.bytes_sent.get(),
            ),
            (
                "ringcast_compressed_frames_total",
                "counter",
                "Message frames handed to connections compressed (permessage-deflate).",
                |w| w.compressed_frames.get(),
            ),
            (
                "ringcast_compression_saved_bytes_total",
                "counter",
                "Bytes those compressed frames saved against their plain forms.",
                |w| w.compression_saved.get(),
            ),
            (
                "ringcast_deflate_runs_total",
                "counter",
                "Message frames deflated (at most once per message per node; a replay included).",
                |w| w.deflate_runs.get(),
            ),
            (
                "ringcast_slow_consumer_closes_total",
                "counter",
                "WebSocket connections closed with 4008 (send backlog over its limit).",
                |w| w.slow_consumer_closes.get(),
            ),
            (
                "ringcast_upgrades_refused_total",
                "counter",
                "WebSocket upgrades closed at once over max_upgrades_per_second (1013, Pusher 4100).",
                |w| w.upgrades_refused.get(),
            ),
            (
                "ringcast_client_events_total",
                "counter",
                "Client events accepted from connections and relayed to the channel's other subscribers.",
                |w| w.client_events.get(),
            ),
            (
                "ringcast_user_disconnects_total",
                "counter",
                "Users whose connections were ended on every node by a request to this node (disconnect, block, Pusher terminate_connections).",
                |w| w.user_disconnects.get(),
            ),
            (
                "ringcast_user_blocks_total",
                "counter",
                "User blocks stored by requests to this node.",
                |w| w.user_blocks.get(),
            ),
            (
                "ringcast_idempotent_replays_total",
                "counter",
                "Publishes with an Idempotency-Key answered again from the first answer (Idempotent-Replayed: true); nothing was published.",
                |w| w.idempotent_replays.get(),
            ),
            (
                "ringcast_idempotency_in_progress_total",
                "counter",
                "Publishes answered 409 idempotency_key_in_progress (the first request with the key was still being processed).",
                |w| w.idempotency_in_progress.get(),
            ),
            (
                "ringcast_idempotency_key_reused_total",
                "counter",
                "Publishes answered 422 idempotency_key_reused (a remembered key with another body).",
                |w| w.idempotency_key_reused.get(),
            ),
            (
                "ringcast_idempotency_keys_evicted_total",
                "counter",
                "Idempotency keys forgotten before their window ended because the project had idempotency_max_keys_per_project keys (single node).",
                |w| w.idempotency_keys_evicted.get(),
            ),
        ];
        for (name, kind, help, get) in simple {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {}", self.sum(get));
        }

        let name = "ringcast_publish_requests_total";
        header(
            &mut out,
            name,
            "counter",
            "HTTP requests of the publish APIs, by API and status.",
        );
        for api in Api::ALL {
            for slot in 0..STATUS_SLOTS {
                let n = self.sum(|w| w.publish_requests[api as usize][slot].get());
                // The common statuses always appear (so rate() has a series from the
                // first scrape); the others once they happened.
                if n == 0 && !STATUSES.get(slot).is_some_and(|s| api.common().contains(s)) {
                    continue;
                }
                let status = STATUSES
                    .get(slot)
                    .map_or_else(|| "other".to_string(), u16::to_string);
                let _ = writeln!(
                    out,
                    "{name}{{api=\"{}\",status=\"{status}\"}} {n}",
                    api.label()
                );
            }
        }

        let name = "ringcast_publish_duration_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Time from a publish request complete to its message handed to every mailbox.",
        );
        let mut cumulative = 0u64;
        for (i, le) in DURATION_BUCKETS.iter().enumerate() {
            cumulative += self.sum(|w| w.duration_buckets[i].get());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let count = self.sum(|w| w.duration_count.get());
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum_s = self.sum(|w| w.duration_sum_ns.get()) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum_s}");
        let _ = writeln!(out, "{name}_count {count}");

        let name = "ringcast_mailbox_depth";
        header(
            &mut out,
            name,
            "gauge",
            "Frames queued in a worker's mailbox (a batch counts one per frame, capped at the capacity).",
        );
        for (worker, depth) in node.mailbox_depths.iter().enumerate() {
            let _ = writeln!(out, "{name}{{worker=\"{worker}\"}} {depth}");
        }

        let single: [NodeSeries; 5] = [
            (
                "ringcast_cluster_connected",
                "gauge",
                "1 when both Redis connections of the cluster bridge are up; 0 otherwise (and on a single node).",
                u64::from(node.cluster_connected == Some(true)),
            ),
            (
                "ringcast_cluster_enabled",
                "gauge",
                "1 in cluster mode (--redis), 0 on a single node.",
                u64::from(node.cluster_connected.is_some()),
            ),
            (
                "ringcast_cluster_relay_dropped_total",
                "counter",
                "Publishes not relayed to the other nodes (relay queue full or Redis away).",
                node.cluster_relay_dropped,
            ),
            (
                "ringcast_cluster_receive_dropped_total",
                "counter",
                "Messages from other nodes dropped here (mailboxes full, unknown project, or not a ringcast frame).",
                node.cluster_receive_dropped,
            ),
            (
                "ringcast_cluster_history_errors_total",
                "counter",
                "History publishes or reads in cluster mode that Redis answered unexpectedly.",
                node.cluster_history_errors,
            ),
        ];
        for (name, kind, help, value) in single {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }

        let labelled: [NodeLabelled; 2] = [
            (
                "ringcast_webhook_events_dropped_total",
                "Webhook events not delivered: a queue was full (webhook_queue_events), or 5 minutes of retries failed.",
                "reason",
                [
                    ("queue_full", node.webhook_dropped_queue_full),
                    ("retries_exhausted", node.webhook_dropped_retries_exhausted),
                ],
            ),
            (
                "ringcast_webhook_requests_total",
                "Webhook requests made, by result (failed: non-2xx or no answer within 5 s; each is retried).",
                "result",
                [
                    ("ok", node.webhook_requests_ok),
                    ("failed", node.webhook_requests_failed),
                ],
            ),
        ];
        for (name, help, label, series) in labelled {
            header(&mut out, name, "counter", help);
            for (value, n) in series {
                let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    }

    #[test]
    fn workers_are_summed_and_buckets_are_cumulative() {
        let m = Metrics::new(2);
        let (a, b) = (m.worker(0).unwrap(), m.worker(1).unwrap());
        a.deliveries(3);
        b.deliveries(4);
        a.publish_request(Api::Native, 202);
        b.publish_request(Api::Native, 202);
        b.publish_request(Api::Native, 401);
        b.publish_request(Api::Native, 599);
        a.publish_request(Api::Pusher, 200);
        b.publish_request(Api::Pusher, 200);
        a.publish_duration(Duration::from_micros(3));
        b.publish_duration(Duration::from_millis(1));
        b.publish_duration(Duration::from_secs(1));
        let text = m.render(&NodeGauges {
            mailbox_depths: vec![0, 5],
            cluster_connected: None,
            cluster_relay_dropped: 0,
            cluster_receive_dropped: 4,
            cluster_history_errors: 0,
            webhook_dropped_queue_full: 3,
            webhook_requests_failed: 2,
            ..NodeGauges::default()
        });
        assert_eq!(
            value(
                &text,
                "ringcast_webhook_events_dropped_total{reason=\"queue_full\"}"
            ),
            3
        );
        assert_eq!(
            value(&text, "ringcast_webhook_requests_total{result=\"failed\"}"),
            2
        );
        assert_eq!(value(&text, "ringcast_cluster_receive_dropped_total"), 4);
        assert_eq!(value(&text, "ringcast_cluster_history_errors_total"), 0);
        assert_eq!(value(&text, "ringcast_deliveries_total"), 7);
        let req = "ringcast_publish_requests_total{api=\"native\",status=";
        assert_eq!(value(&text, &format!("{req}\"202\"}}")), 2);
        assert_eq!(value(&text, &format!("{req}\"401\"}}")), 1);
        assert_eq!(value(&text, &format!("{req}\"other\"}}")), 1);
        assert!(
            !text.contains("status=\"413\""),
            "unused rare statuses stay out"
        );
        let pusher = "ringcast_publish_requests_total{api=\"pusher\",status=";
        assert_eq!(value(&text, &format!("{pusher}\"200\"}}")), 2);
        assert_eq!(value(&text, &format!("{pusher}\"403\"}}")), 0);
        assert!(
            !text.contains(&format!("{pusher}\"429\"}}")),
            "the Pusher API answers its quota with 403"
        );
        let h = "ringcast_publish_duration_seconds_bucket{le=";
        assert_eq!(value(&text, &format!("{h}\"0.000002\"}}")), 0);
        assert_eq!(value(&text, &format!("{h}\"0.000005\"}}")), 1);
        assert_eq!(value(&text, &format!("{h}\"0.001\"}}")), 2);
        assert_eq!(value(&text, &format!("{h}\"0.1\"}}")), 2);
        assert_eq!(value(&text, &format!("{h}\"+Inf\"}}")), 3);
        assert_eq!(value(&text, "ringcast_publish_duration_seconds_count"), 3);
        assert_eq!(value(&text, "ringcast_mailbox_depth{worker=\"1\"}"), 5);
        assert_eq!(value(&text, "ringcast_cluster_connected"), 0);
    }

    #[test]
    fn without_installed_metrics_helpers_do_nothing() {
        let mut ran = false;
        std::thread::spawn(move || {
            with(|_| ran = true);
            ran
        })
        .join()
        .map(|ran| assert!(!ran))
        .unwrap();
    }

    #[test]
    fn blocks_do_not_share_cache_lines() {
        assert_eq!(std::mem::align_of::<WorkerMetrics>(), 128);
    }
}
