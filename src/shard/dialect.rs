//! The Pusher-protocol form of a native broadcast frame.
//!
//! A broadcast is encoded once, natively (that frame is what history keeps and the
//! cluster relays). A worker with a Pusher subscriber of the channel asks for the Pusher
//! form through `Broadcast::frame_for`, which calls [`pusher_frame`] at most once per
//! message for the whole node. Reading the native frame back costs one borrowed JSON
//! parse (no copy of `data`: its raw text is escaped straight into the new frame), paid
//! only on channels that have a Pusher subscriber somewhere on this node; the publishers,
//! history and the cluster stay protocol-blind.
//!
//! Invariant: every frame the server broadcasts natively is a message frame
//! (`"type":"message"`, incl. client events) or a presence join/leave frame; anything
//! else has no Pusher form and is `None` (not sent to Pusher subscribers, never a panic).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::wire::pusher as pusher_frame;
use crate::ws::frame::text_payload;

/// The fields of a native broadcast frame the Pusher form needs, borrowed.
#[derive(Deserialize)]
struct Native<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a RawValue,
    #[serde(borrow, default)]
    event: Option<&'a RawValue>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    action: Option<&'a RawValue>,
    #[serde(borrow, default)]
    info: Option<&'a RawValue>,
}

/// The Pusher frame for the native frame `native` of `channel`, or `None` when it has
/// no Pusher form.
pub(super) fn pusher_frame(native: &Bytes, channel: &str) -> Option<Bytes> {
    let payload = text_payload(native)?;
    let n: Native<'_> = serde_json::from_slice(payload).ok()?;
    match n.kind.get() {
        "\"message\"" => {
            let event = n.event?.get();
            let data = n.data?.get();
            let user_id = n.user_id.map(RawValue::get);
            Some(pusher_frame::message(channel, event, data, user_id))
        }
        "\"presence\"" => {
            let user: String = serde_json::from_str(n.user_id?.get()).ok()?;
            match n.action?.get() {
                "\"join\"" => Some(pusher_frame::member_added(
                    channel,
                    &user,
                    n.info.map(RawValue::get),
                )),
                "\"leave\"" => Some(pusher_frame::member_removed(channel, &user)),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::frame::{self, Opcode};
    use serde_json::{json, Value};

    fn payload_of(f: &Bytes) -> Value {
        serde_json::from_slice(text_payload(f).expect("one text frame")).unwrap()
    }

    fn native(v: Value) -> Bytes {
        frame::frame(Opcode::Text, v.to_string().as_bytes())
    }

    #[test]
    fn a_message_becomes_a_pusher_event_with_string_data() {
        let n = native(
            json!({"type":"message","channel":"orders","event":"order.created",
            "data":{"id":42,"q":"a\"b"},"id":"7d08ebbb001000000002","offset":3,"epoch":"ab"}),
        );
        let p = payload_of(&pusher_frame(&n, "orders").unwrap());
        assert_eq!(p["event"], "order.created");
        assert_eq!(p["channel"], "orders");
        let data: Value = serde_json::from_str(p["data"].as_str().unwrap()).unwrap();
        assert_eq!(data, json!({"id":42,"q":"a\"b"}));
        assert!(p.get("id").is_none() && p.get("offset").is_none());
    }

    #[test]
    fn a_string_published_natively_is_passed_as_is() {
        let n = native(
            json!({"type":"message","channel":"c","event":"e","data":"hello \u{e9}","id":"x"}),
        );
        let p = payload_of(&pusher_frame(&n, "c").unwrap());
        assert_eq!(p["data"], "hello \u{e9}");
    }

    #[test]
    fn a_presence_client_event_keeps_its_user() {
        let n = native(
            json!({"type":"message","channel":"presence-r","event":"client-typing",
            "data":{"on":true},"id":"x","user_id":"u1"}),
        );
        let p = payload_of(&pusher_frame(&n, "presence-r").unwrap());
        assert_eq!(p["user_id"], "u1");
        assert_eq!(p["event"], "client-typing");
    }

    #[test]
    fn joins_and_leaves_become_member_frames() {
        let join = native(
            json!({"type":"presence","channel":"presence-r","action":"join",
            "user_id":"u\"1","info":{"name":"Ann"}}),
        );
        let p = payload_of(&pusher_frame(&join, "presence-r").unwrap());
        assert_eq!(p["event"], "pusher_internal:member_added");
        let data: Value = serde_json::from_str(p["data"].as_str().unwrap()).unwrap();
        assert_eq!(data, json!({"user_id":"u\"1","user_info":{"name":"Ann"}}));
        let leave = native(
            json!({"type":"presence","channel":"presence-r","action":"leave","user_id":"u2"}),
        );
        let p = payload_of(&pusher_frame(&leave, "presence-r").unwrap());
        assert_eq!(p["event"], "pusher_internal:member_removed");
        let data: Value = serde_json::from_str(p["data"].as_str().unwrap()).unwrap();
        assert_eq!(data, json!({"user_id":"u2"}));
    }

    #[test]
    fn anything_else_has_no_pusher_form() {
        assert!(pusher_frame(&Bytes::from_static(b"\x81\x02{}"), "c").is_none());
        assert!(pusher_frame(&native(json!({"type":"subscribed","channel":"c"})), "c").is_none());
        assert!(pusher_frame(&Bytes::from_static(b"not a frame"), "c").is_none());
    }
}
