//! Unit tests of `client::session`.

use super::*;
use crate::client::codec::{nesting_depth, MAX_CLIENT_JSON_DEPTH};
use crate::client::private::unix_now;
use crate::client::{EventContext, Expiry};
use crate::shard::tests::{shard, Recorder};
use crate::shard::Shard;
use std::sync::Arc;

fn frames(conn: &WsConn) -> Vec<serde_json::Value> {
    conn.take_queued()
        .iter()
        .map(|f| {
            // 2-byte header, or 4 with a 16-bit length (frames of 126+ bytes).
            let start = if f[1] & 0x7f == 126 { 4 } else { 2 };
            serde_json::from_slice(&f[start..]).expect("a JSON text frame")
        })
        .collect()
}

fn send(session: &mut NativeSession, conn: &Rc<WsConn>, text: &str) -> Result<(), Disconnect> {
    let mut payload = text.as_bytes().to_vec();
    let result = session.on_message(conn, Opcode::Text, &mut payload);
    // The recorder confirms interest through the mailbox, as the cluster would.
    session.ctx.shard.drain();
    result
}

fn setup(max: usize) -> (NativeSession, Rc<WsConn>, Rc<Shard>, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let (s, conn, shard) = setup_with(max, &rec, rec.clone());
    (s, conn, shard, rec)
}

/// [`setup`] with `sink` standing for the cluster (`rec` confirms interest for it).
fn setup_with(
    max: usize,
    rec: &Arc<Recorder>,
    sink: Arc<dyn crate::shard::InterestSink>,
) -> (NativeSession, Rc<WsConn>, Rc<Shard>) {
    let (shard, mailboxes) = shard(Some(sink));
    *rec.1.lock().unwrap() = Some(mailboxes);
    let conn = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let project = Arc::new(ProjectState {
        id: "prj_test".into(),
        name: "test".into(),
        index: 9,
        quota: crate::quota::Quota::new(crate::quota::RateLimit::parse("1/s").unwrap()),
        history: Arc::default(),
        ws_connections: Arc::default(),
        max_connections: crate::auth::cache::NODE_DEFAULT.into(),
        client_events: false.into(),
        pusher_app_id: 1_000_000,
        pusher: true.into(),
        require_user: false.into(),
        blocks: Arc::default(),
    });
    let events = test_events(mailboxes_of(rec));
    (
        NativeSession::new(
            SessionCtx::new(
                shard.clone(),
                Expiry::new(shard.clone()),
                events,
                crate::client::Admission::new(1_000_000_000, max),
                test_read_ctx(),
            ),
            project,
        ),
        conn,
        shard,
    )
}

/// Client events relayed into `mailboxes` (worker 0's shard drains them).
struct TestRelay(crate::shard::mailbox::Mailboxes, crate::history::History);

impl crate::publish::Fanout for TestRelay {
    fn mailboxes(&self) -> &crate::shard::mailbox::Mailboxes {
        &self.0
    }
    fn relay(&self) -> Option<&dyn crate::shard::mailbox::Relay> {
        None
    }
    fn shutting_down(&self) -> bool {
        false
    }
    fn history(&self) -> &dyn crate::history::backend::Backend {
        &self.1
    }
}

fn test_events(mailboxes: crate::shard::mailbox::Mailboxes) -> Rc<EventContext> {
    EventContext::new(
        Arc::new(TestRelay(
            mailboxes,
            crate::history::History::new(0, crate::history::Recoveries::Allowed),
        )),
        Rc::new(crate::ids::IdGen::new(0)),
        0,
        64 * 1024,
        None,
    )
}

fn mailboxes_of(rec: &Recorder) -> crate::shard::mailbox::Mailboxes {
    rec.1
        .lock()
        .unwrap()
        .clone()
        .expect("the recorder's mailboxes")
}

/// A session of project index 0 ("prj_p") whose token secret is `secret`.
fn private_setup(secret: &str) -> (NativeSession, Rc<WsConn>, Rc<Shard>, Rc<Expiry>) {
    use crate::auth::KeyCache;
    use crate::project::{ProjectRecord, TokenSecretRecord};
    use crate::sealed::MasterKey;
    use crate::shard::mailbox::Mailboxes;
    use crate::shard::ShardSetup;
    use crate::store::StoreContents;
    let master = MasterKey::random();
    let sealed = master.seal("prj_p", secret.as_bytes()).unwrap();
    let keys = KeyCache::with_master(master);
    let unopened = keys.rebuild(StoreContents {
        projects: vec![ProjectRecord {
            id: "prj_p".into(),
            name: "p".into(),
            rate_limit: crate::quota::RateLimit::parse("1/s").unwrap(),
            history: crate::history::HistorySpec::OFF,
            max_connections: None,
            client_events: false,
            webhook: None,
            pusher_app_id: 1_000_000,
            pusher: true,
        }],
        token_secrets: vec![TokenSecretRecord {
            id: "tsk_1".into(),
            project_id: "prj_p".into(),
            sealed,
            expires_at: None,
        }],
        ..StoreContents::default()
    });
    assert_eq!(unopened, 0);
    let project = keys.load().project("prj_p").expect("the project").clone();
    let mailboxes = Mailboxes::new(1, 16);
    let shard = Rc::new(Shard::new(ShardSetup {
        index: 0,
        keys,
        mailbox: mailboxes.get(0).unwrap(),
        sink: None,
        max_connections: 2,
        send_budget: 1 << 30,
        max_subscriptions: 1 << 20,
        watch: None,
        history: std::sync::Arc::new(crate::history::History::new(
            1 << 20,
            crate::history::Recoveries::Allowed,
        )),
    }));
    let expiry = Expiry::new(shard.clone());
    let conn = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let events = test_events(mailboxes.clone());
    let session = NativeSession::new(
        SessionCtx::new(
            shard.clone(),
            expiry.clone(),
            events,
            // 2 channels; unthrottled (a burst of 2 would refuse this test's frames).
            crate::client::Admission::new(1_000_000_000, 2),
            test_read_ctx(),
        ),
        project,
    );
    (session, conn, shard, expiry)
}

fn token(secret: &str, claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

#[test]
fn private_subscribe_refresh_and_expiry_keep_session_and_registry_in_step() {
    const TS: &str = "ts_unit";
    let (mut s, conn, shard, expiry) = private_setup(TS);
    let exp = unix_now() + 60;
    let sub = |c: &str, t: &str| format!(r#"{{"type":"subscribe","channel":"{c}","token":"{t}"}}"#);
    let t_a = token(
        TS,
        serde_json::json!({"channel": "private-a", "exp": exp, "sub": "u"}),
    );
    send(
        &mut s,
        &conn,
        r#"{"type":"subscribe","channel":"private-a"}"#,
    )
    .unwrap();
    send(&mut s, &conn, &sub("private-a", "x.y.z")).unwrap();
    let refused = frames(&conn);
    assert!(refused
        .iter()
        .all(|f| f["code"] == "forbidden" && f["channel"] == "private-a"));
    assert_eq!(shard.subscriber_count(0, "private-a"), 0);
    assert_eq!(expiry.armed(), 0);

    send(&mut s, &conn, &sub("private-a", &t_a)).unwrap();
    assert_eq!(frames(&conn)[0]["type"], "subscribed");
    assert_eq!(shard.subscriber_count(0, "private-a"), 1);
    assert_eq!(expiry.armed(), 1);

    // Refresh: another sub is refused, the same sub moves exp.
    let refresh_as = |sub: &str| {
        let t = token(
            TS,
            serde_json::json!({"channel": "private-a", "exp": exp + 10, "sub": sub}),
        );
        format!(r#"{{"type":"refresh","channel":"private-a","token":"{t}"}}"#)
    };
    send(&mut s, &conn, &refresh_as("v")).unwrap();
    assert_eq!(frames(&conn)[0]["code"], "forbidden");
    send(&mut s, &conn, &refresh_as("u")).unwrap();
    let r = frames(&conn);
    assert_eq!(r[0]["type"], "refreshed");
    assert_eq!(r[0]["exp"], exp + 10);
    assert_eq!(expiry.armed(), 1, "a refresh replaces the deadline");

    // The timer ends it; the next frame prunes it from the session, so the
    // subscription slot is free again (limit 2 here) and a new subscribe registers.
    let far = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    assert_eq!(expiry.fire_due(far), 1);
    assert_eq!(frames(&conn)[0]["reason"], "token_expired");
    assert_eq!(shard.subscriber_count(0, "private-a"), 0);
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"more"}"#).unwrap();
    let kinds: Vec<_> = frames(&conn).iter().map(|f| f["type"].clone()).collect();
    assert_eq!(kinds, ["subscribed", "subscribed"]);
    let t_b = token(TS, serde_json::json!({"channel": "private-a", "exp": exp}));
    send(&mut s, &conn, &sub("private-a", &t_b)).unwrap();
    assert_eq!(frames(&conn)[0]["code"], "too_many_subscriptions");
    assert_eq!(expiry.armed(), 0, "no grant without a subscription");

    // Unsubscribe and the end of the connection disarm.
    send(&mut s, &conn, r#"{"type":"unsubscribe","channel":"news"}"#).unwrap();
    send(&mut s, &conn, &sub("private-a", &t_b)).unwrap();
    assert_eq!(frames(&conn)[1]["type"], "subscribed");
    assert_eq!(expiry.armed(), 1);
    send(
        &mut s,
        &conn,
        r#"{"type":"unsubscribe","channel":"private-a"}"#,
    )
    .unwrap();
    assert_eq!(expiry.armed(), 0);
    send(&mut s, &conn, &sub("private-a", &t_b)).unwrap();
    assert_eq!(expiry.armed(), 1);
    s.on_end(&conn);
    assert_eq!(expiry.armed(), 0);
    assert_eq!(shard.subscriber_count(0, "private-a"), 0);
}

#[test]
fn nesting_depth_ignores_strings() {
    assert_eq!(nesting_depth(br#"{"type":"ping"}"#), 1);
    assert_eq!(nesting_depth(br#"{"a":[[{}]]}"#), 4);
    assert_eq!(nesting_depth(br#"{"a":"[[[[\"[["}"#), 1);
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(nesting_depth(deep.as_bytes()) > MAX_CLIENT_JSON_DEPTH);
}

#[test]
fn subscribe_is_idempotent_and_registers_once() {
    let (mut s, conn, shard, rec) = setup(8);
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    let replies = frames(&conn);
    assert_eq!(replies.len(), 2);
    for r in &replies {
        assert_eq!(r["type"], "subscribed");
        assert_eq!(r["channel"], "news");
    }
    assert_eq!(shard.subscriber_count(9, "news"), 1);
    // Another project's channel of the same name is untouched.
    assert_eq!(shard.subscriber_count(10, "news"), 0);
    assert_eq!(rec.0.lock().unwrap().len(), 1);
}

#[test]
fn unsubscribe_answers_even_when_not_subscribed() {
    let (mut s, conn, shard, rec) = setup(8);
    send(&mut s, &conn, r#"{"type":"unsubscribe","channel":"news"}"#).unwrap();
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    send(&mut s, &conn, r#"{"type":"unsubscribe","channel":"news"}"#).unwrap();
    let kinds: Vec<_> = frames(&conn).iter().map(|f| f["type"].clone()).collect();
    assert_eq!(kinds, ["unsubscribed", "subscribed", "unsubscribed"]);
    assert_eq!(shard.subscriber_count(9, "news"), 0);
    let log = rec.0.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![(9, "news".into(), true), (9, "news".into(), false)]
    );
}

#[test]
fn the_subscription_limit_answers_an_error_and_keeps_the_rest() {
    let (mut s, conn, shard, _rec) = setup(2);
    for c in ["a", "b", "c"] {
        let text = format!(r#"{{"type":"subscribe","channel":"{c}"}}"#);
        send(&mut s, &conn, &text).unwrap();
    }
    let replies = frames(&conn);
    assert_eq!(replies[2]["type"], "error");
    assert_eq!(replies[2]["code"], "too_many_subscriptions");
    assert_eq!(shard.subscriber_count(9, "c"), 0);
    assert_eq!(s.subscriptions().count(), 2);
}

#[test]
fn bad_frames_get_error_frames_and_keep_the_connection() {
    let (mut s, conn, _shard, _rec) = setup(8);
    let cases = [
        ("not json", "invalid_json"),
        (r#"{"channel":"x"}"#, "unknown_type"),
        (r#"{"type":"dance"}"#, "unknown_type"),
        (r#"{"type":"subscribe","channel":7}"#, "invalid_channel"),
        (r#"{"type":"subscribe","channel":""}"#, "invalid_channel"),
        (
            r#"{"type":"subscribe","channel":"a\u0001"}"#,
            "invalid_channel",
        ),
    ];
    for (text, code) in cases {
        send(&mut s, &conn, text).unwrap();
        let got = frames(&conn);
        assert_eq!(got.len(), 1, "{text}");
        assert_eq!(got[0]["type"], "error", "{text}");
        assert_eq!(got[0]["code"], code, "{text}");
    }
    let deep = format!("{}{}", "[".repeat(64), "]".repeat(64));
    send(&mut s, &conn, &deep).unwrap();
    assert_eq!(frames(&conn)[0]["code"], "invalid_json");
    send(&mut s, &conn, r#"{"type":"ping"}"#).unwrap();
    assert_eq!(frames(&conn)[0]["type"], "pong");
}

#[test]
fn binary_frames_close_with_1003() {
    let (mut s, conn, _shard, _rec) = setup(8);
    let err = s
        .on_message(&conn, Opcode::Binary, &mut [1, 2, 3])
        .unwrap_err();
    assert_eq!(err, Disconnect::BINARY_UNSUPPORTED);
}

#[test]
fn the_end_of_a_connection_leaves_every_channel() {
    let (mut s, conn, shard, rec) = setup(8);
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"a"}"#).unwrap();
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"b"}"#).unwrap();
    s.on_end(&conn);
    assert_eq!(
        shard.subscriber_count(9, "a") + shard.subscriber_count(9, "b"),
        0
    );
    assert_eq!(shard.websockets(), 0);
    let offs = rec.0.lock().unwrap().iter().filter(|e| !e.2).count();
    assert_eq!(offs, 2);
}

/// The reader knobs of a session under test (its frames are handed to it directly).
fn test_read_ctx() -> crate::ws::conn::ReadCtx {
    crate::ws::conn::ReadCtx {
        limits: crate::ws::conn::ReadLimits {
            max_message: 1 << 20,
            max_fragments: 64,
            pause_backlog: 1 << 20,
        },
        clock: Box::new(|| 0),
    }
}

/// A sink standing for the cluster whose history subscribes wait (their tickets kept)
/// until the test answers them; interest is confirmed as `Recorder` does.
struct WaitingSink(Arc<Recorder>, std::sync::Mutex<Vec<u64>>);
impl crate::shard::InterestSink for WaitingSink {
    fn interest(&self, worker: usize, project: u32, channel: &str, on: bool, ticket: u64) {
        self.0.interest(worker, project, channel, on, ticket);
    }
    fn history_subscribe(&self, req: crate::shard::HistorySubscribe) -> bool {
        self.1.lock().unwrap().push(req.ticket);
        true
    }
}

/// Review of issue 25: a server unsubscribe of a channel whose cluster history join
/// still waits for Redis tells the client, and the session forgets the channel: a
/// later subscribe is a new join, answered and registered (not "again").
#[test]
fn a_server_unsubscribe_of_a_pending_history_join_lets_a_later_subscribe_join() {
    use crate::shard::mailbox::{Envelope, HistoryReady};
    let rec = Arc::new(Recorder::default());
    let sink = Arc::new(WaitingSink(rec.clone(), Default::default()));
    let (mut s, conn, shard) = setup_with(8, &rec, sink.clone());
    let mailboxes = mailboxes_of(&rec);
    s.project
        .history
        .set(crate::history::HistorySpec::parse("10/60s").unwrap());
    s.set_user(
        &conn,
        crate::client::user::ConnUser {
            sub: "ann".into(),
            exp: None,
            info: None,
        },
    );
    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    assert_eq!(sink.1.lock().unwrap().len(), 1, "the join waits for Redis");
    assert!(frames(&conn).is_empty());

    mailboxes.end_user(
        9,
        "ann".into(),
        crate::shard::users::UserEnd::Unsubscribe("news".into()),
    );
    shard.drain();
    assert_eq!(
        frames(&conn),
        vec![serde_json::json!({"type":"unsubscribed","channel":"news","reason":"server"})]
    );

    send(&mut s, &conn, r#"{"type":"subscribe","channel":"news"}"#).unwrap();
    let ticket = *sink.1.lock().unwrap().last().unwrap();
    mailboxes.control_to(
        0,
        Envelope::HistoryReady {
            ticket,
            ready: HistoryReady::Unknown,
        },
    );
    shard.drain();
    let replies = frames(&conn);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0]["type"], "subscribed");
    assert_eq!(shard.subscriber_count(9, "news"), 1, "registered anew");
}
