//! Unit tests of `shard`.

use super::*;
use crate::dialect::Dialect;
use crate::ids::SocketId;
use crate::shard::join::HistoryDone;
use crate::shard::mailbox::{Mailboxes, PresenceAnswer};
use crate::shard::users::UserEnd;

/// A shard on its own, with a mailbox and an optional recording interest sink.
pub(crate) fn shard(sink: Option<Arc<dyn InterestSink>>) -> (Rc<Shard>, Mailboxes) {
    shard_with(sink, None)
}

/// [`shard`] with `watch` standing for the node's presence hub.
pub(crate) fn shard_with(
    sink: Option<Arc<dyn InterestSink>>,
    watch: Option<Arc<dyn ChannelWatch>>,
) -> (Rc<Shard>, Mailboxes) {
    let mailboxes = Mailboxes::new(1, 16);
    let shard = Shard::new(ShardSetup {
        index: 0,
        keys: KeyCache::new(),
        mailbox: mailboxes.get(0).expect("one mailbox"),
        sink,
        max_connections: 2,
        history: Arc::new(History::new(1 << 20, crate::history::Recoveries::Allowed)),
        send_budget: 1 << 30,
        max_subscriptions: 1 << 20,
        watch,
    });
    (Rc::new(shard), mailboxes)
}

/// Put a broadcast of `frame` on `channel` of project 3 into the mailboxes (`except`:
/// its sender's connection).
fn publish(mailboxes: &Mailboxes, channel: &str, frame: Bytes, except: Option<SocketId>) {
    assert!(mailboxes.broadcast(Arc::new(Broadcast::new(3, channel.into(), frame, except))));
}

/// A presence hub that never answers: records the tickets of the joins it is asked.
#[derive(Default)]
pub(crate) struct SilentHub(pub std::sync::Mutex<Vec<u64>>);
impl ChannelWatch for SilentHub {
    fn count(&self, _worker: usize, _project: u32, _channel: &str, _delta: i32) {}
    fn join(&self, join: PresenceJoin) {
        self.0.lock().unwrap().push(join.ticket);
    }
    fn leave(&self, _worker: usize, _conn: u64, _project: u32, _channel: &str) {}
}

/// A join of presence channel `channel` of project `project` that must be cancelled
/// before the hub answers it (any answer panics).
pub(crate) fn cancelled_presence(project: u32, channel: &str) -> JoinRequest<'_> {
    JoinRequest {
        project,
        channel,
        history: crate::history::HistorySpec::OFF,
        since: None,
        again: false,
        presence: Some(Presence {
            user_id: "ann".into(),
            info: None,
            reply: PresenceReply {
                joined: |_, _| panic!("cancelled"),
                refused: |_, _| panic!("cancelled"),
                forget: Box::new(|| panic!("cancelled")),
            },
        }),
    }
}

/// A subscribe's answer that says nothing (presence joins answer through their own).
pub(crate) fn no_answer(_: &str, _: Option<(u64, &str)>, _: Option<bool>) -> Option<Bytes> {
    None
}

/// Records interest changes; with `confirm` set, confirms each gain at once through
/// the worker's mailbox, as the cluster bridge does once Redis answered.
#[derive(Default)]
pub(crate) struct Recorder(
    pub std::sync::Mutex<Vec<(u32, String, bool)>>,
    pub std::sync::Mutex<Option<Mailboxes>>,
);
impl InterestSink for Recorder {
    fn interest(&self, worker: usize, project: u32, channel: &str, on: bool, ticket: u64) {
        self.0
            .lock()
            .unwrap()
            .push((project, channel.to_string(), on));
        if let (true, Some(m)) = (on, &*self.1.lock().unwrap()) {
            m.control_to(
                worker,
                Envelope::InterestReady {
                    project,
                    channel: channel.into(),
                    ticket,
                },
            );
        }
    }
}

/// A sink standing for the cluster: records history subscribes.
#[derive(Default)]
pub(crate) struct HistorySink(pub std::sync::Mutex<Vec<(u64, bool)>>);
impl InterestSink for HistorySink {
    fn interest(&self, _worker: usize, _project: u32, _channel: &str, on: bool, _t: u64) {
        self.0.lock().unwrap().push((0, on));
    }
    fn history_subscribe(&self, req: HistorySubscribe) -> bool {
        self.0.lock().unwrap().push((req.ticket, true));
        true
    }
}

#[test]
fn a_history_subscribe_holds_interest_until_its_answer_or_its_cancel() {
    let sink = Arc::new(HistorySink::default());
    let (shard, mailboxes) = shard(Some(sink.clone()));
    let mb = mailboxes.get(0).unwrap();
    let h = channel_hash(3, "news");
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let ran = Rc::new(Cell::new(false));
    let (r, c) = (ran.clone(), a.clone());
    let spec = crate::history::HistorySpec::parse("10/60s").unwrap();
    let done: HistoryDone = Box::new(move |shard, _ready| {
        shard.subscribe(3, "news", &c);
        r.set(true);
    });
    assert!(shard.history_subscribe(1, 3, "news", None, spec, 1 << 16, done));
    assert!(
        mb.interest.may_want(h),
        "messages reach the mailbox meanwhile"
    );
    assert_eq!(
        shard.subscriber_count(3, "news"),
        0,
        "not live before the answer"
    );
    mailboxes.control_to(
        0,
        Envelope::HistoryReady {
            ticket: 1,
            ready: mailbox::HistoryReady::Unknown,
        },
    );
    shard.drain();
    assert!(ran.get());
    assert_eq!(shard.subscriber_count(3, "news"), 1);
    // The hold was given back: gain (the request), gain (first subscriber), loss.
    let seen: Vec<bool> = sink.0.lock().unwrap().iter().map(|e| e.1).collect();
    assert_eq!(seen, [true, true, false]);
    assert!(
        mb.interest.may_want(h),
        "the subscriber's own count remains"
    );
    // Cancelled (unsubscribed before the answer): the answer does nothing.
    let b = Rc::new(WsConn::new(2, -1, 1 << 20, 0));
    let done: HistoryDone = Box::new(move |shard, _| {
        shard.subscribe(3, "other", &b);
    });
    assert!(shard.history_subscribe(2, 3, "other", None, spec, 1 << 16, done));
    shard.unsubscribe(3, "other", 2);
    assert!(!mb.interest.may_want(channel_hash(3, "other")));
    mailboxes.control_to(
        0,
        Envelope::HistoryReady {
            ticket: 2,
            ready: mailbox::HistoryReady::Unknown,
        },
    );
    shard.drain();
    assert_eq!(shard.subscriber_count(3, "other"), 0);
}

#[test]
fn a_first_subscriber_is_answered_once_the_cluster_confirmed() {
    let rec = Arc::new(Recorder::default());
    let (shard, _mailboxes) = shard(Some(rec.clone()));
    let (a, b) = two_conns();
    let ok = Bytes::from_static(b"\x81\x02ok");
    shard.subscribe(3, "news", &a);
    shard.reply_when_live(3, "news", &a, ok.clone());
    // A later subscriber on this core waits behind the first one.
    shard.subscribe(3, "news", &b);
    shard.reply_when_live(3, "news", &b, ok.clone());
    assert_eq!(
        a.queued_bytes() + b.queued_bytes(),
        0,
        "answered before Redis"
    );
    // A stale ticket releases nothing.
    shard.interest_ready(3, "news", 99);
    assert_eq!(a.queued_bytes(), 0);
    shard.interest_ready(3, "news", 1);
    assert_eq!(a.take_queued(), vec![ok.clone()]);
    assert_eq!(b.take_queued(), vec![ok.clone()]);
    // Confirmed: the next subscriber is answered at once.
    let c = Rc::new(WsConn::new(3, -1, 1 << 20, 0));
    shard.subscribe(3, "news", &c);
    shard.reply_when_live(3, "news", &c, ok.clone());
    assert_eq!(c.take_queued(), vec![ok.clone()]);
    // Leaving before the confirmation still gets `subscribed` first.
    shard.subscribe(3, "other", &a);
    shard.reply_when_live(3, "other", &a, ok.clone());
    shard.unsubscribe(3, "other", 1);
    assert_eq!(a.take_queued(), vec![ok]);
}

#[test]
fn a_broadcast_in_the_confirmation_window_waits_behind_subscribed() {
    let rec = Arc::new(Recorder::default());
    let (shard, mailboxes) = shard(Some(rec.clone()));
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let ok = Bytes::from_static(b"\x81\x02ok");
    let frame = Bytes::from_static(b"\x81\x02{}");
    shard.subscribe(3, "news", &a);
    shard.reply_when_live(3, "news", &a, ok.clone());
    // A local publish lands before Redis acknowledged the SUBSCRIBE.
    publish(&mailboxes, "news", frame.clone(), None);
    assert_eq!(shard.drain(), 1);
    assert_eq!(a.queued_bytes(), 0, "nothing may overtake `subscribed`");
    shard.interest_ready(3, "news", 1);
    assert_eq!(a.take_queued(), vec![ok.clone(), frame.clone()]);
    // Leaving inside the window: `subscribed`, the message, then nothing more.
    shard.subscribe(3, "other", &a);
    shard.reply_when_live(3, "other", &a, ok.clone());
    publish(&mailboxes, "other", frame.clone(), None);
    shard.drain();
    shard.unsubscribe(3, "other", 1);
    assert_eq!(a.take_queued(), vec![ok, frame]);
}

#[test]
fn transitions_reach_the_filter_and_the_sink_once() {
    let rec = Arc::new(Recorder::default());
    let (shard, mailboxes) = shard(Some(rec.clone()));
    let (a, b) = two_conns();
    let h = channel_hash(3, "news");
    assert_eq!(shard.subscribe(3, "news", &a), Subscribed::First);
    assert_eq!(shard.subscribe(3, "news", &b), Subscribed::Added);
    assert!(mailboxes.get(0).unwrap().interest.may_want(h));
    assert_eq!(shard.unsubscribe(3, "news", 1), Unsubscribed::Removed);
    assert_eq!(shard.unsubscribe(3, "news", 2), Unsubscribed::Last);
    assert!(!mailboxes.get(0).unwrap().interest.may_want(h));
    let log = rec.0.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            (3, "news".to_string(), true),
            (3, "news".to_string(), false)
        ]
    );
}

/// Connections 1 and 2 of a worker (1 MiB send queues).
fn two_conns() -> (Rc<WsConn>, Rc<WsConn>) {
    let conn = |id| Rc::new(WsConn::new(id, -1, 1 << 20, 0));
    (conn(1), conn(2))
}

/// A shard (no sink) with connections 1 and 2 subscribed to `channel` of project 3.
fn two_subscribers(channel: &str) -> (Rc<Shard>, Mailboxes, Rc<WsConn>, Rc<WsConn>) {
    let (shard, mailboxes) = shard(None);
    let (a, b) = two_conns();
    shard.subscribe(3, channel, &a);
    shard.subscribe(3, channel, &b);
    (shard, mailboxes, a, b)
}

#[test]
fn drain_delivers_one_shared_frame_to_each_subscriber() {
    let (shard, mailboxes, a, b) = two_subscribers("news");
    let frame = bytes::Bytes::from_static(b"\x81\x02{}");
    publish(&mailboxes, "news", frame.clone(), None);
    assert_eq!(shard.drain(), 1);
    assert_eq!(a.queued_bytes(), b.queued_bytes());
    assert!(a.queued_bytes() > frame.len());
    assert_eq!(shard.drain(), 0);
}

#[test]
fn a_broadcast_skips_its_sender_only_on_the_senders_worker() {
    let (shard, mailboxes, a, b) = two_subscribers("private-x");
    let send = |except| {
        publish(
            &mailboxes,
            "private-x",
            bytes::Bytes::from_static(b"\x81\x02{}"),
            except,
        );
        shard.drain();
        (a.take_queued().len(), b.take_queued().len())
    };
    // This shard is worker 0: connection 1 of worker 0 is left out.
    assert_eq!(send(Some(SocketId::local(0, 1))), (0, 1));
    // The same connection id on another worker is another connection.
    assert_eq!(send(Some(SocketId::local(1, 1))), (1, 1));
    assert_eq!(send(None), (1, 1));
}

#[test]
fn admission_is_bounded_and_released() {
    let (shard, _m) = shard(None);
    let g1 = shard.admit().expect("first");
    let _g2 = shard.admit().expect("second");
    assert!(shard.admit().is_none());
    drop(g1);
    assert!(shard.admit().is_some());
}

#[test]
fn a_compressed_frame_held_in_the_confirmation_window_is_counted() {
    let metrics = crate::metrics::Metrics::new(1);
    crate::metrics::install(metrics.worker(0).unwrap());
    let rec = Arc::new(Recorder::default());
    let (shard, mailboxes) = shard(Some(rec.clone()));
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0).with_compression(Some(15)));
    let json = "{\"name\":\"some item\",\"price\":12},".repeat(60);
    let frame = crate::ws::frame::frame(Opcode::Text, json.as_bytes());
    shard.subscribe(3, "news", &a);
    shard.reply_when_live(3, "news", &a, Bytes::from_static(b"\x81\x02ok"));
    publish(&mailboxes, "news", frame.clone(), None);
    shard.drain();
    shard.interest_ready(3, "news", 1);
    let sent = a.take_queued();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1][0], 0xC1, "held, then sent compressed");
    let text = metrics.render(&crate::metrics::NodeGauges::default());
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
    };
    assert_eq!(value("ringcast_compressed_frames_total"), Some(1));
    let saved = (frame.len() - sent[1].len()) as u64;
    assert_eq!(value("ringcast_compression_saved_bytes_total"), Some(saved));
    assert_eq!(value("ringcast_deflate_runs_total"), Some(1));
}

/// A sink standing for the cluster that keeps each history subscribe's `since`.
#[derive(Default)]
struct SinceSink(std::sync::Mutex<Vec<AskedSince>>);

/// The `since` a history subscribe carried to the cluster.
type AskedSince = Option<(u64, Box<str>)>;
impl InterestSink for SinceSink {
    fn interest(&self, _worker: usize, _project: u32, _channel: &str, _on: bool, _t: u64) {}
    fn history_subscribe(&self, req: HistorySubscribe) -> bool {
        self.0.lock().unwrap().push(req.since);
        true
    }
}

/// The review of issue 24's restructure: a repeated subscribe with `since` to a held
/// history channel asks Redis for the position only (a replay would duplicate what the
/// connection got live); a first one asks for the missed messages.
#[test]
fn a_held_history_channel_is_asked_again_without_since() {
    let sink = Arc::new(SinceSink::default());
    let (shard, _mailboxes) = shard(Some(sink.clone()));
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let spec = crate::history::HistorySpec::parse("10/60s").unwrap();
    fn answer(_: &str, _: Option<(u64, &str)>, _: Option<bool>) -> Option<Bytes> {
        None
    }
    for again in [false, true] {
        let req = JoinRequest {
            project: 3,
            channel: "news",
            history: spec,
            since: Some((7, "0badcafe")),
            again,
            presence: None,
        };
        shard.join(&a, req, answer);
    }
    let seen = sink.0.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].as_ref().map(|s| s.0),
        Some(7),
        "a first subscribe recovers"
    );
    assert!(seen[1].is_none(), "a held channel is not replayed");
}

// Users (`users`): ending a user's access on one worker.

fn frames(conn: &WsConn) -> Vec<serde_json::Value> {
    conn.take_queued()
        .iter()
        .filter(|f| f[0] == 0x81)
        .map(|f| serde_json::from_str(crate::wire::test_payload(f)).unwrap())
        .collect()
}

#[test]
fn end_user_closes_with_4010_and_unsubscribes_with_reason_server() {
    // A close starts the connection's writer and grace timer: a runtime is needed.
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("legacy runtime")
        .block_on(async { end_user_on_one_worker() });
}

fn end_user_on_one_worker() {
    let (shard, mailboxes) = shard(None);
    let (a, b) = two_conns();
    let other = Rc::new(WsConn::new(3, -1, 1 << 20, 0));
    let pusher = Rc::new(WsConn::new(4, -1, 1 << 20, 0).with_dialect(Dialect::Pusher));
    let ua = shard.user_join(7, "ann".into(), &a);
    let _ub = shard.user_join(7, "ann".into(), &b);
    let _uo = shard.user_join(7, "bob".into(), &other);
    let _up = shard.user_join(7, "ann".into(), &pusher);
    // The same user id in another project is another user.
    let elsewhere = Rc::new(WsConn::new(5, -1, 1 << 20, 0));
    let _ue = shard.user_join(8, "ann".into(), &elsewhere);
    assert_eq!(mailboxes.user_connections(7, "ann"), 3);
    assert_eq!(mailboxes.user_connections(7, "bob"), 1);
    assert_eq!(mailboxes.user_connections(8, "ann"), 1);
    assert_eq!(mailboxes.user_connections(9, "ann"), 0);
    assert_eq!(shard.user_connections(), 5);

    for c in [&a, &other, &pusher] {
        shard.subscribe(7, "news", c);
    }
    mailboxes.end_user(7, "ann".into(), UserEnd::Unsubscribe("news".into()));
    assert_eq!(shard.drain(), 1);
    assert_eq!(shard.subscriber_count(7, "news"), 1, "bob keeps it");
    assert_eq!(
        frames(&a),
        vec![serde_json::json!({"type":"unsubscribed","channel":"news","reason":"server"})]
    );
    assert!(frames(&b).is_empty(), "b held no such channel");
    assert!(
        pusher.take_queued().is_empty(),
        "Pusher has no frame for it"
    );
    assert_eq!(&*ua.take_removed(), &["news".into()] as &[Arc<str>]);
    assert!(!ua.has_removed());

    mailboxes.end_user(7, "ann".into(), UserEnd::Disconnect);
    assert_eq!(shard.drain(), 1);
    assert_eq!(a.close_code(), Some(4010));
    assert_eq!(b.close_code(), Some(4010));
    assert_eq!(pusher.close_code(), Some(4009), "Pusher's terminate close");
    assert!(other.is_open() && elsewhere.is_open());

    shard.user_leave(&ua);
    shard.user_leave(&ua);
    assert_eq!(mailboxes.user_connections(7, "ann"), 2, "left once");
    assert_eq!(shard.user_connections(), 4);
}

/// Review of issue 25: a server unsubscribe of a channel an idle connection neither holds
/// nor is joining leaves nothing for its session to forget (the REST call can name any
/// channel, and the list is emptied only when the session runs); one it holds is listed
/// once, however often it is taken.
#[test]
fn a_server_unsubscribe_lists_only_held_channels_once() {
    let (shard, mailboxes) = shard(None);
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let ua = shard.user_join(7, "ann".into(), &a);
    for i in 0..1000 {
        let channel = format!("presence-{}", i % 10);
        mailboxes.end_user(7, "ann".into(), UserEnd::Unsubscribe(channel.into()));
        mailboxes.end_user(7, "ann".into(), UserEnd::Unsubscribe("news".into()));
        shard.drain();
    }
    assert!(!ua.has_removed(), "never held: nothing listed");
    assert!(frames(&a).is_empty(), "never held: nothing told");

    // Held, taken, held again (the session did not run in between), taken again.
    for _ in 0..2 {
        shard.subscribe(7, "presence-room", &a);
        mailboxes.end_user(
            7,
            "ann".into(),
            UserEnd::Unsubscribe("presence-room".into()),
        );
        shard.drain();
    }
    assert_eq!(frames(&a).len(), 2, "each take is told");
    assert_eq!(
        &*ua.take_removed(),
        &["presence-room".into()] as &[Arc<str>]
    );
}

/// Review of issue 25: a server unsubscribe of a channel whose join still waits (a
/// cluster history subscribe waiting for Redis, a presence join waiting for the hub)
/// treats it as held: the join is cancelled (its interest given back), the session is
/// told to forget the channel and a native client gets `unsubscribed` (Pusher nothing).
#[test]
fn a_server_unsubscribe_of_a_pending_join_is_told() {
    let sink = Arc::new(HistorySink::default());
    let hub = Arc::new(SilentHub::default());
    let (shard, mailboxes) = shard_with(Some(sink.clone()), Some(hub.clone()));
    let a = Rc::new(WsConn::new(1, -1, 1 << 20, 0));
    let p = Rc::new(WsConn::new(2, -1, 1 << 20, 0).with_dialect(Dialect::Pusher));
    let ua = shard.user_join(3, "ann".into(), &a);
    let up = shard.user_join(3, "ann".into(), &p);
    let spec = crate::history::HistorySpec::parse("10/60s").unwrap();
    fn answer(channel: &str, _: Option<(u64, &str)>, _: Option<bool>) -> Option<Bytes> {
        Some(Bytes::from(format!("subscribed {channel}")))
    }
    for c in [&a, &p] {
        let req = JoinRequest {
            project: 3,
            channel: "news",
            history: spec,
            since: None,
            again: false,
            presence: None,
        };
        shard.join(c, req, answer);
    }
    shard.join(&a, cancelled_presence(3, "presence-room"), no_answer);
    assert_eq!(sink.0.lock().unwrap().len(), 2, "both joins wait for Redis");
    let h = channel_hash(3, "news");
    assert!(mailboxes.get(0).unwrap().interest.may_want(h));

    mailboxes.end_user(3, "ann".into(), UserEnd::Unsubscribe("news".into()));
    mailboxes.end_user(
        3,
        "ann".into(),
        UserEnd::Unsubscribe("presence-room".into()),
    );
    assert_eq!(shard.drain(), 2);
    assert_eq!(
        frames(&a),
        vec![
            serde_json::json!({"type":"unsubscribed","channel":"news","reason":"server"}),
            serde_json::json!({"type":"unsubscribed","channel":"presence-room","reason":"server"}),
        ]
    );
    assert!(p.take_queued().is_empty(), "Pusher has no frame for it");
    assert_eq!(
        &*ua.take_removed(),
        &["news".into(), "presence-room".into()] as &[Arc<str>]
    );
    assert_eq!(&*up.take_removed(), &["news".into()] as &[Arc<str>]);
    assert!(
        !mailboxes.get(0).unwrap().interest.may_want(h),
        "the joins' holds are given back"
    );
    assert_eq!(shard.subscriber_count(3, "news"), 0);
    // The hub's late answer to the cancelled join finds nothing.
    let ticket = hub
        .0
        .lock()
        .unwrap()
        .pop()
        .expect("the presence join reached the hub");
    mailboxes.control_to(
        0,
        Envelope::PresenceReady {
            ticket,
            answer: PresenceAnswer::Full,
        },
    );
    assert_eq!(shard.drain(), 1);
    assert!(frames(&a).is_empty());
}
