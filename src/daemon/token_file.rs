//! `tether daemon --token-file PATH` (docs/CLI.md, "tether daemon"): the
//! daemon's token read from a file only its user can read, so it appears
//! neither on the command line (which every local user can list) nor in
//! the environment of child processes. A file that group or others may read
//! or write is refused with a message saying how to fix it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("token file {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "token file {} has mode {mode:04o}: group and others may access it; run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("token file {} holds no token", path.display())]
    Empty { path: PathBuf },
}

/// Reads the token from `path`: mode 0600 (or stricter), one line.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    let io = |source| TokenFileError::Io { path: path.to_path_buf(), source };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenFileError::TooOpen { path: path.to_path_buf(), mode });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenFileError::Empty { path: path.to_path_buf() });
    }
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(mode: u32, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        (dir, path)
    }

    #[test]
    fn a_private_file_gives_its_token() {
        let (_dir, path) = file_with(0o600, "tth_abc\n");
        assert_eq!(read_token_file(&path).expect("token"), "tth_abc");
        let (_dir, path) = file_with(0o400, "tth_abc");
        assert_eq!(read_token_file(&path).expect("token"), "tth_abc");
    }

    #[test]
    fn a_file_others_can_read_is_refused() {
        for mode in [0o640, 0o604, 0o644, 0o660] {
            let (_dir, path) = file_with(mode, "tth_abc");
            let err = read_token_file(&path).unwrap_err();
            assert!(matches!(err, TokenFileError::TooOpen { .. }), "{mode:o}: {err}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        let (_dir, path) = file_with(0o600, " \n");
        assert!(matches!(read_token_file(&path), Err(TokenFileError::Empty { .. })));
        assert!(matches!(read_token_file(Path::new("/nonexistent/token")), Err(TokenFileError::Io { .. })));
    }
}
