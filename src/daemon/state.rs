//! The daemon's state directory and the files in it.
//!
//! - `host.json`: `{"hostId": "<uuid>"}`, written after registration.
//! - `dirs.json`: `{"dirs": ["/canonical/path", ...]}`, the allowlist. Rule:
//!   once this file exists it is authoritative; `--allow-dir` flags (or the
//!   home directory when there are none) only seed it on the first start,
//!   so dirs added or removed through the API survive restarts. Flags given
//!   later that are not in the file are logged, not applied.
//! - `cell.json`: `{"url": "https://..."}`, the cell a director last sent
//!   this daemon to and that it reached: where it dials when the director
//!   cannot be asked (docs/CELLS.md, "What a daemon does").
//! - `credentials.json`: written by the user or their tooling, read on
//!   request and never logged.
//!
//! The directory is 0700 and the files the daemon writes are 0600
//! (docs/SECURITY.md, "Files"): they name the host and its allowlist. A
//! `credentials.json` others can read is used, with a warning in the log.
//!
//! The files are tiny and touched rarely (start, registration, a dir
//! change), so they are read and written synchronously.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::dirs::{DirAllowlist, DirError};

const HOST_FILE: &str = "host.json";
const DIRS_FILE: &str = "dirs.json";
const CREDENTIALS_FILE: &str = "credentials.json";
const CELL_FILE: &str = "cell.json";

/// Credentials travel in one frame; anything near the 1 MiB frame limit is
/// not a credentials file.
const MAX_CREDENTIALS_BYTES: u64 = 512 * 1024;

/// A state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("state file {}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("allowed dirs: {0}")]
    Dirs(#[from] DirError),
}

/// Why a Credentials request could not be answered (sent to the server as
/// the error text, so it never includes file contents).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("no credentials file")]
    Missing,
    #[error("credentials file cannot be read: {0}")]
    Unreadable(io::ErrorKind),
    #[error("credentials file is larger than {MAX_CREDENTIALS_BYTES} bytes")]
    TooLarge,
    #[error("credentials file is not a JSON object")]
    NotAnObject,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostFile {
    host_id: String,
}

#[derive(Serialize, Deserialize)]
struct CellFile {
    url: String,
}

#[derive(Serialize, Deserialize)]
struct DirsFile {
    dirs: Vec<PathBuf>,
}

/// The state directory (`--state-dir`).
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Creates the directory (private to the user) if needed, and makes an
    /// existing one private.
    pub fn open(root: PathBuf) -> Result<Self, StateError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let io_error = |source| StateError::Io { path: root.clone(), source };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&root).map_err(io_error)?;
        let mode = std::fs::metadata(&root).map_err(io_error)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).map_err(io_error)?;
        }
        Ok(Self { root })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The registered host id, if any. A corrupt file counts as absent (the
    /// daemon registers again and the server upserts by hostname).
    pub fn host_id(&self) -> Option<String> {
        let path = self.root.join(HOST_FILE);
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<HostFile>(&text) {
            Ok(file) if !file.host_id.is_empty() => Some(file.host_id),
            Ok(_) | Err(_) => {
                tracing::warn!(path = %path.display(), "tether_daemon_host_file_ignored");
                None
            }
        }
    }

    pub fn save_host_id(&self, host_id: &str) -> Result<(), StateError> {
        let file = HostFile { host_id: host_id.to_owned() };
        self.write_json(HOST_FILE, &file)
    }

    pub fn forget_host_id(&self) -> Result<(), StateError> {
        self.remove(HOST_FILE)
    }

    /// The URL of the cell this daemon last reached, if any (a corrupt file
    /// counts as absent).
    pub fn last_cell(&self) -> Option<String> {
        let text = std::fs::read(self.root.join(CELL_FILE)).ok()?;
        serde_json::from_slice::<CellFile>(&text).ok().map(|file| file.url).filter(|url| !url.is_empty())
    }

    pub fn save_last_cell(&self, url: &str) -> Result<(), StateError> {
        self.write_json(CELL_FILE, &CellFile { url: url.to_owned() })
    }

    pub fn forget_last_cell(&self) -> Result<(), StateError> {
        self.remove(CELL_FILE)
    }

    fn remove(&self, name: &str) -> Result<(), StateError> {
        let path = self.root.join(name);
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(StateError::Io { path, source: err }),
            _ => Ok(()),
        }
    }

    /// The persisted allowlist, or (first start) one seeded from the flags
    /// and saved. See the module doc for the rule.
    pub fn load_dirs(&self, flags: &[PathBuf]) -> Result<DirAllowlist, StateError> {
        let path = self.root.join(DIRS_FILE);
        match std::fs::read(&path) {
            Ok(text) => {
                let corrupt = |reason: String| StateError::Corrupt { path: path.clone(), reason };
                let file: DirsFile = serde_json::from_slice(&text).map_err(|err| corrupt(err.to_string()))?;
                let list =
                    DirAllowlist::from_canonical(file.dirs).ok_or_else(|| corrupt("no dirs listed".to_owned()))?;
                let ignored: Vec<_> = flags
                    .iter()
                    .filter(|flag| std::fs::canonicalize(flag).map_or(true, |dir| !list.dirs().contains(&dir)))
                    .collect();
                if !ignored.is_empty() {
                    tracing::warn!(
                        file = %path.display(),
                        ignored = ?ignored,
                        "tether_daemon_allow_dir_flags_ignored"
                    );
                }
                Ok(list)
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let list = DirAllowlist::seed(flags)?;
                self.save_dirs(&list)?;
                Ok(list)
            }
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// `--lock-dirs`: the allowlist is the flags (or the home) whatever
    /// `dirs.json` says, and is saved so the file tells the truth.
    pub fn lock_dirs(&self, flags: &[PathBuf]) -> Result<DirAllowlist, StateError> {
        let list = DirAllowlist::seed(flags)?;
        self.save_dirs(&list)?;
        Ok(list)
    }

    pub fn save_dirs(&self, list: &DirAllowlist) -> Result<(), StateError> {
        self.write_json(DIRS_FILE, &DirsFile { dirs: list.dirs().to_vec() })
    }

    /// The raw contents of `credentials.json`, checked to be a JSON object.
    pub fn credentials(&self) -> Result<Bytes, CredentialsError> {
        let path = self.root.join(CREDENTIALS_FILE);
        let unreadable = |err: io::Error| match err.kind() {
            io::ErrorKind::NotFound => CredentialsError::Missing,
            kind => CredentialsError::Unreadable(kind),
        };
        let metadata = std::fs::metadata(&path).map_err(unreadable)?;
        if std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "tether_daemon_credentials_file_not_private");
        }
        let size = metadata.len();
        if size > MAX_CREDENTIALS_BYTES {
            return Err(CredentialsError::TooLarge);
        }
        let text = std::fs::read(&path).map_err(unreadable)?;
        match serde_json::from_slice::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(_)) => Ok(Bytes::from(text)),
            _ => Err(CredentialsError::NotAnObject),
        }
    }

    /// Write-then-rename, so a crash never leaves a half-written file.
    fn write_json(&self, name: &str, value: &impl Serialize) -> Result<(), StateError> {
        let path = self.root.join(name);
        let temp = self.root.join(format!(".{name}.tmp"));
        let io_error = |source| StateError::Io { path: path.clone(), source };
        let text = serde_json::to_vec_pretty(value).map_err(|err| io_error(err.into()))?;
        write_private(&temp, &text).map_err(io_error)?;
        std::fs::rename(&temp, &path).map_err(io_error)
    }
}

/// Writes `text` to a file only its owner can read (0600, also when the
/// file was left behind with a wider mode).
fn write_private(path: &Path, text: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text)
}

/// `$XDG_STATE_HOME/tether`, else `~/.local/state/tether`, else
/// `./.tether-state` when there is no home directory at all.
pub fn default_state_dir() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(xdg).join("tether");
    }
    match super::dirs::home_dir() {
        Some(home) => home.join(".local/state/tether"),
        None => PathBuf::from(".tether-state"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> (tempfile::TempDir, StateDir) {
        let root = tempfile::tempdir().unwrap();
        let state = StateDir::open(root.path().join("nested/state")).unwrap();
        (root, state)
    }

    #[test]
    fn host_id_round_trips_and_can_be_forgotten() {
        let (_root, state) = state();
        assert_eq!(state.host_id(), None);
        state.save_host_id("0b5e2c1a-1111-2222-3333-444455556666").unwrap();
        assert_eq!(state.host_id().as_deref(), Some("0b5e2c1a-1111-2222-3333-444455556666"));
        state.forget_host_id().unwrap();
        assert_eq!(state.host_id(), None);
        state.forget_host_id().unwrap();
    }

    #[test]
    fn the_last_cell_round_trips_and_can_be_forgotten() {
        let (_dir, state) = state();
        assert_eq!(state.last_cell(), None);
        state.save_last_cell("https://cell-a.example:8443").unwrap();
        assert_eq!(state.last_cell().as_deref(), Some("https://cell-a.example:8443"));
        state.forget_last_cell().unwrap();
        assert_eq!(state.last_cell(), None);
        state.forget_last_cell().unwrap();
    }

    #[test]
    fn dirs_are_seeded_once_then_the_file_wins() {
        let (root, state) = state();
        let first = std::fs::canonicalize(root.path()).unwrap().join("first");
        let second = first.with_file_name("second");
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();

        let seeded = state.load_dirs(std::slice::from_ref(&first)).unwrap();
        assert_eq!(seeded.dirs(), std::slice::from_ref(&first));
        // Later flags do not change the persisted list.
        let again = state.load_dirs(std::slice::from_ref(&second)).unwrap();
        assert_eq!(again.dirs(), std::slice::from_ref(&first));
        // Changes saved through the API survive.
        let mut changed = again;
        changed.add(&second.to_string_lossy()).unwrap();
        state.save_dirs(&changed).unwrap();
        assert_eq!(state.load_dirs(&[]).unwrap().dirs(), [first, second]);
    }

    #[test]
    fn a_seed_flag_that_does_not_exist_is_an_error() {
        let (root, state) = state();
        let missing = root.path().join("missing");
        assert!(matches!(state.load_dirs(&[missing]), Err(StateError::Dirs(_))));
    }

    #[test]
    fn credentials_must_be_a_json_object() {
        let (_root, state) = state();
        assert_eq!(state.credentials(), Err(CredentialsError::Missing));
        let path = state.path().join(CREDENTIALS_FILE);
        std::fs::write(&path, b"[1, 2]").unwrap();
        assert_eq!(state.credentials(), Err(CredentialsError::NotAnObject));
        std::fs::write(&path, b"not json").unwrap();
        assert_eq!(state.credentials(), Err(CredentialsError::NotAnObject));
        std::fs::write(&path, br#"{"aws": {"key": "k"}}"#).unwrap();
        assert_eq!(state.credentials().as_deref(), Ok(&br#"{"aws": {"key": "k"}}"#[..]));
    }
}
