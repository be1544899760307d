//! One webhook attempt: build the body (`{"time_ms":..,"events":[..]}`, stamped now),
//! sign it, POST it, and say how it went. Runs on a project's own sender thread, never
//! on a worker; an attempt blocks that thread for at most [`ATTEMPT_TIMEOUT`].
//!
//! Every attempt reads the project's webhook from the current key snapshot, so a
//! retry goes to the URL set now, is re-stamped, and is re-signed with the newest
//! token secret; a webhook turned off meanwhile ends the retries ([`Outcome::Off`]).
//! Nothing secret is logged: not the secret, not the signature, not the URL (it may
//! carry credentials).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::address;
use super::queue::Outcome;
use crate::auth::KeyCache;

/// No answer within this long is a failure (then retried).
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// `X-Pusher-Signature`: hex HMAC-SHA256 of the body under the token secret, as every
/// other Pusher signature.
use crate::auth::pusher::sign;

/// The request body for `events_json` (a JSON array) at `time_ms`.
pub(crate) fn body(time_ms: u64, events_json: &str) -> String {
    format!("{{\"time_ms\":{time_ms},\"events\":{events_json}}}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The HTTP client of one sender thread: keeps its connection to the endpoint alive
/// between requests; 3xx are answers like any other non-2xx (never followed). Unless
/// `allow_private`, it connects only to addresses the policy allows ([`address`]), and
/// never through a proxy (the address checked is the address connected to).
pub(crate) fn agent(allow_private: bool) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(ATTEMPT_TIMEOUT))
        .max_redirects(0)
        .user_agent(concat!("ringcast/", env!("CARGO_PKG_VERSION"), " webhooks"));
    if allow_private {
        return config.build().into();
    }
    ureq::Agent::with_parts(
        config.proxy(None).build(),
        ureq::unversioned::transport::DefaultConnector::new(),
        address::CheckedResolver::default(),
    )
}

/// Why an attempt failed, for the (rate-limited) log line.
#[derive(Debug)]
pub(crate) enum Failure {
    Status(u16),
    Transport(String),
    /// The host resolved only to addresses the policy refuses.
    Refused(String),
    NoSecret,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Status(s) => write!(f, "the endpoint answered {s}"),
            Failure::Transport(e) => write!(f, "no answer: {e}"),
            Failure::Refused(why) => f.write_str(why),
            Failure::NoSecret => f.write_str(
                "the project has no token secret to sign with (ringcast project rotate-token-secret makes one)",
            ),
        }
    }
}

/// Make one attempt for `project` with these events.
pub(crate) fn attempt(
    agent: &ureq::Agent,
    keys: &KeyCache,
    project: u32,
    events_json: &str,
) -> (Outcome, Option<Failure>) {
    let target = match keys.load().webhook(project) {
        Some(t) => t.clone(),
        None => return (Outcome::Off, None),
    };
    let Some(secret) = target.secret.as_deref() else {
        return (Outcome::Failed, Some(Failure::NoSecret));
    };
    let body = body(now_ms(), events_json);
    let mut request = agent
        .post(&target.url)
        .content_type("application/json")
        .header("X-Pusher-Signature", sign(secret, body.as_bytes()));
    if let Some(key) = &target.public_key {
        request = request.header("X-Pusher-Key", key);
    }
    match request.send(body) {
        Ok(mut response) => {
            let status = response.status().as_u16();
            // Read (a bounded amount of) the answer so the connection can be reused.
            let _ = response
                .body_mut()
                .with_config()
                .limit(64 * 1024)
                .read_to_vec();
            if (200..300).contains(&status) {
                (Outcome::Delivered, None)
            } else {
                (Outcome::Failed, Some(Failure::Status(status)))
            }
        }
        Err(e) => match address::refusal_of(&e) {
            Some(refusal) => (Outcome::Failed, Some(Failure::Refused(refusal.to_string()))),
            None => (Outcome::Failed, Some(Failure::Transport(e.to_string()))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hex_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            body(12, "[{\"name\":\"channel_occupied\",\"channel\":\"a\"}]"),
            "{\"time_ms\":12,\"events\":[{\"name\":\"channel_occupied\",\"channel\":\"a\"}]}"
        );
    }
}
