//! The `ringcast` binary: parse the command line, then run a subcommand. Errors become
//! one line on stderr and a non-zero exit (anyhow lives only here, at the edge).

use clap::Parser;
use mimalloc::MiMalloc;

use ringcast::cli::{Cli, Command};

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match &cli.command {
        Command::Serve(args) => ringcast::server::run_cli(&cli, args),
        Command::Project(_) | Command::Key(_) => ringcast::admin::run(&cli),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
