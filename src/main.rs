//! The `depot` binary: parse the command line, run it, turn an error into
//! a message and exit code 1. A closed output pipe is not an error.

use clap::Parser;

fn main() {
    // The S3 protocol layer logs every client error (a 404 included) as an
    // error; depot logs the failures that are its own, so that layer stays
    // quiet unless DEPOT_LOG names it.
    let mut filter = std::env::var("DEPOT_LOG").unwrap_or_else(|_| "info".into());
    if !filter.contains("s3s") {
        filter.push_str(",s3s=off");
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info,s3s=off".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = depot::cli::Cli::parse();
    if let Err(e) = depot::cli::run(cli) {
        if e.chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
        {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
