//! Errors told to people: one line with every cause.

/// An error with its causes, as one line. Crates keep what matters in the causes: hyper says
/// only `client error (Connect)`, tokio-postgres only `db error` of what the server answered
/// (`ERROR: permission denied …`). A cause its error already quotes is not repeated.
pub fn described(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        cause: Option<Box<Layer>>,
    }

    fn layer(text: &'static str, cause: Option<Layer>) -> Layer {
        Layer {
            text,
            cause: cause.map(Box::new),
        }
    }

    #[test]
    fn every_cause_is_told_once() {
        let refused = layer("ERROR: permission denied", None);
        let quoted = layer("db error: ERROR: permission denied", Some(refused));
        let top = layer("client error (Connect)", Some(quoted));
        assert_eq!(
            described(&top),
            "client error (Connect): db error: ERROR: permission denied"
        );
    }
}
