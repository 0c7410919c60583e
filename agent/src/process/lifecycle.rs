//! Run commands across the components of a process: each phase runs the command on every
//! component that exports it, all at once, and fails naming the component whose command failed.

use crate::component::client::ProgramClient;
use crate::component::{Component, ComponentError};
use std::sync::Arc;
use toa_context::RunCommand;

/// A component with the client of its running program.
#[derive(Clone)]
pub struct Member {
    pub component: Arc<Component>,
    pub client: ProgramClient,
    /// The run commands its program exports (its description, or the manifest's list).
    pub commands: Vec<RunCommand>,
    /// Its objects, when it declares an entity (known once the program said its kinds).
    pub objects: Option<Arc<crate::entities::objects::Objects>>,
    /// The labels of the events whose receiver's request its program makes.
    pub adapted: Vec<String>,
}

/// Runs `command` on every member that exports it, concurrently.
pub async fn phase(members: &[Member], command: RunCommand) -> Result<(), ComponentError> {
    let mut first = None;
    for (_, result) in each(members, command).await {
        if let Err(error) = result {
            first.get_or_insert(error);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Runs `command` on every member that exports it, concurrently: each one's index and outcome.
pub async fn each(
    members: &[Member],
    command: RunCommand,
) -> Vec<(usize, Result<(), ComponentError>)> {
    let runs = members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.commands.contains(&command))
        .map(|(index, member)| async move {
            tracing::debug!(component = %member.component.name, command = command.name(), "run command");
            let result = member
                .client
                .run(command.name())
                .await
                .map_err(|error| ComponentError::RunCommand {
                    component: member.component.name.clone(),
                    command: command.name(),
                    message: error.to_string(),
                });
            if let Err(error) = &result {
                tracing::error!(%error, "run command failed");
            }
            (index, result)
        });
    futures::future::join_all(runs).await
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
