//! Which client protocol a connection speaks: ringcast's own or Pusher's protocol 7.
//! The fan-out picks a broadcast's form by it (`shard::fanout`), and the closes a
//! connection receives are translated by it ([`Dialect::translate`]).
//!
//! A leaf: it names only the close table (`close`).

use crate::close::{code, Disconnect};

/// Which client protocol a connection speaks, for the codes its closes carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    #[default]
    Native,
    Pusher,
}

impl Dialect {
    /// The close this dialect's client must see for `why`. Native: unchanged. Pusher:
    /// 4008 (slow consumer) becomes 4100 (reconnect after a delay), 4009 becomes 4201
    /// and 1001 becomes 4200 (reconnect now); 4010 (the app ended the user's access)
    /// becomes 4009, Pusher's own `terminate_connections` close; 4001 stays (pusher-js does not reconnect,
    /// which is right for a revoked key); protocol-level 1xxx codes stay. Never a 43xx:
    /// pusher-js gives up on every one of them.
    pub const fn translate(self, why: Disconnect) -> Disconnect {
        match self {
            Dialect::Native => why,
            Dialect::Pusher => match why.code {
                code::SLOW_CONSUMER => Disconnect {
                    code: code::PUSHER_OVER_CAPACITY,
                    reason: why.reason,
                },
                code::HEARTBEAT_TIMEOUT => Disconnect {
                    code: code::PUSHER_PONG_TIMEOUT,
                    reason: why.reason,
                },
                code::GOING_AWAY => Disconnect {
                    code: code::PUSHER_RECONNECT_NOW,
                    reason: why.reason,
                },
                code::USER_DISCONNECTED => Disconnect {
                    code: code::PUSHER_TERMINATED,
                    reason: "You got disconnected by the app.",
                },
                _ => why,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pusher_clients_never_see_a_code_they_give_up_on_wrongly() {
        let p = Dialect::Pusher;
        assert_eq!(p.translate(Disconnect::SLOW_CONSUMER).code, 4100);
        assert_eq!(p.translate(Disconnect::HEARTBEAT_TIMEOUT).code, 4201);
        assert_eq!(p.translate(Disconnect::SHUTDOWN).code, 4200);
        assert_eq!(p.translate(Disconnect::KEY_REVOKED).code, 4001);
        assert_eq!(p.translate(Disconnect::USER_DISCONNECTED).code, 4009);
        assert_eq!(
            Dialect::Native
                .translate(Disconnect::USER_DISCONNECTED)
                .code,
            4010
        );
        assert_eq!(p.translate(Disconnect::FRAME_TOO_LARGE).code, 1009);
        assert_eq!(
            Dialect::Native.translate(Disconnect::SLOW_CONSUMER).code,
            4008
        );
    }
}
