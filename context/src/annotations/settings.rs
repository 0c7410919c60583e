//! The table of the context's settings, [`SETTINGS`]: one row per setting, naming its annotation,
//! its `TOA_*` variable, its kind and what its absence means. Reading a document, a spec or
//! variables, and writing variables, all walk the rows; the typed [`Context`] is read from the
//! checked settings with serde.

use super::{Context, Vars, DEFAULT_ADDRESSED_TIMEOUT, DEFAULT_INTERVAL, DEFAULT_TTL};
use crate::address::{AmqpAddress, RedisAddress, StorageAddress};
use crate::environment::join;
use crate::ContextError;
use serde_json::{Map, Value as Json};
use serde_yaml::{Mapping, Value};
use std::time::Duration;

/// One setting of the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Its key in `context.toa.yaml` and in a Composition's `spec.context`: `limits.runCommand`.
    pub annotation: &'static str,
    /// The environment variable a pod receives it in.
    pub variable: &'static str,
    pub kind: Kind,
    pub if_absent: IfAbsent,
}

/// What a setting holds, and so how it is read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The application's name (a DNS label).
    Name,
    /// One Redis address or an odd number of them; a variable separates them with `,`.
    Addresses,
    /// The broker's address.
    Address,
    /// The store's address (PostgreSQL).
    Storage,
    /// A positive whole number of milliseconds.
    Millis,
    /// A whole number from 1 to `u32::MAX`.
    Count,
}

/// What an absent setting means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfAbsent {
    /// It must be given; in a section (`atomicity.redis`), the section is optional and this
    /// setting says whether it is there.
    Required,
    /// Nothing: the feature is off.
    Off,
    Millis(Duration),
    Count(u32),
}

const fn row(
    annotation: &'static str,
    variable: &'static str,
    kind: Kind,
    if_absent: IfAbsent,
) -> Setting {
    Setting {
        annotation,
        variable,
        kind,
        if_absent,
    }
}

/// A default of milliseconds.
const fn ms(millis: u64) -> IfAbsent {
    IfAbsent::Millis(Duration::from_millis(millis))
}

/// Every setting, in the order of the module's table and of [`Context::to_vars`]: annotation,
/// variable, kind, what its absence means.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    row("name",               "TOA_APPLICATION",        Kind::Name,      IfAbsent::Required),
    row("atomicity.redis",    "TOA_ATOMICITY_REDIS",    Kind::Addresses, IfAbsent::Required),
    row("atomicity.interval", "TOA_ATOMICITY_INTERVAL", Kind::Millis,    IfAbsent::Millis(DEFAULT_INTERVAL)),
    row("atomicity.ttl",      "TOA_ATOMICITY_TTL",      Kind::Millis,    IfAbsent::Millis(DEFAULT_TTL)),
    row("addressed.timeout",  "TOA_ADDRESSED_TIMEOUT",  Kind::Millis,    IfAbsent::Millis(DEFAULT_ADDRESSED_TIMEOUT)),
    row("amqp",               "TOA_AMQP",               Kind::Address,   IfAbsent::Off),
    row("storage",            "TOA_STORAGE",            Kind::Storage,   IfAbsent::Off),
    row("limits.operation",   "TOA_LIMIT_OPERATION",    Kind::Millis,    ms(60_000)),
    row("limits.runCommand",  "TOA_LIMIT_RUN_COMMAND",  Kind::Millis,    ms(60_000)),
    row("limits.drain",       "TOA_LIMIT_DRAIN",        Kind::Millis,    ms(25_000)),
    row("limits.queue",       "TOA_LIMIT_QUEUE",        Kind::Count,     IfAbsent::Count(100_000)),
    row("limits.deliveries",  "TOA_LIMIT_DELIVERIES",   Kind::Count,     IfAbsent::Count(5)),
    row("limits.idempotency", "TOA_LIMIT_IDEMPOTENCY",  Kind::Millis,    ms(600_000)),
    row("limits.once",        "TOA_LIMIT_ONCE",         Kind::Millis,    ms(604_800_000)),
    row("limits.events",      "TOA_LIMIT_EVENTS",       Kind::Millis,    ms(86_400_000)),
    row("limits.inflight",    "TOA_LIMIT_INFLIGHT",     Kind::Count,     IfAbsent::Count(256)),
    row("limits.message",     "TOA_LIMIT_MESSAGE",      Kind::Count,     IfAbsent::Count(16 << 20)),
];

/// The keys the context's root takes besides the settings' sections: `configuration` is the
/// components' own (crate::configuration reads it).
const OTHER_ROOT_KEYS: &[&str] = &["configuration"];

impl Setting {
    /// `atomicity` for `atomicity.redis`; `None` for a setting at the root (`amqp`).
    pub fn section(&self) -> Option<&'static str> {
        self.annotation.split_once('.').map(|(section, _)| section)
    }

    /// Its key within its section: `redis` for `atomicity.redis`.
    fn field(&self) -> &'static str {
        self.annotation
            .split_once('.')
            .map_or(self.annotation, |(_, field)| field)
    }

    /// Its value when absent, in the wire form; `None` when there is none.
    fn default_value(&self) -> Option<Json> {
        match self.if_absent {
            IfAbsent::Required | IfAbsent::Off => None,
            IfAbsent::Millis(duration) => Some(super::wire_millis(duration).into()),
            IfAbsent::Count(count) => Some(count.into()),
        }
    }
}

/// The required setting of an optional section (`atomicity.redis`); `None` for a section that is
/// always there, its settings' defaults filled in.
fn anchor(section: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|setting| {
        setting.section() == Some(section) && setting.if_absent == IfAbsent::Required
    })
}

/// The keys of a section (`None`: the root's), in the table's order.
fn keys(section: Option<&str>) -> Vec<&'static str> {
    let mut keys = Vec::new();
    for setting in SETTINGS {
        let key = match section {
            None => setting.section().unwrap_or(setting.annotation),
            Some(section) if setting.section() == Some(section) => setting.field(),
            Some(_) => continue,
        };
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// A section's defaults, as its typed form: `Limits::default()`.
pub(super) fn defaults<T: serde::de::DeserializeOwned>(section: &str) -> T {
    let values: Map<String, Json> = SETTINGS
        .iter()
        .filter(|setting| setting.section() == Some(section))
        .filter_map(|setting| Some((setting.field().to_owned(), setting.default_value()?)))
        .collect();
    serde_json::from_value(Json::Object(values))
        .expect("every setting of the section has a default")
}

/// Refuses a key of the document, or of one of its sections, that no setting has.
pub(super) fn only_known_keys(root: &Mapping) -> Result<(), ContextError> {
    let mut known = keys(None);
    known.extend(OTHER_ROOT_KEYS);
    only_keys(root, "", &known)?;
    for section in keys(None) {
        let fields = keys(Some(section));
        match root.get(section) {
            Some(value) if !fields.is_empty() => {
                only_keys(mapping(value, section)?, section, &fields)?;
            }
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn mapping<'a>(value: &'a Value, key: &str) -> Result<&'a Mapping, ContextError> {
    match value {
        Value::Mapping(mapping) => Ok(mapping),
        other => Err(expected(key, "a mapping", other)),
    }
}

fn only_keys(mapping: &Mapping, path: &str, known: &[&str]) -> Result<(), ContextError> {
    for key in mapping.keys() {
        let key = key.as_str().unwrap_or_default();
        if !known.contains(&key) {
            return Err(ContextError::invalid(
                join(path, key),
                format!("unknown key; expected one of: {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

/// A setting's value as given: a YAML value (a document, a spec) or a variable's text.
pub(super) enum Given {
    Yaml(Value),
    Text(String),
}

/// Where the settings come from.
pub(super) trait Source {
    /// How a setting is named in messages: its annotation or its variable.
    fn key(&self, setting: &Setting) -> String;
    /// Whether an optional section is there, given its required setting.
    fn has(&self, section: &str, anchor: &Setting) -> bool;
    fn given(&self, setting: &Setting) -> Option<Given>;
}

/// A tree of annotations: a document's root, or a spec's `context` with its `name`.
pub(super) struct Tree<'a>(pub &'a Mapping);

impl Source for Tree<'_> {
    fn key(&self, setting: &Setting) -> String {
        setting.annotation.to_owned()
    }

    fn has(&self, section: &str, _: &Setting) -> bool {
        self.0.contains_key(section)
    }

    fn given(&self, setting: &Setting) -> Option<Given> {
        let value = match setting.section() {
            None => self.0.get(setting.annotation),
            Some(section) => self.0.get(section)?.as_mapping()?.get(setting.field()),
        };
        value.cloned().map(Given::Yaml)
    }
}

/// `TOA_*` variables.
pub(super) struct Variables<'a>(pub &'a dyn Vars);

impl Source for Variables<'_> {
    fn key(&self, setting: &Setting) -> String {
        setting.variable.to_owned()
    }

    fn has(&self, _: &str, anchor: &Setting) -> bool {
        self.0.get(anchor.variable).is_some()
    }

    fn given(&self, setting: &Setting) -> Option<Given> {
        self.0.get(setting.variable).map(Given::Text)
    }
}

/// Checks every setting `source` gives, row by row, fills in the defaults and reads the context.
pub(super) fn read(source: &dyn Source) -> Result<Context, ContextError> {
    let mut tree = Map::new();
    for setting in SETTINGS {
        if let Some(value) = checked(source, setting)? {
            let (section, field) = match setting.section() {
                None => (&mut tree, setting.annotation),
                Some(section) => {
                    let entry = tree
                        .entry(section)
                        .or_insert_with(|| Json::Object(Map::new()));
                    (
                        entry.as_object_mut().expect("a section is an object"),
                        setting.field(),
                    )
                }
            };
            section.insert(field.to_owned(), value);
        }
    }
    let context: Context = serde_json::from_value(Json::Object(tree))
        .map_err(|error| ContextError::invalid("(root)", error.to_string()))?;
    context.with_valid_name()
}

/// One setting's value, checked, in the wire form; `None` when it is absent and has no default.
fn checked(source: &dyn Source, setting: &Setting) -> Result<Option<Json>, ContextError> {
    let optional_section = setting
        .section()
        .and_then(|section| Some((section, anchor(section)?)));
    if let Some((section, anchor)) = optional_section {
        if !source.has(section, anchor) {
            return match source.given(setting) {
                Some(_) if setting != anchor => Err(ContextError::invalid(
                    source.key(setting),
                    format!("expected {} to be set as well", source.key(anchor)),
                )),
                _ => Ok(None),
            };
        }
    }
    let key = source.key(setting);
    match (source.given(setting), setting.if_absent) {
        (Some(given), _) => setting
            .kind
            .check(given, &key, setting.annotation)
            .map(Some),
        (None, IfAbsent::Required) => Err(ContextError::invalid(key, setting.kind.missing())),
        (None, _) => Ok(setting.default_value()),
    }
}

impl Kind {
    /// Checks a given value; `key` names it, `annotation` names a list's items.
    fn check(self, given: Given, key: &str, annotation: &str) -> Result<Json, ContextError> {
        Ok(match self {
            Kind::Name => text(given, key, "a string")?.into(),
            Kind::Address => AmqpAddress::parse(&text(given, key, "an address")?, key)?
                .to_string()
                .into(),
            Kind::Storage => StorageAddress::parse(&text(given, key, "an address")?, key)?
                .to_string()
                .into(),
            Kind::Addresses => redis_addresses(&list(given, annotation)?, annotation)?
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .into(),
            Kind::Millis => number(
                given,
                key,
                "a positive whole number of milliseconds",
                parse_millis,
            )?
            .into(),
            Kind::Count => number(given, key, "a positive whole number", |text, key| {
                parse_count(text, key).map(u64::from)
            })?
            .into(),
        })
    }

    /// Why a required setting is missing.
    fn missing(self) -> &'static str {
        match self {
            Kind::Name => "expected the application's name",
            _ => "expected one address or a list of them",
        }
    }

    /// A value in the wire form as a variable's text; `None` for an absent one.
    fn text(self, value: &Json) -> Option<String> {
        match value {
            Json::Null => None,
            Json::String(text) => Some(text.clone()),
            Json::Array(items) => Some(
                items
                    .iter()
                    .filter_map(|item| self.text(item))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            other => Some(other.to_string()),
        }
    }
}

/// The variables of `context`, in the table's order.
pub(super) fn to_vars(context: &Context) -> Vec<(&'static str, String)> {
    let tree = serde_json::to_value(context).expect("a context serializes");
    SETTINGS
        .iter()
        .filter_map(|setting| {
            let value = match setting.section() {
                None => tree.get(setting.annotation)?,
                Some(section) => tree.get(section)?.get(setting.field())?,
            };
            Some((setting.variable, setting.kind.text(value)?))
        })
        .collect()
}

fn text(given: Given, key: &str, what: &str) -> Result<String, ContextError> {
    match given {
        Given::Text(text) | Given::Yaml(Value::String(text)) => Ok(text),
        Given::Yaml(other) => Err(expected(key, what, &other)),
    }
}

/// One address or a list of them; a variable separates them with `,`.
fn list(given: Given, key: &str) -> Result<Vec<String>, ContextError> {
    match given {
        Given::Text(list) => Ok(list.split(',').map(|s| s.trim().to_owned()).collect()),
        Given::Yaml(Value::String(one)) => Ok(vec![one]),
        Given::Yaml(Value::Sequence(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| match item {
                Value::String(text) => Ok(text.clone()),
                other => Err(expected(&format!("{key}[{index}]"), "an address", other)),
            })
            .collect(),
        Given::Yaml(other) => Err(expected(key, "one address or a list of them", &other)),
    }
}

fn number(
    given: Given,
    key: &str,
    what: &str,
    parse: fn(&str, &str) -> Result<u64, ContextError>,
) -> Result<u64, ContextError> {
    match given {
        Given::Text(text) => parse(&text, key),
        Given::Yaml(Value::Number(n)) => parse(&n.to_string(), key),
        Given::Yaml(other) => Err(expected(key, what, &other)),
    }
}

/// One address or an odd number of independent ones; `key` names the list.
pub(super) fn redis_addresses(
    redis: &[String],
    key: &str,
) -> Result<Vec<RedisAddress>, ContextError> {
    if redis.is_empty() || redis.iter().all(String::is_empty) {
        return Err(ContextError::invalid(
            key,
            "expected one address or a list of them",
        ));
    }
    if redis.len().is_multiple_of(2) {
        return Err(ContextError::EvenAddresses(redis.len()));
    }
    let addresses = redis
        .iter()
        .enumerate()
        .map(|(index, text)| match redis.len() {
            1 => RedisAddress::parse(text, key),
            _ => RedisAddress::parse(text, &format!("{key}[{index}]")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (index, address) in addresses.iter().enumerate() {
        if addresses[..index].contains(address) {
            return Err(ContextError::invalid(
                format!("{key}[{index}]"),
                format!("expected independent servers, {address} is listed twice"),
            ));
        }
    }
    Ok(addresses)
}

/// The longest time a setting takes: ten years of 365 days. Longer ones are no one's intent,
/// and past what the stores take (a record's retention of millions of years is no interval
/// PostgreSQL can subtract from now; Redis refuses such an expiry), every call would fail.
const LONGEST_MILLIS: u64 = 10 * 365 * 24 * 3600 * 1000;

fn parse_millis(text: &str, key: &str) -> Result<u64, ContextError> {
    match text.trim().parse::<u64>() {
        Ok(ms) if ms > LONGEST_MILLIS => Err(ContextError::invalid(
            key,
            format!("expected at most {LONGEST_MILLIS} milliseconds (ten years), got {text}"),
        )),
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(ContextError::invalid(
            key,
            format!("expected a positive whole number of milliseconds, got {text}"),
        )),
    }
}

fn parse_count(text: &str, key: &str) -> Result<u32, ContextError> {
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ContextError::invalid(
            key,
            format!("expected a whole number from 1 to {}, got {text}", u32::MAX),
        )),
    }
}

fn expected(key: &str, what: &str, got: &Value) -> ContextError {
    let got = serde_yaml::to_string(got).unwrap_or_default();
    ContextError::invalid(key, format!("expected {what}, got {}", got.trim_end()))
}
