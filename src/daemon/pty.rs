//! Starting a process on a fresh PTY, and what serves it.
//!
//! The master is read and written without blocking, by two tasks on the
//! daemon's runtime, each with a non-blocking descriptor of its own, so an
//! output chunk or a keystroke reaches the terminal task without waking
//! another thread (docs/ARCHITECTURE.md, "The output path"):
//! - reader: its descriptor is registered with the reactor for reading
//!   only; reads from the master into a bounded channel. When the channel
//!   is full the task waits, the PTY stops being drained, and the child
//!   blocks on its next write: that is the backpressure path. During a
//!   flood (a read fills `READ_CHUNK`) a thread of its own reads instead,
//!   into the same channel, until the output pauses (`read_flood`).
//! - writer: drains a channel of input into the master, bounded in bytes.
//!   It writes straight away and registers its descriptor for writability
//!   only while the PTY's input buffer is full. A registration for writing
//!   that stayed would wake the runtime for nothing on every keystroke: the
//!   tty layer wakes its pollers without saying why as it moves the input
//!   through, and an edge-triggered poller then reports "writable" twice
//!   per key before the echo is readable.
//!
//! `wait4` blocks, so one small thread per terminal (the waiter) reaps the
//! child, which yields both the exit status (with the signal number, which
//! portable-pty only reports as a name) and the child's rusage for the
//! Usage frame.
//!
//! A reader can outlive its terminal only while some background process
//! still holds the PTY open; it ends when that process closes it.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot};

use super::screen::GridSize;

/// The runtime reader's buffer: the most one run of its reads joins into
/// a chunk. A run that fills it hands the reading to the flood reader.
pub const READ_CHUNK: usize = 16 * 1024;
/// Bytes per read of the flood reader (see `read_flood`), also the largest
/// chunk it yields: a flood's chunks each cost the terminal task a
/// wake-up from another thread, so they are larger.
const FLOOD_CHUNK: usize = 64 * 1024;
/// The largest Output chunk either reader yields.
pub const MAX_CHUNK: usize = FLOOD_CHUNK;
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
    let watched = dup_nonblocking(master.as_ref()).and_then(|reader| {
        // SAFETY: the File owns the descriptor and keeps it open, and its
        // `as_raw_fd` returns that one, for as long as the AsyncFd holds it.
        let reader =
            unsafe { AsyncFd::register_with_interest(reader, Interest::READABLE) }.map_err(|e| e.into_parts().1)?;
        Ok((reader, dup_nonblocking(master.as_ref())?))
    });
    let (reader, writer) = match watched {
        Ok(fds) => fds,
        Err(err) => {
            let _ = send_signal(pid, libc::SIGKILL);
            return Err(PtyError::Watch(err));
        }
    };
    let (output_tx, output) = mpsc::channel(OUTPUT_CHANNEL_CHUNKS);
    let (tx, input_rx) = mpsc::unbounded_channel();
    let input = InputQueue { tx, queued: Arc::new(AtomicUsize::new(0)), taken: Arc::default() };
    tokio::spawn(read_loop(reader, output_tx));
    tokio::spawn(write_loop(writer, input_rx, input.queued.clone(), input.taken.clone()));
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

/// A non-blocking descriptor of its own on the PTY master, for the reader
/// or the writer (the reader may outlive the daemon's handle, see the
/// module docs). The flag is on the open file the master's handle shares;
/// the daemon only resizes and queries through that handle, which does not
/// mind it.
fn dup_nonblocking(master: &dyn MasterPty) -> io::Result<std::fs::File> {
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
    Ok(file)
}

/// Reads the PTY until it hangs up. Reads that are already waiting behind
/// one (the n_tty buffer hands out at most 4 KiB at a time) join it, up to
/// `READ_CHUNK`, so a busy program costs the terminal task fewer wake-ups;
/// a read that finds nothing more waiting is sent at once, so an echo is
/// never held back. A read that fills `READ_CHUNK` means the program
/// writes faster than one thread both reads and sends: the reading moves to
/// a thread of its own until the output pauses (`read_flood`).
async fn read_loop(pty: AsyncFd<std::fs::File>, output: mpsc::Sender<Bytes>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let mut filled = 0;
        let open = loop {
            let Ok(mut ready) = pty.readable().await else { break false };
            match read_waiting(pty.get_ref(), &mut buf, &mut filled) {
                Reads::Full => break true,
                Reads::Closed => break false,
                Reads::Drained => {
                    ready.clear_ready();
                    // Nothing more waiting: what was read goes now.
                    if filled > 0 {
                        break true;
                    }
                }
            }
        };
        if filled > 0 && output.send(Bytes::copy_from_slice(&buf[..filled])).await.is_err() {
            return;
        }
        if !open {
            return;
        }
        if filled == buf.len() && !read_flood(pty.get_ref(), &output).await {
            return;
        }
    }
}

/// How a run of reads from the master ended.
enum Reads {
    /// The buffer is full.
    Full,
    /// Nothing more is waiting (the master would block).
    Drained,
    /// The PTY hung up: Linux reports a master whose slave fds are all
    /// closed as EIO.
    Closed,
}

/// Reads what is waiting on the non-blocking master into `buf` after
/// `filled`, until the buffer is full or nothing more is waiting.
fn read_waiting(pty: &std::fs::File, buf: &mut [u8], filled: &mut usize) -> Reads {
    loop {
        match (&*pty).read(&mut buf[*filled..]) {
            Ok(0) => return Reads::Closed,
            Ok(n) => {
                *filled += n;
                if *filled == buf.len() {
                    return Reads::Full;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Reads::Drained,
            Err(_) => return Reads::Closed,
        }
    }
}

/// How long the flood reader waits for more output before it hands the
/// reading back to the runtime. Only its own thread waits: output that
/// comes in the meantime is sent as soon as it is read.
const FLOOD_QUIET_MS: libc::c_int = 20;

/// Reads a flood of output on a thread of its own, so the PTY is drained
/// while the runtime thread frames and sends what was read before and the
/// program does not block on a full tty. Returns once the output has been
/// quiet for `FLOOD_QUIET_MS` (true) or the PTY hung up or the terminal
/// stopped reading (false). Every chunk the thread read has been queued
/// when this returns, so the order holds. Where no thread can be had, the
/// runtime goes on reading.
async fn read_flood(pty: &std::fs::File, output: &mpsc::Sender<Bytes>) -> bool {
    let (pty, output) = match pty.try_clone() {
        Ok(pty) => (pty, output.clone()),
        Err(_) => return true,
    };
    let (done_tx, done) = oneshot::channel();
    let started =
        std::thread::Builder::new().name("tether-flood".to_owned()).stack_size(THREAD_STACK_BYTES).spawn(move || {
            let _ = done_tx.send(read_flood_blocking(&pty, &output));
        });
    match started {
        Ok(_) => done.await.unwrap_or(false),
        Err(_) => true,
    }
}

/// The flood reader's loop: `read_loop`'s, waiting in poll(2) instead of
/// the reactor (the descriptor is non-blocking; its flags are shared).
fn read_flood_blocking(pty: &std::fs::File, output: &mpsc::Sender<Bytes>) -> bool {
    let mut buf = vec![0u8; FLOOD_CHUNK];
    loop {
        let mut filled = 0;
        let open = loop {
            match read_waiting(pty, &mut buf, &mut filled) {
                Reads::Full => break true,
                Reads::Closed => break false,
                Reads::Drained if filled > 0 => break true,
                Reads::Drained => match wait_readable(pty, FLOOD_QUIET_MS) {
                    Ok(true) => {}
                    Ok(false) => return true,
                    Err(_) => break false,
                },
            }
        };
        if filled > 0 && output.blocking_send(Bytes::copy_from_slice(&buf[..filled])).is_err() {
            return false;
        }
        if !open {
            return false;
        }
    }
}

/// Waits up to `timeout_ms` for `pty` to have something to read (or to
/// hang up, which the next read reports); false when it stayed quiet.
fn wait_readable(pty: &std::fs::File, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut poll = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(pty), events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: one pollfd that lives for the whole call.
        match unsafe { libc::poll(&mut poll, 1, timeout_ms) } {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

/// Input written to the PTY is reported to the server once this much of a
/// connection's input is unreported (docs/PROTOCOL.md, "Input flow
/// control"): a keystroke costs no frame, a paste one per 64 KiB.
pub const INPUT_REPORT_BYTES: u64 = 64 * 1024;

/// The input bytes on their way to a PTY, bounded by bytes queued.
pub struct InputQueue {
    /// Each chunk with the connection it came on (`Taken::connection`).
    tx: mpsc::UnboundedSender<(u64, Bytes)>,
    queued: Arc<AtomicUsize>,
    taken: Arc<Mutex<Taken>>,
}

/// What the writer took off the queue that the server has not been told of.
#[derive(Default)]
struct Taken {
    /// The connection pushes now come on (counted by this queue).
    connection: u64,
    /// Bytes of that connection's input written and not reported.
    unreported: u64,
    /// `report` was told and has not collected since.
    told: bool,
    report: Option<InputReport>,
}

/// Where a queue says it has input to report: its terminal's id, on the
/// host's channel.
pub struct InputReport {
    pub terminal_id: String,
    pub tx: mpsc::UnboundedSender<String>,
}

fn lock(taken: &Mutex<Taken>) -> std::sync::MutexGuard<'_, Taken> {
    // Nothing panics while holding it; a poisoned count is still whole.
    taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let connection = lock(&self.taken).connection;
        self.tx.send((connection, data)).map_err(|e| {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            e.0 .1
        })
    }

    /// Input taken from here on is reported on `report`.
    pub fn report_to(&self, report: InputReport) {
        lock(&self.taken).report = Some(report);
    }

    /// Later input comes on a new connection: what the writer takes of
    /// the old one's is not reported (that server forgot it).
    pub fn begin_connection(&self) {
        let mut taken = lock(&self.taken);
        taken.connection += 1;
        taken.unreported = 0;
        taken.told = false;
    }

    /// The bytes to report now; the count starts over.
    pub fn take_unreported(&self) -> u64 {
        let mut taken = lock(&self.taken);
        taken.told = false;
        std::mem::take(&mut taken.unreported)
    }
}

async fn write_loop(
    pty: std::fs::File,
    mut input: mpsc::UnboundedReceiver<(u64, Bytes)>,
    queued: Arc<AtomicUsize>,
    taken: Arc<Mutex<Taken>>,
) {
    while let Some((connection, data)) = input.recv().await {
        let written = write_all(&pty, &data).await;
        queued.fetch_sub(data.len(), Ordering::Relaxed);
        if let Err(err) = written {
            tracing::debug!(error = %err, "tether_daemon_pty_write_failed");
            return;
        }
        let mut taken = lock(&taken);
        if taken.connection != connection {
            continue;
        }
        taken.unreported += data.len() as u64;
        if taken.unreported >= INPUT_REPORT_BYTES && !taken.told {
            if let Some(report) = &taken.report {
                let _ = report.tx.send(report.terminal_id.clone());
                taken.told = true;
            }
        }
    }
}

/// Writes all of `data`: straight to the master while it takes bytes, and
/// registered with the reactor for writability only while its input buffer
/// is full (the program is not reading), until that wait is over.
async fn write_all(pty: &std::fs::File, mut data: &[u8]) -> io::Result<()> {
    let mut full: Option<AsyncFd<BorrowedFd<'_>>> = None;
    while !data.is_empty() {
        match (&*pty).write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                // Registering reports the master at once if it became
                // writable since the write failed, so no wake-up is lost.
                let watch = match full.as_mut() {
                    Some(watch) => watch,
                    // SAFETY: the borrow keeps the descriptor open for as
                    // long as the AsyncFd holds it, and it is that one.
                    None => full.insert(
                        unsafe { AsyncFd::register_with_interest(pty.as_fd(), Interest::WRITABLE) }
                            .map_err(|e| e.into_parts().1)?,
                    ),
                };
                let mut ready = watch.writable().await?;
                // Every holder of the program's side closed it: what waits
                // can never be read. The hang-up stays reported (clearing
                // does not take it back), so waiting on would spin the
                // thread and starve every terminal of the daemon.
                if ready.ready().is_write_closed() {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                ready.clear_ready();
            }
            Err(err) => return Err(err),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const EPOLLOUT: u32 = 0x4;

    /// The `tty-index` the kernel gives a PTY master descriptor.
    fn tty_index(fd: &str) -> Option<String> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
        info.lines().find_map(|line| line.strip_prefix("tty-index:")).map(|index| index.trim().to_owned())
    }

    /// What this process's reactors watch on `pty`'s master, as the kernel
    /// lists it (`/proc/self/fdinfo` of each epoll instance): per watched
    /// descriptor, whether it is watched for writability.
    fn pty_watches(pty: &PtyProcess) -> Vec<(String, bool)> {
        let fd = pty.master.as_raw_fd().expect("the master's fd").to_string();
        let ours = tty_index(&fd).expect("a PTY master has a tty-index");
        let link = |fd: &str| std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
        let mut watches = Vec::new();
        let mut instances = std::collections::HashSet::new();
        for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").flatten() {
            let fd = entry.file_name().to_string_lossy().into_owned();
            if link(&fd).to_string_lossy() != "anon_inode:[eventpoll]" {
                continue;
            }
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
            let tfds: Vec<&str> = info.lines().filter(|line| line.starts_with("tfd:")).collect();
            // A runtime may hold its epoll instance under two descriptors.
            // Their `ino:` does not tell instances apart (every epoll
            // instance shares one anonymous inode); their watch lists do,
            // as each names the runtime's own tokens.
            if !instances.insert(tfds.join("\n")) {
                continue;
            }
            for line in tfds {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (watched, events) = (fields[1], u32::from_str_radix(fields[3], 16).expect("events mask"));
                if tty_index(watched).as_ref() == Some(&ours) {
                    watches.push((watched.to_owned(), events & EPOLLOUT != 0));
                }
            }
        }
        watches
    }

    async fn wait_until(what: &str, pty: &PtyProcess, mut done: impl FnMut(&PtyProcess) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done(pty) {
            assert!(tokio::time::Instant::now() < deadline, "gave up waiting until {what}: {:?}", pty_watches(pty));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// While input flows, the master is watched for reading only. The
    /// writer's descriptor used to stay registered for writability, and the
    /// tty layer's wake-ups as it moved each key through then reported it
    /// writable twice before the echo was readable: two wake-ups of the
    /// runtime for nothing per keystroke.
    #[tokio::test(flavor = "current_thread")]
    async fn a_typed_key_leaves_the_master_watched_for_reading_only() {
        let mut pty = spawn(&std::env::temp_dir(), &["cat".to_owned()], GridSize::clamped(80, 24)).expect("spawn cat");
        for _ in 0..20 {
            pty.input.push(Bytes::from_static(b"x")).expect("queued");
            let echo = tokio::time::timeout(Duration::from_secs(10), pty.output.recv()).await;
            assert_eq!(&echo.expect("an echo within 10 s").expect("the pty is open")[..], b"x");
        }
        let watches = pty_watches(&pty);
        assert_eq!(watches.len(), 1, "the reader's descriptor alone is watched: {watches:?}");
        assert!(!watches[0].1, "not for writability: {watches:?}");
        send_signal(pty.pid, libc::SIGKILL).expect("kill cat");
    }

    /// How many threads of this process are flood readers.
    fn flood_readers() -> usize {
        let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
        tasks
            .flatten()
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == "tether-flood")
            })
            .count()
    }

    /// A flood of output is read on a thread of its own, in larger chunks,
    /// which hands the reading back to the runtime once the output pauses; across the
    /// hand-overs every byte arrives once and in order, and a key typed
    /// afterwards is echoed by the runtime's reader again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_flood_is_read_on_a_thread_of_its_own_until_it_pauses() {
        const FLOODS: u32 = 3;
        const LINES: u32 = 100_000;
        let script = (0..FLOODS)
            // Through a pipe: seq writes a tty a line at a time, cat in large blocks.
            .map(|flood| format!("seq {} {} | cat; sleep 1", flood * LINES + 1, (flood + 1) * LINES))
            .chain(["exec cat".to_owned()])
            .collect::<Vec<_>>()
            .join("; ");
        let mut pty =
            spawn(&std::env::temp_dir(), &["sh".to_owned(), "-c".to_owned(), script], GridSize::clamped(80, 24))
                .expect("spawn sh");
        let mut received = Vec::new();
        let mut largest = 0;
        for flood in 1..=FLOODS {
            let last_line = format!("\n{}\r\n", flood * LINES);
            let mut read_by_a_thread = false;
            let first = tokio::time::timeout(Duration::from_secs(20), pty.output.recv()).await;
            received.extend_from_slice(&first.expect("output within 20 s").expect("the pty is open"));
            // A consumer slower than the program, as a socket is: the
            // channel and then the tty fill up, so the next reads are full.
            tokio::time::sleep(Duration::from_millis(300)).await;
            while !received.ends_with(last_line.as_bytes()) {
                let chunk = tokio::time::timeout(Duration::from_secs(20), pty.output.recv()).await;
                let chunk = chunk.expect("output within 20 s").expect("the pty is open");
                largest = largest.max(chunk.len());
                received.extend_from_slice(&chunk);
                // Only the flood reader yields a chunk larger than READ_CHUNK.
                read_by_a_thread |= chunk.len() > READ_CHUNK || flood_readers() > 0;
            }
            assert!(read_by_a_thread, "flood {flood} was read on a thread of its own");
            wait_until("the flood reader hands back", &pty, |_| flood_readers() == 0).await;
        }
        let expected: String = (1..=FLOODS * LINES).map(|line| format!("{line}\r\n")).collect();
        assert!(received == expected.as_bytes(), "every line once and in order ({} bytes)", received.len());
        assert!(largest > READ_CHUNK && largest <= FLOOD_CHUNK, "a flood comes in larger chunks: {largest}");

        pty.input.push(Bytes::from_static(b"x")).expect("queued");
        let echo = tokio::time::timeout(Duration::from_secs(10), pty.output.recv()).await;
        assert_eq!(&echo.expect("an echo within 10 s").expect("the pty is open")[..], b"x");
        assert_eq!(flood_readers(), 0);
        send_signal(pty.pid, libc::SIGKILL).expect("kill cat");
    }

    /// The writer counts the input it took of the current connection and
    /// says so once 64 KiB are unreported; input that came on an earlier
    /// connection is written but not counted (that server forgot it).
    #[tokio::test(flavor = "current_thread")]
    async fn input_taken_is_reported_per_64_kib_of_the_current_connection() {
        let script = "stty raw -echo; echo raw; exec cat > /dev/null".to_owned();
        let mut pty =
            spawn(&std::env::temp_dir(), &["sh".to_owned(), "-c".to_owned(), script], GridSize::clamped(80, 24))
                .expect("spawn sh");
        let said = tokio::time::timeout(Duration::from_secs(10), pty.output.recv()).await;
        assert_eq!(&said.expect("output within 10 s").expect("the pty is open")[..], b"raw\n");
        let (tx, mut told) = mpsc::unbounded_channel();
        pty.input.report_to(InputReport { terminal_id: "t".into(), tx });
        let taken_all = |pty: &PtyProcess| pty.input.queued.load(Ordering::Relaxed) == 0;
        pty.input.push(Bytes::from(vec![b'k'; 60 * 1024])).expect("queued");
        wait_until("the first chunk is taken", &pty, taken_all).await;
        assert!(told.try_recv().is_err(), "under 64 KiB: nothing to say yet");
        pty.input.push(Bytes::from(vec![b'k'; 8 * 1024])).expect("queued");
        let terminal = tokio::time::timeout(Duration::from_secs(10), told.recv()).await;
        assert_eq!(terminal.expect("told within 10 s").as_deref(), Some("t"));
        assert_eq!(pty.input.take_unreported(), 68 * 1024);
        assert_eq!(pty.input.take_unreported(), 0, "taken once");
        // Queued before a new connection began, written after: not counted.
        for _ in 0..2 {
            pty.input.push(Bytes::from(vec![b'k'; 64 * 1024])).expect("queued");
        }
        pty.input.begin_connection();
        wait_until("the old connection's input is taken", &pty, taken_all).await;
        assert!(told.try_recv().is_err());
        assert_eq!(pty.input.take_unreported(), 0);
        send_signal(pty.pid, libc::SIGKILL).expect("kill sh");
    }

    /// Input the program does not read yet fills the PTY's buffer; the
    /// writer then watches its descriptor for writability, and stops
    /// watching it once the program has taken everything.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_input_buffer_is_waited_out_and_then_unwatched() {
        let script = "stty raw -echo; echo raw; sleep 1; exec cat > /dev/null".to_owned();
        let mut pty =
            spawn(&std::env::temp_dir(), &["sh".to_owned(), "-c".to_owned(), script], GridSize::clamped(80, 24))
                .expect("spawn sh");
        // Input written before the `stty` would meet canonical mode, which
        // drops what overflows a line instead of making the writer wait.
        let said = tokio::time::timeout(Duration::from_secs(10), pty.output.recv()).await;
        assert_eq!(&said.expect("output within 10 s").expect("the pty is open")[..], b"raw\n");
        // Far more than the tty layer buffers (about 20 KB in raw mode).
        for _ in 0..100 {
            pty.input.push(Bytes::from(vec![b'k'; 1000])).expect("queued");
        }
        wait_until("the writer waits for writability", &pty, |pty| {
            pty_watches(pty).iter().any(|(_, writable)| *writable)
        })
        .await;
        wait_until("the program has taken every byte", &pty, |pty| pty.input.queued.load(Ordering::Relaxed) == 0).await;
        let watches = pty_watches(&pty);
        assert_eq!(watches.len(), 1, "the writer's watch is gone: {watches:?}");
        assert!(!watches[0].1, "{watches:?}");
        send_signal(pty.pid, libc::SIGKILL).expect("kill sh");
    }
}
