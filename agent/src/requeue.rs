//! `toa-agent requeue COMPONENT`: sends the events a receiving component dead-lettered back to
//! its receivers' queue (docs/events.md, "Dead letters"). It reads the context as `compose`
//! does (the file and environment in a local run; in a pod the agent container's `TOA_*`
//! variables, so `kubectl exec` into it runs it as is).

use crate::calls::broker::{requeue, Broker};
use crate::config::ConfigError;
use toa_context::agent_args::ComposeArgs;

/// Moves the dead letters of `component` back: how many moved, or what went wrong.
pub async fn run(
    component: &str,
    context: &std::path::Path,
    environment: &str,
) -> Result<u64, String> {
    let mut args = ComposeArgs::new(Vec::new());
    args.context = context.to_path_buf();
    args.environment = environment.to_owned();
    let options = crate::config::options(args).map_err(|e: ConfigError| e.to_string())?;
    let (Some(address), Some(broker)) = (&options.context.amqp, options.broker) else {
        return Err(format!(
            "the context names no broker (amqp): events are received in-process, and a local \
             run keeps no dead letters to requeue ({})",
            options.context.name
        ));
    };
    let login = (&broker.credentials, &broker.roots);
    let instance = format!("requeue-{}", std::process::id());
    let connected = Broker::connect(
        address,
        login,
        &broker.application,
        &instance,
        &options.context.limits,
        broker.tuning,
    )
    .await
    .map_err(|e| e.to_string())?;
    requeue(&connected, component)
        .await
        .map_err(|e| e.to_string())
}
