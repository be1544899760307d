//! The routing table: which endpoint answers which path, and with which methods.
//!
//! Every endpoint answers with an [`Outcome`]. Unknown paths get 404, wrong methods 405
//! with `Allow`. `GET`/`HEAD /health` and the WebSocket upgrade take no body: a head
//! declaring one (`Content-Length` above 0) is a 400 decided from the head, before any
//! of the body is waited for, and the connection closes (the body is never read).

use std::rc::Rc;

use super::outcome::{answer, Outcome};
use super::parse::{Method, RequestHead};
use super::{
    channels, console, health, history, publish, pusher_rest, pusher_ws, upgrade, users, ApiError,
    Service,
};

/// Route one request whose head is parsed; `req` starts at the head.
pub(crate) fn route(
    svc: &Rc<Service>,
    head: &RequestHead,
    req: &[u8],
    out: &mut Vec<u8>,
    peer: Option<std::net::IpAddr>,
) -> Outcome {
    match &req[head.path.clone()] {
        b"/api/v1/publish" => match head.method() {
            Method::Post => publish::handle(svc, head, req, out, publish::Endpoint::One),
            _ => {
                publish::count(405);
                answer(out, ApiError::MethodNotAllowed("POST"))
            }
        },
        b"/api/v1/publish/batch" => match head.method() {
            Method::Post => publish::handle(svc, head, req, out, publish::Endpoint::Batch),
            _ => {
                publish::count(405);
                answer(out, ApiError::MethodNotAllowed("POST"))
            }
        },
        b"/api/v1/history" => match head.method() {
            Method::Get => history::handle(svc, head, req, out),
            _ => answer(out, ApiError::MethodNotAllowed("GET")),
        },
        b"/api/v1/channels" => match head.method() {
            Method::Get => channels::handle(svc, head, req, out, channels::Ask::List),
            _ => answer(out, ApiError::MethodNotAllowed("GET")),
        },
        b"/api/v1/channels/info" => match head.method() {
            Method::Get => channels::handle(svc, head, req, out, channels::Ask::Info),
            _ => answer(out, ApiError::MethodNotAllowed("GET")),
        },
        b"/api/v1/presence" => match head.method() {
            Method::Get => channels::handle(svc, head, req, out, channels::Ask::Presence),
            _ => answer(out, ApiError::MethodNotAllowed("GET")),
        },
        b"/api/v1/channels/unsubscribe" => users::handle_unsubscribe(svc, head, req, out),
        path if path.starts_with(b"/api/v1/users/") => {
            users::handle_user(svc, head, req, out, &path[14..])
        }
        b"/health" => match head.method() {
            Method::Get | Method::Head if head.has_body() => answer(
                out,
                ApiError::BadRequest("a /health request must not have a body"),
            ),
            Method::Get | Method::Head => health::handle(svc, head, out),
            _ => answer(out, ApiError::MethodNotAllowed("GET, HEAD")),
        },
        b"/api/v1/ws" if head.method() == Method::Get && head.has_body() => answer(
            out,
            ApiError::BadRequest("the WebSocket upgrade request must not have a body"),
        ),
        b"/api/v1/ws" => upgrade::handle(svc, head, req, out, peer),
        // The Pusher REST API: `/apps/{app_id}/...` (404 and 405 are its own to decide).
        path if path.starts_with(b"/apps/") => pusher_rest::handle(svc, head, req, out, &path[6..]),
        // The Pusher protocol's WebSocket: `/app/{key}` (one segment; pusher-js puts
        // nothing else in the path unless told to use a `wsPath` prefix).
        path if path.starts_with(b"/app/") && path.len() > 5 && !path[5..].contains(&b'/') => {
            if head.method() == Method::Get && head.has_body() {
                return answer(
                    out,
                    ApiError::BadRequest("the WebSocket upgrade request must not have a body"),
                );
            }
            pusher_ws::handle(svc, head, req, out, peer, &path[5..])
        }
        b"/console" | b"/console/" | b"/console/ringcast.js" if svc.config().console => {
            match head.method() {
                Method::Get | Method::Head => console::handle(head, &req[head.path.clone()], out),
                _ => answer(out, ApiError::MethodNotAllowed("GET, HEAD")),
            }
        }
        _ => answer(out, ApiError::NotFound),
    }
}
