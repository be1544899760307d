//! One worker: a pinned thread running its own monoio runtime, its own listener, its own
//! connections and subscription table.
//!
//! Everything in [`Worker`] is thread-local (`Rc`, `RefCell`, `Cell`); the type system
//! keeps it off other cores. The only shared parts are in [`Shared`] (config, key
//! snapshot, mailboxes, flags), read without locks on the hot path.
//!
//! The accept loop only accepts and spawns: a TLS handshake runs in the connection's own
//! task, bounded by the header-read timeout, so a slow or silent client never holds up
//! the next accept.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use monoio::net::TcpListener;

use crate::auth::KeyCache;
use crate::config::Config;
use crate::ids::IdGen;
use crate::publish::{Fanout, PublishParser};
use crate::shard::mailbox::{Broadcast, Mailbox, Mailboxes};
use crate::shard::registry::Registry;
use crate::ws::conn::{WsConn, CLOSE_HEARTBEAT};
use crate::ws::frame::GOING_AWAY;

/// State every worker shares. Read-mostly; nothing here is locked on the hot path.
pub struct Shared {
    pub config: Config,
    pub keys: Arc<KeyCache>,
    pub mailboxes: Mailboxes,
    /// Cluster mode's Redis bridge; `None` on a single node. Its `is_ok` is the
    /// `"cluster"` health check.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    pub shutting_down: AtomicBool,
    /// Whether the key store answered on its last check.
    pub db_ok: Arc<AtomicBool>,
    /// Serve HTTPS/WSS with this configuration; `None` = plaintext.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Fanout for Shared {
    fn broadcast(&self, msg: Arc<Broadcast>) -> bool {
        match &self.cluster {
            None => self.mailboxes.broadcast(msg),
            // Relay only what was accepted locally: a 503 here means no node delivers it.
            // The relay is an `Arc` clone into a bounded queue: no allocation, no wait.
            Some(cluster) => {
                if !self.mailboxes.broadcast(Arc::clone(&msg)) {
                    return false;
                }
                cluster.relay(msg);
                true
            }
        }
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}

/// A worker's thread-local state.
pub struct Worker {
    pub index: usize,
    pub shared: Arc<Shared>,
    pub ids: IdGen,
    pub parser: RefCell<PublishParser>,
    pub registry: RefCell<Registry>,
    pub conns: RefCell<HashMap<u64, Rc<WsConn>>>,
    /// This worker's mailbox (the only cross-core path into it).
    pub mailbox: Arc<Mailbox>,
    open: Cell<usize>,
    next_conn: Cell<u64>,
    started: Instant,
    stopping: Cell<bool>,
    stop_waiters: RefCell<Vec<Waker>>,
}

/// Decrements the worker's open-connection count when a connection task ends.
pub struct ConnGuard(Rc<Worker>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get().saturating_sub(1));
    }
}

impl Worker {
    pub fn new(index: usize, shared: Arc<Shared>, mailbox: Arc<Mailbox>) -> Worker {
        let registry = RefCell::new(Registry::new(mailbox.interest.clone()));
        Worker {
            mailbox,
            registry,
            index,
            shared,
            ids: IdGen::new(index),
            parser: RefCell::new(PublishParser::new()),
            conns: RefCell::new(HashMap::new()),
            open: Cell::new(0),
            next_conn: Cell::new(0),
            started: Instant::now(),
            stopping: Cell::new(false),
            stop_waiters: RefCell::new(Vec::new()),
        }
    }

    /// Coarse worker clock in seconds (heartbeat bookkeeping).
    pub fn clock(&self) -> u32 {
        self.started.elapsed().as_secs() as u32
    }

    /// Count a new connection, or `None` when the worker is at its limit.
    pub fn admit(self: &Rc<Self>) -> Option<ConnGuard> {
        if self.open.get() >= self.shared.config.max_connections_per_worker {
            return None;
        }
        self.open.set(self.open.get() + 1);
        Some(ConnGuard(self.clone()))
    }

    pub fn open_connections(&self) -> usize {
        self.open.get()
    }

    pub fn next_conn_id(&self) -> u64 {
        let id = self.next_conn.get() + 1;
        self.next_conn.set(id);
        id
    }

    pub fn register_ws(&self, conn: Rc<WsConn>) {
        if self.stopping.get() {
            conn.close(GOING_AWAY, "server shutting down");
        }
        self.conns.borrow_mut().insert(conn.id, conn);
    }

    pub fn remove_ws(&self, conn: &WsConn) {
        self.conns.borrow_mut().remove(&conn.id);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Stop accepting and close every WebSocket with 1001 after what is queued.
    pub fn begin_shutdown(&self) {
        if self.stopping.replace(true) {
            return;
        }
        let conns: Vec<_> = self.conns.borrow().values().cloned().collect();
        for conn in conns {
            conn.close(GOING_AWAY, "server shutting down");
        }
        for w in self.stop_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub async fn wait_stop(&self) {
        poll_fn(|cx| {
            if self.stopping.get() {
                Poll::Ready(())
            } else {
                self.stop_waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// The per-worker heartbeat: ping connections that went quiet, close the silent ones.
/// One task per worker (not a timer per connection) keeps idle connections small.
async fn heartbeat(worker: Rc<Worker>) {
    const PING: Bytes = Bytes::from_static(&[0x89, 0x00]);
    let period = worker.shared.config.heartbeat_s.max(1);
    loop {
        monoio::time::sleep(Duration::from_secs(period)).await;
        let now = worker.clock();
        let conns: Vec<_> = worker.conns.borrow().values().cloned().collect();
        for conn in conns {
            let silent = u64::from(now.saturating_sub(conn.last_seen()));
            if silent >= 3 * period {
                conn.close(CLOSE_HEARTBEAT, "no traffic within the heartbeat timeout");
            } else if silent >= period {
                conn.send(PING);
            }
        }
    }
}

async fn accept_loop(worker: &Rc<Worker>, listener: TcpListener) {
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = worker.wait_stop() => return,
        };
        match accepted {
            Ok((stream, _peer)) => {
                let _ = stream.set_nodelay(true);
                match (worker.admit(), &worker.shared.tls) {
                    (Some(guard), None) => {
                        monoio::spawn(crate::http::conn::serve(worker.clone(), stream, guard));
                    }
                    (Some(guard), Some(tls)) => {
                        monoio::spawn(serve_tls(worker.clone(), stream, tls.clone(), guard));
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
                tracing::warn!(worker = worker.index, error = %e, "accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Handshake, then serve HTTP over TLS. A failed or timed-out handshake (a plaintext
/// request on the TLS port, a scanner, a silent client) just closes this connection.
async fn serve_tls(
    worker: Rc<Worker>,
    stream: monoio::net::TcpStream,
    tls: Arc<rustls::ServerConfig>,
    guard: ConnGuard,
) {
    let limit = worker.shared.config.header_read_timeout();
    match monoio::time::timeout(limit, crate::tls::accept(tls, stream)).await {
        Ok(Ok(stream)) => crate::http::conn::serve(worker, stream, guard).await,
        Ok(Err(e)) => tracing::debug!(worker = worker.index, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(worker = worker.index, "TLS handshake timed out"),
    }
}

/// Run one worker until shutdown. Called on its own thread.
pub fn run(
    index: usize,
    shared: Arc<Shared>,
    listener: StdTcpListener,
    mailbox: Arc<Mailbox>,
    core: Option<core_affinity::CoreId>,
    uring: bool,
) -> std::io::Result<()> {
    // Pin first, so the runtime's memory is allocated on this core.
    if let Some(core) = core {
        core_affinity::set_for_current(core);
    }
    let grace = Duration::from_millis(shared.config.shutdown_grace_ms);
    let body = async move {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let worker = Rc::new(Worker::new(index, shared, mailbox));
        monoio::spawn(crate::shard::run_mailbox(worker.clone()));
        monoio::spawn(heartbeat(worker.clone()));
        accept_loop(&worker, listener).await;
        // Shutdown: give WebSockets time to receive 1001 and queued messages.
        let deadline = Instant::now() + grace;
        while !worker.conns.borrow().is_empty() && Instant::now() < deadline {
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
pub fn uring_available() -> bool {
    monoio::utils::detect_uring()
}
