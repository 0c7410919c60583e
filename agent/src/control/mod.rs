//! Who may drive this process, and with what.
//!
//! - [`endpoint`]: the operator's authenticated control endpoint (halt, resume, status);
//! - [`tokens`]: the control tokens accepted (current and previous), read again on rotation;
//! - [`component_tokens`]: each component's own token for the local API.

pub mod component_tokens;
pub(crate) mod endpoint;
pub(crate) mod tokens;
