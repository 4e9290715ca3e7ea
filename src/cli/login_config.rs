//! What `tether login` stores: the server's URL and a token, in
//! `$XDG_CONFIG_HOME/tether/login.json` (default `~/.config`), the file
//! 0600 and its directory 0700, written whole or not at all.
//!
//! [`effective`] applies the precedence: flags, then environment (clap
//! hands both over as one value), then this file. A stored token is only
//! used with the stored server, so `--server elsewhere` never sends it to a
//! server it was not issued by.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::CliError;
use crate::client::normalize_server_url;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Login {
    pub server: String,
    pub token: String,
}

/// The file's path, from `XDG_CONFIG_HOME` or `HOME`.
pub fn path() -> Result<PathBuf, CliError> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => return Err(CliError::config("neither XDG_CONFIG_HOME nor HOME is set: nowhere to keep the login")),
        },
    };
    Ok(base.join("tether").join("login.json"))
}

/// The stored login, if any.
pub fn load() -> Result<Option<Login>, CliError> {
    let path = path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CliError::config(format!("cannot read {}: {e}", path.display()))),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        CliError::config(format!("{} is not a login file ({e}); run `tether login` again", path.display()))
    })
}

/// Stores `login`, replacing what was there; returns where.
pub fn save(login: &Login) -> Result<PathBuf, CliError> {
    let path = path()?;
    let dir = path.parent().ok_or_else(|| CliError::config("no directory for the login file"))?;
    let fail = |what: &str, e: std::io::Error| CliError::failed(format!("cannot {what} {}: {e}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| fail("create", e))?;
    // Written next to the target and renamed over it, so a crash leaves the
    // old login or the new one, never half of either; created 0600 so the
    // token is never readable by others, not even for a moment.
    let partial = dir.join(format!(".login.json.{}", std::process::id()));
    let text = serde_json::to_string_pretty(login).unwrap_or_default();
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| {
            // A stale file of the same name may predate us with other bits.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            file.write_all(text.as_bytes())?;
            file.write_all(b"\n")?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(fail("write the login file in", e));
    }
    Ok(path)
}

/// Forgets the login; whether there was one.
pub fn remove() -> Result<bool, CliError> {
    let path = path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(CliError::failed(format!("cannot remove {}: {e}", path.display()))),
    }
}

/// The server and token a command uses, given the flag-or-environment values.
pub fn effective(server: Option<&str>, token: Option<&str>) -> Result<(String, String), CliError> {
    let stored = load()?;
    pick(server, token, stored.as_ref())
}

fn pick(server: Option<&str>, token: Option<&str>, stored: Option<&Login>) -> Result<(String, String), CliError> {
    let given = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
    let server = match given(server) {
        Some(server) => server,
        None => match stored {
            Some(login) => login.server.clone(),
            None => {
                return Err(CliError::config(
                    "no server: run `tether login --server URL`, or pass --server URL or set TETHER_SERVER",
                ))
            }
        },
    };
    let same_server = |login: &Login| normalize_server_url(&login.server).ok() == normalize_server_url(&server).ok();
    let token = match given(token) {
        Some(token) => token,
        None => match stored.filter(|login| same_server(login)) {
            Some(login) => login.token.clone(),
            None => {
                return Err(CliError::config(format!(
                    "no token for {server}: run `tether login --server {server}`, or pass --token or set TETHER_TOKEN"
                )))
            }
        },
    };
    Ok((server, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_environment_beat_the_stored_login() {
        let stored = Login { server: "http://stored:1".into(), token: "tth_stored".into() };
        assert_eq!(pick(None, None, Some(&stored)).unwrap(), ("http://stored:1".into(), "tth_stored".into()));
        assert_eq!(pick(None, Some("tth_flag"), Some(&stored)).unwrap().1, "tth_flag");
        assert_eq!(pick(Some("http://stored:1/"), None, Some(&stored)).unwrap().1, "tth_stored");
        // The stored token never goes to another server.
        let err = pick(Some("http://other:1"), None, Some(&stored)).unwrap_err();
        assert_eq!(err.status, 2);
        assert!(err.message.unwrap().contains("no token for http://other:1"));
        assert_eq!(pick(None, None, None).unwrap_err().status, 2);
        assert_eq!(pick(Some(""), Some("t"), None).unwrap_err().status, 2);
    }
}
