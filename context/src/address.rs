//! Addresses of Redis servers and of the broker. An address never carries credentials: those come
//! from the environment or a mounted Secret file (see [`crate::credentials`]), so an address can be
//! logged, shown in status and written into manifests safely.

use crate::ContextError;
use serde::{Deserialize, Serialize};
use std::fmt;
use url::Url;

/// `redis://host[:port][/db]`, or `rediss://` for TLS; serialized as that text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct RedisAddress {
    /// `rediss://`: the connection is TLS, the server's certificate checked ([`crate::tls`]).
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub db: i64,
}

/// `amqp://host[:port][/vhost]`, or `amqps://` for TLS; serialized as that text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct AmqpAddress {
    /// `amqps://`: the connection is TLS, the server's certificate checked ([`crate::tls`]).
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The virtual host, `/` when the address names none.
    pub vhost: String,
}

/// `postgres://host[:port]/database`: the store of the application's entities (DESIGN 17);
/// serialized as that text. Credentials come from the environment (`TOA_STORAGE_USERNAME`,
/// `TOA_STORAGE_PASSWORD` or `..._FILE`), never in the address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct StorageAddress {
    pub host: String,
    pub port: u16,
    pub database: String,
}

impl StorageAddress {
    pub fn parse(text: &str, key: &str) -> Result<Self, ContextError> {
        let example = "postgres://host:5432/database";
        let url = parse_url(text, key, ["postgres", "postgresql"], example)?;
        let database = percent_decode(url.path().trim_start_matches('/'))
            .filter(|database| !database.is_empty() && !database.contains('/'))
            .ok_or_else(|| {
                ContextError::invalid(
                    key,
                    format!(
                        "expected the database after the host, as in {example}, got {:?}",
                        redact(text)
                    ),
                )
            })?;
        Ok(Self {
            host: host(&url),
            port: url.port().unwrap_or(5432),
            database,
        })
    }
}

impl TryFrom<String> for StorageAddress {
    type Error = ContextError;

    fn try_from(text: String) -> Result<Self, ContextError> {
        Self::parse(&text, "storage")
    }
}

impl From<StorageAddress> for String {
    fn from(address: StorageAddress) -> Self {
        address.to_string()
    }
}

impl fmt::Display for StorageAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let database = percent_encode(&self.database);
        write!(f, "postgres://{}:{}/{database}", self.host, self.port)
    }
}

impl RedisAddress {
    /// Parses one address; `key` names where it came from, for the error.
    pub fn parse(text: &str, key: &str) -> Result<Self, ContextError> {
        let url = parse_url(text, key, ["redis", "rediss"], "redis://host:6379")?;
        let db = match url.path().trim_start_matches('/') {
            "" => 0,
            db => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| {
                    ContextError::invalid(
                        key,
                        format!(
                            "expected a database number after the host, got {:?}",
                            redact(text)
                        ),
                    )
                })?,
        };
        Ok(Self {
            tls: url.scheme() == "rediss",
            host: host(&url),
            port: url.port().unwrap_or(6379),
            db,
        })
    }
}

impl AmqpAddress {
    pub fn parse(text: &str, key: &str) -> Result<Self, ContextError> {
        let url = parse_url(text, key, ["amqp", "amqps"], "amqp://host:5672")?;
        let vhost = match url.path() {
            "" | "/" => "/".to_owned(),
            path => percent_decode(&path[1..]).ok_or_else(|| {
                ContextError::invalid(
                    key,
                    format!(
                        "expected a virtual host after the host, got {:?}",
                        redact(text)
                    ),
                )
            })?,
        };
        let tls = url.scheme() == "amqps";
        Ok(Self {
            tls,
            host: host(&url),
            // The IANA ports: 5671 for AMQP over TLS.
            port: url.port().unwrap_or(if tls { 5671 } else { 5672 }),
            vhost,
        })
    }
}

/// Encodes what [`percent_decode`] decodes: every byte but the unreserved ones as `%XX` (a space
/// as `%20`, not the `+` of forms, which the decoding keeps as it is).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Decodes `%XX` escapes (a vhost `/` is written `%2F`).
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn host(url: &Url) -> String {
    url.host_str().unwrap_or_default().to_owned()
}

/// `text` as a URL of one of the two `schemes` (plain, then TLS).
fn parse_url(
    text: &str,
    key: &str,
    schemes: [&str; 2],
    example: &str,
) -> Result<Url, ContextError> {
    let url = Url::parse(text).map_err(|_| {
        ContextError::invalid(
            key,
            format!("expected an address like {example}, got {:?}", redact(text)),
        )
    })?;
    if !schemes.contains(&url.scheme()) {
        let [plain, tls] = schemes;
        return Err(ContextError::invalid(
            key,
            format!(
                "expected the scheme {plain}:// or {tls}:// (as in {example}), got {:?}",
                redact(text)
            ),
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ContextError::invalid(
            key,
            format!(
                "the address {} carries credentials; give them in the environment or a mounted Secret file instead",
                redact(text)
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ContextError::invalid(
            key,
            format!("expected a host, as in {example}, got {:?}", redact(text)),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ContextError::invalid(
            key,
            format!(
                "expected no query or fragment, as in {example}, got {:?}",
                redact(text)
            ),
        ));
    }
    Ok(url)
}

/// The text with what may be credentials replaced: anything before the last `@`, after the
/// scheme's `://` when there is one (`redis://***@host`, and `***@host` for `user:pw@host` written
/// without a scheme), so a refused address never leaks a password into an error or a log.
pub fn redact(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        return text.to_owned();
    };
    let start = text.find("://").map_or(0, |scheme| scheme + 3);
    if at < start {
        return text.to_owned();
    }
    format!("{}***{}", &text[..start], &text[at..])
}

impl TryFrom<String> for RedisAddress {
    type Error = ContextError;

    fn try_from(text: String) -> Result<Self, ContextError> {
        Self::parse(&text, "address")
    }
}

impl From<RedisAddress> for String {
    fn from(address: RedisAddress) -> Self {
        address.to_string()
    }
}

impl TryFrom<String> for AmqpAddress {
    type Error = ContextError;

    fn try_from(text: String) -> Result<Self, ContextError> {
        Self::parse(&text, "amqp")
    }
}

impl From<AmqpAddress> for String {
    fn from(address: AmqpAddress) -> Self {
        address.to_string()
    }
}

impl fmt::Display for RedisAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)?;
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl fmt::Display for AmqpAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "amqps" } else { "amqp" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)?;
        if self.vhost != "/" {
            write!(f, "/{}", percent_encode(&self.vhost))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_redis_addresses() {
        let a = RedisAddress::parse("redis://localhost", "k").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.db), ("localhost", 6379, 0));
        assert_eq!(a.to_string(), "redis://localhost:6379");
        let b = RedisAddress::parse("redis://10.0.0.1:7000/3", "k").unwrap();
        assert_eq!(b.to_string(), "redis://10.0.0.1:7000/3");
    }

    #[test]
    fn a_storage_address_names_its_database_and_carries_no_credentials() {
        let a = StorageAddress::parse("postgres://db.infra.svc/shop", "storage").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.database.as_str()),
            ("db.infra.svc", 5432, "shop")
        );
        assert_eq!(a.to_string(), "postgres://db.infra.svc:5432/shop");
        let error = StorageAddress::parse("postgres://app:hunter2@db/shop", "storage").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(error.to_string().contains("carries credentials"), "{error}");
        let error = StorageAddress::parse("postgres://db:5432", "storage").unwrap_err();
        assert!(
            error.to_string().contains("expected the database"),
            "{error}"
        );
    }

    #[test]
    fn tls_schemes_read_back_as_printed() {
        let redis = RedisAddress::parse("rediss://cache.infra.svc", "k").unwrap();
        assert!(redis.tls);
        assert_eq!(redis.to_string(), "rediss://cache.infra.svc:6379");
        let amqp = AmqpAddress::parse("amqps://rabbit/shop", "amqp").unwrap();
        assert!(amqp.tls);
        assert_eq!(
            (amqp.port, amqp.to_string().as_str()),
            (5671, "amqps://rabbit:5671/shop")
        );
        let plain = AmqpAddress::parse("amqp://rabbit", "amqp").unwrap();
        assert_eq!((plain.tls, plain.port), (false, 5672));
    }

    #[test]
    fn refuses_credentials_without_printing_them() {
        let error = RedisAddress::parse("redis://user:hunter2@host:6379", "atomicity.redis")
            .unwrap_err()
            .to_string();
        assert!(error.contains("carries credentials"), "{error}");
        assert!(error.starts_with("`atomicity.redis`"), "{error}");
        assert!(
            !error.contains("hunter2") && !error.contains("user"),
            "{error}"
        );
        let error = AmqpAddress::parse("amqp://:secret@host", "amqp")
            .unwrap_err()
            .to_string();
        assert!(!error.contains("secret"), "{error}");
    }

    #[test]
    fn refuses_malformed_addresses() {
        for (text, expected) in [
            (
                "localhost:6379",
                "expected the scheme redis:// or rediss://",
            ),
            ("http://host", "expected the scheme redis:// or rediss://"),
            ("not a url", "expected an address like redis://host:6379"),
            ("redis://host/x", "expected a database number"),
            ("redis://host?db=1", "expected no query"),
        ] {
            let error = RedisAddress::parse(text, "atomicity.redis")
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn credentials_are_redacted_with_a_scheme_or_without() {
        let cases = [
            ("redis://admin:s3cret@redis:6379", "redis://***@redis:6379"),
            ("admin:s3cret@redis:6379", "***@redis:6379"),
            ("amqp://u:p@w@broker/vh", "amqp://***@broker/vh"),
            ("redis://redis:6379", "redis://redis:6379"),
            ("localhost", "localhost"),
        ];
        for (text, redacted) in cases {
            assert_eq!(redact(text), redacted, "{text}");
        }
    }

    #[test]
    fn a_vhost_reads_back_as_printed() {
        for vhost in ["shop", "my vhost", "a/b", "x+y", "ü"] {
            let address = AmqpAddress {
                tls: false,
                host: "h".to_owned(),
                port: 5672,
                vhost: vhost.to_owned(),
            };
            let again = AmqpAddress::parse(&address.to_string(), "amqp").unwrap();
            assert_eq!(again.vhost, vhost, "{address}");
        }
    }

    #[test]
    fn amqp_vhost() {
        assert_eq!(AmqpAddress::parse("amqp://h", "amqp").unwrap().vhost, "/");
        let a = AmqpAddress::parse("amqp://h:5673/shop", "amqp").unwrap();
        assert_eq!((a.vhost.as_str(), a.port), ("shop", 5673));
        assert_eq!(a.to_string(), "amqp://h:5673/shop");
        let slash = AmqpAddress::parse("amqp://h/%2Fa", "amqp").unwrap();
        assert_eq!(slash.vhost, "/a");
        assert_eq!(slash.to_string(), "amqp://h:5672/%2Fa");
    }
}
