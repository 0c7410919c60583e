//! Logging: `tracing` to standard error, filtered by `RUST_LOG` (default `info`); colours only on
//! a terminal (a pod's log, and the termination message the kubelet takes from it, stay plain).

/// Installs the subscriber once; later calls do nothing.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
