//! One worker: a pinned thread running its own monoio runtime, its own listener, its
//! shard (connections and subscription table) and its timers.
//!
//! This is where a worker's parts are put together: the [`Shard`] (data-plane state,
//! thread-local), the HTTP [`Service`] over it, the mailbox drain task, the heartbeat
//! timer and the accept loop. The only state shared with other cores is the [`Node`].
//!
//! The accept loop only accepts and spawns: a TLS handshake runs in the connection's own
//! task, bounded by the header-read timeout, so a slow or silent client never holds up
//! the next accept.

use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::http::conn::Origin;
use crate::http::Service;
use crate::node::Node;
use crate::shard::mailbox::Mailbox;
use crate::shard::{ConnGuard, InterestSink, Shard, ShardSetup};

/// The per-worker heartbeat: one timer per worker, one pass over its WebSockets per
/// period (see `Shard::heartbeat`).
async fn heartbeat(shard: Rc<Shard>, period: Duration) {
    loop {
        monoio::time::sleep(period).await;
        shard.heartbeat(period);
    }
}

/// Worker 0 only: expire channel history once a second (entries past their TTL, idle
/// channels with nothing kept). Without history projects it takes an empty lock.
async fn history_sweep(history: Arc<crate::history::History>) {
    loop {
        monoio::time::sleep(Duration::from_secs(1)).await;
        history.sweep();
    }
}

async fn accept_loop(
    svc: &Rc<Service>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let shard = &svc.shard;
    // One stop future for the whole loop, not one per accept: waiting must not cost
    // anything per accepted connection (see `shard::stop`).
    let mut stopped = std::pin::pin!(shard.stopped());
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = &mut stopped => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let origin = Origin::peer(peer.ip());
                let proxied = svc.node.trusted.contains(peer.ip());
                match (shard.admit(), &tls) {
                    (Some(guard), tls) if proxied => {
                        monoio::spawn(serve_proxied(
                            svc.clone(),
                            stream,
                            tls.clone(),
                            guard,
                            origin,
                        ));
                    }
                    (Some(guard), None) => {
                        monoio::spawn(crate::http::conn::serve(svc.clone(), stream, guard, origin));
                    }
                    (Some(guard), Some(tls)) => {
                        monoio::spawn(serve_tls(svc.clone(), stream, tls.clone(), guard, origin));
                    }
                    (None, None) => {
                        monoio::spawn(crate::http::conn::refuse_busy(stream));
                    }
                    // A plaintext 503 would be noise to a TLS client, and a handshake
                    // is the work an overloaded worker must not take on: just close.
                    (None, Some(_)) => drop(stream),
                }
            }
            Err(e) => {
                // EMFILE/ENFILE: back off instead of spinning on a full fd table.
                tracing::warn!(worker = shard.index(), error = %e, "accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A connection from a `trusted_proxies` peer: its PROXY header (if any) first, read
/// before TLS or HTTP; then served as any other, with the client address it named. A
/// malformed or late header closes the connection.
async fn serve_proxied(
    svc: Rc<Service>,
    mut stream: monoio::net::TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    guard: ConnGuard,
    mut origin: Origin,
) {
    let limit = svc.config().header_read_timeout();
    let start = match crate::admission::accept::read_start(&mut stream, limit).await {
        Ok(start) => start,
        Err(e) => {
            tracing::debug!(peer = ?origin.client, error = %e, "PROXY header refused");
            return;
        }
    };
    origin.trusted_peer = true;
    if let Some(client) = start.client {
        origin.client = Some(crate::admission::trusted::canonical(client));
        origin.from_header = true;
    }
    match tls {
        None => {
            origin.leftover = start.leftover;
            crate::http::conn::serve(svc, stream, guard, origin).await;
        }
        Some(tls) => {
            origin.tls_prefix = start.leftover;
            serve_tls(svc, stream, tls, guard, origin).await;
        }
    }
}

/// Handshake, then serve HTTP over TLS. A failed or timed-out handshake (a plaintext
/// request on the TLS port, a scanner, a silent client) just closes this connection.
async fn serve_tls(
    svc: Rc<Service>,
    stream: monoio::net::TcpStream,
    tls: Arc<rustls::ServerConfig>,
    guard: ConnGuard,
    mut origin: Origin,
) {
    let limit = svc.config().header_read_timeout();
    let worker = svc.shard.index();
    let prefix = std::mem::take(&mut origin.tls_prefix);
    match monoio::time::timeout(limit, crate::tls::accept_prefixed(tls, stream, prefix)).await {
        Ok(Ok(stream)) => crate::http::conn::serve(svc, stream, guard, origin).await,
        Ok(Err(e)) => tracing::debug!(worker, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(worker, "TLS handshake timed out"),
    }
}

/// What one worker thread is started with.
pub(crate) struct WorkerSetup {
    pub index: usize,
    pub node: Arc<Node>,
    pub listener: StdTcpListener,
    pub mailbox: Arc<Mailbox>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub core: Option<core_affinity::CoreId>,
    pub uring: bool,
    /// This worker's metrics block, written only by this thread.
    pub metrics: Option<&'static crate::metrics::WorkerMetrics>,
    /// Test-only fault injection (see `server::fault`); `Fault::None` in production.
    pub fault: super::fault::Fault,
}

/// Run one worker until shutdown. Called on its own thread.
pub(crate) fn run(setup: WorkerSetup) -> std::io::Result<()> {
    let WorkerSetup {
        index,
        node,
        listener,
        mailbox,
        tls,
        core,
        uring,
        metrics,
        fault,
    } = setup;
    // Pin first, so the runtime's memory is allocated on this core.
    if let Some(core) = core {
        core_affinity::set_for_current(core);
    }
    if let Some(m) = metrics {
        crate::metrics::install(m);
    }
    let spread = Duration::from_secs(node.config.drain_spread_s);
    crate::admission::drain::install(spread);
    // The 1001 closes are spread first, then queued frames get the grace.
    let grace = spread + Duration::from_millis(node.config.shutdown_grace_ms);
    let period = Duration::from_secs(node.config.heartbeat_s.max(1));
    let body = async move {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let sink = node.cluster.clone().map(|c| c as Arc<dyn InterestSink>);
        let max_connections = node.config.max_connections_per_worker;
        let shard = Rc::new(Shard::new(ShardSetup {
            index,
            keys: node.keys.clone(),
            mailbox,
            sink,
            max_connections: node.config.max_connections_per_worker,
            history: node.history.clone(),
            send_budget: node.config.worker_send_budget_bytes,
            max_subscriptions: node.config.max_subscriptions_per_worker,
            watch: Some(node.presence.clone() as Arc<dyn crate::shard::ChannelWatch>),
        }));
        let svc = Rc::new(Service::new(node, shard.clone()));
        monoio::spawn(shard.clone().run_mailbox());
        monoio::spawn(shard.clone().run_budget());
        monoio::spawn(heartbeat(shard.clone(), period));
        if index == 0 {
            monoio::spawn(history_sweep(svc.node.history.clone()));
        }
        monoio::spawn(svc.expiry.clone().run());
        // Idle plaintext WebSockets park here (no task each): see `crate::engine`.
        let engine = crate::engine::install()?;
        // Address space for the worker's bound, not memory: see `Engine::reserve`.
        engine.reserve(max_connections);
        monoio::spawn(super::alloc::upkeep(engine));
        if index == 0 && fault.in_worker().await {
            return Err(std::io::Error::other("fault injected: worker exit"));
        }
        accept_loop(&svc, listener, tls).await;
        // Shutdown: give WebSockets time to receive 1001 and queued messages.
        let deadline = Instant::now() + grace;
        while shard.websockets() > 0 && Instant::now() < deadline {
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    };
    if uring {
        // Each ring is used by its one worker thread only (SINGLE_ISSUER), and completions
        // are reaped when the worker next enters the kernel anyway, so the kernel need
        // not interrupt it to run task work (COOP_TASKRUN): fewer IPIs and context
        // switches per request. Kernels without these flags get a plain ring.
        let mut flags = io_uring::IoUring::builder();
        flags.setup_coop_taskrun().setup_single_issuer();
        let tuned = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .uring_builder(flags)
            .with_entries(4096)
            .enable_timer()
            .build();
        let mut rt = match tuned {
            Ok(rt) => rt,
            Err(_) => monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                .with_entries(4096)
                .enable_timer()
                .build()?,
        };
        rt.block_on(body)
    } else {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()?;
        rt.block_on(body)
    }
}

/// Whether the io_uring driver can be used here (old kernels and seccomp say no).
pub(crate) fn uring_available() -> bool {
    monoio::utils::detect_uring()
}
