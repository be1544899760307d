//! The scenarios, one module each: its flags (a clap `Args` struct), its phases,
//! and its report. Each `run` returns the JSON line for `main` to print, with `ok`
//! set when the run met its own bar (it decides the exit status).
//!
//! Invariants: every phase of every scenario is bounded in time; stdout is left to
//! `main` (progress and tables go to stderr); the JSON field names are read by
//! `run-suite.sh`, `soak.sh` and `chart.py`, so they change only together with them.
//! Shared plumbing lives beside, not here: `subrun`/`pubrun` (subscriber and
//! publisher threads), `report` (CPU snapshots, progress, tables).

pub mod fanout;
pub mod floor;
pub mod idle;
pub mod publish;
pub mod ramp;
pub mod soak;
