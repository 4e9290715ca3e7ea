//! Child processes of the harness: how they are started, tied to the test
//! process, waited on and cleaned up.
//!
//! Every server the harness starts must die with the test process, even when
//! that process panics or is SIGKILLed. Linux gives us that with
//! `PR_SET_PDEATHSIG`, with two traps:
//!
//! - the signal fires when the *thread* that forked the child exits, not the
//!   process. Test threads come and go, so every child is forked by one
//!   dedicated spawner thread that lives until the process ends;
//! - changing the uid or gid clears the setting, so when a child drops to the
//!   `postgres` user the `prctl` call comes *after* `setuid`.
//!
//! On a normal exit (tests passed or failed) an `atexit` hook stops the
//! servers gracefully and removes their scratch directories. After a SIGKILL
//! the kernel kills the servers; the scratch directories are swept by the
//! next test process that starts a server (they carry the owner's pid).

use std::{
    ffi::CString,
    fs,
    io::{self, Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    sync::{mpsc, Mutex, Once, OnceLock},
    thread,
    time::{Duration, Instant},
};

/// A user a child runs as (PostgreSQL refuses to run as root).
#[derive(Clone, Copy, Debug)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// The one thread that forks every child, so the parent-death signal fires
/// only when the whole test process goes away.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("test-server-spawner".into())
            // The sender lives in a static and is never dropped, so this loop
            // (and the thread) lasts until the process exits.
            .spawn(move || {
                for mut request in incoming {
                    let _ = request.reply.send(request.command.spawn());
                }
            })
            .expect("start the harness's process-spawner thread");
        requests
    })
}

/// Spawns `command` from the spawner thread, optionally as another user,
/// with SIGKILL as its parent-death signal.
pub fn spawn_tied(mut command: Command, run_as: Option<RunAs>) -> io::Result<Child> {
    let test_process = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            if let Some(user) = run_as {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(user.gid) != 0
                    || libc::setuid(user.uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After setuid: a credential change resets the parent-death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The test process may have died before prctl took effect.
            if libc::getppid() != test_process {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (reply, response) = mpsc::channel();
    spawner().send(SpawnRequest { command, reply }).expect("the harness's spawner thread is gone");
    response.recv().expect("the harness's spawner thread dropped a request")
}

/// What the exit hook stops and removes.
#[derive(Default)]
struct Registry {
    servers: Vec<(Child, libc::c_int)>,
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { servers: Vec::new(), dirs: Vec::new() });

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn install_exit_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registering a plain extern "C" function.
        if unsafe { libc::atexit(stop_servers_at_exit) } != 0 {
            eprintln!(
                "tests/support: atexit failed; servers still die by PR_SET_PDEATHSIG, scratch dirs are swept later"
            );
        }
    });
}

/// Stops `child` at process exit: first `stop_signal`, then SIGKILL.
pub fn stop_at_exit(child: Child, stop_signal: libc::c_int) {
    install_exit_hook();
    registry().servers.push((child, stop_signal));
}

/// Removes `dir` at process exit (after the servers stopped).
pub fn remove_at_exit(dir: PathBuf) {
    install_exit_hook();
    registry().dirs.push(dir);
}

extern "C" fn stop_servers_at_exit() {
    // Never block or panic here: another thread may hold the lock while the
    // process exits, and unwinding out of an extern "C" fn aborts.
    let mut registry = match REGISTRY.try_lock() {
        Ok(guard) => guard,
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for (child, signal) in registry.servers.iter_mut() {
        // SAFETY: plain kill(2) on a pid we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, *signal) };
    }
    for (child, _) in registry.servers.iter_mut() {
        if wait_timeout(child, Duration::from_secs(5)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    for dir in registry.dirs.drain(..) {
        let _ = fs::remove_dir_all(dir);
    }
}

const SCRATCH_PREFIX: &str = "tether-test-";

/// Creates a fresh directory for a server's data and logs, mode 0755 and
/// owned by `owner` if given; removed at process exit.
///
/// The name carries our pid so that directories left by a SIGKILLed test
/// process can be recognised and swept.
pub fn scratch_dir(kind: &str, owner: Option<RunAs>) -> PathBuf {
    sweep_orphaned_scratch_dirs();
    // Under /tmp rather than $TMPDIR: a server running as `postgres` must be
    // able to traverse every parent directory.
    let dir = PathBuf::from("/tmp").join(format!(
        "{SCRATCH_PREFIX}{}-{kind}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    fs::create_dir(&dir).unwrap_or_else(|e| panic!("create scratch dir {}: {e}", dir.display()));
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod 0755 {}: {e}", dir.display()));
    if let Some(user) = owner {
        std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))
            .unwrap_or_else(|e| panic!("chown {} to uid {}: {e}", dir.display(), user.uid));
    }
    remove_at_exit(dir.clone());
    dir
}

/// Removes scratch directories whose owning test process no longer exists.
fn sweep_orphaned_scratch_dirs() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        let Ok(entries) = fs::read_dir("/tmp") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(SCRATCH_PREFIX)) else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    });
}

/// The `postgres` user when we run as root, since PostgreSQL refuses root.
pub fn postgres_user_if_root() -> Option<RunAs> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    match lookup_user("postgres") {
        Some(user) => Some(user),
        None => panic!(
            "running as root, PostgreSQL refuses to run as root, and there is no `postgres` user: \
             install the Debian package `postgresql` (it creates the user) or run \
             `useradd --system --user-group postgres`"
        ),
    }
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let name = CString::new(name).expect("user name without NUL");
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwnam_r writes into `entry` and `buffer`, both sized as told.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(name.as_ptr(), &mut entry, buffer.as_mut_ptr(), buffer.len(), &mut found);
        (rc == 0 && !found.is_null()).then_some(RunAs { uid: entry.pw_uid, gid: entry.pw_gid })
    }
}

/// `name` in PATH, if there.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

pub fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` from PATH, or a panic naming the Debian package that provides it.
pub fn require_binary(name: &str, debian_package: &str) -> PathBuf {
    find_in_path(name).unwrap_or_else(|| {
        panic!(
            "`{name}` not found in PATH: install the Debian package `{debian_package}` \
             (apt-get install -y {debian_package}); scripts/test installs it when run as root"
        )
    })
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind 127.0.0.1:0 to find a free port")
        .port()
}

/// A free port for a Redis Cluster node: its cluster bus (port + 10000) must
/// be free as well, so the port must be at most 55535.
pub fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
    panic!("found no free port p <= 55535 with p + 10000 also free on 127.0.0.1");
}

/// Waits up to `timeout` for `child` to exit.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// Why a server did not come up.
pub enum StartError {
    /// Someone else took the port between our probe and the server's bind.
    PortTaken(String),
    Failed(String),
}

/// Polls `ready` every 25 ms until it returns true, `child` exits or
/// `timeout` passes; on failure the error carries the server's log.
pub fn wait_until_ready(
    what: &str,
    child: &mut Child,
    log: &Path,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), StartError> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let output = read_log(log);
            let message = format!("{what} exited with {status} before it was ready; its log:\n{output}");
            return Err(if output.contains("Address already in use") {
                StartError::PortTaken(message)
            } else {
                StartError::Failed(message)
            });
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(StartError::Failed(format!(
                "{what} was not ready after {timeout:?}; its log:\n{}",
                read_log(log)
            )));
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// A log file's contents, lossily decoded, or a note saying why not.
pub fn read_log(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("<could not read {}: {e}>", path.display()),
    }
}

/// Opens (creating) a log file for a child's stdout and stderr.
pub fn log_file(path: &Path) -> (fs::File, fs::File) {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open log file {}: {e}", path.display()));
    let second = file.try_clone().unwrap_or_else(|e| panic!("clone log file handle {}: {e}", path.display()));
    (file, second)
}

/// Sends one command to a Redis server in RESP and returns the reply as text
/// (simple string, error or bulk string), with short timeouts. Enough for
/// readiness checks without a client library or a runtime.
pub fn redis_command(port: u16, args: &[&str]) -> io::Result<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(250))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;

    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "redis closed the connection"));
        }
        reply.extend_from_slice(&chunk[..n]);
        if let Some(text) = complete_resp_reply(&reply) {
            return Ok(text);
        }
    }
}

/// The text of a complete `+`, `-`, `:` or `$` reply, or None if more bytes are needed.
fn complete_resp_reply(reply: &[u8]) -> Option<String> {
    let line_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&reply[1..line_end]).into_owned();
    match reply[0] {
        b'$' => {
            let len: i64 = line.parse().ok()?;
            if len < 0 {
                return Some(String::new());
            }
            let body = &reply[line_end + 2..];
            (body.len() >= len as usize + 2).then(|| String::from_utf8_lossy(&body[..len as usize]).into_owned())
        }
        b'-' => Some(format!("-{line}")),
        _ => Some(line),
    }
}

/// Environment that sets a child's wall clock `seconds` ahead of the real
/// one, through libfaketime (LD_PRELOAD): `SystemTime`, `chrono::Utc::now`
/// and the HTTP `Date` header move, the monotonic clock (tokio's timers) does
/// not. Panics naming the Debian package when the library is missing.
pub fn clock_ahead_env(seconds: u32) -> Vec<(String, String)> {
    let library = fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime.so.1 not found under /usr/lib/*/faketime: install the Debian package \
                 `libfaketime` (apt-get install -y libfaketime); scripts/test installs it when run as root"
            )
        });
    vec![
        ("LD_PRELOAD".into(), library.display().to_string()),
        ("FAKETIME".into(), format!("+{seconds}s")),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}
