//! Client events: a subscriber of a private or presence channel sends
//! `{"type":"client_event","channel":"private-x","event":"client-typing","data":{...}}`
//! and the channel's *other* subscribers, on every worker and every node, receive it as
//! a message frame (with an `id`, no offset; `user_id` on presence channels).
//!
//! Invariants:
//! - Off by default: a project allows them with `project set-limits --client-events on`
//!   (read from the key snapshot once per event, never on the fan-out path).
//! - Checks, cheapest first: the frame's shape (channel, event, data), the project's
//!   switch (`forbidden`), the channel kind and the connection's own subscription
//!   (`forbidden`), the per-connection rate ([`MAX_PER_SECOND`] in any one second:
//!   `rate_limited`, never a close), the project's quota (one unit per event), then the
//!   hand-over to the mailboxes (`unavailable` when full or shutting down).
//! - An accepted event is encoded once into one `Bytes` and handed to the node like a
//!   publish; the sender is left out by an id compare in the fan-out (the broadcast's
//!   `except`), so nothing is allocated per subscriber. It is never kept in history.
//! - Each refusal answers an error frame naming the channel; the connection stays open.
//! - A relayed event is also a `client_event` webhook when the project's webhook asks
//!   for them (`crate::webhook`; never blocks, dropped and counted when its queue is full).

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::auth::ProjectState;
use crate::ids::{IdGen, SocketId};
use crate::publish::Fanout;
use crate::quota::now_ns;
use crate::shard::mailbox::Broadcast;
use crate::webhook::{HookEvent, HookKind, Webhooks};

use crate::wire::native::client_event_frame;

/// Client events one connection may send in any one second (Pusher's limit).
pub(crate) const MAX_PER_SECOND: usize = 10;

/// Prefix every client event name carries.
pub(crate) const EVENT_PREFIX: &str = "client-";

/// What every session of one worker shares for client events.
pub(crate) struct EventContext {
    /// Where an accepted event goes: where a publish goes (the mailboxes of the node's
    /// workers and, in cluster mode, the other nodes), never through history.
    relay: Arc<dyn Fanout + Send + Sync>,
    ids: Rc<IdGen>,
    /// This worker's index (a sender is (worker, connection id)).
    worker: usize,
    /// Largest encoded `data` (`max_body_bytes`, the publish limit).
    max_data_bytes: usize,
    /// The node's webhook sender (`client_event` webhooks); `None` in unit tests.
    webhooks: Option<Arc<Webhooks>>,
}

impl EventContext {
    pub(crate) fn new(
        relay: Arc<dyn Fanout + Send + Sync>,
        ids: Rc<IdGen>,
        worker: usize,
        max_data_bytes: usize,
        webhooks: Option<Arc<Webhooks>>,
    ) -> Rc<EventContext> {
        Rc::new(EventContext {
            relay,
            ids,
            worker,
            max_data_bytes,
            webhooks,
        })
    }
}

/// The times of a connection's last [`MAX_PER_SECOND`] client events: a sliding
/// window, so no one-second span ever holds more. Boxed on a connection's first client
/// event, so a connection that sends none pays one pointer.
#[derive(Default)]
pub(crate) struct RateLog {
    /// Nanosecond timestamps (`quota::now_ns`), a ring; 0 = unused slot.
    at: [u64; MAX_PER_SECOND],
    next: usize,
}

impl RateLog {
    /// Record an event at `now` unless [`MAX_PER_SECOND`] were recorded within the
    /// last second.
    pub(crate) fn admit(&mut self, now: u64) -> bool {
        let oldest = self.at[self.next];
        if oldest != 0 && now.saturating_sub(oldest) < 1_000_000_000 {
            return false;
        }
        // `now_ns` starts at 0 for the first caller of the process; 1 keeps "unused".
        self.at[self.next] = now.max(1);
        self.next = (self.next + 1) % MAX_PER_SECOND;
        true
    }
}

/// Why a client event was not relayed: the error frame's code and sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Off,
    NotPrivate,
    /// A `private-encrypted-` channel: its payloads are end-to-end encrypted by its
    /// clients, and a client event would travel in clear (Pusher refuses them too).
    Encrypted,
    NotSubscribed,
    BadEvent,
    BadData,
    TooLarge,
    ConnectionRate,
    ProjectQuota,
    Unavailable,
}

impl Refusal {
    pub(crate) fn code(self) -> &'static str {
        match self {
            Refusal::Off | Refusal::NotPrivate | Refusal::Encrypted | Refusal::NotSubscribed => {
                "forbidden"
            }
            Refusal::BadEvent => "invalid_event",
            Refusal::BadData => "invalid_data",
            Refusal::TooLarge => "payload_too_large",
            Refusal::ConnectionRate | Refusal::ProjectQuota => "rate_limited",
            Refusal::Unavailable => "unavailable",
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::Off => "client events are off for this project",
            Refusal::NotPrivate => "client events are allowed on private- and presence- channels only",
            Refusal::Encrypted => "client events are not relayed on private-encrypted- channels (they would travel unencrypted)",
            Refusal::NotSubscribed => "subscribe to the channel before sending client events on it",
            Refusal::BadEvent => "a client event's name starts with client- and is 1 to 100 characters without control characters",
            Refusal::BadData => "data must be an object or a string",
            Refusal::TooLarge => "data is larger than the publish limit (max_body_bytes)",
            Refusal::ConnectionRate => "more than 10 client events in one second on this connection; dropped",
            Refusal::ProjectQuota => "the project is over its rate quota; dropped",
            Refusal::Unavailable => "the service cannot take the event now",
        }
    }
}

/// Check the channel of a client event: a `private-` or `presence-` channel, but not a
/// `private-encrypted-` one (both protocols).
pub(crate) fn check_channel(channel: &str) -> Result<(), Refusal> {
    if !super::private::needs_token(channel) {
        return Err(Refusal::NotPrivate);
    }
    if channel.starts_with("private-encrypted-") {
        return Err(Refusal::Encrypted);
    }
    Ok(())
}

/// Check an event name: the normal name rule, and the `client-` prefix.
pub(crate) fn check_event(event: &str) -> Result<(), Refusal> {
    if crate::names::check(event).is_err() || !event.starts_with(EVENT_PREFIX) {
        return Err(Refusal::BadEvent);
    }
    Ok(())
}

/// One client event that passed the frame checks, from connection `conn_id`.
pub(crate) struct ClientEvent<'a> {
    pub channel: &'a str,
    pub event: &'a str,
    /// `data` as JSON text (an object or a string).
    pub data: &'a [u8],
    /// The sender's token `sub`, on a presence channel.
    pub user_id: Option<&'a str>,
    /// The sender's connection id, as its `connected` frame gave it.
    pub socket_id: &'a str,
}

/// Take the project's quota for one event, encode it once and hand it to the node,
/// leaving the sender out. The caller checked the switch, the subscription and the
/// connection's rate.
pub(crate) fn relay(
    ctx: &EventContext,
    project: &ProjectState,
    conn_id: u64,
    ev: &ClientEvent<'_>,
) -> Result<(), Refusal> {
    if ev.data.len() > ctx.max_data_bytes {
        return Err(Refusal::TooLarge);
    }
    // A client event costs one quota unit, like a publish to one channel.
    if !project.quota.check_n(now_ns(), 1).allowed {
        return Err(Refusal::ProjectQuota);
    }
    let id = ctx.ids.next_id();
    let frame: Bytes = client_event_frame(ev.channel, ev.event, ev.data, id.as_str(), ev.user_id);
    let msg = Arc::new(Broadcast::new(
        project.index,
        ev.channel.into(),
        frame,
        Some(SocketId::local(ctx.worker, conn_id)),
    ));
    // Not while shutting down: a 202-like acceptance the closing workers might drop.
    if ctx.relay.shutting_down() || !ctx.relay.broadcast(msg) {
        project.quota.refund_n(1);
        return Err(Refusal::Unavailable);
    }
    crate::metrics::with(|m| {
        m.client_event();
        // `ringcast_messages_published_total` counts quota units: this is one.
        m.messages_published(1);
    });
    // A project whose webhook does not ask for client events pays one snapshot read.
    if let Some(hooks) = &ctx.webhooks {
        if hooks.wants(project.index, HookKind::ClientEvent) {
            hooks.emit(
                project.index,
                HookEvent::ClientEvent {
                    channel: ev.channel.into(),
                    event: ev.event.into(),
                    data: String::from_utf8_lossy(ev.data).into(),
                    socket_id: ev.socket_id.into(),
                    user_id: ev.user_id.map(Into::into),
                },
            );
        }
    }
    Ok(())
}

/// Whether the project allows client events now.
pub(crate) fn allowed(project: &ProjectState) -> bool {
    project.client_events.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_log_admits_ten_in_any_second() {
        let mut log = RateLog::default();
        let s = 1_000_000_000u64;
        for i in 0..10 {
            assert!(log.admit(5 * s + i), "event {i}");
        }
        assert!(!log.admit(5 * s + 10));
        assert!(!log.admit(6 * s - 1), "still within a second of the first");
        assert!(log.admit(6 * s), "the first left the window");
        assert!(!log.admit(6 * s), "the second is still in it");
        assert!(log.admit(7 * s + 100));
    }

    #[test]
    fn event_names_need_the_client_prefix() {
        assert!(check_event("client-typing").is_ok());
        assert_eq!(check_event("typing"), Err(Refusal::BadEvent));
        assert_eq!(check_event("pusher:ping"), Err(Refusal::BadEvent));
        assert_eq!(
            check_event(&format!("client-{}", "x".repeat(100))),
            Err(Refusal::BadEvent)
        );
        assert_eq!(check_event("client-\u{1}"), Err(Refusal::BadEvent));
    }
}
