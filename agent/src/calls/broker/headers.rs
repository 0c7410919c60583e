//! The headers agents put on a call, read back within what an agent itself would write: any
//! client of the shared broker user can publish to a component's queues with headers of its own
//! choosing, and a deadline years away (the program's time limit comes from it) or a delivery
//! count far below zero (a call that kills its program redelivered without end) must not be
//! taken as given.

use crate::calls::contract::MAX_TIMEOUT_MS;
use lapin::types::{AMQPValue, FieldTable};

/// The caller's deadline, in milliseconds since the epoch.
pub const DEADLINE: &str = "toa-deadline";
/// The number of an ordinary call's delivery, when an agent gave the call back after its program
/// went away under it (the transient calls queue counts nothing itself).
pub const DELIVERY: &str = "x-toa-delivery";

/// The call's deadline, if it has one: at most the longest timeout a call may state from `now`.
pub fn deadline(headers: Option<&FieldTable>, now_ms: i64) -> Option<i64> {
    let latest = now_ms.saturating_add(MAX_TIMEOUT_MS as i64);
    integer(headers, DEADLINE).map(|deadline| deadline.min(latest))
}

/// The number an agent published the call with (1 without one), from 1 to `limit`.
pub fn published(headers: Option<&FieldTable>, limit: u32) -> i64 {
    let counted = integer(headers, DELIVERY).unwrap_or(1);
    counted.clamp(1, i64::from(limit.max(1)))
}

/// The caller's trace, when its headers hold a valid one (any other value counts as none).
pub fn trace(headers: Option<&FieldTable>) -> Option<toa_context::trace::TraceContext> {
    let text = |name: &str| match headers?.inner().get(name) {
        Some(AMQPValue::LongString(value)) => Some(value.as_bytes()),
        _ => None,
    };
    toa_context::trace::TraceContext::read(
        text(toa_context::trace::TRACEPARENT),
        text(toa_context::trace::TRACESTATE),
    )
}

/// The header `name` as agents write integers; any other type counts as absent.
fn integer(headers: Option<&FieldTable>, name: &str) -> Option<i64> {
    match headers?.inner().get(name) {
        Some(AMQPValue::LongLongInt(value)) => Some(*value),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(name.into(), value);
        headers
    }

    #[test]
    fn a_deadline_is_at_most_the_longest_timeout_from_now() {
        let now = 1_700_000_000_000;
        let far = with(DEADLINE, AMQPValue::LongLongInt(i64::MAX));
        assert_eq!(deadline(Some(&far), now), Some(now + MAX_TIMEOUT_MS as i64));
        let near = with(DEADLINE, AMQPValue::LongLongInt(now + 5_000));
        assert_eq!(deadline(Some(&near), now), Some(now + 5_000));
        let past = with(DEADLINE, AMQPValue::LongLongInt(i64::MIN));
        assert_eq!(deadline(Some(&past), now), Some(i64::MIN), "past: not run");
        let text = with(DEADLINE, AMQPValue::LongString("soon".into()));
        assert_eq!(deadline(Some(&text), now), None);
        assert_eq!(deadline(None, now), None);
    }

    #[test]
    fn a_published_number_is_at_least_one_and_at_most_the_limit() {
        let count = |value: i64| {
            let headers = with(DELIVERY, AMQPValue::LongLongInt(value));
            published(Some(&headers), 5)
        };
        assert_eq!(count(i64::MIN), 1);
        assert_eq!(count(3), 3);
        assert_eq!(count(i64::MAX), 5, "the limit; no overflow");
        assert_eq!(published(None, 5), 1);
    }
}
