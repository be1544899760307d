//! `GET /health` and `HEAD /health`: whether this node can take messages now.
//!
//! 200 `{"status":"ok","version":"<major>.<minor>"}` when the key store answered on its
//! last check, no mailbox is over its high-water mark, the node is not shutting down and
//! (cluster mode) both Redis connections are up; otherwise 503 with the failing checks
//! and `Retry-After: 1`. No key is needed and one sent is ignored. HEAD gets the same
//! head, Content-Length included, and no body (RFC 9110 §9.3.2). A request with a body
//! never gets here: the router answers it 400 from the head (`route`).

use std::sync::atomic::Ordering;

use super::outcome::{Outcome, Request};
use super::parse::Method;
use super::response::{write_json, Extra};
use super::Service;

/// Answer a body-less `GET`/`HEAD /health` (the router refuses one with a body).
pub(crate) fn handle(r: &Request<'_>, out: &mut Vec<u8>) -> Outcome {
    debug_assert!(!r.head.has_body());
    let start = out.len();
    write_health(r.svc, out);
    if r.head.method() == Method::Head {
        if let Some(end) = out[start..].windows(4).position(|w| w == b"\r\n\r\n") {
            out.truncate(start + end + 4);
        }
    }
    Outcome::Answered { close: false }
}

fn write_health(svc: &Service, out: &mut Vec<u8>) {
    let node = &svc.node;
    let db_ok = node.db_ok.load(Ordering::Relaxed);
    let queued = node.mailboxes.max_len();
    let queues_ok = queued <= node.config.mailbox_high_water();
    let stopping = node.is_shutting_down();
    // Single node: nothing to check. Cluster mode: both bridge connections are up.
    let cluster_ok = node.cluster.as_ref().is_none_or(|c| c.is_ok());
    let version = version();
    if db_ok && queues_ok && !stopping && cluster_ok {
        let body = format!("{{\"status\":\"ok\",\"version\":\"{version}\"}}");
        write_json(out, 200, body.as_bytes(), Extra::default());
        return;
    }
    let queues = if queues_ok {
        "ok".to_string()
    } else {
        format!("a shard queue is over its high-water mark ({queued} queued)")
    };
    let mut checks = serde_json::json!({
        "database": if db_ok { "ok" } else { "the key store does not answer" },
        "queues": queues,
        "cluster": match &node.cluster {
            None => "not configured",
            Some(_) if cluster_ok => "ok",
            Some(_) => "Redis is unreachable; serving local subscribers only",
        },
    });
    if stopping {
        checks["server"] = "shutting down".into();
    }
    let body = serde_json::json!({"status": "degraded", "version": version, "checks": checks});
    write_json(
        out,
        503,
        body.to_string().as_bytes(),
        Extra {
            retry_after_s: Some(1),
            ..Extra::default()
        },
    );
}

/// `<major>.<minor>` of this build.
pub(crate) fn version() -> String {
    let mut parts = env!("CARGO_PKG_VERSION").split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    format!("{major}.{minor}")
}
