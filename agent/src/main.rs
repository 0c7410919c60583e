//! `toa-agent`: the process beside every component.
//!
//! For now it has one command, `demo`, which exercises `lock`, `slots`, `onassigned` and `meter`
//! with the embedded default (no Redis needed), or through Redis when `TOA_ATOMICITY_REDIS` is set.

use std::process::ExitCode;

mod demo;

#[tokio::main]
async fn main() -> ExitCode {
    toa_agent::telemetry::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run().await,
        _ => {
            eprintln!("usage: toa-agent demo");
            ExitCode::from(64)
        }
    }
}
