//! The process's phase and what changes it: the halt and resume the operator asks for (through
//! [`crate::control`]), and the drain. Pulses run only while the process runs.

use crate::calls::Calls;
use crate::control::{Reply, Status, Supervisor};
use crate::lifecycle::{self, Member};
use std::sync::Arc;
use std::time::Duration;
use toa_context::RunCommand;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Running,
    Paused { halt: String },
    Draining,
}

pub struct Process {
    members: Vec<Member>,
    calls: Arc<Calls>,
    instance: String,
    state: Mutex<State>,
}

struct State {
    phase: Phase,
    pulses: Vec<JoinHandle<()>>,
}

impl Process {
    /// A running process; starts its pulses.
    pub fn start(members: Vec<Member>, calls: Arc<Calls>, instance: String) -> Arc<Self> {
        let pulses = start_pulses(&members, &calls);
        Arc::new(Self {
            members,
            calls,
            instance,
            state: Mutex::new(State {
                phase: Phase::Running,
                pulses,
            }),
        })
    }

    pub fn phase(&self) -> Phase {
        self.state
            .try_lock()
            .map_or(Phase::Running, |state| state.phase.clone())
    }

    /// Pauses for `halt`: stops pulses, runs `pause`. Idempotent by halt id.
    pub async fn halt(&self, halt: String) -> Result<Status, String> {
        let mut state = self.state.lock().await;
        match &state.phase {
            Phase::Draining => return Err("the process is draining".into()),
            Phase::Paused { halt: current } if *current == halt => {
                return Ok(self.status_of(&state.phase))
            }
            Phase::Paused { .. } => {
                // Already paused for an earlier halt: this one counts calls from now.
                state.phase = Phase::Paused { halt };
                self.calls.reset_activity();
                return Ok(self.status_of(&state.phase));
            }
            Phase::Running => {}
        }
        for pulse in state.pulses.drain(..) {
            pulse.abort();
        }
        lifecycle::phase(&self.members, RunCommand::Pause)
            .await
            .map_err(|e| e.to_string())?;
        self.calls.reset_activity();
        tracing::info!(%halt, "paused");
        state.phase = Phase::Paused { halt };
        Ok(self.status_of(&state.phase))
    }

    /// Resumes from `halt`: runs `resume`, starts pulses. Idempotent.
    pub async fn resume(&self, halt: String) -> Result<Status, String> {
        let mut state = self.state.lock().await;
        match &state.phase {
            Phase::Running => return Ok(self.status_of(&state.phase)),
            Phase::Draining => return Err("the process is draining".into()),
            Phase::Paused { halt: current } if *current != halt => {
                return Err(format!("paused for halt {current:?}, not {halt:?}"))
            }
            Phase::Paused { .. } => {}
        }
        lifecycle::phase(&self.members, RunCommand::Resume)
            .await
            .map_err(|e| e.to_string())?;
        state.pulses = start_pulses(&self.members, &self.calls);
        state.phase = Phase::Running;
        tracing::info!(%halt, "resumed");
        Ok(self.status_of(&state.phase))
    }

    /// Stops pulses and marks the drain; what follows (dispose) is the caller's.
    pub async fn drain(&self) {
        let mut state = self.state.lock().await;
        for pulse in state.pulses.drain(..) {
            pulse.abort();
        }
        state.phase = Phase::Draining;
    }

    fn status_of(&self, phase: &Phase) -> Status {
        let (name, halt) = match phase {
            Phase::Running => ("running", None),
            Phase::Paused { halt } => ("paused", Some(halt.clone())),
            Phase::Draining => ("draining", None),
        };
        Status {
            phase: name.into(),
            halt,
            instance: self.instance.clone(),
            calls: self.calls.activity(),
        }
    }
}

impl Supervisor for Process {
    fn halt(self: Arc<Self>, halt: String) -> Reply {
        Box::pin(async move { Process::halt(&self, halt).await })
    }

    fn resume(self: Arc<Self>, halt: String) -> Reply {
        Box::pin(async move { Process::resume(&self, halt).await })
    }

    fn status(&self) -> Status {
        self.status_of(&self.phase())
    }
}

/// Each pulse calls its operation on this replica every interval.
fn start_pulses(members: &[Member], calls: &Arc<Calls>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for member in members {
        for (operation, interval) in &member.component.manifest.pulses {
            let (calls, component, operation) = (
                calls.clone(),
                member.component.name.clone(),
                operation.clone(),
            );
            let period = Duration::from_millis(*interval);
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let request = crate::calls::Request {
                        input: serde_json::Value::Null,
                        instance: None,
                        timeout: None,
                    };
                    if let Err(error) = calls.call(&component, &operation, request, false).await {
                        tracing::warn!(%component, %operation, %error, "pulse failed");
                    }
                }
            }));
        }
    }
    tasks
}
