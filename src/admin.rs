//! The `project` and `key` subcommands: manage the store of the data directory (or, in
//! cluster mode, Redis) and print exactly one JSON object on stdout.
//!
//! Invariants:
//! - Arguments are validated before the store is opened, so a typo never creates a
//!   data directory.
//! - Success prints one JSON object and nothing else on stdout; every failure is an
//!   `Err` (main prints it on stderr and exits non-zero) and prints nothing on stdout.
//! - A full key is printed only by the command that created it.
//! - A running server sees every change within a second through its key watcher; this
//!   module never talks to a server.

use std::io::Write;

use serde_json::{json, Value};

use crate::apikey::KeyKind;
use crate::cli::{Cli, Command, KeyCommand, KeyKindArg, ProjectCommand};
use crate::config::Config;
use crate::history::{HistorySpec, HistorySpecError};
use crate::quota::{RateLimit, RateLimitError};
use crate::store::{open_store, ProjectRecord, Store, StoreError};

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    #[error(transparent)]
    History(#[from] HistorySpecError),
    #[error("`{0}` is not an admin command")]
    NotAdmin(&'static str),
}

/// One admin command with its arguments validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    CreateProject {
        name: String,
        rate_limit: RateLimit,
        history: HistorySpec,
    },
    ListProjects,
    SetHistory {
        project_id: String,
        history: HistorySpec,
    },
    SetRateLimit {
        project_id: String,
        rate_limit: RateLimit,
    },
    CreateKey {
        project_id: String,
        kind: KeyKind,
    },
    RevokeKey {
        key_or_id: String,
    },
    ListKeys {
        project_id: String,
    },
}

/// Run the `project`/`key` subcommand of `cli` and print its JSON result.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    let request = parse_request(&cli.command)?;
    let mut store = open_store(&cli.data_dir, cli.redis.as_deref())?;
    let output = execute(store.as_mut(), request)?;
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (e.g. `| head -c0`) is an error: the caller did not get the key.
    writeln!(stdout, "{output}")?;
    stdout.flush()?;
    Ok(())
}

/// Validate a command's arguments without touching any store.
pub(crate) fn parse_request(command: &Command) -> Result<Request, AdminError> {
    Ok(match command {
        Command::Serve(_) => return Err(AdminError::NotAdmin("serve")),
        Command::Config(_) => return Err(AdminError::NotAdmin("config")),
        Command::Publish(_) => return Err(AdminError::NotAdmin("publish")),
        Command::Subscribe(_) => return Err(AdminError::NotAdmin("subscribe")),
        Command::Project(ProjectCommand::Create {
            name,
            rate_limit,
            history,
        }) => {
            let rate_limit = match rate_limit {
                Some(text) => RateLimit::parse(text)?,
                None => default_rate_limit()?,
            };
            let history = match history {
                Some(text) => HistorySpec::parse(text)?,
                None => HistorySpec::OFF,
            };
            Request::CreateProject {
                name: name.clone(),
                rate_limit,
                history,
            }
        }
        Command::Project(ProjectCommand::SetHistory {
            project_id,
            history,
        }) => Request::SetHistory {
            project_id: project_id.clone(),
            history: HistorySpec::parse(history)?,
        },
        Command::Project(ProjectCommand::List) => Request::ListProjects,
        Command::Project(ProjectCommand::SetRateLimit {
            project_id,
            rate_limit,
        }) => Request::SetRateLimit {
            project_id: project_id.clone(),
            rate_limit: RateLimit::parse(rate_limit)?,
        },
        Command::Key(KeyCommand::Create { project_id, kind }) => Request::CreateKey {
            project_id: project_id.clone(),
            kind: match kind {
                KeyKindArg::Secret => KeyKind::Secret,
                KeyKindArg::Public => KeyKind::Public,
            },
        },
        Command::Key(KeyCommand::Revoke { key_or_id }) => Request::RevokeKey {
            key_or_id: key_or_id.clone(),
        },
        Command::Key(KeyCommand::List { project_id }) => Request::ListKeys {
            project_id: project_id.clone(),
        },
    })
}

/// Carry out `request` on `store`; the value is what the command prints.
pub(crate) fn execute(store: &mut dyn Store, request: Request) -> Result<Value, AdminError> {
    Ok(match request {
        Request::CreateProject {
            name,
            rate_limit,
            history,
        } => {
            let (project, secret, public) = store.create_project(&name, rate_limit, history)?;
            json!({
                "project": project_json(&project),
                "secret_key": secret,
                "public_key": public,
            })
        }
        Request::ListProjects => {
            let projects = store.list_projects()?;
            json!({ "projects": projects.iter().map(project_json).collect::<Vec<_>>() })
        }
        Request::SetRateLimit {
            project_id,
            rate_limit,
        } => {
            let project = store.set_rate_limit(&project_id, rate_limit)?;
            json!({ "project": project_json(&project) })
        }
        Request::SetHistory {
            project_id,
            history,
        } => {
            let project = store.set_history(&project_id, history)?;
            json!({ "project": project_json(&project) })
        }
        Request::CreateKey { project_id, kind } => {
            let (record, key) = store.create_key(&project_id, kind)?;
            json!({ "key": key, "id": record.id, "project_id": record.project_id })
        }
        Request::RevokeKey { key_or_id } => {
            json!({ "revoked": store.revoke_key(&key_or_id)? })
        }
        Request::ListKeys { project_id } => {
            let keys = store.list_keys(&project_id)?;
            let keys: Vec<Value> = keys
                .iter()
                .map(|k| {
                    json!({
                        "id": k.id,
                        "kind": k.kind.as_str(),
                        "state": if k.revoked { "revoked" } else { "active" },
                        "prefix": k.prefix,
                    })
                })
                .collect();
            json!({ "keys": keys })
        }
    })
}

/// `serve --dev`: on an empty store, create project `dev` with `rate_limit` (the serve
/// config's `default_rate_limit`) and return it with its two keys (for printing once).
/// `None` when projects exist.
pub(crate) fn dev_bootstrap_with(
    store: &mut dyn Store,
    rate_limit: RateLimit,
) -> Result<Option<(ProjectRecord, String, String)>, StoreError> {
    if !store.is_empty()? {
        return Ok(None);
    }
    store
        .create_project("dev", rate_limit, HistorySpec::OFF)
        .map(Some)
}

fn default_rate_limit() -> Result<RateLimit, RateLimitError> {
    RateLimit::parse(&Config::default().default_rate_limit)
}

fn project_json(project: &ProjectRecord) -> Value {
    json!({
        "id": project.id,
        "name": project.name,
        "rate_limit": project.rate_limit.to_string(),
        "history": project.history.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;
    use clap::Parser;

    fn request(args: &[&str]) -> Result<Request, AdminError> {
        let cli =
            Cli::try_parse_from(std::iter::once("ringcast").chain(args.iter().copied())).unwrap();
        parse_request(&cli.command)
    }

    fn run_in(store: &mut SqliteStore, args: &[&str]) -> Result<Value, AdminError> {
        execute(store, request(args)?)
    }

    #[test]
    fn arguments_are_checked_before_the_store() {
        assert!(matches!(
            request(&["project", "create", "p", "--rate-limit", "5/hour"]),
            Err(AdminError::RateLimit(_))
        ));
        assert!(matches!(
            request(&["project", "set-rate-limit", "prj_x", "0/s"]),
            Err(AdminError::RateLimit(_))
        ));
        assert!(matches!(request(&["serve"]), Err(AdminError::NotAdmin(_))));
        assert_eq!(
            request(&["project", "create", "p"]).unwrap(),
            Request::CreateProject {
                name: "p".into(),
                rate_limit: RateLimit::parse("100/s").unwrap(),
                history: HistorySpec::OFF,
            }
        );
        assert!(matches!(
            request(&["project", "create", "p", "--history", "10/0s"]),
            Err(AdminError::History(_))
        ));
        assert!(matches!(
            request(&["project", "set-history", "prj_x", "ten"]),
            Err(AdminError::History(_))
        ));
    }

    #[test]
    fn commands_print_the_contract_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();

        let created = run_in(&mut store, &["project", "create", "orders"]).unwrap();
        let project_id = created["project"]["id"].as_str().unwrap().to_string();
        assert_eq!(created["project"]["name"], "orders");
        assert_eq!(created["project"]["rate_limit"], "100/s");
        let secret = created["secret_key"].as_str().unwrap().to_string();
        assert!(secret.starts_with("sk_"));
        assert!(created["public_key"].as_str().unwrap().starts_with("pk_"));
        assert_eq!(created.as_object().unwrap().len(), 3);

        let listed = run_in(&mut store, &["project", "list"]).unwrap();
        assert_eq!(listed, json!({ "projects": [created["project"].clone()] }));

        let updated = run_in(
            &mut store,
            &["project", "set-rate-limit", &project_id, "6000/min"],
        )
        .unwrap();
        assert_eq!(updated["project"]["rate_limit"], "6000/min");
        assert_eq!(updated["project"]["id"], project_id.as_str());

        let key = run_in(
            &mut store,
            &["key", "create", &project_id, "--kind", "public"],
        )
        .unwrap();
        assert!(key["key"].as_str().unwrap().starts_with("pk_"));
        assert_eq!(key["project_id"], project_id.as_str());
        let key_id = key["id"].as_str().unwrap().to_string();

        let revoked = run_in(&mut store, &["key", "revoke", &key_id]).unwrap();
        assert_eq!(revoked, json!({ "revoked": key_id }));
        let revoked = run_in(&mut store, &["key", "revoke", &secret]).unwrap();
        assert!(revoked["revoked"].as_str().unwrap().starts_with("key_"));

        let keys = run_in(&mut store, &["key", "list", &project_id]).unwrap();
        let keys = keys["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[0]["kind"], "secret");
        assert_eq!(keys[0]["state"], "revoked");
        assert_eq!(keys[0]["prefix"], format!("{}…", &secret[..7]));
        assert_eq!(keys[1]["kind"], "public");
        assert_eq!(keys[1]["state"], "active");
        assert_eq!(keys[2]["id"], key_id.as_str());
        assert_eq!(keys[2]["state"], "revoked");
        assert_eq!(keys[0].as_object().unwrap().len(), 4);
    }

    #[test]
    fn unknown_ids_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        for args in [
            &["project", "set-rate-limit", "prj_nope", "1/s"][..],
            &["key", "create", "prj_nope", "--kind", "secret"],
            &["key", "revoke", "key_nope"],
            &["key", "list", "prj_nope"],
        ] {
            let err = run_in(&mut store, args).unwrap_err();
            assert!(
                matches!(err, AdminError::Store(StoreError::NotFound(_))),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn dev_bootstrap_only_on_an_empty_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let (project, secret, public) =
            dev_bootstrap_with(&mut store, default_rate_limit().unwrap())
                .unwrap()
                .unwrap();
        assert_eq!(project.name, "dev");
        assert_eq!(project.rate_limit.to_string(), "100/s");
        assert!(secret.starts_with("sk_") && public.starts_with("pk_"));
        assert!(
            dev_bootstrap_with(&mut store, default_rate_limit().unwrap())
                .unwrap()
                .is_none()
        );
        assert_eq!(store.list_projects().unwrap().len(), 1);
    }
}
