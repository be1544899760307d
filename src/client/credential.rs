//! What a subscribe's credential proves, in either protocol: a [`Member`] (who, with
//! what `info`, until when). Native clients send a JWT (`auth::token`, checked through
//! the worker's cache of verified tokens); Pusher clients send Pusher's HMAC `auth`
//! (`auth::pusher`) and, for presence, `channel_data` naming the member.
//!
//! Invariants: nothing here keeps state; a credential is looked at only after the
//! connection's budget paid for it (the session core's order); a member's user id is
//! 1 to 128 characters and its `info` a JSON object of at most 1 KiB in both protocols.

use crate::auth::pusher::{check_channel_auth, ChannelAuthError};
use crate::auth::token::{TokenRefusal, MAX_INFO_BYTES};
use crate::auth::ProjectState;
use crate::wire::native::MAX_USER_ID_CHARS;

use super::ctx::SessionCtx;
use super::error::ClientError;
use super::private::unix_now;

/// What a verified credential grants on one channel.
pub(crate) struct Member {
    /// The user (a token's `sub`; Pusher: `channel_data`'s `user_id`).
    pub(crate) sub: Option<String>,
    /// The member's `info` as compact JSON text (presence).
    pub(crate) info: Option<String>,
    /// Unix seconds when the grant ends (native tokens; Pusher grants do not end).
    pub(crate) exp: Option<u64>,
}

/// A native token for `channel`, checked now.
pub(crate) fn token(
    ctx: &SessionCtx,
    project: &ProjectState,
    channel: &str,
    token: &str,
) -> Result<Member, ClientError> {
    let snapshot = ctx.shard.keys().load();
    let g = ctx
        .admission
        .verify(&snapshot, project.index, token, channel, unix_now())
        .map_err(ClientError::Token)?;
    Ok(Member {
        sub: g.sub,
        info: g.info,
        exp: Some(g.exp),
    })
}

/// Pusher's channel authorisation: `auth` = `<key>:<hex HMAC-SHA256>` over
/// `<socket_id>:<channel>[:<channel_data>]` with one of the project's token secrets in
/// force, `<key>` an active public key of this project; for presence, the member
/// `channel_data` names.
pub(crate) fn signature(
    ctx: &SessionCtx,
    project: &ProjectState,
    socket_id: &str,
    channel: &str,
    auth: &str,
    channel_data: Option<&str>,
) -> Result<Member, ClientError> {
    // Pusher signs `channel_data` for presence channels only: a private channel's
    // signature covers `socket_id:channel`, whatever else the frame carries.
    let presence = crate::shard::is_presence(channel);
    let channel_data = channel_data.filter(|_| presence);
    pusher_signed(ctx, project, unix_now(), |secrets| {
        check_channel_auth(auth, socket_id, channel, channel_data, secrets)
    })
    .map_err(|e| e.map_or(ClientError::KeyNotPublic, ClientError::Auth))?;
    let (sub, info) = match channel_data {
        Some(data) => {
            let (user, info) = member_of(data)?;
            (Some(user), info)
        }
        _ => (None, None),
    };
    Ok(Member {
        sub,
        info,
        exp: None,
    })
}

/// A Pusher signature (`auth` = `<key>:<signature>`) that `check` verifies with the
/// project's token secrets in force at `now`, and whose `<key>` is an active public key
/// of the project (channel authorisations and sign-ins). `Err(None)`: the key is not.
pub(super) fn pusher_signed<'a>(
    ctx: &SessionCtx,
    project: &ProjectState,
    now: u64,
    check: impl FnOnce(&[&str]) -> Result<&'a str, ChannelAuthError>,
) -> Result<(), Option<ChannelAuthError>> {
    let snapshot = ctx.shard.keys().load();
    let secrets = snapshot
        .token_keys(project.index)
        .map(|k| k.secrets_at(now))
        .unwrap_or_default();
    let key = check(&secrets).map_err(Some)?;
    match snapshot.lookup(key) {
        Some(entry)
            if entry.kind == crate::apikey::KeyKind::Public
                && entry.project.index == project.index =>
        {
            Ok(())
        }
        _ => Err(None),
    }
}

/// Whether `sub` may name a presence member.
pub(crate) fn user_ok(sub: Option<&str>) -> Result<&str, ClientError> {
    match sub {
        Some(u) if (1..=MAX_USER_ID_CHARS).contains(&u.chars().count()) => Ok(u),
        _ => Err(ClientError::Token(TokenRefusal::NoSubject)),
    }
}

/// The member a presence `channel_data` names: (user id as a string, `user_info` as
/// compact JSON text when it is an object). The number 10 is the user "10"; a
/// `user_info` that is not an object is left out (native frames carry `info` only as
/// an object).
fn member_of(channel_data: &str) -> Result<(String, Option<String>), ClientError> {
    let bad = ClientError::Member;
    let mut fields =
        json_object(channel_data).ok_or_else(|| bad("channel_data must be a JSON object"))?;
    let user = match fields.remove("user_id") {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        _ => return Err(bad("channel_data needs a user_id (a string or an integer)")),
    };
    if !(1..=MAX_USER_ID_CHARS).contains(&user.chars().count()) {
        return Err(bad("user_id must be 1 to 128 characters"));
    }
    let info = user_info(fields.remove("user_info"))
        .map_err(|()| bad("user_info must be at most 1 KiB of JSON"))?;
    Ok((user, info))
}

/// The fields of `text` when it is one JSON object (a presence `channel_data`, a
/// sign-in's `user_data`).
pub(super) fn json_object(text: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(fields)) => Some(fields),
        _ => None,
    }
}

/// A member's `user_info` as compact JSON text when it is an object (`None` when it is
/// missing or not an object); `Err` when that text is longer than [`MAX_INFO_BYTES`].
pub(super) fn user_info(value: Option<serde_json::Value>) -> Result<Option<String>, ()> {
    match value {
        Some(v @ serde_json::Value::Object(_)) => {
            let text = v.to_string();
            if text.len() > MAX_INFO_BYTES {
                return Err(());
            }
            Ok(Some(text))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_come_from_channel_data_as_node_and_python_write_it() {
        let (u, i) = member_of(r#"{"user_id":"u1","user_info":{"name":"Ann"}}"#)
            .ok()
            .unwrap();
        assert_eq!(
            (u.as_str(), i.as_deref()),
            ("u1", Some(r#"{"name":"Ann"}"#))
        );
        let (u, i) = member_of(r#"{"user_id": 10, "user_info": {"name": "Bo"}}"#)
            .ok()
            .unwrap();
        assert_eq!((u.as_str(), i.as_deref()), ("10", Some(r#"{"name":"Bo"}"#)));
        let (u, i) = member_of(r#"{"user_id":"u2","user_info":true}"#)
            .ok()
            .unwrap();
        assert_eq!((u.as_str(), i), ("u2", None));
        for bad in [
            "",
            "[]",
            r#"{"user_info":{}}"#,
            r#"{"user_id":""}"#,
            r#"{"user_id":1.5}"#,
            r#"{"user_id":null}"#,
        ] {
            assert!(member_of(bad).is_err(), "{bad}");
        }
        let big = format!(
            r#"{{"user_id":"u","user_info":{{"x":"{}"}}}}"#,
            "a".repeat(1100)
        );
        assert!(member_of(&big).is_err());
    }
}
