//! Unit tests of presence (the parent module), kept apart so that the module reads as
//! its logic alone.

use super::*;
use crate::shard::interest::channel_hash;
use std::sync::Mutex;

trait Apply {
    fn apply(&mut self, op: Op);
}
impl Apply for (&mut Local, &Effects) {
    fn apply(&mut self, op: Op) {
        apply_local(self.0, self.1, op);
    }
}

#[derive(Default)]
struct Log(Mutex<Vec<String>>);
impl Transitions for Log {
    fn occupied(&self, _p: u32, c: &str) {
        self.0.lock().unwrap().push(format!("occupied {c}"));
    }
    fn vacated(&self, _p: u32, c: &str) {
        self.0.lock().unwrap().push(format!("vacated {c}"));
    }
    fn member_added(&self, _p: u32, c: &str, u: &str) {
        self.0.lock().unwrap().push(format!("added {c} {u}"));
    }
    fn member_removed(&self, _p: u32, c: &str, u: &str) {
        self.0.lock().unwrap().push(format!("removed {c} {u}"));
    }
}

fn join(user: &str, worker: usize, conn: u64, ticket: u64) -> Op {
    Op::Join(PresenceJoin {
        project: 1,
        channel: "presence-room".into(),
        user_id: user.into(),
        info: Some("{\"n\":1}".into()),
        worker,
        conn,
        ticket,
    })
}

fn leave(worker: usize, conn: u64) -> Op {
    Op::Leave(Leave {
        project: 1,
        channel: "presence-room".into(),
        worker,
        conn,
    })
}

fn drain(m: &Mailboxes, worker: usize) -> Vec<String> {
    let mb = m.get(worker).unwrap();
    let mut out = Vec::new();
    while let Some(e) = mb.try_recv() {
        out.push(match e {
            Envelope::Presence(b) => {
                let text = String::from_utf8_lossy(&b.frame[2..]).into_owned();
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                format!(
                    "{} {}",
                    v["action"].as_str().unwrap(),
                    v["user_id"].as_str().unwrap()
                )
            }
            Envelope::PresenceReady { ticket, answer } => match answer {
                PresenceAnswer::Joined(o) => format!("ready {ticket} {o}"),
                PresenceAnswer::Full => format!("full {ticket}"),
                PresenceAnswer::OtherUser => format!("other-user {ticket}"),
            },
            other => format!("{other:?}"),
        });
    }
    out
}

#[test]
fn a_user_joins_once_and_leaves_once_whatever_its_connections() {
    let m = Mailboxes::new(2, 16);
    for w in 0..2 {
        m.get(w)
            .unwrap()
            .interest
            .add(channel_hash(1, "presence-room"));
    }
    let log = Arc::new(Log::default());
    let mut local = Local::new(2);
    let fx = Effects {
        mailboxes: m.clone(),
        hooks: Some(log.clone()),
    };
    let mut s = (&mut local, &fx);
    s.apply(join("u1", 0, 1, 10));
    assert_eq!(drain(&m, 1), ["join u1"]);
    assert_eq!(
        drain(&m, 0),
        [
            "join u1".to_string(),
            "ready 10 {\"count\":1,\"members\":[{\"user_id\":\"u1\",\"info\":{\"n\":1}}]}"
                .to_string()
        ]
    );
    // A second tab on another worker: no frame, same single member.
    s.apply(join("u1", 1, 7, 11));
    assert_eq!(drain(&m, 0), Vec::<String>::new());
    assert_eq!(drain(&m, 1).len(), 1);
    // A third user over the limit of 2 is refused; a second one is not.
    s.apply(join("u2", 1, 8, 12));
    drain(&m, 0);
    drain(&m, 1);
    s.apply(join("u3", 1, 9, 13));
    assert_eq!(drain(&m, 1), ["full 13"]);
    // A connection of u1 cannot join again as u9: refused, no frame, u1 stays.
    s.apply(join("u9", 0, 1, 14));
    assert_eq!(drain(&m, 0), ["other-user 14"]);
    assert!(drain(&m, 1).is_empty());
    assert_eq!(s.0.object(1, "presence-room").matches("user_id").count(), 2);
    // Leaving: only the last connection of u1 makes a leave.
    s.apply(leave(0, 1));
    assert!(drain(&m, 0).is_empty());
    s.apply(leave(1, 7));
    assert_eq!(drain(&m, 0), ["leave u1"]);
    // Unknown connections (refused, or never joined) change nothing.
    s.apply(leave(1, 9));
    s.apply(leave(0, 99));
    assert!(drain(&m, 0).is_empty());
    assert_eq!(
        *log.0.lock().unwrap(),
        [
            "added presence-room u1",
            "added presence-room u2",
            "removed presence-room u1"
        ]
    );
}

#[test]
fn counts_make_occupied_and_vacated_once_and_list_by_prefix() {
    let m = Mailboxes::new(1, 16);
    let log = Arc::new(Log::default());
    let mut local = Local::new(100);
    let fx = Effects {
        mailboxes: m,
        hooks: Some(log.clone()),
    };
    let mut s = (&mut local, &fx);
    let count = |s: &mut (&mut Local, &Effects), c: &str, d: i32| {
        s.apply(Op::Count(Count {
            project: 1,
            channel: c.into(),
            delta: d,
        }))
    };
    count(&mut s, "news", 1);
    count(&mut s, "news", 1);
    count(&mut s, "news-eu", 1);
    count(&mut s, "sport", 1);
    count(&mut s, "news", -1);
    let (tx, rx) = crate::reply::reply();
    s.apply(Op::Query(Query::Channels {
        project: 1,
        prefix: "news".into(),
        users: false,
        reply: tx,
    }));
    let list: Vec<(Box<str>, u64)> = futures_lite_block(rx)
        .into_iter()
        .map(|l| (l.name, l.subscribers))
        .collect();
    let expected: Vec<(Box<str>, u64)> = vec![("news".into(), 1), ("news-eu".into(), 1)];
    assert_eq!(list, expected);
    count(&mut s, "news", -1);
    count(&mut s, "news", 1);
    assert_eq!(
        *log.0.lock().unwrap(),
        [
            "occupied news",
            "occupied news-eu",
            "occupied sport",
            "vacated news",
            "occupied news"
        ]
    );
    count(&mut s, "news", -1);
    count(&mut s, "news-eu", -1);
    count(&mut s, "sport", -1);
    assert!(
        s.0.projects.is_empty(),
        "no record is kept for empty channels"
    );
}

#[test]
fn members_read_from_redis_are_checked_as_a_single_node_checks_them() {
    let m = |u: &str, i: &str| checked_member(u.into(), Some(i.into()));
    assert_eq!(
        m("u1", r#"{"name":"Ann"}"#),
        Some(("u1".into(), Some(r#"{"name":"Ann"}"#.into())))
    );
    assert_eq!(m("u1", ""), Some(("u1".into(), None)));
    for bad in [
        "[1,2]",
        "\"text\"",
        "{\"a\":1}]}",
        "{\"a\":1},{\"b\":2}",
        "not json",
        "{\"a\":",
    ] {
        assert_eq!(m("u1", bad), Some(("u1".into(), None)), "{bad}");
    }
    let big = format!("{{\"x\":\"{}\"}}", "a".repeat(1100));
    assert_eq!(m("u1", &big), Some(("u1".into(), None)));
    assert_eq!(m("", "{}"), None);
    assert_eq!(m(&"u".repeat(129), "{}"), None);
    assert!(m(&"é".repeat(128), "{}").is_some());
}

#[test]
fn a_listing_answers_one_more_than_the_cap_when_cut() {
    let m = Mailboxes::new(1, 16);
    let mut local = Local::new(100);
    let fx = Effects {
        mailboxes: m,
        hooks: None,
    };
    let mut s = (&mut local, &fx);
    for i in 0..=MAX_LISTED {
        s.apply(Op::Count(Count {
            project: 1,
            channel: format!("c{i:05}").into(),
            delta: 1,
        }));
    }
    let list = |s: &mut (&mut Local, &Effects), prefix: &str| {
        let (tx, rx) = crate::reply::reply();
        s.apply(Op::Query(Query::Channels {
            project: 1,
            prefix: prefix.into(),
            users: false,
            reply: tx,
        }));
        futures_lite_block(rx)
    };
    // One more than listed says the listing is cut (the REST answers' "truncated").
    let all = list(&mut s, "c");
    assert_eq!(all.len(), MAX_LISTED + 1);
    assert_eq!(&*all[MAX_LISTED - 1].name, "c09999");
    let some = list(&mut s, "c0");
    assert_eq!(some.len(), MAX_LISTED);
    s.apply(Op::Count(Count {
        project: 1,
        channel: "c10000".into(),
        delta: -1,
    }));
    let all = list(&mut s, "");
    assert_eq!(all.len(), MAX_LISTED);
}

/// The reply is filled synchronously by `apply`: take it without a runtime.
fn futures_lite_block<T>(rx: crate::reply::Reply<Result<T, crate::reply::Unreachable>>) -> T {
    rx.try_take().expect("answered").expect("not unreachable")
}
