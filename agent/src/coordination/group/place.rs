//! Where a local group meets: a directory of the user's own (`$XDG_RUNTIME_DIR/toa`, else
//! `/tmp/toa-<uid>`, mode 0700 and owned by the user, or refused), and in it, per group, a lock
//! file whose holder leads, the Unix socket the leader serves on, and its address file (0600)
//! with the token both sides prove they hold. Only the user reaches into the directory, so no
//! other user's process can connect to the socket, take its name, or read the token. The kernel
//! releases the lock when its holder exits, however it exits: the next process to take it leads.

use super::GroupError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What the leader writes for the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Address {
    /// The leader's socket.
    pub socket: PathBuf,
    pub token: String,
    pub pid: u32,
}

/// One group's files.
#[derive(Debug, Clone)]
pub struct Place {
    /// What the group is called in logs: `TOA_LOCAL_GROUP`, or the application and context.
    pub name: String,
    lock: PathBuf,
    address: PathBuf,
    /// Where a leader serves.
    pub socket: PathBuf,
}

impl Place {
    /// The group called `name` in the user's runtime directory (created if missing).
    pub fn new(name: String) -> Result<Self, GroupError> {
        Self::in_dir(&runtime_dir()?, name)
    }

    pub fn in_dir(dir: &Path, name: String) -> Result<Self, GroupError> {
        own_dir(dir)?;
        let digest = Sha256::digest(name.as_bytes());
        let file: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            name,
            lock: dir.join(format!("group-{file}.lock")),
            address: dir.join(format!("group-{file}.json")),
            socket: dir.join(format!("group-{file}.sock")),
        })
    }

    /// The lock, if no live process holds it: this process leads while it keeps the file open.
    pub fn try_lead(&self) -> Result<Option<File>, GroupError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&self.lock)
            .map_err(|e| GroupError::Place(format!("{}: {e}", self.lock.display())))?;
        match file.try_lock() {
            // The lock counts only on the file the path names now: one removed between the open
            // and the lock (and made anew by another process) would make two leaders.
            Ok(()) if same_file(&file, &self.lock) => Ok(Some(file)),
            Ok(()) => Ok(None),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(GroupError::Place(format!("{}: {e}", self.lock.display())))
            }
        }
    }

    /// The leader's address, if one was written (maybe by a leader since gone).
    pub fn read(&self) -> Option<Address> {
        let text = std::fs::read_to_string(&self.address).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the leader's address, whole or not at all (a rename), readable by the user only.
    pub fn write(&self, address: &Address) -> Result<(), GroupError> {
        let fail =
            |e: std::io::Error| GroupError::Place(format!("{}: {e}", self.address.display()));
        let partial = self.address.with_extension("json.partial");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&partial)
            .map_err(fail)?;
        file.write_all(&serde_json::to_vec(address).expect("JSON"))
            .map_err(fail)?;
        std::fs::rename(&partial, &self.address).map_err(fail)
    }

    /// Removes the address: the group ended with its last process (a clean stop).
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.address);
    }
}

/// Whether `path` names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

/// The user's runtime directory for groups.
fn runtime_dir() -> Result<PathBuf, GroupError> {
    if let Some(dir) = std::env::var_os("TOA_RUNTIME_DIR") {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir).join("toa")),
        _ => Ok(std::env::temp_dir().join(format!("toa-{}", unsafe { libc::geteuid() }))),
    }
}

/// Creates `dir` (0700) if missing; refuses one another user owns or others may write to: its
/// files say where to send the token.
fn own_dir(dir: &Path) -> Result<(), GroupError> {
    let refuse = |what: String| GroupError::Place(format!("{}: {what}", dir.display()));
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(e.to_string())),
    }
    // Not followed: a link another user made in /tmp could point elsewhere later.
    let metadata = std::fs::symlink_metadata(dir).map_err(|e| refuse(e.to_string()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !metadata.is_dir() || metadata.uid() != me {
        return Err(refuse(format!(
            "expected a directory (not a link) of user {me}, found one of user {}",
            metadata.uid()
        )));
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "expected mode 0700 (the group's token is in it), found {:o}",
            metadata.permissions().mode() & 0o777
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("toa-place-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn one_leader_at_a_time_and_the_next_once_it_lets_go() {
        let dir = scratch("lead");
        let place = Place::in_dir(&dir, "shop /app/context.toa.yaml".into()).unwrap();
        let first = place.try_lead().unwrap().expect("free");
        assert!(place.try_lead().unwrap().is_none(), "held by the first");
        drop(first);
        assert!(place.try_lead().unwrap().is_some(), "free again");
        let written = Address {
            socket: dir.join("s.sock"),
            token: "t".into(),
            pid: 1,
        };
        place.write(&written).unwrap();
        assert_eq!(place.read().unwrap().socket, written.socket);
        let mode = std::fs::metadata(&place.address)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        place.clear();
        assert!(place.read().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_may_read_is_refused() {
        let dir = scratch("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let refused = Place::in_dir(&dir, "g".into()).unwrap_err().to_string();
        assert!(refused.contains("expected mode 0700"), "{refused}");
        // A link to a directory of the user's own is refused too: it could point elsewhere later.
        let private = scratch("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = scratch("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let refused = Place::in_dir(&link, "g".into()).unwrap_err().to_string();
        assert!(refused.contains("not a link"), "{refused}");
        for made in [&dir, &private, &link] {
            let _ = std::fs::remove_dir_all(made);
            let _ = std::fs::remove_file(made);
        }
    }
}
