//! Run commands across the components of a process: each phase runs the command on every
//! component that exports it, all at once, and fails naming the component whose command failed.

use crate::component::client::ProgramClient;
use crate::component::{Component, ComponentError};
use std::sync::Arc;
use std::time::Duration;
use toa_context::RunCommand;

/// How long one run command may take.
pub const RUN_COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// A component with the client of its running program.
#[derive(Clone)]
pub struct Member {
    pub component: Arc<Component>,
    pub client: ProgramClient,
}

/// Runs `command` on every member that exports it, concurrently.
pub async fn phase(members: &[Member], command: RunCommand) -> Result<(), ComponentError> {
    let runs = members.iter().filter(|m| m.component.exports(command)).map(|member| async move {
        tracing::debug!(component = %member.component.name, command = command.name(), "run command");
        member
            .client
            .run(command.name(), RUN_COMMAND_LIMIT)
            .await
            .map_err(|error| ComponentError::RunCommand {
                component: member.component.name.clone(),
                command: command.name(),
                message: error.to_string(),
            })
    });
    let results = futures::future::join_all(runs).await;
    let mut first = None;
    for error in results.into_iter().filter_map(Result::err) {
        tracing::error!(%error, "run command failed");
        first.get_or_insert(error);
    }
    first.map_or(Ok(()), Err)
}

/// The way up: `preflight`, then operations are served (`serving`), `settle`, `ready`.
pub async fn run_up(
    members: &[Member],
    serving: &tokio::sync::watch::Sender<bool>,
) -> Result<(), ComponentError> {
    phase(members, RunCommand::Preflight).await?;
    serving.send_replace(true);
    phase(members, RunCommand::Settle).await?;
    phase(members, RunCommand::Ready).await
}
