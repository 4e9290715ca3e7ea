//! The least a server can spend on an idle connection's ping, for tether's
//! idle CPU to be measured against (issue 10 section 3, docs/BENCHMARKS.md):
//! no WebSocket, no protocol, no actors.
//!
//! A child process serves: two threads, each a single-threaded tokio
//! runtime with its own listener on one `SO_REUSEPORT` port (as tether's
//! two actix workers each run their own event loop), and per connection a
//! task that waits for the socket to be readable, reads what came into a
//! buffer on the stack and writes a 4-byte answer (the size of a
//! WebSocket frame carrying tether's Pong). This process dials
//! `--connections` sockets from 127.x source addresses and sends each an
//! 8-byte message (a masked frame carrying a Ping) every `--period-ms`,
//! each socket at its own offset within the period, so the pings are
//! spread as the daemons' are. It prints the serving process's CPU over
//! `--seconds` (utime + stime, all threads, `/proc/PID/stat`), the pings
//! answered in that window and the CPU per ping.
//!
//! ```sh
//! cargo build --release --example ping_floor
//! target/release/examples/ping_floor [--connections 19000] [--period-ms 30000] [--seconds 60]
//! ```

mod support;

use std::cell::Cell;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use support::{arg, cpu_ticks, raise_nofile, source_address, status_kib, ticks_per_second, tie_to_parent, Guard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// What a daemon's Ping costs on the wire: a masked binary frame (2 + 4
/// bytes of header) around the 2-byte protobuf frame.
const PING: [u8; 8] = [0x82, 0x82, 1, 2, 3, 4, 0x52, 0x00];
/// The answer: an unmasked binary frame around the Pong's 2 bytes.
const PONG: [u8; 4] = [0x82, 0x02, 0x5a, 0x00];
/// Sockets per source address (far below its ephemeral ports).
const PER_ADDRESS: usize = 1000;
/// The block of 127.x addresses the sockets leave from.
const ADDRESS_BLOCK: u8 = 7;
/// The serving threads, as tether runs one actix worker per core here.
const SERVING_THREADS: usize = 2;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    raise_nofile();
    if args.iter().any(|a| a == "--serve") {
        serve();
        return;
    }
    let connections: usize = arg(&args, "--connections", 19_000);
    let period = Duration::from_millis(arg(&args, "--period-ms", 30_000));
    let seconds: u64 = arg(&args, "--seconds", 60);

    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.arg("--serve").stdout(Stdio::piped());
    tie_to_parent(&mut cmd);
    let mut child = cmd.spawn().expect("start the serving process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("port");
    let addr: SocketAddr = line.trim().parse().expect("serving address");
    let server = Guard(child);
    let pid = server.0.id();

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let answered = Rc::new(Cell::new(0u64));
        let started = Instant::now();
        let mut sockets = Vec::with_capacity(connections);
        for i in 0..connections {
            let socket = TcpSocket::new_v4().expect("socket");
            socket.bind(SocketAddr::new(source_address(ADDRESS_BLOCK, i, PER_ADDRESS), 0)).expect("bind");
            let stream = socket.connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            sockets.push(stream);
        }
        println!("{connections} connections in {:.1} s", started.elapsed().as_secs_f64());
        let origin = tokio::time::Instant::now();
        for (i, stream) in sockets.into_iter().enumerate() {
            let offset = period.mul_f64(i as f64 / connections as f64);
            tokio::task::spawn_local(ping(stream, origin + offset, period, answered.clone()));
        }
        // One period first, so every socket's pings have started.
        tokio::time::sleep(period.min(Duration::from_secs(30))).await;
        let (ticks, pings) = (cpu_ticks(pid), answered.get());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu = (cpu_ticks(pid) - ticks) as f64 / ticks_per_second();
        let pings = answered.get() - pings;
        let rss = status_kib(pid, "VmRSS");
        println!(
            "serving process over {seconds} s: CPU {:.2} % of a core; {pings} pings answered ({:.0}/s), {:.1} us of CPU per ping; RSS (all of it) {:.1} KiB per connection",
            cpu * 100.0 / seconds as f64,
            pings as f64 / seconds as f64,
            if pings > 0 { cpu * 1e6 / pings as f64 } else { 0.0 },
            rss as f64 / connections as f64,
        );
    });
}

/// One client socket: a ping at `first` and every `period` after, each
/// answered before the next.
async fn ping(mut stream: TcpStream, first: tokio::time::Instant, period: Duration, answered: Rc<Cell<u64>>) {
    let mut ticks = tokio::time::interval_at(first, period);
    let mut answer = [0u8; PONG.len()];
    loop {
        ticks.tick().await;
        if stream.write_all(&PING).await.is_err() || stream.read_exact(&mut answer).await.is_err() {
            return;
        }
        answered.set(answered.get() + 1);
    }
}

/// The serving process: prints its address, then answers every socket's
/// messages on `SERVING_THREADS` event loops until its parent goes.
fn serve() {
    // The listeners are made inside a runtime and leave it as std ones,
    // each for its thread's own runtime.
    let listeners = {
        let setup = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("runtime");
        let _entered = setup.enter();
        let first = listener("127.0.0.1:0".parse().expect("addr"));
        let addr = first.local_addr().expect("addr");
        let mut listeners = vec![first];
        listeners.extend((1..SERVING_THREADS).map(|_| listener(addr)));
        // Once every listener is bound, so the dials spread over all.
        println!("{addr}");
        listeners
    };
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    while let Ok((stream, _)) = listener.accept().await {
                        tokio::task::spawn_local(answer(stream));
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

/// A listener on `addr` that shares its port with the other serving threads.
fn listener(addr: SocketAddr) -> std::net::TcpListener {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_reuseport(true).expect("reuseport");
    socket.set_reuseaddr(true).expect("reuseaddr");
    socket.bind(addr).expect("bind");
    // Left non-blocking, as `from_std` in the serving thread wants it.
    socket.listen(4096).expect("listen").into_std().expect("std listener")
}

/// One served socket: no buffer while it waits, a stack buffer per read.
async fn answer(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        let mut buf = [0u8; 64];
        match stream.try_read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {
                // The answer fits any socket's send buffer: one write.
                if stream.try_write(&PONG).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}
