//! Pusher's `POST /apps/{app_id}/users/{user_id}/terminate_connections` (the npm
//! `pusher` SDK's `terminateUserConnections`), once [`super::pusher_rest`] has checked
//! the route, the signature and the project's Pusher switch: the user id is
//! percent-decoded and checked (400), then the user is disconnected on every node as
//! by `POST /api/v1/users/{user_id}/disconnect` ([`super::users`]), answered 200 `{}`
//! as Pusher does (403 over the project's quota). The body, which the SDK sends as `{}`,
//! is covered by the signature and otherwise ignored. Pusher clients are closed with
//! Pusher's own close for a terminated user, so pusher-js does not reconnect.

use std::rc::Rc;
use std::sync::Arc;

use super::outcome::{answer, Outcome};
use super::Service;
use crate::auth::ProjectState;
use crate::project::users::valid_user_id;

pub(crate) fn handle(
    svc: &Rc<Service>,
    project: &Arc<ProjectState>,
    raw_user: &[u8],
    out: &mut Vec<u8>,
) -> Outcome {
    // Literal `+`: the segment is signed as sent, and a user id may contain one.
    let user = match crate::percent::decode(raw_user, crate::percent::Plus::Literal) {
        Ok(u) if valid_user_id(&u) => u,
        _ => return answer(out, super::users::bad_user_id()),
    };
    super::users::pusher_terminate(svc, out, project, user)
}
