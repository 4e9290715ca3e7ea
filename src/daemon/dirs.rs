//! The allowlist of directories terminals may start in (docs/PROTOCOL.md,
//! "DirsResult" and "Daemon state dir").
//!
//! Every path is kept canonical (symlinks resolved), so "inside an allowed
//! dir" is a plain component-wise prefix test and a symlink cannot lead a
//! terminal out of the allowlist. The list is never empty: a terminal without
//! a `dir` starts in the first entry, so removing the last one is refused.
//! Persistence lives in `state.rs`; this module is pure path logic.
//!
//! What the server may add is capped ([`MAX_DIRS`] dirs, each path at most
//! [`MAX_DIR_PATH_BYTES`]): the list is sent in every Hello, stored with
//! the host and checked on every Spawn, so a server cannot grow it without
//! bound.

use std::path::{Path, PathBuf};

/// The most dirs the list takes through the server's dirs add.
pub const MAX_DIRS: usize = 64;
/// The longest path the server may add, in bytes (Linux's `PATH_MAX`).
pub const MAX_DIR_PATH_BYTES: usize = 4096;

/// Why a dir operation or a spawn dir was refused; the text goes back to the
/// server in `DirsResult.error` / `SpawnError.message`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DirError {
    #[error("{0}: not an absolute path")]
    NotAbsolute(String),
    #[error("{path}: {reason}")]
    Unusable { path: String, reason: String },
    #[error("{0} is not inside an allowed dir")]
    NotAllowed(String),
    #[error("{0} is not an allowed dir")]
    NotListed(String),
    #[error("refusing to remove the last allowed dir")]
    LastDir,
    #[error("this host already allows {MAX_DIRS} dirs, its most; remove one first")]
    TooMany,
    #[error("a dir path of {0} bytes is longer than {MAX_DIR_PATH_BYTES}")]
    PathTooLong(usize),
    #[error("cannot find the home directory to allow by default")]
    NoHome,
    #[error(
        "this host's allowed dirs are locked (tether daemon --lock-dirs); \
         change them on the host with --allow-dir"
    )]
    Locked,
}

/// Canonical, non-empty list of allowed directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirAllowlist {
    dirs: Vec<PathBuf>,
}

impl DirAllowlist {
    /// A list from already-canonical paths (as persisted); `None` if empty.
    pub fn from_canonical(dirs: Vec<PathBuf>) -> Option<Self> {
        let dirs = without_duplicates(dirs);
        (!dirs.is_empty()).then_some(Self { dirs })
    }

    /// The first-start list: the `--allow-dir` flags (relative ones resolve
    /// against the working directory), or the user's home when there are none.
    pub fn seed(flags: &[PathBuf]) -> Result<Self, DirError> {
        let dirs = if flags.is_empty() {
            vec![canonical_dir(&home_dir().ok_or(DirError::NoHome)?)?]
        } else {
            flags.iter().map(|dir| canonical_dir(dir)).collect::<Result<_, _>>()?
        };
        Ok(Self { dirs: without_duplicates(dirs) })
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The list as sent in Hello and DirsResult.
    pub fn to_strings(&self) -> Vec<String> {
        self.dirs.iter().map(|dir| dir.to_string_lossy().into_owned()).collect()
    }

    /// Adds an existing directory; adding one already listed is a no-op.
    /// A path over [`MAX_DIR_PATH_BYTES`] (as given or resolved), or a new
    /// dir past [`MAX_DIRS`], is refused with the list unchanged.
    pub fn add(&mut self, path: &str) -> Result<(), DirError> {
        if path.len() > MAX_DIR_PATH_BYTES {
            return Err(DirError::PathTooLong(path.len()));
        }
        let dir = canonical_dir(absolute(path)?)?;
        if self.dirs.contains(&dir) {
            return Ok(());
        }
        let resolved_len = dir.as_os_str().len();
        if resolved_len > MAX_DIR_PATH_BYTES {
            return Err(DirError::PathTooLong(resolved_len));
        }
        if self.dirs.len() >= MAX_DIRS {
            return Err(DirError::TooMany);
        }
        self.dirs.push(dir);
        Ok(())
    }

    /// Removes a listed dir, named as listed or by any path that resolves to
    /// it. A dir that vanished from disk can still be removed by its listed name.
    pub fn remove(&mut self, path: &str) -> Result<(), DirError> {
        let given = absolute(path)?;
        let resolved = std::fs::canonicalize(given).ok();
        let position = self
            .dirs
            .iter()
            .position(|dir| dir == given || Some(dir) == resolved.as_ref())
            .ok_or_else(|| DirError::NotListed(path.to_owned()))?;
        if self.dirs.len() == 1 {
            return Err(DirError::LastDir);
        }
        self.dirs.remove(position);
        Ok(())
    }

    /// Where a Spawn may start: its `dir` resolved and checked against the
    /// list, or the first allowed dir when the Spawn names none.
    pub fn resolve_spawn_dir(&self, dir: &str) -> Result<PathBuf, DirError> {
        if dir.is_empty() {
            return Ok(self.dirs[0].clone());
        }
        let resolved = canonical_dir(absolute(dir)?)?;
        if self.dirs.iter().any(|allowed| resolved.starts_with(allowed)) {
            Ok(resolved)
        } else {
            Err(DirError::NotAllowed(dir.to_owned()))
        }
    }
}

fn without_duplicates(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut unique: Vec<PathBuf> = Vec::with_capacity(dirs.len());
    for dir in dirs {
        if !unique.contains(&dir) {
            unique.push(dir);
        }
    }
    unique
}

fn absolute(path: &str) -> Result<&Path, DirError> {
    let path_ref = Path::new(path);
    if path_ref.is_absolute() {
        Ok(path_ref)
    } else {
        Err(DirError::NotAbsolute(path.to_owned()))
    }
}

/// The canonical form of an existing directory.
fn canonical_dir(path: &Path) -> Result<PathBuf, DirError> {
    let unusable = |reason: String| DirError::Unusable { path: path.to_string_lossy().into_owned(), reason };
    let canonical = std::fs::canonicalize(path).map_err(|err| unusable(err.to_string()))?;
    if canonical.is_dir() {
        Ok(canonical)
    } else {
        Err(unusable("not a directory".to_owned()))
    }
}

/// The user's home: `$HOME`, else the password database.
pub fn home_dir() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        return Some(PathBuf::from(home));
    }
    home_from_passwd()
}

fn home_from_passwd() -> Option<PathBuf> {
    use std::ffi::CStr;
    use std::os::unix::ffi::OsStrExt;

    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data; getpwuid_r fills it with pointers into
    // `buf`, which outlives every use of them below.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe { libc::getpwuid_r(libc::getuid(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() || entry.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir is a NUL-terminated string inside `buf` (checked non-null).
    let dir = unsafe { CStr::from_ptr(entry.pw_dir) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree {
        _root: tempfile::TempDir,
        a: PathBuf,
        b: PathBuf,
        outside: PathBuf,
    }

    fn tree() -> Tree {
        let root = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let (a, b, outside) = (base.join("a"), base.join("b"), base.join("outside"));
        for dir in [&a, &b, &outside, &a.join("sub")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(base.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, a.join("escape")).unwrap();
        Tree { _root: root, a, b, outside }
    }

    fn s(path: &Path) -> String {
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn spawn_dirs_must_resolve_inside_the_list() {
        let t = tree();
        let list = DirAllowlist::seed(std::slice::from_ref(&t.a)).unwrap();
        assert_eq!(list.resolve_spawn_dir(""), Ok(t.a.clone()));
        assert_eq!(list.resolve_spawn_dir(&s(&t.a.join("sub"))), Ok(t.a.join("sub")));
        assert_eq!(list.resolve_spawn_dir(&s(&t.a.join("sub/.."))), Ok(t.a.clone()));
        assert!(matches!(list.resolve_spawn_dir(&s(&t.outside)), Err(DirError::NotAllowed(_))));
        // `..` and symlinks are resolved before the prefix test.
        assert!(matches!(list.resolve_spawn_dir(&s(&t.a.join("../outside"))), Err(DirError::NotAllowed(_))));
        assert!(matches!(list.resolve_spawn_dir(&s(&t.a.join("escape"))), Err(DirError::NotAllowed(_))));
        // A sibling sharing a name prefix is not inside (component-wise test).
        let sibling = t.a.with_file_name("a-sibling");
        std::fs::create_dir(&sibling).unwrap();
        assert!(matches!(list.resolve_spawn_dir(&s(&sibling)), Err(DirError::NotAllowed(_))));
        assert!(matches!(list.resolve_spawn_dir("relative"), Err(DirError::NotAbsolute(_))));
        assert!(matches!(list.resolve_spawn_dir(&s(&t.a.join("missing"))), Err(DirError::Unusable { .. })));
    }

    #[test]
    fn add_requires_an_existing_directory_and_is_idempotent() {
        let t = tree();
        let mut list = DirAllowlist::seed(std::slice::from_ref(&t.a)).unwrap();
        assert!(matches!(list.add("/definitely/not/here"), Err(DirError::Unusable { .. })));
        let file = t.a.parent().unwrap().join("file");
        assert!(matches!(list.add(&s(&file)), Err(DirError::Unusable { .. })));
        assert!(matches!(list.add("b"), Err(DirError::NotAbsolute(_))));
        list.add(&s(&t.b)).unwrap();
        list.add(&s(&t.b.join("."))).unwrap();
        assert_eq!(list.dirs(), [t.a.clone(), t.b.clone()]);
    }

    #[test]
    fn add_is_capped_in_dirs_and_path_length() {
        let t = tree();
        let mut list = DirAllowlist::seed(std::slice::from_ref(&t.a)).unwrap();
        let long = format!("/{}", "x/".repeat(MAX_DIR_PATH_BYTES / 2));
        assert_eq!(list.add(&long), Err(DirError::PathTooLong(long.len())));
        let base = t.a.parent().unwrap().join("many");
        for n in 1..MAX_DIRS {
            let dir = base.join(n.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            list.add(&s(&dir)).unwrap();
        }
        assert_eq!(list.dirs().len(), MAX_DIRS);
        let before = list.clone();
        assert_eq!(list.add(&s(&t.b)), Err(DirError::TooMany));
        assert_eq!(list, before, "a refused add changes nothing");
        list.add(&s(&t.a)).unwrap();
        assert_eq!(list, before, "adding a listed dir is still a no-op when full");
    }

    #[test]
    fn remove_refuses_unlisted_and_last_dirs() {
        let t = tree();
        let mut list = DirAllowlist::seed(&[t.a.clone(), t.b.clone()]).unwrap();
        assert_eq!(list.remove(&s(&t.outside)), Err(DirError::NotListed(s(&t.outside))));
        list.remove(&s(&t.a.join("sub/.."))).unwrap();
        assert_eq!(list.dirs(), std::slice::from_ref(&t.b));
        assert_eq!(list.remove(&s(&t.b)), Err(DirError::LastDir));
    }

    #[test]
    fn a_vanished_dir_can_still_be_removed_by_its_listed_name() {
        let t = tree();
        let mut list = DirAllowlist::seed(&[t.a.clone(), t.b.clone()]).unwrap();
        std::fs::remove_dir(&t.b).unwrap();
        list.remove(&s(&t.b)).unwrap();
        assert_eq!(list.dirs(), std::slice::from_ref(&t.a));
    }

    #[test]
    fn duplicates_collapse_and_empty_lists_are_refused() {
        let t = tree();
        let list = DirAllowlist::seed(&[t.a.clone(), t.a.join("sub/..")]).unwrap();
        assert_eq!(list.dirs(), std::slice::from_ref(&t.a));
        assert_eq!(DirAllowlist::from_canonical(Vec::new()), None);
    }
}
