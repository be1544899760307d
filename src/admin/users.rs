//! `ringcast user disconnect|block|unblock|show PROJECT_ID USER_ID`: a user's access,
//! through the store of the data directory (or Redis in cluster mode), like every admin
//! command. A running server acts within 1 second: a block or an unblock moves the
//! store's change token (every key watcher reloads), a disconnect (and a block's
//! disconnect) is an end record every server's watcher applies
//! ([`crate::cluster::users`]).
//!
//! Output (one JSON object): `disconnect` → `{"user_id","disconnected":true}`; `block` →
//! `{"user_id","blocked":true,"blocked_until":N|null}`; `unblock` →
//! `{"user_id","unblocked":bool}` (false: there was no block in force); `show` →
//! `{"user_id","blocked":bool,"blocked_until":N|null}` (connections are a server's to
//! count: `GET /api/v1/users/{id}`). The CLI bounds a project's blocks by the default
//! `max_blocked_users_per_project` (it reads no server configuration).

use serde_json::{json, Value};

use super::{parse_grace, AdminError};
use crate::cli::UserCommand;
use crate::config::Config;
use crate::project::users::valid_user_id;
use crate::project::{UserBlockRecord, UserEndRecord};
use crate::store::{unix_now, Store};

/// A validated `user` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserRequest {
    project_id: String,
    user_id: String,
    action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Disconnect,
    /// Until (unix seconds); `None`: for ever.
    Block(Option<i64>),
    Unblock,
    Show,
}

pub(super) fn parse(command: &UserCommand) -> Result<UserRequest, AdminError> {
    let (project_id, user_id, action) = match command {
        UserCommand::Disconnect {
            project_id,
            user_id,
        } => (project_id, user_id, Action::Disconnect),
        UserCommand::Block {
            project_id,
            user_id,
            until,
            for_,
        } => {
            let until = match (until, for_) {
                (Some(t), _) if !(0..=crate::project::users::MAX_UNTIL).contains(t) => {
                    return Err(AdminError::User(format!(
                        "--until must be unix seconds (0 to {}), not {t}",
                        crate::project::users::MAX_UNTIL
                    )))
                }
                (Some(t), _) => Some(*t),
                (None, Some(d)) => {
                    let secs = parse_grace(d).ok_or_else(|| {
                        AdminError::User(format!(
                            "invalid --for {d:?}: use a duration such as 90s, 10m or 1h (at most 30 days)"
                        ))
                    })?;
                    Some(unix_now().saturating_add(secs as i64))
                }
                (None, None) => None,
            };
            (project_id, user_id, Action::Block(until))
        }
        UserCommand::Unblock {
            project_id,
            user_id,
        } => (project_id, user_id, Action::Unblock),
        UserCommand::Show {
            project_id,
            user_id,
        } => (project_id, user_id, Action::Show),
    };
    if !valid_user_id(user_id) {
        return Err(AdminError::User(
            "USER_ID must be 1 to 200 characters without control characters".into(),
        ));
    }
    Ok(UserRequest {
        project_id: project_id.clone(),
        user_id: user_id.clone(),
        action,
    })
}

fn end_record(request: &UserRequest) -> UserEndRecord {
    UserEndRecord {
        seq: 0,
        project_id: request.project_id.clone(),
        user_id: request.user_id.clone(),
        channel: None,
        // 0: no server applied it yet, so every server does.
        origin: 0,
        created_at: unix_now(),
    }
}

pub(super) fn execute(store: &mut dyn Store, request: UserRequest) -> Result<Value, AdminError> {
    let (project_id, user_id) = (&request.project_id, &request.user_id);
    Ok(match request.action {
        Action::Disconnect => {
            // Fails with NotFound for an unknown project before anything is written.
            store.requires_user(project_id)?;
            store.add_user_end(&end_record(&request))?;
            json!({ "user_id": user_id, "disconnected": true })
        }
        Action::Block(until) => {
            let block = UserBlockRecord {
                project_id: project_id.clone(),
                user_id: user_id.clone(),
                until,
            };
            store.block_user(&block, Config::default().max_blocked_users_per_project)?;
            store.add_user_end(&end_record(&request))?;
            json!({ "user_id": user_id, "blocked": true, "blocked_until": until })
        }
        Action::Unblock => {
            let held = store.unblock_user(project_id, user_id)?;
            json!({ "user_id": user_id, "unblocked": held })
        }
        Action::Show => {
            let block = store.user_block(project_id, user_id)?;
            json!({
                "user_id": user_id,
                "blocked": block.is_some(),
                "blocked_until": block.and_then(|b| b.until),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;
    use crate::store::UserStore;

    fn cmd(args: &[&str]) -> Result<UserRequest, AdminError> {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(
            ["ringcast", "user"].iter().chain(args.iter()).copied(),
        )
        .map_err(|e| AdminError::User(e.to_string()))?;
        match &cli.command {
            crate::cli::Command::User(c) => parse(c),
            _ => unreachable!(),
        }
    }

    #[test]
    fn commands_run_on_the_store() {
        let (_dir, mut store, p) = crate::store::test_store_with_project();
        let run = |store: &mut SqliteStore, args: &[&str]| {
            execute(store, cmd(args).unwrap()).map_err(|e| e.to_string())
        };
        let (_, start) = store.user_ends_after(None).unwrap();
        let shown = run(&mut store, &["show", &p.id, "u1"]).unwrap();
        assert_eq!(shown["blocked"], false);
        let blocked = run(&mut store, &["block", &p.id, "u1", "--until", "4000000000"]).unwrap();
        assert_eq!(blocked["blocked_until"], 4_000_000_000i64);
        let shown = run(&mut store, &["show", &p.id, "u1"]).unwrap();
        assert_eq!(shown["blocked"], true);
        assert_eq!(shown["blocked_until"], 4_000_000_000i64);
        run(&mut store, &["block", &p.id, "u2", "--for", "10m"]).unwrap();
        run(&mut store, &["block", &p.id, "u3"]).unwrap();
        let shown = run(&mut store, &["show", &p.id, "u3"]).unwrap();
        assert_eq!(
            (&shown["blocked"], &shown["blocked_until"]),
            (&json!(true), &Value::Null)
        );
        assert_eq!(
            run(&mut store, &["unblock", &p.id, "u1"]).unwrap()["unblocked"],
            true
        );
        assert_eq!(
            run(&mut store, &["unblock", &p.id, "u1"]).unwrap()["unblocked"],
            false
        );
        run(&mut store, &["disconnect", &p.id, "u4"]).unwrap();
        // Three blocks and a disconnect: four end records, none from a server.
        let (ends, _) = store.user_ends_after(Some(start)).unwrap();
        let users: Vec<&str> = ends.iter().map(|e| e.user_id.as_str()).collect();
        assert_eq!(users, ["u1", "u2", "u3", "u4"]);
        assert!(ends.iter().all(|e| e.origin == 0));

        let err = run(&mut store, &["disconnect", "prj_nope", "u"]).unwrap_err();
        assert!(err.contains("prj_nope"), "{err}");
        assert!(cmd(&["block", &p.id, "u", "--until", "-1"]).is_err());
        assert!(cmd(&["block", &p.id, "u", "--for", "40d"]).is_err());
        assert!(cmd(&["block", &p.id, "u", "--for", "1m", "--until", "5"]).is_err());
        assert!(cmd(&["show", &p.id, &"x".repeat(201)]).is_err());
        assert!(cmd(&["show", &p.id, ""]).is_err());
    }
}
