//! `toa-operator render …` and `toa-operator run …`: see `toa-operator --help`.

use clap::Parser;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;
use toa_operator::args::{Args, Command, ProbeArgs, RunArgs};
use toa_operator::{render, run};

/// BSD's EX_USAGE: the command line or the files it names are wrong.
const USAGE: u8 = 64;
/// BSD's EX_IOERR: the output could not be written.
const IO_ERROR: u8 = 74;
/// How long reconciles under way may take to finish after SIGTERM; a second signal aborts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            // Help and version go to stdout and are not failures.
            return if error.use_stderr() {
                ExitCode::from(USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    args.logs.init();
    match args.command {
        Command::Render(args) => {
            let options = args.into_options();
            let yaml = match render::render(&options) {
                Ok(composition) => render::to_yaml(&composition, &options),
                Err(error) => {
                    eprintln!("toa-operator render: {error}");
                    return ExitCode::from(USAGE);
                }
            };
            if let Err(error) = std::io::stdout().lock().write_all(yaml.as_bytes()) {
                eprintln!("toa-operator render: cannot write the Composition: {error}");
                return ExitCode::from(IO_ERROR);
            }
            ExitCode::SUCCESS
        }
        Command::Run(args) => run_command(args),
        Command::Probe(args) => probe_command(&args),
    }
}

fn probe_command(args: &ProbeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("toa-operator probe: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let timeout = Duration::from_secs(args.timeout);
    match runtime.block_on(toa_operator::probe::probe(&args.url, timeout)) {
        Ok(()) => {
            println!("{} answered 200", args.url);
            ExitCode::SUCCESS
        }
        Err(error @ toa_operator::probe::ProbeError::Url(_)) => {
            eprintln!("toa-operator probe: {error}");
            ExitCode::from(USAGE)
        }
        Err(error) => {
            eprintln!("toa-operator probe: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run_command(args: RunArgs) -> ExitCode {
    // Configuration is checked before anything starts.
    let config = match args.into_config(|name| std::env::var(name).ok()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("toa-operator run: {error}");
            return ExitCode::from(USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("toa-operator run: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(until_stopped(config))
}

/// Runs the operator until it stops or a signal stops it, within [`SHUTDOWN_GRACE`] (a second
/// signal: at once).
async fn until_stopped(config: run::Config) -> ExitCode {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let mut running = std::pin::pin!(run::run(config, shutdown));
    let result = tokio::select! {
        result = &mut running => result,
        () = signal() => {
            tracing::info!(grace_s = SHUTDOWN_GRACE.as_secs(), "stopping");
            let _ = stop.send(());
            tokio::select! {
                result = tokio::time::timeout(SHUTDOWN_GRACE, &mut running) => match result {
                    Ok(result) => result,
                    Err(_) => {
                        eprintln!("toa-operator run: shutdown took longer than {} s; stopping anyway", SHUTDOWN_GRACE.as_secs());
                        return ExitCode::FAILURE;
                    }
                },
                () = signal() => {
                    eprintln!("toa-operator run: second signal; stopping at once");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("toa-operator run: {error}");
            ExitCode::from(if error.is_configuration() { USAGE } else { 1 })
        }
    }
}

/// SIGTERM or SIGINT.
async fn signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(_) => {
                // Without a SIGTERM handler, Ctrl-C still stops the process.
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
