use super::*;
use std::collections::HashMap;

struct Map(HashMap<&'static str, String>);

impl Vars for Map {
    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

fn with_file(path: &std::path::Path) -> Map {
    Map(HashMap::from([(CA_FILE, path.display().to_string())]))
}

const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

#[test]
fn certificates_come_inline_or_from_a_file() {
    let dir = std::env::temp_dir().join(format!("toa-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ca.crt");
    std::fs::write(&file, PEM).unwrap();
    let roots = Roots::from_vars(&with_file(&file)).unwrap();
    assert_eq!(roots.pem(), Some(PEM));
    assert_eq!(format!("{roots:?}"), "Roots { certificates: Some(1) }");
    let inline = Map(HashMap::from([(CA, PEM.to_owned())]));
    assert_eq!(Roots::from_vars(&inline).unwrap().pem(), Some(PEM));
    // Neither: the public roots.
    assert_eq!(Roots::from_vars(&Map(HashMap::new())).unwrap().pem(), None);
    let both = Map(HashMap::from([
        (CA, PEM.to_owned()),
        (CA_FILE, "x".to_owned()),
    ]));
    let error = Roots::from_vars(&both).unwrap_err().to_string();
    assert_eq!(
        error,
        "`TOA_TLS_CA`: expected either TOA_TLS_CA or TOA_TLS_CA_FILE, not both"
    );

    std::fs::write(&file, "not a certificate").unwrap();
    let error = Roots::from_vars(&with_file(&file)).unwrap_err().to_string();
    assert!(
        error.starts_with("`TOA_TLS_CA_FILE`: expected PEM certificates"),
        "{error}"
    );
    std::fs::write(&file, vec![b'a'; 1024 * 1024 + 1]).unwrap();
    let error = Roots::from_vars(&with_file(&file)).unwrap_err().to_string();
    assert!(error.contains("expected at most 1048576 bytes"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_file_is_refused_naming_it() {
    let missing = std::path::Path::new("/nonexistent/toa/ca.crt");
    let error = Roots::from_vars(&with_file(missing))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("`TOA_TLS_CA_FILE`: cannot read \"/nonexistent/toa/ca.crt\""),
        "{error}"
    );
}

#[test]
fn the_stores_certificates_are_its_own_and_turn_tls_on() {
    let none = Map(HashMap::from([(CA, PEM.to_owned())]));
    assert_eq!(
        Roots::storage_from_vars(&none).unwrap(),
        None,
        "Redis's CA is not the store's"
    );
    let given = Map(HashMap::from([(STORAGE_CA, PEM.to_owned())]));
    let roots = Roots::storage_from_vars(&given).unwrap().unwrap();
    assert_eq!(roots.pem(), Some(PEM));
    let missing = Map(HashMap::from([(
        STORAGE_CA_FILE,
        "/nonexistent/ca.crt".to_owned(),
    )]));
    let error = Roots::storage_from_vars(&missing).unwrap_err().to_string();
    assert!(
        error.starts_with("`TOA_STORAGE_CA_FILE`: cannot read"),
        "{error}"
    );
}
