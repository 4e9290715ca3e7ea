//! `tether login --server URL [--token T]` and `tether logout`.

use std::io::{self, BufRead as _, IsTerminal as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;

use super::errors::explain;
use super::login_config::{self, Login};
use super::CliError;
use crate::client::{normalize_server_url, Client};

pub async fn login(server: &str, token: Option<String>, ca_file: Option<PathBuf>) -> Result<(), CliError> {
    let server = normalize_server_url(server).map_err(|e| CliError::config(e.to_string()))?;
    let token = match token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
        Some(token) => token,
        None => prompt_token(&server)?,
    };
    let client = Client::new(&server, &token, ca_file.as_deref()).map_err(|e| explain(e, &server))?;
    // Any authenticated call proves the token; the host count is a useful hello.
    let hosts = client.hosts().await.map_err(|e| explain(e, &server))?;
    let path = login_config::save(&Login { server: server.clone(), token })?;
    let online = hosts.iter().filter(|h| h.is_online()).count();
    eprintln!("tether: logged in to {server} ({} host(s), {online} online); saved to {}", hosts.len(), path.display());
    Ok(())
}

pub fn logout() -> Result<(), CliError> {
    let path = login_config::path()?;
    if login_config::remove()? {
        eprintln!("tether: logged out; removed {}", path.display());
    } else {
        eprintln!("tether: not logged in (no {})", path.display());
    }
    Ok(())
}

/// Reads the token: without echo from a terminal, else one line of stdin.
fn prompt_token(server: &str) -> Result<String, CliError> {
    let stdin = io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprint!("API token for {server} (`tether token create` prints one): ");
        let _ = io::stderr().flush();
    }
    let line = {
        let _echo_off = interactive.then(|| EchoOff::new(stdin.as_raw_fd())).flatten();
        let mut line = String::new();
        stdin.lock().read_line(&mut line).map_err(|e| CliError::failed(format!("cannot read the token: {e}")))?;
        line
    };
    if interactive {
        eprintln!();
    }
    let token = line.trim().to_owned();
    if token.is_empty() {
        return Err(CliError::config("no token given: pass --token, set TETHER_TOKEN or type it when asked"));
    }
    Ok(token)
}

/// Turns terminal echo off for its lifetime, so a typed token is not shown.
struct EchoOff {
    fd: i32,
    saved: libc::termios,
}

impl EchoOff {
    fn new(fd: i32) -> Option<Self> {
        // SAFETY: tcgetattr/tcsetattr only read and write the termios struct
        // we own; `fd` is stdin, open for the whole process.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut saved) != 0 {
                return None;
            }
            let mut quiet = saved;
            quiet.c_lflag &= !libc::ECHO;
            quiet.c_lflag |= libc::ECHONL;
            if libc::tcsetattr(fd, libc::TCSANOW, &quiet) != 0 {
                return None;
            }
            Some(Self { fd, saved })
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `new` on the same fd.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved);
        }
    }
}
