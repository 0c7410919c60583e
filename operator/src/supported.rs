//! Pure: the Kubernetes releases the operator supports, API servers 1.33 to 1.37 (the releases
//! still supported upstream and by the large providers; kube-rs's own range, whose `earliest`
//! feature, v1_33, this workspace's k8s-openapi uses). Kubelets are then 1.30 or later by the
//! version skew policy, so every pod runs the agent as a native sidecar.
//!
//! Below the floor the operator does not start: it would apply objects whose fields such a server
//! drops or refuses (the native sidecar's `restartPolicy`, the CRD's CEL `format`). Above the
//! range it starts and says so once: a newer server usually serves what the floor does.

use k8s_openapi::apimachinery::pkg::version::Info;

/// The oldest API server the operator runs against.
pub const FLOOR: Release = Release {
    major: 1,
    minor: 33,
};
/// The newest release the suite runs on.
pub const NEWEST_TESTED: Release = Release {
    major: 1,
    minor: 37,
};

/// A Kubernetes release, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why the operator does not run against a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error(
        "the API server is Kubernetes {found}; the operator needs {FLOOR} or later (supported: \
         {FLOOR} to {NEWEST_TESTED}), whose native sidecars and CEL its objects use"
    )]
    TooOld { found: Release },
    #[error(
        "the API server reports version major {major:?}, minor {minor:?}, gitVersion \
         {git_version:?}, which name no Kubernetes release"
    )]
    Unreadable {
        major: String,
        minor: String,
        git_version: String,
    },
}

/// The release of a server's `/version`: its `major` and `minor` (providers suffix the minor,
/// `"33+"`), or its `gitVersion` (`v1.33.2-gke.1200`) when those are not numbers.
pub fn release(version: &Info) -> Result<Release, Unsupported> {
    let number = |text: &str| {
        let digits = text.trim_end_matches(|c: char| !c.is_ascii_digit());
        digits.parse::<u32>().ok()
    };
    let from_git = || {
        let mut parts = version.git_version.strip_prefix('v')?.split('.');
        Some((parts.next()?.parse().ok()?, number(parts.next()?)?))
    };
    match (number(&version.major), number(&version.minor)) {
        (Some(major), Some(minor)) => Ok(Release { major, minor }),
        _ => match from_git() {
            Some((major, minor)) => Ok(Release { major, minor }),
            None => Err(Unsupported::Unreadable {
                major: version.major.clone(),
                minor: version.minor.clone(),
                git_version: version.git_version.clone(),
            }),
        },
    }
}

/// Whether the operator runs against a server of this `/version`: the release when it does.
pub fn check(version: &Info) -> Result<Release, Unsupported> {
    let found = release(version)?;
    if found < FLOOR {
        return Err(Unsupported::TooOld { found });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(major: &str, minor: &str, git_version: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git_version.into(),
            ..Info::default()
        }
    }

    fn check_of(major: &str, minor: &str) -> Result<Release, Unsupported> {
        check(&version(major, minor, ""))
    }

    #[test]
    fn the_floor_and_later_run_and_older_servers_are_refused_naming_the_range() {
        assert_eq!(
            check_of("1", "33"),
            Ok(Release {
                major: 1,
                minor: 33
            })
        );
        assert_eq!(
            check_of("1", "37"),
            Ok(Release {
                major: 1,
                minor: 37
            })
        );
        // Providers' suffixed minors (EKS, GKE) and a later major.
        assert_eq!(
            check_of("1", "34+"),
            Ok(Release {
                major: 1,
                minor: 34
            })
        );
        assert_eq!(check_of("2", "0"), Ok(Release { major: 2, minor: 0 }));
        let old = check_of("1", "32").unwrap_err();
        assert_eq!(
            old,
            Unsupported::TooOld {
                found: Release {
                    major: 1,
                    minor: 32
                }
            }
        );
        assert_eq!(
            old.to_string(),
            "the API server is Kubernetes 1.32; the operator needs 1.33 or later (supported: \
             1.33 to 1.37), whose native sidecars and CEL its objects use"
        );
        assert!(matches!(
            check_of("1", "20"),
            Err(Unsupported::TooOld { .. })
        ));
    }

    #[test]
    fn without_numbers_the_git_version_is_read_and_without_it_the_server_is_refused() {
        let gke = version("", "", "v1.33.2-gke.1200");
        assert_eq!(
            check(&gke),
            Ok(Release {
                major: 1,
                minor: 33
            })
        );
        let old = version("", "", "v1.31.0");
        assert!(matches!(check(&old), Err(Unsupported::TooOld { .. })));
        let error = check(&version("", "x", "unknown")).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(r#"major "", minor "x", gitVersion "unknown""#),
            "{error}"
        );
    }
}
