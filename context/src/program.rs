//! The program's contract: what a component's program is told when it starts (its environment),
//! the paths it serves, and the answers it gives. One definition for both sides that start
//! programs — the agent (a local run: it starts the program) and the operator (a pod: the kubelet
//! starts it in a container of its own) — and for the agent that reads the answers. The SDKs
//! speak the same contract; `sdk/test_protocol.py` checks them against `agent/openapi.yaml` and
//! the variables' table in docs/component-protocol.md.
//!
//! | variable | value |
//! |---|---|
//! | `TOA_PORT` | the port on 127.0.0.1 the program serves its HTTP on |
//! | `TOA_AGENT` | the agent's local API, e.g. `http://127.0.0.1:7090` |
//! | `TOA_COMPONENT` | the component's full name, e.g. `store.catalog` |
//! | `TOA_INSTANCE` | the process's name (in a pod, the pod's) |
//! | `TOA_AGENT_TOKEN` | the component's token for its routes on the local API (a local run) |
//! | `TOA_AGENT_TOKEN_FILE` | in a pod, instead: the file holding that token |
//! | `TOA_CONFIGURATION` | the component's configuration, JSON ([`crate::configuration`]) |
//! | `TOA_SECRET_{NAME}` | each secret of the configuration ([`crate::placeholders::variable`]) |

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const PORT: &str = "TOA_PORT";
pub const AGENT: &str = "TOA_AGENT";
pub const COMPONENT: &str = "TOA_COMPONENT";
pub const INSTANCE: &str = "TOA_INSTANCE";
pub const AGENT_TOKEN: &str = "TOA_AGENT_TOKEN";
pub const AGENT_TOKEN_FILE: &str = "TOA_AGENT_TOKEN_FILE";
pub use crate::configuration::VARIABLE as CONFIGURATION;

/// How long before its deadline a call to one process is no longer handed to the program, over
/// the broker or in-process: the hand-off (the request to the program, its server's thread, the
/// SDK) takes time, and the caller is answered `Abandoned` at the deadline. Without it, 4 to 11 of
/// 600 calls at timeouts close to the operation's duration started up to 5 ms after their caller
/// had been answered (`agent/tests/broker.rs`). The SDKs also check the deadline right before the
/// operation (answering 504: the agent's `ProgramError::past_deadline`).
pub const START_MARGIN: std::time::Duration = std::time::Duration::from_millis(25);

/// The run command `command` of the program: `POST` with `{}`; any 2xx when done.
pub fn lifecycle_path(command: &str) -> String {
    format!("/lifecycle/{command}")
}

/// The operation `operation` of the program: `POST` with an [`OperationCall`].
pub fn operation_path(operation: &str) -> String {
    format!("/operations/{operation}")
}

/// The adaptation of the event `label` to its receiver's request: `POST {"payload": <the
/// event>}`, answered `{"request": {"input"?, "query"?, "instance"?}}`.
pub fn receiver_path(label: &str) -> String {
    format!("/receivers/{label}")
}

/// Which of the events a stored write publishes, of those whose condition the program keeps
/// (`events/<name>` exporting `condition(entry, previous)`): `POST` with a [`Conditions`],
/// answered `{"publish": [<the names of those whose condition holds>]}`.
pub const CONDITIONS_PATH: &str = "/conditions";

/// The body of a [`CONDITIONS_PATH`] request: the object as the write stores it (with its `id`
/// and new `VERSION`; a deletion: `DELETED: true` instead of properties) and as it was before
/// (`null`: there was none: the write creates it, or it was deleted).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Conditions<'a> {
    pub entry: &'a Value,
    pub previous: Option<&'a Value>,
}

/// What the program says it serves (optional): `GET`, answered with a [`Description`].
pub const PROGRAM_PATH: &str = "/program";

/// What a program says it serves: the run commands its modules export and its operations' names.
/// Anything else is no description (the manifest's word is taken), so unknown fields refuse it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    pub commands: Vec<String>,
    pub operations: Vec<String>,
    /// What each operation's function is (`transition`, `observation`, ...), from the name its
    /// module exports; the manifest's `type`, where declared, must agree.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kinds: std::collections::BTreeMap<String, crate::manifest::Kind>,
    /// The labels of the events whose request the program makes itself (a module
    /// `receivers/<label>` exporting `request(payload)`): [`receiver_path`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receivers: Vec<String>,
    /// The names of the events whose condition the program keeps (a module `events/<name>`
    /// exporting `condition(entry, previous)`): [`CONDITIONS_PATH`]. The others publish on
    /// every stored change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
}

/// The body of an operation's request: its input, the object it works on (a transition's or
/// an observation's, in a component with an entity) and the call it serves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OperationCall<'a> {
    pub input: &'a Value,
    /// The object with its `id` and `VERSION` (`null`: an observation of none). A transition
    /// answers `{"entry": <the entry as the function left it>, "reply": <what it returned>}`,
    /// without `reply` when the function returned the entry itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<&'a Value>,
    pub call: &'a CallMeta,
}

/// Milliseconds since the Unix epoch: deadlines travel between processes, and to programs
/// (`deadline_ms`), in this unit.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What the program is told about a call beside its input (`"call"` in the request body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallMeta {
    /// The call's id: the same on every delivery of one call.
    pub id: String,
    /// The broker delivered this call before: it may have run (in part) already.
    pub redelivered: bool,
    /// When the agent stops waiting for this run (ms since the Unix epoch): the caller's
    /// deadline for a call to one process, else the run's limit. The agent fills it in as it
    /// sends the call; `None` only on the way there.
    pub deadline_ms: Option<i64>,
}

/// The header naming the call a program is serving when it makes a call to the local API
/// (`/v1/call`, `/v1/task`): that call's `call.id`. Absent outside a call (in `settle`, a timer).
/// The agent reads it with every call; what it links the new call to (a transition, a trace)
/// comes with the issues that need it.
pub const CALL_HEADER: &str = "toa-call";

/// The code a lock's stream refuses with when the call it was asked for ran out of time
/// before the lock was taken (`{"event": "error", "code": "DEADLINE"}`): the SDKs raise it as
/// an error with this code, which the program can tell from others.
pub const DEADLINE: &str = "DEADLINE";

/// The longest call id taken: the agent's are 32 hex digits; a little room for other makers.
const MAX_CALL_ID: usize = 64;

/// The headers a program puts on its calls to the local API, beside its token. One place for
/// both who write them (the SDKs, Rust clients) and the agent, which reads them; a per-component
/// credential takes its place here when it comes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallHeaders {
    /// The running call's id ([`CALL_HEADER`]).
    pub call: Option<String>,
    /// The caller's trace (`traceparent`, `tracestate`); a malformed one is none.
    pub trace: Option<crate::trace::TraceContext>,
}

/// A call header that was refused: which, what was expected, what came.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header `{header}`: expected {expected}, got {given:?}")]
pub struct BadHeader {
    pub header: &'static str,
    pub expected: &'static str,
    pub given: String,
}

impl CallHeaders {
    /// Reads them; `header` gives a header's raw value by its (lowercase) name.
    pub fn read<'a>(header: impl Fn(&str) -> Option<&'a [u8]>) -> Result<Self, BadHeader> {
        let call = header(CALL_HEADER)
            .map(|value| {
                let id = std::str::from_utf8(value).ok().filter(|id| is_call_id(id));
                id.map(str::to_owned).ok_or_else(|| BadHeader {
                    header: CALL_HEADER,
                    expected: "the running call's id (call.id: 1 to 64 letters, digits or '-')",
                    given: String::from_utf8_lossy(value).chars().take(80).collect(),
                })
            })
            .transpose()?;
        let trace = crate::trace::TraceContext::read(
            header(crate::trace::TRACEPARENT),
            header(crate::trace::TRACESTATE),
        );
        Ok(Self { call, trace })
    }

    /// The headers to send, by name.
    pub fn write(&self) -> Vec<(&'static str, String)> {
        let mut headers: Vec<_> = self
            .call
            .iter()
            .map(|call| (CALL_HEADER, call.clone()))
            .collect();
        headers.extend(
            self.trace
                .iter()
                .flat_map(crate::trace::TraceContext::write),
        );
        headers
    }
}

fn is_call_id(id: &str) -> bool {
    (1..=MAX_CALL_ID).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Where one value of a program's environment comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This text.
    Text(String),
    /// The pod's name (`metadata.name`), which the kubelet fills in.
    PodName,
}

/// How the program gets its local API token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// As `TOA_AGENT_TOKEN` (a local run).
    Value(String),
    /// In the file `TOA_AGENT_TOKEN_FILE` names (a pod: a volume of its container's own).
    File(String),
    /// None: the local API takes the program's requests without one.
    None,
}

/// What a program is told, apart from its configuration's secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    pub port: u16,
    /// The local API's address.
    pub agent: String,
    /// The component's full name.
    pub component: String,
    pub instance: Source,
    pub token: Token,
    /// `TOA_CONFIGURATION`, JSON.
    pub configuration: String,
}

impl Environment {
    /// The variables, in the table's order.
    pub fn vars(&self) -> Vec<(&'static str, Source)> {
        let text = |value: &str| Source::Text(value.to_owned());
        let mut vars = vec![
            (PORT, Source::Text(self.port.to_string())),
            (AGENT, text(&self.agent)),
            (COMPONENT, text(&self.component)),
            (INSTANCE, self.instance.clone()),
        ];
        match &self.token {
            Token::Value(token) => vars.push((AGENT_TOKEN, text(token))),
            Token::File(path) => vars.push((AGENT_TOKEN_FILE, text(path))),
            Token::None => {}
        }
        vars.push((CONFIGURATION, text(&self.configuration)));
        vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_program_reads_its_name_and_token_file_from_the_pod() {
        let environment = Environment {
            port: 7100,
            agent: "http://127.0.0.1:7090".to_owned(),
            component: "store.catalog".to_owned(),
            instance: Source::PodName,
            token: Token::File("/var/run/toa/agent/token".to_owned()),
            configuration: "{}".to_owned(),
        };
        let names: Vec<&str> = environment.vars().iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "TOA_PORT",
                "TOA_AGENT",
                "TOA_COMPONENT",
                "TOA_INSTANCE",
                "TOA_AGENT_TOKEN_FILE",
                "TOA_CONFIGURATION"
            ]
        );
        assert_eq!(environment.vars()[3].1, Source::PodName);
    }

    #[test]
    fn a_local_program_gets_its_token_and_no_file() {
        let environment = Environment {
            port: 4000,
            agent: "http://127.0.0.1:7090".to_owned(),
            component: "a.b".to_owned(),
            instance: Source::Text("a-1".to_owned()),
            token: Token::Value("t".to_owned()),
            configuration: "{}".to_owned(),
        };
        let vars = environment.vars();
        assert!(vars.contains(&(AGENT_TOKEN, Source::Text("t".to_owned()))));
        assert!(!vars.iter().any(|(name, _)| *name == AGENT_TOKEN_FILE));
        assert!(vars.contains(&(PORT, Source::Text("4000".to_owned()))));
    }

    #[test]
    fn call_headers_read_back_as_written_and_a_bad_one_is_named() {
        let headers = CallHeaders {
            call: Some("0123456789abcdef0123456789abcdef".to_owned()),
            trace: crate::trace::TraceContext::read(
                Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                Some(b"congo=t61rcWkgMzE"),
            ),
        };
        assert!(headers.trace.is_some());
        let written = headers.write();
        let read = CallHeaders::read(|name| {
            written
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, value)| value.as_bytes())
        });
        assert_eq!(read, Ok(headers));
        assert_eq!(CallHeaders::read(|_| None), Ok(CallHeaders::default()));
        for bad in [&b""[..], &b"a b"[..], &b"\xff"[..], &[b'a'; 65][..]] {
            let error = CallHeaders::read(|name| (name == CALL_HEADER).then_some(bad)).unwrap_err();
            assert_eq!(error.header, "toa-call");
            assert!(
                error
                    .to_string()
                    .starts_with("header `toa-call`: expected the running call's id"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_table_names_every_variable() {
        let doc = include_str!("program.rs");
        for name in [
            PORT,
            AGENT,
            COMPONENT,
            INSTANCE,
            AGENT_TOKEN,
            AGENT_TOKEN_FILE,
            CONFIGURATION,
        ] {
            assert!(doc.contains(&format!("//! | `{name}` |")), "{name}");
        }
    }
}
