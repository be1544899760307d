//! Who a connection is (contract 1.3, "Users"): the user a native connection token
//! (`?token=` on the upgrade, refreshed by `{"type":"refresh","token":..}` without a
//! channel) or a Pusher `pusher:signin` names, and what the session keeps of it.
//!
//! Invariants:
//! - A connection without a user costs nothing here: the user lives in the session's
//!   extras ([`UserState`], boxed with them), made only when a user is known.
//! - A connection's user never changes: a refresh or a second sign-in must name the
//!   same user, and a channel token naming another `sub` is refused.
//! - Every connection token is checked through the worker's cache of verified tokens
//!   (`client::admit`, `auth::verified`): at the upgrade within the node's upgrade
//!   rate (and the per-IP connect rate, when on), on a refresh within the connection's
//!   subscribe budget. A sign-in's HMAC is charged to the same budget.
//! - The connection token's `exp` + 5 s is a deadline in the worker's expiry timer
//!   (`client::private::Expiry`) like a channel grant's; at it the connection closes
//!   with 4011 unless a refresh moved it. No task or timer per connection.

use std::rc::Rc;
use std::sync::Arc;

use crate::auth::pusher::check_user_auth;
use crate::auth::token::{TokenRefusal, CONNECTION};
use crate::auth::ProjectState;
use crate::shard::users::UserConn;

use super::credential::{json_object, pusher_signed, user_info};
use super::ctx::SessionCtx;
use super::error::ClientError;
use super::private::{unix_now, Grant};

/// A user a credential proved, before the session holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnUser {
    pub(crate) sub: Arc<str>,
    /// Unix seconds when the connection token ends (`None`: Pusher sign-ins do not end).
    pub(crate) exp: Option<u64>,
    /// The token's `info` (or the sign-in's `user_info`) as compact JSON text: the
    /// member's `info` on presence channels whose credential gives none.
    pub(crate) info: Option<Box<str>>,
}

/// What a session keeps of its user (in its extras).
pub(crate) struct UserState {
    /// Its entry in the worker's index of users (`shard::users`).
    pub(crate) entry: Rc<UserConn>,
    /// The connection token's deadline in the expiry timer (native only).
    pub(crate) grant: Option<Rc<Grant>>,
    pub(crate) info: Option<Box<str>>,
}

impl UserState {
    pub(crate) fn user(&self) -> &Arc<str> {
        &self.entry.user
    }
}

/// Check a connection token for project `project` (the upgrade, a refresh).
pub(crate) fn connection_token(
    ctx: &SessionCtx,
    project: &ProjectState,
    token: &str,
) -> Result<ConnUser, TokenRefusal> {
    let snapshot = ctx.shard.keys().load();
    let now = unix_now();
    let g = ctx
        .admission
        .verify(&snapshot, project.index, token, CONNECTION, now)?;
    // `verify` refuses a connection token without a `sub`.
    let sub: Arc<str> = g.sub.as_deref().unwrap_or_default().into();
    if blocked(project, &sub, now) {
        return Err(TokenRefusal::Blocked);
    }
    Ok(ConnUser {
        sub,
        exp: Some(g.exp),
        info: g.info.map(String::into_boxed_str),
    })
}

/// Whether the project refuses native upgrades without a valid connection token
/// (`project set-limits --require-user on`).
pub(crate) fn requires_user(project: &ProjectState) -> bool {
    project.requires_user()
}

/// Whether the project blocks `user` at `now` (`POST /api/v1/users/{id}/block`).
pub(crate) fn blocked(project: &ProjectState, user: &str, now: u64) -> bool {
    project.user_blocked(user, now)
}

/// A `pusher:signin`: `auth` (`<key>:<signature>`) over
/// `<socket_id>::user::<user_data>` with one of the project's token secrets in force,
/// `<key>` an active public key of the project, and `user_data` a JSON object whose
/// `id` (a string, 1 to 200 characters) is the user.
pub(crate) fn signin(
    ctx: &SessionCtx,
    project: &ProjectState,
    socket_id: &str,
    user_data: &str,
    auth: &str,
) -> Result<ConnUser, ClientError> {
    let now = unix_now();
    pusher_signed(ctx, project, now, |secrets| {
        check_user_auth(auth, socket_id, user_data, secrets)
    })
    .map_err(|e| e.map_or(ClientError::SigninKey, ClientError::Signin))?;
    let (sub, info) = user_of(user_data)?;
    if blocked(project, &sub, now) {
        return Err(ClientError::SigninBlocked);
    }
    Ok(ConnUser {
        sub: sub.into(),
        exp: None,
        info,
    })
}

/// The user a sign-in's `user_data` names: its `id` (a string, as Pusher requires) and
/// its `user_info` as compact JSON text when it is an object of at most 1 KiB.
fn user_of(user_data: &str) -> Result<(String, Option<Box<str>>), ClientError> {
    let bad = ClientError::SigninUser;
    let mut fields =
        json_object(user_data).ok_or_else(|| bad("user_data must be a JSON object"))?;
    let id = match fields.remove("id") {
        Some(serde_json::Value::String(s)) => s,
        _ => return Err(bad("user_data needs an id (a string)")),
    };
    // The ids the REST calls that end a user's access take (no control character).
    if !crate::project::users::valid_user_id(&id) {
        return Err(bad(
            "the user id must be 1 to 200 characters, no control characters",
        ));
    }
    // A `user_info` over 1 KiB is left out: the sign-in stands without it.
    let info = user_info(fields.remove("user_info")).ok().flatten();
    Ok((id, info.map(String::into_boxed_str)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_names_the_user_by_a_string_id() {
        let (id, info) = user_of(r#"{"id":"ann","user_info":{"name":"Ann"}}"#).unwrap();
        assert_eq!(
            (id.as_str(), info.as_deref()),
            ("ann", Some(r#"{"name":"Ann"}"#))
        );
        let (id, info) = user_of(r#"{"id":"bo","watchlist":["x"]}"#).unwrap();
        assert_eq!((id.as_str(), info), ("bo", None));
        for bad in [
            "",
            "[]",
            r#"{"id":12}"#,
            r#"{"id":""}"#,
            r#"{"user_info":{}}"#,
        ] {
            assert!(user_of(bad).is_err(), "{bad}");
        }
        let long = format!(r#"{{"id":"{}"}}"#, "u".repeat(201));
        assert!(user_of(&long).is_err());
    }
}
