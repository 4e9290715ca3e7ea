//! Starting a process on a fresh PTY, and what serves it.
//!
//! The master is read and written without blocking, by two tasks on the
//! daemon's runtime (a non-blocking descriptor registered with its
//! reactor), so an output chunk or a keystroke reaches the terminal task
//! without waking another thread (docs/ARCHITECTURE.md, "The output path"):
//! - reader: reads from the master into a bounded channel. When the channel
//!   is full the task waits, the PTY stops being drained, and the child
//!   blocks on its next write: that is the backpressure path.
//! - writer: drains a channel of input into the master, bounded in bytes.
//!
//! `wait4` blocks, so one small thread per terminal (the waiter) reaps the
//! child, which yields both the exit status (with the signal number, which
//! portable-pty only reports as a name) and the child's rusage for the
//! Usage frame.
//!
//! A reader can outlive its terminal only while some background process
//! still holds the PTY open; it ends when that process closes it.

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot};

use super::screen::GridSize;

/// Bytes per PTY read; also the largest Output chunk a single read yields.
pub const READ_CHUNK: usize = 16 * 1024;
/// Reads in flight between the reader task and the terminal task.
const OUTPUT_CHANNEL_CHUNKS: usize = 4;
/// Input bytes queued for the writer task while the program does not
/// read; beyond this input is refused. Counted in bytes, not frames: a
/// browser or a fast typist sends one frame per keystroke, and a busy
/// shell must not lose a burst of them.
const INPUT_QUEUE_BYTES: usize = 1024 * 1024;
const THREAD_STACK_BYTES: usize = 128 * 1024;

/// Why a Spawn failed; the text goes back in SpawnError.message.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("cannot open a pty: {0}")]
    Open(String),
    #[error("cannot start {program}: {reason}")]
    Spawn { program: String, reason: String },
    #[error("cannot start the pty waiter thread: {0}")]
    Waiter(io::Error),
    #[error("cannot watch the pty: {0}")]
    Watch(io::Error),
}

/// How a child ended, with what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_ms: u64,
    pub max_rss_kb: u64,
    pub ended_at: Instant,
}

/// A running child on a PTY and the channels to its reader and writer.
pub struct PtyProcess {
    pub pid: u32,
    /// Kept for resizing; dropping it closes the daemon's main handle.
    pub master: Box<dyn MasterPty + Send>,
    /// Output chunks in order; closes at EOF (every slave fd closed).
    pub output: mpsc::Receiver<Bytes>,
    /// Input for the writer task.
    pub input: InputQueue,
    /// Fires once when the child has been reaped.
    pub exit: oneshot::Receiver<ChildExit>,
    pub started_at: Instant,
}

/// Starts `argv` (empty: the user's login shell) in `dir` on a PTY of `size`.
/// Must be called on a Tokio runtime with I/O enabled (the reader and
/// writer are tasks on it).
pub fn spawn(dir: &Path, argv: &[String], size: GridSize) -> Result<PtyProcess, PtyError> {
    let pair =
        portable_pty::native_pty_system().openpty(pty_size(size)).map_err(|err| PtyError::Open(format!("{err:#}")))?;

    let mut command = if argv.is_empty() {
        // $SHELL, else the passwd entry, else /bin/sh; started as a login
        // shell (argv[0] prefixed with '-').
        CommandBuilder::new_default_prog()
    } else {
        CommandBuilder::from_argv(argv.iter().map(Into::into).collect())
    };
    command.cwd(dir);
    command.env("TERM", "xterm-256color");
    // The daemon's own configuration (token, cluster secrets when run inside
    // `serve --demo`) must not leak into user shells.
    let own_settings: Vec<String> = command
        .iter_full_env_as_str()
        .filter(|(key, _)| key.starts_with("TETHER_"))
        .map(|(key, _)| key.to_owned())
        .collect();
    for key in own_settings {
        command.env_remove(key);
    }

    let program = argv.first().cloned().unwrap_or_else(|| command.get_shell());
    let started_at = Instant::now();
    let child = pair
        .slave
        .spawn_command(command)
        .map_err(|err| PtyError::Spawn { program: program.clone(), reason: format!("{err:#}") })?;
    // The reader only sees EOF once every slave fd is closed, ours included.
    drop(pair.slave);
    let pid = child
        .process_id()
        .ok_or_else(|| PtyError::Spawn { program, reason: "the child has no process id".to_owned() })?;
    // Reaping is the waiter thread's job (wait4, for the rusage); dropping
    // the handle neither waits nor kills.
    drop(child);

    let master = pair.master;
    // The waiter starts first: if a later step fails, the child is killed
    // and this thread still reaps it.
    let (exit_tx, exit) = oneshot::channel();
    if let Err(err) = start_thread(format!("tether-wait-{pid}"), move || {
        let _ = exit_tx.send(wait_for_exit(pid));
    }) {
        kill_and_reap(pid);
        return Err(PtyError::Waiter(err));
    }
    let pty = match watch_master(master.as_ref()) {
        Ok(pty) => Arc::new(pty),
        Err(err) => {
            let _ = send_signal(pid, libc::SIGKILL);
            return Err(PtyError::Watch(err));
        }
    };
    let (output_tx, output) = mpsc::channel(OUTPUT_CHANNEL_CHUNKS);
    let (tx, input_rx) = mpsc::unbounded_channel();
    let input = InputQueue { tx, queued: Arc::new(AtomicUsize::new(0)) };
    tokio::spawn(read_loop(pty.clone(), output_tx));
    tokio::spawn(write_loop(pty, input_rx, input.queued.clone()));
    Ok(PtyProcess { pid, master, output, input, exit, started_at })
}

/// Resizes the PTY; the kernel sends SIGWINCH to the foreground group.
pub fn resize(master: &dyn MasterPty, size: GridSize) -> Result<(), String> {
    master.resize(pty_size(size)).map_err(|err| format!("{err:#}"))
}

/// Sends `signal` (0 = SIGTERM) to the child's process group, or to the
/// child alone when the group is gone. The child is a session leader
/// (portable-pty calls setsid), so its group id is its pid and the group
/// holds whatever it started without job control.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|pid| *pid > 1)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let signal = if signal == 0 { libc::SIGTERM } else { signal };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(-pid, signal) } == 0 {
        return Ok(());
    }
    let group_error = io::Error::last_os_error();
    if group_error.raw_os_error() != Some(libc::ESRCH) {
        return Err(group_error);
    }
    // SAFETY: as above.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn pty_size(size: GridSize) -> PtySize {
    PtySize { rows: size.rows(), cols: size.cols(), pixel_width: 0, pixel_height: 0 }
}

fn start_thread(name: String, body: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(name).stack_size(THREAD_STACK_BYTES).spawn(body).map(drop)
}

/// A descriptor of its own on the PTY master for the reader and writer
/// (the reader may outlive the daemon's handle, see the module docs),
/// non-blocking and registered with the runtime's reactor. The flag is on
/// the open file the master's handle shares; the daemon only resizes and
/// queries through that handle, which does not mind it.
fn watch_master(master: &dyn MasterPty) -> io::Result<AsyncFd<std::fs::File>> {
    let fd = master.as_raw_fd().ok_or_else(|| io::Error::other("the pty master has no fd"))?;
    // SAFETY: `fd` is the master's open descriptor for the whole call;
    // dup(2) returns a new one that the OwnedFd then owns.
    let dup = unsafe { libc::dup(fd) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh descriptor nobody else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(dup) });
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(dup, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(dup, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the File owns the descriptor and keeps it open, and its
    // `as_raw_fd` returns that one, for as long as the AsyncFd holds it.
    unsafe { AsyncFd::register_with_interest(file, Interest::READABLE | Interest::WRITABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Reads the PTY until it hangs up. Reads that are already waiting behind
/// one (the n_tty buffer hands out at most 4 KiB at a time) join it, up to
/// `READ_CHUNK`, so a busy program costs the terminal task fewer wake-ups;
/// a read that finds nothing more waiting is sent at once, so an echo is
/// never held back.
async fn read_loop(pty: Arc<AsyncFd<std::fs::File>>, output: mpsc::Sender<Bytes>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let mut filled = 0;
        let open = loop {
            let Ok(mut ready) = pty.readable().await else { break false };
            match ready.try_io(|fd| fd.get_ref().read(&mut buf[filled..])) {
                // Linux reports a hung-up PTY master (all slave fds closed) as EIO.
                Ok(Ok(0)) => break false,
                Ok(Ok(n)) => {
                    filled += n;
                    if filled == buf.len() {
                        break true;
                    }
                }
                Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(_)) => break false,
                // Nothing more waiting: what was read goes now.
                Err(_would_block) if filled > 0 => break true,
                Err(_would_block) => {}
            }
        };
        if filled > 0 && output.send(Bytes::copy_from_slice(&buf[..filled])).await.is_err() {
            return;
        }
        if !open {
            return;
        }
    }
}

/// The input bytes on their way to a PTY, bounded by bytes queued.
pub struct InputQueue {
    tx: mpsc::UnboundedSender<Bytes>,
    queued: Arc<AtomicUsize>,
}

impl InputQueue {
    /// Queues `data` for the PTY; gives it back when `INPUT_QUEUE_BYTES`
    /// are already waiting (the program is not reading) or the PTY closed.
    pub fn push(&self, data: Bytes) -> Result<(), Bytes> {
        let len = data.len();
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > INPUT_QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return Err(data);
        }
        self.tx.send(data).map_err(|e| {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            e.0
        })
    }
}

async fn write_loop(
    pty: Arc<AsyncFd<std::fs::File>>,
    mut input: mpsc::UnboundedReceiver<Bytes>,
    queued: Arc<AtomicUsize>,
) {
    while let Some(data) = input.recv().await {
        let written = write_all(&pty, &data).await;
        queued.fetch_sub(data.len(), Ordering::Relaxed);
        if let Err(err) = written {
            tracing::debug!(error = %err, "tether_daemon_pty_write_failed");
            return;
        }
    }
}

/// Writes all of `data`, waiting while the PTY's input buffer is full (the
/// program is not reading).
async fn write_all(pty: &AsyncFd<std::fs::File>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut ready = pty.writable().await?;
        match ready.try_io(|fd| fd.get_ref().write(data)) {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(err)) if err.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(err)) => return Err(err),
            Err(_would_block) => {}
        }
    }
    Ok(())
}

fn wait_for_exit(pid: u32) -> ChildExit {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = loop {
        // SAFETY: wait4 writes only to the two locals passed by pointer.
        let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if rc == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break rc > 0;
    };
    let ended_at = Instant::now();
    if !reaped {
        // Someone else reaped it (e.g. SIGCHLD ignored in the host process):
        // the status is lost, report an end with no code.
        tracing::warn!(pid, "tether_daemon_exit_status_lost");
        return ChildExit { exit_code: None, signal: None, cpu_ms: 0, max_rss_kb: 0, ended_at };
    }
    let (exit_code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    ChildExit {
        exit_code,
        signal,
        cpu_ms: timeval_ms(usage.ru_utime) + timeval_ms(usage.ru_stime),
        // Linux reports ru_maxrss in KiB.
        max_rss_kb: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        ended_at,
    }
}

fn timeval_ms(time: libc::timeval) -> u64 {
    let secs = u64::try_from(time.tv_sec).unwrap_or(0);
    let micros = u64::try_from(time.tv_usec).unwrap_or(0);
    secs * 1000 + micros / 1000
}

/// Last resort when not even the waiter thread could start.
fn kill_and_reap(pid: u32) {
    let _ = send_signal(pid, libc::SIGKILL);
    let mut status = 0;
    // SAFETY: waitpid writes only to `status`.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
}
