//! What a call answers, one definition for everyone who writes or reads it: the program answers
//! an operation with an [`Outcome`]; the receiving agent sends the caller's agent a [`Reply`]
//! over the broker (the outcome, or why there is none); the local API gives the caller the
//! outcome.
//!
//! | body | meaning |
//! |---|---|
//! | `{"reply": …}` | the operation's reply |
//! | `{"error": {"code", "message"}}` | the operation's own error (`NOT_HELD`, …), passed on unchanged |
//! | `{"failure": "…"}` | (agents) the call failed without an answer |
//! | `{"refused": "Addressee"}` | (agents) the process was leaving: the call did not run |
//! | `{"refused": "RequestContract", "message": "…"}` | (agents) the call breaks the callee's declarations |

use serde_json::{json, Value};

/// The codes the runtime itself answers as an operation's error: an object's (`NOT_FOUND`,
/// `CONFLICT`, ...; docs/component-protocol.md), a store or broker that is down, a request
/// refused before it ran, a lock's wait past its call's deadline. A program that passes one on
/// from a call it made answers it without declaring it; every other code must be in the
/// operation's `errors:`.
pub const RUNTIME_CODES: [&str; 8] = [
    "NOT_FOUND",
    "PRECONDITION_FAILED",
    "CONFLICT",
    "CONTENDED",
    "INVALID_ENTRY",
    "UNAVAILABLE",
    "RequestContract",
    crate::program::DEADLINE,
];

/// An operation's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply(Value),
    /// The operation's own error, e.g. `NOT_HELD`: passed to the caller unchanged.
    Error {
        code: String,
        message: Option<String>,
    },
}

/// Why a body is not an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotAnOutcome {
    #[error("an error without a code")]
    ErrorWithoutCode,
    #[error("neither a reply nor an error")]
    Neither,
}

/// The outcome's body, written from the outcome itself (a reply is not copied into a tree of
/// values first, as [`Outcome::to_json`] must).
impl serde::Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        #[derive(serde::Serialize)]
        struct Error<'a> {
            code: &'a str,
            message: &'a Option<String>,
        }
        let mut body = serializer.serialize_map(Some(1))?;
        match self {
            Self::Reply(reply) => body.serialize_entry("reply", reply)?,
            Self::Error { code, message } => {
                body.serialize_entry("error", &Error { code, message })?
            }
        }
        body.end()
    }
}

impl Outcome {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("an outcome is JSON: string keys, JSON values")
    }

    /// Reads an outcome; an error comes first (a body holding both is the error).
    pub fn from_json(body: &Value) -> Result<Self, NotAnOutcome> {
        if let Some(error) = body.get("error") {
            let code = error.get("code").and_then(Value::as_str);
            let code = code.ok_or(NotAnOutcome::ErrorWithoutCode)?;
            let message = error.get("message").and_then(Value::as_str);
            return Ok(Self::Error {
                code: code.to_owned(),
                message: message.map(str::to_owned),
            });
        }
        body.get("reply")
            .map(|reply| Self::Reply(reply.clone()))
            .ok_or(NotAnOutcome::Neither)
    }
}

/// What the receiving agent sends back to the caller's agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Outcome(Outcome),
    /// The call failed without an answer.
    Failure(String),
    Refused(Refusal),
}

/// Why the receiving agent did not run a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The process was leaving when the call reached it.
    Addressee,
    /// The call breaks the callee's declarations.
    RequestContract(String),
}

impl Reply {
    pub fn to_json(&self) -> Value {
        match self {
            Self::Outcome(outcome) => outcome.to_json(),
            Self::Failure(failure) => json!({ "failure": failure }),
            Self::Refused(Refusal::Addressee) => json!({"refused": "Addressee"}),
            Self::Refused(Refusal::RequestContract(message)) => {
                json!({"refused": "RequestContract", "message": message})
            }
        }
    }

    /// Reads a reply; what is none of the shapes is a failure that says so.
    pub fn from_json(body: &Value) -> Self {
        match body.get("refused").and_then(Value::as_str) {
            Some("Addressee") => return Self::Refused(Refusal::Addressee),
            Some("RequestContract") => {
                let message = body.get("message").and_then(Value::as_str);
                let message = message.unwrap_or("refused by the receiving agent");
                return Self::Refused(Refusal::RequestContract(message.to_owned()));
            }
            _ => {}
        }
        if let Ok(outcome) = Outcome::from_json(body) {
            return Self::Outcome(outcome);
        }
        let failure = body.get("failure").and_then(Value::as_str);
        Self::Failure(failure.unwrap_or("a malformed reply").to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_reads_back_as_written() {
        let replies = [
            Reply::Outcome(Outcome::Reply(json!({"n": 1}))),
            Reply::Outcome(Outcome::Reply(Value::Null)),
            Reply::Outcome(Outcome::Error {
                code: "NOT_HELD".to_owned(),
                message: None,
            }),
            Reply::Outcome(Outcome::Error {
                code: "X".to_owned(),
                message: Some("why".to_owned()),
            }),
            Reply::Failure("boom".to_owned()),
            Reply::Refused(Refusal::Addressee),
            Reply::Refused(Refusal::RequestContract("bad input".to_owned())),
        ];
        for reply in replies {
            assert_eq!(Reply::from_json(&reply.to_json()), reply);
        }
    }

    #[test]
    fn the_wire_is_the_documented_one() {
        let error = Outcome::Error {
            code: "X".to_owned(),
            message: None,
        };
        assert_eq!(
            error.to_json(),
            json!({"error": {"code": "X", "message": null}})
        );
        assert_eq!(
            Reply::Refused(Refusal::RequestContract("m".to_owned())).to_json(),
            json!({"refused": "RequestContract", "message": "m"})
        );
    }

    #[test]
    fn what_is_not_an_answer_says_so() {
        assert_eq!(
            Outcome::from_json(&json!({"error": {"message": "no code"}})),
            Err(NotAnOutcome::ErrorWithoutCode)
        );
        assert_eq!(
            Outcome::from_json(&json!({"ok": true})),
            Err(NotAnOutcome::Neither)
        );
        assert_eq!(
            Reply::from_json(&json!({"ok": true})),
            Reply::Failure("a malformed reply".to_owned())
        );
        assert_eq!(
            Reply::from_json(&json!({"refused": "RequestContract"})),
            Reply::Refused(Refusal::RequestContract(
                "refused by the receiving agent".to_owned()
            ))
        );
        // An error comes first.
        assert_eq!(
            Outcome::from_json(&json!({"reply": 1, "error": {"code": "E"}})),
            Ok(Outcome::Error {
                code: "E".to_owned(),
                message: None
            })
        );
    }
}
