//! `toa-operator render …`: see `toa-operator --help`.

use clap::Parser;
use std::io::Write;
use std::process::ExitCode;
use toa_operator::args::{Args, Command};
use toa_operator::render;

/// BSD's EX_USAGE: the command line or the files it names are wrong.
const USAGE: u8 = 64;
/// BSD's EX_IOERR: the output could not be written.
const IO_ERROR: u8 = 74;

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
    }
}
