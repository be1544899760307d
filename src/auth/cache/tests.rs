//! Unit tests of the key snapshot: lookups, rebuilds, app ids, webhooks.
use super::*;
use crate::project::{test_project, KeyRecord, ProjectRecord};
use crate::quota::RateLimit;

fn project(id: &str, rate: &str) -> ProjectRecord {
    ProjectRecord {
        name: format!("name-{id}"),
        rate_limit: RateLimit::parse(rate).unwrap(),
        client_events: false,
        ..test_project(id)
    }
}

/// Rebuild `cache` from these projects and keys alone.
fn rebuild(cache: &KeyCache, projects: Vec<ProjectRecord>, keys: Vec<KeyRecord>) {
    cache.rebuild(StoreContents {
        projects,
        keys,
        ..StoreContents::default()
    });
}

/// A freshly minted key under a chosen id.
fn key(id: &str, project_id: &str, kind: KeyKind) -> (KeyRecord, String) {
    let (mut record, full) = KeyRecord::mint(project_id, kind);
    record.id = id.into();
    (record, full)
}

#[test]
fn lookup_finds_active_keys_only() {
    let cache = KeyCache::new();
    assert_eq!(cache.load().generation(), 0);
    let (sk, sk_full) = key("key_s", "prj_a", KeyKind::Secret);
    let (mut pk, pk_full) = key("key_p", "prj_a", KeyKind::Public);
    pk.revoked = true;
    let (orphan, orphan_full) = key("key_o", "prj_gone", KeyKind::Secret);
    rebuild(&cache, vec![project("prj_a", "10/s")], vec![sk, pk, orphan]);
    let snap = cache.load();
    assert_eq!(snap.generation(), 1);
    let entry = snap.lookup(&sk_full).unwrap();
    assert_eq!(entry.key_id, "key_s");
    assert_eq!(entry.kind, KeyKind::Secret);
    assert_eq!(entry.project.id, "prj_a");
    assert!(snap.lookup(&pk_full).is_none(), "revoked");
    assert!(snap.lookup(&orphan_full).is_none(), "no project");
    assert!(snap.lookup("").is_none());
    assert!(snap.lookup(&format!("{sk_full}x")).is_none());
    assert!(snap.is_active("key_s"));
    assert!(!snap.is_active("key_p"));
    assert_eq!(snap.active_keys(), 1);
    assert_eq!(snap.project("prj_a").unwrap().index, 0);
}

#[test]
fn rebuild_preserves_project_state_and_applies_new_limits() {
    let cache = KeyCache::new();
    let (sk, sk_full) = key("key_s", "prj_a", KeyKind::Secret);
    let contents = |rate: &str, keys: Vec<KeyRecord>| StoreContents {
        projects: vec![project("prj_a", rate), project("prj_b", "1/s")],
        keys,
        ..StoreContents::default()
    };
    cache.rebuild(contents("2/s", vec![sk.clone()]));
    let before = Arc::clone(&cache.load().lookup(&sk_full).unwrap().project);
    // Real clock: rebuild applies limits with `Quota::set_limit`, which reads it.
    let now = crate::quota::now_ns();
    assert!(before.quota.check(now).allowed);
    assert!(before.quota.check(now).allowed);
    assert!(!before.quota.check(now).allowed);

    // Same limit, another key added: the very same state, still exhausted.
    let (pk, _) = key("key_p", "prj_a", KeyKind::Public);
    cache.rebuild(contents("2/s", vec![sk.clone(), pk]));
    let after = Arc::clone(&cache.load().lookup(&sk_full).unwrap().project);
    assert!(Arc::ptr_eq(&before, &after));
    assert!(!after.quota.check(now).allowed);

    // A new limit applies to the same quota, keeping the used share: still
    // exhausted, but refilling at 4/s (one per 250 ms, where 2/s needed 500 ms).
    cache.rebuild(contents("4/s", vec![sk.clone()]));
    let snap = cache.load();
    let after = &snap.lookup(&sk_full).unwrap().project;
    assert!(Arc::ptr_eq(&before, after));
    assert_eq!(after.quota.limit(), RateLimit::parse("4/s").unwrap());
    assert!(!after.quota.check(now).allowed);
    assert!(after.quota.check(now + 250_000_000).allowed);
    assert_eq!(snap.generation(), 3);

    // Indexes: a before b, stable; a new project gets the next one.
    assert_eq!(snap.project("prj_a").unwrap().index, 0);
    assert_eq!(snap.project("prj_b").unwrap().index, 1);
    drop(snap);
    let mut c = contents("4/s", vec![sk]);
    c.projects.insert(0, project("prj_c", "1/s"));
    cache.rebuild(c);
    let snap = cache.load();
    assert_eq!(snap.project("prj_c").unwrap().index, 2);
    assert_eq!(snap.project("prj_a").unwrap().index, 0);
}

#[test]
fn a_webhook_carries_the_oldest_public_key_and_the_newest_secret() {
    use crate::project::{HookKind, HookKinds, WebhookSpec};
    let master = MasterKey::random();
    let secret = |id: &str, clear: &str, expires_at: Option<i64>| TokenSecretRecord {
        id: id.into(),
        project_id: "prj_a".into(),
        sealed: master.seal("prj_a", clear.as_bytes()).unwrap(),
        expires_at,
    };
    let (mut revoked, _) = key("key_0", "prj_a", KeyKind::Public);
    revoked.revoked = true;
    let (mut legacy, _) = key("key_1", "prj_a", KeyKind::Public);
    legacy.public_key = None; // made before schema 6: hash only
    let (first, first_full) = key("key_2", "prj_a", KeyKind::Public);
    let (second, _) = key("key_3", "prj_a", KeyKind::Public);
    let (sk, _) = key("key_4", "prj_a", KeyKind::Secret);
    let mut hooked = project("prj_a", "1/s");
    hooked.webhook = Some(WebhookSpec {
        url: "http://127.0.0.1:9/hook".into(),
        events: HookKinds::DEFAULT,
    });
    let far = crate::store::unix_now() + 3600;
    let token_secrets = vec![
        secret("tsk_1", "ts_old", Some(far)),
        secret("tsk_2", "ts_new", None),
    ];
    let cache = KeyCache::with_master(master);
    cache.rebuild(StoreContents {
        projects: vec![hooked, project("prj_b", "1/s")],
        keys: vec![revoked, legacy, first, second, sk],
        token_secrets,
        ..StoreContents::default()
    });
    let snap = cache.load();
    let a = snap.project("prj_a").unwrap().index;
    let b = snap.project("prj_b").unwrap().index;
    let target = snap.webhook(a).unwrap();
    assert_eq!(target.url, "http://127.0.0.1:9/hook");
    assert!(target.events.contains(HookKind::ChannelVacated));
    assert!(!target.events.contains(HookKind::ClientEvent));
    assert_eq!(target.public_key.as_deref(), Some(first_full.as_str()));
    assert_eq!(target.secret.as_deref(), Some(&b"ts_new"[..]));
    let shown = format!("{target:?}");
    assert!(
        !shown.contains("ts_new") && !shown.contains("127.0.0.1"),
        "{shown}"
    );
    assert!(snap.webhook(b).is_none());
}

#[test]
fn projects_are_found_by_app_id_and_the_pusher_switch_applies_in_place() {
    let cache = KeyCache::new();
    let (sk, sk_full) = key("key_s", "prj_a", KeyKind::Secret);
    let mut a = project("prj_a", "1/s");
    a.pusher_app_id = 1_000_000;
    let mut b = project("prj_b", "1/s");
    b.pusher_app_id = 1_000_001;
    b.pusher = false;
    rebuild(&cache, vec![a.clone(), b.clone()], vec![sk.clone()]);
    let snap = cache.load();
    let by_key = &snap.lookup(&sk_full).unwrap().project;
    let by_app = snap.project_by_app_id(1_000_000).unwrap();
    assert!(Arc::ptr_eq(by_key, by_app), "the same handle either way");
    assert_eq!(by_app.pusher_app_id, 1_000_000);
    assert!(by_app.pusher_enabled(), "on by default");
    let off = snap.project_by_app_id(1_000_001).unwrap();
    assert_eq!(off.id, "prj_b");
    assert!(!off.pusher_enabled(), "found while off: the route says why");
    assert!(snap.project_by_app_id(1_000_002).is_none());
    assert!(snap.project_by_app_id(0).is_none());
    let before = Arc::clone(by_app);
    drop(snap);

    // The switch flips on the same state (like client events).
    a.pusher = false;
    b.pusher = true;
    rebuild(&cache, vec![a.clone(), b.clone()], vec![sk.clone()]);
    let snap = cache.load();
    let after = snap.project_by_app_id(1_000_000).unwrap();
    assert!(Arc::ptr_eq(&before, after));
    assert!(!before.pusher_enabled());
    assert!(snap.project_by_app_id(1_000_001).unwrap().pusher_enabled());
    drop(snap);

    // A renumbered project (a restored store) is a new state under the new id only;
    // its index stays.
    a.pusher_app_id = 1_000_005;
    rebuild(&cache, vec![a, b], vec![sk]);
    let snap = cache.load();
    assert!(snap.project_by_app_id(1_000_000).is_none());
    let renumbered = snap.project_by_app_id(1_000_005).unwrap();
    assert!(!Arc::ptr_eq(&before, renumbered));
    assert_eq!(renumbered.index, before.index);
    assert!(Arc::ptr_eq(
        renumbered,
        &snap.lookup(&sk_full).unwrap().project
    ));
}

#[test]
fn a_shared_app_id_stays_with_the_older_project() {
    let cache = KeyCache::new();
    let mut old = project("prj_old", "1/s");
    old.pusher_app_id = 1_000_000;
    let mut new = project("prj_new", "1/s");
    new.pusher_app_id = 1_000_000;
    for _ in 0..2 {
        rebuild(&cache, vec![old.clone(), new.clone()], vec![]);
        assert_eq!(
            cache.load().project_by_app_id(1_000_000).unwrap().id,
            "prj_old"
        );
    }
}

#[test]
fn a_rename_keeps_index_and_quota_position() {
    let cache = KeyCache::new();
    rebuild(&cache, vec![project("prj_a", "1/s")], vec![]);
    let old = Arc::clone(cache.load().project("prj_a").unwrap());
    let now = crate::quota::now_ns();
    assert!(old.quota.check(now).allowed);
    let mut renamed = project("prj_a", "1/s");
    renamed.name = "new".into();
    rebuild(&cache, vec![renamed], vec![]);
    let snap = cache.load();
    let new = snap.project("prj_a").unwrap();
    assert_eq!(new.name, "new");
    assert_eq!(new.index, old.index);
    assert!(!new.quota.check(now).allowed);
}
