//! The components' programs: started (or attached to) all at once, watched for an open port,
//! given the lifecycle again when their container restarts, and stopped.

use crate::component::client::ProgramClient;
use crate::component::program::Program;
use crate::component::{Component, ComponentError};
use crate::control::component_tokens::ComponentTokens;
use crate::instance::Instance;
use crate::process::lifecycle::{self, Member};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often each program is checked for an open port.
pub const ALIVE_EVERY: Duration = Duration::from_millis(500);

/// How long a program the agent started has to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);

type Started = Result<(Program, ProgramClient), ComponentError>;

/// Starts every program at once; with `attach`, component i is the program serving
/// `attach + i` (as the operator tells its container).
pub async fn start(
    loaded: &[Arc<Component>],
    attach: Option<u16>,
    agent_url: &str,
    instance: &Instance,
    tokens: &ComponentTokens,
) -> Vec<Started> {
    // Every component's secrets, read from the agent's environment: no program inherits another's.
    let withheld: Vec<String> = loaded
        .iter()
        .flat_map(|component| component.secret_sources())
        .collect();
    let withheld = &withheld;
    let starts = loaded
        .iter()
        .enumerate()
        .map(|(index, component)| async move {
            let token = tokens.token(&component.name);
            match attach {
                Some(first_port) => {
                    let port = toa_context::agent_args::attach_port(first_port, index);
                    component.attach(port, token).await
                }
                None => {
                    let told = (instance.as_str(), token, withheld.as_slice());
                    component.start(agent_url, told).await
                }
            }
        });
    futures::future::join_all(starts).await
}

/// A restarted container's new program: attached again and taken through the lifecycle, the
/// process not ready meanwhile.
pub async fn again(
    member: &Member,
    port: u16,
    serving: &watch::Sender<bool>,
    lifecycle_done: &watch::Sender<bool>,
) -> Result<(), ComponentError> {
    let name = &member.component.name;
    tracing::warn!(component = %name, port, "the component's container restarted; running the lifecycle again for its new program");
    lifecycle_done.send_replace(false);
    serving.send_replace(false);
    Program::attach(name, port).await?;
    lifecycle::run_up(std::slice::from_ref(member), serving).await?;
    serving.send_replace(true);
    lifecycle_done.send_replace(true);
    tracing::info!(component = %name, "the component serves again");
    Ok(())
}

/// SIGTERM, then a kill after the grace (programs the agent started; attached ones are not its
/// to stop).
pub async fn stop(programs: Vec<Program>) {
    futures::future::join_all(programs.into_iter().map(|p| p.stop(STOP_GRACE))).await;
}

/// A watch that is true while every one of `watches` is.
pub fn all_true(mut watches: Vec<watch::Receiver<bool>>) -> watch::Receiver<bool> {
    let now = |watches: &mut Vec<watch::Receiver<bool>>| {
        watches.iter_mut().all(|w| *w.borrow_and_update())
    };
    let (tx, rx) = watch::channel(now(&mut watches));
    if watches.is_empty() {
        return rx;
    }
    tokio::spawn(async move {
        loop {
            let changes = watches.iter_mut().map(|w| Box::pin(w.changed()));
            let (changed, _, _) = futures::future::select_all(changes).await;
            if changed.is_err() || tx.is_closed() {
                return;
            }
            tx.send_replace(now(&mut watches));
        }
    });
    rx
}
