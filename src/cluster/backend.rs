//! The cluster bridge as the node's history backend ([`Backend`], chosen at start in
//! cluster mode): publishes, reads and keyed publishes become requests for the history
//! thread ([`super::history`]), which answers each through a [`Reply`]. The publish
//! endpoints and the REST read see only the trait.
//!
//! Invariant: a request the thread's queue cannot take is dropped with its reply's
//! sender, so the caller is answered [`Unreachable`] (503) at once, never left waiting.

use super::history::{reply, Item, PublishRequest, ReadRequest, Reply, Request, Unreachable};
use super::idempotency::{KeyedRequest, Publish};
use super::{wire, Cluster};
use crate::history::backend::{
    self, Backend, Handover, KeyedAsk, Message, Project, PublishAsk, ReadAnswer, ReadAsk, Sequenced,
};

/// Each message's body for Redis' publish script (the node adds the position to it
/// when the script's PUBLISH reaches it).
fn items(msgs: &[Message<'_>]) -> Vec<Item> {
    msgs.iter()
        .map(|m| {
            let (body, data_start) =
                crate::wire::native::message_body(m.channel, m.event, m.data, m.id);
            Item {
                channel: m.channel.into(),
                body,
                data_start,
                except: m.except,
            }
        })
        .collect()
}

/// Cluster mode: Redis gives each message of each channel its offset, keeps it and
/// publishes it to every node (this one included, which delivers it to its subscribers
/// from there, in offset order), in one script call per request; reads and keyed
/// publishes ride the same thread. A full queue drops the request, and with it its
/// reply's sender: the caller is answered 503 at once.
impl Backend for Cluster {
    fn publish(&self, ask: PublishAsk<'_>, _: Handover<'_>) -> Sequenced {
        let (tx, reply) = reply();
        self.history(Request::Publish(PublishRequest {
            project_id: ask.project.id.into(),
            size: ask.spec.size,
            ttl_s: ask.spec.ttl_s,
            items: items(ask.msgs),
            reply: tx,
        }));
        Sequenced::Later(reply)
    }

    fn read(&self, project: Project<'_>, ask: ReadAsk<'_>) -> ReadAnswer {
        let (tx, reply) = reply();
        self.history(Request::Read(ReadRequest {
            project_id: project.id.into(),
            channel: ask.channel.into(),
            size: ask.spec.size,
            ttl_s: ask.spec.ttl_s,
            since: ask.since,
            limit: ask.limit,
            reply: tx,
        }));
        ReadAnswer::Later(reply)
    }

    fn decides_keys(&self) -> bool {
        true
    }

    fn keyed(
        &self,
        project: Project<'_>,
        ask: KeyedAsk<'_>,
    ) -> Reply<Result<backend::Keyed, Unreachable>> {
        let publish = if ask.spec.is_on() {
            Publish::History {
                size: ask.spec.size,
                ttl_s: ask.spec.ttl_s,
                items: items(ask.messages),
            }
        } else {
            let frames = ask
                .messages
                .iter()
                .map(|m| {
                    let frame =
                        crate::wire::native::message_frame(m.channel, m.event, m.data, m.id);
                    // Origin 0: every node delivers it, this one included.
                    let payload = match m.except {
                        Some(e) => wire::encode_payload_except(0, e, &frame),
                        None => wire::encode_payload(0, &frame),
                    };
                    (wire::redis_channel(project.id, m.channel), payload)
                })
                .collect();
            Publish::Plain(frames)
        };
        let (tx, reply) = reply();
        self.history(Request::Scripted(Box::new(KeyedRequest {
            project_id: project.id.into(),
            key: ask.terms.key.into(),
            body_hash: ask.terms.body_hash,
            window_ms: ask.terms.window_ms,
            max_keys: ask.terms.max_keys,
            answer: ask.answer,
            publish,
            reply: tx,
        })));
        reply
    }
}
