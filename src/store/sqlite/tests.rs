//! Unit tests of `store::sqlite`.

use super::*;
use crate::project::{CreatedProject, NewProject};
use crate::sealed::MasterKey;
use crate::store::UserStore;

fn rl(s: &str) -> RateLimit {
    RateLimit::parse(s).unwrap()
}

/// A new project of `name`, `rate` and no history.
fn new_project<'a>(name: &'a str, rate: &str) -> NewProject<'a> {
    NewProject {
        name,
        rate_limit: rl(rate),
        history: HistorySpec::OFF,
    }
}

#[test]
fn projects_and_keys_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    assert!(store.is_empty().unwrap());
    store.change_token().unwrap();

    let CreatedProject {
        project,
        secret_key: secret,
        public_key: public,
        ..
    } = store
        .create_project(new_project("orders", "50/s"), &MasterKey::random())
        .unwrap();
    assert!(project.id.starts_with("prj_"));
    assert_eq!(project.name, "orders");
    assert_eq!(project.rate_limit, rl("50/s"));
    assert_eq!(KeyKind::of_key(&secret), Some(KeyKind::Secret));
    assert_eq!(KeyKind::of_key(&public), Some(KeyKind::Public));
    assert!(!store.is_empty().unwrap());
    assert_eq!(project.pusher_app_id, 1_000_000);
    assert!(project.pusher, "on by default");

    assert_eq!(store.list_projects().unwrap(), vec![project.clone()]);

    let updated = store
        .set_project(&project.id, &ProjectChange::RateLimit(rl("6000/min")))
        .unwrap();
    assert_eq!(updated.rate_limit, rl("6000/min"));
    assert_eq!(store.list_projects().unwrap()[0].rate_limit, rl("6000/min"));

    let (extra, extra_key) = store.create_key(&project.id, KeyKind::Public).unwrap();
    assert!(extra.id.starts_with("key_"));
    assert_eq!(extra.hash, hash_key(&extra_key));
    assert_eq!(extra.prefix, key_prefix(&extra_key));

    let keys = store.list_keys(&project.id).unwrap();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0].kind, KeyKind::Secret);
    assert_eq!(keys[0].hash, hash_key(&secret));
    assert_eq!(keys[1].hash, hash_key(&public));
    assert_eq!(keys[0].public_key, None, "a secret key is never kept whole");
    assert_eq!(keys[1].public_key.as_deref(), Some(public.as_str()));
    assert_eq!(extra.public_key.as_deref(), Some(extra_key.as_str()));
    assert_eq!(keys[2], extra);
    assert!(keys.iter().all(|k| !k.revoked));

    // Revoke by full key, then by id; again is fine.
    assert_eq!(store.revoke_key(&secret).unwrap(), keys[0].id);
    assert_eq!(store.revoke_key(&extra.id).unwrap(), extra.id);
    assert_eq!(store.revoke_key(&extra.id).unwrap(), extra.id);
    let keys = store.list_keys(&project.id).unwrap();
    assert_eq!(
        keys.iter().map(|k| k.revoked).collect::<Vec<_>>(),
        [true, false, true]
    );

    let all = store.load_all().unwrap();
    assert_eq!(all.projects, vec![updated]);
    assert_eq!(all.keys, keys);

    // Reopening sees the same data (and does not re-run the migration).
    drop(store);
    let mut again = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(again.load_all().unwrap().keys, keys);
}

#[test]
fn the_database_never_holds_a_full_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let CreatedProject {
        secret_key: secret,
        public_key: public,
        token_secret: token,
        ..
    } = store
        .create_project(new_project("p", "1/s"), &MasterKey::random())
        .unwrap();
    drop(store);
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    for key in [secret, token] {
        let needle = &key.as_bytes()[3..];
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
    }
    // A public key is public (every web page carries one): kept whole, for the
    // webhook's X-Pusher-Key.
    let needle = &public.as_bytes()[3..];
    assert!(bytes.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn token_secrets_rotate_with_a_grace_and_keys_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let master = MasterKey::random();
    let CreatedProject {
        project,
        token_secret: first,
        ..
    } = store
        .create_project(new_project("p", "1/s"), &master)
        .unwrap();
    let all = store.load_all().unwrap();
    assert_eq!(all.token_secrets.len(), 1);
    let opened = master
        .open(&project.id, &all.token_secrets[0].sealed)
        .unwrap();
    assert_eq!(opened, first.as_bytes());
    assert_eq!(all.token_secrets[0].expires_at, None);

    let before = unix_now();
    let second = store.rotate_token_secret(&project.id, &master, 60).unwrap();
    assert_ne!(first, second);
    let all = store.load_all().unwrap();
    assert_eq!(all.token_secrets.len(), 2);
    let old_until = all.token_secrets[0].expires_at.unwrap();
    assert!(old_until >= before + 60 && old_until <= unix_now() + 60);
    assert_eq!(all.token_secrets[1].expires_at, None);
    // A later rotation with a longer grace never extends an earlier deadline.
    store
        .rotate_token_secret(&project.id, &master, 3600)
        .unwrap();
    let all = store.load_all().unwrap();
    assert_eq!(all.token_secrets[0].expires_at, Some(old_until));
    assert!(all.token_secrets[1].expires_at.unwrap() > old_until);

    let key = TokenKeyRecord::new(
        &project.id,
        TokenKeyAlg::EdDsa,
        "-----BEGIN PUBLIC KEY-----",
    );
    store.add_token_key(&key).unwrap();
    assert!(key.id.starts_with("tk_"));
    let stranger =
        TokenKeyRecord::new("prj_nope", TokenKeyAlg::EdDsa, "-----BEGIN PUBLIC KEY-----");
    assert!(matches!(
        store.add_token_key(&stranger),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.load_all().unwrap().token_keys, vec![key.clone()]);
    let nf = |r: Result<(), StoreError>| matches!(r, Err(StoreError::NotFound(_)));
    assert!(nf(store.remove_token_key("prj_nope", &key.id)));
    store.remove_token_key(&project.id, &key.id).unwrap();
    assert!(nf(store.remove_token_key(&project.id, &key.id)));
    assert!(store.load_all().unwrap().token_keys.is_empty());
    assert!(matches!(
        store.rotate_token_secret("prj_nope", &master, 0),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn unknown_ids_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let nf = |r: Result<_, StoreError>| matches!(r, Err(StoreError::NotFound(_)));
    assert!(nf(store
        .set_project("prj_nope", &ProjectChange::RateLimit(rl("1/s")))
        .map(|_| ())));
    assert!(nf(store
        .set_project("prj_nope", &ProjectChange::Pusher(false))
        .map(|_| ())));
    assert!(nf(store
        .create_key("prj_nope", KeyKind::Secret)
        .map(|_| ())));
    assert!(nf(store.list_keys("prj_nope").map(|_| ())));
    assert!(nf(store.revoke_key("key_nope").map(|_| ())));
    assert!(nf(store
        .revoke_key(&crate::apikey::generate_key(KeyKind::Secret))
        .map(|_| ())));
    assert!(nf(store.revoke_key("").map(|_| ())));
    let err = store
        .revoke_key(&crate::apikey::generate_key(KeyKind::Public))
        .unwrap_err();
    assert!(err.to_string().contains('…'), "full key echoed: {err}");
}

#[test]
fn invalid_names_are_refused_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let before = store.change_token().unwrap();
    assert!(matches!(
        store.create_project(new_project("", "1/s"), &MasterKey::random()),
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.change_token().unwrap(), before);
    assert!(store.is_empty().unwrap());
}

#[test]
fn change_token_sees_other_connections_and_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut watcher = SqliteStore::open(dir.path()).unwrap();
    let mut admin = SqliteStore::open(dir.path()).unwrap();
    let t0 = watcher.change_token().unwrap();
    assert_eq!(watcher.change_token().unwrap(), t0, "stable without writes");

    let project = admin
        .create_project(new_project("p", "1/s"), &MasterKey::random())
        .unwrap()
        .project;
    let t1 = watcher.change_token().unwrap();
    assert_ne!(t1, t0);

    admin
        .set_project(&project.id, &ProjectChange::RateLimit(rl("2/s")))
        .unwrap();
    let t2 = watcher.change_token().unwrap();
    assert_ne!(t2, t1);

    // A commit by the watching connection itself.
    watcher.create_key(&project.id, KeyKind::Public).unwrap();
    let t3 = watcher.change_token().unwrap();
    assert_ne!(t3, t2);

    // A raw write by a tool that knows nothing of the counter.
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    raw.execute("UPDATE projects SET name = 'renamed'", [])
        .unwrap();
    assert_ne!(watcher.change_token().unwrap(), t3);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path()).unwrap());
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(raw);
    assert!(matches!(
        SqliteStore::open(dir.path()),
        Err(StoreError::SchemaTooNew { .. })
    ));
}

/// A database left at any older schema opens, migrates to the current one and keeps
/// its projects; every later column works on it.
#[test]
fn every_older_schema_migrates() {
    for version in 1..SCHEMA_VERSION {
        let dir = tempfile::tempdir().unwrap();
        let mut raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let tx = raw.transaction().unwrap();
        for step in &MIGRATIONS[..version as usize] {
            tx.execute_batch(step).unwrap();
        }
        // Inserted newest-stamped first: app ids follow insertion (rowid) order.
        // From schema 7 on, a project is always written with its app id.
        let sql = if version >= 7 {
            "INSERT INTO projects (id, name, rate_limit, created_at, pusher_app_id) VALUES ('prj_old', 'old', '5/s', 1, 1000000), ('prj_older', 'older', '5/s', 0, 1000001)"
        } else {
            "INSERT INTO projects (id, name, rate_limit, created_at) VALUES ('prj_old', 'old', '5/s', 1), ('prj_older', 'older', '5/s', 0)"
        };
        tx.execute(sql, []).unwrap();
        tx.pragma_update(None, "user_version", version).unwrap();
        tx.commit().unwrap();
        drop(raw);

        let mut store = SqliteStore::open(dir.path()).unwrap();
        let projects = store.list_projects().unwrap();
        assert_eq!(projects.len(), 2, "schema {version}");
        assert_eq!(projects[1].name, "old");
        assert_eq!(
            (projects[1].pusher_app_id, projects[0].pusher_app_id),
            (1_000_000, 1_000_001),
            "schema {version}"
        );
        assert!(projects.iter().all(|p| p.pusher), "schema {version}");
        let old = &projects[1];
        assert_eq!(old.max_connections, None, "schema {version}");
        let project = store
            .set_project("prj_old", &ProjectChange::MaxConnections(Some(7)))
            .unwrap();
        assert_eq!(project.max_connections, Some(7), "schema {version}");
        assert!(!old.client_events, "schema {version}: off by default");
        let project = store
            .set_project("prj_old", &ProjectChange::ClientEvents(true))
            .unwrap();
        assert!(project.client_events, "schema {version}");
        assert_eq!(project.max_connections, Some(7), "schema {version}");
        assert_eq!(old.webhook, None, "schema {version}: off by default");
        let hook = WebhookSpec {
            url: "https://example.com/hook".into(),
            events: HookKinds::DEFAULT,
        };
        let project = store
            .set_project("prj_old", &ProjectChange::Webhook(Some(hook.clone())))
            .unwrap();
        assert_eq!(project.webhook, Some(hook), "schema {version}");
        assert!(project.client_events, "schema {version}");
        let project = store
            .set_project("prj_old", &ProjectChange::Webhook(None))
            .unwrap();
        assert_eq!(project.webhook, None, "schema {version}");
        let project = store
            .set_project("prj_old", &ProjectChange::Pusher(false))
            .unwrap();
        assert!(!project.pusher, "schema {version}");
        assert_eq!(project.pusher_app_id, 1_000_000, "schema {version}");
        assert!(!store.requires_user("prj_old").unwrap(), "schema {version}");
        store
            .set_project("prj_old", &ProjectChange::RequireUser(true))
            .unwrap();
        assert!(store.requires_user("prj_old").unwrap(), "schema {version}");
        let block = crate::project::UserBlockRecord {
            project_id: "prj_old".into(),
            user_id: "u".into(),
            until: None,
        };
        store.block_user(&block, 1).unwrap();
        assert_eq!(store.user_block("prj_old", "u").unwrap(), Some(block));
        store
            .rotate_token_secret("prj_old", &MasterKey::random(), 0)
            .unwrap();
        let new = store
            .create_project(new_project("new", "1/s"), &MasterKey::random())
            .unwrap()
            .project;
        assert_eq!(new.pusher_app_id, 1_000_002, "schema {version}");
        assert!(new.pusher, "schema {version}");
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let now: i64 = raw
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(now, SCHEMA_VERSION, "schema {version}");
    }
}

#[test]
fn concurrent_opens_of_a_fresh_directory_agree() {
    let dir = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let path = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let mut store = SqliteStore::open(&path).unwrap();
                store
                    .create_project(new_project(&format!("p{i}"), "1/s"), &MasterKey::random())
                    .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let projects = store.list_projects().unwrap();
    assert_eq!(projects.len(), 4);
    assert_eq!(store.load_all().unwrap().keys.len(), 8);
    // Four writers at once still got four different, consecutive app ids.
    let mut ids: Vec<u64> = projects.iter().map(|p| p.pusher_app_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1_000_000, 1_000_001, 1_000_002, 1_000_003]);
}

#[test]
fn a_corrupt_project_row_is_named_not_a_panic() {
    for (set, why) in [
        ("rate_limit = 'fast'", ""),
        ("history = 'forever'", ""),
        ("max_connections = -1", "negative max_connections"),
        ("webhook_url = 'http://h/', webhook_events = 'nope'", ""),
        ("pusher_app_id = NULL", "no pusher_app_id"),
    ] {
        let (_dir, mut store, project) = test_store_with_project();
        store
            .conn
            .execute(&format!("UPDATE projects SET {set}"), [])
            .unwrap();
        match store.list_projects() {
            Err(StoreError::Corrupt(m)) => {
                assert!(m.starts_with(&format!("project {}: ", project.id)), "{m}");
                assert!(m.ends_with(why), "{set}: {m}");
            }
            other => panic!("{set}: {other:?}"),
        }
    }
}
