//! The least a server can spend on an idle connection's ping, for tether's
//! idle CPU to be measured against (issue 10 section 3, docs/BENCHMARKS.md):
//! no WebSocket, no protocol, no actors.
//!
//! A child process serves: two threads, each a single-threaded tokio
//! runtime with its own listener on one `SO_REUSEPORT` port (as tether's
//! two actix workers each run their own event loop), and per connection a
//! task that waits for the socket to be readable, reads what came into a
//! buffer on the stack and writes a 4-byte answer (the size of a
//! WebSocket frame carrying tether's Pong). `--processes` client processes
//! (8 by default, as `scale_bench`'s fake daemons run in processes of
//! 2,500) dial `--connections` sockets between them from 127.x source
//! addresses and send each an 8-byte message (a masked frame carrying a
//! Ping) every `--period-ms`, each socket at its own offset within the
//! period, so the pings are spread as the daemons' are: one client
//! process fires each millisecond's pings back to back, and the server
//! then takes several per wake-up, which the daemons' pings do not give
//! it (docs/BENCHMARKS.md, "where an idle ping's time goes"). It prints
//! the serving process's CPU over
//! `--seconds` (utime + stime, all threads, `/proc/PID/stat`), the pings
//! answered in that window and the CPU per ping.
//!
//! `--coalesce-us N` has each serving thread sleep N us before every wait
//! for events, so one wake-up takes every ping that came in meanwhile:
//! what is left per ping is the work no batching of wake-ups removes.
//!
//! ```sh
//! cargo build --release --example ping_floor
//! target/release/examples/ping_floor [--connections 19000] [--period-ms 30000] [--seconds 60] [--processes 8] [--coalesce-us 0]
//! ```

mod support;

use std::cell::Cell;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
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
/// How often a client process reports the pings answered so far.
const REPORT_EVERY: Duration = Duration::from_millis(200);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    raise_nofile();
    let coalesce = Duration::from_micros(arg(&args, "--coalesce-us", 0));
    if args.iter().any(|a| a == "--serve") {
        serve(coalesce);
        return;
    }
    let connections: usize = arg(&args, "--connections", 19_000);
    let period = Duration::from_millis(arg(&args, "--period-ms", 30_000));
    if let Some(at) = args.iter().position(|a| a == "--client") {
        let field =
            |n: usize| args.get(at + n).and_then(|v| v.parse::<usize>().ok()).expect("--client ADDR FIRST COUNT");
        let addr: SocketAddr = args.get(at + 1).and_then(|v| v.parse().ok()).expect("--client ADDR");
        client(addr, field(2), field(3), connections, period);
        return;
    }
    let seconds: u64 = arg(&args, "--seconds", 60);
    let processes: usize = arg::<usize>(&args, "--processes", 8).clamp(1, connections.max(1));

    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.args(["--serve", "--coalesce-us", &coalesce.as_micros().to_string()]).stdout(Stdio::piped());
    tie_to_parent(&mut cmd);
    let mut child = cmd.spawn().expect("start the serving process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("port");
    let addr: SocketAddr = line.trim().parse().expect("serving address");
    let server = Guard(child);
    let pid = server.0.id();

    // The clients: each dials its share, says `up`, then reports the
    // pings answered so far, over and over.
    let started = Instant::now();
    let up = Arc::new(AtomicUsize::new(0));
    let mut answered: Vec<Arc<AtomicU64>> = Vec::new();
    let mut clients = Vec::new();
    for n in 0..processes {
        let (first, last) = (connections * n / processes, connections * (n + 1) / processes);
        let mut cmd = Command::new(std::env::current_exe().expect("exe"));
        cmd.args(["--connections", &connections.to_string(), "--period-ms", &period.as_millis().to_string()])
            .args(["--client", &addr.to_string(), &first.to_string(), &(last - first).to_string()])
            .stdout(Stdio::piped());
        tie_to_parent(&mut cmd);
        let mut child = cmd.spawn().expect("start a client process");
        let stdout = child.stdout.take().expect("client stdout");
        let (up, count) = (up.clone(), Arc::new(AtomicU64::new(0)));
        answered.push(count.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                match line.strip_prefix("answered ").and_then(|n| n.parse().ok()) {
                    Some(total) => count.store(total, Ordering::Relaxed),
                    None if line == "up" => {
                        up.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {}
                }
            }
        });
        clients.push(Guard(child));
    }
    while up.load(Ordering::Relaxed) < processes {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{connections} connections from {processes} processes in {:.1} s", started.elapsed().as_secs_f64());
    let total = || answered.iter().map(|count| count.load(Ordering::Relaxed)).sum::<u64>();
    // One period first, so every socket's pings have started.
    std::thread::sleep(period.min(Duration::from_secs(30)));
    let (ticks, pings) = (cpu_ticks(pid), total());
    std::thread::sleep(Duration::from_secs(seconds));
    // Both counts are as old as the clients' last reports (less than
    // `REPORT_EVERY`), so the window they span is as long as the CPU's.
    let (cpu, pings) = ((cpu_ticks(pid) - ticks) as f64 / ticks_per_second(), total() - pings);
    let rss = status_kib(pid, "VmRSS");
    println!(
        "serving process over {seconds} s: CPU {:.2} % of a core; {pings} pings answered ({:.0}/s), {:.1} us of CPU per ping; RSS (all of it) {:.1} KiB per connection",
        cpu * 100.0 / seconds as f64,
        pings as f64 / seconds as f64,
        if pings > 0 { cpu * 1e6 / pings as f64 } else { 0.0 },
        rss as f64 / connections as f64,
    );
    drop(clients);
}

/// A client process: dials sockets `first..first + count` of `connections`
/// to `addr`, prints `up`, pings each every `period` at its own offset
/// within it, and prints `answered N` (the total so far) every
/// [`REPORT_EVERY`] until its parent goes.
fn client(addr: SocketAddr, first: usize, count: usize, connections: usize, period: Duration) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let answered = Rc::new(Cell::new(0u64));
        let mut sockets = Vec::with_capacity(count);
        for i in first..first + count {
            let socket = TcpSocket::new_v4().expect("socket");
            socket.bind(SocketAddr::new(source_address(ADDRESS_BLOCK, i, PER_ADDRESS), 0)).expect("bind");
            let stream = socket.connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            sockets.push(stream);
        }
        println!("up");
        let origin = tokio::time::Instant::now();
        for (i, stream) in (first..).zip(sockets) {
            let offset = period.mul_f64(i as f64 / connections as f64);
            tokio::task::spawn_local(ping(stream, origin + offset, period, answered.clone()));
        }
        loop {
            tokio::time::sleep(REPORT_EVERY).await;
            println!("answered {}", answered.get());
        }
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
fn serve(coalesce: Duration) {
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
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .on_thread_park(move || {
                        if !coalesce.is_zero() {
                            std::thread::sleep(coalesce)
                        }
                    })
                    .build()
                    .expect("runtime");
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
